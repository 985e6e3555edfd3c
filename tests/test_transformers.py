"""Transformers imported from PyTorch, compiled by tirbyoc: numerics against PyTorch and the
exact list of what is offloaded (static and symbolic sequence length).

Small sizes (d=64, 4 heads) keep compile times short; the structure is that of the
benchmark's BERT-base and GPT-2 layers. Tolerance: rtol 1e-4 against PyTorch's float32
result, absolute floor 1e-4 * max|reference|.
"""

import numpy as np
import pytest

import tirbyoc
from tirbyoc import examples

import torch  # noqa: E402  (the test extra installs it)

RTOL = 1e-4
D, HEADS, FF = 64, 4, 128


def _assert_close(got, ref):
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=RTOL * float(np.abs(ref).max()))


def _first(out):
    return out[0] if isinstance(out, (list, tuple)) else out


# Offloaded PrimFuncs: qkv (dense_bias), projection + residual, fc + GELU, out + residual,
# and the whole attention (q @ k^T, its scale, the causal mask of the GPT-2 block or the
# fully-masked-row fix-up of the encoder layer, softmax, @ v) as one fused kernel call.
# The encoder layer scales q and k before the product; those scales stay TVM ops.
LINEARS = {"gpt2_block": ["dense_bias", "dense_bias_gelu_tanh", "dense_bias_residual",
                          "dense_bias_residual"],
           "encoder_layer": ["dense_bias", "dense_bias_gelu_erf", "dense_bias_residual",
                             "dense_bias_residual"]}
MODELS = {(name, dynamic): ["attention"] for name in LINEARS for dynamic in (False, True)}
BUILD = {"gpt2_block": lambda: examples.gpt2_block_torch(D, HEADS),
         "encoder_layer": lambda: examples.encoder_layer_torch(D, HEADS, FF)}


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic-seq"])
@pytest.mark.parametrize("name", sorted(BUILD))
def test_transformer_from_pytorch(name, dynamic):
    expected = LINEARS[name] + MODELS[name, dynamic]
    model = BUILD[name]()
    mod = examples.import_torch(model, torch.randn(1, 16, D), dynamic_seq=dynamic)
    report = tirbyoc.explain(mod)
    assert sorted(r.intrinsic for r in report.offloaded) == sorted(expected), str(report)
    ex = tirbyoc.compile(mod)
    for seq in ((16,) if not dynamic else (2, 16, 33)):
        x = torch.randn(1, seq, D, generator=torch.Generator().manual_seed(seq))
        with torch.no_grad():
            ref = model(x).numpy()
        _assert_close(_first(tirbyoc.run(ex, x.numpy())), ref)


@pytest.mark.parametrize("name", sorted(BUILD))
def test_sink_reshapes_keeps_values_and_lets_epilogues_fuse(name):
    """The graph rewrite alone (TVM's own build both ways): same values, and after fusion
    each Linear's GELU / residual add shares the matmul's PrimFunc."""
    import tvm
    from tvm import relax

    from tirbyoc import relax_prep

    model = BUILD[name]()
    mod = examples.import_torch(model, torch.randn(1, 16, D), dynamic_seq=True)
    sunk = relax_prep.sink_reshapes(mod)
    x = torch.randn(1, 7, D, generator=torch.Generator().manual_seed(0))
    outs = []
    for m in (mod, sunk):
        vm = relax.VirtualMachine(tvm.compile(m, "llvm"), tvm.cpu())
        outs.append(_first(list(vm["main"](tvm.runtime.tensor(x.numpy())))).numpy())
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-6, atol=1e-6)
    fused, _ = relax_prep.prepare(sunk)
    names = [gv.name_hint for gv in fused.get_global_vars()]
    assert any("matmul" in n and "gelu" in n for n in names), names
    assert sum("matmul" in n and n.count("add") == 2 for n in names) == 2, names


@pytest.mark.parametrize("name", sorted(BUILD))
def test_explain_says_how_every_primfunc_runs(name):
    mod = examples.import_torch(BUILD[name](), torch.randn(1, 16, D), dynamic_seq=True)
    report = tirbyoc.explain(mod)
    assert report.schedules
    how = report.schedules.values()
    assert all(h.startswith(("kernel ", "schedule: ")) for h in how), report.schedules
    # the attention and the Linear layers are kernels; layer norm tirbyoc's
    # row-reduction rule
    assert sum(h.startswith("kernel ") for h in how) == len(report.offloaded)
    assert report.schedules["tirbyoc_attention"] == "kernel tirbyoc_attention_f32"
    assert not any("softmax" in name for name in report.schedules), report.schedules
    assert report.schedules["layer_norm"] == "schedule: tirbyoc RowReduction"
    assert "how each PrimFunc runs:" in str(report)
