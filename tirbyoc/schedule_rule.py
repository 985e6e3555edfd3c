"""tirbyoc's offload as an ``s_tir.dlight`` schedule rule.

    import tvm.s_tir.dlight as dl
    with target:
        mod = dl.ApplyDefaultSchedule(tirbyoc.ScheduleRule(), dl.cpu.GEMV())(mod)

``apply`` returns a Schedule of the PrimFunc with its matched regions offloaded, or
``None`` when nothing matched (the next rule then schedules the function). The trace
records one ``annotate`` per kernel block, naming the intrinsic, the blocks it replaced
and the kernel. ``apply_tir_byoc`` runs this same rule on every PrimFunc.
"""

from __future__ import annotations

from . import _tvm as T
from . import weights
from .matcher import match_func
from .normalize import normalize
from .rewrite import block_name, rewrite_func

TRACE_ATTR = "tirbyoc.offloaded"


def registry(intrinsics=None) -> list:
    """The intrinsics to match, in order (default: the built-in library's, from its
    declarations: ``tirbyoc.builtin``)."""
    if intrinsics is not None:
        return list(intrinsics)
    return builtin_intrinsics()


def builtin_intrinsics() -> list:
    """The TIR matcher's intrinsics of the built-in library's declared kernels, in the
    order they are declared (each once)."""
    from .builtin import builtin
    from .intrinsic import Intrinsic

    out = []
    for kernel in builtin.kernels:
        if isinstance(kernel.matcher, Intrinsic) and \
                not any(kernel.matcher is i for i in out):
            out.append(kernel.matcher)
    return out


class ScheduleRule(T.DlightScheduleRule):
    """Offload matched dense(+bias)(+relu) regions of a PrimFunc to the kernel library."""

    def __init__(self, intrinsics=None):
        self.intrinsics = registry(intrinsics)

    def apply(self, func, target=None, tunable=False):  # noqa: ARG002 (dlight's signature)
        """A Schedule with the matched regions offloaded, or None when nothing matched."""
        return self.offload(func)[0]

    def offload(self, func, sources=None, passes=None):
        """``(schedule or None, results)``; ``results`` lists ``(nest, Region | NoMatch)``
        for every candidate block. ``sources``/``passes``: see ``tirbyoc.weights``
        (default: its ``DEFAULT_PASSES``)."""
        normal = normalize(func)
        if normal.reason:
            return None, []
        passes = weights.DEFAULT_PASSES if passes is None else passes
        results = match_func(normal, self.intrinsics, sources, passes)
        regions = [r for _, r in results if r]
        if not regions:
            return None, results
        sch = T.Schedule(rewrite_func(normal, regions))
        for region in regions:
            block = sch.get_sblock(block_name(region))
            sch.annotate(block, TRACE_ATTR,
                         f"{' + '.join(n.name for n in region.nests)} -> {region.symbol}")
        return sch, results
