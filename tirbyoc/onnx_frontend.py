"""ONNX import: TVM's ``from_onnx`` on a graph first mended where TVM's converters would
give a wrong answer without saying so.

Each node of a form that TVM 0.27 converts wrongly (found by running about 150 ONNX
operators on edge inputs against ONNX's reference evaluator; docs/reliability.md) is
rewritten into ONNX nodes that TVM converts right, or, where no such rewrite is known,
refused with ``UnsupportedNode``, which names the node, its operator and what would have
gone wrong. A graph with none of them reaches TVM unchanged.

Mended: ``IsInf`` with ``detect_negative=0`` or ``detect_positive=0`` (ignored: every
infinity was reported); ``Clip`` before opset 11 without ``min`` or ``max`` (the default
bounds are +-FLT_MAX, TVM's +-inf: infinities came through unclamped);
``ThresholdedRelu`` (-inf gave NaN, from ``(x > alpha) * x``); ``OneHot`` (float64
output whatever the values' type); ``ReduceMean`` and ``Mean`` of int32 and narrower
(int64 output); the reductions whose elementwise step TVM skipped under
``noop_with_empty_axes`` (``ReduceL1``, ``ReduceL2``, ``ReduceSumSquare`` and
``ReduceLogSum`` returned their input); ``Resize`` with ``axes``
(scales read as if given for every axis), with ``keep_aspect_ratio_policy`` (ignored),
or of an integer tensor by interpolation (truncated where ONNX rounds);
``ConvTranspose`` with ``output_shape`` (ignored); ``RoiAlign`` in ``half_pixel`` mode
with a ``spatial_scale`` (TVM took half a pixel off the box before scaling it, not
after), and in ``output_half_pixel`` mode with a fixed ``sampling_ratio`` (right, but
20 s to build: see ``_roi_align``); ``ReduceMax``, ``ReduceMin``, ``ArgMax`` and
``ArgMin`` of floats (TVM's compare-selects kept a NaN only where it was the last element
reduced; ONNX's reference gives NaN, and the first NaN's index).

Refused: ``Resize`` by a scale whose output size is not whole (TVM maps coordinates by
the whole size's ratio, not the scale), by a scale on the batch or channel axis
(ignored), or with ``antialias``; ``RoiAlign`` in ``max`` mode (the largest
interpolated value, where ONNX takes the largest weighted corner); ``TopK`` with k = 0
(every element came back); the training outputs of ``BatchNormalization`` (running
statistics with the momentum swapped) and ``LayerNormalization`` (mean and inverse
deviation came back as 0-d zeros) where the graph uses them.
"""

from __future__ import annotations

import numpy as np

__all__ = ["from_onnx", "mend", "UnsupportedNode"]


class UnsupportedNode(NotImplementedError):
    """An ONNX node that TVM's converter would get wrong and tirbyoc cannot rewrite."""

    def __init__(self, node, why: str):
        super().__init__(f"ONNX node {node.name or '(unnamed)'!r} ({node.op_type}): {why}")
        self.node = node


def from_onnx(model, shape_dict=None, dtype_dict="float32", opset=None,
              keep_params_in_input=False, sanitize_input_names=True):
    """TVM's ``tvm.relax.frontend.onnx.from_onnx`` (same arguments) on ``mend(model,
    shape_dict)``: the nodes TVM would convert wrongly rewritten, or ``UnsupportedNode``
    raised for the first that cannot be."""
    from tvm.relax.frontend.onnx import from_onnx as tvm_import

    return tvm_import(mend(model, shape_dict), shape_dict=shape_dict, dtype_dict=dtype_dict,
                      opset=opset, keep_params_in_input=keep_params_in_input,
                      sanitize_input_names=sanitize_input_names)


def mend(model, shape_dict=None):
    """``model`` with each node TVM would convert wrongly rewritten into nodes it converts
    right (a copy; ``model`` itself when there is none). ``shape_dict`` (input name ->
    shape) fixes the inputs' shapes where the rewrites need static sizes. Raises
    ``UnsupportedNode`` for a node that cannot be rewritten."""
    graph = _Graph(model, shape_dict)
    new = _mended_nodes(model.graph, graph)
    if new is None:
        return model
    out = type(model)()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(new)
    return out


# ---- what the rewrites know of the graph ----

class _Graph:
    """Constants, types, shapes and consumers of a model's values; shapes by ONNX's shape
    inference, run once and only when a rewrite asks."""

    def __init__(self, model, shape_dict):
        from onnx import numpy_helper

        self.model, self.shape_dict = model, dict(shape_dict or {})
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                          1)
        self.constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        self.used = set(o.name for o in model.graph.output)
        self._infos, self._fresh = None, 0
        self._note_graph(model.graph)

    def _note_graph(self, graph):
        from onnx import numpy_helper

        for node in graph.node:
            self.used.update(node.input)
            if node.op_type == "Constant" and node.output:
                for a in node.attribute:
                    if a.name == "value":
                        self.constants[node.output[0]] = numpy_helper.to_array(a.t)
            for a in node.attribute:
                for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    self.used.update(o.name for o in sub.output)
                    self._note_graph(sub)

    def _value_infos(self):
        if self._infos is None:
            import onnx

            m = onnx.ModelProto()
            m.CopyFrom(self.model)
            for inp in m.graph.input:
                dims = self.shape_dict.get(inp.name)
                if dims is not None:
                    shape = inp.type.tensor_type.shape
                    shape.ClearField("dim")
                    for d in dims:
                        shape.dim.add().dim_value = int(d)
            try:
                m = onnx.shape_inference.infer_shapes(m)
            except Exception:  # noqa: BLE001 (then only the declared types are known)
                pass
            g = m.graph
            self._infos = {v.name: v.type.tensor_type
                           for v in list(g.input) + list(g.value_info) + list(g.output)
                           if v.type.HasField("tensor_type")}
        return self._infos

    def dtype(self, name):
        """The numpy dtype of value ``name``, or None where unknown."""
        import onnx

        if name in self.constants:
            return self.constants[name].dtype
        t = self._value_infos().get(name)
        if t is None or not t.elem_type:
            return None
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type))

    def shape(self, name):
        """The static shape of value ``name`` (a tuple of ints), or None where any of it
        is unknown."""
        if name in self.constants:
            return self.constants[name].shape
        t = self._value_infos().get(name)
        if t is None or not t.HasField("shape"):
            return None
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)
        return None if None in dims else dims

    def constant(self, name):
        """The value of ``name`` when it is an initializer or a Constant's, else None."""
        return self.constants.get(name) if name else None

    def fresh(self, node, what: str) -> str:
        self._fresh += 1
        return f"{node.output[0] if node.output else node.op_type}__tirbyoc_{what}{self._fresh}"

    def const_node(self, node, value, what="c"):
        """(a Constant node of ``value``, its output's name)."""
        from onnx import helper, numpy_helper

        name = self.fresh(node, what)
        self.constants[name] = np.asarray(value)
        return helper.make_node("Constant", [], [name],
                                value=numpy_helper.from_array(np.asarray(value), name)), name


def _attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _text(v):
    return v.decode() if isinstance(v, bytes) else v


def _with(node, inputs=None, outputs=None, drop=(), **attrs):
    """A copy of ``node`` with other inputs/outputs, attributes ``drop`` removed and
    ``attrs`` set."""
    from onnx import helper

    kept = {k: v for k, v in _attrs(node).items() if k not in drop and k not in attrs}
    return helper.make_node(node.op_type, list(node.input if inputs is None else inputs),
                            list(node.output if outputs is None else outputs),
                            name=node.name, domain=node.domain, **kept, **attrs)


def _mended_nodes(graph, g):
    """The nodes of ``graph`` mended (subgraphs included), or None when none changed."""
    out, changed = [], False
    for node in graph.node:
        sub_changed = False
        for a in node.attribute:
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                new = _mended_nodes(sub, g)
                if new is not None:
                    del sub.node[:]
                    sub.node.extend(new)
                    sub_changed = True
        rule = _RULES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        replaced = rule(node, g) if rule else None
        if replaced is None:
            out.append(node)
        else:
            out.extend(replaced)
        changed = changed or sub_changed or replaced is not None
    return out if changed else None


# ---- the rewrites: each gives the replacing nodes, or None to keep the node ----

def _is_inf(node, g):
    a = _attrs(node)
    neg, pos = a.get("detect_negative", 1), a.get("detect_positive", 1)
    if neg and pos:
        return None
    from onnx import helper

    x, y = node.input[0], node.output[0]
    inf, minus, side = (g.fresh(node, k) for k in ("inf", "neg", "side"))
    nodes = [helper.make_node("IsInf", [x], [inf]), helper.make_node("Neg", [x], [minus])]
    if not neg and not pos:  # no infinity is reported
        return nodes[:1] + [helper.make_node("Xor", [inf, inf], [y], name=node.name)]
    # x < -x: x is negative (x > -x: positive), NaN neither
    nodes.append(helper.make_node("Less" if neg else "Greater", [x, minus], [side]))
    return nodes + [helper.make_node("And", [inf, side], [y], name=node.name)]


def _clip_v6(node, g):
    a = _attrs(node)
    if g.opset >= 11 or ("min" in a and "max" in a):
        return None
    big = float(np.finfo(np.float32).max)
    return [_with(node, min=float(a.get("min", -big)), max=float(a.get("max", big)))]


def _thresholded_relu(node, g):
    from onnx import helper

    dtype = g.dtype(node.input[0])
    if dtype is None:
        raise UnsupportedNode(node, "its input's type is unknown; TVM's converter gives "
                              "NaN for -inf and float32 for any type")
    alpha = _attrs(node).get("alpha", 1.0)
    c_alpha, alpha_name = g.const_node(node, np.asarray(alpha, dtype), "alpha")
    c_zero, zero = g.const_node(node, np.zeros((), dtype), "zero")
    above = g.fresh(node, "above")
    return [c_alpha, c_zero, helper.make_node("Greater", [node.input[0], alpha_name], [above]),
            helper.make_node("Where", [above, node.input[0], zero], list(node.output),
                             name=node.name)]


def _cast_output(node, g, dtype):
    """``node`` writing a fresh value, then a Cast of that to ``dtype`` into its output."""
    from onnx import helper

    raw = g.fresh(node, "raw")
    return [_with(node, outputs=[raw] + list(node.output[1:])),
            helper.make_node("Cast", [raw], [node.output[0]],
                             to=helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))]


def _one_hot(node, g):
    dtype = g.dtype(node.input[2])
    return None if dtype is None or dtype == np.float64 else _cast_output(node, g, dtype)


def _integer_mean(node, g):
    dtype = g.dtype(node.input[0])
    if dtype is None or dtype.kind not in "iu" or dtype == np.int64:
        return None
    return _cast_output(node, g, dtype)


def _empty_axes(node, g) -> bool:
    """Whether a reduction is a no-op for want of axes (``noop_with_empty_axes``)."""
    a = _attrs(node)
    if not a.get("noop_with_empty_axes", 0) or a.get("axes"):
        return False
    if len(node.input) > 1 and node.input[1]:
        axes = g.constant(node.input[1])
        if axes is None:
            raise UnsupportedNode(node, "noop_with_empty_axes with axes known only at run "
                                  "time; TVM's converter skips the elementwise step")
        return axes.size == 0
    return True


# (the L2 norm of one element as |x|, not sqrt(x * x), which overflows above 1.8e19;
# log(exp(x)) is x, TVM's answer)
_ELEMENTWISE_STEP = {"ReduceL1": "Abs", "ReduceL2": "Abs", "ReduceSumSquare": "Mul",
                     "ReduceLogSum": "Log"}


def _noop_reduction(node, g):
    """ONNX applies a reduction's elementwise step even where it reduces nothing (the L1
    norm of one element is |x|); TVM returned the input."""
    if not _empty_axes(node, g):
        return None
    from onnx import helper

    op, x = _ELEMENTWISE_STEP[node.op_type], node.input[0]
    return [helper.make_node(op, [x, x] if op == "Mul" else [x], [node.output[0]],
                             name=node.name)]


def _resize(node, g):
    from onnx import helper

    a = _attrs(node)
    if a.get("antialias", 0):
        raise UnsupportedNode(node, "antialias=1: TVM's resize does not filter")
    x = node.input[0]
    inputs = list(node.input) + [""] * (4 - len(node.input))
    roi, scales, sizes = (g.constant(n) for n in inputs[1:4])
    shape = g.shape(x)
    policy = _text(a.get("keep_aspect_ratio_policy", "stretch"))
    axes = a.get("axes")
    nodes, changed = [], False
    if (axes is not None or policy != "stretch") and shape is None:
        raise UnsupportedNode(node, "axes or keep_aspect_ratio_policy with an input of "
                              "unknown shape; TVM's converter ignores both")
    rank = len(shape) if shape is not None else None
    if axes is not None:
        axes = [int(ax) % rank for ax in axes]
        if roi is not None and roi.size:
            raise UnsupportedNode(node, "axes with a region of interest")
        for given, name, fill in ((scales, 2, 1.0), (sizes, 3, None)):
            if inputs[name] and given is None:
                raise UnsupportedNode(node, "axes with scales or sizes known only at run "
                                      "time; TVM's converter reads them as if given for "
                                      "every axis")
            if given is not None and given.size:
                full = np.array([fill if fill is not None else d for d in shape],
                                given.dtype)
                full[axes] = given
                c, inputs[name] = g.const_node(node, full, "full")
                nodes.append(c)
                if name == 2:
                    scales = full
                else:
                    sizes = full
        changed = True
    if policy != "stretch" and sizes is not None and sizes.size:
        # ONNX maps coordinates by the one scale chosen, TVM by each axis's size ratio:
        # the same where the scale gives whole sizes
        chosen = axes if axes is not None else list(range(rank))
        scale = (min if policy == "not_larger" else max)(sizes[i] / shape[i] for i in chosen)
        for i in chosen:
            _check_whole(node, scale, shape[i], i)
        exact = np.array([round(scale * d) if i in chosen else d
                          for i, d in enumerate(shape)], np.int64)
        c, inputs[3] = g.const_node(node, exact, "sizes")
        nodes.append(c)
        sizes = exact
        changed = True
    if scales is not None and scales.size and shape is not None:
        for i, (s, d) in enumerate(zip(scales.astype(np.float64), shape)):
            if i < 2 and rank > 2 and s != 1.0:
                raise UnsupportedNode(node, f"scale {s:g} on axis {i} (batch or channel): "
                                      "TVM's converter resizes spatial axes only")
            _check_whole(node, s, d, i)
    if sizes is not None and sizes.size and shape is not None:
        for i in range(min(2, rank - 2)):
            if int(sizes[i]) != shape[i]:
                raise UnsupportedNode(node, f"size {int(sizes[i])} on axis {i} (batch or "
                                      f"channel, size {shape[i]}): TVM's converter resizes "
                                      "spatial axes only")
    dtype = g.dtype(x)
    mode = _text(a.get("mode", "nearest"))
    if changed:
        while inputs and not inputs[-1]:
            inputs.pop()
        node = _with(node, inputs=inputs, drop=("axes", "keep_aspect_ratio_policy"))
    if dtype is not None and dtype.kind in "iu" and mode != "nearest":
        return nodes + _resize_in_float(node, g, dtype)
    return nodes + [node] if changed else None


def _check_whole(node, scale, size, axis):
    """Refuses a scale that does not give a whole number of points (up to the float32
    rounding of the scale: 4/3 on 3 points is whole): ONNX maps coordinates by the scale,
    TVM by the ratio of the sizes."""
    points = scale * size
    if abs(points - round(points)) > 2.0 ** -22 * max(points, 1.0):
        raise UnsupportedNode(
            node, f"scale {scale:g} of axis {axis} (size {size}) gives {points:g} points: "
            "TVM's converter would map coordinates by the ratio of the whole size "
            f"{int(np.floor(points))} instead of the scale (give sizes instead)")


def _resize_in_float(node, g, dtype):
    """An integer tensor resized by interpolation, as ONNX's reference does it: in float,
    rounded to the nearest integer (half to even) and saturated to the type; TVM
    truncated."""
    from onnx import helper

    info = np.iinfo(dtype)
    wide, resized, rounded, clipped = (g.fresh(node, k)
                                       for k in ("wide", "resized", "rounded", "clipped"))
    c_lo, lo = g.const_node(node, np.float32(info.min), "lo")
    c_hi, hi = g.const_node(node, np.float32(info.max), "hi")
    f32 = helper.np_dtype_to_tensor_dtype(np.dtype(np.float32))
    return [helper.make_node("Cast", [node.input[0]], [wide], to=f32),
            _with(node, inputs=[wide] + list(node.input[1:]), outputs=[resized]),
            helper.make_node("Round", [resized], [rounded]), c_lo, c_hi,
            helper.make_node("Clip", [rounded, lo, hi], [clipped]),
            helper.make_node("Cast", [clipped], [node.output[0]],
                             to=helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))]


def _conv_transpose(node, g):
    """``output_shape`` as the pads it implies (ONNX's rule: the total padding from the
    natural size, split evenly, the odd one at the end for SAME_UPPER, else at the
    start)."""
    a = _attrs(node)
    if "output_shape" not in a:
        return None
    xs, ws = g.shape(node.input[0]), g.shape(node.input[1])
    if xs is None or ws is None:
        raise UnsupportedNode(node, "output_shape with an input or weight of unknown "
                              "shape; TVM's converter ignores output_shape")
    spatial = len(xs) - 2
    want = list(a["output_shape"])[-spatial:]
    strides = list(a.get("strides", [1] * spatial))
    dil = list(a.get("dilations", [1] * spatial))
    opad = list(a.get("output_padding", [0] * spatial))
    kernel = list(a.get("kernel_shape", ws[2:]))
    begin, end = [], []
    for i in range(spatial):
        total = (strides[i] * (xs[2 + i] - 1) + opad[i] + (kernel[i] - 1) * dil[i] + 1
                 - want[i])
        if total < 0:
            raise UnsupportedNode(node, f"output_shape {want} is larger than the "
                                  "convolution's natural output; TVM cannot pad it")
        if _text(a.get("auto_pad", "NOTSET")) == "SAME_UPPER":
            begin.append(total // 2)
            end.append(total - total // 2)
        else:
            begin.append(total - total // 2)
            end.append(total // 2)
    return [_with(node, drop=("output_shape", "auto_pad"), pads=begin + end)]


def _roi_align(node, g):
    """TVM's converter takes half a pixel off the boxes before scaling them by
    ``spatial_scale`` s, ONNX after: (r - 1/2) s instead of r s - 1/2. The boxes moved by
    1/2 - 1/(2 s) first give ONNX's.

    ``output_half_pixel`` (the default before opset 16) was right, but TOPI writes its
    box size, max((r2 - r1) s, 1), into every use of every sample point: 100 KB of TIR
    for one small RoiAlign, 20 s of TVM's simplifiers (half_pixel: 4 s). With a fixed
    ``sampling_ratio`` it becomes half_pixel on boxes that start at r1 + 1/2 (TVM's
    start: (r1 + 1/2 - 1/2) s) and are max((r2 - r1) s, 1) / s long, the clamp done
    once per box in the graph. Where the number of samples follows the box size
    (``sampling_ratio`` 0: ceil of size / bins) it stays as it is: a size a rounding
    away from a whole number could take another sample count (and so does a scale of
    0 or less, which no length divides)."""
    a = _attrs(node)
    if _text(a.get("mode", "avg")) == "max":
        raise UnsupportedNode(node, "mode max: TVM takes the largest interpolated value, "
                                    "ONNX the largest of each sample's weighted corners")
    mode = _text(a.get("coordinate_transformation_mode",
                       "half_pixel" if g.opset >= 16 else "output_half_pixel"))
    scale = float(a.get("spatial_scale", 1.0))
    from onnx import helper

    dtype = g.dtype(node.input[1]) or np.dtype(np.float32)
    if mode == "output_half_pixel" and int(a.get("sampling_ratio", 0)) > 0 and scale > 0:
        consts = [g.const_node(node, np.asarray(v, dt), what) for what, v, dt in (
            ("lo", [0], np.int64), ("hi", [2], np.int64), ("end", [4], np.int64),
            ("axis", [1], np.int64), ("scale", scale, dtype), ("one", 1.0, dtype),
            ("half", 0.5, dtype))]
        lo, hi, end, axis, c_scale, one, half = (name for _, name in consts)
        n = {k: g.fresh(node, k) for k in (
            "start", "stop", "size", "scaled", "clamped", "length", "first", "last", "rois")}
        return [c for c, _ in consts] + [
            helper.make_node("Slice", [node.input[1], lo, hi, axis], [n["start"]]),
            helper.make_node("Slice", [node.input[1], hi, end, axis], [n["stop"]]),
            helper.make_node("Sub", [n["stop"], n["start"]], [n["size"]]),
            helper.make_node("Mul", [n["size"], c_scale], [n["scaled"]]),
            helper.make_node("Max", [n["scaled"], one], [n["clamped"]]),
            helper.make_node("Div", [n["clamped"], c_scale], [n["length"]]),
            helper.make_node("Add", [n["start"], half], [n["first"]]),
            helper.make_node("Add", [n["first"], n["length"]], [n["last"]]),
            helper.make_node("Concat", [n["first"], n["last"]], [n["rois"]], axis=1),
            _with(node, inputs=[node.input[0], n["rois"], node.input[2]],
                  coordinate_transformation_mode="half_pixel")]
    if mode != "half_pixel" or scale == 1.0:
        return None
    c_shift, shift = g.const_node(node, np.asarray(0.5 - 0.5 / scale, dtype), "shift")
    shifted = g.fresh(node, "rois")
    return [c_shift, helper.make_node("Add", [node.input[1], shift], [shifted]),
            _with(node, inputs=[node.input[0], shifted, node.input[2]])]


def _nan_extreme(node, g):
    """ONNX's ``ReduceMax``/``ReduceMin`` give NaN where the reduced elements hold one, and
    ``ArgMax``/``ArgMin`` the index of the first NaN there (the last with
    ``select_last_index``), as numpy and PyTorch do (ONNX's reference evaluator). TVM's
    reductions are compare-selects that keep the other operand, so a NaN survived only
    as the last element reduced: a row's answer depended on where its NaN was. Rewritten
    as the reduction, a max of ``IsNaN`` over the same axes, and a ``Where``; for float
    inputs only (integers hold no NaN)."""
    from onnx import TensorProto, helper

    dtype = g.dtype(node.input[0])
    if dtype is None or dtype.kind != "f":
        return None
    nan_b, nan_f, raw, any_f, has = (g.fresh(node, k) for k in
                                     ("isnan", "nanf", "raw", "anynan", "hasnan"))
    # 1.0 where x is NaN, reduced below over the node's own axes
    nodes = [helper.make_node("IsNaN", [node.input[0]], [nan_b]),
             helper.make_node("Cast", [nan_b], [nan_f], to=TensorProto.FLOAT)]
    a = _attrs(node)
    if node.op_type.startswith("Reduce"):
        # the same axes (attribute or input) and keepdims as the node's own
        nodes.append(helper.make_node("ReduceMax", [nan_f] + list(node.input[1:]), [any_f],
                                      **a))
        c_nan, nan = g.const_node(node, np.asarray(np.nan, dtype), "nan")
        nodes.append(c_nan)
        where = [has, nan, raw]
    else:
        axis, keep = int(a.get("axis", 0)), int(a.get("keepdims", 1))
        if g.opset >= 18:
            c_axes, axes = g.const_node(node, np.asarray([axis], np.int64), "axes")
            nodes += [c_axes, helper.make_node("ReduceMax", [nan_f, axes], [any_f],
                                               keepdims=keep)]
        else:
            nodes.append(helper.make_node("ReduceMax", [nan_f], [any_f], axes=[axis],
                                          keepdims=keep))
        # the first (last) NaN: the first (last) largest of the flags
        first = g.fresh(node, "firstnan")
        nodes.append(helper.make_node("ArgMax", [nan_f], [first], axis=axis, keepdims=keep,
                                      select_last_index=int(a.get("select_last_index", 0))))
        where = [has, first, raw]
    return nodes + [_with(node, outputs=[raw]),
                    helper.make_node("Cast", [any_f], [has], to=TensorProto.BOOL),
                    helper.make_node("Where", where, list(node.output), name=node.name)]


def _top_k(node, g):
    k = g.constant(node.input[1]) if len(node.input) > 1 else _attrs(node).get("k")
    if k is not None and int(np.asarray(k).ravel()[0]) == 0:
        raise UnsupportedNode(node, "k = 0: TVM's topk returns every element")
    return None


def _training_outputs(index: int, what: str):
    def check(node, g):
        if any(o and o in g.used for o in node.output[index:]):
            raise UnsupportedNode(node, f"{what} are used: TVM's converter gets them wrong")
        return None
    return check


def _batch_norm(node, g):
    if _attrs(node).get("training_mode", 0):
        return _training_outputs(1, "the running mean and variance of training mode")(
            node, g)
    return None


_RULES = {
    "IsInf": _is_inf,
    "Clip": _clip_v6,
    "ThresholdedRelu": _thresholded_relu,
    "OneHot": _one_hot,
    "ReduceMean": _integer_mean,
    "Mean": _integer_mean,
    **{op: _noop_reduction for op in _ELEMENTWISE_STEP},
    "Resize": _resize,
    "ConvTranspose": _conv_transpose,
    "RoiAlign": _roi_align,
    "TopK": _top_k,
    **{op: _nan_extreme for op in ("ReduceMax", "ReduceMin", "ArgMax", "ArgMin")},
    "BatchNormalization": _batch_norm,
    "LayerNormalization": _training_outputs(1, "the mean and inverse standard deviation"),
}
