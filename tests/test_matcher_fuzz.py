"""Differential fuzzing of the matcher: tirbyoc's build against TVM's own, case by case.

Every case of ``tests/fuzz_forms.py`` (a dense layer or a dense look-alike, TIR or Relax)
is built by ``tirbyoc.compile`` and by ``tvm.compile(mod, target=TARGET)``, run on the same
inputs (normal values with NaN, +-Inf and exact zeros sprinkled in; no huge finite values,
so no summation order can overflow where another does not), and every array the function
writes or returns is compared. Cases are batched: one IRModule per batch and path.

A case fails when

* a result differs (rtol 1e-4, 2 eps for float16 results; atol rtol times max(1, the
  largest finite |value| of TVM's result); NaN where NaN, the same infinities). One
  documented exception: tirbyoc's max and min propagate NaN (like PyTorch and ONNX),
  the kernels' relu/relu6/hardswish/hardsigmoid and, outside the kernels,
  ``fallback.nan_propagating_extremes``, where TVM's ``max(x, 0)`` / select give 0 (a
  clamp's bound). A position where tirbyoc gives NaN and TVM does not is accepted only
  when the case's *twin* gives NaN there too: the same program, built by TVM alone,
  with the offloaded steps rewritten as ``select(isnan(x), x, relu(x))`` and every
  other float max and min made NaN-propagating by that pass;
* an accepted form was not offloaded exactly as expected (``MissedMatch``), or a
  look-alike was offloaded beyond its valid prefix (``FalseMatch``, also raised for a
  wrong answer of an offloaded case);
* tirbyoc raised on a module TVM builds (``TirbyocError``).

``TIRBYOC_MATCHER_FUZZ_CASES`` / ``TIRBYOC_MATCHER_FUZZ_SEED`` set the length and seed of
the main run (default 240 random cases, seed 0). Each variant the random cases did not
draw gets one case of its own after them (a run draws all 88 variants only after 400 to
more than 800 cases), so every run covers the whole table. Reproduce one case with
``python -m tests.fuzz_forms SEED INDEX`` (``SEED INDEX VARIANT`` for the added ones);
run with ``-s`` to see the summary table.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import time

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.script import tirx as T

import tirbyoc
from tirbyoc.normalize import INTRINSIC_ATTR, normalize
from tirbyoc.tuning import cheap_inspect_stack

from . import fuzz_forms as G

RTOL = 1e-4
TIR_BATCH, RELAX_BATCH = 100, 50
CASES = int(os.environ.get("TIRBYOC_MATCHER_FUZZ_CASES", "240"))
SEED = int(os.environ.get("TIRBYOC_MATCHER_FUZZ_SEED", "0"))
# NOTE: LLVM at -O0 for both builds: it compiles about 5x faster than the default -O2,
# and LLVM's optimization level plays no part in what is matched or in the kernels.
# TIRBYOC_MATCHER_FUZZ_TARGET=llvm runs with TVM's default target instead.
TARGET = tvm.target.Target(os.environ.get("TIRBYOC_MATCHER_FUZZ_TARGET") or
                           {"kind": "llvm", "opt-level": 0})


class FuzzFailure(AssertionError):
    """A case whose tirbyoc build is wrong in some way."""


class FalseMatch(FuzzFailure):
    """Offloaded beyond the valid prefix, or an offloaded case computed a wrong answer."""


class MissedMatch(FuzzFailure):
    """An accepted form that was not offloaded exactly as expected."""


class TirbyocError(FuzzFailure):
    """tirbyoc raised on a module that TVM builds."""


class Mismatch(FuzzFailure):
    """Results differ although nothing was offloaded (TVM's code both times)."""


@dataclasses.dataclass
class Outcome:
    case: G.Case
    got: tuple = ()  # offloaded intrinsic per layer (None: that layer stays TIR)
    problems: list = dataclasses.field(default_factory=list)  # (FuzzFailure class, text)
    nan_relu: int = 0  # positions accepted by the relu NaN exception
    twin: bool = False  # needs its twin to judge NaN positions
    pending: dict = dataclasses.field(default_factory=dict)  # array index -> positions

    @property
    def offloaded(self) -> bool:
        return any(g is not None for g in self.got)

    def fail(self, cls, text):
        self.problems.append((cls, text))


# ------------------------------------------------------------------- comparing results


def compare(got: np.ndarray, ref: np.ndarray):
    """Positions where ``got`` (tirbyoc) differs from ``ref`` (TVM): a boolean array."""
    # NOTE: a float16 result (a cast after the offloaded prefix) may round a 1e-7
    # difference of the float32 values to one float16 step: never less than 2 eps.
    rtol = max(RTOL, 2 * float(np.finfo(ref.dtype).eps))
    g, r = got.astype(np.float64), ref.astype(np.float64)
    finite = np.isfinite(r)
    scale = max(1.0, float(np.abs(r[finite]).max())) if finite.any() else 1.0
    with np.errstate(invalid="ignore"):
        close = np.abs(g - r) <= rtol * scale + rtol * np.abs(r)
    same_special = (np.isnan(g) & np.isnan(r)) | (np.isinf(r) & (g == r))
    return ~np.where(np.isfinite(r) & np.isfinite(g), close, same_special)


def nan_exception_candidates(got, ref, bad):
    """Of the differing positions, those the relu NaN exception may excuse."""
    return bad & np.isnan(got.astype(np.float64)) & ~np.isnan(ref.astype(np.float64))


def _kinds(intrinsic) -> tuple:
    return G.kinds_of(intrinsic) if intrinsic else ()


def _layer_order(x):
    return (x is not None, x or "")


def check_expectation(out: Outcome):
    """Offloaded per layer vs ``case.expected`` (exactly for accepted forms)."""
    c = out.case
    if len(out.got) > len(c.expected):
        out.fail(FalseMatch, f"{len(out.got)} kernel calls for {len(c.expected)} dense layers: "
                             f"{out.got}")
    expected, got = c.expected, tuple(G.same_family(g) for g in out.got)
    if c.kind == "relax":  # the layers of a Relax function come in no particular order
        got = tuple(got) + (None,) * (len(expected) - len(got))
        expected, got = sorted(expected, key=_layer_order), sorted(got, key=_layer_order)
    for layer, (want, got) in enumerate(zip(expected, got)):
        allowed = {want} if c.accept else ({None} | (G.prefixes(want) if want else set()))
        if got in allowed:
            continue
        shorter = got is None or (want is not None and got in G.prefixes(want))
        cls = MissedMatch if shorter else FalseMatch
        out.fail(cls, f"layer {layer}: offloaded {got or 'nothing'}, expected "
                      f"{'exactly ' if c.accept else 'at most '}{want or 'nothing'}")


# ------------------------------------------------------------------- inputs


def _aligned(shape, dtype):
    """A 64-byte aligned array (TVM's generated code may assume aligned buffers)."""
    n, item = int(np.prod(shape, dtype=np.int64)), np.dtype(dtype).itemsize
    raw = np.empty(n + 64 // item, dtype)
    off = (-raw.ctypes.data % 64) // item
    return raw[off:off + n].reshape(shape)


def make_inputs(c: G.Case) -> list:
    """Fresh base arrays for ``c``'s args (outputs start with a finite pattern)."""
    rng = np.random.default_rng([c.seed, c.index, 1])
    bases = []
    for a in c.args:
        base = _aligned(a.shape, a.dtype)
        base[...] = G.values(rng, a.shape, a.dtype, 0.0 if a.out else c.special)
        bases.append(base)
    return bases


def _tir_call(func, c: G.Case, bases):
    args = [tvm_ffi.from_dlpack(b if a.view is None else b[a.view]) for a, b in zip(c.args, bases)]
    func(*args)
    return bases


def _relax_call(vm, c: G.Case, bases):
    res = vm[c.name](*[tvm.runtime.tensor(b) for b in bases])
    return [res.numpy()] if hasattr(res, "numpy") else [r.numpy() for r in res]


# ------------------------------------------------------------------- building


def _parse(c: G.Case, nanprop=()):
    with cheap_inspect_stack():  # (otherwise 45% of the run's time)
        f = tvm.script.from_source(c.source(nanprop), extra_vars={"T": T})
    return f.with_attr("global_symbol", c.name)


def _relax_module(cases, nanprop=None):
    bb = relax.BlockBuilder()
    for c in cases:
        args = G.relax_function(c.spec, c.name, bb, G.constant_maker(c),
                                nanprop=bool(nanprop and nanprop[c.index]))
        c.args = c.args or args
    return bb.get()


def _tir_module(cases, funcs):
    return tvm.IRModule({c.name: funcs[c.index] for c in cases})


def _brief(exc) -> str:
    lines = str(exc).strip().splitlines() or [""]
    return f"{type(exc).__name__}: {lines[-1][:300]}"


def _isolated(cases, build, outcomes, cls, what):
    """``build(cases)``; when it raises, find the cases that fail alone, record them as
    ``cls`` problems, and build the rest. Returns ``(result, cases built)``."""
    try:
        return build(cases), cases
    except Exception:  # noqa: BLE001 (any failure is attributed to its cases below)
        good = []
        for c in cases:
            try:
                build([c])
                good.append(c)
            except Exception as exc:  # noqa: BLE001
                outcomes[c.index].fail(cls, f"{what} raised {_brief(exc)}")
        return (build(good) if good else None), good


def _tir_offloaded(func, layers: int) -> tuple:
    done = {}
    for nest in normalize(func).nests:
        if nest.offloaded_kernel:
            intr = str(nest.block.annotations[INTRINSIC_ATTR])
            done[nest.name[len(f"tirbyoc_{intr}_"):]] = intr
    return tuple(done.pop(name, None) for name in ["mm", "mm_2"][:layers]) + tuple(done.values())


def _relax_offloaded(mod, name: str) -> tuple:
    call_tir = tvm.ir.Op.get("relax.call_tir")
    found = []
    for value in relax.analysis.get_var2val(mod[name]).values():
        if isinstance(value, relax.Call) and value.op.same_as(call_tir):
            callee = mod[value.args[0]]
            found += [str(n.block.annotations[INTRINSIC_ATTR]) for n in normalize(callee).nests
                      if n.offloaded_kernel]
    return tuple(found)


def _run_batch(cases, outcomes, intrinsics=None):
    """Build, run and compare one batch of cases of the same kind."""
    kind = cases[0].kind
    if kind == "tir":
        funcs = {c.index: _parse(c) for c in cases}

        def module(cs):
            return _tir_module(cs, funcs)
    else:
        _relax_module(cases)  # fills in the args

        def module(cs):
            return _relax_module(cs)
    ref, cases = _isolated(cases, lambda cs: tvm.compile(module(cs), target=TARGET), outcomes,
                           FuzzFailure, "TVM's own build (a generator bug)")
    if not cases:
        return
    applied, cases = _isolated(cases, lambda cs: tirbyoc.apply_tir_byoc(
        module(cs), intrinsics=intrinsics), outcomes, TirbyocError, "apply_tir_byoc")
    if not cases:
        return
    for c in cases:
        o = outcomes[c.index]
        o.got = _tir_offloaded(applied[c.name], len(c.expected)) if kind == "tir" \
            else _relax_offloaded(applied, c.name)
        check_expectation(o)
    ex, built = _isolated(cases, lambda cs: tirbyoc.compile(module(cs), TARGET,
                                                            intrinsics=intrinsics),
                          outcomes, TirbyocError, "tirbyoc.compile")
    if not built:
        return
    if built != cases:  # the reference executable must hold exactly the same functions
        ref = tvm.compile(module(built), target=TARGET)
    if kind == "relax":
        ex, ref = relax.VirtualMachine(ex, tvm.cpu()), relax.VirtualMachine(ref, tvm.cpu())
    call = _tir_call if kind == "tir" else _relax_call
    for c in built:
        o = outcomes[c.index]
        results = []
        for side in (ref, ex):
            try:
                results.append(call(side[c.name] if kind == "tir" else side, c, make_inputs(c)))
            except Exception as exc:  # noqa: BLE001
                results.append(None)
                o.fail(TirbyocError if side is ex else FuzzFailure,
                       f"{'tirbyoc' if side is ex else 'TVM'}'s build raised at run time: "
                       f"{_brief(exc)}")
        if None in results:
            continue
        for i, (r, t) in enumerate(zip(*results)):
            bad = compare(t, r)
            if not bad.any():
                continue
            excusable = nan_exception_candidates(t, r, bad)
            if (excusable == bad).all():
                o.twin = True
                o.pending[i] = bad
            else:
                _numeric_failure(o, i, t, r, bad)
    _judge_twins([outcomes[c.index] for c in built if outcomes[c.index].twin])


def _clamps_nan(got) -> bool:
    """Whether an offloaded region clamps (relu, relu6, hardswish, hardsigmoid): the
    kernels' clamps pass NaN, TVM's ``max`` / ``min`` of a NaN give the other operand."""
    return any(any(op in (g or "") for op in ("relu", "hardswish", "hardsigmoid"))
               for g in got)


def _numeric_failure(o: Outcome, i: int, got, ref, bad):
    pos = tuple(int(x) for x in np.argwhere(bad)[0])
    cls = FalseMatch if o.offloaded else Mismatch
    o.fail(cls, f"array {i} ({o.case.args[i].name if o.case.kind == 'tir' else 'result'}): "
                f"{int(bad.sum())} of {bad.size} differ, e.g. at {pos}: tirbyoc "
                f"{got[pos]!r} vs TVM {ref[pos]!r}")


def _nan_propagating(mod):
    """``mod`` with every PrimFunc's float max and min NaN-propagating, as tirbyoc builds
    what it does not offload."""
    from tirbyoc import fallback

    out = mod.clone()
    for gv, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc):
            out.update_func(gv, fallback.nan_propagating_extremes(func))
    return out


def _judge_twins(outs):
    """Build the twins of ``outs`` with TVM alone; NaN positions must be NaN there too."""
    if not outs:
        return
    # TIR: per layer, the number of epilogue steps the kernel took over; Relax: whether
    # the activation was offloaded (twins exist only for cases with an offloaded relu)
    nanprop = {o.case.index: tuple(len(_kinds(g)) for g in o.got) for o in outs}
    if outs[0].case.kind == "relax":
        nanprop = {i: _clamps_nan(o.got) for i, o in zip(nanprop, outs)}
    if outs[0].case.kind == "tir":
        mod = tvm.IRModule({o.case.name: _parse(o.case, nanprop[o.case.index]) for o in outs})
        ex = tvm.compile(_nan_propagating(mod), target=TARGET)
        twins = [_tir_call(ex[o.case.name], o.case, make_inputs(o.case)) for o in outs]
    else:
        mod = relax.transform.LegalizeOps()(_relax_module([o.case for o in outs], nanprop))
        vm = relax.VirtualMachine(tvm.compile(_nan_propagating(mod), target=TARGET),
                                  tvm.cpu())
        twins = [_relax_call(vm, o.case, make_inputs(o.case)) for o in outs]
    for o, twin in zip(outs, twins):
        for i, bad in o.pending.items():
            unexplained = bad & ~np.isnan(twin[i].astype(np.float64))
            if unexplained.any():
                pos = tuple(int(x) for x in np.argwhere(unexplained)[0])
                o.fail(FalseMatch, f"array {i}: tirbyoc gives NaN at {pos} where TVM gives a "
                                   "number and NaN-propagating clamps would not give NaN")
            else:
                o.nan_relu += int(bad.sum())


def run_cases(cases, intrinsics=None) -> list:
    """Outcomes of ``cases`` (each judged; see the module docstring)."""
    outcomes = {c.index: Outcome(c) for c in cases}
    for kind, size in (("tir", TIR_BATCH), ("relax", RELAX_BATCH)):
        todo = [c for c in cases if c.kind == kind]
        for i in range(0, len(todo), size):
            _run_batch(todo[i:i + size], outcomes, intrinsics)
    return [outcomes[c.index] for c in cases]


# ------------------------------------------------------------------- the summary


def summarize(outcomes) -> dict:
    rows = collections.defaultdict(lambda: collections.Counter())
    for o in outcomes:
        r = rows[o.case.variant]
        r["cases"] += 1
        r["offloaded" if o.offloaded else "refused"] += 1
        r["failures"] += bool(o.problems)
        r["nan_relu_positions"] += o.nan_relu
    total = collections.Counter()
    for r in rows.values():
        total.update(r)
    return {"variants": dict(sorted(rows.items())), "total": total}


def format_summary(summary, seconds, seed) -> str:
    cols = ("cases", "offloaded", "refused", "failures", "nan_relu_positions")
    width = max(len(v) for v in summary["variants"]) + 2
    lines = [f"matcher fuzz: seed {seed}, {seconds:.1f} s",
             "variant".ljust(width) + "".join(c.rjust(11) if c != cols[-1] else "  nan-relu"
                                              for c in cols)]
    for name, r in list(summary["variants"].items()) + [("TOTAL", summary["total"])]:
        lines.append(name.ljust(width) + "".join(str(r[c]).rjust(11 if c != cols[-1] else 10)
                                                 for c in cols))
    return "\n".join(lines)


def _failure_report(outcomes, limit=15) -> str:
    failed = [o for o in outcomes if o.problems]
    lines = [f"{len(failed)} failing cases"]
    for o in failed[:limit]:
        for cls, text in o.problems:
            lines.append(f"  [{cls.__name__}] {o.case.variant} (python -m tests.fuzz_forms "
                         f"{o.case.seed} {o.case.index}"
                         f"{' ' + o.case.variant if o.case.index >= CASES else ''}): {text}")
    return "\n".join(lines)


# ------------------------------------------------------------------- tests


def test_matcher_fuzz(record_property, request):
    """The main run: CASES random cases, then one case of each variant they missed."""
    start = time.perf_counter()
    cases = [G.case(SEED, index) for index in range(CASES)]
    drawn = {c.variant for c in cases}
    cases += [G.case(SEED, CASES + i, only=v.name)
              for i, v in enumerate(v for v in G.VARIANTS if v.name not in drawn)]
    outcomes = run_cases(cases)
    seconds = time.perf_counter() - start
    summary = summarize(outcomes)
    text = format_summary(summary, seconds, SEED)
    total = summary["total"]
    print("\n" + text)
    record_property("matcher_fuzz_summary", text)
    if _has_fixture(request, "report_lines"):  # the run's closing summary, where there is one
        request.getfixturevalue("report_lines").append(
            f"matcher fuzz (seed {SEED}): {total['cases']} cases, {total['offloaded']} "
            f"offloaded, {total['refused']} refused, {total['failures']} failures, "
            f"{total['nan_relu_positions']} relu NaN positions excused, {seconds:.0f} s")
    assert total["cases"] == len(cases) == total["offloaded"] + total["refused"]
    assert total["failures"] == 0, _failure_report(outcomes)
    accepted = {v.name for v in G.VARIANTS if v.accept}
    for name, r in summary["variants"].items():
        if name in accepted:
            assert r["offloaded"] == r["cases"], name
    # the figures above mean something only if the run covers the whole table
    assert set(summary["variants"]) == {v.name for v in G.VARIANTS}
    if CASES >= 240 and SEED == 0:
        assert total["offloaded"] > CASES // 4 and total["refused"] > CASES // 10
        assert total["nan_relu_positions"] > 0  # the exception is exercised, not just allowed


def _has_fixture(request, name) -> bool:
    """Whether a conftest provides ``name`` (the summary lines of the whole run)."""
    try:
        request.getfixturevalue(name)
    except pytest.FixtureLookupError:
        return False
    return True


def test_comparison_fails_on_wrong_values():
    ref = np.array([1.0, np.nan, np.inf, -np.inf, 0.0, 2.0], np.float32)
    assert not compare(ref.copy(), ref).any()
    assert compare(ref + np.float32(1e-3), ref)[[0, 5]].all()  # beyond 1e-4 of max(1, 2)
    assert not compare(ref + np.float32(1e-5), ref).any()
    half = np.array([5.56, 1.0], np.float16)
    assert not compare(np.array([5.562, 1.0], np.float16), half).any()  # one float16 step
    assert compare(np.array([5.6, 1.0], np.float16), half).tolist() == [True, False]
    for pos, value in ((0, np.nan), (1, 0.0), (2, -np.inf), (3, 1.0), (4, np.inf)):
        wrong = ref.copy()
        wrong[pos] = value
        assert compare(wrong, ref).nonzero()[0].tolist() == [pos]
    # only "tirbyoc NaN where TVM has a number" may be excused, never the other way round
    wrong = ref.copy()
    wrong[[0, 1]] = [np.nan, 3.0]
    bad = compare(wrong, ref)
    assert nan_exception_candidates(wrong, ref, bad).nonzero()[0].tolist() == [0]


def test_expectations_fail_both_ways():
    accepted = G.case(SEED, 0, only="accept/bias_relu")
    lookalike = G.case(SEED, 0, only="relu/max_x_c")
    assert accepted.expected == ("dense_bias_relu",) and lookalike.expected[0] in (
        "dense", "dense_bias")
    for c, got, cls in ((accepted, (None,), MissedMatch), (accepted, ("dense_bias",), MissedMatch),
                        (lookalike, ("dense_relu",), FalseMatch),
                        (lookalike, ("dense_bias_relu",), FalseMatch)):
        o = Outcome(c, got)
        check_expectation(o)
        assert [p[0] for p in o.problems] == [cls], (c.variant, got)
    for c, got in ((accepted, ("dense_bias_relu",)), (lookalike, (None,)),
                   (lookalike, lookalike.expected)):
        o = Outcome(c, got)
        check_expectation(o)
        assert not o.problems


def _sloppy_relu_intrinsics():
    """The registry with a relu step that takes max(x, c) for any constant c (a false match
    planted on purpose)."""
    from intrinsics import REGISTRY

    from tirbyoc import epilogues
    from tirbyoc.intrinsic import StepMatch

    def sloppy(ctx):
        v = ctx.value
        if isinstance(v, tvm.tirx.Max) and (ctx.is_input(v.a) or ctx.is_input(v.b)) and \
                epilogues.float_value(v.b if ctx.is_input(v.a) else v.a) is not None:
            return StepMatch()
        return epilogues.RELU.match(ctx)

    relu = dataclasses.replace(epilogues.RELU, match=sloppy)
    return [dataclasses.replace(i, epilogue=tuple(relu if s is epilogues.RELU else s
                                                  for s in i.epilogue)) for i in REGISTRY]


def test_fuzzer_catches_a_planted_false_match():
    cases = [G.case(SEED, i, only="relu/max_x_c") for i in range(6)]
    outcomes = run_cases(cases, intrinsics=_sloppy_relu_intrinsics())
    kinds = {cls for o in outcomes for cls, _ in o.problems}
    assert kinds == {FalseMatch}
    # every case offloaded the relu and got caught by its expectation; the ones whose
    # clamp changes a value also by their numbers
    assert all(o.problems for o in outcomes)
    assert any("differ" in t for o in outcomes for _, t in o.problems)
