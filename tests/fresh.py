"""Code for the tests' fresh interpreters.

TVM's FFI package imports PyTorch whenever it is installed (about 2,000 modules, 4-6 s of
a 2-core machine's time per process). A process that only loads a compiled library, or
asks the kernel library something, does not use it; so the tests' children start with
``WITHOUT_TORCH``, which makes that import fail as if PyTorch were not installed. That
also shows that running a compiled model does not need PyTorch.
"""

WITHOUT_TORCH = "import sys; sys.modules.setdefault('torch', None)\n"


def without_torch(code: str) -> str:
    """``code`` (already dedented) run with PyTorch hidden from imports."""
    return WITHOUT_TORCH + code
