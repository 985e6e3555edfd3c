"""The graph level: is_call_tir patterns choose regions, the TIR path offloads exactly those."""

import numpy as np
import pytest
import tvm
from tvm import relax

import tirbyoc
from tirbyoc import examples

RTOL = 1e-4


def assert_close(got, ref):
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=RTOL * float(np.abs(ref).max()))


def _composites(mod):
    return sorted(str(f.attrs["Composite"]) for _, f in mod.functions_items()
                  if isinstance(f, relax.Function) and f.attrs and "Composite" in f.attrs)


def _two_layers(bind_first=False, clip_first=False):
    """x[5, 12] -> (W0 const or input) + b0 -> relu (or clip to [0.5, inf)) -> W1 + b1."""
    rng = np.random.default_rng(10)
    w0, b0 = rng.standard_normal((8, 12), np.float32), rng.standard_normal(8, np.float32)
    w1, b1 = rng.standard_normal((4, 8), np.float32), rng.standard_normal(4, np.float32)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((5, 12), "float32"))
    params = [x] + [relax.Var(n, relax.TensorType(a.shape, "float32"))
                    for n, a in (("w0", w0), ("b0", b0), ("w1", w1), ("b1", b1))]
    with bb.function("main", params if not bind_first else [x] + params[3:]):
        with bb.dataflow():
            wv0 = relax.const(w0) if bind_first else params[1]
            bv0 = relax.const(b0) if bind_first else params[2]
            h = bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(wv0, [1, 0]))))
            h = bb.emit(relax.op.add(h, bv0))
            h = bb.emit(relax.op.clip(h, 0.5, 1e30) if clip_first else relax.op.nn.relu(h))
            h = bb.emit(relax.op.matmul(h, bb.emit(relax.op.permute_dims(params[3], [1, 0]))))
            out = bb.emit_output(bb.emit(relax.op.add(h, params[4])))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    xs = rng.standard_normal((5, 12), np.float32)
    h = xs.astype(np.float64) @ w0.T + b0
    h = np.maximum(h, 0.5) if clip_first else np.maximum(h, 0)
    ref = h @ w1.T + b1
    args = [xs, w0, b0, w1, b1] if not bind_first else [xs, w1, b1]
    return mod, args, ref


def test_patterns_group_call_tir_chains_into_tirbyoc_composites():
    mod, args, ref = _two_layers()
    part = relax.transform.FuseOpsByPattern(tirbyoc.relax_patterns(mod))(mod)
    assert _composites(part) == ["tirbyoc.dense_bias", "tirbyoc.dense_bias_relu"]
    report = tirbyoc.explain(part)
    assert sorted(r.intrinsic for r in report.offloaded) == ["dense_bias", "dense_bias_relu"]
    assert_close(tirbyoc.run(tirbyoc.compile(part), *args), ref)


def test_checks_ask_the_tir_matcher():
    # clip(x, 0.5, inf) legalizes to a max(.., 0.5): a chain of the relu pattern's shape
    # that the TIR matcher refuses, so only matmul + add becomes a composite
    mod, args, ref = _two_layers(clip_first=True)
    part = relax.transform.FuseOpsByPattern(tirbyoc.relax_patterns(mod))(mod)
    assert _composites(part) == ["tirbyoc.dense_bias", "tirbyoc.dense_bias"]
    assert_close(tirbyoc.run(tirbyoc.compile(part), *args), ref)
    # without the module the check cannot look at the TIR: the composite is formed, and
    # the TIR path still offloads only what it computes exactly (the clip stays TIR)
    loose = relax.transform.FuseOpsByPattern(tirbyoc.relax_patterns())(mod)
    assert "tirbyoc.dense_bias_relu" in _composites(loose)
    assert sorted(r.intrinsic for r in tirbyoc.explain(loose).offloaded) == ["dense_bias"] * 2
    assert "stays in TVM" not in str(tirbyoc.explain(loose))
    assert_close(tirbyoc.run(tirbyoc.compile(loose), *args), ref)


@pytest.mark.parametrize("how", ["constant-weights", "call-predicate"])
def test_graph_level_restriction_is_honoured(how):
    if how == "constant-weights":
        mod, args, ref = _two_layers(bind_first=True)
        predicate = tirbyoc.constant_weights
    else:
        mod, args, ref = _two_layers()
        predicate = lambda region: region.intrinsic == "dense_bias_relu"  # noqa: E731
    part = tirbyoc.partition(mod, predicate)
    assert _composites(part) == ["tirbyoc.dense_bias_relu"]
    offloaded = tirbyoc.apply_tir_byoc(part)
    # only the chosen layer goes to a kernel; the other one is TVM's
    assert [k.split("_f32")[0] for k in tirbyoc.offloaded_kernels(offloaded)] == \
        ["tirbyoc_dense_relu"]
    assert_close(tirbyoc.run(tirbyoc.compile(part), *args), ref)


def test_functions_claimed_by_another_codegen_are_left_alone():
    mod, args, ref = _two_layers()
    mine = [relax.transform.FusionPattern("mylib.dense_bias_relu", p.pattern,
                                          p.annotation_patterns)
            for p in tirbyoc.relax_patterns(mod) if p.name == "tirbyoc.dense_bias_relu"]
    part = relax.transform.FuseOpsByPattern(mine)(mod)
    part = relax.transform.FuseOpsByPattern(tirbyoc.relax_patterns(part))(part)
    assert _composites(part) == ["mylib.dense_bias_relu", "tirbyoc.dense_bias"]
    offloaded = tirbyoc.apply_tir_byoc(part)
    assert [k.split("_f32")[0] for k in tirbyoc.offloaded_kernels(offloaded)] == \
        ["tirbyoc_dense"]
    assert_close(tirbyoc.run(tirbyoc.compile(part), *args), ref)


def test_codegen_functions_are_not_touched():
    mod, _, _ = _two_layers()
    layer = examples.mlp_relax(2, examples.mlp_weights((4, 3)))["main"]
    external = layer.with_attr("Codegen", "somewhere_else").with_attr("global_symbol", "ext")
    mod = mod.clone()
    mod[tvm.ir.GlobalVar("ext")] = external
    out = tirbyoc.apply_tir_byoc(mod)
    tvm.ir.assert_structural_equal(out["ext"], external)


def test_bound_constants_inside_composites_get_a_clear_error():
    mod, _, _ = _two_layers(bind_first=True)
    part = relax.transform.FuseOpsByPattern(tirbyoc.relax_patterns(mod))(mod)
    with pytest.raises(ValueError, match="bind_constants=False"):
        tirbyoc.apply_tir_byoc(part)
