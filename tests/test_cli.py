"""The command line: the main job (demo) and explain on an ONNX file."""

import onnx

from tirbyoc import examples
from tirbyoc.__main__ import main


def test_demo_checks_numerics_and_reports(capsys):
    assert main(["demo", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "2 offloaded, 0 not offloaded" in out
    assert "-> OK" in out and "TVM default" in out and "numpy" in out


def test_explain_an_onnx_file(tmp_path, capsys):
    path = tmp_path / "mlp.onnx"
    onnx.save(examples.mlp_onnx_model(examples.mlp_weights((16, 8, 4))), str(path))
    assert main(["explain", str(path)]) == 0
    out = capsys.readouterr().out
    assert "dense_bias_relu" in out and "2 offloaded" in out
    assert main(["explain", str(tmp_path / "model.txt")]) == 2
