"""CPU schedules for what tirbyoc does not offload, so that nothing runs unscheduled.

TVM's default CPU pipeline legalizes and fuses but schedules nothing: every PrimFunc
runs as its naive, single-threaded loop nest. ``tirbyoc.pipeline`` (and so
``tirbyoc.compile``) applies, after offloading, these ``s_tir.dlight`` rules in order to
every PrimFunc that is not scheduled yet (offloaded ones are):

    WindowReduction()    pooling (max / average over a window): output rows in parallel,
                         outputs along the row in vector lanes, the window outside them
    RowReduction()       row reductions with elementwise steps: softmax, masked softmax,
                         layer norm, a mask's "any" over rows, global pooling, a sum of
                         products along rows: rows in parallel (from 64K elements), row
                         sums and maxima in vector lanes (rfactor), elementwise steps
                         vectorized; sums whose rows are not the output's (a group norm)
                         in loop nests of their own, once per row
    dl.cpu.GEMV()        matrix-vector products (TVM's) whose sum is not along rows.
                         Not first: it puts output rows in vector lanes, so over a sum
                         along rows each lane loads from another row, and it unrolls
                         the sum inside; LLVM took 582 s to compile MobileViT V2's
                         (key * scores).sum(-1) over [1, 128, 4, 196] so (0.02 s as a
                         row reduction)
    dl.cpu.Reduction()   other row reductions (TVM's: rows in parallel, scalar sums)
    Injective()          elementwise / layout ops: parallel outer loops, vectorized inner
                         (a row no lane count from 8 to 16 divides: whole vectors,
                         then a scalar tail; a padding that several blocks read stays
                         its own loop nest: a fill with the pad value, then a copy of
                         the inside)
    OuterParallel()      any other function: each block's leading spatial loops in parallel

Before RowReduction, dl.cpu.Reduction and Injective schedule a function, its float32
exp/tanh/erf/sigmoid calls are expanded to vectorizable expressions (``tirbyoc.fastmath``; LLVM
makes a vector exp a scalar libm call per lane). A function no rule takes stays as it
was; ``schedule_rules()`` is the list, ``describe_schedules`` says which rule takes what.

Before any rule, ``exact_identities`` starts TOPI's max and min reductions at -inf and
+inf (not at the largest finite floats) and its argmax and argmin at index 0 (not -1),
so that a row of -inf has the max -inf and the argmax 0, as in PyTorch; and it makes
every other float max and min give NaN for a NaN operand (``relu(NaN)`` was 0).

The code is as fast as the target's vector ISA: ``tirbyoc.compile`` defaults to this
machine's CPU; a bare "llvm" target is baseline x86-64 (SSE2, no FMA).
"""

from __future__ import annotations

from . import _tvm as T
from . import fastmath

# Below this many iterations of the outer loops the parallel launch costs more than it
# saves: the loop stays on the calling thread.
PARALLEL_MIN_ITERS = 64
# A row reduction or an elementwise function over fewer elements than this stays on the
# calling thread too: waking TVM's worker (asleep: tirbyoc sets
# TVM_THREAD_POOL_SPIN_COUNT=0) costs more than the work (MobileNet's global average pool
# over [1024, 7 x 7]: 0.047 ms in parallel; EfficientNet-B0's squeeze-and-excitation
# products over [1152, 7 x 7], three a run: 0.16 ms in parallel, 0.06 ms on one thread).
PARALLEL_MIN_ELEMENTS = 64 * 1024
# Vector lanes of the inner loop (16 floats: one AVX-512 register, two AVX2 registers).
VECTOR_LANES = 16


def _lanes(extent) -> int:
    """Vector lanes for a loop longer than VECTOR_LANES: VECTOR_LANES, or for a static
    length that it does not divide, the largest divisor from VECTOR_LANES / 2 up (28 and
    56 run as vectors of 14): a split with a partial last chunk carries a lane predicate,
    and a predicated vector loop is scalarized."""
    if isinstance(extent, int) and extent % VECTOR_LANES:
        for lanes in range(VECTOR_LANES - 1, VECTOR_LANES // 2 - 1, -1):
            if extent % lanes == 0:
                return lanes
    return VECTOR_LANES


# fewest lanes a row is summed in (rows of a prime length stay one scalar chain)
REDUCE_LANES_MIN = 4


def _reduce_lanes(extent):
    """Lanes of partial sums for a row of static length ``extent``: ``_lanes``, or where
    that does not divide it the largest divisor from REDUCE_LANES_MIN up (the 49 pixels of
    a 7 x 7 global pooling in 7 lanes: each lane an independent chain, where the scalar
    loop was one chain of 49 dependent adds; ResNet-50's and EfficientNet-B0's pools over
    7 x 7, 1152 channels: 18-23 -> 14-15 us on Zen 3); None when the row holds fewer than
    two vectors."""
    width = _lanes(extent)
    if extent % width:
        width = next((w for w in range(VECTOR_LANES // 2 - 1, REDUCE_LANES_MIN - 1, -1)
                      if extent % w == 0), None)
    return width if width is not None and extent >= 2 * width else None


def _loop_elements(sch, loops):
    """The product of the loops' extents, or None when one is symbolic."""
    total = 1
    for loop in loops:
        extent = T.dlight_extent(sch, loop)
        if not isinstance(extent, int):
            return None
        total *= extent
    return total


class Injective(T.DlightScheduleRule):
    """Elementwise and layout PrimFuncs (every block spatial): intermediate blocks inlined,
    the outer loops fused and run in parallel, the innermost loop vectorized."""

    def apply(self, func, target, tunable=False):  # noqa: ARG002 (dlight's signature)
        if not isinstance(func, T.PrimFunc) or target is None or target.kind.name != "llvm":
            return None
        if _has_reduction(func):
            return None
        sch = T.Schedule(fastmath.expand_math(func))
        blocks = T.dlight_blocks(sch)
        if not blocks or not all(b.is_injective() for b in blocks):
            return None
        shared = _shared_pads(sch, blocks)
        rest = _try_inline(sch, [b for b in blocks if b not in shared])
        for block in sorted(shared + rest, key=lambda b: blocks.index(b)):
            # a padding of what was computed, the computation inlined into it (a causal
            # conv's left pad after its input's activation): decomposed all the same
            if block in shared or _is_pad(sch.get(block.block_rv)):
                _schedule_pad(sch, block.block_rv)
            else:
                self._schedule_block(sch, block.block_rv, ragged=True)
        return sch

    @staticmethod
    def _vectorize(sch, inner, tail=False):
        """Vectorize a loop: split into VECTOR_LANES lanes when longer (or symbolic).
        ``tail``: a static length with no divisor to split by may be partitioned
        (``_vectorize_with_tail``), which replaces the loop's block: only for the block's
        last step."""
        extent = T.dlight_extent(sch, inner)
        if tail and isinstance(extent, int) and extent > VECTOR_LANES and \
                extent % _lanes(extent) and Injective._vectorize_with_tail(sch, inner, extent):
            return
        if not isinstance(extent, int) or extent > VECTOR_LANES:
            outer, lanes = sch.split(inner, [None, _lanes(extent)])
            sch.vectorize(lanes)
            if not isinstance(extent, int):
                # a symbolic length: LoopPartition splits off the partial last chunk, so
                # that the other chunks run as vectors with no lane predicate (a
                # predicated vector loop is scalarized, with an integer division per
                # element). NOTE: not for a static length: LoopPartition then fails with
                # "mismatched types int32 vs int64" in 0.27.
                sch.annotate(outer, "pragma_loop_partition_hint", 1)
        elif extent > 1:
            sch.vectorize(inner)

    @staticmethod
    def _vectorize_with_tail(sch, inner, extent) -> bool:
        """A static length with no divisor from VECTOR_LANES / 2 up (49: Swin's 7 x 7
        windows; 197: ViT's tokens) as two loops: whole vectors, then the few elements
        left, scalar. Split into vectors alone, the last one would carry a lane predicate,
        which scalarizes the whole loop with an index division per element (Swin's
        [64, 3, 49, 49] attention bias add: 0.34 -> 0.08 ms). False, the loop unchanged,
        where the schedule cannot partition it."""
        try:
            body, _ = sch.loop_partition(inner, [extent // VECTOR_LANES * VECTOR_LANES, None])
        except Exception:  # noqa: BLE001 (a loop loop_partition refuses: the split instead)
            return False
        _, lanes = sch.split(body, [None, VECTOR_LANES])
        sch.vectorize(lanes)
        return True

    @staticmethod
    def _schedule_block(sch, block_rv, ragged=False):
        """``ragged``: a transpose may be tiled where no tile divides the output's last
        extent (``_tile_transpose``)."""
        loops = sch.get_loops(block_rv)
        if not loops:
            return
        elements = _loop_elements(sch, loops)
        if elements == 0:
            return  # (no elements: nothing to run; fusing or splitting divides by zero)
        if Injective._tile_transpose(sch, block_rv, loops, elements, ragged):
            return
        if len(loops) > 1:
            outer = sch.fuse(*loops[:-1])
            iters = T.dlight_extent(sch, outer)
            if not isinstance(iters, int) or (iters >= PARALLEL_MIN_ITERS and (
                    elements is None or elements >= PARALLEL_MIN_ELEMENTS)):
                sch.parallel(outer)
        Injective._vectorize(sch, loops[-1], tail=True)

    @staticmethod
    def _tile_transpose(sch, block_rv, loops, elements, ragged=False) -> bool:
        """A transpose (ConvNeXt's permute back to channels first, added to the residual):
        the output's last axis is an input's earlier one, so the vectorized inner loop
        read that input a float per cache line, its stride apart. In square tiles of a
        side from ``TRANSPOSE_TILES`` (the input's last axis outside, the output's inside
        and vectorized) each line read serves the tile's columns while in L1
        ([1, 384, 14, 14] from [1, 14, 14, 384] plus a residual: 99 -> 45-47 us on one
        Zen 3 thread). With ``ragged``, an output's last extent that no tile divides
        (3199 samples of a speech model's features) is tiled all the same, the whole
        tiles split from the partial last one, whose lanes carry a condition (a vector
        loop with one is scalarized): [1, 512, 3199] from [1, 3199, 512] 5.0 -> 0.73-0.85
        ms on 2 Zen 3 threads. (An input's last extent that none divides stays untiled: its rows read
        in place alternately 0.8-1.3x the time of tiles with a partial last one.) False,
        nothing done, for any other block."""
        pair = _transposed_axes(sch.get(block_rv), len(loops))
        if pair is None:
            return False
        extents = [T.dlight_extent(sch, loop) for loop in loops]

        def tile_of(extent):
            return next((t for t in TRANSPOSE_TILES if isinstance(extent, int)
                         and extent % t == 0 and extent > t), None)

        def ragged_tile(extent):
            """The tile for an extent no tile divides (its last tile partial), or None."""
            return TRANSPOSE_TILES[0] if isinstance(extent, int) and \
                extent > TRANSPOSE_TILES[0] else None

        def joinable(a, b):
            return isinstance(extents[a], int) and isinstance(extents[b], int) and \
                tile_of(extents[a] * extents[b]) is not None

        # the output's last two axes as one (14 x 14 pixels: 196, tiles of 4); the
        # input's last two likewise (NCHW to NHWC at 14 x 14)
        across, _, joined = pair
        join_out = tile_of(extents[-1]) is None and across < len(loops) - 2 and \
            joinable(-2, -1)
        join_in = tile_of(extents[across]) is None and joined and \
            across < len(loops) - (2 if join_out else 1) and joinable(across - 1, across)
        tiles = [tile_of(extents[across - 1] * extents[across]) if join_in
                 else tile_of(extents[across]),
                 tile_of(extents[-2] * extents[-1]) if join_out else tile_of(extents[-1])]
        ragged_out = ragged and tiles[1] is None and ragged_tile(extents[-1]) is not None
        if ragged_out:
            tiles[1] = ragged_tile(extents[-1])
        if None in tiles:
            return False  # nothing changed
        loops = list(loops)
        if ragged_out:
            # the output's last axis cut into the whole tiles and the partial last one
            # first, each part a loop nest of its own: tiles split from the whole would
            # keep the partial one's condition, and their vector loop was scalarized
            sch.reorder(loops[-1], *loops[:-1])
            try:
                whole, part = sch.loop_partition(
                    loops[-1], [extents[-1] // tiles[1] * tiles[1], None])
            except Exception:  # noqa: BLE001 (a loop it refuses: untiled, as before)
                sch.reorder(*loops)
                return False
            # each part's loops back in their order, the output's last axis inside
            (part_block,) = sch.get_child_blocks(part)
            part_loops = sch.get_loops(part_block)[-len(loops):]
            part_loops = [*part_loops[1:], part_loops[0]]
            sch.reorder(*part_loops)
            Injective._tile_loops(sch, part_loops, across, (tiles[0], None), elements)
            (block,) = sch.get_child_blocks(whole)
            loops = sch.get_loops(block)[-len(loops):]
            loops = [*loops[1:], loops[0]]
            sch.reorder(*loops)
        if join_out:
            loops[-2:] = [sch.fuse(loops[-2], loops[-1])]
        if join_in:
            loops[across - 1:across + 1] = [sch.fuse(loops[across - 1], loops[across])]
            across -= 1
        Injective._tile_loops(sch, loops, across, tiles, elements)
        return True

    @staticmethod
    def _tile_loops(sch, loops, across, tiles, elements):
        """``loops`` (the input's last axis at ``across``, the output's last) in tiles of
        ``tiles`` (None: the output's axis untiled, the partial tile of a transpose), the
        tiles' loops fused and in parallel, the output's axis in vectors."""
        rest = [loop for i, loop in enumerate(loops[:-1]) if i != across]
        outer_c, inner_c = sch.split(loops[across], [None, tiles[0]])
        if tiles[1] is None:
            outer_r, inner_r = [], loops[-1]
        else:
            split = sch.split(loops[-1], [None, tiles[1]])
            outer_r, inner_r = split[:1], split[1]
        sch.reorder(*rest, outer_c, *outer_r, inner_c, inner_r)
        outer = sch.fuse(*rest, outer_c, *outer_r)
        iters = T.dlight_extent(sch, outer)
        if iters >= PARALLEL_MIN_ITERS and (elements is None or
                                            elements >= PARALLEL_MIN_ELEMENTS):
            sch.parallel(outer)
        if tiles[1] is not None:
            sch.vectorize(inner_r)


# Tile sides of a transpose, the first that divides the extent (8: a cache line holds
# 16 floats, and 8 lines per tile column stay in L1 with the rest of the nest).
TRANSPOSE_TILES = (8, 4)


def _transposed_axes(stmt, nloops):
    """(j, last, joined) for a block whose iterators are its loops, one each, whose
    output's last index is its last iterator, and which loads some other buffer at
    [..., v_j] with the last iterator in an earlier index: the input is read along
    iterator j and written along the last one (``joined``: it is read along j - 1 and j
    as one axis, [..., v_(j-1), v_j]). None otherwise."""
    ivars = [iv.var for iv in stmt.iter_vars]
    if len(ivars) != nloops or len(ivars) < 2 or \
            any(iv.iter_type != T.DATA_PAR for iv in stmt.iter_vars):
        return None
    stores = []
    T.structural_walk(stmt.body, [(T.BufferStore, stores.append)], order="pre")
    if len(stores) != 1 or not stores[0].indices or \
            not stores[0].indices[-1].same_as(ivars[-1]):
        return None
    if len(stmt.writes) != 1:
        return None
    out, last = stmt.writes[0].source, ivars[-1]
    loads = []
    T.structural_walk(stmt.body, [(T.BufferLoad, lambda ld: None if ld.source.same_as(out)
                                   else loads.append(ld))], order="pre")
    for ld in loads:
        if len(ld.indices) < 2 or _uses(ld.indices[-1], last) or \
                not any(_uses(i, last) for i in ld.indices[:-1]):
            continue
        for j, var in enumerate(ivars[:-1]):
            if ld.indices[-1].same_as(var):
                # the input's last two axes are the iterators j - 1 and j: one axis
                joined = j > 0 and ld.indices[-2].same_as(ivars[j - 1])
                return j, nloops - 1, joined
    return None


class _GuardedRule(T.DlightScheduleRule):
    """A rule for llvm targets whose ``_schedule(func)`` returns a schedule or None; an
    error while scheduling means the function is not of its form (the next rule's)."""

    def apply(self, func, target, tunable=False):  # noqa: ARG002 (dlight's signature)
        if not isinstance(func, T.PrimFunc) or target is None or target.kind.name != "llvm":
            return None
        try:
            return self._schedule(func)
        except Exception:  # noqa: BLE001 (a form this rule does not know: the next rule's)
            # NOTE: dlight's ApplyDefaultSchedule does not catch a rule's errors; a layout
            # that compute_at or rfactor rejects must not fail the whole compile.
            return None

    def _schedule(self, func):
        raise NotImplementedError


class WindowReduction(_GuardedRule):
    """Pooling: one reduction of a single input over a window (max / average pooling),
    with elementwise steps before it (padding) and after it (the average's division).
    Output rows in parallel; along the output's last axis, runs of outputs are reduced
    side by side in vector lanes, the window loops outside the lanes; each step of the
    function is its own loop nest. A window reduction whose output's last axis is short
    (global pooling: one output per channel) is left to RowReduction.

    Only spatial loops are split over threads or lanes, and each output's window is
    reduced in its written order, so results do not depend on the thread count."""

    # shortest output row worth vector lanes
    MIN_ROW = 8

    def _schedule(self, func):
        if _count_reductions(func) != 1:
            return None
        sch = T.Schedule(fastmath.expand_math(func))
        infos = T.dlight_blocks(sch)
        if not infos:
            return None
        reductions = [b for b in infos if not b.is_injective()]
        if len(reductions) != 1:
            return None
        red = reductions[0]
        kind = red.dom_kind()
        spatial = len(kind) - len(kind.lstrip("S"))
        if spatial == 0 or kind[spatial:].strip("R"):
            return None
        stmt = sch.get(red.block_rv)
        if not _reads_one_tensor(stmt):
            return None  # not a window over one tensor (a matmul reads two)
        if not _rows_along_input_rows(stmt):
            return None  # lanes along the output row would gather from the input
        loops = sch.get_loops(red.block_rv)
        if len(loops) != len(kind):
            return None
        row = T.dlight_extent(sch, loops[spatial - 1])
        if not isinstance(row, int) or row < self.MIN_ROW:
            return None
        # the other steps: elementwise ones inlined, paddings kept (see _shared_pads)
        others = _inline_where(sch, [b for b in infos if b is not red],
                               lambda b: not _is_pad(sch.get(b.block_rv)))
        for b in others:
            if _is_pad(sch.get(b.block_rv)):
                _schedule_pad(sch, b.block_rv)
            else:
                Injective._schedule_block(sch, b.block_rv)
        # the reduction: rows in parallel, lanes along the output row inside the window
        loops = sch.get_loops(red.block_rv)
        last, window = loops[spatial - 1], loops[spatial:]
        if row > VECTOR_LANES:
            outer_last, lanes = sch.split(last, [None, _lanes(row)])
            outer = [*loops[:spatial - 1], outer_last]
        else:
            lanes, outer = last, list(loops[:spatial - 1])
        sch.reorder(*window, lanes)
        if outer:
            rows = sch.fuse(*outer) if len(outer) > 1 else outer[0]
            sch.parallel(rows)
        # NOTE: vectorize before decompose_reduction (whose init copies the lanes loop,
        # vectorized too): after it, the update block is no longer a reduction block and
        # vectorize rejects the loop.
        sch.vectorize(lanes)
        sch.decompose_reduction(red.block_rv, window[0])
        return sch


def _static_elements(info):
    """The iterations of a dlight block's loop nest (spatial and reduced), or None if an
    extent is symbolic."""
    total = 1
    for it in info.iters:
        dom = it.dom
        if not isinstance(dom, int):
            dom = getattr(dom, "value", None)
        if not isinstance(dom, int):
            return None
        total *= dom
    return total


def _same_extents(a, b) -> bool:
    an = T.analyzer()
    return len(a) == len(b) and all(an.can_prove_equal(x.dom, y.dom) for x, y in zip(a, b))


class RowReduction(_GuardedRule):
    """Row reductions with elementwise steps (softmax, masked softmax, layer norm, RMS
    norm): the leading spatial ("row") loops fused and run in parallel, every block
    computed inside them, elementwise steps vectorized, and each sum / max over the row
    accumulated in ``VECTOR_LANES`` vector lanes (rfactor) when the row length is a
    static multiple of them (otherwise a scalar loop, as dlight's cpu.Reduction does).
    exp/tanh/erf/sigmoid are expanded to vectorizable forms (``tirbyoc.fastmath``).

    Only spatial loops are split over threads and each row is reduced by one thread, so
    a result does not depend on the thread count."""

    def _schedule(self, func):
        costly = _blocks_with_math(func)
        sch = T.Schedule(fastmath.expand_math(func))
        infos = T.dlight_blocks(sch)
        # one block alone: only a reduction of one tensor (a global max pooling)
        if not infos or (len(infos) < 2 and not _reads_one_tensor(sch.get(infos[0].block_rv))):
            return None
        reductions = [b for b in infos if not b.is_injective()]
        # NOTE: dlight calls a reduction over an extent of 1 spatial (see _has_reduction):
        # its count of reductions must be the function's.
        if not reductions or len(reductions) != _count_reductions(func):
            return None
        kinds = [b.dom_kind() for b in infos]
        if any(not k or k[0] != "S" for k in kinds):
            return None
        lead = min(len(k) - len(k.lstrip("S")) for k in kinds)
        for b, k in zip(infos, kinds):
            # a reduction: the rows, then only reduced loops
            if not b.is_injective() and k[lead:].strip("R"):
                return None
        tail = infos[-1]
        if any(not _same_extents(b.iters[:lead], tail.iters[:lead]) for b in reductions):
            # the reductions' rows are not the output's (a group norm: a sum per group,
            # an output row per channel): under the output's rows each would be computed
            # again for every row of its group
            return self._schedule_apart(sch, infos, costly)
        if tail.is_injective() and len(kinds[-1]) <= lead and \
                not all(_reads_one_tensor(sch.get(b.block_rv)) for b in reductions):
            # the output has no loop inside the rows and a reduction combines tensors
            # (e.g. matmul + bias: every output element a "row"): not a row reduction. A
            # global pooling (a mean over each channel's pixels) is one.
            return None
        # NOTE: elementwise producers that are cheap are inlined into their consumers; one
        # that calls exp/tanh/erf/sigmoid (softmax's exp) is kept, not computed once per consumer.
        rest = _inline_where(sch, infos[:-1], lambda b: b.is_injective() and len(b.iters) > lead
                             and sch.get(b.block_rv).name_hint not in costly)
        # rfactor needs each reduction alone in its loop nest: before compute_at
        blocks = []
        for b in rest:
            if b.is_injective():
                blocks.append((b.block_rv, "S"))
            else:
                blocks.extend(self._vector_reduce(sch, b.block_rv, lead))
        # the last block (the output) holds the row loop; the rest is computed under it
        if tail.is_injective():
            last, last_kind = tail.block_rv, "S"
        else:  # a reduction that is the output (e.g. "any" over a mask row)
            *body, (last, last_kind) = blocks + self._vector_reduce(sch, tail.block_rv, lead)
            blocks = body
        loops = sch.get_loops(last)
        rows = sch.fuse(*loops[:lead]) if lead > 1 else loops[0]
        for block_rv, _ in reversed(blocks):
            sch.compute_at(block_rv, rows, preserve_unit_loops=True)
        blocks.append((last, last_kind))
        # NOTE: parallel before decompose_reduction: it checks every block under the loop
        # is a complete or reduction block, which a decomposed update block is not.
        self._parallel_rows(sch, rows, reductions[0])
        for block_rv, kind in blocks:
            if kind == "S":
                self._vectorize_inner(sch, block_rv)
            elif kind == "V":  # lanes of partial sums: initialized, then accumulated
                # compute_at made the loops in the block's iterator order, lanes first
                loops = sch.get_loops(block_rv)[1:]
                sch.reorder(loops[-1], loops[0])
                sch.vectorize(sch.get_loops(block_rv)[-1])  # the init's copy is vectorized too
                sch.decompose_reduction(block_rv, sch.get_loops(block_rv)[1])
            elif kind == "R":  # a scalar reduction over a row: unrolled, as dlight does
                self._unroll_inner(sch, block_rv)
        return sch

    def _schedule_apart(self, sch, infos, costly):
        """Each reduction as its own loop nest over its own rows (in parallel when there
        are enough of them, sums in vector lanes), then the elementwise steps as
        ``Injective`` schedules them: a group norm's sums once per group (PoolFormer's
        one-group norm over [64, 56, 56]: 7 ms, its sums computed again for each of the
        64 channels, -> 0.22 ms)."""
        rest = _inline_where(sch, infos, lambda b: b.is_injective() and b is not infos[-1]
                             and sch.get(b.block_rv).name_hint not in costly)
        for b in rest:
            if b.is_injective():
                Injective._schedule_block(sch, b.block_rv)
                continue
            kind = b.dom_kind()
            lead = len(kind) - len(kind.lstrip("S"))
            parts = self._vector_reduce(sch, b.block_rv, lead, innermost=True)
            block_rv = parts[0][0]
            loops = sch.get_loops(block_rv)
            rows = sch.fuse(*loops[:lead]) if lead > 1 else loops[0] if lead else None
            if rows is not None:
                self._parallel_rows(sch, rows, b)
            if parts[0][1] == "V":
                sch.vectorize(sch.get_loops(block_rv)[-1])
                # the partial sums set to zero before the first reduced loop
                sch.decompose_reduction(block_rv, sch.get_loops(block_rv)[1 if lead else 0])
            else:
                self._unroll_inner(sch, block_rv)
        return sch

    @staticmethod
    def _parallel_rows(sch, rows, reduction):
        """``rows`` in parallel when there are several (or a symbolic count) and the
        ``reduction`` (a dlight block) goes over PARALLEL_MIN_ELEMENTS or more."""
        iters = T.dlight_extent(sch, rows)
        elements = _static_elements(reduction)
        if not isinstance(iters, int) or (iters > 1 and (
                elements is None or elements >= PARALLEL_MIN_ELEMENTS)):
            sch.parallel(rows)

    @staticmethod
    def _vector_reduce(sch, block_rv, lead, innermost=False):
        """rfactor a row reduction over vector lanes (``_lanes``): [(block, kind)] in order,
        "V" a vectorized partial reduction, "W" the write-back over the lanes.
        ``innermost``: lanes over the fewest innermost reduced loops that hold whole
        vectors (a group norm's H x W of each of its channels, not the group's channels
        too: the fused index of three loops is not seen to be contiguous, and its vectors
        are gathered), the loops outside them left as they are."""
        loops = sch.get_loops(block_rv)
        red = loops[lead:]
        if innermost:
            extents, size = [T.dlight_extent(sch, r) for r in red], 1
            for i in range(len(red) - 1, -1, -1):
                if not isinstance(extents[i], int):
                    break
                size *= extents[i]
                if size % VECTOR_LANES == 0 and size >= 2 * VECTOR_LANES:
                    red = red[i:]
                    break
        inner = sch.fuse(*red) if len(red) > 1 else red[0]
        extent = T.dlight_extent(sch, inner)
        if not isinstance(extent, int):
            return [(block_rv, "R")]
        width = _reduce_lanes(extent)
        if width is None:
            return [(block_rv, "R")]
        outer, lanes = sch.split(inner, [None, width])
        try:
            # the lanes are the last dimension of the partial sums' buffer: contiguous
            ndim = len(sch.get(block_rv).writes[0].region)
            partial = sch.rfactor(lanes, factor_axis=ndim)
        except Exception:  # noqa: BLE001 (not a reducer rfactor knows: a scalar loop)
            return [(block_rv, "R")]
        return [(partial, "V"), (block_rv, "W")]

    @staticmethod
    def _vectorize_inner(sch, block_rv):
        loops = sch.get_loops(block_rv)
        if len(loops) > 1:  # never the row loop itself, which holds the other blocks
            Injective._vectorize(sch, loops[-1], tail=True)

    @staticmethod
    def _unroll_inner(sch, block_rv):
        loops = sch.get_loops(block_rv)
        if len(loops) < 2:
            return
        inner = loops[-1]
        extent = T.dlight_extent(sch, inner)
        if not isinstance(extent, int) or extent <= VECTOR_LANES or extent % VECTOR_LANES:
            # NOTE: a symbolic length, or one that is not a multiple of the lanes, stays
            # one plain loop: split, it would carry a lane predicate, and the unrolled
            # body tests it at every element (a max over rows of 129, GPT-OSS's scores
            # beside their sink: 1.37 ms against 0.20 plain, [8192, 129]); plain, LLVM
            # vectorizes an integer reduction (a mask's max) itself
            return
        _, inner = sch.split(inner, [None, VECTOR_LANES])
        sch.annotate(inner, "pragma_auto_unroll_max_step", VECTOR_LANES)
        sch.annotate(inner, "pragma_unroll_explicit", 1)


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


def _shared_pads(sch, blocks) -> list:
    """The padding blocks (an ``if_then_else`` on the indices) that several blocks read,
    such as the padded input of a stencil that a model writes as shifted slices of one
    padded tensor (a blur, a convolution spelled out as its taps): kept as their own
    loop nest. Inlined, each read would test the bounds again, and the bounds test keeps
    the consumer's inner loop from being vectorized."""
    stmts = [sch.get(b.block_rv) for b in blocks]
    shared = []
    for b, stmt in zip(blocks, stmts):
        if not _is_pad(stmt):
            continue
        out = stmt.writes[0].source
        readers = [other for other in stmts if other is not stmt
                   and any(r.source.same_as(out) for r in other.reads)]
        if len(readers) >= 2:
            shared.append(b)
    return shared


def _reads_one_tensor(stmt) -> bool:
    """Whether a block writes one buffer and reads one other (a pooling's reduction; a
    matmul reads two)."""
    if len(stmt.writes) != 1:
        return False
    out = stmt.writes[0].source
    return len({r.source for r in stmt.reads if not r.source.same_as(out)}) == 1


def _rows_along_input_rows(stmt) -> bool:
    """Whether the last index of each input load of a reduction block moves with its
    last spatial iterator (a pooling window slides along the input row); a global
    pooling's last spatial iterator is the channel, and its input row is reduced."""
    spatial = [iv.var for iv in stmt.iter_vars
               if iv.iter_type == T.DATA_PAR and not _is_one(iv.dom.extent)]
    if not spatial:
        return False
    last, out = spatial[-1], stmt.writes[0].source
    loads = []
    T.structural_walk(stmt.body, [(T.BufferLoad, lambda ld: None if ld.source.same_as(out)
                                   else loads.append(ld))], order="pre")
    return bool(loads) and all(_uses(ld.indices[-1], last) for ld in loads)


def _uses(expr, var) -> bool:
    """Whether ``var`` occurs in ``expr``."""
    found = []
    T.structural_walk(expr, [(T.Var, lambda v: found.append(v) if v.same_as(var)
                              else None)], order="pre")
    return bool(found)


def _is_one(extent) -> bool:
    return isinstance(extent, T.IntImm) and extent.value == 1


# The most expression nodes a block may have and still be inlined into its consumers. A
# value read several times by the next step, step after step, grows exponentially when
# each step is inlined into the next: RWKV's recurrence over 64 tokens, unrolled by
# torch.export and fused into functions of hundreds of steps (its state read three to
# four times by each), took more than 20 GB and did not finish. Past this size a block
# is computed once into its buffer and read from there. The largest block the zoo's
# seven models inline has 143 nodes (Llama), so they are scheduled as before.
INLINE_NODES = 2000


def _expr_nodes(block) -> int:
    """Expression nodes in a block's body (each load and operation one)."""
    count = 0

    def one(_):
        nonlocal count
        count += 1

    T.structural_walk(block.body, [(T.Expr, one)])
    return count


def _most_reads(stmt, source=None) -> int:
    """The most points at which a block's body loads one buffer (``source`` only, if
    given): ``x * sigmoid(x)`` reads one point, a bilinear resize four."""
    points = {}

    def one(load):
        if source is None or load.source.same_as(source):
            points.setdefault(load.source.name, set()).add(
                tuple(str(i) for i in load.indices))

    T.structural_walk(stmt.body, [(T.BufferLoad, one)], order="pre")
    return max((len(p) for p in points.values()), default=0)


def _gathers_into_gather(sch, block) -> bool:
    """Whether ``block`` reads some input at several points (a resize's four taps) and a
    consumer reads its output at several points too: inlined, each output would compute
    every tap of every tap (GLPN's two bilinear upsamplings fused, each pixel sixteen
    evaluations of the sum before them: 26 ms)."""
    stmt = sch.get(block.block_rv)
    if len(stmt.writes) != 1 or _most_reads(stmt) < 2:
        return False
    out = stmt.writes[0].source
    return any(_most_reads(sch.get(c), out) >= 2 for c in sch.get_consumers(block.block_rv))


def _try_inline(sch, blocks) -> list:
    """dlight's ``try_inline`` (each block into its consumers, else its consumer into it,
    until nothing changes) with three bounds: a block past ``INLINE_NODES`` stays a
    block, so does a gather that a gather reads (``_gathers_into_gather``),
    and each pass walks the blocks once (dlight restarts from the first after every
    inline: quadratic in a fused function's hundreds of blocks). The blocks left."""
    blocks = list(blocks)
    while True:
        left = []
        for b in blocks:
            if _expr_nodes(sch.get(b.block_rv)) <= INLINE_NODES and \
                    not _gathers_into_gather(sch, b):
                try:
                    sch.compute_inline(b.block_rv)
                    continue
                except Exception:  # noqa: BLE001 (not inlinable: kept, or reverse-inlined)
                    pass
            left.append(b)
        changed = len(left) < len(blocks)
        blocks = []
        for b in left:
            # (a consumer inlined into its producer copies the producer's expression into
            # each of its reads of it: both must be within the bound)
            # (and only into producers it alone reads: TVM 0.27 reverse-inlines a split's
            # first half into the concat that the other half still reads, then drops the
            # concat's buffer: Reformer's "used before its definition")
            producers = sch.get_producers(b.block_rv)
            if not changed and all(_expr_nodes(sch.get(rv)) <= INLINE_NODES for rv in [
                    b.block_rv, *producers]) and all(
                    len(sch.get_consumers(p)) == 1 for p in producers):
                try:
                    sch.reverse_compute_inline(b.block_rv)
                    changed = True
                    continue
                except Exception:  # noqa: BLE001 (its producers are not one block)
                    pass
            blocks.append(b)
        if not changed:
            return blocks


def _inline_where(sch, blocks, wanted) -> list:
    """Inlines each block that ``wanted(block)`` picks into its consumers, where it can be
    and is at most ``INLINE_NODES``; the blocks left (not picked, not inlinable such as a
    consumer, or too large), in order."""
    kept = []
    for b in blocks:
        if wanted(b) and _expr_nodes(sch.get(b.block_rv)) <= INLINE_NODES:
            try:
                sch.compute_inline(b.block_rv)
                continue
            except Exception:  # noqa: BLE001 (not inlinable: kept as a block)
                pass
        kept.append(b)
    return kept


def _schedule_pad(sch, block_rv):
    """A padding as its own loop nest: each row filled with the pad value, then its
    in-bounds part copied (``decompose_padding``: no bounds test per element, so both
    inner loops vectorize); rows in parallel. A padding that does not decompose is
    scheduled as any elementwise block."""
    loops = sch.get_loops(block_rv)
    if len(loops) < 2:
        Injective._schedule_block(sch, block_rv)
        return
    try:
        fill = sch.decompose_padding(block_rv, loops[-1])
    except Exception:  # noqa: BLE001 (not the pattern decompose_padding knows)
        Injective._schedule_block(sch, block_rv)
        return
    for b in (fill, block_rv):
        Injective._vectorize(sch, sch.get_loops(b)[-1])
    outer = sch.fuse(*sch.get_loops(block_rv)[:len(loops) - 1])
    iters = T.dlight_extent(sch, outer)
    if not isinstance(iters, int) or iters >= PARALLEL_MIN_ITERS:
        sch.parallel(outer)


def _is_pad(stmt) -> bool:
    """Whether a block stores one ``if_then_else`` (a padding, or any bounds-tested copy)."""
    return len(stmt.writes) == 1 and isinstance(stmt.body, T.BufferStore) and \
        T.is_if_then_else(stmt.body.value)


def _has_reduction(func) -> bool:
    """Whether any block reduces (a reduction iterator or an init), whatever its extent."""
    # NOTE: dlight's block analysis calls a reduction over an extent of 1 spatial, and
    # inlining or vectorizing such a block as elementwise gave wrong results (found by the
    # matcher fuzzer: a [.., M, 1] x [.., 1, N] matmul).
    return _count_reductions(func) > 0


def _count_reductions(func) -> int:
    found = []

    def visit(block):
        if block.init is not None or any(iv.iter_type == T.COMM_REDUCE for iv in block.iter_vars):
            found.append(block)

    T.structural_walk(func.body, [(T.SBlock, visit)], order="pre")
    return len(found)


def _blocks_with_math(func) -> set:
    """Names of the blocks whose body calls exp/tanh/erf/sigmoid (``tirbyoc.fastmath``)."""
    names = set()

    def visit(block):
        if fastmath.calls_math(block.body):
            names.add(block.name_hint)

    T.structural_walk(func.body, [(T.SBlock, visit)], order="pre")
    return names


class WithFastMath(T.DlightScheduleRule):
    """``rule`` applied to the function with its exp/tanh/erf/sigmoid expanded (``fastmath``)."""

    def __init__(self, rule):
        self.rule = rule

    def apply(self, func, target, tunable=False):
        if not isinstance(func, T.PrimFunc):
            return None
        return self.rule.apply(fastmath.expand_math(func), target, tunable)


class Guarded(T.DlightScheduleRule):
    """``rule`` (one of dlight's reduction rules), offered functions with a reduction
    only, and where an analysis it cannot do is "not mine": dlight's
    CPU GEMV rule asserts on a sum over the outer axis of a matrix (``histc``'s count
    per bin over [rows, bins]) instead of declining it, which stopped the build. A
    schedule only reorders a function's loops, so the next rule taking the function
    instead changes its speed, never its result."""

    def __init__(self, rule):
        self.rule = rule

    def apply(self, func, target, tunable=False):
        if isinstance(func, T.PrimFunc) and not _has_reduction(func):
            # NOTE: both take reductions only, but inline every block of the function
            # before they look (dlight's try_inline, quadratic in the blocks): most of the
            # build time of RWKV's unrolled recurrence, hundreds of elementwise steps
            return None
        try:
            return self.rule.apply(func, target, tunable)
        except (AssertionError, ValueError, IndexError, RuntimeError):
            return None


def schedule_beside_kernels(func):
    """``func`` (a PrimFunc with kernel calls) with its other elementwise blocks scheduled
    as ``Injective`` schedules them: each inlined into the next where that is not a
    kernel call, outer loops in parallel, the inner one vectorized, float32 math
    expanded. A kernel call leaves what it could not take in its function
    (Llama's SwiGLU: ``silu(x @ Wg) * up`` offloads the product and the SiLU, the
    multiply by ``up`` stays; ConvNeXt's layer scale after a dense), and a function with
    a kernel call is marked scheduled, so no fallback rule sees it: these blocks would
    run as naive single-threaded loops. A block that is not elementwise, or that a
    schedule step rejects, stays as it was; ``func`` itself when there is nothing."""
    from .normalize import OFFLOADED_ATTR

    def rest_of(sch):
        # NOTE: dlight cannot analyze every function (None): nothing is scheduled there
        return [b for b in T.dlight_blocks(sch) or () if OFFLOADED_ATTR not in
                sch.get(b.block_rv).annotations]

    if not rest_of(T.Schedule(func)):
        return func
    expanded = fastmath.expand_math(func)
    sch = T.Schedule(expanded)
    rest = rest_of(sch)

    def feeds_only_the_rest(block):
        # (never into a kernel call: it reads its inputs through pointers, not loads)
        consumers = sch.get_consumers(block.block_rv)
        return bool(consumers) and all(OFFLOADED_ATTR not in sch.get(c).annotations
                                       for c in consumers)

    # one loop over the elements, not one pass per elementwise step (ImageGPT's quick
    # GELU after a dense: three passes)
    done = len(rest) - len(_inline_where(sch, rest, feeds_only_the_rest))
    for block in rest_of(sch):
        if not block.is_injective() or not sch.get_loops(block.block_rv):
            continue
        trial = sch.copy()
        try:
            Injective._schedule_block(trial, trial.get_sblock(
                sch.get(block.block_rv).name_hint))
        except Exception:  # noqa: BLE001 (a step this block's loops reject: left as is)
            continue
        sch, done = trial, done + 1
    return sch.mod["main"] if done else func


def _rest_scheduled(func) -> bool:
    """Whether a loop of the function (its kernel calls have none) runs in parallel or
    in vector lanes: what ``schedule_beside_kernels`` made of the blocks beside them."""
    kinds = []
    T.structural_walk(func.body, [(T.For, lambda f: kinds.append(int(f.kind)))])
    return any(k != 0 for k in kinds)


def schedule_rules() -> list:
    """The rules ``tirbyoc.pipeline`` applies after offloading, in order."""
    return [WindowReduction(), RowReduction(), Guarded(T.dlight_cpu_gemv()),
            WithFastMath(Guarded(T.dlight_cpu_reduction())),
            Injective(), OuterParallel()]


def _rule_name(rule) -> str:
    while isinstance(rule, (WithFastMath, Guarded)):
        rule = rule.rule
    name = type(rule).__name__
    ours = (Injective, WindowReduction, RowReduction, OuterParallel)
    return f"tirbyoc {name}" if isinstance(rule, ours) else f"dlight cpu.{name}"


def describe(func, target=None) -> str:
    """How one PrimFunc will run in ``tirbyoc.pipeline(target)``, one line:

    - ``"kernel <symbol>[, ...]"``: offloaded (and what else stays in the function);
    - ``"schedule: tirbyoc RowReduction"`` (or ``tirbyoc Injective``, ``tirbyoc
      OuterParallel``, ``dlight cpu.GEMV``, ``dlight cpu.Reduction``): the first fallback
      rule that takes it (``schedule_rules``);
    - ``"already scheduled"``: marked ``tirx.is_scheduled``, left alone;
    - ``"unscheduled: <reason>"``: runs as its naive loop nest.

    Cheap: the rules are tried on a schedule of the function, nothing is built.
    ``target``: default this machine's CPU, as ``tirbyoc.compile``.
    """
    from .normalize import normalize

    normal = normalize(func)
    kernels = [n.offloaded_kernel for n in normal.nests if n.offloaded_kernel]
    if kernels:
        rest = [n for n in normal.nests if not n.offloaded_kernel]
        text = "kernel " + ", ".join(kernels)
        if rest:
            text += f"; {len(rest)} other block(s) " + (
                "scheduled beside it (tirbyoc Injective)" if func.attrs and
                "tirx.is_scheduled" in func.attrs and _rest_scheduled(func) else
                "run as written (unscheduled: not elementwise)")
        return text
    if func.attrs and "tirx.is_scheduled" in func.attrs:
        return "already scheduled"
    target = T.as_target(target)
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
    """``{global name: how it runs}`` for every PrimFunc of ``mod`` (an IRModule after
    offloading; one line each, see ``describe``). ``tirbyoc.explain`` prints it."""
    return {gv.name_hint: describe(f, target) for gv, f in mod.functions_items()
            if isinstance(f, T.PrimFunc)}


# ---- the identities of TOPI's max, min, argmax and argmin reductions ----

_FLOAT32_MAX = 3.4028234663852886e38


def _int_extreme(value) -> bool:
    """Whether ``value`` is the smallest or largest of its signed integer type."""
    dtype = T.dtype_of(value)
    if not isinstance(value, T.IntImm) or not dtype.startswith("int"):
        return False
    half = 1 << (int(dtype[3:]) - 1)
    return int(value.value) in (-half, half - 1)


def _exact_init(init):
    """A reduction's init with ±FLT_MAX as ±inf, and an argmax's / argmin's starting
    index -1 (stored beside such a value or an integer type's extreme) as 0; None when
    it has neither."""
    stores = []
    T.structural_walk(init, [(T.BufferStore, stores.append)])
    extreme = [s for s in stores if isinstance(s.value, T.FloatImm) and
               T.dtype_of(s.value) == "float32" and
               abs(float(s.value.value)) == _FLOAT32_MAX]
    index = [s for s in stores if isinstance(s.value, T.IntImm) and
             int(s.value.value) == -1]
    if not (extreme or any(_int_extreme(s.value) for s in stores)):
        index = []
    if not (extreme or index):
        return None

    def exact(store):
        if any(store.same_as(s) for s in extreme):
            value = T.const(float("inf") if float(store.value.value) > 0 else float("-inf"),
                            "float32")
        elif any(store.same_as(s) for s in index):
            value = T.const(0, T.dtype_of(store.value))
        else:
            return store
        return T.BufferStore(store.buffer, value, store.indices)

    return T.structural_map(init, [(T.BufferStore, exact)])


def exact_reduction_identities(func):
    """``func`` with its max and min reductions started at -inf and +inf (TOPI starts
    them at ∓FLT_MAX: the max of a row of -inf came out -3.4e38) and its argmax and
    argmin at index 0 (TOPI's -1 stayed where every value equals the start: the argmax
    of a row of -inf, or of the int64 minimum, was -1, an index out of bounds). A value
    equal to the start now updates nothing, so the first index stands, as in PyTorch.
    ``func`` itself when it has no such reduction."""
    def block(b):
        init = None if b.init is None else _exact_init(b.init)
        if init is None:
            return b
        return T.make_block(b.name_hint, b.body, b.reads, b.writes, b.annotations,
                            b.iter_vars, init, b.alloc_buffers, b.match_buffers)

    return T.structural_map(func, [(T.SBlock, block)])


def _nan_propagating(e):
    """A float max or min that gives NaN when either operand is NaN, as PyTorch's and
    ONNX's do. TVM compiles ``max(a, b)`` as ``a > b ? a : b``: a NaN ``b`` comes
    through, a NaN ``a`` did not (``relu(NaN)`` was 0). So ``max(a, c)`` with a constant
    is ``a < c ? c : a`` (a constant first is moved second; a maximum with -inf, a
    minimum with +inf, is its other operand), and ``max(a, b)`` of two values is
    ``isnan(a) ? a : max(a, b)`` (PyTorch's vectorized maximum also adds a NaN test and
    a blend; RWKV's recurrence, 32 maximums an element, ran 8% slower for it)."""
    if not T.dtype_of(e).startswith(("float", "bfloat")):
        return e
    a, b = (e.b, e.a) if isinstance(e.a, T.FloatImm) else (e.a, e.b)
    larger = isinstance(e, T.Max)
    if isinstance(b, T.FloatImm):
        if float(b.value) == (float("-inf") if larger else float("inf")):
            return a
        return T.Select(a < b if larger else b < a, b, a)
    return T.Select(fastmath.is_nan(a), a, e)


def _propagate_nan(expr):
    return T.structural_map(expr, [(T.Max, _nan_propagating), (T.Min, _nan_propagating)])


def nan_propagating_extremes(func):
    """``func`` with each float max and min NaN-propagating (``_nan_propagating``) but
    a reduction's own combiner (``acc = max(acc, x)``: TOPI's already keep a NaN, and
    the reduction rules recognize that form). ``func`` itself when it has none."""
    def block(b):
        body = b.body
        inner = []
        T.structural_walk(body, [(T.SBlock, inner.append)])
        if inner:  # (a block around blocks: each inner one is mapped on its own)
            return b
        if b.init is not None and isinstance(body, T.BufferStore) and \
                isinstance(body.value, (T.Max, T.Min)):
            v = body.value
            new = T.BufferStore(body.buffer, type(v)(_propagate_nan(v.a), _propagate_nan(v.b)),
                                body.indices)
        else:
            new = _propagate_nan(body)
        if new.same_as(body):
            return b
        return T.make_block(b.name_hint, new, b.reads, b.writes, b.annotations,
                            b.iter_vars, b.init, b.alloc_buffers, b.match_buffers)

    return T.structural_map(func, [(T.SBlock, block)])


def exact_identities(mod):
    """``mod`` with ``exact_reduction_identities`` and ``nan_propagating_extremes``
    applied to each of its PrimFuncs."""
    out = None
    for gv, func in mod.functions_items():
        if isinstance(func, T.PrimFunc):
            fixed = nan_propagating_extremes(exact_reduction_identities(func))
            if not fixed.same_as(func):
                out = mod.clone() if out is None else out
                out.update_func(gv, fixed)
    return mod if out is None else out
