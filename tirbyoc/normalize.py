"""Normalize a PrimFunc into a list of loop nests, one sblock each.

The matcher never looks at raw loops. It sees ``Nest`` records: the block, its iteration
variables marked spatial ("S") or reduction ("R") with their extents, the single buffer
store that is the block's body, and the buffers the block reads and writes. A top-level
statement that is not a perfect, unscheduled loop nest around one sblock becomes a
``Nest`` with ``reason`` set, so it can be reported, and it is never rewritten.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import _tvm as T

OFFLOADED_ATTR = "tirbyoc.kernel"
INTRINSIC_ATTR = "tirbyoc.intrinsic"
# The library of an offloaded block's kernel (absent: the built-in library, "tirbyoc").
LIBRARY_ATTR = "tirbyoc.library"
# What the region passes did to an offloaded region placed before legalization
# (a conv's: "batch norm folded into the weight and bias; weight packed ..."), for explain.
NOTES_ATTR = "tirbyoc.region_notes"


@dataclass(frozen=True)
class Iter:
    var: object
    kind: str  # "S" spatial, "R" reduction, "O" other
    extent: object


@dataclass
class Nest:
    """One top-level statement of a PrimFunc's root block."""

    index: int
    stmt: object
    block: object = None
    iters: list = field(default_factory=list)
    store: object = None
    init: object = None
    reads: set = field(default_factory=set)  # buffer Vars read (by identity)
    writes: set = field(default_factory=set)
    reason: str | None = None

    def __repr__(self) -> str:
        return f"Nest({self.index}, {self.name!r}, {self.kinds() or '-'})"

    @property
    def name(self) -> str:
        return self.block.name_hint if self.block is not None else f"stmt#{self.index}"

    @property
    def offloaded_kernel(self) -> str | None:
        if self.block is None or OFFLOADED_ATTR not in self.block.annotations:
            return None
        return str(self.block.annotations[OFFLOADED_ATTR])

    @property
    def offloaded_library(self) -> str | None:
        """The library of the kernel an offloaded block calls (None: not offloaded)."""
        if self.offloaded_kernel is None:
            return None
        return str(self.block.annotations.get(LIBRARY_ATTR, "tirbyoc"))

    def kinds(self) -> str:
        return "".join(i.kind for i in self.iters)

    def spatial(self):
        return [i for i in self.iters if i.kind == "S"]

    def reduction(self):
        return [i for i in self.iters if i.kind == "R"]


@dataclass
class NormalFunc:
    func: object
    root: object  # root SBlock, or None when the function has no root block
    nests: list
    params: list  # buffer params, in order
    reason: str | None = None


def _buffers_in(expr) -> set:
    found = set()

    def visit(node):
        found.add(node.source if isinstance(node, T.BufferLoad) else node.buffer)

    T.structural_walk(expr, [(T.BufferLoad, visit), (T.BufferStore, visit)], order="pre")
    return found


def _iter_kind(iter_var) -> str:
    if iter_var.iter_type == T.DATA_PAR:
        return "S"
    if iter_var.iter_type == T.COMM_REDUCE:
        return "R"
    return "O"


def _normalize_nest(index: int, stmt, analyzer) -> Nest:
    nest = Nest(index=index, stmt=stmt)
    loops = []
    node = stmt
    while isinstance(node, T.For):
        loops.append(node)
        node = node.body
    if not isinstance(node, T.SBlockRealize):
        nest.reason = "not a loop nest around a single sblock"
        nest.reads = _buffers_in(stmt)
        nest.writes = set(nest.reads)
        return nest
    realize, block = node, node.block
    nest.block = block
    nest.iters = [Iter(iv.var, _iter_kind(iv), iv.dom.extent) for iv in block.iter_vars]
    nest.reads = {r.source for r in block.reads} | _buffers_in(block.body)
    nest.writes = {w.source for w in block.writes}
    if block.init is not None:
        nest.reads |= _buffers_in(block.init)
    if OFFLOADED_ATTR in block.annotations:
        return nest
    if not (isinstance(realize.predicate, T.IntImm) and int(realize.predicate) == 1):
        nest.reason = "the block has a predicate (scheduled or padded loop nest)"
        return nest
    # NOTE: an unscheduled nest binds every block iter to one loop var that covers the
    # whole iteration domain. Anything else (split, fused, partial loops) is left alone,
    # because replacing the nest would then change what is computed.
    loop_of = {loop.loop_var: loop for loop in loops}
    if len(loops) != len(block.iter_vars):
        nest.reason = "loop nest does not bind one loop per block iterator (already scheduled)"
        return nest
    used = set()
    for iv, value in zip(block.iter_vars, realize.iter_values):
        loop = loop_of.get(value) if isinstance(value, T.Var) else None
        if loop is None or value in used:
            nest.reason = "loop nest binds block iterators non-trivially (already scheduled)"
            return nest
        used.add(value)
        if not (analyzer.can_prove_equal(loop.min, 0) and analyzer.can_prove_equal(iv.dom.min, 0)
                and analyzer.can_prove_equal(loop.extent, iv.dom.extent)):
            nest.reason = "a loop does not cover its block iterator's whole domain"
            return nest
    if any(k == "O" for k in nest.kinds()):
        nest.reason = "the block has iterators that are neither spatial nor reduction"
        return nest
    if not isinstance(block.body, T.BufferStore):
        nest.reason = "the block body is not a single buffer store"
        return nest
    if block.init is not None and not isinstance(block.init, T.BufferStore):
        nest.reason = "the block init is not a single buffer store"
        return nest
    if block.match_buffers or block.alloc_buffers:
        nest.reason = "the block allocates or matches buffers"
        return nest
    nest.store = block.body
    nest.init = block.init
    return nest


def normalize(func) -> NormalFunc:
    """Split ``func``'s root block into ``Nest`` records (see module docstring)."""
    params = [p for p in func.params if T.is_buffer(p)]
    body = func.body
    if not isinstance(body, T.SBlockRealize):
        return NormalFunc(func, None, [], params, reason="the function has no root sblock")
    root = body.block
    stmts = list(root.body) if isinstance(root.body, T.SeqStmt) else [root.body]
    analyzer = T.analyzer()
    nests = [_normalize_nest(i, s, analyzer) for i, s in enumerate(stmts)]
    if root.match_buffers:
        # NOTE: a view matched in the root block aliases its source; the matcher's hazard
        # and aliasing checks compare buffers by identity, so nothing here is offloaded.
        for nest in nests:
            nest.reason = nest.reason or ("the function matches buffer views in its root "
                                          "block (they may alias other buffers)")
    return NormalFunc(func, root, nests, params)


def offloaded_by_library(mod) -> dict:
    """``{library name: {kernel symbols}}`` of every offloaded block in ``mod`` (a module
    or a PrimFunc)."""
    funcs = [mod] if isinstance(mod, T.PrimFunc) else \
        [f for _, f in mod.functions_items() if isinstance(f, T.PrimFunc)]
    out: dict = {}
    for f in funcs:
        for n in normalize(f).nests:
            if n.offloaded_kernel:
                out.setdefault(n.offloaded_library, set()).add(n.offloaded_kernel)
    return out
