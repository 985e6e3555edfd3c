"""Fourier transforms of ``torch.export`` programs, as products with cosine and sine tables.

Relax has no complex type, and TVM's importer rejects PyTorch's FFTs ("Unsupported
function types ['_fft_c2c.default', ...]": FNet mixes its tokens with ``fftn(x).real``).
Here a complex tensor is carried as two real ones, its real and imaginary parts (the
imaginary one absent while it is zero), from where it is made to where it is read:

* made by ``_to_copy`` of a real tensor to a complex type, or by ``_fft_r2c``
  (``rfft``; ``fft`` of a real tensor);
* transformed by ``_fft_c2c`` (``fft``, ``ifft``, ``fftn``...);
* read by ``view_as_real`` (``.real``, ``.imag``: a ``select`` of its last axis then
  reads the part itself), ``abs`` (the magnitude) and ``_fft_c2r`` (``irfft``).

A complex tensor that anything else reads is an error naming that op: no complex value
ever reaches one of TVM's converters, which would take the real part for the whole.

The discrete Fourier transform of length n along an axis is a product with an n x n
table, ``cos(2 pi jk / n)`` and ``sin(2 pi jk / n)`` (jk taken modulo n, computed in
float64, stored in float32: each entry within half a float32 ulp), which tirbyoc's
product kernels then run; several axes are transformed one after the other, the
normalization (``norm=``) applied per axis. The products cost O(n^2) per row where an
FFT costs O(n log n): FNet's mixing of 128 tokens x 768 features is 4 products, about
0.35 GFLOP a layer.
"""

from __future__ import annotations

import math

import numpy as np
from tvm import relax

from .bindings import static_dims

# the ops that read a complex tensor here; anything else reading one is an error
_COMPLEX_READERS = ("_fft_c2c", "_fft_c2r", "view_as_real", "abs")


def converters() -> dict:
    """ATen name -> converter (``torch_frontend.torch_converters`` adds them)."""
    return {"_to_copy.default": _to_copy, "_fft_r2c.default": _fft_r2c,
            "_fft_c2c.default": _fft_c2c, "_fft_c2r.default": _fft_c2r,
            "view_as_real.default": _view_as_real, "select.int": _select,
            "abs.default": _abs}


def _state(importer) -> dict:
    """tirbyoc's per-import state on the importer: complex tensors by node, tables by
    (n, kind, width, scale), TVM's own converters."""
    state = getattr(importer, "_tirbyoc_fft", None)
    if state is None:
        state = {"complex": {}, "tables": {}, "default": importer.create_convert_map()}
        importer._tirbyoc_fft = state
    return state


def _is_complex(node) -> bool:
    val = node.meta.get("val") if hasattr(node, "meta") else None
    return val is not None and getattr(val, "is_complex", lambda: False)()


def _check_readers(node):
    """Every op reading the complex tensor ``node`` is one this module converts."""
    for user in node.users:
        name = getattr(user.target, "__name__", str(user.target)).split(".")[0]
        if name not in _COMPLEX_READERS:
            raise NotImplementedError(
                f"{user.target} of a complex tensor ({user.format_node()}): complex values "
                f"are converted only through FFTs, view_as_real (.real, .imag), abs and "
                f"irfft")


def _complex_of(node, importer):
    """The (real, imaginary or None) parts of the complex tensor made at ``node``."""
    parts = _state(importer)["complex"].get(node)
    if parts is None:
        raise NotImplementedError(f"a complex tensor not made by a cast or an FFT: "
                                  f"{node.format_node()}")
    return parts


def _made(node, importer, parts):
    """Record the complex tensor ``parts`` made at ``node``; its value in the importer's
    map is the real part, which only this module's converters read."""
    _check_readers(node)
    _state(importer)["complex"][node] = parts
    return parts[0]


def _to_copy(node, importer):
    if not _is_complex(node):
        return _state(importer)["default"]["_to_copy.default"](node)
    src = node.args[0]
    if _is_complex(src):
        return _made(node, importer, _complex_of(src, importer))
    x = importer.env[src]
    dtype = "float64" if "128" in str(node.meta["val"].dtype) else "float32"
    if str(x.ty.dtype) != dtype:
        x = importer.block_builder.emit(relax.op.astype(x, dtype))
    return _made(node, importer, (x, None))


def _table(importer, n: int, kind: str, dtype: str, width: int | None = None,
           weights=None, scale: float = 1.0):
    """The constant [n or len(weights), width or n] table of cos or sin(2 pi jk / n),
    row k scaled by ``weights[k]`` (the half spectrum's counts) and by ``scale``; one
    constant per distinct table in a module."""
    rows = n if weights is None else len(weights)
    width = n if width is None else width
    key = (n, kind, rows, width, tuple(weights) if weights is not None else None, scale,
           dtype)
    tables = _state(importer)["tables"]
    if key not in tables:
        jk = np.outer(np.arange(rows, dtype=np.int64), np.arange(width, dtype=np.int64)) % n
        angle = 2.0 * np.pi * jk / n
        value = np.cos(angle) if kind == "cos" else np.sin(angle)
        if weights is not None:
            value = value * np.asarray(weights, np.float64)[:, None]
        tables[key] = relax.const((value * scale).astype(dtype))
    return tables[key]


def _along(importer, x, axis: int, table):
    """``x`` contracted along ``axis`` with ``table`` ([len, width]): the axis becomes
    ``width`` long."""
    bb = importer.block_builder
    ndim = x.ty.ndim
    axis %= ndim
    if axis == ndim - 1:
        return bb.emit(relax.op.matmul(x, table))
    order = [a for a in range(ndim) if a != axis] + [axis]
    moved = bb.emit(relax.op.matmul(bb.emit(relax.op.permute_dims(x, order)), table))
    back = list(np.argsort(order))
    return bb.emit(relax.op.permute_dims(moved, [int(a) for a in back]))


def _combine(importer, a, b, subtract: bool):
    if a is None:
        return None if b is None else (
            importer.block_builder.emit(relax.op.negative(b)) if subtract else b)
    if b is None:
        return a
    op = relax.op.subtract if subtract else relax.op.add
    return importer.block_builder.emit(op(a, b))


def _scale(normalization: int, n: int) -> float:
    """ATen's normalization: 0 none, 1 by 1/sqrt(n), 2 by 1/n."""
    return {0: 1.0, 1: 1.0 / math.sqrt(n), 2: 1.0 / n}[int(normalization)]


def _dft(importer, re, im, axis: int, n: int, forward: bool, scale: float, width=None):
    """One complex DFT of length n along ``axis`` (``width``: the first outputs only).
    Forward: (R + iI)(C - iS) = (RC + IS) + i(IC - RS); inverse: the signs of S flip."""
    dtype = str(re.ty.dtype)
    c = _table(importer, n, "cos", dtype, width, scale=scale)
    s = _table(importer, n, "sin", dtype, width, scale=scale)
    rc, rs = _along(importer, re, axis, c), _along(importer, re, axis, s)
    ic = None if im is None else _along(importer, im, axis, c)
    is_ = None if im is None else _along(importer, im, axis, s)
    if forward:
        return _combine(importer, rc, is_, False), _combine(importer, ic, rs, True)
    return _combine(importer, rc, is_, True), _combine(importer, ic, rs, False)


def _sizes(x, dims, node):
    """The static lengths of ``x`` along ``dims``; symbolic ones are an error naming
    ``node`` (a table needs its length)."""
    shape = static_dims(x)
    if shape is None:
        raise NotImplementedError(f"{node.target} of a tensor of symbolic shape (the "
                                  f"transform's tables need its lengths): "
                                  f"{node.format_node()}")
    return [shape[d % len(shape)] for d in dims]


def _fft_r2c(node, importer):
    """``_fft_r2c(x, dim, normalization, onesided)``: the last axis of ``dim`` first
    (its first n // 2 + 1 outputs when onesided), then the others."""
    x = importer.env[node.args[0]]
    dims, normalization, onesided = list(node.args[1]), node.args[2], bool(node.args[3])
    sizes = _sizes(x, dims, node)
    re, im = x, None
    last, n = dims[-1], sizes[-1]
    re, im = _dft(importer, re, im, last, n, True, _scale(normalization, n),
                  width=n // 2 + 1 if onesided else None)
    for axis, n in zip(dims[:-1], sizes[:-1]):
        re, im = _dft(importer, re, im, axis, n, True, _scale(normalization, n))
    return _made(node, importer, (re, im))


def _fft_c2c(node, importer):
    """``_fft_c2c(x, dim, normalization, forward)``."""
    re, im = _complex_of(node.args[0], importer)
    dims, normalization, forward = list(node.args[1]), node.args[2], bool(node.args[3])
    for axis, n in zip(dims, _sizes(re, dims, node)):
        re, im = _dft(importer, re, im, axis, n, forward, _scale(normalization, n))
    return _made(node, importer, (re, im))


def _fft_c2r(node, importer):
    """``_fft_c2r(x, dim, normalization, last_dim_size)`` (``irfft``): the inverse of a
    half spectrum along the last axis of ``dim``, after the inverse c2c along the others.
    x_j = sum over the half spectrum of w_k (R_k cos - I_k sin)(2 pi jk / n), w_k 2 for
    the terms whose mirror image is left out, else 1 (the imaginary parts of the first
    and, n even, the middle term meet a sine of 0, as PyTorch ignores them)."""
    re, im = _complex_of(node.args[0], importer)
    dims, normalization, n = list(node.args[1]), node.args[2], int(node.args[3])
    for axis, m in zip(dims[:-1], _sizes(re, dims[:-1], node)):
        re, im = _dft(importer, re, im, axis, m, False, _scale(normalization, m))
    half = _sizes(re, dims[-1:], node)[0]
    weights = [1.0 if k == 0 or 2 * k == n else 2.0 for k in range(half)]
    if half > n // 2 + 1:
        weights = weights[:n // 2 + 1]  # (PyTorch reads the first n // 2 + 1 only)
        re = importer.block_builder.emit(relax.op.strided_slice(
            re, [dims[-1]], [0], [n // 2 + 1]))
        im = None if im is None else importer.block_builder.emit(relax.op.strided_slice(
            im, [dims[-1]], [0], [n // 2 + 1]))
    elif half < n // 2 + 1:
        raise NotImplementedError(f"{node.target}: a half spectrum shorter than n // 2 + 1 "
                                  f"(zero padded by PyTorch): {node.format_node()}")
    dtype = str(re.ty.dtype)
    scale = _scale(normalization, n)
    out = _along(importer, re, dims[-1],
                 _table(importer, n, "cos", dtype, n, weights=weights, scale=scale))
    if im is not None:
        sine = _along(importer, im, dims[-1],
                      _table(importer, n, "sin", dtype, n, weights=weights, scale=scale))
        out = importer.block_builder.emit(relax.op.subtract(out, sine))
    return out


def _view_as_real(node, importer):
    re, im = _complex_of(node.args[0], importer)
    bb = importer.block_builder
    if im is None:
        im = bb.emit(relax.op.zeros_like(re))
    return bb.emit(relax.op.stack([re, im], axis=-1))


def _select(node, importer):
    """``select`` of a ``view_as_real``'s last axis (``.real``, ``.imag``): that part
    itself, so that the other is not computed for nothing."""
    src = node.args[0]
    if getattr(src, "target", None) is not None and \
            getattr(src.target, "__name__", "") == "view_as_real.default":
        dim, index = int(node.args[1]), int(node.args[2])
        ndim = len(src.meta["val"].shape)
        if dim % ndim == ndim - 1:
            re, im = _complex_of(src.args[0], importer)
            if index % 2 == 0:
                return re
            return im if im is not None else importer.block_builder.emit(
                relax.op.zeros_like(re))
    return _state(importer)["default"]["select.int"](node)


def _abs(node, importer):
    """``abs`` of a complex tensor: its magnitude; of a real one, TVM's converter."""
    if not _is_complex(node.args[0]):
        return _state(importer)["default"]["abs.default"](node)
    re, im = _complex_of(node.args[0], importer)
    bb = importer.block_builder
    if im is None:
        return bb.emit(relax.op.abs(re))
    return bb.emit(relax.op.sqrt(bb.emit(relax.op.add(
        bb.emit(relax.op.multiply(re, re)), bb.emit(relax.op.multiply(im, im))))))

