"""cffi (out-of-line, API mode) builder for the tirbyoc C kernel library.

setup.py hands ``ffibuilder`` to cffi through ``cffi_modules``; it also reads
``KERNEL_SOURCES``, ``INCLUDE_DIRS`` and ``EXTRA_COMPILE_ARGS`` from here so
that the cffi extension and the relocatable object linked by TVM are always
built from the same sources with the same flags.

The declarations handed to ``cdef`` come from the block between
``/* BEGIN CDEF */`` and ``/* END CDEF */`` in ``kernels/tirbyoc_kernels.h``,
so the header stays the single source of truth for the exported ABI.

Run ``python tirbyoc/_build_kernels.py`` to build the extension in place
without pip (handy while iterating on the C code), or with ``--outdir DIR``
to build it into DIR and leave the package's build alone.

``TIRBYOC_SANITIZE`` (e.g. ``address,undefined``) builds both artifacts with
those GCC/Clang sanitizers (see :func:`sanitizer_flags` and the "Sanitizers
and fuzzing" section of ``docs/kernels.md``); unset or empty, the build is
the normal optimized one.
"""

import concurrent.futures
import contextlib
import itertools
import os
import re
import subprocess

import cffi

# Paths are relative to the project root: setuptools wants relative source
# paths, and pip runs setup.py from the project root.
HEADER = "kernels/tirbyoc_kernels.h"
# Every C file of the kernel library; add new kernel files here.
KERNEL_SOURCES = [
    "kernels/dense_f32.c",
    "kernels/attention_f32.c",
    "kernels/conv_f32.c",
    "kernels/conv_winograd_f32.c",
    "kernels/pool_f32.c",
    "kernels/depthwise_f32.c",
    "kernels/dense_f32_generic.c",
    "kernels/dense_f32_avx2.c",
    "kernels/dense_f32_avx512.c",
    "kernels/dispatch.c",
    "kernels/threads.c",
]
INCLUDE_DIRS = ["kernels"]
# Environment variable naming the sanitizers of an instrumented build.
SANITIZE_ENV = "TIRBYOC_SANITIZE"


def sanitizer_flags(sanitizers):
    """(compile args, link args) for a build instrumented with ``sanitizers``,
    a comma-separated list such as ``"address,undefined"`` or ``"thread"``;
    two empty lists for ``""``.

    ``-O1 -g1`` replaces ``-O3`` (a later ``-O`` wins): the sanitizers' own
    advice for usable reports and speed. ``-g1`` (line tables, no variables)
    gives every frame of a report its file and line, as ``-g`` does, and
    compiles about 30% faster (the depthwise file with ASan+UBSan: 31 s
    against 43 s). The SIMD code is written with intrinsics, so it runs the
    same instructions at any level; undefined behaviour that only ``-O3``
    would exploit is what UBSan reports at any level.
    Compile time is the sanitizer runs' cost, and most of it is one file
    (``dense_f32_avx512.c``, its micro-kernels inlined into large
    functions), measured with gcc 12 on a Zen 4: with ASan+UBSan at ``-O1``
    118 s, 70 of them in register allocation over the instrumented stack
    slots; ``-fira-region=one`` (one allocation region per function: only
    how registers are assigned, every check stays) makes it 53 s, whereas
    ``-O2`` makes it 525 s. ThreadSanitizer is the other way round: 99 s at
    ``-O1`` (110 s with ``-fira-region=one``), 42 s at ``-O2``, so a build
    with ``thread`` uses ``-O2``.
    ``-fno-sanitize-recover=all``: the first UBSan report aborts, so a test
    run cannot pass with a report buried in its output.
    On a CPU without AVX-512 (``/proc/cpuinfo``), ``-DTIRBYOC_NO_AVX512`` leaves
    the AVX-512 code out (the kernels then run at most their AVX2 level): it
    cannot run there, so there is nothing of it for a sanitizer to check, and
    it is about half of the build (60 of 110 CPU-seconds with ASan+UBSan on
    Zen 3). A CPU with AVX-512 builds and checks all of it.
    """
    names = [name.strip() for name in sanitizers.split(",") if name.strip()]
    if not names:
        return [], []
    for name in names:
        # Only names: the value must not smuggle other flags into the build.
        if not re.fullmatch(r"[a-z][a-z0-9-]*", name):
            raise ValueError(f"{SANITIZE_ENV}: not a sanitizer name: {name!r}")
    fsanitize = "-fsanitize=" + ",".join(names)
    level = ["-O2"] if "thread" in names else ["-O1", "-fira-region=one"]
    compile_args = [fsanitize, "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", *level,
                    "-g1"]
    if not cpu_has_avx512():
        compile_args.append("-DTIRBYOC_NO_AVX512")
    return compile_args, [fsanitize]


def cpu_has_avx512() -> bool:
    """Whether this CPU (and OS) runs AVX-512: its ``avx512f`` flag in
    ``/proc/cpuinfo``; True where there is no such file (nothing is left out)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return "avx512f" in line.split()
    except OSError:
        pass
    return True


_SANITIZE_COMPILE_ARGS, _SANITIZE_LINK_ARGS = sanitizer_flags(os.environ.get(SANITIZE_ENV, ""))

# Appended after Python's own CFLAGS, so these win. -fno-wrapv undoes the
# -fwrapv that CPython builds with: the kernels never rely on signed
# overflow, and assuming it cannot happen makes their loops ~20% faster.
# -fno-trapping-math: the kernels never read floating-point exception flags;
# without it GCC keeps the selects of the transcendental functions
# (chain_f32.h) as branches for AVX2 and SSE, and their loops scalar.
# -Werror=implicit-function-declaration: under -std=c99 a POSIX or C11
# function whose header does not declare it (posix_memalign without
# _POSIX_C_SOURCE, aligned_alloc) is otherwise only a warning, and a pointer it
# returns is truncated to an int.
BASE_COMPILE_ARGS = ["-O3", "-std=c99", "-fno-wrapv", "-fno-trapping-math",
                     "-Werror=implicit-function-declaration"]
# What the build uses: the base flags, plus the TIRBYOC_SANITIZE ones if set.
EXTRA_COMPILE_ARGS = BASE_COMPILE_ARGS + _SANITIZE_COMPILE_ARGS
# Links the sanitizer runtime into the extension (empty for a normal build).
EXTRA_LINK_ARGS = _SANITIZE_LINK_ARGS

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CDEF_RE = re.compile(r"/\*\s*BEGIN CDEF\s*\*/(.*?)/\*\s*END CDEF\s*\*/", re.S)


def read_cdef(header_path=None):
    """Return the C declarations between the CDEF markers of the header."""
    path = header_path or os.path.join(_ROOT, HEADER)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    match = _CDEF_RE.search(text)
    if match is None:
        raise RuntimeError(f"{path}: no /* BEGIN CDEF */ ... /* END CDEF */ block")
    # cffi's parser does not accept comments everywhere; drop them.
    block = re.sub(r"/\*.*?\*/", " ", match.group(1), flags=re.S)
    block = re.sub(r"//[^\n]*", " ", block)
    if re.search(r"^\s*#", block, re.M):
        raise RuntimeError(f"{path}: preprocessor lines are not allowed in the CDEF block")
    return block


def make_ffibuilder(root=""):
    """The cffi builder of ``tirbyoc._kernels``, with the source and include
    paths relative to ``root`` (``""``: the current directory, which is what
    setuptools wants; an absolute root lets cffi build anywhere)."""
    builder = cffi.FFI()
    builder.cdef(read_cdef())
    builder.set_source(
        "tirbyoc._kernels",
        '#include "tirbyoc_kernels.h"',
        sources=[os.path.join(root, src) for src in KERNEL_SOURCES],
        include_dirs=[os.path.join(root, inc) for inc in INCLUDE_DIRS],
        extra_compile_args=list(EXTRA_COMPILE_ARGS),
        extra_link_args=list(EXTRA_LINK_ARGS),
        depends=[os.path.join(root, dep) for dep in (HEADER, "kernels/dense_f32_internal.h",
                                                       "kernels/chain_f32.h",
                                                       "kernels/transpose_avx512.h",
                                                       "kernels/transpose_avx2.h",
                                                       "kernels/depthwise_c16.h")],
    )
    return builder


ffibuilder = make_ffibuilder()


def compiler_command(compiler):
    """A distutils compiler's command without its flags (it may be "ccache gcc")."""
    return list(itertools.takewhile(lambda arg: not arg.startswith("-"), compiler.compiler_so))


def compiler_problem(command):
    """Why the C compiler ``command`` (a list: the program and any words before its
    flags, e.g. ``["ccache", "gcc"]``) cannot build the kernels, or None if it can.
    They are GCC's C: its vector extensions (``__builtin_shuffle``), its per-function
    and per-region target options and its loop pragmas. Clang and the compilers built
    on it (they define ``__clang__``) stop at the first of these with pages of errors;
    this says so in one line instead."""
    shown = " ".join(command)
    try:
        out = subprocess.run([*command, "-dM", "-E", "-x", "c", os.devnull],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as err:
        return f"the C compiler {shown!r} did not run: {err}"
    if out.returncode != 0:
        return (f"the C compiler {shown!r} failed on an empty file: "
                f"{out.stderr.strip()[:500]}")
    defined = {line.split()[1] for line in out.stdout.splitlines()
               if line.startswith("#define ") and len(line.split()) > 1}
    if "__clang__" in defined or "__GNUC__" not in defined:
        name = "clang" if "__clang__" in defined else "not GCC"
        return (f"tirbyoc's C kernels need GCC (its vector extensions and target "
                f"pragmas); the C compiler {shown!r} is {name}. Install gcc "
                f"and build with CC=gcc.")
    return None


def compile_in_parallel(compiler, sources, output_dir=None, macros=None, include_dirs=None,
                        debug=False, extra_preargs=None, extra_postargs=None, depends=None):
    """``CCompiler.compile`` of setuptools' distutils, with the files compiled at once
    on as many threads as the process has CPUs (distutils compiles one after the
    other: the kernels took 115 s to build on one core of two), the largest first.
    Same arguments, same objects, same commands; first, the check that the compiler
    is GCC (``compiler_problem``)."""
    problem = compiler_problem(compiler_command(compiler))
    if problem is not None:
        raise RuntimeError(problem)
    macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
        output_dir, macros, include_dirs, sources, depends, extra_postargs)
    cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)
    todo = sorted((obj for obj in objects if obj in build),
                  key=lambda obj: -os.path.getsize(build[obj][0]))
    workers = max(1, min(len(todo), len(os.sched_getaffinity(0))
                         if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        # (list: the first failure raises here)
        list(pool.map(lambda obj: compiler._compile(obj, build[obj][0], build[obj][1], cc_args,
                                                    extra_postargs, pp_opts), todo))
    return objects


@contextlib.contextmanager
def parallel_compilers():
    """Every distutils compiler compiles in parallel inside (cffi's out-of-tree
    builds create their own)."""
    import importlib

    # (setuptools' copy of distutils can be loaded under two names; cffi uses one)
    bases = {importlib.import_module(name).CCompiler
             for name in ("distutils.ccompiler", "setuptools._distutils.ccompiler")}
    saved = {base: base.compile for base in bases}
    for base in bases:
        base.compile = compile_in_parallel
    try:
        yield
    finally:
        for base, compile_files in saved.items():
            base.compile = compile_files


def build_out_of_tree(outdir):
    """Build the extension into ``outdir`` (objects included), leaving the
    package's own build untouched; returns the path of the extension."""
    # cffi builds from inside its tmpdir, hence absolute source paths.
    with parallel_compilers():
        return make_ffibuilder(_ROOT).compile(tmpdir=os.path.abspath(outdir), verbose=True)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Build the cffi kernel extension.")
    parser.add_argument("--outdir", help="build into this directory instead of in place "
                        "(e.g. a sanitized build next to the installed one)")
    options = parser.parse_args()
    if options.outdir:
        print(build_out_of_tree(options.outdir))
    else:
        # Relative source paths above are resolved against the project root.
        os.chdir(_ROOT)
        with parallel_compilers():
            ffibuilder.compile(verbose=True)
