"""What tirbyoc does not offload gets a CPU schedule in ``tirbyoc.pipeline``.

Numerics: rtol 1e-4 with an absolute floor of 1e-4 * max|reference|.
"""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, tirx

import tirbyoc
from tirbyoc import fallback

TARGET = tvm.target.Target("llvm")


def assert_close(got, ref):
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


def _block(rows=64, k=48, n=40):
    """dense + bias + relu, then a residual add, a softmax and a layer norm."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((n, k)).astype(np.float32) / np.sqrt(k)
    b, gamma, beta = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, k), "float32"))
    r = relax.Var("r", relax.TensorType((rows, n), "float32"))
    with bb.function("main", [x, r]):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(x, relax.op.permute_dims(relax.const(w), [1, 0])))
            h = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(h, relax.const(b)))))
            h = bb.emit(relax.op.add(relax.op.tanh(h), r))
            h = bb.emit(relax.op.nn.softmax(h, axis=-1))
            h = bb.emit(relax.op.nn.layer_norm(h, relax.const(gamma), relax.const(beta),
                                               axes=[-1]))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    xs = rng.standard_normal((rows, k)).astype(np.float32)
    rs = rng.standard_normal((rows, n)).astype(np.float32)
    t = np.tanh(np.maximum(xs.astype(np.float64) @ w.T + b, 0)) + rs
    e = np.exp(t - t.max(-1, keepdims=True))
    s = e / e.sum(-1, keepdims=True)
    ref = (s - s.mean(-1, keepdims=True)) / np.sqrt(s.var(-1, keepdims=True) + 1e-5)
    return bb.get(), (xs, rs), ref * gamma + beta


def _scheduled(mod):
    """{PrimFunc name: how it runs} after offloading and the fallback rules."""
    with TARGET:
        mod = tirbyoc.apply_tir_byoc(mod, fuse=True)
        mod = tvm.transform.Sequential(
            tvm.relax.backend.cpu_generic.pipeline.legalize_passes(None))(mod)
        mod = tvm.s_tir.dlight.ApplyDefaultSchedule(*fallback.schedule_rules())(mod)
    how = {}
    for gv, func in mod.functions_items():
        if isinstance(func, tirx.PrimFunc):
            kernels = tirbyoc.offloaded_kernels(func)
            scheduled = func.attrs is not None and "tirx.is_scheduled" in func.attrs
            how[gv.name_hint] = kernels[0] if kernels else ("scheduled" if scheduled else "naive")
    return how, mod


def test_every_prim_func_is_offloaded_or_scheduled():
    mod, inputs, ref = _block()
    how, scheduled = _scheduled(mod)
    # dense + bias + relu + tanh + residual: one chain kernel call
    assert sorted(how.values()).count("tirbyoc_matmul_f32") == 1
    assert "naive" not in how.values(), how
    # the elementwise functions run in parallel with vectorized inner loops
    kinds = set()
    for name, func in scheduled.functions_items():
        if isinstance(func, tirx.PrimFunc) and how[name.name_hint] == "scheduled":
            tvm_ffi.structural_walk(func, [(tirx.For, lambda f: kinds.add(int(f.kind)))])
    assert {int(tirx.ForKind.PARALLEL), int(tirx.ForKind.VECTORIZED)} <= kinds, kinds
    assert_close(tirbyoc.run(tirbyoc.compile(mod), *inputs), ref)


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (2, 70), (130, 33), (4, 3, 17)])
def test_injective_rule_keeps_numerics(shape):
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType(shape, "float32"))
    b = relax.Var("b", relax.TensorType(shape[-1:], "float32"))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            h = bb.emit(relax.op.multiply(relax.op.sigmoid(relax.op.add(a, b)), a))
            out = bb.emit_output(bb.emit(relax.op.permute_dims(h)))
        bb.emit_func_output(out)
    rng = np.random.default_rng(len(shape))
    xa = rng.standard_normal(shape).astype(np.float32)
    xb = rng.standard_normal(shape[-1:]).astype(np.float32)
    ref = (1 / (1 + np.exp(-(xa + xb))) * xa).T
    how, _ = _scheduled(bb.get())
    assert set(how.values()) == {"scheduled"}, how
    assert_close(tirbyoc.run(tirbyoc.compile(bb.get()), xa, xb), ref)


def test_a_reduction_over_one_element_is_not_taken_for_elementwise():
    """Regression (found by the matcher fuzzer): dlight's analysis calls a reduction of
    extent 1 spatial; scheduling it as elementwise gave wrong results."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 2, 1), "float32"))
    w = relax.Var("w", relax.TensorType((1, 1, 3), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.clip(relax.op.matmul(x, w), 0.0, 6.0)))
        bb.emit_func_output(out)
    legalized = relax.transform.LegalizeOps()(bb.get())
    matmul = next(f for gv, f in legalized.functions_items()
                  if isinstance(f, tirx.PrimFunc) and "matmul" in gv.name_hint)
    assert fallback.Injective().apply(matmul, TARGET) is None
    how, _ = _scheduled(bb.get())
    assert "tirbyoc_matmul_f32" in how.values()  # now a batched matmul kernel takes it
    rng = np.random.default_rng(9)
    xs, ws = rng.standard_normal((1, 2, 1)).astype(np.float32), \
        rng.standard_normal((1, 1, 3)).astype(np.float32)
    assert_close(tirbyoc.run(tirbyoc.compile(bb.get()), xs, ws), np.clip(xs @ ws, 0, 6))
