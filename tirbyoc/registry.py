"""One ordered registry of kernels for one compile: the user's libraries, then the
built-in one.

``Registry(libraries, builtin=True)`` is what the pipeline asks. For the matrix
families (``dense``, ``matmul``: matched in TIR) it gives ``intrinsics()``, the ordered
list the TIR matcher tries (each declared kernel as an ``Intrinsic`` whose epilogue is
exactly the declared one, then the built-in library's); for the families matched in the
graph before legalization (``conv2d``, pooling, ``softmax``) it gives ``kernels(family)``:
the declared kernels the graph-level rewrite offers each region first (the built-in
library takes what none of them takes). First match wins, in that order.
"""

from __future__ import annotations

from . import _tvm as T
from .epilogues import BIAS, RELU, RESIDUAL, SCALE, UNARY_STEPS
from .intrinsic import Intrinsic
from .matcher import Region, batch_stride, row_stride

# A declared step's name -> the matcher's epilogue step.
_STEP = {"bias": BIAS, "relu": RELU, "scale": SCALE, "residual": RESIDUAL,
         "gelu": UNARY_STEPS["gelu_erf"], "gelu_tanh": UNARY_STEPS["gelu_tanh"],
         "silu": UNARY_STEPS["silu"], "sigmoid": UNARY_STEPS["sigmoid"],
         "tanh": UNARY_STEPS["tanh"], "hardswish": UNARY_STEPS["hardswish"],
         "hardsigmoid": UNARY_STEPS["hardsigmoid"]}


def _relu6():
    from intrinsics.dense_relu6 import RELU6

    return RELU6


def _steps(epilogue) -> tuple:
    return tuple(_relu6() if name == "relu6" else _STEP[name] for name in epilogue)


class Registry:
    """The libraries of one compile, in order; ``builtin``: the built-in library last."""

    def __init__(self, libraries=(), builtin=True, intrinsics=None):
        from .library import Library

        libraries = list(libraries or ())
        for lib in libraries:
            if not isinstance(lib, Library):
                raise TypeError(f"libraries= takes tirbyoc.Library values, got {lib!r}")
        names = [lib.name for lib in libraries]
        if "tirbyoc" in names:
            raise ValueError("the built-in library is named tirbyoc: name yours otherwise "
                             "(it comes last unless builtin=False)")
        if len(set(names)) != len(names):
            raise ValueError(f"two libraries of the same name in {names}")
        self.libraries = libraries
        self.builtin = builtin
        self._intrinsics = intrinsics  # the built-in intrinsics to use (None: all)

    @property
    def names(self) -> list:
        """The library names, in order (the built-in one last when used)."""
        return [lib.name for lib in self.libraries] + (["tirbyoc"] if self.builtin else [])

    def library(self, name):
        """The library called ``name`` among this compile's (the built-in one too)."""
        if name == "tirbyoc" and self.builtin:
            from .builtin import builtin

            return builtin
        return next((lib for lib in self.libraries if lib.name == name), None)

    def kernels(self, family: str) -> list:
        """The declared kernels of a graph-level family, in library then declaration
        order (the built-in library's are not among them: its rewrites take what these
        leave)."""
        return [k for lib in self.libraries for k in lib.family(family) if k.matcher is None]

    def intrinsics(self) -> list:
        """What the TIR matcher tries, in order."""
        # NOTE: within a library, longer fusions first (a stable sort keeps the order of
        # declaration among those of one length), as in the built-in registry.
        out = [matrix_intrinsic(k) for lib in self.libraries
               for k in sorted(lib.kernels, key=lambda k: -len(k.op.epilogue))
               if k.op.family in ("dense", "matmul") and k.matcher is None]
        if self.builtin:
            from .schedule_rule import registry

            out += registry(self._intrinsics)
        return out

    def make_symbols_global(self, mod, used=None):
        """Load the libraries whose kernels ``mod`` calls (``used``: their names, when
        known) so that code TVM JIT-compiles in this process finds them. That code
        resolves ``call_extern`` among the process's global symbols only: a TIR-only
        build, and Relax's ``FoldConstant``, which runs a kernel call whose inputs are
        all constants at compile time (Funnel Transformer's max pool over a mask made
        from constants); without them the JIT fails ("Symbols not found") and the
        process crashes."""
        if used is None:
            from .normalize import offloaded_by_library

            used = offloaded_by_library(mod)
        for name in sorted(used):
            library = self.library(name)
            if library is not None:
                library.make_symbols_global()

    def builtin_families(self) -> set:
        """The families whose graph-level rewrite the built-in library offers (its
        declared kernels with such a matcher): none without the built-in library, or
        when only some of its intrinsics were asked for."""
        if not self.builtin or self._intrinsics is not None:
            return set()
        from .builtin import builtin
        from .intrinsic import Intrinsic

        return {k.op.family for k in builtin.kernels
                if k.matcher is not None and not isinstance(k.matcher, Intrinsic)}


def matrix_intrinsic(kernel) -> Intrinsic:
    """A declared ``dense`` / ``matmul`` kernel as an intrinsic of the TIR matcher."""
    op = kernel.op
    declared = _steps(op.epilogue)
    chain = tuple({s.name: s for s in (BIAS, RESIDUAL, SCALE, RELU, _relu6())}.values())
    names = tuple(s.name for s in declared)

    def check(found):
        got = tuple(step.name for step, _, _ in found)
        if got != names[:len(got)]:
            return f"the kernel computes {' + '.join(names) or 'no epilogue'}"
        return None

    return Intrinsic(kernel.symbol, declared, kernel.symbol, lambda region: None, None,
                     dtypes=op.dtypes, layouts=(op.layouts["weight"],), chain=chain,
                     check=check, library=kernel.library.name,
                     emit=lambda region: kernel.call(_matrix_values(kernel, region)),
                     accepts=lambda region: _matrix_accepts(kernel, region),
                     takes_batch=op.family == "matmul")


def _int(expr):
    return int(expr.value) if isinstance(expr, T.IntImm) else None


def _param(region: Region, key):
    for _, _, sm in region.steps:
        if key in sm.params:
            return sm.params[key]
    return None


def _layout_strides(kernel, region: Region) -> dict:
    """What each stride role would be for ``region``, and what the dense layout has."""
    d, an = region.dense, T.analyzer()
    nm = len(d.rows) - d.nbatch
    lead = [it.var for it in d.rows[:d.nbatch]]
    batch = d.rows[:d.nbatch]
    ldw_dense = d.k if region.layout == "nt" else d.n
    out = {"lda": (d.lda, d.k), "ldw": (row_stride(region.weight, 1, an), ldw_dense),
           "ldc": (row_stride(region.out, nm, an) if nm else d.n, d.n)}
    residual = region.capture("residual")
    if residual is not None:
        out["ldr"] = (row_stride(residual, nm, an) if nm else d.n, d.n)
    if kernel.op.family == "matmul":
        out["batch_stride_x"] = (d.sa, d.m * d.k)
        out["batch_stride_weight"] = (d.sw, d.n * d.k)
        out["batch_stride_y"] = (batch_stride(region.out, lead, batch, an), d.m * d.n)
        if residual is not None:
            out["batch_stride_residual"] = (batch_stride(residual, lead, batch, an),
                                            d.m * d.n)
    return out


def _matrix_accepts(kernel, region: Region) -> str | None:
    d, an = region.dense, T.analyzer()
    sizes = {"m": _int(d.m), "n": _int(d.n), "k": _int(d.k)}
    if kernel.op.family == "matmul":
        sizes["batch"] = _int(d.batch)
    why = kernel.op.violation(sizes)
    if why:
        return why
    if "scale" in kernel.op.epilogue and _param(region, "scale") is None:
        return "the scale is not a constant"
    for role, (have, dense) in _layout_strides(kernel, region).items():
        if not isinstance(have, T.Expr) and not isinstance(have, int):
            return str(getattr(have, "reason", have))  # a NoMatch from batch_stride
        if role in kernel.args:
            continue
        # no argument for it: the operand must have the dense layout
        if not an.can_prove_equal(have, dense):
            return (f"{role} is {have}, the kernel takes no {role} argument and assumes "
                    f"{dense} (the dense layout)")
    return None


def _matrix_values(kernel, region: Region) -> dict:
    d = region.dense
    i64 = T.as_int64
    values = {"x": T.buffer_pointer(d.a, "r"), "weight": T.buffer_pointer(region.weight, "r"),
              "y": T.buffer_pointer(region.out, "w"), "m": i64(d.m), "n": i64(d.n),
              "k": i64(d.k), "batch": i64(d.batch)}
    for name in ("bias", "residual"):
        buf = region.capture(name)
        if buf is not None:
            values[name] = T.buffer_pointer(buf, "r")
    scale = _param(region, "scale")
    if scale is not None:
        values["scale"] = T.const(float(scale), "float64")
    for role, (have, _) in _layout_strides(kernel, region).items():
        values[role] = i64(have)
    return values
