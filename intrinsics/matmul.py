"""The matmul family: ``C = epilogue(A @ B)``, batched or not, as one kernel call.

Pattern: a ``C[batch.., rows.., n] += A[batch.., rows.., k] * B[batch.., n, k]`` (or
``B[batch.., k, n]``) reduction, where either operand may broadcast over batch dimensions
(index 0 over a dimension of size 1, or fewer dimensions), then any run of epilogue
operations in the order the program has them: bias, relu, relu6, scale (``* c``), divide
(``/ c``), a residual add, and gelu (erf and tanh forms), silu, sigmoid, tanh,
hardswish, hardsigmoid, each of those possibly written as several blocks (see ``tirbyoc.epilogues.identify_unary``).
A chain takes at most one bias, one residual and one constant (scale and divide share it).

Kernel: ``tirbyoc_matmul_f32`` (``kernels/tirbyoc_kernels.h``), which reads the chain from
an int64 of 4-bit operation codes. Chains that ``intrinsics/dense.py`` or
``intrinsics/dense_relu6.py`` compute exactly on a 2-D weight go to those kernels instead.
"""

from __future__ import annotations

import numpy as np

from tirbyoc import _tvm as T
from tirbyoc.epilogues import BIAS, DIVIDE, RELU, RESIDUAL, SCALE
from tirbyoc.intrinsic import Intrinsic
from tirbyoc.matcher import Region, batch_stride, row_stride

from .dense_relu6 import RELU6

# Mirrors enum tirbyoc_epilogue_op and enum tirbyoc_b_layout in kernels/tirbyoc_kernels.h.
OPS = {"bias": 1, "relu": 2, "relu6": 3, "gelu_erf": 4, "gelu_tanh": 5, "silu": 6,
       "sigmoid": 7, "tanh": 8, "scale": 9, "divide": 10, "residual": 11, "hardswish": 12,
       "hardsigmoid": 13}
B_LAYOUT = {"nn": 0, "nt": 1, "packed": 2}
MAX_OPS = 15


def encode(names) -> int:
    """The kernel's int64 chain for a sequence of operation names (first op lowest)."""
    code = 0
    for i, name in enumerate(names):
        code |= OPS[name] << (4 * i)
    return code


def _check(chain) -> str | None:
    names = [step.name for step, _, _ in chain]
    if len(names) > MAX_OPS:
        return f"more than {MAX_OPS} epilogue operations"
    for once in ("bias", "residual"):
        if names.count(once) > 1:
            return f"a second {once} (the kernel takes one)"
    consts = {sm.params["scale"] for _, _, sm in chain if "scale" in sm.params}
    if len(consts) > 1:
        return "a second, different constant (the kernel takes one scale)"
    if 0.0 in {sm.params["scale"] for step, _, sm in chain if step.name == "divide"}:
        return "divides by zero"
    return None


def _param(region: Region, key, default=None):
    for _, _, sm in region.steps:
        if key in sm.params:
            return sm.params[key]
    return default


def matmul_arguments(region: Region) -> list:
    """``tirbyoc_matmul_f32``'s arguments for a matched region."""
    d, an = region.dense, T.analyzer()
    nm = len(d.rows) - d.nbatch
    i64 = T.as_int64
    if region.layout == "packed":
        weight = [T.buffer_pointer(region.weight, "r"), i64(0), i64(0)]
    else:
        # NOTE: the region passes may have replaced the weight (a transpose read in
        # place): its row stride is the new buffer's, not the matched one's.
        weight = [T.buffer_pointer(region.weight, "r"), i64(row_stride(region.weight, 1, an)),
                  i64(d.sw)]
    batch = d.rows[:d.nbatch]
    lead = [it.var for it in batch]
    ldc = row_stride(region.out, nm, an) if nm else d.n
    sc = batch_stride(region.out, lead, batch, an)
    bias, residual = region.capture("bias"), region.capture("residual")
    if residual is not None:
        ldr = row_stride(residual, nm, an) if nm else d.n
        sr = batch_stride(residual, lead, batch, an)
        res = [T.buffer_pointer(residual, "r"), i64(ldr), i64(sr)]
    else:
        res = [T.null_pointer(), i64(0), i64(0)]
    names = [step.name for step, _, _ in region.steps]
    return [i64(d.batch), i64(d.m), i64(d.n), i64(d.k),
            T.buffer_pointer(d.a, "r"), i64(d.lda), i64(d.sa),
            *weight, T.const(B_LAYOUT[region.layout], "int32"),
            T.buffer_pointer(region.out, "w"), i64(ldc), i64(sc),
            T.const(encode(names), "int64"),
            T.const(float(_param(region, "scale", 1.0)), "float32"),
            T.buffer_pointer(bias, "r") if bias is not None else T.null_pointer(),
            *res]


def reference(a: np.ndarray, w_kn: np.ndarray, bias=None) -> np.ndarray:
    """The plain product (+ bias) in float64, for a chain of at most a bias."""
    out = a.astype(np.float64) @ w_kn.astype(np.float64)
    if bias is not None:
        out = out + np.asarray(bias, np.float64).reshape(-1)
    return out.astype(a.dtype)


MATMUL = Intrinsic("matmul", (), "tirbyoc_matmul_{dtype}", matmul_arguments, reference,
                   chain=(BIAS, RESIDUAL, SCALE, DIVIDE, RELU, RELU6), check=_check)

INTRINSICS = [MATMUL]
