"""DecodeAttention: the two GEMMs of single-token attention over a KV cache, in float32.

Decode attention is ``scores = q K^T`` and ``out = probs V`` per (batch, KV head): a few query
rows (the GQA group ``h // n_rep`` read through the un-expanded cache, or one row of an expanded
one) against a 4096-long cache. DLight schedules them as SIMT Matmul tiles that sum all terms
of a thread in one 16-bit register (Gemma-2's head dim 256: 1.5e-2 against float64). This rule
schedules both as batched GEMVs (:mod:`vtc_tvm.schedules.batched_gemv`) that accumulate in
float32: ``q K^T`` spreads the context over the grid (one block per few keys), ``probs V``
splits the context over the 32 lanes of a warp and sums them with shuffles.

Limits: 1. the cache operand has batch axes (``(b, kv head)``), at most ``max_rows`` query
rows, fp16/bf16; 2. the context is not split across blocks (a flash-decoding merge kernel):
``probs V`` at batch 1 runs ``batch x kv heads x head_dim / (tn x vec)`` blocks; 3. static
shapes; the softmax between the GEMMs stays with DLight's reduction rules.
"""

from __future__ import annotations

from . import batched_gemv


class DecodeAttention(batched_gemv.BatchedGEMVRule):
    """Batched-GEMV, float32-accumulating schedule of decode attention's two GEMMs."""

    def __init__(self, max_rows: int = 16, min_context: int = 256):
        self.max_rows, self.min_context = max_rows, min_context

    def accepts(self, form: batched_gemv.GemvForm) -> bool:
        # the context is the column axis of q K^T (the reduction runs along the cache's
        # contiguous head dim) and the reduction axis of probs V (the columns are contiguous);
        # EfficientViT's k^T v (17 columns over a 1024-long reduction, along the columns' axis)
        # is neither: taken, it ran 0.471 against DLight's 0.372 ms at batch 16 on the H200
        context = form.N if form.inner == "red" else form.K
        return form.B > 1 and form.M <= self.max_rows and context >= self.min_context
