/*
 * dense_f32_generic.c - portable C building blocks of the float32 dense
 * kernels (see dense_f32_internal.h), used on CPUs without AVX2/FMA.
 *
 * Plain C that the compiler auto-vectorizes for the baseline ISA (SSE2 on
 * x86-64). The loops are shaped so that vectorizing them never reorders a
 * floating-point sum: every output keeps one running sum over k in order.
 */
#include "dense_f32_internal.h"

#define G_MR 4

static int64_t min_i64(int64_t x, int64_t y) { return x < y ? x : y; }

static void ukernel(int64_t kc, const float *restrict ap,
                    const float *restrict wp, int64_t wps, float *restrict c,
                    int64_t ldc, int mr, int nr, int flags,
                    const float *restrict bias, int epi)
{
    float acc[G_MR][TB_NR];
    int64_t p;
    int i, j;

    (void)wps; /* one panel: nr <= 16 */
    for (i = 0; i < mr; ++i)
        for (j = 0; j < TB_NR; ++j)
            acc[i][j] = (flags & TB_ACCUMULATE) && j < nr ? c[i * ldc + j]
                                                          : 0.0f;
    if (mr == G_MR) {
        /* Fixed trip counts keep the tile in registers where possible. */
        for (p = 0; p < kc; ++p) {
            const float *restrict w = wp + p * TB_NR;
            const float *restrict x = ap + p * G_MR;
            for (i = 0; i < G_MR; ++i)
                for (j = 0; j < TB_NR; ++j)
                    acc[i][j] += x[i] * w[j];
        }
    } else {
        for (p = 0; p < kc; ++p) {
            const float *restrict w = wp + p * TB_NR;
            for (i = 0; i < mr; ++i) {
                const float x = ap[p * mr + i];
                for (j = 0; j < TB_NR; ++j)
                    acc[i][j] += x * w[j];
            }
        }
    }
    for (i = 0; i < mr; ++i) {
        float *restrict row = c + i * ldc;
        if (flags & TB_LAST) {
            for (j = 0; j < nr; ++j)
                row[j] = tb_epi_scalar(
                    bias != NULL ? acc[i][j] + bias[j] : acc[i][j], epi);
        } else {
            for (j = 0; j < nr; ++j)
                row[j] = acc[i][j];
        }
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
                  const float *restrict w, int64_t ldw,
                  const float *restrict bias, float *restrict c, int64_t ldc,
                  int epi)
{
    float acc[G_NB];
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
                    float *restrict s = acc + q * TB_NR;
                    for (j = 0; j < TB_NR; ++j)
                        s[j] = 0.0f;
                    for (p = 0; p < k; ++p)
                        for (j = 0; j < TB_NR; ++j)
                            s[j] += x[p] * panel[p * TB_NR + j];
                }
            }
            for (j = 0; j < nb; ++j)
                c[i * ldc + j0 + j] = tb_epi_scalar(
                    bias != NULL ? acc[j] + bias[j0 + j] : acc[j], epi);
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

const tb_isa tb_isa_generic = {
    "generic", G_MR, TB_NR, ISA_KC, ISA_NC, ukernel, pack_a, pack_w, small,
};
