"""What an intrinsic is: a dense core, an epilogue chain, a kernel and a numpy reference.

An intrinsic file in ``intrinsics/`` builds ``Intrinsic`` values from the epilogue steps
in ``tirbyoc.epilogues`` (or steps of its own) and lists them; the registry in
``intrinsics/__init__.py`` orders them, and the first one that matches wins.

A failed match is a ``NoMatch``: falsy, and it carries the reason a user reads in
``tirbyoc.explain``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


class NoMatch:
    """A falsy match result that says why."""

    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"NoMatch({self.reason!r})"


@dataclass(frozen=True)
class StepMatch:
    """An epilogue step that matched; ``captures`` holds its extra operands (e.g. bias),
    ``params`` what else the kernel needs (the operation, a constant), ``nests`` the other
    nests the step spans when one operation was written as several (GELU's blocks)."""

    captures: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    nests: tuple = ()

    def __bool__(self) -> bool:
        return True


@dataclass(frozen=True)
class StepContext:
    """What an epilogue step may look at in the consumer block.

    ``value``: the stored expression; ``is_input(expr)``: whether ``expr`` reads the
    previous result at the consumer's own indices; ``rows``/``col``: the consumer's
    row iterators and column iterator (Vars); ``dtype``: the element type;
    ``unit_rows``: the row iterators whose extent is 1 (always 0, like a constant index).
    """

    value: object
    is_input: Callable
    rows: tuple
    col: object
    dtype: str
    unit_rows: tuple = ()


@dataclass(frozen=True)
class EpilogueStep:
    """One elementwise step after the dense core (a bias add, an activation...).

    ``operands``: how many tensors its own ``call_tir`` takes at graph level before
    fusion (the previous result plus, e.g., a bias).
    """

    name: str
    match: Callable  # StepContext -> StepMatch | NoMatch
    operands: int = 1


@dataclass(frozen=True)
class Intrinsic:
    """A fused operation that one kernel computes.

    ``kernel`` is a symbol template with ``{dtype}`` (``f32``) and ``{layout}``
    (``nt``: weight [N, K]; ``nn``: weight [K, N]; ``packed``: a constant weight packed
    at compile time by the kernel library). ``arguments(region)`` maps a matched
    region to the kernel's arguments. ``reference(a, w_kn, bias)`` computes the same
    result in numpy from an activation [M, K], a weight [K, N] and a bias [N] or None.
    """

    name: str
    epilogue: tuple
    kernel: str
    arguments: Callable
    reference: Callable
    dtypes: tuple = ("float32",)
    layouts: tuple = ("nt", "nn", "packed")
    # A chain intrinsic (``chain`` set): the epilogue is read from the consumers, any run
    # of these steps in any order (``epilogue`` is then what one region matched), and
    # batched weights are taken. ``check(steps)`` says why a run is not computable (e.g.
    # two biases), or None.
    chain: tuple | None = None
    check: Callable | None = None
    # The library the kernel belongs to (``tirbyoc``: the built-in one). A kernel of
    # another library (``tirbyoc.Library``) also sets: ``emit(region)``, the statement
    # that calls it and checks its status; ``accepts(region)``, why a region that matched
    # is not one the kernel takes (a constraint, a stride it has no argument for), or
    # None; ``takes_batch``, whether it takes batched weights.
    library: str = "tirbyoc"
    emit: Callable | None = None
    accepts: Callable | None = None
    takes_batch: bool | None = None

    @property
    def batched(self) -> bool:
        return self.chain is not None if self.takes_batch is None else self.takes_batch

    @property
    def builtin(self) -> bool:
        return self.library == "tirbyoc"

    @property
    def qualified(self) -> str:
        """``<library>.<name>``: the graph-level composite's name."""
        return f"{self.library}.{self.name}"

    def derive(self, chain, dense) -> "Intrinsic":
        """What a chain intrinsic computes for one matched run of steps: an intrinsic named
        after it (``batch_matmul_divide``, ``dense_bias_gelu_tanh``) with that epilogue."""
        from dataclasses import replace

        steps = tuple(step for step, _, _ in chain)
        if not self.builtin:  # a declared kernel keeps its name
            return replace(self, epilogue=steps)
        base = "batch_matmul" if dense.nbatch else "dense"
        return replace(self, name="_".join([base] + [s.name for s in steps]), epilogue=steps)

    def symbol(self, dtype: str, layout: str) -> str:
        return self.kernel.format(dtype=_SHORT_DTYPE[dtype], layout=layout)


_SHORT_DTYPE = {"float32": "f32", "float16": "f16", "float64": "f64", "int8": "i8"}
