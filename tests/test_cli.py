"""The command line: the main job (demo) and explain on an ONNX file."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

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


def test_explain_names_a_node_that_would_compile_wrongly(tmp_path, capsys):
    """A Resize to 8.5 points (TVM's converter would map coordinates by 8 / 5): exit 2
    and the node named, not a module that answers wrongly."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 5, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    scales = numpy_helper.from_array(np.array([1, 1, 1.7, 1.7], np.float32), "scales")
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="upsample")
    path = tmp_path / "resize.onnx"
    onnx.save(helper.make_model(helper.make_graph([node], "g", [x], [y], [scales]),
                                opset_imports=[helper.make_opsetid("", 13)]), str(path))
    assert main(["explain", str(path)]) == 2
    err = capsys.readouterr().err
    assert "'upsample' (Resize)" in err and "scale 1.7 of axis 2" in err
