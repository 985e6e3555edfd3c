"""Relax-level preparation: bring a module to the form the matcher works on.

``prepare`` legalizes and fuses a Relax module the way TVM's default CPU pipeline does;
``call_tir_sites`` lists every ``call_tir`` with the bindings around it.
"""

from __future__ import annotations

from . import _tvm as T

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


def call_tir_sites(mod):
    """Yield ``(var2val, call, args)`` for every call_tir in every Relax function."""
    call_tir = T.call_tir_op()
    for _, func in mod.functions_items():
        if not isinstance(func, T.Function):
            continue
        var2val = R.analysis.get_var2val(func)
        for value in var2val.values():
            if isinstance(value, R.Call) and value.op.same_as(call_tir):
                yield var2val, value, call_args(value)


def call_args(call) -> list:
    """The tensor arguments of a call_tir."""
    return list(call.args[1].fields) if isinstance(call.args[1], R.Tuple) else [call.args[1]]
