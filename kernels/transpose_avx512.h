/*
 * transpose_avx512.h - the in-register 16 x 16 float transpose that the
 * AVX-512 code shares: dense_f32_avx512.c (packing, stores of transposed
 * tiles) and the channels-in-lanes path of depthwise_f32.c. Included where
 * AVX-512 is enabled (a file-wide or a push_options target pragma).
 */
#ifndef TIRBYOC_TRANSPOSE_AVX512_H
#define TIRBYOC_TRANSPOSE_AVX512_H

#include <immintrin.h>

/* r[i][j] -> r[j][i] for a 16 x 16 block (r[i]: row i). */
static inline __attribute__((always_inline)) void tb_transpose16(__m512 r[16])
{
    __m512 t[16], u[16];
    int g, c;
    for (g = 0; g < 8; ++g) {
        t[2 * g] = _mm512_unpacklo_ps(r[2 * g], r[2 * g + 1]);
        t[2 * g + 1] = _mm512_unpackhi_ps(r[2 * g], r[2 * g + 1]);
    }
    /* u[4g + c]: in 128-bit lane L, column 4L + c of rows 4g .. 4g+3. */
    for (g = 0; g < 4; ++g) {
        u[4 * g + 0] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
        u[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
        u[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
        u[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
    }
    for (c = 0; c < 4; ++c) {
        const __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);
        const __m512 v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);
        const __m512 v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
        const __m512 v3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
        r[c] = _mm512_shuffle_f32x4(v0, v2, 0x88);
        r[4 + c] = _mm512_shuffle_f32x4(v1, v3, 0x88);
        r[8 + c] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
        r[12 + c] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
    }
}

#endif
