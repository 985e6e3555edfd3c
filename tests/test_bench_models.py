"""The model benchmark runs end to end on tiny models (no timing assertions: speed is
the benchmark's output, not a test); its numerics check is real (1e-4 of max|ref|)."""

import json
import math
import statistics

import numpy as np
import pytest

import torch  # noqa: E402  (the test extra installs it)

from tirbyoc import __main__ as cli
from tirbyoc import bench_models, examples


def _tiny_specs():
    return [bench_models.ModelSpec("tiny_gpt2", lambda: examples.gpt2_block_torch(32, 2),
                                   lambda s: (1, s, 32), seqs=(5, 9), static_seq=8),
            bench_models.ModelSpec("tiny_mlp", lambda: torch.nn.Sequential(
                torch.nn.Linear(20, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).eval(),
                lambda s: (4, 20))]


def test_models_benchmark_rows_are_complete(tmp_path):
    rows = []
    for spec in _tiny_specs():
        rows += bench_models.bench_torch_model(spec, threads=2, reps=2, tvm_reps=1,
                                               with_tvm=True, settle=0.0, progress=lambda s: None)
    # the transformer: static, then its dynamic build at two lengths; the MLP: static
    assert [(r["model"], r["shape"][1]) for r in rows] == [
        ("tiny_gpt2", 8), ("tiny_gpt2 (dynamic seq)", 5), ("tiny_gpt2 (dynamic seq)", 9),
        ("tiny_mlp", 20)]
    for r in rows:
        assert set(r["ms"]) == {"tirbyoc", "torch", "ort", "tvm"}
        assert all(math.isfinite(t) and t > 0 for t in r["ms"].values())
        # every round's time, the median of which is the row's (TVM's build: one round)
        assert {k: len(v) for k, v in r["rounds_ms"].items()} == {
            "tirbyoc": 2, "torch": 2, "ort": 2, "tvm": 1}
        assert all(math.isclose(r["ms"][k], statistics.median(v), rel_tol=1e-12)
                   for k, v in r["rounds_ms"].items())
        assert max(r["rel_err"].values()) < bench_models.RTOL, r["rel_err"]
        assert r["breakdown"] and all(t >= 0 for _, t in r["breakdown"])
        assert all(r["calls"][n] >= 1 for n, _ in r["breakdown"])
        assert r["instrument_overhead_us"] >= 0
        # the bytes of each TIR function's tensors; kernel calls are never flagged
        assert all(r["traffic_bytes"][n] > 0 for n, _ in r["breakdown"]
                   if not n.startswith("vm.builtin."))
        assert "slow" in r and not set(r["slow"]) & set(r["kernel_functions"])
    assert rows[0]["offloaded"].count("attention") == 1  # the whole attention, one call
    text = bench_models.report(rows, 2)
    assert "vs ort" in text and "where the time goes: tiny_gpt2" in text
    # the error column is tirbyoc's; a peer off the reference is named under the table
    # (TVM's own build of HiFi-GAN from ONNX: 5.2e-4, tirbyoc's 8.1e-7)
    off = dict(rows[0], rel_err={**rows[0]["rel_err"], "tvm": 5.2e-4})
    text = bench_models.report([off], 2)
    row = next(line for line in text.split("\n") if line.startswith("tiny_gpt2 "))
    assert f"{rows[0]['rel_err']['tirbyoc']:9.1e}" in row and "5.2e-04" not in row
    assert "peers' errors above 1e-04 of max|reference|: tiny_gpt2: tvm 5.2e-04" in text
    json_path, png_path = bench_models.write(rows, str(tmp_path), 2)
    assert json.load(open(json_path))["rows"][0]["model"] == "tiny_gpt2"


class _DataDependent(torch.nn.Module):
    """A branch on a tensor's value: torch.export refuses it."""

    def forward(self, x):
        return x * 2 if float(x.sum()) > 0 else x


def test_a_model_that_cannot_be_imported_is_reported_and_fails_the_run(monkeypatch, tmp_path,
                                                                       capsys):
    """Every model failing (here the only one) gives a FAILED footer and exit status 1, not
    a crash in the plot; bench_torch_model without a ``failed`` list raises."""
    spec = bench_models.ModelSpec("branchy", _DataDependent, lambda s: (2, 3))
    monkeypatch.setattr(bench_models, "_registry", lambda: {"branchy": spec})
    status = bench_models.run_models(["branchy"], threads=1, reps=1, with_tvm=False,
                                     settle=0.0, out=str(tmp_path))
    out = capsys.readouterr().out
    assert status == 1
    assert "no model ran" in out and "FAILED:" in out and "branchy (static)" in out
    assert not list(tmp_path.iterdir())  # no table or plot written for no rows
    with pytest.raises(Exception):
        bench_models.bench_torch_model(spec, threads=1, reps=1, tvm_reps=1, with_tvm=False,
                                       settle=0.0, progress=lambda s: None)


def test_bench_an_onnx_file(tmp_path, capsys):
    model = torch.nn.Sequential(torch.nn.Linear(12, 8), torch.nn.GELU(), torch.nn.Linear(8, 4))
    path = tmp_path / "tiny.onnx"
    torch.onnx.export(model.eval(), (torch.randn(3, 12),), str(path), input_names=["x"],
                      dynamic_axes={"x": {0: "batch"}}, dynamo=False)
    code = cli.main(["bench", str(path), "--shape", "x=5,12", "--reps", "2", "--settle", "0",
                     "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "tiny.onnx" in out and "5x12" in out and "where the time goes" in out
    assert "reference: the model in float64" in out


def test_float64_reference_of_an_onnx_file(tmp_path):
    """The ONNX bench's reference: the model evaluated in float64 (PyTorch's float64
    forward of the same weights, to 1e-12), a float32 ONNX Runtime output off by more; a
    model with a subgraph has none (the bench then takes ONNX Runtime's output)."""
    import onnx

    torch.manual_seed(0)
    # (ReLU: a GELU's exported constants are float32, so the float64 model is not
    # PyTorch's float64 GELU)
    model = torch.nn.Sequential(torch.nn.Linear(12, 30), torch.nn.ReLU(),
                                torch.nn.Linear(30, 4)).eval()
    path = tmp_path / "tiny.onnx"
    torch.onnx.export(model, (torch.randn(3, 12),), str(path), input_names=["x"],
                      dynamo=False)
    x = np.random.default_rng(1).standard_normal((3, 12)).astype(np.float32)
    ref, why = bench_models.float64_reference(onnx.load(str(path)), {"x": x})
    assert why is None and ref.dtype == np.float64
    with torch.no_grad():
        want = model.double()(torch.from_numpy(x.astype(np.float64))).numpy()
    np.testing.assert_allclose(ref, want, rtol=0, atol=1e-12)
    assert np.max(np.abs(ref.astype(np.float32) - ref)) > 0  # float32 could not carry it

    h = onnx.helper
    branch = h.make_graph([h.make_node("Identity", ["x"], ["o"])], "b", [],
                          [h.make_tensor_value_info("o", onnx.TensorProto.FLOAT, [2])])
    cond = h.make_graph(
        [h.make_node("Constant", [], ["c"], value=h.make_tensor("c", onnx.TensorProto.BOOL,
                                                               [], [True])),
         h.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)], "g",
        [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    assert bench_models.float64_reference(h.make_model(cond), {"x": x[0, :2]}) == \
        (None, "the model has subgraphs")


def test_bench_an_onnx_file_with_token_ids(tmp_path, capsys):
    """Integer inputs are drawn as indices, in [0, 100): an embedding of 100 rows runs
    (normal draws cast to integers would index from the end, or out of range)."""
    model = torch.nn.Sequential(torch.nn.Embedding(100, 16), torch.nn.Linear(16, 8)).eval()
    path = tmp_path / "ids.onnx"
    torch.onnx.export(model, (torch.zeros(1, 7, dtype=torch.int64),), str(path),
                      input_names=["ids"], dynamo=False)
    code = cli.main(["bench", str(path), "--reps", "2", "--settle", "0", "--no-tvm",
                     "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "ids.onnx" in out and "1x7" in out


def test_bench_reports_a_missing_file():
    with pytest.raises(SystemExit, match="no such file"):
        cli.main(["bench", "/nonexistent/model.onnx"])


def test_scaling_benchmark_runs_each_count_in_its_own_process(tmp_path, capsys):
    """``--models --threads 1,3``: the small CNN at one and three threads (3 is above the
    2 cores of CI's machine, and said so), each against ONNX Runtime and PyTorch (each
    contender in a process of its own), numerics checked; the table, the JSON
    and the plot."""
    from tirbyoc import bench, bench_scaling

    assert bench.main(["--models", "--model", "small_cnn", "--threads", "1,3", "--reps", "2",
                       "--settle", "0", "--rounds", "1", "--out", str(tmp_path)]) == 0
    data = json.load(open(tmp_path / "scaling.json"))
    assert data["counts"] == [1, 3] and data["cores"] == bench_scaling.available_cores()
    assert [(r["model"], r["threads"]) for r in data["rows"]] == [("small_cnn", 1),
                                                                  ("small_cnn", 3)]
    for r in data["rows"]:
        assert set(r["ms"]) == {"tirbyoc", "ort", "torch"}
        assert all(math.isfinite(t) and t > 0 for t in r["ms"].values())
        assert max(r["rel_err"].values()) <= bench_scaling.RTOL, r["rel_err"]
        assert r["offloaded"] >= 3 and r["rounds"] == 1
    text = capsys.readouterr().out
    assert "speed-up" in text and "small_cnn" in text
    if data["cores"] < 3:
        assert "(above the cores here)" in text
    assert (tmp_path / "scaling.png").stat().st_size > 0


def test_scaling_benchmark_rejects_bad_counts():
    from tirbyoc import bench, bench_scaling

    for text in ("0,2", "2,2", "65", "a"):
        with pytest.raises((ValueError, SystemExit)):
            bench_scaling.parse_counts(text) if text != "a" else bench.main(
                ["--models", "--threads", text])
    with pytest.raises(SystemExit):
        bench.main(["--threads", "1,2"])  # several counts need --models


def test_breakdown_flags_tvm_code_far_slower_than_its_traffic():
    """A float64 product (TVM's code: 34 MFLOP on 1.5 MB) is flagged; the float32 dense
    beside it, a kernel call doing the same work, is not."""
    import numpy as np
    import tvm
    from tvm import relax

    import tirbyoc

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((256, 256), "float32"))
    w = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(x, relax.const(w)))
            h64 = bb.emit(relax.op.astype(h, "float64"))
            p = bb.emit(relax.op.matmul(h64, relax.op.astype(relax.const(w), "float64")))
            out = bb.emit_output(p)
        bb.emit_func_output(out)
    ex = tirbyoc.compile(bb.get())
    assert len(ex.kernel_functions) == 1
    vm = bench_models._vm(ex)
    xt = tvm.runtime.tensor(np.ones((256, 256), np.float32))
    traffic = {}
    times = bench_models.breakdown(vm, [xt], runs=2, traffic=traffic)
    (kernel,) = ex.kernel_functions
    assert traffic[kernel] >= 3 * 256 * 256 * 4  # x, the (packed) weight and y at least
    # a bandwidth at which the kernel's 1 MB would take about 1 us: only compute-bound code
    # is flagged, and the kernel's function, however long it takes, is not
    flagged = bench_models.flag_slow(times, traffic, ex.kernel_functions, 0.8e12)
    assert kernel not in flagged
    # (the float64 casts beside it move little, but a stall of this shared machine can
    # hold one of them past SLOW_MIN_MS: only the product is asserted)
    (name,) = [n for n in flagged if "matmul" in n]
    assert flagged[name] > bench_models.SLOW_FACTOR
    # nothing is flagged where the bandwidth is too low for any function to beat it
    assert bench_models.flag_slow(times, traffic, ex.kernel_functions, 1e3) == {}


def test_flag_slow_takes_the_back_to_back_time_where_known():
    """A function 100x over what its bytes need in the run is flagged; if back to back
    it needs only 5x (the run paid for waking threads) it is not; 50x there: flagged at
    that."""
    times, traffic = [("f", 1.0)], {"f": 10_000}  # 10 kB at 1 GB/s: 0.01 ms
    assert bench_models.flag_slow(times, traffic, set(), 1e9) == {"f": pytest.approx(100)}
    assert bench_models.flag_slow(times, traffic, set(), 1e9, warm={"f": 0.05}) == {}
    assert bench_models.flag_slow(times, traffic, set(), 1e9, warm={"f": 0.5}) == \
        {"f": pytest.approx(50)}
    assert bench_models.flag_slow(times, traffic, set(), 1e9, warm={"g": 0.05}) == \
        {"f": pytest.approx(100)}


def test_back_to_back_reruns_a_function_and_leaves_its_result():
    """back_to_back times each call of the named functions again after itself: every
    call counted, the other functions not run again, the run's result unchanged; a call
    whose tensors share memory (an in-place update) is left out."""
    import tvm
    from tvm import relax

    import tirbyoc

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((256, 256), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.exp(relax.op.multiply(x, relax.const(0.5, "float32"))))
            out = bb.emit_output(relax.op.add(relax.op.sum(h, axis=[1]), relax.const(1.0)))
        bb.emit_func_output(out)
    vm = bench_models._vm(tirbyoc.compile(bb.get()))
    xn = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
    xt = tvm.runtime.tensor(xn)
    names = [n for n, _ in bench_models.breakdown(vm, [xt], runs=1)
             if not n.startswith("vm.builtin")]
    assert names
    calls = []
    plain = vm["main"](xt).numpy()
    warm = bench_models.back_to_back(vm, [xt], names[:1])
    assert set(warm) == {names[0]} and warm[names[0]] > 0
    np.testing.assert_allclose(vm["main"](xt).numpy(), plain, rtol=0, atol=0)
    np.testing.assert_allclose(plain, np.exp(xn.astype(np.float64) * 0.5).sum(1) + 1,
                               rtol=1e-5)

    class InPlace:
        """A VM whose one call passes the same tensor as input and output."""

        def set_instrument(self, fn):
            self.fn = fn

        def __getitem__(self, name):
            def run(*args):
                self.fn(lambda *a: calls.append(a), "update", True, None, xt, xt)
                self.fn(lambda *a: calls.append(a), "update", False, None, xt, xt)
            return run

    assert bench_models.back_to_back(InPlace(), [], ["update"]) == {}
    assert calls == []


def test_breakdown_counts_calls_and_takes_off_the_instrument():
    """The calibration function makes 201 views of one storage: each is counted, and each
    function's time is what the instrument measured less its overhead per call."""
    vm = bench_models._calibration_vm()
    overhead = bench_models.instrument_overhead_ms()
    assert 0 <= overhead < 1.0  # ms per call: a Python callback, not a millisecond
    calls, raw_calls = {}, {}
    corrected = dict(bench_models.breakdown(vm, [], runs=3, calls=calls, func="many"))
    raw = dict(bench_models.breakdown(vm, [], runs=3, calls=raw_calls, overhead_ms=0.0,
                                      func="many"))
    assert calls == raw_calls
    assert calls["vm.builtin.alloc_tensor"] == bench_models._CALIBRATION_CALLS + 1
    assert calls["vm.builtin.alloc_storage"] == 1
    assert set(corrected) == set(raw) and all(t >= 0 for t in corrected.values())
    # a fixed overhead taken off (raw and corrected are separate runs: only the
    # subtraction itself is exact, so check it on one run)
    one = dict(bench_models.breakdown(vm, [], runs=1, overhead_ms=1e-3, func="many"))
    again = dict(bench_models.breakdown(vm, [], runs=1, overhead_ms=1e3, func="many"))
    assert all(t == 0.0 for t in again.values())  # 1 s per call: more than any took
    assert all(t >= 0.0 for t in one.values())


def test_zoo_any_length_row_checks_other_lengths(tmp_path, monkeypatch, capsys):
    """``--zoo --any-length`` on a one-layer HuggingFace GPT-2: one build with a symbolic
    sequence length, timed at the zoo's length and checked at the other lengths (1e-4);
    the table says so."""
    transformers = pytest.importorskip("transformers")
    from tirbyoc import bench, bench_zoo

    def build():
        torch.manual_seed(0)
        cfg = transformers.GPT2Config(n_layer=1, n_embd=64, n_head=2, n_positions=512,
                                      vocab_size=bench_zoo.VOCAB)
        cfg._attn_implementation = "eager"
        return bench_zoo._hidden(transformers.GPT2Model(cfg), True)

    monkeypatch.setattr(bench_zoo, "ZOO", {"tiny_gpt2": bench_zoo.ZooModel("tiny_gpt2", build,
                                                                             True)})
    assert bench.main(["--models", "--zoo", "--any-length", "--batch", "1", "--reps", "1",
                       "--settle", "0", "--out", str(tmp_path)]) == 0
    (row,) = json.load(open(tmp_path / "zoo.json"))["rows"]
    assert row["build"] == "dynamic-seq" and row["model"] == "tiny_gpt2 (any length)"
    assert row["shape"] == [1, bench_zoo.SEQ]
    assert sorted(row["other_lengths_rel_err"]) == sorted(str(n) for n in
                                                          bench_zoo.OTHER_LENGTHS)
    assert max(row["other_lengths_rel_err"].values()) <= bench_models.RTOL
    assert row["rel_err"]["tirbyoc"] <= bench_models.RTOL
    assert "one build, also at lengths 7" in capsys.readouterr().out


def test_float64_tolerance_follows_onnx_runtime_only_above_rtol():
    # A well-conditioned model keeps the 1e-4 bar; an ill-conditioned one (every
    # float32 build near 1e-4 of float64) is judged against twice ONNX Runtime's error
    assert bench_models.float64_tolerance({"tirbyoc": 0.0, "ort": 3e-7}) == bench_models.RTOL
    assert bench_models.float64_tolerance({"ort": 1.2e-4, "torch": 9e-3}) == 2.4e-4
    assert bench_models.float64_tolerance({"tirbyoc": 1e-6}) == bench_models.RTOL


def test_held_out_models_are_not_the_zoos_and_need_the_zoo_flags(capsys):
    """The held-out list shares no model with the zoo the work was measured on, and
    ``--held-out`` alone is refused with a message saying what it goes with."""
    from tirbyoc import bench, bench_zoo

    assert not set(bench_zoo.HELD_OUT) & set(bench_zoo.ZOO)
    assert {z.name for z in bench_zoo.HELD_OUT.values()} == set(bench_zoo.HELD_OUT)
    # inputs: token ids, images, and audio for the speech models
    assert bench_zoo.HELD_OUT["squeezebert"].example(2).dtype == torch.int64
    assert tuple(bench_zoo.HELD_OUT["hiera"].example(2).shape) == (2, 3, 224, 224)
    assert tuple(bench_zoo.HELD_OUT["wav2vec2"].example(2).shape) == (2, 16000)
    assert tuple(bench_zoo.HELD_OUT["whisper_encoder"].example(1).shape) == (1, 80, 1000)
    with pytest.raises(SystemExit):
        bench.main(["--models", "--held-out"])
    assert "--held-out goes with --models --zoo" in capsys.readouterr().err
