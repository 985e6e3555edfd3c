"""Randomized differential tests ("fuzzing") of every exported C kernel.

Each exported kernel runs on every instruction set this CPU supports against a
float64 numpy reference, over random sizes (0 and 1, the register-tile, K-block,
N-block and algorithm edges of ``docs/kernels.md``, and some calls above the
4 MFLOP threshold that split work over the worker pool), a thread count per case
(THREAD_CHOICES: 1 to 64, primes and counts above the cores), random row strides,
start pointers that are not 32- or 64-byte aligned, with and without bias, with
NaN, +-Inf and zeros sprinkled into the inputs, and with invalid arguments. The
kernels are called through cffi with raw pointers, so strides and offsets are
exactly what the test chose.

Each case checks:
  * the status: 0 for valid arguments; nonzero for invalid ones, with nothing
    written at all;
  * the result against the reference. NaN exactly where the reference is NaN
    (relu and relu6 propagate NaN, as in PyTorch), the same infinity where it is
    +-Inf, equal where a non-finite value went through an activation (relu(-Inf)
    is 0, relu6(+Inf) is 6), bit-identical for weight packing, and otherwise
    |got - ref| <= 1e-5 |ref| + 1e-5 * max(1, sqrt(K) / 8) * s with
    s = max(max|ref|, t_ij): the formula of tests/test_kernels.py, whose scale
    is raised per element to the 2-norm t_ij of the terms the element sums
    (sqrt of sum_k (A_ik W_kj)^2 + bias_j^2 + C0_ij^2). Random shapes include
    outputs that are small only by cancellation (a single output with K = 2),
    where max|ref| alone gives a tolerance below float32 rounding;
  * that nothing outside the output is written: guard cells before and after
    every buffer and the stride padding between the rows of C hold a sentinel
    bit pattern that must survive, and every input buffer (guards included)
    must be bit-for-bit unchanged. Input guards and padding hold NaN, so a read
    outside an input shows up as NaN in the result.

The kernels are described by one table, FAMILIES: a pattern over symbol names,
how to build the arguments, and the reference. Collection fails if an exported
symbol matches no entry (or two), so a new kernel cannot be left out; exported
functions that are not kernels are listed with a reason in NOT_KERNELS.

Environment:
  TIRBYOC_FUZZ_CASES  cases per kernel and instruction set: an integer sets the
                      count (default 80), "10x" multiplies the default.
  TIRBYOC_FUZZ_SEED   base seed (default 20241123). Each case draws from its own
                      generator seeded with (seed, symbol, ISA, case index).
  TIRBYOC_FUZZ_LIB    path of a kernel extension built elsewhere, tested instead
                      of the installed one (the sanitized build of
                      docs/kernels.md, "Sanitizers and fuzzing").

A failure prints the case and the command that replays it alone:
  python -m tests.test_kernel_fuzz SYMBOL ISA INDEX [--seed SEED]
The number of cases per kernel and ISA (and per algorithm path) is printed in
the "tirbyoc reliability figures" section of pytest's summary.
"""

import argparse
import dataclasses
import functools
import importlib.util
import math
import os
import re
import sys
import time
import zlib
from collections import Counter
from typing import Callable

import numpy as np
import pytest

from tirbyoc import kernels

DEFAULT_CASES = 80
DEFAULT_SEED = 20241123


# An epilogue code no operation has (the conv families' invalid chains).
UNKNOWN_OP = max(kernels.EPILOGUE_OPS.values()) + 1

def _case_count(text):
    """Cases per (kernel, ISA) from TIRBYOC_FUZZ_CASES ("" -> default)."""
    text = text.strip()
    if not text:
        return DEFAULT_CASES
    match = re.fullmatch(r"(\d+(?:\.\d+)?)x", text)
    count = round(float(match.group(1)) * DEFAULT_CASES) if match else int(text)
    if count < 1:
        raise ValueError(f"TIRBYOC_FUZZ_CASES must give at least 1 case, got {text!r}")
    return count


CASES = _case_count(os.environ.get("TIRBYOC_FUZZ_CASES", ""))
SEED = int(os.environ.get("TIRBYOC_FUZZ_SEED", DEFAULT_SEED))


# --- the library under test --------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Library:
    """The cffi kernels under test, their exported symbols and ISAs."""

    ffi: object
    lib: object
    symbols: tuple
    isas: tuple
    path: str

    def isa(self):
        return self.ffi.string(self.lib.tirbyoc_isa()).decode()

    def set_isa(self, name):
        if self.lib.tirbyoc_set_isa(name.encode()) != 0:
            raise ValueError(f"instruction set {name!r} not available")


def _load_library():
    path = os.environ.get("TIRBYOC_FUZZ_LIB", "")
    if not path:
        ffi, lib = kernels.load()
        return Library(ffi, lib, tuple(kernels.exported_symbols()),
                       tuple(kernels.available_isas()), "installed")
    # Another build of the same extension module (e.g. sanitized); it is not
    # registered in sys.modules, so the installed one stays importable.
    spec = importlib.util.spec_from_file_location("tirbyoc._kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ffi, lib = module.ffi, module.lib
    symbols = tuple(sorted(name for name in dir(lib)
                           if name.startswith(kernels.SYMBOL_PREFIX) and callable(getattr(lib, name))))
    saved = ffi.string(lib.tirbyoc_isa())
    isas = tuple(name for name in ("generic", "avx2", "avx512")
                 if lib.tirbyoc_set_isa(name.encode()) == 0)
    lib.tirbyoc_set_isa(saved)
    return Library(ffi, lib, symbols, isas, path)


LIBRARY = _load_library()


# --- sizes ----------------------------------------------------------------------

# Edges from docs/kernels.md and dense_f32*.c: register tiles 14x32 (AVX-512),
# 6x16 (AVX2), 4x16 (generic); few-rows path up to 4 rows (8 for "nt"); nt_direct
# for 9..64 rows (AVX2) or 9..128 (AVX-512) in 64-row chunks, 6-column tiles, up to K = 4356; K blocks of
# 256/528; N blocks of 256/512; threads split N from 8 tiles (128/256 columns);
# few-rows column chunks of 64 and 1024; dot products over 8/16 lanes.
M_EDGES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 14, 15, 16, 17, 27, 28, 29, 42, 43,
           63, 64, 65, 127, 128, 129)
N_EDGES = (1, 5, 6, 7, 8, 9, 12, 13, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65,
           127, 128, 129, 255, 256, 257, 511, 512, 513, 1023, 1024, 1025)
K_EDGES = (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 255, 256, 257, 511, 512,
           513, 527, 528, 529, 767, 768, 769, 1024, 1025, 4356, 4357)
LOG_MAX = {"m": 300, "n": 1100, "k": 1100}
EDGES = {"m": M_EDGES, "n": N_EDGES, "k": K_EDGES}
# Calls at or above this many flops may be split over threads (dense_f32.c).
PAR_FLOPS = 4 * 1024 * 1024
SMALL_FLOPS = 3_000_000   # ordinary cases stay below the threading threshold
BIG_FLOPS = 24_000_000    # threaded cases stay below this
P_BIG = 0.06
# The first cases of every (kernel, ISA) run these shapes, so each algorithm
# path and edge is hit even in a short run (other parameters stay random).
PINNED = (
    (0, 17, 5), (6, 0, 9), (7, 13, 0), (0, 0, 0), (1, 1, 1), (1, 1, 2), (2, 3, 2),
    (3, 33, 17), (8, 300, 300), (5, 1025, 20),           # few rows
    (9, 7, 513), (64, 13, 100), (65, 6, 1025), (128, 5, 4356), (100, 3, 4357),  # nt_direct
    (129, 257, 300), (15, 33, 257), (29, 513, 64), (14, 32, 512),              # blocked
    (29, 40, 528), (17, 33, 529),       # one AVX-512 K block at most, and two
    # Threaded, just above 4 MFLOP: split N, few rows, split M, nt_direct.
    (130, 130, 130), (4, 700, 800), (260, 40, 210), (64, 260, 130),
)

# Scratch floats per thread (dense_f32_internal.h): nt_direct needs 64 * K of them.
SCRATCH_FLOATS = 528 * 512 + 16 * 528
# ISA -> rows of "nt" up to which nt_direct runs (8 per vector lane: dense_f32_internal.h)
DIRECT_M = {"avx2": 64, "avx512": 128}


def _log_uniform(rng, hi):
    return int(math.exp(rng.uniform(0.0, math.log(hi + 1))))


def _dim(rng, name):
    r = rng.random()
    if r < 0.04:
        return 0
    if r < 0.5:
        return int(rng.choice(EDGES[name]))
    return max(1, _log_uniform(rng, LOG_MAX[name]))


def _draw_shape(rng):
    """(m, n, k, big): an ordinary shape below SMALL_FLOPS, or (big, with
    probability P_BIG) one between PAR_FLOPS and BIG_FLOPS."""
    big = rng.random() < P_BIG
    while True:
        m = _dim(rng, "m")
        if big:
            n = max(1, _log_uniform(rng, 1500))
            k = max(1, _log_uniform(rng, 1500))
        else:
            n, k = _dim(rng, "n"), _dim(rng, "k")
        flops = 2 * m * n * k
        if (PAR_FLOPS <= flops <= BIG_FLOPS) if big else flops <= SMALL_FLOPS:
            return m, n, k, big


# --- cases --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    """Everything random about one call except the operand values."""

    symbol: str
    isa: str
    seed: int
    index: int
    m: int
    n: int
    k: int
    layout: str       # how W is stored: "nt" ([N, K]) or "nn" ([K, N])
    pads: tuple       # row stride minus row length, for A, W, C
    offsets: tuple    # start of A, W, bias, C, packed W past a 64-byte boundary (floats)
    bias: bool
    specials: bool    # NaN / Inf / zeros sprinkled into the inputs
    null_empty: bool  # NULL instead of a pointer for matrices without elements
    threads: int
    invalid: bool     # one argument made invalid
    extra: tuple = ()  # (name, value) pairs a family draws for itself (attention)

    def get(self, name):
        return dict(self.extra)[name]

    def describe(self):
        fields = dataclasses.asdict(self)
        return " ".join(f"{key}={value}" for key, value in fields.items())

    def replay_command(self):
        return (f"python -m tests.test_kernel_fuzz {self.symbol} {self.isa} {self.index}"
                f" --seed {self.seed}")


# The thread counts a case draws from: few (as machines have), primes (uneven splits),
# powers of two, and up to the pool's 64, above any core count here.
THREAD_CHOICES = (1, 2, 3, 4, 5, 7, 8, 13, 16, 17, 31, 64)


def case_rng(symbol, isa, seed, index):
    # crc32, not hash(): the same case in every process.
    return np.random.default_rng([seed, zlib.crc32(symbol.encode()),
                                  zlib.crc32(isa.encode()), index])


def draw_case(symbol, isa, seed, index, rng, fixed_layout):
    extra = ()
    if "attention" in symbol:
        m, n, k, big, extra = draw_attention(rng, index)
    elif "depthwise" in symbol:
        m, n, k, big, extra = draw_depthwise(rng, index)
    elif "max_pool" in symbol:
        m, n, k, big, extra = draw_pool(rng, index)
    elif "winograd" in symbol:
        m, n, k, big, extra = draw_winograd(rng, index)
    elif "conv2d" in symbol:
        m, n, k, big, extra = draw_conv(rng, index)
    elif index < len(PINNED):
        m, n, k = PINNED[index]
        big = 2 * m * n * k >= PAR_FLOPS
    else:
        m, n, k, big = _draw_shape(rng)
    if symbol.endswith("_layouts") and "max_pool" in symbol:
        m, n, k, big, extra = draw_blocked_pool(rng, extra, index)
    elif symbol.endswith("_layouts"):
        m, n, k, big, extra = draw_blocked(rng, "depthwise" in symbol, m, extra, index)

    def pad():
        r = rng.random()
        return 0 if r < 0.3 else int(rng.integers(1, 20)) if r < 0.9 else int(rng.integers(60, 80))

    return Case(
        symbol=symbol, isa=isa, seed=seed, index=index, m=m, n=n, k=k,
        layout=fixed_layout or str(rng.choice(["nt", "nn"])),
        pads=(pad(), pad(), pad()),
        offsets=tuple(int(x) for x in rng.integers(0, 16, size=5)),
        bias=bool(rng.random() < 0.6),
        specials=bool(rng.random() < 0.25),
        null_empty=bool(rng.random() < 0.5),
        # Results must not depend on the thread count: every case draws one.
        threads=int(rng.choice(THREAD_CHOICES)),
        invalid=bool(rng.random() < 0.06),
        extra=extra,
    )


# tirbyoc_attention_f32 (kernels/attention_f32.c), one batch item (batches, broadcasts and
# thread independence: tests/test_attention_kernel.py): register tiles of 14 / 6 / 4 query
# rows (AVX-512 / AVX2 / generic), units of 4 tiles, keys in chunks of up to 256 (fewer
# when D + DV is large: 32 at 4096), D + DV <= 4096, threads from 2 MFLOP. Case.m is M,
# Case.n the keys N, Case.k the head size D; DV, the mask and the flags are in Case.extra.
ATT_M_EDGES = (1, 2, 3, 4, 5, 6, 7, 13, 14, 15, 16, 17, 55, 56, 57, 100)
ATT_N_EDGES = (1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 255, 256, 257, 300, 513)
ATT_D_EDGES = (1, 2, 3, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 257)
ATT_PAR_FLOPS = 2 * 1024 * 1024
ATT_DDV_MAX = 4096
# (m, n, d, dv) of the first cases: empty sizes, tile / unit / chunk edges, large heads
ATT_PINNED = ((0, 17, 5, 3), (5, 0, 9, 4), (7, 13, 0, 6), (6, 9, 4, 0), (1, 1, 1, 1),
              (13, 257, 17, 31), (14, 256, 64, 64), (57, 100, 64, 64), (17, 600, 2, 257),
              (3, 40, 4001, 95), (2, 20, 1, 4095), (100, 300, 64, 64))
ATT_MASKS = ("none", "random", "causal", "padding", "empty_rows")


def _att_dim(rng, edges, hi):
    r = rng.random()
    if r < 0.03:
        return 0
    if r < 0.5:
        return int(rng.choice(edges))
    return max(1, _log_uniform(rng, hi))


def draw_attention(rng, index):
    """(m, n, d, big, extra) of a tirbyoc_attention_f32 case."""
    if index < len(ATT_PINNED):
        m, n, d, dv = ATT_PINNED[index]
        big = 2 * m * n * (d + dv) >= ATT_PAR_FLOPS
    else:
        big = rng.random() < P_BIG
        while True:
            m, n = _att_dim(rng, ATT_M_EDGES, 300), _att_dim(rng, ATT_N_EDGES, 600)
            d, dv = _att_dim(rng, ATT_D_EDGES, 300), _att_dim(rng, ATT_D_EDGES, 300)
            flops = 2 * m * n * (d + dv)
            if (ATT_PAR_FLOPS <= flops <= BIG_FLOPS) if big else flops <= SMALL_FLOPS:
                break
    extra = (
        ("dv", dv),
        ("mask", str(rng.choice(ATT_MASKS, p=[0.25, 0.25, 0.25, 0.15, 0.1]))),
        ("mask_pad", int(rng.choice([0, 0, 1, 3, 8]))),
        ("mask_row_bcast", bool(rng.random() < 0.15)),   # ldmask 0
        ("divide", bool(rng.random() < 0.3)),
        ("mask_keep", bool(rng.random() < 0.35)),
        ("empty_zero", bool(rng.random() < 0.5)),
        ("mask_add", bool(rng.random() < 0.3)),  # s + where(masked, -inf, 0)
        ("mask_lowest", bool(rng.random() < 0.3)),  # -FLT_MAX for -inf (finfo.min)
        ("nan_zero", bool(rng.random() < 0.25)),  # where(isnan(P), 0, P)
        # the scores are Q K * f / sqrt(d), f in {1, 0.25, -1, 2} (attention_scale): they
        # stay within about +-40, so no weight underflows in float32 (below e^-103) where
        # its float64 value does not, which would turn 0 * inf into NaN only in float32
        ("scale_factor", float(rng.choice([1.0, 0.25, -1.0, 2.0]))),
    )
    return m, n, d, big, extra


# tirbyoc_conv2d_f32 (kernels/conv_f32.c): an implicit product [OC, K] x [K, OH * OW]
# per image and group, K = C / groups * KH * KW (+ 1 for the bias step), row groups of
# 14 / 6 / 4 channels,
# pixel panels of 16, K blocks of up to 528 / 384 / 256, threads from 4 MFLOP, the 1x1 stride-1
# unpadded path ("plain"). Case.m is OC, Case.n the pixels OH * OW, Case.k K; the rest of
# the geometry and the chain are in Case.extra. tirbyoc_conv2d_f32_packed draws the same
# cases, with the weight and bias packed (tirbyoc_pack_conv2d_weight_f32: 16-channel
# panels per group, the bias as step K), and tirbyoc_pack_conv2d_weight_f32 packs them.
CONV_C_EDGES = (1, 2, 3, 16, 17, 28, 56, 57)
CONV_OC_EDGES = (1, 2, 13, 14, 15, 16, 28, 29, 33, 64)
CONV_HW_EDGES = (1, 2, 3, 7, 14, 15, 16, 17, 31, 33, 47, 70)
# (batch, c, h, w, oc, kh, kw, stride, pad, dilation) of the first cases
CONV_PINNED = ((1, 3, 8, 8, 5, 3, 3, 1, 1, 1), (0, 3, 8, 8, 5, 3, 3, 1, 1, 1),
               (2, 0, 5, 5, 4, 3, 3, 1, 1, 1), (1, 4, 6, 6, 0, 1, 1, 1, 0, 1),
               (1, 8, 9, 9, 16, 1, 1, 1, 0, 1), (1, 57, 6, 7, 15, 3, 3, 1, 1, 1),
               (2, 16, 20, 20, 29, 3, 3, 2, 1, 1), (1, 3, 30, 30, 14, 7, 7, 2, 3, 1),
               (1, 5, 4, 4, 3, 3, 3, 1, 3, 2), (1, 64, 14, 14, 64, 3, 3, 1, 1, 1),
               (1, 3, 24, 70, 8, 7, 7, 2, 3, 1),
               # 1x1 over 560 channels: two K blocks on AVX2 and AVX-512 (with both
               # layouts blocked, as the index gives it: y holds the partial sums)
               (1, 560, 5, 6, 32, 1, 1, 1, 0, 1))


def _conv_out_size(rng, pinned, h, w, kh, kw, sh, sw, pt, pl, dh, dw):
    """PyTorch's output size of a conv case (0 where the filter does not fit), or for a
    random (not ``pinned``) case now and then one a little off it: any size is valid."""
    oh = max(0, (h + 2 * pt - dh * (kh - 1) - 1) // sh + 1)
    ow = max(0, (w + 2 * pl - dw * (kw - 1) - 1) // sw + 1)
    if not pinned and rng.random() < 0.15:
        oh, ow = max(0, oh + int(rng.integers(-1, 3))), max(0, ow + int(rng.integers(-1, 3)))
    return oh, ow


def _conv_case_kept(rng, pinned, pixels, flops, par_flops, big):
    """Whether a drawn conv case is kept: a pinned one always; a few empty outputs, not a
    quarter of the cases; above ``par_flops`` (threaded) for a big case, else small."""
    if pinned:
        return True
    if pixels == 0 and rng.random() > 0.05:
        return False
    return (par_flops <= flops <= BIG_FLOPS) if big else flops <= SMALL_FLOPS


def _conv_extra(n_img, c, h, w, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow, groups):
    """Case.extra of a conv case: its geometry by name."""
    return (("batch", n_img), ("c", c), ("h", h), ("w", w), ("kh", kh), ("kw", kw),
            ("sh", sh), ("sw", sw), ("pt", pt), ("pl", pl), ("dh", dh), ("dw", dw),
            ("oh", oh), ("ow", ow), ("groups", groups))


def draw_conv(rng, index):
    """(m, n, k, big, extra) of a tirbyoc_conv2d_f32 case."""
    def dim(edges, hi):
        return int(rng.choice(edges)) if rng.random() < 0.5 else max(1, _log_uniform(rng, hi))

    big = index >= len(CONV_PINNED) and rng.random() < P_BIG
    while True:
        if index < len(CONV_PINNED):
            n_img, c, h, w, oc, kh, kw, st, pd, dl = CONV_PINNED[index]
            sh = sw = st
            pt = pl = pd
            dh = dw = dl
        else:
            n_img = int(rng.choice([1, 1, 1, 2, 3]))
            c, oc = dim(CONV_C_EDGES, 70), dim(CONV_OC_EDGES, 80)
            h, w = dim(CONV_HW_EDGES, 40), dim(CONV_HW_EDGES, 40)
            kh, kw = (int(x) for x in rng.choice([1, 1, 2, 3, 3, 3, 5, 7], size=2))
            sh, sw = (int(x) for x in rng.choice([1, 1, 1, 2, 3], size=2))
            dh, dw = (int(x) for x in rng.choice([1, 1, 1, 2], size=2))
            pt, pl = (int(x) for x in rng.choice([0, 0, 1, 1, 2, 3, -1], size=2))
            if rng.random() < 0.15:  # the plain path: 1x1, stride 1, no padding
                kh = kw = sh = sw = 1
                pt = pl = 0
        groups = 1
        if index >= len(CONV_PINNED) and rng.random() < 0.25:  # any divisor of C and OC
            common = math.gcd(c, oc)
            groups = int(rng.choice([d for d in range(1, common + 1) if common % d == 0]))
        pinned = index < len(CONV_PINNED)
        oh, ow = _conv_out_size(rng, pinned, h, w, kh, kw, sh, sw, pt, pl, dh, dw)
        flops = 2 * n_img * oc * oh * ow * (c // groups) * kh * kw
        if _conv_case_kept(rng, pinned, oh * ow, flops, PAR_FLOPS, big):
            break
    extra = _conv_extra(n_img, c, h, w, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow, groups)
    return oc, oh * ow, c // groups * kh * kw, flops >= PAR_FLOPS, extra


# tirbyoc_conv2d_winograd_f32 (kernels/conv_winograd_f32.c): a 3x3 conv of stride 1 and
# dilation 1 in one group as Winograd F(4x4, 3x3): tiles of 4 x 4 output pixels (rows of
# tiles transformed in chunks of 64), units of whole blocks of 14 / 6 / 4 tiles, output
# channels in blocks of up to 64, K blocks of 528 / 256, threads from 1 MFLOP. Same Case
# fields as tirbyoc_conv2d_f32; tirbyoc_pack_conv2d_winograd_weight_f32 packs its weight.
WG_C_EDGES = (1, 2, 3, 15, 16, 17, 64, 65, 130, 256)  # 256: a unit's buffer of its own
WG_OC_EDGES = (1, 2, 15, 16, 17, 33, 64, 65, 80)
WG_HW_EDGES = (1, 2, 3, 4, 5, 7, 8, 9, 14, 15, 16, 17, 30, 56)
WG_PAR_FLOPS = 1024 * 1024
# (batch, c, h, w, oc, pad) of the first cases: empty sizes, one tile, tile-row and block
# edges, several 64-tile chunks of a row, two blocks of output channels, large C, C past
# the thread's scratch
WG_PINNED = ((0, 3, 8, 8, 5, 1), (2, 4, 5, 5, 0, 1), (1, 1, 1, 1, 1, 1),
             (1, 16, 8, 8, 16, 1), (2, 17, 9, 13, 33, 1), (1, 64, 14, 14, 64, 1),
             (1, 3, 5, 300, 4, 1), (1, 20, 12, 12, 80, 0), (1, 130, 6, 9, 17, 2),
             (3, 8, 16, 16, 24, 1), (1, 256, 14, 14, 40, 1))


def draw_winograd(rng, index):
    """(m, n, k, big, extra) of a tirbyoc_conv2d_winograd_f32 case."""
    def dim(edges, hi):
        return int(rng.choice(edges)) if rng.random() < 0.5 else max(1, _log_uniform(rng, hi))

    pinned = index < len(WG_PINNED)
    big = not pinned and rng.random() < 3 * P_BIG
    while True:
        if pinned:
            n_img, c, h, w, oc, pd = WG_PINNED[index]
            pt = pl = pd
        else:
            n_img = int(rng.choice([1, 1, 1, 2, 3]))
            c, oc = dim(WG_C_EDGES, 100), dim(WG_OC_EDGES, 90)
            h, w = dim(WG_HW_EDGES, 40), dim(WG_HW_EDGES, 60)
            pt, pl = (int(x) for x in rng.choice([0, 1, 1, 1, 2, 3, -1], size=2))
        oh, ow = _conv_out_size(rng, pinned, h, w, 3, 3, 1, 1, pt, pl, 1, 1)
        flops = 2 * n_img * oc * oh * ow * c * 9
        if _conv_case_kept(rng, pinned, oh * ow, flops, WG_PAR_FLOPS, big):
            break
    extra = _conv_extra(n_img, c, h, w, 3, 3, 1, 1, pt, pl, 1, 1, oh, ow, 1)
    return oc, oh * ow, c * 9, flops >= WG_PAR_FLOPS, extra


# tirbyoc_depthwise_conv2d_f32 (kernels/depthwise_f32.c): one filter per channel, work
# units of (image, channel or block of 16 channels, block of output rows), threads from 1
# MFLOP; paths: phase planes (AVX-512 rows padded to 16 floats for 3x3 / 5x5 / 7x7 at
# stride 1 and 2), AVX-512's channels in lanes (blocks of 16, the last partial), and the
# scalar path where no window fits. Case.m is C, Case.n the pixels OH * OW, Case.k
# KH * KW; the geometry is in Case.extra, with groups = C, so that the conv's operands
# (ops.conv: weight [C, KH * KW]) and reference (conv_expected) serve as they are.
DW_C_EDGES = (1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 64)
DW_HW_EDGES = (1, 2, 3, 7, 8, 14, 15, 16, 17, 28, 31, 33, 47, 56, 70)
DW_PAR_FLOPS = 1024 * 1024
# (batch, c, h, w, kh, kw, stride, pad, dilation) of the first cases
DW_PINNED = ((0, 3, 8, 8, 3, 3, 1, 1, 1), (2, 0, 5, 5, 3, 3, 1, 1, 1),
             (1, 4, 6, 6, 0, 3, 1, 1, 1), (1, 3, 1, 1, 1, 1, 1, 0, 1),
             (1, 32, 28, 28, 3, 3, 1, 1, 1), (1, 64, 28, 28, 3, 3, 2, 1, 1),
             (1, 17, 7, 7, 3, 3, 1, 1, 1), (1, 5, 40, 40, 3, 3, 1, 1, 1),
             (1, 24, 50, 50, 3, 3, 1, 1, 1), (2, 9, 20, 21, 5, 5, 2, 2, 1),
             (1, 12, 30, 30, 7, 7, 1, 3, 1), (1, 17, 3, 3, 3, 3, 1, 150000, 150000),
             (1, 3, 90, 90, 3, 3, 1, 1, 1))


def _draw_per_channel(rng, index, pinned_table, choices, hw_hi, square, par, taps_cost):
    """(extra, work, big) of a case with one window per channel (depthwise conv, max
    pool): the pinned geometry ``index`` of ``pinned_table``, else one drawn with
    ``choices`` (kernel sizes, strides, dilations, paddings to pick from; with ``square``
    half the windows square), kept as conv cases are (``_conv_case_kept``: ``work`` =
    ``taps_cost`` * the taps of every output, threaded from ``par``)."""
    def dim(edges, hi):
        return int(rng.choice(edges)) if rng.random() < 0.5 else max(1, _log_uniform(rng, hi))

    ks, ss, ds, ps = choices
    pinned = index < len(pinned_table)
    big = not pinned and rng.random() < 3 * P_BIG
    while True:
        if pinned:
            n_img, c, h, w, kh, kw, st, pd, dl = pinned_table[index]
            sh = sw = st
            pt = pl = pd
            dh = dw = dl
        else:
            n_img = int(rng.choice([1, 1, 1, 2, 3]))
            c = dim(DW_C_EDGES, 100)
            h, w = dim(DW_HW_EDGES, hw_hi), dim(DW_HW_EDGES, hw_hi)
            kh, kw = (int(x) for x in rng.choice(ks, size=2))
            if square and rng.random() < 0.5:
                kw = kh
            sh, sw = (int(x) for x in rng.choice(ss, size=2))
            dh, dw = (int(x) for x in rng.choice(ds, size=2))
            pt, pl = (int(x) for x in rng.choice(ps, size=2))
        oh, ow = _conv_out_size(rng, pinned, h, w, kh, kw, sh, sw, pt, pl, dh, dw)
        work = taps_cost * n_img * c * oh * ow * kh * kw
        if _conv_case_kept(rng, pinned, oh * ow, work, par, big):
            break
    extra = _conv_extra(n_img, c, h, w, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow, max(c, 1))
    return extra, work, big


def draw_depthwise(rng, index):
    """(m, n, k, big, extra) of a tirbyoc_depthwise_conv2d_f32 case."""
    extra, flops, _ = _draw_per_channel(
        rng, index, DW_PINNED, ([1, 2, 3, 3, 3, 3, 5, 7], [1, 1, 1, 2, 2, 3], [1, 1, 1, 2],
                                [0, 0, 1, 1, 2, 3, -1]), 60, True, DW_PAR_FLOPS, 2)
    g = dict(extra)
    c, kh, kw = g["c"], g["kh"], g["kw"]
    # (K 0 without channels: the conv's reference then has no taps to reshape)
    return c, g["oh"] * g["ow"], kh * kw if c else 0, flops >= DW_PAR_FLOPS, extra


# tirbyoc_max_pool2d_f32 (kernels/pool_f32.c): a vertical then a horizontal pass per
# output row, columns with every tap inside on loops specialized for 3 and 2 taps at
# strides 1 and 2 (no dilation), the rest bounded; units of (plane, 8 output rows),
# threads from 256K taps. Case.m is C, Case.n the pixels OH * OW, Case.k KH * KW; the
# geometry in Case.extra (groups = C, so ops.conv's x and y serve).
POOL_PAR_TAPS = 256 * 1024
# (batch, c, h, w, kh, kw, stride, pad, dilation) of the first cases
POOL_PINNED = ((0, 3, 8, 8, 3, 3, 2, 1, 1), (2, 0, 5, 5, 3, 3, 1, 1, 1),
               (1, 3, 1, 1, 1, 1, 1, 0, 1), (1, 64, 112, 112, 3, 3, 2, 1, 1),
               (1, 5, 17, 19, 2, 2, 2, 0, 1), (1, 4, 9, 9, 3, 3, 1, 1, 2),
               (2, 7, 30, 31, 3, 3, 1, 1, 1), (1, 3, 5, 6, 4, 4, 1, 3, 1),
               # 3x3 stride 2 (AVX-512's whole-vector rows): odd widths, a row of
               # more than 16 outputs, no padding
               (2, 3, 9, 17, 3, 3, 2, 1, 1), (1, 2, 11, 40, 3, 3, 2, 0, 1))


def draw_pool(rng, index):
    """(m, n, k, big, extra) of a tirbyoc_max_pool2d_f32 case (windows of at least one
    tap, paddings of at least 0: what the kernel takes)."""
    extra, taps, _ = _draw_per_channel(
        rng, index, POOL_PINNED, ([1, 2, 2, 3, 3, 3, 3, 5], [1, 1, 2, 2, 2, 3],
                                  [1, 1, 1, 1, 2], [0, 0, 1, 1, 1, 2, 4]),
        120, False, POOL_PAR_TAPS, 1)
    g = dict(extra)
    c = g["c"]
    return c, g["oh"] * g["ow"], g["kh"] * g["kw"] if c else 0, taps >= POOL_PAR_TAPS, extra


# tirbyoc_conv2d_f32_packed_layouts and tirbyoc_depthwise_conv2d_f32_layouts: the conv
# and depthwise cases with their channels rounded up to multiples of 16 (NCHW16c blocks;
# the conv in one group) and a random set of TIRBYOC_LAYOUT_* bits (Case.extra
# "layouts"): x, y and the residual are the same buffers, read as [N, C / 16, H * W, 16]
# where blocked. On AVX2 and AVX-512 the direct and channels-in-lanes paths read them in
# place, elsewhere (and on a forced depthwise path) the calls convert through NCHW copies.
def draw_blocked(rng, depthwise, m, extra, index):
    """(m, n, k, big, extra) of a drawn conv (m: OC) or depthwise case made blockable;
    the pinned cases take the four layouts in turn (index % 4), the others one at
    random."""
    g = dict(extra)
    g["c"] = -(-g["c"] // 16) * 16
    taps = g["kh"] * g["kw"]
    if depthwise:
        g["groups"] = max(g["c"], 1)
        m, k = g["c"], taps if g["c"] else 0
        big = 2 * g["batch"] * m * g["oh"] * g["ow"] * taps >= DW_PAR_FLOPS
    else:
        g["groups"] = 1
        m, k = -(-m // 16) * 16, g["c"] * taps
        big = 2 * g["batch"] * m * g["oh"] * g["ow"] * k >= PAR_FLOPS
    layouts = int(rng.integers(0, 4))
    g["layouts"] = index % 4 if index < len(DW_PINNED if depthwise else CONV_PINNED) \
        else layouts
    return m, g["oh"] * g["ow"], k, big, tuple(g.items())


# tirbyoc_max_pool2d_f32_layouts: the pool cases with their channels rounded up to
# multiples of 16 and the layouts the call takes (Case.extra "layouts": NCHW, x blocked,
# or both; y blocked alone is refused, an invalid value).
def draw_blocked_pool(rng, extra, index):
    """(m, n, k, big, extra) of a drawn pool case made blockable; the pinned cases take
    the three layouts in turn, the others one at random."""
    g = dict(extra)
    g["c"] = -(-g["c"] // 16) * 16
    g["groups"] = max(g["c"], 1)
    taps = g["kh"] * g["kw"]
    big = g["batch"] * g["c"] * g["oh"] * g["ow"] * taps >= POOL_PAR_TAPS
    g["layouts"] = (0, 1, 3)[index % 3] if index < len(POOL_PINNED) else \
        int(rng.choice([0, 1, 3]))
    return g["c"], g["oh"] * g["ow"], taps if g["c"] else 0, big, tuple(g.items())


class _Logical:
    """An NCHW16c buffer's values as the NCHW [N * C, H * W] matrix the references read."""

    def __init__(self, buf, batch, channels):
        hw = buf.view.shape[1] if buf.view.ndim == 2 else 0
        self.view = from_blocked(buf.view, batch, channels, hw)


def from_blocked(a, batch, channels, hw):
    """[N * C, H * W] read as [N, C / 16, H * W, 16], back to NCHW order."""
    return kernels.from_nchw16c(np.asarray(a).reshape(batch, channels // 16, hw, 1, 16)
                                ).reshape(batch * channels, hw)


def to_blocked(a, batch, channels, hw):
    """The NCHW [N * C, H * W] values in NCHW16c order, as [N * C, H * W]."""
    return kernels.to_nchw16c(np.asarray(a).reshape(batch, channels, hw, 1)
                              ).reshape(batch * channels, hw)


def blocked_expected(base):
    """``base`` (a conv reference) for a case's TIRBYOC_LAYOUT_* bits: the blocked inputs
    read in NCHW order, the expected output (and its tolerance) put in NCHW16c order."""
    def expected(ops, groups):
        c, g = ops.case, dict(ops.case.extra)
        x, wt, bias, res, y, names = ops.conv
        bits, p = g["layouts"], g["oh"] * g["ow"]
        if bits & 1 and x.view.size:
            x = _Logical(x, g["batch"], g["c"])
        if bits & 2 and res is not None and res.view.size:
            res = _Logical(res, g["batch"], c.m)
        view = _ConvView(ops, (x, wt, bias, res, y, names))
        v, tol = base(view, groups)
        if bits & 2 and np.size(v):
            v = to_blocked(v, g["batch"], c.m, p)
            if np.ndim(tol) == 2:
                tol = to_blocked(tol, g["batch"], c.m, p)
        return v, tol
    return expected


def blocked_pool_expected(ops, groups):
    """pool_expected for a case's TIRBYOC_LAYOUT_* bits (as blocked_expected)."""
    c, g = ops.case, dict(ops.case.extra)
    x, *rest = ops.conv
    bits = g["layouts"]
    if bits & 1 and x.view.size:
        x = _Logical(x, g["batch"], g["c"])
    v, tol = pool_expected(_ConvView(ops, (x, *rest)), groups)
    if bits & 2 and np.size(v):
        v = to_blocked(v, g["batch"], c.m, g["oh"] * g["ow"])
    return v, tol


class _ConvView:
    """``ops`` with its conv tensors replaced (what blocked_expected's references read)."""

    def __init__(self, ops, conv):
        self._ops, self.conv = ops, conv

    def __getattr__(self, name):
        return getattr(self._ops, name)


def blocked_args(args):
    """The arguments of a ``_layouts`` call: the case's layout bits, then ``args``'s."""
    def make(ops):
        bits = dict(ops.case.extra)["layouts"]
        return [Arg("layouts", bits, invalid=(4, -1, 2**40))] + args(ops)
    return make


# --- buffers --------------------------------------------------------------------

GUARD = 32  # floats before and after every buffer (a multiple of 16: keeps 64-byte phase)
# Never produced by a kernel: a quiet NaN with a payload, compared bit for bit.
SENTINEL_BITS = np.uint32(0x7FC0BAD0)
# The initial value of output cells (not NaN, not Inf, not 0 or 6): a cell the
# kernel forgets to write differs from every possible reference value.
UNWRITTEN = np.float32(1.2345e30)
SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], dtype=np.float32)


class Buffer:
    """A rows x cols float32 matrix with row stride ld, starting ``offset``
    floats past a 64-byte boundary, inside an allocation with GUARD cells on
    both sides. Everything that is not the matrix (guards, stride padding)
    holds ``guard_bits``."""

    def __init__(self, rows, cols, ld, offset, guard_bits):
        self.rows, self.cols, self.ld = rows, cols, ld
        size = rows * ld
        self.start = GUARD + offset
        spare = np.empty(self.start + size + GUARD + 16, dtype=np.float32)
        align = (-spare.ctypes.data % 64) // 4
        self.raw = spare[align:align + self.start + size + GUARD]
        self.raw.view(np.uint32)[:] = guard_bits
        self.view = self.raw[self.start:self.start + size].reshape(rows, ld)[:, :cols]
        self.mask = np.zeros(self.raw.shape, dtype=bool)
        self.mask[self.start:self.start + size].reshape(rows, ld)[:, :cols] = True

    def ptr(self, ffi):
        return ffi.cast("float *", self.raw.ctypes.data + 4 * self.start)

    def bits(self):
        return self.raw.view(np.uint32).copy()


class MaskBuffer:
    """A rows x cols byte mask with row stride ld inside GUARD guard bytes on both sides
    (they and the padding hold 0xA5), for the attention kernel's mask argument."""

    def __init__(self, rows, cols, ld):
        self.start = GUARD
        self.raw = np.full(GUARD + rows * ld + GUARD, 0xA5, np.uint8)
        self.view = self.raw[GUARD:GUARD + rows * ld].reshape(rows, ld)[:, :cols]
        self.mask = np.zeros(self.raw.shape, bool)

    def ptr(self, ffi):
        return ffi.cast("uint8_t *", self.raw.ctypes.data + self.start)

    def bits(self):
        return self.raw.copy()


def _nan_bits():
    return np.array([np.nan], dtype=np.float32).view(np.uint32)[0]


class Operands:
    """The operands of one case, created on first use (each family takes what
    it needs) from the case's generator, and the list of all buffers made."""

    def __init__(self, case, rng, accumulate):
        self.case, self.rng, self.accumulate = case, rng, accumulate
        self.buffers = {}

    def _values(self, rows, cols):
        """Standard normal values; in a "specials" case, often 1-3 of them
        replaced by NaN, +-Inf or +-0."""
        values = self.rng.standard_normal((rows, cols), dtype=np.float32)
        if self.case.specials and values.size and self.rng.random() < 0.6:
            count = int(self.rng.integers(1, 4))
            rows_at = self.rng.integers(0, rows, size=count)
            cols_at = self.rng.integers(0, cols, size=count)
            values[rows_at, cols_at] = self.rng.choice(SPECIALS, size=count)
        return values

    def _input(self, name, rows, cols, ld, offset):
        buf = Buffer(rows, cols, ld, offset, _nan_bits())
        buf.view[:] = self._values(rows, cols)
        self.buffers[name] = buf
        return buf

    @functools.cached_property
    def a(self):
        c = self.case
        return self._input("a", c.m, c.k, c.k + c.pads[0], c.offsets[0])

    @functools.cached_property
    def w(self):
        c = self.case
        rows, cols = (c.n, c.k) if c.layout == "nt" else (c.k, c.n)
        return self._input("w", rows, cols, cols + c.pads[1], c.offsets[1])

    @functools.cached_property
    def w_kn(self):
        """op(W) as [K, N] float64: what multiplies A."""
        w = self.w.view.astype(np.float64)
        return w.T if self.case.layout == "nt" else w

    @functools.cached_property
    def bias(self):
        if not self.case.bias:
            return None
        return self._input("bias", 1, self.case.n, self.case.n, self.case.offsets[2])

    @functools.cached_property
    def c(self):
        """The output [M, N]: padding and guards hold the sentinel; the cells
        hold C0 (accumulating kernels) or UNWRITTEN."""
        c = self.case
        buf = Buffer(c.m, c.n, c.n + c.pads[2], c.offsets[3], SENTINEL_BITS)
        if self.accumulate:
            buf.view[:] = self._values(c.m, c.n)
        else:
            buf.view[:] = UNWRITTEN
        self.buffers["c"] = buf
        return buf

    @functools.cached_property
    def x(self):
        """A softmax input [M, N] (its rows the output's), with its own row padding."""
        c = self.case
        return self._input("x", c.m, c.n, c.n + c.pads[0], c.offsets[0])

    @functools.cached_property
    def residual(self):
        """A residual [M, N] input (matmul chains), with its own row padding."""
        c = self.case
        return self._input("residual", c.m, c.n, c.n + c.pads[0], c.offsets[4])

    @functools.cached_property
    def chain(self):
        """(operation names, scale) of a tirbyoc_matmul_f32 case: a bias where the case
        has one (first half the time), a residual a third of the time, and up to three
        other operations, in random order."""
        rng, ops = self.rng, []
        others = [str(x) for x in rng.choice(CHAIN_UNARY + ("scale", "divide"),
                                             size=int(rng.integers(0, 4)))]
        if self.case.bias:
            others.insert(0 if rng.random() < 0.5 else int(rng.integers(0, len(others) + 1)),
                          "bias")
        if rng.random() < 0.33:
            others.insert(int(rng.integers(0, len(others) + 1)), "residual")
        ops = others
        # at most one scale constant per chain: scale and divide share it
        return tuple(ops), float(rng.choice([0.125, 8.0, -2.5, 0.35355339]))

    @functools.cached_property
    def v(self):
        """V [N, DV] of an attention case, with its own row padding."""
        c = self.case
        dv = c.get("dv")
        return self._input("v", c.n, dv, dv + c.pads[1], c.offsets[2])

    @functools.cached_property
    def o(self):
        """The attention output [M, DV]: padding and guards hold the sentinel."""
        c = self.case
        dv = c.get("dv")
        buf = Buffer(c.m, dv, dv + c.pads[2], c.offsets[3], SENTINEL_BITS)
        buf.view[:] = UNWRITTEN
        self.buffers["o"] = buf
        return buf

    @functools.cached_property
    def mask(self):
        """(bool [M, N] as the kernel reads it: True = the score is masked, the bytes
        buffer or None, ldmask). Rows of N bytes (one row for every query row when
        ldmask is 0) with padding; nonzero bytes other than 1 count as true too."""
        c, rng = self.case, self.rng
        kind = c.get("mask")
        if kind == "none":
            return np.zeros((c.m, c.n), bool), None, 0
        rows = 1 if c.get("mask_row_bcast") else c.m
        i = np.arange(rows)[:, None] if rows > 1 else np.zeros((1, 1), int)
        j = np.arange(c.n)[None, :]
        if kind == "random":
            masked = rng.random((rows, c.n)) < 0.4
        elif kind == "causal":
            masked = j > i + int(rng.integers(-2, 3))
        elif kind == "padding":
            masked = np.broadcast_to(j >= c.n - int(rng.integers(0, c.n + 1)), (rows, c.n))
        else:  # empty_rows: some rows with every key masked
            masked = np.broadcast_to(rng.random((rows, 1)) < 0.5, (rows, c.n))
        keep = c.get("mask_keep")
        ldm = c.n + c.get("mask_pad")
        buf = MaskBuffer(rows, c.n, ldm)
        true = rng.choice(np.array([1, 1, 2, 255], np.uint8), size=(rows, c.n))
        buf.view[:] = np.where(masked != keep, true, 0)
        self.buffers["mask"] = buf
        full = np.broadcast_to(masked, (c.m, c.n)) if c.n else np.zeros((c.m, 0), bool)
        return full, buf, 0 if c.get("mask_row_bcast") else ldm

    @functools.cached_property
    def conv(self):
        """The tensors of a conv case, contiguous, as [rows, cols] buffers: x [N * C, H * W],
        weight [OC, K], bias [1, OC], residual and y [N * OC, OH * OW]; and the chain (a
        bias first where the case has one, a residual a third of the time, up to two
        unary operations)."""
        c, g = self.case, dict(self.case.extra)
        n_img, p = g["batch"], g["oh"] * g["ow"]
        x = self._input("x", n_img * g["c"], g["h"] * g["w"], g["h"] * g["w"], c.offsets[0])
        wt = self._input("w", c.m, c.k, c.k, c.offsets[1])
        # (a blocked output takes every unary operation: relu and relu6 in the stores'
        # registers, the others on the stored block)
        ops = [str(o) for o in self.rng.choice(CHAIN_UNARY,
                                               size=int(self.rng.integers(0, 3)))]
        if self.rng.random() < 0.33:
            ops.insert(int(self.rng.integers(0, len(ops) + 1)), "residual")
        if c.bias:
            ops.insert(0, "bias")
        bias = self._input("bias", 1, c.m, c.m, c.offsets[2]) if c.bias else None
        res = (self._input("residual", n_img * c.m, p, p, c.offsets[4])
               if "residual" in ops else None)
        y = Buffer(n_img * c.m, p, p, c.offsets[3], SENTINEL_BITS)
        y.view[:] = UNWRITTEN
        self.buffers["y"] = y
        return x, wt, bias, res, y, tuple(ops)

    @functools.cached_property
    def y(self):
        return self.conv[4]

    @functools.cached_property
    def conv_packed_size(self):
        """Floats of the conv case's packed weight, by the formula of tirbyoc_kernels.h:
        groups * ceil(OCg / 16) panels of 16 lanes by K (+ 1 with a bias) steps."""
        c, groups = self.case, self.case.get("groups")
        return groups * -(-(c.m // groups) // 16) * 16 * (c.k + c.bias)

    def _packed_buffer(self, size, reference=None):
        """A [1, size] packed weight: an input holding ``reference`` (a function of the
        conv case's weight [OC, K] and bias [1, OC] or None), NaN guards; or, without one,
        the output of a packing function (sentinel guards, UNWRITTEN cells)."""
        buf = Buffer(1, size, size, self.case.offsets[4],
                     SENTINEL_BITS if reference is None else _nan_bits())
        if reference is None:
            buf.view[:] = UNWRITTEN
            self.buffers["packed_out"] = buf
        else:
            _, wt, bias, _, _, _ = self.conv
            buf.view[:] = reference(wt.view, None if bias is None else bias.view)
            self.buffers["packed_w"] = buf
        return buf

    @functools.cached_property
    def conv_packed_w(self):
        """The conv case's weight and bias packed by numpy into the documented layout,
        as an input of tirbyoc_conv2d_f32_packed."""
        return self._packed_buffer(self.conv_packed_size, lambda wt, bias: conv_pack_reference(
            wt, bias, self.case.get("groups")))

    @functools.cached_property
    def conv_packed_out(self):
        """The output of tirbyoc_pack_conv2d_weight_f32 for the conv case's weight."""
        return self._packed_buffer(self.conv_packed_size)

    @functools.cached_property
    def wino_packed_size(self):
        """Floats of the Winograd packed weight (tirbyoc_kernels.h): 36 elements of
        ceil(OC / 16) panels of C steps x 16, then the bias, padded to 16."""
        c = self.case
        return (36 * c.get("c") + 1) * -(-c.m // 16) * 16

    @functools.cached_property
    def wino_packed_w(self):
        """The case's weight and bias transformed and packed by numpy, as an input of
        tirbyoc_conv2d_winograd_f32."""
        return self._packed_buffer(self.wino_packed_size,
                                   lambda wt, bias: winograd_pack_reference(
                                       wt, bias, self.case.get("c")))

    @functools.cached_property
    def wino_packed_out(self):
        """The output of tirbyoc_pack_conv2d_winograd_weight_f32."""
        return self._packed_buffer(self.wino_packed_size)

    @functools.cached_property
    def packed_size(self):
        n, k = self.case.n, self.case.k
        return -(-n // 16) * 16 * k

    @functools.cached_property
    def packed_w(self):
        """op(W) packed by numpy into the documented layout, as an input."""
        buf = Buffer(1, self.packed_size, self.packed_size, self.case.offsets[4], _nan_bits())
        buf.view[:] = pack_reference(self.w.view, self.case.layout)
        self.buffers["packed_w"] = buf
        return buf

    @functools.cached_property
    def packed_out(self):
        buf = Buffer(1, self.packed_size, self.packed_size, self.case.offsets[4], SENTINEL_BITS)
        buf.view[:] = UNWRITTEN
        self.buffers["packed_out"] = buf
        return buf


def pack_reference(w, layout):
    """The packed layout of tirbyoc_kernels.h: panel q holds columns 16q..16q+15
    of op(W) as K rows of 16, zero padded."""
    w_kn = w.T if layout == "nt" else w
    k, n = w_kn.shape
    panels = -(-n // 16)
    padded = np.zeros((k, panels * 16), dtype=np.float32)
    padded[:, :n] = w_kn
    return padded.reshape(k, panels, 16).transpose(1, 0, 2).reshape(1, -1)


def conv_pack_reference(wt, bias, groups):
    """The packed conv weight of tirbyoc_kernels.h from weight [OC, K] and bias [1, OC] (or
    None): packed[((g * Q + q) * KT + p) * 16 + r] = weight[o][p] (p < K), bias[o] (p = K),
    o = g * OCg + 16q + r, 0 where 16q + r >= OCg; as [1, size] float32."""
    oc, k = wt.shape
    ocg = oc // groups
    q, kt = -(-ocg // 16), k + (bias is not None)
    padded = np.zeros((groups, q * 16, kt), dtype=np.float32)
    padded[:, :ocg, :k] = wt.reshape(groups, ocg, k)
    if bias is not None:
        padded[:, :ocg, k] = bias.reshape(groups, ocg)
    return padded.reshape(groups, q, 16, kt).transpose(0, 1, 3, 2).reshape(1, -1)


# Winograd F(4x4, 3x3) with the points 0, 1, -1, 2, -1/2 (kernels/conv_winograd.h)
WG_G = np.array([[1.0, 0.0, 0.0], [-1.0 / 3, -1.0 / 3, -1.0 / 3], [1.0 / 3, -1.0 / 3, 1.0 / 3],
                 [1.0 / 15, 2.0 / 15, 4.0 / 15], [-16.0 / 15, 8.0 / 15, -4.0 / 15],
                 [0.0, 0.0, 1.0]])
WG_BT = np.array([[1, 1.5, -2, -1.5, 1, 0], [0, -1, -2.5, -0.5, 1, 0], [0, 1, 0.5, -2.5, 1, 0],
                  [0, -0.5, -1, 0.5, 1, 0], [0, 2, -1, -2, 1, 0], [0, 1, 1.5, -2, -1.5, 1]])
WG_AT = np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -0.5, 0], [0, 1, 1, 4, 0.25, 0],
                  [0, 1, -1, 8, -0.125, 1]])


def winograd_pack_reference(wt, bias, c):
    """The Winograd packed weight of tirbyoc_kernels.h from weight [OC, C * 9] and bias
    [1, OC] (or None): U[e] = G g G^T in float64 over the nonzero terms, in the kernel's
    order (so bit for bit), rounded once; as [1, size] float32."""
    oc = wt.shape[0]
    ocp = -(-oc // 16) * 16
    g = wt.astype(np.float64).reshape(oc, c, 3, 3)
    u = np.zeros((36, ocp, c), np.float32)
    for e in range(36):
        a, b = divmod(e, 6)
        acc = np.zeros((oc, c))
        with np.errstate(invalid="ignore", over="ignore"):
            for r in range(3):
                for t in range(3):
                    if WG_G[a, r] != 0 and WG_G[b, t] != 0:
                        acc = acc + WG_G[a, r] * g[:, :, r, t] * WG_G[b, t]
        u[e, :oc] = acc
    tail = np.zeros(ocp, np.float32)
    if bias is not None:
        tail[:oc] = bias.reshape(-1)
    panels = u.reshape(36, ocp // 16, 16, c).transpose(0, 1, 3, 2).reshape(-1)
    return np.concatenate([panels, tail]).reshape(1, -1)


def _sparse_rows(mat, x, axis):
    """mat applied along ``axis`` of x, each row over its nonzero coefficients only (the
    kernel's transforms: a zero coefficient never multiplies an infinite value)."""
    x = np.moveaxis(x, axis, -1)
    out = []
    with np.errstate(invalid="ignore", over="ignore"):
        for row in mat:
            acc = np.zeros(x.shape[:-1])
            for k, coef in enumerate(row):
                if coef != 0:
                    acc = acc + coef * x[..., k]
            out.append(acc)
    return np.moveaxis(np.stack(out, -1), -1, axis)


def winograd_windows(xs, pt, pl, oh, ow):
    """Every tile's 6 x 6 input window of images xs [N, C, H, W] (float64, 0 outside the
    image): [N, C, ceil(OH / 4), ceil(OW / 4), 6, 6]."""
    n_img, ch, h, w = xs.shape
    th, tw = -(-oh // 4), -(-ow // 4)
    win = np.zeros((n_img, ch, th, tw, 6, 6))
    for i in range(6):
        rows = np.arange(th) * 4 + i - pt
        for j in range(6):
            cols = np.arange(tw) * 4 + j - pl
            ok = ((rows >= 0) & (rows < h))[:, None] & ((cols >= 0) & (cols < w))[None, :]
            if h and w:
                got = xs[:, :, np.clip(rows, 0, h - 1)][:, :, :, np.clip(cols, 0, w - 1)]
                win[..., i, j] = np.where(ok, got, 0.0)
    return win


def winograd_tile_scale(win, wt, oh, ow):
    """The scale of the Winograd rounding error per output, [N, OC, OH, OW]:
    sqrt(sum over c of |g_oc|^2 |d_c|^2) over the output's tile (windows ``win`` from
    winograd_windows, weight ``wt`` [OC, C * 9]). Unlike a direct sum's, the error comes
    from the whole 6 x 6 window (an output outside the image is not exactly 0)."""
    oc, ch = wt.shape[0], win.shape[1]
    wn = (_finite(wt.astype(np.float64)) ** 2).reshape(oc, ch, 9).sum(axis=2)
    dn = (_finite(win) ** 2).sum(axis=(4, 5))  # [N, C, TH, TW]
    scale = np.sqrt(np.einsum("oc,nctu->notu", wn, dn))
    return np.repeat(np.repeat(scale, 4, axis=2), 4, axis=3)[:, :, :oh, :ow]


def winograd_simulation(ops):
    """The Winograd algorithm in float64, before the chain, and the scale of its rounding
    error per output (winograd_tile_scale), both [N * OC, OH * OW]. The value is used
    where it is not finite (an infinite or NaN input reaches every output of its 4 x 4
    tile that the transforms touch, which a direct sum does not)."""
    c, g = ops.case, dict(ops.case.extra)
    x, wt, _, _, _, _ = ops.conv
    n_img, ch, h, w, oh, ow = (g[k] for k in ("batch", "c", "h", "w", "oh", "ow"))
    th, tw = -(-oh // 4), -(-ow // 4)
    win = winograd_windows(x.view.astype(np.float64).reshape(n_img, ch, h, w), g["pt"],
                           g["pl"], oh, ow)
    v = _sparse_rows(WG_BT, _sparse_rows(WG_BT, win, -2), -1)  # [N, C, TH, TW, 6, 6]
    u = winograd_pack_reference(wt.view, None, ch)[0, :36 * (-(-c.m // 16) * 16) * ch]
    u = u.reshape(36, -1, ch, 16).transpose(0, 1, 3, 2).reshape(36, -1, ch)[:, :c.m]
    m = np.zeros((n_img, c.m, th, tw, 6, 6))
    for e in range(36):
        a, b = divmod(e, 6)
        ve = v[..., a, b].transpose(1, 0, 2, 3).reshape(ch, -1)
        m[..., a, b] = ieee_matmul(u[e].astype(np.float64), ve).reshape(
            c.m, n_img, th, tw).transpose(1, 0, 2, 3)
    y = _sparse_rows(WG_AT, _sparse_rows(WG_AT, m, -2), -1)  # [N, OC, TH, TW, 4, 4]
    y = y.transpose(0, 1, 2, 4, 3, 5).reshape(n_img, c.m, th * 4, tw * 4)[:, :, :oh, :ow]
    scale = winograd_tile_scale(win, wt.view, oh, ow)
    return y.reshape(n_img * c.m, oh * ow), scale.reshape(n_img * c.m, oh * ow)


# --- arguments ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Arg:
    """One C argument; ``kind`` says how to make it invalid: "size" (negative),
    "stride" (below ``minimum``), "matrix" (NULL, if ``required``: the matrix
    has elements), "value" (cannot be made invalid, e.g. an optional bias).
    ``invalid``: further values the kernel must refuse (an unknown layout or flag,
    a head size past the limit), of any kind."""

    name: str
    value: object
    kind: str = "value"
    minimum: int = 0
    required: bool = False
    invalid: tuple = ()


def _size(name, value):
    return Arg(name, value, "size")


def _stride(name, buf, minimum):
    return Arg(name, buf.ld, "stride", minimum=minimum)


def _matrix(ops, name, buf, has_elements):
    ffi = LIBRARY.ffi
    null = ops.case.null_empty and not has_elements
    return Arg(name, ffi.NULL if null else buf.ptr(ffi), "matrix", required=has_elements)


def _optional(ops, name, buf):
    return Arg(name, LIBRARY.ffi.NULL if buf is None else buf.ptr(LIBRARY.ffi))


def _dense_args(ops, bias):
    c = ops.case
    w_min = c.k if c.layout == "nt" else c.n
    return [_size("m", c.m), _size("n", c.n), _size("k", c.k),
            _matrix(ops, "a", ops.a, c.m * c.k > 0), _stride("lda", ops.a, c.k),
            _matrix(ops, "w", ops.w, c.n * c.k > 0), _stride("ldw", ops.w, w_min),
            *([_optional(ops, "bias", ops.bias)] if bias else []),
            _matrix(ops, "c", ops.c, c.m * c.n > 0), _stride("ldc", ops.c, c.n)]


def dense_args(ops):
    return _dense_args(ops, bias=True)


def packed_args(ops):
    c = ops.case
    return [_size("m", c.m), _size("n", c.n), _size("k", c.k),
            _matrix(ops, "a", ops.a, c.m * c.k > 0), _stride("lda", ops.a, c.k),
            _matrix(ops, "packed", ops.packed_w, c.n * c.k > 0),
            _optional(ops, "bias", ops.bias),
            _matrix(ops, "c", ops.c, c.m * c.n > 0), _stride("ldc", ops.c, c.n)]


def acc_args(ops):
    return _dense_args(ops, bias=False)


def pack_args(ops):
    c = ops.case
    w_min = c.k if c.layout == "nt" else c.n
    return [_size("n", c.n), _size("k", c.k),
            _matrix(ops, "w", ops.w, c.n * c.k > 0), _stride("ldw", ops.w, w_min),
            _matrix(ops, "packed", ops.packed_out, c.n * c.k > 0)]


def matmul_args(ops):
    """tirbyoc_matmul_f32 with one batch (batches: tests/test_matmul_kernels.py)."""
    c = ops.case
    names, scale = ops.chain
    w_min = c.k if c.layout == "nt" else c.n
    uses_res = "residual" in names
    bias = (_matrix(ops, "bias", ops.bias, c.n > 0) if "bias" in names
            else Arg("bias", LIBRARY.ffi.NULL))
    res = ([_matrix(ops, "residual", ops.residual, c.m * c.n > 0),
            _stride("ldr", ops.residual, c.n)] if uses_res
           else [Arg("residual", LIBRARY.ffi.NULL), Arg("ldr", 0)])
    return [Arg("batch", 1), _size("m", c.m), _size("n", c.n), _size("k", c.k),
            _matrix(ops, "a", ops.a, c.m * c.k > 0), _stride("lda", ops.a, c.k), Arg("sa", 0),
            _matrix(ops, "w", ops.w, c.n * c.k > 0), _stride("ldw", ops.w, w_min), Arg("sw", 0),
            Arg("b_layout", kernels.B_LAYOUTS[c.layout]),
            _matrix(ops, "c", ops.c, c.m * c.n > 0), _stride("ldc", ops.c, c.n), Arg("sc", 0),
            Arg("epilogue", kernels.encode_epilogue(names)), Arg("scale", scale), bias,
            *res, Arg("sr", 0)]


def softmax_args(ops):
    """tirbyoc_softmax_f32 over the case's M rows of N (K is not used)."""
    c = ops.case
    return [_size("rows", c.m), _size("n", c.n),
            _matrix(ops, "x", ops.x, c.m * c.n > 0), _stride("ldx", ops.x, c.n),
            _matrix(ops, "c", ops.c, c.m * c.n > 0), _stride("ldy", ops.c, c.n)]


def attention_args(ops):
    """tirbyoc_attention_f32 with one batch item: Q = A [M, D], K = W ([N, D] for "nt",
    the usual Q @ K^T; [D, N] for "nn"), V [N, DV], O [M, DV]."""
    c = ops.case
    dv = c.get("dv")
    _, mbuf, ldm = ops.mask
    k_min = c.k if c.layout == "nt" else c.n
    flags = ((kernels.ATTENTION_FLAGS["divide"] if c.get("divide") else 0)
             | (kernels.ATTENTION_FLAGS["mask_keep"] if c.get("mask_keep") else 0)
             | (kernels.ATTENTION_FLAGS["empty_zero"] if c.get("empty_zero") else 0)
             | (kernels.ATTENTION_FLAGS["mask_add"] if c.get("mask_add") else 0)
             | (kernels.ATTENTION_FLAGS["mask_lowest"] if c.get("mask_lowest") else 0)
             | (kernels.ATTENTION_FLAGS["nan_zero"] if c.get("nan_zero") else 0))
    mask = (Arg("mask", LIBRARY.ffi.NULL) if mbuf is None
            else Arg("mask", mbuf.ptr(LIBRARY.ffi)))
    # ldmask: 0 broadcasts the mask over the rows, so only a value in 1 .. N-1 (with a mask)
    # or a negative one is refused
    bad_ldm = (-1, -(2**63)) + ((max(c.n - 1, 1),) if mbuf is not None and c.n > 1 else ())
    return [Arg("batch", 1, invalid=(-1, -(2**63))), _size("m", c.m), _size("n", c.n),
            # D + DV past ATT_DDV_MAX is refused
            Arg("d", c.k, "size", invalid=(ATT_DDV_MAX + 1 - dv, ATT_DDV_MAX + 1)),
            Arg("dv", dv, "size", invalid=(ATT_DDV_MAX + 1 - c.k,)),
            # a call with no output (M or DV 0) reads nothing
            _matrix(ops, "q", ops.a, c.m * c.k * dv > 0), _stride("ldq", ops.a, c.k),
            Arg("sq", 0, invalid=(-1,)),
            _matrix(ops, "k", ops.w, c.n * c.k * c.m * dv > 0), _stride("ldk", ops.w, k_min),
            Arg("sk", 0, invalid=(-1,)),
            Arg("k_layout", kernels.B_LAYOUTS[c.layout],
                invalid=(kernels.B_LAYOUTS["packed"], 3, -1, 2**31 - 1)),
            _matrix(ops, "v", ops.v, c.n * dv * c.m > 0), _stride("ldv", ops.v, dv),
            Arg("sv", 0, invalid=(-1,)), mask, Arg("ldmask", ldm, invalid=bad_ldm),
            Arg("smask", 0, invalid=(-1,)),
            Arg("mask_repeat", 1, invalid=(0, -1, -(2**63))),
            Arg("flags", flags, invalid=(flags | 64, flags | 2**30, -1)),
            Arg("scale", attention_scale(c)),
            _matrix(ops, "o", ops.o, c.m * dv > 0), _stride("ldo", ops.o, dv),
            Arg("so", 0, invalid=(-1,))]


def conv_args(ops):
    """tirbyoc_conv2d_f32: every tensor contiguous (its strides are its shape)."""
    c, g = ops.case, dict(ops.case.extra)
    x, wt, bias, res, y, names = ops.conv
    out = g["batch"] * c.m * g["oh"] * g["ow"] > 0  # nothing is read without an output
    epi = kernels.encode_epilogue(names)
    late_bias = kernels.encode_epilogue(("relu", "bias"))
    null = LIBRARY.ffi.NULL
    return [_size("batch", g["batch"]), _size("c", g["c"]), _size("h", g["h"]),
            _size("w", g["w"]),
            _matrix(ops, "x", x, out and g["c"] * g["h"] * g["w"] > 0),
            _size("oc", c.m), Arg("groups", g["groups"], invalid=(0, -1)),
            _size("kh", g["kh"]), _size("kw", g["kw"]),
            _matrix(ops, "weight", wt, out and c.k > 0),
            Arg("sh", g["sh"], invalid=(0, -1)), Arg("sw", g["sw"], invalid=(0, -3)),
            Arg("pt", g["pt"], invalid=(2**31, -(2**31))), Arg("pl", g["pl"], invalid=(2**40,)),
            Arg("dh", g["dh"], invalid=(0,)), Arg("dw", g["dw"], invalid=(-1,)),
            _size("oh", g["oh"]), _size("ow", g["ow"]),
            # SCALE, BIAS after another operation, an unknown code
            Arg("epilogue", epi, invalid=(9, late_bias, UNKNOWN_OP, 15 << 4)),
            _matrix(ops, "bias", bias, out) if bias is not None else Arg("bias", null),
            _matrix(ops, "residual", res, out) if res is not None else Arg("residual", null),
            _matrix(ops, "y", y, out)]


def depthwise_args(ops):
    """tirbyoc_depthwise_conv2d_f32: the conv's tensors (weight [C, KH * KW]), every one
    contiguous; nothing is read without an output."""
    c, g = ops.case, dict(ops.case.extra)
    x, wt, bias, res, y, names = ops.conv
    out = g["batch"] * c.m * g["oh"] * g["ow"] > 0
    null = LIBRARY.ffi.NULL
    return [_size("batch", g["batch"]), _size("c", c.m), _size("h", g["h"]),
            _size("w", g["w"]), _matrix(ops, "x", x, out and g["h"] * g["w"] > 0),
            _size("kh", g["kh"]), _size("kw", g["kw"]),
            _matrix(ops, "weight", wt, out and c.k > 0),
            Arg("sh", g["sh"], invalid=(0, -1)), Arg("sw", g["sw"], invalid=(0, -3, 2**31)),
            Arg("pt", g["pt"], invalid=(2**31, -(2**31))), Arg("pl", g["pl"], invalid=(2**40,)),
            Arg("dh", g["dh"], invalid=(0, 2**31)), Arg("dw", g["dw"], invalid=(-1,)),
            _size("oh", g["oh"]), _size("ow", g["ow"]),
            # SCALE, DIVIDE, BIAS after another operation, an unknown code
            Arg("epilogue", kernels.encode_epilogue(names),
                invalid=(9, 10, kernels.encode_epilogue(("relu", "bias")), UNKNOWN_OP,
                         15 << 4)),
            _matrix(ops, "bias", bias, out) if bias is not None else Arg("bias", null),
            _matrix(ops, "residual", res, out) if res is not None else Arg("residual", null),
            _matrix(ops, "y", y, out)]


def pool_args(ops):
    """tirbyoc_max_pool2d_f32: the conv case's x [N * C, H * W] and y [N * C, OH * OW],
    contiguous; nothing is read without an output."""
    c, g = ops.case, dict(ops.case.extra)
    x, _, _, _, y, _ = ops.conv
    out = g["batch"] * c.m * g["oh"] * g["ow"] > 0
    return [_size("batch", g["batch"]), _size("c", c.m), _size("h", g["h"]),
            _size("w", g["w"]), _matrix(ops, "x", x, out and g["h"] * g["w"] > 0),
            Arg("kh", g["kh"], invalid=(0, -1, 2**31)), Arg("kw", g["kw"], invalid=(0,)),
            Arg("sh", g["sh"], invalid=(0, -1)), Arg("sw", g["sw"], invalid=(0, 2**31)),
            Arg("pt", g["pt"], invalid=(-1, 2**31)), Arg("pl", g["pl"], invalid=(-3,)),
            Arg("dh", g["dh"], invalid=(0,)), Arg("dw", g["dw"], invalid=(-1,)),
            _size("oh", g["oh"]), _size("ow", g["ow"]), _matrix(ops, "y", y, out)]


def conv_packed_args(ops):
    """tirbyoc_conv2d_f32_packed: conv_args with the weight and bias packed into one buffer
    (read when there is an output and K or the bias step; no bias argument)."""
    c, g = ops.case, dict(ops.case.extra)
    out = g["batch"] * c.m * g["oh"] * g["ow"] > 0
    packed = _matrix(ops, "packed", ops.conv_packed_w, out and c.k + c.bias > 0)
    return [packed if arg.name == "weight" else arg for arg in conv_args(ops)
            if arg.name != "bias"]


def conv_pack_args(ops):
    """tirbyoc_pack_conv2d_weight_f32 on the conv case's weight [OC, K] and bias (NULL
    without one); groups must be at least 1 and divide OC."""
    c = ops.case
    _, wt, bias, _, _, _ = ops.conv
    groups = c.get("groups")
    return [_size("oc", c.m),
            Arg("groups", groups, invalid=(0, -1) + ((c.m + 1,) if c.m > 0 else ())),
            _size("k", c.k), _matrix(ops, "weight", wt, c.m * c.k > 0),
            _optional(ops, "bias", bias),
            _matrix(ops, "packed", ops.conv_packed_out, ops.conv_packed_size > 0)]


def winograd_args(ops):
    """tirbyoc_conv2d_winograd_f32: the conv's x, y and residual, the weight and bias
    transformed and packed into one buffer (read when there is an output)."""
    c, g = ops.case, dict(ops.case.extra)
    _, _, _, res, y, names = ops.conv
    x = ops.conv[0]
    out = g["batch"] * c.m * g["oh"] * g["ow"] > 0
    null = LIBRARY.ffi.NULL
    return [_size("batch", g["batch"]), _size("c", g["c"]), _size("h", g["h"]),
            _size("w", g["w"]),
            _matrix(ops, "x", x, out and g["c"] * g["h"] * g["w"] > 0),
            _size("oc", c.m), _matrix(ops, "packed", ops.wino_packed_w, out),
            Arg("pt", g["pt"], invalid=(2**31, -(2**31))), Arg("pl", g["pl"], invalid=(2**40,)),
            _size("oh", g["oh"]), _size("ow", g["ow"]),
            # SCALE, BIAS after another operation, an unknown code
            Arg("epilogue", kernels.encode_epilogue(names),
                invalid=(9, kernels.encode_epilogue(("relu", "bias")), UNKNOWN_OP, 15 << 4)),
            _matrix(ops, "residual", res, out) if res is not None else Arg("residual", null),
            _matrix(ops, "y", y, out)]


def winograd_cached_args(ops):
    """tirbyoc_conv2d_winograd_cached_f32: a key of the case's own, then the arguments
    of tirbyoc_conv2d_winograd_f32 with the weight [OC, C * 9] and the bias (NULL
    without one) in place of the packed weight: the first call transforms them."""
    c = ops.case
    _, wt, bias, _, _, _ = ops.conv
    plain = winograd_args(ops)
    out = plain[-1].required
    key = zlib.crc32(repr((c.seed, c.isa, c.index)).encode())
    return [Arg("key0", key), Arg("key1", -c.index), *plain[:6],
            _matrix(ops, "weight", wt, out and c.m * c.get("c") > 0),
            _optional(ops, "bias", bias), *plain[7:]]


def winograd_pack_args(ops):
    """tirbyoc_pack_conv2d_winograd_weight_f32 on the case's weight [OC, C * 9] and bias
    (NULL without one)."""
    c = ops.case
    _, wt, bias, _, _, _ = ops.conv
    return [_size("oc", c.m), _size("c", c.get("c")),
            _matrix(ops, "weight", wt, c.m * c.k > 0), _optional(ops, "bias", bias),
            _matrix(ops, "packed", ops.wino_packed_out, ops.wino_packed_size > 0)]


def attention_scale(case):
    """The scale argument: scores are scale_factor / sqrt(d) times Q K either way (a
    divisor of sqrt(d) / scale_factor with the divide flag)."""
    root = math.sqrt(max(case.k, 1))
    f = case.get("scale_factor")
    return root / f if case.get("divide") else f / root


def make_invalid(args, rng):
    """One argument replaced by an invalid value: (new args, description)."""
    choices = [i for i, arg in enumerate(args)
               if arg.kind in ("size", "stride") or (arg.kind == "matrix" and arg.required)
               or arg.invalid]
    i = int(rng.choice(choices))
    arg = args[i]
    if arg.invalid and (arg.kind == "value" or rng.random() < 0.5):
        value = arg.invalid[int(rng.integers(0, len(arg.invalid)))]
    elif arg.kind == "size":
        value = int(rng.choice([-1, -2, -17, -(2**63)]))
    elif arg.kind == "stride":
        value = arg.minimum - 1 - int(rng.integers(0, 3))
    else:
        value = LIBRARY.ffi.NULL
    return args[:i] + [dataclasses.replace(arg, value=value)] + args[i + 1:], f"{arg.name}={value}"


# --- references ------------------------------------------------------------------

EPILOGUES = {
    None: lambda x: x,
    "relu": lambda x: np.maximum(x, 0.0),          # np.maximum propagates NaN
    "relu6": lambda x: np.clip(x, 0.0, 6.0),       # so does np.clip
}


def ieee_matmul(a, b):
    """a @ b in float64 with IEEE semantics for NaN and Inf (0 * Inf is NaN),
    which BLAS does not promise: rows of a and columns of b holding a
    non-finite value are recomputed term by term."""
    fa, fb = np.isfinite(a), np.isfinite(b)
    out = np.where(fa, a, 0.0) @ np.where(fb, b, 0.0)
    for i in np.flatnonzero(~fa.all(axis=1)):
        out[i, :] = (a[i, :, None] * b).sum(axis=0)
    for j in np.flatnonzero(~fb.all(axis=0)):
        out[:, j] = (a * b[None, :, j]).sum(axis=1)
    return out


def _finite(x):
    return np.where(np.isfinite(x), x, 0.0)


def _dense_expected(ops, epi):
    """(expected, per-element tolerance or None where it must match exactly)."""
    c = ops.case
    a = ops.a.view.astype(np.float64)
    w = ops.w_kn
    with np.errstate(invalid="ignore", over="ignore"):
        pre = ieee_matmul(a, w)
        # Only a tolerance scale: float32 (half the time of float64) is plenty.
        terms = (_finite(a) ** 2).astype(np.float32) @ (_finite(w) ** 2).astype(np.float32)
        terms = terms.astype(np.float64)
        if ops.case.bias and not ops.accumulate:
            bias = ops.bias.view.astype(np.float64)
            pre = pre + bias
            terms = terms + _finite(bias) ** 2
        if ops.accumulate:
            c0 = ops.c.view.astype(np.float64)  # still C0: called before the kernel
            pre = pre + c0
            terms = terms + _finite(c0) ** 2
        expected = EPILOGUES[epi](pre)
    finite = np.isfinite(expected)
    max_ref = np.abs(expected[finite]).max() if finite.any() else 0.0
    scale = np.maximum(max_ref, np.sqrt(terms)) * 1e-5 * max(1.0, math.sqrt(c.k) / 8)
    # An output whose terms were not all finite must match exactly (0 or 6
    # after an activation, or the NaN / Inf itself).
    return expected, np.where(np.isfinite(pre), scale, 0.0)


def _erfc(x):
    return np.vectorize(math.erfc, otypes=[float])(x)


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


# The unary epilogue operations in float64 (stable forms: no cancellation in the tails).
CHAIN_REFERENCE = {
    "relu": EPILOGUES["relu"],
    "relu6": EPILOGUES["relu6"],
    "gelu_erf": lambda x: 0.5 * x * _erfc(-x / math.sqrt(2.0)),
    "gelu_tanh": lambda x: x * _sigmoid(2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)),
    "silu": lambda x: x * _sigmoid(x),
    "sigmoid": _sigmoid,
    "tanh": np.tanh,
    "hardswish": lambda x: x * np.clip(x + 3.0, 0.0, 6.0) / 6.0,
    "hardsigmoid": lambda x: np.clip(x + 3.0, 0.0, 6.0) / 6.0,
}
CHAIN_UNARY = tuple(CHAIN_REFERENCE)


def chain_growth(op) -> float:
    """How much a unary operation may grow an input's error bound: above its largest
    |derivative| (1.13 for the GELUs, 1.5 for hardswish at 3, at most 1 for the rest)."""
    return 1.6 if op == "hardswish" else 1.2


def matmul_expected(ops, groups):
    c = ops.case
    names, scale = ops.chain
    a = ops.a.view.astype(np.float64)
    w = ops.w_kn
    with np.errstate(invalid="ignore", over="ignore"):
        v = ieee_matmul(a, w)
        terms = ((_finite(a) ** 2).astype(np.float32) @ (_finite(w) ** 2).astype(np.float32))
        err = np.sqrt(terms.astype(np.float64)) * 1e-5 * max(1.0, math.sqrt(c.k) / 8)
        finite_in, seen = np.isfinite(v), np.zeros(v.shape)
        for name in names:
            if name == "bias":
                v = v + ops.bias.view.astype(np.float64)
            elif name == "residual":
                v = v + ops.residual.view.astype(np.float64)
            elif name == "scale":
                v, err = v * scale, err * abs(scale)
            elif name == "divide":
                v, err = v / scale, err / abs(scale)
            else:
                v = CHAIN_REFERENCE[name](v)
                err = err * chain_growth(name)
            finite_in &= np.isfinite(v)
            seen = np.maximum(seen, np.abs(_finite(v)))
            err = err + 1e-6 * np.abs(np.where(np.isfinite(v), v, 0.0))
    return v, _chain_tolerance(v, err, finite_in, seen)


def _chain_tolerance(v, err, finite_in, seen):
    """Per-element tolerance of a product through a chain: the error bound where every
    step was finite (at least 1e-6 of the largest finite output); where a step was not
    but the output is (an Inf that tanh or sigmoid turned into 1 or 0, then a residual
    added), the float32 rounding of the steps after it, 2e-6 of the largest finite value
    along the chain (``seen``); 0 (exact: NaN where NaN, the same Inf) elsewhere."""
    finite = np.isfinite(v)
    max_ref = np.abs(v[finite]).max() if finite.any() else 0.0
    tol = np.where(finite_in, np.maximum(err, max_ref * 1e-6), 2e-6 * seen)
    return np.where(finite, tol, 0.0)


def softmax_expected(ops, groups):
    """float64 softmax per row; numpy's max propagates NaN, and a +inf or an all -inf
    row gives NaN (inf - inf), as the kernel, PyTorch and TVM do."""
    x = ops.x.view.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(x - x.max(axis=1, keepdims=True)) if x.size else x
        v = e / e.sum(axis=1, keepdims=True) if x.size else x
    return v, np.where(np.isfinite(v), 1e-7, 0.0)


def attention_expected(ops, groups):
    """float64 softmax(where(masked, -inf, (Q K) * scale)) @ V with IEEE semantics: NaN
    for a row whose scores are all -inf (0 weights with empty_zero), NaN where a kept
    score is NaN or +inf (with mask_add, the mask added as -inf: where any score is; with
    mask_lowest the mask is -FLT_MAX instead; with nan_zero every row of NaN weights
    gets weights of 0), and 0 * inf = NaN for every weight of 0
    against a non-finite V. Tolerance (plus compare()'s 1e-5 relative): 2e-6 * (1 + t_i) of sum_j |P_ij V_jc|,
    where t_i is the largest of row i's score tolerances as the dense tests give them
    (|scale| * the 2-norm of the products q_ip k_pj summed * max(1, sqrt(D) / 8)): a
    score's rounding error e becomes a relative error of about e in its weight (through
    the exp), so the output's error grows with it. Measured: err <= 7.5e-7 * (1 + t_i) of
    that sum over 11463 valid cases (1500 per ISA and seed 1-3, scores up to +-25); the
    large heads (D near 4096) have the largest t_i."""
    c = ops.case
    dv = c.get("dv")
    q = ops.a.view.astype(np.float64)
    kk = ops.w_kn  # [D, N]: what Q multiplies
    v = ops.v.view.astype(np.float64)
    masked, _, _ = ops.mask
    scale = attention_scale(c)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        s = ieee_matmul(q, kk) if c.k else np.zeros((c.m, c.n))
        s = s / np.float64(np.float32(scale)) if c.get("divide") \
            else s * np.float64(np.float32(scale))
        low = np.float64(np.finfo(np.float32).min) if c.get("mask_lowest") else -np.inf
        s = s + np.where(masked, low, 0.0) if c.get("mask_add") \
            else np.where(masked, low, s)
        if c.n == 0:
            return np.zeros((c.m, dv)), np.zeros((c.m, dv))
        mx = s.max(axis=1, keepdims=True)
        e = np.exp(s - mx)
        p = e / e.sum(axis=1, keepdims=True)
        if c.get("empty_zero"):
            p = np.where(np.all(s == -np.inf, axis=1, keepdims=True), 0.0, p)
        if c.get("nan_zero"):  # every row of NaN weights: 0
            p = np.where(np.isnan(p), 0.0, p)
        out = ieee_matmul(p, v)
        size = np.abs(_finite(p)) @ np.abs(_finite(v))
        qf, kf = _finite(q), _finite(kk)
        factor = abs(np.float64(np.float32(scale)))
        factor = 1.0 / factor if c.get("divide") else factor
        t = np.sqrt((qf ** 2) @ (kf ** 2)) * factor * max(1.0, math.sqrt(c.k) / 8)
        t = np.where(masked, 0.0, t).max(axis=1, keepdims=True)
    tol = 2e-6 * (1.0 + t) * size + 1e-7
    return out, np.where(np.isfinite(out), tol, 0.0)


def conv_expected(ops, groups):
    """float64 im2col (exact zeros in the padding) times the weight per image, with IEEE
    products (0 * inf = NaN), then the chain; tolerance as matmul_expected."""
    c, g = ops.case, dict(ops.case.extra)
    x, wt, bias, res, y, names = ops.conv
    n_img, oh, ow = g["batch"], g["oh"], g["ow"]
    xs = x.view.astype(np.float64).reshape(n_img, g["c"], g["h"], g["w"])
    w2 = wt.view.astype(np.float64)
    ng = g["groups"]
    cg, ocg = g["c"] // ng, c.m // ng
    # each group's rows of the weight times the im2col of its channels
    groups_of = [(img[q * cg:(q + 1) * cg], w2[q * ocg:(q + 1) * ocg])
                 for img in xs for q in range(ng)]
    vals, errs = [], []
    with np.errstate(invalid="ignore", over="ignore"):
        for img, w2 in groups_of:
            cols = np.zeros((cg, g["kh"], g["kw"], oh, ow))
            for r in range(g["kh"]):
                rows = np.arange(oh) * g["sh"] - g["pt"] + r * g["dh"]
                for t in range(g["kw"]):
                    cs = np.arange(ow) * g["sw"] - g["pl"] + t * g["dw"]
                    ok = (((rows >= 0) & (rows < g["h"]))[:, None]
                          & ((cs >= 0) & (cs < g["w"]))[None, :])
                    if g["h"] and g["w"]:
                        got = img[:, np.clip(rows, 0, g["h"] - 1)][:, :, np.clip(cs, 0, g["w"] - 1)]
                        cols[:, r, t] = np.where(ok, got, 0.0)
            cols = cols.reshape(c.k, oh * ow)
            vals.append(ieee_matmul(w2, cols) if c.k else np.zeros((ocg, oh * ow)))
            terms = (_finite(w2) ** 2) @ (_finite(cols) ** 2)
            errs.append(np.sqrt(terms) * 1e-5 * max(1.0, math.sqrt(c.k) / 8))
        v = np.concatenate(vals) if vals else np.zeros((0, oh * ow))
        err = np.concatenate(errs) if errs else np.zeros((0, oh * ow))
        finite_in, seen = np.isfinite(v), np.zeros(v.shape)
        for name in names:
            if name == "bias":
                v = v + np.tile(bias.view.astype(np.float64).reshape(-1, 1), (n_img, 1))
            elif name == "residual":
                v = v + res.view.astype(np.float64)
            else:
                v = CHAIN_REFERENCE[name](v)
                err = err * chain_growth(name)
            finite_in &= np.isfinite(v)
            seen = np.maximum(seen, np.abs(_finite(v)))
            err = err + 1e-6 * np.abs(np.where(np.isfinite(v), v, 0.0))
    return v, _chain_tolerance(v, err, finite_in, seen)


# The Winograd sum's rounding, relative to winograd_simulation's scale (measured: below
# 3e-6 of it over 3600 cases on every ISA).
WG_TOL = 1e-5


def winograd_expected(ops, groups):
    """The direct conv's reference (conv_expected) within WG_TOL_FACTOR times its
    tolerance; where the Winograd algorithm in float64 (winograd_simulation, with the
    same chain) is not finite, its value (NaN and Inf as the kernel must give them)."""
    v, tol = conv_expected(ops, groups)
    g = dict(ops.case.extra)
    _, _, bias, res, _, names = ops.conv
    sim, scale = winograd_simulation(ops)
    with np.errstate(invalid="ignore", over="ignore"):
        for name in names:
            if name == "bias":
                sim = sim + np.tile(bias.view.astype(np.float64).reshape(-1, 1), (g["batch"], 1))
            elif name == "residual":
                sim = sim + res.view.astype(np.float64)
            else:
                sim = CHAIN_REFERENCE[name](sim)
    bad = ~np.isfinite(sim)
    tol = np.maximum(tol, WG_TOL * scale)
    return np.where(bad, sim, v), np.where(bad | ~np.isfinite(v), 0.0, tol)


def winograd_pack_expected(ops, groups):
    """The documented layout, bit for bit (the same float64 sums, rounded once); the size
    function agrees with its formula."""
    c = ops.case
    _, wt, bias, _, _, _ = ops.conv
    size = LIBRARY.lib.tirbyoc_conv2d_winograd_packed_size_f32(c.m, c.get("c"))
    if size != ops.wino_packed_size:
        raise AssertionError(f"tirbyoc_conv2d_winograd_packed_size_f32 = {size}, expected "
                             f"{ops.wino_packed_size}")
    return winograd_pack_reference(wt.view, None if bias is None else bias.view,
                                   c.get("c")), None


def pool_expected(ops, groups):
    """The maximum over each window's taps inside the input in float64 (-inf for a window
    without one, NaN if a tap is NaN): exact, so compared bit for bit, except for the
    sign of a zero maximum. Where +0.0 and -0.0 tie, which one a window keeps depends on
    the order its taps are compared in: the reference (like PyTorch) goes row by row,
    the kernel takes each column's maximum first (kernels/pool_f32.c)."""
    c, g = ops.case, dict(ops.case.extra)
    x, _, _, _, _, _ = ops.conv
    planes, oh, ow = g["batch"] * c.m, g["oh"], g["ow"]
    xs = x.view.astype(np.float64).reshape(planes, g["h"], g["w"])
    out = np.full((planes, oh, ow), -np.inf)
    nan = np.zeros((planes, oh, ow), bool)
    for r in range(g["kh"]):
        rows = np.arange(oh) * g["sh"] - g["pt"] + r * g["dh"]
        for t in range(g["kw"]):
            cs = np.arange(ow) * g["sw"] - g["pl"] + t * g["dw"]
            ok = ((rows >= 0) & (rows < g["h"]))[:, None] & ((cs >= 0) & (cs < g["w"]))[None, :]
            if not (g["h"] and g["w"] and ok.any()):
                continue
            tap = xs[:, np.clip(rows, 0, g["h"] - 1)][:, :, np.clip(cs, 0, g["w"] - 1)]
            tap = np.where(ok, tap, -np.inf)
            nan |= np.isnan(tap)
            out = np.fmax(out, tap)
    out[nan] = np.nan
    return out.reshape(planes, oh * ow), SIGNED_ZEROS_TIE


def dense_expected(ops, groups):
    return _dense_expected(ops, groups.get("epi"))


def conv_pack_expected(ops, groups):
    """The documented layout, bit for bit; the size function agrees with its formula."""
    c = ops.case
    _, wt, bias, _, _, _ = ops.conv
    size = LIBRARY.lib.tirbyoc_conv2d_packed_size_f32(c.m, c.get("groups"), c.k, int(c.bias))
    if size != ops.conv_packed_size:
        raise AssertionError(f"tirbyoc_conv2d_packed_size_f32 = {size}, expected "
                             f"{ops.conv_packed_size}")
    return conv_pack_reference(wt.view, None if bias is None else bias.view,
                               c.get("groups")), None  # None: bit for bit


def acc_expected(ops, groups):
    return _dense_expected(ops, None)


def pack_expected(ops, groups):
    size = LIBRARY.lib.tirbyoc_packed_weight_size_f32(ops.case.n, ops.case.k)
    if size != ops.packed_size:
        raise AssertionError(f"tirbyoc_packed_weight_size_f32 = {size}, expected {ops.packed_size}")
    return pack_reference(ops.w.view, ops.case.layout), None  # None: bit for bit


# --- the table of kernel families ----------------------------------------------


@dataclasses.dataclass(frozen=True)
class Family:
    """Kernels that share arguments and reference. ``pattern`` fully matches
    their symbols; its named groups (``epi``, ``layout``) parameterize the
    entry: ``layout`` fixes how W is stored (else random per case), ``epi``
    keys EPILOGUES. ``expected(ops, groups)`` gives (expected output,
    tolerance per element, or None for bit-exact); it runs before the call."""

    pattern: str
    args: Callable
    expected: Callable
    output: str = "c"          # the Operands buffer the kernel writes
    accumulate: bool = False   # C holds values the kernel adds to


_EPI = "|".join(name for name in EPILOGUES if name)
FAMILIES = (
    Family(rf"tirbyoc_dense(?:_(?P<epi>{_EPI}))?_f32_(?P<layout>nt|nn)", dense_args, dense_expected),
    Family(rf"tirbyoc_dense(?:_(?P<epi>{_EPI}))?_f32_packed", packed_args, dense_expected),
    Family(r"tirbyoc_dense_acc_f32_(?P<layout>nt|nn)", acc_args, acc_expected, accumulate=True),
    Family(r"tirbyoc_pack_weight_f32_(?P<layout>nt|nn)", pack_args, pack_expected,
           output="packed_out"),
    Family(r"tirbyoc_matmul_f32", matmul_args, matmul_expected),
    Family(r"tirbyoc_softmax_f32", softmax_args, softmax_expected),
    Family(r"tirbyoc_attention_f32", attention_args, attention_expected, output="o"),
    Family(r"tirbyoc_conv2d_f32", conv_args, conv_expected, output="y"),
    Family(r"tirbyoc_conv2d_f32_packed", conv_packed_args, conv_expected, output="y"),
    Family(r"tirbyoc_pack_conv2d_weight_f32", conv_pack_args, conv_pack_expected,
           output="conv_packed_out"),
    Family(r"tirbyoc_conv2d_winograd_f32", winograd_args, winograd_expected, output="y"),
    Family(r"tirbyoc_conv2d_winograd_cached_f32", winograd_cached_args, winograd_expected,
           output="y"),
    Family(r"tirbyoc_pack_conv2d_winograd_weight_f32", winograd_pack_args,
           winograd_pack_expected, output="wino_packed_out"),
    # the conv's reference with groups = C
    Family(r"tirbyoc_depthwise_conv2d_f32", depthwise_args, conv_expected, output="y"),
    Family(r"tirbyoc_conv2d_f32_packed_layouts", blocked_args(conv_packed_args),
           blocked_expected(conv_expected), output="y"),
    Family(r"tirbyoc_depthwise_conv2d_f32_layouts", blocked_args(depthwise_args),
           blocked_expected(conv_expected), output="y"),
    Family(r"tirbyoc_max_pool2d_f32", pool_args, pool_expected, output="y"),
    Family(r"tirbyoc_max_pool2d_f32_layouts", blocked_args(pool_args), blocked_pool_expected,
           output="y"),
)
# Exported functions that are not kernels, and where they are exercised.
NOT_KERNELS = {
    "tirbyoc_set_isa": "setting: selects every ISA of the run",
    "tirbyoc_isa": "setting: saved and restored around each run",
    "tirbyoc_set_num_threads": "setting: each case's own count, from THREAD_CHOICES",
    "tirbyoc_num_threads": "setting: saved and restored around each run",
    "tirbyoc_packed_weight_size_f32": "checked by every pack_weight case",
    "tirbyoc_conv2d_packed_size_f32": "checked by every pack_conv2d_weight case",
    "tirbyoc_conv2d_winograd_packed_size_f32": "checked by every pack_conv2d_winograd case",
    "tirbyoc_conv2d_winograd_suits": "a shape predicate: tests/test_conv_kernel.py",
    "tirbyoc_conv2d_direct_plan": "the direct path's work plan: tests/test_threads.py (every "
                                  "shape of its grid on 1 to 64 threads) and the sanitizer "
                                  "driver",
    "tirbyoc_conv2d_direct_suits": "a shape predicate: tests/test_conv_kernel.py, and the "
                                   "blocked tensors it allows: tests/test_conv.py",
    "tirbyoc_status_string": "describes a status; no operands",
    "tirbyoc_winograd_cache_stats": "reports the cached Winograd weights: "
                                    "tests/test_winograd_kernel.py and the sanitizer driver",
    "tirbyoc_cache_sizes": "reports the caches: tests/test_caches.py (TIRBYOC_CACHES, the "
                           "blocking it gives, the same results) and the sanitizer driver",
    "tirbyoc_unary_f32": "1-D elementwise: tests/test_matmul_kernels.py (every ISA, full "
                         "float range, NaN/Inf, in place) and the sanitizer driver",
}


def family_of(symbol):
    """(family, named groups) of an exported kernel; raises if none or several match."""
    matches = [(family, match.groupdict()) for family in FAMILIES
               if (match := re.fullmatch(family.pattern, symbol))]
    if len(matches) != 1:
        raise LookupError(f"{symbol} matches {len(matches)} entries of FAMILIES")
    return matches[0]


def _kernel_symbols():
    symbols, missing = [], []
    for symbol in LIBRARY.symbols:
        if symbol in NOT_KERNELS:
            continue
        try:
            family_of(symbol)
        except LookupError:
            missing.append(symbol)
        else:
            symbols.append(symbol)
    # At collection: a new kernel needs an entry in FAMILIES (or NOT_KERNELS).
    assert not missing, f"exported kernels without a FAMILIES entry (or several): {missing}"
    return symbols


KERNEL_SYMBOLS = _kernel_symbols()


# --- running a case ------------------------------------------------------------


def algorithm(case):
    """The path dense_f32.c takes for this case (a mirror, for the statistics)."""
    if case.invalid:
        return "invalid"
    kind = case.symbol.rsplit("_", 1)[1]
    if "pack_weight" in case.symbol or "pack_conv2d" in case.symbol:
        return "pack" + ("+groups" if "conv2d" in case.symbol and case.get("groups") > 1
                         else "")
    if "attention" in case.symbol:
        dv = case.get("dv")
        path = "empty" if case.m * dv == 0 else "no_keys" if case.n == 0 else \
            f"mask_{case.get('mask')}"
        return path + ("+threads" if 2 * case.m * case.n * (case.k + dv) >= ATT_PAR_FLOPS
                       and case.m * dv * case.n else "")
    if "max_pool" in case.symbol:
        g = dict(case.extra)
        if case.m * case.n * g["batch"] == 0:
            return "empty"
        fast = g["dw"] == 1 and (g["sw"], g["kw"]) in ((1, 2), (1, 3), (2, 2), (2, 3))
        return ("columns" if fast else "general") + (
            "+threads" if g["batch"] * case.m * case.n * case.k >= POOL_PAR_TAPS else "")
    if "depthwise" in case.symbol:
        g = dict(case.extra)
        if case.m * case.n * g["batch"] == 0:
            return "empty"
        path = dw_path_forced(case) or "chosen"
        return path + ("+threads" if 2 * g["batch"] * case.m * case.n * case.k >= DW_PAR_FLOPS
                       else "")
    if "winograd" in case.symbol:
        g = dict(case.extra)
        if case.m * case.n * g["batch"] == 0:
            return "empty"
        return ("one_tile" if case.n <= 16 else "tiles") + (
            "+ocblocks" if case.m > 64 else "") + (
            "+threads" if 2 * g["batch"] * case.m * case.n * case.k >= WG_PAR_FLOPS else "")
    if "conv2d" in case.symbol:
        g = dict(case.extra)
        if case.m * case.n * g["batch"] == 0:
            return "empty"
        plain = (g["kh"], g["kw"], g["sh"], g["sw"], g["pt"], g["pl"], g["oh"], g["ow"]) == \
            (1, 1, 1, 1, 0, 0, g["h"], g["w"])
        path = "direct" if conv_direct_forced(case) else "plain" if plain else "gather"
        return path + ("+groups" if g["groups"] > 1 else "") + (
            "+threads" if 2 * g["batch"] * case.m * case.n * (case.k + case.bias) >= PAR_FLOPS
            else "")
    if "softmax" in case.symbol:
        return "empty" if case.m * case.n == 0 else \
            "rows+threads" if case.m > 1 and case.m * case.n >= 32768 else "rows"
    if case.m == 0 or case.n == 0 or case.k == 0:
        return "empty_or_k0"  # nothing to sum: bias (or C) only
    acc = "_acc_" in case.symbol
    if (not acc and kind == "nt" and 8 < case.m <= DIRECT_M.get(case.isa, 0)
            and 64 * case.k <= SCRATCH_FLOATS):
        path = "nt_direct"
    elif not acc and case.m <= (8 if kind == "nt" else 4):
        path = "small"
    else:
        path = "blocked"
    if 2 * case.m * case.n * case.k >= PAR_FLOPS:
        path += "+threads"
    return path


def _first(mask):
    return tuple(int(i) for i in np.argwhere(mask)[0])


# The tolerance of a result compared bit for bit with +0.0 and -0.0 as one value.
SIGNED_ZEROS_TIE = "signed zeros tie"


def compare(got, expected, tolerance):
    """None if ``got`` (float32) matches, else a description of the first mismatch."""
    if tolerance is None or isinstance(tolerance, str):
        same = got.view(np.uint32) == expected.astype(np.float32).view(np.uint32)
        if tolerance == SIGNED_ZEROS_TIE:
            same |= (got == 0) & (expected == 0)
        if not same.all():
            at = _first(~same)
            return f"not bit-identical at {at}: got {got[at]!r}, expected {expected[at]!r}"
        return None
    got64 = got.astype(np.float64)
    checks = (
        ("NaN mismatch", np.isnan(got64) != np.isnan(expected)),
        ("Inf mismatch", np.isinf(expected) & (got64 != expected)),
    )
    for what, bad in checks:
        if bad.any():
            at = _first(bad)
            return f"{what} at {at}: got {got[at]!r}, expected {expected[at]!r}"
    finite = np.isfinite(expected)
    with np.errstate(invalid="ignore"):
        err = np.where(finite, np.abs(got64 - expected), 0.0)
        bad = err > 1e-5 * np.abs(np.where(finite, expected, 0.0)) + tolerance
    if bad.any():
        at = _first(bad)
        return (f"outside tolerance at {at} ({int(bad.sum())} elements): got {got[at]!r}, "
                f"expected {expected[at]!r}, error {err[at]:.3g} > {tolerance[at]:.3g}")
    return None


# ISAs whose conv kernel has the direct path (kernels/conv_f32.c): odd cases force it
# (TIRBYOC_CONV_DIRECT=1), even cases take the kernel's own choice.
CONV_DIRECT_ISAS = kernels.CONV_DIRECT_ISAS


def conv_direct_forced(case):
    return ("conv2d" in case.symbol and "pack_conv2d" not in case.symbol
            and "depthwise" not in case.symbol and "winograd" not in case.symbol
            and case.isa in CONV_DIRECT_ISAS and case.index % 2 == 1)


# The depthwise kernel's paths (kernels/depthwise_f32.c, TIRBYOC_DW_PATH): a quarter of
# the cases force the scalar path, on the ISAs with channels in lanes a quarter each the
# planes and the channels in lanes; the rest take the kernel's own choice.
def dw_path_forced(case):
    if "depthwise" not in case.symbol:
        return None
    forced = {1: "planes", 2: "channels", 3: "scalar"}.get(case.index % 4)
    return (forced if forced == "scalar" or case.isa in kernels.DEPTHWISE_CHANNELS_ISAS
            else None)


def call_case(case, args, threads):
    """Calls the case's kernel on ``threads`` threads, its forced path (if any) set in the
    environment meanwhile; returns the status."""
    LIBRARY.lib.tirbyoc_set_num_threads(threads)
    saved = os.environ.get("TIRBYOC_CONV_DIRECT")
    saved_dw = os.environ.pop("TIRBYOC_DW_PATH", None)
    if conv_direct_forced(case):
        os.environ["TIRBYOC_CONV_DIRECT"] = "1"
    if dw_path_forced(case):
        os.environ["TIRBYOC_DW_PATH"] = dw_path_forced(case)
    try:
        return getattr(LIBRARY.lib, case.symbol)(*[arg.value for arg in args])
    finally:
        if saved is None:
            os.environ.pop("TIRBYOC_CONV_DIRECT", None)
        else:
            os.environ["TIRBYOC_CONV_DIRECT"] = saved
        os.environ.pop("TIRBYOC_DW_PATH", None)
        if saved_dw is not None:
            os.environ["TIRBYOC_DW_PATH"] = saved_dw


def thread_sweep(symbol, isa, counts, seed=SEED, tries=400):
    """The first case of ``symbol`` (ISA active) with valid arguments whose work is split
    over threads: its output on each of ``counts`` threads against 1 thread, bit for bit.
    Returns (case or None when no such case was drawn, problems)."""
    family, groups = family_of(symbol)
    for index in range(tries):
        rng = case_rng(symbol, isa, seed, index)
        case = draw_case(symbol, isa, seed, index, rng, groups.get("layout"))
        if not case.invalid and "+threads" in algorithm(case):
            break
    else:
        return None, []
    ops = Operands(case, rng, family.accumulate)
    args = family.args(ops)
    output = getattr(ops, family.output)
    initial = output.raw.copy()
    results, problems = {}, []
    for threads in (1, *counts):
        output.raw[...] = initial
        status = call_case(case, args, threads)
        if status != 0:
            problems.append(f"status {status} on {threads} threads")
        results[threads] = output.bits()
        if (results[threads] != results[1]).any():
            problems.append(f"{threads} threads: {int((results[threads] != results[1]).sum())}"
                            f" cells differ from 1 thread")
    return case, [f"{symbol} on {isa}, {p} ({case.describe()})" for p in problems]


def run_case(symbol, isa, seed, index):
    """Runs one case (ISA must be active); returns (case, failure or None)."""
    family, groups = family_of(symbol)
    rng = case_rng(symbol, isa, seed, index)
    case = draw_case(symbol, isa, seed, index, rng, groups.get("layout"))
    ops = Operands(case, rng, family.accumulate)
    args = family.args(ops)
    output = getattr(ops, family.output)
    mutation = ""
    if case.invalid:
        args, mutation = make_invalid(args, rng)
        expected = None
    else:
        expected, tolerance = family.expected(ops, groups)
    before = {name: buf.bits() for name, buf in ops.buffers.items()}
    status = call_case(case, args, case.threads)

    problems = []
    for name, buf in ops.buffers.items():
        changed = buf.bits() != before[name]
        if buf is output and not case.invalid:
            changed &= ~buf.mask  # only the matrix itself may change
        if changed.any():
            where = "despite invalid arguments" if case.invalid else "outside the output matrix"
            problems.append(f"wrote {int(changed.sum())} cells of {name} {where} (first at "
                            f"raw index {_first(changed)[0]}; the matrix starts at {buf.start})")
    if case.invalid:
        if status == 0:
            problems.append(f"status 0 for invalid argument {mutation}")
    elif status != 0:
        problems.append(f"status {status} for valid arguments")
    else:
        mismatch = compare(output.view, expected, tolerance)
        if mismatch:
            problems.append(mismatch)
    if not problems:
        return case, None
    detail = f" (invalid: {mutation})" if mutation else ""
    return case, f"{case.describe()}{detail}\n    " + "\n    ".join(problems) + \
        f"\n    replay: {case.replay_command()}"


# --- the tests -----------------------------------------------------------------


@pytest.fixture
def active_isa(request):
    """The ISA of the test, active during it; the ISA and thread settings are restored."""
    saved_isa, saved_threads = LIBRARY.isa(), LIBRARY.lib.tirbyoc_num_threads()
    LIBRARY.set_isa(request.param)
    yield request.param
    LIBRARY.set_isa(saved_isa)
    LIBRARY.lib.tirbyoc_set_num_threads(saved_threads)


_RESULTS = {}  # (symbol, isa) -> (cases, failures, seconds, Counter of paths)
_THREADED = Counter()  # thread count -> cases above a threading threshold run with it
_STARTED = set()  # (symbol, isa) runs started in this process


@pytest.mark.parametrize("active_isa", LIBRARY.isas, indirect=True)
@pytest.mark.parametrize("symbol", KERNEL_SYMBOLS)
def test_fuzz_kernel(symbol, active_isa):
    _STARTED.add((symbol, active_isa))
    start = time.perf_counter()
    failures, paths, specials = [], Counter(), 0
    for index in range(CASES):
        case, failure = run_case(symbol, active_isa, SEED, index)
        paths[algorithm(case)] += 1
        if "+threads" in algorithm(case):
            _THREADED[case.threads] += 1
        specials += case.specials and not case.invalid
        if failure:
            failures.append(failure)
    paths["nonfinite"] = specials
    _RESULTS[symbol, active_isa] = (CASES, len(failures), time.perf_counter() - start, paths)
    if failures:
        shown = "\n".join(failures[:5])
        pytest.fail(f"{len(failures)} of {CASES} cases failed for {symbol} on {active_isa} "
                    f"(seed {SEED}); the first ones:\n{shown}", pytrace=False)


def test_fuzz_figures(request, report_lines):
    """Reports the cases per kernel and ISA; fails if a selected (kernel, ISA)
    run did not finish its cases (an exception in the harness would otherwise
    look like fewer, clean cases)."""
    selected = {(item.callspec.params["symbol"], item.callspec.params["active_isa"])
                for item in request.session.items if item.originalname == "test_fuzz_kernel"}
    if not selected:
        pytest.skip("no fuzz run selected")
    # Under pytest-xdist without --dist loadfile, other workers run some of the selected
    # runs: only those started in this process can be checked here.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        selected &= _STARTED
    unfinished = sorted(selected - set(_RESULTS))
    results = list(_RESULTS.values())
    report_lines.append(
        f"kernel fuzz: {sum(r[0] for r in results)} cases, {sum(r[1] for r in results)} failed, "
        f"{sum(r[2] for r in results):.1f} s ({len(results)} kernel x ISA runs of {CASES} "
        f"cases, seed {SEED}, library {LIBRARY.path})")
    report_lines.append(
        "  cases split over threads, by thread count: "
        + " ".join(f"{t}:{n}" for t, n in sorted(_THREADED.items()))
        + f" ({sum(_THREADED.values())} cases, {len(_THREADED)} counts)")
    for symbol in KERNEL_SYMBOLS:
        runs = {isa: _RESULTS[symbol, isa] for isa in LIBRARY.isas if (symbol, isa) in _RESULTS}
        if not runs:
            continue
        paths = sum((r[3] for r in runs.values()), Counter())
        report_lines.append(
            f"  {symbol:32s} "
            + ", ".join(f"{isa} {r[0] - r[1]}/{r[0]} ok {r[2]:.1f}s" for isa, r in runs.items())
            + "  [" + " ".join(f"{path}:{count}" for path, count in sorted(paths.items())) + "]")
    assert not unfinished, f"fuzz runs that did not finish: {unfinished}"


# --- replaying one case --------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(description="Replay one fuzz case of a tirbyoc kernel.")
    parser.add_argument("symbol")
    parser.add_argument("isa")
    parser.add_argument("index", type=int)
    parser.add_argument("--seed", type=int, default=SEED)
    options = parser.parse_args(argv)
    saved = LIBRARY.isa()
    LIBRARY.set_isa(options.isa)
    try:
        case, failure = run_case(options.symbol, options.isa, options.seed, options.index)
    finally:
        LIBRARY.set_isa(saved)
    print(case.describe())
    print(f"path: {algorithm(case)}")
    print(failure or "ok")
    return 1 if failure else 0


if __name__ == "__main__":
    sys.exit(main())
