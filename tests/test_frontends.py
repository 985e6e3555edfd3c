"""The seed MLP imported from PyTorch (torch.export) and from ONNX, offloaded end to end.

Tolerance: within rtol 1e-4 of the framework's own result (absolute floor 1e-4 *
max|reference|).
"""

import numpy as np
import pytest

import tirbyoc
from tirbyoc import examples

import torch  # noqa: E402  (the test extra installs it)
import onnx  # noqa: E402,F401

RTOL = 1e-4


def assert_close(got, ref):
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=RTOL * float(np.abs(ref).max()))


def _first(out):
    return out[0] if isinstance(out, list) else out


@pytest.mark.parametrize("dynamic_batch", [False, True], ids=["static", "dynamic-batch"])
def test_seed_mlp_from_pytorch(dynamic_batch):
    mod, model = examples.mlp_torch(64, dynamic_batch=dynamic_batch)
    report = tirbyoc.explain(mod)
    assert sorted(r.intrinsic for r in report.offloaded) == ["dense_bias", "dense_bias_relu"]
    assert not report.rejected
    ex = tirbyoc.compile(mod)
    for batch in ((64,) if not dynamic_batch else (1, 64, 100)):
        x = torch.randn(batch, 800, generator=torch.Generator().manual_seed(batch))
        with torch.no_grad():
            ref = model(x).numpy()
        assert_close(_first(tirbyoc.run(ex, x.numpy())), ref)


def test_seed_mlp_from_onnx():
    from onnx.reference import ReferenceEvaluator

    mod, model = examples.mlp_onnx()
    offloaded = tirbyoc.apply_tir_byoc(mod)
    # the ONNX initializers are constants: packed at compile time
    assert tirbyoc.offloaded_kernels(offloaded) == ["tirbyoc_dense_f32_packed",
                                                    "tirbyoc_dense_relu_f32_packed"]
    ex = tirbyoc.compile(mod)
    for batch in (1, 64):
        x = np.random.default_rng(batch).standard_normal((batch, 800), np.float32)
        ref = ReferenceEvaluator(model).run(None, {"x": x})[0]
        assert_close(_first(tirbyoc.run(ex, x)), ref)
