"""The dense family: ``C = A @ W (+ bias) (-> relu)`` as one kernel call.

Pattern: a ``C[rows.., n] += A[rows.., k] * W`` reduction (weight read as W[n, k] -> the
``nt`` kernels, or W[k, n] -> ``nn``), then optionally a per-column bias add, then
optionally a relu. Kernels: ``tirbyoc_dense_f32_{nt,nn}`` (bias may be NULL) and
``tirbyoc_dense_relu_f32_{nt,nn}``, declared in ``kernels/tirbyoc_kernels.h``.
Argument mapping (all sizes and strides int64, strides in elements):
``(m, n, k, A, lda, W, ldw, bias or NULL, C, ldc)``; for a weight packed at compile time
(``tirbyoc_dense[_relu]_f32_packed``) the same without ``ldw``.
"""

from __future__ import annotations

import numpy as np

from tirbyoc import _tvm as T
from tirbyoc.epilogues import BIAS, RELU
from tirbyoc.intrinsic import Intrinsic
from tirbyoc.matcher import Region, row_stride


def dense_arguments(region: Region) -> list:
    """The kernel arguments for a matched dense region (shared by every dense kernel)."""
    d = region.dense
    bias = region.capture("bias")
    an = T.analyzer()
    weight = [T.buffer_pointer(region.weight, "r")]
    if region.layout != "packed":
        weight.append(T.as_int64(row_stride(region.weight, 1, an)))
    ldc = row_stride(region.out, len(d.rows), an)
    return [T.as_int64(d.m), T.as_int64(d.n), T.as_int64(d.k),
            T.buffer_pointer(d.a, "r"), T.as_int64(d.lda), *weight,
            T.buffer_pointer(bias, "r") if bias is not None else T.null_pointer(),
            T.buffer_pointer(region.out, "w"), T.as_int64(ldc)]


def _reference(relu: bool):
    def reference(a: np.ndarray, w_kn: np.ndarray, bias=None) -> np.ndarray:
        out = a.astype(np.float64) @ w_kn.astype(np.float64)
        if bias is not None:
            out = out + np.asarray(bias, np.float64).reshape(-1)
        if relu:
            out = np.maximum(out, 0.0)
        return out.astype(a.dtype)

    return reference


INTRINSICS = [
    Intrinsic("dense_bias_relu", (BIAS, RELU), "tirbyoc_dense_relu_{dtype}_{layout}",
              dense_arguments, _reference(relu=True)),
    Intrinsic("dense_relu", (RELU,), "tirbyoc_dense_relu_{dtype}_{layout}",
              dense_arguments, _reference(relu=True)),
    Intrinsic("dense_bias", (BIAS,), "tirbyoc_dense_{dtype}_{layout}",
              dense_arguments, _reference(relu=False)),
    Intrinsic("dense", (), "tirbyoc_dense_{dtype}_{layout}",
              dense_arguments, _reference(relu=False)),
]
