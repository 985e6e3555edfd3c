"""Where an offloaded layer's weight comes from, and how its kernel reads it.

A Relax caller may pass a PrimFunc a weight that is

* a separate 2-D transpose of another tensor (what legalizing ``matmul(x,
  permute_dims(w))`` gives): the kernel can read the original tensor in place instead,
  with the other layout, and the transpose disappears from the program;
* a compile-time constant (model parameters bound into the module): the kernel can read
  it packed once, at compile time, into its preferred layout.

Both are *region passes*: changes that apply to offloaded regions only, never to the
layers TVM compiles itself. A region pass looks at a matched region and what its callers
pass (``WeightSource``, from ``sources(mod)``) and may return a ``Reroute``: a new weight
param and layout for the kernel, and how the caller computes the new argument from the
old one (a Relax expression). ``apply_reroutes`` rewires the callers; an argument
computed from constants only is folded at compile time (``FoldConstant`` on that
expression alone). ``untranspose``, ``fold_batch_norm`` and ``pack_constants`` are the
default passes; ``to_layout`` is an example of a user's own.

A convolution is matched before legalization (``tirbyoc.conv``), as a plan for one
kernel call. A pass with a ``conv_region`` attribute also runs on each such region, on
the plan, in the same order: ``fold_batch_norm`` folds the conv's batch norm into its
constant weight and bias, ``pack_constants`` packs that weight for the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import _tvm as T
from .normalize import NormalFunc, normalize
from .bindings import call_args, call_tir_sites

R = T.relax_ns


@dataclass(frozen=True)
class WeightSource:
    """What every call site passes for one PrimFunc input."""

    transposed_from: object = None  # the Relax expr ``w`` when the argument is transpose(w)
    constant: object = None  # the relax.Constant the kernel would read (after untransposing)


@dataclass(frozen=True)
class Reroute:
    """How a region's weight param changes: the new param and what callers must pass.

    ``argument(arg, var2val) -> Relax expr`` computes the new argument from the old one.
    ``note`` is what ``explain`` says about it.
    """

    param: object  # the new buffer param
    layout: str  # the kernel layout that reads it
    argument: Callable
    note: str = ""
    untransposes: bool = False  # the caller passes the transpose's source from now on


def _is_transpose_2d(func) -> bool:
    if not isinstance(func, T.PrimFunc):
        return False
    normal = normalize(func)
    if normal.reason or len(normal.nests) != 1 or len(normal.params) != 2:
        return False
    nest = normal.nests[0]
    store = nest.store
    if store is None or nest.kinds() != "SS" or nest.init is not None:
        return False
    inp, out = normal.params
    val = store.value
    return (store.buffer.same_as(out) and isinstance(val, T.BufferLoad)
            and val.source.same_as(inp) and len(store.indices) == 2
            and len(val.indices) == 2 and val.indices[0].same_as(store.indices[1])
            and val.indices[1].same_as(store.indices[0]) and inp.dtype == out.dtype)


def transposed_source(mod, var2val, arg):
    """The tensor ``w`` when ``arg`` is bound to ``call_tir(transpose2d, (w,))``, else None."""
    value = var2val.get(arg) if isinstance(arg, R.Var) else None
    if not (isinstance(value, R.Call) and value.op.same_as(T.call_tir_op())):
        return None
    args = call_args(value)
    if len(args) == 1 and _is_transpose_2d(mod[value.args[0]]):
        return args[0]
    return None


def _source_of(mod, var2val, arg) -> WeightSource | None:
    src = transposed_source(mod, var2val, arg)
    final = src if src is not None else arg
    const = final if isinstance(final, T.RelaxConstant) else None
    if src is None and const is None:
        return None
    return WeightSource(src, const)


def _alike(a, b) -> bool:
    return (a is None) == (b is None)


def sources(mod) -> dict:
    """``{prim func name: {input index: WeightSource}}``, kept only where every call site
    of the function passes the same kind of thing (a constant, a transpose), not
    necessarily the same one: layers of one shape share a PrimFunc (GPT-2's two blocks
    call one ``fused_matmul_add``), and a reroute computes each site's argument from
    that site's own (``apply_reroutes``). The WeightSource kept is the first site's."""
    seen: dict = {}
    for var2val, call, args in call_tir_sites(mod):
        name = call.args[0].name_hint
        here = {}
        for i, a in enumerate(args):
            ws = _source_of(mod, var2val, a)
            if ws is not None:
                here[i] = ws
        if name not in seen:
            seen[name] = here
            continue
        seen[name] = {i: ws for i, ws in seen[name].items() if i in here
                      and _alike(ws.transposed_from, here[i].transposed_from)
                      and _alike(ws.constant, here[i].constant)}
    return seen


def _flip(layout: str) -> str:
    return {"nt": "nn", "nn": "nt"}[layout]


def untranspose(normal: NormalFunc, region, source: WeightSource):
    """Read the source of a separate transpose in place (layout flip); the transpose goes."""
    if source.transposed_from is None or region.layout not in ("nt", "nn") or region.reroutes:
        return None
    w = region.weight
    new_w = T.decl_buffer([w.shape[1], w.shape[0]], w.dtype, w.name)
    return Reroute(new_w, _flip(region.layout),
                   lambda arg, var2val, mod: transposed_source(mod, var2val, arg),
                   "reads the untransposed weight in place", untransposes=True)


def pack_constants(normal: NormalFunc, region, source: WeightSource):
    """Pack a constant weight once, at compile time, into the kernel's preferred layout."""
    if source.constant is None or region.layout not in ("nt", "nn") or \
            "packed" not in region.intrinsic.layouts:
        return None
    from . import kernels

    layout = region.layout
    n, k = int(region.dense.n), int(region.dense.k)
    new_w = T.decl_buffer([kernels.packed_weight_size(n, k)], region.weight.dtype,
                          region.weight.name)

    def argument(arg, var2val, mod):
        return R.const(kernels.pack_weight(T.constant_value(folded(arg)), layout))

    return Reroute(new_w, "packed", argument,
                   f"constant weight packed at compile time from {layout.upper()}")


def to_layout(layout: str):
    """A region pass that makes the kernel read its weight in ``layout`` ("nt"/"nn"); the
    caller passes ``permute_dims(weight)``, folded at compile time for constants."""

    def region_pass(normal: NormalFunc, region, source: WeightSource):
        if region.layout == layout or region.layout not in ("nt", "nn"):
            return None
        w = region.weight
        new_w = T.decl_buffer([w.shape[1], w.shape[0]], w.dtype, w.name)
        return Reroute(new_w, layout,
                       lambda arg, var2val, mod: R.op.permute_dims(arg, [1, 0]),
                       f"weight permuted to {layout.upper()} for the kernel")

    return region_pass


def fold_batch_norm(normal: NormalFunc, region, source: WeightSource):
    """Fold an inference-mode batch norm that follows an offloaded convolution into the
    conv's constant weight and bias at compile time (its ``conv_region`` form; see
    ``tirbyoc.conv.fold_batch_norm``). Without this pass a conv region ends before its
    batch norm, which TVM then computes. Dense regions: nothing to do."""
    return None


DEFAULT_PASSES = (untranspose, fold_batch_norm, pack_constants)


def reroute(normal: NormalFunc, region, srcs: dict, passes) -> None:
    """Run the region passes on ``region`` in order; each sees the result of the last.

    Only when the weight is a buffer param that nothing else in the function reads.
    """
    w = region.dense.w
    if region.dense.nbatch or len(w.shape) != 2:
        return  # a batched (or broadcast) weight is read as it is
    idx = next((i for i, p in enumerate(normal.params) if p.same_as(w)), None)
    if idx is None or w.strides or len([n for n in normal.nests if w in n.reads]) != 1:
        return
    source = srcs.get(idx, WeightSource())
    routes = []
    for region_pass in passes:
        route = region_pass(normal, region, source)
        if route is None:
            continue
        routes.append(route)
        region.weight, region.layout = route.param, route.layout
        if route.untransposes:
            source = WeightSource(None, source.constant)
    if routes:
        region.reroutes = {w: _compose(routes)}


def _compose(routes) -> Reroute:
    def argument(arg, var2val, mod):
        for route in routes:
            arg = route.argument(arg, var2val, mod)
        return arg

    last = routes[-1]
    return Reroute(last.param, last.layout, argument, "; ".join(r.note for r in routes))


def folded(expr):
    """``expr`` evaluated at compile time when it depends on constants only, else as is."""
    if isinstance(expr, T.RelaxConstant) or R.analysis.free_vars(expr):
        return expr
    bb = R.BlockBuilder()
    with bb.function("main", []):
        bb.emit_func_output(bb.emit(expr))
    mod = R.transform.LegalizeOps()(bb.get())
    mod = R.transform.FoldConstant()(mod)
    body = mod["main"].body
    value = body.body if hasattr(body, "body") else body
    if isinstance(value, R.Var):
        value = R.analysis.get_var2val(mod["main"]).get(value, value)
    return value if isinstance(value, T.RelaxConstant) else expr


def apply_reroutes(mod, rerouted: dict):
    """Make callers pass what rerouted params expect; drop what became dead.

    ``rerouted`` maps a PrimFunc name to ``(new PrimFunc, {input index: Reroute})``. The
    new functions get fresh GlobalVars (their signatures changed).
    """
    if not rerouted:
        return mod
    base = T.IRModule({gv: f for gv, f in mod.functions_items()
                       if gv.name_hint not in rerouted}, attrs=mod.attrs)
    folded_cache: list = []  # (argument, route, new argument): shared weights fold once

    def new_argument(arg, route, var2val):
        for old, r, new in folded_cache:
            if old.same_as(arg) and r is route:
                return new
        new = folded(route.argument(arg, var2val, mod))
        folded_cache.append((arg, route, new))
        return new

    @R.expr_functor.mutator
    class _Rewire(R.PyExprMutator):
        def __init__(self, module):
            super().__init__(module)
            self.var2val = {}
            self.new_gvs = {}

        def visit_call_(self, call):  # noqa: N802 (TVM's visitor naming)
            call = super().visit_call_(call)
            if not call.op.same_as(T.call_tir_op()):
                return call
            name = call.args[0].name_hint
            if name not in rerouted:
                return call
            new_func, routes = rerouted[name]
            if name not in self.new_gvs:
                self.new_gvs[name] = self.builder_.add_func(new_func, name)
            args = call_args(call)
            for i, route in routes.items():
                args[i] = new_argument(args[i], route, self.var2val)
            return T.relax_call_with_args(call, [self.new_gvs[name], R.Tuple(args)]
                                          + list(call.args[2:]))

    rewire = _Rewire(base)
    for gv, func in mod.functions_items():
        if isinstance(func, T.Function):
            rewire.var2val = R.analysis.get_var2val(func)
            rewire.builder_.update_func(gv, rewire.visit_expr(func))
    return T.dead_code_elimination()(rewire.builder_.get())
