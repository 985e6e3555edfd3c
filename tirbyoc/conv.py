"""Convolutions as kernel calls: ``R.nn.conv2d`` with a constant weight, and what follows
it, becomes one ``R.call_tir`` of a PrimFunc that calls ``tirbyoc_conv2d_f32`` (an implicit
matrix product on the dense micro-kernels, the input gathered straight into their packed
panels; see ``kernels/conv_f32.c``).

Before legalization, for a float32 ``conv2d`` in NCHW / OIHW (in any number of groups:
one product per group, in the same call), static channels and spatial sizes (the batch
may be symbolic), and a constant weight:

    y = conv2d(x, W) (+ b) (-> batch_norm in inference mode) (+ r)
        (-> relu | relu6 | silu | sigmoid | hardswish | hardsigmoid)

becomes

    y = call_tir(tirbyoc_conv2d, [x, W', b' (if any), r (if any)])

with the kernel's epilogue chain bias, residual, activation in that order. ``b`` is a
per-channel constant (one more may follow the batch norm). The matched region is a plan
(``_Plan``) that the region passes (``tirbyoc.weights``, their ``conv_region`` forms)
then change: ``fold_batch_norm`` folds the batch norm into ``W'`` and ``b'`` at compile
time in float64 and rounded once: ``W * gamma / sqrt(var + eps)``,
``(b - mean) * gamma / sqrt(var + eps) + beta``; without that pass the region ends before
the batch norm. ``pack_constants`` packs ``W'`` (and ``b'``) for the kernel (below).
``r`` is any tensor of ``y``'s shape (a
ResNet shortcut), added before the activation; where two convs meet at an add (a
projection shortcut), the add goes to the first. The activation is a relu, a ReLU6
(``clip(0, 6)``), a sigmoid or a SiLU (``R.nn.silu``, or ``v * sigmoid(v)`` written out,
as ``torch.export`` gives HF's EfficientNet), or MobileNetV3's hardswish or hardsigmoid
(``v * clip(v + 3, 0, 6) / 6``, ``clip(v + 3, 0, 6) / 6``, as PyTorch's and ONNX's
frontends write them: ``_hard_activation``). Every intermediate of the replaced ops must
be used only by the next one (SiLU's ``v``: by its sigmoid and the product only).

A 1-D conv (``R.nn.conv1d``, NCW / OIW) is first written as a conv2d over rows one
pixel high, its bias add with it (``conv1d_as_conv2d``), and is then one of these. A
transposed conv (2-D or 1-D, one group) is a matrix product per input pixel and an
overlap-add of the products (``conv_transpose_as_matmul``): the product is then a dense
the TIR matcher takes.

A 3x3 conv of stride 1 and dilation 1 in one group with a constant weight, over enough
4 x 4 tiles of output pixels (``tirbyoc_conv2d_winograd_suits``: ResNet-18's 56 x 56 and
28 x 28 convs; its 14 x 14 ones, 16 tiles an image, from 128 channels on AVX2 and from
256 on AVX-512), calls ``tirbyoc_conv2d_winograd_cached_f32`` instead
(same chain): Winograd F(4x4, 3x3), 36 products per tile and channel pair instead of 144.
The library holds the weight as the model does; its transform (in float64, then packed:
4x the bytes) is made by the first call and kept by the kernels, found by a digest of
the weight taken here (``kernels.winograd_key``). Its rounding error is a few times a
direct sum's (about 1e-6 of max|y| for 64 channels; ``kernels/conv_winograd_f32.c``).
``TIRBYOC_CONV_WINOGRAD=0`` when compiling keeps every conv on the direct kernel.

A depthwise conv (``groups`` = input channels = output channels, weight ``[C, 1, KH,
KW]``) is instead one call of ``tirbyoc_depthwise_conv2d_f32`` (no matrix product: each
channel's taps summed in vector registers, over phase planes of the channel or with 16
channels in the lanes; see ``kernels/depthwise_f32.c``), with the same bias, folded batch
norm, shortcut and activation in its chain:

    y = call_tir(tirbyoc_depthwise_conv2d, [x, W', b' (if any), r (if any)])

A weight that is not a constant (a parameter passed in) is read in place by the same
call (depthwise or not); a batch norm after such a conv is not folded (it stays TVM's).

A conv of one image whose ``x`` is ``x0 * s``, ``s`` one factor per input channel
(``[1, C, 1, 1]``: squeeze-and-excitation's gate, EfficientNet's and MobileNetV3's), and
whose packed weight is smaller than ``x0``, reads ``x0`` instead and scales its weight on
every call (``conv(x0 * s, W) = conv(x0, W * s)``; ``_with_channel_scale``): TVM's
product over the weight replaces the one over the feature map (EfficientNet-B0: 0.55 ms
of 0.77 a run, 2 threads on Zen 3).

An NHWC conv (kernel layout OHWI, HWIO or OIHW) with a constant weight takes the same
call between two transposes (and one of its shortcut, if any) that TVM compiles: ``x`` to
NCHW, the kernel's output back to NHWC; its bias, batch norm (over axis 3), shortcut and
activation are matched in NHWC and go into the call as above. The kernels keep one
layout; the transposes cost a pass over each tensor (much less than the conv).

Between consecutive calls the tensors may stay NCHW16c ([N, C / 16, H, W, 16]: a
pixel's 16 channels of a block in one vector, ONNX Runtime's NCHWc), planned once per
function (``plan_layouts``): a tensor is blocked when the call that writes it and every
call that reads it (as its ``x``, nothing else reading it) are depthwise convs or 1x1
stride-1 unpadded convs with packed weights, all of 16k channels (a 1x1 conv from 64
input channels), without shortcuts. Those calls then take the kernels' ``_layouts``
entry points, whose AVX2 and AVX-512 paths read and write the blocks in place: the
depthwise kernel without its transposes (about 1.2x to 1.3x faster on MobileNet's
layers), the 1x1 conv tiles without theirs. A max pool that the built-in pool kernel
takes reads a conv's blocks too (ResNet's stem: the conv's tiles store their registers
whole instead of transposing them, the pool takes each pixel's 16 channels as vectors;
its output stays NCHW), where no library declares a max pool kernel. The function's
inputs and results, and every tensor another op reads, stay NCHW, so no conversion is
added. Planned only where the kernels' instruction set has those paths
(``kernels.CONV_DIRECT_ISAS``, and for the depthwise convs
``kernels.DEPTHWISE_CHANNELS_ISAS``; elsewhere the calls would convert through NCHW
copies); ``TIRBYOC_CONV_BLOCKED=0`` when compiling keeps every tensor NCHW.

A batch norm in training mode, another layout, an NHWC conv whose weight is not a
constant, or a symbolic channel or spatial size keep TVM's ``conv2d``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import numpy as np

from . import _tvm as T
from .bindings import Bindings, is_op, rewrite_calls, scalar_constant, shape_of, tir_dims
from .normalize import INTRINSIC_ATTR, NOTES_ATTR, OFFLOADED_ATTR

R = T.relax_ns
SYMBOL = "tirbyoc_conv2d_f32"
PACKED_SYMBOL = "tirbyoc_conv2d_f32_packed"
LAYOUTS_SYMBOL = "tirbyoc_conv2d_f32_packed_layouts"
WINOGRAD_SYMBOL = "tirbyoc_conv2d_winograd_cached_f32"
INTRINSIC = "conv2d"
DESCRIPTION = ("R.nn.conv2d (+ bias, batch norm, shortcut, relu, relu6, silu, sigmoid, hardswish "
               "or hardsigmoid) as one kernel call")
DEPTHWISE_SYMBOL = "tirbyoc_depthwise_conv2d_f32"
DEPTHWISE_LAYOUTS_SYMBOL = "tirbyoc_depthwise_conv2d_f32_layouts"
DEPTHWISE_INTRINSIC = "depthwise_conv2d"
DEPTHWISE_DESCRIPTION = ("depthwise R.nn.conv2d (+ bias, batch norm, shortcut, relu, relu6, "
                         "silu, sigmoid, hardswish or hardsigmoid) as one kernel call")


def _static_shape(expr):
    """The dimensions, constants as ints."""
    dims = shape_of(expr)
    return None if dims is None else [int(v) if isinstance(v, T.IntImm) else v
                                      for v in dims]


def _const(expr, values):
    """The numpy value of a constant, through variables and reshapes of constants, or of
    an expression computed from constants only (BiT's weight standardization,
    ``(w - mean(w)) / sqrt(var(w) + eps)`` on the stored weight: an instance norm of it),
    evaluated once here."""
    while isinstance(expr, R.Var) and expr in values:
        expr = values[expr]
    if isinstance(expr, T.RelaxConstant):
        return T.constant_value(expr)
    if is_op(expr, "relax.reshape"):
        inner = _const(expr.args[0], values)
        shape = _static_shape(expr)
        if inner is not None and shape is not None and all(isinstance(s, int) for s in shape):
            return inner.reshape(shape)
    tree = _of_constants(expr, values)
    if tree is not None:
        from .weights import folded

        value = folded(tree)
        if isinstance(value, T.RelaxConstant):
            return T.constant_value(value)
    return None


# operators evaluated at compile time on constants (elementwise ones, the reductions and
# norms of a weight standardization, which PyTorch exports as an instance norm over the
# weight's rows): nothing that could make a constant larger than its input
_FOLDABLE = {"relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.sqrt",
             "relax.rsqrt", "relax.mean", "relax.variance", "relax.sum", "relax.power",
             "relax.negative", "relax.astype", "relax.reshape", "relax.square",
             "relax.nn.instance_norm", "relax.nn.layer_norm", "relax.nn.group_norm"}


def _of_constants(expr, values, depth=0):
    """``expr`` as one expression tree over constants (its variables replaced by what
    they are bound to) when it is a call of ``_FOLDABLE`` operators on constants only,
    else None."""
    while isinstance(expr, R.Var) and expr in values:
        expr = values[expr]
    if isinstance(expr, T.RelaxConstant):
        return expr
    if depth > 32 or not is_op(expr, *_FOLDABLE):
        return None
    args = []
    for a in expr.args:
        if not isinstance(a, (R.Var, R.Call, T.RelaxConstant)):
            args.append(a)  # (shapes, axes given as values)
            continue
        inner = _of_constants(a, values, depth + 1)
        if inner is None:
            return None
        args.append(inner)
    return R.Call(expr.op, args, expr.attrs, expr.ty_args)


@dataclass
class _Plan:
    x: object
    weight: np.ndarray | None  # [OC, C / groups, KH, KW], float64, folded; or
    weight_arg: object | None  # the Relax tensor the kernel reads in place (not a constant)
    weight_shape: tuple
    bias: np.ndarray | None  # [OC], float64
    residual: object | None  # a tensor of the output's shape added after the bias
    act: str | None          # "relu", "relu6", "silu", "sigmoid", "hardswish", "hardsigmoid"
    depthwise: bool
    groups: int
    strides: tuple
    padding: tuple          # top, left, bottom, right
    dilation: tuple
    out_shape: list         # [N, OC, OH, OW]
    nhwc: bool = False      # the graph's tensors are NHWC: the call runs between transposes
    # Set by the matcher, for the region passes: a batch norm between the conv (+ bias)
    # and the rest of the chain, not yet folded ((scale, shift), float64, per channel),
    # and a constant added after it ([OC], float64).
    batch_norm: tuple | None = None
    bias_after: np.ndarray | None = None
    # Set by the region passes: the weight (and bias) packed for the kernel, whether that
    # packing is Winograd's, and what each pass did (for explain).
    packed: np.ndarray | None = None
    winograd: bool = False
    notes: tuple = ()
    # Set by plan_layouts: _X16 | _Y16, the tensors the call reads / writes as NCHW16c.
    layouts: int = 0
    # A declared kernel (tirbyoc.Library) that computes the region instead of the
    # built-in ones.
    declared: object = None
    # Set by _with_channel_scale: a [1, C, 1, 1] tensor multiplying ``x`` per input
    # channel (a squeeze-and-excitation), applied to the packed weight on every call.
    in_scale: object = None


# Kernel layouts an NHWC conv may have: the axes that make them OIHW.
_TO_OIHW = {"OIHW": (0, 1, 2, 3), "OHWI": (0, 3, 1, 2), "HWIO": (3, 2, 0, 1)}
_NHWC_TO_NCHW, _NCHW_TO_NHWC = (0, 3, 1, 2), (0, 2, 3, 1)
# Bits of the kernels' tirbyoc_layout (tirbyoc_kernels.h): x, y (and residual) NCHW16c.
_X16, _Y16 = 1, 2
# A 1x1 conv reads an NCHW16c x that its output does not follow into blocks from this
# many input channels (measured: at 32, its tiles over 16-float pixels, their sums then
# stored through the scratch, cost more than the transposes they save; with a blocked
# output too, each tile stores into it directly: MobileNet's 32 -> 64 conv at 112 x 112
# 133 us against 137 us NCHW).
BLOCKED_MIN_CHANNELS = 64
# Strides the kernels' direct path takes (conv_f32.c, CONV_DIRECT_STRIDE_MAX): a conv
# writing an NCHW16c output runs there.
BLOCKED_STRIDE_MAX = 4


def _plan(b: Bindings, var, call, residuals=True, batch_norms=True):
    """The region starting at ``var = conv2d(...)`` (its last variable and plan).
    ``batch_norms``: whether a batch norm may join the region (a region pass folds it);
    if not, the region ends before it."""
    attrs = call.attrs
    layout, kernel_layout = str(attrs.data_layout), str(attrs.kernel_layout)
    nhwc = layout == "NHWC"
    if not ((layout, kernel_layout) == ("NCHW", "OIHW") or
            (nhwc and kernel_layout in _TO_OIHW)) or \
            str(attrs.out_layout) not in (layout, "") or \
            str(attrs.out_dtype) not in ("float32", "", "None"):
        return None
    x, w = call.args
    xs, ys, wshape = _static_shape(x), _static_shape(call), _static_shape(w)
    weight = _const(w, b.values)
    if xs is None or ys is None or wshape is None or \
            (weight is not None and weight.dtype != np.float32):
        return None
    yshape = ys  # in the graph's layout (a shortcut has this shape)
    if nhwc:
        # the kernel's NCHW / OIHW view; the call reads x and writes y through transposes,
        # and a weight passed in would need one per call: only constants
        if weight is None:
            return None
        axes = _TO_OIHW[kernel_layout]
        xs, ys = [xs[a] for a in _NHWC_TO_NCHW], [ys[a] for a in _NHWC_TO_NCHW]
        wshape = [wshape[a] for a in axes]
        weight = np.ascontiguousarray(np.transpose(weight, axes))
    if getattr(x.ty, "dtype", None) != "float32" or not all(
            isinstance(d, int) for d in xs[1:] + ys[1:] + wshape):
        return None
    # a weight that is not a constant (a parameter passed in) is read in place: no folding
    weight_arg = None
    if weight is None:
        if getattr(w.ty, "dtype", None) != "float32":
            return None
        weight_arg = w
    else:
        weight = weight.astype(np.float64)
    oc = wshape[0]
    groups = int(attrs.groups)
    # one product per group; depthwise (one filter per channel): the depthwise kernel
    depthwise = groups == xs[1] == oc and wshape[1] == 1 and groups > 1
    if groups < 1 or xs[1] % groups or oc % groups or wshape[1] * groups != xs[1]:
        return None
    bias, residual, act, last = None, None, None, var
    norm, bias_after = None, None
    while True:
        hard = _hard_activation(b, last) if act is None else None
        if hard is not None:
            act, last = hard
            break
        user = b.only_user(last)
        if user is None:
            silu = _silu_of(b, last) if act is None else None
            if silu is not None:
                act, last = "silu", silu
            break
        uvar, uval = user
        if is_op(uval, "relax.add") and act is None and residual is None:
            other = uval.args[1] if uval.args[0].same_as(last) else uval.args[0]
            value = _const(other, b.values)
            per_channel = ((1, 1, 1, oc), (1, 1, oc), (oc,)) if nhwc else \
                ((1, oc, 1, 1), (oc, 1, 1))
            if value is not None and value.size == oc and value.shape in per_channel and \
                    (bias is None if norm is None else bias_after is None):
                if norm is None:
                    bias = value.reshape(oc).astype(np.float64)
                else:
                    bias_after = value.reshape(oc).astype(np.float64)
            elif value is None and residuals and _static_shape(other) == yshape and \
                    getattr(other.ty, "dtype", None) == "float32":
                residual = other  # a tensor of the output's shape (a shortcut)
            else:
                break
        elif is_op(uval, "relax.nn.batch_norm") and act is None and residual is None and \
                weight is not None and norm is None and batch_norms:
            found = _batch_norm(b, uvar, uval, last, (3, -1) if nhwc else (1, -3))
            if found is None:
                break
            scale, shift, uvar = found
            norm = (scale, shift)
        elif is_op(uval, "relax.nn.relu") and act is None:
            act = "relu"
        elif is_op(uval, "relax.clip") and act is None and _clip_bounds(uval) == (0.0, 6.0):
            act = "relu6"
        elif act is None and (is_op(uval, "relax.nn.silu") or is_op(uval, "relax.sigmoid")):
            act = "silu" if is_op(uval, "relax.nn.silu") else "sigmoid"
        else:
            break
        last = uvar
    return last, _Plan(x, weight, weight_arg, tuple(wshape), bias, residual, act, depthwise,
                       groups,
                       tuple(int(s) for s in attrs.strides),
                       tuple(int(p) for p in attrs.padding),
                       tuple(int(d) for d in attrs.dilation), ys, nhwc, norm, bias_after)


# ---- region passes on a conv region (see tirbyoc.weights: the same passes, their
# ``conv_region`` form) ----

def fold_batch_norm(plan: _Plan):
    """The region's batch norm folded into its constant weight and bias, in float64 and
    rounded once: ``W * scale``, ``b * scale + shift (+ c)`` with ``scale = gamma /
    sqrt(var + eps)``, ``shift = beta - mean * scale`` (``c``: a constant added after the
    batch norm). None when the region has no batch norm."""
    if plan.batch_norm is None:
        return None
    scale, shift = plan.batch_norm
    bias = (plan.bias if plan.bias is not None else 0.0) * scale + shift
    if plan.bias_after is not None:
        bias = bias + plan.bias_after
    return replace(plan, weight=plan.weight * scale[:, None, None, None], bias=bias,
                   batch_norm=None, bias_after=None,
                   notes=plan.notes + ("batch norm folded into the weight and bias",))


def pack_weight(plan: _Plan):
    """The region's constant weight (and bias) packed once, at compile time, into the
    layout its kernel reads: 16-channel panels for ``tirbyoc_conv2d_f32_packed``; where
    ``tirbyoc_conv2d_winograd_suits``, ``winograd`` set instead, the weight left as it is
    for ``tirbyoc_conv2d_winograd_cached_f32`` (its transform, 4x the bytes, is made by
    the first call). None for a depthwise conv, a weight passed in, or one whose panels
    would be mostly padding."""
    ocg = plan.out_shape[1] // plan.groups
    if plan.depthwise or plan.weight is None or plan.packed is not None or plan.winograd or \
            plan.batch_norm is not None or -(-ocg // 16) * 16 > 2 * ocg:
        return None
    from . import kernels

    batch, oc, oh, ow = plan.out_shape
    kh, kw = plan.weight_shape[2:]
    if kernels.winograd_suits(
            batch if isinstance(batch, int) else None, plan.weight_shape[1] * plan.groups,
            oc, plan.groups, (kh, kw), plan.strides, plan.dilation, (oh, ow)):
        # the transform (4x the weight) is made by the first call, not held by the library
        return replace(plan, winograd=True, notes=plan.notes + (
            "Winograd F(4x4, 3x3), the weight transformed by the first call",))
    packed = kernels.pack_conv2d_weight(
        np.ascontiguousarray(plan.weight, np.float32),
        None if plan.bias is None else np.ascontiguousarray(plan.bias, np.float32),
        plan.groups).data
    return replace(plan, packed=packed, notes=plan.notes + ("weight packed at compile time",))


def _conv_steps(passes):
    """The forms of ``passes`` on a conv region, in order: this module's for the default
    passes of ``tirbyoc.weights`` (``fold_batch_norm``, ``pack_constants``), a pass's
    own ``conv_region`` attribute for any other."""
    from . import weights

    ours = {id(weights.fold_batch_norm): fold_batch_norm,
            id(weights.pack_constants): pack_weight}
    steps = (ours.get(id(p), getattr(p, "conv_region", None)) for p in passes)
    return [step for step in steps if step]


def _run_passes(plan: _Plan, steps) -> _Plan:
    for step in steps:
        new = step(plan)
        if new is not None:
            plan = new
    if plan.batch_norm is not None:  # matched only when fold_batch_norm is a pass
        raise RuntimeError("a conv region's batch norm was matched and not folded")
    return plan


def _channel_scaled(b: Bindings, x):
    """(x0, s) when ``x = x0 * s`` (either order), ``x0`` a float32 ``[1, C, H, W]`` and
    ``s`` a ``[1, C, 1, 1]`` (one factor per channel: squeeze-and-excitation's scale),
    ``x`` read by one binding only; else None."""
    call = b.producer(x)
    if not is_op(call, "relax.multiply") or len(call.args) != 2 or b.uses.get(x, 0) != 1:
        return None
    for x0, s in (call.args, call.args[::-1]):
        xs, ss = _static_shape(x0), _static_shape(s)
        if xs is None or ss is None or len(xs) != 4 or \
                not all(isinstance(d, int) for d in xs + ss):
            continue
        if xs[0] == 1 and ss == [1, xs[1], 1, 1] and xs[2] * xs[3] > 1 and all(
                getattr(v.ty, "dtype", None) == "float32" for v in (x0, s)):
            return x0, s
    return None


def _with_channel_scale(b: Bindings, plan: _Plan) -> _Plan:
    """``plan`` reading ``x0`` with ``in_scale`` ``s`` in place of ``x = x0 * s`` (a
    per-channel scale of a single image, as squeeze-and-excitation multiplies a feature
    map before its projection conv) where the scale is cheaper on the packed weight:
    ``conv(x0 * s, W) = conv(x0, W * s)`` (each input channel's weights times its factor,
    the bias not), so each call scales its packed copy of ``W`` (``_emit``) instead of
    writing ``x0 * s``. Only for a packed, non-Winograd weight smaller than ``x0``
    (EfficientNet-B0's convs at 112 x 112 to 14 x 14: 1/800 to 1/2 of it; at 7 x 7 its
    weights are the larger and the product stays); else ``plan`` as it is."""
    found = _channel_scaled(b, plan.x)
    if found is None or plan.packed is None or plan.winograd or plan.declared is not None \
            or plan.nhwc or plan.depthwise:
        return plan
    x0, s = found
    _, c, h, w = _static_shape(x0)
    if plan.packed.size >= c * h * w:
        return plan
    return replace(plan, x=x0, in_scale=s, notes=plan.notes + (
        "per-channel scale of the input (squeeze-and-excitation) applied to the packed "
        "weight on every call",))


def _scaled_packed(bb, packed, scale, plan: _Plan):
    """The packed weight (``tirbyoc_pack_conv2d_weight_f32``'s layout,
    ``packed[((g * Q + q) * KT + p) * 16 + r]``) with every row ``p`` of tap ``p % taps``
    of input channel ``g * C / G + p // taps`` times that channel's factor of ``scale``
    ([1, C, 1, 1]), the bias row (``p = K``) as it is."""
    groups, _, kt, _ = _packed_shape(plan)
    _, cg, kh, kw = plan.weight_shape
    taps = kh * kw
    k = cg * taps
    assert kt == k + ("bias" in _chain(plan)), "unexpected packed layout"
    s = bb.emit(R.op.reshape(scale, [groups, cg]))
    if taps > 1:
        s = bb.emit(R.op.repeat(s, taps, axis=1))
    if kt > k:
        s = bb.emit(R.op.concat([s, R.const(np.ones((groups, 1), np.float32))], axis=1))
    s = bb.emit(R.op.reshape(s, [groups, 1, kt, 1]))
    # NOTE: 4-D, as the kernel's PrimFunc takes it (_packed_shape): TVM's schedule then
    # runs the rows in parallel, 16 lanes a vector (a 1-D result: one serial loop, its
    # indices divided out per element)
    return bb.emit(R.op.multiply(packed, s))


def _packed_shape(plan: _Plan):
    """The shape of ``plan.packed`` as its kernel's PrimFunc takes it: 1-D, or for a
    weight scaled per call [G, Q, KT, 16] (``_scaled_packed``)."""
    if plan.in_scale is None:
        return (plan.packed.size,)
    groups = plan.groups
    panels = -(-(plan.weight_shape[0] // groups) // 16)
    return (groups, panels, plan.packed.size // (groups * panels * 16), 16)


def _silu_of(b: Bindings, var):
    """The variable of ``var * sigmoid(var)`` (SiLU written out, as ``torch.export`` gives
    HF's activations), when those two bindings are all that read ``var`` and the sigmoid is
    read by the product alone; else None."""
    users = b.users(var)
    if b.uses.get(var, 0) != 2 or len(users) != 2:
        return None
    for (svar, sval), (mvar, mval) in (users, users[::-1]):
        if is_op(sval, "relax.sigmoid") and is_op(mval, "relax.multiply") and \
                sval.args[0].same_as(var) and b.only_user(svar) is not None and \
                b.only_user(svar)[0].same_as(mvar) and len(mval.args) == 2 and \
                any(mval.args[i].same_as(var) and mval.args[1 - i].same_as(svar)
                    for i in (0, 1)):
            return mvar
    return None


# ONNX HardSigmoid's alpha for hardsigmoid (what torch.onnx writes): 1 / 6 in float32.
_ONNX_SIXTH = float(np.float32(1.0 / 6.0))


def _scalar_operand(b: Bindings, call, op, var):
    """c of ``op(var, c)`` (or ``op(c, var)``, for add and multiply) with a 0-d constant
    c, else None."""
    if not is_op(call, op) or len(call.args) != 2:
        return None
    x, y = call.args
    if not x.same_as(var):
        if op == "relax.divide" or not y.same_as(var):
            return None
        x, y = y, x
    return scalar_constant(y, b.values, "f")


def _clamped(b: Bindings, var):
    """(the variable, low, high) after the chain of ``R.clip`` bindings that read ``var``
    one after another, each the only reader of the one before: the chain is
    ``clip(var, low, high)`` (two clips with overlapping ranges are one clip of their
    intersection; PyTorch's hardswish gives ``clip(0, inf)`` then ``clip(-inf, 6)``)."""
    lo, hi, last = -np.inf, np.inf, var
    while True:
        user = b.only_user(last)
        if user is None or not is_op(user[1], "relax.clip") or \
                not user[1].args[0].same_as(last):
            return last, lo, hi
        bounds = _clip_bounds(user[1])
        if bounds is None or max(lo, bounds[0]) > min(hi, bounds[1]):
            return last, lo, hi
        lo, hi, last = max(lo, bounds[0]), min(hi, bounds[1]), user[0]


def _hard_activation(b: Bindings, var):
    """("hardswish" or "hardsigmoid", the variable of its result) when the bindings that
    read ``var`` compute one of them and nothing else reads their intermediates, as the
    frontends write them:

    - PyTorch: ``var * clip(var + 3, 0, 6) / 6`` and ``clip(var + 3, 0, 6) / 6``;
    - ONNX ``HardSwish``: ``var * (clip(var + 3, 0, 6) / 6)``;
    - ONNX ``HardSigmoid`` as ``torch.onnx`` writes it: ``clip(var * a + 0.5, 0, 1)``,
      ``a`` 1/6 in float32 (the kernels' ``clip(var + 3, 0, 6) / 6`` is within 2 ulp).

    Else None."""
    users = b.users(var)
    if b.uses.get(var, 0) != len(users) or len(users) not in (1, 2):
        return None
    if len(users) == 1 and _scalar_operand(b, users[0][1], "relax.multiply", var) == \
            _ONNX_SIXTH:
        half = b.only_user(users[0][0])
        if half is not None and \
                _scalar_operand(b, half[1], "relax.add", users[0][0]) == 0.5:
            out, lo, hi = _clamped(b, half[0])
            return ("hardsigmoid", out) if (lo, hi) == (0.0, 1.0) else None
    plus3 = [u for u in users if _scalar_operand(b, u[1], "relax.add", var) == 3.0]
    if len(plus3) != 1:
        return None
    clamp, lo, hi = _clamped(b, plus3[0][0])
    if (lo, hi) != (0.0, 6.0):
        return None
    after = b.only_user(clamp)
    if after is None:
        return None
    if len(users) == 1:  # hardsigmoid
        return ("hardsigmoid", after[0]) \
            if _scalar_operand(b, after[1], "relax.divide", clamp) == 6.0 else None
    (mvar, mval), = [u for u in users if u is not plus3[0]]
    if not is_op(mval, "relax.multiply") or len(mval.args) != 2 or \
            not any(a.same_as(var) for a in mval.args):
        return None
    other = mval.args[1] if mval.args[0].same_as(var) else mval.args[0]
    if other.same_as(clamp) and after[0].same_as(mvar):  # PyTorch: (var * clamp) / 6
        last = b.only_user(mvar)
        return ("hardswish", last[0]) if last is not None and _scalar_operand(
            b, last[1], "relax.divide", mvar) == 6.0 else None
    if other.same_as(after[0]) and \
            _scalar_operand(b, after[1], "relax.divide", clamp) == 6.0 and \
            b.uses.get(after[0], 0) == 1:  # ONNX: var * (clamp / 6)
        return "hardswish", mvar
    return None


def _clip_bounds(call):
    """(min, max) of an ``R.clip`` with constant bounds, else None."""
    try:
        return float(call.args[1].value), float(call.args[2].value)
    except (AttributeError, IndexError, TypeError):
        return None


def _batch_norm(b: Bindings, var, call, data, axes):
    """(scale, shift, the variable of its output) for an inference-mode batch norm over
    the channels (``axes``: the channel axis) with constant statistics whose tuple is only
    indexed at 0; else None."""
    attrs = call.attrs
    if not call.args[0].same_as(data) or int(attrs.axis) not in axes or \
            bool(getattr(attrs, "training", False)):
        return None
    gamma, beta, mean, var_ = (_const(a, b.values) for a in call.args[1:])
    if any(v is None for v in (gamma, beta, mean, var_)):
        return None
    users = b.users(var)
    if len(users) != 1 or b.uses.get(var, 0) != 1:
        return None
    out, item = users[0]
    if not isinstance(item, R.TupleGetItem) or int(item.index) != 0:
        return None
    gamma = gamma.astype(np.float64) if bool(attrs.scale) else np.ones_like(mean, np.float64)
    beta = beta.astype(np.float64) if bool(attrs.center) else np.zeros_like(mean, np.float64)
    scale = gamma / np.sqrt(var_.astype(np.float64) + float(attrs.epsilon))
    return scale, beta - mean.astype(np.float64) * scale, out


def _kernel_func(plan: _Plan, x, residual, out_ty, packed_size=None):
    """The PrimFunc whose only block calls ``tirbyoc_conv2d_f32`` for ``plan``: buffers x,
    the weight, the bias (if any), the residual (if any) and the output; given
    ``packed_size``, ``tirbyoc_conv2d_f32_packed`` with the packed weight (holding the
    bias) in place of the weight and the bias; for ``plan.winograd``,
    ``tirbyoc_conv2d_winograd_cached_f32`` with the weight's key
    (``kernels.winograd_key``); for a depthwise ``plan``,
    ``tirbyoc_depthwise_conv2d_f32`` (the weight [C, 1, KH, KW], no groups)."""
    from .calls import status_checks

    names = {}
    xb = T.decl_buffer(tir_dims(shape_of(x), names), "float32", "x")
    wb = T.decl_buffer([T.const(int(d), "int64") for d in plan.weight_shape], "float32", "w")
    bb = None if plan.bias is None else T.decl_buffer(
        [T.const(int(plan.bias.shape[0]), "int64")], "float32", "bias")
    pb = None if packed_size is None else T.decl_buffer(
        [T.const(int(d), "int64") for d in packed_size], "float32", "packed")
    yshape = tir_dims(out_ty.shape.values, names)
    rb = None if residual is None else T.decl_buffer(tir_dims(shape_of(residual), names),
                                                     "float32", "residual")
    yb = T.decl_buffer(yshape, "float32", "y")
    if plan.layouts & _X16:  # [N, C / 16, H, W, 16]
        n, cb, h, w, _ = xb.shape
        c = T.const(int(cb) * 16, "int64")
    else:
        n, c, h, w = xb.shape
    oc, _, kh, kw = wb.shape
    oh, ow = yb.shape[2:4]
    sh, sw = plan.strides
    pt, pl, _, _ = plan.padding
    dh, dw = plan.dilation
    # the chain, in order: bias, shortcut, activation
    from . import kernels

    names_ = list(_chain(plan))  # the passes have folded any batch norm into the bias
    code = kernels.encode_epilogue(names_)

    def i64(v):
        return T.const(int(v), "int64")

    geometry = [i64(sh), i64(sw), i64(pt), i64(pl), i64(dh), i64(dw), oh, ow, i64(code)]
    bptr = T.buffer_pointer(bb, "r") if bb is not None else T.null_pointer()
    rptr = T.buffer_pointer(rb, "r") if rb is not None else T.null_pointer()
    xptr, yptr = T.buffer_pointer(xb, "r"), T.buffer_pointer(yb, "w")
    block_name, intrinsic = "tirbyoc_conv2d", INTRINSIC
    layouts = [i64(plan.layouts)] if plan.layouts else []
    if plan.depthwise:
        symbol, block_name, intrinsic = (
            DEPTHWISE_LAYOUTS_SYMBOL if plan.layouts else DEPTHWISE_SYMBOL,
            "tirbyoc_depthwise_conv2d", DEPTHWISE_INTRINSIC)
        args = [*layouts, n, c, h, w, xptr, kh, kw, T.buffer_pointer(wb, "r"), *geometry,
                bptr, rptr, yptr]
        inputs = [b for b in (xb, wb, bb, rb) if b is not None]
    elif plan.winograd:
        symbol = WINOGRAD_SYMBOL
        key0, key1 = kernels.winograd_key(plan.weight, plan.bias)
        args = [i64(key0), i64(key1), n, c, h, w, xptr, oc, T.buffer_pointer(wb, "r"), bptr,
                i64(pt), i64(pl), oh, ow, i64(code), rptr, yptr]
        inputs = [b for b in (xb, wb, bb, rb) if b is not None]
    elif pb is None:
        symbol = SYMBOL
        args = [n, c, h, w, xptr, oc, i64(plan.groups), kh, kw, T.buffer_pointer(wb, "r"),
                *geometry, bptr, rptr, yptr]
        inputs = [b for b in (xb, wb, bb, rb) if b is not None]
    else:
        symbol = LAYOUTS_SYMBOL if plan.layouts else PACKED_SYMBOL
        args = [*layouts, n, c, h, w, xptr, oc, i64(plan.groups), kh, kw,
                T.buffer_pointer(pb, "r"), *geometry, rptr, yptr]
        inputs = [b for b in (xb, pb, rb) if b is not None]
    call = T.call_extern("int32", symbol, args)
    block = T.make_block(block_name, status_checks(symbol, call),
                         reads=[T.full_region(b) for b in inputs], writes=[T.full_region(yb)],
                         annotations={OFFLOADED_ATTR: symbol,
                                      INTRINSIC_ATTR: "_".join([intrinsic] + names_),
                                      NOTES_ATTR: "; ".join(plan.notes)})
    root = T.make_block("root", T.make_realize(block), reads=[], writes=[], annotations={})
    func = T.prim_func_of(inputs + [yb], T.make_realize(root))
    return func.with_attr("tirx.noalias", True)


def _chain(plan: _Plan) -> tuple:
    """The region's epilogue, in the order the kernels apply it."""
    return tuple((["bias"] if plan.bias is not None or plan.batch_norm is not None else [])
                 + (["residual"] if plan.residual is not None else [])
                 + ([plan.act] if plan.act else []))


def declared_takes(kernel, plan: _Plan) -> str | None:
    """Why a declared conv2d kernel does not compute ``plan``'s region, or None."""
    op, args = kernel.op, kernel.args
    chain = _chain(plan)
    declared = op.epilogue
    if declared != chain and not (declared[:1] == ("bias",) and declared[1:] == chain):
        return f"its epilogue is {' + '.join(declared) or 'none'}, the region's " \
               f"{' + '.join(chain) or 'none'}"
    n, oc, _, _ = plan.out_shape
    c = plan.weight_shape[1] * plan.groups
    xs = shape_of(plan.x)
    h, w = (int(xs[1]), int(xs[2])) if plan.nhwc else (int(xs[2]), int(xs[3]))
    values = {"stride": tuple(plan.strides), "dilation": tuple(plan.dilation),
              "groups": plan.groups, "kernel": tuple(plan.weight_shape[2:]),
              "pad": tuple(plan.padding), "batch": n if isinstance(n, int) else None,
              "in_channels": c, "out_channels": oc, "height": h, "width": w,
              "depthwise": plan.depthwise}
    why = op.violation(values)
    if why:
        return why
    for role, value in (("stride", plan.strides), ("dilation", plan.dilation)):
        if role in args and value[0] != value[1]:
            return f"its one {role} argument cannot say {value}"
    if "pad" in args and len(set(plan.padding)) != 1:
        return f"its one pad argument cannot say {tuple(plan.padding)}"
    return None


def _declared_func(plan: _Plan, x, residual, out_ty):
    """The PrimFunc whose one block calls ``plan.declared`` (x, weight, bias, residual
    by role; the weight in the kernel's declared layout)."""
    kernel = plan.declared
    names = {}
    xb = T.decl_buffer(tir_dims(shape_of(x), names), "float32", "x")
    oc, cg, kh, kw = plan.weight_shape
    wshape = [oc, kh, kw, cg] if kernel.op.layouts["weight"] == "OHWI" else [oc, cg, kh, kw]
    wb = T.decl_buffer([T.const(int(d), "int64") for d in wshape], "float32", "w")
    yb = T.decl_buffer(tir_dims(out_ty.shape.values, names), "float32", "y")
    inputs = [("x", xb), ("weight", wb)]
    if "bias" in kernel.op.epilogue:
        inputs.append(("bias", T.decl_buffer([T.const(oc, "int64")], "float32", "bias")))
    if residual is not None:
        inputs.append(("residual", T.decl_buffer(tir_dims(shape_of(residual), names),
                                                 "float32", "residual")))
    from .ops import geometry_roles

    n, c, h, w = xb.shape
    i64 = lambda v: T.const(int(v), "int64")  # noqa: E731
    values = {"batch": n, "in_channels": c, "height": h, "width": w,
              "out_channels": i64(oc), "kernel_h": i64(kh), "kernel_w": i64(kw),
              "out_h": yb.shape[2], "out_w": yb.shape[3], "groups": i64(plan.groups),
              **{role: i64(v) for role, v in geometry_roles(
                  plan.strides, plan.padding, plan.dilation).items()}}
    return kernel.prim_func(inputs, ("y", yb), values, "; ".join(plan.notes))


def _emit_declared(bb, x, weight, residual, plan: _Plan, out_ty, funcs):
    kernel = plan.declared
    ohwi = kernel.op.layouts["weight"] == "OHWI"
    if weight is None:
        w = plan.weight.astype(np.float32)
        w = R.const(np.ascontiguousarray(w.transpose(0, 2, 3, 1)) if ohwi else w, "float32")
    else:  # a weight passed in: permuted by TVM on every call when the layouts differ
        w = bb.emit(R.op.permute_dims(weight, [0, 2, 3, 1])) if ohwi else weight
    args = [x, w]
    if "bias" in kernel.op.epilogue:
        oc = plan.weight_shape[0]
        bias = plan.bias if plan.bias is not None else np.zeros(oc)
        args.append(R.const(bias.astype(np.float32), "float32"))
    if residual is not None:
        args.append(residual)
    func = _declared_func(plan, x, residual, out_ty)
    key = T.structural_hash(func)
    if key not in funcs:
        funcs[key] = bb.add_func(func, f"{kernel.library.name}_{kernel.symbol}")
    return bb.emit(R.call_tir(funcs[key], args, out_ty))


def _emit(bb, x, weight, residual, plan: _Plan, out_ty, funcs, scale=None):
    """The region's replacement: one kernel call (the depthwise kernel's for a depthwise
    conv; a declared kernel's, ``plan.declared``). ``weight``: the weight the caller
    passes (``plan.weight_arg`` after the rewrite's remapping), or None for the constant
    one (``plan.packed`` when a region pass packed it). ``scale``: ``plan.in_scale``
    after the remapping, applied to the packed weight before the call."""
    if plan.declared is not None:
        return _emit_declared(bb, x, weight, residual, plan, out_ty, funcs)
    if plan.packed is not None:
        shape = _packed_shape(plan)
        kernel = _kernel_func(plan, x, residual, out_ty, shape)
        packed = R.const(plan.packed.reshape(shape), "float32")
        if scale is not None:
            packed = _scaled_packed(bb, packed, scale, plan)
        args = [x, packed]
    else:
        assert not plan.winograd or weight is None, "a Winograd conv takes a constant weight"
        kernel = _kernel_func(plan, x, residual, out_ty)
        args = [x, weight if weight is not None else
                R.const(plan.weight.astype(np.float32), "float32")]
        if plan.bias is not None:
            args.append(R.const(plan.bias.astype(np.float32), "float32"))
    key = T.structural_hash(kernel)
    if key not in funcs:
        funcs[key] = bb.add_func(kernel, "tirbyoc_depthwise_conv2d" if plan.depthwise
                                 else "tirbyoc_conv2d")
    if residual is not None:
        args.append(residual)
    return bb.emit(R.call_tir(funcs[key], args, out_ty))


def _block_roles(plan: _Plan) -> tuple:
    """(writes, reads): whether ``plan``'s call may write, and read as its ``x``, NCHW16c
    tensors at full speed; never in NHWC or for a declared kernel. Writing (16k channels
    out, and no activation, relu or relu6, or on ``kernels.BLOCKED_SIGMOID_ISAS`` a SiLU
    or sigmoid: EfficientNet-B0 with its SiLU convs writing blocks ran 6-9% slower on
    Zen 3 with AVX2, the 1x1 convs on 56 x 56 and 112 x 112 then taking the direct path,
    and 3-4% faster on Zen 4 with AVX-512): a
    depthwise conv without a residual (where the kernels' ISA is in
    ``kernels.DEPTHWISE_CHANNELS_ISAS``), or one group with a packed (not Winograd)
    weight and strides the direct path takes (its store keeps each pixel's 16 channels a
    vector; a residual is then read in blocks too, so ``plan_layouts`` blocks both or
    neither). Reading (16k channels in): a depthwise conv; a 1x1 conv of stride 1
    without padding in one group with a packed weight (its tiles read the pixels in
    place): ``"any"``, or ``"with-output"`` below BLOCKED_MIN_CHANNELS in (only when its
    output is blocked too); any other conv the direct path takes (it copies its image
    into phase planes anyway, from the blocks as from NCHW). A conv with a residual, or
    other than 1x1, reads and writes blocks only where the kernel would take the direct
    path for NCHW tensors too (``kernels.conv_direct_suits``), and reads them only from a
    writer that would (``"from-suited"``). ``writes`` is True, False, or
    ``"unsuited"``: a conv without a residual that writes blocks on the direct path where
    NCHW would take the other."""
    _, oc, _, _ = plan.out_shape
    c = plan.weight_shape[1] * plan.groups
    if plan.declared is not None or plan.nhwc or oc % 16 or c == 0:
        return False, False
    from . import kernels

    stores = plan.act in (None, "relu", "relu6") or (
        plan.act in ("silu", "sigmoid") and kernels.isa() in kernels.BLOCKED_SIGMOID_ISAS)
    reads_ok = c % 16 == 0
    if plan.depthwise:
        if kernels.isa() not in kernels.DEPTHWISE_CHANNELS_ISAS or plan.residual is not None:
            return False, False
        return stores, reads_ok and "any"
    direct = (plan.groups == 1 and plan.packed is not None and not plan.winograd and
              max(plan.strides) <= BLOCKED_STRIDE_MAX)
    if not direct:
        return False, False
    plain = plan.weight_shape[2:] == (1, 1) and plan.strides == (1, 1) and \
        tuple(plan.padding) == (0, 0, 0, 0)
    # Blocks force the direct path. Where the kernel would not take it for NCHW tensors,
    # only a conv without a shortcut writes them, and only a plain one reads them
    # (MobileNet's, between depthwise convs); the others stay NCHW there (ResNet-50's 1x1
    # convs with shortcuts at 56 x 56 and 28 x 28 ran 1.1-1.5x slower on the direct
    # path, those at 14 x 14 and 7 x 7 1.2-1.4x faster than through NCHW stores; a 1x1
    # conv at 56 x 56 writing blocks for a 3x3 conv, 1.4x slower).
    _, cg, kh, kw = plan.weight_shape
    suits = kernels.conv_direct_suits(plain, plan.out_shape[2] * plan.out_shape[3], oc,
                                      cg * kh * kw + ("bias" in _chain(plan)))
    writes = stores and (True if suits else "unsuited" if plan.residual is None else False)
    if not reads_ok:
        return writes, False
    if plain and plan.residual is None:
        return writes, ("with-output" if c < BLOCKED_MIN_CHANNELS else "any")
    return writes, suits and "from-suited"


def plan_layouts(b: Bindings, plans, pools=None) -> set:
    """Chooses, once for the function, the tensors between conv calls that stay NCHW16c
    (as ONNX Runtime's NCHWc path keeps its blocks): the output of a call whose every
    reader is another call, as its ``x`` or its residual, where the writer can write
    blocks and every reader read them (``_block_roles``). A call that reads a residual
    writes blocks exactly when its residual is blocked (the kernels read the residual in
    the output's layout), and one whose ``x`` role is ``"with-output"`` reads blocks only
    when it writes them, one whose role is ``"from-suited"`` only from a writer that takes
    the direct path by choice: tensors leave the set until these hold (each pass only
    removes, so it ends). ResNet's residual stream stays blocked from one bottleneck to the next
    this way, its stride-2 projections reading the blocks through their phase planes.
    ``pools`` (``blocked_pools``): max pools over a call's output, each a reader that
    takes blocks (into an NCHW output); the ones that will read blocks are returned.
    Each such call then reads or writes the blocks in place (no transposes); every other
    tensor, the function's inputs and results included, stays NCHW, so no conversion is
    ever added. Only where the kernels have the direct path (``kernels.CONV_DIRECT_ISAS``;
    else the calls would convert through NCHW copies): ``TIRBYOC_CONV_BLOCKED=0`` keeps
    everything NCHW."""
    from . import kernels

    if os.environ.get("TIRBYOC_CONV_BLOCKED", "1") == "0" or kernels.isa() not in kernels.CONV_DIRECT_ISAS:
        return set()
    # each call's output var -> (the output var of a call reading it, as "x" or
    # "residual")
    readers = {}
    for var, plan in plans.items():
        for how, read in (("x", plan.x), ("residual", plan.residual)):
            if isinstance(read, R.Var) and read in plans:
                readers.setdefault(read, []).append((var, how))
    roles = {var: _block_roles(plan) for var, plan in plans.items()}
    # max pools the built-in kernel takes read blocks of any conv's output (never write)
    for var, x in (pools or {}).items():
        if x in plans:
            readers.setdefault(x, []).append((var, "x"))
            roles[var] = (False, "any")

    def reads(var, u, how):
        """Whether call ``u`` may read ``var``'s blocks (as ``how``)."""
        if how == "residual":
            return bool(roles[u][0])
        role = roles[u][1]
        return bool(role) and (role != "from-suited" or roles[var][0] is True)

    blocked = {var for var, users in readers.items()
               if b.uses.get(var, 0) == len(users) and roles[var][0] and
               all(reads(var, u, how) for u, how in users)}
    changed = True
    while changed:
        changed = False
        for var in list(blocked):
            residual = plans[var].residual
            if (residual is not None and residual not in blocked) or any(
                    u not in blocked and (how == "residual" or roles[u][1] == "with-output")
                    for u, how in readers[var]):
                blocked.discard(var)
                changed = True
    pooled = set()
    for var in blocked:
        plans[var].layouts |= _Y16
        for u, how in readers[var]:
            if u not in plans:
                pooled.add(u)
            elif how == "x":
                plans[u].layouts |= _X16
    for plan in plans.values():
        if plan.layouts:
            plan.notes = plan.notes + ("NCHW16c " + " and ".join(
                name for bit, name in ((_X16, "input"), (_Y16, "output"))
                if plan.layouts & bit),)
    return pooled


def blocked_pools(b: Bindings, plans) -> dict:
    """``{var: x}``: the max pools of ``b`` over a conv call's output (``plans``) that
    the built-in kernel takes with x in blocks (16k channels; ``pool._params``)."""
    from . import pool

    out = {}
    for var, value in b.values.items():
        if is_op(value, "relax.nn.max_pool2d") and value.args[0] in plans and \
                pool._params(value) is not None and int(shape_of(value)[1]) % 16 == 0:
            out[var] = value.args[0]
    return out


@R.expr_functor.mutator
class _Rewriter(R.PyExprMutator):
    def __init__(self, mod, plans, funcs, pooled=()):
        super().__init__(mod)
        self.plans = plans
        self.funcs = funcs
        self.pooled = pooled  # max pools reading blocks (plan_layouts)
        # the NCHW16c outputs, and the bindings dropped for reading them
        self.dropped = {var for var, plan in plans.items() if plan.layouts & _Y16}

    def _pool(self, binding):
        """A max pool over a blocked conv output: the built-in kernel's call reading the
        blocks (its output NCHW)."""
        from . import pool

        value = binding.value
        x = self.visit_expr(value.args[0])
        kernel = pool._kernel_func(x, binding.var, pool._params(value), layouts=_X16)
        key = T.structural_hash(kernel)
        if key not in self.funcs:
            self.funcs[key] = self.builder_.add_func(kernel, "tirbyoc_max_pool2d")
        return self.builder_.emit(R.call_tir(self.funcs[key], [x], binding.var.ty))

    def visit_var_binding_(self, binding):
        plan = self.plans.get(binding.var)
        if binding.var in self.pooled:
            self.set_var_remap(binding.var, self._pool(binding))
            return
        if plan is None:
            if any(v in self.dropped for v in R.analysis.free_vars(binding.value)):
                # inside a region that reads an NCHW16c tensor: replaced by its call
                # (re-emitting it would apply the graph's op to the blocks)
                self.dropped.add(binding.var)
                return
            super().visit_var_binding_(binding)
            return
        bb = self.builder_
        x = self.visit_expr(plan.x)
        residual = None if plan.residual is None else self.visit_expr(plan.residual)
        weight = None if plan.weight_arg is None else self.visit_expr(plan.weight_arg)
        scale = None if plan.in_scale is None else self.visit_expr(plan.in_scale)
        out_ty = binding.var.ty
        if plan.layouts & _Y16:
            n, oc, oh, ow = plan.out_shape
            out_ty = R.TensorType([n, oc // 16, oh, ow, 16], "float32")
        if plan.nhwc:
            # the kernel's layout in, the graph's out: TVM's transposes around the call
            x = bb.emit(R.op.permute_dims(x, _NHWC_TO_NCHW))
            if residual is not None:
                residual = bb.emit(R.op.permute_dims(residual, _NHWC_TO_NCHW))
            out_ty = R.TensorType(plan.out_shape, "float32")
        new = _emit(bb, x, weight, residual, plan, out_ty, self.funcs, scale)
        if plan.nhwc:
            new = bb.emit(R.op.permute_dims(new, _NCHW_TO_NHWC))
        self.set_var_remap(binding.var, new)


def _offer(plan: _Plan, kernels, steps, builtin):
    """The plan after its region passes: a declared kernel's (the first of ``kernels``
    that computes it: the batch norm folded, the weight left for that kernel's layout),
    else the built-in kernels' (``builtin``), else None (TVM computes the region)."""
    for kernel in kernels:
        if declared_takes(kernel, plan) is None:
            folded = _run_passes(plan, [s for s in steps if s is fold_batch_norm])
            layout = kernel.op.layouts["weight"]
            notes = folded.notes + ((f"weight {layout}" + (" at compile time" if
                                                          plan.weight is not None else
                                                          ", permuted on every call"),)
                                    if layout != "OIHW" else ())
            return replace(folded, declared=kernel, notes=notes)
    return _run_passes(plan, steps) if builtin else None


def _out_dtype(attrs):
    """A conv's ``out_dtype`` to build another conv with: None where it was left unset
    (the input's dtype; ``str`` of the unset one reads "None", which no conv takes)."""
    dtype = str(attrs.out_dtype)
    return None if dtype in ("None", "void", "") else dtype


def _float32(call) -> bool:
    """Whether a conv call's input, weight and output are float32."""
    return all(getattr(v.ty, "dtype", None) == "float32" for v in call.args[:2]) and \
        _out_dtype(call.attrs) in (None, "float32")


def _spatial_zero_pad(pad, rank):
    """``(x, widths)`` where ``pad`` is a zero padding of ``x`` (rank ``rank``) on its
    axes after the first two only, ``widths`` (before, after) per such axis; None for
    anything else."""
    if not is_op(pad, "relax.nn.pad") or str(pad.attrs.pad_mode) != "constant" or \
            float(pad.attrs.pad_value) != 0.0:
        return None
    width = [int(v) for v in pad.attrs.pad_width]
    if len(width) != 2 * rank or any(width[:4]) or min(width) < 0:
        return None
    return pad.args[0], width[4:]


def _pad_into_conv(call, values):
    """``conv2d(pad(x), padding=p)`` as ``conv2d(x, padding=p + the pad)`` when the pad is
    a zero pad of the spatial axes only (NCHW), else None."""
    if not is_op(call, "relax.nn.conv2d") or str(call.attrs.data_layout) != "NCHW":
        return None
    padded = _spatial_zero_pad(values.get(call.args[0]), 4)
    if padded is None:
        return None
    x, (top, bottom, left, right) = padded
    p = [int(v) for v in call.attrs.padding]
    a = call.attrs
    return R.op.nn.conv2d(x, call.args[1], strides=a.strides,
                          padding=[p[0] + top, p[1] + left, p[2] + bottom, p[3] + right],
                          dilation=a.dilation, groups=int(a.groups),
                          data_layout=str(a.data_layout), kernel_layout=str(a.kernel_layout),
                          out_layout=str(a.out_layout), out_dtype=_out_dtype(a))


def _bias_after(call, b, op: str, spatial: int):
    """``(conv, bias)`` where ``call`` adds a constant per-channel bias (``[1, OC, 1..]``
    or ``[OC, 1..]``, ``spatial`` ones) to a call of ``op`` used only there: the conv
    call and the bias as a numpy [OC]; ``(call, None)`` for any other call."""
    if not is_op(call, "relax.add"):
        return call, None
    for conv, other in (call.args, call.args[::-1]):
        if b.uses.get(conv, 0) == 1 and is_op(b.producer(conv), op):
            oc = (_static_shape(conv) or [None, None])[1]
            value = _const(other, b.values)
            ones = [1] * spatial
            if value is not None and list(value.shape) in ([1, oc, *ones], [oc, *ones]):
                return b.producer(conv), value.reshape(oc)
    return call, None


def _conv1d_as_conv2d(call, b):
    """``conv1d(x, W)`` (NCW, OIW) as ``conv2d`` over images one row high: ``x`` and
    ``W`` get an axis of 1 before their last one, the output loses it again, and a bias
    added right after the conv1d (``[1, OC, 1]`` or ``[OC, 1]``, PyTorch's ``Conv1d``)
    is added before the axis goes, so that the conv's call takes it too. The conv
    kernels then take these like any conv2d (SqueezeBERT's grouped 1x1 convs, wav2vec
    2.0's feature extractor and positional conv): TVM's own conv1d schedule ran
    SqueezeBERT at 243 ms a run, wav2vec 2.0 (one second of audio) at 1.8 s. A zero pad
    of the length before it (a causal conv's, Mimi's and EnCodec's) joins its padding,
    as ``fold_pads`` does for 2-D ones. None for any other call."""
    call, bias = _bias_after(call, b, "relax.nn.conv1d", 1)
    if not is_op(call, "relax.nn.conv1d"):
        return None
    a = call.attrs
    if (str(a.data_layout), str(a.kernel_layout), str(a.out_layout)) != ("NCW", "OIW", "NCW"):
        return None
    x, w = call.args
    dims = _static_shape(w)
    if dims is None or len(dims) != 3 or not all(isinstance(d, int) for d in dims) or \
            len(shape_of(x) or ()) != 3:
        return None
    w = R.op.reshape(w, [dims[0], dims[1], 1, dims[2]])
    left, right = (int(v) for v in a.padding)
    padded = _spatial_zero_pad(b.producer(x), 3)  # a causal conv's left pad, say
    if padded is not None:
        x, (extra_left, extra_right) = padded
        left, right = left + extra_left, right + extra_right
    y = R.op.nn.conv2d(R.op.expand_dims(x, [2]), w, strides=[1, int(a.strides[0])],
                       padding=[0, left, 0, right], dilation=[1, int(a.dilation[0])],
                       groups=int(a.groups), out_dtype=_out_dtype(a))
    if bias is not None:
        y = R.op.add(y, R.const(bias.reshape(1, -1, 1, 1)))
    return R.op.squeeze(y, [2])


def _conv_transpose_as_matmul(call, b):
    """A transposed conv (``conv2d_transpose`` NCHW / IOHW, or ``conv1d_transpose`` NCW /
    IOW as one a row high; one group, no dilation, any kernel, stride, padding and output
    padding) as a matrix product per input pixel and an overlap-add: ``x`` [N, C, H, W]
    as [N H W, C] times ``W`` [C, O kh kw] gives every pixel's O x kh x kw contributions
    ``Z``; output pixel ``(i sh + ki - top, j sw + kj - left)`` sums ``Z[i, j, :, ki,
    kj]`` (``_overlap_add``). The product is a dense the kernels take (its weight constant
    and packed); the overlap-add is a few shifted adds TVM fuses into one loop over the
    output. Where the kernel is its stride (DPT's reassemble stage, any "unpatchify")
    windows do not overlap and the overlap-add is a depth to space. TVM's own schedule
    of the transposed conv, a reduction over three loops, took 1.56 s and 0.47 s of
    DPT's 2.4 s run and 58 of HiFi-GAN's 74 ms. A bias added right after it ([1, O, 1,
    1] or [O, 1, 1], constant; [1, O, 1] or [O, 1] in 1-D) joins the product's bias
    where windows do not overlap, and the overlap-add's otherwise. None for any other
    call."""
    for op, spatial in (("relax.nn.conv2d_transpose", 2), ("relax.nn.conv1d_transpose", 1)):
        conv, bias = _bias_after(call, b, op, spatial)
        if is_op(conv, op):
            call = conv
            break
    one_d = is_op(call, "relax.nn.conv1d_transpose")
    if not (one_d or is_op(call, "relax.nn.conv2d_transpose")):
        return None
    a = call.attrs
    x, w = call.args
    dims, xs = _static_shape(w), _static_shape(x)
    layouts = ("NCW", "IOW", "NCW") if one_d else ("NCHW", "IOHW", "NCHW")
    rank = 3 if one_d else 4
    if (str(a.data_layout), str(a.kernel_layout), str(a.out_layout)) != layouts or \
            int(a.groups) != 1 or dims is None or xs is None or len(dims) != rank or \
            len(xs) != rank or not all(isinstance(d, int) for d in dims) or \
            not isinstance(xs[1], int) or any(int(v) != 1 for v in a.dilation) or \
            not _float32(call):
        return None
    pads = [int(v) for v in a.padding]
    strides = [int(v) for v in a.strides]
    out_pads = [int(v) for v in a.output_padding]
    if one_d:  # as a conv2d_transpose one row high
        dims = [dims[0], dims[1], 1, dims[2]]
        xs = [xs[0], xs[1], 1, xs[2]]
        pads, strides, out_pads = [0, pads[0], 0, pads[1]], [1, *strides], [0, *out_pads]
    c, o, kh, kw = dims
    n, _, h, wd = xs
    if min(pads) < 0 or any(p >= s for p, s in zip(out_pads, strides)):
        return None
    rows = R.op.reshape(R.op.permute_dims(x, [0, 2, 3, 1]) if not one_d else
                        R.op.permute_dims(x, [0, 2, 1]), [n * h * wd, c])
    z = R.op.matmul(rows, R.op.reshape(w, [c, o * kh * kw]))
    disjoint = [kh, kw] == strides and not any(pads) and not any(out_pads)
    if bias is not None and disjoint:
        z = R.op.add(z, R.const(np.repeat(bias.astype("float32"), kh * kw)))
    z = R.op.reshape(z, [n, h, wd, o, kh, kw])
    y = _overlap_add(z, (n, o, h, wd), (kh, kw), strides, pads, out_pads)
    if bias is not None and not disjoint:
        y = R.op.add(y, R.const(bias.astype("float32").reshape(1, o, 1, 1)))
    return R.op.squeeze(y, [2]) if one_d else y


def _overlap_add(z, size, kernel, strides, pads, out_pads):
    """The output [N, O, OH, OW] of a transposed conv from each input pixel's
    contributions ``z`` [N, H, W, O, kh, kw]: tap ``ki`` of row ``i`` lands on row ``i sh
    + ki - top``. Split the taps into groups of ``sh`` (the last one zero-padded to
    ``sh``); group ``a`` lands on the coarse rows ``i + a``, each of ``sh`` fine rows: so
    the output on the grid of ``H + gh - 1`` coarse rows is the sum over the groups of
    ``z``'s slices shifted by ``a`` coarse rows (zero-padded), then depth to space, then
    the rows from ``top`` on, ``OH`` of them (with zeros past the grid where output
    padding asks for more). Every op is injective: TVM fuses them into one loop."""
    (n, o, h, wd), (kh, kw), (sh, sw) = size, kernel, strides
    top, left, bottom, right = pads
    oh = (h - 1) * sh - top - bottom + kh + out_pads[0]
    ow = (wd - 1) * sw - left - right + kw + out_pads[1]
    # coarse groups: enough for the taps and for the last output row asked for
    gh = max(-(-kh // sh), -(-(kh - bottom + out_pads[0]) // sh))
    gw = max(-(-kw // sw), -(-(kw - right + out_pads[1]) // sw))
    total = None
    for ga in range(-(-kh // sh)):
        for gb in range(-(-kw // sw)):
            th, tw = min(sh, kh - ga * sh), min(sw, kw - gb * sw)
            part = z
            if (th, tw) != (kh, kw):
                part = R.op.strided_slice(z, axes=[4, 5], begin=[ga * sh, gb * sw],
                                          end=[ga * sh + th, gb * sw + tw])
            width = [0, 0, ga, gh - 1 - ga, gb, gw - 1 - gb, 0, 0, 0, sh - th, 0, sw - tw]
            if any(width):
                part = R.op.nn.pad(part, width)
            total = part if total is None else R.op.add(total, part)
    grid = R.op.reshape(R.op.permute_dims(total, [0, 3, 1, 4, 2, 5]),
                        [n, o, (h + gh - 1) * sh, (wd + gw - 1) * sw])
    # rows of the grid past the output's last (a static count, whatever H is)
    past = (gh * sh + bottom - kh - out_pads[0], gw * sw + right - kw - out_pads[1])
    if not top and not left and past == (0, 0):
        return grid
    # (in bounds by construction: said so, or a symbolic length's end is an if_then_else
    # in the output's shape, which FuseOps cannot type)
    return R.op.strided_slice(grid, axes=[2, 3], begin=[top, left],
                              end=[top + oh, left + ow], assume_inbound=True)


def _conv3d_patches_as_matmul(call, b):
    """``conv3d(x, W)`` whose kernel is its stride (no padding, dilation or groups, NCDHW
    / OIDHW: VideoMAE's and ViViT's tubelet embeddings, 2 x 16 x 16 patches of a clip)
    as what it is, a matrix product per patch: ``x`` cut into its patches, [N D' H' W',
    C kd kh kw], times ``W`` as [C kd kh kw, O], the result back to [N, O, D', H', W']
    (the input's rows past the last whole patch dropped, as the conv drops them). TVM's
    conv3d schedule took 582 of VideoMAE's 855 ms. A bias added right after it joins
    the product. None for any other call."""
    call, bias = _bias_after(call, b, "relax.nn.conv3d", 3)
    if not is_op(call, "relax.nn.conv3d"):
        return None
    a = call.attrs
    x, w = call.args
    dims, xs = _static_shape(w), _static_shape(x)
    if (str(a.data_layout), str(a.kernel_layout), str(a.out_layout)) != \
            ("NCDHW", "OIDHW", "NCDHW") or int(a.groups) != 1 or dims is None or \
            xs is None or len(dims) != 5 or len(xs) != 5 or \
            not all(isinstance(d, int) for d in dims + xs[1:]) or not _float32(call):
        return None
    o, c, *kernel = dims
    if [int(v) for v in a.strides] != kernel or any(int(v) for v in a.padding) or \
            any(int(v) != 1 for v in a.dilation):
        return None
    n, _, *size = xs
    out = [s // k for s, k in zip(size, kernel)]
    if 0 in out:
        return None
    if [p * k for p, k in zip(out, kernel)] != size:
        x = R.op.strided_slice(x, axes=[2, 3, 4], begin=[0, 0, 0],
                               end=[p * k for p, k in zip(out, kernel)])
    (od, oh, ow), (kd, kh, kw) = out, kernel
    patches = R.op.permute_dims(R.op.reshape(x, [n, c, od, kd, oh, kh, ow, kw]),
                                [0, 2, 4, 6, 1, 3, 5, 7])
    taps = c * kd * kh * kw
    y = R.op.matmul(R.op.reshape(patches, [n * od * oh * ow, taps]),
                    R.op.permute_dims(R.op.reshape(w, [o, taps]), [1, 0]))
    if bias is not None:
        y = R.op.add(y, R.const(bias.astype("float32")))
    return R.op.permute_dims(R.op.reshape(y, [n, od, oh, ow, o]), [0, 4, 1, 2, 3])


def conv3d_patches_as_matmul(mod):
    """``mod`` with every conv3d whose kernel is its stride a product per patch
    (``_conv3d_patches_as_matmul``); ``mod`` itself when there is none."""
    return rewrite_calls(mod, _conv3d_patches_as_matmul)


def conv_transpose_as_matmul(mod):
    """``mod`` with every transposed conv whose kernel is its stride a product and a
    depth to space (``_conv_transpose_as_matmul``); ``mod`` itself when there is none."""
    return rewrite_calls(mod, _conv_transpose_as_matmul)


def conv1d_as_conv2d(mod):
    """``mod`` with every 1-D convolution written as a 2-D one (``_conv1d_as_conv2d``);
    ``mod`` itself when there is none."""
    return rewrite_calls(mod, _conv1d_as_conv2d)


def fold_pads(mod):
    """``mod`` with every zero padding that feeds a convolution folded into the
    convolution's own padding (``R.nn.pad`` then ``conv2d``: what TF-style "same"
    padding exports as, HuggingFace's MobileNetV2 and EfficientNet among them, and a
    zero-width pad of MobileNetV2's 1x1 convs). The kernels read the padding as taps
    outside the input, so the padded copy (0.8 ms a run of MobileNetV2) is never
    made; a pad that something else also reads stays for it. ``mod`` itself when
    there is none."""
    return rewrite_calls(mod, lambda call, b: _pad_into_conv(call, b.values))


def offload_convs(mod, kernels=(), builtin=True, passes=None, pools=False):
    """``mod`` with every convolution of the form above one kernel call (a depthwise one
    the depthwise kernel's); a new module, functions with a ``Codegen`` attribute
    untouched. ``passes``: the region passes (default ``tirbyoc.weights.DEFAULT_PASSES``);
    their ``conv_region`` forms run, in order, on each matched conv region: folding a
    batch norm (``fold_batch_norm``: without it, a region ends before its batch norm,
    which stays TVM's) and packing the weight (``pack_constants``). ``kernels``: declared
    conv2d kernels (``tirbyoc.Library``) offered each region first; ``builtin``: whether
    the built-in kernels take the regions they leave. ``pools``: whether the built-in
    kernel takes the max pools (no library declares one), so that a conv may write
    blocks for the one after it (``plan_layouts``)."""
    from . import weights

    mod = fold_pads(conv1d_as_conv2d(conv3d_patches_as_matmul(conv_transpose_as_matmul(mod))))
    passes = weights.DEFAULT_PASSES if passes is None else tuple(passes)
    steps = _conv_steps(passes)
    batch_norms = fold_batch_norm in steps  # else a region ends before its batch norm
    out, funcs = mod, {}
    for gv, func in list(mod.functions_items()):
        if not isinstance(func, R.Function) or (func.attrs and "Codegen" in func.attrs):
            continue
        b = Bindings(func)
        plans = {}
        for var, value in b.values.items():
            if is_op(value, "relax.nn.conv2d"):
                found = _plan(b, var, value, batch_norms=batch_norms)
                if found is not None and found[0] in plans:
                    # the add of two convolutions (a projection shortcut) belongs to
                    # the first; this one ends before it
                    found = _plan(b, var, value, residuals=False, batch_norms=batch_norms)
                if found is not None and found[0] not in plans:
                    plan = _offer(found[1], kernels, steps, builtin)
                    if plan is not None:
                        plans[found[0]] = _with_channel_scale(b, plan)
        if not plans:
            continue
        pooled = plan_layouts(b, plans, blocked_pools(b, plans) if pools else None)
        rewriter = _Rewriter(out, plans, funcs, pooled)
        new = rewriter.visit_expr(func)
        out = rewriter.builder_.get()
        out = out.clone() if out.same_as(mod) else out
        out.update_func(gv, R.analysis.remove_all_unused(new))
    return out
