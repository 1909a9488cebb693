"""Candidates: the opportunity graph of one Relax module, built once.

Nodes are tensors (Relax variables); an edge ``u -> v`` says that eliminating one movement op
lets ``u`` be a view of ``v``:

* load side: ``u`` is a movement result (a registered rule, or a ``call_tir`` of a pure index
  copy) and one of its consumers reads its physical sources through the composed mapping
  instead (an :class:`Edge` of kind ``"load"`` per (virtual tensor, consumer) pair);
* store side: ``u`` is a source of a movement result ``v`` that is materialised (a concat, a
  permute, a channel shuffle, a split or slice whose parts must exist, a KV append), produced by
  a kernel that FuseOps does not fuse into the copy, and read by nothing else: its producer
  writes each element at its place in ``v`` (kind ``"store"``, :func:`store_edges`); likewise
  the rows of an in-place update. The emitter materialises a chosen destination with a copy
  kernel of ours marked with the plan's choice (:func:`vtc_tvm.stores.mark_store_plan`); the
  rewrite itself runs after ``FuseTIR`` (:mod:`vtc_tvm.stores`), which executes that choice.

:class:`Walker` is the pattern half of the pass, shared by the collector (here) and the
emitter (:mod:`vtc_tvm.transform`): which bindings are movement ops, how chains compose, which
consumers can be rewritten. It asks :meth:`Walker.decide` about every edge; :class:`Collector`
records the edge and its rewrite, the emitter looks the plan's decision up.

Every rewrite of a consumer (and DLight's verdict on it) is computed once per (structural hash
of the consumer PrimFunc, parameter, mapping, target) in :data:`REWRITES`, so identical layers
(32 decoder layers of a Llama) cost one layer, and the emitter reuses the collector's work.

Limits: 1. a tensor is a view of one composed mapping over its sources (chains compose as far as
:func:`vtc_tvm.strategy.pins_too_much` allows); which intermediate movement results stay
physical is the plan's fixed point (:mod:`vtc_tvm.plan`), re-walking with cached rewrites.
2. The store edges are predictions of what :mod:`vtc_tvm.stores` can rewrite after fusion:
whether FuseOps fuses a producer into its copy is predicted from op patterns
(:func:`fuses_into_copy`); a producer that DLight cannot schedule redirected, or whose output
fusion leaves read elsewhere, stays physical there (the refusal is reported).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple, Union

import tvm
import tvm_ffi
from tvm import relax
from tvm.ir import Op
from tvm.relax.expr_functor import PyExprMutator

from . import inplace as inplace_updates
from .analysis import (BROADCAST, COMM_REDUCE, OUT_EWISE_FUSABLE, call_tir_kernel, contiguity, index_copy_mapping,
                       index_copy_mappings, op_pattern)
from .mapping import VirtualTensor, is_static, lowering_safe
from .rewrite import NotRewritable, best_schedulable, check_schedulable, rewritten_forms
from .rules import Unsupported, get_rule
from .stores import is_view, mark_store_plan
from .strategy import Decision, pins_too_much

logger = logging.getLogger("vtc_tvm")

CALL_TIR = Op.get("relax.call_tir")
# Reshape-like ops stay as they are when materialised: stock TVM turns them into free views.
VIEW_OPS = {"relax.reshape", "relax.flatten", "relax.squeeze", "relax.expand_dims"}
# Ops whose stock legalization is missing or broken in TVM 0.27: materialise our copy kernel.
OWN_COPY_OPS = {"relax.nn.pixel_shuffle"}


# -- caches ---------------------------------------------------------------------------------------
class _Bounded(OrderedDict):
    """A small LRU dict (the caches live as long as the process)."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def put(self, key, value):
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)
        return value


REWRITES = _Bounded(4096)    # (consumer hash, param, mapping key, target) -> PrimFunc | NotRewritable
CONTIGUITY = _Bounded(4096)  # mapping key -> Contiguity


def mapping_key(mapping) -> int:
    """Structural hash of the copy kernel that materialises ``mapping``: equal for equal
    mappings of different layers (the buffers are fresh, the structure is the same)."""
    key = getattr(mapping, "_vtc_key", None)
    if key is None:
        key = tvm_ffi.structural_hash(mapping.to_prim_func("vtc_copy"))
        mapping._vtc_key = key
    return key


def cached_contiguity(mapping):
    key = mapping_key(mapping)
    if key not in CONTIGUITY:
        CONTIGUITY.put(key, contiguity(mapping))
    return CONTIGUITY[key]


def cached_rewrite(func, index, mapping, name, target):
    """The schedulable rewrite of ``func`` reading parameter ``index`` through ``mapping``
    (:func:`rewritten_forms` + :func:`best_schedulable`), or the :class:`NotRewritable` that
    says why there is none. Computed once per structure."""
    key = (tvm_ffi.structural_hash(func), index, mapping_key(mapping), str(target))
    if key not in REWRITES:
        try:
            REWRITES.put(key, best_schedulable(func, rewritten_forms(func, index, mapping, name, target), target))
        except NotRewritable as err:
            REWRITES.put(key, err)
    return REWRITES[key]


# -- the graph ------------------------------------------------------------------------------------
@dataclass
class Node:
    """A tensor of the graph."""

    id: int
    var: relax.Var
    name: str             # the op that made it, numbered: "permute_dims#3"
    op: str
    shape: tuple
    dtype: str
    bytes: Optional[int]  # None for symbolic shapes
    movement: bool = False
    position: int = 0     # binding order within its function
    onnx_node: Optional[str] = None


@dataclass
class Edge:
    """One elimination: ``src`` becomes a view of ``dst`` (load side: ``dst`` is the first data
    source of ``src``'s mapping, the others are listed in ``sources``)."""

    id: int
    kind: str                   # "load" | "store"
    src: int                    # node ids
    dst: int
    consumer: Optional[int]     # the consumer binding's node (load side)
    consumer_name: str
    mapping: object = None      # Mapping (load side) or the slice offsets (store side)
    contiguity: object = None
    pattern: Optional[int] = None
    legal: bool = True
    verdict: Optional[Decision] = None  # the strategy's / cost model's word on it alone
    rewritten: object = None    # PrimFunc
    fused_before: Optional[int] = None  # op pattern of the consumer before and after
    fused_after: Optional[int] = None
    sources: Tuple[int, ...] = ()
    cost: object = None         # cost.EdgeCost
    chosen: bool = False
    reason: str = ""


@dataclass
class Graph:
    """The opportunity graph of a module (all its Relax functions)."""

    nodes: List[Node] = field(default_factory=list)
    edges: List[Edge] = field(default_factory=list)
    by_var: Dict[relax.Var, Node] = field(default_factory=dict)
    # node id -> vars its emitted binding reads when it stays (movement results), and the uses
    # that make it physical whatever the plan (function outputs, unrewritable consumers, ...)
    escapes: Dict[int, List[str]] = field(default_factory=dict)
    # movement node -> (node read by a movement op composed through it?)
    reads: Dict[int, List[int]] = field(default_factory=dict)
    split_of: Dict[int, int] = field(default_factory=dict)
    decisions: List[dict] = field(default_factory=list)  # rows for edges decided without the plan
    _ops: Dict[str, int] = field(default_factory=dict)

    def node(self, var, value=None, position=0) -> Node:
        if var in self.by_var:
            return self.by_var[var]
        op = _op_name(value) or (value.args[0].name_hint if isinstance(value, relax.Call)
                                 and value.op.same_as(CALL_TIR) else "param" if value is None else type(value).__name__)
        short = op.split(".")[-1]
        k = self._ops.get(short, 0)
        self._ops[short] = k + 1
        ty = var.ty
        shape, dtype, size = (), "", None
        if isinstance(ty, relax.TensorType):
            dtype = str(ty.dtype)
            if isinstance(ty.shape, relax.ShapeExpr):
                shape = tuple(int(d) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in ty.shape.values)
                if all(isinstance(d, int) for d in shape):
                    size = _prod(shape) * max(tvm.runtime.DataType(dtype).bits // 8, 1) if dtype else None
        node = Node(len(self.nodes), var, f"{short}#{k}" if value is not None else var.name, op, shape, dtype,
                    size, position=position, onnx_node=_onnx_name(var))
        self.nodes.append(node)
        self.by_var[var] = node
        return node

    def constant(self) -> Node:
        """The node a mapping with no data source is a view of (constants only)."""
        for n in self.nodes:
            if n.op == "constant":
                return n
        node = Node(len(self.nodes), None, "constant", "constant", (), "", 0)
        self.nodes.append(node)
        return node

    def load_edges_of(self, node_id) -> List[Edge]:
        return [e for e in self.edges if e.kind == "load" and e.src == node_id]


def _prod(xs):
    out = 1
    for x in xs:
        out *= x
    return out


def _onnx_name(var) -> Optional[str]:
    """``from_onnx`` keeps no node names on Relax variables or spans in TVM 0.27 (it names
    variables ``lv<N>``/``gv<N>``); only graph inputs keep their ONNX names (as parameters)."""
    return None


def _op_name(value):
    return value.op.name if isinstance(value, relax.Call) and isinstance(value.op, Op) else None


# -- the walk shared by the collector and the emitter --------------------------------------------
class Walker(PyExprMutator):
    """Movement bindings, their composition and the rewritable consumers (see the module
    docstring). ``physical``: movement results that stay materialised (their consumers read
    them directly and composition does not pass through them). Subclasses are decorated with
    ``tvm.relax.expr_functor.mutator`` (a decorated class cannot be subclassed)."""

    def __init__(self, mod, ops, target, inplace=(), physical=frozenset(), report=None):
        super().__init__(mod)
        self.mod, self.ops, self.target = mod, ops, target
        self.inplace = set(inplace)
        self.physical = physical
        self.report = report if report is not None else []
        self.movement_vars = set()
        self.virtual: Dict[relax.Var, Union[VirtualTensor, List[VirtualTensor]]] = {}

    # -- driver --------------------------------------------------------------------------------
    def transform(self) -> tvm.IRModule:
        for gv, func in self.mod.functions_items():
            # Primitive functions are FuseOps groups: their bodies belong to FuseTIR.
            if isinstance(func, relax.Function) and not (func.attrs and func.attrs.get("Primitive")):
                self.virtual, self.rewritten = {}, set()
                self.uses = use_counts(func)
                self.begin_function(func)
                self.builder_.update_func(gv, self.finish_function(self.visit_expr(func)))
        return self.builder_.get()

    def begin_function(self, func):
        pass

    def finish_function(self, func):
        return func

    def log(self, var, consumer, take, reason):
        entry = {"tensor": var.name, "consumer": consumer, "virtual": take, "reason": reason}
        self.report.append(entry)

    def decide(self, arg, var, vt, func, index, name, pattern) -> Tuple[Decision, Optional[tvm.tirx.PrimFunc]]:
        """Whether consumer ``var`` (PrimFunc ``func``, kernel ``name``) reads its parameter
        ``index`` (the virtual tensor ``arg``) through ``vt``; with the rewrite if so."""
        raise NotImplementedError

    def decide_inplace(self, cache, call, var, rows, kernel) -> bool:
        return True

    def planned_stores(self, var) -> set:
        """Sources whose producers the plan lets store into the movement result (or in-place
        update) ``var``; the emitter marks its kernel with them."""
        return set()

    # -- pattern: which bindings are movement ops ---------------------------------------------
    def movement(self, var, value) -> Optional[Union[VirtualTensor, List[VirtualTensor]]]:
        if isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var):
            parts = self.virtual.get(value.tuple_value)
            return parts[value.index] if isinstance(parts, list) else None
        if not isinstance(value, relax.Call) or not isinstance(value.op, Op):
            return None
        if value.op.same_as(CALL_TIR):
            kernel = call_tir_kernel(self.mod, value)
            if kernel is not None and isinstance(value.ty, relax.TupleType):  # a legalized split
                mappings = index_copy_mappings(kernel[1], len(value.ty.fields))
                return None if mappings is None else [VirtualTensor(m, kernel[2]) for m in mappings]
            mapping = index_copy_mapping(kernel[1]) if kernel is not None else None
            return None if mapping is None else VirtualTensor(mapping, kernel[2])
        name = value.op.name
        rule = get_rule(name)
        if rule is None or (self.ops is not None and name not in self.ops):
            return None
        try:
            return rule(self._with_literal_tuples(value))
        except Unsupported as err:
            self.log(var, name, False, f"{name} left as is: {err}")
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

    def composed(self, var, vt):
        """``vt`` (or each part of a split) over physical tensors where possible; None when a
        symbolic dimension could not be learnt from the sources (logged)."""
        parts = vt if isinstance(vt, list) else [vt]
        out = []
        for part in parts:
            try:
                composed = self._compose(part)
                check_symbols(composed)
            except Unsupported:
                composed = part  # read through the direct sources instead
                try:
                    check_symbols(part)
                except Unsupported as err:
                    self.log(var, _op_name(self.lookup_binding(var)) or "movement", False, f"left as is: {err}")
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
            if isinstance(inner, VirtualTensor) and self.visible(inner):
                further = mapping.compose(j, inner.mapping)
                if not pins_too_much(further):
                    mapping, sources = further, sources[:j] + sources[j + 1:] + list(inner.sources)
                    continue
            j += 1
        return VirtualTensor(mapping, sources)

    def visible(self, vt: VirtualTensor) -> bool:
        """Outside a dataflow block, a dataflow block's internal tensors cannot be read."""
        return self.builder_.current_block_is_dataflow() or not any(
            isinstance(s, relax.DataflowVar) for s in vt.sources)

    # -- rewrite -------------------------------------------------------------------------------
    def visit_var_binding_(self, binding):
        value = binding.value
        if self.inplace and self._update_in_place(binding):
            return
        vt = self.movement(binding.var, value)
        composed = None if vt is None else self.composed(binding.var, vt)
        if composed is not None:
            self.movement_vars.add(binding.var)
            if binding.var not in self.physical:  # consumers read through it
                self.virtual[binding.var] = composed
            self.on_movement(binding, vt, composed)
            planned = self.planned_stores(binding.var)
            if planned or (not isinstance(vt, list) and materialise_directly(value, vt, composed)):
                self._emit_copy(binding, composed, planned)
                return
            super().visit_var_binding_(binding)
            return
        if isinstance(value, relax.Call):
            new_value = self._rewrite_consumer(binding.var, value)
            if new_value is not None:
                self.emit_same_var(binding, new_value)
                self.rewritten.add(binding.var)
                return
        super().visit_var_binding_(binding)

    def on_movement(self, binding, vt, composed):
        pass

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
            self.log(cache, call.op.name, False, "in-place update refused: the parameter is read elsewhere")
            return False
        try:
            kernel, args, at = inplace_updates.inplace_update(call, cache.name)
            check_schedulable(kernel, self.target)
        except (Unsupported, NotRewritable) as err:
            self.log(cache, call.op.name, False, f"in-place update refused: {err}")
            return False
        if not self.decide_inplace(cache, call, binding.var, args[0], kernel):
            return False
        if self.planned_stores(binding.var):
            kernel = mark_store_plan(kernel, {0})  # the rows' producer stores into the update
        gv = self.builder_.add_func(kernel, f"{call.op.name.split('.')[-1]}_inplace")
        self.emit_same_var(binding, relax.call_tir_inplace(
            gv, [self.visit_expr(a) for a in args], [at], out_ty=binding.var.ty))
        self.log(cache, call.op.name, True, "updated in place: only the new elements are written")
        return True

    def _emit_copy(self, binding, vt, planned=()):
        """Materialise ``vt`` (a list of them: the parts of a split, one kernel) with a copy
        kernel of ours, marked with the store edges ``planned`` (source vars) the plan chose."""
        func, sources = copy_kernel(vt)
        if planned:
            func = mark_store_plan(func, {k for k, s in enumerate(sources) if s in planned})
        gv = self.builder_.add_func(func, "vtc_copy")
        out_ty = list(binding.var.ty.fields) if isinstance(vt, list) else binding.var.ty
        call = relax.call_tir(gv, [self.visit_expr(s) for s in sources], out_ty=out_ty)
        self.emit_same_var(binding, call)

    def emit_same_var(self, binding, new_value):
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
        virtual_args = [a for a in tensor_args(call) if isinstance(self.virtual.get(a), VirtualTensor)]
        if not virtual_args:
            return None
        found = self._consumer_prim_func(call) if shaped(var.ty) else None
        if found is None:
            consumer = call.op.name if isinstance(call.op, Op) else str(call.op)
            for a in virtual_args:
                self.log(a, consumer, False, "consumer is not a rewritable call_tir")
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
            if not self.visible(vt):
                self.log(arg, name, False, "consumer outside the dataflow block that defines the sources")
                new_args.append(arg)
                continue
            decision, rewritten = self.decide(arg, var, vt, func, len(new_args), name, pattern)
            self.log(arg, name, decision.take, decision.reason)
            if decision.take:
                func = rewritten
                new_args.extend(vt.sources)
                changed = True
            else:
                new_args.append(arg)
        if not changed:
            return None
        gv = self.builder_.add_func(func, f"{name}_vtc")
        out_ty = list(var.ty.fields) if isinstance(var.ty, relax.TupleType) else var.ty
        return relax.call_tir(gv, [self.visit_expr(a) for a in new_args], out_ty=out_ty)


def copy_kernel(vt) -> tuple:
    """``(PrimFunc, its input vars)`` materialising ``vt``, or each part of a list of them into
    one output each (a split: one kernel, as stock's)."""
    if not isinstance(vt, list):
        return vt.mapping.to_prim_func("vtc_copy"), list(vt.sources)
    from tvm import te

    sources = []
    for part in vt:
        sources += [s for s in part.sources if not any(s.same_as(t) for t in sources)]
    holders = [te.placeholder([int(d) if isinstance(d, tvm.tirx.IntImm) else d for d in s.ty.shape],
                              str(s.ty.dtype), f"vtc_copy_in{j}") for j, s in enumerate(sources)]
    def body(part):
        at = [next(j for j, t in enumerate(sources) if t.same_as(s)) for s in part.sources]
        return lambda *v: part.mapping.load(v, lambda j, idx: holders[at[j]](*[lowering_safe(i) for i in idx]))

    outs = [te.compute([int(d) if isinstance(d, tvm.tirx.IntImm) else d for d in part.mapping.shape], body(part),
                       name=f"vtc_copy_{k}") for k, part in enumerate(vt)]
    return te.create_prim_func(holders + outs).without_attr("global_symbol"), sources


def store_edges(dest_var, composed, value_of, uses, movement_vars, readers, pattern_of) -> List[tuple]:
    """The store candidates into the movement result ``dest_var`` (``composed``: its composed
    virtual tensor, or a split's list): ``(source var, reason)`` per data source, reason None
    for a candidate. A source is one when a kernel produces it (not a movement op, not a
    parameter), only movement ops read it (``readers``: the vars of the bindings that read
    it, None for a function output; several, e.g. two slices, when its parts go to several
    destinations), and FuseOps does not fuse its producer into the copy
    (:func:`fuses_into_copy`); kernel-made sources that fail the last two are listed with the
    reason."""
    parts = composed if isinstance(composed, list) else [composed]
    if not all(is_static(p.mapping.shape) for p in parts) or (len(parts) == 1 and is_view(parts[0].mapping)) \
            or _op_name(value_of(dest_var)) in VIEW_OPS:
        return []  # (a reshape-like op stays an op: what it reads is the copy, if any)
    found = []
    for part in parts:
        for j, s in enumerate(part.sources):
            if j not in part.mapping.data_sources() or not isinstance(s, relax.DataflowVar) \
                    or any(s.same_as(f) for f, _ in found):
                continue
            value = value_of(s)
            if not isinstance(value, relax.Call) or s in movement_vars:
                continue
            read_by = readers(s)
            if read_by is None or not read_by or any(r not in movement_vars for r in read_by):
                reason = "read elsewhere too: it keeps its own buffer (one store layout per tensor)"
            elif fuses_into_copy(value, value_of, uses, pattern_of):
                reason = "FuseOps fuses its producer into the copy (one kernel, as stock)"
            else:
                reason = None
            found.append((s, reason))
    return found


def fuses_into_copy(value, value_of, uses, pattern_of) -> bool:
    """Whether FuseOps puts the producer ``value`` in the group of the (injective) copy that
    reads its result: element-wise, broadcast and injective ops fuse into an injective consumer,
    unless they are the epilogue of a GEMM/conv (OutEWiseFusable) that they fuse into first;
    reductions, GEMMs/convs and opaque kernels end their group. Predicted from op patterns
    (:func:`vtc_tvm.analysis.op_pattern`); ``pattern_of(call)`` is None when unknown (then it is
    taken as standing alone: the store side checks after fusion)."""
    seen = 0
    while seen < 16:
        seen += 1
        pattern = pattern_of(value)
        if pattern is None or pattern >= COMM_REDUCE:
            return False
        if pattern > BROADCAST:
            return True
        # An element-wise/broadcast op: the epilogue of a tiled producer of one of its inputs?
        inner = [value_of(a) for a in tensor_args(value) if isinstance(a, relax.DataflowVar) and uses.get(a, 0) == 1]
        inner = [v for v in inner if isinstance(v, relax.Call)]
        if any(pattern_of(v) == OUT_EWISE_FUSABLE for v in inner):
            return False
        chain = [v for v in inner if pattern_of(v) is not None and pattern_of(v) <= BROADCAST]
        if len(chain) != 1:
            return True
        value = chain[0]
    return True


def materialise_directly(value, vt, composed) -> bool:
    """If this movement op stays, should it be one copy kernel from the physical sources?

    Yes where composition reached past its own inputs (one kernel instead of a chain) or its
    stock legalization is broken; reshape-like ops stay ops (stock makes them free views).
    """
    name = _op_name(value)
    if name in OWN_COPY_OPS:
        return True
    if name in VIEW_OPS:
        return False
    return len(composed.sources) != len(vt.sources) or any(
        not a.same_as(b) for a, b in zip(composed.sources, vt.sources))


def check_symbols(vt: VirtualTensor):
    """A symbolic dimension of a virtual tensor must be a dimension of one of its sources:
    otherwise neither a copy kernel nor a rewritten consumer could learn its value."""
    defined = [d for j in range(len(vt.mapping.sources)) for d in vt.mapping.source_shape(j)
               if isinstance(d, tvm.ir.Var)]
    for symbol in vt.mapping.symbols:
        if not any(symbol.same_as(d) for d in defined):
            raise Unsupported(f"symbolic dimension {symbol} is not a dimension of any source")


def shaped(ty) -> bool:
    """A tensor (or tuple of tensors) type with known shapes: what call_tir can produce."""
    if isinstance(ty, relax.TupleType):
        return all(shaped(f) for f in ty.fields)
    return isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr)


def use_counts(func) -> dict:
    counts = {}

    def visit(e):
        if isinstance(e, relax.Var):
            counts[e] = counts.get(e, 0) + 1

    relax.analysis.post_order_visit(func.body, visit)
    return counts


def tensor_args(call):
    """Variables among the arguments, including those inside tuple arguments (call_tir's and
    call_dps_packed's inputs)."""
    found = []
    for a in call.args:
        found += list(a.fields) if isinstance(a, relax.Tuple) else [a]
    return [a for a in found if isinstance(a, relax.Var)]
