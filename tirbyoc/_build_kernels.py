"""cffi (out-of-line, API mode) builder for the tirbyoc C kernel library.

setup.py hands ``ffibuilder`` to cffi through ``cffi_modules``; it also reads
``KERNEL_SOURCES``, ``INCLUDE_DIRS`` and ``EXTRA_COMPILE_ARGS`` from here so
that the cffi extension and the relocatable object linked by TVM are always
built from the same sources with the same flags.

The declarations handed to ``cdef`` come from the block between
``/* BEGIN CDEF */`` and ``/* END CDEF */`` in ``kernels/tirbyoc_kernels.h``,
so the header stays the single source of truth for the exported ABI.

Run ``python tirbyoc/_build_kernels.py`` to build the extension in place
without pip (handy while iterating on the C code).
"""

import os
import re

import cffi

# Paths are relative to the project root: setuptools wants relative source
# paths, and pip runs setup.py from the project root.
HEADER = "kernels/tirbyoc_kernels.h"
# Every C file of the kernel library; add new kernel files here.
KERNEL_SOURCES = [
    "kernels/dense_f32.c",
    "kernels/dense_f32_generic.c",
    "kernels/dense_f32_avx2.c",
    "kernels/dense_f32_avx512.c",
    "kernels/dispatch.c",
    "kernels/threads.c",
]
INCLUDE_DIRS = ["kernels"]
# Appended after Python's own CFLAGS, so these win. -fno-wrapv undoes the
# -fwrapv that CPython builds with: the kernels never rely on signed
# overflow, and assuming it cannot happen makes their loops ~20% faster.
EXTRA_COMPILE_ARGS = ["-O3", "-std=c99", "-fno-wrapv"]

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


ffibuilder = cffi.FFI()
ffibuilder.cdef(read_cdef())
ffibuilder.set_source(
    "tirbyoc._kernels",
    '#include "tirbyoc_kernels.h"',
    sources=list(KERNEL_SOURCES),
    include_dirs=list(INCLUDE_DIRS),
    extra_compile_args=list(EXTRA_COMPILE_ARGS),
    depends=[HEADER, "kernels/dense_f32_internal.h"],
)


if __name__ == "__main__":
    # Relative source paths above are resolved against the project root.
    os.chdir(_ROOT)
    ffibuilder.compile(verbose=True)
