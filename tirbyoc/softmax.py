"""Softmax over the last axis as one kernel call (``tirbyoc_softmax_f32``).

``R.nn.softmax(x, axis=-1)`` on float32 (the attention scores of every transformer) is
replaced, before legalization, by a ``call_tir`` of a PrimFunc whose only block calls
the kernel: the rows' maxima and sums in vector lanes, ``exp`` vectorized, rows over
the kernel library's threads, for any sequence length (a symbolic one included, where
TVM's own schedule has to keep the row sums scalar). The semantics are the operator's
own, so nothing is matched from loops: softmax over another axis, or another dtype,
stays with TVM. Ops around the softmax (a mask before it, a fix-up after it) are fused
and scheduled as usual.

The PrimFunc's block carries the same annotation as the kernel blocks of matched
regions, so ``offloaded_kernels``, ``explain`` and the fallback rules treat it alike.
"""

from __future__ import annotations

from . import _tvm as T
from .bindings import rewrite_relax_functions
from .normalize import INTRINSIC_ATTR, OFFLOADED_ATTR

R = T.relax_ns
SYMBOL = "tirbyoc_softmax_f32"
INTRINSIC = "softmax"


def _rows(rank: int):
    """``(x, y, rows, cols)``: the buffers of a rank-``rank`` softmax of any (symbolic)
    shape, and its rows (the leading dimensions' product) and row length."""
    dims = [T.Var(f"d{i}", "int64") for i in range(rank)]
    x = T.decl_buffer(dims, "float32", "x")
    y = T.decl_buffer(dims, "float32", "y")
    rows = T.const(1, "int64")
    for d in dims[:-1]:
        rows = rows * d
    return x, y, rows, dims[-1]


def _kernel_func(rank: int):
    """PrimFunc ``(X, Y)`` for a rank-``rank`` float32 tensor of any (symbolic) shape:
    ``Y = softmax(X, axis=-1)`` through the kernel."""
    from .calls import status_checks

    x, y, rows, n = _rows(rank)
    call = T.call_extern("int32", SYMBOL, [rows, n, T.buffer_pointer(x, "r"), n,
                                            T.buffer_pointer(y, "w"), n])
    block = T.make_block("tirbyoc_softmax", status_checks(SYMBOL, call),
                         reads=[T.full_region(x)], writes=[T.full_region(y)],
                         annotations={OFFLOADED_ATTR: SYMBOL, INTRINSIC_ATTR: INTRINSIC})
    root = T.make_block("root", T.make_realize(block), reads=[], writes=[], annotations={})
    func = T.prim_func_of([x, y], T.make_realize(root))
    return func.with_attr("tirx.noalias", True)


def _softmax_rank(call) -> int | None:
    """The rank of a float32 softmax over the last axis, else None."""
    ty = getattr(call.args[0], "ty", None)
    if not isinstance(ty, R.TensorType) or ty.dtype != "float32" or ty.ndim < 1:
        return None
    axis = int(call.attrs.axis)
    return ty.ndim if axis in (-1, ty.ndim - 1) else None


def _declared_func(kernel, rank: int):
    """A declared softmax kernel's PrimFunc for rank-``rank`` tensors (dense rows)."""
    x, y, rows, cols = _rows(rank)
    return kernel.prim_func([("x", x)], ("y", y), {"rows": rows, "cols": cols})


def _declared(kernels, call):
    """The first declared kernel that takes this softmax (its constraints hold)."""
    shape = call.args[0].ty.shape
    dims = list(shape.values) if hasattr(shape, "values") else None
    if dims is None:
        return None
    ints = [int(d.value) if isinstance(d, T.IntImm) else None for d in dims]
    rows = None if None in ints[:-1] else int(__import__("math").prod(ints[:-1]))
    for kernel in kernels:
        if kernel.op.violation({"rows": rows, "cols": ints[-1]}) is None:
            return kernel
    return None


def offload_softmax(mod, kernels=(), builtin=True, passes=None):  # noqa: ARG001
    """``mod`` with every float32 ``R.nn.softmax`` over the last axis a kernel call (a
    new module; one PrimFunc per rank, shared by every call of that rank): the first of
    the declared ``kernels`` (``tirbyoc.Library``) that takes it, else (``builtin``)
    the built-in kernel."""
    dpl = T.dpl()
    pattern = dpl.is_op("relax.nn.softmax")(dpl.wildcard())
    gvars = {}

    def rewrite(func, builder):
        def rewriter(expr, _matches):
            # NOTE: rewrite_call also hands over the variables bound to matches it left
            rank = _softmax_rank(expr) if isinstance(expr, R.Call) else None
            if rank is None:
                return expr
            kernel = _declared(kernels, expr)
            if kernel is not None:
                key = (kernel.name, rank)
                if key not in gvars:
                    gvars[key] = builder.add_func(_declared_func(kernel, rank),
                                                  f"{kernel.library.name}_{kernel.symbol}")
                return R.call_tir(gvars[key], [expr.args[0]], expr.args[0].ty)
            if not builtin:
                return expr
            if rank not in gvars:  # a typed GlobalVar, as call_tir needs
                gvars[rank] = builder.add_func(_kernel_func(rank),
                                               f"tirbyoc_softmax_rank{rank}")
            return R.call_tir(gvars[rank], [expr.args[0]], expr.args[0].ty)

        return dpl.rewrite_call(pattern, rewriter, func)

    return rewrite_relax_functions(mod, rewrite)
