"""The ordered registry of intrinsics: the first one that matches a region wins.

Longer fusions come first so that ``dense + bias + relu`` is one call, not three.
Adding an intrinsic: a new file here that builds ``tirbyoc.intrinsic.Intrinsic`` values,
listed in ``REGISTRY`` below, and its C function in ``kernels/``.
"""

from . import dense, dense_relu6, matmul

# NOTE: a stable sort keeps each file's order among fusions of the same length. The chain
# intrinsic comes first: it reads the longest run of epilogue operations, and leaves a run
# that a fixed intrinsic computes exactly (on a 2-D weight) to that one.
REGISTRY = [*matmul.INTRINSICS] + sorted([*dense.INTRINSICS, *dense_relu6.INTRINSICS],
                                         key=lambda i: -len(i.epilogue))


def by_name(name: str):
    """The registered intrinsic called ``name``."""
    for intr in REGISTRY:
        if intr.name == name:
            return intr
    raise KeyError(f"no intrinsic named {name!r}; registered: {[i.name for i in REGISTRY]}")
