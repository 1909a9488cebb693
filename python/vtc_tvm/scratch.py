"""Whether TVM can compile a schedule's scratch buffers: shared and local memory of constant size,
no global memory allocated inside a kernel.

TVM 0.27 lowers some schedules of a kernel with a loop extent such as ``min(1, n)`` (a slice
clamped on a symbolic axis) to a shared or local buffer of symbolic size, which its CUDA code
generation rejects ("Can only handle constant size stack allocation"): DLight's Matmul on a
matmul read through such a slice (``tests/regressions/case_b3855f0659.py``; stock's own kernel
there has the extent ``min(1, n) - min(0, n)`` and lowers to constant buffers). The schedule
rules answer before any lowering, so the check lowers the schedule (about 0.1 s) and reads the
sizes, on the kernels it concerns only: those with a loop extent built with min, max, division
or subtraction.

A schedule that leaves an intermediate buffer in global scope inside a kernel's threads fails
CUDA code generation too ("Cannot allocate global memory when targeting CUDA"): a rule that
moves one of a block's outputs to registers and not another (argmax writes two buffers;
``tests/regressions/case_b42ed8bd77.py``, before WindowReduction declined such blocks). The
check lowers only schedules that allocate a global intermediate at all.

A cross-thread reduction needs its reduction loops innermost around the block; DLight's
Reduction rule, given a sum read through a repeat (``x[i // 3]``), leaves a spatial loop inside
the thread-bound reduction loop and TVM's ``LowerCrossThreadReduction`` stops the build
(``tests/regressions/case_4d66e154a7.py``; stock's sum reads a physical tensor). That pass runs
on every schedule checked (about a millisecond: it rewrites only cross-thread reductions).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from .errors import last_line

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


def _allocates_global(func: tirx.PrimFunc) -> bool:
    """Whether a block of the scheduled ``func`` allocates a buffer in global scope."""
    found = []
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, lambda b: found.extend(
        buf for buf in b.alloc_buffers if buf.scope() == "global")))
    return bool(found)


def _unallocatable(lowered: tirx.PrimFunc) -> str | None:
    """Why code generation cannot allocate one of ``lowered``'s buffers, or None."""
    symbolic = lambda buf: not all(isinstance(d, tirx.IntImm) for d in buf.shape)  # noqa: E731
    sized = []  # scratch (shared, local) of symbolic size; a global buffer outside a kernel may be
    tvm_ffi.structural_walk(lowered.body, (tirx.AllocBuffer, lambda a: sized.append(
        a.buffer) if a.buffer.scope() != "global" and symbolic(a.buffer) else None))
    if sized:
        return (f"TVM lowers the schedule to a {sized[0].scope()} buffer of symbolic size "
                f"({', '.join(map(str, sized[0].shape))}), which code generation cannot allocate")
    in_kernel = []

    def on_launch(attr):
        if attr.attr_key == "thread_extent":
            tvm_ffi.structural_walk(attr.body, (tirx.AllocBuffer, lambda a: in_kernel.append(
                a.buffer) if a.buffer.scope() == "global" else None))

    tvm_ffi.structural_walk(lowered.body, (tirx.AttrStmt, on_launch))
    if in_kernel:
        return (f"the schedule leaves the intermediate buffer {in_kernel[0].name} in global memory "
                f"inside the kernel, which code generation cannot allocate")
    return None


def _lowers_cross_thread_reductions(sch) -> None:
    """Raise ValueError where TVM cannot lower a cross-thread reduction of the schedule."""
    try:
        s_tir.transform.LowerCrossThreadReduction()(sch.mod)
    except Exception as err:  # noqa: BLE001 - TVM's check of the loops around the reduction
        raise ValueError(f"TVM cannot lower the schedule's cross-thread reduction: {last_line(err)}") from None


def check_scratch(sch, func: tirx.PrimFunc, target) -> None:
    """Raise ValueError where TVM cannot lower a cross-thread reduction of ``func``'s schedule
    ``sch``, or where its lowering leaves a buffer the kernel allocates that code generation
    rejects: a shared or local buffer of symbolic size (only looked for where ``func`` has a
    clamped extent) or a global one inside the kernel's threads (only where the schedule
    allocates a global intermediate). Other schedules are not lowered."""
    _lowers_cross_thread_reductions(sch)
    if not (has_clamped_extent(func) or _allocates_global(sch.mod["main"])):
        return
    why = _unallocatable(lower(sch.mod["main"], target))
    if why is not None:
        raise ValueError(why)


def checked_schedule(rule, func: tirx.PrimFunc, target, tunable: bool = False):
    """``rule``'s schedule of ``func`` (None: not its); raises ValueError where TVM could not
    compile it (:func:`check_scratch`; a tunable rule's list of schedules is left to its tuner)."""
    sch = rule.apply(func, target, tunable)
    if sch is not None and not isinstance(sch, list):
        check_scratch(sch, func, target)
    return sch


__all__ = ["check_scratch", "checked_schedule", "has_clamped_extent", "lower"]
