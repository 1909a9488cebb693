"""Store side: producers write straight into the concat or in-place update that consumes them.

Pattern (after ``FuseOps``/``FuseTIR``, where producers are final kernels)::

    a = call_tir(producer_a, ...)            # used only by the concat
    b = call_tir(producer_b, ...)            # used only by the concat
    c = call_tir(concatenate, (a, x, b))     # a pure index copy with one offset slice per input

Rewrite: ``a`` and ``b`` become virtual views of ``c``; their producers store into their slice::

    c0 = call_tir(producer_a_into, ..., out_ty=c)                      # allocates c
    c1 = call_tir_inplace(producer_b_into, (..., c0), [k], out_ty=c)
    c  = call_tir_inplace(copy_into, (x, c1), [1], out_ty=c)           # inputs without a producer

The same for the in-place updates of :mod:`vtc_tvm.inplace` (a KV-cache row written at positions
read from an index tensor)::

    rows = call_tir(k_proj_rope, ...)                                   # used only by the update
    cache = call_tir_inplace(scatter_nd_inplace, (rows, idx, cache), [2])
    ->
    cache = call_tir_inplace(k_proj_rope_into_cache, (..., idx, cache), [n])

A tensor has one physical home: an input used anywhere else (a second concat, another consumer,
a function output) keeps its own buffer and is copied, exactly like stock TVM does.
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
from .mapping import Mapping, _substitute
from .rewrite import NotRewritable, best_schedulable, offset_index, redirect_output

logger = logging.getLogger("vtc_tvm")
CALL_TIR_INPLACE = Op.get("relax.call_tir_inplace")


def concat_offsets(mapping: Mapping) -> Optional[list]:
    """Per source, the constant offset of its slice in the output, if ``mapping`` is a concat
    (every piece reads one distinct source at ``v - offset``, and each source lies wholly inside
    the output: its producer writes all of it there); else None. A slice reads ``v + offset``
    too, but its source is larger than its output: redirected, its producer would write out of
    bounds."""
    if len(mapping.pieces) != len(mapping.sources):
        return None
    ana = mapping.analyzer()
    offsets = [None] * len(mapping.sources)
    for p in mapping.pieces:
        if p.source is None or offsets[p.source] is not None or len(p.indices) != len(mapping.vars):
            return None  # (a reshape from a 0-d tensor is not a slice of the output)
        shift = [ana.simplify(v - i) for v, i in zip(mapping.vars, p.indices)]
        if not all(isinstance(s, tirx.IntImm) for s in shift):
            return None
        offsets[p.source] = [int(s.value) for s in shift]
        extents = mapping.source_shape(p.source)
        if not all(isinstance(n, int) and isinstance(d, int) and 0 <= o and o + n <= d
                   for o, n, d in zip(offsets[p.source], extents, mapping.shape)):
            return None
    return offsets


def indexed_copy(func: tirx.PrimFunc):
    """``(store_index, index params)`` if ``func`` is one block ``out[f(v)] = src[v]`` over the
    whole of ``src`` (its first parameter) into ``out`` (its last), reading nothing but index
    tensors (the parameters between) in ``f``; else None. ``store_index`` maps indices of ``src``
    to ``f`` of them: what a producer of ``src`` can store through."""
    params = list(func.params)
    blocks = _non_root_blocks(func)
    if len(params) < 2 or len(blocks) != 1 or not all(tirx.is_buffer_var(p) for p in params):
        return None
    block = blocks[0]
    src, out, ivs = params[0], params[-1], [iv.var for iv in block.iter_vars]
    store, value = block.body, getattr(block.body, "value", None)
    if not (isinstance(store, tirx.BufferStore) and store.buffer.same_as(out) and isinstance(value, TensorLoad)
            and value.source.same_as(src) and len(ivs) == len(src.shape)
            and all(tvm.sym.Analyzer().can_prove_equal(iv.dom.extent, n) and _is_zero(iv.dom.min)
                    for iv, n in zip(block.iter_vars, src.shape))
            # the load reads src[v] (an index of a unit axis may have been simplified to 0)
            and all(i.same_as(iv.var) or (_is_zero(i) and _is_one(iv.dom.extent))
                    for i, iv in zip(value.indices, block.iter_vars))):
        return None
    if block.alloc_buffers or (block.init is not None) or _reads_other_than(store.indices, params[1:-1]) \
            or not _unpredicated(func):
        return None

    def store_index(idx):
        return [_substitute(e, dict(zip(ivs, idx))) for e in store.indices]

    return store_index, params[1:-1]


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


@mutator
class _StoreRewriter(PyExprMutator):
    def __init__(self, mod, target, report):
        super().__init__(mod)
        self.mod = mod
        self.target = target
        self.report = report

    def transform(self):
        for gv, func in self.mod.functions_items():
            if isinstance(func, relax.Function) and not (func.attrs and func.attrs.get("Primitive")):
                uses = _uses(func)
                # The load side's plan may have made a concat's inputs views of its sources
                # instead: VirtualTensorize records that in "vtc.store_side" (name -> allowed).
                self.allowed = dict((self.mod.attrs or {}).get("vtc.store_side", {}) or {})
                self.plan = self._plan(func, uses)
                self.current, self.redirected = {}, set()
                self.updates, self.pending = self._plan_updates(func, uses), {}
                if self.plan or self.updates:
                    self.builder_.update_func(gv, self.visit_expr(func))
        return self.builder_.get()

    # -- pattern -------------------------------------------------------------------------------
    def _plan(self, func, uses):
        """{concat var: (its inputs, their offsets, {input produced by a kernel of ours and read
        only by this concat: its offsets})}."""
        bound, plan = {}, {}
        for block in func.body.blocks:
            if not isinstance(block, relax.DataflowBlock):
                continue
            for b in block.bindings:
                bound[b.var] = b.value
                offsets = self._concat(b.value)
                if offsets is None or not bool(self.allowed.get(b.var.name, True)):
                    continue
                srcs = list(b.value.args[1].fields)
                producers = {}
                for s, off in zip(srcs, offsets):
                    if isinstance(s, relax.DataflowVar) and uses[s] == 1 and srcs.count(s) == 1 \
                            and self._producer(bound.get(s)) is not None:
                        producers[s] = off
                if producers:
                    plan[b.var] = (srcs, offsets, producers)
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
                if isinstance(rows, relax.DataflowVar) and uses[rows] == 1 \
                        and self._producer(bound.get(rows)) is not None:
                    plan[rows] = (b.var, call, *found)
        return plan

    def _concat(self, value):
        kernel = call_tir_kernel(self.mod, value)
        mapping = index_copy_mapping(kernel[1]) if kernel is not None else None
        return None if mapping is None else concat_offsets(mapping)

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
        for concat, (srcs, offsets, producers) in self.plan.items():
            if binding.var in producers and self._emit_producer(binding, concat, producers[binding.var]):
                return
            if binding.var.same_as(concat) and concat in self.current:
                self._emit_rest(binding, srcs, offsets, producers)
                return
        super().visit_var_binding_(binding)

    def _emit_producer(self, binding, concat, offsets) -> bool:
        call = binding.value
        func = self.mod[call.args[0]]
        try:
            into = best_schedulable(func, [redirect_output(
                func, [int(d) for d in concat.ty.shape], offset_index(offsets), concat.name)], self.target)
        except NotRewritable as err:
            self._log(binding.var, concat, False, str(err))
            return False
        self._log(binding.var, concat, True, f"producer stores into its slice at {offsets}")
        gv = self.builder_.add_func(into, f"{call.args[0].name_hint}_into_{concat.name}")
        args = [self.visit_expr(a) for a in call.args[1].fields]
        prev = self.current.get(concat)
        if prev is None:
            new = relax.call_tir(gv, args, out_ty=concat.ty)
        else:
            new = relax.call_tir_inplace(gv, args + [prev], [len(args)], out_ty=concat.ty)
        self.current[concat] = self.builder_.emit(new, name_hint=f"{concat.name}_part")
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

    def _emit_rest(self, binding, srcs, offsets, producers):
        """Copy the inputs that kept their own buffers into place; bind the concat var."""
        cur = self.current[binding.var]
        shape = [int(d) for d in binding.var.ty.shape]
        for s, off in zip(srcs, offsets):
            if s in self.redirected:
                continue
            copy = Mapping.identity([int(d) for d in s.ty.shape], str(s.ty.dtype)).to_prim_func("vtc_copy_into")
            gv = self.builder_.add_func(redirect_output(copy, shape, offset_index(off), binding.var.name),
                                        "vtc_copy_into")
            cur = self.builder_.emit(relax.call_tir_inplace(gv, [self.visit_expr(s), cur], [1],
                                                            out_ty=binding.var.ty), name_hint=f"{binding.var.name}_part")
        self.builder_.emit_normalized(relax.VarBinding(binding.var, cur))

    def _log(self, var, concat, take, reason):
        self.report.append({"tensor": var.name, "consumer": concat.name, "virtual": take,
                            "reason": reason, "side": "store"})
        logger.info("%s -> %s (store side): %s (%s)", var.name, concat.name,
                    "virtual" if take else "physical", reason)


def VirtualTensorizeStores(target=None, report: Optional[list] = None) -> tvm.transform.Pass:
    """Store-side virtual tensors (concat destinations). Place it after ``FuseTIR``: it
    rewrites the fused producer kernels. The ``"vtc"`` pipeline does this for you."""

    @tvm.transform.module_pass(opt_level=0, name="VirtualTensorizeStores")
    def _stores(mod, _ctx):
        tgt = tvm.target.Target(target) if target is not None else tvm.target.Target.current(allow_none=True)
        mod = _StoreRewriter(mod, tgt, report if report is not None else []).transform()
        return relax.transform.DeadCodeElimination()(mod)

    return _stores
