"""TensorCoreGEMM: a GEMM of 16..64 rows against a large weight on tensor cores, at memory bandwidth.

A decode projection at batch 16 (``[16, 4096] x [4096, 14336]``) does 2 flops a weight byte: the
batched GEMV of :mod:`.low_batch_gemm` keeps 16 float32 sums a lane and runs into the SIMT FMA
rate (78 us on the H200, against 27 us to stream the weight). Here each warp multiplies the
M rows by a strip of ``16 * jt`` columns with WMMA 16x16x16 (fp16 in, float32 accumulate):

* the weight's 16x16 fragments are loaded **straight from global memory** (each element once,
  ``kt`` reduction steps unrolled so that several loads are in flight); the rows' operand (which
  may be read through any index mapping, e.g. a virtual tensor's ``A[m, k // 128, 0, k % 128]``)
  is staged once a block in shared memory, ``M x K / split`` elements;
* ``warps`` warps a block along the columns, the reduction split over ``split`` blocks so that
  about ``WARPS_PER_SM`` warps an SM stream the weight; the float32 partials go to global memory and a
  second kernel sums them (in order), casts and runs the epilogue (as :mod:`.batched_gemv`).

Limits: 1. ``M`` a multiple of 16 in ``16..max_rows``, one row, column and reduction axis, no
batch axes; 2. the weight is a plain 2-D buffer indexed ``W[k, n]`` or ``W[n, k]`` by the bare
axes (no offset), ``N % 16 == 0``; 3. fp16 operands (the WMMA intrinsics TVM registers);
4. static shapes, the reduction divisible into ``split x kt x 16`` steps and a block's share of
the rows' operand within ``SHARED_BYTES``; 5. anything a schedule primitive or tensorize rejects
is "not mine" (the next rule, :class:`.LowBatchGEMM`, takes it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from tvm import s_tir, tirx
from tvm.support import nvcc
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule

from ..copy_schedule import block_lanes
from . import batched_gemv, wmma

MMA = 16  # the WMMA tile: 16x16x16
# Target knowledge as data: WMMA fp16 -> float32 needs sm_70 or newer.
MIN_ARCH = 70
WARPS_PER_SM = 24  # warps an SM streaming the weight (global loads in flight)
MIN_CHUNK = 256  # reduction terms a block keeps at least (below, staging and partials dominate)
SHARED_BYTES = 48 * 1024  # a block's share of the rows' operand (static limit without an opt-in)
SHARED_PAD = 8  # fp16 elements padding each staged row (bank conflicts of the fragment loads)
MAX_SPLIT = 32


@dataclass(frozen=True)
class TCTiling:
    """``warps`` warps a block along the columns, ``jt`` 16-column fragments a warp, ``kt``
    16-deep reduction steps unrolled, the reduction split over ``split`` blocks."""

    warps: int = 4
    jt: int = 2
    kt: int = 4
    split: int = 2


def _intrinsics(weight_rows_are_cols: bool) -> dict:
    """The WMMA intrinsics of the schedule (:mod:`.wmma`): the rows' fragments load from dynamic
    shared memory, the weight's straight from global memory (row-major ``W[k, n]`` or, transposed,
    ``W[n, k]``), the float32 fragments store to global."""
    trans = "_trans" if not weight_rows_are_cols else ""
    return {
        "load_a": wmma.intrinsic("wmma_load_16x16x16_f16_a_shared_dyn", "get_wmma_load_intrin",
                                 MMA, MMA, MMA, "float16", "shared.dyn", False, False),
        "load_b": wmma.intrinsic(f"wmma_load_16x16x16_f16_b{trans}_global", "get_wmma_load_intrin",
                                 MMA, MMA, MMA, "float16", "global", True, bool(trans)),
        "store": wmma.intrinsic("wmma_store_16x16x16_f32_global", "get_wmma_store_intrin",
                                MMA, MMA, MMA, "float32", "global"),
        "init": wmma.intrinsic("wmma_fill_16x16x16_f32", "get_wmma_fill_intrin", MMA, MMA, MMA, "float32"),
        "compute": wmma.intrinsic(f"wmma_sync_16x16x16_f16f16f32{trans}", "get_wmma_sync_intrin",
                                  MMA, MMA, MMA, "float16", "float32", bool(trans)),
    }


def plan(form: batched_gemv.GemvForm, target) -> Optional[TCTiling]:
    """The tiling for ``form`` on ``target`` (None when none fits the limits): the widest strip
    that divides the columns, then the reduction split in two until ``WARPS_PER_SM`` warps an SM
    stream the weight, while a block keeps ``MIN_CHUNK`` reduction terms (H200 sweep of session 11,
    ``benchmarks/results/h200_session11.md``: gate 14336x4096 at batch 16 92 us at split 4, 54 at 8;
    down 4096x14336 64 at 16, 52 at 32; q 4096x4096 16.6..17.0 at 8..16, 18.5 at 32, where a block
    has 128 terms) and its rows fit ``SHARED_BYTES``."""
    sms = batched_gemv.sm_count(target)
    for warps, jt in ((4, 2), (4, 1), (2, 1), (1, 1)):
        if form.N % (MMA * warps * jt) == 0:
            break
    else:
        return None
    warps_per_split = form.N // (MMA * jt)
    split = 2
    while split < MAX_SPLIT and (not _rows_fit(form, split) or warps_per_split * split < WARPS_PER_SM * sms
                                 and form.K // (split * 2) >= MIN_CHUNK):
        split *= 2
    kt = 4
    while kt > 1 and form.K % (split * kt * MMA):
        kt //= 2
    tiling = TCTiling(warps, jt, kt, split)
    return tiling if fits(form, tiling) else None


def _rows_fit(form: batched_gemv.GemvForm, split: int) -> bool:
    """A block's share of the rows (padded) fits ``SHARED_BYTES``."""
    return form.M * (form.K // split + SHARED_PAD) * 2 <= SHARED_BYTES


def fits(form: batched_gemv.GemvForm, tiling: TCTiling) -> bool:
    """``tiling`` divides ``form``'s columns and reduction exactly and its rows fit shared memory
    (limit 4; the 16x16 tiles take no partial tiles)."""
    return (form.N % (MMA * tiling.warps * tiling.jt) == 0 and form.K % (tiling.split * tiling.kt * MMA) == 0
            and _rows_fit(form, tiling.split))


def applicable(form: batched_gemv.GemvForm, max_rows: int = 64, min_weight: int = 1 << 20) -> bool:
    """Limits 1-3 of the module on ``form``."""
    w = form.weight
    return (form.B == 1 and form.M % MMA == 0 and MMA <= form.M <= max_rows and form.dtype == "float16"
            and len(form.rows) == len(form.cols) == len(form.red) == 1 and form.aligned
            and len(w.shape) == 2 and form.N % MMA == 0 and form.N * form.K >= min_weight)


def schedule(sch: s_tir.Schedule, form: batched_gemv.GemvForm, epilogue, tiling: TCTiling,
             tensorize: bool = True) -> s_tir.Schedule:
    """Schedule ``form``'s block (from :func:`batched_gemv.prepare`) on tensor cores.

    ``tensorize=False`` leaves the 16x16 tiles as loops over thread-local buffers: the same loop
    nest and index arithmetic without the intrinsics, which llvm can run (the CPU tests do)."""
    intrin = _intrinsics(form.inner == "cols")
    scope = (lambda frag: f"wmma.{frag}") if tensorize else (lambda frag: "local")
    block = sch.get_sblock(form.block)
    stmt = sch.get(block)
    a_idx = 1 if stmt.reads[0].source.same_as(form.weight) else 0
    # the rows' operand as a plain [M, K] buffer (whatever its mapping), staged in shared memory below
    rows = sch.reindex(block, ("read", a_idx))
    loops = sch.get_loops(block)
    sch.reorder(loops[form.rows[0]], loops[form.cols[0]], loops[form.red[0]])
    m, n, k = sch.get_loops(block)[-3:]
    # the reduction over ``split`` blocks: float32 partials [split, M, N], then ``final`` sums them
    ks, k = sch.split(k, factors=[tiling.split, None])
    sch.reorder(ks, m, n, k)
    final, block = block, sch.rfactor(ks, factor_axis=0)
    # the partials as a plain [split, M, N] buffer (whatever the output's layout), read so by the sum
    sch.compute_inline(sch.reindex(block, ("write", 0)))
    ks, m, n, k = sch.get_loops(block)
    mo, mi = sch.split(m, factors=[None, MMA])
    n0, n1, n2, ni = sch.split(n, factors=[None, tiling.warps, tiling.jt, MMA])
    k0, k1, ki = sch.split(k, factors=[None, tiling.kt, MMA])
    sch.reorder(ks, n0, n1, k0, k1, mo, n2, mi, ni, ki)
    mma = sch.blockize(mi)
    bx = sch.fuse(ks, n0)
    sch.bind(bx, "blockIdx.x")
    sch.bind(n1, "threadIdx.y")
    # the block's rows [M, K / split] in shared memory, once (read through the operand's mapping),
    # in the widest vectors the mapping provably reads aligned (a slice at an odd offset reads
    # none: TVM's CUDA code generator prints a gather of 8 halves as an invalid make_uint4 of 8)
    lanes = block_lanes(sch.get(rows))
    sch.set_scope(rows, 0, "shared.dyn")
    sch.compute_at(rows, bx)
    _, ty, tx, vec = sch.split(sch.fuse(*sch.get_loops(rows)[1:]), factors=[None, tiling.warps, 32, lanes])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    if lanes > 1:
        sch.vectorize(vec)
    sch.storage_align(rows, 0, axis=-2, factor=MMA, offset=SHARED_PAD)
    a_frag = sch.cache_read(mma, a_idx, scope("matrix_a"))
    b_frag = sch.cache_read(mma, 1 - a_idx, scope("matrix_b"))
    sch.compute_at(a_frag, k1)
    sch.compute_at(b_frag, k1)
    acc = sch.cache_write(mma, 0, scope("accumulator"))
    sch.reverse_compute_at(acc, n1)
    init = sch.decompose_reduction(mma, k0)
    if tensorize:
        for frag, name in ((a_frag, "load_a"), (b_frag, "load_b"), (acc, "store")):
            _tensorize_tiles(sch, frag, intrin[name])
        sch.tensorize(init, intrin["init"])
        sch.tensorize(mma, intrin["compute"])
    sch.unroll(k1)  # kt weight fragments of each column strip in flight
    # second kernel: one thread an output sums the split partials, casts, runs the epilogue
    spatial = batched_gemv._spatial_loops(sch, final)
    fbx, ftx = sch.split(sch.fuse(*spatial), factors=[None, 256])
    sch.bind(fbx, "blockIdx.x")
    sch.bind(ftx, "threadIdx.x")
    if epilogue is not None:
        sch.set_scope(final, 0, "local")
        sch.reverse_compute_at(epilogue, ftx, preserve_unit_loops=True)
    return sch


def _tensorize_tiles(sch: s_tir.Schedule, block, intrin: str) -> None:
    """Tile ``block``'s two innermost loops by 16 x 16 and tensorize the tile with ``intrin``."""
    outer, inner = [], []
    for loop in sch.get_loops(block)[-2:]:
        if int(sch.get(loop).extent) > MMA:
            o, i = sch.split(loop, factors=[None, MMA])
            outer.append(o)
            inner.append(i)
        else:
            inner.append(loop)
    sch.reorder(*outer, *inner)
    for o in outer:
        sch.unroll(o)
    sch.tensorize(inner[0], intrin)



def compute_capability(target) -> int:
    """``target``'s CUDA compute capability as ``10 * major + minor`` (90 for ``sm_90`` and
    ``sm_90a``), 0 when it names no ``sm_`` arch: TVM's own parser (DLight's Matmul reads
    ``sm_90a`` as no version at all)."""
    arch = str(target.attrs.get("arch", ""))
    if not arch.startswith("sm_"):
        return 0
    try:
        major, minor = nvcc.parse_compute_version(nvcc.get_target_compute_version(target))
    except (ValueError, RuntimeError):
        return 0
    return 10 * major + minor

class TensorCoreGEMM(GPUScheduleRule):
    """WMMA schedule of a 16..64-row GEMM against a weight matrix; None ("not mine") otherwise."""

    def __init__(self, max_rows: int = 64, min_weight: int = 1 << 20, tensorize: bool = True):
        self.max_rows, self.min_weight = max_rows, min_weight
        self.tensorize = tensorize  # False: the tiles as loops, to run on llvm (:func:`schedule`)

    def apply(self, func, target, _tunable):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        if compute_capability(target) < MIN_ARCH:
            return None
        try:
            prepared = batched_gemv._prepared(func)
            if prepared is None or not applicable(prepared[1], self.max_rows, self.min_weight):
                return None
            tiling = plan(prepared[1], target)
            if tiling is None:
                return None
            sch, form, epilogue = prepared
            # on a copy: a refusal below leaves the prepared schedule to the next rule
            return schedule(sch.copy(), form, epilogue, tiling, self.tensorize)
        except s_tir.ScheduleError:
            return None
