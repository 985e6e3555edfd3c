"""Whole models at 3, 8 and 16 threads: a convolutional network (ResNet basic blocks up to
256 channels at 7 x 7), a MobileNet (depthwise and 1x1 convs up to 512 channels at 7 x 7)
and a GPT-2-style block, compiled here with ``tirbyoc.compile`` and exported, then run
in fresh processes with ``TIRBYOC_NUM_THREADS`` = ``TVM_NUM_THREADS`` = the count and only
the TVM runtime loading the library, as a user runs them. Each run has a time limit (a
call that never returns fails the test) and is checked against PyTorch (relative error of
max|reference| <= 1e-4); the kernels' results do not depend on the thread count, and
neither do the models' (bit for bit across the counts).

ResNet-18 and MobileNet never returned at 8 and 16 threads on AVX-512 machines: the conv
direct path's plan looped forever on a 14 x 14 conv of 256 channels, or a 7 x 7 one of
512. Nothing here needs many cores: the pools run their threads on any machine.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tirbyoc  # noqa: E402
from tirbyoc import examples  # noqa: E402

from .fresh import without_torch  # noqa: E402

THREADS = (3, 8, 16)
RTOL = 1e-4
MODELS = {
    "resnet": (lambda: examples.resnet_torch((1, 1, 1), (64, 128, 256), 10), (1, 3, 112, 112)),
    "mobilenet": (lambda: examples.mobilenet_torch(0.5, 10), (1, 3, 112, 112)),
    "gpt2_block": (lambda: examples.gpt2_block_torch(256, 4), (1, 64, 256)),
}

RUN = """
    import sys
    import numpy as np
    import tvm
    from tvm.runtime import vm as rvm
    lib, x_path, out_path = sys.argv[1:4]
    vm = rvm.VirtualMachine(tvm.runtime.load_module(lib), tvm.cpu())
    x = tvm.runtime.tensor(np.load(x_path))
    for _ in range(3):
        out = vm["main"](x)
    out = out if hasattr(out, "numpy") else out[0]
    np.save(out_path, out.numpy())
"""


@pytest.fixture(scope="module", params=sorted(MODELS))
def exported(request, tmp_path_factory):
    name = request.param
    build, shape = MODELS[name]
    model = build()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(x).numpy().astype(np.float64)
    mod = examples.import_torch(model, x)
    report = tirbyoc.explain(mod)
    folder = tmp_path_factory.mktemp(name)
    lib = str(folder / f"{name}.so")
    tirbyoc.compile(mod).export_library(lib)
    np.save(folder / "x.npy", x.numpy())
    return name, lib, str(folder), ref, len(report.offloaded)


def _run(lib, folder, threads):
    env = {key: value for key, value in os.environ.items()
           if key not in ("TIRBYOC_ISA", "OMP_NUM_THREADS")}
    env.update(TIRBYOC_NUM_THREADS=str(threads), TVM_NUM_THREADS=str(threads))
    out = os.path.join(folder, f"y{threads}.npy")
    try:
        proc = subprocess.run([sys.executable, "-c", without_torch(textwrap.dedent(RUN)), lib,
                               os.path.join(folder, "x.npy"), out],
                              env=env, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{os.path.basename(lib)} at {threads} threads: no result in 180 s "
                    f"(a call that never returns)", pytrace=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return np.load(out)


def test_model_at_many_thread_counts(exported):
    name, lib, folder, ref, offloaded = exported
    assert offloaded >= {"resnet": 8, "mobilenet": 20, "gpt2_block": 5}[name], offloaded
    outputs = {}
    for threads in THREADS:
        got = outputs[threads] = _run(lib, folder, threads)
        assert got.shape == ref.shape
        err = float(np.abs(got - ref).max() / np.abs(ref).max())
        assert err <= RTOL, f"{name} at {threads} threads: relative error {err:.2e}"
    for threads in THREADS[1:]:
        assert (outputs[threads].view(np.uint32) == outputs[THREADS[0]].view(np.uint32)).all(), \
            f"{name}: {threads} threads give other bits than {THREADS[0]}"
