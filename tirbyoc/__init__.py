"""tirbyoc: offload TIR dense+bias(+relu) blocks to a C kernel library.

>>> import tirbyoc
>>> offloaded = tirbyoc.apply_tir_byoc(mod)      # a Relax or TIR IRModule
>>> print(tirbyoc.explain(mod))                  # what went to which kernel, and why not
>>> ex = tirbyoc.compile(mod)                    # or tvm.compile(..., relax_pipeline=tirbyoc.pipeline(target))
"""

from .api import (Report, apply_tir_byoc, compile, explain, host_target, offload_prim_func,
                  offloaded_kernels, pipeline, run)
from .graph import RegionCall, constant_weights, partition, relax_patterns
from .schedule_rule import ScheduleRule
from .tensorize import dense_intrin, tensorize_dense

__all__ = ["apply_tir_byoc", "explain", "pipeline", "compile", "host_target", "run",
           "offload_prim_func",
           "offloaded_kernels", "Report", "ScheduleRule", "relax_patterns", "constant_weights",
           "RegionCall", "partition", "dense_intrin", "tensorize_dense"]
