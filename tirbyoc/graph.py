"""Graph level: Relax patterns, built with ``is_call_tir``, for tirbyoc's regions.

    mod = relax.transform.LegalizeOps()(mod)
    patterns = tirbyoc.relax_patterns(mod, predicate=tirbyoc.constant_weights)
    mod = relax.transform.FuseOpsByPattern(patterns, bind_constants=False)(mod)
    ex = tirbyoc.compile(mod)               # (tirbyoc.partition(mod, predicate) does the two)

``FuseOpsByPattern`` groups each ``call_tir`` chain (matmul -> add -> relu) that one
intrinsic covers into a composite function with ``Composite="tirbyoc.<intrinsic>"``.
Given the module, a pattern's check fuses the chain exactly as ``FuseTIR`` will and asks
the TIR matcher whether that intrinsic covers all of it; without the module it checks
dtypes and shapes only, and the TIR path decides later (a composite it does not match is
compiled by TVM as usual). A ``predicate`` restricts offloading further; the TIR path
then offloads exactly the composites tirbyoc made, nothing else. Constants must stay
outside the composites (``bind_constants=False``): ``FuseTIR`` cannot fuse them.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import _tvm as T
from .registry import Registry
from .bindings import call_args
from .weights import transposed_source

R = T.relax_ns


@dataclass(frozen=True)
class RegionCall:
    """What a predicate sees of a candidate region at graph level."""

    intrinsic: str
    calls: tuple  # the call_tir chain, dense first
    weight: object  # the weight the matmul reads (seen through a separate transpose)
    var2val: object

    @property
    def weight_is_constant(self) -> bool:
        return isinstance(self.weight, T.RelaxConstant)


def constant_weights(region: RegionCall) -> bool:
    """A predicate: offload only layers whose weight is a constant of the module."""
    return region.weight_is_constant


# Longest epilogue a chain intrinsic's graph-level pattern looks for (one call_tir a step).
MAX_CHAIN_CALLS = 4


def _chain_pattern(operands):
    """A call_tir chain: the matmul, then one call per step taking the previous result
    (``operands``: per step, 1, 2, or None for either)."""
    dpl = T.dpl()
    dense = dpl.is_call_tir("", [dpl.wildcard(), dpl.wildcard()])
    annotations, prev = {"dense": dense}, dense
    for i, count in enumerate(operands):
        one = dpl.is_call_tir("", [prev])
        two = dpl.is_call_tir("", [prev, dpl.wildcard()]) | \
            dpl.is_call_tir("", [dpl.wildcard(), prev])
        prev = one if count == 1 else two if count == 2 else one | two
        annotations[f"step{i}"] = prev
    return prev, annotations


def _chain(ctx, length) -> list:
    keys = ["dense"] + [f"step{i}" for i in range(length)]
    return [ctx.annotated_expr[k] for k in keys]


def _shapes(intr):
    """The call_tir chains an intrinsic's patterns look for, longest first."""
    if intr.chain is None or not intr.builtin:  # a declared kernel: its own epilogue
        return [[step.operands for step in intr.epilogue]]
    return [[None] * n for n in range(MAX_CHAIN_CALLS, -1, -1)]


def region_prim_func(mod, chain, var2val):
    """The PrimFunc that ``FuseTIR`` makes of a call_tir chain (for the TIR matcher)."""
    base = T.IRModule({gv: f for gv, f in mod.functions_items() if isinstance(f, T.PrimFunc)})
    bb = R.BlockBuilder(base)
    bound = [next(v for v, e in var2val.items() if e.same_as(c)) for c in chain]
    externals = []
    for call in chain:
        for a in call_args(call):
            if not any(a.same_as(v) for v in bound + externals):
                externals.append(a)
    params = [R.Var(f"p{i}", a.ty) for i, a in enumerate(externals)]
    with bb.function("region", params, attrs={"Primitive": True}, private=True):
        with bb.dataflow():
            env = []
            for call in chain:
                args = []
                for a in call_args(call):
                    j = next((i for i, e in enumerate(externals) if e.same_as(a)), None)
                    args.append(params[j] if j is not None else
                                next(nv for v, nv in env if v.same_as(a)))
                new = bb.emit(T.relax_call_with_args(call, [call.args[0], R.Tuple(args)]))
                env.append((bound[len(env)], new))
            out = bb.emit_output(env[-1][1])
        bb.emit_func_output(out)
    region = bb.get().get_global_var("region")
    outer = [R.Var(f"q{i}", a.ty) for i, a in enumerate(externals)]
    with bb.function("main", outer):
        bb.emit_func_output(bb.emit(R.Call(region, outer)))
    return R.transform.FuseTIR()(bb.get())["region"]


def _tir_covers(mod, chain, var2val, intr) -> bool:
    from .matcher import match_func
    from .normalize import normalize

    try:
        func = region_prim_func(mod, chain, var2val)
    except Exception:  # noqa: BLE001 (a chain FuseTIR cannot fuse is simply not a region)
        return False
    normal = normalize(func)
    if normal.reason:
        return False
    regions = [r for _, r in match_func(normal, [intr], passes=()) if r]
    return len(regions) == 1 and len(regions[0].nests) == len(normal.nests)


def _types_fit(chain, intr) -> bool:
    """Without the module: float types the kernels have and a 2-D weight."""
    for call in chain:
        ty = call.ty
        if not hasattr(ty, "dtype") or str(ty.dtype) not in intr.dtypes:
            return False
    weight = call_args(chain[0])[1]
    if not hasattr(weight.ty, "ndim"):
        return False
    return int(weight.ty.ndim) >= 2 if intr.batched else int(weight.ty.ndim) == 2


def relax_patterns(mod=None, *, predicate=None, libraries=(), builtin=True,
                   intrinsics=None) -> list:
    """``FusionPattern``s (``is_call_tir`` chains) for ``FuseOpsByPattern``, longest first,
    each named ``<library>.<intrinsic>`` (BYOC's ``Composite``): the ``libraries``'
    declared dense / matmul kernels first, in order, then the built-in library's
    (unless ``builtin=False``; ``intrinsics``: only these of the built-in ones).

    ``mod``: the legalized module the patterns will run on, so that each check asks the TIR
    matcher; ``predicate(RegionCall) -> bool``: restrict offloading further.
    """
    reg = libraries if isinstance(libraries, Registry) else \
        Registry(libraries, builtin=builtin, intrinsics=intrinsics)
    # NOTE: bindings by Var: FuseOpsByPattern rebuilds the function between patterns, but
    # the Vars of bindings it leaves alone (a weight's transpose, say) stay the same.
    known = {}
    if mod is not None:
        for _, func in mod.functions_items():
            if isinstance(func, T.Function):
                known.update(R.analysis.get_var2val(func))
    patterns = []
    # NOTE: a chain intrinsic's pattern is the matmul call alone (its epilogue is read
    # from the TIR), so it comes last: it takes what the fixed chains leave, such as a
    # batched matmul.
    ordered = reg.intrinsics()
    for intr in sorted(ordered, key=lambda i: i.chain is not None and i.builtin):
        for shape in _shapes(intr):
            pattern, annotations = _chain_pattern(shape)

            def check(ctx, intr=intr, length=len(shape)):
                chain = _chain(ctx, length)
                var2val = {**known, **dict(ctx.matched_bindings)}
                weight = call_args(chain[0])[1]
                source = transposed_source(mod, var2val, weight) if mod is not None else None
                info = RegionCall(intr.name, tuple(chain),
                                  source if source is not None else weight, var2val)
                if predicate is not None and not predicate(info):
                    return False
                if mod is None:
                    return _types_fit(chain, intr)
                return _tir_covers(mod, chain, var2val, intr)

            patterns.append(T.FusionPattern(intr.qualified, pattern,
                                            annotations, check))
    return patterns


def partition(mod, predicate=None, intrinsics=None, *, libraries=(), builtin=True):
    """Legalize ``mod`` if needed and group tirbyoc's regions into composites at graph
    level (``FuseOpsByPattern`` with ``relax_patterns``); the result goes to
    ``tirbyoc.compile`` / ``apply_tir_byoc``."""
    from .relax_prep import is_legalized

    if not is_legalized(mod):
        mod = R.transform.LegalizeOps()(mod)
    patterns = relax_patterns(mod, predicate=predicate, libraries=libraries, builtin=builtin,
                              intrinsics=intrinsics)
    return R.transform.FuseOpsByPattern(patterns, bind_constants=False)(mod)
