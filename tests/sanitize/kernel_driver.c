/*
 * kernel_driver.c - a stand-alone driver of the tirbyoc C kernels, built
 * together with the kernel sources under AddressSanitizer + UBSan or under
 * ThreadSanitizer (tests/test_sanitizers.py does both; docs/kernels.md,
 * "Sanitizers and fuzzing", shows the commands).
 *
 *   kernel_driver all      every exported kernel on every instruction set:
 *                          register-tile edges, every algorithm path (few
 *                          rows, nt_direct, blocked, K and N blocks),
 *                          multi-threaded calls through the worker pool,
 *                          concurrent callers, K == 0, empty matrices and
 *                          invalid arguments
 *   kernel_driver threads  only the multi-threaded and concurrent parts
 *                          (ThreadSanitizer is slow)
 *   kernel_driver MODE avx512,avx2
 *                          only the instruction sets named (of those the CPU
 *                          has): a machine's own one where time is short
 *
 * Every result is compared with a double-precision reference (tolerance as
 * in tests/test_kernel_fuzz.py), the stride padding of C must be left
 * untouched, and errors must leave the output untouched. Buffers end exactly
 * where the matrix ends, and their start is misaligned, so a sanitizer sees
 * any access past them.
 *
 * The last line printed is the summary
 *   kernel_driver: mode=M isas=I kernels=K checks=N failures=F
 * and the exit status is 1 if any check failed.
 */
#define _POSIX_C_SOURCE 200809L

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tirbyoc_kernels.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define POISON(p, bytes) ASAN_POISON_MEMORY_REGION(p, bytes)
#define UNPOISON(p, bytes) ASAN_UNPOISON_MEMORY_REGION(p, bytes)
#else
#define POISON(p, bytes) ((void)(p), (void)(bytes))
#define UNPOISON(p, bytes) ((void)(p), (void)(bytes))
#endif

/* ---- checks ---- */

/* The thread counts of every check across thread counts: 1 first (the
 * reference), few, a prime, and 16 and 64 (the pool's most), above any core
 * count here. */
static const int THREAD_COUNTS[] = {1, 2, 3, 5, 16, 64};
#define N_THREAD_COUNTS ((int)(sizeof(THREAD_COUNTS) / sizeof(THREAD_COUNTS[0])))

/* Updated from several threads at once (atomics: TSan must see no race in
 * the driver itself). */
static long n_checks, n_failures;

#define MAX_REPORTS 30

static void check(int ok, const char *what, const char *kernel, int64_t m,
                  int64_t n, int64_t k, const char *detail)
{
    __atomic_add_fetch(&n_checks, 1, __ATOMIC_RELAXED);
    if (!ok && __atomic_add_fetch(&n_failures, 1, __ATOMIC_RELAXED) <= MAX_REPORTS)
        fprintf(stderr, "FAIL %s: %s on %s, m=%lld n=%lld k=%lld %s\n", what,
                kernel, tirbyoc_isa(), (long long)m, (long long)n,
                (long long)k, detail != NULL ? detail : "");
}

/* ---- the kernels ---- */

typedef int32_t (*dense_fn)(int64_t, int64_t, int64_t, const float *, int64_t,
                            const float *, int64_t, const float *, float *,
                            int64_t);
typedef int32_t (*packed_fn)(int64_t, int64_t, int64_t, const float *,
                             int64_t, const float *, const float *, float *,
                             int64_t);
typedef int32_t (*acc_fn)(int64_t, int64_t, int64_t, const float *, int64_t,
                          const float *, int64_t, float *, int64_t);
typedef int32_t (*pack_fn)(int64_t, int64_t, const float *, int64_t, float *);

enum { NT, NN, PACKED };
enum { EPI_NONE, EPI_RELU, EPI_RELU6 };

typedef struct {
    const char *name;
    int layout; /* NT, NN or PACKED: what the kernel reads */
    int epi;
    dense_fn dense;   /* one of these three is set */
    packed_fn packed;
    acc_fn acc;
} kernel_t;

/* Every exported kernel (tests/test_sanitizers.py checks that every
 * exported symbol is named in this file). The pack functions run in every
 * case of a PACKED kernel. */
static const kernel_t KERNELS[] = {
    {"tirbyoc_dense_f32_nt", NT, EPI_NONE, tirbyoc_dense_f32_nt, NULL, NULL},
    {"tirbyoc_dense_relu_f32_nt", NT, EPI_RELU, tirbyoc_dense_relu_f32_nt, NULL, NULL},
    {"tirbyoc_dense_relu6_f32_nt", NT, EPI_RELU6, tirbyoc_dense_relu6_f32_nt, NULL, NULL},
    {"tirbyoc_dense_f32_nn", NN, EPI_NONE, tirbyoc_dense_f32_nn, NULL, NULL},
    {"tirbyoc_dense_relu_f32_nn", NN, EPI_RELU, tirbyoc_dense_relu_f32_nn, NULL, NULL},
    {"tirbyoc_dense_relu6_f32_nn", NN, EPI_RELU6, tirbyoc_dense_relu6_f32_nn, NULL, NULL},
    {"tirbyoc_dense_f32_packed", PACKED, EPI_NONE, NULL, tirbyoc_dense_f32_packed, NULL},
    {"tirbyoc_dense_relu_f32_packed", PACKED, EPI_RELU, NULL, tirbyoc_dense_relu_f32_packed, NULL},
    {"tirbyoc_dense_relu6_f32_packed", PACKED, EPI_RELU6, NULL, tirbyoc_dense_relu6_f32_packed, NULL},
    {"tirbyoc_dense_acc_f32_nt", NT, EPI_NONE, NULL, NULL, tirbyoc_dense_acc_f32_nt},
    {"tirbyoc_dense_acc_f32_nn", NN, EPI_NONE, NULL, NULL, tirbyoc_dense_acc_f32_nn},
};
#define N_KERNELS ((int)(sizeof(KERNELS) / sizeof(KERNELS[0])))
static const pack_fn PACK[2] = {tirbyoc_pack_weight_f32_nt, tirbyoc_pack_weight_f32_nn};
static const char *const PACK_NAMES[2] = {"tirbyoc_pack_weight_f32_nt",
                                          "tirbyoc_pack_weight_f32_nn"};

static const char *const ISA_NAMES[] = {"generic", "avx2", "avx512"};

/* ---- random numbers (xorshift64*) ---- */

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ULL;
}

static float rng_float(uint64_t *s) /* in [-1, 1) */
{
    return (float)((double)(rng_next(s) >> 40) / 8388608.0 - 1.0);
}

static int64_t rng_int(uint64_t *s, int64_t lo, int64_t hi) /* inclusive */
{
    return lo + (int64_t)(rng_next(s) % (uint64_t)(hi - lo + 1));
}

/* ---- buffers ---- */

/* `n` floats at `p`, `off` floats into a malloc'd block that ends exactly at
 * p + n: ASan reports any access after the end, and before the start as far
 * as whole 8-byte granules allow (those are poisoned). */
typedef struct {
    float *base, *p;
    size_t n, off;
} buf_t;

static float *buf_alloc(buf_t *b, size_t n, size_t off)
{
    const size_t bytes = (off + n) * sizeof(float);
    b->base = (float *)malloc(bytes > 0 ? bytes : 1);
    if (b->base == NULL) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    b->p = b->base + off;
    b->n = n;
    b->off = off;
    POISON(b->base, (off * sizeof(float)) & ~(size_t)7);
    return b->p;
}

static void buf_free(buf_t *b)
{
    if (b->base != NULL) {
        UNPOISON(b->base, (b->off * sizeof(float)) & ~(size_t)7);
        free(b->base);
    }
    b->base = b->p = NULL;
}

/* Floats spanned by a rows x cols matrix with row stride ld (no padding
 * after the last row). */
static size_t span(int64_t rows, int64_t cols, int64_t ld)
{
    return rows > 0 && cols > 0 ? (size_t)((rows - 1) * ld + cols) : 0;
}

static float nan_f(void) { return (float)NAN; }

/* Distinct bit patterns: stride padding of C, and output cells before the call. */
static const uint32_t SENTINEL = 0x7FC0BAD0u;
static const float UNWRITTEN = 1.2345e30f;

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static uint32_t to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

/* ---- one call's operands ---- */

typedef struct {
    int64_t m, n, k;
    int wlayout; /* how W is stored: NT ([N, K]) or NN ([K, N]) */
    int bias;    /* pass a bias */
    int nan;     /* one NaN in A (relu must propagate it) */
    int64_t pad_a, pad_w, pad_c;
    size_t off[5];
} shape_t;

typedef struct {
    const kernel_t *kr;
    shape_t s;
    int64_t lda, ldw, ldc;
    buf_t a, w, bias, packed, c;
    float *c0; /* initial C (accumulating kernels) */
} operands_t;

static void fill_matrix(float *p, int64_t rows, int64_t cols, int64_t ld,
                        uint64_t *rng)
{
    int64_t i, j;
    if (cols == 0)
        return; /* no buffer: rows of nothing need no padding either */
    for (i = 0; i < rows; ++i)
        for (j = 0; j < ld && (i < rows - 1 || j < cols); ++j)
            /* Padding holds NaN: a read of it shows up in the result. */
            p[i * ld + j] = j < cols ? rng_float(rng) : nan_f();
}

/* op(W)[p][j]: the weight multiplying A[:, p] into C[:, j]. */
static float w_at(const operands_t *o, int64_t p, int64_t j)
{
    return o->s.wlayout == NT ? o->w.p[j * o->ldw + p] : o->w.p[p * o->ldw + j];
}

/* C's cells to their initial values, the padding to the sentinel. */
static void reset_c(operands_t *o)
{
    const int64_t m = o->s.m, n = o->s.n;
    int64_t i, j;
    if (n == 0)
        return; /* no buffer */
    for (i = 0; i < m; ++i)
        for (j = 0; j < o->ldc && (i < m - 1 || j < n); ++j)
            o->c.p[i * o->ldc + j] =
                j >= n ? from_bits(SENTINEL)
                       : (o->kr->acc != NULL ? o->c0[i * n + j] : UNWRITTEN);
}

static void setup(operands_t *o, const kernel_t *kr, const shape_t *s,
                  uint64_t seed)
{
    const int64_t m = s->m, n = s->n, k = s->k;
    const int64_t wrows = s->wlayout == NT ? n : k, wcols = s->wlayout == NT ? k : n;
    uint64_t rng = seed * 0x9E3779B97F4A7C15ULL + 1;
    int64_t i;
    memset(o, 0, sizeof(*o));
    o->kr = kr;
    o->s = *s;
    o->lda = k + s->pad_a;
    o->ldw = wcols + s->pad_w;
    o->ldc = n + s->pad_c;
    fill_matrix(buf_alloc(&o->a, span(m, k, o->lda), s->off[0]), m, k, o->lda, &rng);
    if (s->nan && m > 0 && k > 0)
        o->a.p[(m / 2) * o->lda + k / 3] = nan_f();
    fill_matrix(buf_alloc(&o->w, span(wrows, wcols, o->ldw), s->off[1]), wrows,
                wcols, o->ldw, &rng);
    if (s->bias)
        fill_matrix(buf_alloc(&o->bias, (size_t)n, s->off[2]), 1, n, n, &rng);
    o->c0 = (float *)malloc((size_t)(m * n > 0 ? m * n : 1) * sizeof(float));
    for (i = 0; i < m * n; ++i)
        o->c0[i] = rng_float(&rng);
    buf_alloc(&o->c, span(m, n, o->ldc), s->off[3]);
    reset_c(o);
}

static void teardown(operands_t *o)
{
    buf_free(&o->a);
    buf_free(&o->w);
    buf_free(&o->bias);
    buf_free(&o->packed);
    buf_free(&o->c);
    free(o->c0);
}

/* Packs W with the C packing function and checks it against the documented
 * layout; the packed buffer is exactly as large as the size function says. */
static void pack(operands_t *o)
{
    const int64_t n = o->s.n, k = o->s.k;
    const int64_t size = tirbyoc_packed_weight_size_f32(n, k);
    const char *name = PACK_NAMES[o->s.wlayout];
    int64_t q, p, r;
    int ok = 1;
    check(size == (n + 15) / 16 * 16 * k, "packed size", name, 0, n, k, NULL);
    buf_alloc(&o->packed, (size_t)(size > 0 ? size : 0), o->s.off[4]);
    check(PACK[o->s.wlayout](n, k, o->w.base != NULL && size > 0 ? o->w.p : NULL,
                             o->ldw, size > 0 ? o->packed.p : NULL) == 0,
          "pack status", name, 0, n, k, NULL);
    for (q = 0; q * 16 < n; ++q)
        for (p = 0; p < k; ++p)
            for (r = 0; r < 16; ++r) {
                const float want = 16 * q + r < n ? w_at(o, p, 16 * q + r) : 0.0f;
                ok &= to_bits(o->packed.p[q * 16 * k + p * 16 + r]) == to_bits(want);
            }
    check(ok, "packed layout", name, 0, n, k, NULL);
}

typedef struct {
    int64_t m, n, k;
    const float *a;
    int64_t lda;
    const float *w; /* the packed buffer for PACKED kernels */
    int64_t ldw;
    const float *bias;
    float *c;
    int64_t ldc;
} args_t;

static args_t default_args(const operands_t *o)
{
    args_t x;
    x.m = o->s.m;
    x.n = o->s.n;
    x.k = o->s.k;
    x.a = o->a.p;
    x.lda = o->lda;
    x.w = o->kr->layout == PACKED ? o->packed.p : o->w.p;
    x.ldw = o->ldw;
    x.bias = o->s.bias ? o->bias.p : NULL;
    x.c = o->c.p;
    x.ldc = o->ldc;
    return x;
}

static int32_t invoke(const kernel_t *kr, const args_t *x)
{
    if (kr->dense != NULL)
        return kr->dense(x->m, x->n, x->k, x->a, x->lda, x->w, x->ldw, x->bias,
                         x->c, x->ldc);
    if (kr->packed != NULL)
        return kr->packed(x->m, x->n, x->k, x->a, x->lda, x->w, x->bias, x->c,
                          x->ldc);
    return kr->acc(x->m, x->n, x->k, x->a, x->lda, x->w, x->ldw, x->c, x->ldc);
}

/* ---- checking a result ---- */

static double epilogue(double v, int epi)
{
    /* "v < 0" keeps NaN, as the kernels do. */
    if (epi == EPI_RELU)
        return v < 0 ? 0.0 : v;
    if (epi == EPI_RELU6)
        return v < 0 ? 0.0 : (v > 6 ? 6.0 : v);
    return v;
}

/* The padding of C is untouched. */
static void check_padding(const operands_t *o)
{
    int64_t i, j;
    int ok = 1;
    for (i = 0; i + 1 < o->s.m; ++i)
        for (j = o->s.n; j < o->ldc; ++j)
            ok &= to_bits(o->c.p[i * o->ldc + j]) == SENTINEL;
    check(ok, "stride padding of C written", o->kr->name, o->s.m, o->s.n, o->s.k, NULL);
}

/* C against the double reference: |got - ref| <= 1e-5 |ref| + 1e-5 *
 * max(1, sqrt(K) / 8) * max(max|ref|, t), t the 2-norm of the terms. */
static void check_result(const operands_t *o)
{
    const int64_t m = o->s.m, n = o->s.n, k = o->s.k;
    const int acc = o->kr->acc != NULL;
    const size_t cells = (size_t)(m * n > 0 ? m * n : 1);
    double *ref = (double *)malloc(cells * sizeof(double));
    double *terms = (double *)malloc(cells * sizeof(double));
    double max_ref = 0.0, factor = sqrt((double)k) / 8;
    int64_t i, j, p, bad = 0;
    char detail[160] = "";

    for (i = 0; i < m; ++i)
        for (j = 0; j < n; ++j) {
            double sum = 0.0, t = 0.0, v;
            for (p = 0; p < k; ++p) {
                const double x = (double)o->a.p[i * o->lda + p] * w_at(o, p, j);
                sum += x;
                t += isfinite(x) ? x * x : 0.0;
            }
            if (o->s.bias && !acc) {
                sum += o->bias.p[j];
                t += (double)o->bias.p[j] * o->bias.p[j];
            }
            if (acc) {
                sum += o->c0[i * n + j];
                t += (double)o->c0[i * n + j] * o->c0[i * n + j];
            }
            v = epilogue(sum, o->kr->epi);
            ref[i * n + j] = v;
            terms[i * n + j] = sqrt(t);
            if (isfinite(v) && fabs(v) > max_ref)
                max_ref = fabs(v);
        }
    if (factor < 1)
        factor = 1;
    for (i = 0; i < m; ++i)
        for (j = 0; j < n; ++j) {
            const double want = ref[i * n + j];
            const double got = o->c.p[i * o->ldc + j];
            const double scale = terms[i * n + j] > max_ref ? terms[i * n + j] : max_ref;
            int ok;
            if (isnan(want))
                ok = isnan(got);
            else
                ok = !isnan(got) &&
                     fabs(got - want) <= 1e-5 * fabs(want) + 1e-5 * factor * scale;
            if (!ok && bad++ == 0)
                snprintf(detail, sizeof(detail), "(first at [%lld, %lld]: got %.9g, want %.9g)",
                         (long long)i, (long long)j, got, want);
        }
    check(bad == 0, "result", o->kr->name, m, n, k, detail);
    check_padding(o);
    free(ref);
    free(terms);
}

/* Runs one call on fresh operands and checks it; `keep` (or NULL) receives
 * the operands for more calls (the caller tears them down). */
static void run_case(const kernel_t *kr, const shape_t *s, uint64_t seed,
                     operands_t *keep)
{
    operands_t o;
    args_t x;
    setup(&o, kr, s, seed);
    if (kr->layout == PACKED)
        pack(&o);
    x = default_args(&o);
    check(invoke(kr, &x) == 0, "status", kr->name, s->m, s->n, s->k, NULL);
    check_result(&o);
    if (keep != NULL)
        *keep = o;
    else
        teardown(&o);
}

/* A shape with random strides, offsets, bias and W layout. */
static shape_t make_shape(int64_t m, int64_t n, int64_t k, uint64_t *rng)
{
    shape_t s;
    int i;
    s.m = m;
    s.n = n;
    s.k = k;
    s.wlayout = (int)rng_int(rng, 0, 1);
    s.bias = rng_int(rng, 0, 2) > 0;
    s.nan = rng_int(rng, 0, 4) == 0;
    s.pad_a = rng_int(rng, 0, 2) ? rng_int(rng, 1, 19) : 0;
    s.pad_w = rng_int(rng, 0, 2) ? rng_int(rng, 1, 19) : 0;
    s.pad_c = rng_int(rng, 0, 2) ? rng_int(rng, 1, 19) : 0;
    for (i = 0; i < 5; ++i)
        s.off[i] = (size_t)rng_int(rng, 0, 15);
    return s;
}

/* The W layout a kernel reads is fixed unless it takes packed W. */
static shape_t shape_for(const kernel_t *kr, int64_t m, int64_t n, int64_t k,
                         uint64_t *rng)
{
    shape_t s = make_shape(m, n, k, rng);
    if (kr->layout != PACKED)
        s.wlayout = kr->layout;
    return s;
}

/* ---- sections ---- */

/* Every combination of register-tile edges (14x32, 6x16, 4x16 tiles, few-row
 * and nt_direct thresholds, 6-column direct tiles, vector widths in K). */
static void edge_tiles(uint64_t *rng)
{
    static const int64_t ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 14, 15, 17, 29};
    static const int64_t ns[] = {1, 6, 7, 15, 16, 17, 31, 32, 33};
    static const int64_t ks[] = {1, 7, 16, 17};
    size_t a, b, c;
    int kr;
    for (kr = 0; kr < N_KERNELS; ++kr)
        for (a = 0; a < sizeof(ms) / sizeof(ms[0]); ++a)
            for (b = 0; b < sizeof(ns) / sizeof(ns[0]); ++b)
                for (c = 0; c < sizeof(ks) / sizeof(ks[0]); ++c) {
                    const shape_t s = shape_for(&KERNELS[kr], ms[a], ns[b], ks[c], rng);
                    run_case(&KERNELS[kr], &s, rng_next(rng), NULL);
                }
}

/* Algorithm paths and cache-block edges, single-threaded. */
static void block_edges(uint64_t *rng)
{
    static const int64_t shapes[][3] = {
        {5, 1025, 20},  {8, 300, 300},  {3, 1030, 9},    /* few rows, column chunks */
        {9, 7, 513},    {64, 13, 100},  {65, 6, 1025},   /* nt_direct, 64-row chunks */
        {128, 5, 4356}, {100, 3, 4357},                  /* nt_direct scratch limit */
        {129, 257, 300}, {15, 33, 257}, {29, 513, 64},   /* blocked: N and K blocks */
        {14, 32, 512},  {33, 260, 770},
    };
    size_t i;
    int kr;
    tirbyoc_set_num_threads(1);
    for (kr = 0; kr < N_KERNELS; ++kr)
        for (i = 0; i < sizeof(shapes) / sizeof(shapes[0]); ++i) {
            const shape_t s = shape_for(&KERNELS[kr], shapes[i][0], shapes[i][1],
                                        shapes[i][2], rng);
            run_case(&KERNELS[kr], &s, rng_next(rng), NULL);
        }
}

/* Above 4 MFLOP: split over the pool (N, M, few-rows and nt_direct splits),
 * on each of THREAD_COUNTS; the result must equal the 1-thread result bit
 * for bit. */
static void threaded(uint64_t *rng, int light)
{
    static const int64_t full[][3] = {
        {200, 300, 100}, {4, 1100, 1000}, {300, 40, 400}, {64, 520, 300},
    };
    static const int64_t small[][3] = {
        {130, 130, 130}, {4, 700, 800}, {260, 40, 210}, {64, 260, 130},
    };
    const int64_t(*shapes)[3] = light ? small : full;
    int kr, i, ti;
    for (kr = 0; kr < N_KERNELS; ++kr)
        for (i = 0; i < 4; ++i) {
            const shape_t s = shape_for(&KERNELS[kr], shapes[i][0], shapes[i][1],
                                        shapes[i][2], rng);
            operands_t o;
            float *one;
            tirbyoc_set_num_threads(1);
            run_case(&KERNELS[kr], &s, rng_next(rng), &o);
            one = (float *)malloc(o.c.n * sizeof(float));
            memcpy(one, o.c.p, o.c.n * sizeof(float));
            for (ti = 1; ti < N_THREAD_COUNTS; ++ti) {
                args_t x = default_args(&o);
                tirbyoc_set_num_threads(THREAD_COUNTS[ti]);
                reset_c(&o);
                check(invoke(o.kr, &x) == 0, "status (threads)", o.kr->name, s.m, s.n, s.k, NULL);
                check(memcmp(one, o.c.p, o.c.n * sizeof(float)) == 0,
                      "result differs from 1 thread", o.kr->name, s.m, s.n, s.k, NULL);
            }
            free(one);
            teardown(&o);
        }
    tirbyoc_set_num_threads(2);
}

/* Several threads call kernels at once (the pool serves one caller; the
 * others run alone), while another thread changes the thread count. Every
 * call must give the checked single-threaded result bit for bit. */
#define CALLERS 4

typedef struct {
    operands_t ops[3];
    float *expected[3];
    int rounds;
} caller_t;

static int stop_toggler;

static void *toggler_main(void *arg)
{
    int t = 1;
    (void)arg;
    while (!__atomic_load_n(&stop_toggler, __ATOMIC_RELAXED)) {
        tirbyoc_set_num_threads(THREAD_COUNTS[t++ % N_THREAD_COUNTS]);
        sched_yield();
    }
    return NULL;
}

static void *caller_main(void *arg)
{
    caller_t *cl = (caller_t *)arg;
    int r, i;
    for (r = 0; r < cl->rounds; ++r)
        for (i = 0; i < 3; ++i) {
            operands_t *o = &cl->ops[i];
            args_t x = default_args(o);
            reset_c(o);
            check(invoke(o->kr, &x) == 0, "status (concurrent)", o->kr->name, o->s.m,
                  o->s.n, o->s.k, NULL);
            check(memcmp(cl->expected[i], o->c.p, o->c.n * sizeof(float)) == 0,
                  "result (concurrent)", o->kr->name, o->s.m, o->s.n, o->s.k, NULL);
            check_padding(o);
        }
    return NULL;
}

static void concurrent(uint64_t *rng, int rounds)
{
    /* Per caller: a call above the threading threshold, a few-rows call and
     * a small one, of different kernels. */
    static const int64_t shapes[3][3] = {{140, 140, 120}, {6, 500, 700}, {20, 33, 50}};
    caller_t callers[CALLERS];
    pthread_t threads[CALLERS], toggler;
    int started[CALLERS];
    int c, i;
    for (c = 0; c < CALLERS; ++c) {
        callers[c].rounds = rounds;
        for (i = 0; i < 3; ++i) {
            const kernel_t *kr = &KERNELS[(c * 3 + i) % N_KERNELS];
            const shape_t s = shape_for(kr, shapes[i][0], shapes[i][1], shapes[i][2], rng);
            operands_t *o = &callers[c].ops[i];
            tirbyoc_set_num_threads(1);
            run_case(kr, &s, rng_next(rng), o);
            callers[c].expected[i] = (float *)malloc(o->c.n * sizeof(float) + 1);
            memcpy(callers[c].expected[i], o->c.p, o->c.n * sizeof(float));
        }
    }
    tirbyoc_set_num_threads(2);
    __atomic_store_n(&stop_toggler, 0, __ATOMIC_RELAXED);
    if (pthread_create(&toggler, NULL, toggler_main, NULL) != 0) {
        check(0, "pthread_create", "toggler", 0, 0, 0, NULL);
        return;
    }
    for (c = 0; c < CALLERS; ++c) {
        started[c] = pthread_create(&threads[c], NULL, caller_main, &callers[c]) == 0;
        check(started[c], "pthread_create", "caller", 0, 0, 0, NULL);
    }
    for (c = 0; c < CALLERS; ++c)
        if (started[c])
            pthread_join(threads[c], NULL);
    __atomic_store_n(&stop_toggler, 1, __ATOMIC_RELAXED);
    pthread_join(toggler, NULL);
    tirbyoc_set_num_threads(2);
    for (c = 0; c < CALLERS; ++c)
        for (i = 0; i < 3; ++i) {
            teardown(&callers[c].ops[i]);
            free(callers[c].expected[i]);
        }
}

/* tirbyoc_conv2d_winograd_cached_f32 from WG_CALLERS threads at once over
 * WG_WEIGHTS weights, each thread calling them in its own order, while the
 * cap (TIRBYOC_WINOGRAD_CACHE_MB=1, set by main) holds about two of their
 * transforms: entries made by two threads at once, dropped while other
 * calls still run on them, made again. Every call: the packed weight's
 * result bit for bit. */
#define WG_CALLERS 4
#define WG_WEIGHTS 3

typedef struct {
    int64_t n, c, h, w, oc;
    buf_t bx, bw, bb, by[WG_CALLERS];
    float *x, *wt, *bias, *expected;
} wg_weight_t;

typedef struct {
    wg_weight_t *ws;
    int id, rounds;
} wg_caller_t;

static void *wg_caller_main(void *arg)
{
    const wg_caller_t *cl = (const wg_caller_t *)arg;
    const int64_t ops = TIRBYOC_EPI_BIAS | TIRBYOC_EPI_RELU << 4;
    int r;
    for (r = 0; r < cl->rounds; ++r) {
        wg_weight_t *g = &cl->ws[(r * (cl->id + 1) + cl->id) % WG_WEIGHTS];
        float *y = g->by[cl->id].p;
        const size_t ny = (size_t)(g->n * g->oc * g->h * g->w);
        check(tirbyoc_conv2d_winograd_cached_f32(7, (int64_t)(g - cl->ws), g->n, g->c, g->h,
                                                 g->w, g->x, g->oc, g->wt, g->bias, 1, 1,
                                                 g->h, g->w, ops, NULL, y) == TIRBYOC_OK,
              "status (concurrent)", "tirbyoc_conv2d_winograd_cached_f32", g->oc, g->c, 9,
              NULL);
        check(memcmp(y, g->expected, ny * sizeof(float)) == 0, "result (concurrent)",
              "tirbyoc_conv2d_winograd_cached_f32", g->oc, g->c, 9, NULL);
    }
    return NULL;
}

static void winograd_cache_concurrent(uint64_t *rng, int rounds)
{
    const int64_t ops = TIRBYOC_EPI_BIAS | TIRBYOC_EPI_RELU << 4;
    wg_weight_t ws[WG_WEIGHTS];
    wg_caller_t callers[WG_CALLERS];
    pthread_t threads[WG_CALLERS];
    int started[WG_CALLERS];
    int64_t stats[5];
    int i, c;
    buf_t bp;
    tirbyoc_set_num_threads(1);
    for (i = 0; i < WG_WEIGHTS; ++i) {
        wg_weight_t *g = &ws[i];
        const size_t nx = (size_t)(1 * 48 * 12 * 12), nw = (size_t)(64 * 48 * 9);
        size_t q;
        float *pk;
        g->n = 1, g->c = 48, g->h = 12, g->w = 12, g->oc = 64;
        g->x = buf_alloc(&g->bx, nx, 0);
        g->wt = buf_alloc(&g->bw, nw, 0);
        g->bias = buf_alloc(&g->bb, (size_t)g->oc, 0);
        for (q = 0; q < nx; ++q)
            g->x[q] = rng_float(rng);
        for (q = 0; q < nw; ++q)
            g->wt[q] = rng_float(rng);
        for (q = 0; q < (size_t)g->oc; ++q)
            g->bias[q] = rng_float(rng);
        for (c = 0; c < WG_CALLERS; ++c)
            buf_alloc(&g->by[c], (size_t)(g->oc * 144), 0);
        pk = buf_alloc(&bp, (size_t)tirbyoc_conv2d_winograd_packed_size_f32(g->oc, g->c), 0);
        tirbyoc_pack_conv2d_winograd_weight_f32(g->oc, g->c, g->wt, g->bias, pk);
        g->expected = (float *)malloc((size_t)(g->oc * 144) * sizeof(float));
        check(tirbyoc_conv2d_winograd_f32(1, g->c, 12, 12, g->x, g->oc, pk, 1, 1, 12, 12, ops,
                                          NULL, g->expected) == TIRBYOC_OK,
              "status", "tirbyoc_conv2d_winograd_f32", g->oc, g->c, 9, NULL);
        buf_free(&bp);
    }
    tirbyoc_set_num_threads(2);
    for (c = 0; c < WG_CALLERS; ++c) {
        callers[c].ws = ws;
        callers[c].id = c;
        callers[c].rounds = rounds;
        started[c] = pthread_create(&threads[c], NULL, wg_caller_main, &callers[c]) == 0;
        check(started[c], "pthread_create", "winograd caller", 0, 0, 0, NULL);
    }
    for (c = 0; c < WG_CALLERS; ++c)
        if (started[c])
            pthread_join(threads[c], NULL);
    check(tirbyoc_winograd_cache_stats(stats) == TIRBYOC_OK && stats[2] == 1 << 20 &&
              stats[0] >= 1 && stats[1] <= stats[2] && stats[4] > 0,
          "entries kept within the cap, some dropped", "tirbyoc_winograd_cache_stats",
          stats[0], stats[1], stats[4], NULL);
    check(tirbyoc_winograd_cache_stats(NULL) == TIRBYOC_ENULL, "a NULL result accepted",
          "tirbyoc_winograd_cache_stats", 0, 0, 0, NULL);
    for (i = 0; i < WG_WEIGHTS; ++i) {
        buf_free(&ws[i].bx);
        buf_free(&ws[i].bw);
        buf_free(&ws[i].bb);
        for (c = 0; c < WG_CALLERS; ++c)
            buf_free(&ws[i].by[c]);
        free(ws[i].expected);
    }
}

/* K == 0 (bias then activation, or C unchanged for dense_acc) with NULL A
 * and W; M == 0 with NULL A and C; N == 0 with NULL W and C. */
static void empty_sizes(uint64_t *rng)
{
    int kr, layout;
    for (kr = 0; kr < N_KERNELS; ++kr) {
        const kernel_t *k = &KERNELS[kr];
        shape_t s = shape_for(k, 5, 19, 0, rng);
        operands_t o;
        args_t x;
        s.bias = 1;
        setup(&o, k, &s, rng_next(rng));
        if (k->layout == PACKED)
            pack(&o);
        x = default_args(&o);
        x.a = NULL;
        x.w = NULL;
        check(invoke(k, &x) == 0, "status (K = 0)", k->name, 5, 19, 0, NULL);
        check_result(&o);
        teardown(&o);

        s = shape_for(k, 4, 7, 3, rng);
        setup(&o, k, &s, rng_next(rng));
        if (k->layout == PACKED)
            pack(&o);
        x = default_args(&o);
        x.m = 0;
        x.a = NULL;
        x.c = NULL;
        check(invoke(k, &x) == 0, "status (M = 0)", k->name, 0, 7, 3, NULL);
        x = default_args(&o);
        x.n = 0;
        x.w = NULL;
        x.c = NULL;
        x.bias = NULL;
        check(invoke(k, &x) == 0, "status (N = 0)", k->name, 4, 0, 3, NULL);
        /* Neither call may write C. */
        check_padding(&o);
        {
            int64_t i, j;
            int ok = 1;
            for (i = 0; i < 4; ++i)
                for (j = 0; j < 7; ++j)
                    ok &= o.c.p[i * o.ldc + j] ==
                          (k->acc != NULL ? o.c0[i * 7 + j] : UNWRITTEN);
            check(ok, "C written by an empty call", k->name, 4, 7, 3, NULL);
        }
        teardown(&o);
    }
    for (layout = 0; layout < 2; ++layout) {
        check(PACK[layout](0, 5, NULL, layout == NT ? 5 : 0, NULL) == 0,
              "status (N = 0)", PACK_NAMES[layout], 0, 0, 5, NULL);
        check(PACK[layout](5, 0, NULL, layout == NT ? 0 : 5, NULL) == 0,
              "status (K = 0)", PACK_NAMES[layout], 0, 5, 0, NULL);
    }
}

/* Each invalid argument gives a nonzero status and leaves C (all of its
 * buffer) untouched. */
static void invalid_args(uint64_t *rng)
{
    enum { BAD_M, BAD_N, BAD_K, BAD_LDA, BAD_LDW, BAD_LDC, NULL_A, NULL_W, NULL_C, BAD_COUNT };
    static const char *const what[BAD_COUNT] = {
        "m < 0", "n < 0", "k < 0", "lda < k", "ldw too small", "ldc < n",
        "a NULL", "w NULL", "c NULL"};
    int kr, bad, layout;
    for (kr = 0; kr < N_KERNELS; ++kr) {
        const kernel_t *k = &KERNELS[kr];
        const shape_t s = shape_for(k, 6, 21, 11, rng);
        operands_t o;
        float *before;
        setup(&o, k, &s, rng_next(rng));
        if (k->layout == PACKED)
            pack(&o);
        before = (float *)malloc(o.c.n * sizeof(float));
        memcpy(before, o.c.p, o.c.n * sizeof(float));
        for (bad = 0; bad < BAD_COUNT; ++bad) {
            args_t x = default_args(&o);
            const int64_t wmin = s.wlayout == NT ? s.k : s.n;
            if (bad == BAD_LDW && k->layout == PACKED)
                continue; /* packed W has no stride */
            switch (bad) {
            case BAD_M: x.m = -1; break;
            case BAD_N: x.n = -3; break;
            case BAD_K: x.k = INT64_MIN; break;
            case BAD_LDA: x.lda = s.k - 1; break;
            case BAD_LDW: x.ldw = wmin - 1; break;
            case BAD_LDC: x.ldc = s.n - 1; break;
            case NULL_A: x.a = NULL; break;
            case NULL_W: x.w = NULL; break;
            default: x.c = NULL; break;
            }
            check(invoke(k, &x) != 0, what[bad], k->name, s.m, s.n, s.k, "accepted");
            check(memcmp(before, o.c.p, o.c.n * sizeof(float)) == 0, what[bad], k->name,
                  s.m, s.n, s.k, "C written despite the error");
        }
        free(before);
        teardown(&o);
    }
    for (layout = 0; layout < 2; ++layout) {
        /* n = 20, k = 9: W with 9 (NT) or 20 (NN) floats per row. */
        const int64_t ldw = layout == NT ? 9 : 20;
        float w[20 * 20], packed[32 * 9];
        const float *wp = w;
        int i, ok = 1;
        for (i = 0; i < 20 * 20; ++i)
            w[i] = (float)i;
        for (i = 0; i < 32 * 9; ++i)
            packed[i] = UNWRITTEN;
        check(PACK[layout](-1, 9, wp, ldw, packed) != 0, "n < 0", PACK_NAMES[layout], 0, -1, 9, NULL);
        check(PACK[layout](20, -1, wp, ldw, packed) != 0, "k < 0", PACK_NAMES[layout], 0, 20, -1, NULL);
        check(PACK[layout](20, 9, wp, ldw - 1, packed) != 0, "ldw too small", PACK_NAMES[layout], 0, 20, 9, NULL);
        check(PACK[layout](20, 9, NULL, ldw, packed) != 0, "w NULL", PACK_NAMES[layout], 0, 20, 9, NULL);
        check(PACK[layout](20, 9, wp, ldw, NULL) != 0, "packed NULL", PACK_NAMES[layout], 0, 20, 9, NULL);
        for (i = 0; i < 32 * 9; ++i)
            ok &= packed[i] == UNWRITTEN;
        check(ok, "packed written despite the error", PACK_NAMES[layout], 0, 20, 9, NULL);
    }
    check(tirbyoc_packed_weight_size_f32(-1, 5) < 0, "size of n < 0", "tirbyoc_packed_weight_size_f32", 0, -1, 5, NULL);
    check(tirbyoc_packed_weight_size_f32((int64_t)1 << 62, 1024) < 0, "size overflow",
          "tirbyoc_packed_weight_size_f32", 0, 0, 0, NULL);
    check(tirbyoc_set_isa(NULL) != 0 && tirbyoc_set_isa("sse") != 0, "unknown ISA accepted",
          "tirbyoc_set_isa", 0, 0, 0, NULL);
    check(tirbyoc_set_num_threads(0) != 0 && tirbyoc_set_num_threads(-2) != 0,
          "thread count < 1 accepted", "tirbyoc_set_num_threads", 0, 0, 0, NULL);
    check(tirbyoc_num_threads() >= 1, "thread count", "tirbyoc_num_threads", 0, 0, 0, NULL);
    {
        int64_t caches[5];
        check(tirbyoc_cache_sizes(NULL) == TIRBYOC_ENULL, "NULL sizes accepted",
              "tirbyoc_cache_sizes", 0, 0, 0, NULL);
        check(tirbyoc_cache_sizes(caches) == TIRBYOC_OK && caches[0] >= 8192 &&
                  caches[2] >= caches[0] && caches[1] >= 2 && caches[3] >= 2 && caches[4] >= 32,
              "implausible cache sizes", "tirbyoc_cache_sizes", 0, 0, 0, NULL);
    }
}

/* ---- tirbyoc_matmul_f32 (batches, chains) and tirbyoc_unary_f32 ---- */

static double sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }

static double unary_d(int op, double x)
{
    switch (op) {
    case TIRBYOC_EPI_RELU: return x < 0 ? 0 : x;
    case TIRBYOC_EPI_RELU6: return x < 0 ? 0 : (x > 6 ? 6 : x);
    case TIRBYOC_EPI_GELU_ERF: return 0.5 * x * erfc(-x / sqrt(2.0));
    case TIRBYOC_EPI_GELU_TANH:
        return x * sigmoid_d(2 * sqrt(2 / 3.14159265358979323846) * (x + 0.044715 * x * x * x));
    case TIRBYOC_EPI_SILU: return x * sigmoid_d(x);
    case TIRBYOC_EPI_SIGMOID: return sigmoid_d(x);
    case TIRBYOC_EPI_TANH: return tanh(x);
    case TIRBYOC_EPI_HARDSWISH: /* NaN passes the clamp, as in relu6 */
        return x * (x + 3 < 0 ? 0 : (x + 3 > 6 ? 6 : x + 3)) / 6;
    case TIRBYOC_EPI_HARDSIGMOID: return (x + 3 < 0 ? 0 : (x + 3 > 6 ? 6 : x + 3)) / 6;
    default: return x;
    }
}

/* One batched call with a chain (every operation used across the calls),
 * exact-size buffers, threads as set by the caller. */
static void matmul_chain_case(uint64_t *rng, int64_t batch, int64_t m, int64_t n,
                              int64_t k, int nt, int64_t ops, int bcast_w)
{
    /* one column (n == 1): C, the column and the residual contiguous, the matrix-vector
     * path's condition (with a bias the blocked path still takes it) */
    const int64_t pad = n == 1 ? 0 : 3;
    const int64_t lda = k + rng_int(rng, 0, 3), ldb = (nt ? k : n) + rng_int(rng, 0, pad);
    const int64_t ldc = n + rng_int(rng, 0, pad), ldr = n + rng_int(rng, 0, pad);
    const int64_t brows = nt ? n : k, bcols = nt ? k : n;
    const int64_t sa = m * lda, sb = bcast_w ? 0 : brows * ldb, sc = m * ldc, sr = m * ldr;
    const float scale = 0.35f;
    buf_t ba, bb, bc, bbias, bres;
    float *a = buf_alloc(&ba, (size_t)(batch - 1) * sa + span(m, k, lda), 1);
    float *b = buf_alloc(&bb, (size_t)(bcast_w ? 0 : (batch - 1) * sb) + span(brows, bcols, ldb), 3);
    float *c = buf_alloc(&bc, (size_t)(batch - 1) * sc + span(m, n, ldc), 1);
    float *bias = buf_alloc(&bbias, (size_t)n, 2);
    float *res = buf_alloc(&bres, (size_t)(batch - 1) * sr + span(m, n, ldr), 1);
    int64_t q, i, j, p;
    size_t x;
    int32_t st;
    double worst = 0;
    for (x = 0; x < ba.n; ++x) a[x] = rng_float(rng) * 2;
    for (x = 0; x < bb.n; ++x) b[x] = rng_float(rng);
    for (x = 0; x < bc.n; ++x) c[x] = UNWRITTEN;
    for (x = 0; x < bbias.n; ++x) bias[x] = rng_float(rng);
    for (x = 0; x < bres.n; ++x) res[x] = rng_float(rng);
    st = tirbyoc_matmul_f32(batch, m, n, k, a, lda, sa, b, ldb, sb, nt ? TIRBYOC_B_NK : TIRBYOC_B_KN,
                            c, ldc, sc, ops, scale, bias, res, ldr, sr);
    check(st == TIRBYOC_OK, "status", "tirbyoc_matmul_f32", m, n, k, NULL);
    for (q = 0; q < batch && st == TIRBYOC_OK; ++q)
        for (i = 0; i < m; ++i)
            for (j = 0; j < n; ++j) {
                double v = 0, mag = 0, got;
                int64_t o;
                for (p = 0; p < k; ++p) {
                    const double av = a[q * sa + i * lda + p];
                    const double bv = nt ? b[q * sb + j * ldb + p] : b[q * sb + p * ldb + j];
                    v += av * bv;
                    mag += fabs(av * bv);
                }
                for (o = ops; o != 0; o >>= 4) {
                    const int op = (int)(o & 15);
                    if (op == TIRBYOC_EPI_BIAS) v += bias[j];
                    else if (op == TIRBYOC_EPI_RESIDUAL) v += res[q * sr + i * ldr + j];
                    else if (op == TIRBYOC_EPI_SCALE) { v *= scale; mag *= scale; }
                    else if (op == TIRBYOC_EPI_DIVIDE) { v /= scale; mag /= scale; }
                    else v = unary_d(op, v);
                }
                got = c[q * sc + i * ldc + j];
                if (fabs(got - v) > 1e-5 * (mag + fabs(v) + 1) && fabs(got - v) > worst)
                    worst = fabs(got - v);
            }
    check(worst == 0, "chain result", "tirbyoc_matmul_f32", m, n, k, NULL);
    buf_free(&ba); buf_free(&bb); buf_free(&bc); buf_free(&bbias); buf_free(&bres);
}

/* tirbyoc_softmax_f32: row lengths on every vector width's edges, strided rows,
 * in place, a masked (-inf) column, threads as set by the caller. */
static void softmax_rows(uint64_t *rng)
{
    static const int64_t shapes[][2] = {
        {1, 1}, {3, 7}, {5, 15}, {4, 16}, {6, 17}, {9, 33}, {40, 100}, {700, 129},
    };
    size_t si;
    for (si = 0; si < sizeof(shapes) / sizeof(shapes[0]); ++si) {
        const int64_t rows = shapes[si][0], n = shapes[si][1];
        const int64_t ldx = n + rng_int(rng, 0, 3), ldy = n + rng_int(rng, 0, 3);
        buf_t bx, by;
        float *x = buf_alloc(&bx, span(rows, n, ldx), 1);
        float *y = buf_alloc(&by, span(rows, n, ldy), 3);
        double worst = 0;
        int64_t i, j;
        size_t t;
        for (t = 0; t < bx.n; ++t)
            x[t] = rng_float(rng) * 8;
        for (i = 0; i < rows; i += 3)
            if (n > 1)
                x[i * ldx + n / 2] = -INFINITY;
        check(tirbyoc_softmax_f32(rows, n, x, ldx, y, ldy) == TIRBYOC_OK, "status",
              "tirbyoc_softmax_f32", rows, n, 0, NULL);
        for (i = 0; i < rows; ++i) {
            double mx = -INFINITY, sum = 0;
            for (j = 0; j < n; ++j)
                mx = x[i * ldx + j] > mx ? x[i * ldx + j] : mx;
            for (j = 0; j < n; ++j)
                sum += exp(x[i * ldx + j] - mx);
            for (j = 0; j < n; ++j) {
                const double want = exp(x[i * ldx + j] - mx) / sum;
                const double err = fabs(y[i * ldy + j] - want);
                if (err > 1e-5 * want + 1e-7 && err > worst)
                    worst = err;
            }
        }
        check(worst == 0, "softmax result", "tirbyoc_softmax_f32", rows, n, 0, NULL);
        if (ldx == n && ldy == n) {
            check(tirbyoc_softmax_f32(rows, n, x, n, x, n) == TIRBYOC_OK, "in place",
                  "tirbyoc_softmax_f32", rows, n, 0, NULL);
            check(memcmp(x, y, sizeof(float) * (size_t)(rows * n)) == 0, "in place result",
                  "tirbyoc_softmax_f32", rows, n, 0, NULL);
        }
        buf_free(&bx);
        buf_free(&by);
    }
    check(tirbyoc_softmax_f32(2, 4, NULL, 4, NULL, 4) == TIRBYOC_ENULL, "NULL refused",
          "tirbyoc_softmax_f32", 2, 4, 0, NULL);
    check(tirbyoc_softmax_f32(2, 4, NULL, 3, NULL, 4) == TIRBYOC_ESTRIDE, "stride refused",
          "tirbyoc_softmax_f32", 2, 4, 0, NULL);
}

/* tirbyoc_attention_f32: tile, unit and key-chunk edges, both K layouts, a batch with
 * broadcast K/V, strided rows, no / random / causal / padding masks (the mask ending exactly
 * at its last byte; random and causal masks with a row stride wider than the row, padding
 * masks one row for all, ldmask 0), fully masked rows, masks that replace the score and
 * masks added to it, of -inf or of -FLT_MAX, an inf in V past a causal row's keys, NaN and +-inf in Q and K
 * (`specials`); threads as set by the caller, or (for
 * `threads_check`) 1, 2 and 3 threads giving the same bits. Reference: double precision,
 * IEEE semantics of the unfused graph. */
enum { ATT_NO_MASK, ATT_RANDOM, ATT_CAUSAL, ATT_PADDING, ATT_MASK_KINDS };

static void attention_case(uint64_t *rng, int64_t batch, int64_t m, int64_t n, int64_t d,
                           int64_t dv, int k_nk, int mask_kind, int flags, int specials,
                           int threads_check)
{
    const int64_t ldq = d + rng_int(rng, 0, 2), ldv = dv + rng_int(rng, 0, 2);
    const int64_t ldk = (k_nk ? d : n) + rng_int(rng, 0, 2), ldo = dv + rng_int(rng, 0, 2);
    const int64_t krows = k_nk ? n : d, kcols = k_nk ? d : n;
    const int64_t sq = span(m, d, ldq), sk = batch > 1 && (m % 2) ? 0 : span(krows, kcols, ldk);
    const int64_t sv = sk == 0 ? 0 : span(n, dv, ldv), so = span(m, dv, ldo);
    /* the padding mask is one row for every query row (ldmask 0) */
    const int64_t mrows = mask_kind == ATT_PADDING ? 1 : m;
    const int64_t ldm = mask_kind == ATT_PADDING ? 0 : n + rng_int(rng, 0, 1) * 9;
    const int64_t plen = rng_int(rng, 0, n); /* keys kept by the padding mask */
    const float scale = (flags & TIRBYOC_ATT_DIVIDE) ? 4.0f : 0.25f;
    const int keep = (flags & TIRBYOC_ATT_MASK_KEEP) != 0;
    const double masked_value = (flags & TIRBYOC_ATT_MASK_LOWEST) ? -FLT_MAX : -INFINITY;
    buf_t bq, bk, bv, bo;
    float *q = buf_alloc(&bq, (size_t)(sq * (batch - 1)) + span(m, d, ldq), 1);
    float *k = buf_alloc(&bk, (size_t)(sk * (batch - 1)) + span(krows, kcols, ldk), 2);
    float *v = buf_alloc(&bv, (size_t)(sv * (batch - 1)) + span(n, dv, ldv), 3);
    float *o = buf_alloc(&bo, (size_t)(so * (batch - 1)) + span(m, dv, ldo), 0);
    const size_t mbytes = mrows > 0 && n > 0 ? (size_t)((mrows - 1) * (ldm ? ldm : n) + n) : 0;
    /* random masks: one per batch item, or per 3 items in a row (mask_repeat 3: the
     * heads of one sequence); the others one for the whole batch (stride 0) */
    const int64_t rep = mask_kind == ATT_RANDOM && batch % 3 == 0 ? 3 : 1;
    const int64_t mitems = mask_kind == ATT_RANDOM ? batch / rep : 1;
    const int64_t sm = mitems > 1 ? (int64_t)mbytes : 0;
    uint8_t *mask = NULL;
    double worst = 0;
    int64_t b, i, j, c, p;
    size_t t;
    int32_t st;
    for (t = 0; t < bq.n; ++t) q[t] = rng_float(rng) * 2;
    for (t = 0; t < bk.n; ++t) k[t] = rng_float(rng) * 2;
    for (t = 0; t < bv.n; ++t) v[t] = rng_float(rng);
    for (t = 0; t < bo.n; ++t) o[t] = UNWRITTEN;
    if (mask_kind == ATT_CAUSAL && n > 3 && dv > 0)
        v[(n - 1) * ldv] = INFINITY; /* past every causal row but the last */
    if (specials && m > 2 && d > 0 && n > 1) {
        q[(m / 3) * ldq] = nan_f();                     /* a NaN row */
        q[(m / 2) * ldq + d - 1] = INFINITY;           /* +-inf scores (or NaN) */
        k[k_nk ? (n - 1) * ldk : n - 1] = -INFINITY;    /* the last key's first value */
    }
    if (mask_kind != ATT_NO_MASK && mbytes > 0) {
        mask = (uint8_t *)malloc(mbytes * (size_t)mitems);
        memset(mask, 0xA5, mbytes * (size_t)mitems); /* the stride padding */
        for (b = 0; b < mitems; ++b)
            for (i = 0; i < mrows; ++i)
                for (j = 0; j < n; ++j) {
                    int masked = mask_kind == ATT_RANDOM ? rng_int(rng, 0, 2) == 0
                                 : mask_kind == ATT_CAUSAL ? j > i : j >= plen;
                    if (i == m / 2 && mask_kind == ATT_RANDOM)
                        masked = 1; /* a fully masked row */
                    mask[b * sm + i * ldm + j] =
                        (uint8_t)(masked != keep ? 1 + rng_int(rng, 0, 1) * 254 : 0);
                }
    }
    st = tirbyoc_attention_f32(batch, m, n, d, dv, q, ldq, sq, k, ldk, sk,
                               k_nk ? TIRBYOC_B_NK : TIRBYOC_B_KN, v, ldv, sv, mask, ldm, sm,
                               rep, flags, scale, o, ldo, so);
    check(st == TIRBYOC_OK, "status", "tirbyoc_attention_f32", m, n, d, NULL);
    for (b = 0; b < batch && st == TIRBYOC_OK; ++b)
        for (i = 0; i < m; ++i) {
            double *sc = (double *)malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
            double mx = -INFINITY, sum = 0;
            int nan_score = 0;
            for (j = 0; j < n; ++j) {
                double dot = 0;
                for (p = 0; p < d; ++p)
                    dot += (double)q[b * sq + i * ldq + p] *
                           (double)k[b * sk + (k_nk ? j * ldk + p : p * ldk + j)];
                dot = (flags & TIRBYOC_ATT_DIVIDE) ? dot / scale : dot * scale;
                if (mask != NULL &&
                    (mask[b / rep * sm + (mask_kind == ATT_PADDING ? 0 : i) * ldm + j] != 0) != keep)
                    dot = (flags & TIRBYOC_ATT_MASK_ADD) ? dot + masked_value : masked_value;
                sc[j] = dot;
                nan_score |= isnan(dot);
                mx = dot > mx ? dot : mx;
            }
            if (nan_score)
                mx = NAN; /* as the graph's max: NaN propagates */
            for (j = 0; j < n; ++j)
                sum += exp(sc[j] - (mx == -INFINITY ? 0 : mx));
            for (c = 0; c < dv; ++c) {
                double want = 0, got = o[b * so + i * ldo + c], err;
                /* NAN_ZERO: a row of NaN weights (a NaN or +inf score, or all -inf)
                 * weighs every key 0 */
                const int zero_row = (flags & TIRBYOC_ATT_NAN_ZERO) &&
                                     (nan_score || isnan(sum) || sum == 0);
                for (j = 0; j < n; ++j) {
                    double w = exp(sc[j] - (mx == -INFINITY ? 0 : mx));
                    w = zero_row ? 0.0
                        : sum == 0 ? ((flags & TIRBYOC_ATT_EMPTY_ZERO) ? 0.0 : NAN) : w / sum;
                    want += w * (double)v[b * sv + j * ldv + c];
                }
                if (n == 0)
                    want = 0;
                if (isnan(want) || isnan(got))
                    err = isnan(want) == isnan(got) ? 0 : INFINITY;
                else if (isinf(want) || isinf(got))
                    err = want == got ? 0 : INFINITY;
                else
                    /* score rounding grows with d (|scores| up to about d / 4) */
                    err = fabs(got - want) > 1e-5 * fabs(want) + 1e-6 * (d > 32 ? d / 16.0 : 2)
                              ? fabs(got - want) : 0;
                worst = err > worst ? err : worst;
            }
            free(sc);
        }
    {
        char detail[112];
        snprintf(detail, sizeof(detail), "batch=%lld dv=%lld mask=%d flags=%d specials=%d worst %.3g",
                 (long long)batch, (long long)dv, mask_kind, flags, specials, worst);
        check(worst == 0, "attention result", "tirbyoc_attention_f32", m, n, d, detail);
    }
    /* the stride padding of O is untouched (batch items start right after the last
     * row's DV floats: that row has none) */
    {
        int ok = 1;
        for (b = 0; b < batch; ++b)
            for (i = 0; i + 1 < m; ++i)
                for (c = dv; c < ldo; ++c)
                    ok &= o[b * so + i * ldo + c] == UNWRITTEN;
        check(ok, "stride padding of O written", "tirbyoc_attention_f32", m, n, d, NULL);
    }
    if (threads_check && bo.n > 0) {
        float *first = (float *)malloc(bo.n * sizeof(float));
        const int saved = tirbyoc_num_threads();
        int th;
        memcpy(first, o, bo.n * sizeof(float));
        for (th = 0; th < N_THREAD_COUNTS; ++th) {
            tirbyoc_set_num_threads(THREAD_COUNTS[th]);
            for (t = 0; t < bo.n; ++t) o[t] = UNWRITTEN;
            check(tirbyoc_attention_f32(batch, m, n, d, dv, q, ldq, sq, k, ldk, sk,
                                        k_nk ? TIRBYOC_B_NK : TIRBYOC_B_KN, v, ldv, sv, mask,
                                        ldm, sm, rep, flags, scale, o, ldo, so) == TIRBYOC_OK,
                  "status (threads)", "tirbyoc_attention_f32", m, n, d, NULL);
            check(memcmp(first, o, bo.n * sizeof(float)) == 0, "result differs between thread counts",
                  "tirbyoc_attention_f32", m, n, d, NULL);
        }
        tirbyoc_set_num_threads(saved);
        free(first);
    }
    free(mask);
    buf_free(&bq); buf_free(&bk); buf_free(&bv); buf_free(&bo);
}

/* Every invalid argument gives its status and leaves O (all of its buffer) untouched. */
static void attention_errors(void)
{
    enum { M = 4, N = 6, D = 8, DV = 5 };
    static const char *const name = "tirbyoc_attention_f32";
    float q[M * D], k[N * D], v[N * DV], o[M * DV];
    uint8_t mask[M * N];
    int64_t att_repeat = 1; /* the mask_repeat of ATT */
    int ok = 1, t;
    for (t = 0; t < M * D; ++t) q[t] = 0.5f;
    for (t = 0; t < N * D; ++t) k[t] = 0.25f;
    for (t = 0; t < N * DV; ++t) v[t] = 1.0f;
    for (t = 0; t < M * DV; ++t) o[t] = UNWRITTEN;
    memset(mask, 0, sizeof(mask));
#define ATT(batch, m, n, d, dv, qp, ldq, sq, kp, ldk, sk, lay, vp, ldv, sv, mp, ldm, sm, fl, op, ldo, so) \
    tirbyoc_attention_f32(batch, m, n, d, dv, qp, ldq, sq, kp, ldk, sk, lay, vp, ldv, sv, mp, ldm, sm, \
                          att_repeat, fl, 1.0f, op, ldo, so)
#define ATT_BAD(want, what, ...) check(ATT(__VA_ARGS__) == (want), what, name, M, N, D, "status")
    ATT_BAD(TIRBYOC_EINVAL, "k_layout packed", 1, M, N, D, DV, q, D, 0, k, D, 0, TIRBYOC_B_PACKED, v, DV, 0, NULL, 0, 0, 0, o, DV, 0);
    ATT_BAD(TIRBYOC_EINVAL, "k_layout -1", 1, M, N, D, DV, q, D, 0, k, D, 0, -1, v, DV, 0, NULL, 0, 0, 0, o, DV, 0);
    ATT_BAD(TIRBYOC_EINVAL, "unknown flag", 1, M, N, D, DV, q, D, 0, k, D, 0, TIRBYOC_B_NK, v, DV, 0, NULL, 0, 0, 64, o, DV, 0);
    ATT_BAD(TIRBYOC_EINVAL, "high flag", 1, M, N, D, DV, q, D, 0, k, D, 0, TIRBYOC_B_NK, v, DV, 0, NULL, 0, 0, 1 << 30, o, DV, 0);
    att_repeat = 0;
    ATT_BAD(TIRBYOC_EINVAL, "mask_repeat 0", 1, M, N, D, DV, q, D, 0, k, D, 0, TIRBYOC_B_NK, v, DV, 0, mask, N, 0, 0, o, DV, 0);
    att_repeat = -3;
    ATT_BAD(TIRBYOC_EINVAL, "mask_repeat -3", 1, M, N, D, DV, q, D, 0, k, D, 0, TIRBYOC_B_NK, v, DV, 0, NULL, 0, 0, 0, o, DV, 0);
    att_repeat = 1;
    ATT_BAD(TIRBYOC_ESIZE, "batch < 0", -1, M, N, D, DV, q, D, 0, k, D, 0, TIRBYOC_B_NK, v, DV, 0, NULL, 0, 0, 0, o, DV, 0);
    ATT_BAD(TIRBYOC_ESIZE, "m < 0", 1, -1, N, D, DV, q, D, 0, k, D, 0, TIRBYOC_B_NK, v, DV, 0, NULL, 0, 0, 0, o, DV, 0);
    ATT_BAD(TIRBYOC_ESIZE, "n < 0", 1, M, INT64_MIN, D, DV, q, D, 0, k, D, 0, TIRBYOC_B_NK, v, DV, 0, NULL, 0, 0, 0, o, DV, 0);
    ATT_BAD(TIRBYOC_ESIZE, "d < 0", 1, M, N, -1, DV, q, D, 0, k, D, 0, TIRBYOC_B_NK, v, DV, 0, NULL, 0, 0, 0, o, DV, 0);
    ATT_BAD(TIRBYOC_ESIZE, "dv < 0", 1, M, N, D, -3, q, D, 0, k, D, 0, TIRBYOC_B_NK, v, DV, 0, NULL, 0, 0, 0, o, DV, 0);
    ATT_BAD(TIRBYOC_ESIZE, "stride_q < 0", 2, M, N, D, DV, q, D, -1, k, D, 0, TIRBYOC_B_NK, v, DV, 0, NULL, 0, 0, 0, o, DV, 0);
    ATT_BAD(TIRBYOC_ESIZE, "stride_k < 0", 2, M, N, D, DV, q, D, 0, k, D, -1, TIRBYOC_B_NK, v, DV, 0, NULL, 0, 0, 0, o, DV, 0);
    ATT_BAD(TIRBYOC_ESIZE, "stride_v < 0", 2, M, N, D, DV, q, D, 0, k, D, 0, TIRBYOC_B_NK, v, DV, -1, NULL, 0, 0, 0, o, DV, 0);
    ATT_BAD(TIRBYOC_ESIZE, "stride_mask < 0", 1, M, N, D, DV, q, D, 0, k, D, 0, TIRBYOC_B_NK, v, DV, 0, mask, N, -1, 0, o, DV, 0);
    ATT_BAD(TIRBYOC_ESIZE, "ldmask < 0", 1, M, N, D, DV, q, D, 0, k, D, 0, TIRBYOC_B_NK, v, DV, 0, mask, -1, 0, 0, o, DV, 0);
    ATT_BAD(TIRBYOC_ESIZE, "stride_o < 0", 2, M, N, D, DV, q, D, 0, k, D, 0, TIRBYOC_B_NK, v, DV, 0, NULL, 0, 0, 0, o, DV, -1);
    ATT_BAD(TIRBYOC_ESIZE, "d + dv > 4096", 1, M, N, 4000, 97, q, 4000, 0, k, 4000, 0, TIRBYOC_B_NK, v, 97, 0, NULL, 0, 0, 0, o, 97, 0);
    ATT_BAD(TIRBYOC_ESTRIDE, "ldq < d", 1, M, N, D, DV, q, D - 1, 0, k, D, 0, TIRBYOC_B_NK, v, DV, 0, NULL, 0, 0, 0, o, DV, 0);
    ATT_BAD(TIRBYOC_ESTRIDE, "ldk < d", 1, M, N, D, DV, q, D, 0, k, D - 1, 0, TIRBYOC_B_NK, v, DV, 0, NULL, 0, 0, 0, o, DV, 0);
    ATT_BAD(TIRBYOC_ESTRIDE, "ldk < n", 1, M, N, D, DV, q, D, 0, k, N - 1, 0, TIRBYOC_B_KN, v, DV, 0, NULL, 0, 0, 0, o, DV, 0);
    ATT_BAD(TIRBYOC_ESTRIDE, "ldv < dv", 1, M, N, D, DV, q, D, 0, k, D, 0, TIRBYOC_B_NK, v, DV - 1, 0, NULL, 0, 0, 0, o, DV, 0);
    ATT_BAD(TIRBYOC_ESTRIDE, "ldmask < n", 1, M, N, D, DV, q, D, 0, k, D, 0, TIRBYOC_B_NK, v, DV, 0, mask, N - 1, 0, 0, o, DV, 0);
    ATT_BAD(TIRBYOC_ESTRIDE, "ldo < dv", 1, M, N, D, DV, q, D, 0, k, D, 0, TIRBYOC_B_NK, v, DV, 0, NULL, 0, 0, 0, o, DV - 1, 0);
    ATT_BAD(TIRBYOC_ENULL, "q NULL", 1, M, N, D, DV, NULL, D, 0, k, D, 0, TIRBYOC_B_NK, v, DV, 0, NULL, 0, 0, 0, o, DV, 0);
    ATT_BAD(TIRBYOC_ENULL, "k NULL", 1, M, N, D, DV, q, D, 0, NULL, D, 0, TIRBYOC_B_NK, v, DV, 0, NULL, 0, 0, 0, o, DV, 0);
    ATT_BAD(TIRBYOC_ENULL, "v NULL", 1, M, N, D, DV, q, D, 0, k, D, 0, TIRBYOC_B_NK, NULL, DV, 0, NULL, 0, 0, 0, o, DV, 0);
    ATT_BAD(TIRBYOC_ENULL, "o NULL", 1, M, N, D, DV, q, D, 0, k, D, 0, TIRBYOC_B_NK, v, DV, 0, NULL, 0, 0, 0, NULL, DV, 0);
    for (t = 0; t < M * DV; ++t)
        ok &= o[t] == UNWRITTEN;
    check(ok, "O written despite an error", name, M, N, D, NULL);
    /* nothing to compute: NULL everywhere is fine; no keys: O = 0 */
    check(ATT(1, 0, N, D, DV, NULL, D, 0, NULL, D, 0, TIRBYOC_B_NK, NULL, DV, 0, NULL, 0, 0, 0, NULL, DV, 0) == TIRBYOC_OK,
          "m = 0 with NULL", name, 0, N, D, NULL);
    check(ATT(1, M, 0, D, DV, q, D, 0, NULL, D, 0, TIRBYOC_B_NK, NULL, DV, 0, NULL, 0, 0, 0, o, DV, 0) == TIRBYOC_OK,
          "n = 0", name, M, 0, D, NULL);
    for (t = 0, ok = 1; t < M * DV; ++t)
        ok &= o[t] == 0.0f;
    check(ok, "n = 0 gives zeros", name, M, 0, D, NULL);
#undef ATT_BAD
#undef ATT
}

static void attention_cases(uint64_t *rng, int threaded)
{
    static const int64_t shapes[][5] = {
        /* batch, m, n, d, dv */
        {1, 1, 1, 1, 1}, {2, 13, 17, 5, 7}, {3, 15, 257, 16, 33}, {1, 57, 300, 64, 64},
        {2, 14, 40, 300, 20}, {1, 6, 0, 4, 3}, {1, 4, 9, 0, 5}, {12, 64, 64, 16, 16},
        {1, 7, 33, 3000, 1000}, {2, 25, 520, 17, 257},
    };
    const size_t count = sizeof(shapes) / sizeof(shapes[0]);
    size_t si;
    int variant;
    for (si = 0; si < count; ++si)
        for (variant = 0; variant < ATT_MASK_KINDS; ++variant)
            attention_case(rng, shapes[si][0], shapes[si][1], shapes[si][2], shapes[si][3],
                           shapes[si][4], (int)((si + (size_t)variant) % 2), variant,
                           (int)((si + (size_t)variant) % 16) |
                               ((si * 3 + (size_t)variant) % 2 ? TIRBYOC_ATT_MASK_LOWEST : 0) |
                               ((si + 2 * (size_t)variant) % 3 == 1 ? TIRBYOC_ATT_NAN_ZERO : 0),
                           (int)((si + (size_t)variant) % 3 == 1),
                           0);
    /* above the threading threshold (2 MFLOP): the same bits on 1, 2 and 3 threads */
    attention_case(rng, 3, 100, 300, 32, 32, 1, ATT_CAUSAL, TIRBYOC_ATT_EMPTY_ZERO, 1, 1);
    attention_case(rng, 3, 100, 300, 32, 32, 0, ATT_PADDING, TIRBYOC_ATT_MASK_ADD, 1, 1);
    attention_case(rng, 3, 100, 300, 32, 32, 1, ATT_CAUSAL,
                   TIRBYOC_ATT_MASK_ADD | TIRBYOC_ATT_MASK_LOWEST, 0, 1);
    attention_case(rng, 3, 100, 300, 32, 32, 0, ATT_RANDOM, TIRBYOC_ATT_MASK_LOWEST, 1, 1);
    attention_case(rng, 3, 100, 300, 32, 32, 1, ATT_CAUSAL,
                   TIRBYOC_ATT_NAN_ZERO | TIRBYOC_ATT_MASK_ADD | TIRBYOC_ATT_MASK_LOWEST, 1, 1);
    if (!threaded)
        attention_case(rng, 2, 70, 257, 40, 24, 0, ATT_RANDOM, TIRBYOC_ATT_MASK_KEEP, 0, 1);
    attention_errors();
}

/* ---- tirbyoc_conv2d_f32 ---- */

/* The arguments of one tirbyoc_conv2d_f32 call (y aside). */
typedef struct {
    int64_t n, c, h, w;
    const float *x;
    int64_t oc, gr, kh, kw;
    const float *wt;
    int64_t sh, sw, pt, pl, dh, dw, oh, ow, ops;
    const float *bias, *res;
} conv_call_t;

/* The call's weight and bias packed by tirbyoc_pack_conv2d_weight_f32 into a
 * block of exactly tirbyoc_conv2d_packed_size_f32 floats: that size and every
 * float of the documented layout (bit for bit, zeros in the padding lanes);
 * then tirbyoc_conv2d_f32_packed into a block of its own, equal to
 * tirbyoc_conv2d_f32's y[0:ny] bit for bit (on 1, 2 and 3 threads when
 * `threads_check`). */
static void conv_packed_case(const conv_call_t *a, const float *y, size_t ny,
                             int threads_check)
{
    static const char *const name = "tirbyoc_conv2d_f32_packed";
    const int has_bias = (a->ops & 15) == TIRBYOC_EPI_BIAS;
    const int64_t ocg = a->oc / a->gr, k = a->c / a->gr * a->kh * a->kw, kt = k + has_bias;
    const int64_t nq = (ocg + 15) / 16;
    const int64_t size = tirbyoc_conv2d_packed_size_f32(a->oc, a->gr, k, has_bias);
    buf_t bp, by;
    float *pk, *y2;
    size_t q;
    int ok = 1, e;
    check(size == a->gr * nq * 16 * kt, "packed size", "tirbyoc_conv2d_packed_size_f32",
          a->oc, a->gr, k, NULL);
    if (size < 0)
        return;
    pk = buf_alloc(&bp, (size_t)size, 3);
    for (q = 0; q < bp.n; ++q)
        pk[q] = from_bits(SENTINEL);
    check(tirbyoc_pack_conv2d_weight_f32(a->oc, a->gr, k, a->wt, a->bias, pk) == TIRBYOC_OK,
          "status", "tirbyoc_pack_conv2d_weight_f32", a->oc, a->gr, k, NULL);
    for (q = 0; q < bp.n; ++q) {
        /* packed[((g * nq + pq) * kt + p) * 16 + r] */
        const int64_t r = (int64_t)q % 16, p = (int64_t)q / 16 % kt;
        const int64_t panel = (int64_t)q / 16 / kt, g = panel / nq, lane = panel % nq * 16 + r;
        const float want = lane >= ocg ? 0.0f
                           : p < k     ? a->wt[(g * ocg + lane) * k + p]
                                       : a->bias[g * ocg + lane];
        ok &= to_bits(pk[q]) == to_bits(want);
    }
    check(ok, "packed layout", "tirbyoc_pack_conv2d_weight_f32", a->oc, a->gr, k, NULL);
    y2 = buf_alloc(&by, ny, 2);
    for (e = 0; e < (threads_check ? N_THREAD_COUNTS : 1); ++e) {
        const int saved = tirbyoc_num_threads();
        if (threads_check)
            tirbyoc_set_num_threads(THREAD_COUNTS[e]);
        for (q = 0; q < ny; ++q)
            y2[q] = UNWRITTEN;
        check(tirbyoc_conv2d_f32_packed(a->n, a->c, a->h, a->w, a->x, a->oc, a->gr, a->kh,
                                        a->kw, pk, a->sh, a->sw, a->pt, a->pl, a->dh, a->dw,
                                        a->oh, a->ow, a->ops, a->res, y2) == TIRBYOC_OK,
              "status", name, a->oc, a->oh * a->ow, k, NULL);
        tirbyoc_set_num_threads(saved);
        check(memcmp(y, y2, ny * sizeof(float)) == 0,
              "differs from tirbyoc_conv2d_f32 (bit for bit)", name, a->oc, a->oh * a->ow, k,
              NULL);
    }
    buf_free(&bp);
    buf_free(&by);
}

/* For a 3x3 conv of stride 1 and dilation 1 in one group: the weight and
 * bias packed by tirbyoc_pack_conv2d_winograd_weight_f32 into a block of
 * exactly tirbyoc_conv2d_winograd_packed_size_f32 floats, then
 * tirbyoc_conv2d_winograd_f32 into a block of its own: the same bits on 1,
 * 2 and 3 threads, and (finite operands) within 1e-4 of max|y| of
 * tirbyoc_conv2d_f32's y[0:ny] (the Winograd rounding; the fuzz and
 * tests/test_winograd_kernel.py bound it per output). */
static void winograd_case(const conv_call_t *a, const float *y, size_t ny, int specials)
{
    static const char *const name = "tirbyoc_conv2d_winograd_f32";
    static const char *const pname = "tirbyoc_pack_conv2d_winograd_weight_f32";
    const int has_bias = (a->ops & 15) == TIRBYOC_EPI_BIAS;
    const int64_t ocp = (a->oc + 15) / 16 * 16;
    int64_t size;
    buf_t bp, by, bf;
    float *pk, *y2, *first;
    size_t q;
    int t;
    double scale = 1.0, worst = 0.0;
    if (a->gr != 1 || a->kh != 3 || a->kw != 3 || a->sh != 1 || a->sw != 1 || a->dh != 1 ||
        a->dw != 1 || a->c == 0)
        return;
    t = (int)tirbyoc_conv2d_winograd_suits(a->n, a->c, a->oc, 1, 3, 3, 1, 1, 1, 1, a->oh,
                                          a->ow);
    check(t == 0 || t == 1, "a 0 or 1", "tirbyoc_conv2d_winograd_suits", a->oc, a->c, 9, NULL);
    check(tirbyoc_conv2d_winograd_suits(a->n, a->c, a->oc, 1, 3, 3, 2, 1, 1, 1, a->oh,
                                        a->ow) == 0,
          "stride 2 not taken", "tirbyoc_conv2d_winograd_suits", a->oc, a->c, 9, NULL);
    size = tirbyoc_conv2d_winograd_packed_size_f32(a->oc, a->c);
    check(size == (36 * a->c + 1) * ocp, "packed size",
          "tirbyoc_conv2d_winograd_packed_size_f32", a->oc, a->c, 9, NULL);
    if (size < 0)
        return;
    pk = buf_alloc(&bp, (size_t)size, 3);
    check(tirbyoc_pack_conv2d_winograd_weight_f32(a->oc, a->c, a->wt,
                                                  has_bias ? a->bias : NULL, pk) == TIRBYOC_OK,
          "status", pname, a->oc, a->c, 9, NULL);
    y2 = buf_alloc(&by, ny, 2);
    first = buf_alloc(&bf, ny, 1);
    for (t = 0; t < N_THREAD_COUNTS; ++t) {
        const int saved = tirbyoc_num_threads();
        tirbyoc_set_num_threads(THREAD_COUNTS[t]);
        for (q = 0; q < ny; ++q)
            y2[q] = UNWRITTEN;
        check(tirbyoc_conv2d_winograd_f32(a->n, a->c, a->h, a->w, a->x, a->oc, pk, a->pt,
                                          a->pl, a->oh, a->ow, a->ops, a->res,
                                          y2) == TIRBYOC_OK,
              "status", name, a->oc, a->oh * a->ow, a->c * 9, NULL);
        tirbyoc_set_num_threads(saved);
        if (t == 0)
            memcpy(first, y2, ny * sizeof(float));
        else
            check(memcmp(first, y2, ny * sizeof(float)) == 0,
                  "differs across thread counts", name, a->oc, a->oh * a->ow, a->c * 9, NULL);
    }
    {
        /* the cached call from the weight as it is: the same bits, made by
         * the first call (one entry), found by the second */
        static int64_t key;
        const char *const cname = "tirbyoc_conv2d_winograd_cached_f32";
        int64_t before[5], after[5];
        int r;
        ++key;
        check(tirbyoc_winograd_cache_stats(before) == TIRBYOC_OK, "status",
              "tirbyoc_winograd_cache_stats", 0, 0, 0, NULL);
        for (r = 0; r < 2; ++r) {
            for (q = 0; q < ny; ++q)
                y2[q] = UNWRITTEN;
            tirbyoc_set_num_threads(THREAD_COUNTS[r + 1]);
            check(tirbyoc_conv2d_winograd_cached_f32(
                      key, -key, a->n, a->c, a->h, a->w, a->x, a->oc, a->wt,
                      has_bias ? a->bias : NULL, a->pt, a->pl, a->oh, a->ow, a->ops,
                      a->res, y2) == TIRBYOC_OK,
                  "status", cname, a->oc, a->oh * a->ow, a->c * 9, NULL);
            tirbyoc_set_num_threads(1);
            check(memcmp(first, y2, ny * sizeof(float)) == 0,
                  "differs from the packed weight's (bit for bit)", cname, a->oc,
                  a->oh * a->ow, a->c * 9, NULL);
        }
        check(tirbyoc_conv2d_winograd_cached_f32(key, -key, a->n, a->c, a->h, a->w, a->x,
                                                 a->oc, NULL, NULL, a->pt, a->pl, a->oh,
                                                 a->ow, a->ops, a->res,
                                                 y2) == TIRBYOC_ENULL,
              "a NULL weight accepted", cname, a->oc, a->oh * a->ow, a->c * 9, NULL);
        check(tirbyoc_winograd_cache_stats(after) == TIRBYOC_OK &&
                  after[3] - before[3] == (a->n * a->oc * a->oh * a->ow > 0),
              "one entry made by the first call only", cname, a->oc, a->oh * a->ow, a->c * 9,
              NULL);
    }
    if (!specials) {
        char detail[96];
        for (q = 0; q < ny; ++q)
            if (fabs((double)y[q]) > scale)
                scale = fabs((double)y[q]);
        for (q = 0; q < ny; ++q) {
            const double d = fabs((double)first[q] - (double)y[q]);
            if (!(d <= worst))
                worst = d; /* NaN included */
        }
        snprintf(detail, sizeof(detail), "(worst %.3g of max|y| %.3g)", worst, scale);
        check(worst <= 1e-4 * scale, "outside the Winograd rounding", name, a->oc,
              a->oh * a->ow, a->c * 9, detail);
    }
    buf_free(&bp);
    buf_free(&by);
    buf_free(&bf);
}

/* The operands of one conv test, each in a block that ends exactly at its
 * last float (ASan sees a read past any of them), and the call's arguments
 * (y aside). */
typedef struct {
    conv_call_t a;
    buf_t bx, bw, bb, br, by;
    float *y;
} conv_test_t;

typedef int32_t (*conv_fn)(const conv_call_t *a, float *y);

static int32_t call_conv2d(const conv_call_t *a, float *y)
{
    return tirbyoc_conv2d_f32(a->n, a->c, a->h, a->w, a->x, a->oc, a->gr, a->kh, a->kw, a->wt,
                              a->sh, a->sw, a->pt, a->pl, a->dh, a->dw, a->oh, a->ow, a->ops,
                              a->bias, a->res, y);
}

/* The depthwise kernel on a conv_call_t with gr = oc = c (or 1 without channels). */
static int32_t call_depthwise(const conv_call_t *a, float *y)
{
    return tirbyoc_depthwise_conv2d_f32(a->n, a->c, a->h, a->w, a->x, a->kh, a->kw, a->wt,
                                        a->sh, a->sw, a->pt, a->pl, a->dh, a->dw, a->oh,
                                        a->ow, a->ops, a->bias, a->res, y);
}

/* Random operands of a conv of x [n, c, h, w] into oc channels in gr groups
 * (PyTorch's output size), a bias and a residual where the chain `ops` has
 * them, y all UNWRITTEN; a NaN in x when `specials`. */
static void conv_test_init(conv_test_t *t, uint64_t *rng, int64_t n, int64_t c, int64_t h,
                           int64_t w, int64_t oc, int64_t gr, int64_t kh, int64_t kw,
                           int64_t sh, int64_t sw, int64_t pt, int64_t pl, int64_t dh,
                           int64_t dw, int64_t ops, int specials)
{
    const int64_t oh = (h + 2 * pt - dh * (kh - 1) - 1) / sh + 1;
    const int64_t ow = (w + 2 * pl - dw * (kw - 1) - 1) / sw + 1;
    const int has_bias = (ops & 15) == TIRBYOC_EPI_BIAS;
    int has_res = 0, e;
    float *x, *wt, *bias, *res;
    size_t q;
    for (e = 0; e < 16; ++e)
        has_res |= (int)(((uint64_t)ops >> (4 * e)) & 15u) == TIRBYOC_EPI_RESIDUAL;
    x = buf_alloc(&t->bx, (size_t)(n * c * h * w), 1);
    wt = buf_alloc(&t->bw, (size_t)(oc * (c / gr) * kh * kw), 2);
    bias = buf_alloc(&t->bb, has_bias ? (size_t)oc : 0, 3);
    res = buf_alloc(&t->br, has_res ? (size_t)(n * oc * oh * ow) : 0, 1);
    t->y = buf_alloc(&t->by, (size_t)(n * oc * oh * ow), 0);
    for (q = 0; q < t->bx.n; ++q) x[q] = rng_float(rng);
    for (q = 0; q < t->bw.n; ++q) wt[q] = rng_float(rng);
    for (q = 0; q < t->bb.n; ++q) bias[q] = rng_float(rng);
    for (q = 0; q < t->br.n; ++q) res[q] = rng_float(rng);
    for (q = 0; q < t->by.n; ++q) t->y[q] = UNWRITTEN;
    if (specials && t->bx.n > 0)
        x[t->bx.n / 2] = nan_f();
    t->a = (conv_call_t){n, c, h, w, x, oc, gr, kh, kw, wt, sh, sw, pt, pl, dh, dw, oh, ow,
                         ops, has_bias ? bias : NULL, has_res ? res : NULL};
}

static void conv_test_free(conv_test_t *t)
{
    buf_free(&t->bx); buf_free(&t->bw); buf_free(&t->bb); buf_free(&t->br); buf_free(&t->by);
}

/* `call` on t's operands, y against a double direct sum (per group) and the
 * chain: NaN exactly where the reference has one, else within 1e-5 of the
 * terms' magnitudes. Returns whether the status was TIRBYOC_OK. */
static int conv_test_run(const char *name, conv_fn call, conv_test_t *t)
{
    const conv_call_t *a = &t->a;
    const int64_t cg = a->c / a->gr, ocg = a->oc / a->gr, k = cg * a->kh * a->kw;
    const float *y = t->y;
    double worst = 0;
    int64_t b, o, i, j, ci, r, s;
    int e;
    const int32_t st = call(a, t->y);
    check(st == TIRBYOC_OK, "status", name, a->oc, a->oh * a->ow, k, NULL);
    for (b = 0; b < a->n && st == TIRBYOC_OK; ++b)
        for (o = 0; o < a->oc; ++o)
            for (i = 0; i < a->oh; ++i)
                for (j = 0; j < a->ow; ++j) {
                    const size_t at = (size_t)(((b * a->oc + o) * a->oh + i) * a->ow + j);
                    double want = 0, size = 0, got = y[at];
                    for (ci = 0; ci < cg; ++ci)
                        for (r = 0; r < a->kh; ++r)
                            for (s = 0; s < a->kw; ++s) {
                                const int64_t ih = i * a->sh - a->pt + r * a->dh;
                                const int64_t iw = j * a->sw - a->pl + s * a->dw;
                                double term;
                                if (ih < 0 || ih >= a->h || iw < 0 || iw >= a->w)
                                    continue;
                                term = (double)a->x[((b * a->c + o / ocg * cg + ci) * a->h + ih) *
                                                        a->w + iw] *
                                       (double)a->wt[((o * cg + ci) * a->kh + r) * a->kw + s];
                                want += term;
                                size += fabs(term);
                            }
                    for (e = 0; e < 16; ++e) {
                        const int op = (int)(((uint64_t)a->ops >> (4 * e)) & 15u);
                        if (op == TIRBYOC_EPI_BIAS)
                            want += a->bias[o], size += fabs((double)a->bias[o]);
                        else if (op == TIRBYOC_EPI_RESIDUAL)
                            want += a->res[at], size += fabs((double)a->res[at]);
                        else if (op != TIRBYOC_EPI_END)
                            want = unary_d(op, want);
                    }
                    if (isnan(want) || isnan(got)) {
                        check(isnan(want) && isnan(got), "NaN placement", name, a->oc,
                              a->oh * a->ow, k, NULL);
                        continue;
                    }
                    {
                        const double err = fabs(got - want) / (size * 1e-5 + 1e-6);
                        worst = err > worst ? err : worst;
                    }
                }
    check(worst <= 1.0, "accuracy", name, a->oc, a->oh * a->ow, k, NULL);
    return st == TIRBYOC_OK;
}

/* `call` again on t's operands, y reset each time: with the environment
 * variable `env` set to each of values[0:nvalues] (none: as it is), on 1, 2
 * and 3 threads when `threads_check` (else the current count); the same bits
 * as the first call's y every time. */
static void conv_test_repeat(const char *name, conv_fn call, conv_test_t *t, const char *env,
                             const char *const *values, size_t nvalues, int threads_check)
{
    const conv_call_t *a = &t->a;
    const int64_t k = a->c / a->gr * a->kh * a->kw;
    const int saved = tirbyoc_num_threads();
    const size_t ny = t->by.n;
    float *first = (float *)malloc(ny * sizeof(float) + 1);
    size_t v, q;
    int e;
    memcpy(first, t->y, ny * sizeof(float));
    for (v = 0; v < (nvalues > 0 ? nvalues : 1); ++v) {
        const char *detail = nvalues > 0 ? values[v] : NULL;
        if (nvalues > 0)
            setenv(env, values[v], 1);
        for (e = 0; e < (threads_check ? N_THREAD_COUNTS : 1); ++e) {
            tirbyoc_set_num_threads(threads_check ? THREAD_COUNTS[e] : saved);
            for (q = 0; q < ny; ++q)
                t->y[q] = UNWRITTEN;
            check(call(a, t->y) == TIRBYOC_OK, "status (paths, threads)", name, a->oc,
                  a->oh * a->ow, k, detail);
            check(memcmp(first, t->y, ny * sizeof(float)) == 0,
                  "result differs between paths or thread counts", name, a->oc,
                  a->oh * a->ow, k, detail);
        }
    }
    if (nvalues > 0)
        unsetenv(env);
    tirbyoc_set_num_threads(saved);
    free(first);
}

/* One conv (in gr groups) against the reference (conv_test_run); the same
 * bits on 1, 2 and 3 threads when `threads_check`. Then the weight and bias
 * packed by tirbyoc_pack_conv2d_weight_f32 (conv_packed_case). */
static void conv_case(uint64_t *rng, int64_t n, int64_t c, int64_t h, int64_t w,
                      int64_t oc, int64_t gr, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                      int64_t pt, int64_t pl, int64_t dh, int64_t dw, int64_t ops,
                      int specials, int threads_check)
{
    static const char *const name = "tirbyoc_conv2d_f32";
    conv_test_t t;
    conv_test_init(&t, rng, n, c, h, w, oc, gr, kh, kw, sh, sw, pt, pl, dh, dw, ops, specials);
    if (conv_test_run(name, call_conv2d, &t)) {
        if (threads_check)
            conv_test_repeat(name, call_conv2d, &t, NULL, NULL, 0, 1);
        conv_packed_case(&t.a, t.y, t.by.n, threads_check);
        winograd_case(&t.a, t.y, t.by.n, specials);
    }
    conv_test_free(&t);
}

/* The invalid arguments both conv kernels refuse, each on a copy of the
 * valid call `good` (x [1, 2, 5, 5], a 3x3 filter, padding 1, OH = OW = 5,
 * no chain, bias and residual NULL): its status, and y (ny floats, all
 * UNWRITTEN) left untouched. */
static void conv_shared_errors(const char *name, conv_fn call, const conv_call_t *good,
                               float *bias, float *y, size_t ny)
{
    const int64_t k = good->c / good->gr * good->kh * good->kw, p = good->oh * good->ow;
    const int64_t relu_bias = TIRBYOC_EPI_RELU | TIRBYOC_EPI_BIAS << 4;
    size_t q;
    int ok = 1;
#define BAD(want, what, EDIT)                                                   \
    do {                                                                       \
        conv_call_t a = *good;                                                 \
        EDIT;                                                                  \
        check(call(&a, y) == (want), what, name, good->oc, p, k, "status");    \
    } while (0)
    BAD(TIRBYOC_ESIZE, "negative batch", a.n = -1);
    BAD(TIRBYOC_ESIZE, "negative channels", a.c = -2);
    BAD(TIRBYOC_ESIZE, "negative kernel", a.kh = -3);
    BAD(TIRBYOC_ESIZE, "huge size", a.oh = (int64_t)1 << 31);
    BAD(TIRBYOC_EINVAL, "stride 0", a.sh = 0);
    BAD(TIRBYOC_EINVAL, "dilation -1", a.dh = -1);
    BAD(TIRBYOC_EINVAL, "padding", a.pt = (int64_t)1 << 31);
    BAD(TIRBYOC_EEPILOGUE, "bias not first", (a.ops = relu_bias, a.bias = bias));
    BAD(TIRBYOC_EEPILOGUE, "scale", a.ops = TIRBYOC_EPI_SCALE);
    BAD(TIRBYOC_EEPILOGUE, "divide", a.ops = TIRBYOC_EPI_DIVIDE);
    BAD(TIRBYOC_EEPILOGUE, "unknown op", a.ops = 15);
    BAD(TIRBYOC_ENULL, "NULL bias", a.ops = TIRBYOC_EPI_BIAS);
    BAD(TIRBYOC_ENULL, "NULL residual", a.ops = TIRBYOC_EPI_RESIDUAL);
    BAD(TIRBYOC_ENULL, "NULL x", a.x = NULL);
    BAD(TIRBYOC_ENULL, "NULL weight", a.wt = NULL);
#undef BAD
    for (q = 0; q < ny; ++q)
        ok &= to_bits(y[q]) == to_bits(UNWRITTEN);
    check(ok, "wrote y on an error", name, good->oc, p, k, NULL);
}

/* Every invalid argument gives its status and leaves y untouched. */
static void conv_errors(void)
{
    static const char *const name = "tirbyoc_conv2d_f32";
    float x[2 * 5 * 5], wt[3 * 2 * 9], bias[3], y[3 * 5 * 5];
    const conv_call_t good = {1, 2, 5, 5, x, 3, 1, 3, 3, wt, 1, 1, 1, 1, 1, 1, 5, 5, 0,
                              NULL, NULL};
    conv_call_t a = good;
    int t, ok = 1;
    for (t = 0; t < 50; ++t) x[t] = 1.0f;
    for (t = 0; t < 54; ++t) wt[t] = 0.5f;
    for (t = 0; t < 3; ++t) bias[t] = 0.25f;
    for (t = 0; t < 75; ++t) y[t] = UNWRITTEN;
    conv_shared_errors(name, call_conv2d, &good, bias, y, 75);
    /* groups: below 1, or not dividing C (2) or OC (3) */
    a.gr = 0;
    check(call_conv2d(&a, y) == TIRBYOC_EINVAL, "groups 0", name, 3, 25, 18, "status");
    a.gr = 2;
    check(call_conv2d(&a, y) == TIRBYOC_EINVAL, "groups 2 of OC 3", name, 3, 25, 18, "status");
    a.gr = 3;
    check(call_conv2d(&a, y) == TIRBYOC_EINVAL, "groups 3 of C 2", name, 3, 25, 18, "status");
    for (t = 0; t < 75; ++t)
        ok &= to_bits(y[t]) == to_bits(UNWRITTEN);
    check(ok, "wrote y on an error", name, 3, 25, 18, NULL);
}

/* The packing's and the packed call's invalid arguments: their statuses, and
 * neither the packed buffer nor y written. */
static void conv_packed_errors(void)
{
    static const char *const name = "tirbyoc_conv2d_f32_packed";
    static const char *const pname = "tirbyoc_pack_conv2d_weight_f32";
    float x[2 * 5 * 5], wt[4 * 2 * 9], bias[4], pk[4 * 16 * 19], y[4 * 5 * 5];
    const int64_t bias_relu = TIRBYOC_EPI_BIAS | TIRBYOC_EPI_RELU << 4;
    int t, ok = 1;
    for (t = 0; t < 50; ++t) x[t] = 1.0f;
    for (t = 0; t < 72; ++t) wt[t] = 0.5f;
    for (t = 0; t < 4; ++t) bias[t] = 0.25f;
    for (t = 0; t < 4 * 16 * 19; ++t) pk[t] = UNWRITTEN;
    for (t = 0; t < 100; ++t) y[t] = UNWRITTEN;
    check(tirbyoc_conv2d_packed_size_f32(4, 0, 18, 1) == -1, "groups 0",
          "tirbyoc_conv2d_packed_size_f32", 4, 0, 18, "size");
    check(tirbyoc_conv2d_packed_size_f32(4, 3, 18, 1) == -1, "groups 3 of OC 4",
          "tirbyoc_conv2d_packed_size_f32", 4, 3, 18, "size");
    check(tirbyoc_conv2d_packed_size_f32(-4, 1, 18, 0) == -1, "negative OC",
          "tirbyoc_conv2d_packed_size_f32", -4, 1, 18, "size");
    check(tirbyoc_conv2d_packed_size_f32(4, 1, -18, 0) == -1, "negative K",
          "tirbyoc_conv2d_packed_size_f32", 4, 1, -18, "size");
    check(tirbyoc_conv2d_packed_size_f32((int64_t)1 << 40, 1, (int64_t)1 << 30, 1) == -1,
          "size past int64_t", "tirbyoc_conv2d_packed_size_f32", 1, 1, 1, "size");
    check(tirbyoc_pack_conv2d_weight_f32(4, 0, 18, wt, bias, pk) == TIRBYOC_EINVAL,
          "groups 0", pname, 4, 0, 18, "status");
    check(tirbyoc_pack_conv2d_weight_f32(4, 3, 18, wt, bias, pk) == TIRBYOC_EINVAL,
          "groups 3 of OC 4", pname, 4, 3, 18, "status");
    check(tirbyoc_pack_conv2d_weight_f32(-4, 1, 18, wt, bias, pk) == TIRBYOC_ESIZE,
          "negative OC", pname, -4, 1, 18, "status");
    check(tirbyoc_pack_conv2d_weight_f32(4, 1, -1, wt, NULL, pk) == TIRBYOC_ESIZE,
          "negative K", pname, 4, 1, -1, "status");
    check(tirbyoc_pack_conv2d_weight_f32(4, 1, 18, NULL, bias, pk) == TIRBYOC_ENULL,
          "NULL weight", pname, 4, 1, 18, "status");
    check(tirbyoc_pack_conv2d_weight_f32(4, 1, 18, wt, bias, NULL) == TIRBYOC_ENULL,
          "NULL packed", pname, 4, 1, 18, "status");
    for (t = 0; t < 4 * 16 * 19; ++t)
        ok &= to_bits(pk[t]) == to_bits(UNWRITTEN);
    check(ok, "wrote packed on an error", pname, 4, 1, 18, NULL);
    /* a valid packing (2 groups of 2 channels, K = 9 + the bias step) for the calls */
    check(tirbyoc_pack_conv2d_weight_f32(4, 2, 9, wt, bias, pk) == TIRBYOC_OK, "status",
          pname, 4, 2, 9, NULL);
#define CONVP(cc, gg, ss, ops, pp)     tirbyoc_conv2d_f32_packed(1, cc, 5, 5, x, 4, gg, 3, 3, pp, ss, 1, 1, 1, 1, 1, 5, 5, ops, NULL, y)
    check(CONVP(2, 2, 1, bias_relu, NULL) == TIRBYOC_ENULL, "NULL packed", name, 4, 25, 9, "status");
    check(CONVP(0, 2, 1, bias_relu, NULL) == TIRBYOC_ENULL, "NULL packed, K 0 + bias", name, 4, 25, 0, "status");
    check(CONVP(2, 0, 1, bias_relu, pk) == TIRBYOC_EINVAL, "groups 0", name, 4, 25, 9, "status");
    check(CONVP(2, 3, 1, bias_relu, pk) == TIRBYOC_EINVAL, "groups 3 of OC 4", name, 4, 25, 9, "status");
    check(CONVP(2, 2, 0, bias_relu, pk) == TIRBYOC_EINVAL, "stride 0", name, 4, 25, 9, "status");
    check(CONVP(2, 2, 1, TIRBYOC_EPI_RELU | TIRBYOC_EPI_BIAS << 4, pk) == TIRBYOC_EEPILOGUE,
          "bias not first", name, 4, 25, 9, "status");
    check(CONVP(2, 2, 1, TIRBYOC_EPI_RESIDUAL, pk) == TIRBYOC_ENULL, "NULL residual", name, 4, 25, 9, "status");
#undef CONVP
    ok = 1;
    for (t = 0; t < 100; ++t)
        ok &= to_bits(y[t]) == to_bits(UNWRITTEN);
    check(ok, "wrote y on an error", name, 4, 25, 9, NULL);
}

static void conv_cases(uint64_t *rng, int threaded)
{
    static const int64_t shapes[][13] = {
        /* n, c, h, w, oc, kh, kw, sh, sw, pt, pl, dh, dw (groups: below) */
        {1, 3, 8, 8, 5, 3, 3, 1, 1, 1, 1, 1, 1},   {2, 5, 13, 11, 7, 3, 3, 2, 2, 1, 1, 1, 1},
        {1, 4, 17, 19, 15, 5, 5, 1, 1, 2, 1, 1, 2}, {1, 3, 30, 30, 14, 7, 7, 2, 2, 3, 3, 1, 1},
        {1, 9, 7, 7, 33, 1, 1, 1, 1, 0, 0, 1, 1},   {3, 17, 5, 3, 4, 1, 1, 1, 1, 0, 0, 1, 1},
        {1, 8, 12, 12, 6, 1, 1, 2, 2, 0, 0, 1, 1},  {1, 2, 4, 4, 3, 3, 3, 1, 1, 3, 3, 2, 2},
        {1, 57, 6, 7, 16, 3, 3, 1, 1, 1, 1, 1, 1},  {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1},
        {1, 2, 20, 40, 3, 3, 1, 3, 1, 1, 0, 1, 1},  {2, 0, 5, 5, 4, 3, 3, 1, 1, 1, 1, 1, 1},
        /* stride 2 over rows wider than a panel's 31 columns */
        {1, 3, 11, 63, 4, 7, 7, 2, 2, 3, 3, 1, 1},  {1, 4, 6, 70, 5, 3, 3, 1, 2, 1, 1, 1, 1},
        /* in groups: 4 of (3 -> 5), 3 of (1 -> 2) 1x1, 2 of (8 -> 8), 2 of (4 -> 20):
         * a group's channels over two 16-channel panels of the packed weight */
        {2, 12, 9, 10, 20, 3, 3, 1, 1, 1, 1, 1, 1}, {1, 3, 6, 6, 6, 1, 1, 1, 1, 0, 0, 1, 1},
        {1, 16, 11, 9, 16, 3, 3, 2, 1, 1, 0, 1, 1}, {1, 8, 9, 9, 40, 3, 3, 1, 1, 1, 1, 2, 1},
        /* 3x3 stride 1 for the Winograd call too: a row of 75 tiles (two transform
         * chunks), asymmetric and negative padding, two blocks of 64 output channels */
        {1, 3, 5, 300, 4, 3, 3, 1, 1, 1, 1, 1, 1}, {2, 17, 9, 13, 33, 3, 3, 1, 1, 0, 2, 1, 1},
        {1, 6, 10, 10, 80, 3, 3, 1, 1, 3, -1, 1, 1},
        /* a 1x1 over more channels than one K block on every ISA (528, 384, 256):
         * blocked x and y keep the partial sums in y */
        {1, 560, 5, 6, 32, 1, 1, 1, 1, 0, 0, 1, 1},
    };
    static const int64_t groups[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 4, 3, 2, 2,
                                     1, 1, 1, 1};
    static const int64_t chains[] = {
        0, TIRBYOC_EPI_BIAS | TIRBYOC_EPI_RELU << 4,
        TIRBYOC_EPI_BIAS | TIRBYOC_EPI_RESIDUAL << 4 | TIRBYOC_EPI_RELU6 << 8,
        TIRBYOC_EPI_RESIDUAL | TIRBYOC_EPI_SILU << 4,
        TIRBYOC_EPI_BIAS | TIRBYOC_EPI_GELU_ERF << 4 | TIRBYOC_EPI_TANH << 8,
        TIRBYOC_EPI_BIAS | TIRBYOC_EPI_HARDSWISH << 4,
    };
    size_t si, ci;
    int pass;
    /* pass 0: each ISA's own choice of path; pass 1: the direct path forced
     * wherever the ISA has it (most shapes here are below its threshold).
     * Threaded, each shape runs with one of the chains in turn: a chain is
     * applied tile by tile, the same code on any thread (mode "all" runs
     * every pair on one thread first), and most of these shapes stay on one
     * thread anyway; the runs past the threshold come after. */
    for (pass = 0; pass < 2; ++pass) {
        const size_t n_chains = sizeof(chains) / sizeof(chains[0]);
        if (pass == 1)
            setenv("TIRBYOC_CONV_DIRECT", "1", 1);
        for (si = 0; si < sizeof(shapes) / sizeof(shapes[0]); ++si)
            for (ci = 0; ci < n_chains; ++ci) {
                const int64_t *g = shapes[si];
                if (threaded && ci != (si + (size_t)pass) % n_chains)
                    continue;
                conv_case(rng, g[0], g[1], g[2], g[3], g[4], groups[si], g[5], g[6], g[7],
                          g[8], g[9], g[10], g[11], g[12], chains[ci],
                          (int)((si + ci) % 3 == 0), 0);
            }
        /* above the threading threshold: pixel blocks, then channel blocks; groups */
        conv_case(rng, 1, 16, 40, 40, 24, 1, 3, 3, 1, 1, 1, 1, 1, 1, chains[2], 0, 1);
        conv_case(rng, 1, 32, 30, 30, 32, 8, 3, 3, 1, 1, 1, 1, 1, 1, chains[1], 0, 1);
        conv_case(rng, 1, 576, 7, 7, 48, 1, 1, 1, 1, 1, 0, 0, 1, 1, chains[2], 0, 1);
        if (!threaded)
            conv_case(rng, 1, 64, 7, 7, 130, 1, 3, 3, 1, 1, 1, 1, 1, 1, chains[1], 1, 1);
    }
    unsetenv("TIRBYOC_CONV_DIRECT");
    conv_errors();
    conv_packed_errors();
}

/* ---- NCHW16c: tirbyoc_conv2d_f32_packed_layouts, tirbyoc_depthwise_conv2d_f32_layouts ---- */

/* [n, c, hw] NCHW into [n, c / 16, hw, 16] (to_blocked), or back. */
static void relayout16(const float *src, float *dst, int64_t n, int64_t c, int64_t hw,
                       int to_blocked)
{
    int64_t b, ch, t;
    for (b = 0; b < n; ++b)
        for (ch = 0; ch < c; ++ch)
            for (t = 0; t < hw; ++t) {
                const size_t plain = (size_t)((b * c + ch) * hw + t);
                const size_t blk = (size_t)((b * c + ch / 16 * 16) * hw + t * 16 + ch % 16);
                if (to_blocked)
                    dst[blk] = src[plain];
                else
                    dst[plain] = src[blk];
            }
}

/* t's call (already checked against the reference, its result in t->y) with x and/or y
 * and the residual NCHW16c, for each layout set: the same values in the blocked order
 * (bit for bit, or NaN where y has one), each operand in a block of its own. A chain
 * the blocked y does not take (anything but the residual and unary operations after
 * the bias) gives TIRBYOC_EEPILOGUE and writes nothing. `depthwise`: the depthwise call, else
 * the packed conv (its weight and bias packed here). */
static void blocked_case(conv_test_t *t, int depthwise)
{
    const conv_call_t *a = &t->a;
    const char *name = depthwise ? "tirbyoc_depthwise_conv2d_f32_layouts"
                                 : "tirbyoc_conv2d_f32_packed_layouts";
    const int has_bias = (a->ops & 15) == TIRBYOC_EPI_BIAS;
    const int64_t k = a->c / a->gr * a->kh * a->kw, p = a->oh * a->ow;
    const size_t nx = t->bx.n, ny = t->by.n;
    int64_t rest = has_bias ? (int64_t)((uint64_t)a->ops >> 4) : a->ops, layouts;
    int y_ok = 1;
    buf_t bx, br, by, bp;
    float *xb, *rb, *yb, *pk = NULL, *back;
    size_t q;
    for (; rest != 0; rest = (int64_t)((uint64_t)rest >> 4))
        y_ok &= (rest & 15) == TIRBYOC_EPI_RESIDUAL ||
                ((rest & 15) >= TIRBYOC_EPI_RELU && (rest & 15) <= TIRBYOC_EPI_TANH);
    xb = buf_alloc(&bx, nx, 1);
    rb = buf_alloc(&br, t->br.n, 2);
    yb = buf_alloc(&by, ny, 3);
    back = (float *)malloc((ny > 0 ? ny : 1) * sizeof(float));
    if (!depthwise) {
        const int64_t size = tirbyoc_conv2d_packed_size_f32(a->oc, a->gr, k, has_bias);
        pk = buf_alloc(&bp, (size_t)(size > 0 ? size : 0), 0);
        check(tirbyoc_pack_conv2d_weight_f32(a->oc, a->gr, k, a->wt,
                                             has_bias ? a->bias : NULL, pk) == TIRBYOC_OK,
              "status", "tirbyoc_pack_conv2d_weight_f32", a->oc, a->gr, k, NULL);
    }
    for (layouts = 1; layouts <= 3; ++layouts) {
        const float *x = layouts & 1 ? xb : a->x;
        const float *res = layouts & 2 ? (a->res != NULL ? rb : NULL) : a->res;
        float *y = layouts & 2 ? yb : back;
        const int32_t want = layouts & 2 && !y_ok ? TIRBYOC_EEPILOGUE : TIRBYOC_OK;
        int32_t st;
        int same = 1;
        relayout16(a->x, xb, a->n, a->c, a->h * a->w, 1);
        if (a->res != NULL)
            relayout16(a->res, rb, a->n, a->oc, p, 1);
        for (q = 0; q < ny; ++q)
            y[q] = UNWRITTEN;
        st = depthwise ? tirbyoc_depthwise_conv2d_f32_layouts(
                             layouts, a->n, a->c, a->h, a->w, x, a->kh, a->kw, a->wt, a->sh,
                             a->sw, a->pt, a->pl, a->dh, a->dw, a->oh, a->ow, a->ops,
                             a->bias, res, y)
                       : tirbyoc_conv2d_f32_packed_layouts(
                             layouts, a->n, a->c, a->h, a->w, x, a->oc, a->gr, a->kh, a->kw,
                             pk, a->sh, a->sw, a->pt, a->pl, a->dh, a->dw, a->oh, a->ow,
                             a->ops, res, y);
        check(st == want, "status", name, a->oc, p, k, NULL);
        if (st != TIRBYOC_OK) {
            for (q = 0; q < ny; ++q)
                same &= to_bits(y[q]) == to_bits(UNWRITTEN);
            check(same, "wrote y on an error", name, a->oc, p, k, NULL);
            continue;
        }
        if (layouts & 2)
            relayout16(yb, back, a->n, a->oc, p, 0);
        for (q = 0; q < ny; ++q)
            same &= to_bits(back[q]) == to_bits(t->y[q]) || (t->y[q] != t->y[q] &&
                                                              back[q] != back[q]);
        check(same, "differs from the NCHW call", name, a->oc, p, k, NULL);
    }
    free(back);
    buf_free(&bx);
    buf_free(&br);
    buf_free(&by);
    if (!depthwise)
        buf_free(&bp);
}

static void blocked_cases(uint64_t *rng, int threaded)
{
    static const int64_t shapes[][14] = {
        /* depthwise, n, c, h, w, oc, kh, kw, sh, sw, pt, pl, groups (conv) */
        {0, 1, 32, 7, 9, 48, 1, 1, 1, 1, 0, 0, 1},  /* plain: in place */
        {0, 2, 64, 14, 14, 16, 1, 1, 1, 1, 0, 0, 1},
        {0, 1, 16, 9, 11, 32, 3, 3, 2, 2, 1, 1, 1},  /* blocked x into phase planes */
        {0, 1, 32, 6, 6, 32, 1, 1, 1, 1, 0, 0, 2},   /* in groups: phase planes too */
        {0, 1, 48, 10, 12, 32, 3, 3, 1, 1, 1, 1, 1}, /* ResNet's 3x3 */
        {0, 1, 32, 14, 13, 64, 1, 1, 2, 2, 0, 0, 1}, /* a 1x1 projection, stride 2 */
        {0, 2, 32, 7, 7, 48, 1, 1, 1, 1, 0, 0, 1},  /* 49 pixels: one product, pixels as rows */
        {0, 1, 400, 7, 7, 32, 1, 1, 1, 1, 0, 0, 1}, /* two K blocks */
        {0, 3, 400, 1, 1, 32, 1, 1, 1, 1, 0, 0, 1},  /* 1 pixel (squeeze-and-excite) */
        {1, 1, 32, 9, 9, 32, 3, 3, 1, 1, 1, 1, 0},
        {1, 2, 48, 13, 11, 48, 3, 3, 2, 2, 1, 1, 0},
        {1, 1, 16, 12, 12, 16, 5, 5, 1, 1, 2, 2, 0},
        {1, 1, 16, 4, 4, 16, 0, 3, 1, 1, 1, 1, 0},   /* no taps: the chain on zeros */
    };
    static const int64_t chains[] = {
        0, TIRBYOC_EPI_BIAS | TIRBYOC_EPI_RELU6 << 4,
        TIRBYOC_EPI_BIAS | TIRBYOC_EPI_RESIDUAL << 4 | TIRBYOC_EPI_RELU << 8,
        /* the unary operations after the in-register ones: applied to the stored
         * block, the residual after them too */
        TIRBYOC_EPI_RESIDUAL | TIRBYOC_EPI_SILU << 4,
        TIRBYOC_EPI_BIAS | TIRBYOC_EPI_SIGMOID << 4,
        TIRBYOC_EPI_BIAS | TIRBYOC_EPI_SILU << 4 | TIRBYOC_EPI_RESIDUAL << 8,
    };
    size_t si, ci;
    for (si = 0; si < sizeof(shapes) / sizeof(shapes[0]); ++si)
        for (ci = 0; ci < sizeof(chains) / sizeof(chains[0]); ++ci) {
            const int64_t *g = shapes[si];
            const int dwc = (int)g[0];
            conv_test_t t;
            if (threaded && si % 2)
                continue;
            conv_test_init(&t, rng, g[1], g[2], g[3], g[4], g[5], dwc ? g[2] : g[12], g[6],
                           g[7], g[8], g[9], g[10], g[11], 1, 1, chains[ci],
                           (int)((si + ci) % 3 == 0));
            if (conv_test_run(dwc ? "tirbyoc_depthwise_conv2d_f32" : "tirbyoc_conv2d_f32",
                              dwc ? call_depthwise : call_conv2d, &t))
                blocked_case(&t, dwc);
            conv_test_free(&t);
        }
}

/* ---- tirbyoc_depthwise_conv2d_f32 ---- */

/* One depthwise conv against the reference (conv_test_run, a conv in C
 * groups); a NaN in x when `specials`. Then the same call on each path the
 * kernel has (TIRBYOC_DW_PATH: the planes, the channels in lanes where the
 * ISA has them, the scalar path) and, with `threads_check`, on 1, 2 and 3
 * threads: the same bits every time. */
static void dw_case(uint64_t *rng, int64_t n, int64_t c, int64_t h, int64_t w,
                    int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t pt,
                    int64_t pl, int64_t dh, int64_t dw, int64_t ops, int specials,
                    int threads_check)
{
    static const char *const name = "tirbyoc_depthwise_conv2d_f32";
    static const char *const paths[] = {"planes", "channels", "scalar"};
    conv_test_t t;
    conv_test_init(&t, rng, n, c, h, w, c, c > 0 ? c : 1, kh, kw, sh, sw, pt, pl, dh, dw, ops,
                   specials);
    if (conv_test_run(name, call_depthwise, &t) && t.by.n > 0)
        conv_test_repeat(name, call_depthwise, &t, "TIRBYOC_DW_PATH", paths,
                         sizeof(paths) / sizeof(paths[0]), threads_check);
    conv_test_free(&t);
}

/* Every invalid argument gives its status and leaves y untouched. */
static void dw_errors(void)
{
    float x[2 * 5 * 5], wt[2 * 9], bias[2], y[2 * 5 * 5];
    const conv_call_t good = {1, 2, 5, 5, x, 2, 2, 3, 3, wt, 1, 1, 1, 1, 1, 1, 5, 5, 0,
                              NULL, NULL};
    int t;
    for (t = 0; t < 50; ++t) x[t] = 1.0f;
    for (t = 0; t < 18; ++t) wt[t] = 0.5f;
    for (t = 0; t < 2; ++t) bias[t] = 0.25f;
    for (t = 0; t < 50; ++t) y[t] = UNWRITTEN;
    conv_shared_errors("tirbyoc_depthwise_conv2d_f32", call_depthwise, &good, bias, y, 50);
}

static void dw_cases(uint64_t *rng, int threaded)
{
    static const int64_t shapes[][12] = {
        /* n, c, h, w, kh, kw, sh, sw, pt, pl, dh, dw */
        {1, 32, 9, 9, 3, 3, 1, 1, 1, 1, 1, 1},    {2, 5, 13, 11, 3, 3, 2, 2, 1, 1, 1, 1},
        {1, 20, 17, 19, 5, 5, 1, 1, 2, 2, 1, 1},  {1, 18, 15, 16, 5, 5, 2, 2, 2, 2, 1, 1},
        {2, 6, 9, 14, 1, 1, 1, 1, 0, 0, 1, 1},    {1, 17, 7, 7, 3, 3, 1, 1, 1, 1, 1, 1},
        {1, 17, 13, 14, 3, 3, 3, 3, 1, 1, 1, 1},  {1, 9, 15, 17, 3, 3, 1, 1, 2, 2, 2, 2},
        {1, 12, 11, 12, 3, 3, 2, 1, 2, 3, 2, 3},  {1, 10, 9, 45, 3, 5, 1, 2, 1, 2, 1, 1},
        {1, 24, 6, 44, 3, 3, 1, 1, 1, 1, 1, 1},   {1, 8, 8, 30, 7, 7, 1, 1, 3, 3, 1, 1},
        {1, 3, 20, 3, 3, 1, 1, 1, 1, 0, 1, 1},    {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1},
        {1, 4, 2, 2, 3, 3, 1, 1, 3, 3, 2, 2},     {2, 0, 5, 5, 3, 3, 1, 1, 1, 1, 1, 1},
        {1, 3, 4, 4, 0, 3, 1, 1, 1, 1, 1, 1},     /* no taps: the chain on zeros */
        /* no window fits: the scalar path whatever is asked */
        {1, 17, 3, 3, 3, 3, 1, 1, 1, 150000, 1, 150000},
    };
    static const int64_t chains[] = {
        0, TIRBYOC_EPI_BIAS | TIRBYOC_EPI_RELU6 << 4,
        TIRBYOC_EPI_BIAS | TIRBYOC_EPI_RESIDUAL << 4 | TIRBYOC_EPI_RELU << 8,
        TIRBYOC_EPI_RELU | TIRBYOC_EPI_RESIDUAL << 4 | TIRBYOC_EPI_SILU << 8,
        TIRBYOC_EPI_BIAS | TIRBYOC_EPI_GELU_ERF << 4 | TIRBYOC_EPI_TANH << 8,
        TIRBYOC_EPI_BIAS | TIRBYOC_EPI_HARDSWISH << 4 | TIRBYOC_EPI_HARDSIGMOID << 8,
    };
    size_t si, ci;
    if (!threaded)
        for (si = 0; si < sizeof(shapes) / sizeof(shapes[0]); ++si)
            for (ci = 0; ci < sizeof(chains) / sizeof(chains[0]); ++ci) {
                const int64_t *g = shapes[si];
                dw_case(rng, g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9],
                        g[10], g[11], chains[ci], (int)((si + ci) % 3 == 0), 0);
            }
    /* above the threading threshold: planes of many rows, blocks of 16 channels,
     * few channels (their rows split), a batch of small planes */
    dw_case(rng, 1, 16, 56, 56, 3, 3, 1, 1, 1, 1, 1, 1, chains[1], 0, 1);
    dw_case(rng, 1, 40, 28, 28, 3, 3, 2, 2, 1, 1, 1, 1, chains[2], 1, 1);
    dw_case(rng, 1, 3, 90, 90, 3, 3, 1, 1, 1, 1, 1, 1, chains[1], 0, 1);
    if (!threaded)
        dw_case(rng, 2, 300, 7, 7, 3, 3, 1, 1, 1, 1, 1, 1, chains[3], 0, 1);
    dw_errors();
}

/* ---- tirbyoc_max_pool2d_f32 ---- */

/* tirbyoc_max_pool2d_f32_layouts on x (NCHW) in blocks of 16 channels: y NCHW
 * (layouts 1) and NCHW16c (3), against the NCHW call's y, bit for bit. */
static void pool_blocked(const float *x, const float *y, int64_t n, int64_t c, int64_t h,
                         int64_t w, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                         int64_t pt, int64_t pl, int64_t dh, int64_t dw, int64_t oh,
                         int64_t ow)
{
    static const char *const name = "tirbyoc_max_pool2d_f32_layouts";
    const int64_t nx = n * c * h * w, ny = n * c * oh * ow, hw = h * w, p = oh * ow;
    buf_t bxb, byb;
    float *xb = buf_alloc(&bxb, (size_t)nx, 1), *yb = buf_alloc(&byb, (size_t)ny, 3);
    int64_t t, ch, q;
    int layouts, ok;
    for (t = 0; t < n * c; ++t) /* plane t: image t / c, channel ch */
        for (ch = t % c, q = 0; q < hw; ++q)
            xb[((t / c * (c / 16) + ch / 16) * hw + q) * 16 + ch % 16] = x[t * hw + q];
    for (layouts = 1; layouts <= 3; layouts += 2) {
        for (t = 0; t < ny; ++t)
            yb[t] = UNWRITTEN;
        check(tirbyoc_max_pool2d_f32_layouts(layouts, n, c, h, w, xb, kh, kw, sh, sw, pt, pl,
                                             dh, dw, oh, ow, yb) == TIRBYOC_OK,
              "status", name, c, p, layouts, NULL);
        ok = 1;
        for (t = 0; t < n * c; ++t)
            for (ch = t % c, q = 0; q < p; ++q) {
                const float got = layouts == 3
                    ? yb[((t / c * (c / 16) + ch / 16) * p + q) * 16 + ch % 16]
                    : yb[t * p + q];
                ok &= memcmp(&got, &y[t * p + q], sizeof(float)) == 0;
            }
        check(ok, "the NCHW call's bits", name, c, p, layouts, NULL);
    }
    buf_free(&bxb);
    buf_free(&byb);
}

/* One max pool against a scalar reference (the taps inside the input, NaN
 * wins, -inf without a tap), bit for bit; NaNs in x when `specials`; with
 * `threads_check` again on 1, 2 and 3 threads, the same bits. */
static void pool_case(uint64_t *rng, int64_t n, int64_t c, int64_t h, int64_t w,
                      int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t pt,
                      int64_t pl, int64_t dh, int64_t dw, int specials, int threads_check)
{
    static const char *const name = "tirbyoc_max_pool2d_f32";
    const int64_t oh = h + 2 * pt - dh * (kh - 1) - 1 < 0 ? 0 : (h + 2 * pt - dh * (kh - 1) - 1) / sh + 1;
    const int64_t ow = w + 2 * pl - dw * (kw - 1) - 1 < 0 ? 0 : (w + 2 * pl - dw * (kw - 1) - 1) / sw + 1;
    const int64_t nx = n * c * h * w, ny = n * c * oh * ow;
    buf_t bx, by, bz;
    float *x = buf_alloc(&bx, (size_t)nx, 1), *y = buf_alloc(&by, (size_t)ny, 3);
    float *z = buf_alloc(&bz, (size_t)ny, 2);
    int64_t t, p, i, j, a, b;
    int ok = 1, th;
    for (t = 0; t < nx; ++t)
        x[t] = specials && rng_int(rng, 0, 40) == 0 ? NAN : rng_float(rng) * 4;
    for (t = 0; t < ny; ++t)
        y[t] = UNWRITTEN;
    check(tirbyoc_max_pool2d_f32(n, c, h, w, x, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow, y) ==
              TIRBYOC_OK, "status", name, c, oh * ow, kh * kw, NULL);
    for (p = 0; p < n * c; ++p)
        for (i = 0; i < oh; ++i)
            for (j = 0; j < ow; ++j) {
                float m = -INFINITY;
                for (a = 0; a < kh; ++a)
                    for (b = 0; b < kw; ++b) {
                        const int64_t r = i * sh - pt + a * dh, q = j * sw - pl + b * dw;
                        float v;
                        if (r < 0 || r >= h || q < 0 || q >= w)
                            continue;
                        v = x[(p * h + r) * w + q];
                        if (v != v || m != m)
                            m = NAN;
                        else if (v > m)
                            m = v;
                    }
                t = (p * oh + i) * ow + j;
                ok &= y[t] == m || (y[t] != y[t] && m != m);
            }
    check(ok, "result", name, c, oh * ow, kh * kw, NULL);
    for (th = 0; threads_check && th < N_THREAD_COUNTS; ++th) {
        tirbyoc_set_num_threads(THREAD_COUNTS[th]);
        tirbyoc_max_pool2d_f32(n, c, h, w, x, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow, z);
        check(memcmp(y, z, (size_t)ny * sizeof(float)) == 0, "same bits on every thread count",
              name, c, oh * ow, th, NULL);
    }
    if (c % 16 == 0)
        pool_blocked(x, y, n, c, h, w, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow);
    buf_free(&bx);
    buf_free(&by);
    buf_free(&bz);
}

/* Every invalid argument gives its status and leaves y untouched. */
static void pool_errors(void)
{
    static const char *const name = "tirbyoc_max_pool2d_f32";
    float x[2 * 5 * 5], y[2 * 3 * 3];
    int t, ok = 1;
    for (t = 0; t < 50; ++t) x[t] = 1.0f;
    for (t = 0; t < 18; ++t) y[t] = UNWRITTEN;
#define POOL_REFUSED(STATUS, ...)                                                  \
    check(tirbyoc_max_pool2d_f32(__VA_ARGS__) == (STATUS), "refused", name, 2, 9, 9, #__VA_ARGS__)
    POOL_REFUSED(TIRBYOC_ESIZE, -1, 2, 5, 5, x, 3, 3, 2, 2, 1, 1, 1, 1, 3, 3, y);
    POOL_REFUSED(TIRBYOC_ESIZE, 1, 2, 5, -5, x, 3, 3, 2, 2, 1, 1, 1, 1, 3, 3, y);
    POOL_REFUSED(TIRBYOC_ESIZE, 1, 2, 5, 5, x, 0, 3, 2, 2, 1, 1, 1, 1, 3, 3, y);
    POOL_REFUSED(TIRBYOC_ESIZE, 1, 2, 5, 5, x, 3, 3, 2, 2, 1, 1, 1, 1, (int64_t)1 << 31, 3, y);
    POOL_REFUSED(TIRBYOC_EINVAL, 1, 2, 5, 5, x, 3, 3, 0, 2, 1, 1, 1, 1, 3, 3, y);
    POOL_REFUSED(TIRBYOC_EINVAL, 1, 2, 5, 5, x, 3, 3, 2, 2, -1, 1, 1, 1, 3, 3, y);
    POOL_REFUSED(TIRBYOC_EINVAL, 1, 2, 5, 5, x, 3, 3, 2, 2, 1, 1, 1, 0, 3, 3, y);
    POOL_REFUSED(TIRBYOC_ENULL, 1, 2, 5, 5, NULL, 3, 3, 2, 2, 1, 1, 1, 1, 3, 3, y);
    POOL_REFUSED(TIRBYOC_ENULL, 1, 2, 5, 5, x, 3, 3, 2, 2, 1, 1, 1, 1, 3, 3, NULL);
#undef POOL_REFUSED
    /* blocks: 2 channels, not 16; y blocked alone; an unknown layout */
    check(tirbyoc_max_pool2d_f32_layouts(1, 1, 2, 5, 5, x, 3, 3, 2, 2, 1, 1, 1, 1, 3, 3, y) ==
              TIRBYOC_EINVAL, "refused", "tirbyoc_max_pool2d_f32_layouts", 2, 9, 1, NULL);
    check(tirbyoc_max_pool2d_f32_layouts(2, 1, 16, 1, 1, x, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, y) ==
              TIRBYOC_EINVAL, "refused", "tirbyoc_max_pool2d_f32_layouts", 16, 1, 2, NULL);
    check(tirbyoc_max_pool2d_f32_layouts(4, 1, 16, 1, 1, x, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, y) ==
              TIRBYOC_EINVAL, "refused", "tirbyoc_max_pool2d_f32_layouts", 16, 1, 4, NULL);
    for (t = 0; t < 18; ++t)
        ok &= y[t] == UNWRITTEN;
    check(ok, "refused calls write nothing", name, 2, 9, 9, NULL);
}

static void pool_cases(uint64_t *rng, int threaded)
{
    static const int64_t shapes[][12] = {
        /* n, c, h, w, kh, kw, sh, sw, pt, pl, dh, dw */
        {1, 5, 17, 19, 3, 3, 2, 2, 1, 1, 1, 1},   {2, 3, 9, 8, 2, 2, 2, 2, 0, 0, 1, 1},
        {1, 4, 11, 13, 3, 3, 1, 1, 1, 1, 1, 1},   {1, 3, 10, 9, 2, 3, 1, 1, 1, 1, 1, 1},
        {1, 2, 12, 15, 3, 2, 2, 3, 1, 1, 2, 2},   {1, 3, 6, 5, 5, 5, 1, 1, 2, 2, 1, 1},
        {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1},     {2, 0, 5, 5, 3, 3, 1, 1, 1, 1, 1, 1},
        {1, 2, 4, 40, 1, 7, 1, 3, 0, 3, 1, 1},
    };
    size_t si;
    if (!threaded)
        for (si = 0; si < sizeof(shapes) / sizeof(shapes[0]); ++si) {
            const int64_t *g = shapes[si];
            pool_case(rng, g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9],
                      g[10], g[11], (int)(si % 2), 0);
        }
    /* above the threading threshold: ResNet's stem pool, a batch of planes */
    pool_case(rng, 1, 24, 112, 112, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1);
    /* 16k channels (the blocked call too): ResNet's stem pool, a padded odd window */
    pool_case(rng, 1, 32, 56, 56, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1);
    if (!threaded)
        pool_case(rng, 2, 16, 9, 7, 2, 3, 1, 2, 1, 0, 2, 1, 1, 0);
    pool_case(rng, 3, 40, 30, 31, 3, 3, 1, 1, 1, 1, 1, 1, 0, 1);
    if (!threaded)
        pool_errors();
}

static void matmul_chains(uint64_t *rng, int threaded)
{
    /* every operation once, in chains of up to 4; sizes on tile edges */
    static const int64_t chains[][4] = {
        {TIRBYOC_EPI_BIAS, TIRBYOC_EPI_GELU_ERF, TIRBYOC_EPI_RESIDUAL, 0},
        {TIRBYOC_EPI_DIVIDE, 0, 0, 0},
        {TIRBYOC_EPI_SCALE, TIRBYOC_EPI_BIAS, TIRBYOC_EPI_GELU_TANH, 0},
        {TIRBYOC_EPI_RESIDUAL, TIRBYOC_EPI_SILU, 0, 0},
        {TIRBYOC_EPI_BIAS, TIRBYOC_EPI_RELU, TIRBYOC_EPI_TANH, 0},
        {TIRBYOC_EPI_SIGMOID, TIRBYOC_EPI_RELU6, 0, 0},
        {TIRBYOC_EPI_BIAS, TIRBYOC_EPI_HARDSWISH, TIRBYOC_EPI_RESIDUAL, TIRBYOC_EPI_HARDSIGMOID},
    };
    static const int64_t shapes[][4] = {
        {12, 16, 16, 8}, {3, 17, 33, 5}, {2, 1, 40, 7}, {4, 29, 65, 0}, {1, 130, 70, 300},
        {3, 37, 1, 19}, {2, 300, 1, 70},
    };
    size_t ci, si;
    for (ci = 0; ci < sizeof(chains) / sizeof(chains[0]); ++ci)
        for (si = 0; si < sizeof(shapes) / sizeof(shapes[0]); ++si) {
            int64_t ops = 0;
            int e;
            for (e = 3; e >= 0; --e)
                ops = (ops << 4) | chains[ci][e];
            if (threaded)
                tirbyoc_set_num_threads(THREAD_COUNTS[1 + si % (N_THREAD_COUNTS - 1)]);
            matmul_chain_case(rng, shapes[si][0], shapes[si][1], shapes[si][2], shapes[si][3],
                              (int)((ci + si) % 2), ops, (int)(si % 2));
        }
    softmax_rows(rng);
    attention_cases(rng, threaded);
    conv_cases(rng, threaded);
    dw_cases(rng, threaded);
    blocked_cases(rng, threaded);
    pool_cases(rng, threaded);
    if (threaded)
        return;
    {   /* tirbyoc_unary_f32: tails of every vector width, in place too */
        static const int64_t lens[] = {1, 7, 15, 16, 17, 33, 100, 40000};
        int op;
        size_t li;
        for (op = TIRBYOC_EPI_RELU; op < TIRBYOC_EPI_OP_COUNT; ++op)
            for (li = 0; li < sizeof(lens) / sizeof(lens[0]); ++li) {
                buf_t bx, by;
                float *xv = buf_alloc(&bx, (size_t)lens[li], 1);
                float *yv;
                double worst = 0;
                int64_t t;
                if (op == TIRBYOC_EPI_SCALE || op == TIRBYOC_EPI_DIVIDE ||
                    op == TIRBYOC_EPI_RESIDUAL) { /* not unary: refused */
                    check(tirbyoc_unary_f32(op, lens[li], xv, xv) == TIRBYOC_EEPILOGUE,
                          "non-unary op refused", "tirbyoc_unary_f32", lens[li], 0, 0, NULL);
                    buf_free(&bx);
                    continue;
                }
                yv = buf_alloc(&by, (size_t)lens[li], 3);
                for (t = 0; t < lens[li]; ++t)
                    xv[t] = rng_float(rng) * 12;
                check(tirbyoc_unary_f32(op, lens[li], xv, yv) == TIRBYOC_OK, "status",
                      "tirbyoc_unary_f32", lens[li], 0, 0, NULL);
                for (t = 0; t < lens[li]; ++t) {
                    const double want = unary_d(op, xv[t]), err = fabs(yv[t] - want);
                    if (err > 2e-5 * fabs(want) + 1e-30 && err > worst)
                        worst = err;
                }
                {
                    char detail[64];
                    snprintf(detail, sizeof(detail), "op=%d worst error %.3g", op, worst);
                    check(worst == 0, "unary result", "tirbyoc_unary_f32", lens[li], 0, 0,
                          detail);
                }
                check(tirbyoc_unary_f32(op, lens[li], xv, xv) == TIRBYOC_OK, "in place",
                      "tirbyoc_unary_f32", lens[li], 0, 0, NULL);
                buf_free(&bx);
                buf_free(&by);
            }
        check(tirbyoc_unary_f32(TIRBYOC_EPI_BIAS, 4, NULL, NULL) == TIRBYOC_EEPILOGUE,
              "non-unary op refused", "tirbyoc_unary_f32", 4, 0, 0, NULL);
    }
}

/* The conv direct path's work plan (tirbyoc_conv2d_direct_plan) on 1 to 64
 * threads: it returns, and its blocks cover the output exactly. */
static void direct_plans(void)
{
    static const int64_t pixels[] = {1, 14, 15, 49, 196, 784, 3136, 12544};
    static const int64_t channels[] = {1, 16, 17, 48, 144, 256, 512, 1000, 1024, 2048};
    size_t pi, ci;
    int t;
    for (pi = 0; pi < sizeof(pixels) / sizeof(pixels[0]); ++pi)
        for (ci = 0; ci < sizeof(channels) / sizeof(channels[0]); ++ci)
            for (t = 1; t <= 64; ++t) {
                const int64_t tp = pixels[pi], oc = channels[ci];
                int64_t plan[4];
                const int ok = tirbyoc_conv2d_direct_plan(1 + t % 3, tp, oc, 14, t, plan) ==
                               TIRBYOC_OK;
                check(ok && plan[0] % 16 == 0 && plan[0] >= 16 &&
                          plan[1] == (oc + plan[0] - 1) / plan[0] && plan[2] % 14 == 0 &&
                          plan[2] >= 14 && plan[3] == (tp + plan[2] - 1) / plan[2],
                      "blocks that cover the output", "tirbyoc_conv2d_direct_plan", oc, tp, t,
                      NULL);
            }
    check(tirbyoc_conv2d_direct_plan(1, 0, 1, 14, 1, NULL) == TIRBYOC_EINVAL,
          "a size of 0 accepted", "tirbyoc_conv2d_direct_plan", 0, 0, 0, NULL);
    /* the predicate of the same path: 0 or 1 over the grid, the rule's two edges */
    for (pi = 0; pi < sizeof(pixels) / sizeof(pixels[0]); ++pi)
        for (ci = 0; ci < sizeof(channels) / sizeof(channels[0]); ++ci)
            for (t = 0; t < 2; ++t) {
                int32_t suits = -1;
                check(tirbyoc_conv2d_direct_suits(t, pixels[pi], channels[ci], 129, &suits) ==
                              TIRBYOC_OK &&
                          (suits == 0 || suits == 1),
                      "a 0 or 1", "tirbyoc_conv2d_direct_suits", channels[ci], pixels[pi], t,
                      NULL);
            }
    {
        int32_t a = -1, b = -1;
        check(tirbyoc_conv2d_direct_suits(1, 1024, 256, 256, &a) == TIRBYOC_OK &&
                  tirbyoc_conv2d_direct_suits(1, 1025, 256, 256, &b) == TIRBYOC_OK && a == 1 &&
                  b == 0,
              "4 pixels per channel from 256 k steps", "tirbyoc_conv2d_direct_suits", 256, 1024,
              256, NULL);
        check(tirbyoc_conv2d_direct_suits(0, 1, 1, 0, &a) == TIRBYOC_EINVAL &&
                  tirbyoc_conv2d_direct_suits(0, 1, 1, 1, NULL) == TIRBYOC_ENULL,
              "a size of 0 or a NULL result accepted", "tirbyoc_conv2d_direct_suits", 0, 0, 0,
              NULL);
    }
}

/* whether `name` is one of the comma-separated `list` */
static int listed(const char *list, const char *name)
{
    const size_t len = strlen(name);
    const char *p;
    for (p = list; (p = strstr(p, name)) != NULL; p += len)
        if ((p == list || p[-1] == ',') && (p[len] == ',' || p[len] == '\0'))
            return 1;
    return 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "all";
    const int all = strcmp(mode, "all") == 0;
    char isas[64] = "";
    uint64_t rng = 0x7172627963ULL;
    size_t i;
    /* a cap of about two of winograd_cache_concurrent's transforms */
    setenv("TIRBYOC_WINOGRAD_CACHE_MB", "1", 1);
    if ((!all && strcmp(mode, "threads") != 0) || argc > 3) {
        fprintf(stderr, "usage: %s [all|threads] [isa,...]\n", argv[0]);
        return 2;
    }
    for (i = 0; i < sizeof(ISA_NAMES) / sizeof(ISA_NAMES[0]); ++i) {
        if (argc > 2 && !listed(argv[2], ISA_NAMES[i]))
            continue;
        if (tirbyoc_set_isa(ISA_NAMES[i]) != 0)
            continue; /* not supported by this CPU */
        check(strcmp(tirbyoc_isa(), ISA_NAMES[i]) == 0, "ISA not selected", ISA_NAMES[i], 0, 0, 0, NULL);
        strcat(strcat(isas, *isas ? "," : ""), ISA_NAMES[i]);
        if (all) {
            tirbyoc_set_num_threads(1);
            direct_plans();
            edge_tiles(&rng);
            block_edges(&rng);
            empty_sizes(&rng);
            invalid_args(&rng);
            matmul_chains(&rng, 0);
        }
        matmul_chains(&rng, 1);
        threaded(&rng, !all);
        concurrent(&rng, all ? 4 : 2);
        winograd_cache_concurrent(&rng, all ? 12 : 24);
        fprintf(stderr, "  %s done: %ld checks so far\n", ISA_NAMES[i], n_checks);
    }
    /* KERNELS, and the 2 dense pack functions, matmul, unary, softmax, attention, conv2d,
     * conv2d_f32_packed, pack_conv2d_weight, conv2d_winograd, pack_conv2d_winograd_weight,
     * conv2d_winograd_cached, depthwise_conv2d, the two NCHW16c calls and max_pool2d */
    if (*isas == '\0') {
        fprintf(stderr, "kernel_driver: none of the instruction sets %s runs here\n", argv[2]);
        return 1;
    }
    printf("kernel_driver: mode=%s isas=%s kernels=%d checks=%ld failures=%ld\n", mode, isas,
           N_KERNELS + 16, n_checks, n_failures);
    return n_failures == 0 ? 0 : 1;
}
