"""Analyses: recognise copy kernels, classify mappings by contiguity, classify consumers.

* :func:`index_copy_mapping` recovers the :class:`Mapping` of any legalized PrimFunc that is a
  pure index copy ``out[v] = in_j[f(v)]`` (optionally piecewise through ``if_then_else`` /
  ``select``, with constants, and with indices that load an index tensor). Whatever composition
  of movement ops produced it, the rest of vtc-tvm can then treat it like a registered op.
* :func:`contiguity` measures the physical runs of a mapping (the paper's contiguity classes).
* :func:`op_pattern` is TVM's own ``AnnotateTIROpPattern`` classification of a PrimFunc.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.ir import TensorLoad

from .mapping import Mapping, Piece, _eval_np, _i64, _rebind_loads, _substitute, new_buffer

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")

# TVM's OpPatternKind (include/tvm/relax/op_attr_types.h)
ELEMWISE, BROADCAST, INJECTIVE, COMM_REDUCE, OUT_EWISE_FUSABLE, OPAQUE = 0, 1, 2, 3, 4, 8

# Reshape-like Relax ops: stock TVM (RewriteDataflowReshape) makes a lone one a view of its
# input, no copy kernel; materialised, they stay as they are.
VIEW_OPS = frozenset({"relax.reshape", "relax.flatten", "relax.squeeze", "relax.expand_dims"})


def _non_root_blocks(func):
    blocks = []
    tvm_ffi.structural_walk(
        func.body,
        (tvm.s_tir.SBlock, lambda b: blocks.append(b) if b.name_hint != "root" else None),
        order="post",
    )
    return blocks


def index_copy_mapping(func: tirx.PrimFunc) -> Optional[Mapping]:
    """The mapping of ``func`` if it is a pure index copy into its last parameter: one copy
    block, or a chain of them through intermediate buffers (a fused reshape-transpose), which
    compose into one mapping."""
    found = index_copy_mappings(func, 1)
    return None if found is None else found[0]


def index_copy_mappings(func: tirx.PrimFunc, num_outputs: int) -> Optional[List[Mapping]]:
    """The mapping of each of the last ``num_outputs`` parameters of ``func`` (its outputs, in
    order) over the others, if ``func`` is a pure index copy into them (a legalized ``split``
    is one PrimFunc writing every part); else None."""
    if not isinstance(func, tirx.PrimFunc) or num_outputs < 1 or len(func.params) <= num_outputs:
        return None
    if any(not tirx.is_buffer_var(p) for p in func.params):
        return None
    outs, inputs = list(func.params[-num_outputs:]), list(func.params[:-num_outputs])
    if not all(isinstance(d, tirx.IntImm) for p in func.params for d in p.shape):
        return None
    is_out = lambda buf: any(buf.same_as(o) for o in outs)
    blocks = _non_root_blocks(func)
    # Each buffer a block has written so far, with its mapping and the input each source is.
    written = {}
    for block in blocks:
        middle = [w for w in written if not is_out(w)]
        found = _block_mapping(block, inputs + middle)
        if found is None:
            return None
        target, mapping = found
        if target in written or any(target.same_as(p) for p in inputs) or (
                not is_out(target) and len(middle) < len(written)):
            return None  # outputs are written last (after every intermediate), each once
        origins = list(range(len(inputs))) + [None] * len(middle)
        # Compose the intermediates (highest source first: compose renumbers those after j).
        for j, buf in reversed(list(enumerate(inputs + middle))):
            if j < len(inputs):
                continue
            inner, inner_origins = written[buf]
            mapping = mapping.compose(j, inner)
            origins = origins[:j] + origins[j + 1:] + inner_origins
        written[target] = (mapping, origins)
    if not blocks or not all(o in written for o in outs):
        return None
    result = []
    for o in outs:
        mapping, origins = written[o]
        if not any(p.source is not None for p in mapping.pieces):
            return None
        result.append(_on_inputs(mapping, origins, inputs))
    return result


def _block_mapping(block, readable):
    """``(written buffer, Mapping over readable)`` of a block that copies ``readable``
    elements into a whole buffer; None for anything else."""
    store = block.body
    if block.init is not None or not isinstance(store, tirx.BufferStore):
        return None
    if len(store.indices) != len(block.iter_vars) or len(store.buffer.shape) != len(block.iter_vars):
        return None
    for idx, iv, extent in zip(store.indices, block.iter_vars, store.buffer.shape):
        if not idx.same_as(iv.var) or iv.iter_type != 0:  # data-parallel, in order, everywhere
            return None
        if not (isinstance(iv.dom.min, tirx.IntImm) and int(iv.dom.min) == 0
                and isinstance(iv.dom.extent, tirx.IntImm) and int(iv.dom.extent) == int(extent)):
            return None
    try:
        pieces = _pieces(store.value, readable)
    except _NotACopy:
        return None
    sources = [new_buffer(p.shape, p.dtype, f"src{j}") for j, p in enumerate(readable)]
    vmap = {iv.var: v for iv, v in zip(block.iter_vars, _new_vars(len(block.iter_vars)))}
    rename = lambda e: _rename(e, vmap, readable, sources)
    # Indices are int64 like the mapping's variables: a legalized take reads its index from an
    # int32 buffer (LegalizeOps narrows int64 constants), which composed into an int64
    # condition (a concat's) made a mixed-dtype comparison.
    pieces = [
        Piece(p.source, tuple(_i64(rename(e)) for e in p.indices),
              None if p.cond is None else rename(p.cond),
              None if p.value is None else p.value)
        for p in pieces
    ]
    shape = [int(d) for d in store.buffer.shape]
    return store.buffer, Mapping(shape, str(store.buffer.dtype), sources, list(vmap.values()), pieces).simplify()


def _on_inputs(mapping: Mapping, origins, inputs) -> Mapping:
    """``mapping`` with one source per PrimFunc input, in parameter order (composition may
    have left several copies of one input, or dropped an unused one)."""
    sources = [new_buffer(p.shape, p.dtype, f"src{j}") for j, p in enumerate(inputs)]
    rebind = lambda e: _rebind_loads(e, mapping.sources, lambda j, idx: tirx.BufferLoad(sources[origins[j]], idx))
    pieces = [Piece(None if p.source is None else origins[p.source], tuple(rebind(e) for e in p.indices),
                    None if p.cond is None else rebind(p.cond), p.value) for p in mapping.pieces]
    return Mapping(mapping.shape, mapping.dtype, sources, mapping.vars, pieces).simplify()


class _NotACopy(Exception):
    pass


def _new_vars(n):
    return [tirx.Var(f"v{i}", "int64") for i in range(n)]


def _rename(expr, vmap, old_bufs, new_bufs):
    expr = _substitute(expr, vmap)
    return _rebind_loads(expr, old_bufs, lambda j, idx: tirx.BufferLoad(new_bufs[j], idx))


def _pieces(value, inputs):
    """Split a store value into pieces; raise _NotACopy if it computes anything."""
    if isinstance(value, TensorLoad):
        for j, p in enumerate(inputs):
            if value.source.same_as(p):
                return [Piece(j, tuple(value.indices))]
        raise _NotACopy
    if type(value).__name__ in ("IntImm", "FloatImm"):
        return [Piece(None, value=value)]
    if type(value).__name__ == "Select":
        cond, then, other = value.condition, value.true_value, value.false_value
    elif type(value).__name__ == "Call" and value.op.name.endswith("if_then_else"):
        cond, then, other = value.args
    else:
        raise _NotACopy
    # Pieces of the true branch apply where ``cond`` holds too; the false branch follows.
    guarded = [Piece(p.source, p.indices, cond if p.cond is None else tirx.all(cond, p.cond), p.value)
               for p in _pieces(then, inputs)]
    return guarded + _pieces(other, inputs)


def call_tir_kernel(mod: tvm.IRModule, value):
    """``(GlobalVar, PrimFunc, tensor args)`` of ``call_tir(gv, (args...))`` on a PrimFunc of
    ``mod``; None for anything else, including calls that pass symbolic shape values."""
    if not (isinstance(value, relax.Call) and value.op.same_as(_CALL_TIR)) or len(value.args) != 2:
        return None
    gv, args = value.args
    if not isinstance(args, relax.Tuple) or gv not in mod.get_global_vars():
        return None
    func = mod[gv]
    return (gv, func, list(args.fields)) if isinstance(func, tirx.PrimFunc) else None


def is_data_movement(func) -> bool:
    """True if every block of ``func`` only moves data (e.g. a fused reshape-transpose chain)."""
    if index_copy_mapping(func) is not None:
        return True
    blocks = _non_root_blocks(func) if isinstance(func, tirx.PrimFunc) else []

    def pure_copy(block):
        if block.init is not None or not isinstance(block.body, tirx.BufferStore):
            return False
        if any(iv.iter_type != 0 for iv in block.iter_vars):
            return False
        try:
            _pieces(block.body.value, _loaded_buffers(block.body.value))
        except _NotACopy:
            return False
        return True

    return bool(blocks) and all(pure_copy(b) for b in blocks)


def _loaded_buffers(expr):
    found = []
    tvm_ffi.structural_walk(expr, (TensorLoad, lambda l: found.append(l.source)), order="post")
    return found


def op_pattern(func: tirx.PrimFunc) -> int:
    """TVM's op pattern of a PrimFunc (0 elementwise ... 4 out-ewise-fusable, 8 opaque)."""
    if "op_pattern" in (func.attrs or {}):
        return int(func.attrs["op_pattern"])
    gv = tvm.ir.GlobalVar("f")
    mod = relax.transform.AnnotateTIROpPattern()(tvm.IRModule({gv: func}))
    return int(mod[gv].attrs["op_pattern"])


# -- contiguity ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Contiguity:
    """Runs of virtual elements that are adjacent in one physical source.

    ``inner_run``: along the virtual tensor's row-major order (what an elementwise or
    injective consumer streams); ``best_axis_run``: the longest unit-stride run along any single
    virtual axis (what a tiled consumer such as a GEMM can stage through shared memory).
    ``reuse``: virtual elements per element of the data sources (> 1 for broadcast/tile, < 1
    for a slice).
    """

    inner_run: int
    best_axis_run: int
    full: bool
    reuse: float
    indirect: bool
    piecewise: bool


_SAMPLE = 4096
# Values a symbolic dimension (batch, sequence) is measured at: a round and an odd one, so
# that runs which only line up for some sizes are not mistaken for contiguous ones.
SYMBOLIC_SAMPLES = (16, 61)


def contiguity(mapping: Mapping, seed: int = 0) -> Contiguity:
    """Measure a mapping by evaluating it on a bounded sample of indices (with random index
    tensors for indirect mappings). A symbolic mapping is measured at each of
    :data:`SYMBOLIC_SAMPLES` and gets the worst of them."""
    symbols = mapping.symbols
    if symbols:
        each = [contiguity(mapping.instantiate({v: n for v in symbols}), seed) for n in SYMBOLIC_SAMPLES]
        return Contiguity(min(c.inner_run for c in each), min(c.best_axis_run for c in each),
                          all(c.full for c in each), max(c.reuse for c in each),
                          mapping.is_indirect, mapping.is_piecewise)
    rng = np.random.default_rng(seed)
    shape = mapping.shape
    size = mapping.size
    if size == 0 or not shape:  # empty or 0-d: nothing to stream
        return Contiguity(size, size, True, 1.0, mapping.is_indirect, mapping.is_piecewise)
    env_bufs = _offset_sources(mapping, rng)
    offsets = _offset_expr(mapping)  # built once, evaluated at every sample below
    # Row-major run: a window of the innermost elements at a few random outer positions.
    window = min(size, _SAMPLE)
    starts = sorted({0} | {int(s) // window * window for s in rng.integers(0, size, 3)})
    # Runs that end at a row boundary (e.g. a whole H x W plane of a channel shuffle) need not
    # divide the window: try every suffix product of the shape too.
    rows = [math.prod(shape[a:]) for a in range(1, len(shape))]
    inner, first = window, []
    for start in starts:
        flat = np.arange(start, min(start + window, size), dtype=np.int64)
        offs = _offsets(mapping, np.unravel_index(flat, shape), env_bufs, offsets)
        inner = min(inner, _aligned_run(offs, start, rows))
        first.append(offs[0])
    # Fully contiguous: every sampled window continues the first one in the same source.
    full = inner == window and all(f - first[0] == s for f, s in zip(first, starts))
    inner = size if full else inner
    best = 1
    for axis, n in enumerate(shape):
        line = [np.full(min(n, _SAMPLE), rng.integers(0, d), dtype=np.int64) for d in shape]
        line[axis] = np.arange(min(n, _SAMPLE), dtype=np.int64)
        best = max(best, _aligned_run(_offsets(mapping, line, env_bufs, offsets)))
    physical = sum(math.prod(mapping.source_shape(j)) for j in mapping.data_sources())
    reuse = size / physical if physical else 1.0
    return Contiguity(inner, max(best, min(inner, shape[-1])), full, reuse,
                      mapping.is_indirect, mapping.is_piecewise)


def _offset_sources(mapping, rng):
    """Sources as arrays of *global* element offsets (data sources) or random valid indices
    (index sources). Constants evaluate to -1."""
    data = mapping.data_sources()
    arrays, base = [], 0
    for j in range(len(mapping.sources)):
        shp = mapping.source_shape(j)
        n = math.prod(shp)
        if j in data:
            arrays.append(np.arange(base, base + n, dtype=np.int64).reshape(shp) if n <= _SAMPLE * 16
                          else _OffsetArray(base, shp))
            base += n + 1  # a gap: runs never continue from one source into the next
        else:
            arrays.append(None)
    # Index sources: random indices valid for every data source axis they could index.
    bound = min((min(mapping.source_shape(j), default=1) for j in data), default=1)
    for j, a in enumerate(arrays):
        if a is None:
            arrays[j] = rng.integers(0, max(bound, 1), mapping.source_shape(j)).astype(np.int64)
    return arrays


class _OffsetArray:
    """``np.arange(base, base + prod(shape)).reshape(shape)`` as far as :func:`_eval_np` reads it
    (indexed by integer arrays), without holding it: a real model's sources (a 4096-token KV
    cache) have millions of elements, of which a mapping's sample reads a few thousand."""

    def __init__(self, base: int, shape):
        self.base, self.shape, self.ndim = base, tuple(shape), len(shape)
        self._strides = [math.prod(self.shape[a + 1:]) for a in range(self.ndim)]

    def __getitem__(self, index):
        out = np.int64(self.base)
        for i, stride in zip(index, self._strides):
            out = out + np.asarray(i, dtype=np.int64) * stride
        return out


def _offset_expr(mapping):
    """The element offset ``mapping`` reads at its index variables (constants: -1), as TIR."""
    return Mapping(mapping.shape, "int64", mapping.sources, mapping.vars, [
        _offset_piece(p) for p in mapping.pieces]).value_expr()


def _offsets(mapping, index_arrays, arrays, expr=None):
    env = {v: np.asarray(ix, dtype=np.int64) for v, ix in zip(mapping.vars, index_arrays)}
    bufs = {b: arrays[j] for j, b in enumerate(mapping.sources)}
    out = _eval_np(_offset_expr(mapping) if expr is None else expr, env, bufs)
    return np.broadcast_to(np.asarray(out, dtype=np.int64), np.shape(index_arrays[0])).ravel()


def _offset_piece(p: Piece) -> Piece:
    """Constant pieces read no memory: give them offset -1."""
    return p if p.source is not None else Piece(None, (), p.cond, tirx.IntImm("int64", -1))


def _aligned_run(offs: np.ndarray, start: int = 0, extra=()) -> int:
    """Largest r (a divisor of len, or one of ``extra``) such that every block of r offsets
    aligned to a multiple of r (counting from flat position ``start``) is consecutive."""
    n = len(offs)
    if n < 2:
        return 1
    step_ok = (np.diff(offs) == 1) & (offs[1:] >= 0)  # element i + 1 continues element i
    # Blocks of r are consecutive iff every break (a position whose element does not continue
    # the previous one) starts a block, i.e. r divides every break position, i.e. r divides
    # their gcd g: the largest divisor of n that does is gcd(n, g). (One pass over the sample,
    # instead of one per divisor of n.)
    breaks = np.arange(start + 1, start + n, dtype=np.int64)[~step_ok]
    if not len(breaks):
        return n
    g = int(np.gcd.reduce(breaks))
    return max([r for r in extra if 1 < r <= n and g % r == 0] + [max(math.gcd(n, g), 1)])
