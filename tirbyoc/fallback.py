"""CPU schedules for what tirbyoc does not offload, so that nothing runs unscheduled.

TVM's default CPU pipeline legalizes and fuses but schedules nothing: every PrimFunc
runs as its naive, single-threaded loop nest. ``tirbyoc.pipeline`` (and so
``tirbyoc.compile``) applies, after offloading, these ``s_tir.dlight`` rules in order to
every PrimFunc that is not scheduled yet (offloaded ones are):

    dl.cpu.GEMV()        matrix-vector products (TVM's)
    dl.cpu.Reduction()   row reductions with elementwise steps: softmax, layer norm (TVM's)
    Injective()          elementwise / layout ops: parallel outer loops, vectorized inner
    OuterParallel()      any other function: each block's leading spatial loops in parallel

A function no rule takes stays as it was; ``schedule_rules()`` is the list.
"""

from __future__ import annotations

from . import _tvm as T

# Below this many iterations of the outer loops the parallel launch costs more than it
# saves: the loop stays on the calling thread.
PARALLEL_MIN_ITERS = 64
# Vector lanes of the inner loop (16 floats: one AVX-512 register, two AVX2 registers).
VECTOR_LANES = 16


class Injective(T.DlightScheduleRule):
    """Elementwise and layout PrimFuncs (every block spatial): intermediate blocks inlined,
    the outer loops fused and run in parallel, the innermost loop vectorized."""

    def apply(self, func, target, tunable=False):  # noqa: ARG002 (dlight's signature)
        if not isinstance(func, T.PrimFunc) or target is None or target.kind.name != "llvm":
            return None
        if _has_reduction(func):
            return None
        sch = T.Schedule(func)
        blocks = T.dlight_blocks(sch)
        if not blocks or not all(b.is_injective() for b in blocks):
            return None
        for block in T.dlight_try_inline(sch, blocks):
            self._schedule_block(sch, block.block_rv)
        return sch

    @staticmethod
    def _schedule_block(sch, block_rv):
        loops = sch.get_loops(block_rv)
        if not loops:
            return
        inner = loops[-1]
        extent = T.dlight_extent(sch, inner)
        if not isinstance(extent, int) or extent > VECTOR_LANES:
            _, lanes = sch.split(inner, [None, VECTOR_LANES])
            sch.vectorize(lanes)
        elif extent > 1:
            sch.vectorize(inner)
        if len(loops) > 1:
            outer = sch.fuse(*loops[:-1])
            iters = T.dlight_extent(sch, outer)
            if not isinstance(iters, int) or iters >= PARALLEL_MIN_ITERS:
                sch.parallel(outer)


class OuterParallel(T.DlightScheduleRule):
    """The last resort, for reductions no other rule takes (e.g. an int8 max over a mask):
    in each block, the leading spatial loops are fused and run in parallel. Only spatial
    loops are split over threads, so every reduction stays in one thread's order."""

    def apply(self, func, target, tunable=False):  # noqa: ARG002 (dlight's signature)
        if not isinstance(func, T.PrimFunc) or target is None or target.kind.name != "llvm":
            return None
        sch = T.Schedule(func)
        blocks = T.dlight_blocks(sch)
        if not blocks:
            return None
        changed = False
        for block in blocks:
            lead = []
            for it in block.iters:
                if it.kind != "S":
                    break
                lead.append(it.loop_rv)
            if not lead:
                continue
            loops = sch.get_loops(block.block_rv)
            if [sch.get(x) for x in loops[:len(lead)]] != [sch.get(x) for x in lead]:
                return None  # not the outermost loops: leave the function alone
            outer = sch.fuse(*lead) if len(lead) > 1 else lead[0]
            iters = T.dlight_extent(sch, outer)
            if not isinstance(iters, int) or iters >= PARALLEL_MIN_ITERS:
                sch.parallel(outer)
                changed = True
        return sch if changed else None


def _has_reduction(func) -> bool:
    """Whether any block reduces (a reduction iterator or an init), whatever its extent."""
    # NOTE: dlight's block analysis calls a reduction over an extent of 1 spatial, and
    # inlining or vectorizing such a block as elementwise gave wrong results (found by the
    # matcher fuzzer: a [.., M, 1] x [.., 1, N] matmul).
    found = []

    def visit(block):
        if block.init is not None or any(iv.iter_type == T.COMM_REDUCE for iv in block.iter_vars):
            found.append(block)

    T.structural_walk(func.body, [(T.SBlock, visit)], order="pre")
    return bool(found)


def schedule_rules() -> list:
    """The rules ``tirbyoc.pipeline`` applies after offloading, in order."""
    return [T.dlight_cpu_gemv(), T.dlight_cpu_reduction(), Injective(), OuterParallel()]


def _rule_name(rule) -> str:
    name = type(rule).__name__
    return f"tirbyoc {name}" if isinstance(rule, (Injective, OuterParallel)) else f"dlight cpu.{name}"


def describe(func, target) -> str:
    """How one PrimFunc will run in ``tirbyoc.pipeline``: its kernels, the fallback rule
    that schedules it, or "unscheduled" and why. Cheap: rules are tried, nothing is built.
    """
    from .normalize import normalize

    normal = normalize(func)
    kernels = [n.offloaded_kernel for n in normal.nests if n.offloaded_kernel]
    if kernels:
        rest = [n for n in normal.nests if not n.offloaded_kernel]
        text = "kernel " + ", ".join(kernels)
        if rest:
            text += (f"; {len(rest)} other block(s) run as written (unscheduled: a function "
                     "with a kernel call is not given to the fallback rules)")
        return text
    if func.attrs and "tirx.is_scheduled" in func.attrs:
        return "already scheduled"
    target = T.as_target(target or "llvm")
    with target:
        for rule in schedule_rules():
            try:
                taken = rule.apply(func, target, False)
            except Exception:  # noqa: BLE001 (a rule that fails on a function does not take it)
                taken = None
            if taken is not None:
                return f"schedule: {_rule_name(rule)}"
    if _has_reduction(func):
        return "unscheduled: a reduction no fallback rule takes (not a GEMV or a row reduction)"
    return "unscheduled: no fallback rule takes its blocks"


def describe_schedules(mod, target=None) -> dict:
    """``{PrimFunc name: how it runs}`` for every PrimFunc of ``mod`` (see ``describe``)."""
    return {gv.name_hint: describe(f, target) for gv, f in mod.functions_items()
            if isinstance(f, T.PrimFunc)}
