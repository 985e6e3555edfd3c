"""MetaSchedule tunes what tirbyoc left to TVM; offloaded blocks stay kernel calls."""

import numpy as np
import pytest
import tvm
from tvm import relax

import tirbyoc
from tirbyoc import tuning


def _dense_then_sum(rng):
    w, b = rng.standard_normal((12, 16), np.float32), rng.standard_normal(12, np.float32)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(x, relax.op.permute_dims(relax.const(w), [1, 0])))
            h = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(h, relax.const(b)))))
            # a row reduction tirbyoc does not offload: MetaSchedule's to tune
            out = bb.emit_output(bb.emit(relax.op.sum(h, axis=[1])))
        bb.emit_func_output(out)
    return bb.get(), w, b


def test_tuning_keeps_offloaded_blocks(tmp_path):
    rng = np.random.default_rng(11)
    mod, w, b = _dense_then_sum(rng)
    offloaded = tirbyoc.apply_tir_byoc(mod)
    assert tirbyoc.offloaded_kernels(offloaded) == ["tirbyoc_dense_relu_f32_packed"]
    offloaded = tvm.transform.Sequential(
        tvm.relax.backend.cpu_generic.pipeline.legalize_passes(None))(offloaded)
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    # the rest of the model is there to tune; the kernel's function is not a task
    assert [t.task_name for t in tuning.tuning_tasks(offloaded, target)] == ["sum"]
    # (the four trials in one round: each round starts fresh builder workers, 6-12 s)
    db = tirbyoc.tune(offloaded, target, str(tmp_path), max_trials_global=4,
                      num_trials_per_iter=4, cost_model="random", strategy="replay-trace", seed=0)
    # candidates were built and measured (the builder's workers once timed out on every
    # one, and tuning tuned nothing)
    records = db.get_all_tuning_records()
    assert records and all(r.run_secs and float(r.run_secs[0]) < 1e9 for r in records)
    with target, db, tvm.transform.PassContext(opt_level=3):
        tuned = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(offloaded)
    # the offloaded function comes back exactly as it was: still the kernel call; the sum
    # got the database's schedule
    for gv, func in offloaded.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc) and tirbyoc.offloaded_kernels(func):
            tvm.ir.assert_structural_equal(tuned[gv.name_hint], func)
    with pytest.raises(ValueError):
        tvm.ir.assert_structural_equal(tuned["sum"], offloaded["sum"])
    assert tirbyoc.offloaded_kernels(tuned) == ["tirbyoc_dense_relu_f32_packed"]
    xs = rng.standard_normal((8, 16), np.float32)
    ref = np.maximum(xs.astype(np.float64) @ w.T + b, 0).sum(1)
    got = tirbyoc.run(tvm.compile(tuned, target=target), xs)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_cheap_stack_is_the_stack_tvmscript_reads():
    """TVMScript's decorators read each frame's frame, file, line, function and source
    line; the cheap stack (which imports the tensor intrinsics) gives the same."""
    import inspect

    def inner():
        return inspect.stack(), tuning._cheap_stack()

    def outer():
        return inner()

    full, cheap = outer()
    assert len(full) == len(cheap) > 3
    for a, b in zip(full, cheap):
        assert (a.frame, a.filename, a.lineno, a.function, a.code_context) == \
               (b.frame, b.filename, b.lineno, b.function, b.code_context)
    saved = inspect.stack
    tuning.import_tensor_intrinsics()
    from tvm.s_tir import TensorIntrin
    assert TensorIntrin.get("dot_16x4_vnni") is not None
    assert inspect.stack is saved
