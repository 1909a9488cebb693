"""Store side: producers write straight into the copy or in-place update that consumes them.

Pattern (after ``FuseOps``/``FuseTIR``, where producers are final kernels)::

    a = call_tir(producer_a, ...)            # used only by the copy
    b = call_tir(producer_b, ...)            # used only by the copy
    c = call_tir(copy, (a, x, b))            # a pure index copy: c[v] = a[G_a(v)] where ..., etc.

When each piece of the copy is one-to-one onto its source (a concat slice, a permute, a
head-major ``reshape o permute``, a channel shuffle after a concat: :mod:`vtc_tvm.inverse`
proves it and computes ``H = G^-1``), ``a`` and ``b`` become views of ``c``: their producers
store element ``i`` at ``c[H(i)]``::

    c0 = call_tir(producer_a_into, ..., out_ty=c)                      # allocates c
    c1 = call_tir_inplace(producer_b_into, (..., c0), [k], out_ty=c)
    c  = call_tir_inplace(copy_into, (x, c1), [1], out_ty=c)           # the piece without a producer

The same for the in-place updates of :mod:`vtc_tvm.inplace` (a KV-cache row written at positions
read from an index tensor, or read through a mapping such as the head-major transpose of V)::

    rows = call_tir(k_proj_rope, ...)                                   # used only by the update
    cache = call_tir_inplace(scatter_nd_inplace, (rows, idx, cache), [2])
    ->
    cache = call_tir_inplace(k_proj_rope_into_cache, (..., idx, cache), [n])

A tensor has one physical home (one store layout): an input used anywhere else (a second copy,
another consumer, a function output) keeps its own buffer and is copied, exactly like stock TVM
does (:func:`select_store_edges`, which a global plan can override through the PrimFunc attribute
``vtc.store_side``). Every refusal is logged with its reason. On GPU targets a redirected
producer must keep its DLight rule (:func:`vtc_tvm.rewrite.best_schedulable`). At most one piece
stays a copy (more would launch more kernels than stock's one copy).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Optional

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.ir import Op, TensorLoad
from tvm.relax.expr_functor import PyExprMutator, mutator

from .analysis import _non_root_blocks, call_tir_kernel, index_copy_mapping
from .copy_schedule import COPY_INTO_ATTR
from .inverse import NotOneToOne, piece_box, store_maps
from .mapping import Mapping, Piece, _substitute, row_major_strides
from .rewrite import NotRewritable, best_schedulable, redirect_output

logger = logging.getLogger("vtc_tvm")
CALL_TIR_INPLACE = Op.get("relax.call_tir_inplace")
# A PrimFunc attribute of the global plan: 0 forbids redirecting a producer into this kernel's
# output (on the copy or update kernel) or redirecting this producer (on the producer).
STORE_SIDE_ATTR = "vtc.store_side"


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
    func = _inline_into_last(func)
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


def select_store_edges(dest: tirx.PrimFunc, srcs, producers: dict, uses) -> tuple:
    """Which inputs of the copy or update kernel ``dest`` (called on ``srcs``) have their
    producer (``producers``: input var -> producer PrimFunc) store into its output: ``(chosen
    vars, {refused var: reason})``. The whole selection policy of the store side, so that a
    global plan can replace it; it honours the plan's ``vtc.store_side`` attribute.

    A tensor has one physical home (one store layout): an input read anywhere else keeps its
    own buffer, and its other readers read it there (the load side)."""
    if _forbidden(dest):
        return [], {s: f"the plan keeps the inputs of this kernel physical ({STORE_SIDE_ATTR} = 0)"
                    for s in producers}
    chosen, refused = [], {}
    for s, func in producers.items():
        if _forbidden(func):
            refused[s] = f"the plan keeps this producer's own layout ({STORE_SIDE_ATTR} = 0)"
        elif uses[s] != 1 or srcs.count(s) != 1:
            refused[s] = "read elsewhere too: it keeps its own buffer (one store layout per tensor)"
        else:
            chosen.append(s)
    return chosen, refused


def _forbidden(func) -> bool:
    value = (func.attrs or {}).get(STORE_SIDE_ATTR) if isinstance(func, tirx.PrimFunc) else None
    return value is not None and not int(value)


def _is_view(mapping: Mapping) -> bool:
    """Whether ``mapping`` reads its one source in row-major order (a reshape)."""
    if len(mapping.pieces) != 1 or len(mapping.sources) != 1:
        return False
    piece, ana = mapping.pieces[0], mapping.analyzer()
    src_shape = mapping.source_shape(0)
    zero = tirx.IntImm("int64", 0)
    flat = lambda idx, shape: sum((i * s for i, s in zip(idx, row_major_strides(list(shape)))), zero)
    return len(piece.indices) == len(src_shape) and ana.can_prove_equal(
        flat(mapping.vars, mapping.shape), flat(piece.indices, src_shape))


def _substitute_all(exprs, index_vars, values) -> list:
    return [_substitute(e, dict(zip(index_vars, values))) for e in exprs]


def _inline_into_last(func: tirx.PrimFunc) -> Optional[tirx.PrimFunc]:
    """``func`` with every block before the last inlined (a copy FuseOps fused into an update
    becomes the update's load), or None if one cannot be."""
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
        # The load side's plan may have made a concat's inputs views of its sources instead:
        # VirtualTensorize records that in the module attribute (name -> allowed).
        self.allowed = dict((self.mod.attrs or {}).get(STORE_SIDE_ATTR, {}) or {})
        for gv, func in self.mod.functions_items():
            if isinstance(func, relax.Function) and not (func.attrs and func.attrs.get("Primitive")):
                uses = _uses(func)
                self.plan = self._plan(func, uses)
                self.current, self.redirected = {}, set()
                self.updates, self.pending = self._plan_updates(func, uses), {}
                if self.plan or self.updates:
                    self.builder_.update_func(gv, self.visit_expr(func))
        return self.builder_.get()

    # -- pattern -------------------------------------------------------------------------------
    def _plan(self, func, uses):
        """{copy var: (its inputs, the boxes of its pieces, {input whose producer stores
        through the inverse of its piece: the store index})}."""
        bound, plan = {}, {}
        for block in func.body.blocks:
            if not isinstance(block, relax.DataflowBlock):
                continue
            for b in block.bindings:
                bound[b.var] = b.value
                kernel = call_tir_kernel(self.mod, b.value)
                mapping = index_copy_mapping(kernel[1]) if kernel is not None else None
                srcs = list(b.value.args[1].fields) if mapping is not None else []
                if mapping is None or len(mapping.sources) != len(srcs) or _is_view(mapping):
                    continue  # (a reshape becomes a free view in the stock pipeline)
                if not bool(self.allowed.get(b.var.name, True)):
                    continue  # the plan keeps this destination's producers where they are
                producers = {s: self.mod[bound[s].args[0]] for s in srcs
                             if isinstance(s, relax.DataflowVar) and self._producer(bound.get(s)) is not None}
                if not producers:
                    continue
                chosen, refused = select_store_edges(kernel[1], srcs, producers, uses)
                for s, reason in refused.items():
                    self._log(s, b.var, False, reason)
                if not chosen:
                    continue
                try:
                    boxes = store_maps(mapping)
                except NotOneToOne as err:
                    for s in chosen:
                        self._log(s, b.var, False, str(err))
                    continue
                stores = {}
                for s in chosen:
                    mine = [box for box in boxes if box.source == srcs.index(s)]
                    try:
                        if len(mine) != 1:
                            raise NotOneToOne(f"{s.name} is read by {len(mine)} pieces of the copy, not one")
                        stores[s] = mine[0].inverse(mapping.source_shape(mine[0].source))
                    except NotOneToOne as err:
                        self._log(s, b.var, False, str(err))
                left = [box for box in boxes if srcs[box.source] not in stores]
                if len(left) > 1:  # never more kernels than stock: the rest is one copy there
                    for s in stores:
                        self._log(s, b.var, False, f"{len(left)} pieces would stay copies, "
                                  "in as many kernels where stock runs one")
                elif stores:
                    plan[b.var] = (srcs, boxes, stores, mapping.sources)
        return plan

    def _plan_updates(self, func, uses):
        """{rows var: (the update's var, its call, store index, index params)} for in-place
        updates whose rows come from a kernel of ours and are read nowhere else."""
        bound, plan = {}, {}
        for block in func.body.blocks:
            for b in block.bindings:
                bound[b.var] = b.value
                call = b.value
                if not (isinstance(call, relax.Call) and call.op.same_as(CALL_TIR_INPLACE)):
                    continue
                update = self.mod[call.args[0]]
                found = indexed_copy(update) if isinstance(update, tirx.PrimFunc) else None
                rows = call.args[1].fields[0]
                if found is None or list(call.attrs.inplace_indices) != [len(call.args[1].fields) - 1]:
                    continue
                if not (isinstance(rows, relax.DataflowVar) and self._producer(bound.get(rows)) is not None):
                    continue
                fields = list(call.args[1].fields)
                chosen, refused = select_store_edges(update, fields, {rows: self.mod[bound[rows].args[0]]}, uses)
                for s, reason in refused.items():
                    self._log(s, b.var, False, reason)
                if chosen:
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
        for dest, (srcs, boxes, stores, buffers) in self.plan.items():
            if binding.var in stores and self._emit_producer(binding, dest, stores[binding.var]):
                return
            if binding.var.same_as(dest) and dest in self.current:
                self._emit_rest(binding, srcs, boxes, buffers)
                return
        super().visit_var_binding_(binding)

    def _emit_producer(self, binding, dest, store_index) -> bool:
        call = binding.value
        func = self.mod[call.args[0]]
        try:
            into = best_schedulable(func, [redirect_output(
                func, [int(d) for d in dest.ty.shape], store_index, dest.name)], self.target)
        except NotRewritable as err:
            self._log(binding.var, dest, False, str(err))
            return False
        where = store_index([tirx.Var(f"i{k}", "int64") for k in range(len(binding.var.ty.shape))])
        self._log(binding.var, dest, True,
                  f"producer stores each element i at {dest.name}[{', '.join(map(str, where))}]")
        gv = self.builder_.add_func(into, f"{call.args[0].name_hint}_into_{dest.name}")
        args = [self.visit_expr(a) for a in call.args[1].fields]
        prev = self.current.get(dest)
        if prev is None:
            new = relax.call_tir(gv, args, out_ty=dest.ty)
        else:
            new = relax.call_tir_inplace(gv, args + [prev], [len(args)], out_ty=dest.ty)
        self.current[dest] = self.builder_.emit(new, name_hint=f"{dest.name}_part")
        self.redirected.add(binding.var)
        return True

    def _defer_producer(self, binding) -> bool:
        """Rows of an in-place update: their producer will store through the update's index,
        emitted in the update's place (where the index tensors and the destination exist)."""
        update_var, update, store_index, index_params = self.updates[binding.var]
        call = binding.value
        func = self.mod[call.args[0]]
        dest = update_var.ty
        try:
            into = best_schedulable(func, [redirect_output(
                func, [int(d) for d in dest.shape], store_index, update_var.name, extra_params=index_params)],
                self.target)
        except NotRewritable as err:
            self._log(binding.var, update_var, False, str(err))
            return False
        self._log(binding.var, update_var, True, "producer stores straight into the updated tensor")
        gv = self.builder_.add_func(into, f"{call.args[0].name_hint}_into_{update_var.name}")
        self.pending[update_var] = (gv, [self.visit_expr(a) for a in call.args[1].fields], update)
        return True

    def _emit_rest(self, binding, srcs, boxes, buffers):
        """Copy the pieces whose sources kept their own buffers into place (one kernel at most:
        see ``_plan``); bind the destination var. ``buffers``: the copy mapping's source buffers
        (``srcs[j]`` is read through ``buffers[j]``)."""
        cur = self.current[binding.var]
        shape = [int(d) for d in binding.var.ty.shape]
        for box in boxes:
            src = srcs[box.source]
            if src in self.redirected:
                continue
            # A gathered piece reads index tensors of the copy in its index (take: src[idx[u]]):
            # its kernel takes them as inputs too, after its data source (found by the fuzzer:
            # tests/test_model_fuzz.py, a take of a split half concatenated with a relu).
            used = [box.source] + [j for j, buf in enumerate(buffers)
                                   if j != box.source and _reads(box.src_index, buf)]
            copy = Mapping(box.extents, str(src.ty.dtype), [buffers[j] for j in used], box.vars,
                           [Piece(0, tuple(box.src_index))]).to_prim_func("vtc_copy_into")
            into = redirect_output(copy, shape, lambda u, box=box: _substitute_all(box.out_index, box.vars, u),
                                   binding.var.name).with_attr(COPY_INTO_ATTR, True)
            gv = self.builder_.add_func(into, "vtc_copy_into")
            update = relax.call_tir_inplace(gv, [self.visit_expr(srcs[j]) for j in used] + [cur], [len(used)],
                                            out_ty=binding.var.ty)
            cur = self.builder_.emit(update, name_hint=f"{binding.var.name}_part")
        self.builder_.emit_normalized(relax.VarBinding(binding.var, cur))

    def _log(self, var, concat, take, reason):
        self.report.append({"tensor": var.name, "consumer": concat.name, "virtual": take,
                            "reason": reason, "side": "store"})
        logger.info("%s -> %s (store side): %s (%s)", var.name, concat.name,
                    "virtual" if take else "physical", reason)


def VirtualTensorizeStores(target=None, report: Optional[list] = None) -> tvm.transform.Pass:
    """Store-side virtual tensors (producers store through the inverse of a one-to-one copy, or
    into the rows of an in-place update). Place it after ``FuseTIR``: it rewrites the fused
    producer kernels. The ``"vtc"`` pipeline does this for you."""

    @tvm.transform.module_pass(opt_level=0, name="VirtualTensorizeStores")
    def _stores(mod, _ctx):
        tgt = tvm.target.Target(target) if target is not None else tvm.target.Target.current(allow_none=True)
        mod = _StoreRewriter(mod, tgt, report if report is not None else []).transform()
        return relax.transform.DeadCodeElimination()(mod)

    return _stores
