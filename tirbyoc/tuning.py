"""MetaSchedule tuning of what tirbyoc leaves to TVM.

>>> db = tirbyoc.tune(offloaded, target, work_dir, max_trials_global=64)
>>> with target, db, tvm.transform.PassContext(opt_level=3):
...     tuned = relax.transform.MetaScheduleApplyDatabase()(offloaded)

``tune`` is ``tune_relax`` with two differences:

- Functions that call a kernel are not tuning tasks: there is nothing of them for
  MetaSchedule to schedule, and their trials cannot run (the builder's shared library does
  not carry the kernels).
- The tensor intrinsics MetaSchedule imports in every process (``tvm.s_tir.tensor_intrin``,
  in ``TuneContext`` and in the builder's workers) are only the CPUs' ones
  (:func:`import_tensor_intrinsics`), imported with a cheap ``inspect.stack``.
  TVMScript's ``prim_func`` decorator calls ``inspect.stack()`` for each of the several
  hundred intrinsics; with PyTorch installed, ``import tvm`` loads about 2,000 modules
  (through ``tvm_ffi``), and ``inspect`` scans all of them for each frame of the import
  machinery: the import took 84 s (AMD EPYC, Python 3.11), and ``LocalBuilder``, which
  starts fresh workers for every batch, timed out (30 s) on every candidate, so that
  ``tune_relax`` tuned nothing. With the cheap stack all of them took about 6 s, the
  CPUs' ones take 0.6 s.
"""

import contextlib
import inspect
import linecache
import sys

from .api import offloaded_kernels


def _cheap_stack(context=1):
    """``inspect.stack()`` without the module search: each frame's file, line, function
    and (for files on disk) its source line, all TVMScript's decorators read."""
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        line = linecache.getline(code.co_filename, frame.f_lineno) if context > 0 else ""
        frames.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name,
                                        [line] if line else None, 0 if line else None))
        frame = frame.f_back
    return frames


@contextlib.contextmanager
def cheap_inspect_stack():
    """``inspect.stack`` is the cheap stack inside: for parsing TVMScript, whose
    ``prim_func`` decorator calls it once per function (in a pytest run, about 60 frames
    deep, each parse spent 0.17 s there)."""
    saved = inspect.stack
    inspect.stack = _cheap_stack
    try:
        yield
    finally:
        inspect.stack = saved


# The CPUs' tensor intrinsics: those MetaSchedule's rules for an LLVM target use.
CPU_INTRINSICS = ("x86", "arm_cpu", "riscv_cpu")


def import_tensor_intrinsics():
    """Register the CPUs' tensor intrinsics (``tvm.s_tir.tensor_intrin``'s x86, Arm and
    RISC-V modules) with the cheap stack; a no-op once that package is imported. Also the
    builder workers' initializer.

    The package's own ``__init__`` also parses the GPU ones (CUDA's alone 1,758 lines of
    TVMScript: 4.6 of the 5.2 s of the import, 11 of 15 s inside pytest), which no CPU
    target uses. So the package is entered in ``sys.modules`` without running it, and only
    the CPU modules are imported into it: MetaSchedule's own ``import
    tvm.s_tir.tensor_intrin`` (``TuneContext``, the builder's workers) then finds it. A
    GPU's intrinsics in the same process need their module imported by name
    (``import tvm.s_tir.tensor_intrin.cuda``); without it ``TensorIntrin.get`` raises."""
    name = "tvm.s_tir.tensor_intrin"
    if name in sys.modules:
        return
    import importlib
    import importlib.util

    spec = importlib.util.find_spec(name)
    sys.modules[name] = importlib.util.module_from_spec(spec)
    with cheap_inspect_stack():
        for module in CPU_INTRINSICS:
            importlib.import_module(f"{name}.{module}")


def builder(**kwargs):
    """A MetaSchedule ``LocalBuilder`` whose workers import the intrinsics with the cheap
    stack."""
    from tvm.s_tir import meta_schedule as ms

    return ms.builder.LocalBuilder(initializer=import_tensor_intrinsics, **kwargs)


def tuning_tasks(mod, target, params=None):
    """MetaSchedule's extracted tasks of ``mod`` without the functions that call kernels."""
    from tvm.s_tir import meta_schedule as ms

    tasks = ms.relax_integration.extract_tasks(mod, target, params)
    return [t for t in tasks if not offloaded_kernels(t.mod)]


def tune(mod, target, work_dir: str, max_trials_global: int, *, params=None,
         space="post-order-apply", strategy="evolutionary", seed=None, **kwargs):
    """Tune the PrimFuncs of ``mod`` (a legalized Relax module, after ``apply_tir_byoc``)
    that call no kernel; the rest of the keywords go to ``meta_schedule.tune_tasks``
    (``num_trials_per_iter``, ``runner``, ``cost_model``, ...). Returns the database."""
    from tvm.s_tir import meta_schedule as ms

    import_tensor_intrinsics()
    kwargs.setdefault("builder", builder())
    tasks = tuning_tasks(mod, target, params)
    contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
        extracted_tasks=tasks, work_dir=work_dir, space=space, strategy=strategy, seed=seed)
    return ms.tune.tune_tasks(tasks=contexts, task_weights=weights, work_dir=work_dir,
                              max_trials_global=max_trials_global, **kwargs)
