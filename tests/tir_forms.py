"""Hand-written TIR forms: ones tirbyoc must offload and ones it must refuse.

Each accepted form comes with the intrinsic it must become; the refused forms must come
back either unchanged or with only the named block left as TIR.
"""

from tvm.script import tirx as T

KERNEL_FAILED = "tirbyoc: kernel tirbyoc_dense_relu_f32_nt failed: "

# ---------------------------------------------------------------- accepted forms


@T.prim_func(s_tir=True)
def nt_bias_relu(A: T.Buffer((64, 80), "float32"), W: T.Buffer((50, 80), "float32"),
                 B: T.Buffer((50,), "float32"), O: T.Buffer((64, 50), "float32")):
    C = T.sblock_alloc_buffer((64, 50), "float32")
    D = T.sblock_alloc_buffer((64, 50), "float32")
    for i, j, k in T.grid(64, 50, 80):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * W[vj, vk]
    for i, j in T.grid(64, 50):
        with T.sblock("bias"):
            vi, vj = T.axis.remap("SS", [i, j])
            D[vi, vj] = C[vi, vj] + B[vj]
    for i, j in T.grid(64, 50):
        with T.sblock("relu"):
            vi, vj = T.axis.remap("SS", [i, j])
            O[vi, vj] = T.max(D[vi, vj], T.float32(0))


@T.prim_func(s_tir=True)
def nt_bias_relu_expected(A: T.Buffer((64, 80), "float32"), W: T.Buffer((50, 80), "float32"),
                          B: T.Buffer((50,), "float32"), O: T.Buffer((64, 50), "float32")):
    with T.sblock("root"):
        T.reads()
        T.writes()
        with T.sblock("tirbyoc_dense_bias_relu_mm"):
            T.reads(A[0:64, 0:80], W[0:50, 0:80], B[0:50])
            T.writes(O[0:64, 0:50])
            T.sblock_attr({"tirbyoc.intrinsic": "dense_bias_relu",
                           "tirbyoc.kernel": "tirbyoc_dense_relu_f32_nt",
                           "tirbyoc.offloaded": "mm + bias + relu -> tirbyoc_dense_relu_f32_nt"})
            status: T.let[T.int32] = T.call_extern(
                "int32", "tirbyoc_dense_relu_f32_nt", T.int64(64), T.int64(50), T.int64(80),
                # the whole of each buffer is accessed (tvm_access_ptr: data, offset,
                # extent, 1 read / 2 write)
                T.tvm_access_ptr(T.type_annotation("float32"), A.data, 0, 5120, 1), T.int64(80),
                T.tvm_access_ptr(T.type_annotation("float32"), W.data, 0, 4000, 1), T.int64(80),
                T.tvm_access_ptr(T.type_annotation("float32"), B.data, 0, 50, 1),
                T.tvm_access_ptr(T.type_annotation("float32"), O.data, 0, 3200, 2), T.int64(50))
            assert status != 1, ("RuntimeError", [f"{KERNEL_FAILED}invalid setting"])
            assert status != 2, ("RuntimeError", [
                f"{KERNEL_FAILED}a size is negative, or its buffer is too large to address"])
            assert status != 3, ("RuntimeError", [
                f"{KERNEL_FAILED}a row stride is smaller than its row length"])
            assert status != 4, ("RuntimeError", [
                f"{KERNEL_FAILED}a NULL pointer was passed for a matrix that has elements"])
            assert status != 5, ("RuntimeError", [
                f"{KERNEL_FAILED}an invalid epilogue chain (an unknown operation)"])
            assert status != 6, ("RuntimeError", [
                f"{KERNEL_FAILED}the calling thread's scratch memory could not be allocated"])
            assert status == 0, ("RuntimeError", [f"{KERNEL_FAILED}unknown status"])


@T.prim_func(s_tir=True)
def nn_bias_first_relu_max0x(A: T.Buffer((33, 7), "float32"), W: T.Buffer((7, 9), "float32"),
                             B: T.Buffer((9,), "float32"), O: T.Buffer((33, 9), "float32")):
    C = T.sblock_alloc_buffer((33, 9), "float32")
    D = T.sblock_alloc_buffer((33, 9), "float32")
    for i, j, k in T.grid(33, 9, 7):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + W[vk, vj] * A[vi, vk]
    for i, j in T.grid(33, 9):
        with T.sblock("bias"):
            vi, vj = T.axis.remap("SS", [i, j])
            D[vi, vj] = B[vj] + C[vi, vj]
    for i, j in T.grid(33, 9):
        with T.sblock("relu"):
            vi, vj = T.axis.remap("SS", [i, j])
            O[vi, vj] = T.max(T.float32(0), D[vi, vj])


@T.prim_func(s_tir=True)
def bias_1n_relu_select(A: T.Buffer((5, 6), "float32"), W: T.Buffer((4, 6), "float32"),
                        B: T.Buffer((1, 4), "float32"), O: T.Buffer((5, 4), "float32")):
    C = T.sblock_alloc_buffer((5, 4), "float32")
    D = T.sblock_alloc_buffer((5, 4), "float32")
    for i, j, k in T.grid(5, 4, 6):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * W[vj, vk]
    for i, j in T.grid(5, 4):
        with T.sblock("bias"):
            vi, vj = T.axis.remap("SS", [i, j])
            D[vi, vj] = C[vi, vj] + B[0, vj]
    for i, j in T.grid(5, 4):
        with T.sblock("relu"):
            vi, vj = T.axis.remap("SS", [i, j])
            O[vi, vj] = T.Select(D[vi, vj] > T.float32(0), D[vi, vj], T.float32(0))


@T.prim_func(s_tir=True)
def relu_if_then_else(A: T.Buffer((5, 6), "float32"), W: T.Buffer((6, 4), "float32"),
                      O: T.Buffer((5, 4), "float32")):
    C = T.sblock_alloc_buffer((5, 4), "float32")
    for i, j, k in T.grid(5, 4, 6):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * W[vk, vj]
    for i, j in T.grid(5, 4):
        with T.sblock("relu"):
            vi, vj = T.axis.remap("SS", [i, j])
            O[vi, vj] = T.if_then_else(C[vi, vj] < T.float32(0), T.float32(0), C[vi, vj])


@T.prim_func(s_tir=True)
def symbolic_rows(a: T.handle, W: T.Buffer((T.int64(12), T.int64(10)), "float32"),
                  B: T.Buffer((T.int64(12),), "float32"), o: T.handle):
    m = T.int64()
    A = T.match_buffer(a, (m, T.int64(10)), "float32")
    O = T.match_buffer(o, (m, T.int64(12)), "float32")
    C = T.sblock_alloc_buffer((m, T.int64(12)), "float32")
    for i, j, k in T.grid(m, T.int64(12), T.int64(10)):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * W[vj, vk]
    for i, j in T.grid(m, T.int64(12)):
        with T.sblock("bias"):
            vi, vj = T.axis.remap("SS", [i, j])
            O[vi, vj] = C[vi, vj] + B[vj]


@T.prim_func(s_tir=True)
def batched_rows(A: T.Buffer((2, 3, 8), "float32"), W: T.Buffer((5, 8), "float32"),
                 B: T.Buffer((5,), "float32"), O: T.Buffer((2, 3, 5), "float32")):
    C = T.sblock_alloc_buffer((2, 3, 5), "float32")
    D = T.sblock_alloc_buffer((2, 3, 5), "float32")
    for b, s, j, k in T.grid(2, 3, 5, 8):
        with T.sblock("mm"):
            vb, vs, vj, vk = T.axis.remap("SSSR", [b, s, j, k])
            with T.init():
                C[vb, vs, vj] = T.float32(0)
            C[vb, vs, vj] = C[vb, vs, vj] + A[vb, vs, vk] * W[vj, vk]
    for b, s, j in T.grid(2, 3, 5):
        with T.sblock("bias"):
            vb, vs, vj = T.axis.remap("SSS", [b, s, j])
            D[vb, vs, vj] = C[vb, vs, vj] + B[vj]
    for b, s, j in T.grid(2, 3, 5):
        with T.sblock("relu"):
            vb, vs, vj = T.axis.remap("SSS", [b, s, j])
            O[vb, vs, vj] = T.max(D[vb, vs, vj], T.float32(0))


@T.prim_func(s_tir=True)
def prefix_then_tanh(A: T.Buffer((4, 6), "float32"), W: T.Buffer((3, 6), "float32"),
                     B: T.Buffer((3,), "float32"), O: T.Buffer((4, 3), "float32")):
    C = T.sblock_alloc_buffer((4, 3), "float32")
    D = T.sblock_alloc_buffer((4, 3), "float32")
    E = T.sblock_alloc_buffer((4, 3), "float32")
    for i, j, k in T.grid(4, 3, 6):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * W[vj, vk]
    for i, j in T.grid(4, 3):
        with T.sblock("bias"):
            vi, vj = T.axis.remap("SS", [i, j])
            D[vi, vj] = C[vi, vj] + B[vj]
    for i, j in T.grid(4, 3):
        with T.sblock("relu"):
            vi, vj = T.axis.remap("SS", [i, j])
            E[vi, vj] = T.max(D[vi, vj], T.float32(0))
    for i, j in T.grid(4, 3):
        with T.sblock("tanh"):
            vi, vj = T.axis.remap("SS", [i, j])
            O[vi, vj] = T.tanh(E[vi, vj])


@T.prim_func(s_tir=True)
def prefix_then_residual(A: T.Buffer((4, 6), "float32"), W: T.Buffer((6, 6), "float32"),
                         B: T.Buffer((6,), "float32"), O: T.Buffer((4, 6), "float32")):
    C = T.sblock_alloc_buffer((4, 6), "float32")
    D = T.sblock_alloc_buffer((4, 6), "float32")
    E = T.sblock_alloc_buffer((4, 6), "float32")
    for i, j, k in T.grid(4, 6, 6):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * W[vj, vk]
    for i, j in T.grid(4, 6):
        with T.sblock("bias"):
            vi, vj = T.axis.remap("SS", [i, j])
            D[vi, vj] = C[vi, vj] + B[vj]
    for i, j in T.grid(4, 6):
        with T.sblock("relu"):
            vi, vj = T.axis.remap("SS", [i, j])
            E[vi, vj] = T.max(D[vi, vj], T.float32(0))
    for i, j in T.grid(4, 6):
        with T.sblock("residual"):
            vi, vj = T.axis.remap("SS", [i, j])
            O[vi, vj] = E[vi, vj] + A[vi, vj]


@T.prim_func(s_tir=True)
def dense_only(A: T.Buffer((7, 33), "float32"), W: T.Buffer((1, 33), "float32"),
               O: T.Buffer((7, 1), "float32")):
    for i, j, k in T.grid(7, 1, 33):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                O[vi, vj] = T.float32(0)
            O[vi, vj] = O[vi, vj] + A[vi, vk] * W[vj, vk]


@T.prim_func(s_tir=True)
def strided_rows(A: T.Buffer((6, 5), "float32", strides=(9, 1)),
                 W: T.Buffer((5, 4), "float32", strides=(7, 1)),
                 O: T.Buffer((6, 4), "float32")):
    for i, j, k in T.grid(6, 4, 5):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                O[vi, vj] = T.float32(0)
            O[vi, vj] = O[vi, vj] + A[vi, vk] * W[vk, vj]


@T.prim_func(s_tir=True)
def bias_relu6_min_max(A: T.Buffer((5, 6), "float32"), W: T.Buffer((4, 6), "float32"),
                       B: T.Buffer((4,), "float32"), O: T.Buffer((5, 4), "float32")):
    C = T.sblock_alloc_buffer((5, 4), "float32")
    D = T.sblock_alloc_buffer((5, 4), "float32")
    for i, j, k in T.grid(5, 4, 6):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * W[vj, vk]
    for i, j in T.grid(5, 4):
        with T.sblock("bias"):
            vi, vj = T.axis.remap("SS", [i, j])
            D[vi, vj] = C[vi, vj] + B[vj]
    for i, j in T.grid(5, 4):
        with T.sblock("relu6"):
            vi, vj = T.axis.remap("SS", [i, j])
            O[vi, vj] = T.min(T.float32(6), T.max(D[vi, vj], T.float32(0)))


@T.prim_func(s_tir=True)
def attention_scores(Q: T.Buffer((2, 3, 5, 4), "float32"), K: T.Buffer((2, 3, 6, 4), "float32"),
                     O: T.Buffer((2, 3, 5, 6), "float32")):
    S = T.sblock_alloc_buffer((2, 3, 5, 6), "float32")
    for b, h, i, j, k in T.grid(2, 3, 5, 6, 4):
        with T.sblock("qk"):
            vb, vh, vi, vj, vk = T.axis.remap("SSSSR", [b, h, i, j, k])
            with T.init():
                S[vb, vh, vi, vj] = T.float32(0)
            S[vb, vh, vi, vj] = S[vb, vh, vi, vj] + Q[vb, vh, vi, vk] * K[vb, vh, vj, vk]
    for b, h, i, j in T.grid(2, 3, 5, 6):
        with T.sblock("scale"):
            vb, vh, vi, vj = T.axis.remap("SSSS", [b, h, i, j])
            O[vb, vh, vi, vj] = S[vb, vh, vi, vj] / T.float32(2)


@T.prim_func(s_tir=True)
def broadcast_activation(A: T.Buffer((4, 6), "float32"), W: T.Buffer((2, 6, 3), "float32"),
                         O: T.Buffer((2, 4, 3), "float32")):
    for b, i, j, k in T.grid(2, 4, 3, 6):
        with T.sblock("bmm"):
            vb, vi, vj, vk = T.axis.remap("SSSR", [b, i, j, k])
            with T.init():
                O[vb, vi, vj] = T.float32(0)
            O[vb, vi, vj] = O[vb, vi, vj] + A[vi, vk] * W[vb, vk, vj]


@T.prim_func(s_tir=True)
def bias_gelu_erf(A: T.Buffer((4, 6), "float32"), W: T.Buffer((6, 5), "float32"),
                  B: T.Buffer((5,), "float32"), O: T.Buffer((4, 5), "float32")):
    C = T.sblock_alloc_buffer((4, 5), "float32")
    D = T.sblock_alloc_buffer((4, 5), "float32")
    H = T.sblock_alloc_buffer((4, 5), "float32")
    E = T.sblock_alloc_buffer((4, 5), "float32")
    F = T.sblock_alloc_buffer((4, 5), "float32")
    for i, j, k in T.grid(4, 5, 6):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * W[vk, vj]
    for i, j in T.grid(4, 5):
        with T.sblock("bias"):
            vi, vj = T.axis.remap("SS", [i, j])
            D[vi, vj] = C[vi, vj] + B[vj]
    for i, j in T.grid(4, 5):
        with T.sblock("half"):
            vi, vj = T.axis.remap("SS", [i, j])
            H[vi, vj] = D[vi, vj] * T.float32(0.5)
    for i, j in T.grid(4, 5):
        with T.sblock("erf"):
            vi, vj = T.axis.remap("SS", [i, j])
            E[vi, vj] = T.erf(D[vi, vj] * T.float32(0.70710678118654757))
    for i, j in T.grid(4, 5):
        with T.sblock("one_plus"):
            vi, vj = T.axis.remap("SS", [i, j])
            F[vi, vj] = T.float32(1) + E[vi, vj]
    for i, j in T.grid(4, 5):
        with T.sblock("gelu"):
            vi, vj = T.axis.remap("SS", [i, j])
            O[vi, vj] = H[vi, vj] * F[vi, vj]


def _gelu_tanh_pow(cube_factor):
    """Dense + bias, then the tanh GELU as HF GPT-2 writes it (x used three times, its
    cube a ``pow``, float32 constants) with ``cube_factor`` in place of 0.044715."""

    @T.prim_func(s_tir=True)
    def func(A: T.Buffer((4, 6), "float32"), W: T.Buffer((6, 5), "float32"),
             B: T.Buffer((5,), "float32"), O: T.Buffer((4, 5), "float32")):
        C = T.sblock_alloc_buffer((4, 5), "float32")
        D = T.sblock_alloc_buffer((4, 5), "float32")
        P = T.sblock_alloc_buffer((4, 5), "float32")
        E = T.sblock_alloc_buffer((4, 5), "float32")
        for i, j, k in T.grid(4, 5, 6):
            with T.sblock("mm"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    C[vi, vj] = T.float32(0)
                C[vi, vj] = C[vi, vj] + A[vi, vk] * W[vk, vj]
        for i, j in T.grid(4, 5):
            with T.sblock("bias"):
                vi, vj = T.axis.remap("SS", [i, j])
                D[vi, vj] = C[vi, vj] + B[vj]
        for i, j in T.grid(4, 5):
            with T.sblock("cube"):
                vi, vj = T.axis.remap("SS", [i, j])
                P[vi, vj] = T.pow(D[vi, vj], T.float32(3.0))
        for i, j in T.grid(4, 5):
            with T.sblock("inner"):
                vi, vj = T.axis.remap("SS", [i, j])
                E[vi, vj] = T.float32(0.7978845608) * (D[vi, vj] + P[vi, vj] * cube_factor)
        for i, j in T.grid(4, 5):
            with T.sblock("gelu"):
                vi, vj = T.axis.remap("SS", [i, j])
                O[vi, vj] = D[vi, vj] * T.float32(0.5) * (T.float32(1) + T.tanh(E[vi, vj]))

    return func


gelu_tanh_pow = _gelu_tanh_pow(T.float32(0.044715))
gelu_tanh_wrong_cube = _gelu_tanh_pow(T.float32(0.046))


@T.prim_func(s_tir=True)
def silu_residual(A: T.Buffer((4, 6), "float32"), W: T.Buffer((5, 6), "float32"),
                  Rs: T.Buffer((4, 5), "float32"), O: T.Buffer((4, 5), "float32")):
    C = T.sblock_alloc_buffer((4, 5), "float32")
    G = T.sblock_alloc_buffer((4, 5), "float32")
    D = T.sblock_alloc_buffer((4, 5), "float32")
    for i, j, k in T.grid(4, 5, 6):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * W[vj, vk]
    for i, j in T.grid(4, 5):
        with T.sblock("sig"):
            vi, vj = T.axis.remap("SS", [i, j])
            G[vi, vj] = T.sigmoid(C[vi, vj])
    for i, j in T.grid(4, 5):
        with T.sblock("silu"):
            vi, vj = T.axis.remap("SS", [i, j])
            D[vi, vj] = C[vi, vj] * G[vi, vj]
    for i, j in T.grid(4, 5):
        with T.sblock("residual"):
            vi, vj = T.axis.remap("SS", [i, j])
            O[vi, vj] = Rs[vi, vj] + D[vi, vj]


@T.prim_func(s_tir=True)
def inner_batch_broadcast(A: T.Buffer((2, 3, 4, 6), "float32"),
                          W: T.Buffer((1, 3, 6, 5), "float32"),
                          O: T.Buffer((2, 3, 4, 5), "float32")):
    for b, h, i, j, k in T.grid(2, 3, 4, 5, 6):
        with T.sblock("bmm"):
            vb, vh, vi, vj, vk = T.axis.remap("SSSSR", [b, h, i, j, k])
            with T.init():
                O[vb, vh, vi, vj] = T.float32(0)
            O[vb, vh, vi, vj] = O[vb, vh, vi, vj] + A[vb, vh, vi, vk] * W[0, vh, vk, vj]


@T.prim_func(s_tir=True)
def gelu_wrong_constant(A: T.Buffer((4, 6), "float32"), W: T.Buffer((6, 5), "float32"),
                        O: T.Buffer((4, 5), "float32")):
    C = T.sblock_alloc_buffer((4, 5), "float32")
    for i, j, k in T.grid(4, 5, 6):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * W[vk, vj]
    for i, j in T.grid(4, 5):
        with T.sblock("almost_gelu"):
            vi, vj = T.axis.remap("SS", [i, j])
            O[vi, vj] = C[vi, vj] * T.float32(0.5) * (T.float32(1) + T.erf(C[vi, vj]
                                                                           * T.float32(0.7)))


@T.prim_func(s_tir=True)
def two_biases(A: T.Buffer((4, 6), "float32"), W: T.Buffer((6, 5), "float32"),
               B: T.Buffer((5,), "float32"), B2: T.Buffer((5,), "float32"),
               O: T.Buffer((4, 5), "float32")):
    C = T.sblock_alloc_buffer((4, 5), "float32")
    D = T.sblock_alloc_buffer((4, 5), "float32")
    E = T.sblock_alloc_buffer((4, 5), "float32")
    for i, j, k in T.grid(4, 5, 6):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * W[vk, vj]
    for i, j in T.grid(4, 5):
        with T.sblock("bias"):
            vi, vj = T.axis.remap("SS", [i, j])
            D[vi, vj] = C[vi, vj] + B[vj]
    for i, j in T.grid(4, 5):
        with T.sblock("gelu"):
            vi, vj = T.axis.remap("SS", [i, j])
            E[vi, vj] = T.tanh(D[vi, vj])
    for i, j in T.grid(4, 5):
        with T.sblock("bias2"):
            vi, vj = T.axis.remap("SS", [i, j])
            O[vi, vj] = E[vi, vj] + B2[vj]


@T.prim_func(s_tir=True)
def bias_hardswish_clips(A: T.Buffer((4, 6), "float32"), W: T.Buffer((6, 5), "float32"),
                         B: T.Buffer((5,), "float32"), O: T.Buffer((4, 5), "float32")):
    # PyTorch's hardswish as TVM legalizes it: v * clip(clip(v + 3, 0, inf), -inf, 6) / 6
    C = T.sblock_alloc_buffer((4, 5), "float32")
    D = T.sblock_alloc_buffer((4, 5), "float32")
    E = T.sblock_alloc_buffer((4, 5), "float32")
    F = T.sblock_alloc_buffer((4, 5), "float32")
    G = T.sblock_alloc_buffer((4, 5), "float32")
    H = T.sblock_alloc_buffer((4, 5), "float32")
    for i, j, k in T.grid(4, 5, 6):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * W[vk, vj]
    for i, j in T.grid(4, 5):
        with T.sblock("bias"):
            vi, vj = T.axis.remap("SS", [i, j])
            D[vi, vj] = C[vi, vj] + B[vj]
    for i, j in T.grid(4, 5):
        with T.sblock("plus3"):
            vi, vj = T.axis.remap("SS", [i, j])
            E[vi, vj] = D[vi, vj] + T.float32(3)
    for i, j in T.grid(4, 5):
        with T.sblock("clip_low"):
            vi, vj = T.axis.remap("SS", [i, j])
            F[vi, vj] = T.max(T.min(E[vi, vj], T.float32("inf")), T.float32(0))
    for i, j in T.grid(4, 5):
        with T.sblock("clip_high"):
            vi, vj = T.axis.remap("SS", [i, j])
            G[vi, vj] = T.max(T.min(F[vi, vj], T.float32(6)), T.float32("-inf"))
    for i, j in T.grid(4, 5):
        with T.sblock("times"):
            vi, vj = T.axis.remap("SS", [i, j])
            H[vi, vj] = D[vi, vj] * G[vi, vj]
    for i, j in T.grid(4, 5):
        with T.sblock("sixth"):
            vi, vj = T.axis.remap("SS", [i, j])
            O[vi, vj] = H[vi, vj] / T.float32(6)


@T.prim_func(s_tir=True)
def onnx_hardsigmoid(A: T.Buffer((4, 6), "float32"), W: T.Buffer((5, 6), "float32"),
                     O: T.Buffer((4, 5), "float32")):
    # ONNX HardSigmoid(alpha=1/6, beta=0.5) as TVM imports it: clip(alpha * v + 0.5, 0, 1),
    # alpha the float32 nearest 1/6
    C = T.sblock_alloc_buffer((4, 5), "float32")
    for i, j, k in T.grid(4, 5, 6):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * W[vj, vk]
    for i, j in T.grid(4, 5):
        with T.sblock("hardsigmoid"):
            vi, vj = T.axis.remap("SS", [i, j])
            O[vi, vj] = T.max(T.min(T.float32(0.1666666716337204) * C[vi, vj] + T.float32(0.5),
                                    T.float32(1)), T.float32(0))


def _hardswish_plus(tent_height, shift=3.0):
    @T.prim_func(s_tir=True)
    def func(A: T.Buffer((4, 6), "float32"), W: T.Buffer((6, 5), "float32"),
             O: T.Buffer((4, 5), "float32")):
        C = T.sblock_alloc_buffer((4, 5), "float32")
        for i, j, k in T.grid(4, 5, 6):
            with T.sblock("mm"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    C[vi, vj] = T.float32(0)
                C[vi, vj] = C[vi, vj] + A[vi, vk] * W[vk, vj]
        for i, j in T.grid(4, 5):
            with T.sblock("almost_hardswish"):
                vi, vj = T.axis.remap("SS", [i, j])
                O[vi, vj] = C[vi, vj] * T.max(T.min(C[vi, vj] + T.float32(shift),
                                                    T.float32(6)), T.float32(0)) / \
                    T.float32(6) + T.float32(tent_height) * T.max(
                        T.float32(0), T.min(C[vi, vj] - T.float32(3.03),
                                            T.float32(3.05) - C[vi, vj]))
    return func


# hardswish plus a tent on [3.03, 3.05], between two probe points (3.0 and 3.1): equal to
# hardswish at every probe, not on the line; its kinks give it away
hardswish_tent = _hardswish_plus(1000.0)
hardswish_shifted = _hardswish_plus(0.0, shift=2.5)


# (name, function, intrinsic names in order, names of blocks that must stay TIR)
ACCEPTED = [
    ("nt_bias_relu", nt_bias_relu, ["dense_bias_relu"], []),
    ("nn_bias_first_relu_max0x", nn_bias_first_relu_max0x, ["dense_bias_relu"], []),
    ("bias_1n_relu_select", bias_1n_relu_select, ["dense_bias_relu"], []),
    ("relu_if_then_else", relu_if_then_else, ["dense_relu"], []),
    ("symbolic_rows", symbolic_rows, ["dense_bias"], []),
    ("batched_rows", batched_rows, ["dense_bias_relu"], []),
    ("prefix_then_tanh", prefix_then_tanh, ["dense_bias_relu_tanh"], []),
    ("prefix_then_residual", prefix_then_residual, ["dense_bias_relu_residual"], []),
    ("dense_only", dense_only, ["dense"], []),
    ("strided_rows", strided_rows, ["dense"], []),
    ("bias_relu6_min_max", bias_relu6_min_max, ["dense_bias_relu6"], []),
    ("attention_scores", attention_scores, ["batch_matmul_divide"], []),
    ("broadcast_activation", broadcast_activation, ["batch_matmul"], []),
    ("bias_gelu_erf", bias_gelu_erf, ["dense_bias_gelu_erf"], []),
    ("gelu_tanh_pow", gelu_tanh_pow, ["dense_bias_gelu_tanh"], []),
    ("silu_residual", silu_residual, ["dense_silu_residual"], []),
    ("bias_hardswish_clips", bias_hardswish_clips, ["dense_bias_hardswish"], []),
    ("onnx_hardsigmoid", onnx_hardsigmoid, ["dense_hardsigmoid"], []),
]

# ---------------------------------------------------------------- refused forms


@T.prim_func(s_tir=True)
def extra_scale(A: T.Buffer((4, 6), "float32"), W: T.Buffer((3, 6), "float32"),
                O: T.Buffer((4, 3), "float32")):
    for i, j, k in T.grid(4, 3, 6):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                O[vi, vj] = T.float32(0)
            O[vi, vj] = O[vi, vj] + A[vi, vk] * W[vj, vk] * T.float32(0.5)


@T.prim_func(s_tir=True)
def float16_dense(A: T.Buffer((4, 6), "float16"), W: T.Buffer((3, 6), "float16"),
                  O: T.Buffer((4, 3), "float16")):
    for i, j, k in T.grid(4, 3, 6):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                O[vi, vj] = T.float16(0)
            O[vi, vj] = O[vi, vj] + A[vi, vk] * W[vj, vk]


@T.prim_func(s_tir=True)
def inner_stride(A: T.Buffer((4, 6), "float32", strides=(12, 2)), W: T.Buffer((3, 6), "float32"),
                 O: T.Buffer((4, 3), "float32")):
    for i, j, k in T.grid(4, 3, 6):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                O[vi, vj] = T.float32(0)
            O[vi, vj] = O[vi, vj] + A[vi, vk] * W[vj, vk]


@T.prim_func(s_tir=True)
def batched_weight(A: T.Buffer((2, 4, 6), "float32"), W: T.Buffer((2, 6, 3), "float32"),
                   O: T.Buffer((2, 4, 3), "float32")):
    for b, i, j, k in T.grid(2, 4, 3, 6):
        with T.sblock("bmm"):
            vb, vi, vj, vk = T.axis.remap("SSSR", [b, i, j, k])
            with T.init():
                O[vb, vi, vj] = T.float32(0)
            O[vb, vi, vj] = O[vb, vi, vj] + A[vb, vi, vk] * W[vb, vk, vj]


@T.prim_func(s_tir=True)
def nonzero_init(A: T.Buffer((4, 6), "float32"), W: T.Buffer((3, 6), "float32"),
                 O: T.Buffer((4, 3), "float32")):
    for i, j, k in T.grid(4, 3, 6):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                O[vi, vj] = T.float32(1)
            O[vi, vj] = O[vi, vj] + A[vi, vk] * W[vj, vk]


@T.prim_func(s_tir=True)
def transposed_activation(A: T.Buffer((6, 4), "float32"), W: T.Buffer((3, 6), "float32"),
                          O: T.Buffer((4, 3), "float32")):
    for i, j, k in T.grid(4, 3, 6):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                O[vi, vj] = T.float32(0)
            O[vi, vj] = O[vi, vj] + A[vk, vi] * W[vj, vk]


@T.prim_func(s_tir=True)
def max_not_zero(A: T.Buffer((4, 6), "float32"), W: T.Buffer((3, 6), "float32"),
                 B: T.Buffer((3,), "float32"), O: T.Buffer((4, 3), "float32")):
    C = T.sblock_alloc_buffer((4, 3), "float32")
    D = T.sblock_alloc_buffer((4, 3), "float32")
    for i, j, k in T.grid(4, 3, 6):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * W[vj, vk]
    for i, j in T.grid(4, 3):
        with T.sblock("bias"):
            vi, vj = T.axis.remap("SS", [i, j])
            D[vi, vj] = C[vi, vj] + B[vj]
    for i, j in T.grid(4, 3):
        with T.sblock("clamp"):
            vi, vj = T.axis.remap("SS", [i, j])
            O[vi, vj] = T.max(D[vi, vj], T.float32(0.5))


@T.prim_func(s_tir=True)
def bias_by_row(A: T.Buffer((4, 6), "float32"), W: T.Buffer((4, 6), "float32"),
                B: T.Buffer((4,), "float32"), O: T.Buffer((4, 4), "float32")):
    C = T.sblock_alloc_buffer((4, 4), "float32")
    for i, j, k in T.grid(4, 4, 6):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * W[vj, vk]
    for i, j in T.grid(4, 4):
        with T.sblock("row_bias"):
            vi, vj = T.axis.remap("SS", [i, j])
            O[vi, vj] = C[vi, vj] + B[vi]


@T.prim_func(s_tir=True)
def scaled_epilogue(A: T.Buffer((4, 6), "float32"), W: T.Buffer((3, 6), "float32"),
                    B: T.Buffer((3,), "float32"), O: T.Buffer((4, 3), "float32")):
    C = T.sblock_alloc_buffer((4, 3), "float32")
    for i, j, k in T.grid(4, 3, 6):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * W[vj, vk]
    for i, j in T.grid(4, 3):
        with T.sblock("scaled_bias"):
            vi, vj = T.axis.remap("SS", [i, j])
            O[vi, vj] = C[vi, vj] * T.float32(2) + B[vj]


@T.prim_func(s_tir=True)
def intermediate_read_twice(A: T.Buffer((4, 6), "float32"), W: T.Buffer((3, 6), "float32"),
                            B: T.Buffer((3,), "float32"), O: T.Buffer((4, 3), "float32"),
                            P: T.Buffer((4, 3), "float32")):
    C = T.sblock_alloc_buffer((4, 3), "float32")
    for i, j, k in T.grid(4, 3, 6):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * W[vj, vk]
    for i, j in T.grid(4, 3):
        with T.sblock("bias"):
            vi, vj = T.axis.remap("SS", [i, j])
            O[vi, vj] = C[vi, vj] + B[vj]
    for i, j in T.grid(4, 3):
        with T.sblock("copy"):
            vi, vj = T.axis.remap("SS", [i, j])
            P[vi, vj] = C[vi, vj]


@T.prim_func(s_tir=True)
def bias_is_the_product(A: T.Buffer((1, 6), "float32"), W: T.Buffer((3, 6), "float32"),
                        O: T.Buffer((1, 3), "float32")):
    C = T.sblock_alloc_buffer((1, 3), "float32")
    for i, j, k in T.grid(1, 3, 6):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * W[vj, vk]
    for i, j in T.grid(1, 3):
        with T.sblock("double"):
            vi, vj = T.axis.remap("SS", [i, j])
            O[vi, vj] = C[vi, vj] + C[0, vj]


@T.prim_func(s_tir=True)
def clamp_to_five(A: T.Buffer((4, 6), "float32"), W: T.Buffer((3, 6), "float32"),
                  O: T.Buffer((4, 3), "float32")):
    C = T.sblock_alloc_buffer((4, 3), "float32")
    for i, j, k in T.grid(4, 3, 6):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * W[vj, vk]
    for i, j in T.grid(4, 3):
        with T.sblock("clamp5"):
            vi, vj = T.axis.remap("SS", [i, j])
            O[vi, vj] = T.max(T.min(C[vi, vj], T.float32(5)), T.float32(0))


# Forms whose every block must come back unchanged: (name, function, reason fragment)
REFUSED = [
    ("extra_scale", extra_scale, "extra factor"),
    ("float16_dense", float16_dense, "dtype float16"),
    ("inner_stride", inner_stride, "non-unit inner stride"),
    ("inner_batch_broadcast", inner_batch_broadcast, "do not collapse"),
    ("nonzero_init", nonzero_init, "non-zero value"),
    ("transposed_activation", transposed_activation, "A[rows.., k]"),
]

# (a form that was refused before the matmul family took batched weights)
ACCEPTED.append(("batched_weight", batched_weight, ["batch_matmul"], []))

# Forms where the dense part is offloaded but one epilogue block must stay as it was:
# (name, function, intrinsic, block that stays, reason fragment)
PARTIAL = [
    ("max_not_zero", max_not_zero, "dense_bias", "clamp", "max(x, 0.5) is not relu"),
    ("bias_by_row", bias_by_row, "dense", "row_bias", "indexed by the row"),
    ("scaled_epilogue", scaled_epilogue, "dense", "scaled_bias", "bias"),
    ("intermediate_read_twice", intermediate_read_twice, "dense", "bias",
     "more than one consumer"),
    ("bias_is_the_product", bias_is_the_product, "dense", "double", "the region writes"),
    ("clamp_to_five", clamp_to_five, "dense", "clamp5", "clamp to [0, 5] is not relu6"),
    ("gelu_wrong_constant", gelu_wrong_constant, "dense", "almost_gelu",
     "no unary operation the kernel has"),
    ("gelu_tanh_wrong_cube", gelu_tanh_wrong_cube, "dense_bias", "gelu",
     "no unary operation the kernel has"),
    ("two_biases", two_biases, "dense_bias_tanh", "bias2", "a second bias"),
    ("hardswish_tent", hardswish_tent, "dense", "almost_hardswish",
     "no unary operation the kernel has"),
    ("hardswish_shifted", hardswish_shifted, "dense", "almost_hardswish",
     "no unary operation the kernel has"),
]
