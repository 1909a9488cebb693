"""Store side through inverse mappings: producers write each element at its final address, so a
copy of their output (a permute, a head-major reshape + transpose, a concat, a channel shuffle,
the rows of an in-place cache update) is never run. Everything is checked against stock TVM on
fresh random inputs; refusals are checked by their reason."""

import dataclasses

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.relax import op as R

import vtc_tvm
from vtc_tvm.inverse import NotOneToOne, store_maps
from vtc_tvm.mapping import _eval_np
from vtc_tvm.pipeline import cuda_target, vtc_pipeline
from vtc_tvm.report import device_source, kernel_census, run_vm
from vtc_tvm.rules import get_rule
from vtc_tvm.transform import VirtualTensorize

LLVM = tvm.target.Target("llvm")
F32 = "float32"


# -- the inverse itself ---------------------------------------------------------------------------
def _mapping(expr_fn, *shapes):
    """The composed mapping of a nested chain of movement ops on fresh variables."""
    xs = [relax.Var(f"x{i}", relax.TensorType(s, F32)) for i, s in enumerate(shapes)]
    bb = relax.BlockBuilder()

    def of(c):
        m = get_rule(c.op.name)(c).mapping
        args = list(c.args[0].fields) if c.op.name == "relax.concat" else [c.args[0]]
        for j in reversed(range(len(args))):
            inner = bb.lookup_binding(args[j]) if isinstance(args[j], relax.Var) else None
            if isinstance(inner, relax.Call):
                m = m.compose(j, of(inner))
        return m

    with bb.function("f", xs):
        with bb.dataflow():  # (nested calls become bindings of their own)
            mapping = of(bb.normalize(expr_fn(*xs)))
            out = bb.emit_output(xs[0])
        bb.emit_func_output(out)
    return mapping


def _check_inverse(mapping):
    """Every source element is stored exactly where the copy would have put it, and the stores
    of all sources together write every output element once."""
    rng = np.random.default_rng()
    srcs = [rng.standard_normal([int(d) for d in mapping.source_shape(j)]).astype(F32)
            for j in range(len(mapping.sources))]
    want = mapping.apply_numpy(srcs)
    written = np.zeros(want.shape, np.int64)
    for box in store_maps(mapping):
        shape = srcs[box.source].shape
        idx = [tirx.Var(f"i{k}", "int64") for k in range(len(shape))]
        grids = np.indices(shape, dtype=np.int64)
        env = dict(zip(idx, grids))
        where = tuple(np.broadcast_to(_eval_np(e, env, {}), shape) for e in box.inverse(shape)(idx))
        np.testing.assert_array_equal(want[where], srcs[box.source])
        np.add.at(written, where, 1)
    assert (written == 1).all()


ONE_TO_ONE = {
    "permute": (lambda a: R.permute_dims(a, [2, 0, 1]), [(3, 4, 5)]),
    "head_major": (lambda a: R.permute_dims(R.reshape(a, (2, 1, 4, 8)), [0, 2, 1, 3]), [(2, 1, 32)]),
    "reshape_of_permute": (lambda a: R.reshape(R.permute_dims(a, [1, 0, 2]), (6, 8)), [(2, 3, 8)]),
    "concat": (lambda a, b, c: R.concat([a, b, c], axis=1), [(2, 3), (2, 5), (2, 1)]),
    "concat_then_transpose": (lambda a, b: R.permute_dims(R.concat([a, b], axis=0)), [(3, 4), (5, 4)]),
    "channel_shuffle": (lambda a, b: R.reshape(R.permute_dims(R.reshape(R.concat([a, b], axis=1), (2, 2, 4, 3)),
                                                              [0, 2, 1, 3]), (2, 8, 3)), [(2, 4, 3), (2, 4, 3)]),
    "kv_append_head_major": (lambda p, a: R.concat([p, R.permute_dims(R.reshape(a, (2, 1, 2, 4)), [0, 2, 1, 3])],
                                                   axis=2), [(2, 2, 5, 4), (2, 1, 8)]),
}


@pytest.mark.parametrize("form", sorted(ONE_TO_ONE))
def test_store_maps_invert_one_to_one_mappings(form):
    fn, shapes = ONE_TO_ONE[form]
    _check_inverse(_mapping(fn, *shapes))


REFUSED = {
    "slice (out of range)": (lambda a: R.strided_slice(a, [0], [2], [5]), [(8, 4)], "differ in size"),
    "broadcast (overlapping)": (lambda a: R.broadcast_to(a, (3, 4)), [(1, 4)], "differ in size"),
    "repeat (overlapping)": (lambda a: R.repeat(a, 2, axis=0), [(3, 4)], "differ in size"),
    "pad (a constant piece)": (lambda a: R.nn.pad(a, [1, 1]), [(4,)], "constant"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_store_maps_refuse_what_is_not_one_to_one(case):
    fn, shapes, reason = REFUSED[case]
    with pytest.raises(NotOneToOne, match=reason):
        for box in store_maps(_mapping(fn, *shapes)):
            box.inverse(_mapping(fn, *shapes).source_shape(box.source))


def test_same_size_but_not_one_to_one_is_refused():
    from vtc_tvm.inverse import piece_box

    v = [tirx.Var(f"v{k}", "int64") for k in range(2)]
    with pytest.raises(NotOneToOne, match="not one-to-one"):  # out[a, b] = src[a, a]: 16 = 16 elements
        piece_box(v, [4, 4], [v[0], v[0] * 0 + v[0]]).inverse([4, 4])


def test_symbolic_shapes_are_refused():
    n = tirx.Var("n", "int64")
    with pytest.raises(NotOneToOne, match="symbolic"):
        store_maps(_mapping(lambda a: R.permute_dims(a), (n, 4)))


# -- end to end on LLVM against stock ---------------------------------------------------------------
def _module(shapes, body, dtypes=None):
    params = [relax.Var(f"p{i}", relax.TensorType(s, F32)) for i, s in enumerate(shapes)]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *params))
        bb.emit_func_output(out)
    return bb.get()


def _compare(mod, report, target=LLVM, inplace=()):
    """Stock and vtc agree on fresh random inputs (each build gets its own copies: in-place
    updates change their caller's tensors)."""
    rng = np.random.default_rng()
    args = [rng.standard_normal([int(d) for d in p.ty.shape]).astype(F32) for p in mod["main"].params]

    def run(pipeline):
        return run_vm(tvm.compile(mod, target=target, relax_pipeline=pipeline), tvm.cpu(), [a.copy() for a in args])

    want = run(relax.get_default_pipeline(LLVM))
    got = run(vtc_pipeline(LLVM, report=report, inplace=inplace))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def _stores(report):
    return [d for d in report if d.get("side") == "store"]


PRODUCED = {
    # name: (input shapes, body): a kernel's output reaches the function output through a copy
    "permute": ([(6, 8), (8, 10)], lambda bb, x, w: R.permute_dims(bb.emit(R.matmul(x, w)))),
    # (a lone head-major output needs no store side: FuseOps fuses the transpose into the GEMM)
    "kv_append_head_major": ([(2, 1, 16), (16, 32), (2, 4, 5, 8)], lambda bb, x, w, past: R.concat([past, bb.emit(
        R.permute_dims(bb.emit(R.reshape(bb.emit(R.matmul(x, w)), (2, 1, 4, 8))), [0, 2, 1, 3]))], axis=2)),
    "concat_then_transpose": ([(6, 8), (8, 4), (8, 5)], lambda bb, x, w1, w2: R.permute_dims(bb.emit(R.concat(
        [bb.emit(R.nn.relu(bb.emit(R.matmul(x, w1)))), bb.emit(R.matmul(x, w2))], axis=1)))),
    "channel_shuffle": ([(2, 8, 3, 3), (4, 4, 1, 1)], lambda bb, x, w: _shuffle(bb, x, w)),
}


def _shuffle(bb, x, w):
    halves = bb.emit(R.split(x, 2, axis=1))
    x1, x2 = bb.emit(relax.TupleGetItem(halves, 0)), bb.emit(relax.TupleGetItem(halves, 1))
    y = bb.emit(R.concat([x1, bb.emit(R.nn.relu(bb.emit(R.nn.conv2d(x2, w))))], axis=1))
    y = bb.emit(R.permute_dims(bb.emit(R.reshape(y, (2, 2, 4, 3, 3))), [0, 2, 1, 3, 4]))
    return R.reshape(y, (2, 8, 3, 3))


@pytest.mark.parametrize("form", sorted(PRODUCED))
def test_producer_stores_through_the_inverse(form):
    shapes, body = PRODUCED[form]
    mod = _module(shapes, body)
    report = []
    _compare(mod, report)
    taken = [d for d in _stores(report) if d["virtual"]]
    assert taken and not [d for d in _stores(report) if not d["virtual"]], report
    stock = kernel_census(mod, LLVM)
    vtc = kernel_census(VirtualTensorize(target=LLVM)(mod), LLVM, stores=True)
    assert vtc["kernels"] <= stock["kernels"] and vtc["data_movement"] <= stock["data_movement"], (stock, vtc)
    assert vtc["planned_bytes"] <= stock["planned_bytes"], (stock, vtc)
    assert (vtc["data_movement"], vtc["planned_bytes"]) < (stock["data_movement"], stock["planned_bytes"])
    # (one copy stays where a piece is an input, which no kernel produces: x's first half in the
    # shuffle, the past rows of the KV append)
    assert vtc["data_movement"] == (1 if form in ("channel_shuffle", "kv_append_head_major") else 0)


def test_producer_with_two_readers_keeps_its_layout():
    def body(bb, x, w):
        y = bb.emit(R.matmul(x, w))
        return relax.Tuple([bb.emit(R.permute_dims(y)), bb.emit(R.sum(y, axis=[0]))])

    mod = _module([(6, 8), (8, 10)], body)
    report = []
    _compare(mod, report)
    assert not _stores(report), report  # the plan refused: nothing reaches the store side
    p = vtc_tvm.plan(mod, LLVM)
    refused = [e for e in p.graph.edges if e.kind == "store"]
    assert refused and not any(e.chosen for e in refused) and not p.store_side()
    assert all("read elsewhere" in e.reason for e in refused), [e.reason for e in refused]


@pytest.mark.parametrize("case, reason", [
    ("repeat", "not one-to-one onto a box"),          # overlapping: two output elements per source element
    ("broadcast", "not one-to-one onto a box"),       # overlapping: a row read by every output row
    ("strided_slice", "not one-to-one onto a box"),   # every other row: not a box of the source
    ("pad", "constant"),                              # the padding: no producer writes it
])
def test_copies_that_are_not_one_to_one_stay(case, reason):
    def body(bb, x, w):
        y = bb.emit(R.nn.relu(bb.emit(R.matmul(x, w))))
        if case == "repeat":
            return R.repeat(y, 2, axis=1)
        if case == "broadcast":
            return R.broadcast_to(bb.emit(R.strided_slice(bb.emit(R.sum(y, axis=[0], keepdims=True)), [1], [0], [8])),
                                  (6, 8))
        if case == "strided_slice":
            return R.strided_slice(y, [0], [0], [6], [2])
        return R.nn.pad(y, [0, 0, 1, 1])

    mod = _module([(6, 8), (8, 10)], body)
    report = []
    _compare(mod, report)
    refused = _stores(report)
    assert refused and not any(d["virtual"] for d in refused), report
    assert all(reason in d["reason"] for d in refused), refused


def test_symbolic_batch_is_left_to_the_copy():
    n = tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 8), F32))
    w = relax.Var("w", relax.TensorType((8, 10), F32))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(R.permute_dims(bb.emit(R.matmul(x, w))))
        bb.emit_func_output(out)
    mod = bb.get()
    rng = np.random.default_rng()
    args = [rng.standard_normal((5, 8)).astype(F32), rng.standard_normal((8, 10)).astype(F32)]
    report = []
    got = run_vm(tvm.compile(mod, LLVM, relax_pipeline=vtc_pipeline(LLVM, report=report)), tvm.cpu(), args)
    np.testing.assert_allclose(got[0], (args[0] @ args[1]).T, rtol=1e-5, atol=1e-5)
    assert not any(d["virtual"] for d in _stores(report))


def test_the_store_side_executes_only_the_plan():
    """The store side makes no decision: a copy the plan did not mark (here: the marks removed,
    and a module that never went through VirtualTensorize) keeps its producer as it is."""
    from vtc_tvm.stores import STORE_PLAN, VirtualTensorizeStores, _unmarked, planned_inputs

    shapes, body = PRODUCED["permute"]
    T = relax.transform
    fuse = tvm.transform.Sequential([T.LegalizeOps(), T.AnnotateTIROpPattern(), T.FuseOps(), T.FuseTIR()])
    with LLVM:
        fused = fuse(VirtualTensorize(target=LLVM)(_module(shapes, body)))
        stock = fuse(_module(shapes, body))
    marked = [gv for gv, f in fused.functions_items() if isinstance(f, tirx.PrimFunc) and planned_inputs(f)]
    assert len(marked) == 1, fused
    report = []
    stored = VirtualTensorizeStores(LLVM, report=report)(fused)
    assert [d["virtual"] for d in report] == [True] and STORE_PLAN not in stored.script()
    for gv in marked:
        fused[gv] = _unmarked(fused[gv])
    for mod in (fused, stock):
        report = []
        out = VirtualTensorizeStores(LLVM, report=report)(mod)
        assert not report and tvm_ffi.structural_equal(out["main"], relax.transform.DeadCodeElimination()(mod)["main"])


# -- parts that must exist on their own: the producer writes each part (issue 16) ------------------
def _parts(bb, t, sections, axis, heads=None):
    """The parts of ``t`` split along ``axis``, each a function output (head-major when
    ``heads`` = (B, H, D) is given): they must exist, so stock copies them out of ``t``."""
    split = bb.emit(R.split(t, sections, axis=axis))
    n = sections if isinstance(sections, int) else len(sections) + 1
    outs = [bb.emit(relax.TupleGetItem(split, i)) for i in range(n)]
    if heads is not None:
        b, h, d = heads
        outs = [bb.emit(R.permute_dims(bb.emit(R.reshape(p, (b, 1, h, d))), [0, 2, 1, 3])) for p in outs]
    return relax.Tuple(outs)


def _gemm(bb, x, w, b=None):
    y = bb.emit(R.matmul(x, w))
    return y if b is None else bb.emit(R.nn.relu(bb.emit(R.add(y, b))))


PARTS = {
    # the fused QKV GEMM: q, k and v each a tensor of their own
    "qkv_split": ([(2, 1, 16), (16, 96)], lambda bb, x, w: _parts(bb, _gemm(bb, x, w), 3, 2)),
    # ... in the head-major layout attention reads: the GEMM writes each part through the inverse
    "qkv_head_major": ([(2, 1, 16), (16, 96)], lambda bb, x, w: _parts(bb, _gemm(bb, x, w), 3, 2, (2, 4, 8))),
    # a fused producer (GEMM + bias + ReLU), uneven parts
    "gemm_epilogue_split": ([(8, 16), (16, 24), (24,)], lambda bb, x, w, b: _parts(bb, _gemm(bb, x, w, b), [4, 16], 1)),
    # a reduction-shaped producer split along rows
    "softmax_split": ([(8, 32)], lambda bb, x: _parts(bb, bb.emit(R.nn.softmax(x, axis=1)), 2, 0)),
    # two slices that leave a gap: the rows nobody reads are not stored
    "slices_with_a_gap": ([(8, 16), (16, 12)], lambda bb, x, w: (lambda y: relax.Tuple([
        bb.emit(R.strided_slice(y, [0], [0], [2])), bb.emit(R.strided_slice(y, [0], [5], [8]))]))(_gemm(bb, x, w))),
}


@pytest.mark.parametrize("form", sorted(PARTS))
def test_producer_writes_the_parts_that_must_exist(form):
    shapes, body = PARTS[form]
    mod = _module(shapes, body)
    report = []
    _compare(mod, report)
    stores = _stores(report)
    assert stores and all(d["virtual"] for d in stores), report
    stock = kernel_census(mod, LLVM)
    vtc = kernel_census(VirtualTensorize(target=LLVM)(mod), LLVM, stores=True)
    assert vtc["data_movement"] == 0 < stock["data_movement"], (stock, vtc)
    assert vtc["kernels"] < stock["kernels"] and vtc["planned_bytes"] <= stock["planned_bytes"], (stock, vtc)


PARTS_REFUSED = {
    # one element in two parts: it cannot have two homes
    "overlapping_slices": ([(8, 16), (16, 12)], lambda bb, x, w: (lambda y: relax.Tuple([
        bb.emit(R.strided_slice(y, [0], [0], [5])), bb.emit(R.strided_slice(y, [0], [3], [8]))]))(_gemm(bb, x, w)),
        "overlapping"),
    # rows picked at runtime: no inverse (a row may be read twice, or never)
    "take_rows": ([(8, 16), (16, 12), (5,)], lambda bb, x, w, i: R.take(_gemm(bb, x, w), bb.emit(
        R.astype(R.clip(R.abs(i), 0, 0), "int64")), axis=0), "outside its source"),
    # a part is an output, the whole is also read by a kernel: it keeps its own buffer
    "part_and_a_reader": ([(8, 16), (16, 12)], lambda bb, x, w: (lambda y: relax.Tuple([
        bb.emit(R.strided_slice(y, [0], [0], [4])), bb.emit(R.sum(y, axis=[0]))]))(_gemm(bb, x, w)), None),
}


@pytest.mark.parametrize("form", sorted(PARTS_REFUSED))
def test_parts_that_cannot_be_stored_stay_copies(form):
    shapes, body, reason = PARTS_REFUSED[form]
    mod = _module(shapes, body)
    report = []
    _compare(mod, report)
    stores = _stores(report)
    assert not any(d["virtual"] for d in stores), report
    if reason is not None:  # refused after fusion, with the reason
        assert stores and all(reason in d["reason"] for d in stores), stores
    else:  # refused by the plan: read elsewhere
        p = vtc_tvm.plan(mod, LLVM)
        edges = [e for e in p.graph.edges if e.kind == "store"]
        assert edges and not any(e.chosen for e in edges), [e.reason for e in edges]
        assert all("read elsewhere" in e.reason for e in edges), [e.reason for e in edges]


# -- CUDA: every form generates code, the redirected producer keeps its DLight rule ---------------
@pytest.mark.parametrize("forms,form", [("parts", f) for f in sorted(PARTS)] + [("produced", f) for f in sorted(PRODUCED)])
def test_cuda_code_for_each_form(forms, form):
    """CUDA code for each form; a redirected producer keeps its DLight rule or stays as it is
    (refused, logged: e.g. DLight's Matmul rule does not take a GEMM storing into several tensors)."""
    shapes, body = {"parts": PARTS, "produced": PRODUCED}[forms][form]
    mod = _module(shapes, body)
    target = cuda_target()
    report = []
    ex = tvm.compile(mod, target=target, relax_pipeline=vtc_pipeline(target, report=report))
    decisions = _stores(report)
    assert decisions, report
    for d in decisions:  # taken, or refused because DLight would schedule it differently
        assert d["virtual"] or "DLight" in d["reason"], d
    src = device_source(ex)
    assert "__global__" in src
    if any(d["virtual"] for d in decisions):
        assert "_into_" in src


# -- in-place cache updates on CUDA: only the new rows are written --------------------------------
B, H, T, D = 2, 2, 8, 16


def _cache_update(kind):
    cache = relax.Var("cache", relax.TensorType((B, H, T, D), F32))
    new = relax.Var("new", relax.TensorType((B, H, 1, D), F32))
    extra = []
    if kind == "scatter_nd":
        extra = [relax.Var("idx", relax.TensorType((B, H, 1, 3), "int64"))]
        update = lambda: R.scatter_nd(cache, extra[0], new, reduction="update")
    elif kind == "scatter_elements":
        extra = [relax.Var("idx", relax.TensorType((B, H, 1, D), "int64"))]
        update = lambda: R.scatter_elements(cache, extra[0], new, axis=2)
    else:
        update = lambda: R.slice_scatter(cache, new, 5, 6, 1, axis=2)
    bb = relax.BlockBuilder()
    with bb.function("main", [cache, new] + extra):
        with bb.dataflow():
            out = bb.emit_output(update())
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("kind", ["scatter_nd", "scatter_elements", "slice_scatter"])
def test_cuda_cache_update_never_copies_the_cache(kind):
    target = cuda_target()
    mod = _cache_update(kind)
    report = []
    with target:
        lowered = vtc_pipeline(target, inplace=["cache"], report=report)(mod)
    assert any("updated in place" in d["reason"] and d["virtual"] for d in report), report
    # No kernel allocates a tensor of the cache's shape: the cache is never copied.
    call_tir, full = tvm.ir.Op.get("relax.call_tir"), []
    relax.analysis.post_order_visit(lowered["main"], lambda e: full.append(e) if isinstance(e, relax.Call)
                                    and e.op.same_as(call_tir) and isinstance(e.ty, relax.TensorType)
                                    and [int(d) for d in e.ty.shape] == [B, H, T, D] else None)
    assert not full, full
    src = device_source(tvm.compile(mod, target=target, relax_pipeline=vtc_pipeline(target, inplace=["cache"])))
    assert f"{kind}_inplace_kernel" in src


def test_update_schedule_vectorises_aligned_rows():
    from vtc_tvm.copy_schedule import schedule_update
    from vtc_tvm.inplace import inplace_update

    call = relax.BlockBuilder().normalize(R.slice_scatter(relax.Var("c", relax.TensorType((B, H, T, D), F32)),
                                                          relax.Var("n", relax.TensorType((B, H, 1, D), F32)),
                                                          5, 6, 1, axis=2))
    kernel = inplace_update(call, "cache")[0]
    scheduled = schedule_update(kernel, cuda_target())
    ex = tvm.compile(tvm.IRModule({"main": scheduled.with_attr("global_symbol", "main")}), target=cuda_target())
    assert "float4" in device_source(ex)
    assert schedule_update(kernel, LLVM) is None


# -- the decode layers: no copy kernel left --------------------------------------------------------
@pytest.mark.parametrize("name", ["llama_decode", "gemma2_decode"])
@pytest.mark.parametrize("batch", [1, 16])
def test_decode_layers_have_no_copy_kernel_left(name, batch):
    from benchmarks.workloads import WORKLOADS

    target = cuda_target()
    wl = WORKLOADS[name]
    mod = wl.build(dataclasses.replace(wl.config("small", batch), kv_cache="static"))
    stock = kernel_census(mod, target)
    vtc = kernel_census(VirtualTensorize(target=target, inplace=["past_k", "past_v"])(mod), target, stores=True)
    assert vtc["data_movement"] == 0 and stock["data_movement"] > 0, (stock, vtc)
    assert vtc["kernels"] < stock["kernels"], (stock, vtc)


def test_static_cache_decode_layer_matches_stock():
    from benchmarks.workloads import WORKLOADS

    wl = WORKLOADS["llama_decode"]
    mod = wl.build(dataclasses.replace(wl.config("small", 2), kv_cache="static"))
    report = []
    _compare(mod, report, inplace=["past_k", "past_v"])
    assert sum(d["virtual"] for d in _stores(report)) >= 1, report


def test_schedule_copies_schedules_updates_dlight_cannot():
    """A scatter whose row index is a select (how the in-place scatter_elements used to be
    written) makes DLight's analysis assert; ScheduleCopies gives it schedule_update."""
    from vtc_tvm.copy_schedule import ScheduleCopies
    from vtc_tvm.mapping import Mapping, new_buffer
    from vtc_tvm.rewrite import NotRewritable, check_schedulable, redirect_output

    target = cuda_target()
    idx = new_buffer((B, H, 1, D), "int64", "idx")

    def store(v):
        i = tirx.BufferLoad(idx, list(v))
        return [v[0], v[1], tirx.if_then_else(i < 0, i + T, i), v[3]]

    copy = Mapping.identity([B, H, 1, D], F32).to_prim_func("update")
    kernel = redirect_output(copy, [B, H, T, D], store, "cache", extra_params=[idx])
    with pytest.raises(NotRewritable, match="DLight"):
        check_schedulable(kernel, target)
    mod = ScheduleCopies(target)(tvm.IRModule({"main": kernel.with_attr("global_symbol", "main")}))
    assert "tirx.is_scheduled" in mod["main"].attrs
    assert "__global__" in device_source(tvm.compile(mod, target=target))


def _rope_k_into_cache():
    """K = RoPE(heads(x @ w_k)) scattered into the cache rows at runtime positions."""
    cache = relax.Var("cache", relax.TensorType((B, H, T, D), F32))
    x = relax.Var("x", relax.TensorType((B, 1, 16), F32))
    w = relax.Var("w", relax.TensorType((16, H * D), F32))
    cos = relax.Var("cos", relax.TensorType((B, 1, 1, D), F32))
    sin = relax.Var("sin", relax.TensorType((B, 1, 1, D), F32))
    idx = relax.Var("idx", relax.TensorType((B, H, 1, 3), "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [cache, x, w, cos, sin, idx]):
        with bb.dataflow():
            k = bb.emit(R.permute_dims(bb.emit(R.reshape(bb.emit(R.matmul(x, w)), (B, 1, H, D))), [0, 2, 1, 3]))
            lo = bb.emit(R.strided_slice(k, axes=[3], begin=[0], end=[D // 2]))
            hi = bb.emit(R.strided_slice(k, axes=[3], begin=[D // 2], end=[D]))
            rot = bb.emit(R.concat([bb.emit(R.negative(hi)), lo], axis=3))
            k = bb.emit(R.add(bb.emit(R.multiply(k, cos)), bb.emit(R.multiply(rot, sin))))
            out = bb.emit_output(R.scatter_nd(cache, idx, k, reduction="update"))
        bb.emit_func_output(out)
    return bb.get()


def test_rope_k_stored_into_the_cache_rows():
    mod = _rope_k_into_cache()
    rng = np.random.default_rng()
    b, h = np.meshgrid(np.arange(B), np.arange(H), indexing="ij")
    pos = rng.integers(0, T)
    idx = np.stack([b, h, np.full_like(b, pos)], -1)[:, :, None, :].astype("int64")
    args = [rng.standard_normal([int(d) for d in p.ty.shape]).astype(F32) for p in mod["main"].params[:-1]] + [idx]

    def run(pipeline):
        ex = tvm.compile(mod, target=LLVM, relax_pipeline=pipeline)
        return run_vm(ex, tvm.cpu(), [a.copy() for a in args])[0]

    report = []
    np.testing.assert_allclose(run(vtc_pipeline(LLVM, inplace=["cache"], report=report)),
                               run(relax.get_default_pipeline(LLVM)), rtol=1e-5, atol=1e-5)
    assert any(d.get("side") == "store" and d["virtual"] for d in report), report
    target = cuda_target()
    report = []
    src = device_source(tvm.compile(mod, target=target, relax_pipeline=vtc_pipeline(
        target, inplace=["cache"], report=report)))
    assert any(d.get("side") == "store" and d["virtual"] for d in report), report
    assert "_into_" in src and "scatter_nd_inplace_kernel" not in src
