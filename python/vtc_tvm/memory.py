"""Memory: the bytes TVM's static memory planner will plan for a function, predicted without
lowering it.

What is predicted is ``StaticPlanBlockMemory``'s result (the sum of its ``alloc_storage``
sizes, what :func:`vtc_tvm.report.kernel_census` reports as ``planned_bytes``). That planner
works on the lowered function, one ``alloc_tensor`` per kernel output, in binding order:

* a token's reference count is the number of kernel arguments that use it (a ``reshape`` view
  shares its input's token); function parameters, constants and whatever reaches the function's
  return are not planned;
* at each allocation it takes, among the released tokens of the same dtype, the smallest one
  that is at least as large (within 16x), else the largest smaller one (and enlarges it), else
  a new token; a token is released after the call that drops its count to zero, so an output
  never reuses its own inputs' storage;
* the planned bytes are the sum of the tokens' final sizes.

So the planned bytes depend on which tensors exist after fusion, in which order their kernels
run and how long each stays live: packing, not only the peak of live bytes (whole ShuffleNetV2
keeps the same 1.2 MB peak under vtc, yet the planner packed 6 tokens instead of 5 when the
channel shuffles' sources were kept alive through the next unit). :func:`predict` reproduces
all three from a list of :class:`Kernel` records, as the planner sees the function:

1. constants fold (a kernel reading only constants is one, like ``FoldConstant``);
2. fusion is TVM's own ``FuseOps``, run on a skeleton module whose kernels are empty PrimFuncs
   carrying each binding's op pattern (so no legalization of the function, no TIR);
3. a lone reshape-like kernel is a view of its input (``RewriteDataflowReshape``);
4. :func:`replay` is the planner's algorithm on the resulting allocations.

The records come from a module (:func:`kernels_of`: stock TVM's view of the input) or from a
plan (:mod:`vtc_tvm.plan` derives the rewritten function's records from its decisions: a
virtual tensor's consumers read its sources, so those live to its last reader; materialised
tensors are copies from their sources; a concat that its producers store into is allocated by
its first producer). Op patterns of high-level ops come from legalizing each distinct call once
(:func:`op_pattern_of`, cached per structure).

The store side (:func:`store_side`) is predicted after fusion as :mod:`vtc_tvm.stores` decides
there: a copy launch the plan marked (its store edges, :attr:`vtc_tvm.plan.Plan.stores`), of
one-to-one copies whose planned inputs' producers nothing else reads.

Limits: 1. sizes must be static (a symbolic size makes the prediction None, as the census's);
2. the store side may still refuse a producer the prediction redirects (DLight cannot schedule
it, an inverse it cannot prove), which keeps stock's buffers there; 3. a call that neither
legalizes nor is a ``call_tir`` counts as an opaque kernel (the planner would not plan the
tokens it reads); 4. the skeleton's FuseOps sees what the pipeline's does only as far as the
pipeline's passes before it (LegalizeOps, AnnotateTIROpPattern, FoldConstant) are the ones
modelled here.
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.ir import Op

from .analysis import OPAQUE, VIEW_OPS, op_pattern

logger = logging.getLogger("vtc_tvm")
CALL_TIR = Op.get("relax.call_tir")
CALL_TIR_INPLACE = Op.get("relax.call_tir_inplace")
# Copies every element of whose sources lands once in the output: the store side can invert them.
ONE_TO_ONE_OPS = VIEW_OPS | {"relax.concat", "relax.permute_dims"}
MATCH_RANGE = 16  # TokenAllocator1D::match_range_
# Each skeleton kernel is a PrimFunc of its own (BlockBuilder.add_func would merge equal ones),
# so that FuseOps' groups name the records they fuse.
_NODE_ATTR = "vtc.memory_node"
CONSTANT = tvm.ir.GenericConst


@dataclass
class Kernel:
    """One binding as the memory planner will see it before fusion: a kernel writing ``var``
    (a tensor or a tuple of tensors) from ``reads`` (tensor variables and constants), or, with
    ``alias``, a binding that only names (part of) another value (``TupleGetItem``, a tuple,
    a variable)."""

    var: relax.Var
    reads: Tuple[relax.Expr, ...] = ()
    pattern: int = OPAQUE
    view: bool = False               # reshape-like: a view of its input when not fused
    inplace: Optional[int] = None    # index in ``reads`` of the tensor it updates in place
    alias: Optional[relax.Expr] = None
    dataflow: bool = True
    one_to_one: bool = False         # a copy whose pieces the store side can invert
    name: str = ""
    match_cast: bool = False         # a match_cast (may define symbolic dimensions)


@dataclass
class Function:
    """The records of one Relax function, in binding order, and what it returns."""

    kernels: List[Kernel]
    outputs: List[relax.Var]
    params: List[relax.Var] = field(default_factory=list)


# -- op patterns --------------------------------------------------------------------------------
_PATTERNS: Dict[tuple, int] = {}


def _signature(call: relax.Call) -> tuple:
    """What a legalized op's pattern depends on: the op, its attributes, its arguments' types
    (a constant's type, not its data; shape and prim values themselves)."""
    return (call.op.name, tvm_ffi.structural_hash(call.attrs) if call.attrs is not None else 0,
            tuple(tvm_ffi.structural_hash(a.ty) if isinstance(a, (relax.Var, CONSTANT)) else
                  tvm_ffi.structural_hash(a) for a in call.args))


def op_pattern_of(call: relax.Call, mod: Optional[tvm.IRModule] = None) -> int:
    """TVM's op pattern of the kernel ``call`` becomes: the PrimFunc's own for a ``call_tir``,
    else that of its legalization (computed once per op, attributes and argument types)."""
    if call.op.same_as(CALL_TIR) or call.op.same_as(CALL_TIR_INPLACE):
        func = mod[call.args[0]] if mod is not None else None
        return op_pattern(func) if isinstance(func, tirx.PrimFunc) else OPAQUE
    if not isinstance(call.op, Op):
        return OPAQUE
    key = _signature(call)
    if key not in _PATTERNS:
        if len(_PATTERNS) > 1 << 14:
            _PATTERNS.clear()
        _PATTERNS[key] = _legalized_pattern(call)
    return _PATTERNS[key]


def _legalized_pattern(call: relax.Call) -> int:
    legalize = call.op.get_attr("FLegalize")
    if legalize is None:
        return OPAQUE
    bb = relax.BlockBuilder()
    try:
        with bb.function("f", [a for a in call.args if isinstance(a, relax.Var)]):
            with bb.dataflow():
                legal = bb.normalize(legalize(bb, call))
                out = bb.emit_output(legal)
            bb.emit_func_output(out)
    except Exception:  # noqa: BLE001 - an op we cannot legalize here: FuseOps sees it opaque
        return OPAQUE
    if isinstance(legal, relax.Call) and legal.op.same_as(CALL_TIR):
        return op_pattern(bb.get()[legal.args[0]])
    return OPAQUE


# -- records of a module ------------------------------------------------------------------------
def kernels_of(func: relax.Function, mod: tvm.IRModule) -> Function:
    """The records of ``func`` as it stands (stock TVM's view of it)."""
    kernels = []
    for block in func.body.blocks:
        dataflow = isinstance(block, relax.DataflowBlock)
        for b in block.bindings:
            kernels.append(kernel_of(b.var, b.value, mod, dataflow, match_cast=isinstance(b, relax.MatchCast)))
    return Function(kernels, list(relax.analysis.free_vars(func.body.body)), list(func.params))


def kernel_of(var, value, mod, dataflow=True, reads=None, pattern=None, match_cast=False) -> Kernel:
    """The record of binding ``var = value``; ``reads`` / ``pattern`` override the call's."""
    if match_cast or not isinstance(value, relax.Call):
        return Kernel(var, alias=value, dataflow=dataflow, match_cast=match_cast)
    args = call_args(value)
    name = value.op.name if isinstance(value.op, Op) else str(value.op)
    inplace = None
    if value.op.same_as(CALL_TIR_INPLACE):
        inplace = int(value.attrs.inplace_indices[0])
    if value.op.same_as(CALL_TIR) or value.op.same_as(CALL_TIR_INPLACE):
        name = value.args[0].name_hint
    op = value.op.name if isinstance(value.op, Op) else None
    return Kernel(var, tuple(args if reads is None else reads),
                  op_pattern_of(value, mod) if pattern is None else pattern,
                  view=op in VIEW_OPS, inplace=inplace, dataflow=dataflow, one_to_one=op in ONE_TO_ONE_OPS,
                  name=name)


def call_args(call: relax.Call) -> list:
    """Tensor arguments of a call (a call_tir's are inside its tuple)."""
    args = list(call.args[1].fields) if call.op.same_as(CALL_TIR) or call.op.same_as(CALL_TIR_INPLACE) \
        else list(call.args)
    flat = []
    for a in args:
        flat += list(a.fields) if isinstance(a, relax.Tuple) else [a]
    return [a for a in flat if isinstance(a, (relax.Var, CONSTANT))
            and isinstance(a.ty, (relax.TensorType, relax.TupleType))]


# -- prediction ---------------------------------------------------------------------------------
@dataclass
class Launch:
    """One kernel launch after fusion: what it allocates, what it reads, whether it is a view
    (of ``reads[0]``) or updates ``reads[inplace]`` in place, and the records it fuses."""

    key: int
    outputs: List[Tuple[int, str]]   # (bytes, dtype) per output
    reads: List[Optional[int]]       # value keys
    block: int
    view: bool = False
    inplace: Optional[int] = None
    members: Tuple[int, ...] = ()
    name: str = ""
    dataflow_var: bool = True


def predict(function: Function, stores: Optional[dict] = None, applied: Optional[set] = None,
            unmodelled: Optional[set] = None) -> Optional[int]:
    """Planned bytes of ``function`` (None where a size is symbolic). ``stores``: the store
    side runs after fusion on the plan's store edges, ``{destination name: names of the
    sources whose producers store into it}`` (:meth:`vtc_tvm.plan.Plan.store_side`, what the
    emitter marks with ``vtc.store_plan``); None: no store side (stock). ``applied`` receives
    the names of the destinations the store side rewrites, ``unmodelled`` those whose stores
    it does not predict (a multi-output copy after fusion). A function the model cannot follow
    (control flow, an unexpected binding) is logged and predicted None, like a symbolic one."""
    try:
        found = fused_launches(function)
    except Exception as err:  # noqa: BLE001 - no prediction: the plan's constraint does not apply
        logger.warning("planned memory not predicted: %s: %s", type(err).__name__, err)
        return None
    if found is None:
        return None
    events, kernels = found
    if stores is not None:
        events = store_side(events, kernels, stores, applied, unmodelled)
    return replay(events)


def fused_launches(function: Function) -> Optional[list]:
    """The function's launches after ``FoldConstant``, ``FuseOps`` and ``RewriteDataflowReshape``
    (see the module docstring): events ``("launch", Launch)``, ``("item", key, tuple key,
    index)``, ``("tuple", key, field keys)``, ``("same", key, key)``, ``("return", keys)``, and
    the records after constant folding (``Launch.members`` index them); None on a symbolic
    size."""
    kernels = _fold_constants(function.kernels, function.outputs)
    skeleton, node_of_gv = _skeleton(kernels, function)
    fused = relax.transform.FuseOps()(skeleton)
    main = fused["main"]
    events: list = []
    key_of: Dict[relax.Var, Optional[int]] = {}

    def new_key(var):
        key_of[var] = len(key_of)
        return key_of[var]

    for block_id, block in enumerate(main.body.blocks):
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.GlobalVar):  # a fused group
                members = _group_members(fused[v.op], node_of_gv)
                args, inplace = list(v.args), None
            elif isinstance(v, relax.Call) and (v.op.same_as(CALL_TIR) or v.op.same_as(CALL_TIR_INPLACE)):
                members = (node_of_gv[v.args[0]],)
                args = list(v.args[1].fields)
                inplace = kernels[members[0]].inplace
            elif isinstance(v, relax.TupleGetItem):
                events.append(("item", new_key(b.var), key_of.get(v.tuple_value), v.index))
                continue
            elif isinstance(v, relax.Tuple):
                events.append(("tuple", new_key(b.var), [key_of.get(f) for f in v.fields]))
                continue
            elif isinstance(v, relax.Var):
                key_of[b.var] = key_of.get(v)
                continue
            else:
                key_of[b.var] = None
                continue
            sizes = tensor_bytes(b.var.ty)
            if sizes is None:
                return None
            reads = [key_of.get(a) for a in args]
            view = all(kernels[m].view for m in members) and len(reads) == 1
            events.append(("launch", Launch(new_key(b.var), sizes, reads, block_id, view, inplace, members,
                                            b.var.name, isinstance(b.var, relax.DataflowVar))))
    events.append(("return", [key_of.get(v) for v in relax.analysis.free_vars(main.body.body)]))
    return events, kernels


def _fold_constants(kernels: List[Kernel], outputs) -> List[Kernel]:
    """``FoldConstant``: a kernel reading only constants (and folded values) is a constant, and
    the dataflow bindings nothing reads are removed (it eliminates dead code too)."""
    live = set(outputs)
    kept = []
    for k in reversed(kernels):
        if k.dataflow and k.var not in live:
            continue
        kept.append(k)
        live.update(k.reads if k.alias is None else relax.analysis.free_vars(k.alias))
    kernels = kept[::-1]
    folded = set()
    out = []
    for k in kernels:
        reads = k.reads if k.alias is None else list(relax.analysis.free_vars(k.alias))
        if k.inplace is None and (k.alias is None or isinstance(k.alias, relax.TupleGetItem)) and all(
                isinstance(r, CONSTANT) or r in folded for r in reads):
            folded.add(k.var)
            continue
        if k.alias is None:
            keep = tuple(r for r in k.reads if isinstance(r, relax.Var) and r not in folded)
            if len(keep) != len(k.reads):
                k = Kernel(k.var, keep, k.pattern, k.view, k.inplace, None, k.dataflow, k.one_to_one, k.name)
        out.append(k)
    return out


def _skeleton(kernels: List[Kernel], function: Function):
    """A module whose ``main`` has one ``call_tir`` of an empty PrimFunc per kernel, carrying
    the kernel's op pattern: all that FuseOps reads."""
    bb = relax.BlockBuilder()
    node_of_gv: Dict[tvm.ir.GlobalVar, int] = {}
    gv_of: Dict[int, tvm.ir.GlobalVar] = {}
    empty = tirx.PrimFunc([], tirx.Evaluate(tirx.const(0, "int32")))
    for i, k in enumerate(kernels):
        if k.alias is None and var_bytes(k.var, strict=False) is not None:
            gv = bb.add_func(empty.with_attrs({"op_pattern": int(k.pattern), _NODE_ATTR: i}), f"k{i}")
            node_of_gv[gv] = i
            gv_of[i] = gv
    defined = {k.var for k in kernels}
    params: Dict[relax.Var, None] = {}  # (ordered) what the records read and do not define
    for k in kernels:
        for r in (k.reads if k.alias is None else relax.analysis.free_vars(k.alias)):
            if isinstance(r, relax.Var) and r not in defined:
                params.setdefault(r)
    remap = {p: relax.Var(p.name, p.ty) for p in params}
    read_later = _read_after_block(kernels, function.outputs)
    fields_of = {k.var: list(k.alias.fields) for k in kernels if isinstance(k.alias, relax.Tuple)}
    # A tuple only kernels read is passed field by field: it is no binding of its own (LegalizeOps
    # leaves it dead), which FuseOps would count as one more reader of each field.
    named = set(function.outputs) | {v for k in kernels if k.alias is not None and not isinstance(k.alias, relax.Tuple)
                                     for v in relax.analysis.free_vars(k.alias)}
    for k in reversed(kernels):  # (a tuple of tuples names its fields)
        if isinstance(k.alias, relax.Tuple) and k.var in named:
            named.update(relax.analysis.free_vars(k.alias))

    def emit(lo, hi, dataflow):
        for n in range(lo, hi):
            k = kernels[n]
            if isinstance(k.alias, relax.Tuple) and k.var not in named:
                continue
            if k.alias is not None:
                value = _remap_expr(k.alias, remap)
            elif n not in gv_of:
                continue
            else:
                args = []
                for r in k.reads:
                    if r in fields_of:  # a tuple's fields are the arguments (as LegalizeOps passes them)
                        args += [remap[f] if isinstance(f, relax.Var) and f in remap else f for f in fields_of[r]
                                 if not isinstance(f, relax.Var) or f in remap]
                    elif r in remap and isinstance(r.ty, relax.TupleType):
                        args += [bb.emit(relax.TupleGetItem(remap[r], i)) for i in range(len(r.ty.fields))]
                    elif r in remap:
                        args.append(remap[r])
                args = [a for a in args if isinstance(a, relax.Var)]
                value = (relax.call_tir_inplace(gv_of[n], args, [k.inplace], out_ty=_out_ty(k.var.ty))
                         if k.inplace is not None else relax.call_tir(gv_of[n], args, out_ty=_out_ty(k.var.ty)))
            remap[k.var] = bb.emit(value, name_hint=k.var.name)
        if dataflow:
            for n in range(lo, hi):
                v = kernels[n].var
                if v in remap and read_later.get(v, -1) >= hi:
                    remap[v] = bb.emit_output(remap[v])

    with bb.function("main", [remap[p] for p in params]):
        i = 0
        while i < len(kernels):
            dataflow = kernels[i].dataflow
            j = i
            while j < len(kernels) and kernels[j].dataflow == dataflow:
                j += 1
            if dataflow:
                with bb.dataflow():
                    emit(i, j, True)
            else:
                emit(i, j, False)
            i = j
        ret = [remap[v] for v in function.outputs if v in remap]
        bb.emit_func_output(ret[0] if len(ret) == 1 else relax.Tuple(ret))
    return bb.get(), node_of_gv


def _read_after_block(kernels, outputs) -> Dict[relax.Var, int]:
    """Index of the last record reading each variable (len(kernels) for returned ones)."""
    last: Dict[relax.Var, int] = {}
    for n, k in enumerate(kernels):
        for r in (k.reads if k.alias is None else relax.analysis.free_vars(k.alias)):
            last[r] = n
    for v in outputs:
        last[v] = len(kernels)
    return last


def _remap_expr(expr, remap):
    if isinstance(expr, relax.Var):
        return remap.get(expr, expr)
    if isinstance(expr, relax.TupleGetItem):
        return relax.TupleGetItem(_remap_expr(expr.tuple_value, remap), expr.index)
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([_remap_expr(f, remap) for f in expr.fields])
    return expr


def _out_ty(ty):
    return list(ty.fields) if isinstance(ty, relax.TupleType) else ty


_BYTES: Dict[tuple, object] = {}


def var_bytes(var, strict: bool = True) -> Optional[List[Tuple[int, str]]]:
    """:func:`tensor_bytes` of a variable's type, computed once per variable."""
    key = (var, strict)
    found = _BYTES.get(key, _BYTES)
    if found is _BYTES:
        if len(_BYTES) > 1 << 16:
            _BYTES.clear()
        found = _BYTES[key] = tensor_bytes(var.ty, strict)
    return found


def tensor_bytes(ty, strict: bool = True) -> Optional[List[Tuple[int, str]]]:
    """(bytes, dtype) of each tensor of ``ty``; None if ``ty`` holds no tensor, or (``strict``)
    a symbolic size."""
    fields = list(ty.fields) if isinstance(ty, relax.TupleType) else [ty]
    if not fields or not all(isinstance(f, relax.TensorType) for f in fields):
        return None
    out = []
    for f in fields:
        if not isinstance(f.shape, relax.ShapeExpr) or not all(isinstance(d, tirx.IntImm) for d in f.shape.values):
            if strict:
                return None
            out.append((0, str(f.dtype)))
            continue
        n = 1
        for d in f.shape.values:
            n *= int(d)
        dt = tvm.runtime.DataType(str(f.dtype))
        out.append((n * ((dt.bits * dt.lanes + 7) // 8), str(f.dtype)))
    return out


def _group_members(group: relax.Function, node_of_gv) -> Tuple[int, ...]:
    """The records FuseOps put in ``group`` (its bindings call their skeleton kernels)."""
    return tuple(node_of_gv[b.value.args[0]] for block in group.body.blocks for b in block.bindings
                 if isinstance(b.value, relax.Call) and b.value.args and b.value.args[0] in node_of_gv)


# -- the store side -----------------------------------------------------------------------------
def store_side(events: list, kernels: List[Kernel], allowed: dict, applied: Optional[set] = None,
               unmodelled: Optional[set] = None) -> list:
    """``events`` after :mod:`vtc_tvm.stores` (after fusion, as it decides there):

    * a copy launch (every record fused into it a one-to-one copy or a destination of the plan,
      not a view) that ``allowed`` names (the plan's destinations, by the records it fuses): each input whose name ``allowed`` lists for it,
      produced by a launch of one output and read by nothing else, is written by its producer
      straight into the copy's output (the producer's own buffer is gone), which is then
      allocated by the first of them; the pieces left (at most one, else nothing changes) stay
      one in-place copy;
    * an in-place update that ``allowed`` names, whose rows come from a launch read by nothing
      else: that producer runs in the update's place and writes into the updated tensor.

    A split destination (every part stored, or none) is modelled; a copy that FuseOps fuses with
    a split after it into a multi-output kernel is not: its name goes to ``unmodelled`` (the
    memory constraint takes its stores back).
    """
    launches = {ev[1].key: ev[1] for ev in events if ev[0] == "launch"}
    uses: Dict[int, int] = {}
    for ev in events:
        refs = ev[1].reads if ev[0] == "launch" else [ev[2]] if ev[0] in ("item", "same") else \
            ev[2] if ev[0] == "tuple" else ev[1] if ev[0] == "return" else []
        for r in refs:
            uses[r] = uses.get(r, 0) + 1

    def producer(key) -> Optional[Launch]:
        p = launches.get(key)
        if p is None or p.view or p.inplace is not None or len(p.outputs) != 1 or not p.dataflow_var \
                or uses.get(key, 0) != 1:
            return None
        return p

    into: Dict[int, Tuple[int, bool]] = {}  # producer key -> (destination launch key, first?)
    rest: Dict[int, list] = {}               # destination key -> the reads it still copies
    deferred: Dict[int, Launch] = {}         # update key -> the producer it runs
    for ev in events:
        if ev[0] != "launch":
            continue
        dest = ev[1]
        # The plan's destination among the records fused into the launch (FuseOps names the
        # group after its last record: a reshape after the copy, say).
        names = [kernels[m].var.name for m in dest.members if kernels[m].var.name in allowed] or \
            ([dest.name] if dest.name in allowed else [])
        if not names:
            continue  # (the store side executes only the plan's marked destinations)
        planned = set(allowed[names[0]])
        if dest.inplace is not None:
            rows = dest.reads[0] if dest.reads else None
            p = producer(rows) if dest.inplace == len(dest.reads) - 1 and len(dest.members) == 1 else None
            if p is not None and rows not in into and dest.reads.count(rows) == 1:
                deferred[dest.key] = p
            continue
        # A split destination (the plan's own multi-output copy) is modelled; a single-output
        # copy that FuseOps fused with a split after it is not.
        multi = len(dest.outputs) != 1
        own = next((kernels[m] for m in dest.members if kernels[m].var.name == names[0]), None)
        if multi and not (own is not None and isinstance(own.var.ty, relax.TupleType)):
            if unmodelled is not None:
                unmodelled.add(names[0])
            continue
        if dest.view or not all(kernels[m].one_to_one or kernels[m].var.name in allowed for m in dest.members):
            continue
        srcs = dest.reads
        stored = [r for r in srcs if producer(r) is not None and srcs.count(r) == 1 and r not in into
                  and any(kernels[m].var.name in planned for m in producer(r).members)]
        left = [r for r in srcs if r not in stored]
        if not stored or len(left) > (0 if multi else 1):  # (a multi-output copy: as a whole or not at all)
            continue
        first = min(stored, key=lambda r: _position(events, r))
        for r in stored:
            into[r] = (dest.key, r == first)
        rest[dest.key] = left
        if applied is not None:
            applied.add(names[0])
    if not into and not deferred:
        return events
    moved = {p.key for p in deferred.values()}
    out = []
    for ev in events:
        if ev[0] != "launch":
            out.append(ev)
            continue
        launch = ev[1]
        if launch.key in moved:
            continue  # runs in its update's place
        if launch.key in deferred:
            p = deferred[launch.key]
            reads = list(p.reads) + list(launch.reads[1:])
            out.append(("launch", Launch(launch.key, [], reads, launch.block, False, len(reads) - 1,
                                         launch.members + p.members, launch.name, launch.dataflow_var)))
            continue
        if launch.key in into:
            dest_key, first = into[launch.key]
            dest = launches[dest_key]
            if first:  # allocates the destination
                out.append(("launch", Launch(dest_key, dest.outputs, list(launch.reads), launch.block,
                                             members=launch.members, name=dest.name)))
            else:
                reads = list(launch.reads) + [dest_key]
                out.append(("launch", Launch(launch.key, [], reads, launch.block, False, len(reads) - 1,
                                             launch.members, launch.name)))
            continue
        if launch.key in rest:
            left = rest[launch.key]
            if left:  # the piece without a producer, copied in place
                reads = list(left) + [launch.key]
                out.append(("launch", Launch(_fresh(launch.key), [], reads, launch.block, False, len(reads) - 1,
                                             launch.members, launch.name)))
            continue
        out.append(ev)
    return out


def _fresh(key: int) -> int:
    return -1 - key  # a key no other value has (value keys are >= 0)


def _position(events, key) -> int:
    return next(i for i, ev in enumerate(events) if ev[0] == "launch" and ev[1].key == key)


# -- the planner's algorithm --------------------------------------------------------------------
def replay(events) -> int:
    """StaticPlanBlockMemory's token planning (see the module docstring) over ``events``."""
    tokens: Dict[Optional[int], object] = {None: None}  # value key -> token, or list (a tuple)
    size: List[int] = []
    dtype: List[str] = []
    refs: List[int] = []
    block_of: List[int] = []
    discarded = set()
    steps = []

    def leaves(t):
        if t is None:
            return []
        if isinstance(t, list):
            return [x for y in t for x in leaves(y)]
        return [t]

    # Initialisation: tokens and reference counts (a kernel's own outputs are its arguments too).
    for ev in events:
        if ev[0] == "launch":
            launch = ev[1]
            if launch.view:
                tokens[launch.key] = tokens.get(launch.reads[0])
                continue
            used = [t for r in launch.reads for t in leaves(tokens.get(r))]
            for t in used:
                if block_of[t] != launch.block:
                    discarded.add(t)  # planned per block
            new = []
            if launch.inplace is not None:
                tokens[launch.key] = tokens.get(launch.reads[launch.inplace])
            else:
                for nbytes, dt in launch.outputs:
                    size.append(nbytes)
                    dtype.append(dt)
                    refs.append(0)
                    block_of.append(launch.block)
                    new.append(len(size) - 1)
                tokens[launch.key] = new[0] if len(new) == 1 else new
            for t in used + new:
                refs[t] += 1
            steps.append((new, used + new))
        elif ev[0] == "item":
            t = tokens.get(ev[2])
            tokens[ev[1]] = t[ev[3]] if isinstance(t, list) else None
        elif ev[0] == "tuple":
            tokens[ev[1]] = [tokens.get(f) for f in ev[2]]
        elif ev[0] == "same":
            tokens[ev[1]] = tokens.get(ev[2])
        elif ev[0] == "return":
            discarded.update(t for r in ev[1] for t in leaves(tokens.get(r)))
    # Allocation: reuse released tokens of the same dtype, release after the last use.
    pool: Dict[str, list] = {}
    final: List[int] = []
    storage: Dict[int, int] = {}
    left = list(refs)
    stamp = 0
    for new, used in steps:
        for t in new:
            if t not in discarded:
                storage[t] = _request(pool.setdefault(dtype[t], []), size[t], refs[t], final)
        for t in used:
            if t in storage:
                left[t] -= 1
                if left[t] == 0:
                    sid = storage[t]
                    stamp += 1
                    bisect.insort(pool[dtype[t]], (final[sid], stamp, sid))
    return sum(final)


def _request(pool: list, nbytes: int, refs: int, final: List[int]) -> int:
    """TokenAllocator1D::RequestReuse, else Alloc: the storage id an allocation gets. ``pool``
    is sorted by (bytes, release order), as the planner's multimap keeps equal sizes."""
    if refs > 0:
        mid = bisect.bisect_left(pool, (nbytes,))
        if mid < len(pool) and pool[mid][0] <= nbytes * MATCH_RANGE:
            return pool.pop(mid)[2]
        begin = bisect.bisect_left(pool, (nbytes // MATCH_RANGE,))
        if mid > begin:
            sid = pool.pop(mid - 1)[2]
            final[sid] = nbytes  # enlarged
            return sid
    final.append(nbytes)
    return len(final) - 1


__all__ = ["Kernel", "Function", "Launch", "kernels_of", "kernel_of", "call_args", "predict", "fused_launches",
           "store_side", "replay", "op_pattern_of", "tensor_bytes", "var_bytes"]
