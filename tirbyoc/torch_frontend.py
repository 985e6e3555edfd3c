"""Converters for ``torch.export`` programs that TVM 0.27's PyTorch frontend rejects or gets wrong.

TVM's ``from_exported_program`` takes extra converters by ATen name
(``custom_convert_map``); ``torch_converters()`` gives tirbyoc's::

    from tvm.relax.frontend.torch import from_exported_program
    mod = from_exported_program(ep, custom_convert_map=tirbyoc.torch_converters())

* ``min.dim`` (``x.min(dim)``: values and indices) has no converter ("Unsupported
  function types ['min.dim']"). It becomes a ``min`` and an ``argmin`` over the axis, as
  ``fixups.fix_topk_one`` makes TVM's own ``max.dim`` (a ``topk`` of one): ties give
  the first index and a NaN wins, as PyTorch does (``fixups.extreme_with_index``).
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
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax

from .bindings import same_dims, shape_of
from .fixups import extreme_with_index


def torch_converters() -> dict:
    """ATen name -> converter, for ``from_exported_program(..., custom_convert_map=...)``."""
    return {"min.dim": _min_dim, "index.Tensor": _index_tensor,
            "arange.start_step": _arange_start_step, "log.default": _log}


def _min_dim(node, importer):
    x = importer.env[node.args[0]]
    dim = node.args[1]
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    emit = importer.block_builder.emit
    values, indices = extreme_with_index(x, dim, largest=False, keepdims=bool(keepdim))
    return emit(relax.Tuple([emit(values), emit(relax.op.astype(indices, "int64"))]))


def _static_shape(expr):
    """The dimensions as ints, or None where one is symbolic or unknown."""
    dims = shape_of(expr)
    if dims is None or not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
        return None
    return tuple(int(d) for d in dims)


def _index_tensor(node, importer):
    """``data[indices]`` with PyTorch's advanced indexing: the index tensors (``None``
    for a whole axis) broadcast together into the result's leading axes, or, where
    the indexed axes are adjacent, into the place of the first of them."""
    args = importer.retrieve_args(node)
    data, indices = args[0], list(args[1])
    axes = [axis for axis, index in enumerate(indices) if index is not None]
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
