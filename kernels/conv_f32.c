/*
 * conv_f32.c - 2-D convolution, float32, NCHW (tirbyoc_conv2d_f32), as an
 * implicit matrix product on the instruction set's own building blocks:
 *
 *     Y_n[o][p] = sum_k  W[o][k] * X_n[k][p]   (+ bias[o]), then the chain
 *
 * with o an output channel, p an output pixel (oh * OW + ow) and k a kernel
 * tap (c, r, s) of the weight's [OC][C / G][KH][KW] order; in G groups, one
 * such product per group, over the group's C / G input channels (X_n of the
 * group's planes) and OC / G output rows. Y_n is the image's
 * [OC, OH * OW] output, row-major: NCHW as it is, no transpose. The column
 * matrix X_n is never stored: each K block of a block of pixels is gathered
 * straight from the image into the micro-kernel's 16-pixel panels (an
 * implicit im2col), zeros where a tap falls in the padding. A 1x1 stride-1
 * conv without padding reads the image as its [C, H * W] matrix through
 * the dense packing routine.
 *
 * The bias rides in the product as one more K step: a bias column after the
 * weight's row in the packed A tile, a row of ones under the gathered
 * panels. Residual, activations and the rest of the chain are applied to
 * each register tile before it is stored, as in the dense kernels.
 *
 * Work units are (image, group, block of its output channels, block of
 * pixels); a unit
 * gathers each K block of its pixels once and sweeps every row group of
 * its channels over it. Channels are split into blocks only when there are
 * too few pixel blocks to keep the threads busy. Units are handed out by
 * tb_units (home ranges, then stealing); each output is computed the same
 * way whichever thread takes it (same K blocks, same order), so results do
 * not depend on the thread count.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dense_f32_internal.h"

#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

/* Below this many flops a call stays on the calling thread. */
#define CONV_PAR_FLOPS (1.0 * 1024 * 1024)
/* Units per thread wanted before channels are split into blocks. */
#define CONV_UNITS_PER_THREAD 3
/* Sizes above this are refused (keeps every index computation in range). */
#define CONV_DIM_MAX ((int64_t)1 << 31)

typedef struct {
    const tb_isa *isa;
    int64_t batch;
    int64_t c, oc;            /* input and output channels */
    int64_t groups, cg, ocg; /* groups, and input / output channels per group */
    tb_conv_geom g; /* a group's column matrix; g.k = C / G * KH * KW */
    const float *x, *wt, *bias;
    const float *wpk; /* or the pre-packed weight (wt and bias then NULL) */
    float *apk; /* the gather path's weight rows, packed once per call (or
                   NULL): row group i0.. at apk + i0 * kt, ap[p * mr + i] */
    float *y;
    int64_t kt;     /* k, plus the bias step */
    int64_t p;      /* OH * OW */
    int plain;      /* 1x1, stride 1, no padding: X_n is the image itself */
    tb_chain chain; /* without the bias; residual of image 0, ldr = p */
    int64_t pbw, npb; /* pixels per block (whole panels), blocks per image */
    int64_t nob;      /* blocks of output channels (about equal) */
    int64_t units;
    int direct; /* the direct path (conv_direct) takes the units */
    /* the direct path only */
    int64_t wv, hq;   /* a phase plane's row (the virtual row) and rows */
    int64_t ps, cs;   /* floats per phase plane and per channel */
    int64_t is;       /* floats per image: its channels, then the ones plane */
    int64_t vp;       /* virtual pixels of an image: OH * wv */
    int runs;         /* tiles are runs of real pixels (each spans at most
                         two output rows), else of virtual ones */
    int64_t tp;       /* pixels an image's tiles cover: p if runs, else vp */
    unsigned phases;  /* bit a * sw + b: phase plane (a, b) is read */
    float *xp;        /* the phase images, or the ones plane when inplace */
    const int64_t *koff; /* per k step below g.k: where its virtual pixel 0
                            sits, from the group's first plane */
    int inplace;      /* a plain conv: the planes are the image's channels */
    int64_t obw;      /* output channels per block (a multiple of 16) */
    int xb, yb;       /* x, y (and the residual) are NCHW16c (direct path) */
    int x16;          /* xb read in place (a plain conv in one group); any
                         other xb is copied into the phase planes */
} conv_job_t;

static int64_t min_i64(int64_t x, int64_t y) { return x < y ? x : y; }
static int64_t max_i64(int64_t x, int64_t y) { return x > y ? x : y; }
static int64_t cdiv(int64_t x, int64_t y) { return (x + y - 1) / y; }

/* The panels of pixels [j0, j0 + nc); returns their count. */
static int64_t panels_of(const conv_job_t *j, int64_t j0, int64_t nc,
                         tb_conv_panel *pn)
{
    int64_t q;
    for (q = 0; q * 16 < nc; ++q) {
        const int64_t pix = j0 + q * 16;
        pn[q].orow = pix / j->g.ow;
        pn[q].ocol = pix % j->g.ow;
        pn[q].cnt = min_i64(16, nc - q * 16);
        pn[q].single = pn[q].cnt == 16 && pn[q].ocol + 16 <= j->g.ow;
    }
    return q;
}

/* Rows [k0, k0 + kc) of the image's column matrix for pixels [j0, j0 + nc)
 * (the panels pn[0:np]) into dst[q * dps + r * 16 + t]. */
static void gather(const conv_job_t *j, const float *img, int64_t k0,
                   int64_t kc, int64_t j0, int64_t nc, const tb_conv_panel *pn,
                   int64_t np, float *dst, int64_t dps)
{
    int64_t q, t;
    if (!j->plain) {
        j->isa->conv_gather(&j->g, img, k0, kc, pn, np, dst, dps);
        return;
    }
    /* the image is the [C, H * W] matrix: packed as a dense operand */
    const int64_t kr = min_i64(kc, j->g.k - k0); /* image rows */
    if (kr > 0)
        j->isa->pack_w(TB_W_NN, kr, nc, img + k0 * j->p + j0, j->p, dst, dps);
    if (kr < kc) /* the bias step */
        for (q = 0; q < np; ++q)
            for (t = 0; t < 16; ++t)
                dst[q * dps + kr * 16 + t] = t < pn[q].cnt ? 1.0f : 0.0f;
}

/* The pre-packed panel holding output channel o (step 0, lane 0). */
static const float *packed_panel(const conv_job_t *j, int64_t o)
{
    const int64_t gi = o / j->ocg;
    return j->wpk + (gi * cdiv(j->ocg, 16) + o % j->ocg / 16) * 16 * j->kt;
}

/* A[0:mr, k0:k0+kc] of the weight with the bias step -> ap[p * mr + i]. */
static void pack_weight_rows(const conv_job_t *j, int64_t o0, int mr,
                             int64_t k0, int64_t kc, float *ap)
{
    const int64_t kr = min_i64(kc, j->g.k - k0);
    int i;
    if (j->wpk != NULL) {
        /* rows o0.. of the pre-packed panels (the bias step included): per
         * k step, a run of consecutive lanes of each panel the rows span
         * (one or two runs, not mr strided loads: about 8% of a 1x1 conv's
         * time went to the strided copy) */
        int64_t p;
        int t;
        for (i = 0; i < mr;) {
            const int64_t o = o0 + i, lane = o % j->ocg % 16;
            const int cnt = (int)min_i64(mr - i, min_i64(16 - lane, j->ocg - o % j->ocg));
            const float *src = packed_panel(j, o) + k0 * 16 + lane;
            for (p = 0; p < kc; ++p)
                for (t = 0; t < cnt; ++t)
                    ap[p * mr + i + t] = src[p * 16 + t];
            i += cnt;
        }
        return;
    }
    if (kr > 0)
        j->isa->pack_a(mr, kr, j->wt + o0 * j->g.k + k0, j->g.k, ap);
    if (kr < kc)
        for (i = 0; i < mr; ++i)
            ap[kr * mr + i] = j->bias[o0 + i];
}

/* The direct path's W operand: steps [k0, k0 + kc) (with the bias step) of
 * output channels [o0, o0 + nr), nr <= 32, as two 16-channel panels of kc
 * steps -> wp[q * kc * 16 + p * 16 + t], zeros past nr. */
static void pack_weight_panels(const conv_job_t *j, int64_t o0, int nr,
                               int64_t k0, int64_t kc, float *wp)
{
    const int64_t kr = min_i64(kc, j->g.k - k0);
    int e;
    if (kr > 0)
        j->isa->pack_w(TB_W_NT, kr, nr, j->wt + o0 * j->g.k + k0, j->g.k, wp,
                       kc * 16);
    if (kr < kc)
        for (e = 0; e < 32; ++e)
            wp[e / 16 * kc * 16 + kr * 16 + e % 16] =
                e < nr ? j->bias[o0 + e] : 0.0f;
}

/* The gather path's partition of the output channels. Channel block ob of
 * group gi: channels [*o0, returned). */
static int64_t channel_block(const conv_job_t *j, int64_t gi, int64_t ob, int64_t *o0)
{
    const int64_t o = gi * j->ocg;
    *o0 = o + j->ocg * ob / j->nob;
    return o + j->ocg * (ob + 1) / j->nob;
}

/* Row group mp of the mpanels = cdiv(m, mr) groups of channels [o0, o0 + m)
 * (about equal rows): its first channel *i0; returns its rows. */
static int row_group(int64_t o0, int64_t m, int64_t mp, int64_t mpanels, int64_t *i0)
{
    *i0 = o0 + m * mp / mpanels;
    return (int)(o0 + m * (mp + 1) / mpanels - *i0);
}

/* Row groups per channel block at most (the prepack's units per block). */
static int64_t row_groups_max(const conv_job_t *j)
{
    return cdiv(cdiv(j->ocg, j->nob), j->isa->mr);
}

/* Unit u: row group mp of group gi's channel block ob, as conv_unit takes
 * them, packed for every K step into j->apk: once per call instead of once
 * per unit (a 1x1 conv of 128 channels at 56 x 56 packed the same rows in
 * each of its 8 units). */
static void prepack_rows(void *arg, int64_t u, float *scratch)
{
    conv_job_t *j = (conv_job_t *)arg;
    const int64_t per = row_groups_max(j), mp = u % per;
    int64_t o0, i0;
    const int64_t m = channel_block(j, u / per / j->nob, u / per % j->nob, &o0) - o0;
    const int64_t mpanels = cdiv(m, j->isa->mr);
    (void)scratch;
    if (mp < mpanels) {
        const int mr = row_group(o0, m, mp, mpanels, &i0);
        pack_weight_rows(j, i0, mr, 0, j->kt, j->apk + i0 * j->kt);
    }
}

/* Unit: image n, output channels [o0, o1) (of one group, whose input
 * channels start at c0), pixels [j0, j1). */
static void conv_unit(const conv_job_t *j, int64_t n, int64_t c0, int64_t o0,
                      int64_t o1, int64_t j0, int64_t j1, float *scratch)
{
    const tb_isa *isa = j->isa;
    const float *img = j->x + (n * j->c + c0) * j->g.h * j->g.w;
    float *y = j->y + n * j->oc * j->p;
    float *bbuf = scratch, *abuf = scratch + (size_t)TB_KC_MAX * TB_NC_MAX;
    const int64_t nc = j1 - j0;
    const int64_t kblocks = tb_kblocks(j->kt, isa->kc);
    const int64_t m = o1 - o0, mpanels = cdiv(m, isa->mr);
    tb_chain ch = j->chain;
    tb_conv_panel pn[TB_NC_MAX / 16];
    const int64_t np = panels_of(j, j0, nc, pn);
    /* A chain with a transcendental operation goes over each row group's
     * outputs once they are final and still in L1 (the ISA's chain: a row at
     * a time, each operation a loop over it), not over each tile's
     * registers: the same operations on each output, so the same bits. */
    const int later = tb_chain_has_math(ch.ops);
    const tb_chain *tile_ch = ch.ops != 0 && !later ? &ch : NULL;
    int64_t kb, mp;
    if (ch.residual != NULL)
        ch.residual += n * j->oc * j->p;
    for (kb = 0; kb < kblocks; ++kb) {
        const int64_t pc = tb_kblock_start(j->kt, kblocks, kb);
        const int64_t kc = tb_kblock_start(j->kt, kblocks, kb + 1) - pc;
        const int64_t dps = kc * TB_NR;
        const int flags = (kb > 0 ? TB_ACCUMULATE : 0) |
                          (kb == kblocks - 1 ? TB_LAST : 0);
        gather(j, img, pc, kc, j0, nc, pn, np, bbuf, dps);
        for (mp = 0; mp < mpanels; ++mp) {
            int64_t i0, jr;
            const int mr = row_group(o0, m, mp, mpanels, &i0);
            const float *ap = abuf;
            if (j->apk != NULL)
                ap = j->apk + i0 * j->kt + pc * mr;
            else
                pack_weight_rows(j, i0, mr, pc, kc, abuf);
            for (jr = 0; jr < nc; jr += isa->nr)
                isa->ukernel(kc, ap, bbuf + (jr / TB_NR) * dps, dps,
                             y + i0 * j->p + j0 + jr, j->p, mr,
                             (int)min_i64(isa->nr, nc - jr), flags,
                             tile_ch, i0, j0 + jr);
            if (later && (flags & TB_LAST))
                isa->chain(&ch, y + i0 * j->p + j0, j->p, mr, nc, i0, j0);
        }
    }
}


/* ---- direct path ----
 *
 * Where the ISA has conv_tile, the column matrix is not gathered: the
 * micro-kernel reads its rows in place. Rows of its tile are output pixels
 * and columns output channels (the weights are the W operand: 16-channel
 * panels pre-packed at compile time, or packed per unit and K block), so
 * the pixels of k step (c, r, s) are consecutive floats of one plane when
 * the image is first copied, zero padded, into phase planes: plane (a, b)
 * of channel c holds element [i][j] = x[c][i * sh + a - pt][j * sw + b - pl]
 * (0 outside the image), i < hq, j < wv. Output pixel (oh, ow) is virtual
 * pixel q = oh * wv + ow, and tap (r, s) of it sits at q plus
 * ((r * dh) / sh) * wv + (s * dw) / sw in plane ((r * dh) % sh, (s * dw) % sw):
 * one row pointer per k step (kp) for every pixel. A plain conv needs no
 * copy: its planes are the image's channels. The bias step reads a plane
 * of ones. Tiles are runs of mr real pixels (j->runs; where a run wraps to
 * the next output row, its later rows skip the virtual row's padding) when
 * no run spans more than two output rows; otherwise runs of virtual pixels,
 * those with ow >= OW computed and dropped.
 * Each unit keeps its tiles' sums, pixel-major, in scratch over the K
 * blocks, then transposes them into y (conv_out) and applies the chain.
 * The sums are the gather path's bit for bit: the same K blocks, each one
 * FMA chain in k order, added in order. TIRBYOC_CONV_DIRECT=0 turns the path
 * off, =1 takes it wherever it can run (tests); unset, conv_direct chooses.
 */

/* Fewer k steps (with the bias step) than this take the gather path. */
#define CONV_DIRECT_K_MIN 128
/* A plain conv with at least this many k steps (with the bias step) takes
 * the direct path up to this many pixels per output channel (else up to
 * one). */
#define CONV_DIRECT_PLAIN_K 256
#define CONV_DIRECT_PLAIN_PIXELS 4
/* Strides above this take the gather path. */
#define CONV_DIRECT_STRIDE_MAX 4
/* Output channels per unit at most (bounds the scratch a tile row needs). */
#define CONV_DIRECT_OB_MAX 1024
/* Phase image floats at most. */
#define CONV_DIRECT_FLOATS_MAX ((int64_t)1 << 28)
/* conv_out: blocks of 16 pixels between fetching an output line and storing
 * to it. */
#define CONV_OUT_AHEAD 4

/* kp[0:kc]: where virtual pixel 0 of k steps [k0, k0 + kc) of group gi
 * sits, in image img's planes (the image itself when in place). */
static void direct_rows(const conv_job_t *j, const float *img, int64_t gi,
                        int64_t k0, int64_t kc, const float **kp)
{
    const float *group = img + gi * j->cg * j->cs;
    const float *ones = j->inplace ? j->xp : img + j->c * j->cs;
    int64_t p;
    for (p = 0; p < kc; ++p)
        kp[p] = k0 + p < j->g.k ? group + j->koff[k0 + p] : ones;
}

/* koff[0:g.k] (see conv_job_t), once per call: the divisions stay out of
 * the units (about 3% of a small-K conv's time when each unit did them),
 * and are taken once per tap (r, s); channel c's steps are its plane's
 * offset plus the tap's. */
static void direct_offsets(const conv_job_t *j, int64_t *koff)
{
    const tb_conv_geom *g = &j->g;
    const int64_t khw = g->kh * g->kw;
    int64_t c, t;
    for (t = 0; t < khw; ++t) {
        const int64_t rd = t / g->kw * g->dh, sd = t % g->kw * g->dw;
        koff[t] = (rd % g->sh * g->sw + sd % g->sw) * j->ps + rd / g->sh * j->wv +
                  sd / g->sw;
    }
    for (c = 1; c < g->k / khw; ++c)
        for (t = 0; t < khw; ++t)
            koff[c * khw + t] = c * j->cs + koff[t];
}

/* d[t] = s[2 t] for t < n: with the stride a constant, the compiler
 * vectorizes the loop (a stride-2 conv's phase planes: ResNet's downsampling
 * convs spent about a tenth of their time in the scalar copy). */
static void copy_every_other(float *restrict d, const float *restrict s,
                             int64_t n)
{
    int64_t t;
    for (t = 0; t < n; ++t)
        d[t] = s[2 * t];
}

/* The columns [tlo, thi) of a phase plane's rows whose pixels, off + t * sw,
 * lie in the image's [0, w) (off: the phase's column b less the left
 * padding); the others are padding. */
static void phase_columns(const conv_job_t *j, int64_t off, int64_t *tlo, int64_t *thi)
{
    const tb_conv_geom *g = &j->g;
    *tlo = off >= 0 ? 0 : min_i64(j->wv, cdiv(-off, g->sw));
    *thi = off >= g->w ? *tlo : min_i64(j->wv, cdiv(g->w - off, g->sw));
}

/* One phase plane (a, b) of channel plane src into pl. Its rows are a few
 * dozen floats: plain loops (vectorized), not memcpy and memset calls, whose
 * call and dispatch cost about as much as such a row's copy (GCC would turn
 * the loops back into the calls). */
__attribute__((optimize("no-tree-loop-distribute-patterns")))
static void direct_plane(const conv_job_t *j, const float *src, int64_t a,
                         int64_t b, float *pl)
{
    const tb_conv_geom *g = &j->g;
    const int64_t off = b - g->pl;
    int64_t i, t, tlo, thi;
    phase_columns(j, off, &tlo, &thi);
    for (i = 0; i < j->hq; ++i) {
        float *d = pl + i * j->wv;
        const int64_t ih = i * g->sh + a - g->pt;
        if (ih < 0 || ih >= g->h || tlo >= thi) {
            for (t = 0; t < j->wv; ++t)
                d[t] = 0.0f;
            continue;
        }
        for (t = 0; t < tlo; ++t)
            d[t] = 0.0f;
        if (j->isa->strided_copy != NULL && g->sw <= 2)
            j->isa->strided_copy(d + tlo, src + ih * g->w + off + tlo * g->sw,
                                 thi - tlo, g->sw);
        else if (g->sw == 1) {
            const float *s = src + ih * g->w + off;
            for (t = tlo; t < thi; ++t)
                d[t] = s[t];
        } else if (g->sw == 2)
            copy_every_other(d + tlo, src + ih * g->w + off + tlo * 2,
                             thi - tlo);
        else
            for (t = tlo; t < thi; ++t)
                d[t] = src[ih * g->w + off + t * g->sw];
        for (t = thi; t < j->wv; ++t)
            d[t] = 0.0f;
    }
    /* the slack that tiles past the last row read */
    for (t = j->hq * j->wv; t < j->ps; ++t)
        pl[t] = 0.0f;
}

/* Phase plane (a, b) of the 16 channels of one block of an NCHW16c image
 * (src: the block's first pixel) into planes (the block's first channel's
 * first plane): each pixel's line is read once and its 16 lanes go to the
 * 16 channels' rows. One channel at a time read every line 16 times over:
 * 13-15% of a 3x3/2 conv of 128 channels at 56 x 56 (one thread, Zen 3),
 * about 8% so; ResNet-50 1-5% faster in four runs of both in one process. */
__attribute__((optimize("no-tree-loop-distribute-patterns")))
static void direct_planes16(const conv_job_t *j, const float *src, int64_t a,
                            int64_t b, float *planes)
{
    const tb_conv_geom *g = &j->g;
    const int64_t off = b - g->pl;
    float *pl = planes + (a * g->sw + b) * j->ps;
    int64_t i, t, l, tlo, thi;
    phase_columns(j, off, &tlo, &thi);
    for (i = 0; i < j->hq; ++i) {
        const int64_t ih = i * g->sh + a - g->pt;
        const int real = ih >= 0 && ih < g->h && tlo < thi;
        float *d = pl + i * j->wv;
        const float *s;
        for (l = 0; l < 16; ++l) {
            for (t = 0; t < (real ? tlo : j->wv); ++t)
                d[l * j->cs + t] = 0.0f;
            for (t = real ? thi : j->wv; t < j->wv; ++t)
                d[l * j->cs + t] = 0.0f;
        }
        if (!real)
            continue;
        s = src + (ih * g->w + off + tlo * g->sw) * 16;
        if (j->isa->unblock16 != NULL)
            j->isa->unblock16(d + tlo, j->cs, s, thi - tlo, g->sw);
        else
            for (t = 0; t < thi - tlo; ++t)
                for (l = 0; l < 16; ++l)
                    d[l * j->cs + tlo + t] = s[t * g->sw * 16 + l];
    }
    /* the slack that tiles past the last row read */
    for (l = 0; l < 16; ++l)
        for (t = j->hq * j->wv; t < j->ps; ++t)
            pl[l * j->cs + t] = 0.0f;
}

/* The pre-pass's units per image for its planes: one per channel, or per
 * block of 16 channels and phase of an NCHW16c image. */
static int64_t direct_prep_units(const conv_job_t *j)
{
    return j->xb ? j->c / 16 * j->g.sh * j->g.sw : j->c;
}

/* Pre-pass unit u: one channel's phase planes, or one phase plane of a
 * block of an NCHW16c image (u < batch * direct_prep_units), else the ones
 * plane of an image. */
static void direct_prep(void *arg, int64_t u, float *scratch)
{
    const conv_job_t *j = (const conv_job_t *)arg;
    const tb_conv_geom *g = &j->g;
    int64_t t;
    (void)scratch;
    const int64_t per = direct_prep_units(j);
    if (u < j->batch * per) {
        const int64_t n = u / per, phases = g->sh * g->sw;
        const int64_t c = j->xb ? u % per / phases * 16 : u % per;
        const float *src = j->x + (n * j->c + c) * g->h * g->w;
        int64_t a, b;
        if (j->xb) {
            a = u % phases / g->sw;
            b = u % g->sw;
            if (j->phases >> (a * g->sw + b) & 1u)
                direct_planes16(j, src, a, b, j->xp + n * j->is + c * j->cs);
            return;
        }
        for (a = 0; a < g->sh; ++a)
            for (b = 0; b < g->sw; ++b)
                if (j->phases >> (a * g->sw + b) & 1u)
                    direct_plane(j, src, a, b,
                                 j->xp + n * j->is + c * j->cs +
                                     (a * g->sw + b) * j->ps);
    } else {
        float *ones = j->xp + (u - j->batch * per) * j->is + j->c * j->cs;
        for (t = 0; t < j->ps; ++t)
            ones[t] = 1.0f;
    }
}

/* The chain ops `rest` (tb_ops16_split's second part: a SiLU, say, and a
 * residual after it) over n pixels of m channels just stored at the NCHW16c
 * block of y (res: the residual's same offsets): elementwise, so each
 * block's run of n pixels is one row of the ISA's chain. */
static void out16_rest(const conv_job_t *j, float *y, const float *res, int64_t m,
                       int64_t n, int64_t rest)
{
    tb_chain ch;
    int64_t o0;
    ch.ops = rest;
    ch.scale = 1.0f;
    ch.bias = NULL;
    ch.ldr = n * 16;
    for (o0 = 0; rest != 0 && o0 < m; o0 += 16) {
        ch.residual = res != NULL ? res + o0 * j->p : NULL;
        j->isa->chain(&ch, y + o0 * j->p, n * 16, 1, n * 16, 0, 0);
    }
}

/* The NCHW16c store of the sums of tile pixels [qa, qb) (pixel-major from
 * s, ldc floats apart; m channels from the block at y, res): each pixel's
 * 16 channels of a block are one vector, stored whole, through the chain's
 * leading residual, relu and relu6, and then the rest of it. With runs the
 * tile pixels are the real ones; else only the virtual rows' real pixels. */
static void direct_out16(const conv_job_t *j, const float *s, int64_t ldc,
                         int64_t m, int64_t qa, int64_t qb, float *y,
                         const float *res, int64_t ops)
{
    const int64_t ow = j->g.ow;
    int64_t q = qa, rest;
    ops = tb_ops16_split(ops, &rest, j->isa->sigmoid16);
    while (q < qb) {
        const int64_t oh = j->runs ? 0 : q / j->wv, vw = j->runs ? q : q % j->wv;
        const int64_t end = j->runs ? qb : min_i64(qb, (oh + 1) * j->wv);
        if (j->runs || vw < ow) {
            const int64_t len = j->runs ? qb - q : min_i64(end, oh * j->wv + ow) - q;
            const int64_t px = j->runs ? q : oh * ow + vw;
            j->isa->conv_out16(s + (q - qa) * ldc, ldc, m, len, y + px * 16,
                               res != NULL ? res + px * 16 : NULL, j->p * 16, ops);
            out16_rest(j, y + px * 16, res != NULL ? res + px * 16 : NULL, m, len, rest);
        }
        q = end;
    }
}

/* Unit: image n, group gi, output channels [o0, o0 + ob) of the group
 * (o0 a multiple of 16), tile pixels [q0, q1): real pixels when j->runs,
 * else virtual ones. */
static void direct_unit(const conv_job_t *j, int64_t n, int64_t gi,
                        int64_t o0, int64_t ob, int64_t q0, int64_t q1,
                        float *scratch)
{
    const tb_isa *isa = j->isa;
    const int mr = isa->mr;
    const int64_t ldc = cdiv(ob, 16) * 16;
    const int64_t tiles = cdiv(q1 - q0, mr);
    const int64_t kblocks = tb_kblocks(j->kt, isa->kc);
    const int64_t ow = j->g.ow;
    const float *img = j->inplace ? j->x + n * j->c * j->p : j->xp + n * j->is;
    const int64_t oc0 = gi * j->ocg + o0; /* the unit's first channel of y */
    float *wbuf = scratch + tiles * mr * ldc; /* two panels of kc x 16 */
    const float **kp = (const float **)(void *)(wbuf + (size_t)TB_KC_MAX * 32);
    float *y = j->y + (n * j->oc + oc0) * j->p;
    tb_chain ch = j->chain;
    /* an NCHW16c x and y: each tile stores its sums into y itself (no
     * scratch, no conv_out16 pass; MobileNet's 1x1 conv of 32 channels at
     * 112 x 112, NCHW16c: 151 -> 133 us). Over several K blocks each block's
     * sums go into y and the next block adds to them (TB_ACCUMULATE), the
     * chain after the last (y never overlaps the residual: tirbyoc_kernels.h);
     * against sums in the scratch (rows 1 KiB apart for 256 channels) and a
     * conv_out16 pass after the unit,
     * 1x1 convs of 512 to 1024 channels at 14 x 14 and 7 x 7 ran 2-5% faster
     * at 1 thread, 0-4% at 2 (Zen 3, both forms in one process; within 2%
     * either way on a Xeon with AVX-512) */
    const int fused = j->x16 && j->yb && isa->conv_tile16y != NULL;
    /* one K block into an NCHW16c y where the ISA has conv_tiley and the
     * tiles are runs of real pixels (consecutive in y): each tile's sums are
     * final, and the tile stores them into y from its registers, not through
     * the scratch (Zen 3, AVX2, both forms interleaved in one process, bit
     * for bit the same: MobileNetV2's stem, 3x3/2 into 32 channels, 293 ->
     * 228 us at 2 threads, ResNet-50's 7x7/2 into 64 1924 -> 1623 us; plain
     * 1x1 convs from an NCHW x, 24 -> 144 channels at 56 x 56 and 32 -> 16
     * at 112 x 112, 1.02-1.17x and 1.13-1.16x; Zen 4, AVX-512, the same
     * forms: the stems 1.05-1.17x, the 1x1 convs 1.15-1.27x) */
    const int tiley = j->yb && !fused && kblocks == 1 && j->runs &&
                      isa->conv_tiley != NULL;
    /* elsewhere, a conv over phase planes with one K block and an NCHW16c
     * y: each tile's sums are stored into y from the scratch while in L1,
     * its lines fetched during the tile (after the whole unit the sums came
     * back from L2, into cold lines: MobileNet's stem, 3x3/2 into 32
     * channels, its output cold, 99 -> 83 us on AVX-512; a plain 1x1 conv of
     * 32 channels at 112 x 112 ran slower so, 151 -> 159 us, and keeps the
     * store after the unit) */
    const int tile_out16 = j->yb && !fused && !tiley && kblocks == 1 && !j->inplace;
    int64_t rest16; /* the chain after what the blocked stores apply */
    const int64_t light16 = tb_ops16_split(j->chain.ops, &rest16, j->isa->sigmoid16);
    const float *res16; /* an NCHW16c residual at the unit's first channel */
    int64_t kb, c0, t, q, b16;
    if (ch.residual != NULL)
        ch.residual += n * j->oc * j->p;
    res16 = ch.residual != NULL ? ch.residual + oc0 * j->p : NULL;
    for (kb = 0; kb < kblocks; ++kb) {
        const int64_t pc = tb_kblock_start(j->kt, kblocks, kb);
        const int64_t kc = tb_kblock_start(j->kt, kblocks, kb + 1) - pc;
        const int flags = kb > 0 ? TB_ACCUMULATE : 0;
        direct_rows(j, img, gi, pc, kc, kp);
        for (c0 = 0; c0 < ob; c0 += isa->nr) {
            const int nr = (int)min_i64(isa->nr, ob - c0);
            const float *wp = wbuf;
            int64_t wps = kc * 16;
            /* the next block of panels, as wide as this one, streams
             * into L2 during one tile of this block */
            const int pf_next = j->wpk != NULL && ob - c0 - nr >= nr;
            if (j->wpk != NULL) {
                wp = packed_panel(j, oc0 + c0) + pc * 16;
                wps = 16 * j->kt;
            } else {
                pack_weight_panels(j, oc0 + c0, nr, pc, kc, wbuf);
            }
            for (t = 0; t < tiles; ++t) {
                const int64_t qa = q0 + t * mr;
                const int m = (int)min_i64(mr, q1 - qa);
                /* a run of real pixels starts at its virtual pixel and
                 * skips the virtual row's padding where it wraps */
                const int64_t va = j->runs ? qa / ow * j->wv + qa % ow : qa;
                const int split = j->runs ? (int)min_i64(m, ow - qa % ow) : m;
                const int pf = (t == 0 && j->wpk != NULL ? TB_PREFETCH_W : 0) |
                               (t == (tiles > 1) && pf_next ? TB_PREFETCH_NEXT : 0);
                if (fused) {
                    const int last = kb == kblocks - 1;
                    float *yt = y + c0 * j->p + qa * 16;
                    const float *rt = res16 != NULL && last ? res16 + c0 * j->p + qa * 16
                                                            : NULL;
                    isa->conv_tile16y(kc, kp, va, wp, wps, yt, rt, j->p * 16, m, nr,
                                      flags | pf, last ? light16 : 0);
                    if (last)
                        out16_rest(j, yt, rt, nr, m, rest16);
                } else if (tiley) {
                    float *yt = y + c0 * j->p + qa * 16;
                    const float *rt = res16 != NULL ? res16 + c0 * j->p + qa * 16 : NULL;
                    isa->conv_tiley(kc, kp, va, wp, wps, yt, rt, j->p * 16, m, nr,
                                    flags | pf, light16, split, j->wv - ow);
                    out16_rest(j, yt, rt, nr, m, rest16);
                } else {
                    if (tile_out16 && j->runs)
                        /* the tile's output lines: fetched while it computes */
                        for (q = qa; q < qa + m; ++q)
                            for (b16 = 0; b16 < nr; b16 += 16)
                                __builtin_prefetch(y + (c0 + b16) * j->p + q * 16, 1, 3);
                    (j->x16 ? isa->conv_tile16 : isa->conv_tile)(
                        kc, kp, va, wp, wps, scratch + t * mr * ldc + c0, ldc, m, nr,
                        flags | pf, split, j->wv - ow);
                    if (tile_out16)
                        direct_out16(j, scratch + t * mr * ldc + c0, ldc, nr, qa,
                                     qa + m, y + c0 * j->p,
                                     res16 != NULL ? res16 + c0 * j->p : NULL, ch.ops);
                }
            }
        }
    }
    if (j->yb) {
        for (t = 0; !fused && !tile_out16 && !tiley && t < tiles; ++t)
            direct_out16(j, scratch + t * mr * ldc, ldc, ob, q0 + t * mr,
                         min_i64(q1, q0 + (t + 1) * mr), y, res16, ch.ops);
        return;
    }
    if (j->runs) {
        /* the sums are the real pixels [q0, q1) in order; each block of 16
         * stores one line into each of the ob channel planes, so the lines
         * CONV_OUT_AHEAD blocks on are fetched first (ob streams at once are
         * more than the hardware prefetcher follows: ResNet-18's stem, its
         * output cold in the model, spent a third of its time in these
         * stores) */
        for (q = q0; q < q1; q += 16) {
            const int64_t qa = q + 16 * CONV_OUT_AHEAD;
            if (qa < q1)
                for (c0 = 0; c0 < ob; ++c0)
                    __builtin_prefetch(y + c0 * j->p + qa, 1, 3);
            isa->conv_out(scratch + (q - q0) * ldc, ldc, ob,
                          min_i64(16, q1 - q), y + q, j->p,
                          ch.ops != 0 ? &ch : NULL, oc0, q);
        }
        return;
    }
    /* each tile's valid pixels, one output row at a time */
    for (t = 0; t < tiles; ++t) {
        const int64_t qa = q0 + t * mr, qb = min_i64(q1, qa + mr);
        q = qa;
        while (q < qb) {
            const int64_t oh = q / j->wv, vw = q % j->wv;
            const int64_t end = min_i64(qb, (oh + 1) * j->wv);
            if (vw < ow) {
                const int64_t len = min_i64(end, oh * j->wv + ow) - q;
                const int64_t px = oh * ow + vw;
                isa->conv_out(scratch + (t * mr + q - qa) * ldc, ldc, ob, len,
                              y + px, j->p, ch.ops != 0 ? &ch : NULL, oc0,
                              px);
            }
            q = end;
        }
    }
}

/* Unit u: (image, group, channel block, pixel block), on either path. */
static void conv_task(void *arg, int64_t u, float *scratch)
{
    const conv_job_t *j = (const conv_job_t *)arg;
    const int64_t pb = u % j->npb, ob = u / j->npb % j->nob;
    const int64_t gi = u / j->npb / j->nob % j->groups;
    const int64_t n = u / j->npb / j->nob / j->groups;
    if (j->direct) {
        const int64_t o0 = ob * j->obw;
        direct_unit(j, n, gi, o0, min_i64(j->obw, j->ocg - o0), pb * j->pbw,
                    min_i64(j->tp, (pb + 1) * j->pbw), scratch);
    } else {
        int64_t o0;
        const int64_t o1 = channel_block(j, gi, ob, &o0);
        conv_unit(j, n, gi * j->cg, o0, o1, pb * j->pbw,
                  min_i64(j->p, (pb + 1) * j->pbw), scratch);
    }
}

/* The direct path's work units: output channels in blocks of obw (nob of
 * them), tile pixels in blocks of pbw (npb of them), for `outer` images x
 * groups, tp tile pixels and ocg output channels each, register tiles of mr
 * pixels, and `want` threads. */
typedef struct {
    int64_t obw, nob, pbw, npb;
} direct_plan_t;

/* q with its pixel blocks of about equal width in whole tiles */
static direct_plan_t direct_plan_norm(direct_plan_t q, int64_t tp, int64_t mr)
{
    q.pbw = cdiv(cdiv(tp, q.npb), mr) * mr;
    q.npb = cdiv(tp, q.pbw);
    return q;
}

/* The cost model of a plan: the sums (per k step) that the busiest of
 * `want` threads computes, its units' rounds times a unit's sums. */
static double direct_plan_busiest(direct_plan_t q, int64_t outer, int want)
{
    const int64_t units = outer * q.nob * q.npb;
    const int64_t nt = min_i64(want, units);
    return (double)cdiv(units, nt) * (double)q.obw * (double)q.pbw;
}

static direct_plan_t direct_plan(int64_t outer, int64_t tp, int64_t ocg, int64_t mr,
                                 int want)
{
    /* a unit's sums: half the L2 (the other half holds the weight panels and
     * the image rows streaming through) */
    const int64_t sums = tb_l2_half_floats();
    direct_plan_t q, best;
    /* Output channels in blocks of at most CONV_DIRECT_OB_MAX (multiples of
     * 16); tile pixels in blocks of whole tiles, as many as the scratch
     * holds next to kc row pointers. More blocks (of pixels, else of
     * channels) until the units spread evenly over the threads. */
    q.nob = cdiv(ocg, CONV_DIRECT_OB_MAX);
    /* fewer pixels than channels: channel blocks narrow enough for all the
     * pixels' sums, so that each unit streams only its share of the weight
     * (MobileNet's 1x1 convs at 14 x 14, weights cold: 240 -> 226 us; the
     * two pixel blocks each read all of it) */
    if (tp < ocg) {
        const int64_t fit = sums / (cdiv(tp, mr) * mr) / 16 * 16;
        q.nob = max_i64(q.nob, cdiv(ocg, fit > 16 ? fit : 16));
    }
    q.obw = cdiv(cdiv(ocg, q.nob), 16) * 16;
    q.nob = cdiv(ocg, q.obw);
    q.pbw = sums / q.obw / mr * mr;
    if (q.pbw < mr)
        q.pbw = mr;
    q.pbw = min_i64(q.pbw, cdiv(tp, mr) * mr);
    q.npb = cdiv(tp, q.pbw);
    /* Every step makes the blocks of pixels or of channels strictly
     * smaller, so the loop ends within tp / mr + ocg / 16 steps. (A step
     * from nob to nob + 1 channel blocks that rounds back to the same
     * width, 256 channels from 4 to 5 blocks of 64, once left the loop
     * spinning: ResNet-18 and MobileNet never returned at 8 threads.) */
    best = direct_plan_norm(q, tp, mr);
    while (want > 1 && (outer * q.nob * q.npb) % want != 0) {
        direct_plan_t n;
        if (q.npb < cdiv(tp, mr) && (tp >= ocg || q.obw <= 16))
            ++q.npb;
        else if (q.obw > 16) {
            q.obw = min_i64(cdiv(cdiv(ocg, q.nob + 1), 16) * 16, q.obw - 16);
            q.nob = cdiv(ocg, q.obw);
        } else
            break;
        n = direct_plan_norm(q, tp, mr);
        if (direct_plan_busiest(n, outer, want) < direct_plan_busiest(best, outer, want))
            best = n;
    }
    /* units that spread evenly: as they are; else the least work on the
     * busiest thread of the plans passed (the fewest units among equals) */
    if (want <= 1 || (outer * q.nob * q.npb) % want == 0)
        return direct_plan_norm(q, tp, mr);
    return best;
}

int32_t tirbyoc_conv2d_direct_plan(int64_t outer, int64_t pixels, int64_t channels,
                                   int32_t mr, int32_t threads, int64_t *plan)
{
    direct_plan_t q;
    if (outer < 1 || pixels < 1 || channels < 1 || mr < 1 || mr > 32 || threads < 1 ||
        outer > CONV_DIM_MAX || pixels > CONV_DIM_MAX || channels > CONV_DIM_MAX ||
        (double)outer * (double)pixels * (double)channels > 0x1p62)
        return TIRBYOC_EINVAL; /* (the units, at most their product, stay in range) */
    if (plan == NULL)
        return TIRBYOC_ENULL;
    q = direct_plan(outer, pixels, channels, mr, threads);
    plan[0] = q.obw;
    plan[1] = q.nob;
    plan[2] = q.pbw;
    plan[3] = q.npb;
    return TIRBYOC_OK;
}

/* Whether the direct path is the faster one for NCHW tensors (conv_direct's
 * choice, unless TIRBYOC_CONV_DIRECT says otherwise): measured faster where
 * each tile has enough k steps to hide its transpose, and for a plain conv (a
 * dense product already) where its pixels are fewer than its output
 * channels (MobileNet's 1x1 convs at 14 x 14 and 7 x 7: up to 1.9x), or up to
 * CONV_DIRECT_PLAIN_PIXELS times as many with CONV_DIRECT_PLAIN_K k steps or
 * more (MobileNet's 256-channel conv at 28 x 28: 234 -> 218 us in sequence;
 * with 128 channels, and at 56 x 56, the gather path stays faster). */
static int direct_suits(int plain, int64_t p, int64_t ocg, int64_t kt)
{
    if (plain)
        return p <= ocg * (kt >= CONV_DIRECT_PLAIN_K ? CONV_DIRECT_PLAIN_PIXELS : 1);
    return kt >= CONV_DIRECT_K_MIN;
}

int32_t tirbyoc_conv2d_direct_suits(int64_t plain, int64_t pixels, int64_t channels,
                                    int64_t ksteps, int32_t *suits)
{
    if (pixels < 1 || channels < 1 || ksteps < 1 || pixels > CONV_DIM_MAX ||
        channels > CONV_DIM_MAX || ksteps > CONV_DIM_MAX)
        return TIRBYOC_EINVAL;
    if (suits == NULL)
        return TIRBYOC_ENULL;
    *suits = direct_suits(plain != 0, pixels, channels, ksteps);
    return TIRBYOC_OK;
}

/* Sets up and runs the direct path: 1 if it ran, 0 if it does not apply
 * (the caller then gathers), -1 if its workspace cannot be allocated. */
static int conv_direct(conv_job_t *j, int want)
{
    const tb_conv_geom *g = &j->g;
    const tb_isa *isa = j->isa;
    const int64_t batch = j->batch;
    const char *env;
    int64_t r, s, units, planes, *koff;
    if (isa->conv_tile == NULL || g->sh > CONV_DIRECT_STRIDE_MAX ||
        g->sw > CONV_DIRECT_STRIDE_MAX)
        return 0;
    /* NCHW16c tensors: only here (the caller converts where this declines);
     * an NCHW16c x read in place by a plain conv in one group, else copied
     * into the phase planes like an NCHW one */
    if (j->yb && isa->conv_out16 == NULL)
        return 0;
    /* NCHW16c tensors always take it (else they would be converted) */
    env = getenv("TIRBYOC_CONV_DIRECT");
    if (env != NULL && env[0] == '0')
        return 0;
    if (!(env != NULL && env[0] == '1') && !j->xb && !j->yb &&
        !direct_suits(j->plain, j->p, j->ocg, j->kt))
        return 0;
    j->inplace = j->plain && (!j->xb || (isa->conv_tile16 != NULL && j->groups == 1));
    j->x16 = j->xb && j->inplace;
    if (j->inplace) {
        /* a plain conv reads the image's channels as they are; only the
         * bias step needs a plane (of ones) */
        j->wv = g->ow;
        j->hq = j->p / g->ow;
        j->ps = j->cs = j->vp = j->tp = j->p;
        j->runs = 1;
        /* (an NCHW16c image's pixels are 16 floats apart: so are the ones) */
        planes = cdiv(j->p, 16) * 16 * (j->x16 ? 16 : 1);
    } else {
        j->wv = g->ow + (g->kw - 1) * g->dw / g->sw;
        j->hq = j->p / g->ow + (g->kh - 1) * g->dh / g->sh;
        /* slack: the last tile's overrun and the largest in-row tap offset */
        j->ps = cdiv(j->hq * j->wv + isa->mr + j->wv, 16) * 16;
        j->cs = g->sh * g->sw * j->ps;
        j->is = (j->c + 1) * j->cs;
        j->vp = j->p / g->ow * j->wv;
        /* Runs of mr real pixels from multiples of mr span at most two
         * output rows when a row holds mr - 1 pixels or more, or exactly
         * mr / 2: no virtual pixel is computed then. */
        j->runs = g->ow >= isa->mr - 1 || g->ow * 2 == isa->mr;
        j->tp = j->runs ? j->p : j->vp;
        if ((double)batch * (double)j->is >= (double)CONV_DIRECT_FLOATS_MAX)
            return 0;
        planes = batch * j->is; /* whole 16-float lines */
    }
    /* the planes (the phase images, or the ones plane), then the k step
     * offsets, 64-byte aligned after them */
    j->xp = tb_workspace((size_t)(planes + 2 * g->k));
    if (j->xp == NULL)
        return -1;
    koff = (int64_t *)(void *)(j->xp + planes);
    for (r = 0; j->inplace && r < j->p; ++r)
        j->xp[r * (j->x16 ? 16 : 1)] = 1.0f;
    direct_offsets(j, koff);
    /* channel k of an NCHW16c image: in its block's plane, lane k % 16 */
    for (r = 0; j->x16 && r < g->k; ++r)
        koff[r] = r / 16 * j->p * 16 + r % 16;
    j->koff = koff;
    j->phases = 0;
    for (r = 0; r < g->kh; ++r)
        for (s = 0; s < g->kw; ++s)
            j->phases |= 1u << (r * g->dh % g->sh * g->sw + s * g->dw % g->sw);

    {
        const direct_plan_t plan =
            direct_plan(batch * j->groups, j->tp, j->ocg, isa->mr, want);
        j->obw = plan.obw;
        j->nob = plan.nob;
        j->pbw = plan.pbw;
        j->npb = plan.npb;
    }
    units = batch * j->groups * j->nob * j->npb;

    if (!j->inplace)
        tb_units(direct_prep, j, batch * (direct_prep_units(j) + 1), want);
    j->units = units;
    j->direct = 1;
    tb_units(conv_task, j, units, want);
    return 1;
}

/* ---- NCHW16c ---- */

int32_t tb_layouts_check(int64_t layouts, int64_t c, int64_t oc, int64_t ops)
{
    if (layouts < 0 || layouts > (TIRBYOC_LAYOUT_X16 | TIRBYOC_LAYOUT_Y16) ||
        ((layouts & TIRBYOC_LAYOUT_X16) && c % 16 != 0) ||
        ((layouts & TIRBYOC_LAYOUT_Y16) && oc % 16 != 0))
        return TIRBYOC_EINVAL;
    /* a blocked y's chain: elementwise operations only (a per-column bias,
     * scale or division would need the NCHW column) */
    if (layouts & TIRBYOC_LAYOUT_Y16)
        for (; ops != 0; ops = (int64_t)((uint64_t)ops >> 4))
            if ((ops & 15) != TIRBYOC_EPI_RESIDUAL && !tb_op_unary((int)(ops & 15)))
                return TIRBYOC_EEPILOGUE;
    return TIRBYOC_OK;
}

void tb_relayout16(const float *src, float *dst, int64_t batch, int64_t c,
                   int64_t hw, int to_blocked)
{
    int64_t n, ch, t;
    for (n = 0; n < batch; ++n)
        for (ch = 0; ch < c; ++ch) {
            const int64_t plain = (n * c + ch) * hw;
            const int64_t blk = (n * c + ch / 16 * 16) * hw + ch % 16;
            for (t = 0; t < hw; ++t) {
                if (to_blocked)
                    dst[blk + t * 16] = src[plain + t];
                else
                    dst[plain + t] = src[blk + t * 16];
            }
        }
}

int tb_nchw_copies_open(tb_nchw_copies *t, int64_t layouts, int64_t batch,
                        int64_t c, int64_t hw, int64_t oc, int64_t p,
                        const float **x, const float **res, float **y)
{
    const size_t nx = (size_t)(batch * c * hw), ny = (size_t)(batch * oc * p);
    t->x = t->res = t->y = NULL;
    if ((layouts & TIRBYOC_LAYOUT_X16) && *x != NULL && nx > 0) {
        if ((t->x = (float *)malloc(nx * sizeof(float))) == NULL)
            return 0;
        tb_relayout16(*x, t->x, batch, c, hw, 0);
        *x = t->x;
    }
    if ((layouts & TIRBYOC_LAYOUT_Y16) && ny > 0) {
        t->y = (float *)malloc(ny * sizeof(float));
        t->res = *res != NULL ? (float *)malloc(ny * sizeof(float)) : NULL;
        if (t->y == NULL || (*res != NULL && t->res == NULL)) {
            tb_nchw_copies_close(t, TIRBYOC_ENOMEM, batch, oc, p, NULL);
            return 0;
        }
        if (*res != NULL) {
            tb_relayout16(*res, t->res, batch, oc, p, 0);
            *res = t->res;
        }
        *y = t->y;
    }
    return 1;
}

int32_t tb_nchw_copies_close(tb_nchw_copies *t, int32_t st, int64_t batch,
                             int64_t oc, int64_t p, float *y)
{
    if (st == TIRBYOC_OK && t->y != NULL)
        tb_relayout16(t->y, y, batch, oc, p, 1);
    free(t->x);
    free(t->res);
    free(t->y);
    return st;
}

/* Whether the n sizes are all in [0, CONV_DIM_MAX) and each product of the
 * four at idx[t][0..3] (a tensor's element count) fits in int64_t. */
static int sizes_ok(const int64_t *v, int n, const int idx[3][4])
{
    int i, t;
    for (i = 0; i < n; ++i)
        if (v[i] < 0 || v[i] >= CONV_DIM_MAX)
            return 0;
    for (t = 0; t < 3; ++t)
        if ((double)v[idx[t][0]] * (double)v[idx[t][1]] * (double)v[idx[t][2]] *
                (double)v[idx[t][3]] >= 9.0e18)
            return 0;
    return 1;
}

int32_t tb_conv_check_args(int64_t stride_h, int64_t stride_w, int64_t pad_top,
                           int64_t pad_left, int64_t dilation_h, int64_t dilation_w,
                           int64_t epilogue, int64_t *ops, int *uses_residual)
{
    int uses_bias, i;
    if (stride_h < 1 || stride_w < 1 || dilation_h < 1 || dilation_w < 1 ||
        stride_h >= CONV_DIM_MAX || stride_w >= CONV_DIM_MAX ||
        dilation_h >= CONV_DIM_MAX || dilation_w >= CONV_DIM_MAX ||
        pad_top <= -CONV_DIM_MAX || pad_top >= CONV_DIM_MAX ||
        pad_left <= -CONV_DIM_MAX || pad_left >= CONV_DIM_MAX)
        return TIRBYOC_EINVAL;
    *ops = epilogue;
    if (tb_chain_length(epilogue, &uses_bias, uses_residual) < 0)
        return TIRBYOC_EEPILOGUE;
    /* the bias is a K step of the product: it can only come first */
    if (uses_bias) {
        if ((epilogue & 15) != TIRBYOC_EPI_BIAS)
            return TIRBYOC_EEPILOGUE;
        *ops = (int64_t)((uint64_t)epilogue >> 4);
        if (tb_chain_length(*ops, &uses_bias, uses_residual) < 0 || uses_bias)
            return TIRBYOC_EEPILOGUE;
    }
    /* SCALE and DIVIDE would need a factor: fold it into the weight */
    for (i = 0; i < 16; ++i) {
        const int op = (int)(((uint64_t)*ops >> (4 * i)) & 15u);
        if (op == TIRBYOC_EPI_SCALE || op == TIRBYOC_EPI_DIVIDE)
            return TIRBYOC_EEPILOGUE;
    }
    return TIRBYOC_OK;
}

/* ---- small images: one product with the pixels as rows ----
 *
 * A plain conv (1x1, stride 1, no padding) in one group is the product
 * Y^T = X^T W^T. With the pixels as its rows, the pre-packed weight's
 * 16-channel panels are the product's W operand as they are, and each
 * register tile covers 6 pixels by 16 channels, while the NCHW paths run 16
 * pixels along the vectors: where the pixels leave a good part of their
 * 16-pixel panels empty (7 x 7: 49 pixels in 4 panels, 77% full), those
 * paths ran 1.2-1.35x slower than the product (docs/performance.md). There,
 * the image (and the residual) are copied with the pixels as rows, all
 * images one above the other, the product runs, and its rows are copied
 * into y. Not where x and y are both NCHW16c: the direct path's tiles then
 * read x in place and store into y as they finish, and the copies cost more
 * than the fuller tiles gain (ResNet-50's 512 -> 2048 channels at 7 x 7 with
 * its shortcut ran 1.1-1.3x slower through them). Nor where
 * TIRBYOC_CONV_DIRECT chooses the path (the tests' way to cover each). */

/* More than 1 / CONV_DENSE_WASTE of the 16-pixel panels empty. */
#define CONV_DENSE_WASTE 8

static int conv_dense_suits(const conv_job_t *j)
{
    const int64_t empty = cdiv(j->p, TB_NR) * TB_NR - j->p;
    return j->plain && j->groups == 1 && j->wpk != NULL && !(j->xb && j->yb) &&
           empty * CONV_DENSE_WASTE > j->p && getenv("TIRBYOC_CONV_DIRECT") == NULL;
}

typedef struct {
    const conv_job_t *j;
    float *a;  /* [batch * p, kt]: the images, pixels as rows, and the ones */
    float *r;  /* [batch * p, oc]: the residual, or NULL */
    float *cm; /* [batch * p, oc]: the product */
    int out;   /* 0: the images (and the residual) into a (r); 1: cm into y */
} dense_rows_t;

/* Pixels [p0, p1) of an image of ch channels and p pixels, NCHW (blocked:
 * NCHW16c) at img, to or from rows of m (row stride ldm, one row per pixel,
 * one column per channel). */
static void rows_copy(float *img, int blocked, int64_t ch, int64_t p, int64_t p0,
                      int64_t p1, float *m, int64_t ldm, int to_rows)
{
    int64_t q, c, c0, c1, i;
    if (blocked) { /* 16 floats at a time (a loop, not memcpy calls) */
        for (q = p0; q < p1; ++q)
            for (c = 0; c < ch; c += 16) {
                float *v = img + (c / 16 * p + q) * 16, *row = m + (q - p0) * ldm + c;
                float *restrict dst = to_rows ? row : v;
                const float *restrict src = to_rows ? v : row;
                for (i = 0; i < 16; ++i)
                    dst[i] = src[i];
            }
        return;
    }
    /* 4 channels by 4 pixels at a time through registers (the image's
     * lines of 4 channels and the rows of m stay in L1), the edges one by
     * one */
    for (c0 = 0; c0 < ch; c0 += 4) {
        c1 = min_i64(ch, c0 + 4);
        for (q = p0; q < p1; q += 4) {
            const int64_t q1 = min_i64(p1, q + 4);
            float *row = m + (q - p0) * ldm + c0, *v = img + c0 * p + q;
#if defined(__SSE2__)
            if (c1 - c0 == 4 && q1 - q == 4) {
                /* 4 lines of the source, transposed, 4 lines of the target */
                const float *src = to_rows ? v : row;
                float *dst = to_rows ? row : v;
                const int64_t ss = to_rows ? p : ldm, ds = to_rows ? ldm : p;
                __m128 r0 = _mm_loadu_ps(src), r1 = _mm_loadu_ps(src + ss);
                __m128 r2 = _mm_loadu_ps(src + 2 * ss), r3 = _mm_loadu_ps(src + 3 * ss);
                _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
                _mm_storeu_ps(dst, r0);
                _mm_storeu_ps(dst + ds, r1);
                _mm_storeu_ps(dst + 2 * ds, r2);
                _mm_storeu_ps(dst + 3 * ds, r3);
                continue;
            }
#endif
            for (c = 0; c < c1 - c0; ++c)
                for (i = 0; i < q1 - q; ++i) {
                    if (to_rows)
                        row[i * ldm + c] = v[c * p + i];
                    else
                        v[c * p + i] = row[i * ldm + c];
                }
        }
    }
}

static void dense_rows_task(void *arg, int tid, int nt)
{
    const dense_rows_t *d = (const dense_rows_t *)arg;
    const conv_job_t *j = d->j;
    const int64_t rows = j->batch * j->p, units = cdiv(rows, 16);
    const int64_t lo = min_i64(rows, units * tid / nt * 16);
    const int64_t hi = min_i64(rows, units * (tid + 1) / nt * 16);
    int64_t n, q;
    for (n = lo / j->p; n < j->batch && n * j->p < hi; ++n) {
        const int64_t p0 = max_i64(lo - n * j->p, 0), p1 = min_i64(hi - n * j->p, j->p);
        const int64_t row0 = n * j->p + p0;
        if (d->out) {
            rows_copy(j->y + n * j->oc * j->p, j->yb, j->oc, j->p, p0, p1,
                      d->cm + row0 * j->oc, j->oc, 0);
            continue;
        }
        rows_copy((float *)(j->x + n * j->c * j->p), j->xb, j->c, j->p, p0, p1,
                  d->a + row0 * j->kt, j->kt, 1);
        if (j->kt > j->g.k) /* the bias step */
            for (q = 0; q < p1 - p0; ++q)
                d->a[(row0 + q) * j->kt + j->g.k] = 1.0f;
        if (d->r != NULL)
            rows_copy((float *)(j->chain.residual + n * j->oc * j->p), j->yb, j->oc,
                      j->p, p0, p1, d->r + row0 * j->oc, j->oc, 1);
    }
}

/* The call as one product (conv_dense_suits); 0 without the memory for its
 * copies (the caller takes another path). The bias stays a k step (a column
 * of ones in the rows), so that each output is summed as on the other paths:
 * the same K blocks, the same order, the same bits. */
static int conv_as_dense(const conv_job_t *j, int want)
{
    const int64_t rows = j->batch * j->p;
    const size_t fa = (size_t)(rows * j->kt);
    const size_t fr = j->chain.residual != NULL ? (size_t)(rows * j->oc) : 0;
    float *ws = tb_workspace(fa + fr + (size_t)(rows * j->oc));
    dense_rows_t d;
    tb_chain ch = j->chain;
    const int copiers = (int)min_i64(want, cdiv(rows, 16));
    if (ws == NULL)
        return 0;
    d.j = j;
    d.a = ws;
    d.r = fr != 0 ? ws + fa : NULL;
    d.cm = ws + fa + fr;
    d.out = 0;
    if (d.r != NULL) {
        ch.residual = d.r;
        ch.ldr = j->oc;
    }
    tb_parallel(dense_rows_task, &d, copiers);
    tb_dense_packed(rows, j->oc, j->kt, d.a, j->kt, j->wpk, j->kt * 16, d.cm, j->oc, &ch);
    d.out = 1;
    tb_parallel(dense_rows_task, &d, copiers);
    return 1;
}

/* Both entry points: the weight as given, or pre-packed (packed not NULL;
 * its bias step then holds the bias, and bias is not read). */
static int32_t conv2d(int64_t batch, int64_t c, int64_t h, int64_t w,
                      const float *x, int64_t oc, int64_t groups, int64_t kh,
                      int64_t kw, const float *weight, const float *packed,
                      int64_t stride_h, int64_t stride_w, int64_t pad_top,
                      int64_t pad_left, int64_t dilation_h, int64_t dilation_w,
                      int64_t oh, int64_t ow, int64_t epilogue,
                      const float *bias, const float *residual, float *y,
                      int64_t layouts)
{
    conv_job_t j;
    const int64_t sizes[] = {batch, c, h, w, oc, kh, kw, oh, ow};
    /* x, y and the weight: [batch, c, h, w], [batch, oc, oh, ow], [oc, c, kh, kw] */
    static const int tensors[3][4] = {{0, 1, 2, 3}, {0, 4, 7, 8}, {4, 1, 5, 6}};
    int uses_residual, want;
    const int has_bias = (epilogue & 15) == TIRBYOC_EPI_BIAS;
    int64_t ops;
    int32_t st;
    double flops;

    if (!sizes_ok(sizes, 9, tensors))
        return TIRBYOC_ESIZE;
    if (groups < 1 || c % groups != 0 || oc % groups != 0)
        return TIRBYOC_EINVAL;
    st = tb_conv_check_args(stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w,
                            epilogue, &ops, &uses_residual);
    if (st != TIRBYOC_OK)
        return st;
    st = tb_layouts_check(layouts, c, oc, ops);
    if (st != TIRBYOC_OK)
        return st;
    if (batch == 0 || oc == 0 || oh == 0 || ow == 0)
        return TIRBYOC_OK;
    if (y == NULL || (x == NULL && c * h * w > 0) ||
        (weight == NULL && packed == NULL && c / groups * kh * kw > 0) ||
        (packed == NULL && bias == NULL && has_bias) ||
        (residual == NULL && uses_residual))
        return TIRBYOC_ENULL;
    if (tb_scratch() == NULL)
        return TIRBYOC_ENOMEM;

    j.isa = tb_active_isa();
    j.batch = batch;
    j.c = c;
    j.oc = oc;
    j.groups = groups;
    j.cg = c / groups;
    j.ocg = oc / groups;
    j.g.h = h;
    j.g.w = w;
    j.g.kh = kh;
    j.g.kw = kw;
    j.g.sh = stride_h;
    j.g.sw = stride_w;
    j.g.pt = pad_top;
    j.g.pl = pad_left;
    j.g.dh = dilation_h;
    j.g.dw = dilation_w;
    j.g.ow = ow;
    j.g.k = j.cg * kh * kw;
    j.x = x;
    j.wt = packed == NULL ? weight : NULL;
    j.wpk = packed;
    j.bias = has_bias && packed == NULL ? bias : NULL;
    j.y = y;
    j.kt = j.g.k + has_bias;
    j.p = oh * ow;
    j.plain = kh == 1 && kw == 1 && stride_h == 1 && stride_w == 1 &&
              pad_top == 0 && pad_left == 0 && oh == h && ow == w;
    j.chain.ops = ops;
    j.chain.scale = 1.0f;
    j.chain.bias = NULL;
    j.chain.residual = uses_residual ? residual : NULL;
    j.chain.ldr = j.p;
    j.direct = 0;
    j.apk = NULL;
    j.xb = (layouts & TIRBYOC_LAYOUT_X16) != 0;
    j.x16 = 0;
    j.yb = (layouts & TIRBYOC_LAYOUT_Y16) != 0;

    if (j.kt == 0) {
        /* an empty sum: the chain on zeros */
        int64_t i;
        for (i = 0; i < batch * oc * j.p; ++i)
            y[i] = 0.0f;
        if (ops != 0) {
            int64_t n;
            for (n = 0; n < batch; ++n) {
                tb_chain ch = j.chain;
                if (ch.residual != NULL)
                    ch.residual += n * oc * j.p;
                j.isa->chain(&ch, y + n * oc * j.p, j.p, oc, j.p, 0, 0);
            }
        }
        return TIRBYOC_OK;
    }

    flops = 2.0 * (double)batch * (double)oc * (double)j.p * (double)j.kt;
    want = tb_threads_for(flops, CONV_PAR_FLOPS, INT64_MAX);
    if (conv_dense_suits(&j) && conv_as_dense(&j, want))
        return TIRBYOC_OK;
    {
        const int direct = conv_direct(&j, want);
        if (direct < 0)
            return TIRBYOC_ENOMEM;
        if (direct > 0)
            return TIRBYOC_OK;
    }
    if (layouts != 0) {
        /* NCHW16c where the direct path declined: through NCHW copies */
        tb_nchw_copies cp;
        const float *rin = j.chain.residual;
        float *yt = y;
        if (!tb_nchw_copies_open(&cp, layouts, batch, c, h * w, oc, j.p, &x, &rin, &yt))
            return TIRBYOC_ENOMEM;
        st = conv2d(batch, c, h, w, x, oc, groups, kh, kw, weight, packed,
                    stride_h, stride_w, pad_top, pad_left, dilation_h,
                    dilation_w, oh, ow, epilogue, bias, rin, yt, 0);
        return tb_nchw_copies_close(&cp, st, batch, oc, j.p, y);
    }

    /* Pixel blocks of about equal width in whole panels, at most nc wide.
     * When their count does not spread evenly over the threads, split
     * further: the channels when there are few blocks and more channels than
     * pixels (each unit then gathers the same pixels again), else the pixels
     * (each unit then packs the same weight rows again). */
    j.npb = cdiv(j.p, j.isa->nc);
    j.nob = 1;
    if (want > 1 && (batch * groups * j.npb) % want != 0) {
        if (batch * groups * j.npb >= (int64_t)want * CONV_UNITS_PER_THREAD ||
            j.ocg < j.p)
            /* narrower blocks, until the units are a multiple of the threads
             * (7 blocks of a 56 x 56 image on 2 threads took 4 block times;
             * 8 narrower ones take 4 narrower ones) */
            while ((batch * groups * j.npb) % want != 0 &&
                   j.npb < cdiv(j.p, TB_NR))
                ++j.npb;
        else
            j.nob = min_i64(j.ocg, want);
    }
    j.pbw = cdiv(cdiv(j.p, j.npb), TB_NR) * TB_NR;
    j.npb = cdiv(j.p, j.pbw);
    j.units = batch * groups * j.nob * j.npb;
    /* a pre-packed weight whose rows more units than threads would each
     * pack again: packed once, over the threads */
    if (j.wpk != NULL && j.units > groups * j.nob * want) {
        j.apk = tb_workspace((size_t)(oc * j.kt));
        if (j.apk == NULL)
            return TIRBYOC_ENOMEM;
        tb_units(prepack_rows, &j, groups * j.nob * row_groups_max(&j), want);
    }
    tb_units(conv_task, &j, j.units, want);
    return TIRBYOC_OK;
}

int32_t tirbyoc_conv2d_f32(int64_t batch, int64_t c, int64_t h, int64_t w,
                           const float *x, int64_t oc, int64_t groups,
                           int64_t kh, int64_t kw,
                           const float *weight, int64_t stride_h,
                           int64_t stride_w, int64_t pad_top, int64_t pad_left,
                           int64_t dilation_h, int64_t dilation_w, int64_t oh,
                           int64_t ow, int64_t epilogue, const float *bias,
                           const float *residual, float *y)
{
    return conv2d(batch, c, h, w, x, oc, groups, kh, kw, weight, NULL,
                  stride_h, stride_w, pad_top, pad_left, dilation_h,
                  dilation_w, oh, ow, epilogue, bias, residual, y, 0);
}

int32_t tirbyoc_conv2d_f32_packed(int64_t batch, int64_t c, int64_t h,
                                  int64_t w, const float *x, int64_t oc,
                                  int64_t groups, int64_t kh, int64_t kw,
                                  const float *packed, int64_t stride_h,
                                  int64_t stride_w, int64_t pad_top,
                                  int64_t pad_left, int64_t dilation_h,
                                  int64_t dilation_w, int64_t oh, int64_t ow,
                                  int64_t epilogue, const float *residual,
                                  float *y)
{
    return tirbyoc_conv2d_f32_packed_layouts(
        0, batch, c, h, w, x, oc, groups, kh, kw, packed, stride_h, stride_w,
        pad_top, pad_left, dilation_h, dilation_w, oh, ow, epilogue, residual,
        y);
}

int32_t tirbyoc_conv2d_f32_packed_layouts(
    int64_t layouts, int64_t batch, int64_t c, int64_t h, int64_t w,
    const float *x, int64_t oc, int64_t groups, int64_t kh, int64_t kw,
    const float *packed, int64_t stride_h, int64_t stride_w, int64_t pad_top,
    int64_t pad_left, int64_t dilation_h, int64_t dilation_w, int64_t oh,
    int64_t ow, int64_t epilogue, const float *residual, float *y)
{
    if (packed == NULL && batch > 0 && oc > 0 && oh > 0 && ow > 0 &&
        (c / (groups > 0 ? groups : 1) * kh * kw > 0 ||
         (epilogue & 15) == TIRBYOC_EPI_BIAS))
        return TIRBYOC_ENULL;
    return conv2d(batch, c, h, w, x, oc, groups, kh, kw, NULL, packed,
                  stride_h, stride_w, pad_top, pad_left, dilation_h,
                  dilation_w, oh, ow, epilogue, NULL, residual, y, layouts);
}

/* ---- pre-packed weights (layout in tirbyoc_kernels.h) ---- */

int64_t tirbyoc_conv2d_packed_size_f32(int64_t oc, int64_t groups, int64_t k,
                                       int32_t with_bias)
{
    int64_t kt, panels;
    if (oc < 0 || k < 0 || groups < 1 || oc % groups != 0 ||
        k >= CONV_DIM_MAX * CONV_DIM_MAX)
        return -1;
    kt = k + (with_bias != 0);
    panels = groups * cdiv(oc / groups, 16);
    if (oc == 0 || kt == 0)
        return 0;
    if (panels > INT64_MAX / 16 / kt)
        return -1;
    return panels * 16 * kt;
}

int32_t tirbyoc_pack_conv2d_weight_f32(int64_t oc, int64_t groups, int64_t k,
                                       const float *weight, const float *bias,
                                       float *packed)
{
    const int64_t size =
        tirbyoc_conv2d_packed_size_f32(oc, groups, k, bias != NULL);
    const int64_t kt = k + (bias != NULL), ocg = oc / (groups > 0 ? groups : 1);
    const int64_t nq = cdiv(ocg, 16);
    int64_t gi, q, r;
    if (size < 0)
        return groups < 1 || (oc >= 0 && oc % groups != 0) ? TIRBYOC_EINVAL
                                                          : TIRBYOC_ESIZE;
    if (size == 0)
        return TIRBYOC_OK;
    if (packed == NULL || (weight == NULL && k > 0))
        return TIRBYOC_ENULL;
    for (gi = 0; gi < groups; ++gi) {
        float *dst = packed + gi * nq * 16 * kt;
        /* Packing only moves floats, so every ISA produces the same bytes. */
        if (k > 0)
            tb_active_isa()->pack_w(TB_W_NT, k, ocg, weight + gi * ocg * k, k,
                                    dst, 16 * kt);
        if (bias != NULL)
            for (q = 0; q < nq; ++q)
                for (r = 0; r < 16; ++r)
                    dst[q * 16 * kt + k * 16 + r] =
                        q * 16 + r < ocg ? bias[gi * ocg + q * 16 + r] : 0.0f;
    }
    return TIRBYOC_OK;
}
