"""Python side of the tirbyoc C kernel library (sources in ``kernels/``).

* :func:`load` - the cffi ``(ffi, lib)`` pair of the compiled kernels;
* :func:`static_library_path` / :func:`static_library` - the relocatable
  object ``libtirbyoc_kernels.o`` that TVM links into generated code
  (attach ``static_library()`` to an IRModule's ``external_mods``);
* :func:`exported_symbols` - the C function names the library exports;
* :func:`dense` - a numpy convenience wrapper around the dense kernels
  (W as ``[N, K]``, ``[K, N]`` or pre-packed by :func:`pack_weight`);
* :func:`isa` / :func:`set_isa` / :func:`available_isas` and
  :func:`num_threads` / :func:`set_num_threads` - the library's
  process-wide instruction-set and thread-count settings;
  :func:`cache_sizes` - the caches its blocking is derived from (and the
  environment variable TIRBYOC_SPIN_US, how long an idle worker spins before
  it sleeps, checked by :func:`load`).

TVM is imported lazily (only by :func:`static_library`), so the kernels can
be used and tested without paying for a TVM import.
"""

import functools
import hashlib
import math
import os
import re
from dataclasses import dataclass

import numpy as np

# The longest TIRBYOC_SPIN_US the kernels take (threads.c, TB_SPIN_US_MAX): 1 s.
SPIN_US_MAX = 1_000_000
STATIC_OBJECT_NAME = "libtirbyoc_kernels.o"
SYMBOL_PREFIX = "tirbyoc_"

# Mirrors enum tirbyoc_status in kernels/tirbyoc_kernels.h.
TIRBYOC_OK = 0
TIRBYOC_EINVAL = 1
TIRBYOC_ESIZE = 2
TIRBYOC_ESTRIDE = 3
TIRBYOC_ENULL = 4
TIRBYOC_EEPILOGUE = 5
TIRBYOC_ENOMEM = 6

# Mirrors enum tirbyoc_epilogue_op (codes of an epilogue chain, 4 bits each).
EPILOGUE_OPS = {"bias": 1, "relu": 2, "relu6": 3, "gelu_erf": 4, "gelu_tanh": 5, "silu": 6,
                "sigmoid": 7, "tanh": 8, "scale": 9, "divide": 10, "residual": 11,
                "hardswish": 12, "hardsigmoid": 13}
UNARY_OPS = ("relu", "relu6", "gelu_erf", "gelu_tanh", "silu", "sigmoid", "tanh", "hardswish",
             "hardsigmoid")
# Mirrors enum tirbyoc_b_layout.
B_LAYOUTS = {"nn": 0, "nt": 1, "packed": 2}

_BUILD_HINT = (
    "the tirbyoc C kernel library was not built (or is out of date); "
    "run `pip install -e .` in the project root"
)


class KernelLibraryError(ImportError):
    """The compiled kernel library (cffi extension or static object) is missing."""


@functools.lru_cache(maxsize=None)
def load():
    """Return the cffi ``(ffi, lib)`` of the compiled kernel library."""
    try:
        from . import _kernels
    except ImportError as exc:
        raise KernelLibraryError(f"{_BUILD_HINT} ({exc})") from exc
    if not hasattr(_kernels.lib, "tirbyoc_cache_sizes"):  # built from older sources
        raise KernelLibraryError(_BUILD_HINT)
    if _read_caches(_kernels.ffi, _kernels.lib)[0] != TIRBYOC_OK:
        raise ValueError(f"TIRBYOC_CACHES={os.environ.get('TIRBYOC_CACHES')!r}: expected the "
                         "L1d and L2 sizes as 'L1,L2', in bytes or with K or M (e.g. 48K,2M), "
                         "L1 from 8K to 1M, L2 from L1 to 64M")
    spin = os.environ.get("TIRBYOC_SPIN_US", "")
    if spin and not (re.fullmatch("[0-9]+", spin) and int(spin) <= SPIN_US_MAX):
        raise ValueError(f"TIRBYOC_SPIN_US={spin!r}: expected how long an idle worker "
                         f"spins before it sleeps, in microseconds, 0 to {SPIN_US_MAX}")
    return _kernels.ffi, _kernels.lib


def _read_caches(ffi, lib):
    """(status, sizes) of ``tirbyoc_cache_sizes``: L1d bytes and ways, L2 bytes and ways,
    line bytes."""
    sizes = ffi.new("int64_t[5]")
    status = lib.tirbyoc_cache_sizes(sizes)
    return status, list(sizes)


def static_library_path():
    """Path of ``libtirbyoc_kernels.o`` (built next to this package)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), STATIC_OBJECT_NAME)
    if not os.path.isfile(path):
        raise KernelLibraryError(f"{_BUILD_HINT} (missing {path})")
    return path


@functools.lru_cache(maxsize=None)
def _exported_symbols():
    # Taken from the compiled extension rather than from the header, which a
    # regular (non-editable) install does not ship. Both artifacts are built
    # from the same sources in the same build, so the sets agree.
    _, lib = load()
    return tuple(sorted(
        name for name in dir(lib)
        if name.startswith(SYMBOL_PREFIX) and callable(getattr(lib, name))
    ))


def exported_symbols():
    """Names of all C functions exported by the kernel library."""
    return list(_exported_symbols())


def status_message(status):
    """The library's description of a status code (``tirbyoc_status_string``)."""
    ffi, lib = load()
    return ffi.string(lib.tirbyoc_status_string(int(status))).decode()


@functools.lru_cache(maxsize=None)
def _error_statuses():
    _, lib = load()
    return tuple((s, status_message(s)) for s in range(1, lib.TIRBYOC_STATUS_COUNT))


def error_statuses():
    """``{status: description}`` of every error status the kernels can return (read once;
    every offloaded block's status checks use it)."""
    return dict(_error_statuses())


def _check(func, status):
    """Raises RuntimeError naming the kernel (a function or its name) for an error status."""
    if status != TIRBYOC_OK:
        name = func if isinstance(func, str) else func.__name__
        raise RuntimeError(f"{name} failed: {status_message(status)} (status {status})")


@functools.lru_cache(maxsize=None)
def static_library():
    """The kernel object as a TVM static-library module (cached).

    Attach it to ``mod.with_attr("external_mods", [...])`` so that TVM links
    ``libtirbyoc_kernels.o`` into the module it builds.
    """
    import tvm  # deferred: importing TVM is slow

    return tvm.runtime.load_static_library(static_library_path(), exported_symbols())


@functools.lru_cache(maxsize=None)
def make_symbols_global():
    """Make the kernel symbols visible to code that TVM JIT-compiles in this process.

    Python loads the cffi extension with RTLD_LOCAL; TVM's in-process LLVM JIT of a
    TIR-only module resolves ``call_extern`` symbols among the process's global symbols,
    so the extension is loaded once more with RTLD_GLOBAL. (Relax builds link
    ``static_library()`` instead and do not need this.)
    """
    import ctypes

    try:
        from . import _kernels
    except ImportError as exc:
        raise KernelLibraryError(f"{_BUILD_HINT} ({exc})") from exc
    return ctypes.CDLL(_kernels.__file__, mode=ctypes.RTLD_GLOBAL)


def _row_stride(arr, name):
    """Row stride in elements of a 2-D float32 array with contiguous rows."""
    if arr.dtype != np.float32:
        raise TypeError(f"{name} must be float32, got {arr.dtype}")
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {arr.shape}")
    rows, cols = arr.shape
    if cols > 1 and arr.strides[1] != arr.itemsize:
        raise ValueError(f"{name} must have contiguous rows (inner stride 1)")
    if rows <= 1:
        # The stride of a single row is never used; numpy may report anything.
        return cols
    if arr.strides[0] % arr.itemsize or arr.strides[0] < cols * arr.itemsize:
        raise ValueError(f"{name} has an unsupported row stride {arr.strides[0]} bytes")
    return arr.strides[0] // arr.itemsize


# Instruction sets whose conv kernel has the direct path (conv_f32.c: rows read in
# place, with or without NCHW16c tensors); elsewhere the kernel gathers, and NCHW16c
# arguments go through NCHW copies.
CONV_DIRECT_ISAS = ("avx2", "avx512")
# Instruction sets whose depthwise kernel has its channels-in-lanes path
# (depthwise_c16.h), which also reads and writes NCHW16c tensors in place; elsewhere those
# go through NCHW copies.
DEPTHWISE_CHANNELS_ISAS = ("avx2", "avx512")
# Instruction sets on which a conv ending in a SiLU or a sigmoid writes NCHW16c tensors
# (the kernels' blocked stores take those too; which tensors stay blocked is
# tirbyoc/conv.py's plan): on a Zen 4 with AVX-512, EfficientNet-B0 ran 3-4% faster
# against ONNX Runtime that way (0.88x -> 0.91-0.92x in two alternating runs of each, its
# kernel calls 9.45 -> 7.97 ms); on a Zen 3 with AVX2 it ran 6-9% slower.
BLOCKED_SIGMOID_ISAS = ("avx512",)


def isa():
    """Name of the instruction set the kernels use: "avx512", "avx2" or "generic"."""
    ffi, lib = load()
    return ffi.string(lib.tirbyoc_isa()).decode()


def available_isas():
    """Instruction sets this CPU (and OS) supports, slowest first, e.g.
    ``["generic", "avx2", "avx512"]``."""
    _, lib = load()
    current = isa()
    names = [name for name in ("generic", "avx2", "avx512")
             if lib.tirbyoc_set_isa(name.encode()) == TIRBYOC_OK]
    lib.tirbyoc_set_isa(current.encode())
    return names


def set_isa(name):
    """Use instruction set ``name`` for all later calls (process-wide)."""
    _, lib = load()
    if lib.tirbyoc_set_isa(str(name).encode()) != TIRBYOC_OK:
        raise ValueError(f"instruction set {name!r} is unknown or not supported by this CPU")


def cache_sizes():
    """The caches the kernels' blocking is derived from: a dict of ``l1`` and ``l2``
    (bytes), ``l1_ways``, ``l2_ways`` and ``line`` (bytes). What cpuid reports, or
    ``TIRBYOC_CACHES`` (e.g. ``48K,2M``: another CPU's sizes, for the blocking it gives)."""
    _, sizes = _read_caches(*load())
    return {"l1": sizes[0], "l1_ways": sizes[1], "l2": sizes[2], "l2_ways": sizes[3],
            "line": sizes[4]}


def describe_caches():
    """:func:`cache_sizes` in words, e.g. ``L1d 32 KiB 8-way, L2 512 KiB 8-way``."""
    c = cache_sizes()
    return f"L1d {c['l1'] // 1024} KiB {c['l1_ways']}-way, L2 {c['l2'] // 1024} KiB {c['l2_ways']}-way"


def num_threads():
    """Threads that large kernel calls may use."""
    _, lib = load()
    return lib.tirbyoc_num_threads()


def set_num_threads(n):
    """Let large kernel calls use up to ``n`` (>= 1) threads (process-wide)."""
    _, lib = load()
    if not isinstance(n, (int, np.integer)) or n < 1 or n > 2**31 - 1:
        raise ValueError(f"thread count must be an int >= 1, got {n!r}")
    if lib.tirbyoc_set_num_threads(int(n)) != TIRBYOC_OK:
        raise ValueError(f"invalid thread count {n!r}")


def _float_ptr(arr):
    """A float pointer to ``arr``'s data for cffi; NULL for None or an empty array. A
    contiguous array's buffer is taken as it is (about 0.5 us, against 3-4 us through
    ``arr.ctypes``: a call passes four or five of them); an array with padded rows through
    its address."""
    ffi, _ = load()
    if arr is None or arr.size == 0:
        return ffi.NULL
    if arr.flags.c_contiguous:
        return ffi.from_buffer("float[]", arr)
    return ffi.cast("float *", arr.ctypes.data)


def _aligned_empty(size, align=64):
    """Uninitialized float32 array of ``size`` elements whose data is ``align``-byte aligned."""
    extra = align // 4
    raw = np.empty(size + extra, dtype=np.float32)
    offset = (-raw.__array_interface__["data"][0] % align) // 4
    return raw[offset:offset + size]


def _out(shape):
    """A new output array: uninitialized float32 of ``shape``, its data 64-byte aligned
    as TVM allocates its tensors, so that a chain of calls through these functions reads
    and writes memory as the compiled model's calls do. (NumPy puts a large array 16
    bytes past a 64-byte line: each 64-byte pixel of an NCHW16c tensor then straddles
    two lines.)"""
    return _aligned_empty(math.prod(shape)).reshape(shape)


def _weight_dims(w, layout):
    """(N, K, row stride) of an unpacked weight in layout "nt" ([N, K]) or "nn" ([K, N])."""
    if layout not in ("nt", "nn"):
        raise ValueError(f"layout must be 'nt' or 'nn', got {layout!r}")
    ldw = _row_stride(w, "w")
    n, k = w.shape if layout == "nt" else w.shape[::-1]
    return n, k, ldw


def packed_weight_size(n, k):
    """Number of floats of the packed form of an [N, K] weight."""
    _, lib = load()
    size = lib.tirbyoc_packed_weight_size_f32(n, k)
    if size < 0:
        raise ValueError(f"invalid weight size N={n}, K={k}")
    return size


def pack_weight(w, layout="nt"):
    """Pack a weight (``[N, K]`` for "nt", ``[K, N]`` for "nn") once for
    ``dense(..., layout="packed")``.

    Returns a 1-D, 64-byte aligned float32 array in the fixed layout described
    in ``kernels/tirbyoc_kernels.h`` (the same on every instruction set).
    """
    n, k, ldw = _weight_dims(w, layout)
    packed = _aligned_empty(packed_weight_size(n, k))
    _, lib = load()
    func = getattr(lib, f"tirbyoc_pack_weight_f32_{layout}")
    _check(func, func(n, k, _float_ptr(w), ldw, _float_ptr(packed)))
    return packed


ACTIVATIONS = (None, "relu", "relu6")


def dense(a, w, bias=None, activation=None, layout="nt", out=None, n=None):
    """``a @ w.T`` ("nt", w is [N, K]) or ``a @ w`` ("nn", w is [K, N]),
    plus ``bias`` ([N] or None), then ``activation`` (None, "relu" or "relu6"), via
    the C kernels.

    With ``layout="packed"``, ``w`` is the result of :func:`pack_weight`; N is
    then taken from ``n``, or else from ``out`` or ``bias``.

    Arrays must be float32 with contiguous rows; row strides may be larger
    than the rows (e.g. column slices of wider arrays). ``out`` ([M, N]) is
    written in place when given. Returns the result array.
    """
    if layout not in ("nt", "nn", "packed"):
        raise ValueError(f"layout must be 'nt', 'nn' or 'packed', got {layout!r}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    lda = _row_stride(a, "a")
    m, k = a.shape
    if layout == "packed":
        if n is None:
            if out is not None and out.ndim == 2:
                n = out.shape[1]
            elif bias is not None and bias.ndim == 1:
                n = bias.shape[0]
            else:
                raise ValueError("layout 'packed' needs n (or out or bias) to know N")
        if w.dtype != np.float32 or w.ndim != 1 or (w.size > 1 and w.strides[0] != w.itemsize):
            raise ValueError("a packed weight must be a contiguous 1-D float32 array")
        if w.size != packed_weight_size(n, k):
            raise ValueError(f"packed weight has {w.size} floats, expected "
                             f"{packed_weight_size(n, k)} for N={n}, K={k}")
        ldw = None
    else:
        n, wk, ldw = _weight_dims(w, layout)
        if wk != k:
            raise ValueError(f"shape mismatch: a is {a.shape}, w is {w.shape} (layout {layout!r})")
    if bias is not None:
        if bias.dtype != np.float32 or bias.shape != (n,):
            raise ValueError(f"bias must be float32 of shape ({n},), got {bias.dtype} {bias.shape}")
        if n > 1 and bias.strides[0] != bias.itemsize:
            raise ValueError("bias must be contiguous")
    if out is None:
        out = _out((m, n))
    elif out.shape != (m, n):
        raise ValueError(f"out must have shape {(m, n)}, got {out.shape}")
    if not out.flags.writeable:
        raise ValueError("out must be writeable")
    if any(x is not None and np.may_share_memory(out, x) for x in (a, w, bias)):
        raise ValueError("out must not overlap the inputs")
    ldc = _row_stride(out, "out")

    ffi, lib = load()
    func = getattr(lib, f"tirbyoc_dense{'_' + activation if activation else ''}_f32_{layout}")


    if layout == "packed":
        status = func(m, n, k, _float_ptr(a), lda, _float_ptr(w), _float_ptr(bias), _float_ptr(out), ldc)
    else:
        status = func(m, n, k, _float_ptr(a), lda, _float_ptr(w), ldw, _float_ptr(bias), _float_ptr(out), ldc)
    _check(func, status)
    return out


def encode_epilogue(ops) -> int:
    """The kernels' int64 chain for a sequence of operation names or codes (first op in the
    lowest 4 bits; at most 15)."""
    codes = [EPILOGUE_OPS[o] if isinstance(o, str) else int(o) for o in ops]
    if len(codes) > 15:
        raise ValueError("an epilogue chain has at most 15 operations")
    code = 0
    for i, c in enumerate(codes):
        code |= c << (4 * i)
    return code


def _strides3(arr, name):
    """(batch stride, row stride) in elements of a float32 array [batch, rows, cols]
    (rows contiguous); a batch of extent 1 has stride 0."""
    if arr.dtype != np.float32:
        raise ValueError(f"{name} must be float32, got {arr.dtype}")
    item = arr.itemsize
    if arr.size == 0:
        return 0, arr.shape[2]
    if arr.shape[2] > 1 and arr.strides[2] != item:
        raise ValueError(f"{name} must have contiguous rows")
    if any(st % item for st in arr.strides[:2]):
        raise ValueError(f"{name} strides must be whole elements")
    batch = arr.strides[0] // item if arr.shape[0] > 1 else 0
    rows = arr.strides[1] // item if arr.shape[1] > 1 else arr.shape[2]
    return batch, max(rows, arr.shape[2])


def matmul(a, b, *, b_layout="nn", epilogue=(), scale=1.0, bias=None, residual=None,
           out=None, n=None):
    """``chain(a @ op(b))`` over a batch, via ``tirbyoc_matmul_f32``.

    ``a``: [m, k] or [batch, m, k]; ``b``: [k, n] ("nn"), [n, k] ("nt"), either with a
    leading batch dimension (size 1 or ``batch`` broadcasts), or a packed weight (1-D,
    :func:`pack_weight`; ``n`` then gives N). ``epilogue``: operation names in order
    (``EPILOGUE_OPS``); ``scale`` for "scale"/"divide"; ``bias`` [N]; ``residual`` shaped
    like the output (a batch of 1 broadcasts). Returns ``out`` ([batch, m, n], or [m, n]
    for 2-D ``a``).
    """
    if b_layout not in B_LAYOUTS:
        raise ValueError(f"b_layout must be one of {tuple(B_LAYOUTS)}, got {b_layout!r}")
    squeeze = a.ndim == 2
    a3 = a[None] if squeeze else a
    batch, m, k = a3.shape
    if b_layout == "packed":
        if n is None:
            raise ValueError("b_layout 'packed' needs n")
        if b.ndim != 1 or b.size != packed_weight_size(n, k):
            raise ValueError("b is not a packed [N, K] weight")
        sb, ldb = 0, 0
    else:
        b3 = b[None] if b.ndim == 2 else b
        n = b3.shape[2] if b_layout == "nn" else b3.shape[1]
        kb = b3.shape[1] if b_layout == "nn" else b3.shape[2]
        if kb != k or b3.shape[0] not in (1, batch):
            raise ValueError(f"shape mismatch: a is {a.shape}, b is {b.shape} ({b_layout})")
        sb, ldb = _strides3(b3, "b")
    sa, lda = _strides3(a3, "a")
    if out is None:
        out = _out((batch, m, n))
    out3 = out[None] if out.ndim == 2 else out
    if out3.shape != (batch, m, n):
        raise ValueError(f"out must have shape {(batch, m, n)}, got {out.shape}")
    sc, ldc = _strides3(out3, "out")
    sc = sc if batch > 1 else m * ldc
    if residual is not None:
        r3 = residual[None] if residual.ndim == 2 else residual
        if r3.shape[1:] != (m, n) or r3.shape[0] not in (1, batch):
            raise ValueError(f"residual must have the output's shape, got {residual.shape}")
        sr, ldr = _strides3(r3, "residual")
    else:
        sr, ldr = 0, 0
    if bias is not None and (bias.dtype != np.float32 or bias.shape != (n,)):
        raise ValueError(f"bias must be float32 of shape ({n},)")
    if any(x is not None and np.may_share_memory(out, x) for x in (a, b, bias, residual)):
        raise ValueError("out must not overlap the inputs")
    ffi, lib = load()


    _check("tirbyoc_matmul_f32", lib.tirbyoc_matmul_f32(
        batch, m, n, k, _float_ptr(a3), lda, sa, _float_ptr(b if b_layout == "packed" else b3), ldb, sb,
        B_LAYOUTS[b_layout], _float_ptr(out3), ldc, sc, encode_epilogue(epilogue), float(scale),
        _float_ptr(bias), _float_ptr(residual), ldr, sr))
    return out3[0] if squeeze and out.ndim == 3 else out


def unary(op, x, out=None):
    """``op(x)`` elementwise (a unary epilogue operation: ``UNARY_OPS``) via
    ``tirbyoc_unary_f32``; ``x`` float32 and contiguous; ``out`` may be ``x``."""
    code = EPILOGUE_OPS[op] if isinstance(op, str) else int(op)
    x = np.ascontiguousarray(x, np.float32)
    if out is None:
        out = _out(x.shape)
    if out.shape != x.shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError("out must be a contiguous float32 array of x's shape")
    ffi, lib = load()
    _check("tirbyoc_unary_f32", lib.tirbyoc_unary_f32(
        code, x.size, ffi.cast("float *", x.ctypes.data), ffi.cast("float *", out.ctypes.data)))
    return out


def softmax(x, out=None):
    """Softmax over the last axis of ``x`` via ``tirbyoc_softmax_f32``: float32, 2-D with
    contiguous rows (a row stride larger than the rows is fine) or any shape C-contiguous;
    ``out`` likewise, may be ``x``."""
    if not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim < 1:
        raise ValueError("x must be a float32 array with at least one dimension")
    if out is None:
        out = _out(x.shape)
    if not isinstance(out, np.ndarray) or out.shape != x.shape or out.dtype != np.float32:
        raise ValueError("out must be a float32 array of x's shape")
    n = x.shape[-1]

    def rows(arr, name):
        if arr.ndim == 2:
            return arr
        if not arr.flags.c_contiguous:
            raise ValueError(f"{name} must be 2-D or C-contiguous")
        return arr.reshape(-1, n)

    xr, yr = rows(x, "x"), rows(out, "out")
    ldx, ldy = _row_stride(xr, "x"), _row_stride(yr, "out")
    ffi, lib = load()
    _check("tirbyoc_softmax_f32", lib.tirbyoc_softmax_f32(
        xr.shape[0], n, ffi.cast("float *", xr.ctypes.data), ldx,
        ffi.cast("float *", yr.ctypes.data), ldy))
    return out


ATTENTION_FLAGS = {"divide": 1, "mask_keep": 2, "empty_zero": 4, "mask_add": 8,
                   "mask_lowest": 16, "nan_zero": 32}


def attention(q, k, v, *, k_layout="nt", scale=1.0, divide=False, mask=None, mask_keep=False,
              empty_zero=False, mask_add=False, mask_lowest=False, nan_zero=False,
              mask_repeat=1, out=None):
    """``softmax(where(masked, -inf, (q @ op(k)) * scale)) @ v`` via
    ``tirbyoc_attention_f32``, one call, scores never materialized.

    ``q``: [m, d] or [batch, m, d]; ``k``: [n, d] ("nt", keys as rows: q @ k^T) or [d, n]
    ("nn"); ``v``: [n, dv]; each with an optional leading batch dimension (1 or ``batch``
    broadcasts). ``divide``: the scores are divided by ``scale`` instead. ``mask``: bool or
    uint8 [m, n] or [batch or 1, m or 1, n]; True masks a score (``mask_keep``: True keeps
    it). ``mask_repeat``: each mask item serves that many batch items in a row (the
    mask then has batch / mask_repeat items: one per sequence, shared by its heads). ``empty_zero``: a fully masked row gives 0 instead of NaN. ``mask_add``: a masked
    score is the score + -inf (NaN where it is NaN or +inf), as in ``s + where(masked,
    -inf, 0)``, instead of -inf. ``mask_lowest``: the masking value is the lowest float32
    (-3.4028235e38, HuggingFace's ``finfo.min``) instead of -inf, in either form: a fully
    masked row then spreads its weights instead of giving NaN. ``nan_zero``: every row
    whose weights are NaN (a NaN or +inf score, or all scores -inf) gets weights of 0, as
    ``where(isnan(p), 0, p)`` after the softmax: its output is the sum of 0 * v over
    every key (0, or NaN in a column of v holding an inf or NaN). Returns ``out``
    ([batch, m, dv], or [m, dv] for 2-D ``q``).
    """
    if k_layout not in ("nt", "nn"):
        raise ValueError(f"k_layout must be 'nt' or 'nn', got {k_layout!r}")
    squeeze = q.ndim == 2
    q3 = q[None] if squeeze else q
    k3 = k[None] if k.ndim == 2 else k
    v3 = v[None] if v.ndim == 2 else v
    batch, m, d = q3.shape
    n, kd = (k3.shape[1], k3.shape[2]) if k_layout == "nt" else (k3.shape[2], k3.shape[1])
    dv = v3.shape[2]
    if kd != d or v3.shape[1] != n or any(x.shape[0] not in (1, batch) for x in (k3, v3)):
        raise ValueError(f"shape mismatch: q {q.shape}, k {k.shape} ({k_layout}), v {v.shape}")
    sq, ldq = _strides3(q3, "q")
    sk, ldk = _strides3(k3, "k")
    sv, ldv = _strides3(v3, "v")
    if out is None:
        out = _out((batch, m, dv))
    out3 = out[None] if out.ndim == 2 else out
    if out3.shape != (batch, m, dv):
        raise ValueError(f"out must have shape {(batch, m, dv)}, got {out.shape}")
    so, ldo = _strides3(out3, "out")
    so = so if batch > 1 else m * ldo
    ffi, lib = load()
    mask_ptr, ldm, sm = ffi.NULL, 0, 0
    if mask is not None:
        m3 = mask[None] if mask.ndim == 2 else mask
        items = batch // mask_repeat if mask_repeat >= 1 and batch % mask_repeat == 0 else 1
        if (m3.dtype not in (np.bool_, np.uint8) or m3.ndim != 3 or m3.shape[2] != n
                or m3.shape[1] not in (1, m) or m3.shape[0] not in (1, items)):
            raise ValueError(f"mask must be bool or uint8 [{items}|1, {m}|1, {n}] "
                             f"(batch {batch}, mask_repeat {mask_repeat}), got "
                             f"{mask.dtype} {mask.shape}")
        if m3.shape[2] > 1 and m3.strides[2] != 1:
            raise ValueError("mask must have contiguous rows")
        sm = m3.strides[0] if m3.shape[0] > 1 else 0
        ldm = m3.strides[1] if m3.shape[1] > 1 else 0
        mask_ptr = ffi.cast("uint8_t *", m3.ctypes.data) if m3.size else ffi.NULL
    if any(np.may_share_memory(out, x) for x in (q, k, v)):
        raise ValueError("out must not overlap the inputs")
    flags = ((ATTENTION_FLAGS["divide"] if divide else 0)
             | (ATTENTION_FLAGS["mask_keep"] if mask_keep else 0)
             | (ATTENTION_FLAGS["empty_zero"] if empty_zero else 0)
             | (ATTENTION_FLAGS["mask_add"] if mask_add else 0)
             | (ATTENTION_FLAGS["mask_lowest"] if mask_lowest else 0)
             | (ATTENTION_FLAGS["nan_zero"] if nan_zero else 0))
    _check("tirbyoc_attention_f32", lib.tirbyoc_attention_f32(
        batch, m, n, d, dv, _float_ptr(q3), ldq, sq, _float_ptr(k3), ldk, sk, B_LAYOUTS[k_layout],
        _float_ptr(v3), ldv, sv, mask_ptr, ldm, sm, mask_repeat, flags, float(scale),
        _float_ptr(out3), ldo, so))
    return out3[0] if squeeze and out.ndim == 3 else out


@dataclass(frozen=True)
class PackedConv2dWeight:
    """A conv weight (and bias) packed once by :func:`pack_conv2d_weight`; pass it to
    :func:`conv2d` in place of the weight (without ``bias``)."""

    data: np.ndarray  # 1-D, the layout of tirbyoc_pack_conv2d_weight_f32 (or _winograd_)
    shape: tuple  # the weight's [OC, C / groups, KH, KW]
    groups: int
    with_bias: bool
    winograd: bool = False  # transformed for tirbyoc_conv2d_winograd_f32


def pack_conv2d_weight(weight, bias=None, groups=1, winograd=False):
    """Pack a conv weight [OC, C / groups, KH, KW] and its bias [OC] (or None) once, in
    the layout ``tirbyoc_conv2d_f32_packed`` reads (the same on every instruction set);
    ``winograd``: transformed for ``tirbyoc_conv2d_winograd_f32`` instead (a 3x3 weight,
    one group; the conv must then have stride 1 and dilation 1)."""
    if weight.ndim != 4 or weight.dtype != np.float32 or not weight.flags.c_contiguous:
        raise ValueError("weight must be a C-contiguous float32 [OC, C / groups, KH, KW]")
    oc, k = weight.shape[0], int(np.prod(weight.shape[1:]))
    if bias is not None and (bias.dtype != np.float32 or bias.shape != (oc,)
                             or not bias.flags.c_contiguous):
        raise ValueError(f"bias must be a C-contiguous float32 of shape ({oc},)")
    _, lib = load()
    if winograd:
        if weight.shape[2:] != (3, 3) or groups != 1:
            raise ValueError(f"a Winograd weight is [OC, C, 3, 3] in one group, got "
                             f"{weight.shape} and groups={groups}")
        size = lib.tirbyoc_conv2d_winograd_packed_size_f32(oc, weight.shape[1])
    else:
        size = lib.tirbyoc_conv2d_packed_size_f32(oc, int(groups), k, int(bias is not None))
    if size < 0:
        raise ValueError(f"invalid conv weight: shape {weight.shape}, groups={groups}")
    data = _aligned_empty(size)
    if winograd:
        _check("tirbyoc_pack_conv2d_winograd_weight_f32",
               lib.tirbyoc_pack_conv2d_winograd_weight_f32(
                   oc, weight.shape[1], _float_ptr(weight), _float_ptr(bias),
                   _float_ptr(data)))
    else:
        _check("tirbyoc_pack_conv2d_weight_f32", lib.tirbyoc_pack_conv2d_weight_f32(
            oc, int(groups), k, _float_ptr(weight), _float_ptr(bias), _float_ptr(data)))
    return PackedConv2dWeight(data, tuple(weight.shape), int(groups), bias is not None,
                              bool(winograd))


def winograd_key(weight, bias=None):
    """The key ``tirbyoc_conv2d_winograd_cached_f32`` finds a weight's transform by: a
    128-bit BLAKE2b digest of the weight's shape and values and the bias's, as two signed
    64-bit halves."""
    h = hashlib.blake2b(digest_size=16, person=b"tirbyoc-wino")
    h.update(np.asarray(weight.shape, np.int64).tobytes())
    h.update(np.ascontiguousarray(weight, np.float32).tobytes())
    if bias is not None:
        h.update(b"bias")
        h.update(np.ascontiguousarray(bias, np.float32).tobytes())
    d = h.digest()
    return (int.from_bytes(d[:8], "little", signed=True),
            int.from_bytes(d[8:], "little", signed=True))


def conv2d_winograd_cached(x, weight, *, padding=1, epilogue=(), bias=None, residual=None,
                           out_size=None, out=None, key=None):
    """``chain(conv2d(x, weight))`` for a 3x3 ``weight`` [OC, C, 3, 3] of stride 1 via
    ``tirbyoc_conv2d_winograd_cached_f32``: the weight as it is, transformed by the first
    call with its ``key`` (default :func:`winograd_key` of the weight and bias) and
    pointers, and kept for the next. Arguments as for :func:`conv2d`; the weight and bias
    must stay alive and unchanged while calls with that key may come."""
    if weight.ndim != 4 or weight.shape[2:] != (3, 3) or weight.dtype != np.float32 or \
            not weight.flags.c_contiguous or x.ndim != 4 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"x must be [N, C, H, W] and weight a C-contiguous float32 "
                         f"[OC, C, 3, 3], got {x.shape} and {weight.shape}")
    if (len(epilogue) > 0 and epilogue[0] == "bias") != (bias is not None):
        raise ValueError("the epilogue must start with 'bias' if and only if a bias is given")
    key0, key1 = winograd_key(weight, bias) if key is None else key
    geometry = _conv_geometry(1, padding, 1)
    batch, c, h, w = x.shape
    oc = weight.shape[0]
    dims, out = _conv_operands(x, 3, 3, oc, geometry, out_size, weight, bias, residual, out)
    (_, _, pt, pl, _, _, oh, ow) = dims
    _, lib = load()
    _check("tirbyoc_conv2d_winograd_cached_f32", lib.tirbyoc_conv2d_winograd_cached_f32(
        key0, key1, batch, c, h, w, _float_ptr(x), oc, _float_ptr(weight), _float_ptr(bias),
        pt, pl, oh, ow, encode_epilogue(epilogue), _float_ptr(residual), _float_ptr(out)))
    return out


def winograd_cache_stats():
    """What ``tirbyoc_conv2d_winograd_cached_f32`` keeps in this process: ``entries``,
    their ``bytes``, the ``cap`` in bytes (``TIRBYOC_WINOGRAD_CACHE_MB``), and the
    entries ``made`` and ``dropped`` so far."""
    ffi, lib = load()
    out = ffi.new("int64_t[5]")
    _check("tirbyoc_winograd_cache_stats", lib.tirbyoc_winograd_cache_stats(out))
    return dict(zip(("entries", "bytes", "cap", "made", "dropped"), list(out)))


def winograd_suits(batch, c, oc, groups, kernel_size, stride, dilation, out_size):
    """Whether ``tirbyoc_conv2d_winograd_f32`` is the faster call for a conv of this shape
    (``tirbyoc_conv2d_winograd_suits``; ``batch`` None or 0: not known)."""
    _, lib = load()
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = (
        _conv_pair(v, name) for v, name in ((kernel_size, "kernel_size"), (stride, "stride"),
                                            (dilation, "dilation"), (out_size, "out_size")))
    return bool(lib.tirbyoc_conv2d_winograd_suits(int(batch or 0), int(c), int(oc),
                                                  int(groups), kh, kw, sh, sw, dh, dw, oh,
                                                  ow))


def conv_direct_suits(plain, pixels, channels, ksteps):
    """Whether the conv kernel's direct path is the faster one for NCHW tensors
    (``tirbyoc_conv2d_direct_suits``: a ``plain`` 1x1 conv or another, ``pixels`` OH *
    OW, ``channels`` output channels per group, ``ksteps`` the k steps with the bias
    step); where it is not, a blocked tensor would cost the conv its faster path."""
    ffi, lib = load()
    suits = ffi.new("int32_t *")
    _check("tirbyoc_conv2d_direct_suits", lib.tirbyoc_conv2d_direct_suits(
        int(bool(plain)), int(pixels), int(channels), int(ksteps), suits))
    return bool(suits[0])


def _conv_pair(v, name):
    v = (v, v) if isinstance(v, (int, np.integer)) else tuple(v)
    if len(v) != 2:
        raise ValueError(f"{name} must be an int or a pair, got {v!r}")
    return int(v[0]), int(v[1])


def _conv_geometry(stride, padding, dilation):
    """((sh, sw), (pt, pl), (dh, dw)) of a conv's int-or-pair arguments."""
    return (_conv_pair(stride, "stride"), _conv_pair(padding, "padding"),
            _conv_pair(dilation, "dilation"))


def _conv_operands(x, kh, kw, oc, geometry, out_size, weight, bias, residual, out):
    """The checks :func:`conv2d` and :func:`depthwise_conv2d` share, once the
    weight's shape is known to fit ``x``: the output size (``out_size``, or
    PyTorch's for symmetric padding), every operand C-contiguous float32, ``bias``
    [OC], ``residual`` and ``out`` of the output's shape, ``out`` (allocated when
    None) overlapping no input. Returns ``(dims, out)``, dims the kernels' geometry
    arguments in their order: ``(sh, sw, pt, pl, dh, dw, oh, ow)``."""
    (sh, sw), (pt, pl), (dh, dw) = geometry
    batch, _, h, w = x.shape
    if out_size is None:
        out_size = ((h + 2 * pt - dh * (kh - 1) - 1) // sh + 1 if sh > 0 else 0,
                    (w + 2 * pl - dw * (kw - 1) - 1) // sw + 1 if sw > 0 else 0)
    oh, ow = (max(int(v), 0) for v in out_size)
    shape = (batch, oc, oh, ow)
    for name, arr in (("x", x), ("weight", weight), ("bias", bias), ("residual", residual)):
        if arr is not None and (arr.dtype != np.float32 or not arr.flags.c_contiguous):
            raise ValueError(f"{name} must be C-contiguous float32")
    if bias is not None and bias.shape != (oc,):
        raise ValueError(f"bias must have shape ({oc},), got {bias.shape}")
    if residual is not None and residual.shape != shape:
        raise ValueError(f"residual must have the output's shape {shape}, got "
                         f"{residual.shape}")
    if out is None:
        out = _out(shape)
    if out.shape != shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous float32 of shape {shape}")
    if any(a is not None and np.may_share_memory(out, a)
           for a in (x, weight, bias, residual)):
        raise ValueError("out must not overlap the inputs")
    return (sh, sw, pt, pl, dh, dw, oh, ow), out


LAYOUTS = ("nchw", "nchw16c")


def to_nchw16c(x):
    """[N, C, H, W] as NCHW16c, [N, C / 16, H, W, 16] (16 divides C), a new array."""
    n, c, h, w = x.shape
    if c % 16:
        raise ValueError(f"NCHW16c needs channels in blocks of 16, got {c}")
    out = _out((n, c // 16, h, w, 16))
    out[...] = x.reshape(n, c // 16, 16, h, w).transpose(0, 1, 3, 4, 2)
    return out


def from_nchw16c(x):
    """[N, C / 16, H, W, 16] back to [N, C, H, W], a new array."""
    n, cb, h, w, _ = x.shape
    out = _out((n, cb * 16, h, w))
    out.reshape(n, cb, 16, h, w)[...] = x.transpose(0, 1, 4, 2, 3)
    return out


def _layout_bits(layout_x, layout_y):
    """The kernels' TIRBYOC_LAYOUT_* bits for ``layout_x`` and ``layout_y`` (each one of
    :data:`LAYOUTS`)."""
    for name, lay in (("layout_x", layout_x), ("layout_y", layout_y)):
        if lay not in LAYOUTS:
            raise ValueError(f"{name} must be one of {LAYOUTS}, got {lay!r}")
    return (1 if layout_x == "nchw16c" else 0) | (2 if layout_y == "nchw16c" else 0)


def _nchw_view(a, name):
    """An NCHW16c array [N, C / 16, H, W, 16] seen as [N, C, H, W] (the same memory:
    the shape checks and pointers of the NCHW calls apply to it)."""
    if a is None:
        return None
    if a.ndim != 5 or a.shape[4] != 16 or not a.flags.c_contiguous:
        raise ValueError(f"{name} in NCHW16c must be a C-contiguous [N, C / 16, H, W, 16], "
                         f"got {a.shape}")
    n, cb, h, w, _ = a.shape
    return a.reshape(n, cb * 16, h, w)


def _blocked_out(out, given, bits):
    """The output as the caller sees it: NCHW16c (5-D) when bit 2 is set."""
    if not bits & 2 or given is not None:
        return given if given is not None else out
    n, c, h, w = out.shape
    return out.reshape(n, c // 16, h, w, 16)


def conv2d(x, weight, *, stride=1, padding=0, dilation=1, groups=1, epilogue=(), bias=None,
           residual=None, out_size=None, out=None, layout_x="nchw", layout_y="nchw"):
    """``chain(conv2d(x, weight))`` via ``tirbyoc_conv2d_f32`` (NCHW, OIHW).

    ``x``: float32 [batch, C, H, W]; ``weight``: [OC, C / groups, KH, KW]; both
    C-contiguous; ``groups`` divides C and OC (PyTorch's ``groups``).
    ``stride``, ``dilation``: an int or (h, w); ``padding``: an int, (h, w) or (top, left)
    with ``out_size`` (OH, OW) given explicitly (any padding; the default output size is
    PyTorch's for symmetric padding). ``epilogue``: operation names in order
    (``EPILOGUE_OPS``; "bias" only first, per output channel, with ``bias`` [OC]);
    ``residual``: shaped like the output. Returns ``out`` [batch, OC, OH, OW].
    ``weight`` may be a :class:`PackedConv2dWeight` (``groups`` and the bias are then
    its own; ``epilogue`` starts with "bias" if and only if it holds one).
    ``layout_x`` / ``layout_y``: "nchw16c" passes ``x`` / the output and ``residual``
    as [N, C / 16, H, W, 16] (:func:`to_nchw16c`; a packed, non-Winograd weight only),
    through ``tirbyoc_conv2d_f32_packed_layouts``.
    """
    bits = _layout_bits(layout_x, layout_y)
    if bits:
        if not isinstance(weight, PackedConv2dWeight) or weight.winograd:
            raise ValueError("NCHW16c layouts take a packed (non-Winograd) weight")
        given = out
        x = _nchw_view(x, "x") if bits & 1 else x
        if bits & 2:
            residual, out = _nchw_view(residual, "residual"), _nchw_view(out, "out")
    packed = weight if isinstance(weight, PackedConv2dWeight) else None
    if packed is not None:
        if bias is not None or (groups != 1 and groups != packed.groups):
            raise ValueError("a packed weight holds its own bias and groups")
        if (len(epilogue) > 0 and epilogue[0] == "bias") != packed.with_bias:
            raise ValueError("the epilogue must start with 'bias' if and only if the "
                             "packed weight holds one")
        groups = packed.groups
        weight = packed.data  # what the kernel reads
    wshape = packed.shape if packed is not None else weight.shape

    geometry = _conv_geometry(stride, padding, dilation)
    groups = int(groups)
    if groups < 1 or x.ndim != 4 or len(wshape) != 4 or x.shape[1] % groups or \
            wshape[0] % groups or wshape[1] * groups != x.shape[1]:
        raise ValueError(f"x must be [N, C, H, W] and weight [OC, C / groups, KH, KW] with "
                         f"groups dividing C and OC, got {x.shape}, {tuple(wshape)} and "
                         f"groups={groups}")
    batch, c, h, w = x.shape
    oc, _, kh, kw = wshape
    dims, out = _conv_operands(x, kh, kw, oc, geometry, out_size, weight, bias, residual,
                               out)
    _, lib = load()
    if packed is not None and packed.winograd:
        (sh, sw, pt, pl, dh, dw, oh, ow) = dims
        if (kh, kw, sh, sw, dh, dw) != (3, 3, 1, 1, 1, 1):
            raise ValueError("a Winograd weight takes a 3x3 conv of stride 1 and dilation 1")
        _check("tirbyoc_conv2d_winograd_f32", lib.tirbyoc_conv2d_winograd_f32(
            batch, c, h, w, _float_ptr(x), oc, _float_ptr(weight), pt, pl, oh, ow,
            encode_epilogue(epilogue), _float_ptr(residual), _float_ptr(out)))
        return out
    if bits:
        _check("tirbyoc_conv2d_f32_packed_layouts", lib.tirbyoc_conv2d_f32_packed_layouts(
            bits, batch, c, h, w, _float_ptr(x), oc, groups, kh, kw, _float_ptr(weight),
            *dims, encode_epilogue(epilogue), _float_ptr(residual), _float_ptr(out)))
        return _blocked_out(out, given, bits)
    if packed is not None:
        _check("tirbyoc_conv2d_f32_packed", lib.tirbyoc_conv2d_f32_packed(
            batch, c, h, w, _float_ptr(x), oc, groups, kh, kw, _float_ptr(weight), *dims,
            encode_epilogue(epilogue), _float_ptr(residual), _float_ptr(out)))
        return out
    _check("tirbyoc_conv2d_f32", lib.tirbyoc_conv2d_f32(
        batch, c, h, w, _float_ptr(x), oc, groups, kh, kw, _float_ptr(weight), *dims,
        encode_epilogue(epilogue), _float_ptr(bias), _float_ptr(residual), _float_ptr(out)))
    return out


def depthwise_conv2d(x, weight, *, stride=1, padding=0, dilation=1, epilogue=(), bias=None,
                     residual=None, out_size=None, out=None, layout_x="nchw",
                     layout_y="nchw"):
    """``chain(depthwise_conv2d(x, weight))`` via ``tirbyoc_depthwise_conv2d_f32``: a
    conv with one filter per channel (PyTorch's ``groups`` = C = OC), NCHW.

    ``x``: float32 [batch, C, H, W]; ``weight``: [C, 1, KH, KW]; both C-contiguous.
    ``stride``, ``padding``, ``dilation``, ``out_size``, ``epilogue``, ``bias`` [C] and
    ``residual`` as for :func:`conv2d`. Returns ``out`` [batch, C, OH, OW].
    ``layout_x``, ``layout_y``: as for :func:`conv2d`
    (``tirbyoc_depthwise_conv2d_f32_layouts``).
    """
    bits, given = _layout_bits(layout_x, layout_y), out
    x = _nchw_view(x, "x") if bits & 1 else x
    if bits & 2:
        residual, out = _nchw_view(residual, "residual"), _nchw_view(out, "out")
    geometry = _conv_geometry(stride, padding, dilation)
    if x.ndim != 4 or weight.ndim != 4 or weight.shape[:2] != (x.shape[1], 1):
        raise ValueError(f"x must be [N, C, H, W] and weight [C, 1, KH, KW], got {x.shape} "
                         f"and {weight.shape}")
    batch, c, h, w = x.shape
    _, _, kh, kw = weight.shape
    dims, out = _conv_operands(x, kh, kw, c, geometry, out_size, weight, bias, residual, out)
    _, lib = load()
    _check("tirbyoc_depthwise_conv2d_f32_layouts", lib.tirbyoc_depthwise_conv2d_f32_layouts(
        bits, batch, c, h, w, _float_ptr(x), kh, kw, _float_ptr(weight), *dims,
        encode_epilogue(epilogue), _float_ptr(bias), _float_ptr(residual), _float_ptr(out)))
    return _blocked_out(out, given, bits)


def max_pool2d(x, kernel_size, *, stride=None, padding=0, dilation=1, ceil_mode=False,
               out=None):
    """``max_pool2d(x)`` via ``tirbyoc_max_pool2d_f32`` (NCHW), as PyTorch's
    ``F.max_pool2d``: taps outside the input left out, NaN propagating.

    ``x``: C-contiguous float32 [batch, C, H, W]; ``kernel_size``, ``stride`` (default
    the kernel size), ``padding`` and ``dilation``: int or pair; ``ceil_mode`` as
    PyTorch's (a last window may start in the right or bottom padding, not past it).
    Returns ``out`` [batch, C, OH, OW].
    """
    kh, kw = _conv_pair(kernel_size, "kernel_size")
    (sh, sw), (pt, pl), (dh, dw) = _conv_geometry(
        (kh, kw) if stride is None else stride, padding, dilation)
    if x.ndim != 4 or x.dtype != np.float32 or not x.flags.c_contiguous:
        raise ValueError(f"x must be a C-contiguous float32 [N, C, H, W], got {x.dtype} "
                         f"{x.shape}")
    if min(kh, kw, sh, sw, dh, dw) < 1 or min(pt, pl) < 0:
        raise ValueError("kernel_size, stride and dilation must be at least 1 and padding "
                         "at least 0")
    batch, c, h, w = x.shape

    def size(n, k, s, p, d):
        span = n + 2 * p - d * (k - 1) - 1
        if span < 0:
            return 0
        o = (span + (s - 1 if ceil_mode else 0)) // s + 1
        # ceil mode: the last window must start inside the input or the left padding
        return o - 1 if ceil_mode and (o - 1) * s >= n + p else o

    shape = (batch, c, size(h, kh, sh, pt, dh), size(w, kw, sw, pl, dw))
    if out is None:
        out = _out(shape)
    if out.shape != shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous float32 of shape {shape}")
    if np.may_share_memory(out, x):
        raise ValueError("out must not overlap x")
    _, lib = load()
    _check("tirbyoc_max_pool2d_f32", lib.tirbyoc_max_pool2d_f32(
        batch, c, h, w, _float_ptr(x), kh, kw, sh, sw, pt, pl, dh, dw, shape[2], shape[3],
        _float_ptr(out)))
    return out
