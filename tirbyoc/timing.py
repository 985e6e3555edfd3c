"""Timing side by side: interleaved medians (shared by every benchmark)."""

from __future__ import annotations

import os
import statistics
import threading
import time

SETTLE_SECONDS = 0.3
WARM_SECONDS = 0.06
BATCH_SECONDS = 0.02


def _time(fn, number: int = 1, settle: float = 0.0) -> float:
    """Seconds per call of ``fn``, over ``number`` calls in a row."""
    # NOTE: BLAS and OpenMP pools (numpy's, PyTorch's, ours) keep spinning for a while
    # after a call and slow down whoever runs next on the same cores (ONNX Runtime 1.32's
    # workers for about 65 ms after a run: the next contender was 25-40% slower at 16
    # threads after a 50 ms sleep, docs/performance.md); letting them go idle before
    # each measurement keeps the contenders from measuring each other.
    # Idle cores come back slowly (measured here: batches right after a 0.3 s sleep ran
    # at a third of the speed), so the function runs untimed for a moment first: every
    # contender alike, the slow ones (TVM's default build) at least once.
    if settle:
        time.sleep(settle)
        warm_until = time.perf_counter() + WARM_SECONDS
        fn()
        while time.perf_counter() < warm_until:
            fn()
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def interleaved(fns: dict, reps: int, settle: float = SETTLE_SECONDS, few: tuple = (),
                few_reps: int = 1, samples: dict | None = None) -> dict:
    """Median seconds per call of each function: ``reps`` rounds, each timing every
    function once, starting one further along each round so that each takes every place
    in a round in turn. Within a round each still follows the same one: the ``settle``
    before each timing, not the order, keeps one contender's spinning threads off the
    next. ``few``: slow ones, timed in the first ``few_reps`` rounds only, one call at a
    time. ``samples``: if given, filled with each function's seconds per call round by
    round (a slow stretch of one contender shows there)."""
    number = {}
    for name, fn in fns.items():
        if name in few:
            number[name] = 1
            continue
        once = _time(fn)  # also the warm-up
        number[name] = max(1, min(1000, int(BATCH_SECONDS / max(once, 1e-7))))
    times = {name: [] for name in fns}
    names = list(fns)
    for rep in range(reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            if name in few and rep >= few_reps:
                continue
            times[name].append(_time(fns[name], number[name], settle))
    if samples is not None:
        samples.update(times)
    return {name: statistics.median(t) for name, t in times.items()}


# ---- the machine's fp32 FMA peak (the benchmarks' "of peak" columns) ----

def _probe_library():
    """Build ``fma_probe.c`` with cffi (once, in a temporary directory) and load it."""
    import importlib.util
    import tempfile

    import cffi

    ffi = cffi.FFI()
    ffi.cdef("\n".join(f"double tirbyoc_probe_{isa}(int64_t iters, float *sink);"
                       for isa in ("avx512", "avx2", "generic")))
    src = open(os.path.join(os.path.dirname(__file__), "fma_probe.c")).read()
    ffi.set_source("_tirbyoc_fma_probe", src, extra_compile_args=["-O2"])
    path = ffi.compile(tmpdir=tempfile.mkdtemp(prefix="tirbyoc-probe-"))
    spec = importlib.util.spec_from_file_location("_tirbyoc_fma_probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ffi, module.lib


def measure_peak(threads: int, seconds: float = 0.3) -> dict:
    """fp32 FMA peak (GFLOP/s) of one thread and of ``threads`` threads at once, with the
    widest vectors the kernels use here (``kernels.isa()``)."""
    from . import kernels

    ffi, lib = _probe_library()
    probe = getattr(lib, f"tirbyoc_probe_{kernels.isa()}")
    sink = ffi.new("float *")
    iters = 1 << 16
    while True:  # calibrate to about ``seconds`` per measurement
        start = time.perf_counter()
        probe(iters, sink)
        if time.perf_counter() - start > seconds / 4:
            break
        iters *= 2
    iters *= 4
    one = max(probe(iters, sink) for _ in range(3))

    def all_at_once():
        results = [0.0] * threads

        def work(i):
            results[i] = probe(iters, ffi.new("float *"))  # cffi releases the GIL here

        pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        return sum(results)

    # the best of three, as for one thread: a thread the machine preempts during the one
    # measurement drags the sum down (on a 16-vCPU VM, 84 GFLOP/s at 2 threads against 70
    # at one, and the kernels' rows then read 142% of it)
    return {"one_thread": one, "all_threads": max(all_at_once() for _ in range(3)),
            "threads": threads, "isa": kernels.isa()}
