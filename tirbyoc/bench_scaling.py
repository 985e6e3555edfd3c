"""Scaling benchmark: every model at several thread counts against ONNX Runtime and
PyTorch eager, in one run.

    python -m tirbyoc.bench --models --threads 1,2,4,8,16 [--model resnet18] [--reps 15]

Each model is compiled once with ``tirbyoc.compile`` and exported as a library (as a user
deploys it), and exported to ONNX. Each thread count then runs in a fresh process with
``TIRBYOC_NUM_THREADS`` = ``TVM_NUM_THREADS`` = ``OMP_NUM_THREADS`` = the count (the pools
read it at start) and each contender in a process of its own: the exported library
through the TVM runtime, an ONNX Runtime session with that many intra-op threads, the
PyTorch module with ``torch.set_num_threads``; the contenders' processes alternate for
``rounds`` rounds (default 3), and each time is the median over the rounds of each
process's median. Every output is checked against PyTorch (relative error of
max|reference| <= 1e-4). Why separate processes: three thread pools of N threads each
in one process fight for the cores (each spins for a while after its work); measured on
a 16-core Xeon, interleaving the contenders in one process made tirbyoc's ResNet-18 at
16 threads 24 ms and ONNX Runtime's 4.2 ms; each alone in its process, 4.8 ms and 3.4 ms. A process that gives no result within its time limit is reported
as such (a hang shows as a hang; the other counts still run). It prints a table (time per
run, ratios, speed-up over one thread), says which counts are above this machine's
cores, and writes ``scaling.json`` and ``scaling.png`` (time against threads).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

RTOL = 1e-4
PEERS = ("tirbyoc", "ort", "torch")
CHILD_TIMEOUT = 900  # seconds for one model at one thread count


def available_cores() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def parse_counts(text: str) -> list:
    """"1,2,4" -> [1, 2, 4]; each count between 1 and 64, no repeats."""
    counts = [int(part) for part in text.split(",") if part.strip()]
    if not counts or any(not 1 <= c <= 64 for c in counts) or len(set(counts)) != len(counts):
        raise ValueError(f"thread counts must be distinct integers from 1 to 64, got {text!r}")
    return counts


def _prepare(name: str, folder: str) -> dict:
    """Compiles and exports one registry model (static shape): the library, the ONNX
    file, the input and PyTorch's output, in ``folder``."""
    import torch

    import tirbyoc
    from . import examples
    from .bench_models import _registry, onnx_bytes

    spec = _registry()[name]
    model = spec.build()
    shape = spec.shape(spec.static_seq)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(x).numpy()
    mod = examples.import_torch(model, x)
    started = time.perf_counter()
    tirbyoc.compile(mod).export_library(os.path.join(folder, f"{name}.so"))
    build_s = time.perf_counter() - started
    with open(os.path.join(folder, f"{name}.onnx"), "wb") as f:
        f.write(onnx_bytes(model, x))
    np.save(os.path.join(folder, f"{name}.x.npy"), x.numpy())
    np.save(os.path.join(folder, f"{name}.ref.npy"), ref)
    return {"shape": list(shape), "build_s": build_s,
            "offloaded": len(tirbyoc.explain(mod).offloaded)}


def _contender(folder: str, name: str, peer: str, threads: int):
    """``(run, output)`` of one contender for one model, in this process."""
    x = np.load(os.path.join(folder, f"{name}.x.npy"))
    if peer == "tirbyoc":
        import tvm
        from tvm.runtime import vm as rvm

        from .bench_models import _first

        vm = rvm.VirtualMachine(tvm.runtime.load_module(os.path.join(folder, f"{name}.so")),
                                tvm.cpu())
        xt = tvm.runtime.tensor(x)
        return (lambda: vm["main"](xt)), _first(vm["main"](xt))
    if peer == "ort":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        sess = ort.InferenceSession(os.path.join(folder, f"{name}.onnx"), so,
                                    providers=["CPUExecutionProvider"])
        return (lambda: sess.run(None, {"x": x})), sess.run(None, {"x": x})[0]
    import torch

    from .bench_models import _registry

    torch.set_num_threads(threads)
    model = _registry()[name].build()
    xs = torch.from_numpy(x)

    def torch_run():
        with torch.no_grad():
            return model(xs)

    return torch_run, torch_run().numpy()


def _child(folder: str, name: str, threads: int, reps: int, settle: float,
           peer: str) -> dict:
    """One contender, one model, one thread count, in this (fresh) process."""
    from .bench_models import _rel_err
    from .timing import interleaved

    ref = np.load(os.path.join(folder, f"{name}.ref.npy")).astype(np.float64)
    run, output = _contender(folder, name, peer, threads)
    seconds = interleaved({peer: run}, reps, settle)[peer]
    return {"ms": seconds * 1e3, "rel_err": _rel_err(output, ref)}


# A contender's process. TVM's FFI package imports PyTorch whenever it is installed (4-6 s
# and about 2,000 modules); tirbyoc's and ONNX Runtime's processes run without it, as a
# deployment would, and PyTorch's own is the only one that loads it.
_CHILD = "import sys\nfrom tirbyoc.bench_scaling import main\nsys.exit(main())\n"
_CHILD_WITHOUT_TORCH = "import sys\nsys.modules.setdefault('torch', None)\n" + \
    _CHILD.split("\n", 1)[1]


def _run_count(folder, name, threads, reps, settle, rounds=3, timeout=CHILD_TIMEOUT) -> dict:
    """Every contender at one thread count: ``rounds`` rounds of one process each,
    alternating (each round starts one contender further along)."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("TIRBYOC_ISA",)}
    env.update(TIRBYOC_NUM_THREADS=str(threads), TVM_NUM_THREADS=str(threads),
               OMP_NUM_THREADS=str(threads))
    ms = {peer: [] for peer in PEERS}
    errors = {peer: 0.0 for peer in PEERS}
    for r in range(rounds):
        for peer in PEERS[r % len(PEERS):] + PEERS[:r % len(PEERS)]:
            cmd = [sys.executable, "-c", _CHILD if peer == "torch" else _CHILD_WITHOUT_TORCH,
                   "--child", folder, name, str(threads), str(reps), str(settle), peer]
            try:
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                      timeout=timeout)
            except subprocess.TimeoutExpired:
                return {"error": f"{peer}: no result within {timeout} s"}
            lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
            if proc.returncode != 0 or not lines:
                return {"error": f"{peer}: exit {proc.returncode}: "
                                 f"{proc.stderr.strip()[-400:]}"}
            one = json.loads(lines[-1])
            ms[peer].append(one["ms"])
            errors[peer] = max(errors[peer], one["rel_err"])
    return {"ms": {peer: float(np.median(v)) for peer, v in ms.items()}, "rel_err": errors,
            "rounds": rounds}


def report(rows: list, cores: int) -> str:
    lines = [f"median ms per run; ratio = peer time / tirbyoc time (> 1: tirbyoc faster); "
             f"speed-up = tirbyoc at the first count / tirbyoc at this one; this machine "
             f"has {cores} cores", ""]
    head = (f"{'model':14s} {'threads':>7s}" + "".join(f"{p:>9s}" for p in PEERS)
            + f"{'vs ort':>8s}{'vs torch':>9s}{'speed-up':>9s}  {'max error':>9s}")
    lines += [head, "-" * len(head)]
    first = {}
    for r in rows:
        note = "  (above the cores here)" if r["threads"] > cores else ""
        if "error" in r:
            lines.append(f"{r['model']:14s} {r['threads']:7d}  {r['error']}{note}")
            continue
        ms = r["ms"]
        first.setdefault(r["model"], ms["tirbyoc"])
        cells = "".join(f"{ms[p]:9.2f}" for p in PEERS)
        lines.append(f"{r['model']:14s} {r['threads']:7d}{cells}"
                     f"{ms['ort'] / ms['tirbyoc']:7.2f}x{ms['torch'] / ms['tirbyoc']:8.2f}x"
                     f"{first[r['model']] / ms['tirbyoc']:8.2f}x  "
                     f"{max(r['rel_err'].values()):9.1e}{note}")
    return "\n".join(lines)


def plot(rows: list, path: str, cores: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    cols = min(4, len(models))
    grid = -(-len(models) // cols)
    fig, axes = plt.subplots(grid, cols, figsize=(3.2 * cols, 3 * grid), squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i >= len(models):
            ax.set_visible(False)
            continue
        mine = [r for r in rows if r["model"] == models[i] and "ms" in r]
        for peer in PEERS:
            ax.plot([r["threads"] for r in mine], [r["ms"][peer] for r in mine], marker="o",
                    label=peer)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        counts = sorted({r["threads"] for r in rows})
        ax.set_xticks(counts, [str(c) for c in counts])
        ax.axvline(cores, color="grey", linestyle=":", linewidth=1)  # this machine's cores
        ax.set_title(models[i], fontsize=9)
        ax.set_xlabel("threads")
        if i % cols == 0:
            ax.set_ylabel("ms per run (median)")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def run_scaling(names, counts, reps=15, settle=0.3, out="bench-results", rounds=3) -> int:
    import tempfile

    from .bench_models import _registry

    registry = _registry()
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; known: {', '.join(registry)}")
    cores = available_cores()
    above = [c for c in counts if c > cores]
    if above:
        print(f"note: {cores} cores here; the counts {above} are above them (oversubscribed: "
              f"they show that nothing hangs or changes, not how a larger machine scales)",
              file=sys.stderr)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tirbyoc-scaling-") as folder:
        for name in names:
            info = _prepare(name, folder)
            print(f"  built {name} in {info['build_s']:.1f} s", file=sys.stderr)
            for threads in counts:
                result = _run_count(folder, name, threads, reps, settle, rounds)
                rows.append({"model": name, "threads": threads, **info, **result})
                print(f"  measured {name} at {threads} threads", file=sys.stderr)
    print(report(rows, cores))
    os.makedirs(out, exist_ok=True)
    path, png = os.path.join(out, "scaling.json"), os.path.join(out, "scaling.png")
    with open(path, "w") as f:
        json.dump({"cores": cores, "counts": counts, "rows": rows}, f, indent=1)
    plot(rows, png, cores)
    print(f"\nwrote {path} and {png}")
    bad = [f"{r['model']} at {r['threads']}: {r.get('error') or r['rel_err']}" for r in rows
           if "error" in r or max(r["rel_err"].values()) > RTOL]
    if bad:
        print("FAILED OR OUT OF TOLERANCE:\n  " + "\n  ".join(bad))
        return 1
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="one model at one thread count (internal)")
    parser.add_argument("--child", nargs=6, metavar=("FOLDER", "MODEL", "THREADS", "REPS",
                                                     "SETTLE", "PEER"), required=True)
    folder, name, threads, reps, settle, peer = parser.parse_args(argv).child
    if peer not in PEERS:
        parser.error(f"PEER must be one of {PEERS}")
    print(json.dumps(_child(folder, name, int(threads), int(reps), float(settle), peer)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
