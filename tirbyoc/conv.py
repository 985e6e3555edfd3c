"""Convolutions as matrix products: ``R.nn.conv2d`` with a constant weight becomes an
im2col of its input (layout ops TVM fuses and schedules) and one matmul with the weight
as ``[K, OC]``, which the dense family offloads with its epilogue (the weight packed at
compile time, the bias and a relu in the same kernel call).

Before legalization, for a float32 ``conv2d`` in NCHW / OIHW with ``groups == 1``, static
channels and spatial sizes, and a constant weight:

    y = conv2d(x, W) (+ b) (-> batch_norm in inference mode) (+ r) (-> relu)

becomes

    cols = im2col(x)                       [N, C * KH * KW (+ 1), OH * OW]: pad, one
                                           strided slice per kernel tap, stack, reshape
                                           (a 1x1 stride-1 conv reads x as it is); with a
                                           bias, one more row of ones
    z = relu(W' @ cols)                    W' = W as [OC, C * KH * KW] (+ the bias as
                                           its last column); a batch norm after the conv
                                           is folded into W' and the bias at compile time
                                           (+ r: a tensor of y's shape, e.g. a ResNet
                                           shortcut, added before the relu)
    y = reshape(z, [N, OC, OH, OW])        NCHW as the product gives it: no transpose

A depthwise conv (``groups`` = input channels = output channels) is instead the sum over
its kernel taps of a strided slice of the padded input times that tap's per-channel weight,
with the same bias, batch norm, shortcut and activation after it: elementwise ops that TVM
fuses into one PrimFunc (one pass over the output) and tirbyoc's Injective rule schedules.
The activation is a relu or a ReLU6 (``clip(0, 6)``).

Every intermediate of the replaced ops must be used only by the next one. The folding is
computed in float64 and rounded once: ``W * gamma / sqrt(var + eps)``,
``(b - mean) * gamma / sqrt(var + eps) + beta``. A batch norm in training mode, another
layout, groups other than 1 or the channel count, a weight that is not a constant, or a symbolic channel or
spatial size keep TVM's ``conv2d``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import _tvm as T
from .bindings import Bindings, is_op, shape_of

R = T.relax_ns


def _static_shape(expr):
    """The dimensions, constants as ints."""
    dims = shape_of(expr)
    return None if dims is None else [int(v) if isinstance(v, T.IntImm) else v
                                      for v in dims]


def _const(expr, values):
    """The numpy value of a constant, through variables and reshapes of constants."""
    while isinstance(expr, R.Var) and expr in values:
        expr = values[expr]
    if isinstance(expr, T.RelaxConstant):
        return T.constant_value(expr)
    if is_op(expr, "relax.reshape"):
        inner = _const(expr.args[0], values)
        shape = _static_shape(expr)
        if inner is not None and shape is not None and all(isinstance(s, int) for s in shape):
            return inner.reshape(shape)
    return None


@dataclass
class _Plan:
    x: object
    weight: np.ndarray      # [OC, C, KH, KW], float64, folded
    bias: np.ndarray | None  # [OC], float64
    residual: object | None  # a tensor of the output's shape added after the bias
    act: str | None          # "relu" or "relu6"
    depthwise: bool
    strides: tuple
    padding: tuple          # top, left, bottom, right
    dilation: tuple
    out_shape: list         # [N, OC, OH, OW]
    replaced: set


def _plan(b: Bindings, var, call, residuals=True):
    """The region starting at ``var = conv2d(...)`` (its last variable and plan)."""
    attrs = call.attrs
    if (str(attrs.data_layout), str(attrs.kernel_layout)) != ("NCHW", "OIHW") or \
            str(attrs.out_layout) not in ("NCHW", "") or \
            str(attrs.out_dtype) not in ("float32", ""):
        return None
    x, w = call.args
    xs, ys = _static_shape(x), _static_shape(call)
    weight = _const(w, b.values)
    if xs is None or ys is None or weight is None or weight.dtype != np.float32:
        return None
    if getattr(x.ty, "dtype", None) != "float32" or not all(
            isinstance(d, int) for d in xs[1:] + ys[1:]):
        return None
    weight = weight.astype(np.float64)
    oc = weight.shape[0]
    groups = int(attrs.groups)
    # one matrix product (groups 1), or depthwise: one filter per channel
    if groups != 1 and not (groups == xs[1] == oc and weight.shape[1] == 1):
        return None
    bias, residual, act, last, replaced = None, None, None, var, set()
    while True:
        user = b.only_user(last)
        if user is None:
            break
        uvar, uval = user
        if is_op(uval, "relax.add") and act is None and residual is None:
            other = uval.args[1] if uval.args[0].same_as(last) else uval.args[0]
            value = _const(other, b.values)
            if value is not None and bias is None and value.size == oc and \
                    value.shape in ((1, oc, 1, 1), (oc, 1, 1)):
                bias = value.reshape(oc).astype(np.float64)
            elif value is None and residuals and _static_shape(other) == ys and \
                    getattr(other.ty, "dtype", None) == "float32":
                residual = other  # a tensor of the output's shape (a shortcut)
            else:
                break
        elif is_op(uval, "relax.nn.batch_norm") and act is None and residual is None:
            folded = _batch_norm(b, uvar, uval, last)
            if folded is None:
                break
            scale, shift, uvar = folded
            weight = weight * scale[:, None, None, None]
            bias = (bias if bias is not None else 0.0) * scale + shift
        elif is_op(uval, "relax.nn.relu") and act is None:
            act = "relu"
        elif is_op(uval, "relax.clip") and act is None and _clip_bounds(uval) == (0.0, 6.0):
            act = "relu6"
        else:
            break
        replaced.add(last)
        last = uvar
    return last, _Plan(x, weight, bias, residual, act, groups != 1, tuple(int(s) for s in attrs.strides),
                       tuple(int(p) for p in attrs.padding),
                       tuple(int(d) for d in attrs.dilation), ys, replaced)


def _clip_bounds(call):
    """(min, max) of an ``R.clip`` with constant bounds, else None."""
    try:
        return float(call.args[1].value), float(call.args[2].value)
    except (AttributeError, IndexError, TypeError):
        return None


def _batch_norm(b: Bindings, var, call, data):
    """(scale, shift, the variable of its output) for an inference-mode batch norm over
    the channels with constant statistics whose tuple is only indexed at 0; else None."""
    attrs = call.attrs
    if not call.args[0].same_as(data) or int(attrs.axis) not in (1, -3) or \
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


def _emit(bb, x, residual, plan: _Plan):
    n, c, h, w = _static_shape(x)
    _, oc, oh, ow = plan.out_shape
    _, _, kh, kw = plan.weight.shape
    sh, sw = plan.strides
    pt, pl, pb, pr = plan.padding
    dh, dw = plan.dilation
    op = R.op
    src = x
    if any(plan.padding):
        src = bb.emit(op.nn.pad(x, [0, 0, 0, 0, pt, pb, pl, pr]))
    if plan.depthwise:
        return _emit_depthwise(bb, src, residual, plan)
    if (kh, kw, sh, sw) == (1, 1, 1, 1):
        cols = src
    else:
        taps = [bb.emit(op.strided_slice(src, [2, 3], [r * dh, s * dw],
                                         [r * dh + (oh - 1) * sh + 1,
                                          s * dw + (ow - 1) * sw + 1], [sh, sw]))
                for r in range(kh) for s in range(kw)]
        cols = bb.emit(op.stack(taps, axis=2))                   # [N, C, KK, OH, OW]
    cols = bb.emit(op.reshape(cols, [n, c * kh * kw, oh * ow]))  # [N, K, P]
    weight = plan.weight.reshape(oc, -1)
    if plan.bias is not None:
        # the bias as one more term of the product: a row of ones under the columns
        ones = bb.emit(op.ones(R.ShapeExpr([n, 1, oh * ow]), "float32"))
        cols = bb.emit(op.concat([cols, ones], axis=1))
        weight = np.concatenate([weight, plan.bias[:, None]], axis=1)
    z = bb.emit(op.matmul(R.const(weight.astype(np.float32), "float32"), cols,
                          out_dtype="float32"))                 # [N, OC, P]
    if plan.residual is not None:
        z = bb.emit(op.add(z, bb.emit(op.reshape(residual, [n, oc, oh * ow]))))
    z = _activation(bb, z, plan.act)
    return bb.emit(op.reshape(z, [n, oc, oh, ow]))


def _activation(bb, z, act):
    if act == "relu":
        return bb.emit(R.op.nn.relu(z))
    if act == "relu6":
        return bb.emit(R.op.clip(z, R.prim_value(T.FloatImm("float64", 0.0)),
                                 R.prim_value(T.FloatImm("float64", 6.0))))
    return z


def _emit_depthwise(bb, src, residual, plan: _Plan):
    """A depthwise conv as the sum over kernel taps of a strided slice of the (padded)
    input times that tap's per-channel weight: elementwise ops that TVM fuses into one
    PrimFunc (one pass over the output) and tirbyoc's Injective rule schedules."""
    _, oc, oh, ow = plan.out_shape
    _, _, kh, kw = plan.weight.shape
    sh, sw = plan.strides
    dh, dw = plan.dilation
    op = R.op
    z = None
    for r in range(kh):
        for s in range(kw):
            tap = bb.emit(op.strided_slice(src, [2, 3], [r * dh, s * dw],
                                           [r * dh + (oh - 1) * sh + 1,
                                            s * dw + (ow - 1) * sw + 1], [sh, sw]))
            w = R.const(plan.weight[:, 0, r, s].reshape(1, oc, 1, 1).astype(np.float32),
                        "float32")
            term = bb.emit(op.multiply(tap, w))
            z = term if z is None else bb.emit(op.add(z, term))
    if plan.bias is not None:
        z = bb.emit(op.add(z, R.const(plan.bias.reshape(1, oc, 1, 1).astype(np.float32),
                                      "float32")))
    if residual is not None:
        z = bb.emit(op.add(z, residual))
    return _activation(bb, z, plan.act)


@R.expr_functor.mutator
class _Rewriter(R.PyExprMutator):
    def __init__(self, mod, plans):
        super().__init__(mod)
        self.plans = plans

    def visit_var_binding_(self, binding):
        plan = self.plans.get(binding.var)
        if plan is None:
            super().visit_var_binding_(binding)
            return
        residual = None if plan.residual is None else self.visit_expr(plan.residual)
        new = _emit(self.builder_, self.visit_expr(plan.x), residual, plan)
        self.set_var_remap(binding.var, new)


def convs_as_matmuls(mod):
    """``mod`` with every convolution of the form above an im2col and a matmul (a new
    module; functions with a ``Codegen`` attribute untouched)."""
    out = mod
    for gv, func in mod.functions_items():
        if not isinstance(func, R.Function) or (func.attrs and "Codegen" in func.attrs):
            continue
        b = Bindings(func)
        plans = {}
        for var, value in b.values.items():
            if is_op(value, "relax.nn.conv2d"):
                found = _plan(b, var, value)
                if found is not None and found[0] in plans:
                    # the add of two convolutions (a projection shortcut) belongs to
                    # the first; this one ends before it
                    found = _plan(b, var, value, residuals=False)
                if found is not None and found[0] not in plans:
                    plans[found[0]] = found[1]
        if not plans:
            continue
        new = _Rewriter(out, plans).visit_expr(func)
        out = out.clone() if out is mod else out
        out.update_func(gv, R.analysis.remove_all_unused(new))
    return out
