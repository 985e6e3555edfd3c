"""MetaSchedule tunes what tirbyoc left to TVM; offloaded blocks stay kernel calls."""

import numpy as np
import tvm
from tvm import relax
from tvm.s_tir import meta_schedule as ms

import tirbyoc


def test_tuning_keeps_offloaded_blocks(tmp_path):
    rng = np.random.default_rng(11)
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
    offloaded = tirbyoc.apply_tir_byoc(bb.get())
    assert tirbyoc.offloaded_kernels(offloaded) == ["tirbyoc_dense_relu_f32_packed"]
    offloaded = tvm.transform.Sequential(
        tvm.relax.backend.cpu_generic.pipeline.legalize_passes(None))(offloaded)
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    tasks = {t.task_name for t in ms.relax_integration.extract_tasks(offloaded, target)}
    assert "sum" in tasks  # the rest of the model is there to tune
    db = ms.relax_integration.tune_relax(
        mod=offloaded, params={}, target=target, work_dir=str(tmp_path), max_trials_global=4,
        num_trials_per_iter=2, cost_model="random", strategy="replay-trace", seed=0)
    with target, db, tvm.transform.PassContext(opt_level=3):
        tuned = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(offloaded)
    # the offloaded function comes back exactly as it was: still the kernel call
    for gv, func in offloaded.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc) and tirbyoc.offloaded_kernels(func):
            tvm.ir.assert_structural_equal(tuned[gv.name_hint], func)
    assert tirbyoc.offloaded_kernels(tuned) == ["tirbyoc_dense_relu_f32_packed"]
    xs = rng.standard_normal((8, 16), np.float32)
    ref = np.maximum(xs.astype(np.float64) @ w.T + b, 0).sum(1)
    got = tirbyoc.run(tvm.compile(tuned, target=target), xs)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
