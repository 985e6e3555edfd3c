"""tirbyoc's dense kernel as an ``s_tir.TensorIntrin``, for hand-written schedules.

    sch = s_tir.Schedule(func)
    name = tirbyoc.dense_intrin(m, n, k, layout="nt")      # registered once per shape
    ...                                                    # tile so a loop nest is m x n x k
    sch.tensorize(loop, name)

or, for a whole dense block of any (static) shape::

    tirbyoc.tensorize_dense(sch, "matmul")

The intrinsic describes an accumulating tile ``C[m, n] += A[m, k] * W`` (W read as
``W[n, k]`` for ``nt`` or ``W[k, n]`` for ``nn``, any row strides) and calls the
accumulating kernel ``tirbyoc_dense_acc_f32_{nt,nn}``, so tiling K into several
tensorized steps stays correct.
"""

from __future__ import annotations

from . import _tvm as T
from .matcher import match_dense
from .normalize import normalize
from .calls import status_checks

_REGISTERED: set = set()


def _intrin_funcs(m: int, n: int, k: int, layout: str):
    from tvm.script import tirx as S

    nt = layout == "nt"
    w_shape = (n, k) if nt else (k, n)
    symbol = f"tirbyoc_dense_acc_f32_{layout}"

    @S.prim_func(s_tir=True)
    def desc(a: S.handle, w: S.handle, c: S.handle):
        A = S.match_buffer(a, (m, k), "float32", offset_factor=1)
        W = S.match_buffer(w, w_shape, "float32", offset_factor=1)
        C = S.match_buffer(c, (m, n), "float32", offset_factor=1)
        with S.sblock("root"):
            S.reads(C[0:m, 0:n], A[0:m, 0:k], W[0:w_shape[0], 0:w_shape[1]])
            S.writes(C[0:m, 0:n])
            for i, j, kk in S.grid(m, n, k):
                with S.sblock("update"):
                    vi, vj, vk = S.axis.remap("SSR", [i, j, kk])
                    # A Python bool: the parser keeps only the branch taken.
                    if nt:
                        C[vi, vj] = C[vi, vj] + A[vi, vk] * W[vj, vk]
                    else:
                        C[vi, vj] = C[vi, vj] + A[vi, vk] * W[vk, vj]

    @S.prim_func(s_tir=True)
    def impl(a: S.handle, w: S.handle, c: S.handle):
        sa = S.int32()
        sw = S.int32()
        sc = S.int32()
        A = S.match_buffer(a, (m, k), "float32", offset_factor=1, strides=[sa, 1])
        W = S.match_buffer(w, w_shape, "float32", offset_factor=1, strides=[sw, 1])
        C = S.match_buffer(c, (m, n), "float32", offset_factor=1, strides=[sc, 1])
        with S.sblock("root"):
            S.reads(C[0:m, 0:n], A[0:m, 0:k], W[0:w_shape[0], 0:w_shape[1]])
            S.writes(C[0:m, 0:n])
            S.evaluate(S.call_extern(
                "int32", symbol, S.int64(m), S.int64(n), S.int64(k),
                A.access_ptr("r"), S.Cast("int64", sa), W.access_ptr("r"), S.Cast("int64", sw),
                C.access_ptr("rw"), S.Cast("int64", sc)))

    return desc, _checking_status(impl, symbol)


def _checking_status(impl, symbol: str):
    """``impl`` with its kernel call's status checked, as in offloaded blocks."""
    root = impl.body.block
    checked = T.make_block(root.name_hint, status_checks(symbol, root.body.value), root.reads,
                           root.writes, root.annotations, root.iter_vars, root.init,
                           root.alloc_buffers, root.match_buffers)
    return T.make_prim_func(impl, impl.params, T.make_realize(checked))


def dense_intrin(m: int, n: int, k: int, layout: str = "nt") -> str:
    """The name of the TensorIntrin for an ``m x n x k`` accumulating dense tile
    (registered on first use)."""
    if layout not in ("nt", "nn"):
        raise ValueError(f"layout must be 'nt' or 'nn', got {layout!r}")
    if min(m, n, k) < 1:
        raise ValueError(f"tile sizes must be >= 1, got {m}x{n}x{k}")
    name = f"tirbyoc_dense_acc_f32_{layout}_{m}x{n}x{k}"
    if name not in _REGISTERED:
        desc, impl = _intrin_funcs(m, n, k, layout)
        T.TensorIntrin.register(name, desc, impl, override=True)
        _REGISTERED.add(name)
    return name


def tensorize_dense(sch, block) -> str:
    """Tensorize a whole (unscheduled, 2-D, static-shape, float32) dense block of ``sch``
    to the kernel: decompose its init, then tensorize its loop nest. Returns the intrinsic
    name; raises ValueError with the reason when the block is not such a dense."""
    block_rv = sch.get_sblock(block) if isinstance(block, str) else block
    name = sch.get(block_rv).name_hint
    normal = normalize(sch.mod["main"])
    nest = next((n for n in normal.nests if n.block is not None and n.name == name), None)
    if nest is None:
        raise ValueError(f"block {name} is not a top-level loop nest of the function")
    dense = match_dense(nest, {"float32"})
    if not dense:
        raise ValueError(f"block {name} is not a dense tirbyoc can run: {dense.reason}")
    if len(dense.rows) != 1:
        raise ValueError(f"block {name} has {len(dense.rows)} row dimensions; tensorize "
                         "expects a 2-D dense (offload it with apply_tir_byoc instead)")
    sizes = []
    for extent in (dense.m, dense.n, dense.k):
        if not isinstance(extent, T.IntImm):
            raise ValueError(f"block {name} has a symbolic extent {extent}; tensorize needs "
                             "static sizes (apply_tir_byoc handles symbolic ones)")
        sizes.append(int(extent.value))
    if 1 in sizes:
        # NOTE: TVM simplifies a unit loop out of the block binding, and the tile no
        # longer matches the intrinsic's description.
        raise ValueError(f"block {name} has a dimension of size 1; tensorize needs every "
                         "dimension > 1 (apply_tir_byoc offloads it)")
    prod = nest.store.value.b if isinstance(nest.store.value.b, T.Mul) else nest.store.value.a
    if not prod.a.source.same_as(dense.a):
        raise ValueError(f"block {name} multiplies W * A; the intrinsic's description is "
                         "written A * W, and tensorize compares them as written")
    intrin = dense_intrin(*sizes, layout=dense.layout)
    loops = sch.get_loops(block_rv)
    sch.decompose_reduction(block_rv, loops[0])
    sch.tensorize(loops[0], intrin)
    return intrin
