"""Our schedule rules' kernels checked on the CPU, as a build hands them over.

No GPU runs here, so the numerics of a CUDA kernel are otherwise checked only on the GPU. But a
schedule is a loop transformation: with its thread loops made serial (``conftest.serial_threads``)
it runs on llvm. :class:`Recorder` wraps the rules of :func:`vtc_tvm.schedules.default_rules`
(ours; DLight's are left as they are) so that a CUDA build keeps every kernel one of ours
scheduled, as the rule saw it and as it scheduled it; :func:`check` runs both on llvm over the
same random arrays and compares every buffer afterwards (outputs pre-filled alike, so a kernel
that writes part of a buffer is compared on the rest too). The reference sums in float32 where
the kernel's 16-bit sums were widened (:func:`vtc_tvm.schedules.widen_accumulator`, as our rules
do), so the two differ by summation order and the final rounding only.

Not checked here: kernels on tensor cores (WMMA intrinsics have no llvm lowering), kernels with
scalar parameters; they are counted in ``skipped`` with the reason.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import SBlock
from tvm.s_tir.dlight import ScheduleRule

from vtc_tvm import schedules as S
from vtc_tvm.schedules import batched_gemv
from vtc_tvm.schedules.accumulate import needs_widening, reduction_update, widen_accumulator
from tests.conftest import serial_threads

OURS = tuple(type(r) for r in S.our_rules("cuda"))


@dataclasses.dataclass
class Taken:
    rule: str
    kernel: tirx.PrimFunc  # as the rule saw it
    scheduled: tirx.PrimFunc


class _Recording(ScheduleRule):
    def __init__(self, rule, taken: list):
        self.rule, self.taken = rule, taken

    def apply(self, func, target, tunable):
        sch = self.rule.apply(func, target, tunable)
        if sch is not None:
            self.taken.append(Taken(type(self.rule).__name__, func, sch.mod["main"]))
        return sch

    def is_target_available(self, target) -> bool:
        return self.rule.is_target_available(target)


class Recorder:
    """``rules``: :func:`vtc_tvm.schedules.default_rules` with ours recording into ``taken``
    (a pipeline's ``schedules=`` argument)."""

    def __init__(self, target):
        self.taken: list[Taken] = []
        self.rules = [_Recording(r, self.taken) if isinstance(r, OURS) else r for r in S.default_rules(target)]


def _scopes(func) -> set:
    found = []
    tvm_ffi.structural_walk(func.body, (SBlock, lambda b: found.extend(b.alloc_buffers)), order="post")
    return {buf.scope() for buf in found}


def skip_reason(taken: Taken) -> str | None:
    if any(s.startswith("wmma") for s in _scopes(taken.scheduled)):
        return "tensor cores"
    if not all(isinstance(p, tirx.Buffer) for p in taken.kernel.params):
        return "scalar parameters"
    return None


def reference(kernel: tirx.PrimFunc) -> tirx.PrimFunc:
    """``kernel`` with its one 16-bit reduction summing in float32, as our rules make it."""
    found = batched_gemv.single_reduction(kernel)
    if found is None:
        return kernel
    sch, block = found
    if reduction_update(sch.get(block)) is None or not needs_widening(sch, block):
        return kernel
    return widen_accumulator(sch, block).mod["main"]


def _arrays(kernel, rng, size: int):
    out = []
    for p in kernel.params:
        shape = [int(d) if isinstance(d, tirx.IntImm) else size for d in p.shape]
        dtype = str(p.dtype)
        if dtype.startswith(("int", "uint", "bool")):
            out.append(np.zeros(shape, dtype))  # indices in bounds for any gather
        else:
            out.append(rng.uniform(-1, 1, shape).astype(dtype))
    return out


def _run(func, arrays):
    lib = tvm.tirx.build(tvm.IRModule({"k": func.with_attr("global_symbol", "k")}), target="llvm")
    args = [tvm.runtime.tensor(a.copy()) for a in arrays]
    lib["k"](*args)
    return [a.numpy().astype(np.float64) for a in args]


def check(taken: Taken, seed: int = 0, size: int = 3) -> str | None:
    """None when ``taken.scheduled`` (threads serial) computes what ``taken.kernel`` does, within
    two 16-bit roundings of each buffer's scale; else what differs. Symbolic extents are ``size``."""
    arrays = _arrays(taken.kernel, np.random.default_rng(seed), size)
    want = _run(reference(taken.kernel), arrays)
    got = _run(serial_threads(taken.scheduled), arrays)
    for param, w, g in zip(taken.kernel.params, want, got):
        scale = max(np.abs(w).max(initial=0.0), 1e-30)
        eps = 2.0 ** -10 if str(param.dtype) in ("float16", "bfloat16") else 2.0 ** -20
        if np.isnan(w).any() != np.isnan(g).any():
            return f"{taken.rule}: {param.name} NaN on one side only"
        err = np.nanmax(np.abs(w - g), initial=0.0)
        if err > 2 * eps * scale:
            return f"{taken.rule}: {param.name} differs by {err:.3g} (scale {scale:.3g})"
    return None


def check_all(taken: list[Taken], seed: int = 0) -> tuple[list[str], dict]:
    """``(problems, skipped)`` over every kernel of ``taken`` (``skipped``: reason -> count)."""
    problems, skipped = [], {}
    for t in taken:
        why = skip_reason(t)
        if why:
            skipped[why] = skipped.get(why, 0) + 1
            continue
        problem = check(t, seed)
        if problem:
            problems.append(problem)
    return problems, skipped
