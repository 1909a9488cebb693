"""LowBatchGEMM: a GEMM with a static handful of rows and a large weight, at memory bandwidth.

DLight's Matmul rule uses tensor cores only when every non-batch extent exceeds 64, so the
M = 16 decode projections of an LLM layer run as SIMT tiles that re-read the weight; its
LowBatchGEMV needs a symbolic batch axis and is not in the default CUDA pipeline. This rule
schedules ``C[m, n] = sum_k A[m, k] * W[k, n]`` (``W[n, k]`` too; ``A`` may be read through any
index mapping, e.g. a virtual tensor's ``A[b, k // 128, 0, k % 128]``) as a batched GEMV:
each weight element is loaded once, 128 bits at a time, for all M rows, which sit in float32
registers (:mod:`vtc_tvm.schedules.batched_gemv`).

One row (batch-1 decode) is taken too: DLight schedules ``[1, K] x [K, N]`` with its Reduction
rule, 2-byte loads and a 16-bit running sum of K / 16 terms a thread (TVM 0.27, read from its
CUDA output); here lanes run along the contiguous columns with 128-bit loads.

Limits: 1. ``min_rows <= M <= max_rows`` (default 1..64); 2. the
weight has no batch axes and at least ``min_weight`` elements; 3. a reduction of at least
``min_reduction`` terms (default 256): a 1x1 convolution at batch 1 is a GEMM of 64 "rows" (its
output channels) over 48 input channels, where the batched GEMV idles most lanes of a warp (on the
H200 it made YOLO's C3K2 block 0.470 ms against DLight's 0.068); 4. fp16/bf16 operands;
5. static shapes; 6. one reduction block plus injective blocks (inlined or one epilogue).
"""

from __future__ import annotations

from . import batched_gemv


class LowBatchGEMM(batched_gemv.BatchedGEMVRule):
    """Batched-GEMV schedule of a few-row GEMM against a weight matrix."""

    def __init__(self, min_rows: int = 1, max_rows: int = 64, min_weight: int = 1 << 20,
                 min_reduction: int = 256):
        self.min_rows, self.max_rows, self.min_weight = min_rows, max_rows, min_weight
        self.min_reduction = min_reduction

    def accepts(self, form: batched_gemv.GemvForm) -> bool:
        return (form.B == 1 and self.min_rows <= form.M <= self.max_rows
                and form.N * form.K >= self.min_weight and form.K >= self.min_reduction)
