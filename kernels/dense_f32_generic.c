/*
 * dense_f32_generic.c - portable C building blocks of the float32 dense
 * kernels (see dense_f32_internal.h), used on CPUs without AVX2/FMA.
 *
 * C with GNU vector extensions (4-float vectors, SSE2 on baseline x86-64)
 * in the hot loops and plain loops elsewhere, which the compiler may
 * auto-vectorize. Vectors only run independent outputs side by side: every
 * output keeps one running sum over k in order (separate multiply and add,
 * no FMA).
 */
#include "dense_f32_internal.h"
#include "chain_f32.h"

#define G_MR 4

static int64_t min_i64(int64_t x, int64_t y) { return x < y ? x : y; }

/* GNU C vector extension: 4 floats, which the compiler maps onto the
 * baseline SIMD registers (SSE on x86-64) or plain scalars elsewhere. */
typedef float v4f __attribute__((vector_size(16)));

static v4f load4(const float *p)
{
    v4f v;
    __builtin_memcpy(&v, p, sizeof(v));
    return v;
}

/*
 * Eight columns of the tile (the 16-column tile takes two passes, so the
 * 4 x 8 accumulators fit in 16 SIMD registers next to the W vectors).
 * out[i][0:8] = sum over p of ap[p * mr + i] * wp[p * 16 + 0:8], with one
 * multiply and one add per term, in order of p.
 */
static void half_tile(int64_t kc, const float *restrict ap, int mr,
                      const float *restrict wp, float out[G_MR][8])
{
    v4f acc[G_MR][2];
    int64_t p;
    int i;
    for (i = 0; i < G_MR; ++i)
        acc[i][0] = acc[i][1] = (v4f){0.0f, 0.0f, 0.0f, 0.0f};
    if (mr == G_MR) {
        for (p = 0; p < kc; ++p) {
            const v4f w0 = load4(wp + p * TB_NR), w1 = load4(wp + p * TB_NR + 4);
            for (i = 0; i < G_MR; ++i) {
                const float x = ap[p * G_MR + i];
                acc[i][0] += x * w0;
                acc[i][1] += x * w1;
            }
        }
    } else {
        for (p = 0; p < kc; ++p) {
            const v4f w0 = load4(wp + p * TB_NR), w1 = load4(wp + p * TB_NR + 4);
            for (i = 0; i < mr; ++i) {
                const float x = ap[p * mr + i];
                acc[i][0] += x * w0;
                acc[i][1] += x * w1;
            }
        }
    }
    for (i = 0; i < mr; ++i) {
        __builtin_memcpy(out[i], &acc[i][0], sizeof(v4f));
        __builtin_memcpy(out[i] + 4, &acc[i][1], sizeof(v4f));
    }
}

static void ukernel(int64_t kc, const float *restrict ap,
                    const float *restrict wp, int64_t wps, float *restrict c,
                    int64_t ldc, int mr, int nr, int flags,
                    const tb_chain *ch, int64_t ci, int64_t cj)
{
    float acc[G_MR][TB_NR];
    float half[G_MR][8];
    int h, i, j;

    (void)wps; /* one panel: nr <= 16 */
    for (h = 0; h * 8 < nr; ++h) {
        half_tile(kc, ap, mr, wp + h * 8, half);
        for (i = 0; i < mr; ++i)
            for (j = 0; j < 8; ++j)
                acc[i][h * 8 + j] = half[i][j];
    }
    /* Same order as the SIMD paths: partial sum + C, then the chain. */
    for (i = 0; i < mr; ++i) {
        float *restrict row = c + i * ldc;
        if (flags & TB_ACCUMULATE)
            for (j = 0; j < nr; ++j)
                acc[i][j] += row[j];
        if ((flags & TB_LAST) && ch != NULL) {
            /* the finished row of the tile through the chain, stored once */
            ch_vf t[TB_NR / CH_LANES];
            __builtin_memcpy(t, acc[i], sizeof(t));
            tb_chain_tile(ch, ch->ops, t, 1, TB_NR / CH_LANES, ci + i, cj, nr, 0);
            __builtin_memcpy(acc[i], t, sizeof(t));
        }
        for (j = 0; j < nr; ++j)
            row[j] = acc[i][j];
    }
}

static void pack_a(int64_t mr, int64_t kc, const float *restrict a,
                   int64_t lda, float *restrict ap)
{
    int64_t i, p;
    for (i = 0; i < mr; ++i)
        for (p = 0; p < kc; ++p)
            ap[p * mr + i] = a[i * lda + p];
}

static void pack_w(tb_wlayout layout, int64_t kc, int64_t nc,
                   const float *restrict w, int64_t ldw, float *restrict dst,
                   int64_t dps)
{
    int64_t q, p, r;
    if (layout == TB_W_NT) {
        for (q = 0; q * TB_NR < nc; ++q) {
            float *restrict panel = dst + q * dps;
            const int64_t nb = min_i64(TB_NR, nc - q * TB_NR);
            for (r = 0; r < nb; ++r) {
                const float *restrict src = w + (q * TB_NR + r) * ldw;
                for (p = 0; p < kc; ++p)
                    panel[p * TB_NR + r] = src[p];
            }
            for (; r < TB_NR; ++r)
                for (p = 0; p < kc; ++p)
                    panel[p * TB_NR + r] = 0.0f;
        }
    } else {
        /* Row by row, so that W is read sequentially. */
        for (p = 0; p < kc; ++p) {
            const float *restrict src = w + p * ldw;
            for (q = 0; q * TB_NR < nc; ++q) {
                float *restrict out = dst + q * dps + p * TB_NR;
                const int64_t nb = min_i64(TB_NR, nc - q * TB_NR);
                for (r = 0; r < nb; ++r)
                    out[r] = src[q * TB_NR + r];
                for (; r < TB_NR; ++r)
                    out[r] = 0.0f;
            }
        }
    }
}

/* Independent partial sums of a dot product (vector lanes). */
#define G_LANES 8

static float dot(int64_t k, const float *restrict x, const float *restrict y)
{
    float s[G_LANES];
    float total = 0.0f;
    int64_t p;
    int l;

    for (l = 0; l < G_LANES; ++l)
        s[l] = 0.0f;
    for (p = 0; p + G_LANES <= k; p += G_LANES)
        for (l = 0; l < G_LANES; ++l)
            s[l] += x[p + l] * y[p + l];
    for (l = 0; l < G_LANES; ++l)
        total += s[l];
    for (; p < k; ++p)
        total += x[p] * y[p];
    return total;
}

/* Columns per block of the row-streaming loops. */
#define G_NB 64

static void small(tb_wlayout layout, int64_t m, int64_t n, int64_t k,
                  const float *restrict a, int64_t lda,
                  const float *restrict w, int64_t ldw, float *restrict c,
                  int64_t ldc, const tb_chain *ch, int64_t ci, int64_t cj)
{
    float acc[G_NB] = {0.0f}; /* lanes past n stay 0 for the chain */
    int64_t i, j0, j, p;

    for (j0 = 0; j0 < n; j0 += G_NB) {
        const int64_t nb = min_i64(G_NB, n - j0);
        for (i = 0; i < m; ++i) {
            const float *restrict x = a + i * lda;
            if (layout == TB_W_NT) {
                for (j = 0; j < nb; ++j)
                    acc[j] = dot(k, x, w + (j0 + j) * ldw);
            } else if (layout == TB_W_NN) {
                for (j = 0; j < nb; ++j)
                    acc[j] = 0.0f;
                for (p = 0; p < k; ++p) {
                    const float *restrict wr = w + p * ldw + j0;
                    for (j = 0; j < nb; ++j)
                        acc[j] += x[p] * wr[j];
                }
            } else {
                /* G_NB is a multiple of 16: whole panels, padded with 0. */
                int64_t q;
                for (q = 0; q * TB_NR < nb; ++q) {
                    const float *restrict panel = w + (j0 / TB_NR + q) * ldw;
                    v4f s0 = {0.0f, 0.0f, 0.0f, 0.0f}, s1 = s0, s2 = s0, s3 = s0;
                    for (p = 0; p < k; ++p) {
                        const float *restrict wr = panel + p * TB_NR;
                        s0 += x[p] * load4(wr);
                        s1 += x[p] * load4(wr + 4);
                        s2 += x[p] * load4(wr + 8);
                        s3 += x[p] * load4(wr + 12);
                    }
                    __builtin_memcpy(acc + q * TB_NR, &s0, sizeof(v4f));
                    __builtin_memcpy(acc + q * TB_NR + 4, &s1, sizeof(v4f));
                    __builtin_memcpy(acc + q * TB_NR + 8, &s2, sizeof(v4f));
                    __builtin_memcpy(acc + q * TB_NR + 12, &s3, sizeof(v4f));
                }
            }
            if (ch != NULL) {
                ch_vf t[G_NB / CH_LANES];
                __builtin_memcpy(t, acc, sizeof(t));
                tb_chain_tile(ch, ch->ops, t, 1, G_NB / CH_LANES, ci + i, cj + j0, nb, 0);
                __builtin_memcpy(acc, t, sizeof(t));
            }
            for (j = 0; j < nb; ++j)
                c[i * ldc + j0 + j] = acc[j];
        }
    }
}

/* Conservative blocks for unknown caches: a 4 x 256 A panel (4 KiB) and a
 * 256 x 256 W block (256 KiB). */
#define ISA_KC 256
#define ISA_NC 256
/* The scratch buffer (threads.c) is sized for the largest blocks. */
typedef char check_blocks[ISA_KC <= TB_KC_MAX && ISA_NC <= TB_NC_MAX &&
                                  G_MR <= TB_MR_MAX
                              ? 1
                              : -1];

/* ---- the convolution's implicit im2col (portable loads) ---- */

#include "conv_gather.h"
#include "conv_winograd.h"


const tb_isa tb_isa_generic = {
    "generic", G_MR, TB_NR, ISA_KC, ISA_NC, ukernel, pack_a, pack_w, small,
    NULL, 0, 0, 0, /* no nt_direct: nt goes through the blocked path */
    tb_chain_block, tb_unary_row, tb_softmax_row, tb_attn_row, tb_conv_gather,
    NULL, NULL, tb_wino_in, tb_wino_out, NULL, NULL, NULL, NULL, NULL, NULL, 0, 0,
};
