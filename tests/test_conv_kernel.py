"""tirbyoc_conv2d_f32 through cffi against float64 numpy, on every instruction set: kernel
sizes, strides, dilations, symmetric, asymmetric and negative padding, 1x1 convs (the
plain path that reads the image as a matrix), odd channel counts and pixel counts that
leave partial panels, K blocks with the bias step alone in the last one, the two ways of
splitting the work (pixel blocks, channel blocks), every epilogue operation it takes,
NaN in the input, results independent of the thread count, empty sizes and the error
statuses with nothing written. The pre-packed weight (tirbyoc_pack_conv2d_weight_f32,
tirbyoc_conv2d_f32_packed): its size and layout as documented, and outputs bit-identical
to the unpacked call's. (Random cases: the kernel fuzz; sanitizers: the driver.)

The reference is im2col in float64 (exact zeros in the padding) times the weight.
Tolerance as the matmul tests: 1e-5 * sqrt(sum of squared terms) * max(1, sqrt(K) / 8)
per output, through the chain, plus 1e-6 of the value.
"""

import itertools
import math
import zlib

import numpy as np
import pytest

from tirbyoc import kernels

from .test_kernel_fuzz import CHAIN_REFERENCE as UNARY, chain_growth
from .test_matmul_kernels import on_each_thread_count


# The AVX2 and AVX-512 builds can read the image in place (the direct path) and choose it
# or the gather by size; TIRBYOC_CONV_DIRECT=1 or 0 forces one: both are tested on every
# case.
DIRECT_ISAS = tuple(isa for isa in kernels.CONV_DIRECT_ISAS
                    if isa in kernels.available_isas())
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
    return apply_chain(v.reshape(shape), err.reshape(shape), ops, bias, residual)


def apply_chain(v, err, ops, bias=None, residual=None):
    """(value, error bound) of the float64 sums ``v`` [N, OC, OH, OW] (error bound
    ``err``) through the chain ``ops``: the bias per output channel, the residual, unary
    operations (each one grows the bound by ``chain_growth`` and 1e-6 of its value, 2e-5
    for the GELUs); each addition rounds its float32 sum, which may be far larger than the
    final value when the residual cancels it (2^-23 of the sum: one float32 rounding with
    room to spare); the bound plus 1e-6 of the final value."""
    with np.errstate(invalid="ignore", over="ignore"):
        for op in ops:
            if op in ("bias", "residual"):
                v = v + (bias.astype(np.float64)[None, :, None, None] if op == "bias"
                         else residual)
                err = err + 2.0 ** -23 * np.abs(v)
            else:
                v = UNARY[op](v)
                err = err * chain_growth(op) + (2e-5 if op.startswith("gelu") else 1e-6) * np.abs(v)
        return v, err + 1e-6 * np.abs(v) + 1e-30


def stable_seed(*parts):
    """A seed from the test's parameters, the same in every process (``hash`` of a string
    is not: Python salts it per process)."""
    return zlib.crc32(repr(parts).encode())


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
    (1, 6, 32, 32, 20, 3, (1, 1), (1, 1), (1, 1)),   # 32 x 32: planes 4 KB apart (conv_out)
]


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
@pytest.mark.parametrize("ops", [(), ("bias", "relu"), ("bias", "residual", "relu6"),
                                 ("residual", "silu"), ("bias", "gelu_erf", "tanh")],
                         ids=["plain", "bias-relu", "bias-res-relu6", "res-silu", "gelu-tanh"])
def test_conv_matches_float64(each_isa, case, ops):
    n, c, h, w, oc, k, stride, pad, dil = case
    run_case(np.random.default_rng(stable_seed(case, ops)), n, c, h, w, oc, k, stride,
             pad, dil, ops)


@pytest.mark.parametrize("direct_isa", DIRECT_ISAS)
@pytest.mark.parametrize("case", CASES + [
    (2, 20, 30, 33, 70, 3, (2, 2), (1, 1), (1, 1)),   # channels past one 64-wide tile
    (1, 9, 16, 16, 40, 4, (4, 4), (0, 0), (1, 1)),    # stride 4: 16 phase planes
    (1, 8, 20, 20, 24, 3, (3, 2), (2, 1), (2, 3)),    # stride and dilation: some phases
    (1, 300, 7, 7, 1100, 3, (1, 1), (1, 1), (1, 1)),  # channel blocks, several K blocks
], ids=[f"case{i}" for i in range(len(CASES) + 4)])
def test_direct_path_equals_the_gather_bit_for_bit(monkeypatch, case, direct_isa):
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
    kernels.set_isa(direct_isa)
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


def raw_call(symbol, y_count, args):
    """(status, y) of one direct call of ``symbol``, y (``y_count`` floats) filled with a
    sentinel first: ``args(buf, y)`` gives the call's arguments, ``buf(count, present)``
    being a buffer of ones or NULL (at most 65536 floats: errors read nothing)."""
    ffi, lib = kernels.load()
    keep = []

    def buf(count, present):
        if not present:
            return ffi.NULL
        arr = np.ones(min(max(count, 1), 1 << 16), np.float32)
        keep.append(arr)
        return ffi.cast("float *", arr.ctypes.data)

    y = np.full(min(max(y_count, 1), 1 << 16), 7.0, np.float32)
    status = getattr(lib, symbol)(*args(buf, ffi.cast("float *", y.ctypes.data)))
    return status, y


def _raw(batch=1, c=2, h=4, w=4, oc=3, kh=3, kw=3, stride=(1, 1), pad=(1, 1),
         dil=(1, 1), size=(4, 4), epilogue=0, x=True, weight=True, bias=False,
         residual=False, groups=1):
    """(status, y) of one direct call, y filled with a sentinel first."""
    ny = batch * oc * size[0] * size[1]
    return raw_call("tirbyoc_conv2d_f32", ny, lambda buf, y: (
        batch, c, h, w, buf(batch * c * h * w, x), oc, groups, kh, kw,
        buf(oc * c * kh * kw, weight), stride[0], stride[1], pad[0], pad[1], dil[0], dil[1],
        size[0], size[1], epilogue, buf(oc, bias), buf(ny, residual), y))


def refusals_test(raw, errors):
    """The test that each of ``errors`` (id, kwargs, status) makes ``raw(**kwargs)`` (a
    ``_raw`` of this file or of the depthwise one) return its status and write nothing
    to y."""
    @pytest.mark.parametrize("kw,status", [e[1:] for e in errors], ids=[e[0] for e in errors])
    def test_errors_write_nothing(kw, status):
        got, y = raw(**kw)
        assert got == status, kernels.status_message(got)
        assert (y == 7.0).all()

    return test_errors_write_nothing


# The refusals both conv kernels share, as arguments of their _raw (id, kwargs, status).
SHARED_ERRORS = [
    ("batch", dict(batch=-1), kernels.TIRBYOC_ESIZE),
    ("channels", dict(c=-2), kernels.TIRBYOC_ESIZE),
    ("out-size", dict(size=(-1, 4)), kernels.TIRBYOC_ESIZE),
    ("huge", dict(h=1 << 31), kernels.TIRBYOC_ESIZE),
    ("stride", dict(stride=(0, 1)), kernels.TIRBYOC_EINVAL),
    ("dilation", dict(dil=(1, -1)), kernels.TIRBYOC_EINVAL),
    ("padding", dict(pad=(1 << 31, 0)), kernels.TIRBYOC_EINVAL),
    ("bias-late", dict(epilogue=2 | 1 << 4, bias=True), kernels.TIRBYOC_EEPILOGUE),
    ("scale", dict(epilogue=9), kernels.TIRBYOC_EEPILOGUE),
    ("divide", dict(epilogue=10 | 2 << 4), kernels.TIRBYOC_EEPILOGUE),
    ("unknown-op", dict(epilogue=15), kernels.TIRBYOC_EEPILOGUE),
    ("no-bias", dict(epilogue=1), kernels.TIRBYOC_ENULL),
    ("no-residual", dict(epilogue=11), kernels.TIRBYOC_ENULL),
    ("no-x", dict(x=False), kernels.TIRBYOC_ENULL),
    ("no-weight", dict(weight=False), kernels.TIRBYOC_ENULL),
]
ERRORS = SHARED_ERRORS + [
    ("groups-0", dict(groups=0), kernels.TIRBYOC_EINVAL),
    ("groups-oc", dict(groups=2), kernels.TIRBYOC_EINVAL),  # does not divide OC = 3
    ("groups-c", dict(groups=3), kernels.TIRBYOC_EINVAL),   # does not divide C = 2
]

test_errors_write_nothing = refusals_test(_raw, ERRORS)


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


# --- pre-packed weights (tirbyoc_pack_conv2d_weight_f32, tirbyoc_conv2d_f32_packed) ------

PACKED_CASES = [
    # n, c, h, w, oc, k, stride, pad, dil, groups, ops
    (1, 4, 9, 9, 6, 3, (1, 1), (1, 1), (1, 1), 2, ("bias", "relu")),     # 3 channels / group
    (2, 6, 11, 10, 20, 3, (2, 2), (1, 1), (1, 1), 2, ("bias", "residual", "relu6")),  # 10
    (1, 8, 12, 12, 40, 3, (1, 1), (2, 2), (2, 2), 2, ()),    # 20 / group: 2 panels, no bias
    (1, 9, 7, 7, 33, 1, (1, 1), (0, 0), (1, 1), 1, ("bias",)),          # plain, 3 panels
    (2, 16, 5, 6, 24, 1, (1, 1), (0, 0), (1, 1), 4, ("residual", "relu6")),  # plain, groups
    (1, 8, 12, 12, 6, 1, (2, 2), (0, 0), (1, 1), 1, ("bias", "relu")),  # 1x1 stride 2
    (1, 5, 17, 19, 7, (3, 5), (1, 2), (2, 1), (1, 2), 1, ("bias", "residual", "relu6")),
    (1, 6, 8, 8, 6, 3, (1, 1), (1, 1), (1, 1), 6, ("bias",)),           # depthwise
    (1, 57, 6, 7, 15, 3, (1, 1), (1, 1), (1, 1), 1, ("bias", "relu")),  # K 513: K blocks
    (1, 16, 7, 7, 300, 3, (1, 1), (1, 1), (1, 1), 1, ("bias", "residual", "relu")),  # threads
    (1, 16, 7, 7, 1100, 1, (1, 1), (0, 0), (1, 1), 1, ("bias",)),  # direct channel blocks
    (2, 32, 14, 14, 64, 3, (1, 1), (1, 1), (1, 1), 1, ("bias", "residual", "relu6")),
]
PACKED_IDS = ["g2-ocg3", "g2-ocg10-s2-batch2", "g2-ocg20-dil-nobias", "plain-oc33",
              "plain-g4-nobias", "1x1-s2", "rect-kernel", "depthwise", "K513",
              "channel-blocks", "oc1100", "batch2-threads"]


@pytest.mark.parametrize("case", PACKED_CASES, ids=PACKED_IDS)
def test_packed_equals_unpacked_bit_for_bit(each_isa, case):
    """tirbyoc_conv2d_f32_packed with the weight and bias packed by
    tirbyoc_pack_conv2d_weight_f32 gives tirbyoc_conv2d_f32's output bit for bit (uint32
    views equal), on 1, 2 and 3 threads, for groups whose channel count is not a multiple
    of the 16-channel panel, strides, dilation, padding, plain 1x1 convs, with and without
    a bias, a residual + relu6 chain and batch 2; the unpacked output is also within the
    float64 tolerance of the module docstring (so both cannot be wrong alike)."""
    n, c, h, w, oc, k, stride, pad, dil, groups, ops = case
    kh, kw = (k, k) if isinstance(k, int) else k
    size = out_size(h, w, kh, kw, stride, pad, dil)
    rng = np.random.default_rng(PACKED_CASES.index(case))
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((oc, c // groups, kh, kw)).astype(np.float32)
    bias = rng.standard_normal(oc).astype(np.float32) if "bias" in ops else None
    res = (rng.standard_normal((n, oc) + size).astype(np.float32)
           if "residual" in ops else None)
    kwargs = dict(stride=stride, padding=pad, dilation=dil, epilogue=ops, residual=res,
                  out_size=size)
    want = kernels.conv2d(x, wt, groups=groups, bias=bias, **kwargs)
    ref, tol = reference(x, wt, stride, pad, dil, size, ops, bias, res, groups)
    assert np.all(np.abs(want - ref) <= tol)
    packed = kernels.pack_conv2d_weight(wt, bias, groups=groups)
    assert packed.with_bias == (bias is not None) and packed.groups == groups
    outs = on_each_thread_count(lambda: kernels.conv2d(x, packed, **kwargs))
    for got in outs:
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def packed_size_formula(oc, groups, k, with_bias):
    """groups * ceil(OCg / 16) panels of 16 lanes by K (+ 1 with a bias) steps."""
    return groups * -(-(oc // groups) // 16) * 16 * (k + with_bias)


def test_packed_size():
    """tirbyoc_conv2d_packed_size_f32 is the documented formula (0 for no output channels
    or no steps); -1 for groups below 1 or not dividing OC, a negative size, or a size
    past int64_t."""
    _, lib = kernels.load()
    for oc, groups, k in itertools.product((0, 1, 6, 16, 17, 20, 32, 33, 96), (1, 2, 3),
                                           (0, 1, 9, 27, 513)):
        if oc % groups:
            continue
        for with_bias in (0, 1):
            assert lib.tirbyoc_conv2d_packed_size_f32(oc, groups, k, with_bias) == \
                packed_size_formula(oc, groups, k, with_bias), (oc, groups, k, with_bias)
    assert lib.tirbyoc_conv2d_packed_size_f32(20, 2, 12, 1) == 2 * 1 * 16 * 13
    assert lib.tirbyoc_conv2d_packed_size_f32(36, 2, 6, 0) == 2 * 2 * 16 * 6
    assert lib.tirbyoc_conv2d_packed_size_f32(0, 1, 0, 1) == 0
    assert lib.tirbyoc_conv2d_packed_size_f32(5, 1, 0, 1) == 16
    for oc, groups, k in [(6, 0, 3), (6, -1, 3), (6, 4, 3), (20, 3, 3), (-1, 1, 3),
                          (-16, 1, 3), (6, 1, -1), (6, 2, -(2**63)), (2**40, 1, 2**30),
                          (16, 1, 2**62)]:
        for with_bias in (0, 1):
            assert lib.tirbyoc_conv2d_packed_size_f32(oc, groups, k, with_bias) == -1, \
                (oc, groups, k, with_bias)


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
def test_packed_layout_is_fixed(with_bias):
    """The documented layout, bit for bit, from every instruction set: with OCg = 18 (two
    panels per group, the second with 2 real lanes), K = 6 (+ the bias step),
    packed[((g * Q + q) * KT + p) * 16 + r] = weight[o][p] (p < K), bias[o] (p = K),
    o = g * OCg + 16q + r, and 0 in the lanes 16q + r >= OCg."""
    oc, groups, cg, kh, kw = 36, 2, 2, 1, 3
    ocg, k = oc // groups, cg * kh * kw
    q_count, kt = 2, k + with_bias
    # no weight or bias is 0, so the padding's zeros come from nowhere else
    wt = (np.arange(oc * k, dtype=np.float32) + 1).reshape(oc, cg, kh, kw)
    bias = -(np.arange(oc, dtype=np.float32) + 1) if with_bias else None
    w2 = wt.reshape(oc, k)
    expected = np.zeros(groups * q_count * kt * 16, np.float32)
    for g, q, p, r in itertools.product(range(groups), range(q_count), range(kt), range(16)):
        if 16 * q + r < ocg:
            o = g * ocg + 16 * q + r
            expected[((g * q_count + q) * kt + p) * 16 + r] = w2[o, p] if p < k else bias[o]
    # a few elements written out: o = 0, p = 0; o = 21 (g 1, lane 3), p = 5 and the bias
    # step; o = 17 (g 0, q 1, lane 1), p = 2; g 0, q 1, lane 2 is padding
    assert expected[0] == 1.0
    assert expected[((1 * 2 + 0) * kt + 5) * 16 + 3] == 21 * 6 + 6
    if with_bias:
        assert expected[((1 * 2 + 0) * kt + 6) * 16 + 3] == -22.0
    assert expected[((0 * 2 + 1) * kt + 2) * 16 + 1] == 17 * 6 + 3
    assert not expected.reshape(groups, q_count, kt, 16)[:, 1, :, 2:].any()
    saved = kernels.isa()
    try:
        for name in kernels.available_isas():
            kernels.set_isa(name)
            packed = kernels.pack_conv2d_weight(wt, bias, groups=groups)
            assert packed.shape == wt.shape and packed.data.dtype == np.float32
            np.testing.assert_array_equal(packed.data.view(np.uint32),
                                          expected.view(np.uint32), err_msg=name)
    finally:
        kernels.set_isa(saved)


def _raw_pack(oc=6, groups=2, k=4, weight=True, bias=True, packed=True):
    """(status, packed buffer) of one tirbyoc_pack_conv2d_weight_f32 call, the buffer
    filled with a sentinel first."""
    ffi, lib = kernels.load()
    wt = np.ones(64, np.float32)
    b = np.ones(64, np.float32)
    out = np.full(1024, 7.0, np.float32)

    def ptr(arr, present):
        return ffi.cast("float *", arr.ctypes.data) if present else ffi.NULL

    status = lib.tirbyoc_pack_conv2d_weight_f32(oc, groups, k, ptr(wt, weight),
                                                ptr(b, bias), ptr(out, packed))
    return status, out


@pytest.mark.parametrize("kw,status", [
    (dict(groups=0), kernels.TIRBYOC_EINVAL),
    (dict(groups=4), kernels.TIRBYOC_EINVAL),   # does not divide OC = 6
    (dict(oc=-1), kernels.TIRBYOC_ESIZE),
    (dict(k=-2), kernels.TIRBYOC_ESIZE),
    (dict(weight=False), kernels.TIRBYOC_ENULL),
    (dict(packed=False), kernels.TIRBYOC_ENULL),
], ids=["groups-0", "groups-oc", "oc", "k", "no-weight", "no-packed"])
def test_pack_errors_write_nothing(kw, status):
    """tirbyoc_pack_conv2d_weight_f32's error statuses, with nothing of packed written."""
    got, out = _raw_pack(**kw)
    assert got == status, kernels.status_message(got)
    assert (out == 7.0).all()


def test_packed_call_null_weight():
    """tirbyoc_conv2d_f32_packed refuses a NULL packed weight (TIRBYOC_ENULL, nothing
    written) when it has steps to read: K > 0, or K = 0 with the bias step."""
    ffi, lib = kernels.load()
    x = np.ones(2 * 4 * 4, np.float32)
    y = np.full(3 * 4 * 4, 7.0, np.float32)

    def call(c, epilogue):
        return lib.tirbyoc_conv2d_f32_packed(
            1, c, 4, 4, ffi.cast("float *", x.ctypes.data), 3, 1, 3, 3, ffi.NULL, 1, 1, 1,
            1, 1, 1, 4, 4, epilogue, ffi.NULL, ffi.cast("float *", y.ctypes.data))

    for c, epilogue in [(2, 0), (2, kernels.encode_epilogue(("bias",))),
                        (0, kernels.encode_epilogue(("bias", "relu")))]:
        assert call(c, epilogue) == kernels.TIRBYOC_ENULL, (c, epilogue)
        assert (y == 7.0).all()
    # no steps at all (C = 0, no bias): nothing to read, the chain on zeros
    assert call(0, kernels.encode_epilogue(("relu",))) == kernels.TIRBYOC_OK
    assert (y == 0.0).all()


def test_packed_wrapper_refuses_a_disagreeing_bias():
    """conv2d with a PackedConv2dWeight takes no bias argument, and its epilogue starts
    with "bias" if and only if the packed weight holds one (ValueError otherwise);
    pack_conv2d_weight refuses groups that do not divide OC and a bias of the wrong shape."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    wt = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    with_bias = kernels.pack_conv2d_weight(wt, b, groups=2)
    without = kernels.pack_conv2d_weight(wt, groups=2)
    with pytest.raises(ValueError, match="bias"):
        kernels.conv2d(x, with_bias, bias=b, epilogue=("bias",), padding=1)
    with pytest.raises(ValueError, match="bias"):
        kernels.conv2d(x, without, bias=b, epilogue=("bias",), padding=1)
    with pytest.raises(ValueError, match="bias"):
        kernels.conv2d(x, with_bias, epilogue=("relu",), padding=1)
    with pytest.raises(ValueError, match="bias"):
        kernels.conv2d(x, with_bias, padding=1)
    with pytest.raises(ValueError, match="bias"):
        kernels.conv2d(x, without, epilogue=("bias", "relu"), padding=1)
    with pytest.raises(ValueError, match="bias"):
        kernels.conv2d(x, with_bias, epilogue=("relu", "bias"), padding=1)
    with pytest.raises(ValueError, match="groups"):
        kernels.conv2d(x, without, groups=3, padding=1)
    with pytest.raises(ValueError):
        kernels.pack_conv2d_weight(wt, groups=4)  # does not divide OC = 6
    with pytest.raises(ValueError, match="bias"):
        kernels.pack_conv2d_weight(wt, b[:5], groups=2)
    # the agreeing calls run, and equal the unpacked ones
    np.testing.assert_array_equal(
        kernels.conv2d(x, with_bias, epilogue=("bias", "relu"), padding=1),
        kernels.conv2d(x, wt, groups=2, bias=b, epilogue=("bias", "relu"), padding=1))
    np.testing.assert_array_equal(kernels.conv2d(x, without, padding=1),
                                  kernels.conv2d(x, wt, groups=2, padding=1))


def _nchw_case(case, seed):
    """x, the packed weight, the residual (or None) and the output size of a layouts
    test's case, and the NCHW call's output, checked against the float64 reference."""
    n, c, h, w, oc, k, stride, pad, ops = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((oc, c, k, k)).astype(np.float32)
    bias = rng.standard_normal(oc).astype(np.float32) if "bias" in ops else None
    size = out_size(h, w, k, k, (stride, stride), (pad, pad), (1, 1))
    res = (rng.standard_normal((n, oc) + size).astype(np.float32)
           if "residual" in ops else None)
    packed = kernels.pack_conv2d_weight(wt, bias)
    want = kernels.conv2d(x, packed, stride=stride, padding=pad, epilogue=ops, residual=res)
    ref, tol = reference(x, wt, (stride,) * 2, (pad,) * 2, (1, 1), size, ops, bias, res)
    assert np.all(np.abs(want - ref) <= tol)
    return x, packed, res, size, want


@pytest.mark.parametrize("layouts", [("nchw16c", "nchw"), ("nchw", "nchw16c"),
                                     ("nchw16c", "nchw16c")], ids=["x16", "y16", "both"])
@pytest.mark.parametrize("case", [
    (1, 32, 7, 9, 48, 1, 1, 0, ("bias", "relu6")),            # plain: read in place
    (2, 64, 14, 14, 16, 1, 1, 0, ("bias", "residual", "relu")),
    (1, 16, 9, 11, 32, 3, 2, 1, ("residual",)),               # x into the phase planes
    (1, 48, 10, 12, 32, 3, 1, 1, ("bias", "residual", "relu")),  # ResNet's 3x3
    (1, 32, 14, 13, 64, 1, 2, 0, ("bias", "residual")),       # a 1x1 projection, stride 2
    (1, 576, 3, 5, 80, 1, 1, 0, ("bias", "residual", "relu6")),  # two K blocks
    (1, 64, 23, 29, 96, 1, 1, 0, ("relu",)),                  # many tiles, odd edges
    # a SiLU or sigmoid: applied to each stored block, a residual after it too
    (1, 32, 7, 9, 48, 1, 1, 0, ("bias", "silu")),
    (1, 16, 9, 11, 32, 3, 2, 1, ("bias", "sigmoid", "residual")),
    (1, 576, 3, 5, 80, 1, 1, 0, ("bias", "relu", "silu")),    # two K blocks
    # phase rows of 8 pixels and more, in steps of 8 (the last overlapping)
    (2, 32, 19, 37, 48, 3, 2, 1, ("bias", "relu")),
], ids=["plain", "plain-batch2-residual", "3x3-s2", "3x3-s1", "1x1-s2", "two-k-blocks",
        "23x29", "silu", "3x3-s2-sigmoid-residual", "two-k-blocks-relu-silu",
        "3x3-s2-wide"])
def test_blocked_layouts_equal_nchw_bit_for_bit(each_isa, case, layouts):
    """tirbyoc_conv2d_f32_packed_layouts with x and/or y (and the residual) NCHW16c gives
    the NCHW call's values, bit for bit, in the blocked order where the direct path runs
    (AVX2, AVX-512): y written in place (with both blocked and one K block, each tile
    stores into y itself), x read in place by a plain conv and copied from its blocks
    into the phase planes by the others; through NCHW copies elsewhere."""
    n, c, h, w, oc, k, stride, pad, ops = case
    x, packed, res, size, want = _nchw_case(case, oc)
    lx, ly = layouts
    blocked = ly == "nchw16c"
    got = kernels.conv2d(kernels.to_nchw16c(x) if lx == "nchw16c" else x, packed,
                         stride=stride, padding=pad, epilogue=ops,
                         residual=kernels.to_nchw16c(res) if blocked and res is not None
                         else res, layout_x=lx, layout_y=ly)
    assert got.shape == ((n, oc // 16) + size + (16,) if blocked else want.shape)
    got = kernels.from_nchw16c(got) if blocked else got
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("case", [
    (1, 3, 23, 29, 32, 3, 2, 1, ("bias", "relu6")),           # MobileNet's stem
    (2, 3, 30, 26, 64, 7, 2, 3, ("bias", "relu")),            # ResNet's stem
    (1, 3, 21, 21, 32, 3, 2, 1, ("bias", "silu")),            # EfficientNet's
    (1, 5, 17, 19, 48, 3, 1, 1, ("bias", "residual", "relu")),
    (1, 4, 15, 13, 16, 5, 2, 2, ("relu", "residual")),
    (1, 24, 13, 11, 48, 1, 1, 0, ("bias", "relu6")),          # plain, x read in place
    (2, 40, 9, 7, 32, 1, 1, 0, ("bias", "silu", "residual")),
], ids=["3x3-s2-relu6", "7x7-s2-batch2", "3x3-s2-silu", "3x3-s1-residual",
        "5x5-s2-relu-residual", "plain-relu6", "plain-batch2-silu-residual"])
def test_blocked_y_from_nchw_x_equals_nchw_bit_for_bit(each_isa, case):
    """A conv of an NCHW x with one K block (a stem over its phase planes, or a plain 1x1
    conv reading x in place) into an NCHW16c y: where the ISA has conv_tiley each
    register tile stores its sums into y itself, its rows a run of pixels that wraps
    from one output row to the next in most tiles (output widths that are no multiple of
    the tile's rows); the NCHW call's values bit for bit, and within the float64
    reference's tolerance."""
    n, c, h, w, oc, k, stride, pad, ops = case
    x, packed, res, size, want = _nchw_case(case, h * w)
    got = kernels.conv2d(x, packed, stride=stride, padding=pad, epilogue=ops,
                         residual=None if res is None else kernels.to_nchw16c(res),
                         layout_y="nchw16c")
    np.testing.assert_array_equal(kernels.from_nchw16c(got).view(np.uint32),
                                  want.view(np.uint32))


def test_direct_suits_is_the_kernels_choice():
    """``tirbyoc_conv2d_direct_suits`` states the rule the conv kernel applies to NCHW
    tensors: a plain conv takes the direct path up to as many pixels as output channels
    (four times as many from 256 k steps), any other from 128 k steps; sizes below 1 are
    refused."""
    suits = kernels.conv_direct_suits
    assert suits(True, 196, 1024, 257) and suits(True, 1024, 256, 256)
    assert not suits(True, 1025, 256, 256) and not suits(True, 257, 256, 255)
    assert suits(True, 256, 256, 65) and not suits(True, 3136, 256, 65)
    assert suits(False, 3136, 64, 128) and not suits(False, 49, 2048, 127)
    for bad in ((True, 0, 1, 1), (True, 1, 0, 1), (False, 1, 1, 0)):
        with pytest.raises(RuntimeError, match="invalid"):
            suits(*bad)


def test_blocked_layouts_refusals():
    """Channels not in blocks of 16 (TIRBYOC_EINVAL), an unpacked weight (the wrapper's
    ValueError), a 4-D array passed as NCHW16c. Every chain the conv takes is taken with
    either layout (a blocked y's SiLU runs on the stored block: the same bits)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 16, 4, 4)).astype(np.float32)
    packed = kernels.pack_conv2d_weight(rng.standard_normal((24, 16, 1, 1)).astype(np.float32))
    with pytest.raises(RuntimeError, match="invalid"):
        kernels.conv2d(x, packed, layout_y="nchw16c")  # 24 output channels
    packed16 = kernels.pack_conv2d_weight(rng.standard_normal((16, 16, 1, 1)).astype(np.float32))
    want = kernels.conv2d(x, packed16, epilogue=("silu",))
    for lx, ly in (("nchw16c", "nchw"), ("nchw", "nchw16c"), ("nchw16c", "nchw16c")):
        got = kernels.conv2d(kernels.to_nchw16c(x) if lx == "nchw16c" else x, packed16,
                             epilogue=("silu",), layout_x=lx, layout_y=ly)
        got = kernels.from_nchw16c(got) if ly == "nchw16c" else got
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    with pytest.raises(ValueError, match="packed"):
        kernels.conv2d(x, rng.standard_normal((16, 16, 1, 1)).astype(np.float32),
                       layout_x="nchw16c")
    with pytest.raises(ValueError, match="NCHW16c"):
        kernels.conv2d(x, packed16, layout_x="nchw16c")
    with pytest.raises(ValueError, match="layout_y"):
        kernels.conv2d(x, packed16, layout_y="nhwc")


@pytest.mark.parametrize("n,c,hw,oc,ops", [
    (2, 400, 7, 48, ("bias", "residual", "silu")),   # 49 pixels, two K blocks of 401 steps
    (3, 48, 1, 32, ("bias", "sigmoid")),             # 1 pixel: squeeze-and-excite
    (1, 64, 3, 32, ("residual", "relu")),            # 9 pixels, no bias
], ids=["7x7-two-k-blocks", "1x1-image", "3x3-no-bias"])
def test_small_images_run_as_one_product(n, c, hw, oc, ops):
    """A plain 1x1 conv whose pixels fill less than 7/8 of their 16-pixel panels runs as
    one product with the pixels as rows (copies in and out, kernels/conv_f32.c): within
    the float64 reference's bound, and the same bits as the unpacked weight's call
    and as every layout but blocked x with blocked y (which keeps the direct path)."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
    wt = (rng.standard_normal((oc, c, 1, 1)) / math.sqrt(c)).astype(np.float32)
    bias = rng.standard_normal(oc).astype(np.float32)
    res = rng.standard_normal((n, oc, hw, hw)).astype(np.float32)
    value, err = reference(x, wt, (1, 1), (0, 0), (1, 1), (hw, hw), ops, bias, res)
    kw = dict(epilogue=ops, residual=res if "residual" in ops else None)
    unpacked = kernels.conv2d(x, wt, bias=bias if "bias" in ops else None, **kw)
    assert np.all(np.abs(unpacked - value) <= err)
    packed = kernels.pack_conv2d_weight(wt, bias if "bias" in ops else None)
    blk = kernels.to_nchw16c
    for lx, ly in (("nchw", "nchw"), ("nchw16c", "nchw"), ("nchw", "nchw16c"),
                   ("nchw16c", "nchw16c")):
        got = kernels.conv2d(blk(x) if lx == "nchw16c" else x, packed, epilogue=ops,
                             residual=None if "residual" not in ops
                             else blk(res) if ly == "nchw16c" else res,
                             layout_x=lx, layout_y=ly)
        got = kernels.from_nchw16c(got) if ly == "nchw16c" else got
        np.testing.assert_array_equal(got.view(np.uint32), unpacked.view(np.uint32),
                                      err_msg=f"{lx} -> {ly}")


@pytest.mark.parametrize("ops", [("bias", "residual", "relu6"), ("bias", "silu", "residual")],
                         ids=["residual-relu6", "silu-residual"])
def test_blocked_y_over_k_blocks_does_not_depend_on_threads(each_isa, ops):
    """A 1x1 conv of 576 channels with x and y blocked: two K blocks on AVX2 and
    AVX-512, whose partial sums the tiles keep in y itself (the next block adds to
    them, the chain after the last). The values of the NCHW call, bit for bit, at 1 to 3
    threads (each thread count splits the channels and pixels differently)."""
    rng = np.random.default_rng(576)
    x = rng.standard_normal((1, 576, 6, 7)).astype(np.float32)
    wt = rng.standard_normal((48, 576, 1, 1)).astype(np.float32)
    bias = rng.standard_normal(48).astype(np.float32)
    res = rng.standard_normal((1, 48, 6, 7)).astype(np.float32)
    packed = kernels.pack_conv2d_weight(wt, bias)
    want = kernels.conv2d(x, packed, epilogue=ops, residual=res)
    ref, tol = reference(x, wt, (1, 1), (0, 0), (1, 1), (6, 7), ops, bias, res)
    assert np.all(np.abs(want - ref) <= tol)
    x16, res16 = kernels.to_nchw16c(x), kernels.to_nchw16c(res)
    for got in on_each_thread_count(lambda: kernels.conv2d(
            x16, packed, epilogue=ops, residual=res16, layout_x="nchw16c",
            layout_y="nchw16c")):
        np.testing.assert_array_equal(kernels.from_nchw16c(got).view(np.uint32),
                                      want.view(np.uint32))
