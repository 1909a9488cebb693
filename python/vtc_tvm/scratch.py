"""Whether TVM can compile a schedule's scratch buffers: shared and local memory of constant size.

TVM 0.27 lowers some schedules of a kernel with a loop extent such as ``min(1, n)`` (a slice
clamped on a symbolic axis) to a shared or local buffer of symbolic size, which its CUDA code
generation rejects ("Can only handle constant size stack allocation"): DLight's Matmul on a
matmul read through such a slice (``tests/regressions/case_b3855f0659.py``; stock's own kernel
there has the extent ``min(1, n) - min(0, n)`` and lowers to constant buffers). The schedule
rules answer before any lowering, so the check lowers the schedule (about 0.1 s) and reads the
sizes, on the kernels it concerns only: those with a loop extent built with min, max, division
or subtraction.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

_CLAMPING = (tirx.Min, tirx.Max, tirx.FloorDiv, tirx.FloorMod, tirx.Sub)


def has_clamped_extent(func: tirx.PrimFunc) -> bool:
    """Whether a loop of ``func`` has a symbolic extent built with min, max, division or subtraction."""
    found = []

    def on_loop(loop):
        if not isinstance(loop.extent, tirx.IntImm):
            tvm_ffi.structural_walk(loop.extent, (_CLAMPING, found.append))

    tvm_ffi.structural_walk(func.body, (tirx.For, on_loop))
    return bool(found)


def lower(func: tirx.PrimFunc, target) -> tirx.PrimFunc:
    """A scheduled kernel as TVM's default TIR pipeline for ``target`` lowers it (buffers flattened,
    storage rewritten, dynamic shared buffers merged), before host and device are split."""
    mod = tvm.tirx.transform.BindTarget(target)(tvm.IRModule({"k": func.with_attr("global_symbol", "k")}))
    with target:
        return tvm.tirx.get_default_tir_pipeline(target)[0](mod)["k"]


def check_static_scratch(sch, func: tirx.PrimFunc, target) -> None:
    """Raise ValueError where ``func`` has a clamped extent and TVM's lowering of its schedule
    ``sch`` leaves a buffer the kernel allocates (shared, local, ...) with a symbolic size."""
    if not has_clamped_extent(func):
        return
    sized = []
    tvm_ffi.structural_walk(lower(sch.mod["main"], target).body, (tirx.AllocBuffer, lambda a: sized.append(
        a.buffer) if not all(isinstance(d, tirx.IntImm) for d in a.buffer.shape) else None))
    if sized:
        raise ValueError(f"TVM lowers the schedule to a {sized[0].scope()} buffer of symbolic size "
                         f"({', '.join(map(str, sized[0].shape))}), which code generation cannot allocate")


__all__ = ["check_static_scratch", "has_clamped_extent", "lower"]
