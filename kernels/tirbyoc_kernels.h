/*
 * tirbyoc_kernels.h - public ABI of the tirbyoc C kernel library.
 *
 * This header is the single source of truth for every exported symbol. The
 * same declarations feed the cffi extension (tirbyoc._kernels) and the
 * relocatable object (libtirbyoc_kernels.o) that TVM links into generated
 * code through T.call_extern.
 *
 * Symbol naming: tirbyoc_<op>_<dtype>[_<variant>]
 *   op       what is computed, epilogue included (dense, dense_relu, ...)
 *   dtype    element type (f32 = IEEE-754 binary32)
 *   variant  operand layout; for dense: "nt" (W is [N, K]), "nn" (W is [K, N])
 *            or "packed" (W pre-packed, see tirbyoc_pack_weight_f32_nt)
 *
 * Argument convention (every kernel):
 *   - sizes first (int64_t), then for each operand its pointer followed by its
 *     row stride (a pre-packed weight has none), output last;
 *   - matrices are row-major with unit stride inside a row; row strides
 *     (lda, ldw, ldc) count ELEMENTS, not bytes, and must be >= the row length;
 *   - optional operands (bias) may be NULL; a matrix pointer may be NULL only
 *     when that matrix has no elements;
 *   - the output must not overlap any input;
 *   - the return value is a tirbyoc_status (TIRBYOC_OK on success); on error
 *     nothing is written.
 *
 * Kernels are safe to call concurrently (from any number of threads) on
 * disjoint outputs. The only global state is the library's settings (the
 * instruction set and thread count below) and its worker pool; hot paths
 * never allocate (each thread's scratch buffer is allocated once, on its
 * first large call).
 *
 * Everything between the CDEF markers is also fed verbatim (comments
 * stripped) to cffi's cdef(): keep it free of macros and preprocessor lines.
 */
#ifndef TIRBYOC_KERNELS_H
#define TIRBYOC_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* BEGIN CDEF */

typedef enum tirbyoc_status {
    TIRBYOC_OK = 0,
    TIRBYOC_EINVAL = 1
} tirbyoc_status;

/*
 * Dense layer, float32:  C[M, N] = A[M, K] @ op(W) (+ bias[N]) (then relu).
 * A has row stride lda >= K, C has row stride ldc >= N, bias is [N]
 * contiguous or NULL. M, N, K may be 0; with K == 0 the result is the bias
 * (or 0) followed by the activation. Relu propagates NaN.
 * TIRBYOC_EINVAL: a negative size, a row stride below its row length, or a
 * NULL pointer to a matrix with elements.
 */

/* "nt": W is [N, K] (nn.Linear layout), ldw >= K.  C = A @ W^T (+ bias) */
int32_t tirbyoc_dense_f32_nt(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *w, int64_t ldw, const float *bias, float *c, int64_t ldc);
/* "nt" then relu: C = max(A @ W^T (+ bias), 0) */
int32_t tirbyoc_dense_relu_f32_nt(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *w, int64_t ldw, const float *bias, float *c, int64_t ldc);
/* "nn": W is [K, N], ldw >= N.  C = A @ W (+ bias) */
int32_t tirbyoc_dense_f32_nn(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *w, int64_t ldw, const float *bias, float *c, int64_t ldc);
/* "nn" then relu: C = max(A @ W (+ bias), 0) */
int32_t tirbyoc_dense_relu_f32_nn(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *w, int64_t ldw, const float *bias, float *c, int64_t ldc);

/*
 * Pre-packed weights. A weight that is a compile-time constant can be packed
 * once (tirbyoc_pack_weight_f32_nt / _nn) into an opaque float buffer of
 * tirbyoc_packed_weight_size_f32 floats (for N, K), which the *_packed kernels
 * then read instead of W. The layout is fixed and identical for every
 * instruction set, so a buffer packed on one machine is valid on any other:
 *
 *   column panels of TIRBYOC_PACK_NR = 16 output columns; panel q holds the
 *   columns j = 16q .. 16q+15 as K rows of 16 floats (K-major inside the
 *   panel), i.e.
 *       packed[q * 16 * K + p * 16 + r] = op(W)[p][16q + r]
 *   where op(W)[p][j] is the weight that multiplies A[:, p] into C[:, j]
 *   (W[j][p] for "nt", W[p][j] for "nn"). Columns j >= N of the last panel
 *   are zero. Size: ceil(N / 16) * 16 * K floats (0 when N or K is 0).
 *
 * For best speed the buffer should be 64-byte aligned (any float alignment
 * is correct).
 */

/* Floats in the packed buffer for an [N, K] weight; -1 on a negative size
 * or when the size does not fit in int64_t. */
int64_t tirbyoc_packed_weight_size_f32(int64_t n, int64_t k);
/* Packs W [N, K] (row stride ldw >= K) into packed (see above). */
int32_t tirbyoc_pack_weight_f32_nt(int64_t n, int64_t k, const float *w, int64_t ldw, float *packed);
/* Packs W [K, N] (row stride ldw >= N) into packed (see above). */
int32_t tirbyoc_pack_weight_f32_nn(int64_t n, int64_t k, const float *w, int64_t ldw, float *packed);
/* C = A @ op(W) (+ bias) with op(W) given packed; A and C as for nt/nn. */
int32_t tirbyoc_dense_f32_packed(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *packed, const float *bias, float *c, int64_t ldc);
/* Packed then relu: C = max(A @ op(W) (+ bias), 0) */
int32_t tirbyoc_dense_relu_f32_packed(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *packed, const float *bias, float *c, int64_t ldc);

/*
 * relu6 variants: C = min(max(A @ op(W) (+ bias), 0), 6), NaN propagated;
 * arguments as for the relu variants above.
 */
int32_t tirbyoc_dense_relu6_f32_nt(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *w, int64_t ldw, const float *bias, float *c, int64_t ldc);
int32_t tirbyoc_dense_relu6_f32_nn(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *w, int64_t ldw, const float *bias, float *c, int64_t ldc);
int32_t tirbyoc_dense_relu6_f32_packed(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *packed, const float *bias, float *c, int64_t ldc);

/*
 * Accumulating dense (for TensorIntrin tiles): C += A @ op(W), no bias, no
 * activation; arguments and checks as for nt / nn. K == 0 leaves C as is.
 */
int32_t tirbyoc_dense_acc_f32_nt(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *w, int64_t ldw, float *c, int64_t ldc);
int32_t tirbyoc_dense_acc_f32_nn(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *w, int64_t ldw, float *c, int64_t ldc);

/*
 * Settings (process-wide; every kernel reads them when it starts).
 *
 * Instruction set: "avx512" (AVX512F), "avx2" (AVX2 + FMA) or "generic"
 * (portable C). By default the best one the CPU and OS support, capped by
 * the environment variable TIRBYOC_ISA (read on first use). Results may
 * differ in the last bits between instruction sets.
 */
/* Selects an instruction set by name; TIRBYOC_EINVAL if unknown or not
 * supported here. */
int32_t tirbyoc_set_isa(const char *name);
/* Name of the active instruction set (a static string). */
const char *tirbyoc_isa(void);
/*
 * Threads: large calls are split over up to this many threads (a persistent
 * pool; a call that finds the pool busy runs on its own thread). Default:
 * TIRBYOC_NUM_THREADS, else the number of CPUs the process may run on.
 * Results do not depend on the thread count.
 */
int32_t tirbyoc_set_num_threads(int32_t n);
/* The current thread count setting. */
int32_t tirbyoc_num_threads(void);

/* END CDEF */

/* Width of a column panel of the packed weight layout. */
#define TIRBYOC_PACK_NR 16

#ifdef __cplusplus
}
#endif

#endif /* TIRBYOC_KERNELS_H */
