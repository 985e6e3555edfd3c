"""The blocking derived from the caches, on caches this machine does not have.

The kernels size some of their blocks from the L1d and L2 that cpuid reports (the conv
direct path's units of sums: half the L2; the depthwise paths' windows: the L1d, and half
the L2 for the channels-in-lanes path). ``TIRBYOC_CACHES="L1,L2"`` replaces the two
sizes, so one machine runs the blocking of CPUs it is not: each check below runs in a
fresh process per setting (the caches are read once per process): L2 from 64 KiB (below
every bound) through a client core's 256 KiB and a server core's 1.25 and 2 MiB to 4 MiB
(above every bound).

* the kernels report the sizes they use (``tirbyoc.kernels.cache_sizes``), and an
  unreadable ``TIRBYOC_CACHES`` is an error, not silently the detected sizes;
* the direct path's plan follows the rule (a unit's sums within half the L2, clamped to
  16K-128K floats) and still spreads the models' convs over 1 to 64 threads;
* results do not depend on the caches: a dense product with bias + GELU, a direct-path
  conv and depthwise convs on both of their paths give the same bits under every
  setting, on 1 and 3 threads.
"""

import json

import pytest

from .test_threads import THREAD_COUNTS, _cdiv, _child

# (TIRBYOC_CACHES, L1d bytes, L2 bytes)
SETTINGS = (("32K,64K", 32 << 10, 64 << 10), ("32K,256K", 32 << 10, 256 << 10),
            ("32K,512K", 32 << 10, 512 << 10), ("48K,1280K", 48 << 10, 1280 << 10),
            ("48K,2M", 48 << 10, 2 << 20), ("65536,4M", 64 << 10, 4 << 20))
SUMS_MIN, SUMS_MAX = 16 * 1024, 128 * 1024  # tb_l2_half_floats's bounds (dispatch.c)

RUN = """
import hashlib, json, os
import numpy as np
from tirbyoc import kernels

ffi, lib = kernels.load()
rng = np.random.default_rng(7)

def p(a):
    return ffi.cast("float *", a.ctypes.data)

def digest(a):
    return hashlib.sha256(a.tobytes()).hexdigest()[:16]

out = {"caches": kernels.cache_sizes()}
plan = ffi.new("int64_t[4]")
assert lib.tirbyoc_conv2d_direct_plan(1, 3136, 128, 6, 1, plan) == 0
out["plan"] = list(plan)
x = rng.standard_normal((2, 64, 20, 20)).astype(np.float32)
w = rng.standard_normal((96, 64, 3, 3)).astype(np.float32)
b = rng.standard_normal(96).astype(np.float32)
dx = rng.standard_normal((1, 144, 41, 41)).astype(np.float32)
dw = rng.standard_normal((144, 1, 5, 5)).astype(np.float32)
db = rng.standard_normal(144).astype(np.float32)
a = rng.standard_normal((300, 700)).astype(np.float32)
wd = rng.standard_normal((200, 700)).astype(np.float32)
bd = rng.standard_normal(200).astype(np.float32)
for threads in (1, 3):
    lib.tirbyoc_set_num_threads(threads)
    c = np.empty((300, 200), np.float32)  # two K blocks; the A blocks' rows follow the L2
    assert lib.tirbyoc_matmul_f32(1, 300, 200, 700, p(a), 700, 0, p(wd), 700, 0, 1, p(c), 200,
                                  0, 1 | 4 << 4, 1.0, p(bd), ffi.NULL, 0, 0) == 0
    out[f"dense/{threads}"] = digest(c)
    y = np.empty((2, 96, 20, 20), np.float32)
    assert lib.tirbyoc_conv2d_f32(2, 64, 20, 20, p(x), 96, 1, 3, 3, p(w), 1, 1, 1, 1, 1, 1,
                                  20, 20, 1 | 2 << 4, p(b), ffi.NULL, p(y)) == 0
    out[f"conv/{threads}"] = digest(y)
    for path in ("p", "c"):
        os.environ["TIRBYOC_DW_PATH"] = path
        for stride, size in ((1, 41), (2, 21)):
            dy = np.empty((1, 144, size, size), np.float32)
            assert lib.tirbyoc_depthwise_conv2d_f32(
                1, 144, 41, 41, p(dx), 5, 5, p(dw), stride, stride, 2, 2, 1, 1, size, size,
                1 | 6 << 4, p(db), ffi.NULL, p(dy)) == 0
            out[f"dw/{path}/{stride}/{threads}"] = digest(dy)
print(json.dumps(out))
"""


def _run(caches=None):
    env = {"TIRBYOC_CONV_DIRECT": "1"}
    if caches is not None:
        env["TIRBYOC_CACHES"] = caches
    return json.loads(_child(RUN, timeout=120, env=env).strip().splitlines()[-1])


def test_caches_set_the_blocking_and_leave_the_results():
    detected = _run()
    caches = detected["caches"]
    assert 8 << 10 <= caches["l1"] <= caches["l2"] and caches["l1_ways"] >= 2
    assert caches["l2_ways"] >= 2 and 32 <= caches["line"] <= 256
    results = {key: value for key, value in detected.items() if "/" in key}
    assert len(results) == 12
    for setting, l1, l2 in SETTINGS:
        got = _run(setting)
        assert got["caches"]["l1"] == l1 and got["caches"]["l2"] == l2, setting
        # the ways stay what cpuid says
        assert got["caches"]["l1_ways"] == caches["l1_ways"], setting
        sums = min(SUMS_MAX, max(SUMS_MIN, l2 // 2 // 4))
        obw, nob, pbw, npb = got["plan"]
        assert (obw, nob) == (128, 1), setting
        assert obw * pbw <= sums and npb == _cdiv(3136, sums // obw // 6 * 6), (setting, got)
        assert {key: value for key, value in got.items() if "/" in key} == results, setting


@pytest.mark.parametrize("value", ["lots", "48K", "48K,", "2M,48K", "48K,2G", "4K,1M",
                                   "48K,1M,", "-48K,1M", "48.5K,1M"])
def test_an_unreadable_setting_is_an_error(value):
    code = """
        from tirbyoc import kernels
        try:
            kernels.load()
        except ValueError as exc:
            print("refused:", exc)
    """
    out = _child(code, timeout=60, env={"TIRBYOC_CACHES": value})
    assert f"refused: TIRBYOC_CACHES={value!r}: expected the L1d and L2 sizes" in out


def test_the_plan_spreads_the_models_convs_whatever_the_caches():
    """tests/test_threads.py's spread check (the busiest thread within 1.25x its share)
    at every thread count, with the smallest and the largest L2 of the settings above."""
    for setting in ("32K,256K", "48K,2M"):
        out = _child(f"""
            import json
            from tests.test_threads import spread_problems
            print(json.dumps([p for t in {list(THREAD_COUNTS)} for p in spread_problems(t)]))
        """, timeout=120, env={"TIRBYOC_CACHES": setting})
        problems = json.loads(out.strip().splitlines()[-1])
        assert not problems, (setting, problems[:5])
