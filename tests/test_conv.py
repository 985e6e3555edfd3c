"""Convolutions as kernel calls (tirbyoc.conv): which conv2d forms become one call of the
conv kernel (an implicit matrix product) or, depthwise, of the depthwise kernel (bias,
folded batch norm, residual and relu in the kernel call), which stay TVM's conv2d, and
numerics against PyTorch either way.

Tolerance: max|got - ref| <= 1e-5 * max|ref| against PyTorch's float32 result (products of
up to 64 * 9 terms; the batch norm folded in float64 and rounded once).
"""

import re

import numpy as np
import pytest
import tvm
import tvm_ffi

import tirbyoc
from tirbyoc import examples, kernels

torch = pytest.importorskip("torch")

RTOL = 1e-5


def _import(model, x):
    from tvm.relax.frontend.torch import from_exported_program

    with torch.no_grad():
        return from_exported_program(torch.export.export(model, (x,)),
                                     keep_params_as_input=False)


def _check(model, shape, expected, seed=0, passes=None):
    """Offloaded intrinsics and numerics against PyTorch; ``passes``: the region passes
    (explain and compile alike; None: the defaults)."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    mod = _import(model, x)
    report = tirbyoc.explain(mod, region_passes=passes)
    assert sorted(r.intrinsic for r in report.offloaded) == sorted(expected), str(report)
    with torch.no_grad():
        ref = model(x).numpy()
    got = tirbyoc.run(tirbyoc.compile(mod, region_passes=passes), x.numpy())
    got = got[0] if isinstance(got, (list, tuple)) else got
    assert float(np.abs(got - ref).max()) <= RTOL * float(np.abs(ref).max())
    return report


def _no_tvm_convs(report, unpacked=0, depthwise=0, winograd=0, blocked=0,
                  blocked_depthwise=0):
    """Every PrimFunc named for a conv is a kernel call (none is TVM's conv2d):
    ``depthwise`` of them the depthwise kernel's, ``winograd`` the Winograd kernel's, the
    others the conv kernel's, all but ``unpacked`` of those on a weight packed at compile
    time. A weight is packed unless its 16-channel panels would be mostly padding (fewer
    than 8 output channels per group). ``blocked`` of the packed calls and
    ``blocked_depthwise`` of the depthwise ones read or write NCHW16c tensors (their
    ``_layouts`` entry points)."""
    convs = {name: how for name, how in report.schedules.items() if "conv2d" in name}
    hows = sorted(convs.values())
    assert convs and hows == sorted(
        ["kernel tirbyoc_depthwise_conv2d_f32"] * (depthwise - blocked_depthwise)
        + ["kernel tirbyoc_depthwise_conv2d_f32_layouts"] * blocked_depthwise
        + ["kernel tirbyoc_conv2d_winograd_cached_f32"] * winograd
        + ["kernel tirbyoc_conv2d_f32"] * unpacked
        + ["kernel tirbyoc_conv2d_f32_packed_layouts"] * blocked
        + ["kernel tirbyoc_conv2d_f32_packed"] * (len(convs) - unpacked - depthwise
                                                  - winograd - blocked)), convs


# The compiler plans NCHW16c tensors only where the kernels read them in place: between
# convs wherever the conv kernel has its direct path, through depthwise convs only where
# the depthwise kernel has its channels-in-lanes path (the tests of MobileNet-like chains).
BLOCKING = kernels.isa() in kernels.DEPTHWISE_CHANNELS_ISAS
CONV_BLOCKING = kernels.isa() in kernels.CONV_DIRECT_ISAS


def test_small_cnn():
    """Two 3x3 convs with bias and relu, global average pool, Linear."""
    _check(examples.small_cnn_torch(), (2, 3, 16, 16),
           ["conv2d_bias_relu", "conv2d_bias_relu", "dense_bias"])


def test_resnet_blocks_fold_batch_norms_and_fuse_shortcuts():
    """Stem (7x7/2 conv, batch norm, relu, max pool) and two basic blocks, the second with
    a 1x1/2 projection shortcut: every conv is a matmul, each batch norm folded (random
    statistics), the identity shortcut added in the second conv's kernel call before the
    relu; the projection's add belongs to one of the two convs that meet there. The max
    pool is a kernel call too. Where the conv kernel has its direct path, the stem writes
    NCHW16c and the max pool reads it (its output NCHW), each block's first 3x3 conv
    writes NCHW16c and its second reads it (through its phase planes); the shortcuts
    stay NCHW, since the last block's output goes to the pooling."""
    model = examples.resnet_torch((1, 1), (16, 32), 10)
    report = _check(model, (1, 3, 40, 40), [
        "conv2d_bias_relu", "max_pool2d", "conv2d_bias_relu", "conv2d_bias_residual_relu",
        "conv2d_bias_relu", "conv2d_bias_residual_relu", "conv2d_bias", "dense_bias"])
    _no_tvm_convs(report, blocked=5 * CONV_BLOCKING)
    assert report.schedules["tirbyoc_max_pool2d"] == "kernel tirbyoc_max_pool2d_f32" + (
        "_layouts" if CONV_BLOCKING else "")


@pytest.mark.parametrize("winograd", ["1", "0"], ids=["winograd", "direct"])
def test_resnet_3x3_convs_over_many_tiles_take_winograd(monkeypatch, winograd):
    """The two-block ResNet at 112 x 112: the first block's 3x3 convs (16 channels at 28 x
    28: 49 tiles of 4 x 4 pixels) are Winograd calls, with the folded batch norm, the
    shortcut and the relu in the call; the second block's (stride 2, and 14 x 14: 16
    tiles), the stem and the projection stay the direct kernel's. With
    TIRBYOC_CONV_WINOGRAD=0 none is Winograd. Same tolerance against PyTorch either
    way."""
    if winograd == "0":
        monkeypatch.setenv("TIRBYOC_CONV_WINOGRAD", "0")
    else:
        monkeypatch.delenv("TIRBYOC_CONV_WINOGRAD", raising=False)
    model = examples.resnet_torch((1, 1), (16, 32), 10)
    report = _check(model, (1, 3, 112, 112), [
        "conv2d_bias_relu", "max_pool2d", "conv2d_bias_relu", "conv2d_bias_residual_relu",
        "conv2d_bias_relu", "conv2d_bias_residual_relu", "conv2d_bias", "dense_bias"])
    # (NCHW16c between the stem and the pool, and between the two 3x3 convs of each
    # block on the direct path)
    _no_tvm_convs(report, winograd=2 if winograd == "1" else 0,
                  blocked=(3 if winograd == "1" else 5) * CONV_BLOCKING)


def test_winograd_conv_keeps_the_weight_not_its_transform():
    """A Winograd conv's call reads the model's weight (its 4x transform is made by the
    first call, in the kernels): the offloaded module's constants are the imported
    model's bytes, the weight and bias, not 4x them; the result is PyTorch's."""
    from tirbyoc.bench_zoo import _weight_bytes

    model = torch.nn.Sequential(torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU()).eval()
    x = torch.randn(1, 64, 28, 28, generator=torch.Generator().manual_seed(3))
    mod = _import(model, x)
    report = _check(model, (1, 64, 28, 28), ["conv2d_bias_relu"], seed=3)
    _no_tvm_convs(report, winograd=1)
    offloaded = tirbyoc.apply_tir_byoc(mod)
    assert _weight_bytes(offloaded) == _weight_bytes(mod) == 4 * (64 * 64 * 9 + 64)


def test_batch_norm_folding_is_a_region_pass():
    """``weights.fold_batch_norm`` is a default region pass; it folds each offloaded conv's
    batch norm (random statistics) into the conv's weight and bias, and explain says so
    for every conv region. Without it the conv regions end before their batch norms,
    which TVM computes (and the relu and shortcut after them): plain ``conv2d`` calls,
    same tolerance against PyTorch. Without ``pack_constants`` the folded weight is read
    unpacked."""
    from tirbyoc import weights

    assert weights.DEFAULT_PASSES == (weights.untranspose, weights.fold_batch_norm,
                                      weights.pack_constants)
    model = examples.resnet_torch((1, 1), (16, 32), 10)
    folded = ["conv2d_bias_relu", "max_pool2d", "conv2d_bias_relu",
              "conv2d_bias_residual_relu", "conv2d_bias_relu", "conv2d_bias_residual_relu",
              "conv2d_bias", "dense_bias"]
    report = _check(model, (1, 3, 40, 40), folded)
    convs = [r for r in report.offloaded if r.intrinsic.startswith("conv2d")]
    assert len(convs) == 6 and all(
        "batch norm folded into the weight and bias; weight packed at compile time"
        in r.detail for r in convs), str(report)

    # 1x1 / 3x3 convs of each shape: the stem, 16 -> 16, 16 -> 32 / 2, 32 -> 32, 16 -> 32
    # 1x1 / 2 (identical convs share one PrimFunc: five rows)
    report = _check(model, (1, 3, 40, 40), ["conv2d"] * 5 + ["max_pool2d", "dense_bias"],
                    passes=(weights.untranspose, weights.pack_constants))
    assert not any("batch norm folded" in r.detail for r in report.offloaded), str(report)
    assert report.schedules["tirbyoc_conv2d"] == "kernel tirbyoc_conv2d_f32_packed"

    report = _check(model, (1, 3, 40, 40), folded, passes=(weights.fold_batch_norm,))
    _no_tvm_convs(report, unpacked=6)


class _ConvNormAdd(torch.nn.Module):
    """conv (no bias), batch norm, a per-channel constant added, relu."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.conv = torch.nn.Conv2d(8, 16, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(16)
        self.shift = torch.nn.Parameter(torch.randn(1, 16, 1, 1), requires_grad=False)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)) + self.shift)


def test_constant_added_after_batch_norm_joins_the_folded_bias():
    """``bn(conv(x)) + c``: the folding pass adds ``c`` after the batch norm's shift (the
    order the model computes), one bias in the kernel call."""
    model = examples._randomize_batch_norms(_ConvNormAdd(), 5).eval()
    _check(model, (2, 8, 12, 10), ["conv2d_bias_relu"])


class _Conv(torch.nn.Module):
    def __init__(self, cin, cout, k, **kw):
        super().__init__()
        torch.manual_seed(1)
        self.conv = torch.nn.Conv2d(cin, cout, k, **kw)

    def forward(self, x):
        return torch.relu(self.conv(x))


@pytest.mark.parametrize("kw", [
    dict(k=3, stride=2, padding=1),
    dict(k=5, padding=(2, 1), dilation=(1, 2)),
    dict(k=(1, 3), stride=(2, 1)),
    dict(k=1),
    dict(k=1, stride=2, bias=False),
], ids=["3x3s2", "5x5-dilated", "1x3s21", "1x1", "1x1s2-nobias"])
def test_conv_shapes(kw):
    k = kw.pop("k")
    expected = "conv2d_bias_relu" if kw.get("bias", True) else "conv2d_relu"
    _check(_Conv(5, 7, k, **kw).eval(), (2, 5, 13, 11), [expected])


class _Conv1d(torch.nn.Module):
    """Two 1-D convs in a row, the second reading the first's output."""

    def __init__(self, cin, mid, cout, k, **kw):
        super().__init__()
        torch.manual_seed(4)
        self.a = torch.nn.Conv1d(cin, mid, k, **kw)
        self.b = torch.nn.Conv1d(mid, cout, 1, groups=kw.get("groups", 1))

    def forward(self, x):
        return self.b(torch.nn.functional.gelu(self.a(x)))


@pytest.mark.parametrize("cin, mid, cout, k, kw, width, expected", [
    (16, 32, 16, 1, dict(groups=4), 9, ["conv2d_bias", "conv2d_bias"]),           # SqueezeBERT
    (1, 24, 24, 10, dict(stride=5, bias=False), 97, ["conv2d", "conv2d_bias"]),   # wav2vec 2.0
    (8, 16, 8, 3, dict(padding=2, dilation=2, stride=2), 23, ["conv2d_bias", "conv2d_bias"]),
    (12, 12, 12, 5, dict(padding=2, groups=3), 16, ["conv2d_bias", "conv2d_bias"]),
], ids=["grouped-1x1", "stride-5-no-bias", "dilated-stride-2", "grouped-k5"])
def test_conv1d_is_a_conv2d_kernel_call(cin, mid, cout, k, kw, width, expected):
    """``R.nn.conv1d`` becomes a conv2d over rows one pixel high, so that the conv kernel
    takes it with its bias (TVM's own conv1d schedule was 60x slower than PyTorch):
    every conv a kernel call, numerics against PyTorch."""
    model = _Conv1d(cin, mid, cout, k, **kw).eval()
    report = _check(model, (2, cin, width), expected)
    _no_tvm_convs(report, unpacked=sum(n // g < 8 for n, g in (
        (mid, kw.get("groups", 1)), (cout, kw.get("groups", 1)))))
    assert not any("conv1d" in name for name in report.schedules), report.schedules


class _CausalConv1d(torch.nn.Module):
    """A causal conv (Mimi's, EnCodec's): the input zero-padded on the left by what
    the dilated kernel reaches back, after an ELU."""

    def __init__(self, c, k, dilation):
        super().__init__()
        torch.manual_seed(5)
        self.conv = torch.nn.Conv1d(c, c, k, dilation=dilation)
        self.reach = (k - 1) * dilation

    def forward(self, x):
        return self.conv(torch.nn.functional.pad(torch.nn.functional.elu(x), (self.reach, 0)))


@pytest.mark.parametrize("k, dilation", [(7, 1), (3, 3)])
def test_a_causal_pad_before_a_conv1d_is_its_padding(k, dilation):
    """A zero pad of the length before a conv1d joins the conv's own padding: no padded
    copy is made (none of the functions pads). Numerics against PyTorch."""
    report = _check(_CausalConv1d(16, k, dilation).eval(), (2, 16, 50), ["conv2d_bias"])
    assert not any("pad" in name for name in report.schedules), report.schedules


# kernel, stride, padding, output padding, bias, input size
TRANSPOSED = {"4x4_s4_bias": ((4, 4), (4, 4), 0, 0, True, (7, 5)),
              "2x3_s2x3": ((2, 3), (2, 3), 0, 0, False, (7, 5)),
              # overlapping windows (two or more taps a row), padding, output padding
              "3x3_s2_pad1_out1": ((3, 3), (2, 2), 1, 1, True, (7, 5)),
              "4x4_s2_pad1": ((4, 4), (2, 2), 1, 0, True, (6, 6)),  # DCGAN, U-Net decoders
              "5x3_s1x2_pad2x0": ((5, 3), (1, 2), (2, 0), 0, False, (4, 9)),
              # output padding past the taps' reach: zero rows at the end
              "3x2_s3_out2": ((3, 2), (3, 3), 0, (2, 1), True, (5, 4)),
              "7x7_s3_pad3": ((7, 7), (3, 3), 3, 2, True, (5, 6)),
              # gaps between windows (kernel below the stride)
              "2x2_s3": ((2, 2), (3, 3), 0, 0, True, (4, 5))}


@pytest.mark.parametrize("case", list(TRANSPOSED))
def test_a_transposed_conv_is_a_dense_and_an_overlap_add(case):
    """A transposed conv is a product per input pixel (a dense kernel call) and an
    overlap-add of its contributions (TVM's schedule of the transposed conv, a
    reduction over three loops, took 2 of DPT's 2.4 s and 58 of HiFi-GAN's 74 ms).
    Where the kernel is the stride the bias joins the dense; numerics against PyTorch
    for every kernel, stride, padding and output padding."""
    kernel, stride, pad, out_pad, bias, size = TRANSPOSED[case]
    torch.manual_seed(0)
    model = torch.nn.ConvTranspose2d(24, 10, kernel, stride=stride, padding=pad,
                                     output_padding=out_pad, bias=bias).eval()
    disjoint = kernel == stride and not pad
    report = _check(model, (2, 24, *size), ["dense_bias" if bias and disjoint else "dense"])
    assert not any("conv2d_transpose" in name for name in report.schedules), \
        report.schedules
    # the product is computed once, however many groups of taps read it
    x = torch.randn(2, 24, *size)
    assert _kernel_calls(tirbyoc.apply_tir_byoc(_import(model, x), fuse=True)) == 1


def _kernel_calls(mod) -> int:
    """How many calls of ``main`` run a PrimFunc that calls a kernel."""
    calls = []
    tvm_ffi.structural_walk(mod["main"], [(tvm.relax.Call, calls.append)])
    return sum(1 for c in calls if isinstance(c.args[0], tvm.ir.GlobalVar) and
               isinstance(mod[c.args[0]], tvm.tirx.PrimFunc) and
               tirbyoc.offloaded_kernels(mod[c.args[0]]))


# kernel, stride, padding, output padding, bias
TRANSPOSED_1D = {"hifigan_8_s4_pad2": (8, 4, 2, 0, True), "16_s8_pad4": (16, 8, 4, 0, False),
                 "3_s2_pad1_out1": (3, 2, 1, 1, True), "4_s4": (4, 4, 0, 0, True)}


@pytest.mark.parametrize("case", list(TRANSPOSED_1D))
def test_a_transposed_conv1d_is_a_dense_and_an_overlap_add(case):
    """``ConvTranspose1d`` (HiFi-GAN's upsampling: kernel twice the stride) the same
    way, as a conv one row high; numerics against PyTorch at two lengths."""
    kernel, stride, pad, out_pad, bias = TRANSPOSED_1D[case]
    torch.manual_seed(0)
    model = torch.nn.ConvTranspose1d(16, 6, kernel, stride=stride, padding=pad,
                                     output_padding=out_pad, bias=bias).eval()
    disjoint = kernel == stride and not pad
    for length in (9, 33):
        report = _check(model, (2, 16, length),
                        ["dense_bias" if bias and disjoint else "dense"])
        assert not any("transpose" in name and "conv" in name
                       for name in report.schedules), report.schedules


@pytest.mark.parametrize("size, bias", [((4, 8, 12), True), ((5, 9, 8), False)],
                         ids=["whole-patches-bias", "partial-patches"])
def test_a_conv3d_over_patches_is_a_dense(size, bias):
    """VideoMAE's tubelet embedding, ``Conv3d`` whose kernel is its stride, is a product
    per patch (TVM's conv3d took 582 of its 855 ms), its bias in the dense; rows past
    the last whole patch dropped as the conv drops them. Numerics against PyTorch."""
    torch.manual_seed(0)
    model = torch.nn.Conv3d(3, 20, (2, 4, 4), stride=(2, 4, 4), bias=bias).eval()
    report = _check(model, (2, 3, *size), ["dense_bias" if bias else "dense"])
    assert not any("conv3d" in name for name in report.schedules), report.schedules


def test_a_conv3d_with_overlapping_windows_stays_tvms():
    """Another conv3d is TVM's, and right."""
    torch.manual_seed(0)
    model = torch.nn.Conv3d(3, 4, 3, stride=2, padding=1).eval()
    report = _check(model, (1, 3, 4, 6, 6), [])
    assert any("conv3d" in name for name in report.schedules), report.schedules


def test_a_transposed_conv1d_of_any_length_is_one_build():
    """One build for every length (``torch.export.Dim``): the overlap-add's crop has a
    symbolic end (unchecked, the FuseOps of a strided_slice's bounds test in a shape
    failed: "Cannot find the FInferType attribute ... prim.if_then_else"). Numerics
    against PyTorch at three lengths."""
    torch.manual_seed(0)
    model = torch.nn.ConvTranspose1d(16, 6, 8, stride=4, padding=2).eval()
    x = torch.randn(2, 16, 30)
    with torch.no_grad():
        ep = torch.export.export(model, (x,), dynamic_shapes={
            "input": {2: torch.export.Dim("length", min=4, max=4096)}})
    mod = tirbyoc.from_exported_program(ep)
    assert [r.intrinsic for r in tirbyoc.explain(mod).offloaded] == ["dense"]
    ex = tirbyoc.compile(mod)
    for length in (5, 30, 301):
        xs = torch.randn(2, 16, length, generator=torch.Generator().manual_seed(length))
        got = tirbyoc.run(ex, xs.numpy())
        got = got[0] if isinstance(got, (list, tuple)) else got
        with torch.no_grad():
            ref = model(xs).numpy()
        assert got.shape == ref.shape
        assert float(np.abs(got - ref).max()) <= RTOL * float(np.abs(ref).max())


def test_grouped_and_dilated_transposed_convs_stay_tvms():
    """Grouped or dilated transposed convs are not a product per pixel of this form:
    TVM's, and right."""
    torch.manual_seed(0)
    for kw in (dict(groups=2), dict(dilation=2)):
        model = torch.nn.ConvTranspose2d(8, 6, 3, stride=2, **kw).eval()
        report = _check(model, (1, 8, 5, 4), [])
        assert any("conv2d_transpose" in name for name in report.schedules), \
            report.schedules


def test_conv1d_weight_as_input_and_other_layouts():
    """A conv1d weight passed in is read in place by the conv kernel; an NWC conv1d stays
    TVM's. Numerics against PyTorch for both."""
    from tvm import relax

    rng = np.random.default_rng(5)
    xs = rng.standard_normal((2, 6, 15)).astype(np.float32)
    ws = rng.standard_normal((10, 3, 3)).astype(np.float32)
    ref = torch.nn.functional.conv1d(torch.from_numpy(xs), torch.from_numpy(ws), padding=1,
                                     groups=2).numpy()
    for layout in ("NCW", "NWC"):
        bb = relax.BlockBuilder()
        shape = (2, 6, 15) if layout == "NCW" else (2, 15, 6)
        x = relax.Var("x", relax.TensorType(shape, "float32"))
        w = relax.Var("w", relax.TensorType((10, 3, 3), "float32"))
        with bb.function("main", [x, w]):
            with bb.dataflow():
                y = bb.emit_output(bb.emit(relax.op.nn.conv1d(
                    x, w, padding=1, groups=2, data_layout=layout, out_layout=layout)))
            bb.emit_func_output(y)
        mod = bb.get()
        offloaded = [r.intrinsic for r in tirbyoc.explain(mod).offloaded]
        assert offloaded == (["conv2d"] if layout == "NCW" else []), (layout, offloaded)
        vm = relax.VirtualMachine(tirbyoc.compile(mod), tvm.cpu())
        arg = xs if layout == "NCW" else xs.transpose(0, 2, 1).copy()
        got = vm["main"](tvm.runtime.tensor(arg), tvm.runtime.tensor(ws)).numpy()
        got = got if layout == "NCW" else got.transpose(0, 2, 1)
        assert float(np.abs(got - ref).max()) <= RTOL * float(np.abs(ref).max()), layout


@pytest.mark.parametrize("cin,cout,groups,kw", [
    (6, 6, 2, dict(padding=1)),
    (32, 64, 8, dict(stride=2, padding=1)),   # ResNeXt-like
    (4, 8, 4, dict(padding=1)),               # one input channel per group, two filters
], ids=["g2", "g8-s2", "depth-multiplier-2"])
def test_grouped_convs_are_one_kernel_call(cin, cout, groups, kw):
    """groups between 1 and the channel count (and a depthwise conv with two filters per
    channel): one kernel call that computes every group, right answer."""
    model = _Conv(cin, cout, 3, groups=groups, **kw).eval()
    report = _check(model, (2, cin, 11, 9), ["conv2d_bias_relu"])
    _no_tvm_convs(report, unpacked=int(cout // groups < 8))


class _GroupedBlock(torch.nn.Module):
    """A ResNeXt bottleneck: 1x1, grouped 3x3, 1x1 with batch norms, identity shortcut."""

    def __init__(self, c=64, width=32, groups=8):
        super().__init__()
        nn = torch.nn
        torch.manual_seed(2)
        self.a = nn.Sequential(nn.Conv2d(c, width, 1, bias=False), nn.BatchNorm2d(width),
                               nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(width, width, 3, padding=1, groups=groups,
                                         bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.c = nn.Sequential(nn.Conv2d(width, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return torch.relu(self.c(self.b(self.a(x))) + x)


def test_resnext_block():
    """Batch norms folded into the grouped conv too, the shortcut in the last call."""
    model = examples._randomize_batch_norms(_GroupedBlock(), 3).eval()
    report = _check(model, (1, 64, 14, 14),
                    ["conv2d_bias_relu", "conv2d_bias_relu", "conv2d_bias_residual_relu"])
    _no_tvm_convs(report, unpacked=1)  # the grouped 3x3: 4 channels per group


@pytest.mark.parametrize("blocking", ["1", "0"])
def test_depthwise_separable_blocks(monkeypatch, blocking):
    """The thirteen depthwise 3x3 convs (stride 1 and 2) are calls of the depthwise
    kernel, each with its batch norm folded and the ReLU6 in the kernel's chain; the stem
    and the thirteen 1x1 convs are offloaded products with the ReLU6 in the kernel call.
    Calls of equal shapes share one PrimFunc (TVM deduplicates them): at 48x48 the last
    spatial sizes repeat, 14 products in 10 PrimFuncs, 13 depthwise convs in 9.
    From the first 1x1 conv's output on (16 channels and more) the tensors between the
    calls are NCHW16c: 9 of the product PrimFuncs and 8 of the depthwise ones are the
    ``_layouts`` calls. The stem and the first depthwise conv (8 channels) stay NCHW, the
    first 1x1 conv reads NCHW (8 channels in), the last one writes NCHW for the pooling.
    ``TIRBYOC_CONV_BLOCKED=0``: none."""
    monkeypatch.setenv("TIRBYOC_CONV_BLOCKED", blocking)
    model = examples.mobilenet_torch(width=0.25, classes=10)
    report = _check(model, (1, 3, 48, 48), ["conv2d_bias_relu6"] * 10
                    + ["depthwise_conv2d_bias_relu6"] * 9 + ["dense_bias"])
    on = BLOCKING and blocking == "1"
    _no_tvm_convs(report, depthwise=9, blocked=9 * on, blocked_depthwise=8 * on)


class _BlockedChain(torch.nn.Module):
    """1x1, depthwise 3x3, 1x1 (each + batch norm + ReLU6), then a 1x1 conv whose input
    is also added to its output (a shortcut)."""

    def __init__(self, c=64):
        super().__init__()
        torch.manual_seed(5)

        def unit(conv):
            return torch.nn.Sequential(conv, torch.nn.BatchNorm2d(c), torch.nn.ReLU6())

        self.pw1 = unit(torch.nn.Conv2d(c, c, 1))
        self.dw = unit(torch.nn.Conv2d(c, c, 3, padding=1, groups=c))
        self.pw2 = unit(torch.nn.Conv2d(c, c, 1))
        self.pw3 = torch.nn.Conv2d(c, c, 1)
        for m in self.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
        self.eval()

    def forward(self, x):
        c = self.pw2(self.dw(self.pw1(x)))
        return self.pw3(c) + c


@pytest.mark.skipif(not BLOCKING, reason="NCHW16c through depthwise convs is planned where the "
                    "depthwise kernel has channels in lanes")
def test_blocked_layout_is_planned_between_calls_only():
    """The tensors NCHW16c are exactly those a blockable call writes and only blockable
    calls read as their input: pw1's output (read by the depthwise conv) and the depthwise
    conv's (read by pw2). pw2's output is read by pw3 and by the shortcut add (pw3's
    residual): it stays NCHW, as do the model's input and output. So pw1 writes blocks,
    the depthwise conv reads and writes them, pw2 reads them; pw3 is the plain packed
    call. Numerics against PyTorch as every test here (and the same within 1e-5 of
    max|y| as the all-NCHW compile)."""
    model = _BlockedChain()
    report = _check(model, (1, 64, 10, 12), ["conv2d_bias_relu6"] * 2
                    + ["depthwise_conv2d_bias_relu6", "conv2d_bias_residual"])
    _no_tvm_convs(report, depthwise=1, blocked=2, blocked_depthwise=1)
    notes = sorted(r.detail for r in report.offloaded if "NCHW16c" in (r.detail or ""))
    assert len(notes) == 3 and sum("NCHW16c input and output" in n for n in notes) == 1, \
        notes


class _ConvChain(torch.nn.Module):
    """A 3x3 conv, then two 1x1 convs (each + batch norm + ReLU), 64 channels."""

    def __init__(self, c=64):
        super().__init__()
        torch.manual_seed(7)

        def unit(conv):
            return [conv, torch.nn.BatchNorm2d(c), torch.nn.ReLU()]

        self.body = torch.nn.Sequential(
            *unit(torch.nn.Conv2d(c, c, 3, padding=1)), *unit(torch.nn.Conv2d(c, c, 1)),
            *unit(torch.nn.Conv2d(c, c, 1)))
        examples._randomize_batch_norms(self, 3)
        self.eval()

    def forward(self, x):
        return self.body(x)


@pytest.mark.skipif(not CONV_BLOCKING, reason="NCHW16c is planned where the conv kernel "
                                              "has its direct path (AVX2, AVX-512)")
def test_blocked_layout_between_convs_without_depthwise():
    """On every ISA with the conv kernel's direct path (AVX2 included), the tensors between
    a 3x3 conv and a 1x1 conv, and between two 1x1 convs, are NCHW16c: the 3x3 conv
    writes blocks, the first 1x1 conv reads and writes them, the last reads them and
    writes the model's NCHW output. Numerics against PyTorch."""
    report = _check(_ConvChain(), (1, 64, 14, 13), ["conv2d_bias_relu"] * 3)
    _no_tvm_convs(report, blocked=3)
    tags = sorted((re.findall(r"NCHW16c (input and output|input|output)", r.detail or "")
                   or [None])[0] for r in report.offloaded)
    assert tags == ["input", "input and output", "output"], tags


class _Bottlenecks(torch.nn.Module):
    """Two ResNet bottlenecks (1x1, 3x3, 1x1 convs, each + batch norm; the shortcut added
    before the last relu), the first with a 1x1 projection from 32 to 128 channels, then
    a 1x1 conv to 16 channels."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(8)
        nn = torch.nn

        def unit(conv, c, relu=True):
            return [conv, nn.BatchNorm2d(c)] + ([nn.ReLU()] if relu else [])

        def body(c):
            return nn.Sequential(*unit(nn.Conv2d(c, 32, 1), 32),
                                 *unit(nn.Conv2d(32, 32, 3, padding=1), 32),
                                 *unit(nn.Conv2d(32, 128, 1), 128, relu=False))

        self.a, self.b = body(32), body(128)
        self.projection = nn.Sequential(*unit(nn.Conv2d(32, 128, 1), 128, relu=False))
        self.head = nn.Conv2d(128, 16, 1)
        examples._randomize_batch_norms(self, 4)
        self.eval()

    def forward(self, x):
        x = torch.relu(self.a(x) + self.projection(x))
        return self.head(torch.relu(self.b(x) + x))


@pytest.mark.skipif(not CONV_BLOCKING, reason="NCHW16c is planned where the conv kernel "
                                              "has its direct path (AVX2, AVX-512)")
@pytest.mark.parametrize("size", [7, 16])
def test_residual_stream_is_blocked_where_the_direct_path_suits(size):
    """The shortcuts between bottlenecks stay NCHW16c (the convs adding them write blocks
    and read their residual in blocks; the projection writes them) where the kernel takes
    the direct path for those convs anyway: at 7 x 7 (49 pixels, 128 output channels),
    not at 16 x 16 (256 pixels). Numerics against PyTorch either way."""
    # (one function per distinct call: the two blocks' 3x3 convs and their last 1x1 convs
    # are the same)
    report = _check(_Bottlenecks(), (1, 32, size, size), [
        "conv2d_bias_relu", "conv2d_bias_relu", "conv2d_bias", "conv2d_bias_residual_relu",
        "conv2d_bias_relu", "conv2d_bias"])
    tags = sorted((r.intrinsic, (re.findall(r"NCHW16c (input and output|input|output)",
                                            r.detail or "") or ["-"])[0])
                  for r in report.offloaded)
    want = [("conv2d_bias", "input"), ("conv2d_bias", "output"),  # the head, the projection
            # the first 1x1 of block a (from the model's input), of block b (from a's
            # blocked output)
            ("conv2d_bias_relu", "-"), ("conv2d_bias_relu", "input"),
            ("conv2d_bias_relu", "output"),  # the 3x3
            ("conv2d_bias_residual_relu", "input and output")]
    assert tags == (want if size == 7 else sorted((i, "-") for i, _ in want)), tags


class _NarrowChain(torch.nn.Module):
    """A 3x3/2 stem of 3 -> 32 channels, a depthwise 3x3, a 1x1 conv of 32 -> 32 channels
    (each + batch norm + ReLU6), then a 3x3 conv in two groups, or a depthwise one
    (``tail``)."""

    def __init__(self, tail):
        super().__init__()
        torch.manual_seed(6)

        def unit(conv):
            return [conv, torch.nn.BatchNorm2d(32), torch.nn.ReLU6()]

        self.body = torch.nn.Sequential(
            *unit(torch.nn.Conv2d(3, 32, 3, 2, 1)),
            *unit(torch.nn.Conv2d(32, 32, 3, padding=1, groups=32)),
            *unit(torch.nn.Conv2d(32, 32, 1)),
            torch.nn.Conv2d(32, 32, 3, padding=1, groups=32 if tail == "depthwise" else 2))
        examples._randomize_batch_norms(self, 2)
        self.eval()

    def forward(self, x):
        return self.body(x)


@pytest.mark.skipif(not BLOCKING, reason="NCHW16c through depthwise convs is planned where the "
                    "depthwise kernel has channels in lanes")
@pytest.mark.parametrize("tail,notes", [
    ("grouped", [None, None, "output", "input"]),
    ("depthwise", ["output", "input and output", "input and output", "input"]),
])
def test_narrow_1x1_conv_reads_blocks_only_into_blocks(tail, notes):
    """A 1x1 conv of 32 input channels reads an NCHW16c x only when its own output is
    NCHW16c too (each tile then stores into the blocks; through the scratch it would be
    slower than NCHW). The stem (3 channels in: it cannot read blocks, but writes them)
    and the depthwise conv may always. So with a grouped 3x3 conv after the 1x1 conv (it
    reads NCHW only), the 1x1 conv's output is NCHW, hence its input, the depthwise
    conv's output, too; with a depthwise conv after it, every tensor between the calls
    is blocked. Numerics against PyTorch either way."""
    report = _check(_NarrowChain(tail), (1, 3, 20, 18), [
        "conv2d_bias_relu6", "depthwise_conv2d_bias_relu6", "conv2d_bias_relu6",
        "depthwise_conv2d_bias" if tail == "depthwise" else "conv2d_bias"])
    tags = [(re.findall(r"NCHW16c (input and output|input|output)", r.detail or "")
             or [None])[0] for r in report.offloaded]
    assert sorted(tags, key=str) == sorted(notes, key=str), \
        [r.detail for r in report.offloaded]


class _Depthwise(torch.nn.Module):
    """A depthwise conv, a batch norm, the input added back (with stride 1), a relu."""

    def __init__(self, c, k, shortcut, **kw):
        super().__init__()
        torch.manual_seed(3)
        self.conv = torch.nn.Conv2d(c, c, k, groups=c, **kw)
        self.bn = torch.nn.BatchNorm2d(c)
        self.shortcut = shortcut

    def forward(self, x):
        y = self.bn(self.conv(x))
        return torch.relu(y + x if self.shortcut else y)


@pytest.mark.parametrize("k,shortcut,kw,expected", [
    (3, True, dict(padding=1), "depthwise_conv2d_bias_residual_relu"),
    (3, False, dict(stride=2, padding=1, bias=False), "depthwise_conv2d_bias_relu"),
    (5, True, dict(padding=4, dilation=2), "depthwise_conv2d_bias_residual_relu"),
    ((3, 5), False, dict(stride=(2, 1), padding=(0, 2)), "depthwise_conv2d_bias_relu"),
], ids=["3x3-shortcut", "3x3s2-nobias", "5x5-dilated-shortcut", "3x5-s21"])
def test_depthwise_convs(k, shortcut, kw, expected):
    """Depthwise convs of other shapes: the batch norm folded, the shortcut and the relu
    in the depthwise kernel's chain, one call each; numerics against PyTorch."""
    model = examples._randomize_batch_norms(_Depthwise(20, k, shortcut, **kw), 4).eval()
    report = _check(model, (2, 20, 13, 11), [expected])
    _no_tvm_convs(report, depthwise=1)


@pytest.mark.parametrize("groups,depthwise", [(1, False), (2, False), (4, True)],
                         ids=["dense", "grouped", "depthwise"])
def test_weight_as_input(groups, depthwise):
    """A weight passed in (not a compile-time constant) is read in place by the kernel
    call (the depthwise kernel's for a depthwise conv), with a constant bias and a relu
    fused. Numerics against PyTorch."""
    from tvm import relax

    c, oc = 4, 4 if depthwise else 6
    rng = np.random.default_rng(groups)
    bias = rng.standard_normal(oc).astype(np.float32)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, c, 8, 7), "float32"))
    w = relax.Var("w", relax.TensorType((oc, c // groups, 3, 3), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, padding=1, groups=groups))
            y = bb.emit(relax.op.add(y, relax.const(bias.reshape(1, oc, 1, 1))))
            y = bb.emit_output(bb.emit(relax.op.nn.relu(y)))
        bb.emit_func_output(y)
    mod = bb.get()
    offloaded = [r.intrinsic for r in tirbyoc.explain(mod).offloaded]
    assert offloaded == (["depthwise_conv2d_bias_relu"] if depthwise
                         else ["conv2d_bias_relu"]), offloaded
    xs = rng.standard_normal((2, c, 8, 7)).astype(np.float32)
    ws = rng.standard_normal((oc, c // groups, 3, 3)).astype(np.float32)
    vm = relax.VirtualMachine(tirbyoc.compile(mod), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(xs), tvm.runtime.tensor(ws)).numpy()
    ref = torch.relu(torch.nn.functional.conv2d(torch.from_numpy(xs), torch.from_numpy(ws),
                                                torch.from_numpy(bias), padding=1,
                                                groups=groups)).numpy()
    assert float(np.abs(got - ref).max()) <= RTOL * float(np.abs(ref).max())


# kernel layout -> axes taking an OIHW weight there
_FROM_OIHW = {"OIHW": (0, 1, 2, 3), "OHWI": (0, 2, 3, 1), "HWIO": (2, 3, 1, 0)}


def _nhwc_module(x_shape, w_oihw, kernel_layout, groups, chain, stride=1, padding=1):
    """conv2d in NHWC (the weight a constant in ``kernel_layout``) followed by ``chain``:
    "bias" (a [OC] constant), "bn" (batch norm over axis 3, constant statistics),
    "residual" (the second argument, NHWC), "relu" or "relu6"."""
    from tvm import relax

    rng = np.random.default_rng(3)
    oc = w_oihw.shape[0]
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    n, h, w, _ = x_shape
    oh = (h + 2 * padding - w_oihw.shape[2]) // stride + 1
    ow = (w + 2 * padding - w_oihw.shape[3]) // stride + 1
    r = relax.Var("r", relax.TensorType((n, oh, ow, oc), "float32"))
    params = {}
    with bb.function("main", [x, r]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(
                x, relax.const(np.ascontiguousarray(np.transpose(w_oihw,
                                                                 _FROM_OIHW[kernel_layout]))),
                strides=stride, padding=padding, groups=groups, data_layout="NHWC",
                kernel_layout=kernel_layout))
            for op in chain:
                if op == "bias":
                    params["bias"] = rng.standard_normal(oc).astype(np.float32)
                    y = bb.emit(relax.op.add(y, relax.const(params["bias"])))
                elif op == "bn":
                    stats = [rng.uniform(0.5, 1.5, oc), rng.standard_normal(oc),
                             rng.standard_normal(oc), rng.uniform(0.5, 1.5, oc)]
                    params["bn"] = [s.astype(np.float32) for s in stats]
                    t = bb.emit(relax.op.nn.batch_norm(
                        y, *[relax.const(s) for s in params["bn"]], axis=3, epsilon=1e-5,
                        training=False))
                    y = bb.emit(relax.TupleGetItem(t, 0))
                elif op == "residual":
                    y = bb.emit(relax.op.add(y, r))
                elif op == "relu":
                    y = bb.emit(relax.op.nn.relu(y))
                else:
                    y = bb.emit(relax.op.clip(y, 0.0, 6.0))
            y = bb.emit_output(y)
        bb.emit_func_output(y)
    return bb.get(), params


@pytest.mark.parametrize("kernel_layout", ["OHWI", "HWIO", "OIHW"])
@pytest.mark.parametrize("chain,groups,stride", [
    (("bias", "relu"), 1, 1), (("bn", "residual", "relu"), 1, 1), (("bias", "relu6"), 1, 2),
    (("bias", "residual"), 2, 1), (("bn", "relu6"), 8, 1), (("relu",), 8, 2)],
    ids=["bias-relu", "bn-residual-relu", "s2-relu6", "grouped", "depthwise-bn",
         "depthwise-s2"])
def test_nhwc_convs_are_kernel_calls_between_transposes(kernel_layout, chain, groups, stride):
    """An NHWC conv with a constant weight in any of the three kernel layouts is one call of
    the NCHW kernel (the depthwise kernel's for groups = channels) with its bias, batch norm
    over axis 3, shortcut and activation fused, between TVM's transposes; numerics against
    PyTorch on the same tensors in NCHW."""
    from tvm import relax

    c, oc = 8, 8 if groups == 8 else 12
    rng = np.random.default_rng(groups + stride)
    w = rng.standard_normal((oc, c // groups, 3, 3)).astype(np.float32)
    mod, params = _nhwc_module((2, 9, 10, c), w, kernel_layout, groups, chain, stride)
    report = tirbyoc.explain(mod)
    fused = [{"bn": "bias"}.get(op, op) for op in chain]
    kind = "depthwise_conv2d" if groups == c else "conv2d"
    assert [r.intrinsic for r in report.offloaded] == ["_".join([kind] + fused)], str(report)
    # fewer than 8 output channels per group: not packed (see _no_tvm_convs)
    _no_tvm_convs(report, unpacked=int(groups != c and oc // groups < 8),
                  depthwise=int(groups == c))

    xs = rng.standard_normal((2, 9, 10, c)).astype(np.float32)
    oh, ow = (9 - 1) // stride + 1, (10 - 1) // stride + 1
    rs = rng.standard_normal((2, oh, ow, oc)).astype(np.float32)
    vm = relax.VirtualMachine(tirbyoc.compile(mod), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(xs), tvm.runtime.tensor(rs)).numpy()

    t = torch.nn.functional.conv2d(torch.from_numpy(xs).permute(0, 3, 1, 2),
                                   torch.from_numpy(w), stride=stride, padding=1,
                                   groups=groups).double()
    for op in chain:
        if op == "bias":
            t = t + torch.from_numpy(params["bias"]).double()[:, None, None]
        elif op == "bn":
            g, b, m, v = (torch.from_numpy(s).double()[:, None, None] for s in params["bn"])
            t = (t - m) / torch.sqrt(v + 1e-5) * g + b
        elif op == "residual":
            t = t + torch.from_numpy(rs).permute(0, 3, 1, 2).double()
        else:
            t = torch.relu(t) if op == "relu" else torch.clamp(t, 0, 6)
    ref = t.permute(0, 2, 3, 1).numpy()
    assert got.shape == ref.shape
    assert float(np.abs(got - ref).max()) <= RTOL * float(np.abs(ref).max())


def test_nhwc_conv_with_a_weight_passed_in_stays_tvms():
    """An NHWC conv whose weight is an argument would need a transpose of it per call: it
    stays TVM's conv2d (scheduled by the fallback rules), and still answers right."""
    from tvm import relax

    rng = np.random.default_rng(5)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 6, 6, 4), "float32"))
    w = relax.Var("w", relax.TensorType((5, 3, 3, 4), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit_output(bb.emit(relax.op.nn.conv2d(
                x, w, padding=1, data_layout="NHWC", kernel_layout="OHWI")))
        bb.emit_func_output(y)
    mod = bb.get()
    assert tirbyoc.explain(mod).offloaded == []
    xs = rng.standard_normal((1, 6, 6, 4)).astype(np.float32)
    ws = rng.standard_normal((5, 3, 3, 4)).astype(np.float32)
    vm = relax.VirtualMachine(tirbyoc.compile(mod), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(xs), tvm.runtime.tensor(ws)).numpy()
    ref = torch.nn.functional.conv2d(torch.from_numpy(xs).permute(0, 3, 1, 2),
                                     torch.from_numpy(ws).permute(0, 3, 1, 2),
                                     padding=1).permute(0, 2, 3, 1).numpy()
    assert float(np.abs(got - ref).max()) <= RTOL * float(np.abs(ref).max())


class _PaddedConvs(torch.nn.Module):
    """TF-style "same" padding as exported from HuggingFace's MobileNetV2/EfficientNet:
    an explicit asymmetric zero pad before a stride-2 conv, a symmetric one before a
    depthwise conv, a zero-width one before a 1x1 conv, and a pad read by a max pool
    too (which must keep it: a zero pad is not a max pool's padding)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.c1 = torch.nn.Conv2d(3, 16, 3, stride=2)
        self.dw = torch.nn.Conv2d(16, 16, 3, groups=16)
        self.pw = torch.nn.Conv2d(16, 24, 1)

    def forward(self, x):
        x = torch.relu(self.c1(torch.nn.functional.pad(x, (0, 1, 0, 1))))
        p = torch.nn.functional.pad(x, (1, 1, 1, 1))
        x = torch.relu(self.dw(p)) + torch.nn.functional.max_pool2d(p, 3, 1)
        return self.pw(torch.nn.functional.pad(x, (0, 0, 0, 0)))


def test_zero_pads_fold_into_the_convolutions_they_feed():
    from tirbyoc import conv

    x = torch.randn(1, 3, 33, 33)
    mod = _import(_PaddedConvs().eval(), x)
    pads = lambda m: m["main"].script().count("R.nn.pad(")  # noqa: E731
    folded = conv.fold_pads(mod)
    assert pads(mod) == 3 and pads(folded) == 1  # the max pool's stays
    text = folded["main"].script()
    assert "padding=[0, 0, 1, 1]" in text and "padding=[1, 1, 1, 1]" in text
    report = _check(_PaddedConvs().eval(), (1, 3, 33, 33),
                    ["conv2d_bias_relu", "depthwise_conv2d_bias_relu", "conv2d_bias",
                     "max_pool2d"])
    assert [n for n in report.schedules if n.startswith("pad")] == ["pad"]  # the pool's


def test_zero_pad_folds_into_a_conv_without_out_dtype():
    """A conv2d written without ``out_dtype`` (its attribute unset) after a zero pad: the
    folded conv is built with the input's dtype (building it from the unset attribute's
    text failed the whole compile), one kernel call, numerics against PyTorch."""
    from tvm import relax

    rng = np.random.default_rng(6)
    xs = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    ws = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 8, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            p = bb.emit(relax.op.nn.pad(x, [0, 0, 0, 0, 1, 2, 2, 1]))
            y = bb.emit_output(bb.emit(relax.op.nn.conv2d(p, relax.const(ws))))
        bb.emit_func_output(y)
    mod = bb.get()
    assert [r.intrinsic for r in tirbyoc.explain(mod).offloaded] == ["conv2d"]
    got = relax.VirtualMachine(tirbyoc.compile(mod), tvm.cpu())["main"](
        tvm.runtime.tensor(xs)).numpy()
    ref = torch.nn.functional.conv2d(torch.nn.functional.pad(torch.from_numpy(xs),
                                                             (2, 1, 1, 2)),
                                     torch.from_numpy(ws)).numpy()
    assert got.shape == ref.shape == (1, 8, 9, 9)
    assert float(np.abs(got - ref).max()) <= RTOL * float(np.abs(ref).max())


def _stem_and_depthwise(k):
    """A stride-2 3x3 conv 3 -> 32 and a k x k depthwise conv of 32 channels, each with a
    batch norm (the activation tests' first two layers)."""
    return (torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, 2, 1), torch.nn.BatchNorm2d(32)),
            torch.nn.Sequential(torch.nn.Conv2d(32, 32, k, padding=k // 2, groups=32),
                                torch.nn.BatchNorm2d(32)))


class _SiluConvs(torch.nn.Module):
    """A conv, a depthwise conv and a 1x1 conv, each + batch norm and an activation:
    ``nn.SiLU``, SiLU written out as ``v * sigmoid(v)`` (HF EfficientNet's form), and a
    sigmoid; then (``shared``) a conv whose pre-activation output is also read by the
    sum after its SiLU, which must stay out of the kernel call."""

    def __init__(self, shared=False):
        super().__init__()
        torch.manual_seed(8)
        self.c1, self.dw = _stem_and_depthwise(3)
        self.pw = torch.nn.Conv2d(32, 24, 1)
        self.shared = torch.nn.Conv2d(24, 24, 1) if shared else None
        examples._randomize_batch_norms(self, 4)
        self.eval()

    def forward(self, x):
        x = torch.nn.functional.silu(self.c1(x))
        v = self.dw(x)
        x = torch.sigmoid(self.pw(v * torch.sigmoid(v)))
        if self.shared is not None:
            v = self.shared(x)
            x = v * torch.sigmoid(v) + v
        return x


def test_silu_and_sigmoid_join_the_conv_calls():
    """SiLU in either form and a sigmoid after a conv (+ batch norm) are the kernel call's
    last epilogue step (EfficientNet ran each as its own pass); numerics against PyTorch.
    A conv whose output is read by more than SiLU's sigmoid and product keeps the SiLU
    out of its call (the sum reads the conv's own output)."""
    _check(_SiluConvs(), (1, 3, 20, 22),
           ["conv2d_bias_silu", "depthwise_conv2d_bias_silu", "conv2d_bias_sigmoid"])
    _check(_SiluConvs(shared=True), (1, 3, 20, 22),
           ["conv2d_bias_silu", "depthwise_conv2d_bias_silu", "conv2d_bias_sigmoid",
            "conv2d_bias"])



@pytest.mark.parametrize("chosen", [i for i in ("avx2", "avx512") if i in kernels.available_isas()])
def test_silu_convs_write_blocks_where_the_isa_gains(chosen):
    """A stem conv + SiLU feeding a depthwise conv + SiLU (32 channels): on AVX-512
    (``kernels.BLOCKED_SIGMOID_ISAS``) the stem writes NCHW16c and the depthwise conv reads
    it (both through their ``_layouts`` calls), elsewhere both stay NCHW; PyTorch's
    numerics either way."""
    saved = kernels.isa()
    kernels.set_isa(chosen)
    try:
        report = _check(_SiluConvs(), (1, 3, 40, 44),
                        ["conv2d_bias_silu", "depthwise_conv2d_bias_silu",
                         "conv2d_bias_sigmoid"])
    finally:
        kernels.set_isa(saved)
    blocked = chosen == "avx512"  # measured: kernels.BLOCKED_SIGMOID_ISAS
    assert kernels.BLOCKED_SIGMOID_ISAS == ("avx512",)
    _no_tvm_convs(report, depthwise=1, blocked=int(blocked), blocked_depthwise=int(blocked))


class _HardConvs(torch.nn.Module):
    """MobileNetV3's activations: a conv + batch norm, a depthwise conv + batch norm
    + hardswish, a 1x1 conv whose hardsigmoid gates the features (a squeeze-excitation
    gate's form), scaled so that its inputs reach past +-3; then ``tail``: None (a conv +
    hardswish), "shared" (a conv whose pre-activation output the sum after its hardswish
    also reads), "near" (a conv and one of ``NEAR_MISSES`` after it, for each of them in
    turn)."""

    # each a hardswish or hardsigmoid but for one operation or constant
    NEAR_MISSES = (lambda v: torch.clamp(v + 3, 0, 6) / 5,
                   lambda v: v * torch.clamp(v + 2.5, 0, 6) / 6,
                   lambda v: v * torch.clamp(v + 3, 0.5, 6) / 6,
                   lambda v: (v - torch.clamp(v + 3, 0, 6)) / 6,
                   lambda v: v - torch.clamp(v + 3, 0, 6) / 6,
                   lambda v: v * torch.clamp(v + 3, 0, 6) - 6)

    def __init__(self, tail=None):
        super().__init__()
        torch.manual_seed(9)
        self.c1, self.dw = _stem_and_depthwise(5)
        self.pw = torch.nn.Conv2d(32, 32, 1)
        self.tail = tail
        self.c2 = torch.nn.ModuleList(torch.nn.Conv2d(32, 32, 1) for _ in range(
            len(self.NEAR_MISSES) if tail == "near" else 1))
        with torch.no_grad():
            for m in (self.pw, self.c2[0]):
                m.weight.mul_(4.0)
        examples._randomize_batch_norms(self, 4)
        self.eval()

    def forward(self, x):
        x = torch.nn.functional.hardswish(self.dw(self.c1(x)))
        x = torch.nn.functional.hardsigmoid(self.pw(x)) * x
        if self.tail == "near":
            for f, c in zip(self.NEAR_MISSES, self.c2):
                x = f(c(x))
            return x
        v = self.c2[0](x)
        if self.tail == "shared":
            return torch.nn.functional.hardswish(v) + v
        return torch.nn.functional.hardswish(v)


@pytest.mark.parametrize("tail, last, tvms", [
    (None, "conv2d_bias_hardswish", 1), ("shared", "conv2d_bias", 2),
    ("near", "conv2d_bias", 1 + len(_HardConvs.NEAR_MISSES))])
def test_hardswish_and_hardsigmoid_join_the_conv_calls(tail, last, tvms):
    """PyTorch's hardswish and hardsigmoid (``v * clip(v + 3, 0, 6) / 6`` and
    ``clip(v + 3, 0, 6) / 6`` after ``torch.export``, the clip as two) after a depthwise
    conv and 1x1 convs are the call's last epilogue step; a conv whose own output is read
    by more than the activation, and near misses, keep them out (and stay right): ``tvms``
    PrimFuncs stay TVM's, the gate's multiply and one for each of those. Numerics against
    PyTorch. (Calls of one shape share one PrimFunc.)"""
    report = _check(_HardConvs(tail), (2, 3, 24, 20),
                    ["conv2d_bias", "depthwise_conv2d_bias_hardswish",
                     "conv2d_bias_hardsigmoid", last])
    assert sum(not how.startswith("kernel") for how in report.schedules.values()) == tvms


def test_onnx_hardswish_and_hardsigmoid_join_the_conv_calls():
    """The same from an ONNX file: ``HardSwish`` (``v * (clip(v + 3, 0, 6) / 6)`` from
    TVM's frontend) and ``HardSigmoid`` (``clip(v * a + 0.5, 0, 1)``, ``a`` 1/6 in
    float32); 2 ulp of rounding apart from the kernels' order of operations, well inside
    the tolerance."""
    from .test_fixups import _onnx

    model = _HardConvs()
    x = torch.randn(2, 3, 24, 20, generator=torch.Generator().manual_seed(1))
    mod = _onnx(model, x, opset=14)  # the ONNX graph: Conv, HardSwish, HardSigmoid, Mul
    report = tirbyoc.explain(mod)
    assert sorted(r.intrinsic for r in report.offloaded) == sorted(
        ["conv2d_bias", "depthwise_conv2d_bias_hardswish", "conv2d_bias_hardsigmoid",
         "conv2d_bias_hardswish"]), str(report)
    with torch.no_grad():
        ref = model(x).numpy()
    got = tirbyoc.run(tirbyoc.compile(mod), x.numpy())
    assert float(np.abs(got - ref).max()) <= RTOL * float(np.abs(ref).max())


class _SqueezeExcite(torch.nn.Module):
    """EfficientNet's block: a depthwise conv + batch norm + SiLU, its squeeze-and-
    excitation (the mean over the image, two 1x1 convs, a sigmoid) multiplying the
    features per channel, then the projection conv (``kernel`` x ``kernel``, ``groups``)
    + batch norm (``bn``; else without a bias), plus ``read``: the scaled features once more (so the
    product must stay)."""

    def __init__(self, c, out, kernel=1, groups=1, bn=True, read=False):
        super().__init__()
        torch.manual_seed(c + out + kernel)
        self.dw = torch.nn.Sequential(torch.nn.Conv2d(c, c, 3, padding=1, groups=c),
                                      torch.nn.BatchNorm2d(c), torch.nn.SiLU())
        self.reduce, self.expand = torch.nn.Conv2d(c, 8, 1), torch.nn.Conv2d(8, c, 1)
        self.proj = torch.nn.Conv2d(c, out, kernel, padding=kernel // 2, groups=groups,
                                    bias=False)
        self.bn = torch.nn.BatchNorm2d(out) if bn else torch.nn.Identity()
        self.read = read
        examples._randomize_batch_norms(self, 3)
        self.eval()

    def forward(self, x):
        y = self.dw(x)
        s = torch.sigmoid(self.expand(torch.nn.functional.silu(
            self.reduce(y.mean((2, 3), keepdim=True)))))
        ys = y * s
        z = self.bn(self.proj(ys))
        return z + ys.mean() if self.read else z


_SE_NOTE = "squeeze-and-excitation"


@pytest.mark.parametrize("c, out, kernel, groups, bn, shape, scaled", [
    (32, 16, 1, 1, True, (1, 32, 24, 20), True),     # EfficientNet's: bias from the norm
    (32, 16, 1, 1, False, (1, 32, 9, 9), True),      # no bias row in the packed weight
    (48, 32, 3, 2, True, (1, 48, 14, 12), True),     # taps and groups: rows per channel
    (32, 16, 1, 1, True, (2, 32, 24, 20), False),    # two images: a scale per image
    (64, 128, 1, 1, True, (1, 64, 7, 7), False),     # the weight is larger than x
])
def test_squeeze_excitation_scales_the_packed_weight(c, out, kernel, groups, bn, shape,
                                                     scaled):
    """``conv(x * s, W) = conv(x, W * s)`` for one image and a factor per input channel:
    the projection conv after a squeeze-and-excitation reads the features unscaled and
    scales its packed weight instead (the bias row not), where that weight is the smaller
    tensor; else the product stays TVM's. Numerics against PyTorch either way."""
    expected = ["depthwise_conv2d_bias_silu", "conv2d_bias_silu", "conv2d_bias_sigmoid",
                "conv2d_bias" if bn else "conv2d"]
    report = _check(_SqueezeExcite(c, out, kernel, groups, bn), shape, expected)
    assert str(report).count(_SE_NOTE) == (1 if scaled else 0), str(report)
    tvm_funcs = sorted(name for name, how in report.schedules.items()
                       if not how.startswith("kernel"))
    if scaled:  # the mean, and the weight's product with the scale
        assert len(tvm_funcs) == 2 and tvm_funcs[0].startswith("fused_") and \
            tvm_funcs[0].endswith("multiply") and tvm_funcs[1] == "mean", tvm_funcs
    else:
        assert tvm_funcs == ["mean", "multiply"], tvm_funcs


def test_squeeze_excitation_product_read_elsewhere_stays():
    """Features scaled by the squeeze-and-excitation that something else reads too: the
    product is computed once, as the graph says, and the conv reads it."""
    report = _check(_SqueezeExcite(32, 16, read=True), (1, 32, 24, 20),
                    ["depthwise_conv2d_bias_silu", "conv2d_bias_silu",
                     "conv2d_bias_sigmoid", "conv2d_bias"])
    assert _SE_NOTE not in str(report)


class _StandardizedConvs(torch.nn.Module):
    """Weight-standardized convolutions (BiT's ``WeightStandardizedConv2d``): the weight is
    normalized per output channel on every call, as HuggingFace writes it (a batch norm
    in training mode over the weight's rows, exported as an instance norm) and written
    out with mean and variance."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.b = torch.nn.Conv2d(16, 32, 3, padding=1)

    def forward(self, x):
        wa = torch.nn.functional.batch_norm(self.a.weight.reshape(1, 16, -1), None, None,
                                            training=True, momentum=0.0, eps=1e-6)
        x = torch.relu(torch.nn.functional.conv2d(x, wa.reshape_as(self.a.weight), padding=1))
        w = self.b.weight
        wb = (w - w.mean(dim=(1, 2, 3), keepdim=True)) / torch.sqrt(
            w.var(dim=(1, 2, 3), keepdim=True, unbiased=False) + 1e-5)
        return torch.nn.functional.conv2d(x, wb, self.b.bias, padding=1)


def test_a_weight_computed_from_constants_is_folded_and_packed():
    """A conv weight computed from constants only is evaluated at compile time and packed
    like a stored one (BiT's convs were calls with the weight passed in, packed on every
    call: 0.93x -> 1.17x ONNX Runtime); numerics against PyTorch."""
    model = _StandardizedConvs().eval()
    _check(model, (1, 3, 12, 10), ["conv2d_relu", "conv2d_bias"])
    x = torch.randn(1, 3, 12, 10)
    report = str(tirbyoc.explain(_import(model, x)))
    assert report.count("weight packed at compile time") == 2, report
