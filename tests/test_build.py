"""The kernel build's check of the C compiler (tirbyoc/_build_kernels.py): the kernels
are GCC's C, and any other compiler is named in one line before anything compiles."""

import os
import runpy
import shutil
import stat
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD = runpy.run_path(str(ROOT / "tirbyoc" / "_build_kernels.py"))


def _script(tmp_path, name, body):
    """An executable shell script of this body; its path."""
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _fake_compiler(tmp_path, name, defines):
    """A program that prints these macro definitions for ``-dM -E``, as a compiler
    does."""
    return _script(tmp_path, name, "".join(f"echo '#define {macro} 1'\n" for macro in defines))


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc on PATH")
def test_gcc_builds_the_kernels():
    assert BUILD["compiler_problem"](["gcc"]) is None


def test_clang_and_other_compilers_are_named_before_anything_compiles(tmp_path):
    problem = BUILD["compiler_problem"]
    clang = _fake_compiler(tmp_path, "clang", ["__clang__", "__GNUC__", "__x86_64__"])
    said = problem([clang])
    assert said is not None and "is clang" in said and "CC=gcc" in said
    other = _fake_compiler(tmp_path, "othercc", ["__STDC__", "__x86_64__"])
    assert "is not GCC" in problem([other])
    gnu = _fake_compiler(tmp_path, "gnucc", ["__GNUC__", "__x86_64__"])
    assert problem([gnu]) is None
    missing = str(tmp_path / "no-such-cc")
    assert "did not run" in problem([missing])
    failing = _script(tmp_path, "failcc", "echo 'cannot preprocess' >&2\nexit 1\n")
    assert "failed on an empty file: cannot preprocess" in problem([failing])

    # the parallel compile stops on it, before the first file: the source does not exist
    from setuptools._distutils.ccompiler import new_compiler

    compiler = new_compiler()
    compiler.compiler_so = [clang, "-O2", "-fPIC"]
    with pytest.raises(RuntimeError, match="need GCC"):
        BUILD["compile_in_parallel"](compiler, [os.path.join(tmp_path, "absent.c")],
                                     output_dir=str(tmp_path))
