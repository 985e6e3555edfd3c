/*
 * dense_f32.c - the exported float32 dense kernels: C = A @ op(W) (+ bias),
 * followed by an optional elementwise epilogue. See tirbyoc_kernels.h for
 * the ABI and dense_f32_internal.h for the per-ISA building blocks.
 *
 * This file holds what is common to every instruction set: argument
 * checks, the choice between the two algorithms, cache blocking and the
 * split of the work over threads.
 *
 *   Few rows (M <= TB_SMALL_M, or TB_SMALL_M_NT for "nt"): matrix-vector
 *   like work, limited by reading W from memory; the ISA's `small` routine
 *   streams W without packing anything.
 *
 *   "nt" with up to the ISA's direct_m rows, where it has nt_direct, which
 *   packs A transposed instead of W (W's rows are read in place); for a few
 *   dozen rows, transposing W costs about as much as the product.
 *
 *   Otherwise, blocked (BLIS's loop order, see blocked()): for each block of
 *   columns and KC steps of K, W is packed into 16-column panels (or read
 *   in place when pre-packed, which uses the same panel format); for each
 *   block of rows sized to L2 from the cache sizes the CPU reports, A is
 *   packed once into mr-row micro-panels, and the register-tiled
 *   micro-kernel runs each W micro-panel (kept in L1) over all of them.
 *   Partial sums live in C between K blocks.
 *
 * Every path applies the epilogue chain (bias, activations, scale,
 * residual, ...) to each register of finished outputs before storing it,
 * through the same per-ISA function (tb_chain_tile in chain_f32.h).
 *
 * Threads split N (or M when N is narrow), never K, and every output
 * element is computed by the same sequence of operations whatever the
 * split, so results do not depend on the thread count.
 */
#include <stddef.h>
#include <stdint.h>

#include "dense_f32_internal.h"

/* Rows up to which the matrix-vector path is used; for "nt" it also saves
 * transposing W, which pays off up to a few more rows (measured). */
#define TB_SMALL_M 4
#define TB_SMALL_M_NT 8
/* Below this many flops a call stays on the calling thread... */
#define TB_PAR_FLOPS (1.0 * 1024 * 1024)
/* ...unless it takes the few-rows path with at least this many floats of
 * W: that path streams W once, and two cores stream it faster than one
 * (a classifier's 1 x 1024 -> 1000 from L3: 0.09 ms on one, 0.05 ms on
 * two). */
#define TB_PAR_SMALL_W_FLOATS (128.0 * 1024)
/* Columns per thread unit of the small-M path (whole panels). */
#define TB_SMALL_UNIT 64

static int64_t min_i64(int64_t x, int64_t y) { return x < y ? x : y; }
static int64_t cdiv(int64_t x, int64_t y) { return (x + y - 1) / y; }

static int use_small(tb_wlayout layout, int64_t m)
{
    return m <= (layout == TB_W_NT ? TB_SMALL_M_NT : TB_SMALL_M);
}

/* The algorithm of a call, chosen once by dense_run (see the top). */
typedef enum { TB_ALG_SMALL, TB_ALG_DIRECT, TB_ALG_BLOCKED } tb_algorithm;

typedef struct {
    const tb_isa *isa;
    tb_algorithm alg;
    tb_wlayout layout;
    int64_t m, n, k;
    const float *a;
    int64_t lda;
    const float *w;
    int64_t ldw; /* for TB_W_PACKED: floats between panels (16 K, or more) */
    float *c;
    int64_t ldc;
    int accumulate; /* C += A @ op(W): no epilogue */
    const tb_chain *chain; /* NULL: none */
    int split_n;  /* threads take column ranges (else row ranges) */
    int64_t unit; /* granularity of that split */
} job_t;

/* Offsets W to column j0 (a multiple of 16 for packed W). */
static const float *w_at_column(const job_t *job, int64_t j0)
{
    switch (job->layout) {
    case TB_W_NT:
        return job->w + j0 * job->ldw;
    case TB_W_NN:
        return job->w + j0;
    default:
        return job->w + (j0 / TB_NR) * job->ldw;
    }
}

/* The few-rows path: above 4 rows W is read once per group of 4 rows, so go
 * through it in column blocks of about 256 KiB that stay in L2 meanwhile. */
static void small_blocked(const tb_isa *isa, tb_wlayout layout, int64_t m,
                          int64_t n, int64_t k, const float *a, int64_t lda,
                          const float *w, int64_t ldw, float *c, int64_t ldc,
                          const tb_chain *ch, int64_t ci, int64_t cj)
{
    int64_t blk = m <= 4 ? n : (65536 / (k > 0 ? k : 1)) / 64 * 64;
    int64_t j0;
    if (blk < 64)
        blk = 64;
    for (j0 = 0; j0 < n; j0 += blk) {
        const float *wj = layout == TB_W_NT   ? w + j0 * ldw
                          : layout == TB_W_NN ? w + j0
                                              : w + (j0 / TB_NR) * ldw;
        isa->small(layout, m, min_i64(blk, n - j0), k, a, lda, wj, ldw,
                   c + j0, ldc, ch, ci, cj + j0);
    }
}

/* C += A @ op(W) without scratch memory (a fallback; not packed, slow). */
static void accumulate_plain(tb_wlayout layout, int64_t m, int64_t n,
                             int64_t k, const float *a, int64_t lda,
                             const float *w, int64_t ldw, float *c,
                             int64_t ldc)
{
    int64_t i, j, p;
    for (i = 0; i < m; ++i)
        for (j = 0; j < n; ++j) {
            float s = 0.0f;
            for (p = 0; p < k; ++p)
                s += a[i * lda + p] * (layout == TB_W_NT ? w[j * ldw + p]
                                                         : w[p * ldw + j]);
            c[i * ldc + j] += s;
        }
}

/* The blocked algorithm for C[0:m, 0:n]; w and c already offset, C[0, 0]
 * is the output at row ci0, column cj0 of its matrix. acc: C holds values
 * to add to (every K block accumulates).
 *
 * The loops of Goto's algorithm as BLIS orders them: for each block of
 * columns and each K block (W's kc x nc block, packed here unless it comes
 * pre-packed), for each block of rows (A's rows x kc block packed once, in
 * mr-row micro-panels, sized to L2 by tb_rows_per_ablock), for each W
 * micro-panel (kc x nr: it stays in L1), for each row group: one register
 * tile. A's micro-panels stream from L2, so L2 carries mr floats per k step
 * instead of nr. The order of the tiles changes no result: each output is
 * one FMA chain per K block, the blocks added in order. */
static void blocked(const tb_isa *isa, tb_wlayout layout, int acc, int64_t m,
                    int64_t n, int64_t k, const float *a, int64_t lda,
                    const float *w, int64_t ldw, float *c, int64_t ldc,
                    const tb_chain *chain, int64_t ci0, int64_t cj0)
{
    float *scratch = tb_scratch();
    float *wbuf, *abuf;
    int64_t kblocks, mpanels, ncb, jc, kb, per_block;

    /* Equal K blocks and equal row groups: no tiny leftover block. They
     * depend on k and m only, so the rounding does not depend on threads. */
    kblocks = tb_kblocks(k, isa->kc);
    mpanels = cdiv(m, isa->mr);
    per_block = tb_rows_per_ablock(isa->kc, isa->mr, isa->nr) / isa->mr;
    if (per_block > mpanels)
        per_block = mpanels;
    abuf = tb_ablock((size_t)per_block * isa->mr * isa->kc);
    if (scratch == NULL || abuf == NULL) {
        /* No scratch memory: the unpacked paths are slower but need none. */
        if (acc)
            accumulate_plain(layout, m, n, k, a, lda, w, ldw, c, ldc);
        else
            small_blocked(isa, layout, m, n, k, a, lda, w, ldw, c, ldc, chain,
                          ci0, cj0);
        return;
    }
    wbuf = scratch;
    /* Column blocks of about equal width, in whole register tiles, where W
     * is packed here (its buffer holds kc x nc); pre-packed W is read in
     * place, so one block: A is packed once per K block and row block. */
    ncb = layout == TB_W_PACKED ? n
                                : cdiv(cdiv(n, cdiv(n, isa->nc)), isa->nr) * isa->nr;

    for (jc = 0; jc < n; jc += ncb) {
        const int64_t nc = min_i64(ncb, n - jc);
        for (kb = 0; kb < kblocks; ++kb) {
            const int64_t pc = tb_kblock_start(k, kblocks, kb);
            const int64_t kc = tb_kblock_start(k, kblocks, kb + 1) - pc;
            const int flags = (kb > 0 || acc ? TB_ACCUMULATE : 0) |
                              (kb == kblocks - 1 ? TB_LAST : 0);
            const float *wblk;
            int64_t wps, mb;
            if (layout == TB_W_PACKED) {
                wblk = w + (jc / TB_NR) * ldw + pc * TB_NR;
                wps = ldw;
            } else {
                const float *src = layout == TB_W_NT ? w + jc * ldw + pc
                                                     : w + pc * ldw + jc;
                isa->pack_w(layout, kc, nc, src, ldw, wbuf, kc * TB_NR);
                wblk = wbuf;
                wps = kc * TB_NR;
            }
            for (mb = 0; mb < mpanels; mb += per_block) {
                const int64_t mpe = min_i64(mpanels, mb + per_block);
                int64_t mp, jr;
                for (mp = mb; mp < mpe; ++mp) {
                    const int64_t i0 = m * mp / mpanels;
                    isa->pack_a((int)(m * (mp + 1) / mpanels - i0), kc,
                                a + i0 * lda + pc, lda,
                                abuf + (mp - mb) * isa->mr * kc);
                }
                for (jr = 0; jr < nc; jr += isa->nr) {
                    const int nr = (int)min_i64(isa->nr, nc - jr);
                    for (mp = mb; mp < mpe; ++mp) {
                        const int64_t i0 = m * mp / mpanels;
                        const int mr = (int)(m * (mp + 1) / mpanels - i0);
                        /* Pre-packed W is read from memory by the first
                         * tile of each micro-panel only; the rest find it
                         * in L1. That tile also fetches the next tile's
                         * panels into L2, so that the first tile after it
                         * does not wait on memory for each line (the
                         * prefetch 16 k steps ahead is too short for that;
                         * a model's weights are not in cache). */
                        const int pf =
                            layout != TB_W_PACKED || mp != mb ? 0
                            : (mb == 0 ? TB_PREFETCH_W : 0) |
                                  (nc - jr - nr >= isa->nr ? TB_PREFETCH_NEXT : 0);
                        isa->ukernel(kc, abuf + (mp - mb) * isa->mr * kc,
                                     wblk + (jr / TB_NR) * wps, wps,
                                     c + i0 * ldc + jc + jr, ldc, mr, nr,
                                     flags | pf, chain, ci0 + i0,
                                     cj0 + jc + jr);
                    }
                }
            }
        }
    }
}

static int use_direct(const tb_isa *isa, tb_wlayout layout, int accumulate,
                      int64_t m, int64_t k)
{
    return !accumulate && layout == TB_W_NT && isa->nt_direct != NULL &&
           !use_small(layout, m) && m <= isa->direct_m &&
           (size_t)k * (size_t)isa->direct_rows <= TB_SCRATCH_FLOATS;
}

/* C[i0:i1, j0:j1]: the product, and the epilogue chain on each register of
 * finished outputs. */
static void run_part(const job_t *job, int64_t i0, int64_t i1, int64_t j0,
                     int64_t j1)
{
    const float *w = w_at_column(job, j0);
    const float *a = job->a + i0 * job->lda;
    float *c = job->c + i0 * job->ldc + j0;
    if (i1 <= i0 || j1 <= j0)
        return;
    if (job->alg == TB_ALG_DIRECT) {
        float *ap = tb_scratch();
        /* Without scratch memory this thread takes the blocked path, which
         * has its own fallback. */
        if (ap != NULL) {
            job->isa->nt_direct(i1 - i0, j1 - j0, job->k, a, job->lda, w,
                                job->ldw, c, job->ldc, job->chain, i0, j0, ap);
            return;
        }
    }
    if (job->alg == TB_ALG_SMALL) {
        small_blocked(job->isa, job->layout, i1 - i0, j1 - j0, job->k, a,
                      job->lda, w, job->ldw, c, job->ldc, job->chain, i0, j0);
        return;
    }
    blocked(job->isa, job->layout, job->accumulate, i1 - i0, j1 - j0, job->k,
            a, job->lda, w, job->ldw, c, job->ldc, job->chain, i0, j0);
}

/* Thread tid's share [*lo, *hi) of total items split over nt threads in
 * whole units of `unit` items (the last unit may be partial). */
static void share(int64_t total, int64_t unit, int tid, int nt, int64_t *lo,
                  int64_t *hi)
{
    const int64_t units = cdiv(total, unit);
    *lo = min_i64(total, units * tid / nt * unit);
    *hi = min_i64(total, units * (tid + 1) / nt * unit);
}

static void task(void *arg, int tid, int nt)
{
    const job_t *job = (const job_t *)arg;
    int64_t lo, hi;
    share(job->split_n ? job->n : job->m, job->unit, tid, nt, &lo, &hi);
    if (job->split_n)
        run_part(job, 0, job->m, lo, hi);
    else
        run_part(job, lo, hi, 0, job->n);
}

/* C (+)= A @ op(W), then the chain (NULL or empty: none; not with
 * accumulate). blocked_only: the blocked algorithm whatever the rows, whose
 * sums (one FMA chain per K block, the blocks added in order) are the ones
 * the convolutions' paths compute; the few-rows path sums all of K at
 * once, in its own order. */
static int32_t dense_run(tb_wlayout layout, int accumulate, int64_t m,
                         int64_t n, int64_t k, const float *a, int64_t lda,
                         const float *w, int64_t ldw, float *c, int64_t ldc,
                         const tb_chain *chain, int max_threads, int blocked_only)
{
    job_t job;
    int64_t i, j, units;
    int want;

    if (m == 0 || n == 0)
        return TIRBYOC_OK;
    if (k == 0 && accumulate)
        return TIRBYOC_OK; /* nothing to add */
    if (chain != NULL && (chain->ops == 0 || accumulate))
        chain = NULL;
    if (k == 0) {
        /* Empty reduction: the chain on zeros. */
        for (i = 0; i < m; ++i)
            for (j = 0; j < n; ++j)
                c[i * ldc + j] = 0.0f;
        if (chain != NULL)
            tb_active_isa()->chain(chain, c, ldc, m, n, 0, 0);
        return TIRBYOC_OK;
    }

    job.isa = tb_active_isa();
    job.layout = layout;
    job.accumulate = accumulate;
    job.m = m;
    job.n = n;
    job.k = k;
    job.a = a;
    job.lda = lda;
    job.w = w;
    job.ldw = ldw;
    job.c = c;
    job.ldc = ldc;
    job.chain = chain;
    if (!blocked_only && use_direct(job.isa, layout, accumulate, m, k)) {
        job.alg = TB_ALG_DIRECT;
        job.split_n = 1;
        job.unit = job.isa->direct_nr;
    } else if (!blocked_only && !accumulate && use_small(layout, m)) {
        job.alg = TB_ALG_SMALL;
        job.split_n = 1;
        job.unit = TB_SMALL_UNIT;
    } else {
        job.alg = TB_ALG_BLOCKED;
        job.split_n = n >= 8 * (int64_t)job.isa->nr;
        job.unit = job.split_n ? job.isa->nr : job.isa->mr;
    }
    units = cdiv(job.split_n ? n : m, job.unit);
    want = tb_threads_for(2.0 * (double)m * (double)n * (double)k, TB_PAR_FLOPS, units);
    if (job.alg == TB_ALG_SMALL) {
        /* few rows: the stream of W is the work */
        const int by_w = tb_threads_for((double)n * (double)k, TB_PAR_SMALL_W_FLOATS, units);
        if (by_w > want)
            want = by_w;
    }
    if (want > max_threads)
        want = max_threads;
    tb_parallel(task, &job, want);
    return TIRBYOC_OK;
}

/* C[0:m, 0:n] = A[0:m, 0:k] (row stride lda) @ a pre-packed W: ceil(n / 16)
 * panels of 16 columns, wps floats apart, whose first k steps are read (the
 * layout tirbyoc_pack_weight_f32_* writes, wps = 16 k, and the conv weights'
 * packing, wps = 16 (k + 1) with a bias step), then the chain: the
 * convolutions that run as one product (conv_f32.c). Arguments are the
 * caller's to check. */
void tb_dense_packed(int64_t m, int64_t n, int64_t k, const float *a,
                     int64_t lda, const float *wpk, int64_t wps, float *c,
                     int64_t ldc, const tb_chain *chain)
{
    (void)dense_run(TB_W_PACKED, 0, m, n, k, a, lda, wpk, wps, c, ldc, chain,
                    INT32_MAX, 1);
}

/* ---- argument checks and exported wrappers ---- */

/* TIRBYOC_OK, or the first problem with the arguments (see the header). */
static int32_t check_args(tb_wlayout layout, int64_t m, int64_t n, int64_t k,
                          const float *a, int64_t lda, const float *w,
                          int64_t ldw, const float *c, int64_t ldc)
{
    if (m < 0 || n < 0 || k < 0)
        return TIRBYOC_ESIZE;
    if (layout == TB_W_PACKED && tirbyoc_packed_weight_size_f32(n, k) < 0)
        return TIRBYOC_ESIZE;
    if (lda < k || ldc < n ||
        (layout != TB_W_PACKED && ldw < (layout == TB_W_NT ? k : n)))
        return TIRBYOC_ESTRIDE;
    /* A matrix pointer may only be NULL when that matrix is empty. */
    if ((a == NULL && m > 0 && k > 0) || (w == NULL && n > 0 && k > 0) ||
        (c == NULL && m > 0 && n > 0))
        return TIRBYOC_ENULL;
    return TIRBYOC_OK;
}

/* The dense entry points: act is TIRBYOC_EPI_RELU, TIRBYOC_EPI_RELU6 or
 * TIRBYOC_EPI_END (none), after the bias if there is one. */
static int32_t dense_f32(tb_wlayout layout, int act, int64_t m, int64_t n,
                         int64_t k, const float *a, int64_t lda,
                         const float *w, int64_t ldw, const float *bias,
                         float *c, int64_t ldc)
{
    const int32_t status = check_args(layout, m, n, k, a, lda, w, ldw, c, ldc);
    tb_chain ch = {0, 1.0f, NULL, NULL, 0};
    if (status != TIRBYOC_OK)
        return status;
    if (bias != NULL) {
        ch.ops = TIRBYOC_EPI_BIAS | (int64_t)act << 4;
        ch.bias = bias;
    } else {
        ch.ops = act;
    }
    return dense_run(layout, 0, m, n, k, a, lda, w,
                     layout == TB_W_PACKED ? k * TB_NR : ldw, c, ldc, &ch,
                     INT32_MAX, 0);
}

/* One exported dense entry point per (activation, weight layout). */
#define TB_DENSE_UNPACKED(NAME, LAYOUT, EPI)                                  \
    int32_t NAME(int64_t m, int64_t n, int64_t k, const float *a,            \
                 int64_t lda, const float *w, int64_t ldw, const float *bias, \
                 float *c, int64_t ldc)                                       \
    {                                                                         \
        return dense_f32(LAYOUT, EPI, m, n, k, a, lda, w, ldw, bias, c, ldc); \
    }
#define TB_DENSE_PACKED(NAME, EPI)                                            \
    int32_t NAME(int64_t m, int64_t n, int64_t k, const float *a,            \
                 int64_t lda, const float *packed, const float *bias,         \
                 float *c, int64_t ldc)                                       \
    {                                                                         \
        return dense_f32(TB_W_PACKED, EPI, m, n, k, a, lda, packed, 0, bias,  \
                         c, ldc);                                             \
    }

TB_DENSE_UNPACKED(tirbyoc_dense_f32_nt, TB_W_NT, TIRBYOC_EPI_END)
TB_DENSE_UNPACKED(tirbyoc_dense_f32_nn, TB_W_NN, TIRBYOC_EPI_END)
TB_DENSE_PACKED(tirbyoc_dense_f32_packed, TIRBYOC_EPI_END)
TB_DENSE_UNPACKED(tirbyoc_dense_relu_f32_nt, TB_W_NT, TIRBYOC_EPI_RELU)
TB_DENSE_UNPACKED(tirbyoc_dense_relu_f32_nn, TB_W_NN, TIRBYOC_EPI_RELU)
TB_DENSE_PACKED(tirbyoc_dense_relu_f32_packed, TIRBYOC_EPI_RELU)
TB_DENSE_UNPACKED(tirbyoc_dense_relu6_f32_nt, TB_W_NT, TIRBYOC_EPI_RELU6)
TB_DENSE_UNPACKED(tirbyoc_dense_relu6_f32_nn, TB_W_NN, TIRBYOC_EPI_RELU6)
TB_DENSE_PACKED(tirbyoc_dense_relu6_f32_packed, TIRBYOC_EPI_RELU6)

static int32_t dense_acc(tb_wlayout layout, int64_t m, int64_t n, int64_t k,
                         const float *a, int64_t lda, const float *w,
                         int64_t ldw, float *c, int64_t ldc)
{
    const int32_t status = check_args(layout, m, n, k, a, lda, w, ldw, c, ldc);
    if (status != TIRBYOC_OK)
        return status;
    return dense_run(layout, 1, m, n, k, a, lda, w, ldw, c, ldc, NULL,
                     INT32_MAX, 0);
}

int32_t tirbyoc_dense_acc_f32_nt(int64_t m, int64_t n, int64_t k,
                                 const float *a, int64_t lda, const float *w,
                                 int64_t ldw, float *c, int64_t ldc)
{
    return dense_acc(TB_W_NT, m, n, k, a, lda, w, ldw, c, ldc);
}

int32_t tirbyoc_dense_acc_f32_nn(int64_t m, int64_t n, int64_t k,
                                 const float *a, int64_t lda, const float *w,
                                 int64_t ldw, float *c, int64_t ldc)
{
    return dense_acc(TB_W_NN, m, n, k, a, lda, w, ldw, c, ldc);
}

/* ---- the general entry point: batched, with an epilogue chain ---- */

int tb_chain_length(int64_t ops, int *uses_bias, int *uses_residual)
{
    int len = 0, ended = 0, i;
    *uses_bias = *uses_residual = 0;
    for (i = 0; i < 16; ++i) {
        const int op = (int)(((uint64_t)ops >> (4 * i)) & 15u);
        if (op == TIRBYOC_EPI_END) {
            ended = 1;
            continue;
        }
        if (ended || op >= TIRBYOC_EPI_OP_COUNT)
            return -1;
        *uses_bias |= op == TIRBYOC_EPI_BIAS;
        *uses_residual |= op == TIRBYOC_EPI_RESIDUAL;
        ++len;
    }
    return len;
}

typedef struct {
    int64_t batch, m, n, k;
    const float *a;
    int64_t lda, sa;
    const float *b;
    int64_t ldb, sb;
    tb_wlayout layout;
    float *c;
    int64_t ldc, sc;
    tb_chain chain; /* residual at batch 0 */
    int64_t sr;
    int threads_per_batch;
    int by_rows; /* see matrix_vector */
} batch_job_t;

/* Whether a batch's product is a matrix times one column (N = 1: a mixture of
 * experts' per-token weights, gathered, times its token) that runs as its
 * transpose, C^T = B^T A^T: one row against the rows of A, which the few-rows
 * path streams once with dot products over K. The blocked path packed A and
 * filled 1 of each tile's 16 or 32 columns: 128 products of 2752 x 512 by a
 * vector read A at 6.6 GB/s. Only where the column, C and the residual are
 * contiguous and there is no bias (a per-column bias would become per-row). */
static int matrix_vector(tb_wlayout layout, int64_t n, int64_t ldb, int64_t ldc,
                         int uses_bias, int uses_residual, int64_t ldr)
{
    return n == 1 && layout == TB_W_NN && ldb == 1 && ldc == 1 && !uses_bias &&
           (!uses_residual || ldr == 1);
}

static void run_batch(const batch_job_t *bj, int64_t q, int max_threads)
{
    tb_chain ch = bj->chain;
    if (ch.residual != NULL)
        ch.residual += q * bj->sr;
    if (bj->by_rows) {
        ch.ldr = bj->m;
        dense_run(TB_W_NT, 0, 1, bj->m, bj->k, bj->b + q * bj->sb, bj->k,
                  bj->a + q * bj->sa, bj->lda, bj->c + q * bj->sc, bj->m, &ch,
                  max_threads, 0);
        return;
    }
    dense_run(bj->layout, 0, bj->m, bj->n, bj->k, bj->a + q * bj->sa, bj->lda,
              bj->b + q * bj->sb, bj->ldb, bj->c + q * bj->sc, bj->ldc, &ch,
              max_threads, 0);
}

static void batch_task(void *arg, int tid, int nt)
{
    const batch_job_t *bj = (const batch_job_t *)arg;
    int64_t lo, hi, q;
    share(bj->batch, 1, tid, nt, &lo, &hi);
    for (q = lo; q < hi; ++q)
        run_batch(bj, q, 1);
}

int32_t tirbyoc_matmul_f32(int64_t batch, int64_t m, int64_t n, int64_t k,
                           const float *a, int64_t lda, int64_t stride_a,
                           const float *b, int64_t ldb, int64_t stride_b,
                           int32_t b_layout, float *c, int64_t ldc,
                           int64_t stride_c, int64_t epilogue, float scale,
                           const float *bias, const float *residual,
                           int64_t ldr, int64_t stride_r)
{
    static const tb_wlayout layouts[] = {TB_W_NN, TB_W_NT, TB_W_PACKED};
    batch_job_t bj;
    int uses_bias, uses_residual, len;
    int64_t q;
    int32_t status;

    if (b_layout < 0 || b_layout > 2)
        return TIRBYOC_EINVAL;
    if (batch < 0 || stride_a < 0 || stride_b < 0 || stride_c < 0 ||
        stride_r < 0)
        return TIRBYOC_ESIZE;
    status = check_args(layouts[b_layout], m, n, k, a, lda, b, ldb, c, ldc);
    if (status != TIRBYOC_OK)
        return status;
    len = tb_chain_length(epilogue, &uses_bias, &uses_residual);
    if (len < 0)
        return TIRBYOC_EEPILOGUE;
    if (uses_residual && ldr < n)
        return TIRBYOC_ESTRIDE;
    if ((uses_bias && bias == NULL && n > 0) ||
        (uses_residual && residual == NULL && m > 0 && n > 0))
        return TIRBYOC_ENULL;
    if (batch == 0 || m == 0 || n == 0)
        return TIRBYOC_OK;

    bj.batch = batch;
    bj.m = m;
    bj.n = n;
    bj.k = k;
    bj.a = a;
    bj.lda = lda;
    bj.sa = stride_a;
    bj.b = b;
    bj.ldb = layouts[b_layout] == TB_W_PACKED ? k * TB_NR : ldb; /* packed: between panels */
    bj.sb = stride_b;
    bj.layout = layouts[b_layout];
    bj.c = c;
    bj.ldc = ldc;
    bj.sc = stride_c;
    bj.sr = stride_r;
    bj.chain.ops = epilogue;
    bj.chain.scale = scale;
    bj.chain.bias = bias;
    bj.chain.residual = residual;
    bj.chain.ldr = ldr;
    bj.by_rows = matrix_vector(bj.layout, n, ldb, ldc, uses_bias, uses_residual, ldr);

    /* Batches go to threads whole (one launch instead of one per batch,
     * each thread on data of its own: attention's heads) where the busiest
     * thread computes no more so than with each batch split over the
     * threads its work can use, one batch after the other, or where there
     * are 4 batches per thread or more (a quarter lost to the last round at
     * most). */
    {
        const double fb = 2.0 * (double)m * (double)n * (double)k;
        const int whole = tb_threads_for(fb * (double)batch, TB_PAR_FLOPS, batch);
        const int split = tb_threads_for(fb, TB_PAR_FLOPS, INT64_MAX);
        if (batch > 1 && whole > 1 &&
            ((double)cdiv(batch, whole) * fb <= (double)batch * fb / split ||
             batch >= 4 * (int64_t)whole)) {
            tb_parallel(batch_task, &bj, whole);
            return TIRBYOC_OK;
        }
    }
    for (q = 0; q < batch; ++q)
        run_batch(&bj, q, INT32_MAX);
    return TIRBYOC_OK;
}

/* ---- unary epilogue operations on their own ---- */

typedef struct {
    int op;
    int64_t n;
    const float *x;
    float *y;
} unary_job_t;

/* Elements per thread unit (whole cache lines). */
#define TB_UNARY_UNIT 4096

static void unary_task(void *arg, int tid, int nt)
{
    const unary_job_t *u = (const unary_job_t *)arg;
    int64_t lo, hi;
    share(u->n, TB_UNARY_UNIT, tid, nt, &lo, &hi);
    if (hi > lo)
        tb_active_isa()->unary(u->op, hi - lo, u->x + lo, u->y + lo);
}

int32_t tirbyoc_unary_f32(int32_t op, int64_t n, const float *x, float *y)
{
    unary_job_t u;
    int want;
    if (!tb_op_unary(op))
        return TIRBYOC_EEPILOGUE;
    if (n < 0)
        return TIRBYOC_ESIZE;
    if (n > 0 && (x == NULL || y == NULL))
        return TIRBYOC_ENULL;
    u.op = op;
    u.n = n;
    u.x = x;
    u.y = y;
    want = tb_threads_for((double)n, 8.0 * TB_UNARY_UNIT, cdiv(n, TB_UNARY_UNIT));
    tb_parallel(unary_task, &u, want);
    return TIRBYOC_OK;
}

/* ---- softmax over rows ---- */

typedef struct {
    int64_t rows, n, ldx, ldy;
    const float *x;
    float *y;
} softmax_job_t;

/* Elements per thread unit of the softmax (whole rows of at least this). */
#define TB_SOFTMAX_UNIT 16384

static void softmax_task(void *arg, int tid, int nt)
{
    const softmax_job_t *s = (const softmax_job_t *)arg;
    const tb_softmax_fn row = tb_active_isa()->softmax;
    int64_t lo, hi, i;
    share(s->rows, 1, tid, nt, &lo, &hi);
    for (i = lo; i < hi; ++i)
        row(s->n, s->x + i * s->ldx, s->y + i * s->ldy);
}

int32_t tirbyoc_softmax_f32(int64_t rows, int64_t n, const float *x,
                            int64_t ldx, float *y, int64_t ldy)
{
    softmax_job_t s;
    int64_t want;
    if (rows < 0 || n < 0)
        return TIRBYOC_ESIZE;
    if (ldx < n || ldy < n)
        return TIRBYOC_ESTRIDE;
    if (rows == 0 || n == 0)
        return TIRBYOC_OK;
    if (x == NULL || y == NULL)
        return TIRBYOC_ENULL;
    s.rows = rows;
    s.n = n;
    s.x = x;
    s.ldx = ldx;
    s.y = y;
    s.ldy = ldy;
    want = tb_threads_for((double)rows * (double)n, 2.0 * TB_SOFTMAX_UNIT, rows);
    tb_parallel(softmax_task, &s, (int)want);
    return TIRBYOC_OK;
}

/* ---- pre-packed weights (layout documented in tirbyoc_kernels.h) ---- */

int64_t tirbyoc_packed_weight_size_f32(int64_t n, int64_t k)
{
    int64_t panels;
    if (n < 0 || k < 0)
        return -1;
    if (n == 0 || k == 0)
        return 0;
    panels = cdiv(n, TB_NR);
    if (panels > INT64_MAX / TB_NR / k)
        return -1;
    return panels * TB_NR * k;
}

static int32_t pack_weight(tb_wlayout layout, int64_t n, int64_t k,
                           const float *w, int64_t ldw, float *packed)
{
    const int64_t size = tirbyoc_packed_weight_size_f32(n, k);
    if (size < 0)
        return TIRBYOC_ESIZE;
    if (ldw < (layout == TB_W_NT ? k : n))
        return TIRBYOC_ESTRIDE;
    if (size == 0)
        return TIRBYOC_OK;
    if (w == NULL || packed == NULL)
        return TIRBYOC_ENULL;
    /* Packing only moves floats, so every ISA produces the same bytes. */
    tb_active_isa()->pack_w(layout, k, n, w, ldw, packed, k * TB_NR);
    return TIRBYOC_OK;
}

int32_t tirbyoc_pack_weight_f32_nt(int64_t n, int64_t k, const float *w,
                                   int64_t ldw, float *packed)
{
    return pack_weight(TB_W_NT, n, k, w, ldw, packed);
}

int32_t tirbyoc_pack_weight_f32_nn(int64_t n, int64_t k, const float *w,
                                   int64_t ldw, float *packed)
{
    return pack_weight(TB_W_NN, n, k, w, ldw, packed);
}

/* ---- status ---- */

const char *tirbyoc_status_string(int32_t status)
{
    switch (status) {
    case TIRBYOC_OK:
        return "success";
    case TIRBYOC_EINVAL:
        return "invalid setting";
    case TIRBYOC_ESIZE:
        return "a size is negative, or its buffer is too large to address";
    case TIRBYOC_ESTRIDE:
        return "a row stride is smaller than its row length";
    case TIRBYOC_ENULL:
        return "a NULL pointer was passed for a matrix that has elements";
    case TIRBYOC_EEPILOGUE:
        return "an invalid epilogue chain (an unknown operation)";
    case TIRBYOC_ENOMEM:
        return "the calling thread's scratch memory could not be allocated";
    default:
        return "unknown status";
    }
}
