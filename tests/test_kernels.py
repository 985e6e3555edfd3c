"""Tests of the C kernel library: the dense kernels (nt, nn and pre-packed W,
with and without relu) called through cffi against a float64 numpy reference
on every instruction set this CPU supports, weight packing, the ISA and
thread settings, thread safety, argument validation, the numpy wrapper
``tirbyoc.kernels.dense``, and the static object that TVM links.

Tolerance: float32 results are compared with the float64 reference using
``rtol=1e-5`` and ``atol=1e-5 * max|reference| * max(1, sqrt(K) / 8)``: the
absolute part scales with the magnitude of the whole output (cancellation in
long sums makes small entries inherently less accurate in relative terms)
and grows like the rounding error of a K-term float32 sum.
"""

import itertools
import os
import re
import struct
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from tirbyoc import kernels

from .test_conv_kernel import reference as conv_reference
from .test_depthwise_kernel import reference as depthwise_reference

ROOT = Path(__file__).resolve().parents[1]
HEADER = ROOT / "kernels" / "tirbyoc_kernels.h"

FUNCS = [
    # (symbol, layout, relu: False, True or "relu6")
    ("tirbyoc_dense_f32_nt", "nt", False),
    ("tirbyoc_dense_relu_f32_nt", "nt", True),
    ("tirbyoc_dense_relu6_f32_nt", "nt", "relu6"),
    ("tirbyoc_dense_f32_nn", "nn", False),
    ("tirbyoc_dense_relu_f32_nn", "nn", True),
    ("tirbyoc_dense_relu6_f32_nn", "nn", "relu6"),
]
FUNC_IDS = [f[0] for f in FUNCS]
PACKED_FUNCS = [("tirbyoc_dense_f32_packed", False), ("tirbyoc_dense_relu_f32_packed", True),
                ("tirbyoc_dense_relu6_f32_packed", "relu6")]
# Every dense entry point: (layout of the weight as given, symbol, relu);
# "packed-nt" / "packed-nn": W given as [N, K] / [K, N], packed first.
ALL_FUNCS = [(layout, symbol, relu) for symbol, layout, relu in FUNCS] + [
    (f"packed-{base}", symbol, relu) for base in ("nt", "nn") for symbol, relu in PACKED_FUNCS
]
ALL_IDS = [f"{layout}-{relu if isinstance(relu, str) else 'relu' if relu else 'plain'}"
           for layout, _, relu in ALL_FUNCS]
SIZES = (1, 7, 33, 500)
ISAS = kernels.available_isas()


@pytest.fixture(scope="module")
def ffi_lib():
    return kernels.load()


@pytest.fixture
def threads():
    """Restores the thread count setting after the test."""
    saved = kernels.num_threads()
    yield
    kernels.set_num_threads(saved)


def _ptr(ffi, arr):
    return ffi.NULL if arr is None else ffi.cast("float *", arr.ctypes.data)


def _stride(arr):
    """Row stride in elements, as the C ABI expects it."""
    return arr.strides[0] // arr.itemsize


def call(ffi_lib, symbol, m, n, k, a, lda, w, ldw, bias, c, ldc):
    """Call a kernel with raw pointers (None -> NULL) and return its status.
    For the packed kernels ``w`` is the packed buffer and ``ldw`` is ignored."""
    ffi, lib = ffi_lib
    fn = getattr(lib, symbol)
    if symbol.endswith("_packed"):
        return fn(m, n, k, _ptr(ffi, a), lda, _ptr(ffi, w), _ptr(ffi, bias), _ptr(ffi, c), ldc)
    return fn(m, n, k, _ptr(ffi, a), lda, _ptr(ffi, w), ldw, _ptr(ffi, bias), _ptr(ffi, c), ldc)


def base_layout(layout):
    return layout.split("-")[-1]


def reference(a, w, bias, layout, relu):
    """float64 result; ``relu``: False, True, or "relu6"."""
    w64 = w.astype(np.float64)
    ref = a.astype(np.float64) @ (w64.T if base_layout(layout) == "nt" else w64)
    if bias is not None:
        ref = ref + bias.astype(np.float64)
    if relu == "relu6":
        ref = np.clip(ref, 0.0, 6.0)
    elif relu:
        ref = np.maximum(ref, 0.0)
    return ref


def assert_close(c, ref, k=1):
    scale = np.abs(ref).max() if ref.size else 0.0
    np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-5 * scale * max(1.0, np.sqrt(k) / 8))


def make_operands(rng, m, n, k, layout, pad=0):
    """Random A, W, bias; with pad > 0, A/W are column slices of wider
    NaN-filled arrays (so reading past a row would poison the result)."""

    def matrix(rows, cols):
        full = np.full((rows, cols + pad), np.nan, dtype=np.float32)
        full[:, :cols] = rng.standard_normal((rows, cols), dtype=np.float32)
        return full[:, :cols]

    a = matrix(m, k)
    w = matrix(n, k) if base_layout(layout) == "nt" else matrix(k, n)
    bias = rng.standard_normal(n, dtype=np.float32)
    return a, w, bias


def pack(ffi_lib, layout, n, k, w, ldw):
    """Packed buffer (None when empty) of W via the C packing function."""
    ffi, lib = ffi_lib
    size = lib.tirbyoc_packed_weight_size_f32(n, k)
    assert size == -(-n // 16) * 16 * k
    if size == 0:
        return None
    packed = np.full(size, np.nan, dtype=np.float32)
    fn = getattr(lib, f"tirbyoc_pack_weight_f32_{base_layout(layout)}")
    assert fn(n, k, _ptr(ffi, w), ldw, _ptr(ffi, packed)) == kernels.TIRBYOC_OK
    return packed


def run_case(ffi_lib, symbol, layout, relu, m, n, k, with_bias, pad=0, seed=0):
    """Runs one kernel call on random data (output framed by sentinels) and
    checks it against the reference; returns the output."""
    rng = np.random.default_rng(seed)
    a, w, bias = make_operands(rng, m, n, k, layout, pad)
    bias = bias if with_bias else None
    sentinel = np.float32(-12345.0)
    c_full = np.full((m + 1, n + pad), sentinel, dtype=np.float32)
    c = c_full[:m, :n]
    lda = _stride(a) if m > 1 else k + pad
    ldw = _stride(w) if w.shape[0] > 1 else w.shape[1] + pad
    ldc = _stride(c_full)
    if layout.startswith("packed"):
        w_arg = pack(ffi_lib, layout, n, k, w, ldw)
    else:
        w_arg = w
    status = call(ffi_lib, symbol, m, n, k, a, lda, w_arg, ldw, bias, c, ldc)
    assert status == kernels.TIRBYOC_OK
    assert_close(c, reference(a, w, bias, layout, relu), k)
    # Nothing written between the rows or after the last one.
    assert (c_full[:, n:] == sentinel).all()
    assert (c_full[m] == sentinel).all()
    return c.copy()


# --- results on every instruction set -------------------------------------

EDGE_M = (1, 2, 3, 4, 5, 7, 8, 9, 13, 17, 33)
EDGE_N = (1, 15, 16, 17, 31, 33, 100)
EDGE_K = (1, 7, 17, 100)


@pytest.mark.parametrize("layout,symbol,relu", ALL_FUNCS, ids=ALL_IDS)
def test_edge_tiles(ffi_lib, isa, layout, symbol, relu):
    """Every combination of row, column and depth edges of the register tiles."""
    for case, (m, n, k) in enumerate(itertools.product(EDGE_M, EDGE_N, EDGE_K)):
        run_case(ffi_lib, symbol, layout, relu, m, n, k, with_bias=case % 2 == 0, seed=case)


@pytest.mark.parametrize("layout,symbol,relu", ALL_FUNCS, ids=ALL_IDS)
@pytest.mark.parametrize("m,n,k", [(256, 1024, 512), (67, 1300, 777), (500, 64, 1100), (4, 2000, 1500)])
def test_large_shapes(ffi_lib, isa, layout, symbol, relu, m, n, k):
    """Shapes crossing every cache block boundary (K, N and M blocks)."""
    run_case(ffi_lib, symbol, layout, relu, m, n, k, with_bias=True, seed=1)


@pytest.mark.parametrize("layout,symbol,relu", ALL_FUNCS, ids=ALL_IDS)
def test_row_strides_larger_than_rows(ffi_lib, isa, layout, symbol, relu):
    shapes = [(1, 7, 33), (3, 33, 500), (7, 33, 500), (33, 500, 7), (500, 7, 33), (64, 500, 800), (16, 9, 130)]
    for case, (m, n, k) in enumerate(shapes):
        for with_bias in (False, True):
            run_case(ffi_lib, symbol, layout, relu, m, n, k, with_bias, pad=5, seed=2 + case)


@pytest.mark.parametrize("symbol,layout,relu", FUNCS, ids=FUNC_IDS)
@pytest.mark.parametrize("m,n,k", list(itertools.product(SIZES, repeat=3)))
def test_all_size_combinations(ffi_lib, symbol, layout, relu, m, n, k):
    for with_bias in (False, True):
        run_case(ffi_lib, symbol, layout, relu, m, n, k, with_bias)


# Rows up to which a layout takes the matrix-vector path (dense_f32.c).
SMALL_M = {"nt": 8, "nn": 4, "packed": 4}


@pytest.mark.parametrize("base", ["nt", "nn"])
@pytest.mark.parametrize("m,n,k", [(5, 17, 3), (9, 40, 300), (33, 100, 700), (130, 700, 400), (2, 40, 50),
                                   (4, 100, 1000), (7, 300, 200)])
def test_packed_equals_unpacked(ffi_lib, isa, base, m, n, k):
    """Above a few rows, packed and unpacked W go through the same micro-kernel
    with the same blocking: bit-identical. With few rows both are accurate."""
    rng = np.random.default_rng(10)
    a, w, bias = make_operands(rng, m, n, k, base, pad=2)
    for relu in (False, True):
        unpacked = kernels.dense(a, w, bias, activation="relu" if relu else None, layout=base)
        packed = kernels.dense(a, kernels.pack_weight(w, base), bias, activation="relu" if relu else None, layout="packed")
        if m > max(SMALL_M[base], SMALL_M["packed"]):
            np.testing.assert_array_equal(packed, unpacked)
        else:
            assert_close(packed, reference(a, w, bias, base, relu), k)


# "nt" with 9 .. 128 rows (AVX-512; 9 .. 64 on AVX2, beyond that the blocked path)
# takes nt_direct where the ISA has one:
# A packed transposed in chunks of 64 rows, 6-column tiles of 16 (AVX2) or 64
# rows, W rows read in place, K in the blocked path's blocks (256 / 512), and
# the blocked path beyond 64 * K floats of scratch (K > 4356). Shapes at each
# of those edges.
DIRECT_SHAPES = [(9, 1, 1), (16, 6, 16), (17, 7, 513), (48, 12, 1024), (63, 13, 100),
                 (64, 500, 800), (65, 11, 1030), (100, 5, 33), (128, 19, 4356), (128, 3, 4357)]


@pytest.mark.parametrize("relu", [False, True, "relu6"])
def test_nt_direct_path_matches_packed_bit_for_bit(ffi_lib, isa, relu):
    """Accurate with row strides wider than rows, and bit-identical to the packed-W
    kernel (the blocked path) on the same operands."""
    suffix = {False: "", True: "relu_", "relu6": "relu6_"}[relu]
    for case, (m, n, k) in enumerate(DIRECT_SHAPES):
        args = dict(relu=relu, m=m, n=n, k=k, with_bias=case % 2 == 0, pad=3, seed=20 + case)
        nt = run_case(ffi_lib, f"tirbyoc_dense_{suffix}f32_nt", "nt", **args)
        packed = run_case(ffi_lib, f"tirbyoc_dense_{suffix}f32_packed", "packed-nt", **args)
        np.testing.assert_array_equal(nt, packed, err_msg=f"{m}x{k}->{n}")


@pytest.mark.parametrize("base", ["nt", "nn"])
def test_packed_layout_is_fixed(ffi_lib, base):
    """The documented layout, byte for byte, from every instruction set."""
    n, k = 37, 21
    rng = np.random.default_rng(11)
    _, w, _ = make_operands(rng, 1, n, k, base, pad=3)
    wn = w if base == "nt" else w.T  # [N, K]
    expected = np.zeros((-(-n // 16), k, 16), dtype=np.float32)
    for j in range(n):
        expected[j // 16, :, j % 16] = wn[j]
    saved = kernels.isa()
    try:
        for name in ISAS:
            kernels.set_isa(name)
            np.testing.assert_array_equal(kernels.pack_weight(w, base), expected.ravel())
    finally:
        kernels.set_isa(saved)


def test_packed_weight_size(ffi_lib):
    _, lib = ffi_lib
    assert lib.tirbyoc_packed_weight_size_f32(0, 5) == 0
    assert lib.tirbyoc_packed_weight_size_f32(5, 0) == 0
    assert lib.tirbyoc_packed_weight_size_f32(1, 1) == 16
    assert lib.tirbyoc_packed_weight_size_f32(16, 3) == 48
    assert lib.tirbyoc_packed_weight_size_f32(17, 3) == 96
    assert lib.tirbyoc_packed_weight_size_f32(-1, 3) == -1
    assert lib.tirbyoc_packed_weight_size_f32(3, -1) == -1
    assert lib.tirbyoc_packed_weight_size_f32(2**62, 2**10) == -1


@pytest.mark.parametrize("layout,symbol,relu", ALL_FUNCS, ids=ALL_IDS)
@pytest.mark.parametrize("m,n,k", [(300, 700, 600), (40, 2000, 300), (2, 1500, 1500), (7, 1000, 1000),
                                   (700, 40, 400)])
def test_thread_count_does_not_change_results(ffi_lib, isa, threads, layout, symbol, relu, m, n, k):
    """Work is split over N or M, never K: bit-identical for 1, 2 and 3 threads."""
    results = []
    for nt in (1, 2, 3):
        kernels.set_num_threads(nt)
        results.append(run_case(ffi_lib, symbol, layout, relu, m, n, k, with_bias=True, seed=12))
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], results[2])


@pytest.mark.parametrize("layout", ["nt", "nn", "packed"])
def test_concurrent_calls_from_python_threads(isa, threads, layout):
    """cffi releases the GIL: four threads call the kernels at once (the pool
    serves one of them, the others run on their own threads)."""
    kernels.set_num_threads(2)
    rng = np.random.default_rng(13)
    shapes = [(200, 300, 400), (3, 1000, 700), (64, 500, 800), (150, 40, 900)]
    cases = []
    for m, n, k in shapes:
        a, w, bias = make_operands(rng, m, n, k, "nt")
        wl = kernels.pack_weight(w, "nt") if layout == "packed" else (w if layout == "nt" else np.ascontiguousarray(w.T))
        expected = kernels.dense(a, wl, bias, activation="relu", layout=layout, n=n)
        cases.append((a, wl, bias, n, expected))
    errors = []

    def worker(index):
        a, wl, bias, n, expected = cases[index]
        out = np.empty_like(expected)
        try:
            for _ in range(15):
                out[:] = np.nan
                kernels.dense(a, wl, bias, activation="relu", layout=layout, out=out, n=n)
                np.testing.assert_array_equal(out, expected)
        except Exception as exc:  # reported in the main thread
            errors.append((index, exc))

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(len(cases))]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_kernels_work_after_fork(threads):
    """The worker pool is rebuilt in a forked child (its threads do not survive fork)."""
    kernels.set_num_threads(2)
    rng = np.random.default_rng(14)
    a, w, bias = make_operands(rng, 300, 400, 500, "nt")
    expected = kernels.dense(a, w, bias)  # the parent's pool exists now
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            out = kernels.dense(a, w, bias)
            code = 0 if np.array_equal(out, expected) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    np.testing.assert_array_equal(kernels.dense(a, w, bias), expected)


# --- settings ----------------------------------------------------------------


def test_isa_settings():
    saved = kernels.isa()
    assert saved in ISAS and ISAS[0] == "generic"
    assert ISAS == [name for name in ("generic", "avx2", "avx512") if name in ISAS]
    try:
        for name in ISAS:
            kernels.set_isa(name)
            assert kernels.isa() == name
        for bad in ("sse", "", "AVX2", "avx512 "):
            with pytest.raises(ValueError):
                kernels.set_isa(bad)
        _, lib = kernels.load()
        assert lib.tirbyoc_set_isa(kernels.load()[0].NULL) == kernels.TIRBYOC_EINVAL
        for name in {"generic", "avx2", "avx512"} - set(ISAS):
            assert lib.tirbyoc_set_isa(name.encode()) == kernels.TIRBYOC_EINVAL
    finally:
        kernels.set_isa(saved)
    assert kernels.isa() == saved


def test_thread_settings(threads):
    _, lib = kernels.load()
    assert kernels.num_threads() >= 1
    kernels.set_num_threads(3)
    assert kernels.num_threads() == 3
    for bad in (0, -1):
        assert lib.tirbyoc_set_num_threads(bad) == kernels.TIRBYOC_EINVAL
        with pytest.raises(ValueError):
            kernels.set_num_threads(bad)
    assert kernels.num_threads() == 3


def _settings_in_subprocess(**env):
    """(isa, threads) seen by a fresh process with the given environment; the
    extension is opened with ctypes there, which avoids importing the package."""
    from tirbyoc import _kernels

    code = (
        "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); "
        "lib.tirbyoc_isa.restype = ctypes.c_char_p; "
        "print(lib.tirbyoc_isa().decode(), lib.tirbyoc_num_threads())"
    )
    result = subprocess.run([sys.executable, "-c", code, _kernels.__file__], cwd=ROOT,
                            env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    isa_name, nthreads = result.stdout.split()
    return isa_name, int(nthreads)


def test_environment_variables_are_honoured():
    assert _settings_in_subprocess(TIRBYOC_ISA="generic", TIRBYOC_NUM_THREADS="3") == ("generic", 3)
    if "avx2" in ISAS:
        assert _settings_in_subprocess(TIRBYOC_ISA="avx2")[0] == "avx2"
    # A cap above what the CPU supports, or an unknown name, leaves the best one.
    assert _settings_in_subprocess(TIRBYOC_ISA="avx512")[0] == ISAS[-1]
    assert _settings_in_subprocess(TIRBYOC_ISA="bogus")[0] == ISAS[-1]
    # Default thread count: the CPUs this process may run on.
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert _settings_in_subprocess(TIRBYOC_NUM_THREADS="")[1] == min(expected, 64)


# --- argument handling ---------------------------------------------------------


@pytest.mark.parametrize("layout,symbol,relu", ALL_FUNCS, ids=ALL_IDS)
def test_empty_m_and_n(ffi_lib, layout, symbol, relu):
    rng = np.random.default_rng(3)
    a, w, bias = make_operands(rng, 4, 5, 3, layout)
    c = np.full((4, 5), 7.0, dtype=np.float32)
    lda = 3
    ldw = 3 if base_layout(layout) == "nt" else 5
    w_arg = pack(ffi_lib, layout, 5, 3, w, ldw) if layout.startswith("packed") else w
    # M == 0: A and C have no elements, so NULL is fine for them.
    assert call(ffi_lib, symbol, 0, 5, 3, None, lda, w_arg, ldw, bias, None, 5) == kernels.TIRBYOC_OK
    # N == 0: W and C are empty.
    ldw0 = 0 if base_layout(layout) == "nn" else 3
    assert call(ffi_lib, symbol, 4, 0, 3, a, lda, None, ldw0, None, c, 0) == kernels.TIRBYOC_OK
    assert (c == 7.0).all()


@pytest.mark.parametrize("layout,symbol,relu", ALL_FUNCS, ids=ALL_IDS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_k_zero_gives_bias_then_activation(ffi_lib, layout, symbol, relu, with_bias):
    m, n = 3, 6
    bias = np.array([-2.0, -0.5, 0.0, 0.5, 2.0, -1.0], dtype=np.float32) if with_bias else None
    c = np.full((m, n), 7.0, dtype=np.float32)
    ldw = 0 if base_layout(layout) == "nt" else n
    # A and W are empty: NULL pointers are valid.
    assert call(ffi_lib, symbol, m, n, 0, None, 0, None, ldw, bias, c, n) == kernels.TIRBYOC_OK
    expected = np.zeros((m, n), dtype=np.float32) if bias is None else np.tile(bias, (m, 1))
    if relu:
        expected = np.maximum(expected, 0)
    np.testing.assert_array_equal(c, expected)


@pytest.mark.parametrize("layout,symbol,relu", ALL_FUNCS, ids=ALL_IDS)
def test_invalid_arguments(ffi_lib, layout, symbol, relu):
    m, n, k = 4, 5, 3
    rng = np.random.default_rng(4)
    a, w, bias = make_operands(rng, m, n, k, layout)
    ldw = k if base_layout(layout) == "nt" else n
    packed = layout.startswith("packed")
    w_arg = pack(ffi_lib, layout, n, k, w, ldw) if packed else w
    c = np.full((m, n), 7.0, dtype=np.float32)
    good = dict(m=m, n=n, k=k, a=a, lda=k, w=w_arg, ldw=ldw, bias=bias, c=c, ldc=n)
    size, stride, null = kernels.TIRBYOC_ESIZE, kernels.TIRBYOC_ESTRIDE, kernels.TIRBYOC_ENULL
    bad_cases = [
        (dict(m=-1), size), (dict(n=-1), size), (dict(k=-1), size),
        (dict(lda=k - 1), stride), (dict(ldc=n - 1), stride), (dict(lda=-3), stride),
        (dict(a=None), null), (dict(w=None), null), (dict(c=None), null),
    ]
    if not packed:
        bad_cases.append((dict(ldw=ldw - 1), stride))
    for bad, expected in bad_cases:
        args = {**good, **bad}
        status = call(ffi_lib, symbol, **args)
        assert status == expected, bad
        assert (c == 7.0).all(), f"output written despite invalid {bad}"
    assert call(ffi_lib, symbol, **good) == kernels.TIRBYOC_OK


@pytest.mark.parametrize("base", ["nt", "nn"])
def test_pack_invalid_arguments(ffi_lib, base):
    ffi, lib = ffi_lib
    fn = getattr(lib, f"tirbyoc_pack_weight_f32_{base}")
    n, k = 5, 3
    w = np.ones((n, k) if base == "nt" else (k, n), dtype=np.float32)
    ldw = w.shape[1]
    out = np.full(lib.tirbyoc_packed_weight_size_f32(n, k), 7.0, dtype=np.float32)
    p_w, p_out = _ptr(ffi, w), _ptr(ffi, out)
    for args, expected in [((-1, k, p_w, ldw, p_out), kernels.TIRBYOC_ESIZE),
                           ((n, -1, p_w, ldw, p_out), kernels.TIRBYOC_ESIZE),
                           ((n, k, p_w, ldw - 1, p_out), kernels.TIRBYOC_ESTRIDE),
                           ((n, k, ffi.NULL, ldw, p_out), kernels.TIRBYOC_ENULL),
                           ((n, k, p_w, ldw, ffi.NULL), kernels.TIRBYOC_ENULL)]:
        assert fn(*args) == expected, args
        assert (out == 7.0).all()
    # Empty weights need no buffers.
    assert fn(0, k, ffi.NULL, ldw, ffi.NULL) == kernels.TIRBYOC_OK
    assert fn(n, 0, ffi.NULL, ldw if base == "nn" else 0, ffi.NULL) == kernels.TIRBYOC_OK
    assert fn(n, k, p_w, ldw, p_out) == kernels.TIRBYOC_OK


@pytest.mark.parametrize("layout", ["nt", "nn", "packed-nt"])
@pytest.mark.parametrize("m,n,k", [(7, 33, 500), (64, 100, 300), (1, 500, 33)])
def test_relu_matches_plain_kernel(ffi_lib, isa, layout, m, n, k):
    rng = np.random.default_rng(5)
    a, w, bias = make_operands(rng, m, n, k, layout)
    w_arg = kernels.pack_weight(w, "nt") if layout.startswith("packed") else w
    lay = "packed" if layout.startswith("packed") else layout
    c_plain = kernels.dense(a, w_arg, bias, activation=None, layout=lay, n=n)
    c_relu = kernels.dense(a, w_arg, bias, activation="relu", layout=lay, n=n)
    ref = reference(a, w, bias, layout, relu=False)
    assert (ref < 0).any() and (ref > 0).any()
    assert (c_relu >= 0).all()
    # Same summation as the plain kernel, then clamped: exactly equal.
    np.testing.assert_array_equal(c_relu, np.where(c_plain < 0, np.float32(0), c_plain))
    # Zero wherever the reference is clearly negative.
    margin = 1e-5 * np.abs(ref).max()
    assert (c_relu[ref < -margin] == 0).all()
    assert_close(c_relu, np.maximum(ref, 0), k)


@pytest.mark.parametrize("layout", ["nt", "nn", "packed-nt"])
@pytest.mark.parametrize("m", [2, 5, 40])
def test_relu_propagates_nan(ffi_lib, isa, layout, m):
    n, k = 37, 7
    rng = np.random.default_rng(6)
    a, w, bias = make_operands(rng, m, n, k, layout)
    a[1, 3] = np.nan
    w_arg = kernels.pack_weight(w, "nt") if layout.startswith("packed") else w
    lay = "packed" if layout.startswith("packed") else layout
    c = kernels.dense(a, w_arg, bias, activation="relu", layout=lay, n=n)
    assert np.isnan(c[1]).all()
    assert not np.isnan(np.delete(c, 1, axis=0)).any()


# --- numpy wrapper -----------------------------------------------------------


@pytest.mark.parametrize("layout", ["nt", "nn", "packed"])
@pytest.mark.parametrize("relu", [False, True])
def test_dense_wrapper(layout, relu):
    rng = np.random.default_rng(7)
    base = "nn" if layout == "nn" else "nt"
    a, w, bias = make_operands(rng, 9, 20, 31, base, pad=3)
    w_arg = kernels.pack_weight(w, base) if layout == "packed" else w
    assert w_arg.ctypes.data % 64 == 0 or layout != "packed"
    out = kernels.dense(a, w_arg, bias, activation="relu" if relu else None, layout=layout)
    assert out.shape == (9, 20) and out.dtype == np.float32
    assert_close(out, reference(a, w, bias, base, relu))
    # In-place into a strided view; no bias.
    buf = np.zeros((9, 25), dtype=np.float32)
    res = kernels.dense(a, w_arg, None, activation="relu" if relu else None, layout=layout, out=buf[:, 2:22])
    assert np.shares_memory(res, buf)
    assert_close(buf[:, 2:22], reference(a, w, None, base, relu))
    assert (buf[:, :2] == 0).all() and (buf[:, 22:] == 0).all()
    if layout == "packed":
        # N from the explicit argument when neither out nor bias gives it.
        assert_close(kernels.dense(a, w_arg, n=20, activation="relu" if relu else None, layout=layout), reference(a, w, None, base, relu))


def test_dense_wrapper_rejects_bad_inputs():
    a = np.ones((4, 3), dtype=np.float32)
    w = np.ones((5, 3), dtype=np.float32)
    with pytest.raises(TypeError):
        kernels.dense(a.astype(np.float64), w)
    with pytest.raises(ValueError):
        kernels.dense(np.ones((4, 6), dtype=np.float32)[:, ::2], w)  # inner stride 2
    with pytest.raises(ValueError):
        kernels.dense(a, w, layout="nn")  # K mismatch for [K, N]
    with pytest.raises(ValueError):
        kernels.dense(a, w, bias=np.ones(4, dtype=np.float32))
    with pytest.raises(ValueError):
        kernels.dense(a, w, layout="tn")
    with pytest.raises(ValueError):
        kernels.dense(a, w, out=np.empty((4, 4), dtype=np.float32))
    packed = kernels.pack_weight(w, "nt")
    with pytest.raises(ValueError):
        kernels.dense(a, packed, layout="packed")  # N unknown
    with pytest.raises(ValueError):
        kernels.dense(a, packed, layout="packed", n=17)  # size mismatch
    with pytest.raises(ValueError):
        kernels.dense(a, w, layout="packed", n=5)  # not a packed buffer
    with pytest.raises(ValueError):
        kernels.pack_weight(w, "packed")


# --- symbols and the static object ------------------------------------------

EXPECTED_SYMBOLS = sorted(FUNC_IDS + [
    "tirbyoc_packed_weight_size_f32", "tirbyoc_pack_weight_f32_nt", "tirbyoc_pack_weight_f32_nn",
    "tirbyoc_dense_f32_packed", "tirbyoc_dense_relu_f32_packed", "tirbyoc_dense_relu6_f32_packed",
    "tirbyoc_dense_acc_f32_nt", "tirbyoc_dense_acc_f32_nn",
    "tirbyoc_set_isa", "tirbyoc_isa", "tirbyoc_set_num_threads", "tirbyoc_num_threads",
    "tirbyoc_cache_sizes",
    "tirbyoc_status_string", "tirbyoc_matmul_f32", "tirbyoc_unary_f32", "tirbyoc_softmax_f32",
    "tirbyoc_attention_f32",
    "tirbyoc_conv2d_f32", "tirbyoc_conv2d_packed_size_f32", "tirbyoc_pack_conv2d_weight_f32",
    "tirbyoc_conv2d_f32_packed", "tirbyoc_depthwise_conv2d_f32", "tirbyoc_max_pool2d_f32",
    "tirbyoc_conv2d_winograd_suits", "tirbyoc_conv2d_winograd_packed_size_f32",
    "tirbyoc_conv2d_direct_plan",
    "tirbyoc_conv2d_direct_suits",
    "tirbyoc_pack_conv2d_winograd_weight_f32", "tirbyoc_conv2d_winograd_f32",
    "tirbyoc_conv2d_winograd_cached_f32", "tirbyoc_winograd_cache_stats",
    "tirbyoc_conv2d_f32_packed_layouts", "tirbyoc_depthwise_conv2d_f32_layouts",
    "tirbyoc_max_pool2d_f32_layouts",
])


def test_exported_symbols():
    assert sorted(kernels.exported_symbols()) == EXPECTED_SYMBOLS


def test_one_build_of_the_extension_beside_the_package():
    """Python imports tirbyoc/_kernels.cpython-3XX-*.so before _kernels.abi3.so: with an
    older build under the other name beside the new one, the old kernels would run and be
    tested (setup.py removes the others on an in-place build)."""
    builds = sorted(Path(kernels.__file__).parent.glob("_kernels.*.so"))
    assert len(builds) <= 1, builds


@pytest.mark.skipif(not HEADER.exists(), reason="kernel sources not available")
def test_header_cdef_block_declares_exported_symbols():
    text = HEADER.read_text()
    block = re.search(r"/\*\s*BEGIN CDEF\s*\*/(.*?)/\*\s*END CDEF\s*\*/", text, re.S).group(1)
    declared = re.findall(r"\b(tirbyoc_\w+)\s*\(", block)
    assert sorted(declared) == sorted(kernels.exported_symbols())


def _elf_sections(path):
    """(file bytes, section headers) of an ELF64 LE relocatable object."""
    data = Path(path).read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "expected ELF64 little-endian"
    (e_type,) = struct.unpack_from("<H", data, 16)
    assert e_type == 1, "expected a relocatable object (ET_REL)"
    e_shoff, = struct.unpack_from("<Q", data, 0x28)
    e_shentsize, e_shnum = struct.unpack_from("<HH", data, 0x3A)
    return data, [
        struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * e_shentsize) for i in range(e_shnum)
    ]


def elf_section_names(path):
    data, sections = _elf_sections(path)
    (e_shstrndx,) = struct.unpack_from("<H", data, 0x3E)
    names_at = sections[e_shstrndx][4]
    return [data[names_at + sh[0]:data.index(b"\0", names_at + sh[0])].decode()
            for sh in sections]


def elf_symbols(path):
    """(name, defined, global, is_function) for every ELF64 LE symbol."""
    data, sections = _elf_sections(path)
    symbols = []
    for sh in sections:
        sh_type, sh_offset, sh_size, sh_link, sh_entsize = sh[1], sh[4], sh[5], sh[6], sh[9]
        if sh_type != 2:  # SHT_SYMTAB
            continue
        str_off = sections[sh_link][4]
        for off in range(sh_offset, sh_offset + sh_size, sh_entsize):
            st_name, st_info, _, st_shndx = struct.unpack_from("<IBBH", data, off)
            end = data.index(b"\0", str_off + st_name)
            name = data[str_off + st_name:end].decode()
            symbols.append((name, st_shndx != 0, st_info >> 4 == 1, st_info & 0xF == 2))
    return symbols


def test_static_object_defines_every_exported_symbol():
    path = kernels.static_library_path()
    symbols = elf_symbols(path)
    defined_functions = {name for name, defined, glob, func in symbols if defined and glob and func}
    assert set(kernels.exported_symbols()) <= defined_functions
    # A plain C object: nothing from Python.
    assert not [name for name, *_ in symbols if name.startswith(("Py", "_Py"))]


def test_static_object_carries_no_debug_information():
    """Every exported model library links the static object: its debug sections (most of
    its size) stay out, except in a sanitizer build, whose reports name source lines."""
    import os

    if os.environ.get("TIRBYOC_SANITIZE"):
        pytest.skip("a sanitizer build keeps its debug information")
    names = elf_section_names(kernels.static_library_path())
    assert ".text" in names and ".symtab" in names
    assert not [n for n in names if n.startswith((".debug", ".rela.debug"))], names


# --- linking through TVM ---------------------------------------------------


@pytest.mark.parametrize("symbol,layout,relu", FUNCS, ids=FUNC_IDS)
def test_static_library_links_into_tvm_module(tmp_path, symbol, layout, relu):
    tvm = pytest.importorskip("tvm")
    from tvm.script import tirx as T

    m, n, k, lda = 6, 10, 9, 12  # A is a [6, 9] view of a [6, 12] buffer
    w_shape = (n, k) if layout == "nt" else (k, n)
    ldw = w_shape[1]

    @T.prim_func
    def main(
        A: T.Buffer((m, lda), "float32"),
        W: T.Buffer(w_shape, "float32"),
        B: T.Buffer((n,), "float32"),
        C: T.Buffer((m, n), "float32"),
    ):
        T.func_attr({"global_symbol": "main", "tir.noalias": True})
        T.evaluate(T.call_extern("int32", symbol, m, n, k, A.data, lda, W.data, ldw, B.data, C.data, n))

    static = kernels.static_library()
    assert static.kind == "static_library"
    assert all(static.implements_function(s) for s in kernels.exported_symbols())
    lib = tvm.tirx.build(tvm.IRModule({"main": main}), target="llvm")
    lib.import_module(static)
    so = str(tmp_path / "lib.so")
    lib.export_library(so)
    loaded = tvm.runtime.load_module(so)

    rng = np.random.default_rng(8)
    a_full = rng.standard_normal((m, lda), dtype=np.float32)
    w = rng.standard_normal(w_shape, dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    c = tvm.runtime.tensor(np.zeros((m, n), dtype=np.float32))
    loaded["main"](tvm.runtime.tensor(a_full), tvm.runtime.tensor(w), tvm.runtime.tensor(bias), c)
    assert_close(c.numpy(), reference(a_full[:, :k], w, bias, layout, relu))


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (3, 17, 5), (7, 33, 500), (64, 100, 300),
                                   (130, 40, 1100)])
@pytest.mark.parametrize("layout", ["nt", "nn"])
def test_accumulating_kernel_adds_to_c(ffi_lib, isa, m, n, k, layout):
    """tirbyoc_dense_acc_f32_*: C += A @ op(W), for C with a row stride and any rows."""
    ffi, lib = ffi_lib
    rng = np.random.default_rng(m * 1000 + n + k)
    a, w, _ = make_operands(rng, m, n, k, layout, pad=3)
    full = np.full((m, n + 5), np.nan, dtype=np.float32)
    full[:, :n] = rng.standard_normal((m, n), dtype=np.float32)
    c = full[:, :n]
    start = c.astype(np.float64)
    fn = getattr(lib, f"tirbyoc_dense_acc_f32_{layout}")
    status = fn(m, n, k, _ptr(ffi, a), a.strides[0] // 4, _ptr(ffi, w), w.strides[0] // 4,
                _ptr(ffi, c), c.strides[0] // 4)
    assert status == kernels.TIRBYOC_OK
    assert_close(c, start + reference(a, w, None, layout, relu=False), k)
    assert np.isnan(full[:, n:]).all()  # nothing written past the rows
    # K == 0 adds nothing; bad strides are refused before anything is written
    before = c.copy()
    assert fn(m, n, 0, _ptr(ffi, a), k, _ptr(ffi, w), w.strides[0] // 4, _ptr(ffi, c),
              c.strides[0] // 4) == kernels.TIRBYOC_OK
    assert fn(m, n, k, _ptr(ffi, a), k - 1, _ptr(ffi, w), w.strides[0] // 4, _ptr(ffi, c),
              c.strides[0] // 4) == kernels.TIRBYOC_ESTRIDE
    np.testing.assert_array_equal(c, before)


def test_new_outputs_are_64_byte_aligned_and_right():
    """Outputs the Python functions allocate start on a 64-byte line, as TVM's tensors do
    (NumPy puts large arrays 16 bytes past one, which splits every NCHW16c pixel and
    packed row across two lines), with the same values as before."""
    rng = np.random.default_rng(3)

    def check(out, want, tol=1e-4):
        assert out.ctypes.data % 64 == 0
        assert out.dtype == np.float32 and out.flags.c_contiguous
        np.testing.assert_allclose(out, want, rtol=tol, atol=tol)

    # large enough that NumPy's own allocation would be misaligned
    a = rng.standard_normal((96, 160)).astype(np.float32)
    w = rng.standard_normal((128, 160)).astype(np.float32)
    check(kernels.dense(a, w), a @ w.T, 1e-3)
    b3 = rng.standard_normal((2, 160, 96)).astype(np.float32)
    check(kernels.matmul(np.stack([a, a]), b3), np.stack([a, a]) @ b3, 1e-3)
    x = rng.standard_normal((1, 32, 20, 20)).astype(np.float32)
    check(kernels.unary("relu", x), np.maximum(x, 0))
    s = rng.standard_normal((64, 300)).astype(np.float32)
    e = np.exp(s - s.max(axis=1, keepdims=True))
    check(kernels.softmax(s), e / e.sum(axis=1, keepdims=True))
    blocked = kernels.to_nchw16c(x)
    check(blocked, x.reshape(1, 2, 16, 20, 20).transpose(0, 1, 3, 4, 2))
    check(kernels.from_nchw16c(blocked), x)
    wc = rng.standard_normal((48, 32, 1, 1)).astype(np.float32)
    check(kernels.conv2d(x, wc), conv_reference(x, wc, (1, 1), (0, 0), (1, 1), (20, 20),
                                               ())[0], 1e-3)
    wd = rng.standard_normal((32, 1, 3, 3)).astype(np.float32)
    check(kernels.depthwise_conv2d(x, wd, padding=1),
          depthwise_reference(x, wd, (1, 1), (1, 1), (1, 1), (20, 20), ())[0], 1e-3)
    pooled = kernels.max_pool2d(x, 2)
    check(pooled, x.reshape(1, 32, 10, 2, 10, 2).max(axis=(3, 5)))
