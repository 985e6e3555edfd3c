"""Strided views: what a chain of Relax layout operators does to a tensor's memory,
so that a kernel can read (or write) the tensor before (or after) the chain in place.

A ``Layout`` says where each element of a tensor lives inside another, contiguous
tensor, its ``base``: element ``[i0, i1, ...]`` is ``base.flat[offset + i0 * s0 + i1 *
s1 + ...]`` (``dims`` holds the (extent, stride) pairs). ``R.reshape``,
``R.permute_dims``, ``R.expand_dims``, ``R.squeeze``, ``R.broadcast_to``, ``R.take`` with
a constant index, ``R.strided_slice`` with constant bounds and one part of ``R.split``
only move or regroup elements, so their results are layouts of their inputs' base: a
kernel given the base pointer, the offset and the strides reads the result without the
copy TVM would otherwise make.

``trace_input`` walks back from an operand through such operators (and, where asked,
through multiplications by a scalar constant, returned as a factor). ``trace_output``
walks forward from a result through operators each used once, to the tensor they make,
and gives the result's layout inside it: the kernel then writes that tensor directly.

Every step either gives the exact layout or refuses (``None``); a reshape is followed
only where it keeps the strides regular (as numpy's reshape without a copy). Extents may
be symbolic; what cannot be proven is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import _tvm as T
from .bindings import is_op, scalar_constant, scaled_operand, shape_of

R = T.relax_ns

# one-to-one regroupings of the elements, and views that select or repeat some
_REGROUPING = ("relax.reshape", "relax.permute_dims", "relax.expand_dims", "relax.squeeze",
               "relax.broadcast_to")
VIEW_OPS = _REGROUPING + ("relax.take", "relax.strided_slice")


@dataclass(frozen=True)
class Layout:
    base: object          # the Relax variable (or expression) holding the elements
    offset: object        # PrimExpr, elements
    dims: tuple           # ((extent, stride), ...) PrimExprs, one per dimension


def _eq(a, b) -> bool:
    return T.analyzer().can_prove_equal(a, b)


def _simplify(x):
    return T.analyzer().simplify(x)


def _i64(x):
    return T.const(x, "int64") if isinstance(x, int) else T.as_int64(x)


def contiguous(expr) -> Layout | None:
    """``expr`` as its own base: row-major strides, offset 0."""
    shape = shape_of(expr)
    if shape is None:
        return None
    dims, stride = [], _i64(1)
    for extent in reversed(shape):
        dims.append((_i64(extent), stride))
        stride = _simplify(stride * _i64(extent))
    return Layout(expr, _i64(0), tuple(reversed(dims)))


def reshape_dims(dims, shape):
    """The (extent, stride) pairs of ``dims`` reshaped (row-major) to ``shape``, or None
    where the result is not one strided view of the same memory."""
    old = []
    for e, st in dims:
        if _eq(e, 1):
            continue
        if old and _eq(old[-1][1], _simplify(e * st)):
            # directly follows the dimension before it in memory: one dimension
            old[-1] = (_simplify(old[-1][0] * e), st)
        else:
            old.append((e, st))
    out, i, cur = [], 0, None
    for extent in (_i64(x) for x in shape):
        if _eq(extent, 1):
            out.append((extent, _i64(0)))
            continue
        if cur is None:
            if i == len(old):
                return None
            cur, i = old[i], i + 1
        e, st = cur
        if _eq(e, extent):
            out.append((extent, st))
            cur = None
        elif _eq(T.floormod(e, extent), 0):
            # the new dimension is the outer part of the old one
            inner = _simplify(T.floordiv(e, extent))
            out.append((extent, _simplify(st * inner)))
            cur = (inner, st)
        else:
            # it spans more than one old (coalesced) dimension: no view
            return None
    if cur is not None or i != len(old):
        return None
    return tuple(out)


def _axes(attr, ndim):
    return [int(a) % ndim for a in attr]


def _split_part(call, index, values):
    """(start, extent, axis) of part ``index`` of ``R.split``, or None."""
    shape = shape_of(call.args[0])
    if shape is None:
        return None
    axis = int(call.attrs.axis) % len(shape)
    total = _i64(shape[axis])
    sections = call.attrs.indices_or_sections
    if isinstance(sections, T.IntImm):
        parts = int(sections)
        if parts <= 0 or not _eq(T.floormod(total, parts), 0):
            return None
        size = _simplify(T.floordiv(total, parts))
        return _simplify(size * index), size, axis
    bounds = [_i64(0)] + [_i64(int(x)) for x in sections] + [total]
    if index + 1 >= len(bounds):
        return None
    return bounds[index], _simplify(bounds[index + 1] - bounds[index]), axis


def _static_slice(call, ndim, out_shape):
    """[(axis, begin, step)] of a ``strided_slice`` with constant, non-negative axes and
    begins and positive steps (its extents are its result's), else None."""
    args = list(call.args[1:])
    if out_shape is None or len(args) < 3:
        return None
    try:
        axes, begins = ([int(x.value) for x in a.fields] if isinstance(a, R.Tuple)
                        else [int(x) for x in a.values] for a in args[:2])
        steps = ([1] * len(axes) if len(args) < 4 else
                 [int(x.value) for x in args[3].fields] if isinstance(args[3], R.Tuple)
                 else [int(x) for x in args[3].values])
    except (AttributeError, TypeError, ValueError):
        return None  # a symbolic axis, begin or step
    if len(begins) != len(axes) or len(steps) != len(axes) or \
            any(a < 0 or a >= ndim for a in axes) or any(x < 0 for x in begins) or \
            any(x < 1 for x in steps) or len(set(axes)) != len(axes):
        return None
    return list(zip(axes, begins, steps))


def forward(layout: Layout, value, values) -> Layout | None:
    """The layout of ``value`` (a view operator applied to the tensor ``layout``
    describes, or one part of a split of it), else None."""
    dims = list(layout.dims)
    offset = layout.offset
    out_shape = shape_of(value)
    if isinstance(value, R.TupleGetItem):
        split = values.get(value.tuple_value) if isinstance(value.tuple_value, R.Var) else None
        if not is_op(split, "relax.split"):
            return None
        part = _split_part(split, int(value.index), values)
        if part is None:
            return None
        start, extent, axis = part
        e, s = dims[axis]
        dims[axis] = (extent, s)
        offset = _simplify(offset + start * s)
    elif is_op(value, "relax.reshape"):
        if out_shape is None:
            return None
        new = reshape_dims(dims, out_shape)
        if new is None:
            return None
        dims = list(new)
    elif is_op(value, "relax.permute_dims"):
        axes = value.attrs.axes
        order = list(reversed(range(len(dims)))) if axes is None else _axes(axes, len(dims))
        dims = [dims[a] for a in order]
    elif is_op(value, "relax.expand_dims"):
        ndim = len(dims) + len(value.attrs.axis)
        for a in sorted(_axes(value.attrs.axis, ndim)):
            dims.insert(a, (_i64(1), _i64(0)))
    elif is_op(value, "relax.squeeze"):
        axes = value.attrs.axis
        drop = ([a for a, d in enumerate(dims) if _eq(d[0], 1)] if axes is None
                else _axes(axes, len(dims)))
        if not all(_eq(dims[a][0], 1) for a in drop):
            return None
        dims = [d for a, d in enumerate(dims) if a not in drop]
    elif is_op(value, "relax.broadcast_to"):
        if out_shape is None or len(out_shape) < len(dims):
            return None
        lead = len(out_shape) - len(dims)
        new = [(_i64(x), _i64(0)) for x in out_shape[:lead]]
        for (e, s), x in zip(dims, out_shape[lead:]):
            if _eq(e, x):
                new.append((e, s))
            elif _eq(e, 1):
                new.append((_i64(x), _i64(0)))
            else:
                return None
        dims = new
    elif is_op(value, "relax.strided_slice"):
        sliced = _static_slice(value, len(dims), out_shape)
        if sliced is None:
            return None
        for axis, begin, step in sliced:
            e, s = dims[axis]
            extent = _i64(out_shape[axis])
            if not T.analyzer().can_prove(_i64(begin) + (extent - 1) * step < e):
                return None
            dims[axis] = (extent, _simplify(s * step))
            offset = _simplify(offset + _i64(begin) * s)
    elif is_op(value, "relax.take"):
        index = scalar_constant(value.args[1], values, "iu")
        if index is None or value.attrs.axis is None:
            return None
        axis = int(value.attrs.axis) % len(dims)
        e, s = dims[axis]
        if index < 0 or not T.analyzer().can_prove(_i64(index) < e):
            return None
        offset = _simplify(offset + _i64(index) * s)
        del dims[axis]
    else:
        return None
    if out_shape is None or len(out_shape) != len(dims) or not all(
            _eq(_i64(x), d[0]) for x, d in zip(out_shape, dims)):
        return None
    return Layout(layout.base, offset, tuple(dims))


def trace_input(f, var, scale_ok=False):
    """``var``'s layout inside the furthest tensor before it that it is a view of, and
    the product of the scalar constants it was multiplied by on the way (only with
    ``scale_ok``; else a multiplication ends the walk). ``f``: the function's
    ``Bindings``. Returns (layout, factor); the layout is ``var`` itself, factor 1, when
    nothing could be walked through."""
    steps, cur = [], var     # steps[i]: (view or None for a multiply, its input, factor)
    while isinstance(cur, R.Var):
        value = f.producer(cur)
        if value is None:
            break
        if scale_ok and is_op(value, "relax.multiply"):
            scaled = scaled_operand(value, f.values, "f")
            if scaled is None or not _same_shape(scaled[0], cur):
                break
            a, c = scaled
            steps.append((None, a, c))
            cur = a
            continue
        if isinstance(value, R.TupleGetItem):
            split = f.producer(value.tuple_value) if isinstance(value.tuple_value,
                                                                 R.Var) else None
            if not is_op(split, "relax.split"):
                break
            steps.append((value, split.args[0], 1.0))
            cur = split.args[0]
            continue
        if not is_op(value, *VIEW_OPS):
            break
        steps.append((value, value.args[0], 1.0))
        cur = value.args[0]
    # the furthest input from which every step forward can be followed
    for start in range(len(steps) - 1, -1, -1):
        layout, factor = contiguous(steps[start][1]), 1.0
        for view, _, c in reversed(steps[:start + 1]):
            if layout is None:
                break
            if view is None:
                factor *= c
            else:
                layout = forward(layout, view, f.values)
        if layout is not None:
            return layout, factor
    return contiguous(var), 1.0


def _same_shape(a, b) -> bool:
    sa, sb = shape_of(a), shape_of(b)
    return sa is not None and sb is not None and len(sa) == len(sb) and all(
        _eq(x, y) for x, y in zip(sa, sb))


def inverse(layout: Layout, value, src_shape) -> Layout | None:
    """Given the layout of a view ``value``'s result inside some tensor, the layout of its
    input (of shape ``src_shape``) in the same tensor; None where the view is not a
    one-to-one regrouping (a broadcast, a take, a split)."""
    dims = list(layout.dims)
    if is_op(value, "relax.reshape"):
        new = reshape_dims(dims, src_shape)
        return None if new is None else Layout(layout.base, layout.offset, new)
    if is_op(value, "relax.permute_dims"):
        axes = value.attrs.axes
        order = list(reversed(range(len(dims)))) if axes is None else _axes(axes, len(dims))
        src = [None] * len(dims)
        for i, a in enumerate(order):
            src[a] = dims[i]
        return Layout(layout.base, layout.offset, tuple(src))
    if is_op(value, "relax.expand_dims"):
        added = set(_axes(value.attrs.axis, len(dims)))
        return Layout(layout.base, layout.offset,
                      tuple(d for a, d in enumerate(dims) if a not in added))
    if is_op(value, "relax.squeeze"):
        axes = value.attrs.axis
        ndim = len(src_shape)
        drop = ([a for a in range(ndim) if _eq(_i64(src_shape[a]), 1)] if axes is None
                else _axes(axes, ndim))
        it = iter(dims)
        return Layout(layout.base, layout.offset,
                      tuple((_i64(1), _i64(0)) if a in drop else next(it)
                            for a in range(ndim)))
    if is_op(value, "relax.broadcast_to"):
        if len(src_shape) == len(dims) and all(_eq(_i64(x), d[0])
                                               for x, d in zip(src_shape, dims)):
            return layout
    return None


def trace_output(f, var):
    """Forward from ``var`` through view operators, each variable on the way used once
    and by the next one only: (the last such variable, ``var``'s layout inside it). The
    layout is ``var`` itself when there is no such chain."""
    chain, cur = [], var
    while True:
        user = f.only_user(cur)
        if user is None or not is_op(user[1], *_REGROUPING) or not user[1].args[0].same_as(cur):
            break
        chain.append(user)
        cur = user[0]
    while chain:
        final = chain[-1][0]
        layout = contiguous(final)
        for view_var, value in reversed(chain):
            src = value.args[0]
            layout = inverse(layout, value, shape_of(src)) if layout is not None else None
        if layout is not None:
            return final, layout
        chain.pop()
    return var, contiguous(var)
