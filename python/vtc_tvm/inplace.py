"""In-place updates of caller-owned tensors (KV caches).

Pattern: ``out = scatter_nd(cache, indices, rows)`` (also ``scatter_elements`` and
``slice_scatter``) where ``cache`` is a function parameter that the caller allows us to update
(``VirtualTensorize(inplace=["past_k", ...])``) and nothing else reads it.

Rewrite: ``out = call_tir_inplace(write_rows, (rows, indices, cache), [2])``: a kernel that stores
only the updated elements into ``cache`` and returns it. Stock TVM copies the whole cache first
(sequentially, in one thread, for scatter_nd); here the untouched rows are never read or written.

This changes the calling convention (the argument is modified), so it is never the default.
Like ONNX ScatterND with reduction "none", indices are assumed unique: with duplicates, which
update lands is unspecified.
"""

from __future__ import annotations

import logging
from typing import Callable, Dict

from tvm import tirx
from tvm.ir import Op

from .mapping import Mapping, new_buffer
from .rewrite import redirect_output
from .rules import Unsupported, _ints, shape_of

logger = logging.getLogger("vtc_tvm")

# op name -> (call, index buffer or None) -> (updates expr, index expr or None, store index fn)
_UPDATES: Dict[str, Callable] = {}


def _update(op_name):
    def register(fn):
        _UPDATES[op_name] = fn
        return fn

    return register


def _load_index(buf, idx):
    i = tirx.BufferLoad(buf, idx)
    return i if str(i.ty) == "int64" else tirx.Cast("int64", i)


@_update("relax.scatter_nd")
def _scatter_nd(call, index_buf):
    if call.attrs.reduction != "update":
        raise Unsupported(f"scatter_nd reduction {call.attrs.reduction!r}")
    indices, updates = call.args[1], call.args[2]
    depth, batch = shape_of(indices)[-1], len(shape_of(indices)) - 1

    def store_index(v):
        picked = [_load_index(index_buf, list(v[:batch]) + [tirx.IntImm("int64", k)]) for k in range(depth)]
        return picked + list(v[batch:])

    return updates, indices, store_index


@_update("relax.scatter_elements")
def _scatter_elements(call, index_buf):
    if call.attrs.reduction != "update":
        raise Unsupported(f"scatter_elements reduction {call.attrs.reduction!r}")
    data, indices, updates = call.args
    shape = shape_of(data)
    axis = int(call.attrs.axis) % len(shape)

    def store_index(v):
        i = _load_index(index_buf, list(v))
        i = tirx.floormod(i, shape[axis])  # TOPI shifts negative indices by the extent (valid ones: the same)
        return [i if a == axis else vi for a, vi in enumerate(v)]

    return updates, indices, store_index


@_update("relax.slice_scatter")
def _slice_scatter(call, _index_buf):
    data, src = call.args[0], call.args[1]
    start, step = _ints([call.args[2]])[0], _ints([call.args[4]])[0]
    axis = int(call.attrs.axis) % len(shape_of(data))
    return src, None, lambda v: [start + vi * step if a == axis else vi for a, vi in enumerate(v)]


def updatable_ops():
    return set(_UPDATES)


def inplace_update(call, cache_name: str):
    """``(kernel, args, inplace_index)`` writing only the updates of ``call`` into its first
    argument, or raise :class:`Unsupported`."""
    fn = _UPDATES.get(call.op.name) if isinstance(call.op, Op) else None
    if fn is None:
        raise Unsupported(f"{call.op} is not an update op")
    data = call.args[0]
    index_expr = call.args[1] if call.op.name != "relax.slice_scatter" else None
    index_buf = None if index_expr is None else new_buffer(
        shape_of(index_expr), index_expr.ty.dtype, "indices")
    updates, index_expr, store_index = fn(call, index_buf)
    copy = Mapping.identity(shape_of(updates), str(updates.ty.dtype)).to_prim_func("vtc_update")
    kernel = redirect_output(copy, shape_of(data), store_index, cache_name,
                             extra_params=[] if index_buf is None else [index_buf])
    args = [updates] + ([] if index_expr is None else [index_expr]) + [data]
    return kernel, args, len(args) - 1
