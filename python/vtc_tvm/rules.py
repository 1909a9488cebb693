"""Per-op rules: the mapping of each Relax data-movement op.

A rule takes a normalized ``relax.Call`` and returns the op's output as a
:class:`~vtc_tvm.mapping.VirtualTensor` (a list of them for ops with a tuple output such as
``split``), or raises :class:`Unsupported` with the reason (e.g. a symbolic dimension).
Rules are keyed by the Relax op name; users add their own::

    @vtc_tvm.register_rule("relax.my_movement_op")
    def _my_rule(call):
        x = call.args[0]
        return VirtualTensor(Mapping.view(out_shape(call), dtype_of(call), shape_of(x),
                                          lambda i, j: (j, i)), [x])
"""

from __future__ import annotations

import math
from typing import Callable, Dict

import tvm
import tvm_ffi
from tvm import relax, tirx

from .mapping import Mapping, Piece, VirtualTensor, _substitute, dim, row_major_strides, same_shape

_RULES: Dict[str, Callable] = {}


class Unsupported(Exception):
    """A rule cannot express this call as a static mapping; the message says why."""


def register_rule(op_name: str, rule: Callable = None, override: bool = False):
    """Register ``rule(call) -> VirtualTensor | list[VirtualTensor]`` for ``op_name``."""

    def _register(fn):
        if op_name in _RULES and not override:
            raise ValueError(f"a rule for {op_name} is already registered (pass override=True)")
        _RULES[op_name] = fn
        return fn

    return _register(rule) if rule is not None else _register


def get_rule(op_name: str):
    return _RULES.get(op_name)


def registered_ops():
    return sorted(_RULES)


def is_builtin_rule(op_name: str) -> bool:
    """Whether ``op_name``'s rule is this module's own: a pure function of the call's types,
    attributes and literal arguments (so its mapping may be derived once per structure)."""
    rule = _RULES.get(op_name)
    return rule is not None and _BUILTIN.get(op_name) is rule


# -- helpers for rules --------------------------------------------------------------------------
def dims_of(expr) -> tuple:
    """Shape of a tensor-typed expression: ints, and ``PrimExpr`` for symbolic dimensions."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None or not isinstance(ty.shape, relax.ShapeExpr):
        raise Unsupported(f"{expr} has no known shape")
    return tuple(dim(d) for d in ty.shape.values)


def shape_of(expr) -> tuple:
    """Static shape of a tensor-typed expression, or :class:`Unsupported`."""
    dims = dims_of(expr)
    for d in dims:
        static(d)
    return dims


def static(d) -> int:
    """``d`` as an int, or :class:`Unsupported` for a symbolic dimension."""
    if not isinstance(d, int):
        raise Unsupported(f"symbolic dimension {d}")
    return d


def dtype_of(expr) -> str:
    return str(expr.ty.dtype)


def _ints(tup) -> list:
    """Integers of a Relax tuple of PrimValues / an attribute array."""
    out = []
    for x in getattr(tup, "fields", tup):
        v = getattr(x, "value", x)
        if isinstance(v, tvm.ir.Expr) and not isinstance(v, tirx.IntImm):
            raise Unsupported(f"non-constant slice parameter {v}")
        out.append(int(getattr(v, "value", v)))
    return out


def _unravel(flat, shape):
    return [tirx.floormod(tirx.floordiv(flat, s), d) if i else tirx.floordiv(flat, s)
            for i, (s, d) in enumerate(zip(row_major_strides(shape), shape))]


def _view(call, src, fn) -> VirtualTensor:
    return VirtualTensor(Mapping.view(dims_of(call), dtype_of(call), dims_of(src), fn), [src])


# -- rules --------------------------------------------------------------------------------------
def _factors(dims) -> tuple:
    """The product of ``dims`` as (constant, [symbolic factors])."""
    const, sym, todo = 1, [], list(dims)
    while todo:
        d = todo.pop()
        if isinstance(d, tirx.Mul):  # 6 * n: the constant and n count apart
            todo += [dim(d.a), dim(d.b)]
        elif isinstance(d, int):
            const *= d
        else:
            sym.append(d)
    return const, sym


def _divides(a, b) -> bool:
    """Whether the product ``a`` divides the product ``b`` (both :func:`_factors`), symbolic
    factors matched by proof; False where it cannot be shown."""
    if a[0] == 0 or b[0] % a[0]:
        return False
    rest = list(b[1])
    for f in a[1]:
        k = next((k for k, g in enumerate(rest) if same_shape([f], [g])), None)
        if k is None:
            return False
        rest.pop(k)
    return True


def reshape_groups(out_shape, in_shape):
    """``[(out_axes, in_axes)]``: the shortest runs of axes with equal element counts, unit axes
    left out (numpy's no-copy reshape walk), or None where the counts cannot be matched (a
    symbolic dimension split unevenly, a zero-size axis). A reshape reads each group on its own,
    so an axis that keeps its size keeps its index: ``(4, 6, n) -> (4, 6, n, 1)`` maps
    ``v2 -> v2`` where the flat walk leaves divisions by ``6 * n`` no analyzer simplifies."""
    out_axes = [k for k, d in enumerate(out_shape) if not (isinstance(d, int) and d == 1)]
    in_axes = [k for k, d in enumerate(in_shape) if not (isinstance(d, int) and d == 1)]
    groups, a, b = [], 0, 0
    while a < len(out_axes) and b < len(in_axes):
        go, gi = [out_axes[a]], [in_axes[b]]
        a, b = a + 1, b + 1
        while True:
            po, pi = _factors([out_shape[k] for k in go]), _factors([in_shape[k] for k in gi])
            out_divides, in_divides = _divides(po, pi), _divides(pi, po)
            if out_divides and in_divides:
                break
            if not po[1] and not pi[1]:  # static: the smaller side takes its next axis
                grow_out = po[0] < pi[0]
            elif out_divides or in_divides:
                grow_out = out_divides
            else:
                return None
            if grow_out and a < len(out_axes):
                go.append(out_axes[a])
                a += 1
            elif not grow_out and b < len(in_axes):
                gi.append(in_axes[b])
                b += 1
            else:
                return None
        groups.append((go, gi))
    return groups if a == len(out_axes) and b == len(in_axes) else None


def _reshape(call):
    """reshape / flatten / squeeze / expand_dims: same row-major element order, read group by
    group (:func:`reshape_groups`; one group of all axes where the groups cannot be found)."""
    x = call.args[0]
    out_shape, in_shape = dims_of(call), dims_of(x)
    groups = reshape_groups(out_shape, in_shape) or [(list(range(len(out_shape))), list(range(len(in_shape))))]
    zero = tirx.IntImm("int64", 0)

    def fn(*v):
        idx = [zero] * len(in_shape)
        for go, gi in groups:
            flat = sum((v[k] * s for k, s in zip(go, row_major_strides([out_shape[k] for k in go]))), zero)
            for k, e in zip(gi, _unravel(flat, [in_shape[k] for k in gi])):
                idx[k] = e
        return idx

    return _view(call, x, fn)


for _op in ("relax.reshape", "relax.flatten", "relax.squeeze", "relax.expand_dims"):
    register_rule(_op, _reshape)


@register_rule("relax.permute_dims")
def _permute_dims(call):
    """out[v] = x[v permuted back]: source axis ``axes[a]`` reads output axis ``a``."""
    x = call.args[0]
    ndim = len(dims_of(x))
    axes = list(range(ndim))[::-1] if call.attrs.axes is None else [int(a) for a in call.attrs.axes]

    def fn(*v):
        src = [None] * ndim
        for out_axis, in_axis in enumerate(axes):
            src[in_axis] = v[out_axis]
        return src

    return _view(call, x, fn)


def _slice_view(call, x, starts_steps):
    """``out[v] = x[start_a + v_a * step_a]`` for the axes in ``starts_steps``."""
    return _view(call, x, lambda *v: [
        starts_steps[a][0] + vi * starts_steps[a][1] if a in starts_steps else vi
        for a, vi in enumerate(v)
    ])


SENTINEL_BITS = 40  # shape constants beyond +-2**SENTINEL_BITS are index sentinels, not sizes


def _holds_sentinel(ty) -> bool:
    """Whether a dimension of the tensor type ``ty`` holds a constant beyond +-2**SENTINEL_BITS."""
    found = []
    shape = getattr(ty, "shape", None)
    for dim in (shape.values if isinstance(shape, relax.ShapeExpr) else []):
        tvm_ffi.structural_walk(dim, (tirx.IntImm, lambda c: found.append(c) if abs(int(c.value)) >> SENTINEL_BITS else None),
                                order="post")
    return bool(found)


@register_rule("relax.strided_slice")
def _strided_slice(call):
    """out[v] = x[start + v * step] on the sliced axes (bounds clamp like numpy's)."""
    x = call.args[0]
    in_shape = dims_of(x)
    axes, begin, end = (_ints(call.args[i]) for i in (1, 2, 3))
    strides = _ints(call.args[4]) if len(call.args) > 4 else [1] * len(axes)
    if any(s < 0 for s in strides) and _holds_sentinel(call.ty):
        # strided_slice(..., end=INT64_MIN, strides=[-2]) beside a symbolic axis gives an extent
        # such as 2**63 - 2 - max(n, 2**63 - 3): TVM's simplifier overflows int64 on the composed
        # indices (graph fuzzer, seed 911: case_b627b06f22; stock's own kernel compiles). A
        # forward slice to INT64_MAX (the last token of a sequence) is fine.
        raise Unsupported(f"reversed slice whose output extent holds a constant beyond +-2**{SENTINEL_BITS} "
                          "(an index sentinel), where TVM's arithmetic overflows")
    starts_steps = {}
    for a, b, e, s in zip(axes, begin, end, strides):
        a %= len(in_shape)
        n = in_shape[a]
        if isinstance(n, int):
            # Python's slice semantics are numpy's and TOPI's: negative and out-of-range bounds
            # (ONNX uses int64 extremes for "to the end") clamp to the axis.
            start, _, step = slice(b, e, s).indices(n)
        elif s == 1:
            # A symbolic axis: only the start matters (the output's shape is Relax's).
            start, step = (b if b >= 0 else tirx.max(n + b, 0)), 1
        else:
            raise Unsupported(f"strided slice (step {s}) of symbolic dimension {n}")
        starts_steps[a] = (start, step)
    return _slice_view(call, x, starts_steps)


@register_rule("relax.split")
def _split(call):
    """part k: out[v] = x[v + start_k] along ``axis``, one mapping per part."""
    x = call.args[0]
    in_shape = list(dims_of(x))
    axis = int(call.attrs.axis) % len(in_shape)
    in_shape[axis] = static(in_shape[axis])
    parts = call.attrs.indices_or_sections
    if isinstance(parts, (tirx.IntImm, int)):
        n = int(parts)
        size = math.ceil(in_shape[axis] / n)
        bounds = [min(i * size, in_shape[axis]) for i in range(n)]
    else:  # indices as numpy takes them: negative ones from the end, past the end clipped
        n = in_shape[axis]
        bounds = [0] + [min(max(i + n if i < 0 else i, 0), n) for i in _ints(parts)]
    dtype = dtype_of(x)
    outs = []
    for k, start in enumerate(bounds):
        stop = max(bounds[k + 1] if k + 1 < len(bounds) else in_shape[axis], start)
        shape = list(in_shape)
        shape[axis] = stop - start
        outs.append(VirtualTensor(Mapping.view(shape, dtype, in_shape, lambda *v, s=start: [
            vi + s if a == axis else vi for a, vi in enumerate(v)]), [x]))
    return outs


def _tuple_fields(expr):
    if isinstance(expr, relax.Tuple):
        return list(expr.fields)
    raise Unsupported("tuple argument is not a literal tuple")


@register_rule("relax.concat")
def _concat(call):
    """piecewise: out[v] = x_j[v - offset_j] where offset_j <= v[axis] < offset_j+1."""
    inputs = _tuple_fields(call.args[0])
    out_shape = dims_of(call)
    axis = int(call.attrs.axis) % len(out_shape)
    offsets = [0]
    for t in inputs:
        offsets.append(offsets[-1] + dims_of(t)[axis])

    def body(v, srcs):
        pieces = []
        for j, (lo, hi) in enumerate(zip(offsets, offsets[1:])):
            idx = [vi - lo if a == axis else vi for a, vi in enumerate(v)]
            last = j == len(inputs) - 1
            pieces.append(Piece(j, idx, None if last else v[axis] < hi))
        return pieces

    types = [(dims_of(t), dtype_of(t)) for t in inputs]
    return VirtualTensor(Mapping.build(out_shape, dtype_of(call), types, body), inputs)


@register_rule("relax.stack")
def _stack(call):
    """piecewise: out[v] = x_j[v without axis] where v[axis] == j."""
    inputs = _tuple_fields(call.args[0])
    out_shape = dims_of(call)
    axis = int(call.attrs.axis) % len(out_shape)

    def body(v, srcs):
        rest = [vi for a, vi in enumerate(v) if a != axis]
        return [Piece(j, rest, None if j == len(inputs) - 1 else v[axis] == j)
                for j in range(len(inputs))]

    types = [(dims_of(t), dtype_of(t)) for t in inputs]
    return VirtualTensor(Mapping.build(out_shape, dtype_of(call), types, body), inputs)


def _broadcast_index(v, in_shape):
    """Right-aligned numpy broadcasting: size-1 source axes read index 0."""
    lead = len(v) - len(in_shape)
    return [tirx.IntImm("int64", 0) if isinstance(d, int) and d == 1 else v[lead + a]
            for a, d in enumerate(in_shape)]


@register_rule("relax.broadcast_to")
def _broadcast_to(call):
    """out[v] = x[v right-aligned], size-1 source axes read index 0."""
    x = call.args[0]
    in_shape, out_shape = dims_of(x), dims_of(call)
    lead = len(out_shape) - len(in_shape)
    for d, o in zip(in_shape, out_shape[lead:]):
        if not isinstance(d, int) and not (isinstance(o, tvm.ir.Expr) and d.same_as(o)):
            # A symbolic source dimension may be 1 (broadcast) or not at run time.
            raise Unsupported(f"broadcast of symbolic dimension {d} to {o}")
    return _view(call, x, lambda *v: _broadcast_index(v, in_shape))


@register_rule("relax.tile")
def _tile(call):
    """out[v] = x[v % shape(x)] (right-aligned)."""
    x = call.args[0]
    in_shape = dims_of(x)
    return _view(call, x, lambda *v: [tirx.floormod(vi, d)
                                      for vi, d in zip(v[len(v) - len(in_shape):], in_shape)])


@register_rule("relax.repeat")
def _repeat(call):
    """out[v] = x[v // repeats] along ``axis`` (without an axis: of the flattened tensor)."""
    x = call.args[0]
    reps = int(call.attrs.repeats)
    if call.attrs.axis is None:  # repeat of the flattened tensor
        in_shape = dims_of(x)
        return _view(call, x, lambda v: _unravel(tirx.floordiv(v, reps), in_shape))
    axis = int(call.attrs.axis) % len(dims_of(x))
    return _view(call, x, lambda *v: [tirx.floordiv(vi, reps) if a == axis else vi
                                      for a, vi in enumerate(v)])


@register_rule("relax.flip")
def _flip(call):
    """out[v] = x[n - 1 - v] along ``axis``."""
    x = call.args[0]
    in_shape = dims_of(x)
    axis = int(call.attrs.axis) % len(in_shape)
    return _slice_view(call, x, {axis: (in_shape[axis] - 1, -1)})


@register_rule("relax.nn.pad")
def _pad(call):
    """piecewise: out[v] = x[v - before] inside the source, the pad value outside (constant mode)."""
    if call.attrs.pad_mode != "constant":
        raise Unsupported(f"pad mode {call.attrs.pad_mode}")
    x = call.args[0]
    in_shape = dims_of(x)
    before = [int(p) for p in call.attrs.pad_width[0::2]]
    value = float(call.attrs.pad_value)

    def body(v, srcs):
        inside = [tirx.all(lo <= vi, vi < lo + d) for vi, lo, d in zip(v, before, in_shape)]
        if not inside:  # a 0-d tensor has nothing to pad
            return Piece(0, [])
        return [Piece(0, [vi - lo for vi, lo in zip(v, before)], tirx.all(*inside)),
                Piece(None, value=tirx.const(value, dtype_of(x)))]

    return VirtualTensor(Mapping.build(dims_of(call), dtype_of(call), [(in_shape, dtype_of(x))], body), [x])


@register_rule("relax.layout_transform")
def _layout_transform(call):
    """The op's index map is on the store side (out[f(i)] = x[i]); the view needs f^-1."""
    x = call.args[0]
    in_shape = shape_of(x)
    fmap = call.attrs.index_map
    inverse, padding = fmap.non_surjective_inverse(in_shape)
    pad = call.attrs.pad_value

    def body(v, srcs):
        src = inverse.map_indices(v)
        if isinstance(padding, tirx.IntImm) and not padding.value:
            return Piece(0, src)
        cond = _substitute(padding, dict(zip(inverse.initial_indices, v)))
        value = tirx.const(0, dtype_of(x)) if pad is None else pad.value
        return [Piece(None, value=tirx.Cast(dtype_of(x), value), cond=cond), Piece(0, src)]

    return VirtualTensor(Mapping.build(shape_of(call), dtype_of(call), [(in_shape, dtype_of(x))], body), [x])


def _indirect(call, body):
    x, idx = call.args[0], call.args[1]
    types = [(dims_of(x), dtype_of(x)), (dims_of(idx), dtype_of(idx))]
    return VirtualTensor(Mapping.build(dims_of(call), dtype_of(call), types, body), [x, idx])


def _as_index(e):
    return e if str(e.ty) == "int64" else tirx.Cast("int64", e)


@register_rule("relax.take")
def _take(call):
    """indirect: out[..., j, ...] = x[..., idx[j], ...] along ``axis`` (fast, clip or wrap)."""
    in_shape = dims_of(call.args[0])
    idx_rank = len(dims_of(call.args[1]))
    axis = int(call.attrs.axis) % len(in_shape) if call.attrs.axis is not None else None
    if axis is None:
        raise Unsupported("take without axis (flattened) is not supported")
    n, mode = in_shape[axis], call.attrs.mode
    if mode not in ("fast", "clip", "wrap"):
        raise Unsupported(f"take mode {mode!r}")

    def body(v, srcs):
        i = _as_index(tirx.BufferLoad(srcs[1], list(v[axis : axis + idx_rank])))
        if mode == "clip":
            i = tirx.max(tirx.min(i, n - 1), 0)
        elif mode == "wrap":
            i = tirx.floormod(i, n)
        return Piece(0, list(v[:axis]) + [i] + list(v[axis + idx_rank :]))

    return _indirect(call, body)


@register_rule("relax.gather_elements")
def _gather_elements(call):
    """indirect: out[v] = x[v with v[axis] replaced by idx[v]]."""
    axis = int(call.attrs.axis) % len(dims_of(call.args[0]))

    def body(v, srcs):
        i = _as_index(tirx.BufferLoad(srcs[1], list(v)))
        return Piece(0, [i if a == axis else vi for a, vi in enumerate(v)])

    return _indirect(call, body)


@register_rule("relax.gather_nd")
def _gather_nd(call):
    """indirect: out[b, m, rest] = x[b, idx[b, m, 0..k-1], rest]."""
    b = int(call.attrs.batch_dims)
    idx_shape = dims_of(call.args[1])
    k, m = static(idx_shape[-1]), len(idx_shape) - 1 - b  # index depth, index batch rank

    def body(v, srcs):
        lead = list(v[: b + m])
        picked = [_as_index(tirx.BufferLoad(srcs[1], lead + [tirx.IntImm("int64", q)])) for q in range(k)]
        return Piece(0, list(v[:b]) + picked + list(v[b + m :]))

    return _indirect(call, body)


@register_rule("relax.nn.pixel_shuffle")
def _pixel_shuffle(call):
    """out[n, c, h, w] = x[n, c*r*r + (h%r)*r + w%r, h//r, w//r] (NCHW)."""
    x = call.args[0]
    r = int(call.attrs.upscale_factor)
    fd, fm = tirx.floordiv, tirx.floormod
    return _view(call, x, lambda n, c, h, w: [n, c * r * r + fm(h, r) * r + fm(w, r), fd(h, r), fd(w, r)])


_BUILTIN = dict(_RULES)  # the rules above; a user's (register_rule, override=True) is not one
