"""Cost: the predicted effect of an edge (and of a plan) on time, kernel launches and memory.

Analytic, per target kind (:data:`TARGETS`, data not code):

* eliminating a copy of ``B`` bytes saves its read and write, ``2 B / bandwidth``, plus one
  launch, and frees its ``B``-byte buffer;
* the rewritten consumer reads through the mapping: a mapping whose longest unit-stride run is
  shorter than one coalesced transaction costs the transactions it wastes
  (``B x (coalescing / run_bytes - 1) / bandwidth``, from :func:`vtc_tvm.analysis.contiguity`),
  and indirect reads pay the index loads;
* a free view (a reshape of a tensor that stays physical: stock TVM makes it a view, no copy)
  saves nothing but a per-target credit (``view_us``); a reshape composed through a virtual
  movement result saves the copy that would otherwise stay (:mod:`vtc_tvm.plan`);
* fusion lost: a consumer whose op pattern FuseOps fuses (elementwise/broadcast) that the
  rewrite turns into a pattern it does not fuse the same way (injective, opaque) becomes a kernel
  of its own: +1 launch and a write + read of its output.

Measured costs override the analytic decision where they exist (``profile=True``, or an earlier
measurement of the same kernels: :class:`vtc_tvm.profile.MeasuredEdges`).

Limits: 1. the CUDA bandwidth and launch overhead are fitted to the H200 copy kernels of the
shipped measurements (``python -m benchmarks.calibrate_cost``: 48 copies, 256 B to 39 MB, rms
error 2.6 us against 7.6 for the nominal 4 TB/s; no decision on the repo's workloads or the three
whole models changed with the fit); other GPUs get the same numbers and the CPU's are nominal
(one DDR channel set); 2. an edge's ``memory`` is the buffer it frees, an additive proxy the solver sums (for
``objective="memory"``); the planned bytes of a whole plan, with the sources it keeps alive and
the planner's packing, are :mod:`vtc_tvm.memory`'s prediction, which the plan's memory constraint
uses; 3. a symbolic tensor is costed at its largest size (:func:`largest_bytes`): each symbolic
dimension at the upper bound its function declares (``tir_var_upper_bound``, the attribute
TVM's ``StaticPlanBlockMemory`` reads), else at :data:`SYMBOLIC_EXTENT` (2^20). A gain is a
launch plus a per-byte term, so one that is positive at the largest size is positive at every
smaller size; a read that loses per byte stays physical unless a declared bound keeps its bytes
below what the launch saves (at small sizes such a read could have saved a launch: the plan is
then no faster than stock there, never slower). Its ``memory`` counts zero bytes (the memory
prediction is static only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import tvm
import tvm_ffi
from tvm import tirx

from .analysis import BROADCAST
from .mapping import dim

# bytes/us, us per launch, bytes per coalesced transaction, and the credit for reading through a
# free view (a reshape of a physical tensor, which stock TVM does not copy either): on GPUs a
# token, so that such reads are taken where they cost nothing; on CPUs none, as the index
# arithmetic they add to the consumer's loop is not free there (an o-projection reading through
# the attention's reshape, ``k // 64, k % 64``: 2.6% slower, cost_calibration_llvm.md)
TARGETS = {
    "cuda": dict(bandwidth=1.3e6, launch_us=2.8, coalescing=128, view_us=1e-3),  # H200 copies, fitted (calibrate_cost)
    "llvm": dict(bandwidth=2.0e4, launch_us=0.5, coalescing=64, view_us=0.0),    # ~20 GB/s, one cache line
}
_DEFAULT = TARGETS["cuda"]


def constants(target) -> dict:
    kind = target.kind.name if target is not None else "cuda"
    return TARGETS.get(kind, _DEFAULT)


@dataclass(frozen=True)
class EdgeCost:
    """What choosing an edge changes: ``gain_us`` saved (negative: slower), ``kernels`` and
    ``memory`` (bytes) added (negative: fewer/less). ``copy_*`` is the share of the eliminated
    copy (split among the edges of one virtual tensor, which are taken together)."""

    gain_us: float
    kernels: int
    memory: int
    detail: str
    measured: bool = False


# The extent a symbolic dimension is costed at when its function declares no upper bound: large
# enough that the bytes moved outweigh any launch, so that the decision holds at every size.
SYMBOLIC_EXTENT = 1 << 20


def largest_bytes(shape, dtype: str, upper_bounds: dict) -> Optional[int]:
    """Bytes of a ``dtype`` tensor of ``shape`` (a Relax shape's values) with each symbolic
    variable at ``upper_bounds[name]`` or :data:`SYMBOLIC_EXTENT`; None if a dimension does not
    evaluate to a constant, or names symbolic variables more than three times (at 2^20 each, its
    value could overflow the int64 arithmetic that evaluates it)."""
    ana, n = tvm.sym.Analyzer(), 1
    for d in map(dim, shape):
        if not isinstance(d, int):
            found = []
            tvm_ffi.structural_walk(d, (tirx.Var, found.append), order="post")
            if len(found) > 3:
                return None
            for v in dict.fromkeys(found):
                ana.bind(v, tirx.IntImm(str(v.ty), int(upper_bounds.get(v.name, SYMBOLIC_EXTENT))))
            d = dim(ana.simplify(d))
            if not isinstance(d, int):
                return None
        n *= max(d, 0)
    dt = tvm.runtime.DataType(dtype)
    return n * ((dt.bits * dt.lanes + 7) // 8)


def copy_saving(nbytes: Optional[int], target) -> float:
    """Time of the copy kernel that materialises ``nbytes``: read + write, plus a launch."""
    c = constants(target)
    return 2 * (nbytes or 0) / c["bandwidth"] + c["launch_us"]


# A free view of constants (a weight reshaped) is folded by FoldConstant otherwise, which builds
# and runs a kernel for it at compile time (1.7 s of ShuffleNetV2's 3.4 s compile on the CPU): a
# token credit on every target, so that its reader reads the constant through the mapping.
CONSTANT_VIEW_US = 1e-3


def view_credit(target, of_constants: bool = False) -> float:
    """What reading through a free view saves (see :data:`TARGETS`, :data:`CONSTANT_VIEW_US`)."""
    return CONSTANT_VIEW_US if of_constants else constants(target)["view_us"]


def read_penalty(nbytes: Optional[int], contig, dtype_bytes: int, target) -> float:
    """Extra time of a consumer reading ``nbytes`` through a mapping of contiguity ``contig``."""
    if not nbytes or contig is None or contig.full:
        return 0.0
    c = constants(target)
    run_bytes = max(contig.inner_run, contig.best_axis_run, 1) * dtype_bytes
    waste = max(c["coalescing"] / run_bytes - 1.0, 0.0)
    extra = nbytes * min(waste, 8.0) / c["bandwidth"]
    if contig.indirect:
        extra += nbytes / c["bandwidth"]  # the index loads
    return extra


def fusion_lost(before: Optional[int], after: Optional[int], behind_tiled: bool) -> bool:
    """Whether FuseOps groups the rewritten consumer worse than the original: a consumer it
    fused into a GEMM/conv epilogue (elementwise/broadcast behind an ``OutEWiseFusable``
    producer, ``behind_tiled``) that is now injective or opaque, which FuseOps does not fuse
    there."""
    return behind_tiled and before is not None and after is not None and before <= BROADCAST < after


def edge_cost(share: float, nbytes: Optional[int], out_bytes: Optional[int], contig, dtype_bytes: int,
              before: Optional[int], after: Optional[int], behind_tiled: bool, target, kernels_saved: int,
              memory_freed: int) -> EdgeCost:
    """Cost of one load edge. ``share`` of the copy's time, ``kernels_saved`` launches and
    ``memory_freed`` bytes are this edge's part of what eliminating the copy saves."""
    c = constants(target)
    penalty = read_penalty(nbytes, contig, dtype_bytes, target)
    kernels = -kernels_saved
    gain = share - penalty
    detail = f"copy share {share:.2f} us, read penalty {penalty:.2f} us"
    if fusion_lost(before, after, behind_tiled):
        kernels += 1
        gain -= c["launch_us"] + 2 * (out_bytes or 0) / c["bandwidth"]
        detail += f"; fusion lost (op pattern {before} -> {after}): +1 kernel"
    return EdgeCost(gain, kernels, -memory_freed, detail)


__all__ = ["SYMBOLIC_EXTENT", "TARGETS", "EdgeCost", "constants", "copy_saving", "largest_bytes", "view_credit", "read_penalty", "fusion_lost", "edge_cost"]
