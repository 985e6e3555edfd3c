"""A seeded generator of dense layers and dense look-alikes, for the matcher fuzzer.

``case(seed, index)`` builds case ``index`` of the run with ``seed``, the same whatever
the run's length (a reproduction: ``python -m tests.fuzz_forms SEED INDEX`` prints it).
A case is one function, TIR (TVMScript text) or Relax (built with ``relax.BlockBuilder``),
with its arguments and what tirbyoc may offload in it:

* ``accept`` variants are forms docs/architecture.md promises to offload: ``expected`` is the exact
  list of intrinsics (one per dense layer) tirbyoc must use;
* look-alikes compute something a kernel would get wrong (or that tirbyoc is allowed to
  refuse): ``expected`` is the longest *valid* prefix of each layer, and tirbyoc may
  offload that prefix, a shorter one, or nothing; never more.

The generator is table driven. A TIR case is a ``Layer`` (a dense core and a chain of
epilogue steps) that a variant's ``make`` function draws at random and then changes in
one way (``CORES``: how the reduction is written; ``STEPS``: how each epilogue step is
written; ``EXTRAS``: blocks and buffer tricks around the chain; strides and views of the
buffers). Every knob knows whether the kernel would compute the same thing, and that
gives ``expected``. A Relax case is a ``RelaxSpec`` (``RELAX_VARIANTS``).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

# The epilogue operations a kernel fuses (intrinsics/dense.py, dense_relu6.py and the
# chain of intrinsics/matmul.py): an offloaded layer is named "dense" (or "batch_matmul"
# for a batched weight) followed by its operations, e.g. "dense_bias_relu_tanh". Of the
# "tail" forms, these fuse (by form name); the others (exp, abs, a cast, a hardswish
# bending elsewhere) end the chain.
KERNEL_STEPS = ("bias", "relu", "relu6")
CHAIN_TAILS = ("tanh", "sigmoid", "scale", "residual", "hardswish", "hardsigmoid")
# A chain takes one bias and one residual (intrinsics/matmul.py).
ONCE = ("bias", "residual")


def intrinsic_for(kinds) -> str:
    """The intrinsic of the longest prefix of ``kinds`` (operation names) a kernel fuses."""
    out = []
    for kind in kinds:
        if kind in ONCE and kind in out:
            break
        out.append(kind)
    return "_".join(["dense"] + out)


def kinds_of(intrinsic: str) -> tuple:
    """The operations of an intrinsic name (``dense_bias_relu`` -> ("bias", "relu"))."""
    for base in ("batch_matmul", "dense"):
        if intrinsic == base:
            return ()
        if intrinsic.startswith(base + "_"):
            return tuple(intrinsic[len(base) + 1:].split("_"))
    raise ValueError(f"not an intrinsic name: {intrinsic}")


def same_family(intrinsic):
    """A batched weight whose batch has extent 1 may be read either way: one name."""
    if intrinsic and intrinsic.startswith("batch_matmul"):
        return "dense" + intrinsic[len("batch_matmul"):]
    return intrinsic


def prefixes(intrinsic: str) -> set:
    """``intrinsic`` and every intrinsic whose fusion is a prefix of it."""
    kinds = kinds_of(intrinsic)
    return {"_".join(["dense", *kinds[:i]]) for i in range(len(kinds) + 1)}


@dataclass
class Arg:
    """One function argument: a base array, optionally passed as a strided view of it."""

    name: str
    dtype: str
    shape: tuple  # of the base array (concrete)
    view: tuple | None = None  # numpy index applied to the base before the call
    out: bool = False  # written by the function: starts with a fixed finite pattern


@dataclass
class Case:
    seed: int
    index: int
    variant: str
    kind: str  # "tir" | "relax"
    accept: bool
    expected: tuple  # intrinsics, one per dense layer (see module docstring)
    args: list  # Arg; for Relax filled in when the function is built (relax_function)
    spec: object  # Layer | RelaxSpec (twins are rendered from it)
    special: float  # fraction of NaN/Inf/0 entries in the inputs

    @property
    def name(self) -> str:
        return f"c{self.index}"

    def source(self, nanprop=()) -> str:
        """TVMScript of a TIR case. ``nanprop``: per layer, how many leading epilogue steps
        compute relu/relu6 (hardswish, hardsigmoid) the kernels' way, NaN in -> NaN out (the
        case's "twin")."""
        return render_tir(self.spec, self.name, nanprop)[0]


# ------------------------------------------------------------------- TIR: the data model


@dataclass
class Step:
    kind: str  # "bias" | "relu" | "relu6" | "tail"
    form: str  # key in STEPS[kind]
    valid: bool  # computes what the kernel's step computes
    opts: dict = field(default_factory=dict)


@dataclass
class Layer:
    rows: list  # row extents; a str is a symbolic extent (its value is in ``syms``)
    k: int | str
    n: int | str
    layout: str = "nt"  # "nt": W[n, k]; "nn": W[k, n]
    w_first: bool = False  # W * A
    acc_first: bool = False  # A * W + C
    core: str = "ok"  # key in CORES
    core_opts: dict = field(default_factory=dict)
    steps: list = field(default_factory=list)
    extra: str = ""  # key in EXTRAS
    extra_opts: dict = field(default_factory=dict)
    strides: dict = field(default_factory=dict)  # buffer role -> "rows" | "view" | "inner2"
    second: Layer | None = None  # a second layer reading this one's result
    syms: dict = field(default_factory=dict)  # symbolic extent -> its value at run time
    shuffle: int = 0  # nonzero: seed for permuted loop nests and block iterator orders

    @property
    def symbolic(self) -> bool:
        return bool(self.syms) or (self.second is not None and self.second.symbolic)


class _Fn:
    """Collects the parts of one PrimFunc and prints it as TVMScript."""

    def __init__(self, int64: bool):
        self.int64 = int64
        self.params, self.views, self.allocs, self.blocks = [], [], [], []
        self.args: list[Arg] = []
        self.syms: dict = {}

    def e(self, x) -> str:
        """An extent or shape entry."""
        if isinstance(x, str):
            return x
        return f"T.int64({x})" if self.int64 else str(x)

    def shape(self, dims) -> str:
        return "(" + ", ".join(self.e(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"

    def concrete(self, dims) -> tuple:
        return tuple(self.syms.get(d, d) for d in dims)

    def param(self, name, dims, dtype="float32", out=False, strides=None) -> str:
        """A buffer param; ``strides``: "rows" (padded rows), "inner2" (every other element)
        or "gap" (a padded middle row dimension), passed as a view of a larger array."""
        conc = self.concrete(dims)
        if strides is None:
            if any(isinstance(d, str) for d in dims):
                self.params.append((f"{name}_h: T.handle",
                                    f"{name} = T.match_buffer({name}_h, {self.shape(dims)}, "
                                    f'"{dtype}")'))
            else:
                self.params.append((f'{name}: T.Buffer({self.shape(dims)}, "{dtype}")', None))
            self.args.append(Arg(name, dtype, conc, None, out))
            return name
        base = list(conc)
        if strides == "rows":
            base[-1] += 3
        elif strides == "inner2":
            base[-1] *= 2
        elif strides == "gap":
            base[-2] += 1
        st = [1] * len(base)
        for i in range(len(base) - 2, -1, -1):
            st[i] = st[i + 1] * base[i + 1]
        if strides == "inner2":
            st[-1] = 2
            view = tuple([slice(None)] * (len(base) - 1) + [slice(None, None, 2)])
        else:
            view = tuple(slice(0, c) for c in conc)
        self.params.append((f'{name}: T.Buffer({self.shape(dims)}, "{dtype}", '
                            f"strides={self.shape(st)})", None))
        self.args.append(Arg(name, dtype, tuple(base), view, out))
        return name

    def view(self, name, dims, dtype="float32", out=False, alias=None) -> str:
        """``name``: a root-block match_buffer of a region of a larger param (elem_offset
        and row strides), or of the same region as the view ``alias``."""
        if alias is not None:
            base, region, st, off = alias
        else:
            conc = self.concrete(dims)
            # an offset and padding in the first and the last dim only: the dims between
            # stay exact, so that the rows still collapse into one (what the kernel needs)
            lo = [1] + [0] * (len(conc) - 2) + [2] if len(conc) > 1 else [2]
            big = [c + (lo_ + 1 if i in (0, len(conc) - 1) else 0)
                   for i, (c, lo_) in enumerate(zip(conc, lo))]
            base = self.param(f"{name}_base", big, dtype, out)
            st = [1] * len(big)
            for i in range(len(big) - 2, -1, -1):
                st[i] = st[i + 1] * big[i + 1]
            region = ", ".join(f"{lo_}:{lo_ + c}" for lo_, c in zip(lo, conc))
            off = sum(a * b for a, b in zip(lo, st))
        self.views.append(f'{name} = T.match_buffer({base}[{region}], {self.shape(dims)}, '
                          f'"{dtype}", strides={self.shape(st)}, elem_offset={off})')
        return base, region, st, off

    def alloc(self, name, dims, dtype="float32") -> str:
        self.allocs.append(f'{name} = T.sblock_alloc_buffer({self.shape(dims)}, "{dtype}")')
        return name

    def block(self, name, iters, store, init=None, shuffle=None):
        """``iters``: (var, extent, "S" | "R"); ``store``/``init``: TVMScript statements.
        ``shuffle``: an rng that permutes the loop nest and the iterator declarations."""
        loops, decl = list(iters), list(iters)
        if shuffle is not None:
            loops = [iters[i] for i in shuffle.permutation(len(iters))]
            decl = [iters[i] for i in shuffle.permutation(len(iters))]
        lines = [f"for {', '.join(f'l_{v}' for v, _, _ in loops)} in "
                 f"T.grid({', '.join(self.e(x) for _, x, _ in loops)}):",
                 f'    with T.sblock("{name}"):']
        if len(iters) == 1:
            v, x, _ = iters[0]
            lines.append(f"        {v} = T.axis.spatial({self.e(x)}, l_{v})")
        else:
            lines.append(f"        {', '.join(v for v, _, _ in decl)} = T.axis.remap("
                         f'"{"".join(k for _, _, k in decl)}", '
                         f"[{', '.join(f'l_{v}' for v, _, _ in decl)}])")
        if init is not None:
            lines += ["        with T.init():", f"            {init}"]
        lines.append(f"        {store}")
        self.blocks.append(lines)

    def text(self, fname) -> str:
        out = ["@T.prim_func(s_tir=True)",
               f"def {fname}({', '.join(p for p, _ in self.params)}):"]
        out += [f"    {name} = T.int64()" for name in self.syms]
        out += [f"    {m}" for _, m in self.params if m]
        out.append('    with T.sblock("root"):')
        out += [f"        {s}" for s in self.views + self.allocs]
        for b in self.blocks:
            out += [f"        {s}" for s in b]
        return "\n".join(out) + "\n"


def _c(dt, v) -> str:
    return f"T.{dt}({v!r})"


# ------------------------------------------------------------------- TIR: the dense core


@dataclass
class Core:
    """How the reduction block is written (``CORES`` entries change these fields)."""

    a_shape: list
    a_idx: list
    w_shape: list
    w_idx: list
    out_idx: list
    red: list  # (var, extent)
    iter_rows: list = None  # the dense's row extents when they differ from the buffers'
    dt: str = "float32"  # of A and W
    acc_dt: str = "float32"  # of C (and of the epilogue chain)
    init: str = ""
    prod: Callable = None  # (a_load, w_load) -> str
    acc: Callable = None  # (c_load, product) -> str
    a_load: Callable = None  # (A name, index) -> str (a cast, or A twice)
    w_load: Callable = None


def _kk(L: Layer, c: Core, ks):
    """Replace the reduction var ``k`` by the expression ``ks`` in A's and W's indices."""
    c.a_idx = [ks if x == "k" else x for x in c.a_idx]
    c.w_idx = [ks if x == "k" else x for x in c.w_idx]


def _split_k(L, c):
    k1 = L.core_opts["k1"]
    c.red = [("k0", L.k // k1), ("k1", k1)]
    _kk(L, c, f"k0 * {k1} + k1")


def _dup_out(L, c):
    # C[i, i] = sum A[i, k] * W[i, k]: one spatial iterator is not used at all
    c.out_idx = ["i0", "i0"]
    c.w_idx = ["i0" if x == "j" else x for x in c.w_idx]


def _batched_w(L, c):
    c.w_shape = [L.rows[0]] + c.w_shape
    c.w_idx = ["i0"] + c.w_idx


def _cast_in(L, c):
    c.dt = "float16"
    c.a_load = c.w_load = lambda b, i: f'T.Cast("float32", {b}[{i}])'


def _dtype(dt):
    def mutate(L, c):
        c.dt = c.acc_dt = dt
        c.init = _c(dt, 0.0)
    return mutate


def _out_f64(L, c):
    c.acc_dt = "float64"
    c.init = _c("float64", 0.0)
    c.prod = lambda a, w: f'T.Cast("float64", {a} * {w})'


# name: (valid, requirement on the layer, mutation of the Core)
CORES = {
    "ok": (True, None, None),
    "a_ki": (False, "rows1", lambda L, c: (setattr(c, "a_shape", [L.k, L.rows[0]]),
                                            setattr(c, "a_idx", ["k", "i0"]))),
    "w_row_var": (False, "rows1", lambda L, c: (
        setattr(c, "w_shape", [L.rows[0], L.k] if L.layout == "nt" else [L.k, L.rows[0]]),
        setattr(c, "w_idx", [("i0" if x == "j" else x) for x in c.w_idx]))),
    "a_k_plus_1": (False, None, lambda L, c: (c.a_shape.__setitem__(-1, L.k + 1),
                                              c.a_idx.__setitem__(-1, "k + 1"))),
    "a_row_plus_1": (False, "static", lambda L, c: (c.a_shape.__setitem__(0, L.rows[0] + 1),
                                                   c.a_idx.__setitem__(0, "i0 + 1"))),
    "w_k_plus_1": (False, None, lambda L, c: (
        c.w_shape.__setitem__(c.w_idx.index("k"), L.k + 1),
        c.w_idx.__setitem__(c.w_idx.index("k"), "k + 1"))),
    "a_k_reversed": (False, None, lambda L, c: c.a_idx.__setitem__(-1, f"{L.k - 1} - k")),
    "scale": (False, None, lambda L, c: setattr(c, "prod", [
        lambda a, w: f"{a} * {w} * T.float32({L.core_opts['c']!r})",
        lambda a, w: f"{a} * ({w} * T.float32({L.core_opts['c']!r}))",
        lambda a, w: f"T.float32({L.core_opts['c']!r}) * ({a} * {w})"][L.core_opts["form"]])),
    "init_const": (False, None,
                   lambda L, c: setattr(c, "init", f"T.float32({L.core_opts['c']!r})")),
    "init_buffer": (False, None, None),  # init reads a param X (rendered in render_tir)
    "max_reduce": (False, None, lambda L, c: setattr(c, "acc", lambda cl, p: f"T.max({cl}, {p})")),
    "prod_reduce": (False, None, lambda L, c: (
        setattr(c, "acc", lambda cl, p: f"{cl} * ({p})"), setattr(c, "init", "T.float32(1.0)"))),
    "sub_reduce": (False, None, lambda L, c: setattr(c, "acc", lambda cl, p: f"{cl} - {p}")),
    "sum_a_plus_w": (False, None, lambda L, c: setattr(c, "prod", lambda a, w: f"{a} + {w}")),
    "a_times_a": (False, None, lambda L, c: setattr(c, "w_load", lambda b, i: None)),
    "cast_f16_operands": (False, None, _cast_in),
    "cast_inside_product": (False, None, lambda L, c: setattr(
        c, "prod", lambda a, w: f'T.Cast("float32", T.Cast("float16", {a} * {w}))')),
    "dtype_f16": (False, None, _dtype("float16")),
    "dtype_f64": (False, None, _dtype("float64")),
    "out_f64": (False, None, _out_f64),
    "split_k": (False, None, _split_k),
    "batched_weight": (True, "rows2", _batched_w),
    "dup_out_index": (False, "rows1", _dup_out),
    "partial_rows": (False, "rows_gt1", lambda L, c: setattr(
        c, "iter_rows", [L.rows[0] - 1] + L.rows[1:])),
    # W declared [K, N] but read W[n, k] (or the other way round): with N == K that is
    # simply the other layout, and exactly what the kernel computes
    "w_declared_other_layout": (True, "square_w", lambda L, c: setattr(
        c, "w_shape", c.w_shape[::-1])),
}


# ------------------------------------------------------------------- TIR: epilogue steps


def _relu6_text(x, o, dt):
    lo, hi, outer_min, swap_in, swap_out = (o["lo"], o["hi"], o["outer_min"], o["swap_in"],
                                            o["swap_out"])
    f_in, f_out, b_in, b_out = ("max", "min", lo, hi) if outer_min else ("min", "max", hi, lo)
    inner = f"T.{f_in}({_c(dt, b_in)}, {x})" if swap_in else f"T.{f_in}({x}, {_c(dt, b_in)})"
    return (f"T.{f_out}({_c(dt, b_out)}, {inner})" if swap_out
            else f"T.{f_out}({inner}, {_c(dt, b_out)})")


def _hard(t, shift):
    """clip(x + shift, 0, 6) as a hardswish writes it."""
    return f"T.max(T.min({t.x} + {_c(t.dt, shift)}, {_c(t.dt, 6.0)}), {_c(t.dt, 0.0)})"


def _nan(x, text, on):
    """A relu (or hardswish, hardsigmoid) step that propagates NaN like the kernels (for a
    case's twin)."""
    return f"T.Select(T.isnan({x}), {x}, {text})" if on else text


# kind -> form -> (valid, requirement, render(ctx) -> value). ``ctx``: see render_tir.
STEPS = {
    "bias": {
        "c_plus_b": (True, None, lambda t: f"{t.x} + {t.p('B', [t.n])}[{t.j}]"),
        "b_plus_c": (True, None, lambda t: f"{t.p('B', [t.n])}[{t.j}] + {t.x}"),
        "b_1n": (True, None, lambda t: f"{t.x} + {t.p('B', [1, t.n])}[0, {t.j}]"),
        "b_view": (True, "static", lambda t: f"{t.x} + {t.p('B', [t.n], view=True)}[{t.j}]"),
        "b_by_row": (False, None, lambda t: f"{t.x} + {t.p('B', [t.rows[0]])}[{t.r[0]}]"),
        # NOTE: with every row extent 1 a full-shape bias is a per-column bias (and is
        # offloaded): keep a row of extent > 1
        "b_full": (False, "rows_gt1", lambda t: f"{t.x} + {t.p('B', t.rows + [t.n])}[{t.idx}]"),
        "b_2n": (False, None, lambda t: f"{t.x} + {t.p('B', [2, t.n])}[1, {t.j}]"),
        "b_scalar": (False, None, lambda t: f"{t.x} + {t.p('B', [1])}[0]"),
        "b_0d": (False, None, lambda t: f"{t.x} + {t.p('B', [])}[()]"),
        "c_minus_b": (False, None, lambda t: f"{t.x} - {t.p('B', [t.n])}[{t.j}]"),
        "c_times_b": (False, None, lambda t: f"{t.x} * {t.p('B', [t.n])}[{t.j}]"),
        "scaled_c": (False, None,
                     lambda t: f"{t.x} * {_c(t.dt, 2.0)} + {t.p('B', [t.n])}[{t.j}]"),
        "two_biases": (False, None, lambda t: f"{t.x} + {t.p('B', [t.n])}[{t.j}] + "
                                              f"{t.p('B2', [t.n])}[{t.j}]"),
        "cast_f16_bias": (False, None,
                          lambda t: f'{t.x} + T.Cast("{t.dt}", '
                                    f'{t.p("B", [t.n], "float16")}[{t.j}])'),
        "bias_inner2": (False, "static",
                        lambda t: f"{t.x} + {t.p('B', [t.n], strides='inner2')}[{t.j}]"),
        "reads_self": (False, None, lambda t: f"{t.x} + {t.prev}[{t.row0}]"),
        "c_plus_c": (False, None, lambda t: f"{t.x} + {t.x}"),
    },
    "relu": {
        "max_x_0": (True, None, lambda t: _nan(t.x, f"T.max({t.x}, {_c(t.dt, 0.0)})", t.nanprop)),
        "max_0_x": (True, None, lambda t: _nan(t.x, f"T.max({_c(t.dt, 0.0)}, {t.x})", t.nanprop)),
        "select_gt": (True, None, lambda t: _nan(t.x, f"T.Select({t.x} > {_c(t.dt, 0.0)}, {t.x}, "
                                                      f"{_c(t.dt, 0.0)})", t.nanprop)),
        "select_ge": (True, None, lambda t: _nan(t.x, f"T.Select({t.x} >= {_c(t.dt, 0.0)}, {t.x}, "
                                                      f"{_c(t.dt, 0.0)})", t.nanprop)),
        "select_0_lt": (True, None, lambda t: _nan(t.x, f"T.Select({_c(t.dt, 0.0)} < {t.x}, "
                                                        f"{t.x}, {_c(t.dt, 0.0)})", t.nanprop)),
        "select_lt_0": (True, None, lambda t: _nan(t.x, f"T.Select({t.x} < {_c(t.dt, 0.0)}, "
                                                        f"{_c(t.dt, 0.0)}, {t.x})", t.nanprop)),
        "if_then_else": (True, None, lambda t: _nan(t.x, f"T.if_then_else({t.x} > {_c(t.dt, 0.0)}, "
                                                         f"{t.x}, {_c(t.dt, 0.0)})", t.nanprop)),
        "max_x_c": (False, None, lambda t: f"T.max({t.x}, {_c(t.dt, t.o['c'])})"),
        "min_x_0": (False, None, lambda t: f"T.min({t.x}, {_c(t.dt, 0.0)})"),
        "select_swapped": (False, None, lambda t: f"T.Select({t.x} > {_c(t.dt, 0.0)}, "
                                                  f"{_c(t.dt, 0.0)}, {t.x})"),
        "select_at_c": (False, None, lambda t: f"T.Select({t.x} > {_c(t.dt, t.o['c'])}, {t.x}, "
                                               f"{_c(t.dt, 0.0)})"),
        "select_else_c": (False, None, lambda t: f"T.Select({t.x} > {_c(t.dt, 0.0)}, {t.x}, "
                                                 f"{_c(t.dt, t.o['c'])})"),
        "max_x_buffer": (False, None,
                         lambda t: f"T.max({t.x}, {t.p('Z', t.rows + [t.n])}[{t.idx}])"),
        "relu_scaled": (False, None, lambda t: f"T.max({t.x}, {_c(t.dt, 0.0)}) * {_c(t.dt, 2.0)}"),
        "relu_other_row": (False, "rows_gt1",
                           lambda t: f"T.max({t.prev}[{t.row0}], {_c(t.dt, 0.0)})"),
        "dup_out_index": (False, "square", None),  # O[i, i] = max(C[i, i], 0): render_tir
        "reads_dense_result": (False, None,  # skips the bias step's result (left unread)
                               lambda t: f"T.max({t.first}[{t.idx}], {_c(t.dt, 0.0)})"),
        "relu_plus_x": (False, None, lambda t: f"T.max({t.x}, {_c(t.dt, 0.0)}) + {t.x}"),
    },
    "relu6": {
        "clamp_0_6": (True, None, lambda t: _nan(t.x, _relu6_text(t.x, t.o, t.dt), t.nanprop)),
        "clamp_other": (False, None, lambda t: _relu6_text(t.x, t.o, t.dt)),
        "clamp_inverted": (False, None,
                           lambda t: _relu6_text(t.x, dict(t.o, lo=6.0, hi=0.0), t.dt)),
    },
    "tail": {
        "tanh": (True, None, lambda t: f"T.tanh({t.x})"),
        "exp": (True, None, lambda t: f"T.exp({t.x})"),
        "sigmoid": (True, None, lambda t: f"T.sigmoid({t.x})"),
        "abs": (True, None, lambda t: f"T.fabs({t.x})"),
        "scale": (True, None, lambda t: f"{t.x} * {_c(t.dt, 0.5)}"),
        "residual": (True, None, lambda t: f"{t.x} + {t.p('R', t.rows + [t.n])}[{t.idx}]"),
        "cast_f16": (True, None, lambda t: f'T.Cast("float16", {t.x})'),  # only ever last
        "hardswish": (True, None, lambda t: _nan(t.x, f"{t.x} * {_hard(t, 3.0)} / "
                                                      f"{_c(t.dt, 6.0)}", t.nanprop)),
        "hardsigmoid": (True, None,
                        lambda t: _nan(t.x, f"{_hard(t, 3.0)} / {_c(t.dt, 6.0)}", t.nanprop)),
        # bends at -2.5 and 3.5: no hardswish
        "hardswish_near": (True, None, lambda t: f"{t.x} * {_hard(t, 2.5)} / {_c(t.dt, 6.0)}"),
    },
}

# Blocks and buffer tricks around a layer's chain (rendered in _render_layer): how many
# epilogue steps a kernel may still take over (None: as many as are valid).
EXTRAS = {
    "later_read": lambda L: L.extra_opts["at"],  # a later block reads that intermediate
    "write_input_between": lambda L: 0,  # A changes between the dense and its epilogue
    "alias_write_between": lambda L: 0,  # the same, through another view of A's memory
    "last_into_a": lambda L: len(L.steps) - 1,  # the last step overwrites A
    "read_output_between": None,  # reads the layer's output before the epilogue writes it
    "write_bias_between": None,  # the bias changes before the bias step reads it
    "bias_between": None,  # the bias is computed between the dense and the bias step
    "bias_before": None,  # ... or before the dense
    "mid_param": None,  # two layers, the first one's result a param
    "mid_alloc": None,  # two layers, the first one's result an intermediate buffer
}


@dataclass
class _StepCtx:
    """What a step renderer sees: the input load ``x``, indices, and ``p`` to add params."""

    fn: _Fn
    prev: str  # the previous step's result
    first: str  # the dense's result
    r: list  # row vars
    j: str
    rows: list
    n: int
    dt: str
    o: dict
    nanprop: bool
    tag: str

    @property
    def idx(self) -> str:
        return ", ".join(self.r + [self.j])

    @property
    def x(self) -> str:
        return f"{self.prev}[{self.idx}]"

    @property
    def row0(self) -> str:
        """The indices of the first row, this column."""
        return ", ".join(["0"] * len(self.r) + [self.j])

    def p(self, name, dims, dtype=None, view=False, strides=None) -> str:
        name = f"{name}{self.tag}"
        dtype = dtype or self.dt
        if view:
            self.fn.view(name, dims, dtype)
            return name
        return self.fn.param(name, dims, dtype, strides=strides)


# ------------------------------------------------------------------- TIR: rendering


def render_tir(L: Layer, fname: str, nanprop=()):
    """``(TVMScript text, args)`` of a layer (and its second layer)."""
    fn = _Fn(int64=L.symbolic)
    fn.syms = dict(L.syms)
    _render_layer(fn, L, "", None, list(nanprop) + [0, 0])
    return fn.text(fname), fn.args


def _render_layer(fn: _Fn, L: Layer, tag: str, a_name, nanprop):
    d = len(L.rows)
    r = [f"i{i}" for i in range(d)]
    core = Core(a_shape=L.rows + [L.k], a_idx=r + ["k"],
                w_shape=[L.n, L.k] if L.layout == "nt" else [L.k, L.n],
                w_idx=["j", "k"] if L.layout == "nt" else ["k", "j"],
                out_idx=r + ["j"], red=[("k", L.k)])
    mutate = CORES[L.core][2]
    if mutate:
        mutate(L, core)
    core.init = core.init or _c(core.acc_dt, 0.0)
    ex = L.extra
    # ---- inputs
    if a_name is None:
        if ex == "alias_write_between":
            base = fn.param("P", core.a_shape, core.dt)
            region = ", ".join(f"0:{fn.e(x)}" for x in core.a_shape)
            st = [1] * len(core.a_shape)
            for i in range(len(st) - 2, -1, -1):
                st[i] = st[i + 1] * core.a_shape[i + 1]
            fn.view("A", core.a_shape, core.dt, alias=(base, region, st, 0))
            if L.extra_opts["through_view"]:
                fn.view("X", core.a_shape, core.dt, alias=(base, region, st, 0))
            a_name = "A"
        elif L.strides.get("a") == "view":
            fn.view("A", core.a_shape, core.dt, out=ex == "last_into_a")
            a_name = "A"
        else:
            a_name = fn.param("A", core.a_shape, core.dt, out=ex == "last_into_a",
                              strides=L.strides.get("a"))
    w = fn.param(f"W{tag}", core.w_shape, core.dt, strides=L.strides.get("w"))
    steps = L.steps
    out_dims = L.rows + [L.n]
    # ---- buffers: C, one per step; the last one is the output (or feeds layer 2)
    names = [f"C{tag}"] + [f"S{tag}{i}" for i in range(len(steps))]
    # the result is a param unless layer 2 reads it from an intermediate buffer
    last_out = (L.second is None or L.extra == "mid_param") and ex != "last_into_a"
    outs = {}
    last_dt = "float16" if steps and steps[-1].form == "cast_f16" else core.acc_dt
    for i, nm in enumerate(names):
        if ex == "last_into_a" and i == len(steps):
            continue  # the last step writes A itself
        dt = last_dt if i == len(steps) else core.acc_dt
        if i < len(steps) or not last_out:
            outs[nm] = fn.alloc(nm, out_dims, dt)
        elif L.strides.get("o") == "view":
            fn.view(nm, out_dims, dt, out=True)
            outs[nm] = nm
        else:
            outs[nm] = fn.param(nm, out_dims, dt, out=True, strides=L.strides.get("o"))
    if ex == "last_into_a":
        names[-1] = a_name
    if L.core == "init_buffer":
        core.init = f"{fn.param('X' + tag, out_dims, core.acc_dt)}[{', '.join(core.out_idx)}]"
    # ---- a bias computed by a block of its own (before or after the dense)
    bias_block = None
    if ex in ("bias_before", "bias_between"):
        b = fn.param(f"B{tag}", [L.n])
        b2 = fn.alloc(f"B2{tag}", [L.n])
        bias_block = (f"bias_src{tag}", [("j", L.n, "S")],
                      f"{b2}[j] = {b}[j] * T.float32(2.0)")
        if ex == "bias_before":
            fn.block(*bias_block)
    # ---- the dense block
    a_load = (core.a_load or (lambda b, i: f"{b}[{i}]"))(a_name, ", ".join(core.a_idx))
    w_load = (core.w_load or (lambda b, i: f"{b}[{i}]"))(w, ", ".join(core.w_idx)) or a_load
    prod = (core.prod or (lambda a, w_: f"{a} * {w_}"))(*((w_load, a_load) if L.w_first
                                                          else (a_load, w_load)))
    c_load = f"{names[0]}[{', '.join(core.out_idx)}]"
    acc = core.acc or ((lambda cl, p: f"{p} + {cl}") if L.acc_first
                       else (lambda cl, p: f"{cl} + {p}"))
    sp = [(v, x, "S") for v, x in zip(r, L.rows)]
    shuffle = np.random.default_rng(L.shuffle) if L.shuffle else None
    fn.block(f"mm{tag}", [(v, x, "S") for v, x in zip(r, core.iter_rows or L.rows)] +
             [("j", L.n, "S")] + [(v, x, "R") for v, x in core.red],
             f"{c_load} = {acc(c_load, prod)}", f"{c_load} = {core.init}", shuffle)
    # ---- blocks between the dense and its epilogue
    if ex == "bias_between":
        fn.block(*bias_block)
    if ex == "write_input_between":
        ai = ", ".join(f"a{i}" for i in range(len(core.a_shape)))
        fn.block(f"clobber{tag}", [(f"a{i}", x, "S") for i, x in enumerate(core.a_shape)],
                 f"{a_name}[{ai}] = {a_name}[{ai}] * T.float32(2.0)")
    if ex == "alias_write_between":
        ai = ", ".join(f"a{i}" for i in range(len(core.a_shape)))
        tgt = "X" if L.extra_opts["through_view"] else "P"
        fn.block(f"clobber{tag}", [(f"a{i}", x, "S") for i, x in enumerate(core.a_shape)],
                 f"{tgt}[{ai}] = {tgt}[{ai}] + T.float32(1.0)")
    if ex == "read_output_between":
        p2 = fn.param(f"P2{tag}", out_dims, last_dt, out=True)
        fn.block(f"peek{tag}", sp + [("j", L.n, "S")],
                 f"{p2}[{', '.join(r + ['j'])}] = {names[-1]}[{', '.join(r + ['j'])}]")
    if ex == "write_bias_between":
        b = f"B{tag}"  # the bias step's param (declared below, by name)
        fn.block(f"bump{tag}", [("j", L.n, "S")], f"{b}[j] = {b}[j] + T.float32(1.0)")
    # ---- the epilogue chain
    for i, st in enumerate(steps):
        dt = core.acc_dt
        ctx = _StepCtx(fn, names[i], names[0], r, "j", L.rows, L.n, dt, st.opts,
                       i < nanprop[0], tag)
        if ex in ("bias_before", "bias_between") and st.kind == "bias":
            value = f"{ctx.x} + B2{tag}[j]"
        elif st.form == "dup_out_index":
            value = f"T.max({names[i]}[i0, i0], {_c(dt, 0.0)})"
        else:
            value = STEPS[st.kind][st.form][2](ctx)
        o_idx = "i0, i0" if st.form == "dup_out_index" else ", ".join(r + ["j"])
        fn.block(f"{st.kind}{tag}_{i}", sp + [("j", L.n, "S")],
                 f"{names[i + 1]}[{o_idx}] = {value}", shuffle=shuffle)
    if ex == "later_read":
        x = names[L.extra_opts["at"]]
        p2 = fn.param(f"P2{tag}", out_dims, core.acc_dt, out=True)
        fn.block(f"later{tag}", sp + [("j", L.n, "S")],
                 f"{p2}[{', '.join(r + ['j'])}] = {x}[{', '.join(r + ['j'])}]")
    if L.second is not None:
        _render_layer(fn, L.second, "_2", names[-1], nanprop[1:])


def expected_tir(L: Layer) -> tuple:
    """The longest valid prefix of every layer, as intrinsic names."""
    valid = CORES[L.core][0] and L.strides.get("a") not in ("inner2", "gap") \
        and L.strides.get("w") != "inner2"
    out = []
    if not valid:
        out.append(None)
    else:
        kinds = []
        cut = len(L.steps)
        if L.extra and EXTRAS[L.extra] is not None:
            cut = EXTRAS[L.extra](L)
        if L.strides.get("o") == "inner2" and L.second is None:
            cut = min(cut, len(L.steps) - 1)
        one_row = all(r == 1 for r in L.rows)
        for st in L.steps[:max(cut, 0)]:
            if st.kind == "bias" and st.form == "b_full":
                # a tensor of the output's shape: a residual (over one row, a bias)
                kinds.append("bias" if one_row and "bias" not in kinds else "residual")
                continue
            if st.kind == "tail" and st.form == "residual" and one_row and "bias" not in kinds:
                kinds.append("bias")  # over one row a [1, N] residual is a column bias
                continue
            if not st.valid:
                break
            if st.kind in KERNEL_STEPS:
                kinds.append(st.kind)
            elif st.kind == "tail" and st.form in CHAIN_TAILS:
                kinds.append(st.form)
            else:
                break
        if cut < 0:
            out.append(None)
        else:
            out.append(intrinsic_for(kinds))
    if L.second is not None:
        out += list(expected_tir(L.second))
    return tuple(out)


# ------------------------------------------------------------------- TIR: random layers


def _dims(rng, lo=1, hi=40):
    # NOTE: small sizes (1, 2, 3) and the kernels' tile edges are the interesting ones
    return max(lo, int(rng.choice([1, 2, 3, rng.integers(lo, hi + 1), rng.integers(lo, hi + 1),
                                   rng.integers(lo, hi + 1)])))


def _valid_step(rng, kind) -> Step:
    forms = [f for f, (ok, req, _) in STEPS[kind].items() if ok and req is None]
    o = {}
    if kind == "relu6":
        o = dict(lo=0.0, hi=6.0, outer_min=bool(rng.integers(2)), swap_in=bool(rng.integers(2)),
                 swap_out=bool(rng.integers(2)))
    return Step(kind, str(rng.choice(forms)), True, o)


def _chain(rng, bias=None, act=None, tail=None):
    """A random valid chain: [bias] [relu | relu6] [tail]."""
    bias = rng.random() < 0.6 if bias is None else bias
    act = str(rng.choice(["relu", "relu6", ""], p=[0.5, 0.25, 0.25])) if act is None else act
    tail = rng.random() < 0.2 if tail is None else tail
    steps = [_valid_step(rng, "bias")] if bias else []
    if act:
        steps.append(_valid_step(rng, act))
    if tail:
        steps.append(_valid_step(rng, "tail"))
    return steps


def base_layer(rng, rows_nd=None, symbolic=None, steps=None) -> Layer:
    nd = rows_nd or int(rng.choice([1, 1, 1, 2, 3]))
    rows = [_dims(rng) for _ in range(nd)]
    if nd > 1:
        rows = [min(x, 6) for x in rows[:-1]] + rows[-1:]  # keep M small
    sym = rng.random() < 0.15 if symbolic is None else symbolic
    L = Layer(rows, _dims(rng), _dims(rng), str(rng.choice(["nt", "nn"])),
              bool(rng.integers(2)), bool(rng.integers(2)),
              steps=_chain(rng) if steps is None else steps)
    if sym:
        L.rows[int(rng.integers(nd))] = "m"
        L.syms = {"m": _dims(rng)}
    if rng.random() < 0.3:
        L.shuffle = int(rng.integers(1, 2**31))
    return L


def _fit(L: Layer, req, rng):
    """Change ``L`` so that it meets ``req``."""
    if req in ("static", "rows2", "rows_gt1", "square"):
        L.rows = [L.syms.get(x, x) for x in L.rows]
        L.syms = {}
    if req == "rows1":
        L.rows = L.rows[:1]
    if req == "rows2":
        L.rows = (L.rows + [2, 5])[:2]
        L.rows[0] = max(L.rows[0], 2)
    if req == "rows_gt1":
        L.rows[0] = max(L.rows[0], 2)
    if req == "square":
        L.rows = L.rows[:1]
        L.n = L.rows[0]
    if req == "square_w":
        L.k = L.n
    L.syms = {x: v for x, v in L.syms.items() if x in L.rows + [L.n, L.k]}
    if req == "split":
        L.k = int(rng.integers(2, 9)) * int(rng.integers(2, 6))


# ------------------------------------------------------------------- TIR: variants


def _core_variant(core):
    def make(rng):
        L = base_layer(rng)
        req = CORES[core][1]
        _fit(L, req, rng)
        L.core = core
        if core == "split_k":
            _fit(L, "split", rng)
            L.core_opts = {"k1": next(d for d in range(2, L.k) if L.k % d == 0)}
        if core == "scale":
            L.core_opts = {"c": float(rng.choice([0.5, 2.0, -1.0, 3.0])),
                           "form": int(rng.integers(3))}
        if core == "init_const":
            L.core_opts = {"c": float(rng.choice([1.0, -2.5, 0.5]))}
        if core == "dup_out_index":
            _fit(L, "square", rng)
        if core in ("dup_out_index", "partial_rows"):
            L.steps = []  # C's other entries would be garbage to an epilogue
        if core in ("dtype_f16", "dtype_f64", "out_f64"):
            L.steps = [s for s in L.steps if s.kind != "tail" or s.form != "sigmoid"]
        return L
    return make


def _step_variant(kind, form):
    def make(rng):
        L = base_layer(rng)
        valid, req, _ = STEPS[kind][form]
        _fit(L, req, rng)
        st = Step(kind, form, valid)
        if kind == "relu6":
            st.opts = dict(lo=0.0, hi=6.0, outer_min=bool(rng.integers(2)),
                           swap_in=bool(rng.integers(2)), swap_out=bool(rng.integers(2)))
            if form == "clamp_other":
                st.opts["lo"], st.opts["hi"] = [(0.0, 5.0), (-1.0, 6.0), (0.0, 6.5), (1.0, 6.0)][
                    int(rng.integers(4))]
        if form in ("max_x_c", "select_at_c", "select_else_c"):
            st.opts = {"c": float(rng.choice([0.5, -1.0, 1e-3, 1.0]))}
        if kind == "bias":
            L.steps = [st] + _chain(rng, bias=False, tail=False)
        else:
            L.steps = _chain(rng, act="", tail=False) + [st] + (
                [_valid_step(rng, "tail")] if rng.random() < 0.3 else [])
        if form == "dup_out_index":
            L.steps = [st]  # the relu must read the dense result directly
        if form == "reads_dense_result":
            L.steps = [Step("bias", "c_plus_b", True), st]
        return L
    return make


def _extra_variant(extra):
    def make(rng):
        L = base_layer(rng)
        L.extra = extra
        if extra in ("later_read", "write_input_between", "alias_write_between",
                     "read_output_between", "last_into_a"):
            if not L.steps:
                L.steps = _chain(rng, act="relu")
        if extra == "later_read":
            L.extra_opts = {"at": int(rng.integers(len(L.steps)))}
        if extra == "alias_write_between":
            _fit(L, "static", rng)
            L.extra_opts = {"through_view": bool(rng.integers(2))}
        if extra in ("bias_before", "bias_between", "write_bias_between"):
            L.steps = [Step("bias", "c_plus_b", True)] + _chain(rng, bias=False)
        if extra == "last_into_a":
            L.n = L.k
            L.steps = [s for s in L.steps if s.kind != "tail"] or [_valid_step(rng, "relu")]
        return L
    return make


def _strided(which, mode):
    def make(rng):
        L = base_layer(rng, symbolic=False)
        if mode == "gap":
            _fit(L, "rows2", rng)
        if which == "o" and mode == "inner2" and not L.steps:
            L.steps = _chain(rng, act="relu")
        L.strides = {which: mode}
        return L
    return make


def _two_layers(mid):
    """Two dense layers in one function; layer 1's result is a param (``mid_param``) or
    an intermediate buffer that only the two kernels touch (``mid_alloc``)."""
    def make(rng):
        L = base_layer(rng)
        L.steps = _chain(rng, tail=False)
        L.extra = mid
        L.second = base_layer(rng, symbolic=False)
        L.second.rows, L.second.k = L.rows, L.n
        return L
    return make


def _symbolic_n_k(rng):
    L = base_layer(rng)
    for dim, name in (("n", "sn"), ("k", "sk")):
        if rng.random() < 0.7:
            L.syms[name] = getattr(L, dim)
            setattr(L, dim, name)
    return L


def _all_views(rng):
    L = base_layer(rng, symbolic=False)
    L.strides = {"a": "view", "o": "view"}
    L.steps = [Step("bias", "b_view", True)] + _chain(rng, bias=False)
    return L


@dataclass(frozen=True)
class Variant:
    name: str
    accept: bool
    make: Callable  # rng -> Layer | RelaxSpec
    weight: float = 1.0


TIR_VARIANTS = [
    # accepted forms: everything random, then one feature forced
    Variant("accept/any", True, lambda rng: base_layer(rng), 6),
    Variant("accept/dense_only", True, lambda rng: base_layer(rng, steps=[])),
    Variant("accept/bias_relu", True,
            lambda rng: base_layer(rng, steps=_chain(rng, True, "relu"))),
    Variant("accept/relu6", True, lambda rng: base_layer(rng, steps=_chain(rng, act="relu6"))),
    Variant("accept/tail", True, lambda rng: base_layer(rng, steps=_chain(rng, tail=True))),
    Variant("accept/rows_nd", True,
            lambda rng: base_layer(rng, rows_nd=int(rng.choice([2, 3])))),
    Variant("accept/symbolic", True, lambda rng: base_layer(rng, symbolic=True)),
    Variant("accept/strided_a", True, _strided("a", "rows")),
    Variant("accept/strided_w", True, _strided("w", "rows")),
    Variant("accept/strided_out", True, _strided("o", "rows")),
    # NOTE: views matched in the root block may alias their source; such functions are
    # refused whole (the matcher compares buffers by identity)
    Variant("extra/root_views", False, _all_views),
    Variant("accept/two_layers", True, _two_layers("mid_param")),
    Variant("accept/two_layers_via_buffer", True, _two_layers("mid_alloc")),
    Variant("accept/bias_before", True, _extra_variant("bias_before")),
    # symbolic N and K: not promised by docs/architecture.md, so either way, but never wrong
    Variant("sym/n_k", False, _symbolic_n_k),
    # look-alikes of the reduction
    *[Variant(f"core/{c}", False, _core_variant(c)) for c in CORES if c != "ok"],
    Variant("core/a_inner_stride", False, _strided("a", "inner2")),
    Variant("core/w_inner_stride", False, _strided("w", "inner2")),
    Variant("core/rows_do_not_collapse", False, _strided("a", "gap")),
    # look-alikes of the epilogue steps
    *[Variant(f"{k}/{f}", False, _step_variant(k, f), 0.5 if k == "relu" else 1.0)
      for k in ("bias", "relu", "relu6") for f, (ok, _, _) in STEPS[k].items() if not ok],
    Variant("out/inner_stride", False, _strided("o", "inner2")),
    # look-alikes around the chain
    *[Variant(f"extra/{e}", False, _extra_variant(e)) for e in EXTRAS
      if e not in ("bias_before", "mid_param", "mid_alloc")],
]


# ------------------------------------------------------------------- Relax


@dataclass
class RelaxSpec:
    rows: list  # "m" is symbolic
    k: int
    n: int
    layout: str = "nt"
    weight_const: bool = False
    bias: str = ""  # "" | "n" | "1n" | "row" | "full" | "one" | "scalar"
    bias_first: bool = False
    bias_const: bool = False
    act: str = ""  # key in RELAX_ACTS
    tail: str = ""  # "" | "tanh" | "residual" | "exp"
    core: str = "ok"  # "ok" | "batched" | "f16" | "x_transposed" | "linear" | "matvec"
    # | "shared_weight" (w also feeds a second, untransposed matmul)
    both_outputs: bool = False  # return the pre-activation too
    sym: int = 0


RELAX_BIAS_VALID = {"": True, "n": True, "1n": True, "row": False, "full": False,
                    "one": False, "scalar": False}


def _relax_acts():
    from tvm import relax

    op = relax.op
    return {  # name: (valid, kind, build(h))
        "": (True, None, lambda h: h),
        "relu": (True, "relu", op.nn.relu),
        "relu6": (True, "relu6", op.nn.relu6),
        "clip_0_6": (True, "relu6", lambda h: op.clip(h, 0.0, 6.0)),
        "clip_0_5": (False, None, lambda h: op.clip(h, 0.0, 5.0)),
        "clip_m1_6": (False, None, lambda h: op.clip(h, -1.0, 6.0)),
        "leakyrelu": (False, None, lambda h: op.nn.leakyrelu(h, 0.1)),
        "gelu": (True, "gelu_erf", op.nn.gelu),
        "silu": (True, "silu", op.nn.silu),
        "max_half": (False, None, lambda h: op.maximum(h, relax.const(0.5, "float32"))),
        "times_2": (True, "scale", lambda h: op.multiply(h, relax.const(2.0, "float32"))),
    }


def relax_function(s: RelaxSpec, name: str, bb, rng_consts, nanprop=False):
    """Emit ``s`` as function ``name`` into ``bb``; returns its params' shapes/dtypes."""
    import tvm
    from tvm import relax

    op = relax.op
    dt = "float16" if s.core == "f16" else "float32"
    m = tvm.tirx.Var("m", "int64")
    rows = [m if r == "m" else r for r in s.rows]
    params, args = [], []

    def tensor(pname, shape, const):
        conc = tuple(s.sym if x is m else x for x in shape)
        if const:
            return relax.const(rng_consts(conc, dt), dt)
        v = relax.Var(f"{pname}", relax.TensorType(tuple(shape), dt))
        params.append(v)
        args.append(Arg(pname, dt, conc))
        return v

    if s.core == "batched":
        x = tensor("x", rows + [s.k], False)
        w = tensor("w", [rows[0], s.k, s.n], s.weight_const)
    elif s.core == "matvec":
        x = tensor("x", rows + [s.k], False)
        w = tensor("w", [s.k], s.weight_const)
    elif s.core == "x_transposed":
        x = tensor("x", [s.k] + rows, False)
        w = tensor("w", [s.n, s.k] if s.layout == "nt" else [s.k, s.n], s.weight_const)
    else:
        x = tensor("x", rows + [s.k], False)
        w = tensor("w", [s.n, s.k] if s.layout == "nt" else [s.k, s.n], s.weight_const)
    bshape = {"n": [s.n], "1n": [1, s.n], "row": rows[:-1] + [rows[-1], 1],
              "full": rows + [s.n], "one": [1], "scalar": []}.get(s.bias)
    b = tensor("b", bshape, s.bias_const) if s.bias else None
    res = tensor("r", rows + [s.n], False) if s.tail == "residual" else None
    z = tensor("z", [rows[-1], s.n], False) if s.core == "shared_weight" else None
    acts = _relax_acts()
    with bb.function(name, params):
        with bb.dataflow():
            if s.core == "x_transposed":
                x = bb.emit(op.permute_dims(x, [1, 0]))
            if s.core == "linear":
                h = bb.emit(op.linear(x, w, b if s.bias else None))
            else:
                wk = bb.emit(op.permute_dims(w, [1, 0])) if s.layout == "nt" and \
                    s.core not in ("batched", "matvec") else w
                h = bb.emit(op.matmul(x, wk))
                if b is not None:
                    h = bb.emit(op.add(b, h) if s.bias_first else op.add(h, b))
            pre = h
            if s.act:
                valid, kind, build = acts[s.act]
                y = build(h)
                if nanprop and kind:
                    y = op.where(op.isnan(h), h, y)
                h = bb.emit(y)
            if s.tail == "tanh":
                h = bb.emit(op.tanh(h))
            elif s.tail == "exp":
                h = bb.emit(op.exp(h))
            elif s.tail == "residual":
                h = bb.emit(op.add(h, res))
            outs = [pre, h] if s.both_outputs else [h]
            if z is not None:  # z @ w: the same w read as [K', N'] = [N, K], untransposed
                outs.append(bb.emit(op.matmul(z, w)))
            out = bb.emit_output(relax.Tuple(outs) if len(outs) > 1 else h)
        bb.emit_func_output(out)
    return args


def expected_relax(s: RelaxSpec) -> tuple:
    """Like ``expected_tir``; the order of the layers does not matter."""
    if s.core == "f16":
        return (None,)
    if s.core == "matvec":  # x[.., k] @ w[k]: a batched matrix-vector product
        return ("dense",)
    if s.core == "shared_weight":
        return expected_relax(dataclasses.replace(s, core="ok")) + ("dense",)
    kinds = []
    if s.bias == "full" or (s.bias == "row" and s.n == 1):
        # a tensor of the output's shape (a per-row bias over one column is one too): a
        # residual, or over one row a bias
        kinds.append("bias" if all(r == 1 for r in s.rows) else "residual")
    elif s.bias:
        if not RELAX_BIAS_VALID[s.bias]:
            return ("dense",)
        kinds.append("bias")
    if s.both_outputs:  # the result before the activation is an output too: the end
        return (intrinsic_for(kinds),)
    if s.act:
        valid, kind, _ = _relax_acts()[s.act]
        if not valid:
            return (intrinsic_for(kinds),)
        if kind:
            kinds.append(kind)
    if s.tail == "tanh":
        kinds.append("tanh")
    elif s.tail == "residual":
        # NOTE: over one row, a [1, N] residual is a column bias (when there is none yet)
        one_row = all(r == 1 for r in s.rows)
        kinds.append("bias" if one_row and "bias" not in kinds else "residual")
    return (intrinsic_for(kinds),)


def _relax_base(rng, **kw) -> RelaxSpec:
    nd = int(rng.choice([1, 1, 2]))
    rows = [_dims(rng, 1, 12) for _ in range(nd - 1)] + [_dims(rng)]
    s = RelaxSpec(rows, _dims(rng), _dims(rng), str(rng.choice(["nt", "nn"])),
                  rng.random() < 0.4, str(rng.choice(["", "n", "n", "1n"])),
                  bool(rng.integers(2)), rng.random() < 0.3,
                  str(rng.choice(["", "relu", "relu", "relu6", "clip_0_6"])),
                  str(rng.choice(["", "", "", "tanh", "residual", "exp"])))
    if rng.random() < 0.2:
        s.rows[-1] = "m"
        s.sym = _dims(rng)
    return dataclasses.replace(s, **kw)


def _relax_bad_bias(rng):
    s = _relax_base(rng, bias=str(rng.choice(["row", "full", "one"])))
    if s.bias == "one" and s.n == 1:
        s.n = _dims(rng, 2)  # b[0] with N == 1 is a per-column bias
    if s.bias == "full" and all(r == 1 for r in s.rows):
        s.rows[-1] = _dims(rng, 2)  # over one row, a full-shape bias is per column
    if "m" in s.rows:
        s.bias_const = False  # a constant has no symbolic shape
    return s


def _relax_bad_act(rng):
    bad = [a for a, (ok, _, _) in _relax_acts().items() if not ok]
    return _relax_base(rng, act=str(rng.choice(bad)))


RELAX_VARIANTS = [
    Variant("relax/accept", True, lambda rng: _relax_base(rng), 4),
    Variant("relax/linear", True, lambda rng: _relax_base(rng, core="linear", layout="nt")),
    Variant("relax/x_transposed", True,
            lambda rng: _relax_base(rng, core="x_transposed", rows=[_dims(rng)])),
    Variant("relax/bias_shape", False, _relax_bad_bias, 1.5),
    Variant("relax/bias_0d", False, lambda rng: _relax_base(rng, bias="scalar")),
    Variant("relax/bias_1n_row_extent_1", True, lambda rng: dataclasses.replace(
        _relax_base(rng, rows=[_dims(rng, 1, 4), 1][int(rng.integers(2)):]), bias="1n")),
    Variant("relax/activation", False, _relax_bad_act, 1.5),
    Variant("relax/batched_matmul", False,
            lambda rng: _relax_base(rng, core="batched", rows=[_dims(rng, 1, 6), _dims(rng)])),
    Variant("relax/float16", False, lambda rng: _relax_base(rng, core="f16", weight_const=False)),
    Variant("relax/both_outputs", False,
            lambda rng: _relax_base(rng, both_outputs=True, act="relu", tail="")),
    Variant("relax/shared_weight", True,
            lambda rng: _relax_base(rng, core="shared_weight", layout="nt")),
    Variant("relax/matvec", False,
            lambda rng: _relax_base(rng, core="matvec", bias="", act="", tail="")),
]

RELAX_SHARE = 0.15


# ------------------------------------------------------------------- cases


VARIANTS = TIR_VARIANTS + RELAX_VARIANTS


def case(seed: int, index: int, only: str | None = None) -> Case:
    """Case ``index`` of the run with ``seed`` (the same whatever the run's length).

    ``only``: a case of that variant (for the tests of known bugs).
    """
    rng = np.random.default_rng([seed, index])
    if only is not None:
        v = next(v for v in VARIANTS if v.name == only)
    else:
        pool = RELAX_VARIANTS if rng.random() < RELAX_SHARE else TIR_VARIANTS
        p = np.array([v.weight for v in pool])
        v = pool[int(rng.choice(len(pool), p=p / p.sum()))]
    spec = v.make(rng)
    special = float(rng.choice([0.0, 0.01, 0.05, 0.15]))
    if isinstance(spec, Layer):
        _, args = render_tir(spec, f"c{index}")
        return Case(seed, index, v.name, "tir", v.accept, expected_tir(spec), args, spec,
                    special)
    return Case(seed, index, v.name, "relax", v.accept, expected_relax(spec), [], spec, special)


def relax_script(c: Case) -> str:
    from tvm import relax

    bb = relax.BlockBuilder()
    relax_function(c.spec, c.name, bb, constant_maker(c))
    return bb.get().script()


def constant_maker(c: Case):
    """Deterministic constants (weights, biases bound into a Relax function)."""
    rng = np.random.default_rng([c.seed, c.index, 7])

    def make(shape, dtype):
        return values(rng, shape, dtype, c.special)

    return make


def values(rng, shape, dtype, special) -> np.ndarray:
    """Normal values with a fraction ``special`` of NaN, +Inf, -Inf and exact zeros."""
    x = np.asarray(rng.standard_normal(shape)).astype(dtype)
    if special and x.size:
        hit = rng.random(x.shape) < special
        x[hit] = rng.choice(np.array([np.nan, np.inf, -np.inf, 0.0], dtype), hit.sum())
    return x


if __name__ == "__main__":
    seed, index = int(sys.argv[1]), int(sys.argv[2])
    c = case(seed, index, only=sys.argv[3] if len(sys.argv) > 3 else None)
    print(f"# variant {c.variant}; expected {c.expected}; inputs special fraction {c.special}")
    print(c.source() if c.kind == "tir" else relax_script(c))
