"""tirbyoc_attention_f32 through cffi against float64 numpy, on every instruction set:
batches with broadcast inputs and masks, both K layouts, strided rows, masks of every
kind and polarity (bytes other than 1, strided mask rows, 8-byte runs), NaN / +-inf in
Q, K and V, results independent of the thread count, empty sizes, and the error
statuses with nothing written. (Random single-batch cases: the kernel fuzz; sanitizers:
the driver.) The reference is the unfused graph in float64 with IEEE products (0 * inf is
NaN); scores stay far from float32's exp underflow, the one place where float32 and
float64 results part (test_weights_that_underflow_in_float32_follow_the_float32_graph).

Tolerance: max|got - ref| <= (2e-6 + 1.2e-7 * S) * max|ref| over the finite reference
values, where S is the largest sum of |q_p k_p| * |scale| of a score: a score's float32
rounding error grows with S (about 2^-24 * S) and becomes the weights' relative error
through the exp. NaN exactly where the reference is NaN.
"""

import numpy as np
import pytest

from tirbyoc import kernels

# a @ b in float64 with IEEE semantics (0 * inf = NaN), which BLAS does not promise
from .test_kernel_fuzz import ieee_matmul

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
              mask_keep=False, empty_zero=False, mask_add=False, mask_lowest=False,
              nan_zero=False):
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    kk = np.swapaxes(k, -1, -2) if k_layout == "nt" else k
    with np.errstate(invalid="ignore", over="ignore"):
        s = _ieee_batched(q, kk)
        s = s / np.float64(np.float32(scale)) if divide else s * np.float64(np.float32(scale))
        if mask is not None:
            masked = (mask == 0) if mask_keep else (mask != 0)
            # added: s + where(masked, -inf, 0), so NaN where a masked score is NaN or +inf
            low = np.float64(np.finfo(np.float32).min) if mask_lowest else -np.inf
            s = s + np.where(masked, low, 0.0) if mask_add else np.where(masked, low, s)
        e = np.exp(s - s.max(-1, keepdims=True))
        p = e / e.sum(-1, keepdims=True)
        if empty_zero:
            p = np.where(np.all(s == -np.inf, -1, keepdims=True), 0.0, p)
        if nan_zero:  # the graph's where(isnan(p), 0, p)
            p = np.where(np.isnan(p), 0.0, p)
        # 0 * inf = NaN, as the unfused graph computes it
        return _ieee_batched(p, v)


def _ieee_batched(a, b):
    """a @ b over broadcast leading dimensions, with ieee_matmul for each matrix."""
    lead = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = np.broadcast_to(a, lead + a.shape[-2:])
    b = np.broadcast_to(b, lead + b.shape[-2:])
    out = np.empty(lead + (a.shape[-2], b.shape[-1]))
    for idx in np.ndindex(*lead):
        out[idx] = ieee_matmul(a[idx], b[idx])
    return out


def score_bound(q, k, k_layout="nt", scale=1.0, divide=False):
    """S of the module docstring."""
    q, k = (np.abs(np.nan_to_num(np.asarray(x, np.float64), posinf=0, neginf=0)) for x in (q, k))
    kk = np.swapaxes(k, -1, -2) if k_layout == "nt" else k
    s = (q @ kk).max(initial=0.0)
    return s / abs(scale) if divide else s * abs(scale)


def assert_matches(got, ref, bound=0.0):
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    inf = np.isinf(ref)
    assert np.array_equal(got[inf], ref[inf])  # the same infinities
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
    full = np.full((3, 37, 33), 7.0, np.float32)
    got = kernels.attention(q, k, v, scale=4.0, divide=True, out=full[:, :, :20])
    assert_matches(got, reference(q, k, v, scale=4.0, divide=True),
                   score_bound(q, k, scale=4.0, divide=True))
    assert (full[:, :, 20:] == 7.0).all()  # the stride padding of O is untouched
    assert np.array_equal(full[:, :, :20], got)


def test_added_mask_with_a_score_that_overflows(each_isa):
    """Finite Q and K whose product overflows float32 at masked keys only: the graph's
    score is +inf there, and + -inf makes the row NaN under an added mask (as PyTorch's
    float32 SDPA gives it), while the replacing mask ignores it; the other rows match
    alike up to rounding (the added mask scores all 40 keys, the replacing one stops at
    the last kept). (The kernel must not skip those keys: no bound proves them finite.)"""
    rng = np.random.default_rng(50)
    m, n, d, dv = 9, 40, 8, 4
    q, k, v = rand(rng, 1, m, d), rand(rng, 1, n, d), rand(rng, 1, n, dv)
    q[0, 3, 0], k[0, 20:, 0] = 3e19, 3e19          # row 3 against keys 20..39: 9e38
    mask = np.zeros((1, 1, n), bool)
    mask[..., 20:] = True                           # every row masks keys 20..39
    added = kernels.attention(q, k, v, mask=mask, mask_add=True)
    replaced = kernels.attention(q, k, v, mask=mask)
    assert np.isnan(added[0, 3]).all() and np.isfinite(replaced[0, 3]).all()
    others = [i for i in range(m) if i != 3]
    np.testing.assert_allclose(added[0, others], replaced[0, others], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("repeat", [2, 3, 6])
def test_one_mask_per_sequence_shared_by_its_heads(each_isa, repeat):
    """mask_repeat: batch items in runs of ``repeat`` (a sequence's heads) read one mask
    item, as HuggingFace's [B, 1, M, N] mask broadcast over the heads; both mask forms."""
    rng = np.random.default_rng(40 + repeat)
    b, m, n, d, dv = 6, 19, 45, 8, 10
    q, k, v = rand(rng, b, m, d), rand(rng, b, n, d), rand(rng, b, n, dv)
    per_seq = rng.random((b // repeat, m, n)) < 0.4
    per_seq[0, 2] = True                               # a fully masked row
    full = np.repeat(per_seq, repeat, axis=0)          # what each batch item sees
    for mask_add in (False, True):
        got = kernels.attention(q, k, v, scale=0.5, mask=per_seq, mask_repeat=repeat,
                                mask_add=mask_add)
        ref = reference(q, k, v, scale=0.5, mask=full, mask_add=mask_add)
        assert_matches(got, ref, score_bound(q, k, scale=0.5))
        assert np.isnan(got[:repeat, 2]).all() and not np.isnan(got[repeat:, 2]).any()


@pytest.mark.parametrize("k_batch,v_batch", [(1, 3), (3, 1)])
def test_k_or_v_alone_broadcast(each_isa, k_batch, v_batch):
    """K shared by the batch and V not, and the other way round (batch strides 0 and
    not), with a causal mask offset past the first key chunk."""
    rng = np.random.default_rng(5 + k_batch)
    q, k, v = rand(rng, 3, 45, 24), rand(rng, k_batch, 270, 24), rand(rng, v_batch, 270, 40)
    mask = np.triu(np.ones((45, 270), bool), 226)  # row i keeps keys 0 .. 225 + i
    got = kernels.attention(q, k, v, scale=0.2, mask=mask)
    assert_matches(got, reference(q, k, v, scale=0.2, mask=mask), score_bound(q, k, scale=0.2))


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
    for mask_add in (False, True):
        runs = []
        for threads in (1, 2, 3):
            kernels.set_num_threads(threads)
            runs.append(kernels.attention(q, k, v, mask=mask, scale=0.125, mask_add=mask_add))
        assert all(np.array_equal(r.view(np.uint32), runs[0].view(np.uint32)) for r in runs)


def test_empty_sizes(each_isa):
    rng = np.random.default_rng(4)
    got = kernels.attention(rand(rng, 2, 5, 4), rand(rng, 2, 0, 4), rand(rng, 2, 0, 3))
    assert got.shape == (2, 5, 3) and (got == 0).all()           # no keys: the empty sum
    assert kernels.attention(rand(rng, 0, 4), rand(rng, 6, 4), rand(rng, 6, 3)).shape == (0, 3)
    q0, k0 = np.zeros((5, 0), np.float32), np.zeros((6, 0), np.float32)
    v = rand(rng, 6, 3)
    assert_matches(kernels.attention(q0, k0, v), reference(q0, k0, v))  # d == 0: uniform


SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0], np.float32)


def sprinkle(rng, x, count):
    """``count`` random entries of x replaced by NaN, +inf, -inf or 0 (in place)."""
    flat = x.reshape(-1)
    flat[rng.integers(0, flat.size, count)] = rng.choice(SPECIALS, count)


@pytest.mark.parametrize("k_layout", ["nt", "nn"])
def test_non_finite_inputs_as_the_unfused_graph(each_isa, k_layout):
    """NaN, +inf, -inf and zeros in Q, K and V, under every mask kind and flag: NaN exactly
    where the float64 graph has it, the same infinities, the rest within tolerance. Also
    rows whose scores are all -inf (a -inf in q against positive keys: NaN, or 0 with
    empty_zero) or all +inf (NaN), and an inf in V past a causal row's keys."""
    rng = np.random.default_rng(10 + (k_layout == "nn"))
    b, m, n, d, dv = 2, 31, 300, 33, 20
    seen = {"nan": 0, "inf": 0, "finite": 0, "all_-inf": 0}
    for trial in range(8):
        q, k, v = rand(rng, b, m, d), rand(rng, b, n, d), rand(rng, b, n, dv)
        k[:, :, 0] = np.abs(k[:, :, 0]) + 0.1  # q[.., 0] = -inf: every score -inf
        for x, count in ((q, 3), (k[1], 3), (v, 3)):
            sprinkle(rng, x, count)
        if trial % 2:
            sprinkle(rng, k[0], 1)  # else K[0] stays finite for the all -inf row below
        q[0, 7, 0], q[1, 8, 0] = -np.inf, np.inf
        v[1, n - 2, 3] = np.inf  # past the keys of every causal row but the last ones
        kk = k if k_layout == "nt" else np.ascontiguousarray(np.swapaxes(k, 1, 2))
        kind = ("none", "causal", "random", "padding")[trial % 4]
        mask = {"none": None, "causal": ~np.tril(np.ones((m, n), bool)),
                "random": rng.random((b, m, n)) < 0.5,
                "padding": np.arange(n)[None, None, :] >= rng.integers(0, n, (b, 1, 1))}[kind]
        keep = mask is not None and trial % 3 == 0
        if keep:
            mask = ~mask
        flags = dict(divide=trial % 2 == 1, mask_keep=keep, empty_zero=trial % 4 >= 2)
        scale = 3.0 if flags["divide"] else 0.3
        got = kernels.attention(q, kk, v, k_layout=k_layout, scale=scale, mask=mask, **flags)
        ref = reference(q, kk, v, k_layout=k_layout, scale=scale, mask=mask, **flags)
        assert_matches(got, ref, score_bound(q, kk, k_layout, scale, flags["divide"]))
        if mask is None or kind == "padding":
            assert np.isnan(ref[1, 8]).all()                                 # +inf scores
            if np.isfinite(k[0]).all() and np.isfinite(q[0, 7, 1:]).all():
                # all -inf: NaN, or 0 * V with empty_zero (NaN only where V is not finite)
                want = np.where(np.isfinite(v[0]).all(axis=0), 0.0, np.nan) \
                    if flags["empty_zero"] else np.nan
                assert np.array_equal(ref[0, 7], np.broadcast_to(want, (dv,)), equal_nan=True)
                seen["all_-inf"] += 1
        seen["nan"] += int(np.isnan(ref).sum())
        seen["inf"] += int(np.isinf(ref).sum())
        seen["finite"] += int(np.isfinite(ref).sum())
    assert all(seen.values()), seen  # every kind of result was checked


def _mask_trials(rng, trials=6):
    """(q, k, v, mask) per trial: [2, 23, 19] queries, 203 keys, values of 12; masks
    causal, padding and random in turn, row 3 of item 0 fully masked."""
    b, m, n, d, dv = 2, 23, 203, 19, 12
    for trial in range(trials):
        q, k, v = rand(rng, b, m, d), rand(rng, b, n, d), rand(rng, b, n, dv)
        kind = ("causal", "padding", "random")[trial % 3]
        mask = {"causal": ~np.tril(np.ones((m, n), bool)),
                "padding": np.arange(n)[None, None, :] >= rng.integers(1, n, (b, 1, 1)),
                "random": rng.random((b, m, n)) < 0.4}[kind]
        mask = np.broadcast_to(mask, (b, m, n)).copy()
        mask[0, 3] = True           # a fully masked row
        yield q, k, v, mask


@pytest.mark.parametrize("k_layout", ["nt", "nn"])
def test_added_mask_as_the_unfused_graph(each_isa, k_layout):
    """mask_add: the graph's s + where(masked, -inf, 0). Every key is scored, so a NaN or
    +inf score at a masked key (a NaN or inf in Q or K) makes its row NaN, where the
    replacing mask gives -inf and ignores it; masks of every structure (causal, padding,
    random, a row fully masked, a row fully kept), both polarities, with and without
    empty_zero, against float64. With finite inputs both masks give the same rows."""
    rng = np.random.default_rng(30 + (k_layout == "nn"))
    differ = 0
    for trial, (q, k, v, mask) in enumerate(_mask_trials(rng)):
        n = k.shape[1]
        mask[1, 4] = False          # a fully kept row
        keep = trial % 2 == 1
        flags = dict(mask=~mask if keep else mask, mask_keep=keep, empty_zero=trial >= 3)
        kk = k if k_layout == "nt" else np.ascontiguousarray(np.swapaxes(k, 1, 2))
        args = dict(k_layout=k_layout, scale=0.3, **flags)
        finite = kernels.attention(q, kk, v, mask_add=True, **args)
        assert_matches(finite, reference(q, kk, v, **args), score_bound(q, kk, k_layout, 0.3))
        # a NaN and an inf in K at keys that some rows mask (the last keys: past every
        # causal row but the last, and past most padding), and one in Q
        k[:, n - 1, 0], k[:, n - 3, 1], q[1, 9, 2] = np.nan, np.inf, np.inf
        kk = k if k_layout == "nt" else np.ascontiguousarray(np.swapaxes(k, 1, 2))
        got = kernels.attention(q, kk, v, mask_add=True, **args)
        ref = reference(q, kk, v, mask_add=True, **args)
        assert_matches(got, ref, score_bound(q, kk, k_layout, 0.3))
        replaced = reference(q, kk, v, **args)
        differ += int((np.isnan(ref) != np.isnan(replaced)).any(-1).sum())
    assert differ > 0  # rows where adding and replacing the mask part were checked


@pytest.mark.parametrize("k_layout", ["nt", "nn"])
def test_lowest_mask_as_huggingface_writes_it(each_isa, k_layout):
    """mask_lowest: the masking value is -FLT_MAX (HuggingFace's finfo.min) instead of
    -inf, replacing the score or added to it. A fully masked row then has equal finite
    scores, so its weights spread over every key (the mean of V) where -inf gives NaN;
    keys past a causal row are still skipped only where that changes no value: with a
    NaN or inf in Q or K every key is scored. Against float64, both polarities."""
    rng = np.random.default_rng(40 + (k_layout == "nn"))
    for trial, (q, k, v, mask) in enumerate(_mask_trials(rng)):
        n = k.shape[1]
        keep = trial % 2 == 1
        for add in (False, True):
            args = dict(k_layout=k_layout, scale=0.3, mask=~mask if keep else mask,
                        mask_keep=keep, mask_add=add)
            kk = k if k_layout == "nt" else np.ascontiguousarray(np.swapaxes(k, 1, 2))
            got = kernels.attention(q, kk, v, mask_lowest=True, **args)
            assert_matches(got, reference(q, kk, v, mask_lowest=True, **args),
                           score_bound(q, kk, k_layout, 0.3))
            np.testing.assert_allclose(got[0, 3], v[0].mean(0), rtol=1e-5, atol=1e-6)
            assert np.isnan(kernels.attention(q, kk, v, **args)[0, 3]).all()
        k2, q2 = k.copy(), q.copy()
        k2[:, n - 1, 0], q2[1, 9, 2] = np.inf, np.inf  # a key past most causal rows
        kk = k2 if k_layout == "nt" else np.ascontiguousarray(np.swapaxes(k2, 1, 2))
        for add in (False, True):
            args = dict(k_layout=k_layout, scale=0.3, mask=mask, mask_add=add)
            got = kernels.attention(q2, kk, v, mask_lowest=True, **args)
            assert_matches(got, reference(q2, kk, v, mask_lowest=True, **args),
                           score_bound(q2, kk, k_layout, 0.3))


@pytest.mark.parametrize("lowest", [False, True])
def test_nan_zero_gives_the_rows_of_nan_weights_zero_weights(each_isa, lowest):
    """nan_zero: where(isnan(p), 0, p) after the softmax (torch.onnx writes it). A row
    with a NaN or +inf score (a NaN or inf in Q or K, also at a masked key of the added
    mask), or with every score -inf, gets weights of 0: its output is 0, or NaN in a
    column of V holding an inf (also past the row's kept keys); every other row is
    unchanged. Both mask forms, -inf and the lowest float, against float64."""
    rng = np.random.default_rng(50 + lowest)
    for trial, (q, k, v, mask) in enumerate(_mask_trials(rng)):
        n = k.shape[1]
        q[0, 7, 1] = np.nan                 # a NaN row in item 0
        k[1, n - 1, 0] = np.inf             # a key past most causal rows: +-inf scores
        if trial % 2:
            v[1, n - 2, 5] = np.inf         # an inf in V, past most causal rows
        for add in (False, True):
            args = dict(scale=0.3, mask=mask, mask_add=add, mask_lowest=lowest)
            got = kernels.attention(q, k, v, nan_zero=True, **args)
            ref = reference(q, k, v, nan_zero=True, **args)
            assert_matches(got, ref, score_bound(q, k, scale=0.3))
            assert (got[0, 7] == 0).all()    # the NaN row: weights of 0, V finite there
            if not lowest:                   # the fully masked row: 0 as with empty_zero
                assert (got[0, 3] == 0).all()
            plain = kernels.attention(q, k, v, **args)
            assert np.isnan(plain[0, 7]).all()
            rows = ~np.isnan(ref).any(-1) & ~(ref == 0).all(-1)
            np.testing.assert_array_equal(got[rows], plain[rows])


@pytest.mark.parametrize("keep", [False, True])
def test_mask_bytes_strides_and_structure(each_isa, keep):
    """Mask bytes other than 1 (2, 0x80, 0xff count as true), mask rows with a stride
    wider than the row, 2-D masks (one for the whole batch), [batch, 1, n] and [1, 1, n]
    masks (ldmask 0), runs of 8 equal bytes at every phase (the kernel reads the mask 8
    bytes at a time), prefix masks, rows with nothing masked and fully masked rows."""
    rng = np.random.default_rng(20 + keep)
    b, m, n, d, dv = 2, 29, 301, 16, 24
    q, k, v = rand(rng, b, m, d), rand(rng, b, n, d), rand(rng, b, n, dv)
    j = np.arange(n)
    runs = ((j[None, :] + np.arange(m)[:, None]) // 8) % 2 == 1
    runs[3] = False                    # nothing masked
    runs[4] = True                     # everything masked
    runs[5] = j >= 17                  # a prefix of 17 keys kept
    runs[6] = j < 290                  # only the last 11 kept
    cases = {
        "runs": runs,
        "random": rng.random((b, m, n)) < 0.7,
        "rows": rng.random((b, 1, n)) < 0.4,
        "one_row": (rng.random((1, 1, n)) < 0.4),
    }
    for name, masked in cases.items():
        for empty_zero in (False, True):
            want_bits = masked != keep          # what the bytes say
            base = np.zeros(masked.shape[:-1] + (n + 13,), np.uint8)
            base[..., :n] = np.where(want_bits, rng.choice([1, 2, 0x80, 0xFF], masked.shape), 0)
            base[..., n:] = 0x5A               # the padding must not be read
            mask = base[..., :n]
            got = kernels.attention(q, k, v, scale=0.25, mask=mask, mask_keep=keep,
                                    empty_zero=empty_zero)
            ref = reference(q, k, v, scale=0.25, mask=mask, mask_keep=keep,
                            empty_zero=empty_zero)
            assert_matches(got, ref, score_bound(q, k, scale=0.25))
            if name == "runs":
                assert np.isnan(ref[:, 4]).all() != empty_zero    # the fully masked row
                assert (got[:, 4] == 0).all() == empty_zero


def test_weights_that_underflow_in_float32_follow_the_float32_graph(each_isa):
    """The one place where the float64 reference and a float32 computation part: a weight
    below float32's smallest value (a score gap over about 103) is 0 in float32, so an inf
    in V gives 0 * inf = NaN as the unfused float32 graph does, where float64 would still
    see a tiny weight and give inf. The other tests keep score gaps far below that."""
    q = np.ones((1, 1), np.float32)
    v = np.array([[np.inf], [1.0]], np.float32)
    for gap, want in ((50.0, np.inf), (200.0, np.nan)):
        k = np.array([[0.0], [gap]], np.float32)
        got = kernels.attention(q, k, v)[0, 0]
        s = (q @ k.T)[0]
        p = np.exp(s - s.max()) / np.exp(s - s.max()).sum()   # float32, as the graph
        with np.errstate(invalid="ignore"):
            graph32 = (p * v[:, 0]).sum()
        assert np.isnan(want) == np.isnan(got) == np.isnan(graph32)
        if not np.isnan(want):
            assert got == graph32 == want


def test_invalid_arguments_write_nothing():
    """Every invalid argument gives its status and leaves O untouched; strides and sizes
    are checked even when there is nothing to compute; NULL is accepted only for what a
    call does not read."""
    ffi, lib = kernels.load()
    x = np.ones((4, 8), np.float32)
    mask = np.zeros((4, 8), np.uint8)
    o = np.full((4, 8), 3.0, np.float32)
    fp = lambda a: ffi.cast("float *", a.ctypes.data)  # noqa: E731
    mp = ffi.cast("uint8_t *", mask.ctypes.data)

    def call(**kw):
        args = dict(batch=1, m=4, n=4, d=8, dv=8, q=fp(x), ldq=8, sq=0, k=fp(x), ldk=8, sk=0,
                    layout=1, v=fp(x), ldv=8, sv=0, mask=ffi.NULL, ldm=0, sm=0, repeat=1,
                    flags=0, scale=1.0, o=fp(o), ldo=8, so=0)
        assert set(kw) <= set(args)
        args.update(kw)
        return lib.tirbyoc_attention_f32(*args.values())

    EINVAL, ESIZE, ESTRIDE, ENULL = (kernels.TIRBYOC_EINVAL, kernels.TIRBYOC_ESIZE,
                                     kernels.TIRBYOC_ESTRIDE, kernels.TIRBYOC_ENULL)
    bad = [
        (dict(layout=2), EINVAL), (dict(layout=-1), EINVAL), (dict(layout=3), EINVAL),
        (dict(flags=64), EINVAL), (dict(flags=1 | 1 << 30), EINVAL), (dict(flags=-1), EINVAL),
        (dict(repeat=0), EINVAL), (dict(repeat=-1, mask=mp, ldm=8), EINVAL),
        (dict(batch=-1), ESIZE), (dict(m=-1), ESIZE), (dict(n=-1), ESIZE),
        (dict(d=-1), ESIZE), (dict(dv=-2**63), ESIZE),
        (dict(sq=-1), ESIZE), (dict(sk=-8), ESIZE), (dict(sv=-1), ESIZE), (dict(so=-1), ESIZE),
        (dict(sm=-1), ESIZE), (dict(ldm=-1), ESIZE),
        (dict(d=4000, dv=97, ldq=4000, ldk=4000, ldv=97, ldo=97), ESIZE),   # d + dv > 4096
        (dict(d=4097, dv=0, ldq=4097, ldk=4097, ldv=0, ldo=0), ESIZE),
        (dict(ldq=7), ESTRIDE), (dict(ldk=7), ESTRIDE), (dict(layout=0, ldk=3), ESTRIDE),
        (dict(ldv=7), ESTRIDE), (dict(ldo=7), ESTRIDE), (dict(mask=mp, ldm=3), ESTRIDE),
        (dict(m=0, ldq=7), ESTRIDE), (dict(batch=0, ldo=1), ESTRIDE),
        (dict(q=ffi.NULL), ENULL), (dict(k=ffi.NULL), ENULL), (dict(v=ffi.NULL), ENULL),
        (dict(o=ffi.NULL), ENULL), (dict(n=0, o=ffi.NULL), ENULL),
        (dict(n=0, d=0, ldq=0, q=ffi.NULL, k=ffi.NULL, v=ffi.NULL, o=ffi.NULL), ENULL),
    ]
    for kw, want in bad:
        assert call(**kw) == want, kw
        assert (o == 3.0).all(), kw  # nothing written
    # what a call does not read may be NULL; ldmask is not read without a mask
    assert call(m=0, q=ffi.NULL, k=ffi.NULL, v=ffi.NULL, o=ffi.NULL) == kernels.TIRBYOC_OK
    assert call(dv=0, ldv=0, ldo=0, q=ffi.NULL, k=ffi.NULL, v=ffi.NULL,
                o=ffi.NULL) == kernels.TIRBYOC_OK
    assert call(batch=0, q=ffi.NULL, k=ffi.NULL, v=ffi.NULL, o=ffi.NULL) == kernels.TIRBYOC_OK
    assert (o == 3.0).all()
    assert call(ldm=2) == kernels.TIRBYOC_OK                      # no mask: ldm unused
    assert call(mask=mp, ldm=0, d=0, ldq=0, ldk=0, q=ffi.NULL, k=ffi.NULL) == \
        kernels.TIRBYOC_OK                                        # d = 0: uniform weights
    assert (o == 1.0).all()                                       # the mean of V's ones
    half = np.zeros((4, 8), np.uint8)
    half[:, 2:] = 1                                               # keys 2 and 3 masked
    o[:] = 3.0
    assert call(mask=ffi.cast("uint8_t *", half.ctypes.data), ldm=0, d=0, ldq=0, ldk=0,
                q=ffi.NULL, k=ffi.NULL, flags=8) == kernels.TIRBYOC_OK  # added: Q, K unread
    assert (o == 1.0).all()
    assert "memory" in kernels.status_message(kernels.TIRBYOC_ENOMEM)
    assert kernels.TIRBYOC_ENOMEM == 6 and 6 in kernels.error_statuses()
