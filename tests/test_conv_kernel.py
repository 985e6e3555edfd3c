"""tirbyoc_conv2d_f32 through cffi against float64 numpy, on every instruction set: kernel
sizes, strides, dilations, symmetric, asymmetric and negative padding, 1x1 convs (the
plain path that reads the image as a matrix), odd channel counts and pixel counts that
leave partial panels, K blocks with the bias step alone in the last one, the two ways of
splitting the work (pixel blocks, channel blocks), every epilogue operation it takes,
NaN in the input, results independent of the thread count, empty sizes and the error
statuses with nothing written. (Random cases: the kernel fuzz; sanitizers: the driver.)

The reference is im2col in float64 (exact zeros in the padding) times the weight.
Tolerance as the matmul tests: 1e-5 * sqrt(sum of squared terms) * max(1, sqrt(K) / 8)
per output, through the chain, plus 1e-6 of the value.
"""

import math

import numpy as np
import pytest

from tirbyoc import kernels

from .test_kernel_fuzz import CHAIN_REFERENCE as UNARY
from .test_matmul_kernels import on_each_thread_count


# The AVX-512 build can read the image in place (the direct path) and chooses it or the
# gather by size; TIRBYOC_CONV_DIRECT=1 or 0 forces one: both are tested on every case.
DIRECT_ISAS = ("avx512",)
PATHS = [isa for isa in kernels.available_isas()] + [
    f"{isa}-{path}" for isa in kernels.available_isas() if isa in DIRECT_ISAS
    for path in ("direct", "gather")]


@pytest.fixture(params=PATHS)
def each_isa(request, monkeypatch):
    isa, _, path = request.param.partition("-")
    if path:
        monkeypatch.setenv("TIRBYOC_CONV_DIRECT", "1" if path == "direct" else "0")
    saved = kernels.isa()
    kernels.set_isa(isa)
    yield isa
    kernels.set_isa(saved)


def out_size(h, w, kh, kw, stride, pad, dil):
    return ((h + 2 * pad[0] - dil[0] * (kh - 1) - 1) // stride[0] + 1,
            (w + 2 * pad[1] - dil[1] * (kw - 1) - 1) // stride[1] + 1)


def im2col(x, kh, kw, stride, pad, dil, size):
    """[N, C * KH * KW, OH * OW] in float64: the input under each tap, 0 outside."""
    n, c, h, w = x.shape
    oh, ow = size
    cols = np.zeros((n, c, kh, kw, oh, ow))
    for r in range(kh):
        rows = np.arange(oh) * stride[0] - pad[0] + r * dil[0]
        for s in range(kw):
            cs = np.arange(ow) * stride[1] - pad[1] + s * dil[1]
            ok = ((rows >= 0) & (rows < h))[:, None] & ((cs >= 0) & (cs < w))[None, :]
            got = x[:, :, np.clip(rows, 0, max(h - 1, 0))][:, :, :, np.clip(cs, 0, max(w - 1, 0))] \
                if h and w else np.zeros((n, c, oh, ow))
            cols[:, :, r, s] = np.where(ok, got, 0.0)
    return cols.reshape(n, c * kh * kw, oh * ow)


def reference(x, wt, stride, pad, dil, size, ops, bias=None, residual=None, groups=1):
    """(value, error bound), both [N, OC, OH, OW]: per group, the group's weight rows
    times the im2col of its input channels."""
    n, c = x.shape[:2]
    oc, _, kh, kw = wt.shape
    cg, ocg = c // groups, oc // groups
    vs, errs = [], []
    for g in range(groups):
        cols = im2col(x[:, g * cg:(g + 1) * cg].astype(np.float64), kh, kw, stride, pad, dil,
                      size)
        w2 = wt[g * ocg:(g + 1) * ocg].astype(np.float64).reshape(ocg, -1)
        with np.errstate(invalid="ignore", over="ignore"):
            vs.append(w2 @ cols)
            errs.append(np.sqrt(np.abs(w2) ** 2 @ np.abs(cols) ** 2) * 1e-5 * max(
                1.0, math.sqrt(w2.shape[1]) / 8))
    v, err = np.concatenate(vs, axis=1), np.concatenate(errs, axis=1)
    shape = (n, oc) + tuple(size)
    v, err = v.reshape(shape), err.reshape(shape)
    for op in ops:
        if op == "bias":
            v = v + bias.astype(np.float64)[None, :, None, None]
        elif op == "residual":
            v = v + residual
        else:
            v = UNARY[op](v)
            err = err * 1.2 + (2e-5 if op.startswith("gelu") else 1e-6) * np.abs(v)
    return v, err + 1e-6 * np.abs(v) + 1e-30


def run_case(rng, n, c, h, w, oc, k, stride=(1, 1), pad=(0, 0), dil=(1, 1), ops=(),
             size=None, groups=1):
    kh, kw = (k, k) if isinstance(k, int) else k
    size = size or out_size(h, w, kh, kw, stride, pad, dil)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((oc, c // groups, kh, kw)).astype(np.float32)
    bias = rng.standard_normal(oc).astype(np.float32) if "bias" in ops else None
    residual = (rng.standard_normal((n, oc) + tuple(size)).astype(np.float32)
                if "residual" in ops else None)
    got = kernels.conv2d(x, wt, stride=stride, padding=pad, dilation=dil, groups=groups,
                         epilogue=ops, bias=bias, residual=residual, out_size=size)
    want, tol = reference(x, wt, stride, pad, dil, size, ops, bias, residual, groups)
    assert got.shape == want.shape
    bad = np.abs(got - want) > tol
    assert not bad.any(), (np.argwhere(bad)[:5], np.abs(got - want).max())
    return got


CASES = [
    # n, c, h, w, oc, k, stride, pad, dil
    (1, 3, 20, 20, 8, 3, (1, 1), (1, 1), (1, 1)),
    (2, 5, 13, 11, 7, 3, (2, 2), (1, 1), (1, 1)),
    (1, 4, 17, 19, 5, 5, (1, 1), (2, 1), (1, 2)),
    (1, 3, 30, 30, 16, 7, (2, 2), (3, 3), (1, 1)),
    (2, 6, 9, 14, 3, (1, 3), (2, 1), (0, 1), (1, 1)),
    (1, 9, 7, 7, 33, 1, (1, 1), (0, 0), (1, 1)),     # plain path, 49 pixels
    (3, 17, 5, 3, 4, 1, (1, 1), (0, 0), (1, 1)),     # plain path, 15 pixels
    (1, 8, 12, 12, 6, 1, (2, 2), (0, 0), (1, 1)),    # 1x1 stride 2: gathered
    (1, 2, 4, 4, 3, 3, (1, 1), (3, 3), (2, 2)),      # more padding than image
    (1, 5, 40, 3, 9, (3, 1), (1, 3), (1, 0), (1, 1)),
    (1, 1, 1, 1, 1, 1, (1, 1), (0, 0), (1, 1)),
    (1, 3, 41, 75, 8, 7, (2, 2), (3, 3), (1, 1)),    # stride 2, rows wider than 31 columns
    (1, 4, 9, 70, 6, 3, (1, 2), (1, 1), (1, 1)),
    (1, 2, 9, 100, 3, 3, (1, 3), (0, 1), (1, 1)),   # stride 3, as wide
]


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
@pytest.mark.parametrize("ops", [(), ("bias", "relu"), ("bias", "residual", "relu6"),
                                 ("residual", "silu"), ("bias", "gelu_erf", "tanh")],
                         ids=["plain", "bias-relu", "bias-res-relu6", "res-silu", "gelu-tanh"])
def test_conv_matches_float64(each_isa, case, ops):
    n, c, h, w, oc, k, stride, pad, dil = case
    run_case(np.random.default_rng(hash((case, ops)) % 2**32), n, c, h, w, oc, k, stride,
             pad, dil, ops)


@pytest.mark.skipif("avx512" not in kernels.available_isas(),
                    reason="only the AVX-512 build has the direct path")
@pytest.mark.parametrize("case", CASES + [
    (2, 20, 30, 33, 70, 3, (2, 2), (1, 1), (1, 1)),   # channels past one 64-wide tile
    (1, 9, 16, 16, 40, 4, (4, 4), (0, 0), (1, 1)),    # stride 4: 16 phase planes
    (1, 8, 20, 20, 24, 3, (3, 2), (2, 1), (2, 3)),    # stride and dilation: some phases
    (1, 300, 7, 7, 1100, 3, (1, 1), (1, 1), (1, 1)),  # channel blocks, several K blocks
], ids=[f"case{i}" for i in range(len(CASES) + 4)])
def test_direct_path_equals_the_gather_bit_for_bit(monkeypatch, case):
    """The direct path (rows read in place from phase planes) adds the same products in
    the same order as the gather path, so their outputs are equal, with a chain too (the
    direct path forced: most of these shapes are below its size threshold)."""
    n, c, h, w, oc, k, stride, pad, dil = case
    kh, kw = (k, k) if isinstance(k, int) else k
    size = out_size(h, w, kh, kw, stride, pad, dil)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((oc, c, kh, kw)).astype(np.float32)
    b = rng.standard_normal(oc).astype(np.float32)
    res = rng.standard_normal((n, oc) + tuple(size)).astype(np.float32)
    saved = kernels.isa()
    kernels.set_isa("avx512")
    try:
        outs = []
        for direct in ("1", "0"):
            monkeypatch.setenv("TIRBYOC_CONV_DIRECT", direct)
            outs.append(kernels.conv2d(x, wt, stride=stride, padding=pad, dilation=dil,
                                       out_size=size, bias=b, residual=res,
                                       epilogue=("bias", "residual", "relu", "gelu_tanh")))
    finally:
        kernels.set_isa(saved)
    np.testing.assert_array_equal(outs[0], outs[1])
    want, err = reference(x, wt, stride, pad, dil, size, ("bias", "residual", "relu",
                                                          "gelu_tanh"), b, res)
    assert np.all(np.abs(outs[0] - want) <= err)


@pytest.mark.parametrize("c,k", [(57, 3), (56, 3), (100, 3), (512, 1), (511, 1)],
                         ids=["K513", "K504", "K900", "K512-plain", "K511-plain"])
def test_k_blocks_and_the_bias_step(each_isa, c, k):
    """K (+ the bias step) across one or more K blocks, the step alone or not."""
    run_case(np.random.default_rng(c), 1, c, 9, 10, 20, k, pad=(k // 2, k // 2),
             ops=("bias", "relu"))


@pytest.mark.parametrize("n,oc,hw", [(1, 300, 7), (1, 12, 60), (4, 40, 9), (1, 64, 23)],
                         ids=["channel-blocks", "pixel-blocks", "batch", "odd-pixels"])
def test_work_splits(each_isa, n, oc, hw):
    """Few pixels and many channels (channel blocks), many pixels (pixel blocks), images
    as units, and pixel counts that end mid-panel: each equal to float64."""
    run_case(np.random.default_rng(oc), n, 16, hw, hw, oc, 3, pad=(1, 1),
             ops=("bias", "residual", "relu"))


@pytest.mark.parametrize("n,c,oc,groups,k,stride,hw", [
    (1, 8, 12, 4, 3, 1, 9),       # 2 -> 3 channels per group
    (2, 6, 6, 3, 1, 1, 7),        # 1x1 in groups: the plain path per group
    (1, 32, 64, 8, 3, 2, 20),     # ResNeXt-like, stride 2
    (1, 16, 16, 2, 5, 1, 12),
    (1, 6, 6, 6, 3, 1, 8),        # one channel per group (depthwise) is a group too
    (1, 64, 128, 32, 3, 1, 28),   # above the threading threshold: units per group
], ids=["g4", "g3-1x1", "g8-s2", "g2-5x5", "g6-depthwise", "g32-threads"])
def test_groups(each_isa, n, c, oc, groups, k, stride, hw):
    """A grouped conv: each group's output channels from its own input channels, against
    the float64 reference of each group, with a bias and a residual."""
    run_case(np.random.default_rng(groups), n, c, hw, hw, oc, k, stride=(stride, stride),
             pad=(k // 2, k // 2), ops=("bias", "residual", "relu"), groups=groups)


@pytest.mark.parametrize("pad,size", [((0, 2), (5, 4)), ((-1, -2), (4, 3)),
                                      ((2, 0), (9, 3)), ((1, 1), (2, 2))],
                         ids=["asym", "negative", "bottom-heavy", "cropped-output"])
def test_any_padding_and_output_size(each_isa, pad, size):
    """OH and OW are given, so any padding reads zeros outside the image (or crops it)."""
    run_case(np.random.default_rng(7), 2, 3, 6, 5, 4, 3, pad=pad, size=size, ops=("bias",))


@pytest.mark.parametrize("n,c,h,w,oc,k", [(16, 32, 28, 28, 64, 3), (1, 64, 56, 56, 64, 3)])
def test_conv_results_do_not_depend_on_threads(each_isa, n, c, h, w, oc, k):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((oc, c, k, k)).astype(np.float32)
    b = rng.standard_normal(oc).astype(np.float32)
    outs = on_each_thread_count(lambda: kernels.conv2d(x, wt, padding=1, bias=b,
                                                       epilogue=("bias", "relu")))
    for other in outs[1:]:
        np.testing.assert_array_equal(outs[0], other)


def test_nan_in_the_input_reaches_exactly_the_outputs_over_it(each_isa):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 2, 9, 9)).astype(np.float32)
    x[0, 1, 4, 6] = np.nan
    wt = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    got = kernels.conv2d(x, wt, padding=1, stride=(1, 2))
    want, _ = reference(x, wt, (1, 2), (1, 1), (1, 1), got.shape[2:], ())
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    # rows 3-5 (3 taps cover input row 4); column 3 only (2j - 1 + s = 6 needs s = 1)
    assert np.isnan(got).sum() == 3 * 1 * 3


def test_empty_sizes(each_isa):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 0, 4, 4)).astype(np.float32)
    wt = np.zeros((3, 0, 3, 3), np.float32)
    b = np.array([1.0, -2.0, 0.5], np.float32)
    got = kernels.conv2d(x, wt, padding=1, bias=b, epilogue=("bias", "relu"))
    np.testing.assert_array_equal(got, np.broadcast_to(
        np.maximum(b, 0)[None, :, None, None], (2, 3, 4, 4)))
    for shape, wshape in [((0, 2, 4, 4), (3, 2, 3, 3)), ((1, 2, 4, 4), (0, 2, 3, 3))]:
        out = kernels.conv2d(np.ones(shape, np.float32), np.ones(wshape, np.float32))
        assert out.size == 0
    out = kernels.conv2d(np.ones((1, 2, 2, 2), np.float32), np.ones((1, 2, 5, 5), np.float32))
    assert out.shape == (1, 1, 0, 0)


def _raw(batch=1, c=2, h=4, w=4, oc=3, kh=3, kw=3, stride=(1, 1), pad=(1, 1),
         dil=(1, 1), size=(4, 4), epilogue=0, x=True, weight=True, bias=False,
         residual=False, groups=1):
    """(status, y) of one direct call, y filled with a sentinel first."""
    ffi, lib = kernels.load()
    keep = []

    def buf(count, present):
        if not present:
            return ffi.NULL
        arr = np.ones(min(max(count, 1), 1 << 16), np.float32)  # errors read nothing
        keep.append(arr)
        return ffi.cast("float *", arr.ctypes.data)

    y = np.full(min(max(batch * oc * size[0] * size[1], 1), 1 << 16), 7.0, np.float32)
    status = lib.tirbyoc_conv2d_f32(
        batch, c, h, w, buf(batch * c * h * w, x), oc, groups, kh, kw,
        buf(oc * c * kh * kw, weight), stride[0], stride[1], pad[0], pad[1], dil[0], dil[1],
        size[0], size[1], epilogue, buf(oc, bias), buf(y.size, residual),
        ffi.cast("float *", y.ctypes.data))
    return status, y


@pytest.mark.parametrize("kw,status", [
    (dict(batch=-1), kernels.TIRBYOC_ESIZE),
    (dict(c=-2), kernels.TIRBYOC_ESIZE),
    (dict(size=(-1, 4)), kernels.TIRBYOC_ESIZE),
    (dict(h=1 << 31), kernels.TIRBYOC_ESIZE),
    (dict(stride=(0, 1)), kernels.TIRBYOC_EINVAL),
    (dict(dil=(1, -1)), kernels.TIRBYOC_EINVAL),
    (dict(pad=(1 << 31, 0)), kernels.TIRBYOC_EINVAL),
    (dict(epilogue=2 | 1 << 4, bias=True), kernels.TIRBYOC_EEPILOGUE),  # bias not first
    (dict(epilogue=9), kernels.TIRBYOC_EEPILOGUE),                       # scale
    (dict(epilogue=10 | 2 << 4), kernels.TIRBYOC_EEPILOGUE),             # divide
    (dict(epilogue=15), kernels.TIRBYOC_EEPILOGUE),                      # unknown op
    (dict(epilogue=1), kernels.TIRBYOC_ENULL),                           # bias NULL
    (dict(epilogue=11), kernels.TIRBYOC_ENULL),                          # residual NULL
    (dict(x=False), kernels.TIRBYOC_ENULL),
    (dict(weight=False), kernels.TIRBYOC_ENULL),
    (dict(groups=0), kernels.TIRBYOC_EINVAL),
    (dict(groups=2), kernels.TIRBYOC_EINVAL),  # does not divide OC = 3
    (dict(groups=3), kernels.TIRBYOC_EINVAL),  # does not divide C = 2
], ids=["batch", "channels", "out-size", "huge", "stride", "dilation", "padding",
        "bias-late", "scale", "divide", "unknown-op", "no-bias", "no-residual", "no-x",
        "no-weight", "groups-0", "groups-oc", "groups-c"])
def test_errors_write_nothing(kw, status):
    got, y = _raw(**kw)
    assert got == status, kernels.status_message(got)
    assert (y == 7.0).all()


def test_wrapper_errors_name_the_problem():
    x = np.ones((1, 2, 4, 4), np.float32)
    with pytest.raises(ValueError, match="weight"):
        kernels.conv2d(x, np.ones((3, 5, 3, 3), np.float32))
    with pytest.raises(ValueError, match="groups"):  # 2 does not divide OC = 3
        kernels.conv2d(x, np.ones((3, 1, 3, 3), np.float32), groups=2)
    with pytest.raises(ValueError, match="bias"):
        kernels.conv2d(x, np.ones((3, 2, 3, 3), np.float32), bias=np.ones(2, np.float32),
                       epilogue=("bias",))
    with pytest.raises(RuntimeError, match="tirbyoc_conv2d_f32"):
        kernels.conv2d(x, np.ones((3, 2, 3, 3), np.float32), stride=0, out_size=(2, 2))
