"""Grouped matrix products: the experts of a mixture-of-experts layer.

``transformers`` (5.x) runs its experts by default as one grouped product: the routed
rows sorted by expert, then ``y[offsets[e-1]:offsets[e]] = x[offsets[e-1]:offsets[e]]
@ w[e]`` for every expert ``e`` (``transformers.grouped_mm_fallback``, a custom op that
``torch.export`` keeps). TVM's PyTorch frontend has no converter for it.

``grouped_matmul(x, w, offsets)`` is its definition as a TE computation: ``x`` [S, K],
``w`` [E, K, N], ``offsets`` [E] (integers, nondecreasing: where each expert's rows end,
as ``cumsum`` of the rows per expert gives); row ``s`` belongs to expert ``e(s)`` = the
number of offsets ``<= s``, and a row past the last offset is zero. It compiles anywhere
(TVM schedules it like any PrimFunc), one row at a time: slow, but right.
``tirbyoc.torch_converters()`` converts the custom op to a call of it.

``offload_grouped`` finds the calls of exactly that definition (the PrimFunc a call
passes is compared with the definition rebuilt for its shapes) and makes each one loop
over the experts calling a matrix kernel on each expert's rows, which the kernels
parallelize; the weight is read in place, or through the transpose it was made from
(``w`` as ``permute_dims(w_t, [0, 2, 1])``, which is how ``transformers`` passes its
``[E, N, K]`` parameters). The kernel is the first declared ``matmul`` kernel of the
compile's libraries with no epilogue and no constraint on its sizes that takes the
weight through its transpose ("nt") or as it is ("nn"), else the built-in
``tirbyoc_matmul_f32``, for which a constant weight is packed at compile time, each
expert's into its panels. Offsets that decrease, or pass the
rows, stop the call with an error naming them (the definition would silently assign the
rows otherwise).
"""

from __future__ import annotations

from . import _tvm as T
from .bindings import call_args, rewrite_bindings, rewrite_relax_functions, shape_of, tir_dims
from .normalize import INTRINSIC_ATTR, LIBRARY_ATTR, NOTES_ATTR, OFFLOADED_ATTR

R = T.relax_ns
NAME = "grouped_matmul"
INTRINSIC = "grouped_matmul"


def grouped_matmul(x, w, offsets):
    """TE: ``y[s] = x[s] @ w[e(s)]`` (see the module docstring)."""
    from tvm import te, tirx

    rows, k_dim = x.shape
    experts, _, n_dim = w.shape
    j = te.reduce_axis((0, experts), "j")
    group = te.compute(
        (rows,), lambda s: te.sum(tirx.Select(
            offsets[j].astype("int64") <= s.astype("int64"), tirx.const(1, "int32"),
            tirx.const(0, "int32")), axis=j), name="group")
    k = te.reduce_axis((0, k_dim), "k")
    last = tirx.const(int(experts) - 1, "int32")
    prod = te.compute(
        (rows, n_dim), lambda s, n: te.sum(
            x[s, k] * w[tirx.min(group[s], last), k, n], axis=k), name="products")
    return te.compute(
        (rows, n_dim), lambda s, n: tirx.Select(
            group[s] <= last, prod[s, n], tirx.const(0, x.dtype)), name=NAME)


def emit_grouped_matmul(builder, x, w, offsets):
    """Emit a call of the definition (``builder``: the importer's BlockBuilder)."""
    return builder.emit_te(grouped_matmul, x, w, offsets, primfunc_name_hint=NAME)


def _definition(args):
    """The definition's PrimFunc as ``emit_grouped_matmul`` makes it for these Relax
    arguments (``emit_te`` adds casts of its own), or None when their types are not a
    grouped product's."""
    shapes = [shape_of(a) for a in args]
    if any(s is None for s in shapes) or [len(s) for s in shapes] != [2, 3, 1]:
        return None
    builder = R.BlockBuilder()
    params = [R.Var(name, a.ty) for name, a in zip(("x", "w", "offsets"), args)]
    with builder.function("definition", params):
        with builder.dataflow():
            out = builder.emit_output(emit_grouped_matmul(builder, *params))
        builder.emit_func_output(out)
    return next(f for _, f in builder.get().functions_items() if isinstance(f, T.PrimFunc))


def _is_definition(func, args) -> bool:
    if not isinstance(func, T.PrimFunc):
        return False
    want = _definition(args)
    return want is not None and T.structural_equal(func, want, map_free_vars=True)


def _transposed_from(expr, var2val):
    """``w_t`` where ``expr`` is ``permute_dims(w_t, [0, 2, 1])``, else None."""
    value = var2val.get(expr, expr) if isinstance(expr, R.Var) else expr
    if isinstance(value, R.Call) and isinstance(value.op, T.Op) and \
            value.op.name == "relax.permute_dims" and value.attrs.axes is not None and \
            [int(a) for a in value.attrs.axes] == [0, 2, 1]:
        return value.args[0]
    return None


def _packed(weight, layout):
    """A constant ``[E, N, K]`` ("nt") or ``[E, K, N]`` ("nn") weight as the built-in
    kernels' packed panels, one row of ``[E, floats]`` per expert, packed once here."""
    import numpy as np

    from . import kernels

    values = T.constant_value(weight)
    return R.const(np.stack([kernels.pack_weight(np.ascontiguousarray(values[e]), layout)
                             for e in range(values.shape[0])]))


def _kernel_for(layout, kernels):
    """The declared kernel that computes one expert's rows, or None for the built-in."""
    for kernel in kernels:
        op = kernel.op
        if op.family == "matmul" and not op.epilogue and \
                op.layouts.get("weight", "nn") == layout and not op.constraints and \
                op.dtypes == ("float32",):
            return kernel
    return None


_BUILTIN_SYMBOL = "tirbyoc_matmul_f32"


def _kernel_func(x, w, offsets, out_ty, layout, declared):
    """The PrimFunc ``(x, w, offsets, y)`` that loops over the experts."""
    from tvm import tirx

    from .calls import status_checks

    names = {}
    xb = T.decl_buffer(tir_dims(shape_of(x), names), "float32", "x")
    wb = T.decl_buffer(tir_dims(shape_of(w), names), "float32", "w")
    ob = T.decl_buffer(tir_dims(shape_of(offsets), names), str(offsets.ty.dtype), "offsets")
    yb = T.decl_buffer(tir_dims(shape_of(out_ty), names), "float32", "y")
    rows, k_dim = (T.cast(d, "int64") for d in xb.shape)
    experts = int(wb.shape[0])
    n_dim = T.cast(yb.shape[1], "int64")
    if layout == "packed":  # [E, floats of one packed weight]
        per_expert, ldw = T.cast(wb.shape[1], "int64"), T.const(0, "int64")
    else:
        per_expert = T.cast(wb.shape[1], "int64") * T.cast(wb.shape[2], "int64")
        ldw = T.cast(wb.shape[2], "int64")
    e = T.Var("e", "int64")
    start = T.Var("start", "int64")
    end = T.Var("end", "int64")
    ends = lambda i: T.cast(tirx.BufferLoad(ob, [i]), "int64")  # noqa: E731
    zero = T.const(0, "int64")
    values = {"batch": T.const(1, "int64"), "m": end - start, "n": n_dim, "k": k_dim,
              "x": T.buffer_pointer(xb, "r", start * k_dim), "lda": k_dim,
              "batch_stride_x": zero,
              "weight": T.buffer_pointer(wb, "r", e * per_expert), "ldw": ldw,
              "batch_stride_weight": zero,
              "y": T.buffer_pointer(yb, "w", start * n_dim), "ldc": n_dim,
              "batch_stride_y": zero}
    if declared is not None:
        symbol, library = declared.symbol, declared.library.name
        call = declared.call(values)
    else:
        symbol, library = _BUILTIN_SYMBOL, "tirbyoc"
        layout_code = {"nn": 0, "nt": 1, "packed": 2}[layout]
        f32 = lambda v: T.const(v, "float32")  # noqa: E731
        call = status_checks(symbol, T.call_extern("int32", symbol, [
            values["batch"], values["m"], n_dim, k_dim, values["x"], k_dim, zero,
            values["weight"], ldw, zero, T.const(layout_code, "int32"), values["y"], n_dim,
            zero, zero, f32(1.0), T.null_pointer(), T.null_pointer(), zero, zero]))
    what = "tirbyoc: the grouped product's offsets must be nondecreasing and at most " \
           "the number of rows"
    body = T.seq([
        T.bind(start, tirx.Select(e == 0, zero, ends(tirx.Max(e - 1, zero)))),
        T.bind(end, ends(e)),
        T.assert_stmt(tirx.And(tirx.And(start <= end, end <= rows), zero <= start), what),
        tirx.IfThenElse(end > start, call, None)])
    loop = tirx.For(e, zero, T.const(experts, "int64"), tirx.ForKind.SERIAL, body)
    # rows past the last offset are zero
    s, n = T.Var("s", "int64"), T.Var("n", "int64")
    last = T.Var("last", "int64")
    tail = T.seq([
        T.bind(last, ends(T.const(experts - 1, "int64"))),
        tirx.For(s, last, rows - last, tirx.ForKind.SERIAL, tirx.For(
            n, zero, n_dim, tirx.ForKind.SERIAL,
            tirx.BufferStore(yb, T.const(0.0, "float32"), [s, n])))])
    annotations = {OFFLOADED_ATTR: symbol, INTRINSIC_ATTR: INTRINSIC, LIBRARY_ATTR: library,
                   NOTES_ATTR: f"one call per expert ({experts}), weight {layout}" + (
                       " (constant, packed at compile time)" if layout == "packed" else "")}
    block = T.make_block(f"{library}_{NAME}", T.seq([loop, tail]),
                         reads=[T.full_region(b) for b in (xb, wb, ob)],
                         writes=[T.full_region(yb)], annotations=annotations)
    root = T.make_block("root", T.make_realize(block), reads=[], writes=[], annotations={})
    func = T.prim_func_of([xb, wb, ob, yb], T.make_realize(root))
    return func.with_attr("tirx.noalias", True)


def _rewrite_func(func, builder, gvars, kernels, builtin, mod):
    var2val = R.analysis.get_var2val(func)
    call_tir = T.call_tir_op()

    def call(binding):
        value = binding.value
        if not (isinstance(value, R.Call) and value.op.same_as(call_tir)):
            return None
        args = call_args(value)
        callee = mod[value.args[0]] if isinstance(value.args[0], T.GlobalVar) else None
        if len(args) != 3 or getattr(args[0].ty, "dtype", None) != "float32" or \
                getattr(args[1].ty, "dtype", None) != "float32" or \
                not str(getattr(args[2].ty, "dtype", "")).startswith("int") or \
                not _is_definition(callee, args):
            return None
        x, w, offsets = args
        # the weight read in place through its transpose ("nt") or as it is ("nn"): the
        # first a declared kernel takes, else the first for the built-in one
        source = _transposed_from(w, var2val)
        forms = ([(source, "nt")] if source is not None and
                 getattr(source.ty, "dtype", None) == "float32" else []) + [(w, "nn")]
        offers = [(weight, layout, _kernel_for(layout, kernels)) for weight, layout in forms]
        chosen = next((offer for offer in offers if offer[2] is not None), None)
        if chosen is None and not builtin:
            return None
        w, layout, declared = chosen or offers[0]
        if declared is None and isinstance(w, T.RelaxConstant):
            w, layout = _packed(w, layout), "packed"
        kernel = _kernel_func(x, w, offsets, binding.var, layout, declared)
        key = T.structural_hash(kernel)
        if key not in gvars:
            gvars[key] = builder.add_func(kernel, f"tirbyoc_{NAME}")
        return R.call_tir(gvars[key], [x, w, offsets], binding.var.ty)

    return rewrite_bindings(func, call)


def offload_grouped(mod, kernels=(), builtin=True):
    """``mod`` with every call of the grouped-product definition one loop of kernel
    calls (see the module docstring); ``kernels``: the compile's declared ``matmul``
    kernels, offered first; ``builtin``: whether the built-in kernel takes the rest."""
    gvars = {}
    return rewrite_relax_functions(mod, lambda func, builder: _rewrite_func(
        func, builder, gvars, list(kernels), builtin, mod))
