"""Where an offloaded layer's weight comes from, and how its kernel reads it.

A Relax caller may pass a PrimFunc a weight that is

* a separate 2-D transpose of another tensor (what legalizing ``matmul(x,
  permute_dims(w))`` gives): the kernel can read the original tensor in place instead,
  with the other layout, and the transpose disappears from the program;
* a compile-time constant (model parameters bound into the module): the kernel can read
  it packed once, at compile time, into its preferred layout.

``sources(mod)`` records that per PrimFunc input (``WeightSource``); ``reroute`` changes a
matched region accordingly (a new weight param, a new layout); ``apply_reroutes`` makes
the Relax callers pass what the new params expect and drops dead transposes.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import _tvm as T
from .normalize import NormalFunc, normalize
from .relax_prep import call_args, call_tir_sites

R = T.relax_ns


@dataclass(frozen=True)
class WeightSource:
    """What every call site passes for one PrimFunc input."""

    transposed_from: object = None  # the Relax expr ``w`` when the argument is transpose(w)
    constant: object = None  # the relax.Constant the kernel would read (after untransposing)


@dataclass(frozen=True)
class Reroute:
    """How a region's weight param changes: the new param and what callers must pass."""

    param: object  # the new buffer param
    untranspose: bool  # pass the transpose's source instead of the argument
    pack: str | None  # pass the constant packed from this layout ("nt"/"nn"), or None


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


def _same(a, b) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and a.same_as(b))


def sources(mod) -> dict:
    """``{prim func name: {input index: WeightSource}}``, kept only where every call site
    of the function passes the same thing."""
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
                      and _same(ws.transposed_from, here[i].transposed_from)
                      and _same(ws.constant, here[i].constant)}
    return seen


def _flip(layout: str) -> str:
    return {"nt": "nn", "nn": "nt"}[layout]


def reroute(normal: NormalFunc, region, srcs: dict, pack: bool) -> None:
    """Let ``region``'s kernel read its weight at the source (see the module docstring).

    Only when the weight is a buffer param that nothing else in the function reads, and
    only in ways the region's intrinsic has kernels for.
    """
    w = region.dense.w
    idx = next((i for i, p in enumerate(normal.params) if p.same_as(w)), None)
    src = srcs.get(idx) if idx is not None else None
    if src is None or w.strides:
        return
    readers = [n for n in normal.nests if w in n.reads]
    if len(readers) != 1:
        return
    layout = _flip(region.layout) if src.transposed_from is not None else region.layout
    if pack and src.constant is not None and "packed" in region.intrinsic.layouts:
        from . import kernels

        n, k = (int(region.dense.n), int(region.dense.k))
        new_w = T.decl_buffer([kernels.packed_weight_size(n, k)], w.dtype, w.name)
        region.weight, region.layout = new_w, "packed"
        region.reroutes = {w: Reroute(new_w, src.transposed_from is not None, layout)}
    elif src.transposed_from is not None:
        new_w = T.decl_buffer([w.shape[1], w.shape[0]], w.dtype, w.name)
        region.weight, region.layout = new_w, layout
        region.reroutes = {w: Reroute(new_w, True, None)}


def apply_reroutes(mod, rerouted: dict):
    """Make callers pass what rerouted params expect; drop what became dead.

    ``rerouted`` maps a PrimFunc name to ``(new PrimFunc, {input index: Reroute})``. The
    new functions get fresh GlobalVars (their signatures changed).
    """
    if not rerouted:
        return mod
    from . import kernels

    base = T.IRModule({gv: f for gv, f in mod.functions_items()
                       if gv.name_hint not in rerouted}, attrs=mod.attrs)
    packed_cache: list = []  # (constant, layout, packed constant)

    def packed(const, layout):
        for c, lay, p in packed_cache:
            if c.same_as(const) and lay == layout:
                return p
        p = R.const(kernels.pack_weight(T.constant_value(const), layout))
        packed_cache.append((const, layout, p))
        return p

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
                if route.untranspose:
                    args[i] = transposed_source(mod, self.var2val, args[i])
                if route.pack:
                    args[i] = packed(args[i], route.pack)
            return T.relax_call_with_args(call, [self.new_gvs[name], R.Tuple(args)]
                                          + list(call.args[2:]))

    rewire = _Rewire(base)
    for gv, func in mod.functions_items():
        if isinstance(func, T.Function):
            rewire.var2val = R.analysis.get_var2val(func)
            rewire.builder_.update_func(gv, rewire.visit_expr(func))
    return T.dead_code_elimination()(rewire.builder_.get())
