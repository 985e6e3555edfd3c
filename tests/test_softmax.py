"""Softmax over the last axis as a kernel call (tirbyoc.softmax): what is replaced, what
is not, numerics against numpy over symbolic row lengths, and a library exported from a
module whose only kernel is the softmax."""

import os
import subprocess
import sys

import numpy as np
import pytest
from tvm import relax, tirx

import tirbyoc
from tirbyoc import softmax

from .fresh import without_torch


def _module(shape, dtype="float32", axis=-1, extra=None):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.softmax(x, axis=axis))
            if extra is not None:
                y = bb.emit(extra(y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _reference(x, axis=-1):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _kernel_calls(mod):
    return [name for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)
            for name in tirbyoc.offloaded_kernels(f)]


@pytest.mark.parametrize("length", [1, 16, 17, 53])
def test_softmax_over_a_symbolic_length_is_one_kernel_call(length):
    n = tirx.Var("n", "int64")
    mod = _module((2, 3, n, n))
    report = tirbyoc.explain(mod)
    assert [r.intrinsic for r in report.offloaded] == ["softmax"], str(report)
    assert "R.nn.softmax over the last axis" in str(report)
    assert list(report.schedules.values()) == ["kernel tirbyoc_softmax_f32"]
    x = np.random.default_rng(length).standard_normal((2, 3, length, length)) * 5
    x = x.astype(np.float32)
    got = tirbyoc.run(tirbyoc.compile(mod), x)
    np.testing.assert_allclose(got, _reference(x), rtol=1e-5, atol=1e-7)


def test_one_prim_func_per_rank_and_the_ops_around_it_stay_tvms():
    """Two softmaxes of rank 2 share one kernel PrimFunc; a scale after the softmax is
    fused and scheduled by TVM as usual."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 9), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.softmax(x, axis=-1))
            b = bb.emit(relax.op.nn.softmax(relax.op.multiply(a, relax.const(3.0)), axis=1))
            out = bb.emit_output(b)
        bb.emit_func_output(out)
    mod = bb.get()
    offloaded = softmax.offload_softmax(mod)
    kernels = [gv.name_hint for gv, f in offloaded.functions_items()
               if isinstance(f, tirx.PrimFunc)]
    assert kernels == ["tirbyoc_softmax_rank2"]
    assert "R.nn.softmax" not in offloaded["main"].script()
    xs = np.random.default_rng(0).standard_normal((4, 9)).astype(np.float32)
    got = tirbyoc.run(tirbyoc.compile(mod), xs)
    np.testing.assert_allclose(got, _reference(_reference(xs) * 3.0), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("case", ["axis0", "float16", "intrinsics_named"])
def test_what_stays_with_tvm(case):
    """Softmax over another axis, another dtype, or a caller that names its intrinsics:
    no softmax kernel."""
    if case == "axis0":
        mod, kwargs = _module((5, 7), axis=0), {}
    elif case == "float16":
        mod, kwargs = _module((5, 7), dtype="float16"), {}
    else:
        from tirbyoc.schedule_rule import registry

        mod, kwargs = _module((5, 7)), {"intrinsics": registry(None)}
    out = tirbyoc.apply_tir_byoc(mod, **kwargs)
    assert "tirbyoc_softmax_f32" not in _kernel_calls(out)
    if case == "axis0":
        xs = np.random.default_rng(1).standard_normal((5, 7)).astype(np.float32)
        np.testing.assert_allclose(tirbyoc.run(tirbyoc.compile(mod), xs),
                                   _reference(xs, axis=0), rtol=1e-5, atol=1e-7)


def test_exported_softmax_library_loads_in_a_fresh_process(tmp_path):
    """A module whose only kernel is the softmax still links the kernel library."""
    n = tirx.Var("n", "int64")
    ex = tirbyoc.compile(_module((n, 33)))
    path = str(tmp_path / "softmax.so")
    ex.export_library(path)
    x = np.random.default_rng(2).standard_normal((5, 33)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code = ("import numpy as np, tvm\n"
            f"lib = tvm.runtime.load_module({path!r})\n"
            "vm = tvm.relax.VirtualMachine(lib, tvm.cpu())\n"
            f"x = np.load({str(tmp_path / 'x.npy')!r})\n"
            f"np.save({str(tmp_path / 'y.npy')!r}, vm['main'](tvm.runtime.tensor(x)).numpy())\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-c", without_torch(code)], check=True, timeout=120, env=env,
                   cwd=str(tmp_path))
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), _reference(x), rtol=1e-5,
                               atol=1e-7)
