/*
 * bench_peak.c - the kernels against the FMA peak of each instruction set,
 * with no Python and no TVM: for machines that have only a C compiler (or
 * only TVM's runtime), such as the many-core ones the Python benchmarks
 * cannot run on. Not part of the library. From the project root:
 *
 *   gcc -O3 -std=gnu11 -fno-wrapv -fno-trapping-math -Ikernels -o bench_peak \
 *       kernels/bench_peak.c kernels/dense_f32.c kernels/dense_f32_generic.c \
 *       kernels/dense_f32_avx2.c kernels/dense_f32_avx512.c kernels/conv_f32.c \
 *       kernels/conv_winograd_f32.c kernels/depthwise_f32.c kernels/pool_f32.c \
 *       kernels/attention_f32.c kernels/threads.c kernels/dispatch.c \
 *       tirbyoc/fma_probe.c -lpthread -lm            # add -static to carry it
 *   ./bench_peak 1 2 8 16                            # thread counts
 *
 * For each instruction set the machine has (AVX-512, then AVX2; through
 * tirbyoc_set_isa, so AVX2 is measured on an AVX-512 machine too) and each
 * thread count: the FMA probe's peak on that many threads (tirbyoc/fma_probe.c,
 * the Python benchmarks' probe), then the median of several calls of each
 * kernel in GFLOP/s and in % of that peak: dense 1024^3 (W as is), dense
 * 128 x 3072 x 768 with a pre-packed weight (a transformer's MLP), a 1x1
 * conv of 128 channels at 56 x 56 in and out NCHW16c, a 3x3 conv of 256
 * channels at 14 x 14, and a 3x3 depthwise conv of 128 channels at 56 x 56
 * NCHW16c (in microseconds: it has too few flops per byte for a peak to
 * mean much). Every call has a bias and relu.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tirbyoc_kernels.h"

double tirbyoc_probe_avx512(int64_t iters, float *sink);
double tirbyoc_probe_avx2(int64_t iters, float *sink);

typedef double (*probe_fn)(int64_t, float *);

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ---- the FMA peak: the probe on each of `threads` threads at once ---- */

typedef struct {
    probe_fn probe;
    int64_t iters;
    double gflops;
} probe_arg;

static void *run_probe(void *p)
{
    probe_arg *a = (probe_arg *)p;
    float sink;
    a->gflops = a->probe(a->iters, &sink);
    return NULL;
}

static double peak(probe_fn probe, int threads)
{
    pthread_t th[64];
    probe_arg args[64];
    int64_t iters = 1 << 20;
    double best = 0.0;
    float sink;
    int i, round;
    for (;;) { /* about 50 ms a measurement */
        const double t0 = now();
        probe(iters, &sink);
        if (now() - t0 > 0.05)
            break;
        iters *= 2;
    }
    /* the best of three: one thread preempted during a measurement drags the
     * sum down (a 16-vCPU VM gave 84 GFLOP/s at 2 threads, 70 at one) */
    for (round = 0; round < 3; ++round) {
        double total = 0.0;
        for (i = 0; i < threads; ++i) {
            args[i].probe = probe;
            args[i].iters = iters;
            pthread_create(&th[i], NULL, run_probe, &args[i]);
        }
        for (i = 0; i < threads; ++i) {
            pthread_join(th[i], NULL);
            total += args[i].gflops;
        }
        if (total > best)
            best = total;
    }
    return best;
}

/* ---- the kernels ---- */

static float *filled(int64_t n, int seed)
{
    float *p = (float *)aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
    int64_t i;
    for (i = 0; i < n; ++i)
        p[i] = (float)((i + seed) * 7919 % 1000) / 1000.0f - 0.5f;
    return p;
}

typedef struct {
    float *a, *w, *c, *bias;               /* dense 1024^3 */
    float *a2, *w2, *packed2, *c2;         /* dense 128 x 3072 x 768, packed W */
    float *x1, *w1, *packed1, *y1;         /* 1x1 conv 128@56, NCHW16c */
    float *x3, *w3, *packed3, *y3;         /* 3x3 conv 256@14 */
    float *wd;                             /* depthwise 3x3 128@56 */
} data;

enum { N = 1024, M2 = 128, N2 = 3072, K2 = 768, C1 = 128, HW1 = 56, C3 = 256, HW3 = 14 };

static void prepare(data *d)
{
    d->a = filled((int64_t)N * N, 1);
    d->w = filled((int64_t)N * N, 2);
    d->c = filled((int64_t)N * N, 3);
    d->bias = filled(4096, 4);
    d->a2 = filled(M2 * K2, 5);
    d->w2 = filled((int64_t)N2 * K2, 6);
    d->c2 = filled((int64_t)M2 * N2, 7);
    d->packed2 = filled(tirbyoc_packed_weight_size_f32(N2, K2), 0);
    d->x1 = filled(C1 * HW1 * HW1, 8);
    d->y1 = filled(C1 * HW1 * HW1, 9);
    d->w1 = filled(C1 * C1, 10);
    d->packed1 = filled(tirbyoc_conv2d_packed_size_f32(C1, 1, C1, 1), 0);
    d->x3 = filled(C3 * HW3 * HW3, 11);
    d->y3 = filled(C3 * HW3 * HW3, 12);
    d->w3 = filled(C3 * C3 * 9, 13);
    d->packed3 = filled(tirbyoc_conv2d_packed_size_f32(C3, 1, C3 * 9, 1), 0);
    d->wd = filled(C1 * 9, 14);
}

/* The packed weights, in the layout of the active instruction set's kernels. */
static void pack(data *d)
{
    tirbyoc_pack_weight_f32_nt(N2, K2, d->w2, K2, d->packed2);
    tirbyoc_pack_conv2d_weight_f32(C1, 1, C1, d->w1, d->bias, d->packed1);
    tirbyoc_pack_conv2d_weight_f32(C3, 1, C3 * 9, d->w3, d->bias, d->packed3);
}

#define EPI (TIRBYOC_EPI_BIAS | TIRBYOC_EPI_RELU << 4)
#define BLOCKED (TIRBYOC_LAYOUT_X16 | TIRBYOC_LAYOUT_Y16)

/* Seconds of one call of kernel `which`, the median of `reps`. */
static double seconds(const data *d, int which, int reps)
{
    double t[64];
    int r;
    for (r = 0; r < reps; ++r) {
        const double t0 = now();
        switch (which) {
        case 0:
            tirbyoc_dense_relu_f32_nn(N, N, N, d->a, N, d->w, N, d->bias, d->c, N);
            break;
        case 1:
            tirbyoc_dense_relu_f32_packed(M2, N2, K2, d->a2, K2, d->packed2, d->bias, d->c2,
                                          N2);
            break;
        case 2:
            tirbyoc_conv2d_f32_packed_layouts(BLOCKED, 1, C1, HW1, HW1, d->x1, C1, 1, 1, 1,
                                              d->packed1, 1, 1, 0, 0, 1, 1, HW1, HW1, EPI,
                                              NULL, d->y1);
            break;
        case 3:
            tirbyoc_conv2d_f32_packed(1, C3, HW3, HW3, d->x3, C3, 1, 3, 3, d->packed3, 1, 1, 1,
                                      1, 1, 1, HW3, HW3, EPI, NULL, d->y3);
            break;
        default:
            tirbyoc_depthwise_conv2d_f32_layouts(BLOCKED, 1, C1, HW1, HW1, d->x1, 3, 3, d->wd,
                                                 1, 1, 1, 1, 1, 1, HW1, HW1, EPI, d->bias,
                                                 NULL, d->y1);
        }
        t[r] = now() - t0;
    }
    qsort(t, (size_t)reps, sizeof(double), by_value);
    return t[reps / 2];
}

static const double FLOPS[4] = {
    2.0 * N * N * N, 2.0 * M2 * N2 * K2, 2.0 * C1 * C1 * HW1 * HW1, 2.0 * C3 * C3 * 9 * HW3 * HW3};
static const char *const NAMES[5] = {"dense 1024^3", "dense 128x3072x768 packed",
                                     "1x1 conv 128@56 NCHW16c", "3x3 conv 256@14",
                                     "depthwise 3x3 128@56 NCHW16c"};

int main(int argc, char **argv)
{
    static const char *const isas[] = {"avx512", "avx2"};
    static const probe_fn probes[] = {tirbyoc_probe_avx512, tirbyoc_probe_avx2};
    int counts[16], ncounts = 0, i, k, q;
    data d;
    for (i = 1; i < argc && ncounts < 16; ++i) {
        const int n = atoi(argv[i]);
        if (n < 1 || n > 64) {
            fprintf(stderr, "thread counts are 1 to 64, got %s\n", argv[i]);
            return 2;
        }
        counts[ncounts++] = n;
    }
    if (ncounts == 0)
        counts[ncounts++] = 1;
    prepare(&d);
    for (i = 0; i < 2; ++i) {
        if (tirbyoc_set_isa(isas[i]) != TIRBYOC_OK) {
            printf("%s: not on this machine\n", isas[i]);
            continue;
        }
        pack(&d);
        for (q = 0; q < ncounts; ++q) {
            const double p = peak(probes[i], counts[q]);
            tirbyoc_set_num_threads(counts[q]);
            printf("%s, %d threads: FMA peak %.1f GFLOP/s\n", tirbyoc_isa(), counts[q], p);
            for (k = 0; k < 5; ++k) {
                const double s = seconds(&d, k, k == 0 ? 9 : 21);
                if (k < 4)
                    printf("  %-30s %8.1f GFLOP/s  %5.1f%% of peak\n", NAMES[k],
                           FLOPS[k] / s * 1e-9, 100.0 * FLOPS[k] / s * 1e-9 / p);
                else
                    printf("  %-30s %8.1f us\n", NAMES[k], s * 1e6);
            }
            fflush(stdout);
        }
    }
    return 0;
}
