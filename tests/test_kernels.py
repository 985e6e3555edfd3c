"""Tests of the C kernel library: the four dense kernels called through cffi
against a float64 numpy reference, argument validation, the numpy wrapper
``tirbyoc.kernels.dense``, and the static object that TVM links.

Tolerance: float32 results are compared with the float64 reference using
``rtol=1e-5`` and ``atol=1e-5 * max|reference|`` (the absolute part scales
with the magnitude of the whole output, since cancellation in long sums makes
small entries inherently less accurate in relative terms).
"""

import itertools
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from tirbyoc import kernels

ROOT = Path(__file__).resolve().parents[1]
HEADER = ROOT / "kernels" / "tirbyoc_kernels.h"

FUNCS = [
    # (symbol, layout, relu)
    ("tirbyoc_dense_f32_nt", "nt", False),
    ("tirbyoc_dense_relu_f32_nt", "nt", True),
    ("tirbyoc_dense_f32_nn", "nn", False),
    ("tirbyoc_dense_relu_f32_nn", "nn", True),
]
FUNC_IDS = [f[0] for f in FUNCS]
SIZES = (1, 7, 33, 500)


@pytest.fixture(scope="module")
def ffi_lib():
    return kernels.load()


def _ptr(ffi, arr):
    return ffi.NULL if arr is None else ffi.cast("float *", arr.ctypes.data)


def _stride(arr):
    """Row stride in elements, as the C ABI expects it."""
    return arr.strides[0] // arr.itemsize


def call(ffi_lib, symbol, m, n, k, a, lda, w, ldw, bias, c, ldc):
    """Call a kernel with raw pointers (None -> NULL) and return its status."""
    ffi, lib = ffi_lib
    fn = getattr(lib, symbol)
    return fn(m, n, k, _ptr(ffi, a), lda, _ptr(ffi, w), ldw, _ptr(ffi, bias), _ptr(ffi, c), ldc)


def reference(a, w, bias, layout, relu):
    w64 = w.astype(np.float64)
    ref = a.astype(np.float64) @ (w64.T if layout == "nt" else w64)
    if bias is not None:
        ref = ref + bias.astype(np.float64)
    if relu:
        ref = np.maximum(ref, 0.0)
    return ref


def assert_close(c, ref):
    scale = np.abs(ref).max() if ref.size else 0.0
    np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-5 * scale)


def make_operands(rng, m, n, k, layout, pad=0):
    """Random A, W, bias; with pad > 0, A/W are column slices of wider
    NaN-filled arrays (so reading past a row would poison the result)."""

    def matrix(rows, cols):
        full = np.full((rows, cols + pad), np.nan, dtype=np.float32)
        full[:, :cols] = rng.standard_normal((rows, cols), dtype=np.float32)
        return full[:, :cols]

    a = matrix(m, k)
    w = matrix(n, k) if layout == "nt" else matrix(k, n)
    bias = rng.standard_normal(n, dtype=np.float32)
    return a, w, bias


def run_case(ffi_lib, symbol, layout, relu, m, n, k, with_bias, pad=0, seed=0):
    rng = np.random.default_rng(seed)
    a, w, bias = make_operands(rng, m, n, k, layout, pad)
    bias = bias if with_bias else None
    sentinel = np.float32(-12345.0)
    c_full = np.full((m, n + pad), sentinel, dtype=np.float32)
    c = c_full[:, :n]
    lda = _stride(a) if m > 1 else k + pad
    ldw = _stride(w) if w.shape[0] > 1 else w.shape[1] + pad
    ldc = _stride(c) if m > 1 else n + pad
    status = call(ffi_lib, symbol, m, n, k, a, lda, w, ldw, bias, c, ldc)
    assert status == kernels.TIRBYOC_OK
    assert_close(c, reference(a, w, bias, layout, relu))
    # Nothing written between the rows.
    assert (c_full[:, n:] == sentinel).all()


@pytest.mark.parametrize("symbol,layout,relu", FUNCS, ids=FUNC_IDS)
@pytest.mark.parametrize("m,n,k", list(itertools.product(SIZES, repeat=3)))
def test_all_size_combinations(ffi_lib, symbol, layout, relu, m, n, k):
    for with_bias in (False, True):
        run_case(ffi_lib, symbol, layout, relu, m, n, k, with_bias)


@pytest.mark.parametrize("symbol,layout,relu", FUNCS, ids=FUNC_IDS)
@pytest.mark.parametrize("m,n,k", [(64, 500, 800), (17, 65, 257), (128, 130, 129)])
def test_bigger_shapes(ffi_lib, symbol, layout, relu, m, n, k):
    run_case(ffi_lib, symbol, layout, relu, m, n, k, with_bias=True, seed=1)


@pytest.mark.parametrize("symbol,layout,relu", FUNCS, ids=FUNC_IDS)
@pytest.mark.parametrize(
    "m,n,k", [(1, 7, 33), (7, 33, 500), (33, 500, 7), (500, 7, 33), (64, 500, 800), (16, 9, 130)]
)
def test_row_strides_larger_than_rows(ffi_lib, symbol, layout, relu, m, n, k):
    for with_bias in (False, True):
        run_case(ffi_lib, symbol, layout, relu, m, n, k, with_bias, pad=5, seed=2)


@pytest.mark.parametrize("symbol,layout,relu", FUNCS, ids=FUNC_IDS)
def test_empty_m_and_n(ffi_lib, symbol, layout, relu):
    rng = np.random.default_rng(3)
    a, w, bias = make_operands(rng, 4, 5, 3, layout)
    c = np.full((4, 5), 7.0, dtype=np.float32)
    lda, ldw = 3, (3 if layout == "nt" else 5)
    # M == 0: A and C have no elements, so NULL is fine for them.
    assert call(ffi_lib, symbol, 0, 5, 3, None, lda, w, ldw, bias, None, 5) == kernels.TIRBYOC_OK
    # N == 0: W and C are empty.
    assert call(ffi_lib, symbol, 4, 0, 3, a, lda, None, 0 if layout == "nn" else 3, None, c, 0) == kernels.TIRBYOC_OK
    assert (c == 7.0).all()


@pytest.mark.parametrize("symbol,layout,relu", FUNCS, ids=FUNC_IDS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_k_zero_gives_bias_then_activation(ffi_lib, symbol, layout, relu, with_bias):
    m, n = 3, 6
    bias = np.array([-2.0, -0.5, 0.0, 0.5, 2.0, -1.0], dtype=np.float32) if with_bias else None
    c = np.full((m, n), 7.0, dtype=np.float32)
    ldw = 0 if layout == "nt" else n
    # A and W are empty: NULL pointers are valid.
    assert call(ffi_lib, symbol, m, n, 0, None, 0, None, ldw, bias, c, n) == kernels.TIRBYOC_OK
    expected = np.zeros((m, n), dtype=np.float32) if bias is None else np.tile(bias, (m, 1))
    if relu:
        expected = np.maximum(expected, 0)
    np.testing.assert_array_equal(c, expected)


@pytest.mark.parametrize("symbol,layout,relu", FUNCS, ids=FUNC_IDS)
def test_invalid_arguments(ffi_lib, symbol, layout, relu):
    m, n, k = 4, 5, 3
    rng = np.random.default_rng(4)
    a, w, bias = make_operands(rng, m, n, k, layout)
    ldw = k if layout == "nt" else n
    c = np.full((m, n), 7.0, dtype=np.float32)
    good = dict(m=m, n=n, k=k, a=a, lda=k, w=w, ldw=ldw, bias=bias, c=c, ldc=n)
    bad_cases = [
        dict(m=-1), dict(n=-1), dict(k=-1),
        dict(lda=k - 1), dict(ldw=ldw - 1), dict(ldc=n - 1), dict(lda=-3),
        dict(a=None), dict(w=None), dict(c=None),
    ]
    for bad in bad_cases:
        args = {**good, **bad}
        status = call(ffi_lib, symbol, **args)
        assert status == kernels.TIRBYOC_EINVAL, bad
        assert (c == 7.0).all(), f"output written despite invalid {bad}"
    assert call(ffi_lib, symbol, **good) == kernels.TIRBYOC_OK


@pytest.mark.parametrize("layout", ["nt", "nn"])
@pytest.mark.parametrize("m,n,k", [(7, 33, 500), (64, 100, 300), (1, 500, 33)])
def test_relu_matches_plain_kernel(ffi_lib, layout, m, n, k):
    plain, relu = (f"tirbyoc_dense_f32_{layout}", f"tirbyoc_dense_relu_f32_{layout}")
    rng = np.random.default_rng(5)
    a, w, bias = make_operands(rng, m, n, k, layout)
    lda, ldw = _stride(a), _stride(w)
    c_plain = np.empty((m, n), dtype=np.float32)
    c_relu = np.empty((m, n), dtype=np.float32)
    assert call(ffi_lib, plain, m, n, k, a, lda, w, ldw, bias, c_plain, n) == 0
    assert call(ffi_lib, relu, m, n, k, a, lda, w, ldw, bias, c_relu, n) == 0
    ref = reference(a, w, bias, layout, relu=False)
    assert (ref < 0).any() and (ref > 0).any()
    assert (c_relu >= 0).all()
    # Same summation as the plain kernel, then clamped: exactly equal.
    np.testing.assert_array_equal(c_relu, np.where(c_plain < 0, np.float32(0), c_plain))
    # Zero wherever the reference is clearly negative.
    margin = 1e-5 * np.abs(ref).max()
    assert (c_relu[ref < -margin] == 0).all()
    assert_close(c_relu, np.maximum(ref, 0))


@pytest.mark.parametrize("layout", ["nt", "nn"])
def test_relu_propagates_nan(ffi_lib, layout):
    m, n, k = 5, 6, 7
    rng = np.random.default_rng(6)
    a, w, bias = make_operands(rng, m, n, k, layout)
    a[2, 3] = np.nan
    c = np.empty((m, n), dtype=np.float32)
    status = call(ffi_lib, f"tirbyoc_dense_relu_f32_{layout}", m, n, k, a, k, w, _stride(w), bias, c, n)
    assert status == 0
    assert np.isnan(c[2]).all()
    assert not np.isnan(np.delete(c, 2, axis=0)).any()


# --- numpy wrapper -----------------------------------------------------------


@pytest.mark.parametrize("layout", ["nt", "nn"])
@pytest.mark.parametrize("relu", [False, True])
def test_dense_wrapper(layout, relu):
    rng = np.random.default_rng(7)
    a, w, bias = make_operands(rng, 9, 20, 31, layout, pad=3)
    out = kernels.dense(a, w, bias, relu=relu, layout=layout)
    assert out.shape == (9, 20) and out.dtype == np.float32
    assert_close(out, reference(a, w, bias, layout, relu))
    # In-place into a strided view; no bias.
    buf = np.zeros((9, 25), dtype=np.float32)
    res = kernels.dense(a, w, None, relu=relu, layout=layout, out=buf[:, 2:22])
    assert np.shares_memory(res, buf)
    assert_close(buf[:, 2:22], reference(a, w, None, layout, relu))
    assert (buf[:, :2] == 0).all() and (buf[:, 22:] == 0).all()


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


# --- pre-packed weights --------------------------------------------------


@pytest.mark.parametrize("layout", ["nt", "nn"])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (3, 17, 5), (33, 500, 7), (64, 100, 300)])
def test_packed_matches_unpacked(layout, relu, m, n, k):
    rng = np.random.default_rng(9)
    a, w, bias = make_operands(rng, m, n, k, layout, pad=3)
    packed = kernels.pack_weight(w, layout)
    assert packed.size == kernels.packed_weight_size(n, k) == -(-n // 16) * 16 * k
    out = kernels.dense(a, packed, bias, relu=relu, layout="packed")
    assert_close(out, reference(a, w, bias, layout, relu))


# --- symbols and the static object ------------------------------------------


EXPECTED_SYMBOLS = sorted(FUNC_IDS + [
    "tirbyoc_packed_weight_size_f32", "tirbyoc_pack_weight_f32_nt", "tirbyoc_pack_weight_f32_nn",
    "tirbyoc_dense_f32_packed", "tirbyoc_dense_relu_f32_packed",
    "tirbyoc_set_isa", "tirbyoc_isa", "tirbyoc_set_num_threads", "tirbyoc_num_threads",
])


def test_exported_symbols():
    assert sorted(kernels.exported_symbols()) == EXPECTED_SYMBOLS


@pytest.mark.skipif(not HEADER.exists(), reason="kernel sources not available")
def test_header_cdef_block_declares_exported_symbols():
    text = HEADER.read_text()
    block = re.search(r"/\*\s*BEGIN CDEF\s*\*/(.*?)/\*\s*END CDEF\s*\*/", text, re.S).group(1)
    declared = re.findall(r"\b(tirbyoc_\w+)\s*\(", block)
    assert sorted(declared) == sorted(kernels.exported_symbols())


def elf_symbols(path):
    """(name, defined, global, is_function) for every ELF64 LE symbol."""
    data = Path(path).read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "expected ELF64 little-endian"
    (e_type,) = struct.unpack_from("<H", data, 16)
    assert e_type == 1, "expected a relocatable object (ET_REL)"
    e_shoff, = struct.unpack_from("<Q", data, 0x28)
    e_shentsize, e_shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * e_shentsize) for i in range(e_shnum)
    ]
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
