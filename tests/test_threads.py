"""Thread counts: every kernel call returns, and gives the same bits, whatever the
thread count (1 to 64, primes, counts above this machine's cores).

* The conv direct path's work plan (``tirbyoc_conv2d_direct_plan``, the AVX-512 path's
  split of a call into units), checked on any CPU: it returns for every shape and thread
  count, its blocks cover the output exactly, and for the models' layers the busiest
  thread gets at most 1.25x its even share. Its loop once stopped changing the blocks without ever exiting (a
  14 x 14 conv of 256 channels on 5 or more threads): ResNet-18 and MobileNet hung at 8
  and 16 threads on AVX-512 machines.
* Every exported kernel, on every instruction set this CPU has, at thread counts 1 to 64:
  one call above its threading threshold (drawn by the kernel fuzz's own generator, so a
  new kernel is covered here too) gives the 1-thread result bit for bit; and the conv
  layers of ResNet-18 and MobileNet, the shapes that hung.

Each check runs in a child process with a time limit: a hang fails the test instead of
stopping the suite. Nothing here needs more than one core: with TIRBYOC_OVERSUBSCRIBE=1
(tests/conftest.py) the worker pool runs 64 threads on any machine.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tirbyoc import kernels

from .fresh import without_torch

ROOT = Path(__file__).resolve().parents[1]
# Thread counts every call is checked at: small, primes, powers of two, above the cores.
THREAD_COUNTS = (1, 2, 3, 4, 5, 7, 8, 13, 16, 17, 31, 64)


def _child(code, timeout, env=None):
    """Runs ``code`` in a fresh interpreter from the project root; its stdout, or a failure
    naming the hang."""
    full_env = dict(os.environ)
    full_env.pop("TIRBYOC_ISA", None)
    full_env.update(env or {})
    try:
        proc = subprocess.run([sys.executable, "-c", without_torch(textwrap.dedent(code))], cwd=ROOT,
                              env=full_env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"no result within {timeout} s (a kernel call that never returns?); "
                    f"output so far:\n{exc.stdout or ''}{exc.stderr or ''}", pytrace=False)
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


# --- the direct path's plan -------------------------------------------------------------

# Tile pixels (OH * OW of the models' convs, and edges) and output channels per group.
PLAN_PIXELS = (1, 13, 14, 15, 28, 49, 100, 196, 197, 784, 3136, 12544, 50176)
PLAN_CHANNELS = (1, 16, 17, 24, 32, 48, 64, 96, 128, 144, 160, 256, 320, 384, 512, 576,
                 960, 1000, 1024, 1280, 2048, 4096)
PLAN_MR = (14, 8, 6)
PLAN_OUTER = (1, 3)
OB_MAX = 1024  # CONV_DIRECT_OB_MAX


def _cdiv(a, b):
    return -(-a // b)


def check_plans():
    """Every plan of the grid: returns, and covers its output exactly in blocks of whole
    vectors and tiles. Returns the problems found and the number of plans."""
    ffi, lib = kernels.load()
    out = ffi.new("int64_t[4]")
    problems, plans = [], 0
    for mr in PLAN_MR:
        for outer in PLAN_OUTER:
            for tp in PLAN_PIXELS:
                for ocg in PLAN_CHANNELS:
                    for threads in range(1, 65):
                        status = lib.tirbyoc_conv2d_direct_plan(outer, tp, ocg, mr, threads,
                                                                out)
                        obw, nob, pbw, npb = out
                        where = f"outer={outer} pixels={tp} channels={ocg} mr={mr} " \
                                f"threads={threads}: plan {list(out)}"
                        plans += 1
                        if status != 0:
                            problems.append(f"{where}: status {status}")
                            continue
                        # whole vectors of channels, whole tiles of pixels, none empty
                        if not (obw % 16 == 0 and 16 <= obw <= OB_MAX and nob == _cdiv(ocg, obw)):
                            problems.append(f"{where}: channel blocks do not cover {ocg}")
                        if not (pbw % mr == 0 and pbw >= mr and npb == _cdiv(tp, pbw)):
                            problems.append(f"{where}: pixel blocks do not cover {tp}")
    return problems, plans


def test_direct_plan_returns_and_covers():
    """The whole grid in a child with a time limit (the old plan never returned for a
    14 x 14 conv of 256 channels on 5 threads)."""
    stdout = _child("""
        import json
        from tests.test_threads import check_plans
        problems, plans = check_plans()
        print(json.dumps([problems[:20], len(problems), plans]))
    """, timeout=120)
    problems, count, plans = json.loads(stdout.strip().splitlines()[-1])
    assert plans == len(PLAN_MR) * len(PLAN_OUTER) * len(PLAN_PIXELS) * len(PLAN_CHANNELS) * 64
    assert not count, f"{count} bad plans; the first:\n" + "\n".join(problems)


# The models' conv layers (ResNet-18's and MobileNet's sizes): pixels, channels.
PLAN_CONVS = ((12544, 64), (3136, 64), (784, 128), (196, 256), (49, 512), (12544, 32),
               (3136, 128), (784, 256), (196, 512), (49, 1024))


def spread_problems(threads):
    """The models' convs on ``threads`` threads (mr = 14 as on AVX-512) whose busiest
    thread computes more than 1.25x its even share of the sums (its units' rounds times a
    unit's channels x pixels, against the whole output over the threads)."""
    ffi, lib = kernels.load()
    out = ffi.new("int64_t[4]")
    problems = []
    for tp, ocg in PLAN_CONVS:
        assert lib.tirbyoc_conv2d_direct_plan(1, tp, ocg, 14, threads, out) == 0
        obw, nob, pbw, npb = out
        units = nob * npb
        busiest = _cdiv(units, min(units, threads)) * obw * pbw
        even = _cdiv(tp, 14) * 14 * _cdiv(ocg, 16) * 16 / threads
        if busiest > 1.25 * even:
            problems.append(f"{tp} pixels x {ocg} channels on {threads} threads: {units} "
                            f"units of {obw} x {pbw}, the busiest thread "
                            f"{busiest / even:.2f}x its share")
    return problems


@pytest.mark.parametrize("threads", THREAD_COUNTS)
def test_direct_plan_spreads_the_models_convs(threads):
    """With this CPU's caches (tests/test_caches.py: with others')."""
    assert not spread_problems(threads)


def test_direct_plan_rejects_bad_sizes():
    ffi, lib = kernels.load()
    out = ffi.new("int64_t[4]")
    for args in ((0, 1, 1, 14, 1), (1, 0, 1, 14, 1), (1, 1, 0, 14, 1), (1, 1, 1, 0, 1),
                 (1, 1, 1, 33, 1), (1, 1, 1, 14, 0), (1, 1 << 40, 1, 14, 1),
                 (1 << 30, 1 << 30, 1 << 30, 14, 1)):
        assert lib.tirbyoc_conv2d_direct_plan(*args, out) == 1, args
    assert lib.tirbyoc_conv2d_direct_plan(1, 1, 1, 14, 1, ffi.NULL) == 4


# --- every kernel, at every thread count -------------------------------------------------


@pytest.mark.parametrize("instruction_set", kernels.available_isas())
def test_every_kernel_same_bits_at_every_thread_count(instruction_set):
    isa = instruction_set
    """Each exported kernel (the fuzz's FAMILIES, so none is left out), one call above its
    threading threshold, at every count of THREAD_COUNTS: same status, same bits."""
    stdout = _child(f"""
        import json
        from tests import test_kernel_fuzz as fz
        fz.LIBRARY.set_isa({isa!r})
        swept, problems = [], []
        for symbol in fz.KERNEL_SYMBOLS:
            case, found = fz.thread_sweep(symbol, {isa!r}, {THREAD_COUNTS[1:]!r})
            if case is not None:
                swept.append(symbol)
            problems += found
        print(json.dumps([swept, problems]))
    """, timeout=300)
    swept, problems = json.loads(stdout.strip().splitlines()[-1])
    assert not problems, "\n".join(problems[:10])
    # every kernel family that splits work over threads took part
    for family in ("dense", "matmul", "softmax", "attention", "conv2d_f32",
                   "conv2d_winograd", "depthwise", "max_pool", "_layouts"):
        assert any(family in symbol for symbol in swept), (family, swept)


# Conv layers of ResNet-18 and MobileNet (batch 1, 224 x 224 input): C, H, OC, K,
# stride, groups. The 14 x 14 and 7 x 7 ones never returned at 8 threads on AVX-512.
MODEL_CONVS = ((3, 224, 64, 7, 2, 1), (64, 56, 64, 3, 1, 1), (256, 14, 256, 3, 1, 1),
               (512, 7, 512, 3, 1, 1), (128, 28, 256, 3, 2, 1), (32, 112, 64, 1, 1, 1),
               (256, 14, 256, 1, 1, 1), (512, 14, 512, 1, 1, 1), (1024, 7, 1024, 1, 1, 1),
               (64, 112, 64, 3, 2, 64), (512, 14, 512, 3, 1, 512))


def _model_conv_calls(c, h, oc, k, s, g, rng):
    """The calls of one MODEL_CONVS layer, + bias + relu: the plain call, the pre-packed
    one, and NCHW16c in and out where the channels allow (the path models take)."""
    x = rng.standard_normal((1, c, h, h), np.float32)
    pad, ops = k // 2, ("bias", "relu")
    b = rng.standard_normal(oc).astype(np.float32)
    if g > 1:
        w = rng.standard_normal((c, 1, k, k)).astype(np.float32) / k
        calls = {"depthwise": lambda: kernels.depthwise_conv2d(
            x, w, stride=s, padding=pad, epilogue=ops, bias=b)}
        if c % 16 == 0:
            xb = kernels.to_nchw16c(x)
            calls["depthwise nchw16c"] = lambda: kernels.depthwise_conv2d(
                xb, w, stride=s, padding=pad, epilogue=ops, bias=b, layout_x="nchw16c",
                layout_y="nchw16c")
        return calls
    w = (rng.standard_normal((oc, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    packed = kernels.pack_conv2d_weight(w, b)
    calls = {
        "conv2d": lambda: kernels.conv2d(x, w, stride=s, padding=pad, epilogue=ops, bias=b),
        "packed": lambda: kernels.conv2d(x, packed, stride=s, padding=pad, epilogue=ops),
    }
    if c % 16 == 0 and oc % 16 == 0:
        xb = kernels.to_nchw16c(x)
        calls["packed nchw16c"] = lambda: kernels.conv2d(
            xb, packed, stride=s, padding=pad, epilogue=ops, layout_x="nchw16c",
            layout_y="nchw16c")
    return calls


def sweep_model_convs(counts):
    """Each MODEL_CONVS layer's calls on every ISA at 1 thread, then at each of
    ``counts``: returns the problems (results that differ, errors)."""
    rng = np.random.default_rng(7)
    problems = []
    saved_isa, saved_threads = kernels.isa(), kernels.num_threads()
    try:
        for isa in kernels.available_isas():
            kernels.set_isa(isa)
            for layer in MODEL_CONVS:
                for name, call in _model_conv_calls(*layer, rng).items():
                    kernels.set_num_threads(1)
                    one = np.ascontiguousarray(call()).view(np.uint32).copy()
                    for threads in counts:
                        kernels.set_num_threads(threads)
                        got = np.ascontiguousarray(call()).view(np.uint32)
                        if (got != one).any():
                            problems.append(f"{isa} {name} (C, H, OC, K, stride, groups) = "
                                            f"{layer} on {threads} threads: "
                                            f"{int((got != one).sum())} cells differ")
    finally:
        kernels.set_isa(saved_isa)
        kernels.set_num_threads(saved_threads)
    return problems


def test_model_convs_same_bits_at_every_thread_count():
    stdout = _child(f"""
        import json
        from tests.test_threads import sweep_model_convs
        print(json.dumps(sweep_model_convs({THREAD_COUNTS[1:]!r})))
    """, timeout=400)
    problems = json.loads(stdout.strip().splitlines()[-1])
    assert not problems, "\n".join(problems[:10])


# The start of the child scripts below: the extension alone (no TVM: its threads would
# count too) and a float pointer to an array.
EXTENSION_ALONE = """
    import importlib.util, os, numpy as np
    spec = importlib.util.spec_from_file_location("tirbyoc._kernels", {path!r})
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    ptr = lambda x: ext.ffi.cast("float *", x.ctypes.data)
"""

POOL_THREADS = EXTENSION_ALONE + """
    a, w = np.ones((64, 512), np.float32), np.ones((1024, 512), np.float32)
    c = np.empty((64, 1024), np.float32)
    before = len(os.listdir("/proc/self/task"))
    # 67 MFLOP in 32 or more units: split over 32 threads or more
    assert ext.lib.tirbyoc_dense_f32_nt(64, 1024, 512, ptr(a), 512, ptr(w), 512,
                                        ext.ffi.NULL, ptr(c), 1024) == 0
    print(len(os.listdir("/proc/self/task")) - before, len(os.sched_getaffinity(0)))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc")
def test_pool_runs_at_most_the_cpus_unless_told():
    """TIRBYOC_NUM_THREADS=64: the pool starts at most one worker per further CPU (more
    would only take turns on them), and one per further unit, up to 63, with
    TIRBYOC_OVERSUBSCRIBE=1."""
    env = {"TIRBYOC_NUM_THREADS": "64"}
    import tirbyoc._kernels as ext

    code = POOL_THREADS.format(path=ext.__file__)
    workers, cpus = map(int, _child(code, 60, {**env, "TIRBYOC_OVERSUBSCRIBE": "0"})
                        .split()[-2:])
    assert workers == min(cpus, 32) - 1 or (cpus > 32 and workers >= 31), (workers, cpus)
    workers, _ = map(int, _child(code, 60, {**env, "TIRBYOC_OVERSUBSCRIBE": "1"})
                     .split()[-2:])
    assert workers >= 31, workers


POOL_SPIN = EXTENSION_ALONE + """
    import time
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 512)).astype(np.float32)
    w = rng.standard_normal((1024, 512)).astype(np.float32)
    def dense(threads):
        ext.lib.tirbyoc_set_num_threads(threads)
        c = np.empty((64, 1024), np.float32)
        assert ext.lib.tirbyoc_dense_f32_nt(64, 1024, 512, ptr(a), 512, ptr(w), 512,
                                            ext.ffi.NULL, ptr(c), 1024) == 0
        return c
    one = dense(1)
    before = set(os.listdir("/proc/self/task"))
    same = all(np.array_equal(dense(4), one) for _ in range(3))
    workers = sorted(set(os.listdir("/proc/self/task")) - before)
    def cpu_seconds():  # the workers' user + system time
        ticks = 0
        for tid in workers:
            fields = open(f"/proc/self/task/{{tid}}/stat").read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")
    dense(4)
    start = cpu_seconds()
    time.sleep(0.3)
    idle = cpu_seconds() - start
    # woken from sleep (TIRBYOC_SPIN_US=0: after every call), the same bits
    time.sleep(0.05)
    same = same and np.array_equal(dense(4), one)
    print(same, len(workers), idle)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc")
def test_spin_setting_keeps_workers_spinning_or_asleep():
    """TIRBYOC_SPIN_US: how long an idle worker spins before it sleeps. At 1 s the
    workers keep a core busy through the 0.3 s after a call; at 0 they sleep at
    once, use no CPU time, and wake for the next call with the same bits."""
    import tirbyoc._kernels as ext

    code = POOL_SPIN.format(path=ext.__file__)
    for us, busy in (("1000000", True), ("0", False)):
        same, workers, idle = _child(code, 60, {"TIRBYOC_SPIN_US": us}).split()[-3:]
        assert same == "True" and int(workers) >= 1, (us, same, workers)
        if busy:
            assert float(idle) >= 0.1, (us, idle)  # 0.3 s, less what others took
        else:
            assert float(idle) <= 0.03, (us, idle)


def test_bad_spin_setting_is_refused(monkeypatch):
    """A TIRBYOC_SPIN_US that is not 0 to 1000000 microseconds: loading the kernels
    says so (the library alone keeps its default)."""
    # (load is cached: the first call in a process reads the setting; __wrapped__ reads
    # it again)
    for value in ("-1", "fast", "2000000", "1e3"):
        monkeypatch.setenv("TIRBYOC_SPIN_US", value)
        with pytest.raises(ValueError, match=f"TIRBYOC_SPIN_US={value!r}: expected"):
            kernels.load.__wrapped__()
    for value in ("0", "1000000", ""):
        monkeypatch.setenv("TIRBYOC_SPIN_US", value)
        kernels.load.__wrapped__()


POOL_AFFINITY = EXTENSION_ALONE + """
    cpus = sorted(os.sched_getaffinity(0))
    # what TVM's pool does to the calling thread when it runs fewer threads than CPUs
    os.sched_setaffinity(0, {{cpus[0]}})
    before = set(os.listdir("/proc/self/task"))
    a, w = np.ones((64, 512), np.float32), np.ones((1024, 512), np.float32)
    c = np.empty((64, 1024), np.float32)
    assert ext.lib.tirbyoc_dense_f32_nt(64, 1024, 512, ptr(a), 512, ptr(w), 512,
                                        ext.ffi.NULL, ptr(c), 1024) == 0
    for tid in sorted(set(os.listdir("/proc/self/task")) - before):
        print(tid, sorted(os.sched_getaffinity(int(tid))))
    print("cpus", cpus)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux's /proc and 2 CPUs")
def test_pool_workers_run_on_every_cpu_of_the_process():
    """A caller bound to one CPU after the library was loaded (as TVM's pool binds the
    thread that starts it, with TVM_NUM_THREADS below the CPU count) still gets one
    worker per further CPU of the process, each free to run on any of them: not all
    bound to that one CPU (measured on a 16-core Xeon before: the workers' CPU list
    was the caller's "0-1")."""
    import tirbyoc._kernels as ext

    out = _child(POOL_AFFINITY.format(path=ext.__file__), 60,
                 {"TIRBYOC_NUM_THREADS": "2", "TIRBYOC_OVERSUBSCRIBE": "0"}).split("\n")
    cpus = next(line for line in out if line.startswith("cpus"))
    workers = [line.split(" ", 1)[1] for line in out if line and not line.startswith("cpus")]
    assert len(workers) == 1, out  # two threads: the caller and one worker
    assert workers[0] == cpus.split(" ", 1)[1], out
