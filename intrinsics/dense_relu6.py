"""dense + bias + relu6: ``C = min(max(A @ W + bias, 0), 6)`` as one kernel call.

Adds one epilogue step, ``RELU6`` (a clamp to [0, 6], written ``max(min(x, 6), 0)`` or
``min(max(x, 0), 6)``, operands either way round), to the dense core and bias step of
``intrinsics/dense.py``. Kernels: ``tirbyoc_dense_relu6_f32_{nt,nn,packed}``, same
arguments as the other dense kernels.
"""

from __future__ import annotations

import numpy as np

from tirbyoc import _tvm as T
from tirbyoc.epilogues import BIAS, float_value, input_and_other
from tirbyoc.intrinsic import EpilogueStep, Intrinsic, NoMatch, StepMatch

from .dense import dense_arguments


def _clamp_bounds(ctx, expr):
    """``(low, high)`` when ``expr`` clamps the input: max(min(x, hi), lo) / min(max(x, lo), hi)."""
    for outer, inner_type, outer_is_low in ((T.Max, T.Min, True), (T.Min, T.Max, False)):
        if not isinstance(expr, outer):
            continue
        for inner, bound in ((expr.a, expr.b), (expr.b, expr.a)):
            if not isinstance(inner, inner_type):
                continue
            pair = input_and_other(ctx, inner.a, inner.b)
            if pair is None:
                continue
            b_outer, b_inner = float_value(bound), float_value(pair[1])
            if b_outer is None or b_inner is None:
                continue
            return (b_outer, b_inner) if outer_is_low else (b_inner, b_outer)
    return None


def _relu6(ctx):
    bounds = _clamp_bounds(ctx, ctx.value)
    if bounds is None:
        return NoMatch("not a clamp of the previous result between two constants")
    if bounds != (0.0, 6.0):
        return NoMatch(f"clamp to [{bounds[0]:g}, {bounds[1]:g}] is not relu6 ([0, 6])")
    return StepMatch()


RELU6 = EpilogueStep("relu6", _relu6)


def _reference(a: np.ndarray, w_kn: np.ndarray, bias=None) -> np.ndarray:
    out = a.astype(np.float64) @ w_kn.astype(np.float64)
    if bias is not None:
        out = out + np.asarray(bias, np.float64).reshape(-1)
    return np.clip(out, 0.0, 6.0).astype(a.dtype)


INTRINSICS = [
    Intrinsic("dense_bias_relu6", (BIAS, RELU6), "tirbyoc_dense_relu6_{dtype}_{layout}",
              dense_arguments, _reference),
    Intrinsic("dense_relu6", (RELU6,), "tirbyoc_dense_relu6_{dtype}_{layout}",
              dense_arguments, _reference),
]
