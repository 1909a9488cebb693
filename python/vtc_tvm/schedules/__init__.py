"""Schedule rules for small-batch (decode) kernels, DLight style, and their wiring.

``default_rules(target)`` is our rules followed by exactly the rule list of TVM's own CUDA
pipeline, each :class:`.guard.Guarded` (one that raises on a kernel, or schedules it in a way TVM
cannot compile, passes it on);
``ApplySchedules(target)`` is ``dlight.ApplyDefaultSchedule`` over that list.

* :class:`TensorCoreGEMM` (:mod:`.tensor_core_gemm`): 16..64-row fp16 projections on WMMA tensor cores
* :class:`LowBatchGEMM` (:mod:`.low_batch_gemm`): 1 <= M <= 64 projections as batched GEMVs (the rest)
* :class:`DecodeAttention` (:mod:`.decode_attention`): q K^T and probs V over a KV cache
* :class:`WindowReduction` (:mod:`.window_reduction`): depthwise convolutions and pooling
  windows, one thread an output element (DLight spreads their 9 terms over a block)
* :class:`NarrowGEMM` (:mod:`.narrow_gemm`): GEMMs and dense convolutions with <= 32 output
  channels, DLight's Matmul schedule with its tile fitted (DLight pads them to 64)
* :class:`FittedTensorCoreGEMM` (:mod:`.fitted_tensor_core`): many-row fp16 GEMMs of > 32
  output channels that DLight leaves to SIMT (an extent <= 64) or fails on (a symbolic batch),
  on WMMA with the tile fitted
* :func:`widen_accumulator` (:mod:`.accumulate`): the float32-accumulation TIR rewrite both use
* :class:`.recording.Recording`: a rule wrapped to report the kernels it schedules (tests, census)
* :mod:`.batched_gemv`: the shared matcher, schedule and tiling plan (target data: SM counts)

Default of the ``"vtc"`` pipeline on GPU targets (``schedules="vtc"``); stock TVM gets them
through the ``"stock_vtc_schedules"`` pipeline (H200 evidence: ``benchmarks/schedules_h200.py``,
``benchmarks/results/schedules_h200.md``).
"""

from __future__ import annotations

import tvm

from .accumulate import widen_accumulator
from .decode_attention import DecodeAttention
from .fitted_tensor_core import FittedTensorCoreGEMM
from .guard import Guarded, report_defect, unguarded
from .low_batch_gemm import LowBatchGEMM
from .narrow_gemm import NarrowGEMM
from .tensor_core_gemm import TensorCoreGEMM
from .window_reduction import WindowReduction


def stock_rules(target) -> list:
    """The DLight rules of the ``ApplyDefaultSchedule`` pass in TVM's pipeline for ``target``
    (read from the backend's own ``legalize_passes``, not copied; [] when it has none)."""
    from vtc_tvm.pipeline import _backend

    target = tvm.target.Target(target)
    for p in _backend(target).legalize_passes(target):
        if p.info.name == "ApplyDefaultSchedule":
            return list(p.rules)
    return []


def our_rules(target) -> list:
    """Our rules, most specialised first (they return None on anything else)."""
    return [WindowReduction(), DecodeAttention(), TensorCoreGEMM(), LowBatchGEMM(), NarrowGEMM(),
            FittedTensorCoreGEMM()]


def default_rules(target) -> list:
    """Our rules first, then exactly TVM's own rule list for ``target``, each :class:`.Guarded`
    (a rule that raises on a kernel, or schedules it in a way TVM cannot compile, passes it on to
    the next rule instead of ending the build; :func:`.guard.unguarded` gives the rule back). An
    error of ours is also a warning (:func:`.guard.report_defect`), DLight's a debug message."""
    return [Guarded(r, report_defect) for r in our_rules(target)] + [Guarded(r) for r in stock_rules(target)]


def ApplySchedules(target) -> tvm.transform.Pass:  # noqa: N802 - a pass, named like TVM's
    """``dlight.ApplyDefaultSchedule(*default_rules(target))``."""
    from tvm.s_tir import dlight as dl

    return dl.ApplyDefaultSchedule(*default_rules(target))


__all__ = ["ApplySchedules", "DecodeAttention", "FittedTensorCoreGEMM", "Guarded", "LowBatchGEMM", "default_rules", "NarrowGEMM", "our_rules",
           "stock_rules", "TensorCoreGEMM", "unguarded", "WindowReduction", "widen_accumulator"]
