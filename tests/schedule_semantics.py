"""Our schedule rules' kernels checked on the CPU, as a build hands them over.

No GPU runs here, so the numerics of a CUDA kernel are otherwise checked only on the GPU. But a
schedule is a loop transformation: with its thread loops made serial (``conftest.serial_threads``)
it runs on llvm. :class:`Recorder` wraps the rules of :func:`vtc_tvm.schedules.default_rules`
(ours; DLight's are left as they are) so that a CUDA build keeps every kernel one of ours
scheduled, as the rule saw it and as it scheduled it; :func:`check` checks that its blocks'
shared memory launches (no GPU needed: static and dynamic bytes as lowered) and runs both on llvm over the
same random arrays and compares every buffer afterwards (outputs pre-filled alike, so a kernel
that writes part of a buffer is compared on the rest too). The reference sums in float32 where
the kernel's 16-bit sums were widened (:func:`vtc_tvm.schedules.widen_accumulator`, as our rules
do), so the two differ by summation order and the final rounding only.

A kernel on tensor cores (WMMA intrinsics have no llvm lowering) is checked through its twin: the
same rule with ``tensorize=False`` schedules the same kernel with the 16x16 tiles left as loops
over thread-local buffers (same loop nest, staging and index arithmetic; not checked: that the
intrinsics compute their tiles, which TVM's own tensorize matching guarantees). A symbolic size
passed as a scalar parameter gets the size its buffers are made with (until session 22 such
kernels were meant to be skipped, and the test for it, ``isinstance(p, tirx.Buffer)``, holds for
any Var in TVM 0.27: ``tests/regressions/case_71b073042e.py`` crashed the harness).
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import tvm
from tvm import tirx

from vtc_tvm import schedules as S
from vtc_tvm.schedules import batched_gemv
from vtc_tvm.errors import last_line
from vtc_tvm.schedules.recording import Recording
from vtc_tvm.schedules.accumulate import needs_widening, reduction_update, widen_accumulator
from tests.conftest import (allocated_buffers, kernel_arrays, launchable, run_llvm_all, serial_threads,
                            shared_memory_bytes)

OURS = tuple(type(r) for r in S.our_rules("cuda"))


@dataclasses.dataclass
class Taken:
    rule: str
    kernel: tirx.PrimFunc  # as the rule saw it
    scheduled: tirx.PrimFunc
    twin: tirx.PrimFunc | None = None  # WMMA kernels: the rule's schedule with the tiles as loops
    target: tvm.target.Target | None = None  # CUDA: the block's shared memory must launch there


class Recorder:
    """``rules``: :func:`vtc_tvm.schedules.default_rules` with ours recording into ``taken``
    (a pipeline's ``schedules=`` argument) and what ours raised, or scheduled in a way TVM
    cannot compile, into ``raised`` (the guard hands such a kernel to the next rule: the build
    goes on, but the rule has a defect)."""

    def __init__(self, target):
        self.taken: list[Taken] = []
        self.raised: list[str] = []
        self.target = tvm.target.Target(target)
        self.rules = [Recording(S.Guarded(S.unguarded(r), self._raise), self._take)
                      if isinstance(S.unguarded(r), OURS) else r for r in S.default_rules(target)]

    def _raise(self, rule, func, err) -> None:
        self.raised.append(f"{type(rule).__name__} raised {type(err).__name__}: {last_line(err)}")

    def check(self, seed: int = 0) -> tuple[list[str], dict]:
        """:func:`check_all` over every kernel taken, each error raised counted as a problem."""
        problems, skipped = check_all(self.taken, seed)
        return self.raised + problems, skipped

    def _take(self, rule, func, sch) -> None:
        rule = S.unguarded(rule)
        scheduled = sch.mod["main"]
        twin = _untensorized(rule, func, self.target) if on_tensor_cores(scheduled) else None
        self.taken.append(Taken(type(rule).__name__, func, scheduled, twin, self.target))


def on_tensor_cores(func: tirx.PrimFunc) -> bool:
    return any(buf.scope().startswith("wmma") for buf in allocated_buffers(func))


def _untensorized(rule, func, target) -> tirx.PrimFunc | None:
    """``rule``'s schedule of ``func`` with ``tensorize=False`` (None: the rule has no such mode)."""
    if not hasattr(rule, "tensorize"):
        return None
    twin = copy.copy(rule)
    twin.tensorize = False
    with target:
        sch = twin.apply(func, target, False)
    return None if sch is None else sch.mod["main"]


def skip_reason(taken: Taken) -> str | None:
    if on_tensor_cores(taken.scheduled) and taken.twin is None:
        return "tensor cores without an untensorized twin"
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


def check(taken: Taken, seed: int = 0, size: int = 3) -> str | None:
    """None when ``taken.scheduled`` (threads serial) computes what ``taken.kernel`` does, within
    two 16-bit roundings of each buffer's scale, and (with a target) its blocks' shared memory
    launches (:func:`tests.conftest.launchable`); else what differs. Symbolic extents are ``size``."""
    if taken.target is not None and taken.target.kind.name == "cuda":
        static, dynamic = shared_memory_bytes(taken.scheduled, taken.target)
        if not launchable(static, dynamic):
            return f"{taken.rule}: {static} static + {dynamic} dynamic shared bytes a block do not launch"
    arrays = kernel_arrays(taken.kernel, np.random.default_rng(seed), size=size)
    copy = lambda: [a.copy() if isinstance(a, np.ndarray) else a for a in arrays]  # a symbolic size: an int
    want = run_llvm_all(reference(taken.kernel), copy())
    got = run_llvm_all(serial_threads(taken.twin or taken.scheduled), copy())
    for param, w, g in zip(taken.kernel.params, want, got):
        if not tirx.is_buffer_var(param):
            continue
        w, g = w.astype(np.float64), g.astype(np.float64)
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
