/*
 * fma_probe.c - measures the fp32 FMA throughput of one core, for the benchmark's
 * "fraction of peak" column. Twelve independent FMA chains per vector width keep both
 * FMA pipes busy through their latency; the result is GFLOP/s (2 flops per lane).
 * Built on demand by tirbyoc.bench (cffi), not part of the kernel library.
 */
#include <stdint.h>
#include <time.h>
#include <immintrin.h>

static double now_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define CHAINS(T, SET) \
    T a0 = SET(0.f), a1 = SET(1.f), a2 = SET(2.f), a3 = SET(3.f), a4 = SET(4.f), \
      a5 = SET(5.f), a6 = SET(6.f), a7 = SET(7.f), a8 = SET(8.f), a9 = SET(9.f), \
      a10 = SET(10.f), a11 = SET(11.f)
#define STEP(F) \
    a0 = F(a0, b, c); a1 = F(a1, b, c); a2 = F(a2, b, c); a3 = F(a3, b, c); \
    a4 = F(a4, b, c); a5 = F(a5, b, c); a6 = F(a6, b, c); a7 = F(a7, b, c); \
    a8 = F(a8, b, c); a9 = F(a9, b, c); a10 = F(a10, b, c); a11 = F(a11, b, c)
#define SUM(ADD) ADD(ADD(ADD(ADD(a0, a1), ADD(a2, a3)), ADD(ADD(a4, a5), ADD(a6, a7))), \
                     ADD(ADD(a8, a9), ADD(a10, a11)))

__attribute__((target("avx512f")))
double tirbyoc_probe_avx512(int64_t iters, float *sink)
{
    CHAINS(__m512, _mm512_set1_ps);
    __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    double t = now_seconds();
    for (int64_t i = 0; i < iters; i++) { STEP(_mm512_fmadd_ps); }
    t = now_seconds() - t;
    *sink = _mm512_reduce_add_ps(SUM(_mm512_add_ps));
    return (double)iters * 12 * 16 * 2 / t * 1e-9;
}

__attribute__((target("avx2,fma")))
double tirbyoc_probe_avx2(int64_t iters, float *sink)
{
    CHAINS(__m256, _mm256_set1_ps);
    __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    double t = now_seconds();
    for (int64_t i = 0; i < iters; i++) { STEP(_mm256_fmadd_ps); }
    t = now_seconds() - t;
    float lanes[8];
    _mm256_storeu_ps(lanes, SUM(_mm256_add_ps));
    *sink = lanes[0];
    return (double)iters * 12 * 8 * 2 / t * 1e-9;
}

static float mul_add(float a, float b, float c) { return a * b + c; }
static float add(float a, float b) { return a + b; }

double tirbyoc_probe_generic(int64_t iters, float *sink)
{
    CHAINS(float, (float));
    float b = 0.999999f, c = 1e-7f;
    double t = now_seconds();
    for (int64_t i = 0; i < iters; i++) { STEP(mul_add); }
    t = now_seconds() - t;
    *sink = SUM(add);
    return (double)iters * 12 * 2 / t * 1e-9;
}
