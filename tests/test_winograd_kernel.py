"""tirbyoc_conv2d_winograd_f32 (a 3x3 conv of stride 1 as Winograd F(4x4, 3x3)) through
cffi on every instruction set: against float64 numpy, the chain, padding and output sizes
that leave partial tiles, rows of tiles past one transform chunk, blocks of output
channels, K blocks, results independent of the thread count, non-finite inputs, the
packed weight's layout, the shape predicate and the errors. (Random cases: the kernel
fuzz; sanitizers: the driver.)

Tolerance: the direct conv's (tests/test_conv_kernel.py), or where larger 1e-5 of the
tile's scale sqrt(sum over c of |g_oc|^2 |d_c|^2), with d_c the tile's 6 x 6 input
window: the transforms mix the whole window, so the rounding error of an output scales
with it (even an output whose taps all fall in the padding is not exactly 0). Measured
errors stay below 3e-6 of that scale.
"""

import math

import numpy as np
import pytest

from tirbyoc import kernels

from .test_conv_kernel import reference
from .test_kernel_fuzz import (winograd_pack_reference, winograd_tile_scale,
                               winograd_windows)
from .test_matmul_kernels import on_each_thread_count


@pytest.fixture(params=kernels.available_isas())
def each_isa(request):
    saved = kernels.isa()
    kernels.set_isa(request.param)
    yield request.param
    kernels.set_isa(saved)


def tile_scale(x, wt, pad, size):
    """[N, OC, OH, OW]: sqrt(sum_c |g_oc|^2 |d_c|^2) over each output's tile."""
    win = winograd_windows(x.astype(np.float64), pad[0], pad[1], *size)
    return winograd_tile_scale(win, wt.reshape(wt.shape[0], -1), *size)


def run(rng, n, c, h, w, oc, pad=(1, 1), size=None, ops=()):
    size = size or (h + 2 * pad[0] - 2, w + 2 * pad[1] - 2)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((oc, c, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(oc).astype(np.float32) if "bias" in ops else None
    res = (rng.standard_normal((n, oc) + tuple(size)).astype(np.float32)
           if "residual" in ops else None)
    packed = kernels.pack_conv2d_weight(wt, bias, winograd=True)
    got = kernels.conv2d(x, packed, padding=pad, epilogue=ops, residual=res, out_size=size)
    want, tol = reference(x, wt, (1, 1), pad, (1, 1), size, ops, bias, res)
    tol = np.maximum(tol, 1e-5 * tile_scale(x, wt, pad, size) * (1.2 ** len(ops)))
    bad = np.abs(got - want) > tol
    assert not bad.any(), (np.argwhere(bad)[:5], np.abs(got - want).max())
    return x, wt, got


CASES = [
    # n, c, h, w, oc, pad, size (None: PyTorch's)
    (1, 16, 8, 8, 16, (1, 1), None),          # 4 tiles
    (1, 64, 28, 28, 64, (1, 1), None),        # 49 tiles: 4 blocks of 14 rows on AVX-512
    (2, 17, 9, 13, 33, (1, 1), None),         # partial tiles, three 16-channel panels
    (1, 3, 5, 300, 4, (1, 1), None),          # 75 tiles in a row: two transform chunks
    (1, 20, 12, 12, 80, (0, 0), None),        # two blocks of output channels (64 + 16)
    (1, 130, 6, 9, 17, (2, 2), None),         # C past a K block of the 256-step ISAs
    (1, 1, 1, 1, 1, (1, 1), None),            # one pixel
    (1, 8, 10, 10, 16, (0, 2), (9, 12)),      # asymmetric padding, wider output
    (1, 8, 10, 10, 16, (3, -1), (15, 5)),     # negative padding, taller output
    (3, 8, 16, 16, 24, (1, 1), None),         # batch 3
    (2, 8, 32, 32, 24, (1, 1), None),         # 32 x 32: planes 4 KB apart (conv_out)
    (1, 256, 14, 14, 80, (1, 1), None),       # a unit's buffer past the thread's scratch
]


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
@pytest.mark.parametrize("ops", [(), ("bias", "relu"), ("bias", "residual", "relu6"),
                                 ("residual", "silu")],
                         ids=["plain", "bias-relu", "bias-res-relu6", "res-silu"])
def test_winograd_matches_float64(each_isa, case, ops):
    n, c, h, w, oc, pad, size = case
    run(np.random.default_rng(CASES.index(case)), n, c, h, w, oc, pad, size, ops)


def test_error_is_a_few_times_the_direct_sums():
    """On a ResNet-sized conv the error against float64 is about 1e-6 of max|y|: more
    than the direct sum's, far below the 1e-4 of the models' tests."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 64, 28, 28)).astype(np.float32)
    wt = (rng.standard_normal((64, 64, 3, 3)) / 24).astype(np.float32)
    want, _ = reference(x, wt, (1, 1), (1, 1), (1, 1), (28, 28), ())
    wino = kernels.conv2d(x, kernels.pack_conv2d_weight(wt, winograd=True), padding=1)
    direct = kernels.conv2d(x, kernels.pack_conv2d_weight(wt), padding=1)
    scale = np.abs(want).max()
    e_wino = np.abs(wino - want).max() / scale
    e_direct = np.abs(direct - want).max() / scale
    assert e_direct < e_wino < 5e-6, (e_direct, e_wino)


@pytest.mark.parametrize("n,c,h,w,oc", [(1, 64, 56, 56, 64), (8, 32, 32, 32, 64),
                                        (1, 128, 28, 28, 128), (1, 256, 14, 14, 256)])
def test_results_do_not_depend_on_threads(each_isa, n, c, h, w, oc):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((oc, c, 3, 3)).astype(np.float32)
    b = rng.standard_normal(oc).astype(np.float32)
    packed = kernels.pack_conv2d_weight(wt, b, winograd=True)
    outs = on_each_thread_count(lambda: kernels.conv2d(x, packed, padding=1,
                                                       epilogue=("bias", "relu")))
    for other in outs[1:]:
        np.testing.assert_array_equal(outs[0].view(np.uint32), other.view(np.uint32))


def test_nan_reaches_its_tiles_only(each_isa):
    """A NaN input makes every output over it NaN (as the direct sum does) and may make
    other outputs of the same 4 x 4 tiles NaN (the transforms mix their window); outputs
    of tiles whose window does not hold it stay finite."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 2, 16, 16)).astype(np.float32)
    x[0, 1, 6, 9] = np.nan
    wt = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    got = kernels.conv2d(x, kernels.pack_conv2d_weight(wt, winograd=True), padding=1)
    direct = kernels.conv2d(x, wt, padding=1)
    assert np.isnan(got[np.isnan(direct)]).all()
    # input row 6, column 9 lies in the windows of output rows 4-7 (tile row 1; tile
    # row 2's window starts at input row 7) and output columns 8-11 (tile column 2)
    tiles = np.zeros((16, 16), bool)
    tiles[4:8, 8:12] = True
    assert not np.isnan(got[:, :, ~tiles]).any()
    assert np.isnan(got).any()


def test_packed_layout():
    """tirbyoc_pack_conv2d_winograd_weight_f32 writes the documented layout bit for bit
    (G g G^T in float64 over the nonzero terms, rounded once; 16-channel panels; the bias
    padded to 16) in exactly tirbyoc_conv2d_winograd_packed_size_f32 floats."""
    rng = np.random.default_rng(6)
    for oc, c, with_bias in ((5, 3, True), (17, 20, False), (32, 1, True)):
        wt = rng.standard_normal((oc, c, 3, 3)).astype(np.float32)
        b = rng.standard_normal(oc).astype(np.float32) if with_bias else None
        packed = kernels.pack_conv2d_weight(wt, b, winograd=True)
        assert packed.data.size == (36 * c + 1) * -(-oc // 16) * 16
        want = winograd_pack_reference(wt.reshape(oc, -1), None if b is None else b[None],
                                       c)[0]
        np.testing.assert_array_equal(packed.data.view(np.uint32), want.view(np.uint32))


def suits(batch, c, oc, k=3, stride=1, dilation=1, groups=1, size=(28, 28)):
    return kernels.winograd_suits(batch, c, oc, groups, k, stride, dilation, size)


def test_suits(monkeypatch):
    """Taken for 3x3 convs of stride 1 over enough tiles with 16 or more channels (the
    ResNets' 56 x 56 and 28 x 28 convs, a small CNN at batch 8), on AVX2 also over 16
    tiles from 128 channels, on AVX-512 from 256 (ResNet-50's 14 x 14 convs); not for other
    geometries, few tiles, few channels, or more channels than a unit's buffer may hold.
    TIRBYOC_CONV_WINOGRAD=0 never takes it, =1 wherever it can run."""
    monkeypatch.delenv("TIRBYOC_CONV_WINOGRAD", raising=False)
    assert suits(1, 64, 64, size=(56, 56)) and suits(1, 128, 128) and suits(8, 32, 64,
                                                                            size=(32, 32))
    assert suits(None, 64, 64)  # batch unknown: taken as 1
    assert not suits(1, 64, 64, stride=2) and not suits(1, 64, 64, k=1)
    assert not suits(1, 64, 64, k=5) and not suits(1, 64, 64, dilation=2)
    assert not suits(1, 64, 64, groups=2)
    # AVX2: 16 tiles from 128 channels, AVX-512 from 256, and units wider than the
    # thread's scratch
    few = kernels.isa() in ("avx2", "avx512")
    assert suits(1, 128, 128, size=(14, 14)) == (kernels.isa() == "avx2")
    assert suits(1, 255, 256, size=(14, 14)) == (kernels.isa() == "avx2")
    assert suits(1, 256, 256, size=(14, 14)) == few
    assert suits(1, 512, 512, size=(13, 16)) == few
    assert not suits(1, 64, 64, size=(14, 14)) and not suits(1, 128, 128, size=(12, 12))
    assert suits(2, 128, 128, size=(14, 14)) and suits(2, 64, 64, size=(14, 14))  # 32
    assert suits(1, 256, 256, size=(28, 28)) == few and suits(1, 512, 512, size=(28, 28)) == few
    # counted in each image: 4 tiles of a 7 x 7 image, batch 8 (a unit per image, each
    # streaming the whole transformed weight)
    assert suits(8, 256, 256, size=(14, 14)) == few and not suits(8, 512, 512, size=(7, 7))
    assert suits(8, 64, 64, size=(7, 7))  # 32 tiles over the batch, as before
    assert not suits(1, 3, 32) and not suits(1, 64, 8)
    assert not suits(1, 1024, 64)  # scratch
    monkeypatch.setenv("TIRBYOC_CONV_WINOGRAD", "0")
    assert not suits(1, 64, 64, size=(56, 56))
    monkeypatch.setenv("TIRBYOC_CONV_WINOGRAD", "1")
    assert suits(1, 3, 8, size=(4, 4)) and not suits(1, 3, 8, stride=2)
    assert not suits(1, 1024, 64)


def test_errors_write_nothing():
    """Invalid arguments give their status and leave y untouched; the Python wrapper
    refuses a weight it cannot transform and a conv the packed weight does not fit."""
    _, lib = kernels.load()
    ffi = kernels.load()[0]
    x = np.ones((1, 2, 5, 5), np.float32)
    wt = np.ones((4, 2, 3, 3), np.float32)
    packed = kernels.pack_conv2d_weight(wt, winograd=True)
    y = np.full((1, 4, 5, 5), 7.0, np.float32)

    def call(**kw):
        a = dict(batch=1, c=2, h=5, w=5, x=x, oc=4, packed=packed.data, pt=1, pl=1, oh=5,
                 ow=5, epi=0, res=None, y=y)
        a.update(kw)
        ptr = [ffi.NULL if a[k] is None else ffi.cast("float *", a[k].ctypes.data)
               for k in ("x", "packed", "res", "y")]
        return lib.tirbyoc_conv2d_winograd_f32(a["batch"], a["c"], a["h"], a["w"], ptr[0],
                                               a["oc"], ptr[1], a["pt"], a["pl"], a["oh"],
                                               a["ow"], a["epi"], ptr[2], ptr[3])

    assert call(batch=-1) == kernels.TIRBYOC_ESIZE
    assert call(oh=1 << 24) == kernels.TIRBYOC_ESIZE
    assert call(packed=None) == kernels.TIRBYOC_ENULL
    assert call(x=None) == kernels.TIRBYOC_ENULL
    assert call(epi=kernels.encode_epilogue(("residual",))) == kernels.TIRBYOC_ENULL
    assert call(epi=kernels.encode_epilogue(("relu", "bias"))) == kernels.TIRBYOC_EEPILOGUE
    assert call(epi=9) == kernels.TIRBYOC_EEPILOGUE
    assert call(pt=1 << 31) == kernels.TIRBYOC_EINVAL
    assert call(c=4096) == kernels.TIRBYOC_EINVAL  # more than a unit's scratch holds
    assert (y == 7.0).all()
    assert call(batch=0) == kernels.TIRBYOC_OK and (y == 7.0).all()
    assert lib.tirbyoc_conv2d_winograd_packed_size_f32(-1, 3) == -1
    assert lib.tirbyoc_conv2d_winograd_packed_size_f32(4, 1 << 24) == -1
    with pytest.raises(ValueError, match="3, 3"):
        kernels.pack_conv2d_weight(np.ones((4, 2, 5, 5), np.float32), winograd=True)
    with pytest.raises(ValueError, match="one group"):
        kernels.pack_conv2d_weight(np.ones((4, 1, 3, 3), np.float32), groups=2,
                                   winograd=True)
    with pytest.raises(ValueError, match="stride 1"):
        kernels.conv2d(x, packed, stride=2, padding=1)
    assert math.isfinite(float(kernels.conv2d(x, packed, padding=1).sum()))


@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[-1]], ids=["56", "partial", "256"])
def test_cached_call_gives_the_packed_weights_bits(each_isa, case):
    """tirbyoc_conv2d_winograd_cached_f32 from the weight as it is: the first call makes
    one entry, the second finds it, both give tirbyoc_conv2d_winograd_f32's bits."""
    n, c, h, w, oc, pad, size = case
    # values of this ISA's own: another ISA's equal weight, freed, may leave its entry
    # at the same address (a correct hit, but not a first call)
    rng = np.random.default_rng([c * oc, len(each_isa)])
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((oc, c, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(oc).astype(np.float32)
    res = rng.standard_normal((n, oc, h + 2 * pad[0] - 2, w + 2 * pad[1] - 2)).astype(
        np.float32)
    ops = ("bias", "residual", "relu")
    want = kernels.conv2d(x, kernels.pack_conv2d_weight(wt, bias, winograd=True),
                          padding=pad, epilogue=ops, residual=res)
    before = kernels.winograd_cache_stats()
    first = kernels.conv2d_winograd_cached(x, wt, padding=pad, epilogue=ops, bias=bias,
                                           residual=res)
    made = kernels.winograd_cache_stats()
    again = kernels.conv2d_winograd_cached(x, wt, padding=pad, epilogue=ops, bias=bias,
                                           residual=res)
    after = kernels.winograd_cache_stats()
    assert np.array_equal(first, want, equal_nan=True)
    assert np.array_equal(again, want, equal_nan=True)
    assert made["made"] - before["made"] == 1 and after["made"] == made["made"]
    assert made["bytes"] - before["bytes"] == 4 * (36 * c + 1) * (-(-oc // 16) * 16)


def test_cached_entries_are_per_key_and_pointers():
    """Another key, or the same key with another weight buffer, makes its own transform:
    a weight loaded twice (two buffers, one key) gives the same result from each, and a
    buffer reused for other values under a new key gives the new values' result."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 32, 12, 12)).astype(np.float32)
    wt = rng.standard_normal((48, 32, 3, 3)).astype(np.float32)
    copy = wt.copy()
    key = kernels.winograd_key(wt)
    want = kernels.conv2d(x, kernels.pack_conv2d_weight(wt, winograd=True), padding=1)
    before = kernels.winograd_cache_stats()["made"]
    for weight in (wt, copy, wt, copy):
        assert np.array_equal(kernels.conv2d_winograd_cached(x, weight, key=key), want)
    assert kernels.winograd_cache_stats()["made"] - before == 2
    wt[...] = rng.standard_normal(wt.shape)
    want = kernels.conv2d(x, kernels.pack_conv2d_weight(wt, winograd=True), padding=1)
    assert kernels.winograd_key(wt) != key
    assert np.array_equal(kernels.conv2d_winograd_cached(x, wt), want)
    # the key is a digest of the values: the same for equal weights, another for any
    # change (a bias, one float, the shape)
    assert kernels.winograd_key(copy) == key
    assert kernels.winograd_key(copy, np.zeros(48, np.float32)) != key
    nudged = copy.copy()
    nudged.flat[100] = np.nextafter(nudged.flat[100], np.float32(np.inf))
    assert kernels.winograd_key(nudged) != key
    assert kernels.winograd_key(copy.reshape(32, 48, 3, 3)) != key


def test_cached_call_errors():
    _, lib = kernels.load()
    ffi = kernels.load()[0]
    x = np.ones((1, 2, 5, 5), np.float32)
    wt = np.ones((4, 2, 3, 3), np.float32)
    y = np.full((1, 4, 5, 5), 7.0, np.float32)
    before = kernels.winograd_cache_stats()["made"]

    def call(weight=wt, epi=0, batch=1, c=2):
        f = (lambda a: ffi.NULL if a is None else ffi.cast("float *", a.ctypes.data))
        return lib.tirbyoc_conv2d_winograd_cached_f32(1, 2, batch, c, 5, 5, f(x), 4,
                                                      f(weight), ffi.NULL, 1, 1, 5, 5, epi,
                                                      ffi.NULL, f(y))

    assert call(weight=None) == kernels.TIRBYOC_ENULL
    assert call(batch=-1) == kernels.TIRBYOC_ESIZE
    assert call(epi=kernels.encode_epilogue(("residual",))) == kernels.TIRBYOC_ENULL
    assert call(c=4096) == kernels.TIRBYOC_EINVAL
    assert (y == 7.0).all() and kernels.winograd_cache_stats()["made"] == before
    assert call(batch=0) == kernels.TIRBYOC_OK and (y == 7.0).all()
    with pytest.raises(ValueError, match="3, 3"):
        kernels.conv2d_winograd_cached(x, np.ones((4, 2, 5, 5), np.float32), padding=2)
    with pytest.raises(ValueError, match="bias"):
        kernels.conv2d_winograd_cached(x, wt, epilogue=("bias",))


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_cached_entries_survive_fork():
    """A forked child finds the parent's entry (no second transform) and gets the same
    bits; its own first call of another weight makes an entry of its own."""
    import os

    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 32, 12, 12)).astype(np.float32)
    wt = rng.standard_normal((32, 32, 3, 3)).astype(np.float32)
    other = rng.standard_normal((32, 32, 3, 3)).astype(np.float32)
    want = kernels.conv2d_winograd_cached(x, wt)
    want_other = kernels.conv2d(x, kernels.pack_conv2d_weight(other, winograd=True),
                                padding=1)
    made = kernels.winograd_cache_stats()["made"]
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if every check holds
        ok = np.array_equal(kernels.conv2d_winograd_cached(x, wt), want) and \
            kernels.winograd_cache_stats()["made"] == made and \
            np.array_equal(kernels.conv2d_winograd_cached(x, other), want_other) and \
            kernels.winograd_cache_stats()["made"] == made + 1
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
