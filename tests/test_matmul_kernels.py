"""tirbyoc_matmul_f32 (batches, broadcasts, epilogue chains) and tirbyoc_unary_f32 through
cffi, on every instruction set this CPU has, against float64 numpy.

Products: tolerance 1e-5 * sqrt(sum of squared terms) * max(1, sqrt(K) / 8), times the
chain's scale, plus 1e-6 of the value (as tests/test_kernel_fuzz.py). Unary operations:
relative 5e-7 (tanh, sigmoid, silu), 5e-7 / 1e-6 (erf GELU above / below x = -2) and
7e-7 / 2e-5 (tanh GELU) of the exact float64 value, absolute floor 1e-37; NaN and Inf as PyTorch gives them, except
gelu(+inf) = +inf (PyTorch's float32 GELU gives NaN there).
"""

import math

import numpy as np
import pytest

from tirbyoc import kernels

# the float64 references of the unary operations (stable forms), shared with the fuzz
from .test_kernel_fuzz import CHAIN_REFERENCE as UNARY, chain_growth  # noqa: E402


def reference(a, b, layout, ops, scale, bias, residual):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if layout == "nt":
        b64 = np.swapaxes(b64, -1, -2)
    v = a64 @ b64
    err = np.sqrt(np.abs(a64) ** 2 @ np.abs(b64) ** 2) * 1e-5 * max(1.0, math.sqrt(a.shape[-1]) / 8)
    for op in ops:
        if op == "bias":
            v = v + bias
        elif op == "residual":
            v = v + residual
        elif op == "scale":
            v, err = v * scale, err * abs(scale)
        elif op == "divide":
            v, err = v / scale, err / abs(scale)
        else:  # chain_growth, and the op's own error (see UNARY_RTOL)
            v = UNARY[op](v)
            err = err * chain_growth(op) + (2e-5 if op.startswith("gelu") else 1e-6) * np.abs(v)
    return v, err + 1e-6 * np.abs(v) + 1e-30


CHAINS = [(), ("bias",), ("divide",), ("scale", "bias", "relu", "tanh"),
          ("bias", "gelu_tanh", "residual"), ("residual", "relu6"), ("bias", "gelu_erf"),
          ("silu", "scale"), ("sigmoid",), ("bias", "relu", "residual", "tanh")]
SHAPES = [(1, 1, 1, 1), (12, 16, 16, 8), (3, 17, 33, 5), (2, 1, 40, 7), (4, 29, 65, 0),
          (1, 130, 70, 300), (2, 9, 130, 257), (5, 64, 64, 64)]


@pytest.mark.parametrize("chain", CHAINS, ids=["-".join(c) or "plain" for c in CHAINS])
@pytest.mark.parametrize("layout", ["nn", "nt"])
def test_matmul_chain_matches_numpy(isa, layout, chain):
    rng = np.random.default_rng(len(chain) * 7 + (layout == "nt"))
    for batch, m, n, k in SHAPES:
        for broadcast in ("none", "a", "b"):
            a = rng.standard_normal((1 if broadcast == "a" else batch, m, k)).astype(np.float32)
            bshape = (n, k) if layout == "nt" else (k, n)
            b = rng.standard_normal((1 if broadcast == "b" else batch,) + bshape).astype(np.float32)
            bias = rng.standard_normal(n).astype(np.float32)
            res = rng.standard_normal((batch, m, n)).astype(np.float32)
            if broadcast == "a" and batch > 1:  # a [1, m, k] over the batch: stride 0
                a = np.broadcast_to(a, (batch, m, k))
            got = kernels.matmul(a, b, b_layout=layout, epilogue=chain, scale=8.0, bias=bias,
                                 residual=res)
            want, tol = reference(a, b, layout, chain, 8.0, bias, res)
            assert got.shape == (batch, m, n)
            assert np.all(np.abs(got - want) <= tol), (batch, m, n, k, broadcast)


def test_matmul_strided_operands_and_packed_weight(isa):
    rng = np.random.default_rng(3)
    batch, m, n, k = 3, 37, 50, 70
    a = rng.standard_normal((batch, m, k + 5)).astype(np.float32)[:, :, :k]  # padded rows
    w = rng.standard_normal((n, k)).astype(np.float32)
    out = np.full((batch, m, n + 3), np.float32(7.0))
    res = rng.standard_normal((batch, m, n + 9)).astype(np.float32)[:, :, :n]
    kernels.matmul(a, w, b_layout="nt", epilogue=("residual", "gelu_erf"), residual=res,
                   out=out[:, :, :n])
    want, tol = reference(a, w, "nt", ("residual", "gelu_erf"), 1.0, None, res)
    assert np.all(np.abs(out[:, :, :n] - want) <= tol)
    assert np.all(out[:, :, n:] == 7.0)  # the padding of C is untouched
    packed = kernels.pack_weight(w, "nt")
    got = kernels.matmul(a, packed, b_layout="packed", n=n, epilogue=("silu",))
    want, tol = reference(a, w, "nt", ("silu",), 1.0, None, None)
    assert np.all(np.abs(got - want) <= tol)


def on_each_thread_count(fn, counts=(1, 2, 3)):
    """[fn() with the kernels on each thread count]; the setting is restored."""
    saved = kernels.num_threads()
    try:
        outs = []
        for threads in counts:
            kernels.set_num_threads(threads)
            outs.append(fn())
    finally:
        kernels.set_num_threads(saved)
    return outs


@pytest.mark.parametrize("layout", ["nt", "nn"])
@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_few_rows_do_not_depend_on_threads(isa, m, layout):
    """The few-rows path, weights as inputs: columns go to threads in units of 64 (1100 =
    17 units and 12 columns), and within a thread's share through register blocks of
    several columns and a narrower one for what is left, so a column meets a different
    block on another thread count. Each column must be summed the same way in every
    block: the same bits on 1, 2, 3 and 8 threads, and right (the bound of the other
    tests: 1e-5 of the root of the sum of squared terms, times sqrt(K) / 8 for this K,
    plus 1e-6 of the value)."""
    rng = np.random.default_rng(m)
    k, n = 1000, 1100
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k) if layout == "nt" else (k, n)).astype(np.float32)
    outs = on_each_thread_count(
        lambda: kernels.dense(a, w, activation="relu", layout=layout), (1, 2, 3, 8))
    assert all(np.array_equal(outs[0], o) for o in outs[1:])
    w_kn = (w.T if layout == "nt" else w).astype(np.float64)
    a64 = a.astype(np.float64)
    want = np.maximum(a64 @ w_kn, 0)
    tol = 1e-5 * np.sqrt((a64 ** 2) @ (w_kn ** 2)) * np.sqrt(k) / 8 + 1e-6 * np.abs(want)
    assert np.all(np.abs(outs[0] - want) <= tol)


@pytest.mark.parametrize("chain", [(), ("scale", "residual", "relu"), ("bias", "tanh")],
                         ids=["plain", "scale-residual-relu", "bias-tanh"])
def test_matrix_times_vector_batches(isa, chain):
    """N = 1 in the nn layout (a mixture of experts' gathered weights times their tokens)
    runs as its transpose, the vector against A's rows on the few-rows path (a per-column
    bias keeps the blocked path): right against float64 numpy with A or the vector
    broadcast over the batch, and the same bits on 1, 2, 3 and 8 threads."""
    rng = np.random.default_rng(len(chain))
    for batch, m, k in [(128, 300, 70), (3, 2000, 513), (1, 37, 1), (5, 1, 64)]:
        for broadcast in ("none", "a", "b"):
            a = rng.standard_normal((1 if broadcast == "a" else batch, m, k)).astype(np.float32)
            b = rng.standard_normal((1 if broadcast == "b" else batch, k, 1)).astype(np.float32)
            bias = rng.standard_normal(1).astype(np.float32)
            res = rng.standard_normal((batch, m, 1)).astype(np.float32)
            if broadcast == "a" and batch > 1:
                a = np.broadcast_to(a, (batch, m, k))
            outs = on_each_thread_count(lambda: kernels.matmul(
                a, b, epilogue=chain, scale=0.5, bias=bias, residual=res), (1, 2, 3, 8))
            assert all(np.array_equal(outs[0], o) for o in outs[1:]), (batch, m, k, broadcast)
            want, tol = reference(a, b, "nn", chain, 0.5, bias, res)
            assert outs[0].shape == (batch, m, 1)
            assert np.all(np.abs(outs[0] - want) <= tol), (batch, m, k, broadcast)


@pytest.mark.parametrize("batch,m", [(12, 128), (4, 256), (6, 256), (7, 256)])
def test_matmul_results_do_not_depend_on_threads(isa, batch, m):
    """Small batches (2 MFLOP each) go to threads whole; batches above the split
    threshold (8 MFLOP) too when they spread evenly (4 and 6 on 2 threads, 6 on 3), and
    are split otherwise (7 on 2 or 3, 4 on 3): the same bits as one thread, and right."""
    rng = np.random.default_rng(batch)
    a = rng.standard_normal((batch, m, 64)).astype(np.float32)
    b = rng.standard_normal((batch, m, 64)).astype(np.float32)
    outs = on_each_thread_count(lambda: kernels.matmul(
        a, b, b_layout="nt", epilogue=("divide", "tanh"), scale=8.0))
    assert all(np.array_equal(outs[0], o) for o in outs[1:])
    want, tol = reference(a, b, "nt", ("divide", "tanh"), 8.0, None, None)
    assert np.all(np.abs(outs[0] - want) <= tol)


@pytest.mark.parametrize("layout", ["nn", "nt", "packed"])
def test_chain_on_row_groups_across_k_and_column_blocks(isa, layout):
    """The blocked path applies the chain to each register tile after its last K block:
    several K blocks (K > 512), several column blocks (N > 512), a partial last row group,
    bias and residual indexed by the absolute row and column; the same bits on any thread
    count."""
    rng = np.random.default_rng(5)
    m, n, k = 45, 1100, 1100
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k) if layout != "nn" else (k, n)).astype(np.float32)
    b = kernels.pack_weight(w, "nt") if layout == "packed" else w
    bias = rng.standard_normal(n).astype(np.float32)
    res = rng.standard_normal((m, n)).astype(np.float32)
    chain = ("bias", "gelu_tanh", "residual", "scale")
    outs = on_each_thread_count(lambda: kernels.matmul(
        a, b, b_layout=layout, epilogue=chain, scale=0.5, bias=bias, residual=res, n=n))
    want, tol = reference(a, w, "nn" if layout == "nn" else "nt", chain, 0.5, bias, res)
    assert np.all(np.abs(outs[0] - want) <= tol)
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


def test_matmul_errors_name_the_problem():
    ffi, lib = kernels.load()
    a = np.ones((4, 4), np.float32)
    p = ffi.cast("float *", a.ctypes.data)
    call = lambda **kw: lib.tirbyoc_matmul_f32(*[kw.get(name, default) for name, default in (  # noqa: E731
        ("batch", 1), ("m", 4), ("n", 4), ("k", 4), ("a", p), ("lda", 4), ("sa", 0), ("b", p),
        ("ldb", 4), ("sb", 0), ("layout", 0), ("c", p), ("ldc", 4), ("sc", 0), ("ops", 0),
        ("scale", 1.0), ("bias", ffi.NULL), ("res", ffi.NULL), ("ldr", 4), ("sr", 0))])
    assert call(ops=14) == kernels.TIRBYOC_EEPILOGUE            # unknown operation
    assert call(ops=2 | 0 << 4 | 2 << 8) == kernels.TIRBYOC_EEPILOGUE  # code after the end
    assert call(ops=1) == kernels.TIRBYOC_ENULL                 # bias in the chain, NULL
    assert call(ops=11) == kernels.TIRBYOC_ENULL                # residual, NULL
    assert call(ops=11, res=p, ldr=3) == kernels.TIRBYOC_ESTRIDE
    assert call(sa=-1) == kernels.TIRBYOC_ESIZE
    assert call(layout=3) == kernels.TIRBYOC_EINVAL
    assert "epilogue" in kernels.status_message(kernels.TIRBYOC_EEPILOGUE)


def _sweep():
    mags = np.logspace(-30, 30, 601)
    return np.concatenate([np.linspace(-20, 20, 40001), mags, -mags, [0.0, -0.0],
                           [88.7, 88.73, -87.4, -103.9, -104.1, 1e-40, -1e-40]]).astype(np.float32)


FUSED_CHAINS = [("bias", "relu", "scale", "gelu_tanh", "residual", "divide", "relu6"),
                ("residual", "silu", "bias", "relu", "scale"),
                ("scale", "gelu_erf", "bias", "tanh", "residual", "sigmoid")]


@pytest.mark.parametrize("layout", ["nn", "nt", "packed"])
@pytest.mark.parametrize("chain", FUSED_CHAINS, ids=["-".join(c) for c in FUSED_CHAINS])
def test_fused_chain_equals_its_operations_one_by_one(isa, layout, chain):
    """Every path (few rows, nt_direct, blocked micro-kernel with its in-register prefix,
    column edges) applies the chain to finished outputs with the same float32 operations as
    the product followed by each operation on its own: the same bits, NaN included."""
    rng = np.random.default_rng(11)
    for m, n, k in [(1, 40, 33), (3, 21, 70), (50, 70, 300), (130, 37, 300), (29, 1100, 600)]:
        a = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((n, k) if layout != "nn" else (k, n)).astype(np.float32)
        a[0, 0] = np.nan if m > 1 else a[0, 0]  # a NaN row goes through every operation
        b = kernels.pack_weight(w, "nt") if layout == "packed" else w
        bias = rng.standard_normal(n).astype(np.float32)
        res = rng.standard_normal((m, n)).astype(np.float32)
        scale = np.float32(0.37)
        fused = kernels.matmul(a, b, b_layout=layout, epilogue=chain, scale=float(scale),
                               bias=bias, residual=res, n=n)
        v = kernels.matmul(a, b, b_layout=layout, n=n)
        for op in chain:
            if op == "bias":
                v = v + bias
            elif op == "residual":
                v = v + res
            elif op == "scale":
                v = v * scale
            elif op == "divide":
                v = v / scale
            else:
                v = kernels.unary(op, v)
        assert v.dtype == np.float32
        assert np.array_equal(fused, v, equal_nan=True), (m, n, k)


# relative tolerance per op: (x > -2, x <= -2)
UNARY_RTOL = {"relu": (0, 0), "relu6": (0, 0), "tanh": (5e-7, 5e-7), "sigmoid": (5e-7, 5e-7),
              "silu": (5e-7, 5e-7), "gelu_erf": (5e-7, 1e-6), "gelu_tanh": (7e-7, 2e-5),
              "hardswish": (2.5e-7, 2.5e-7), "hardsigmoid": (2.5e-7, 2.5e-7)}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_accuracy_over_the_float_range(isa, op):
    x = _sweep()
    with np.errstate(all="ignore"):
        want = UNARY[op](x.astype(np.float64))
    got = kernels.unary(op, x).astype(np.float64)
    hi, lo = UNARY_RTOL[op]
    rtol = np.where(x > -2, hi, lo)
    ok = np.abs(got - want) <= rtol * np.abs(want) + 1e-37
    assert ok.all(), (x[~ok][:5], got[~ok][:5], want[~ok][:5])
    # vector tails and in place
    for length in (0, 1, 15, 17, 1000):
        y = x[:length].copy()
        kernels.unary(op, y, out=y)
        assert np.array_equal(y, got[:length].astype(np.float32))


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_special_values_follow_pytorch(isa, op):
    import torch

    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30], np.float32)
    ours = kernels.unary(op, special)
    fn = {"relu": torch.relu, "relu6": torch.nn.functional.relu6,
          "gelu_erf": torch.nn.functional.gelu, "silu": torch.nn.functional.silu,
          "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
          "sigmoid": torch.sigmoid, "tanh": torch.tanh,
          "hardswish": torch.nn.functional.hardswish,
          "hardsigmoid": torch.nn.functional.hardsigmoid}[op]
    theirs = fn(torch.from_numpy(special)).numpy()
    if op == "gelu_erf":  # PyTorch: gelu(+inf) is NaN; the limit (and TVM's result) is +inf
        assert ours[1] == np.inf
        ours, theirs = np.delete(ours, 1), np.delete(theirs, 1)
    assert np.array_equal(np.isnan(ours), np.isnan(theirs))
    keep = ~np.isnan(theirs)
    np.testing.assert_allclose(ours[keep], theirs[keep], rtol=1e-6, atol=0)


# ---- tirbyoc_softmax_f32 ----------------------------------------------------------

def softmax_reference(x):
    """float64 softmax over the last axis (NaN for a row with NaN, +inf or only -inf)."""
    x = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)


def _assert_softmax_close(got, want):
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    # float32 exp within 2 ulp, a sum of n terms: 1e-6 relative plus a small absolute floor
    assert np.all(np.abs(got[ok] - want[ok]) <= 1e-6 * np.abs(want[ok]) + 1e-8)


@pytest.mark.parametrize("n", [1, 7, 15, 16, 17, 31, 33, 100, 381, 384, 1000])
def test_softmax_matches_float64(isa, n):
    """Row lengths on every vector width's edges, strided rows in and out, values over a
    wide range (rows of +-80 and of 1e-3), and a masked (-inf) column."""
    rng = np.random.default_rng(n)
    rows = 37
    x = np.empty((rows, n + 5), np.float32)[:, :n]
    x[:] = rng.standard_normal((rows, n)) * rng.choice([1e-3, 1.0, 30.0], size=(rows, 1))
    if n > 1:
        x[::4, n // 2] = -np.inf
    out = np.full((rows, n + 3), np.float32(7.0))
    got = kernels.softmax(x, out[:, :n])
    _assert_softmax_close(got, softmax_reference(x))
    assert np.all(out[:, n:] == 7.0)  # the padding of y is untouched
    again = x.copy()
    kernels.softmax(again, again)  # in place: the same bits
    assert np.array_equal(again, got)


def test_softmax_special_rows_follow_pytorch(isa):
    """NaN anywhere, +inf, or only -inf in a row: NaN across it; -inf entries of a row
    that has finite ones: 0; huge finite values: no overflow."""
    torch = pytest.importorskip("torch")
    x = np.array([[1.0, np.nan, 2.0, 3.0],
                  [1.0, np.inf, 2.0, 3.0],
                  [-np.inf] * 4,
                  [-np.inf, 0.0, -np.inf, 1.0],
                  [3e38, -3e38, 3e38, 0.0],
                  [-1e30, -1e30, -1e30, -1e30]], np.float32)
    got = kernels.softmax(x)
    want = torch.softmax(torch.from_numpy(x), dim=-1).numpy()
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=1e-6, atol=0)


def test_softmax_results_do_not_depend_on_threads(isa):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((12 * 129, 129)).astype(np.float32)
    outs = on_each_thread_count(lambda: kernels.softmax(x))
    assert all(np.array_equal(outs[0], o) for o in outs[1:])
    _assert_softmax_close(outs[0], softmax_reference(x))


def test_softmax_errors_name_the_problem():
    ffi, lib = kernels.load()
    call = lib.tirbyoc_softmax_f32
    assert call(-1, 4, ffi.NULL, 4, ffi.NULL, 4) == kernels.TIRBYOC_ESIZE
    assert call(2, 4, ffi.NULL, 3, ffi.NULL, 4) == kernels.TIRBYOC_ESTRIDE
    assert call(2, 4, ffi.NULL, 4, ffi.NULL, 4) == kernels.TIRBYOC_ENULL
    assert call(0, 4, ffi.NULL, 4, ffi.NULL, 4) == kernels.TIRBYOC_OK  # empty: fine
    with pytest.raises(ValueError, match="float32"):
        kernels.softmax(np.zeros((2, 3), np.float64))
    with pytest.raises(ValueError, match="C-contiguous"):
        kernels.softmax(np.zeros((2, 3, 4), np.float32)[:, :, ::2])
