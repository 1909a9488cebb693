"""Store side: producers write straight into the concat that consumes them.

Pattern (after ``FuseOps``/``FuseTIR``, where producers are final kernels)::

    a = call_tir(producer_a, ...)            # used only by the concat
    b = call_tir(producer_b, ...)            # used only by the concat
    c = call_tir(concatenate, (a, x, b))     # a pure index copy with one offset slice per input

Rewrite: ``a`` and ``b`` become virtual views of ``c``; their producers store into their slice::

    c0 = call_tir(producer_a_into, ..., out_ty=c)                      # allocates c
    c1 = call_tir_inplace(producer_b_into, (..., c0), [k], out_ty=c)
    c  = call_tir_inplace(copy_into, (x, c1), [1], out_ty=c)           # inputs without a producer

A tensor has one physical home: an input used anywhere else (a second concat, another consumer,
a function output) keeps its own buffer and is copied, exactly like stock TVM does.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Optional

import tvm
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from .analysis import call_tir_kernel, index_copy_mapping
from .mapping import Mapping
from .rewrite import NotRewritable, best_schedulable, offset_index, redirect_output

logger = logging.getLogger("vtc_tvm")


def concat_offsets(mapping: Mapping) -> Optional[list]:
    """Per source, the constant offset of its slice in the output, if ``mapping`` is a concat
    (every piece reads one distinct source at ``v - offset``); else None."""
    if len(mapping.pieces) != len(mapping.sources):
        return None
    ana = mapping.analyzer()
    offsets = [None] * len(mapping.sources)
    for p in mapping.pieces:
        if p.source is None or offsets[p.source] is not None:
            return None
        shift = [ana.simplify(v - i) for v, i in zip(mapping.vars, p.indices)]
        if not all(isinstance(s, tirx.IntImm) for s in shift):
            return None
        offsets[p.source] = [int(s.value) for s in shift]
    return offsets


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
                self.plan = self._plan(func)
                self.current, self.redirected = {}, set()
                if self.plan:
                    self.builder_.update_func(gv, self.visit_expr(func))
        return self.builder_.get()

    # -- pattern -------------------------------------------------------------------------------
    def _plan(self, func):
        """{concat var: (its inputs, their offsets, {input produced by a kernel of ours and read
        only by this concat: its offsets})}."""
        uses = Counter()
        relax.analysis.post_order_visit(func.body, lambda e: uses.update([e]) if isinstance(e, relax.Var) else None)
        for p in func.params:
            uses[p] += 1  # parameters are never rewritten
        bound, plan = {}, {}
        for block in func.body.blocks:
            if not isinstance(block, relax.DataflowBlock):
                continue
            for b in block.bindings:
                bound[b.var] = b.value
                offsets = self._concat(b.value)
                if offsets is None:
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

    def _concat(self, value):
        kernel = call_tir_kernel(self.mod, value)
        mapping = index_copy_mapping(kernel[1]) if kernel is not None else None
        return None if mapping is None else concat_offsets(mapping)

    def _producer(self, value):
        kernel = call_tir_kernel(self.mod, value)
        return kernel[1] if kernel is not None and isinstance(value.ty, relax.TensorType) else None

    # -- rewrite -------------------------------------------------------------------------------
    def visit_var_binding_(self, binding):
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
