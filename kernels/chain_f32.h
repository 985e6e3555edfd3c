/*
 * chain_f32.h - the elementwise epilogue chain (tirbyoc_epilogue_op) on
 * vector registers, the float32 math it needs, and the row routines built on
 * it (unary operations, softmax).
 *
 * Included once by each per-instruction-set file (dense_f32_generic.c,
 * dense_f32_avx2.c, dense_f32_avx512.c) after its target pragma, so the same
 * source is compiled for each instruction set with that file's vector width:
 * ch_vf is one vector register of floats (GCC vector extension). Every
 * function is branch-free over the lanes (selects, not branches), and each
 * lane goes through the same operations whatever the width, so results do
 * not depend on which path (micro-kernel, few-rows routine, row routine) or
 * which lane an output takes.
 *
 * The micro-kernels hand each finished register tile to tb_chain_tile
 * before storing it: C is written once, with the chain applied (the gather
 * conv path with a transcendental operation instead runs tb_chain_block
 * over each row group's stored outputs, in L1).
 *
 * Accuracy (float32, against a float64 reference, measured over the float
 * range): tanh, sigmoid and silu within 5e-7 relative; the erf GELU within
 * 5e-7 for x > -2 and 1e-6 below (ch_gelu_erf); the tanh GELU within 7e-7
 * for x > -2 and 2e-5 further into the lower tail (there the float32
 * rounding of the exponent's argument is amplified by exp; PyTorch's own
 * float32 GELU flushes those values to 0). Results below about 1e-37
 * (denormals) may lose precision. NaN propagates through every operation.
 */
#ifndef TIRBYOC_CHAIN_F32_H
#define TIRBYOC_CHAIN_F32_H

#include <stdint.h>
#if defined(__SSE__)
#include <immintrin.h>
#endif

#include "dense_f32_internal.h"

#define CH_INLINE static inline __attribute__((always_inline))

/* The including file's vector width (its target pragma defines __AVX512F__
 * or __AVX__; baseline x86-64 has 16-byte SSE registers). */
#if defined(__AVX512F__)
#define CH_VBYTES 64
#elif defined(__AVX__)
#define CH_VBYTES 32
#else
#define CH_VBYTES 16
#endif
#define CH_LANES (CH_VBYTES / 4)
/* Naturally aligned (memory is read and written through ch_loadu /
 * ch_storeu, never through a ch_vf pointer). */
typedef float ch_vf __attribute__((vector_size(CH_VBYTES)));
typedef int32_t ch_vi __attribute__((vector_size(CH_VBYTES)));

CH_INLINE ch_vf ch_splat(float x)
{
    ch_vf v;
    int l;
    for (l = 0; l < CH_LANES; ++l)
        v[l] = x;
    return v;
}

CH_INLINE ch_vf ch_loadu(const float *p)
{
    ch_vf v;
    __builtin_memcpy(&v, p, sizeof(v));
    return v;
}

CH_INLINE void ch_storeu(float *p, ch_vf v) { __builtin_memcpy(p, &v, sizeof(v)); }

/* Lanes l < lanes of p[l * stride] (stride 0: p[0] in every lane); the other
 * lanes are 0 and no memory past the last real lane is read. */
CH_INLINE ch_vf ch_gather(const float *p, int64_t stride, int lanes)
{
    ch_vf v = ch_splat(0.0f);
    int l;
    if (stride == 1 && lanes >= CH_LANES)
        return ch_loadu(p);
    if (stride == 0)
        return ch_splat(p[0]);
    for (l = 0; l < lanes && l < CH_LANES; ++l)
        v[l] = p[l * stride];
    return v;
}

/* The first `lanes` floats at p (0 < lanes <= CH_LANES) in the low lanes,
 * the rest 0, and their store: no memory past them is touched (masked
 * loads and stores where the instruction set has them). */
CH_INLINE ch_vf ch_loadn(const float *p, int lanes)
{
#if defined(__AVX512F__)
    return (ch_vf)_mm512_maskz_loadu_ps((__mmask16)((1u << lanes) - 1u), p);
#elif defined(__AVX2__)
    return (ch_vf)_mm256_maskload_ps(
        p, _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
#else
    return ch_gather(p, 1, lanes);
#endif
}

CH_INLINE void ch_storen(float *p, ch_vf v, int lanes)
{
#if defined(__AVX512F__)
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << lanes) - 1u), (__m512)v);
#elif defined(__AVX2__)
    _mm256_maskstore_ps(p,
                        _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes),
                                           _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
                        (__m256)v);
#else
    int l;
    for (l = 0; l < lanes; ++l)
        p[l] = v[l];
#endif
}

/* Lanewise m ? a : b (m: all ones or all zeros per lane). */
CH_INLINE ch_vf ch_sel(ch_vi m, ch_vf a, ch_vf b)
{
    return (ch_vf)((m & (ch_vi)a) | (~m & (ch_vi)b));
}

/* Lanewise: a where x's sign bit is set, else b (so -0.0 and a NaN with its sign
 * set take a). With AVX, VBLENDVPS reads the sign bits itself: one instruction
 * instead of a compare and a blend. */
CH_INLINE ch_vf ch_sel_sign(ch_vf x, ch_vf a, ch_vf b)
{
#if defined(__AVX__) && !defined(__AVX512F__)
    return (ch_vf)_mm256_blendv_ps((__m256)b, (__m256)a, (__m256)x);
#else
    return ch_sel((ch_vi)x < 0, a, b);
#endif
}

/* Lanewise a > b ? a : b (NaN never wins a compare): exactly what x86's
 * MAXPS computes (b when either is NaN), one instruction instead of a compare
 * and a select. */
CH_INLINE ch_vf ch_vmax(ch_vf a, ch_vf b)
{
#if defined(__AVX512F__)
    return (ch_vf)_mm512_max_ps((__m512)a, (__m512)b);
#elif defined(__AVX__)
    return (ch_vf)_mm256_max_ps((__m256)a, (__m256)b);
#elif defined(__SSE__)
    return (ch_vf)_mm_max_ps((__m128)a, (__m128)b);
#else
    return ch_sel(a > b, a, b);
#endif
}

/* a * b + c, with one rounding where the instruction set has FMA (one
 * instruction instead of two; the polynomials below are Horner chains of
 * them). Without FMA, a product and a sum. */
CH_INLINE ch_vf ch_fma(ch_vf a, ch_vf b, ch_vf c)
{
#if defined(__AVX512F__)
    return (ch_vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
    return (ch_vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    return a * b + c;
#endif
}

/* 1 / d for a normal positive d (the sigmoid's 1 + e^-|x| in [1, 2], the
 * erf GELU's denominator in [1, 8400]). With AVX-512, VRCP14PS (relative
 * error under 2^-14) and one Newton step, r + r (1 - d r): within about one
 * unit in the last place of the division, at a fraction of VDIVPS's cost
 * (the sigmoid, SiLU and tanh-GELU run about 20% faster). The narrower
 * instruction sets divide: their estimate has 12 bits, and the two steps it
 * needs were slower than VDIVPS on Zen 3 (SiLU 8.2 against 5.3 ns per 8
 * lanes). */
CH_INLINE ch_vf ch_recip(ch_vf d)
{
#if defined(__AVX512F__)
    const ch_vf r = (ch_vf)_mm512_rcp14_ps((__m512)d);
    return ch_fma(r, ch_fma(-d, r, ch_splat(1.0f)), r);
#else
    return 1.0f / d;
#endif
}

CH_INLINE ch_vf ch_abs(ch_vf x) { return (ch_vf)((ch_vi)x & 0x7FFFFFFF); }

CH_INLINE ch_vf ch_copysign(ch_vf mag, ch_vf sgn)
{
    return (ch_vf)(((ch_vi)mag & 0x7FFFFFFF) | ((ch_vi)sgn & (int32_t)0x80000000));
}

/* x - n ln2 for n = round(x / ln2), a finite x in [-104, 88.73]
 * (Cody-Waite split of ln2: n times its high part is exact). */
CH_INLINE ch_vf ch_exp_split(ch_vf x, ch_vi *n)
{
    /* round to nearest by the 1.5 * 2^23 shift */
    const ch_vf t = ch_fma(x, ch_splat(1.44269504f), ch_splat(12582912.0f));
    const ch_vf nf = t - 12582912.0f;
    const ch_vf r = ch_fma(nf, ch_splat(-0.693145751953125f), x);
    *n = (ch_vi)t - 0x4B400000;
    return ch_fma(nf, ch_splat(-1.428606765330187e-06f), r);
}

/* e^r for |r| <= ln2 / 2 + 1e-4 (the reduced argument's bound) by
 * 1 + r + r^2 (c2 + c3 r + c4 r^2 + c5 r^3), c2..c5 fitted to e^r's relative
 * error over that interval (minimax: 1.0e-7 in exact arithmetic, against the
 * degree-6 Taylor polynomial's 1.7e-7 truncation, with one step fewer). The
 * leading 1 + r stays exact, as in the Taylor form, so the steps without FMA
 * round no worse. */
CH_INLINE ch_vf ch_exp_poly(ch_vf r)
{
    ch_vf q = ch_fma(r, ch_splat(0.00831698440f), ch_splat(0.0418905057f));
    q = ch_fma(q, r, ch_splat(0.166670635f));
    q = ch_fma(q, r, ch_splat(0.499992311f));
    q = ch_fma(q, r, ch_splat(1.0f));
    return ch_fma(q, r, ch_splat(1.0f));
}

/* e^r for |r| <= ln2 / 2 by its degree-6 Taylor polynomial (truncation
 * below 1.7e-7 relative, and near 0 for small |r|): the erf GELU's e^(-a^2 / 2),
 * whose lower tail without FMA stays within its bound (1e-6) only with this
 * form; ch_exp_poly's minimax fit took it to 1.2e-6 there. */
CH_INLINE ch_vf ch_exp_poly6(ch_vf r)
{
    ch_vf q = ch_fma(r, ch_splat(1.0f / 720), ch_splat(1.0f / 120));
    q = ch_fma(q, r, ch_splat(1.0f / 24));
    q = ch_fma(q, r, ch_splat(1.0f / 6));
    q = ch_fma(q, r, ch_splat(0.5f));
    q = ch_fma(q, r, ch_splat(1.0f));
    return ch_fma(q, r, ch_splat(1.0f));
}

/* e^x for a finite x in [-104, 88.73]: x = n ln2 + r with |r| <= ln2 / 2;
 * returns e^r and n. */
CH_INLINE ch_vf ch_exp_reduce(ch_vf x, ch_vi *n) { return ch_exp_poly(ch_exp_split(x, n)); }

#if defined(__AVX512F__)
/* e^x = e^r 2^n as ch_exp_reduce's, with 2^n applied by VSCALEFPS: p 2^n
 * rounded once, whatever n (denormal and overflowing results included), so
 * each caller below gets the value of its integer scaling steps bit for bit
 * in one instruction instead of four or five. */
CH_INLINE ch_vf ch_exp_scaled(ch_vf x)
{
    const ch_vf t = ch_fma(x, ch_splat(1.44269504f), ch_splat(12582912.0f));
    const ch_vf nf = t - 12582912.0f;
    ch_vf r = ch_fma(nf, ch_splat(-0.693145751953125f), x);
    r = ch_fma(nf, ch_splat(-1.428606765330187e-06f), r);
    return (ch_vf)_mm512_scalef_ps((__m512)ch_exp_poly(r), (__m512)nf);
}
#endif

/* e^x for x in [-104, 88.7228] (NaN passes): e^r 2^n (ch_exp_reduce), 2^n
 * applied in two halves so that results near the overflow and denormal ends
 * stay exact (one rounding, of the last product). */
CH_INLINE ch_vf ch_exp_clamped(ch_vf x)
{
#if defined(__AVX512F__)
    return ch_exp_scaled(x);
#else
    ch_vi n, n1;
    const ch_vf p = ch_exp_reduce(x, &n);
    n1 = n >> 1;
    return p * (ch_vf)((n1 + 127) << 23) * (ch_vf)((n - n1 + 127) << 23);
#endif
}

/* e^x for x in [-104, 0] (NaN passes): ch_exp_clamped's value, bit for
 * bit, with one scaling step: e^r 2^(n + 24) is a normal float for n >= -150,
 * and the product by 2^-24 rounds it once, as the second half step does. */
CH_INLINE ch_vf ch_exp_neg(ch_vf x)
{
#if defined(__AVX512F__)
    return ch_exp_scaled(x);
#else
    ch_vi n;
    const ch_vf p = ch_exp_reduce(x, &n);
    return p * (ch_vf)((n + (127 + 24)) << 23) * (1.0f / 16777216.0f);
#endif
}

/* e^x over the whole float range. */
CH_INLINE ch_vf ch_exp(ch_vf x)
{
    /* the selects send NaN to the low end; the last line gives it back */
    const ch_vf lo = ch_splat(-104.0f), hi = ch_splat(88.7228f);
    ch_vf xc = ch_sel(x > lo, x, lo), p;
    xc = ch_sel(xc < hi, xc, hi);
    p = ch_exp_clamped(xc);
    p = ch_sel(x > ch_splat(88.72284f), ch_splat(__builtin_inff()), p);
    return ch_sel(x != x, x, p);
}

/* e^x for x <= 0 or NaN (softmax rows: a score minus its row's maximum), as
 * ch_exp gives it but with one 2^n step: x >= -87.3 keeps 2^n a normal
 * float, so the result is ch_exp's, bit for bit; below that, where ch_exp
 * gives a denormal under 1.2e-38, this gives 0 (softmax divides by a sum of
 * at least 1, so such a term is below any float weight's precision). NaN
 * passes the clamp and the arithmetic; -inf gives 0. */
CH_INLINE ch_vf ch_exp_nonpos(ch_vf x)
{
    const ch_vf lo = ch_splat(-87.3f);
    const ch_vi low = x < lo;
#if defined(__AVX512F__)
    const ch_vf p = ch_exp_scaled(ch_sel(low, lo, x));
#else
    ch_vi n;
    const ch_vf p = ch_exp_reduce(ch_sel(low, lo, x), &n) * (ch_vf)((n + 127) << 23);
#endif
    return (ch_vf)(~low & (ch_vi)p);
}

/* e^y - 1 for y >= 0: its Taylor series below 0.35 (no cancellation), else
 * e^y - 1. */
CH_INLINE ch_vf ch_expm1_pos(ch_vf y)
{
    const ch_vf small = y * (1.0f + y * (1.0f / 2 + y * (1.0f / 6 + y * (1.0f / 24 + y * (
        1.0f / 120 + y * (1.0f / 720 + y * (1.0f / 5040 + y * (1.0f / 40320))))))));
    return ch_sel(y < ch_splat(0.35f), small, ch_exp(y) - 1.0f);
}

/* tanh(x) = sign(x) * m / (m + 2), m = e^(2|x|) - 1; |x| >= 9 gives +-1. */
CH_INLINE ch_vf ch_tanh(ch_vf x)
{
    const ch_vf nine = ch_splat(9.0f);
    ch_vf a = ch_abs(x), m;
    a = ch_sel(a < nine, a, nine);
    m = ch_expm1_pos(2.0f * a);
    return ch_sel(x != x, x, ch_copysign(m / (m + 2.0f), x));
}

/* 1 / (1 + e^-x) as s = 1 / (1 + e), e = e^-|x| <= 1: s for x >= 0, e s
 * below, so nothing overflows, the reciprocal's argument is in [1, 2] and
 * the far negative tail keeps its relative precision down to the
 * denormals. NaN propagates. */
CH_INLINE ch_vf ch_sigmoid_e(ch_vf x)
{
    /* e^-|x|: ch_exp's value (MAXPS keeps a NaN x) */
    return ch_exp_neg(ch_vmax(ch_splat(-104.0f), -ch_abs(x)));
}

/* The sigmoid of x from e = ch_sigmoid_e(x). */
CH_INLINE ch_vf ch_sigmoid_from_e(ch_vf x, ch_vf e)
{
    const ch_vf s = ch_recip(1.0f + e);
    return ch_sel_sign(x, e * s, s); /* -0.0: e = 1, so e s = s */
}

CH_INLINE ch_vf ch_sigmoid(ch_vf x) { return ch_sigmoid_from_e(x, ch_sigmoid_e(x)); }

/* Registers that ch_sigmoid_group takes at once. */
#define CH_SIGMOID_GROUP 4

/* The sigmoid of CH_SIGMOID_GROUP registers v[q] (silu: times v[q]), in two
 * passes: every e^-|v| first, then each division and select. Each lane goes
 * through ch_sigmoid's operations (the same bits); only their order in the
 * instruction stream changes. One register's sigmoid is a chain of about 60
 * cycles of latency, and a loop of them, one after the other, kept too few
 * in flight: on Zen 3 (AVX2) a SiLU over 1M floats took 0.63-0.78 ns a float
 * so, 0.56-0.64 in groups of 4 (groups of 2: 0.60-0.67, 8: 0.66, 16, where
 * the registers spill: 0.75). */
CH_INLINE void ch_sigmoid_group(ch_vf *v, int silu)
{
    ch_vf e[CH_SIGMOID_GROUP];
    int q;
    for (q = 0; q < CH_SIGMOID_GROUP; ++q)
        e[q] = ch_sigmoid_e(v[q]);
    for (q = 0; q < CH_SIGMOID_GROUP; ++q) {
        const ch_vf s = ch_sigmoid_from_e(v[q], e[q]);
        v[q] = silu ? v[q] * s : s;
    }
}

/* a / b for a normal positive b: a times ch_recip(b) with AVX-512, else a
 * division (one rounding). */
CH_INLINE ch_vf ch_div(ch_vf a, ch_vf b)
{
#if defined(__AVX512F__)
    return a * ch_recip(b);
#else
    return a / b;
#endif
}

/* The erf GELU, x Phi(x), Phi(x) = P(N(0, 1) <= x) = erfc(-x / sqrt 2) / 2.
 * With a = |x|, the upper tail Q(a) = 1 - Phi(a) = Phi(-a) is
 * e^(-a^2 / 2) R(a), R(a) = erfcx(a / sqrt 2) / 2 (the Mills ratio over
 * sqrt(2 pi)): R falls smoothly from 1/2 like 1 / (a sqrt(2 pi)), and the
 * rational function of degrees 4 and 5 below, fitted to relative error over
 * [0, 13.2], is within 2e-8 of it. Phi(x) is Q(a) below 0 (relative
 * precision all the way down the tail, no cancellation) and 1 - Q(a) above.
 * a^2 is carried as p + g: p = a * a rounded and g its remainder (exact
 * from an FMA; without FMA, p is the exact square of a's 12 high bits and g
 * the rest), and -g / 2 is added to the reduced argument of e^(-p / 2), so
 * the tail's relative error does not grow with a^2.
 * Below x = -13.2, where Phi(x) is under the smallest normal float, Phi is
 * 0 (so gelu(-inf) is NaN, as 0.5 x (1 + erf(x / sqrt 2)) gives in PyTorch
 * and TVM). Measured against float64 over the float range: within 3.5e-7
 * relative above x = -2 and 6.2e-7 below with FMA, 4.3e-7 and 8.7e-7
 * without. */
CH_INLINE ch_vf ch_gelu_erf(ch_vf x)
{
    const ch_vf top = ch_splat(13.2f);
    /* NaN and +-inf: Q = 0, so gelu(+inf) = +inf and gelu(-inf) = -inf * 0 */
    const ch_vi keep = ch_abs(x) < top;
    const ch_vf a = ch_sel(keep, ch_abs(x), top);
    ch_vf p, g, num, den, q;
    ch_vi n;
#if defined(__FMA__) || defined(__AVX512F__)
    p = a * a;
    g = ch_fma(a, a, -p);
#else
    {
        const ch_vf hi = (ch_vf)((ch_vi)a & (int32_t)0xFFFFF000);
        p = hi * hi;
        g = (a - hi) * (a + hi);
    }
#endif
    /* e^(-a^2 / 2), then 2^n: -a^2 / 2 >= -87.2 keeps 2^n a normal float */
    q = ch_exp_poly6(ch_exp_split(p * -0.5f, &n) + g * -0.5f);
    q *= (ch_vf)((n + 127) << 23);
    num = ch_fma(a, ch_splat(0.00401165057f), ch_splat(0.0399261415f));
    num = ch_fma(num, a, ch_splat(0.181133717f));
    num = ch_fma(num, a, ch_splat(0.43545115f));
    num = ch_fma(num, a, ch_splat(0.5f));
    den = ch_fma(a, ch_splat(0.0100555718f), ch_splat(0.100087464f));
    den = ch_fma(den, a, ch_splat(0.463923693f));
    den = ch_fma(den, a, ch_splat(1.1937629f));
    den = ch_fma(den, a, ch_splat(1.66878724f));
    den = ch_fma(den, a, ch_splat(1.0f));
    q = (ch_vf)(keep & (ch_vi)(q * ch_div(num, den)));
    return x * ch_sel(x < ch_splat(0.0f), q, 1.0f - q);
}

/* One unary operation (tb_op_unary's codes of tirbyoc_epilogue_op); any
 * other code leaves v as is. */
CH_INLINE ch_vf ch_unary(ch_vf v, int op)
{
    const ch_vf zero = ch_splat(0.0f), six = ch_splat(6.0f);
    switch (op) {
    case TIRBYOC_EPI_RELU:
        return ch_sel(v < zero, zero, v); /* NaN and -0.0 pass */
    case TIRBYOC_EPI_RELU6:
        return ch_sel(v < zero, zero, ch_sel(v > six, six, v));
    case TIRBYOC_EPI_GELU_ERF:
        return ch_gelu_erf(v);
    case TIRBYOC_EPI_GELU_TANH:
        /* 0.5 v (1 + tanh(u)) = v sigmoid(2u): no cancellation for v << 0 */
        return v * ch_sigmoid(1.5957691216057308f * (v + 0.044715f * v * v * v));
    case TIRBYOC_EPI_SILU:
        return v * ch_sigmoid(v);
    case TIRBYOC_EPI_SIGMOID:
        return ch_sigmoid(v);
    case TIRBYOC_EPI_TANH:
        return ch_tanh(v);
    case TIRBYOC_EPI_HARDSWISH:
    case TIRBYOC_EPI_HARDSIGMOID: {
        /* PyTorch's order of operations (a true division by 6), so that the
         * result is its bits; NaN passes both selects */
        const ch_vf t = v + ch_splat(3.0f);
        const ch_vf c = ch_sel(t < zero, zero, ch_sel(t > six, six, t));
        return op == TIRBYOC_EPI_HARDSWISH ? v * c / six : c / six;
    }
    default:
        return v;
    }
}

/*
 * The chain ops (ch->ops, or what is left of it) on a finished register tile t (ch_vf registers; the
 * micro-kernels hand over their accumulators this way and store what comes
 * back, so C is written once, with finished outputs). t[o * nv + q] holds,
 * in lane l:
 *   cols == 0: the output at row ci + o, column cj + q * CH_LANES + l;
 *   cols == 1: the output at row ci + q * CH_LANES + l, column cj + o
 *              (kernels whose registers run down C's columns).
 * Only lanes below extent - q * CH_LANES are outputs (registers with none
 * are skipped); the others are computed on and must not be stored, and no
 * bias or residual element past the last output is read. The operations go
 * one at a time over the whole tile, so the registers' independent
 * computations overlap in the pipeline. Not inlined: one copy per ISA.
 */
static __attribute__((noinline)) void
tb_chain_tile(const tb_chain *ch, int64_t ops, ch_vf *t, int outer, int nv,
              int64_t ci, int64_t cj, int64_t extent, int cols)
{
    const int n = outer * nv;
    int o, q, x;
    for (; ops != 0; ops >>= 4) {
        const int op = (int)(ops & 15);
        switch (op) {
        case TIRBYOC_EPI_BIAS:
        case TIRBYOC_EPI_RESIDUAL:
            for (o = 0; o < outer; ++o)
                for (q = 0; q < nv && q * CH_LANES < extent; ++q) {
                    const int lanes = (int)(extent - q * CH_LANES);
                    const int64_t i = cols ? ci + q * CH_LANES : ci + o;
                    const int64_t j = cols ? cj + o : cj + q * CH_LANES;
                    t[o * nv + q] +=
                        op == TIRBYOC_EPI_BIAS
                            ? ch_gather(ch->bias + j, cols ? 0 : 1, lanes)
                            : ch_gather(ch->residual + i * ch->ldr + j,
                                        cols ? ch->ldr : 1, lanes);
                }
            break;
        case TIRBYOC_EPI_SCALE:
            for (x = 0; x < n; ++x)
                t[x] *= ch->scale;
            break;
        case TIRBYOC_EPI_DIVIDE:
            for (x = 0; x < n; ++x)
                t[x] /= ch->scale;
            break;
/* the switch outside the loop: each loop body is straight-line code */
#define CH_TILE_UNARY(OP)                                                     \
    case OP:                                                                  \
        for (x = 0; x < n; ++x)                                               \
            t[x] = ch_unary(t[x], OP);                                        \
        break;
            CH_TILE_UNARY(TIRBYOC_EPI_RELU)
            CH_TILE_UNARY(TIRBYOC_EPI_RELU6)
            CH_TILE_UNARY(TIRBYOC_EPI_GELU_ERF)
            CH_TILE_UNARY(TIRBYOC_EPI_GELU_TANH)
            CH_TILE_UNARY(TIRBYOC_EPI_SILU)
            CH_TILE_UNARY(TIRBYOC_EPI_SIGMOID)
            CH_TILE_UNARY(TIRBYOC_EPI_TANH)
            CH_TILE_UNARY(TIRBYOC_EPI_HARDSWISH)
            CH_TILE_UNARY(TIRBYOC_EPI_HARDSIGMOID)
#undef CH_TILE_UNARY
        default:
            break; /* codes were validated by the caller */
        }
    }
}

/* y[0:n] = op(x[0:n]) for one unary operation (x == y allowed). */
static void tb_unary_row(int op, int64_t n, const float *x, float *y)
{
    int64_t j = 0;
    int l;
    if (op == TIRBYOC_EPI_SILU || op == TIRBYOC_EPI_SIGMOID) {
        for (; j + CH_LANES * CH_SIGMOID_GROUP <= n; j += CH_LANES * CH_SIGMOID_GROUP) {
            ch_vf v[CH_SIGMOID_GROUP];
            int q;
            for (q = 0; q < CH_SIGMOID_GROUP; ++q)
                v[q] = ch_loadu(x + j + q * CH_LANES);
            ch_sigmoid_group(v, op == TIRBYOC_EPI_SILU);
            for (q = 0; q < CH_SIGMOID_GROUP; ++q)
                ch_storeu(y + j + q * CH_LANES, v[q]);
        }
    }
    switch (op) {
#define CH_UNARY_CASE(OP)                                                     \
    case OP:                                                                  \
        for (; j + CH_LANES <= n; j += CH_LANES)                              \
            ch_storeu(y + j, ch_unary(ch_loadu(x + j), OP));                  \
        break;
        CH_UNARY_CASE(TIRBYOC_EPI_RELU)
        CH_UNARY_CASE(TIRBYOC_EPI_RELU6)
        CH_UNARY_CASE(TIRBYOC_EPI_GELU_ERF)
        CH_UNARY_CASE(TIRBYOC_EPI_GELU_TANH)
        CH_UNARY_CASE(TIRBYOC_EPI_SILU)
        CH_UNARY_CASE(TIRBYOC_EPI_SIGMOID)
        CH_UNARY_CASE(TIRBYOC_EPI_TANH)
        CH_UNARY_CASE(TIRBYOC_EPI_HARDSWISH)
        CH_UNARY_CASE(TIRBYOC_EPI_HARDSIGMOID)
#undef CH_UNARY_CASE
    default:
        return;
    }
    if (j < n) {
        const ch_vf v = ch_unary(ch_gather(x + j, 1, (int)(n - j)), op);
        for (l = 0; j + l < n; ++l)
            y[j + l] = v[l];
    }
}

/* Floats of a row the chain goes over at a time (4 KiB: in L1 between its
 * operations). */
#define CH_CHUNK 1024

/* Applies the chain to outputs already in C[0:m, 0:n] (row stride ldc),
 * whose element (i, j) is the output at row i0 + i, column j0 + j of its
 * matrix (an empty product's zeros, or sums accumulated in memory): over
 * chunks of a row, one operation at a time, each a straight loop over the
 * chunk (the unary ones tb_unary_row's), so each output goes through the
 * same float operations as in tb_chain_tile. (A single SiLU over 16 x 56 x
 * 56 outputs: 1.36-1.5x faster on Zen 3 than copying 16 registers at a time
 * through tb_chain_tile.) */
static void tb_chain_block(const tb_chain *ch, float *c, int64_t ldc, int64_t m,
                           int64_t n, int64_t i0, int64_t j0)
{
    int64_t i, jb, j, ops;
    for (i = 0; i < m; ++i)
        for (jb = 0; jb < n; jb += CH_CHUNK) {
            float *row = c + i * ldc + jb;
            const int64_t nb = n - jb < CH_CHUNK ? n - jb : CH_CHUNK;
            for (ops = ch->ops; ops != 0; ops >>= 4) {
                const int op = (int)(ops & 15);
                if (op == TIRBYOC_EPI_BIAS || op == TIRBYOC_EPI_RESIDUAL) {
                    const float *r = op == TIRBYOC_EPI_BIAS
                                         ? ch->bias + j0 + jb
                                         : ch->residual + (i0 + i) * ch->ldr + j0 + jb;
                    for (j = 0; j + CH_LANES <= nb; j += CH_LANES)
                        ch_storeu(row + j, ch_loadu(row + j) + ch_loadu(r + j));
                    for (; j < nb; ++j)
                        row[j] += r[j];
                } else if (op == TIRBYOC_EPI_SCALE || op == TIRBYOC_EPI_DIVIDE) {
                    const int mul = op == TIRBYOC_EPI_SCALE;
                    const ch_vf s = ch_splat(ch->scale);
                    for (j = 0; j + CH_LANES <= nb; j += CH_LANES)
                        ch_storeu(row + j, mul ? ch_loadu(row + j) * s
                                               : ch_loadu(row + j) / s);
                    for (; j < nb; ++j)
                        row[j] = mul ? row[j] * ch->scale : row[j] / ch->scale;
                } else {
                    tb_unary_row(op, nb, row, row);
                }
            }
        }
}

/* Rows of W per pass of tb_gemv_nn. */
#define CH_GEMV_ROWS 8

/* c[0:n] = x[0:k] @ W (k x n, row stride ldw): one row of A against a W as
 * given ("nn"), the few-rows path's matrix-vector case, then the chain ch
 * (NULL: none; c is row ci, columns from cj, of its matrix). CH_GEMV_ROWS whole rows of W stream through per pass and
 * c (in L1 or L2) takes their sum once per pass; each output is one FMA
 * chain over k in order. Eight whole rows: eight long streams for the
 * prefetchers and one load and store of c per eight rows (four rows in
 * 4 KiB pieces streamed a 4096 x 4096 W at 15-17 GB/s on one Zen 4 core,
 * this at 25-29; NumPy's OpenBLAS: 24-27). */
__attribute__((unused)) /* (the portable build has no caller) */
static void tb_gemv_nn(int64_t n, int64_t k, const float *x, const float *w,
                       int64_t ldw, float *c, const tb_chain *ch, int64_t ci,
                       int64_t cj)
{
    int64_t p, j;
    int s;
    for (p = 0; p < k; p += CH_GEMV_ROWS) {
        const int steps = k - p < CH_GEMV_ROWS ? (int)(k - p) : CH_GEMV_ROWS;
        const float *wr = w + p * ldw;
        ch_vf xs[CH_GEMV_ROWS];
        for (s = 0; s < CH_GEMV_ROWS; ++s)
            xs[s] = ch_splat(s < steps ? x[p + s] : 0.0f);
        j = 0;
        if (steps == CH_GEMV_ROWS)
            for (; j + CH_LANES <= n; j += CH_LANES) {
                ch_vf v = p == 0 ? ch_splat(0.0f) : ch_loadu(c + j);
                for (s = 0; s < CH_GEMV_ROWS; ++s)
                    v = ch_fma(xs[s], ch_loadu(wr + s * ldw + j), v);
                ch_storeu(c + j, v);
            }
        for (; j < n; j += CH_LANES) { /* the last pass, and a partial vector */
            const int lanes = n - j < CH_LANES ? (int)(n - j) : CH_LANES;
            ch_vf v = p == 0 ? ch_splat(0.0f) : ch_loadn(c + j, lanes);
            for (s = 0; s < steps; ++s)
                v = ch_fma(xs[s], ch_loadn(wr + s * ldw + j, lanes), v);
            ch_storen(c + j, v, lanes);
        }
    }
    if (ch != NULL)
        tb_chain_block(ch, c, n, 1, n, ci, cj);
}

/* The sum and the maximum (a NaN lane never wins) of v's lanes, as a
 * butterfly: each step combines lane l with lane l ^ w (w = CH_LANES / 2,
 * ..., 1), log2 steps of one permute each instead of a chain of CH_LANES - 1
 * dependent operations. */
#define CH_X4(w) (w), 1 ^ (w), 2 ^ (w), 3 ^ (w)
#define CH_X8(w) CH_X4(w), 4 ^ (w), 5 ^ (w), 6 ^ (w), 7 ^ (w)
#define CH_X16(w) CH_X8(w), 8 ^ (w), 9 ^ (w), 10 ^ (w), 11 ^ (w), 12 ^ (w), \
                  13 ^ (w), 14 ^ (w), 15 ^ (w)
#if CH_LANES == 16
#define CH_XOR(w) ((ch_vi){CH_X16(w)})
#elif CH_LANES == 8
#define CH_XOR(w) ((ch_vi){CH_X8(w)})
#else
#define CH_XOR(w) ((ch_vi){CH_X4(w)})
#endif

CH_INLINE ch_vf ch_max_step(ch_vf v, ch_vi perm)
{
    const ch_vf u = __builtin_shuffle(v, perm);
    return ch_sel((u > v) | (v != v), u, v);
}

CH_INLINE float ch_hsum(ch_vf v)
{
#if CH_LANES == 16
    v += __builtin_shuffle(v, CH_XOR(8));
#endif
#if CH_LANES >= 8
    v += __builtin_shuffle(v, CH_XOR(4));
#endif
    v += __builtin_shuffle(v, CH_XOR(2));
    v += __builtin_shuffle(v, CH_XOR(1));
    return v[0];
}

CH_INLINE float ch_hmax(ch_vf v)
{
#if CH_LANES == 16
    v = ch_max_step(v, CH_XOR(8));
#endif
#if CH_LANES >= 8
    v = ch_max_step(v, CH_XOR(4));
#endif
    v = ch_max_step(v, CH_XOR(2));
    v = ch_max_step(v, CH_XOR(1));
    return v[0];
}

/* The larger of init and the maximum of x[0:n], in CH_LANES lanes then across
 * them (a NaN never wins). */
static float ch_row_max(int64_t n, const float *x, float init)
{
    const int64_t full = n / CH_LANES * CH_LANES;
    ch_vf acc = ch_splat(init), acc2 = acc;
    float mx;
    int64_t j;
    /* two accumulators: one MAXPS latency per two vectors */
    for (j = 0; j + CH_LANES < full; j += 2 * CH_LANES) {
        acc = ch_vmax(ch_loadu(x + j), acc);
        acc2 = ch_vmax(ch_loadu(x + j + CH_LANES), acc2);
    }
    if (j < full)
        acc = ch_vmax(ch_loadu(x + j), acc);
    mx = ch_hmax(ch_vmax(acc2, acc));
    for (j = full; j < n; ++j)
        mx = x[j] > mx ? x[j] : mx;
    return mx;
}

/* y[j] = e^(x[j] - base) for j < n (x == y allowed; base is at least every
 * x[j] that is not NaN, so the exponents are <= 0: ch_exp_nonpos); returns
 * their sum, added in CH_LANES lanes then across them, then the tail. */
static float ch_row_exp_sum(int64_t n, const float *x, float *y, float base)
{
    const int64_t full = n / CH_LANES * CH_LANES;
    const int rest = (int)(n - full);
    const ch_vf b = ch_splat(base);
    ch_vf acc = ch_splat(0.0f), e;
    float sum = 0.0f;
    int64_t j;
    int l;
    for (j = 0; j < full; j += CH_LANES) {
        e = ch_exp_nonpos(ch_loadu(x + j) - b);
        ch_storeu(y + j, e);
        acc += e;
    }
    sum = ch_hsum(acc);
    if (rest > 0) {
        e = ch_exp_nonpos(ch_gather(x + full, 1, rest) - b);
        for (l = 0; l < rest; ++l) {
            y[full + l] = e[l];
            sum += e[l];
        }
    }
    return sum;
}

/* y[0:n] = softmax(x[0:n]) (x == y allowed): the row maximum, y = e^(x - max) and
 * its sum (ch_row_max, ch_row_exp_sum), then y / sum. A NaN in the row never becomes
 * the maximum; it comes back through e^(NaN - max). The lanes, and so the order of a
 * row's additions, depend on the ISA; every row goes through the same operations
 * whatever the thread split. */
static void tb_softmax_row(int64_t n, const float *x, float *y)
{
    const int64_t full = n / CH_LANES * CH_LANES;
    const float sum = ch_row_exp_sum(n, x, y, ch_row_max(n, x, -__builtin_inff()));
    int64_t j;
    for (j = 0; j < full; j += CH_LANES)
        ch_storeu(y + j, ch_loadu(y + j) / sum);
    for (j = full; j < n; ++j)
        y[j] = y[j] / sum;
}

/* One step of the online softmax of an attention row (attention_f32.c), over
 * the next scores s[0:n] of the row: *mx becomes the larger of *mx and the
 * scores' maximum (a NaN never wins), s[j] becomes e^(s[j] - base) with base
 * = *mx (0 while it is -inf, so that masked scores give 0, not NaN), and
 * *sum becomes *sum * alpha + the new values' sum. Returns alpha = e^(old
 * *mx - base): the factor by which the row's earlier sums must be scaled. */
static float tb_attn_row(int64_t n, float *s, float *mx, float *sum)
{
    const float m = ch_row_max(n, s, *mx);
    const float base = m == -__builtin_inff() ? 0.0f : m;
    const float alpha = ch_exp(ch_splat(*mx - base))[0];
    const float total = ch_row_exp_sum(n, s, s, base);
    *mx = m;
    *sum = *sum * alpha + total;
    return alpha;
}

#endif /* TIRBYOC_CHAIN_F32_H */
