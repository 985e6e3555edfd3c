"""Fix-ups of what TVM's frontends get wrong, run before anything else.

``torch.export`` of HuggingFace models (GPT-2, Llama: the packed-sequence check of
``transformers``' masking utilities) computes ``cumsum`` over a bool tensor, which
PyTorch evaluates in int64 (sequence ids 0, 1, 2...). TVM 0.27's frontend turns it into
``R.cumsum(x)`` with ``dtype=None``, typed bool, which LLVM codegen then fails to build
(``Check failed: t.MatchesCode(kDLFloat)`` in ``CreateAdd``), TVM's own build included.
``fix_bool_cumsum`` makes it ``R.cumsum(astype(x, int64), dtype=int64)``, PyTorch's
result, and the ops after it are typed again from there (an equality of two ids stays
an equality of ids, not of truth values).

TVM's ONNX frontend turns ``Clip(x, 0, 6)`` (MobileNet's ReLU6) into two ``call_tir``s of
PrimFuncs it has already lowered, an elementwise maximum with a scalar and a minimum
with another, the scalars computed as ``where(isnan(c), -inf, c)``; the convolution
before it then cannot take the clip as its relu6 epilogue, and the clip runs as a
separate pass over the tensor. ``fix_onnx_clip`` recognizes those PrimFuncs by what
they compute and writes ``R.clip(x, lo, hi)`` back (``R.nn.relu(x)`` for a maximum
with 0 alone).

Indexing with negative indices (``x[..., [-2], :]``) becomes a ``take`` or
``index_tensor`` that reads before its tensor; ``fix_negative_indices`` counts them from
the start.

TVM's ONNX frontend emits ``Einsum`` as its own TE einsum (a call_tir no product kernel
takes); ``fix_einsum`` writes a two-operand one as permutes, reshapes and a matmul.

PyTorch's ``x.max(dim)`` arrives as ``topk(x, k=1)``, which TVM legalizes to a sort;
``fix_topk_one`` makes it a max and an argmax. TVM's ``sort``, ``argsort`` and ``topk``
compare with ``<``, so a NaN left its neighbours out of order; ``fix_nan_order`` makes
NaN the greatest value, as PyTorch and NumPy do. A float ``!=`` was false where an
operand is NaN (``x != x`` false everywhere); ``fix_nan_inequality`` makes it true.

HuggingFace Llama's RMSNorm exports as five ops; ``fuse_rms_norm`` makes them one
``R.nn.rms_norm`` (TVM's fusion would run the square as its own pass).

TVM's frontends write ``log1p``, ``expm1``, softplus, Mish, ELU and SELU with
``log(1 + y)`` and ``exp(x) - 1``, which lose every digit below float32's 6e-8 of the
1; ``fix_cancellation`` computes them without the cancellation (ZoeDepth's depth map
came out within 3.6e-3 of float64 instead of PyTorch's 4.3e-4). TOPI's group and
instance norms take the variance as a mean of squares less a squared mean, which
cancels; ``two_pass_norms`` takes it from the deviations. ``exact_floor_mod`` makes a
float remainder exact (TOPI's lost every digit ``x / y`` rounded away), and
``exact_floor_divide`` a float floor division (``3.5 // -0.7`` was -5);
``fix_crossed_clip`` gives a clip with min > max its max, as PyTorch's clamp does.
``fix_non_finite_full`` builds a tensor full of -inf (a causal mask), on which TVM's
legalization of ``full`` failed; ``fix_bool_equality`` builds ``==`` and ``!=`` of bools.
``widen_narrow_division`` divides int8 and int16 in int32 (x86's narrow division trapped
on ``-128 // -1`` and stopped the process). ``fix_empty_constants`` allocates a constant
of no elements at run time: TVM could not load such a constant back from the executable.
"""

from __future__ import annotations

import math

import numpy as np

from . import _tvm as T

R = T.relax_ns


def _is_bool(expr) -> bool:
    ty = getattr(expr, "ty", None)
    return getattr(ty, "dtype", None) == "bool"


def _int64_cumsum(call):
    """The int64 cumsum PyTorch computes for a bool cumsum, or None."""
    if not isinstance(call, R.Call) or not isinstance(call.op, T.Op) or \
            call.op.name != "relax.cumsum" or not _is_bool(call.args[0]):
        return None
    dtype = getattr(call.attrs, "dtype", None)
    if dtype is not None and str(dtype) not in ("", "bool", "void"):
        return None  # a dtype was asked for: TVM computes in it
    axis = call.attrs.axis
    return R.op.cumsum(R.op.astype(call.args[0], "int64"),
                       axis=None if axis is None else int(axis), dtype="int64",
                       exclusive=bool(getattr(call.attrs, "exclusive", False)))


@R.expr_functor.mutator
class _FixCumsum(R.PyExprMutator):
    # NOTE: a binding whose value changes type gets a new variable of the new type, and
    # every binding after it that reads it is built and typed again (ExprMutator's
    # re-emission): the graph after the cumsum works on int64 ids from there on.
    def visit_call_(self, call):
        call = super().visit_call_(call)
        fixed = _int64_cumsum(call)
        return call if fixed is None else self.builder_.normalize(fixed)


def fix_bool_cumsum(mod):
    """``mod`` with every cumsum of a bool tensor (result typed bool) computed in int64,
    as PyTorch does; the module itself when there is none."""
    found = []
    for _, func in mod.functions_items():
        if isinstance(func, R.Function):
            T.structural_walk(func, [(R.Call, lambda c: found.append(c)
                                      if _int64_cumsum(c) is not None else None)])
    if not found:
        return mod
    out = mod.clone()
    for gv, func in mod.functions_items():
        if isinstance(func, R.Function) and not (func.attrs and "Codegen" in func.attrs):
            new = _FixCumsum(mod).visit_expr(func)
            out[gv] = new
    return out


# ---- ONNX Clip ----

def _scalar(expr, values):
    """The float value of a 0-d constant, seen through variables and
    ``where(isnan(c), +-inf, c)`` of constants (the ONNX frontend's bounds); else None."""
    for _ in range(8):
        if isinstance(expr, R.Var) and expr in values:
            expr = values[expr]
            continue
        break
    if isinstance(expr, T.RelaxConstant):
        value = T.constant_value(expr)
        return float(value) if value.ndim == 0 else None
    if isinstance(expr, R.Call) and isinstance(expr.op, T.Op) and \
            expr.op.name == "relax.where":
        cond = _bool_scalar(expr.args[0], values)
        if cond is None:
            return None
        return _scalar(expr.args[1] if cond else expr.args[2], values)
    return None


def _bool_scalar(expr, values):
    """``isnan(c)`` of a 0-d constant, through variables; else None."""
    while isinstance(expr, R.Var) and expr in values:
        expr = values[expr]
    if isinstance(expr, R.Call) and isinstance(expr.op, T.Op) and \
            expr.op.name == "relax.isnan":
        value = _scalar(expr.args[0], values)
        return None if value is None else value != value
    return None


def _elementwise_with_scalar(func) -> str | None:
    """``"max"`` or ``"min"`` when PrimFunc ``func`` computes ``out[i] = max/min(a[i],
    s[()])`` (``a``, ``s``, ``out`` its buffer params, in that order), else None."""
    if not isinstance(func, T.PrimFunc):
        return None
    params = [p for p in func.params if T.is_buffer(p)]
    if len(params) != 3:
        return None
    stores = []
    T.structural_walk(func.body, [(T.BufferStore, stores.append)])
    if len(stores) != 1:
        return None
    (store,) = stores
    value = store.value
    kind = "max" if isinstance(value, T.Max) else "min" if isinstance(value, T.Min) else None
    if kind is None or not store.buffer.same_as(params[2]):
        return None
    loads = [value.a, value.b]
    for first, second in (loads, loads[::-1]):
        if isinstance(first, T.BufferLoad) and isinstance(second, T.BufferLoad) and \
                first.source.same_as(params[0]) and second.source.same_as(params[1]) and \
                len(second.indices) == 0 and len(first.indices) == len(store.indices) and \
                all(x.same_as(y) for x, y in zip(first.indices, store.indices)):
            return kind
    return None


def _clip_of(mod):
    """The replacement (for ``bindings.rewrite_calls``) of the ONNX frontend's clip in
    ``mod``: a max then a min with scalars (call_tirs of elementwise PrimFuncs) as one
    ``R.clip``, a max with 0 alone as ``R.nn.relu``."""

    def bound(call, values):
        """``(kind, x, scalar)`` of a call_tir of an elementwise max/min with a scalar."""
        if not isinstance(call, R.Call) or not call.op.same_as(T.call_tir_op()):
            return None
        gv = call.args[0]
        func = mod[gv] if isinstance(gv, T.GlobalVar) else None
        kind = _elementwise_with_scalar(func)
        args = list(call.args[1].fields) if isinstance(call.args[1], R.Tuple) else []
        if kind is None or len(args) != 2:
            return None
        value = _scalar(args[1], values)
        return None if value is None else (kind, args[0], value)

    def replacement(call, b):
        outer = bound(call, b.values)
        if outer is None:
            return None
        kind, inner_var, c = outer
        inner = b.values.get(inner_var) if isinstance(inner_var, R.Var) else None
        found = bound(inner, b.values) if inner is not None and \
            b.uses.get(inner_var, 0) == 1 else None
        if found is not None and found[0] != kind:
            lo, hi = (found[2], c) if kind == "min" else (c, found[2])
            if lo <= hi:
                return R.op.clip(found[1], lo, hi)
        if kind == "max" and c == 0.0:
            return R.op.nn.relu(inner_var)
        return None

    return replacement


def fix_onnx_clip(mod):
    """``mod`` with the ONNX frontend's clip (a max then a min with scalars, as
    call_tirs) written as ``R.clip`` (see the module docstring)."""
    from .bindings import rewrite_calls

    return rewrite_calls(mod, _clip_of(mod))


# ---- a matrix product between two reshapes (HF GPT-2's Conv1D) ----

def _dims(expr):
    from .bindings import static_dims

    return static_dims(expr)


def _unflattened(call, b):
    """For ``reshape(add(matmul(reshape(x, [P, K]), W), bias), x.shape[:-1] + [N])``
    (the add optional), ``add(matmul(x, W), bias)`` on ``x`` itself; else None."""
    from .bindings import is_op, same_dims, shape_of

    if not is_op(call, "relax.reshape"):
        return None
    inner, bias, inner_var = b.producer(call.args[0]), None, call.args[0]
    if is_op(inner, "relax.add") and b.uses.get(call.args[0]) == 1:
        # addmm's bias comes first in the add (either order is taken)
        first = is_op(b.producer(inner.args[0]), "relax.matmul")
        bias, inner_var = (inner.args[1], inner.args[0]) if first else inner.args
        inner = b.producer(inner_var)
    if not is_op(inner, "relax.matmul") or b.uses.get(inner_var) != 1:
        return None
    flat = b.producer(inner.args[0])
    if not is_op(flat, "relax.reshape") or b.uses.get(inner.args[0]) != 1:
        return None
    x, w = flat.args[0], inner.args[1]
    xs, ws, out = shape_of(x), shape_of(w), shape_of(call)
    # (symbolic dimensions too: a sequence length s gives [1, s, K] -> [s, K] -> [1, s, N])
    if xs is None or ws is None or out is None or len(xs) < 3 or len(ws) != 2 or \
            not same_dims([ws[0]], [xs[-1]]) or not same_dims(out, xs[:-1] + [ws[1]]):
        return None
    if bias is not None and (_dims(bias) is None or len(_dims(bias)) > 1):
        return None
    product = R.op.matmul(x, w, out_dtype=inner.attrs.out_dtype)
    return product if bias is None else R.op.add(product, bias)


def fix_flattened_matmul(mod):
    """``mod`` with every matrix product that a frontend wrote between two reshapes
    (HuggingFace GPT-2's ``Conv1D``: ``addmm(bias, x.view(-1, K), W).view(..., N)``)
    written on the unflattened tensor: ``matmul(x, W) + bias`` gives the same [..., N]
    result, and the elementwise ops after it (GPT-2's GELU) then follow the product
    directly, so the dense kernel takes them as its epilogue instead of leaving them to
    a separate pass over the tensor. ``mod`` itself when there is none."""
    from .bindings import rewrite_calls

    return rewrite_calls(mod, _unflattened)


# ---- a constant per-column scale after a matrix product (ConvNeXt's layer scale) ----

def _column_scaled(call, b):
    """For ``gamma * (matmul(x, W) + bias)`` (either operand order) with W, bias and
    gamma constants and gamma one factor per output column, ``matmul(x, W * gamma) +
    bias * gamma`` with the products computed now; else None."""
    import numpy as np

    from .bindings import constant_value_of, is_op

    if not is_op(call, "relax.multiply"):
        return None
    for gamma_expr, inner_var in (call.args, call.args[::-1]):
        gamma, add = constant_value_of(gamma_expr, b), b.producer(inner_var)
        if gamma is None or not is_op(add, "relax.add") or b.uses.get(inner_var) != 1:
            continue
        for bias_expr, mm_var in (add.args, add.args[::-1]):
            bias, mm = constant_value_of(bias_expr, b), b.producer(mm_var)
            if bias is None or not is_op(mm, "relax.matmul") or b.uses.get(mm_var) != 1:
                continue
            w = constant_value_of(mm.args[1], b)
            if w is None or w.ndim != 2 or w.dtype != np.float32:
                continue
            n = w.shape[1]
            if gamma.size != n or gamma.shape[-1:] != (n,) or bias.size != n or \
                    bias.shape[-1:] != (n,) or gamma.dtype != np.float32:
                continue
            g = gamma.reshape(n).astype(np.float64)
            new_w = (w.astype(np.float64) * g).astype(np.float32)
            new_b = (bias.reshape(n).astype(np.float64) * g).astype(np.float32)
            return R.op.add(R.op.matmul(mm.args[0], R.const(new_w),
                                        out_dtype=mm.attrs.out_dtype), R.const(new_b))
    return None


def fold_column_scale(mod):
    """``mod`` with every constant per-column scale of a matrix product with constant
    weight and bias (ConvNeXt's layer scale, ``gamma * Linear(x)``) folded into that
    weight and bias at compile time (in float64, rounded once, as a batch norm into a
    convolution): the product's kernel then writes the scaled result, instead of a
    second pass over its output. ``mod`` itself when there is none."""
    from .bindings import rewrite_calls

    return rewrite_calls(mod, _column_scaled)


# ---- a matrix product with a batch-broadcast operand (torch.export's bmm of a Linear) ----

def _unbroadcast(arg, b, keep_rank: bool):
    """The source of ``broadcast_to(src, shape)`` when that broadcast only repeats
    ``src`` over leading batch dimensions (``src`` of rank 2, or of the same shape when
    ``keep_rank``), else None; of rank 2 also through a reshape that only merges those
    dimensions (SAM's windowed attention: W repeated over [4, 14] and read as [56])."""
    from .bindings import is_op

    value = b.producer(arg)
    if not keep_rank and is_op(value, "relax.reshape"):
        merged, out = _dims(value.args[0]), _dims(arg)
        if merged is not None and out is not None and merged[-2:] == out[-2:]:
            return _unbroadcast(value.args[0], b, keep_rank=False)
    if not is_op(value, "relax.broadcast_to"):
        return None
    src = value.args[0]
    have, want = _dims(src), _dims(arg)
    if have is None or want is None:
        return None
    if have == want or (not keep_rank and len(have) == 2 and want[-2:] == have):
        return src
    return None


def _unbroadcast_matmul(call, b):
    """``matmul(broadcast_to(x), broadcast_to(W, [B.., K, N]))`` as ``matmul(x, W)``
    (matmul broadcasts the batch itself; the result is the same), else None."""
    from .bindings import is_op

    if not is_op(call, "relax.matmul"):
        return None
    lhs, rhs = call.args
    w = _unbroadcast(rhs, b, keep_rank=False)
    x = _unbroadcast(lhs, b, keep_rank=True)
    if w is None and x is None:
        return None
    lhs_dims, rhs_dims = _dims(x if x is not None else lhs), _dims(w if w is not None else rhs)
    if lhs_dims is None or rhs_dims is None or len(lhs_dims) < len(rhs_dims):
        return None  # the batch must still come from the left operand
    return R.op.matmul(lhs if x is None else x, rhs if w is None else w,
                       out_dtype=call.attrs.out_dtype)


def fix_broadcast_weight(mod):
    """``mod`` with every matrix product whose weight ``torch.export`` repeated over the
    batch (``bmm(x, W.expand(B, K, N))``: HuggingFace BERT's attention output at batch
    8, ``nn.TransformerEncoderLayer``'s projections) reading the 2-D weight itself:
    ``matmul([B, M, K], [K, N])`` is the same product, the dense kernel takes it with B
    folded into M and the weight packed once, and no [B, K, N] copy is made per call or
    folded into a constant B times the weight's size. ``mod`` itself when there is
    none."""
    from .bindings import rewrite_calls

    return rewrite_calls(mod, _unbroadcast_matmul)


# ---- indexing: indices that count from the end ----

# ops through which an index stays what it was elementwise (or a choice of its elements)
_INDEX_VIEWS = ("relax.expand_dims", "relax.reshape", "relax.broadcast_to", "relax.squeeze",
                "relax.permute_dims", "relax.strided_slice", "relax.flatten")


def _int_value(expr):
    """The int of an IntImm, or of a PrimValue holding one; else None."""
    value = getattr(expr, "value", None)
    value = value if isinstance(value, int) else getattr(value, "value", None)
    return value if isinstance(value, int) else None


def _non_negative(expr, b, depth=0) -> bool:
    """Whether an integer index tensor is provably >= 0 everywhere: a constant, an arange
    from a non-negative start by a positive step, sums and products of such, and views of
    them (HuggingFace's mask positions); False when not known."""
    from .bindings import constant_value_of, is_op

    if depth > 16:
        return False
    value = constant_value_of(expr, b)
    if value is not None:
        return value.dtype.kind in "iub" and bool((value >= 0).all())
    call = b.producer(expr)
    if is_op(call, "relax.arange"):
        start, _, step = (_int_value(a) for a in call.args)
        return isinstance(start, int) and isinstance(step, int) and start >= 0 and step > 0
    if is_op(call, "relax.add", "relax.multiply"):
        return all(_non_negative(a, b, depth + 1) for a in call.args)
    if is_op(call, "relax.where") and _counted_from_start(call, b):
        return True  # (this fix-up's own: applying it again changes nothing)
    if is_op(call, *_INDEX_VIEWS):
        return _non_negative(call.args[0], b, depth + 1)
    return False


def _counted_from_start(call, b) -> bool:
    """Whether ``call`` is ``where(i < 0, i + c, i)``, as ``_index_from_start`` writes it."""
    from .bindings import constant_value_of, is_op

    cond, then, other = call.args
    cond, then = (e if b.producer(e) is None else b.producer(e) for e in (cond, then))
    return is_op(cond, "relax.less") and is_op(then, "relax.add") and \
        cond.args[0].same_as(other) and then.args[0].same_as(other) and \
        constant_value_of(cond.args[1], b) is not None and \
        constant_value_of(then.args[1], b) is not None


def _index_from_start(index, extent, b):
    """``index`` (into an axis of ``extent``) counted from the start as PyTorch reads it:
    None when it already is (or is not an integer tensor), "wrap" when only a run-time
    modulo can say (a symbolic extent), else the expression. Raises for a constant index
    out of range."""
    import numpy as np

    from .bindings import constant_value_of

    value = constant_value_of(index, b)
    if value is not None:
        if value.dtype.kind != "i" or not (value < 0).any():
            return None
        if not isinstance(extent, T.IntImm):
            return "wrap"
        n = int(extent)
        if (value < -n).any() or (value >= n).any():
            raise ValueError(f"constant index {value.ravel().tolist()[:8]} out of range for "
                             f"an axis of extent {n}")
        return R.const(np.where(value < 0, value + n, value).astype(value.dtype))
    dtype = getattr(getattr(index, "ty", None), "dtype", "")
    if not str(dtype).startswith("int") or _non_negative(index, b):
        return None
    if not isinstance(extent, T.IntImm):
        return "wrap"
    return R.op.where(R.op.less(index, R.const(0, dtype)),
                      R.op.add(index, R.const(int(extent), dtype)), index)


def _indexed_from_start(call, b):
    """``take`` or ``index_tensor`` with its indices counted from the start; None when
    they are already (or cannot be told apart: a tuple of indices not written out)."""
    from .bindings import is_op, shape_of

    if is_op(call, "relax.take") and call.attrs.mode == "fast":
        dims, axis = shape_of(call.args[0]), call.attrs.axis
        if dims is None or (axis is None and len(dims) != 1):
            return None  # (no axis: the flattened tensor's, not PyTorch's indexing)
        axis = 0 if axis is None else int(axis) % len(dims)
        try:
            fixed = _index_from_start(call.args[1], dims[axis], b)
        except ValueError as exc:
            raise ValueError(f"take (PyTorch indexing) along axis {axis}: {exc}") from None
        if fixed is None:
            return None
        if isinstance(fixed, str):
            return R.op.take(call.args[0], call.args[1], axis=axis, mode=fixed)
        return R.op.take(call.args[0], fixed, axis=axis, mode="fast")
    if is_op(call, "relax.index_tensor") and isinstance(call.args[1], R.Tuple):
        dims, indices = shape_of(call.args[0]), list(call.args[1].fields)
        if dims is None:
            return None
        changed = False
        for i, index in enumerate(indices):
            try:
                fixed = _index_from_start(index, dims[i], b)
            except ValueError as exc:
                raise ValueError(f"index_tensor (PyTorch indexing) on axis {i}: {exc}") \
                    from None
            if fixed is not None and not isinstance(fixed, str):
                # NOTE: a symbolic extent ("wrap") has no such mode here: left as it is
                indices[i], changed = fixed, True
        return R.op.index_tensor(call.args[0], R.Tuple(indices)) if changed else None
    return None


def fix_negative_indices(mod):
    """``mod`` with the indices of every ``take`` and ``index_tensor`` counted from the
    start as PyTorch counts them: a negative index counts from the end. TVM 0.27's PyTorch
    frontend passes them as they are and its take (``mode="fast"``) and index_tensor read
    before the tensor: garbage, NaN, a different answer each run (HuggingFace Falcon's
    multi-query key and value are ``x[..., [-2], :]`` and ``x[..., [-1], :]``). Constant
    indices are counted from the start at compile time (one out of range is an error
    naming the op); others get ``where(i < 0, i + extent, i)`` unless provably
    non-negative (an arange and its views: HuggingFace's mask positions), or for a
    ``take`` along a symbolic extent the modulo (``mode="wrap"``). ``mod`` itself when
    nothing changes."""
    from .bindings import rewrite_calls

    return rewrite_calls(mod, _indexed_from_start)


# ---- strided_slice: negative axes, bounds known to be inside ----

def _from_start(v, dim, an):
    """Slice bound ``v`` of a dimension of size ``dim`` as TVM reads it, counted from the
    start: a negative constant counts from the end, a bound past the end (``x[1:]`` is
    exported with INT64_MAX) is the end; simplified with what ``an`` knows."""
    if isinstance(v, T.IntImm) and v.value < 0 and an.can_prove(dim + v.value >= 0):
        return an.simplify(dim + v.value)
    if an.can_prove(v >= dim):
        return an.simplify(dim)
    return an.simplify(v)


def _inside_bounds(dims, axes, begin, end, strides, an):
    """``(begin, end)`` counted from the start, where every slice is then provably
    [begin, end) with 0 <= begin <= end <= its dimension and stride 1 (``an``: what is
    known of the symbolic dimensions); else None."""
    if dims is None or (strides is not None and any(
            getattr(v, "value", None) != 1 for v in strides.fields)):
        return None
    if not all(str(getattr(e, "ty", "")).startswith("int")
               for e in list(begin.fields) + list(end.fields)):
        return None  # (bounds given as tensors, or not integers)
    begin = [_from_start(v, dims[a], an) for a, v in zip(axes, begin.fields)]
    end = [_from_start(v, dims[a], an) for a, v in zip(axes, end.fields)]
    if all(an.can_prove(0 <= b) and an.can_prove(b <= e) and an.can_prove(e <= dims[a])
           for a, b, e in zip(axes, begin, end)):
        return begin, end
    return None


def _slice_fixed(call, b):
    """``strided_slice`` with each negative axis written as its count from the first
    dimension, and where its bounds are provably inside (every symbolic dimension within
    the function's declared bounds) those bounds counted from the start and
    ``assume_inbound``; None when neither changes anything (or its input's
    rank is unknown)."""
    from .bindings import is_op, shape_of

    if not is_op(call, "relax.strided_slice"):
        return None
    x, axes, begin, end, *rest = call.args
    strides = rest[0] if rest else None
    ndim = getattr(getattr(x, "ty", None), "ndim", -1)
    values = [getattr(a, "value", None) for a in axes.fields]
    if ndim is None or ndim < 1 or any(not isinstance(v, int) or not -ndim <= v < ndim
                                       for v in values):
        return None
    axes_from_zero = [v % ndim for v in values]
    inbound = bool(call.attrs.assume_inbound)
    if not inbound:
        found = _inside_bounds(shape_of(x), axes_from_zero, begin, end, strides,
                               _dims_analyzer(b.func))
        if found is not None:
            (begin, end), inbound = found, True
    if axes_from_zero == values and inbound == bool(call.attrs.assume_inbound):
        return None
    return R.op.strided_slice(x, axes_from_zero, begin, end, strides, assume_inbound=inbound)


def fix_strided_slices(mod):
    """``mod`` with its ``strided_slice`` calls in the forms TVM 0.27 legalizes at a
    symbolic (dynamic) sequence length, as HuggingFace's masking utilities write them
    through ``torch.export``: ``x[:, -n:]`` keeps ``dim=-1``, and
    ``topi.dynamic_strided_slice`` takes that axis as given and fails (``axis <
    src_tensor_dim (-1 vs. 2)``); a slice whose bounds are symbolic is typed with
    ``if_then_else`` clamps (for bounds that could be negative or past the end), which
    ``FuseOps`` then cannot type (``Cannot find the FInferType attribute registered to
    op: prim.if_then_else``), or on which TVM's pattern rewriting recurses until the
    process overflows its stack. Axes are counted from zero, and a slice whose bounds are
    provably inside its dimension (every symbolic dimension within the bounds the
    function declares; a negative bound counts from the end, one past the end is the
    end) gets those bounds counted from the start and ``assume_inbound``,
    which types it as ``end - begin``. ``mod`` itself when nothing
    changes."""
    from .bindings import rewrite_calls

    return rewrite_calls(mod, _slice_fixed)


# ---- shapes TVM cannot simplify without the bounds of the dimensions ----

def _dims_analyzer(func):
    """An analyzer that knows every symbolic dimension of ``func`` to be within the
    bounds the function declares (``tir_var_lower_bound`` and ``tir_var_upper_bound``:
    ``torch.export``'s ``Dim(min=, max=)``, which TVM's frontend records; 2 to 512 for
    ``examples.import_torch``), and at least 0 where it declares none. (Not 1: a
    dimension of size 0 would then meet a slice marked in bounds that is not.)"""
    import tvm.sym

    def bounds(key):
        found = func.attrs.get(key) if func.attrs is not None else None
        return {str(k): int(v) for k, v in found.items()} if found is not None else {}

    lower, upper = bounds("tir_var_lower_bound"), bounds("tir_var_upper_bound")
    an = T.analyzer()
    for var in R.analysis.defined_symbolic_vars(func):
        an.update(var, tvm.sym.ConstIntBound(max(0, lower.get(var.name, 0)), upper.get(
            var.name, tvm.sym.ConstIntBound.POS_INF)), True)
    return an


@R.expr_functor.mutator
class _TightenShapes(R.PyExprMutator):
    # NOTE: only dataflow variables are re-bound (to the match_cast's variable): a
    # function's outputs keep the variables they are.
    def __init__(self, mod, an):
        super().__init__(mod)
        self.an = an

    def visit_var_binding_(self, binding):
        from .bindings import is_op, shape_of

        value = self.builder_.normalize(self.visit_expr(binding.value))
        if is_op(value, "relax.reshape") and isinstance(value.args[1], R.ShapeExpr):
            # a view to a shape written with such bounds: to the simpler shape itself
            target = _tightened(list(value.args[1].values), self.an)
            if target is not None:
                value = self.builder_.normalize(R.op.reshape(value.args[0],
                                                             R.ShapeExpr(target)))
        dims = shape_of(value)
        tight = None if dims is None else _tightened(dims, self.an)
        if tight is None or not isinstance(binding.var, R.DataflowVar):
            new = (self.builder_.emit if isinstance(binding.var, R.DataflowVar)
                   else self.builder_.emit_output)(value, binding.var.name)
        else:
            new = self.builder_.match_cast(self.builder_.emit(value),
                                           R.TensorType(tight, value.ty.dtype),
                                           binding.var.name)
        self.set_var_remap(binding.var, new)


def _tightened(dims, an):
    """``dims`` simplified by ``an``, or None where the bounds it knows simplify none of
    them further than a plain simplification does."""
    plain = T.analyzer()
    tight = [an.simplify(d) for d in dims]
    if all(T.structural_equal(a, plain.simplify(d)) for a, d in zip(tight, dims)):
        return None
    return tight


def _loose(func, an) -> bool:
    from .bindings import shape_of

    found = []

    def check(binding):
        dims = shape_of(binding.var)
        if dims is not None and _tightened(dims, an) is not None:
            found.append(binding)

    T.structural_walk(func, [(R.VarBinding, check)])
    return bool(found)


def tighten_symbolic_shapes(mod):
    """``mod`` with each tensor whose symbolic shape simplifies once its dimensions are
    known to be within the bounds the function declares (``min(1, s)`` is 1 where
    ``s >= 2``, ``min(s, 512)`` is ``s`` where ``s <= 512``) cast to the simpler shape (a
    ``match_cast``, checked when it runs). ``torch.export`` of HuggingFace's masks at a
    dynamic sequence length slices ``[1 + s]`` positions into ``[min(s, min(1, s) + s)]``
    and ``[max(min(1, s) + s - 1, 0)]``: both are ``[s]``, but TVM cannot show it, types
    their difference with an unknown shape, and then cannot legalize it (``emit_te now
    only supports Tensor that has ShapeExpr shape``). ``mod`` itself when nothing
    simplifies."""
    out = None
    for gv, func in mod.functions_items():
        if not isinstance(func, R.Function) or (func.attrs and "Codegen" in func.attrs):
            continue
        an = _dims_analyzer(func)
        if not R.analysis.defined_symbolic_vars(func) or not _loose(func, an):
            continue
        out = out or mod.clone()
        out[gv] = _TightenShapes(mod, an).visit_expr(func)
    return out or mod


# ---- RMSNorm written out ----

def _rms_norm(call, b):
    """``R.nn.rms_norm(x, w, axes=[-1], epsilon=eps)`` for ``w * (x * rsqrt(mean(x ** 2,
    axis=-1, keepdims) + eps))`` (either operand order of each product; ``x * x`` for the
    square), float32, ``w`` of ``x``'s last dimension, every intermediate read by the next
    step only; else None."""
    from .bindings import is_op, scalar_constant, shape_of

    if not is_op(call, "relax.multiply"):
        return None

    def only(var, op):
        value = b.producer(var)
        return value if is_op(value, op) and b.uses.get(var) == 1 else None

    for w, normed in (call.args, call.args[::-1]):
        scaled = only(normed, "relax.multiply")
        if scaled is None:
            continue
        for x, inv in (scaled.args, scaled.args[::-1]):
            root = only(inv, "relax.rsqrt")
            add = None if root is None else only(root.args[0], "relax.add")
            if add is None:
                continue
            for m, eps in (add.args, add.args[::-1]):
                mean = only(m, "relax.mean")
                eps = scalar_constant(eps, b.values, "f")
                if mean is None or eps is None or not bool(mean.attrs.keepdims) or \
                        mean.attrs.axis is None or len(mean.attrs.axis) != 1:
                    continue
                xs = shape_of(x)
                if xs is None or int(mean.attrs.axis[0]) not in (-1, len(xs) - 1):
                    continue
                square = only(mean.args[0], "relax.power")
                if square is not None:
                    if not square.args[0].same_as(x) or \
                            scalar_constant(square.args[1], b.values, "f") != 2.0:
                        continue
                else:
                    square = only(mean.args[0], "relax.multiply")
                    if square is None or not all(a.same_as(x) for a in square.args):
                        continue
                ws = shape_of(w)
                if getattr(x.ty, "dtype", None) != "float32" or \
                        getattr(w.ty, "dtype", None) != "float32" or ws is None or \
                        len(ws) != 1 or not T.analyzer().can_prove_equal(ws[0], xs[-1]):
                    continue
                return R.op.nn.rms_norm(x, w, axes=[-1], epsilon=eps)
    return None


def fuse_rms_norm(mod):
    """``mod`` with every RMSNorm written out (HuggingFace Llama's ``LlamaRMSNorm``
    after ``torch.export``: a power, a mean, an add, a rsqrt and two products) as one
    ``R.nn.rms_norm``: TVM's fusion keeps a reduction apart from the elementwise op that
    feeds it, so the square ran as its own pass over the activations (Llama: 0.31 of
    the norms' 0.74 ms a run); one op is one PrimFunc, a row reduction with its
    epilogue. ``mod`` itself when there is none."""
    from .bindings import rewrite_calls

    return rewrite_calls(mod, _rms_norm)


# ---- ONNX Einsum: its frontend's TE einsum as matrix products ----

def _among(vs, v) -> bool:
    """Whether TIR variable ``v`` is one of ``vs``."""
    return any(v.same_as(u) for u in vs)


def _position(vs, v) -> int:
    return next(i for i, u in enumerate(vs) if u.same_as(v))


def _einsum_of(func):
    """``(a_vars, b_vars, out_vars)`` when PrimFunc ``func`` is ``topi.einsum``'s of two
    operands (its block "T_einsum": other PrimFuncs, a legalized matmul among them, are
    left to the matchers that know them): one sum of products ``out[o...] += a[i...] *
    b[j...]`` from zero, each index one block iterator, every summed iterator in both
    operands, every output iterator in one or both and none repeated within a tensor;
    else None."""
    if not isinstance(func, T.PrimFunc):
        return None
    params = [p for p in func.params if T.is_buffer(p)]
    blocks = []
    T.structural_walk(func.body, [(T.SBlock, blocks.append)])
    blocks = [blk for blk in blocks if blk.name_hint != "root"]
    if len(params) != 3 or len(blocks) != 1 or blocks[0].name_hint != "T_einsum":
        return None
    (blk,) = blocks
    store = blk.body
    init = blk.init
    if not isinstance(store, T.BufferStore) or not isinstance(init, T.BufferStore) or \
            not store.buffer.same_as(params[2]) or not isinstance(init.value, T.FloatImm) or \
            float(init.value.value) != 0.0:
        return None
    value = store.value
    if not isinstance(value, T.Add) or not isinstance(value.b, T.Mul):
        return None
    acc, prod = value.a, value.b
    if not isinstance(acc, T.BufferLoad) or not acc.source.same_as(params[2]):
        return None
    loads = [prod.a, prod.b]
    if not all(isinstance(x, T.BufferLoad) for x in loads):
        return None
    if not (loads[0].source.same_as(params[0]) and loads[1].source.same_as(params[1])):
        loads = loads[::-1]
        if not (loads[0].source.same_as(params[0]) and loads[1].source.same_as(params[1])):
            return None
    kinds = {iv.var: iv.iter_type for iv in blk.iter_vars}

    def plain(indices):
        out = []
        for i in indices:
            if not isinstance(i, T.Var) or i not in kinds or _among(out, i):
                return None
            out.append(i)
        return out

    a, b, o = plain(loads[0].indices), plain(loads[1].indices), plain(store.indices)
    if a is None or b is None or o is None or \
            any(not x.same_as(y) for x, y in zip(acc.indices, store.indices)):
        return None

    for v, kind in kinds.items():
        if kind == T.COMM_REDUCE and not (_among(a, v) and _among(b, v) and not _among(o, v)):
            return None
        if kind == T.DATA_PAR and not (_among(o, v) and (_among(a, v) or _among(b, v))):
            return None
        if kind not in (T.COMM_REDUCE, T.DATA_PAR):
            return None
    return a, b, o


def _einsum_call(mod):
    """The replacement (for ``bindings.rewrite_calls``) of a call_tir of a two-operand
    einsum PrimFunc (``_einsum_of``) with static shapes: both operands permuted to
    [batch, rows, summed] and [batch, summed, columns], reshaped to three dimensions (two
    without a batch), one ``R.matmul``, reshaped and permuted to the output's order. A
    constant operand is permuted at compile time."""

    def replacement(call, b):
        if not isinstance(call, R.Call) or not call.op.same_as(T.call_tir_op()):
            return None
        gv = call.args[0]
        found = _einsum_of(mod[gv]) if isinstance(gv, T.GlobalVar) else None
        args = list(call.args[1].fields) if isinstance(call.args[1], R.Tuple) else []
        if found is None or len(args) != 2:
            return None
        av, bv, ov = found
        x, y = args
        xs, ys, os_ = _dims(x), _dims(y), _dims(call)
        if xs is None or ys is None or os_ is None or str(getattr(call.ty, "dtype", "")) != \
                "float32":
            return None

        batch = [v for v in ov if _among(av, v) and _among(bv, v)]
        rows = [v for v in ov if _among(av, v) and not _among(bv, v)]
        cols = [v for v in ov if _among(bv, v) and not _among(av, v)]
        summed = [v for v in av if not _among(ov, v)]

        def size(v):
            vs, shape = (av, xs) if _among(av, v) else (bv, ys)
            return shape[_position(vs, v)]

        def prod(vs):
            return int(np.prod([size(v) for v in vs], dtype=np.int64))

        lead = [prod(batch)] if batch else []

        def operand(expr, vs, order, shape):
            perm = [_position(vs, v) for v in order]
            value = T.constant_value(expr) if isinstance(expr, T.RelaxConstant) else None
            if value is not None:
                return R.const(np.ascontiguousarray(value.transpose(perm)).reshape(shape))
            if perm != list(range(len(perm))):
                expr = R.op.permute_dims(expr, perm)
            return R.op.reshape(expr, shape)

        lhs = operand(x, av, batch + rows + summed, lead + [prod(rows), prod(summed)])
        rhs = operand(y, bv, batch + summed + cols, lead + [prod(summed), prod(cols)])
        out = R.op.reshape(R.op.matmul(lhs, rhs), [size(v) for v in batch + rows + cols])
        perm = [_position(batch + rows + cols, v) for v in ov]
        return out if perm == list(range(len(perm))) else R.op.permute_dims(out, perm)

    return replacement


def fix_einsum(mod):
    """``mod`` with every two-operand einsum the ONNX frontend emitted (a call_tir of
    ``topi.einsum``'s PrimFunc, which stays TVM's: XLNet's attention and projections,
    0.05x ONNX Runtime) written as permutes, reshapes and one ``R.matmul``
    (``_einsum_call``), which the product kernels then take. ``mod`` itself when there
    is none."""
    from .bindings import rewrite_calls

    return rewrite_calls(mod, _einsum_call(mod))


# ---- topk of one: a max (PyTorch's max(dim) and min(dim)) ----

def extreme_with_index(x, axis: int, largest: bool, keepdims: bool, nan_wins=True):
    """(values, int64 indices) of PyTorch's ``x.max(axis)`` (``x.min(axis)``) as Relax
    expressions: the first index of the extreme; with ``nan_wins`` a row with a NaN
    gives NaN and the first NaN's index, as ``max(dim)`` and ``min(dim)`` do (a max or
    min alone skips NaN: its compare-selects keep the other operand). ``topk`` of the
    smallest takes NaN for the largest value, so there NaN does not win."""
    values = (R.op.max if largest else R.op.min)(x, axis=axis, keepdims=keepdims)
    indices = (R.op.argmax if largest else R.op.argmin)(x, axis=axis, keepdims=keepdims)
    if nan_wins:
        values, first_nan = nan_propagating(x, values, axis, keepdims)
        if first_nan is not None:
            indices = first_nan(indices)
    return values, indices


def nan_propagating(x, values, axis, keepdims):
    """``(values', first_nan)``: ``values`` (a max or min of ``x`` over ``axis``, which
    skips NaN) NaN where the reduced elements hold one, as PyTorch's reductions give,
    and ``first_nan(indices)``, indices that point at the first NaN there; ``(values,
    None)`` for a tensor that holds no NaN (not a float)."""
    if not _is_float_tensor(x):
        return values, None
    dtype = str(x.ty.dtype)
    nan = R.op.astype(R.op.isnan(x), "int8")
    has_nan = R.op.greater(R.op.max(nan, axis=axis, keepdims=keepdims), R.const(0, "int8"))
    return (R.op.where(has_nan, R.const(float("nan"), dtype), values),
            lambda indices: R.op.where(has_nan, R.op.argmax(nan, axis=axis,
                                                            keepdims=keepdims), indices))


def _topk_one(call, b):  # noqa: ARG001 (rewrite_calls' signature)
    """``topk(x, k=1, axis)`` as ``max``/``argmax`` (``min``/``argmin`` for the smallest)
    over the axis, kept as an axis of 1 (topk's shape), in topk's return form; None for
    any other call."""
    from .bindings import is_op

    if not is_op(call, "relax.topk") or int(call.attrs.k) != 1:
        return None
    x, a = call.args[0], call.attrs
    values, indices = extreme_with_index(x, int(a.axis), bool(a.largest), keepdims=True,
                                         nan_wins=bool(a.largest))
    if str(a.dtype) != "int64":
        indices = R.op.astype(indices, str(a.dtype))
    kind = str(a.ret_type)
    return values if kind == "values" else indices if kind == "indices" else \
        R.Tuple([values, indices])


def fix_topk_one(mod):
    """``mod`` with every ``topk`` of one element a max (or min) and its argmax (argmin):
    TVM's frontend writes PyTorch's ``x.max(dim)`` as ``topk(x, k=1)``, which TVM
    legalizes to a sort; Hiera's four mask-unit max-pools took 29 ms of a 61 ms run so.
    Ties give the first index and a NaN wins, as in PyTorch's ``max(dim)``
    (``extreme_with_index``). ``mod`` itself when there is none."""
    from .bindings import rewrite_calls

    return rewrite_calls(mod, _topk_one)


# ---- sort, argsort and topk with NaN: NaN the greatest, as in PyTorch and NumPy ----

# An offset past any position along an axis (int64): the second sort's key for a NaN.
_PAST_ANY_POSITION = 1 << 40


def _nan_order(x, axis: int, descending: bool):
    """int64 indices that sort ``x`` along ``axis`` with NaN greater than +inf (first
    when descending), every other element in order: a sort of ``x`` with NaN made +inf,
    then a second sort that moves the NaN behind (ahead of) the +inf among the tied, by
    a key distinct for every position (NaN: its position plus ``_PAST_ANY_POSITION``;
    descending: the others'), so that no tie is left to either sort's order."""
    nan = R.op.isnan(x)
    first = R.op.argsort(R.op.where(nan, R.const(float("inf"), str(x.ty.dtype)), x),
                         axis=axis, descending=descending, dtype="int64")
    moved = R.op.isnan(R.op.gather_elements(x, first, axis=axis))
    position = R.op.subtract(
        R.op.cumsum(R.op.ones_like(first), axis=axis, dtype="int64"), R.const(1, "int64"))
    past = R.op.add(position, R.const(_PAST_ANY_POSITION, "int64"))
    key = R.op.where(moved, position, past) if descending else \
        R.op.where(moved, past, position)
    return R.op.gather_elements(first, R.op.argsort(key, axis=axis, dtype="int64"),
                                axis=axis)


def _nan_ordered(call, b):  # noqa: ARG001 (rewrite_calls' signature)
    """``sort``, ``argsort`` or ``topk`` of a float tensor through ``_nan_order``, in the
    call's return form; None for any other call. (TVM's sort compares with ``<``, false
    for NaN either way, so a NaN left the elements around it out of order: ``sort([3,
    nan, 1, inf, -2, nan, 0.5, -inf])`` gave ``[-inf, -2, 1, 3, nan, inf, nan, 0.5]``.)"""
    from .bindings import is_op

    kind = next((k for k in ("sort", "argsort", "topk") if is_op(call, f"relax.{k}")), None)
    if kind is None:
        return None
    x, a = call.args[0], call.attrs
    if not _is_float_tensor(x):
        return None
    axis = int(a.axis)
    if kind == "topk":
        order = R.op.strided_slice(_nan_order(x, axis, descending=bool(a.largest)),
                                   axes=[axis], begin=[0], end=[int(a.k)])
    else:
        order = _nan_order(x, axis, descending=bool(a.descending))
    values = R.op.gather_elements(x, order, axis=axis)
    if kind == "sort":
        return values
    index_dtype = str(a.dtype)
    indices = order if index_dtype == "int64" else R.op.astype(order, index_dtype)
    if kind == "argsort":
        return indices
    ret = str(a.ret_type)
    return values if ret == "values" else indices if ret == "indices" else \
        R.Tuple([values, indices])


def fix_nan_order(mod):
    """``mod`` with every ``sort``, ``argsort`` and ``topk`` (of more than one element:
    ``fix_topk_one`` takes those) of a float tensor ordering NaN as the greatest value,
    as PyTorch, NumPy and ONNX's reference do (``_nan_ordered``). ``mod`` itself when
    there is none."""
    from .bindings import rewrite_calls

    return rewrite_calls(mod, _nan_ordered)


# ---- log(1 + y) and exp(x) - 1 without cancellation ----

# |x| up to which exp(x) - 1 is summed as its series (terms to x^9 / 9!: the next is
# within 5.4e-10 of x), and the range of y over which log(1 + y) is the series of
# 2 atanh(s), s = y / (2 + y), |s| <= 1/3 (odd terms to s^15: the next within 1.4e-9).
_EXPM1_SERIES = 0.5
_LOG1P_SERIES = (-0.5, 1.0)
# SELU's constants (Klambauer et al., 2017), as PyTorch and ONNX define them.
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


def _fconst(v, dtype="float32"):
    return R.const(v, dtype)


def log1p(y):
    """``log(1 + y)`` of a float32 expression, to a few float32 roundings for every y
    (not only where ``1 + y`` is exact): near 0 as ``2 atanh(y / (2 + y))``'s series,
    which subtracts nothing, elsewhere ``log(1 + y)``, which is as exact there. NaN, -1
    and +inf give NaN, -inf and +inf."""
    s = R.op.divide(y, R.op.add(_fconst(2.0), y))
    s2 = R.op.multiply(s, s)
    poly = _fconst(1.0 / 15)
    for odd in (13, 11, 9, 7, 5, 3, 1):
        poly = R.op.add(_fconst(1.0 / odd), R.op.multiply(s2, poly))
    series = R.op.multiply(R.op.multiply(_fconst(2.0), s), poly)
    lo, hi = _LOG1P_SERIES
    near = R.op.logical_and(R.op.greater_equal(y, _fconst(lo)), R.op.less_equal(y, _fconst(hi)))
    return R.op.where(near, series, R.op.log(R.op.add(_fconst(1.0), y)))


def expm1(x, dtype="float32"):
    """``exp(x) - 1`` of an expression of float ``dtype``, to a few roundings for every x:
    for |x| <= 0.5 as its series, which subtracts nothing where the result is small;
    elsewhere ``exp(x) - 1``, which cancels at most a factor 2.6 there."""
    poly = _fconst(1.0 / 362880, dtype)
    for n in (40320, 5040, 720, 120, 24, 6, 2, 1):
        poly = R.op.add(_fconst(1.0 / n, dtype), R.op.multiply(x, poly))
    series = R.op.multiply(x, poly)
    near = R.op.less_equal(R.op.abs(x), _fconst(_EXPM1_SERIES, dtype))
    return R.op.where(near, series, R.op.subtract(R.op.exp(x), _fconst(1.0, dtype)))


def _is_float_tensor(expr) -> bool:
    return str(getattr(getattr(expr, "ty", None), "dtype", "")).startswith(("float", "bfloat"))


def _float32(expr) -> bool:
    return getattr(getattr(expr, "ty", None), "dtype", None) == "float32"


def _cancelling(call, b):
    """``log1p(y)`` for ``log(1 + y)``, ``expm1(x)`` for ``exp(x) - 1``, ``-expm1(x)``
    for ``1 - exp(x)`` (float32, 1 a scalar constant), ``R.nn.selu`` with ``expm1`` and
    ``atanh`` with ``log1p``; else None."""
    from .bindings import is_op, scalar_constant

    def one(expr):
        return scalar_constant(expr, b.values, "f") == 1.0

    if is_op(call, "relax.log") and _float32(call):
        inner = b.producer(call.args[0])
        if is_op(inner, "relax.add"):
            for c, y in (inner.args, inner.args[::-1]):
                if one(c) and _float32(y):
                    return log1p(y)
    if is_op(call, "relax.atanh") and _float32(call):  # (TOPI's: log((1 + x) / (1 - x)))
        x = call.args[0]
        return R.op.multiply(_fconst(0.5), R.op.subtract(log1p(x), log1p(R.op.negative(x))))
    if is_op(call, "relax.nn.selu") and _float32(call):  # (TOPI's cancels as the rest)
        x = call.args[0]
        return R.op.multiply(_fconst(SELU_SCALE), R.op.where(
            R.op.greater(x, _fconst(0.0)), x, R.op.multiply(_fconst(SELU_ALPHA), expm1(x))))
    if is_op(call, "relax.subtract") and _float32(call):
        a, c = call.args
        for e, k, sign in ((a, c, 1), (c, a, -1)):
            exp = b.producer(e)
            if one(k) and is_op(exp, "relax.exp"):
                m1 = expm1(exp.args[0])
                return m1 if sign > 0 else R.op.negative(m1)
    return None


def fix_cancellation(mod):
    """``mod`` with ``log(1 + y)`` and ``exp(x) - 1`` (and ``1 - exp(x)``) computed
    without the cancellation of the 1: TVM's frontends write PyTorch's ``log1p``,
    ``expm1``, ``softplus`` and ``elu`` and ONNX's ``Softplus``, ``Mish``, ``Elu`` and
    ``Selu`` so, and lose every digit of y below 6e-8 (``log1p(1e-8)`` is 0; a softplus
    of -10 had the relative error 2e-3, which ZoeDepth's temperature-scaled softmax
    amplified to 9e-3 of its output). TVM's simplifier rewrites ``(1 + y) - 1`` to ``y``
    in float arithmetic, so the usual correction term cannot be written: see ``log1p``
    and ``expm1``. ``mod`` itself when there is none."""
    from .bindings import rewrite_calls

    return rewrite_calls(mod, _cancelling)


# ---- the floored remainder of floats, exactly ----

def _other_side(rest, y, dtype="float32"):
    """Where a truncated remainder ``rest`` is not 0 and its sign is not the divisor
    ``y``'s: there the floored quotient is one less, the floored remainder ``rest + y``."""
    zero = _fconst(0.0, dtype)
    # (a bool != compiled as a float compare of i1 vectors, which LLVM rejects: xor)
    return R.op.logical_and(R.op.not_equal(rest, zero),
                            R.op.logical_xor(R.op.less(rest, zero), R.op.less(y, zero)))


def _floored_remainder(call, b):  # noqa: ARG001 (rewrite_calls' signature)
    from .bindings import is_op

    if not is_op(call, "relax.floor_mod") or not _float32(call):
        return None
    x, y = call.args
    r = R.op.mod(x, y)  # (truncated, exact: LLVM's frem)
    return R.op.where(_other_side(r, y), R.op.add(r, y), r)


def exact_floor_mod(mod):
    """``mod`` with every float32 ``floor_mod`` (PyTorch's ``remainder``, ONNX's ``Mod``)
    the exact truncated remainder moved to the divisor's side: TOPI's ``x - floor(x / y)
    * y`` loses what ``x / y`` rounds away (``remainder(1e10, 3)`` was 256, outside [0,
    3)). ``mod`` itself when there is none."""
    from .bindings import rewrite_calls

    return rewrite_calls(mod, _floored_remainder)


# ---- division of narrow integers ----

_DIVISIONS = ("relax.divide", "relax.floor_divide", "relax.mod", "relax.floor_mod")


def _widened_division(call, b):  # noqa: ARG001 (rewrite_calls' signature)
    from .bindings import is_op

    dtype = str(getattr(call.ty, "dtype", ""))
    if not is_op(call, *_DIVISIONS) or dtype not in ("int8", "int16") or \
            any(str(getattr(getattr(a, "ty", None), "dtype", "")) != dtype for a in call.args):
        return None
    wide = [R.op.astype(a, "int32") for a in call.args]
    return R.op.astype(R.Call(call.op, wide, call.attrs), dtype)


def widen_narrow_division(mod):
    """``mod`` with every division and remainder of int8 or int16 tensors computed in
    int32 and wrapped back (``-128 // -1`` is -128, as PyTorch and ONNX give it): LLVM
    divided them in their own width, and x86's 8- and 16-bit division traps on that
    quotient, which stopped the process (SIGFPE). ``mod`` itself when there is none."""
    from .bindings import rewrite_calls

    return rewrite_calls(mod, _widened_division)


# ---- floor division of floats ----

def floor_divide(x, y, dtype="float32"):
    """PyTorch's (and Python's) floor division of floats as a Relax expression: from the
    exact remainder, ``(x - fmod(x, y)) / y``, less one where the remainder's sign is
    not the divisor's, rounded to the nearest whole number (it is whole but for the
    division's rounding); ``x / y`` where ``y`` is 0, and a zero quotient keeps the sign
    of ``x / y``. TOPI's ``floor(x / y)`` took the rounded quotient's floor: ``3.5 //
    -0.7`` gave -5 for -6, ``7 // 0.1`` 70 for 69."""
    zero = _fconst(0.0, dtype)
    rest = R.op.mod(x, y)  # (exact: LLVM's frem)
    div = R.op.divide(R.op.subtract(x, rest), y)
    div = R.op.where(_other_side(rest, y, dtype), R.op.subtract(div, _fconst(1.0, dtype)),
                     div)
    low = R.op.floor(div)
    whole = R.op.where(R.op.greater(R.op.subtract(div, low), _fconst(0.5, dtype)),
                       R.op.add(low, _fconst(1.0, dtype)), low)
    quotient = R.op.divide(x, y)
    signed_zero = R.op.where(R.op.less(quotient, zero), _fconst(-0.0, dtype),
                             R.op.where(R.op.greater(quotient, zero), zero, quotient))
    return R.op.where(R.op.equal(y, zero), quotient,
                      R.op.where(R.op.equal(div, zero), signed_zero, whole))


def _exact_floor_divide(call, b):  # noqa: ARG001 (rewrite_calls' signature)
    from .bindings import is_op

    dtype = str(getattr(call.ty, "dtype", ""))
    if not is_op(call, "relax.floor_divide") or dtype not in ("float32", "float64"):
        return None
    return floor_divide(*call.args, dtype)


def exact_floor_divide(mod):
    """``mod`` with every float ``floor_divide`` computed as PyTorch does
    (``floor_divide``). ``mod`` itself when there is none."""
    from .bindings import rewrite_calls

    return rewrite_calls(mod, _exact_floor_divide)


# ---- a clip whose bounds cross ----

def _crossed_clip(call, b):  # noqa: ARG001 (rewrite_calls' signature)
    from .bindings import is_op

    if not is_op(call, "relax.clip"):
        return None
    bounds = [getattr(a, "value", None) for a in call.args[1:]]
    bounds = [getattr(v, "value", v) for v in bounds]  # (a PrimValue's, or the number)
    if any(not isinstance(v, (int, float)) for v in bounds) or bounds[0] <= bounds[1]:
        return None
    return R.op.clip(call.args[0], call.args[2], call.args[2])


def fix_crossed_clip(mod):
    """``mod`` with a clip whose lower bound is above its upper giving the upper bound,
    as PyTorch's ``clamp`` (a max, then a min) does; TOPI's gave the lower. ``mod``
    itself when there is none."""
    from .bindings import rewrite_calls

    return rewrite_calls(mod, _crossed_clip)


# ---- tensors full of an infinity or NaN ----

def _full_of_non_finite(call, b):
    """``full(shape, v)`` / ``full_like(x, v)`` of a float v that is infinite or NaN as
    the same of 0 plus v; else None."""
    import math

    from .bindings import is_op, scalar_constant

    if not is_op(call, "relax.full", "relax.full_like") or not \
            str(getattr(call.ty, "dtype", "")).startswith(("float", "bfloat")):
        return None
    value = scalar_constant(call.args[1], b.values, "f")
    if value is None or math.isfinite(value):
        return None
    dtype = str(call.ty.dtype)
    zeros = R.op.full(call.args[0], R.const(0.0, dtype), dtype) if is_op(call, "relax.full") \
        else R.op.full_like(call.args[0], R.const(0.0, dtype), dtype)
    return R.op.add(zeros, R.const(value, dtype))


def fix_non_finite_full(mod):
    """``mod`` with every tensor full of -inf, +inf or NaN (PyTorch's
    ``torch.full((n, n), float("-inf")).triu(1)``, a causal mask) written as zeros plus
    that value: TVM's legalization of such a ``full`` failed ("argument of type
    'PrimType' is not iterable": it checks the value against the dtype as a string).
    ``mod`` itself when there is none."""
    from .bindings import rewrite_calls

    return rewrite_calls(mod, _full_of_non_finite)


# ---- constants with no elements ----

def _empty_constant(expr) -> bool:
    # (GenericConst also holds an allocation's dtype: tensors only)
    return isinstance(expr, T.RelaxConstant) and hasattr(expr.value, "numpy") and \
        T.constant_value(expr).size == 0


def _allocated_if_empty(expr):
    """``expr`` with each constant of no elements in it (or in its tuple's fields) an
    allocation of its shape; ``expr`` itself when there is none."""
    if isinstance(expr, R.Tuple):
        fields = [_allocated_if_empty(f) for f in expr.fields]
        return expr if all(a.same_as(b) for a, b in zip(fields, expr.fields)) \
            else R.Tuple(fields)
    if not _empty_constant(expr):
        return expr
    # NOTE: an allocation, not ``zeros``: constant folding would make ``zeros`` a
    # constant again, and there are no elements to fill
    value = T.constant_value(expr)
    return R.op.builtin.alloc_tensor(R.ShapeExpr(list(value.shape)), str(value.dtype),
                                     runtime_device_index=0)


def _without_empty_constants(call, b):  # noqa: ARG001 (rewrite_calls' signature)
    if not isinstance(call, R.Call):
        return None
    args = [_allocated_if_empty(a) for a in call.args]
    if all(a.same_as(b) for a, b in zip(args, call.args)):
        return None
    return R.Call(call.op, args, call.attrs, call.ty_args)


def fix_empty_constants(mod):
    """``mod`` with every constant of no elements that a call reads (DINOv3's
    ``register_tokens`` of shape ``(1, 0, 384)`` where a config asks for none) allocated
    at run time instead (there is nothing to fill): TVM wrote such a constant into the
    executable and then failed to load it back ("Invalid DLTensor file format"). ``mod``
    itself when there is none."""
    from .bindings import rewrite_calls

    return rewrite_calls(mod, _without_empty_constants)


# ---- equality of bools ----

def _bool_equality(call, b):  # noqa: ARG001 (rewrite_calls' signature)
    from .bindings import is_op

    if not is_op(call, "relax.equal", "relax.not_equal") or \
            not all(_is_bool(a) for a in call.args):
        return None
    differ = R.op.logical_xor(*call.args)
    return differ if is_op(call, "relax.not_equal") else R.op.logical_not(differ)


def fix_bool_equality(mod):
    """``mod`` with ``==`` and ``!=`` of bool tensors as ``not xor`` and ``xor``: TVM
    compiles them to LLVM float compares of i1 values, which LLVM's verifier rejects
    (``(x > 0) != (y > 0)`` did not build). ``mod`` itself when there is none."""
    from .bindings import rewrite_calls

    return rewrite_calls(mod, _bool_equality)


def _nan_unequal(call, b):
    """``a != b`` of floats (``not_equal``, or ``logical_not`` of an ``equal``), true where
    either is NaN; None for any other call. The ordered part is ``a < b or a > b``: TVM's
    simplifier makes ``not (a == b)`` its ``a != b`` and folds ``x != x`` to false."""
    from .bindings import is_op, scalar_constant

    pair = call.args if is_op(call, "relax.not_equal") else None
    if is_op(call, "relax.logical_not"):
        inner = call.args[0] if isinstance(call.args[0], R.Call) else b.producer(call.args[0])
        pair = inner.args if inner is not None and is_op(inner, "relax.equal") else None
        # not a comparison with an infinity: ``not (S == -inf)`` is how PyTorch's
        # attention finds the rows it masked whole, and the attention region takes that
        # chain as it is (its kernel sets such rows to zero)
        if pair is not None and any(math.isinf(scalar_constant(a, b.values, "f") or 0.0)
                                    for a in pair):
            return None
    if pair is None or not all(_is_float_tensor(a) for a in pair):
        return None
    a, c = pair
    return R.op.logical_or(R.op.logical_or(R.op.less(a, c), R.op.greater(a, c)),
                           R.op.logical_or(R.op.isnan(a), R.op.isnan(c)))


def fix_nan_inequality(mod):
    """``mod`` with every float ``!=`` true where an operand is NaN, as in PyTorch,
    NumPy and ONNX (``Not(Equal)``): TVM compiles it to LLVM's ordered compare, false
    with a NaN, so ``x != x``, the usual test for NaN, was false everywhere. ``mod``
    itself when there is none."""
    from .bindings import rewrite_calls

    return rewrite_calls(mod, _nan_unequal)


# ---- group and instance norms in two passes ----

def _two_pass_norm(call, b):  # noqa: ARG001 (rewrite_calls' signature)
    """A float32 ``R.nn.group_norm`` (over channel axis 1 and every axis after it) or
    ``R.nn.instance_norm`` written as a mean, the mean of the squared deviations from
    it, and the normalization (then the scale and shift); else None."""
    from .bindings import is_op, shape_of

    group = is_op(call, "relax.nn.group_norm")
    if not (group or is_op(call, "relax.nn.instance_norm")) or not _float32(call):
        return None
    a = call.attrs
    dims = shape_of(call.args[0])
    if dims is None:
        return None
    rank, channel = len(dims), int(a.channel_axis) % len(dims)
    axes = sorted(int(v) % rank for v in a.axes)
    x, gamma, beta = call.args
    if group:
        groups = int(a.num_groups)
        if channel != 1 or axes != list(range(2, rank)) or \
                isinstance(dims[1], T.IntImm) and int(dims[1]) % groups:
            return None
        grouped = R.op.reshape(x, [dims[0], groups, -1])  # one row per group
        axes = [2]
    elif channel in axes:
        return None
    else:
        grouped = x
    mean = R.op.mean(grouped, axis=axes, keepdims=True)
    dev = R.op.subtract(grouped, mean)
    var = R.op.mean(R.op.multiply(dev, dev), axis=axes, keepdims=True)
    y = R.op.multiply(dev, R.op.rsqrt(R.op.add(var, _fconst(float(a.epsilon)))))
    if group:
        y = R.op.reshape(y, dims)
    per_channel = [dims[channel] if i == channel else 1 for i in range(rank)]
    if bool(a.scale):
        y = R.op.multiply(y, R.op.reshape(gamma, per_channel))
    if bool(a.center):
        y = R.op.add(y, R.op.reshape(beta, per_channel))
    return y


def two_pass_norms(mod):
    """``mod`` with every group and instance norm computing its variance from the
    deviations (two passes over the group): TOPI's take the mean of the squares less the
    square of the mean, which cancels where the mean is large against the spread (a
    group of mean 1000 and deviation 1: error 0.35 against PyTorch's 6e-5; at mean 1e4
    most outputs NaN, from a negative variance). ``mod`` itself when there is none."""
    from .bindings import rewrite_calls

    return rewrite_calls(mod, _two_pass_norm)


def apply(mod):
    """Every fix-up, in order."""
    for fix in (fix_bool_cumsum, fix_topk_one, fix_nan_order, fix_einsum, fix_onnx_clip,
                fix_negative_indices, fix_strided_slices, tighten_symbolic_shapes,
                fix_broadcast_weight, fix_flattened_matmul, fold_column_scale, fuse_rms_norm,
                fix_cancellation, two_pass_norms, exact_floor_mod, exact_floor_divide,
                fix_non_finite_full, fix_bool_equality, fix_nan_inequality,
                widen_narrow_division, fix_crossed_clip, fix_empty_constants):
        mod = fix(mod)
    return mod
