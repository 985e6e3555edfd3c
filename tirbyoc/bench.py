"""Benchmark: dense + bias + relu through tirbyoc against its peers, in one run.

    python -m tirbyoc.bench [--reps 15] [--tvm-reps 1] [--out bench-results]

For each shape (M x K -> N) and for weights bound into the module as constants (the
deployment case) and passed as inputs, it times, interleaved and repeated, taking
medians:

* ``tirbyoc``: the TVM module that ``tirbyoc.compile`` builds (what a user runs);
* ``kernel``: the bare kernel through cffi (packed weight / weight as given);
* ``numpy``: ``np.maximum(x @ w.T + b, 0)``; ``torch``: ``F.linear(x, w, b).relu_()``;
* ``tvm``: TVM's default ``tvm.compile`` of the same Relax function;

and a probe of the machine's fp32 FMA peak on all threads the kernels use. Every
result is checked against a float64 numpy reference (relative error <= 1e-4 of
max|reference|). It prints a table and writes ``bench.json`` and ``bench.png``.
The seed MLP is timed end to end the same way.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys

import numpy as np

SHAPES = [(64, 800, 500), (128, 768, 3072), (512, 1024, 1024), (1024, 1024, 1024),
          (1, 4096, 4096), (16, 4096, 4096), (384, 768, 768)]
RTOL = 1e-4
PEERS = ("tirbyoc", "kernel", "numpy", "torch", "tvm")


def _rel_err(got, ref) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - ref)) / max(np.max(np.abs(ref)), 1e-30))


from .timing import BATCH_SECONDS, SETTLE_SECONDS, WARM_SECONDS, _time, interleaved  # noqa: F401,E501
from .timing import measure_peak  # noqa: F401 (part of this module's interface)


class _Case:
    """One shape with one weight mode: the callables to time and what they return."""

    def __init__(self, m, k, n, bind, rng, with_torch, with_tvm, target):
        import tvm

        import tirbyoc
        from tirbyoc import examples, kernels

        self.m, self.k, self.n, self.bind = m, k, n, bind
        bound = 1.0 / math.sqrt(k)
        w = rng.uniform(-bound, bound, (n, k)).astype(np.float32)
        b = rng.uniform(-bound, bound, n).astype(np.float32)
        x = rng.standard_normal((m, k), np.float32)
        self.ref = np.maximum(x.astype(np.float64) @ w.T.astype(np.float64) + b, 0)
        mod = examples.mlp_relax(m, [(w, b)], bind_weights=bind, activation_last=True)
        args = [x] if bind else [x, w, b]
        targs = [tvm.runtime.tensor(a) for a in args]
        self.fns, self.outputs = {}, {}

        vm = tvm.relax.VirtualMachine(tirbyoc.compile(mod, target), tvm.cpu())
        self.fns["tirbyoc"] = lambda: vm["main"](*targs)
        self.outputs["tirbyoc"] = lambda: vm["main"](*targs).numpy()

        out = np.empty((m, n), np.float32)
        wk = kernels.pack_weight(w, "nt") if bind else w
        layout = "packed" if bind else "nt"
        self.fns["kernel"] = lambda: kernels.dense(x, wk, b, activation="relu", layout=layout, out=out)
        self.outputs["kernel"] = lambda: kernels.dense(x, wk, b, activation="relu", layout=layout)

        self.fns["numpy"] = lambda: np.maximum(x @ w.T + b, 0)
        self.outputs["numpy"] = self.fns["numpy"]
        if with_torch:
            import torch

            xt, wt, bt = (torch.from_numpy(a) for a in (x, w, b))

            def run_torch():
                with torch.no_grad():
                    return torch.nn.functional.linear(xt, wt, bt).relu_()

            self.fns["torch"] = run_torch
            self.outputs["torch"] = lambda: run_torch().numpy()
        if with_tvm:
            vm_default = tvm.relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
            self.fns["tvm"] = lambda: vm_default["main"](*targs)
            self.outputs["tvm"] = lambda: vm_default["main"](*targs).numpy()

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


def run_case(case: _Case, reps: int, tvm_reps: int, settle: float = SETTLE_SECONDS) -> dict:
    """Median seconds per peer (interleaved repetitions) and each peer's numerics."""
    errors = {name: _rel_err(get(), case.ref) for name, get in case.outputs.items()}
    return {"seconds": interleaved(case.fns, reps, settle, ("tvm",), tvm_reps),
            "rel_err": errors}


def _seed_mlp(reps, tvm_reps, with_torch, with_tvm, target, settle) -> dict:
    import tvm

    import tirbyoc
    from tirbyoc import examples

    layers = examples.mlp_weights()
    mod = examples.mlp_relax(64, layers)
    x = np.random.default_rng(7).standard_normal((64, 800), np.float32)
    ref = examples.mlp_numpy(x, layers).astype(np.float64)
    xt = tvm.runtime.tensor(x)
    vm = tvm.relax.VirtualMachine(tirbyoc.compile(mod, target), tvm.cpu())
    (w0, b0), (w1, b1) = layers
    fns = {"tirbyoc": lambda: vm["main"](xt).numpy(),
           "numpy": lambda: np.maximum(x @ w0.T + b0, 0) @ w1.T + b1}
    if with_tvm:
        vm_default = tvm.relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
        fns["tvm"] = lambda: vm_default["main"](xt).numpy()
    if with_torch:
        import torch

        model = examples.mlp_torch_module(layers)
        xtorch = torch.from_numpy(x)

        def run_torch():
            with torch.no_grad():
                return model(xtorch).numpy()

        fns["torch"] = run_torch
    errors = {name: _rel_err(fn(), ref) for name, fn in fns.items()}
    return {"seconds": interleaved(fns, reps, settle, ("tvm",), max(tvm_reps, 3)),
            "rel_err": errors}


def _fmt_ratio(a, b):
    return f"{b / a:6.2f}x" if a and b else "     -"


def report(results: dict) -> str:
    """The table printed by the benchmark."""
    from . import kernels

    peak = results["peak"]["all_threads"]
    lines = [f"fp32 FMA peak ({results['peak']['isa']}, {results['peak']['threads']} threads): "
             f"{peak:.0f} GFLOP/s ({results['peak']['one_thread']:.0f} on one thread)",
             "tirbyoc's blocking from the caches: " + kernels.describe_caches(), ""]
    head = (f"{'shape (MxK->N)':18s} {'weights':7s} " + " ".join(f"{p:>8s}" for p in PEERS)
            + "  (GFLOP/s)   vs numpy  vs torch  vs tvm   of peak  max rel err")
    lines += [head, "-" * len(head)]
    for row in results["shapes"]:
        secs, flops = row["seconds"], row["flops"]
        gf = {p: flops / secs[p] / 1e9 if p in secs else None for p in PEERS}
        cells = " ".join(f"{gf[p]:8.1f}" if gf[p] else f"{'-':>8s}" for p in PEERS)
        ours = secs["tirbyoc"]
        lines.append(
            f"{row['shape']:18s} {row['weights']:7s} {cells}              "
            f"{_fmt_ratio(ours, secs.get('numpy'))}  {_fmt_ratio(ours, secs.get('torch'))}  "
            f"{_fmt_ratio(ours, secs.get('tvm')):>7s}  {gf['tirbyoc'] / peak:7.1%}  "
            f"{max(row['rel_err'].values()):.1e}")
    lines.append("")
    for mode in ("bound", "inputs"):
        rows = [r for r in results["shapes"] if r["weights"] == mode]
        for peer in ("numpy", "torch"):
            ratios = [r["seconds"][peer] / r["seconds"]["tirbyoc"] for r in rows
                      if peer in r["seconds"]]
            if ratios:
                geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
                lines.append(f"weights {mode:6s}: tirbyoc vs {peer:5s} geometric mean "
                             f"{geo:.2f}x, lowest {min(ratios):.2f}x")
    seed = results.get("seed_mlp")
    if seed and "tvm" in seed["seconds"]:
        s = seed["seconds"]
        lines += ["", "seed MLP 64x800 -> 500 -> relu -> 10 (weights bound), median ms: "
                  + ", ".join(f"{p} {s[p] * 1e3:.3f}" for p in s)
                  + f"; tirbyoc vs numpy {s['numpy'] / s['tirbyoc']:.2f}x"
                  + (f", vs torch {s['torch'] / s['tirbyoc']:.2f}x" if "torch" in s else "")
                  + f", vs TVM default {s['tvm'] / s['tirbyoc']:.0f}x"]
    return "\n".join(lines)


def plot(results: dict, path: str) -> None:
    """Grouped bars of GFLOP/s per shape, one panel per weight mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(12, 8), sharex=True)
    peers = [p for p in PEERS if any(p in r["seconds"] for r in results["shapes"])]
    for ax, mode in zip(axes, ("bound", "inputs")):
        rows = [r for r in results["shapes"] if r["weights"] == mode]
        width = 0.8 / len(peers)
        for j, peer in enumerate(peers):
            vals = [r["flops"] / r["seconds"][peer] / 1e9 if peer in r["seconds"] else 0
                    for r in rows]
            ax.bar([i + j * width for i in range(len(rows))], vals, width, label=peer)
        ax.axhline(results["peak"]["all_threads"], color="k", ls="--", lw=1, label="FMA peak")
        ax.set_yscale("log")
        ax.set_ylabel("GFLOP/s")
        ax.set_title(f"dense + bias + relu, weights {mode}")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))])
        ax.set_xticklabels([r["shape"] for r in rows])
    axes[0].legend(ncol=len(peers) + 1, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def run(shapes=SHAPES, reps=11, tvm_reps=1, *, with_tvm=True, target="llvm", seed_mlp=True,
        settle=SETTLE_SECONDS, progress=False) -> dict:
    """Measure every shape with weights bound and as inputs; the results ``report`` and
    ``plot`` take (also written as ``bench.json`` by the command)."""
    from . import kernels

    try:
        import torch

        torch.set_num_threads(kernels.num_threads())
        with_torch = True
    except ImportError:
        with_torch = False
    results = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                           "python": sys.version.split()[0]},
               "peak": measure_peak(kernels.num_threads()), "shapes": []}
    rng = np.random.default_rng(0)
    for m, k, n in shapes:
        for bind in (True, False):
            case = _Case(m, k, n, bind, rng, with_torch, with_tvm, target)
            row = run_case(case, reps, tvm_reps, settle)
            row.update(shape=f"{m}x{k}->{n}", weights="bound" if bind else "inputs",
                       flops=case.flops)
            results["shapes"].append(row)
            if progress:
                print(f"  measured {row['shape']} weights {row['weights']}", file=sys.stderr)
    if seed_mlp:
        results["seed_mlp"] = _seed_mlp(reps, tvm_reps, with_torch, with_tvm, target, settle)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tirbyoc.bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=None, help="interleaved repetitions "
                        "(default 11; with --models 20, with --layers 15)")
    parser.add_argument("--settle", type=float, default=SETTLE_SECONDS,
                        help="seconds of idle before each measurement (thread pools settle: "
                             "ONNX Runtime's workers spin about 65 ms after a run)")
    parser.add_argument("--tvm-reps", type=int, default=1,
                        help="repetitions of TVM's default build (it is slow)")
    parser.add_argument("--no-tvm", action="store_true", help="skip TVM's default build")
    parser.add_argument("--shapes", default="", help="e.g. 64x800x500,1x4096x4096 (MxKxN)")
    parser.add_argument("--out", default="bench-results")
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--models", action="store_true",
                        help="whole models from PyTorch against PyTorch eager, ONNX Runtime "
                             "and TVM's default build (tirbyoc.bench_models)")
    parser.add_argument("--model", action="append", default=[],
                        help="with --models: only this model (repeatable)")
    parser.add_argument("--threads", default="2", help="with --models or --layers: "
                        "threads for every contender; with --models a list (1,2,4,8,16) "
                        "runs the scaling benchmark (tirbyoc.bench_scaling)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="with --models and several --threads: rounds of one process "
                        "per contender (each time: the median over the rounds)")
    parser.add_argument("--zoo", action="store_true",
                        help="with --models: models from HuggingFace transformers "
                             "(tirbyoc.bench_zoo), with build time and library size")
    parser.add_argument("--held-out", action="store_true",
                        help="with --zoo: the held-out models instead, families nothing "
                             "was tuned on (tirbyoc.bench_zoo.HELD_OUT)")
    parser.add_argument("--batch", default="1,8",
                        help="with --zoo: batch sizes of the transformers (default 1,8)")
    parser.add_argument("--any-length", action="store_true",
                        help="with --zoo: the transformers built once for every sequence "
                             "length (2 to 512), timed at 128, checked at 7 and 300 too")
    parser.add_argument("--layers", action="store_true",
                        help="the models' conv layers one by one against ONNX Runtime and "
                             "PyTorch eager, from chains of them (tirbyoc.bench_layers)")
    parser.add_argument("--layer", action="append", default=[],
                        help="with --layers: only this layer, e.g. pw512@14 (repeatable)")
    args = parser.parse_args(argv)
    from .bench_scaling import parse_counts

    try:
        counts = parse_counts(args.threads)
    except ValueError as exc:
        parser.error(str(exc))
    if args.held_out and not (args.models and args.zoo):
        parser.error("--held-out goes with --models --zoo")
    if len(counts) > 1 and not args.models:
        parser.error("several thread counts (the scaling benchmark) need --models")
    args.threads = counts[0]
    if args.models and len(counts) > 1:
        from . import bench_models, bench_scaling

        return bench_scaling.run_scaling(args.model or list(bench_models.MODELS), counts,
                                         args.reps or 15, args.settle, args.out,
                                         args.rounds)
    if args.layers:
        from . import bench_layers

        return bench_layers.run_layers(args.layer, args.threads, args.reps or 15, args.settle,
                                       args.out)
    if args.models and args.zoo:
        from . import bench_zoo

        zoo = bench_zoo.HELD_OUT if args.held_out else bench_zoo.ZOO
        return bench_zoo.run_zoo(args.model or list(zoo),
                                 tuple(int(b) for b in args.batch.split(",")), args.threads,
                                 args.reps or 20, args.settle, args.out,
                                 dynamic=args.any_length, zoo=zoo)
    if args.models:
        from . import bench_models

        return bench_models.run_models(args.model or list(bench_models.MODELS), args.threads,
                                       args.reps or 20, args.tvm_reps, not args.no_tvm,
                                       args.settle, args.out)

    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s] \
        or SHAPES
    results = run(shapes, args.reps or 11, args.tvm_reps, with_tvm=not args.no_tvm,
                  target=args.target, settle=args.settle, progress=True)
    failures = [f"{row['shape']} {row['weights']} {p}: {e:.1e}" for row in results["shapes"]
                for p, e in row["rel_err"].items() if e > RTOL]
    print(report(results))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump(results, f, indent=1)
    plot(results, os.path.join(args.out, "bench.png"))
    print(f"\nwrote {args.out}/bench.json and {args.out}/bench.png")
    if failures:
        print("NUMERICS OUT OF TOLERANCE:\n  " + "\n  ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
