"""Fix-ups of what TVM's frontends get wrong, run before anything else.

``torch.export`` of HuggingFace models (GPT-2, Llama: the packed-sequence check of
``transformers``' masking utilities) computes ``cumsum`` over a bool tensor, which
PyTorch evaluates in int64 (sequence ids 0, 1, 2...). TVM 0.27's frontend turns it into
``R.cumsum(x)`` with ``dtype=None``, typed bool, which LLVM codegen then fails to build
(``Check failed: t.MatchesCode(kDLFloat)`` in ``CreateAdd``), TVM's own build included.
``fix_bool_cumsum`` makes it ``R.cumsum(astype(x, int64), dtype=int64)``, PyTorch's
result, and the ops after it are typed again from there (an equality of two ids stays
an equality of ids, not of truth values).
"""

from __future__ import annotations

from . import _tvm as T

R = T.relax_ns


def _is_bool(expr) -> bool:
    ty = getattr(expr, "ty", None)
    return getattr(ty, "dtype", None) == "bool"


def _int64_cumsum(call):
    """The int64 cumsum PyTorch computes for a bool cumsum, or None."""
    if not isinstance(call, R.Call) or not isinstance(call.op, T.Op) or \
            call.op.name != "relax.cumsum" or not _is_bool(call.args[0]):
        return None
    dtype = getattr(call.attrs, "dtype", None)
    if dtype is not None and str(dtype) not in ("", "bool", "void"):
        return None  # a dtype was asked for: TVM computes in it
    axis = call.attrs.axis
    return R.op.cumsum(R.op.astype(call.args[0], "int64"),
                       axis=None if axis is None else int(axis), dtype="int64",
                       exclusive=bool(getattr(call.attrs, "exclusive", False)))


@R.expr_functor.mutator
class _FixCumsum(R.PyExprMutator):
    # NOTE: a binding whose value changes type gets a new variable of the new type, and
    # every binding after it that reads it is built and typed again (ExprMutator's
    # re-emission): the graph after the cumsum works on int64 ids from there on.
    def visit_call_(self, call):
        call = super().visit_call_(call)
        fixed = _int64_cumsum(call)
        return call if fixed is None else self.builder_.normalize(fixed)


def fix_bool_cumsum(mod):
    """``mod`` with every cumsum of a bool tensor (result typed bool) computed in int64,
    as PyTorch does; the module itself when there is none."""
    found = []
    for _, func in mod.functions_items():
        if isinstance(func, R.Function):
            T.structural_walk(func, [(R.Call, lambda c: found.append(c)
                                      if _int64_cumsum(c) is not None else None)])
    if not found:
        return mod
    out = mod.clone()
    for gv, func in mod.functions_items():
        if isinstance(func, R.Function) and not (func.attrs and "Codegen" in func.attrs):
            new = _FixCumsum(mod).visit_expr(func)
            out[gv] = new
    return out


def apply(mod):
    """Every fix-up, in order."""
    return fix_bool_cumsum(mod)
