"""Bring your own kernels: a user's C library (tests/byo/toy.c) declared with
``tirbyoc.Library`` and ``tirbyoc.ops``, as a user writes it.

The stories: an MLP (64x800 -> 500 -> 10) offloaded entirely to the user's
``dense_bias`` / ``dense_bias_relu``; a user's ``conv2d + bias + relu`` in OHWI taking
the stride-1 convolutions of a PyTorch model while the built-in library takes the
rest; the compiled model exported and run in a fresh process; ``tirbyoc.check``
passing the right library and failing a wrong declaration; the same library prebuilt
as a ``.so`` and as a ``.a``. Numerics against numpy and PyTorch: max |error| <= 1e-4
(float32 sums of up to 800 products, in another order).
"""

import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tirbyoc
from tirbyoc import examples, ops

from .fresh import without_torch

HERE = pathlib.Path(__file__).parent / "byo"
TOY_C = str(HERE / "toy.c")
TOY_H = (HERE / "toy.h").read_text()
DENSE_ARGS = ("x", "weight", "bias", "y", "m", "n", "k")
CONV_ARGS = ("x", "weight", "bias", "y", "batch", "in_channels", "height", "width",
             "out_channels", "kernel_h", "kernel_w", "pad")
TOL = 1e-4


def declare_dense(lib):
    lib.kernel("toy_dense_bias_relu", computes=ops.dense(epilogue=("bias", "relu"),
                                                         weight="nt"), args=DENSE_ARGS)
    lib.kernel("toy_dense_bias", computes=ops.dense(epilogue=("bias",), weight="nt"),
               args=DENSE_ARGS)
    return lib


def declare_conv(lib):
    lib.kernel("toy_conv2d_bias_relu",
               computes=ops.conv2d(layout="NCHW", weight="OHWI", epilogue=("bias", "relu"),
                                   stride=1, dilation=1, groups=1),
               args=CONV_ARGS)
    return lib


@pytest.fixture(scope="module")
def toy():
    return declare_conv(declare_dense(tirbyoc.Library("toy", sources=[TOY_C], cdef=TOY_H)))


@pytest.fixture(scope="module")
def mlp():
    layers = examples.mlp_weights()
    x = np.random.default_rng(1).standard_normal((64, 800)).astype(np.float32)
    return examples.mlp_relax(64, layers), x, examples.mlp_numpy(x, layers)


def by_library(report):
    out = {}
    for row in report.offloaded:
        out.setdefault(row.library, []).append(row.kernel)
    return {k: sorted(v) for k, v in out.items()}


# ---- story 1: an MLP on the user's dense kernels only ----

def test_mlp_runs_entirely_on_the_users_dense_kernels(toy, mlp):
    mod, x, ref = mlp
    report = tirbyoc.explain(mod, libraries=[toy])
    print(report)
    assert by_library(report) == {"toy": ["toy_dense_bias", "toy_dense_bias_relu"]}
    assert not report.rejected
    text = str(report)
    assert "offloaded: toy.toy_dense_bias_relu" in text and "offloaded: toy.toy_dense_bias " \
        in text
    ex = tirbyoc.compile(mod, libraries=[toy])
    out = tirbyoc.run(ex, x)
    assert np.abs(out - ref).max() <= TOL * max(1.0, np.abs(ref).max())
    # the two calls are separate PrimFuncs: the 64x500 intermediate is TVM's, no nesting
    offloaded = tirbyoc.apply_tir_byoc(mod, libraries=[toy])
    calls = tirbyoc.api.offloaded_by_library(offloaded)
    assert calls == {"toy": {"toy_dense_bias", "toy_dense_bias_relu"}}
    funcs = [f for _, f in offloaded.functions_items() if isinstance(f, tirbyoc._tvm.PrimFunc)
             and tirbyoc.offloaded_kernels(f)]
    assert len(funcs) == 2 and all(len(tirbyoc.offloaded_kernels(f)) == 1 for f in funcs)


def test_user_library_comes_first_then_the_builtin_one(mlp):
    mod, x, ref = mlp
    # the user's dense_bias takes only N = 10: the relu layer (N = 500) is the built-in
    # library's
    small = tirbyoc.Library("toyb", sources=[TOY_C], cdef=TOY_H)
    small.kernel("toy_dense_bias", computes=ops.dense(epilogue=("bias",), n=10),
                 args=DENSE_ARGS)
    report = tirbyoc.explain(mod, libraries=[small])
    assert by_library(report) == {"toyb": ["toy_dense_bias"],
                                  "tirbyoc": ["tirbyoc_dense_relu_f32_packed"]}
    out = tirbyoc.run(tirbyoc.compile(mod, libraries=[small]), x)
    assert np.abs(out - ref).max() <= TOL * max(1.0, np.abs(ref).max())
    # without the built-in library that layer stays in TVM, with the reasons
    report = tirbyoc.explain(mod, libraries=[small], builtin=False)
    assert by_library(report) == {"toyb": ["toy_dense_bias"]}
    (rejected,) = report.rejected
    assert "toyb.toy_dense_bias: n = 500 (the kernel requires 10)" in rejected.detail
    # first match wins: a library's dense_bias takes the bias of a dense + bias + relu
    # that no earlier kernel computes whole (the relu then stays TVM's)
    any_n = tirbyoc.Library("toyc", sources=[TOY_C], cdef=TOY_H)
    any_n.kernel("toy_dense_bias", computes=ops.dense(epilogue=("bias",)), args=DENSE_ARGS)
    report = tirbyoc.explain(mod, libraries=[any_n])
    assert by_library(report) == {"toyc": ["toy_dense_bias", "toy_dense_bias"]}
    out = tirbyoc.run(tirbyoc.compile(mod, libraries=[any_n]), x)
    assert np.abs(out - ref).max() <= TOL * max(1.0, np.abs(ref).max())


def test_constraints_restrict_matching(mlp):
    mod, _, _ = mlp
    lib = tirbyoc.Library("wide", sources=[TOY_C], cdef=TOY_H)
    lib.kernel("toy_dense_bias_relu",
               computes=ops.dense(epilogue=("bias", "relu"), n=lambda n: n % 100 == 0),
               args=DENSE_ARGS)
    lib.kernel("toy_dense_bias", computes=ops.dense(epilogue=("bias",), n=16),
               args=DENSE_ARGS)
    report = tirbyoc.explain(mod, libraries=[lib], builtin=False)
    assert by_library(report) == {"wide": ["toy_dense_bias_relu"]}  # n = 500
    (rejected,) = report.rejected
    assert "n = 10 (the kernel requires 16)" in rejected.detail


# ---- story 2: a user's OHWI conv beside the built-in library ----

class _Net:
    @staticmethod
    def build():
        import torch

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.c1 = torch.nn.Conv2d(3, 16, 3, padding=1)
                self.c2 = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1)
                self.c3 = torch.nn.Conv2d(32, 32, 1)
                self.c4 = torch.nn.Conv2d(32, 32, 3, padding=1, bias=False)
                self.c5 = torch.nn.Conv2d(32, 32, 3, padding=1)  # no relu: not the kernel's
                self.fc = torch.nn.Linear(32, 10)

            def forward(self, x):
                x = torch.relu(self.c1(x))
                x = torch.relu(self.c2(x))
                x = torch.relu(self.c3(x))
                x = torch.relu(self.c4(x))
                return self.fc(self.c5(x).mean((2, 3)))

        torch.manual_seed(0)
        return Net().eval()


def test_users_ohwi_conv_takes_the_stride_1_convolutions():
    import torch

    net = _Net.build()
    x = torch.randn(2, 3, 16, 16)
    mod = examples.import_torch(net, x)
    toy = declare_conv(tirbyoc.Library("toy", sources=[TOY_C], cdef=TOY_H))
    report = tirbyoc.explain(mod, libraries=[toy])
    print(report)
    kernels = by_library(report)
    # c1, c3, c4 (stride 1, bias + relu; c4's bias is zero) are the user's; c2 (stride 2),
    # c5 (no relu) and the linear layer the built-in library's
    assert kernels["toy"] == ["toy_conv2d_bias_relu"] * 3
    assert sorted(kernels["tirbyoc"]) == ["tirbyoc_conv2d_f32_packed"] * 2 + \
        ["tirbyoc_dense_f32_packed"]
    assert "weight OHWI at compile time" in str(report)
    out = tirbyoc.run(tirbyoc.compile(mod, libraries=[toy]), x.numpy())
    with torch.no_grad():
        ref = net(x).numpy()
    assert np.abs(out - ref).max() <= TOL * max(1.0, np.abs(ref).max())


# ---- an exported library in a fresh process ----

FRESH = textwrap.dedent("""
    import sys
    import numpy as np
    import tvm
    assert "tirbyoc" not in sys.modules
    lib = tvm.runtime.load_module(sys.argv[1])
    vm = tvm.relax.VirtualMachine(lib, tvm.cpu())
    x = np.load(sys.argv[2])
    np.save(sys.argv[3], vm["main"](tvm.runtime.tensor(x)).numpy())
""")


def run_fresh(tmp_path, ex, x):
    so, xin, out = tmp_path / "model.so", tmp_path / "x.npy", tmp_path / "y.npy"
    ex.export_library(str(so))
    np.save(xin, x)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-c", without_torch(FRESH), str(so), str(xin), str(out)], check=True,
                   cwd=tmp_path, env=env, timeout=120)
    return np.load(out)


def test_exported_model_runs_in_a_fresh_process(toy, mlp, tmp_path):
    mod, x, ref = mlp
    out = run_fresh(tmp_path, tirbyoc.compile(mod, libraries=[toy]), x)
    assert np.abs(out - ref).max() <= TOL * max(1.0, np.abs(ref).max())


# ---- prebuilt libraries ----

def _cc(*args):
    subprocess.run([os.environ.get("CC", "cc"), *args], check=True)


@pytest.mark.parametrize("kind", ["so", "a"])
def test_prebuilt_library(kind, mlp, tmp_path):
    mod, x, ref = mlp
    obj = tmp_path / "toy.o"
    _cc("-O2", "-fPIC", "-c", TOY_C, "-o", str(obj))
    path = tmp_path / f"libtoy.{kind}"
    if kind == "so":
        _cc("-shared", str(obj), "-o", str(path))
    else:
        subprocess.run(["ar", "rcs", str(path), str(obj)], check=True)
    lib = declare_dense(tirbyoc.Library(f"pre{kind}", libraries=[str(path)], cdef=TOY_H))
    assert tirbyoc.check(lib)
    ex = tirbyoc.compile(mod, libraries=[lib])
    report = tirbyoc.explain(mod, libraries=[lib])
    assert by_library(report) == {f"pre{kind}": ["toy_dense_bias", "toy_dense_bias_relu"]}
    assert np.abs(tirbyoc.run(ex, x) - ref).max() <= TOL * max(1.0, np.abs(ref).max())
    # exported: the .a is linked in; the .so is opened from where it is
    out = run_fresh(tmp_path, ex, x)
    assert np.abs(out - ref).max() <= TOL * max(1.0, np.abs(ref).max())


# ---- check ----

def test_check_passes_the_right_library(toy):
    report = tirbyoc.check(toy)
    print(report)
    assert report.ok and len(report.kernels) == 3
    assert all(k.cases >= 8 for k in report.kernels)


def test_check_fails_a_kernel_declared_with_a_relu_it_does_not_apply():
    lib = tirbyoc.Library("wrong", sources=[TOY_C], cdef=TOY_H)
    lib.kernel("toy_dense_bias", computes=ops.dense(epilogue=("bias", "relu")),
               args=DENSE_ARGS)
    report = tirbyoc.check(lib)
    print(report)
    assert not report.ok
    (k,) = report.kernels
    assert k.failures > 0 and k.first is not None
    assert "TVM's is 0.0" in k.first.detail  # a negative sum the kernel did not clamp
    assert "FAILED" in str(report) and "m=" in str(report)


def test_check_fails_a_wrong_weight_layout():
    lib = tirbyoc.Library("wrongconv", sources=[TOY_C], cdef=TOY_H)
    lib.kernel("toy_conv2d_bias_relu",
               computes=ops.conv2d(weight="OIHW", epilogue=("bias", "relu"), stride=1,
                                   dilation=1, groups=1), args=CONV_ARGS)
    report = tirbyoc.check(lib)
    assert not report.ok, report


# ---- errors ----

def test_a_failing_kernel_raises_naming_library_symbol_and_status(mlp):
    mod, x, _ = mlp
    lib = tirbyoc.Library("failing", sources=[TOY_C], cdef=TOY_H)
    lib.kernel("toy_dense_fails", computes=ops.dense(epilogue=("bias",)), args=DENSE_ARGS)
    ex = tirbyoc.compile(mod, libraries=[lib])
    with pytest.raises(RuntimeError, match="kernel toy_dense_fails of library failing "
                                           "failed with status 7"):
        tirbyoc.run(ex, x)


def test_a_void_kernel(mlp):
    mod, x, ref = mlp
    lib = tirbyoc.Library("voidlib", sources=[TOY_C], cdef=TOY_H)
    lib.kernel("toy_dense_bias_void", computes=ops.dense(epilogue=("bias",)),
               args=DENSE_ARGS)
    assert tirbyoc.check(lib)
    report = tirbyoc.explain(mod, libraries=[lib])
    assert by_library(report) == {"voidlib": ["toy_dense_bias_void"] * 2}
    out = tirbyoc.run(tirbyoc.compile(mod, libraries=[lib]), x)
    assert np.abs(out - ref).max() <= TOL * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("symbol, computes, args, message", [
    ("toy_dense_bias", ops.dense(epilogue=("bias",)), DENSE_ARGS + ("lda",),
     "args names 8 roles, the cdef's prototype takes 7 arguments"),
    ("toy_dense_bias", ops.dense(epilogue=("bias",)), ("x", "weight", "bias", "y", "m", "n",
                                                      "kk"), "unknown role(s) ['kk']"),
    ("toy_dense_bias", ops.dense(epilogue=("bias",)), ("x", "weight", "bias", "y", "m", "n",
                                                      "lda"), "lack the role(s) ['k']"),
    ("toy_dense_bias", ops.dense(epilogue=("bias",)), ("x", "weight", "bias", "m", "y", "n",
                                                      "k"),
     "argument 3 (m): a size needs an integer type, the cdef has `float *`"),
    ("toy_dense_bias", ops.dense(epilogue=("bias",)), ("x", "weight", "bias", "y", "m", "n",
                                                      "k") + (), None),
    ("toy_nope", ops.dense(epilogue=("bias",)), DENSE_ARGS,
     "the cdef declares no function 'toy_nope'"),
    ("toy_conv2d_bias_relu", ops.conv2d(epilogue=("bias", "relu")), CONV_ARGS,
     "'stride (or stride_h and stride_w, or a stride= constraint)', "
     "'dilation (or dilation_h"),
])
def test_declarations_are_checked_against_the_cdef(symbol, computes, args, message):
    lib = tirbyoc.Library("decl", sources=[TOY_C], cdef=TOY_H)
    if message is None:
        lib.kernel(symbol, computes=computes, args=args)
        return
    with pytest.raises(tirbyoc.LibraryError) as err:
        lib.kernel(symbol, computes=computes, args=args)
    assert message in str(err.value)


def test_pointer_types_are_checked():
    lib = tirbyoc.Library("dbl", sources=[TOY_C], cdef="int f(double *x, const float *w, "
                          "const float *b, float *y, int m, int n, int k);")
    with pytest.raises(tirbyoc.LibraryError, match=r"argument 0 \(x\): a float32 tensor "
                                                    r"needs `float \*`"):
        lib.kernel("f", computes=ops.dense(epilogue=("bias",)), args=DENSE_ARGS)


def test_bad_library_inputs():
    with pytest.raises(tirbyoc.LibraryError, match="no file"):
        tirbyoc.Library("x", sources=["/nonexistent.c"], cdef=TOY_H)
    with pytest.raises(tirbyoc.LibraryError, match="C identifier"):
        tirbyoc.Library("my-lib", sources=[TOY_C], cdef=TOY_H)
    with pytest.raises(ValueError, match="unknown epilogue step"):
        ops.dense(epilogue=("bias", "swish"))
    with pytest.raises(ValueError, match="is not one of"):
        ops.conv2d(weight="HWOI")
    broken = tirbyoc.Library("broken", sources=[TOY_C], cdef=TOY_H,
                             extra_compile_args=["-DTOY_BROKEN", "-include", "/nonexistent.h"])
    broken.kernel("toy_dense_bias", computes=ops.dense(epilogue=("bias",)), args=DENSE_ARGS)
    with pytest.raises(tirbyoc.LibraryError, match="compiling .*toy.c failed"):
        broken.build()


# ---- the graph level ----

def test_composites_are_named_library_dot_kernel(toy, mlp):
    mod, x, ref = mlp
    part = tirbyoc.partition(mod, libraries=[toy])
    names = sorted(str(f.attrs["Composite"]) for _, f in part.functions_items()
                   if isinstance(f, tirbyoc._tvm.Function) and f.attrs and
                   "Composite" in f.attrs)
    assert names == ["toy.toy_dense_bias", "toy.toy_dense_bias_relu"]
    out = tirbyoc.run(tirbyoc.compile(part, libraries=[toy]), x)
    assert np.abs(out - ref).max() <= TOL * max(1.0, np.abs(ref).max())
    # the built-in library's composites keep their names
    names = sorted(str(f.attrs["Composite"]) for _, f in tirbyoc.partition(mod).functions_items()
                   if isinstance(f, tirbyoc._tvm.Function) and f.attrs and
                   "Composite" in f.attrs)
    assert names == ["tirbyoc.dense_bias", "tirbyoc.dense_bias_relu"]


# ---- the built-in library is declared the same way ----

def test_builtin_library_is_declared_through_the_same_api():
    from intrinsics import REGISTRY

    from tirbyoc import kernels

    lib = tirbyoc.builtin
    assert isinstance(lib, tirbyoc.Library) and lib.name == "tirbyoc"
    # the TIR matcher's order is the declarations' order, each intrinsic once
    declared = [k.matcher for k in lib.kernels if isinstance(k.matcher,
                                                             tirbyoc.intrinsic.Intrinsic)]
    assert [i.name for i in REGISTRY] == \
        ["matmul", "dense_bias_relu", "dense_bias_relu6", "dense_relu", "dense_bias",
         "dense_relu6", "dense"]
    assert all(any(i is d for d in declared) for i in REGISTRY)
    # every family the graph level offers is a declared kernel's
    assert tirbyoc.registry.Registry().builtin_families() == \
        {"conv2d", "max_pool2d", "attention", "softmax"}
    symbols = {k.symbol for k in lib.kernels}
    assert symbols <= set(kernels.exported_symbols())
    assert {"tirbyoc_dense_relu_f32_nt", "tirbyoc_matmul_f32", "tirbyoc_conv2d_f32",
            "tirbyoc_depthwise_conv2d_f32", "tirbyoc_max_pool2d_f32", "tirbyoc_softmax_f32",
            "tirbyoc_attention_f32"} <= symbols


def test_check_passes_the_builtin_library():
    report = tirbyoc.check(tirbyoc.builtin, cases=6)
    print(report)
    assert report.ok
    assert len(report.kernels) == len(tirbyoc.builtin.kernels) >= 30
    assert all(not k.skipped and k.cases >= 4 for k in report.kernels)
    assert "depthwise_conv2d_bias_relu6 (NCHW, OIHW)" in str(report)
    # a wrong declaration of a built-in kernel fails too: tirbyoc_dense_f32_nt with a
    # relu it does not apply
    lib = tirbyoc.builtin
    wrong = next(k for k in lib.kernels if k.symbol == "tirbyoc_dense_f32_nt" and
                 k.op.epilogue == ("bias",))
    from dataclasses import replace

    bad = replace(wrong, op=ops.dense(("bias", "relu"), weight="nt"))
    from tirbyoc.checking import check_matrix

    assert not check_matrix(bad, 6, 0).ok


def test_without_the_builtin_library_nothing_is_its():
    import torch

    net = _Net.build()
    mod = examples.import_torch(net, torch.randn(1, 3, 8, 8))
    toy = declare_conv(tirbyoc.Library("toy", sources=[TOY_C], cdef=TOY_H))
    report = tirbyoc.explain(mod, libraries=[toy], builtin=False)
    assert by_library(report) == {"toy": ["toy_conv2d_bias_relu"] * 3}
    out = tirbyoc.run(tirbyoc.compile(mod, libraries=[toy], builtin=False),
                      np.ones((1, 3, 8, 8), np.float32))
    with torch.no_grad():
        ref = net(torch.ones(1, 3, 8, 8)).numpy()
    assert np.abs(out - ref).max() <= TOL * max(1.0, np.abs(ref).max())


# ---- the other families: batched matmul, softmax, average pooling ----

def declare_more(lib):
    lib.kernel("toy_softmax", computes=ops.softmax(), args=("x", "y", "rows", "cols"))
    lib.kernel("toy_avg_pool2d", computes=ops.avg_pool2d(count_include_pad=False),
               args=("x", "y", "batch", "channels", "height", "width", "kernel_h",
                     "kernel_w", "stride", "pad"))
    lib.kernel("toy_bmm", computes=ops.matmul(weight="nn"),
               args=("x", "weight", "y", "batch", "m", "n", "k"))
    return lib


def test_softmax_pool_and_batched_matmul_kernels_of_a_library():
    import torch

    class Net(torch.nn.Module):
        def forward(self, a, b, img):
            scores = torch.softmax(torch.bmm(a, b), dim=-1)
            pooled = torch.nn.functional.avg_pool2d(img, 3, stride=2, padding=1,
                                                    count_include_pad=False)
            return scores, pooled

    args = (torch.randn(3, 8, 16), torch.randn(3, 16, 12), torch.randn(2, 4, 9, 9))
    with torch.no_grad():
        ep = torch.export.export(Net(), args)
    from tvm.relax.frontend.torch import from_exported_program

    mod = from_exported_program(ep)
    lib = declare_more(tirbyoc.Library("more", sources=[TOY_C], cdef=TOY_H))
    report = tirbyoc.explain(mod, libraries=[lib], builtin=False)
    print(report)
    assert by_library(report) == {"more": ["toy_avg_pool2d", "toy_bmm", "toy_softmax"]}
    out = tirbyoc.run(tirbyoc.compile(mod, libraries=[lib], builtin=False),
                      *[a.numpy() for a in args])
    with torch.no_grad():
        ref = Net()(*args)
    for got, want in zip(out, ref):
        assert np.abs(got - want.numpy()).max() <= TOL
    assert tirbyoc.check(lib, cases=6)


def test_a_declared_max_pool_reads_what_the_builtin_conv_writes_in_nchw():
    """ResNet's stem writes NCHW16c for the built-in max pool where the conv kernel has
    its direct path; with a library declaring a max pool, that kernel computes the pool
    and the built-in conv before it writes NCHW, the layout the declaration reads."""
    import torch

    model = examples.resnet_torch((1, 1), (16, 32), 10)
    x = torch.randn(1, 3, 40, 40, generator=torch.Generator().manual_seed(0))
    mod = examples.import_torch(model, x)
    lib = tirbyoc.Library("pools", sources=[TOY_C], cdef=TOY_H)
    lib.kernel("toy_max_pool2d", computes=ops.max_pool2d(),
               args=("x", "y", "batch", "channels", "height", "width", "kernel_h",
                     "kernel_w", "stride", "pad"))
    stem = "tirbyoc_conv2d"
    blocked = tirbyoc.kernels.isa() in tirbyoc.kernels.CONV_DIRECT_ISAS
    alone = tirbyoc.explain(mod)
    assert alone.schedules[stem] == "kernel tirbyoc_conv2d_f32_packed" + (
        "_layouts" if blocked else "")
    assert alone.schedules["tirbyoc_max_pool2d"] == "kernel tirbyoc_max_pool2d_f32" + (
        "_layouts" if blocked else "")
    report = tirbyoc.explain(mod, libraries=[lib])
    assert report.schedules[stem] == "kernel tirbyoc_conv2d_f32_packed", str(report)
    assert by_library(report)["pools"] == ["toy_max_pool2d"]
    out = tirbyoc.run(tirbyoc.compile(mod, libraries=[lib]), x.numpy())
    with torch.no_grad():
        ref = model(x).numpy()
    assert np.abs(out - ref).max() <= TOL * max(1.0, np.abs(ref).max())


def test_a_pool_the_kernel_cannot_say_stays_with_the_builtin_library():
    import torch

    class Net(torch.nn.Module):
        def forward(self, img):  # counts the padding: not what toy_avg_pool2d computes
            return torch.nn.functional.avg_pool2d(img, 3, stride=2, padding=1)

    img = torch.randn(1, 2, 8, 8)
    with torch.no_grad():
        ep = torch.export.export(Net(), (img,))
    from tvm.relax.frontend.torch import from_exported_program

    mod = from_exported_program(ep)
    lib = declare_more(tirbyoc.Library("more", sources=[TOY_C], cdef=TOY_H))
    assert not tirbyoc.explain(mod, libraries=[lib]).offloaded
    out = tirbyoc.run(tirbyoc.compile(mod, libraries=[lib]), img.numpy())
    out = out[0] if isinstance(out, list) else out
    assert np.abs(out - Net()(img).numpy()).max() <= TOL


def test_a_compiled_model_runs_from_many_threads(toy, mlp):
    from concurrent.futures import ThreadPoolExecutor

    mod, x, ref = mlp
    ex = tirbyoc.compile(mod, libraries=[toy])

    def one(i):
        return tirbyoc.run(ex, x * (1 + i % 3))

    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(one, range(24)))
    layers = examples.mlp_weights()
    for i, out in enumerate(outs):
        want = examples.mlp_numpy(x * (1 + i % 3), layers)
        assert np.abs(out - want).max() <= TOL * max(1.0, np.abs(want).max())


def test_an_attention_kernel_of_a_library_is_refused_clearly():
    lib = tirbyoc.Library("att", sources=[TOY_C],
                          cdef="int att(const float *q, const float *k, const float *v, "
                               "float *y, int b, int m, int n, int d, int dv);")
    with pytest.raises(tirbyoc.LibraryError, match="attention kernels of a library are not "
                                                    "matched yet"):
        lib.kernel("att", computes=ops.attention(),
                   args=("q", "k", "v", "y", "batch", "seq_q", "seq_k", "head_dim",
                         "value_dim"))


def test_a_gelu_epilogue_written_as_several_blocks():
    """PyTorch's GELU legalizes to several blocks (erf, multiplies, adds): the declared
    ``dense + bias + gelu`` takes them all; ``check`` agrees with TVM's build."""
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.GELU(),
                              torch.nn.Linear(40, 8)).eval()
    x = torch.randn(5, 24)
    mod = examples.import_torch(net, x)
    lib = tirbyoc.Library("gelu", sources=[TOY_C], cdef=TOY_H)
    lib.kernel("toy_dense_bias_gelu", computes=ops.dense(epilogue=("bias", "gelu")),
               args=DENSE_ARGS)
    report = tirbyoc.explain(mod, libraries=[lib])
    print(report)
    assert by_library(report) == {"gelu": ["toy_dense_bias_gelu"],
                                  "tirbyoc": ["tirbyoc_dense_f32_packed"]}
    _matches_pytorch_and_checks(mod, lib, net, x)


def _matches_pytorch_and_checks(mod, lib, net, x):
    """The build with ``lib`` gives PyTorch's result (TOL); ``check`` passes ``lib``."""
    import torch

    out = tirbyoc.run(tirbyoc.compile(mod, libraries=[lib]), x.numpy())
    out = out[0] if isinstance(out, list) else out
    with torch.no_grad():
        ref = net(x).numpy()
    assert np.abs(out - ref).max() <= TOL * max(1.0, np.abs(ref).max())
    assert tirbyoc.check(lib, cases=8)


def test_a_hardswish_epilogue_written_as_several_blocks():
    """PyTorch's hardswish legalizes to five blocks (add, two clips, multiply, divide):
    the declared ``dense + bias + hardswish`` takes them all (MobileNetV3's classifier);
    a near miss (``clip(v + 3, 0, 6) / 5``) stays TVM's; ``check`` agrees with TVM."""
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(24, 40), torch.nn.Linear(40, 8)

        def forward(self, x):
            v = self.b(torch.nn.functional.hardswish(self.a(x)))
            return v * torch.clamp(v + 3, 0, 6) / 5

    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(5, 24) * 3
    mod = examples.import_torch(net, x)
    lib = tirbyoc.Library("hard", sources=[TOY_C], cdef=TOY_H)
    lib.kernel("toy_dense_bias_hardswish",
               computes=ops.dense(epilogue=("bias", "hardswish")), args=DENSE_ARGS)
    report = tirbyoc.explain(mod, libraries=[lib])
    assert by_library(report) == {"hard": ["toy_dense_bias_hardswish"],
                                  "tirbyoc": ["tirbyoc_dense_f32_packed"]}, str(report)
    _matches_pytorch_and_checks(mod, lib, net, x)


def test_libraries_are_tried_in_the_order_given(mlp):
    mod, x, ref = mlp
    first = tirbyoc.Library("first", sources=[TOY_C], cdef=TOY_H)
    first.kernel("toy_dense_bias", computes=ops.dense(epilogue=("bias",)), args=DENSE_ARGS)
    second = declare_dense(tirbyoc.Library("second", sources=[TOY_C], cdef=TOY_H))
    # first's dense_bias takes the bias of both layers (the relu then stays TVM's)
    assert by_library(tirbyoc.explain(mod, libraries=[first, second])) == \
        {"first": ["toy_dense_bias", "toy_dense_bias"]}
    # the other way round, second's kernels take both layers whole
    assert by_library(tirbyoc.explain(mod, libraries=[second, first])) == \
        {"second": ["toy_dense_bias", "toy_dense_bias_relu"]}
    for libs in ([first, second], [second, first]):
        out = tirbyoc.run(tirbyoc.compile(mod, libraries=libs), x)
        assert np.abs(out - ref).max() <= TOL * max(1.0, np.abs(ref).max())
    with pytest.raises(ValueError, match="two libraries of the same name"):
        tirbyoc.explain(mod, libraries=[first, first])
