"""Relax-level preparation: bring a module to the form the matcher works on.

``prepare`` legalizes and fuses a Relax module the way TVM's default CPU pipeline does,
and says which PrimFuncs tirbyoc may touch (``Scope``): when the graph level already
chose regions (composites from ``tirbyoc.relax_patterns``) only those; never functions
another graph-level codegen claimed. ``call_tir_sites`` lists every ``call_tir``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import _tvm as T

R = T.relax_ns
COMPOSITE_PREFIX = "tirbyoc."


@dataclass
class Scope:
    """Which PrimFuncs tirbyoc may offload, and with which intrinsics."""

    chosen: dict | None = None  # graph level chose: PrimFunc name -> intrinsic name
    foreign: set = field(default_factory=set)  # claimed by another codegen

    def intrinsics_for(self, name: str, intrinsics: list):
        if name in self.foreign:
            return None
        if self.chosen is None:
            return intrinsics
        if name not in self.chosen:
            return None
        # the chosen intrinsic, or a shorter fusion that starts the same way (when the
        # TIR shows the whole chain is not what the kernel computes)
        chosen = next((i for i in intrinsics if i.name == self.chosen[name]), None)
        if chosen is None:
            return []
        return [i for i in intrinsics if chosen.epilogue[:len(i.epilogue)] == i.epilogue]


def claims(mod) -> Scope:
    """The graph level's choices: tirbyoc composites and functions of other codegens."""
    chosen, foreign = {}, set()
    for gv, func in mod.functions_items():
        if not isinstance(func, T.Function) or not func.attrs:
            continue
        composite = func.attrs["Composite"] if "Composite" in func.attrs else None
        if composite is not None and str(composite).startswith(COMPOSITE_PREFIX):
            chosen[gv.name_hint] = str(composite)[len(COMPOSITE_PREFIX):]
            found = []
            T.structural_walk(func, [(T.RelaxConstant, found.append)])
            if found:
                raise ValueError(
                    f"tirbyoc composite {gv.name_hint} holds constants, which FuseTIR cannot "
                    "fuse: run FuseOpsByPattern(tirbyoc.relax_patterns(mod), "
                    "bind_constants=False), or tirbyoc.partition(mod)")
        elif composite is not None or "Codegen" in func.attrs:
            foreign.add(gv.name_hint)
    return Scope(chosen or None, foreign)


def has_relax_functions(mod) -> bool:
    return any(isinstance(f, T.Function) for _, f in mod.functions_items())


def is_legalized(mod) -> bool:
    """True when LegalizeOps has nothing left to lower."""
    # NOTE: runtime modules (an offloaded module's external_mods) have no structural
    # equality; the attribute is not what this asks about.
    if mod.attrs and "external_mods" in mod.attrs:
        mod = mod.without_attr("external_mods")
    return T.structural_equal(R.transform.LegalizeOps()(mod), mod)


def prepare(mod, fuse="auto"):
    """Legalize and fuse a Relax module like the default CPU pipeline: ``(module, Scope)``.

    Functions with a ``Codegen`` attribute (another codegen's) come back as they were.

    ``fuse="auto"``: only a module that still has high-level Relax ops is legalized and
    fused; an already legalized module is taken as it is. ``True``: also fuse a legalized
    module. ``False``: only legalize. A module the graph level partitioned is not fused
    further; its composites (tirbyoc's and other codegens' alike) become PrimFuncs by
    ``FuseTIR`` as TVM would make them.
    """
    if not has_relax_functions(mod):
        return mod, Scope()
    given = {gv.name_hint for gv in mod.get_global_vars()}
    scope = claims(mod)
    external = {gv.name_hint: f for gv, f in mod.functions_items()
                if isinstance(f, T.Function) and f.attrs and "Codegen" in f.attrs}
    legalized = is_legalized(mod)
    if fuse == "auto":
        fuse = not legalized
    if scope.chosen:
        fuse = False  # the graph level already chose what goes together
    if fuse:
        mod = T.Sequential(T.relax_default_prepare_passes())(mod)
    elif not legalized:
        mod = R.transform.LegalizeOps()(mod)
    if scope.chosen or scope.foreign:
        mod = R.transform.FuseTIR()(mod)
    if external:
        # NOTE: LegalizeOps lowers every Relax function, external ones included; a
        # function another codegen will compile must reach it exactly as it was.
        mod = mod.clone()
        for gv in mod.get_global_vars():
            if gv.name_hint in external:
                mod.update_func(gv, external[gv.name_hint])
    return _drop_unused(mod, given, scope), scope


def _referenced(func) -> set:
    names = set()
    T.structural_walk(func, [(T.GlobalVar, lambda gv: names.add(gv.name_hint))])
    return names


def _drop_unused(mod, given: set, scope: Scope):
    """Only what will run in TVM: PrimFuncs that legalization made but nothing calls go;
    those that only another codegen's functions call are that codegen's (``foreign``)."""
    funcs = {gv.name_hint: f for gv, f in mod.functions_items()}
    codegen = {n for n, f in funcs.items() if isinstance(f, T.Function) and f.attrs
               and "Codegen" in f.attrs}
    ours, todo = set(), [n for n, f in funcs.items()
                         if isinstance(f, T.Function) and n not in codegen]
    while todo:  # what TVM compiles: reachable from Relax functions, codegens' excluded
        name = todo.pop()
        if name in ours or name in codegen or name not in funcs:
            continue
        ours.add(name)
        todo.extend(_referenced(funcs[name]))
    used_by_codegen = set().union(*(_referenced(funcs[n]) for n in codegen)) if codegen \
        else set()
    dead = [gv for gv in mod.get_global_vars() if isinstance(funcs[gv.name_hint], T.PrimFunc)
            and gv.name_hint not in ours and gv.name_hint not in used_by_codegen
            and gv.name_hint not in given]
    scope.foreign.update(n for n in used_by_codegen - ours if isinstance(funcs.get(n),
                                                                        T.PrimFunc))
    if dead:
        mod = mod.clone()
        for gv in dead:
            del mod[gv]
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
