"""Micro benchmark of the dense kernels against numpy (OpenBLAS).

For each shape (M x K -> N) it times, interleaved round by round, the fused
dense + bias + relu of tirbyoc with a pre-packed weight ("packed"), with the
weight as given ([N, K], "nt"), and numpy's ``a @ w.T + b`` then
``np.maximum`` (in place, without temporaries), and reports the median
GFLOP/s of each and the ratios to numpy. Run from the project root after
building in place:

    python kernels/bench_kernels.py [--threads 2] [--isa avx512] [--rounds 15]
"""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tirbyoc import bench, kernels  # noqa: E402

SHAPES = [  # (M, K, N)
    (64, 800, 500),
    (128, 768, 3072),
    (512, 1024, 1024),
    (1024, 1024, 1024),
    (1, 4096, 4096),
    (16, 4096, 4096),
    (384, 768, 768),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--isa", default=None)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--settle", type=float, default=0.3,
                        help="seconds of idle time before each measurement, so that the "
                             "other library's idle worker threads (OpenBLAS keeps them "
                             "spinning for a while after a call) have gone to sleep")
    parser.add_argument("--shapes", default=None, help="e.g. 64x800x500,1x4096x4096 (MxKxN)")
    args = parser.parse_args()

    ffi, lib = kernels.load()
    if args.isa:
        kernels.set_isa(args.isa)
    kernels.set_num_threads(args.threads)
    shapes = SHAPES
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    print(f"isa={kernels.isa()} threads={args.threads} rounds={args.rounds}")
    print(f"{'M x K -> N':>20} {'packed':>8} {'nt':>8} {'numpy':>8} {'pk/np':>6} {'nt/np':>6}  GFLOP/s")
    ratios_p, ratios_n = [], []
    rng = np.random.default_rng(0)
    for m, k, n in shapes:
        a = rng.standard_normal((m, k), dtype=np.float32)
        w = rng.standard_normal((n, k), dtype=np.float32)
        b = rng.standard_normal(n, dtype=np.float32)
        packed = kernels.pack_weight(w, "nt")
        out = np.empty((m, n), dtype=np.float32)
        pa, pw, pb, pc, pp = (ffi.cast("float *", x.ctypes.data) for x in (a, w, b, out, packed))

        def run_packed():
            lib.tirbyoc_dense_relu_f32_packed(m, n, k, pa, k, pp, pb, pc, n)

        def run_nt():
            lib.tirbyoc_dense_relu_f32_nt(m, n, k, pa, k, pw, k, pb, pc, n)

        wt = w.T

        def run_numpy(o=out):
            np.matmul(a, wt, out=o)
            o += b
            np.maximum(o, 0, out=o)

        runs = {"packed": run_packed, "nt": run_nt, "numpy": run_numpy}
        # The same measuring steps as the project benchmark (idle pause, warm-up,
        # timed batch, rotating order, medians).
        seconds = bench.interleaved(runs, args.rounds, args.settle)
        flops = 2.0 * m * n * k
        g = {name: flops / t / 1e9 for name, t in seconds.items()}
        ratios_p.append(g["packed"] / g["numpy"])
        ratios_n.append(g["nt"] / g["numpy"])
        print(f"{f'{m}x{k}->{n}':>20} {g['packed']:8.1f} {g['nt']:8.1f} {g['numpy']:8.1f} "
              f"{ratios_p[-1]:6.2f} {ratios_n[-1]:6.2f}")
    geo = lambda xs: float(np.exp(np.mean(np.log(xs))))  # noqa: E731
    print(f"{'geomean ratio':>20} {'':8} {'':8} {'':8} {geo(ratios_p):6.2f} {geo(ratios_n):6.2f}")


if __name__ == "__main__":
    main()
