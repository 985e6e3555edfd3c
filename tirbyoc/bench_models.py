"""Model benchmark: whole models from PyTorch (or a user's ONNX file) through tirbyoc
against PyTorch eager, ONNX Runtime and TVM's default build, in one run.

    python -m tirbyoc.bench --models [--model gpt2_block] [--reps 20] [--no-tvm]
    tirbyoc bench model.onnx [--shape x=1,128,768]

For every model it imports the PyTorch module with ``torch.export`` (weights as
constants), compiles it with ``tirbyoc.compile`` (no tuning), exports the same module to
ONNX for ONNX Runtime, checks every contender's output against PyTorch (relative error of
max|reference| <= 1e-4), then times them interleaved on the same thread count (medians,
an idle pause before each measurement so that thread pools settle). Transformers are also
exported with a symbolic sequence axis and one build runs at several lengths. It prints a
table and, per model, where the tirbyoc build spends its time (wall time per called
function, from the VM's instrument hook), and writes ``models.json`` and ``models.png``.
"""

from __future__ import annotations

import functools
import io
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import kernels
from .timing import SETTLE_SECONDS, interleaved

RTOL = 1e-4


def float64_tolerance(rel_err: dict) -> float:
    """The bar for tirbyoc's error against a float64 reference: RTOL or twice ONNX
    Runtime's float32 error, whichever is larger. A deep net with random batch norms
    (MobileNetV2) puts every float32 build near 1e-4 of float64 (PyTorch, ONNX Runtime
    and tirbyoc alike), so RTOL alone would flag the model, not the build."""
    return max(RTOL, 2 * rel_err.get("ort", 0.0))


@dataclass
class ModelSpec:
    """A benchmark model: ``build()`` gives the eval-mode torch module, ``shape(seq)`` the
    input shape; ``seqs``: sequence lengths run from one dynamic-sequence build (empty:
    static shapes only)."""

    name: str
    build: Callable
    shape: Callable
    seqs: tuple = ()
    static_seq: int = 128


def _mlp():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 10)).eval()


def _registry():
    from . import examples

    return {
        "gpt2_block": ModelSpec("gpt2_block", lambda: examples.gpt2_block_torch(768, 12),
                                lambda s: (1, s, 768), seqs=(32, 384)),
        "bert_layer": ModelSpec("bert_layer", lambda: examples.encoder_layer_torch(768, 12, 3072),
                                lambda s: (1, s, 768), seqs=(32, 384)),
        "mlp": ModelSpec("mlp", _mlp, lambda s: (256, 784)),
        "small_cnn": ModelSpec("small_cnn", examples.small_cnn_torch, lambda s: (8, 3, 32, 32)),
        "resnet_mini": ModelSpec("resnet_mini",
                                 lambda: examples.resnet_torch((1, 1), (64, 128), 10),
                                 lambda s: (1, 3, 112, 112)),
        "resnet18": ModelSpec("resnet18", examples.resnet_torch, lambda s: (1, 3, 224, 224)),
        "mobilenet": ModelSpec("mobilenet", examples.mobilenet_torch, lambda s: (1, 3, 224, 224)),
    }


MODELS = tuple(_registry())


@dataclass
class Contenders:
    """Callables running one input, and their outputs for the check."""

    fns: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)


def _first(out):
    while isinstance(out, (list, tuple)) or (hasattr(out, "__len__") and not
                                             hasattr(out, "numpy")):
        out = out[0]
    return out.numpy() if hasattr(out, "numpy") else np.asarray(out)


def _rel_err(got, ref) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - ref)) /
                 max(float(np.max(np.abs(ref))), 1e-30))


def _ort_session(onnx_bytes, threads):
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise SystemExit("onnxruntime is not installed: pip install 'tirbyoc[bench]'") from exc
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(onnx_bytes, so, providers=["CPUExecutionProvider"])


def failure(exc, limit=300) -> str:
    """``Type: last line of the message`` of an exception (a build's or an import's), for
    a benchmark's FAILED footer."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[-1][:limit] if lines else ''}"


def finish(rows, table, failed, bad, out, threads, name) -> int:
    """A benchmark run's end: ``table`` (or "no model ran"), the JSON and plot of the rows
    (if any) in ``out``, the FAILED and NUMERICS OUT OF TOLERANCE footers; 1 if either
    lists something, else 0."""
    print(table if rows else "no model ran")
    if rows:
        paths = write(rows, out, threads, name=name)
        print(f"\nwrote {paths[0]} and {paths[1]}")
    if failed:
        print("FAILED:\n  " + "\n  ".join(failed))
    if bad:
        print("NUMERICS OUT OF TOLERANCE:\n  " + "\n  ".join(bad))
    return 1 if bad or failed else 0


def _tensor_bytes(args) -> int:
    total = 0
    for a in args:
        shape, dtype = getattr(a, "shape", None), getattr(a, "dtype", None)
        if shape is not None and dtype is not None:
            total += int(np.prod([int(d) for d in shape], dtype=np.int64)) * \
                np.dtype(str(dtype)).itemsize
    return total


def breakdown(vm, args, runs: int = 5, traffic=None, calls=None, overhead_ms=None,
              func: str = "main") -> list:
    """``[(function, ms per run)]`` of one VM, slowest first: wall time between the VM's
    before/after instrument calls around every packed function it calls, less the time the
    instrument itself adds to each call (``overhead_ms``; default: measured once per
    process, ``instrument_overhead_ms``), so that a cheap function called often shows its
    own cost and not the instrument's. ``traffic``, a dict, gets each function's bytes of
    tensor arguments per run (what it reads and writes at least); ``calls`` its calls per
    run."""
    totals, started, counts = {}, {}, {}
    moved = {} if traffic is None else traffic

    def instrument(func, name, before, ret, *rest):  # noqa: ARG001 (the VM's signature)
        now = time.perf_counter()
        if before:
            moved[name] = moved.get(name, 0) + _tensor_bytes(rest)
            counts[name] = counts.get(name, 0) + 1
            started[name] = time.perf_counter()  # (the bytes counted outside the timing)
        else:
            totals[name] = totals.get(name, 0.0) + now - started.pop(name, now)
        return 0

    if overhead_ms is None:
        overhead_ms = instrument_overhead_ms()
    # NOTE: one run first, untimed: the cores may be idle before (a benchmark's settle),
    # and the first parallel loop that wakes one took up to 4 ms on a VM, which the mean
    # over the runs put on whichever function came first (0.8 ms of Falcon's 7.8)
    vm[func](*args)
    vm.set_instrument(instrument)
    try:
        for _ in range(runs):
            vm[func](*args)
    finally:
        vm.set_instrument(lambda *a: 0)
    for name in moved:
        moved[name] //= runs
    if calls is not None:
        calls.update({name: n // runs for name, n in counts.items()})
    return sorted(((name, max(0.0, t / runs * 1e3 - overhead_ms * counts[name] / runs))
                   for name, t in totals.items()), key=lambda x: -x[1])


# Calls of a cheap builtin in the instrument's calibration function.
_CALIBRATION_CALLS = 200


def _calibration_vm():
    """A VM whose ``many`` makes _CALIBRATION_CALLS more views of one storage than
    ``one`` (``vm.builtin.alloc_tensor``: a fraction of a microsecond each)."""
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    for name, n in (("one", 1), ("many", _CALIBRATION_CALLS + 1)):
        with bb.function(name, []):
            storage = bb.emit(relax.op.memory.alloc_storage(
                relax.ShapeExpr([1024]), 0, "global", "float32"))
            for _ in range(n):
                view = bb.emit(relax.op.memory.alloc_tensor(
                    storage, relax.prim_value(0), relax.ShapeExpr([256]), "float32"))
            bb.emit_func_output(view)
    return relax.VirtualMachine(tvm.compile(bb.get(), target="llvm"), tvm.cpu())


@functools.lru_cache(maxsize=None)
def instrument_overhead_ms(rounds: int = 31) -> float:
    """ms that breakdown's instrument adds to the time it measures for each call: a
    function of _CALIBRATION_CALLS more cheap calls than another, timed without the
    instrument (what the calls cost) and with it (what it reports), medians."""
    vm = _calibration_vm()
    plain = []
    for _ in range(rounds):
        run = {}
        for name in ("one", "many"):
            f = vm[name]
            f()
            start = time.perf_counter()
            for _ in range(20):
                f()
            run[name] = (time.perf_counter() - start) / 20
        plain.append(run["many"] - run["one"])
    cost_ms = max(0.0, float(np.median(plain))) * 1e3 / _CALIBRATION_CALLS
    reported = []
    for _ in range(rounds):
        calls = {}
        times = dict(breakdown(vm, [], runs=1, calls=calls, overhead_ms=0.0, func="many"))
        name = "vm.builtin.alloc_tensor"
        reported.append(times[name] / calls[name])
    return max(0.0, float(np.median(reported)) - cost_ms)


# A function of TVM's code is flagged when it takes more than this many times what its
# tensor arguments need at the machine's copy bandwidth (and at least SLOW_MIN_MS): a
# fallback schedule gone wrong (EfficientNet's ceil-mode average pool once took 459 ms
# for 250 KB). Kernel calls are compute-bound and never flagged.
SLOW_FACTOR = 10.0
SLOW_MIN_MS = 0.05


def copy_bandwidth(megabytes: int = 64, reps: int = 5) -> float:
    """Bytes per second numpy copies (read + write) on one thread: best of ``reps``."""
    src = np.ones(megabytes << 18, np.float32)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best


def flag_slow(times, traffic, kernel_functions, bandwidth, warm=None) -> dict:
    """``{function: times its traffic needs}`` of the functions of TVM's code (tensor
    arguments, no kernel call) that take over SLOW_FACTOR times what their bytes need at
    ``bandwidth`` (bytes/s), and over SLOW_MIN_MS. ``warm`` (``back_to_back``'s ms per
    run, where known): a function is flagged only if it is that slow there too."""
    flagged = {}
    for name, ms in times:
        need_ms = traffic.get(name, 0) / bandwidth * 1e3
        if name in kernel_functions or need_ms <= 0 or ms < SLOW_MIN_MS:
            continue
        if warm is not None and name in warm:
            ms = min(ms, warm[name])
        if ms > SLOW_FACTOR * need_ms:
            flagged[name] = ms / need_ms
    return flagged


def back_to_back(vm, args, names, repeats: int = 5, func: str = "main") -> dict:
    """``{function: ms per run}`` of the functions ``names`` when each call runs again
    right after itself, ``repeats`` times (the least time of those, summed over the
    function's calls in one run): what the function costs with its threads awake. The
    breakdown's instrument returns to Python between calls, and TVM's workers (which do
    not spin: ``TVM_THREAD_POOL_SPIN_COUNT=0``) fall asleep there, so a parallel function
    there pays for waking them (Llama's RMS norm over 128 x 768: 0.46 ms a call there,
    0.05 back to back; whole runs with it on one thread were 1.04x slower). A call whose
    tensor arguments share memory (an in-place update) is not run again."""
    wanted = set(names)
    totals = {}
    if not wanted:
        return {}

    def instrument(fn, name, before, ret, *rest):  # noqa: ARG001 (the VM's signature)
        if before or name not in wanted:
            return 0
        ptrs = [a.data_ptr() for a in rest if hasattr(a, "data_ptr") and
                getattr(a, "shape", None) is not None]
        if len(set(ptrs)) < len(ptrs):
            wanted.discard(name)  # (and no more calls of it timed)
            totals.pop(name, None)
            return 0
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            fn(*rest)
            best = min(best, time.perf_counter() - start)
        totals[name] = totals.get(name, 0.0) + best * 1e3
        return 0

    vm.set_instrument(instrument)
    try:
        vm[func](*args)
    finally:
        vm.set_instrument(lambda *a: 0)
    return totals


def _vm(ex):
    import tvm

    vm = tvm.relax.VirtualMachine(ex, tvm.cpu())
    if hasattr(ex, "kernel_functions"):  # (tirbyoc.compile's; for the breakdown's flags)
        vm.kernel_functions = ex.kernel_functions
    return vm


def _measure(label, contenders, ref, reps, tvm_reps, settle, vm_ours, args_ours, extra):
    errors = {name: _rel_err(out, ref) for name, out in contenders.outputs.items()}
    samples = {}
    times = interleaved(contenders.fns, reps, settle, few=("tvm",), few_reps=tvm_reps,
                        samples=samples)
    row = {"model": label, "ms": {k: v * 1e3 for k, v in times.items()},
           "rounds_ms": {k: [t * 1e3 for t in v] for k, v in samples.items()},
           "rel_err": errors, **extra}
    traffic, calls = {}, {}
    # NOTE: the round's last contender may be a peer whose workers still spin (ONNX
    # Runtime's for about 65 ms): the breakdown starts after the same settle as every
    # timed run (without it, a 0.05 ms function of Llama's measured 0.6 ms and was
    # flagged slow)
    time.sleep(settle)
    row["breakdown"] = breakdown(vm_ours, args_ours, traffic=traffic, calls=calls)
    row["traffic_bytes"] = traffic
    row["calls"] = calls
    row["instrument_overhead_us"] = instrument_overhead_ms() * 1e3
    kernel_functions = getattr(vm_ours, "kernel_functions", None)
    if kernel_functions is not None:  # (a loaded library does not know them)
        row["kernel_functions"] = sorted(kernel_functions)
        suspects = flag_slow(row["breakdown"], traffic, kernel_functions, _bandwidth())
        # a suspect may only have paid for waking TVM's threads: timed again awake
        row["back_to_back_ms"] = back_to_back(vm_ours, args_ours, suspects)
        row["slow"] = flag_slow(row["breakdown"], traffic, kernel_functions, _bandwidth(),
                                warm=row["back_to_back_ms"])
    return row


@functools.lru_cache(maxsize=None)
def _bandwidth() -> float:
    """copy_bandwidth, measured once per process."""
    return copy_bandwidth()


def bench_torch_model(spec: ModelSpec, threads: int, reps: int, tvm_reps: int, with_tvm: bool,
                      settle: float, progress=print, failed=None) -> list:
    """Rows for one registry model: static shape, then each length of a dynamic build. A
    build that cannot be imported is reported through ``progress`` and appended to
    ``failed`` (a list), or raised when ``failed`` is None."""
    import torch
    import tvm

    import tirbyoc
    from . import examples

    model = spec.build()
    rows = []
    builds = [("static", spec.static_seq, (spec.static_seq,))]
    if spec.seqs:
        builds.append(("dynamic", spec.static_seq, spec.seqs))
    for kind, export_seq, seqs in builds:
        example = torch.randn(*spec.shape(export_seq))
        try:
            mod = examples.import_torch(model, example, dynamic_seq=kind == "dynamic")
        except Exception as exc:  # noqa: BLE001 (reported, not hidden)
            if failed is None:
                raise
            failed.append(f"{spec.name} ({kind}): torch.export failed: {failure(exc)}")
            progress(f"  {failed[-1]}")
            continue
        report = tirbyoc.explain(mod)
        ours = tirbyoc.compile(mod)
        theirs = tvm.compile(mod, "llvm") if with_tvm else None
        dims = None
        if kind == "dynamic":
            arg = examples._arg_names(model)[0]
            dims = {arg: {1: torch.export.Dim("seq", min=2, max=512)}}
        sess = _ort_session(onnx_bytes(model, example, dims), threads)
        vm_ours = _vm(ours)
        vm_tvm = _vm(theirs) if theirs is not None else None
        for seq in seqs:
            x = torch.randn(*spec.shape(seq), generator=torch.Generator().manual_seed(seq))
            xn = x.numpy()
            with torch.no_grad():
                ref = model(x).numpy().astype(np.float64)
            xt = tvm.runtime.tensor(xn)
            c = Contenders()
            c.fns["tirbyoc"] = lambda: vm_ours["main"](xt)
            c.fns["torch"] = lambda: _torch_call(model, x)
            c.fns["ort"] = lambda: sess.run(None, {"x": xn})
            if vm_tvm is not None:
                c.fns["tvm"] = lambda: vm_tvm["main"](xt)
            c.outputs = {"tirbyoc": _first(vm_ours["main"](xt)),
                         "torch": ref.astype(np.float32),
                         "ort": sess.run(None, {"x": xn})[0]}
            if vm_tvm is not None:
                c.outputs["tvm"] = _first(vm_tvm["main"](xt))
            label = spec.name if kind == "static" else f"{spec.name} (dynamic seq)"
            rows.append(_measure(label, c, ref, reps, tvm_reps, settle, vm_ours, [xt],
                                 {"shape": list(spec.shape(seq)), "build": kind,
                                  "offloaded": [r.intrinsic for r in report.offloaded]}))
            progress(f"  measured {label} {spec.shape(seq)}")
    return rows


def onnx_bytes(model, example, dynamic_shapes=None) -> bytes:
    """``model`` (input "x", output "y") as ONNX, for ONNX Runtime."""
    import torch

    buf = io.BytesIO()
    # NOTE: the torch.export-based exporter: the TorchScript one cannot trace
    # nn.TransformerEncoderLayer's attention (is_causal becomes a tensor).
    with torch.no_grad():
        program = torch.onnx.export(model, (example,), input_names=["x"], output_names=["y"],
                                    dynamic_shapes=dynamic_shapes, dynamo=True, verbose=False)
    program.save(buf)
    return buf.getvalue()


def _torch_call(model, x):
    import torch

    with torch.no_grad():
        return model(x)


def _as_float64(model):
    """A copy of ONNX ``model`` computing in float64: its float32 initializers, inputs,
    outputs, intermediate types, constants and casts to float32 made float64. None for a
    model with subgraphs (If, Loop, Scan: their types are not rewritten)."""
    import onnx
    from onnx import TensorProto, numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph

    def wide(t):
        if t.data_type == TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64),
                                               t.name))

    for t in g.initializer:
        wide(t)
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.DOUBLE
    for node in g.node:
        for a in node.attribute:
            if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                return None
            if a.type == onnx.AttributeProto.TENSOR:
                wide(a.t)
            elif node.op_type in ("Cast", "CastLike") and a.name == "to" and \
                    a.i == TensorProto.FLOAT:
                a.i = TensorProto.DOUBLE
    return m


def float64_reference(model, inputs):
    """``(output, None)``: the first output of ONNX ``model`` evaluated in float64 by
    onnx's reference evaluator (numpy: a ResNet-50 takes about 2 s) on ``inputs`` (their
    float32 arrays as float64); ``(None, reason)`` where the model cannot be evaluated so
    (an op the evaluator lacks or computes only in float32, a subgraph)."""
    from onnx.reference import ReferenceEvaluator

    wide = _as_float64(model)
    if wide is None:
        return None, "the model has subgraphs"
    feeds = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in inputs.items()}
    try:
        out = ReferenceEvaluator(wide).run(None, feeds)[0]
    except Exception as exc:  # noqa: BLE001 (the reason is reported; ORT is the fallback)
        return None, failure(exc, 200)
    out = np.asarray(out)
    if out.dtype != np.float64:
        return None, f"its output came out {out.dtype}"
    return out, None


def bench_onnx_file(path: str, shapes: dict, threads: int, reps: int, tvm_reps: int,
                    with_tvm: bool, settle: float, progress=print) -> list:
    """One row for a user's ONNX model on random inputs of its declared shapes. The
    numerics reference is the model evaluated in float64 (``float64_reference``; the
    row's ``reference`` says so): ONNX Runtime's float32 output is itself up to about
    1e-4 of max|y| off in a deep network (MobileNetV2's batch norms), too close to the
    tolerance to judge another float32 build by. Where the model cannot be evaluated in
    float64, ONNX Runtime's output is the reference."""
    import onnx
    import tvm

    import tirbyoc

    if not os.path.isfile(path):
        raise SystemExit(f"tirbyoc bench: no such file: {path}")
    model = onnx.load(path)
    inputs = {}
    rng = np.random.default_rng(0)
    init = {i.name for i in model.graph.initializer}
    for inp in model.graph.input:
        if inp.name in init:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None
                for d in inp.type.tensor_type.shape.dim]
        given = shapes.get(inp.name)
        if given is not None:
            if len(given) != len(dims):
                raise SystemExit(f"--shape {inp.name}: {len(given)} dims, the model has "
                                 f"{len(dims)}")
            dims = given
        dims = [d if d else 1 for d in dims]
        elem = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type))
        # NOTE: integers as indices are (token ids): in [0, 100), inside any vocabulary
        inputs[inp.name] = (rng.integers(0, 100, dims).astype(elem)
                            if np.issubdtype(elem, np.integer)
                            else rng.standard_normal(dims).astype(elem))
    try:
        mod = tirbyoc.from_onnx(model, shape_dict={k: v.shape for k, v in inputs.items()})
    except tirbyoc.UnsupportedNode as exc:
        raise SystemExit(f"tirbyoc bench: {path}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 (the importer's own message is the useful part)
        raise SystemExit(f"tirbyoc bench: TVM cannot import {path}: {exc}") from exc
    report = tirbyoc.explain(mod)
    ours = tirbyoc.compile(mod)
    sess = _ort_session(model.SerializeToString(), threads)
    ort_out = sess.run(None, inputs)[0]
    ref, why = float64_reference(model, inputs)
    if ref is None or ref.shape != ort_out.shape:
        why = why or f"its output's shape {ref.shape} is not ONNX Runtime's {ort_out.shape}"
        progress(f"  no float64 reference ({why}): ONNX Runtime's output is the reference")
        ref, reference = ort_out.astype(np.float64), "onnx runtime"
    else:
        reference = "float64"
    vm_ours = _vm(ours)
    args = [tvm.runtime.tensor(v) for v in inputs.values()]
    c = Contenders()
    c.fns["tirbyoc"] = lambda: vm_ours["main"](*args)
    c.fns["ort"] = lambda: sess.run(None, inputs)
    c.outputs = {"tirbyoc": _first(vm_ours["main"](*args)), "ort": ort_out}
    if with_tvm:
        vm_tvm = _vm(tvm.compile(mod, "llvm"))
        c.fns["tvm"] = lambda: vm_tvm["main"](*args)
        c.outputs["tvm"] = _first(vm_tvm["main"](*args))
    row = _measure(os.path.basename(path), c, ref, reps, tvm_reps, settle, vm_ours, args,
                   {"shape": {k: list(v.shape) for k, v in inputs.items()}, "build": "onnx",
                    "offloaded": [r.intrinsic for r in report.offloaded],
                    "reference": reference})
    return [row]


def isas() -> dict:
    """The instruction set each contender runs: tirbyoc's kernels', PyTorch's ATen
    dispatch (``ATEN_CPU_CAPABILITY`` caps it), ONNX Runtime's own choice."""
    import torch

    from . import kernels

    return {"tirbyoc": kernels.isa(), "torch": torch.backends.cpu.get_cpu_capability().lower(),
            "ort": "its own (MLAS dispatch, not capped)"}


def report(rows, threads) -> str:
    peers = ("tirbyoc", "torch", "ort", "tvm")
    lines = [f"{threads} threads each; median ms; ratio = peer time / tirbyoc time (> 1: "
             "tirbyoc faster); error = tirbyoc's max|x - reference| / max|reference|",
             "instruction sets: " + ", ".join(f"{k} {v}" for k, v in isas().items()),
             "tirbyoc's blocking from the caches: " + kernels.describe_caches(), ""]
    head = (f"{'model':28s} {'shape':16s}" + "".join(f"{p:>9s}" for p in peers)
            + f"{'vs ort':>8s}{'vs torch':>9s}  {'error':>9s}  offloaded")
    lines += [head, "-" * len(head)]
    # a peer far off the reference is said below the table, not shown as tirbyoc's error
    off = [f"{r['model']}: {p} {e:.1e}" for r in rows for p, e in r["rel_err"].items()
           if p != "tirbyoc" and e > RTOL]
    for r in rows:
        ms = r["ms"]
        shape = "x".join(str(d) for d in r["shape"]) if isinstance(r["shape"], list) else \
            ",".join("x".join(map(str, s)) for s in r["shape"].values())
        cells = "".join(f"{ms[p]:9.2f}" if p in ms else f"{'-':>9s}" for p in peers)
        ratio = lambda p: f"{ms[p] / ms['tirbyoc']:.2f}x" if p in ms else "-"  # noqa: E731
        err = r["rel_err"].get("tirbyoc", max(r["rel_err"].values()))
        lines.append(f"{r['model']:28s} {shape:16s}{cells}{ratio('ort'):>8s}"
                     f"{ratio('torch'):>9s}  {err:9.1e}  {len(r['offloaded'])}")
    if off:
        lines += ["", f"peers' errors above {RTOL:.0e} of max|reference|: " + "; ".join(off)]
    for r in rows:
        total = sum(t for _, t in r["breakdown"])
        lines += ["", f"where the time goes: {r['model']} {r['shape']} ({total:.2f} ms of "
                      f"calls per run, less the instrument's "
                      f"{r.get('instrument_overhead_us', 0):.1f} us per call)"]
        slow = r.get("slow", {})
        for i, (name, t) in enumerate(r["breakdown"]):
            if i >= 12 and name not in slow:  # (the top 12, and every flagged one)
                continue
            warm = r.get("back_to_back_ms", {}).get(name)
            mark = f"  <- SLOW: {slow[name]:.0f}x what its {r['traffic_bytes'][name] / 1e6:.2f} " \
                   "MB of tensors need" if name in slow else \
                f"  ({warm:.3f} ms back to back: the rest is waking TVM's threads)" \
                if warm is not None else ""
            n = r.get("calls", {}).get(name)
            lines.append(f"  {t:8.3f} ms {t / total:6.1%} {n if n is not None else '':>5}x  "
                         f"{name}{mark}")
    return "\n".join(lines)


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    peers = [p for p in ("tirbyoc", "torch", "ort", "tvm") if any(p in r["ms"] for r in rows)
             and p != "tvm"]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(rows)), 4))
    width = 0.8 / len(peers)
    for i, p in enumerate(peers):
        ax.bar([j + i * width for j in range(len(rows))],
               [r["ms"].get(p, 0) for r in rows], width, label=p)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))])
    ax.set_xticklabels([f"{r['model']}\n{r['shape']}" for r in rows], fontsize=7)
    ax.set_ylabel("ms (median)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def write_json(rows, out, threads, name) -> str:
    """``out/name.json`` with the thread count and the rows; returns its path."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{name}.json")
    with open(path, "w") as f:
        json.dump({"threads": threads, "rows": rows}, f, indent=1)
    return path


def write(rows, out, threads, name="models"):
    png = os.path.join(out, f"{name}.png")
    path = write_json(rows, out, threads, name)
    plot(rows, png)
    return path, png


def _set_threads(threads):
    os.environ.setdefault("TIRBYOC_NUM_THREADS", str(threads))
    os.environ.setdefault("TVM_NUM_THREADS", str(threads))
    from . import kernels

    kernels.set_num_threads(threads)
    try:
        import torch

        torch.set_num_threads(threads)
    except ImportError:
        pass


def run_models(names, threads=2, reps=20, tvm_reps=1, with_tvm=True, settle=SETTLE_SECONDS,
               out="bench-results") -> int:
    _set_threads(threads)
    registry = _registry()
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; known: {', '.join(registry)}")
    rows, failed = [], []
    for name in names:
        rows += bench_torch_model(registry[name], threads, reps, tvm_reps, with_tvm, settle,
                                  progress=lambda s: print(s, file=sys.stderr), failed=failed)
    bad = [f"{r['model']} {p}: {e:.1e}" for r in rows for p, e in r["rel_err"].items()
           if e > RTOL]
    return finish(rows, report(rows, threads) if rows else "", failed, bad, out, threads,
                  "models")
