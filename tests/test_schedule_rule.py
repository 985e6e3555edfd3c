"""tirbyoc as an s_tir.dlight schedule rule, next to TVM's own rules."""

import numpy as np
import tvm
import tvm.s_tir.dlight as dl

import tirbyoc

from . import tir_forms as F


class _Recorder(dl.ScheduleRule):
    """A fallback rule that records which functions reached it."""

    def __init__(self):
        self.seen = []

    def apply(self, func, target, tunable):
        self.seen.append(func)
        return None


def test_rule_offloads_matches_and_passes_the_rest_on():
    mod = tvm.IRModule({"dense": F.nt_bias_relu, "scaled": F.extra_scale})
    fallback = _Recorder()
    with tvm.target.Target("llvm"):
        out = dl.ApplyDefaultSchedule(tirbyoc.ScheduleRule(), fallback)(mod)
    assert tirbyoc.offloaded_kernels(out["dense"]) == ["tirbyoc_dense_relu_f32_nt"]
    assert out["dense"].attrs["tirx.is_scheduled"]
    # the function tirbyoc does not match went on to the next rule, unchanged
    assert len(fallback.seen) == 1
    tvm.ir.assert_structural_equal(fallback.seen[0], F.extra_scale)
    tvm.ir.assert_structural_equal(out["scaled"], F.extra_scale)


def test_rule_returns_none_when_nothing_matches_and_traces_what_it_did():
    rule = tirbyoc.ScheduleRule()
    assert rule.apply(F.float16_dense, tvm.target.Target("llvm"), False) is None
    sch = rule.apply(F.prefix_then_tanh, tvm.target.Target("llvm"), False)
    trace = str(sch.trace)
    assert "annotate" in trace
    assert "mm + bias + relu + tanh -> tirbyoc_matmul_f32" in trace
    # the result is the same as the pass's
    offloaded = tirbyoc.apply_tir_byoc(tvm.IRModule({"main": F.prefix_then_tanh}))["main"]
    assert sch.mod["main"].with_attr("tirx.is_scheduled", True).script() == offloaded.script()


def test_scheduled_module_runs():
    mod = tvm.IRModule({"main": F.nt_bias_relu})
    with tvm.target.Target("llvm"):
        out = dl.ApplyDefaultSchedule(tirbyoc.ScheduleRule())(mod)
    ex = tirbyoc.compile(out)
    rng = np.random.default_rng(9)
    a, w, b = (rng.standard_normal(s, np.float32) for s in ((64, 80), (50, 80), (50,)))
    o = tvm.runtime.tensor(np.zeros((64, 50), np.float32))
    ex["main"](*[tvm.runtime.tensor(v) for v in (a, w, b)], o)
    ref = np.maximum(a.astype(np.float64) @ w.T + b, 0)
    np.testing.assert_allclose(o.numpy(), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
