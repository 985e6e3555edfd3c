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
from .intrinsic import Intrinsic, NoMatch, StepContext
from .normalize import Nest, NormalFunc


@dataclass
class Dense:
    """A recognized ``C[rows, n] += A[rows, k] * W`` reduction nest."""

    nest: Nest
    a: object
    w: object
    c: object
    layout: str  # "nt" (W[n, k]) or "nn" (W[k, n])
    rows: list  # Iter, in output order
    col: object  # Iter
    red: object  # Iter
    dtype: str
    lda: object
    ldw: object

    @property
    def m(self):
        m = self.rows[0].extent
        for r in self.rows[1:]:
            m = m * r.extent
        return m

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
        return [self.dense.nest] + [n for _, n, _ in self.steps]

    @property
    def symbol(self) -> str:
        return self.intrinsic.symbol(self.dense.dtype, self.layout)

    def capture(self, name):
        for _, _, sm in self.steps:
            if name in sm.captures:
                return sm.captures[name]
        return None


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
    row_vars = [r.var for r in rows]
    a_load = w_load = None
    for x, y in (loads, loads[::-1]):
        if _is_load(x, x.source, row_vars + [k.var]):
            a_load, w_load = x, y
            break
    if a_load is None:
        return NoMatch("no operand is read as A[rows.., k]")
    a, w = a_load.source, w_load.source
    if len(w_load.indices) != 2:
        return NoMatch("the weight is not a 2-D matrix (batched weights are not offloaded)")
    if _is_load(w_load, w, [col.var, k.var]):
        layout = "nt"
    elif _is_load(w_load, w, [k.var, col.var]):
        layout = "nn"
    else:
        return NoMatch("the weight is not read as W[n, k] or W[k, n]")
    if a.same_as(c) or w.same_as(c):
        return NoMatch("the output aliases an input")
    for buf in (a, w, c):
        if buf.dtype not in dtypes:
            return NoMatch(f"no kernel for dtype {buf.dtype} (buffer {buf.name})")
    if len({a.dtype, w.dtype, c.dtype}) != 1:
        return NoMatch("mixed dtypes between activation, weight and output")
    an = T.analyzer()
    # NOTE: the kernel sees A, C as [M, K] / [M, N] row-major matrices: their leading
    # dims must be exactly the row extents so that they collapse into M rows.
    for buf, inner in ((a, k.extent), (c, col.extent)):
        if len(buf.shape) != len(rows) + 1:
            return NoMatch(f"buffer {buf.name} has a different rank than the iteration")
        for dim, r in zip(buf.shape[:-1], rows):
            if not an.can_prove_equal(dim, r.extent):
                return NoMatch(f"buffer {buf.name} is larger than the iteration in a row "
                               "dimension")
    if not an.can_prove_equal(c.shape[-1], col.extent):
        return NoMatch(f"the output {c.name} is wider than the iteration")
    w_n, w_k = (w.shape[0], w.shape[1]) if layout == "nt" else (w.shape[1], w.shape[0])
    if not (an.can_prove_equal(w_n, col.extent) and an.can_prove_equal(w_k, k.extent)):
        return NoMatch("the weight's shape differs from the iteration")
    lda, ldw = row_stride(a, len(rows), an), row_stride(w, 1, an)
    for stride in (lda, ldw, row_stride(c, len(rows), an)):
        if isinstance(stride, NoMatch):
            return stride
    return Dense(nest, a, w, c, layout, rows, col, k, dtype, lda, ldw)


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
    reasons, stops = [], []
    for intr in intrinsics:
        if dense.dtype not in intr.dtypes:
            reasons.append(f"{intr.name}: no {dense.dtype} kernel")
            continue
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
        region.stopped = _longer_fusion_stops(intr, stops)
        weights.reroute(normal, region, sources or {}, passes)
        return region
    return NoMatch("; ".join(reasons) if reasons else "no intrinsic registered")


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
