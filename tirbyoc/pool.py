"""Max pooling as a kernel call: a float32 ``R.nn.max_pool2d`` in NCHW with static
channels and spatial sizes (the batch may be symbolic) becomes one ``R.call_tir`` of a
PrimFunc that calls ``tirbyoc_max_pool2d_f32`` (``kernels/pool_f32.c``: a vertical then a
horizontal pass, NaN propagating as in PyTorch).

The kernel leaves out the taps outside the input, which is what the padding means for a
maximum (TVM pads with the lowest float); the output size is the graph's, so floor and
ceil mode are both taken. Another layout, another dtype or a symbolic channel or spatial
size keep TVM's pooling (and its ``WindowReduction`` schedule).
"""

from __future__ import annotations

from . import _tvm as T
from .bindings import is_op, rewrite_bindings, rewrite_relax_functions, shape_of, tir_dims
from .normalize import INTRINSIC_ATTR, OFFLOADED_ATTR
from .ops import geometry_roles, out_size

R = T.relax_ns
SYMBOL = "tirbyoc_max_pool2d_f32"
# The call over an x in blocks of 16 channels ([N, C / 16, H, W, 16]; tirbyoc.conv's
# plan_layouts chooses it where a conv writing blocks feeds the pool).
LAYOUTS_SYMBOL = "tirbyoc_max_pool2d_f32_layouts"
INTRINSIC = "max_pool2d"
DESCRIPTION = "R.nn.max_pool2d (NCHW) as one kernel call"


def _ints(values):
    return [int(v) for v in values]


def _params(call):
    """(kh, kw, sh, sw, pad_top, pad_left, dh, dw) of a max pool the kernel takes, else
    None."""
    attrs = call.attrs
    if str(attrs.layout) != "NCHW" or str(attrs.out_layout) != "NCHW":
        return None
    x = call.args[0]
    xs, ys = shape_of(x), shape_of(call)
    ty = getattr(x, "ty", None)
    if xs is None or ys is None or len(xs) != 4 or len(ys) != 4 or \
            getattr(ty, "dtype", None) != "float32":
        return None
    if not all(isinstance(d, T.IntImm) for d in list(xs[1:]) + list(ys[1:])):
        return None
    kh, kw = _ints(attrs.pool_size)
    sh, sw = _ints(attrs.strides)
    dh, dw = _ints(attrs.dilation)
    pad = _ints(attrs.padding)
    top, left = pad[0], pad[1]
    if min(kh, kw, sh, sw, dh, dw) < 1 or min(pad) < 0:
        return None
    return kh, kw, sh, sw, top, left, dh, dw


def _kernel_func(x, out_ty, params, layouts=0):
    """The PrimFunc calling the kernel; ``layouts`` (the kernels' TIRBYOC_LAYOUT_* bits):
    x NCHW16c ([N, C / 16, H, W, 16]) with 1, y NCHW either way."""
    from .calls import status_checks

    names = {}
    xb = T.decl_buffer(tir_dims(shape_of(x), names), "float32", "x")
    yb = T.decl_buffer(tir_dims(shape_of(out_ty), names), "float32", "y")
    if layouts:
        n, cb, h, w, _ = xb.shape
        c, symbol, first = T.const(int(cb) * 16, "int64"), LAYOUTS_SYMBOL, [
            T.const(layouts, "int64")]
    else:
        (n, c, h, w), symbol, first = xb.shape, SYMBOL, []
    oh, ow = yb.shape[2], yb.shape[3]
    kh, kw, sh, sw, top, left, dh, dw = (T.const(v, "int64") for v in params)
    call = T.call_extern("int32", symbol, first + [
        n, c, h, w, T.buffer_pointer(xb, "r"), kh, kw, sh, sw, top, left, dh, dw, oh, ow,
        T.buffer_pointer(yb, "w")])
    block = T.make_block("tirbyoc_max_pool2d", status_checks(symbol, call),
                         reads=[T.full_region(xb)], writes=[T.full_region(yb)],
                         annotations={OFFLOADED_ATTR: symbol, INTRINSIC_ATTR: INTRINSIC})
    root = T.make_block("root", T.make_realize(block), reads=[], writes=[], annotations={})
    return T.prim_func_of([xb, yb], T.make_realize(root)).with_attr("tirx.noalias", True)


def _geometry(call):
    """The pooling's sizes and geometry by role (ints), or None where the kernels take
    no such pooling (another layout or dtype, a symbolic channel or spatial size)."""
    attrs = call.attrs
    if str(attrs.layout) != "NCHW" or str(attrs.out_layout) != "NCHW":
        return None
    x = call.args[0]
    xs, ys = shape_of(x), shape_of(call)
    if xs is None or ys is None or len(xs) != 4 or len(ys) != 4 or \
            getattr(getattr(x, "ty", None), "dtype", None) != "float32" or \
            not all(isinstance(d, T.IntImm) for d in list(xs[1:]) + list(ys[1:])):
        return None
    kh, kw = _ints(attrs.pool_size)
    sh, sw = _ints(attrs.strides)
    dh, dw = _ints(attrs.dilation)
    top, left, bottom, right = _ints(attrs.padding)
    batch = int(xs[0].value) if isinstance(xs[0], T.IntImm) else None
    return {"batch": batch, "channels": int(xs[1]), "height": int(xs[2]),
            "width": int(xs[3]), "out_h": int(ys[2]), "out_w": int(ys[3]),
            "kernel_h": kh, "kernel_w": kw,
            "dilation": (dh, dw), "kernel": (kh, kw), "stride": (sh, sw),
            "pad": (top, left, bottom, right),
            "count_include_pad": bool(getattr(attrs, "count_include_pad", False)),
            "ceil_mode": bool(getattr(attrs, "ceil_mode", False))}


def _takes(kernel, g) -> bool:
    """Whether a declared pooling kernel computes this pooling exactly."""
    if g["dilation"] != (1, 1) or kernel.op.violation(g) is not None:
        return False
    args = kernel.args
    if "pad" in args and len(set(g["pad"])) != 1:
        return False
    (sh, sw), (top, left, bottom, right) = g["stride"], g["pad"]
    if "stride" in args and sh != sw:
        return False
    floor = (g["out_h"], g["out_w"]) == (
        out_size(g["height"], g["kernel_h"], sh, top, bottom),
        out_size(g["width"], g["kernel_w"], sw, left, right))
    if kernel.op.family == "avg_pool2d":
        # the divisor: a window past the padding (ceil mode) divides differently
        return floor and g["count_include_pad"] == kernel.op.constraints.get(
            "count_include_pad", False)
    return floor or ("out_h" in args and "out_w" in args)


def _declared_func(kernel, x, out_ty, g):
    names = {}
    xb = T.decl_buffer(tir_dims(shape_of(x), names), "float32", "x")
    yb = T.decl_buffer(tir_dims(shape_of(out_ty), names), "float32", "y")
    values = {k: T.const(v, "int64") for k, v in g.items() if isinstance(v, int)
              and not isinstance(v, bool)}
    values.update({role: T.const(v, "int64") for role, v in geometry_roles(
        g["stride"], g["pad"], g["dilation"]).items()}, batch=xb.shape[0])
    return kernel.prim_func([("x", xb)], ("y", yb), values)


_POOL_OPS = {"relax.nn.max_pool2d": "max_pool2d", "relax.nn.avg_pool2d": "avg_pool2d"}


def _rewrite_func(func, builder, gvars, kernels, builtin):
    def call(binding):
        value = binding.value
        family = next((f for op, f in _POOL_OPS.items() if is_op(value, op)), None)
        g = _geometry(value) if family is not None else None
        declared = None if g is None else next(
            (k for k in kernels if k.op.family == family and _takes(k, g)), None)
        if declared is not None:
            kernel = _declared_func(declared, value.args[0], binding.var, g)
            name = f"{declared.library.name}_{declared.symbol}"
        else:
            params = _params(value) if builtin and family == "max_pool2d" else None
            if params is None:
                return None
            kernel = _kernel_func(value.args[0], binding.var, params)
            name = "tirbyoc_max_pool2d"
        key = T.structural_hash(kernel)
        if key not in gvars:
            gvars[key] = builder.add_func(kernel, name)
        return R.call_tir(gvars[key], [value.args[0]], binding.var.ty)

    return rewrite_bindings(func, call)


def offload_pools(mod, kernels=(), builtin=True, passes=None):  # noqa: ARG001
    """``mod`` with every max pool the kernel takes (see the module docstring) one kernel
    call (a new module; functions with a ``Codegen`` attribute untouched). ``kernels``:
    declared ``max_pool2d`` / ``avg_pool2d`` kernels (``tirbyoc.Library``), offered each
    pooling first (one computes it when its constraints hold, its geometry arguments
    can say it, and, without ``out_h``/``out_w``, the output has the floor-mode size);
    ``builtin``: whether the built-in kernel takes the max pools they leave."""
    gvars = {}
    return rewrite_relax_functions(mod, lambda func, builder: _rewrite_func(
        func, builder, gvars, list(kernels), builtin))
