"""What a kernel computes: one constructor per family.

    from tirbyoc import ops
    ops.dense(epilogue=("bias", "relu"), weight="nt")          # y = relu(x @ w.T + b)
    ops.conv2d(weight="OHWI", epilogue=("bias", "relu"), stride=1, dilation=1, groups=1)

An ``Op`` names its family, its epilogue chain (applied in the order given, as the
model writes it), its layouts, dtypes and constraints. A constraint is a number (the
value must equal it) or a predicate (``n=lambda n: n % 8 == 0``); a region that breaks
one is not given to the kernel, and ``tirbyoc.explain`` says which constraint it broke.

Each family names its *roles*: what a kernel's C arguments may stand for. A kernel
declaration (``Library.kernel(symbol, computes=op, args=(...))``) lists, in C order,
the role of every argument; ``Op.check_roles`` says what is missing or unknown. Tensor
roles are pointers to the element type; size, stride and geometry roles are integers
(``int`` or ``int64_t``, any width); ``scale`` is a float. A stride role that a kernel
does not take means the kernel assumes the dense layout (the region must have it).

========== ==================================================================================
family     roles
========== ==================================================================================
dense      x [m, k], weight [n, k] (``weight="nt"``) or [k, n] (``"nn"``), bias [n],
           residual [m, n], y [m, n]; sizes m, n, k; row strides lda, ldw, ldc, ldr;
           scale (a float, with a "scale" step)
matmul     dense's, batched: sizes batch, m, n, k; batch strides batch_stride_x,
           batch_stride_weight, batch_stride_y (0: a broadcast operand)
conv2d     x [batch, in_channels, height, width] (``layout="NCHW"``), weight
           [out_channels, in_channels / groups, kernel_h, kernel_w] (``weight="OIHW"``) or
           [out_channels, kernel_h, kernel_w, in_channels / groups] (``"OHWI"``), bias
           [out_channels], residual and y [batch, out_channels, out_h, out_w]; sizes batch,
           in_channels, height, width, out_channels, kernel_h, kernel_w, out_h, out_w;
           geometry stride (both axes the same), stride_h, stride_w, pad (the same on
           all four sides), pad_top, pad_left, pad_bottom, pad_right, dilation, dilation_h,
           dilation_w, groups
max_pool2d x [batch, channels, height, width], y [batch, channels, out_h, out_w]; sizes
avg_pool2d batch, channels, height, width, out_h, out_w, kernel_h, kernel_w; geometry
           stride, stride_h, stride_w, pad, pad_top, pad_left, pad_bottom, pad_right
           (avg_pool2d: padding counts in the divisor when ``count_include_pad``)
softmax    x, y [rows, cols] (over the last axis; leading axes are rows); sizes rows, cols;
           row strides ldx, ldy
attention  q, k, v, mask (bytes), y; sizes batch, seq_q, seq_k, head_dim, value_dim; row
           and batch strides; scale (declared and checked; matched for the built-in
           kernel only so far)
========== ==================================================================================

Each family is registered once, below (``_family``): its roles, layouts and
constraints, where it is matched (``stage``: a graph-level rewrite, or None for the TIR
matcher) and its ``tirbyoc.check`` (``checker``). Adding a family is its rewrite file
and one registration here (with its constructor).

Epilogue steps: bias, relu, relu6, gelu (erf form), gelu_tanh, silu, sigmoid, tanh,
hardswish (``v * clip(v + 3, 0, 6) / 6``), hardsigmoid (``clip(v + 3, 0, 6) / 6``),
scale (``* c``), residual (``+ r``, a tensor of the output's shape). Matrix and
convolution families take them; pooling and softmax take none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

EPILOGUE_STEPS = ("bias", "relu", "relu6", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh",
                  "hardswish", "hardsigmoid", "scale", "residual")
# What a step adds to a family's roles: an operand, or a scalar.
_STEP_ROLES = {"bias": ("bias",), "residual": ("residual", "ldr"), "scale": ("scale",)}


@dataclass(frozen=True)
class Const:
    """An argument that is the same on every call (``ops.const(value)`` in ``args``): a
    flag, a mode, an epilogue code; 0 for a pointer argument passes NULL."""

    value: object


def const(value) -> Const:
    """A constant argument, in a kernel's ``args`` in place of a role."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"a constant argument is an int or a float, got {value!r}")
    return Const(value)


@dataclass(frozen=True)
class Role:
    """One kind of C argument: ``kind`` is "in"/"out" (a tensor pointer), "size" (an
    integer), "float"; ``required``: a kernel must take it, unless ``implied`` names
    the constraint that fixes its value."""

    name: str
    kind: str
    required: bool = True
    implied: tuple = ()


def _tensor(name, kind="in"):
    return Role(name, kind)


def _size(name, required=True, implied=()):
    return Role(name, "size", required, tuple(implied))


@dataclass(frozen=True)
class Family:
    """One family's registration: its roles, whether it takes an epilogue, its layouts
    and constraints; where it is matched: ``stage`` ("module:function") is the
    graph-level rewrite that offers its regions to the declared kernels before
    legalization (called ``f(mod, kernels=..., builtin=..., passes=...)``; rewrites of
    ``phase`` 0 run before reshapes move, those of phase 1 after), None for a family the
    TIR matcher takes (``tirbyoc.registry``); ``checker`` ("module:function") is its
    ``tirbyoc.check`` (``f(kernel, cases, seed) -> KernelReport``)."""

    name: str
    roles: tuple
    steps: bool
    layouts: dict
    constraints: tuple
    stage: str | None = None
    phase: int = 0
    checker: str | None = None


_FAMILIES = {}


def _family(name, roles, steps=True, layouts=None, constraints=(), stage=None, phase=0,
            checker=None):
    _FAMILIES[name] = Family(name, tuple(roles), steps, dict(layouts or {}),
                             tuple(constraints), stage, phase, checker)


def family(name: str) -> Family:
    """The registration of family ``name``."""
    return _FAMILIES[name]


def resolve(path: str):
    """The function a "module:function" registration names."""
    import importlib

    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


_MATRIX = [_tensor("x"), _tensor("weight"), _tensor("y", "out"), _size("m"), _size("n"),
           _size("k"), _size("lda", False), _size("ldw", False), _size("ldc", False)]
_family("dense", _MATRIX, layouts={"weight": ("nt", "nn")}, constraints=("m", "n", "k"),
        checker="tirbyoc.checking:check_matrix")
_family("matmul", _MATRIX + [_size("batch"), _size("batch_stride_x", False),
                             _size("batch_stride_weight", False),
                             _size("batch_stride_y", False)],
        layouts={"weight": ("nt", "nn")}, constraints=("batch", "m", "n", "k"),
        checker="tirbyoc.checking:check_matrix")
_GEOMETRY = [
    _size("stride", False), _size("stride_h", False, ("stride",)),
    _size("stride_w", False, ("stride",)), _size("pad", False),
    _size("pad_top", False), _size("pad_left", False), _size("pad_bottom", False),
    _size("pad_right", False)]
_DILATION = [_size("dilation", False), _size("dilation_h", False, ("dilation",)),
             _size("dilation_w", False, ("dilation",))]
_family("conv2d", [
    _tensor("x"), _tensor("weight"), _tensor("y", "out"), _size("batch"),
    _size("in_channels"), _size("height"), _size("width"),
    _size("out_channels", True, ("depthwise",)),
    _size("kernel_h", True, ("kernel",)), _size("kernel_w", True, ("kernel",)),
    _size("out_h", False), _size("out_w", False), *_GEOMETRY, *_DILATION,
    _size("groups", True, ("groups", "depthwise"))],
    layouts={"layout": ("NCHW",), "weight": ("OIHW", "OHWI")},
    constraints=("stride", "dilation", "groups", "depthwise", "kernel", "pad", "batch",
                 "in_channels", "out_channels", "height", "width"),
    stage="tirbyoc.conv:offload_convs", checker="tirbyoc.checking:check_conv")
_POOL = [_tensor("x"), _tensor("y", "out"), _size("batch"), _size("channels"),
         _size("height"), _size("width"), _size("out_h", False), _size("out_w", False),
         _size("kernel_h", True, ("kernel",)), _size("kernel_w", True, ("kernel",)),
         *_GEOMETRY, _size("dilation_h", False), _size("dilation_w", False)]
_POOL_CONSTRAINTS = ("kernel", "stride", "pad", "batch", "channels", "height", "width")
_family("max_pool2d", _POOL, steps=False, layouts={"layout": ("NCHW",)},
        constraints=_POOL_CONSTRAINTS, stage="tirbyoc.pool:offload_pools",
        checker="tirbyoc.checking:check_pool")
_family("avg_pool2d", _POOL, steps=False, layouts={"layout": ("NCHW",)},
        constraints=_POOL_CONSTRAINTS + ("count_include_pad",),
        stage="tirbyoc.pool:offload_pools", checker="tirbyoc.checking:check_pool")
_family("attention", [
    _tensor("q"), _tensor("k"), _tensor("v"), _tensor("y", "out"), _size("batch"),
    _size("seq_q"), _size("seq_k"), _size("head_dim"), _size("value_dim"),
    _size("ldq", False), _size("ldk", False), _size("ldv", False), _size("ldy", False),
    _size("batch_stride_q", False), _size("batch_stride_k", False),
    _size("batch_stride_v", False), _size("batch_stride_y", False),
    Role("mask", "in", False), _size("ldmask", False), _size("batch_stride_mask", False),
    _size("mask_repeat", False), Role("scale", "float", False)],
    steps=False, layouts={"k": ("nt", "nn")},
    constraints=("batch", "seq_q", "seq_k", "head_dim", "value_dim"),
    stage="tirbyoc.attention:offload_attention", phase=1,
    checker="tirbyoc.checking:check_attention")
_family("softmax", [_tensor("x"), _tensor("y", "out"), _size("rows"), _size("cols"),
                    _size("ldx", False), _size("ldy", False)],
        steps=False, constraints=("rows", "cols"), stage="tirbyoc.softmax:offload_softmax",
        phase=1, checker="tirbyoc.checking:check_softmax")



def families() -> list:
    """The names of the families, in the order of the table above."""
    return list(_FAMILIES)


@dataclass(frozen=True)
class Op:
    """What one kernel computes (see the module docstring); made by the constructors."""

    family: str
    epilogue: tuple = ()
    layouts: dict = field(default_factory=dict)
    dtypes: tuple = ("float32",)
    constraints: dict = field(default_factory=dict)

    def __hash__(self):
        return hash((self.family, self.epilogue, tuple(sorted(self.layouts.items())),
                     self.dtypes, tuple(sorted((k, repr(v))
                                               for k, v in self.constraints.items()))))

    @property
    def name(self) -> str:
        """``dense_bias_relu``: the family, then the epilogue."""
        return "_".join((self.family,) + self.epilogue)

    def roles(self) -> dict:
        """Every role a kernel of this op may take: ``{name: Role}``."""
        roles = _FAMILIES[self.family].roles
        out = {r.name: r for r in roles}
        for step in self.epilogue:
            for name in _STEP_ROLES.get(step, ()):
                out[name] = Role(name, "float" if name == "scale" else
                                 "size" if name == "ldr" else "in", name != "ldr")
        if self.family == "matmul" and "residual" in self.epilogue:
            out["batch_stride_residual"] = Role("batch_stride_residual", "size", False)
        return out

    def check_roles(self, args) -> None:
        """Raise ValueError naming the unknown, repeated or missing roles of ``args``."""
        roles = self.roles()
        args = [a for a in args if not isinstance(a, Const)]
        unknown = [a for a in args if a not in roles]
        if unknown:
            raise ValueError(f"{self.name}: unknown role(s) {unknown}; a {self.family} "
                             f"kernel's roles are {sorted(roles)}")
        repeated = sorted({a for a in args if list(args).count(a) > 1})
        if repeated:
            raise ValueError(f"{self.name}: role(s) {repeated} given more than once")
        missing = [r.name for r in roles.values() if r.required and r.name not in args
                   and not any(c in self.constraints for c in r.implied)]
        if self.family in ("conv2d", "max_pool2d", "avg_pool2d"):
            if not _has_any(args, ("stride", "stride_h")) and "stride" not in self.constraints:
                missing.append("stride (or stride_h and stride_w, or a stride= constraint)")
            if not _has_any(args, ("pad", "pad_top")) and "pad" not in self.constraints:
                missing.append("pad (or pad_top, pad_left, pad_bottom and pad_right, "
                               "or a pad= constraint)")
        if self.family == "conv2d" and "dilation" not in args and \
                "dilation_h" not in args and "dilation" not in self.constraints:
            missing.append("dilation (or dilation_h and dilation_w, or a dilation= "
                           "constraint)")
        for pair in (("stride_h", "stride_w"), ("dilation_h", "dilation_w")):
            if (pair[0] in args) != (pair[1] in args):
                missing.append(pair[1] if pair[0] in args else pair[0])
        sides = ("pad_top", "pad_left", "pad_bottom", "pad_right")
        # the bottom and right padding follow from the output size, when given
        needed = sides if not ("out_h" in args and "out_w" in args) else sides[:2]
        if any(s in args for s in sides) and not all(s in args for s in needed):
            missing.extend(s for s in needed if s not in args)
        if missing:
            raise ValueError(f"{self.name}: the kernel's arguments lack the role(s) "
                             f"{missing}")

    def violation(self, values: dict) -> str | None:
        """Why a region with these role values breaks a constraint, or None. ``values``
        maps constraint names to ints (or None where the region's value is not a
        number)."""
        for key, want in self.constraints.items():
            if key not in values:
                continue
            got = values[key]
            if got is None:
                return f"{key} is not a compile-time number (the kernel requires " \
                       f"{_show(want)})"
            ok = want(got) if callable(want) else got == want
            if not ok:
                return f"{key} = {got} (the kernel requires {_show(want)})"
        return None


def geometry_roles(stride, pad, dilation=(1, 1)) -> dict:
    """The value of every geometry role (``stride``, ``stride_h``, ..., ``pad_right``,
    ``dilation_w``) for a (stride_h, stride_w), a (top, left, bottom, right) padding and a
    (dilation_h, dilation_w); the one-value roles take the first axis's."""
    return {"stride": stride[0], "stride_h": stride[0], "stride_w": stride[1],
            "pad": pad[0], "pad_top": pad[0], "pad_left": pad[1], "pad_bottom": pad[2],
            "pad_right": pad[3], "dilation": dilation[0], "dilation_h": dilation[0],
            "dilation_w": dilation[1]}


def out_size(size, kernel, stride, pad_before, pad_after, dilation=1) -> int:
    """A convolution's or pooling's output size along one axis (floor mode)."""
    return (size + pad_before + pad_after - dilation * (kernel - 1) - 1) // stride + 1


def _show(want) -> str:
    return "a value its predicate accepts" if callable(want) else repr(want)


def _has_any(args, names) -> bool:
    return any(n in args for n in names)


def _epilogue(epilogue) -> tuple:
    if isinstance(epilogue, str):
        epilogue = (epilogue,)
    epilogue = tuple(epilogue or ())
    for step in epilogue:
        if step not in EPILOGUE_STEPS:
            raise ValueError(f"unknown epilogue step {step!r}; known: {list(EPILOGUE_STEPS)}")
    for once in ("bias", "residual", "scale"):
        if epilogue.count(once) > 1:
            raise ValueError(f"an epilogue takes at most one {once}")
    return epilogue


def _dtypes(dtype) -> tuple:
    dtypes = (dtype,) if isinstance(dtype, str) else tuple(dtype)
    unknown = [d for d in dtypes if d != "float32"]
    if unknown:
        raise ValueError(f"dtype(s) {unknown} are not supported yet (float32 only)")
    return dtypes


def _pair(name, value):
    if value is None or callable(value):
        return value
    if isinstance(value, int):
        return (value, value)
    value = tuple(int(v) for v in value)
    if len(value) != 2:
        raise ValueError(f"{name} must be an int or a pair, got {value!r}")
    return value


def _layout(family, key, value):
    allowed = _FAMILIES[family].layouts[key]
    if value not in allowed:
        raise ValueError(f"{family}: {key} layout {value!r} is not one of {list(allowed)}")
    return value


def _constraints(family, given: dict) -> dict:
    allowed = _FAMILIES[family].constraints
    unknown = [k for k in given if k not in allowed]
    if unknown:
        raise ValueError(f"{family}: unknown constraint(s) {unknown}; known: {list(allowed)}")
    return {k: v for k, v in given.items() if v is not None}


def dense(epilogue=(), *, weight="nt", dtype="float32", **constraints) -> Op:
    """``y = epilogue(x @ W)``: x [m, k]; W [n, k] for ``weight="nt"`` (PyTorch's
    ``Linear``) or [k, n] for ``"nn"``. Constraints: m, n, k."""
    return Op("dense", _epilogue(epilogue), {"weight": _layout("dense", "weight", weight)},
              _dtypes(dtype), _constraints("dense", constraints))


def matmul(epilogue=(), *, weight="nn", dtype="float32", **constraints) -> Op:
    """``y[b] = epilogue(x[b] @ W[b])`` over a batch (a 2-D product is a batch of 1);
    W [b, n, k] (``"nt"``) or [b, k, n] (``"nn"``). Constraints: batch, m, n, k."""
    return Op("matmul", _epilogue(epilogue), {"weight": _layout("matmul", "weight", weight)},
              _dtypes(dtype), _constraints("matmul", constraints))


def conv2d(epilogue=(), *, layout="NCHW", weight="OIHW", dtype="float32", stride=None,
           dilation=None, groups=None, kernel=None, pad=None, depthwise=None,
           **constraints) -> Op:
    """A 2-D convolution and its epilogue. ``stride``, ``dilation``, ``kernel``: an int
    (both axes), a pair, or a predicate of the pair; ``pad``: an int (all four sides) or
    a predicate of (top, left, bottom, right); ``groups``: an int or a predicate (a
    depthwise kernel: ``groups=lambda g: g > 1`` with ``in_channels`` = ``out_channels``
    = groups, or any); ``depthwise=True``: one filter per channel (groups = in_channels
    = out_channels, a weight [C, 1, KH, KW]: the kernel takes neither groups nor
    out_channels), ``False``: never that. Other constraints: batch, in_channels,
    out_channels, height, width."""
    given = dict(constraints, stride=_pair("stride", stride), depthwise=depthwise,
                 dilation=_pair("dilation", dilation), kernel=_pair("kernel", kernel),
                 groups=groups,
                 pad=(pad,) * 4 if isinstance(pad, int) else pad)
    return Op("conv2d", _epilogue(epilogue),
              {"layout": _layout("conv2d", "layout", layout),
               "weight": _layout("conv2d", "weight", weight)},
              _dtypes(dtype), _constraints("conv2d", given))


def _pool(family, layout, dtype, kernel, stride, pad, constraints):
    given = dict(constraints, kernel=_pair("kernel", kernel), stride=_pair("stride", stride),
                 pad=(pad,) * 4 if isinstance(pad, int) else pad)
    return Op(family, (), {"layout": _layout(family, "layout", layout)}, _dtypes(dtype),
              _constraints(family, given))


def max_pool2d(*, layout="NCHW", dtype="float32", kernel=None, stride=None, pad=None,
               **constraints) -> Op:
    """2-D max pooling (padding never wins the max). Constraints as ``conv2d``'s, and
    batch, channels, height, width."""
    return _pool("max_pool2d", layout, dtype, kernel, stride, pad, constraints)


def avg_pool2d(*, layout="NCHW", dtype="float32", kernel=None, stride=None, pad=None,
               count_include_pad=False, **constraints) -> Op:
    """2-D average pooling; ``count_include_pad``: whether the divisor counts padding
    (a region is only given to the kernel when it divides the same way)."""
    return _pool("avg_pool2d", layout, dtype, kernel, stride, pad,
                 dict(constraints, count_include_pad=bool(count_include_pad)))


def attention(*, k_layout="nt", dtype="float32", **constraints) -> Op:
    """``y = softmax(q @ k^T * scale (masked)) @ v`` over a batch: q [seq_q, head_dim],
    k [seq_k, head_dim] (``k_layout="nt"``) or [head_dim, seq_k] (``"nn"``), v [seq_k,
    value_dim], an optional boolean mask [seq_q, seq_k]. Constraints: batch, seq_q, seq_k,
    head_dim, value_dim. The graph level matches attention for the built-in kernel only
    so far: a library's attention kernel can be declared and checked, not yet matched."""
    return Op("attention", (), {"k": _layout("attention", "k", k_layout)}, _dtypes(dtype),
              _constraints("attention", constraints))


def softmax(*, dtype="float32", **constraints) -> Op:
    """Softmax over the last axis of a tensor (leading axes are rows). Constraints:
    rows, cols."""
    return Op("softmax", (), {}, _dtypes(dtype), _constraints("softmax", constraints))


Predicate = Callable[[int], bool]
