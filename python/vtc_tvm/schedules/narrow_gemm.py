"""NarrowGEMM: GEMMs and dense convolutions with few output channels, DLight's tile fitted to them.

DLight's Matmul rule (TVM 0.27, CUDA) normalises a GEMM to ``C[S, I, J] += A[S, I, K] * B[S, J, K]``
(a convolution: I the output pixels, J the output channels, K the window times the input
channels) and computes 32 x 64 (I x J) tiles, 8 x 16 threads of 4 x 4 outputs, both extents
padded to the tile (``pad_einsum``); tensor cores only when every non-batch extent is > 64. A
convolution with 8, 16 or 32 output channels therefore computes 8, 4 or 2 times the products it
needs, the padded ones on zeros. YOLO11n is made of such convolutions at high resolution: its
C3k2 block at batch 16 runs four, J = 8, 16, 32 and 64 over 409600 pixels: 0.54 of the 0.67 ms
of GPU time stock spends on it (``benchmarks/results/paper_h200_three_columns.json``, DLight,
H200; 0.55 of vtc's 0.58). Here DLight's own
Matmul schedule runs with the tile fitted to J: the threads along J cover J rounded up to a
multiple of 4 (``MICRO``), the threads along I fill the block to ``THREADS`` (a thread's rows
interleaved with its neighbours', :func:`fitted_config`), and the reduction step is 16 terms
(8 when K < 16); everything else (shared-memory staging of both operands, the register tile,
the epilogue in the store) is DLight's. A 16-bit accumulator is widened to float32 first
(:func:`.accumulate.widen_accumulator`): DLight sums in the output's dtype, and a 3x3
convolution over 64 channels adds 576 products.

Limits: 1. one reduction block, a GEMM DLight's Matmul normalises (its reads ``A`` then ``B``),
injective blocks around it; 2. J static and at most ``max_cols`` (32: at 33..64 DLight's
padding wastes at most a half, at 48 a quarter; not taken); 3. I at least ``min_rows`` (or
symbolic): a GEMM with few rows is :class:`.LowBatchGEMM`'s or :class:`.TensorCoreGEMM`'s;
4. CUDA-like targets (DLight's ``is_target_available``); 5. the tile is fitted, not tuned;
6. not taken where its grid has fewer than ``MIN_BLOCKS_PER_SM`` blocks an SM and DLight's 32-row
tiles have that many (:func:`starves_the_gpu`): C3k2 at batch 1 (160 x 160 pixels, 100 to 400
of these blocks on 132 SMs) ran 24 us slower with this rule than with DLight's tiles on an H100,
1.45x faster at batch 16 (``benchmarks/results/rule_ab_h100_s22.json``). A symbolic I is taken.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import collect_block_iter_vars_used_in_access_region
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule
from tvm.s_tir.dlight.gpu.matmul import Matmul

from . import batched_gemv
from .accumulate import needs_widening, reduction_update, widen_accumulator
from .window_reduction import holds_a_gemm, static_extent

THREADS = 128  # threads a block, as DLight's CUDA tile (8 x 16)
MICRO = 4  # outputs a thread along each of I and J, as DLight's
MIN_BLOCKS_PER_SM = 4  # 16 warps an SM: below that a SIMT tile cannot hide its loads' latency


def narrow_extents(stmt):
    """``(I, J)`` of a GEMM block as DLight's Matmul normalises it (I: spatial iters read by the
    first operand only, J: by the second only), each None when not static; None when ``stmt``
    is not such a block."""
    if stmt.init is None or len(stmt.reads) < 2 or reduction_update(stmt) is None or not holds_a_gemm(stmt):
        return None
    spatial = {iv.var for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.DataPar}
    a, b = (set(collect_block_iter_vars_used_in_access_region(stmt, r.region)) & spatial for r in stmt.reads[:2])
    return static_extent(stmt, iter_vars=a - b), static_extent(stmt, iter_vars=b - a)


def fitted_config(cols: int, red: int | None) -> Matmul.Config:
    """DLight's CUDA Matmul config with the J side of the tile fitted to ``cols`` columns.

    A thread still computes MICRO x MICRO outputs, but its MICRO rows are MICRO virtual threads
    apart (``vthread_x``) rather than adjacent: with 32 threads of a warp along I (DLight has 8),
    adjacent rows would put a warp's reads of the shared ``A`` tile (rows of 16 + 2 halves) on 8
    banks, 4-way conflicts; rows ``tx`` apart put them on 32 (and the stores coalesce)."""
    ty = -(-cols // MICRO)
    tx = 1 << ((THREADS // ty).bit_length() - 1)  # a power of two, ty * tx <= THREADS
    return Matmul.Config(block_size_x=tx, block_size_y=ty, vthread_x=MICRO, vthread_y=1, micro_size_x=1,
                         micro_size_y=MICRO, micro_size_k=16 if red is None or red >= 16 else 8,
                         vector_size=2, unroll=256, use_shared=True, storage_align=True, inner_x=False)


def _tile_rows(config: Matmul.Config) -> int:
    return config.block_size_x * config.vthread_x * config.micro_size_x


def starves_the_gpu(rows: int, config: Matmul.Config, target) -> bool:
    """Whether ``config``'s tile leaves fewer than ``MIN_BLOCKS_PER_SM`` blocks an SM for ``rows``
    rows where DLight's own tile (32 rows a block) does not: fewer padded products do not pay
    for an idle GPU (limit 6)."""
    want = MIN_BLOCKS_PER_SM * batched_gemv.sm_count(target)
    dlight = _tile_rows(Matmul().get_configs(target))
    return -(-rows // _tile_rows(config)) < want <= -(-rows // dlight)


class _FittedMatmul(Matmul):
    """DLight's Matmul rule with a given config (its own reads the target only)."""

    def __init__(self, config: Matmul.Config):
        super().__init__()
        self.config = config

    def get_configs(self, target) -> Matmul.Config:
        return self.config


class NarrowGEMM(GPUScheduleRule):
    """DLight's Matmul schedule, its tile fitted to a GEMM's few columns; None ("not mine") otherwise."""

    def __init__(self, max_cols: int = 32, min_rows: int = 256):
        self.max_cols, self.min_rows = max_cols, min_rows

    def columns(self, stmt) -> int | None:
        """J of the reduction block ``stmt`` where limits 2 and 3 hold on it, else None."""
        found = narrow_extents(stmt)
        if found is None:
            return None
        rows, cols = found
        ok = cols is not None and cols <= self.max_cols and (rows is None or rows >= self.min_rows)
        return cols if ok else None

    def apply(self, func, target, tunable):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        # the test reads the blocks alone: no schedule is built for the kernels it cannot be
        if not any(self.columns(b) for b in batched_gemv._blocks(func)):
            return None
        found = batched_gemv.single_reduction(func)
        cols = None if found is None else self.columns(found[0].get(found[1]))
        if cols is None:
            return None
        sch, block = found
        config = fitted_config(cols, static_extent(sch.get(block), tirx.IterVar.CommReduce))
        rows = narrow_extents(sch.get(block))[0]
        if rows is not None and starves_the_gpu(rows, config, target):
            return None
        if needs_widening(sch, block):
            sch = widen_accumulator(sch, block)  # DLight accumulates in the output dtype
        try:
            return _FittedMatmul(config).apply(sch.mod["main"], target, tunable)
        except (s_tir.ScheduleError, ValueError):
            return None
