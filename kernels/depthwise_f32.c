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
 * Channels in lanes (AVX-512): a unit is 16 channels (the last block
 * partial) of a block of output rows. The input rows are transposed, 16
 * pixels at a time, into a window of pixels of 16 channels, the taps are
 * aligned vector loads at any stride or dilation, 8 output pixels are 8 FMA
 * chains with the 16 channels' weights of a tap in one register, and the
 * sums are transposed back into the channels' rows as they are stored.
 * Taken where the planes do worse (measured): for 8 channels or more at a
 * stride of 2 or more and on output rows of fewer than 40 pixels, and for
 * whole blocks of 16 channels on rows of up to 112.
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
/* A unit's window: about this many floats (it stays in L1). */
#define DW_WINDOW_FLOATS 8192
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
/* The channels-in-lanes path's scratch per unit: about this many floats. */
#define DW_C16_FLOATS (64 * 1024)

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
    /* the channels-in-lanes path (AVX-512): units of 16 channels */
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
 * output rows [i0, i0 + rows) of the image plane at y + plane, through the
 * ISA's chain. */
static void chain_rest(const dw_job *j, int64_t plane, int64_t i0, int64_t rows)
{
    tb_chain ch;
    if (j->rest == 0)
        return;
    ch.ops = j->rest;
    ch.scale = 1.0f;
    ch.bias = NULL;
    ch.residual = j->uses_residual ? j->residual + plane : NULL;
    ch.ldr = j->ow;
    j->isa->chain(&ch, j->y + plane + i0 * j->ow, j->ow, rows, j->ow, i0, 0);
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

DW_INLINE void row_avx2(const dw_row *rw, float *d0, float *d1, const float *src)
{
    int64_t v;
    if (row_common(8, rw, d0, d1, src))
        return;
    if (rw->sw == 1) {
        for (v = 0; v < rw->wq; v += 8) {
            const int64_t e0 = v + rw->off;
            _mm256_storeu_ps(d0 + v, _mm256_maskload_ps(src + e0, inside_avx2(e0, rw->w)));
        }
        return;
    }
    for (v = 0; v < rw->wq; v += 8) {
        /* 16 source floats from 2v + off: the even ones to d0, the odd to d1 */
        const int64_t e0 = 2 * v + rw->off;
        const __m256 a = _mm256_maskload_ps(src + e0, inside_avx2(e0, rw->w));
        const __m256 b = _mm256_maskload_ps(src + e0 + 8, inside_avx2(e0 + 8, rw->w));
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

#pragma GCC pop_options

/* ---- AVX-512 ---- */
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

/* ---- AVX-512, channels in lanes ----
 *
 * A unit is 16 channels (fewer in the last block) of output rows [i0, i1)
 * of one image. The input rows they read are transposed, 16 pixels at a
 * time, into a window of pixels of 16 channels (a zero pixel in the
 * padding): element [u][v] (16 floats) = x[c0 + l][i0 * sh - pt + u]
 * [v - pl]. Output pixel (i, j)'s tap (r, s) is then one aligned vector at
 * [(i - i0) * sh + r * dh][j * sw + s * dw], whatever the strides, and the
 * sums of 8 pixels at a time are 8 FMA chains over the taps with the 16
 * channels' weights of a tap in one register. The sums go to a staging
 * area, pixel by pixel, which is transposed back 16 pixels at a time into
 * the channels' rows, with the in-register operations, as they are stored.
 * An NCHW16c x needs no window: its rows are read in place, a row of zeros
 * stands for the rows above and below the image, and the pixels whose taps
 * reach into the side padding are summed one at a time, with a zero vector
 * for each such tap (as the window's zero pixels; the window's copy was
 * half of a stride-2 layer's time). A blocked y takes the sums directly.
 * Each output goes through the same operations as on the plane path
 * (product of tap 0, FMAs in (r, s) order, + bias, ...): the same bits.
 */

/* The window of a unit: rin rows from image row ihs, channels c0.. (nc of
 * them) of image plane img (NULL when the image is empty). */
static void c16_fill(const dw_job *j, const float *img, int64_t nc, int64_t ihs,
                     int64_t rin, float *win, float *tmp)
{
    const int64_t h = j->h, w = j->w, vw = j->vw, pl = j->pl, hw = h * w;
    const int64_t ha = img == NULL ? ihs : max_i64(ihs, 0);
    const int64_t hb = img == NULL ? ihs : max_i64(ha, min_i64(ihs + rin, h));
    const int64_t zl = min_i64(vw, max_i64(0, pl));          /* zero columns */
    const int64_t zr = max_i64(zl, min_i64(vw, w + pl));     /* from here on */
    const __m512 zero = _mm512_setzero_ps();
    int64_t u, v, p0, ih, iw;
    for (u = 0; u < rin; ++u) {
        float *row = win + u * vw * 16;
        if (ihs + u < ha || ihs + u >= hb) {
            for (v = 0; v < vw; ++v)
                _mm512_store_ps(row + v * 16, zero);
        } else {
            for (v = 0; v < zl; ++v)
                _mm512_store_ps(row + v * 16, zero);
            for (v = zr; v < vw; ++v)
                _mm512_store_ps(row + v * 16, zero);
        }
    }
    /* the image's rows [ha, hb): contiguous pixels of each channel */
    ih = ha;
    iw = 0;
    for (p0 = ha * w; p0 < hb * w; p0 += 16) {
        const int64_t cnt = min_i64(16, hb * w - p0);
        const __mmask16 m = (__mmask16)((1u << cnt) - 1u);
        __m512 r[16];
        int l, k;
#pragma GCC unroll 16
        for (l = 0; l < 16; ++l)
            r[l] = l < nc ? (cnt == 16 ? _mm512_loadu_ps(img + l * hw + p0)
                                       : _mm512_maskz_loadu_ps(m, img + l * hw + p0))
                          : zero;
        /* 16 streams, one per channel: ahead of the hardware's prefetch */
        if (p0 + DW_C16_AHEAD < hb * w)
#pragma GCC unroll 16
            for (l = 0; l < 16; ++l)
                if (l < nc)
                    _mm_prefetch((const char *)(img + l * hw + p0 + DW_C16_AHEAD),
                                 _MM_HINT_T0);
        tb_transpose16(r);
        if (cnt == 16 && iw + 16 <= w && iw + pl >= 0 && iw + pl + 16 <= vw) {
            /* 16 pixels of one row, all inside the window */
            float *d = win + ((ih - ihs) * vw + iw + pl) * 16;
#pragma GCC unroll 16
            for (k = 0; k < 16; ++k)
                _mm512_store_ps(d + k * 16, r[k]);
            iw += 16;
            if (iw == w) {
                iw = 0;
                ++ih;
            }
            continue;
        }
        /* across rows or the window's edge: through tmp, a run of pixels
         * per image row, the part inside the window's columns */
#pragma GCC unroll 16
        for (k = 0; k < 16; ++k)
            _mm512_store_ps(tmp + k * 16, r[k]);
        for (k = 0; k < cnt;) {
            const int64_t run = min_i64(cnt - k, w - iw);
            const int64_t lo = max_i64(0, -(iw + pl)), hi = min_i64(run, vw - (iw + pl));
            float *d = win + ((ih - ihs) * vw + iw + pl) * 16;
            int64_t t;
            for (t = lo; t < hi; ++t)
                _mm512_store_ps(d + t * 16, _mm512_load_ps(tmp + (k + t) * 16));
            k += (int)run;
            iw += run;
            if (iw == w) {
                iw = 0;
                ++ih;
            }
        }
    }
}

/* Sums of P output pixels from (li, jx) of the unit into the staging area
 * tb (16 floats per pixel, pixel li * OW + jx + p; a blocked y itself, res
 * its residual at the same offsets); K: a K x K filter known here (0:
 * j->kh x j->kw), with its weights in wk, else in wts. Tap row r of the
 * pixels is rp[r], window column v of it at rp[r] + (v - off) * 16: the
 * window's row (off 0), or an NCHW16c image's row or a row of zeros (off
 * j->pl). EDGE (P 1): columns v - off outside [0, w) read as zeros. */
DW_INLINE void c16_px(const int P, const int K, const int EDGE, const dw_job *j,
                      const float *const *rp, int64_t off, const float *wts,
                      const __m512 *wk, __m512 bias, int64_t li, int64_t jx,
                      float *tb, const float *res)
{
    const int64_t kh = K ? K : j->kh, kw = K ? K : j->kw;
    const int64_t sw16 = j->sw * 16;
    __m512 acc[8];
    int64_t r, e;
    int p;
    for (p = 0; p < P; ++p) /* (tap 0 sets them: ntaps >= 1 here) */
        acc[p] = _mm512_setzero_ps();
#pragma GCC unroll 7
    for (r = 0; r < kh; ++r) {
        const float *rowp = rp[r] + (jx * j->sw - off) * 16;
#pragma GCC unroll 7
        for (e = 0; e < kw; ++e) {
            const float *b = rowp + e * j->dw * 16;
            const int64_t col = jx * j->sw + e * j->dw - off;
            const __m512 wv = K ? wk[r * K + e] : _mm512_load_ps(wts + (r * kw + e) * 16);
#pragma GCC unroll 8
            for (p = 0; p < P; ++p) {
                const __m512 xv = EDGE && (col < 0 || col >= j->w)
                                      ? _mm512_setzero_ps()
                                      : _mm512_loadu_ps(b + p * sw16);
                acc[p] = r == 0 && e == 0 ? _mm512_mul_ps(xv, wv)
                                          : _mm512_fmadd_ps(xv, wv, acc[p]);
            }
        }
    }
    /* the bias and the relus before any residual (the lanes are the
     * channels; a blocked y: the residual too), one operation at a time
     * over the P registers */
    if (j->has_bias)
#pragma GCC unroll 8
        for (p = 0; p < P; ++p)
            acc[p] = _mm512_add_ps(acc[p], bias);
    for (r = 0; r < j->c16_npre; ++r) {
        const int relu6 = j->pre[r] != TIRBYOC_EPI_RELU;
        if (j->pre[r] == TIRBYOC_EPI_RESIDUAL) {
#pragma GCC unroll 8
            for (p = 0; p < P; ++p)
                acc[p] = _mm512_add_ps(
                    acc[p], _mm512_loadu_ps(res + (li * j->ow + jx + p) * 16));
            continue;
        }
#pragma GCC unroll 8
        for (p = 0; p < P; ++p) {
            acc[p] = _mm512_max_ps(_mm512_setzero_ps(), acc[p]);
            if (relu6)
                acc[p] = _mm512_min_ps(_mm512_set1_ps(6.0f), acc[p]);
        }
    }
#pragma GCC unroll 8
    for (p = 0; p < P; ++p)
        _mm512_storeu_ps(tb + (li * j->ow + jx + p) * 16, acc[p]);
}

/* The unit's sums, row by row: from the window win (img NULL), or read in
 * place from the rows of NCHW16c image plane img (the unit's first input
 * row ih0, zero rows at win, the edge columns one pixel at a time). rpk:
 * room for kh row pointers (K 0). */
DW_INLINE void c16_sums(const int K, const dw_job *j, const float *win,
                        const float *img, int64_t ih0, const float **rpk,
                        const float *wts, int64_t rows, float *tb,
                        const float *res)
{
    const int64_t kh = K ? K : j->kh, kw = K ? K : j->kw, ow = j->ow;
    const float *rpc[K ? K : 1];
    const float **rp = K ? rpc : rpk;
    const int64_t off = img != NULL ? j->pl : 0;
    const __m512 bias = _mm512_load_ps(wts + j->ntaps * 16);
    __m512 wk[K ? K * K : 1];
    /* the pixels whose taps all lie in the image's columns: [lo, hi) */
    int64_t lo = 0, hi = ow, li, jx, r;
    int t;
    for (t = 0; t < K * K; ++t)
        wk[t] = _mm512_load_ps(wts + t * 16);
    if (img != NULL) {
        const int64_t last = j->w - 1 + j->pl - (kw - 1) * j->dw;
        lo = j->pl > 0 ? min_i64(ow, cdiv(j->pl, j->sw)) : 0;
        hi = max_i64(lo, last < 0 ? 0 : min_i64(ow, last / j->sw + 1));
    }
    for (li = 0; li < rows; ++li) {
        for (r = 0; r < kh; ++r) {
            const int64_t u = li * j->sh + r * j->dh, ih = ih0 + u;
            rp[r] = img == NULL ? win + u * j->vw * 16
                    : ih >= 0 && ih < j->h ? img + ih * j->w * 16 : win;
        }
        for (jx = 0; jx < lo; ++jx)
            c16_px(1, K, 1, j, rp, off, wts, wk, bias, li, jx, tb, res);
        for (; jx + 8 <= hi; jx += 8)
            c16_px(8, K, 0, j, rp, off, wts, wk, bias, li, jx, tb, res);
        if (jx + 4 <= hi) {
            c16_px(4, K, 0, j, rp, off, wts, wk, bias, li, jx, tb, res);
            jx += 4;
        }
        if (jx + 2 <= hi) {
            c16_px(2, K, 0, j, rp, off, wts, wk, bias, li, jx, tb, res);
            jx += 2;
        }
        if (jx < hi) {
            c16_px(1, K, 0, j, rp, off, wts, wk, bias, li, jx, tb, res);
            ++jx;
        }
        for (; jx < ow; ++jx)
            c16_px(1, K, 1, j, rp, off, wts, wk, bias, li, jx, tb, res);
    }
}

/* Unit: image n, channels [c0, c0 + 16) (those below C), output rows
 * [i0, i1). */
static void c16_unit(const dw_job *j, int64_t n, int64_t c0, int64_t i0,
                     int64_t i1, float *scratch)
{
    const int64_t nc = min_i64(16, j->c - c0), rows = i1 - i0, p = j->oh * j->ow;
    const int64_t rin = (rows - 1) * j->sh + (j->kh - 1) * j->dh + 1;
    const int64_t hw = j->h * j->w, npx = rows * j->ow;
    const int64_t at = (n * j->c + c0) * p + i0 * j->ow * 16; /* a blocked y's */
    float *win = scratch, *wts = scratch + j->c16_wts, *tb = scratch + j->c16_tb;
    float *out = j->yb ? j->y + at : tb;
    const float *res = j->yb && j->uses_residual ? j->residual + at : NULL;
    int64_t t, q0;
    int l;
    dw_span s;
    for (t = 0; t < j->ntaps; ++t)
        for (l = 0; l < 16; ++l)
            wts[t * 16 + l] = l < nc ? j->wt[(c0 + l) * j->ntaps + t] : 0.0f;
    for (l = 0; l < 16; ++l) /* then the biases */
        wts[j->ntaps * 16 + l] = l < nc && j->has_bias ? j->bias[c0 + l] : 0.0f;
    const float **rp = (const float **)(void *)(scratch + j->c16_rp);
    const float *img = hw > 0 ? j->x + (n * j->c + c0) * hw : NULL;
    const int64_t ih0 = i0 * j->sh - j->pt;
    if (j->xb && img != NULL) {
        /* NCHW16c: read in place, through a row of zeros where the taps
         * leave the image's rows */
        if (ih0 < 0 || ih0 + rin > j->h)
            for (t = 0; t < j->vw - min_i64(j->pl, 0); ++t)
                _mm512_store_ps(win + t * 16, _mm512_setzero_ps());
    } else {
        c16_fill(j, img, nc, ih0, rin, win, tb);
        img = NULL;
    }
    if (j->kh == 3 && j->kw == 3)
        c16_sums(3, j, win, img, ih0, rp, wts, rows, out, res);
    else if (j->kh == 5 && j->kw == 5)
        c16_sums(5, j, win, img, ih0, rp, wts, rows, out, res);
    else
        c16_sums(0, j, win, img, ih0, rp, wts, rows, out, res);
    if (j->yb)
        return; /* the chain is done (no operation is left for after it) */
    /* the operations from the first residual on, per channel */
    memset(&s, 0, sizeof(s));
    s.npre = j->npre - j->c16_npre;
    s.pre = j->pre + j->c16_npre;
    for (q0 = 0; q0 < npx; q0 += 16) {
        const int64_t cnt = min_i64(16, npx - q0);
        const __mmask16 m = (__mmask16)((1u << cnt) - 1u);
        __m512 r[16];
        int k;
#pragma GCC unroll 16
        for (k = 0; k < 16; ++k)
            r[k] = _mm512_load_ps(tb + (q0 + k) * 16);
        tb_transpose16(r);
        if (s.npre == 0) {
            /* nothing after the transpose: the stores alone */
            float *yb = j->y + (n * j->c + c0) * p + i0 * j->ow + q0;
#pragma GCC unroll 16
            for (l = 0; l < 16; ++l)
                if (l < nc) {
                    if (cnt == 16)
                        _mm512_storeu_ps(yb + l * p, r[l]);
                    else
                        _mm512_mask_storeu_ps(yb + l * p, m, r[l]);
                }
            continue;
        }
#pragma GCC unroll 16
        for (l = 0; l < 16; ++l)
            if (l < nc) {
                const int64_t plane = (n * j->c + c0 + l) * p + i0 * j->ow;
                s.res = j->uses_residual ? j->residual + plane : NULL;
                if (cnt == 16)
                    _mm512_storeu_ps(j->y + plane + q0,
                                     pre_avx512(&s, r[l], q0, (__mmask16)0xFFFF));
                else
                    _mm512_mask_storeu_ps(j->y + plane + q0, m,
                                          pre_avx512(&s, r[l], q0, m));
            }
    }
    for (l = 0; l < nc; ++l)
        chain_rest(j, (n * j->c + c0 + l) * p, i0, rows);
}

#pragma GCC pop_options

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
    if (isa == &tb_isa_avx512) {
        f.span = span_avx512;
        f.plane = plane_avx512;
        f.fallback = fallback_avx512;
    } else if (isa == &tb_isa_avx2) {
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
        c16_unit(j, t / j->nblk, t % j->nblk * 16, i0, min_i64(j->oh, i0 + j->rows),
                 scratch);
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

/* Sets up the channels-in-lanes path (AVX-512) where it is taken: returns
 * its units, 0 where the planes are used. */
static int64_t c16_rows(dw_job *j, int want, const char *env)
{
    double fixed, per_row, rmax;
    if (j->isa != &tb_isa_avx512)
        return 0;
    /* Measured (3x3, 1 and 2 threads): channels in lanes 1.2x to 3x faster
     * at stride 2 and on rows under 40 pixels, about 1.2x at 48 and 56 and
     * 1.05x at 112 at stride 1 in whole blocks of 16 channels; the planes
     * faster on wider rows (128 to 224) and with a partly empty block on
     * wide rows. Fewer than 8 channels would leave most lanes empty. */
    if (env != NULL && (env[0] == 'p' || env[0] == 's'))
        return 0;
    if (!(env != NULL && env[0] == 'c') && !j->xb && !j->yb &&
        (j->c < 8 || (j->sh == 1 && j->sw == 1 && j->ow >= 40 &&
                      (j->c % 16 != 0 || j->ow > 112))))
        return 0;
    j->vw = (j->ow - 1) * j->sw + (j->kw - 1) * j->dw + 1;
    /* floats: the window's rows, the weights, the staging area */
    per_row = 16.0 * ((double)j->sh * (double)j->vw + (double)j->ow);
    fixed = 16.0 * (((double)(j->kh - 1) * (double)j->dh + 1 - (double)j->sh) *
                        (double)j->vw + (double)j->ntaps + 17 +
                    (double)max_i64(0, -j->pl)) + 2.0 * (double)j->kh + 80;
    rmax = ((double)DW_C16_FLOATS - fixed) / per_row;
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

    /* Output rows per unit: a window of about DW_WINDOW_FLOATS, fewer when the
     * planes are too few to keep the threads busy. */
    j.fallback = window_floats(&j, 1) > (double)TB_SCRATCH_FLOATS ||
                 (env != NULL && env[0] == 's');
    if (j.fallback) {
        j.rows = oh;
    } else {
        j.rows = 1;
        while (j.rows < oh && window_floats(&j, j.rows * 2) <= DW_WINDOW_FLOATS)
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
        j.nwin = min_i64(j.group, max_i64(1, (int64_t)(2.0 * DW_WINDOW_FLOATS / wsize)));
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
