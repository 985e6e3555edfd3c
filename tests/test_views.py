"""tirbyoc.views: the layouts of Relax view operators, checked element by element against
numpy doing the same operators on a real array (the layout must address exactly the
elements numpy's result holds), and the refusals where no single strided view exists."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tirbyoc import views
from tirbyoc.bindings import Bindings

op = relax.op


def _gather(base: np.ndarray, layout, env=None) -> np.ndarray:
    """The elements ``layout`` addresses in ``base`` (flat), as an array of its shape."""
    ana = tvm.sym.Analyzer()
    env = env or {}

    def val(x):
        for var, value in env.items():
            ana.bind(var, value)
        return int(ana.simplify(x))

    shape = [val(e) for e, _ in layout.dims]
    strides = [val(s) for _, s in layout.dims]
    idx = np.full(shape, val(layout.offset), np.int64)
    for axis, (n, s) in enumerate(zip(shape, strides)):
        view = [1] * len(shape)
        view[axis] = n
        idx = idx + (np.arange(n) * s).reshape(view)
    return base.reshape(-1)[idx]


def _func(shape, build):
    """A Relax function of one input ``x`` whose body ``build(bb, x)`` emits; returns
    (Bindings, the last bound variable, the input)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = build(bb, x)
            gv = bb.emit_output(out)
        bb.emit_func_output(gv)
    func = bb.get()["main"]
    f = Bindings(func)
    last = [b.var for b in func.body.blocks[0].bindings][-2]
    return f, last, func.params[0]


CHAINS = {
    # the forms torch.export writes around attention
    "bert_take": ((6, 24), lambda bb, x: bb.emit(op.permute_dims(bb.emit(op.reshape(
        bb.emit(op.take(bb.emit(op.squeeze(bb.emit(op.permute_dims(bb.emit(op.expand_dims(
            bb.emit(op.reshape(x, (6, 1, 3, 8))), [0])), [3, 1, 2, 0, 4])), [-2])),
            relax.const(1, "int64"), axis=0)), (6, 2, 4))), [1, 0, 2]))),
    "gpt2_split": ((1, 6, 24), lambda bb, x: bb.emit(op.permute_dims(bb.emit(op.permute_dims(
        bb.emit(op.reshape(bb.emit(relax.TupleGetItem(bb.emit(op.split(x, [8, 16], axis=2)),
                                                      2)), (1, 6, 2, 4))),
        [0, 2, 1, 3])), [0, 1, 3, 2]))),
    "broadcast": ((1, 5, 4), lambda bb, x: bb.emit(op.reshape(
        bb.emit(op.broadcast_to(x, (3, 5, 4))), (3, 5, 4)))),
    "split_rows": ((6, 4), lambda bb, x: bb.emit(relax.TupleGetItem(
        bb.emit(op.split(x, [2, 5], axis=0)), 1))),
    "sections": ((4, 9), lambda bb, x: bb.emit(op.permute_dims(
        bb.emit(relax.TupleGetItem(bb.emit(op.split(x, 3, axis=1)), 1))))),
    # the key columns of merged projections (tirbyoc.merge_products) into heads, and a
    # slice with steps
    "merged_slice": ((1, 6, 24), lambda bb, x: bb.emit(op.permute_dims(bb.emit(op.reshape(
        bb.emit(op.strided_slice(x, [2], [8], [16], [1], assume_inbound=True)),
        (1, 6, 2, 4))), [0, 2, 1, 3]))),
    "strided": ((7, 10), lambda bb, x: bb.emit(op.strided_slice(
        x, [0, 1], [1, 2], [7, 9], [2, 3], assume_inbound=True))),
}


def _numpy_chain(name, x):
    if name == "bert_take":
        y = x.reshape(6, 1, 3, 8)[None].transpose(3, 1, 2, 0, 4).squeeze(-2)[1]
        return y.reshape(6, 2, 4).transpose(1, 0, 2)
    if name == "gpt2_split":
        y = np.split(x, [8, 16], axis=2)[2].reshape(1, 6, 2, 4)
        return y.transpose(0, 2, 1, 3).transpose(0, 1, 3, 2)
    if name == "split_rows":
        return x[2:5]
    if name == "broadcast":
        return np.broadcast_to(x, (3, 5, 4))
    if name == "merged_slice":
        return x[:, :, 8:16].reshape(1, 6, 2, 4).transpose(0, 2, 1, 3)
    if name == "strided":
        return x[1:7:2, 2:9:3]
    return np.split(x, 3, axis=1)[1].T


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_traced_input_addresses_the_elements_numpy_gives(name):
    shape, build = CHAINS[name]
    f, last, x = _func(shape, build)
    layout, factor = views.trace_input(f, last)
    assert layout.base.same_as(x) and factor == 1.0
    data = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    np.testing.assert_array_equal(_gather(data, layout), _numpy_chain(name, data))


def test_scalar_factors_are_collected_only_when_asked():
    def build(bb, x):
        y = bb.emit(op.multiply(bb.emit(op.permute_dims(x, [1, 0])), relax.const(0.5, "float32")))
        return bb.emit(op.multiply(relax.const(3.0, "float32"), bb.emit(op.reshape(y, (4, 3)))))

    f, last, x = _func((3, 4), build)
    layout, factor = views.trace_input(f, last, scale_ok=True)
    assert layout.base.same_as(x) and factor == 1.5
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(_gather(data, layout), data.T)
    # without scale_ok the walk stops at the multiplication: the var itself
    layout, factor = views.trace_input(f, last)
    assert layout.base.same_as(last) and factor == 1.0


def test_a_reshape_that_is_no_view_ends_the_walk_where_it_stops_being_one():
    """[4, 3] transposed to [3, 4] then flattened is a copy, not a strided view of x:
    the walk keeps the transpose's own result as the base."""
    def build(bb, x):
        t = bb.emit(op.permute_dims(x, [1, 0]))
        return bb.emit(op.permute_dims(bb.emit(op.reshape(t, (2, 6))), [1, 0]))

    f, last, x = _func((4, 3), build)
    layout, _ = views.trace_input(f, last)
    assert not layout.base.same_as(x)
    assert views.reshape_dims(((3, 1), (4, 3)), (12,)) is None


def test_reshape_dims_with_a_symbolic_length():
    s = tvm.tirx.Var("s", "int64")
    c = lambda v: tvm.tirx.const(v, "int64")  # noqa: E731
    # [s, 2304] -> [s, 1, 3, 768]: split, with a unit dimension
    dims = views.reshape_dims(((s, c(2304)), (c(2304), c(1))), (s, 1, 3, 768))
    assert [int(x[1]) if isinstance(x[1], tvm.tirx.IntImm) else str(x[1]) for x in dims] == [
        2304, 0, 768, 1]
    # [12, s, 64] -> [12 * s, 64]: merge of adjacent dimensions
    dims = views.reshape_dims(((c(12), s * 64), (s, c(64)), (c(64), c(1))), (c(12) * s, 64))
    assert dims is not None and int(dims[0][1]) == 64
    # [s, 12, 64] viewed from [12, s, 64]: merging 12 and 64 is no view
    assert views.reshape_dims(((s, c(64)), (c(12), s * 64), (c(64), c(1))), (s, 768)) is None
    # a dimension that neither divides nor is divided
    assert views.reshape_dims(((s, c(1)),), (c(7), c(9))) is None


def test_traced_output_is_the_result_inside_the_tensor_the_views_make():
    """O [2, 6, 4] -> [1, 2, 6, 4] -> permute [6, 1, 2, 4] -> [6, 8]: O's layout inside
    the [6, 8] result, element by element."""
    def build(bb, x):
        y = bb.emit(op.reshape(x, (1, 2, 6, 4)))
        return bb.emit(op.reshape(bb.emit(op.permute_dims(y, [2, 0, 1, 3])), (6, 8)))

    f, last, x = _func((2, 6, 4), build)
    final, layout = views.trace_output(f, x)
    assert final.same_as(last)
    o = np.arange(48, dtype=np.float32).reshape(2, 6, 4)
    result = o.reshape(1, 2, 6, 4).transpose(2, 0, 1, 3).reshape(6, 8)
    np.testing.assert_array_equal(_gather(result, layout), o)


def test_a_slice_clamped_at_the_end_and_one_with_a_symbolic_begin():
    """A strided_slice whose end lies past its dimension is clamped there (its result's
    shape says so): the layout addresses what numpy's slice holds. A begin that is not a
    constant ends the walk."""
    n = tvm.tirx.Var("n", "int64")

    def past(bb, x):
        return bb.emit(op.strided_slice(x, [1], [4], [12], [1]))

    f, last, x = _func((3, 8), past)
    layout, _ = views.trace_input(f, last)
    assert layout.base.same_as(x)
    data = np.arange(24, dtype=np.float32).reshape(3, 8)
    np.testing.assert_array_equal(_gather(data, layout), data[:, 4:12])

    def symbolic(bb, x):
        return bb.emit(op.strided_slice(x, [1], [n], [n + 2], [1]))

    f, last, x = _func((3, 8), symbolic)
    assert not views.trace_input(f, last)[0].base.same_as(x)
