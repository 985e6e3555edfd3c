"""Shared pytest plumbing: figures that tests report at the end of a run.

A test takes the ``report_lines`` fixture and appends lines to it; they are
printed in a "tirbyoc reliability figures" section of the terminal summary
(also with ``-q``), so long fuzz or sanitizer runs leave their numbers
(cases per kernel and instruction set, checks, times) in the log.

The lines travel as the test report's ``user_properties``, so they reach the
summary also when pytest-xdist runs the tests in worker processes.
"""

import os
import sys
import zlib

import pytest

# The kernel pool runs at most as many threads at once as this process has CPUs, unless
# told otherwise: the tests' thread counts (up to 64) run as many pool threads on any
# machine. Set before any test loads the library; child processes inherit it.
os.environ.setdefault("TIRBYOC_OVERSUBSCRIBE", "1")


@pytest.fixture(autouse=True)
def _same_inputs_in_every_run(request):
    """Seeds the global generators (numpy's legacy one and, where loaded, PyTorch's) from
    the test's id before each test: a test that draws from them gets the same inputs
    whatever ran before it in its worker process (pytest-xdist hands files to workers
    in a different order each run)."""
    seed = zlib.crc32(request.node.nodeid.encode())
    import numpy as np

    np.random.seed(seed)
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "manual_seed"):
        torch.manual_seed(seed)


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session):
    """Test modules parse their TVMScript at import, each ``prim_func`` with an
    ``inspect.stack()`` that searched 2,000 modules per frame (tests/tir_forms.py alone
    took 12 s): collected with the cheap stack, which gives TVMScript the same frames
    (tests/test_tuning.py). The tests themselves run with the real one."""
    from tirbyoc.tuning import cheap_inspect_stack

    with cheap_inspect_stack():
        yield


# The longest test files first, longest first (seconds of one worker in a run with
# --durations=0 on a 2-core Zen 3: sanitizers 184, conv 123, fixups 108, frontends 85,
# bench_models 66, then 46 down to 21; the remaining files take 17 s or less): pytest-xdist
# hands each file to one worker (--dist loadfile) in this order, so the last files to
# start are short and the two workers finish together. The sanitizer builds and runs,
# started last, once kept one worker busy for minutes after the other had finished.
SLOW_FILES_FIRST = ("test_sanitizers.py", "test_conv.py", "test_fixups.py",
                    "test_frontends.py", "test_bench_models.py", "test_matcher_fuzz.py",
                    "test_transformers.py", "test_byo.py", "test_fallback.py",
                    "test_notebook.py", "test_onnx_frontend.py", "test_bench_layers.py",
                    "test_kernels.py", "test_kernel_fuzz.py", "test_moe.py",
                    "test_thread_counts_models.py", "test_reliability.py", "test_tuning.py")


def pytest_configure(config):
    """pytest-xdist (3.6 on) sorts the files by their number of tests, most first,
    unless told not to: the sanitizer file, five long tests, then started last."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):  # noqa: ARG001 (pytest's signature)
    """The files of SLOW_FILES_FIRST first, in that order; each file's tests, and the
    other files, keep their order."""
    rank = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(os.path.basename(str(item.fspath)),
                                         len(SLOW_FILES_FIRST)))


_KEY = "tirbyoc_figure"
_lines: list = []  # collected in this process (the controller, under xdist)


class _Figures:
    """``append(line)`` adds a line to the current test's report."""

    def __init__(self, node):
        self._node = node

    def append(self, line: str):
        self._node.user_properties.append((_KEY, str(line)))


@pytest.fixture
def report_lines(request):
    """Lines for the terminal summary of this run."""
    return _Figures(request.node)


def pytest_runtest_logreport(report):
    if report.when == "teardown":  # once per test, with everything the test appended
        _lines.extend(value for key, value in report.user_properties if key == _KEY)


def pytest_terminal_summary(terminalreporter):
    if _lines:
        terminalreporter.section("tirbyoc reliability figures")
        for line in _lines:
            terminalreporter.write_line(line)


@pytest.fixture(params=None)
def isa(request):
    """Runs the test with each instruction set this CPU has active, then restores it."""
    from tirbyoc import kernels

    saved = kernels.isa()
    kernels.set_isa(request.param)
    yield request.param
    kernels.set_isa(saved)


def pytest_generate_tests(metafunc):
    """Parametrizes the ``isa`` fixture over ``tirbyoc.kernels.available_isas()``."""
    if "isa" in metafunc.fixturenames:
        from tirbyoc import kernels

        metafunc.parametrize("isa", kernels.available_isas(), indirect=True)
