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


# ---- steps of the chain intrinsic (intrinsics/matmul.py) ----

def _scale(ctx: StepContext):
    v = ctx.value
    if not isinstance(v, T.Mul):
        return NoMatch(f"not a scale ({type(v).__name__})")
    pair = input_and_other(ctx, v.a, v.b)
    if pair is None:
        return NoMatch("the multiply does not read the previous result at its own indices")
    c = float_value(pair[1])
    if c is None:
        return NoMatch("multiplies by a non-constant")
    return StepMatch(params={"scale": c})


def _divide(ctx: StepContext):
    v = ctx.value
    if not isinstance(v, T.Div):
        return NoMatch(f"not a division ({type(v).__name__})")
    if not ctx.is_input(v.a):
        return NoMatch("the division does not divide the previous result")
    c = float_value(v.b)
    if c is None:
        return NoMatch("divides by a non-constant")
    return StepMatch(params={"scale": c})


def _residual(ctx: StepContext):
    v = ctx.value
    if not isinstance(v, T.Add):
        return NoMatch(f"not a residual add ({type(v).__name__})")
    pair = input_and_other(ctx, v.a, v.b)
    if pair is None:
        return NoMatch("the add does not read the previous result at its own indices")
    other = pair[1]
    own = list(ctx.rows) + [ctx.col]
    if not (isinstance(other, T.BufferLoad) and len(other.indices) == len(own)
            and all(e.same_as(o) for e, o in zip(other.indices, own))):
        return NoMatch("adds something that is not a tensor of the output's shape read at "
                       "the output's own indices")
    if other.source.dtype != ctx.dtype:
        return NoMatch(f"residual dtype {other.source.dtype} differs from {ctx.dtype}")
    return StepMatch({"residual": other.source})


SCALE = EpilogueStep("scale", _scale)
DIVIDE = EpilogueStep("divide", _divide)
RESIDUAL = EpilogueStep("residual", _residual, operands=2)


# ---- unary operations written as one or more elementwise blocks ----

def _erf(x):
    import math

    import numpy as np

    return np.vectorize(math.erf, otypes=[float])(x)


def _definitions():
    import numpy as np

    c = np.sqrt(2.0 / np.pi)
    return {
        "gelu_erf": lambda x: 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0))),
        "gelu_tanh": lambda x: 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x ** 3))),
        "silu": lambda x: x / (1.0 + np.exp(-x)),
        "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
        "tanh": np.tanh,
        "hardswish": lambda x: x * np.clip(x + 3.0, 0.0, 6.0) / 6.0,
        "hardsigmoid": lambda x: np.clip(x + 3.0, 0.0, 6.0) / 6.0,
    }


# Where each operation is not analytic (its kinks); none for the others.
_KINKS = {"hardswish": (-3.0, 3.0), "hardsigmoid": (-3.0, 3.0)}


def _float32_constant_forms():
    """Operations as a graph writes them with float32 constants, which the kernels use as
    well (``chain_f32.h``: ``0.044715f``): HF GPT-2's written-out tanh GELU, its
    ``sqrt(2 / pi)`` and ``0.044715`` rounded to float32, is 6e-7 from the exact definition
    at the probes far in the negative tail, where ``1 + tanh`` cancels. ONNX's
    ``HardSigmoid(alpha=1/6, beta=0.5)`` (what ``torch.onnx`` writes for hardsigmoid) is
    ``clip(alpha x + 0.5, 0, 1)`` with alpha rounded to float32: 1.5e-8 from the exact
    definition near -3, where the result nears 0."""
    import numpy as np

    c, k = float(np.float32(np.sqrt(2.0 / np.pi))), float(np.float32(0.044715))
    sixth = float(np.float32(1.0 / 6.0))
    return {"gelu_tanh": lambda x: 0.5 * x * (1.0 + np.tanh(c * (x + k * x ** 3))),
            "hardsigmoid": lambda x: np.clip(sixth * x + 0.5, 0.0, 1.0)}


def _probes():
    import numpy as np

    mags = np.logspace(-4, 1.2, 60)
    return np.concatenate([np.linspace(-9.0, 9.0, 181), mags, -mags, [0.0]])


class _NotElementwise(Exception):
    pass


class _Piecewise:
    """A piecewise-linear function of the operation's input x: ``knots`` (sorted, where
    it bends) and ``pieces``, one (slope, intercept) per interval between them."""

    def __init__(self, knots, pieces):
        self.knots, self.pieces = tuple(knots), tuple(pieces)

    @staticmethod
    def constant(c):
        return _Piecewise((), ((0.0, float(c)),))

    def is_constant(self):
        return not self.knots and self.pieces[0][0] == 0.0

    def on(self, knots):
        """The pieces over the finer partition ``knots`` (which holds ``self.knots``)."""
        out, i = [], 0
        for k in knots:
            out.append(self.pieces[i])
            if i < len(self.knots) and self.knots[i] == k:
                i += 1
        return out + [self.pieces[i]]

    def combine(self, other, fn):
        """The pieces of ``fn(self, other)`` for an affine ``fn`` of two affine pieces."""
        knots = sorted(set(self.knots) | set(other.knots))
        return _Piecewise(knots, [fn(a, b) for a, b in zip(self.on(knots), other.on(knots))])

    def extreme(self, other, larger):
        """max (``larger``) or min of two piecewise-linear functions: a knot more where
        they cross inside a piece; adjacent equal pieces merged."""
        import math

        for c in (self, other):  # min(f, inf) = f, max(f, -inf) = f, and their opposites
            if c.is_constant() and math.isinf(c.pieces[0][1]):
                if (c.pieces[0][1] > 0) != larger:
                    return other if c is self else self
                return c
        if not all(math.isfinite(v) for f in self.pieces + other.pieces for v in f):
            raise _NotElementwise("takes a max or min of a non-finite line")
        knots = sorted(set(self.knots) | set(other.knots))
        bounds = [-math.inf] + knots + [math.inf]

        def pick(f, g, lo, hi):  # the larger (smaller) of two lines that do not cross
            x = 0.0 if lo == -hi else lo + 1.0 if hi == math.inf else \
                hi - 1.0 if lo == -math.inf else (lo + hi) / 2
            fx, gx = f[0] * x + f[1], g[0] * x + g[1]
            return f if (fx >= gx) == larger else g

        out_knots, out = [], []
        for i, (f, g) in enumerate(zip(self.on(knots), other.on(knots))):
            lo, hi = bounds[i], bounds[i + 1]
            if i:
                out_knots.append(lo)
            x = (g[1] - f[1]) / (f[0] - g[0]) if f[0] != g[0] else lo
            if lo < x < hi:
                out += [pick(f, g, lo, x), pick(f, g, x, hi)]
                out_knots.append(x)
            else:
                out.append(pick(f, g, lo, hi))
        keep_knots, keep = [], [out[0]]
        for k, piece in zip(out_knots, out[1:]):
            if piece != keep[-1]:
                keep_knots.append(k)
                keep.append(piece)
        return _Piecewise(keep_knots, keep)


class _Value:
    """An expression's value at the probes (``at``), where it is not analytic
    (``kinks``), and its piecewise-linear form (``linear``; None where it has none)."""

    def __init__(self, at, kinks=(), linear=None):
        self.at, self.kinks, self.linear = at, frozenset(kinks), linear


_CALLS = {f"{ns}.{fn}": fn for ns in ("tir", "tirx") for fn in ("tanh", "exp", "erf", "sigmoid")}


def _affine_op(node, a, b):
    """The pieces of ``a node b`` (+, -, or * or / by a constant), or None."""
    if node in (T.Add, T.Sub):
        sign = 1.0 if node is T.Add else -1.0
        return a.combine(b, lambda f, g: (f[0] + sign * g[0], f[1] + sign * g[1]))
    if node is T.Mul and (a.is_constant() or b.is_constant()):
        c, f = (a, b) if a.is_constant() else (b, a)
        k = c.pieces[0][1]
        return _Piecewise(f.knots, [(s * k, t * k) for s, t in f.pieces])
    if node is T.Div and b.is_constant() and b.pieces[0][1] != 0.0:
        k = b.pieces[0][1]
        return _Piecewise(a.knots, [(s / k, t / k) for s, t in a.pieces])
    return None


def _evaluate(expr, env, own):
    """``expr`` in float64 over the probe points, as a ``_Value``; ``env``: [(buffer,
    _Value)]."""
    import numpy as np

    if isinstance(expr, (T.FloatImm, T.IntImm)):
        return _Value(float(expr.value), linear=_Piecewise.constant(expr.value))
    if isinstance(expr, T.Cast):
        if not str(expr.dtype).startswith("float"):
            raise _NotElementwise(f"casts to {expr.dtype}")
        return _evaluate(expr.value, env, own)
    if isinstance(expr, T.BufferLoad):
        if len(expr.indices) != len(own) or not all(
                e.same_as(o) for e, o in zip(expr.indices, own)):
            raise _NotElementwise(f"reads {expr.source.name} at other indices")
        for buf, value in env:
            if buf.same_as(expr.source):
                return value
        raise _NotElementwise(f"reads {expr.source.name}, not only the previous result")
    binary = {T.Add: np.add, T.Sub: np.subtract, T.Mul: np.multiply, T.Div: np.divide}
    for node, fn in binary.items():
        if isinstance(expr, node):
            a, b = _evaluate(expr.a, env, own), _evaluate(expr.b, env, own)
            linear = _affine_op(node, a.linear, b.linear) \
                if a.linear is not None and b.linear is not None else None
            return _Value(fn(a.at, b.at), linear.knots if linear else a.kinks | b.kinks,
                          linear)
    if isinstance(expr, (T.Max, T.Min)):
        a, b = _evaluate(expr.a, env, own), _evaluate(expr.b, env, own)
        if a.linear is None or b.linear is None:
            raise _NotElementwise("takes a max or min of a value that is not piecewise "
                                  "linear in the input")
        larger = isinstance(expr, T.Max)
        linear = a.linear.extreme(b.linear, larger)
        return _Value((np.maximum if larger else np.minimum)(a.at, b.at), linear.knots,
                      linear)
    if isinstance(expr, T.Call) and hasattr(expr.op, "name") and \
            expr.op.name in ("tir.pow", "tirx.pow") and len(expr.args) == 2 and \
            float_value(expr.args[1]) is not None:
        # x ** c with a constant c (the cube of HF GPT-2's written-out tanh GELU)
        a = _evaluate(expr.args[0], env, own)
        return _Value(np.power(a.at, float_value(expr.args[1])), a.kinks)
    if isinstance(expr, T.Call) and hasattr(expr.op, "name") and expr.op.name in _CALLS:
        (arg,) = expr.args
        a = _evaluate(arg, env, own)
        name = _CALLS[expr.op.name]
        if name == "erf":
            return _Value(_erf(a.at), a.kinks)
        if name == "sigmoid":
            return _Value(1.0 / (1.0 + np.exp(-a.at)), a.kinks)
        return _Value(getattr(np, name)(a.at), a.kinks)
    raise _NotElementwise(f"uses {type(expr).__name__}")


# Agreement required between a group of blocks and an operation's definition, both in
# float64 at every probe point: far below float32 rounding, far above float64's.
PROBE_RTOL = 1e-7


def _kinks_within(kinks, allowed) -> bool:
    """Whether every kink is one of ``allowed`` (to PROBE_RTOL: ONNX's HardSigmoid bends
    at -0.5 / float32(1/6), 9e-8 from -3)."""
    return all(any(abs(k - a) <= PROBE_RTOL * max(1.0, abs(a)) for a in allowed)
               for k in kinks)


def identify_unary(nests, source, sink):
    """The unary operation that ``nests`` (in program order, ending with ``sink``) compute
    from ``source``, checked numerically at a fixed set of probe points, or a NoMatch.

    Only +, -, *, /, float constants, powers with a constant exponent, tanh/exp/erf/sigmoid
    and max/min of piecewise-linear values are evaluated (no selects or comparisons). The
    kinks of the max/min are found exactly, and must be the operation's own (hardswish
    bends at -3 and 3; the others nowhere): between them both are analytic, so a group
    either is the operation on the whole line or differs from it at the probes.
    """
    import numpy as np

    x = _probes()
    env = [(source, _Value(x, linear=_Piecewise((), ((1.0, 0.0),))))]
    with np.errstate(all="ignore"):
        try:
            for nest in nests:
                value = _evaluate(nest.store.value, env, list(nest.store.indices))
                value.at = np.broadcast_to(value.at, x.shape)
                env.append((nest.store.buffer, value))
        except _NotElementwise as exc:
            return NoMatch(str(exc))
        got = env[-1][1]
        forms = list(_definitions().items()) + list(_float32_constant_forms().items())
        for name, ref in forms:
            want = ref(x)
            if np.all(np.abs(got.at - want) <= PROBE_RTOL * np.abs(want) + 1e-12) and \
                    _kinks_within(got.kinks, _KINKS.get(name, ())):
                return StepMatch(params={"op": name}, nests=tuple(n for n in nests
                                                                  if n is not sink))
    return NoMatch(f"the elementwise blocks compute none of {', '.join(_definitions())}")


UNARY_OPS = tuple(_definitions())

UNARY_STEPS = {name: EpilogueStep(name, lambda ctx: NoMatch("a unary operation is found as a "
                                                         "group of blocks"))
               for name in UNARY_OPS}
