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
  process-wide instruction-set and thread-count settings.

TVM is imported lazily (only by :func:`static_library`), so the kernels can
be used and tested without paying for a TVM import.
"""

import functools
import os

import numpy as np

STATIC_OBJECT_NAME = "libtirbyoc_kernels.o"
SYMBOL_PREFIX = "tirbyoc_"

# Mirrors enum tirbyoc_status in kernels/tirbyoc_kernels.h.
TIRBYOC_OK = 0
TIRBYOC_EINVAL = 1
TIRBYOC_ESIZE = 2
TIRBYOC_ESTRIDE = 3
TIRBYOC_ENULL = 4

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
    return _kernels.ffi, _kernels.lib


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
    if status != TIRBYOC_OK:
        raise RuntimeError(f"{func.__name__} failed: {status_message(status)} (status {status})")


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


def _aligned_empty(size, align=64):
    """Uninitialized float32 array of ``size`` elements whose data is ``align``-byte aligned."""
    extra = align // 4
    raw = np.empty(size + extra, dtype=np.float32)
    offset = (-raw.ctypes.data % align) // 4
    return raw[offset:offset + size]


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
    ffi, lib = load()
    func = getattr(lib, f"tirbyoc_pack_weight_f32_{layout}")
    w_ptr = ffi.NULL if w.size == 0 else ffi.cast("float *", w.ctypes.data)
    p_ptr = ffi.NULL if packed.size == 0 else ffi.cast("float *", packed.ctypes.data)
    _check(func, func(n, k, w_ptr, ldw, p_ptr))
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
        out = np.empty((m, n), dtype=np.float32)
    elif out.shape != (m, n):
        raise ValueError(f"out must have shape {(m, n)}, got {out.shape}")
    if not out.flags.writeable:
        raise ValueError("out must be writeable")
    if any(x is not None and np.may_share_memory(out, x) for x in (a, w, bias)):
        raise ValueError("out must not overlap the inputs")
    ldc = _row_stride(out, "out")

    ffi, lib = load()
    func = getattr(lib, f"tirbyoc_dense{'_' + activation if activation else ''}_f32_{layout}")

    def ptr(arr):
        if arr is None or arr.size == 0:
            return ffi.NULL
        return ffi.cast("float *", arr.ctypes.data)

    if layout == "packed":
        status = func(m, n, k, ptr(a), lda, ptr(w), ptr(bias), ptr(out), ldc)
    else:
        status = func(m, n, k, ptr(a), lda, ptr(w), ldw, ptr(bias), ptr(out), ldc)
    _check(func, status)
    return out
