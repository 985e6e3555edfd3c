"""The built-in library's TIR matchers, one file per family: what block pattern each
accepts, the kernel symbol it calls (``nt`` / ``nn`` / ``packed`` variants), the argument
mapping and a numpy reference.

They are registered where every kernel is: ``tirbyoc/builtin.py`` declares each built-in
kernel with ``tirbyoc.Library.kernel`` and names its intrinsic as the ``matcher``; the
order of those declarations is the order the TIR matcher tries them (the first that
matches a region wins). ``REGISTRY`` is that order, read from the declarations.
"""

from . import dense, dense_relu6, matmul  # noqa: F401 (the family files)


def __getattr__(name):
    if name == "REGISTRY":
        from tirbyoc.schedule_rule import builtin_intrinsics

        return builtin_intrinsics()
    raise AttributeError(name)


def by_name(name: str):
    """The registered intrinsic called ``name``."""
    from tirbyoc.schedule_rule import builtin_intrinsics

    registry = builtin_intrinsics()
    for intr in registry:
        if intr.name == name:
            return intr
    raise KeyError(f"no intrinsic named {name!r}; registered: {[i.name for i in registry]}")
