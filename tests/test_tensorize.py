"""The kernel as an s_tir.TensorIntrin: hand-written schedules tensorize dense tiles."""

import numpy as np
import pytest
import tvm
from tvm import s_tir
from tvm.script import tirx as T

import tirbyoc

from . import tir_forms as F


def _run(func, *arrays, out_shape):
    ex = tirbyoc.compile(tvm.IRModule({"main": func}))
    out = tvm.runtime.tensor(np.zeros(out_shape, np.float32))
    ex["main"](*[tvm.runtime.tensor(a) for a in arrays], out)
    return out.numpy()


@pytest.mark.parametrize("func,layout", [(F.nt_bias_relu, "nt"), (F.relu_if_then_else, "nn")],
                         ids=["nt", "nn"])
def test_tensorize_dense_helper_any_shape(func, layout):
    """The dense block of a dense (+ bias) + relu function; the epilogue stays TIR."""
    sch = s_tir.Schedule(func)
    name = tirbyoc.tensorize_dense(sch, "mm")
    assert name.startswith(f"tirbyoc_dense_acc_f32_{layout}_")
    text = sch.mod["main"].script()
    assert f"tirbyoc_dense_acc_f32_{layout}" in text
    assert "tensorize" in str(sch.trace)
    rng = np.random.default_rng(13)
    params = [p for p in func.params]
    shapes = [tuple(int(d) for d in p.shape) for p in params]
    arrays = [rng.standard_normal(s, np.float32) for s in shapes[:-1]]
    a, w = arrays[:2]
    b = arrays[2] if len(arrays) == 3 else 0.0
    ref = np.maximum(a.astype(np.float64) @ (w.T if layout == "nt" else w) + b, 0)
    got = _run(sch.mod["main"], *arrays, out_shape=shapes[-1])
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


@T.prim_func(s_tir=True)
def _matmul_64(A: T.Buffer((64, 96), "float32"), W: T.Buffer((48, 96), "float32"),
               O: T.Buffer((64, 48), "float32")):
    for i, j, k in T.grid(64, 48, 96):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                O[vi, vj] = T.float32(0)
            O[vi, vj] = O[vi, vj] + A[vi, vk] * W[vj, vk]


def test_hand_tiled_schedule_tensorizes_tiles_and_accumulates_over_k():
    # tiles of 16 x 16 x 32: the kernel is called 4 * 3 * 3 times and must accumulate
    sch = s_tir.Schedule(_matmul_64)
    block = sch.get_sblock("mm")
    i, j, k = sch.get_loops(block)
    io, ii = sch.split(i, [4, 16])
    jo, ji = sch.split(j, [3, 16])
    ko, ki = sch.split(k, [3, 32])
    sch.reorder(io, jo, ko, ii, ji, ki)
    sch.decompose_reduction(block, io)
    sch.tensorize(ii, tirbyoc.dense_intrin(16, 16, 32, "nt"))
    rng = np.random.default_rng(14)
    a = rng.standard_normal((64, 96), np.float32)
    w = rng.standard_normal((48, 96), np.float32)
    ref = a.astype(np.float64) @ w.T.astype(np.float64)
    got = _run(sch.mod["main"], a, w, out_shape=(64, 48))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_tensorize_dense_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="extra factor"):
        tirbyoc.tensorize_dense(s_tir.Schedule(F.extra_scale), "mm")
    with pytest.raises(ValueError, match="symbolic extent"):
        tirbyoc.tensorize_dense(s_tir.Schedule(F.symbolic_rows), "mm")
    with pytest.raises(ValueError, match="row dimensions"):
        tirbyoc.tensorize_dense(s_tir.Schedule(F.batched_rows), "mm")
    with pytest.raises(ValueError, match="size 1"):
        tirbyoc.tensorize_dense(s_tir.Schedule(F.dense_only), "mm")
    with pytest.raises(ValueError, match="A \\* W"):
        tirbyoc.tensorize_dense(s_tir.Schedule(F.nn_bias_first_relu_max0x), "mm")
