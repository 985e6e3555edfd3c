/*
 * chain_f32.h - the elementwise epilogue chain (tirbyoc_epilogue_op) over a
 * block of finished outputs, and the float32 math it needs.
 *
 * Included once by each per-instruction-set file (dense_f32_generic.c,
 * dense_f32_avx2.c, dense_f32_avx512.c) after its target pragma, so the same
 * source is compiled for each instruction set: every function here is
 * branch-free (selects, not branches) so that the compiler vectorizes the
 * row loops of tb_chain_block with that file's vector width. The driver
 * (dense_f32.c) applies the chain to each thread's part of C right after the
 * part is computed, while it is still in cache.
 *
 * Accuracy (float32, against a float64 reference, measured over the float
 * range): tanh, sigmoid and silu within 5e-7 relative; both GELUs within
 * 7e-7 for x > -2 and within 2e-5 further into the lower tail (there the
 * float32 rounding of the exponent's argument is amplified by exp; PyTorch's
 * own float32 GELU flushes those values to 0). Results below about 1e-37
 * (denormals) may lose precision. NaN propagates through every operation.
 */
#ifndef TIRBYOC_CHAIN_F32_H
#define TIRBYOC_CHAIN_F32_H

#include <stdint.h>

#include "dense_f32_internal.h"

#define CH_INLINE static inline __attribute__((always_inline))

CH_INLINE float ch_from_bits(int32_t i)
{
    union { int32_t i; float f; } u;
    u.i = i;
    return u.f;
}

CH_INLINE int32_t ch_bits(float f)
{
    union { int32_t i; float f; } u;
    u.f = f;
    return u.i;
}

CH_INLINE float ch_abs(float x) { return ch_from_bits(ch_bits(x) & 0x7FFFFFFF); }

CH_INLINE float ch_copysign(float mag, float sgn)
{
    return ch_from_bits((ch_bits(mag) & 0x7FFFFFFF) | (ch_bits(sgn) & (int32_t)0x80000000));
}

/* e^x: x = n ln2 + r with |r| <= ln2 / 2 (Cody-Waite split of ln2), e^r by its
 * degree-6 Taylor polynomial (error below 2e-8 relative), times 2^n applied in
 * two halves so that results near the overflow and denormal ends stay exact. */
CH_INLINE float ch_exp(float x)
{
    /* the selects send NaN to the low end; the last line gives it back */
    float xc = x > -104.0f ? x : -104.0f;
    float t, nf, r, p;
    int32_t n, n1;
    xc = xc < 88.7228f ? xc : 88.7228f;
    t = xc * 1.44269504f + 12582912.0f; /* round to nearest by the 1.5 * 2^23 shift */
    nf = t - 12582912.0f;
    n = ch_bits(t) - 0x4B400000;
    r = xc - nf * 0.693145751953125f;
    r = r - nf * 1.428606765330187e-06f;
    p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 +
                                                                           r * (1.0f / 720))))));
    n1 = n >> 1;
    p = p * ch_from_bits((n1 + 127) << 23) * ch_from_bits((n - n1 + 127) << 23);
    p = x > 88.72284f ? ch_from_bits(0x7F800000) : p;
    return x != x ? x : p;
}

/* e^y - 1 for y >= 0: its Taylor series below 0.35 (no cancellation), else
 * e^y - 1. */
CH_INLINE float ch_expm1_pos(float y)
{
    const float small = y * (1.0f + y * (1.0f / 2 + y * (1.0f / 6 + y * (1.0f / 24 + y * (
        1.0f / 120 + y * (1.0f / 720 + y * (1.0f / 5040 + y * (1.0f / 40320))))))));
    return y < 0.35f ? small : ch_exp(y) - 1.0f;
}

/* tanh(x) = sign(x) * m / (m + 2), m = e^(2|x|) - 1; |x| >= 9 gives +-1. */
CH_INLINE float ch_tanh(float x)
{
    float a = ch_abs(x), m;
    a = a < 9.0f ? a : 9.0f;
    m = ch_expm1_pos(2.0f * a);
    return x != x ? x : ch_copysign(m / (m + 2.0f), x);
}

CH_INLINE float ch_sigmoid(float x) { return 1.0f / (1.0f + ch_exp(-x)); }

/* erfc(z) * e^(z^2) for 0 <= z <= 10 as a degree-10 polynomial in
 * t = 1 / (1 + z / 2), fitted to relative error (3e-7 in float32). */
CH_INLINE float ch_erfcx(float z)
{
    const float t = 1.0f / (1.0f + 0.5f * z);
    float q = 0.024967344477772713f;
    q = q * t - 0.19512882828712463f;
    q = q * t + 0.6065481305122375f;
    q = q * t - 0.9214478135108948f;
    q = q * t + 0.6464229822158813f;
    q = q * t - 0.23123255372047424f;
    q = q * t + 0.27779334783554077f;
    q = q * t + 0.22516867518424988f;
    q = q * t + 0.28503549098968506f;
    q = q * t + 0.2818653881549835f;
    return q * t + 7.812940566509496e-06f;
}

/* Phi(x) = P(N(0, 1) <= x) = erfc(-x / sqrt 2) / 2, with e^(-z^2) taken as
 * e^(-zh^2) e^(-(z - zh)(z + zh)), zh = z with 12 significant bits (zh^2 is
 * exact), so the relative error stays small far into the lower tail. */
CH_INLINE float ch_phi(float x)
{
    float z = ch_abs(x) * 0.70710678f, zh, half_erfc;
    z = z < 10.0f ? z : 10.0f;
    zh = ch_from_bits(ch_bits(z) & (int32_t)0xFFFFF000);
    half_erfc = 0.5f * ch_erfcx(z) * ch_exp(-(zh * zh)) * ch_exp(-((z - zh) * (z + zh)));
    /* below x = -14, Phi is under the smallest float: 0 (so gelu(-inf) is NaN,
     * as 0.5 x (1 + erf(x / sqrt 2)) gives in PyTorch and TVM) */
    half_erfc = z < 9.9f ? half_erfc : 0.0f;
    return x < 0.0f ? half_erfc : 1.0f - half_erfc;
}

/* One unary operation (tirbyoc_epilogue_op); any other code leaves v as is. */
CH_INLINE float ch_unary(float v, int op)
{
    switch (op) {
    case TIRBYOC_EPI_RELU:
        return v < 0.0f ? 0.0f : v; /* NaN passes */
    case TIRBYOC_EPI_RELU6:
        return v < 0.0f ? 0.0f : (v > 6.0f ? 6.0f : v);
    case TIRBYOC_EPI_GELU_ERF:
        return v * ch_phi(v);
    case TIRBYOC_EPI_GELU_TANH:
        /* 0.5 v (1 + tanh(u)) = v sigmoid(2u): no cancellation for v << 0 */
        return v * ch_sigmoid(1.5957691216057308f * (v + 0.044715f * v * v * v));
    case TIRBYOC_EPI_SILU:
        return v * ch_sigmoid(v);
    case TIRBYOC_EPI_SIGMOID:
        return ch_sigmoid(v);
    case TIRBYOC_EPI_TANH:
        return ch_tanh(v);
    default:
        return v;
    }
}

/* Rows of one unary operation: the switch is outside the loop, so each loop
 * body is straight-line code the compiler vectorizes. */
#define CH_UNARY_ROW(OP)                                                      \
    for (j = 0; j < n; ++j)                                                   \
        row[j] = ch_unary(row[j], OP)

/* Applies the chain ch->ops to C[0:m, 0:n] (row stride ldc), whose element
 * (i, j) is the output at row i0 + i, column j0 + j of its matrix. */
static void tb_chain_block(const tb_chain *ch, float *c, int64_t ldc, int64_t m,
                           int64_t n, int64_t i0, int64_t j0)
{
    int64_t i, j;
    for (i = 0; i < m; ++i) {
        float *restrict row = c + i * ldc;
        int64_t ops = ch->ops;
        for (; ops != 0; ops >>= 4) {
            const int op = (int)(ops & 15);
            switch (op) {
            case TIRBYOC_EPI_BIAS: {
                const float *restrict b = ch->bias + j0;
                for (j = 0; j < n; ++j)
                    row[j] += b[j];
                break;
            }
            case TIRBYOC_EPI_RESIDUAL: {
                const float *restrict r = ch->residual + (i0 + i) * ch->ldr + j0;
                for (j = 0; j < n; ++j)
                    row[j] += r[j];
                break;
            }
            case TIRBYOC_EPI_SCALE: {
                const float s = ch->scale;
                for (j = 0; j < n; ++j)
                    row[j] *= s;
                break;
            }
            case TIRBYOC_EPI_DIVIDE: {
                const float s = ch->scale;
                for (j = 0; j < n; ++j)
                    row[j] /= s;
                break;
            }
            case TIRBYOC_EPI_RELU:
                CH_UNARY_ROW(TIRBYOC_EPI_RELU);
                break;
            case TIRBYOC_EPI_RELU6:
                CH_UNARY_ROW(TIRBYOC_EPI_RELU6);
                break;
            case TIRBYOC_EPI_GELU_ERF:
                CH_UNARY_ROW(TIRBYOC_EPI_GELU_ERF);
                break;
            case TIRBYOC_EPI_GELU_TANH:
                CH_UNARY_ROW(TIRBYOC_EPI_GELU_TANH);
                break;
            case TIRBYOC_EPI_SILU:
                CH_UNARY_ROW(TIRBYOC_EPI_SILU);
                break;
            case TIRBYOC_EPI_SIGMOID:
                CH_UNARY_ROW(TIRBYOC_EPI_SIGMOID);
                break;
            case TIRBYOC_EPI_TANH:
                CH_UNARY_ROW(TIRBYOC_EPI_TANH);
                break;
            default:
                break; /* validated by the caller */
            }
        }
    }
}

/* y[0:n] = op(x[0:n]) for one unary operation (x == y allowed). */
static void tb_unary_row(int op, int64_t n, const float *x, float *y)
{
    int64_t j;
    switch (op) {
#define CH_UNARY_CASE(OP)                                                     \
    case OP:                                                                  \
        for (j = 0; j < n; ++j)                                               \
            y[j] = ch_unary(x[j], OP);                                        \
        break;
        CH_UNARY_CASE(TIRBYOC_EPI_RELU)
        CH_UNARY_CASE(TIRBYOC_EPI_RELU6)
        CH_UNARY_CASE(TIRBYOC_EPI_GELU_ERF)
        CH_UNARY_CASE(TIRBYOC_EPI_GELU_TANH)
        CH_UNARY_CASE(TIRBYOC_EPI_SILU)
        CH_UNARY_CASE(TIRBYOC_EPI_SIGMOID)
        CH_UNARY_CASE(TIRBYOC_EPI_TANH)
#undef CH_UNARY_CASE
    default:
        break;
    }
}

/* One vector register of floats of the including file's instruction set
 * (GCC vector extension; the target pragma defines __AVX512F__ / __AVX__),
 * for the row reductions of tb_softmax_row: the compiler does not vectorize
 * a float max or sum over a loop by itself (it would reorder the operations).
 * The lanes, and so the order of a row's additions, depend on the ISA. */
#if defined(__AVX512F__)
#define CH_VBYTES 64
#elif defined(__AVX__)
#define CH_VBYTES 32
#else
#define CH_VBYTES 16
#endif
#define CH_LANES (CH_VBYTES / 4)
typedef float ch_vf __attribute__((vector_size(CH_VBYTES), aligned(4)));
typedef int32_t ch_vi __attribute__((vector_size(CH_VBYTES), aligned(4)));

/* Lanewise a > b ? a : b (NaN never wins a compare). */
CH_INLINE ch_vf ch_vmax(ch_vf a, ch_vf b)
{
    const ch_vi gt = a > b;
    return (ch_vf)((gt & (ch_vi)a) | (~gt & (ch_vi)b));
}

/* y[0:n] = softmax(x[0:n]) (x == y allowed): the row maximum in CH_LANES
 * lanes, y = e^(x - max) (a loop the compiler vectorizes), its sum in
 * CH_LANES lanes, then y / sum. A NaN in the row never becomes the maximum;
 * it comes back through e^(NaN - max). Every row goes through the same
 * operations whatever the thread split. */
static void tb_softmax_row(int64_t n, const float *x, float *y)
{
    const int64_t full = n / CH_LANES * CH_LANES;
    ch_vf acc;
    float mx, sum, tail;
    int64_t j;
    int l;
    for (l = 0; l < CH_LANES; ++l)
        acc[l] = -__builtin_inff();
    for (j = 0; j < full; j += CH_LANES)
        acc = ch_vmax(*(const ch_vf *)(x + j), acc);
    mx = acc[0];
    for (l = 1; l < CH_LANES; ++l)
        mx = acc[l] > mx ? acc[l] : mx;
    for (j = full; j < n; ++j)
        mx = x[j] > mx ? x[j] : mx;
    for (j = 0; j < n; ++j)
        y[j] = ch_exp(x[j] - mx);
    for (l = 0; l < CH_LANES; ++l)
        acc[l] = 0.0f;
    for (j = 0; j < full; j += CH_LANES)
        acc += *(const ch_vf *)(y + j);
    tail = 0.0f;
    for (j = full; j < n; ++j)
        tail += y[j];
    sum = 0.0f;
    for (l = 0; l < CH_LANES; ++l)
        sum += acc[l];
    sum += tail;
    for (j = 0; j < n; ++j)
        y[j] = y[j] / sum;
}

#endif /* TIRBYOC_CHAIN_F32_H */
