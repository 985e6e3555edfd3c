"""The built-in kernel library, declared through the same API as a user's.

``tirbyoc.builtin`` is a ``tirbyoc.Library`` named ``tirbyoc``: its C code is the package's
own kernel library (``kernels/``, built by ``pip install``), its declarations are read
from the compiled library (cffi's view of ``kernels/tirbyoc_kernels.h``), and every kernel
the pipeline calls is declared below with ``kernel(symbol, computes=ops..., args=...)``:
what it computes and what each argument stands for, checked against its prototype like
any library's, and testable with ``tirbyoc.check(tirbyoc.builtin)``.

What a role cannot say is in the ``matcher`` of a declaration: the TIR matcher's
``Intrinsic`` (``intrinsics/``) for the matrix kernels, which also picks the ``nt`` /
``nn`` / ``packed`` variant of a symbol and reads a batched matmul's epilogue chain into
the code ``tirbyoc_matmul_f32`` takes; the graph-level rewrite of its family for the
convolution, pooling, softmax and attention kernels, which also choose the packed,
Winograd and NCHW16c entry points (``tirbyoc.conv``). The pipeline asks the registry
(``tirbyoc.registry``), which takes these matchers from the declarations, in the order
they are declared here, after the user's libraries.
"""

from __future__ import annotations

from . import ops
from .library import Library, Prototype, _classify
from .ops import const

NAME = "tirbyoc"


class BuiltinLibrary(Library):
    """The package's kernel library (see the module docstring)."""

    def __init__(self):  # noqa: D107 (no sources: the package builds them)
        self.name = NAME
        self.sources, self.libraries, self.include_dirs = [], [], []
        self.extra_compile_args, self._build_dir, self.cdef = [], None, ""
        self._kernels, self._declared = [], False
        self._prototypes = None
        import threading

        self._lock = threading.Lock()

    @property
    def kernels(self) -> list:
        """The declared kernels (declared on first use: reading the prototypes needs the
        compiled library, which ``import tirbyoc`` does not)."""
        if not self._declared:
            self._declared = True
            _declare()
        return self._kernels

    @property
    def prototypes(self) -> dict:
        if self._prototypes is None:
            self._prototypes = _prototypes()
        return self._prototypes

    @prototypes.setter
    def prototypes(self, value):
        self._prototypes = value

    @property
    def forwards(self) -> bool:
        return False

    def build(self) -> dict:
        from . import _kernels, kernels

        return {"object": kernels.static_library_path(), "shared": _kernels.__file__}

    def static_module(self):
        from . import kernels

        return kernels.static_library()

    def make_symbols_global(self):
        from . import kernels

        return kernels.make_symbols_global()

    def ffi(self):
        from . import kernels

        return kernels.load()


def _prototypes() -> dict:
    """Every exported function's prototype, from the compiled library's cffi types."""
    from . import kernels
    from .library import CType

    ffi, lib = kernels.load()
    out = {}
    for name in kernels.exported_symbols():
        fn = ffi.typeof(getattr(lib, name))
        params = []
        for arg in fn.args:
            if arg.kind == "pointer":
                element = _classify(arg.item.cname, True).element \
                    if arg.item.kind == "primitive" else "pointer"
                params.append(CType(arg.cname, "pointer", 64, element))
            else:
                params.append(_classify(arg.cname, False))
        result = _classify(fn.result.cname, False) if fn.result.kind != "void" else \
            CType("void", "void")
        out[name] = Prototype(name, result, tuple(params), None)
    return out


builtin = BuiltinLibrary()


def _declare():
    from intrinsics import dense as dense_family
    from intrinsics import dense_relu6, matmul

    from . import attention, conv, kernels, pool, softmax

    # ---- matrices, matched in TIR: the chain intrinsic first (it leaves a run that a
    # fixed intrinsic computes exactly to that one), then longer fusions first ----
    mm = ("batch", "m", "n", "k", "x", "lda", "batch_stride_x", "weight", "ldw",
          "batch_stride_weight")
    out = ("y", "ldc", "batch_stride_y")
    for layout, code in (("nn", 0), ("nt", 1)):
        builtin.kernel("tirbyoc_matmul_f32", computes=ops.matmul(weight=layout),
                       args=mm + (const(code),) + out + (const(0), const(1.0), const(0),
                                                         const(0), const(0), const(0)),
                       matcher=matmul.MATMUL)
    # (more chains, for check: the code of each chain, the scale and residual roles)
    for chain in (("bias", "gelu_tanh"), ("scale", "residual"), ("bias", "relu6")):
        roles = [const(matmul.encode(chain)),
                 "scale" if "scale" in chain else const(1.0),
                 "bias" if "bias" in chain else const(0)]
        roles += ["residual", "ldr", "batch_stride_residual"] if "residual" in chain else \
            [const(0), const(0), const(0)]
        builtin.kernel("tirbyoc_matmul_f32",
                       computes=ops.matmul(tuple("gelu_tanh" if s == "gelu_tanh" else s
                                                 for s in chain), weight="nn"),
                       args=mm + (const(0),) + out + tuple(roles), matcher=matmul.MATMUL)
    dense_args = ("m", "n", "k", "x", "lda", "weight", "ldw", "bias", "y", "ldc")
    fixed = {i.name: i for i in [*dense_family.INTRINSICS, *dense_relu6.INTRINSICS]}
    for name in sorted(fixed, key=lambda n: -len(fixed[n].epilogue)):
        intr = fixed[name]
        steps = tuple(s.name for s in intr.epilogue)
        symbol = {(): "dense", ("relu",): "dense_relu",
                  ("relu6",): "dense_relu6"}[tuple(s for s in steps if s != "bias")]
        args = dense_args if "bias" in steps else \
            tuple(const(0) if a == "bias" else a for a in dense_args)
        for layout in ("nt", "nn"):
            builtin.kernel(f"tirbyoc_{symbol}_f32_{layout}",
                           computes=ops.dense(steps, weight=layout), args=args, matcher=intr)

    # ---- graph level: convolutions, pooling, attention, softmax ----
    geometry = ("stride_h", "stride_w", "pad_top", "pad_left", "dilation_h", "dilation_w",
                "out_h", "out_w")
    for chain in ((), ("bias",), ("bias", "relu"), ("bias", "relu6"), ("bias", "residual"),
                  ("bias", "residual", "relu"), ("relu",)):
        code = kernels.encode_epilogue(chain)
        tail = (const(code), "bias" if "bias" in chain else const(0),
                "residual" if "residual" in chain else const(0), "y")
        builtin.kernel("tirbyoc_conv2d_f32", computes=ops.conv2d(chain, depthwise=False),
                       args=("batch", "in_channels", "height", "width", "x", "out_channels",
                             "groups", "kernel_h", "kernel_w", "weight") + geometry + tail,
                       matcher=conv.offload_convs)
        builtin.kernel("tirbyoc_depthwise_conv2d_f32",
                       computes=ops.conv2d(chain, depthwise=True),
                       args=("batch", "in_channels", "height", "width", "x", "kernel_h",
                             "kernel_w", "weight") + geometry + tail,
                       matcher=conv.offload_convs)
    builtin.kernel("tirbyoc_max_pool2d_f32", computes=ops.max_pool2d(),
                   args=("batch", "channels", "height", "width", "x", "kernel_h", "kernel_w",
                         "stride_h", "stride_w", "pad_top", "pad_left", "dilation_h",
                         "dilation_w", "out_h", "out_w", "y"), matcher=pool.offload_pools)
    builtin.kernel("tirbyoc_attention_f32", computes=ops.attention(),
                   args=("batch", "seq_q", "seq_k", "head_dim", "value_dim", "q", "ldq",
                         "batch_stride_q", "k", "ldk", "batch_stride_k", const(1), "v",
                         "ldv", "batch_stride_v", "mask", "ldmask", "batch_stride_mask",
                         "mask_repeat", const(0), "scale", "y", "ldy", "batch_stride_y"),
                   matcher=attention.offload_attention)
    builtin.kernel("tirbyoc_softmax_f32", computes=ops.softmax(),
                   args=("rows", "cols", "x", "ldx", "y", "ldy"),
                   matcher=softmax.offload_softmax)
