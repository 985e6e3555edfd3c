"""Relax-level preparation: bring a module to the form the matcher works on.

``prepare`` legalizes and fuses a Relax module the way TVM's default CPU pipeline does,
and says which PrimFuncs tirbyoc may touch (``Scope``): when the graph level already
chose regions (composites from ``tirbyoc.relax_patterns``) only those; never functions
another graph-level codegen claimed. ``call_tir_sites`` lists every ``call_tir``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import _tvm as T
from .bindings import call_args, call_tir_sites  # noqa: F401 (part of this module's API)
from .bindings import Bindings, is_op, same_dims
from .merge_products import merge_products
from .ops import resolve

R = T.relax_ns


@dataclass
class Scope:
    """Which PrimFuncs tirbyoc may offload, and with which intrinsics."""

    chosen: dict | None = None  # graph level chose: PrimFunc name -> "<library>.<intrinsic>"
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
        chosen = next((i for i in intrinsics if i.qualified == self.chosen[name]), None)
        if chosen is None:
            return []
        return [i for i in intrinsics if i.library == chosen.library and
                chosen.epilogue[:len(i.epilogue)] == i.epilogue]


def claims(mod, libraries=("tirbyoc",)) -> Scope:
    """The graph level's choices: composites of the ``libraries`` (named
    ``<library>.<intrinsic>``) and functions of other codegens."""
    chosen, foreign = {}, set()
    prefixes = tuple(f"{name}." for name in libraries)
    for gv, func in mod.functions_items():
        if not isinstance(func, T.Function) or not func.attrs:
            continue
        composite = func.attrs["Composite"] if "Composite" in func.attrs else None
        if composite is not None and str(composite).startswith(prefixes):
            chosen[gv.name_hint] = str(composite)
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


# The most operators fused into one function. TVM's default, 256, let RWKV's recurrence
# (torch.export unrolls it over the tokens) fuse into functions of hundreds of
# elementwise steps, whose scheduling is quadratic in their blocks: a 585 s build. Fused
# chains in the zoo's and held-out models are far shorter than this.
FUSE_DEPTH = 32


def legalize_and_fuse(mod):
    """TVM's default legalization and fusion, at most ``FUSE_DEPTH`` operators a fused
    function (unless the caller's PassContext sets FuseOps's bound)."""
    with T.fusion_depth(FUSE_DEPTH):
        return T.Sequential(T.relax_default_prepare_passes())(mod)


def prepare(mod, fuse="auto", softmax=True, passes=None, registry=None):
    """Legalize and fuse a Relax module like the default CPU pipeline: ``(module, Scope)``.

    Functions with a ``Codegen`` attribute (another codegen's) come back as they were.

    ``fuse="auto"``: only a module that still has high-level Relax ops is legalized and
    fused; an already legalized module is taken as it is. ``True``: also fuse a legalized
    module. ``False``: only legalize. A module the graph level partitioned is not fused
    further; its composites (tirbyoc's and other codegens' alike) become PrimFuncs by
    ``FuseTIR`` as TVM would make them.

    Before legalization (not in a module the graph level partitioned), the graph-level
    families registered in ``tirbyoc.ops`` (a ``stage`` each) rewrite their regions into
    kernel calls, in the order registered: convolutions with what follows them
    (``tirbyoc.conv``), pooling (``tirbyoc.pool``); then, once reshapes have moved out of
    the way (``sink_reshapes``), attention regions (``tirbyoc.attention``) and any other
    float32 softmax over the last axis (``tirbyoc.softmax``). Each is offered first to the
    declared kernels of ``registry``'s libraries (``tirbyoc.registry.Registry``; default:
    the built-in library only), then to the built-in library's rewrite of that family
    unless ``softmax`` (a historical name: the built-in graph-level rewrites) is False.
    ``passes``: the region passes whose conv forms run on each convolution's region
    (``tirbyoc.conv``; default ``tirbyoc.weights.DEFAULT_PASSES``).
    """
    if not has_relax_functions(mod):
        return mod, Scope()
    from .fixups import apply as fix_frontend

    mod = fix_frontend(mod)  # what TVM's frontends get wrong (tirbyoc.fixups)
    given = {gv.name_hint for gv in mod.get_global_vars()}
    scope = claims(mod, registry.names if registry is not None else ("tirbyoc",))
    if registry is None:
        from .registry import Registry

        registry = Registry()
    # the graph-level families: the declared kernels of each, and whether the built-in
    # library's rewrite takes the rest
    ours = registry.builtin_families() if softmax else set()
    external = {gv.name_hint: f for gv, f in mod.functions_items()
                if isinstance(f, T.Function) and f.attrs and "Codegen" in f.attrs}
    legalized = is_legalized(mod)
    if fuse == "auto":
        fuse = not legalized
    if scope.chosen:
        fuse = False  # the graph level already chose what goes together
    grouped = registry.kernels("matmul")
    if not scope.chosen and (grouped or registry.builtin):
        # grouped products (tirbyoc.moe): calls of a PrimFunc, legalized or not
        from .moe import offload_grouped

        mod = offload_grouped(mod, kernels=grouped, builtin=registry.builtin)
    if not legalized and not scope.chosen:
        for phase in (0, 1):
            if phase == 1:
                mod = sink_reshapes(merge_products(mod))
            for stage, families in _stages(phase):
                kernels = [k for f in families for k in registry.kernels(f)]
                builtin = any(f in ours for f in families)
                # the convs write blocks for the max pools after them where the
                # built-in kernel takes those (no library declares one)
                extra = {"pools": "max_pool2d" in ours and not registry.kernels("max_pool2d")
                         } if stage == "tirbyoc.conv:offload_convs" else {}
                if kernels or builtin:
                    mod = resolve(stage)(mod, kernels=kernels, builtin=builtin, passes=passes,
                                         **extra)
    if fuse:
        registry.make_symbols_global(mod)  # (FoldConstant may run a region's kernel)
        mod = legalize_and_fuse(mod)
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


def _stages(phase: int) -> list:
    """``[(stage, families)]``: the graph-level rewrites of one phase, in the order their
    families are registered (``tirbyoc.ops``), each once."""
    from .ops import families, family

    out: dict = {}
    for name in families():
        f = family(name)
        if f.stage is not None and f.phase == phase:
            out.setdefault(f.stage, []).append(name)
    return list(out.items())


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


# ---- moving reshapes out of the way of fusion ----

# Elementwise Relax ops of one tensor (the other arguments, if any, are not tensors).
_UNARY_ELEMENTWISE = ("relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.silu", "relax.sigmoid",
                      "relax.tanh", "relax.nn.relu", "relax.clip", "relax.erf", "relax.exp")
_BINARY_ELEMENTWISE = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide")


def _shape(expr):
    shape = getattr(expr.ty, "shape", None)
    if shape is None or not hasattr(shape, "values"):
        return None
    return list(shape.values)


def _trailing_broadcast(other, last) -> bool:
    """``other`` broadcasts against any shape ending in ``last`` the same way: all its
    dimensions are 1 except, possibly, a last one equal to ``last``."""
    shape = _shape(other)
    if shape is None:
        return False
    an = T.analyzer()
    if not all(an.can_prove_equal(d, 1) for d in shape[:-1]):
        return False
    return not shape or an.can_prove_equal(shape[-1], 1) or an.can_prove_equal(shape[-1], last)


def sink_reshapes(mod):
    """Move reshapes that only regroup leading dimensions below elementwise ops.

    ``torch.export`` writes ``Linear`` on a [B, S, D] input as reshape -> matmul -> add ->
    reshape, and what follows (GELU, a residual add, a scale) then works on the 3-D view:
    the reshape between them keeps ``FuseOps`` from putting the epilogue next to its matmul.
    Here ``op(reshape(y))`` becomes ``reshape(op(y))`` when the reshape adds leading
    dimensions (for a binary op, the other operand
    must be a scalar, a per-last-dimension vector, or a tensor of the reshaped shape, which
    is reshaped back; a matrix product there, read by the op alone, is computed on its
    input's view instead, so that the op still follows it), permutes that only move
    dimensions of size 1 become reshapes, and reshapes of reshapes collapse. Values are
    unchanged: only the views move.
    """
    dpl = T.dpl()
    rs = dpl.is_op("relax.reshape")
    y, s, other = dpl.wildcard(), dpl.wildcard(), dpl.wildcard()
    inner = rs(y, s)

    def regroups(y_expr, s_expr) -> bool:
        ys, ss = _shape(y_expr), _shape(s_expr)
        # NOTE: only reshapes that add leading dimensions (the un-flatten after a 2-D
        # matmul): the reshape a binary op puts on its other operand removes them, so
        # the rewrites cannot undo each other.
        return ys is not None and ss is not None and 0 < len(ys) < len(ss) and \
            T.analyzer().can_prove_equal(ys[-1], ss[-1])

    def unary(orig, m):
        if not isinstance(orig, R.Call):
            return orig
        ye, re = m[y], m[inner]
        if not regroups(ye, re):
            return orig
        new = T.relax_call_with_args(orig, [ye] + list(orig.args[1:]))
        return R.op.reshape(new, R.ShapeExpr(_shape(re)))

    def binary(first):
        def rewrite(orig, m):
            if not isinstance(orig, R.Call):
                return orig
            # NOTE: the call's arguments are the Vars bound to the matched reshape and
            # operand; which side the reshape is on is the pattern's, not a comparison's.
            ye, re, oe = m[y], m[inner], m[other]
            if not regroups(ye, re) or not same_dims(_shape(orig), _shape(re)):
                return orig
            if same_dims(_shape(oe), _shape(re)):
                product = _product_on_view(oe, _shape(ye))
                oe = R.op.reshape(oe, R.ShapeExpr(_shape(ye))) if product is None else product
            elif not _trailing_broadcast(oe, _shape(ye)[-1]):
                return orig
            new = T.relax_call_with_args(orig, [ye, oe] if first else [oe, ye])
            return R.op.reshape(new, R.ShapeExpr(_shape(re)))

        return rewrite

    def twice(orig, m):
        ye = m[y]
        target = _shape(orig)
        if same_dims(_shape(ye), target):
            return ye
        return R.op.reshape(ye, R.ShapeExpr(target))

    def unit_permute(orig, m):
        if not isinstance(orig, R.Call) or getattr(orig.attrs, "axes", None) is None:
            return orig
        src, dst = _shape(m[y]), _shape(orig)
        if src is None or dst is None:
            return orig
        an = T.analyzer()
        keep = lambda shape: [d for d in shape if not an.can_prove_equal(d, 1)]  # noqa: E731
        if not same_dims(keep(src), keep(dst)):
            return orig
        axes = [int(a) for a in orig.attrs.axes]
        order = [a for a in axes if not an.can_prove_equal(src[a], 1)]
        if order != sorted(order):
            return orig
        return R.op.reshape(m[y], R.ShapeExpr(dst))

    def _product_on_view(var, shape):
        """For ``var = matmul(a, W)`` read once (W 2-D), the product on ``a`` viewed
        with ``shape``'s leading dimensions: ``matmul(reshape(a), W)``, of ``shape``, so
        that the op reading it follows the product directly (a residual add then joins
        the product's kernel call: Llama's stream is 2-D from its embedding on, its
        projections 3-D); also through elementwise ops with a bias-like operand read
        once (``matmul(a, W) + b``: HuggingFace GPT-2's Conv1D, whose residual stream is
        2-D at batch 1), which follow it onto the view; else None."""
        # NOTE: the pattern's operands are the bound values (dpl matches through the
        # bindings); the product's variable is found to count its readers
        b = current["b"]
        call = var if isinstance(var, R.Call) else b.producer(var)
        if call is None:
            return None
        bound = [v for v, value in b.values.items() if value.same_as(call)]
        if len(bound) != 1 or b.uses.get(bound[0]) != 1:
            return None
        if is_op(call, *_BINARY_ELEMENTWISE):
            for i in (0, 1):
                c = call.args[1 - i]
                if not _trailing_broadcast(c, shape[-1]) or \
                        not same_dims(_shape(call.args[i]), _shape(call)):
                    continue
                inner = _product_on_view(call.args[i], shape)
                if inner is not None:
                    return T.relax_call_with_args(call, [inner, c] if i == 0 else [c, inner])
            return None
        if not is_op(call, "relax.matmul"):
            return None
        a, w = call.args
        ws, as_ = _shape(w), _shape(a)
        if ws is None or as_ is None or len(ws) != 2 or not same_dims([ws[1]], shape[-1:]):
            return None
        view = R.op.reshape(a, R.ShapeExpr(list(shape[:-1]) + [as_[-1]]))
        return R.op.matmul(view, w, out_dtype=call.attrs.out_dtype)

    current = {}
    rules = [(dpl.is_op(op)(inner), unary) for op in _UNARY_ELEMENTWISE]
    for op in _BINARY_ELEMENTWISE:
        rules.append((dpl.is_op(op)(inner, other), binary(first=True)))
        rules.append((dpl.is_op(op)(other, inner), binary(first=False)))
    rules.append((rs(inner, dpl.wildcard()), twice))
    rules.append((dpl.is_op("relax.permute_dims")(y), unit_permute))

    out = mod.clone() if hasattr(mod, "clone") else mod
    for gv, func in mod.functions_items():
        if not isinstance(func, T.Function) or (func.attrs and "Codegen" in func.attrs):
            continue
        new = func
        for _ in range(8):
            before = new
            for pattern, rewriter in rules:
                current["b"] = Bindings(new)
                new = dpl.rewrite_call(pattern, rewriter, new)
            if T.structural_equal(before, new):
                break
        out[gv] = new
    return out
