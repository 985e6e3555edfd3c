/*
 * conv_winograd_f32.c - a 3x3 convolution of stride 1 (dilation 1, one
 * group), float32, NCHW, as Winograd F(4x4, 3x3): each 4 x 4 block of
 * output pixels (a tile) from its 6 x 6 input window in 36 products per
 * channel pair instead of 144. Per tile t and 6 x 6 element e:
 *
 *     V[e][c][t]  = (B^T d_c,t B)[e]               input transform
 *     M[e][t][o]  = sum_c V[e][c][t] * U[e][o][c]  36 matrix products
 *     Y[o][t]     = A^T M[.][t][o] A  (+ bias[o]), then the chain
 *
 * with U[e] = (G g_o,c G^T)[e] the weight's transform, computed once in
 * float64 when it is packed (tirbyoc_pack_conv2d_winograd_weight_f32). The
 * products run on the dense micro-kernels: tiles are their rows, output
 * channels their columns, U[e] their pre-packed 16-channel W panels; where
 * the instruction set has conv_tile the rows are read straight from V,
 * elsewhere each block of rows is first packed. The transforms are the
 * instruction set's own (conv_winograd.h), the output goes into NCHW
 * through conv_out with the chain, as on the direct path.
 *
 * Work units are (image, run of tiles): a unit transforms its tiles' input
 * for every channel, then per block of output channels runs the 36 products
 * and the output transform, all in its thread's scratch. Each output is
 * computed the same way whichever thread takes it, so results do not
 * depend on the thread count.
 *
 * Accuracy: the algorithm's own rounding is larger than a direct sum's: in
 * random tests about 1e-6 of max|y| for 64 channels (a direct sum: about
 * 1e-7), growing slowly with the channels. tirbyoc_conv2d_winograd_suits
 * says where it is taken; TIRBYOC_CONV_WINOGRAD=0 never takes it.
 */
#define _POSIX_C_SOURCE 200112L /* posix_memalign under -std=c99 */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dense_f32_internal.h"

#define WG_E 36
/* Below this many flops (of the direct sum) a call stays on one thread. */
#define WG_PAR_FLOPS (1.0 * 1024 * 1024)
/* Output channels per block at most. */
#define WG_OCB_MAX 64
/* Tiles (over the batch) below which the direct path is faster: the 36
 * transformed weights are 4x the weight, for less work. (ResNet's 14 x 14
 * conv of 128 channels, 16 tiles: 0.166 ms in the model against the direct
 * path's 0.132, though 1.24x faster when each call evicts the other's data.)
 * From WG_TILES_FEW tiles in each image where the instruction set's
 * wg_few_tiles_c says so (see tirbyoc_conv2d_winograd_suits): on AVX2 from
 * 128 channels (Zen 3, chains of five convs in one process,
 * 2 threads: at 14 x 14, 16 tiles, 128, 256 and 512 channels ran 1.17x,
 * 1.50x and 1.60x the direct path's speed, at 1 thread 1.15-1.73x; 32 and 64
 * channels 0.65x and 0.88x, the transforms then weigh more than the
 * products saved; at 10 x 10 and 8 x 8, 9 and 4 tiles, 256 channels,
 * 0.75-0.88x at 2 threads: the weight, streamed for few tiles, costs more
 * than the products saved); on AVX-512 from 256 (Zen 4, whose AVX-512 FMAs run on
 * 256-bit units, one call at a time, 2 threads: at 14 x 14, 128, 256 and
 * 512 channels 1.72x, 1.87x and 1.81x, at 1 thread 1.59-1.95x; ResNet-50
 * 1.04x and 1.07x in two runs of both builds in one process; 128 channels
 * stay on the direct path for the Intel Xeon measurement above, where two
 * 512-bit FMA units give the direct path twice Zen 4's rate; 256 there is
 * not measured). */
#define WG_TILES_MIN 32
#define WG_TILES_FEW 16
/* A unit's buffer at most (floats): many channels need more than the
 * thread's scratch for TB_MR_MAX tiles (256 channels: 1.4 MiB); up to this
 * much is taken from the thread's block buffer instead. */
#define WG_FLOATS_MAX (4 * (int64_t)TB_SCRATCH_FLOATS)
/* Input channels below this: too few k steps per product. */
#define WG_C_MIN 16

/* The weight's transform: U = G g G^T. */
static const double wg_g[6][3] = {
    {1.0, 0.0, 0.0},
    {-1.0 / 3, -1.0 / 3, -1.0 / 3},
    {1.0 / 3, -1.0 / 3, 1.0 / 3},
    {1.0 / 15, 2.0 / 15, 4.0 / 15},
    {-16.0 / 15, 8.0 / 15, -4.0 / 15},
    {0.0, 0.0, 1.0},
};

typedef struct {
    const tb_isa *isa;
    tb_wino_geom g;
    int64_t oc, ocp;  /* output channels, and rounded up to 16 */
    int64_t oh, ow, p;
    int64_t tiles;    /* per image */
    int64_t nb, upi;  /* blocks of mr tiles per image, runs of them per image */
    int64_t nos;      /* shares of the output channels (units per run) */
    int few;          /* few tiles: runs of about equal tiles, not blocks */
    int64_t ocb;      /* output channels per block, a multiple of 16 */
    int64_t floats;   /* a unit's buffer (unit_floats) */
    int *failed;      /* set when a unit's buffer cannot be allocated */
    const float *x, *u, *bias; /* bias NULL: not added */
    float *y;
    tb_chain chain;   /* without the bias; residual of image 0, ldr = p */
} wg_job;

static int64_t min_i64(int64_t x, int64_t y) { return x < y ? x : y; }
static int64_t cdiv(int64_t x, int64_t y) { return (x + y - 1) / y; }

/* Floats of a unit's scratch besides its tiles' buffers. */
static int64_t fixed_floats(int64_t c)
{
    /* the transform's rows, a block of packed rows, c row pointers (two
     * floats each), the V rows' rounding to 16 floats, 64-byte alignment */
    return TB_WINO_TMP + (int64_t)TB_KC_MAX * TB_MR_MAX + 2 * c +
           WG_E * c * 16 + 64;
}

/* Floats of a unit's buffer for c input channels: the thread's scratch
 * where TB_MR_MAX tiles fit it with 16 output channels per block, else
 * room for TB_MR_MAX tiles with WG_OCB_MAX (taken from tb_ablock). */
static int64_t unit_floats(int64_t c)
{
    const int64_t fixed = fixed_floats(c);
    if (fixed + TB_MR_MAX * (WG_E * c + (WG_E + 16) * 16) <= (int64_t)TB_SCRATCH_FLOATS)
        return (int64_t)TB_SCRATCH_FLOATS;
    return fixed + TB_MR_MAX * (WG_E * c + (WG_E + 16) * WG_OCB_MAX);
}

/* Tiles a unit's buffer holds with ocb output channels per block. */
static int64_t tiles_fitting(int64_t c, int64_t ocb)
{
    const int64_t avail = unit_floats(c) - fixed_floats(c);
    /* V: 36 c per tile; M: 36 ocb; the output tiles: 16 ocb */
    return avail <= 0 ? 0 : avail / (WG_E * c + (WG_E + 16) * ocb);
}

/* Output channels per block for c input and ocp output channels (a multiple
 * of 16): the largest up to WG_OCB_MAX with room for TB_MR_MAX tiles, 0 if
 * none has or the buffer would exceed WG_FLOATS_MAX. */
static int64_t block_channels(int64_t c, int64_t ocp)
{
    int64_t ocb;
    if (unit_floats(c) > WG_FLOATS_MAX)
        return 0;
    for (ocb = min_i64(ocp, WG_OCB_MAX); ocb >= 16; ocb -= 16)
        if (tiles_fitting(c, ocb) >= TB_MR_MAX)
            return ocb;
    return 0;
}

/* y's pixels of the output tiles s (see tb_wino_out_fn) of the unit's tiles
 * [t0, t0 + nt) of image n, output channels [o0, o0 + ocn). */
static void store_tiles(const wg_job *j, int64_t n, int64_t t0, int64_t nt,
                        int64_t o0, int64_t ocn, int64_t ldm, const float *s)
{
    const tb_isa *isa = j->isa;
    const int64_t tw = j->g.tw, t1 = t0 + nt;
    float *y = j->y + (n * j->oc + o0) * j->p;
    tb_chain ch = j->chain;
    const tb_chain *chp = ch.ops != 0 ? &ch : NULL;
    int64_t ty;
    if (ch.residual != NULL)
        ch.residual += n * j->oc * j->p;
    for (ty = t0 / tw; ty * tw < t1; ++ty) {
        const int64_t xa = ty * tw < t0 ? t0 - ty * tw : 0;
        const int64_t xb = min_i64(tw, t1 - ty * tw);
        const int64_t px0 = 4 * xa, cnt = min_i64(4 * xb, j->ow) - px0;
        int i;
        for (i = 0; i < 4 && 4 * ty + i < j->oh; ++i) {
            const float *row = s + ((i * nt + ty * tw + xa - t0) * 4) * ldm;
            const int64_t pix = (4 * ty + i) * j->ow + px0;
            int64_t q, o, t;
            for (q = 0; q < cnt; q += 16) {
                const int64_t len = min_i64(16, cnt - q);
                if (isa->conv_out != NULL) {
                    isa->conv_out(row + q * ldm, ldm, ocn, len, y + pix + q,
                                  j->p, chp, o0, pix + q);
                    continue;
                }
                for (o = 0; o < ocn; ++o)
                    for (t = 0; t < len; ++t)
                        y[o * j->p + pix + q + t] = row[(q + t) * ldm + o];
                if (chp != NULL)
                    isa->chain(chp, y + pix + q, j->p, ocn, len, o0, pix + q);
            }
        }
    }
}

/* Unit u: image u / nos / upi, its run k = u / nos % upi of tiles (blocks
 * of mr tiles [nb k / upi, nb (k + 1) / upi), or with few tiles tiles
 * [tiles k / upi, tiles (k + 1) / upi)), share u % nos of the output
 * channels (whole 16-channel panels). */
static void wg_unit(void *arg, int64_t u, float *scratch)
{
    const wg_job *j = (const wg_job *)arg;
    const tb_isa *isa = j->isa;
    const int64_t mr = isa->mr, c = j->g.c;
    const int64_t n = u / j->nos / j->upi, k = u / j->nos % j->upi;
    const int64_t panels = j->ocp / 16, sh = u % j->nos;
    const int64_t s0 = panels * sh / j->nos * 16;
    const int64_t s1 = panels * (sh + 1) / j->nos * 16;
    const int64_t t0 = j->few ? j->tiles * k / j->upi : j->nb * k / j->upi * mr;
    const int64_t nt = (j->few ? j->tiles * (k + 1) / j->upi
                               : min_i64(j->tiles, j->nb * (k + 1) / j->upi * mr)) -
                       t0;
    const int64_t ldv = cdiv(nt, 16) * 16, nblk = cdiv(nt, mr);
    const int64_t kblocks = tb_kblocks(c, isa->kc);
    float *v = j->floats > (int64_t)TB_SCRATCH_FLOATS ? tb_ablock((size_t)j->floats)
                                                       : scratch;
    float *m, *s, *tmp, *ap;
    const float **kp;
    int64_t o0, e, b, kb, q, p, i;

    if (v == NULL) {
        __atomic_store_n(j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    m = v + WG_E * c * ldv;
    s = m + WG_E * nt * j->ocb;
    tmp = s + 16 * nt * j->ocb;
    ap = tmp + TB_WINO_TMP;
    kp = (const float **)(void *)(ap + TB_KC_MAX * TB_MR_MAX);

    isa->wino_in(&j->g, j->x + n * c * j->g.h * j->g.w, t0, nt, v, ldv, tmp);
    for (o0 = s0; o0 < s1; o0 += j->ocb) {
        const int64_t ob = min_i64(j->ocb, s1 - o0);
        for (e = 0; e < WG_E; ++e) {
            const float *ve = v + e * c * ldv;
            const float *ue = j->u + (e * j->ocp + o0) * c;
            float *me = m + e * nt * ob;
            if (isa->conv_tile != NULL)
                for (p = 0; p < c; ++p)
                    kp[p] = ve + p * ldv;
            /* blocks of about equal rows (16 tiles: 8 + 8, not 14 + 2) */
            for (b = 0; b < nblk; ++b) {
                const int64_t r0 = nt * b / nblk;
                const int rows = (int)(nt * (b + 1) / nblk - r0);
                for (kb = 0; kb < kblocks; ++kb) {
                    const int64_t pc = tb_kblock_start(c, kblocks, kb);
                    const int64_t kc = tb_kblock_start(c, kblocks, kb + 1) - pc;
                    const int flags = kb > 0 ? TB_ACCUMULATE : 0;
                    if (isa->conv_tile == NULL)
                        for (p = 0; p < kc; ++p)
                            for (i = 0; i < rows; ++i)
                                ap[p * rows + i] = ve[(pc + p) * ldv + r0 + i];
                    for (q = 0; q < ob; q += isa->nr) {
                        const int nr = (int)min_i64(isa->nr, ob - q);
                        const float *wp = ue + q * c + pc * 16;
                        float *cp = me + r0 * ob + q;
                        if (isa->conv_tile != NULL)
                            isa->conv_tile(kc, kp + pc, r0, wp, 16 * c, cp, ob, rows,
                                           nr, flags, 0, 0);
                        else
                            isa->ukernel(kc, ap, wp, 16 * c, cp, ob, rows, nr,
                                         flags, NULL, 0, 0);
                    }
                }
            }
        }
        isa->wino_out(m, nt, ob, j->bias != NULL ? j->bias + o0 : NULL, s);
        store_tiles(j, n, t0, nt, o0, min_i64(j->oc - o0, ob), ob, s);
    }
}

int32_t tirbyoc_conv2d_winograd_suits(int64_t batch, int64_t c, int64_t oc,
                                      int64_t groups, int64_t kh, int64_t kw,
                                      int64_t stride_h, int64_t stride_w,
                                      int64_t dilation_h, int64_t dilation_w,
                                      int64_t oh, int64_t ow)
{
    const char *env = getenv("TIRBYOC_CONV_WINOGRAD");
    int64_t per_image, few_c;
    if (env != NULL && env[0] == '0')
        return 0;
    if (groups != 1 || kh != 3 || kw != 3 || stride_h != 1 || stride_w != 1 ||
        dilation_h != 1 || dilation_w != 1 || c < 1 || oc < 1 || oh < 1 ||
        ow < 1 || c >= ((int64_t)1 << 24) || oc >= ((int64_t)1 << 24) ||
        oh >= ((int64_t)1 << 24) || ow >= ((int64_t)1 << 24) ||
        block_channels(c, cdiv(oc, 16) * 16) == 0)
        return 0;
    if (env != NULL && env[0] == '1')
        return 1;
    if (c < WG_C_MIN || oc < 16)
        return 0;
    per_image = cdiv(oh, 4) * cdiv(ow, 4);
    few_c = tb_active_isa()->wg_few_tiles_c;
    /* From few_c channels, WG_TILES_FEW tiles in each image: a unit holds the
     * tiles of one image, and streams the whole transformed weight (at 7 x 7,
     * 4 tiles an image, batch 4, 512 channels: 0.77x ONNX Runtime against the
     * direct path's 0.85x; at 14 x 14, batch 2 and 4, 256 channels: 1.27-1.29x
     * against 0.83x). Units wider than the thread's scratch only so: they
     * were measured on AVX2 and AVX-512 (Zen 4) only, where few_c is set. */
    if (few_c > 0 && c >= few_c && per_image >= WG_TILES_FEW)
        return 1;
    return unit_floats(c) <= (int64_t)TB_SCRATCH_FLOATS &&
           per_image * (batch > 1 ? batch : 1) >= WG_TILES_MIN;
}

int64_t tirbyoc_conv2d_winograd_packed_size_f32(int64_t oc, int64_t c)
{
    if (oc < 0 || c < 0 || oc >= ((int64_t)1 << 24) || c >= ((int64_t)1 << 24))
        return -1;
    return (WG_E * c + 1) * cdiv(oc, 16) * 16;
}

int32_t tirbyoc_pack_conv2d_winograd_weight_f32(int64_t oc, int64_t c,
                                                const float *weight,
                                                const float *bias,
                                                float *packed)
{
    const int64_t size = tirbyoc_conv2d_winograd_packed_size_f32(oc, c);
    const int64_t ocp = cdiv(oc, 16) * 16;
    float *ue;
    int64_t o, ci, e;
    if (size < 0)
        return TIRBYOC_ESIZE;
    if (size == 0)
        return TIRBYOC_OK;
    if (packed == NULL || (weight == NULL && oc * c > 0))
        return TIRBYOC_ENULL;
    ue = (float *)malloc((size_t)(oc * c > 0 ? oc * c : 1) * sizeof(float));
    if (ue == NULL)
        return TIRBYOC_ENOMEM;
    for (e = 0; e < WG_E; ++e) {
        const double *ga = wg_g[e / 6], *gb = wg_g[e % 6];
        for (o = 0; o < oc; ++o)
            for (ci = 0; ci < c; ++ci) {
                const float *g = weight + (o * c + ci) * 9;
                double sum = 0.0;
                int r, t;
                /* the nonzero terms only: an infinite tap reaches
                 * only the elements its rows and columns of G touch */
                for (r = 0; r < 3; ++r)
                    for (t = 0; t < 3; ++t)
                        if (ga[r] != 0.0 && gb[t] != 0.0)
                            sum += ga[r] * (double)g[r * 3 + t] * gb[t];
                ue[o * c + ci] = (float)sum;
            }
        /* [OC, C] into 16-channel panels of C k steps (only moves floats:
         * every instruction set produces the same bytes) */
        if (c > 0)
            tb_active_isa()->pack_w(TB_W_NT, c, oc, ue, c,
                                    packed + e * ocp * c, 16 * c);
    }
    free(ue);
    for (o = 0; o < ocp; ++o)
        packed[WG_E * ocp * c + o] = bias != NULL && o < oc ? bias[o] : 0.0f;
    return TIRBYOC_OK;
}

/* The checks of a call (has_weight: whether its weight pointer is given),
 * sizes the unit buffers cannot hold included; *work 0 where there is
 * nothing to compute. */
static int32_t wg_check(int64_t batch, int64_t c, int64_t h, int64_t w,
                        const float *x, int64_t oc, int has_weight,
                        int64_t pad_top, int64_t pad_left, int64_t oh, int64_t ow,
                        int64_t epilogue, const float *residual, const float *y,
                        int64_t *ops, int *uses_residual, int *work)
{
    const int64_t dims[] = {batch, c, h, w, oc, oh, ow};
    int32_t st;
    int i;

    *work = 0;
    for (i = 0; i < 7; ++i)
        if (dims[i] < 0 || dims[i] >= ((int64_t)1 << 24))
            return TIRBYOC_ESIZE;
    if ((double)batch * (double)(c > oc ? c : oc) *
            (double)(h * w > oh * ow ? h * w : oh * ow) >= 9.0e18)
        return TIRBYOC_ESIZE;
    st = tb_conv_check_args(1, 1, pad_top, pad_left, 1, 1, epilogue, ops,
                            uses_residual);
    if (st != TIRBYOC_OK)
        return st;
    if (batch == 0 || oc == 0 || oh == 0 || ow == 0)
        return TIRBYOC_OK;
    if (y == NULL || !has_weight || (x == NULL && c * h * w > 0) ||
        (residual == NULL && *uses_residual))
        return TIRBYOC_ENULL;
    if (c == 0 || block_channels(c, cdiv(oc, 16) * 16) == 0)
        return TIRBYOC_EINVAL; /* not a size tirbyoc_conv2d_winograd_suits takes */
    *work = 1;
    return TIRBYOC_OK;
}

/* The call, its arguments checked by wg_check (ops and uses_residual its
 * findings) and its transformed weight at packed. */
static int32_t wg_run(int64_t batch, int64_t c, int64_t h, int64_t w,
                      const float *x, int64_t oc, const float *packed,
                      int64_t pad_top, int64_t pad_left, int64_t oh, int64_t ow,
                      int64_t epilogue, int64_t ops, int uses_residual,
                      const float *residual, float *y)
{
    wg_job j;
    int64_t units;
    int want;
    int failed = 0;

    j.ocp = cdiv(oc, 16) * 16;
    j.ocb = block_channels(c, j.ocp);
    j.floats = unit_floats(c);
    j.failed = &failed;
    if (tb_scratch() == NULL)
        return TIRBYOC_ENOMEM;

    j.isa = tb_active_isa();
    j.g.c = c;
    j.g.h = h;
    j.g.w = w;
    j.g.pt = pad_top;
    j.g.pl = pad_left;
    j.g.tw = cdiv(ow, 4);
    j.oc = oc;
    j.oh = oh;
    j.ow = ow;
    j.p = oh * ow;
    j.tiles = cdiv(oh, 4) * j.g.tw;
    j.x = x;
    j.u = packed;
    j.bias = (epilogue & 15) == TIRBYOC_EPI_BIAS ? packed + WG_E * j.ocp * c : NULL;
    j.y = y;
    j.chain.ops = ops;
    j.chain.scale = 1.0f;
    j.chain.bias = NULL;
    j.chain.residual = uses_residual ? residual : NULL;
    j.chain.ldr = j.p;

    /* Runs of whole blocks of mr tiles, as many as the scratch holds; then,
     * with fewer than two blocks per thread, shares of the output channels (each
     * transforms the same input, and streams its own part of the
     * transformed weight), else more runs, until the units spread evenly
     * over the threads. */
    want = tb_threads_for(2.0 * 9.0 * (double)batch * (double)c * (double)oc * (double)j.p,
                          WG_PAR_FLOPS, INT64_MAX);
    j.nb = cdiv(j.tiles, j.isa->mr);
    j.few = batch * j.nb < 2 * want;
    j.upi = j.few ? cdiv(j.tiles, tiles_fitting(c, j.ocb))
                  : cdiv(j.nb, tiles_fitting(c, j.ocb) / j.isa->mr);
    j.nos = 1;
    while (j.few && (batch * j.upi * j.nos) % want != 0 && j.nos < j.ocp / 16)
        ++j.nos;
    while (want > 1 && (batch * j.upi * j.nos) % want != 0 &&
           j.upi < (j.few ? j.tiles : j.nb))
        ++j.upi;
    units = batch * j.upi * j.nos;
    tb_units(wg_unit, &j, units, want);
    return __atomic_load_n(&failed, __ATOMIC_RELAXED) ? TIRBYOC_ENOMEM : TIRBYOC_OK;
}

int32_t tirbyoc_conv2d_winograd_f32(int64_t batch, int64_t c, int64_t h,
                                    int64_t w, const float *x, int64_t oc,
                                    const float *packed, int64_t pad_top,
                                    int64_t pad_left, int64_t oh, int64_t ow,
                                    int64_t epilogue, const float *residual,
                                    float *y)
{
    int64_t ops;
    int uses_residual, work;
    const int32_t st = wg_check(batch, c, h, w, x, oc, packed != NULL, pad_top,
                                pad_left, oh, ow, epilogue, residual, y, &ops,
                                &uses_residual, &work);
    if (st != TIRBYOC_OK || !work)
        return st;
    return wg_run(batch, c, h, w, x, oc, packed, pad_top, pad_left, oh, ow, epilogue,
                  ops, uses_residual, residual, y);
}

/* ---- tirbyoc_conv2d_winograd_cached_f32: the weight transformed once ----
 *
 * A model's library holds the weight as the model does ([OC, C, 3, 3], 9
 * floats a channel pair); its transform (36 floats a pair, 4x the bytes)
 * is made by the first call and kept here, so that a library is not 4x
 * its weights. An entry is found by the caller's key (a digest of the
 * weight and bias made when the model was compiled) and the two pointers:
 * another weight has another key, and the same weight loaded again at
 * another address gets an entry of its own. The weight must not change
 * between calls with the same key and pointers (a model's constant does
 * not). The entries in use may hold up to wg_cap() bytes; past that the
 * least recently used go (freed when no call runs on them, made again if
 * needed). */
typedef struct wg_entry {
    struct wg_entry *next; /* in its bucket */
    int64_t key0, key1, oc, c;
    const float *weight, *bias;
    float *packed;
    size_t bytes;
    uint64_t used; /* wg_clock at its last lookup */
    int64_t refs;  /* calls running on it */
    int retired;   /* out of the table: freed when refs drops to 0 */
} wg_entry;

#define WG_BUCKETS 256
/* Default bytes of transformed weights kept: ResNet-50's are 60 MB. */
#define WG_CAP_MB_DEFAULT 512

static pthread_mutex_t wg_lock = PTHREAD_MUTEX_INITIALIZER;
static wg_entry *wg_table[WG_BUCKETS];
static size_t wg_held;
static uint64_t wg_clock;
static int64_t wg_entries, wg_made, wg_dropped;
static pthread_once_t wg_cap_once = PTHREAD_ONCE_INIT;
static size_t wg_cap_bytes;

static void read_wg_cap(void)
{
    const char *env = getenv("TIRBYOC_WINOGRAD_CACHE_MB");
    char *end = NULL;
    long long mb = env != NULL ? strtoll(env, &end, 10) : -1;
    if (env == NULL || end == env || *end != '\0' || mb < 0 || mb > ((long long)1 << 30))
        mb = WG_CAP_MB_DEFAULT;
    wg_cap_bytes = (size_t)mb << 20;
}

static size_t wg_cap(void)
{
    pthread_once(&wg_cap_once, read_wg_cap);
    return wg_cap_bytes;
}

/* A fork while another thread holds wg_lock would leave it held in the
 * child: the lock is taken around fork and released on both sides. */
static pthread_once_t wg_fork_once = PTHREAD_ONCE_INIT;
static void wg_lock_all(void) { pthread_mutex_lock(&wg_lock); }
static void wg_unlock_all(void) { pthread_mutex_unlock(&wg_lock); }
static void wg_register_fork(void) { pthread_atfork(wg_lock_all, wg_unlock_all, wg_unlock_all); }

static unsigned wg_bucket(int64_t key0, int64_t key1, const float *weight)
{
    uint64_t h = (uint64_t)key0 ^ ((uint64_t)key1 * 0x9e3779b97f4a7c15ull) ^
                 (uint64_t)(uintptr_t)weight;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    return (unsigned)(h >> 56) % WG_BUCKETS;
}

/* The entry of (key, oc, c, weight, bias) in bucket b, or NULL; under the lock. */
static wg_entry *wg_find(unsigned b, int64_t key0, int64_t key1, int64_t oc,
                         int64_t c, const float *weight, const float *bias)
{
    wg_entry *e;
    for (e = wg_table[b]; e != NULL; e = e->next)
        if (e->key0 == key0 && e->key1 == key1 && e->oc == oc && e->c == c &&
            e->weight == weight && e->bias == bias)
            return e;
    return NULL;
}

static void wg_free(wg_entry *e)
{
    free(e->packed);
    free(e);
}

/* Drops the least recently used entries other than keep while the table
 * holds more than the cap; under the lock. */
static void wg_evict(const wg_entry *keep)
{
    while (wg_held > wg_cap()) {
        wg_entry **oldest = NULL, **p;
        unsigned b;
        for (b = 0; b < WG_BUCKETS; ++b)
            for (p = &wg_table[b]; *p != NULL; p = &(*p)->next)
                if (*p != keep && (oldest == NULL || (*p)->used < (*oldest)->used))
                    oldest = p;
        if (oldest == NULL)
            return;
        {
            wg_entry *e = *oldest;
            *oldest = e->next;
            wg_held -= e->bytes;
            --wg_entries;
            ++wg_dropped;
            if (e->refs == 0)
                wg_free(e);
            else
                e->retired = 1;
        }
    }
}

/* The transformed weight for a call (its entry in *entry, to release),
 * made here if the table has none. */
static int32_t wg_acquire(int64_t key0, int64_t key1, int64_t oc, int64_t c,
                          const float *weight, const float *bias, wg_entry **entry)
{
    const unsigned b = wg_bucket(key0, key1, weight);
    const int64_t size = tirbyoc_conv2d_winograd_packed_size_f32(oc, c);
    wg_entry *e, *made;
    void *p = NULL;
    int32_t st;

    pthread_once(&wg_fork_once, wg_register_fork);
    pthread_mutex_lock(&wg_lock);
    e = wg_find(b, key0, key1, oc, c, weight, bias);
    if (e != NULL) {
        ++e->refs;
        e->used = ++wg_clock;
        pthread_mutex_unlock(&wg_lock);
        *entry = e;
        return TIRBYOC_OK;
    }
    pthread_mutex_unlock(&wg_lock);

    /* Made outside the lock (the first calls of other layers go on); a
     * call that made the same entry meanwhile wins, this copy is dropped. */
    if (size < 0)
        return TIRBYOC_ESIZE;
    made = (wg_entry *)calloc(1, sizeof(wg_entry));
    if (made == NULL || posix_memalign(&p, 64, (size_t)(size > 0 ? size : 1) *
                                                     sizeof(float)) != 0) {
        free(made);
        return TIRBYOC_ENOMEM;
    }
    made->packed = (float *)p;
    st = tirbyoc_pack_conv2d_winograd_weight_f32(oc, c, weight, bias, made->packed);
    if (st != TIRBYOC_OK) {
        wg_free(made);
        return st;
    }
    made->key0 = key0;
    made->key1 = key1;
    made->oc = oc;
    made->c = c;
    made->weight = weight;
    made->bias = bias;
    made->bytes = (size_t)size * sizeof(float);

    pthread_mutex_lock(&wg_lock);
    e = wg_find(b, key0, key1, oc, c, weight, bias);
    if (e == NULL) {
        e = made;
        made = NULL;
        e->next = wg_table[b];
        wg_table[b] = e;
        wg_held += e->bytes;
        ++wg_entries;
        ++wg_made;
        wg_evict(e);
    }
    ++e->refs;
    e->used = ++wg_clock;
    pthread_mutex_unlock(&wg_lock);
    if (made != NULL)
        wg_free(made);
    *entry = e;
    return TIRBYOC_OK;
}

static void wg_release(wg_entry *e)
{
    int drop;
    pthread_mutex_lock(&wg_lock);
    drop = --e->refs == 0 && e->retired;
    pthread_mutex_unlock(&wg_lock);
    if (drop)
        wg_free(e);
}

int32_t tirbyoc_conv2d_winograd_cached_f32(int64_t key0, int64_t key1,
                                           int64_t batch, int64_t c, int64_t h,
                                           int64_t w, const float *x, int64_t oc,
                                           const float *weight, const float *bias,
                                           int64_t pad_top, int64_t pad_left,
                                           int64_t oh, int64_t ow, int64_t epilogue,
                                           const float *residual, float *y)
{
    wg_entry *e;
    int64_t ops;
    int uses_residual, work;
    /* the call's own checks first: a bad call makes no entry */
    int32_t st = wg_check(batch, c, h, w, x, oc, weight != NULL || oc * c == 0,
                          pad_top, pad_left, oh, ow, epilogue, residual, y, &ops,
                          &uses_residual, &work);
    if (st != TIRBYOC_OK || !work)
        return st;
    st = wg_acquire(key0, key1, oc, c, weight, bias, &e);
    if (st != TIRBYOC_OK)
        return st;
    st = wg_run(batch, c, h, w, x, oc, e->packed, pad_top, pad_left, oh, ow, epilogue,
                ops, uses_residual, residual, y);
    wg_release(e);
    return st;
}

int32_t tirbyoc_winograd_cache_stats(int64_t *stats)
{
    if (stats == NULL)
        return TIRBYOC_ENULL;
    pthread_mutex_lock(&wg_lock);
    stats[0] = wg_entries;
    stats[1] = (int64_t)wg_held;
    stats[2] = (int64_t)wg_cap();
    stats[3] = wg_made;
    stats[4] = wg_dropped;
    pthread_mutex_unlock(&wg_lock);
    return TIRBYOC_OK;
}
