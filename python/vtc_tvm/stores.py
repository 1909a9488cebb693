"""Store side: producers write straight into the copy or in-place update that consumes them.

This module *executes* the store edges the plan chose (:mod:`vtc_tvm.plan`); it makes no
decision of its own. The plan's emitter (:mod:`vtc_tvm.transform`) materialises every chosen
destination with a copy kernel of ours and marks, in the copy's blocks, which of its inputs the
plan lets their producers store into it (the block annotation :data:`STORE_PLAN`, see
:func:`mark_store_plan`). Block annotations survive ``FuseOps``/``FuseTIR`` (a copy fused with
a trailing reshape keeps its block), so the decision reaches this pass, which runs right after
``FuseTIR`` where producers are final kernels::

    a = call_tir(producer_a, ...)            # used only by the copy
    b = call_tir(producer_b, ...)            # used only by the copy
    c = call_tir(copy, (a, x, b))            # the plan chose a -> c and b -> c

When each piece of the copy is one-to-one from its region of ``c`` onto its source, or onto a
box of it (a concat slice, a permute, a head-major ``reshape o permute``, a channel shuffle
after a concat, a split part, a slice: :mod:`vtc_tvm.inverse` proves it and computes
``H = G^-1``), ``a`` and ``b`` become views of ``c``: their producers store element ``i`` at
``c[H(i)]``::

    c0 = call_tir(producer_a_into, ..., out_ty=c)                      # allocates c
    c1 = call_tir_inplace(producer_b_into, (..., c0), [k], out_ty=c)
    c  = call_tir_inplace(copy_into, (x, c1), [1], out_ty=c)           # the piece without a producer

A producer whose output several copies read in disjoint parts (the fused QKV GEMM read by three
head-major copies, a split that must exist part by part) stores each element in the one copy
that reads it (:func:`vtc_tvm.rewrite.redirect_output_parts`; elements no copy reads are not
stored). The same for the in-place updates of :mod:`vtc_tvm.inplace` (a KV-cache row written at
positions read from an index tensor, or read through a mapping such as the head-major
transpose of V)::

    rows = call_tir(k_proj_rope, ...)                                   # used only by the update
    cache = call_tir_inplace(scatter_nd_inplace, (rows, idx, cache), [2])
    ->
    cache = call_tir_inplace(k_proj_rope_into_cache, (..., idx, cache), [n])

What the plan cannot see before fusion is checked here, and a chosen edge that fails is refused
with its reason in the report (``side: "store"``): FuseOps fused the copy with computation or
the producer into the copy; the producer's output is read elsewhere after fusion (a tensor has
one physical home); the inverse does not exist or cannot be proven; on GPU targets the
redirected producer would lose its DLight rule (:func:`vtc_tvm.rewrite.best_schedulable`);
more than one piece of a copy would stay (more kernels than stock's one copy); or the build
would gain a kernel (the producer's kernel is shared with another call that stays, and the copy
stays too). The annotations are removed once the pass has run.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.ir import Op, TensorLoad
from tvm.relax.expr_functor import PyExprMutator, mutator

from .analysis import _non_root_blocks, call_tir_kernel, index_copy_mappings
from .copy_schedule import COPY_INTO_ATTR, inline_into_last
from .inverse import NotOneToOne, StoreRegion, piece_box, store_maps
from .mapping import Mapping, Piece, _substitute, is_static, row_major_strides
from .rewrite import NotRewritable, best_schedulable, redirect_output, redirect_output_parts

logger = logging.getLogger("vtc_tvm")
CALL_TIR = Op.get("relax.call_tir")
CALL_TIR_INPLACE = Op.get("relax.call_tir_inplace")
# Block annotation of a destination kernel (a copy, an in-place update): one flag per entry of
# the block's reads, 1 where the plan chose the store edge from that tensor's producer.
STORE_PLAN = "vtc.store_plan"


# -- the plan's marks ------------------------------------------------------------------------------
def mark_store_plan(func: tirx.PrimFunc, planned: set) -> tirx.PrimFunc:
    """``func`` (a copy or update kernel of the emitter) with :data:`STORE_PLAN` on each block
    that reads one of the parameters ``planned`` (indices): the producers of those inputs store
    into its output."""
    params = list(func.params)

    def on_block(block):
        if block.name_hint == "root":
            return block
        flags = [int(any(r.source.same_as(params[k]) for k in planned)) for r in block.reads]
        if not any(flags):
            return block
        annotations = dict(block.annotations)
        annotations[STORE_PLAN] = flags
        return tvm.s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, block.body,
                                block.init, block.alloc_buffers, block.match_buffers, annotations)

    body = tvm_ffi.structural_map(func.body, (tvm.s_tir.SBlock, on_block), order="post")
    return tirx.PrimFunc(func.params, body, ret_type=func.ret_type, attrs=func.attrs)


def planned_inputs(func) -> set:
    """Indices of the parameters of ``func`` whose producers the plan lets store into it."""
    if not isinstance(func, tirx.PrimFunc):
        return set()
    found = set()
    for block in _non_root_blocks(func):
        flags = block.annotations.get(STORE_PLAN) if block.annotations else None
        if flags is None or len(flags) != len(block.reads):
            continue
        for r, flag in zip(block.reads, flags):
            if int(flag):
                found.update(k for k, p in enumerate(func.params) if r.source.same_as(p))
    return found


def marks_rows(func) -> bool:
    """Whether the plan lets the rows' producer store into the update ``func`` (after fusion
    the update may read its rows through a copy FuseOps fused into it: any mark counts)."""
    return isinstance(func, tirx.PrimFunc) and any(
        b.annotations and any(int(f) for f in b.annotations.get(STORE_PLAN, [])) for b in _non_root_blocks(func))


def _unmarked(func: tirx.PrimFunc) -> tirx.PrimFunc:
    def on_block(block):
        if not (block.annotations and STORE_PLAN in block.annotations):
            return block
        annotations = {k: v for k, v in block.annotations.items() if k != STORE_PLAN}
        return tvm.s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, block.body,
                                block.init, block.alloc_buffers, block.match_buffers, annotations)

    body = tvm_ffi.structural_map(func.body, (tvm.s_tir.SBlock, on_block), order="post")
    return tirx.PrimFunc(func.params, body, ret_type=func.ret_type, attrs=func.attrs)


def _is_marked(func) -> bool:
    return isinstance(func, tirx.PrimFunc) and any(
        b.annotations and STORE_PLAN in b.annotations for b in _non_root_blocks(func))


# -- patterns ----------------------------------------------------------------------------------------
def indexed_copy(func: tirx.PrimFunc):
    """``(store_index, index params)`` if ``func`` is one block ``out[f(v)] = src[g(v)]`` over the
    whole of ``src`` (its first parameter) into ``out`` (its last), reading nothing but index
    tensors (the parameters between) in ``f``, with ``g`` the identity or one-to-one onto ``src``
    (the load side made the update read its rows through a mapping); else None.
    ``store_index`` maps indices ``i`` of ``src`` to ``f(g^-1(i))``: what a producer of ``src``
    can store through."""
    params = list(func.params)
    if len(params) < 2 or not all(tirx.is_buffer_var(p) for p in params):
        return None
    func = inline_into_last(func)
    blocks = _non_root_blocks(func) if func is not None else []
    if len(blocks) != 1:
        return None
    block = blocks[0]
    src, out, ivs = params[0], params[-1], [iv.var for iv in block.iter_vars]
    store, value = block.body, getattr(block.body, "value", None)
    if not (isinstance(store, tirx.BufferStore) and store.buffer.same_as(out) and isinstance(value, TensorLoad)
            and value.source.same_as(src) and all(_is_zero(iv.dom.min) for iv in block.iter_vars)):
        return None
    if block.alloc_buffers or (block.init is not None) or _reads_other_than(store.indices, params[1:-1]) \
            or not _unpredicated(func):
        return None
    if len(ivs) == len(src.shape) and all(
            tvm.sym.Analyzer().can_prove_equal(iv.dom.extent, n) for iv, n in zip(block.iter_vars, src.shape)) \
            and all(i.same_as(iv.var) or (_is_zero(i) and _is_one(iv.dom.extent))  # unit axes read at 0
                    for i, iv in zip(value.indices, block.iter_vars)):
        rows = lambda idx: dict(zip(ivs, idx))
    else:
        extents = [iv.dom.extent for iv in block.iter_vars]
        if not all(isinstance(n, tirx.IntImm) for n in list(extents) + list(src.shape)):
            return None
        try:
            inverse = piece_box(ivs, [int(n) for n in extents], list(value.indices)).inverse(src.shape)
        except NotOneToOne:
            return None
        rows = lambda idx: dict(zip(ivs, inverse(idx)))

    def store_index(idx):
        return [_substitute(e, rows(idx)) for e in store.indices]

    return store_index, params[1:-1]


def is_view(mapping: Mapping) -> bool:
    """Whether ``mapping`` reads the whole of its one source in row-major order (a reshape:
    stock TVM makes it a free view, there is no copy to save; a leading slice also reads in
    row-major order, but stock copies it)."""
    if len(mapping.pieces) != 1 or len(mapping.sources) != 1:
        return False
    piece, ana = mapping.pieces[0], mapping.analyzer()
    src_shape = mapping.source_shape(0)
    size = lambda shape: math.prod(int(d) for d in shape)
    if not (is_static(mapping.shape) and is_static(src_shape)) or size(mapping.shape) != size(src_shape):
        return False
    zero = tirx.IntImm("int64", 0)
    flat = lambda idx, shape: sum((i * s for i, s in zip(idx, row_major_strides(list(shape)))), zero)
    return len(piece.indices) == len(src_shape) and ana.can_prove_equal(
        flat(mapping.vars, mapping.shape), flat(piece.indices, src_shape))


def _substitute_all(exprs, index_vars, values) -> list:
    return [_substitute(e, dict(zip(index_vars, values))) for e in exprs]


def _uses(func) -> Counter:
    uses = Counter()
    relax.analysis.post_order_visit(func.body, lambda e: uses.update([e]) if isinstance(e, relax.Var) else None)
    for p in func.params:
        uses[p] += 1  # parameters are never rewritten
    return uses


def _stores_its_output(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` writes its output (last parameter) in blocks, through buffer stores that
    can be redirected: not through a packed or extern call that gets the raw pointer (TVM's CPU
    sort writes ``out.data`` from C++)."""
    out = func.params[-1]
    opaque = []
    tvm_ffi.structural_walk(func.body, (tvm.ir.Call, lambda c: opaque.append(c) if isinstance(c.op, Op) and any(
        k in c.op.name for k in ("packed", "extern", "stack_make_array")) else None))
    writes = any(r.source.same_as(out) for b in _non_root_blocks(func) for r in b.writes)
    return writes and not opaque


def _unpredicated(func) -> bool:
    """Whether every block of ``func`` runs over its whole domain (no ``T.where``)."""
    realizes = []
    tvm_ffi.structural_walk(func.body, (tvm.s_tir.SBlockRealize, realizes.append))
    return all(_is_one(r.predicate) for r in realizes)


def _is_zero(e):
    return isinstance(e, tirx.IntImm) and e.value == 0


def _is_one(e):
    return isinstance(e, tirx.IntImm) and e.value == 1


def _reads_other_than(exprs, buffers) -> bool:
    bad = []
    for e in exprs:
        tvm_ffi.structural_walk(e, (TensorLoad, lambda ld: bad.append(ld) if not any(
            ld.source.same_as(b) for b in buffers) else None))
    return bool(bad)


def _kernel_calls(mod) -> Counter:
    """Calls of each PrimFunc (GlobalVar) from the module's Relax functions."""
    calls = Counter()

    def visit(e):
        if isinstance(e, relax.Call) and (e.op.same_as(CALL_TIR) or e.op.same_as(CALL_TIR_INPLACE)):
            calls[e.args[0]] += 1

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    return calls


# -- the plan of one function, checked after fusion ----------------------------------------------------
@dataclass
class _Output:
    """One output of a destination copy (a split has several)."""

    key: tuple                 # (destination var, output index)
    ty: object                 # its TensorType
    srcs: list                 # the copy's inputs
    boxes: list                # its pieces (inverse.PieceBox)
    multi: bool = False        # an output of a multi-output copy: every piece must be stored
    buffers: tuple = ()        # the copy mapping's source buffers (``srcs[j]`` is read through ``buffers[j]``)


@dataclass
class _Store:
    """A producer's output ``src`` stored into (part of) a destination output."""

    src: relax.Var
    out: _Output
    region: StoreRegion


@dataclass
class _FunctionPlan:
    stores: Dict[relax.Var, List[_Store]] = field(default_factory=dict)    # by source
    outputs: Dict[relax.Var, List[_Output]] = field(default_factory=dict)  # by destination var

    def stored(self, out: _Output) -> set:
        return {s for s, targets in self.stores.items() if any(t.out is out for t in targets)}


def _reads(exprs, buffer) -> bool:
    found = []
    for e in exprs:
        tvm_ffi.structural_walk(e, (TensorLoad, lambda ld: found.append(ld) if ld.source.same_as(buffer) else None))
    return bool(found)


@mutator
class _StoreRewriter(PyExprMutator):
    def __init__(self, mod, target, report):
        super().__init__(mod)
        self.mod = mod
        self.target = target
        self.report = report

    def transform(self):
        self.calls = _kernel_calls(self.mod)
        self.built = {}
        for gv, func in self.mod.functions_items():
            if isinstance(func, relax.Function) and not (func.attrs and func.attrs.get("Primitive")):
                uses = _uses(func)
                self.plan = self._plan(func, uses)
                self.current, self.redirected = {}, set()
                self.updates, self.pending = self._plan_updates(func, uses), {}
                if self.plan.stores or self.updates:
                    self.builder_.update_func(gv, self.visit_expr(func))
        mod = self.builder_.get()
        for gv, func in mod.functions_items():
            if _is_marked(func):
                mod[gv] = _unmarked(func)
        return mod

    # -- pattern: the plan's edges, and what fusion made of them --------------------------------
    def _plan(self, func, uses) -> _FunctionPlan:
        bound, plan = {}, _FunctionPlan()
        wanted: Dict[relax.Var, List[tuple]] = {}  # source -> [(destination output, its piece)]
        for block in func.body.blocks:
            if not isinstance(block, relax.DataflowBlock):
                continue
            for b in block.bindings:
                bound[b.var] = b.value
                kernel = call_tir_kernel(self.mod, b.value)
                planned = planned_inputs(kernel[1]) if kernel is not None else set()
                if not planned:
                    continue
                srcs = kernel[2]
                chosen = [srcs[k] for k in sorted(planned)]
                fields = list(b.var.ty.fields) if isinstance(b.var.ty, relax.TupleType) else [b.var.ty]
                mappings = index_copy_mappings(kernel[1], len(fields))
                if mappings is None or (len(fields) == 1 and is_view(mappings[0])):
                    why = ("a reshape after fusion: a free view, there is no copy to save" if mappings else
                           "FuseOps fused the copy with computation (or its producer into it): nothing to redirect")
                    self._refuse(chosen, b.var, why)
                    continue
                outs, errors = [], []
                for k, (ty, mapping) in enumerate(zip(fields, mappings)):
                    try:
                        outs.append(_Output((b.var, k), ty, srcs, store_maps(mapping), multi=len(fields) > 1,
                                            buffers=tuple(mapping.sources)))
                    except NotOneToOne as err:
                        errors.append(str(err))
                if errors:  # (a multi-output copy is replaced as a whole, or not at all)
                    self._refuse(chosen, b.var, errors[0])
                    continue
                plan.outputs[b.var] = outs
                for s in chosen:
                    for out in outs:
                        mine = [box for box in out.boxes if srcs[box.source].same_as(s)]
                        if mine:
                            wanted.setdefault(s, []).append((out, mine))
        self.bound = bound
        for s, targets in wanted.items():
            stores = self._check_source(s, targets, bound, uses)
            if stores:
                plan.stores[s] = stores
        order = {v: k for k, v in enumerate(bound)}
        while True:
            self._settle(plan)
            if self._build_all(plan, order):
                return plan

    def _build_all(self, plan: _FunctionPlan, order) -> bool:
        """Build every redirected producer (in binding order: a destination an earlier producer
        allocates is updated in place by the later ones); drop the first that cannot be built
        and return False, else True."""
        allocated = set()
        for s in sorted(plan.stores, key=order.get):
            stores = sorted(plan.stores[s], key=lambda t: t.out.key not in allocated)
            key = (s, tuple((t.out.key, t.out.key in allocated) for t in stores))
            if key not in self.built:
                self.built[key] = self._build(s, stores)
            got = self.built[key]
            if isinstance(got, NotRewritable):
                self._drop(plan, {s}, stores[0].out.key[0], str(got))
                return False
            plan.stores[s] = stores
            allocated.update(t.out.key for t in stores)
        return True

    def _build(self, s, stores: List[_Store]):
        """The producer of ``s`` storing into ``stores``' destinations (in that order), or the
        :class:`NotRewritable` that says why not."""
        func = self.mod[self.bound[s].args[0]]
        names = [self._name(t.out) for t in stores]
        try:
            if len(stores) == 1 and stores[0].region.whole:
                forms = [redirect_output(func, _shape(stores[0].out.ty), stores[0].region.index, names[0])]
            else:
                forms = [redirect_output_parts(func, [(_shape(t.out.ty), t.region.index,
                                                       None if t.region.whole else t.region.contains, n)
                                                      for t, n in zip(stores, names)])]
            return best_schedulable(func, forms, self.target)
        except NotRewritable as err:
            return err

    def _check_source(self, s, targets, bound, uses) -> Optional[List[_Store]]:
        """The stores of ``s``'s producer into the pieces that read it, or None (logged)."""
        dests = [out.key[0] for out, _ in targets]
        value = bound.get(s)
        if not isinstance(s, relax.DataflowVar) or self._producer(value) is None:
            self._refuse([s], dests[0], "not produced by a kernel of this function that writes its output "
                         "through buffer stores")
            return None
        readers = {out.key[0] for out, _ in targets}
        if uses[s] != sum(list(srcs_of(bound[d])).count(s) for d in readers):
            self._refuse([s], dests[0], "read elsewhere too after fusion: it keeps its own buffer "
                         "(one store layout per tensor)")
            return None
        stores = []
        for out, mine in targets:
            if len(mine) != 1:
                self._refuse([s], out.key[0], f"{s.name} is read by {len(mine)} pieces of the copy, not one")
                return None
            try:
                stores.append(_Store(s, out, mine[0].inverse_onto(s.ty.shape)))
            except NotOneToOne as err:
                self._refuse([s], out.key[0], str(err))
                return None
        for i, a in enumerate(stores):
            for b in stores[i + 1:]:
                if a.region.overlaps(b.region):
                    self._refuse([s], b.out.key[0], f"two copies read overlapping parts of {s.name}: "
                                 "one element cannot have two homes")
                    return None
        return stores

    def _settle(self, plan: _FunctionPlan):
        """Drop stores until every destination keeps at most one piece as a copy (a split's
        outputs: none, and all of them or none are stored), and until no redirection adds a
        kernel to the build."""
        changed = True
        while changed:
            changed = False
            for dest, outs in plan.outputs.items():
                stored = set().union(*[plan.stored(out) for out in outs]) if outs else set()
                left = [box for out in outs for box in out.boxes if out.srcs[box.source] not in stored]
                multi = any(out.multi for out in outs)
                if stored and len(left) > (0 if multi else 1):
                    why = (f"{len(left)} pieces of the multi-output copy would stay: it is replaced only as "
                           "a whole" if multi else f"{len(left)} pieces would stay copies, in as many kernels "
                           "where stock runs one")
                    self._drop(plan, stored, dest, why)
                    changed = True
            redirected = Counter(self._gv(s) for s in plan.stores)
            for s, stores in list(plan.stores.items()):
                gv = self._gv(s)
                shared = self.calls[gv] - redirected[gv]
                copy_stays = any(out.srcs[box.source] not in plan.stored(out)
                                 for out in {id(t.out): t.out for t in stores}.values() for box in out.boxes)
                if shared > 0 and copy_stays:
                    self._drop(plan, {s}, stores[0].out.key[0],
                               f"its kernel {gv.name_hint} has {shared} other call(s) that stay and the copy stays "
                               "too: one more kernel in the build, for the traffic of one piece")
                    changed = True
                    break

    def _drop(self, plan, sources, dest, why):
        for s in sources:
            if s in plan.stores:
                del plan.stores[s]
                self._log(s, dest, False, why)

    def _gv(self, s):
        return self.bound[s].args[0]

    def _plan_updates(self, func, uses):
        """{rows var: (the update's var, its call, store index, index params)} for in-place
        updates the plan marked, whose rows come from a kernel of ours and are read nowhere else."""
        bound, plan = {}, {}
        for block in func.body.blocks:
            for b in block.bindings:
                bound[b.var] = b.value
                call = b.value
                if not (isinstance(call, relax.Call) and call.op.same_as(CALL_TIR_INPLACE)):
                    continue
                update = self.mod[call.args[0]]
                if not marks_rows(update):
                    continue
                rows = call.args[1].fields[0]
                found = indexed_copy(update) if isinstance(update, tirx.PrimFunc) else None
                if found is None or list(call.attrs.inplace_indices) != [len(call.args[1].fields) - 1]:
                    self._refuse([rows], b.var, "after fusion the update is not one indexed copy of its rows")
                    continue
                if not (isinstance(rows, relax.DataflowVar) and self._producer(bound.get(rows)) is not None):
                    self._refuse([rows], b.var, "the rows are not produced by a kernel of this function")
                    continue
                if uses[rows] != 1:
                    self._refuse([rows], b.var, "read elsewhere too: it keeps its own buffer (one store layout "
                                 "per tensor)")
                    continue
                plan[rows] = (b.var, call, *found)
        return plan

    def _producer(self, value):
        kernel = call_tir_kernel(self.mod, value)
        if kernel is None or not isinstance(value.ty, relax.TensorType) or not _stores_its_output(kernel[1]):
            return None
        return kernel[1]

    # -- rewrite -------------------------------------------------------------------------------
    def visit_var_binding_(self, binding):
        if binding.var in self.updates and self._defer_producer(binding):
            return
        if binding.var in self.pending:
            gv, args, update = self.pending.pop(binding.var)
            fields = list(update.args[1].fields)
            extra = [self.visit_expr(a) for a in fields[1:]]  # index tensors, then the destination
            self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(
                relax.call_tir_inplace(gv, args + extra, [len(args) + len(extra) - 1], out_ty=binding.var.ty))))
            return
        if binding.var in self.plan.stores:
            self._emit_producer(binding, self.plan.stores[binding.var])
            return
        outs = self.plan.outputs.get(binding.var, [])
        if outs and outs[0].multi and all(out.key in self.current for out in outs):
            parts = [self.current[out.key] for out in outs]  # every part stored (``_settle``)
            self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(relax.Tuple(parts))))
            return
        if outs and not outs[0].multi and outs[0].key in self.current:
            self._emit_rest(binding, outs[0])
            return
        super().visit_var_binding_(binding)

    def _emit_producer(self, binding, stores: List[_Store]):
        """Emit the producer of ``binding`` storing into its destinations (built by
        ``_build_all``, in its order: destinations that exist are updated in place)."""
        call = binding.value
        existing = [self.current[t.out.key] for t in stores if t.out.key in self.current]
        key = (binding.var, tuple((t.out.key, t.out.key in self.current) for t in stores))
        into = self.built[key]
        names = [self._name(t.out) for t in stores]
        probe = [tirx.Var(f"i{k}", "int64") for k in range(len(binding.var.ty.shape))]
        for t, n in zip(stores, names):
            where = "" if t.region.whole else f" for {list(t.region.lo)} <= i <= {list(t.region.hi)}"
            self._log(binding.var, t.out.key[0], True, f"producer stores each element i{where} at "
                      f"{n}[{', '.join(map(str, t.region.index(probe)))}]")
        gv = self.builder_.add_func(into, f"{call.args[0].name_hint}_into_{names[0]}")
        args = [self.visit_expr(a) for a in call.args[1].fields]
        tys = [t.out.ty for t in stores]
        out_ty = tys[0] if len(tys) == 1 else tys
        if existing:
            at = [len(args) + k for k in range(len(existing))] + [-1] * (len(stores) - len(existing))
            new = relax.call_tir_inplace(gv, args + existing, at, out_ty=out_ty)
        else:
            new = relax.call_tir(gv, args, out_ty=out_ty)
        result = self.builder_.emit(new, name_hint=f"{names[0]}_part")
        for k, t in enumerate(stores):
            part = result if len(stores) == 1 else self.builder_.emit(relax.TupleGetItem(result, k),
                                                                      name_hint=f"{self._name(t.out)}_part")
            self.current[t.out.key] = part
        self.redirected.add(binding.var)

    @staticmethod
    def _name(out: _Output) -> str:
        var, k = out.key
        return var.name if not out.multi else f"{var.name}_{k}"

    def _defer_producer(self, binding) -> bool:
        """Rows of an in-place update: their producer will store through the update's index,
        emitted in the update's place (where the index tensors and the destination exist)."""
        update_var, update, store_index, index_params = self.updates[binding.var]
        call = binding.value
        func = self.mod[call.args[0]]
        dest = update_var.ty
        try:
            into = best_schedulable(func, [redirect_output(
                func, _shape(dest), store_index, update_var.name, extra_params=index_params)],
                self.target)
        except NotRewritable as err:
            self._log(binding.var, update_var, False, str(err))
            return False
        self._log(binding.var, update_var, True, "producer stores straight into the updated tensor")
        gv = self.builder_.add_func(into, f"{call.args[0].name_hint}_into_{update_var.name}")
        self.pending[update_var] = (gv, [self.visit_expr(a) for a in call.args[1].fields], update)
        return True

    def _emit_rest(self, binding, out: _Output):
        """Copy the pieces whose sources kept their own buffers into place (one kernel at most:
        see ``_settle``); bind the destination var."""
        cur = self.current[out.key]
        shape = _shape(binding.var.ty)
        for box in out.boxes:
            src = out.srcs[box.source]
            if src in self.redirected:
                continue
            if not isinstance(src, relax.DataflowVar):
                # (a parameter or a constant: a bound weight, e.g. a ViT's class token, has no name)
                logger.info("%s: the elements of %s are copied into it (a grow-by-concat cache copies its past "
                            "rows; a static cache updated in place, VirtualTensorize(inplace=...), does not)",
                            binding.var.name, src.name if isinstance(src, relax.Var) else "a constant")
            # A gathered piece reads index tensors of the copy in its index (take: src[idx[u]]):
            # its kernel takes them as inputs too, after its data source (found by the fuzzer:
            # tests/test_model_fuzz.py, a take of a split half concatenated with a relu).
            buffers = out.buffers
            used = [box.source] + [j for j, buf in enumerate(buffers)
                                   if j != box.source and _reads(box.src_index, buf)]
            copy = Mapping(box.extents, str(src.ty.dtype), [buffers[j] for j in used], box.vars,
                           [Piece(0, tuple(box.src_index))]).to_prim_func("vtc_copy_into")
            into = redirect_output(copy, shape, lambda u, box=box: _substitute_all(box.out_index, box.vars, u),
                                   binding.var.name).with_attr(COPY_INTO_ATTR, True)
            gv = self.builder_.add_func(into, "vtc_copy_into")
            update = relax.call_tir_inplace(gv, [self.visit_expr(out.srcs[j]) for j in used] + [cur], [len(used)],
                                            out_ty=binding.var.ty)
            cur = self.builder_.emit(update, name_hint=f"{binding.var.name}_part")
        self.builder_.emit_normalized(relax.VarBinding(binding.var, cur))

    def _refuse(self, sources, dest, reason):
        for s in sources:
            self._log(s, dest, False, reason)

    def _log(self, var, dest, take, reason):
        self.report.append({"tensor": var.name, "consumer": dest.name, "virtual": take,
                            "reason": reason, "side": "store"})
        logger.info("%s -> %s (store side): %s (%s)", var.name, dest.name,
                    "virtual" if take else "physical", reason)


def srcs_of(value) -> list:
    """The tensor arguments of a ``call_tir``."""
    return list(value.args[1].fields) if isinstance(value, relax.Call) and len(value.args) > 1 \
        and isinstance(value.args[1], relax.Tuple) else []


def _shape(ty) -> list:
    return [int(d) for d in ty.shape]


def VirtualTensorizeStores(target=None, report: Optional[list] = None) -> tvm.transform.Pass:
    """Store-side virtual tensors: the store edges the plan chose (producers store through the
    inverse of a one-to-one copy, or into the rows of an in-place update). Place it after
    ``FuseTIR``: it rewrites the fused producer kernels. The ``"vtc"`` pipeline does this for
    you; a module that did not go through :func:`vtc_tvm.VirtualTensorize` has no plan, and is
    left as it is."""

    @tvm.transform.module_pass(opt_level=0, name="VirtualTensorizeStores")
    def _stores(mod, _ctx):
        tgt = tvm.target.Target(target) if target is not None else tvm.target.Target.current(allow_none=True)
        mod = _StoreRewriter(mod, tgt, report if report is not None else []).transform()
        return relax.transform.DeadCodeElimination()(mod)

    return _stores
