"""The one module that touches TVM's moving API surface.

TVM renames namespaces and node constructors between releases (``tvm.tir`` became
``tvm.tirx``, schedulable TIR moved to ``tvm.s_tir``, buffers became typed ``Var``s).
Everything else in tirbyoc imports TIR/Relax node types and helpers from here, so a
rename is a change to this file only.
"""

from __future__ import annotations

import contextlib

import tvm
import tvm_ffi
from tvm import ir, relax, s_tir, tirx
from tvm.sym import Analyzer

# NOTE: re-exported names; the rest of the package uses only these.
IRModule = tvm.IRModule
PrimFunc = tirx.PrimFunc
Var = tirx.Var
Expr = ir.Expr
IntImm = tirx.IntImm
FloatImm = tirx.FloatImm
StringImm = ir.StringImm
GlobalVar = ir.GlobalVar
Op = ir.Op
Add = tirx.Add
Sub = tirx.Sub
Mul = tirx.Mul
Div = tirx.Div
Max = tirx.Max
Min = tirx.Min
Select = tirx.Select
Cast = tirx.Cast
Call = ir.Call
GT = tirx.GT
GE = tirx.GE
LT = tirx.LT
LE = tirx.LE
BufferLoad = ir.TensorLoad  # the node type; build loads with tirx.BufferLoad
BufferStore = tirx.BufferStore
For = tirx.For
SeqStmt = tirx.SeqStmt
SBlock = s_tir.SBlock
SBlockRealize = s_tir.SBlockRealize
DATA_PAR = tirx.IterVar.DataPar
COMM_REDUCE = tirx.IterVar.CommReduce

Target = tvm.target.Target
structural_equal = tvm_ffi.structural_equal
structural_walk = tvm_ffi.structural_walk
structural_hash = tvm_ffi.structural_hash
Pass = tvm.transform.Pass
Sequential = tvm.transform.Sequential
module_pass = tvm.transform.module_pass
load_static_library = tvm.runtime.load_static_library
tensor = tvm.runtime.tensor
cpu = tvm.cpu

Function = relax.Function
Schedule = s_tir.Schedule
TensorIntrin = s_tir.TensorIntrin
FusionPattern = relax.transform.FusionPattern
DlightScheduleRule = s_tir.dlight.ScheduleRule
RelaxConstant = ir.expr.GenericConst  # what relax.const builds (tensor constants)


def constant_value(const):
    """The numpy value of a Relax tensor constant."""
    return const.value.numpy()
VirtualMachine = relax.VirtualMachine


def analyzer() -> Analyzer:
    """A fresh arithmetic analyzer (symbolic equality of shapes and extents)."""
    return Analyzer()


def is_buffer(var) -> bool:
    """True when ``var`` is a TIR buffer (buffers are typed Vars in this TVM)."""
    return isinstance(var, tirx.Var) and tirx.is_buffer_var(var)


def is_if_then_else(expr) -> bool:
    return isinstance(expr, ir.Call) and isinstance(expr.op, ir.Op) and \
        str(expr.op.name).endswith(".if_then_else")


def const(value, dtype: str):
    return tirx.const(value, dtype)


# Scalar TIR expression builders (tirbyoc.fastmath).
structural_map = tvm_ffi.structural_map
select = tirx.Select
isnan = tirx.isnan
bitwise_and = tirx.bitwise_and
reinterpret = tirx.reinterpret
shift_left = tirx.shift_left
shift_right = tirx.shift_right
floor = tirx.floor
abs = tirx.abs  # noqa: A001 (TIR's abs, for callers that name it T.abs)
min_value = tirx.min
floordiv = tirx.floordiv
floormod = tirx.floormod
max_value = tirx.max


def cast(value, dtype: str):
    return tirx.Cast(dtype, value)


def decl_buffer(shape, dtype: str, name: str):
    return tirx.decl_buffer(shape, dtype, name)


def buffer_pointer(buf, access: str, offset=0):
    """Pointer to ``buf``'s element ``offset`` (flat; default ``buf[0, ..., 0]``) for a
    kernel that reads ("r") or writes ("w") ``buf`` (honours the buffer's element
    offset)."""
    # NOTE: a tvm_access_ptr declares the whole buffer as accessed. An address_of(buf[0,..])
    # looks like a one-element access, and TVM's buffer compaction then shrinks an
    # intermediate that only kernels touch to one element.
    return buf.access_ptr(access, ptr_type=str(buf.dtype), offset=offset)


def substitute(expr, mapping: dict):
    """``expr`` with each variable in ``mapping`` replaced."""
    return structural_map(expr, [(tirx.Var, lambda v: mapping.get(v, v))])


def free_vars(expr) -> list:
    """The variables ``expr`` reads."""
    return list(tirx.analysis.undefined_vars(expr))


def null_pointer():
    return tirx.reinterpret("handle", tirx.const(0, "uint64"))


def call_extern(ret_dtype: str, symbol: str, args):
    return tirx.call_extern(ret_dtype, symbol, *args)


def evaluate(expr):
    """A statement that evaluates ``expr`` (a call whose result is not used)."""
    return tirx.Evaluate(expr)


def assert_stmt(condition, message: str):
    """An assertion statement that raises ``RuntimeError(message)`` at run time."""
    # NOTE: the Python constructor of 0.27 passes (kind, condition) to an FFI
    # constructor that expects (condition, kind); pass them in the FFI's order.
    return tirx.AssertStmt(condition, ir.StringImm("RuntimeError"), [ir.StringImm(message)])


def bind(var, value):
    """``var = value`` for the statements that follow it in a sequence."""
    return tirx.Bind(var, value)


def full_region(buf):
    """The whole of ``buf`` as a region, for a block's reads/writes."""
    return tirx.BufferRegion(buf, [ir.Range.from_min_extent(0, e) for e in buf.shape])


def make_block(name, body, reads, writes, annotations, iter_vars=(), init=None, alloc_buffers=(),
               match_buffers=()):
    return s_tir.SBlock(list(iter_vars), list(reads), list(writes), name, body, init,
                        list(alloc_buffers), list(match_buffers), annotations)


def make_realize(block, iter_values=(), predicate=True):
    return s_tir.SBlockRealize(list(iter_values), predicate, block)


def seq(stmts):
    stmts = list(stmts)
    return stmts[0] if len(stmts) == 1 else tirx.SeqStmt(stmts)


def relax_default_prepare_passes():
    """The legalize-and-fuse prefix of TVM's default CPU pipeline."""
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    return cpu.legalize_passes(None)


FUSE_MAX_DEPTH = "relax.FuseOps.max_depth"


@contextlib.contextmanager
def fusion_depth(depth: int):
    """Passes run inside fuse at most ``depth`` operators into one function (FuseOps's
    ``max_depth``, 256 by default), unless the caller's PassContext sets it."""
    ctx = tvm.transform.PassContext.current()
    if FUSE_MAX_DEPTH in ctx.config:
        yield
        return
    config = dict(ctx.config)
    config[FUSE_MAX_DEPTH] = depth
    with tvm.transform.PassContext(opt_level=ctx.opt_level,
                                   required_pass=list(ctx.required_pass),
                                   disabled_pass=list(ctx.disabled_pass),
                                   instruments=list(ctx.instruments), config=config):
        yield


def relax_default_lowering_passes(target):
    """The default CPU pipeline after legalization/fusion (dataflow lowering, finalize)."""
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    return cpu.dataflow_lower_passes(target) + cpu.finalize_passes(target)


def relax_library_dispatch_passes(target):
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    return cpu.library_dispatch_passes(target)


def tvm_compile(mod, target, relax_pipeline="default"):
    return tvm.compile(mod, target=target, relax_pipeline=relax_pipeline)


def as_target(target):
    """A Target from a Target, a string or a dict; None: this machine (``host_target``)."""
    if target is None:
        return host_target()
    if isinstance(target, tvm.target.Target):
        return target
    return tvm.target.Target(target)


def host_target():
    """LLVM for this machine's CPU (``mcpu`` = LLVM's name of the host CPU), so that TVM's
    code uses its vector ISA (AVX2/AVX-512, FMA); a bare "llvm" is baseline x86-64 (SSE2)."""
    from tvm.target import codegen

    return tvm.target.Target({"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu()})


def call_tir_op():
    return ir.Op.get("relax.call_tir")


def dead_code_elimination():
    return relax.transform.DeadCodeElimination()


relax_ns = relax
tirx_ns = tirx


def as_int64(expr):
    """``expr`` as an int64 expression (kernel sizes and strides are int64)."""
    if isinstance(expr, int):
        return tirx.const(expr, "int64")
    if isinstance(expr, tirx.IntImm):
        return tirx.const(int(expr.value), "int64")
    return expr if dtype_of(expr) == "int64" else tirx.Cast("int64", expr)


def dtype_of(expr) -> str:
    """The element dtype of a scalar expression, as a string."""
    return str(expr.ty.dtype)


def prim_func_of(params, body):
    """A new PrimFunc of buffer ``params`` (from ``decl_buffer``) and ``body``."""
    return tirx.PrimFunc(list(params), body)


def make_prim_func(func, params, body):
    """``func`` with new params and body, keeping its attributes."""
    return tirx.PrimFunc(params, body, func.ret_type, func.attrs, func.span)


def relax_call_with_args(call, args):
    """``call`` with new arguments (same op, attrs and result type arguments)."""
    return relax.Call(call.op, args, call.attrs, call.ty_args, call.span)


def dpl():
    """Relax's dataflow pattern language (``is_call_tir``, ``wildcard``...)."""
    from tvm.relax import dpl as _dpl

    return _dpl


def dlight_blocks(sch):
    """dlight's normalized block infos of a schedule's function (None: not analyzable)."""
    from tvm.s_tir.dlight.analysis import normalize_prim_func

    return normalize_prim_func(sch)


def dlight_extent(sch, loop):
    """A loop's extent: an int when static."""
    from tvm.s_tir.dlight.base import get_extent

    return get_extent(sch, loop)


def dlight_cpu_gemv():
    return s_tir.dlight.cpu.GEMV()


def dlight_cpu_reduction():
    return s_tir.dlight.cpu.Reduction()


def apply_default_schedule(*rules):
    """dlight's pass: the first rule that returns a schedule wins, per PrimFunc."""
    return s_tir.dlight.ApplyDefaultSchedule(*rules)


def is_shape_value(value) -> bool:
    """Whether a VM result is a shape (a tuple of ints, not a tensor)."""
    return isinstance(value, tvm_ffi.Shape)
