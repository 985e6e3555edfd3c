"""tirbyoc_attention_f32 through cffi against float64 numpy, on every instruction set:
batches with broadcast inputs and masks, both K layouts, strided rows, masks of every
kind and polarity, non-finite values, results independent of the thread count, and the
error statuses. (Random single-batch cases: the kernel fuzz; sanitizers: the driver.)

Tolerance: max|got - ref| <= (2e-6 + 1.2e-7 * S) * max|ref| over the finite reference
values, where S is the largest sum of |q_p k_p| * |scale| of a score: a score's float32
rounding error grows with S (about 2^-24 * S) and becomes the weights' relative error
through the exp. NaN exactly where the reference is NaN.
"""

import numpy as np
import pytest

from tirbyoc import kernels

RTOL = 2e-6
SCORE_RTOL = 1.2e-7


@pytest.fixture(params=kernels.available_isas())
def each_isa(request):
    saved, threads = kernels.isa(), kernels.num_threads()
    kernels.set_isa(request.param)
    yield request.param
    kernels.set_isa(saved)
    kernels.set_num_threads(threads)


def reference(q, k, v, *, k_layout="nt", scale=1.0, divide=False, mask=None,
              mask_keep=False, empty_zero=False):
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    kk = np.swapaxes(k, -1, -2) if k_layout == "nt" else k
    with np.errstate(invalid="ignore", over="ignore"):
        s = q @ kk
        s = s / np.float64(np.float32(scale)) if divide else s * np.float64(np.float32(scale))
        if mask is not None:
            s = np.where((mask == 0) if mask_keep else (mask != 0), -np.inf, s)
        e = np.exp(s - s.max(-1, keepdims=True))
        p = e / e.sum(-1, keepdims=True)
        if empty_zero:
            p = np.where(np.all(s == -np.inf, -1, keepdims=True), 0.0, p)
        # 0 * inf = NaN, as the unfused graph computes it (BLAS does not promise that)
        return np.einsum("...ij,...jc->...ic", p, v)


def score_bound(q, k, k_layout="nt", scale=1.0, divide=False):
    """S of the module docstring."""
    q, k = (np.abs(np.nan_to_num(np.asarray(x, np.float64), posinf=0, neginf=0)) for x in (q, k))
    kk = np.swapaxes(k, -1, -2) if k_layout == "nt" else k
    s = (q @ kk).max(initial=0.0)
    return s / abs(scale) if divide else s * abs(scale)


def assert_matches(got, ref, bound=0.0):
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    finite = np.isfinite(ref)
    if finite.any():
        err = np.abs(got[finite] - ref[finite]).max()
        rtol = RTOL + SCORE_RTOL * bound
        assert err <= rtol * max(float(np.abs(ref[finite]).max()), 1e-30), err


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


SHAPES = [(3, 37, 41, 5, 7), (2, 14, 257, 17, 31), (1, 57, 300, 64, 64), (2, 6, 33, 300, 20),
          (1, 1, 1, 1, 1), (2, 17, 5, 257, 260)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mask_kind", ["none", "causal", "random", "keep", "padding"])
def test_attention_against_float64(each_isa, shape, mask_kind):
    b, m, n, d, dv = shape
    rng = np.random.default_rng(sum(shape))
    q, k, v = rand(rng, b, m, d), rand(rng, b, n, d), rand(rng, b, n, dv)
    mask, keep = None, False
    if mask_kind == "causal":
        mask = ~np.tril(np.ones((m, n), bool))                 # broadcast over the batch
    elif mask_kind == "random":
        mask = rng.random((b, m, n)) < 0.3
    elif mask_kind == "keep":
        mask, keep = rng.random((b, m, n)) < 0.7, True
    elif mask_kind == "padding":
        mask = np.zeros((b, 1, n), bool)                       # broadcast over the rows
        mask[..., n // 2:] = True
    for k_layout in ("nt", "nn"):
        kk = k if k_layout == "nt" else np.ascontiguousarray(np.swapaxes(k, 1, 2))
        got = kernels.attention(q, kk, v, k_layout=k_layout, scale=0.3, mask=mask,
                                mask_keep=keep)
        assert_matches(got, reference(q, kk, v, k_layout=k_layout, scale=0.3, mask=mask,
                                      mask_keep=keep), score_bound(q, kk, k_layout, 0.3))


def test_strided_rows_and_broadcast_inputs(each_isa):
    rng = np.random.default_rng(1)
    big = rand(rng, 3, 40, 90)
    q = big[:, :37, :16]                    # row stride 90
    k = rand(rng, 1, 50, 70)[:, :45, :16]   # one K for every batch item, row stride 70
    v = rand(rng, 1, 45, 20)                # one V
    out = np.full((3, 37, 33), 7.0, np.float32)[:, :, :20]
    got = kernels.attention(q, k, v, scale=4.0, divide=True, out=out)
    assert_matches(got, reference(q, k, v, scale=4.0, divide=True),
                   score_bound(q, k, scale=4.0, divide=True))
    assert (np.full((3, 37, 33), 7.0, np.float32)[:, :, 20:] == 7.0).all()


def test_ieee_cases_as_the_unfused_graph(each_isa):
    """A fully masked row gives NaN (0 with empty_zero); a NaN in q gives a NaN row; an
    inf in v past a causal row's last key still makes that row NaN (its weight 0 times
    inf), and with empty_zero a fully masked row meets it too."""
    rng = np.random.default_rng(2)
    m = n = 40
    q, k, v = rand(rng, 2, m, 16), rand(rng, 2, n, 16), rand(rng, 2, n, 8)
    mask = np.broadcast_to(~np.tril(np.ones((m, n), bool)), (2, m, n)).copy()
    mask[0, 5, :] = True
    q[1, 9, 3] = np.nan
    v[1, 30, 2] = np.inf
    for empty_zero in (False, True):
        got = kernels.attention(q, k, v, mask=mask, empty_zero=empty_zero)
        ref = reference(q, k, v, mask=mask, empty_zero=empty_zero)
        assert np.isnan(ref[1, 9]).all() and np.isnan(ref[1, 0, 2])
        assert np.isnan(ref[0, 5]).all() != empty_zero
        assert_matches(got, ref, score_bound(q, k))


def test_results_do_not_depend_on_the_thread_count(each_isa):
    rng = np.random.default_rng(3)
    q, k, v = rand(rng, 4, 300, 64), rand(rng, 4, 300, 64), rand(rng, 4, 300, 64)
    mask = ~np.tril(np.ones((300, 300), bool))
    runs = []
    for threads in (1, 2, 3):
        kernels.set_num_threads(threads)
        runs.append(kernels.attention(q, k, v, mask=mask, scale=0.125))
    assert all(np.array_equal(r.view(np.uint32), runs[0].view(np.uint32)) for r in runs)


def test_empty_sizes(each_isa):
    rng = np.random.default_rng(4)
    got = kernels.attention(rand(rng, 2, 5, 4), rand(rng, 2, 0, 4), rand(rng, 2, 0, 3))
    assert got.shape == (2, 5, 3) and (got == 0).all()           # no keys: the empty sum
    assert kernels.attention(rand(rng, 0, 4), rand(rng, 6, 4), rand(rng, 6, 3)).shape == (0, 3)
    q0, k0 = np.zeros((5, 0), np.float32), np.zeros((6, 0), np.float32)
    v = rand(rng, 6, 3)
    assert_matches(kernels.attention(q0, k0, v), reference(q0, k0, v))  # d == 0: uniform


def test_invalid_arguments_write_nothing():
    ffi, lib = kernels.load()
    q = np.ones((4, 8), np.float32)
    o = np.full((4, 8), 3.0, np.float32)
    fp = lambda a: ffi.cast("float *", a.ctypes.data)  # noqa: E731

    def call(m=4, n=4, d=8, dv=8, ldq=8, ldk=8, ldv=8, ldo=8, layout=1, flags=0, q_=True):
        return lib.tirbyoc_attention_f32(1, m, n, d, dv, fp(q) if q_ else ffi.NULL, ldq, 0,
                                         fp(q), ldk, 0, layout, fp(q), ldv, 0, ffi.NULL, 0, 0,
                                         flags, 1.0, fp(o), ldo, 0)

    assert call(layout=2) == kernels.TIRBYOC_EINVAL
    assert call(flags=8) == kernels.TIRBYOC_EINVAL
    assert call(m=-1) == kernels.TIRBYOC_ESIZE
    assert call(d=4000, dv=97, ldq=4000, ldk=4000, ldv=97, ldo=97) == kernels.TIRBYOC_ESIZE
    assert call(ldq=7) == kernels.TIRBYOC_ESTRIDE
    assert call(ldo=7) == kernels.TIRBYOC_ESTRIDE
    assert call(q_=False) == kernels.TIRBYOC_ENULL
    assert (o == 3.0).all()
    assert "memory" in kernels.status_message(kernels.TIRBYOC_ENOMEM)
