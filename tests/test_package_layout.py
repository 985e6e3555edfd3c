"""The package's shape: imports flow one way, and every family registration resolves."""

import ast
import pathlib

import pytest

from tirbyoc import ops

PACKAGE = pathlib.Path(__file__).parent.parent / "tirbyoc"


def _imports() -> dict:
    """``{module: {modules of the package it imports}}``, deferred imports included."""
    names = {p.stem for p in PACKAGE.glob("*.py")}
    out = {}
    for path in PACKAGE.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    deps.add(node.module.split(".")[0])
                else:
                    deps.update(a.name for a in node.names)
        out[path.stem] = {d for d in deps if d in names and d != path.stem}
    return out


def _cycle(graph):
    """One import cycle as a list of modules, or None."""
    state, stack = {}, []

    def visit(v):
        state[v] = 1
        stack.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state:
                found = visit(w)
                if found:
                    return found
        state[v] = 2
        stack.pop()
        return None

    for v in sorted(graph):
        if v not in state:
            found = visit(v)
            if found:
                return found
    return None


def test_no_import_cycles():
    graph = _imports()
    assert len(graph) > 30
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


@pytest.mark.parametrize("name", ops.families())
def test_family_registrations_resolve(name):
    family = ops.family(name)
    for path in (family.stage, family.checker):
        if path is not None:
            assert callable(ops.resolve(path)), path
    assert family.stage is not None or name in ("dense", "matmul")  # the TIR matcher's


def test_public_names_load_when_used_and_the_kernels_alone_import_no_tvm():
    """``tirbyoc``'s names come from their modules on first use, each the module's own
    object; a process that only calls kernels imports neither TVM nor PyTorch."""
    import importlib
    import subprocess
    import sys

    import tirbyoc

    importlib.import_module("tirbyoc.builtin")  # the module named like a public name
    for name in tirbyoc.__all__:
        if name == "ops":  # the submodule itself
            continue
        home = tirbyoc._HOME.get(name)
        assert home is not None, name
        assert getattr(tirbyoc, name) is getattr(importlib.import_module(f"tirbyoc.{home}"),
                                                 name), name
    assert tirbyoc.ops is ops and set(tirbyoc.__all__) <= set(dir(tirbyoc))
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        tirbyoc.no_such_name  # noqa: B018
    code = ("import sys\nfrom tirbyoc import kernels\nkernels.load()\n"
            "print(sorted(m for m in ('tvm', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=PACKAGE.parent, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
