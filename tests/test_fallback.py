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


def _loop_kinds(how, scheduled):
    """The loop kinds of the scheduled (not offloaded) PrimFuncs."""
    kinds = set()
    for name, func in scheduled.functions_items():
        if isinstance(func, tirx.PrimFunc) and how[name.name_hint] == "scheduled":
            tvm_ffi.structural_walk(func, [(tirx.For, lambda f: kinds.add(int(f.kind)))])
    return kinds


def test_every_prim_func_is_offloaded_or_scheduled():
    mod, inputs, ref = _block(rows=2048)
    how, scheduled = _scheduled(mod)
    # dense + bias + relu + tanh + residual: one chain kernel call
    assert sorted(how.values()).count("tirbyoc_matmul_f32") == 1
    assert "naive" not in how.values(), how
    # the softmax and the layer norm (2048 x 40 elements) run in parallel with
    # vectorized inner loops
    kinds = _loop_kinds(how, scheduled)
    assert {int(tirx.ForKind.PARALLEL), int(tirx.ForKind.VECTORIZED)} <= kinds, kinds
    assert_close(tirbyoc.run(tirbyoc.compile(mod), *inputs), ref)


def test_small_row_reductions_stay_on_the_calling_thread():
    """Below fallback.PARALLEL_MIN_ELEMENTS (64 x 40 here) the rows are not split over
    TVM's threads (waking them costs more), and are still vectorized."""
    mod, inputs, ref = _block()
    how, scheduled = _scheduled(mod)
    kinds = _loop_kinds(how, scheduled)
    assert int(tirx.ForKind.PARALLEL) not in kinds and int(tirx.ForKind.VECTORIZED) in kinds
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


# ---- fast math, row reductions, describe_schedules ----------------------------------

def _float_sweep():
    """Every 997th float32 bit pattern (all exponents, both signs) and the specials."""
    bits = np.arange(0, 1 << 32, 997, dtype=np.uint64).astype(np.uint32)
    specials = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 88.72, 88.73,
                           -87.33, -87.34, -103.9, -104.0, 9.0, -9.0, 3.9, 4.0, 0.625, 4e-4])
    return np.concatenate([bits.view(np.float32), specials])


def _erf64(x):
    try:
        from scipy.special import erf
    except ImportError:  # pragma: no cover (math.erf per element: slower, same values)
        import math
        return np.vectorize(math.erf, otypes=[np.float64])(x)
    return erf(x)


def _sigmoid64(x):
    return 1.0 / (1.0 + np.exp(-x))


_MATH = {"exp": (tirx.exp, np.exp), "tanh": (tirx.tanh, np.tanh), "erf": (tirx.erf, _erf64),
         "sigmoid": (tirx.sigmoid, _sigmoid64), "sinh": (tirx.sinh, np.sinh),
         "cosh": (tirx.cosh, np.cosh),
         "cube": (lambda v: tirx.pow(v, tirx.const(3.0, "float32")), lambda v: v ** 3),
         "square": (lambda v: tirx.pow(v, tirx.const(2.0, "float32")), lambda v: v ** 2)}


@pytest.mark.parametrize("name", list(_MATH))
def test_fast_math_is_accurate_over_the_float_range(name):
    """Relative error within 1e-5 wherever the exact result is a normal float, below
    FLT_MIN where it is subnormal, exactly +-1 where it rounds to that, and the same
    infinities and NaNs."""
    from tvm import te
    from tirbyoc import fastmath

    n = tirx.Var("n", "int32")
    a = te.placeholder((n,), "float32", "a")
    b = te.compute((n,), lambda i: _MATH[name][0](a[i]), "b")
    func = fastmath.expand_math(te.create_prim_func([a, b]))
    assert not fastmath.calls_math(func.body)
    sch = tvm.s_tir.Schedule(func)
    _, lanes = sch.split(sch.get_loops(sch.get_sblock("b"))[0], [None, 16])
    sch.vectorize(lanes)
    lib = tvm.compile(sch.mod, target=tirbyoc.host_target())
    xs = _float_sweep()
    out = tvm.runtime.tensor(np.empty_like(xs))
    lib(tvm.runtime.tensor(xs), out)
    with np.errstate(all="ignore"):  # signalling NaNs among the inputs
        got = out.numpy().astype(np.float64)
        ref = _MATH[name][1](xs.astype(np.float64))
        ref32 = ref.astype(np.float32).astype(np.float64)
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    inf = np.isinf(ref32)
    assert np.array_equal(got[inf], ref32[inf])
    finite = np.isfinite(ref32)
    normal = finite & (np.abs(ref32) >= np.finfo(np.float32).tiny)
    rel = np.abs(got[normal] - ref[normal]) / np.abs(ref[normal])
    assert rel.max() < 1e-5, (rel.max(), xs[normal][np.argmax(rel)])
    # the limits exact (tanh gave 1 - 2.4e-7 from 7.9 on)
    one = (np.abs(ref32) == 1.0) & (np.abs(xs) > 1.0)
    assert np.array_equal(got[one], ref32[one]), xs[one][got[one] != ref32[one]][:4]
    sub = finite & ~normal
    assert np.all(np.abs(got[sub] - ref[sub]) <= np.finfo(np.float32).tiny)


@pytest.mark.parametrize("name", ["exp", "tanh", "erf", "sigmoid"])
@pytest.mark.parametrize("transposed", [False, True])
def test_fast_math_stays_in_vectors(name, transposed):
    """TVM's vectorizer turned a loop back into one lane at a time where it met TIR's
    ``isnan`` (each expansion's NaN test; now a test of the bits): LLVM vectorized such a
    loop again where its loads were contiguous, not where they were a transpose's. After
    TVM's vectorizer, the store of each expansion is a vector store (a ``Ramp`` index),
    read along a row or across a [64, 24] transpose."""
    from tvm import te
    from tirbyoc import fastmath

    shape = (24, 64) if transposed else (64, 24)
    a = te.placeholder((64, 24), "float32", "a")
    b = te.compute(shape,
                   lambda i, j: _MATH[name][0](a[j, i] if transposed else a[i, j]), "b")
    sch = tvm.s_tir.Schedule(fastmath.expand_math(te.create_prim_func([a, b])))
    _, lanes = sch.split(sch.get_loops(sch.get_sblock("b"))[1], [None, 8])
    sch.vectorize(lanes)
    ramps = []

    @tvm.instrument.pass_instrument
    class AfterVectorizer:
        def run_after_pass(self, mod, info):
            if info.name == "tirx.VectorizeLoop":
                tvm_ffi.structural_walk(mod["main"], [(tirx.Ramp, ramps.append)])

    with tvm.transform.PassContext(instruments=[AfterVectorizer()]):
        lib = tvm.compile(sch.mod, target=tirbyoc.host_target())
    assert ramps
    xs = np.random.default_rng(5).standard_normal((64, 24)).astype(np.float32) * 4
    xs[3, 5] = np.nan
    out = tvm.runtime.tensor(np.empty(shape, np.float32))
    lib(tvm.runtime.tensor(xs), out)
    ref = _MATH[name][1]((xs.T if transposed else xs).astype(np.float64))
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-30)


def test_an_expanded_call_inlined_twice_into_one_loop_builds_and_is_right():
    """WavLM's gated position bias: two sigmoids of one tensor's halves scale a third
    tensor, all one fused function, the sigmoid block inlined twice into a vectorized
    loop. The exp expansion once bound its intermediates with ``Let``s, and TVM's
    vectorizer stopped on them ("Let cannot bind the same var to two different values")."""
    torch = pytest.importorskip("torch")
    from tvm.relax.frontend.torch import from_exported_program

    class Gate(torch.nn.Module):
        def forward(self, a, b):
            first, second = torch.sigmoid(a).chunk(2, dim=-1)
            return (first * (second * 0.5 - 1.0) + 2.0) * b

    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(12, 49, 2, generator=gen) * 4, torch.randn(12, 49, 49, generator=gen)
    mod = from_exported_program(torch.export.export(Gate(), (a, b)))
    (got,) = tirbyoc.run(tirbyoc.compile(mod), a.numpy(), b.numpy())  # the output tuple
    ref = Gate()(a.double(), b.double()).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6 * np.abs(ref).max())


def _schedule(mod, rule):
    """The schedule ``rule`` makes of the first PrimFunc of ``mod`` legalized (or None)."""
    with TARGET:
        func = next(f for _, f in _legalized(mod).functions_items()
                    if isinstance(f, tirx.PrimFunc))
        return rule.apply(func, TARGET)


def _predicated(sch) -> list:
    """The block realizes of a schedule's function that carry a predicate."""
    found = []
    tvm_ffi.structural_walk(sch.mod["main"], [(
        tvm.s_tir.SBlockRealize,
        lambda r: found.append(r) if not isinstance(r.predicate, tirx.IntImm) else None)])
    return found


@pytest.mark.parametrize("row", [129, 50])
def test_a_row_reduction_without_whole_vectors_carries_no_lane_predicate(row):
    """A max over rows that no lane count divides (GPT-OSS's scores beside their sink:
    129) was split into 16-element steps, unrolled, with a predicate tested at every
    element: 1.37 ms for [8192, 129] against 0.20 as one plain loop. It stays one plain
    loop now; numpy's values bit for bit."""
    mod = _one_op_module((64, row), lambda x: relax.op.subtract(
        x, relax.op.max(x, axis=-1, keepdims=True)))
    sch = _schedule(mod, fallback.RowReduction())
    assert sch is not None
    assert not _predicated(sch), sch.mod["main"]
    x = np.random.default_rng(row).standard_normal((64, row)).astype(np.float32)
    np.testing.assert_array_equal(tirbyoc.run(tirbyoc.compile(mod), x),
                                  x - x.max(-1, keepdims=True))


@pytest.mark.parametrize("side, lanes", [(7, 7), (5, 5), (14, 14)])
def test_short_rows_of_a_global_pooling_are_summed_in_lanes(side, lanes):
    """A mean over each channel's 7 x 7 pixels (ResNet-50's and EfficientNet-B0's last
    pools): 49 has no divisor from 8 to 16, and the row was one scalar chain of dependent
    adds; it is summed in 7 lanes of partial sums now (25 in 5; 196 in 14 as before).
    Numerics against numpy in float64."""
    mod = _one_op_module((2, 96, side, side),
                         lambda x: relax.op.mean(x, axis=[2, 3], keepdims=True))
    sch = _schedule(mod, fallback.RowReduction())
    assert sch is not None
    widths = []
    tvm_ffi.structural_walk(sch.mod["main"], [(tirx.For, lambda f: widths.append(
        int(f.extent)) if int(f.kind) == int(tirx.ForKind.VECTORIZED) else None)])
    assert lanes in widths, sch.mod["main"]
    assert not _predicated(sch), sch.mod["main"]
    x = np.random.default_rng(side).standard_normal((2, 96, side, side)).astype(np.float32)
    np.testing.assert_allclose(tirbyoc.run(tirbyoc.compile(mod), x),
                               x.astype(np.float64).mean(axis=(2, 3), keepdims=True),
                               rtol=1e-6, atol=1e-7)


def _recurrence(x, steps=9):
    """x <- x * x + x - 0.5, ``steps`` times: each step reads the last one three times (an
    unrolled recurrence, RWKV's state over its tokens), so inlining every step into the
    next makes an expression of 3 ** steps loads."""
    for _ in range(steps):
        x = relax.op.subtract(relax.op.add(relax.op.multiply(x, x), x),
                              relax.const(0.5, "float32"))
    return x


def test_a_recurrence_is_not_inlined_past_the_expression_budget():
    """Inlined step into step, RWKV's unrolled recurrence took more than 20 GB and did not
    finish building; a block past ``INLINE_NODES`` stays a block its consumers read.
    The values are numpy's."""
    mod = _one_op_module((4, 64), _recurrence)
    sch = _schedule(mod, fallback.Injective())
    blocks = []
    tvm_ffi.structural_walk(sch.mod["main"], [(tvm.s_tir.SBlock, blocks.append)])
    sizes = [fallback._expr_nodes(b) for b in blocks if b.name_hint != "root"]
    assert len(sizes) > 1 and max(sizes) <= 4 * fallback.INLINE_NODES, sizes
    x = np.random.default_rng(0).uniform(-0.6, 0.6, (4, 64)).astype(np.float32)
    want = x.astype(np.float64)
    for _ in range(9):
        want = want * want + want - 0.5
    np.testing.assert_allclose(tirbyoc.run(tirbyoc.compile(mod), x), want, rtol=1e-5,
                               atol=1e-6)


def test_fusion_stops_at_the_depth_bound():
    """A chain of more elementwise operators than ``relax_prep.FUSE_DEPTH`` fuses into
    several functions (TVM's bound, 256, let RWKV's unrolled recurrence fuse into
    functions whose scheduling took 585 s); a caller's own bound is kept."""
    from tirbyoc import relax_prep

    mod = _one_op_module((4, 64), lambda x: _recurrence(x, steps=12))  # 36 operators
    fused, _ = relax_prep.prepare(mod, fuse=True)
    count = lambda m: sum(isinstance(f, tirx.PrimFunc) for _, f in m.functions_items())  # noqa: E731
    assert count(fused) == 2
    with tvm.transform.PassContext(config={"relax.FuseOps.max_depth": 256}):
        assert count(relax_prep.prepare(mod, fuse=True)[0]) == 1


def _one_op_module(shape, build, extra=()):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    params = [x] + [relax.Var(name, relax.TensorType(s, d)) for name, s, d in extra]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(build(*params)))
        bb.emit_func_output(out)
    return bb.get()


def _layer_norm(x):
    d = int(x.ty.shape[-1])
    rng = np.random.default_rng(d)
    gamma, beta = (relax.const(rng.standard_normal(d).astype(np.float32)) for _ in range(2))
    return relax.op.nn.layer_norm(x, gamma, beta, axes=[-1])


def _masked_softmax(x, mask):
    neg = relax.const(float("-inf"), "float32")
    return relax.op.nn.softmax(relax.op.where(mask, x, neg), axis=-1)


def _mask_any(x):
    """BERT's padding-mask check: any(not(x == -inf)) over each row, as int8 max."""
    neg = relax.const(float("-inf"), "float32")
    keep = relax.op.astype(relax.op.logical_not(relax.op.equal(x, neg)), "int8")
    return relax.op.max(keep, axis=-1, keepdims=True)


def _softmax(x):
    return relax.op.nn.softmax(x, axis=-1)


# name: (build, extra params (name, shape or None: the rows x row length, dtype), the rule
# expected, row length: "rows" = as many as the rows, as attention scores are)
ROW_OPS = {
    "softmax": (_softmax, (), "RowReduction", 128),
    "softmax_square": (_softmax, (), "RowReduction", "rows"),
    "layer_norm": (_layer_norm, (), "RowReduction", 96),
    "layer_norm_100": (_layer_norm, (), "RowReduction", 100),  # not a multiple of the lanes
    "gelu": (relax.op.nn.gelu, (), "Injective", 96),
    "gelu_tanh": (relax.op.nn.gelu_tanh, (), "Injective", 96),
    "masked_softmax": (_masked_softmax, (("mask", None, "bool"),), "RowReduction", "rows"),
    "mask_any": (_mask_any, (), "RowReduction", 128),
    "mask_any_square": (_mask_any, (), "RowReduction", "rows"),
}


def _inputs(mod, rows, rng):
    out = []
    for p in mod["main"].params:
        shape = [rows if not isinstance(s, tirx.IntImm) else int(s) for s in p.ty.shape]
        if p.ty.dtype == "bool":
            out.append(np.tril(np.ones(shape, bool)))
        else:
            out.append((rng.standard_normal(shape) * 4).astype(np.float32))
    return out


@pytest.mark.parametrize("rows", [128, 37, "n"])
@pytest.mark.parametrize("op", sorted(ROW_OPS))
def test_row_rules_match_tvms_unscheduled_build(op, rows):
    """softmax / layer_norm / gelu (erf and tanh) / masked softmax / a mask reduction:
    the fallback rule that takes each, and numerics within 1e-5 of TVM's default build."""
    build, extra, rule, width = ROW_OPS[op]
    lead = tirx.Var("n", "int64") if rows == "n" else rows
    width = lead if width == "rows" else width
    shape = (2, lead, width)
    extra = tuple((name, (lead, width) if s is None else s, d) for name, s, d in extra)
    mod = _one_op_module(shape, build, extra)
    how = fallback.describe_schedules(
        tvm.transform.Sequential(tvm.relax.backend.cpu_generic.pipeline.legalize_passes(None))(mod))
    assert f"schedule: tirbyoc {rule}" in how.values(), how
    assert not any(h.startswith("unscheduled") for h in how.values()), how
    rng = np.random.default_rng(3)
    xs = _inputs(mod, 53 if rows == "n" else rows, rng)
    if op.startswith("mask_any"):  # some rows entirely masked, some partly
        xs[0][:, ::3, :] = -np.inf
        xs[0][:, 1::3, ::2] = -np.inf
    ref = tirbyoc.run(tvm.compile(mod, target="llvm"), *xs)
    for target in (None, "llvm"):
        got = tirbyoc.run(tirbyoc.compile(mod, target), *xs)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_row_reduction_vectorizes_the_row_sums():
    """A softmax row of 128 (1024 rows): parallel rows, and the max / sum accumulated in
    vector lanes (rfactor) with no exp call left."""
    from tirbyoc import fastmath

    mod = _one_op_module((2, 512, 128), lambda x: relax.op.nn.softmax(x, axis=-1))
    with TARGET:
        mod = tvm.transform.Sequential(
            tvm.relax.backend.cpu_generic.pipeline.legalize_passes(None))(mod)
        func = next(f for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc))
        sch = fallback.RowReduction().apply(func, TARGET)
    assert sch is not None
    scheduled = sch.mod["main"]
    assert not fastmath.calls_math(scheduled.body)
    names, kinds = [], set()
    tvm_ffi.structural_walk(scheduled, [(tvm.s_tir.SBlock, lambda b: names.append(b.name_hint))])
    tvm_ffi.structural_walk(scheduled, [(tirx.For, lambda f: kinds.add(int(f.kind)))])
    assert any(n.endswith("_rf_update") for n in names), names
    assert {int(tirx.ForKind.PARALLEL), int(tirx.ForKind.VECTORIZED)} <= kinds


def test_describe_schedules_says_how_every_prim_func_runs():
    mod, _, _ = _block()
    with TARGET:
        offloaded = tirbyoc.apply_tir_byoc(mod, fuse=True)
    how = fallback.describe_schedules(offloaded, TARGET)
    assert set(how) == {gv.name_hint for gv, f in offloaded.functions_items()
                        if isinstance(f, tirx.PrimFunc)}
    values = sorted(how.values())
    assert sum(v.startswith("kernel tirbyoc_matmul_f32") for v in values) == 1, how
    assert "schedule: tirbyoc RowReduction" in values, how  # softmax, layer norm
    assert all(v.startswith(("kernel ", "schedule: ")) for v in values), how
    # a function already scheduled, and one no rule takes
    func = next(f for f in offloaded.functions.values()
                if isinstance(f, tirx.PrimFunc) and not tirbyoc.offloaded_kernels(f))
    assert fallback.describe(func.with_attr("tirx.is_scheduled", True), TARGET) \
        == "already scheduled"
    assert fallback.describe(func, tvm.target.Target("c")).startswith("unscheduled")
    # explain prints it for every PrimFunc
    assert "how each PrimFunc runs:" in str(tirbyoc.explain(mod, target=TARGET))


def test_a_sum_of_products_along_rows_is_a_row_reduction():
    """MobileViT V2's linear attention, (key * scores).sum(-1) with the scores broadcast
    over the channels: dlight's GEMV rule took it first, put the 128 channels in vector
    lanes (each lane loading from another row) and unrolled the sum inside, and LLVM
    took 582 s to compile it. As a row reduction: sums in lanes along each row."""
    rng = np.random.default_rng(6)
    key = rng.standard_normal((1, 128, 4, 196)).astype(np.float32)
    scores = rng.standard_normal((1, 1, 4, 196)).astype(np.float32)
    mod = _one_op_module((1, 128, 4, 196), lambda x, s: relax.op.sum(
        relax.op.multiply(x, s), axis=[-1], keepdims=True),
        extra=(("s", (1, 1, 4, 196), "float32"),))
    with TARGET:
        fused = tirbyoc.apply_tir_byoc(mod, fuse=True)  # one PrimFunc: multiply + sum
    how = fallback.describe_schedules(fused, TARGET)
    assert list(how.values()) == ["schedule: tirbyoc RowReduction"], how
    got = tirbyoc.run(tirbyoc.compile(mod, TARGET), key, scores)
    ref = (key.astype(np.float64) * scores).sum(-1, keepdims=True)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def _causal_mask(x):
    """GPT-2's mask on a symbolic sequence: where(j - i <= 0, x, -inf)."""
    n = x.ty.shape[-1]
    i = relax.op.arange(relax.prim_value(0), relax.prim_value(n), dtype="int64")
    keep = relax.op.less_equal(relax.op.subtract(relax.op.expand_dims(i, 0),
                                                 relax.op.expand_dims(i, 1)),
                               relax.const(0, "int64"))
    return relax.op.where(keep, x, relax.const(float("-inf"), "float32"))


@pytest.mark.parametrize("length", [1, 15, 16, 17, 53])
def test_symbolic_rows_vectorize_without_lane_predicates(length):
    """An elementwise op over a symbolic row length: the chunk loop over the vectorized
    lanes carries LoopPartition's hint (the partial last chunk is split off, so the rest
    runs as vectors), and every length around a chunk boundary is right."""
    n = tirx.Var("n", "int64")
    mod = _one_op_module((2, n, n), _causal_mask)
    legal = tvm.transform.Sequential(
        tvm.relax.backend.cpu_generic.pipeline.legalize_passes(None))(mod)
    func = next(f for _, f in legal.functions_items() if isinstance(f, tirx.PrimFunc))
    with TARGET:
        sch = fallback.Injective().apply(func, TARGET)
    loops = []
    tvm_ffi.structural_walk(sch.mod["main"], [(tirx.For, loops.append)])
    hints = [f for f in loops if "pragma_loop_partition_hint" in f.annotations]
    vectorized = [f for f in loops if int(f.kind) == int(tirx.ForKind.VECTORIZED)]
    assert len(hints) == 1 and len(vectorized) == 1
    x = np.random.default_rng(length).standard_normal((2, length, length)).astype(np.float32)
    got = tirbyoc.run(tirbyoc.compile(mod), x)
    np.testing.assert_array_equal(got, np.where(np.tril(np.ones((length, length), bool)),
                                                x, -np.inf))


# ---- pooling and padded taps ----

def _max_pool_3x3_s2(x):  # ResNet's stem pool
    return relax.op.nn.max_pool2d(x, (3, 3), (2, 2), (1, 1, 1, 1))


def _avg_pool_2x2(x):
    return relax.op.nn.avg_pool2d(x, (2, 2), (2, 2))


def _avg_pool_3x3_padded(x):  # the division counts only the pixels inside
    return relax.op.nn.avg_pool2d(x, (3, 3), (1, 1), (1, 1, 1, 1), count_include_pad=False)


def _global_mean(x):  # AdaptiveAvgPool2d(1)
    return relax.op.mean(x, axis=[2, 3], keepdims=True)


def _global_max(x):
    return relax.op.max(x, axis=[2, 3], keepdims=True)


# name: (build, rule expected when the output rows are at least WindowReduction.MIN_ROW
# wide; None: whatever rule, as long as one takes it)
POOL_OPS = {
    "max_pool_3x3_s2": (_max_pool_3x3_s2, "WindowReduction"),
    "avg_pool_2x2": (_avg_pool_2x2, "WindowReduction"),
    "avg_pool_3x3_padded": (_avg_pool_3x3_padded, "WindowReduction"),
    "global_mean": (_global_mean, "RowReduction"),
    "global_max": (_global_max, "RowReduction"),
}


def _legalized(mod):
    return tvm.transform.Sequential(tvm.relax.backend.cpu_generic.pipeline.legalize_passes(None))(mod)


@pytest.mark.parametrize("hw", [(56, 56), (25, 19), (14, 14), (7, 7)])
@pytest.mark.parametrize("op", sorted(POOL_OPS))
def test_pooling_rules_match_tvms_unscheduled_build(op, hw):
    """max / average pooling (padded or not) and global pooling: the rule that takes each
    (output rows of at least 8: WindowReduction, lanes along the row; one output per
    channel: RowReduction, lanes along the pixels), and numerics within 1e-5 of TVM's
    default build (max pooling exactly)."""
    build, rule = POOL_OPS[op]
    mod = _one_op_module((2, 24, *hw), build)
    xs = _inputs(mod, None, np.random.default_rng(hw[0]))
    ref = tirbyoc.run(tvm.compile(mod, target="llvm"), *xs)
    how = fallback.describe_schedules(_legalized(mod))
    assert not any(h.startswith("unscheduled") for h in how.values()), how
    if rule == "RowReduction" or ref.shape[-1] >= fallback.WindowReduction.MIN_ROW:
        assert f"schedule: tirbyoc {rule}" in how.values(), how
    else:
        assert "schedule: tirbyoc WindowReduction" not in how.values(), how
    got = tirbyoc.run(tirbyoc.compile(mod), *xs)
    if op.startswith(("max", "global_max")):
        np.testing.assert_array_equal(got, ref)
    else:
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def _scheduled_func(mod, rule):
    sch = _schedule(mod, rule)
    assert sch is not None
    names, kinds = [], set()
    tvm_ffi.structural_walk(sch.mod["main"],
                            [(tvm.s_tir.SBlock, lambda b: names.append(b.name_hint))])
    tvm_ffi.structural_walk(sch.mod["main"], [(tirx.For, lambda f: kinds.add(int(f.kind)))])
    return names, kinds


def test_window_reduction_puts_lanes_along_the_output_row():
    """The max pool's window loops run outside vector lanes of outputs: a vectorized
    update block, rows in parallel, the padding its own loop nest."""
    names, kinds = _scheduled_func(_one_op_module((1, 8, 56, 56), _max_pool_3x3_s2),
                                   fallback.WindowReduction())
    assert {int(tirx.ForKind.PARALLEL), int(tirx.ForKind.VECTORIZED)} <= kinds
    assert any(n.endswith("_update") for n in names) and any(n.endswith("_init") for n in names)
    # the padding: filled with the pad value, then the inside copied without a bounds test
    assert {"pad_temp", "pad_temp_pad_const"} <= set(names), names
    # a global pooling is not a window along the row: WindowReduction leaves it
    with TARGET:
        func = next(f for _, f in _legalized(_one_op_module((1, 8, 56, 56), _global_mean))
                    .functions_items() if isinstance(f, tirx.PrimFunc))
        assert fallback.WindowReduction().apply(func, TARGET) is None


def _padded_taps(x):
    """A depthwise 3x3 convolution written as taps (as tirbyoc wrote it for the graph
    before the depthwise kernel): one padding, nine shifted slices of it times a
    per-channel weight, summed."""
    c = int(x.ty.shape[1])
    h, w = int(x.ty.shape[2]), int(x.ty.shape[3])
    rng = np.random.default_rng(c)
    xp = relax.op.nn.pad(x, [0, 0, 0, 0, 1, 1, 1, 1])
    total = None
    for r in range(3):
        for s in range(3):
            tap = relax.op.strided_slice(xp, [2, 3], [r, s], [r + h, s + w])
            wt = relax.const(rng.standard_normal((1, c, 1, 1)).astype(np.float32))
            term = relax.op.multiply(tap, wt)
            total = term if total is None else relax.op.add(total, term)
    return total


def test_a_concat_that_two_splits_read_is_not_lost():
    """Reformer's ``concat([h, h])`` then ``split`` in two, fused: TVM reverse-inlined the
    first half's block into the concat, which the second half still read, and dropped
    the concat's buffer ("used before its definition": the model did not build). Both
    halves against numpy."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64, 256), "float32"))
    y = relax.Var("y", relax.TensorType((64, 256), "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            h = bb.emit(relax.op.reshape(relax.op.add(x, y), [1, 64, 256]))
            both = bb.emit(relax.op.concat([h, h], axis=2))
            halves = bb.emit(relax.op.split(both, 2, axis=2))
            out = bb.emit_output(relax.Tuple([relax.TupleGetItem(halves, 0),
                                              relax.op.multiply(relax.TupleGetItem(halves, 1),
                                                                relax.const(np.float32(2)))]))
        bb.emit_func_output(out)
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((64, 256)).astype(np.float32) for _ in range(2)]
    first, second = tirbyoc.run(tirbyoc.compile(bb.get()), *xs)
    np.testing.assert_allclose(first, (xs[0] + xs[1])[None], rtol=1e-6)
    np.testing.assert_allclose(second, 2 * (xs[0] + xs[1])[None], rtol=1e-6)


def _sum_upsampled_twice(x):
    """GLPN's head: a sum, then two bilinear upsamplings by 2 in a row, fused."""
    total = relax.op.add(x, relax.op.multiply(x, relax.const(np.float32(0.5))))
    once = relax.op.image.resize2d(total, (24, 30), method="linear")
    return relax.op.image.resize2d(once, (48, 60), method="linear")


def test_a_gather_read_by_a_gather_is_not_inlined():
    """Two bilinear upsamplings in a row: inlined, each output pixel computed the first
    one's four taps at each of its own four (GLPN's 26 ms function); the first stays a
    block (the sum before it inlined into it). Numerics against TVM's default build."""
    mod = _one_op_module((1, 8, 12, 15), _sum_upsampled_twice)
    names, _ = _scheduled_func(mod, fallback.Injective())
    assert sum(n.startswith("resize") for n in names) == 2, names
    xs = _inputs(mod, None, np.random.default_rng(7))
    ref = tirbyoc.run(tvm.compile(mod, target="llvm"), *xs)
    np.testing.assert_allclose(tirbyoc.run(tirbyoc.compile(mod), *xs), ref, rtol=1e-5, atol=1e-5)


def _elu_then_pad(x):
    """ELU (through exp), then a zero pad of two on the left of the last axis: a causal
    conv's input (Mimi's decoder), as one fused function."""
    neg = relax.op.multiply(relax.const(np.float32(-1.0)),
                            relax.op.nn.relu(relax.op.subtract(relax.const(np.float32(1.0)),
                                                               relax.op.exp(x))))
    return relax.op.nn.pad(relax.op.add(relax.op.nn.relu(x), neg), [0, 0, 0, 0, 2, 0])


def test_a_padding_of_what_was_computed_is_decomposed():
    """A padding whose inside is computed (the activation inlined into it) is a fill and
    a copy of the inside too: tested per element, the bounds test kept the exp from
    vectorizing (Mimi's ELU before its causal convs: 7 ms of a 68 ms run). Numerics
    against TVM's default build."""
    mod = _one_op_module((1, 16, 301), _elu_then_pad)
    names, kinds = _scheduled_func(mod, fallback.Injective())
    assert any(n.endswith("_pad_const") for n in names), names
    assert int(tirx.ForKind.VECTORIZED) in kinds
    xs = _inputs(mod, None, np.random.default_rng(2))
    ref = tirbyoc.run(tvm.compile(mod, target="llvm"), *xs)
    np.testing.assert_allclose(tirbyoc.run(tirbyoc.compile(mod), *xs), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("hw", [(28, 28), (17, 9)])
def test_a_padding_read_by_several_taps_stays_its_own_loop_nest(hw):
    """Injective keeps a padding that several blocks read (inlined, each of the nine reads
    would test the bounds, and the sum would not vectorize), decomposed into a fill and a
    copy of the inside; numerics against TVM's default build."""
    mod = _one_op_module((1, 16, *hw), _padded_taps)
    names, kinds = _scheduled_func(mod, fallback.Injective())
    assert any(n.startswith("PadInput") and n.endswith("_pad_const") for n in names), names
    assert int(tirx.ForKind.VECTORIZED) in kinds
    xs = _inputs(mod, None, np.random.default_rng(1))
    ref = tirbyoc.run(tvm.compile(mod, target="llvm"), *xs)
    np.testing.assert_allclose(tirbyoc.run(tirbyoc.compile(mod), *xs), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape, parallel", [((1, 1152, 7, 7), False),
                                             ((1, 32, 112, 112), True), ((2, 512, 64), True)])
def test_small_elementwise_functions_stay_on_the_calling_thread(shape, parallel):
    """An elementwise function over fewer than fallback.PARALLEL_MIN_ELEMENTS elements is
    vectorized on the calling thread (waking TVM's worker costs more: EfficientNet-B0's
    squeeze-and-excitation products over [1152, 7 x 7]), a larger one also parallel."""
    names, kinds = _scheduled_func(_one_op_module(shape, lambda x: relax.op.multiply(x, x)),
                                   fallback.Injective())
    assert int(tirx.ForKind.VECTORIZED) in kinds
    assert (int(tirx.ForKind.PARALLEL) in kinds) == parallel, kinds


@pytest.mark.parametrize("extent,lanes", [(64, 16), (28, 14), (56, 14), (40, 10), (58, 16),
                                          (17, 16)])
def test_lanes_avoid_a_partial_last_vector(extent, lanes):
    assert fallback._lanes(extent) == lanes


@pytest.mark.parametrize("row", [17, 49, 58, 197])
def test_a_row_without_a_lane_divisor_runs_whole_vectors_then_a_scalar_tail(row):
    """A static row length that no lane count from 8 to 16 divides (Swin's 7 x 7 windows:
    49; ViT's 197 tokens), here an attention bias broadcast over the windows: the row is
    partitioned into whole 16-lane vectors with no lane predicate and a scalar loop over
    the row % 16 left, instead of one predicated (so scalarized) vector loop; the values
    are numpy's, bit for bit."""
    windows, heads = 4, 3
    bias = np.random.default_rng(row).standard_normal((1, heads, row, row)).astype(np.float32)
    mod = _one_op_module((windows * heads, row, row), lambda x: relax.op.add(
        relax.op.reshape(x, (windows, heads, row, row)), relax.const(bias)))
    sch = _schedule(mod, fallback.Injective())
    loops, predicated = [], _predicated(sch)
    tvm_ffi.structural_walk(sch.mod["main"], [(tirx.For, loops.append)])
    vectorized = [int(f.extent) for f in loops if int(f.kind) == int(tirx.ForKind.VECTORIZED)]
    serial = [int(f.extent) for f in loops if int(f.kind) == int(tirx.ForKind.SERIAL)]
    assert vectorized == [16] and not predicated, sch.mod["main"]
    assert row // 16 in serial and row % 16 in serial, sch.mod["main"]
    x = np.random.default_rng(row + 1).standard_normal((windows * heads, row, row))
    x = x.astype(np.float32)
    np.testing.assert_array_equal(tirbyoc.run(tirbyoc.compile(mod), x),
                                  x.reshape(windows, heads, row, row) + bias)


def test_blocks_beside_a_kernel_call_are_scheduled():
    """Llama's SwiGLU: ``silu(x @ Wg) * up``: the kernel takes the product and the SiLU,
    the multiply by ``up`` stays in the same PrimFunc and is scheduled there (parallel,
    vectorized), not left as a naive loop; numerics against numpy."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((96, 512)).astype(np.float32) * 0.1
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((128, 96), "float32"))
    up = relax.Var("up", relax.TensorType((128, 512), "float32"))
    with bb.function("main", [x, up]):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(x, relax.const(w)))
            out = bb.emit_output(bb.emit(relax.op.multiply(relax.op.nn.silu(h), up)))
        bb.emit_func_output(out)
    mod = bb.get()
    report = tirbyoc.explain(mod)
    (fused,) = [n for n in report.schedules if "multiply" in n]
    assert report.schedules[fused].startswith("kernel ")
    assert "1 other block(s) scheduled beside it" in report.schedules[fused]
    offloaded = tirbyoc.apply_tir_byoc(mod, fuse=True)
    text = offloaded[fused].script()
    assert "T.parallel" in text and "T.vectorized" in text
    xs = rng.standard_normal((128, 96)).astype(np.float32)
    us = rng.standard_normal((128, 512)).astype(np.float32)
    h = xs.astype(np.float64) @ w
    ref = h / (1 + np.exp(-h)) * us
    assert_close(tirbyoc.run(tirbyoc.compile(mod), xs, us), ref)


def test_steps_beside_a_kernel_call_run_as_one_loop():
    """ImageGPT's quick GELU after a dense, ``h * sigmoid(1.702 h)``: the kernel takes the
    product and its bias, and the three elementwise steps beside it run as one loop
    nest (each inlined into the next), not three passes over the rows; numerics against
    numpy."""
    rng = np.random.default_rng(6)
    w = rng.standard_normal((64, 256)).astype(np.float32) * 0.1
    b = rng.standard_normal(256).astype(np.float32)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((96, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.add(relax.op.matmul(x, relax.const(w)), relax.const(b)))
            gate = relax.op.sigmoid(relax.op.multiply(h, relax.const(np.float32(1.702))))
            out = bb.emit_output(bb.emit(relax.op.multiply(h, gate)))
        bb.emit_func_output(out)
    mod = bb.get()
    offloaded = tirbyoc.apply_tir_byoc(mod, fuse=True)
    (fused,) = [f for _, f in offloaded.functions_items()
                if isinstance(f, tirx.PrimFunc) and tirbyoc.offloaded_kernels(f)]
    blocks = []
    tvm_ffi.structural_walk(fused, [(tvm.s_tir.SBlock, blocks.append)])
    beside = [b.name_hint for b in blocks
              if b.name_hint != "root" and "tirbyoc.offloaded" not in b.annotations]
    assert len(beside) == 1, fused
    xs = rng.standard_normal((96, 64)).astype(np.float32)
    hs = xs.astype(np.float64) @ w + b
    assert_close(tirbyoc.run(tirbyoc.compile(mod), xs), hs / (1 + np.exp(-1.702 * hs)))


@pytest.mark.parametrize("batch, groups", [(1, 1), (2, 1), (2, 4)])
def test_group_norm_sums_each_group_once(batch, groups):
    """A group norm's sums are per group and its output rows per channel: each sum runs in
    a loop nest of its own (over the groups, lanes of partial sums), not under the
    output's channel loop, where it would be computed again for every channel of its
    group (PoolFormer's one-group norm took 7 ms); the values within 1e-5 of PyTorch."""
    torch = pytest.importorskip("torch")
    shape = (batch, 32, 14, 14)
    rng = np.random.default_rng(groups)
    gamma, beta = (rng.standard_normal(32).astype(np.float32) for _ in range(2))
    mod = _one_op_module(shape, lambda x: relax.op.nn.group_norm(
        x, relax.const(gamma), relax.const(beta), groups, 1, [2, 3], epsilon=1e-5))
    sch = _schedule(mod, fallback.RowReduction())
    assert sch is not None
    names = []
    tvm_ffi.structural_walk(sch.mod["main"],
                            [(tvm.s_tir.SBlock, lambda b: names.append(b.name_hint))])
    update = "x_red_temp_rf_update" if "x_red_temp_rf_update" in names else "x_red_temp"
    runs = 1
    for loop in sch.get_loops(sch.get_sblock(update)):
        runs *= int(sch.get(loop).extent)
    assert runs == int(np.prod(shape)), (runs, sch.mod["main"])  # each element summed once
    x = rng.standard_normal(shape).astype(np.float32) * 3 + 1
    ref = torch.nn.functional.group_norm(torch.from_numpy(x), groups, torch.from_numpy(gamma),
                                         torch.from_numpy(beta), 1e-5).numpy()
    np.testing.assert_allclose(tirbyoc.run(tirbyoc.compile(mod), x), ref, rtol=1e-5,
                               atol=1e-5 * np.abs(ref).max())


def test_nan_propagating_extremes_leave_a_reductions_combiner():
    """``nan_propagating_extremes`` writes the relu's max as a NaN-keeping select and
    leaves the row max's combiner ``acc = max(acc, x)`` (the reduction rules read that
    form: a NaN in a Relax ``max`` is still skipped; PyTorch's ``amax`` and ``max(dim)``
    add their own NaN test, ``fixups.nan_propagating``); a max with -inf is its other
    operand. The module still builds and computes."""
    def build(x):
        return relax.op.max(relax.op.maximum(relax.op.nn.relu(x), relax.const(-np.inf)),
                            axis=1)

    mod = relax.transform.LegalizeOps()(_one_op_module((4, 8), build))
    found = {"max": 0, "select": 0, "-inf": 0}

    def count(key):
        return lambda e: found.__setitem__(key, found[key] + 1)

    for _, func in mod.functions_items():
        if isinstance(func, tirx.PrimFunc):
            tvm_ffi.structural_walk(fallback.nan_propagating_extremes(func), [
                (tirx.Max, count("max")), (tirx.Select, count("select")),
                (tirx.FloatImm, lambda c: float(c.value) == -np.inf and count("-inf")(c))])
    assert found == {"max": 1, "select": 1, "-inf": 0}  # the combiner; the relu
    x = np.full((4, 8), -1.0, np.float32)
    x[2, 0] = 5.0
    got = tirbyoc.run(tirbyoc.compile(_one_op_module((4, 8), build)), x)
    np.testing.assert_array_equal(got, [0.0, 0.0, 5.0, 0.0])


@pytest.mark.parametrize("h, c, to_nchw, inner", [
    (56, 96, True, (8, 8)), (14, 384, True, (8, 4)), (7, 768, True, None), (3, 5, True, None),
    (56, 96, False, (8, 8)), (14, 384, False, (4, 8)), (7, 768, False, None),
    (3, 5, False, None)])
def test_a_transpose_runs_in_tiles(h, c, to_nchw, inner):
    """A permute between channels last and first (ConvNeXt's, around each depthwise conv,
    back to channels first with the residual added): tiles of the input's last axis by the
    output's, the output's vectorized (``inner``: the two tile sides, the vectorized one
    second; 14 x 14 pixels joined to 196, in 4s) with no lane predicate; the plain
    schedule (the output's last axis vectorized) where no tile divides both. The values
    are numpy's, bit for bit."""
    rng = np.random.default_rng(h * c)
    if to_nchw:
        res = rng.standard_normal((1, c, h, h)).astype(np.float32)
        mod = _one_op_module((1, h, h, c), lambda x: relax.op.add(
            relax.op.permute_dims(x, [0, 3, 1, 2]), relax.const(res)))
        x = rng.standard_normal((1, h, h, c)).astype(np.float32)
        ref = x.transpose(0, 3, 1, 2) + res
    else:
        mod = _one_op_module((1, c, h, h), lambda x: relax.op.permute_dims(x, [0, 2, 3, 1]))
        x = rng.standard_normal((1, c, h, h)).astype(np.float32)
        ref = x.transpose(0, 2, 3, 1)
    sch = _schedule(mod, fallback.Injective())
    loops = []
    tvm_ffi.structural_walk(sch.mod["main"], [(tirx.For, loops.append)])
    vectorized = [int(f.extent) for f in loops if int(f.kind) == int(tirx.ForKind.VECTORIZED)]
    serial = [int(f.extent) for f in loops if int(f.kind) == int(tirx.ForKind.SERIAL)]
    assert not _predicated(sch), sch.mod["main"]
    if inner is None:
        assert len(vectorized) <= 1 and len(loops) <= 3, sch.mod["main"]
    else:
        assert vectorized == [inner[1]] and inner[0] in serial, sch.mod["main"]
    np.testing.assert_array_equal(tirbyoc.run(tirbyoc.compile(mod), x), ref)


def test_only_a_transpose_is_tiled():
    """An elementwise op, a broadcast along the last axis and a reshape keep the plain
    schedule (no block but a transpose has an input read across its output's rows)."""
    shape = (1, 64, 16, 16)
    for build in (lambda x: relax.op.multiply(x, x),
                  lambda x: relax.op.add(x, relax.const(np.ones((16,), np.float32))),
                  lambda x: relax.op.reshape(x, (1, 64, 256))):
        func = next(f for _, f in _legalized(_one_op_module(shape, build)).functions_items()
                    if isinstance(f, tirx.PrimFunc))
        blocks = []
        tvm_ffi.structural_walk(func, [(tvm.s_tir.SBlock, lambda b: blocks.append(b)
                                        if b.name_hint != "root" else None)])
        assert blocks and all(fallback._transposed_axes(b, len(b.iter_vars)) is None
                              for b in blocks)


@pytest.mark.parametrize("length", [203, 3199])
def test_a_transpose_to_a_length_no_tile_divides_runs_in_tiles(length):
    """A speech model's features [1, T, C] to [1, C, T] with T = 3199 (no tile divides
    it: read in place, 5.0 ms on 2 Zen 3 threads against 0.8 tiled): the whole tiles
    vectorized with no lane predicate, the partial last one apart, with an exp in the
    same function too. The values are numpy's, bit for bit (the exp within 3e-7)."""
    rng = np.random.default_rng(length)
    x = rng.standard_normal((1, length, 64)).astype(np.float32)
    for math in (False, True):
        def build(v, math=math):
            t = relax.op.permute_dims(v, [0, 2, 1])
            return relax.op.exp(t) if math else relax.op.add(t, relax.const(1.0))

        mod = _one_op_module(x.shape, build)
        sch = _schedule(mod, fallback.Injective())
        loops = []
        tvm_ffi.structural_walk(sch.mod["main"], [(tirx.For, loops.append)])
        vectorized = [int(f.extent) for f in loops
                      if int(f.kind) == int(tirx.ForKind.VECTORIZED)]
        assert not _predicated(sch), sch.mod["main"]
        # one vector loop, of a tile's side
        assert vectorized == [fallback.TRANSPOSE_TILES[0]], sch.mod["main"]
        got = tirbyoc.run(tirbyoc.compile(mod), x)
        if math:
            np.testing.assert_allclose(got, np.exp(x.transpose(0, 2, 1)), rtol=3e-7)
        else:
            np.testing.assert_array_equal(got, x.transpose(0, 2, 1) + 1.0)
