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
#endif

/*
 * Input transform of one image's tiles [t0, t0 + nt) (see tb_wino_in_fn):
 * per channel and row of tiles, B^T down the columns of the six input rows
 * (z), z split into its four phases (z[4 u + b] at ph[b][u]) so that B along
 * the rows reads whole vectors, CH_LANES tiles at a time.
 */
static void tb_wino_in(const tb_wino_geom *g, const float *img, int64_t t0,
                       int64_t nt, float *v, int64_t ldv, float *tmp)
{
    float *z = tmp, *ph = z + 6 * TB_WINO_ROW;
    const int64_t t1 = t0 + nt;
    int64_t ty;
    for (ty = t0 / g->tw; ty * g->tw < t1; ++ty) {
        const int64_t xa0 = ty * g->tw < t0 ? t0 - ty * g->tw : 0;
        const int64_t xb = (ty + 1) * g->tw > t1 ? t1 - ty * g->tw : g->tw;
        int64_t xa;
        for (xa = xa0; xa < xb; xa += TB_WINO_CHUNK) {
            const int64_t n = xb - xa < TB_WINO_CHUNK ? xb - xa : TB_WINO_CHUNK;
            /* columns q of z: input column col0 + q */
            const int64_t col0 = 4 * xa - g->pl;
            const int64_t ln = (n + CH_LANES - 1) / CH_LANES * CH_LANES;
            const int64_t un = (n + CH_LANES) / CH_LANES * CH_LANES;
            const int64_t out0 = ty * g->tw + xa - t0;
            int64_t ci, q, u;
            int i, e, b;
            for (ci = 0; ci < g->c; ++ci) {
                const float *rp[6];
                for (i = 0; i < 6; ++i) {
                    const int64_t iy = 4 * ty + i - g->pt;
                    rp[i] = iy >= 0 && iy < g->h ? img + (ci * g->h + iy) * g->w : NULL;
                }
                /* the columns the tiles read (4 n + 2), in whole vectors; the
                 * phases read z up to 4 un, past them only for lanes of no
                 * tile */
                for (q = 0; q < 4 * n + 2; q += CH_LANES) {
                    const int64_t col = col0 + q;
                    const int inside = col >= 0 && col + CH_LANES <= g->w;
                    ch_vf d[6], o[6];
                    for (i = 0; i < 6; ++i)
                        d[i] = rp[i] == NULL ? ch_splat(0.0f)
                               : inside     ? ch_loadu(rp[i] + col)
                                            : wg_load_part(rp[i], col, g->w);
                    wg_bt(d, o);
                    for (i = 0; i < 6; ++i)
                        ch_storeu(z + i * TB_WINO_ROW + q, o[i]);
                }
                /* whole vectors of phases (un >= n + 1; the lanes past
                 * z's columns are never used) */
                for (i = 0; i < 6; ++i) {
                    const float *zi = z + i * TB_WINO_ROW;
                    float *pi = ph + i * 4 * TB_WINO_PHASE;
                    for (u = 0; u < un; u += CH_LANES) {
                        int l;
                        for (l = 0; l < CH_LANES; ++l)
                            for (b = 0; b < 4; ++b)
                                pi[b * TB_WINO_PHASE + u + l] = zi[4 * (u + l) + b];
                    }
                }
                for (u = 0; u < ln; u += CH_LANES) {
                    for (i = 0; i < 6; ++i) {
                        const float *pi = ph + i * 4 * TB_WINO_PHASE + u;
                        ch_vf d[6], o[6];
                        for (b = 0; b < 6; ++b)
                            d[b] = ch_loadu(pi + (b % 4) * TB_WINO_PHASE + b / 4);
                        wg_bt(d, o);
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
