"""Layer benchmark: what one convolution layer of the benchmark models costs, tirbyoc
against ONNX Runtime and PyTorch eager, in one run and without a profiler.

    python -m tirbyoc.bench --layers [--layer pw512@14] [--reps 15]

A layer is a conv (depthwise 3x3, pointwise 1x1 or full 3x3, stride 1, padding to keep
the size), its batch norm and its activation, as the models have them (MobileNet's
ReLU6, ResNet-18's ReLU). Each contender runs a chain of ``CHAIN`` such layers and a
chain of ``SHORT``, built from the same PyTorch module; the layer's cost is the
difference divided by ``CHAIN - SHORT``. That leaves out what a call costs once (the
input's checks, the output's allocation, the conversions into and out of a blocked
layout where a run of layers starts and ends) and keeps what a layer costs inside a
network: each contender keeps its own layout between its layers, and each layer reads
what the one before it just wrote. The short chain has two layers, not one, so that both
chains start and end the same way: ONNX Runtime converts into and out of its NCHWc
layout around any chain, but tirbyoc keeps a single layer NCHW and blocks only the
tensors between layers, so that its first and last layers convert (against a chain of
one, 56 x 56 1x1 layers of 64 channels read 1.3x slower per layer than they run).
ONNX Runtime's profiler cannot give this: its hooks add several microseconds to every
node.

Chains are timed interleaved (``tirbyoc.bench.interleaved``: medians, an idle pause
before each measurement), every output is checked against PyTorch (1e-4 of max|ref|),
and tirbyoc's build must run the chain as one kernel call per conv.

The table says which instruction set each contender ran (tirbyoc's kernels, PyTorch's
ATen dispatch; ONNX Runtime picks its own and cannot be capped) and, for tirbyoc, the
layer's GFLOP/s and its share of the fp32 FMA peak that ``tirbyoc.timing.measure_peak``
measures for tirbyoc's instruction set on the same threads. ``TIRBYOC_ISA=avx2`` runs
tirbyoc's AVX2 code on an AVX-512 machine; PyTorch is capped the same way with
``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` in the environment.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from . import kernels
from .timing import SETTLE_SECONDS, interleaved
from .bench_models import (RTOL, _first, _ort_session, _rel_err, _set_threads, _torch_call,
                           _vm, isas, onnx_bytes, write_json)

# Layers in the longer chain and in the shorter one.
CHAIN = 5
SHORT = 2


@dataclass(frozen=True)
class Layer:
    """``kind``: "dw" (3x3 depthwise, ReLU6), "pw" (1x1, ReLU6), "conv" (3x3, ReLU) or
    "ir" (MobileNetV2's inverted residual block: a 1x1 conv expanding to ``EXPAND`` times
    the channels, a 3x3 depthwise conv, both with ReLU6, a 1x1 conv back, and the
    block's input added: three kernel calls); ``channels`` in and out; ``size``: height
    and width."""

    kind: str
    channels: int
    size: int

    @property
    def name(self) -> str:
        return f"{self.kind}{self.channels}@{self.size}"

    @property
    def flops(self) -> int:
        """Multiply-adds times two of the conv (the batch norm is folded, the activation
        is not counted)."""
        c, pixels = self.channels, self.size * self.size
        if self.kind == "ir":
            return 2 * pixels * EXPAND * c * (2 * c + 9)
        taps = {"dw": 9, "pw": c, "conv": 9 * c}[self.kind]
        return 2 * c * pixels * taps

    @property
    def calls(self) -> int:
        """Kernel calls of one layer."""
        return 3 if self.kind == "ir" else 1


# MobileNet's stride-1 depthwise and pointwise layers (most of its time), ResNet-18's
# 3x3 convs.
LAYERS = tuple(Layer(k, c, s) for k, c, s in (
    ("dw", 32, 112), ("dw", 128, 56), ("dw", 256, 28), ("dw", 512, 14), ("dw", 1024, 7),
    ("pw", 128, 56), ("pw", 256, 28), ("pw", 512, 14), ("pw", 1024, 7),
    ("conv", 64, 56), ("conv", 128, 28), ("conv", 256, 14), ("conv", 512, 7)))
KINDS = ("dw", "pw", "conv", "ir")
# The inverted residual block's expansion (MobileNetV2's, and EfficientNet's but its
# first stage).
EXPAND = 6


def parse(name: str) -> Layer:
    """A layer from its name, e.g. "pw512@14" or "conv256@14" (any channels and size)."""
    for kind in KINDS:
        rest = name[len(kind):]
        if name.startswith(kind) and "@" in rest:
            channels, _, size = rest.partition("@")
            if channels.isdigit() and size.isdigit() and int(channels) > 0 and int(size) > 0:
                return Layer(kind, int(channels), int(size))
    raise SystemExit(f"bad layer {name!r}: KIND CHANNELS@SIZE with KIND one of "
                     f"{', '.join(KINDS)} (e.g. pw512@14)")


def chain_torch(layer: Layer, length: int, seed: int = 0):
    """``length`` layers in a row as an eval-mode ``torch.nn.Sequential``, batch norms
    with random statistics (so that folding them is exercised)."""
    import torch

    from . import examples

    nn = torch.nn
    torch.manual_seed(seed)
    c = layer.channels
    mods = []
    for _ in range(length):
        if layer.kind == "dw":
            mods += [nn.Conv2d(c, c, 3, 1, 1, groups=c, bias=False), nn.BatchNorm2d(c),
                     nn.ReLU6()]
        elif layer.kind == "pw":
            mods += [nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU6()]
        elif layer.kind == "ir":
            mods.append(_InvertedResidual(c))
        else:
            mods += [nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU()]
    return examples._randomize_batch_norms(nn.Sequential(*mods), seed).eval()


def _InvertedResidual(c: int):
    """MobileNetV2's stride-1 block of ``c`` channels (a module; torch imported late)."""
    import torch

    nn = torch.nn
    e = EXPAND * c

    class InvertedResidual(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(c, e, 1, bias=False), nn.BatchNorm2d(e), nn.ReLU6(),
                nn.Conv2d(e, e, 3, 1, 1, groups=e, bias=False), nn.BatchNorm2d(e),
                nn.ReLU6(), nn.Conv2d(e, c, 1, bias=False), nn.BatchNorm2d(c))

        def forward(self, x):
            return x + self.body(x)

    return InvertedResidual()


def bench_layer(layer: Layer, threads: int, reps: int, settle: float, chain: int = CHAIN,
                progress=print, short: int = SHORT) -> dict:
    """One row: microseconds per layer of each contender, and the chains' checks."""
    import torch
    import tvm

    import tirbyoc
    from . import examples

    if short < 1 or chain <= short:
        raise ValueError(f"chains of {short} and {chain} layers: need 1 <= short < chain")
    x = torch.randn(1, layer.channels, layer.size, layer.size,
                    generator=torch.Generator().manual_seed(1))
    xn = x.numpy()
    xt = tvm.runtime.tensor(xn)
    fns, errors, calls = {}, {}, {}
    for length in (short, chain):
        model = chain_torch(layer, length)
        vm = _vm(tirbyoc.compile(examples.import_torch(model, x)))
        calls[length] = kernel_calls(vm, xt)
        sess = _ort_session(onnx_bytes(model, x), threads)
        with torch.no_grad():
            ref = model(x).numpy().astype(np.float64)
        errors[length] = {"tirbyoc": _rel_err(_first(vm["main"](xt)), ref),
                          "ort": _rel_err(sess.run(None, {"x": xn})[0], ref)}
        fns[f"tirbyoc/{length}"] = lambda vm=vm: vm["main"](xt)
        fns[f"ort/{length}"] = lambda sess=sess: sess.run(None, {"x": xn})
        fns[f"torch/{length}"] = lambda model=model: _torch_call(model, x)
    times = interleaved(fns, reps, settle)
    us = {p: (times[f"{p}/{chain}"] - times[f"{p}/{short}"]) / (chain - short) * 1e6
          for p in ("tirbyoc", "ort", "torch")}
    progress(f"  measured {layer.name}")
    return {"layer": layer.name, "kind": layer.kind, "channels": layer.channels,
            "size": layer.size, "flops": layer.flops, "chain": chain, "short": short,
            "us": us,
            "chain_ms": {k: v * 1e3 for k, v in times.items()},
            "rel_err": {f"{p}/{n}": e for n, errs in errors.items() for p, e in errs.items()},
            "kernel_calls": calls}


def kernel_calls(vm, *args) -> int:
    """How many kernel calls (functions named tirbyoc_*) one run of ``main`` makes."""
    calls = []

    def instrument(func, name, before, *rest):  # noqa: ARG001 (the VM's signature)
        if before and name.startswith("tirbyoc_"):
            calls.append(name)
        return 0

    vm.set_instrument(instrument)
    try:
        vm["main"](*args)
    finally:
        vm.set_instrument(lambda *a: 0)
    return len(calls)


def report(rows, threads, peak=None, isa=None) -> str:
    """The table; ``peak`` (``tirbyoc.timing.measure_peak``'s result) adds tirbyoc's
    GFLOP/s and share of it per layer, ``isa`` (``isas()``) a line naming each
    contender's instruction set."""
    if not rows:
        return "no layers"
    chain, short = rows[0]["chain"], rows[0].get("short", 1)
    lines = [f"{threads} threads each; microseconds per layer: (chain of {chain} - chain of "
             f"{short}) / {chain - short}, medians; ratio = peer / tirbyoc (> 1: tirbyoc "
             "faster)"]
    if isa:
        lines.append("instruction sets: " + ", ".join(f"{k} {v}" for k, v in isa.items()))
        lines.append("tirbyoc's blocking from the caches: " + kernels.describe_caches())
    if peak:
        lines.append(f"fp32 FMA peak ({peak['isa']}, {peak['threads']} threads): "
                     f"{peak['all_threads']:.0f} GFLOP/s")
    head = (f"{'layer':14s}{'tirbyoc':>9s}{'ort':>9s}{'torch':>9s}{'vs ort':>8s}"
            f"{'vs torch':>9s}  {'max error':>9s}" + ("  GFLOP/s  of peak" if peak else ""))
    lines += ["", head, "-" * len(head)]
    for r in rows:
        us = r["us"]
        ratios = [f"{us[p] / us['tirbyoc']:.2f}x" if us["tirbyoc"] > 0 else "-"
                  for p in ("ort", "torch")]
        line = (f"{r['layer']:14s}{us['tirbyoc']:9.1f}{us['ort']:9.1f}{us['torch']:9.1f}"
                f"{ratios[0]:>8s}{ratios[1]:>9s}  {max(r['rel_err'].values()):9.1e}")
        if peak and us["tirbyoc"] > 0:
            gflops = r["flops"] / us["tirbyoc"] / 1e3
            line += f"  {gflops:7.1f}  {gflops / peak['all_threads']:7.1%}"
        lines.append(line)
    return "\n".join(lines)


def problems(rows) -> list:
    """Chains whose numerics are out of tolerance, or not one kernel call per conv."""
    bad = [f"{r['layer']} {k}: error {e:.1e}" for r in rows for k, e in r["rel_err"].items()
           if not e <= RTOL]
    bad += [f"{r['layer']}: chain of {n}, {got} kernel calls" for r in rows
            for n, got in r["kernel_calls"].items()
            if got != int(n) * parse(r["layer"]).calls]
    return bad


def run_layers(names, threads=2, reps=15, settle=SETTLE_SECONDS, out="bench-results") -> int:
    _set_threads(threads)
    layers = [parse(n) for n in names] if names else list(LAYERS)
    from .timing import measure_peak

    peak, isa = measure_peak(threads), isas()
    rows = [bench_layer(layer, threads, reps, settle,
                        progress=lambda s: print(s, file=sys.stderr)) for layer in layers]
    for row in rows:
        row["isa"], row["peak_gflops"] = isa, peak["all_threads"]
    print(report(rows, threads, peak, isa))
    path = write_json(rows, out, threads, "layers")
    print(f"\nwrote {path}")
    bad = problems(rows)
    if bad:
        print("CHECKS FAILED:\n  " + "\n  ".join(bad))
        return 1
    return 0
