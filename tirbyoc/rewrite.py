"""Rewrite matched regions of a PrimFunc into ``call_extern`` blocks.

Each region (a dense nest and the epilogue nests it fuses) becomes one opaque sblock,
placed where the region's last nest was, whose body checks the status the kernel
returned (an error raises a ``RuntimeError`` naming the kernel and the reason).
Intermediate buffers that only the region used are dropped; all other nests stay exactly
as they were.
"""

from __future__ import annotations

from . import _tvm as T
from .calls import status_checks
from .matcher import Region
from .normalize import INTRINSIC_ATTR, LIBRARY_ATTR, OFFLOADED_ATTR, NormalFunc


def block_name(region: Region) -> str:
    """The kernel block's name: ``tirbyoc_<intrinsic>_<first nest>`` (a declared
    kernel's: ``<library>_<symbol>_<first nest>``)."""
    intr = region.intrinsic
    head = f"tirbyoc_{intr.name}" if intr.builtin else f"{intr.library}_{intr.name}"
    return f"{head}_{region.dense.nest.name}"


def _kernel_block(region: Region):
    symbol, intr = region.symbol, region.intrinsic
    if intr.emit is not None:
        body = intr.emit(region)
    else:
        body = status_checks(symbol, T.call_extern("int32", symbol, intr.arguments(region)))
    inputs = [region.dense.a, region.weight] + [
        b for _, _, sm in region.steps for b in sm.captures.values()]
    block = T.make_block(
        block_name(region), body,
        reads=[T.full_region(b) for b in inputs], writes=[T.full_region(region.out)],
        annotations={OFFLOADED_ATTR: symbol, INTRINSIC_ATTR: intr.name,
                     **({} if intr.builtin else {LIBRARY_ATTR: intr.library})})
    return T.make_realize(block)


def rewrite_func(normal: NormalFunc, regions: list[Region]):
    """A new PrimFunc where every region is a kernel call; the input is not modified."""
    if not regions:
        return normal.func
    replace_at, drop = {}, set()
    for region in regions:
        idx = [n.index for n in region.nests]
        replace_at[max(idx)] = _kernel_block(region)
        drop.update(i for i in idx if i != max(idx))
    stmts, used = [], set()
    for nest in normal.nests:
        if nest.index in drop:
            continue
        if nest.index in replace_at:
            stmts.append(replace_at[nest.index])
            used.update(r.source for r in replace_at[nest.index].block.reads)
            used.update(w.source for w in replace_at[nest.index].block.writes)
        else:
            stmts.append(nest.stmt)
            used |= nest.reads | nest.writes
    root = normal.root
    allocs = [b for b in root.alloc_buffers if b in used]
    new_root = T.make_block(root.name_hint, T.seq(stmts), root.reads, root.writes,
                            root.annotations, root.iter_vars, root.init, allocs,
                            root.match_buffers)
    swaps = {old: route.param for region in regions for old, route in region.reroutes.items()}
    params = [swaps.get(p, p) for p in normal.func.params]
    old = normal.func.body
    return T.make_prim_func(normal.func, params, T.make_realize(new_root, old.iter_values,
                                                                old.predicate))
