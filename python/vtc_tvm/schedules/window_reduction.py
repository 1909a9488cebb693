"""WindowReduction: depthwise convolutions and pooling windows, one thread an output element.

A depthwise 3x3 convolution sums 9 products an output element. TVM 0.27's default CUDA rules
give it to DLight's GeneralReduction, which spreads those 9 terms over a block's threads: one
output element a block, 9 of 256 threads busy, a tree reduction and three barriers for 9
multiply-adds (read from its CUDA output). In ShuffleNetV2 x1.0 at batch 16 the depthwise
convolutions took about 6.5 of the 7.1 ms of GPU time on the H200 (``benchmarks/results/paper.json``,
commit 688756f: e.g. one 116-channel 3x3 kernel 2257 us a call). Here each thread computes
whole output elements: the window's terms unrolled into one float32 register (fp16/bf16 inputs,
:func:`.accumulate.widen_accumulator`), then the epilogue (bias, activation, the cast back) on
that value before the one store; consecutive threads take consecutive output columns, so the
window's loads coalesce.

Limits: 1. one reduction block writing one buffer (not argmax's value and index pair), whose
reads index a window (an index that adds a reduction axis to a spatial one, ``x[n, c, h * 2 +
kh, w * 2 + kw]``; a grouped convolution's 1x1 window counts, so EfficientViT's grouped 1x1
convolutions of 8 channels a group are taken), the other blocks injective (a padding producer inlined, at most one epilogue after inlining); 2. no GEMM
in it (:func:`holds_a_gemm`): a dense convolution, even a network's RGB stem of 27 terms, is an
implicit GEMM that DLight's Matmul rule tiles; 3. at most ``max_terms`` terms an output element
(a static reduction extent); 4. at least ``min_outputs`` output elements when the spatial
extents are static (below, a block of threads is mostly idle either way). Pooling windows (max,
average) are taken like depthwise convolutions (DLight gives an average pool to GeneralReduction
too, a max pool to its Fallback, one thread an output as here).
"""

from __future__ import annotations

import math

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import collect_block_iter_vars_used_in_access_region, normalize_prim_func
from tvm.s_tir.dlight.base import try_inline_contiguous_spatial
from tvm.s_tir.dlight.base.utils import max_threads_per_block
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule

from . import batched_gemv
from .accumulate import needs_widening, reduction_update, widen_accumulator

THREADS = 256  # threads a block (one output element each)


def reads_a_window(stmt) -> bool:
    """Whether one of ``stmt``'s read indices adds a reduction axis to a spatial one."""
    kinds = {iv.var: iv.iter_type for iv in stmt.iter_vars}
    for read in stmt.reads:
        for dim in read.region:
            used = collect_block_iter_vars_used_in_access_region(stmt, [dim])
            roles = {kinds[v] for v in used if v in kinds}
            if {tirx.IterVar.CommReduce, tirx.IterVar.DataPar} <= roles:
                return True
    return False


def holds_a_gemm(stmt) -> bool:
    """Whether two of ``stmt``'s reads each have an output axis of their own (``x[n, ci, h + kh, w + kw]``
    and ``w[co, ci, kh, kw]``: a dense convolution is an implicit GEMM, which DLight's Matmul rule
    tiles; a depthwise or grouped one reads the output channel in both operands)."""
    spatial = {iv.var for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.DataPar}
    used = [set(collect_block_iter_vars_used_in_access_region(stmt, r.region)) & spatial for r in stmt.reads]
    return any(a - b and b - a for i, a in enumerate(used) for b in used[i + 1:])


def static_extent(stmt, kind=None, iter_vars=None):
    """The product of ``stmt``'s iter extents of ``kind`` (or of the block vars ``iter_vars``);
    None if one is not static."""
    extents = [iv.dom.extent for iv in stmt.iter_vars
               if (iv.iter_type == kind if iter_vars is None else iv.var in iter_vars)]
    if not all(isinstance(e, tirx.IntImm) for e in extents):
        return None
    return math.prod(int(e) for e in extents)


class WindowReduction(GPUScheduleRule):
    """One thread an output element of a small-window reduction; None ("not mine") otherwise."""

    def __init__(self, max_terms: int = 64, min_outputs: int = 1024):
        self.max_terms, self.min_outputs = max_terms, min_outputs

    def accepts(self, stmt) -> bool:
        """Limits 1-4 on the reduction block ``stmt`` (the epilogue count is checked when scheduling)."""
        terms = static_extent(stmt, tirx.IterVar.CommReduce)
        outputs = static_extent(stmt, tirx.IterVar.DataPar)
        return (len(stmt.writes) == 1 and terms is not None and 1 < terms <= self.max_terms
                and (outputs is None or outputs >= self.min_outputs) and reads_a_window(stmt)
                and not holds_a_gemm(stmt))

    def apply(self, func, target, _tunable):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        # the test reads the blocks alone: no schedule is built for the kernels it cannot be
        if not any(b.init is not None and self.accepts(b) for b in batched_gemv._blocks(func)):
            return None
        found = batched_gemv.single_reduction(func)
        if found is None or not self.accepts(found[0].get(found[1])):
            return None
        try:
            return self._schedule(*found, min(THREADS, max_threads_per_block(target)))
        except s_tir.ScheduleError:
            return None

    @staticmethod
    def _schedule(sch: s_tir.Schedule, block, threads: int) -> s_tir.Schedule | None:
        name = sch.get(block).name_hint
        if reduction_update(sch.get(block)) is not None and needs_widening(sch, block):
            sch = widen_accumulator(sch, block)  # a sum of 16-bit terms: a float32 register
        rest = try_inline_contiguous_spatial(sch, normalize_prim_func(sch))
        if rest is None or len(rest) > 2 or not rest[0].is_reduction() or len(rest) == 2 and not rest[1].is_injective():
            return None
        block = sch.get_sblock(name)
        spatial = batched_gemv._spatial_loops(sch, block)
        reduction = sch.get_loops(block)[len(spatial):]
        bx, tx = sch.split(sch.fuse(*spatial), factors=[None, threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        # the element's value stays in a register until the epilogue (or a plain copy) stores it
        if len(rest) == 2:
            sch.set_scope(block, 0, "local")
            sch.reverse_compute_at(rest[1].block_rv, tx, preserve_unit_loops=True)
        else:
            sch.reverse_compute_at(sch.cache_write(block, 0, "local"), tx, preserve_unit_loops=True)
        for loop in reduction:
            sch.unroll(loop)
        sch.decompose_reduction(block, reduction[0])
        return sch
