/*
 * transpose_avx2.h - the in-register 8 x 8 float transpose that the AVX2
 * code shares: dense_f32_avx2.c (packing, stores of transposed tiles) and
 * the channels-in-lanes path of depthwise_f32.c. Included where AVX2 is
 * enabled (a file-wide or a push_options target pragma).
 */
#ifndef TIRBYOC_TRANSPOSE_AVX2_H
#define TIRBYOC_TRANSPOSE_AVX2_H

#include <immintrin.h>

/* r[i][j] -> r[j][i] for an 8 x 8 block (r[i]: row i). */
static inline __attribute__((always_inline)) void tb_transpose8(__m256 r[8])
{
    __m256 t[8], u[8];
    int g;
    for (g = 0; g < 4; ++g) {
        t[2 * g] = _mm256_unpacklo_ps(r[2 * g], r[2 * g + 1]);
        t[2 * g + 1] = _mm256_unpackhi_ps(r[2 * g], r[2 * g + 1]);
    }
    for (g = 0; g < 2; ++g) {
        u[4 * g + 0] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
        u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
        u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
        u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
    }
    for (g = 0; g < 4; ++g) {
        r[g] = _mm256_permute2f128_ps(u[g], u[4 + g], 0x20);
        r[4 + g] = _mm256_permute2f128_ps(u[g], u[4 + g], 0x31);
    }
}

#endif
