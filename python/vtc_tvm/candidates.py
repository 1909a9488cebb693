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
(32 decoder layers of a Llama) cost one layer, and the emitter reuses the collector's work. So
are the walk's own facts (a built-in rule's mapping per call structure, a legalization per call,
a composition per pair of mappings, copy kernels, op patterns): see the caches below.

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
from typing import Callable, Dict, List, Optional, Tuple, Union

import tvm
import tvm_ffi
from tvm import relax
from tvm.ir import Op
from tvm.relax.expr_functor import PyExprMutator

from . import inplace as inplace_updates
from .analysis import (BROADCAST, COMM_REDUCE, INJECTIVE, OUT_EWISE_FUSABLE, VIEW_OPS, call_tir_kernel, contiguity,
                       index_copy_mapping, index_copy_mappings, op_pattern)
from .cost import largest_bytes
from .mapping import Mapping, Piece, VirtualTensor, _i64, _rebind_loads, dim, _substitute, is_static, lowering_safe, new_buffer
from .rewrite import NotRewritable, best_schedulable, check_schedulable, clear_schedule_cache, rewritten_forms
from .rules import Unsupported, get_rule, is_builtin_rule
from .stores import is_view, mark_store_plan
from .strategy import Decision, pins_too_much

logger = logging.getLogger("vtc_tvm")

CALL_TIR = Op.get("relax.call_tir")
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
# The walk's own facts, derived once: per structure where the result names nothing of the
# module (mappings), per object where it does (a legalized PrimFunc names its parameters after
# the call's variables, and those names reach the emitted rewrites). Identical layers, the
# planner's re-walks and the emitter's walk look them up instead of recomputing them.
MOVEMENTS = _Bounded(4096)   # call key -> (mappings, where each source is among the args) | Unsupported
INDEX_COPIES = _Bounded(4096)  # PrimFunc hash -> Mapping | None (call_tir copy kernels)
PATTERNS = _Bounded(4096)    # PrimFunc hash -> op pattern
_BY_ID = _Bounded(16384)     # ids of objects -> (objects, derived value): hashes, compositions, legalizations


def clear_caches():
    """Forget everything derived so far (a cold compile, as in a fresh process)."""
    for cache in (REWRITES, CONTIGUITY, MOVEMENTS, INDEX_COPIES, PATTERNS, _BY_ID):
        cache.clear()
    clear_schedule_cache()


def _identity(obj) -> int:
    # A TVM object gets a new Python wrapper at every access: its node's address is its identity.
    chandle = getattr(obj, "__chandle__", None)
    return id(obj) if chandle is None else chandle()


def _by_identity(objs: tuple, compute, tag=None):
    """``compute()`` memoised on the identity of the objects ``objs`` (kept alive by the memo,
    so their addresses cannot be reused while the entry exists)."""
    key = (tag,) + tuple(_identity(o) for o in objs)
    hit = _BY_ID.get(key)
    if hit is not None and all(_identity(a) == _identity(b) for a, b in zip(hit[0], objs)):
        return hit[1]
    return _BY_ID.put(key, (objs, compute()))[1]


def func_hash(func) -> int:
    """Structural hash of a PrimFunc, once per object."""
    return _by_identity((func,), lambda: tvm_ffi.structural_hash(func), "hash")


class BoundMapping(Mapping):
    """One binding's own mapping object over a mapping derived once per structure (``template``,
    shared by identical layers): the same pieces, variables and buffers, except where a mapping
    shows itself in the emitted module (the ``vtc.virtual_inputs`` index maps), which bind
    variables (and index-tensor buffers) of this object's own, as when every binding derived its
    mapping itself (structural equality sees which index maps share variables)."""

    def __init__(self, template: Mapping):
        template = getattr(template, "template", template)
        self.__dict__.update(template.__dict__)
        self.template = template
        self._own_maps = None

    def index_maps(self) -> list:
        if self._own_maps is None:
            self._own_maps = renamed(self).index_maps()
        return self._own_maps


def template_of(mapping) -> Mapping:
    return getattr(mapping, "template", mapping)


def renamed(mapping: Mapping) -> Mapping:
    """``mapping`` over index variables and source buffers of its own (same names)."""
    vmap = {v: tvm.tirx.Var(v.name, v.ty) for v in mapping.vars}
    bufs = [new_buffer(b.shape, b.dtype, b.name) for b in mapping.sources]
    own = lambda e: _rebind_loads(_substitute(e, vmap), mapping.sources,
                                  lambda j, idx: tvm.tirx.BufferLoad(bufs[j], idx))
    pieces = [Piece(p.source, tuple(own(e) for e in p.indices), None if p.cond is None else own(p.cond), p.value)
              for p in mapping.pieces]
    return Mapping(mapping.shape, mapping.dtype, bufs, list(vmap.values()), pieces)


def copy_kernel(mapping) -> tvm.tirx.PrimFunc:
    """``mapping.to_prim_func("vtc_copy")``, built once per mapping (it is immutable; the kernel
    has buffers and variables of its own)."""
    mapping = template_of(mapping)
    func = getattr(mapping, "_vtc_copy", None)
    if func is None:
        func = mapping.to_prim_func("vtc_copy")
        mapping._vtc_copy = func
    return func


def mapping_key(mapping) -> int:
    """Structural hash of the copy kernel that materialises ``mapping``: equal for equal
    mappings of different layers (the buffers are fresh, the structure is the same)."""
    mapping = template_of(mapping)
    key = getattr(mapping, "_vtc_key", None)
    if key is None:
        key = tvm_ffi.structural_hash(copy_kernel(mapping))
        mapping._vtc_key = key
    return key


def _expr_key(e):
    """What a built-in rule can see of an argument: a variable's type (symbolic dims by
    identity), a tuple's fields, anything else (constants, shapes, prim values) in full."""
    if isinstance(e, relax.Var):
        return ("var", tvm_ffi.structural_hash(e.ty))
    if isinstance(e, relax.Tuple):
        return ("tuple",) + tuple(_expr_key(f) for f in e.fields)
    return ("expr", tvm_ffi.structural_hash(e))


def call_key(call, args=None) -> tuple:
    """Structural key of ``call`` up to the identity of its variables: two calls with equal
    keys have equal built-in rule mappings (over the sources at the same positions). Which
    slots hold the same variable is part of it: ``concat([a, a])`` derives a mapping over one
    source, which re-attached to ``concat([x, y])`` would read ``x`` twice."""
    args = call.args if args is None else args
    return (call.op.name, None if call.attrs is None else tvm_ffi.structural_hash(call.attrs),
            tuple(_expr_key(a) for a in args), tvm_ffi.structural_hash(call.ty),
            tuple(tvm_ffi.structural_hash(t) for t in call.ty_args), _aliasing(args))


def _aliasing(args) -> tuple:
    """For each argument slot (a tuple's fields one by one), the index of the first slot that
    holds the same expression."""
    slots = [f for a in args for f in (a.fields if isinstance(a, relax.Tuple) else [a])]
    return tuple(next(k for k, s in enumerate(slots) if s.same_as(f)) for f in slots)


def _position(source, args):
    """Where ``source`` is among ``args``: ``(i,)`` or ``(i, field)``; None if it is not."""
    for i, a in enumerate(args):
        if a.same_as(source):
            return (i,)
        if isinstance(a, relax.Tuple):
            for k, f in enumerate(a.fields):
                if f.same_as(source):
                    return (i, k)
    return None


def _at(position, args):
    a = args[position[0]]
    return a if len(position) == 1 else a.fields[position[1]]


def cached_index_copy(func):
    """:func:`index_copy_mapping` of a PrimFunc, once per structure (as the caller's own
    :class:`BoundMapping`)."""
    key = func_hash(func)
    if key not in INDEX_COPIES:
        INDEX_COPIES.put(key, index_copy_mapping(func))
    found = INDEX_COPIES[key]
    return None if found is None else BoundMapping(found)


def cached_op_pattern(func) -> int:
    """:func:`op_pattern` of a PrimFunc, once per structure."""
    if func.attrs and "op_pattern" in func.attrs:
        return int(func.attrs["op_pattern"])
    key = func_hash(func)
    if key not in PATTERNS:
        PATTERNS.put(key, op_pattern(func))
    return PATTERNS[key]


def cached_contiguity(mapping):
    key = mapping_key(mapping)
    if key not in CONTIGUITY:
        CONTIGUITY.put(key, contiguity(mapping))
    return CONTIGUITY[key]


def cached_rewrite(func, index, mapping, name, target):
    """The schedulable rewrite of ``func`` reading parameter ``index`` through ``mapping``
    (:func:`rewritten_forms` + :func:`best_schedulable`), or the :class:`NotRewritable` that
    says why there is none. Computed once per structure."""
    key = (func_hash(func), index, mapping_key(mapping), str(target))
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
    cost_bytes: Optional[int] = None  # at the largest size (cost.largest_bytes): what time costs use
    movement: bool = False
    free_view: bool = False  # a reshape-like op of tensors that stay physical: no copy in stock either
    of_constants: bool = False  # a movement result of constants only (FoldConstant would fold it)
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
    source_exprs: tuple = ()    # load side: the mapping's sources by index (constants too)

    @property
    def source_vars(self) -> list:
        """The mapping's sources that are variables: what reading through it keeps alive."""
        return [s for s in self.source_exprs if isinstance(s, relax.Var)]


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
    decisions: List[dict] = field(default_factory=list)  # rows for edges decided without the plan
    _ops: Dict[str, int] = field(default_factory=dict)
    # var -> the value bound to it (set by the walk): names a part of a tuple by the op that made it
    value_of: Optional[Callable] = None
    # symbolic variable name -> the upper bound its function declares (tir_var_upper_bound)
    upper_bounds: Dict[str, int] = field(default_factory=dict)

    def node(self, var, value=None, position=0) -> Node:
        if var in self.by_var:
            return self.by_var[var]
        op = _op_name(value) or (value.args[0].name_hint if isinstance(value, relax.Call)
                                 and value.op.same_as(CALL_TIR) else "param" if value is None else type(value).__name__)
        short = op.split(".")[-1]
        if isinstance(value, relax.TupleGetItem) and self.value_of is not None:
            made_by = _op_name(self.value_of(value.tuple_value))  # a part of a split: "split[1]"
            if made_by:
                short = f"{made_by.split('.')[-1]}[{value.index}]"
        k = self._ops.get(short, 0)
        self._ops[short] = k + 1
        ty = var.ty
        shape, dtype, size, largest = (), "", None, None
        if isinstance(ty, relax.TensorType):
            dtype = str(ty.dtype)
            if isinstance(ty.shape, relax.ShapeExpr):
                shape = tuple(int(d) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in ty.shape.values)
                if all(isinstance(d, int) for d in shape):
                    size = largest = _prod(shape) * max(tvm.runtime.DataType(dtype).bits // 8, 1) if dtype else None
                elif dtype:
                    largest = largest_bytes(ty.shape.values, dtype, self.upper_bounds)
        node = Node(len(self.nodes), var, f"{short}#{k}" if value is not None else var.name, op, shape, dtype,
                    size, largest, position=position, onnx_node=_onnx_name(var))
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
            mapping = cached_index_copy(kernel[1]) if kernel is not None else None
            return None if mapping is None else VirtualTensor(mapping, kernel[2])
        name = value.op.name
        rule = get_rule(name)
        if rule is None or (self.ops is not None and name not in self.ops):
            return None
        args = self._literal_args(value)
        if not is_builtin_rule(name):  # a user's rule may look at anything: run it every time
            try:
                return rule(self._with_literal_tuples(value, args))
            except Unsupported as err:
                self.log(var, name, False, f"{name} left as is: {err}")
                return None
        # Built-in rules read only the types, attributes and literal arguments of the call: the
        # mapping is derived once per structure and re-attached to this call's sources.
        key = call_key(value, args)
        found = MOVEMENTS.get(key)
        if found is None:
            found = MOVEMENTS.put(key, self._derive_movement(rule, value, args))
        if isinstance(found, Unsupported):
            self.log(var, name, False, f"{name} left as is: {found}")
            return None
        if found[0] is None:  # a source the rule made itself: not positional, not cached
            return rule(self._with_literal_tuples(value, args))
        parts = [VirtualTensor(BoundMapping(m), [_at(q, args) for q in where]) for m, where in found[0]]
        return parts if found[1] else parts[0]

    def _derive_movement(self, rule, value, args):
        """``(((mapping, source positions), ...), is_list)`` of a built-in rule, or its
        :class:`Unsupported`."""
        try:
            vt = rule(self._with_literal_tuples(value, args))
        except Unsupported as err:
            return err
        parts = vt if isinstance(vt, list) else [vt]
        where = [tuple(_position(s, args) for s in p.sources) for p in parts]
        if any(q is None for w in where for q in w):
            return (None, isinstance(vt, list))
        return (tuple((p.mapping, w) for p, w in zip(parts, where)), isinstance(vt, list))

    def _literal_args(self, call) -> list:
        """Arguments bound to tuple literals (e.g. concat's input) as the literal itself."""
        args = []
        for a in call.args:
            bound = self.lookup_binding(a) if isinstance(a, relax.Var) else None
            args.append(bound if isinstance(bound, relax.Tuple) else a)
        return args

    def _with_literal_tuples(self, call, args=None):
        """``call`` over :meth:`_literal_args`."""
        args = self._literal_args(call) if args is None else args
        if all(a.same_as(b) for a, b in zip(args, call.args)):
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
        mapping, sources = template_of(vt.mapping), list(vt.sources)
        j = 0
        while j < len(sources):
            inner = self.virtual.get(sources[j]) if isinstance(sources[j], relax.Var) else None
            if isinstance(inner, VirtualTensor) and self.visible(inner):
                further, pins = _composition(mapping, j, template_of(inner.mapping))
                if not pins:
                    mapping, sources = further, sources[:j] + sources[j + 1:] + list(inner.sources)
                    continue
            j += 1
        if mapping is template_of(vt.mapping):
            return VirtualTensor(vt.mapping, sources)
        return VirtualTensor(BoundMapping(mapping), sources)

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
        func, sources = copy_kernel_of(vt)
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
        # Once per call (and current target): the planner's re-walks and the emitter's walk see
        # the same call objects. Not per structure: the PrimFunc names its parameters after the
        # call's variables, names the rewrites keep.
        current = tvm.target.Target.current(allow_none=True)
        found = _by_identity((call,), lambda: self._legalize(legalize, call),
                             ("legalize", None if current is None else str(current)))
        if isinstance(found, str):
            if found:
                logger.info("%s", found)
            return None
        func, name, spec = found
        return func, name, [call.args[x] if isinstance(x, int) else x for x in spec]

    def _legalize(self, legalize, call):
        """``(PrimFunc, kernel name, args spec)`` of ``call``'s legalization (an argument is the
        index of a call argument, or a symbolic value), or why there is none (a log line)."""
        try:
            legal = self.builder_.normalize(legalize(self.builder_, call))
        except Exception as err:  # noqa: BLE001 - a consumer we cannot lower stays as it is
            return f"cannot legalize {call.op.name}: {err}"
        if not (isinstance(legal, relax.Call) and legal.op.same_as(CALL_TIR)) or len(legal.args) > 2:
            return ""
        if not tvm_ffi.structural_equal(legal.ty, call.ty):
            # e.g. TOPI's broadcast of two symbolic shapes Relax proved equal and TOPI did not
            return f"legalized {call.op.name} has type {legal.ty}, not {call.ty}"
        gv = legal.args[0]
        func = self.builder_.get()[gv]
        args = list(legal.args[1].fields)
        # The legalized call must read the original tensors (constants may be folded into the
        # PrimFunc) and otherwise only the values of symbolic dimensions.
        spec = []
        for a in args:
            at = next((i for i, t in enumerate(call.args)
                       if isinstance(t.ty, relax.TensorType) and a.same_as(t)), None)
            if at is None and not isinstance(a.ty, tvm.ir.PrimType):
                return ""
            spec.append(a if at is None else at)
        return func, call.op.name.split(".")[-1], tuple(spec)

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
        pattern = cached_op_pattern(func)
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


def _composition(outer, j, inner):
    """``(outer.compose(j, inner), pins_too_much of it)``, once per pair of mapping objects
    (built-in rules share their mappings between identical layers, so do compositions)."""
    def compute():
        # Shared mappings may share buffers (the same template twice, or a composition that
        # kept an outer source): ``compose`` tells sources apart by buffer, so give the inner
        # mapping buffers of its own then, as separately derived mappings have.
        alias = set(outer.sources) & set(inner.sources)
        further = outer.compose(j, renamed(inner) if alias else inner)
        return further, pins_too_much(further)

    return _by_identity((outer, inner), compute, ("compose", j))


def copy_kernel_of(vt) -> tuple:
    """``(PrimFunc, its input vars)`` materialising ``vt`` (the cached :func:`copy_kernel` of its
    mapping), or each part of a list of them into one output each (a split: one kernel, as stock's)."""
    if not isinstance(vt, list):
        return copy_kernel(vt.mapping), list(vt.sources)
    from tvm import te

    sources = []
    for part in vt:
        sources += [s for s in part.sources if not any(s.same_as(t) for t in sources)]
    # int64 extents, as LegalizeOps gives its kernels: FuseTIR refuses a tensor whose producer's
    # and this kernel's buffers differ in type (model fuzz seed 111171: a relu fused into a split)
    holders = [te.placeholder([_i64(dim(d)) for d in s.ty.shape], str(s.ty.dtype), f"vtc_copy_in{j}")
               for j, s in enumerate(sources)]
    def body(part):
        at = [next(j for j, t in enumerate(sources) if t.same_as(s)) for s in part.sources]
        return lambda *v: part.mapping.load(v, lambda j, idx: holders[at[j]](*[lowering_safe(i, v) for i in idx]))

    outs = [te.compute([_i64(dim(d)) for d in part.mapping.shape], body(part),
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
    stock legalization is broken; reshape-like ops stay ops (stock makes them free views), and so
    does an op whose composed copy of a symbolic shape TVM would classify opaque.
    """
    name = _op_name(value)
    if name in OWN_COPY_OPS:
        return True
    if name in VIEW_OPS:
        return False
    reached = len(composed.sources) != len(vt.sources) or any(
        not a.same_as(b) for a, b in zip(composed.sources, vt.sources))
    # A composed copy of a symbolic shape can keep divisions by products of symbolic sizes that
    # the analyzer cannot fold; TVM then classifies the kernel opaque and FuseOps fuses nothing
    # into it, where stock fuses the chain of ops (graph fuzz, CUDA, seed 921: expand_dims,
    # permute_dims, add: 2 kernels against 1). Such an op stays itself, reading its input.
    return reached and (is_static(composed.mapping.shape)
                        or cached_op_pattern(copy_kernel(composed.mapping)) <= INJECTIVE)


def check_symbols(vt: VirtualTensor):
    """A symbolic dimension of a virtual tensor must be a dimension of one of its sources:
    otherwise neither a copy kernel nor a rewritten consumer could learn its value."""
    mapping = template_of(vt.mapping)
    problem = getattr(mapping, "_vtc_symbols", None)  # a property of the mapping: once per mapping
    if problem is None:
        defined = [d for j in range(len(mapping.sources)) for d in mapping.source_shape(j)
                   if isinstance(d, tvm.ir.Var)]
        problem = next((f"symbolic dimension {symbol} is not a dimension of any source"
                        for symbol in mapping.symbols if not any(symbol.same_as(d) for d in defined)), "")
        mapping._vtc_symbols = problem
    if problem:
        raise Unsupported(problem)


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
