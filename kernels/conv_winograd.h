/*
 * conv_winograd.h - the input and output transforms of the Winograd
 * convolution F(4x4, 3x3) (conv_winograd_f32.c), on the including
 * instruction set's vector registers (ch_vf of chain_f32.h). Included by
 * each instruction set's file after chain_f32.h.
 *
 * Interpolation points 0, 1, -1, 2, -1/2 and infinity. With them the
 * float32 result is about 2.5x closer to the exact one than with Lavin and
 * Gray's 0, +-1, +-2 (measured over random 64-channel convs: 1.2e-6 against
 * 3.4e-6 of max|y|), for a few more additions. A 6 x 6 input tile d becomes
 * V = B^T d B, a 4 x 4 output tile is Y = A^T M A, with
 *
 *   B^T = [ 1  3/2   -2  -3/2     1  0 ]     A^T = [ 1  1   1  1     1  0 ]
 *         [ 0   -1 -5/2  -1/2     1  0 ]           [ 0  1  -1  2  -1/2  0 ]
 *         [ 0    1  1/2  -5/2     1  0 ]           [ 0  1   1  4   1/4  0 ]
 *         [ 0 -1/2   -1   1/2     1  0 ]           [ 0  1  -1  8  -1/8  1 ]
 *         [ 0    2   -1    -2     1  0 ]
 *         [ 0    1  3/2    -2  -3/2  1 ]
 *
 * (the weight's G is in conv_winograd_f32.c).
 */
#ifndef TIRBYOC_CONV_WINOGRAD_H
#define TIRBYOC_CONV_WINOGRAD_H

#include <stdint.h>
#include <string.h>

#include "dense_f32_internal.h"

/* v = B^T d (one 6-point transform, lanewise) */
CH_INLINE void wg_bt(const ch_vf d[6], ch_vf v[6])
{
    const ch_vf s13 = d[1] - d[3], s4 = d[4];
    v[0] = d[0] - 2.0f * d[2] + 1.5f * s13 + s4;
    v[1] = s4 - d[1] - 2.5f * d[2] - 0.5f * d[3];
    v[2] = s4 + d[1] + 0.5f * d[2] - 2.5f * d[3];
    v[3] = s4 - d[2] - 0.5f * s13;
    v[4] = s4 - d[2] + 2.0f * s13;
    v[5] = d[5] + d[1] + 1.5f * (d[2] - d[4]) - 2.0f * d[3];
}

/* o = A^T m */
CH_INLINE void wg_at(const ch_vf m[6], ch_vf o[4])
{
    const ch_vf a = m[1] + m[2], b = m[1] - m[2];
    o[0] = m[0] + a + m[3] + m[4];
    o[1] = b + 2.0f * m[3] - 0.5f * m[4];
    o[2] = a + 4.0f * m[3] + 0.25f * m[4];
    o[3] = b + 8.0f * m[3] - 0.125f * m[4] + m[5];
}

/* Lanes l of row[col + l] whose column lies in [0, w), 0 in the others
 * (nothing else of row is read). */
#ifndef TB_WG_OWN_LOADS
CH_INLINE ch_vf wg_load_part(const float *row, int64_t col, int64_t w)
{
    ch_vf v = ch_splat(0.0f);
    int l;
    for (l = 0; l < CH_LANES; ++l)
        if (col + l >= 0 && col + l < w)
            v[l] = row[col + l];
    return v;
}

/* d[0:n] = lanes [0, n) of v, n < CH_LANES */
CH_INLINE void wg_store_part(float *d, ch_vf v, int64_t n)
{
    int l;
    for (l = 0; l < CH_LANES; ++l)
        if (l < n)
            d[l] = v[l];
}

/* d[r * n + x] = v[r * (n + 1) + x] for r < rows, x < n (rows of n tiles,
 * one lane apart in v) */
CH_INLINE void wg_store_rows(float *d, ch_vf v, int rows, int64_t n)
{
    int r;
    int64_t x;
    for (r = 0; r < rows; ++r)
        for (x = 0; x < n; ++x)
            d[r * n + x] = v[r * (n + 1) + x];
}
#endif

/* Rows of tiles stacked in one vector: at most this many (their z fit in
 * the z buffer, WG_STACK_Z floats per input row). */
#define WG_STACK_MAX 4
#define WG_STACK_Z 80

/* z (6 rows of B^T down the columns of input rows 4 ty - pt ..) of channel
 * ci, columns col0 + q for q < qn rounded up to whole vectors. */
CH_INLINE void wg_columns(const tb_wino_geom *g, const float *img, int64_t ci,
                          int64_t ty, int64_t col0, int64_t qn, float *z, int64_t ldz)
{
    const float *rp[6];
    int64_t q;
    int i;
    for (i = 0; i < 6; ++i) {
        const int64_t iy = 4 * ty + i - g->pt;
        rp[i] = iy >= 0 && iy < g->h ? img + (ci * g->h + iy) * g->w : NULL;
    }
    for (q = 0; q < qn; q += CH_LANES) {
        const int64_t col = col0 + q;
        const int inside = col >= 0 && col + CH_LANES <= g->w;
        ch_vf d[6], o[6];
        for (i = 0; i < 6; ++i)
            d[i] = rp[i] == NULL ? ch_splat(0.0f)
                   : inside     ? ch_loadu(rp[i] + col)
                                : wg_load_part(rp[i], col, g->w);
        wg_bt(d, o);
        for (i = 0; i < 6; ++i)
            ch_storeu(z + i * ldz + q, o[i]);
    }
}

/* The phases of z's 6 rows, un of each (a multiple of CH_LANES), from lane
 * u0 of ph (whole vectors: lanes past them are overwritten or unused). */
CH_INLINE void wg_phases(const float *z, int64_t ldz, int64_t un, float *ph, int64_t u0)
{
    int64_t u;
    int i, b, l;
    for (i = 0; i < 6; ++i) {
        const float *zi = z + i * ldz;
        float *pi = ph + i * 4 * TB_WINO_PHASE + u0;
        for (u = 0; u < un; u += CH_LANES)
            for (l = 0; l < CH_LANES; ++l)
                for (b = 0; b < 4; ++b)
                    pi[b * TB_WINO_PHASE + u + l] = zi[4 * (u + l) + b];
    }
}

/* B along the rows of z's row i, tiles from lane u of the phases: o[nu]. */
CH_INLINE void wg_rows(const float *ph, int i, int64_t u, ch_vf o[6])
{
    const float *pi = ph + i * 4 * TB_WINO_PHASE + u;
    ch_vf d[6];
    int b;
    for (b = 0; b < 6; ++b)
        d[b] = ch_loadu(pi + (b % 4) * TB_WINO_PHASE + b / 4);
    wg_bt(d, o);
}

/*
 * Input transform of one image's tiles [t0, t0 + nt) (see tb_wino_in_fn):
 * per channel and row of tiles, B^T down the columns of the six input rows
 * (z), z split into its four phases (z[4 u + b] at ph[b][u]) so that B along
 * the rows reads whole vectors, CH_LANES tiles at a time; rows of fewer than
 * CH_LANES / 2 tiles several to a vector.
 */
static void tb_wino_in(const tb_wino_geom *g, const float *img, int64_t t0,
                       int64_t nt, float *v, int64_t ldv, float *tmp)
{
    float *z = tmp, *ph = z + 6 * TB_WINO_ROW;
    const int64_t t1 = t0 + nt;
    int64_t ty = t0 / g->tw;
    while (ty * g->tw < t1) {
        const int64_t xa0 = ty * g->tw < t0 ? t0 - ty * g->tw : 0;
        const int64_t xb = (ty + 1) * g->tw > t1 ? t1 - ty * g->tw : g->tw;
        int64_t xa, rows = 1;
        /* Narrow images: whole rows of n tiles stacked n + 1 lanes apart, so
         * that B along the rows fills the vector (ResNet's 28 x 28 convs
         * have 7 tiles per row: 2 rows in 16 lanes) */
        if (xa0 == 0 && 2 * (g->tw + 1) <= CH_LANES) {
            rows = CH_LANES / (g->tw + 1);
            rows = rows < WG_STACK_MAX ? rows : WG_STACK_MAX;
            while (rows > 1 && (ty + rows) * g->tw > t1)
                --rows;
        }
        if (rows > 1) {
            const int64_t n = g->tw, m = n + 1, out0 = ty * g->tw - t0;
            int64_t ci;
            int r, i, e;
            for (ci = 0; ci < g->c; ++ci) {
                for (r = 0; r < rows; ++r) {
                    float *zr = z + r * 6 * WG_STACK_Z;
                    wg_columns(g, img, ci, ty + r, -g->pl, 4 * n + 2, zr, WG_STACK_Z);
                    wg_phases(zr, WG_STACK_Z, CH_LANES, ph, r * m);
                }
                for (i = 0; i < 6; ++i) {
                    ch_vf o[6];
                    wg_rows(ph, i, 0, o);
                    for (e = 0; e < 6; ++e)
                        wg_store_rows(v + ((int64_t)(i * 6 + e) * g->c + ci) * ldv + out0,
                                      o[e], rows, n);
                }
            }
            ty += rows;
            continue;
        }
        for (xa = xa0; xa < xb; xa += TB_WINO_CHUNK) {
            const int64_t n = xb - xa < TB_WINO_CHUNK ? xb - xa : TB_WINO_CHUNK;
            const int64_t ln = (n + CH_LANES - 1) / CH_LANES * CH_LANES;
            const int64_t un = (n + CH_LANES) / CH_LANES * CH_LANES;
            const int64_t out0 = ty * g->tw + xa - t0;
            int64_t ci, u;
            int i, e;
            for (ci = 0; ci < g->c; ++ci) {
                /* the columns the tiles read (4 n + 2); the phases read z up
                 * to 4 un, past them only for lanes of no tile */
                wg_columns(g, img, ci, ty, 4 * xa - g->pl, 4 * n + 2, z, TB_WINO_ROW);
                wg_phases(z, TB_WINO_ROW, un, ph, 0);
                for (u = 0; u < ln; u += CH_LANES) {
                    for (i = 0; i < 6; ++i) {
                        ch_vf o[6];
                        wg_rows(ph, i, u, o);
                        /* whole vectors: lanes past the row's last tile
                         * land where later rows' tiles go, before those are
                         * written; only the unit's last tiles are stored
                         * lane by lane */
                        for (e = 0; e < 6; ++e) {
                            float *d = v + ((int64_t)(i * 6 + e) * g->c + ci) * ldv +
                                       out0 + u;
                            if (out0 + u + CH_LANES <= nt)
                                ch_storeu(d, o[e]);
                            else
                                wg_store_part(d, o[e], nt - out0 - u);
                        }
                    }
                }
            }
        }
        ++ty;
    }
}

/*
 * Output transform of nt tiles' products m[(e * nt + t) * ldm + o] (o < ldm,
 * a multiple of 16): s[((i * nt + t) * 4 + j) * ldm + o] = (A^T M A)[i][j]
 * + bias[o] (bias NULL: none), pixel (i, j) of tile t.
 */
static void tb_wino_out(const float *m, int64_t nt, int64_t ldm,
                        const float *bias, float *s)
{
    int64_t t, o;
    int i, j, e;
    for (t = 0; t < nt; ++t)
        for (o = 0; o < ldm; o += CH_LANES) {
            ch_vf cols[4][6], in[6], out[4];
            const ch_vf bv = bias != NULL ? ch_loadu(bias + o) : ch_splat(0.0f);
            for (j = 0; j < 6; ++j) {
                for (e = 0; e < 6; ++e)
                    in[e] = ch_loadu(m + ((e * 6 + j) * nt + t) * ldm + o);
                wg_at(in, out);
                for (i = 0; i < 4; ++i)
                    cols[i][j] = out[i];
            }
            for (i = 0; i < 4; ++i) {
                wg_at(cols[i], out);
                for (j = 0; j < 4; ++j)
                    ch_storeu(s + ((i * nt + t) * 4 + j) * ldm + o, out[j] + bv);
            }
        }
}

#endif /* TIRBYOC_CONV_WINOGRAD_H */
