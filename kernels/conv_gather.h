/*
 * conv_gather.h - the implicit im2col of tirbyoc_conv2d_f32 (conv_f32.c):
 * K rows of a convolution's column matrix, gathered from the NCHW image
 * straight into the micro-kernel's 16-pixel panels. Included by each
 * instruction set's file, which first defines
 *
 *     static inline void cg_run(float *d, const float *row, int64_t iw,
 *                               int64_t sw, int64_t w, int t0, int len);
 *
 * writing d[t0 + e] = row[iw + e * sw] for the e < len whose column lies in
 * [0, w), 0 for the others (row NULL: all 0), and nothing else of d;
 * cg_copy16(d, src): d[0:16] = src[0:16]; and cg_copy16_s2(d, src):
 * d[e] = src[2 * e] for e < 16 (reading nothing past src[30]).
 */
#ifndef TIRBYOC_CONV_GATHER_H
#define TIRBYOC_CONV_GATHER_H

#include <stdint.h>

#include "dense_f32_internal.h"

#ifndef TB_CG_OWN_LOADS
static inline void cg_run(float *d, const float *row, int64_t iw, int64_t sw,
                          int64_t w, int t0, int len)
{
    int e;
    for (e = 0; e < len; ++e) {
        const int64_t col = iw + e * sw;
        d[t0 + e] = row != NULL && col >= 0 && col < w ? row[col] : 0.0f;
    }
}

static inline void cg_copy16(float *restrict d, const float *restrict src)
{
    int e;
    for (e = 0; e < 16; ++e)
        d[e] = src[e];
}

static inline void cg_copy16_s2(float *restrict d, const float *restrict src)
{
    int e;
    for (e = 0; e < 16; ++e)
        d[e] = src[2 * e];
}
#endif

/* The run lengths of a panel that spans output rows: pixels from (orow,
 * ocol) on, cnt of them, into d[0:16] (zeros past cnt). */
static void cg_panel_runs(const tb_conv_geom *g, const float *plane,
                          int64_t rdh, int64_t sdw, const tb_conv_panel *p,
                          float *d)
{
    int64_t orow = p->orow, ocol = p->ocol;
    int t = 0;
    while (t < p->cnt) {
        const int len = (int)(p->cnt - t < g->ow - ocol ? p->cnt - t
                                                        : g->ow - ocol);
        const int64_t ih = orow * g->sh + rdh;
        cg_run(d, ih >= 0 && ih < g->h ? plane + ih * g->w : NULL,
               ocol * g->sw + sdw, g->sw, g->w, t, len);
        t += len;
        ocol = 0;
        ++orow;
    }
    if (t < 16)
        cg_run(d, NULL, 0, 1, 0, t, 16 - t);
}

/* Rows [k0, k0 + kc) of the column matrix for panels pn[0:np] into
 * dst[q * dps + r * 16 + t]; row g->k (the bias step) is ones. */
static void tb_conv_gather(const tb_conv_geom *g, const float *img,
                           int64_t k0, int64_t kc, const tb_conv_panel *pn,
                           int64_t np, float *dst, int64_t dps)
{
    const int64_t khw = g->kh * g->kw, hw = g->h * g->w, w = g->w;
    const int64_t span = 15 * g->sw + 1; /* input columns a panel covers */
    int64_t ci = k0 / khw, ki = (k0 % khw) / g->kw, kj = k0 % g->kw;
    int64_t q, r;
    for (r = 0; r < kc; ++r) {
        const float *plane = img + ci * hw;
        const int64_t rdh = ki * g->dh - g->pt, sdw = kj * g->dw - g->pl;
        if (k0 + r >= g->k) { /* the bias step */
            for (q = 0; q < np; ++q) {
                float *d = dst + q * dps + r * 16;
                int t;
                for (t = 0; t < 16; ++t)
                    d[t] = t < pn[q].cnt ? 1.0f : 0.0f;
            }
            continue;
        }
        for (q = 0; q < np; ++q) {
            const tb_conv_panel *p = &pn[q];
            float *d = dst + q * dps + r * 16;
            const int64_t ih = p->orow * g->sh + rdh;
            const int64_t iw = p->ocol * g->sw + sdw;
            if (!p->single) {
                cg_panel_runs(g, plane, rdh, sdw, p, d);
            } else if (ih < 0 || ih >= g->h) {
                cg_run(d, NULL, 0, 1, 0, 0, 16);
            } else if (g->sw <= 2 && iw >= 0 && iw + span <= w) {
                if (g->sw == 1)
                    cg_copy16(d, plane + ih * w + iw);
                else
                    cg_copy16_s2(d, plane + ih * w + iw);
            } else {
                cg_run(d, plane + ih * w, iw, g->sw, w, 0, 16);
            }
        }
        if (++kj == g->kw) {
            kj = 0;
            if (++ki == g->kh) {
                ki = 0;
                ++ci;
            }
        }
    }
}

#endif /* TIRBYOC_CONV_GATHER_H */
