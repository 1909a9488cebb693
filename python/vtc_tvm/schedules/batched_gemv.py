"""The shared core of the small-batch rules: a GEMM with few rows as a batched GEMV.

:func:`match` recognises a reduction block ``C[b, m, n] += A[b, m, k] * W[b, n, k]`` (any
number of axes per group, read through any index mapping) and classifies its axes: *batch*
(used by both operands), *rows* (``A`` only: the few rows), *cols* (``W`` only) and *red*.
:func:`schedule` then reads each element of ``W`` once for all rows: every thread keeps one
float32 accumulator per row (and per vector lane), the reduction is split over threads and
summed across the lanes of a warp with shuffles (``rfactor``), optionally split over blocks
(float32 partials summed by a second kernel: flash-decoding's split of a long context), and
``W`` is loaded 128 bits at a time when its innermost axis is a column axis. With several rows
and contiguous columns the lanes run along the columns instead (coalesced weight rows), the
warps split the reduction and meet once in shared memory (``Tiling.tail``), and a lane takes
``kin`` weight rows a step (one vector of ``A[m, k:k + kin]``); q K^T (reduction contiguous)
loads 16 bytes of a key a lane.

Limits: 1. one reduction block ``C = C + X`` of two fp16/bf16 reads, injective blocks around it
only (inlined or one epilogue); 2. static extents; 3. ``W``'s innermost index must use one
column or reduction axis; 4. tilings are planned from the SM count, not tuned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import SBlock
from tvm.s_tir.dlight.analysis import (collect_block_iter_vars_used_in_access_region,
                                       normalize_prim_func)
from tvm.s_tir.dlight.analysis.common_analysis import get_sblockrealize
from tvm.s_tir.dlight.base import try_inline_contiguous_spatial
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule

from .accumulate import NARROW_FLOATS, needs_widening, reduction_update, widen_accumulator


@dataclass(frozen=True)
class GemvForm:
    """The axes of a matched reduction block (positions in its iter_vars) and their extents."""

    block: str
    batch: tuple
    rows: tuple
    cols: tuple
    red: tuple
    B: int
    M: int
    N: int
    K: int
    weight: tirx.Buffer  # the operand read once per (batch, col, red) point
    inner: str  # "cols" or "red": the group that indexes the weight's innermost axis
    dtype: str  # the operands' dtype
    aligned: bool = False  # weight[..., i] with i a bare column (reduction) axis: vector loads stay aligned
    inner_extent: int = 0  # the extent of the axis indexing the weight's innermost dimension
    rows_vector: Optional[tirx.Buffer] = None  # the rows' operand when it is read A[..., k], k contiguous


@dataclass(frozen=True)
class Tiling:
    """``tn`` x ``tk`` threads a block, ``vec`` columns a thread, the reduction split over
    ``split`` blocks (flash-decoding style: float32 partials, then a second kernel sums them).
    ``lanes``: what a warp's lanes (threadIdx.x) run along: "red" (the reduction: the final sums
    are shuffles) or "cols" (the columns: a warp reads one contiguous weight row segment; the
    final sums go through shared memory, fine for the few partials of M x vec <= 8)."""

    tn: int
    tk: int
    vec: int
    split: int = 1
    lanes: str = "red"
    kin: int = 1  # consecutive reduction terms a thread takes a step (one vector when they are contiguous)
    tail: str = "allreduce"  # lanes on the columns: "shared" sums the warps' partials through shared memory


def _product(extents):
    return math.prod(int(e) for e in extents)


def match(sch: s_tir.Schedule, block) -> Optional[GemvForm]:
    """The :class:`GemvForm` of ``block`` (None when it is no two-operand sum of products)."""
    stmt = sch.get(block)
    update = reduction_update(stmt)
    if update is None or len(stmt.reads) != 2 or len(stmt.writes) != 1 or stmt.init is None:
        return None
    if any(not isinstance(iv.dom.extent, tirx.IntImm) for iv in stmt.iter_vars):
        return None
    dtypes = {str(r.source.dtype) for r in stmt.reads}
    if len(dtypes) != 1 or not dtypes <= set(NARROW_FLOATS):
        return None
    used = [collect_block_iter_vars_used_in_access_region(stmt, r.region) for r in stmt.reads]
    out = collect_block_iter_vars_used_in_access_region(stmt, stmt.writes[0].region)
    batch, red, own = [], [], ([], [])  # own[i]: spatial axes only operand i reads
    for pos, iv in enumerate(stmt.iter_vars):
        a, w = iv.var in used[0], iv.var in used[1]
        if iv.iter_type == tirx.IterVar.CommReduce:
            if not (a and w) or iv.var in out:
                return None
            red.append(pos)
        elif iv.iter_type != tirx.IterVar.DataPar or iv.var not in out:
            return None
        elif a and w or not (a or w) and int(iv.dom.extent) == 1:
            batch.append(pos)
        elif a or w:
            own[0 if a else 1].append(pos)
        else:  # an output axis neither operand reads (a broadcast): not a GEMM
            return None
    # An index that mixes a reduction axis with a spatial one is a convolution window
    # (x[n, c, h + kh, w + kw]), not a GEMM operand: the schedule loads each operand along its
    # own axes (found on the H200: a grouped conv of EfficientViT taken as a batched GEMV gave
    # wrong results). Mapped reads keep one role per index (A[b, k // 128, 0, k % 128]).
    reduce_axis = {iv.var: iv.iter_type == tirx.IterVar.CommReduce for iv in stmt.iter_vars}
    for r in stmt.reads:
        for dim in r.region:
            roles = {reduce_axis[v] for v in collect_block_iter_vars_used_in_access_region(stmt, [dim])
                     if v in reduce_axis}
            if len(roles) > 1:
                return None
    ext = lambda ps: _product([stmt.iter_vars[p].dom.extent for p in ps])
    # the weight is the operand with the larger own extent; the other one's own axes are the rows
    weight_idx = 0 if ext(own[0]) > ext(own[1]) else 1
    w_own, a_own = own[weight_idx], own[1 - weight_idx]
    if not w_own or not red:
        return None
    weight = stmt.reads[weight_idx]
    last = collect_block_iter_vars_used_in_access_region(stmt, [weight.region[-1]])
    var_pos = {iv.var: p for p, iv in enumerate(stmt.iter_vars)}
    inner_pos = {var_pos[v] for v in last if v in var_pos}
    if len(inner_pos) != 1:
        return None
    (inner,) = inner_pos
    if inner in w_own:
        kind = "cols"
    elif inner in red:
        kind = "red"
    else:
        return None
    # 128-bit loads need the column index to be the axis itself (no offset, e.g. a slice at 3)
    # in a buffer with no element offset
    # (q K^T: the same for the reduction index, so a lane may load 16 bytes of a key at once)
    aligned = (inner == (w_own if kind == "cols" else red)[-1] and isinstance(weight.region[-1].min, tirx.Var)
               and isinstance(weight.source.elem_offset, tirx.IntImm) and int(weight.source.elem_offset) == 0)
    rows = stmt.reads[1 - weight_idx]
    rows_last = collect_block_iter_vars_used_in_access_region(stmt, [rows.region[-1]])
    # the rows' operand read as A[..., k] (k the innermost reduction axis): kin terms are one vector
    rows_vector = (isinstance(rows.region[-1].min, tirx.Var) and {var_pos.get(v) for v in rows_last} == {red[-1]}
                   and isinstance(rows.source.elem_offset, tirx.IntImm) and int(rows.source.elem_offset) == 0
                   and int(rows.source.shape[-1]) == int(stmt.iter_vars[red[-1]].dom.extent))
    return GemvForm(stmt.name_hint, tuple(batch), tuple(a_own), tuple(w_own), tuple(red),
                    ext(batch), ext(a_own), ext(w_own), ext(red), weight.source,
                    kind, dtypes.pop(), aligned, int(stmt.iter_vars[inner].dom.extent),
                    rows.source if rows_vector else None)


def single_reduction(func: tirx.PrimFunc):
    """``(schedule, block infos, reduction block)`` for a function with one reduction block."""
    sch = s_tir.Schedule(func)
    infos = normalize_prim_func(sch)
    if infos is None:
        return None
    reductions = [b for b in infos if b.is_reduction()]
    if len(reductions) != 1 or any(not b.is_injective() for b in infos if not b.is_reduction()):
        return None
    return sch, reductions[0].block_rv


def _writes_through_division(stmt) -> bool:
    """Whether ``stmt``'s write indices divide its iters (``C[n // 128, n % 128]``)."""
    found = []
    for r in stmt.writes[0].region:
        tvm_ffi.structural_walk(r.min, [(tirx.FloorDiv, found.append), (tirx.FloorMod, found.append)], order="post")
    return bool(found)


def _blocks(func: tirx.PrimFunc) -> list:
    found = []
    tvm_ffi.structural_walk(func.body, (SBlock, found.append), order="post")
    return found


def _may_match(stmt) -> bool:
    """The tests of :func:`match` that read the block alone (no schedule): a kernel none of whose
    blocks passes them is not one of ours."""
    return (stmt.init is not None and len(stmt.reads) == 2 and len(stmt.writes) == 1
            and reduction_update(stmt) is not None
            and {str(r.source.dtype) for r in stmt.reads} <= set(NARROW_FLOATS))


def prepare(func: tirx.PrimFunc):
    """Widen the accumulator, inline what can be inlined: ``(sch, form, epilogue or None)``."""
    if not any(_may_match(b) for b in _blocks(func)):
        return None  # match() needs such a block: no schedule is built for the others
    found = single_reduction(func)
    if found is None:
        return None
    sch, block = found
    if match(sch, block) is None:
        return None
    name = sch.get(block).name_hint
    if _writes_through_division(sch.get(block)):
        # A producer storing through a dividing mapping (the store side: C[b, n // 128, 4096, n % 128]):
        # accumulate in the iteration space's own layout and copy out in an epilogue; the
        # accumulators the schedule derives from the written region then keep constant
        # register indices (else the M x vec float32 partials are indexed by blockIdx
        # arithmetic and spill to local memory: 190 against 22 us on the H200)
        sch.reindex(block, ("write", 0))
    if needs_widening(sch, block):
        sch = widen_accumulator(sch, block)
    infos = normalize_prim_func(sch)
    if infos is None:
        return None
    rest = try_inline_contiguous_spatial(sch, infos)
    block = sch.get_sblock(name)
    form = match(sch, block)  # the accumulator's dtype changed, the axes did not
    if form is None or len(rest) > 2:
        return None
    epilogue = rest[1].block_rv if len(rest) == 2 else None
    if len(rest) == 2 and not (rest[0].is_reduction() and rest[1].is_injective()):
        return None
    return sch, form, epilogue


class BatchedGEMVRule(GPUScheduleRule):
    """A DLight rule that schedules the :class:`GemvForm` kernels its ``accepts`` admits with
    :func:`schedule` and :func:`plan`; None ("not mine") for anything else, and for a kernel
    a schedule primitive rejects (the next rule, DLight's, then takes it)."""

    def accepts(self, form: GemvForm) -> bool:
        raise NotImplementedError

    def apply(self, func, target, _tunable):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        try:
            prepared = _prepared(func)
            if prepared is None or not self.accepts(prepared[1]):
                return None
            _LAST_PREPARED.clear()  # schedule() changes sch: the next rule prepares its own
            sch, form, epilogue = prepared
            return schedule(sch, form, epilogue, plan(form, target))
        except s_tir.ScheduleError:
            return None


# (func, what prepare(func) returned or raised) of the last kernel prepared and not scheduled:
# DLight tries the rules in order on the same PrimFunc object, and every rule of ours prepares
# it the same way (prepare is a function of the kernel alone; accepts() only reads the form), so
# the next rule reuses it instead of building, widening and inlining the same schedule again.
_LAST_PREPARED = []


def _prepared(func: tirx.PrimFunc):
    """``prepare(func)``, shared by the rules tried one after the other on ``func``."""
    if not (_LAST_PREPARED and _LAST_PREPARED[0].same_as(func)):
        try:
            outcome = prepare(func)
        except s_tir.ScheduleError as err:
            outcome = err
        _LAST_PREPARED[:] = [func, outcome]
    outcome = _LAST_PREPARED[1]
    if isinstance(outcome, s_tir.ScheduleError):
        raise outcome
    return outcome


def _spatial_loops(sch, block):
    """``block``'s loops that bind only its spatial iters, moved outside the others."""
    realize = get_sblockrealize(sch, block)
    loops = sch.get_loops(block)
    loop_vars = [sch.get(lp).loop_var for lp in loops]
    reduce_vars = set()
    for iv, value in zip(realize.block.iter_vars, realize.iter_values):
        if iv.iter_type == tirx.IterVar.CommReduce:
            reduce_vars |= {v for v in loop_vars if _uses(value, v)}
    spatial = [lp for lp, v in zip(loops, loop_vars) if v not in reduce_vars]
    sch.reorder(*spatial, *[lp for lp, v in zip(loops, loop_vars) if v in reduce_vars])
    return spatial


def _uses(expr, var) -> bool:
    found = []
    tvm_ffi.structural_walk(expr, (tirx.Var, lambda v: found.append(v) if v.same_as(var) else None), order="post")
    return bool(found)


def _vector_loads(sch, block, buffer, loop):
    """Stage ``block``'s read of ``buffer`` in registers at ``loop``, loaded along its innermost axis
    as one vector."""
    index = [i for i, r in enumerate(sch.get(block).reads) if r.source.same_as(buffer)][0]
    local = sch.cache_read(block, index, "local")
    sch.compute_at(local, loop, preserve_unit_loops=True)
    sch.vectorize(sch.get_loops(local)[-1])


def _group_loop(sch, block, loops):
    return sch.fuse(*loops) if loops else sch.add_unit_loop(block)


def schedule(sch: s_tir.Schedule, form: GemvForm, epilogue, tiling: Tiling, unroll: int = 64) -> s_tir.Schedule:
    """Schedule ``form``'s block (from :func:`prepare`) as a batched GEMV with ``tiling``."""
    block = sch.get_sblock(form.block)
    loops = sch.get_loops(block)
    by_pos = lambda ps: [loops[p] for p in ps]
    sch.reorder(*by_pos(form.batch + form.rows + form.cols + form.red))
    b = _group_loop(sch, block, by_pos(form.batch))
    m = _group_loop(sch, block, by_pos(form.rows))
    n = _group_loop(sch, block, by_pos(form.cols))
    k = _group_loop(sch, block, by_pos(form.red))
    tn, tk, vec, split = tiling.tn, tiling.tk, tiling.vec, tiling.split
    # Lanes along the reduction (threadIdx.x, tk <= 32): the final cross-thread sum of the
    # M x vec partials is warp shuffles without block barriers (a shared-memory tree per value
    # costs ~6 barriers each: 768 for M = 16, vec = 8). Lanes along the columns: coalesced rows.
    tag_n, tag_k = ("threadIdx.y", "threadIdx.x") if tiling.lanes == "red" else ("threadIdx.x", "threadIdx.y")
    nb, t_n, v_n = sch.split(n, factors=[None, tn, vec], preserve_unit_iters=True)
    # k = (ko * tk + t_k) * kin + ki: a thread's kin terms a step are consecutive
    ko, t_k, ki = sch.split(k, factors=[None, tk, tiling.kin], preserve_unit_iters=True)
    final = None
    if split > 1:
        # each of ``split`` blocks sums a contiguous range of the reduction into a float32
        # partial; ``block`` (now the sum over the partials) becomes a second kernel
        ks, ko = sch.split(ko, factors=[split, None], preserve_unit_iters=True)
        sch.reorder(b, nb, ks, t_n, t_k, ko, ki, m, v_n)
        final, block = block, sch.rfactor(ks, factor_axis=0)
        b, nb, ks, t_n, t_k, ko, ki, m, v_n = sch.get_loops(block)
        grid = [b, nb, ks]
    else:
        sch.reorder(b, nb, t_n, t_k, ko, ki, m, v_n)
        grid = [b, nb]
    rf = sch.rfactor(t_k, factor_axis=0)
    # the per-thread partial sums: M x vec float32 registers
    loops = sch.get_loops(rf)
    t_n, t_k, ko, ki, m, v_n = loops[len(grid):]
    # Batch axes (decode attention's batch x KV heads) on blockIdx.y, the column tiles (and the
    # split) on blockIdx.x: the blocks' linear order is the fused one's, and no address divides
    # a fused block index (TIR's simplifier spent ~40 ms on those in the unrolled q K^T kernel).
    grid = loops[:len(grid)]
    extent = sch.get(grid[0]).extent
    outer = 1 if isinstance(extent, tirx.IntImm) and 1 < int(extent) <= MAX_GRID_Y else 0
    if outer:
        sch.bind(grid[0], "blockIdx.y")
    bx = sch.fuse(*grid[outer:]) if len(grid) - outer > 1 else grid[outer]
    sch.bind(bx, "blockIdx.x")
    sch.bind(t_n, tag_n)
    sch.bind(t_k, tag_k)
    shared_tail = tiling.tail == "shared" and tk > 1
    if shared_tail:
        # the partials accumulate in registers and are stored once to shared memory, where the
        # write-back block sums each output's tk partials in one thread: one barrier, instead
        # of a shared-memory tree with a barrier per level for each of the M x vec values
        sch.set_scope(rf, 0, "shared")
        partials = sch.cache_write(rf, 0, "local")
        sch.reverse_compute_at(partials, t_k, preserve_unit_loops=True)
    else:
        sch.set_scope(rf, 0, "local")
    sch.annotate(ko, "pragma_auto_unroll_max_step", unroll)
    sch.annotate(ko, "pragma_unroll_explicit", 1)
    if tiling.kin > 1:
        sch.unroll(ki)
    if vec > 1 and form.inner == "red" and tiling.kin == 1:
        sch.unroll(v_n)  # independent columns: vec loads in flight a lane
    elif vec > 1:
        # one vector load a step of the weight's vec columns (or, q K^T, of kin reduction terms
        # of each column: 16 bytes of a key), shared by the M rows; the float32 math stays scalar
        # (unrolled): CUDA codegen of float32x8 vectors is broken in TVM 0.27 (a broadcast
        # initialiser becomes make_ulonglong4 of 8 floats, which nvcc rejects)
        _vector_loads(sch, rf, form.weight, ko)
        sch.unroll(v_n)
    if tiling.kin > 1 and form.rows_vector is not None and len(form.red) == 1 and form.K % tiling.kin == 0:
        # the rows' kin consecutive terms a step as one vector load per row (A[m, k:k + kin])
        _vector_loads(sch, rf, form.rows_vector, ko)
    sch.decompose_reduction(rf, ko)
    # the cross-thread sum over t_k, per row and column; the write-back block iterates
    # (t_k, [unit batch/split,] rows, columns of the tile) under blockIdx.x
    sch.reverse_compute_at(block, bx, preserve_unit_loops=True)
    # (no rows loop when the rows' unit axis was dropped: C[j] = sum_k A[k] * W[j, k])
    t_k2, *units_rows, c2 = sch.get_loops(block)[1 + outer:]
    if shared_tail:
        # every thread of the block sums the tk partials of some outputs, serially
        _, ty2, tx2 = sch.split(sch.fuse(*units_rows, c2), factors=[None, tk, tn], preserve_unit_iters=True)
        sch.reorder(ty2, tx2, t_k2)
        sch.bind(ty2, "threadIdx.y")
        sch.bind(tx2, "threadIdx.x")
    else:
        t_n2, v_n2 = sch.split(c2, factors=[tn, vec], preserve_unit_iters=True)
        sch.reorder(t_n2, *units_rows[-1:], v_n2, t_k2)
        sch.bind(t_n2, tag_n)
        sch.bind(t_k2, tag_k)
    if final is not None:
        # second kernel: one thread per output sums the ``split`` partials (in order)
        spatial = _spatial_loops(sch, final)
        fbx, ftx = sch.split(sch.fuse(*spatial), factors=[None, tn * tk])
        sch.bind(fbx, "blockIdx.x")
        sch.bind(ftx, "threadIdx.x")
        if epilogue is not None:
            sch.set_scope(final, 0, "local")
            sch.reverse_compute_at(epilogue, ftx, preserve_unit_loops=True)
    elif epilogue is not None:
        # the tile's sums go through shared memory, so all tn x tk threads run the epilogue
        sch.set_scope(block, 0, "shared")
        sch.reverse_compute_at(epilogue, bx, preserve_unit_loops=True)
        flat = sch.fuse(*sch.get_loops(epilogue)[1 + outer:])
        _, ty, tx = sch.split(flat, factors=[None, tn, tk] if tiling.lanes == "red" else [None, tk, tn])
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
    return sch


# -- tiling ------------------------------------------------------------------------------------
# Target knowledge as data: streaming multiprocessors per CUDA arch (the grid should cover each
# at least WAVES times so that every SM streams weights).
SM_COUNT = {"sm_90": 132, "sm_90a": 132, "sm_89": 128, "sm_86": 84, "sm_80": 108, "sm_75": 40, "sm_70": 80}
DEFAULT_SM_COUNT = 108
WAVES = 2
WARP = 32
MAX_GRID_Y = 65535  # CUDA's gridDim.y limit
VECTOR_BYTES = 16  # one 128-bit load
MAX_ACCUMULATORS = 128  # float32 partial sums a thread keeps (M x vec)
RED_COLUMNS = 8  # columns a warp sums at once when the reduction axis is the contiguous one
LANES_ON_COLS_MAX_PARTIALS = 8  # M x vec up to which lanes run along the columns
COLS_WARPS = 8  # warps along the reduction when lanes run along the columns
WARPS_PER_SM = 16  # streaming warps an SM wants to hide HBM latency
MIN_STEPS = 8  # reduction steps a lane keeps at least when the reduction is split over blocks
MAX_PARTIAL_TRAFFIC = 1 / 8  # split partials' bytes (written + read) against the weight's
# Contiguous columns, one weight matrix or several rows (M x 8 partials > LANES_ON_COLS_MAX_PARTIALS):
# lanes on the columns, SHARED_TAIL_WARPS warps along the reduction summed through shared memory,
# kin weight rows (and one A[m, k:k + kin] vector) a lane a step. H200 sweeps of session 6
# (benchmarks/results/h200_session6.md): at batch 16 4096x4096 65 -> 24 us, 1024x4096 20.7 -> 9.7,
# 14336x4096 206 -> 78, 4096x14336 188 -> 76, probs V 68 -> 58; at batch 1 4096x4096 14.1 -> 8.6,
# 14336x4096 37.2 -> 32.8, 4096x14336 37.2 -> 32.8 (probs V over 32 heads at batch 1 stays on the
# old tiling: 12.9 against 18.2 us).
SHARED_TAIL_VEC = 4
SHARED_TAIL_WARPS = 4
SHARED_TAIL_BYTES = 48 * 1024  # static shared memory of a block (more needs an opt-in)
MAX_SPLIT = {1: 32, "batched": 4}  # the largest measured split (batch axes fill the grid too)
LONG_STEPS = 32  # the split doubles while the grid stays within WARPS_PER_SM warps an SM, and past
# that while a lane has more steps than this
SHARED_TAIL_KIN = (4, 2, 1)  # the largest that leaves a lane MIN_STEPS steps
# q K^T (the reduction contiguous, batch axes): 16-byte loads along the reduction, RED_VECTOR_LANES
# lanes a key, 4 keys a lane, 8 warps a block (H200: batch 16 241 -> 55 us, DLight 148; batch 1
# 16.1 -> 6.0 us, DLight 12.4)
RED_VECTOR_LANES, RED_VECTOR_COLS, RED_VECTOR_TN = 8, 4, 8


def sm_count(target) -> int:
    return SM_COUNT.get(str(target.attrs.get("arch", "")), DEFAULT_SM_COUNT)


def plan(form: GemvForm, target) -> Tiling:
    """Threads, vector width and reduction split for ``form`` on ``target``.

    A warp's 32 lanes split the reduction (so the final sums are shuffles); each lane keeps
    M x vec float32 partials, with 128-bit column vectors when the columns are contiguous. The
    grid then holds ``B x N / vec`` warps, too few to cover HBM latency for a single weight
    matrix (N = 4096: 4 warps an SM): the reduction is split over blocks until about
    ``WARPS_PER_SM`` warps an SM stream, keeping at least ``MIN_STEPS`` steps a lane and the
    float32 partials' traffic under ``MAX_PARTIAL_TRAFFIC`` of the weight's bytes.

    Two cases take the tilings of the H200 sweeps first: contiguous columns against one weight
    or with several rows (:func:`_shared_tail_plan`), and q K^T over batch axes with its
    reduction contiguous (16-byte loads along the reduction, ``RED_VECTOR_*``).
    """
    sms = sm_count(target)
    elem = 2 if form.dtype in NARROW_FLOATS else 4
    shared_tail = _shared_tail_plan(form, sms, elem)
    if shared_tail is not None:
        return shared_tail
    red_vector = VECTOR_BYTES // elem
    # (measured on q K^T, whose batch axes fill the grid; a single weight keeps the split tiling below)
    if (form.inner == "red" and form.B > 1 and form.aligned and form.inner_extent % red_vector == 0
            and form.K % (RED_VECTOR_LANES * red_vector) == 0 and int(form.weight.shape[-1]) % red_vector == 0):
        return Tiling(RED_VECTOR_TN, RED_VECTOR_LANES, RED_VECTOR_COLS, 1, "red", kin=red_vector)
    # q K^T style (reduction contiguous): a lane reads one element of each of vec columns a step
    vec = max(1, min(RED_COLUMNS, MAX_ACCUMULATORS // max(form.M, 1))) if form.inner == "red" else 1
    if form.inner == "cols" and form.aligned:
        vec = VECTOR_BYTES // (2 if form.dtype in NARROW_FLOATS else 4)
        while vec > 1 and (form.N % vec or int(form.weight.shape[-1]) % vec or form.M * vec > MAX_ACCUMULATORS):
            vec //= 2
    pow2_le = lambda n, cap: min(cap, 1 << (max(n, 1).bit_length() - 1))
    if form.inner == "cols" and form.M * vec <= LANES_ON_COLS_MAX_PARTIALS:
        # few partials a thread (one row: batch-1 GEMV, expanded-cache attention): lanes along
        # the contiguous columns, warps along the reduction
        lanes, tn, tk = "cols", pow2_le(-(-form.N // vec), WARP), pow2_le(form.K, COLS_WARPS)
    else:
        lanes, tn, tk = "red", 4, pow2_le(form.K, WARP)
    warps = form.B * -(-form.N // vec) * tk / WARP
    split = 1
    partial_cap = form.K * 2 * MAX_PARTIAL_TRAFFIC / (2 * 4 * max(form.M, 1))  # write + read, float32
    while (warps * split < WARPS_PER_SM * sms and form.K // (tk * split * 2) >= MIN_STEPS
           and split * 2 <= partial_cap):
        split *= 2
    while lanes == "red" and tn > 1 and form.B * -(-form.N // (tn * vec)) * split < WAVES * sms:
        tn //= 2
    return Tiling(tn, tk, vec, split, lanes)


def _shared_tail_plan(form: GemvForm, sms: int, elem: int) -> Optional[Tiling]:
    """The several-rows tiling with contiguous columns (None when ``form`` is not that case, or
    its partials do not fit a block's shared memory): a warp's lanes read SHARED_TAIL_VEC
    adjacent columns each (one coalesced row segment), SHARED_TAIL_WARPS warps split the
    reduction and meet once in shared memory, and the reduction is split over blocks."""
    vec, tk = SHARED_TAIL_VEC, SHARED_TAIL_WARPS
    one_row = form.M * (VECTOR_BYTES // elem) <= LANES_ON_COLS_MAX_PARTIALS
    if (form.inner != "cols" or not form.aligned or one_row and form.B > 1
            or form.N % vec or int(form.weight.shape[-1]) % vec
            or tk * form.M * WARP * vec * 4 > SHARED_TAIL_BYTES):
        return None
    warps = form.B * -(-form.N // (WARP * vec)) * tk
    max_split = MAX_SPLIT[1] if form.B == 1 else MAX_SPLIT["batched"]
    kin_max = SHARED_TAIL_KIN[0]
    split = 1
    while (split < max_split and form.K // (tk * split * 2 * kin_max) >= MIN_STEPS
           and (warps * split * 2 <= WARPS_PER_SM * sms or form.K // (tk * split * kin_max) > LONG_STEPS)):
        split *= 2
    kin = next(k for k in SHARED_TAIL_KIN if k == 1 or form.K // (tk * split * k) >= MIN_STEPS)
    return Tiling(WARP, tk, vec, split, "cols", kin=kin, tail="shared")
