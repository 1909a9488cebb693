"""fp32 accumulation for a 16-bit reduction: a TIR rewrite the schedule rules apply first.

``widen_accumulator(sch, block)`` makes the reduction ``block`` (``C[i] = C[i] + X``, ``C`` 16-bit)
sum into a new float32 buffer and adds a block that casts it back to ``C``. The summands are
computed in float32 too (``a * b`` becomes ``f32(a) * f32(b)``), so no partial sum is rounded to
16 bits. ``Schedule.unsafe_set_dtype`` cannot do this: it rounds the running sum to 16 bits on
every step (``f32(f16(acc) + a * b)``).

Limits: 1. the block's body must be ``C[idx] = C[idx] + X`` with its init ``C[idx] = 0``;
2. it returns a new Schedule on the rewritten function (block handles of the old one are void).
"""

from __future__ import annotations

import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir import TensorLoad
from tvm.s_tir import SBlock

ACCUMULATE_DTYPE = "float32"
NARROW_FLOATS = ("float16", "bfloat16")


def reduction_update(block: SBlock):
    """``X`` of ``C[idx] = C[idx] + X`` (None when the block's body is not of that form)."""
    store = block.body
    if not isinstance(store, tirx.BufferStore) or not isinstance(store.value, tirx.Add):
        return None
    lhs = store.value.a
    if not (isinstance(lhs, TensorLoad) and lhs.source.same_as(store.buffer)
            and tvm_ffi.structural_equal(list(lhs.indices), list(store.indices))):
        return None
    return store.value.b


def _widen(expr, dtype):
    """``expr`` computed in ``dtype``: casts pushed through a product to its factors."""
    if isinstance(expr, tirx.Mul):
        return tirx.Mul(_widen(expr.a, dtype), _widen(expr.b, dtype))
    if isinstance(expr, tirx.Cast) and str(expr.ty) in NARROW_FLOATS:
        return _widen(expr.value, dtype)
    return expr if str(expr.ty) == dtype else tirx.Cast(dtype, expr)


def needs_widening(sch: s_tir.Schedule, block) -> bool:
    stmt = sch.get(block)
    return bool(stmt.writes) and str(stmt.writes[0].source.dtype) in NARROW_FLOATS


def widen_accumulator(sch: s_tir.Schedule, block, dtype: str = ACCUMULATE_DTYPE) -> s_tir.Schedule:
    """A schedule of ``sch``'s function where reduction ``block`` accumulates in ``dtype``."""
    name = sch.get(block).name_hint
    sch.cache_write(block, 0, "global")  # block now writes an intermediate; a copy block follows
    func = sch.mod["main"]
    narrow = sch.get(sch.get_sblock(name)).writes[0].source
    wide = tirx.decl_buffer(narrow.shape, dtype, narrow.name + "_acc")

    def on_block(blk):
        if blk.name_hint == name:
            update = reduction_update(blk)
            if update is None:
                raise ValueError(f"block {name} is not an accumulation C = C + X")
            idx = list(blk.body.indices)
            body = tirx.BufferStore(wide, tirx.Add(tirx.BufferLoad(wide, idx), _widen(update, dtype)), idx)
            init = tirx.BufferStore(wide, tirx.const(0, dtype), list(blk.init.indices))
            swap = lambda regions: [tirx.BufferRegion(wide, r.region) if r.source.same_as(narrow) else r
                                    for r in regions]
            return SBlock(blk.iter_vars, blk.reads, swap(blk.writes), blk.name_hint, body, init,
                          blk.alloc_buffers, blk.match_buffers, blk.annotations)
        if blk.name_hint == "root":
            allocs = [wide if b.same_as(narrow) else b for b in blk.alloc_buffers]
            return SBlock(blk.iter_vars, blk.reads, blk.writes, blk.name_hint, blk.body, blk.init,
                          allocs, blk.match_buffers, blk.annotations)
        reads = [tirx.BufferRegion(wide, r.region) if r.source.same_as(narrow) else r for r in blk.reads]
        return SBlock(blk.iter_vars, reads, blk.writes, blk.name_hint, blk.body, blk.init,
                      blk.alloc_buffers, blk.match_buffers, blk.annotations)

    def on_load(load):
        # the copy block: C[i] = acc[i] now reads the wide buffer and narrows it
        if load.source.same_as(narrow):
            return tirx.Cast(str(narrow.dtype), tirx.BufferLoad(wide, list(load.indices)))
        return load

    body = tvm_ffi.structural_map(func.body, (SBlock, on_block), order="post")
    body = tvm_ffi.structural_map(body, [(TensorLoad, on_load)], order="post")
    new = tirx.PrimFunc(func.params, body, ret_type=func.ret_type, attrs=func.attrs)
    return s_tir.Schedule(new)
