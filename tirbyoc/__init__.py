"""tirbyoc: offload TIR dense+bias(+relu) blocks to a C kernel library.

>>> import tirbyoc
>>> offloaded = tirbyoc.apply_tir_byoc(mod)      # a Relax or TIR IRModule
>>> print(tirbyoc.explain(mod))                  # what went to which kernel, and why not
>>> ex = tirbyoc.compile(mod)                    # or tvm.compile(..., relax_pipeline=tirbyoc.pipeline(target))

Threads: TVM's runtime runs parallel loops on half of the logical CPUs by default (it
assumes two hardware threads per core), the kernel library on all of them. On import,
tirbyoc sets ``TVM_NUM_THREADS`` to the kernel library's count (``kernels.num_threads``:
``TIRBYOC_NUM_THREADS``, else the CPUs this process may use) unless ``TVM_NUM_THREADS``
or ``OMP_NUM_THREADS`` is set already, so that the code TVM compiles around the kernels uses as many threads as
the kernels do. It also sets ``TVM_THREAD_POOL_SPIN_COUNT`` to 0 unless it is set: after a
parallel loop, TVM's workers would otherwise spin for 300,000 yields (tens of
milliseconds), on the cores the kernels' own threads need for the next calls (measured:
MobileNet's runs took 3.4 to 5.6 ms in different processes, depending on whether a TVM
worker was spinning; 3.5 to 3.7 ms with the workers asleep). And it sets
``TVM_BIND_THREADS`` to 0 unless it is set: TVM's pool, started with fewer threads than
CPUs, would bind the thread that starts it to its first CPUs, and the kernels' workers
that thread creates afterwards would inherit the binding (on a 16-core Xeon with
``TVM_NUM_THREADS=2``, every worker of the kernels ran on CPUs 0-1).
"""

import os as _os
from importlib import import_module as _import_module
from importlib.util import find_spec as _find_spec
from typing import TYPE_CHECKING


def _default_tvm_threads():
    if "TVM_NUM_THREADS" in _os.environ or "OMP_NUM_THREADS" in _os.environ:
        return
    from . import kernels

    try:
        count = kernels.num_threads()
    except kernels.KernelLibraryError:  # not built: nothing to match TVM's count to
        return
    # NOTE: read by TVM when a thread first runs a parallel loop (its pool is per thread).
    _os.environ["TVM_NUM_THREADS"] = str(count)


_default_tvm_threads()
# NOTE: read once, when TVM's thread pool starts its workers.
_os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
_os.environ.setdefault("TVM_BIND_THREADS", "0")

# The public names, imported from their modules when first used (PEP 562): ``from tirbyoc
# import kernels`` (the kernel library alone, for a process that only calls kernels) then
# imports no TVM, which took 1.5-2 s of the 2 s such a process spent starting.
_PUBLIC = {
    "api": ("Report", "apply_tir_byoc", "compile", "explain", "host_target",
            "offload_prim_func", "offloaded_kernels", "pipeline", "run"),
    "graph": ("RegionCall", "constant_weights", "partition", "relax_patterns"),
    "builtin": ("builtin",),
    "checking": ("check",),
    "library": ("Kernel", "Library", "LibraryError"),
    "schedule_rule": ("ScheduleRule",),
    "tensorize": ("dense_intrin", "tensorize_dense"),
    "tuning": ("tune",),
    "torch_frontend": ("fold_constant_items", "from_exported_program", "torch_converters"),
    "onnx_frontend": ("UnsupportedNode", "from_onnx"),
}
_HOME = {name: module for module, names in _PUBLIC.items() for name in names}
__all__ = [*_HOME, "ops"]

# Bound now, not on first use: the name is also its module's, and the first import of
# that module (by anything) would set the package's attribute to the module itself.
from .builtin import builtin  # noqa: E402  (no TVM: the declarations only)

if TYPE_CHECKING:  # what the names are, for type checkers and editors
    from . import ops
    from .api import (Report, apply_tir_byoc, compile, explain, host_target,
                      offload_prim_func, offloaded_kernels, pipeline, run)
    from .checking import check
    from .graph import RegionCall, constant_weights, partition, relax_patterns
    from .library import Kernel, Library, LibraryError
    from .onnx_frontend import UnsupportedNode, from_onnx
    from .schedule_rule import ScheduleRule
    from .tensorize import dense_intrin, tensorize_dense
    from .torch_frontend import fold_constant_items, from_exported_program, torch_converters
    from .tuning import tune


def __getattr__(name):
    module = _HOME.get(name)
    if module is None:
        # a submodule (``tirbyoc.ops``, ``tirbyoc.kernels``, ...), as after an eager import
        if not name.startswith("_") and _find_spec(f"{__name__}.{name}") is not None:
            return _import_module(f".{name}", __name__)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_import_module(f".{module}", __name__), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))

