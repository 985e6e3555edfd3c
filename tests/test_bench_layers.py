"""The layer benchmark runs end to end on tiny layers (no timing assertions: speed is the
benchmark's output, not a test); its checks are real: numerics against PyTorch (1e-4 of
max|ref|) and one kernel call per layer of each chain."""

import json
import math

import pytest

from tirbyoc import bench, bench_layers, kernels
from tirbyoc.bench_layers import Layer


def test_layer_flops():
    assert Layer("dw", 32, 112).flops == 2 * 32 * 112 * 112 * 9
    assert Layer("pw", 256, 14).flops == 2 * 256 * 256 * 14 * 14
    assert Layer("conv", 64, 56).flops == 2 * 64 * 64 * 9 * 56 * 56
    # the inverted residual block: expand 1x1, depthwise 3x3, project 1x1
    assert Layer("ir", 32, 28).flops == 2 * 28 * 28 * (32 * 192 + 192 * 9 + 192 * 32)
    assert [Layer(k, 8, 4).calls for k in bench_layers.KINDS] == [1, 1, 1, 3]


def test_layer_names_parse_and_bad_ones_are_refused():
    assert bench_layers.parse("pw512@14") == Layer("pw", 512, 14)
    assert bench_layers.parse("conv64@56") == Layer("conv", 64, 56)
    assert bench_layers.parse("dw1024@7").name == "dw1024@7"
    assert bench_layers.parse("ir24@56") == Layer("ir", 24, 56)
    assert [layer.name for layer in bench_layers.LAYERS][:2] == ["dw32@112", "dw128@56"]
    for bad in ("pw512", "xx8@4", "dw@7", "pw0@7", "conv8@x"):
        with pytest.raises(SystemExit, match="bad layer"):
            bench_layers.parse(bad)


@pytest.mark.parametrize("short, chain", [(2, 2), (0, 3), (3, 2)])
def test_chains_that_cannot_give_a_layer_are_refused(short, chain):
    with pytest.raises(ValueError, match="1 <= short < chain"):
        bench_layers.bench_layer(Layer("pw", 16, 4), threads=1, reps=1, settle=0.0,
                                 chain=chain, short=short, progress=lambda s: None)


@pytest.mark.parametrize("layer", [Layer("dw", 16, 9), Layer("pw", 24, 6), Layer("conv", 8, 7),
                                   Layer("ir", 16, 6)], ids=lambda layer: layer.name)
def test_a_layer_row_is_complete_and_checked(layer):
    row = bench_layers.bench_layer(layer, threads=2, reps=2, settle=0.0, chain=4,
                                   progress=lambda s: None)
    assert row["layer"] == layer.name and row["chain"] == 4 and row["short"] == 2
    # the chains: one kernel call per conv (the batch norms and the block's residual
    # add folded into them)
    assert row["kernel_calls"] == {n: n * layer.calls for n in (2, 4)}
    assert set(row["rel_err"]) == {"tirbyoc/2", "ort/2", "tirbyoc/4", "ort/4"}
    assert max(row["rel_err"].values()) <= bench_layers.RTOL, row["rel_err"]
    assert set(row["chain_ms"]) == {f"{p}/{n}" for p in ("tirbyoc", "ort", "torch")
                                    for n in (2, 4)}
    assert all(math.isfinite(t) and t > 0 for t in row["chain_ms"].values())
    # per layer: the chains' difference over the two extra layers
    for p in ("tirbyoc", "ort", "torch"):
        want = (row["chain_ms"][f"{p}/4"] - row["chain_ms"][f"{p}/2"]) / 2 * 1e3
        assert math.isclose(row["us"][p], want, rel_tol=1e-9, abs_tol=1e-9)
    assert bench_layers.problems([row]) == []
    assert layer.name in bench_layers.report([row], 2)


def test_problems_names_a_wrong_chain():
    row = {"layer": "pw8@4", "rel_err": {"tirbyoc/1": 0.0, "tirbyoc/5": 3e-3},
           "kernel_calls": {1: 1, 5: 4}}
    assert bench_layers.problems([row]) == ["pw8@4 tirbyoc/5: error 3.0e-03",
                                            "pw8@4: chain of 5, 4 kernel calls"]
    # a block of three convs must make three calls
    assert bench_layers.problems([{"layer": "ir8@4", "rel_err": {}, "kernel_calls": {2: 6}}]) == []
    assert bench_layers.problems([{"layer": "ir8@4", "rel_err": {}, "kernel_calls": {2: 2}}]) \
        == ["ir8@4: chain of 2, 2 kernel calls"]
    nan_row = {"layer": "dw8@4", "rel_err": {"ort/1": float("nan")}, "kernel_calls": {}}
    assert len(bench_layers.problems([nan_row])) == 1


def test_the_command_writes_its_table(tmp_path, capsys):
    code = bench.main(["--layers", "--layer", "pw16@5", "--reps", "2", "--settle", "0",
                       "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "pw16@5" in out and "vs ort" in out
    rows = json.load(open(tmp_path / "layers.json"))["rows"]
    assert [r["layer"] for r in rows] == ["pw16@5"] and rows[0]["chain"] == bench_layers.CHAIN
    # which ISA each contender ran, and tirbyoc's share of its ISA's FMA peak
    assert rows[0]["isa"]["tirbyoc"] == kernels.isa() and rows[0]["peak_gflops"] > 0
    assert f"instruction sets: tirbyoc {kernels.isa()}, torch " in out and "of peak" in out
    assert rows[0]["flops"] == 2 * 16 * 16 * 5 * 5
