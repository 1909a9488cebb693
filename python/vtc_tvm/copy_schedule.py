"""Copies that stay get a bandwidth schedule: 16-byte vector loads and stores on GPU targets.

VirtualTensorize materialises what it cannot eliminate (function outputs such as a grown KV
cache, rejected edges) as copy kernels. DLight's Fallback rule gives a copy one element per
thread and recomputes every index with integer divisions; on the H200 such a copy of a KV cache
moves about 1 TB/s. When every piece of the copy reads a unit-stride run along the innermost
axis, starting at a multiple of the vector width (proven with ``tvm.sym.Analyzer`` on the
copy's mapping), :func:`schedule_copy` vectorises that axis instead: each thread moves 16 bytes,
the piece conditions are evaluated once per vector.

:func:`ScheduleCopies` applies it to the pure-copy kernels of a module before DLight runs (the
``"vtc"`` pipeline does this on GPU targets); anything it cannot prove is left to DLight.

A kernel that copies most of its output but computes a piece of it (a grown KV cache whose new
row is rotated in the same kernel: ``concat(past_k, rope(k))`` after ``FuseOps``) is no pure
copy; :func:`schedule_piecewise` vectorises it where the same alignment is proven for every
load that moves along the row.

The store side's copies into a box of a larger destination (``COPY_INTO_ATTR``) and element-wise
kernels that DLight's default rules fail on (its analysis asserted on the
data-dependent store index of an in-place ``scatter_elements`` written with a select) get
:func:`schedule_update` instead of no schedule at all: one thread per element, vectorised where
the innermost axis is read and written unit-stride and aligned.
"""

from __future__ import annotations

from typing import Optional

import tvm
import tvm_ffi
from tvm import tirx

from .analysis import _non_root_blocks, index_copy_mapping
from .mapping import Mapping, _i64, _substitute, row_major_strides
from .rewrite import NotRewritable, check_schedulable

VECTOR_BYTES = 16
THREADS = 256
# Set by the store side on the copies it emits into a box of a larger destination (the past rows
# of a grown KV cache): not a whole-output index copy, so schedule_copy cannot prove it; DLight
# gives it one element a thread (231 against 61 us for a 134 MB cache on the H200).
COPY_INTO_ATTR = "vtc.copy_into"


def vector_lanes(mapping: Mapping) -> int:
    """The widest vector (at most 16 bytes) every piece of ``mapping`` can load aligned along
    its innermost axis; 1 if none."""
    if not mapping.shape or any(not isinstance(d, int) for d in mapping.shape):
        return 1
    last = mapping.vars[-1]
    return widest_lanes(mapping.dtype, mapping.shape[-1],
                        lambda lanes: all(_aligned(mapping, p, last, lanes) for p in mapping.pieces))


def widest_lanes(dtype, extent: int, fits) -> int:
    """The widest vector of ``dtype`` elements (at most 16 bytes, halving down to 1) that divides
    ``extent`` and for which ``fits(lanes)`` holds."""
    lanes = VECTOR_BYTES // max(tvm.runtime.DataType(str(dtype)).bits // 8, 1)
    while lanes > 1 and not (extent % lanes == 0 and fits(lanes)):
        lanes //= 2
    return lanes


def block_lanes(block) -> int:
    """The widest vector (at most 16 bytes) a copy block moves aligned along its innermost axis:
    ``out[..., i] = in[f(..., i)]``, or a select of such pieces (:func:`_piecewise_lanes`); 1
    when no width is provably safe (what a schedule that stages an operand through a mapping may
    vectorise)."""
    store = block.body
    if not isinstance(store, tirx.BufferStore) or not block.iter_vars:
        return 1
    if _is_select(store.value):
        return _piecewise_lanes(block)
    ext = block.iter_vars[-1].dom.extent
    if not isinstance(store.value, tvm.ir.TensorLoad) or not isinstance(ext, tirx.IntImm):
        return 1
    last, extent, load = block.iter_vars[-1].var, int(ext), store.value
    stored = tirx.BufferLoad(store.buffer, store.indices)
    return widest_lanes(store.buffer.dtype, extent, lambda lanes: all(
        _unit_aligned(a.source.shape, a.indices, last, lanes, extent) for a in (load, stored)))


def _aligned(mapping: Mapping, piece, last, lanes: int) -> bool:
    if piece.cond is not None and _uses(piece.cond, last):
        return False  # the piece may change inside a vector
    if piece.source is None:
        return True  # a constant
    return _unit_aligned(mapping.source_shape(piece.source), piece.indices, last, lanes, mapping.shape[-1],
                         mapping.analyzer())


def _uses(expr, var) -> bool:
    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr))


def _lane_split(last, extent: int, lanes: int, ana=None):
    """``(analyzer, r, q * lanes + r)``: ``last`` over ``extent`` steps as aligned vectors of
    ``lanes``, ``q`` the vector and ``r`` the lane, both bound in the analyzer."""
    ana = ana or tvm.sym.Analyzer()
    dtype = str(last.ty)
    q, r = tirx.Var("q", dtype), tirx.Var("r", dtype)
    ana.bind(q, tvm.ir.Range(tirx.IntImm(dtype, 0), tirx.IntImm(dtype, -(-extent // lanes))))
    ana.bind(r, tvm.ir.Range(tirx.IntImm(dtype, 0), tirx.IntImm(dtype, lanes)))
    return ana, r, q * lanes + r


def _unit_aligned(shape, indices, last, lanes: int, extent: int, ana=None) -> bool:
    """Whether element ``indices`` of a row-major tensor of ``shape`` is read (or written) along
    ``last`` (``extent`` steps) in aligned vectors of ``lanes`` that TVM's vectorizer turns into
    one vector access: on each aligned vector of ``lanes`` steps every index but the innermost
    is constant and the innermost moves by one element a step, from an address that is a
    multiple of ``lanes``. (An address that merely moves by one is not enough: ``x[j // 5, j % 5]``
    over 8 lanes is contiguous in memory, but its indices are no ramps, and TVM's CUDA code
    generator prints the int32x8 index arithmetic the vectorizer leaves as invalid CUDA.)"""
    ana, r, vector = _lane_split(last, extent, lanes, ana)
    split = [ana.simplify(_substitute(_i64(i), {last: vector})) for i in indices]
    if not split or any(_uses(i, r) for i in split[:-1]):
        return False
    base = ana.simplify(split[-1] - r)
    if _uses(base, r):
        return False
    strides = row_major_strides([_i64(d) for d in shape])
    start = sum((_i64(st) * _substitute(i, {r: _i64(0)}) for st, i in zip(strides, split)), _i64(0))
    return ana.can_prove(tirx.floormod(start, lanes) == 0)


def schedule_copy(func: tirx.PrimFunc, target) -> Optional[tirx.PrimFunc]:
    """``func`` (a pure copy, possibly a fused chain) scheduled with vector loads/stores on a
    GPU target, or None when its innermost axis is not provably aligned."""
    if target is None or "gpu" not in target.keys:
        return None
    mapping = index_copy_mapping(func)
    if mapping is None:
        return None
    lanes = vector_lanes(mapping)
    if lanes == 1:
        return None
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    blocks = _non_root_blocks(func)
    try:
        for block in blocks[:-1]:  # a fused chain: one block that reads through all of it
            sch.compute_inline(sch.get_sblock(block.name_hint))
        loops = sch.get_loops(sch.get_sblock(blocks[-1].name_hint))
        outer, vec = sch.split(loops[-1], [None, lanes])
        bx, tx = sch.split(sch.fuse(*loops[:-1], outer), [None, THREADS])
    except RuntimeError:
        return None
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(vec)
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


def schedule_update(func: tirx.PrimFunc, target) -> Optional[tirx.PrimFunc]:
    """``func`` (one spatial block writing its output, after inlining any injective blocks
    before it) scheduled one element per thread on a GPU target, the innermost axis vectorised
    where every access uses it as its unit-stride last index and every buffer's rows are a
    multiple of the vector; None when it is not such a kernel.

    Limits: 1. static extents of the innermost axis for vectorising (else one element per thread);
    2. the block must be data-parallel (no reduction, no init)."""
    return _schedule_spatial(func, target, _update_lanes, vector_only=False)


def schedule_piecewise(func: tirx.PrimFunc, target) -> Optional[tirx.PrimFunc]:
    """``func`` scheduled with vector loads and stores along its innermost axis when its output
    is piecewise (a concatenation along an outer axis, ``if_then_else`` on outer axes) and at
    least one piece is a plain copy of a buffer (:func:`_piecewise_lanes`); None otherwise.

    The kernel this is for: a grown KV cache whose new row is computed in the same kernel
    (``concat(past_k, rope(k))``, fused by ``FuseOps``). DLight's Fallback gives it one element
    per thread: 248 us for the 134 MB Llama-3-8B cache at batch 16 on the H200, where the
    vectorised copy of the V cache beside it takes 61 us.

    Each branch is first simplified under its condition (:func:`_branch_simplified`): TOPI's
    concatenation clamps the index of a piece where it is not taken (``max(i - 64, 0)``), which
    the vectoriser would gather lane by lane, and TVM's CUDA code generator cannot print an
    8-lane gather.

    Limits: 1. static innermost extent; 2. every condition inside the value must be constant on
    each aligned vector (proven with ``tvm.sym.Analyzer``), else the vectoriser would scalarise
    the whole vector; 3. every load that moves along the innermost axis must be unit-stride and
    aligned there (no gathers), and no conversion may move along it; 4. data-parallel blocks only."""
    blocks = _non_root_blocks(func)
    if not blocks or _piecewise_lanes(blocks[-1], loads_checked=False) == 1:
        return None  # (a cheap look at the output block before any schedule is made)
    return _schedule_spatial(func, target, _piecewise_lanes, vector_only=True, prepare=_with_branch_facts)


def inline_into_last(func: tirx.PrimFunc) -> Optional[tirx.PrimFunc]:
    """``func`` with every block before the last inlined into it (a fused chain becomes one
    block that reads through all of it), or None if one cannot be."""
    blocks = _non_root_blocks(func)
    if len(blocks) <= 1:
        return func
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    try:
        for block in blocks[:-1]:
            sch.compute_inline(sch.get_sblock(block.name_hint))
    except RuntimeError:
        return None
    return sch.mod["main"]


def _with_branch_facts(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` (one block) with its stored value's branches simplified under their conditions."""
    block = _non_root_blocks(func)[-1]
    ana = tvm.sym.Analyzer()
    for iv in block.iter_vars:
        ana.bind(iv.var, iv.dom)

    def on_store(store):
        if not store.buffer.same_as(block.body.buffer):
            return store
        return tirx.BufferStore(store.buffer, _branch_simplified(store.value, ana), store.indices)

    return func.with_body(tvm_ffi.structural_map(func.body, (tirx.BufferStore, on_store)))


def _branch_simplified(expr, ana):
    """``expr`` with the indices of every load simplified under the conditions of the
    ``if_then_else`` branches it is in."""
    if _is_select(expr):
        cond, then, other = expr.args
        with ana.constraint_scope(cond):
            then = _branch_simplified(then, ana)
        with ana.constraint_scope(ana.simplify(tirx.Not(cond))):  # (a bare Not is not used as a fact)
            other = _branch_simplified(other, ana)
        return tirx.if_then_else(cond, then, other)

    def on_load(load):
        return tirx.BufferLoad(load.source, [ana.simplify(i) for i in load.indices])

    def on_call(call):  # a nested select: its branches under its own condition too
        return _branch_simplified(call, ana) if _is_select(call) else call

    return tvm_ffi.structural_map(expr, [(tvm.ir.TensorLoad, on_load), (tvm.ir.Call, on_call)], order="pre")


def _schedule_spatial(func, target, lanes_of, vector_only: bool, prepare=None) -> Optional[tirx.PrimFunc]:
    """Inline ``func``'s blocks into its last (:func:`inline_into_last`, then ``prepare`` if
    given), vectorise the innermost axis by ``lanes_of(block)`` and bind the rest to
    ``THREADS``-thread blocks (None when ``func`` is not one data-parallel chain on a GPU
    target, or, with ``vector_only``, when no vector fits)."""
    if target is None or "gpu" not in target.keys:
        return None
    blocks = _non_root_blocks(func)
    if not blocks or any(iv.iter_type != 0 for b in blocks for iv in b.iter_vars) \
            or any(b.init is not None for b in blocks):
        return None
    func = inline_into_last(func)
    if func is None:
        return None
    if prepare is not None:
        func = prepare(func)
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    out = sch.get_sblock(blocks[-1].name_hint)
    lanes = lanes_of(sch.get(out))
    if vector_only and lanes == 1:
        return None
    try:
        loops = sch.get_loops(out)
        if lanes > 1:
            outer, vec = sch.split(loops[-1], [None, lanes])
            loops = list(loops[:-1]) + [outer]
        bx, tx = sch.split(sch.fuse(*loops), [None, THREADS])
    except RuntimeError:
        return None
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    if lanes > 1:
        sch.vectorize(vec)
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


def _update_lanes(block) -> int:
    """The vector width of :func:`schedule_update` for ``block`` (1: none)."""
    from tvm.ir import TensorLoad

    if not block.iter_vars or not isinstance(block.iter_vars[-1].dom.extent, tirx.IntImm):
        return 1
    last, extent = block.iter_vars[-1].var, int(block.iter_vars[-1].dom.extent)
    accesses = []
    tvm_ffi.structural_walk(block.body, [(TensorLoad, accesses.append), (tirx.BufferStore, accesses.append)])
    buffers = [a.source if isinstance(a, TensorLoad) else a.buffer for a in accesses]
    if not accesses or not all(a.indices and a.indices[-1].same_as(last) for a in accesses) \
            or any(any(v.same_as(last) for i in a.indices[:-1] for v in tirx.analysis.undefined_vars(i))
                   for a in accesses):
        return 1
    dtype = block.body.buffer.dtype if isinstance(block.body, tirx.BufferStore) else None
    if dtype is None:
        return 1
    return widest_lanes(dtype, extent, lambda lanes: all(
        isinstance(b.shape[-1], tirx.IntImm) and int(b.shape[-1]) % lanes == 0 for b in buffers))


def _is_select(e) -> bool:
    return isinstance(e, tvm.ir.Call) and e.op.name.endswith("if_then_else")


def _piecewise_lanes(block, loads_checked: bool = True) -> int:
    """The vector width of :func:`schedule_piecewise` for ``block`` (1: not such a kernel, or
    no width provably safe): the widest (at most 16 bytes) dividing the innermost extent for
    which the output store and every load moving along the innermost axis are unit-stride and
    aligned there, and every condition in the value is constant on each aligned vector.
    ``loads_checked=False``: only the plain-copy pieces are checked (the look before inlining)."""
    store = block.body
    if not isinstance(store, tirx.BufferStore) or not block.iter_vars or not _is_select(store.value):
        return 1
    ext = block.iter_vars[-1].dom.extent
    if not isinstance(ext, tirx.IntImm):
        return 1
    last, extent = block.iter_vars[-1].var, int(ext)
    copies, node = [], store.value
    while _is_select(node):  # the pieces: conditions on outer axes pick between them
        if _uses(node.args[0], last):
            return 1
        copies += [a for a in node.args[1:] if isinstance(a, tvm.ir.TensorLoad)]
        node = node.args[2]
    if not copies:
        return 1
    conds, loads, casts = [], [], []
    tvm_ffi.structural_walk(store.value, [
        (tvm.ir.Call, lambda c: _is_select(c) and conds.append(c.args[0])),
        (tvm.ir.TensorLoad, loads.append),
        (tirx.Cast, casts.append)])
    if loads_checked and any(_uses(c, last) for c in casts):
        return 1  # (a vector conversion TVM's CUDA code generator may not print)
    moving = [a for a in (loads if loads_checked else copies) if any(_uses(i, last) for i in a.indices)]
    stored = tirx.BufferLoad(store.buffer, store.indices)
    return widest_lanes(store.buffer.dtype, extent, lambda lanes: all(
        _unit_aligned(a.source.shape, a.indices, last, lanes, extent) for a in moving + [stored])
        and all(_uniform(c, last, extent, lanes) for c in conds))


def _uniform(cond, last, extent: int, lanes: int) -> bool:
    """Whether ``cond`` takes one value on each aligned vector of ``lanes`` along ``last``."""
    if not _uses(cond, last):
        return True
    ana, r, vector = _lane_split(last, extent, lanes)
    split = _substitute(cond, {last: vector})
    # (the simplifier folds `q * lanes + r < c` to `q < c / lanes` but leaves `c <= q * lanes + r`)
    return not _uses(ana.simplify(split), r) or not _uses(ana.simplify(tirx.Not(split)), r)


def _unschedulable_by_dlight(func, target, schedules=None) -> bool:
    """Whether ``func`` is a single data-parallel update that DLight's default rules fail on
    (``schedules``: as :func:`vtc_tvm.rewrite.check_schedulable`'s)."""
    blocks = _non_root_blocks(func)
    if target is None or "gpu" not in target.keys or not 0 < len(blocks) <= 2 \
            or any(iv.iter_type != 0 for b in blocks for iv in b.iter_vars):
        return False  # (cheap tests first: DLight is tried on few kernels)
    try:
        check_schedulable(func, target, schedules)
    except NotRewritable:
        return True
    return False


def ScheduleCopies(target=None, dlight_next: bool = False) -> tvm.transform.Pass:
    """Schedule the provably aligned pure-copy kernels of a module (see the module docstring);
    place it after ``FuseTIR`` and before DLight's ``ApplyDefaultSchedule``.

    ``dlight_next``: the pass that follows is ``ApplyDefaultSchedule`` over the stock CUDA rules
    (with or without :mod:`vtc_tvm.schedules`' before them), in the same target context. Then a
    kernel whose DLight check ran here keeps the schedule the check made, which is the one that
    pass would make again: our rules return None on a kernel without a reduction block (the
    only kind checked), and the check runs DLight's rules in their order on the same PrimFunc.
    """
    from .rewrite import _dlight_rules
    from .schedules import stock_rules

    @tvm.transform.module_pass(opt_level=0, name="ScheduleCopies")
    def _schedule(mod, _ctx):
        tgt = tvm.target.Target(target) if target is not None else tvm.target.Target.current(allow_none=True)
        reuse = (dlight_next and tgt is not None and tgt.kind.name == "cuda"
                 and [type(r) for r in stock_rules(tgt)] == [type(r) for r in _dlight_rules()])
        updates = {}
        for gv, func in mod.functions_items():
            if isinstance(func, tirx.PrimFunc) and "tirx.is_scheduled" not in (func.attrs or {}):
                scheduled = schedule_copy(func, tgt) or schedule_piecewise(func, tgt)
                made = []  # DLight's schedule of func, when the check below ran DLight
                if scheduled is None and (COPY_INTO_ATTR in (func.attrs or {})
                                          or _unschedulable_by_dlight(func, tgt, made)):
                    scheduled = schedule_update(func, tgt)
                elif scheduled is None and reuse and made and made[0] is not None \
                        and "target" not in (func.attrs or {}):
                    scheduled = made[0].mod["main"].with_attr("tirx.is_scheduled", True)
                if scheduled is not None:
                    updates[gv] = scheduled
        for gv, func in updates.items():
            mod[gv] = func
        return mod

    return _schedule
