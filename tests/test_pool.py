"""Max pooling: the kernel ``tirbyoc_max_pool2d_f32`` through cffi against PyTorch's
``max_pool2d`` on every instruction set (bit for bit: a maximum is exact, NaN
propagating), and the graph level (tirbyoc.pool): which ``R.nn.max_pool2d`` forms become
the kernel call and which stay TVM's, numerics against PyTorch either way."""

import numpy as np
import pytest
import tvm
from tvm import relax

import tirbyoc
from tirbyoc import kernels

torch = pytest.importorskip("torch")

# (shape, kernel, stride, padding, dilation, ceil_mode)
CASES = [
    ((1, 64, 112, 112), 3, 2, 1, 1, False),      # ResNet's stem pool
    ((2, 5, 17, 13), 3, 1, 1, 1, False),
    ((1, 3, 9, 11), 2, 2, 0, 1, True),           # ceil mode: a partial last window
    ((1, 4, 20, 21), (3, 2), (2, 3), 1, (2, 1), False),
    ((1, 2, 7, 40), (2, 3), (1, 2), 1, 1, True),
    ((3, 2, 6, 5), 5, 1, 2, 1, False),
    ((1, 7, 1, 1), 1, 1, 0, 1, False),
    ((1, 3, 33, 70), (1, 4), (1, 4), (0, 2), 1, False),
    # 3x3 stride 2 (AVX2's vector rows: 8 outputs a vector, the last block overlapping
    # the one before, the edges one by one): no padding, a ceil-mode window past the
    # edge, a row too short for a vector
    ((1, 3, 13, 24), 3, 2, 0, 1, False),
    ((1, 2, 15, 31), 3, 2, 1, 1, True),
    ((2, 3, 9, 17), 3, 2, 1, 1, False),
]


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_kernel_equals_pytorch_bit_for_bit(isa, case):
    shape, k, s, p, d, ceil = case
    rng = np.random.default_rng(len(shape) + sum(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    x.flat[rng.integers(0, x.size, 3)] = np.nan
    x.flat[rng.integers(0, x.size, 3)] = np.inf
    x.flat[rng.integers(0, x.size, 3)] = -np.inf
    want = torch.nn.functional.max_pool2d(torch.from_numpy(x), k, s, p, d,
                                          ceil_mode=ceil).numpy()
    for threads in (1, 2, 3):
        saved = kernels.num_threads()
        kernels.set_num_threads(threads)
        try:
            got = kernels.max_pool2d(x, k, stride=s, padding=p, dilation=d, ceil_mode=ceil)
        finally:
            kernels.set_num_threads(saved)
        assert got.shape == want.shape
        assert np.array_equal(got, want, equal_nan=True), (threads, np.argwhere(
            ~((got == want) | (np.isnan(got) & np.isnan(want))))[:5])


def test_kernel_refusals_name_the_problem():
    x = np.zeros((1, 2, 5, 5), np.float32)
    with pytest.raises(ValueError, match="at least 1"):
        kernels.max_pool2d(x, 0)
    with pytest.raises(ValueError, match="at least 0"):
        kernels.max_pool2d(x, 3, padding=-1)
    with pytest.raises(ValueError, match="float32"):
        kernels.max_pool2d(x.astype(np.float64), 3)
    with pytest.raises(ValueError, match="overlap"):
        kernels.max_pool2d(x, 1, out=x)
    # the C checks behind the wrapper: a status, nothing written
    ffi, lib = kernels.load()
    y = np.full((1, 2, 3, 3), 7.0, np.float32)
    px, py = (ffi.cast("float *", a.ctypes.data) for a in (x, y))
    assert lib.tirbyoc_max_pool2d_f32(1, 2, 5, 5, px, 3, 3, 0, 2, 1, 1, 1, 1, 3, 3,
                                      py) == kernels.TIRBYOC_EINVAL     # stride 0
    assert lib.tirbyoc_max_pool2d_f32(1, 2, 5, 5, px, 0, 3, 2, 2, 1, 1, 1, 1, 3, 3,
                                      py) == kernels.TIRBYOC_ESIZE      # empty window
    assert lib.tirbyoc_max_pool2d_f32(1, 2, 5, 5, ffi.NULL, 3, 3, 2, 2, 1, 1, 1, 1, 3, 3,
                                      py) == kernels.TIRBYOC_ENULL
    assert (y == 7.0).all()


class _Pool(torch.nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.kw = kw

    def forward(self, x):
        return torch.nn.functional.max_pool2d(torch.relu(x), **self.kw)


@pytest.mark.parametrize("kw", [
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=2, stride=2, ceil_mode=True),
    dict(kernel_size=(3, 2), stride=(1, 2), padding=(1, 0), dilation=(2, 1)),
], ids=["3x3s2", "2x2s2-ceil", "dilated"])
def test_graph_max_pool_is_one_kernel_call(kw):
    from tvm.relax.frontend.torch import from_exported_program

    model = _Pool(**kw).eval()
    x = torch.randn(2, 6, 15, 17, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        mod = from_exported_program(torch.export.export(model, (x,)))
        want = model(x).numpy()
    report = tirbyoc.explain(mod)
    assert [r.intrinsic for r in report.offloaded] == ["max_pool2d"], str(report)
    assert report.schedules["tirbyoc_max_pool2d"] == "kernel tirbyoc_max_pool2d_f32"
    got = tirbyoc.run(tirbyoc.compile(mod), x.numpy())
    got = got[0] if isinstance(got, (list, tuple)) else got
    assert np.array_equal(np.asarray(got), want)


def _relax_pool(layout, batch):
    bb = relax.BlockBuilder()
    shape = (batch, 4, 9, 9) if layout == "NCHW" else (batch, 9, 9, 4)
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.max_pool2d(x, 3, 2, 1, layout=layout))
            gv = bb.emit_output(y)
        bb.emit_func_output(gv)
    return bb.get()


def test_symbolic_batch_is_offloaded_and_nhwc_stays_tvm():
    """A symbolic batch is the kernel's batch argument; another layout keeps TVM's pool
    (its WindowReduction schedule), right either way."""
    n = tvm.tirx.Var("n", "int64")
    mod = _relax_pool("NCHW", n)
    assert [r.intrinsic for r in tirbyoc.explain(mod).offloaded] == ["max_pool2d"]
    ex = tirbyoc.compile(mod)
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 4, 9, 9)).astype(np.float32)
        want = torch.nn.functional.max_pool2d(torch.from_numpy(x), 3, 2, 1).numpy()
        assert np.array_equal(np.asarray(tirbyoc.run(ex, x)), want)
    nhwc = _relax_pool("NHWC", 2)
    report = tirbyoc.explain(nhwc)
    assert report.offloaded == [] and "max_pool2d" in report.schedules
    x = np.random.default_rng(0).standard_normal((2, 9, 9, 4)).astype(np.float32)
    want = torch.nn.functional.max_pool2d(torch.from_numpy(x.transpose(0, 3, 1, 2)), 3, 2,
                                          1).numpy().transpose(0, 2, 3, 1)
    assert np.array_equal(np.asarray(tirbyoc.run(tirbyoc.compile(nhwc), x)), want)


_CONSTANT_POOL = """
import sys
import numpy as np
from tvm import relax
import tirbyoc

rng = np.random.default_rng(0)
c = rng.standard_normal((1, 1, 126, 1)).astype(np.float32)
bb = relax.BlockBuilder()
x = relax.Var("x", relax.TensorType((1, 1, 64, 1), "float32"))
with bb.function("main", [x]):
    with bb.dataflow():
        ones = bb.emit(relax.op.full((1, 1, 2, 1), relax.const(1.0, "float32"), "float32"))
        made = bb.emit(relax.op.negative(relax.op.concat([ones, relax.const(c)], axis=2)))
        pooled = bb.emit(relax.op.nn.max_pool2d(made, pool_size=[2, 1], strides=[2, 1],
                                                ceil_mode=True))
        out = bb.emit_output(bb.emit(relax.op.multiply(x, pooled)))
    bb.emit_func_output(out)
xs = rng.standard_normal((1, 1, 64, 1)).astype(np.float32)
got = tirbyoc.run(tirbyoc.compile(bb.get()), xs)
made = -np.concatenate([np.ones((1, 1, 2, 1), np.float32), c], axis=2)
assert np.array_equal(got, xs * made.reshape(1, 1, 64, 2, 1).max(axis=3))
print("right")
"""


def test_a_pool_of_constants_is_folded_with_the_kernel():
    """Funnel Transformer's min-pool of a mask made from constants: the pool becomes a
    kernel call, then TVM's FoldConstant runs it at compile time by JIT, which finds the
    kernel only among the process's global symbols ("Symbols not found", then a
    crash, before the registry loaded them first). A fresh process: the symbols must
    not be global already from an earlier test."""
    import subprocess
    import sys

    from .fresh import without_torch

    run = subprocess.run([sys.executable, "-c", without_torch(_CONSTANT_POOL)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("right"), \
        (run.returncode, (run.stdout + run.stderr)[-3000:])
