"""``tirbyoc.check(lib)``: every declared kernel against TVM's own build of what it
replaces.

For each kernel of a ``tirbyoc.Library``, ``check`` writes the Relax graph of its
declared op (the product or convolution, then the epilogue in order: what the matcher
would hand the kernel), builds it with TVM's default pipeline (no tirbyoc: TVM's own
code for the same TIR), and calls the kernel through cffi on the same inputs:

* sizes drawn at random within the declared constraints, edge sizes first (1, primes,
  one past a multiple of 8 and 16);
* where the kernel takes a stride argument (``lda``, ``ldc``...), operands with padded
  rows;
* one case with a NaN and infinities in the first row (or pixel) of ``x``: the outputs
  that read them may be anything (what an activation makes of a NaN differs between
  libraries: TVM's relu gives 0, PyTorch's NaN), every other output must match and stay
  finite (a NaN must not leak into other rows);
* a status other than 0 is a failure.

Outputs match when ``|kernel - tvm| <= atol + rtol * |tvm|`` with ``rtol = 1e-4`` and
``atol = 1e-5 * sqrt(r) * max|tvm|`` (``r``: the products summed per output, so that
float32 sums in another order agree). The report gives, per kernel, the cases run and
the first mismatch with its inputs (sizes, the seed that drew them, the worst element).
A kernel that crashes takes the process with it: run ``check`` in a subprocess to
survive one (``python -c "import mylib; print(tirbyoc.check(mylib.lib))"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .ops import geometry_roles, out_size

EDGE_SIZES = (1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 64, 65)
RTOL = 1e-4
ATOL_PER_TERM = 1e-5


@dataclass
class Mismatch:
    case: dict  # the sizes and geometry of the case, and its seed
    detail: str  # what went wrong: the worst element, or a status


@dataclass
class KernelReport:
    kernel: str  # <library>.<symbol>
    computes: str  # the op's name (dense_bias_relu)
    cases: int = 0
    failures: int = 0
    first: Mismatch | None = None
    skipped: str = ""  # why the kernel was not run (a family without a checker yet)

    @property
    def ok(self) -> bool:
        return self.skipped != "" or (self.cases > 0 and self.failures == 0)


@dataclass
class Report:
    library: str
    kernels: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(k.ok for k in self.kernels)

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        lines = [f"tirbyoc.check({self.library}): {len(self.kernels)} kernels, "
                 f"{sum(k.cases for k in self.kernels)} cases against TVM's own build"]
        width = max([len(k.kernel) for k in self.kernels] + [6])
        cw = max([len(k.computes) for k in self.kernels] + [8])
        for k in self.kernels:
            verdict = f"not run: {k.skipped}" if k.skipped else \
                "ok" if k.ok else f"FAILED {k.failures} of {k.cases}"
            lines.append(f"  {k.kernel.ljust(width)}  {k.computes:<{cw}} {k.cases:4d} cases  "
                         f"{verdict}")
            if k.first is not None:
                case = ", ".join(f"{a}={b}" for a, b in k.first.case.items())
                lines.append(f"  {' ' * width}  first: {case}: {k.first.detail}")
        return "\n".join(lines)

    __repr__ = __str__


def check(library, *, cases: int = 24, seed: int = 0, kernels=None) -> Report:
    """Test every declared kernel of ``library`` (or the ``kernels`` named, by symbol)
    on ``cases`` random cases each (plus the edge and NaN/Inf cases); see the module
    docstring. Returns a ``Report`` (truthy when every kernel passed; ``str`` is a
    table)."""
    report = Report(library.name)
    for kernel in library.kernels:
        if kernels is not None and kernel.symbol not in kernels:
            continue
        from .ops import family, resolve

        path = family(kernel.op.family).checker
        checker = resolve(path) if path else None
        if checker is None:
            report.kernels.append(KernelReport(
                kernel.name, _computes(kernel.op),
                skipped=f"no checker for the {kernel.op.family} family yet"))
            continue
        report.kernels.append(checker(kernel, cases, seed))
    return report


# ---- shared ----

def _compiled(builder):
    """A VM of TVM's own build of the Relax module ``builder()`` returns (cached)."""
    import tvm
    from tvm import relax

    from . import _tvm as T

    mod = builder()
    ex = tvm.compile(mod, T.host_target())
    return relax.VirtualMachine(ex, tvm.cpu())


_VMS: dict = {}


def _vm(key, builder):
    """TVM's build of ``builder()``, once per ``key`` in a process."""
    if key not in _VMS:
        _VMS[key] = _compiled(builder)
    return _VMS[key]


def _run_vm(vm, *inputs):
    import tvm

    # NOTE: np.ascontiguousarray makes a 0-d array 1-d
    out = vm["main"](*[tvm.runtime.tensor(np.require(a, requirements="C")) for a in inputs])
    return out.numpy()


def _compare(got, ref, terms, tainted=None) -> str | None:
    """Why ``got`` does not match ``ref`` (see the module docstring), or None;
    ``tainted``: outputs not compared (they read a NaN or an infinity)."""
    finite = np.isfinite(ref)
    if tainted is not None:
        finite &= ~tainted
    if not finite.any():
        return None
    scale = float(np.max(np.abs(ref[finite]))) if finite.any() else 0.0
    atol = ATOL_PER_TERM * math.sqrt(max(terms, 1)) * max(scale, 1e-30)
    bad_finite = finite & ~np.isfinite(got)
    if bad_finite.any():
        i = tuple(int(v) for v in np.argwhere(bad_finite)[0])
        return f"element {i} is {got[i]}, TVM's is {ref[i]}"
    with np.errstate(invalid="ignore"):
        err = np.where(finite, np.abs(got.astype(np.float64) - ref), 0.0)
    limit = atol + RTOL * np.abs(np.where(finite, ref, 0.0))
    over = err > limit
    if over.any():
        i = tuple(int(v) for v in np.unravel_index(np.argmax(err - limit), err.shape))
        return (f"element {i} is {float(got[i])!r}, TVM's is {float(ref[i])!r} (|error| "
                f"{err[i]:.3g} > {limit[i]:.3g})")
    return None


def _computes(op) -> str:
    """``dense_bias_relu (nt)``: the op's name and its layouts."""
    name = op.name.replace("conv2d", "depthwise_conv2d") if op.constraints.get("depthwise") \
        else op.name
    layouts = ", ".join(str(v) for v in op.layouts.values())
    return f"{name} ({layouts})" if layouts else name


def _record(report, case, detail):
    report.cases += 1
    if detail is not None:
        report.failures += 1
        if report.first is None:
            report.first = Mismatch(case, detail)


def _draw(rng, names, op, fixed=None, count=24, edges=True):
    """Size dicts: edge sizes first, then random ones, all within ``op``'s
    constraints (``fixed``: values that are not drawn)."""
    fixed = dict(fixed or {})
    out, tries = [], 0
    if edges:
        for size in (1, 3, 17, 33):
            case = {n: size for n in names}
            case.update(fixed)
            if op.violation(case) is None:
                out.append(case)
    while len(out) < count and tries < 100 * count:
        tries += 1
        case = {n: int(rng.choice(EDGE_SIZES)) if rng.random() < 0.5 else
                int(rng.integers(1, 97)) for n in names}
        case.update(fixed)
        if op.violation(case) is None:
            out.append(case)
    return out


def _call(kernel, arrays: dict, values: dict):
    """Call ``kernel`` through cffi: tensors from ``arrays`` (numpy, by role), the rest
    from ``values``. Returns its status (0 for a void kernel)."""
    ffi, lib = kernel.library.ffi()
    args = []
    from .ops import Const

    for role, ct in zip(kernel.args, kernel.types):
        if isinstance(role, Const):
            args.append(ffi.NULL if ct.kind == "pointer" else role.value)
        elif role in arrays:
            a = np.ascontiguousarray(arrays[role])
            if a is not arrays[role]:
                raise AssertionError(f"{role}: the checker passes contiguous arrays only")
            cname = {"float32": "float[]", "uint8": "uint8_t[]", "int8": "int8_t[]"}.get(
                ct.element)
            args.append(ffi.from_buffer(cname, a) if cname else ffi.from_buffer(a))
        elif values.get(role) is None and ct.kind == "pointer":
            args.append(ffi.NULL)
        else:
            args.append(values[role])
    status = getattr(lib, kernel.symbol)(*args)
    return 0 if status is None else int(status)


def _epilogue(bb, R, y, steps, params):
    """Emit the epilogue steps on ``y`` with the Relax params ``params`` (by role)."""
    for step in steps:
        if step == "bias":
            y = bb.emit(R.op.add(y, params["bias"]))
        elif step == "residual":
            y = bb.emit(R.op.add(y, params["residual"]))
        elif step == "scale":
            y = bb.emit(R.op.multiply(y, params["scale"]))
        elif step == "relu6":
            y = bb.emit(R.op.clip(y, 0.0, 6.0))
        elif step == "relu":
            y = bb.emit(R.op.nn.relu(y))
        elif step == "gelu":
            y = bb.emit(R.op.nn.gelu(y))
        elif step == "gelu_tanh":
            y = bb.emit(R.op.nn.gelu_tanh(y))
        elif step == "silu":
            y = bb.emit(R.op.nn.silu(y))
        elif step == "sigmoid":
            y = bb.emit(R.op.sigmoid(y))
        elif step == "tanh":
            y = bb.emit(R.op.tanh(y))
        elif step in ("hardswish", "hardsigmoid"):  # as PyTorch's frontend writes them
            three, six = (R.const(v, "float32") for v in (3.0, 6.0))
            clamp = bb.emit(R.op.clip(bb.emit(R.op.add(y, three)), 0.0, 6.0))
            if step == "hardswish":
                clamp = bb.emit(R.op.multiply(y, clamp))
            y = bb.emit(R.op.divide(clamp, six))
    return y


def _poison(x):
    """``x`` with a NaN, a +Inf and a -Inf at the start of its first row (as many as
    fit)."""
    x = x.copy()
    row = x.reshape(-1, x.shape[-1])[0]
    for i, v in enumerate((np.nan, np.inf, -np.inf)[:row.size]):
        row[i] = v
    return x


# ---- matrix families ----

def _matrix_module(family, epilogue, layout):
    from tvm import relax as R
    from tvm import tirx

    def build():
        bb = R.BlockBuilder()
        b, m, n, k = (tirx.Var(v, "int64") for v in "bmnk")
        lead = [b] if family == "matmul" else []
        x = R.Var("x", R.TensorType(lead + [m, k], "float32"))
        wshape = lead + ([n, k] if layout == "nt" else [k, n])
        w = R.Var("w", R.TensorType(wshape, "float32"))
        params = {"x": x, "weight": w}
        if "bias" in epilogue:
            params["bias"] = R.Var("bias", R.TensorType([n], "float32"))
        if "residual" in epilogue:
            params["residual"] = R.Var("residual", R.TensorType(lead + [m, n], "float32"))
        if "scale" in epilogue:
            params["scale"] = R.Var("scale", R.TensorType([], "float32"))
        with bb.function("main", list(params.values())):
            with bb.dataflow():
                wt = w if layout == "nn" else bb.emit(R.op.permute_dims(
                    w, [0, 2, 1] if lead else [1, 0]))
                y = _epilogue(bb, R, bb.emit(R.op.matmul(x, wt)), epilogue, params)
                out = bb.emit_output(y)
            bb.emit_func_output(out)
        return bb.get()

    return build


def _padded(rng, shape, pad):
    """A float32 array of ``shape`` whose rows sit in rows ``pad`` elements longer."""
    full = rng.standard_normal(tuple(shape[:-1]) + (shape[-1] + pad,)).astype(np.float32)
    return full[..., :shape[-1]], full


def check_matrix(kernel, count, seed):
    op = kernel.op
    report = KernelReport(kernel.name, _computes(op))
    layout = op.layouts["weight"]
    batched = op.family == "matmul"
    vm = _vm(("matrix", op.family, op.epilogue, layout),
             _matrix_module(op.family, op.epilogue, layout))
    rng = np.random.default_rng(seed)
    names = ["batch", "m", "n", "k"] if batched else ["m", "n", "k"]
    draws = _draw(rng, names, op, count=count)
    for index, case in enumerate(draws + draws[:1]):
        poisoned = index == len(draws)
        case = dict(case, seed=seed, case=index)
        crng = np.random.default_rng([seed, index])
        b, m, n, k = case.get("batch", 1), case["m"], case["n"], case["k"]
        lead = (b,) if batched else ()
        pad = int(crng.integers(1, 5)) if any(r in kernel.args for r in
                                              ("lda", "ldw", "ldc")) else 0
        x, x_full = _padded(crng, lead + (m, k), pad if "lda" in kernel.args else 0)
        if poisoned:
            x_full = _poison(x_full)
            x = x_full[..., :k]
        wshape = lead + ((n, k) if layout == "nt" else (k, n))
        w, w_full = _padded(crng, wshape, pad if "ldw" in kernel.args else 0)
        arrays = {"x": x_full, "weight": w_full}
        inputs = [np.ascontiguousarray(x), np.ascontiguousarray(w)]
        values = {"m": m, "n": n, "k": k, "batch": b, "lda": x_full.shape[-1],
                  "ldw": w_full.shape[-1]}
        if "bias" in op.epilogue:
            arrays["bias"] = crng.standard_normal(n).astype(np.float32)
            inputs.append(arrays["bias"])
        if "residual" in op.epilogue:
            arrays["residual"] = crng.standard_normal(lead + (m, n)).astype(np.float32)
            inputs.append(arrays["residual"])
            values["ldr"] = n
            values["batch_stride_residual"] = m * n
        if "scale" in op.epilogue:
            scale = np.float32(crng.uniform(0.1, 2.0))
            values["scale"] = float(scale)
            inputs.append(np.array(scale, np.float32))
        ldc = n + (pad if "ldc" in kernel.args else 0)
        y_full = np.full(lead + (m, ldc), np.nan, np.float32)
        arrays["y"] = y_full
        values.update(ldc=ldc, batch_stride_x=int(np.prod(x_full.shape[-2:])),
                      batch_stride_weight=int(np.prod(w_full.shape[-2:])),
                      batch_stride_y=m * ldc)
        ref = _run(report, case, vm, inputs, kernel, arrays, values)
        if ref is None:
            continue
        tainted = None
        if poisoned:
            tainted = np.zeros(ref.shape, bool)
            tainted.reshape(-1, m, n)[0, 0, :] = True
        _record(report, _describe_case(case, poisoned),
                _compare(y_full[..., :n], ref, k, tainted))
    return report


def _run(report, case, vm, inputs, kernel, arrays, values):
    """TVM's output on ``inputs`` (float64), after calling the kernel; None when the
    kernel returned an error status (recorded as the case's failure)."""
    ref = _run_vm(vm, *inputs).astype(np.float64)
    status = _call(kernel, arrays, values)
    if status:
        _record(report, case, f"returned status {status}")
        return None
    return ref


def _describe_case(case, poisoned):
    return dict(case, inputs="x with NaN and +-Inf") if poisoned else case


# ---- conv2d ----

def _conv_module(shape, geometry, epilogue):
    def build():
        from tvm import relax as R

        n, c, h, w, oc, kh, kw = shape
        stride, pad, dilation, groups = geometry
        bb = R.BlockBuilder()
        x = R.Var("x", R.TensorType([n, c, h, w], "float32"))
        wt = R.Var("w", R.TensorType([oc, c // groups, kh, kw], "float32"))
        params = {"x": x, "weight": wt}
        oh = out_size(h, kh, stride[0], pad[0], pad[2], dilation[0])
        ow = out_size(w, kw, stride[1], pad[1], pad[3], dilation[1])
        if "bias" in epilogue:
            params["bias"] = R.Var("bias", R.TensorType([1, oc, 1, 1], "float32"))
        if "residual" in epilogue:
            params["residual"] = R.Var("residual", R.TensorType([n, oc, oh, ow], "float32"))
        if "scale" in epilogue:
            params["scale"] = R.Var("scale", R.TensorType([], "float32"))
        with bb.function("main", list(params.values())):
            with bb.dataflow():
                y = bb.emit(R.op.nn.conv2d(x, wt, strides=stride, padding=pad,
                                           dilation=dilation, groups=groups))
                out = bb.emit_output(_epilogue(bb, R, y, epilogue, params))
            bb.emit_func_output(out)
        return bb.get()

    return build


def _pick(rng, want, choices):
    """A value for a constraint: the constraint's own, or one of ``choices`` it takes."""
    if want is not None and not callable(want):
        return want
    ok = [c for c in choices if want is None or want(c)]
    return ok[int(rng.integers(len(ok)))] if ok else None


def check_conv(kernel, count, seed):
    op = kernel.op
    report = KernelReport(kernel.name, _computes(op))
    rng = np.random.default_rng(seed)
    con = op.constraints
    args = kernel.args
    count = max(4, count // 3)  # each case is a build of its own
    made = 0
    for index in range(count * 20):
        if made >= count:
            break
        stride = _pick(rng, con.get("stride"), [(1, 1), (2, 2), (1, 2)] if "stride" not in args
                       else [(1, 1), (2, 2)])
        dilation = _pick(rng, con.get("dilation"), [(1, 1), (2, 2)])
        kern = _pick(rng, con.get("kernel"), [(1, 1), (3, 3), (5, 5), (1, 3)])
        p = int(rng.integers(0, 3))
        pad = _pick(rng, con.get("pad"), [(p,) * 4] if "pad" in args else
                    [(p,) * 4, (p, 0, p + 1, 1)])
        depthwise = con.get("depthwise")
        groups = _pick(rng, con.get("groups"), [2, 3, 8, 16] if depthwise else [1, 2, 4])
        if None in (stride, dilation, kern, pad, groups):
            continue
        cg, ocg = int(rng.integers(1, 9)), int(rng.integers(1, 9))
        if depthwise:
            cg, ocg = 1, 1
        c, oc = cg * groups, ocg * groups
        n = _pick(rng, con.get("batch"), [1, 2])
        h = _pick(rng, con.get("height"), list(range(kern[0] * dilation[0], 20)))
        w = _pick(rng, con.get("width"), list(range(kern[1] * dilation[1], 20)))
        if None in (n, h, w):
            continue
        values = {"stride": stride, "dilation": dilation, "kernel": kern, "pad": pad,
                  "groups": groups, "batch": n, "in_channels": c, "out_channels": oc,
                  "height": h, "width": w, "depthwise": groups == c == oc and groups > 1}
        if op.violation(values) is not None:
            continue
        if ("stride" in args and stride[0] != stride[1]) or \
                ("dilation" in args and dilation[0] != dilation[1]) or \
                ("pad" in args and len(set(pad)) != 1):
            continue
        case = dict(values, seed=seed, case=made)
        poisoned = made == count - 1
        made += 1
        crng = np.random.default_rng([seed, index])
        vm = _vm(("conv", (n, c, h, w, oc) + tuple(kern), (stride, pad, dilation, groups),
                  op.epilogue),
                 _conv_module((n, c, h, w, oc) + tuple(kern), (stride, pad, dilation, groups),
                              op.epilogue))
        x = crng.standard_normal((n, c, h, w)).astype(np.float32)
        if poisoned:
            x = _poison(x)
        wt = crng.standard_normal((oc, c // groups) + tuple(kern)).astype(np.float32)
        inputs = [x, wt]
        kw_layout = np.ascontiguousarray(wt.transpose(0, 2, 3, 1)) \
            if op.layouts["weight"] == "OHWI" else wt
        oh = out_size(h, kern[0], stride[0], pad[0], pad[2], dilation[0])
        ow = out_size(w, kern[1], stride[1], pad[1], pad[3], dilation[1])
        arrays = {"x": x, "weight": kw_layout}
        if "bias" in op.epilogue:
            bias = crng.standard_normal(oc).astype(np.float32)
            arrays["bias"] = bias
            inputs.append(bias.reshape(1, oc, 1, 1))
        if "residual" in op.epilogue:
            arrays["residual"] = crng.standard_normal((n, oc, oh, ow)).astype(np.float32)
            inputs.append(arrays["residual"])
        scalars = {}
        if "scale" in op.epilogue:
            scale = np.float32(crng.uniform(0.1, 2.0))
            scalars["scale"] = float(scale)
            inputs.append(np.array(scale, np.float32))
        y = np.full((n, oc, oh, ow), np.nan, np.float32)
        arrays["y"] = y
        sizes = dict(scalars, batch=n, in_channels=c, height=h, width=w, out_channels=oc,
                     kernel_h=kern[0], kernel_w=kern[1], out_h=oh, out_w=ow, groups=groups,
                     **geometry_roles(stride, pad, dilation))
        ref = _run(report, case, vm, inputs, kernel, arrays, sizes)
        if ref is None:
            continue
        tainted = None
        if poisoned:  # the outputs of batch 0 whose window reads row 0, columns 0..2
            rows = np.arange(oh)[:, None] * stride[0] - pad[0] + \
                np.arange(kern[0])[None, :] * dilation[0]
            cols = np.arange(ow)[:, None] * stride[1] - pad[1] + \
                np.arange(kern[1])[None, :] * dilation[1]
            hit_r = (rows == 0).any(1)
            hit_c = ((cols >= 0) & (cols <= 2)).any(1)
            tainted = np.zeros(y.shape, bool)
            tainted[0] = (hit_r[:, None] & hit_c[None, :])[None]
        _record(report, _describe_case(case, poisoned), _compare(
            y, ref, (c // groups) * kern[0] * kern[1], tainted))
    return report


# ---- pooling and softmax ----

def _pool_module(family, shape, kern, stride, pad, count_include_pad):
    def build():
        from tvm import relax as R

        bb = R.BlockBuilder()
        x = R.Var("x", R.TensorType(list(shape), "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                if family == "max_pool2d":
                    y = R.op.nn.max_pool2d(x, kern, stride, pad)
                else:
                    y = R.op.nn.avg_pool2d(x, kern, stride, pad,
                                           count_include_pad=count_include_pad)
                out = bb.emit_output(bb.emit(y))
            bb.emit_func_output(out)
        return bb.get()

    return build


def check_pool(kernel, count, seed):
    op = kernel.op
    report = KernelReport(kernel.name, _computes(op))
    rng = np.random.default_rng(seed)
    con, args = op.constraints, kernel.args
    include = bool(con.get("count_include_pad", False))
    made = 0
    for index in range(max(4, count // 3) * 20):
        if made >= max(4, count // 3):
            break
        kern = _pick(rng, con.get("kernel"), [(2, 2), (3, 3), (1, 1), (2, 3)])
        stride = _pick(rng, con.get("stride"), [(1, 1), (2, 2), (1, 2)])
        if kern is None or stride is None:
            continue
        p = int(rng.integers(0, min(kern) // 2 + 1))
        pad = _pick(rng, con.get("pad"), [(p,) * 4])
        n, c = _pick(rng, con.get("batch"), [1, 2]), _pick(rng, con.get("channels"), [1, 3, 8])
        h = _pick(rng, con.get("height"), list(range(kern[0], 16)))
        w = _pick(rng, con.get("width"), list(range(kern[1], 16)))
        if None in (pad, n, c, h, w):
            continue
        values = {"kernel": kern, "stride": stride, "pad": pad, "batch": n, "channels": c,
                  "height": h, "width": w, "count_include_pad": include}
        if op.violation(values) is not None or ("stride" in args and stride[0] != stride[1]):
            continue
        case = dict(values, seed=seed, case=made)
        made += 1
        crng = np.random.default_rng([seed, index])
        x = crng.standard_normal((n, c, h, w)).astype(np.float32)
        vm = _vm(("pool", op.family, (n, c, h, w), kern, stride, pad, include),
                 _pool_module(op.family, (n, c, h, w), kern, stride, pad, include))
        oh = out_size(h, kern[0], stride[0], pad[0], pad[2])
        ow = out_size(w, kern[1], stride[1], pad[1], pad[3])
        y = np.full((n, c, oh, ow), np.nan, np.float32)
        sizes = {"batch": n, "channels": c, "height": h, "width": w, "out_h": oh, "out_w": ow,
                 "kernel_h": kern[0], "kernel_w": kern[1], **geometry_roles(stride, pad)}
        ref = _run(report, case, vm, [x], kernel, {"x": x, "y": y}, sizes)
        if ref is None:
            continue
        _record(report, case, _compare(y, ref, kern[0] * kern[1]))
    return report


def _softmax_module():
    from tvm import relax as R
    from tvm import tirx

    bb = R.BlockBuilder()
    r, c = tirx.Var("r", "int64"), tirx.Var("c", "int64")
    x = R.Var("x", R.TensorType([r, c], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(R.op.nn.softmax(x, axis=-1)))
        bb.emit_func_output(out)
    return bb.get()


def check_softmax(kernel, count, seed):
    op = kernel.op
    report = KernelReport(kernel.name, _computes(op))
    rng = np.random.default_rng(seed)
    vm = _vm(("softmax",), _softmax_module)
    draws = _draw(rng, ["rows", "cols"], op, count=count)
    for index, case in enumerate(draws + draws[:1]):
        poisoned = index == len(draws)
        crng = np.random.default_rng([seed, index])
        x = (crng.standard_normal((case["rows"], case["cols"])) * 4).astype(np.float32)
        if poisoned:
            x = _poison(x)
        y = np.full_like(x, np.nan)
        sizes = dict(case, ldx=case["cols"], ldy=case["cols"])
        case = _describe_case(dict(case, seed=seed, case=index), poisoned)
        ref = _run(report, case, vm, [x], kernel, {"x": x, "y": y}, sizes)
        if ref is None:
            continue
        tainted = None
        if poisoned:
            tainted = np.zeros(y.shape, bool)
            tainted[0] = True
        _record(report, case, _compare(y, ref, case["cols"], tainted))
    return report


# ---- attention ----

def _attention_module(k_layout, masked):
    from tvm import relax as R
    from tvm import tirx

    bb = R.BlockBuilder()
    b, m, n, d, dv = (tirx.Var(v, "int64") for v in ("b", "m", "n", "d", "dv"))
    q = R.Var("q", R.TensorType([b, m, d], "float32"))
    k = R.Var("k", R.TensorType([b, n, d] if k_layout == "nt" else [b, d, n], "float32"))
    v = R.Var("v", R.TensorType([b, n, dv], "float32"))
    scale = R.Var("scale", R.TensorType([], "float32"))
    params = [q, k, v, scale]
    if masked:
        mask = R.Var("mask", R.TensorType([b, m, n], "bool"))
        params.append(mask)
    with bb.function("main", params):
        with bb.dataflow():
            kt = bb.emit(R.op.permute_dims(k, [0, 2, 1])) if k_layout == "nt" else k
            s = bb.emit(R.op.multiply(bb.emit(R.op.matmul(q, kt)), scale))
            if masked:
                s = bb.emit(R.op.where(mask, R.const(-np.inf, "float32"), s))
            p = bb.emit(R.op.nn.softmax(s, axis=-1))
            out = bb.emit_output(bb.emit(R.op.matmul(p, v)))
        bb.emit_func_output(out)
    return bb.get()


def check_attention(kernel, count, seed):
    """Attention against TVM: random sizes, half the cases with a boolean mask (never a
    whole row: a fully masked row is NaN in both, and not compared)."""
    op = kernel.op
    report = KernelReport(kernel.name, _computes(op))
    layout = op.layouts["k"]
    rng = np.random.default_rng(seed)
    draws = _draw(rng, ["batch", "seq_q", "seq_k", "head_dim", "value_dim"], op,
                  count=count)
    for index, case in enumerate(draws):
        masked = "mask" in kernel.args and index % 2 == 1
        vm = _vm(("attention", layout, masked),
                 lambda masked=masked: _attention_module(layout, masked))
        crng = np.random.default_rng([seed, index])
        b, m, n = case["batch"], case["seq_q"], case["seq_k"]
        d, dv = case["head_dim"], case["value_dim"]
        q = crng.standard_normal((b, m, d)).astype(np.float32)
        k = crng.standard_normal((b, n, d) if layout == "nt" else (b, d, n)).astype(
            np.float32)
        v = crng.standard_normal((b, n, dv)).astype(np.float32)
        scale = np.float32(1.0 / math.sqrt(d))
        inputs = [q, k, v, np.array(scale, np.float32)]
        arrays = {"q": q, "k": k, "v": v}
        if masked:
            mask = crng.random((b, m, n)) < 0.3
            mask[..., 0] = False
            inputs.append(mask)
            arrays["mask"] = mask.astype(np.uint8)
        y = np.full((b, m, dv), np.nan, np.float32)
        arrays["y"] = y
        values = {"batch": b, "seq_q": m, "seq_k": n, "head_dim": d, "value_dim": dv,
                  "ldq": d, "ldk": k.shape[-1], "ldv": dv, "ldy": dv, "ldmask": n,
                  "batch_stride_q": m * d, "batch_stride_k": n * d,
                  "batch_stride_v": n * dv, "batch_stride_y": m * dv,
                  "batch_stride_mask": m * n, "mask_repeat": 1, "scale": float(scale),
                  "mask": None}
        case = dict(case, seed=seed, case=index, mask=masked)
        ref = _run(report, case, vm, inputs, kernel, arrays, values)
        if ref is None:
            continue
        _record(report, case, _compare(y, ref, n + d))
    return report
