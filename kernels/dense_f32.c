/*
 * dense_f32.c - float32 dense kernels: C = A @ op(W) (+ bias), followed by
 * an optional elementwise epilogue. See tirbyoc_kernels.h for the ABI.
 *
 * The four exported functions are thin wrappers around one static
 * implementation, dense_f32(), parameterized by W's layout and the epilogue.
 *
 * Plain C99 that the compiler auto-vectorizes for whatever baseline ISA it
 * targets. The code is shaped so that the vectorized loops never need to
 * reorder a floating-point sum (which -O3 without -ffast-math may not do):
 *
 *   Main path ("row update"): K is cut into blocks of TB_KC and N into
 *   blocks of TB_NB columns. For a block, op(W) is viewed as TB_KC rows of
 *   TB_NB contiguous floats: for "nn" that is W itself, for "nt" the slice
 *   is first transposed ("packed") into a stack buffer. Then for every
 *   group of TB_MR rows of A, each k updates TB_MR accumulator rows with
 *   a[i][k] * w_row[k][:], a loop that is vectorized along the columns and
 *   shares every loaded W vector among TB_MR rows. The accumulators are a
 *   small local tile that stays in L1; earlier K blocks leave partial sums
 *   in C, and the last K block adds bias and applies the epilogue.
 *
 *   "nt" with few rows (fewer than TB_NT_DOT_ROWS): packing would cost
 *   about as much as the product itself, so each output is a dot product of
 *   two contiguous rows, with TB_LANES explicit partial sums that map onto
 *   vector lanes.
 *
 * No heap allocation, no mutable globals: scratch space (about 33 KiB per
 * call) is on the stack.
 */
#include <stddef.h>
#include <stdint.h>

#include "tirbyoc_kernels.h"

/* Rows of A per register/L1 tile: each loaded W vector feeds TB_MR rows. */
#define TB_MR 4
/* Columns per block: TB_MR x TB_NB accumulators (1 KiB) stay in L1. */
#define TB_NB 64
/* K per block: the packed TB_KC x TB_NB panel is 32 KiB. */
#define TB_KC 128
/* Independent partial sums in the dot-product path. */
#define TB_LANES 8
/* "nt" with fewer rows than this uses dot products: below it, transposing
 * W costs more than the row-update loop gains (measured crossover). */
#define TB_NT_DOT_ROWS 16

typedef enum { LAYOUT_NT, LAYOUT_NN } layout_t;

/* To add an epilogue: add an enumerator here, a case in apply_epilogue(),
 * and the exported wrappers at the bottom (plus their declarations). */
typedef enum { EPILOGUE_NONE, EPILOGUE_RELU } epilogue_t;

static int64_t min_i64(int64_t x, int64_t y) { return x < y ? x : y; }

/* Elementwise activation over a row of finished outputs. */
static void apply_epilogue(float *restrict v, int64_t n, epilogue_t epi)
{
    int64_t j;
    switch (epi) {
    case EPILOGUE_NONE:
        break;
    case EPILOGUE_RELU:
        /* "negative -> 0" rather than "positive -> keep": NaN passes through. */
        for (j = 0; j < n; ++j)
            v[j] = v[j] < 0.0f ? 0.0f : v[j];
        break;
    }
}

/*
 * Moves one accumulator row into C. The first K block overwrites C, later
 * blocks add to it; the last one also adds bias (already offset to this
 * column block, or NULL) and applies the epilogue.
 */
static void store_row(float *restrict c, const float *restrict acc, int64_t nb,
                      int first, int last, const float *restrict bias,
                      epilogue_t epi)
{
    int64_t j;
    if (first)
        for (j = 0; j < nb; ++j)
            c[j] = acc[j];
    else
        for (j = 0; j < nb; ++j)
            c[j] += acc[j];
    if (last) {
        if (bias != NULL)
            for (j = 0; j < nb; ++j)
                c[j] += bias[j];
        apply_epilogue(c, nb, epi);
    }
}

/* panel[p][j] = W[j0 + j][k0 + p] for "nt" W ([N, K], row stride ldw). */
static void pack_nt(const float *restrict w, int64_t ldw, int64_t k0,
                    int64_t kc, int64_t j0, int64_t nb,
                    float *restrict panel)
{
    int64_t p, j;
    for (j = 0; j < nb; ++j) {
        const float *restrict src = w + (j0 + j) * ldw + k0;
        for (p = 0; p < kc; ++p)
            panel[p * TB_NB + j] = src[p];
    }
}

/*
 * C[0:TB_MR, 0:nb] (+)= A[0:TB_MR, 0:kc] @ B[0:kc, 0:nb], where B row p is
 * b + p * ldb (contiguous along the columns).
 */
static void tile_rows(int64_t kc, const float *restrict a, int64_t lda,
                      const float *restrict b, int64_t ldb,
                      float *restrict c, int64_t ldc, int64_t nb, int first,
                      int last, const float *restrict bias, epilogue_t epi)
{
    float acc[TB_MR][TB_NB];
    float *restrict c0 = acc[0];
    float *restrict c1 = acc[1];
    float *restrict c2 = acc[2];
    float *restrict c3 = acc[3];
    int64_t p, j;
    int r;

    for (j = 0; j < nb; ++j)
        c0[j] = c1[j] = c2[j] = c3[j] = 0.0f;
    for (p = 0; p < kc; ++p) {
        const float *restrict bp = b + p * ldb;
        const float x0 = a[p];
        const float x1 = a[lda + p];
        const float x2 = a[2 * lda + p];
        const float x3 = a[3 * lda + p];
        for (j = 0; j < nb; ++j) {
            const float bj = bp[j];
            c0[j] += x0 * bj;
            c1[j] += x1 * bj;
            c2[j] += x2 * bj;
            c3[j] += x3 * bj;
        }
    }
    for (r = 0; r < TB_MR; ++r)
        store_row(c + r * ldc, acc[r], nb, first, last, bias, epi);
}

/* Same as tile_rows() for a single row (rows left over after TB_MR groups). */
static void tile_row(int64_t kc, const float *restrict a,
                     const float *restrict b, int64_t ldb,
                     float *restrict c, int64_t nb, int first, int last,
                     const float *restrict bias, epilogue_t epi)
{
    float acc[TB_NB];
    int64_t p, j;

    for (j = 0; j < nb; ++j)
        acc[j] = 0.0f;
    for (p = 0; p < kc; ++p) {
        const float *restrict bp = b + p * ldb;
        const float x = a[p];
        for (j = 0; j < nb; ++j)
            acc[j] += x * bp[j];
    }
    store_row(c, acc, nb, first, last, bias, epi);
}

/* sum(x[0:k] * y[0:k]) with TB_LANES independent partial sums. */
static float dot(int64_t k, const float *restrict x, const float *restrict y)
{
    float s[TB_LANES];
    float total = 0.0f;
    int64_t p;
    int l;

    for (l = 0; l < TB_LANES; ++l)
        s[l] = 0.0f;
    for (p = 0; p + TB_LANES <= k; p += TB_LANES)
        for (l = 0; l < TB_LANES; ++l)
            s[l] += x[p + l] * y[p + l];
    for (l = 0; l < TB_LANES; ++l)
        total += s[l];
    for (; p < k; ++p)
        total += x[p] * y[p];
    return total;
}

/* "nt" for few rows: every output is a dot product of an A row and a W row. */
static void dense_nt_dots(epilogue_t epi, int64_t m, int64_t n, int64_t k,
                          const float *restrict a, int64_t lda,
                          const float *restrict w, int64_t ldw,
                          const float *restrict bias, float *restrict c,
                          int64_t ldc)
{
    int64_t i, j0, j;
    /* Column blocks keep TB_NB rows of W cache-resident across the A rows. */
    for (j0 = 0; j0 < n; j0 += TB_NB) {
        const int64_t nb = min_i64(TB_NB, n - j0);
        for (i = 0; i < m; ++i) {
            float *restrict row = c + i * ldc + j0;
            for (j = 0; j < nb; ++j)
                row[j] = dot(k, a + i * lda, w + (j0 + j) * ldw);
            if (bias != NULL)
                for (j = 0; j < nb; ++j)
                    row[j] += bias[j0 + j];
            apply_epilogue(row, nb, epi);
        }
    }
}

static int args_valid(layout_t layout, int64_t m, int64_t n, int64_t k,
                      const float *a, int64_t lda, const float *w,
                      int64_t ldw, const float *c, int64_t ldc)
{
    const int64_t w_row_len = layout == LAYOUT_NT ? k : n;
    if (m < 0 || n < 0 || k < 0)
        return 0;
    if (lda < k || ldw < w_row_len || ldc < n)
        return 0;
    /* A matrix pointer may only be NULL when that matrix is empty. */
    if ((a == NULL && m > 0 && k > 0) || (w == NULL && n > 0 && k > 0) ||
        (c == NULL && m > 0 && n > 0))
        return 0;
    return 1;
}

static int32_t dense_f32(layout_t layout, epilogue_t epi, int64_t m,
                         int64_t n, int64_t k, const float *restrict a,
                         int64_t lda, const float *restrict w, int64_t ldw,
                         const float *restrict bias, float *restrict c,
                         int64_t ldc)
{
    float panel[TB_KC * TB_NB];
    int64_t i, j, j0, k0;

    if (!args_valid(layout, m, n, k, a, lda, w, ldw, c, ldc))
        return TIRBYOC_EINVAL;
    if (m == 0 || n == 0)
        return TIRBYOC_OK;

    if (k == 0) {
        /* Empty reduction: the result is the bias (or 0), activated. */
        for (i = 0; i < m; ++i) {
            float *restrict row = c + i * ldc;
            for (j = 0; j < n; ++j)
                row[j] = bias != NULL ? bias[j] : 0.0f;
            apply_epilogue(row, n, epi);
        }
        return TIRBYOC_OK;
    }

    if (layout == LAYOUT_NT && m < TB_NT_DOT_ROWS) {
        dense_nt_dots(epi, m, n, k, a, lda, w, ldw, bias, c, ldc);
        return TIRBYOC_OK;
    }

    for (k0 = 0; k0 < k; k0 += TB_KC) {
        const int64_t kc = min_i64(TB_KC, k - k0);
        const int first = k0 == 0;
        const int last = k0 + kc == k;
        for (j0 = 0; j0 < n; j0 += TB_NB) {
            const int64_t nb = min_i64(TB_NB, n - j0);
            const float *restrict bias_j =
                (last && bias != NULL) ? bias + j0 : NULL;
            const float *b;
            int64_t ldb;
            if (layout == LAYOUT_NN) {
                /* W rows are already contiguous along the output columns. */
                b = w + k0 * ldw + j0;
                ldb = ldw;
            } else {
                pack_nt(w, ldw, k0, kc, j0, nb, panel);
                b = panel;
                ldb = TB_NB;
            }
            for (i = 0; i + TB_MR <= m; i += TB_MR)
                tile_rows(kc, a + i * lda + k0, lda, b, ldb, c + i * ldc + j0,
                          ldc, nb, first, last, bias_j, epi);
            for (; i < m; ++i)
                tile_row(kc, a + i * lda + k0, b, ldb, c + i * ldc + j0, nb,
                         first, last, bias_j, epi);
        }
    }
    return TIRBYOC_OK;
}

int32_t tirbyoc_dense_f32_nt(int64_t m, int64_t n, int64_t k, const float *a,
                             int64_t lda, const float *w, int64_t ldw,
                             const float *bias, float *c, int64_t ldc)
{
    return dense_f32(LAYOUT_NT, EPILOGUE_NONE, m, n, k, a, lda, w, ldw, bias,
                     c, ldc);
}

int32_t tirbyoc_dense_relu_f32_nt(int64_t m, int64_t n, int64_t k,
                                  const float *a, int64_t lda, const float *w,
                                  int64_t ldw, const float *bias, float *c,
                                  int64_t ldc)
{
    return dense_f32(LAYOUT_NT, EPILOGUE_RELU, m, n, k, a, lda, w, ldw, bias,
                     c, ldc);
}

int32_t tirbyoc_dense_f32_nn(int64_t m, int64_t n, int64_t k, const float *a,
                             int64_t lda, const float *w, int64_t ldw,
                             const float *bias, float *c, int64_t ldc)
{
    return dense_f32(LAYOUT_NN, EPILOGUE_NONE, m, n, k, a, lda, w, ldw, bias,
                     c, ldc);
}

int32_t tirbyoc_dense_relu_f32_nn(int64_t m, int64_t n, int64_t k,
                                  const float *a, int64_t lda, const float *w,
                                  int64_t ldw, const float *bias, float *c,
                                  int64_t ldc)
{
    return dense_f32(LAYOUT_NN, EPILOGUE_RELU, m, n, k, a, lda, w, ldw, bias,
                     c, ldc);
}

/* ---- Pre-packed weights (layout documented in tirbyoc_kernels.h) ---- */

#define PACK_NR TIRBYOC_PACK_NR

int64_t tirbyoc_packed_weight_size_f32(int64_t n, int64_t k)
{
    int64_t panels;
    if (n < 0 || k < 0)
        return -1;
    if (n == 0 || k == 0)
        return 0;
    panels = n / PACK_NR + (n % PACK_NR != 0);
    if (panels > INT64_MAX / PACK_NR / k)
        return -1;
    return panels * PACK_NR * k;
}

static int32_t pack_weight(layout_t layout, int64_t n, int64_t k,
                           const float *restrict w, int64_t ldw,
                           float *restrict packed)
{
    int64_t size = tirbyoc_packed_weight_size_f32(n, k);
    int64_t q, p, r;
    if (size < 0 || ldw < (layout == LAYOUT_NT ? k : n))
        return TIRBYOC_EINVAL;
    if (size == 0)
        return TIRBYOC_OK;
    if (w == NULL || packed == NULL)
        return TIRBYOC_EINVAL;
    for (q = 0; q * PACK_NR < n; ++q) {
        float *restrict panel = packed + q * PACK_NR * k;
        for (p = 0; p < k; ++p)
            for (r = 0; r < PACK_NR; ++r) {
                const int64_t j = q * PACK_NR + r;
                panel[p * PACK_NR + r] =
                    j >= n ? 0.0f
                           : (layout == LAYOUT_NT ? w[j * ldw + p]
                                                  : w[p * ldw + j]);
            }
    }
    return TIRBYOC_OK;
}

int32_t tirbyoc_pack_weight_f32_nt(int64_t n, int64_t k, const float *w,
                                   int64_t ldw, float *packed)
{
    return pack_weight(LAYOUT_NT, n, k, w, ldw, packed);
}

int32_t tirbyoc_pack_weight_f32_nn(int64_t n, int64_t k, const float *w,
                                   int64_t ldw, float *packed)
{
    return pack_weight(LAYOUT_NN, n, k, w, ldw, packed);
}

static int32_t dense_packed(epilogue_t epi, int64_t m, int64_t n, int64_t k,
                            const float *restrict a, int64_t lda,
                            const float *restrict packed,
                            const float *restrict bias, float *restrict c,
                            int64_t ldc)
{
    int64_t i, q, p, r;
    if (m < 0 || n < 0 || k < 0 || lda < k || ldc < n)
        return TIRBYOC_EINVAL;
    if ((a == NULL && m > 0 && k > 0) || (packed == NULL && n > 0 && k > 0) ||
        (c == NULL && m > 0 && n > 0))
        return TIRBYOC_EINVAL;
    for (i = 0; i < m; ++i) {
        float *restrict row = c + i * ldc;
        for (q = 0; q * PACK_NR < n; ++q) {
            const float *restrict panel = packed + q * PACK_NR * k;
            const int64_t nb = min_i64(PACK_NR, n - q * PACK_NR);
            float acc[PACK_NR];
            for (r = 0; r < PACK_NR; ++r)
                acc[r] = 0.0f;
            for (p = 0; p < k; ++p) {
                const float x = a[i * lda + p];
                for (r = 0; r < PACK_NR; ++r)
                    acc[r] += x * panel[p * PACK_NR + r];
            }
            for (r = 0; r < nb; ++r)
                row[q * PACK_NR + r] =
                    acc[r] + (bias != NULL ? bias[q * PACK_NR + r] : 0.0f);
        }
        apply_epilogue(row, n, epi);
    }
    return TIRBYOC_OK;
}

int32_t tirbyoc_dense_f32_packed(int64_t m, int64_t n, int64_t k,
                                 const float *a, int64_t lda,
                                 const float *packed, const float *bias,
                                 float *c, int64_t ldc)
{
    return dense_packed(EPILOGUE_NONE, m, n, k, a, lda, packed, bias, c, ldc);
}

int32_t tirbyoc_dense_relu_f32_packed(int64_t m, int64_t n, int64_t k,
                                      const float *a, int64_t lda,
                                      const float *packed, const float *bias,
                                      float *c, int64_t ldc)
{
    return dense_packed(EPILOGUE_RELU, m, n, k, a, lda, packed, bias, c, ldc);
}
