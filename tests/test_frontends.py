"""The seed MLP imported from PyTorch (torch.export) and from ONNX, offloaded end to end.

Tolerance: within rtol 1e-4 of the framework's own result (absolute floor 1e-4 *
max|reference|).
"""

import numpy as np
import pytest

import tirbyoc
from tirbyoc import examples

import torch  # noqa: E402  (the test extra installs it)
import onnx  # noqa: E402,F401

RTOL = 1e-4


def assert_close(got, ref):
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=RTOL * float(np.abs(ref).max()))


def _first(out):
    return out[0] if isinstance(out, list) else out


@pytest.mark.parametrize("dynamic_batch", [False, True], ids=["static", "dynamic-batch"])
def test_seed_mlp_from_pytorch(dynamic_batch):
    mod, model = examples.mlp_torch(64, dynamic_batch=dynamic_batch)
    report = tirbyoc.explain(mod)
    assert sorted(r.intrinsic for r in report.offloaded) == ["dense_bias", "dense_bias_relu"]
    assert not report.rejected
    ex = tirbyoc.compile(mod)
    for batch in ((64,) if not dynamic_batch else (1, 64, 100)):
        x = torch.randn(batch, 800, generator=torch.Generator().manual_seed(batch))
        with torch.no_grad():
            ref = model(x).numpy()
        assert_close(_first(tirbyoc.run(ex, x.numpy())), ref)


def test_seed_mlp_from_onnx():
    from onnx.reference import ReferenceEvaluator

    mod, model = examples.mlp_onnx()
    offloaded = tirbyoc.apply_tir_byoc(mod)
    # the ONNX initializers are constants: packed at compile time
    assert tirbyoc.offloaded_kernels(offloaded) == ["tirbyoc_dense_f32_packed",
                                                    "tirbyoc_dense_relu_f32_packed"]
    ex = tirbyoc.compile(mod)
    for batch in (1, 64):
        x = np.random.default_rng(batch).standard_normal((batch, 800), np.float32)
        ref = ReferenceEvaluator(model).run(None, {"x": x})[0]
        assert_close(_first(tirbyoc.run(ex, x)), ref)


# PyTorch's advanced indexing, each form against PyTorch itself (gathers: bit for bit).
# TVM's own converter gets "zip", "separated" and "middle" wrong (an outer product of
# the indices, a result with one axis too many) and fails on ConvBERT's unfold.
_I, _J, _COL = torch.tensor([0, 2, -1]), torch.tensor([1, 0, 3]), torch.tensor([[1], [0]])
INDEXING = {
    "rows_cols": lambda x: x[torch.arange(4)[:, None], _I],  # index ranks differ
    "zip": lambda x: x[:, _I, _J],  # a whole axis first, then two paired indices
    "broadcast": lambda x: x[:, _COL, _I],
    "separated": lambda x: x[_I, :, _J],  # broadcast axes go first
    "middle": lambda x: x[:, :, _I, _J],
    "all": lambda x: x[_I, _J, _COL],
    "one": lambda x: x[:, _I],  # one index: TVM's take
    # ConvBERT's span convolution (nn.Unfold over [B, C, L, 1]), decomposed into indexing
    "unfold": lambda x: torch.nn.functional.unfold(x, kernel_size=(3, 1), padding=(1, 0)),
}


@pytest.mark.parametrize("form", list(INDEXING))
def test_advanced_indexing_as_pytorch(form):
    class Index(torch.nn.Module):
        def forward(self, x):
            return INDEXING[form](x)

    x = torch.randn(4, 5, 6, 4, generator=torch.Generator().manual_seed(1))
    mod = examples.import_torch(Index(), x)
    got, ref = _first(tirbyoc.run(tirbyoc.compile(mod), x.numpy())), Index()(x).numpy()
    assert got.shape == ref.shape and np.array_equal(got, ref)


def test_min_over_an_axis_gives_values_and_first_indices():
    """Ties: the first index; a NaN in a row: NaN and its index, as PyTorch."""
    class Min(torch.nn.Module):
        def forward(self, x):
            low, at = x.min(dim=-1)
            low_kept, at_kept = x.min(1, keepdim=True)
            return low, at, low_kept, at_kept

    x = torch.randn(6, 5, 7, generator=torch.Generator().manual_seed(2))
    x[1, 2, 3] = x[1, 2, 5] = -9.0  # a tie: the first index, as PyTorch
    x[4, 0, 0] = x[4, 3, 0] = -9.0
    x[2, 1, 4] = x[2, 1, 6] = x[5, 2, 1] = float("nan")  # NaN wins, the first one's index
    mod = examples.import_torch(Min(), x)
    got = tirbyoc.run(tirbyoc.compile(mod), x.numpy())
    for value, expected in zip(got, Min()(x)):
        assert value.dtype == expected.numpy().dtype
        np.testing.assert_array_equal(value, expected.numpy())  # (NaN where NaN)


def test_ranges_with_a_negative_step():
    """Funnel Transformer's relative positions: Relax's arange made arange(6, -6, -1)
    14 long (its length counted as for a positive step), and the expand after it failed
    to import."""
    class Ranges(torch.nn.Module):
        def forward(self, x):
            down = x[:, None] * torch.arange(6, -6, -1)[None].expand(4, 12)  # [4, 12]
            return down, x[:, None] + torch.arange(1.0, -1.0, -0.25)  # [4, 8]

    x = torch.randn(4, generator=torch.Generator().manual_seed(3))
    got = tirbyoc.run(tirbyoc.compile(examples.import_torch(Ranges(), x)), x.numpy())
    for value, expected in zip(got, Ranges()(x)):
        assert value.shape == tuple(expected.shape)
        np.testing.assert_allclose(value, expected.numpy(), rtol=1e-6, atol=1e-6)


def test_log_of_integers_is_taken_in_float():
    """SEW-D's relative position buckets: torch.log of an int64 tensor (Relax's log
    takes floats only)."""
    class Buckets(torch.nn.Module):
        def forward(self, x):
            return torch.log(torch.arange(1, 9)[None, :] * 3) * x

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(4))
    got = _first(tirbyoc.run(tirbyoc.compile(examples.import_torch(Buckets(), x)), x.numpy()))
    np.testing.assert_allclose(got, Buckets()(x).numpy(), rtol=1e-6, atol=1e-6)


def test_amax_and_whole_tensor_max_propagate_nan_as_pytorch():
    """Reformer's ``amax`` had no converter; Relax's max skips NaN, PyTorch's returns it."""
    class Extremes(torch.nn.Module):
        def forward(self, x):
            return (x.amax(dim=-1), x.amin(dim=(0, 2), keepdim=True), x.amax(), x.max(),
                    x.min(), (x > 0).amax(dim=1))

    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(10))
    x[1, 2, 3] = float("nan")
    got = list(tirbyoc.run(tirbyoc.compile(examples.import_torch(Extremes(), x)),
                               x.numpy()))
    for value, expected in zip(got, Extremes()(x)):
        expected = expected.numpy()
        assert value.shape == expected.shape and value.dtype == expected.dtype
        np.testing.assert_array_equal(value, expected)  # (NaN where NaN)


def test_argmax_and_argmin_point_at_the_first_nan_as_pytorch():
    """Relax's argmax and argmin skip NaN, and which index they gave for a row holding
    one depended on where it was (first, inside, last); PyTorch's gives the first NaN.
    Every axis form (a negative one, none: the flattened tensor, keepdim), exactly."""
    class Args(torch.nn.Module):
        def forward(self, x):
            return (x.argmax(dim=1), x.argmin(dim=-1, keepdim=True), x.argmax(),
                    x.argmin(dim=None, keepdim=True), x[0].argmax(dim=0), (-x).argmin(dim=1))

    x = torch.randn(4, 6, 5, generator=torch.Generator().manual_seed(12))
    x[1, 0, :] = float("nan")  # first along axis 1
    x[2, 3, 1] = float("nan")  # inside, and a second one last
    x[2, 5, 1] = float("nan")
    x[3, :, 4] = float("nan")  # last along axis 2
    x[0, 2, 2] = x[0, 4, 2] = 9.0  # a tie (the first index wins)
    _assert_compiled_as_pytorch(Args(), x)
    assert Args()(x)[0][2, 1] == 3 and Args()(x)[1][3, 0, 0] == 4  # (the NaN cases ran)


def _assert_as_pytorch(got, expected):
    """Each output of ours equal to PyTorch's, values (NaN where NaN) and dtypes."""
    assert len(got) == len(expected)
    for k, (value, want) in enumerate(zip(got, expected)):
        assert value.dtype == want.numpy().dtype, k
        np.testing.assert_array_equal(value, want.numpy(), err_msg=str(k))


def _assert_compiled_as_pytorch(model, x):
    """``model`` compiled from PyTorch, on ``x``: ``_assert_as_pytorch``."""
    got = tirbyoc.run(tirbyoc.compile(examples.import_torch(model, x)), x.numpy())
    _assert_as_pytorch(got, model(x))


def test_extremes_of_rows_at_the_limits_of_their_type_as_pytorch():
    """TOPI starts a max at -FLT_MAX and an argmax at index -1: the max of a row of -inf
    came out -3.4e38 and its argmax -1 (an index out of bounds), as did the argmax of a
    row of int64's minimum. Every result against PyTorch's, exactly."""
    class Extremes(torch.nn.Module):
        def forward(self, x, i):
            top, where = x.max(dim=1)
            low, at = x.min(dim=1)
            return (top, where, low, at, x.amax(dim=1), x.argmax(dim=1), x.argmin(dim=1),
                    (-x).amin(dim=1), i.argmax(dim=1), i.argmin(dim=1), i.amax(dim=1))

    inf = float("inf")
    x = torch.tensor([[-inf, -inf, -inf], [inf, inf, inf], [1.0, -inf, 0.0], [2.0, 2.0, 1.0]])
    low, high = torch.iinfo(torch.int64).min, torch.iinfo(torch.int64).max
    i = torch.tensor([[low, low], [high, high], [-5, 3]])
    with torch.no_grad():
        ep = torch.export.export(Extremes(), (x, i))
    got = tirbyoc.run(tirbyoc.compile(tirbyoc.from_exported_program(ep)), x.numpy(), i.numpy())
    expected = Extremes()(x, i)
    _assert_as_pytorch(got, expected)


class _Clamps(torch.nn.Module):
    def forward(self, x, y):
        F = torch.nn.functional
        return (torch.relu(x), torch.maximum(x, y), torch.minimum(x, y), x.clamp(-1, 1),
                x.clamp(min=0.5), x.clamp(max=0.5), F.hardtanh(x), F.relu6(x),
                F.hardsigmoid(x), F.hardswish(x), torch.sign(x), x.amax(-1),
                F.max_pool2d(x[None, None], 3, 2), (x.relu() * 2).sum(-1))


def test_nan_passes_through_max_min_and_clamps_as_in_pytorch():
    """TVM's compare-select max returned the other operand for a NaN first one
    (``relu(NaN)`` was 0, ``clamp(NaN, min=0.5)`` inf). (``sign(NaN)`` is 0 in PyTorch,
    as in TVM.) With NaN in either operand, vectorized rows (1000 wide) and reductions beside them:
    exactly PyTorch's, NaN where NaN."""
    rng = np.random.default_rng(21)
    x, y = (torch.from_numpy(rng.standard_normal((16, 1000)).astype(np.float32))
            for _ in range(2))
    for t in (x, y):
        t[torch.from_numpy(rng.random(t.shape) < 0.02)] = float("nan")
    x[0, :4] = torch.tensor([float("inf"), -float("inf"), -0.0, 0.0])
    with torch.no_grad():
        ep = torch.export.export(_Clamps(), (x, y))
    got = tirbyoc.run(tirbyoc.compile(tirbyoc.from_exported_program(ep)), x.numpy(), y.numpy())
    expected = _Clamps()(x, y)
    assert len(got) == len(expected)
    for k, (value, want) in enumerate(zip(got, expected)):
        want = want.numpy()
        assert value.dtype == want.dtype and value.shape == want.shape, k
        np.testing.assert_array_equal(np.isnan(value), np.isnan(want), err_msg=str(k))
        # (the hard activations and the sum: float arithmetic in another order)
        np.testing.assert_allclose(value, want, rtol=1e-6, atol=1e-6, err_msg=str(k))


class _PaddedByBuffers(torch.nn.Module):
    """Mimi's convolutions: the padding read out of registered buffers with ``.item()``
    and computed from them and the length, then a scale read out of the input."""

    def __init__(self, scale_from_input=False):
        super().__init__()
        torch.manual_seed(6)
        self.conv = torch.nn.Conv1d(4, 5, 5, stride=2)
        self.register_buffer("padding_total", torch.tensor(3), persistent=False)
        self.register_buffer("stride", torch.tensor(2), persistent=False)
        self.scale_from_input = scale_from_input

    def forward(self, x):
        extra = (self.stride - (x.shape[-1] + self.padding_total) % self.stride) % self.stride
        y = self.conv(torch.nn.functional.pad(x, (self.padding_total.item(), extra.item())))
        return y * x.abs().amax().item() if self.scale_from_input else y


class _RandomScale(torch.nn.Module):
    def forward(self, x):
        return x * (torch.rand(()) + self.offset()).item()

    def offset(self):
        return torch.ones(())


@pytest.mark.parametrize("length", [17, 18])
def test_scalars_read_out_of_buffers_are_folded_at_import(length):
    """``.item()`` of what buffers and static shapes give is a number at import
    (``fold_constant_items``): TVM's frontend made each a shape read at run time, and a
    pad's widths cannot be one (Mimi's decoder did not import). A scalar read out of
    the input or out of a random draw stays a run-time value. Numerics against
    PyTorch."""
    for from_input in (False, True):
        model = _PaddedByBuffers(from_input).eval()
        x = torch.randn(2, 4, length, generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            ep = torch.export.export(model, (x,))
            ref = model(x).numpy()
        assert tirbyoc.fold_constant_items(ep) == 2  # not the input's maximum
        got = _first(tirbyoc.run(tirbyoc.compile(tirbyoc.from_exported_program(ep)),
                                 x.numpy()))
        assert got.shape == ref.shape
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    # a scalar from a random draw is drawn on every run: never folded into one number
    ep = torch.export.export(_RandomScale(), (x,))
    assert tirbyoc.fold_constant_items(ep) == 0


@pytest.mark.parametrize("shape, size, kernel", [
    ((2, 16, 8, 12), (2, 4), True), ((2, 8, 7, 10), (3, 4), False),
    ((1, 4, 5, 9), (4, 7), False)])
def test_adaptive_max_pool_gives_pytorchs_windows(shape, size, kernel):
    """``adaptive_max_pool2d`` (TVM has no converter): windows that divide the input (a
    max pool, which tirbyoc's pooling kernel takes) and windows that overlap or vary in
    size (PyTorch's ``floor`` and ``ceil`` bounds), a NaN in one window kept, bit for
    bit; reading its indices is an error that names it."""
    class Pool(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.adaptive_max_pool2d(x, size) * 2

    x = torch.randn(*shape, generator=torch.Generator().manual_seed(3))
    x[0, 1, 1, 2] = float("nan")
    mod = examples.import_torch(Pool(), x)
    got = _first(tirbyoc.run(tirbyoc.compile(mod), x.numpy()))
    expected = Pool()(x).numpy()
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
    pools = [r for r in tirbyoc.explain(mod).offloaded if "pool" in r.intrinsic]
    assert len(pools) == (1 if kernel else 0), pools

    class Indices(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.adaptive_max_pool2d(x, 2, return_indices=True)

    with pytest.raises(Exception, match="adaptive_max_pool2d.*indices"):
        examples.import_torch(Indices(), x)


@pytest.mark.parametrize("dim, size, step", [(1, 4, 2), (-1, 3, 3), (2, 5, 1), (0, 2, 1)])
def test_unfold_gives_pytorchs_windows(dim, size, step):
    """``Tensor.unfold`` (PatchTST's patches; TVM has no converter): overlapping,
    touching and single windows, bit for bit with PyTorch."""
    class Windows(torch.nn.Module):
        def forward(self, x):
            return x.unfold(dim, size, step) * 2

    x = torch.randn(3, 10, 7, generator=torch.Generator().manual_seed(size))
    got = _first(tirbyoc.run(tirbyoc.compile(examples.import_torch(Windows(), x)), x.numpy()))
    expected = Windows()(x).numpy()
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


class _Promotions(torch.nn.Module):
    """Arithmetic of integer and bool tensors with Python numbers, and ``alpha``."""

    def forward(self, x):
        i = torch.arange(6).reshape(2, 3)  # int64
        small = (x > 0).to(torch.int32)
        mask = x > 0
        return (i * 0.5, i + 1e-7, (i + 1e-7).log(), 1.5 - i, i - 2, i * 3, small + 1,
                small * 0.25, mask + 1, mask * 1.5, mask + True, x + 2, x * i,
                torch.add(x, x, alpha=3), torch.sub(x, i, alpha=2), torch.add(i, 2, alpha=3),
                torch.rsub(x, 1.0, alpha=2), torch.rsub(x, i, alpha=2), mask * (x < 1))


def test_numbers_with_integer_tensors_promote_as_pytorch():
    """TVM's converter gave a Python number its tensor's type: ``arange(n) * 0.5`` was all
    zeros, ``arange(n) + 1e-7`` added nothing (ZoeDepth's log-binomial took log(0), and
    every output was NaN), and ``alpha`` was ignored. Every result against PyTorch's,
    values and dtypes."""
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(12))
    got = tirbyoc.run(tirbyoc.compile(examples.import_torch(_Promotions(), x)), x.numpy())
    expected = _Promotions()(x)
    assert len(got) == len(expected)
    for k, (value, want) in enumerate(zip(got, expected)):
        want = want.numpy()
        assert value.dtype == want.dtype, (k, value.dtype, want.dtype)
        np.testing.assert_allclose(value, want, rtol=1e-6, atol=1e-6, err_msg=str(k))


@pytest.mark.parametrize("mode, padding, align, shape, reach", [
    ("bilinear", "zeros", False, (2, 3, 5, 7), 1.2),
    ("bilinear", "border", True, (2, 3, 5, 7), 1.2),
    ("nearest", "zeros", False, (2, 3, 5, 7), 1.2),
    ("bilinear", "reflection", False, (2, 3, 5, 7), 3.0),
    ("bilinear", "reflection", True, (2, 3, 5, 7), 3.0),
    ("nearest", "reflection", True, (2, 3, 5, 7), 3.0),
    ("bilinear", "reflection", True, (2, 3, 1, 7), 3.0)])
def test_grid_sample_reads_pytorchs_grid(mode, padding, align, shape, reach):
    """``grid_sample`` with PyTorch's [N, H_out, W_out, 2] grid (RT-DETR's deformable
    attention): TVM's converter gave TOPI the grid as [N, 2, H, W], a wrong shape and
    wrong points. Against PyTorch, the grid reaching past the borders (``reach``: to
    +-3, several reflections, for the reflecting ones, which are rewritten: TOPI's took
    about a minute to compile, and divided by zero on an image one pixel high)."""
    class Sample(torch.nn.Module):
        def forward(self, x, grid):
            return torch.nn.functional.grid_sample(x, grid, mode=mode, padding_mode=padding,
                                                   align_corners=align)

    gen = torch.Generator().manual_seed(13)
    x = torch.randn(*shape, generator=gen)
    grid = (torch.rand(2, 11, 4, 2, generator=gen) * 2 - 1) * reach
    with torch.no_grad():
        ep = torch.export.export(Sample(), (x, grid))
    got = _first(tirbyoc.run(tirbyoc.compile(tirbyoc.from_exported_program(ep)), x.numpy(),
                             grid.numpy()))
    want = Sample()(x, grid).numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("size, scale", [
    ((4, 5), None), ((13, 25), None), (None, 1.7), (None, (0.5, 3.0)), (None, 0.3),
    (None, 2.0), ((14, 18), None)])
def test_nearest_interpolation_picks_pytorchs_pixels(size, scale):
    """TVM's converter took half-pixel centres and rounded ("nearest-exact"), and the
    sizes' ratio where a scale factor was given: 7 -> 4 rows gave [0, 2, 4, 6] for
    PyTorch's [0, 1, 3, 5]. Whole upscales (the last two) stay TVM's resize. Exact."""
    class Nearest(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.interpolate(x, size=size, scale_factor=scale,
                                                   mode="nearest")

    x = torch.randn(1, 3, 7, 6, generator=torch.Generator().manual_seed(13))
    got = tirbyoc.run(tirbyoc.compile(examples.import_torch(Nearest(), x)), x.numpy())
    np.testing.assert_array_equal(_first(got), Nearest()(x).numpy())


class _Comparisons(torch.nn.Module):
    def forward(self, x):
        i = torch.arange(-3, 4)
        b = x[0] > 0
        return (i == 2.5, i >= 2.5, i < 2.5, i <= -2.5, i != 2.5, i > -2.5, b > 0.5,
                b == 1, i.int() < 2.5, i > x[:7], i.int() == i, x > 0, x != 0.25)


def test_comparisons_with_numbers_promote_as_pytorch():
    """TVM's converter made a Python number its tensor's type, so an int64 tensor was
    compared with 2.5 as with 2 (``arange(-3, 4) >= 2.5`` was True at 2). Every result
    against PyTorch's, exactly."""
    x = torch.randn(9, generator=torch.Generator().manual_seed(14))
    _assert_compiled_as_pytorch(_Comparisons(), x)


@pytest.mark.parametrize("scale", [1.7, (0.5, 1.3), 2.0, 0.5])
def test_bilinear_interpolation_by_a_scale_factor_as_pytorch(scale):
    """PyTorch maps pixels by the scale factor given, TVM's converter by the sizes'
    ratio (7 rows at 1.7 make 11: other values everywhere). Within float32 rounding of
    PyTorch's result; the whole and exact ratios (the last two) stay TVM's resize."""
    class Bilinear(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.interpolate(x, scale_factor=scale, mode="bilinear")

    x = torch.randn(1, 3, 7, 6, generator=torch.Generator().manual_seed(15))
    got = tirbyoc.run(tirbyoc.compile(examples.import_torch(Bilinear(), x)), x.numpy())
    np.testing.assert_allclose(_first(got), Bilinear()(x).numpy(), rtol=1e-6, atol=1e-6)


def test_antialiased_downsampling_is_an_error_and_upsampling_is_bilinear():
    """TVM's converter dropped the antialiasing filter: a downsampling came out silently
    wrong. It is an error naming the op; an upsampling (where the filter does nothing)
    matches PyTorch."""
    class Resize(torch.nn.Module):
        def __init__(self, size):
            super().__init__()
            self.size = size

        def forward(self, x):
            return torch.nn.functional.interpolate(x, size=self.size, mode="bilinear",
                                                   antialias=True)

    x = torch.randn(1, 2, 7, 6, generator=torch.Generator().manual_seed(16))
    with pytest.raises(NotImplementedError, match="antialiased bilinear downsampling"):
        examples.import_torch(Resize((3, 3)), x)
    got = tirbyoc.run(tirbyoc.compile(examples.import_torch(Resize((14, 12)), x)), x.numpy())
    np.testing.assert_allclose(_first(got), Resize((14, 12))(x).numpy(), rtol=1e-6,
                               atol=1e-6)


@pytest.mark.parametrize("mode, size, scale, corners", [
    ("linear", 11, None, False), ("linear", None, 1.7, False), ("linear", 11, None, True),
    ("linear", 4, None, False), ("trilinear", (5, 6, 9), None, False)])
def test_linear_and_trilinear_interpolation_build_and_match_pytorch(mode, size, scale,
                                                                    corners):
    """``torch.export`` writes them with a clamp of integer indices with one bound, which
    TVM's converter made an infinity ("Cannot convert infinity to BigInt"): none built."""
    class Resize(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.interpolate(x, size=size, scale_factor=scale,
                                                   mode=mode, align_corners=corners)

    shape = (1, 3, 7) if mode == "linear" else (1, 2, 3, 4, 5)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(17))
    got = tirbyoc.run(tirbyoc.compile(examples.import_torch(Resize(), x)), x.numpy())
    np.testing.assert_allclose(_first(got), Resize()(x).numpy(), rtol=1e-6, atol=1e-6)


class _IntegerClamps(torch.nn.Module):
    def forward(self, x):
        i = torch.arange(-4, 5) * x.shape[0]
        return (i.clamp(max=3), i.clamp(min=-2), i.clamp(-2.5, 1.5), i.clamp(min=0.5),
                i.clamp(-3, 3), x.clamp(max=0.2))


def test_integer_clamps_as_pytorch():
    """One bound: the other was an infinity, which TVM could not build for integers; a
    float bound: PyTorch's result is float32, TVM's clamped to the bound cut to an
    integer. Values and dtypes against PyTorch."""
    x = torch.randn(1, 5, generator=torch.Generator().manual_seed(18))
    _assert_compiled_as_pytorch(_IntegerClamps(), x)


class _Remainders(torch.nn.Module):
    def forward(self, x):
        i = torch.arange(-3, 4) * x.shape[0]
        big = x * 1e10
        return (torch.remainder(i, 2.5), torch.fmod(i, 2.5), torch.reciprocal(i[4:]),
                torch.remainder(big, 3.0), torch.remainder(x, -0.7), torch.remainder(i, 2))


def test_remainders_and_integer_arithmetic_with_floats_as_pytorch():
    """TVM's converter cut a float divisor to an integer for an integer tensor
    (``remainder(-3, 2.5)`` gave 1, not 2.0) and took ``reciprocal`` of integers in
    integers; TOPI's float remainder ``x - floor(x / y) * y`` lost what the division
    rounded away (``remainder(1e10, 3)`` was 256). Values and dtypes against PyTorch,
    exactly (its remainder is exact)."""
    x = torch.tensor([1.0, -1.0, 0.75, -7.5, 3.0, 1e-3])
    _assert_compiled_as_pytorch(_Remainders(), x)


class _FloorDivisions(torch.nn.Module):
    def forward(self, x):
        a, b = x[0], x[1]
        return (torch.floor_divide(a, b), torch.div(a, b, rounding_mode="floor"), a // 0.7,
                torch.div(a, -0.1, rounding_mode="floor"), a.double() // b.double(),
                a.clamp(min=2.0, max=1.0))


def test_float_floor_division_and_crossed_clamps_as_pytorch():
    """TOPI floored the rounded quotient: ``3.5 // -0.7`` was -5 (PyTorch: -6), ``7 //
    0.1`` 70 (69), ``inf // 2`` inf (NaN); ``clamp`` with min above max gave min
    (PyTorch: max). Against PyTorch exactly, the signs of zeros included."""
    inf = float("inf")
    x = torch.tensor([[3.5, -3.5, 1e10, 7.0, -0.0, 5.0, 1.0, -1.0, 0.3, inf, 2.1, -0.3, 0.0],
                      [-0.7, 0.7, 3.0, 0.1, 2.0, 0.0, inf, inf, 0.1, 2.0, 0.7, -2.0, -3.0]])
    model = _FloorDivisions()
    got = tirbyoc.run(tirbyoc.compile(examples.import_torch(model, x)), x.numpy())
    expected = model(x)
    _assert_as_pytorch(got, expected)
    for k, (value, want) in enumerate(zip(got, expected)):
        np.testing.assert_array_equal(np.signbit(value), np.signbit(want.numpy()), str(k))


@pytest.mark.parametrize("name", ["sinh", "cosh", "atanh"])
def test_hyperbolic_functions_build_and_keep_their_digits(name):
    """``sinh`` and ``cosh`` did not build once vectorized ("unknown intrinsic
    tirx.sinh"); TOPI's ``atanh`` cancelled (``atanh(1e-8)`` was 0). Against float64,
    relative error within 2e-6 (the vectorized exp's is 1e-6), over 1e-30 to 80 in
    magnitude (atanh: below 1)."""
    function = getattr(torch, name)

    class Apply(torch.nn.Module):
        def forward(self, x):
            return function(x)

    top = 0.0 if name == "atanh" else 1.9
    mags = 10.0 ** np.linspace(-30, top, 120)
    xs = np.concatenate([mags, -mags]).astype(np.float32)
    xs = xs[np.abs(xs) < 1] if name == "atanh" else xs
    got = _first(tirbyoc.run(tirbyoc.compile(examples.import_torch(Apply(), torch.from_numpy(xs))),
                             xs))
    want = function(torch.from_numpy(xs).double()).numpy()
    normal = np.abs(want) >= np.finfo(np.float32).tiny
    rel = np.abs(got[normal] - want[normal]) / np.abs(want[normal])
    assert rel.max() < 2e-6, (rel.max(), xs[normal][np.argmax(rel)])


def test_run_takes_0d_inputs_and_returns_shapes():
    """``tirbyoc.run`` made a 0-d input 1-d (an ONNX scalar: "expect Tensor with ndim 0
    but get 1") and failed on an output that is a shape."""
    from onnx import TensorProto, helper
    from tvm.relax.frontend.onnx import from_onnx

    value = helper.make_tensor_value_info
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    graph = helper.make_graph(
        [helper.make_node("Trilu", ["x", "k"], ["y"]),
         helper.make_node("Shape", ["x"], ["s"], start=1)], "g",
        [value("x", TensorProto.FLOAT, [3, 4]), value("k", TensorProto.INT64, [])],
        [value("y", TensorProto.FLOAT, [3, 4]), value("s", TensorProto.INT64, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    ex = tirbyoc.compile(from_onnx(model, keep_params_in_input=False))
    upper, shape = tirbyoc.run(ex, x, np.array(1, np.int64))
    np.testing.assert_array_equal(upper, np.triu(x, 1))
    assert shape.dtype == np.int64 and shape.tolist() == [4]


def test_a_bool_mask_index_is_an_error_naming_it():
    """``x[mask]``: the result's size depends on the mask's values, which no compiled
    shape can follow; TVM's converter failed with a type error about a ``take``."""
    class Masked(torch.nn.Module):
        def forward(self, x):
            return x[x[:, 0] > 0] * 2.0

    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(3))
    with pytest.raises(NotImplementedError, match=r"bool mask \(x\[mask\]\)"):
        examples.import_torch(Masked(), x)


class _Fourier(torch.nn.Module):
    """PyTorch's FFTs as models use them: FNet's ``fftn(x).real`` over tokens and
    features, spectra, magnitudes, inverses (odd and even lengths, half spectra longer
    than needed), every normalization."""

    def forward(self, x):
        fft = torch.fft
        return (fft.fftn(x.to(torch.complex64), dim=(1, 2)).real,
                torch.view_as_real(fft.rfft(x, dim=-1)),
                fft.fft2(x, norm="ortho").imag,
                fft.ifft(fft.fft(x, dim=1), dim=1).real,
                fft.rfft(x).abs(),
                fft.irfft(fft.rfft(x)),
                fft.irfft(fft.rfft(x, dim=1), n=8, dim=1, norm="forward"),
                fft.irfft(fft.rfft(x[..., :5]), n=5),
                fft.irfft2(fft.rfft2(x, norm="ortho"), s=(8, 6), norm="ortho"),
                fft.irfft(fft.fft(x), n=10))


def test_fourier_transforms_as_pytorch():
    """TVM's importer rejected PyTorch's FFTs ("Unsupported function types
    ['_fft_c2c.default', ...]"); here they are products with cosine and sine tables
    (``tirbyoc.torch_fft``). Each output within 1e-6 of max|PyTorch's| (float32 sums in
    another order; seen: 3e-7)."""
    x = torch.randn(2, 8, 6, generator=torch.Generator().manual_seed(4))
    got = tirbyoc.run(tirbyoc.compile(examples.import_torch(_Fourier(), x)), x.numpy())
    want = _Fourier()(x)
    assert len(got) == len(want)
    for k, (value, expected) in enumerate(zip(got, want)):
        expected = expected.numpy()
        assert value.shape == expected.shape, k
        np.testing.assert_allclose(value, expected, rtol=0,
                                   atol=1e-6 * np.abs(expected).max(), err_msg=str(k))


@pytest.mark.parametrize("read", ["mul", "output", "slice"])
def test_a_complex_tensor_read_by_another_op_is_an_error_naming_it(read):
    """A complex value reaching one of TVM's converters would be taken for its real part;
    anything but an FFT, ``.real``, ``.imag``, ``abs`` and ``irfft`` reading one is an
    error naming the op."""
    class Complex(torch.nn.Module):
        def forward(self, x):
            spectrum = torch.fft.rfft(x)
            if read == "mul":
                return torch.fft.irfft(spectrum * 2.0)
            if read == "slice":
                return torch.fft.irfft(spectrum, n=5)  # PyTorch slices the spectrum
            return spectrum

    match = {"mul": "mul", "output": "output", "slice": "slice"}[read]
    with pytest.raises(NotImplementedError, match=rf"{match}.* of a complex tensor"):
        examples.import_torch(Complex(), torch.randn(2, 8))
