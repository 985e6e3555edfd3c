"""The benchmark command runs and checks numerics (speed is its output, not asserted)."""

import json

from tirbyoc import bench


def test_benchmark_runs_small_shapes(tmp_path, capsys):
    code = bench.main(["--shapes", "3x40x24,17x33x5", "--reps", "2", "--settle", "0",
                       "--out", str(tmp_path)])
    assert code == 0
    results = json.loads((tmp_path / "bench.json").read_text())
    assert [(r["shape"], r["weights"]) for r in results["shapes"]] == [
        ("3x40->24", "bound"), ("3x40->24", "inputs"), ("17x33->5", "bound"),
        ("17x33->5", "inputs")]
    for row in results["shapes"]:
        assert set(row["seconds"]) == set(bench.PEERS)
        assert max(row["rel_err"].values()) <= bench.RTOL
    assert results["peak"]["all_threads"] > 0
    assert (tmp_path / "bench.png").stat().st_size > 0
    out = capsys.readouterr().out
    assert "geometric mean" in out and "seed MLP" in out
