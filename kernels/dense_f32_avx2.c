/*
 * dense_f32_avx2.c - AVX2 + FMA building blocks of the float32 dense
 * kernels (see dense_f32_internal.h), for CPUs without AVX-512 (e.g. AMD
 * Zen 2/3, Intel Haswell to Comet Lake).
 *
 * Compiled for AVX2/FMA (target pragma below); dispatch.c calls into it
 * only when the CPU and OS support it.
 *
 * Micro-kernel: Y_MR rows x 16 columns (one W panel of the shared packed
 * layout = two ymm), 12 ymm accumulators. Column edges use vmaskmovps on C
 * and bias; W panels are zero padded. Every output goes through the same
 * sequence of operations whatever tile it falls in.
 */
#pragma GCC target("avx2,fma")

#include <immintrin.h>

#include "dense_f32_internal.h"
#include "chain_f32.h"
#include "transpose_avx2.h"

#define Y_MR 6
#define Y_NR 16
#define Y_PF 16

#define ALWAYS_INLINE static inline __attribute__((always_inline))

static int64_t min_i64(int64_t x, int64_t y) { return x < y ? x : y; }

/* Lane mask selecting the first n (clamped to 0..8) of 8 floats. */
ALWAYS_INLINE __m256i mask_n(int64_t n)
{
    const int32_t c = n < 0 ? 0 : (n > 8 ? 8 : (int32_t)n);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(c),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The first n (clamped to 0..8) of the 8 floats at p, the rest zero; and
 * their store. Whole vectors take the plain instructions: the masked ones
 * (VMASKMOVPS) are several times slower on AMD's cores up to Zen 3, a store
 * about ten times, and loads streamed through them ran at a third of the
 * speed. */
ALWAYS_INLINE __m256 load_n(const float *p, int64_t n)
{
    return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask_n(n));
}

ALWAYS_INLINE void store_n(float *p, int64_t n, __m256 v)
{
    if (n >= 8)
        _mm256_storeu_ps(p, v);
    else
        _mm256_maskstore_ps(p, mask_n(n), v);
}

/* ---- micro-kernel ---- */

/* One vector pair of an NCHW16c y (a pixel's 16 channels of a block)
 * through the chain ops (RESIDUAL, RELU and RELU6 only; the residual's
 * vectors at res), stored at y: conv_out16's and the Y16 tiles' store. */
ALWAYS_INLINE void put16(float *y, __m256 v0, __m256 v1, const float *res,
                         int64_t ops)
{
    int64_t o;
    for (o = ops; o != 0; o = (int64_t)((uint64_t)o >> 4)) {
        const int op = (int)(o & 15);
        if (op == TIRBYOC_EPI_RESIDUAL) {
            v0 = _mm256_add_ps(v0, _mm256_loadu_ps(res));
            v1 = _mm256_add_ps(v1, _mm256_loadu_ps(res + 8));
        } else {
            v0 = _mm256_max_ps(_mm256_setzero_ps(), v0);
            v1 = _mm256_max_ps(_mm256_setzero_ps(), v1);
            if (op == TIRBYOC_EPI_RELU6) {
                v0 = _mm256_min_ps(_mm256_set1_ps(6.0f), v0);
                v1 = _mm256_min_ps(_mm256_set1_ps(6.0f), v1);
            }
        }
    }
    _mm256_storeu_ps(y, v0);
    _mm256_storeu_ps(y + 8, v1);
}

/*
 * A register tile of MR rows x 16 columns (FULL: all 16 columns are C's).
 * IND: A is read in place (the convolution's direct path, tb_conv_tile_fn),
 * row i of k step p at kp[p][(off + i) * PS], or at kp[p][off + skip + i]
 * for rows i >= SPLIT when SPLIT > 0 (PS 1 then; PS 16 reads the pixels of
 * an NCHW16c image); else packed, ap[p * MR + i]. Y16: one K block whose
 * sums go to an NCHW16c y at c (put16; ldc its block stride, res and ops16
 * its chain), not to the tile C. The same FMAs in the same order on every
 * form, so the paths agree bit for bit.
 */
ALWAYS_INLINE void tile(const int MR, const int FULL, const int IND,
                        const int SPLIT, const int PS, int64_t skip,
                        int64_t off, int64_t kc, const float *restrict ap,
                        const float *const *kp, const float *restrict wp,
                        int64_t wps, float *restrict c, int64_t ldc, int nr,
                        int flags, const tb_chain *ch, int64_t ci, int64_t cj,
                        const int Y16, const float *res, int64_t ops16)
{
    __m256 acc0[Y_MR], acc1[Y_MR];
    const __m256i k0 = mask_n(nr), k1 = mask_n(nr - 8);
    int64_t p;
    int i;

#pragma GCC unroll 16
    for (i = 0; i < MR; ++i) {
        acc0[i] = _mm256_setzero_ps();
        acc1[i] = _mm256_setzero_ps();
        _mm_prefetch((const char *)(c + (Y16 ? i * 16 : i * ldc)), _MM_HINT_T0);
    }
    /* One k step: two W loads, MR broadcasts of A, 2 MR FMAs. Unrolled by
     * four, and the W prefetch only where W is not in cache yet: the loop
     * is then as many instructions as the FMA ports take cycles, or fewer
     * (at one step per iteration, the front end, not the FMAs, set the
     * pace on Zen 3). */
#define Y_STEP(PREFETCH, NEXT)                                                \
    do {                                                                      \
        const __m256 b0 = _mm256_loadu_ps(wp + p * 16);                       \
        const __m256 b1 = _mm256_loadu_ps(wp + p * 16 + 8);                   \
        const float *restrict ar = IND ? kp[p] + off * PS : ap + p * MR;      \
        const float *restrict ar2 = SPLIT > 0 ? ar + skip : ar;               \
        if (PREFETCH)                                                         \
            _mm_prefetch((const char *)(wp + (p + Y_PF) * 16), _MM_HINT_T0);  \
        if (NEXT)                                                             \
            _mm_prefetch((const char *)(wp + wps + p * 16), _MM_HINT_T1);     \
        if (IND) {                                                            \
            /* one register per row pointer (see dense_f32_avx512.c) */       \
            __asm__("" : "+r"(ar));                                           \
            if (SPLIT > 0)                                                    \
                __asm__("" : "+r"(ar2));                                      \
        }                                                                     \
        _Pragma("GCC unroll 16") for (i = 0; i < MR; ++i)                     \
        {                                                                     \
            const __m256 x = _mm256_broadcast_ss(                             \
                SPLIT > 0 && i >= SPLIT ? ar2 + i : ar + i * PS);             \
            acc0[i] = _mm256_fmadd_ps(x, b0, acc0[i]);                        \
            acc1[i] = _mm256_fmadd_ps(x, b1, acc1[i]);                        \
        }                                                                     \
    } while (0)
    if (flags & TB_PREFETCH_NEXT) {
        /* (the next panel, wps floats on) */
#pragma GCC unroll 4
        for (p = 0; p < kc; ++p)
            Y_STEP(flags & TB_PREFETCH_W, 1);
    } else if (flags & TB_PREFETCH_W) {
#pragma GCC unroll 4
        for (p = 0; p < kc; ++p)
            Y_STEP(1, 0);
    } else {
#pragma GCC unroll 4
        for (p = 0; p < kc; ++p)
            Y_STEP(0, 0);
    }
#undef Y_STEP
    if (Y16) {
#pragma GCC unroll 16
        for (i = 0; i < MR; ++i) {
            if (flags & TB_ACCUMULATE) {
                acc0[i] = _mm256_add_ps(acc0[i], _mm256_loadu_ps(c + i * 16));
                acc1[i] = _mm256_add_ps(acc1[i], _mm256_loadu_ps(c + i * 16 + 8));
            }
            put16(c + i * 16, acc0[i], acc1[i],
                  res != NULL ? res + i * 16 : NULL, ops16);
        }
        return;
    }
    if (flags & TB_ACCUMULATE) {
#pragma GCC unroll 16
        for (i = 0; i < MR; ++i) {
            const float *row = c + i * ldc;
            acc0[i] = _mm256_add_ps(acc0[i], FULL ? _mm256_loadu_ps(row)
                                                  : _mm256_maskload_ps(row, k0));
            acc1[i] = _mm256_add_ps(acc1[i], FULL ? _mm256_loadu_ps(row + 8)
                                                  : _mm256_maskload_ps(row + 8, k1));
        }
    }
    if ((flags & TB_LAST) && ch != NULL) {
        /* The chain's leading arithmetic operations on the accumulators
         * themselves (as in dense_f32_avx512.c), the rest through
         * tb_chain_tile. */
        int64_t ops = ch->ops;
        for (; ops != 0; ops >>= 4) {
            const int op = (int)(ops & 15);
            if (op == TIRBYOC_EPI_BIAS || op == TIRBYOC_EPI_RESIDUAL) {
#pragma GCC unroll 16
                for (i = 0; i < MR; ++i) {
                    const float *r = op == TIRBYOC_EPI_BIAS
                                         ? ch->bias + cj
                                         : ch->residual + (ci + i) * ch->ldr + cj;
                    acc0[i] = _mm256_add_ps(acc0[i], FULL ? _mm256_loadu_ps(r)
                                                          : _mm256_maskload_ps(r, k0));
                    acc1[i] = _mm256_add_ps(acc1[i], FULL ? _mm256_loadu_ps(r + 8)
                                                          : _mm256_maskload_ps(r + 8, k1));
                }
            } else if (op == TIRBYOC_EPI_SCALE || op == TIRBYOC_EPI_DIVIDE) {
                const __m256 s = _mm256_set1_ps(ch->scale);
                const int mul = op == TIRBYOC_EPI_SCALE;
#pragma GCC unroll 16
                for (i = 0; i < MR; ++i) {
                    acc0[i] = mul ? _mm256_mul_ps(acc0[i], s) : _mm256_div_ps(acc0[i], s);
                    acc1[i] = mul ? _mm256_mul_ps(acc1[i], s) : _mm256_div_ps(acc1[i], s);
                }
            } else if (op == TIRBYOC_EPI_RELU || op == TIRBYOC_EPI_RELU6) {
                /* vmaxps / vminps return their second source for NaN and
                 * +-0: NaN and -0.0 pass, as in ch_unary */
                const __m256 z = _mm256_setzero_ps();
                const __m256 hi = _mm256_set1_ps(op == TIRBYOC_EPI_RELU6
                                                     ? 6.0f
                                                     : __builtin_inff());
#pragma GCC unroll 16
                for (i = 0; i < MR; ++i) {
                    acc0[i] = _mm256_min_ps(hi, _mm256_max_ps(z, acc0[i]));
                    acc1[i] = _mm256_min_ps(hi, _mm256_max_ps(z, acc1[i]));
                }
            } else {
                break;
            }
        }
        if (ops != 0) {
            ch_vf t[2 * Y_MR];
#pragma GCC unroll 16
            for (i = 0; i < MR; ++i) {
                t[2 * i] = (ch_vf)acc0[i];
                t[2 * i + 1] = (ch_vf)acc1[i];
            }
            tb_chain_tile(ch, ops, t, MR, 2, ci, cj, nr, 0);
#pragma GCC unroll 16
            for (i = 0; i < MR; ++i) {
                acc0[i] = (__m256)t[2 * i];
                acc1[i] = (__m256)t[2 * i + 1];
            }
        }
    }
#pragma GCC unroll 16
    for (i = 0; i < MR; ++i) {
        float *restrict row = c + i * ldc;
        if (FULL) {
            _mm256_storeu_ps(row, acc0[i]);
            _mm256_storeu_ps(row + 8, acc1[i]);
        } else {
            _mm256_maskstore_ps(row, k0, acc0[i]);
            _mm256_maskstore_ps(row + 8, k1, acc1[i]);
        }
    }
}

typedef void (*tile_fn)(int64_t, const float *, const float *, float *,
                        int64_t, int, int, const tb_chain *, int64_t, int64_t);
typedef void (*ind_fn)(int64_t, int64_t, const float *const *, const float *,
                       int64_t, float *, int64_t, int, int);
typedef void (*ind16y_fn)(int64_t, int64_t, const float *const *,
                          const float *, int64_t, float *, const float *,
                          int64_t, int, int64_t);
typedef void (*split_fn)(int64_t, int64_t, int64_t, const float *const *,
                         const float *, int64_t, float *, int64_t, int, int);

/* packed A (tile), A in place with rows 1 float apart (ind) or 16 (ind16:
 * NCHW16c pixels), and ind16 storing into an NCHW16c y (ind16y) */
#define TILE_FN(MR, FULL)                                                     \
    static void tile_##MR##_##FULL(int64_t kc, const float *ap,               \
                                   const float *wp, float *c, int64_t ldc,    \
                                   int nr, int flags, const tb_chain *ch,     \
                                   int64_t ci, int64_t cj)                    \
    {                                                                         \
        tile(MR, FULL, 0, 0, 1, 0, 0, kc, ap, NULL, wp, 0, c, ldc, nr, flags, \
             ch, ci, cj, 0, NULL, 0);                                         \
    }                                                                         \
    static void ind_##MR##_##FULL(int64_t kc, int64_t off,                    \
                                  const float *const *kp, const float *wp,    \
                                  int64_t wps, float *c, int64_t ldc, int nr, \
                                  int flags)                                  \
    {                                                                         \
        tile(MR, FULL, 1, 0, 1, 0, off, kc, NULL, kp, wp, wps, c, ldc, nr,    \
             flags, NULL, 0, 0, 0, NULL, 0);                                  \
    }                                                                         \
    static void ind16_##MR##_##FULL(int64_t kc, int64_t off,                  \
                                    const float *const *kp, const float *wp,  \
                                    int64_t wps, float *c, int64_t ldc,       \
                                    int nr, int flags)                        \
    {                                                                         \
        tile(MR, FULL, 1, 0, 16, 0, off, kc, NULL, kp, wp, wps, c, ldc, nr,   \
             flags, NULL, 0, 0, 0, NULL, 0);                                  \
    }
/* ind storing into an NCHW16c y: indy (rows 1 float apart, tb_conv_tiley_fn)
 * and ind16y (16 apart, tb_conv_tile16y_fn); splity: indy for full tiles
 * whose rows span two output rows */
#define INDY_FN(NAME, PS, MR)                                                 \
    static void NAME##_##MR(int64_t kc, int64_t off, const float *const *kp,  \
                            const float *wp, int64_t wps, float *y,           \
                            const float *res, int64_t ldy, int flags,         \
                            int64_t ops)                                      \
    {                                                                         \
        tile(MR, 1, 1, 0, PS, 0, off, kc, NULL, kp, wp, wps, y, ldy, 16,      \
             flags, NULL, 0, 0, 1, res, ops);                                 \
    }
#define TILE_FNS(MR)                                                          \
    TILE_FN(MR, 0) TILE_FN(MR, 1) INDY_FN(ind16y, 16, MR) INDY_FN(indy, 1, MR)
TILE_FNS(1) TILE_FNS(2) TILE_FNS(3) TILE_FNS(4) TILE_FNS(5) TILE_FNS(6)

#define SPLITY_FN(S)                                                          \
    static void splity_##S(int64_t kc, int64_t off, int64_t skip,             \
                           const float *const *kp, const float *wp,           \
                           int64_t wps, float *y, const float *res,           \
                           int64_t ldy, int flags, int64_t ops)               \
    {                                                                         \
        tile(Y_MR, 1, 1, S, 1, skip, off, kc, NULL, kp, wp, wps, y, ldy, 16,  \
             flags, NULL, 0, 0, 1, res, ops);                                 \
    }
SPLITY_FN(1) SPLITY_FN(2) SPLITY_FN(3) SPLITY_FN(4) SPLITY_FN(5)

/* Full tiles whose rows span two output rows: rows >= S skip the virtual
 * row's padding. */
#define SPLIT_FN(S, FULL)                                                     \
    static void split_##S##_##FULL(int64_t kc, int64_t off, int64_t skip,     \
                                   const float *const *kp, const float *wp,   \
                                   int64_t wps, float *c, int64_t ldc,        \
                                   int nr, int flags)                         \
    {                                                                         \
        tile(Y_MR, FULL, 1, S, 1, skip, off, kc, NULL, kp, wp, wps, c, ldc,   \
             nr, flags, NULL, 0, 0, 0, NULL, 0);                              \
    }
#define SPLIT_FNS(S) SPLIT_FN(S, 0) SPLIT_FN(S, 1)
SPLIT_FNS(1) SPLIT_FNS(2) SPLIT_FNS(3) SPLIT_FNS(4) SPLIT_FNS(5)

static const tile_fn tiles[2][Y_MR + 1] = {
    {NULL, tile_1_0, tile_2_0, tile_3_0, tile_4_0, tile_5_0, tile_6_0},
    {NULL, tile_1_1, tile_2_1, tile_3_1, tile_4_1, tile_5_1, tile_6_1},
};
static const ind_fn inds[2][Y_MR + 1] = {
    {NULL, ind_1_0, ind_2_0, ind_3_0, ind_4_0, ind_5_0, ind_6_0},
    {NULL, ind_1_1, ind_2_1, ind_3_1, ind_4_1, ind_5_1, ind_6_1},
};
static const ind_fn inds16[2][Y_MR + 1] = {
    {NULL, ind16_1_0, ind16_2_0, ind16_3_0, ind16_4_0, ind16_5_0, ind16_6_0},
    {NULL, ind16_1_1, ind16_2_1, ind16_3_1, ind16_4_1, ind16_5_1, ind16_6_1},
};
static const ind16y_fn inds16y[Y_MR + 1] = {
    NULL, ind16y_1, ind16y_2, ind16y_3, ind16y_4, ind16y_5, ind16y_6,
};
typedef void (*splity_fn)(int64_t, int64_t, int64_t, const float *const *,
                          const float *, int64_t, float *, const float *,
                          int64_t, int, int64_t);
static const ind16y_fn indys[Y_MR + 1] = {
    NULL, indy_1, indy_2, indy_3, indy_4, indy_5, indy_6,
};
static const splity_fn splitys[Y_MR] = {
    NULL, splity_1, splity_2, splity_3, splity_4, splity_5,
};
static const split_fn splits[2][Y_MR] = {
    {NULL, split_1_0, split_2_0, split_3_0, split_4_0, split_5_0},
    {NULL, split_1_1, split_2_1, split_3_1, split_4_1, split_5_1},
};

static void ukernel(int64_t kc, const float *ap, const float *wp, int64_t wps,
                    float *c, int64_t ldc, int mr, int nr, int flags,
                    const tb_chain *ch, int64_t ci, int64_t cj)
{
    (void)wps; /* one panel: nr <= 16 */
    tiles[nr == 16][mr](kc, ap, wp, c, ldc, nr, flags, ch, ci, cj);
}

/* tb_conv_tile_fn (nr <= 16: one panel) */
static void conv_tile(int64_t kc, const float *const *kp, int64_t off,
                      const float *wp, int64_t wps, float *c, int64_t ldc,
                      int mr, int nr, int flags, int split, int64_t skip)
{
    const int full = nr == 16;
    if (split > 0 && split < mr && mr == Y_MR)
        splits[full][split](kc, off, skip, kp, wp, wps, c, ldc, nr, flags);
    else if (split > 0 && split < mr) {
        inds[full][split](kc, off, kp, wp, wps, c, ldc, nr, flags);
        inds[full][mr - split](kc, off + skip + split, kp, wp, wps,
                               c + split * ldc, ldc, nr, flags);
    } else
        inds[full][mr](kc, off, kp, wp, wps, c, ldc, nr, flags);
}

/* tb_conv_tile_fn over an NCHW16c image: row i of k step p at
 * kp[p][(off + i) * 16]; split is 0 (the rows are one run of pixels). */
static void conv_tile16(int64_t kc, const float *const *kp, int64_t off,
                        const float *wp, int64_t wps, float *c, int64_t ldc,
                        int mr, int nr, int flags, int split, int64_t skip)
{
    (void)split;
    (void)skip;
    inds16[nr == 16][mr](kc, off, kp, wp, wps, c, ldc, nr, flags);
}

/* tb_conv_tile16y_fn (nr is 16) */
static void conv_tile16y(int64_t kc, const float *const *kp, int64_t off,
                         const float *wp, int64_t wps, float *y,
                         const float *res, int64_t ldy, int mr, int nr,
                         int flags, int64_t ops)
{
    (void)nr;
    inds16y[mr](kc, off, kp, wp, wps, y, res, ldy, flags, ops);
}

/* tb_conv_tiley_fn (nr is 16) */
static void conv_tiley(int64_t kc, const float *const *kp, int64_t off,
                       const float *wp, int64_t wps, float *y, const float *res,
                       int64_t ldy, int mr, int nr, int flags, int64_t ops,
                       int split, int64_t skip)
{
    (void)nr;
    if (split > 0 && split < mr && mr == Y_MR)
        splitys[split](kc, off, skip, kp, wp, wps, y, res, ldy, flags, ops);
    else if (split > 0 && split < mr) {
        indys[split](kc, off, kp, wp, wps, y, res, ldy, flags, ops);
        indys[mr - split](kc, off + skip + split, kp, wp, wps, y + split * 16,
                          res != NULL ? res + split * 16 : NULL, ldy, flags, ops);
    } else
        indys[mr](kc, off, kp, wp, wps, y, res, ldy, flags, ops);
}

/* ---- packing ---- */

/* rows x cols (both <= 8) block, zero filled, transposed into r. */
ALWAYS_INLINE void load_transposed(__m256 r[8], const float *src, int64_t ld,
                                   int64_t rows, int64_t cols)
{
    int i;
    for (i = 0; i < 8; ++i)
        r[i] = i < rows ? load_n(src + i * ld, cols) : _mm256_setzero_ps();
    tb_transpose8(r);
}

/* Up to 8 rows x kc of a row-major matrix, k-major: dst[p * ds + i] =
 * src[i][p] for i < min(ds, 8) (lanes past rows hold zeros), one 8-lane
 * store per k step. A masked store costs about ten times a plain one on
 * AMD's cores up to Zen 3 (vmaskmovps), so only the last steps, whose 8
 * lanes would run past dst[kc * ds], are masked (to ds lanes); with ds < 8
 * each earlier store runs into the places of the next steps, which are
 * written after it. */
ALWAYS_INLINE void pack_kmajor(const float *src, int64_t ld, int64_t rows,
                               int64_t kc, float *restrict dst, int64_t ds)
{
    const __m256i keep = mask_n(ds);
    int64_t p0, j;
    for (p0 = 0; p0 < kc; p0 += 8) {
        const int64_t cols = min_i64(8, kc - p0);
        __m256 r[8];
        load_transposed(r, src + p0, ld, rows, cols);
        for (j = 0; j < cols; ++j) {
            if ((p0 + j) * ds + 8 <= kc * ds)
                _mm256_storeu_ps(dst + (p0 + j) * ds, r[j]);
            else
                _mm256_maskstore_ps(dst + (p0 + j) * ds, keep, r[j]);
        }
    }
}

static void pack_a(int64_t mr, int64_t kc, const float *restrict a,
                   int64_t lda, float *restrict ap)
{
    /* one group of at most 8 rows (mr <= Y_MR < 8) */
    pack_kmajor(a, lda, mr, kc, ap, mr);
}

static void pack_w(tb_wlayout layout, int64_t kc, int64_t nc,
                   const float *restrict w, int64_t ldw, float *restrict dst,
                   int64_t dps)
{
    int64_t q, p;
    if (layout == TB_W_NT) {
        /* Each panel as two halves of 8 lanes; the padding columns come out
         * as zeros (a half with no rows is all zeros). */
        for (q = 0; q * 16 < nc; ++q) {
            const int64_t nb = min_i64(16, nc - q * 16);
            const float *src = w + q * 16 * ldw;
            pack_kmajor(src, ldw, min_i64(8, nb), kc, dst + q * dps, 16);
            pack_kmajor(src + 8 * ldw, ldw, nb - 8, kc, dst + q * dps + 8, 16);
        }
    } else {
        /* Row by row, so that W is read sequentially. */
        for (p = 0; p < kc; ++p) {
            const float *src = w + p * ldw;
            for (q = 0; q * 16 < nc; ++q) {
                float *restrict out = dst + q * dps + p * 16;
                const int64_t nb = nc - q * 16;
                if (nb >= 16) {
                    _mm256_storeu_ps(out, _mm256_loadu_ps(src + q * 16));
                    _mm256_storeu_ps(out + 8, _mm256_loadu_ps(src + q * 16 + 8));
                } else {
                    _mm256_storeu_ps(out, load_n(src + q * 16, nb));
                    _mm256_storeu_ps(out + 8, load_n(src + q * 16 + 8, nb - 8));
                }
            }
        }
    }
}

/* ---- the convolution's direct path: stores ---- */

/* tb_conv_out_fn: 8 channels x 8 pixels at a time through the transpose,
 * then the chain over each channel's 8 pixels (a register each). */
static void conv_out(const float *ct, int64_t ldc, int64_t m, int64_t n,
                     float *y, int64_t ldy, const tb_chain *ch, int64_t ci,
                     int64_t cj)
{
    int64_t o0, t0;
    int j;
    for (t0 = 0; t0 < n; t0 += 8) {
        const int64_t rows = min_i64(8, n - t0);
        for (o0 = 0; o0 < m; o0 += 8) {
            const int64_t cols = min_i64(8, m - o0);
            __m256 r[8];
            load_transposed(r, ct + t0 * ldc + o0, ldc, rows, cols);
            if (ch != NULL)
                tb_chain_tile(ch, ch->ops, (ch_vf *)r, (int)cols, 1, ci + o0,
                              cj + t0, rows, 0);
#pragma GCC unroll 8
            for (j = 0; j < 8; ++j) {
                if (j >= cols)
                    break;
                store_n(y + (o0 + j) * ldy + t0, rows, r[j]);
            }
        }
    }
}

/* tb_conv_out16_fn: each pixel's 16 channels of a block are two vectors of
 * the tile's row, stored whole (no transpose). */
static void conv_out16(const float *ct, int64_t ldc, int64_t m, int64_t n,
                       float *y, const float *res, int64_t ldy, int64_t ops)
{
    int64_t o0, t;
    for (o0 = 0; o0 < m; o0 += 16)
        for (t = 0; t < n; ++t)
            put16(y + o0 / 16 * ldy + t * 16,
                  _mm256_loadu_ps(ct + t * ldc + o0),
                  _mm256_loadu_ps(ct + t * ldc + o0 + 8),
                  res != NULL ? res + o0 / 16 * ldy + t * 16 : NULL, ops);
}

/* ---- few rows: matrix-vector like, streaming W once ---- */

ALWAYS_INLINE float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v),
                          _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* nt: MM rows of A against JB rows of W, as dot products over all of K,
 * each in two accumulators (groups of 8 k steps alternately, added at the
 * end; a group left over goes to the first): with one FMA chain per sum
 * the loop waited on the FMA's latency wherever MM * JB was small (a
 * matrix-vector product). Every MM and JB sums a column the same way, so
 * the register blocks a thread's share of columns falls into do not change
 * its bits. */
ALWAYS_INLINE void dots(const int MM, const int JB, int64_t k,
                        const float *restrict a, int64_t lda,
                        const float *restrict w, int64_t ldw,
                        float *restrict c, int64_t ldc, const tb_chain *ch,
                        int64_t ci, int64_t cj)
{
    __m256 acc[4][4], acc2[4][4];
    int64_t p = 0;
    int i, j;
    for (i = 0; i < MM; ++i)
        for (j = 0; j < JB; ++j)
            acc[i][j] = acc2[i][j] = _mm256_setzero_ps();
    for (; p + 16 <= k; p += 16)
        for (j = 0; j < JB; ++j) {
            const __m256 y0 = _mm256_loadu_ps(w + j * ldw + p);
            const __m256 y1 = _mm256_loadu_ps(w + j * ldw + p + 8);
            for (i = 0; i < MM; ++i) {
                acc[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i * lda + p), y0,
                                            acc[i][j]);
                acc2[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i * lda + p + 8), y1,
                                             acc2[i][j]);
            }
        }
    /* (the last k steps' masked-off lanes add zeros) */
    for (; p < k; p += 8) {
        __m256 x[4];
        for (i = 0; i < MM; ++i)
            x[i] = load_n(a + i * lda + p, k - p);
        for (j = 0; j < JB; ++j) {
            const __m256 y = load_n(w + j * ldw + p, k - p);
            for (i = 0; i < MM; ++i)
                acc[i][j] = _mm256_fmadd_ps(x[i], y, acc[i][j]);
        }
    }
    {
        /* each row's JB outputs in one register, for the chain */
        ch_vf t[4];
        for (i = 0; i < MM; ++i) {
            t[i] = ch_splat(0.0f);
            for (j = 0; j < JB; ++j)
                t[i][j] = hsum(_mm256_add_ps(acc[i][j], acc2[i][j]));
        }
        if (ch != NULL)
            tb_chain_tile(ch, ch->ops, t, MM, 1, ci, cj, JB, 0);
        for (i = 0; i < MM; ++i)
            for (j = 0; j < JB; ++j)
                c[i * ldc + j] = t[i][j];
    }
}

#define DOTS_FN(MM, JB)                                                       \
    static void dots_##MM##_##JB(int64_t k, const float *a, int64_t lda,      \
                                 const float *w, int64_t ldw, float *c,       \
                                 int64_t ldc, const tb_chain *ch, int64_t ci, \
                                 int64_t cj)                                  \
    {                                                                         \
        dots(MM, JB, k, a, lda, w, ldw, c, ldc, ch, ci, cj);                  \
    }
/* (two accumulators per sum: 2 MM JB registers of the 16, with the two W
 * loads and A read from memory) */
DOTS_FN(1, 4) DOTS_FN(2, 3) DOTS_FN(3, 2) DOTS_FN(4, 1) DOTS_FN(4, 2)
DOTS_FN(1, 1) DOTS_FN(2, 1) DOTS_FN(3, 1)

typedef void (*dots_fn)(int64_t, const float *, int64_t, const float *,
                        int64_t, float *, int64_t, const tb_chain *, int64_t,
                        int64_t);
static const dots_fn dots_wide[5] = {NULL, dots_1_4, dots_2_3, dots_3_2,
                                     dots_4_2};
static const int dots_jb[5] = {0, 4, 3, 2, 2};
static const dots_fn dots_one[5] = {NULL, dots_1_1, dots_2_1, dots_3_1,
                                    dots_4_1};

/* packed: MM rows against PB panels (16 columns = 2 ymm each). */
ALWAYS_INLINE void panels(const int MM, const int PB, int64_t k,
                          const float *restrict a, int64_t lda,
                          const float *restrict w, int64_t pstride,
                          float *restrict c, int64_t ldc, int64_t nb,
                          const tb_chain *ch, int64_t ci, int64_t cj)
{
    __m256 acc[4][8];
    int64_t p;
    int i, q;
    for (i = 0; i < MM; ++i)
        for (q = 0; q < 2 * PB; ++q)
            acc[i][q] = _mm256_setzero_ps();
    for (p = 0; p < k; ++p) {
        __m256 x[4];
        for (i = 0; i < MM; ++i)
            x[i] = _mm256_broadcast_ss(a + i * lda + p);
        for (q = 0; q < 2 * PB; ++q) {
            const __m256 y =
                _mm256_loadu_ps(w + (q / 2) * pstride + p * 16 + (q % 2) * 8);
            for (i = 0; i < MM; ++i)
                acc[i][q] = _mm256_fmadd_ps(x[i], y, acc[i][q]);
        }
    }
    if (ch != NULL) {
        ch_vf t[4 * 8];
        for (i = 0; i < MM; ++i)
            for (q = 0; q < 2 * PB; ++q)
                t[i * 2 * PB + q] = (ch_vf)acc[i][q];
        tb_chain_tile(ch, ch->ops, t, MM, 2 * PB, ci, cj, nb, 0);
        for (i = 0; i < MM; ++i)
            for (q = 0; q < 2 * PB; ++q)
                acc[i][q] = (__m256)t[i * 2 * PB + q];
    }
    for (q = 0; q < 2 * PB; ++q)
        for (i = 0; i < MM; ++i)
            store_n(c + i * ldc + q * 8, nb - q * 8, acc[i][q]);
}

#define PANELS_FN(MM, PB)                                                     \
    static void panels_##MM##_##PB(int64_t k, const float *a, int64_t lda,    \
                                   const float *w, int64_t ps, float *c,      \
                                   int64_t ldc, int64_t nb,                   \
                                   const tb_chain *ch, int64_t ci,            \
                                   int64_t cj)                                \
    {                                                                         \
        panels(MM, PB, k, a, lda, w, ps, c, ldc, nb, ch, ci, cj);             \
    }
PANELS_FN(1, 4) PANELS_FN(2, 2) PANELS_FN(3, 2) PANELS_FN(4, 1)
PANELS_FN(1, 1) PANELS_FN(2, 1) PANELS_FN(3, 1)

typedef void (*panels_fn)(int64_t, const float *, int64_t, const float *,
                          int64_t, float *, int64_t, int64_t,
                          const tb_chain *, int64_t, int64_t);
static const panels_fn panels_wide[5] = {NULL, panels_1_4, panels_2_2,
                                         panels_3_2, panels_4_1};
static const int panels_pb[5] = {0, 4, 2, 2, 1};
static const panels_fn panels_one[5] = {NULL, panels_1_1, panels_2_1,
                                        panels_3_1, panels_4_1};

#define Y_NN_CHUNK 1024

/* nn: rows of W stream through; C[0:mm, chunk] stays in L1 and takes four
 * rank-1 updates per pass. */
static void rows_nn(int64_t mm, int64_t n, int64_t k, const float *restrict a,
                    int64_t lda, const float *restrict w, int64_t ldw,
                    float *restrict c, int64_t ldc, const tb_chain *ch,
                    int64_t ci, int64_t cj)
{
    int64_t j0, j, p;
    int i, s;
    for (j0 = 0; j0 < n; j0 += Y_NN_CHUNK) {
        const int64_t nb = min_i64(Y_NN_CHUNK, n - j0);
        for (p = 0; p < k; p += 4) {
            const int steps = (int)min_i64(4, k - p);
            const float *restrict wr = w + p * ldw + j0;
            for (i = 0; i < mm; ++i) {
                const float *restrict x = a + i * lda + p;
                float *restrict row = c + i * ldc + j0;
                __m256 xs[4];
                for (s = 0; s < 4; ++s)
                    xs[s] = _mm256_set1_ps(s < steps ? x[s] : 0.0f);
                for (j = 0; j < nb; j += 8) {
                    __m256 v = p == 0 ? _mm256_setzero_ps() : load_n(row + j, nb - j);
                    if (steps == 4 && nb - j >= 8) {
                        v = _mm256_fmadd_ps(xs[0], _mm256_loadu_ps(wr + j), v);
                        v = _mm256_fmadd_ps(xs[1], _mm256_loadu_ps(wr + ldw + j), v);
                        v = _mm256_fmadd_ps(xs[2], _mm256_loadu_ps(wr + 2 * ldw + j), v);
                        v = _mm256_fmadd_ps(xs[3], _mm256_loadu_ps(wr + 3 * ldw + j), v);
                    } else {
                        for (s = 0; s < steps; ++s)
                            v = _mm256_fmadd_ps(xs[s], load_n(wr + s * ldw + j, nb - j), v);
                    }
                    store_n(row + j, nb - j, v);
                }
            }
        }
        /* the chunk is in L1: the chain on it before moving on */
        if (ch != NULL)
            tb_chain_block(ch, c + j0, ldc, mm, nb, ci, cj + j0);
    }
}

static void small_cols(tb_wlayout layout, int64_t m, int64_t n, int64_t k,
                  const float *restrict a, int64_t lda,
                  const float *restrict w, int64_t ldw, float *restrict c,
                  int64_t ldc, const tb_chain *ch, int64_t ci, int64_t cj)
{
    int64_t i0, j;
    for (i0 = 0; i0 < m; i0 += 4) {
        const int mm = (int)min_i64(4, m - i0);
        const float *ai = a + i0 * lda;
        float *c_i = c + i0 * ldc;
        if (layout == TB_W_NT) {
            const int jb = dots_jb[mm];
            for (j = 0; j + jb <= n; j += jb)
                dots_wide[mm](k, ai, lda, w + j * ldw, ldw, c_i + j, ldc, ch,
                              ci + i0, cj + j);
            for (; j < n; ++j)
                dots_one[mm](k, ai, lda, w + j * ldw, ldw, c_i + j, ldc, ch,
                             ci + i0, cj + j);
        } else if (layout == TB_W_NN && mm == 1) {
            tb_gemv_nn(n, k, ai, w, ldw, c_i, ch, ci + i0, cj);
        } else if (layout == TB_W_NN) {
            rows_nn(mm, n, k, ai, lda, w, ldw, c_i, ldc, ch, ci + i0, cj);
        } else {
            const int pb = panels_pb[mm];
            for (j = 0; j + pb * 16 <= n; j += pb * 16)
                panels_wide[mm](k, ai, lda, w + (j / 16) * ldw, ldw, c_i + j,
                                ldc, pb * 16, ch, ci + i0, cj + j);
            for (; j < n; j += 16)
                panels_one[mm](k, ai, lda, w + (j / 16) * ldw, ldw, c_i + j,
                               ldc, n - j, ch, ci + i0, cj + j);
        }
    }
}

/* KC = 384: the KC x 16 W micro-panel stays in L1 while the 6 x KC A
 * micro-panels stream past it, and the two together are about the L1d:
 * 32 KiB / (4 bytes * (16 + 6)) = 372 k steps, rounded up to whole groups
 * of 16. Every x86 core whose best is AVX2 (Intel Haswell to Comet Lake,
 * AMD Zen 1 to 3) has a 32 KiB L1d, so this is each one's value; the cores
 * with a larger L1d run the AVX-512 kernels. Against 256 on Zen 3 (both
 * libraries in one process): dense 1.00-1.15x, 1x1 convs 1.00-1.18x, 3x3
 * convs on the direct path 0.95-1.02x (docs/performance.md, 2026-11-27).
 * NC = 256: the KC x 256 W block packed per call (384 KiB) stays in the
 * 512 KiB L2 of Zen 2 and 3 (on the 256 KiB L2 of Intel's client cores it
 * is backed by L3; pre-packed weights are read in place, one block). */
#define ISA_KC 384
#define ISA_NC 256
/* ---- nt with the rows of C along the vectors: W read in place ---- */

/*
 * The AVX2 counterpart of nt_direct in dense_f32_avx512.c: A is packed
 * transposed in chunks of Y_DROWS rows (ap[p * 8V + i], V = ceil(rows /
 * 8)), W is read where it is. A tile is 2 ymm of 8 rows x Y_DJ columns (12
 * accumulators): per k step 2 loads of A and one broadcast per column. The
 * row pairs of a chunk take the same Y_DJ rows of W in turn, so those stay
 * in L1. Same K blocks (tb_kblocks with ISA_KC) and order of additions as
 * the blocked path: bit-identical results.
 */
#define Y_DJ 6
#define Y_DROWS 64

ALWAYS_INLINE void dtile(const int V, int64_t k, int64_t kblocks,
                         const float *restrict ap, int64_t aps,
                         const float *restrict w, int64_t ldw, int jn, int mv,
                         float *restrict c, int64_t ldc, const tb_chain *ch,
                         int64_t ci, int64_t cj)
{
    __m256 acc[2][Y_DJ];
    const float *restrict wr[Y_DJ];
    /* Sums of the finished K blocks; at the end, the finished outputs. */
    float tot[Y_DJ][16] __attribute__((aligned(32)));
    int64_t kb, p;
    int v, j, i;
    for (j = 0; j < Y_DJ; ++j)
        /* Past the last column, repeat it (computed, never stored). */
        wr[j] = w + (j < jn ? j : jn - 1) * ldw;
    for (kb = 0; kb < kblocks; ++kb) {
        const int64_t p1 = tb_kblock_start(k, kblocks, kb + 1);
        for (j = 0; j < Y_DJ; ++j)
            for (v = 0; v < V; ++v)
                acc[v][j] = _mm256_setzero_ps();
        for (p = tb_kblock_start(k, kblocks, kb); p < p1; ++p) {
            __m256 x[2];
            for (v = 0; v < V; ++v)
                x[v] = _mm256_load_ps(ap + p * aps + 8 * v);
            for (j = 0; j < Y_DJ; ++j) {
                const __m256 y = _mm256_broadcast_ss(wr[j] + p);
                for (v = 0; v < V; ++v)
                    acc[v][j] = _mm256_fmadd_ps(x[v], y, acc[v][j]);
            }
        }
        for (j = 0; j < Y_DJ; ++j)
            for (v = 0; v < V; ++v) {
                __m256 r = acc[v][j];
                if (kb > 0)
                    r = _mm256_add_ps(r, _mm256_load_ps(&tot[j][8 * v]));
                _mm256_store_ps(&tot[j][8 * v], r);
            }
    }
    /* The chain on the tile, whose registers run down C's columns (GCC's
     * vector types alias their element type). */
    if (ch != NULL)
        tb_chain_tile(ch, ch->ops, (ch_vf *)tot, jn, 2, ci, cj, mv, 1);
    for (i = 0; i < mv; ++i)
        for (j = 0; j < jn; ++j)
            c[i * ldc + j] = tot[j][i];
}

#define DTILE_FN(V)                                                           \
    static void dtile_##V(int64_t k, int64_t kblocks, const float *ap,        \
                          int64_t aps, const float *w, int64_t ldw, int jn,   \
                          int mv, float *c, int64_t ldc, const tb_chain *ch,  \
                          int64_t ci, int64_t cj)                             \
    {                                                                         \
        dtile(V, k, kblocks, ap, aps, w, ldw, jn, mv, c, ldc, ch, ci, cj);    \
    }
DTILE_FN(1) DTILE_FN(2)

static void nt_direct(int64_t m, int64_t n, int64_t k, const float *a,
                      int64_t lda, const float *w, int64_t ldw, float *c,
                      int64_t ldc, const tb_chain *ch, int64_t ci, int64_t cj,
                      float *ap)
{
    const int64_t kblocks = tb_kblocks(k, ISA_KC);
    int64_t i0, j;
    for (i0 = 0; i0 < m; i0 += Y_DROWS) {
        const int mv = (int)min_i64(Y_DROWS, m - i0);
        const int V = (mv + 7) / 8;
        int v, u;
        /* Rows past mv come out as zeros. */
        for (v = 0; v < V; ++v)
            pack_kmajor(a + (i0 + 8 * v) * lda, lda, min_i64(8, mv - 8 * v), k,
                        ap + 8 * v, 8 * V);
        for (j = 0; j < n; j += Y_DJ)
            for (u = 0; u < mv; u += 16) {
                const int rows = (int)min_i64(16, mv - u);
                (rows > 8 ? dtile_2 : dtile_1)(
                    k, kblocks, ap + u, 8 * V, w + j * ldw, ldw,
                    (int)min_i64(Y_DJ, n - j), rows, c + (i0 + u) * ldc + j,
                    ldc, ch, ci + i0 + u, cj + j);
            }
    }
}

/* The scratch buffer (threads.c) is sized for the largest blocks; pack_a
 * packs one group of rows. */
typedef char check_blocks[ISA_KC <= TB_KC_MAX && ISA_NC <= TB_NC_MAX &&
                                  Y_MR <= TB_MR_MAX && Y_MR < 8
                              ? 1
                              : -1];

/* ---- the convolution's implicit im2col (conv_gather.h) ---- */

/* The portable loops, one element and one bounds check at a time, took
 * 37% of a 1x1 stride-2 conv from 64 channels on the gather path (Zen 3,
 * one thread); these take whole vectors, loading only the elements inside
 * the row (masked loads, which never touch the lanes masked off). */
#define TB_CG_OWN_LOADS 1

/* Lanes i (0 <= i < 8) with a <= i + o < b, o the vector's first lane. */
static inline __m256i cg_lanes(int64_t a, int64_t b, int o)
{
    const __m256i i = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                       _mm256_set1_epi32(o));
    return _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)a), i),
                               _mm256_cmpgt_epi32(_mm256_set1_epi32((int)b), i));
}

/* The even lanes of the 16 floats in (a, b): a[0], a[2], ..., b[6]. */
static inline __m256 cg_even(__m256 a, __m256 b)
{
    return _mm256_castpd_ps(_mm256_permute4x64_pd(
        _mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))),
        _MM_SHUFFLE(3, 1, 2, 0)));
}

static inline void cg_run(float *d, const float *row, int64_t iw, int64_t sw,
                          int64_t w, int t0, int len)
{
    /* the lanes [t0 + lo, t0 + hi) hold columns inside [0, w) */
    int64_t lo, hi;
    __m256 v0 = _mm256_setzero_ps(), v1 = v0;
    tb_cg_inside(row, iw, sw, w, len, &lo, &hi);
    if (hi > lo) {
        const int64_t a = t0 + lo, b = t0 + hi;
        const float *first = row + iw + lo * sw;
        if (sw == 1) {
            /* lane t reads element t of base, a floats before first: an
             * integer, as it may lie before the row; only the lanes
             * inside the row are read */
            const uintptr_t base = (uintptr_t)first - (uintptr_t)a * sizeof(float);
            v0 = _mm256_maskload_ps((const float *)base, cg_lanes(a, b, 0));
            v1 = _mm256_maskload_ps((const float *)(base + 8 * sizeof(float)),
                                    cg_lanes(a, b, 8));
        } else if (sw == 2) {
            /* lane t reads element 2 t from base (2 a floats before
             * first): the elements from the first lane's to the last's in
             * four masked loads, then the even ones */
            const uintptr_t base = (uintptr_t)first - (uintptr_t)(2 * a) * sizeof(float);
            const int64_t j0 = 2 * a, j1 = 2 * b - 1;
            __m256 q[4];
            int h;
            for (h = 0; h < 4; ++h)
                q[h] = _mm256_maskload_ps((const float *)(base + 8 * h * sizeof(float)),
                                          cg_lanes(j0, j1, 8 * h));
            v0 = cg_even(q[0], q[1]);
            v1 = cg_even(q[2], q[3]);
        } else {
            /* lane t reads element (t - a) sw of first */
            const __m256i step = _mm256_set1_epi32((int)sw);
            const __m256i i0 = _mm256_mullo_epi32(
                _mm256_sub_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                 _mm256_set1_epi32((int)a)), step);
            const __m256i i1 = _mm256_add_epi32(i0, _mm256_mullo_epi32(
                                                        _mm256_set1_epi32(8), step));
            v0 = _mm256_mask_i32gather_ps(v0, first, i0,
                                          _mm256_castsi256_ps(cg_lanes(a, b, 0)), 4);
            v1 = _mm256_mask_i32gather_ps(v1, first, i1,
                                          _mm256_castsi256_ps(cg_lanes(a, b, 8)), 4);
        }
    }
    /* the run's lanes (zero outside the row), the rest of d as it was */
    _mm256_storeu_ps(d, _mm256_blendv_ps(_mm256_loadu_ps(d), v0,
                                         _mm256_castsi256_ps(cg_lanes(t0, t0 + len, 0))));
    _mm256_storeu_ps(d + 8, _mm256_blendv_ps(_mm256_loadu_ps(d + 8), v1,
                                             _mm256_castsi256_ps(cg_lanes(t0, t0 + len, 8))));
}

static inline void cg_copy16(float *d, const float *src)
{
    _mm256_storeu_ps(d, _mm256_loadu_ps(src));
    _mm256_storeu_ps(d + 8, _mm256_loadu_ps(src + 8));
}

/* the even lanes of src[0:31]: four loads (the last one a float early, to
 * read nothing past src[30]) and shuffles, not a gather */
static inline void cg_copy16_s2(float *d, const float *src)
{
    const __m256 a = _mm256_loadu_ps(src), b = _mm256_loadu_ps(src + 8);
    const __m256 c = _mm256_loadu_ps(src + 16), e = _mm256_loadu_ps(src + 23);
    _mm256_storeu_ps(d, cg_even(a, b));
    /* c holds src[16:24], e src[23:31]: src[16], [18] from c's lanes 0, 2
     * and src[24], [26] from e's lanes 1, 3 in each 128-bit half */
    _mm256_storeu_ps(d + 8, _mm256_castpd_ps(_mm256_permute4x64_pd(
                                _mm256_castps_pd(_mm256_shuffle_ps(c, e, _MM_SHUFFLE(3, 1, 2, 0))),
                                _MM_SHUFFLE(3, 1, 2, 0))));
}

#include "conv_gather.h"
#include "conv_winograd.h"


/* tb_unblock16_fn: 8 pixels x 8 lanes a step through the register
 * transpose; a row that is not a multiple of 8 pixels (but at least 8) ends
 * with a step over its last 8, storing some values a second time. The
 * AVX-512 table uses it as it is. */
void tb_unblock16_avx2(float *d, int64_t ds, const float *s, int64_t n, int64_t sw)
{
    const int64_t ps = sw * 16;
    int64_t t, h, i;
    for (t = 0; t < n && n >= 8; t += 8) {
        const int64_t t0 = t + 8 <= n ? t : n - 8;
        for (h = 0; h < 16; h += 8) {
            __m256 r[8];
            for (i = 0; i < 8; ++i)
                r[i] = _mm256_loadu_ps(s + (t0 + i) * ps + h);
            tb_transpose8(r);
            for (i = 0; i < 8; ++i)
                _mm256_storeu_ps(d + (h + i) * ds + t0, r[i]);
        }
    }
    for (t = 0; t < n && n < 8; ++t)
        for (i = 0; i < 16; ++i)
            d[i * ds + t] = s[t * ps + i];
}

const tb_isa tb_isa_avx2 = {
    "avx2", Y_MR, Y_NR, ISA_KC, ISA_NC, ukernel, pack_a, pack_w, small_cols,
    nt_direct, Y_DJ, Y_DROWS, TB_DIRECT_M_PER_LANE * 8,
    tb_chain_block, tb_unary_row, tb_softmax_row, tb_attn_row, tb_conv_gather,
    conv_tile, conv_out, tb_wino_in, tb_wino_out, conv_tile16, conv_out16,
    conv_tile16y, conv_tiley, NULL, tb_unblock16_avx2, 128, 0,
};
