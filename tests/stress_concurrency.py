"""Stress a compiled model the way an inference server uses it; run as a script.

    python tests/stress_concurrency.py threads [--threads 8] [--calls 50] [--seed 0]
    python tests/stress_concurrency.py fork

``threads``: several models (dense + bias + relu with weights bound and as inputs, the
seed MLP with a symbolic batch) are compiled once with ``tirbyoc.compile``; every Python
thread then creates its own ``relax.VirtualMachine`` over each executable at the same
moment (a barrier) and makes ``--calls`` calls with random models and batch sizes,
checking each result against float64 numpy. ``fork``: the kernel pool is used, then a
child process runs the same executable (with threads of its own).

It runs in a process of its own because the failure it looks for is a crash. The last
line is ``ok <calls>`` on success; a wrong number exits with status 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading

# Compiled models run without PyTorch, which TVM's FFI package would import (seconds).
sys.modules.setdefault("torch", None)

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402

import tirbyoc  # noqa: E402
from tirbyoc import examples  # noqa: E402

RTOL = 1e-4


class Model:
    """One executable with its weights, inputs of any batch and a numpy reference."""

    def __init__(self, name, sizes, *, bind_weights, batch, activation_last, seed):
        self.name = name
        self.layers = examples.mlp_weights(sizes, seed=seed)
        self.bind_weights = bind_weights
        self.batch = batch  # None: symbolic
        self.activation_last = activation_last
        mod = examples.mlp_relax(batch, self.layers, bind_weights=bind_weights,
                                 activation_last=activation_last)
        self.executable = tirbyoc.compile(mod)
        self.kernels = tirbyoc.offloaded_kernels(tirbyoc.apply_tir_byoc(mod))

    def args(self, x):
        args = [x]
        if not self.bind_weights:
            for w, b in self.layers:
                args += [w, b]
        return [tvm.runtime.tensor(a) for a in args]

    def reference(self, x):
        h = x.astype(np.float64)
        for i, (w, b) in enumerate(self.layers):
            h = h @ w.T.astype(np.float64) + b
            if i + 1 < len(self.layers) or self.activation_last:
                h = np.maximum(h, 0.0)
        return h

    def check(self, vm, rng):
        rows = self.batch if self.batch is not None else int(rng.integers(1, 150))
        x = rng.standard_normal((rows, self.layers[0][0].shape[1])).astype(np.float32)
        got = vm["main"](*self.args(x)).numpy()
        ref = self.reference(x)
        if not np.allclose(got, ref, rtol=RTOL, atol=RTOL * max(1.0, np.abs(ref).max())):
            raise AssertionError(f"{self.name}: wrong result for batch {rows}: max error "
                                 f"{np.abs(got - ref).max():.3g}")


def models():
    """The mix: large enough that the kernels use their worker pool, and small ones."""
    return [
        Model("dense_relu_bound", (300, 400), bind_weights=True, batch=200,
              activation_last=True, seed=1),
        Model("dense_relu_inputs", (300, 400), bind_weights=False, batch=200,
              activation_last=True, seed=2),
        Model("mlp_symbolic_inputs", (800, 500, 10), bind_weights=False, batch=None,
              activation_last=False, seed=3),
        Model("mlp_symbolic_bound", (64, 48, 24), bind_weights=True, batch=None,
              activation_last=False, seed=4),
    ]


def stress_threads(n_threads, calls, seed):
    mods = models()
    start = threading.Barrier(n_threads)
    errors, done = [], [0]
    lock = threading.Lock()

    def worker(tid):
        rng = np.random.default_rng(seed + tid)
        try:
            # NOTE: every thread builds its own VM of each model at the same moment: this
            # is what crashed when an executable was linked lazily by its first users.
            vms = []
            for m in mods:
                start.wait()
                vms.append(relax.VirtualMachine(m.executable, tvm.cpu()))
            for _ in range(calls):
                i = int(rng.integers(len(mods)))
                mods[i].check(vms[i], rng)
                with lock:
                    done[0] += 1
        except Exception as exc:  # noqa: BLE001 (reported by the main thread)
            with lock:
                errors.append(f"thread {tid}: {exc!r}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        print("\n".join(errors))
        return 1
    print(f"kernels {sorted({k for m in mods for k in m.kernels})}")
    print(f"ok {done[0]}")
    return 0


def stress_fork():
    model = models()[0]
    vm = relax.VirtualMachine(model.executable, tvm.cpu())
    rng = np.random.default_rng(0)
    for _ in range(3):  # the pool has threads now (200 x 400 x 300 is above its cut-off)
        model.check(vm, rng)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            child_vm = relax.VirtualMachine(model.executable, tvm.cpu())
            for _ in range(5):
                model.check(child_vm, rng)
            # threads in the child too (a VM each): its pool is its own
            failures = []

            def call(t):
                try:
                    model.check(relax.VirtualMachine(model.executable, tvm.cpu()),
                                np.random.default_rng(t))
                except Exception as exc:  # noqa: BLE001
                    failures.append(exc)

            workers = [threading.Thread(target=call, args=(t,)) for t in range(2)]
            for t in workers:
                t.start()
            for t in workers:
                t.join()
            if failures:
                raise failures[0]
        except Exception as exc:  # noqa: BLE001
            print(f"child: {exc!r}", flush=True)
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        print(f"child failed: wait status {status}")
        return 1
    model.check(vm, rng)  # the parent's pool still works
    print("ok fork")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["threads", "fork"])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.mode == "threads":
        return stress_threads(args.threads, args.calls, args.seed)
    return stress_fork()


if __name__ == "__main__":
    sys.exit(main())
