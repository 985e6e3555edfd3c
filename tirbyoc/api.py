"""The public entry points: ``apply_tir_byoc``, ``explain``, ``pipeline``, ``compile``."""

from __future__ import annotations

from dataclasses import dataclass

from . import _tvm as T
from . import attention, conv, fallback, fixups, pool, relax_prep, softmax, weights
from .matcher import Region
from .normalize import INTRINSIC_ATTR, NOTES_ATTR, normalize, offloaded_by_library
from .registry import Registry
from .schedule_rule import ScheduleRule


def offload_prim_func(func, intrinsics=None, sources=None, passes=None):
    """Offload the matched regions of one PrimFunc (``ScheduleRule`` on one function).

    Returns ``(new_func, results)`` where ``results`` is a list of ``(nest, Region |
    NoMatch)`` for every candidate; ``new_func is func`` when nothing matched.
    ``sources``/``passes``: see ``tirbyoc.weights``.
    """
    sch, results = ScheduleRule(intrinsics).offload(func, sources, passes)
    if sch is None:
        return func, results
    # NOTE: marked scheduled, as dlight marks what a rule returns: MetaSchedule and later
    # rules leave the function alone (its kernel calls cannot be built without the
    # kernel library, and the kernel is the schedule of what it replaced).
    func = fallback.schedule_beside_kernels(sch.mod["main"])
    return func.with_attr("tirx.is_scheduled", True), results


def _static_modules(mod, reg: Registry, used=None) -> list:
    """The static-library modules of every library whose kernels ``mod`` calls
    (``used``: ``offloaded_by_library(mod)``, if known)."""
    from . import kernels

    used = dict(offloaded_by_library(mod) if used is None else used)
    ours = used.pop("tirbyoc", set())
    out = []
    if ours:
        missing = sorted(ours - set(kernels.exported_symbols()))
        if missing:
            raise kernels.KernelLibraryError(
                f"the kernel library does not export {', '.join(missing)}: it is older than "
                "the intrinsics that call it; rebuild it with `pip install -e .` in the "
                "project root")
        out.append(kernels.static_library())
    for name in sorted(used):
        lib = reg.library(name)
        if lib is None:
            raise ValueError(f"the module calls kernels of library {name!r} "
                             f"({', '.join(sorted(used[name]))}); pass it in libraries=[...]")
        static = lib.static_module()
        if static is not None:
            out.append(static)
    return out


def _attach_kernels(mod, reg: Registry, used=None):
    existing = list(mod.attrs["external_mods"]) if mod.attrs and "external_mods" in mod.attrs \
        else []
    new = [m for m in _static_modules(mod, reg, used)
           if not any(m.same_as(e) for e in existing)]
    if not new:
        return mod
    return mod.with_attr("external_mods", existing + new)


def _registry(libraries, builtin, intrinsics) -> Registry:
    if isinstance(libraries, Registry):
        return libraries
    return Registry(libraries, builtin=builtin, intrinsics=intrinsics)


def _transform(mod, fuse, reg: Registry, passes=None):
    """Shared by ``apply_tir_byoc`` and ``explain``: (new module, report rows)."""
    # NOTE: the built-in graph-level kernels (conv, pooling, attention, softmax) come with
    # the default intrinsics only; a caller that names its intrinsics gets those and
    # nothing else of the built-in library.
    # NOTE: the frontend fix-ups first, as in tirbyoc.pipeline (a second run there
    # finds nothing), so that explain reports what compile builds
    mod = fixups.apply(mod)
    mod, scope = relax_prep.prepare(mod, fuse, passes=passes, registry=reg)
    srcs = weights.sources(mod)
    out = mod.clone()
    rows, rerouted = [], {}
    intrinsics = reg.intrinsics()
    for gv, func in mod.functions_items():
        if not isinstance(func, T.PrimFunc):
            continue
        allowed = scope.intrinsics_for(gv.name_hint, intrinsics)
        if allowed is None:
            continue
        new, results = offload_prim_func(func, allowed, srcs.get(gv.name_hint), passes)
        rows.extend(_already_offloaded_rows(gv.name_hint, func))
        for nest, res in results:
            rows.append(ExplainRow.of(gv.name_hint, nest, res))
        routes = {_buffer_param_index(func, old): route
                  for _, r in results if r for old, route in r.reroutes.items()}
        if routes:
            rerouted[gv.name_hint] = (new, routes)
        elif new is not func:
            out.update_func(gv, new)
    return weights.apply_reroutes(out, rerouted), rows


def _buffer_param_index(func, param) -> int:
    buffers = [p for p in func.params if T.is_buffer(p)]
    return next(i for i, p in enumerate(buffers) if p.same_as(param))


def apply_tir_byoc(mod, *, fuse="auto", libraries=(), builtin=True, intrinsics=None,
                   region_passes=None):
    """Offload matched dense(+bias)(+relu) TIR blocks to the tirbyoc kernel library.

    ``mod`` is a Relax IRModule as written (it is legalized and fused the way TVM's
    default CPU pipeline does it), an already legalized one, or a TIR-only module. The
    result is a new IRModule: matched regions are ``call_extern`` blocks, everything else
    is unchanged, and the kernel library is attached as ``external_mods`` so that
    ``tvm.compile`` links it. The input is not modified; applying it twice offloads
    nothing more. ``fuse``: see ``tirbyoc.relax_prep.prepare``. ``region_passes``: changes
    made to offloaded regions only (default ``tirbyoc.weights.DEFAULT_PASSES``: read a
    separately transposed weight in place, fold a convolution's batch norm into its
    weight, pack constant weights at compile time). ``libraries``: ``tirbyoc.Library``
    values whose kernels are tried first, in order, then the built-in library's (unless
    ``builtin=False``); ``intrinsics``: only these of the built-in dense/matmul
    intrinsics (and none of its graph-level kernels).
    """
    reg = _registry(libraries, builtin, intrinsics)
    out, rows = _transform(mod, fuse, reg, region_passes)
    if not any(r.offloaded for r in rows):
        return out
    used = offloaded_by_library(out)
    # NOTE: TVM's TIR-only build ignores external_mods, and TVM's FoldConstant in a
    # later pipeline may run a kernel call: both JIT in process (see tirbyoc.compile)
    reg.make_symbols_global(out, used)
    return _attach_kernels(out, reg, used)


@dataclass
class ExplainRow:
    """One candidate block: where it went, or why it stayed."""

    func: str
    block: str
    offloaded: bool
    intrinsic: str = ""
    kernel: str = ""
    blocks: str = ""
    detail: str = ""
    library: str = ""

    @property
    def computes(self) -> str:
        """The intrinsic, with its library's name unless it is the built-in one."""
        return self.intrinsic if self.library in ("", "tirbyoc") else \
            f"{self.library}.{self.intrinsic}"

    @classmethod
    def of(cls, func_name, nest, res):
        if not res:
            return cls(func_name, nest.name, False, detail=res.reason)
        names = [n.name for n in res.nests]
        if len(names) > 4:  # a unary op written as many blocks (GELU): name the ends
            names = names[:2] + [f"... ({len(names) - 3} more)", names[-1]]
        return cls(func_name, nest.name, True, res.intrinsic.name, res.symbol,
                   " + ".join(names), _describe(res), res.intrinsic.library)


def _describe(region: Region) -> str:
    d = region.dense
    batch = f"batch={_show(d.batch)} " if d.nbatch else ""
    text = (f"{batch}M={_show(d.m)} N={_show(d.n)} K={_show(d.k)}, weight "
            f"{region.layout.upper()}")
    for route in region.reroutes.values():
        text += f" ({route.note})" if route.note else ""
    if region.stopped:
        text += f"; epilogue stops: {region.stopped}"
    return text


def _show(expr) -> str:
    return str(int(expr.value)) if isinstance(expr, T.IntImm) else str(expr)


# What the kernels that the graph level places (before legalization) stand for.
_GRAPH_LEVEL = {softmax.INTRINSIC: "R.nn.softmax over the last axis",
                attention.INTRINSIC: attention.DESCRIPTION,
                conv.INTRINSIC: conv.DESCRIPTION,
                conv.DEPTHWISE_INTRINSIC: conv.DEPTHWISE_DESCRIPTION,
                pool.INTRINSIC: pool.DESCRIPTION}


def _graph_level(intrinsic: str, library: str = "tirbyoc") -> str:
    """What a kernel placed before legalization stands for (``conv2d_bias_relu`` is a
    ``conv2d`` with that chain, ``depthwise_conv2d_bias_relu6`` a ``depthwise_conv2d``):
    the longest registered name that the intrinsic is or starts with."""
    if library != "tirbyoc":
        return "a graph-level region, placed before legalization"
    for name in sorted(_GRAPH_LEVEL, key=len, reverse=True):
        if intrinsic == name or intrinsic.startswith(name + "_"):
            return _GRAPH_LEVEL[name]
    return "offloaded earlier"


def _already_offloaded_rows(func_name, func):
    normal = normalize(func)
    return [ExplainRow(func_name, n.name, True, str(n.block.annotations[INTRINSIC_ATTR]),
                       n.offloaded_kernel, n.name,
                       _with_notes(_graph_level(str(n.block.annotations[INTRINSIC_ATTR]),
                                                n.offloaded_library),
                                   n.block.annotations.get(NOTES_ATTR)),
                       n.offloaded_library)
            for n in normal.nests if n.offloaded_kernel is not None]


def _with_notes(detail: str, notes) -> str:
    """``detail``, then what the region passes did (a conv's), if anything."""
    return f"{detail}: {notes}" if notes is not None and str(notes) else detail


class Report:
    """What ``explain`` found; ``str(report)`` is a table. ``schedules``: for every
    PrimFunc, how it will run (``tirbyoc.fallback.describe``)."""

    def __init__(self, rows, schedules=None):
        self.rows = list(rows)
        self.schedules = dict(schedules or {})

    @property
    def offloaded(self) -> list:
        return [r for r in self.rows if r.offloaded]

    @property
    def rejected(self) -> list:
        return [r for r in self.rows if not r.offloaded]

    def __len__(self):
        return len(self.rows)

    def __str__(self) -> str:
        head = ("function", "block", "result", "kernel / reason")
        body = []
        for r in self.rows:
            if r.offloaded:
                body.append((r.func, r.blocks, f"offloaded: {r.computes}",
                             f"{r.kernel} ({r.detail})"))
            else:
                body.append((r.func, r.block, "stays in TVM", r.detail))
        widths = [max(len(x[i]) for x in [head] + body) for i in range(3)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths + [0])).rstrip()]
        lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 15)
        for row in body:
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths + [0])).rstrip())
        lines.append(f"{len(self.offloaded)} offloaded, {len(self.rejected)} not offloaded")
        if self.schedules:
            width = max(len(name) for name in self.schedules)
            lines += ["", "how each PrimFunc runs:"]
            lines += [f"  {name.ljust(width)}  {how}" for name, how in sorted(self.schedules.items())]
        return "\n".join(lines)

    __repr__ = __str__


def explain(mod, *, fuse="auto", libraries=(), builtin=True, intrinsics=None,
            region_passes=None, target=None) -> Report:
    """What ``apply_tir_byoc`` offloads (or offloaded) and, for every other candidate block
    (every reduction block), why not; then how every PrimFunc will run in
    ``tirbyoc.pipeline(target)`` (a kernel, a fallback schedule rule, or unscheduled).
    ``libraries``, ``builtin``: see ``apply_tir_byoc``."""
    out, rows = _transform(mod, fuse, _registry(libraries, builtin, intrinsics),
                           region_passes)
    return Report(rows, fallback.describe_schedules(out, target))


def pipeline(target=None, *, libraries=(), builtin=True, intrinsics=None,
             region_passes=None, _kernel_functions=None):
    """A Relax pipeline for ``tvm.compile(..., relax_pipeline=tirbyoc.pipeline(target))``:
    TVM's default CPU pipeline with tirbyoc's offload after legalization and fusion, and
    CPU schedules for the rest (``tirbyoc.fallback``). ``target``: default this machine's
    CPU (``tirbyoc.host_target()``); a bare "llvm" gives TVM's code only baseline x86-64
    vectors (SSE2: the fallback schedules run about 5x slower than with AVX-512)."""
    target = T.as_target(target)
    reg = _registry(libraries, builtin, intrinsics)

    @T.module_pass(opt_level=0, name="tirbyoc.pipeline")
    def _pipeline(mod, _ctx):
        with target:
            # NOTE: before TVM's library dispatch, which lowers a cumsum to a scan
            mod = fixups.apply(mod)
            mod = T.Sequential(T.relax_library_dispatch_passes(target))(mod)
            mod = apply_tir_byoc(mod, fuse=True, libraries=reg, region_passes=region_passes)
            # NOTE: what tirbyoc left to TVM is fused as usual (kernel calls are opaque to
            # FuseOps); for a module that was legalized and partitioned by the graph
            # level, this is where the rest gets fused.
            mod = relax_prep.legalize_and_fuse(mod)
            # NOTE: the rest gets CPU schedules (TVM's default pipeline leaves it naive),
            # its max/argmax reductions first started where PyTorch starts them
            mod = fallback.exact_identities(mod)
            mod = T.apply_default_schedule(*fallback.schedule_rules())(mod)
            mod = T.Sequential(T.relax_default_lowering_passes(target))(mod)
            if _kernel_functions is not None:  # (compile's record, for the benchmarks)
                _kernel_functions.extend(_calling_kernels(mod))
            return mod

    return _pipeline


def _calling_kernels(mod) -> list:
    """The names of the PrimFuncs of ``mod`` that call kernels."""
    return [gv.name_hint for gv, f in mod.functions_items()
            if isinstance(f, T.PrimFunc) and offloaded_kernels(f)]


def host_target():
    """The default target of ``compile`` and ``pipeline``: LLVM for this machine's CPU."""
    return T.host_target()


def compile(mod, target=None, *, libraries=(), builtin=True, intrinsics=None,  # noqa: A001
            region_passes=None):
    """``tvm.compile`` with tirbyoc's offload; the result runs in process, may be shared
    by any number of threads, and survives ``export_library`` +
    ``tvm.runtime.load_module`` in a fresh process. ``target``: default this machine's
    CPU (``tirbyoc.host_target()``, so an exported library needs a CPU with the same
    vector ISA; pass "llvm" for a portable baseline x86-64 build, slower). The result's
    ``kernel_functions`` names the functions of it that call kernels (the benchmarks'
    breakdowns tell them from TVM's code)."""
    target = T.as_target(target)
    reg = _registry(libraries, builtin, intrinsics)
    calling = []
    if relax_prep.has_relax_functions(mod):
        ex = T.tvm_compile(mod, target, relax_pipeline=pipeline(
            target, libraries=reg, region_passes=region_passes, _kernel_functions=calling))
    else:
        # A TIR-only module: TVM's TIR build does not read external_mods, so the kernel
        # objects are imported into the result explicitly (export_library then links them).
        from . import kernels

        offloaded = apply_tir_byoc(mod, libraries=reg, region_passes=region_passes)
        ex = T.tvm_compile(offloaded, target)
        statics = _static_modules(offloaded, reg)
        if reg.builtin and not any(s.same_as(kernels.static_library()) for s in statics):
            # NOTE: a schedule may call the built-in kernels itself (tensorize_dense)
            statics.append(kernels.static_library())
        for static in statics:
            ex.mod.import_module(static)
        calling = _calling_kernels(offloaded)
    ex = _link_now(ex)
    ex.kernel_functions = frozenset(calling)
    return ex


def _link_now(executable):
    """Link ``executable`` for in-process use now, once, and return it.

    A module that imports a static library (as every offloaded module does) is not
    runnable as built: TVM links it on first use (``Executable.jit``: export to a
    temporary shared library, load it). That step caches without a lock, so threads that
    each create a ``VirtualMachine`` over a fresh executable export the same LLVM module
    at the same time, which corrupts the heap. Linking before the executable is handed
    out makes every later ``jit()`` return the one loaded module.
    """
    executable.jit()
    return executable


def run(executable, *inputs, func: str = "main"):
    """Run ``func`` of a compiled executable (or a loaded library) on numpy inputs.

    Returns a numpy array (a shape: an int64 array), or a list of them when the
    function returns a tuple.
    """
    import numpy as np

    vm = T.VirtualMachine(executable, T.cpu())
    # NOTE: np.asarray(order="C"), not np.ascontiguousarray, which makes a 0-d array
    # (an ONNX scalar input) 1-d
    out = vm[func](*[T.tensor(np.asarray(x, order="C")) for x in inputs])
    return _to_numpy(out)


def _to_numpy(out):
    """A VM result as numpy: a tensor as an array, a shape as an int64 array, a number
    as a numpy scalar, a tuple as a list of these."""
    import numpy as np

    if hasattr(out, "numpy"):
        return out.numpy()
    if isinstance(out, (bool, int, float)):
        return np.asarray(out)[()]
    if T.is_shape_value(out):
        return np.asarray([int(d) for d in out], dtype=np.int64)
    return [_to_numpy(o) for o in out]


def offloaded_kernels(mod) -> list:
    """The kernel symbols of every offloaded block in ``mod`` (a module or a PrimFunc)."""
    funcs = [mod] if isinstance(mod, T.PrimFunc) else \
        [f for _, f in mod.functions_items() if isinstance(f, T.PrimFunc)]
    return sorted(n.offloaded_kernel for f in funcs for n in normalize(f).nests
                  if n.offloaded_kernel)
