/*
 * dense_f32_internal.h - declarations shared by the float32 dense driver
 * (dense_f32.c), the per-instruction-set kernel files (dense_f32_generic.c,
 * dense_f32_avx2.c, dense_f32_avx512.c), the CPU dispatch (dispatch.c) and
 * the thread pool (threads.c). Not part of the public ABI.
 *
 * Every instruction set provides the same small set of building blocks
 * (tb_isa below); the blocking, threading and argument checks live once in
 * dense_f32.c.
 */
#ifndef TIRBYOC_DENSE_F32_INTERNAL_H
#define TIRBYOC_DENSE_F32_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "tirbyoc_kernels.h"

/* Library-internal symbols: shared between the kernel objects but not
 * exported from a shared library (e.g. a TVM module) that links them. */
#define TB_INTERNAL __attribute__((visibility("hidden")))

/* Width of a W panel (packed layout and runtime-packed blocks alike). */
#define TB_NR TIRBYOC_PACK_NR

/* How the driver reads W. */
typedef enum { TB_W_NT, TB_W_NN, TB_W_PACKED } tb_wlayout;

/*
 * An epilogue chain (see tirbyoc_epilogue_op in tirbyoc_kernels.h) applied
 * to each finished output: ops in 4-bit codes, first op lowest; bias is the
 * [N] vector of the whole matrix, residual the batch's [M, N] tensor with row
 * stride ldr. The building blocks below take it with (ci, cj), the row and
 * column in the matrix of the first output they compute, and apply it to
 * each register of finished outputs before storing it (chain_f32.h); NULL
 * (or ops == 0): nothing to apply.
 */
typedef struct tb_chain {
    int64_t ops;
    float scale;
    const float *bias;
    const float *residual;
    int64_t ldr;
} tb_chain;

/* Number of operations in a chain; -1 if it is invalid (an unknown code, or
 * a nonzero code after the first TIRBYOC_EPI_END). *uses_bias and
 * *uses_residual: whether it has those operations (dense_f32.c). */
TB_INTERNAL int tb_chain_length(int64_t ops, int *uses_bias,
                                int *uses_residual);

/* Whether a chain has a transcendental operation (tanh, sigmoid, SiLU, a
 * GELU): tens of instructions per register, against one for the others. */
static inline int tb_chain_has_math(int64_t ops)
{
    for (; ops != 0; ops >>= 4) {
        const int op = (int)(ops & 15);
        if (op == TIRBYOC_EPI_TANH || op == TIRBYOC_EPI_SIGMOID ||
            op == TIRBYOC_EPI_SILU || op == TIRBYOC_EPI_GELU_ERF ||
            op == TIRBYOC_EPI_GELU_TANH)
            return 1;
    }
    return 0;
}

/* Micro-kernel flags. */
#define TB_ACCUMULATE 1 /* C holds a partial sum over earlier K blocks */
#define TB_LAST 2       /* last K block: apply the epilogue chain */
#define TB_PREFETCH_W 4 /* W is not in cache yet (first pass over a
                           pre-packed block): prefetch it ahead */
#define TB_PREFETCH_NEXT 8 /* the panels after this tile's (NV * wps floats
                              on from each; the caller vouches that they
                              exist) are not in cache yet: fetch them into
                              L2 meanwhile, one line each per k step */

/* Upper bounds over all instruction sets (they size the scratch buffers). */
#define TB_MR_MAX 16
#define TB_KC_MAX 528
#define TB_NC_MAX 512
/* Rows of A in one packed block of the blocked dense path (its buffer:
 * TB_MC_MAX x TB_KC_MAX floats per thread, 1.6 MiB). */
#define TB_MC_MAX 768

/*
 * Micro-kernel: C[0:mr, 0:nr] (+)= Ap @ Wp for one register tile.
 *   ap: packed A, kc steps of mr floats (ap[p * mr + i] = A[i][p]);
 *   wp: first W panel at the K offset of this block, 16 floats per k step;
 *       the second panel (nr > 16) starts wps floats later. Panels are
 *       zero padded to 16 columns, so only C and bias need edge handling.
 *   flags: TB_ACCUMULATE (add to the partial sums in C), TB_LAST (then
 *       apply ch, if not NULL, before storing), TB_PREFETCH_W (a hint).
 * 1 <= mr <= isa->mr, 1 <= nr <= isa->nr.
 */
typedef void (*tb_ukernel_fn)(int64_t kc, const float *ap, const float *wp,
                              int64_t wps, float *c, int64_t ldc, int mr,
                              int nr, int flags, const tb_chain *ch,
                              int64_t ci, int64_t cj);

/* A[0:mr, 0:kc] (row stride lda) -> ap[p * mr + i]. */
typedef void (*tb_pack_a_fn)(int64_t mr, int64_t kc, const float *a,
                             int64_t lda, float *ap);

/*
 * W block -> ceil(nc / 16) panels of kc x 16 floats, panel q at
 * dst + q * dps, zero padded past nc. For TB_W_NT, w points at W[j0][p0]
 * (W is [N, K]); for TB_W_NN at W[p0][j0] (W is [K, N]).
 */
typedef void (*tb_pack_w_fn)(tb_wlayout layout, int64_t kc, int64_t nc,
                             const float *w, int64_t ldw, float *dst,
                             int64_t dps);

/*
 * Few rows (matrix-vector like, no packing): the whole K range for
 * C[0:m, 0:n], then the chain; any m >= 1 (handled a few rows at a time).
 * The driver (dense_f32.c) calls it on column blocks that keep W in L2. For TB_W_PACKED, w is the first panel and
 * ldw the distance between panels (16 * K).
 */
typedef void (*tb_small_fn)(tb_wlayout layout, int64_t m, int64_t n,
                            int64_t k, const float *a, int64_t lda,
                            const float *w, int64_t ldw, float *c,
                            int64_t ldc, const tb_chain *ch, int64_t ci,
                            int64_t cj);

/*
 * Optional "nt" path that never packs W (NULL where an ISA has none): C's
 * rows run along the vectors, A is packed transposed into ap, W's rows are
 * read in place. C[0:m, 0:n] over all of K, then the chain; ap holds
 * direct_rows * k floats (64-byte aligned).
 * Results must equal the blocked path's bit for bit (same K blocks, same
 * order of additions), so that the choice never shows in the output.
 */
typedef void (*tb_direct_fn)(int64_t m, int64_t n, int64_t k, const float *a,
                             int64_t lda, const float *w, int64_t ldw,
                             float *c, int64_t ldc, const tb_chain *ch,
                             int64_t ci, int64_t cj, float *ap);

/* Applies a chain to outputs already in C[0:m, 0:n] (row stride ldc), whose
 * first element is at row i0, column j0 of the matrix (chain_f32.h). */
typedef void (*tb_chain_fn)(const tb_chain *ch, float *c, int64_t ldc,
                            int64_t m, int64_t n, int64_t i0, int64_t j0);
/* y[0:n] = op(x[0:n]) for one unary epilogue operation; x == y allowed. */
typedef void (*tb_unary_fn)(int op, int64_t n, const float *x, float *y);
/* y[0:n] = softmax(x[0:n]); x == y allowed. */
typedef void (*tb_softmax_fn)(int64_t n, const float *x, float *y);
/* One online-softmax step over n scores of an attention row (chain_f32.h,
 * tb_attn_row): updates the row's maximum and sum, turns the scores into
 * weights, returns the factor for the row's earlier output. */
typedef float (*tb_attn_row_fn)(int64_t n, float *s, float *mx, float *sum);

/* A convolution's implicit column matrix (conv_f32.c, conv_gather.h): row k
 * = (c, r, s) of the weight's [OC][C][KH][KW] order, column p = output pixel
 * oh * OW + ow, value x[c][oh * sh - pt + r * dh][ow * sw - pl + s * dw] (0
 * outside the image); row k (the bias step) is ones. */
typedef struct tb_conv_geom {
    int64_t h, w, kh, kw, sh, sw, pt, pl, dh, dw, ow, k;
} tb_conv_geom;

/* A run of len columns iw, iw + sw, ... of a row w wide (row NULL: none):
 * the run's elements [*lo, *hi) lie inside [0, w) (the instruction sets'
 * cg_run, conv_gather.h). */
static inline void tb_cg_inside(const float *row, int64_t iw, int64_t sw, int64_t w,
                                int len, int64_t *lo, int64_t *hi)
{
    *lo = *hi = 0;
    if (row == NULL)
        return;
    if (sw == 1) { /* no divisions on the common path */
        *lo = iw >= 0 ? 0 : -iw;
        *hi = iw >= w ? 0 : w - iw;
    } else {
        *lo = iw >= 0 ? 0 : (-iw + sw - 1) / sw;
        *hi = iw >= w ? 0 : (w - iw + sw - 1) / sw;
    }
    *lo = *lo < len ? *lo : len;
    *hi = *hi < len ? *hi : len;
}

/* C = A @ a pre-packed W, then the chain (dense_f32.c: the convolutions that
 * run as one product). */
TB_INTERNAL void tb_dense_packed(int64_t m, int64_t n, int64_t k,
                                 const float *a, int64_t lda, const float *wpk,
                                 int64_t wps, float *c, int64_t ldc,
                                 const tb_chain *chain);

/* The argument checks of tirbyoc_conv2d_f32 (and its packed form) and
 * tirbyoc_depthwise_conv2d_f32 after their sizes (conv_f32.c): strides and
 * dilations in [1, 2^31) and paddings in (-2^31, 2^31), else
 * TIRBYOC_EINVAL; then the chain: TIRBYOC_EEPILOGUE unless it is valid, has
 * the bias (if any) first (a step of the sum, not of the chain) and no SCALE
 * or DIVIDE (a factor belongs in the weight). On TIRBYOC_OK, *ops is the
 * chain after the bias and *uses_residual whether it adds a residual. */
TB_INTERNAL int32_t tb_conv_check_args(int64_t stride_h, int64_t stride_w,
                                       int64_t pad_top, int64_t pad_left,
                                       int64_t dilation_h, int64_t dilation_w,
                                       int64_t epilogue, int64_t *ops,
                                       int *uses_residual);

/* 16 consecutive output pixels (fewer in a block's last panel). */
typedef struct tb_conv_panel {
    int64_t orow, ocol; /* the first pixel's output row and column */
    int64_t cnt;        /* pixels, <= 16 */
    int single;         /* 16 pixels, all on output row orow */
} tb_conv_panel;

/* Rows [k0, k0 + kc) of an image's column matrix for the panels pn[0:np]
 * into dst[q * dps + r * 16 + t] (zeros past a panel's pixels). */
typedef void (*tb_conv_gather_fn)(const tb_conv_geom *g, const float *img,
                                  int64_t k0, int64_t kc,
                                  const tb_conv_panel *pn, int64_t np,
                                  float *dst, int64_t dps);

/*
 * The convolution's direct path (conv_f32.c); NULL where an ISA has none.
 * conv_tile: C[0:mr, 0:nr] (+)= A @ Wp as the micro-kernel, with A read in
 * place: A[i][p] = kp[p][off + i] (rows are output pixels, columns output
 * channels), or kp[p][off + skip + i] for rows i >= split when
 * 0 < split < mr; flags: TB_ACCUMULATE, TB_PREFETCH_W and TB_PREFETCH_NEXT
 * only, no chain.
 * conv_out: y[o * ldy + t] = ct[t * ldc + o] for o < m, t < n <= 16, with
 * the chain ch (if not NULL) applied as to outputs at row ci + o, column
 * cj + t of its matrix.
 */
typedef void (*tb_conv_tile_fn)(int64_t kc, const float *const *kp,
                                int64_t off, const float *wp,
                                int64_t wps, float *c, int64_t ldc, int mr,
                                int nr, int flags, int split, int64_t skip);
typedef void (*tb_conv_out_fn)(const float *ct, int64_t ldc, int64_t m,
                               int64_t n, float *y, int64_t ldy,
                               const tb_chain *ch, int64_t ci, int64_t cj);
/*
 * The direct path over NCHW16c tensors (conv_f32.c; NULL where an ISA has
 * none). conv_tile16: conv_tile with A[i][p] = kp[p][(off + i) * 16] (an
 * image's pixels 16 floats apart), split 0. conv_out16: the NCHW16c store,
 * y[o / 16 * ldy + t * 16 + o % 16] = ct[t * ldc + o] for o < m (a multiple
 * of 16), t < n, then the chain ops (RESIDUAL, RELU and RELU6 only:
 * tb_ops16_split's first part, the caller applies the rest; the residual
 * res read at y's offsets, NULL if ops has none).
 */
/* conv_f32.c, for both convolutions: TIRBYOC_EINVAL unless layouts is a
 * set of TIRBYOC_LAYOUT_* with 16 | c for X16 and 16 | oc for Y16;
 * TIRBYOC_EEPILOGUE for Y16 with a chain (after the bias) of other
 * operations than RESIDUAL and the unary ones (tb_op_unary). */
static inline int tb_op_unary(int op)
{
    return (op >= TIRBYOC_EPI_RELU && op <= TIRBYOC_EPI_TANH) ||
           op == TIRBYOC_EPI_HARDSWISH || op == TIRBYOC_EPI_HARDSIGMOID;
}
/* The NCHW16c stores' part of a chain: its leading RESIDUAL, RELU and RELU6
 * steps, and SILU and SIGMOID where `sigmoid` (the ISA's sigmoid16), which
 * the stores apply in registers (returned); *rest: the operations after
 * them, which the caller applies to the stored block (conv_f32.c). */
static inline int64_t tb_ops16_split(int64_t ops, int64_t *rest, int sigmoid)
{
    uint64_t o = (uint64_t)ops;
    int sh = 0;
    while (sh < 64 && ((o >> sh) & 15) != 0 &&
           (((o >> sh) & 15) == TIRBYOC_EPI_RESIDUAL || ((o >> sh) & 15) == TIRBYOC_EPI_RELU ||
            ((o >> sh) & 15) == TIRBYOC_EPI_RELU6 ||
            (sigmoid && (((o >> sh) & 15) == TIRBYOC_EPI_SILU ||
                         ((o >> sh) & 15) == TIRBYOC_EPI_SIGMOID))))
        sh += 4;
    *rest = sh < 64 ? (int64_t)(o >> sh) : 0;
    return sh < 64 ? (int64_t)(o & ((UINT64_C(1) << sh) - 1)) : ops;
}
TB_INTERNAL int32_t tb_layouts_check(int64_t layouts, int64_t c, int64_t oc,
                                     int64_t ops);
/* NCHW [batch, c, hw] to NCHW16c [batch, c / 16, hw, 16] (to_blocked), or
 * back; 16 | c. */
TB_INTERNAL void tb_relayout16(const float *src, float *dst, int64_t batch,
                               int64_t c, int64_t hw, int to_blocked);
/* The portable route for NCHW16c tensors (layouts), around a call without
 * them: open points *x (an x of [batch, c, hw]) and *res (NULL, or a
 * residual of [batch, oc, p]) at NCHW copies of the blocked ones, and *y at
 * an NCHW buffer for the call's output when y is blocked (malloc'd, in t);
 * 0 if memory ran out (nothing kept). close, given the call's status st,
 * converts that output into the caller's y (st TIRBYOC_OK), frees the
 * copies and returns st. */
typedef struct {
    float *x, *res, *y;
} tb_nchw_copies;
TB_INTERNAL int tb_nchw_copies_open(tb_nchw_copies *t, int64_t layouts,
                                    int64_t batch, int64_t c, int64_t hw,
                                    int64_t oc, int64_t p, const float **x,
                                    const float **res, float **y);
TB_INTERNAL int32_t tb_nchw_copies_close(tb_nchw_copies *t, int32_t st,
                                         int64_t batch, int64_t oc, int64_t p,
                                         float *y);
typedef void (*tb_conv_out16_fn)(const float *ct, int64_t ldc, int64_t m,
                                 int64_t n, float *y, const float *res,
                                 int64_t ldy, int64_t ops);
/* conv_tile16 over one K block (flags: TB_PREFETCH_W, TB_PREFETCH_NEXT and
 * TB_ACCUMULATE) storing its tile
 * as conv_out16 would the sums: row i's channels [16 v, 16 v + 16) at
 * y[v * ldy + i * 16], through ops (res at y's offsets); 16 | nr. With
 * TB_ACCUMULATE the sums add to what y holds there (an earlier K block's
 * sums, stored with ops 0 and res NULL). */
typedef void (*tb_conv_tile16y_fn)(int64_t kc, const float *const *kp,
                                   int64_t off, const float *wp, int64_t wps,
                                   float *y, const float *res, int64_t ldy,
                                   int mr, int nr, int flags, int64_t ops);

/* conv_tile (rows 1 float apart, split and skip as there) over one K block
 * storing its tile into an NCHW16c y as conv_tile16y does (16 | nr): the
 * direct path's phase planes, or an NCHW image read in place, into blocked
 * outputs without the sums' round trip through the scratch. */
typedef void (*tb_conv_tiley_fn)(int64_t kc, const float *const *kp,
                                 int64_t off, const float *wp, int64_t wps,
                                 float *y, const float *res, int64_t ldy,
                                 int mr, int nr, int flags, int64_t ops,
                                 int split, int64_t skip);

/* d[t] = s[t * sw] for t < n, sw 1 or 2 (the direct path's phase planes,
 * conv_f32.c); NULL where an ISA leaves it to the compiler's loops. */
typedef void (*tb_strided_copy_fn)(float *d, const float *s, int64_t n,
                                   int64_t sw);

/* d[l * ds + t] = s[t * sw * 16 + l] for t < n, l < 16: pixels sw apart of
 * an NCHW16c image into the rows of its block's 16 channels (the direct
 * path's phase planes, conv_f32.c); NULL where an ISA leaves it to the
 * compiler's loops. */
typedef void (*tb_unblock16_fn)(float *d, int64_t ds, const float *s, int64_t n,
                                int64_t sw);
TB_INTERNAL void tb_unblock16_avx2(float *d, int64_t ds, const float *s, int64_t n,
                                   int64_t sw);

/*
 * The Winograd convolution F(4x4, 3x3) (conv_winograd_f32.c,
 * conv_winograd.h): an image's output in tiles of 4 x 4 pixels, tw per
 * output row; tile t's input window is the 6 x 6 pixels from row
 * 4 (t / tw) - pt, column 4 (t % tw) - pl (zeros outside the image).
 * wino_in: the transformed windows of tiles [t0, t0 + nt) of image img
 * ([c, h, w]) for every channel, v[(e * c + ci) * ldv + t - t0] for the 36
 * elements e (ldv >= nt); tmp holds TB_WINO_TMP floats. wino_out: the output tiles
 * s[((i * nt + t) * 4 + j) * ldm + o] of the products
 * m[(e * nt + t) * ldm + o], plus bias[o] (if not NULL), for o < ldm (a
 * multiple of 16).
 */
typedef struct tb_wino_geom {
    int64_t c, h, w, pt, pl, tw;
} tb_wino_geom;
#define TB_WINO_CHUNK 64 /* tiles of a row transformed at a time */
#define TB_WINO_ROW (4 * TB_WINO_CHUNK + 4 * 16)
#define TB_WINO_PHASE (TB_WINO_CHUNK + 2 * 16)
#define TB_WINO_TMP (6 * TB_WINO_ROW + 24 * TB_WINO_PHASE)
typedef void (*tb_wino_in_fn)(const tb_wino_geom *g, const float *img,
                              int64_t t0, int64_t nt, float *v, int64_t ldv,
                              float *tmp);
typedef void (*tb_wino_out_fn)(const float *m, int64_t nt, int64_t ldm,
                               const float *bias, float *s);

typedef struct tb_isa {
    const char *name;
    int mr;      /* rows of a register tile (<= TB_MR_MAX) */
    int nr;      /* columns of a register tile: 16 or 32 */
    int kc;      /* K block (<= TB_KC_MAX) */
    int nc;      /* N block, a multiple of nr (<= TB_NC_MAX) */
    tb_ukernel_fn ukernel;
    tb_pack_a_fn pack_a;
    tb_pack_w_fn pack_w;
    tb_small_fn small;
    tb_direct_fn nt_direct; /* or NULL */
    int direct_nr;          /* columns per tile of nt_direct */
    int direct_rows;        /* rows of A packed at a time by nt_direct */
    /* rows of C up to which "nt" takes nt_direct (TB_DIRECT_M_PER_LANE per
     * lane of the ISA's vectors; 0 without nt_direct) */
    int direct_m;
    tb_chain_fn chain;      /* the epilogue chain, compiled for this ISA */
    tb_unary_fn unary;
    tb_softmax_fn softmax;
    tb_attn_row_fn attn_row;
    tb_conv_gather_fn conv_gather;
    tb_conv_tile_fn conv_tile; /* or NULL */
    tb_conv_out_fn conv_out;   /* or NULL */
    tb_wino_in_fn wino_in;
    tb_wino_out_fn wino_out;
    tb_conv_tile_fn conv_tile16; /* or NULL */
    tb_conv_out16_fn conv_out16; /* or NULL */
    tb_conv_tile16y_fn conv_tile16y; /* or NULL */
    tb_conv_tiley_fn conv_tiley;     /* or NULL */
    tb_strided_copy_fn strided_copy; /* or NULL */
    tb_unblock16_fn unblock16;       /* or NULL */
    /* Input channels from which a 3x3 conv over as few as WG_TILES_FEW
     * tiles of 4 x 4 output pixels takes Winograd's F(4x4, 3x3) (else from
     * WG_TILES_MIN tiles; 0: never): where it was measured faster on this
     * instruction set (conv_winograd_f32.c) */
    int wg_few_tiles_c;
    /* 1 where the NCHW16c stores (conv_out16, the Y16 tiles) apply a SILU or
     * SIGMOID in registers too (tb_ops16_split); else the caller applies
     * them over the stored block, a second pass. */
    int sigmoid16;
} tb_isa;

TB_INTERNAL extern const tb_isa tb_isa_generic;
TB_INTERNAL extern const tb_isa tb_isa_avx2;
TB_INTERNAL extern const tb_isa tb_isa_avx512;

/* dispatch.c: the active instruction set (chosen once, then cached). */
TB_INTERNAL const tb_isa *tb_active_isa(void);

/* threads.c */
typedef void (*tb_task_fn)(void *arg, int tid, int nthreads);
/* Configured thread count (TIRBYOC_NUM_THREADS or the CPUs available). */
TB_INTERNAL int tb_num_threads(void);
/*
 * The threads a call's work can use, its cost model: at most the
 * configured count (and the pool's limit), at most one per unit, and at
 * most one per half of `two_from`, the work (flops, taps, floats: the
 * caller's measure) from which the kernel was measured faster on two
 * threads than on one (the hand-off to a worker costs a few microseconds
 * of its work). On two threads the choice is the measured one; a small
 * call stays on few threads at 16 and a large one spreads.
 */
TB_INTERNAL int tb_threads_for(double work, double two_from, int64_t units);
/*
 * Runs fn(arg, t, nt) for t = 0 .. nt-1 (the parts of the job), with
 * 1 <= nt <= want: nt is 1 when the pool is busy (another caller is using
 * it) or cannot start threads. Part 0 runs on the calling thread; each other
 * part runs once, on whichever thread takes it first (the calling thread
 * takes the parts no worker has taken, so one thread may run several).
 * Returns when all calls have returned.
 */
TB_INTERNAL void tb_parallel(tb_task_fn fn, void *arg, int want);
/*
 * Runs fn(arg, u, scratch) for u = 0 .. units-1 on up to `want` threads:
 * part t of the job first takes, in order, the units of its home range (the
 * t-th of `want` contiguous ranges; part 0 is the calling thread), then the
 * units left in the other ranges. Number units in the order of the output
 * they write, so that consecutive calls leave each thread the same share of
 * the tensors. scratch is the running thread's tb_scratch(). A worker
 * without scratch takes no unit (the caller must have checked its own).
 * Returns when all units are done.
 */
typedef void (*tb_unit_fn)(void *arg, int64_t unit, float *scratch);
TB_INTERNAL void tb_units(tb_unit_fn fn, void *arg, int64_t units, int want);
/* "nt" with up to this many rows of C per vector lane goes through
 * nt_direct (A packed transposed, W read in place), more through the
 * blocked path (W packed per call). Packing W costs a fixed time per call
 * (N x K floats copied) that the product's M rows share, and nt_direct
 * loses a fixed share of the FMA rate (its tile broadcasts from six W rows
 * at once), so the two cross at a number of rows that grows with the FMA
 * rate per core, i.e. with the lanes of the vector: measured with W as
 * given, both paths in one process (same bits), 64 x 768 -> 768 to 128 x
 * 3072 -> 768: on a Zen 3 with AVX2 (8 lanes) even at 64 rows, the blocked
 * path 0.86-0.93x the time at 96 and 128 rows, 1.15-1.56x at 16 to 48; on
 * AVX-512 (16 lanes) nt_direct measured faster up to 128 rows. */
#define TB_DIRECT_M_PER_LANE 8

/* Per-thread scratch of TB_SCRATCH_FLOATS floats, 64-byte aligned,
 * allocated on a thread's first use; NULL if that allocation failed. */
TB_INTERNAL float *tb_scratch(void);
/* The calling thread's workspace of at least floats floats, 64-byte
 * aligned, kept (and reused) until the thread's next larger request or its
 * exit; its contents do not survive that next request. NULL if it cannot be
 * allocated. For buffers a call shares with its workers. */
TB_INTERNAL float *tb_workspace(size_t floats);
/* The calling thread's buffer for the blocked dense path's packed block of A
 * (rows x K block), like tb_workspace but its own: the blocked path runs on
 * a caller's thread while the caller's workspace is in use. */
TB_INTERNAL float *tb_ablock(size_t floats);

/*
 * The data caches the blocked paths are sized for (dispatch.c: cpuid leaf 4
 * on Intel, 0x8000001D on AMD, read once; the defaults below where the CPU
 * does not say): size in bytes, ways and line size of L1d and of L2.
 */
typedef struct tb_caches {
    int64_t l1_bytes, l1_ways, l2_bytes, l2_ways, line;
} tb_caches;
TB_INTERNAL const tb_caches *tb_cache_sizes(void);
/*
 * Rows of A packed per block of the blocked dense path for a K block of kc
 * and register tiles of mr x nr (Low et al., "Analytical modeling is enough
 * for high-performance BLIS", 2016): the kc x nr micro-panel of W stays in
 * L1 while the mr x kc micro-panels of A stream from L2, so the A block is
 * sized to the L2 ways left after one for W's micro-panel and one for C and
 * other traffic. A multiple of mr, at least mr.
 */
TB_INTERNAL int64_t tb_rows_per_ablock(int64_t kc, int mr, int nr);
/*
 * Floats of a unit's working set kept in L2 beside what streams through it:
 * half the L2 (64K floats of a 512 KiB L2), within [16K, 128K] floats (the
 * upper bound leaves room for the rest of a unit inside a thread's scratch).
 * The conv direct path's sums and the depthwise channels-in-lanes scratch.
 */
TB_INTERNAL int64_t tb_l2_half_floats(void);

#define TB_SCRATCH_FLOATS \
    ((size_t)TB_KC_MAX * TB_NC_MAX + (size_t)TB_MR_MAX * TB_KC_MAX)

/* The K blocks of the blocked path, and of any path whose results must equal
 * it bit for bit (each block is one FMA chain; the blocks' sums are added in
 * order): ceil(k / kc) blocks of about equal size, block b starting at
 * tb_kblock_start(k, blocks, b). They depend on k and kc only. */
static inline int64_t tb_kblocks(int64_t k, int64_t kc)
{
    return (k + kc - 1) / kc;
}

static inline int64_t tb_kblock_start(int64_t k, int64_t blocks, int64_t b)
{
    return k * b / blocks;
}

#endif /* TIRBYOC_DENSE_F32_INTERNAL_H */
