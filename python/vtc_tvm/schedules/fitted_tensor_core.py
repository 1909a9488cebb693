"""FittedTensorCoreGEMM: tensor cores for the GEMMs DLight leaves to SIMT or fails on, the tile fitted.

DLight's Matmul rule (TVM 0.27, CUDA) takes tensor cores only when every static non-batch
extent of the normalised GEMM ``C[S, I, J] += A[S, I, K] * B[S, J, K]`` is > 64: its WMMA tile
is 128 x 128 x 64 and would pad a 64-channel convolution 2x. The rest run as SIMT tiles on CUDA
cores. A convolutional network is full of such GEMMs: in whole YOLO11n at batch 16, 20 of the
48 GEMM kernels DLight's Matmul would schedule (I the output pixels, J the output channels, K
the window times the input channels) have 48..80 output channels or a reduction of <= 64 terms
(one of them attention's ``q k^T``), among them its heaviest (64 channels over 3 x 3 x 64 inputs at 80 x 80; the census:
``python -m benchmarks.rule_census``, ``benchmarks/results/rule_census.md``). And where I is
symbolic (a model with a dynamic batch) and J, K > 64, DLight's tensor-core schedule raises
for a convolution or a batched GEMM (``compute_at`` refuses the scope its padding leaves):
stock TVM cannot build an fp16 convolution of more than 64 channels with a symbolic batch for
CUDA (a plain GEMM with symbolic rows, e.g. a prefill projection, it builds). Here both run on WMMA
16x16x16 (fp16 in, float32 sums) with the block tile fitted to J and K:

* ``BN`` = J rounded up to 16 up to 128 (more columns: shared evenly by the fewest blocks,
  each rounded up to 16: 160 = 2 x 80),
  ``BK`` = the largest of 4, 3, 2 or 1 fragments dividing K rounded up to 16 (K = 48 is one
  step of 48, not 64), ``BM`` = 128 rows, or 64 / 32 until there are two blocks an SM; 4 warps
  along I (2 at ``BM`` = 32), 2 along J where ``BN`` >= 64;
* the 16x16x16 tiles blockized by ``tensorize``, last: blockized before the stages are placed,
  a padded symbolic I leaves the scope ``compute_at`` refuses (DLight's failure above);
* both operands staged in shared memory a ``BK`` step at a time, each copied with the threads
  along the operand's contiguous axis: in NCHW the pixels, so a convolution's window gather
  reads 32 neighbouring pixels a warp where DLight's copy reads along the window and channels
  (strided); the widest vector the mapping provably reads aligned
  (:func:`.copy_schedule.block_lanes`) where the contiguous axis is the reduction;
* the float32 fragments stored to shared memory (rows padded; further where the block's shared
  memory would exceed 48 KiB with less than that dynamic, which TVM's launcher does not opt
  in, :func:`result_pad`), the epilogue (cast, bias,
  activation, the output's layout or mapping) inlined into the copy to global, threads along
  the output's contiguous axis.

Limits: 1. one reduction block that DLight's Matmul normalises, fp16 operands, a 16-bit or
float32 output (16-bit sums are widened first, :func:`.accumulate.widen_accumulator`); 2. J and
K static, J > ``min_cols`` (32; at <= 32 :class:`.NarrowGEMM`'s SIMT tile, which no timing has
compared with this one yet), I symbolic or >= ``min_rows``; 3. I, J, K all > 64 stay DLight's
(its pipelined 128 x 128 tile) where DLight's schedule builds: always when I is static, tried
first when it is symbolic; 4. no software pipelining (a step's loads are not
overlapped with the previous step's MMAs; most of these reductions are 1..9 steps); 5. CUDA
with compute capability >= 70, no ``dlight.do_not_tensorize``; 6. the tile is fitted, not
tuned: no GPU timing has chosen it yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import collect_block_iter_vars_used_in_access_region
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule
from tvm.s_tir.dlight.gpu.matmul import (MatmulTensorization, auto_inline_consumer_chain, auto_inline_producers,
                                         get_index_map)

from ..copy_schedule import block_lanes
from . import batched_gemv, wmma
from .accumulate import needs_widening, widen_accumulator
from .narrow_gemm import narrow_extents
from .tensor_core_gemm import MIN_ARCH, MMA, _tensorize_tiles, compute_capability
from .window_reduction import static_extent

DLIGHT_MIN_EXTENT = 64  # DLight tensorizes only where every static non-batch extent exceeds this
ROW_TILES = (128, 64, 32)  # BM, largest first while the blocks still fill the SMs twice
MAX_TILE_COLS = 128  # BN at most; more columns are shared evenly by several blocks along J
STEP_FRAGMENTS = (4, 3, 2, 1)  # BK / 16, largest dividing the padded reduction
SHARED_PAD = 8  # fp16 elements padding each staged row (bank conflicts of the fragment loads)
ACC_PAD = 4  # float32 elements padding each staged accumulator row
WARP = 32
# The operands' steps in static shared memory (at most (128 + 128) x (64 + 8) halves, 36 KiB), the
# float32 results in dynamic shared memory (up to 128 x 132 floats, 66 KiB: above the static 48 KiB).
# Apart for a reason: where both are ``shared.dyn`` and the results fit a staged operand's
# buffer, TVM 0.27's StorageRewrite reuses that buffer for them and types the WMMA store's
# ``tvm_access_ptr`` float32 over a float16 buffer, which LowerIntrin rejects (a 64 x 64 x 64
# tile did so; DLight's 128 x 128 results never fit its operands' buffers).
OPERAND_SCOPE = "shared"
RESULT_SCOPE = "shared.dyn"
# A block may use more than 48 KiB of shared memory only through the opt-in attribute, which TVM
# 0.27's CUDA launcher sets (to the dynamic size) only where the dynamic part alone reaches 48
# KiB: static + dynamic above 48 KiB with dynamic below fails at launch, CUDA_ERROR_INVALID_VALUE
# (C3k2's cv2 at batch 16, 21 + 34 KiB, on an H100). There the result rows are padded further.
OPT_IN_BYTES = 48 * 1024


@dataclass(frozen=True)
class Tile:
    """A block computes ``bm x bn`` outputs ``bk`` reduction terms a step, ``wi x wj`` warps."""

    bm: int
    bn: int
    bk: int
    wi: int
    wj: int
    acc_pad: int = ACC_PAD  # float32 elements padding each staged result row (:func:`result_pad`)

    @property
    def warps(self) -> int:
        return self.wi * self.wj


def plan(rows: Optional[int], cols: int, red: int, sms: int) -> Tile:
    """The tile for a ``rows x cols x red`` GEMM (``rows`` None: symbolic) on ``sms`` SMs."""
    along_j = -(-cols // MAX_TILE_COLS)  # blocks along J, the columns shared evenly
    bn = -(-(-(-cols // along_j)) // MMA) * MMA
    wj = 2 if bn >= 64 and (bn // MMA) % 2 == 0 else 1
    bm = next((m for m in ROW_TILES if rows is None or -(-rows // m) >= 2 * sms), ROW_TILES[-1])
    steps = -(-red // MMA)
    kt = next(d for d in STEP_FRAGMENTS if steps % d == 0)
    return Tile(bm, bn, kt * MMA, 4 if bm >= 64 else 2, wj, result_pad(bm, bn, kt * MMA))


def shared_bytes(bm: int, bn: int, bk: int, acc_pad: int = ACC_PAD) -> tuple[int, int]:
    """A block's static (the operands' fp16 steps) and dynamic (the float32 results) shared bytes."""
    return (bm + bn) * (bk + SHARED_PAD) * 2, bm * (bn + acc_pad) * 4


def result_pad(bm: int, bn: int, bk: int) -> int:
    """``ACC_PAD``, or where the block would need more than ``OPT_IN_BYTES`` with a smaller dynamic
    part (the launch fails), that plus whole rows of 32 floats (the banks stay as they were) until
    the dynamic part reaches ``OPT_IN_BYTES`` and the launcher opts in."""
    static, dynamic = shared_bytes(bm, bn, bk)
    if static + dynamic <= OPT_IN_BYTES or dynamic >= OPT_IN_BYTES:
        return ACC_PAD
    short = -(-OPT_IN_BYTES // (4 * bm)) - (bn + ACC_PAD)  # floats a row lacks
    return ACC_PAD + -(-short // WARP) * WARP


def _intrinsics() -> dict:
    """WMMA fp16 -> float32 between shared memory and fragments (:mod:`.wmma`); the second
    operand is ``B[J, K]``, i.e. transposed."""
    args = (MMA, MMA, MMA)
    return {
        "load_a": wmma.intrinsic("wmma_load_16x16x16_f16_a_shared", "get_wmma_load_intrin",
                                 *args, "float16", OPERAND_SCOPE, False, False),
        "load_b": wmma.intrinsic("wmma_load_16x16x16_f16_b_trans_shared", "get_wmma_load_intrin",
                                 *args, "float16", OPERAND_SCOPE, True, True),
        "store": wmma.intrinsic("wmma_store_16x16x16_f32_shared_dyn", "get_wmma_store_intrin",
                                *args, "float32", RESULT_SCOPE),
        "init": wmma.intrinsic("wmma_fill_16x16x16_f32", "get_wmma_fill_intrin", *args, "float32"),
        "compute": wmma.intrinsic("wmma_sync_16x16x16_f16f16f32_trans", "get_wmma_sync_intrin",
                                  *args, "float16", "float32", True),
    }


def _spatial_inner(stmt, region, spatial) -> bool:
    """Whether the innermost index of ``region`` (the buffer's contiguous axis) moves with one of
    the block's iter vars in ``spatial``: the copy of that operand then runs along them."""
    used = collect_block_iter_vars_used_in_access_region(stmt, list(region)[-1:])
    return bool(set(used) & spatial)


def contiguous_axes(stmt) -> tuple[bool, bool, bool]:
    """For A, B and C of a GEMM block (as DLight normalises it): whether the copy runs along the
    spatial axis (I for A and C, J for B) rather than along K (A, B) or J (C)."""
    spatial = {iv.var for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.DataPar}
    a, b = (set(collect_block_iter_vars_used_in_access_region(stmt, r.region)) & spatial for r in stmt.reads[:2])
    i_vars, j_vars = a - b, b - a
    return (_spatial_inner(stmt, stmt.reads[0].region, i_vars), _spatial_inner(stmt, stmt.reads[1].region, j_vars),
            _spatial_inner(stmt, stmt.writes[0].region, i_vars))


def schedule(sch: s_tir.Schedule, main, tile: Tile, along: tuple[bool, bool, bool],
             tensorize: bool = True) -> s_tir.Schedule:
    """Schedule the GEMM block ``main`` of ``sch`` on tensor cores with ``tile``; ``along``: the
    operands' copy directions (:func:`contiguous_axes`, of the block before normalisation).

    ``tensorize=False`` leaves the 16x16 tiles as loops over thread-local buffers: the same loop
    nest and index arithmetic without the intrinsics, which llvm can run (the CPU tests do)."""
    scope = (lambda frag: f"wmma.{frag}") if tensorize else (lambda frag: "local")
    # C[S, I, J] += A[S, I, K] * B[S, J, K], as DLight's Matmul normalises it
    reindex = [sch.reindex(main, ("read", 0)), sch.reindex(main, ("read", 1)), sch.reindex(main, ("write", 0))]
    gemm_map, a_map, b_map, c_map = get_index_map(sch.get(main))
    sch.transform_layout(reindex[0], ("write", 0), a_map)
    sch.transform_layout(reindex[1], ("write", 0), b_map)
    sch.transform_layout(reindex[2], ("read", 0), c_map)
    sch.transform_block_layout(main, gemm_map)
    sch.pad_einsum(main, [1, tile.bm, tile.bn, tile.bk])

    # the 16x16x16 tiles innermost, blockized by tensorize last (see the module's docstring)
    batch, i, j, k = sch.get_loops(main)
    i, ii = sch.split(i, factors=[None, MMA])
    j, ji = sch.split(j, factors=[None, MMA])
    k, ki = sch.split(k, factors=[None, MMA])
    i0, i1, i2 = sch.split(i, factors=[None, tile.wi, tile.bm // MMA // tile.wi])
    j0, j1, j2 = sch.split(j, factors=[None, tile.wj, tile.bn // MMA // tile.wj])
    k0, k1 = sch.split(k, factors=[None, tile.bk // MMA])
    sch.reorder(i0, j0, i1, j1, k0, k1, i2, j2, ii, ji, ki)
    mma = main
    sch.bind(sch.fuse(i0, j0), "blockIdx.x")
    sch.bind(batch, "blockIdx.y")
    warp = sch.fuse(i1, j1)
    sch.bind(warp, "threadIdx.y")

    for idx in (0, 1):  # each operand's BK step in shared memory, copied along its contiguous axis
        staged = sch.cache_read(mma, idx, OPERAND_SCOPE)
        sch.compute_at(staged, k0)
        auto_inline_producers(sch, staged)
        outer, inner = sch.get_loops(staged)[-2:]
        lanes = 1
        if along[idx]:
            sch.reorder(inner, outer)
        else:
            lanes = block_lanes(sch.get(staged))
        _, ty, tx, vec = sch.split(sch.fuse(*sch.get_loops(staged)[-2:]),
                                   factors=[None, tile.warps, WARP, lanes])
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
        if lanes > 1:
            sch.vectorize(vec)
        sch.storage_align(staged, 0, axis=-2, factor=MMA, offset=SHARED_PAD)

    a_frag = sch.cache_read(mma, 0, scope("matrix_a"))
    b_frag = sch.cache_read(mma, 1, scope("matrix_b"))
    sch.compute_at(a_frag, k1)
    sch.compute_at(b_frag, k1)
    # float32 fragments -> shared memory -> the output (epilogue inlined), a warp's tile at a time
    out = sch.cache_write(mma, 0, RESULT_SCOPE)
    acc = sch.cache_write(mma, 0, scope("accumulator"))
    sch.reverse_compute_at(acc, warp)
    sch.reverse_compute_at(out, warp)
    init = sch.decompose_reduction(mma, k0)
    acc_name = sch.get(acc).name_hint
    if tensorize:
        intrin = _intrinsics()
        for frag, name in ((a_frag, "load_a"), (b_frag, "load_b"), (acc, "store")):
            _tensorize_tiles(sch, frag, intrin[name])
        sch.tensorize(sch.get_loops(init)[-2], intrin["init"])
        sch.tensorize(sch.get_loops(mma)[-3], intrin["compute"])
    # rows padded: the copy out reads a column a warp. Aligned on the block that writes them, as
    # tensorized (DLight aligns the block that reads them into the output, which pads nothing:
    # its rows stay 128 floats, 32-way bank conflicts)
    writer = sch.get_sblock(acc_name + "_o") if tensorize else acc  # tensorize made a new block
    # storage_align makes a row's stride the next one = offset (mod factor): BN + acc_pad
    sch.storage_align(writer, 0, axis=-2, factor=tile.bn + tile.acc_pad - ACC_PAD, offset=ACC_PAD)
    auto_inline_consumer_chain(sch, out)
    rows, cols = sch.get_loops(out)[-2:]
    if along[2]:
        sch.reorder(cols, rows)
    _, tx = sch.split(sch.fuse(*sch.get_loops(out)[-2:]), factors=[None, WARP])
    sch.bind(tx, "threadIdx.x")
    return sch


def _dlight_tensorizes(func, target) -> bool:
    """Whether DLight's tensor-core Matmul schedule builds for ``func``: with symbolic rows it
    does for a plain GEMM and raises for a convolution or a batched GEMM (the module's docstring)."""
    try:
        return MatmulTensorization().apply(func, target, False) is not None
    except (RuntimeError, ValueError):
        return False


class FittedTensorCoreGEMM(GPUScheduleRule):
    """WMMA schedule of a many-row fp16 GEMM DLight leaves to SIMT; None ("not mine") otherwise."""

    def __init__(self, min_cols: int = 32, min_rows: int = 256, tensorize: bool = True):
        self.min_cols, self.min_rows = min_cols, min_rows
        self.tensorize = tensorize  # False: the tiles as loops, to run on llvm (:func:`schedule`)

    def extents(self, stmt) -> Optional[tuple]:
        """``(I, J, K)`` of the reduction block ``stmt`` (I None: symbolic) where limits 1-3 hold
        on it, else None."""
        found = narrow_extents(stmt)
        if found is None or str(stmt.reads[0].source.dtype) != "float16" \
                or str(stmt.reads[1].source.dtype) != "float16":
            return None
        rows, cols = found
        red = static_extent(stmt, tirx.IterVar.CommReduce)
        if cols is None or red is None or cols <= self.min_cols or rows is not None and rows < self.min_rows:
            return None
        if rows is not None and min(rows, cols, red) > DLIGHT_MIN_EXTENT:
            return None  # DLight's own tensor-core tile takes it
        return rows, cols, red

    def apply(self, func, target, _tunable):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        if compute_capability(target) < MIN_ARCH or "dlight.do_not_tensorize" in func.attrs:
            return None
        if not any(self.extents(b) for b in batched_gemv._blocks(func)):
            return None
        found = batched_gemv.single_reduction(func)
        extents = None if found is None else self.extents(found[0].get(found[1]))
        if extents is None or get_index_map(found[0].get(found[1])) is None:
            return None
        rows, cols, red = extents
        if rows is None and min(cols, red) > DLIGHT_MIN_EXTENT and _dlight_tensorizes(func, target):
            return None  # limit 3: DLight's tile, where its schedule builds with the symbolic rows
        sch, block = found
        along = contiguous_axes(sch.get(block))
        tile = plan(*extents, batched_gemv.sm_count(target))
        name = sch.get(block).name_hint
        if needs_widening(sch, block):
            sch = widen_accumulator(sch, block)
        try:
            return schedule(sch, sch.get_sblock(name), tile, along, self.tensorize)
        except (RuntimeError, ValueError):  # a primitive or tensorize refusing: not mine
            return None
