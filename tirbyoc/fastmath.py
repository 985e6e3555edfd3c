"""Vectorizable float32 ``exp``, ``tanh``, ``erf``, ``sigmoid``, ``sinh``, ``cosh`` and
``pow(x, n)`` (n = 1..4) for the fallback schedules.

LLVM lowers TIR's ``exp``/``tanh``/``erf`` on a vector to one scalar libm call per lane
(``expf@PLT`` twice per ``tanh`` element; ``sigmoid`` is an ``expf`` call too: a SiLU over
EfficientNet's 144 x 56 x 56 feature map took 30 ms at 2 threads), so a vectorized loop that calls them runs at
scalar speed. ``expand_math(func)`` replaces every float32 call with an expression of
adds, multiplies, a division, comparisons and integer bit operations, which LLVM keeps in
vector registers.

Accuracy (tests/test_fallback.py checks it over the whole float range against float64):
relative error below 1e-6 wherever the exact result is a normal float (below 1e-5 for
``erf``), an absolute error below FLT_MIN where it is subnormal (``exp`` flushes those to
0), exact limits (``exp``: inf above 88.73; ``tanh``/``erf``: +-1), and NaN in gives NaN
out. Other dtypes are left as they are.
"""

from __future__ import annotations

from . import _tvm as T

F32 = "float32"

# exp: Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, then Cephes' expf polynomial.
_LOG2E = 1.44269504088896341
# Below this exp is subnormal: it returns 0 (flushed), which keeps subnormal numbers out of
# the arithmetic (an x86 microcode assist each: a softmax over a mask of -inf ran 2x
# slower); the absolute error is below FLT_MIN (1.2e-38).
_EXP_MIN = -87.33654
_EXP_BIAS = 256  # makes xc / ln 2 positive before truncation
_LN2_HI = 0.693359375
_LN2_LO = -2.12194440e-4
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
             1.6666665459e-1, 5.0000001201e-1)
# tanh: a rational approximation x P(x^2) / Q(x^2) (Eigen's), clamped where tanh rounds to
# +-1 in float32; x itself below 4e-4.
_TANH_CLAMP = 7.90531110763549805
_TANH_TINY = 0.0004
# From here on tanh and erf are +-1 in float32 (from 9.0109 and 3.9192 on; just before,
# the float below 1), where the rationals give 1 - 2.4e-7.
_TANH_ONE = 9.0
_ERF_ONE = 3.919
_TANH_NUM = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11,
             5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04,
             4.89352455891786e-03)
_TANH_DEN = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03,
             4.89352518554385e-03)
# erf: a rational approximation x P(x^2) / Q(x^2) on [-4, 4] (Eigen's); +-1 beyond.
_ERF_CLAMP = 4.0
_ERF_NUM = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
            -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
            -1.60960333262415e-02)
_ERF_DEN = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
            -7.37332916720468e-03, -1.42647390514189e-02)


def _c(value):
    return T.const(value, F32)


def _horner(x, coeffs):
    acc = _c(coeffs[0])
    for c in coeffs[1:]:
        acc = acc * x + _c(c)
    return acc


def _let(value, body):
    """``body(value)``: ``value`` used wherever ``body`` uses its argument.

    Not a TIR ``Let``: TVM's vectorizer fails on a ``Let`` it meets twice with different
    values ("Let cannot bind the same var to two different values"), which happens when
    a block with an expanded call is inlined into two places of one consumer (WavLM:
    ``sigmoid(x).chunk(2)``) and when it scalarizes a loop it began to vectorize. The
    repeated subexpressions are the same objects in the IR, and LLVM computes each once
    (the zoo's models: the same bits, the same run and build times as with ``Let``s)."""
    return body(value)


def is_nan(x):
    """``isnan(x)``; for float32 as a test of its bits (exponent all ones, mantissa not
    zero), which TVM's vectorizer keeps in vectors: it scalarized a loop at TIR's
    ``isnan`` call, and every expansion below tests for NaN (an exp over a transposed
    [1, 512, 3199] ran a lane at a time, which LLVM vectorized again only where the
    loads were contiguous)."""
    if T.dtype_of(x) != F32:
        return T.isnan(x)
    return T.bitwise_and(T.reinterpret("int32", x), T.const(0x7FFFFFFF, "int32")) > \
        T.const(0x7F800000, "int32")


def _keep_nan(x, value):
    return T.select(is_nan(x), x, value)


def _pow2(k):
    """2**k as a float32 for an int32 k in [-126, 127]: the exponent field written
    (exp uses k in [-63, 64])."""
    return T.reinterpret(F32, T.shift_left(k + T.const(127, "int32"), T.const(23, "int32")))


def exp(x):
    return _let(x, _exp)


def _exp(x):
    xc = T.min_value(T.max_value(x, _c(_EXP_MIN)), _c(89.0))
    # n = round(xc / ln 2) in [-126, 128], by truncating a positive number: a float to
    # int conversion, which vectorizes everywhere (floor is a floorf call per lane on
    # x86-64 without SSE4.1, target "llvm"; TVM's simplifier folds (t + c) - c).
    bias = T.const(_EXP_BIAS, "int32")
    k = T.cast(xc * _c(_LOG2E) + _c(_EXP_BIAS + 0.5), "int32") - bias
    return _let(k, lambda ni: _let(T.cast(ni, F32), lambda n: _let(
        xc - n * _c(_LN2_HI) - n * _c(_LN2_LO), lambda r: _keep_nan(
            x, T.select(x < _c(_EXP_MIN), _c(0.0), (
                _horner(r, _EXP_POLY) * r * r + r + _c(1.0))
                # 2**n in two factors, so that n = 128 (overflow to inf) stays in the
                # exponent range of each.
                * _pow2(T.shift_right(ni, T.const(1, "int32")))
                * _pow2(ni - T.shift_right(ni, T.const(1, "int32"))))))))


def tanh(x):
    return _let(x, _tanh)


def _tanh(x):
    # NaN does not survive the clamp (max/min are compare-selects): checked separately.
    xc = T.min_value(T.max_value(x, _c(-_TANH_CLAMP)), _c(_TANH_CLAMP))

    def body(z):
        value = xc * _horner(z, _TANH_NUM) / _horner(z, _TANH_DEN)
        value = _unit_beyond(x, _TANH_ONE, value)
        return _keep_nan(x, T.select(T.abs(x) < _c(_TANH_TINY), x, value))

    return _let(xc * xc, body)


def erf(x):
    return _let(x, _erf)


def _erf(x):
    xc = T.min_value(T.max_value(x, _c(-_ERF_CLAMP)), _c(_ERF_CLAMP))
    return _let(xc, lambda c: _let(c * c, lambda z: _keep_nan(
        x, _unit_beyond(x, _ERF_ONE, c * _horner(z, _ERF_NUM) / _horner(z, _ERF_DEN)))))


def _unit_beyond(x, edge, value):
    """``value``, or +-1 (x's sign) where |x| >= edge."""
    return T.select(T.abs(x) >= _c(edge), T.select(x > _c(0.0), _c(1.0), _c(-1.0)), value)


def sigmoid(x):
    # 1 / (1 + exp(-x)): exp(-x) is inf below x = -88.7 (0 out, the exact value is
    # subnormal there) and 0 above 87.3 (1 out); NaN stays NaN.
    return _c(1.0) / (_c(1.0) + exp(-x))


# Beyond this |x|, e^-|x| is under 1.6e-8 of e^|x|: sinh and cosh are +-e^(|x| - ln 2),
# which stays finite up to where they overflow (89.4; e^x alone overflows from 88.7).
_HYPERBOLIC_ONE_SIDED = 9.0
_LN2 = 0.6931471805599453


def _half_exp(v):
    """e^|v| / 2, also past where e^|v| overflows (there from |v| - ln 2, rounded)."""
    a = T.abs(v)
    return T.select(a < _c(88.0), _c(0.5) * exp(a), exp(a - _c(_LN2)))


def sinh(x):
    # below |x| = 0.5 its odd series to x^9 / 9! (the next term within 2.4e-11 of it):
    # (e^x - e^-x) / 2 cancels there
    def body(v):
        z = v * v
        series = v * _horner(z, (1.0 / 362880, 1.0 / 5040, 1.0 / 120, 1.0 / 6, 1.0))
        far = T.select(v < _c(0.0), -_half_exp(v), _half_exp(v))
        near = T.select(T.abs(v) < _c(0.5), series, _c(0.5) * (exp(v) - exp(-v)))
        return T.select(T.abs(v) > _c(_HYPERBOLIC_ONE_SIDED), far, near)
    return _let(x, body)


def cosh(x):
    return _let(x, lambda v: T.select(T.abs(v) > _c(_HYPERBOLIC_ONE_SIDED), _half_exp(v),
                                      _c(0.5) * (exp(v) + exp(-v))))


# (sinh and cosh: TVM's LLVM backend has no vector form of them and failed to build:
# "unknown intrinsic tirx.sinh")
_EXPANSIONS = {"tirx.exp": exp, "tirx.tanh": tanh, "tirx.erf": erf, "tirx.sigmoid": sigmoid,
               "tirx.sinh": sinh, "tirx.cosh": cosh}


# pow(x, n) for these whole n: n - 1 multiplications (GPT-2's GELU has x ** 3; LLVM
# makes a vector pow a powf call per lane). Other exponents stay pow calls.
_POW_EXPONENTS = (1.0, 2.0, 3.0, 4.0)


def _power(x, n: int):
    def body(v):
        acc = v
        for _ in range(n - 1):
            acc = acc * v
        return acc
    return _let(x, body)


def _expansion(call):
    """The vectorizable expression for a float32 math call, or None."""
    op = getattr(call, "op", None)
    name = getattr(op, "name", None)
    if (name not in _EXPANSIONS and name != "tirx.pow") or T.dtype_of(call) != F32:
        return None
    if name in _EXPANSIONS:
        return _EXPANSIONS[name](call.args[0])
    if name == "tirx.pow" and isinstance(call.args[1], T.FloatImm) and \
            float(call.args[1].value) in _POW_EXPONENTS:
        return _power(call.args[0], int(call.args[1].value))
    return None


def _is_math_call(call) -> bool:
    op = getattr(call, "op", None)
    name = getattr(op, "name", None)
    return (name in _EXPANSIONS or name == "tirx.pow") and _expansion(call) is not None


def calls_math(node) -> bool:
    """Whether a TIR statement or expression calls float32 exp/tanh/erf/sigmoid (or pow
with a small whole exponent)."""
    found = []
    T.structural_walk(node, [(T.Call, lambda c: found.append(c) if _is_math_call(c) else None)],
                      order="pre")
    return bool(found)


def expand_math(func):
    """``func`` with every float32 exp/tanh/erf/sigmoid call expanded (``func`` itself when there
    is none)."""
    if not calls_math(func.body):
        return func

    def rewrite(call):
        expanded = _expansion(call) if isinstance(call, T.Call) else None
        return call if expanded is None else expanded

    return T.structural_map(func, [(T.Call, rewrite)], order="post")
