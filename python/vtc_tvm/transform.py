"""The ``VirtualTensorize`` Relax pass.

Pattern: a binding whose value is a data-movement op (a registered rule, or a ``call_tir`` of a
PrimFunc that is a pure index copy) makes its variable a virtual tensor over physical sources;
chains compose into one mapping. Rewrite: every consumer that is (or legalizes to) a
``call_tir`` and that the strategy accepts gets a copy of its PrimFunc that reads the physical
sources through the mapping. Movement ops left without users disappear
(``DeadCodeElimination``); the ones still used (function outputs, opaque or external consumers,
rejected edges) are materialised once, directly from the physical sources.

The result is an ordinary Relax module: ``tvm.compile(mod, target)`` and the default pipelines
compile it unchanged.
"""

from __future__ import annotations

import functools
import logging
from typing import Callable, Dict, List, Optional, Sequence, Union

import tvm
import tvm_ffi
from tvm import relax
from tvm.ir import Op
from tvm.relax.expr_functor import PyExprMutator, mutator

from . import inplace as inplace_updates
from .analysis import call_tir_kernel, contiguity, index_copy_mapping, op_pattern
from .mapping import VirtualTensor
from .rewrite import NotRewritable, best_schedulable, check_schedulable, rewritten_forms
from .rules import Unsupported, get_rule
from .strategy import get_strategy, pins_too_much

logger = logging.getLogger("vtc_tvm")

CALL_TIR = Op.get("relax.call_tir")
# Reshape-like ops stay as they are when materialised: stock TVM turns them into free views.
_VIEW_OPS = {"relax.reshape", "relax.flatten", "relax.squeeze", "relax.expand_dims"}
# Ops whose stock legalization is missing or broken in TVM 0.27: materialise our copy kernel.
_OWN_COPY_OPS = {"relax.nn.pixel_shuffle"}


@mutator
class _VirtualTensorizer(PyExprMutator):
    def __init__(self, mod, strategy, ops, report, target, inplace=(), physical=frozenset(), profiler=None,
                 refused=frozenset()):
        super().__init__(mod)
        self.mod, self.strategy, self.ops, self.report, self.target = mod, strategy, ops, report, target
        self.profiler = profiler
        self.refused = refused  # (virtual tensor, consumer var) edges the memory guard turned down
        self.taken = []  # the edges taken, in program order
        self.inplace = set(inplace)
        # Movement results that stay materialised anyway (found by an earlier round): reading
        # them is cheaper than reading through them, which would keep their sources alive.
        self.physical = physical
        self.movement_vars = set()
        self.virtual: Dict[relax.Var, Union[VirtualTensor, List[VirtualTensor]]] = {}
        self._contiguity = {}  # Mapping -> Contiguity (the key keeps the mapping alive)

    # -- driver --------------------------------------------------------------------------------
    def transform(self) -> tvm.IRModule:
        for gv, func in self.mod.functions_items():
            # Primitive functions are FuseOps groups: their bodies belong to FuseTIR.
            if isinstance(func, relax.Function) and not (func.attrs and func.attrs.get("Primitive")):
                self.virtual, self.rewritten = {}, set()
                self.uses = _use_counts(func)
                self.builder_.update_func(gv, _hoist(self.visit_expr(func), self.rewritten))
        return self.builder_.get()

    def _log(self, var, consumer, take, reason):
        entry = {"tensor": var.name, "consumer": consumer, "virtual": take, "reason": reason}
        self.report.append(entry)
        logger.info("%s -> %s: %s (%s)", var.name, consumer, "virtual" if take else "physical", reason)

    # -- pattern: which bindings are movement ops ---------------------------------------------
    def _movement(self, var, value) -> Optional[Union[VirtualTensor, List[VirtualTensor]]]:
        if isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var):
            parts = self.virtual.get(value.tuple_value)
            return parts[value.index] if isinstance(parts, list) else None
        if not isinstance(value, relax.Call) or not isinstance(value.op, Op):
            return None
        if value.op.same_as(CALL_TIR):
            kernel = call_tir_kernel(self.mod, value)
            mapping = index_copy_mapping(kernel[1]) if kernel is not None else None
            return None if mapping is None else VirtualTensor(mapping, kernel[2])
        name = value.op.name
        rule = get_rule(name)
        if rule is None or (self.ops is not None and name not in self.ops):
            return None
        try:
            return rule(self._with_literal_tuples(value))
        except Unsupported as err:
            self._log(var, name, False, f"{name} left as is: {err}")
            return None

    def _with_literal_tuples(self, call):
        """Arguments bound to tuple literals (e.g. concat's input) as the literal itself."""
        args, changed = [], False
        for a in call.args:
            bound = self.lookup_binding(a) if isinstance(a, relax.Var) else None
            changed |= isinstance(bound, relax.Tuple)
            args.append(bound if isinstance(bound, relax.Tuple) else a)
        if not changed:
            return call
        return self.builder_.normalize(relax.Call(call.op, args, call.attrs, call.ty_args))

    def _composed(self, var, vt):
        """``vt`` (or each part of a split) over physical tensors where possible; None when a
        symbolic dimension could not be learnt from the sources (logged)."""
        parts = vt if isinstance(vt, list) else [vt]
        out = []
        for part in parts:
            try:
                composed = self._compose(part)
                _check_symbols(composed)
            except Unsupported:
                composed = part  # read through the direct sources instead
                try:
                    _check_symbols(part)
                except Unsupported as err:
                    self._log(var, _op_name(self.lookup_binding(var)) or "movement", False, f"left as is: {err}")
                    return None
            out.append(composed)
        return out if isinstance(vt, list) else out[0]

    def _compose(self, vt: VirtualTensor) -> VirtualTensor:
        """Express ``vt`` over physical tensors: compose through virtual sources, except where
        that would pin many more bytes than ``vt`` holds (that source is then materialised)."""
        mapping, sources = vt.mapping, list(vt.sources)
        j = 0
        while j < len(sources):
            inner = self.virtual.get(sources[j]) if isinstance(sources[j], relax.Var) else None
            if isinstance(inner, VirtualTensor) and self._visible(inner):
                further = mapping.compose(j, inner.mapping)
                if not pins_too_much(further):
                    mapping, sources = further, sources[:j] + sources[j + 1 :] + list(inner.sources)
                    continue
            j += 1
        return VirtualTensor(mapping, sources)

    def _visible(self, vt: VirtualTensor) -> bool:
        """Outside a dataflow block, a dataflow block's internal tensors cannot be read."""
        return self.builder_.current_block_is_dataflow() or not any(
            isinstance(s, relax.DataflowVar) for s in vt.sources)

    # -- rewrite -------------------------------------------------------------------------------
    def visit_var_binding_(self, binding):
        value = binding.value
        if self.inplace and self._update_in_place(binding):
            return
        vt = self._movement(binding.var, value)
        composed = None if vt is None else self._composed(binding.var, vt)
        if composed is not None:
            self.movement_vars.add(binding.var)
            if binding.var not in self.physical:  # consumers read through it
                self.virtual[binding.var] = composed
            if not isinstance(vt, list) and self._materialise_directly(value, vt, composed):
                self._emit_copy(binding, composed)
                return
            super().visit_var_binding_(binding)
            return
        if isinstance(value, relax.Call):
            new_value = self._rewrite_consumer(binding.var, value)
            if new_value is not None:
                self._emit_same_var(binding, new_value)
                self.rewritten.add(binding.var)
                return
        super().visit_var_binding_(binding)

    def _update_in_place(self, binding) -> bool:
        """scatter/slice_scatter into a parameter the caller lets us update: write the updates
        only (see :mod:`vtc_tvm.inplace`)."""
        call = binding.value
        if not (isinstance(call, relax.Call) and call.args and isinstance(call.args[0], relax.Var)):
            return False
        cache = call.args[0]
        if cache.name not in self.inplace or not isinstance(call.op, Op) \
                or call.op.name not in inplace_updates.updatable_ops():
            return False
        if self.uses.get(cache, 0) != 1:
            self._log(cache, call.op.name, False, "in-place update refused: the parameter is read elsewhere")
            return False
        try:
            kernel, args, at = inplace_updates.inplace_update(call, cache.name)
            check_schedulable(kernel, self.target)
        except (Unsupported, NotRewritable) as err:
            self._log(cache, call.op.name, False, f"in-place update refused: {err}")
            return False
        gv = self.builder_.add_func(kernel, f"{call.op.name.split('.')[-1]}_inplace")
        self._emit_same_var(binding, relax.call_tir_inplace(
            gv, [self.visit_expr(a) for a in args], [at], out_ty=binding.var.ty))
        self._log(cache, call.op.name, True, "updated in place: only the new elements are written")
        return True

    def _materialise_directly(self, value, vt, composed) -> bool:
        """If this movement op stays, should it be one copy kernel from the physical sources?

        Yes where composition reached past its own inputs (one kernel instead of a chain) or its
        stock legalization is broken; reshape-like ops stay ops (stock makes them free views).
        """
        name = _op_name(value)
        if name in _OWN_COPY_OPS:
            return True
        if name in _VIEW_OPS:
            return False
        return len(composed.sources) != len(vt.sources) or any(
            not a.same_as(b) for a, b in zip(composed.sources, vt.sources))

    def _emit_copy(self, binding, vt: VirtualTensor):
        gv = self.builder_.add_func(vt.mapping.to_prim_func("vtc_copy"), "vtc_copy")
        call = relax.call_tir(gv, [self.visit_expr(s) for s in vt.sources], out_ty=binding.var.ty)
        self._emit_same_var(binding, call)

    def _emit_same_var(self, binding, new_value):
        new_value = self.builder_.normalize(new_value)
        self.builder_.emit_normalized(relax.VarBinding(binding.var, new_value))

    def _consumer_prim_func(self, call):
        """(PrimFunc, kernel name, tensor args) that computes ``call``, or None."""
        if call.op.same_as(CALL_TIR):
            kernel = call_tir_kernel(self.mod, call)  # symbolic shape values: left as they are
            return None if kernel is None else (kernel[1], kernel[0].name_hint, kernel[2])
        legalize = call.op.get_attr("FLegalize") if isinstance(call.op, Op) else None
        if legalize is None:
            return None
        try:
            legal = self.builder_.normalize(legalize(self.builder_, call))
        except Exception as err:  # noqa: BLE001 - a consumer we cannot lower stays as it is
            logger.info("cannot legalize %s: %s", call.op.name, err)
            return None
        if not (isinstance(legal, relax.Call) and legal.op.same_as(CALL_TIR)) or len(legal.args) > 2:
            return None
        if not tvm_ffi.structural_equal(legal.ty, call.ty):
            # e.g. TOPI's broadcast of two symbolic shapes Relax proved equal and TOPI did not
            logger.info("legalized %s has type %s, not %s", call.op.name, legal.ty, call.ty)
            return None
        gv = legal.args[0]
        func = self.builder_.get()[gv]
        args = list(legal.args[1].fields)
        # The legalized call must read the original tensors (constants may be folded into the
        # PrimFunc) and otherwise only the values of symbolic dimensions.
        tensors = [a for a in call.args if isinstance(a.ty, relax.TensorType)]
        for a in args:
            if not (isinstance(a.ty, tvm.ir.PrimType) or any(a.same_as(t) for t in tensors)):
                return None
        return func, call.op.name.split(".")[-1], args

    def _rewrite_consumer(self, var, call):
        virtual_args = [a for a in _tensor_args(call) if isinstance(self.virtual.get(a), VirtualTensor)]
        if not virtual_args:
            return None
        found = self._consumer_prim_func(call) if _shaped(var.ty) else None
        if found is None:
            consumer = call.op.name if isinstance(call.op, Op) else str(call.op)
            for a in virtual_args:
                self._log(a, consumer, False, "consumer is not a rewritable call_tir")
            return None
        func, name, args = found
        pattern = op_pattern(func)
        new_args: List[relax.Expr] = []
        changed = False
        for arg in args:
            vt = self.virtual.get(arg) if isinstance(arg, relax.Var) else None
            if not isinstance(vt, VirtualTensor):
                new_args.append(arg)
                continue
            if not self._visible(vt):
                self._log(arg, name, False, "consumer outside the dataflow block that defines the sources")
                new_args.append(arg)
                continue
            decision = self.strategy(vt.mapping, self._contiguity_of(vt), pattern)
            if decision.take and (arg, var) in self.refused:
                decision = type(decision)(False, "memory guard: with this edge vtc plans more memory than stock")
            if decision.take:
                try:
                    forms = rewritten_forms(func, len(new_args), vt.mapping, arg.name, self.target)
                    rewritten = best_schedulable(func, forms, self.target)
                    verdict = None if self.profiler is None else self.profiler.compare(
                        func, vt.mapping.to_prim_func("vtc_copy"), rewritten)
                    if verdict is not None:
                        decision = type(decision)(verdict[0], f"{decision.reason}; {verdict[1]}")
                    elif self.profiler is not None:
                        decision = type(decision)(True, f"{decision.reason}; not profiled (symbolic shape)")
                    if decision.take:
                        func = rewritten
                except NotRewritable as err:
                    decision = type(decision)(False, str(err))
            self._log(arg, name, decision.take, decision.reason)
            if decision.take:
                self.taken.append((arg, var))
                new_args.extend(vt.sources)
                changed = True
            else:
                new_args.append(arg)
        if not changed:
            return None
        gv = self.builder_.add_func(func, f"{name}_vtc")
        out_ty = list(var.ty.fields) if isinstance(var.ty, relax.TupleType) else var.ty
        return relax.call_tir(gv, [self.visit_expr(a) for a in new_args], out_ty=out_ty)

    def _contiguity_of(self, vt):
        if vt.mapping not in self._contiguity:
            self._contiguity[vt.mapping] = contiguity(vt.mapping)
        return self._contiguity[vt.mapping]


def _hoist(func: relax.Function, rewritten) -> relax.Function:
    """Move each rewritten consumer up to just after the last definition it reads.

    It now reads the movement op's sources, and runs where the movement op ran. Left in place,
    it runs later than stock's fused kernel would (FuseOps emits a group where its first binding
    was, e.g. the reshape of a Q projection): the sources then live longer, and on Llama prefill
    the planner packed the same tensors into 80 MiB instead of 70.
    """
    if not rewritten:
        return func
    blocks = []
    for block in func.body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            blocks.append(block)
            continue
        order = []
        for b in block.bindings:
            at = len(order)
            if b.var in rewritten:
                reads = set(relax.analysis.free_vars(b.value))
                # Symbolic dims its shapes use must be defined first (by a match_cast above it,
                # e.g. the shape of an ONNX Expand read from a runtime tensor).
                symbols = set(relax.analysis.free_symbolic_vars(b.value)) | set(
                    relax.analysis.tir_vars_in_type(b.var.ty))
                at = max((i + 1 for i, o in enumerate(order)
                          if o.var in reads or symbols & _defined_symbols(o)), default=0)
            order.insert(at, b)
        blocks.append(relax.DataflowBlock(order))
    return relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure,
                          func.attrs)


def _defined_symbols(binding) -> set:
    """Symbolic variables a binding defines: those its ``match_cast`` pattern may bind."""
    if not isinstance(binding, relax.MatchCast):
        return set()
    return set(relax.analysis.definable_tir_vars_in_type(binding.ty))


def _check_symbols(vt: VirtualTensor):
    """A symbolic dimension of a virtual tensor must be a dimension of one of its sources:
    otherwise neither a copy kernel nor a rewritten consumer could learn its value."""
    defined = [d for j in range(len(vt.mapping.sources)) for d in vt.mapping.source_shape(j)
               if isinstance(d, tvm.ir.Var)]
    for symbol in vt.mapping.symbols:
        if not any(symbol.same_as(d) for d in defined):
            raise Unsupported(f"symbolic dimension {symbol} is not a dimension of any source")


def _shaped(ty) -> bool:
    """A tensor (or tuple of tensors) type with known shapes: what call_tir can produce."""
    if isinstance(ty, relax.TupleType):
        return all(_shaped(f) for f in ty.fields)
    return isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr)


def _op_name(value):
    return value.op.name if isinstance(value, relax.Call) and isinstance(value.op, Op) else None


_MAX_ROUNDS = 4  # each round only adds materialised tensors; in practice 1-2 rounds suffice


def _bound_vars(mod) -> set:
    found = set()
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, lambda e: found.update(
                b.var for block in e.blocks for b in block.bindings) if isinstance(e, relax.SeqExpr) else None)
    return found


def _rounds(mod, choose, allowed, target, inplace, profiler, refused=frozenset()):
    """VirtualTensorize to a fixed point: ``(module, last round's decisions, earlier rounds'
    decisions, edges taken)``."""
    physical, earlier = frozenset(), []
    split_of = _only_split_readers(mod)
    for _ in range(_MAX_ROUNDS):
        decisions = []
        mutator = _VirtualTensorizer(mod, choose, allowed, decisions, target, inplace, physical, profiler, refused)
        out = relax.transform.DeadCodeElimination()(mutator.transform())
        # Movement results still bound are materialised: next round, read them directly.
        # One that only a split reads stays virtual and the split's parts are materialised
        # instead: one multi-output copy, as in stock, with part-sized buffers (ShuffleNet).
        stayed = {split_of.get(v, v) for v in _bound_vars(out) & mutator.movement_vars}
        if stayed <= physical:
            break
        physical = physical | stayed
        earlier += decisions
    return out, decisions, earlier, mutator.taken


GUARD_TRIALS = 24  # at most this many re-runs of the pass (each costs a lowering of the module)


def _guard_memory(mod, out, taken, rounds, target):
    """If ``out`` plans more intermediate memory than ``mod`` does under stock's fusion (the
    greedy planner packs differently when kernels change, see README), refuse taken edges in
    program order: each alone first, then cumulatively. Returns the first result that plans no
    more than stock, ``mod`` itself if none does within :data:`GUARD_TRIALS`, or None if ``out``
    is fine or sizes are symbolic."""
    from .report import kernel_census

    def planned(m, stores):
        try:
            got = kernel_census(m, target, stores=stores)["planned_bytes"]
        except Exception as err:  # noqa: BLE001 - e.g. no "main": the guard does not apply
            logger.info("memory guard: cannot plan memory (%s)", err)
            return None
        return got if isinstance(got, (int, float)) else None

    if target is None:
        raise ValueError("VirtualTensorize(memory_guard=True) needs a target")
    limit, now = planned(mod, False), planned(out, True)
    if limit is None or now is None or now <= limit:
        return None
    tries = [frozenset([e]) for e in taken] + [frozenset(taken[:k]) for k in range(2, len(taken) + 1)]
    for refused in tries[:GUARD_TRIALS]:
        cand, decisions, earlier, _ = rounds(refused=refused)
        got = planned(cand, True)
        if got is not None and got <= limit:
            logger.info("memory guard: %d edge(s) refused, planned memory back to stock's", len(refused))
            return cand, decisions, earlier
    reason = f"memory guard: no refusal within {GUARD_TRIALS} trials plans <= stock; module left as it was"
    logger.info(reason)
    return mod, [{"tensor": a.name, "consumer": v.name, "virtual": False, "reason": reason}
                 for a, v in taken], []


def _only_split_readers(mod) -> dict:
    """{var: the split var} for variables whose only use is one ``relax.split``."""
    found = {}
    for _, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        counts = _use_counts(func)
        relax.analysis.post_order_visit(func, lambda e: found.update(
            {b.value.args[0]: b.var for block in e.blocks for b in block.bindings
             if isinstance(b.value, relax.Call) and isinstance(b.value.op, Op) and b.value.op.name == "relax.split"
             and isinstance(b.value.args[0], relax.Var) and counts.get(b.value.args[0]) == 1})
            if isinstance(e, relax.SeqExpr) else None)
    return found


def _use_counts(func) -> dict:
    counts = {}

    def visit(e):
        if isinstance(e, relax.Var):
            counts[e] = counts.get(e, 0) + 1

    relax.analysis.post_order_visit(func.body, visit)
    return counts


def _tensor_args(call):
    """Variables among the arguments, including those inside tuple arguments (call_tir's and
    call_dps_packed's inputs)."""
    found = []
    for a in call.args:
        found += list(a.fields) if isinstance(a, relax.Tuple) else [a]
    return [a for a in found if isinstance(a, relax.Var)]


def VirtualTensorize(
    strategy: Union[str, Callable] = "contiguity",
    ops: Optional[Sequence[str]] = None,
    report: Optional[list] = None,
    target: Optional[Union[str, dict, tvm.target.Target]] = None,
    inplace: Sequence[str] = (),
    profile: Union[bool, "EdgeProfiler"] = False,
    memory_guard: bool = False,
) -> tvm.transform.Pass:
    """Eliminate data-movement ops by making their outputs virtual tensors.

    Parameters
    ----------
    strategy : "contiguity" (default), "all", or a callable
        Which (virtual tensor, consumer) edges to take; see :mod:`vtc_tvm.strategy`.
    ops : list of Relax op names, optional
        Restrict the registered rules to these ops (copy kernels recognised in ``call_tir``
        form are always considered).
    report : list, optional
        Receives one dict per decision (``tensor``, ``consumer``, ``virtual``, ``reason``);
        the same decisions are logged at INFO level on the ``vtc_tvm`` logger.
    target : Target, optional
        The compilation target. For GPU targets every rewritten consumer is checked to still
        schedule with DLight's default rules; an edge that would not stays physical.
        Defaults to ``Target.current()``.
    inplace : names of function parameters, optional
        Parameters the caller allows to be updated in place (KV caches): ``scatter_nd``,
        ``scatter_elements`` and ``slice_scatter`` into them write only the new elements
        instead of copying the whole tensor. This changes the calling convention, so it is off
        by default.
    profile : bool or EdgeProfiler
        Time every edge the strategy accepts on the target's device (copy + consumer against
        the rewritten consumer, see :mod:`vtc_tvm.profile`) and take it only if it is not
        slower. Needs the device; costs a kernel build per distinct edge.
    memory_guard : bool
        Never plan more intermediate memory than stock TVM (``relax.analysis`` memory planning
        after the target's fusion, for ``main``): where the rewritten module would, accepted
        edges are refused one at a time (then cumulatively) until it does not, or the module is
        left as it was. Costs a lowering per trial (at most :data:`GUARD_TRIALS`); needs a target.
    """
    from .options import check_inplace, check_inplace_names, check_ops, check_report
    from .profile import EdgeProfiler

    choose = get_strategy(strategy)
    allowed, inplace = check_ops(ops), check_inplace_names(inplace)
    check_report(report)
    profiler = profile if isinstance(profile, EdgeProfiler) else None
    if profile is True and target is not None:
        profiler = EdgeProfiler(target)  # fail now, not inside the pass, without a device

    @tvm.transform.module_pass(opt_level=0, name="VirtualTensorize")
    def _virtual_tensorize(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        tgt = tvm.target.Target(target) if target is not None else tvm.target.Target.current(allow_none=True)
        nonlocal profiler
        check_inplace(inplace, mod)
        if profile is True and profiler is None:
            if tgt is None:
                raise ValueError("VirtualTensorize(profile=True) needs a target")
            profiler = EdgeProfiler(tgt)
        rounds = functools.partial(_rounds, mod, choose, allowed, tgt, inplace, profiler)
        out, decisions, earlier, taken = rounds()
        if memory_guard:
            out, decisions, earlier = _guard_memory(mod, out, taken, rounds, tgt) or (out, decisions, earlier)
        if report is not None:
            # The decisions that made a tensor physical were taken in earlier rounds.
            decided = {(d["tensor"], d["consumer"]) for d in decisions}
            seen = set()
            for d in earlier:
                key = (d["tensor"], d["consumer"])
                if key not in decided and key not in seen:
                    seen.add(key)
                    report.append(d)
            report.extend(decisions)
        return out

    return _virtual_tensorize
