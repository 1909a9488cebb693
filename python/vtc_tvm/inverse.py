"""Store maps: where a producer must write each element so that a copy of it is never needed.

A copy kernel ``out[v] = src_s[G_s(v)]`` (one piece per source: a permute, a reshape, a head-major
``reshape o permute``, the slices of a concat, a channel shuffle after a concat) can disappear
when each ``G_s`` is one-to-one from its piece's region of ``out`` onto the whole of ``src_s``:
the producer of ``src_s`` then writes element ``i`` at ``out[H_s(i)]`` with ``H_s = G_s^-1``
(the paper's store side).

:func:`store_maps` computes every ``H_s`` with TVM's machinery: the region of a piece (its
condition, minus the earlier pieces') is parametrised as a box, after substituting a residue
class ``v = m*w + r`` where the region fixes ``v % m``; ``tvm.tirx.IndexMap.inverse`` inverts
``G_s`` over that box (it runs ``detect_iter_map`` and fails unless the map is bijective), and
``tvm.sym.Analyzer`` proves the result: ``H_s(i)`` lies in the region, inside ``out``, and
``G_s(H_s(i)) == i`` for every ``i`` of ``src_s``.

Limits: 1. static shapes only; 2. every piece reads a source (no constant pieces: nothing would
write their elements); a source that several pieces read has no inverse (it is copied); 3. a region must be a box,
or a box over one residue class per axis (modulus at most ``MAX_MODULUS``); anything the
analyzer cannot prove is refused, with the reason in :class:`NotOneToOne`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, List

import tvm
import tvm_ffi
from tvm import tirx

from .errors import last_line
from .mapping import Mapping, _i64, _substitute, is_static

StoreIndex = Callable[[list], list]
# Residue classes are tried up to this modulus (a channel shuffle of g groups needs g; each
# candidate residue costs one simplification).
MAX_MODULUS = 16


class NotOneToOne(Exception):
    """A mapping cannot be stored through; the message says why."""


@dataclass(frozen=True)
class PieceBox:
    """Where one piece of a copy applies, as a box: ``out[out_index(u)] = src[source][src_index(u)]``
    for ``u`` over ``extents``."""

    source: int
    vars: tuple
    extents: tuple
    out_index: tuple
    src_index: tuple

    def inverse(self, source_shape) -> StoreIndex:
        """The store index of the piece's source: ``i -> out_index(u)`` with ``src_index(u) == i``;
        raise :class:`NotOneToOne` unless ``src_index`` maps the box one-to-one onto the whole
        source (proven: ``tvm.tirx.IndexMap.inverse`` runs ``detect_iter_map``, then the analyzer
        checks ``src_index(u(i)) == i`` over the source)."""
        src_shape = [int(d) for d in source_shape]
        if math.prod(self.extents) != math.prod(src_shape):
            raise NotOneToOne(f"the region a piece writes ({list(self.extents)}) and its source ({src_shape}) "
                              "differ in size: a slice or a broadcast of its source, not one-to-one")
        try:
            inverse = tirx.IndexMap(list(self.vars), list(self.src_index), None).inverse(
                [_i64(n) for n in self.extents])
        except RuntimeError as err:
            raise NotOneToOne(f"the mapping is not one-to-one onto its source ({last_line(err)})") from None
        src_vars = list(inverse.initial_indices)
        ana = _bound(src_vars, src_shape)
        at_u = dict(zip(self.vars, inverse.final_indices))
        in_box = [ana.simplify(e) for e in inverse.final_indices]
        checks = [e >= 0 for e in in_box] + [e < n for e, n in zip(in_box, self.extents)]
        checks += [tirx.EQ(_substitute(g, at_u), i) for g, i in zip(self.src_index, src_vars)]
        if len(src_vars) != len(src_shape) or not all(ana.can_prove(c) for c in checks):
            raise NotOneToOne("the inverse could not be proven: out of range or not one-to-one")
        out_index = [ana.simplify(_substitute(e, at_u)) for e in self.out_index]
        return lambda idx: [_substitute(e, dict(zip(src_vars, idx))) for e in out_index]

    def inverse_onto(self, source_shape) -> "StoreRegion":
        """The store index of the part of the source this piece reads: ``src_index`` must map
        the box one-to-one onto a box ``lo <= i <= hi`` of the source (a split part, a slice;
        the whole source is the case :meth:`inverse` handles); raise :class:`NotOneToOne` for a
        read outside the source, or one that is not one-to-one onto a box (a broadcast, a
        repeat, a strided slice: the bounding box is larger than the piece)."""
        src_shape = [int(d) for d in source_shape]
        if len(self.src_index) != len(src_shape):
            raise NotOneToOne("the piece's source index does not match its source's rank")
        ana = _bound(self.vars, self.extents)
        bounds = [ana.const_int_bound(e) for e in self.src_index]
        lo, hi = [int(b.min_value) for b in bounds], [int(b.max_value) for b in bounds]
        if any(a < 0 or b >= n for a, b, n in zip(lo, hi, src_shape)):
            raise NotOneToOne(f"the piece reads outside its source (rows {lo}..{hi} of {src_shape})")
        sub = [b - a + 1 for a, b in zip(lo, hi)]
        if math.prod(sub) != math.prod(self.extents):
            raise NotOneToOne(f"the region a piece writes ({list(self.extents)}) is not one-to-one onto a box of "
                              f"its source (bounding box {sub}): a broadcast, repeat or strided read")
        shifted = PieceBox(self.source, self.vars, self.extents, self.out_index,
                           tuple(ana.simplify(e - _i64(a)) if a else e for e, a in zip(self.src_index, lo)))
        inner = shifted.inverse(sub)
        index = (lambda idx: inner([i - _cast_like(i, a) if a else i for i, a in zip(idx, lo)])) if any(lo) else inner
        return StoreRegion(index, tuple(lo), tuple(hi), tuple(src_shape))


@dataclass(frozen=True)
class StoreRegion:
    """Where the elements ``lo <= i <= hi`` of a source are stored: ``index(i)`` in the
    destination; ``whole`` when that is every element of the source."""

    index: StoreIndex
    lo: tuple
    hi: tuple
    shape: tuple

    @property
    def whole(self) -> bool:
        return all(a == 0 for a in self.lo) and all(b == n - 1 for b, n in zip(self.hi, self.shape))

    def contains(self, idx):
        """The condition ``lo <= idx <= hi`` (only the axes that do not span the source)."""
        conds = []
        for i, a, b, n in zip(idx, self.lo, self.hi, self.shape):
            if a > 0:
                conds.append(i >= _cast_like(i, a))
            if b < n - 1:
                conds.append(i <= _cast_like(i, b))
        return tirx.all(*conds) if conds else tirx.const(True)

    def overlaps(self, other: "StoreRegion") -> bool:
        return all(a <= d and c <= b for a, b, c, d in zip(self.lo, self.hi, other.lo, other.hi))


def _cast_like(e, value: int):
    return tirx.IntImm(str(e.ty), value)


def store_maps(mapping: Mapping) -> List[PieceBox]:
    """The pieces of ``mapping``, each as a box of the output (see the module docstring), or
    raise :class:`NotOneToOne`."""
    if not is_static(mapping.shape) or not all(is_static(mapping.source_shape(j)) for j in range(len(mapping.sources))):
        raise NotOneToOne("symbolic shapes are not stored through")
    if any(p.source is None for p in mapping.pieces):
        raise NotOneToOne("a piece is a constant: no producer would write it")
    return [piece_box(mapping.vars, mapping.shape, p.indices, p.source, _region(mapping, k))
            for k, p in enumerate(mapping.pieces)]


def _region(mapping: Mapping, k: int) -> list:
    """The conditions under which piece ``k`` applies (pieces are tried in order)."""
    conds = [tirx.Not(p.cond) for p in mapping.pieces[:k]]
    if mapping.pieces[k].cond is not None:
        conds.append(mapping.pieces[k].cond)
    return conds


def piece_box(index_vars, shape, indices, source: int = 0, region=()) -> PieceBox:
    """The set of ``index_vars`` (over ``shape``) where every condition of ``region`` holds, as a
    box of new variables ``u`` (``v = lo + m*u`` per axis, ``m`` > 1 where the region fixes a
    residue of ``v``), with ``indices`` rewritten over it; raise :class:`NotOneToOne` if the
    region is not such a box."""
    index_vars, region = list(index_vars), list(region)
    shape = [int(d) for d in shape]
    subst, box = {}, []  # residue classes first, then the bounds
    for v, n in zip(index_vars, shape):
        stride, rest = _residue(v, n, region, index_vars, shape)
        u = tirx.Var(f"{v.name}_w", "int64")
        subst[v] = (u * stride + rest) if stride > 1 else u
        box.append((u, (n - rest + stride - 1) // stride))
    ana = _bound([u for u, _ in box], [n for _, n in box])
    bounds = []
    with ana.constraint_scope(ana.simplify(_substitute(tirx.all(*region), subst)) if region else tirx.const(True)):
        for u, _ in box:
            b = ana.const_int_bound(u)
            bounds.append((int(b.min_value), int(b.max_value)))
    fresh = [tirx.Var(f"{v.name}_u", "int64") for v in index_vars]
    extents = [hi - lo + 1 for lo, hi in bounds]
    if any(n <= 0 for n in extents):
        raise NotOneToOne("a piece never applies")
    lo_subst = {u: (f + _i64(lo)) if lo else f for (u, _), f, (lo, _) in zip(box, fresh, bounds)}
    box_ana = _bound(fresh, extents)
    to_box = lambda e: box_ana.simplify(_substitute(_substitute(e, subst), lo_subst))
    if region and not box_ana.can_prove(to_box(tirx.all(*region))):
        raise NotOneToOne("a piece's region is not a box (or a residue class of one)")
    return PieceBox(source, tuple(fresh), tuple(extents), tuple(to_box(v) for v in index_vars),
                    tuple(to_box(e) for e in indices))


def _bound(index_vars, extents) -> tvm.sym.Analyzer:
    ana = tvm.sym.Analyzer()
    for v, n in zip(index_vars, extents):
        ana.bind(v, tvm.ir.Range(_i64(0), _i64(int(n))))
    return ana


def _residue(v, n, region, index_vars, shape):
    """``(m, r)`` when ``region`` is empty wherever ``v % m != r`` (for all values of the other
    axes); else ``(1, 0)``."""
    moduli = set()

    def on_mod(e):
        if isinstance(e.a, tvm.ir.Var) and e.a.same_as(v) and isinstance(e.b, tirx.IntImm) \
                and 1 < int(e.b) <= min(n - 1, MAX_MODULUS):
            moduli.add(int(e.b))

    for c in region:
        tvm_ffi.structural_walk(c, (tirx.FloorMod, on_mod), order="post")
    for m in sorted(moduli):
        empty = []
        for r in range(m):
            w = tirx.Var("w", "int64")
            sub = tvm.sym.Analyzer()
            sub.bind(w, tvm.ir.Range(_i64(0), _i64((n - r + m - 1) // m)))
            for u, d in zip(index_vars, shape):
                if not u.same_as(v):
                    sub.bind(u, tvm.ir.Range(_i64(0), _i64(d)))
            cond = sub.simplify(_substitute(tirx.all(*region), {v: w * m + r}))
            empty.append(bool(sub.can_prove(tirx.Not(cond))))
        if empty.count(False) == 1:
            return m, empty.index(False)
    return 1, 0


