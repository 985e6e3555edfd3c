/*
 * attention_f32.c - fused attention, float32 (tirbyoc_attention_f32):
 *     O = softmax(where(masked, -inf, (Q @ K) * scale)) @ V
 * (or with the mask added: (Q @ K) * scale + where(masked, -inf, 0)) in one
 * call, built from the instruction set's own building blocks (the dense
 * micro-kernel, its packing routines, and the online-softmax row step of
 * chain_f32.h).
 *
 * Work is split into units of a few register tiles of query rows of one batch
 * item. A unit walks the keys in chunks: it packs the chunk of K and of V
 * once, then for each of its tiles computes the tile's scores (micro-kernel,
 * scale applied in registers), masks them, turns them into weights with the
 * online softmax (each row keeps its running maximum and sum; output rows
 * already accumulated are scaled when the maximum grows), and accumulates
 * weights @ V into the output rows (micro-kernel again). At the end each row
 * is divided by its sum. Only one tile of scores exists at a time.
 *
 * Masks are read for their structure first: keys past a row's last kept key
 * are skipped (a causal mask halves the work), and a row whose kept keys are
 * a prefix needs no per-score masking. Skipping is exact: a skipped key's
 * weight would be 0, and 0 * V[j] is 0 unless V[j] holds an inf or NaN, so
 * keys up to V's last non-finite row are never skipped. Under an added mask a
 * masked NaN or +inf score still makes its row NaN, so keys are skipped only
 * where the unit's Q rows and the skipped keys are finite and small enough
 * that no score can overflow (added_skip_exact); else every key is scored.
 * Under a mask of -FLT_MAX (TIRBYOC_ATT_MASK_LOWEST) a masked weight is 0 only
 * beside a kept score far above -FLT_MAX, so the same proof covers every key,
 * and a row with no kept key scores all of them (its weights are spread).
 *
 * Units are numbered the largest first and handed out by tb_units (home
 * ranges, then stealing), and every unit is computed the same way whichever
 * thread takes it: results do not depend on the thread count.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "dense_f32_internal.h"

/* Keys per chunk at most; the chunk shrinks for large head sizes so that the
 * packed chunks of K and V fit in ATT_PACK_FLOATS. */
#define ATT_NC_MAX 512
#define ATT_PACK_FLOATS 131072
#define ATT_NC_MIN 16
#define ATT_DDV_MAX 4096
/* Register tiles of query rows per unit of work: as many as keep at least
 * ATT_MIN_UNITS units in the call (each unit packs K and V once, so fewer,
 * larger units pack less), at most ATT_UNIT_TILES. The split depends on the
 * shapes only, never on the thread count. */
#define ATT_UNIT_TILES 32
#define ATT_MIN_UNITS 16
#define ATT_UNIT_ROWS (ATT_UNIT_TILES * TB_MR_MAX)
/* Below this many flops a call stays on the calling thread. */
#define ATT_PAR_FLOPS (2.0 * 1024 * 1024)

typedef struct {
    const tb_isa *isa;
    int64_t batch, m, n, d, dv;
    const float *q, *k, *v;
    int64_t ldq, sq, ldk, sk, ldv, sv;
    tb_wlayout klayout;
    const uint8_t *mask;
    int64_t ldm, sm, mrep; /* batch item b reads mask item b / mrep */
    int flags;
    tb_chain chain; /* the scale, applied to the scores in registers */
    float *o;
    int64_t ldo, so;
    int64_t nch, unit_rows, row_units, units;
} att_job_t;

static int64_t min_i64(int64_t x, int64_t y) { return x < y ? x : y; }
static int64_t max_i64(int64_t x, int64_t y) { return x > y ? x : y; }
static int64_t cdiv(int64_t x, int64_t y) { return (x + y - 1) / y; }
static int64_t round16(int64_t x) { return cdiv(x, 16) * 16; }

static int is_masked(const att_job_t *j, uint8_t byte)
{
    return (j->flags & TIRBYOC_ATT_MASK_KEEP) ? byte == 0 : byte != 0;
}

static uint64_t load8(const uint8_t *p)
{
    uint64_t w;
    memcpy(&w, p, 8);
    return w;
}

/* Whether all 8 bytes of w are nonzero. */
static int no_zero_byte(uint64_t w)
{
    return ((w - 0x0101010101010101ULL) & ~w & 0x8080808080808080ULL) == 0;
}

/* Whether all 8 bytes are masked / all kept. */
static int word_masked(const att_job_t *j, uint64_t w)
{
    return (j->flags & TIRBYOC_ATT_MASK_KEEP) ? w == 0 : no_zero_byte(w);
}

static int word_kept(const att_job_t *j, uint64_t w)
{
    return (j->flags & TIRBYOC_ATT_MASK_KEEP) ? no_zero_byte(w) : w == 0;
}

/* A mask row's last kept key + 1, and whether every key before it is kept. */
static int64_t row_extent(const att_job_t *j, const uint8_t *row, int *prefix)
{
    int64_t e = j->n, x;
    while (e >= 8 && word_masked(j, load8(row + e - 8)))
        e -= 8;
    while (e > 0 && is_masked(j, row[e - 1]))
        --e;
    for (x = 0; x + 8 <= e && word_kept(j, load8(row + x)); x += 8)
        ;
    while (x < e && !is_masked(j, row[x]))
        ++x;
    *prefix = x == e;
    return e;
}

/* 1 + the last row j >= lo of V_b holding an inf or NaN, else 0. */
static int64_t v_nonfinite_end(const att_job_t *j, const float *v, int64_t lo)
{
    int64_t r, c;
    for (r = j->n - 1; r >= lo; --r) {
        const float *row = v + r * j->ldv;
        uint32_t bad = 0, bits;
        for (c = 0; c < j->dv; ++c) {
            memcpy(&bits, row + c, 4);
            bad |= (bits & 0x7F800000u) == 0x7F800000u;
        }
        if (bad)
            return r + 1;
    }
    return 0;
}

/* The largest |x| of x[0:len] as float bits (IEEE order is the bits' order for
 * |x|; an inf or NaN gives 0x7f800000 or more). Branch-free, so it vectorizes. */
static uint32_t abs_bits_max(const float *x, int64_t len, uint32_t mx)
{
    int64_t i;
    for (i = 0; i < len; ++i) {
        uint32_t b;
        memcpy(&b, x + i, 4);
        b &= 0x7fffffffu;
        mx = b > mx ? b : mx;
    }
    return mx;
}

/* With an added mask: whether every score of rows [r0, r1) of one batch item at
 * keys [lo, n) is finite, so that skipping those keys (where a row masks them)
 * keeps the graph's values (a finite score + -inf is -inf; a NaN or +inf one
 * would make the row NaN). Proven from finite Q rows and K keys and
 * D * max|q| * max|k| * |scale| (a bound of every |score|) far below FLT_MAX.
 * With a mask of -FLT_MAX it is called with lo = 0: every score is then far
 * above -FLT_MAX, a masked one is -FLT_MAX (score + -FLT_MAX rounds to it),
 * and its weight beside a kept score is exactly 0. */
static int added_skip_exact(const att_job_t *j, const float *q, const float *k,
                            int64_t r0, int64_t r1, int64_t lo)
{
    uint32_t qb = 0, kb = 0;
    float qmax, kmax;
    double sc;
    int64_t i;
    if (j->d > 0) { /* (else Q and K may be NULL: every score is 0 * scale) */
        for (i = r0; i < r1; ++i)
            qb = abs_bits_max(q + i * j->ldq, j->d, qb);
        if (j->klayout == TB_W_NT)
            for (i = lo; i < j->n; ++i)
                kb = abs_bits_max(k + i * j->ldk, j->d, kb);
        else
            for (i = 0; i < j->d; ++i)
                kb = abs_bits_max(k + i * j->ldk + lo, j->n - lo, kb);
    }
    if (qb >= 0x7f800000u || kb >= 0x7f800000u)
        return 0;
    memcpy(&qmax, &qb, 4);
    memcpy(&kmax, &kb, 4);
    sc = (j->flags & TIRBYOC_ATT_DIVIDE) ? 1.0 / (double)j->chain.scale
                                          : (double)j->chain.scale;
    sc = sc < 0 ? -sc : sc;
    /* (a NaN bound, 1 / 0 * 0, fails the comparison too) */
    return (double)j->d * qmax * kmax * sc < 0x1p100;
}

/* Scores of keys [c0, c0 + cw) of one row that the mask removes: -inf, or
 * -FLT_MAX with TIRBYOC_ATT_MASK_LOWEST (with TIRBYOC_ATT_MASK_ADD: the score
 * + that value). */
static void mask_scores(const att_job_t *j, const uint8_t *mrow, int prefix,
                        int64_t ext, int64_t c0, int64_t cw, float *s)
{
    int64_t x = prefix ? max_i64(ext - c0, 0) : 0;
    const float ninf = (j->flags & TIRBYOC_ATT_MASK_LOWEST) ? -0x1.fffffep127f
                                                            : -__builtin_inff();
    const int add = (j->flags & TIRBYOC_ATT_MASK_ADD) != 0;
    if (mrow == NULL)
        return;
    if (prefix) {
        for (; x < cw; ++x)
            s[x] = add ? s[x] + ninf : ninf;
        return;
    }
    mrow += c0;
    for (; x < cw; ++x) {
        if (x + 8 <= cw) {
            const uint64_t w = load8(mrow + x);
            if (word_kept(j, w)) {
                x += 7;
                continue;
            }
        }
        if (is_masked(j, mrow[x]))
            s[x] = add ? s[x] + ninf : ninf;
    }
}

/* One unit: rows [r0, r1) of batch item b. */
static void att_unit(const att_job_t *j, int64_t b, int64_t r0, int64_t r1,
                     float *scratch)
{
    const tb_isa *isa = j->isa;
    const int64_t mr = isa->mr, nr = isa->nr, nch = j->nch;
    const float *q = j->q + b * j->sq, *k = j->k + b * j->sk;
    const float *v = j->v + b * j->sv;
    const uint8_t *mask = j->mask ? j->mask + b / j->mrep * j->sm : NULL;
    float *o = j->o + b * j->so;
    /* scratch: packed K chunk, packed V chunk, packed Q tile, scores, packed
     * weights (each 64-byte aligned: sizes are multiples of 16 floats) */
    const int64_t kps = j->d * 16, kpanels = cdiv(nch, 16);
    float *kp = scratch, *vp = kp + kpanels * kps;
    float *qp = vp + nch * round16(j->dv);
    float *s = qp + TB_MR_MAX * round16(j->d);
    float *pp = s + TB_MR_MAX * nch;
    int64_t ext[ATT_UNIT_ROWS], blk_end[ATT_UNIT_TILES];
    int prefix[ATT_UNIT_ROWS];
    /* TIRBYOC_ATT_NAN_ZERO: the row has a NaN or +inf score (its weights
     * are NaN in the graph, then 0) */
    unsigned char nan_row[ATT_UNIT_ROWS];
    const int nan_zero = (j->flags & TIRBYOC_ATT_NAN_ZERO) != 0;
    const int empty_zero = (j->flags & (TIRBYOC_ATT_EMPTY_ZERO | TIRBYOC_ATT_NAN_ZERO)) != 0;
    float mx[ATT_UNIT_ROWS], sum[ATT_UNIT_ROWS];
    int64_t i, t, tiles = cdiv(r1 - r0, mr), unit_end = 0, vend = 0, lo = j->n;
    int64_t c0;
    /* a row without kept keys still weighs every key (all scores -FLT_MAX) */
    const int lowest = mask && (j->flags & TIRBYOC_ATT_MASK_LOWEST);

    for (i = r0; i < r1; ++i) {
        const int64_t x = i - r0;
        ext[x] = mask ? row_extent(j, mask + i * j->ldm, &prefix[x]) : j->n;
        if (!mask)
            prefix[x] = 1;
        lo = min_i64(lo, ext[x]);
        mx[x] = -__builtin_inff();
        sum[x] = 0.0f;
        nan_row[x] = 0;
    }
    if (mask && (j->flags & (TIRBYOC_ATT_MASK_ADD | TIRBYOC_ATT_MASK_LOWEST)) &&
        lo < j->n && !added_skip_exact(j, q, k, r0, r1, lowest ? 0 : lo)) {
        /* a skipped score might be NaN or +inf: every key scored, per-score
         * masking unless a row keeps them all */
        for (i = r0; i < r1; ++i) {
            prefix[i - r0] = prefix[i - r0] && ext[i - r0] == j->n;
            ext[i - r0] = j->n;
        }
        lo = j->n;
    }
    if (lo < j->n)
        vend = v_nonfinite_end(j, v, lo);
    for (t = 0; t < tiles; ++t) {
        int64_t e = vend;
        for (i = r0 + t * mr; i < min_i64(r1, r0 + (t + 1) * mr); ++i)
            e = max_i64(e, lowest && ext[i - r0] == 0 ? j->n : ext[i - r0]);
        blk_end[t] = e;
        unit_end = max_i64(unit_end, e);
    }

    for (c0 = 0; c0 < unit_end; c0 += nch) {
        const int64_t cwu = min_i64(nch, unit_end - c0);
        if (j->d > 0)
            isa->pack_w(j->klayout, j->d, cwu,
                        j->klayout == TB_W_NT ? k + c0 * j->ldk : k + c0, j->ldk,
                        kp, kps);
        if (j->dv > 0)
            isa->pack_w(TB_W_NN, cwu, j->dv, v + c0 * j->ldv, j->ldv, vp, cwu * 16);
        for (t = 0; t < tiles; ++t) {
            const int64_t i0 = r0 + t * mr, rows = min_i64(mr, r1 - i0);
            const int64_t cw = min_i64(cwu, blk_end[t] - c0);
            int64_t jt, x;
            if (cw <= 0)
                continue;
            if (j->d > 0) {
                isa->pack_a(rows, j->d, q + i0 * j->ldq, j->ldq, qp);
                for (jt = 0; jt < cw; jt += nr)
                    isa->ukernel(j->d, qp, kp + jt / 16 * kps, kps, s + jt, nch,
                                 (int)rows, (int)min_i64(nr, cw - jt), TB_LAST,
                                 j->chain.ops ? &j->chain : NULL, 0, 0);
            } else {
                /* no head dimension: every score is the scaled empty sum */
                const float zero = (j->flags & TIRBYOC_ATT_DIVIDE)
                                       ? 0.0f / j->chain.scale
                                       : 0.0f * j->chain.scale;
                for (x = 0; x < rows; ++x)
                    for (jt = 0; jt < cw; ++jt)
                        s[x * nch + jt] = zero;
            }
            for (x = 0; x < rows; ++x) {
                const int64_t row = i0 - r0 + x;
                float *srow = s + x * nch, alpha;
                mask_scores(j, mask ? mask + (i0 + x) * j->ldm : NULL,
                            prefix[row], ext[row], c0, cw, srow);
                for (jt = 0; nan_zero && !nan_row[row] && jt < cw; ++jt)
                    nan_row[row] = srow[jt] != srow[jt] || srow[jt] == __builtin_inff();
                alpha = isa->attn_row(cw, srow, &mx[row], &sum[row]);
                if (c0 > 0 && alpha != 1.0f) {
                    float *orow = o + (i0 + x) * j->ldo;
                    for (jt = 0; jt < j->dv; ++jt)
                        orow[jt] *= alpha;
                }
            }
            if (j->dv == 0)
                continue;
            isa->pack_a(rows, cw, s, nch, pp);
            for (jt = 0; jt < j->dv; jt += nr)
                isa->ukernel(cw, pp, vp + jt / 16 * (cwu * 16), cwu * 16,
                             o + i0 * j->ldo + jt, j->ldo, (int)rows,
                             (int)min_i64(nr, j->dv - jt),
                             c0 > 0 ? TB_ACCUMULATE | TB_LAST : TB_LAST, NULL, 0, 0);
        }
    }

    /* Each row divided by its sum; rows without kept scores as the graph
     * gives them. */
    for (t = 0; t < tiles; ++t) {
        for (i = r0 + t * mr; i < min_i64(r1, r0 + (t + 1) * mr); ++i) {
            float *orow = o + i * j->ldo;
            const float sm = sum[i - r0];
            int64_t c;
            if (nan_row[i - r0]) {
                /* weights of 0 for every key: the sum of 0 * V over all of
                 * them, 0, or NaN in a column holding an inf or NaN */
                int64_t key;
                for (c = 0; c < j->dv; ++c)
                    orow[c] = 0.0f;
                for (key = 0; key < j->n; ++key)
                    for (c = 0; c < j->dv; ++c)
                        orow[c] += 0.0f * v[key * j->ldv + c];
            } else if (blk_end[t] == 0) {
                /* nothing was accumulated: every key is masked, V finite */
                const float fill = empty_zero ? 0.0f : __builtin_nanf("");
                for (c = 0; c < j->dv; ++c)
                    orow[c] = fill;
            } else if (sm == 0.0f) {
                /* all scores -inf: weights 0 (the sum of 0 * V, which is 0
                 * or NaN) or NaN */
                if (!empty_zero)
                    for (c = 0; c < j->dv; ++c)
                        orow[c] = __builtin_nanf("");
            } else {
                for (c = 0; c < j->dv; ++c)
                    orow[c] = orow[c] / sm;
            }
        }
    }
}

static void att_task(void *arg, int64_t u, float *scratch)
{
    const att_job_t *j = (const att_job_t *)arg;
    /* the last row units (the most keys under a causal mask) first */
    const int64_t ru = j->row_units - 1 - u / j->batch, b = u % j->batch;
    att_unit(j, b, ru * j->unit_rows, min_i64(j->m, (ru + 1) * j->unit_rows),
             scratch);
}

int32_t tirbyoc_attention_f32(int64_t batch, int64_t m, int64_t n, int64_t d,
                              int64_t dv, const float *q, int64_t ldq,
                              int64_t stride_q, const float *k, int64_t ldk,
                              int64_t stride_k, int32_t k_layout,
                              const float *v, int64_t ldv, int64_t stride_v,
                              const uint8_t *mask, int64_t ldmask,
                              int64_t stride_mask, int64_t mask_repeat,
                              int32_t flags, float scale,
                              float *o, int64_t ldo, int64_t stride_o)
{
    att_job_t j;
    int64_t b, i, c, want, tiles;
    double flops;
    const int known = TIRBYOC_ATT_DIVIDE | TIRBYOC_ATT_MASK_KEEP |
                      TIRBYOC_ATT_EMPTY_ZERO | TIRBYOC_ATT_MASK_ADD |
                      TIRBYOC_ATT_MASK_LOWEST | TIRBYOC_ATT_NAN_ZERO;

    if (k_layout != TIRBYOC_B_KN && k_layout != TIRBYOC_B_NK)
        return TIRBYOC_EINVAL;
    if ((flags & ~known) || mask_repeat < 1)
        return TIRBYOC_EINVAL;
    if (batch < 0 || m < 0 || n < 0 || d < 0 || dv < 0 || stride_q < 0 ||
        stride_k < 0 || stride_v < 0 || stride_mask < 0 || stride_o < 0 ||
        ldmask < 0)
        return TIRBYOC_ESIZE;
    if (d > ATT_DDV_MAX || dv > ATT_DDV_MAX || d + dv > ATT_DDV_MAX)
        return TIRBYOC_ESIZE;
    if (ldq < d || ldk < (k_layout == TIRBYOC_B_NK ? d : n) || ldv < dv ||
        ldo < dv || (mask != NULL && ldmask != 0 && ldmask < n))
        return TIRBYOC_ESTRIDE;
    if (batch == 0 || m == 0 || dv == 0)
        return TIRBYOC_OK;
    if (o == NULL || (d > 0 && q == NULL) || (n > 0 && d > 0 && k == NULL) ||
        (n > 0 && v == NULL))
        return TIRBYOC_ENULL;
    if (n == 0) {
        /* an empty key range: the product with V is the empty sum */
        for (b = 0; b < batch; ++b)
            for (i = 0; i < m; ++i)
                for (c = 0; c < dv; ++c)
                    o[b * stride_o + i * ldo + c] = 0.0f;
        return TIRBYOC_OK;
    }
    if (tb_scratch() == NULL)
        return TIRBYOC_ENOMEM;

    memset(&j, 0, sizeof(j));
    j.isa = tb_active_isa();
    j.batch = batch;
    j.m = m;
    j.n = n;
    j.d = d;
    j.dv = dv;
    j.q = q;
    j.ldq = ldq;
    j.sq = stride_q;
    j.k = k;
    j.ldk = ldk;
    j.sk = stride_k;
    /* as the dense packing sees K: keys are the columns of the product */
    j.klayout = k_layout == TIRBYOC_B_NK ? TB_W_NT : TB_W_NN;
    j.v = v;
    j.ldv = ldv;
    j.sv = stride_v;
    j.mask = mask;
    j.ldm = ldmask;
    j.sm = stride_mask;
    j.mrep = mask_repeat;
    j.flags = flags;
    j.chain.scale = scale;
    if (flags & TIRBYOC_ATT_DIVIDE)
        j.chain.ops = TIRBYOC_EPI_DIVIDE;
    else if (scale != 1.0f)
        j.chain.ops = TIRBYOC_EPI_SCALE;
    j.o = o;
    j.ldo = ldo;
    j.so = stride_o;
    j.nch = ATT_PACK_FLOATS / (round16(d) + round16(dv)) / 16 * 16;
    j.nch = j.nch > ATT_NC_MAX ? ATT_NC_MAX : j.nch;
    j.nch = j.nch < ATT_NC_MIN ? ATT_NC_MIN : j.nch;
    tiles = cdiv(m, j.isa->mr);
    j.row_units = min_i64(tiles, max_i64(cdiv(ATT_MIN_UNITS, batch),
                                         cdiv(tiles, ATT_UNIT_TILES)));
    j.unit_rows = (int64_t)j.isa->mr * cdiv(tiles, j.row_units);
    j.row_units = cdiv(m, j.unit_rows);
    j.units = j.row_units * batch;

    flops = 2.0 * (double)batch * (double)m * (double)n * (double)(d + dv);
    want = tb_threads_for(flops, ATT_PAR_FLOPS, j.units);
    tb_units(att_task, &j, j.units, (int)want);
    return TIRBYOC_OK;
}
