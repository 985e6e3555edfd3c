"""Attention as one region: ``matmul -> scale -> mask -> softmax -> matmul`` becomes one
call of the fused kernel ``tirbyoc_attention_f32``.

The graph level finds the region before legalization, in every Relax function:

    S = R.matmul(Q, K)                     [B.., M, D] x [B.., D, N], float32
    S = S / c   or   S * c                 optional; c a float32 scalar constant
    S = R.where(mask, -inf, S)             optional; or R.where(mask, S, -inf); mask bool,
                                           broadcast over the batch and/or the rows
      or S = S + R.where(mask, 0, -inf)    the same mask added (PyTorch's attention with a
                                           bool mask, HuggingFace's BERT); or with -inf
                                           and 0 swapped
                                           (either form also with the lowest float32,
                                           HuggingFace's finfo.min, for -inf: GPT-2's
                                           causal mask)
      or S = S + C                         C a float32 constant of zeros and one of those
                                           masking values (the causal mask an ONNX
                                           exporter folds): the bool mask C == 0; no
                                           mask for a C of zeros only
    P = R.nn.softmax(S, axis=-1)
    P = R.where(all(S == -inf), 0, P)      optional: the fix-up PyTorch's attention adds
                                           (fully masked rows give 0 instead of NaN)
      or P = R.where(R.isnan(P), 0, P)     torch.onnx's: every row of NaN weights (a NaN
                                           or +inf score too) gives weights of 0
    O = R.matmul(P, V)                     [B.., M, N] x [B.., N, DV]

with reshapes that only regroup the batch dimensions, and ``broadcast_to`` its own shape,
anywhere in between (``torch.export`` writes them), every intermediate used only inside
the region. ``O`` then becomes ``R.call_tir`` of a PrimFunc whose only block calls the
kernel on ``Q``, ``K``, ``V`` and the mask; the scores and weights are never stored.
Anything else (another mask form, a float mask of other values, a dropout, a reduction
over another axis, another dtype) keeps its ops, which the rest of tirbyoc handles as before
(the softmax kernel, the batched matmul family).

The kernel reads Q, K and V where the views before the region leave them and writes O
where the views after it put it (``tirbyoc.views``): the reshapes, transposes, ``take``s
and ``split``s with which ``torch.export`` cuts a packed Q/K/V projection into heads and
joins the heads again are then never copied, and a scalar factor on Q or K joins the
scale. An operand the kernel cannot read in place (no single strided view of a tensor,
or rows that are not contiguous) is passed as its own tensor, as before.

The kernel follows the graph's IEEE semantics (NaN for fully masked rows unless the
fix-up says 0, NaN where a score is NaN or V is non-finite), so the rewrite changes no
value beyond rounding: the softmax's division is applied to the output rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import _tvm as T
from . import views
from .bindings import (Bindings, is_op, rewrite_relax_functions, scalar_constant,
                       scaled_operand, shape_of, tir_dims)
from .normalize import INTRINSIC_ATTR, OFFLOADED_ATTR

R = T.relax_ns
SYMBOL = "tirbyoc_attention_f32"
INTRINSIC = "attention"
DESCRIPTION = "R.matmul -> scale -> mask -> R.nn.softmax -> R.matmul as one region"
# Mirrors tirbyoc_attention_flag and tirbyoc_b_layout (tirbyoc_kernels.h).
_DIVIDE, _MASK_KEEP, _EMPTY_ZERO, _MASK_ADD, _MASK_LOWEST, _NAN_ZERO = 1, 2, 4, 8, 16, 32
# The masking values the kernel takes: -inf, and the lowest float32 (HuggingFace's
# finfo.min), with the flag each needs.
_LOWEST = -3.4028234663852886e38
_MASK_VALUES = {-math.inf: 0, _LOWEST: _MASK_LOWEST}
_B_KN, _B_NK = 0, 1
# D + DV the kernel takes.
_DDV_MAX = 4096

_VIEWS = ("relax.reshape", "relax.broadcast_to")


def _dtype(expr) -> str | None:
    ty = getattr(expr, "ty", None)
    return ty.dtype if isinstance(ty, R.TensorType) else None


def _same(a, b) -> bool:
    return T.analyzer().can_prove_equal(a, b)


def _scalar(expr, values):
    """The float value of a scalar constant (through a variable bound to one), else None."""
    c = scalar_constant(expr, values)
    return None if c is None else float(c)


@dataclass
class _Operand:
    """Where the kernel reads (or writes) one operand: a layout inside ``layout.base``
    (see ``tirbyoc.views``), its rows ``ld`` apart and its batch items ``batch_stride``
    apart (0: one item for every batch), and for K the layout code."""
    layout: views.Layout
    ld: object
    batch_stride: object
    k_layout: int = 0


@dataclass
class _Region:
    out: object          # the variable bound to the P @ V matmul
    q: object
    k: object
    v: object
    mask: object | None
    flags: int
    scale: float
    mask_repeat: int = 1         # batch items in a row that share one mask item
    final: object = None         # the variable the kernel's call binds (out or a view of it)
    operands: dict = None        # "q", "k", "v", "o" -> _Operand


class _Func(Bindings):
    """The function's bindings, and views walked back through."""

    def through_views(self, var, uses=1):
        """Back from ``var`` through batch-regrouping views; the first non-view value's
        variable. Every view passed must be used once (``var`` itself ``uses`` times)."""
        while True:
            value = self.producer(var)
            if value is None or not is_op(value, *_VIEWS) or not _is_batch_view(value):
                return var
            if self.uses.get(var, 0) != uses:
                return var
            uses = 1
            var = value.args[0]


def _is_batch_view(call) -> bool:
    """A reshape that keeps the last two dimensions (it only regroups the batch), or a
    broadcast_to the input's own shape."""
    src, dst = shape_of(call.args[0]), shape_of(call)
    if src is None or dst is None or len(src) < 2 or len(dst) < 2:
        return False
    if call.op.name == "relax.broadcast_to":
        return len(src) == len(dst) and all(_same(a, b) for a, b in zip(src, dst))
    return _same(src[-1], dst[-1]) and _same(src[-2], dst[-2])


def _batch(shape):
    size = T.const(1, "int64")
    for dim in shape[:-2]:
        size = size * dim
    return T.analyzer().simplify(size)


def _match(f: _Func, pv_var, pv_call) -> _Region | None:
    """The region ending in ``pv_var = R.matmul(P, V)``, or None. Every variable inside
    is used only by the next step (the uses checks), so the region can be replaced."""
    if not is_op(pv_call, "relax.matmul") or len(pv_call.args) != 2:
        return None
    p_var, v = pv_call.args
    if any(_dtype(x) != "float32" for x in (pv_call, p_var, v)):
        return None
    p_var = f.through_views(p_var)
    if f.uses.get(p_var, 0) != 1:
        return None
    p_val = f.producer(p_var)
    flags = 0
    scores_fixup = None
    nan_fixed = _nan_fixup(f, p_val) if is_op(p_val, "relax.where") else None
    if nan_fixed is not None:  # where(isnan(P), 0, P)
        p_var = nan_fixed
        if f.uses.get(p_var, 0) != 2:
            return None
        p_val = f.producer(p_var)
        flags |= _NAN_ZERO  # (the kernel zeroes all -inf rows under it too)
    elif is_op(p_val, "relax.where"):  # the fix-up for fully masked rows
        scores_fixup = _fixup_scores(f, p_val)
        if scores_fixup is None:
            return None
        p_var = p_val.args[2]
        # full_like(P, 0) reads only P's shape: a use that goes with the where
        shape_only = any(is_op(f.values.get(x), "relax.full_like", "relax.zeros_like")
                         and f.values[x].args[0].same_as(p_var) for x in scores_fixup[1])
        if f.uses.get(p_var, 0) != 1 + shape_only:
            return None
        p_val = f.producer(p_var)
        flags |= _EMPTY_ZERO
    if not is_op(p_val, "relax.nn.softmax") or int(p_val.attrs.axis) not in (-1, len(
            shape_of(p_var) or []) - 1):
        return None
    s_var = p_val.args[0]
    if scores_fixup is not None:
        if not s_var.same_as(scores_fixup[0]) or f.uses.get(s_var, 0) != 2:
            return None
    elif f.uses.get(s_var, 0) != 1:
        return None
    mask, mask_repeat = None, 1
    s_var = f.through_views(s_var, 1 if scores_fixup is None else 2)
    s_val = f.producer(s_var)
    if is_op(s_val, "relax.where"):
        cond, a, b = s_val.args
        a_val, b_val = _scalar(a, f.values), _scalar(b, f.values)
        if a_val in _MASK_VALUES:
            scores, flags = b, flags | _MASK_VALUES[a_val]
        elif b_val in _MASK_VALUES:
            scores, flags = a, flags | _MASK_KEEP | _MASK_VALUES[b_val]
        else:
            return None
        if _dtype(cond) != "bool" or f.uses.get(scores, 0) != 1:
            return None
        mask_repeat = _mask_repeat(cond, s_val)
        if mask_repeat is None:
            return None
        mask = cond
        s_var = f.through_views(scores)
        s_val = f.producer(s_var)
    elif is_op(s_val, "relax.add"):
        added = _added_mask(f, s_val)
        if added is None:
            return None
        scores, mask, keep, lowest, mask_repeat = added
        if mask is not None:
            flags |= _MASK_ADD | (_MASK_KEEP if keep else 0) | lowest
        s_var = f.through_views(scores)
        s_val = f.producer(s_var)
    scale = 1.0
    if is_op(s_val, "relax.divide", "relax.multiply"):
        scaled = scaled_operand(s_val, f.values)
        if scaled is None or f.uses.get(scaled[0], 0) != 1 or _dtype(s_val) != "float32":
            return None
        x, c = scaled
        scale = c
        if s_val.op.name == "relax.divide":
            flags |= _DIVIDE
        s_var = f.through_views(x)
        s_val = f.producer(s_var)
    if not is_op(s_val, "relax.matmul") or len(s_val.args) != 2:
        return None
    q, k = s_val.args
    if any(_dtype(x) != "float32" for x in (s_val, q, k)):
        return None
    if not _shapes_fit(q, k, v, pv_call, s_val):
        return None
    region = _Region(pv_var, q, k, v, mask, flags, scale, mask_repeat)
    _place_operands(f, region)
    return region


def _collapse_batch(dims):
    """One stride for the batch dimensions ``dims`` ((extent, stride) pairs): 0 when
    they hold one item or only repeat one (a broadcast), else the innermost stride when
    the items are evenly spaced; None otherwise."""
    real = [d for d in dims if not _same(d[0], 1)]
    if all(_same(st, 0) for _, st in real):
        return T.const(0, "int64")
    for (_, outer), (extent, inner) in zip(real, real[1:]):
        if not _same(outer, extent * inner):
            return None
    return real[-1][1]


def _rows(layout, role):
    """(ld, batch stride, k layout) of a [B.., rows, cols] operand's layout (for "k":
    [B.., D, N], read as KN or NK), or None where the kernel cannot read it so."""
    dims = layout.dims
    (rows, s_rows), (cols, s_cols) = dims[-2], dims[-1]
    batch = _collapse_batch(dims[:-2])
    if batch is None:
        return None
    proven = T.analyzer().can_prove
    if _same(s_cols, 1) and proven(s_rows >= cols):
        return s_rows, batch, _B_KN
    if role == "k" and _same(s_rows, 1) and proven(s_cols >= rows):
        return s_cols, batch, _B_NK
    return None


def _place_operands(f, region):
    """Read Q, K and V, and write O, in place through the views around the region
    (``tirbyoc.views``) where the kernel can: the reshapes, transposes, takes and splits
    that torch.export writes around attention then never copy. Scalar factors on Q and
    K join the kernel's scale. Every operand falls back to its own tensor."""
    operands, factor = {}, 1.0
    for role, expr in (("q", region.q), ("k", region.k), ("v", region.v)):
        layout, c = views.trace_input(f, expr, scale_ok=role in ("q", "k"))
        placed = _rows(layout, role)
        if placed is None:
            layout, c = views.contiguous(expr), 1.0
            placed = _rows(layout, role)
        operands[role] = _Operand(layout, *placed)
        factor *= c
    final, layout = views.trace_output(f, region.out)
    placed = _rows(layout, "o")
    if placed is None or not f.same_block(final, region.out):
        final, layout = region.out, views.contiguous(region.out)
        placed = _rows(layout, "o")
    operands["o"] = _Operand(layout, *placed)
    # every size and stride in terms of the dimensions of the tensors the call passes
    known = {str(x) for e in _call_tensors(region, operands, final)
             for x in shape_of(e) if isinstance(x, T.Var)}
    exprs = [x for op in operands.values() for x in (op.ld, op.batch_stride,
                                                     op.layout.offset)]
    exprs += list(shape_of(region.q)) + list(shape_of(region.v)) + list(shape_of(region.out))
    exprs += list(shape_of(region.k))
    if any(str(v) not in known for x in exprs for v in T.free_vars(T.as_int64(x))):
        operands = {role: _Operand(views.contiguous(e), *_rows(views.contiguous(e), role))
                    for role, e in (("q", region.q), ("k", region.k), ("v", region.v),
                                    ("o", region.out))}
        final, factor = region.out, 1.0
    if factor != 1.0:
        if region.flags & _DIVIDE:
            region.scale, region.flags = factor / region.scale, region.flags & ~_DIVIDE
        else:
            region.scale *= factor
    region.final, region.operands = final, operands


def _call_tensors(region, operands, final):
    """The call's tensors: each distinct base of Q, K and V, the mask, the output."""
    out = []
    for role in ("q", "k", "v"):
        base = operands[role].layout.base
        if not any(base.same_as(x) for x in out):
            out.append(base)
    if region.mask is not None:
        out.append(region.mask)
    return out + [final]


def _nan_fixup(f: _Func, where):
    """``P`` of ``R.where(R.isnan(P), 0, P)`` (torch.onnx's decomposition of PyTorch's
    attention: rows of NaN weights become 0), the isnan used only there; else None."""
    cond, zero, p = where.args
    test = f.producer(cond) if isinstance(cond, R.Var) else None
    if not isinstance(p, R.Var) or not is_op(test, "relax.isnan") or \
            not test.args[0].same_as(p) or f.uses.get(cond, 0) != 1 or \
            _scalar(zero, f.values) != 0.0:
        return None
    return p


def _fixup_scores(f: _Func, where):
    """For ``R.where(c, zeros, P)`` with ``c = not(max(int8(not(S == -inf)), -1))``, the
    scores ``S`` and the variables of ``c``'s computation; else None."""
    cond, zero, _ = where.args
    inner = set()

    def step(var, *ops):
        value = f.producer(var)
        if value is None or not is_op(value, *ops) or f.uses.get(var, 0) != 1:
            return None
        inner.add(var)
        return value

    zero_val = f.producer(zero) if isinstance(zero, R.Var) else zero
    if is_op(zero_val, "relax.full_like", "relax.zeros_like"):
        if zero_val.op.name == "relax.full_like" and _scalar(zero_val.args[1], f.values) != 0.0:
            return None
        inner.add(zero)
    elif _scalar(zero, f.values) != 0.0:
        return None
    value = cond
    chain = ("relax.logical_not", "relax.astype", "relax.max", "relax.astype",
             "relax.logical_not", "relax.equal")
    for op in chain:
        call = step(value, op)
        if call is None:
            return None
        if op == "relax.max" and not (call.attrs.keepdims and [int(a) for a in call.attrs.axis]
                                      in ([-1], [len(shape_of(call.args[0]) or []) - 1])):
            return None
        if op == "relax.astype" and str(call.attrs.dtype) not in ("bool", "int8"):
            return None
        value = call.args[0]
    if _scalar(call.args[1], f.values) != -math.inf:
        return None
    return value, inner


def _added_mask(f: _Func, add):
    """For ``S + R.where(mask, 0, -inf)`` (either order of the sum; or -inf and 0
    swapped; or the lowest float32 for -inf): the scores ``S``, the bool mask, whether a
    true byte keeps the score, the masking value's flag, and the mask's repeat; else
    None. The sum must have the scores' shape (the mask broadcast into them, never
    widening them). The float mask may have other uses: the call reads the bool mask,
    and the float one stays for those."""
    if _dtype(add) != "float32":
        return None
    for scores, other in (add.args, add.args[::-1]):
        where = f.producer(other) if isinstance(other, R.Var) else other
        if f.uses.get(scores, 0) != 1:
            continue
        if isinstance(where, T.RelaxConstant):
            constant = _constant_mask(where)
            if constant is None:
                continue
            cond, lowest = constant
            keep = True
        elif is_op(where, "relax.where"):
            cond, a, b = where.args
            a, b = _scalar(a, f.values), _scalar(b, f.values)
            if a == 0.0 and b in _MASK_VALUES:
                keep, lowest = True, _MASK_VALUES[b]
            elif b == 0.0 and a in _MASK_VALUES:
                keep, lowest = False, _MASK_VALUES[a]
            else:
                continue
        else:
            continue
        ss = shape_of(scores)
        if ss is None or shape_of(add) is None or len(ss) != len(shape_of(add)) or \
                not all(_same(x, y) for x, y in zip(ss, shape_of(add))):
            continue
        if cond is None:  # a constant of zeros: nothing masked
            return scores, None, False, 0, 1
        if _dtype(cond) != "bool":
            continue
        repeat = _mask_repeat(cond, add)
        if repeat is None:
            continue
        return scores, cond, keep, lowest, repeat
    return None


def _constant_mask(const):
    """For a float32 constant of zeros and one masking value (the causal mask an ONNX
    exporter folds, 0 and HuggingFace's finfo.min): the bool constant true where it is
    zero (the kept scores) and the masking value's flag; ``(None, 0)`` for a constant of
    zeros only (BERT's ONNX file without a padding mask: nothing masked); else None
    (another value, a NaN, both masking values)."""
    if _dtype(const) != "float32" or len(shape_of(const) or ()) < 2:
        return None
    values = T.constant_value(const)
    kept = values == 0.0
    masked = values[~kept]
    if masked.size == 0:
        return None, 0  # all zeros: S + 0 is S for the softmax (-0.0 + 0 = 0 only)
    value = float(masked.flat[0])
    if value not in _MASK_VALUES or not bool(np.all(masked == value)):
        return None
    return R.const(kept, "bool"), _MASK_VALUES[value]


def _mask_repeat(cond, scores):
    """How many batch items in a row share one item of the bool mask ``cond`` (1: each
    its own, or one mask for all), or None where the kernel cannot read it as it is. The
    mask is [.., M or 1, N], not wider than the scores; its batch dimensions (aligned to
    the scores' from the right) equal the scores' up to some point and are 1 after it,
    so that it is broadcast over the inner ones only (HuggingFace's [B, 1, M, N] over the
    heads); those inner dimensions static."""
    ms, ss = shape_of(cond), shape_of(scores)
    if ms is None or ss is None or len(ms) < 2 or len(ms) > len(ss):
        return None
    if not _same(ms[-1], ss[-1]) or not (_same(ms[-2], ss[-2]) or _same(ms[-2], 1)):
        return None
    sb = list(ss[:-2])
    mb = [T.const(1, "int64")] * (len(sb) - len(ms[:-2])) + list(ms[:-2])
    if all(_same(d, 1) for d in mb):
        return 1
    split = 0
    while split < len(sb) and _same(mb[split], sb[split]):
        split += 1
    inner = sb[split:]
    if not all(_same(d, 1) for d in mb[split:]) or \
            not all(isinstance(d, T.IntImm) for d in inner):
        return None
    return math.prod(int(d) for d in inner)


def _shapes_fit(q, k, v, pv, qk) -> bool:
    qs, ks, vs, os_, ss = (shape_of(x) for x in (q, k, v, pv, qk))
    if any(s is None or len(s) < 2 for s in (qs, ks, vs, os_, ss)):
        return False
    m, d = qs[-2:]
    n, dv = ks[-1], vs[-1]
    if not (_same(ks[-2], d) and _same(vs[-2], n) and _same(os_[-2], m)
            and _same(os_[-1], dv) and _same(ss[-1], n)):
        return False
    if not all(isinstance(x, T.IntImm) for x in (d, dv)) or int(d) + int(dv) > _DDV_MAX:
        return False
    batch = _batch(os_)
    # every operand: the output's batch, or a batch of 1 (broadcast)
    return all(_same(_batch(s), batch) or _same(_batch(s), 1) for s in (qs, ks, vs, ss))


def _kernel_func(region: _Region):
    from .calls import status_checks

    names = {}
    tensors = _call_tensors(region, region.operands, region.final)
    bufs = []
    for i, expr in enumerate(tensors):
        dtype = "bool" if region.mask is not None and expr.same_as(region.mask) else "float32"
        bufs.append(T.decl_buffer(tir_dims(shape_of(expr), names), dtype, f"t{i}"))
    # the Relax shapes' variables as the PrimFunc's (each one a dimension of a buffer)
    tvars = {x: names[str(x)] for e in tensors for x in shape_of(e) if isinstance(x, T.Var)}

    def prim(x):
        return T.substitute(T.as_int64(x), tvars)

    def buf_of(expr):
        return next(b for b, e in zip(bufs, tensors) if e.same_as(expr))

    def operand(role, access):
        op = region.operands[role]
        ptr = T.buffer_pointer(buf_of(op.layout.base), access, prim(op.layout.offset))
        return ptr, prim(op.ld), prim(op.batch_stride)

    qs, ks, vs, os_ = (shape_of(x) for x in (region.q, region.k, region.v, region.out))
    m, d, n, dv = (prim(x) for x in (qs[-2], qs[-1], ks[-1], vs[-1]))
    batch = T.const(1, "int64")
    for x in os_[:-2]:
        batch = batch * prim(x)
    q_ptr, ldq, sq = operand("q", "r")
    k_ptr, ldk, sk = operand("k", "r")
    v_ptr, ldv, sv = operand("v", "r")
    o_ptr, ldo, so = operand("o", "w")
    args = [batch, m, n, d, dv, q_ptr, ldq, sq, k_ptr, ldk, sk,
            T.const(region.operands["k"].k_layout, "int32"), v_ptr, ldv, sv]
    if region.mask is not None:
        mk = buf_of(region.mask)
        rows = T.const(0, "int64") if T.analyzer().can_prove_equal(mk.shape[-2], 1) and \
            not T.analyzer().can_prove_equal(m, 1) else mk.shape[-1]
        one = T.const(1, "int64")
        mbatch = one
        for x in mk.shape[:-2]:
            mbatch = mbatch * x
        mstride = T.const(0, "int64") if T.analyzer().can_prove_equal(mbatch, 1) else \
            mk.shape[-2] * mk.shape[-1]
        args += [T.buffer_pointer(mk, "r"), rows, mstride,
                 T.const(region.mask_repeat, "int64")]
    else:
        args += [T.null_pointer(), T.const(0, "int64"), T.const(0, "int64"),
                 T.const(1, "int64")]
    args += [T.const(region.flags, "int32"), T.const(region.scale, "float32"), o_ptr, ldo, so]
    call = T.call_extern("int32", SYMBOL, args)
    out = bufs[-1]
    block = T.make_block("tirbyoc_attention", status_checks(SYMBOL, call),
                         reads=[T.full_region(b) for b in bufs[:-1]],
                         writes=[T.full_region(out)],
                         annotations={OFFLOADED_ATTR: SYMBOL, INTRINSIC_ATTR: INTRINSIC})
    root = T.make_block("root", T.make_realize(block), reads=[], writes=[], annotations={})
    func = T.prim_func_of(bufs, T.make_realize(root))
    return func.with_attr("tirx.noalias", True)


def _rewrite_func(func, builder, gvars):
    """``func`` with every attention region a kernel call (the region's other bindings
    left for dead-code elimination)."""
    f = _Func(func)
    regions = {}
    for var, value in f.values.items():
        region = _match(f, var, value) if is_op(value, "relax.matmul") else None
        if region is not None:
            regions[region.final] = region
    if not regions:
        return func
    blocks = []
    for block in func.body.blocks:
        bindings = []
        for binding in block.bindings:
            region = regions.get(binding.var) if isinstance(binding, R.VarBinding) else None
            if region is None:
                bindings.append(binding)
                continue
            kernel = _kernel_func(region)
            key = T.structural_hash(kernel)
            if key not in gvars:
                gvars[key] = builder.add_func(kernel, "tirbyoc_attention")
            args = _call_tensors(region, region.operands, region.final)[:-1]
            bindings.append(R.VarBinding(binding.var,
                                         R.call_tir(gvars[key], args, binding.var.ty)))
        blocks.append(R.DataflowBlock(bindings) if isinstance(block, R.DataflowBlock)
                      else R.BindingBlock(bindings))
    new = R.Function(func.params, R.SeqExpr(blocks, func.body.body), func.ret_ty,
                     func.is_pure, func.attrs)
    return R.analysis.remove_all_unused(new)


def offload_attention(mod, kernels=(), builtin=True, passes=None):  # noqa: ARG001
    """``mod`` with every attention region (see the module docstring) one call of the
    fused kernel (a new module; functions with a ``Codegen`` attribute untouched).
    ``kernels``: declared attention kernels, which are not matched yet (a library
    cannot declare one: ``Library.kernel`` refuses it); ``builtin``: whether the
    built-in kernel takes the regions (else nothing changes)."""
    if not builtin:
        return mod
    gvars = {}
    return rewrite_relax_functions(mod, lambda func, builder: _rewrite_func(func, builder,
                                                                             gvars))
