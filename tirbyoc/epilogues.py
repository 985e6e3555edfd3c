"""Epilogue steps that kernels fuse after the dense core: bias add and relu.

Each step looks at one elementwise consumer block through a ``StepContext`` and returns a
``StepMatch`` or a ``NoMatch`` with the reason. The helpers at the top (``float_value``,
``input_and_other``) are what a new step in an intrinsic file builds on.
"""

from __future__ import annotations

from . import _tvm as T
from .intrinsic import EpilogueStep, NoMatch, StepContext, StepMatch


def float_value(expr):
    """The value of a float (or int) constant, else None."""
    if isinstance(expr, (T.FloatImm, T.IntImm)):
        return float(expr.value)
    if isinstance(expr, T.Cast) and isinstance(expr.value, (T.FloatImm, T.IntImm)):
        return float(expr.value.value)
    return None


def input_and_other(ctx: StepContext, a, b):
    """Order a commutative pair as (input, other); None when neither is the input."""
    if ctx.is_input(a):
        return a, b
    if ctx.is_input(b):
        return b, a
    return None


def _bias(ctx: StepContext):
    v = ctx.value
    if not isinstance(v, T.Add):
        return NoMatch(f"not a bias add ({type(v).__name__})")
    pair = input_and_other(ctx, v.a, v.b)
    if pair is None:
        return NoMatch("the add does not read the previous result at its own indices")
    other = pair[1]
    if not isinstance(other, T.BufferLoad):
        return NoMatch("adds a scalar or an expression, not a bias vector")
    bias = other.source
    if bias.dtype != ctx.dtype:
        return NoMatch(f"bias dtype {bias.dtype} differs from {ctx.dtype}")
    idx = list(other.indices)
    if not idx:
        return NoMatch("adds a 0-d tensor (a scalar), not a bias vector")
    an = T.analyzer()
    # NOTE: a row iterator of extent 1 is always 0 (what legalization writes for a [1, N]
    # bias added to a single row); any other row index makes a per-row bias.
    idx = [T.const(0, "int64") if any(e.same_as(r) for r in ctx.unit_rows) else e
           for e in idx]
    for e in idx:
        if any(e.same_as(r) for r in ctx.rows):
            return NoMatch("bias is indexed by the row (a per-row bias); the kernel adds a "
                           "per-column bias")
    if not idx[-1].same_as(ctx.col):
        return NoMatch("bias is not indexed by the output column in its last dimension")
    for e, dim in zip(idx[:-1], bias.shape[:-1]):
        if not (an.can_prove_equal(e, 0) and an.can_prove_equal(dim, 1)):
            return NoMatch("bias has a leading dimension that is not a broadcast of size 1")
    if bias.strides and not an.can_prove_equal(bias.strides[-1], 1):
        return NoMatch("bias has a non-unit inner stride")
    return StepMatch({"bias": bias})


def _is_zero(expr) -> bool:
    return float_value(expr) == 0.0


def _relu(ctx: StepContext):
    v = ctx.value
    if isinstance(v, T.Max):
        pair = input_and_other(ctx, v.a, v.b)
        if pair is None:
            return NoMatch("max does not read the previous result at its own indices")
        c = float_value(pair[1])
        if c is None:
            return NoMatch("max with a non-constant operand is not relu")
        if c != 0.0:
            return NoMatch(f"max(x, {c:g}) is not relu (relu clamps at 0)")
        return StepMatch()
    if isinstance(v, T.Select) or T.is_if_then_else(v):
        cond, t, f = (v.condition, v.true_value, v.false_value) if isinstance(v, T.Select) \
            else tuple(v.args)
        # x > 0 ? x : 0   (also >=, and the mirrored comparisons)
        positive = ((isinstance(cond, (T.GT, T.GE)) and ctx.is_input(cond.a) and _is_zero(cond.b))
                    or (isinstance(cond, (T.LT, T.LE)) and _is_zero(cond.a)
                        and ctx.is_input(cond.b)))
        negative = ((isinstance(cond, (T.LT, T.LE)) and ctx.is_input(cond.a) and _is_zero(cond.b))
                    or (isinstance(cond, (T.GT, T.GE)) and _is_zero(cond.a)
                        and ctx.is_input(cond.b)))
        if positive and ctx.is_input(t) and _is_zero(f):
            return StepMatch()
        if negative and _is_zero(t) and ctx.is_input(f):
            return StepMatch()
        return NoMatch("select is not of the form x > 0 ? x : 0")
    return NoMatch(f"not a relu ({type(v).__name__})")


BIAS = EpilogueStep("bias", _bias, operands=2)
RELU = EpilogueStep("relu", _relu)
