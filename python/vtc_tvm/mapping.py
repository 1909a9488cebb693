"""Mapping algebra: what a virtual tensor is and how virtual tensors compose.

A virtual tensor ``V = (F, P_0..P_n)`` never exists in memory: element ``V[v]`` is
``P_j[F_j(v)]`` for the first *piece* ``j`` of ``F`` whose condition holds at ``v``. Pieces give

* affine / floordiv / floormod views (transpose, reshape, slice, broadcast, ...): one piece,
* piecewise views (concat, pad): one piece per input plus a constant piece for padding,
* indirect views (take, gather): source indices that themselves load an index tensor.

Everything is plain TIR: indices are ``PrimExpr`` over the mapping's index variables, loads of
other sources inside indices are ``BufferLoad`` of the mapping's placeholder buffers. So the same
mapping can be inlined into a consumer's loads (:meth:`Mapping.load`), materialised by a copy
kernel (:meth:`Mapping.to_prim_func`), shown as ``IndexMap`` (:meth:`Mapping.index_maps`) and
evaluated on numpy arrays (:meth:`Mapping.apply_numpy`) to test it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir import Range, TensorLoad

INDEX_DTYPE = "int64"


def _i64(x) -> tvm.ir.Expr:
    if isinstance(x, int):
        return tirx.IntImm(INDEX_DTYPE, x)
    if isinstance(x, tirx.IntImm) and str(x.ty) != INDEX_DTYPE:
        return tirx.IntImm(INDEX_DTYPE, x.value)
    if str(x.ty) != INDEX_DTYPE:
        return tirx.Cast(INDEX_DTYPE, x)
    return x


def dim(d):
    """A dimension as a Python int when it is a constant, else the (symbolic) ``PrimExpr``."""
    if isinstance(d, tirx.IntImm):
        return int(d.value)
    return d if isinstance(d, tvm.ir.Expr) else int(d)


def is_static(shape) -> bool:
    return all(isinstance(dim(d), int) for d in shape)


def same_shape(a, b) -> bool:
    """Equal shapes, symbolic dimensions compared by proof (``n + 1`` equals ``1 + n``)."""
    ana = tvm.sym.Analyzer()
    return len(a) == len(b) and all(
        x == y if isinstance(dim(x), int) and isinstance(dim(y), int)
        else ana.can_prove_equal(_i64(dim(x)), _i64(dim(y)))
        for x, y in zip(a, b))


def row_major_strides(shape) -> list:
    """Element strides of a row-major tensor of ``shape`` (ints or ``PrimExpr``)."""
    return [math.prod(shape[i + 1 :]) for i in range(len(shape))]


def new_buffer(shape, dtype, name) -> tirx.Buffer:
    """A buffer like the ones LegalizeOps and TE create (no TileLayout): FuseTIR compares the
    buffer types of a tensor's producer and consumers structurally."""
    return tirx.decl_buffer([_i64(dim(d)) for d in shape], str(dtype), name, layout=None)


@dataclass(frozen=True)
class Piece:
    """One branch of a mapping: ``V[v] = sources[source][indices(v)]`` where ``cond(v)`` holds.

    ``source is None`` makes a constant piece (``value``), e.g. the padding of ``nn.pad``.
    ``cond is None`` means "everywhere the earlier pieces do not apply" and ends a mapping.
    """

    source: Optional[int]
    indices: tuple = ()
    cond: Optional[tvm.ir.Expr] = None
    value: Optional[tvm.ir.Expr] = None


def _substitute(expr, vmap):
    """Replace Vars by expressions (the idiom TVM itself uses for Var substitution)."""
    return tvm_ffi.structural_map(expr, (tvm.ir.Var, lambda v: vmap.get(v, v)), order="post")


class Mapping:
    """Index map from a virtual tensor of ``shape``/``dtype`` to its physical sources."""

    def __init__(self, shape, dtype, sources: Sequence[tirx.Buffer], index_vars, pieces):
        self.shape = tuple(dim(s) for s in shape)
        self.dtype = str(dtype)
        self.sources = tuple(sources)
        self.vars = tuple(index_vars)
        self.pieces = tuple(pieces)
        assert self.pieces and self.pieces[-1].cond is None, "the last piece must be unconditional"

    # -- construction --------------------------------------------------------------------------
    @staticmethod
    def build(shape, dtype, source_types, body: Callable) -> "Mapping":
        """``body(v, srcs)`` returns the pieces for index variables ``v`` and source buffers.

        ``source_types`` is a list of ``(shape, dtype)``; a body may return one ``Piece`` or a
        list. Index arithmetic is int64, as in the PrimFuncs LegalizeOps emits.
        """
        index_vars = [tirx.Var(f"v{i}", INDEX_DTYPE) for i in range(len(shape))]
        srcs = [
            new_buffer(s, t, f"src{j}")
            for j, (s, t) in enumerate(source_types)
        ]
        pieces = body(index_vars, srcs)
        pieces = [pieces] if isinstance(pieces, Piece) else list(pieces)
        pieces = [
            Piece(p.source, tuple(_i64(e) for e in p.indices), p.cond, p.value) for p in pieces
        ]
        return Mapping(shape, dtype, srcs, index_vars, pieces).simplify()

    @staticmethod
    def view(shape, dtype, source_shape, fn: Callable) -> "Mapping":
        """Single-source view: ``V[v] = src[fn(*v)]``."""
        return Mapping.build(
            shape, dtype, [(source_shape, dtype)], lambda v, s: Piece(0, tuple(fn(*v)))
        )

    @staticmethod
    def identity(shape, dtype) -> "Mapping":
        return Mapping.view(shape, dtype, shape, lambda *v: v)

    # -- queries -------------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self):
        """Number of elements: an int, or a ``PrimExpr`` for a symbolic shape."""
        return math.prod(self.shape)

    def source_shape(self, j) -> tuple:
        return tuple(dim(d) for d in self.sources[j].shape)

    @property
    def symbols(self) -> list:
        """The symbolic dimension variables of the virtual tensor and of its sources."""
        found = []
        shapes = [self.shape] + [self.source_shape(j) for j in range(len(self.sources))]
        for d in (d for shape in shapes for d in shape if not isinstance(d, int)):
            tvm_ffi.structural_walk(d, (tvm.ir.Var, lambda v: found.append(v) if not any(
                v.same_as(f) for f in found) else None), order="post")
        return found

    def instantiate(self, values: dict) -> "Mapping":
        """The mapping at concrete values ``{symbol: int}`` of its symbolic dimensions."""
        vmap = {v: _i64(int(n)) for v, n in values.items()}
        fix = lambda e: _substitute(e, vmap) if isinstance(e, tvm.ir.Expr) else e
        ana = tvm.sym.Analyzer()
        concrete = lambda shape: [ana.simplify(_i64(fix(d))) for d in shape]
        sources = [new_buffer(concrete(b.shape), b.dtype, b.name) for b in self.sources]
        rebind = lambda e: _rebind_loads(fix(e), self.sources, lambda j, idx: tirx.BufferLoad(sources[j], idx))
        pieces = [Piece(p.source, tuple(rebind(e) for e in p.indices),
                        None if p.cond is None else rebind(p.cond),
                        None if p.value is None else fix(p.value)) for p in self.pieces]
        return Mapping(concrete(self.shape), self.dtype, sources, self.vars, pieces).simplify()

    @property
    def is_indirect(self) -> bool:
        """True when a source index reads another tensor (take, gather)."""
        found = []
        for p in self.pieces:
            for e in p.indices:
                tvm_ffi.structural_walk(e, (TensorLoad, found.append), order="post")
        return bool(found)

    @property
    def is_piecewise(self) -> bool:
        return len(self.pieces) > 1

    def data_sources(self) -> set:
        """Sources whose elements become elements of the virtual tensor."""
        return {p.source for p in self.pieces if p.source is not None}

    def analyzer(self) -> tvm.sym.Analyzer:
        ana = tvm.sym.Analyzer()
        for v, n in zip(self.vars, self.shape):
            ana.bind(v, Range(0, _i64(n)))
        return ana

    # -- the mapping as TIR --------------------------------------------------------------------
    def load(self, indices, load_source: Callable) -> tvm.ir.Expr:
        """The value of ``V[indices]``; ``load_source(j, idx)`` reads physical source ``j``.

        Out-of-range source indices are clamped inside conditional pieces: the condition
        guards them at run time, the clamp keeps region analysis (and so DLight,
        MetaSchedule, cache_read) in bounds.
        """
        vmap = dict(zip(self.vars, [_i64(i) for i in indices]))
        # Index tensors read inside conditions and indices (a gather's ``idx[v]``) are clamped
        # into their bounds: a condition such as ``v < 8 and 96 <= idx[v + 16]`` is evaluated
        # whole (TIR's `and` does not short-circuit), so ``idx`` would be read out of bounds
        # where an earlier conjunct is false (a model-fuzz segfault: pad over a gather).
        nested = lambda j, idx: load_source(j, [tirx.max(tirx.min(_i64(i), _i64(d) - 1), _i64(0))
                                                for i, d in zip(idx, self.source_shape(j))])
        subst = lambda e: _rebind_loads(_substitute(e, vmap), self.sources, nested)
        result = None
        for p in reversed(self.pieces):
            if p.source is None:
                val = p.value if isinstance(p.value, tvm.ir.Expr) else tirx.const(p.value, self.dtype)
            else:
                idx = [subst(e) for e in p.indices]
                if self.is_piecewise:
                    idx = self._clamped(p, idx)
                val = load_source(p.source, idx)
            result = val if p.cond is None else tirx.if_then_else(subst(p.cond), val, result)
        return result

    def _clamped(self, piece, idx):
        """Clamp the indices that can leave the source's bounds over the whole index space."""
        ana = self.analyzer()
        out = []
        for e, orig, extent in zip(idx, piece.indices, self.source_shape(piece.source)):
            if ana.can_prove(orig >= 0) and ana.can_prove(orig < _i64(extent)):
                out.append(e)
            else:
                out.append(tirx.max(tirx.min(e, _i64(extent - 1)), _i64(0)))
        return out

    def value_expr(self) -> tvm.ir.Expr:
        """``V[vars]`` as one expression reading the placeholder source buffers."""
        return self.load(self.vars, lambda j, idx: tirx.BufferLoad(self.sources[j], idx))

    def index_maps(self) -> list:
        """``[(source, IndexMap, cond)]``: the per-source ``tvm.tirx.IndexMap`` of each piece."""
        return [
            (p.source, tirx.IndexMap(list(self.vars), list(p.indices), None), p.cond)
            for p in self.pieces
            if p.source is not None
        ]

    # -- algebra -------------------------------------------------------------------------------
    def simplify(self) -> "Mapping":
        ana = self.analyzer()
        simplify = lambda e: lowering_safe(_nonnegative_symbolic_mods(ana.simplify(_symbolic_divmods(
            ana.simplify(_split_mods(ana.simplify(e), ana)), ana)), ana), self.vars)
        pieces = []
        for p in self.pieces:
            cond = None if p.cond is None else ana.simplify(p.cond)
            if cond is not None and isinstance(cond, tirx.IntImm):
                if not cond.value:
                    continue  # never applies
                cond = None
            if cond is None:
                pieces.append(Piece(p.source, tuple(simplify(e) for e in p.indices), None, p.value))
                break  # later pieces are unreachable
            with ana.constraint_scope(cond):
                idx = tuple(simplify(e) for e in p.indices)
            pieces.append(Piece(p.source, idx, cond, p.value))
        return Mapping(self.shape, self.dtype, self.sources, self.vars, pieces)

    def compose(self, j: int, inner: "Mapping") -> "Mapping":
        """Replace source ``j`` (itself virtual, with mapping ``inner``) by inner's sources.

        The result reads ``self``'s other sources followed by ``inner``'s sources:
        ``(F_self ∘ F_inner)``. Index loads of source ``j`` (an index tensor that is itself
        virtual) are rewritten through ``inner`` as well.
        """
        assert same_shape(inner.shape, self.source_shape(j)), (inner.shape, self.source_shape(j))
        kept = [k for k in range(len(self.sources)) if k != j]
        renumber = {k: n for n, k in enumerate(kept)}
        new_sources = [self.sources[k] for k in kept] + [
            new_buffer(b.shape, b.dtype, f"src{len(kept) + n}") for n, b in enumerate(inner.sources)
        ]
        shift = len(kept)

        def load_outer(k, idx):
            if k == j:
                return inner.load(idx, lambda m, i2: tirx.BufferLoad(new_sources[shift + m], i2))
            return tirx.BufferLoad(new_sources[renumber[k]], idx)

        rebind = lambda e: _rebind_loads(e, self.sources, load_outer)
        pieces = []
        for p in self.pieces:
            cond = None if p.cond is None else rebind(p.cond)
            if p.source != j:
                src = None if p.source is None else renumber[p.source]
                pieces.append(Piece(src, tuple(rebind(e) for e in p.indices), cond, p.value))
                continue
            outer_idx = [rebind(e) for e in p.indices]
            # int64 as inner's variables: an axis of extent 1 simplifies to an int32 0 (the
            # analyzer's ranges start at a Python 0), which a symbolic inner index cannot add to
            vmap = dict(zip(inner.vars, [_i64(e) for e in outer_idx]))
            for q in inner.pieces:
                q_cond = None if q.cond is None else _rebind_loads(
                    _substitute(q.cond, vmap), inner.sources,
                    lambda m, i2: tirx.BufferLoad(new_sources[shift + m], i2))
                both = q_cond if cond is None else (cond if q_cond is None else tirx.all(cond, q_cond))
                idx = tuple(
                    _rebind_loads(_substitute(e, vmap), inner.sources,
                                  lambda m, i2: tirx.BufferLoad(new_sources[shift + m], i2))
                    for e in q.indices
                )
                src = None if q.source is None else shift + q.source
                pieces.append(Piece(src, idx, both, q.value))
                if q_cond is None:
                    break
            if cond is None:
                break
        return Mapping(self.shape, self.dtype, new_sources, self.vars, _close(pieces)).simplify()

    # -- materialisation -----------------------------------------------------------------------
    def to_prim_func(self, name="vtc_copy") -> tirx.PrimFunc:
        """A copy kernel ``out[v] = V[v]`` (what stock TVM would run for the movement op)."""
        from tvm import te

        placeholders = [
            te.placeholder(b.shape, b.dtype, f"{name}_in{j}") for j, b in enumerate(self.sources)
        ]
        out = te.compute(
            [_i64(s) for s in self.shape],
            lambda *v: self.load(v, lambda j, idx: placeholders[j](*[lowering_safe(i, v) for i in idx])),
            name=name,
        )
        return te.create_prim_func(placeholders + [out]).without_attr("global_symbol")

    def apply_numpy(self, arrays: Sequence[np.ndarray]) -> np.ndarray:
        """Evaluate the virtual tensor on numpy sources (the reference for tests); symbolic
        dimensions take their values from the arrays' shapes."""
        if not is_static(self.shape) or not all(is_static(b.shape) for b in self.sources):
            values = {}
            for b, a in zip(self.sources, arrays):
                values.update({d: n for d, n in zip(b.shape, np.shape(a)) if isinstance(d, tvm.ir.Var)})
            return self.instantiate(values).apply_numpy(arrays)
        grids = np.indices(self.shape, dtype=np.int64) if self.shape else []
        env = {v: g for v, g in zip(self.vars, grids)}
        bufs = {b: arrays[j] for j, b in enumerate(self.sources)}
        out = _eval_np(self.value_expr(), env, bufs)
        return np.broadcast_to(np.asarray(out, dtype=self.dtype), self.shape).copy()

    def __repr__(self):
        lines = [f"Mapping{list(self.shape)} {self.dtype} <- " +
                 ", ".join(f"src{j}{list(self.source_shape(j))}" for j in range(len(self.sources)))]
        for p in self.pieces:
            what = f"const {p.value}" if p.source is None else f"src{p.source}[{', '.join(map(str, p.indices))}]"
            lines.append(f"  {'else' if p.cond is None else 'if ' + str(p.cond)}: {what}")
        return "\n".join(lines)


def _add_terms(e) -> list:
    """The terms of a sum ``a + b + ...`` (``e`` itself when it is no sum)."""
    return _add_terms(e.a) + _add_terms(e.b) if isinstance(e, tirx.Add) else [e]


def _split_mods(expr, ana):
    """``(a*c + r) % m`` -> ``(a % (m/c))*c + r`` when c divides m and 0 <= r < c.

    Reshapes composed with reshapes (Swin's window partition at batch > 1) produce this form,
    which ``tvm.sym.Analyzer`` leaves alone; after the split it simplifies fully.
    """

    def on_mod(mod):
        if not isinstance(mod.b, tirx.IntImm):
            return mod
        m, parts = int(mod.b.value), _add_terms(mod.a)
        for k, t in enumerate(parts):
            if not (isinstance(t, tirx.Mul) and isinstance(t.b, tirx.IntImm)):
                continue
            c = int(t.b.value)
            rest = parts[:k] + parts[k + 1:]
            r = sum(rest[1:], rest[0]) if rest else tirx.IntImm(str(mod.ty), 0)
            bound = ana.const_int_bound(r)
            if 0 < c and m % c == 0 and bound.min_value >= 0 and bound.max_value < c:
                return tirx.floormod(t.a, m // c) * t.b + r
        return mod

    return tvm_ffi.structural_map(expr, (tirx.FloorMod, on_mod), order="post")


def _symbolic_divmods(expr, ana):
    """``(x*n + r) // n`` -> ``x`` and ``(x*n + r) % n`` -> ``r`` for a symbolic ``n`` where
    ``0 <= r < n`` is provable: ``tvm.sym.Analyzer`` does this for constant divisors only.

    An ``expand_dims`` or ``broadcast_to`` composed with a flattening over a symbolic axis leaves
    this form; kept, TVM classifies the copy kernel as opaque and FuseOps fuses nothing into it
    (graph fuzz, CUDA, seed 920: an ``add`` stock fuses into its broadcast became a kernel of its own).
    """

    def split(e):  # (x, r) with e.a == x*b + r, or None
        b = e.b
        if isinstance(b, tirx.IntImm):
            return None
        parts = _add_terms(e.a)
        for k, t in enumerate(parts):
            if tvm_ffi.structural_equal(t, b):
                x = tirx.IntImm(str(e.ty), 1)
            elif isinstance(t, tirx.Mul) and tvm_ffi.structural_equal(t.b, b):
                x = t.a
            elif isinstance(t, tirx.Mul) and tvm_ffi.structural_equal(t.a, b):
                x = t.b
            else:
                continue
            rest = parts[:k] + parts[k + 1:]
            r = sum(rest[1:], rest[0]) if rest else tirx.IntImm(str(e.ty), 0)
            if ana.can_prove(r >= 0) and ana.can_prove(r < b):
                return x, r
        return None

    def on_div(e):
        found = split(e)
        return e if found is None else found[0]

    def on_mod(e):
        found = split(e)
        return e if found is None else found[1]

    return tvm_ffi.structural_map(expr, [(tirx.FloorDiv, on_div), (tirx.FloorMod, on_mod)], order="post")


MAX_MOD_SHIFT = 8  # multiples of a symbolic modulus tried (a tile's repeats)


def _nonnegative_symbolic_mods(expr, ana):
    """``a % n`` with ``n`` symbolic and ``a`` possibly negative -> ``n - 1 - (n - 1 - a) % n``
    when ``n - 1 - a`` plus a multiple of ``n`` is provably non-negative (``a = r*n - 1 - i``,
    flip over tile: ``n - 1 - i % n``); otherwise ``a % n`` is left as it is.

    TVM 0.27's LLVM code generation fails on the original (``Binding of variable rmod ...
    conflicts with previous binding``, found by our graph fuzzer: flip over a tile of a symbolic
    length); the identity holds for every integer ``a`` and ``n > 0``.
    """

    def on_mod(mod):
        b = mod.b
        if isinstance(b, tirx.IntImm) or ana.can_prove(mod.a >= 0):
            return mod
        # (a modulus by 0 is undefined either way: the rewrite may assume b > 0)
        with ana.constraint_scope(b > 0):
            one = tirx.IntImm(str(mod.ty), 1)
            mirrored = ana.simplify(b - one - mod.a)
            # adding multiples of b leaves the residue: r*n - 1 - i mirrors to i - (r-1)*n ~ i
            for k in range(MAX_MOD_SHIFT + 1):
                shifted = ana.simplify(mirrored + b * tirx.IntImm(str(mod.ty), k))
                if ana.can_prove(shifted >= 0):
                    return b - one - tirx.floormod(shifted, b)
        return mod

    return tvm_ffi.structural_map(expr, (tirx.FloorMod, on_mod), order="post")


def _signed_terms(e):
    """``e`` as ``[(coefficient, atom)]`` over its sums, differences and constant factors
    (``atom`` None for the constant term)."""
    if isinstance(e, tirx.IntImm):
        return [(int(e.value), None)]
    if isinstance(e, tirx.Add):
        return _signed_terms(e.a) + _signed_terms(e.b)
    if isinstance(e, tirx.Sub):
        return _signed_terms(e.a) + [(-c, t) for c, t in _signed_terms(e.b)]
    if isinstance(e, tirx.Mul) and isinstance(e.b, tirx.IntImm):
        return [(c * int(e.b.value), t) for c, t in _signed_terms(e.a)]
    if isinstance(e, tirx.Mul) and isinstance(e.a, tirx.IntImm):
        return [(c * int(e.a.value), t) for c, t in _signed_terms(e.b)]
    return [(1, e)]


def lowering_safe(expr, iters):
    """Rewrite ``(s - y) // d`` and ``(s - y) % d`` (``y`` the iterator terms, all negated;
    ``s`` constants and symbolic sizes) so that the iterators count up.

    TVM 0.27's ``FlattenBuffer`` simplifies every index with ``IterMapSimplify``, which gets a
    floordiv or floormod of a negatively scaled iterator plus an offset wrong whenever the
    offset is not a multiple of ``d``: ``(11 - i) // 3`` becomes ``i // -3 + 3`` and
    ``(n - i) // 3`` worse (found by our differential fuzzer on flip over repeat, seeds 912 and
    915). With ``s = k + S`` (``k`` the constant, ``k = q*d + r``):
    ``(s - y) // d == q - (y - S + d-1-r) // d`` and ``(s - y) % d == d-1 - (y - S + d-1-r) % d``,
    which IterMapSimplify keeps. Numerators that mix the iterators' signs are left alone (it
    does not simplify those). ``iters``: the loop or block variables of the indices.
    """
    iters = list(iters)

    def counts_down(e):
        if not isinstance(e.b, tirx.IntImm) or e.b.value <= 0:
            return None
        terms = _signed_terms(e.a)
        moving = [c for c, t in terms
                  if t is not None and any(v.same_as(i) for v in tirx.analysis.undefined_vars(t) for i in iters)]
        if not moving or max(moving) >= 0:
            return None
        d, ty = int(e.b.value), str(e.ty)
        q, r = divmod(sum(c for c, t in terms if t is None), d)
        scaled = lambda c, t: t if c == 1 else t * tirx.IntImm(ty, c)
        y = [scaled(-c, t) for c, t in terms if t is not None and c < 0]  # not empty: ``moving``
        up = sum(y[1:], y[0])
        for c, t in terms:
            if t is not None and c > 0:
                up = up - scaled(c, t)  # S
        return q, d, up + tirx.IntImm(ty, d - 1 - r) if d - 1 - r else up

    def on_div(e):
        parts = counts_down(e)
        if parts is None:
            return e
        q, d, up = parts
        return tirx.IntImm(str(e.ty), q) - tirx.floordiv(up, d)

    def on_mod(e):
        parts = counts_down(e)
        if parts is None:
            return e
        _, d, up = parts
        return tirx.IntImm(str(e.ty), d - 1) - tirx.floormod(up, d)

    return tvm_ffi.structural_map(expr, [(tirx.FloorDiv, on_div), (tirx.FloorMod, on_mod)], order="post")


def _close(pieces):
    """Drop the pieces after the first unconditional one."""
    out = []
    for p in pieces:
        out.append(p)
        if p.cond is None:
            break
    return out


def _rebind_loads(expr, buffers, load_source):
    """Replace loads of placeholder ``buffers[j]`` by ``load_source(j, indices)``."""
    index = {b: j for j, b in enumerate(buffers)}

    def on_load(load):
        j = index.get(load.source)
        return load if j is None else load_source(j, list(load.indices))

    return tvm_ffi.structural_map(expr, (TensorLoad, on_load), order="post")


@dataclass
class VirtualTensor:
    """A Relax tensor that is ``mapping`` over physical Relax tensors ``sources``."""

    mapping: Mapping
    sources: list

    @property
    def shape(self):
        return self.mapping.shape

    @property
    def dtype(self):
        return self.mapping.dtype


# -- numpy evaluation of TIR index expressions (tests, contiguity analysis) ------------------------
_BINARY = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply,
    "FloorDiv": np.floor_divide, "FloorMod": np.mod, "Min": np.minimum, "Max": np.maximum,
    "EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal,
    "GT": np.greater, "GE": np.greater_equal, "And": np.logical_and, "Or": np.logical_or,
}


def _eval_np(e, env, bufs):
    kind = type(e).__name__
    if kind in ("IntImm", "FloatImm"):
        return np.asarray(e.value)
    if isinstance(e, tvm.ir.Var) and not tirx.is_buffer_var(e):
        return env[e]
    if kind in _BINARY:
        return _BINARY[kind](_eval_np(e.a, env, bufs), _eval_np(e.b, env, bufs))
    if kind in ("Div", "Mod"):  # C semantics: truncation toward zero
        a, b = _eval_np(e.a, env, bufs), _eval_np(e.b, env, bufs)
        if not np.issubdtype(np.result_type(a, b), np.integer):
            return a / b if kind == "Div" else np.fmod(a, b)
        quotient = np.sign(a) * np.sign(b) * (np.abs(a) // np.abs(b))
        return quotient if kind == "Div" else a - b * quotient
    if kind == "Not":
        return np.logical_not(_eval_np(e.a, env, bufs))
    if kind == "Cast":
        return _eval_np(e.value, env, bufs).astype(str(e.ty))
    if kind == "Select":
        return np.where(_eval_np(e.condition, env, bufs), _eval_np(e.true_value, env, bufs),
                        _eval_np(e.false_value, env, bufs))
    if isinstance(e, TensorLoad):
        arr = bufs[e.source]
        idx = [np.asarray(_eval_np(i, env, bufs)) for i in e.indices]
        if arr.ndim == 0:
            return np.broadcast_to(arr, np.broadcast_shapes(*[i.shape for i in idx]) if idx else ())
        # Out-of-range indices only occur under a false condition of a select: clip them.
        idx = [np.clip(i, 0, d - 1) for i, d in zip(idx, arr.shape)]
        return arr[tuple(idx)]
    if kind == "Call" and e.op.name.endswith("if_then_else"):
        c, t, f = (_eval_np(a, env, bufs) for a in e.args)
        return np.where(c, t, f)
    raise NotImplementedError(f"cannot evaluate {kind}: {e}")
