"""Relax-level preparation around the TIR rewrite.

``prepare`` brings a Relax module to the form the matcher works on (legalized and fused,
the way TVM's default CPU pipeline does it). ``transpose_hints`` finds ``call_tir``
arguments that are a separate 2-D transpose of some tensor (what legalizing
``matmul(x, permute_dims(w))`` produces), and ``drop_absorbed_transposes`` rewires the
callers of functions whose kernel now reads that tensor in place, so the transpose copy
disappears from the program.
"""

from __future__ import annotations

from . import _tvm as T
from .normalize import normalize

R = T.relax_ns


def has_relax_functions(mod) -> bool:
    return any(isinstance(f, T.Function) for _, f in mod.functions_items())


def is_legalized(mod) -> bool:
    """True when LegalizeOps has nothing left to lower."""
    return T.structural_equal(R.transform.LegalizeOps()(mod), mod)


def prepare(mod, fuse="auto"):
    """Legalize and fuse a Relax module like the default CPU pipeline.

    ``fuse="auto"``: only a module that still has high-level Relax ops is legalized and
    fused; an already legalized module is taken as it is. ``True``: also fuse a legalized
    module. ``False``: only legalize.
    """
    if not has_relax_functions(mod):
        return mod
    legalized = is_legalized(mod)
    if fuse == "auto":
        fuse = not legalized
    if fuse:
        return T.Sequential(T.relax_default_prepare_passes())(mod)
    if not legalized:
        return R.transform.LegalizeOps()(mod)
    return mod


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


def _call_tir_sites(mod):
    """Yield (relax function, var2val, call) for every call_tir in every Relax function."""
    call_tir = T.call_tir_op()
    for _, func in mod.functions_items():
        if not isinstance(func, T.Function):
            continue
        var2val = R.analysis.get_var2val(func)
        for value in var2val.values():
            if isinstance(value, R.Call) and value.op.same_as(call_tir):
                yield func, var2val, value


def _transposed_source(mod, var2val, arg):
    """The tensor ``w`` when ``arg`` is bound to ``call_tir(transpose2d, (w,))``."""
    value = var2val.get(arg) if isinstance(arg, R.Var) else None
    if not (isinstance(value, R.Call) and value.op.same_as(T.call_tir_op())):
        return None
    callee = mod[value.args[0]]
    args = value.args[1].fields if isinstance(value.args[1], R.Tuple) else [value.args[1]]
    if len(args) == 1 and _is_transpose_2d(callee):
        return args[0]
    return None


def transpose_hints(mod) -> dict:
    """``{prim func name: set of input indices}`` passed a transpose at every call site."""
    hints: dict = {}
    for _, var2val, call in _call_tir_sites(mod):
        name = call.args[0].name_hint
        args = call.args[1].fields if isinstance(call.args[1], R.Tuple) else [call.args[1]]
        here = {i for i, a in enumerate(args) if _transposed_source(mod, var2val, a) is not None}
        hints[name] = here if name not in hints else hints[name] & here
    return hints


def drop_absorbed_transposes(mod, absorbed: dict):
    """Give the untransposed tensor to functions whose weight param was flipped.

    ``absorbed`` maps a PrimFunc name to ``(input indices, new PrimFunc)``: those params
    of the new function expect the transpose's source. The new functions get fresh
    GlobalVars (their signature changed), and dead transposes are removed afterwards.
    """
    if not absorbed:
        return mod
    base = T.IRModule({gv: f for gv, f in mod.functions_items()
                       if gv.name_hint not in absorbed}, attrs=mod.attrs)

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
            if name not in absorbed:
                return call
            flipped, new_func = absorbed[name]
            if name not in self.new_gvs:
                self.new_gvs[name] = self.builder_.add_func(new_func, name)
            args = list(call.args[1].fields)
            for i in flipped:
                args[i] = _transposed_source(mod, self.var2val, args[i])
            return T.relax_call_with_args(call, [self.new_gvs[name], R.Tuple(args)]
                                          + list(call.args[2:]))

    rewire = _Rewire(base)
    for gv, func in mod.functions_items():
        if isinstance(func, T.Function):
            rewire.var2val = R.analysis.get_var2val(func)
            rewire.builder_.update_func(gv, rewire.visit_expr(func))
    return T.dead_code_elimination()(rewire.builder_.get())
