"""tirbyoc_depthwise_conv2d_f32 through cffi (tirbyoc.kernels.depthwise_conv2d) against
float64 numpy, on every instruction set and every path of the kernel: the phase planes
(each instruction set; on AVX-512 rows padded to 16 floats for 3x3, 5x5 and 7x7 filters
at stride 1 and 2, and unaligned rows elsewhere), AVX-512's channels in lanes, and the
scalar path that reads the input in place (taken where a window would not fit, and
forced here with TIRBYOC_DW_PATH). Kernel sizes 1, 3, 5 and rectangular, strides 1, 2
and 3, dilations, symmetric, asymmetric and negative padding, odd sizes, channel counts
that leave a partial block of 16, batch 2, every epilogue operation and the residual,
NaN in the input, results independent of the thread count and of the path (bit for
bit), empty sizes and the error statuses with nothing written.
(Random cases: the kernel fuzz; sanitizers: the driver.)

The reference takes each tap's input in float64 (exact zeros in the padding) times the
tap's weight. Tolerance as the conv tests: 1e-5 * sqrt(sum of squared terms) *
max(1, sqrt(KH * KW) / 8) per output, grown through the chain (by chain_growth and 1e-6
of the value per unary operation, 2e-5 for the GELUs, and 2^-23 of the sum after the bias
and after the residual), plus 1e-6 of the value. Each case's inputs come from a seed that
is the same in every process.
"""

import math

import numpy as np
import pytest

from tirbyoc import kernels

from .test_conv_kernel import (SHARED_ERRORS, apply_chain, out_size, raw_call, refusals_test,
                               stable_seed)
from .test_matmul_kernels import on_each_thread_count

# Every instruction set with its choice of path, those with channels in lanes with each of
# their vector paths forced, and each instruction set's scalar path.
CHANNELS_ISAS = [isa for isa in kernels.DEPTHWISE_CHANNELS_ISAS
                 if isa in kernels.available_isas()]
PATHS = (list(kernels.available_isas())
         + [f"{isa}-{p}" for isa in CHANNELS_ISAS for p in ("planes", "channels")]
         + [f"{isa}-scalar" for isa in kernels.available_isas()])


@pytest.fixture(params=PATHS)
def each_path(request, monkeypatch):
    isa, _, path = request.param.partition("-")
    if path:
        monkeypatch.setenv("TIRBYOC_DW_PATH", path)
    else:
        monkeypatch.delenv("TIRBYOC_DW_PATH", raising=False)
    saved = kernels.isa()
    kernels.set_isa(isa)
    yield request.param
    kernels.set_isa(saved)


def reference(x, wt, stride, pad, dil, size, ops, bias=None, residual=None):
    """(value, error bound), both [N, C, OH, OW], in float64."""
    n, c, h, w = x.shape
    kh, kw = wt.shape[2:]
    oh, ow = size
    x64, w64 = x.astype(np.float64), wt.astype(np.float64)
    v = np.zeros((n, c, oh, ow))
    sq = np.zeros((n, c, oh, ow))
    with np.errstate(invalid="ignore", over="ignore"):
        for r in range(kh):
            rows = np.arange(oh) * stride[0] - pad[0] + r * dil[0]
            for s in range(kw):
                cols = np.arange(ow) * stride[1] - pad[1] + s * dil[1]
                ok = ((rows >= 0) & (rows < h))[:, None] & ((cols >= 0) & (cols < w))[None, :]
                tap = (x64[:, :, np.clip(rows, 0, max(h - 1, 0))][
                    :, :, :, np.clip(cols, 0, max(w - 1, 0))] if h and w
                    else np.zeros((n, c, oh, ow)))
                term = np.where(ok, tap, 0.0) * w64[:, 0, r, s][None, :, None, None]
                v = v + term
                sq = sq + np.where(np.isfinite(term), term, 0.0) ** 2
        err = np.sqrt(sq) * 1e-5 * max(1.0, math.sqrt(kh * kw) / 8)
    return apply_chain(v, err, ops, bias, residual)


def make(rng, n, c, h, w, k, stride=(1, 1), pad=(0, 0), dil=(1, 1), ops=(), size=None):
    kh, kw = (k, k) if isinstance(k, int) else k
    size = size or out_size(h, w, kh, kw, stride, pad, dil)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((c, 1, kh, kw)).astype(np.float32)
    bias = rng.standard_normal(c).astype(np.float32) if "bias" in ops else None
    residual = (rng.standard_normal((n, c) + tuple(size)).astype(np.float32)
                if "residual" in ops else None)
    return dict(x=x, weight=wt, stride=stride, padding=pad, dilation=dil, epilogue=ops,
                bias=bias, residual=residual, out_size=size)


def check(args):
    got = kernels.depthwise_conv2d(**args)
    want, tol = reference(args["x"], args["weight"], args["stride"], args["padding"],
                          args["dilation"], args["out_size"], args["epilogue"],
                          args["bias"], args["residual"])
    assert got.shape == want.shape
    bad = ~(np.abs(got - want) <= tol)
    assert not bad.any(), (np.argwhere(bad)[:5], np.nanmax(np.abs(got - want)))
    return got


CASES = [
    # n, c, h, w, k, stride, pad, dil
    (1, 32, 20, 20, 3, (1, 1), (1, 1), (1, 1)),
    (2, 5, 13, 11, 3, (2, 2), (1, 1), (1, 1)),      # odd sizes, stride 2, batch 2
    (1, 20, 17, 19, 5, (1, 1), (2, 2), (1, 1)),     # 5x5, a partial block of 16 channels
    (1, 18, 30, 31, 5, (2, 2), (2, 2), (1, 1)),     # 5x5 stride 2
    (2, 6, 9, 14, 1, (1, 1), (0, 0), (1, 1)),       # 1x1
    (1, 16, 7, 7, 3, (1, 1), (1, 1), (1, 1)),       # rows narrower than a vector
    (1, 17, 23, 29, 3, (3, 3), (1, 1), (1, 1)),     # stride 3
    (1, 9, 25, 27, 3, (1, 1), (2, 2), (2, 2)),      # dilation 2
    (1, 12, 21, 22, 3, (2, 1), (2, 3), (2, 3)),     # strides and dilations per axis
    (1, 10, 19, 70, (3, 5), (1, 2), (1, 2), (1, 1)),  # rectangular filter, wide rows
    (1, 24, 8, 60, 3, (1, 1), (1, 1), (1, 1)),      # stride 1, rows of 60 (padded to 64)
    (1, 8, 12, 100, 7, (1, 1), (3, 3), (1, 1)),     # 7x7
    (1, 3, 40, 3, (3, 1), (1, 1), (1, 0), (1, 1)),  # three channels, three columns
    (1, 1, 1, 1, 1, (1, 1), (0, 0), (1, 1)),
    (1, 4, 2, 2, 3, (1, 1), (3, 3), (2, 2)),        # more padding than image
]
OPS = [(), ("bias", "relu6"), ("bias", "residual", "relu"), ("residual", "silu"),
       ("bias", "gelu_erf", "tanh"), ("relu", "residual", "sigmoid", "gelu_tanh")]
OPS_IDS = ["plain", "bias-relu6", "bias-res-relu", "res-silu", "gelu-tanh",
           "relu-res-sigmoid-gelu"]


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
@pytest.mark.parametrize("ops", OPS, ids=OPS_IDS)
def test_depthwise_matches_float64(each_path, case, ops):
    n, c, h, w, k, stride, pad, dil = case
    check(make(np.random.default_rng(stable_seed(case, ops)), n, c, h, w, k, stride,
               pad, dil, ops))


@pytest.mark.parametrize("pad,size", [((0, 2), (5, 4)), ((-1, -2), (4, 3)),
                                      ((2, 0), (9, 3)), ((1, 1), (2, 2))],
                         ids=["asym", "negative", "bottom-heavy", "cropped-output"])
def test_any_padding_and_output_size(each_path, pad, size):
    """OH and OW are given, so any padding reads zeros outside the image (or crops it)."""
    check(make(np.random.default_rng(7), 2, 19, 6, 5, 3, pad=pad, size=size,
               ops=("bias", "relu")))


@pytest.mark.parametrize("c,hw,stride", [(32, 112, 1), (64, 56, 2), (128, 28, 1),
                                         (256, 14, 2), (40, 7, 1)],
                         ids=["112-s1", "56-s2", "28-s1", "14-s2", "7-s1"])
def test_mobilenet_shapes(each_path, c, hw, stride):
    """MobileNet's depthwise convs (3x3, padding 1, folded batch norm, ReLU6), above the
    threading threshold, against float64."""
    check(make(np.random.default_rng(c), 1, c, hw, hw, 3, (stride, stride), (1, 1),
               ops=("bias", "relu6")))


@pytest.mark.parametrize("channels_isa", CHANNELS_ISAS)
@pytest.mark.parametrize("case", CASES[:12] + [(2, 48, 56, 56, 3, (1, 1), (1, 1), (1, 1)),
                                               (1, 64, 28, 28, 3, (2, 2), (1, 1), (1, 1))],
                         ids=[f"case{i}" for i in range(14)])
def test_paths_are_equal_bit_for_bit(monkeypatch, case, channels_isa):
    """The phase planes, channels in lanes and the scalar path add the same products in
    the same order and apply the chain with the same operations: equal outputs."""
    n, c, h, w, k, stride, pad, dil = case
    args = make(np.random.default_rng(11), n, c, h, w, k, stride, pad, dil,
                ("bias", "relu", "residual", "gelu_tanh"))
    saved = kernels.isa()
    kernels.set_isa(channels_isa)
    try:
        outs = []
        for path in ("planes", "channels", "scalar"):
            monkeypatch.setenv("TIRBYOC_DW_PATH", path)
            outs.append(kernels.depthwise_conv2d(**args))
    finally:
        kernels.set_isa(saved)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


@pytest.mark.parametrize("n,c,hw,stride", [(1, 32, 112, 1), (2, 64, 28, 2), (1, 3, 90, 1),
                                           (1, 1024, 7, 1)],
                         ids=["112-s1", "batch2-s2", "3-channels-row-blocks", "7x7"])
def test_results_do_not_depend_on_threads(each_path, n, c, hw, stride):
    """Units of work (channels, blocks of rows) go to threads in any order; every output
    is computed the same way: the same bits on 1, 2 and 3 threads."""
    args = make(np.random.default_rng(3), n, c, hw, hw, 3, (stride, stride), (1, 1),
                ops=("bias", "residual", "relu6"))
    outs = on_each_thread_count(lambda: kernels.depthwise_conv2d(**args))
    for other in outs[1:]:
        np.testing.assert_array_equal(outs[0], other)


def test_windows_too_large_take_the_scalar_path(each_path):
    """A dilation of 150000 columns: no window of planes or pixels fits in the scratch,
    so every path reads the input in place (the scalar path), still right."""
    check(make(np.random.default_rng(5), 1, 17, 3, 3, 3, dil=(1, 150000),
               pad=(1, 150000), size=(3, 3), ops=("bias", "relu")))


def test_nan_in_the_input_reaches_exactly_the_outputs_over_it(each_path):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 18, 9, 9)).astype(np.float32)
    x[0, 17, 4, 6] = np.nan
    wt = rng.standard_normal((18, 1, 3, 3)).astype(np.float32)
    got = kernels.depthwise_conv2d(x, wt, padding=1, stride=(1, 2), epilogue=("relu",))
    want, _ = reference(x, wt, (1, 2), (1, 1), (1, 1), got.shape[2:], ("relu",))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    # channel 17 only; rows 3-5 (3 taps cover input row 4); column 3 (2j - 1 + s = 6)
    assert np.isnan(got).sum() == 3 and np.isnan(got[0, 17, 3:6, 3]).all()


def test_empty_sizes(each_path):
    rng = np.random.default_rng(5)
    b = np.array([1.0, -2.0, 0.5], np.float32)
    # no taps: the chain on zeros
    got = kernels.depthwise_conv2d(rng.standard_normal((2, 3, 4, 4)).astype(np.float32),
                                   np.zeros((3, 1, 0, 0), np.float32), bias=b,
                                   epilogue=("bias", "relu"), out_size=(4, 4))
    np.testing.assert_array_equal(got, np.broadcast_to(
        np.maximum(b, 0)[None, :, None, None], (2, 3, 4, 4)))
    # an empty image: every tap reads padding
    got = kernels.depthwise_conv2d(np.ones((1, 3, 0, 0), np.float32),
                                   np.ones((3, 1, 3, 3), np.float32), bias=b,
                                   epilogue=("bias",), out_size=(2, 2))
    np.testing.assert_array_equal(got, np.broadcast_to(b[None, :, None, None], (1, 3, 2, 2)))
    for shape in [(0, 2, 4, 4), (1, 0, 4, 4)]:
        out = kernels.depthwise_conv2d(np.ones(shape, np.float32),
                                       np.ones((shape[1], 1, 3, 3), np.float32))
        assert out.size == 0
    out = kernels.depthwise_conv2d(np.ones((1, 2, 2, 2), np.float32),
                                   np.ones((2, 1, 5, 5), np.float32))
    assert out.shape == (1, 2, 0, 0)


def _raw(batch=1, c=2, h=4, w=4, kh=3, kw=3, stride=(1, 1), pad=(1, 1), dil=(1, 1),
         size=(4, 4), epilogue=0, x=True, weight=True, bias=False, residual=False):
    """(status, y) of one direct call, y filled with a sentinel first."""
    ny = batch * c * size[0] * size[1]
    return raw_call("tirbyoc_depthwise_conv2d_f32", ny, lambda buf, y: (
        batch, c, h, w, buf(batch * c * h * w, x), kh, kw, buf(c * kh * kw, weight),
        stride[0], stride[1], pad[0], pad[1], dil[0], dil[1], size[0], size[1], epilogue,
        buf(c, bias), buf(ny, residual), y))


# the conv kernel's refusals (test_conv_kernel), and a few more
ERRORS = SHARED_ERRORS + [
    ("kernel", dict(kh=-1), kernels.TIRBYOC_ESIZE),
    ("negative-padding", dict(pad=(0, -(1 << 31))), kernels.TIRBYOC_EINVAL),
    ("after-end", dict(epilogue=2 | 3 << 8), kernels.TIRBYOC_EEPILOGUE),  # op after the end
]

test_errors_write_nothing = refusals_test(_raw, ERRORS)


def test_wrapper_errors_name_the_problem():
    x = np.ones((1, 2, 4, 4), np.float32)
    with pytest.raises(ValueError, match="weight"):
        kernels.depthwise_conv2d(x, np.ones((2, 2, 3, 3), np.float32))
    with pytest.raises(ValueError, match="weight"):
        kernels.depthwise_conv2d(x, np.ones((3, 1, 3, 3), np.float32))
    with pytest.raises(ValueError, match="bias"):
        kernels.depthwise_conv2d(x, np.ones((2, 1, 3, 3), np.float32),
                                 bias=np.ones(3, np.float32), epilogue=("bias",))
    with pytest.raises(ValueError, match="residual"):
        kernels.depthwise_conv2d(x, np.ones((2, 1, 3, 3), np.float32),
                                 residual=np.ones((1, 2, 4, 4), np.float32),
                                 epilogue=("residual",))
    with pytest.raises(RuntimeError, match="tirbyoc_depthwise_conv2d_f32"):
        kernels.depthwise_conv2d(x, np.ones((2, 1, 3, 3), np.float32), stride=0,
                                 out_size=(2, 2))


def test_equals_the_grouped_conv_kernel():
    """The same convolution through tirbyoc_conv2d_f32 with groups = C (an implicit
    product per group) agrees within the tolerance."""
    args = make(np.random.default_rng(9), 2, 24, 15, 13, 3, (2, 1), (1, 1),
                ops=("bias", "residual", "relu6"))
    got = kernels.depthwise_conv2d(**args)
    other = kernels.conv2d(args["x"], args["weight"], stride=(2, 1), padding=(1, 1),
                           groups=24, epilogue=args["epilogue"], bias=args["bias"],
                           residual=args["residual"], out_size=args["out_size"])
    _, tol = reference(args["x"], args["weight"], (2, 1), (1, 1), (1, 1), args["out_size"],
                       args["epilogue"], args["bias"], args["residual"])
    assert np.all(np.abs(got - other) <= 2 * tol)


@pytest.mark.parametrize("layouts", [("nchw16c", "nchw"), ("nchw", "nchw16c"),
                                     ("nchw16c", "nchw16c")], ids=["x16", "y16", "both"])
@pytest.mark.parametrize("case", [
    (1, 32, 14, 14, (3, 3), 1, 1, 1, ("bias", "relu6")),
    (2, 48, 13, 11, (3, 3), 2, 1, 1, ("bias", "residual", "relu")),
    (1, 16, 12, 12, (5, 5), 1, 2, 1, ("residual", "relu6")),
    (1, 32, 11, 19, (3, 3), (1, 2), (2, 3), 2, ("bias", "relu")),
    (1, 16, 9, 10, (2, 4), (2, 3), (1, 2), (2, 1), ("bias",)),
    (1, 16, 3, 2, (7, 7), 1, 3, 1, ("bias", "relu6")),
    (1, 16, 8, 37, (3, 3), 4, 0, 1, ()),
    (1, 32, 14, 14, (3, 3), 1, 1, 1, ("bias", "silu")),
    (1, 48, 9, 13, (5, 5), 2, 2, 1, ("bias", "sigmoid", "residual")),
], ids=["3x3", "s2-batch2-residual", "5x5", "dilated", "2x4", "7x7-tiny", "s4-unpadded",
        "silu", "s2-sigmoid-then-residual"])
def test_blocked_layouts_equal_nchw_bit_for_bit(each_path, case, layouts):
    """tirbyoc_depthwise_conv2d_f32_layouts with x and/or y (and the residual) NCHW16c
    gives the NCHW call's values, bit for bit, in the blocked order, on every path asked
    for (the channels-in-lanes path reads a blocked x in place, edges and padding rows
    included, and writes a blocked y in place; the others, and ISAs without it, go through
    NCHW copies)."""
    n, c, h, w, (kh, kw), stride, pad, dil, ops = case
    rng = np.random.default_rng(c + h)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((c, 1, kh, kw)).astype(np.float32)
    bias = rng.standard_normal(c).astype(np.float32) if "bias" in ops else None
    two = lambda v: v if isinstance(v, tuple) else (v, v)  # noqa: E731
    size = out_size(h, w, kh, kw, two(stride), two(pad), two(dil))
    res = rng.standard_normal((n, c) + size).astype(np.float32) if "residual" in ops else None
    want = kernels.depthwise_conv2d(x, wt, stride=stride, padding=pad, dilation=dil,
                                    epilogue=ops, bias=bias, residual=res)
    lx, ly = layouts
    blocked = ly == "nchw16c"
    got = kernels.depthwise_conv2d(
        kernels.to_nchw16c(x) if lx == "nchw16c" else x, wt, stride=stride, padding=pad,
        dilation=dil, epilogue=ops, bias=bias,
        residual=kernels.to_nchw16c(res) if blocked and res is not None else res,
        layout_x=lx, layout_y=ly)
    got = kernels.from_nchw16c(got) if blocked else got
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
