/*
 * depthwise_f32.c - depthwise 2-D convolution, float32, NCHW
 * (tirbyoc_depthwise_conv2d_f32): one KH x KW filter per channel,
 *
 *     y[n][c][i][j] = chain( sum over r < KH, s < KW of
 *                     x[n][c][i * sh + r * dh - pt][j * sw + s * dw - pl]
 *                     * weight[c][0][r][s] )
 *
 * Each output is
 *
 *     x_0 * w_0, then + x_t * w_t for t = 1 .. KH * KW - 1 in (r, s) order
 *
 * (an FMA per tap on AVX2 and AVX-512, a multiply and an add in the
 * portable code; the padding's zeros are multiplied too, as in the conv
 * kernel), then + bias, then the chain's leading residual / relu / relu6
 * operations in registers before the one store; any other operation (and
 * what follows it) goes over the stored rows through the ISA's chain
 * (tb_chain_block), with the same float32 operations. All three paths
 * below compute every output that way, whatever unit, lane or thread it
 * falls in: they give the same bits, and results do not depend on the
 * thread count.
 *
 * Phase planes (every ISA). A unit is (image, channel or group of channels
 * of small planes, block of output rows). For each channel it copies the
 * input rows the block reads, zero padded, into phase planes in the running
 * thread's scratch (the window): plane (a, b) holds element [u][v] =
 * x[(i0 + u) * sh + a - pt][v * sw + b - pl] for the residues a of
 * r * dh mod sh and b of s * dw mod sw that taps reach, so every tap reads
 * consecutive floats (stride 2: four planes, the even and odd columns of
 * the even and odd rows, split with a permute per 16). With plane rows of
 * wq >= OW + (KW - 1) * dw / sw floats, output pixel (i, j) of the block is
 * "virtual" pixel q = i * wq + j, and tap (r, s) of it sits at q plus
 * (r * dh / sh) * wq + s * dw / sw in its plane: a fixed offset per tap. The
 * sums run over the block's virtual pixels as one long row, 8 vector
 * registers at a time (6 on AVX2), whatever the image's width (a 7 x 7
 * output is 61 virtual pixels, not 7 rows of one partly empty vector);
 * virtual pixels past OW are computed and not stored (each vector is
 * stored as the runs of lanes that land on output rows, a table built once
 * per call). On AVX-512, square 3x3, 5x5 and 7x7 filters at stride 1 or 2
 * without dilation have rows of a multiple of 16 floats (when that pads a
 * row by less than a third): each plane row is then loaded once per block
 * with aligned loads, and the taps to its right are taken from pairs of
 * registers (valignd) instead of unaligned loads that cross cache lines.
 *
 * Channels in lanes (AVX2 and AVX-512; depthwise_c16.h, written once for
 * both): a unit is 16 channels (the last block partial) of a block of
 * output rows. The input rows are transposed, 16 pixels at a time, into a
 * window of pixels of 16 channels, the taps are vector loads at any stride
 * or dilation, 8 output pixels (4 on AVX2) are as many FMA chains with the
 * 16 channels' weights of a tap in one vector (a register on AVX-512, a
 * pair on AVX2), and the sums are transposed back into the channels' rows
 * as they are stored. Taken where the planes do worse (measured): for 8
 * channels or more at a stride of 2 or more and on output rows of fewer
 * than 40 pixels, and for whole blocks of 16 channels on rows of up to 112.
 *
 * Scalar: where no window fits in the scratch even for one output row (a
 * dilation or a padding of hundreds of thousands, a filter of tens of
 * thousands of taps), x is read in place, one output at a time.
 *
 * TIRBYOC_DW_PATH=planes, channels or scalar takes that path wherever it can
 * run (the tests); unset, the call chooses. AVX2 and AVX-512 code is
 * compiled here for its instruction set through target pragmas
 * (push_options / pop_options regions); the call chooses by
 * tb_active_isa(), which only reports an instruction set the CPU and OS
 * support.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>

#include "dense_f32_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DW_X86 1
#endif

#define DW_INLINE static inline __attribute__((always_inline))

/* Sizes above this are refused (keeps every index computation in range). */
#define DW_DIM_MAX ((int64_t)1 << 31)
/* Below this many flops a call stays on the calling thread. */
#define DW_PAR_FLOPS (128.0 * 1024)
/* A unit's window: about the L1d's size (8192 floats in 32 KiB), within
 * these bounds (dw_window_floats). */
#define DW_WINDOW_MIN 4096
#define DW_WINDOW_MAX 16384
/* Units per thread wanted before planes are split into more row blocks. */
#define DW_UNITS_PER_THREAD 4
/* Outputs a unit of small planes computes at least (channels are grouped). */
#define DW_UNIT_OUTPUTS 2048
/* Floats after a plane's rows (zeros): the last vectors of a block read up
 * to 32 floats past its rows, and a row's fill writes up to 15 past it. */
#define DW_SLACK 32
/* Planes filled in one pass over the image rows. */
#define DW_FILL_PLANES 8
/* Floats ahead that the channels-in-lanes fill prefetches in each channel. */
#define DW_C16_AHEAD 64

/* A run of lanes [lo, hi) of one vector of virtual pixels that lands on
 * one output row: lane l is output off + l of the unit. */
typedef struct {
    int64_t off;
    int32_t lo, hi;
} dw_seg;

typedef struct {
    const tb_isa *isa;
    int64_t batch, c, h, w, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow;
    const float *x, *wt, *bias, *residual;
    float *y;
    int64_t ntaps;
    int has_bias;
    int npre;              /* chain operations after the bias done in registers */
    unsigned char pre[16]; /* RESIDUAL, RELU or RELU6 */
    int64_t rest;          /* the chain's operations after those (tb_chain_block) */
    int uses_residual;
    /* the window */
    int fallback;       /* no window: the scalar path reads x in place */
    int aligned;        /* the AVX-512 aligned path (K = kh = kw, S = sh = sw) */
    int64_t pa, pb;     /* periods of r * dh mod sh and s * dw mod sw */
    int64_t na, nb;     /* phase planes along each */
    int64_t hr, wr;     /* rows and columns a plane holds past the block's */
    int64_t wq;         /* a plane's row: OW + wr or more */
    int64_t rows, nrb;  /* output rows per unit, units per plane */
    int64_t group, ngroups; /* channels per unit, groups per image */
    int64_t nwin;       /* windows filled before their sums (small planes) */
    int lanes;          /* of the ISA's vectors (1: the portable code) */
    /* the channels-in-lanes path (AVX2, AVX-512): units of 16 channels */
    int c16;
    int64_t vw;         /* window columns: (OW - 1) * sw + (KW - 1) * dw + 1 */
    int64_t nblk;       /* blocks of 16 channels */
    int64_t c16_rp, c16_wts, c16_tb; /* offsets in the scratch of the tap
                                        rows, the weights, the sums */
    int c16_npre;       /* pre[] operations before the first residual (all of
                           them with a blocked y) */
    int xb, yb;         /* x, y (and the residual) are NCHW16c */
    /* the runs of lanes of a block of `rows` rows ([0]) and of the last,
     * shorter one ([1]), built once per call */
    const dw_seg *seg[2];
    const int32_t *seg0[2];
    int64_t ps;         /* floats per phase plane */
    int64_t units;
} dw_job;

/* What the vector code computes for one unit. */
typedef struct {
    const float *const *tp; /* per tap, virtual pixel 0 in its plane */
    const float *wt;        /* the channel's KH * KW weights */
    int64_t ntaps;
    int64_t nq;             /* virtual pixels: (rows - 1) * wq + OW */
    int64_t wq, ow, rows;
    const float *win;       /* the planes (ps floats each, nb per row phase) */
    int64_t woff;           /* this channel's window: win + woff (the tap
                               pointers are for woff = 0) */
    const dw_seg *seg;      /* vector k's runs: seg[seg0[k] .. seg0[k + 1]) */
    const int32_t *seg0;
    int64_t ps, nb;
    int al_k, al_s;         /* the aligned path's filter and stride, or 0 */
    float *y;               /* output row 0 of the unit */
    const float *res;       /* residual at output row 0, or NULL */
    float bias;
    int has_bias, npre;
    const unsigned char *pre;
} dw_span;

/* One plane to fill, rows u < rin of wq floats at d0 + u * wq: with src
 * the image row ih = ih0 + u * sh (NULL when ih is outside [0, h) or the
 * image is empty), d0[v] = src[v * sw + off] for v in [lo, hi), 0
 * elsewhere in [0, wq); with d1 (sw == 2 only), the same for plane d1 with
 * d1[v] = src[2v + off + 1] for v in [lo1, hi1). The vector versions may
 * write up to 15 floats past a row (the next row, or the plane's slack,
 * is written after it). */
typedef struct {
    const float *img;
    int64_t ih0, sh, h, rin;
    int64_t off, sw, w, wq, lo, hi, lo1, hi1;
} dw_row;

static int64_t min_i64(int64_t x, int64_t y) { return x < y ? x : y; }
static int64_t max_i64(int64_t x, int64_t y) { return x > y ? x : y; }
static int64_t cdiv(int64_t x, int64_t y) { return (x + y - 1) / y; }

/* The window's size above, in floats. */
static int64_t dw_window_floats(void)
{
    return min_i64(DW_WINDOW_MAX,
                   max_i64(DW_WINDOW_MIN, tb_cache_sizes()->l1_bytes / (int64_t)sizeof(float)));
}

static int64_t gcd_i64(int64_t x, int64_t y)
{
    while (y != 0) {
        const int64_t t = x % y;
        x = y;
        y = t;
    }
    return x;
}

/* v (one output, or a vector of outputs) through the bias and the
 * in-register operations s->pre[0 .. s->npre), the same steps on every ISA:
 * ADD(a, b), SPLAT(f) (f in every lane), RES (the residual at v's outputs),
 * MAX0(v) = max(0, v) and MIN6(v) = min(6, v), NaN passing both (as the
 * vector max and min with the constant first). */
#define DW_PRE_OPS(s, v, ADD, SPLAT, RES, MAX0, MIN6)                        \
    do {                                                                     \
        int o_;                                                              \
        if ((s)->has_bias)                                                   \
            v = ADD(v, SPLAT((s)->bias));                                    \
        for (o_ = 0; o_ < (s)->npre; ++o_) {                                 \
            switch ((s)->pre[o_]) {                                          \
            case TIRBYOC_EPI_RESIDUAL:                                       \
                v = ADD(v, RES);                                             \
                break;                                                       \
            case TIRBYOC_EPI_RELU:                                           \
                v = MAX0(v);                                                 \
                break;                                                       \
            default: /* RELU6 */                                             \
                v = MIN6(MAX0(v));                                           \
                break;                                                       \
            }                                                                \
        }                                                                    \
    } while (0)

DW_INLINE float add_f(float a, float b) { return a + b; }
DW_INLINE float splat_f(float v) { return v; }
DW_INLINE float max0_f(float v) { return 0.0f > v ? 0.0f : v; }
DW_INLINE float min6_f(float v) { return 6.0f < v ? 6.0f : v; }

/* A scalar output through the in-register operations (the same values as the
 * vector code's lanes: max(0, v) is (0 > v ? 0 : v), NaN and -0.0 pass). */
DW_INLINE float pre_ops(const dw_span *s, float v, int64_t idx)
{
    DW_PRE_OPS(s, v, add_f, splat_f, s->res[idx], max0_f, min6_f);
    return v;
}

/* Stores vector v, vector k of the unit's virtual pixels (L lanes), through
 * PRE(s, v, off, mask) (the in-register operations), one run of lanes per
 * output row it reaches: STOREU where the run is the whole vector (mask
 * ALL), else STOREM through MASK(lo, hi), the lanes [lo, hi) as a mask of
 * type MT. */
#define DW_PUT(s, v, k, L, PRE, MT, ALL, MASK, STOREU, STOREM)               \
    do {                                                                     \
        int32_t g_;                                                          \
        for (g_ = (s)->seg0[k]; g_ < (s)->seg0[(k) + 1]; ++g_) {             \
            const dw_seg *sg_ = (s)->seg + g_;                               \
            if (sg_->hi - sg_->lo == (L)) {                                  \
                STOREU((s)->y + sg_->off, PRE(s, v, sg_->off, ALL));         \
            } else {                                                         \
                const MT m_ = MASK(sg_->lo, sg_->hi);                        \
                STOREM((s)->y + sg_->off, m_, PRE(s, v, sg_->off, m_));      \
            }                                                                \
        }                                                                    \
    } while (0)

/* The chain's operations after the in-register ones (j->rest, if any) over
 * the n outputs from y + at on (and the residual's at the same offsets),
 * through the ISA's chain as one row: they are elementwise (residual and
 * unary operations; the bias is a sum term), so whole vectors run over
 * several output rows, or planes, at once (row by row, a 7 x 7 plane's
 * SiLU took seven partly filled vectors, gathered and stored lane by lane). */
static void chain_flat(const dw_job *j, int64_t at, int64_t n)
{
    tb_chain ch;
    if (j->rest == 0 || n <= 0)
        return;
    ch.ops = j->rest;
    ch.scale = 1.0f;
    ch.bias = NULL;
    ch.residual = j->uses_residual ? j->residual + at : NULL;
    ch.ldr = n;
    j->isa->chain(&ch, j->y + at, n, 1, n, 0, 0);
}

/* chain_flat over output rows [i0, i0 + rows) of the image plane at
 * y + plane. */
static void chain_rest(const dw_job *j, int64_t plane, int64_t i0, int64_t rows)
{
    chain_flat(j, plane + i0 * j->ow, rows * j->ow);
}

/* ---- portable code ---- */

#define DW_GEN_BLOCK 64

static void span_generic(const dw_span *s)
{
    float acc[DW_GEN_BLOCK];
    int64_t q, r = 0, c = 0, t;
    int l;
    for (q = 0; q < s->nq; q += DW_GEN_BLOCK) {
        const int n = (int)min_i64(DW_GEN_BLOCK, s->nq - q);
        const float *p = s->tp[0] + s->woff + q;
        const float w0 = s->wt[0];
        for (l = 0; l < n; ++l)
            acc[l] = p[l] * w0;
        for (t = 1; t < s->ntaps; ++t) {
            const float wt = s->wt[t];
            p = s->tp[t] + s->woff + q;
            for (l = 0; l < n; ++l)
                acc[l] = acc[l] + p[l] * wt;
        }
        for (l = 0; l < n; ++l) {
            if (c < s->ow) {
                const int64_t idx = r * s->ow + c;
                s->y[idx] = pre_ops(s, acc[l], idx);
            }
            if (++c == s->wq) {
                c = 0;
                ++r;
            }
        }
    }
}

/* d[v] for v in [0, wq): src[v * sw + off] inside [lo, hi), else 0. */
static void row_part(float *d, const float *src, int64_t off, int64_t sw,
                     int64_t lo, int64_t hi, int64_t wq)
{
    int64_t v;
    if (src == NULL)
        lo = hi = 0;
    for (v = 0; v < lo; ++v)
        d[v] = 0.0f;
    if (sw == 1)
        for (v = lo; v < hi; ++v)
            d[v] = src[v + off];
    else
        for (v = lo; v < hi; ++v)
            d[v] = src[v * sw + off];
    for (v = hi > lo ? hi : lo; v < wq; ++v)
        d[v] = 0.0f;
}

/* The image row of plane row u, or NULL (zeros). */
DW_INLINE const float *row_src(const dw_row *rw, int64_t u)
{
    const int64_t ih = rw->ih0 + u * rw->sh;
    return rw->img == NULL || ih < 0 || ih >= rw->h ? NULL : rw->img + ih * rw->w;
}

static void row_generic(const dw_row *rw, float *d0, float *d1, const float *src)
{
    row_part(d0, src, rw->off, rw->sw, rw->lo, rw->hi, rw->wq);
    if (d1 != NULL)
        row_part(d1, src, rw->off + 1, 2, rw->lo1, rw->hi1, rw->wq);
}

/* The rows a vector fill of L lanes leaves to this: zeros where the image row
 * is outside the image (src NULL), L floats at a time (a vector store each
 * on the caller's ISA; up to L - 1 past the row), and strides above 2 (the
 * portable code). Returns whether it filled the row. */
DW_INLINE int row_common(const int L, const dw_row *rw, float *d0, float *d1,
                         const float *src)
{
    int64_t v;
    if (src == NULL) {
        for (v = 0; v < rw->wq; v += L) {
            __builtin_memset(d0 + v, 0, (size_t)L * sizeof(float));
            if (d1 != NULL)
                __builtin_memset(d1 + v, 0, (size_t)L * sizeof(float));
        }
        return 1;
    }
    if (rw->sw > 2) {
        row_generic(rw, d0, d1, src);
        return 1;
    }
    return 0;
}

/* A plane fill (dw_plane_fn) NAME over the row fill ROW(rw, d0, d1, src):
 * planes k < np, row by row, the image rows in order. */
#define DW_PLANE_FN(NAME, ROW)                                               \
    static void NAME(const dw_row *rw, int np, float *const *d0,             \
                     float *const *d1)                                       \
    {                                                                        \
        int64_t u;                                                           \
        int k;                                                               \
        for (u = 0; u < rw->rin; ++u)                                        \
            for (k = 0; k < np; ++k)                                         \
                ROW(rw + k, d0[k] + u * rw->wq,                              \
                    d1[k] != NULL ? d1[k] + u * rw->wq : NULL,               \
                    row_src(rw + k, u));                                     \
    }

DW_PLANE_FN(plane_generic, row_generic)

typedef void (*dw_span_fn)(const dw_span *s);
/* Fills planes k < np (rw[k], d0[k], d1[k]), image rows in order. */
typedef void (*dw_plane_fn)(const dw_row *rw, int np, float *const *d0,
                            float *const *d1);

/* The scalar path: outputs of rows [i0, i1) of plane (n, ch), x read in
 * place, the taps' products added in the vector code's order (FMA: as one
 * fused operation, as the AVX2 and AVX-512 code does). */
DW_INLINE void fallback_rows(const int FMA, const dw_job *j, const dw_span *s,
                             int64_t n, int64_t ch, int64_t i0, int64_t i1)
{
    const int64_t hw = j->h * j->w;
    const float *img = hw > 0 ? j->x + (n * j->c + ch) * hw : NULL;
    int64_t i, q, r, e;
    for (i = i0; i < i1; ++i)
        for (q = 0; q < j->ow; ++q) {
            float acc = 0.0f;
            for (r = 0; r < j->kh; ++r) {
                const int64_t ih = i * j->sh + r * j->dh - j->pt;
                for (e = 0; e < j->kw; ++e) {
                    const int64_t iw = q * j->sw + e * j->dw - j->pl;
                    const float xv = ih >= 0 && ih < j->h && iw >= 0 && iw < j->w
                                         ? img[ih * j->w + iw]
                                         : 0.0f;
                    const float wv = s->wt[r * j->kw + e];
                    if (r == 0 && e == 0)
                        acc = xv * wv;
                    else if (FMA)
                        acc = __builtin_fmaf(xv, wv, acc);
                    else
                        acc = acc + xv * wv;
                }
            }
            s->y[(i - i0) * j->ow + q] =
                pre_ops(s, acc, (i - i0) * j->ow + q);
        }
}

static void fallback_generic(const dw_job *j, const dw_span *s, int64_t n,
                             int64_t ch, int64_t i0, int64_t i1)
{
    fallback_rows(0, j, s, n, ch, i0, i1);
}

typedef void (*dw_fallback_fn)(const dw_job *j, const dw_span *s, int64_t n,
                               int64_t ch, int64_t i0, int64_t i1);

#ifdef DW_X86

/* ---- AVX2 + FMA ---- */
#pragma GCC push_options
#pragma GCC target("avx2,fma")

#define DW2_NV 6

/* Sums of virtual pixels [q, q + 8 * NV): NT taps (0: s->ntaps). */
DW_INLINE void sums_avx2(const int NV, const int NT, const dw_span *s, int64_t q,
                         __m256 *acc)
{
    const int64_t nt = NT ? NT : s->ntaps;
    int64_t t;
    int v;
    {
        const __m256 wv = _mm256_broadcast_ss(s->wt);
        const float *p = s->tp[0] + s->woff + q;
#pragma GCC unroll 8
        for (v = 0; v < NV; ++v)
            acc[v] = _mm256_mul_ps(_mm256_loadu_ps(p + 8 * v), wv);
    }
#pragma GCC unroll 9
    for (t = 1; t < nt; ++t) {
        const __m256 wv = _mm256_broadcast_ss(s->wt + t);
        const float *p = s->tp[t] + s->woff + q;
#pragma GCC unroll 8
        for (v = 0; v < NV; ++v)
            acc[v] = _mm256_fmadd_ps(_mm256_loadu_ps(p + 8 * v), wv, acc[v]);
    }
}

/* Lanes [lo, hi) of a mask (0 <= lo, hi <= 8). */
DW_INLINE __m256i lanes_avx2(int64_t lo, int64_t hi)
{
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i a = _mm256_cmpgt_epi32(iota, _mm256_set1_epi32((int)lo - 1));
    const __m256i b = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)hi), iota);
    return _mm256_and_si256(a, b);
}

DW_INLINE __m256 max0_avx2(__m256 v) { return _mm256_max_ps(_mm256_setzero_ps(), v); }
DW_INLINE __m256 min6_avx2(__m256 v) { return _mm256_min_ps(_mm256_set1_ps(6.0f), v); }

/* The in-register operations on v, whose lane l is output off + l
 * (residual read through mask m). */
DW_INLINE __m256 pre_avx2(const dw_span *s, __m256 v, int64_t off, __m256i m)
{
    DW_PRE_OPS(s, v, _mm256_add_ps, _mm256_set1_ps, _mm256_maskload_ps(s->res + off, m),
               max0_avx2, min6_avx2);
    return v;
}

/* Stores vector k of the unit's virtual pixels (8 lanes), through the
 * in-register operations, one run of lanes per output row it reaches. */
DW_INLINE void put_avx2(const dw_span *s, __m256 v, int64_t k)
{
    DW_PUT(s, v, k, 8, pre_avx2, __m256i, _mm256_set1_epi32(-1), lanes_avx2,
           _mm256_storeu_ps, _mm256_maskstore_ps);
}

DW_INLINE void block_avx2(const int NV, const int NT, const dw_span *s, int64_t q)
{
    __m256 acc[DW2_NV];
    int v;
    sums_avx2(NV, NT, s, q, acc);
#pragma GCC unroll 8
    for (v = 0; v < NV; ++v)
        put_avx2(s, acc[v], q / 8 + v);
}

/* Blocks of 6 vectors, then of 4, 2 and 1. */
DW_INLINE void span_avx2_nt(const int NT, const dw_span *s)
{
    int64_t q = 0;
    for (; q + 8 * (DW2_NV - 1) < s->nq; q += 8 * DW2_NV)
        block_avx2(DW2_NV, NT, s, q);
    if (q + 24 < s->nq) {
        block_avx2(4, NT, s, q);
        q += 32;
    }
    if (q + 8 < s->nq) {
        block_avx2(2, NT, s, q);
        q += 16;
    }
    if (q < s->nq)
        block_avx2(1, NT, s, q);
}

static void span_avx2(const dw_span *s)
{
    if (s->ntaps == 9)
        span_avx2_nt(9, s);
    else
        span_avx2_nt(0, s);
}

/* Mask of the 8 source floats from e0 that lie in [0, w). */
DW_INLINE __m256i inside_avx2(int64_t e0, int64_t w)
{
    return lanes_avx2(min_i64(8, max_i64(0, -e0)), max_i64(0, min_i64(8, w - e0)));
}

/* The 8 source floats from e0, zero outside [0, w): a plain load where all
 * are inside (a masked one, VMASKMOVPS, is several times slower on AMD's
 * cores up to Zen 3). */
DW_INLINE __m256 load_inside_avx2(const float *src, int64_t e0, int64_t w)
{
    return e0 >= 0 && e0 + 8 <= w ? _mm256_loadu_ps(src + e0)
                                  : _mm256_maskload_ps(src + e0, inside_avx2(e0, w));
}

DW_INLINE void row_avx2(const dw_row *rw, float *d0, float *d1, const float *src)
{
    int64_t v;
    if (row_common(8, rw, d0, d1, src))
        return;
    if (rw->sw == 1) {
        for (v = 0; v < rw->wq; v += 8) {
            const int64_t e0 = v + rw->off;
            _mm256_storeu_ps(d0 + v, load_inside_avx2(src, e0, rw->w));
        }
        return;
    }
    for (v = 0; v < rw->wq; v += 8) {
        /* 16 source floats from 2v + off: the even ones to d0, the odd to d1 */
        const int64_t e0 = 2 * v + rw->off;
        const __m256 a = load_inside_avx2(src, e0, rw->w);
        const __m256 b = load_inside_avx2(src, e0 + 8, rw->w);
        const __m256 ev = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
        /* within 128-bit lanes: evens of a then of b; then the 64-bit
         * quarters in order */
        _mm256_storeu_ps(d0 + v, _mm256_castpd_ps(_mm256_permute4x64_pd(
                                     _mm256_castps_pd(ev), _MM_SHUFFLE(3, 1, 2, 0))));
        if (d1 != NULL) {
            const __m256 od = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
            _mm256_storeu_ps(d1 + v, _mm256_castpd_ps(_mm256_permute4x64_pd(
                                         _mm256_castps_pd(od), _MM_SHUFFLE(3, 1, 2, 0))));
        }
    }
}

DW_PLANE_FN(plane_avx2, row_avx2)

static void fallback_avx2(const dw_job *j, const dw_span *s, int64_t n,
                          int64_t ch, int64_t i0, int64_t i1)
{
    fallback_rows(1, j, s, n, ch, i0, i1);
}

/* ---- AVX2, channels in lanes (depthwise_c16.h): 16 channels in a pair of
 * registers, 4 pixels at a time (8 accumulators of the 16 registers) ---- */

#include "transpose_avx2.h"

typedef struct {
    __m256 lo, hi; /* channels 0-7, 8-15 */
} v16_avx2;

DW_INLINE v16_avx2 v16_pair(__m256 lo, __m256 hi)
{
    v16_avx2 v;
    v.lo = lo;
    v.hi = hi;
    return v;
}
DW_INLINE v16_avx2 v16_zero_avx2(void)
{
    return v16_pair(_mm256_setzero_ps(), _mm256_setzero_ps());
}
DW_INLINE v16_avx2 v16_loadu_avx2(const float *p)
{
    return v16_pair(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8));
}
DW_INLINE v16_avx2 v16_loadn_avx2(const float *p, int64_t n)
{
    /* plain loads for the whole halves (see load_inside_avx2) */
    return v16_pair(n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lanes_avx2(0, n)),
                    n >= 16 ? _mm256_loadu_ps(p + 8)
                            : _mm256_maskload_ps(p + 8, lanes_avx2(0, max_i64(n - 8, 0))));
}
DW_INLINE void v16_storeu_avx2(float *p, v16_avx2 v)
{
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
}
DW_INLINE void v16_storen_avx2(float *p, v16_avx2 v, int64_t n)
{
    if (n >= 8)
        _mm256_storeu_ps(p, v.lo);
    else
        _mm256_maskstore_ps(p, lanes_avx2(0, n), v.lo);
    if (n >= 16)
        _mm256_storeu_ps(p + 8, v.hi);
    else if (n > 8)
        _mm256_maskstore_ps(p + 8, lanes_avx2(0, n - 8), v.hi);
}
DW_INLINE v16_avx2 v16_add_avx2(v16_avx2 a, v16_avx2 b)
{
    return v16_pair(_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi));
}
DW_INLINE v16_avx2 v16_mul_avx2(v16_avx2 a, v16_avx2 b)
{
    return v16_pair(_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi));
}
DW_INLINE v16_avx2 v16_fma_avx2(v16_avx2 a, v16_avx2 b, v16_avx2 c)
{
    return v16_pair(_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi));
}
DW_INLINE v16_avx2 v16_max0_avx2(v16_avx2 v)
{
    return v16_pair(max0_avx2(v.lo), max0_avx2(v.hi));
}
DW_INLINE v16_avx2 v16_min6_avx2(v16_avx2 v)
{
    return v16_pair(min6_avx2(v.lo), min6_avx2(v.hi));
}
/* The 16 x 16 transpose as four 8 x 8 ones: block (row half a, column half
 * b) goes to (b, a). */
DW_INLINE void v16_transpose_avx2(v16_avx2 r[16])
{
    __m256 q[4][8];
    int i;
#pragma GCC unroll 8
    for (i = 0; i < 8; ++i) {
        q[0][i] = r[i].lo;
        q[1][i] = r[i].hi;
        q[2][i] = r[8 + i].lo;
        q[3][i] = r[8 + i].hi;
    }
    tb_transpose8(q[0]);
    tb_transpose8(q[1]);
    tb_transpose8(q[2]);
    tb_transpose8(q[3]);
#pragma GCC unroll 8
    for (i = 0; i < 8; ++i) {
        r[i] = v16_pair(q[0][i], q[2][i]);
        r[8 + i] = v16_pair(q[1][i], q[3][i]);
    }
}
/* the plane path's in-register operations on 16 outputs from off (n real) */
DW_INLINE v16_avx2 v16_pre_avx2(const dw_span *s, v16_avx2 v, int64_t off, int64_t n)
{
    return v16_pair(pre_avx2(s, v.lo, off, lanes_avx2(0, min_i64(n, 8))),
                    pre_avx2(s, v.hi, off + 8, lanes_avx2(0, max_i64(n - 8, 0))));
}

#define C16(name) name##_avx2
#define V16 v16_avx2
#define V16_PMAX 4
#define V16_ZERO v16_zero_avx2
#define V16_LOAD v16_loadu_avx2
#define V16_LOADU v16_loadu_avx2
#define V16_LOADN v16_loadn_avx2
#define V16_STORE v16_storeu_avx2
#define V16_STOREU v16_storeu_avx2
#define V16_STOREN v16_storen_avx2
#define V16_ADD v16_add_avx2
#define V16_MUL v16_mul_avx2
#define V16_FMA v16_fma_avx2
#define V16_MAX0 v16_max0_avx2
#define V16_MIN6 v16_min6_avx2
#define V16_TRANSPOSE v16_transpose_avx2
#define V16_PRE v16_pre_avx2
#include "depthwise_c16.h" /* (it undefines these macros) */

#pragma GCC pop_options

/* ---- AVX-512 ---- */
#ifndef TIRBYOC_NO_AVX512
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")

#include "transpose_avx512.h"

#define DW5_NV 8

/* Sums of virtual pixels [q, q + 16 * NV): NT taps (0: s->ntaps), with
 * NT's weights wk[] and tap pointers tk[] (held in registers). */
DW_INLINE void sums_avx512(const int NV, const int NT, const dw_span *s,
                           const __m512 *wk, const float *const *tk,
                           int64_t q, __m512 *acc)
{
    const int64_t nt = NT ? NT : s->ntaps;
    int64_t t;
    int v;
    {
        const __m512 wv = NT ? wk[0] : _mm512_set1_ps(s->wt[0]);
        const float *p = (NT ? tk[0] : s->tp[0] + s->woff) + q;
#pragma GCC unroll 8
        for (v = 0; v < NV; ++v)
            acc[v] = _mm512_mul_ps(_mm512_loadu_ps(p + 16 * v), wv);
    }
#pragma GCC unroll 25
    for (t = 1; t < nt; ++t) {
        const __m512 wv = NT ? wk[t] : _mm512_set1_ps(s->wt[t]);
        const float *p = (NT ? tk[t] : s->tp[t] + s->woff) + q;
#pragma GCC unroll 8
        for (v = 0; v < NV; ++v)
            acc[v] = _mm512_fmadd_ps(_mm512_loadu_ps(p + 16 * v), wv, acc[v]);
    }
}

/* Lanes m .. m + 15 of the 32 floats lo, hi (valignd; its count must be an
 * immediate: a constant m here folds the switch away, as the aligned path's
 * unrolled loops give it). */
DW_INLINE __m512 lanes_from(__m512 hi, __m512 lo, int m)
{
    const __m512i h = _mm512_castps_si512(hi), l = _mm512_castps_si512(lo);
    switch (m) {
#define DW_ALIGNR(M)                                                          \
    case M:                                                                   \
        return _mm512_castsi512_ps(_mm512_alignr_epi32(h, l, M));
        DW_ALIGNR(1) DW_ALIGNR(2) DW_ALIGNR(3) DW_ALIGNR(4) DW_ALIGNR(5)
        DW_ALIGNR(6) DW_ALIGNR(7) DW_ALIGNR(8) DW_ALIGNR(9) DW_ALIGNR(10)
        DW_ALIGNR(11) DW_ALIGNR(12) DW_ALIGNR(13) DW_ALIGNR(14) DW_ALIGNR(15)
#undef DW_ALIGNR
    default:
        return lo;
    }
}

/* The aligned path's sums (K x K filter, stride S, no dilation, wq and the
 * planes 16-float aligned): per filter row r and column phase b, the plane
 * row is loaded once (NV + 1 aligned vectors) and tap s = b + S m takes
 * lanes m.. of each pair of them; taps in (r, s) order as everywhere. */
DW_INLINE void sums_al_avx512(const int NV, const int K, const int S,
                              const dw_span *s, const __m512 *wk, int64_t q,
                              __m512 *acc)
{
    int r, b, e, v;
#pragma GCC unroll 7
    for (r = 0; r < K; ++r) {
        __m512 x[2][DW5_NV + 1];
#pragma GCC unroll 2
        for (b = 0; b < S && b < K; ++b) {
            const float *p = s->win + s->woff + ((r % S) * s->nb + b) * s->ps +
                             (r / S) * s->wq + q;
#pragma GCC unroll 9
            for (v = 0; v <= NV; ++v)
                x[b][v] = _mm512_load_ps(p + 16 * v);
        }
#pragma GCC unroll 7
        for (e = 0; e < K; ++e) {
            /* 3x3: the weights held in registers (wk) */
            const __m512 wv = K == 3 ? wk[r * K + e] : _mm512_set1_ps(s->wt[r * K + e]);
            const int b2 = e % S, m = e / S;
#pragma GCC unroll 8
            for (v = 0; v < NV; ++v) {
                const __m512 xv = lanes_from(x[b2][v + 1], x[b2][v], m);
                acc[v] = r == 0 && e == 0 ? _mm512_mul_ps(xv, wv)
                                          : _mm512_fmadd_ps(xv, wv, acc[v]);
            }
        }
    }
}

DW_INLINE __mmask16 lanes_avx512(int64_t lo, int64_t hi)
{
    return (__mmask16)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}

DW_INLINE __m512 max0_avx512(__m512 v) { return _mm512_max_ps(_mm512_setzero_ps(), v); }
DW_INLINE __m512 min6_avx512(__m512 v) { return _mm512_min_ps(_mm512_set1_ps(6.0f), v); }

/* The in-register operations on v, whose lane l is output off + l
 * (residual read through mask m). */
DW_INLINE __m512 pre_avx512(const dw_span *s, __m512 v, int64_t off, __mmask16 m)
{
    DW_PRE_OPS(s, v, _mm512_add_ps, _mm512_set1_ps, _mm512_maskz_loadu_ps(m, s->res + off),
               max0_avx512, min6_avx512);
    return v;
}

/* Stores vector k of the unit's virtual pixels (16 lanes), through the
 * in-register operations, one run of lanes per output row it reaches. */
DW_INLINE void put_avx512(const dw_span *s, __m512 v, int64_t k)
{
    DW_PUT(s, v, k, 16, pre_avx512, __mmask16, (__mmask16)0xFFFF, lanes_avx512,
           _mm512_storeu_ps, _mm512_mask_storeu_ps);
}

/* Sums and stores of NV vectors from virtual pixel q: the aligned path
 * (K > 0) or NT taps read unaligned. */
DW_INLINE void block_avx512(const int NV, const int K, const int S, const int NT,
                            const dw_span *s, const __m512 *wk,
                            const float *const *tk, int64_t q)
{
    __m512 acc[DW5_NV];
    int v;
    if (K)
        sums_al_avx512(NV, K, S, s, wk, q, acc);
    else
        sums_avx512(NV, NT, s, wk, tk, q, acc);
#pragma GCC unroll 8
    for (v = 0; v < NV; ++v)
        put_avx512(s, acc[v], q / 16 + v);
}

/* The unit's virtual pixels: blocks of 8 vectors, then of 4, 2 and 1 (the
 * vectors of a block are independent FMA chains). */
DW_INLINE void span_avx512_k(const int K, const int S, const int NT,
                             const dw_span *s)
{
    __m512 wk[NT ? NT : K == 3 ? 9 : 1];
    const float *tk[NT ? NT : 1];
    int64_t q = 0;
    int v;
    for (v = 0; v < NT; ++v) {
        wk[v] = _mm512_set1_ps(s->wt[v]);
        tk[v] = s->tp[v] + s->woff;
    }
    for (v = 0; v < (K == 3 ? 9 : 0); ++v)
        wk[v] = _mm512_set1_ps(s->wt[v]);
    for (; q + 16 * (DW5_NV - 1) < s->nq; q += 16 * DW5_NV)
        block_avx512(DW5_NV, K, S, NT, s, wk, tk, q);
    if (q + 48 < s->nq) {
        block_avx512(4, K, S, NT, s, wk, tk, q);
        q += 64;
    }
    if (q + 16 < s->nq) {
        block_avx512(2, K, S, NT, s, wk, tk, q);
        q += 32;
    }
    if (q < s->nq)
        block_avx512(1, K, S, NT, s, wk, tk, q);
}

static void span_avx512(const dw_span *s)
{
    switch (s->al_k * 10 + s->al_s) {
    case 31:
        span_avx512_k(3, 1, 0, s);
        return;
    case 32:
        span_avx512_k(3, 2, 0, s);
        return;
    case 51:
        span_avx512_k(5, 1, 0, s);
        return;
    case 52:
        span_avx512_k(5, 2, 0, s);
        return;
    case 71:
        span_avx512_k(7, 1, 0, s);
        return;
    default:
        break;
    }
    if (s->ntaps == 9)
        span_avx512_k(0, 1, 9, s);
    else
        span_avx512_k(0, 1, 0, s);
}

/* Mask of the 16 source floats from e0 that lie in [0, w). */
DW_INLINE __mmask16 inside_avx512(int64_t e0, int64_t w)
{
    return lanes_avx512(min_i64(16, max_i64(0, -e0)),
                        max_i64(0, min_i64(16, w - e0)));
}

/* Chunks of 16 plane columns whose load masks plane_avx512 computes once
 * per plane (wider rows compute them per row). */
#define DW5_CHUNKS 64

/* Row fill (see dw_row), 16 plane columns a chunk; mk[2c], mk[2c + 1]: the
 * masks of chunk c's (first, second) 16 source floats, or mk NULL. */
DW_INLINE void row_avx512(const dw_row *rw, float *d0, float *d1, const float *src,
                          const __mmask16 *mk)
{
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20,
                                         22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21,
                                         23, 25, 27, 29, 31);
    int64_t v, c;
    if (row_common(16, rw, d0, d1, src))
        return;
    if (rw->sw == 1) {
        for (v = 0, c = 0; v < rw->wq; v += 16, ++c) {
            const int64_t e0 = v + rw->off;
            const __mmask16 m = mk != NULL ? mk[2 * c] : inside_avx512(e0, rw->w);
            _mm512_storeu_ps(d0 + v, m == 0xFFFF ? _mm512_loadu_ps(src + e0)
                                                 : _mm512_maskz_loadu_ps(m, src + e0));
        }
        return;
    }
    for (v = 0, c = 0; v < rw->wq; v += 16, ++c) {
        /* 32 source floats from 2v + off: the even ones to d0, the odd to d1
         * (masked loads only where some are outside [0, w)) */
        const int64_t e0 = 2 * v + rw->off;
        const __mmask16 m0 = mk != NULL ? mk[2 * c] : inside_avx512(e0, rw->w);
        const __mmask16 m1 = mk != NULL ? mk[2 * c + 1] : inside_avx512(e0 + 16, rw->w);
        __m512 a, b;
        if ((m0 & m1) == 0xFFFF) {
            a = _mm512_loadu_ps(src + e0);
            b = _mm512_loadu_ps(src + e0 + 16);
        } else {
            a = _mm512_maskz_loadu_ps(m0, src + e0);
            b = _mm512_maskz_loadu_ps(m1, src + e0 + 16);
        }
        _mm512_storeu_ps(d0 + v, _mm512_permutex2var_ps(a, ev, b));
        if (d1 != NULL)
            _mm512_storeu_ps(d1 + v, _mm512_permutex2var_ps(a, od, b));
    }
}

static void plane_avx512(const dw_row *rw, int np, float *const *d0,
                         float *const *d1)
{
    __mmask16 mk[DW_FILL_PLANES][2 * DW5_CHUNKS];
    const int64_t nch = cdiv(rw->wq, 16);
    int64_t u, c;
    int k;
    if (nch <= DW5_CHUNKS)
        for (k = 0; k < np; ++k)
            for (c = 0; c < nch; ++c) {
                const int64_t e0 = 16 * c * rw[k].sw + rw[k].off;
                mk[k][2 * c] = inside_avx512(e0, rw[k].w);
                mk[k][2 * c + 1] = inside_avx512(e0 + 16, rw[k].w);
            }
    for (u = 0; u < rw->rin; ++u)
        for (k = 0; k < np; ++k)
            row_avx512(rw + k, d0[k] + u * rw->wq,
                       d1[k] != NULL ? d1[k] + u * rw->wq : NULL, row_src(rw + k, u),
                       nch <= DW5_CHUNKS ? mk[k] : NULL);
}

static void fallback_avx512(const dw_job *j, const dw_span *s, int64_t n,
                            int64_t ch, int64_t i0, int64_t i1)
{
    fallback_rows(1, j, s, n, ch, i0, i1);
}

/* ---- AVX-512, channels in lanes (depthwise_c16.h): one register of 16
 * channels ---- */

#define C16(name) name##_avx512
#define V16 __m512
#define V16_PMAX 8
#define V16_ZERO() _mm512_setzero_ps()
#define V16_LOAD(p) _mm512_load_ps(p)
#define V16_LOADU(p) _mm512_loadu_ps(p)
#define V16_LOADN(p, n) _mm512_maskz_loadu_ps((__mmask16)((1u << (n)) - 1u), p)
#define V16_STORE(p, v) _mm512_store_ps(p, v)
#define V16_STOREU(p, v) _mm512_storeu_ps(p, v)
#define V16_STOREN(p, v, n) _mm512_mask_storeu_ps(p, (__mmask16)((1u << (n)) - 1u), v)
#define V16_ADD _mm512_add_ps
#define V16_MUL _mm512_mul_ps
#define V16_FMA _mm512_fmadd_ps
#define V16_MAX0 max0_avx512
#define V16_MIN6 min6_avx512
#define V16_TRANSPOSE tb_transpose16
#define V16_PRE(s, v, off, n) pre_avx512(s, v, off, (__mmask16)((1u << (n)) - 1u))
#include "depthwise_c16.h" /* (it undefines these macros) */

#pragma GCC pop_options
#endif /* TIRBYOC_NO_AVX512 */

#endif /* DW_X86 */

/* ---- the driver ---- */

/* total in *count parts of about equal size *per, at most the given *per. */
static void split_even(int64_t total, int64_t *per, int64_t *count)
{
    *count = cdiv(total, *per);
    *per = cdiv(total, *count);
    *count = cdiv(total, *per);
}

/* j->rows (output rows per unit, at most `rows`) and j->nrb (units per
 * plane): fewer rows when `items` (planes, or blocks of channels) would give
 * the `want` threads fewer than DW_UNITS_PER_THREAD units each. */
static void split_rows(dw_job *j, int64_t rows, int64_t items, int want)
{
    if (want > 1 && items < (int64_t)want * DW_UNITS_PER_THREAD)
        rows = min_i64(rows, cdiv(j->oh, cdiv((int64_t)want * DW_UNITS_PER_THREAD, items)));
    j->rows = rows;
    split_even(j->oh, &j->rows, &j->nrb);
}

typedef struct {
    dw_span_fn span;
    dw_plane_fn plane;
    dw_fallback_fn fallback;
} dw_fns;

static dw_fns fns_of(const tb_isa *isa)
{
    dw_fns f;
    f.span = span_generic;
    f.plane = plane_generic;
    f.fallback = fallback_generic;
#ifdef DW_X86
#ifndef TIRBYOC_NO_AVX512
    if (isa == &tb_isa_avx512) {
        f.span = span_avx512;
        f.plane = plane_avx512;
        f.fallback = fallback_avx512;
    } else
#endif
    if (isa == &tb_isa_avx2) {
        f.span = span_avx2;
        f.plane = plane_avx2;
        f.fallback = fallback_avx2;
    }
#else
    (void)isa;
#endif
    return f;
}

/* Floats of one phase plane of a unit of `rows` output rows (a multiple of
 * 16, so that every plane is 64-byte aligned). */
static double plane_floats(const dw_job *j, int64_t rows)
{
    const double v = (double)(rows + j->hr) * (double)j->wq + DW_SLACK;
    return v > 1.0e15 ? v : (double)(cdiv((int64_t)v, 16) * 16);
}

/* Vectors of 8 lanes (the most there can be) over a unit's virtual
 * pixels, and their runs (at most one more per output row). */
static double seg_vectors(const dw_job *j, int64_t rows)
{
    return ((double)(rows - 1) * (double)j->wq + (double)j->ow) / 8 + 1;
}

/* Floats of a unit's scratch: its planes and the tap pointers. */
static double window_floats(const dw_job *j, int64_t rows)
{
    return (double)j->na * (double)j->nb * plane_floats(j, rows) +
           2.0 * (double)j->ntaps + 16;
}

/* Floats of the runs of a block of `rows` rows (dw_seg, 4 floats each,
 * then their starts, int32_t), 16-float aligned. */
static int64_t seg_floats(const dw_job *j, int64_t rows)
{
    const int64_t nv = (int64_t)seg_vectors(j, rows);
    return cdiv(4 * (nv + rows), 16) * 16 + cdiv(nv + 1, 16) * 16;
}

/* The runs of lanes of each L-lane vector of a unit's virtual pixels
 * (rows output rows of OW pixels, rows of wq virtual pixels). */
static void build_segs(int64_t rows, int64_t ow, int64_t wq, int L, dw_seg *seg,
                       int32_t *seg0)
{
    const int64_t nq = (rows - 1) * wq + ow;
    int64_t k, r = 0, c = 0;
    int32_t g = 0;
    for (k = 0; k * L < nq; ++k) {
        int64_t l = 0, rr = r, cc = c;
        seg0[k] = g;
        while (l < L && rr < rows) {
            if (cc < ow) {
                seg[g].lo = (int32_t)l;
                seg[g].hi = (int32_t)min_i64(L, l + ow - cc);
                seg[g].off = rr * ow + cc - l;
                ++g;
            }
            l += wq - cc;
            cc = 0;
            ++rr;
        }
        c += L;
        while (c >= wq) {
            c -= wq;
            ++r;
        }
    }
    seg0[k] = g;
}

/* Columns [lo, hi) of a plane row whose source column v * sw + off lies in
 * [0, w). */
static void inside_cols(const dw_job *j, int64_t off, int64_t *lo, int64_t *hi)
{
    *lo = off >= 0 ? 0 : min_i64(j->wq, cdiv(-off, j->sw));
    *hi = off >= j->w ? *lo : max_i64(*lo, min_i64(j->wq, cdiv(j->w - off, j->sw)));
}

/* Fills the window of output rows [i0, i0 + rows) of image plane img (NULL
 * when the image is empty) into win: plane (ia, ib) at win + (ia * nb +
 * ib) * ps. */
static void fill_window(const dw_job *j, const dw_fns *f, const float *img,
                        int64_t i0, int64_t rows, float *win)
{
    const int64_t rin = rows + j->hr, wq = j->wq, ps = j->ps;
    /* stride 2 with both column phases: one pass splits a row in two */
    const int pair = j->sw == 2 && j->nb == 2;
    dw_row rw[DW_FILL_PLANES];
    float *d0[DW_FILL_PLANES], *d1[DW_FILL_PLANES];
    int np = 0;
    int64_t ia, ib, a = 0;
    for (ia = 0; ia < j->na; ++ia) {
        int64_t b = 0;
        for (ib = 0; ib < j->nb; ib += pair ? 2 : 1) {
            float *pln = win + (ia * j->nb + ib) * ps;
            dw_row *r = rw + np;
            r->off = b - j->pl;
            r->sw = j->sw;
            r->w = j->w;
            r->wq = wq;
            inside_cols(j, r->off, &r->lo, &r->hi);
            r->lo1 = r->hi1 = 0;
            if (pair)
                inside_cols(j, r->off + 1, &r->lo1, &r->hi1);
            r->img = img;
            r->ih0 = i0 * j->sh + a - j->pt;
            r->sh = j->sh;
            r->h = j->h;
            r->rin = rin;
            d0[np] = pln;
            d1[np] = pair ? pln + ps : NULL;
            memset(pln + rin * wq, 0, (size_t)(ps - rin * wq) * sizeof(float));
            if (pair)
                memset(pln + ps + rin * wq, 0,
                       (size_t)(ps - rin * wq) * sizeof(float));
            if (++np == DW_FILL_PLANES) {
                f->plane(rw, np, d0, d1);
                np = 0;
            }
            /* the next column phase: b + dw mod sw */
            b += j->dw % j->sw * (pair ? 2 : 1);
            b %= j->sw;
        }
        a = (a + j->dh % j->sh) % j->sh;
    }
    if (np > 0)
        f->plane(rw, np, d0, d1);
}

/* Unit u: image n, channels [c0, c1) (a group), output rows [i0, i1). The
 * window's layout, and so the tap pointers and the runs of lanes, are the
 * same for every channel of the unit. */
static void dw_unit(void *arg, int64_t u, float *scratch)
{
    const dw_job *j = (const dw_job *)arg;
#ifdef DW_X86
    if (j->c16) {
        const int64_t rb = u % j->nrb, t = u / j->nrb;
        const int64_t i0 = rb * j->rows;
#ifdef TIRBYOC_NO_AVX512
        c16_unit_avx2(
#else
        (j->isa == &tb_isa_avx512 ? c16_unit_avx512 : c16_unit_avx2)(
#endif
            j, t / j->nblk, t % j->nblk * 16, i0, min_i64(j->oh, i0 + j->rows), scratch);
        return;
    }
#endif
    const dw_fns f = fns_of(j->isa);
    const int64_t rb = u % j->nrb, ng = u / j->nrb;
    const int64_t n = ng / j->ngroups, c0 = ng % j->ngroups * j->group;
    const int64_t c1 = min_i64(j->c, c0 + j->group);
    const int64_t i0 = rb * j->rows, i1 = min_i64(j->oh, i0 + j->rows);
    const int64_t hw = j->h * j->w, p = j->oh * j->ow;
    const int64_t wsize = j->na * j->nb * j->ps; /* one window */
    int64_t ch, cw;
    dw_span s;
    s.ntaps = j->ntaps;
    s.wq = j->wq;
    s.ow = j->ow;
    s.rows = i1 - i0;
    s.nq = (s.rows - 1) * j->wq + j->ow;
    s.win = scratch;
    s.woff = 0;
    s.ps = j->ps;
    s.nb = j->nb;
    s.al_k = j->aligned ? (int)j->kh : 0;
    s.al_s = j->aligned ? (int)j->sh : 0;
    s.has_bias = j->has_bias;
    s.npre = j->npre;
    s.pre = j->pre;
    s.tp = NULL;
    s.seg = NULL;
    s.seg0 = NULL;
    if (!j->fallback) {
        const float **tp = (const float **)(void *)(scratch + j->nwin * wsize);
        /* tap (r, e): plane (r mod pa, e mod pb), row r * dh / sh, column
         * e * dw / sw (quotients and residues kept as running sums) */
        const int64_t dq = j->dh / j->sh, dr = j->dh % j->sh;
        const int64_t eq = j->dw / j->sw, er = j->dw % j->sw;
        const int last = s.rows != j->rows;
        int64_t r, e, ra = 0, rq = 0, rr = 0;
        for (r = 0; r < j->kh; ++r) {
            const float *base = scratch + ra * j->nb * j->ps + rq * j->wq;
            int64_t eb = 0, cq = 0, cr = 0;
            for (e = 0; e < j->kw; ++e) {
                tp[r * j->kw + e] = base + eb * j->ps + cq;
                if (++eb == j->pb)
                    eb = 0;
                cq += eq;
                cr += er;
                if (cr >= j->sw) {
                    cr -= j->sw;
                    ++cq;
                }
            }
            if (++ra == j->pa)
                ra = 0;
            rq += dq;
            rr += dr;
            if (rr >= j->sh) {
                rr -= j->sh;
                ++rq;
            }
        }
        s.tp = tp;
        s.seg = j->seg[last];
        s.seg0 = j->seg0[last];
    }
    /* Windows of up to nwin channels are filled before any of their sums
     * is taken (small planes: the sums would otherwise read the stores of
     * the fill right behind them). */
    for (cw = c0; cw < c1; cw += j->nwin) {
        const int64_t ce = min_i64(c1, cw + j->nwin);
        if (!j->fallback)
            for (ch = cw; ch < ce; ++ch)
                fill_window(j, &f, hw > 0 ? j->x + (n * j->c + ch) * hw : NULL,
                            i0, s.rows, scratch + (ch - cw) * wsize);
        for (ch = cw; ch < ce; ++ch) {
            const int64_t plane = (n * j->c + ch) * p;
            s.wt = j->wt + ch * j->ntaps;
            s.y = j->y + plane + i0 * j->ow;
            s.res = j->uses_residual ? j->residual + plane + i0 * j->ow : NULL;
            s.bias = j->has_bias ? j->bias[ch] : 0.0f;
            s.woff = (ch - cw) * wsize;
            if (j->fallback)
                f.fallback(j, &s, n, ch, i0, i1);
            else
                f.span(&s);
            chain_rest(j, plane, i0, s.rows);
        }
    }
}

/* Sets up the channels-in-lanes path (AVX2, AVX-512) where it is taken: returns
 * its units, 0 where the planes are used. */
static int64_t c16_rows(dw_job *j, int want, const char *env)
{
    double fixed, per_row, rmax;
    if (j->isa != &tb_isa_avx512 && j->isa != &tb_isa_avx2)
        return 0;
    /* Measured (3x3, 1 and 2 threads). AVX-512: channels in lanes 1.2x to
     * 3x faster at stride 2 and on rows under 40 pixels, about 1.2x at 48
     * and 56 and 1.05x at 112 at stride 1 in whole blocks of 16 channels;
     * the planes (with their aligned rows) faster on wider rows (128 to 224)
     * and with a partly empty block on wide rows. Fewer than 8 channels
     * would leave most lanes empty. AVX2 (no aligned rows): channels in
     * lanes 1.05x to 2.2x faster from 12 channels on at every width measured
     * (7 to 224, 3x3 and 5x5, both strides), 0.94x at 8 channels. */
    if (env != NULL && (env[0] == 'p' || env[0] == 's'))
        return 0;
    if (!(env != NULL && env[0] == 'c') && !j->xb && !j->yb &&
        (j->isa == &tb_isa_avx2
             ? j->c < 12
             : (j->c < 8 || (j->sh == 1 && j->sw == 1 && j->ow >= 40 &&
                             (j->c % 16 != 0 || j->ow > 112)))))
        return 0;
    j->vw = (j->ow - 1) * j->sw + (j->kw - 1) * j->dw + 1;
    /* floats: the window's rows, the weights, the staging area */
    per_row = 16.0 * ((double)j->sh * (double)j->vw + (double)j->ow);
    fixed = 16.0 * (((double)(j->kh - 1) * (double)j->dh + 1 - (double)j->sh) *
                        (double)j->vw + (double)j->ntaps + 17 +
                    (double)max_i64(0, -j->pl)) + 2.0 * (double)j->kh + 80;
    /* the scratch per unit: half the L2 (the rest for the image rows read) */
    rmax = ((double)tb_l2_half_floats() - fixed) / per_row;
    if (rmax < 1) {
        rmax = ((double)TB_SCRATCH_FLOATS - fixed) / per_row;
        if (rmax < 1)
            return 0;
        rmax = 1;
    }
    j->nblk = cdiv(j->c, 16);
    split_rows(j, rmax >= (double)j->oh ? j->oh : (int64_t)rmax, j->batch * j->nblk, want);
    j->c16 = 1;
    /* the window, or an NCHW16c x's row of zeros (columns from -pl on when
     * the padding crops) */
    j->c16_rp = cdiv(max_i64(((j->rows - 1) * j->sh + (j->kh - 1) * j->dh + 1) * j->vw,
                             j->vw - min_i64(j->pl, 0)) * 16, 16) * 16;
    j->c16_wts = j->c16_rp + cdiv(2 * j->kh, 16) * 16;
    j->c16_tb = j->c16_wts + (j->ntaps + 1) * 16;
    for (j->c16_npre = 0; j->c16_npre < j->npre &&
                          (j->yb || j->pre[j->c16_npre] != TIRBYOC_EPI_RESIDUAL);)
        ++j->c16_npre;
    j->units = j->batch * j->nblk * j->nrb;
    return j->units;
}

/* Whether the sizes are all in [0, DW_DIM_MAX) and each tensor's element
 * count fits in int64_t. */
static int sizes_ok(const int64_t *v, int n)
{
    int i;
    for (i = 0; i < n; ++i)
        if (v[i] < 0 || v[i] >= DW_DIM_MAX)
            return 0;
    /* x, y, weight: [batch, c, h, w], [batch, c, oh, ow], [c, 1, kh, kw] */
    return (double)v[0] * (double)v[1] * (double)v[2] * (double)v[3] < 9.0e18 &&
           (double)v[0] * (double)v[1] * (double)v[6] * (double)v[7] < 9.0e18 &&
           (double)v[1] * (double)v[4] * (double)v[5] < 9.0e18;
}

int32_t tirbyoc_depthwise_conv2d_f32(int64_t batch, int64_t c, int64_t h,
                                     int64_t w, const float *x, int64_t kh,
                                     int64_t kw, const float *weight,
                                     int64_t stride_h, int64_t stride_w,
                                     int64_t pad_top, int64_t pad_left,
                                     int64_t dilation_h, int64_t dilation_w,
                                     int64_t oh, int64_t ow, int64_t epilogue,
                                     const float *bias, const float *residual,
                                     float *y)
{
    return tirbyoc_depthwise_conv2d_f32_layouts(
        0, batch, c, h, w, x, kh, kw, weight, stride_h, stride_w, pad_top,
        pad_left, dilation_h, dilation_w, oh, ow, epilogue, bias, residual, y);
}

int32_t tirbyoc_depthwise_conv2d_f32_layouts(
    int64_t layouts, int64_t batch, int64_t c, int64_t h, int64_t w,
    const float *x, int64_t kh, int64_t kw, const float *weight,
    int64_t stride_h, int64_t stride_w, int64_t pad_top, int64_t pad_left,
    int64_t dilation_h, int64_t dilation_w, int64_t oh, int64_t ow,
    int64_t epilogue, const float *bias, const float *residual, float *y)
{
    dw_job j;
    const int64_t sizes[] = {batch, c, h, w, kh, kw, oh, ow};
    int uses_residual, want;
    const int has_bias = (epilogue & 15) == TIRBYOC_EPI_BIAS;
    const char *env;
    int64_t ops;
    int32_t st;
    double flops;

    if (!sizes_ok(sizes, 8))
        return TIRBYOC_ESIZE;
    /* strides, dilations, paddings and the chain: as tirbyoc_conv2d_f32's */
    st = tb_conv_check_args(stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w,
                            epilogue, &ops, &uses_residual);
    if (st != TIRBYOC_OK)
        return st;
    st = tb_layouts_check(layouts, c, c, ops);
    if (st != TIRBYOC_OK)
        return st;
    if (batch == 0 || c == 0 || oh == 0 || ow == 0)
        return TIRBYOC_OK;
    if (y == NULL || (x == NULL && h * w > 0) ||
        (weight == NULL && kh * kw > 0) || (bias == NULL && has_bias) ||
        (residual == NULL && uses_residual))
        return TIRBYOC_ENULL;
    if (tb_scratch() == NULL)
        return TIRBYOC_ENOMEM;

    memset(&j, 0, sizeof(j));
    j.isa = tb_active_isa();
    j.batch = batch;
    j.c = c;
    j.h = h;
    j.w = w;
    j.kh = kh;
    j.kw = kw;
    j.sh = stride_h;
    j.sw = stride_w;
    j.pt = pad_top;
    j.pl = pad_left;
    j.dh = dilation_h;
    j.dw = dilation_w;
    j.oh = oh;
    j.ow = ow;
    j.x = x;
    j.wt = weight;
    j.bias = has_bias ? bias : NULL;
    j.residual = uses_residual ? residual : NULL;
    j.uses_residual = uses_residual;
    j.y = y;
    j.ntaps = kh * kw;
    j.has_bias = has_bias;
    j.xb = (layouts & TIRBYOC_LAYOUT_X16) != 0;
    j.yb = (layouts & TIRBYOC_LAYOUT_Y16) != 0;
    /* the leading residual / relu / relu6 operations go in registers */
    while (ops != 0 && ((ops & 15) == TIRBYOC_EPI_RESIDUAL ||
                        (ops & 15) == TIRBYOC_EPI_RELU ||
                        (ops & 15) == TIRBYOC_EPI_RELU6)) {
        j.pre[j.npre++] = (unsigned char)(ops & 15);
        ops = (int64_t)((uint64_t)ops >> 4);
    }
    j.rest = ops;

    if (j.ntaps == 0 && layouts == 0) {
        /* an empty sum: the chain on zeros */
        int64_t n, ch, t;
        const int64_t p = oh * ow;
        for (n = 0; n < batch; ++n)
            for (ch = 0; ch < c; ++ch) {
                dw_span s;
                float *yp = y + (n * c + ch) * p;
                memset(&s, 0, sizeof(s));
                s.has_bias = has_bias;
                s.bias = has_bias ? bias[ch] : 0.0f;
                s.npre = j.npre;
                s.pre = j.pre;
                s.res = uses_residual ? residual + (n * c + ch) * p : NULL;
                for (t = 0; t < p; ++t)
                    yp[t] = pre_ops(&s, 0.0f, t);
                chain_rest(&j, (n * c + ch) * p, 0, oh);
            }
        return TIRBYOC_OK;
    }

    /* Phase planes: r * dh mod sh repeats with period sh / gcd(dh, sh). */
    j.pa = stride_h / gcd_i64(dilation_h, stride_h);
    j.pb = stride_w / gcd_i64(dilation_w, stride_w);
    j.na = min_i64(kh, j.pa);
    j.nb = min_i64(kw, j.pb);
    j.hr = (kh - 1) * dilation_h / stride_h;
    j.wr = (kw - 1) * dilation_w / stride_w;
    j.wq = ow + j.wr;
    j.lanes = j.isa == &tb_isa_avx512 ? 16 : j.isa == &tb_isa_avx2 ? 8 : 1;
    /* AVX-512's aligned path: rows padded to 16 floats when that adds less
     * than a third */
    if (j.isa == &tb_isa_avx512 && kh == kw && (kh == 3 || kh == 5 || kh == 7) &&
        stride_h == stride_w && (stride_h == 1 || (stride_h == 2 && kh < 7)) &&
        dilation_h == 1 && dilation_w == 1 && cdiv(j.wq, 16) * 16 * 3 <= j.wq * 4) {
        j.aligned = 1;
        j.wq = cdiv(j.wq, 16) * 16;
    }

    flops = 2.0 * (double)batch * (double)c * (double)oh * (double)ow *
            (double)j.ntaps;
    /* (the units are set by the path below, for this many threads) */
    want = tb_threads_for(flops, DW_PAR_FLOPS, INT64_MAX);

    /* TIRBYOC_DW_PATH=planes, channels or scalar takes that path wherever it
     * can run (tests); unset, the call chooses */
    env = getenv("TIRBYOC_DW_PATH");
    if (j.ntaps > 0 && c16_rows(&j, want, env) > 0) {
        tb_units(dw_unit, &j, j.units, want);
        return TIRBYOC_OK;
    }
    if (layouts != 0) {
        /* blocked tensors off the channels-in-lanes path (or without taps):
         * through NCHW copies, the call without layouts */
        tb_nchw_copies cp;
        const float *rin = j.residual;
        float *yt = y;
        if (!tb_nchw_copies_open(&cp, layouts, batch, c, h * w, c, oh * ow, &x, &rin, &yt))
            return TIRBYOC_ENOMEM;
        st = tirbyoc_depthwise_conv2d_f32_layouts(
            0, batch, c, h, w, x, kh, kw, weight, stride_h, stride_w, pad_top, pad_left,
            dilation_h, dilation_w, oh, ow, epilogue, bias, rin, yt);
        return tb_nchw_copies_close(&cp, st, batch, c, oh * ow, y);
    }

    /* Output rows per unit: a window of about dw_window_floats(), fewer when the
     * planes are too few to keep the threads busy. */
    j.fallback = window_floats(&j, 1) > (double)TB_SCRATCH_FLOATS ||
                 (env != NULL && env[0] == 's');
    if (j.fallback) {
        j.rows = oh;
    } else {
        const double window = (double)dw_window_floats();
        j.rows = 1;
        while (j.rows < oh && window_floats(&j, j.rows * 2) <= window)
            j.rows *= 2;
        j.rows = min_i64(j.rows, oh);
    }
    split_rows(&j, j.rows, batch * c, want); /* blocks of about equal height */
    j.ps = j.fallback ? 0 : (int64_t)plane_floats(&j, j.rows);
    /* small planes: several channels per unit (one setup of the window's
     * layout), as long as the units still spread over the threads */
    j.group = max_i64(1, DW_UNIT_OUTPUTS / (j.rows * ow));
    if (want > 1)
        j.group = min_i64(j.group, max_i64(1, batch * c / ((int64_t)want *
                                                           DW_UNITS_PER_THREAD)));
    j.group = min_i64(j.group, c);
    split_even(c, &j.group, &j.ngroups);
    j.units = batch * j.ngroups * j.nrb;
    j.nwin = 1;
    if (!j.fallback) {
        const double wsize = (double)j.na * (double)j.nb * (double)j.ps;
        const double room = (double)TB_SCRATCH_FLOATS - 2.0 * (double)j.ntaps - 16;
        j.nwin = min_i64(j.group, max_i64(1, (int64_t)(2.0 * (double)dw_window_floats() / wsize)));
        j.nwin = max_i64(1, min_i64(j.nwin, (int64_t)(room / wsize)));
    }
    if (!j.fallback && j.lanes > 1) {
        /* the runs of lanes, in the calling thread's workspace */
        const int64_t last = oh - (j.nrb - 1) * j.rows;
        const int64_t fa = seg_floats(&j, j.rows), fb = seg_floats(&j, last);
        int b;
        float *ws = tb_workspace((size_t)(fa + fb));
        if (ws == NULL)
            return TIRBYOC_ENOMEM;
        for (b = 0; b < 2; ++b) {
            const int64_t rows = b ? last : j.rows;
            float *at = ws + (b ? fa : 0);
            const int64_t nv = (int64_t)seg_vectors(&j, rows);
            dw_seg *sg = (dw_seg *)(void *)at;
            int32_t *sg0 = (int32_t *)(void *)(at + cdiv(4 * (nv + rows), 16) * 16);
            build_segs(rows, ow, j.wq, j.lanes, sg, sg0);
            j.seg[b] = sg;
            j.seg0[b] = sg0;
        }
    }
    tb_units(dw_unit, &j, j.units, want);
    return TIRBYOC_OK;
}
