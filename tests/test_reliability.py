"""Reliability: a compiled model under concurrency and fork, repeated and foreign input,
bad input at run time, kernel errors, and NaN/Inf semantics.

Each test here pins a defect that was found (and fixed) or a promise docs/reliability.md makes:
  * many threads, each with its own VirtualMachine over one ``tirbyoc.compile`` result,
    never crash and never return a wrong number (``tests/stress_concurrency.py``, run in
    a child process because the failure it looks for is a crash);
  * ``apply_tir_byoc`` and ``tirbyoc.compile`` accept a module that was offloaded already;
  * what another codegen claimed leaves no dead PrimFuncs behind and is not reported;
  * wrong shapes, dtypes and argument counts raise Python exceptions; a kernel's error
    status raises a RuntimeError that names the kernel and the reason;
  * NaN and Inf propagate as in PyTorch (relu(NaN) is NaN).

Numerics: rtol 1e-4 with an absolute floor of 1e-4 * max|reference|.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

import tirbyoc
from tirbyoc import examples

from . import tir_forms
from .fresh import without_torch

HERE = Path(__file__).resolve().parent
RTOL = 1e-4
# Longer stress runs: TIRBYOC_STRESS_CALLS=2000 python -m pytest tests/test_reliability.py
STRESS_CALLS = int(os.environ.get("TIRBYOC_STRESS_CALLS", "40"))
STRESS_THREADS = 8


def assert_close(got, ref):
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=RTOL * float(np.abs(ref).max()))


def _run_stress(*args, threads=None):
    env = dict(os.environ)
    if threads is not None:
        env["TIRBYOC_NUM_THREADS"] = str(threads)
    proc = subprocess.run([sys.executable, str(HERE / "stress_concurrency.py"), *args],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, (
        f"exit status {proc.returncode} (negative: killed by a signal)\n"
        f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()


@pytest.mark.parametrize("pool", [2, 1], ids=["kernel-pool", "no-pool"])
def test_many_threads_share_one_executable(pool):
    lines = _run_stress("threads", "--threads", str(STRESS_THREADS), "--calls",
                        str(STRESS_CALLS), threads=pool)
    assert lines[-1] == f"ok {STRESS_THREADS * STRESS_CALLS}"
    # both weight paths were exercised: packed constants and weights passed as inputs
    assert "tirbyoc_dense_relu_f32_packed" in lines[-2] and "tirbyoc_dense_f32_nt" in lines[-2]


def test_fork_after_the_kernel_pool_was_used():
    assert _run_stress("fork", threads=2)[-1] == "ok fork"


def _without_kernels(mod):
    return mod.without_attr("external_mods")


def test_offloading_twice_changes_nothing_and_compiles():
    layers = examples.mlp_weights((40, 30, 20))
    mod = examples.mlp_relax(6, layers)
    once = tirbyoc.apply_tir_byoc(mod)
    twice = tirbyoc.apply_tir_byoc(once)
    tvm.ir.assert_structural_equal(_without_kernels(twice), _without_kernels(once))
    assert len(twice.attrs["external_mods"]) == 1  # the kernel library is attached once
    assert tirbyoc.offloaded_kernels(twice) == ["tirbyoc_dense_f32_packed",
                                                "tirbyoc_dense_relu_f32_packed"]
    report = tirbyoc.explain(once)
    assert len(report.offloaded) == 2 and not report.rejected
    assert all(r.detail == "offloaded earlier" for r in report.offloaded)
    x = np.random.default_rng(0).standard_normal((6, 40), np.float32)
    for already in (once, twice):
        assert_close(tirbyoc.run(tirbyoc.compile(already), x), examples.mlp_numpy(x, layers))


def _claimed_by_another_codegen():
    """The 12 -> 8 -> 4 MLP where ``mylib`` claimed the first layer with annotate_codegen."""
    from tvm.relax.dpl import is_op, wildcard

    mod = examples.mlp_relax(4, examples.mlp_weights((12, 8, 4)), bind_weights=False)
    layer = is_op("relax.nn.relu")(is_op("relax.add")(
        is_op("relax.matmul")(wildcard(), is_op("relax.permute_dims")(wildcard())), wildcard()))
    pattern = relax.transform.FusionPattern("mylib.dense_bias_relu", layer)
    return relax.transform.FuseOpsByPattern([pattern], annotate_codegen=True)(mod)


@pytest.mark.parametrize("legalized", [False, True], ids=["as-written", "legalized-first"])
def test_another_codegens_region_leaves_no_dead_functions(legalized):
    if legalized:
        mod = examples.mlp_relax(4, examples.mlp_weights((12, 8, 4)), bind_weights=False)
        mod = relax.transform.LegalizeOps()(mod)
        from tvm.relax.dpl import is_call_tir, wildcard

        layer = is_call_tir("relu", [is_call_tir("add", [
            is_call_tir("matmul", [wildcard(), wildcard()]), wildcard()])])
        mod = relax.transform.FuseOpsByPattern(
            [relax.transform.FusionPattern("mylib.dense_bias_relu", layer)],
            annotate_codegen=True)(mod)
    else:
        mod = _claimed_by_another_codegen()
    codegen = [gv for gv, f in mod.functions_items()
               if isinstance(f, relax.Function) and f.attrs and "Codegen" in f.attrs]
    assert len(codegen) == 1
    out = tirbyoc.apply_tir_byoc(mod)
    # every PrimFunc is called by a Relax function of the output
    called = set()
    for _, func in out.functions_items():
        if isinstance(func, relax.Function):
            tvm_ffi.structural_walk(func, [(tvm.ir.GlobalVar,
                                            lambda gv: called.add(gv.name_hint))])
    prim_funcs = {gv.name_hint for gv, f in out.functions_items()
                  if isinstance(f, tvm.tirx.PrimFunc)}
    assert prim_funcs <= called, f"dead PrimFuncs: {sorted(prim_funcs - called)}"
    # only the second layer runs in the kernel library, and only it is reported
    assert tirbyoc.offloaded_kernels(out) == ["tirbyoc_dense_f32_nt"]
    report = tirbyoc.explain(mod)
    assert [r.kernel for r in report.offloaded] == ["tirbyoc_dense_f32_nt"]
    tvm.ir.assert_structural_equal(out[codegen[0].name_hint], mod[codegen[0]])


@pytest.mark.parametrize("batch", [4, None], ids=["static", "symbolic"])
def test_bad_inputs_raise_python_exceptions(batch):
    layers = examples.mlp_weights((12, 8, 4))
    ex = tirbyoc.compile(examples.mlp_relax(batch, layers, bind_weights=False))
    (w0, b0), (w1, b1) = layers
    x = np.random.default_rng(1).standard_normal((4, 12), np.float32)
    assert_close(tirbyoc.run(ex, x, w0, b0, w1, b1), examples.mlp_numpy(x, layers))
    bad = {
        "activation width": ([np.zeros((4, 13), np.float32), w0, b0, w1, b1], "13 vs. 12"),
        "weight shape": ([x, w0[:, :11].copy(), b0, w1, b1], "11 vs. 12"),
        "bias shape": ([x, w0, b0[:7].copy(), w1, b1], "7 vs. 8"),
        "dtype": ([x.astype(np.float64), w0, b0, w1, b1], "dtype"),
        "rank": ([x[None], w0, b0, w1, b1], "ndim"),
        "argument count": ([x, w0, b0], "expects 5 arguments"),
    }
    for what, (args, message) in bad.items():
        with pytest.raises(Exception, match=re.escape(message)):
            tirbyoc.run(ex, *args)
        print(f"{what}: raised")
    # the executable still works after the errors
    assert_close(tirbyoc.run(ex, x, w0, b0, w1, b1), examples.mlp_numpy(x, layers))


def test_bad_inputs_to_a_tir_only_module_raise():
    func = tirbyoc.compile(tvm.IRModule({"main": tir_forms.nt_bias_relu})).jit()["main"]
    a, w, b, o = (np.ones(s, np.float32) for s in ((64, 80), (50, 80), (50,), (64, 50)))
    out = tvm.runtime.tensor(o)
    func(*[tvm.runtime.tensor(v) for v in (a, w, b)], out)
    np.testing.assert_array_equal(out.numpy(), 81.0)  # relu(80 ones . ones + 1)
    for args in ([a[:, :79].copy(), w, b, o], [a.astype(np.float64), w, b, o], [a, w, b]):
        with pytest.raises((TypeError, ValueError, RuntimeError)):
            func(*[tvm.runtime.tensor(v) for v in args])


def test_kernel_error_status_is_a_runtime_error_naming_kernel_and_reason():
    """The status checks of an offloaded block, in compiled code: a call whose row stride is
    too small (the generated code with one argument changed) raises, writes nothing."""
    offloaded = tirbyoc.apply_tir_byoc(tvm.IRModule({"main": tir_forms.nt_bias_relu}))
    script = offloaded["main"].script()
    lda = "A.data, 0, 5120, 1), T.int64(80)"
    assert script.count(lda) == 1
    broken = tvm.script.from_source(script.replace(lda, "A.data, 0, 5120, 1), T.int64(79)"))
    func = tirbyoc.compile(tvm.IRModule({"main": broken})).jit()["main"]
    ins = [np.ones(s, np.float32) for s in ((64, 80), (50, 80), (50,))]
    out = tvm.runtime.tensor(np.full((64, 50), 7.0, np.float32))
    with pytest.raises(RuntimeError, match="kernel tirbyoc_dense_relu_f32_nt failed: a row "
                                           "stride is smaller than its row length"):
        func(*[tvm.runtime.tensor(v) for v in ins], out)
    assert (out.numpy() == 7.0).all()


def test_kernel_wrapper_errors_name_the_reason():
    from tirbyoc import kernels

    assert kernels.status_message(kernels.TIRBYOC_ESTRIDE) == \
        "a row stride is smaller than its row length"
    assert kernels.status_message(12345) == "unknown status"
    with pytest.raises(ValueError):  # the wrapper checks before calling
        kernels.dense(np.ones((2, 3), np.float32), np.ones((4, 5), np.float32))


def _nan_inf_inputs(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    picks = rng.choice(flat.size, size=max(3, flat.size // 20), replace=False)
    flat[picks] = rng.choice([np.nan, np.inf, -np.inf], size=picks.size)
    return x


@pytest.mark.parametrize("activation", ["relu", "relu6"])
def test_nan_and_inf_propagate_as_in_pytorch(activation):
    torch = pytest.importorskip("torch")
    layers = examples.mlp_weights((16, 24, 8))
    mod = examples.mlp_relax(10, layers, activation=activation, activation_last=True)
    kernels = tirbyoc.offloaded_kernels(tirbyoc.apply_tir_byoc(mod))
    assert kernels == [f"tirbyoc_dense_{activation}_f32_packed"] * 2
    x = _nan_inf_inputs(np.random.default_rng(7), (10, 16))
    got = tirbyoc.run(tirbyoc.compile(mod), x)
    act = torch.nn.ReLU() if activation == "relu" else torch.nn.ReLU6()
    model = torch.nn.Sequential(torch.nn.Linear(16, 24), act, torch.nn.Linear(24, 8), act)
    with torch.no_grad():
        for lin, (w, b) in zip([model[0], model[2]], layers):
            lin.weight.copy_(torch.from_numpy(w))
            lin.bias.copy_(torch.from_numpy(b))
        ref = model(torch.from_numpy(x)).numpy()
    assert np.isnan(ref).any() and np.isfinite(ref).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
    finite = np.isfinite(ref)
    assert_close(got[finite], ref[finite])
    # TVM's own build of max(x, 0) swallows the NaN: the documented difference
    default = tirbyoc.run(tvm.compile(mod, target="llvm"), x)
    assert not np.isnan(default).any()


def test_test_extra_declares_what_the_tests_need():
    """Regression: MetaSchedule's worker pool imports cloudpickle, which TVM does not
    install; every package the tests need must come from the project's own files."""
    import tomllib
    from importlib import metadata

    project = tomllib.loads((HERE.parent / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + project["optional-dependencies"]["test"]
    wanted = set()
    todo = [re.split(r"[\s<>=!~\[;]", d, maxsplit=1)[0] for d in declared]
    while todo:  # the closure of what the declared packages require
        name = todo.pop().lower().replace("_", "-")
        if name in wanted:
            continue
        wanted.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [re.split(r"[\s<>=!~\[;(]", r, maxsplit=1)[0] for r in requires
                 if "extra ==" not in r]
    needed = {"cloudpickle", "torch", "onnx", "nbclient", "pytest", "numpy", "cffi"}
    assert needed <= wanted, f"not installed by `pip install -e .[test]`: {needed - wanted}"


@pytest.mark.parametrize("preset", [None, "TVM_NUM_THREADS", "OMP_NUM_THREADS"])
def test_tvm_runs_on_as_many_threads_as_the_kernels(preset):
    """Importing tirbyoc sets TVM_NUM_THREADS to the kernel library's thread count (TVM
    would use half the CPUs), unless the user set TVM's count already."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    env["TIRBYOC_NUM_THREADS"] = "2"  # TVM would take 1 on a 2-CPU machine
    if preset:
        env[preset] = "1"
    code = ("import os, tvm, tirbyoc, tirbyoc.kernels\n"
            "print(os.environ.get('TVM_NUM_THREADS'), "
            "tvm.get_global_func('runtime.NumThreads')(), tirbyoc.kernels.num_threads())")
    out = subprocess.run([sys.executable, "-c", without_torch(code)], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()
    cpus = min(2, len(os.sched_getaffinity(0)))  # TVM uses no more workers than cores
    if preset is None:
        assert out == ["2", str(cpus), "2"]
    else:  # the user's setting stands
        assert out[1:] == ["1", "2"]


@pytest.mark.parametrize("preset", [None, "500"])
@pytest.mark.parametrize("variable", ["TVM_THREAD_POOL_SPIN_COUNT", "TVM_BIND_THREADS"])
def test_tvm_workers_neither_spin_nor_bind(variable, preset):
    """Importing tirbyoc sets TVM_THREAD_POOL_SPIN_COUNT to 0 (TVM's workers would spin
    for 300,000 yields after each parallel loop, on the cores the kernels' threads use)
    and TVM_BIND_THREADS to 0 (TVM would bind the thread starting its pool to its first
    CPUs, and the kernels' workers that thread creates would inherit it), unless the user
    set them."""
    env = {k: v for k, v in os.environ.items() if k != variable}
    if preset:
        env[variable] = preset
    code = f"import os, tirbyoc\nprint(os.environ.get('{variable}'))"
    out = subprocess.run([sys.executable, "-c", without_torch(code)], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()
    assert out == [preset or "0"]
