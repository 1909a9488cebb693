"""The ``VirtualTensorize`` Relax pass: the emitter of one global plan.

:func:`vtc_tvm.plan.plan` builds the opportunity graph once (:mod:`vtc_tvm.candidates`), costs it
(:mod:`vtc_tvm.cost`) and lets the solver choose the edges; this module emits that plan in one
rewrite. Every consumer whose edges the plan takes gets a copy of its PrimFunc that reads the
physical sources through the mapping (recorded in the PrimFunc attribute
``vtc.virtual_inputs``). Movement ops left without users disappear (``DeadCodeElimination``);
the ones still used (function outputs, opaque or external consumers, rejected edges) are
materialised once, directly from the physical sources. A destination of the store side the
plan chose is materialised by a copy kernel of ours whose blocks say which producers store into
it (:func:`vtc_tvm.stores.mark_store_plan`); :mod:`vtc_tvm.stores` executes that after
``FuseTIR``.

The result is an ordinary Relax module: ``tvm.compile(mod, target)`` and the default pipelines
compile it unchanged.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional, Sequence, Union

import tvm
from tvm import relax
from tvm.relax.expr_functor import mutator

from .candidates import Walker, cached_rewrite
from .rewrite import NotRewritable
from .strategy import Decision

logger = logging.getLogger("vtc_tvm")


@mutator
class _Emitter(Walker):
    """The walk of :class:`vtc_tvm.candidates.Walker`, each edge decided by the plan."""

    def __init__(self, mod, plan, ops, target, inplace):
        super().__init__(mod, ops, target, inplace, plan.physical, report=[])
        self.plan = plan

    def finish_function(self, func):
        return _hoist(func, self.rewritten)

    def planned_stores(self, var) -> set:
        return self.plan.stores.get(var, set())

    def decide(self, arg, var, vt, func, index, name, pattern):
        decision = self.plan.choice.get((arg, var))
        if decision is None or not decision.take:
            return decision or Decision(False, "not in the plan"), None
        got = cached_rewrite(func, index, vt.mapping, arg.name, self.target)
        if isinstance(got, NotRewritable):  # a consumer with several inputs, rewritten in turn
            return Decision(False, str(got)), None
        return decision, got


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
                # The last such definition (scanned from the end: it is usually close by).
                at = next((i + 1 for i in range(len(order) - 1, -1, -1)
                           if order[i].var in reads or symbols & _defined_symbols(order[i])), 0)
            order.insert(at, b)
        blocks.append(relax.DataflowBlock(order))
    return relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure,
                          func.attrs)


def _defined_symbols(binding) -> set:
    """Symbolic variables a binding defines: those its ``match_cast`` pattern may bind."""
    if not isinstance(binding, relax.MatchCast):
        return set()
    return set(relax.analysis.definable_tir_vars_in_type(binding.ty))


def VirtualTensorize(
    strategy: Union[str, Callable] = "contiguity",
    ops: Optional[Sequence[str]] = None,
    report: Optional[list] = None,
    target: Optional[Union[str, dict, tvm.target.Target]] = None,
    inplace: Sequence[str] = (),
    profile: Union[bool, "EdgeProfiler"] = False,
    memory_guard: bool = False,
    objective: str = "latency",
    profile_db=None,
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
        slower. Needs the device; costs a kernel build per distinct edge. Without it, the edges
        measured before are still decided by their measurements (the database shipped in the
        package, the benchmark workloads on an H200, and ``$VTC_TVM_PROFILE_DB``: see
        :class:`vtc_tvm.profile.MeasuredEdges`); the others by the analytic cost.
    memory_guard : bool
        Never plan more intermediate memory than stock TVM: a constraint of the plan. The
        bytes TVM's static planner will plan are predicted for stock and for the plan
        (:mod:`vtc_tvm.memory`); decisions that cost memory are taken back until the plan's
        are at most stock's (if none fits, the module is returned unchanged). No lowering
        happens inside the pass.
    objective : "latency" (default) or "memory"
        What the plan optimises: predicted time saved, or the least memory that is not slower
        (also taking back what the planned-bytes prediction says costs memory).
    profile_db : path, optional
        Where ``profile=True`` keeps its measurements (default ``~/.cache/vtc_tvm/profile.json``;
        see :class:`vtc_tvm.profile.ProfileDB`).
    """
    from .options import check_inplace, check_inplace_names, check_ops, check_report
    from .plan import plan as make_plan
    from .profile import EdgeProfiler
    from .strategy import get_strategy

    if objective not in ("latency", "memory"):
        raise ValueError(f"objective must be 'latency' or 'memory', not {objective!r}")
    get_strategy(strategy)  # fail now on an unknown strategy name
    ops, inplace = check_ops(ops), check_inplace_names(inplace)
    check_report(report)
    profiler = profile if isinstance(profile, EdgeProfiler) else None
    if profile is True and target is not None:
        profiler = EdgeProfiler(target, db=profile_db)  # fail now, not inside the pass, without a device

    @tvm.transform.module_pass(opt_level=0, name="VirtualTensorize")
    def _virtual_tensorize(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        nonlocal profiler
        check_inplace(inplace, mod)
        tgt = tvm.target.Target(target) if target is not None else tvm.target.Target.current(allow_none=True)
        if profile is True and profiler is None:
            if tgt is None:
                raise ValueError("VirtualTensorize(profile=True) needs a target")
            profiler = EdgeProfiler(tgt, db=profile_db)
        chosen = make_plan(mod, tgt, strategy, ops, inplace, profiler or False, memory_guard, objective)
        if report is not None:
            report.extend(chosen.rows)
        return emit(mod, chosen)

    return _virtual_tensorize


def emit(mod: tvm.IRModule, chosen) -> tvm.IRModule:
    """The module ``chosen`` (the :class:`vtc_tvm.plan.Plan` that :func:`vtc_tvm.plan` made
    of ``mod``) describes, in one rewrite: what ``VirtualTensorize`` returns with the same
    options. ``plan`` then ``emit`` lets a caller keep the plan it compiled (``vtc-tvm explain``).
    """
    if chosen.unchanged:  # no plan is predicted to plan at most stock's memory
        logger.info("module left as it is: %s", chosen.summary["memory"]["unchanged"])
        return mod
    ops = None if chosen.ops is None else set(chosen.ops)
    out = relax.transform.DeadCodeElimination()(_Emitter(mod, chosen, ops, chosen.target, chosen.inplace).transform())
    for row in chosen.rows:
        logger.info("%s -> %s: %s (%s)", row["tensor"], row["consumer"],
                    "virtual" if row["virtual"] else "physical", row["reason"])
    return out
