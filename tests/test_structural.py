"""Structural tests of the TIR rewrite: what is offloaded, what comes back unchanged."""

import numpy as np
import pytest
import tvm

import tirbyoc
from tirbyoc.api import offload_prim_func
from tirbyoc.normalize import normalize

from . import tir_forms as F


def _module(func):
    return tvm.IRModule({"main": func})


def _kernel_blocks(func):
    return [n for n in normalize(func).nests if n.offloaded_kernel]


def _nest(func, name):
    return next(n for n in normalize(func).nests if n.block is not None and n.name == name)


def test_expected_form_of_dense_bias_relu():
    new, _ = offload_prim_func(F.nt_bias_relu)
    expected = F.nt_bias_relu_expected.with_attrs(
        {"global_symbol": "nt_bias_relu", "tirx.is_scheduled": True})
    tvm.ir.assert_structural_equal(new, expected)


@pytest.mark.parametrize("name,func,intrinsics,stays", F.ACCEPTED, ids=[a[0] for a in F.ACCEPTED])
def test_accepted_forms_are_offloaded(name, func, intrinsics, stays):
    new, results = offload_prim_func(func)
    blocks = _kernel_blocks(new)
    assert [str(b.block.annotations["tirbyoc.intrinsic"]) for b in blocks] == intrinsics
    # every reduction block is gone; the blocks after the matched prefix stay as they were
    remaining = normalize(new).nests
    assert not [n for n in remaining if n.reduction()]
    assert sorted(n.name for n in remaining if not n.offloaded_kernel) == sorted(stays)
    for block_name in stays:
        tvm.ir.assert_structural_equal(_nest(new, block_name).stmt, _nest(func, block_name).stmt)
    # intermediates the kernel replaced are no longer allocated
    assert len(normalize(new).root.alloc_buffers) == len(stays)


def test_symbolic_rows_pass_the_row_var_to_the_kernel():
    new, _ = offload_prim_func(F.symbolic_rows)
    text = new.script()
    assert '"tirbyoc_dense_f32_nt", m, T.int64(12), T.int64(10)' in text


def test_batched_rows_collapse_into_m():
    new, _ = offload_prim_func(F.batched_rows)
    assert '"tirbyoc_dense_relu_f32_nt", T.int64(6), T.int64(5), T.int64(8)' in new.script()


def test_strided_rows_pass_their_row_strides():
    text = offload_prim_func(F.strided_rows)[0].script()
    # lda = 9 and ldw = 7 come from the buffers' declared strides
    assert 'T.tvm_access_ptr(T.type_annotation("float32"), A.data, 0, 54, 1), T.int64(9)' in text
    assert 'T.tvm_access_ptr(T.type_annotation("float32"), W.data, 0, 35, 1), T.int64(7)' in text
    assert "tirbyoc_dense_f32_nn" in text


@pytest.mark.parametrize("name,func,reason", F.REFUSED, ids=[r[0] for r in F.REFUSED])
def test_refused_forms_come_back_unchanged(name, func, reason):
    new, results = offload_prim_func(func)
    assert new is func
    tvm.ir.assert_structural_equal(tirbyoc.apply_tir_byoc(_module(func))["main"], func)
    assert len(results) == 1 and not results[0][1]
    assert reason in results[0][1].reason


@pytest.mark.parametrize("name,func,intrinsic,stays,reason", F.PARTIAL,
                         ids=[p[0] for p in F.PARTIAL])
def test_refused_epilogues_stay_as_tir(name, func, intrinsic, stays, reason):
    new, results = offload_prim_func(func)
    blocks = _kernel_blocks(new)
    assert [str(b.block.annotations["tirbyoc.intrinsic"]) for b in blocks] == [intrinsic]
    # what the kernel refused is still computed beside the call (scheduled there: each
    # step inlined into the next, loops parallel / vectorized, math expanded), a block of
    # its own where nothing follows it: every output the same as TVM's build of the
    # function as written
    assert any(n.name == stays for n in normalize(func).nests)
    assert [n for n in normalize(new).nests if n.block is not None and not n.offloaded_kernel]
    rng = np.random.default_rng(len(name))
    values = [rng.standard_normal([int(d) for d in p.shape]).astype(
        str(p.dtype)) for p in func.params]
    ref = [tvm.runtime.tensor(v) for v in values]
    tvm.compile(_module(func), target="llvm")["main"](*ref)
    got = [tvm.runtime.tensor(v) for v in values]
    tirbyoc.compile(_module(func))["main"](*got)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=1e-5, atol=1e-5)
    report = tirbyoc.explain(_module(func))
    assert reason in str(report)


def test_apply_is_pure_and_idempotent():
    mod = _module(F.prefix_then_tanh)
    before = mod["main"].script()
    once = tirbyoc.apply_tir_byoc(mod)
    assert mod["main"].script() == before
    twice = tirbyoc.apply_tir_byoc(once)
    tvm.ir.assert_structural_equal(twice["main"], once["main"])
    assert len(twice.attrs["external_mods"]) == 1
    assert len(tirbyoc.explain(twice).offloaded) == 1


def test_explain_lists_every_candidate():
    mod = tvm.IRModule({"a": F.nt_bias_relu, "b": F.extra_scale, "c": F.bias_by_row})
    report = tirbyoc.explain(mod)
    by_func = {r.func: r for r in report.rows}
    assert by_func["a"].offloaded and by_func["a"].kernel == "tirbyoc_dense_relu_f32_nt"
    assert not by_func["b"].offloaded and "extra factor" in by_func["b"].detail
    assert by_func["c"].offloaded and "indexed by the row" in by_func["c"].detail
    text = str(report)
    assert "2 offloaded, 1 not offloaded" in text
    assert text.splitlines()[0].split() == ["function", "block", "result", "kernel", "/", "reason"]


def test_piecewise_linear_max_and_min_find_every_kink():
    """The unary identification's piecewise-linear values (tirbyoc.epilogues): max and min
    of lines give their kinks exactly, against numpy on a dense grid (the values between
    the kinks are the lines'); infinite bounds add none; a kink no one has is seen."""
    import numpy as np

    from tirbyoc import epilogues as E

    x = E._Piecewise((), ((1.0, 0.0),))
    const = E._Piecewise.constant

    def at(f, xs):
        bounds = [-np.inf, *f.knots, np.inf]
        out = np.empty_like(xs)
        for (lo, hi), (slope, icpt) in zip(zip(bounds, bounds[1:]), f.pieces):
            sel = (xs >= lo) & (xs <= hi)
            out[sel] = slope * xs[sel] + icpt
        return out

    xs = np.linspace(-12, 12, 24001)
    plus3 = E._affine_op(tvm.tirx.Add, x, const(3.0))
    clip = plus3.extreme(const(float("inf")), False).extreme(const(0.0), True)
    clip = clip.extreme(const(6.0), False).extreme(const(float("-inf")), True)
    assert clip.knots == (-3.0, 3.0)
    np.testing.assert_array_equal(at(clip, xs), np.clip(xs + 3, 0, 6))
    # a tent between 3.03 and 3.05 (hidden between two probe points) has three kinks
    tent = E._affine_op(tvm.tirx.Sub, x, const(3.03)).extreme(
        E._affine_op(tvm.tirx.Sub, const(3.05), x), False).extreme(const(0.0), True)
    assert np.allclose(tent.knots, (3.03, 3.04, 3.05))
    np.testing.assert_allclose(at(tent, xs), np.maximum(0, np.minimum(xs - 3.03, 3.05 - xs)),
                               atol=1e-12)
    assert not E._kinks_within(tent.knots, (-3.0, 3.0))
    # equal slopes never cross; the same line twice has no kink
    assert x.extreme(E._affine_op(tvm.tirx.Add, x, const(1.0)), True).pieces == ((1.0, 1.0),)
    assert x.extreme(x, False).knots == ()
    # lines crossing exactly at an existing kink add no second one there
    kinked = x.extreme(const(0.0), True)  # relu: a kink at 0
    both = kinked.extreme(E._affine_op(tvm.tirx.Mul, x, const(2.0)), False)
    np.testing.assert_array_equal(at(both, xs), np.minimum(np.maximum(xs, 0), 2 * xs))
    assert both.knots == (0.0,)
