/*
 * pool_f32.c - max pooling, float32, NCHW (tirbyoc_max_pool2d_f32).
 *
 * Output row i of a plane is built in two passes: the vertical maximum of
 * the input rows its window covers (a contiguous elementwise pass into a
 * row buffer), then the horizontal maximum over each output column's taps
 * of that buffer. Columns whose taps all lie inside the row (all but a few
 * at the edges) take a loop with the stride and the tap count as
 * compile-time constants for the common shapes (3x3 / 2x2 windows, strides 1
 * and 2, no dilation), which the compiler vectorizes with the instruction
 * set's own strided loads; the rest takes a general loop with bounds.
 *
 * On AVX-512 and AVX2, 3x3 windows of stride 2 (ResNet's stem pool) take
 * one pass per output row instead (rows_avx512_3x3s2, rows_avx2_3x3s2): the
 * same maxima in the same order, in whole vectors, by vmaxps where no tap is
 * NaN (AVX-512: masked loads, -inf outside the image; AVX2: the columns
 * inside the row, the edges one output at a time).
 *
 * tirbyoc_max_pool2d_f32_layouts takes x in blocks of 16 channels (NCHW16c):
 * the same two passes over a row of pixels, each pixel's 16 channels in
 * whole vectors (pl_row16_avx2), y NCHW16c or, through the register
 * transpose, NCHW. ResNet's stem conv writes its blocks for it (its tiles
 * then store their registers as they are).
 *
 * The maximum propagates NaN (PyTorch's max_pool2d): a NaN anywhere in a
 * window gives NaN. A window with no tap inside the input gives -inf.
 * Every output is computed the same way whatever the instruction set (the
 * maximum is exact) or the thread count. Ties keep the tap compared first,
 * which only shows in the sign of a zero maximum: where +0.0 and -0.0 tie,
 * the column-first order here may keep the other one than PyTorch's
 * row-by-row order (they compare equal).
 *
 * Each instruction set's copy of the two passes is compiled here under its
 * target pragma; tb_active_isa() picks one.
 */
#include <stdint.h>

#include "dense_f32_internal.h"

/* Output rows per unit of work. */
#define PL_UNIT_ROWS 8
/* Input bytes a unit fetches before it starts, at most (half an L1). */
#define PL_PREFETCH_BYTES 16384
/* Below this many window taps a call stays on the calling thread. */
#define PL_PAR_TAPS (256.0 * 1024)
#define PL_DIM_MAX ((int64_t)1 << 31)

/* The larger of m and v, NaN if either is NaN. */
#define PL_MAX(m, v) ((v) > (m) || (v) != (v) ? (v) : (m))

typedef struct {
    int64_t planes, h, w, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow;
    int64_t q_lo, q_hi; /* output columns whose taps are all inside a row */
    int64_t row_units;  /* units per plane */
    int64_t c;          /* planes per image */
    int rows_first;     /* units run over an image's row blocks, then its planes */
    const float *x;
    float *y;
    const struct pl_fns_s *fns; /* the instruction set's passes */
    int xb, yb;         /* x, y NCHW16c (tirbyoc_max_pool2d_f32_layouts) */
    tb_unblock16_fn unblock; /* the ISA's, for an NCHW y from blocked rows (or NULL) */
} pl_job;

typedef struct pl_fns_s {
    void (*vmax)(float *restrict t, const float *restrict a, int64_t n);
    void (*vmax2)(float *restrict t, const float *restrict a, const float *restrict b,
                  int64_t n);
    void (*hmax)(const pl_job *j, const float *t, float *y);
    /* 3x3 windows of stride 2 (no dilation): output rows [i0, i1) of plane x
     * into plane y in one pass, or NULL */
    void (*rows_3x3s2)(const pl_job *j, const float *x, float *y, int64_t i0, int64_t i1);
    /* an NCHW16c x: output row i of the block of 16 channels at x (its
     * [h][w][16] plane) into out ([ow][16]), t a buffer of w * 16 floats */
    void (*row16)(const pl_job *j, const float *x, int64_t i, float *out, float *t);
} pl_fns;


static int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max_i64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Output column q of one input row t (any window): the maximum of the taps
 * inside the row, -inf if none is. */
static float col_max(const pl_job *j, const float *t, int64_t q)
{
    float m = -__builtin_inff();
    int64_t b;
    for (b = 0; b < j->kw; ++b) {
        const int64_t c = q * j->sw - j->pw + b * j->dw;
        if (c >= 0 && c < j->w)
            m = PL_MAX(m, t[c]);
    }
    return m;
}

static void cols_general(const pl_job *j, const float *t, float *y, int64_t lo,
                         int64_t hi)
{
    int64_t q;
    for (q = lo; q < hi; ++q)
        y[q] = col_max(j, t, q);
}

/* The two passes for one instruction set (compiled under its pragma). */
#define PL_PASSES(SUF)                                                        \
    static void vmax_##SUF(float *restrict t, const float *restrict a,        \
                           int64_t n)                                         \
    {                                                                         \
        int64_t c;                                                            \
        for (c = 0; c < n; ++c)                                               \
            t[c] = PL_MAX(t[c], a[c]);                                        \
    }                                                                         \
    static void vmax2_##SUF(float *restrict t, const float *restrict a,       \
                            const float *restrict b, int64_t n)               \
    {                                                                         \
        int64_t c;                                                            \
        for (c = 0; c < n; ++c)                                               \
            t[c] = PL_MAX(a[c], b[c]);                                        \
    }                                                                         \
    PL_COLS(SUF, 2, 3)                                                        \
    PL_COLS(SUF, 1, 3)                                                        \
    PL_COLS(SUF, 2, 2)                                                        \
    PL_COLS(SUF, 1, 2)                                                        \
    static void hmax_##SUF(const pl_job *j, const float *t, float *y);        \
    static const pl_fns fns_##SUF = {vmax_##SUF, vmax2_##SUF, hmax_##SUF,     \
                                     PL_ROWS_3X3S2_##SUF, PL_ROW16_##SUF};    \
    static void hmax_##SUF(const pl_job *j, const float *t, float *y)         \
    {                                                                         \
        const int64_t lo = j->q_lo, hi = j->q_hi;                             \
        cols_general(j, t, y, 0, lo);                                         \
        if (j->dw == 1 && j->sw == 2 && j->kw == 3)                           \
            cols_##SUF##_2_3(t, j->pw, y, lo, hi);                            \
        else if (j->dw == 1 && j->sw == 1 && j->kw == 3)                      \
            cols_##SUF##_1_3(t, j->pw, y, lo, hi);                            \
        else if (j->dw == 1 && j->sw == 2 && j->kw == 2)                      \
            cols_##SUF##_2_2(t, j->pw, y, lo, hi);                            \
        else if (j->dw == 1 && j->sw == 1 && j->kw == 2)                      \
            cols_##SUF##_1_2(t, j->pw, y, lo, hi);                            \
        else                                                                  \
            cols_general(j, t, y, lo, hi);                                    \
        cols_general(j, t, y, max_i64(lo, hi), j->ow);                        \
    }

/* Columns [lo, hi) with every tap inside the row: y[q] = max of
 * t[q * S - pad + b] for b < K. */
#define PL_COLS(SUF, S, K)                                                    \
    static void cols_##SUF##_##S##_##K(const float *restrict t, int64_t pad,  \
                                       float *restrict y, int64_t lo,         \
                                       int64_t hi)                            \
    {                                                                         \
        int64_t q;                                                            \
        for (q = lo; q < hi; ++q) {                                           \
            float m = t[q * S - pad];                                         \
            int b;                                                            \
            for (b = 1; b < K; ++b)                                           \
                m = PL_MAX(m, t[q * S - pad + b]);                            \
            y[q] = m;                                                         \
        }                                                                     \
    }

/* ---- an NCHW16c x ----
 *
 * Each output row of a block of 16 channels in two passes, as the NCHW
 * path's (so both layouts give the same bits): the vertical maximum of the
 * input rows of its windows at every input column (the first row inside as
 * it is, then PL_MAX in row order) into a row buffer t ([w][16]), then per
 * output column PL_MAX of its columns' maxima from -inf in column order
 * (col_max). Each pixel's 16 channels are one line: the instruction sets
 * take them in whole vectors (pl_row16_avx2); the portable code leaves them
 * to the compiler. */

/* Output row i into out ([ow][16]) through the row buffer t ([w][16]). */
static void pl_row16_portable(const pl_job *j, const float *x, int64_t i, float *out,
                              float *t)
{
    int64_t a, c, q, b;
    int rows = 0, l;
    for (a = 0; a < j->kh; ++a) {
        const int64_t r = i * j->sh - j->ph + a * j->dh;
        const float *row = x + r * j->w * 16;
        if (r < 0 || r >= j->h)
            continue;
        for (c = 0; c < j->w * 16; ++c)
            t[c] = rows == 0 ? row[c] : PL_MAX(t[c], row[c]);
        ++rows;
    }
    for (q = 0; q < j->ow; ++q)
        for (l = 0; l < 16; ++l) {
            float m = -__builtin_inff();
            for (b = 0; b < j->kw && rows > 0; ++b) {
                c = q * j->sw - j->pw + b * j->dw;
                if (c >= 0 && c < j->w)
                    m = PL_MAX(m, t[c * 16 + l]);
            }
            out[q * 16 + l] = m;
        }
}

#define PL_ROW16_generic pl_row16_portable
#define PL_ROWS_3X3S2_generic NULL
PL_PASSES(generic)

#if defined(__x86_64__) || defined(__i386__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>

/* PL_MAX(m, v) on 8 lanes, the same operations lane by lane. */
static inline __m256 pl_max8(__m256 m, __m256 v)
{
    const __m256 k = _mm256_or_ps(_mm256_cmp_ps(v, m, _CMP_GT_OQ),
                                  _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_blendv_ps(m, v, k);
}

/* Output column q of a 3x3 stride-2 row from the rows r[0..2] (NULL: outside
 * the image): the vertical maxima of its columns inside the row (the first
 * row present as it is, then PL_MAX in row order: vmax2 / vmax), then their
 * maximum from the left (col_max; PL_MAX(-inf, t) is t, bit for bit). */
static float pl_out1(const pl_job *j, const float *const r[3], int64_t q)
{
    float m = -__builtin_inff();
    int64_t b;
    int a;
    for (b = 0; b < 3; ++b) {
        const int64_t c = q * 2 - j->pw + b;
        float t = -__builtin_inff();
        int first = 1;
        if (c < 0 || c >= j->w)
            continue;
        for (a = 0; a < 3; ++a)
            if (r[a] != NULL) {
                t = first ? r[a][c] : PL_MAX(t, r[a][c]);
                first = 0;
            }
        m = PL_MAX(m, t);
    }
    return m;
}

/* PL_MAX(m, v) on 8 lanes, or where no lane of v is NaN (fast) vmaxps:
 * max(v, m) is v > m ? v : m, which is PL_MAX(m, v) for v not NaN (ties of
 * +-0 included). */
static inline __m256 pl_max8f(__m256 m, __m256 v, int fast)
{
    return fast ? _mm256_max_ps(v, m) : pl_max8(m, v);
}

/* 8 outputs from output column q on, every column they read inside the row:
 * the vertical maxima of the 17 columns (in row order), the even and odd
 * ones by in-lane shuffles and a cross-lane permute, the next even ones by a
 * rotate with column 16 in the last lane, then PL_MAX(PL_MAX(even, odd),
 * next even): PL_COLS's operations. With nan != NULL by vmaxps, the lanes
 * where a tap is NaN added to *nan (the caller then takes the exact
 * operations, nan NULL). */
static inline __m256 pl_row8(const float *const r[3], int64_t c, __m256 *nan)
{
    const __m256i rot = _mm256_setr_epi32(1, 2, 3, 4, 5, 6, 7, 0);
    const int fast = nan != NULL;
    __m256 v0 = _mm256_setzero_ps(), v1 = v0, v2 = v0;
    int a, first = 1;
    for (a = 0; a < 3; ++a)
        if (r[a] != NULL) {
            const __m256 a0 = _mm256_loadu_ps(r[a] + c), a1 = _mm256_loadu_ps(r[a] + c + 8);
            const __m256 a2 = _mm256_broadcast_ss(r[a] + c + 16);
            if (fast)
                *nan = _mm256_or_ps(*nan, _mm256_or_ps(_mm256_cmp_ps(a0, a1, _CMP_UNORD_Q),
                                                       _mm256_cmp_ps(a2, a2, _CMP_UNORD_Q)));
            if (first) {
                v0 = a0, v1 = a1, v2 = a2;
                first = 0;
            } else {
                v0 = pl_max8f(v0, a0, fast), v1 = pl_max8f(v1, a1, fast);
                v2 = pl_max8f(v2, a2, fast);
            }
        }
    const __m256 e = _mm256_castpd_ps(_mm256_permute4x64_pd(
        _mm256_castps_pd(_mm256_shuffle_ps(v0, v1, _MM_SHUFFLE(2, 0, 2, 0))),
        _MM_SHUFFLE(3, 1, 2, 0)));
    const __m256 o = _mm256_castpd_ps(_mm256_permute4x64_pd(
        _mm256_castps_pd(_mm256_shuffle_ps(v0, v1, _MM_SHUFFLE(3, 1, 3, 1))),
        _MM_SHUFFLE(3, 1, 2, 0)));
    return pl_max8f(pl_max8f(e, o, fast),
                    _mm256_blend_ps(_mm256_permutevar8x32_ps(e, rot), v2, 0x80), fast);
}

/* pl_row8 by vmaxps first; the exact operations again where a tap is NaN
 * (they keep the NaN PL_MAX keeps). PL_MAX takes four instructions a
 * maximum: by vmaxps the pools of ResNet's stems ran 5-8% faster (one
 * thread, Zen 3). */
static inline void pl_out8(const float *const r[3], int64_t c, float *out)
{
    __m256 nan = _mm256_setzero_ps();
    __m256 v = pl_row8(r, c, &nan);
    if (_mm256_movemask_ps(nan) != 0)
        v = pl_row8(r, c, NULL);
    _mm256_storeu_ps(out, v);
}

/* 3x3 windows, stride 2, 8 outputs a vector (as rows_avx512_3x3s2 below)
 * where the columns they read lie inside the row, the last block overlapping
 * the one before it (the same values again); the outputs at the edges one by
 * one. A row with no input row inside gives -inf. (The two passes ran at
 * about one tap a cycle on ResNet's stem pool, 64 x 112 x 112.) */
static void rows_avx2_3x3s2(const pl_job *j, const float *x, float *y, int64_t i0,
                            int64_t i1)
{
    /* outputs [qa, qb) read columns [2q - pw, 2q - pw + 2] inside [0, w) */
    const int64_t qa = min_i64(j->ow, cdiv(j->pw, 2));
    const int64_t qb = j->w - 3 + j->pw < 0 ? qa
                       : max_i64(qa, min_i64(j->ow, (j->w - 3 + j->pw) / 2 + 1));
    int64_t i, q;
    int a;
    for (i = i0; i < i1; ++i) {
        const float *r[3];
        float *yrow = y + i * j->ow;
        for (a = 0; a < 3; ++a) {
            const int64_t rr = i * 2 - j->ph + a;
            r[a] = rr >= 0 && rr < j->h ? x + rr * j->w : NULL;
        }
        if (r[0] == NULL && r[1] == NULL && r[2] == NULL) {
            for (q = 0; q < j->ow; ++q)
                yrow[q] = -__builtin_inff();
            continue;
        }
        for (q = 0; q < qa; ++q)
            yrow[q] = pl_out1(j, r, q);
        if (qb - qa >= 8) {
            for (; q + 8 <= qb; q += 8)
                pl_out8(r, q * 2 - j->pw, yrow + q);
            if (q < qb)
                pl_out8(r, (qb - 8) * 2 - j->pw, yrow + qb - 8);
            q = qb;
        }
        for (; q < j->ow; ++q)
            yrow[q] = pl_out1(j, r, q);
    }
}
/* pl_row16_portable in whole vectors, two per pixel: by vmaxps first, the
 * exact operations again where a tap of the row is NaN (as pl_out8). */
static int pl_row16_pass(const pl_job *j, const float *x, int64_t i, float *out,
                         float *t, int fast)
{
    const __m256 ninf = _mm256_set1_ps(-__builtin_inff());
    __m256 nan = _mm256_setzero_ps();
    int64_t a, c, q, b;
    int rows = 0;
    for (a = 0; a < j->kh; ++a) {
        const int64_t r = i * j->sh - j->ph + a * j->dh;
        const float *row = x + r * j->w * 16;
        if (r < 0 || r >= j->h)
            continue;
        for (c = 0; c < j->w * 16; c += 16) {
            const __m256 v0 = _mm256_loadu_ps(row + c), v1 = _mm256_loadu_ps(row + c + 8);
            if (fast)
                nan = _mm256_or_ps(nan, _mm256_cmp_ps(v0, v1, _CMP_UNORD_Q));
            if (rows == 0) {
                _mm256_storeu_ps(t + c, v0);
                _mm256_storeu_ps(t + c + 8, v1);
            } else {
                _mm256_storeu_ps(t + c, pl_max8f(_mm256_loadu_ps(t + c), v0, fast));
                _mm256_storeu_ps(t + c + 8, pl_max8f(_mm256_loadu_ps(t + c + 8), v1, fast));
            }
        }
        ++rows;
    }
    if (fast && _mm256_movemask_ps(nan) != 0)
        return 0;
    for (q = 0; q < j->ow; ++q) {
        __m256 m0 = ninf, m1 = ninf;
        for (b = 0; b < j->kw && rows > 0; ++b) {
            c = q * j->sw - j->pw + b * j->dw;
            if (c >= 0 && c < j->w) {
                m0 = pl_max8f(m0, _mm256_loadu_ps(t + c * 16), fast);
                m1 = pl_max8f(m1, _mm256_loadu_ps(t + c * 16 + 8), fast);
            }
        }
        _mm256_storeu_ps(out + q * 16, m0);
        _mm256_storeu_ps(out + q * 16 + 8, m1);
    }
    return 1;
}

static void pl_row16_avx2(const pl_job *j, const float *x, int64_t i, float *out, float *t)
{
    if (!pl_row16_pass(j, x, i, out, t, 1))
        pl_row16_pass(j, x, i, out, t, 0);
}
#define PL_ROW16_avx2 pl_row16_avx2
#define PL_ROWS_3X3S2_avx2 rows_avx2_3x3s2
PL_PASSES(avx2)
#pragma GCC pop_options

#ifndef TIRBYOC_NO_AVX512
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
#include <immintrin.h>

/* Lanes [lo, hi) of 16 set. */
static inline __mmask16 pl_lanes(int64_t lo, int64_t hi)
{
    const int64_t a = lo < 0 ? 0 : lo > 16 ? 16 : lo, b = hi < a ? a : hi > 16 ? 16 : hi;
    return (__mmask16)(((1u << b) - 1u) & ~((1u << a) - 1u));
}

/* PL_MAX on 16 lanes, the same operations lane by lane */
static inline __m512 pl_max16(__m512 m, __m512 v)
{
    const __mmask16 k = _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ) |
                        _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_mask_mov_ps(m, k, v);
}

/* PL_MAX(m, v) on 16 lanes, or where no lane of v is NaN (fast) vmaxps:
 * max(v, m) is v > m ? v : m, which is PL_MAX(m, v) for v not NaN (ties of
 * +-0 included). */
static inline __m512 pl_max2(__m512 m, __m512 v, int fast)
{
    return fast ? _mm512_max_ps(v, m) : pl_max16(m, v);
}

/* The vertical maximum of the rows r[0..2] (NULL: outside the image) at
 * columns col + l for the lanes of k (-inf in the others, not read). The
 * first row present is taken as it is: PL_MAX(-inf, v) is v, bit for bit.
 * With nan != NULL, by vmaxps, the lanes where a row holds a NaN added to
 * *nan (the caller then takes the exact operations, nan NULL). */
static inline __m512 pl_vmax3(const float *const r[3], int64_t col, __mmask16 k,
                              __mmask16 *nan)
{
    const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
    __m512 acc = ninf;
    int a, first = 1;
    for (a = 0; a < 3; ++a)
        if (r[a] != NULL) {
            const __m512 v = _mm512_mask_loadu_ps(ninf, k, r[a] + col);
            if (nan != NULL)
                *nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            acc = first ? v : pl_max2(acc, v, nan != NULL);
            first = 0;
        }
    return acc;
}

/* 16 outputs of a 3x3 stride-2 row (see below) from input column c on: the
 * vertical maxima of the 33 columns, then the even, odd and next-even ones. */
static inline __m512 pl_row16(const float *const r[3], int64_t c, __mmask16 k0,
                              __mmask16 k1, __mmask16 k2, __mmask16 *nan)
{
    const __m512i ie = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8,
                                        6, 4, 2, 0);
    const __m512i io = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9,
                                        7, 5, 3, 1);
    const __m512 v0 = pl_vmax3(r, c, k0, nan);
    const __m512 v1 = pl_vmax3(r, c + 16, k1, nan);
    const __m512 v2 = pl_vmax3(r, c + 32, k2, nan);
    const __m512 e = _mm512_permutex2var_ps(v0, ie, v1);
    const __m512 o = _mm512_permutex2var_ps(v0, io, v1);
    const __m512 e2 = _mm512_castsi512_ps(
        _mm512_alignr_epi32(_mm512_castps_si512(v2), _mm512_castps_si512(e), 1));
    return pl_max2(pl_max2(e, o, nan != NULL), e2, nan != NULL);
}

/* 3x3 windows, stride 2: per output row and 16 outputs, the vertical maximum
 * of the three input rows over the 33 columns the windows read (masked
 * loads, -inf outside the image), then the even, odd and next-even columns:
 * the operations of vmax2 / vmax / PL_COLS (and col_max at the edges, where
 * a -inf tap changes nothing) in the same order, in whole vectors. ResNet's
 * stem pool spent most of its time in the per-row calls and scalar edges.
 * The column blocks are the outer loop: their masks are computed once for
 * all the rows of the unit. */
static void rows_avx512_3x3s2(const pl_job *j, const float *x, float *y, int64_t i0,
                              int64_t i1)
{
    int64_t i, q;
    int a;
    for (q = 0; q < j->ow; q += 16) {
        const int64_t n = min_i64(16, j->ow - q), c = q * 2 - j->pw;
        /* columns [c, c + 2n] that lie in [0, w) */
        const int64_t lo = -c, hi = min_i64(j->w - c, 2 * n + 1);
        const __mmask16 k0 = pl_lanes(lo, hi), k1 = pl_lanes(lo - 16, hi - 16),
                        k2 = pl_lanes(lo - 32, hi - 32), ks = pl_lanes(0, n);
        for (i = i0; i < i1; ++i) {
            const float *r[3];
            for (a = 0; a < 3; ++a) {
                const int64_t rr = i * 2 - j->ph + a;
                r[a] = rr >= 0 && rr < j->h ? x + rr * j->w : NULL;
            }
            /* vmaxps first; the exact operations again where a tap is NaN
             * (they keep the NaN PL_MAX keeps) */
            __mmask16 nan = 0;
            __m512 out = pl_row16(r, c, k0, k1, k2, &nan);
            if (nan != 0)
                out = pl_row16(r, c, k0, k1, k2, NULL);
            _mm512_mask_storeu_ps(y + i * j->ow + q, ks, out);
        }
    }
}
#define PL_ROWS_3X3S2_avx512 rows_avx512_3x3s2
#define PL_ROW16_avx512 pl_row16_avx2
PL_PASSES(avx512)
#pragma GCC pop_options
#endif /* TIRBYOC_NO_AVX512 */
#define PL_HAVE_X86 1
#endif

/* Output rows of one unit: plane p, rows [i0, i1); t: a buffer of w floats,
 * or NULL (rows longer than the scratch: each output over its window). */
static void pool_rows(const pl_job *j, int64_t p, int64_t i0, int64_t i1,
                      float *t)
{
    const pl_fns *f = j->fns;
    const float *x = j->x + p * j->h * j->w;
    float *y = j->y + p * j->oh * j->ow;
    int64_t i, a, q;
    {
        /* The input rows the unit reads, fetched up front: a unit is a short
         * stream (ResNet-18's stem pool: 17 rows of 448 bytes), too short
         * for the hardware prefetcher to get ahead (that pool: 116 -> 97 us,
         * in the model's memory state) */
        const int64_t r0 = max_i64(0, i0 * j->sh - j->ph);
        const int64_t r1 = min_i64(j->h, (i1 - 1) * j->sh - j->ph + (j->kh - 1) * j->dh + 1);
        const char *b = (const char *)(x + r0 * j->w);
        const char *e = (const char *)(x + r1 * j->w);
        if (e - b > PL_PREFETCH_BYTES)
            e = b + PL_PREFETCH_BYTES; /* long rows: the hardware takes over */
        for (; b < e; b += 64)
            __builtin_prefetch(b, 0, 3);
    }
    if (f->rows_3x3s2 != NULL && j->kh == 3 && j->kw == 3 && j->sh == 2 && j->sw == 2 &&
        j->dh == 1 && j->dw == 1) {
        f->rows_3x3s2(j, x, y, i0, i1);
        return;
    }
    for (i = i0; i < i1; ++i) {
        float *yrow = y + i * j->ow;
        const float *row = NULL;
        int rows = 0;
        for (q = 0; t == NULL && q < j->ow; ++q)
            yrow[q] = -__builtin_inff();
        for (a = 0; a < j->kh; ++a) {
            const int64_t r = i * j->sh - j->ph + a * j->dh;
            if (r < 0 || r >= j->h)
                continue;
            if (t == NULL) {
                for (q = 0; q < j->ow; ++q)
                    yrow[q] = PL_MAX(yrow[q], col_max(j, x + r * j->w, q));
                continue;
            }
            if (rows == 0)
                row = x + r * j->w; /* one row: read in place */
            else if (rows == 1)
                f->vmax2(t, row, x + r * j->w, j->w), row = t;
            else
                f->vmax(t, x + r * j->w, j->w);
            ++rows;
        }
        if (t == NULL)
            continue;
        if (rows == 0)
            for (q = 0; q < j->ow; ++q)
                yrow[q] = -__builtin_inff();
        else
            f->hmax(j, row, yrow);
    }
}

static void pool_unit(void *arg, int64_t u, float *scratch)
{
    const pl_job *j = (const pl_job *)arg;
    int64_t p = u / j->row_units, r = u % j->row_units;
    if (j->rows_first) {
        const int64_t per = j->c * j->row_units, in = u % per; /* image u / per */
        p = u / per * j->c + in % j->c;
        r = in / j->c;
    }
    const int64_t i0 = r * PL_UNIT_ROWS, i1 = min_i64(j->oh, i0 + PL_UNIT_ROWS);
    if (j->xb) {
        /* p: a block of 16 channels, its planes 16 times a channel's; the
         * rows through the scratch: the row buffer, then (an NCHW y) the
         * output row, spread over the block's 16 planes */
        const float *x = j->x + p * j->h * j->w * 16;
        float *y = j->y + p * j->oh * j->ow * 16, *out = scratch + j->w * 16;
        int64_t i;
        for (i = i0; i < i1; ++i) {
            if (j->yb) {
                j->fns->row16(j, x, i, y + i * j->ow * 16, scratch);
                continue;
            }
            j->fns->row16(j, x, i, out, scratch);
            if (j->unblock != NULL) {
                j->unblock(y + i * j->ow, j->oh * j->ow, out, j->ow, 1);
            } else {
                int64_t q;
                int l;
                for (q = 0; q < j->ow; ++q)
                    for (l = 0; l < 16; ++l)
                        y[l * j->oh * j->ow + i * j->ow + q] = out[q * 16 + l];
            }
        }
        return;
    }
    pool_rows(j, p, i0, i1, (size_t)j->w <= TB_SCRATCH_FLOATS ? scratch : NULL);
}

static int32_t max_pool2d(int64_t layouts, int64_t batch, int64_t c, int64_t h, int64_t w,
                          const float *x, int64_t kh, int64_t kw, int64_t stride_h,
                          int64_t stride_w, int64_t pad_top, int64_t pad_left,
                          int64_t dilation_h, int64_t dilation_w, int64_t oh, int64_t ow,
                          float *y)
{
    pl_job j;
    const tb_isa *isa;
    int64_t units, want;
    if (batch < 0 || c < 0 || h < 0 || w < 0 || oh < 0 || ow < 0 || kh < 1 ||
        kw < 1 || batch >= PL_DIM_MAX || c >= PL_DIM_MAX || h >= PL_DIM_MAX ||
        w >= PL_DIM_MAX || oh >= PL_DIM_MAX || ow >= PL_DIM_MAX ||
        kh >= PL_DIM_MAX || kw >= PL_DIM_MAX)
        return TIRBYOC_ESIZE;
    if (stride_h < 1 || stride_w < 1 || dilation_h < 1 || dilation_w < 1 ||
        stride_h >= PL_DIM_MAX || stride_w >= PL_DIM_MAX ||
        dilation_h >= PL_DIM_MAX || dilation_w >= PL_DIM_MAX || pad_top < 0 ||
        pad_left < 0 || pad_top >= PL_DIM_MAX || pad_left >= PL_DIM_MAX)
        return TIRBYOC_EINVAL;
    /* blocks of 16 channels: x blocked, y either way (not y alone) */
    if ((layouts != 0 && layouts != TIRBYOC_LAYOUT_X16 &&
         layouts != (TIRBYOC_LAYOUT_X16 | TIRBYOC_LAYOUT_Y16)) ||
        (layouts != 0 && c % 16 != 0))
        return TIRBYOC_EINVAL;
    if (batch == 0 || c == 0 || oh == 0 || ow == 0)
        return TIRBYOC_OK;
    if (y == NULL || (h > 0 && w > 0 && x == NULL))
        return TIRBYOC_ENULL;
    if (h == 0 || w == 0) {
        /* no window holds a tap */
        for (units = 0; units < batch * c * oh * ow; ++units)
            y[units] = -__builtin_inff();
        return TIRBYOC_OK;
    }
    if (tb_scratch() == NULL)
        return TIRBYOC_ENOMEM;
    if (layouts != 0 && (double)(w + ow) * 16 > (double)TB_SCRATCH_FLOATS) {
        /* rows too long for the scratch: through NCHW copies */
        tb_nchw_copies cp;
        const float *none = NULL;
        float *yt = y;
        int32_t st;
        if (!tb_nchw_copies_open(&cp, layouts, batch, c, h * w, c, oh * ow, &x, &none, &yt))
            return TIRBYOC_ENOMEM;
        st = max_pool2d(0, batch, c, h, w, x, kh, kw, stride_h, stride_w, pad_top, pad_left,
                        dilation_h, dilation_w, oh, ow, yt);
        return tb_nchw_copies_close(&cp, st, batch, c, oh * ow, y);
    }
    isa = tb_active_isa();
    j = (pl_job){.planes = batch * c, .h = h, .w = w, .kh = kh, .kw = kw,
                 .sh = stride_h, .sw = stride_w, .ph = pad_top, .pw = pad_left,
                 .dh = dilation_h, .dw = dilation_w, .oh = oh, .ow = ow, .x = x, .y = y,
                 .xb = (layouts & TIRBYOC_LAYOUT_X16) != 0,
                 .yb = (layouts & TIRBYOC_LAYOUT_Y16) != 0, .unblock = isa->unblock16};
    j.fns = &fns_generic;
#ifdef PL_HAVE_X86
#ifndef TIRBYOC_NO_AVX512
    if (isa == &tb_isa_avx512)
        j.fns = &fns_avx512;
    else
#endif
    if (isa == &tb_isa_avx2)
        j.fns = &fns_avx2;
#else
    (void)isa;
#endif
    /* columns with every tap inside: q * sw >= pw and
     * q * sw - pw + (kw - 1) * dw <= w - 1 */
    j.q_lo = min_i64(ow, cdiv(pad_left, stride_w));
    j.q_hi = w - 1 + pad_left - (kw - 1) * dilation_w < 0
                 ? 0
                 : min_i64(ow, (w - 1 + pad_left - (kw - 1) * dilation_w) / stride_w + 1);
    j.row_units = cdiv(oh, PL_UNIT_ROWS);
    /* (a unit of blocked tensors: 16 channels' rows) */
    units = (j.xb ? j.planes / 16 : j.planes) * j.row_units;
    /* Units in the order of the rows they write: each thread's share (tb_units'
     * home ranges) is then a band of rows of every channel, as the convs that
     * produce a large plane split it, so the pool reads what its own thread
     * wrote (ResNet-18's pool after its 112 x 112 stem: 346 -> 294 us in the
     * model, most of it the other core's half of the input crossing over).
     * Small planes of many channels (a conv that splits its channels) keep
     * plane order. */
    j.c = j.xb ? c / 16 : c;
    j.rows_first = h * w >= c && j.row_units > 1;
    want = tb_threads_for((double)j.planes * (double)oh * (double)ow * (double)(kh * kw),
                          PL_PAR_TAPS, units);
    tb_units(pool_unit, &j, units, (int)want);
    return TIRBYOC_OK;
}

int32_t tirbyoc_max_pool2d_f32(int64_t batch, int64_t c, int64_t h, int64_t w,
                               const float *x, int64_t kh, int64_t kw,
                               int64_t stride_h, int64_t stride_w, int64_t pad_top,
                               int64_t pad_left, int64_t dilation_h,
                               int64_t dilation_w, int64_t oh, int64_t ow, float *y)
{
    return max_pool2d(0, batch, c, h, w, x, kh, kw, stride_h, stride_w, pad_top, pad_left,
                      dilation_h, dilation_w, oh, ow, y);
}

int32_t tirbyoc_max_pool2d_f32_layouts(int64_t layouts, int64_t batch, int64_t c, int64_t h,
                                       int64_t w, const float *x, int64_t kh, int64_t kw,
                                       int64_t stride_h, int64_t stride_w, int64_t pad_top,
                                       int64_t pad_left, int64_t dilation_h,
                                       int64_t dilation_w, int64_t oh, int64_t ow, float *y)
{
    return max_pool2d(layouts, batch, c, h, w, x, kh, kw, stride_h, stride_w, pad_top,
                      pad_left, dilation_h, dilation_w, oh, ow, y);
}
