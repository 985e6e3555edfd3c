"""tirbyoc's ONNX import (``tirbyoc.from_onnx``): the node forms TVM's converters get
wrong are rewritten, and the outputs match ONNX's reference evaluator (exactly, or
within 1e-6 relative where the arithmetic is float: interpolation, pooling), or ONNX
Runtime where the reference evaluator cannot run the node; the forms that cannot be
rewritten are refused with an error naming the node."""

import re

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import tirbyoc  # noqa: E402
from tirbyoc.onnx_frontend import UnsupportedNode, mend  # noqa: E402

inf, nan = float("inf"), float("nan")


def _model(nodes, inputs, outputs, opset, inits=()):
    """A model of ``nodes``; ``inputs``: name -> array (declared with its type and shape),
    ``outputs``: names (type left to inference), ``inits``: name -> array."""
    def info(name, v):
        return helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))

    graph = helper.make_graph(
        nodes, "g", [info(k, v) for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs],
        initializer=[numpy_helper.from_array(v, k) for k, v in dict(inits).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8 if opset <= 18 else 10
    return model


def _compiled(model, inputs):
    got = tirbyoc.run(tirbyoc.compile(tirbyoc.from_onnx(model)), *inputs.values())
    return got if isinstance(got, list) else [got]


def _assert_as_reference(model, inputs, rtol=0.0, want=None):
    """``model`` compiled, on ``inputs``, against ``want`` (default: ONNX's reference
    evaluator): dtypes and shapes equal, values within ``rtol`` (exact at 0; NaN where
    NaN)."""
    want = want if want is not None else ReferenceEvaluator(model).run(None, inputs)
    got = _compiled(model, inputs)
    assert len(got) == len(want)
    for k, (value, ref) in enumerate(zip(got, want)):
        ref = np.asarray(ref)
        assert value.dtype == ref.dtype, k
        assert value.shape == ref.shape, k
        if rtol:
            np.testing.assert_allclose(value, ref, rtol=rtol, atol=rtol, err_msg=str(k))
        else:
            np.testing.assert_array_equal(value, ref, err_msg=str(k))


def test_is_inf_reports_only_the_infinities_asked_for():
    """``detect_negative=0`` / ``detect_positive=0`` were ignored: every infinity was
    reported."""
    x = np.array([inf, -inf, 1.0, nan, -0.0, -3e38], np.float32)
    nodes = [helper.make_node("IsInf", ["x"], ["pos"], detect_negative=0),
             helper.make_node("IsInf", ["x"], ["neg"], detect_positive=0),
             helper.make_node("IsInf", ["x"], ["none"], detect_negative=0, detect_positive=0),
             helper.make_node("IsInf", ["x"], ["both"])]
    _assert_as_reference(_model(nodes, {"x": x}, ["pos", "neg", "none", "both"], 20), {"x": x})


def test_clip_before_opset_11_clamps_to_the_largest_floats_by_default():
    """Clip-6's default bounds are +-FLT_MAX; TVM's were +-inf, so infinities came through.
    (NaN is left out: TVM's max and min drop it, docs/reliability.md.)"""
    x = np.array([inf, -inf, 1.0, -2.5, 3e38], np.float32)
    nodes = [helper.make_node("Clip", ["x"], ["a"]),
             helper.make_node("Clip", ["x"], ["b"], min=-1.0),
             helper.make_node("Clip", ["x"], ["c"], max=2.0),
             helper.make_node("Clip", ["x"], ["d"], min=-1.0, max=2.0)]
    _assert_as_reference(_model(nodes, {"x": x}, list("abcd"), 6), {"x": x})


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_thresholded_relu_of_infinities_and_other_types(dtype):
    """``(x > alpha) * x`` gave NaN for -inf and -0.0 for negatives, and float32 for any
    input type."""
    x = np.array([-inf, -2.0, -0.5, 0.5, 1.0, 2.0, inf, nan], dtype)
    nodes = [helper.make_node("ThresholdedRelu", ["x"], ["a"]),
             helper.make_node("ThresholdedRelu", ["x"], ["b"], alpha=-1.0)]
    _assert_as_reference(_model(nodes, {"x": x}, ["a", "b"], 13), {"x": x})


def test_one_hot_and_integer_means_keep_their_types():
    """OneHot gave float64 whatever its values' type; ReduceMean and Mean of int32 gave
    int64."""
    idx = np.array([0, 2, -1], np.int64)
    i32 = np.array([[1, -5, 3], [-7, -8, -9]], np.int32)
    nodes = [helper.make_node("OneHot", ["idx", "depth", "fv"], ["f"]),
             helper.make_node("OneHot", ["idx", "depth", "iv"], ["i"], axis=0),
             helper.make_node("ReduceMean", ["m"], ["rm"], axes=[1]),
             helper.make_node("Mean", ["m", "m"], ["mm"])]
    inits = {"depth": np.array(3, np.int64), "fv": np.array([0.5, 2.0], np.float32),
             "iv": np.array([-1, 4], np.int32)}
    inputs = {"idx": idx, "m": i32}
    _assert_as_reference(_model(nodes, inputs, ["f", "i", "rm", "mm"], 13, inits), inputs)


def test_reductions_of_no_axes_still_apply_their_elementwise_step():
    """With ``noop_with_empty_axes=1`` and no axes, ONNX still applies |x|, x^2, log...;
    TVM returned the input. Axes absent and axes empty, both."""
    x = np.array([[-1.5, 2.0], [-3.0, 4.0]], np.float32)
    p = np.abs(x) + 0.25
    ops = ["ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp",
           "ReduceSum", "ReduceMax"]
    nodes = [helper.make_node(op, ["p"], [f"{op}_absent"], noop_with_empty_axes=1)
             for op in ops]
    nodes += [helper.make_node(op, ["x", "none"], [f"{op}_empty"], noop_with_empty_axes=1)
              for op in ops if op != "ReduceLogSum"]
    outs = [n.output[0] for n in nodes]
    inputs = {"x": x, "p": p}
    _assert_as_reference(_model(nodes, inputs, outs, 18, {"none": np.zeros(0, np.int64)}),
                         inputs, rtol=1e-6)


def _with_nans(dtype):
    """A 4 x 6 x 5 tensor with NaN first, inside and last along each axis in some rows,
    and rows with none (ties included, so that which index wins is tested too)."""
    x = np.random.default_rng(3).standard_normal((4, 6, 5)).astype(dtype)
    x[0, 1, 2] = 7.0  # a tie for the largest along axis 1 with the next line
    x[0, 4, 2] = 7.0
    x[1, 0, :] = nan  # NaN first along axis 1
    x[2, 3, 1] = nan  # inside
    x[2, 5, 1] = nan  # and a second one, last
    x[3, :, 4] = nan  # last along axis 2
    x[3, 2, 0] = -inf
    return x


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_extremes_propagate_nan_wherever_it_is(opset, dtype):
    """ReduceMax/Min give NaN where the reduced elements hold one and ArgMax/Min the first
    NaN's index (the last with ``select_last_index``), as ONNX's reference (numpy) does.
    TVM's compare-selects kept a NaN only when it was the last element reduced."""
    x = _with_nans(dtype)
    nodes, outs, inits = [], [], {}
    for op in ("ReduceMax", "ReduceMin"):
        for axes, keep in (([1], 1), ([2], 0), ([0, 2], 0), (None, 1)):
            name = f"{op}_{axes}_{keep}"
            inputs = ["x"]
            if axes is None:
                kw = {}
            elif opset >= 18:
                inputs.append(f"axes_{name}")
                inits[f"axes_{name}"] = np.asarray(axes, np.int64)
                kw = {}
            else:
                kw = {"axes": axes}
            nodes.append(helper.make_node(op, inputs, [name], keepdims=keep, **kw))
            outs.append(name)
    for op in ("ArgMax", "ArgMin"):
        for axis, keep, last in ((1, 1, 0), (2, 0, 0), (1, 0, 1), (0, 1, 1)):
            name = f"{op}_{axis}_{keep}_{last}"
            nodes.append(helper.make_node(op, ["x"], [name], axis=axis, keepdims=keep,
                                          select_last_index=last))
            outs.append(name)
    model = _model(nodes, {"x": x}, outs, opset, inits)
    want = ReferenceEvaluator(model).run(None, {"x": x})
    # (rows with and without NaN along either single axis)
    assert all(np.isnan(w).any() and not np.isnan(w).all()
               for w, o in zip(want, outs) if "[1]" in o or "[2]" in o)
    _assert_as_reference(model, {"x": x}, want=want)


def test_extremes_of_integers_are_not_rewritten():
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    nodes = [helper.make_node("ReduceMax", ["x"], ["a"], axes=[1]),
             helper.make_node("ArgMin", ["x"], ["b"], axis=0)]
    model = _model(nodes, {"x": x}, ["a", "b"], 13)
    assert mend(model) is model
    _assert_as_reference(model, {"x": x})


def _resize(inputs, inits, opset=19, **attrs):
    """A Resize of ``x`` (``inits``: any of roi, scales, sizes by name)."""
    names = ["x"] + [n if n in inits else "" for n in ("roi", "scales", "sizes")]
    while not names[-1]:
        names.pop()
    return _model([helper.make_node("Resize", names, ["y"], **attrs)], inputs, ["y"], opset,
                  inits)


_GRID = np.arange(24, dtype=np.float32).reshape(1, 1, 4, 6) * 0.5 - 3.0


@pytest.mark.parametrize("attrs, inits", [
    ({"axes": [2, 3], "mode": "linear"}, {"scales": np.array([2.0, 0.5], np.float32)}),
    ({"axes": [3], "mode": "nearest"}, {"sizes": np.array([9], np.int64)}),
    ({"axes": [3, 2], "mode": "cubic"}, {"scales": np.array([1.5, 2.0], np.float32)}),
    ({"axes": [2, 3], "mode": "linear", "keep_aspect_ratio_policy": "not_larger"},
     {"sizes": np.array([8, 9], np.int64)}),
    ({"axes": [2, 3], "mode": "nearest", "keep_aspect_ratio_policy": "not_smaller"},
     {"sizes": np.array([8, 8], np.int64)}),
    ({"mode": "linear", "keep_aspect_ratio_policy": "not_larger"},
     {"sizes": np.array([1, 1, 6, 6], np.int64)}),
    ({"mode": "linear", "coordinate_transformation_mode": "asymmetric"},
     {"scales": np.array([1.0, 1.0, 1.0, np.float32(4 / 3)], np.float32)}),
])
def test_resize_with_axes_or_an_aspect_ratio_policy(attrs, inits):
    """``axes`` made TVM read the scales as if given for every axis, and it ignored
    ``keep_aspect_ratio_policy``; a float32 scale like 4/3 whose size is whole but for the
    scale's rounding is taken (coordinates differ by 3e-8 relative)."""
    x = _GRID if "4" not in str(inits.get("scales")) else _GRID[..., :3]
    _assert_as_reference(_resize({"x": x}, inits, **attrs), {"x": x}, rtol=1e-6)


@pytest.mark.parametrize("dtype, mode", [(np.uint8, "linear"), (np.int8, "cubic")])
def test_resize_of_integers_rounds_and_saturates_as_onnx(dtype, mode):
    """TVM truncated the interpolated value; ONNX rounds it, and a cubic's overshoot past
    the type's range saturates."""
    info = np.iinfo(dtype)
    x = np.array([[[[info.min, info.min + 1, 10, info.max, info.max, 3]]]], dtype)
    inits = {"scales": np.array([1.0, 1.0, 1.0, 2.0], np.float32)}  # (no value at a tie)
    _assert_as_reference(_resize({"x": x}, inits, mode=mode), {"x": x})


@pytest.mark.parametrize("auto_pad, output_shape, strides", [
    ("NOTSET", [4, 4], [2, 2]), ("NOTSET", [5, 7], [2, 3]), ("SAME_UPPER", [4, 5], [2, 2]),
    ("SAME_LOWER", [4, 4], [2, 2])])
def test_conv_transpose_output_shape_is_honoured(auto_pad, output_shape, strides):
    """``output_shape`` was ignored (the natural 5x5 came out for 4x4); against ONNX
    Runtime (the reference evaluator cannot run it)."""
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 2, 3)).astype(np.float32)
    w = rng.standard_normal((2, 3, 3, 3)).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=strides,
                            output_shape=output_shape, auto_pad=auto_pad)
    model = _model([node], {"x": x}, ["y"], 13, {"w": w})
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x})
    assert want[0].shape[2:] == tuple(output_shape)
    _assert_as_reference(model, {"x": x}, rtol=1e-6, want=want)


# boxes (x1, y1, x2, y2): inside, past the image, and (last) under a pixel once scaled
ROIS = np.array([[1.5, 2.2, 6.1, 5.3], [0.0, 0.0, 12.0, 9.0], [3.1, 4.0, 3.4, 4.5]],
                np.float32)


@pytest.mark.parametrize("mode, scale, opset", [
    ("half_pixel", 0.5, 16), ("half_pixel", 0.25, 16), ("half_pixel", 1.0, 16),
    ("output_half_pixel", 0.5, 16), ("output_half_pixel", 1.0, 16), (None, 0.25, 10)])
def test_roi_align_half_pixel_with_a_spatial_scale(mode, scale, opset):
    """TVM took half a pixel off the boxes before scaling them, not after: right at scale
    1 only. ``output_half_pixel`` (the default before opset 16: ``mode`` None) was
    right but took 20 s to build; rewritten, its boxes under a pixel must still count as
    one pixel (the last box). The boxes are an input here, so nothing is folded. At
    opset 10 against ONNX Runtime: ONNX's reference evaluator runs RoiAlign-10 with
    half-pixel boxes, unlike the operator's definition and ONNX Runtime."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 2, 8, 8)).astype(np.float32)
    attrs = {} if mode is None else {"coordinate_transformation_mode": mode}
    node = helper.make_node("RoiAlign", ["x", "rois", "batch"], ["y"], output_height=3,
                            output_width=2, sampling_ratio=2, spatial_scale=scale, **attrs)
    model = _model([node], {"x": x, "rois": ROIS}, ["y"], opset,
                   {"batch": np.zeros(len(ROIS), np.int64)})
    inputs = {"x": x, "rois": ROIS}
    want = None
    if opset < 16:
        ort = pytest.importorskip("onnxruntime")
        model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
        want = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, inputs)
    _assert_as_reference(model, inputs, rtol=1e-5, want=want)


@pytest.mark.parametrize("ratio, rewritten", [(2, True), (0, False)])
def test_roi_align_output_half_pixel_is_rewritten_for_a_fixed_sample_count(ratio, rewritten):
    """The rewrite into half_pixel (one clamp per box) only where the number of samples
    does not follow the box size."""
    node = helper.make_node("RoiAlign", ["x", "rois", "batch"], ["y"], output_height=2,
                            output_width=2, sampling_ratio=ratio, spatial_scale=0.5)
    x = np.zeros((1, 1, 4, 4), np.float32)
    model = mend(_model([node], {"x": x, "rois": ROIS}, ["y"], 10,
                        {"batch": np.zeros(len(ROIS), np.int64)}))
    (roi,) = [n for n in model.graph.node if n.op_type == "RoiAlign"]
    modes = [a.s for a in roi.attribute if a.name == "coordinate_transformation_mode"]
    assert modes == ([b"half_pixel"] if rewritten else [])
    assert (roi.input[1] == "rois") != rewritten


@pytest.mark.parametrize("node, opset, inits, outputs, says", [
    (helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up", mode="linear"), 13,
     {"scales": np.array([1, 1, 1, 1.7], np.float32)}, ["y"], "scale 1.7 of axis 3"),
    (helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up"), 13,
     {"scales": np.array([1, 2, 1, 1], np.float32)}, ["y"], "axis 1 (batch or channel)"),
    (helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="up"), 13,
     {"sizes": np.array([2, 1, 8, 12], np.int64)}, ["y"], "axis 0 (batch or channel"),
    (helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="up", axes=[2, 3],
                      keep_aspect_ratio_policy="not_larger"), 18,
     {"sizes": np.array([8, 8], np.int64)}, ["y"], "scale 1.33333 of axis 2 (size 4)"),
    (helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up", antialias=1,
                      mode="linear"), 18,
     {"scales": np.array([1, 1, 0.5, 0.5], np.float32)}, ["y"], "antialias"),
    (helper.make_node("RoiAlign", ["x", "rois", "batch"], ["y"], name="roi", mode="max",
                      sampling_ratio=2), 16,
     {"rois": np.array([[0, 0, 3, 3]], np.float32), "batch": np.zeros(1, np.int64)}, ["y"],
     "mode max"),
    (helper.make_node("TopK", ["x", "k"], ["v", "i"], name="top"), 11,
     {"k": np.array([0], np.int64)}, ["v", "i"], "k = 0"),
    (helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"],
                      name="bn", training_mode=1), 15,
     {k: np.ones(1, np.float32) for k in "sbmv"}, ["y", "rm"], "running mean"),
    (helper.make_node("LayerNormalization", ["x", "s"], ["y", "mean"], name="ln"), 17,
     {"s": np.ones(6, np.float32)}, ["y", "mean"], "mean and inverse"),
])
def test_forms_that_cannot_be_rewritten_are_refused_by_name(node, opset, inits, outputs,
                                                            says):
    """Each would have given a wrong answer without a word; now an error naming the node
    and the reason."""
    x = np.ones((1, 1, 4, 6), np.float32)
    model = _model([node], {"x": x}, outputs, opset, inits)
    with pytest.raises(UnsupportedNode,
                       match=f"'{node.name}' \\({node.op_type}\\): .*{re.escape(says)}"):
        tirbyoc.from_onnx(model)


def test_near_misses_of_the_refused_forms_build_and_match():
    """The same operators where TVM is right: TopK of 2, training-mode BatchNormalization
    with its output only, LayerNormalization's output alone, a whole-size scale."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 1, 4, 6)).astype(np.float32)
    # (Resize first: the reference evaluator gives later nodes' absent inputs, "", the
    # value of the last absent output, "")
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["up"], mode="linear"),
             helper.make_node("TopK", ["x", "k"], ["v", "i"]),
             helper.make_node("BatchNormalization", ["x", "s", "b", "m", "var"],
                              ["bn", "", ""], training_mode=1),
             helper.make_node("LayerNormalization", ["x", "ls"], ["ln", "", ""])]
    inits = {"k": np.array([2], np.int64), "ls": np.ones(6, np.float32),
             "scales": np.array([1, 1, 1.5, 0.5], np.float32),
             **{k: np.ones(1, np.float32) for k in ("s", "b", "m", "var")}}
    _assert_as_reference(_model(nodes, {"x": x}, ["up", "v", "i", "bn", "ln"], 19, inits),
                         {"x": x}, rtol=1e-5)


def test_a_model_with_nothing_to_mend_is_passed_as_it_is():
    x = np.ones((2, 3), np.float32)
    model = _model([helper.make_node("Relu", ["x"], ["y"])], {"x": x}, ["y"], 13)
    assert mend(model) is model
