"""Products of one input by several constant weights, side by side: one kernel call.

HuggingFace's Llama and BERT project the same hidden states into queries, keys and values
with three ``Linear`` layers. Each becomes its own dense call, and grouped-query
attention's key and value projections are narrow (256 columns for Llama's 4 key-value
heads of 64): a narrow product keeps its threads and its register tiles less busy than a
wide one. ``merge_products`` rewrites

    q = x @ Wq (+ bq);  k = x @ Wk (+ bk);  v = x @ Wv (+ bv)

into ``y = x @ [Wq | Wk | Wv] (+ [bq | bk | bv])`` and the three results as column
slices of ``y`` (``R.strided_slice`` of its last axis). Every column is the same dot
product as before, so values are unchanged bit for bit. The slices are views: the
attention region reads Q, K and V inside ``y`` in place (``tirbyoc.views``), and an
elementwise op after a slice (Llama's rotary embedding) reads it inside its own loop.

Only results that are reshaped and nothing else are merged (the projections into
heads): a result with an epilogue of its own (Llama's SiLU-gated MLP, whose gate product
takes the SiLU and the multiplication by the up product in its kernel call) keeps its
product. The weights are constants (``W`` or ``permute_dims(W)``, float32, 2-D), the
biases constant vectors, all products read the same variable, with or without a bias
alike.
"""

from __future__ import annotations

import numpy as np

from . import _tvm as T
from .bindings import Bindings, constant_value_of, is_op, shape_of

R = T.relax_ns


def _weight(expr, b):
    """The float32 [K, N] value a product multiplies by: a 2-D constant, or the
    transpose of one (``permute_dims``, as the frontends write ``Linear``); else None."""
    data = constant_value_of(expr, b)
    return data if data is not None and data.ndim == 2 and data.dtype == np.float32 else None


class _Member:
    """One product ``var = x @ weight`` and, if a bias follows, ``out = var + bias``
    (else ``out`` is ``var``); ``dead``: the variables that only it reads (its
    transposed weight), left out with it."""

    def __init__(self, var, weight, bias=None, out=None, dead=()):
        self.var, self.weight, self.bias = var, weight, bias
        self.out = var if out is None else out
        self.dead = tuple(dead)


def _member(var, value, b):
    if not is_op(value, "relax.matmul") or len(value.args) != 2:
        return None
    x, w = value.args
    if str(value.attrs.out_dtype) not in ("float32", "") or not isinstance(x, R.Var):
        return None
    xs = shape_of(x)
    if xs is None or len(xs) < 2 or getattr(x.ty, "dtype", None) != "float32":
        return None
    weight = _weight(w, b)
    if weight is None or not T.analyzer().can_prove_equal(xs[-1], weight.shape[0]):
        return None
    dead = [w] if isinstance(w, R.Var) and b.uses.get(w, 0) == 1 else []
    member = _Member(var, weight, dead=dead)
    user = b.only_user(var)
    if user is not None and is_op(user[1], "relax.add"):
        other = [a for a in user[1].args if not a.same_as(var)]
        bias = constant_value_of(other[0], b) if len(other) == 1 else None
        if bias is not None and bias.shape == (weight.shape[1],) and bias.dtype == np.float32:
            member = _Member(var, weight, bias, user[0], dead)
    # only the projections into heads: a result that is only reshaped
    readers = b.users(member.out)
    if not readers or b.uses.get(member.out, 0) != len(readers) or \
            not all(is_op(v, "relax.reshape") for _, v in readers) or \
            not isinstance(member.out, R.DataflowVar):
        return None
    return member


def _groups(func) -> list:
    """[(x, [members])] of two or more products of ``x`` merged into one."""
    b = Bindings(func)
    by_input = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            if not isinstance(binding, R.VarBinding):
                continue
            member = _member(binding.var, binding.value, b)
            if member is None:
                continue
            x = binding.value.args[0]
            key = (x, member.bias is not None)
            group = by_input.setdefault(key, [])
            if not group or (b.same_block(group[0].var, member.var) and
                             group[0].weight.shape[0] == member.weight.shape[0]):
                group.append(member)
    return [(x, ms) for (x, _), ms in by_input.items() if len(ms) >= 2]


@R.expr_functor.mutator
class _Merge(R.PyExprMutator):
    def __init__(self, mod, groups):
        super().__init__(mod)
        self.first = {ms[0].var: (x, ms) for x, ms in groups}
        self.skip = {v for _, ms in groups for m in ms for v in (m.var, m.out) + m.dead}

    def visit_var_binding_(self, binding):
        if binding.var in self.first:
            self._emit_merged(*self.first[binding.var])
            return
        if binding.var in self.skip:
            return
        value = self.builder_.normalize(self.visit_expr(binding.value))
        emit = self.builder_.emit if isinstance(binding.var, R.DataflowVar) \
            else self.builder_.emit_output
        self.set_var_remap(binding.var, emit(value, binding.var.name))

    def _emit_merged(self, x, members):
        x = self.visit_expr(x)
        weight = np.ascontiguousarray(np.concatenate([m.weight for m in members], axis=1))
        y = self.builder_.emit(R.op.matmul(x, R.const(weight), out_dtype="float32"),
                               "merged_product")
        if members[0].bias is not None:
            bias = np.concatenate([m.bias for m in members])
            y = self.builder_.emit(R.op.add(y, R.const(bias)), "merged_product_bias")
        axis = len(shape_of(y)) - 1
        start = 0
        for m in members:
            end = start + m.weight.shape[1]
            part = self.builder_.emit(R.op.strided_slice(
                y, [axis], [start], [end], [1], assume_inbound=True), m.out.name)
            self.set_var_remap(m.out, part)
            start = end


def merge_products(mod):
    """``mod`` with the products of each input by several constant weights merged into
    one (see the module's docstring); ``mod`` itself when there are none."""
    out = None
    for gv, func in mod.functions_items():
        if not isinstance(func, R.Function) or (func.attrs and "Codegen" in func.attrs):
            continue
        groups = _groups(func)
        if not groups:
            continue
        out = out or mod.clone()
        out[gv] = _Merge(mod, groups).visit_expr(func)
    return out or mod
