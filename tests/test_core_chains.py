"""Chains of movement ops compose into ONE mapping: check the composed index expressions
themselves (through get_rule + Mapping.compose, and through the rewritten consumer's
``vtc.virtual_inputs`` IndexMap), and the numerics against stock TVM."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.ir import Range

import vtc_tvm
from vtc_tvm import VirtualTensor
from vtc_tvm.mapping import _eval_np
from vtc_tvm.rewrite import MAPPING_ATTR
from vtc_tvm.rules import get_rule

from .conftest import called_prim_funcs, emit, kernels, make_module, random_inputs, run

R = relax.op
F32 = "float32"


# -- helpers ---------------------------------------------------------------------------------
def composed_mappings(mod, func="main"):
    """{var: VirtualTensor over physical tensors}, composing each rule's mapping with the
    mappings of its (virtual) sources through ``Mapping.compose``."""
    virt, bindings = {}, {}
    for block in mod[func].body.blocks:
        for b in block.bindings:
            bindings[b.var] = v = b.value
            if isinstance(v, relax.TupleGetItem) and isinstance(virt.get(v.tuple_value), list):
                virt[b.var] = virt[v.tuple_value][v.index]
                continue
            if not (isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) and get_rule(v.op.name)):
                continue
            args = [bindings[a] if isinstance(bindings.get(a), relax.Tuple) else a for a in v.args]
            call = relax.BlockBuilder().normalize(relax.Call(v.op, args, v.attrs, v.ty_args))
            result = get_rule(v.op.name)(call)

            def compose(vt):
                m, srcs, j = vt.mapping, list(vt.sources), 0
                while j < len(srcs):
                    inner = virt.get(srcs[j])
                    if isinstance(inner, VirtualTensor):
                        m = m.compose(j, inner.mapping)
                        srcs = srcs[:j] + srcs[j + 1:] + list(inner.sources)
                    else:
                        j += 1
                return VirtualTensor(m, srcs)

            virt[b.var] = [compose(r) for r in result] if isinstance(result, list) else compose(result)
    return virt


def last_virtual(mod):
    virt = composed_mappings(mod)
    return virt[list(virt)[-1]]


def _divmods(e):
    n = []
    tvm_ffi.structural_walk(e, [(tirx.FloorDiv, n.append), (tirx.FloorMod, n.append)], order="post")
    return len(n)


def assert_indices(index_vars, shape, finals, expected, max_divmod=None):
    """``finals`` equal ``expected(*index_vars)`` for every index in ``shape`` (proved by the
    analyzer), and — when given — use at most ``max_divmod`` floordiv/floormod nodes in all."""
    ana = tvm.sym.Analyzer()
    for v, n in zip(index_vars, shape):
        ana.bind(v, Range(0, tirx.IntImm("int64", n)))
    want = list(expected(*index_vars))
    assert len(finals) == len(want), (finals, want)
    grid = dict(zip(index_vars, np.indices(shape, dtype=np.int64)))
    for got, exp in zip(finals, want):
        exp = tirx.IntImm("int64", exp) if isinstance(exp, int) else exp
        # First: right on every index (exhaustively); then: simple enough for the analyzer.
        g, e = (np.broadcast_to(_eval_np(x, grid, {}), shape) for x in (got, exp))
        assert np.array_equal(g, e), f"wrong index expression {got}, expected {exp}"
        assert ana.can_prove(ana.simplify(got - exp) == 0), \
            f"correct but not simplified: {ana.simplify(got)} (expected {exp})"
    if max_divmod is not None:
        total = sum(_divmods(ana.simplify(f)) for f in finals)
        assert total <= max_divmod, f"not a clean expression ({total} div/mod): {list(finals)}"


def check_single_piece(vt, source, expected, max_divmod):
    m = vt.mapping
    assert len(m.pieces) == 1 and m.pieces[0].cond is None, m
    assert len(vt.sources) == 1 and vt.sources[0].same_as(source), vt.sources
    ((src, imap, cond),) = m.index_maps()
    assert src == 0 and cond is None
    assert_indices(imap.initial_indices, m.shape, imap.final_indices, expected, max_divmod)


def rewritten_consumers(mod):
    """{kernel name: {virtual param name: [IndexMap]}} of the call_tir consumers the pass rewrote."""
    out = {}
    for name, f in called_prim_funcs(mod):
        if MAPPING_ATTR in (f.attrs or {}):
            out[name] = {k: list(v) for k, v in f.attrs[MAPPING_ATTR].items()}
    return out


def the_index_map(mod, shape):
    """The one recorded IndexMap of the one rewritten consumer."""
    consumers = rewritten_consumers(mod)
    assert len(consumers) == 1, consumers
    (recorded,) = consumers.values()
    assert len(recorded) == 1, recorded
    (maps,) = recorded.values()
    assert len(maps) == 1, maps
    return maps[0]


def check_numerics(mod, params, rng, ref_mod=None):
    inputs = random_inputs(params, rng)
    expected = run(ref_mod or mod, inputs)
    for strategy in ("contiguity", "all"):
        out = vtc_tvm.VirtualTensorize(strategy=strategy)(mod)
        assert relax.analysis.check_well_formed(out)
        got = run(out, inputs)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6)


def movement_left(mod):
    names = ("permute_dims", "reshape", "strided_slice", "concat", "expand_dims", "broadcast_to",
             "flip", "nn.pad", "split")
    n = []

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name[6:] in names:
            n.append(e.op.name)

    relax.analysis.post_order_visit(mod["main"], visit)
    return n + [k for k, dm in kernels(mod) if dm]


# -- channel shuffle -------------------------------------------------------------------------
SHUFFLES = [(1, 12, 2, 3, 3), (2, 8, 3, 2, 2), (1, 24, 2, 2, 4)]


def channel_shuffle(x, g):
    n, c, h, w = (int(d) for d in x.ty.shape.values)
    y = emit(R.reshape(x, (n, g, c // g, h, w)))
    return R.reshape(emit(R.permute_dims(y, [0, 2, 1, 3, 4])), (n, c, h, w))


@pytest.mark.parametrize("shape", SHUFFLES, ids=lambda s: "x".join(map(str, s)))
def test_channel_shuffle_composes_to_one_clean_expression(shape):
    n, c, h, w, g = shape
    mod = make_module([((n, c, h, w), F32)], lambda x: channel_shuffle(x, g))
    vt = last_virtual(mod)
    x = mod["main"].params[0]
    check_single_piece(vt, x, lambda a, b, cc, d: [a, b % g * (c // g) + b // g, cc, d], max_divmod=2)


@pytest.mark.parametrize("shape", SHUFFLES, ids=lambda s: "x".join(map(str, s)))
def test_channel_shuffle_in_consumer(shape, rng):
    n, c, h, w, g = shape
    params = [((n, c, h, w), F32), ((4, c, 1, 1), F32)]
    mod = make_module(params, lambda x, k: R.nn.conv2d(channel_shuffle(emit(R.nn.relu(x)), g), k))
    out = vtc_tvm.VirtualTensorize(strategy="all")(mod)
    assert not movement_left(out), out
    imap = the_index_map(out, (n, c, h, w))
    assert_indices(imap.initial_indices, (n, c, h, w), imap.final_indices,
                   lambda a, b, cc, d: [a, b % g * (c // g) + b // g, cc, d], max_divmod=2)
    check_numerics(mod, params, rng)


def _shuffle_units(x, ws, units):
    """ShuffleNet units: concat(pass-through half, branch(other half)) -> shuffle -> split."""
    for k in range(units):
        halves = emit(R.split(x, 2, axis=1))
        keep, branch = emit(relax.TupleGetItem(halves, 0)), emit(relax.TupleGetItem(halves, 1))
        y = emit(R.nn.relu(emit(R.nn.conv2d(branch, ws[k]))))
        x = emit(channel_shuffle(emit(R.concat([keep, y], axis=1)), 2))
    return x


def test_composition_stops_before_pinning_many_sources(rng):
    # The pass-through half of each unit would compose into a mapping over every earlier
    # unit's branch output, keeping them all alive: composition stops at two sources.
    n, c, h, w, units = 1, 8, 8, 8, 4
    params = [((n, c, h, w), F32)] + [((c // 2, c // 2, 1, 1), F32)] * units
    mod = make_module(params, lambda x, *ws: _shuffle_units(x, ws, units))
    out = vtc_tvm.VirtualTensorize(strategy="all")(mod)
    convs = [f for name, f in called_prim_funcs(out) if name.startswith("conv2d") and MAPPING_ATTR in f.attrs]
    # Most branches read their half where it lies; where a chain is cut, a split is materialised
    # (one multi-output copy) and that branch reads its part.
    assert len(convs) >= units - 1, out
    assert all(len(f.params) <= 4 for f in convs), out  # at most 2 sources, the weight, the output
    check_numerics(mod, params, rng)


# -- Swin window partition / reverse ---------------------------------------------------------
def window_partition(x, ws):
    b, h, w, c = (int(d) for d in x.ty.shape.values)
    y = emit(R.reshape(x, (b, h // ws, ws, w // ws, ws, c)))
    y = emit(R.permute_dims(y, [0, 1, 3, 2, 4, 5]))
    return R.reshape(y, (-1, ws * ws, c))


def window_reverse(win, ws, b, h, w):
    c = int(win.ty.shape.values[-1])
    y = emit(R.reshape(win, (b, h // ws, w // ws, ws, ws, c)))
    y = emit(R.permute_dims(y, [0, 1, 3, 2, 4, 5]))
    return R.reshape(y, (b, h, w, c))


SWIN = [(1, 8, 8, 4, 4), (2, 6, 4, 3, 2)]


@pytest.mark.parametrize("shape", SWIN, ids=lambda s: "x".join(map(str, s)))
def test_window_partition_mapping(shape):
    b, h, w, c, ws = shape
    nh, nw = h // ws, w // ws
    mod = make_module([((b, h, w, c), F32)], lambda x: window_partition(x, ws))
    vt = last_virtual(mod)
    assert vt.shape == (b * nh * nw, ws * ws, c)

    def expected(win, t, ch):
        return [win // (nh * nw), win % (nh * nw) // nw * ws + t // ws, win % nw * ws + t % ws, ch]

    check_single_piece(vt, mod["main"].params[0], expected, max_divmod=8)


@pytest.mark.parametrize("shape", SWIN, ids=lambda s: "x".join(map(str, s)))
def test_window_reverse_mapping(shape):
    b, h, w, c, ws = shape
    nh, nw = h // ws, w // ws
    mod = make_module([((b * nh * nw, ws * ws, c), F32)], lambda win: window_reverse(win, ws, b, h, w))
    vt = last_virtual(mod)

    def expected(bb, i, j, ch):
        return [bb * nh * nw + i // ws * nw + j // ws, i % ws * ws + j % ws, ch]

    check_single_piece(vt, mod["main"].params[0], expected, max_divmod=4)


@pytest.mark.parametrize("shape", SWIN, ids=lambda s: "x".join(map(str, s)))
def test_window_partition_then_reverse_is_identity(shape):
    b, h, w, c, ws = shape
    mod = make_module([((b, h, w, c), F32)],
                      lambda x: window_reverse(emit(window_partition(x, ws)), ws, b, h, w))
    vt = last_virtual(mod)
    check_single_piece(vt, mod["main"].params[0], lambda *v: list(v), max_divmod=0)


@pytest.mark.parametrize("shape", SWIN, ids=lambda s: "x".join(map(str, s)))
def test_swin_block_numerics_and_single_mapping(shape, rng):
    """LayerNorm-free Swin skeleton: partition -> per-window matmul -> reverse -> add."""
    b, h, w, c, ws = shape
    params = [((b, h, w, c), F32), ((c, c), F32), ((b, h, w, c), F32)]

    def body(x, wq, skip):
        win = emit(window_partition(emit(R.exp(x)), ws))
        y = emit(R.matmul(win, wq))
        return R.add(window_reverse(y, ws, b, h, w), skip)

    mod = make_module(params, body)
    out = vtc_tvm.VirtualTensorize(strategy="all")(mod)
    assert not movement_left(out), out
    consumers = rewritten_consumers(out)
    assert len(consumers) == 2, consumers  # the matmul (partition) and the add (reverse)
    for recorded in consumers.values():
        assert len(recorded) == 1 and all(len(m) == 1 for m in recorded.values()), recorded
    check_numerics(mod, params, rng)


# -- RoPE rotate_half ------------------------------------------------------------------------
def rotate_half(x):
    d = int(x.ty.shape.values[-1])
    x1 = emit(R.strided_slice(x, [-1], [0], [d // 2]))
    x2 = emit(R.strided_slice(x, [-1], [d // 2], [d]))
    return R.concat([emit(R.negative(x2)), x1], -1)


ROPE = [(2, 3, 8), (1, 5, 4)]


@pytest.mark.parametrize("shape", ROPE, ids=lambda s: "x".join(map(str, s)))
def test_rotate_half_mapping(shape):
    b, t, d = shape
    mod = make_module([(shape, F32)], lambda x: rotate_half(x))
    x = mod["main"].params[0]
    virt = composed_mappings(mod)
    rot = virt[list(virt)[-1]]
    neg = [bv.var for blk in mod["main"].body.blocks for bv in blk.bindings
           if isinstance(bv.value, relax.Call) and bv.value.op.name == "relax.negative"][0]
    # Two pieces: the negated half (a compute result, physical) and a slice of x composed away.
    assert [s for s in rot.sources] == [neg, x]
    maps = rot.mapping.index_maps()
    assert [src for src, _, _ in maps] == [0, 1]
    (_, m0, c0), (_, m1, _) = maps
    assert_indices(m0.initial_indices, rot.shape, m0.final_indices, lambda i, j, k: [i, j, k], max_divmod=0)
    assert_indices(m1.initial_indices, rot.shape, m1.final_indices, lambda i, j, k: [i, j, k - d // 2],
                   max_divmod=0)
    ana = rot.mapping.analyzer()
    k = rot.mapping.vars[-1]
    assert ana.can_prove(tirx.Or(tirx.Not(c0), k < d // 2)) and ana.can_prove(tirx.Or(c0, k >= d // 2)), c0
    # The second slice (inside negative's input) is an offset view of x.
    x2 = [bv.var for blk in mod["main"].body.blocks for bv in blk.bindings
          if isinstance(bv.value, relax.Call) and bv.value.op.name == "relax.strided_slice"][1]
    check_single_piece(virt[x2], x, lambda i, j, kk: [i, j, kk + d // 2], max_divmod=0)


@pytest.mark.parametrize("shape", ROPE, ids=lambda s: "x".join(map(str, s)))
def test_rope_numerics(shape, rng):
    params = [(shape, F32), (shape, F32), (shape, F32)]

    def body(x, cos, sin):
        x = emit(R.exp(x))
        return R.add(R.multiply(x, cos), R.multiply(emit(rotate_half(x)), sin))

    mod = make_module(params, body)
    out = vtc_tvm.VirtualTensorize(strategy="all")(mod)
    assert not movement_left(out), out
    consumers = rewritten_consumers(out)
    assert len(consumers) == 2, consumers  # negative (reads x2) and multiply (reads the concat)
    check_numerics(mod, params, rng)


# -- GQA repeat_kv ---------------------------------------------------------------------------
def repeat_kv(k, n_rep):
    b, hkv, t, d = (int(s) for s in k.ty.shape.values)
    y = emit(R.expand_dims(k, 2))
    y = emit(R.broadcast_to(y, (b, hkv, n_rep, t, d)))
    return R.reshape(y, (b, hkv * n_rep, t, d))


GQA = [(1, 2, 3, 4, 3), (2, 2, 5, 4, 4)]


@pytest.mark.parametrize("shape", GQA, ids=lambda s: "x".join(map(str, s)))
def test_repeat_kv_head_index_is_floordiv(shape):
    b, hkv, t, d, n_rep = shape
    mod = make_module([((b, hkv, t, d), F32)], lambda k: repeat_kv(k, n_rep))
    vt = last_virtual(mod)
    check_single_piece(vt, mod["main"].params[0], lambda i, h, j, k: [i, h // n_rep, j, k], max_divmod=1)


@pytest.mark.parametrize("shape", GQA, ids=lambda s: "x".join(map(str, s)))
def test_gqa_attention_scores(shape, rng):
    b, hkv, t, d, n_rep = shape
    h = hkv * n_rep
    params = [((b, h, t, d), F32), ((b, hkv, t, d), F32), ((b, hkv, t, d), F32)]

    def body(q, k, v):
        kt = emit(R.permute_dims(emit(repeat_kv(k, n_rep)), [0, 1, 3, 2]))
        p = emit(R.nn.softmax(R.matmul(q, kt), axis=-1))
        return R.matmul(p, repeat_kv(v, n_rep))

    mod = make_module(params, body)
    out = vtc_tvm.VirtualTensorize(strategy="all")(mod)
    assert not movement_left(out), out
    consumers = rewritten_consumers(out)
    assert len(consumers) == 2, consumers
    (first, second) = [list(r.values()) for r in consumers.values()]
    # K^T: (b, h, d, t) -> k[b, h // n_rep, t, d]; V: (b, h, t, d) -> v[b, h // n_rep, t, d]
    found = sorted((m[0] for m in first + second), key=lambda m: str(m))
    assert len(found) == 2
    shapes = {"kt": (b, h, d, t), "v": (b, h, t, d)}
    proved = set()
    for m in found:
        for kind, shp in shapes.items():
            exp = (lambda i, hh, dd, tt: [i, hh // n_rep, tt, dd]) if kind == "kt" else \
                  (lambda i, hh, tt, dd: [i, hh // n_rep, tt, dd])
            try:
                assert_indices(m.initial_indices, shp, m.final_indices, exp, max_divmod=1)
                proved.add(kind)
            except AssertionError:
                pass
    assert proved == {"kt", "v"}, found
    check_numerics(mod, params, rng)


# -- transpose of a reshape of a slice -------------------------------------------------------
def test_transpose_reshape_slice_mapping():
    mod = make_module([((4, 10), F32)],
                      lambda x: R.permute_dims(emit(R.reshape(emit(R.strided_slice(x, [1], [1], [9])), (8, 4)))))
    vt = last_virtual(mod)
    assert vt.shape == (4, 8)
    check_single_piece(vt, mod["main"].params[0],
                       lambda i, j: [(j * 4 + i) // 8, (j * 4 + i) % 8 + 1], max_divmod=2)


def test_transpose_reshape_slice_numerics(rng):
    params = [((4, 10), F32), ((8, 3), F32)]

    def body(x, w):
        s = emit(R.strided_slice(emit(R.exp(x)), [1], [1], [9]))
        return R.matmul(R.permute_dims(emit(R.reshape(s, (8, 4)))), w)

    mod = make_module(params, body)
    out = vtc_tvm.VirtualTensorize(strategy="all")(mod)
    assert not movement_left(out), out
    imap = the_index_map(out, (4, 8))
    assert_indices(imap.initial_indices, (4, 8), imap.final_indices,
                   lambda i, j: [(j * 4 + i) // 8, (j * 4 + i) % 8 + 1], max_divmod=2)
    check_numerics(mod, params, rng)


# -- piecewise chains ------------------------------------------------------------------------
def test_slice_of_concat_keeps_one_piece():
    mod = make_module([((3, 4), F32), ((3, 6), F32)],
                      lambda a, b: R.strided_slice(emit(R.concat([a, b], 1)), [1], [5], [9]))
    vt = last_virtual(mod)
    m = vt.mapping
    b = mod["main"].params[1]
    assert len(m.pieces) == 1, m
    (src,) = m.data_sources()
    assert vt.sources[src].same_as(b)
    ((_, imap, _),) = m.index_maps()
    assert_indices(imap.initial_indices, m.shape, imap.final_indices, lambda i, j: [i, j + 1], max_divmod=0)


def test_pad_of_flip_of_concat_numerics(rng):
    params = [((1, 2, 4, 4), F32), ((1, 3, 4, 4), F32), ((2, 5, 3, 3), F32)]

    def body(a, b, w):
        c = emit(R.concat([emit(R.exp(a)), b], 1))
        f = emit(R.flip(c, 3))
        return R.nn.conv2d(R.nn.pad(f, [0, 0, 0, 0, 1, 1, 1, 1], pad_value=0.5), w)

    mod = make_module(params, body)
    vt = last_virtual(make_module(params[:2], lambda a, b: R.nn.pad(
        emit(R.flip(emit(R.concat([a, b], 1)), 3)), [0, 0, 0, 0, 1, 1, 1, 1], pad_value=0.5)))
    assert vt.mapping.data_sources() == {0, 1} and len(vt.sources) == 2
    out = vtc_tvm.VirtualTensorize(strategy="all")(mod)
    assert not movement_left(out), out
    assert len(rewritten_consumers(out)) == 1
    check_numerics(mod, params, rng)
