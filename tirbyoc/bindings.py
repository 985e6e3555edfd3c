"""What the graph-level rewrites (``tirbyoc.attention``, ``tirbyoc.conv``,
``tirbyoc.softmax``) read from a Relax function before legalization: which op a call is,
a tensor's shape, what each variable is bound to and how often it is used; and the loop
that rewrites every Relax function of a module."""

from __future__ import annotations

from . import _tvm as T

R = T.relax_ns


def is_op(expr, *names) -> bool:
    """Whether ``expr`` calls one of the Relax operators ``names``."""
    return isinstance(expr, R.Call) and isinstance(expr.op, T.Op) and expr.op.name in names


def shape_of(expr):
    """The dimensions of a tensor-typed expression (PrimExprs), else None."""
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, R.TensorType) or ty.shape is None:
        return None
    values = getattr(ty.shape, "values", None)
    return list(values) if values is not None else None


def static_dims(expr):
    """The dimensions of a tensor-typed expression as ints, or None where one is
    symbolic or the shape unknown."""
    shape = shape_of(expr)
    if shape is None or not all(isinstance(d, T.IntImm) for d in shape):
        return None
    return [int(d) for d in shape]


def same_dims(a, b) -> bool:
    """Whether two lists of dimensions (PrimExprs, or None) are provably equal."""
    if a is None or b is None or len(a) != len(b):
        return False
    an = T.analyzer()
    return all(an.can_prove_equal(x, y) for x, y in zip(a, b))


def tir_dims(shape, names: dict) -> list:
    """TIR dims for a Relax shape (of a kernel call's buffer): constants stay, each
    symbolic dim becomes one TIR variable per distinct expression, kept in ``names``
    across the buffers of one PrimFunc (so that equal dims are bound equal)."""
    out = []
    for dim in shape:
        if isinstance(dim, T.IntImm):
            out.append(T.const(int(dim), "int64"))
            continue
        key = str(dim)
        if key not in names:
            names[key] = T.Var(f"n{len(names)}", "int64")
        out.append(names[key])
    return out


def scalar_constant(expr, values, kinds=None):
    """The value (a Python float or int) of a 0-d constant, or of ``R.full`` of the
    empty shape with one (torch.export writes ``torch.tensor(0.0)`` so), through
    variables bound to one (``values``: variable -> bound expression), else None;
    ``kinds``: the numpy dtype kinds taken (None: any)."""
    import numpy as np

    while isinstance(expr, R.Var) and expr in values:
        expr = values[expr]
    data = None
    if isinstance(expr, T.RelaxConstant):
        data = T.constant_value(expr)
    elif is_op(expr, "relax.full") and len(expr.args) == 2 and \
            isinstance(expr.args[0], R.ShapeExpr) and len(expr.args[0].values) == 0:
        fill = scalar_constant(expr.args[1], values)
        if fill is not None:
            data = np.array(fill, dtype=str(expr.attrs.dtype))
    if data is not None and data.ndim == 0 and (kinds is None or data.dtype.kind in kinds):
        return int(data) if data.dtype.kind in "iu" else float(data)
    return None


def constant_value_of(expr, b):
    """The numpy value of a constant, or of ``permute_dims(constant)`` (transposed), read
    directly or through the variable bound to it (``b``: the function's ``Bindings``);
    else None."""
    bound = b.producer(expr)
    expr = expr if bound is None else bound
    if isinstance(expr, T.RelaxConstant):
        return T.constant_value(expr)
    if is_op(expr, "relax.permute_dims") and isinstance(expr.args[0], T.RelaxConstant):
        value = T.constant_value(expr.args[0])
        axes = expr.attrs.axes
        return value.transpose([int(a) for a in axes]) if axes is not None else value.T
    return None


def scaled_operand(call, values, kinds=None):
    """(x, c) of ``R.multiply`` of a tensor ``x`` and a scalar constant ``c`` (either
    order) or of ``R.divide(x, c)``, else None (see ``scalar_constant``)."""
    if not is_op(call, "relax.multiply", "relax.divide"):
        return None
    x, y = call.args
    c = scalar_constant(y, values, kinds)
    if c is None and call.op.name == "relax.multiply":
        x, c = y, scalar_constant(x, values, kinds)
    return None if c is None else (x, float(c))


class Bindings:
    """A Relax function's variable bindings: ``values`` (variable -> bound expression)
    and ``uses`` (variable -> how many bindings, and the function's result, read it);
    ``func``: the function."""

    def __init__(self, func):
        self.func = func
        self.values, self.uses, self._block = {}, {}, {}
        self._users = {}  # variable -> [(variable, value)] of the bindings reading it
        for index, block in enumerate(func.body.blocks):
            for binding in block.bindings:
                reader = None
                if isinstance(binding, R.VarBinding):
                    self.values[binding.var] = binding.value
                    self._block[binding.var] = index
                    reader = (binding.var, binding.value)
                for var in self._count(binding.value):
                    if reader is not None:
                        self._users.setdefault(var, []).append(reader)
        self._count(func.body.body)

    def _count(self, expr):
        free = R.analysis.free_vars(expr)
        for var in free:
            self.uses[var] = self.uses.get(var, 0) + 1
        return free

    def producer(self, var):
        """What ``var`` is bound to (None for a parameter or a non-variable)."""
        return self.values.get(var) if isinstance(var, R.Var) else None

    def users(self, var) -> list:
        """``[(variable, value)]`` of the bindings that read ``var``, in program order."""
        return list(self._users.get(var, ()))

    def same_block(self, a, b) -> bool:
        """Whether variables ``a`` and ``b`` are bound in the same binding block."""
        return a in self._block and self._block.get(a) == self._block.get(b)

    def only_user(self, var):
        """The (variable, value) of the one binding that reads ``var``, else None."""
        if self.uses.get(var, 0) != 1:
            return None
        users = self.users(var)
        return users[0] if len(users) == 1 else None


@R.expr_functor.mutator
class _CallRewriter(R.PyExprMutator):
    def __init__(self, mod, replacement, b):
        super().__init__(mod)
        self.replacement, self.b = replacement, b

    def visit_call_(self, call):  # noqa: N802 (TVM's visitor naming)
        new = self.replacement(call, self.b)
        return super().visit_call_(call if new is None else self._bind_shared(new))

    def _bind_shared(self, expr):
        """``expr`` with each call that it reads more than once bound to a variable, once:
        the normalizer would bind every use of it apart, and compute it again (a
        transposed conv's product, read once per group of taps, ran twice)."""
        seen, shared = set(), set()

        def count(e):
            for arg in e.fields if isinstance(e, R.Tuple) else \
                    e.args if isinstance(e, R.Call) else ():
                key = arg.__chandle__()
                if isinstance(arg, R.Call) and key in seen:
                    shared.add(key)
                    continue
                seen.add(key)
                count(arg)

        count(expr)
        if not shared:
            return expr
        done = {}

        def rebuild(e):
            if isinstance(e, R.Tuple):
                return R.Tuple([rebuild(f) for f in e.fields])
            if not isinstance(e, R.Call):
                return e
            key = e.__chandle__()
            if key not in done:
                out = R.Call(e.op, [rebuild(a) for a in e.args], e.attrs, e.ty_args)
                done[key] = self.builder_.emit(self.visit_expr(out)) if key in shared \
                    else out
            return done[key]

        return rebuild(expr)


def rewrite_calls(mod, replacement):
    """``mod`` with every call ``c`` of its Relax functions (not another codegen's) for
    which ``replacement(c, b)`` gives an expression replaced by that expression (``b``:
    the function's ``Bindings``, as it was before any change; the replacement's own
    arguments are rewritten in turn), then the bindings left unused removed. The module
    itself when no call has a replacement."""
    found = {}
    for gv, func in mod.functions_items():
        if isinstance(func, R.Function) and not (func.attrs and "Codegen" in func.attrs):
            b = Bindings(func)
            if any(replacement(v, b) is not None for v in b.values.values()):
                found[gv] = b
    if not found:
        return mod
    out = mod.clone()
    for gv, b in found.items():
        out[gv] = R.analysis.remove_all_unused(
            _CallRewriter(mod, replacement, b).visit_expr(mod[gv]))
    return out


def rewrite_relax_functions(mod, rewrite):
    """``mod`` with ``rewrite(func, builder)`` applied to each Relax function that is not
    another codegen's (``Codegen`` attribute); ``builder`` (a BlockBuilder on the module)
    adds the PrimFuncs the rewrite calls. The module itself when nothing changed."""
    builder = R.BlockBuilder(mod)
    rewritten = {}
    for gv, func in mod.functions_items():
        if isinstance(func, R.Function) and not (func.attrs and "Codegen" in func.attrs):
            new = rewrite(func, builder)
            if not new.same_as(func):
                rewritten[gv] = new
    if not rewritten:
        return mod
    out = builder.get()
    for gv, func in rewritten.items():
        out.update_func(gv, func)
    return out


def rewrite_bindings(func, rewrite):
    """``func`` with the value of each variable binding for which ``rewrite(binding)``
    gives a new value (None: kept as it is) replaced by it; ``func`` itself when none."""
    found = False
    blocks = []
    for block in func.body.blocks:
        bindings = []
        for binding in block.bindings:
            value = rewrite(binding) if isinstance(binding, R.VarBinding) else None
            if value is None:
                bindings.append(binding)
                continue
            found = True
            bindings.append(R.VarBinding(binding.var, value))
        blocks.append(R.DataflowBlock(bindings) if isinstance(block, R.DataflowBlock)
                      else R.BindingBlock(bindings))
    if not found:
        return func
    return R.Function(func.params, R.SeqExpr(blocks, func.body.body), func.ret_ty,
                      func.is_pure, func.attrs)


def call_tir_sites(mod):
    """Yield ``(var2val, call, args)`` for every call_tir in every Relax function."""
    call_tir = T.call_tir_op()
    for _, func in mod.functions_items():
        if not isinstance(func, T.Function):
            continue
        var2val = R.analysis.get_var2val(func)
        for value in var2val.values():
            if isinstance(value, R.Call) and value.op.same_as(call_tir):
                yield var2val, value, call_args(value)


def call_args(call) -> list:
    """The tensor arguments of a call_tir."""
    return list(call.args[1].fields) if isinstance(call.args[1], R.Tuple) else [call.args[1]]
