/*
 * dense_f32_avx512.c - AVX-512 (AVX512F + FMA) building blocks of the
 * float32 dense kernels (see dense_f32_internal.h).
 *
 * Compiled for AVX-512 (through the target pragma below); dispatch.c calls
 * into it only when the CPU and OS support it.
 *
 * Micro-kernel: X_MR = 14 rows x 32 columns (two 16-float W panels), so
 * 28 of the 32 zmm registers hold accumulators; per k step two W vectors
 * are loaded and each row's A value is broadcast once and feeds two FMAs. Column edges use
 * AVX-512 masks on C (W panels are zero padded), row edges have
 * their own instantiations, so every output goes through the same
 * sequence of operations whatever tile it falls in.
 *
 * Also here: the few-rows routines and nt_direct ("nt" with up to a few
 * dozen rows, without packing W).
 */
#ifdef TIRBYOC_NO_AVX512
/* Built without the AVX-512 code (TIRBYOC_NO_AVX512: see _build_kernels.py):
 * only the table entry, which dispatch.c then never selects. */
#include "dense_f32_internal.h"
const tb_isa tb_isa_avx512 = {.name = "avx512"};
#else
#pragma GCC target("avx512f,avx2,fma")

#include <immintrin.h>

#include "dense_f32_internal.h"
#include "chain_f32.h"
#include "transpose_avx512.h"

#define X_MR 14
#define X_NR 32

/* W prefetch distance in k steps (one k step = one line per panel). */
#define X_PF 16

#define ALWAYS_INLINE static inline __attribute__((always_inline))

static int64_t min_i64(int64_t x, int64_t y) { return x < y ? x : y; }

static __mmask16 mask_n(int64_t n)
{
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
}

/* The chain's leading arithmetic operations (bias, residual, scale, divide,
 * relu, relu6) on registers r[0:N], one at a time over all of them: r[o]
 * holds the outputs at row ci + o, columns cj + lane, valid in the lanes of
 * mask m and the rows below cnt (the others are computed on and never
 * stored; their rows are not read). The operations of tb_chain_tile (a bias
 * or a stride-1 residual gather is a masked load; vmaxps / vminps return
 * their second source for NaN and +-0, so NaN and -0.0 pass as with
 * ch_sel), so the same results, without a round trip through memory.
 * Returns the operations left (from the first other one on) for
 * tb_chain_tile. */
ALWAYS_INLINE int64_t lead_ops(const int N, const tb_chain *ch, __m512 *r,
                               int cnt, __mmask16 m, int64_t ci, int64_t cj)
{
    int64_t ops = ch->ops;
    int o;
    for (; ops != 0; ops >>= 4) {
        const int op = (int)(ops & 15);
        if (op == TIRBYOC_EPI_BIAS) {
            const __m512 b = _mm512_maskz_loadu_ps(m, ch->bias + cj);
#pragma GCC unroll 16
            for (o = 0; o < N; ++o)
                r[o] = _mm512_add_ps(r[o], b);
        } else if (op == TIRBYOC_EPI_RESIDUAL) {
#pragma GCC unroll 16
            for (o = 0; o < N; ++o)
                if (o < cnt)
                    r[o] = _mm512_add_ps(
                        r[o],
                        _mm512_maskz_loadu_ps(m, ch->residual + (ci + o) * ch->ldr + cj));
        } else if (op == TIRBYOC_EPI_SCALE || op == TIRBYOC_EPI_DIVIDE) {
            const __m512 sc = _mm512_set1_ps(ch->scale);
#pragma GCC unroll 16
            for (o = 0; o < N; ++o)
                r[o] = op == TIRBYOC_EPI_SCALE ? _mm512_mul_ps(r[o], sc)
                                               : _mm512_div_ps(r[o], sc);
        } else if (op == TIRBYOC_EPI_RELU || op == TIRBYOC_EPI_RELU6) {
            const __m512 z = _mm512_setzero_ps();
            const __m512 hi = _mm512_set1_ps(op == TIRBYOC_EPI_RELU6 ? 6.0f
                                                                     : __builtin_inff());
#pragma GCC unroll 16
            for (o = 0; o < N; ++o)
                r[o] = _mm512_min_ps(hi, _mm512_max_ps(z, r[o]));
        } else {
            break;
        }
    }
    return ops;
}

/* ---- micro-kernel ---- */

/* One vector of an NCHW16c y (a pixel's 16 channels of a block) through the
 * chain ops (RESIDUAL, RELU, RELU6, SILU and SIGMOID only: sigmoid16; the
 * residual's vector at res), stored at y: conv_out16's and the Y16 tiles'
 * store. A SiLU or sigmoid is ch_unary's, as every other path computes it. */
ALWAYS_INLINE void put16(float *y, __m512 v, const float *res, int64_t ops)
{
    int64_t o;
    for (o = ops; o != 0; o = (int64_t)((uint64_t)o >> 4)) {
        const int op = (int)(o & 15);
        if (op == TIRBYOC_EPI_RESIDUAL)
            v = _mm512_add_ps(v, _mm512_loadu_ps(res));
        else if (op == TIRBYOC_EPI_SILU || op == TIRBYOC_EPI_SIGMOID)
            v = (__m512)ch_unary((ch_vf)v, op);
        else {
            v = _mm512_max_ps(_mm512_setzero_ps(), v);
            if (op == TIRBYOC_EPI_RELU6)
                v = _mm512_min_ps(_mm512_set1_ps(6.0f), v);
        }
    }
    _mm512_storeu_ps(y, v);
}

/* The NCHW16c store of a tile (Y16): row i's vector v goes to
 * y[v * ldy + i * 16] (the residual at res's same offsets). */
ALWAYS_INLINE void store16(const int MR, const int NV, const __m512 *acc0,
                           const __m512 *acc1, float *y, int64_t ldy,
                           const float *res, int64_t ops)
{
    int i, v;
#pragma GCC unroll 16
    for (i = 0; i < MR; ++i)
#pragma GCC unroll 2
        for (v = 0; v < NV; ++v)
            put16(y + v * ldy + i * 16, v == 0 ? acc0[i] : acc1[i],
                  res != NULL ? res + v * ldy + i * 16 : NULL, ops);
}

/* IND: A is read in place, row i of k step p at kp[p][(off + i) * PS], or
 * at kp[p][off + skip + i] for rows i >= SPLIT when SPLIT > 0 (PS 1 then;
 * the convolution's direct path, tb_conv_tile_fn: PS 16 reads pixels of
 * an NCHW16c image); else packed, ap[p * MR + i]. Y16: the sums go to an
 * NCHW16c y at c (store16, ldc its block stride, res and ops its chain),
 * not to the tile C; with TB_ACCUMULATE added to the earlier K blocks' sums
 * already there. */
ALWAYS_INLINE void tile(const int MR, const int NV, const int IND,
                        const int SPLIT, const int PS, int64_t skip,
                        int64_t off, int64_t kc,
                        const float *restrict ap, const float *const *kp,
                        const float *restrict wp, int64_t wps,
                        float *restrict c, int64_t ldc, int nr, int flags,
                        const tb_chain *ch, int64_t ci, int64_t cj,
                        const int Y16, const float *res, int64_t ops16)
{
    __m512 acc0[X_MR], acc1[X_MR];
    const float *restrict w0 = wp;
    const float *restrict w1 = NV == 2 ? wp + wps : wp;
    const __mmask16 m0 = NV == 2 ? (__mmask16)0xFFFF : mask_n(nr);
    const __mmask16 m1 = NV == 2 ? mask_n(nr - 16) : (__mmask16)0;
    int64_t p;
    int i;

#pragma GCC unroll 16
    for (i = 0; i < MR; ++i) {
        acc0[i] = _mm512_setzero_ps();
        acc1[i] = _mm512_setzero_ps();
        /* C is only needed after the loop: fetch it meanwhile. */
        _mm_prefetch((const char *)(c + (Y16 ? i * 16 : i * ldc)), _MM_HINT_T0);
        if (NV == 2)
            _mm_prefetch((const char *)(c + (Y16 ? ldc + i * 16 : i * ldc + 16)),
                         _MM_HINT_T0);
    }
#pragma GCC unroll 4
    for (p = 0; p < kc; ++p) {
        const __m512 b0 = _mm512_loadu_ps(w0 + p * 16);
        const __m512 b1 = NV == 2 ? _mm512_loadu_ps(w1 + p * 16)
                                  : _mm512_setzero_ps();
        if (flags & TB_PREFETCH_W) {
            _mm_prefetch((const char *)(w0 + (p + X_PF) * 16), _MM_HINT_T0);
            if (NV == 2)
                _mm_prefetch((const char *)(w1 + (p + X_PF) * 16),
                             _MM_HINT_T0);
        }
        if (flags & TB_PREFETCH_NEXT) {
            _mm_prefetch((const char *)(w0 + NV * wps + p * 16), _MM_HINT_T1);
            if (NV == 2)
                _mm_prefetch((const char *)(w1 + NV * wps + p * 16),
                             _MM_HINT_T1);
        }
        const float *restrict ar = IND ? kp[p] + off * PS : ap + p * MR;
        const float *restrict ar2 = SPLIT > 0 ? ar + skip : ar;
        if (IND) {
            /* one register per row pointer, each row read at a constant
             * displacement from it (GCC otherwise keeps off + i for every
             * row i as a separate index, spilled to the stack) */
            __asm__("" : "+r"(ar));
            if (SPLIT > 0)
                __asm__("" : "+r"(ar2));
        }
#pragma GCC unroll 16
        for (i = 0; i < MR; ++i) {
            const __m512 x = _mm512_set1_ps(SPLIT > 0 && i >= SPLIT ? ar2[i]
                                                                : ar[i * PS]);
            acc0[i] = _mm512_fmadd_ps(x, b0, acc0[i]);
            if (NV == 2)
                acc1[i] = _mm512_fmadd_ps(x, b1, acc1[i]);
        }
    }
    if (Y16) {
        if (flags & TB_ACCUMULATE)
#pragma GCC unroll 16
            for (i = 0; i < MR; ++i) {
                acc0[i] = _mm512_add_ps(acc0[i], _mm512_loadu_ps(c + i * 16));
                if (NV == 2)
                    acc1[i] = _mm512_add_ps(acc1[i], _mm512_loadu_ps(c + ldc + i * 16));
            }
        store16(MR, NV, acc0, acc1, c, ldc, res, ops16);
        return;
    }
    if (flags & TB_ACCUMULATE) {
#pragma GCC unroll 16
        for (i = 0; i < MR; ++i) {
            acc0[i] = _mm512_add_ps(acc0[i], _mm512_maskz_loadu_ps(m0, c + i * ldc));
            if (NV == 2)
                acc1[i] = _mm512_add_ps(acc1[i],
                                        _mm512_maskz_loadu_ps(m1, c + i * ldc + 16));
        }
    }
    if ((flags & TB_LAST) && ch != NULL) {
        /* The chain's leading arithmetic operations on the accumulators
         * themselves (each column of registers on its own: the operations
         * are elementwise). */
        int64_t ops = lead_ops(MR, ch, acc0, MR, m0, ci, cj);
        if (NV == 2)
            lead_ops(MR, ch, acc1, MR, m1, ci, cj + 16);
        if (ops != 0) {
            /* From the first transcendental operation on: the tile's
             * registers through tb_chain_tile. */
            ch_vf t[2 * X_MR];
#pragma GCC unroll 16
            for (i = 0; i < MR; ++i) {
                t[i * NV] = (ch_vf)acc0[i];
                if (NV == 2)
                    t[i * NV + 1] = (ch_vf)acc1[i];
            }
            tb_chain_tile(ch, ops, t, MR, NV, ci, cj, nr, 0);
#pragma GCC unroll 16
            for (i = 0; i < MR; ++i) {
                acc0[i] = (__m512)t[i * NV];
                if (NV == 2)
                    acc1[i] = (__m512)t[i * NV + 1];
            }
        }
    }
#pragma GCC unroll 16
    for (i = 0; i < MR; ++i) {
        _mm512_mask_storeu_ps(c + i * ldc, m0, acc0[i]);
        if (NV == 2)
            _mm512_mask_storeu_ps(c + i * ldc + 16, m1, acc1[i]);
    }
}

typedef void (*tile_fn)(int64_t, const float *, const float *, int64_t,
                        float *, int64_t, int, int, const tb_chain *, int64_t,
                        int64_t);

/* ind (A's rows 1 float apart) and ind16 (16 apart: NCHW16c pixels) */
#define IND_FN(NAME, PS, MR, NV)                                              \
    static void NAME##_##MR##_##NV(int64_t kc, int64_t off,                   \
                                   const float *const *kp, const float *wp,   \
                                   int64_t wps, float *c, int64_t ldc, int nr,\
                                   int flags)                                 \
    {                                                                         \
        tile(MR, NV, 1, 0, PS, 0, off, kc, NULL, kp, wp, wps, c, ldc, nr,    \
             flags, NULL, 0, 0, 0, NULL, 0);                                  \
    }
/* ind storing into an NCHW16c y: indy (rows 1 float apart, tb_conv_tiley_fn)
 * and ind16y (16 apart, tb_conv_tile16y_fn) */
#define INDY_FN(NAME, PS, MR, NV)                                             \
    static void NAME##_##MR##_##NV(int64_t kc, int64_t off,                   \
                                   const float *const *kp, const float *wp,   \
                                   int64_t wps, float *y, const float *res,   \
                                   int64_t ldy, int flags, int64_t ops)       \
    {                                                                         \
        tile(MR, NV, 1, 0, PS, 0, off, kc, NULL, kp, wp, wps, y, ldy, NV * 16,\
             flags, NULL, 0, 0, 1, res, ops);                                 \
    }
#define TILE_FN(MR, NV)                                                       \
    static void tile_##MR##_##NV(int64_t kc, const float *ap,                 \
                                 const float *wp, int64_t wps, float *c,      \
                                 int64_t ldc, int nr, int flags,              \
                                 const tb_chain *ch, int64_t ci, int64_t cj)  \
    {                                                                         \
        tile(MR, NV, 0, 0, 1, 0, 0, kc, ap, NULL, wp, wps, c, ldc, nr,       \
             flags, ch, ci, cj, 0, NULL, 0);                                  \
    }                                                                         \
    IND_FN(ind, 1, MR, NV) IND_FN(ind16, 16, MR, NV)                          \
    INDY_FN(ind16y, 16, MR, NV) INDY_FN(indy, 1, MR, NV)
#define TILE_FNS(MR) TILE_FN(MR, 1) TILE_FN(MR, 2)
TILE_FNS(1) TILE_FNS(2) TILE_FNS(3) TILE_FNS(4) TILE_FNS(5) TILE_FNS(6)
TILE_FNS(7) TILE_FNS(8) TILE_FNS(9) TILE_FNS(10) TILE_FNS(11) TILE_FNS(12)
TILE_FNS(13) TILE_FNS(14)

/* The row counts' functions PREFIX_<rows>_NV from 1 row to 14 (every tile
 * height) or 13 (the split points), each table indexed by the row count. */
#define ROWS13(P, NV)                                                         \
    NULL, P##_1_##NV, P##_2_##NV, P##_3_##NV, P##_4_##NV, P##_5_##NV,          \
        P##_6_##NV, P##_7_##NV, P##_8_##NV, P##_9_##NV, P##_10_##NV,           \
        P##_11_##NV, P##_12_##NV, P##_13_##NV
#define BY_ROWS13(P, NV) {ROWS13(P, NV)}
#define BY_ROWS14(P, NV) {ROWS13(P, NV), P##_14_##NV}

static const tile_fn tiles[2][X_MR + 1] = {
    BY_ROWS14(tile, 1),
    BY_ROWS14(tile, 2),
};

typedef void (*ind_fn)(int64_t, int64_t, const float *const *,
                       const float *, int64_t, float *, int64_t, int, int);
static const ind_fn inds[2][X_MR + 1] = {
    BY_ROWS14(ind, 1),
    BY_ROWS14(ind, 2),
};
static const ind_fn inds16[2][X_MR + 1] = {
    BY_ROWS14(ind16, 1),
    BY_ROWS14(ind16, 2),
};

typedef void (*ind16y_fn)(int64_t, int64_t, const float *const *,
                          const float *, int64_t, float *, const float *,
                          int64_t, int, int64_t);
static const ind16y_fn inds16y[2][X_MR + 1] = {
    BY_ROWS14(ind16y, 1),
    BY_ROWS14(ind16y, 2),
};

static const ind16y_fn indys[2][X_MR + 1] = {
    BY_ROWS14(indy, 1),
    BY_ROWS14(indy, 2),
};

/* Full tiles whose rows span two output rows: rows >= S skip the virtual
 * row's padding (split: into C; splity: into an NCHW16c y). */
#define SPLITY_FN(S, NV)                                                      \
    static void splity_##S##_##NV(int64_t kc, int64_t off, int64_t skip,      \
                                  const float *const *kp, const float *wp,    \
                                  int64_t wps, float *y, const float *res,    \
                                  int64_t ldy, int flags, int64_t ops)        \
    {                                                                         \
        tile(X_MR, NV, 1, S, 1, skip, off, kc, NULL, kp, wp, wps, y, ldy,    \
             NV * 16, flags, NULL, 0, 0, 1, res, ops);                        \
    }
#define SPLIT_FN(S, NV)                                                       \
    static void split_##S##_##NV(int64_t kc, int64_t off, int64_t skip,       \
                                 const float *const *kp, const float *wp,     \
                                 int64_t wps, float *c, int64_t ldc, int nr,  \
                                 int flags)                                   \
    {                                                                         \
        tile(X_MR, NV, 1, S, 1, skip, off, kc, NULL, kp, wp, wps, c, ldc,    \
             nr, flags, NULL, 0, 0, 0, NULL, 0);                              \
    }
#define SPLIT_FNS(S) SPLIT_FN(S, 1) SPLIT_FN(S, 2) SPLITY_FN(S, 1) SPLITY_FN(S, 2)
SPLIT_FNS(1) SPLIT_FNS(2) SPLIT_FNS(3) SPLIT_FNS(4) SPLIT_FNS(5) SPLIT_FNS(6)
SPLIT_FNS(7) SPLIT_FNS(8) SPLIT_FNS(9) SPLIT_FNS(10) SPLIT_FNS(11)
SPLIT_FNS(12) SPLIT_FNS(13)

typedef void (*split_fn)(int64_t, int64_t, int64_t, const float *const *,
                         const float *, int64_t, float *, int64_t, int, int);
static const split_fn splits[2][X_MR] = {
    BY_ROWS13(split, 1),
    BY_ROWS13(split, 2),
};

typedef void (*splity_fn)(int64_t, int64_t, int64_t, const float *const *,
                          const float *, int64_t, float *, const float *,
                          int64_t, int, int64_t);
static const splity_fn splitys[2][X_MR] = {
    BY_ROWS13(splity, 1),
    BY_ROWS13(splity, 2),
};

static void conv_tile(int64_t kc, const float *const *kp, int64_t off,
                      const float *wp, int64_t wps, float *c, int64_t ldc,
                      int mr, int nr, int flags, int split, int64_t skip)
{
    if (split > 0 && split < mr && mr == X_MR)
        splits[nr > 16][split](kc, off, skip, kp, wp, wps, c, ldc, nr, flags);
    else if (split > 0 && split < mr) {
        inds[nr > 16][split](kc, off, kp, wp, wps, c, ldc, nr, flags);
        inds[nr > 16][mr - split](kc, off + skip + split, kp, wp, wps,
                                 c + split * ldc, ldc, nr, flags);
    } else
        inds[nr > 16][mr](kc, off, kp, wp, wps, c, ldc, nr, flags);
}

/* tb_conv_tile_fn over an NCHW16c image: row i of k step p at
 * kp[p][(off + i) * 16]; split is 0 (the rows are one run of pixels). */
static void conv_tile16(int64_t kc, const float *const *kp, int64_t off,
                        const float *wp, int64_t wps, float *c, int64_t ldc,
                        int mr, int nr, int flags, int split, int64_t skip)
{
    (void)split;
    (void)skip;
    inds16[nr > 16][mr](kc, off, kp, wp, wps, c, ldc, nr, flags);
}

static void ukernel(int64_t kc, const float *ap, const float *wp, int64_t wps,
                    float *c, int64_t ldc, int mr, int nr, int flags,
                    const tb_chain *ch, int64_t ci, int64_t cj)
{
    tiles[nr > 16][mr](kc, ap, wp, wps, c, ldc, nr, flags, ch, ci, cj);
}

/* ---- packing ---- */

/* rows x 16 block of a row-major matrix (rows <= 16, cols <= 16), zero
 * filled, transposed: r[j] holds column j. */
ALWAYS_INLINE void load_transposed(__m512 r[16], const float *src,
                                   int64_t ld, int64_t rows, int64_t cols)
{
    const __mmask16 mk = mask_n(cols);
    int i;
    for (i = 0; i < 16; ++i)
        r[i] = i < rows ? _mm512_maskz_loadu_ps(mk, src + i * ld)
                        : _mm512_setzero_ps();
    tb_transpose16(r);
}

/* Up to 16 rows x kc of a row-major matrix, k-major: dst[p * ds + i] =
 * src[i][p] for the lanes in keep (lanes past rows hold zeros). */
ALWAYS_INLINE void pack_kmajor(const float *src, int64_t ld, int64_t rows,
                               int64_t kc, float *restrict dst, int64_t ds,
                               __mmask16 keep)
{
    int64_t p0, j;
    for (p0 = 0; p0 < kc; p0 += 16) {
        const int64_t cols = min_i64(16, kc - p0);
        __m512 r[16];
        load_transposed(r, src + p0, ld, rows, cols);
        for (j = 0; j < cols; ++j)
            _mm512_mask_storeu_ps(dst + (p0 + j) * ds, keep, r[j]);
    }
}

static void pack_a(int64_t mr, int64_t kc, const float *restrict a,
                   int64_t lda, float *restrict ap)
{
    pack_kmajor(a, lda, mr, kc, ap, mr, mask_n(mr));
}

static void pack_w(tb_wlayout layout, int64_t kc, int64_t nc,
                   const float *restrict w, int64_t ldw, float *restrict dst,
                   int64_t dps)
{
    int64_t q, p;
    if (layout == TB_W_NT) {
        /* Whole 16-lane steps: the padding columns come out as zeros. */
        for (q = 0; q * 16 < nc; ++q)
            pack_kmajor(w + q * 16 * ldw, ldw, min_i64(16, nc - q * 16), kc,
                        dst + q * dps, 16, (__mmask16)0xFFFF);
    } else {
        /* Row by row, so that W is read sequentially. */
        for (p = 0; p < kc; ++p) {
            const float *src = w + p * ldw;
            for (q = 0; q * 16 < nc; ++q)
                _mm512_storeu_ps(
                    dst + q * dps + p * 16,
                    _mm512_maskz_loadu_ps(mask_n(nc - q * 16), src + q * 16));
        }
    }
}

/* conv_out's blocks: 16 columns at a time, through the transpose, then the
 * chain: with REGS its leading arithmetic in registers (lead_ops) and the
 * rest through tb_chain_tile, else all of it through tb_chain_tile. */
ALWAYS_INLINE void out_blocks(const int REGS, const float *ct, int64_t ldc,
                              int64_t m, int64_t n, float *y, int64_t ldy,
                              const tb_chain *ch, int64_t ci, int64_t cj)
{
    const __mmask16 mn = mask_n(n);
    int64_t o0;
    int j;
    for (o0 = 0; o0 < m; o0 += 16) {
        const int64_t cols = min_i64(16, m - o0);
        __m512 r[16];
        load_transposed(r, ct + o0, ldc, n, cols);
        if (ch != NULL) {
            const int64_t rest =
                REGS ? lead_ops(16, ch, r, (int)cols, mn, ci + o0, cj) : ch->ops;
            if (rest != 0 && REGS) {
                /* a copy: r itself stays in registers */
                ch_vf t[16];
#pragma GCC unroll 16
                for (j = 0; j < 16; ++j)
                    t[j] = (ch_vf)r[j];
                tb_chain_tile(ch, rest, t, (int)cols, 1, ci + o0, cj, n, 0);
#pragma GCC unroll 16
                for (j = 0; j < 16; ++j)
                    r[j] = (__m512)t[j];
            } else if (rest != 0) {
                tb_chain_tile(ch, rest, (ch_vf *)r, (int)cols, 1, ci + o0, cj, n, 0);
            }
        }
#pragma GCC unroll 16
        for (j = 0; j < 16; ++j)
            if (j < cols)
                _mm512_mask_storeu_ps(y + (o0 + j) * ldy, mn, r[j]);
    }
}

/* tb_conv_out_fn: the chain's leading arithmetic in registers (ResNet-18
 * spent about 5% of its time in tb_chain_tile's memory round trips here).
 * Except where the planes of y are a multiple of 4 KB apart (32 x 32
 * images): the 16 stores of a block then go to one L1 set, and stores back
 * to back stalled more than with tb_chain_tile's work between the blocks
 * (the small CNN's Winograd conv at batch 8: 410 us through tb_chain_tile,
 * 485 us in registers). */
static void conv_out(const float *ct, int64_t ldc, int64_t m, int64_t n,
                     float *y, int64_t ldy, const tb_chain *ch, int64_t ci,
                     int64_t cj)
{
    if (ldy % 1024 == 0)
        out_blocks(0, ct, ldc, m, n, y, ldy, ch, ci, cj);
    else
        out_blocks(1, ct, ldc, m, n, y, ldy, ch, ci, cj);
}

/* tb_conv_tile16y_fn */
static void conv_tile16y(int64_t kc, const float *const *kp, int64_t off,
                         const float *wp, int64_t wps, float *y,
                         const float *res, int64_t ldy, int mr, int nr,
                         int flags, int64_t ops)
{
    inds16y[nr > 16][mr](kc, off, kp, wp, wps, y, res, ldy, flags, ops);
}

/* tb_conv_tiley_fn (nr is 16 or 32) */
static void conv_tiley(int64_t kc, const float *const *kp, int64_t off,
                       const float *wp, int64_t wps, float *y, const float *res,
                       int64_t ldy, int mr, int nr, int flags, int64_t ops,
                       int split, int64_t skip)
{
    const int nv = nr > 16;
    if (split > 0 && split < mr && mr == X_MR)
        splitys[nv][split](kc, off, skip, kp, wp, wps, y, res, ldy, flags, ops);
    else if (split > 0 && split < mr) {
        indys[nv][split](kc, off, kp, wp, wps, y, res, ldy, flags, ops);
        indys[nv][mr - split](kc, off + skip + split, kp, wp, wps, y + split * 16,
                              res != NULL ? res + split * 16 : NULL, ldy, flags, ops);
    } else
        indys[nv][mr](kc, off, kp, wp, wps, y, res, ldy, flags, ops);
}

/* tb_conv_out16_fn: each pixel's 16 channels of a block are one vector of
 * the tile's row, stored whole (no transpose), with the chain's residual,
 * relu and relu6 in registers. */
static void conv_out16(const float *ct, int64_t ldc, int64_t m, int64_t n,
                       float *y, const float *res, int64_t ldy, int64_t ops)
{
    int64_t o0, t;
    for (o0 = 0; o0 < m; o0 += 16)
        for (t = 0; t < n; ++t)
            put16(y + o0 / 16 * ldy + t * 16, _mm512_loadu_ps(ct + t * ldc + o0),
                  res != NULL ? res + o0 / 16 * ldy + t * 16 : NULL, ops);
}

/* ---- few rows: matrix-vector like, streaming W once ---- */

/* nt: MM rows of A against JB rows of W, as dot products over all of K. */
ALWAYS_INLINE void dots(const int MM, const int JB, int64_t k,
                        const float *restrict a, int64_t lda,
                        const float *restrict w, int64_t ldw,
                        float *restrict c, int64_t ldc, const tb_chain *ch,
                        int64_t ci, int64_t cj)
{
    __m512 acc[4][8];
    int64_t p;
    int i, j;
    for (i = 0; i < MM; ++i)
        for (j = 0; j < JB; ++j)
            acc[i][j] = _mm512_setzero_ps();
    for (p = 0; p < k; p += 16) {
        const __mmask16 mk = mask_n(k - p);
        __m512 x[4];
        for (i = 0; i < MM; ++i)
            x[i] = _mm512_maskz_loadu_ps(mk, a + i * lda + p);
        for (j = 0; j < JB; ++j) {
            const __m512 y = _mm512_maskz_loadu_ps(mk, w + j * ldw + p);
            for (i = 0; i < MM; ++i)
                acc[i][j] = _mm512_fmadd_ps(x[i], y, acc[i][j]);
        }
    }
    {
        /* each row's JB outputs in one register, for the chain */
        ch_vf t[4];
        for (i = 0; i < MM; ++i) {
            t[i] = ch_splat(0.0f);
            for (j = 0; j < JB; ++j)
                t[i][j] = _mm512_reduce_add_ps(acc[i][j]);
        }
        if (ch != NULL)
            tb_chain_tile(ch, ch->ops, t, MM, 1, ci, cj, JB, 0);
        for (i = 0; i < MM; ++i)
            for (j = 0; j < JB; ++j)
                c[i * ldc + j] = t[i][j];
    }
}

/* nt, one row of A: the rows of W one after another, each a dot product
 * with four accumulators, so that W streams as one sequential read (what
 * the hardware prefetcher follows best) instead of JB rows at once. */
static void dots_stream(int64_t n, int64_t k, const float *restrict a,
                        const float *restrict w, int64_t ldw,
                        float *restrict c, const tb_chain *ch, int64_t ci,
                        int64_t cj)
{
    ch_vf out = ch_splat(0.0f); /* 16 outputs at a time, for the chain */
    int64_t j, p;
    for (j = 0; j < n; ++j) {
        const float *restrict wr = w + j * ldw;
        __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
        __m512 s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
        float v;
        for (p = 0; p + 64 <= k; p += 64) {
            s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + p), _mm512_loadu_ps(wr + p), s0);
            s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + p + 16),
                                 _mm512_loadu_ps(wr + p + 16), s1);
            s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + p + 32),
                                 _mm512_loadu_ps(wr + p + 32), s2);
            s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + p + 48),
                                 _mm512_loadu_ps(wr + p + 48), s3);
        }
        for (; p < k; p += 16) {
            const __mmask16 mk = mask_n(k - p);
            s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, a + p),
                                 _mm512_maskz_loadu_ps(mk, wr + p), s0);
        }
        v = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1),
                                               _mm512_add_ps(s2, s3)));
        out[j % 16] = v;
        if (j % 16 == 15 || j == n - 1) {
            const int64_t j0 = j / 16 * 16;
            const int lanes = (int)(j - j0 + 1);
            if (ch != NULL)
                tb_chain_tile(ch, ch->ops, &out, 1, 1, ci, cj + j0, lanes, 0);
            _mm512_mask_storeu_ps(c + j0, mask_n(lanes), (__m512)out);
        }
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
DOTS_FN(1, 8) DOTS_FN(2, 8) DOTS_FN(3, 4) DOTS_FN(4, 4)
DOTS_FN(1, 1) DOTS_FN(2, 1) DOTS_FN(3, 1) DOTS_FN(4, 1)

typedef void (*dots_fn)(int64_t, const float *, int64_t, const float *,
                        int64_t, float *, int64_t, const tb_chain *, int64_t,
                        int64_t);
static const dots_fn dots_wide[5] = {NULL, dots_1_8, dots_2_8, dots_3_4,
                                     dots_4_4};
static const dots_fn dots_one[5] = {NULL, dots_1_1, dots_2_1, dots_3_1,
                                    dots_4_1};

/* packed: MM rows against PB panels (16 columns each) over all of K. */
ALWAYS_INLINE void panels(const int MM, const int PB, int64_t k,
                          const float *restrict a, int64_t lda,
                          const float *restrict w, int64_t pstride,
                          float *restrict c, int64_t ldc, int64_t nb,
                          const tb_chain *ch, int64_t ci, int64_t cj)
{
    __m512 acc[4][8];
    int64_t p;
    int i, q;
    for (i = 0; i < MM; ++i)
        for (q = 0; q < PB; ++q)
            acc[i][q] = _mm512_setzero_ps();
    for (p = 0; p < k; ++p) {
        __m512 x[4];
        for (i = 0; i < MM; ++i)
            x[i] = _mm512_set1_ps(a[i * lda + p]);
        for (q = 0; q < PB; ++q) {
            const __m512 y = _mm512_loadu_ps(w + q * pstride + p * 16);
            for (i = 0; i < MM; ++i)
                acc[i][q] = _mm512_fmadd_ps(x[i], y, acc[i][q]);
        }
    }
    if (ch != NULL) {
        ch_vf t[4 * 8];
        for (i = 0; i < MM; ++i)
            for (q = 0; q < PB; ++q)
                t[i * PB + q] = (ch_vf)acc[i][q];
        tb_chain_tile(ch, ch->ops, t, MM, PB, ci, cj, nb, 0);
        for (i = 0; i < MM; ++i)
            for (q = 0; q < PB; ++q)
                acc[i][q] = (__m512)t[i * PB + q];
    }
    for (q = 0; q < PB; ++q) {
        const __mmask16 mk = mask_n(nb - q * 16);
        for (i = 0; i < MM; ++i)
            _mm512_mask_storeu_ps(c + i * ldc + q * 16, mk, acc[i][q]);
    }
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
PANELS_FN(1, 8) PANELS_FN(2, 8) PANELS_FN(3, 4) PANELS_FN(4, 4)
PANELS_FN(1, 1) PANELS_FN(2, 1) PANELS_FN(3, 1) PANELS_FN(4, 1)

typedef void (*panels_fn)(int64_t, const float *, int64_t, const float *,
                          int64_t, float *, int64_t, int64_t,
                          const tb_chain *, int64_t, int64_t);
static const panels_fn panels_wide[5] = {NULL, panels_1_8, panels_2_8,
                                         panels_3_4, panels_4_4};
static const panels_fn panels_one[5] = {NULL, panels_1_1, panels_2_1,
                                        panels_3_1, panels_4_1};

/* Columns of C kept in L1 while W rows stream past (nn). */
#define X_NN_CHUNK 1024

/* nn: rows of W stream through; C[0:mm, chunk] stays in L1 and takes four
 * rank-1 updates per pass (four W rows in flight). */
static void rows_nn(int64_t mm, int64_t n, int64_t k, const float *restrict a,
                    int64_t lda, const float *restrict w, int64_t ldw,
                    float *restrict c, int64_t ldc, const tb_chain *ch,
                    int64_t ci, int64_t cj)
{
    int64_t j0, j, p;
    int i;
    for (j0 = 0; j0 < n; j0 += X_NN_CHUNK) {
        const int64_t nb = min_i64(X_NN_CHUNK, n - j0);
        for (p = 0; p < k; p += 4) {
            const int64_t steps = min_i64(4, k - p);
            const float *restrict wr = w + p * ldw + j0;
            for (i = 0; i < mm; ++i) {
                const float *restrict x = a + i * lda + p;
                float *restrict row = c + i * ldc + j0;
                const __m512 x0 = _mm512_set1_ps(x[0]);
                const __m512 x1 = _mm512_set1_ps(steps > 1 ? x[1] : 0.0f);
                const __m512 x2 = _mm512_set1_ps(steps > 2 ? x[2] : 0.0f);
                const __m512 x3 = _mm512_set1_ps(steps > 3 ? x[3] : 0.0f);
                for (j = 0; j < nb; j += 16) {
                    const __mmask16 mk = mask_n(nb - j);
                    __m512 v = p == 0 ? _mm512_setzero_ps()
                                      : _mm512_maskz_loadu_ps(mk, row + j);
                    v = _mm512_fmadd_ps(
                        x0, _mm512_maskz_loadu_ps(mk, wr + j), v);
                    if (steps == 4) {
                        v = _mm512_fmadd_ps(
                            x1, _mm512_maskz_loadu_ps(mk, wr + ldw + j), v);
                        v = _mm512_fmadd_ps(
                            x2, _mm512_maskz_loadu_ps(mk, wr + 2 * ldw + j), v);
                        v = _mm512_fmadd_ps(
                            x3, _mm512_maskz_loadu_ps(mk, wr + 3 * ldw + j), v);
                    } else {
                        if (steps > 1)
                            v = _mm512_fmadd_ps(
                                x1, _mm512_maskz_loadu_ps(mk, wr + ldw + j), v);
                        if (steps > 2)
                            v = _mm512_fmadd_ps(
                                x2,
                                _mm512_maskz_loadu_ps(mk, wr + 2 * ldw + j), v);
                    }
                    _mm512_mask_storeu_ps(row + j, mk, v);
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
        if (layout == TB_W_NT && mm == 1) {
            dots_stream(n, k, ai, w, ldw, c_i, ch, ci + i0, cj);
        } else if (layout == TB_W_NT) {
            const int jb = mm <= 2 ? 8 : 4;
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
            const int pb = mm <= 2 ? 8 : 4;
            for (j = 0; j + pb * 16 <= n; j += pb * 16)
                panels_wide[mm](k, ai, lda, w + (j / 16) * ldw, ldw, c_i + j,
                                ldc, pb * 16, ch, ci + i0, cj + j);
            for (; j < n; j += 16)
                panels_one[mm](k, ai, lda, w + (j / 16) * ldw, ldw, c_i + j,
                               ldc, n - j, ch, ci + i0, cj + j);
        }
    }
}

/* KC = 512: the 14 x 512 A panel (28 KiB) stays in the 48 KiB L1d;
 * NC = 512: the 512 x 512 W block (1 MiB) stays in the 2 MiB L2. */
#define ISA_KC 528
#define ISA_NC 512

/* ---- nt with the rows of C along the vectors: W read in place ---- */

/*
 * For "nt" with a few dozen rows, packing W (a transpose) costs about as
 * much as the product. Here A is packed transposed instead (X_DV * 16 rows
 * at a time, ap[p * 16V + i] = A[i][p]) and W is read where it is: a tile
 * of X_DV vectors of 16 rows x X_DJ columns takes, per k step, X_DV loads
 * of A and one broadcast from each of X_DJ rows of W for 24 FMAs.
 *
 * Each output is summed over the same K blocks as the blocked path
 * (tb_kblocks with ISA_KC), one FMA chain per block, the blocks
 * then added in order, then the chain: bit-identical to the packed-W path.
 */
#define X_DV 4
#define X_DJ 6

ALWAYS_INLINE void dtile(const int V, int64_t k, int64_t kblocks,
                         const float *restrict ap, const float *restrict w,
                         int64_t ldw, int jn, int mv, float *restrict c,
                         int64_t ldc, const tb_chain *ch, int64_t ci,
                         int64_t cj)
{
    __m512 acc[X_DV][X_DJ];
    const float *restrict wr[X_DJ];
    /* Sums of the finished K blocks; at the end, the finished outputs. */
    float tot[X_DJ][16 * X_DV] __attribute__((aligned(64)));
    int64_t kb, p;
    int v, j, i;
    for (j = 0; j < X_DJ; ++j)
        /* Past the last column, repeat it (computed, never stored). */
        wr[j] = w + (j < jn ? j : jn - 1) * ldw;
    for (kb = 0; kb < kblocks; ++kb) {
        const int64_t p1 = tb_kblock_start(k, kblocks, kb + 1);
        for (j = 0; j < X_DJ; ++j)
            for (v = 0; v < V; ++v)
                acc[v][j] = _mm512_setzero_ps();
        for (p = tb_kblock_start(k, kblocks, kb); p < p1; ++p) {
            __m512 x[X_DV];
            for (v = 0; v < V; ++v)
                x[v] = _mm512_load_ps(ap + p * 16 * V + 16 * v);
            for (j = 0; j < X_DJ; ++j) {
                const __m512 y = _mm512_set1_ps(wr[j][p]);
                for (v = 0; v < V; ++v)
                    acc[v][j] = _mm512_fmadd_ps(x[v], y, acc[v][j]);
            }
        }
        for (j = 0; j < X_DJ; ++j)
            for (v = 0; v < V; ++v) {
                __m512 r = acc[v][j];
                if (kb > 0)
                    r = _mm512_add_ps(r, _mm512_load_ps(&tot[j][16 * v]));
                _mm512_store_ps(&tot[j][16 * v], r);
            }
    }
    /* The chain on the tile, whose registers run down C's columns (GCC's
     * vector types alias their element type). */
    if (ch != NULL)
        tb_chain_tile(ch, ch->ops, (ch_vf *)tot, jn, X_DV, ci, cj, mv, 1);
    for (i = 0; i < mv; ++i)
        for (j = 0; j < jn; ++j)
            c[i * ldc + j] = tot[j][i];
}

#define DTILE_FN(V)                                                           \
    static void dtile_##V(int64_t k, int64_t kblocks, const float *ap,        \
                          const float *w, int64_t ldw, int jn, int mv,        \
                          float *c, int64_t ldc, const tb_chain *ch,          \
                          int64_t ci, int64_t cj)                             \
    {                                                                         \
        dtile(V, k, kblocks, ap, w, ldw, jn, mv, c, ldc, ch, ci, cj);         \
    }
DTILE_FN(1) DTILE_FN(2) DTILE_FN(3) DTILE_FN(4)

typedef void (*dtile_fn)(int64_t, int64_t, const float *, const float *,
                         int64_t, int, int, float *, int64_t,
                         const tb_chain *, int64_t, int64_t);
static const dtile_fn dtiles[X_DV + 1] = {NULL, dtile_1, dtile_2, dtile_3,
                                          dtile_4};

static void nt_direct(int64_t m, int64_t n, int64_t k, const float *a,
                      int64_t lda, const float *w, int64_t ldw, float *c,
                      int64_t ldc, const tb_chain *ch, int64_t ci, int64_t cj,
                      float *ap)
{
    const int64_t kblocks = tb_kblocks(k, ISA_KC);
    int64_t i0, j;
    for (i0 = 0; i0 < m; i0 += 16 * X_DV) {
        const int mv = (int)min_i64(16 * X_DV, m - i0);
        const int V = (mv + 15) / 16;
        int v;
        /* Rows past mv come out as zeros. */
        for (v = 0; v < V; ++v)
            pack_kmajor(a + (i0 + 16 * v) * lda, lda, min_i64(16, mv - 16 * v),
                        k, ap + 16 * v, 16 * V, (__mmask16)0xFFFF);
        for (j = 0; j < n; j += X_DJ)
            dtiles[V](k, kblocks, ap, w + j * ldw, ldw,
                      (int)min_i64(X_DJ, n - j), mv, c + i0 * ldc + j, ldc,
                      ch, ci + i0, cj + j);
    }
}

/* The scratch buffer (threads.c) is sized for the largest blocks. */
typedef char check_blocks[ISA_KC <= TB_KC_MAX && ISA_NC <= TB_NC_MAX &&
                                  X_MR <= TB_MR_MAX
                              ? 1
                              : -1];

/* ---- the convolution's implicit im2col (conv_gather.h) ---- */

#define TB_CG_OWN_LOADS 1

/* The even lanes of the 32 floats in (a, b): a[0], a[2], ..., b[14]. */
static inline __m512 even_lanes(__m512 a, __m512 b)
{
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18,
                                           20, 22, 24, 26, 28, 30);
    return _mm512_permutex2var_ps(a, even, b);
}

static inline void cg_run(float *d, const float *row, int64_t iw, int64_t sw,
                          int64_t w, int t0, int len)
{
    /* lanes [t0 + lo, t0 + hi) hold columns inside [0, w) */
    const __mmask16 run = (__mmask16)(((1u << len) - 1u) << t0);
    int64_t lo, hi;
    __m512 v = _mm512_setzero_ps();
    tb_cg_inside(row, iw, sw, w, len, &lo, &hi);
    if (hi > lo) {
        const __mmask16 in = (__mmask16)((((1u << (hi - lo)) - 1u)
                                          << (t0 + lo)));
        const float *first = row + iw + lo * sw;
        if (sw == 1) {
            /* one masked load straight into the lanes: lane t reads
             * first[t - t0 - lo]. The base address lies up to 15 floats
             * before first, so it is formed as an integer; only the lanes
             * in `in` are read, all of them inside the row. */
            const uintptr_t base = (uintptr_t)first - (uintptr_t)(t0 + lo) * sizeof(float);
            v = _mm512_maskz_loadu_ps(in, (const void *)base);
        } else if (sw == 2) {
            /* lane t reads element 2 t from base (2 (t0 + lo) floats before
             * first, an integer as above): the elements from the first lane's
             * to the last's, in two masked loads, then the even ones */
            const uintptr_t base =
                (uintptr_t)first - (uintptr_t)(2 * (t0 + lo)) * sizeof(float);
            const int j0 = 2 * (int)(t0 + lo), span = 2 * (int)(hi - lo) - 1;
            const uint32_t need = ((1u << span) - 1u) << j0; /* span <= 31 */
            const __m512 a = _mm512_maskz_loadu_ps((__mmask16)(need & 0xFFFFu),
                                                   (const void *)base);
            const __m512 b = _mm512_maskz_loadu_ps((__mmask16)(need >> 16),
                                                   (const void *)(base + 16 * sizeof(float)));
            v = _mm512_maskz_mov_ps(in, even_lanes(a, b));
        } else {
            const __m512i idx = _mm512_mullo_epi32(
                _mm512_sub_epi32(
                    _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                      12, 13, 14, 15),
                    _mm512_set1_epi32((int)(t0 + lo))),
                _mm512_set1_epi32((int)sw));
            v = _mm512_mask_i32gather_ps(v, in, idx, first, 4);
        }
    }
    _mm512_mask_storeu_ps(d, run, v);
}

static inline void cg_copy16(float *d, const float *src)
{
    _mm512_storeu_ps(d, _mm512_loadu_ps(src));
}

/* the even lanes of src[0:31]: two loads and a permute, not a gather */
static inline void cg_copy16_s2(float *d, const float *src)
{
    const __m512 lo = _mm512_loadu_ps(src);
    const __m512 hi = _mm512_maskz_loadu_ps((__mmask16)0x7FFF, src + 16);
    _mm512_storeu_ps(d, even_lanes(lo, hi));
}

#include "conv_gather.h"

/* tb_strided_copy_fn: 16 floats a step, the last step masked (a row of a
 * phase plane is a few dozen floats: SSE2 loops took about a twentieth of
 * a ResNet's time) */
static void strided_copy(float *d, const float *s, int64_t n, int64_t sw)
{
    int64_t t;
    for (t = 0; t < n; t += 16) {
        const int64_t left = n - t;
        const __mmask16 m = mask_n(left);
        if (sw == 1) {
            _mm512_mask_storeu_ps(d + t, m, _mm512_maskz_loadu_ps(m, s + t));
        } else {
            /* s[2 t], ..., s[2 t + 2 (left - 1)]: 2 left - 1 floats at most */
            const __m512 lo = _mm512_maskz_loadu_ps(mask_n(2 * left - 1), s + 2 * t);
            const __m512 hi = _mm512_maskz_loadu_ps(
                left > 8 ? mask_n(2 * left - 17) : (__mmask16)0, s + 2 * t + 16);
            _mm512_mask_storeu_ps(d + t, m, even_lanes(lo, hi));
        }
    }
}

/* the Winograd transform's edge loads and stores: one masked instruction */
#define TB_WG_OWN_LOADS 1
static inline ch_vf wg_load_part(const float *row, int64_t col, int64_t w)
{
    const int64_t lo = col < 0 ? -col : 0, hi = w - col;
    if (lo >= 16 || hi <= 0)
        return (ch_vf)_mm512_setzero_ps();
    return (ch_vf)_mm512_maskz_loadu_ps(mask_n(hi) & (__mmask16)~mask_n(lo),
                                        row + col);
}

static inline void wg_store_part(float *d, ch_vf v, int64_t n)
{
    _mm512_mask_storeu_ps(d, mask_n(n), (__m512)v);
}

/* rows of n lanes, one lane apart: one compress, one masked store */
static inline void wg_store_rows(float *d, ch_vf v, int rows, int64_t n)
{
    unsigned keep = 0;
    int r;
    for (r = 0; r < rows; ++r)
        keep |= ((1u << n) - 1u) << (r * (n + 1));
    _mm512_mask_storeu_ps(d, mask_n(rows * n),
                          _mm512_maskz_compress_ps((__mmask16)keep, (__m512)v));
}

#include "conv_winograd.h"

const tb_isa tb_isa_avx512 = {
    "avx512", X_MR, X_NR, ISA_KC, ISA_NC, ukernel, pack_a, pack_w, small_cols,
    nt_direct, X_DJ, 16 * X_DV, TB_DIRECT_M_PER_LANE * 16,
    tb_chain_block, tb_unary_row, tb_softmax_row, tb_attn_row, tb_conv_gather,
    conv_tile, conv_out, tb_wino_in, tb_wino_out, conv_tile16, conv_out16,
    conv_tile16y, conv_tiley, strided_copy, tb_unblock16_avx2, 256, 1,
};
#endif /* TIRBYOC_NO_AVX512 */
