"""End to end: Relax models offloaded, compiled, run; numerics and offload counts.

Tolerance: results within rtol 1e-4 of a float64 numpy reference, with an absolute floor
of 1e-4 * max|reference| for entries near zero.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

import tirbyoc
from intrinsics import REGISTRY, by_name
from tirbyoc import examples

from .fresh import without_torch

RTOL = 1e-4


def assert_close(got, ref):
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=RTOL * float(np.abs(ref).max()))


def _inputs(batch, layers, bind_weights):
    x = np.random.default_rng(1).standard_normal((batch, layers[0][0].shape[1]), np.float32)
    args = [x]
    if not bind_weights:
        for w, b in layers:
            args += [w, b]
    return x, args


def _prim_func_names(mod):
    return sorted(gv.name_hint for gv, f in mod.functions_items()
                  if isinstance(f, tvm.tirx.PrimFunc))


@pytest.mark.parametrize("bind_weights", [True, False], ids=["weights-bound", "weights-as-inputs"])
def test_seed_mlp_relax_static(bind_weights):
    layers = examples.mlp_weights()
    mod = examples.mlp_relax(64, layers, bind_weights=bind_weights)
    offloaded = tirbyoc.apply_tir_byoc(mod)
    # weights as inputs: read in place (nn.Linear layout); bound: packed at compile time
    layout = "packed" if bind_weights else "nt"
    assert tirbyoc.offloaded_kernels(offloaded) == [f"tirbyoc_dense_f32_{layout}",
                                                    f"tirbyoc_dense_relu_f32_{layout}"]
    # no transpose copy of a weight survives as a runtime step
    assert not [n for n in _prim_func_names(offloaded) if "transpose" in n]
    x, args = _inputs(64, layers, bind_weights)
    ex = tvm.compile(offloaded, target="llvm")
    assert_close(tirbyoc.run(ex, *args), examples.mlp_numpy(x, layers))


def test_layers_of_one_shape_share_a_prim_func_and_each_weight_is_packed():
    # three 48 -> 48 layers with different weights: one fused PrimFunc for the first two
    # (TVM deduplicates it), called at two sites with two constants; each site's own
    # constant is packed, not the first site's for both
    rng = np.random.default_rng(3)
    layers = [(rng.standard_normal((48, 48)).astype(np.float32),
               rng.standard_normal(48).astype(np.float32)) for _ in range(3)]
    mod = examples.mlp_relax(16, layers)
    offloaded = tirbyoc.apply_tir_byoc(mod)
    relu = [gv for gv, f in offloaded.functions_items()
            if isinstance(f, tvm.tirx.PrimFunc) and "relu" in gv.name_hint]
    assert len(relu) == 1
    assert offloaded.script().count(f"cls.{relu[0].name_hint}") == 2
    assert tirbyoc.offloaded_kernels(offloaded) == ["tirbyoc_dense_f32_packed",
                                                    "tirbyoc_dense_relu_f32_packed"]
    x, args = _inputs(16, layers, True)
    assert_close(tirbyoc.run(tvm.compile(offloaded, target="llvm"), *args),
                 examples.mlp_numpy(x, layers))


def test_seed_mlp_symbolic_batch():
    layers = examples.mlp_weights()
    mod = examples.mlp_relax(None, layers, bind_weights=False)
    report = tirbyoc.explain(mod)
    assert sorted(r.intrinsic for r in report.offloaded) == ["dense_bias", "dense_bias_relu"]
    ex = tirbyoc.compile(mod)
    for batch in (1, 7, 33, 64):
        x, args = _inputs(batch, layers, False)
        assert_close(tirbyoc.run(ex, *args), examples.mlp_numpy(x, layers))


def test_pipeline_with_tvm_compile_matches_tirbyoc_compile():
    layers = examples.mlp_weights((33, 7, 5))
    mod = examples.mlp_relax(9, layers)
    target = tvm.target.Target("llvm")
    ex = tvm.compile(mod, target=target, relax_pipeline=tirbyoc.pipeline(target))
    x, args = _inputs(9, layers, True)
    assert_close(tirbyoc.run(ex, *args), examples.mlp_numpy(x, layers))


def _single_layer(rows_shape, k, n, tail=None, dtype="float32"):
    """x[rows.., k] @ W^T + b -> relu (-> tail), weights as inputs."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(rows_shape + (k,), dtype))
    w = relax.Var("w", relax.TensorType((n, k), dtype))
    b = relax.Var("b", relax.TensorType((n,), dtype))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(w, [1, 0]))))
            h = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(h, b))))
            if tail == "tanh":
                h = bb.emit(relax.op.tanh(h))
            elif tail == "residual":
                h = bb.emit(relax.op.add(h, x))
            elif tail == "exp":
                h = bb.emit(relax.op.exp(h))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    return bb.get()


def _reference(x, w, b, tail=None):
    h = np.maximum(x.astype(np.float64) @ w.T.astype(np.float64) + b, 0)
    if tail == "tanh":
        h = np.tanh(h)
    elif tail == "residual":
        h = h + x
    elif tail == "exp":
        h = np.exp(h)
    return h


@pytest.mark.parametrize("tail,kernel,intrinsic,left", [
    ("tanh", "tirbyoc_matmul_f32", "dense_bias_relu_tanh", 0),
    ("residual", "tirbyoc_matmul_f32", "dense_bias_relu_residual", 0),
    ("exp", "tirbyoc_dense_relu_f32_nt", "dense_bias_relu", 1)])
def test_prefix_is_offloaded_and_the_rest_stays(tail, kernel, intrinsic, left):
    k = n = 24
    mod = _single_layer((5,), k, n, tail)
    offloaded = tirbyoc.apply_tir_byoc(mod)
    assert tirbyoc.offloaded_kernels(offloaded) == [kernel]
    assert [r.intrinsic for r in tirbyoc.explain(mod).offloaded] == [intrinsic]
    fused = [f for gv, f in offloaded.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    # one fused PrimFunc: the kernel call, then what the kernel does not fuse (exp) as TIR,
    # scheduled beside the call: the exp expanded to vector code (tirbyoc.fastmath), the
    # row vectorized
    assert len(fused) == 1
    rest = [n.name for n in tirbyoc.normalize.normalize(fused[0]).nests if not n.offloaded_kernel]
    assert len(rest) == left
    if left:
        text = fused[0].script()
        # (the expansion's log2(e): tirbyoc.fastmath)
        assert "T.exp(" not in text and "1.4426950408889634" in text and "T.vectorized" in text
    rng = np.random.default_rng(2)
    x, w, b = (rng.standard_normal(s, np.float32) for s in ((5, k), (n, k), (n,)))
    got = tirbyoc.run(tvm.compile(offloaded, target="llvm"), x, w, b)
    assert_close(got, _reference(x, w, b, tail))


def test_batched_activations():
    mod = _single_layer((2, 16), 64, 32)
    assert tirbyoc.offloaded_kernels(tirbyoc.apply_tir_byoc(mod)) == ["tirbyoc_dense_relu_f32_nt"]
    rng = np.random.default_rng(3)
    x, w, b = (rng.standard_normal(s, np.float32) for s in ((2, 16, 64), (32, 64), (32,)))
    assert_close(tirbyoc.run(tirbyoc.compile(mod), x, w, b), _reference(x, w, b))


def test_legalized_unfused_module_offloads_the_dense_alone():
    layers = examples.mlp_weights((16, 8, 4))
    mod = relax.transform.LegalizeOps()(examples.mlp_relax(3, layers, bind_weights=False))
    offloaded = tirbyoc.apply_tir_byoc(mod)
    # the epilogue lives in separate PrimFuncs, so only the matmuls go to the kernel
    assert tirbyoc.offloaded_kernels(offloaded) == ["tirbyoc_dense_f32_nt"] * 2
    assert "add" in " ".join(_prim_func_names(offloaded))
    x, args = _inputs(3, layers, False)
    assert_close(tirbyoc.run(tvm.compile(offloaded, target="llvm"), *args),
                 examples.mlp_numpy(x, layers))
    # asked to fuse, the same module offloads the whole layers
    fused = tirbyoc.apply_tir_byoc(mod, fuse=True)
    assert tirbyoc.offloaded_kernels(fused) == ["tirbyoc_dense_f32_nt", "tirbyoc_dense_relu_f32_nt"]


def test_float16_model_is_not_offloaded_and_still_runs():
    mod = _single_layer((4,), 8, 6, dtype="float16")
    offloaded = tirbyoc.apply_tir_byoc(mod)
    assert tirbyoc.offloaded_kernels(offloaded) == []
    report = tirbyoc.explain(mod)
    assert len(report.rejected) == 1 and "float16" in report.rejected[0].detail
    rng = np.random.default_rng(4)
    x, w, b = (rng.standard_normal(s).astype(np.float16) for s in ((4, 8), (6, 8), (6,)))
    got = tirbyoc.run(tvm.compile(offloaded, target="llvm"), x, w, b)
    np.testing.assert_allclose(got.astype(np.float32), _reference(x, w, b), rtol=1e-2, atol=1e-2)


_FRESH_PROCESS = textwrap.dedent("""
    import sys
    import numpy as np
    import tvm
    from tvm import relax
    lib = tvm.runtime.load_module(sys.argv[1])
    vm = relax.VirtualMachine(lib, tvm.cpu())
    args = [tvm.runtime.tensor(a) for a in np.load(sys.argv[2]).values()]
    np.save(sys.argv[3], vm["main"](*args).numpy())
""")


@pytest.mark.parametrize("batch", [64, None], ids=["static", "symbolic"])
def test_export_library_runs_in_a_fresh_process(tmp_path, batch):
    layers = examples.mlp_weights()
    ex = tirbyoc.compile(examples.mlp_relax(batch, layers))
    path = str(tmp_path / "mlp.so")
    ex.export_library(path)
    x, args = _inputs(batch or 17, layers, True)
    np.savez(tmp_path / "in.npz", *args)
    # NOTE: a plain interpreter that never imports tirbyoc: the kernels must be inside
    # the exported library itself.
    subprocess.run([sys.executable, "-c", without_torch(_FRESH_PROCESS), path, str(tmp_path / "in.npz"),
                    str(tmp_path / "out.npy")], check=True, cwd=tmp_path,
                   env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert_close(np.load(tmp_path / "out.npy"), examples.mlp_numpy(x, layers))


def test_missing_kernel_library_says_how_to_fix(monkeypatch, tmp_path):
    from tirbyoc import kernels

    monkeypatch.setattr(kernels, "STATIC_OBJECT_NAME", "not_built.o")
    kernels.static_library.cache_clear()
    try:
        with pytest.raises(ImportError, match="pip install -e"):
            tirbyoc.apply_tir_byoc(examples.mlp_relax(2, examples.mlp_weights((4, 3, 2))))
    finally:
        kernels.static_library.cache_clear()


def test_tir_only_module_in_process_and_exported(tmp_path):
    from . import tir_forms as F

    mod = tvm.IRModule({"main": F.nt_bias_relu})
    ex = tirbyoc.compile(mod)
    rng = np.random.default_rng(5)
    a, w, b = (rng.standard_normal(s, np.float32) for s in ((64, 80), (50, 80), (50,)))
    ref = np.maximum(a.astype(np.float64) @ w.T + b, 0)
    out = tvm.runtime.tensor(np.zeros((64, 50), np.float32))
    ex["main"](*[tvm.runtime.tensor(v) for v in (a, w, b)], out)
    assert_close(out.numpy(), ref)
    path = str(tmp_path / "tir.so")
    ex.export_library(path)
    np.savez(tmp_path / "in.npz", a, w, b)
    script = textwrap.dedent("""
        import sys
        import numpy as np
        import tvm
        lib = tvm.runtime.load_module(sys.argv[1])
        args = [tvm.runtime.tensor(a) for a in np.load(sys.argv[2]).values()]
        out = tvm.runtime.tensor(np.zeros((64, 50), np.float32))
        lib["main"](*args, out)
        np.save(sys.argv[3], out.numpy())
    """)
    subprocess.run([sys.executable, "-c", without_torch(script), path, str(tmp_path / "in.npz"),
                    str(tmp_path / "out.npy")], check=True, cwd=tmp_path)
    assert_close(np.load(tmp_path / "out.npy"), ref)


def _layer(intrinsic_name, layout, m, k, n):
    """One layer whose epilogue is exactly that of ``intrinsic_name``; weights as inputs."""
    bias = "bias" in intrinsic_name
    activation = intrinsic_name.rsplit("_", 1)[-1] if "relu" in intrinsic_name else None
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), "float32"))
    w = relax.Var("w", relax.TensorType((n, k) if layout == "nt" else (k, n), "float32"))
    b = relax.Var("b", relax.TensorType((n,), "float32"))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            wk = bb.emit(relax.op.permute_dims(w, [1, 0])) if layout == "nt" else w
            h = bb.emit(relax.op.matmul(x, wk))
            if bias:
                h = bb.emit(relax.op.add(h, b))
            if activation:
                h = bb.emit(getattr(relax.op.nn, activation)(h))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("layout", ["nt", "nn"])
@pytest.mark.parametrize("name", [i.name for i in REGISTRY if i.chain is None])
def test_every_intrinsic_matches_its_numpy_reference(name, layout):
    intr = by_name(name)
    m, k, n = 7, 33, 5
    mod = _layer(name, layout, m, k, n)
    report = tirbyoc.explain(mod)
    assert [r.intrinsic for r in report.offloaded] == [name]
    assert report.offloaded[0].kernel == intr.symbol("float32", "nt" if layout == "nt" else "nn")
    rng = np.random.default_rng(6)
    x = 2 * rng.standard_normal((m, k), np.float32)  # values on both sides of 0 and 6
    w_kn = rng.standard_normal((k, n), np.float32)
    b = rng.standard_normal(n, np.float32)
    w = np.ascontiguousarray(w_kn.T) if layout == "nt" else w_kn
    got = tirbyoc.run(tirbyoc.compile(mod), x, w, b)
    assert_close(got, intr.reference(x, w_kn, b if "bias" in name else None))


def _f32_then_f16(seed, second_transposed):
    """x[3, 8] -> float32 dense + bias + relu (offloadable) -> float16 dense (TVM's own),
    weights bound. Returns (module, input, float64 reference, w1, w2)."""
    rng = np.random.default_rng(seed)
    w1, b1 = rng.standard_normal((6, 8), np.float32), rng.standard_normal(6, np.float32)
    w2 = rng.standard_normal((4, 6) if second_transposed else (6, 4)).astype(np.float16)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((3, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(x, relax.op.permute_dims(relax.const(w1), [1, 0])))
            h = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(h, relax.const(b1)))))
            h = bb.emit(relax.op.astype(h, "float16"))
            w2v = relax.const(w2)
            w2v = relax.op.permute_dims(w2v, [1, 0]) if second_transposed else w2v
            out = bb.emit_output(bb.emit(relax.op.matmul(h, w2v)))
        bb.emit_func_output(out)
    xs = rng.standard_normal((3, 8), np.float32)
    w2_kn = (w2.T if second_transposed else w2).astype(np.float64)
    ref = np.maximum(xs.astype(np.float64) @ w1.T + b1, 0).astype(np.float16).astype(
        np.float64) @ w2_kn
    return bb.get(), xs, ref, w1, w2


def test_only_offloaded_layers_get_packed_weights():
    """A float32 layer (offloaded, weight packed) feeding a float16 layer (TVM's own)."""
    mod, x_np, ref, w1, w2 = _f32_then_f16(8, second_transposed=False)
    offloaded = tirbyoc.apply_tir_byoc(mod)
    assert tirbyoc.offloaded_kernels(offloaded) == ["tirbyoc_dense_relu_f32_packed"]
    consts = []
    tvm_ffi.structural_walk(offloaded["main"], [(tvm.ir.expr.GenericConst, consts.append)])
    values = [c.value.numpy() for c in consts]
    halves = [v for v in values if v.dtype == np.float16]
    assert len(halves) == 1
    np.testing.assert_array_equal(halves[0], w2)  # TVM's own layer keeps its weight as is
    from tirbyoc import kernels

    singles = sorted((v for v in values if v.dtype == np.float32), key=lambda v: v.size)
    assert [v.shape for v in singles] == [(6,), (kernels.packed_weight_size(6, 8),)]
    np.testing.assert_array_equal(singles[1], kernels.pack_weight(w1, "nt"))
    got = tirbyoc.run(tvm.compile(offloaded, target="llvm"), x_np)
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=1e-2, atol=1e-2)


def test_region_passes_change_offloaded_layers_only():
    """A user's region pass (weight to NT layout, folded at compile time) on a model where
    one layer is offloaded (float32) and one is TVM's (float16)."""
    from tirbyoc import weights

    mod, xs, ref, w1, _ = _f32_then_f16(12, second_transposed=True)
    default = tirbyoc.apply_tir_byoc(mod, region_passes=(weights.untranspose,))
    mine = tirbyoc.apply_tir_byoc(mod, region_passes=(weights.untranspose,
                                                       weights.to_layout("nt")))
    assert tirbyoc.offloaded_kernels(default) == ["tirbyoc_dense_relu_f32_nn"]
    assert tirbyoc.offloaded_kernels(mine) == ["tirbyoc_dense_relu_f32_nt"]
    assert "weight permuted to NT" in str(tirbyoc.explain(mod, region_passes=(
        weights.untranspose, weights.to_layout("nt"))))

    def constants(m):
        found = []
        tvm_ffi.structural_walk(m["main"], [(tvm.ir.expr.GenericConst, found.append)])
        return [c.value.numpy() for c in found]

    # the offloaded layer's weight was permuted at compile time, back to W [N, K] ...
    singles = [c for c in constants(mine) if c.dtype == np.float32 and c.ndim == 2]
    assert len(singles) == 1
    np.testing.assert_array_equal(singles[0], w1)
    # ... and TVM's own layer is exactly as it was without the pass
    halves = [c for c in constants(mine) if c.dtype == np.float16]
    assert len(halves) == 1
    np.testing.assert_array_equal(halves[0], [c for c in constants(default)
                                              if c.dtype == np.float16][0])
    f16 = [f for gv, f in mine.functions_items() if isinstance(f, tvm.tirx.PrimFunc)
           and not tirbyoc.offloaded_kernels(f)]
    f16_default = [f for gv, f in default.functions_items()
                   if isinstance(f, tvm.tirx.PrimFunc) and not tirbyoc.offloaded_kernels(f)]
    assert [f.script() for f in f16] == [f.script() for f in f16_default]
    got = tirbyoc.run(tvm.compile(mine, target="llvm"), xs)
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=1e-2, atol=1e-2)
