"""A kernel library: C code, its declarations, and the kernels it offers.

    toy = tirbyoc.Library("toy", sources=["toy.c"], cdef=TOY_H)
    toy.kernel("toy_dense_bias_relu",
               computes=ops.dense(epilogue=("bias", "relu"), weight="nt"),
               args=("x", "weight", "bias", "y", "m", "n", "k"))
    ex = tirbyoc.compile(mod, libraries=[toy])

A library is C sources (compiled here with the system's C compiler, ``$CC`` or ``cc``),
prebuilt objects or archives (``.o``, ``.a``: compiled with ``-fPIC``), or a prebuilt
shared library (``.so``), with ``cdef``: the C declarations of its kernels (what a
header declares; cffi reads the same text). ``kernel`` checks each declaration against
``cdef`` when it is made: the argument count and, per role, the C type (a pointer to the
element type for a tensor, an integer for a size, a float for ``scale``) and the
return type (an integer status, 0 for success, or ``void``).

What is built (once per content: the build directory's name is a hash of the sources,
declarations and flags) is a relocatable object that TVM links into every module that
calls it, so that ``export_library`` gives a file that runs in a fresh process with only
TVM installed, and a shared library for calling the kernels from Python (``ffi``,
``tirbyoc.check``). A prebuilt ``.so`` is not linked in: the object holds one small
forwarding function per kernel that opens the ``.so`` by its absolute path on first
call (the exported module then needs that file where it was).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, replace

from . import ops as _ops

# A status generated code names in its error: a kernel's status, or these.
LOAD_FAILED = -1000
# The statuses whose number an error names exactly; others are "outside" this range.
_NAMED_STATUSES = tuple(range(-8, 0)) + tuple(range(1, 33))

_INT_BITS = {"char": 8, "short": 16, "int": 32, "long": 64, "long long": 64,
             "int8_t": 8, "int16_t": 16, "int32_t": 32, "int64_t": 64, "size_t": 64,
             "ssize_t": 64, "ptrdiff_t": 64, "intptr_t": 64, "uintptr_t": 64,
             "uint8_t": 8, "uint16_t": 16, "uint32_t": 32, "uint64_t": 64}
_FLOAT_BITS = {"float": 32, "double": 64}
# Parsing a cdef: the standard types it may use without declaring them.
_PRELUDE = "".join(f"typedef int {t};\n" for t in _INT_BITS if t.endswith("_t"))


class LibraryError(ValueError):
    """A library or kernel declaration that cannot work (said before anything runs)."""


@dataclass(frozen=True)
class CType:
    """One C type as a kernel argument: ``kind`` is "pointer" (``element``: "float32",
    "float64", "void", "int32"...), "int", "uint", "float" (``bits``) or "void"."""

    text: str
    kind: str
    bits: int = 0
    element: str = ""

    @property
    def dtype(self) -> str:
        return {"int": f"int{self.bits}", "uint": f"uint{self.bits}",
                "float": f"float{self.bits}", "pointer": "handle", "void": "void"}[self.kind]


def _classify(text: str, pointer: bool, pointee=None) -> CType:
    words = [w for w in text.replace("*", " ").split() if w not in ("const", "volatile",
                                                                  "restrict", "signed")]
    unsigned = "unsigned" in words
    words = [w for w in words if w != "unsigned"]
    base = " ".join(words) or "int"
    if base.startswith("long long"):
        base = "long long"
    elif base.startswith("long"):
        base = "long"
    if pointer:
        element = pointee or ("void" if base == "void" else
                              f"float{_FLOAT_BITS[base]}" if base in _FLOAT_BITS else
                              f"{'u' if unsigned or base.startswith('u') else ''}int"
                              f"{_INT_BITS[base]}" if base in _INT_BITS else base)
        return CType(text, "pointer", 64, element)
    if base == "void":
        return CType(text, "void")
    if base in _FLOAT_BITS:
        return CType(text, "float", _FLOAT_BITS[base])
    if base in _INT_BITS:
        uns = unsigned or (base.startswith("u") and base.endswith("_t"))
        return CType(text, "uint" if uns else "int", _INT_BITS[base])
    return CType(text, "other")


@dataclass(frozen=True)
class Prototype:
    name: str
    result: CType
    params: tuple  # CType
    decl: object   # the pycparser FuncDecl (for forwarding functions)


def parse_cdef(cdef: str) -> dict:
    """``{name: Prototype}`` of every function ``cdef`` declares."""
    from pycparser import c_ast, c_generator, c_parser

    text = re.sub(r"/\*.*?\*/|//[^\n]*", "", cdef, flags=re.S)
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    try:
        ast = c_parser.CParser().parse(_PRELUDE + text)
    except Exception as exc:  # pycparser's ParseError names the line
        raise LibraryError(f"the cdef is not C declarations pycparser can read: {exc}") \
            from exc
    gen = c_generator.CGenerator()
    typedefs = {}
    out = {}
    for node in ast.ext:
        if isinstance(node, c_ast.Typedef):
            typedefs[node.name] = node.type
        if not isinstance(node, c_ast.Decl) or not isinstance(node.type, c_ast.FuncDecl):
            continue
        func = node.type
        result = _ctype(func.type, gen, typedefs)
        params = []
        for p in (func.args.params if func.args else []):
            if isinstance(p, c_ast.EllipsisParam):
                raise LibraryError(f"{node.name}: variadic kernels are not supported")
            ct = _ctype(p.type, gen, typedefs)
            if ct.kind != "void":
                params.append(ct)
        out[node.name] = Prototype(node.name, result, tuple(params), node)
    return out


def _ctype(node, gen, typedefs) -> CType:
    from pycparser import c_ast

    text = gen.visit(node) if not isinstance(node, c_ast.TypeDecl) else \
        " ".join(getattr(node, "quals", []) + [gen.visit(node.type)])
    if isinstance(node, c_ast.PtrDecl):
        inner = node.type
        if isinstance(inner, c_ast.TypeDecl):
            name = gen.visit(inner.type)
            resolved = typedefs.get(name)
            if resolved is not None and isinstance(resolved, c_ast.TypeDecl):
                name = gen.visit(resolved.type)
            return replace(_classify(name, True), text=gen.visit(node.type.type) + " *"
                           if not getattr(inner, "quals", None) else
                           " ".join(inner.quals) + " " + gen.visit(inner.type) + " *")
        return CType(text, "pointer", 64, "pointer")
    if isinstance(node, c_ast.TypeDecl):
        name = gen.visit(node.type)
        resolved = typedefs.get(name)
        if isinstance(node.type, c_ast.Enum) or (
                resolved is not None and isinstance(resolved, c_ast.TypeDecl) and
                isinstance(resolved.type, c_ast.Enum)):
            return CType(name, "int", 32)
        if resolved is not None and isinstance(resolved, c_ast.TypeDecl) and \
                name not in _INT_BITS:
            return _classify(gen.visit(resolved.type), False)
        return _classify(name, False)
    return CType(text, "other")


def _const_fits(c: _ops.Const, ct: CType) -> str | None:
    """Why a constant argument cannot be passed as ``ct``, or None."""
    if ct.kind == "pointer":
        return None if c.value == 0 else "a constant pointer argument can only be 0 (NULL)"
    if ct.kind in ("int", "uint"):
        if not isinstance(c.value, int):
            return f"`{ct.text}` takes an integer constant, got {c.value!r}"
        if ct.kind == "uint" and c.value < 0:
            return f"`{ct.text}` cannot take {c.value}"
        return None
    if ct.kind == "float":
        return None
    return f"a constant cannot be passed as `{ct.text}`"


def _role_fits(role: _ops.Role, ct: CType, dtypes) -> str | None:
    """Why a C type cannot carry ``role``, or None."""
    if role.kind in ("in", "out"):
        if ct.kind != "pointer":
            return f"a tensor needs a pointer, the cdef has `{ct.text}`"
        if role.name == "mask":  # a boolean mask: bytes
            return None if ct.element in ("void", "uint8", "int8") else \
                f"a mask needs `uint8_t *` (or `void *`), the cdef has `{ct.text}`"
        if ct.element not in ("void",) + tuple(dtypes):
            return f"a {'/'.join(dtypes)} tensor needs `float *` (or `void *`), the cdef " \
                   f"has a pointer to {ct.element}"
        return None
    if role.kind == "size":
        if ct.kind not in ("int", "uint") or ct.bits < 16:
            return f"a size needs an integer type, the cdef has `{ct.text}`"
        return None
    if role.kind == "float" and ct.kind != "float":
        return f"a float needs `float` or `double`, the cdef has `{ct.text}`"
    return None


@dataclass(frozen=True)
class Kernel:
    """One declared kernel: ``library``'s C function ``symbol`` computing ``op``, its
    arguments' roles in C order and their C types."""

    library: "Library"
    symbol: str
    op: _ops.Op
    args: tuple
    types: tuple  # CType per argument
    result: CType
    # How the kernel is matched: None, by its family's roles (tirbyoc.registry); else the
    # built-in library's own matcher (an Intrinsic of the TIR matcher, or the graph-level
    # rewrite of its family), for kernels whose calls need more than roles (packed
    # weights, an epilogue code read from the TIR).
    matcher: object = None

    @property
    def name(self) -> str:
        """``<library>.<symbol>``: how explain and the graph-level composites name it."""
        return f"{self.library.name}.{self.symbol}"

    @property
    def call_symbol(self) -> str:
        """What generated code calls: the kernel itself, or its forwarding function."""
        return self.library.call_symbol(self.symbol)

    def call(self, values: dict):
        """The TIR statement that calls the kernel with ``values`` (role -> PrimExpr, a
        pointer for a tensor) and checks its status."""
        from . import _tvm as T

        args = []
        for role, ct in zip(self.args, self.types):
            if isinstance(role, _ops.Const):
                args.append(T.null_pointer() if ct.kind == "pointer" else
                            T.const(role.value, ct.dtype))
                continue
            value = values[role]
            if ct.kind in ("int", "uint", "float"):
                value = T.cast(value, ct.dtype)
            args.append(value)
        forwarded = self.library.forwards
        if forwarded:
            return self._checked(T.call_extern("int32", self.call_symbol, args), "int32")
        if self.result.kind == "void":
            return T.evaluate(T.call_extern("void", self.symbol, args))
        return self._checked(T.call_extern(self.result.dtype, self.symbol, args),
                             self.result.dtype)

    def prim_func(self, inputs, output, values: dict, notes: str = ""):
        """A PrimFunc ``(*inputs, output)`` (TIR buffers) whose one block calls the
        kernel with ``values`` (role -> PrimExpr; each buffer's pointer is added under
        its role, ``inputs``/``output`` being ``(role, buffer)`` pairs)."""
        from . import _tvm as T
        from .normalize import INTRINSIC_ATTR, LIBRARY_ATTR, NOTES_ATTR, OFFLOADED_ATTR

        values = dict(values)
        for role, buf in inputs:
            values[role] = T.buffer_pointer(buf, "r")
        values[output[0]] = T.buffer_pointer(output[1], "w")
        annotations = {OFFLOADED_ATTR: self.symbol, INTRINSIC_ATTR: self.symbol,
                       LIBRARY_ATTR: self.library.name}
        if notes:
            annotations[NOTES_ATTR] = notes
        block = T.make_block(f"{self.library.name}_{self.symbol}", self.call(values),
                             reads=[T.full_region(b) for _, b in inputs],
                             writes=[T.full_region(output[1])], annotations=annotations)
        root = T.make_block("root", T.make_realize(block), reads=[], writes=[],
                            annotations={})
        func = T.prim_func_of([b for _, b in inputs] + [output[1]], T.make_realize(root))
        return func.with_attr("tirx.noalias", True)

    def _checked(self, call, dtype):
        from . import _tvm as T

        status = T.Var("status", dtype)
        where = f"tirbyoc: kernel {self.symbol} of library {self.library.name} failed"
        checks = []
        if self.library.forwards:
            checks.append(T.assert_stmt(
                status != T.const(LOAD_FAILED, dtype),
                f"{where}: {self.library.prebuilt_shared()} could not be opened, or it "
                f"does not define {self.symbol}"))
        signed = not dtype.startswith("uint")
        for code in _NAMED_STATUSES:
            if code < 0 and not signed:
                continue
            checks.append(T.assert_stmt(status != T.const(code, dtype),
                                        f"{where} with status {code}"))
        low = _NAMED_STATUSES[0] if signed else 1
        checks.append(T.assert_stmt(status == T.const(0, dtype),
                                    f"{where} with a status outside {low}..."
                                    f"{_NAMED_STATUSES[-1]}"))
        return T.seq([T.bind(status, call)] + checks)


class Library:
    """C kernels and what each computes (see the module docstring).

    ``sources``: C files compiled here; ``libraries``: prebuilt ``.o``, ``.a`` or
    ``.so`` files; ``cdef``: the kernels' C declarations; ``include_dirs``,
    ``extra_compile_args``: for compiling ``sources`` (default ``-O3``);
    ``build_dir``: where to build (default: a directory per content under
    ``$TIRBYOC_CACHE`` or ``~/.cache/tirbyoc``).
    """

    def __init__(self, name: str, *, sources=(), cdef: str = "", libraries=(),
                 include_dirs=(), extra_compile_args=("-O3",), build_dir=None):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(name)):
            raise LibraryError(f"a library name must be a C identifier, got {name!r}")
        self.name = str(name)
        self.sources = [os.path.abspath(os.fspath(s)) for s in sources]
        self.libraries = [os.path.abspath(os.fspath(p)) for p in libraries]
        for path in self.sources + self.libraries:
            if not os.path.isfile(path):
                raise LibraryError(f"library {name}: no file {path}")
        for path in self.libraries:
            if not path.endswith((".o", ".a", ".so")) and ".so." not in path:
                raise LibraryError(f"library {name}: {path} is not a .o, .a or .so file")
        if not self.sources and not self.libraries and cdef:
            raise LibraryError(f"library {name}: neither sources nor libraries given")
        if len([p for p in self.libraries if _is_shared(p)]) > 1:
            raise LibraryError(f"library {name}: one prebuilt .so per library")
        self.cdef = cdef
        self.include_dirs = [os.path.abspath(os.fspath(d)) for d in include_dirs]
        self.extra_compile_args = list(extra_compile_args)
        self._build_dir = build_dir
        self.prototypes = parse_cdef(cdef) if cdef else {}
        self.kernels: list[Kernel] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Library({self.name!r}, {len(self.kernels)} kernels)"

    # ---- declarations ----

    def kernel(self, symbol: str, *, computes: _ops.Op, args, matcher=None) -> Kernel:
        """Declare that C function ``symbol`` computes ``computes`` (an ``ops`` value),
        its arguments being ``args`` (roles, or ``ops.const`` values, in C order).
        Checked now against the cdef; kernels are tried in the order they are declared
        (longer epilogues first). ``matcher``: see ``Kernel.matcher`` (the built-in
        library's)."""
        if not isinstance(computes, _ops.Op):
            raise LibraryError(f"{symbol}: computes= takes an ops value (ops.dense(...)), "
                               f"got {computes!r}")
        args = tuple(args)
        try:
            computes.check_roles(args)
        except ValueError as exc:
            raise LibraryError(f"library {self.name}, kernel {symbol}: {exc}") from None
        proto = self.prototypes.get(symbol)
        if proto is None:
            raise LibraryError(f"library {self.name}: the cdef declares no function "
                               f"{symbol!r} (it declares {sorted(self.prototypes)})")
        if len(proto.params) != len(args):
            raise LibraryError(
                f"library {self.name}, kernel {symbol}: args names {len(args)} roles, the "
                f"cdef's prototype takes {len(proto.params)} arguments")
        roles = computes.roles()
        for i, (role, ct) in enumerate(zip(args, proto.params)):
            why = _const_fits(role, ct) if isinstance(role, _ops.Const) else \
                _role_fits(roles[role], ct, computes.dtypes)
            if why:
                raise LibraryError(f"library {self.name}, kernel {symbol}: argument {i} "
                                   f"({role}): {why}")
        if proto.result.kind not in ("void", "int", "uint"):
            raise LibraryError(f"library {self.name}, kernel {symbol}: returns "
                               f"`{proto.result.text}`; a kernel returns an integer status "
                               "(0: success) or void")
        if computes.family == "attention" and matcher is None:
            raise LibraryError(f"library {self.name}, kernel {symbol}: attention kernels "
                               "of a library are not matched yet (only the built-in "
                               "fused attention is)")
        if any(k.symbol == symbol and k.op == computes and k.args == args
               for k in self.kernels):
            raise LibraryError(f"library {self.name}: {symbol} is declared twice as "
                               f"{computes.name}")
        kernel = Kernel(self, symbol, computes, args, proto.params, proto.result, matcher)
        self.kernels.append(kernel)
        return kernel

    def family(self, name: str) -> list:
        """The declared kernels of one family, in order."""
        return [k for k in self.kernels if k.op.family == name]

    # ---- building and linking ----

    @property
    def forwards(self) -> bool:
        """Whether generated code calls forwarding functions (a prebuilt ``.so``)."""
        return self.prebuilt_shared() is not None

    def prebuilt_shared(self):
        return next((p for p in self.libraries if _is_shared(p)), None)

    def call_symbol(self, symbol: str) -> str:
        return f"tirbyoc_forward_{self.name}__{symbol}" if self.forwards else symbol

    def build_dir(self) -> str:
        if self._build_dir is not None:
            return os.path.abspath(self._build_dir)
        digest = hashlib.sha256()
        for part in [self.name, self.cdef, _compiler(), *self.include_dirs,
                     *self.extra_compile_args,
                     *(sorted(k.symbol for k in self.kernels) if self.forwards else [])]:
            digest.update(part.encode() + b"\0")
        for path in self.sources + self.libraries:
            digest.update(path.encode() + b"\0")
            with open(path, "rb") as f:
                digest.update(hashlib.sha256(f.read()).digest())
        root = os.environ.get("TIRBYOC_CACHE") or os.path.join(
            os.path.expanduser("~"), ".cache", "tirbyoc")
        return os.path.join(root, "libraries", f"{self.name}-{digest.hexdigest()[:16]}")

    def build(self) -> dict:
        """Build (or find built) the object and the shared library:
        ``{"object": path or None, "shared": path}``."""
        with self._lock:
            return self._build(self.build_dir())

    def _build(self, out) -> dict:
        obj, shared = os.path.join(out, f"lib{self.name}.o"), \
            os.path.join(out, f"lib{self.name}_py.so")
        if os.path.isfile(shared) and (os.path.isfile(obj) or not self._has_objects()):
            return {"object": obj if os.path.isfile(obj) else None, "shared": shared}
        os.makedirs(os.path.dirname(out), exist_ok=True)
        work = tempfile.mkdtemp(prefix=f".{self.name}-", dir=os.path.dirname(out))
        try:
            objects = []
            for i, src in enumerate(self.sources):
                o = os.path.join(work, f"src{i}.o")
                _run([_compiler(), "-c", "-fPIC", *self.extra_compile_args,
                      *[f"-I{d}" for d in self.include_dirs], src, "-o", o],
                     f"library {self.name}: compiling {src} failed")
                objects.append(o)
            objects += [p for p in self.libraries if p.endswith(".o")]
            archives = [p for p in self.libraries if p.endswith(".a")]
            if self.forwards:
                objects.append(self._forwarders(work))
            linked = None
            if objects or archives:
                linked = os.path.join(work, os.path.basename(obj))
                _run([_linker(), "-r", "-o", linked, *objects,
                      *(["--whole-archive", *archives, "--no-whole-archive"]
                        if archives else [])],
                     f"library {self.name}: combining its objects failed (archives must "
                     "hold objects compiled with -fPIC)")
            so = os.path.join(work, os.path.basename(shared))
            shared_lib = self.prebuilt_shared()
            _run([_compiler(), "-shared", "-o", so, *([linked] if linked else []),
                  *(["-Wl,--no-as-needed", shared_lib,
                     f"-Wl,-rpath,{os.path.dirname(shared_lib)}"] if shared_lib else []),
                  "-ldl"],
                 f"library {self.name}: linking {so} failed")
            final = out + ".tmp-" + os.path.basename(work)
            os.rename(work, final)
            try:
                os.rename(final, out)
            except OSError:  # built by another process meanwhile
                shutil.rmtree(final, ignore_errors=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return {"object": obj if os.path.isfile(obj) else None, "shared": shared}

    def _has_objects(self) -> bool:
        return bool(self.sources or self.forwards or any(
            p.endswith((".o", ".a")) for p in self.libraries))

    def _forwarders(self, work) -> str:
        """An object with one forwarding function per kernel of the prebuilt ``.so``."""
        from pycparser import c_ast, c_generator

        gen = c_generator.CGenerator()
        path = self.prebuilt_shared()
        lines = ["#include <dlfcn.h>", "#include <stddef.h>", "#include <stdint.h>",
                 re.sub(r"/\*.*?\*/|//[^\n]*", "", self.cdef, flags=re.S),
                 "static void *tb_handle;",
                 "static void *tb_symbol(const char *name) {",
                 "  void *h = __atomic_load_n(&tb_handle, __ATOMIC_ACQUIRE);",
                 f"  if (!h) {{ h = dlopen({_c_string(path)}, RTLD_NOW | RTLD_GLOBAL);",
                 "    __atomic_store_n(&tb_handle, h, __ATOMIC_RELEASE); }",
                 "  return h ? dlsym(h, name) : NULL;", "}"]
        for symbol in sorted({k.symbol for k in self.kernels}):
            decl = self.prototypes[symbol].decl
            params = decl.type.args.params if decl.type.args else []
            names, texts = [], []
            for i, p in enumerate(params):
                if isinstance(p.type, c_ast.TypeDecl) and gen.visit(p.type.type) == "void":
                    continue
                arg = f"a{i}"
                q = _renamed(p, arg)
                texts.append(gen.visit(q))
                names.append(arg)
            void = self.prototypes[symbol].result.kind == "void"
            call = f"fn({', '.join(names)})"
            lines += [f"int {self.call_symbol(symbol)}({', '.join(texts) or 'void'}) {{",
                      f"  static __typeof__(&{symbol}) cached;",
                      "  __typeof__(&" + symbol + ") fn = __atomic_load_n(&cached, "
                      "__ATOMIC_ACQUIRE);",
                      f"  if (!fn) {{ fn = (__typeof__(&{symbol}))tb_symbol("
                      f"{_c_string(symbol)});",
                      f"    if (!fn) return {LOAD_FAILED};",
                      "    __atomic_store_n(&cached, fn, __ATOMIC_RELEASE); }",
                      f"  {call}; return 0;" if void else f"  return (int){call};", "}"]
        src = os.path.join(work, "forward.c")
        with open(src, "w") as f:
            f.write("\n".join(lines) + "\n")
        o = os.path.join(work, "forward.o")
        _run([_compiler(), "-c", "-fPIC", "-O2", src, "-o", o],
             f"library {self.name}: compiling its forwarding functions failed")
        return o

    def static_module(self):
        """The object as a TVM static-library module (for an IRModule's
        ``external_mods``), or None for a library with nothing to link."""
        built = self.build()
        if built["object"] is None:
            return None
        return _static_module(built["object"],
                              tuple(sorted({k.call_symbol for k in self.kernels})))

    def make_symbols_global(self):
        """Load the shared build with RTLD_GLOBAL (TVM's JIT of a TIR-only module
        resolves calls among the process's global symbols)."""
        return _load_global(self.build()["shared"])

    @functools.cached_property
    def _ffi(self):
        import cffi

        ffi = cffi.FFI()
        ffi.cdef(self.cdef)
        return ffi, ffi.dlopen(self.build()["shared"])

    def ffi(self):
        """``(ffi, lib)``: the kernels callable from Python through cffi."""
        return self._ffi


def _renamed(param, name):
    """A copy of a pycparser parameter declaration with its name set to ``name``."""
    import copy

    from pycparser import c_ast

    p = copy.deepcopy(param)
    p.name = name
    node = p.type
    while not isinstance(node, c_ast.TypeDecl):
        node = node.type
    node.declname = name
    return p


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _is_shared(path: str) -> bool:
    return path.endswith(".so") or ".so." in os.path.basename(path)


def _compiler() -> str:
    return os.environ.get("CC", "cc")


def _linker() -> str:
    return os.environ.get("LD", "ld")


def _run(cmd, what):
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise LibraryError(f"{what}: {exc}") from exc
    if proc.returncode:
        raise LibraryError(f"{what}:\n$ {' '.join(cmd)}\n{proc.stderr.strip()}")


@functools.lru_cache(maxsize=None)
def _static_module(path, symbols):
    import tvm

    return tvm.runtime.load_static_library(path, list(symbols))


@functools.lru_cache(maxsize=None)
def _load_global(path):
    return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
