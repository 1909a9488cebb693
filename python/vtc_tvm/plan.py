"""Plan: one global decision over the opportunity graph (:mod:`vtc_tvm.candidates`).

``plan(mod, target, ...)`` collects every candidate edge once (rewrites cached), costs it
(:mod:`vtc_tvm.cost`), and lets the native solver (:mod:`vtc_tvm.solver`) choose a conflict-free
set: the edges of one virtual tensor are taken together (``requires`` in a cycle: the copy is
only saved when every consumer reads through the mapping), a tensor that some use keeps physical
(a function output, a consumer that cannot be rewritten, an edge the strategy refuses) offers no
edges, a materialised movement result (a concat, a permute, a shuffle, a split's parts) is
either virtual over its sources or the destination their producers store into (store edges
conflict with its load edges and with load edges that read the stored source; the store edges of
one source go together), and the chosen plan never adds kernels nor (with ``memory_guard``)
planned bytes (the budgets). The store edges chosen are :attr:`Plan.stores`, which the emitter
marks on the destinations' copy kernels for :mod:`vtc_tvm.stores`.

With ``memory_guard`` memory is a constraint: at the fixed point (below) the planned bytes of
stock and of the plan are predicted (:mod:`vtc_tvm.memory`, from the records :func:`_records`
derives from the decisions and from the chosen store edges, without emitting or lowering), and
while the plan's exceed stock's :class:`_MemoryFit` takes back the decisions that keep tensors
alive longest for the least time saved, walking again (``objective="memory"`` goes on while the
prediction falls).

Which movement results stay materialised also depends on how the ones they compose through
end up; that is a fixed point over the graph (limit 1): each step re-walks the module with the
cached rewrites and no lowering. Function outputs (through the tuples and aliases that return
them) are physical from the first step, so a module whose only materialised movement results
are its outputs (a decode layer returning its grown caches) is planned in one walk. The result is a
:class:`Plan`: data (``to_json``, ``to_dot``) and the decisions :mod:`vtc_tvm.transform` emits.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from . import memory, solver
from .analysis import INJECTIVE, OPAQUE, OUT_EWISE_FUSABLE, VIEW_OPS, op_pattern
from .candidates import (Edge, Graph, Node, Walker, cached_contiguity, cached_op_pattern, cached_rewrite, copy_kernel,
                         materialise_directly, fuses_into_copy, shaped, store_edges, _op_name)
from .mapping import VirtualTensor
from .cost import EdgeCost, copy_saving, edge_cost, view_credit
from .rewrite import NotRewritable
from .strategy import Decision, by_contiguity, get_strategy

logger = logging.getLogger("vtc_tvm")
MAX_STEPS = 4  # materialisation fixed point: each step only adds physical tensors
_TILED_OPS = {"relax.matmul", "relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d", "relax.linear",
              "relax.nn.conv2d_transpose"}


@mutator
class Collector(Walker):
    """Walks a module and records the candidate graph; consumers are rewritten (in the
    throw-away output) where the strategy alone would take the edge, so that a consumer with
    several virtual inputs is rewritten in the same order the emitter rewrites it."""

    def __init__(self, mod, choose, ops, target, inplace, physical, profiler, graph: Graph):
        super().__init__(mod, ops, target, inplace, physical)
        self.choose, self.profiler, self.graph = choose, profiler, graph
        graph.value_of = self._value
        self.kept_reads: Dict[relax.Var, list] = {}
        self.consumer_reads: Dict[relax.Var, tuple] = {}
        self.outputs: list = []
        self.bindings: list = []
        self.binding_of: Dict[relax.Var, relax.Binding] = {}
        self.all_uses: Dict[relax.Var, int] = {}
        self.edges_into: Dict[relax.Var, List[Edge]] = {}
        # What the memory model needs to derive the rewritten functions (vtc_tvm.memory):
        self.functions: List[Tuple[relax.Function, list]] = []  # (function, [(binding, in dataflow)])
        self.copies: Dict[relax.Var, object] = {}     # movement result -> the mapping of its direct copy
        self.update_records: Dict[relax.Var, tuple] = {}  # binding -> its in-place update, its op pattern
        self.sources: Dict[relax.Var, list] = {}     # movement result -> the sources it composes to
        self._occurrences: Dict[relax.Var, list] = {}
        self._records: Dict[relax.Var, memory.Kernel] = {}
        self.patterns: Dict[object, Optional[int]] = {}
        self.updated: set = set()  # results of in-place updates (no producer to redirect)
        self.composed_of: Dict[relax.Var, object] = {}  # movement var -> its composed virtual tensor
        self.destinations: List[relax.Var] = []          # movement vars of the function being walked

    def begin_function(self, func):
        for p in func.params:
            self.graph.node(p)
        self.functions.append((func, []))
        for block in func.body.blocks:
            for b in block.bindings:
                self.bindings.append(b)
                self.binding_of[b.var] = b
                self.functions[-1][1].append((b, isinstance(block, relax.DataflowBlock)))
        self.outputs += list(relax.analysis.free_vars(func.body.body))
        self.all_uses.update(self.uses)

    def occurrences(self, binding) -> list:
        """Every variable occurrence in ``binding``'s value (computed once per binding)."""
        found = self._occurrences.get(binding.var)
        if found is None:
            found = self._occurrences[binding.var] = _occurrences(binding.value)
        return found

    def record(self, binding, dataflow: bool) -> memory.Kernel:
        """The memory record of ``binding`` as the input has it (computed once per binding)."""
        found = self._records.get(binding.var)
        if found is None:
            found = self._records[binding.var] = memory.kernel_of(
                binding.var, binding.value, self.mod, dataflow, match_cast=isinstance(binding, relax.MatchCast))
        return found

    def _update_in_place(self, binding) -> bool:
        done = super()._update_in_place(binding)
        if done:
            value = self.lookup_binding(binding.var)
            self.update_records[binding.var] = (value, op_pattern(self.builder_.get()[value.args[0]]))
        return done

    def _value(self, var):
        b = self.binding_of.get(var)
        return None if b is None else b.value

    def _emit_copy(self, binding, vt, planned=()):
        # The collector's module is thrown away: no copy kernel to build (the emitter builds it).
        PyExprMutator.visit_var_binding_(self, binding)

    def on_movement(self, binding, vt, composed):
        node = self.graph.node(binding.var, binding.value, len(self.graph.nodes))
        node.movement = True
        parts = composed if isinstance(composed, list) else [composed]
        self.sources[binding.var] = list(dict.fromkeys(s for c in parts for s in c.sources if isinstance(s, relax.Var)))
        if not isinstance(vt, list) and materialise_directly(binding.value, vt, composed):
            self.kept_reads[binding.var] = [s for s in composed.sources if isinstance(s, relax.Var)]
            self.copies[binding.var] = composed.mapping
        else:
            self.kept_reads[binding.var] = list(relax.analysis.free_vars(binding.value))
        self.composed_of[binding.var] = composed
        self.destinations.append(binding.var)
        # A reshape of what stays physical is a free view in stock too; one composed through a
        # virtual movement result (reshape(transpose(x))) is not: kept, it keeps that copy alive.
        node.free_view = _op_name(binding.value) in VIEW_OPS and \
            set(self.sources[binding.var]) <= set(self.kept_reads[binding.var])
        node.of_constants = all(isinstance(s, tvm.ir.Constant) for c in parts for s in c.sources)

    def finish_function(self, func):
        # Store candidates once the whole function is walked: whether every reader of a source
        # is a movement op is known only then.
        readers: Dict[relax.Var, list] = {}
        for b in self.bindings:
            for v in _occurrences(b.value):
                readers.setdefault(v, []).append(b.var)
        outputs = set(self.outputs)
        read_by = lambda v: None if v in outputs else readers.get(v, [])
        for var in self.destinations:
            self._store_candidates(var, self.composed_of[var], read_by)
        self.destinations = []
        return func

    def _store_candidates(self, var, composed, read_by):
        """Sources a kernel produces and only movement ops read: their producer can write its
        part of the movement result ``var`` if it is materialised (the store side, after
        fusion)."""
        dest = self.graph.by_var[var]
        for s, refused in store_edges(var, composed, self._value, self.uses, self.movement_vars | self.updated,
                                      read_by, self._pattern_of):
            self._store_edge(s, var, dest, refused)

    def _store_edge(self, s, var, dest, refused, update=False):
        src = self.graph.node(s, self._value(s))
        edge = Edge(len(self.graph.edges), "store", src.id, dest.id, dest.id, dest.name, legal=refused is None,
                    verdict=Decision(refused is None, refused or "producer stores into its part of the destination"))
        edge.source_var, edge.dest_var, edge.update = s, var, update
        self.graph.edges.append(edge)

    def _pattern_of(self, value) -> Optional[int]:
        """TVM's op pattern of the kernel ``value`` legalizes to (None when unknown)."""
        key = value
        if key not in self.patterns:
            pattern = None
            if _op_name(value) in _TILED_OPS:
                pattern = OUT_EWISE_FUSABLE
            elif isinstance(value, relax.Call):
                found = self._consumer_prim_func(value) if shaped(value.ty) else None
                pattern = op_pattern(found[0]) if found is not None else None
            self.patterns[key] = pattern
        return self.patterns[key]

    def decide(self, arg, var, vt, func, index, name, pattern):
        graph = self.graph
        src = graph.node(arg, self._value(arg))
        consumer = graph.node(var, self._value(var))
        data = [s for j, s in enumerate(vt.sources) if j in vt.mapping.data_sources() and isinstance(s, relax.Var)]
        dsts = [graph.node(s, self._value(s)) for s in data]
        contig = cached_contiguity(vt.mapping)
        verdict = self.choose(vt.mapping, contig, pattern)
        rewritten, after = None, None
        if verdict.take:
            got = cached_rewrite(func, index, vt.mapping, arg.name, self.target)
            if isinstance(got, NotRewritable):
                verdict = Decision(False, str(got))
            else:
                rewritten = got
                after = int(got.attrs["op_pattern"]) if got.attrs and "op_pattern" in got.attrs else pattern
                if self.profiler is not None and self.profiler.covers(func):
                    measured = self.profiler.compare(func, copy_kernel(vt.mapping), got, src.free_view)
                    if measured is not None:
                        verdict = Decision(measured[0], f"{verdict.reason}; {measured[1]}")
                    elif self.profiler.unmeasured is not None:
                        verdict = Decision(True, f"{verdict.reason}; {self.profiler.unmeasured}")
        edge = Edge(len(graph.edges), "load", src.id, dsts[0].id if dsts else graph.constant().id, consumer.id, name,
                    mapping=vt.mapping, contiguity=contig, pattern=pattern, legal=rewritten is not None,
                    verdict=verdict, rewritten=rewritten, fused_before=pattern, fused_after=after,
                    sources=tuple(d.id for d in dsts), source_exprs=tuple(vt.sources))
        edge.behind_tiled = self._behind_tiled(var, arg)
        edge.arg, edge.consumer_var = arg, var
        graph.edges.append(edge)
        self.edges_into.setdefault(var, []).append(edge)
        return (verdict if rewritten is not None else Decision(False, verdict.reason)), rewritten

    def _behind_tiled(self, var, arg) -> bool:
        """Whether another input of consumer ``var`` comes from a GEMM/conv (FuseOps fuses an
        elementwise/broadcast consumer into its epilogue)."""
        value = self._value(var)
        return isinstance(value, relax.Call) and any(
            isinstance(a, relax.Var) and not a.same_as(arg) and _op_name(self._value(a)) in _TILED_OPS
            for a in value.args)

    def decide_inplace(self, cache, call, var, rows, kernel):
        node = self.graph.node(cache)
        self.graph.edges.append(Edge(len(self.graph.edges), "store", node.id, node.id, None, call.op.name,
                                     legal=True, verdict=Decision(True, "updated in place (inplace=)"),
                                     chosen=True, reason="updated in place: only the new elements are written"))
        # The rows' producer may store them straight into the cache (through the update's index).
        vt = self.composed_of.get(rows) if isinstance(rows, relax.Var) else None  # (virtual or not)
        srcs = [rows] if not isinstance(vt, VirtualTensor) else [
            x for j, x in enumerate(vt.sources) if j in vt.mapping.data_sources()]
        s = srcs[0] if len(srcs) == 1 else None
        value = self._value(s) if isinstance(s, relax.DataflowVar) else None
        self.updated.add(var)
        if isinstance(value, relax.Call) and s not in self.movement_vars and s not in self.updated \
                and self.uses.get(s, 0) == 1 and self.uses.get(rows, 0) == 1:
            # FuseOps fuses producers into an update it does not see as opaque (an affine store).
            fused = op_pattern(kernel) <= INJECTIVE and fuses_into_copy(value, self._value, self.uses,
                                                                         self._pattern_of)
            update = self.graph.node(var, self._value(var), len(self.graph.nodes))
            self._store_edge(s, var, update, "FuseOps fuses its producer into the update (one kernel)"
                             if fused else None, update=True)
        return True


@dataclass
class Plan:
    """The chosen plan and the graph it was chosen on."""

    graph: Graph
    conflicts: List[List[int]]
    choice: Dict[tuple, Decision]           # (tensor var, consumer var) -> decision
    physical: frozenset
    rows: List[dict]                        # report rows, one per (tensor, consumer)
    summary: dict
    problem: Optional[solver.Problem] = None
    offered: List[int] = field(default_factory=list)  # solver edge index -> graph edge id
    # No plan fits the memory constraint: the pass leaves the module as it is.
    unchanged: bool = False
    # destination var (a materialised movement result, an in-place update) -> the source vars
    # whose producers store into it: what the emitter marks for :mod:`vtc_tvm.stores`
    stores: Dict[relax.Var, set] = field(default_factory=dict)
    # movement results the emitted module still computes (:func:`_materialised`): the others are
    # virtual, those with load edges and those composed into their readers' mappings alike
    materialised: frozenset = frozenset()
    # the options it was made with, which :func:`vtc_tvm.emit` needs to emit it
    target: Optional[tvm.target.Target] = None
    ops: Optional[frozenset] = None
    inplace: tuple = ()

    def chosen_edges(self) -> List[Edge]:
        return [e for e in self.graph.edges if e.chosen]

    def store_side(self) -> Dict[str, List[str]]:
        """{destination name: names of the tensors whose producers store into it} (the chosen
        store edges, which :mod:`vtc_tvm.stores` executes after fusion)."""
        return {d.name: sorted(s.name for s in srcs) for d, srcs in self.stores.items()}

    def to_json(self) -> str:
        nodes = [{"id": n.id, "name": n.name, "op": n.op, "onnx_node": n.onnx_node, "shape": list(n.shape),
                  "dtype": n.dtype, "bytes": n.bytes, "virtual": self._virtual(n),
                  "reason": self._node_reason(n)} for n in self.graph.nodes]
        edges = [{"id": e.id, "src": e.src, "dst": e.dst, "kind": e.kind,
                  "consumer": e.consumer_name, "mapping": None if e.mapping is None else repr(e.mapping),
                  "gain_us": None if e.cost is None else e.cost.gain_us,
                  "kernels": None if e.cost is None else e.cost.kernels,
                  "memory": None if e.cost is None else e.cost.memory,
                  "chosen": e.chosen, "reason": e.reason} for e in self.graph.edges]
        return json.dumps({"nodes": nodes, "edges": edges, "conflicts": self.conflicts,
                           "summary": self.summary}, indent=1, default=str)

    def to_dot(self) -> str:
        lines = ["digraph vtc_plan {", "  rankdir=LR;"]
        for n in self.graph.nodes:
            style = "dashed" if self._virtual(n) else "solid"
            lines.append(f'  n{n.id} [label="{n.name}\\n{list(n.shape)}", style={style}];')
        for e in self.graph.edges:
            color = "black" if e.chosen else "gray"
            lines.append(f'  n{e.src} -> n{e.dst} [label="{e.kind}:{e.consumer_name}", color={color}];')
        lines.append("}")
        return "\n".join(lines)

    def _virtual(self, n: Node) -> bool:
        return n.movement and n.var is not None and not self.unchanged and n.var not in self.materialised

    def _node_reason(self, n: Node) -> str:
        if not n.movement:
            return "computed by a kernel"
        if self._virtual(n):
            if any(e.chosen for e in self.graph.edges if e.src == n.id and e.kind == "load"):
                return "virtual: every consumer reads through its mapping"
            return "virtual: composed into the mappings of its readers (no kernel, no memory)"
        return self.graph.escapes.get(n.id, ["stays materialised"])[0]


def plan(mod: tvm.IRModule, target=None, strategy: Union[str, Callable] = "contiguity",
         ops: Optional[Sequence[str]] = None, inplace: Sequence[str] = (), profile=False,
         memory_guard: bool = False, objective: str = "latency", report=None) -> Plan:
    """The plan :func:`vtc_tvm.VirtualTensorize` emits for ``mod`` (same options)."""
    from .profile import EdgeProfiler, MeasuredEdges

    tgt = tvm.target.Target(target) if target is not None else tvm.target.Target.current(allow_none=True)
    profiler = profile if isinstance(profile, (EdgeProfiler, MeasuredEdges)) else None
    if profile is True:
        if tgt is None:
            raise ValueError("VirtualTensorize(profile=True) needs a target")
        profiler = EdgeProfiler(tgt)
    elif profile is False:  # what was measured before still decides the edges it covers
        profiler = MeasuredEdges.for_target(tgt)
    choose = get_strategy(strategy)
    allowed = None if ops is None else set(ops)
    every = strategy == "all"
    chosen = _plan(mod, tgt, choose, allowed, tuple(inplace), profiler, memory_guard, objective, every)
    chosen.target, chosen.ops, chosen.inplace = tgt, None if allowed is None else frozenset(allowed), tuple(inplace)
    return chosen


def _plan(mod, tgt, choose, allowed, inplace, profiler, memory_guard, objective, every=False) -> Plan:
    # Function outputs stay materialised whatever the plan: physical from the first walk, so no
    # consumer is rewritten to read through one (a grown KV cache read by attention) only for the
    # next step to find it materialised and rewrite that consumer again. ("all" reads through
    # materialised tensors too.)
    physical: frozenset = frozenset() if every else _function_outputs(mod)
    earlier: Dict[tuple, dict] = {}
    earlier_edges: Dict[tuple, Edge] = {}
    nodes = Graph(upper_bounds=_upper_bounds(mod))  # one node table for every step: stable node ids
    fit = _MemoryFit(memory_guard and not every, objective == "memory" and not every)
    step = steps = 0
    while True:
        graph = Graph(nodes=nodes.nodes, by_var=nodes.by_var, _ops=nodes._ops, upper_bounds=nodes.upper_bounds)
        collector = Collector(mod, choose, allowed, tgt, inplace, physical, profiler, graph)
        collector.transform()
        result = _solve(graph, collector, tgt, memory_guard, objective, every, fit.no_store)
        stayed = _materialised(collector, result.choice)
        if every:  # "all": consumers keep reading through a tensor that is materialised anyway
            stayed -= {graph.nodes[e.src].var for e in graph.edges if e.chosen and e.kind == "load"}
        stayed = frozenset(collector_split(collector).get(v, v) for v in stayed)
        step += 1
        steps += 1
        if stayed <= physical or step >= MAX_STEPS:
            # A fixed point: the memory constraint keeps it, or walks again with more physical.
            action, value = fit.check(result, collector, physical)
            if action == "done":
                result = value
                break
            step, next_physical = 0, value
        else:
            next_physical = physical | stayed
        for row in result.rows:
            earlier.setdefault((row["tensor"], row["consumer"]), row)
        for e in graph.edges:
            if e.kind == "load":
                earlier_edges.setdefault((e.arg, e.consumer_var), e)
        physical = next_physical
    graph = result.graph
    final = {(e.arg, e.consumer_var) for e in graph.edges if e.kind == "load"}
    for key, e in earlier_edges.items():  # edges into tensors an earlier step found materialised
        if key not in final:
            e.id, e.chosen = len(graph.edges), False
            why = fit.taken_back.get(key[0])
            e.reason = (f"taken back by the memory constraint ({why}); alone: {e.verdict.reason}" if why else
                        f"the tensor stays materialised, read directly; alone: {e.verdict.reason}")
            graph.edges.append(e)
    result.summary["solver"]["steps"] = steps
    # Edges decided in an earlier step whose tensor then stayed materialised: read directly.
    seen = {(r["tensor"], r["consumer"]) for r in result.rows}
    taken_back = {v.name: why for v, why in fit.taken_back.items()}
    for key, row in earlier.items():
        if key not in seen and not row["virtual"]:
            result.rows.append(row)
        elif key not in seen and key[0] in taken_back:
            result.rows.append(dict(row, virtual=False, reason=(
                f"taken back by the memory constraint ({taken_back[key[0]]}): materialised as stock "
                f"computes it; alone: {row['reason']}")))
        elif key not in seen:
            result.rows.append(dict(row, virtual=False, reason=(
                "stays materialised (read where it cannot be virtual), so consumers read it directly; "
                f"alone: {row['reason']}")))
    return result


def _function_outputs(mod: tvm.IRModule) -> frozenset:
    """What the Relax functions of ``mod`` return: the returned variables, and through tuples
    and aliases bound in the function, the variables they hold (a decode layer returns
    ``(out, k_cache, v_cache)`` bound to one variable)."""
    found = set()
    for func in mod.functions.values():
        if not isinstance(func, relax.Function) or (func.attrs and func.attrs.get("Primitive")):
            continue
        bound = {b.var: b.value for block in func.body.blocks for b in block.bindings}
        todo = list(relax.analysis.free_vars(func.body.body))
        while todo:
            v = todo.pop()
            if v not in found:
                found.add(v)
                if isinstance(bound.get(v), (relax.Tuple, relax.Var)):
                    todo += list(relax.analysis.free_vars(bound[v]))
    return frozenset(found)


def collector_split(collector) -> dict:
    """{var: the split var} for variables whose only use is one ``relax.split``: the split's
    parts are materialised instead (one multi-output copy with part-sized buffers, as stock)."""
    found = {}
    for b in collector.bindings:
        v = b.value
        src = v.args[0] if isinstance(v, relax.Call) and _op_name(v) == "relax.split" else None
        if b.var in collector.movement_vars and isinstance(b.var.ty, relax.TupleType) and src is None \
                and len(v.args) == 2 and isinstance(v.args[1], relax.Tuple) and len(v.args[1].fields) == 1:
            src = v.args[1].fields[0]  # a legalized split
        if isinstance(src, relax.Var) and collector.all_uses.get(src) == 1:
            found[src] = b.var
    return found


def _solve(graph: Graph, collector: Collector, tgt, memory_guard: bool, objective: str, every: bool,
           no_store=frozenset()) -> Plan:
    """Cost the graph's edges and solve for the plan (see the module docstring)."""
    edges = graph.edges
    # Occurrences of each tensor outside movement bindings: what must read through it.
    needed: Dict[relax.Var, int] = {}
    for b in collector.bindings:
        if b.var in collector.movement_vars:
            continue
        for v in _occurrences(b.value):
            needed[v] = needed.get(v, 0) + 1
    for v in collector.outputs:
        needed[v] = needed.get(v, 0) + 1
    by_src: Dict[int, List[Edge]] = {}
    for e in edges:
        if e.kind == "load":
            by_src.setdefault(e.src, []).append(e)
    offered: List[int] = []
    gain, kernels, memory, requires = [], [], [], []
    first_load: Dict[int, int] = {}
    for src, group in by_src.items():
        node = graph.nodes[src]
        refused = [e for e in group if not (e.legal and e.verdict.take)]
        for e in refused:
            e.reason = e.verdict.reason
        covered = len(group) - len(refused)
        if refused or needed.get(node.var, 0) > covered or node.var in collector.outputs:
            why = refused[0].verdict.reason if refused else (
                "a function output" if node.var in collector.outputs else "read by a consumer that cannot read through it")
            graph.escapes[src] = [f"stays materialised: {why}"]
            for e in group:
                if e not in refused:
                    e.chosen = every
                    e.reason = (f"{e.verdict.reason} (the tensor is materialised too: {why})" if every else
                                f"{e.verdict.reason}; but the tensor stays materialised ({why})")
            continue
        view = node.free_view
        saving = copy_saved(node, tgt)
        share = saving / len(group)
        ids = []
        for k, e in enumerate(group):
            dtype_bytes = max(tvm.runtime.DataType(node.dtype).bits // 8, 1) if node.dtype else 4
            out = graph.nodes[e.consumer]
            e.cost = edge_cost(share, node.cost_bytes, out.cost_bytes, e.contiguity, dtype_bytes, e.fused_before,
                               e.fused_after, getattr(e, "behind_tiled", False), tgt,
                               kernels_saved=int(k == 0 and not view),
                               memory_freed=(node.bytes or 0) if (k == 0 and not view) else 0)
            ids.append(len(offered))
            offered.append(e.id)
            gain.append(e.cost.gain_us)
            kernels.append(e.cost.kernels)
            memory.append(e.cost.memory)
        first_load[src] = ids[0]
        requires += [(ids[i], ids[(i + 1) % len(ids)]) for i in range(len(ids))] if len(ids) > 1 else []
    conflicts = _offer_stores(graph, collector, tgt, first_load, offered, gain, kernels, memory, requires, no_store)
    problem = solver.Problem(
        num_nodes=len(graph.nodes),
        edges=[(edges[i].src, edges[i].dst) for i in offered],
        gain=gain, kernels=kernels, memory=memory, conflicts=conflicts, requires=requires,
        memory_budget=0 if memory_guard else None, kernel_budget=0, objective=objective)
    if every:  # "all": every legal edge, the load side winning its conflicts
        loads = {k for k, eid in enumerate(offered) if edges[eid].kind == "load"}
        beaten = {k for c in conflicts if loads & set(c) for k in c if k not in loads}
        picked = loads | {k for k in range(len(offered)) if k not in loads and k not in beaten}
        while any(a in picked and b not in picked for a, b in requires):  # a source's stores go together
            picked -= {a for a, b in requires if b not in picked and a not in loads}
        picked = tuple(sorted(picked))
        solution = solver.Solution(picked, sum(gain[k] for k in picked), sum(memory[k] for k in picked),
                                   sum(kernels[k] for k in picked), False, (("all", len(offered)),))
    else:
        solution = solver.solve(problem) if offered else solver.Solution((), 0.0, 0, 0, True, ())
    chosen = set(solution.chosen)
    for k, eid in enumerate(offered):
        e = edges[eid]
        e.chosen = k in chosen
        if e.kind == "load":
            e.reason = e.verdict.reason if e.chosen else (
                f"{e.verdict.reason}; not in the plan (predicted {_fmt(e.cost)} for all its consumers' "
                "edges together, or a budget/conflict)")
        elif e.chosen:
            e.reason = "producer stores into its part of the destination (store side)"
        elif e.dst not in first_load:
            e.reason = f"{e.verdict.reason}; not in the plan (predicted {_fmt(e.cost)}, or a budget)"
    choice = {}
    rows, seen = [], set()
    for e in edges:
        if e.kind != "load":
            continue
        choice[(e.arg, e.consumer_var)] = Decision(e.chosen, e.reason)
    summary = {"predicted": {"gain_us": solution.gain, "kernels": solution.kernels, "memory": solution.memory},
               "solver": {"exact": solution.exact, "components": [list(c) for c in solution.components],
                          "edges_offered": len(offered), "edges": len(edges)}}
    stores: Dict[relax.Var, set] = {}
    kept = _materialised(collector, choice)
    for e in edges:
        if e.kind == "store" and e.chosen and e.consumer is not None:
            if not e.update and e.dest_var not in kept:  # (the conflict with its load edges covers this)
                e.chosen, e.reason = False, "the destination is not materialised"
                continue
            stores.setdefault(e.dest_var, set()).add(e.source_var)
    for e in edges:  # the plan's store refusals into what exists (the store side reports the chosen ones)
        if e.kind == "store" and e.consumer is not None and not e.chosen and (e.update or e.dest_var in kept):
            logger.info("%s -> %s (store side): physical (%s)", e.source_var.name, e.dest_var.name, e.reason)
    p = Plan(graph, [[offered[i] for i in c] for c in conflicts], choice, collector.physical, rows, summary,
             problem, offered, stores=stores, materialised=frozenset(kept) | _parts_of(collector, kept))
    for row in collector.report:
        key = (row["tensor"], row["consumer"])
        if key in seen:
            continue
        seen.add(key)
        rows.append(dict(row))
    # Rows of edges: the plan's word, not the tentative one the walk logged.
    by_key = {(edges[i].arg.name, edges[i].consumer_name): edges[i] for i in range(len(edges))
              if edges[i].kind == "load"}
    for row in rows:
        e = by_key.get((row["tensor"], row["consumer"]))
        if e is not None:
            row["virtual"], row["reason"] = e.chosen, e.reason
    return p


def copy_saved(node: Node, tgt) -> float:
    """What making ``node`` virtual saves (before the reads through it are priced): its copy
    kernel, or for a free view only the target's credit (:func:`vtc_tvm.cost.view_credit`)."""
    return view_credit(tgt, node.of_constants) if node.free_view else copy_saving(node.cost_bytes, tgt)


def _upper_bounds(mod) -> Dict[str, int]:
    """The upper bounds the module's functions declare for their symbolic variables
    (``tir_var_upper_bound``, by name; the largest where two functions disagree)."""
    bounds: Dict[str, int] = {}
    for _, func in mod.functions_items():
        declared = func.attrs.get("tir_var_upper_bound") if isinstance(func, relax.Function) and func.attrs else None
        for name, bound in (declared or {}).items():
            bounds[str(name)] = max(bounds.get(str(name), 0), int(bound))
    return bounds


def _offer_stores(graph, collector, tgt, first_load, offered, gain, kernels, memory, requires,
                  no_store=frozenset()) -> list:
    """Offer the store edges to the solver (appending to its arrays); return the conflict sets.

    A destination whose load edges are offered is virtual or materialised depending on them: a
    store edge into it conflicts with them. One that stays materialised whatever the load side
    does is offered freely (as are the rows of an in-place update), one that does not exist
    even then (composed into its readers) is not. A store edge conflicts with every load edge
    whose consumer would read its source (one physical home: stored into the destination's
    layout, the source is not there to be read). The edges of one source are taken together
    (``requires`` in a cycle: its buffer is gone only when every destination gets its part);
    the copy's read and write of that part are saved, the kernel launch is not (the copy stays
    for the pieces without a producer, or disappears: counted as no change), and the source's
    buffer is freed."""
    edges = graph.edges
    best = {(e.arg, e.consumer_var): Decision(True, "") for e in edges
            if e.kind == "load" and e.legal and e.verdict.take}
    # Offered load edges by the physical tensors their consumers would read: a tensor whose
    # producer stores it elsewhere no longer exists to be read.
    readers: Dict[relax.Var, List[int]] = {}
    for k, eid in enumerate(offered):
        if edges[eid].kind == "load":
            for v in edges[eid].source_vars:
                readers.setdefault(v, []).append(k)
    certain = _materialised(collector, best)
    # Destinations the memory constraint took back (``_MemoryFit``): the sources storing into
    # them keep their own buffers, in every destination (a source's stores go together).
    kept_home = {e.source_var for e in edges if e.kind == "store" and e.consumer is not None and e.legal
                 and e.dest_var in no_store}
    conflicts, groups = [], {}
    for e in edges:
        if e.kind != "store" or e.consumer is None:
            continue
        if not e.legal:
            e.reason = e.verdict.reason
            continue
        if e.source_var in kept_home:
            e.chosen, e.reason = False, "taken back by the memory constraint: the producer keeps its own buffer"
            continue
        dest = e.dest_var
        if not e.update and e.dst not in first_load and dest not in certain:
            e.reason = "the destination is not materialised (it is composed into its readers)"
            continue
        node = graph.nodes[e.src]
        group = groups.setdefault(e.src, [])
        e.cost = EdgeCost((copy_saving(node.cost_bytes, tgt) - copy_saving(0, tgt)) / 2, 0,
                          0 if group else -(node.bytes or 0), "producer writes its part of the destination")
        e.reason = "concat virtual over its inputs instead" if e.dst in first_load else e.verdict.reason
        k = len(offered)
        if not e.update and e.dst in first_load:
            conflicts.append([first_load[e.dst], k])
        # (a consumer reading the source through the destination itself will read the
        # destination once it is materialised: the next fixed-point step composes only up to it)
        conflicts += [[j, k] for j in readers.get(e.source_var, [])
                      if not _composes_through(collector, edges[offered[j]].arg, dest)]
        group.append(k)
        offered.append(e.id)
        gain.append(e.cost.gain_us)
        kernels.append(e.cost.kernels)
        memory.append(e.cost.memory)
    for group in groups.values():
        if len(group) > 1:
            requires += [(group[i], group[(i + 1) % len(group)]) for i in range(len(group))]
    return conflicts


def _composes_through(collector, var, dest) -> bool:
    """Whether the movement result ``var`` is made (through movement ops) from ``dest``."""
    seen, todo = set(), [var]
    while todo:
        v = todo.pop()
        if v.same_as(dest):
            return True
        if v in seen or v not in collector.movement_vars:
            continue
        seen.add(v)
        b = collector.binding_of.get(v)
        todo += [] if b is None else list(relax.analysis.free_vars(b.value))
    return False


def _fmt(cost) -> str:
    return "no cost" if cost is None else f"{cost.gain_us:+.2f} us, {cost.kernels:+d} kernels"


def _occurrences(value) -> list:
    found = []

    def visit(e):
        if isinstance(e, relax.Var):
            found.append(e)

    relax.analysis.post_order_visit(value, visit)
    return found


def _parts_of(collector: Collector, tuples) -> set:
    """The parts (``TupleGetItem`` bindings) of the movement results in ``tuples`` that are
    tuples (a split kept as one multi-output copy: its parts are its buffers)."""
    return {b.var for b in collector.bindings
            if isinstance(b.value, relax.TupleGetItem) and b.value.tuple_value in tuples}


def _materialised(collector: Collector, choice: Dict[tuple, Decision]) -> set:
    """Movement results the emitted module still computes under ``choice``: those read by a
    live binding (a consumer reading them directly, a function output, another one that stays),
    as dead-code elimination would leave them."""
    live = set(collector.outputs)
    for b in reversed(collector.bindings):
        if b.var in collector.movement_vars:
            if b.var in live:
                live.update(collector.kept_reads.get(b.var, []))
            continue
        for v in collector.occurrences(b):
            d = choice.get((v, b.var))
            if d is not None and d.take:
                continue  # read through its mapping: the sources are read instead (below)
            live.add(v)
        for e in collector.edges_into.get(b.var, ()):
            if e.chosen:
                live.update(e.source_vars)
    return {v for v in live if v in collector.movement_vars}


# -- the memory constraint ----------------------------------------------------------------------
MAX_TAKE_BACKS = 8   # walks the memory constraint may take (each walks the module again, no lowering)
MAX_EVALUATED = 24   # groups it may predict without walking, in all


class _MemoryFit:
    """Memory as a constraint of the plan (``memory_guard``) and as its objective.

    At each fixed point, every function's planned bytes are predicted (:mod:`vtc_tvm.memory`:
    TVM's own fusion and planner algorithm on the records the plan leads to, :func:`_records`)
    and compared with stock's. While the plan's exceed stock's, a group of decisions that keep
    tensors alive past their last reader in stock (:func:`_groups`: virtual tensors read through
    those tensors, movement results copied straight from them) is taken back: its tensors stay
    materialised, as stock computes them. Which group: in the order of :func:`_groups` (the
    least time saved per byte kept alive first), the first whose take-back is predicted without
    walking (``_records(..., more_physical=...)``) to lower the planned bytes; the plan is then
    walked, solved and predicted exactly, and kept only if its prediction went down (else the
    next group is tried from the kept plan). Store destinations allocated by their first
    producer are tried the same way, without a walk. Deterministic (ties by node id); at most
    :data:`MAX_TAKE_BACKS` walks and :data:`MAX_EVALUATED` predicted groups, then every group at
    once; if even that does not fit, the module is left as it is (``Plan.unchanged``).
    ``objective="memory"`` goes on while the prediction goes down."""

    def __init__(self, guard: bool, minimise: bool):
        self.guard, self.minimise = guard, minimise
        self.stock: Optional[list] = None
        self.kept: Optional[Tuple[Plan, frozenset, list]] = None  # plan, its physical set, its bytes
        self.ranked: Optional[List["_Group"]] = None
        self.trial: Optional["_Group"] = None
        self.tried: set = set()
        self.walks = 0
        self.evaluated = 0
        self.last_resort = False
        self.no_store: set = set()
        self.unmodelled: set = set()
        self.taken_back: Dict[relax.Var, str] = {}
        self.predictions = 0

    def _predict(self, p: Plan, collector: Collector, more_physical: frozenset = frozenset(),
                 applied: Optional[set] = None) -> list:
        self.predictions += 1
        stayed = _materialised(collector, p.choice)
        stores = p.store_side()
        return [memory.predict(_records(collector, entry, p.choice, stayed, more_physical), stores, applied,
                               self.unmodelled) for entry in collector.functions]

    def _over(self, now) -> bool:
        return any(a is not None and b is not None and a > b for a, b in zip(now, self.stock))

    def check(self, p: Plan, collector: Collector, physical: frozenset):
        """``("done", plan)``, or ``("walk", physical set)`` to walk again with."""
        if not (self.guard or self.minimise):
            return "done", p
        if self.stock is None:
            self.stock = [memory.predict(memory.kernels_of(f, collector.mod)) for f, _ in collector.functions]
        self.applied = set()  # store destinations the store side rewrites in this plan
        self.unmodelled = set()  # and those whose stores the model does not predict
        now = self._predict(p, collector, applied=self.applied)
        if self.unmodelled:
            now = self._unmodelled(p, collector)
        if self.kept is None or _total(now) < _total(self.kept[2]):
            if self.trial is not None:
                for var in self.trial.vars:
                    self.taken_back[var] = self.trial.why
            self.kept = (p, physical, self._stores(p, collector, now))
            self.ranked = None
        elif self.trial is not None:
            self.tried.add(self.trial.vars)
        self.trial = None
        p, physical, now = self.kept
        if not self._over(now) and not self.minimise:
            return "done", self._finish(p)
        if self.ranked is None:
            self.ranked = _groups(p, collector, physical)
        while self.ranked and self.walks < MAX_TAKE_BACKS and self.evaluated < MAX_EVALUATED:
            group = self.ranked.pop(0)
            if group.vars in self.tried or group.vars <= physical:
                continue
            # Predicted first without walking: only a group that lowers the bytes is walked.
            self.evaluated += 1
            if _total(self._predict(p, collector, group.vars)) >= _total(now):
                continue
            group.why = (f"the plan was predicted to plan {_total(now)} B against stock's {_total(self.stock)} B"
                         if self._over(now) else "less memory without it (objective \"memory\")")
            return self._walk(group, physical, collector)
        if self._over(now) and self.guard and not self.last_resort:
            self.last_resort = True  # every group of the kept plan at once
            every = frozenset(v for g in _groups(p, collector, physical) for v in g.vars)
            if not every <= physical:
                return self._walk(_Group(every, 0.0, 1, 0, "no single group was enough: every decision that "
                                                         "keeps tensors alive past stock is taken back"), physical,
                                  collector)
        if self._over(now) and self.guard:
            p.unchanged = True
        return "done", self._finish(p)

    def _walk(self, group: "_Group", physical: frozenset, collector: Collector):
        self.walks += 1
        self.trial = group
        # What the group's tensors read to be computed stays too: physical at once, so that the
        # walk is (usually) a fixed point already.
        return "walk", physical | frozenset(_computed_with(collector, group.vars))

    def _stores(self, p: Plan, collector: Collector, now: list) -> list:
        """Store destinations allocated by their first producer: each one tried (no walk)."""
        for var in _store_units(p):
            if not (self._over(now) or self.minimise):
                break
            if var in self.no_store or var not in p.stores or var.name not in self.applied:
                continue  # (where the store side does not apply, the choice changes nothing)
            # Taken back as ``_offer_stores`` does on a later walk: the sources storing into
            # ``var`` keep their own buffers, in every destination.
            sources = set(p.stores[var])
            edges = [e for e in p.graph.edges if e.kind == "store" and e.chosen and e.source_var in sources]
            saved = [(e, e.chosen, e.reason) for e in edges], dict(p.stores)
            for e in edges:
                e.chosen = False
                e.reason = "taken back by the memory constraint: the producer keeps its own buffer"
            p.stores = {d: srcs - sources for d, srcs in p.stores.items() if srcs - sources}
            trial = self._predict(p, collector)
            if _total(trial) < _total(now):
                self.no_store.add(var)
                self.taken_back[var] = "the producers keep their own buffers"
                now = trial
            else:
                for e, chosen, reason in saved[0]:
                    e.chosen, e.reason = chosen, reason
                p.stores = saved[1]
        return now

    def _unmodelled(self, p: Plan, collector: Collector) -> list:
        """Take back the stores into destinations :mod:`vtc_tvm.memory` does not predict (FuseOps
        makes their copy a multi-output kernel, e.g. a shuffle fused with the next split: on
        ShuffleNetV2 those planned 512 B more than predicted), so that the prediction is the
        planner's number; the new prediction."""
        for var in sorted((d for d in p.stores if d.name in self.unmodelled),
                          key=lambda d: p.graph.by_var[d].id if d in p.graph.by_var else len(p.graph.nodes)):
            sources = set(p.stores.get(var, ()))
            for e in p.graph.edges:
                if e.kind == "store" and e.chosen and e.source_var in sources:
                    e.chosen = False
                    e.reason = ("taken back by the memory constraint: the producer keeps its own buffer (the "
                                "memory model does not predict stores into a multi-output copy)")
            p.stores = {d: srcs - sources for d, srcs in p.stores.items() if srcs - sources}
            self.no_store.add(var)
            self.taken_back[var] = "the producers keep their own buffers"
        self.applied, self.unmodelled = set(), set()
        return self._predict(p, collector, applied=self.applied)

    def _finish(self, p: Plan) -> Plan:
        if self.stock is not None:
            m = p.summary.setdefault("memory", {})
            planned = self.stock if p.unchanged else self.kept[2] if self.kept else None
            m.update(stock_bytes=self.stock, planned_bytes=planned,
                     taken_back=[v.name for v in self.taken_back], walks=self.walks, predictions=self.predictions)
            if p.unchanged:
                m["unchanged"] = "no plan tried is predicted to plan at most stock's memory"
        return p


def _total(values) -> int:
    return sum(v for v in values if v is not None)


def _store_units(p: Plan) -> List[relax.Var]:
    """Destinations of the plan's stores (:attr:`Plan.stores`) with several sources, whose first
    producer allocates them before the others run (the destination then holds more than that
    producer's output until the last one); by node id (deterministic)."""
    units = [d for d, srcs in p.stores.items() if len(srcs) > 1]
    return sorted(units, key=lambda d: p.graph.by_var[d].id if d in p.graph.by_var else len(p.graph.nodes))


@dataclass
class _Group:
    """Decisions that keep the same tensors alive past their last reader in stock: the movement
    results (``vars``) that would stay materialised, as stock computes them, to take them back."""

    vars: frozenset
    value: float     # predicted time they save
    extends: int     # bytes x bindings they keep alive beyond stock (a ranking)
    first: int       # lowest node id (ties)
    why: str = ""


def _groups(p: Plan, collector: Collector, physical) -> List[_Group]:
    """The groups of :class:`_Group` of ``p``, least valuable per byte kept alive first.

    A decision keeps a planned tensor ``s`` alive when something reads ``s`` after its last
    reader in stock: a consumer reading a virtual tensor through its mapping (taken back by
    materialising that virtual tensor), or a movement result copied straight from ``s`` through
    a virtual input (taken back by materialising that input). Decisions sharing such a tensor
    form one group: taking back only some of them would keep it alive anyway."""
    graph = p.graph
    stayed = _materialised(collector, p.choice)
    position, last_read = {}, {}
    for func, bindings in collector.functions:
        for i, (b, _) in enumerate(bindings):
            position[b.var] = i
            for v in relax.analysis.free_vars(b.value):
                last_read[v] = i
        for v in relax.analysis.free_vars(func.body.body):
            last_read[v] = len(bindings)  # returned: never planned

    decisions = []  # (var to materialise, value, {extended source: until})

    def extended(sources, end) -> dict:
        return {s: end for s in set(sources) if s in position and last_read.get(s, end) < end}

    loads: Dict[int, List[Edge]] = {}
    for e in graph.edges:
        if e.chosen and e.kind == "load" and e.cost is not None:
            loads.setdefault(e.src, []).append(e)
    for src, edges in loads.items():
        end = max(position.get(e.consumer_var, -1) for e in edges)
        decisions.append((graph.nodes[src].var, sum(e.cost.gain_us for e in edges),
                          extended([s for e in edges for s in e.source_vars], end)))
    for m in collector.copies:
        if m not in stayed:
            continue
        ext = extended(collector.kept_reads.get(m, ()), position.get(m, -1))
        for v in relax.analysis.free_vars(collector.binding_of[m].value):
            if v in collector.movement_vars and v not in physical and isinstance(v.ty, relax.TensorType):
                decisions.append((v, copy_saving(_bytes(v), collector.target), ext))
    # (Decisions that keep no planned tensor alive can still change fusion: each its own group.)
    decisions = [d for d in decisions if d[0] not in physical]
    # Union-find over the tensors kept alive.
    parent = list(range(len(decisions)))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: Dict[relax.Var, int] = {}
    for i, (_, _, ext) in enumerate(decisions):
        for s in ext:
            if s in owner:
                parent[find(i)] = find(owner[s])
            else:
                owner[s] = i
    members: Dict[int, List[int]] = {}
    for i in range(len(decisions)):
        members.setdefault(find(i), []).append(i)
    # A split is computed whole (one kernel, as stock): the parts of one go together.
    parts: Dict[relax.Var, List[relax.Var]] = {}
    for b in collector.bindings:
        if isinstance(b.value, relax.TupleGetItem) and b.var in collector.movement_vars:
            parts.setdefault(b.value.tuple_value, []).append(b.var)
    groups = []
    for idx in members.values():
        vars_ = {decisions[i][0] for i in idx}
        for v in list(vars_):
            value = collector.binding_of[v].value if v in collector.binding_of else None
            if isinstance(value, relax.TupleGetItem):
                vars_.update(parts.get(value.tuple_value, ()))
        vars_ = frozenset(vars_)
        until: Dict[relax.Var, int] = {}
        for i in idx:
            for s, end in decisions[i][2].items():
                until[s] = max(until.get(s, end), end)
        value = sum({decisions[i][0]: decisions[i][1] for i in idx}.values())
        area = sum(_bytes(s) * (end - last_read.get(s, end)) for s, end in until.items())
        first = min(graph.by_var[v].id if v in graph.by_var else len(graph.nodes) + position.get(v, 0) for v in vars_)
        groups.append(_Group(vars_, value, area, first))
    groups.sort(key=lambda g: (g.extends <= 0, g.value / max(g.extends, 1), g.first))
    return groups


def _bytes(var) -> int:
    sizes = memory.var_bytes(var)
    return sum(n for n, _ in sizes) if sizes else 0


def _copy_pattern(mapping) -> int:
    # once per structure, in the caches candidates.clear_caches() forgets
    return cached_op_pattern(copy_kernel(mapping))


def _records(collector: Collector, entry, choice: Dict[tuple, Decision], stayed: set,
             more_physical: frozenset = frozenset()) -> memory.Function:
    """The records (:class:`vtc_tvm.memory.Kernel`) of one function as the emitter would write
    it under ``choice``: dead movement results gone, materialised ones computed (by a direct
    copy from their sources where composition reached past their inputs), rewritten consumers
    reading the virtual tensors' sources and hoisted to just after their last input (as
    :func:`vtc_tvm.transform._hoist` does).

    ``more_physical``: as if these virtual tensors were materialised too (what a walk with them
    physical would give, without walking): their consumers read them, and what composed
    through one of them reads it instead of its sources."""
    func, bindings = entry
    kernels: List[memory.Kernel] = []
    rewritten = set()
    through = _Through(collector, more_physical)
    if more_physical:
        stayed = set(stayed) | _computed_with(collector, more_physical)
    for b, dataflow in bindings:
        var, value = b.var, b.value
        if var in collector.update_records:
            update, pattern = collector.update_records[var]
            kernels.append(memory.kernel_of(var, update, None, dataflow, pattern=pattern))
        elif var in collector.movement_vars:
            if var not in stayed:
                continue  # no reader left: dead code
            if var in collector.copies:
                kernels.append(memory.Kernel(var, tuple(through(var, collector.kept_reads[var])),
                                             _copy_pattern(collector.copies[var]), dataflow=dataflow,
                                             name="vtc_copy"))
            else:
                kernels.append(collector.record(b, dataflow))
        elif isinstance(b, relax.MatchCast):
            kernels.append(collector.record(b, dataflow))
        else:
            taken = [e for e in collector.edges_into.get(var, ())
                     if e.arg not in more_physical and (choice.get((e.arg, var)) or Decision(False, "")).take]
            if taken and isinstance(value, relax.Call):
                via = {e.arg: e for e in taken}
                reads = []
                for a in collector.record(b, dataflow).reads:
                    reads += through(a, via[a].source_vars) if a in via else [a]
                pattern = taken[-1].fused_after if taken[-1].fused_after is not None else OPAQUE
                kernels.append(memory.Kernel(var, tuple(reads), pattern, dataflow=dataflow, name=f"{_op_name(value)}_vtc"))
                rewritten.add(var)
            else:
                kernels.append(collector.record(b, dataflow))
    if more_physical:
        kernels = _dead_movement_removed(kernels, collector, list(relax.analysis.free_vars(func.body.body)))
    return memory.Function(_hoisted(kernels, rewritten), list(relax.analysis.free_vars(func.body.body)),
                           list(func.params))


def _computed_with(collector: Collector, tensors) -> set:
    """The movement results computed to compute ``tensors`` (a reshape-like op reads its
    input, which then stays too; a direct copy reads physical sources)."""
    found, todo = set(), list(tensors)
    while todo:
        v = todo.pop()
        if v in collector.movement_vars and v not in found:
            found.add(v)
            todo += collector.kept_reads.get(v, ())
    return found


class _Through:
    """Reads of a tensor composed through a movement result that is made physical: that
    result instead of the sources it composes to."""

    def __init__(self, collector: Collector, physical: frozenset):
        self.collector, self.physical = collector, physical
        self.memo: Dict[relax.Var, frozenset] = {}

    def ancestors(self, var) -> frozenset:
        """Movement results ``var`` composes through (not past a physical one)."""
        if var not in self.memo:
            self.memo[var] = frozenset()  # (cycles cannot happen; guards recursion anyway)
            found = set()
            value = self.collector.binding_of[var].value if var in self.collector.binding_of else None
            for v in (relax.analysis.free_vars(value) if value is not None else ()):
                if v in self.collector.movement_vars and v not in self.collector.physical:
                    found.add(v)
                    if v not in self.physical:
                        found |= self.ancestors(v)
            self.memo[var] = frozenset(found)
        return self.memo[var]

    def __call__(self, var, reads) -> list:
        reads = list(reads)
        if not self.physical:
            return reads
        for v in sorted(self.ancestors(var) & self.physical, key=lambda v: v.name):
            via = set(self.collector.sources.get(v, ()))
            if via & set(reads):
                reads = [r for r in reads if r not in via] + [v]
        return reads


def _dead_movement_removed(kernels: List[memory.Kernel], collector: Collector, outputs) -> List[memory.Kernel]:
    """Movement records nothing reads any more (dead code elimination)."""
    live = set(outputs)
    keep = []
    for k in reversed(kernels):
        if k.var in collector.movement_vars and k.var not in live and k.var not in collector.update_records:
            continue
        keep.append(k)
        live.update(k.reads if k.alias is None else relax.analysis.free_vars(k.alias))
    return keep[::-1]


def _hoisted(kernels: List[memory.Kernel], rewritten: set) -> List[memory.Kernel]:
    """:func:`vtc_tvm.transform._hoist` on records: each rewritten consumer moves up to just
    after the last record it reads (within its dataflow block; a ``match_cast`` stays above)."""
    out: List[memory.Kernel] = []
    start = 0
    for k in kernels:
        if out and out[-1].dataflow != k.dataflow:
            start = len(out)
        at = len(out)
        if k.var in rewritten and k.dataflow:
            reads = set(k.reads)
            at = max((i + 1 for i in range(start, len(out))
                      if out[i].var in reads or out[i].alias is not None and out[i].match_cast), default=start)
        out.insert(at, k)
    return out
