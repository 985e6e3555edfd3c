"""Calling a kernel of the built-in library from TIR: the status checks every call site
runs (a leaf module: the matcher's rewrite and every graph-level family use it)."""

from __future__ import annotations

from . import _tvm as T


def status_checks(symbol: str, call):
    """``status = call`` then one assertion per error status, each raising a RuntimeError
    that names the kernel and the reason (the library's own ``tirbyoc_status_string``)."""
    from . import kernels

    status = T.Var("status", "int32")
    checks = [T.assert_stmt(status != T.const(code, "int32"),
                            f"tirbyoc: kernel {symbol} failed: {reason}")
              for code, reason in kernels.error_statuses().items()]
    checks.append(T.assert_stmt(status == T.const(kernels.TIRBYOC_OK, "int32"),
                                f"tirbyoc: kernel {symbol} failed: unknown status"))
    return T.seq([T.bind(status, call)] + checks)
