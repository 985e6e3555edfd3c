"""Mixture-of-experts layers as ``transformers`` runs them by default: the rows routed to
each expert sorted together, counted with ``histc``, and multiplied by one grouped
product (``transformers.grouped_mm_fallback``). TVM's frontend converts none of these;
``tirbyoc.torch_converters()`` does, and ``tirbyoc.compile`` makes each grouped product
one kernel call per expert (``tirbyoc.moe``).

Tolerances: counts and integer divisions bit for bit; products within rtol 1e-4 of
PyTorch's float32 result (absolute floor 1e-4 * max|reference|).
"""

import numpy as np
import pytest

import tirbyoc
from tirbyoc import examples

import torch  # noqa: E402  (the test extra installs it)
import transformers  # noqa: E402,F401  (registers torch.ops.transformers)
import transformers.integrations.moe  # noqa: E402,F401

RTOL = 1e-4


def _close(got, ref):
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=RTOL * float(np.abs(ref).max()))


def _import(model, *inputs):
    from tvm.relax.frontend.torch import from_exported_program

    with torch.no_grad():
        ep = torch.export.export(model, inputs)
    return from_exported_program(ep, keep_params_as_input=False,
                                 custom_convert_map=tirbyoc.torch_converters())


def _as_list(out):
    return list(out) if isinstance(out, (list, tuple)) else [out]


class Grouped(torch.nn.Module):
    """``y = grouped_mm(x, w, offsets)``; the weight a parameter stored as ``[E, N, K]``
    and transposed, as ``transformers`` passes its experts (packed at compile time), or
    an input: ``[E, K, N]`` as it is ("nn"), or ``[E, N, K]`` transposed (the kernel
    reads it in place, "nt")."""

    def __init__(self, experts=4, k=24, n=40, transposed_input=False):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(experts, n, k,
                                                generator=torch.Generator().manual_seed(0)))
        self.transposed_input = transposed_input

    def forward(self, x, offsets, w=None):
        if w is None:
            w = self.w.transpose(1, 2)
        elif self.transposed_input:
            w = w.transpose(1, 2)
        return torch.ops.transformers.grouped_mm_fallback(x, w, offsets)


# rows per expert: empty experts, rows past the last offset (zero in the result), all
# rows in one expert
OFFSETS = {"uneven": [3, 3, 11, 16], "empty_first": [0, 5, 5, 16], "tail": [2, 7, 9, 12],
           "one": [0, 0, 16, 16]}


WEIGHTS = {"parameter": "weight packed", "input": "weight nn", "input_transposed": "weight nt"}


@pytest.mark.parametrize("weight", list(WEIGHTS))
@pytest.mark.parametrize("offsets", list(OFFSETS))
def test_grouped_product_is_one_kernel_call_per_expert(offsets, weight):
    model = Grouped(transposed_input=weight == "input_transposed")
    x = torch.randn(16, 24, generator=torch.Generator().manual_seed(1))
    offs = torch.tensor(OFFSETS[offsets], dtype=torch.int32)
    w = model.w.detach()
    extra = {"parameter": (), "input": (w.transpose(1, 2).contiguous(),),
             "input_transposed": (w.clone(),)}[weight]
    mod = _import(model, x, offs, *extra)
    report = tirbyoc.explain(mod)
    assert [r.intrinsic for r in report.offloaded] == ["grouped_matmul"], str(report)
    assert WEIGHTS[weight] in str(report)
    ex = tirbyoc.compile(mod)
    inputs = [x.numpy(), offs.numpy()] + [e.numpy() for e in extra]
    got = _as_list(tirbyoc.run(ex, *inputs))[0]
    with torch.no_grad():
        ref = model(x, offs, *extra).numpy()
    _close(got, ref)
    if OFFSETS[offsets][-1] < 16:
        assert not got[OFFSETS[offsets][-1]:].any()  # rows past the last offset: zero
    # one build for other offsets (they are data): a different grouping, same rows
    offs2 = torch.tensor([4, 8, 12, 16], dtype=torch.int32)
    with torch.no_grad():
        ref2 = model(x, offs2, *extra).numpy()
    _close(_as_list(tirbyoc.run(ex, x.numpy(), offs2.numpy(), *inputs[2:]))[0], ref2)


def test_the_grouped_definition_alone_is_right_in_tvm():
    """What the converter emits compiles and is right without tirbyoc's rewrite (TVM's
    own build): the rewrite replaces a correct program, not a placeholder."""
    import tvm

    model = Grouped()
    x = torch.randn(16, 24, generator=torch.Generator().manual_seed(2))
    offs = torch.tensor(OFFSETS["tail"], dtype=torch.int32)
    ex = tvm.compile(_import(model, x, offs), target="llvm")
    vm = tvm.relax.VirtualMachine(ex, tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x.numpy()), tvm.runtime.tensor(offs.numpy()))[0]
    got = got.numpy()
    with torch.no_grad():
        _close(got, model(x, offs).numpy())


def test_offsets_that_decrease_are_an_error():
    model = Grouped()
    x = torch.randn(16, 24)
    offs = torch.tensor(OFFSETS["uneven"], dtype=torch.int32)
    ex = tirbyoc.compile(_import(model, x, offs))
    for bad in ([5, 3, 11, 16], [3, 3, 11, 17], [-1, 3, 11, 16]):
        with pytest.raises(Exception, match="nondecreasing and at most the number of rows"):
            tirbyoc.run(ex, x.numpy(), np.array(bad, np.int32))


def test_mixtral_with_its_default_experts():
    """A Mixtral layer as ``transformers`` builds it (grouped experts, the default):
    each of its two grouped products one kernel call per expert."""
    import transformers as tf

    cfg = tf.MixtralConfig(num_hidden_layers=1, hidden_size=64, intermediate_size=96,
                           num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                           num_local_experts=4, num_experts_per_tok=2,
                           max_position_embeddings=64)
    torch.manual_seed(0)
    model = tf.MixtralModel(cfg).eval()
    assert model.config._experts_implementation == "grouped_mm"

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, x):
            return self.m(input_ids=x, use_cache=False).last_hidden_state

    ids = torch.randint(0, 100, (1, 16), generator=torch.Generator().manual_seed(3))
    mod = examples.import_torch(Hidden(), ids)
    report = tirbyoc.explain(mod)
    grouped = [r for r in report.offloaded if r.intrinsic == "grouped_matmul"]
    assert len(grouped) == 2, str(report)
    ex = tirbyoc.compile(mod)
    for seed in (4, 5):
        x = torch.randint(0, 100, (1, 16), generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            ref = Hidden()(x).numpy()
        _close(_as_list(tirbyoc.run(ex, x.numpy()))[0], ref)


class Histc(torch.nn.Module):
    def __init__(self, *args):
        super().__init__()
        self.args = args

    def forward(self, x):
        return torch.histc(x, *self.args)


HISTC = {
    "expert_ids": ((4, 0, 3), torch.tensor([0.0, 1, 1, 3, 2, 3, 3, 0])),
    "range": ((7, -1.0, 2.5), torch.randn(1000, generator=torch.Generator().manual_seed(6))),
    # the edges themselves, just outside them, NaN: the maximum in the last bin, the
    # rest outside not counted
    "edges": ((10, -0.5, 0.5), torch.tensor([-0.5, 0.5, 0.4999, -0.50001, 0.50001,
                                             float("nan"), 0.1, 0.2, -0.2, 0.0])),
    "data_range": ((5, 0, 0), torch.randn(4, 50, generator=torch.Generator().manual_seed(7))),
    "one_value": ((3, 0, 0), torch.full((5,), 2.0)),  # widened by one each way
}


@pytest.mark.parametrize("case", list(HISTC))
def test_histc_counts_as_pytorch(case):
    args, x = HISTC[case]
    got = _as_list(tirbyoc.run(tirbyoc.compile(examples.import_torch(Histc(*args), x)),
                               x.numpy()))[0]
    ref = Histc(*args)(x).numpy()
    assert got.dtype == ref.dtype and np.array_equal(got, ref), (got, ref)


def test_integer_division_as_pytorch():
    """``perm // top_k`` in the experts: TVM's converter made the number an int32
    constant beside an int64 tensor, which Relax rejects; and it divided integers by
    ``/`` as integers (``arange(5) / 2`` gave ``[0, 0, 1, 1, 2]``), where PyTorch gives
    floats."""
    class Divide(torch.nn.Module):
        def forward(self, x):
            return (torch.div(x, 3, rounding_mode="floor"),
                    torch.div(x, 3, rounding_mode="trunc"),
                    torch.div(x, -4, rounding_mode="trunc"), x / 2,
                    torch.div(x, 2.5, rounding_mode="floor"), x / (x * 0 + 4))

    x = torch.arange(-10, 11, dtype=torch.int64)
    got = _as_list(tirbyoc.run(tirbyoc.compile(examples.import_torch(Divide(), x)),
                               x.numpy()))
    for value, expected in zip(got, Divide()(x)):
        assert value.dtype == expected.numpy().dtype
        np.testing.assert_array_equal(value, expected.numpy())
    # float tensors by ints and floats, every mode
    f = torch.linspace(-7.5, 7.5, 31)
    got = _as_list(tirbyoc.run(tirbyoc.compile(examples.import_torch(Divide(), f)), f.numpy()))
    for value, expected in zip(got, Divide()(f)):
        assert value.dtype == expected.numpy().dtype
        np.testing.assert_allclose(value, expected.numpy(), rtol=1e-6)


def test_the_benchmark_knows_grouped_experts_and_checks_them_one_at_a_time():
    """The benchmark's float64 reference runs grouped experts as a loop over the experts
    (PyTorch's grouped product takes no float64), the same products; ONNX Runtime is
    left out for them (the grouped op does not export)."""
    import transformers as tf

    from tirbyoc.bench_zoo import _grouped_experts, _with_experts

    cfg = tf.MixtralConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=48,
                           num_attention_heads=4, num_key_value_heads=2, vocab_size=50,
                           num_local_experts=4, num_experts_per_tok=2)
    model = tf.MixtralModel(cfg).eval()
    assert _grouped_experts(model)
    eager = _with_experts(model, "eager")
    assert not _grouped_experts(eager) and _grouped_experts(model)
    ids = torch.randint(0, 50, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _close(eager.double()(input_ids=ids).last_hidden_state.numpy(),
               model(input_ids=ids).last_hidden_state.numpy())
    dense = tf.MistralModel(tf.MistralConfig(num_hidden_layers=1, hidden_size=32,
                                             intermediate_size=48, num_attention_heads=4,
                                             num_key_value_heads=2, vocab_size=50))
    assert not _grouped_experts(dense)


def test_topk_without_sorting_is_converted():
    """DeepSeek-V3 picks its expert groups with ``topk(sorted=False)``, which TVM's
    converter refused; PyTorch leaves that order unspecified, and the sorted one is
    given: the same elements as PyTorch's, each with its index."""
    class TopK(torch.nn.Module):
        def forward(self, x):
            return x.topk(3, dim=-1, sorted=False)

    x = torch.randn(5, 9, generator=torch.Generator().manual_seed(8))
    values, indices = _as_list(tirbyoc.run(tirbyoc.compile(examples.import_torch(TopK(), x)),
                                           x.numpy()))
    want_values, _ = TopK()(x)
    np.testing.assert_array_equal(np.sort(values, -1), np.sort(want_values.numpy(), -1))
    np.testing.assert_array_equal(np.take_along_axis(x.numpy(), indices, -1), values)


def test_split_into_sizes_known_at_run_time_is_a_clear_error():
    """JetMoE splits its rows by counts it reads from a tensor: the pieces' shapes
    depend on data. The error names the op (TVM's said ``'Node' + int``)."""
    from tvm.relax.frontend.torch import from_exported_program

    class Split(torch.nn.Module):
        def forward(self, x, counts):
            sizes = counts.tolist()
            for size in sizes:
                torch._check(size >= 0)
            torch._check(sum(sizes) == x.shape[0])
            return torch.cat([p * (i + 1) for i, p in enumerate(x.split(sizes, 0))])

    ep = torch.export.export(Split(), (torch.randn(6, 3), torch.tensor([1, 2, 3])))
    with pytest.raises(NotImplementedError, match="split_with_sizes.*computed at run time"):
        from_exported_program(ep, custom_convert_map=tirbyoc.torch_converters())


@pytest.mark.parametrize("weight", ["parameter", "input"])
def test_a_users_matmul_kernel_computes_each_experts_rows(weight):
    """A declared ``matmul`` kernel ("nn", no strides: the toy library's batched one)
    takes each expert's rows, the built-in library left out; the transposed parameter
    is then passed as the kernel reads it ("nn")."""
    from .test_byo import TOY_C, TOY_H, by_library, declare_more

    lib = declare_more(tirbyoc.Library("more", sources=[TOY_C], cdef=TOY_H))
    model = Grouped()
    x = torch.randn(16, 24, generator=torch.Generator().manual_seed(9))
    offs = torch.tensor(OFFSETS["empty_first"], dtype=torch.int32)
    extra = (model.w.detach().transpose(1, 2).contiguous(),) if weight == "input" else ()
    mod = _import(model, x, offs, *extra)
    report = tirbyoc.explain(mod, libraries=[lib], builtin=False)
    assert by_library(report) == {"more": ["toy_bmm"]}, str(report)
    got = _as_list(tirbyoc.run(tirbyoc.compile(mod, libraries=[lib], builtin=False),
                               x.numpy(), offs.numpy(), *[e.numpy() for e in extra]))[0]
    with torch.no_grad():
        _close(got, model(x, offs, *extra).numpy())
