"""Every accepted TIR form (tests/tir_forms.py), offloaded and compiled, computes what TVM's
own build of the same PrimFunc computes, on random inputs (spread wide enough to reach
GELU's and tanh's flat tails). Tolerance: rtol 1e-5, absolute floor 1e-5 * max|ref|.
"""

import numpy as np
import pytest
import tvm

import tirbyoc

from . import tir_forms as F

RTOL = 1e-5


def _buffers(func):
    return list(func.params)  # TVM 0.27: buffer params are the buffers


def _call(ex, func, arrays):
    tensors = [tvm.runtime.tensor(a) for a in arrays]
    ex["main"](*tensors)
    return tensors[-1].numpy()


def _inputs(func, seed):
    rng = np.random.default_rng(seed)
    arrays = []
    for buf in _buffers(func):
        shape = [int(d) if isinstance(d, tvm.tirx.IntImm) else 7 for d in buf.shape]
        arrays.append((3 * rng.standard_normal(shape)).astype(buf.dtype))
    arrays[-1][...] = 0
    return arrays


@pytest.mark.parametrize("name,func,intrinsics,stays", F.ACCEPTED, ids=[a[0] for a in F.ACCEPTED])
def test_accepted_form_matches_tvm(name, func, intrinsics, stays):
    if any(not isinstance(d, tvm.tirx.IntImm) for b in _buffers(func) for d in b.shape):
        pytest.skip("symbolic shapes: covered end to end by the Relax tests")
    if any(b.strides for b in _buffers(func)):
        pytest.skip("strided buffers: covered by the matcher fuzzer's strided views")
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    ours = tirbyoc.compile(mod)
    theirs = tvm.compile(mod, target="llvm")
    for seed in range(3):
        arrays = _inputs(func, seed)
        got = _call(ours, func, [a.copy() for a in arrays])
        ref = _call(theirs, func, [a.copy() for a in arrays])
        np.testing.assert_allclose(got, ref, rtol=RTOL,
                                   atol=RTOL * max(1.0, float(np.abs(ref).max())))
