/*
 * depthwise_c16.h - the channels-in-lanes path of the depthwise kernel
 * (depthwise_f32.c), written once for every instruction set that has it.
 *
 * A unit is 16 channels (the last block partial) of a block of output rows.
 * The input rows are transposed, 16 pixels at a time, into a window of
 * pixels of 16 channels (a zero pixel in the padding): element [u][v] (16
 * floats) = x[c0 + l][i0 * sh - pt + u][v - pl]. Output pixel (i, j)'s tap
 * (r, s) is then one vector of 16 channels at [(i - i0) * sh + r * dh]
 * [j * sw + s * dw], whatever the strides, and the sums of up to V16_PMAX
 * pixels at a time are as many FMA chains over the taps, with the 16
 * channels' weights of a tap in one vector. The sums go to a staging area,
 * pixel by pixel, which is transposed back 16 pixels at a time into the
 * channels' rows, with the in-register operations, as they are stored.
 * An NCHW16c x needs no window: its rows are read in place, a row of zeros
 * stands for the rows above and below the image, and the pixels whose taps
 * reach into the side padding are summed one at a time, with a zero vector
 * for each such tap (as the window's zero pixels). A blocked y takes the
 * sums directly. Each output goes through the same operations as on the
 * plane path (product of tap 0, FMAs in (r, s) order, + bias, ...): the
 * same bits.
 *
 * Included inside an instruction set's target region of depthwise_f32.c,
 * which defines first:
 *   C16(name)            the ISA's name for each function defined here;
 *   V16                  a vector of 16 floats (one register, or a pair);
 *   V16_PMAX             pixels summed at a time (8 or 4: the accumulators
 *                        fit the register file);
 *   V16_ZERO(), V16_LOAD(p) (p 64-byte aligned), V16_LOADU(p),
 *   V16_LOADN(p, n)      (the first n floats, zeros after; 0 < n <= 16),
 *   V16_STORE(p, v) (aligned), V16_STOREU(p, v), V16_STOREN(p, v, n),
 *   V16_ADD, V16_MUL, V16_FMA(a, b, c) = a * b + c, V16_MAX0, V16_MIN6
 *                        (max(0, v) and min(6, v), NaN passing both),
 *   V16_TRANSPOSE(r)     r[i][j] -> r[j][i] for V16 r[16],
 *   V16_PRE(s, v, off, n) the plane path's in-register operations of span
 *                        s on 16 outputs from off (n of them real);
 * and undefines them all at its end, for the next instruction set.
 */

/* The window of a unit: rin rows from image row ihs, channels c0.. (nc of
 * them) of image plane img (NULL when the image is empty). */
static void C16(c16_fill)(const dw_job *j, const float *img, int64_t nc,
                          int64_t ihs, int64_t rin, float *win, float *tmp)
{
    const int64_t h = j->h, w = j->w, vw = j->vw, pl = j->pl, hw = h * w;
    const int64_t ha = img == NULL ? ihs : max_i64(ihs, 0);
    const int64_t hb = img == NULL ? ihs : max_i64(ha, min_i64(ihs + rin, h));
    const int64_t zl = min_i64(vw, max_i64(0, pl));      /* zero columns */
    const int64_t zr = max_i64(zl, min_i64(vw, w + pl)); /* from here on */
    const V16 zero = V16_ZERO();
    int64_t u, v, p0, ih, iw;
    for (u = 0; u < rin; ++u) {
        float *row = win + u * vw * 16;
        if (ihs + u < ha || ihs + u >= hb) {
            for (v = 0; v < vw; ++v)
                V16_STORE(row + v * 16, zero);
        } else {
            for (v = 0; v < zl; ++v)
                V16_STORE(row + v * 16, zero);
            for (v = zr; v < vw; ++v)
                V16_STORE(row + v * 16, zero);
        }
    }
    /* the image's rows [ha, hb): contiguous pixels of each channel */
    ih = ha;
    iw = 0;
    for (p0 = ha * w; p0 < hb * w; p0 += 16) {
        const int64_t cnt = min_i64(16, hb * w - p0);
        V16 r[16];
        int l, k;
#pragma GCC unroll 16
        for (l = 0; l < 16; ++l)
            r[l] = l < nc ? (cnt == 16 ? V16_LOADU(img + l * hw + p0)
                                       : V16_LOADN(img + l * hw + p0, cnt))
                          : zero;
        /* 16 streams, one per channel: ahead of the hardware's prefetch */
        if (p0 + DW_C16_AHEAD < hb * w)
#pragma GCC unroll 16
            for (l = 0; l < 16; ++l)
                if (l < nc)
                    _mm_prefetch((const char *)(img + l * hw + p0 + DW_C16_AHEAD),
                                 _MM_HINT_T0);
        V16_TRANSPOSE(r);
        if (cnt == 16 && iw + 16 <= w && iw + pl >= 0 && iw + pl + 16 <= vw) {
            /* 16 pixels of one row, all inside the window */
            float *d = win + ((ih - ihs) * vw + iw + pl) * 16;
#pragma GCC unroll 16
            for (k = 0; k < 16; ++k)
                V16_STORE(d + k * 16, r[k]);
            iw += 16;
            if (iw == w) {
                iw = 0;
                ++ih;
            }
            continue;
        }
        /* across rows or the window's edge: through tmp, a run of pixels
         * per image row, the part inside the window's columns */
#pragma GCC unroll 16
        for (k = 0; k < 16; ++k)
            V16_STORE(tmp + k * 16, r[k]);
        for (k = 0; k < cnt;) {
            const int64_t run = min_i64(cnt - k, w - iw);
            const int64_t lo = max_i64(0, -(iw + pl)), hi = min_i64(run, vw - (iw + pl));
            float *d = win + ((ih - ihs) * vw + iw + pl) * 16;
            int64_t t;
            for (t = lo; t < hi; ++t)
                V16_STORE(d + t * 16, V16_LOAD(tmp + (k + t) * 16));
            k += (int)run;
            iw += run;
            if (iw == w) {
                iw = 0;
                ++ih;
            }
        }
    }
}

/* The bias and the relus before any residual (the lanes are the channels;
 * a blocked y: the residual too) on P pixels' sums, one operation at a time
 * over the P vectors, stored at tb (res: the residual at the same pixels). */
DW_INLINE void C16(c16_finish)(const int P, const dw_job *j, V16 *acc, V16 bias,
                               float *tb, const float *res)
{
    int64_t r;
    int p;
    if (j->has_bias)
#pragma GCC unroll 8
        for (p = 0; p < P; ++p)
            acc[p] = V16_ADD(acc[p], bias);
    for (r = 0; r < j->c16_npre; ++r) {
        const int relu6 = j->pre[r] != TIRBYOC_EPI_RELU;
        if (j->pre[r] == TIRBYOC_EPI_RESIDUAL) {
#pragma GCC unroll 8
            for (p = 0; p < P; ++p)
                acc[p] = V16_ADD(acc[p], V16_LOADU(res + p * 16));
            continue;
        }
#pragma GCC unroll 8
        for (p = 0; p < P; ++p) {
            acc[p] = V16_MAX0(acc[p]);
            if (relu6)
                acc[p] = V16_MIN6(acc[p]);
        }
    }
#pragma GCC unroll 8
    for (p = 0; p < P; ++p)
        V16_STOREU(tb + p * 16, acc[p]);
}

/* Sums of P output pixels from (li, jx) of the unit into the staging area
 * tb (16 floats per pixel, pixel li * OW + jx + p; a blocked y itself, res
 * its residual at the same offsets); K: a K x K filter known here (0:
 * j->kh x j->kw), with its weights in wk, else in wts. Tap row r of the
 * pixels is rp[r], window column v of it at rp[r] + (v - off) * 16: the
 * window's row (off 0), or an NCHW16c image's row or a row of zeros (off
 * j->pl). EDGE (P 1): columns v - off outside [0, w) read as zeros. */
DW_INLINE void C16(c16_px)(const int P, const int K, const int EDGE,
                           const dw_job *j, const float *const *rp, int64_t off,
                           const float *wts, const V16 *wk, V16 bias, int64_t li,
                           int64_t jx, float *tb, const float *res)
{
    const int64_t kh = K ? K : j->kh, kw = K ? K : j->kw;
    const int64_t sw16 = j->sw * 16;
    V16 acc[V16_PMAX];
    int64_t r, e;
    int p;
    for (p = 0; p < P; ++p) /* (tap 0 sets them: ntaps >= 1 here) */
        acc[p] = V16_ZERO();
#pragma GCC unroll 7
    for (r = 0; r < kh; ++r) {
        const float *rowp = rp[r] + (jx * j->sw - off) * 16;
#pragma GCC unroll 7
        for (e = 0; e < kw; ++e) {
            const float *b = rowp + e * j->dw * 16;
            const int64_t col = jx * j->sw + e * j->dw - off;
            const V16 wv = K ? wk[r * K + e] : V16_LOAD(wts + (r * kw + e) * 16);
#pragma GCC unroll 8
            for (p = 0; p < P; ++p) {
                const V16 xv = EDGE && (col < 0 || col >= j->w) ? V16_ZERO()
                                                                 : V16_LOADU(b + p * sw16);
                acc[p] = r == 0 && e == 0 ? V16_MUL(xv, wv) : V16_FMA(xv, wv, acc[p]);
            }
        }
    }
    C16(c16_finish)(P, j, acc, bias, tb + (li * j->ow + jx) * 16,
                    res != NULL ? res + (li * j->ow + jx) * 16 : NULL);
}

/* Sums of P output pixels of the unit from its window win, pixels q.. in
 * row-major order, whatever rows they lie on, into tb (and res) at pixel q:
 * each pixel's taps at one offset each from its own corner of the window,
 * with no table of row pointers, and a 7 x 7 image's rows of 7 in groups of
 * V16_PMAX across rows rather than 4 + 2 + 1 per row. The same operations
 * per pixel as c16_px. (AVX2, 5 x 5 taps with SiLU: 1.21-1.37x, also at 28 x
 * 28, whose rows are whole groups.) */
DW_INLINE void C16(c16_flat)(const int P, const int K, const dw_job *j,
                             const float *win, const float *wts, const V16 *wk,
                             V16 bias, int64_t q, float *tb, const float *res)
{
    const int64_t kh = K ? K : j->kh, kw = K ? K : j->kw, rs = j->vw * 16;
    const float *bp[V16_PMAX];
    V16 acc[V16_PMAX];
    int64_t r, e;
    int p;
    for (p = 0; p < P; ++p) {
        const int64_t li = (q + p) / j->ow, jx = (q + p) % j->ow;
        bp[p] = win + li * j->sh * rs + jx * j->sw * 16;
        acc[p] = V16_ZERO();
    }
#pragma GCC unroll 7
    for (r = 0; r < kh; ++r) {
#pragma GCC unroll 7
        for (e = 0; e < kw; ++e) {
            const int64_t o = r * j->dh * rs + e * j->dw * 16;
            const V16 wv = K ? wk[r * K + e] : V16_LOAD(wts + (r * kw + e) * 16);
#pragma GCC unroll 8
            for (p = 0; p < P; ++p) {
                const V16 xv = V16_LOADU(bp[p] + o);
                acc[p] = r == 0 && e == 0 ? V16_MUL(xv, wv) : V16_FMA(xv, wv, acc[p]);
            }
        }
    }
    C16(c16_finish)(P, j, acc, bias, tb + q * 16, res != NULL ? res + q * 16 : NULL);
}

/* The unit's sums: from the window win (img NULL), in groups of pixels
 * across its rows (c16_flat), or row by row, read in place from the rows of
 * NCHW16c image plane img (the unit's first input row ih0, zero rows at win,
 * the edge columns one pixel at a time). rpk: room for kh row pointers (K
 * 0). */
DW_INLINE void C16(c16_sums)(const int K, const dw_job *j, const float *win,
                             const float *img, int64_t ih0, const float **rpk,
                             const float *wts, int64_t rows, float *tb,
                             const float *res)
{
    const int64_t kh = K ? K : j->kh, kw = K ? K : j->kw, ow = j->ow;
    const float *rpc[K ? K : 1];
    const float **rp = K ? rpc : rpk;
    const int64_t off = img != NULL ? j->pl : 0;
    const V16 bias = V16_LOAD(wts + j->ntaps * 16);
    V16 wk[K ? K * K : 1];
    /* the pixels whose taps all lie in the image's columns: [lo, hi) */
    int64_t lo = 0, hi = ow, li, jx, r;
    int t;
    for (t = 0; t < K * K; ++t)
        wk[t] = V16_LOAD(wts + t * 16);
    if (img == NULL) {
        /* the window: every pixel's taps lie in it; groups across rows */
        const int64_t npx = rows * ow;
        int64_t q = 0;
        for (; q + V16_PMAX <= npx; q += V16_PMAX)
            C16(c16_flat)(V16_PMAX, K, j, win, wts, wk, bias, q, tb, res);
        if (V16_PMAX > 4 && q + 4 <= npx) {
            C16(c16_flat)(4, K, j, win, wts, wk, bias, q, tb, res);
            q += 4;
        }
        if (q + 2 <= npx) {
            C16(c16_flat)(2, K, j, win, wts, wk, bias, q, tb, res);
            q += 2;
        }
        if (q < npx)
            C16(c16_flat)(1, K, j, win, wts, wk, bias, q, tb, res);
        return;
    }
    {
        const int64_t last = j->w - 1 + j->pl - (kw - 1) * j->dw;
        lo = j->pl > 0 ? min_i64(ow, cdiv(j->pl, j->sw)) : 0;
        hi = max_i64(lo, last < 0 ? 0 : min_i64(ow, last / j->sw + 1));
    }
    for (li = 0; li < rows; ++li) {
        for (r = 0; r < kh; ++r) {
            const int64_t u = li * j->sh + r * j->dh, ih = ih0 + u;
            rp[r] = ih >= 0 && ih < j->h ? img + ih * j->w * 16 : win;
        }
        for (jx = 0; jx < lo; ++jx)
            C16(c16_px)(1, K, 1, j, rp, off, wts, wk, bias, li, jx, tb, res);
        for (; jx + V16_PMAX <= hi; jx += V16_PMAX)
            C16(c16_px)(V16_PMAX, K, 0, j, rp, off, wts, wk, bias, li, jx, tb, res);
        if (V16_PMAX > 4 && jx + 4 <= hi) {
            C16(c16_px)(4, K, 0, j, rp, off, wts, wk, bias, li, jx, tb, res);
            jx += 4;
        }
        if (jx + 2 <= hi) {
            C16(c16_px)(2, K, 0, j, rp, off, wts, wk, bias, li, jx, tb, res);
            jx += 2;
        }
        if (jx < hi) {
            C16(c16_px)(1, K, 0, j, rp, off, wts, wk, bias, li, jx, tb, res);
            ++jx;
        }
        for (; jx < ow; ++jx)
            C16(c16_px)(1, K, 1, j, rp, off, wts, wk, bias, li, jx, tb, res);
    }
}

/* Unit: image n, channels [c0, c0 + 16) (those below C), output rows
 * [i0, i1). */
static void C16(c16_unit)(const dw_job *j, int64_t n, int64_t c0, int64_t i0,
                          int64_t i1, float *scratch)
{
    const int64_t nc = min_i64(16, j->c - c0), rows = i1 - i0, p = j->oh * j->ow;
    const int64_t rin = (rows - 1) * j->sh + (j->kh - 1) * j->dh + 1;
    const int64_t hw = j->h * j->w, npx = rows * j->ow;
    const int64_t at = (n * j->c + c0) * p + i0 * j->ow * 16; /* a blocked y's */
    float *win = scratch, *wts = scratch + j->c16_wts, *tb = scratch + j->c16_tb;
    float *out = j->yb ? j->y + at : tb;
    const float *res = j->yb && j->uses_residual ? j->residual + at : NULL;
    int64_t t, q0;
    int l;
    dw_span s;
    for (t = 0; t < j->ntaps; ++t)
        for (l = 0; l < 16; ++l)
            wts[t * 16 + l] = l < nc ? j->wt[(c0 + l) * j->ntaps + t] : 0.0f;
    for (l = 0; l < 16; ++l) /* then the biases */
        wts[j->ntaps * 16 + l] = l < nc && j->has_bias ? j->bias[c0 + l] : 0.0f;
    const float **rp = (const float **)(void *)(scratch + j->c16_rp);
    const float *img = hw > 0 ? j->x + (n * j->c + c0) * hw : NULL;
    const int64_t ih0 = i0 * j->sh - j->pt;
    if (j->xb && img != NULL) {
        /* NCHW16c: read in place, through a row of zeros where the taps
         * leave the image's rows */
        if (ih0 < 0 || ih0 + rin > j->h)
            for (t = 0; t < j->vw - min_i64(j->pl, 0); ++t)
                V16_STORE(win + t * 16, V16_ZERO());
    } else {
        C16(c16_fill)(j, img, nc, ih0, rin, win, tb);
        img = NULL;
    }
    if (j->kh == 3 && j->kw == 3)
        C16(c16_sums)(3, j, win, img, ih0, rp, wts, rows, out, res);
    else if (j->kh == 5 && j->kw == 5)
        C16(c16_sums)(5, j, win, img, ih0, rp, wts, rows, out, res);
    else
        C16(c16_sums)(0, j, win, img, ih0, rp, wts, rows, out, res);
    if (j->yb) {
        /* the chain's operations after the in-register ones (a SiLU, say):
         * elementwise, over the block's rows just stored */
        chain_flat(j, at, npx * 16);
        return;
    }
    /* the operations from the first residual on, per channel */
    memset(&s, 0, sizeof(s));
    s.npre = j->npre - j->c16_npre;
    s.pre = j->pre + j->c16_npre;
    for (q0 = 0; q0 < npx; q0 += 16) {
        const int64_t cnt = min_i64(16, npx - q0);
        V16 r[16];
        int k;
#pragma GCC unroll 16
        for (k = 0; k < 16; ++k)
            r[k] = V16_LOAD(tb + (q0 + k) * 16);
        V16_TRANSPOSE(r);
        if (s.npre == 0) {
            /* nothing after the transpose: the stores alone */
            float *yb = j->y + (n * j->c + c0) * p + i0 * j->ow + q0;
#pragma GCC unroll 16
            for (l = 0; l < 16; ++l)
                if (l < nc) {
                    if (cnt == 16)
                        V16_STOREU(yb + l * p, r[l]);
                    else
                        V16_STOREN(yb + l * p, r[l], cnt);
                }
            continue;
        }
#pragma GCC unroll 16
        for (l = 0; l < 16; ++l)
            if (l < nc) {
                const int64_t plane = (n * j->c + c0 + l) * p + i0 * j->ow;
                s.res = j->uses_residual ? j->residual + plane : NULL;
                if (cnt == 16)
                    V16_STOREU(j->y + plane + q0, V16_PRE(&s, r[l], q0, 16));
                else
                    V16_STOREN(j->y + plane + q0, V16_PRE(&s, r[l], q0, cnt), cnt);
            }
    }
    if (rows == j->oh) /* whole planes: the block's channels are one run */
        chain_flat(j, (n * j->c + c0) * p, nc * p);
    else
        for (l = 0; l < nc; ++l)
            chain_rest(j, (n * j->c + c0 + l) * p, i0, rows);
}

#undef C16
#undef V16
#undef V16_PMAX
#undef V16_ZERO
#undef V16_LOAD
#undef V16_LOADU
#undef V16_LOADN
#undef V16_STORE
#undef V16_STOREU
#undef V16_STOREN
#undef V16_ADD
#undef V16_MUL
#undef V16_FMA
#undef V16_MAX0
#undef V16_MIN6
#undef V16_TRANSPOSE
#undef V16_PRE
