"""Converters for ``torch.export`` programs that TVM 0.27's PyTorch frontend rejects or gets wrong.

TVM's ``from_exported_program`` takes extra converters by ATen name
(``custom_convert_map``); ``torch_converters()`` gives tirbyoc's::

    from tvm.relax.frontend.torch import from_exported_program
    mod = from_exported_program(ep, custom_convert_map=tirbyoc.torch_converters())

* ``min.dim`` (``x.min(dim)``: values and indices) has no converter ("Unsupported
  function types ['min.dim']"). It becomes a ``min`` and an ``argmin`` over the axis, as
  ``fixups.fix_topk_one`` makes TVM's own ``max.dim`` (a ``topk`` of one): ties give
  the first index and a NaN wins, as PyTorch does (``fixups.extreme_with_index``).
* ``index.Tensor`` with a bool mask (``x[mask]``, whose size the data decides): an
  error naming it (TVM's converter failed on a ``take`` of bools).
* ``index.Tensor`` with two or more index tensors. TVM's converter passes index tensors
  of different shapes to Relax's ``index_tensor``, whose shape inference compares them
  from the left ("cannot broadcast index shapes": ConvBERT's ``unfold``), and where a
  whole axis (``None``) comes first it pairs an ``arange`` over that axis with the
  indices instead of keeping the axis (``x[:, i, j]``), or takes the indices one after
  the other, an outer product where PyTorch pairs them. Here the indexed axes are moved
  to the front, the indices broadcast to their common shape (NumPy's rules, as
  PyTorch's) and applied together, and the broadcast axes put where PyTorch puts them:
  in place of the indexed axes where these are adjacent, else first. One index tensor
  stays TVM's ``take``.
* ``arange`` with a negative step: Relax's ``arange`` counts its length as for a
  positive one, ``arange(128, -128, -1)`` 258 long instead of 256 (Funnel Transformer's
  relative positions). Such a range is written as ``start + step * arange(n)`` with
  ``n`` counted here; a positive step goes to TVM's converter.
* ``log`` of an integer tensor (SEW-D's relative position buckets): PyTorch computes it
  in the default float type; Relax's ``log`` rejects integers. The input is cast first.
* ``div`` of an integer tensor by a Python number (``perm // top_k`` in
  ``transformers``' experts): TVM's converter makes the number an int32 constant, which
  Relax will not divide an int64 tensor by; and without a rounding mode it divides
  integers as integers, where PyTorch's ``/`` gives floats (``arange(5) / 2`` came out
  ``[0, 0, 1, 1, 2]``); a float tensor by an int fails the same way with a rounding
  mode. Here the number takes the tensor's type, a float number or no
  rounding mode makes the division a float one, as PyTorch promotes, and ``trunc`` of
  integers rounds toward zero in integers.
* ``topk`` with ``sorted=False`` (DeepSeek-V3's expert groups): TVM's converter
  refuses it. PyTorch leaves the order of such a result unspecified, so the sorted
  result is one it may give; it is converted as ``sorted=True``.
* ``split`` into sizes known only at run time (JetMoE's experts take their rows so): a
  Relax tensor's shape cannot depend on data, and TVM's converter failed with a
  ``TypeError`` about adding a ``Node``; this says what and where.
* ``amax`` and ``amin`` (no converter: Reformer) and the whole-tensor ``max()`` and
  ``min()``: Relax's max and min skip NaN (their compare-selects keep the other
  operand), where PyTorch returns NaN; here a NaN in what is reduced gives NaN. So do
  ``argmax`` and ``argmin``: here the first NaN's index, as PyTorch gives.
* ``histc`` (no converter): counts per bin of equal width over ``[min, max]``, values
  outside it (and NaN) not counted, ``max`` itself in the last bin, a value's bin
  ``floor((v - min) * bins / (max - min))`` in the input's type, as PyTorch's CPU kernel
  computes it; ``min == max`` takes the data's range (widened by one each way when that
  is one value), as PyTorch does. ``transformers``' experts count their rows with it.
* ``transformers.grouped_mm_fallback`` (a custom op), the experts of ``transformers``'
  mixture-of-experts layers on CPU: the grouped product ``tirbyoc.moe`` defines, which
  ``tirbyoc.compile`` runs as kernel calls. (PyTorch's own ``_grouped_mm`` takes
  bfloat16 only on CPU and is not converted.)

* ``add``, ``sub``, ``mul`` and ``rsub`` of a bool or integer tensor and a Python number
  of a higher kind: TVM's converter gave the number the tensor's type (``arange(n) *
  0.5`` came out zeros, ``arange(n) + 1e-7`` unchanged: ZoeDepth's log-binomial took
  ``log(0)``, and its depth map was all NaN), and it ignored ``alpha``. Here the tensor
  is promoted as PyTorch promotes (to int64 or float32), ``alpha`` scales the second
  operand, and bools add and multiply as ``or`` and ``and``.
* ``grid_sample``: TVM's converter passed PyTorch's [N, H, W, 2] grid to an op that
  reads [N, 2, H, W] (wrong shape and points: RT-DETR did not import); the grid is
  transposed first. With reflection padding (bilinear, nearest) the reflected points
  are computed first, once, and sampled with border padding: TOPI's reflection
  expression took 55 s to compile for one bilinear sample.
* ``unfold`` (``x.unfold(dim, size, step)``, no converter: PatchTST's patches, UnivNet):
  the windows' indices taken along the axis, the window's axis moved last.

* ``group_norm`` without a weight or bias (``F.group_norm(x, groups)``): TVM's converter
  passed None on and crashed ("Found null pointer node"); ones and zeros here.
* ``eq``, ``ne``, ``lt``, ``le``, ``gt``, ``ge`` with a Python number: as for the
  arithmetic, TVM's converter gave the number the tensor's type (an int64 tensor
  compared with 2.5 was compared with 2; a bool tensor with 0.5 failed to build); here
  both are promoted as PyTorch promotes.
* ``upsample_nearest2d`` (``interpolate(mode="nearest")``): TVM's converter took
  half-pixel centres and rounded (PyTorch's "nearest-exact"), and computed from the
  sizes where a scale factor was given: other pixels wherever the ratio is not a whole
  upscale (7 -> 4 rows: [0, 2, 4, 6] for PyTorch's [0, 1, 3, 5]). Here a gather by the
  indices PyTorch computes (in its float32 arithmetic).
* ``upsample_bilinear2d`` with a scale factor that does not give a whole output size
  (7 rows at 1.7): PyTorch maps pixels by the scale factor, TVM's converter by the
  sizes' ratio; here PyTorch's taps and weights.
* ``_upsample_bilinear2d_aa`` (``antialias=True``): TVM's converter dropped the
  filter, silently wrong when downsampling; that is an error here (upsampling is the
  same without it).
* ``clamp`` of an integer tensor with one bound (``torch.export``'s decomposition of
  ``interpolate(mode="linear")`` clamps its indices so): TVM's converter made the
  missing bound an infinity, which an integer cannot hold ("Cannot convert infinity to
  BigInt": every 1-D linear and trilinear resize failed to build); here the type's
  extreme. A float bound on an integer tensor promotes it to float32, as in PyTorch
  (TVM's clamped ``arange`` by -2.5 to -2).
* ``remainder`` and ``fmod`` of an integer tensor by a float number, ``reciprocal``
  of integers: PyTorch computes in float32, TVM's converter in integers
  (``reciprocal(2)`` was 0).
* ``adaptive_max_pool2d`` (no converter: "Unsupported function types"): a max pool
  where the output size divides the input's (tirbyoc's pooling kernel takes it), else
  TOPI's adaptive pool, whose windows are PyTorch's (rows ``floor(i H / oh)`` to
  ``ceil((i + 1) H / oh)``). Its indices output is an error where the graph reads it.
* ``elu`` and ``selu``: TVM's converter dropped ATen's ``scale`` and ``input_scale``
  of ``elu`` and SELU's scale (every output 4.8% small), and computed ``exp(x) - 1``
  with the cancellation of the 1; here ``scale * where(x > 0, x, alpha *
  expm1(input_scale * x))`` with ``fixups.expm1``.

``from_exported_program(ep)`` is TVM's importer with these converters, after
``fold_constant_items(ep)``: scalars read with ``.item()`` out of tensors made from the
model's own constants and static shapes only become numbers (Mimi's padding).
"""

from __future__ import annotations

import math
import operator

import numpy as np
import tvm
from tvm import relax

from . import torch_fft
from .bindings import same_dims, shape_of, static_dims
from .fixups import extreme_with_index, nan_propagating


def torch_converters() -> dict:
    """ATen name -> converter, for ``from_exported_program(..., custom_convert_map=...)``."""
    return {"min.dim": _min_dim, "index.Tensor": _index_tensor,
            "arange.start_step": _arange_start_step, "log.default": _log,
            "histc.default": _histc, "grouped_mm_fallback.default": _grouped_mm,
            "div.Tensor_mode": _div_mode,
            "div.Tensor": _div_mode, "floor_divide.default": _floor_divide,
            "topk.default": _topk,
            "split.Tensor": _split, "split_with_sizes.default": _split,
            "amax.default": _extreme(True), "amin.default": _extreme(False),
            "max.default": _extreme(True), "min.default": _extreme(False),
            "argmax.default": _arg_extreme(True), "argmin.default": _arg_extreme(False),
            "unfold.default": _unfold, "grid_sampler_2d.default": _grid_sample,
            **{f"{name}.{form}": _arithmetic(relax_op, python_op)
               for name, relax_op, python_op in (
                   ("add", relax.op.add, operator.add), ("sub", relax.op.subtract, operator.sub),
                   ("mul", relax.op.multiply, operator.mul))
               for form in ("Tensor", "Scalar")},
            **{f"{name}.{form}": _comparison(relax_op)
               for name, relax_op in (("eq", relax.op.equal), ("ne", relax.op.not_equal),
                                      ("lt", relax.op.less), ("le", relax.op.less_equal),
                                      ("gt", relax.op.greater),
                                      ("ge", relax.op.greater_equal))
               for form in ("Tensor", "Scalar")},
            "rsub.Tensor": _arithmetic(relax.op.subtract, operator.sub, reverse=True),
            "rsub.Scalar": _arithmetic(relax.op.subtract, operator.sub, reverse=True),
            "elu.default": _elu, "selu.default": _elu, "group_norm.default": _group_norm,
            "native_group_norm.default": _group_norm,
            "upsample_nearest2d.vec": _upsample_nearest, "upsample_nearest2d.default":
            _upsample_nearest, "upsample_bilinear2d.vec": _upsample_bilinear,
            "_upsample_bilinear2d_aa.vec": _antialiased,
            "_upsample_bilinear2d_aa.default": _antialiased,
            "clamp.default": _clamp,
            **{f"{name}.Scalar": _float_with_number(name) for name in ("remainder", "fmod")},
            "reciprocal.default": _reciprocal,
            "adaptive_max_pool2d.default": _adaptive_max_pool2d,
            **torch_fft.converters()}


def _min_dim(node, importer):
    x = importer.env[node.args[0]]
    dim = node.args[1]
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    emit = importer.block_builder.emit
    values, indices = extreme_with_index(x, dim, largest=False, keepdims=bool(keepdim))
    return emit(relax.Tuple([emit(values), emit(relax.op.astype(indices, "int64"))]))


def _static_shape(expr):
    """The dimensions as a tuple of ints, or None where one is symbolic or unknown."""
    dims = static_dims(expr)
    return None if dims is None else tuple(dims)


def _index_tensor(node, importer):
    """``data[indices]`` with PyTorch's advanced indexing: the index tensors (``None``
    for a whole axis) broadcast together into the result's leading axes, or, where
    the indexed axes are adjacent, into the place of the first of them."""
    args = importer.retrieve_args(node)
    data, indices = args[0], list(args[1])
    axes = [axis for axis, index in enumerate(indices) if index is not None]
    if any(str(getattr(indices[axis].ty, "dtype", "")) == "bool" for axis in axes):
        # (TVM's converter passed the mask to a take, which failed on its type)
        raise NotImplementedError(
            f"index.Tensor with a bool mask (x[mask]): the result's size depends on the "
            f"mask's values, which a compiled shape cannot: {node.format_node()}")
    if len(axes) < 2:
        return importer._index_tensor(node)  # one index: a take, as TVM writes it
    ndim = data.ty.ndim
    emit = importer.block_builder.emit
    shapes = [_static_shape(indices[axis]) for axis in axes]
    if None in shapes or ndim < 0:
        if len(axes) == len(indices):  # Relax's index_tensor as it is
            return importer._index_tensor(node)
        first = shape_of(indices[axes[0]])
        if ndim < 0 or not all(same_dims(shape_of(indices[axis]), first) for axis in axes):
            raise NotImplementedError(
                f"index.Tensor: index tensors of different symbolic shapes with a whole "
                f"axis among them are not converted: {node.format_node()}")
        picks = [indices[axis] for axis in axes]  # no broadcast needed
        rank = len(first)
    else:
        try:
            common = tuple(np.broadcast_shapes(*shapes))
        except ValueError as err:
            raise ValueError(f"index.Tensor: index shapes {shapes} do not broadcast "
                             f"({node.format_node()})") from err
        picks = [indices[axis] if shape == common else
                 emit(relax.op.broadcast_to(indices[axis], common))
                 for axis, shape in zip(axes, shapes)]
        rank = len(common)
    rest = [axis for axis in range(ndim) if axis not in axes]
    if axes + rest != list(range(ndim)):  # the indexed axes first, in their order
        data = emit(relax.op.permute_dims(data, axes + rest))
    picked = emit(relax.op.index_tensor(data, picks))
    adjacent = axes == list(range(axes[0], axes[-1] + 1))
    if not adjacent or axes[0] == 0:
        return picked
    # adjacent after whole axes: those axes before the broadcast ones
    k, before = rank, axes[0]
    order = [*range(k, k + before), *range(k), *range(k + before, k + len(rest))]
    return emit(relax.op.permute_dims(picked, order))


def _arange_start_step(node, importer):
    start, end, step = (list(node.args) + [1])[:3]
    step = node.kwargs.get("step", step)
    if not isinstance(step, (int, float)) or step >= 0:
        return importer._arange(node)
    if not all(isinstance(v, (int, float)) for v in (start, end)):
        raise NotImplementedError(f"arange with a negative step and a symbolic bound: "
                                  f"{node.format_node()}")
    count = max(0, math.ceil((end - start) / step))
    dtype = (importer._convert_data_type(str(node.kwargs["dtype"]), importer.env)
             if "dtype" in node.kwargs else
             "float32" if any(isinstance(v, float) for v in (start, end, step)) else "int64")
    emit = importer.block_builder.emit
    positions = emit(relax.op.arange(0, count, 1, dtype=dtype))
    return emit(relax.op.add(relax.op.multiply(positions, relax.const(step, dtype)),
                             relax.const(start, dtype)))


def _log(node, importer):
    x = importer.env[node.args[0]]
    if str(x.ty.dtype).startswith(("int", "uint", "bool")):
        x = importer.block_builder.emit(relax.op.astype(x, "float32"))
    return importer.block_builder.emit(relax.op.log(x))


def _elu(node, importer):
    """``scale * (x if x > 0 else alpha * expm1(x * input_scale))``: ATen's ``elu`` with
    its ``scale`` and ``input_scale`` (TVM's converter drops both), and ``selu``, its
    constants (TVM's lost the scale: every output 4.8% small)."""
    from .fixups import SELU_ALPHA, SELU_SCALE, expm1

    x = importer.env[node.args[0]]
    if node.target.__name__.startswith("selu"):
        alpha, scale, input_scale = SELU_ALPHA, SELU_SCALE, 1.0
    else:
        given = list(node.args[1:]) + [None] * 3
        alpha, scale, input_scale = (
            float(node.kwargs.get(k, given[i] if given[i] is not None else 1.0))
            for i, k in enumerate(("alpha", "scale", "input_scale")))
    dtype = str(x.ty.dtype)
    inner = x if input_scale == 1.0 else relax.op.multiply(x, relax.const(input_scale, dtype))
    negative = relax.op.multiply(relax.const(alpha, dtype), expm1(inner, dtype))
    out = relax.op.where(relax.op.greater(x, relax.const(0.0, dtype)), x, negative)
    if scale != 1.0:
        out = relax.op.multiply(relax.const(scale, dtype), out)
    return importer.block_builder.emit(out)


def _group_norm(node, importer):
    """``group_norm(x, groups, weight, bias, eps)`` and ``native_group_norm(x, weight,
    bias, N, C, HxW, groups, eps)`` (the normalized tensor, as TVM's converter gives)
    with no weight or bias (TVM's converter passed None on and crashed: "Found null
    pointer node"): ones and zeros."""
    x = importer.env[node.args[0]]
    if node.target.__name__.startswith("native"):
        args = list(node.args) + [None] * (8 - len(node.args))
        weight, bias, groups, eps = args[1], args[2], int(args[6]), args[7]
    else:
        args = list(node.args) + [None] * (5 - len(node.args))
        groups = int(node.kwargs.get("num_groups", args[1]))
        weight, bias = (node.kwargs.get(k, args[i]) for i, k in ((2, "weight"), (3, "bias")))
        eps = node.kwargs.get("eps", args[4])
    eps = 1e-5 if eps is None else float(eps)
    dims = shape_of(x)
    dtype = str(x.ty.dtype)

    def affine(arg, fill):
        if arg is not None:
            return importer.env[arg]
        return relax.op.full([dims[1]], relax.const(fill, dtype), dtype)

    return importer.block_builder.emit(relax.op.nn.group_norm(
        x, affine(weight, 1.0), affine(bias, 0.0), num_groups=groups, channel_axis=1,
        axes=list(range(2, len(dims))), epsilon=eps))


def _resize_step(size: int, out: int, scale) -> np.float32:
    """Input pixels per output pixel of PyTorch's resizes along one axis, in its float32
    arithmetic: ``1 / scale`` for a scale factor given, else ``size / out``."""
    return np.float32(1.0 / scale) if scale else np.float32(size) / np.float32(out)


def _nearest_indices(size: int, out: int, scale) -> np.ndarray:
    """The input index of each output index of PyTorch's "nearest" along one axis, in
    its arithmetic (float32): the same, halves, else ``floor(i * s)``, ``s`` the inverse
    of a scale factor given, else ``size / out``."""
    i = np.arange(out, dtype=np.int64)
    if out == size:
        return i
    if out == 2 * size:
        return i >> 1
    s = _resize_step(size, out, scale)
    return np.minimum(np.floor(i.astype(np.float32) * s).astype(np.int64), size - 1)


def _upsample_nearest(node, importer):
    """``upsample_nearest2d`` as PyTorch picks its pixels: TVM's converter resized with
    half-pixel centres, rounded (PyTorch's "nearest-exact"), and from the sizes even
    where a scale factor was given (7 -> 4: rows [0, 2, 4, 6] where PyTorch takes [0, 1,
    3, 5]). A gather of the rows, then of the columns, by indices computed here; a
    whole upscale (where TVM's picks the same pixels) and a tensor of run-time height or
    width go to TVM's converter."""
    x = importer.env[node.args[0]]
    dims = shape_of(x)
    static = dims is not None and len(dims) == 4 and \
        all(isinstance(d, tvm.tirx.IntImm) for d in dims[2:])
    if not static:
        return importer._upsample_nearest2d(node)
    args = list(node.args) + [None] * 4
    size, scales = args[1], None
    if node.target.__name__.endswith("vec"):
        scales = args[2]
    elif args[2] is not None or args[3] is not None:
        scales = [args[2], args[3]]
    in_sizes = [int(d) for d in dims[2:]]
    if size is None:  # (PyTorch: floor(size * scale), in float64)
        size = [int(math.floor(n * float(f))) for n, f in zip(in_sizes, scales)]
    scales = scales or [None, None]
    if all(int(m) % n == 0 and (f is None or float(f) == int(m) // n)
           for n, m, f in zip(in_sizes, size, scales)):
        # a whole upscale: TVM's rounded half-pixel centres pick PyTorch's pixels
        return importer._upsample_nearest2d(node)
    out = x
    for axis, n, m, f in zip((2, 3), in_sizes, size, scales):
        index = _nearest_indices(n, int(m), None if f is None else float(f))
        if not np.array_equal(index, np.arange(n)) or int(m) != n:
            out = relax.op.take(out, relax.const(index, "int64"), axis=axis)
    return importer.block_builder.emit(out)


def _linear_taps(size: int, out: int, scale=None, corners=False):
    """PyTorch's two source indices and the second one's weight for each output index
    of a linear resize along one axis, in its float32 arithmetic: corners aligned, the
    step ``(size - 1) / (out - 1)``; else half-pixel centres, the step ``1 / scale``
    for a scale factor given, ``size / out`` without."""
    dst = np.arange(out, dtype=np.float32)
    if corners:
        step = np.float32(size - 1) / np.float32(out - 1) if out > 1 else np.float32(0.0)
        src = dst * step
    else:
        step = _resize_step(size, out, scale)
        src = np.maximum((dst + np.float32(0.5)) * step - np.float32(0.5), np.float32(0.0))
    low = np.minimum(np.floor(src).astype(np.int64), size - 1)
    return low, np.minimum(low + 1, size - 1), (src - low.astype(np.float32))


def _lerp_along(x, axis: int, rank: int, taps):
    """``x`` resized along ``axis`` by ``_linear_taps``' gathers and weights."""
    low, high, w = taps
    shape = [1] * rank
    shape[axis] = len(low)
    first = relax.op.take(x, relax.const(low, "int64"), axis=axis)
    second = relax.op.take(x, relax.const(high, "int64"), axis=axis)
    return relax.op.add(first, relax.op.multiply(relax.op.subtract(second, first),
                                                 relax.const(w.reshape(shape), "float32")))


def _upsample_bilinear(node, importer):
    """``upsample_bilinear2d`` given a scale factor whose output size is not the input
    size times it (7 rows at 1.7: 11): PyTorch maps output to input pixels by the scale
    factor, TVM's converter by the sizes' ratio (other values everywhere). Here the two
    taps of each axis gathered and weighted as PyTorch computes them; every other case
    (sizes given, corners aligned, the ratio exact, run-time sizes) is TVM's converter."""
    x = importer.env[node.args[0]]
    args = list(node.args) + [None] * 4
    size, corners, scales = args[1], bool(args[2]), args[3]
    dims = shape_of(x)
    if size is not None or corners or not scales or dims is None or len(dims) != 4 or \
            not all(isinstance(d, tvm.tirx.IntImm) for d in dims[2:]) or \
            str(x.ty.dtype) != "float32":
        return importer._upsample_bilinear2d(node)
    in_sizes = [int(d) for d in dims[2:]]
    out_sizes = [int(math.floor(n * float(f))) for n, f in zip(in_sizes, scales)]
    if all(_resize_step(n, m, float(f)) == _resize_step(n, m, None)
           for n, m, f in zip(in_sizes, out_sizes, scales)):
        return importer._upsample_bilinear2d(node)
    out = x
    for axis, n, m, f in zip((2, 3), in_sizes, out_sizes, scales):
        out = _lerp_along(out, axis, 4, _linear_taps(n, m, float(f)))
    return importer.block_builder.emit(out)


def _clamp(node, importer):
    """``clamp(x, min, max)`` of an integer tensor: a missing bound is the type's
    extreme, a float bound makes the clamp a float32 one (PyTorch's promotion); a float
    tensor is TVM's converter."""
    x = importer.env[node.args[0]]
    args = list(node.args) + [None] * 3
    low, high = node.kwargs.get("min", args[1]), node.kwargs.get("max", args[2])
    dtype = str(getattr(x.ty, "dtype", ""))
    if _kind(dtype) != 1 or not all(b is None or _is_number(b) for b in (low, high)):
        return importer._clamp(node)
    if any(isinstance(b, float) for b in (low, high)):
        x = importer.block_builder.emit(relax.op.astype(x, "float32"))
        low = float("-inf") if low is None else float(low)
        high = float("inf") if high is None else float(high)
    else:
        info = np.iinfo(dtype)
        low = int(info.min) if low is None else int(low)
        high = int(info.max) if high is None else int(high)
    return importer.block_builder.emit(relax.op.clip(x, low, high))


def _float_with_number(name):
    """``remainder`` / ``fmod`` of an integer tensor by a float number: PyTorch computes
    in float32, TVM's converter cut the number to an integer (``remainder(-3, 2.5)``
    gave 1, not 2.0). The floored remainder for ``remainder``, the truncated one for
    ``fmod``; any other case is TVM's converter."""
    def convert(node, importer):
        x, y = importer.env[node.args[0]], node.args[1]
        if not (_kind(str(getattr(x.ty, "dtype", ""))) == 1 and isinstance(y, float)):
            return importer._fmod(node) if name == "fmod" else \
                importer._binary_op(relax.op.floor_mod, operator.mod)(node)
        x, y = relax.op.astype(x, "float32"), relax.const(y, "float32")
        # (a float floor_mod is made exact by fixups.exact_floor_mod; mod is exact)
        op = relax.op.floor_mod if name == "remainder" else relax.op.mod
        return importer.block_builder.emit(op(x, y))
    return convert


def _reciprocal(node, importer):
    """``1 / x``, an integer x taken in float32 as PyTorch does (TVM's converter
    divided integers: ``reciprocal(2)`` was 0)."""
    x = importer.env[node.args[0]]
    if _kind(str(getattr(x.ty, "dtype", ""))) != 2:
        x = importer.block_builder.emit(relax.op.astype(x, "float32"))
    return importer.block_builder.emit(relax.op.divide(relax.const(1.0, str(x.ty.dtype)), x))


def _adaptive_max_pool2d(node, importer):
    """``adaptive_max_pool2d(x, (oh, ow))`` (values, indices): a max pool of the window
    ``H / oh`` x ``W / ow`` where both divide, else TOPI's adaptive max pool; the
    indices only where nothing reads them."""
    from tvm import topi

    x = importer.env[node.args[0]]
    oh, ow = (int(v) for v in node.args[1])
    dims = _static_shape(x)
    if any(int(u.args[1]) != 0 for u in node.users if u.target is operator.getitem):
        raise NotImplementedError(f"{node.target}: its indices output ({node.format_node()})")
    if dims is None or len(dims) != 4:
        raise NotImplementedError(f"{node.target} of a tensor of symbolic or other than four "
                                  f"dimensions ({node.format_node()})")
    h, w = dims[2], dims[3]
    bb = importer.block_builder
    if h % oh == 0 and w % ow == 0:
        values = bb.emit(relax.op.nn.max_pool2d(x, pool_size=(h // oh, w // ow),
                                                strides=(h // oh, w // ow)))
    else:
        # TOPI's max skips a NaN in the window; PyTorch's gives NaN: where a window
        # holds one (the same pool over isnan as 0 and 1), NaN
        values = bb.emit_te(topi.nn.adaptive_pool, x, (oh, ow), "max", "NCHW")
        if _kind(str(getattr(x.ty, "dtype", ""))) == 2:
            nan = bb.emit(relax.op.astype(relax.op.isnan(x), str(x.ty.dtype)))
            has_nan = bb.emit_te(topi.nn.adaptive_pool, nan, (oh, ow), "max", "NCHW")
            values = bb.emit(relax.op.where(
                relax.op.greater(has_nan, relax.const(0.0, str(x.ty.dtype))),
                relax.const(float("nan"), str(x.ty.dtype)), values))
    # (the indices are never read: checked above)
    return bb.emit(relax.Tuple([values, values]))


def _antialiased(node, importer):
    """``interpolate(mode="bilinear", antialias=True)``: upsampling is the same as
    without antialiasing; TVM's converter also took a downsampling so, silently without
    the filter (7 -> 3: [0.67, 3, 5.33] for PyTorch's [0.86, 3, 5.14]). That is an
    error here, naming the op."""
    x = importer.env[node.args[0]]
    args = list(node.args) + [None] * 4
    size, scales = args[1], args[3]
    dims = shape_of(x)
    ins = None if dims is None else dims[2:]
    shrinks = scales is not None and any(float(f) < 1.0 for f in scales) or \
        size is not None and (ins is None or any(
            not isinstance(n, tvm.tirx.IntImm) or int(m) < int(n) for n, m in zip(ins, size)))
    if shrinks:
        raise NotImplementedError(
            f"{node.target}: antialiased bilinear downsampling (interpolate(..., "
            f"antialias=True) to a smaller size) is not supported: {node.format_node()}")
    return _upsample_bilinear(node, importer)


def _histc(node, importer):
    args = list(node.args) + [100, 0, 0][len(node.args) - 1:]
    x, bins, lo, hi = importer.env[args[0]], int(args[1]), args[2], args[3]
    bins = int(node.kwargs.get("bins", bins))
    lo, hi = node.kwargs.get("min", lo), node.kwargs.get("max", hi)
    dtype = str(x.ty.dtype)
    if not dtype.startswith("float"):
        raise NotImplementedError(f"histc of {dtype} (PyTorch's CPU kernel takes floats "
                                  f"only): {node.format_node()}")
    if bins < 1:
        raise ValueError(f"histc: bins must be positive, got {bins}")
    emit = importer.block_builder.emit
    op = relax.op
    flat = emit(op.reshape(x, [-1]))
    if lo == hi:  # the data's range; a single value widened by one each way
        lo_t, hi_t = emit(op.min(flat)), emit(op.max(flat))
        same = emit(op.equal(lo_t, hi_t))
        one = relax.const(1.0, dtype)
        lo_t = emit(op.where(same, op.subtract(lo_t, one), lo_t))
        hi_t = emit(op.where(same, op.add(hi_t, one), hi_t))
    else:
        if lo > hi:
            raise ValueError(f"histc: max must be larger than min, got {lo} and {hi}")
        lo_t, hi_t = relax.const(float(lo), dtype), relax.const(float(hi), dtype)
    position = emit(op.floor(op.divide(
        op.multiply(op.subtract(flat, lo_t), relax.const(float(bins), dtype)),
        op.subtract(hi_t, lo_t))))
    index = op.minimum(op.astype(position, "int64"), relax.const(bins - 1, "int64"))
    # -1 outside [min, max] and for NaN (no comparison holds); no bool tensors: TVM's
    # vectorizer mixes their lanes' types when they are combined
    none = relax.const(-1, "int64")
    index = emit(op.where(op.greater_equal(flat, lo_t),
                          op.where(op.less_equal(flat, hi_t), index, none), none))
    edges = relax.const(np.arange(bins, dtype="int64"))
    hits = emit(op.where(op.equal(op.expand_dims(index, 1), op.expand_dims(edges, 0)),
                         relax.const(1, "int64"), relax.const(0, "int64")))
    return emit(op.astype(op.sum(hits, axis=[0]), dtype))


def _grouped_mm(node, importer):
    """``grouped_mm_fallback(input [S, K], weight [E, K, N], offs [E])``."""
    from .moe import emit_grouped_matmul

    x, w, offsets = importer.retrieve_args(node)
    if x.ty.ndim != 2 or w.ty.ndim != 3 or offsets.ty.ndim != 1:
        raise NotImplementedError(
            f"grouped matrix product: a 2-D input, a 3-D weight and 1-D offsets are "
            f"converted: {node.format_node()}")
    return emit_grouped_matmul(importer.block_builder, x, w, offsets)


def _kind(dtype: str) -> int:
    """PyTorch's promotion category of a dtype: bool 0, integers 1, floats 2."""
    return 0 if dtype == "bool" else 1 if dtype.startswith(("int", "uint")) else 2


def _number_kind(value) -> int:
    return 0 if isinstance(value, bool) else 1 if isinstance(value, int) else 2


def _is_tensor(v) -> bool:
    return isinstance(v, relax.Expr) and isinstance(getattr(v, "ty", None), relax.TensorType)


def _is_number(v) -> bool:
    return isinstance(v, (bool, int, float))


def _promoted(importer, lhs, rhs) -> str:
    """The dtype PyTorch computes ``lhs`` op ``rhs`` in (tensors and Python numbers, one
    tensor at least): the tensors' common type, raised to int64 or float32 by a number
    of a higher kind."""
    dtypes = [str(v.ty.dtype) for v in (lhs, rhs) if _is_tensor(v)]
    dtype = dtypes[0] if len(dtypes) == 1 else \
        importer._promote_common_dtype(*dtypes) or dtypes[0]
    for v in (lhs, rhs):
        if _is_number(v) and _number_kind(v) > _kind(dtype):  # a number of a higher kind
            dtype = "float32" if isinstance(v, float) else "int64"
    return dtype


def _as_dtype(importer, dtype, *values):
    """Each value (tensor or number) as a tensor of ``dtype``."""
    return tuple(relax.const(v, dtype) if _is_number(v) else v if str(v.ty.dtype) == dtype
                 else importer.block_builder.emit(relax.op.astype(v, dtype))
                 for v in values)


def _comparison(relax_op):
    """``eq``, ``ne``, ``lt``, ``le``, ``gt``, ``ge`` (``Tensor`` and ``Scalar``) compared
    in the type PyTorch promotes to: TVM's converter made the number the tensor's type,
    so an int64 tensor against 2.5 was compared with 2 (``arange(4) >= 2.5`` was True
    at 2)."""
    def convert(node, importer):
        lhs, rhs = importer.retrieve_args(node)[:2]
        if not (_is_tensor(lhs) or _is_tensor(rhs)) or not all(
                _is_tensor(v) or _is_number(v) for v in (lhs, rhs)):
            return importer._binary_op(relax_op, _PYTHON_COMPARISONS[relax_op])(node)
        lhs, rhs = _as_dtype(importer, _promoted(importer, lhs, rhs), lhs, rhs)
        return importer.block_builder.emit(relax_op(lhs, rhs))
    return convert


_PYTHON_COMPARISONS = {relax.op.equal: operator.eq, relax.op.not_equal: operator.ne,
                       relax.op.less: operator.lt, relax.op.less_equal: operator.le,
                       relax.op.greater: operator.gt, relax.op.greater_equal: operator.ge}


def _arithmetic(relax_op, python_op, reverse=False):
    """``add``, ``sub``, ``mul`` and ``rsub`` (``Tensor`` and ``Scalar``) as PyTorch types
    them. TVM's converter made a Python number the tensor's type, so ``arange(4) * 0.5``
    multiplied by 0 and ``arange(4) + 1e-7`` added 0 (ZoeDepth's log-binomial then took
    ``log(0)``: every output NaN); PyTorch promotes a bool or integer tensor with a
    number of a higher kind to int64 or float32. And it ignored ``alpha`` (``add(x, y,
    alpha=3)`` gave ``x + y``). ``rsub(x, y, alpha)`` is ``y - alpha x``."""
    def convert(node, importer):
        args = importer.retrieve_args(node)
        lhs, rhs = args[0], args[1]
        alpha = args[2] if len(args) > 2 else node.kwargs.get("alpha", 1)
        if reverse:
            lhs, rhs = rhs, lhs
        tensor, number = _is_tensor, _is_number
        if not (tensor(lhs) or tensor(rhs)) or not all(
                tensor(v) or number(v) for v in (lhs, rhs)):
            if alpha != 1:  # (shape arithmetic has no alpha)
                raise NotImplementedError(f"{node.target} with alpha on non-tensors: "
                                          f"{node.format_node()}")
            return importer._rsub(node) if reverse else \
                importer._binary_op(relax_op, python_op)(node)
        emit = importer.block_builder.emit
        op = relax.op
        dtype = _promoted(importer, lhs, rhs)
        if number(rhs) and alpha != 1:
            rhs, alpha = rhs * alpha, 1
        lhs, rhs = _as_dtype(importer, dtype, lhs, rhs)
        if alpha != 1:
            rhs = emit(op.multiply(rhs, relax.const(alpha, dtype)))
        if dtype == "bool":  # (PyTorch's sum and product of bools: or, and)
            logical = {relax.op.add: op.logical_or, relax.op.multiply: op.logical_and}
            if relax_op not in logical:
                raise TypeError(f"{node.target}: subtraction of bools (PyTorch refuses it "
                                f"too): {node.format_node()}")
            return emit(logical[relax_op](lhs, rhs))
        return emit(relax_op(lhs, rhs))
    return convert


def _div_mode(node, importer):
    args = importer.retrieve_args(node)
    x, y = args[0], args[1]
    mode = args[2] if len(args) > 2 else node.kwargs.get("rounding_mode")
    emit = importer.block_builder.emit
    op = relax.op
    integer = lambda v: isinstance(v, relax.Expr) and _kind(str(v.ty.dtype)) == 1  # noqa: E731
    if mode is None and integer(x) and integer(y):  # true division of integers
        return emit(op.divide(op.astype(x, "float32"), op.astype(y, "float32")))
    number = isinstance(y, (int, float)) and not isinstance(y, bool)
    if number and isinstance(x, relax.Expr) and not integer(x):  # the number in x's type
        y = relax.const(y, str(x.ty.dtype))
        if mode == "floor":  # (as PyTorch floors: fixups.exact_floor_divide)
            return emit(op.floor_divide(x, y))
        divided = emit(op.divide(x, y))
        return divided if mode is None else emit(op.trunc(divided))
    if not (integer(x) and number):  # TVM's own converters
        if "Tensor_mode" in str(node.target):
            return importer._div(node)
        return importer._binary_op(relax.op.divide, operator.truediv)(node)
    if isinstance(y, float):  # an integer tensor by a float: a float division
        x = emit(op.astype(x, "float32"))
        divided = emit(op.divide(x, relax.const(y, "float32")))
        if mode is None:
            return divided
        return emit(op.floor(divided) if mode == "floor" else op.trunc(divided))
    dtype = str(x.ty.dtype)
    if y == 0:
        raise ZeroDivisionError(f"integer division by zero: {node.format_node()}")
    if mode is None:  # true division of integers gives floats
        return emit(op.divide(op.astype(x, "float32"), relax.const(float(y), "float32")))
    divisor = relax.const(y, dtype)
    quotient = emit(op.floor_divide(x, divisor))
    if mode == "floor":
        return quotient
    if mode != "trunc":
        raise ValueError(f"div: unknown rounding mode {mode!r}")
    # toward zero: one more where the floor went below a quotient with a remainder
    rest = emit(op.subtract(x, op.multiply(quotient, divisor)))
    below = emit(op.logical_and(op.not_equal(rest, relax.const(0, dtype)),
                                op.less(quotient, relax.const(0, dtype))))
    return emit(op.where(below, op.add(quotient, relax.const(1, dtype)), quotient))


def _floor_divide(node, importer):
    """``x // y`` of a float tensor: ``R.floor_divide`` with a number in the tensor's type
    (``fixups.exact_floor_divide`` floors it as PyTorch does; TVM's converter wrote
    ``floor(x / y)`` for a number); anything else TVM's converter."""
    x, y = importer.retrieve_args(node)[:2]
    if isinstance(x, relax.Expr) and str(x.ty.dtype).startswith("float"):
        if isinstance(y, (int, float)) and not isinstance(y, bool):
            y = relax.const(y, str(x.ty.dtype))
        if isinstance(y, relax.Expr) and str(y.ty.dtype) == str(x.ty.dtype):
            return importer.block_builder.emit(relax.op.floor_divide(x, y))
    return importer._binary_op(relax.op.floor_divide, operator.floordiv)(node)


def _topk(node, importer):
    args = importer.retrieve_args(node)
    x = args[0]
    k = args[1] if len(args) > 1 else node.kwargs.get("k", 1)
    dim = args[2] if len(args) > 2 else node.kwargs.get("dim", -1)
    largest = args[3] if len(args) > 3 else node.kwargs.get("largest", True)
    return importer.block_builder.emit(
        relax.op.topk(x, k=k, axis=dim, largest=largest, ret_type="both", dtype="int64"))


def _split(node, importer):
    from torch import fx

    sizes = node.args[1]
    if isinstance(sizes, fx.Node) or (isinstance(sizes, (list, tuple)) and any(
            isinstance(size, fx.Node) for size in sizes)):
        raise NotImplementedError(
            f"{node.target}: split sizes computed at run time ({node.format_node()}): the "
            f"pieces' shapes would depend on data, which a Relax program cannot express")
    return importer._split(node)


def _unfold(node, importer):
    """``x.unfold(dim, size, step)``: the windows of ``size`` elements every ``step``
    along ``dim``, ``dim`` becoming the windows' axis and the window a new last axis:
    a ``take`` of the windows' indices, then the window's axis moved last."""
    args = importer.retrieve_args(node)
    x, dim, size, step = args[0], int(args[1]), int(args[2]), int(args[3])
    shape = _static_shape(x)
    if shape is None:
        raise NotImplementedError(
            f"{node.target}: windows of an axis whose length is known only at run time "
            f"({node.format_node()})")
    rank = len(shape)
    dim %= max(rank, 1)
    if rank == 0 or size < 0 or step <= 0 or size > shape[dim]:
        raise ValueError(f"{node.target}: no window of {size} every {step} along axis {dim} "
                         f"of a tensor of shape {list(shape)}")
    count = (shape[dim] - size) // step + 1
    index = np.arange(count)[:, None] * step + np.arange(size)[None, :]
    emit = importer.block_builder.emit
    windows = emit(relax.op.take(x, relax.const(index.astype("int64")), axis=dim))
    order = [*range(dim + 1), *range(dim + 2, rank + 1), dim + 1]
    return emit(relax.op.permute_dims(windows, order))


def _grid_sample(node, importer):
    """``grid_sample(x, grid)`` (``grid_sampler_2d``): PyTorch's grid is [N, H_out, W_out,
    2]; TVM's converter passed it as it is to TOPI's ``grid_sample``, which reads
    [N, 2, H_out, W_out], so the output was [N, C, W_out, 2] sampled at the wrong points
    (RT-DETR's deformable attention then failed to import). The grid's last axis is
    moved to the front of its pixels here."""
    args = importer.retrieve_args(node)
    x, grid = args[0], args[1]
    modes = {0: "bilinear", 1: "nearest", 2: "bicubic"}
    paddings = {0: "zeros", 1: "border", 2: "reflection"}
    mode = int(args[2]) if len(args) > 2 else 0
    padding = int(args[3]) if len(args) > 3 else 0
    if mode not in modes or padding not in paddings:
        raise NotImplementedError(f"{node.target}: interpolation {mode}, padding {padding}")
    align = bool(args[4]) if len(args) > 4 else False
    emit = importer.block_builder.emit
    grid = emit(relax.op.permute_dims(grid, [0, 3, 1, 2]))
    shape = _static_shape(x)
    if paddings[padding] == "reflection" and modes[mode] != "bicubic" and \
            shape is not None and str(getattr(grid.ty, "dtype", "")) == "float32":
        # NOTE: TOPI's reflection repeats the reflected point's whole expression in every
        # use (200 KB of TIR for one bilinear sample; TVM's simplifier took 55 s over it).
        # Bicubic reflects each of its 16 taps, not the point: TOPI's still.
        grid, padding = _reflected_grid(emit, grid, shape[3], shape[2], align), 1
    return emit(relax.op.image.grid_sample(
        x, grid, method=modes[mode], layout="NCHW", padding_mode=paddings[padding],
        align_corners=align))


def _reflected_grid(emit, grid, width, height, align):
    """A [N, 2, H, W] grid (x then y, in [-1, 1] units) of the points ``grid_sample``'s
    reflection padding reads, each reflected at the image's edges (its pixel centres
    with ``align``, else its outer borders) as PyTorch reflects it and clipped to the
    image: what border padding then samples is the reflected sample. An axis of one
    pixel with ``align`` reads that pixel (PyTorch's point 0; TOPI divided by zero)."""
    def const(values):
        return relax.const(np.array(values, "float32").reshape(1, 2, 1, 1))

    size = np.array([width, height], "float64")
    # one period of the reflection, in pixels (where an axis has none, any: the clip
    # below puts every point on its one pixel)
    span = np.maximum(size - 1 if align else size, 1)
    low = relax.const(np.float32(0.0 if align else -0.5))
    zero, one, half, two = (relax.const(np.float32(v)) for v in (0, 1, 0.5, 2))
    op = relax.op
    # the pixel coordinate (PyTorch's grid_sampler_unnormalize)
    if align:
        coord = emit(op.multiply(op.multiply(op.add(grid, one), half), const(size - 1)))
    else:
        coord = emit(op.multiply(op.subtract(op.multiply(op.add(grid, one), const(size)),
                                             one), half))
    dist = emit(op.abs(op.subtract(coord, low)))
    extra = emit(op.mod(dist, const(span)))  # fmod, as PyTorch's reflect_coordinates
    flips = emit(op.floor(op.divide(dist, const(span))))
    odd = emit(op.not_equal(op.mod(flips, two), zero))
    point = emit(op.add(op.where(odd, op.subtract(const(span), extra), extra), low))
    point = emit(op.minimum(op.maximum(point, zero), const(size - 1)))
    # back to [-1, 1] units (grid_sampler_unnormalize inverted)
    if align:
        return emit(op.subtract(op.multiply(op.divide(point, const(span)), two), one))
    return emit(op.subtract(op.divide(op.add(op.multiply(point, two), one), const(size)),
                            one))


def _arg_extreme(largest: bool):
    """``argmax``/``argmin`` (``dim`` None for the flattened tensor): the first index of
    the extreme, or of the first NaN where the reduced elements hold one, as PyTorch
    gives (Relax's argmax and argmin skip NaN, and which index they gave for a row with
    one depended on where it was)."""
    def convert(node, importer):
        args = importer.retrieve_args(node)
        x = args[0]
        dim = args[1] if len(args) > 1 else node.kwargs.get("dim")
        keepdim = bool(args[2] if len(args) > 2 else node.kwargs.get("keepdim", False))
        op = relax.op
        emit = importer.block_builder.emit
        ndim = x.ty.ndim
        if dim is None:  # the flattened tensor; keepdim keeps every axis, as ones
            flat = emit(op.reshape(x, [-1]))
            idx = _arg_extreme_axis(flat, 0, False, largest)
            return emit(op.reshape(idx, [1] * ndim)) if keepdim else emit(idx)
        return emit(_arg_extreme_axis(x, int(dim) % max(ndim, 1), keepdim, largest))
    return convert


def _arg_extreme_axis(x, axis: int, keepdims: bool, largest: bool):
    """The indices of ``extreme_with_index`` (its values are left unbound: not computed)."""
    return extreme_with_index(x, axis, largest, keepdims)[1]


def _extreme(largest: bool):
    """``amax``/``amin`` (``dim`` a list, empty for all) and whole-tensor ``max``/``min``,
    NaN propagating as in PyTorch."""
    def convert(node, importer):
        args = importer.retrieve_args(node)
        x = args[0]
        dims = args[1] if len(args) > 1 else node.kwargs.get("dim", [])
        keepdim = bool(args[2] if len(args) > 2 else node.kwargs.get("keepdim", False))
        dims = [dims] if isinstance(dims, int) else list(dims or [])
        axis = dims or None
        op = relax.op
        emit = importer.block_builder.emit
        dtype = str(x.ty.dtype)
        if dtype == "bool":  # (Relax reduces no bools: "any" and "all" in int8)
            return emit(op.astype((op.max if largest else op.min)(
                op.astype(x, "int8"), axis=axis, keepdims=keepdim), "bool"))
        values = (op.max if largest else op.min)(x, axis=axis, keepdims=keepdim)
        return emit(nan_propagating(x, values, axis, keepdim)[0])
    return convert


#: the most nodes one scalar's computation may take to be folded at import
FOLD_NODES = 2000


def fold_constant_items(ep) -> int:
    """Fold into Python numbers the scalars that ``ep`` (a ``torch.export``
    ``ExportedProgram``) reads out of tensors (``x.item()``, ``int(x)``) where the
    tensor depends on the model's own parameters, buffers and constants and on static
    shapes only, not on an input's values: the padding Mimi's and EnCodec-style
    convolutions compute from a registered buffer and the length, for instance.
    ``torch.export`` leaves them as data-dependent scalars; TVM's frontend then makes
    each one a symbolic shape read from a tensor at run time, and ops that need a
    number, a pad's widths, fail ("Expected ``Array<int>``"). The tensor is computed
    here with PyTorch, as the program would compute it (the weights are constants of
    the compiled model anyway). ``ep``'s graph is changed in place (each use of such a
    scalar reads the number instead; the program computes the same); returns how many
    were folded. Scalars read from what depends on an input, or on a random draw, stay
    as they are."""
    import torch
    from torch.export.graph_signature import InputKind

    sig = ep.graph_signature
    state = {**dict(ep.state_dict), **dict(ep.constants)}
    known = {}
    for spec in sig.input_specs:
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR) \
                and spec.target in state:
            known[spec.arg.name] = state[spec.target]
    reads = (torch.ops.aten.item.default, torch.ops.aten._local_scalar_dense.default)
    graph = ep.graph
    memo = {}
    unknown = object()  # (None is an argument like any other)

    def value(node, budget):
        """``node``'s value, or ``unknown`` where it depends on an input's data (or is
        too far to compute)."""
        if not isinstance(node, torch.fx.Node):
            return node
        if node in memo:
            return memo[node]
        budget[0] -= 1
        out = unknown
        meta = node.meta.get("val")
        if isinstance(meta, (bool, int, float)) and not isinstance(meta, torch.SymInt):
            out = meta
        elif node.op == "placeholder":
            out = known.get(node.name, unknown)
        elif node.op == "call_function" and budget[0] > 0 and \
                torch.Tag.nondeterministic_seeded not in getattr(node.target, "tags", ()):
            # (a random draw stays one: each run of the program draws again)
            args = torch.fx.node.map_aggregate(
                (node.args, node.kwargs), lambda a: value(a, budget)
                if isinstance(a, torch.fx.Node) else a)
            flat = []
            torch.fx.node.map_aggregate(args, flat.append)
            if all(a is not unknown for a in flat):
                try:
                    with torch.no_grad():
                        out = node.target(*args[0], **args[1])
                except Exception:  # noqa: BLE001 - not computable here: left as it is
                    out = unknown
        memo[node] = out
        return out

    folded = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in reads:
            continue
        number = value(node.args[0], [FOLD_NODES])
        if not isinstance(number, torch.Tensor) or number.numel() != 1:
            continue
        number = number.item()
        for user in list(node.users):
            user.args = torch.fx.node.map_arg(user.args, lambda a: number if a is node else a)
            user.kwargs = torch.fx.node.map_arg(user.kwargs,
                                                lambda a: number if a is node else a)
        folded += 1
    if folded:
        graph.eliminate_dead_code()
        ep.graph_module.recompile()
    return folded


def from_exported_program(ep, **kwargs):
    """TVM's ``from_exported_program`` with tirbyoc's converters (``torch_converters()``,
    under any of the caller's own in ``custom_convert_map``), after the scalars that
    depend on the model's constants only are folded (``fold_constant_items``: ``ep``'s
    graph is changed in place). The weights are constants unless
    ``keep_params_as_input=True`` is passed."""
    from tvm.relax.frontend.torch import from_exported_program as tvm_import

    fold_constant_items(ep)
    kwargs["custom_convert_map"] = {**torch_converters(),
                                    **(kwargs.get("custom_convert_map") or {})}
    return tvm_import(ep, **kwargs)
