"""Command line: ``tirbyoc demo`` (the main job), ``tirbyoc explain MODEL.onnx`` and
``tirbyoc bench MODEL.onnx`` (tirbyoc against ONNX Runtime, see ``tirbyoc.bench_models``).

``demo`` builds the seed MLP (64x800 -> Linear(500) -> ReLU -> Linear(10)), offloads it,
runs it, checks it against numpy, and prints the explain table and the speed against
TVM's default build. It exits non-zero when the numerics are off.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

RTOL = 1e-4


def demo(args) -> int:
    import tvm

    import tirbyoc
    from tirbyoc import examples

    layers = examples.mlp_weights()
    mod = examples.mlp_relax(args.batch, layers)
    x = np.random.default_rng(0).standard_normal((args.batch, 800), np.float32)
    ref = examples.mlp_numpy(x, layers)

    print(f"seed MLP: {args.batch}x800 -> Linear(500) -> ReLU -> Linear(10), weights bound\n")
    print(tirbyoc.explain(mod))

    ours = tirbyoc.compile(mod, args.target)
    got = tirbyoc.run(ours, x)
    err = float(np.max(np.abs(got - ref)) / max(float(np.max(np.abs(ref))), 1e-30))
    ok = np.allclose(got, ref, rtol=RTOL, atol=RTOL * float(np.abs(ref).max()))
    print(f"\nnumerics vs numpy (float64): max error {err:.2e} of max|ref| -> "
          f"{'OK' if ok else 'MISMATCH'} (rtol {RTOL:g})")

    default = tvm.compile(mod, target=args.target)
    vm_ours = tvm.relax.VirtualMachine(ours, tvm.cpu())
    vm_default = tvm.relax.VirtualMachine(default, tvm.cpu())
    xt = tvm.runtime.tensor(x)
    w = [(wi.T.copy(), bi) for wi, bi in layers]

    def numpy_mlp():
        h = np.maximum(x @ w[0][0] + w[0][1], 0)
        return h @ w[1][0] + w[1][1]

    from .bench import interleaved

    times = interleaved({"tirbyoc": lambda: vm_ours["main"](xt),
                         "TVM default": lambda: vm_default["main"](xt),
                         "numpy": numpy_mlp}, args.repeat, few=("TVM default",), few_reps=3)
    print(f"\nspeed (median of {args.repeat} interleaved rounds; "
          "python -m tirbyoc.bench for the full benchmark):")
    for name, t in times.items():
        print(f"  {name:12s} {t * 1e3:9.3f} ms   tirbyoc is {t / times['tirbyoc']:7.2f}x "
              f"faster" if name != "tirbyoc" else f"  {name:12s} {t * 1e3:9.3f} ms")
    return 0 if ok else 1


def explain_file(args) -> int:
    import tirbyoc

    if not args.model.endswith(".onnx"):
        print(f"tirbyoc explain: expected an .onnx file, got {args.model}", file=sys.stderr)
        return 2
    import onnx

    try:
        mod = tirbyoc.from_onnx(onnx.load(args.model))
    except tirbyoc.UnsupportedNode as exc:
        print(f"tirbyoc explain: {args.model}: {exc}", file=sys.stderr)
        return 2
    print(tirbyoc.explain(mod))
    return 0


def bench_file(args) -> int:
    from . import bench_models

    shapes = {}
    for item in args.shape:
        name, _, dims = item.partition("=")
        try:
            shapes[name] = [int(d) for d in dims.split(",")]
        except ValueError:
            print(f"tirbyoc bench: --shape wants name=d0,d1,..., got {item!r}", file=sys.stderr)
            return 2
    bench_models._set_threads(args.threads)
    rows = bench_models.bench_onnx_file(args.model, shapes, args.threads, args.reps,
                                        args.tvm_reps, not args.no_tvm, args.settle,
                                        progress=lambda s: print(s, file=sys.stderr))
    print(bench_models.report(rows, args.threads))
    json_path, _ = bench_models.write(rows, args.out, args.threads, name="onnx_model")
    print(f"\nwrote {json_path}")
    row = rows[0]
    err = row["rel_err"]
    if row["reference"] == "float64":
        # NOTE: only tirbyoc's error decides (the peers' are in the table)
        tol = bench_models.float64_tolerance(err)
        against, judged = "the model in float64", {"tirbyoc": err["tirbyoc"]}
    else:
        tol, against, judged = bench_models.RTOL, "ONNX Runtime", err
    print(f"reference: {against}; tolerance {tol:.1e} of max|reference|")
    bad = [f"{p}: {e:.1e}" for p, e in judged.items() if e > tol]
    if bad:
        print(f"NUMERICS OUT OF TOLERANCE (against {against}): " + ", ".join(bad))
        return 1
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tirbyoc", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="offload, run, check and time the seed MLP")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--target", default="llvm")
    p.set_defaults(fn=demo)
    p = sub.add_parser("explain", help="what tirbyoc offloads in an ONNX model, and why not")
    p.add_argument("model")
    p.set_defaults(fn=explain_file)
    p = sub.add_parser("bench", help="time an ONNX model through tirbyoc against ONNX Runtime "
                                     "(and TVM's default build), after checking the numerics")
    p.add_argument("model")
    p.add_argument("--shape", action="append", default=[],
                   help="input shape, name=d0,d1,... (symbolic dims default to 1)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--tvm-reps", type=int, default=1)
    p.add_argument("--no-tvm", action="store_true")
    p.add_argument("--settle", type=float, default=0.3,
                   help="seconds of idle before each measurement (thread pools settle: "
                        "ONNX Runtime's workers spin about 65 ms after a run)")
    p.add_argument("--out", default="bench-results")
    p.set_defaults(fn=bench_file)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
