"""The global plan (issue 12): the opportunity graph, its conflicts, the solver's choice, the
plan as data, and the rewrite cache shared by identical layers."""

import json

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
import tvm.relax.op as R

import vtc_tvm
from vtc_tvm import candidates, cost, solver
from vtc_tvm.plan import copy_saved
from tests.conftest import emit, make_module, param, random_inputs, run
from tests.test_core_pass import assert_outputs_equal

LLVM = tvm.target.Target("llvm")
F32 = "float32"


def _split_reshapes(x, w):
    """The paper's first conflict example: a split whose parts are reshaped and consumed."""
    parts = emit(R.split(emit(R.exp(x)), 2, axis=0))
    a = emit(R.reshape(emit(relax.TupleGetItem(parts, 0)), (8, 4)))
    b = emit(R.reshape(emit(relax.TupleGetItem(parts, 1)), (8, 4)))
    return R.add(emit(R.matmul(a, w)), emit(R.matmul(b, w)))


def _feasible(p) -> bool:
    chosen = [k for k, eid in enumerate(p.offered) if p.graph.edges[eid].chosen]
    return p.problem is None or not p.offered or solver.is_feasible(p.problem, chosen)


def test_split_feeding_reshapes_is_planned_conflict_free_and_correct(rng):
    params = [((8, 8), F32), ((4, 6), F32)]
    mod = make_module(params, _split_reshapes)
    p = vtc_tvm.plan(mod, LLVM)
    assert _feasible(p)
    names = {n.name for n in p.graph.nodes}
    assert {"split#0", "reshape#0", "reshape#1"} <= names, names
    # Each part is read by its matmul through one mapping over the exp's output: a view of one thing.
    loads = [e for e in p.graph.edges if e.kind == "load" and e.chosen]
    assert loads and all(len(set(e.sources)) == 1 for e in loads)
    out = vtc_tvm.VirtualTensorize(target=LLVM)(mod)
    inputs = random_inputs(params, rng)
    assert_outputs_equal(run(out, inputs), run(mod, inputs))


def _grown_cache(past, k, q):
    """A decode step's grown cache: ``concat(past, k)`` returned in a tuple and read by a
    matmul through a transpose and an elementwise op."""
    cache = emit(R.concat([past, emit(R.exp(k))], axis=0))
    return R.matmul(q, emit(R.negative(emit(R.permute_dims(cache, [1, 0]))))), cache


def test_outputs_returned_in_a_tuple_are_physical_from_the_first_walk(rng):
    # The cache is an output: materialised whatever the plan, so q K^T reads it directly and no
    # consumer is rewritten through the concat only for a second walk to undo it.
    params = [((12, 8), F32), ((4, 8), F32), ((3, 8), F32)]
    mod = make_module(params, _grown_cache)
    p = vtc_tvm.plan(mod, LLVM)
    assert p.summary["solver"]["steps"] == 1, p.summary
    cache = next(n for n in p.graph.nodes if n.op == "relax.concat")
    assert cache.var in p.physical and not p._virtual(cache)
    loads = [e for e in p.graph.edges if e.kind == "load" and e.chosen]
    assert loads and all(p.graph.nodes[e.dst].id == cache.id for e in loads), [(e.src, e.dst) for e in loads]
    out = vtc_tvm.VirtualTensorize(target=LLVM)(mod)
    inputs = random_inputs(params, rng)
    assert_outputs_equal(run(out, inputs), run(mod, inputs))


@pytest.mark.parametrize("workload", ["shufflenet_v2", "yolo_c3k2", "llama_decode"])
@pytest.mark.parametrize("strategy", ["contiguity", "all"])
def test_plan_calls_virtual_exactly_what_the_emitted_module_no_longer_computes(workload, strategy):
    # split parts read only by a virtual concat (composed into its mapping: no edge of their
    # own) are virtual; parts of a split kept as one multi-output copy are not
    from benchmarks.workloads import WORKLOADS

    wl = WORKLOADS[workload]
    mod = wl.build(wl.config("small", 1, F32))
    p = vtc_tvm.plan(mod, LLVM, strategy, memory_guard=True)
    emitted = vtc_tvm.emit(mod, p)
    bound = {b.var.name for f in emitted.functions.values() if isinstance(f, relax.Function)
             for block in f.body.blocks for b in block.bindings}
    movement = [n for n in p.graph.nodes if n.movement and n.var is not None]
    virtual = {n["name"] for n in json.loads(p.to_json())["nodes"] if n["virtual"]}
    assert movement and virtual
    assert [n.name for n in movement if (n.name in virtual) == (n.var.name in bound)] == []


def test_plan_json_has_the_documented_schema():
    mod = make_module([((8, 8), F32), ((4, 6), F32)], _split_reshapes)
    data = json.loads(vtc_tvm.plan(mod, LLVM).to_json())
    assert set(data) == {"nodes", "edges", "conflicts", "summary"}
    assert all(set(n) == {"id", "name", "op", "onnx_node", "shape", "dtype", "bytes", "virtual", "reason"}
               for n in data["nodes"])
    assert all(set(e) == {"id", "src", "dst", "kind", "consumer", "mapping", "gain_us", "kernels", "memory",
                          "chosen", "reason"} for e in data["edges"])
    assert set(data["summary"]) == {"predicted", "solver"}
    assert any(e["chosen"] and e["kind"] == "load" for e in data["edges"])
    assert "digraph" in vtc_tvm.plan(mod, LLVM).to_dot()


def _concat_escapes(x, y, w):
    """A concat read by a matmul and returned: it stays physical, so its inputs' producers may
    store into it (store side) instead of it being virtual over them (load side)."""
    c = emit(R.concat([emit(R.matmul(x, w)), emit(R.matmul(y, w))], axis=0))
    return emit(R.matmul(c, w)), c


def test_concat_is_either_virtual_or_a_store_destination(rng):
    params = [((4, 8), F32), ((4, 8), F32), ((8, 8), F32)]
    mod = make_module(params, _concat_escapes)
    p = vtc_tvm.plan(mod, LLVM)
    assert _feasible(p)
    stores = [e for e in p.graph.edges if e.kind == "store" and e.consumer is not None]
    assert len(stores) == 2 and all(e.chosen for e in stores)
    concat = next(n.var.name for n in p.graph.nodes if n.op == "relax.concat")
    assert p.store_side() == {concat: sorted(p.graph.nodes[e.src].var.name for e in stores)}
    assert not any(e.chosen for e in p.graph.edges if e.kind == "load" and p.graph.nodes[e.src].op == "relax.concat")
    # Without the escape the load side wins the conflict: the concat is virtual, no store edge.
    mod2 = make_module(params, lambda x, y, w: R.matmul(emit(R.concat([emit(R.matmul(x, w)),
                                                                        emit(R.matmul(y, w))])), w))
    p2 = vtc_tvm.plan(mod2, LLVM)
    assert _feasible(p2) and p2.conflicts
    assert not any(e.chosen for e in p2.graph.edges if e.kind == "store")
    # Element-wise producers: FuseOps fuses them into the concat's kernel (stock has no copy to
    # save), so the plan offers no store edge and says why.
    mod3 = make_module(params, lambda x, y, w: (lambda c: (emit(R.matmul(c, w)), c))(
        emit(R.concat([emit(R.exp(x)), emit(R.exp(y))], axis=0))))
    p3 = vtc_tvm.plan(mod3, LLVM)
    fused = [e for e in p3.graph.edges if e.kind == "store" and e.consumer is not None]
    assert len(fused) == 2 and not any(e.chosen for e in fused) and not p3.store_side()
    assert all("FuseOps fuses" in e.reason for e in fused), [e.reason for e in fused]
    out = tvm.compile(mod, LLVM, relax_pipeline=relax.get_pipeline("vtc", target=LLVM))
    stock = tvm.compile(mod, LLVM, relax_pipeline=relax.get_default_pipeline(LLVM))
    inputs = random_inputs(params, rng)
    vm_v, vm_s = relax.VirtualMachine(out, tvm.cpu()), relax.VirtualMachine(stock, tvm.cpu())
    args = [tvm.runtime.tensor(a) for a in inputs]
    for got, want in zip(vm_v["main"](*args), vm_s["main"](*args)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


def _kv_module():
    B, H, T, D = 1, 2, 8, 4
    cache = relax.Var("cache", relax.TensorType((B, H, T, D), F32))
    q = relax.Var("q", relax.TensorType((B, H, 1, D), F32))
    new = relax.Var("new", relax.TensorType((B, H, 1, D), F32))
    idx = relax.Var("idx", relax.TensorType((B, H, 1, 3), "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [cache, q, new, idx]):
        with bb.dataflow():
            updated = bb.emit(R.scatter_nd(cache, idx, bb.emit(R.exp(new)), reduction="update"))
            scores = bb.emit(R.matmul(q, bb.emit(R.permute_dims(updated, [0, 1, 3, 2]))))
            out = bb.emit_output(relax.Tuple([scores, updated]))
        bb.emit_func_output(out)
    return bb.get()


def test_scatter_nd_into_a_kv_cache_points_to_graphs():
    """The paper's second example: the updated cache is either a new tensor (stock: a copy of
    the cache plus the rows) or the caller's cache updated in place (``inplace=``); the plan has
    the in-place edge only where the caller allows it, and stays conflict-free either way."""
    mod = _kv_module()
    for inplace, expect in (((), 0), (("cache",), 1)):
        p = vtc_tvm.plan(mod, LLVM, inplace=inplace)
        assert _feasible(p)
        updates = [e for e in p.graph.edges if e.kind == "store" and e.consumer is None]
        assert len(updates) == expect and all(e.chosen for e in updates)
        # The transposed cache read by the matmul is a candidate load edge either way (taken
        # under "all"; the contiguity classes refuse its 4-element runs into a GEMM).
        assert any(e.kind == "load" and e.consumer_name == "matmul" for e in p.graph.edges)
        p_all = vtc_tvm.plan(mod, LLVM, inplace=inplace, strategy="all")
        assert _feasible(p_all)
        assert any(e.kind == "load" and e.chosen and e.consumer_name == "matmul" for e in p_all.graph.edges)


@pytest.mark.parametrize("strategy", ["contiguity", "all"])
def test_every_emitted_plan_is_conflict_free(strategy):
    from tests.test_core_pass import CASES

    for case in CASES[::3]:
        p = vtc_tvm.plan(make_module(case[2], case[3]), LLVM, strategy=strategy)
        assert _feasible(p), case[0]
        assert len({(r["tensor"], r["consumer"]) for r in p.rows}) == len(p.rows)


def _layers(n):
    def body(x, *ws):
        h = x
        for w in ws:
            h = emit(R.matmul(emit(R.nn.relu(emit(R.permute_dims(h)))), w))
        return h
    return make_module([((8, 8), F32)] + [((8, 8), F32)] * n, body)


def test_identical_layers_share_their_rewrites():
    candidates.REWRITES.clear()
    vtc_tvm.plan(_layers(1), LLVM)
    one = len(candidates.REWRITES)
    candidates.REWRITES.clear()
    vtc_tvm.plan(_layers(6), LLVM)
    assert one >= 1 and len(candidates.REWRITES) == one


def _llama_layers(n):
    from benchmarks.compile_time import llama_layers

    return llama_layers(n)


def _kernels(mod) -> list:
    """What ``main`` runs, binding by binding: the op, or the structure of the called PrimFunc
    (names differ between layers, structures do not)."""
    out = []
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) and v.op.name == "relax.call_tir":
                out.append(tvm_ffi.structural_hash(mod[v.args[0]]))
            else:
                out.append(v.op.name if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) else type(v).__name__)
    return out


def test_identical_layers_are_decided_and_emitted_as_copies_of_one_layer():
    """N identical decoder layers in one ``main`` (what the per-structure caches serve) get N
    copies of one layer's edges, costs and decisions, and N copies of its kernels (node names
    are numbered across the module: compared without the number)."""
    target = vtc_tvm.pipeline.cuda_target()  # with DLight's rule check

    def edges(p, kind):
        return [(e.kind, e.consumer_name.split("#")[0], e.legal, e.chosen, e.reason,
                 None if e.cost is None else (round(e.cost.gain_us, 9), e.cost.kernels, e.cost.memory))
                for e in p.graph.edges if e.kind == kind]

    candidates.clear_caches()
    one = vtc_tvm.plan(_llama_layers(1), target, memory_guard=True)
    candidates.clear_caches()
    three = vtc_tvm.plan(_llama_layers(3), target, memory_guard=True)
    # (store edges are made once a function is walked: after every layer's load edges)
    assert any(e[3] for e in edges(one, "load")) and edges(three, "load") == edges(one, "load") * 3
    assert edges(three, "store") == edges(one, "store") * 3
    assert {e.kind for e in three.graph.edges} <= {"load", "store"}
    assert three.summary["predicted"]["kernels"] == 3 * one.summary["predicted"]["kernels"]
    emitted = [_kernels(vtc_tvm.VirtualTensorize(target=target, memory_guard=True)(_llama_layers(n)))
               for n in (1, 3)]
    assert emitted[1] == emitted[0] * 3


def test_mappings_shared_between_layers_emit_what_per_binding_mappings_emit(monkeypatch):
    """A built-in rule's mapping is derived once per structure and shared by identical layers;
    where the module shows a mapping (the index maps of ``vtc.virtual_inputs``) each binding
    has variables of its own, so the module is the one rules run for every binding give
    (structurally: which index maps share variables included), cold or warm."""
    target = vtc_tvm.pipeline.cuda_target()
    mod = _llama_layers(2)
    compile_ = lambda: vtc_tvm.VirtualTensorize(target=target, memory_guard=True)(mod)
    candidates.clear_caches()
    shared = compile_()
    assert candidates.MOVEMENTS
    warm = compile_()
    with monkeypatch.context() as m:
        m.setattr(candidates, "is_builtin_rule", lambda name: False)  # every binding its own mapping
        candidates.clear_caches()
        own = compile_()
    for other in (warm, own):
        assert tvm_ffi.structural_equal(shared, other) and shared.script() == other.script()


def test_a_gather_of_a_gather_of_the_same_structure_composes_correctly(rng):
    """Two ``take`` of one structure share one derived mapping (and its buffers): composed
    with itself, the outer index tensor must stay the outer one (``compose`` tells sources apart
    by buffer, so the inner one gets buffers of its own)."""
    params = [param((8, 8), F32), param((8,), "int64", 0, 8), param((8,), "int64", 0, 8)]

    def body(x, i, j):
        return R.exp(emit(R.take(emit(R.take(x, i, axis=0)), j, axis=0)))

    mod = make_module(params, body)
    candidates.clear_caches()
    out = vtc_tvm.VirtualTensorize(target=LLVM, strategy="all")(mod)
    assert any(n.name_hint.startswith("exp_vtc") for n in out.get_global_vars())
    inputs = random_inputs(params, rng)
    assert_outputs_equal(run(out, inputs), run(mod, inputs))


def test_cached_rule_mapping_keeps_argument_aliasing(rng):
    """Rule mappings are cached per call structure: ``concat([a, a])`` derives a mapping over one
    source, and re-attached to a later ``concat([x, y])`` of the same types it read ``x`` twice
    (a wrong result, found by the suite's order). The aliasing of the slots is part of the key."""
    vtc_tvm.VirtualTensorize(target=LLVM)(make_module(
        [((4, 8), F32), ((8, 8), F32)], lambda a, w: R.matmul(emit(R.concat([a, a], 0)), w)))
    params = [((4, 8), F32), ((4, 8), F32), ((8, 8), F32)]
    mod = make_module(params, lambda x, y, w: R.matmul(emit(R.concat([x, y], 0)), w))
    inputs = random_inputs(params, rng)
    want, got = run(mod, inputs), run(vtc_tvm.VirtualTensorize(target=LLVM)(mod), inputs)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def _reshapes_into_matmuls(x, y, w):
    """The o-projection of attention reading ``reshape(heads)`` (a free view: stock TVM copies
    nothing), and one reading ``reshape(transpose(heads))`` (a real copy, which the reshape keeps
    alive unless its reader reads through both)."""
    free = emit(R.reshape(emit(R.exp(x)), (8, 256)))
    moved = emit(R.reshape(emit(R.permute_dims(emit(R.exp(y)), [1, 0, 2])), (8, 256)))
    return R.add(emit(R.matmul(free, w)), emit(R.matmul(moved, w)))


@pytest.mark.parametrize("target, free_taken", [(LLVM, False), (vtc_tvm.pipeline.cuda_target(), True)])
def test_free_views_are_credited_by_target_and_composed_reshapes_by_their_copy(target, free_taken, rng):
    params = [((8, 4, 64), F32), ((4, 8, 64), F32), ((256, 32), F32)]
    mod = make_module(params, _reshapes_into_matmuls)
    p = vtc_tvm.plan(mod, target)
    reshapes = [n for n in p.graph.nodes if n.op == "relax.reshape"]
    free = next(n for n in reshapes if n.free_view)
    moved = next(n for n in reshapes if not n.free_view)
    # On the CPU the index arithmetic a reshape adds to a GEMM's loop is not free: no credit,
    # the reshape stays the view stock makes of it. On GPUs a token credit takes it.
    assert copy_saved(free, target) == cost.view_credit(target)
    assert (free.var in p.physical) is not free_taken
    # The reshape of the transpose saves the transpose's copy (the same bytes), not a token.
    assert copy_saved(moved, target) == cost.copy_saving(moved.bytes, target)
    (edge,) = [e for e in p.graph.edges if e.kind == "load" and e.src == moved.id]
    assert edge.chosen and edge.cost.kernels == -1 and edge.cost.gain_us > 1.0, edge.cost
    if target.kind.name == "llvm":
        out = vtc_tvm.VirtualTensorize(target=target)(mod)
        inputs = random_inputs(params, rng)
        assert_outputs_equal(run(out, inputs), run(mod, inputs))


def test_a_free_view_of_a_constant_is_read_through_on_the_cpu_too(rng):
    """A reshaped weight (ONNX models carry weights as constants): kept, FoldConstant would build
    and run a kernel for it at compile time (1.7 s of ShuffleNetV2's CPU compile), so its reader
    reads the constant through the mapping on every target."""
    w = relax.const(rng.standard_normal((4, 8)).astype(F32))
    params = [((3, 32), F32)]
    mod = make_module(params, lambda x: R.matmul(x, emit(R.reshape(w, (32, 1)))))
    p = vtc_tvm.plan(mod, LLVM)
    (view,) = [n for n in p.graph.nodes if n.op == "relax.reshape"]
    assert view.free_view and view.of_constants
    assert copy_saved(view, LLVM) == cost.CONSTANT_VIEW_US > cost.view_credit(LLVM)
    assert view.var not in p.physical
    out = vtc_tvm.VirtualTensorize(target=LLVM)(mod)
    inputs = random_inputs(params, rng)
    assert_outputs_equal(run(out, inputs), run(mod, inputs))


def test_largest_bytes_puts_symbolic_dimensions_at_their_bounds():
    n, b = tvm.tirx.Var("n", "int64"), tvm.tirx.Var("b", "int64")
    i64 = lambda v: tvm.tirx.IntImm("int64", v)
    assert cost.largest_bytes((i64(3), i64(4)), "float16", {}) == 24
    assert cost.largest_bytes((n, i64(64)), "float16", {}) == cost.SYMBOLIC_EXTENT * 64 * 2
    assert cost.largest_bytes((n + 1, b * 2), "float32", {"n": 100, "b": 3}) == 101 * 6 * 4
    assert cost.largest_bytes((n * n * b * b,), "float16", {}) is None  # could overflow int64


def _narrow_module(n, bound=None):
    """A transpose whose source rows are 2 elements, summed: read through it, the reduction wastes
    most of each transaction (the read penalty outgrows the copy's bytes), a loss per byte."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, 2), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.permute_dims(x, [1, 0]))
            out = bb.emit_output(bb.emit(relax.op.sum(y, axis=[0])))
        bb.emit_func_output(out)
    mod = bb.get()
    return mod if bound is None else tvm.IRModule({"main": mod["main"].with_attr("tir_var_upper_bound", {"n": bound})})


def test_a_symbolic_tensor_is_costed_at_its_largest_size():
    """A gain is a launch plus a per-byte term: decided at the largest size, a read that loses per
    byte stays physical (without a bound: symbolic sizes reach SYMBOLIC_EXTENT), and with a
    declared bound the symbolic graph decides as its static instance at that bound does (before,
    symbolic tensors were costed at zero bytes: the launch alone, always taken)."""
    target = vtc_tvm.pipeline.cuda_target()
    n = tvm.tirx.Var("n", "int64")

    def load_edge(mod):
        (edge,) = [e for e in vtc_tvm.plan(mod, target).graph.edges if e.kind == "load"]
        return edge

    unbounded = load_edge(_narrow_module(n))
    assert not unbounded.chosen and unbounded.cost.gain_us < 0, unbounded.cost
    for size in (64, 65536):
        static, bounded = load_edge(_narrow_module(size)), load_edge(_narrow_module(n, bound=size))
        assert static.chosen and bounded.chosen
        assert bounded.cost.gain_us == pytest.approx(static.cost.gain_us)
        assert bounded.cost.memory == 0  # the memory prediction is static only
