"""Attention as one region (tirbyoc.attention): which graph forms become one call of
``tirbyoc_attention_f32`` and which keep their ops, with numerics against a float64 numpy
reference either way.

Tolerance: max|got - ref| <= 1e-5 * max|ref| (float32 products of 64 terms and a softmax),
NaN exactly where the reference has NaN (fully masked rows, non-finite inputs).
"""

import numpy as np
import pytest
import tvm
from tvm import relax

import tirbyoc

B, H, M, N, D = 1, 3, 37, 37, 16
RTOL = 1e-5
NEG_INF = float("-inf")
LOWEST = float(np.finfo(np.float32).min)  # HuggingFace's masking value


# (const_zero_nanfix: BERT's ONNX file without a padding mask adds a constant of zeros)
NAN_FIXED = ("const_lowest_nanfix", "causal_nanfix", "const_zero_nanfix")


def _causal(m, n):
    """True above the diagonal: the keys after each query."""
    return ~np.tril(np.ones((m, n), bool))


# a causal mask folded into a float constant (an ONNX export of HF GPT-2): the value of
# its masked places (None: the lowest float32, and -inf at one place, both masking values)
CONST_FILLS = {"const_lowest": LOWEST, "const_inf": NEG_INF, "const_finite": -1e9,
               "const_mixed": None, "const_lowest_nanfix": LOWEST, "const_zero_nanfix": 0.0}


def _const_mask(form, m, n):
    fill = CONST_FILLS[form]
    c = np.where(_causal(m, n), LOWEST if fill is None else fill, 0.0).astype(np.float32)
    if fill is None:
        c[-1, 0] = NEG_INF  # both masking values: stays
    return c


def _build(form, n_sym=False):
    """A Relax module ``main(q [B,H,M,D], k [B,H,N,D], v [B,H,N,D], mask) -> out`` for
    one attention form; the mask input is [M, N] bool unless the form says otherwise."""
    bb = relax.BlockBuilder()
    m = tvm.tirx.Var("m", "int64") if n_sym else M
    n = m if n_sym else N
    q = relax.Var("q", relax.TensorType((B, H, m, D), "float32"))
    k = relax.Var("k", relax.TensorType((B, H, n, D), "float32"))
    v = relax.Var("v", relax.TensorType((B, H, n, D), "float32"))
    mshape = {"padding": (B, 1, 1, n), "per_head": (B, H, m, n)}.get(form, (m, n))
    mask = relax.Var("mask", relax.TensorType(mshape, "bool"))
    op = relax.op
    with bb.function("main", [q, k, v, mask]):
        with bb.dataflow():
            kt = bb.emit(op.permute_dims(k, [0, 1, 3, 2]))
            s = bb.emit(op.matmul(q, kt))
            ninf = relax.const(NEG_INF, "float32")
            if form in ("causal", "padding", "per_head", "used_twice", "causal_nanfix"):
                s = bb.emit(op.divide(s, relax.const(4.0, "float32")))
                s = bb.emit(op.where(mask, ninf, s))
            elif form == "keep":
                s = bb.emit(op.multiply(relax.const(0.25, "float32"), s))
                s = bb.emit(op.where(mask, s, ninf))
            elif form == "added":      # PyTorch's attention with a bool mask, HF BERT
                zero = relax.const(0.0, "float32")
                s = bb.emit(op.add(s, bb.emit(op.where(mask, ninf, zero))))
            elif form == "added_keep":  # the float mask first, True keeps
                zero = relax.const(0.0, "float32")
                s = bb.emit(op.add(bb.emit(op.where(mask, zero, ninf)),
                                   bb.emit(op.multiply(s, relax.const(0.5, "float32")))))
            elif form == "added_lowest":  # HF GPT-2: scaled, + where(kept, 0, finfo.min)
                zero = bb.emit(op.full(relax.ShapeExpr([]), relax.const(0.0, "float32"),
                                       "float32"))
                s = bb.emit(op.multiply(s, relax.const(0.125, "float32")))
                s = bb.emit(op.add(s, bb.emit(op.where(
                    bb.emit(op.logical_not(mask)), zero, relax.const(LOWEST, "float32")))))
            elif form in CONST_FILLS:
                s = bb.emit(op.multiply(s, relax.const(0.125, "float32")))
                s = bb.emit(op.add(s, relax.const(_const_mask(form, m, n)[None, None])))
            elif form == "fill_lowest":  # masked_fill(mask, finfo.min)
                s = bb.emit(op.where(mask, relax.const(LOWEST, "float32"), s))
            elif form == "added_finite":  # a large finite fill is not -inf: stays
                zero = relax.const(0.0, "float32")
                s = bb.emit(op.add(s, bb.emit(op.where(mask, relax.const(-1e9, "float32"),
                                                       zero))))
            elif form == "fill_finite":
                s = bb.emit(op.where(mask, relax.const(-1e9, "float32"), s))
            elif form == "additive":
                s = bb.emit(op.add(s, op.astype(mask, "float32")))
            elif form == "scale_tensor":
                s = bb.emit(op.multiply(s, op.astype(mask, "float32")))
            p = bb.emit(op.nn.softmax(s, axis=-2 if form == "other_axis" else -1))
            if form in NAN_FIXED:  # torch.onnx's fix-up after the softmax
                p = bb.emit(op.where(bb.emit(op.isnan(p)), relax.const(0.0, "float32"), p))
            out = bb.emit(op.matmul(p, v))
            if form == "used_twice":
                out = bb.emit(relax.Tuple([out, p]))
            gv = bb.emit_output(out)
        bb.emit_func_output(gv)
    return bb.get()


def _reference(form, q, k, v, mask):
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2)
    if form in ("causal", "padding", "per_head", "used_twice", "causal_nanfix"):
        s = np.where(mask, -np.inf, s / 4.0)
    elif form == "keep":
        s = np.where(mask, 0.25 * s, -np.inf)
    elif form == "added":
        s = s + np.where(mask, -np.inf, 0.0)
    elif form == "added_keep":
        s = np.where(mask, 0.0, -np.inf) + 0.5 * s
    elif form == "added_lowest":
        s = 0.125 * s + np.where(mask, LOWEST, 0.0)
    elif form in CONST_FILLS:
        s = 0.125 * s + _const_mask(form, *s.shape[-2:])
    elif form == "fill_lowest":
        s = np.where(mask, LOWEST, s)
    elif form == "added_finite":
        s = s + np.where(mask, -1e9, 0.0)
    elif form == "fill_finite":
        s = np.where(mask, -1e9, s)
    elif form == "additive":
        s = s + mask
    elif form == "scale_tensor":
        s = s * mask
    axis = -2 if form == "other_axis" else -1
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(axis, keepdims=True))
        p = e / e.sum(axis, keepdims=True)
        if form in NAN_FIXED:
            p = np.where(np.isnan(p), 0.0, p)
        return p @ v


def _inputs(form, seed=0, m=M, n=N):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((B, H, r, D)).astype(np.float32) for r in (m, n, n))
    if form == "padding":
        mask = np.zeros((B, 1, 1, n), bool)
        mask[..., n - 5:] = True
    elif form == "per_head":
        mask = rng.random((B, H, m, n)) < 0.4
    elif form in ("keep", "added_keep"):
        mask = np.tril(np.ones((m, n), bool))  # True keeps
    else:
        mask = ~np.tril(np.ones((m, n), bool))  # True masks (causal)
    return q, k, v, mask


def _run(mod, args):
    ex = tirbyoc.compile(mod)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args])
    return out[0].numpy() if isinstance(out, (list, tuple)) or hasattr(out, "__len__") and \
        not hasattr(out, "numpy") else out.numpy()


def _assert_matches(got, ref):
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    finite = np.isfinite(ref)
    scale = float(np.abs(ref[finite]).max())
    assert float(np.abs(got[finite] - ref[finite]).max()) <= RTOL * scale


ACCEPTED = ["causal", "keep", "nomask", "padding", "per_head", "added", "added_keep",
            "added_lowest", "fill_lowest", "const_lowest", "const_inf",
            "const_lowest_nanfix", "causal_nanfix", "const_zero_nanfix"]
REFUSED = ["fill_finite", "added_finite", "additive", "scale_tensor", "other_axis",
           "used_twice", "const_finite", "const_mixed"]


@pytest.mark.parametrize("form", ACCEPTED + REFUSED)
def test_attention_forms(form):
    mod = _build(form)
    report = tirbyoc.explain(mod)
    intrinsics = [r.intrinsic for r in report.offloaded]
    if form in ACCEPTED:
        assert intrinsics == ["attention"], str(report)
        assert "tirbyoc_attention" in report.schedules
    else:
        assert "attention" not in intrinsics, str(report)
    args = _inputs(form)
    _assert_matches(_run(mod, args), _reference(form, *args))


@pytest.mark.parametrize("form", NAN_FIXED)
def test_the_isnan_fixup_zeroes_rows_of_nan_weights(form):
    """torch.onnx's where(isnan(P), 0, P) after the softmax, in the one call: a row with a
    NaN score (a NaN in q), a row of +-inf scores (an inf in q) and a fully masked row
    (-inf mask) give 0, an inf in V NaN in its column of those rows; the rest as the
    graph."""
    mod = _build(form)
    assert [r.intrinsic for r in tirbyoc.explain(mod).offloaded] == ["attention"]
    q, k, v, mask = _inputs(form)
    q[0, 1, 5, 0] = np.nan
    q[0, 2, 9, 3] = np.inf
    v[0, :, N - 1, 2] = np.inf   # a key only the last row keeps (causal)
    if form == "causal_nanfix":
        mask[4] = True           # a fully masked row
    got, ref = _run(mod, (q, k, v, mask)), _reference(form, q, k, v, mask)
    _assert_matches(got, ref)
    for h, row in ((1, 5), (2, 9)):  # weights of 0 for every key: 0 * inf in column 2
        assert (np.delete(got[0, h, row], 2) == 0).all() and np.isnan(got[0, h, row, 2])
    assert (got[0, :, -1, 2] == np.inf).all()  # a positive weight on the inf


def test_fully_masked_rows_and_non_finite_values_as_the_graph_gives_them():
    """A row with every key masked gives NaN (softmax of all -inf); a NaN in q gives a NaN
    row; an inf in v past a causal row's last key still makes that row NaN (its weight 0
    times inf), exactly as the unfused graph."""
    mod = _build("causal")
    q, k, v, mask = _inputs("causal", seed=1)
    mask[5, :] = True          # row 5: every key masked
    q[0, 1, 9, 3] = np.nan     # head 1, row 9
    v[0, 2, 30, 0] = np.inf    # head 2, key 30: rows before 30 do not keep it
    ref = _reference("causal", q, k, v, mask)
    got = _run(mod, (q, k, v, mask))
    assert np.isnan(ref[0, :, 5]).all() and np.isnan(ref[0, 1, 9]).all()
    assert np.isnan(ref[0, 2, 0, 0])
    _assert_matches(got, ref)


@pytest.mark.parametrize("form", ["added_lowest", "fill_lowest"])
def test_a_row_masked_by_the_lowest_float_spreads_its_weights(form):
    """With finfo.min for -inf a fully masked row has equal finite scores: its output is
    the mean of V (where -inf gives NaN), and the other rows are as with -inf."""
    mod = _build(form)
    q, k, v, mask = _inputs(form, seed=2)
    mask[5, :] = True
    ref = _reference(form, q, k, v, mask)
    np.testing.assert_allclose(ref[0, :, 5], v[0].astype(np.float64).mean(1), rtol=1e-12)
    _assert_matches(_run(mod, (q, k, v, mask)), ref)


@pytest.mark.parametrize("form", ["added", "causal"])
def test_a_masked_nan_or_inf_score_as_the_graph_gives_it(form):
    """A NaN or +inf score at a masked key: the added mask (-inf + NaN, -inf + inf) makes
    the row NaN, the replacing one (where) leaves it out; each region as its graph."""
    mod = _build(form)
    q, k, v, mask = _inputs(form, seed=3)
    k[0, 0, N - 1, 2] = np.nan    # head 0, the last key: masked for every row but the last
    k[0, 1, N - 2, 0] = np.inf    # head 1: +-inf scores at a key most rows mask
    ref = _reference(form, q, k, v, mask)
    assert np.isnan(ref[0, 0, :N - 1]).all() == (form == "added")
    assert np.isnan(ref[0, 1, :N - 2]).any() == (form == "added")
    assert not np.isnan(ref[0, 2]).any()
    _assert_matches(_run(mod, (q, k, v, mask)), ref)


@pytest.mark.parametrize("mshape,fused", [((2, 1, M, N), True), ((2, 1, 1, N), True),
                                          ((2, 3, M, N), True), ((1, 1, M, N), True),
                                          ((1, 3, M, N), False), ((2, 3, M, 1), False)])
@pytest.mark.parametrize("added", [False, True])
def test_masks_per_sequence_broadcast_over_the_heads(mshape, fused, added):
    """A [B, 1, M, N] mask (HuggingFace's at batch > 1: one per sequence, for every head)
    is read by the kernel in place, each sequence's item shared by its heads; a mask
    broadcast over the batch but not the heads ([1, H, M, N]) is not one stride of the
    kernel's, and a mask broadcast over the keys not one row: those keep their ops. Right
    either way."""
    b, h = 2, 3
    bb = relax.BlockBuilder()
    q, k, v = (relax.Var(c, relax.TensorType((b, h, M, D), "float32")) for c in "qkv")
    mask = relax.Var("mask", relax.TensorType(mshape, "bool"))
    op = relax.op
    with bb.function("main", [q, k, v, mask]):
        with bb.dataflow():
            s = bb.emit(op.matmul(q, bb.emit(op.permute_dims(k, [0, 1, 3, 2]))))
            ninf, zero = relax.const(NEG_INF, "float32"), relax.const(0.0, "float32")
            s = bb.emit(op.add(s, bb.emit(op.where(mask, ninf, zero)))) if added \
                else bb.emit(op.where(mask, ninf, s))
            gv = bb.emit_output(bb.emit(op.matmul(bb.emit(op.nn.softmax(s, axis=-1)), v)))
        bb.emit_func_output(gv)
    mod = bb.get()
    intrinsics = [r.intrinsic for r in tirbyoc.explain(mod).offloaded]
    assert ("attention" in intrinsics) == fused, intrinsics
    rng = np.random.default_rng(7)
    args = [rng.standard_normal((b, h, M, D)).astype(np.float32) for _ in range(3)]
    mval = rng.random(mshape) < 0.3
    mval[..., 0] = False                                  # no row fully masked
    qd, kd, vd = (a.astype(np.float64) for a in args)
    sc = qd @ np.swapaxes(kd, -1, -2)
    sc = np.where(mval, -np.inf, sc)
    e = np.exp(sc - sc.max(-1, keepdims=True))
    ref = (e / e.sum(-1, keepdims=True)) @ vd
    _assert_matches(_run(mod, args + [mval]), ref)


def test_one_build_serves_every_sequence_length():
    mod = _build("causal", n_sym=True)
    assert [r.intrinsic for r in tirbyoc.explain(mod).offloaded] == ["attention"]
    ex = tirbyoc.compile(mod)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for s in (1, 2, 17, 300):
        args = _inputs("causal", seed=s, m=s, n=s)
        got = vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()
        _assert_matches(got, _reference("causal", *args))


def test_pytorch_sdpa_with_its_added_mask_is_one_call_and_right():
    """``F.scaled_dot_product_attention`` as ``torch.export`` writes it adds a float mask
    (0 or -inf) to the scores. That differs from ``where(mask, -inf, s)`` when a masked
    score is +inf or NaN (the sum is NaN), so the kernel takes it with the added mask's
    own semantics (TIRBYOC_ATT_MASK_ADD): one call, against PyTorch."""
    torch = pytest.importorskip("torch")
    from tvm.relax.frontend.torch import from_exported_program

    class Sdpa(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    q, k, v = (torch.randn(B, H, M, D, generator=torch.Generator().manual_seed(i))
               for i in range(3))
    with torch.no_grad():
        mod = from_exported_program(torch.export.export(Sdpa().eval(), (q, k, v)))
        ref = Sdpa()(q, k, v).numpy()
    assert [r.intrinsic for r in tirbyoc.explain(mod).offloaded] == ["attention"]
    got = _run(mod, [t.numpy() for t in (q, k, v)])
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


def _packed(form, s, heads=3, d=8):
    """Attention as torch.export writes it around a packed projection: ``x`` [S, 3 H D]
    (Q, K, V side by side) is cut by ``take`` ("take": reshape to [S, 1, 3, H D], move
    the 3 first, take 0/1/2) or ``split`` ("split"), each part reshaped to heads and
    transposed, Q and K scaled by c each, the scores divided by 2; the output transposed
    back to [S, H D]. "copy_v": V's heads merged by a reshape that is no view of x."""
    bb = relax.BlockBuilder()
    hd = heads * d
    x = relax.Var("x", relax.TensorType((s, 3 * hd), "float32"))
    c = relax.const(0.5, "float32")
    with bb.function("main", [x]):
        with bb.dataflow():
            if form == "take":
                t = bb.emit(op_.squeeze(bb.emit(op_.permute_dims(bb.emit(op_.expand_dims(
                    bb.emit(op_.reshape(x, (s, 1, 3, hd))), [0])), [3, 1, 2, 0, 4])), [-2]))
                parts = [bb.emit(op_.take(t, relax.const(i, "int64"), axis=0)) for i in range(3)]
            else:
                sp = bb.emit(op_.split(x, [hd, 2 * hd], axis=1))
                parts = [bb.emit(relax.TupleGetItem(sp, i)) for i in range(3)]
            q, k, v = (bb.emit(op_.permute_dims(bb.emit(op_.reshape(p, (s, heads, d))),
                                                [1, 0, 2])) for p in parts)
            if form == "copy_v":
                # [H, S, D] -> [S, H, D] -> [H, S, D] again through a flat [S, H*D]
                flat = bb.emit(op_.reshape(bb.emit(op_.permute_dims(v, [1, 0, 2])), (s, hd)))
                v = bb.emit(op_.reshape(flat, (heads, s, d)))
            q = bb.emit(op_.multiply(q, c))
            kt = bb.emit(op_.multiply(bb.emit(op_.permute_dims(k, [0, 2, 1])), c))
            sc = bb.emit(op_.divide(bb.emit(op_.matmul(q, kt)), relax.const(2.0, "float32")))
            o = bb.emit(op_.matmul(bb.emit(op_.nn.softmax(sc, axis=-1)), v))
            out = bb.emit(op_.reshape(bb.emit(op_.permute_dims(o, [1, 0, 2])), (s, hd)))
            gv = bb.emit_output(out)
        bb.emit_func_output(gv)
    return bb.get()


def _packed_reference(form, x, heads=3, d=8):
    s, hd = x.shape[0], heads * d
    q, k, v = (x[:, i * hd:(i + 1) * hd].astype(np.float64).reshape(s, heads, d)
               .transpose(1, 0, 2) for i in range(3))
    if form == "copy_v":
        v = v.transpose(1, 0, 2).reshape(heads, s, d)
    sc = (q * 0.5) @ (k * 0.5).transpose(0, 2, 1) / 2.0
    e = np.exp(sc - sc.max(-1, keepdims=True))
    return ((e / e.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(s, hd)


op_ = relax.op


@pytest.mark.parametrize("form", ["take", "split", "copy_v"])
@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "dynamic"])
def test_views_around_the_region_are_read_and_written_in_place(form, symbolic):
    """The kernel reads Q, K and V out of the packed tensor and writes the [S, H D]
    result directly: no PrimFunc is left but the kernel's (and, for "copy_v", V's one
    copy, which no strided view can express). The factors on Q and K join the scale."""
    s = tvm.tirx.Var("s", "int64") if symbolic else 29
    mod = _packed(form, s)
    report = tirbyoc.explain(mod)
    assert [r.intrinsic for r in report.offloaded] == ["attention"], str(report)
    copies = sorted(name for name in report.schedules if name != "tirbyoc_attention")
    assert len(copies) == (1 if form == "copy_v" else 0), report.schedules
    ex = tirbyoc.compile(mod)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for length in ((1, 29, 70) if symbolic else (29,)):
        x = np.random.default_rng(length).standard_normal((length, 72)).astype(np.float32)
        _assert_matches(vm["main"](tvm.runtime.tensor(x)).numpy(), _packed_reference(form, x))
