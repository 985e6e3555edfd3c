"""The C kernels under sanitizers: tests/sanitize/kernel_driver.c is compiled
together with the kernel sources and run.

* AddressSanitizer + UndefinedBehaviorSanitizer (with LeakSanitizer), every
  report fatal: the whole driver ("all": every kernel on every ISA, tile and
  block edges, each algorithm path, multi-threaded and concurrent calls,
  K == 0, empty matrices, invalid arguments).
* ThreadSanitizer: the multi-threaded and concurrent part ("threads"), for
  data races in the worker pool and the settings.
* The cffi extension built with TIRBYOC_SANITIZE=address,undefined into a
  temporary directory (docs/kernels.md, "Sanitizers and fuzzing"), with
  the first fuzz cases of every kernel run against it under ASan.

Sources, include directories and flags come from tirbyoc/_build_kernels.py
(KERNEL_SOURCES, INCLUDE_DIRS, BASE_COMPILE_ARGS, sanitizer_flags), so a new
kernel file and the flags the package uses are picked up here too. A test
passes only if the driver exits with 0 and prints its summary line with no
failures, a plausible number of checks and every ISA this CPU has. Each is
skipped, with the reason, when gcc or that sanitizer's runtime is missing.
"""

import os
import re
import runpy
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tirbyoc import kernels

from .fresh import without_torch

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "tests" / "sanitize" / "kernel_driver.c"
BUILD = runpy.run_path(str(ROOT / "tirbyoc" / "_build_kernels.py"))
GCC = shutil.which("gcc")

# Exported functions the driver need not call, and why.
NOT_IN_DRIVER = {
    "tirbyoc_status_string": "describes a status code: no memory or threads to check",
}
SUMMARY = re.compile(r"^kernel_driver: mode=(\w+) isas=(\S+) kernels=(\d+) checks=(\d+) "
                     r"failures=(\d+)$", re.M)
# Sanitizer options: stop at the first report, with a non-zero exit status.
RUN_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1:detect_stack_use_after_return=1",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
    "TSAN_OPTIONS": "halt_on_error=1:second_deadlock_stack=1",
    # the pool at the driver's counts (up to 64 threads), whatever the CPUs here
    "TIRBYOC_OVERSUBSCRIBE": "1",
}


def _child_env():
    env = {key: value for key, value in os.environ.items()
           if key not in ("LD_PRELOAD", "TIRBYOC_ISA", "TIRBYOC_NUM_THREADS")}
    env.update(RUN_ENV)
    return env


def _run(cmd, cwd, timeout=300):
    return subprocess.run(cmd, cwd=cwd, env=_child_env(), capture_output=True, text=True,
                          timeout=timeout)


def _require_sanitizer(tmp_path, sanitizers):
    """Skips the test unless gcc builds and runs a threaded program with these sanitizers."""
    if GCC is None:
        pytest.skip("gcc not found")
    probe = tmp_path / "probe.c"
    probe.write_text("#include <pthread.h>\n"
                     "static void *run(void *p) { return p; }\n"
                     "int main(void) { pthread_t t; pthread_create(&t, 0, run, 0);"
                     " return pthread_join(t, 0); }\n")
    cflags, lflags = BUILD["sanitizer_flags"](sanitizers)
    built = _run([GCC, *cflags, *lflags, str(probe), "-o", str(tmp_path / "probe"), "-pthread"],
                 tmp_path)
    ran = _run([str(tmp_path / "probe")], tmp_path) if built.returncode == 0 else built
    if ran.returncode != 0:
        pytest.skip(f"-fsanitize={sanitizers} unavailable here: {(ran.stderr or ran.stdout)[-500:]}")


def build_driver(tmp_path, sanitizers, kernel_objects=None):
    """Compiles the kernels and the driver with the package's flags plus
    ``sanitizers`` (one object per file, in parallel), or only the driver where
    ``kernel_objects`` (the kernels built so already) are given; returns the
    executable."""
    _require_sanitizer(tmp_path, sanitizers)
    cflags, lflags = BUILD["sanitizer_flags"](sanitizers)
    includes = [f"-I{ROOT / inc}" for inc in BUILD["INCLUDE_DIRS"]]
    flags = [*BUILD["BASE_COMPILE_ARGS"], *cflags, *includes]
    sources = [DRIVER] + ([] if kernel_objects else
                          [ROOT / src for src in BUILD["KERNEL_SOURCES"]])

    def compile_one(src):
        obj = tmp_path / f"{src.stem}.o"
        extra = ["-Wall", "-Wextra"] if src == DRIVER else []
        result = _run([GCC, *flags, *extra, "-c", str(src), "-o", str(obj)], tmp_path)
        assert result.returncode == 0, f"compiling {src.name} failed:\n{result.stderr}"
        return obj

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        objects = list(pool.map(compile_one, sources)) + list(kernel_objects or [])
    exe = tmp_path / "kernel_driver"
    result = _run([GCC, *lflags, *map(str, objects), "-o", str(exe), "-lm", "-pthread"], tmp_path)
    assert result.returncode == 0, f"linking failed:\n{result.stderr}"
    return exe


def run_driver(exe, mode, min_checks):
    """Runs the driver; asserts a clean exit and its summary; returns (checks, seconds)."""
    start = time.perf_counter()
    result = _run([str(exe), mode], exe.parent)
    seconds = time.perf_counter() - start
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"kernel_driver {mode} exited with {result.returncode}:\n" \
        f"{output[-6000:]}"
    match = SUMMARY.search(result.stdout)
    assert match, f"no summary line from kernel_driver {mode}:\n{output[-3000:]}"
    got_mode, isas, _, checks, failures = match.groups()
    assert got_mode == mode and int(failures) == 0
    assert isas.split(",") == kernels.available_isas()
    assert int(checks) >= min_checks, f"only {checks} checks ran"
    return int(checks), seconds


def test_driver_names_every_exported_function():
    """A new kernel must be added to the driver's table (or listed above)."""
    text = DRIVER.read_text()
    missing = [symbol for symbol in kernels.exported_symbols()
               if symbol not in NOT_IN_DRIVER and not re.search(rf"\b{symbol}\b", text)]
    assert not missing, f"not exercised by {DRIVER.name}: {missing}"


def _runtime(name):
    """Full path of a gcc runtime library, or None."""
    path = subprocess.run([GCC, f"-print-file-name={name}"], capture_output=True,
                          text=True).stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


@pytest.fixture(scope="module")
def asan_extension(tmp_path_factory):
    """The documented recipe's ASan+UBSan extension, built out of tree once:
    (extension path, its kernel objects, build seconds). The ASan+UBSan driver
    links the same objects, so they are compiled once for both tests."""
    tmp_path = tmp_path_factory.mktemp("asan")
    _require_sanitizer(tmp_path, "address,undefined")
    start = time.perf_counter()
    env = {**_child_env(), BUILD["SANITIZE_ENV"]: "address,undefined"}
    built = subprocess.run([sys.executable, str(ROOT / "tirbyoc" / "_build_kernels.py"),
                            "--outdir", str(tmp_path / "build")],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    extension = Path(built.stdout.strip().splitlines()[-1])
    assert extension.is_file() and extension.parent.parent == tmp_path / "build"
    objects = []
    for src in BUILD["KERNEL_SOURCES"]:
        found = list((tmp_path / "build").rglob(f"kernels/{Path(src).stem}.o"))
        assert len(found) == 1, (src, found)
        objects += found
    return extension, objects, time.perf_counter() - start


@pytest.mark.parametrize("label,sanitizers,mode,min_checks", [
    ("ASan+UBSan", "address,undefined", "all", 20000),  # every path, every kernel
    ("TSan", "thread", "threads", 500),  # the pool and concurrent callers
], ids=["address-undefined", "thread"])
def test_sanitized_driver(request, tmp_path, report_lines, label, sanitizers, mode,
                          min_checks):
    if sanitizers == "address,undefined":
        _, objects, built = request.getfixturevalue("asan_extension")
        start = time.perf_counter()
        exe = build_driver(tmp_path, sanitizers, objects)
        built += time.perf_counter() - start  # (the kernels' objects counted once)
    else:
        start = time.perf_counter()
        exe = build_driver(tmp_path, sanitizers)
        built = time.perf_counter() - start
    checks, seconds = run_driver(exe, mode, min_checks=min_checks)
    report_lines.append(f"{label} kernel_driver {mode}: {checks} checks, 0 failures "
                        f"(build {built:.1f} s, run {seconds:.1f} s)")


def test_sanitize_environment_variable(monkeypatch):
    flags = BUILD["sanitizer_flags"]
    assert flags("") == ([], []) and flags(" , ") == ([], [])
    compile_args, link_args = flags("address, undefined")
    assert compile_args[0] == "-fsanitize=address,undefined" and link_args == [compile_args[0]]
    assert {"-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g1", "-O1",
            "-fira-region=one"} <= set(compile_args)
    assert {"-O2", "-g1"} <= set(flags("thread")[0]) and "-O1" not in flags("thread")[0]
    assert ("-DTIRBYOC_NO_AVX512" in compile_args) == (not BUILD["cpu_has_avx512"]())
    for bad in ("address -o /tmp/x", "address;true", "-O0"):
        with pytest.raises(ValueError):
            flags(bad)
    # The variable reaches both artifacts' flags (setup.py reads EXTRA_COMPILE_ARGS too).
    monkeypatch.setenv(BUILD["SANITIZE_ENV"], "address,undefined")
    build = runpy.run_path(str(ROOT / "tirbyoc" / "_build_kernels.py"))
    assert build["EXTRA_COMPILE_ARGS"] == build["BASE_COMPILE_ARGS"] + compile_args
    assert build["EXTRA_LINK_ARGS"] == link_args
    monkeypatch.delenv(BUILD["SANITIZE_ENV"])
    assert runpy.run_path(str(ROOT / "tirbyoc" / "_build_kernels.py"))["EXTRA_LINK_ARGS"] == []


def test_sanitized_extension_runs_fuzz_cases(asan_extension, report_lines):
    """The documented recipe: a sanitized extension built out of tree, the fuzz
    tests pointed at it (TIRBYOC_FUZZ_LIB) with the ASan runtime preloaded.
    25 cases per kernel and ISA: every pinned shape of the fuzz tests."""
    preload = [_runtime("libasan.so"), _runtime("libstdc++.so")]
    if None in preload:
        pytest.skip("libasan.so or libstdc++.so not found next to gcc")
    extension, _, build_seconds = asan_extension

    env = {**_child_env(), "LD_PRELOAD": " ".join(preload), "TIRBYOC_FUZZ_LIB": str(extension),
           "TIRBYOC_FUZZ_CASES": "25",
           # The interpreter itself does not free everything at exit.
           "ASAN_OPTIONS": RUN_ENV["ASAN_OPTIONS"].replace("detect_leaks=1", "detect_leaks=0")}
    start = time.perf_counter()
    # (PyTorch hidden: the fuzz tests do not use it, and importing it under ASan is slow)
    run = subprocess.run([sys.executable, "-c", without_torch(
                              "import pytest\nsys.exit(pytest.main(sys.argv[1:]))\n"),
                          "-q", "-p", "no:cacheprovider",
                          str(ROOT / "tests" / "test_kernel_fuzz.py")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - start
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    figures = re.search(r"kernel fuzz: (\d+) cases, 0 failed.*library (\S+)\)", run.stdout)
    assert figures and figures.group(2) == str(extension), run.stdout[-3000:]
    assert int(figures.group(1)) >= 25 * len(kernels.available_isas())
    report_lines.append(f"ASan+UBSan cffi extension: {figures.group(1)} fuzz cases, 0 failures "
                        f"(build {build_seconds:.1f} s, run {seconds:.1f} s)")
