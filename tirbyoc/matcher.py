"""Match normalized nests against the registered intrinsics.

``match_func(normal, intrinsics)`` walks the nests of one PrimFunc. For every reduction
nest (a candidate) it returns either a ``Region`` (the dense nest, the epilogue nests
that the chosen intrinsic fuses, and everything the rewrite needs) or a ``NoMatch``.

A region is only accepted when the kernel computes exactly what the nests computed:
float types the kernel has, a plain ``C += A * W`` reduction with zero init, the weight
read as W[n, k] or W[k, n], unit inner strides, intermediates that nothing else reads,
and no other nest in between that writes an input or touches the output.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import _tvm as T
from . import weights
from .epilogues import UNARY_OPS, UNARY_STEPS, identify_unary
from .intrinsic import Intrinsic, NoMatch, StepContext
from .normalize import Nest, NormalFunc


@dataclass
class Dense:
    """A recognized ``C[batch.., rows.., n] += A[batch.., rows.., k] * W[batch.., ...]`` nest.

    ``rows`` are all output iterators but the last (``col``); the first ``nbatch`` of them
    are batch dimensions (the weight is indexed by them too), the rest collapse into the
    kernel's M rows. ``sa``/``sw``/``sc``: the element distance between consecutive
    batches of A, W and C once the batch dimensions collapse into one (0: broadcast).
    """

    nest: Nest
    a: object
    w: object
    c: object
    layout: str  # "nt" (W[.., n, k]) or "nn" (W[.., k, n])
    rows: list  # Iter, in output order
    col: object  # Iter
    red: object  # Iter
    dtype: str
    lda: object
    ldw: object
    nbatch: int = 0
    sa: object = 0
    sw: object = 0
    sc: object = 0

    @property
    def batch(self):
        return _product([r.extent for r in self.rows[:self.nbatch]])

    @property
    def m(self):
        return _product([r.extent for r in self.rows[self.nbatch:]])

    @property
    def n(self):
        return self.col.extent

    @property
    def k(self):
        return self.red.extent


@dataclass
class Region:
    """A matched region: the dense nest plus the epilogue nests one kernel fuses."""

    intrinsic: Intrinsic
    dense: Dense
    steps: list  # (EpilogueStep, Nest, StepMatch)
    out: object  # the buffer the kernel writes
    weight: object  # the buffer the kernel reads as weight (may be a new param)
    layout: str
    stopped: str | None = None  # why the epilogue chain did not go further
    reroutes: dict = field(default_factory=dict)  # old weight param -> weights.Reroute

    def __repr__(self) -> str:
        return f"Region({self.intrinsic.name}, {self.symbol}, {self.nests})"

    @property
    def nests(self) -> list:
        """The dense nest and every nest of the epilogue, in program order."""
        out = [self.dense.nest]
        for _, n, sm in self.steps:
            out.extend(sm.nests)
            out.append(n)
        return sorted(out, key=lambda n: n.index)

    @property
    def symbol(self) -> str:
        return self.intrinsic.symbol(self.dense.dtype, self.layout)

    def capture(self, name):
        for _, _, sm in self.steps:
            if name in sm.captures:
                return sm.captures[name]
        return None


def _product(extents):
    if not extents:
        return T.const(1, "int64")
    out = extents[0]
    for e in extents[1:]:
        out = out * e
    return out


def _is_load(expr, buf, indices) -> bool:
    if not isinstance(expr, T.BufferLoad) or not expr.source.same_as(buf):
        return False
    if len(expr.indices) != len(indices):
        return False
    return all(a.same_as(b) for a, b in zip(expr.indices, indices))


def row_stride(buf, ndim_rows: int, an):
    """Element stride between consecutive rows once the leading ``ndim_rows`` dims collapse.

    A NoMatch when the inner stride is not 1 or the row dims do not collapse into one.
    """
    shape, strides = list(buf.shape), list(buf.strides)
    if not strides:
        return shape[-1]
    if not an.can_prove_equal(strides[-1], 1):
        return NoMatch(f"buffer {buf.name} has a non-unit inner stride")
    for i in range(len(shape) - 1 - ndim_rows, len(shape) - 2):
        if not an.can_prove_equal(strides[i], strides[i + 1] * shape[i + 1]):
            return NoMatch(f"buffer {buf.name}: its row dimensions do not collapse into one")
    return strides[-2]


def match_dense(nest: Nest, dtypes) -> Dense | NoMatch:
    """Recognize ``C[rows.., n] = C[rows.., n] + A[rows.., k] * W[n, k] (or W[k, n])``."""
    if nest.reason:
        return NoMatch(nest.reason)
    red = nest.reduction()
    if len(red) != 1:
        return NoMatch(f"{len(red)} reduction iterators (a dense has exactly one)")
    spatial = nest.spatial()
    if len(spatial) < 2:
        return NoMatch("fewer than two spatial iterators (not a matrix product)")
    store, init = nest.store, nest.init
    c = store.buffer
    out_vars = list(store.indices)
    by_var = {i.var: i for i in nest.iters}
    if not all(isinstance(v, T.Var) and v in by_var and by_var[v].kind == "S" for v in out_vars) \
            or len(out_vars) != len(spatial) or len(set(out_vars)) != len(out_vars):
        return NoMatch("the output is not indexed by the spatial iterators, each once")
    rows, col, k = [by_var[v] for v in out_vars[:-1]], by_var[out_vars[-1]], red[0]
    dtype = c.dtype
    if init is None or not init.buffer.same_as(c) or \
            not all(a.same_as(b) for a, b in zip(init.indices, out_vars)):
        return NoMatch("no init of the output (not a fresh accumulation)")
    iv = init.value
    if not (isinstance(iv, (T.FloatImm, T.IntImm)) and float(iv.value) == 0.0):
        return NoMatch("the reduction starts from a non-zero value")
    value = store.value
    if not isinstance(value, T.Add):
        return NoMatch(f"the reduction update is not an add ({type(value).__name__})")
    if _is_load(value.a, c, out_vars):
        prod = value.b
    elif _is_load(value.b, c, out_vars):
        prod = value.a
    else:
        return NoMatch("the reduction does not accumulate into its output")
    if not isinstance(prod, T.Mul):
        return NoMatch("the accumulated term is not a product")
    loads = [prod.a, prod.b]
    if not all(isinstance(x, T.BufferLoad) for x in loads):
        if any(isinstance(x, T.Cast) for x in loads):
            return NoMatch("an operand is cast before the multiply (mixed precision)")
        return NoMatch("the product has an extra factor (e.g. a scale); not A * W")
    an = T.analyzer()
    row_vars = [r.var for r in rows]
    # NOTE: W is the operand indexed by the output column; A is indexed by the rows.
    a_load = w_load = None
    for x, y in (loads, loads[::-1]):
        if len(x.indices) and x.indices[-1].same_as(k.var) and \
                not any(e.same_as(col.var) for e in x.indices):
            a_load, w_load = x, y
            break
    if a_load is None:
        return NoMatch("no operand is read as A[rows.., k]")
    a, w = a_load.source, w_load.source
    w_idx = list(w_load.indices)
    if len(w_idx) >= 2 and w_idx[-2].same_as(col.var) and w_idx[-1].same_as(k.var):
        layout = "nt"
    elif len(w_idx) >= 2 and w_idx[-2].same_as(k.var) and w_idx[-1].same_as(col.var):
        layout = "nn"
    else:
        return NoMatch("the weight is not read as W[n, k] or W[k, n]")
    used = [i for i, v in enumerate(row_vars) if any(e.same_as(v) for e in w_idx[:-2])]
    nbatch = max(used) + 1 if used else 0
    nm = len(rows) - nbatch
    a_idx = list(a_load.indices)
    if len(a_idx) < nm + 1 or not all(e.same_as(v) for e, v in
                                      zip(a_idx[len(a_idx) - 1 - nm:-1], row_vars[nbatch:])):
        return NoMatch("no operand is read as A[rows.., k]")
    a_lead, w_lead = a_idx[:len(a_idx) - 1 - nm], w_idx[:-2]
    for buf, lead in ((a, a_lead), (w, w_lead)):
        why = _batch_lead(buf, lead, rows[:nbatch], an)
        if why:
            return NoMatch(why)
    if a.same_as(c) or w.same_as(c):
        return NoMatch("the output aliases an input")
    for buf in (a, w, c):
        if buf.dtype not in dtypes:
            return NoMatch(f"no kernel for dtype {buf.dtype} (buffer {buf.name})")
    if len({a.dtype, w.dtype, c.dtype}) != 1:
        return NoMatch("mixed dtypes between activation, weight and output")
    # NOTE: the kernel sees A, C as [M, K] / [M, N] row-major matrices per batch: their
    # row dims must be exactly the row extents so that they collapse into M rows.
    for dim, r in zip(a.shape[len(a.shape) - 1 - nm:-1], rows[nbatch:]):
        if not an.can_prove_equal(dim, r.extent):
            return NoMatch(f"buffer {a.name} is larger than the iteration in a row dimension")
    if len(c.shape) != len(rows) + 1:
        return NoMatch(f"buffer {c.name} has a different rank than the iteration")
    for dim, r in zip(c.shape[:-1], rows):
        if not an.can_prove_equal(dim, r.extent):
            return NoMatch(f"buffer {c.name} is larger than the iteration in a row dimension")
    if not an.can_prove_equal(c.shape[-1], col.extent):
        return NoMatch(f"the output {c.name} is wider than the iteration")
    w_n, w_k = (w.shape[-2], w.shape[-1]) if layout == "nt" else (w.shape[-1], w.shape[-2])
    if not (an.can_prove_equal(w_n, col.extent) and an.can_prove_equal(w_k, k.extent)):
        return NoMatch("the weight's shape differs from the iteration")
    lda = row_stride(a, nm, an) if nm else k.extent
    ldw = row_stride(w, 1, an)
    for stride in (lda, ldw, row_stride(c, nm, an) if nm else 1):
        if isinstance(stride, NoMatch):
            return stride
    strides = [batch_stride(buf, lead, rows[:nbatch], an) for buf, lead in
               ((a, a_lead), (w, w_lead), (c, list(out_vars[:nbatch])))]
    for st in strides:
        if isinstance(st, NoMatch):
            return st
    return Dense(nest, a, w, c, layout, rows, col, k, dtype, lda, ldw, nbatch, *strides)


def _is_zero_index(e) -> bool:
    return isinstance(e, T.IntImm) and int(e.value) == 0


def _batch_lead(buf, lead, batch, an) -> str | None:
    """Why the leading (batch) indices of an operand are not batch iterators or broadcasts.

    ``lead`` lines up with the last ``len(lead)`` batch dimensions; each index is that
    dimension's iterator, or 0 over a dimension of size 1 (a broadcast).
    """
    off = len(batch) - len(lead)
    for j, e in enumerate(lead):
        d = off + j
        if d >= 0 and e.same_as(batch[d].var):
            continue
        if _is_zero_index(e) and an.can_prove_equal(buf.shape[j], 1):
            continue
        return (f"buffer {buf.name} is not indexed by the batch iterators in its leading "
                "dimensions")
    return None


def _strides(buf):
    if buf.strides:
        return list(buf.strides)
    out, acc = [], T.const(1, "int64")
    for dim in reversed(list(buf.shape)):
        out.append(acc)
        acc = acc * dim
    return out[::-1]


def batch_stride(buf, lead, batch, an):
    """The element distance between consecutive batches of ``buf`` once the batch
    dimensions collapse into one (0 when broadcast), or a NoMatch.

    ``lead``: the indices of ``buf``'s leading dimensions (lined up with the last
    ``len(lead)`` batch dimensions, see ``_batch_lead``).
    """
    if not batch:
        return T.const(0, "int64")
    strides, off = _strides(buf), len(batch) - len(lead)
    per_dim = []
    for d, it in enumerate(batch):
        j = d - off
        hit = j >= 0 and lead[j].same_as(it.var)
        per_dim.append(strides[j] if hit else T.const(0, "int64"))
    live = [(s, it.extent) for s, it in zip(per_dim, batch)
            if not an.can_prove_equal(it.extent, 1)]
    for (s0, _), (s1, e1) in zip(live, live[1:]):
        if not an.can_prove_equal(s0, s1 * e1):
            return NoMatch(f"buffer {buf.name}: its batch dimensions do not collapse into one "
                           "(a broadcast over an inner batch dimension)")
    return live[-1][0] if live else T.const(0, "int64")


def _consumer_context(nest: Nest, prev_buf, dense: Dense, value) -> StepContext | NoMatch:
    """Check ``nest`` is elementwise over the dense output and build its step context."""
    if nest.reason:
        return NoMatch(nest.reason)
    if nest.reduction():
        return NoMatch("the consumer is a reduction")
    out_vars = list(nest.store.indices)
    iters = nest.spatial()
    if len(out_vars) != len(iters) or len(out_vars) != len(dense.rows) + 1:
        return NoMatch("the consumer is not elementwise over the dense output")
    by_var = {i.var: i for i in iters}
    if not all(isinstance(v, T.Var) and v in by_var for v in out_vars) or \
            len(set(out_vars)) != len(out_vars):
        return NoMatch("the consumer's output is not indexed by its iterators, each once")
    an = T.analyzer()
    for v, ext in zip(out_vars, [r.extent for r in dense.rows] + [dense.col.extent]):
        if not an.can_prove_equal(by_var[v].extent, ext):
            return NoMatch("the consumer iterates over a different shape")
    out = nest.store.buffer
    for dim, ext in zip(out.shape, [r.extent for r in dense.rows] + [dense.col.extent]):
        if not an.can_prove_equal(dim, ext):
            return NoMatch(f"the consumer's output {out.name} has a different shape")
    if out.dtype != dense.dtype:
        return NoMatch(f"the consumer changes the dtype to {out.dtype}")
    stride = row_stride(out, len(dense.rows), an)
    if isinstance(stride, NoMatch):
        return stride

    def is_input(expr) -> bool:
        return _is_load(expr, prev_buf, out_vars)

    unit_rows = tuple(v for v in out_vars[:-1] if an.can_prove_equal(by_var[v].extent, 1))
    return StepContext(value, is_input, tuple(out_vars[:-1]), out_vars[-1], dense.dtype,
                       unit_rows)


def _epilogue_chain(normal: NormalFunc, dense: Dense, steps_wanted):
    """The longest run of consumer nests matching the epilogue steps in order."""
    alloc = set(normal.root.alloc_buffers)
    chain, prev_buf, stopped = [], dense.c, None
    nests = normal.nests
    for step in steps_wanted:
        if prev_buf not in alloc:
            # NOTE: the natural end of a region (its result leaves the function): no reason.
            break
        writers = [n for n in nests if prev_buf in n.writes]
        readers = [n for n in nests if prev_buf in n.reads and n not in writers]
        if len(readers) != 1 or len(writers) != 1:
            stopped = f"{prev_buf.name} is used by more than one consumer"
            break
        consumer = readers[0]
        if consumer.index <= (chain[-1][1].index if chain else dense.nest.index):
            stopped = f"{prev_buf.name} is read before it is written"
            break
        if consumer.store is None:
            stopped = f"consumer {consumer.name}: {consumer.reason or 'not a single store'}"
            break
        ctx = _consumer_context(consumer, prev_buf, dense, consumer.store.value)
        if not ctx:
            stopped = f"consumer {consumer.name}: {ctx.reason}"
            break
        sm = step.match(ctx)
        if not sm:
            stopped = f"consumer {consumer.name} is not a {step.name}: {sm.reason}"
            break
        # NOTE: an operand of the step that the region itself writes (e.g. adding the
        # matmul result to itself) would be read before the kernel produced it.
        written = [dense.c, consumer.store.buffer] + [n.store.buffer for _, n, _ in chain]
        if any(b.same_as(x) for b in sm.captures.values() for x in written):
            stopped = f"consumer {consumer.name} reads a buffer the region writes as an operand"
            break
        chain.append((step, consumer, sm))
        prev_buf = consumer.store.buffer
    return chain, stopped


# A unary operation written as more blocks than this is not looked for.
MAX_GROUP = 24


def _unary_group(normal: NormalFunc, dense: Dense, source, after: int):
    """``(sink nest, StepMatch)`` when the elementwise blocks that read ``source`` (and
    each other's results) compute one unary operation the kernels have, else a NoMatch.

    The group must consume ``source`` entirely: every block that reads ``source`` or an
    intermediate of the group belongs to it, and only the sink's result leaves it.
    """
    alloc = set(normal.root.alloc_buffers)
    nests = [n for n in normal.nests if n.index > after]
    produced, group = {source}, []
    while len(group) < MAX_GROUP:
        grew = False
        for n in nests:
            reads = n.reads - n.writes
            if n in group or n.store is None or n.reason or not (reads & produced) or \
                    not reads <= produced or len(n.writes) != 1:
                continue
            if not _consumer_context(n, source, dense, n.store.value):
                continue
            group.append(n)
            produced.add(n.store.buffer)
            grew = True
        if not grew:
            break
    group.sort(key=lambda n: n.index)
    if not group:
        return NoMatch(f"no elementwise block reads {source.name} alone")
    for sink in group:
        members = _ancestors(group, sink, source)
        inner = {source} | {n.store.buffer for n in members if n is not sink}
        if not all(b in alloc for b in inner):
            continue
        readers = [n for n in normal.nests if (n.reads - n.writes) & inner]
        if any(n not in members for n in readers):
            continue
        sm = identify_unary(members, source, sink)
        if sm:
            return sink, sm
    return NoMatch(f"the elementwise blocks after {source.name} compute no unary operation "
                   f"the kernel has ({', '.join(UNARY_OPS)})")


def _ancestors(group, sink, source):
    """``sink`` and the group members it depends on, in program order."""
    need, keep = set(sink.reads - sink.writes), [sink]
    for n in sorted(group, key=lambda n: -n.index):
        if n is not sink and n.index < sink.index and n.store.buffer in need:
            keep.append(n)
            need |= n.reads - n.writes
    need.discard(source)
    return sorted(keep, key=lambda n: n.index)


def _chain_run(normal: NormalFunc, dense: Dense, intr: Intrinsic):
    """The longest run of consumers a chain intrinsic fuses, read one operation at a time:
    a single-block step of ``intr.chain``, or a unary operation spanning several blocks."""
    alloc = set(normal.root.alloc_buffers)
    chain, prev_buf, stopped, last = [], dense.c, None, dense.nest.index
    nests = normal.nests
    while True:
        if prev_buf not in alloc:
            break  # the natural end of a region: its result leaves the function
        writers = [n for n in nests if prev_buf in n.writes]
        readers = [n for n in nests if prev_buf in n.reads and n not in writers]
        if len(writers) != 1 or not readers:
            stopped = f"{prev_buf.name} is written more than once" if readers else None
            break
        found, why = None, []
        if len(readers) > 1:
            why.append(f"{prev_buf.name} is used by more than one consumer")
        if len(readers) == 1 and readers[0].index > last and readers[0].store is not None:
            consumer = readers[0]
            ctx = _consumer_context(consumer, prev_buf, dense, consumer.store.value)
            if not ctx:
                why.append(ctx.reason)
            else:
                for step in intr.chain:
                    sm = step.match(ctx)
                    if not sm:
                        why.append(f"not a {step.name} ({sm.reason})")
                        continue
                    why_not = _chain_conflict(intr, chain, (step, consumer, sm), dense)
                    if why_not:
                        why.append(f"a {step.name}, but {why_not}")
                        continue
                    found = (step, consumer, sm)
                    break
        if found is None:
            group = _unary_group(normal, dense, prev_buf, last)
            if group:
                sink, sm = group
                candidate = (UNARY_STEPS[sm.params["op"]], sink, sm)
                why_not = _chain_conflict(intr, chain, candidate, dense)
                if why_not:
                    why.append(f"a {sm.params['op']}, but {why_not}")
                else:
                    found = candidate
            else:
                why.append(group.reason)
        if found is None:
            stopped = f"after {prev_buf.name}: " + "; ".join(why)
            break
        step, consumer, sm = found
        chain.append(found)
        prev_buf, last = consumer.store.buffer, consumer.index
    return chain, stopped


def _chain_conflict(intr, chain, found, dense) -> str | None:
    """Why ``found`` cannot join ``chain``: it reads what the region writes, or the kernel
    cannot take the longer chain (``intr.check``)."""
    _, consumer, sm = found
    written = [dense.c, consumer.store.buffer] + [n.store.buffer for _, n, _ in chain]
    if any(b.same_as(x) for b in sm.captures.values() for x in written):
        return "it reads a buffer the region writes as an operand"
    return intr.check(chain + [found]) if intr.check else None


def _hazard(normal: NormalFunc, region_nests, inputs, out) -> str | None:
    """Why moving the region's work to the position of its last nest is unsafe, or None."""
    first, last = region_nests[0].index, region_nests[-1].index
    inside = {n.index for n in region_nests}
    for n in normal.nests[first + 1:last]:
        if n.index in inside:
            continue
        for buf in inputs:
            if buf in n.writes:
                return f"{n.name} writes {buf.name} between the dense and its epilogue"
        if out in n.reads or out in n.writes:
            return f"{n.name} touches {out.name} between the dense and its epilogue"
    for buf in inputs:
        if buf.same_as(out):
            return f"the kernel output {out.name} aliases one of its inputs"
    return None


def _longer_fusion_stops(chosen, stops) -> str | None:
    """Why the longer fusions that start like ``chosen`` did not apply (for explain)."""
    by_reason: dict = {}
    for intr, why in stops:
        n = len(chosen.epilogue)
        if why and len(intr.epilogue) > n and intr.epilogue[:n] == chosen.epilogue:
            by_reason.setdefault(why, []).append(intr.name)
    if not by_reason:
        return None
    return "; ".join(f"{', '.join(names)}: {why}" for why, names in by_reason.items())


def match_region(normal: NormalFunc, nest: Nest, intrinsics, sources=None,
                 passes=weights.DEFAULT_PASSES) -> Region | NoMatch:
    """Match one candidate nest against the intrinsics (first full match wins).

    ``sources``: ``{buffer param index: weights.WeightSource}`` from the Relax callers;
    ``passes``: the region passes (``tirbyoc.weights``) to run on a matched region.
    """
    dtypes = {d for intr in intrinsics for d in intr.dtypes}
    dense = match_dense(nest, dtypes)
    if not dense:
        return dense
    # NOTE: intrinsics are tried in registry order (longest fusion first); the first
    # one whose whole epilogue chain is present wins.
    reasons, stops, chain_stop = [], [], None
    fixed = {(i.library, tuple(s.name for s in i.epilogue)) for i in intrinsics
             if i.chain is None}
    for intr in intrinsics:
        if dense.dtype not in intr.dtypes:
            reasons.append(f"{intr.name}: no {dense.dtype} kernel")
            continue
        if dense.nbatch and not intr.batched:
            reasons.append(f"{intr.name}: the weight is batched")
            continue
        if intr.chain is not None:
            chain, stopped = _chain_run(normal, dense, intr)
            names = tuple(step.name for step, _, _ in chain)
            if not dense.nbatch and (intr.library, names) in fixed:
                chain_stop = stopped
                continue  # an intrinsic of its own computes exactly this chain
            if not intr.builtin and names != tuple(s.name for s in intr.epilogue):
                # a declared kernel computes its epilogue exactly, no more, no less
                have = " + ".join(names) or "nothing"
                reasons.append(f"{intr.qualified}: computes "
                               f"{' + '.join(s.name for s in intr.epilogue) or 'no epilogue'}"
                               f", the region has {have} after the product"
                               + (f" ({stopped})" if stopped else ""))
                continue
            intr = intr.derive(chain, dense)
        else:
            chain, stopped = _epilogue_chain(normal, dense, intr.epilogue)
            if len(chain) != len(intr.epilogue):
                stops.append((intr, stopped))
                reasons.append(f"{intr.name}: {stopped or 'the result is a function output'}")
                continue
        out = chain[-1][1].store.buffer if chain else dense.c
        region = Region(intr, dense, chain, out, dense.w, dense.layout)
        inputs = [dense.a, dense.w] + [b for _, _, sm in chain for b in sm.captures.values()]
        hazard = _hazard(normal, region.nests, inputs, out)
        if hazard:
            reasons.append(f"{intr.name}: {hazard}")
            continue
        # NOTE: the chain intrinsic read furthest; its stop is the one that says most.
        region.stopped = stopped if intr.chain is not None else (
            chain_stop or _longer_fusion_stops(intr, stops))
        weights.reroute(normal, region, sources or {}, _passes_for(intr, passes))
        if region.layout not in intr.layouts:
            reasons.append(f"{intr.qualified}: the kernel reads its weight "
                           f"{'/'.join(x.upper() for x in intr.layouts)}; this weight is "
                           f"{region.layout.upper()} and is not a parameter that only this "
                           "layer reads (it cannot be permuted for it)")
            continue
        why = intr.accepts(region) if intr.accepts is not None else None
        if why:
            reasons.append(f"{intr.qualified}: {why}")
            continue
        return region
    return NoMatch("; ".join(reasons) if reasons else "no intrinsic registered")


def _passes_for(intr: Intrinsic, passes) -> tuple:
    """The region passes of a region ``intr`` computes: ``passes``, and for a kernel that
    reads its weight in one layout only, a last pass that permutes the weight to it
    (folded at compile time for a constant)."""
    passes = tuple(passes)
    if len(intr.layouts) == 1 and intr.layouts[0] in ("nt", "nn"):
        passes += (weights.to_layout(intr.layouts[0]),)
    return passes


def candidates(normal: NormalFunc):
    """Nests that could be a dense core: reduction nests not yet offloaded."""
    return [n for n in normal.nests
            if n.offloaded_kernel is None and any(i.kind == "R" for i in n.iters)]


def match_func(normal: NormalFunc, intrinsics, sources=None, passes=weights.DEFAULT_PASSES):
    """Match every candidate of one function: a list of (nest, Region | NoMatch).

    Regions never overlap: a nest already claimed by an earlier region is not reused.
    """
    results, claimed = [], set()
    for nest in candidates(normal):
        res = match_region(normal, nest, intrinsics, sources, passes)
        if res and any(n.index in claimed for n in res.nests):
            res = NoMatch("overlaps a region that was already matched")
        if res:
            claimed.update(n.index for n in res.nests)
        results.append((nest, res))
    return results
