"""Symbolic (dynamic) dimensions flow through mappings where the algebra allows.

Each case builds a module whose parameters have symbolic dimensions (batch ``b``, sequence
``n``, cache length ``m``), runs ``VirtualTensorize`` and compares the compiled result with
stock TVM at several concrete sizes (including 1), on fresh random inputs. Cases the algebra
cannot express stay physical with a logged reason, and still compute the right thing.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

import vtc_tvm
from vtc_tvm import Mapping
from vtc_tvm.analysis import contiguity
from vtc_tvm.rules import Unsupported, get_rule

from .conftest import module_of, run

R = relax.op
F32 = "float32"
b, n, m = (tvm.tirx.Var(name, "int64") for name in "bnm")
SIZES = [{b: 2, n: 5, m: 3}, {b: 1, n: 1, m: 7}, {b: 3, n: 9, m: 1}]


def module(params, body):
    """``params``: (name, shape with symbols, dtype); ``body(*vars)`` -> output expr(s)."""
    return module_of([relax.Var(name, relax.TensorType(shape, dtype)) for name, shape, dtype in params], body)


def concrete(shape, sizes):
    return tuple(sizes[d] if isinstance(d, tvm.tirx.Var) else int(d) for d in shape)


def inputs_at(params, sizes, rng):
    out = []
    for _, shape, dtype in params:
        shape = concrete(shape, sizes)
        if dtype.startswith("int"):
            out.append(rng.integers(-6, 6, size=shape).astype(dtype))
        else:
            out.append(rng.standard_normal(shape).astype(dtype))
    return out


# (id, params, body, movement op that must become virtual for strategy "all")
CASES = [
    ("permute_exp", [("x", (n, 8), F32)], lambda x: R.exp(R.permute_dims(x)), "relax.permute_dims"),
    ("reshape_heads_transpose_softmax", [("x", (n, 32), F32)],
     lambda x: R.nn.softmax(R.permute_dims(R.reshape(x, (n, 4, 8)), [1, 0, 2])), "relax.permute_dims"),
    ("reshape_merge_matmul", [("x", (b, n, 8), F32), ("w", (8, 3), F32)],
     lambda x, w: R.matmul(R.reshape(x, (b * n, 8)), w), "relax.reshape"),
    ("transpose_matmul_batch", [("x", (b, n, 6), F32), ("w", (b, n, 4), F32)],
     lambda x, w: R.matmul(R.permute_dims(x, [0, 2, 1]), w), "relax.permute_dims"),
    ("last_token_slice", [("x", (b, n, 8), F32)],
     lambda x: R.multiply(R.strided_slice(x, [1], [-1], [2**63 - 1]), relax.const(2.0, F32)), "relax.strided_slice"),
    ("drop_first_token", [("x", (b, n, 8), F32)],
     lambda x: R.exp(R.strided_slice(x, [1], [1], [2**63 - 1])), "relax.strided_slice"),
    ("kv_concat_symbolic_axis", [("past", (2, m, 4), F32), ("new", (2, n, 4), F32), ("w", (4, 5), F32)],
     lambda p, k, w: R.matmul(R.concat([p, k], axis=1), w), "relax.concat"),
    ("concat_static_axis", [("a", (b, 3), F32), ("c", (b, 5), F32)],
     lambda a, c: R.nn.softmax(R.concat([a, c], axis=1)), "relax.concat"),
    ("embedding_take", [("table", (11, 8), F32), ("ids", (n,), "int32")],
     lambda t, i: R.nn.softmax(R.take(t, i, axis=0, mode="clip")), "relax.take"),
    ("repeat_kv_gqa", [("q", (b, 4, n, 8), F32), ("k", (b, 2, m, 8), F32)],
     lambda q, k: R.matmul(q, R.permute_dims(R.repeat(k, 2, axis=1), [0, 1, 3, 2])), "relax.repeat"),
    ("argmax_over_expand_dims", [("x", (4, 6, n), F32)],  # graph fuzz 928: case_b42ed8bd77
     lambda x: R.argmax(R.expand_dims(x, -1), axis=0), "relax.expand_dims"),
    ("reshape_merge_symbolic_tail", [("x", (b, 6, n), F32)],
     lambda x: R.exp(R.reshape(x, (b, 6 * n))), "relax.reshape"),
    ("expand_squeeze", [("x", (n, 1, 6), F32)],
     lambda x: R.sum(R.expand_dims(R.squeeze(x, [1]), 0), axis=[2]), "relax.squeeze"),
    ("pad_batch", [("x", (b, 4), F32)], lambda x: R.exp(R.nn.pad(x, [0, 0, 1, 2], pad_value=0.5)), "relax.nn.pad"),
    ("flip_symbolic_axis", [("x", (n, 3), F32)], lambda x: R.exp(R.flip(x, axis=0)), "relax.flip"),
    ("broadcast_static_dim", [("x", (1, n, 4), F32)],
     lambda x: R.exp(R.broadcast_to(x, (3, n, 4))), "relax.broadcast_to"),
    ("copy_is_function_output", [("x", (b, n, 6), F32)],
     lambda x: R.permute_dims(R.reshape(x, (b, n, 2, 3)), [0, 2, 1, 3]), None),
]


@pytest.mark.parametrize("strategy", ["all", "contiguity"])
@pytest.mark.parametrize("case_id,params,body,op", CASES, ids=[c[0] for c in CASES])
def test_symbolic_case(case_id, params, body, op, strategy, rng):
    mod = module(params, body)
    report = []
    out = vtc_tvm.VirtualTensorize(strategy=strategy, report=report)(mod)
    assert relax.analysis.check_well_formed(out)
    assert not [e for e in report if "symbolic" in e["reason"]], report
    if strategy == "all" and op is not None:
        assert any(e["virtual"] for e in report), report
        assert not _ops(out, op), out["main"]
    for sizes in SIZES:
        xs = inputs_at(params, sizes, rng)
        for got, want in zip(run(out, xs), run(mod, xs), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# Symbolic cases the algebra does not express: left physical, the reason logged, still right.
UNSUPPORTED = [
    ("split_symbolic_axis", [("x", (n, 4), F32)],
     lambda x: R.exp(relax.TupleGetItem(R.split(x, 2, axis=0), 0)), "relax.split"),
    ("strided_step_symbolic_axis", [("x", (n, 4), F32)],
     lambda x: R.exp(R.strided_slice(x, [0], [0], [2**63 - 1], [2])), "relax.strided_slice"),
]


@pytest.mark.parametrize("case_id,params,body,op", UNSUPPORTED, ids=[c[0] for c in UNSUPPORTED])
def test_symbolic_unsupported_left_physical(case_id, params, body, op, rng):
    mod = module(params, body)
    report = []
    out = vtc_tvm.VirtualTensorize(strategy="all", report=report)(mod)
    assert relax.analysis.check_well_formed(out)
    assert any(not e["virtual"] and "symbolic" in e["reason"] for e in report), report
    assert _ops(out, op), out["main"]
    for sizes in SIZES:
        xs = inputs_at(params, sizes, rng)
        for got, want in zip(run(out, xs), run(mod, xs), strict=True):
            np.testing.assert_array_equal(got, want)


def test_symbolic_mapping_algebra():
    """Rules build symbolic mappings; instantiated, they agree with numpy at each size."""
    x = relax.Var("x", relax.TensorType((b, n, 12), F32))
    bb = relax.BlockBuilder()
    reshape = bb.normalize(R.reshape(x, (b, n, 3, 4)))
    vt = get_rule("relax.reshape")(reshape)
    assert vt.mapping.symbols and len(vt.mapping.symbols) == 2
    rng = np.random.default_rng(0)
    for sizes in SIZES:
        arr = rng.standard_normal(concrete((b, n, 12), sizes)).astype(F32)
        np.testing.assert_array_equal(vt.mapping.apply_numpy([arr]), arr.reshape(arr.shape[:2] + (3, 4)))
    # Composition with a transpose keeps the symbols; contiguity is measured at sample sizes.
    t = relax.Var("t", relax.TensorType((b, n, 3, 4), F32))
    perm = get_rule("relax.permute_dims")(bb.normalize(R.permute_dims(t, [0, 2, 1, 3])))
    composed = perm.mapping.compose(0, vt.mapping)
    c = contiguity(composed)
    assert c.best_axis_run == 4 and not c.full
    for sizes in SIZES:
        arr = rng.standard_normal(concrete((b, n, 12), sizes)).astype(F32)
        want = arr.reshape(arr.shape[:2] + (3, 4)).transpose(0, 2, 1, 3)
        np.testing.assert_array_equal(composed.apply_numpy([arr]), want)


def test_symbolic_rules_raise_for_what_they_cannot_express():
    x = relax.Var("x", relax.TensorType((n, 4), F32))
    bb = relax.BlockBuilder()
    # A symbolic source dimension may be 1 (broadcast) or not: only known at run time.
    y = relax.Var("y", relax.TensorType((m, 4), F32))
    with pytest.raises(Unsupported, match="symbolic"):
        get_rule("relax.broadcast_to")(bb.normalize(R.broadcast_to(y, (n, 4))))
    with pytest.raises(Unsupported, match="symbolic"):
        get_rule("relax.split")(bb.normalize(R.split(x, 2, axis=0)))
    with pytest.raises(Unsupported, match="symbolic"):
        get_rule("relax.strided_slice")(bb.normalize(R.strided_slice(x, [0], [1], [2**63 - 1], [3])))


def _ops(mod, name):
    found = []

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == name:
            found.append(e)

    relax.analysis.post_order_visit(mod["main"], visit)
    return found


def test_symbolic_mapping_is_a_mapping():
    """``Mapping.instantiate`` gives the static mapping of one size."""
    mp = Mapping.view((n, 8), F32, (8, n), lambda i, j: (j, i))
    fixed = mp.instantiate({n: 5})
    assert fixed.shape == (5, 8) and fixed.source_shape(0) == (8, 5) and not fixed.symbols


@pytest.mark.parametrize("reps", [1, 2, 3])
def test_flip_over_tile_of_symbolic_length(reps):
    """Regression (graph fuzzer, seed 911: case_5e6f7941a7): flip(tile(x, r)) of a symbolic
    length composes to ``(r*n - 1 - i) % n``, on which TVM 0.27's LLVM code generation fails
    ('Binding of variable rmod ... conflicts'); the mapping mirrors it to ``n - 1 - i % n``."""
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        out = bb.emit(relax.op.flip(bb.emit(relax.op.tile(x, reps)), axis=-1))
        bb.emit_func_output(out)
    vm = relax.VirtualMachine(tvm.compile(vtc_tvm.VirtualTensorize()(bb.get()), target="llvm"), tvm.cpu())
    rng = np.random.default_rng(reps)
    for size in (1, 2, 5):
        a = rng.standard_normal(size).astype("float32")
        np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(a)).numpy(), np.tile(a, reps)[::-1])


def _counting_down_forms():
    i, n = tvm.tirx.Var("i", "int64"), tvm.tirx.Var("n", "int64")
    c = lambda v: tvm.tirx.IntImm("int64", v)
    fd, fm = tvm.tirx.floordiv, tvm.tirx.floormod
    forms = [fd(c(k) - i, c(d)) for k in (-7, -1, 1, 5, 11) for d in (2, 3, 4)]
    forms += [fm(c(k) - i, c(d)) for k in (-5, 2, 7) for d in (3, 4)]
    forms += [fd(c(0) - i - c(1), c(3)) + n, fd(n * c(3) - c(1) - i, c(3)), fd(n - i, c(3)),
              fm(n - c(1) - i, c(3)), fd(c(-6) - i * c(2), c(4)), fd(n * c(2) - c(5) - i * c(2), c(4)),
              fd(c(7) - fd(c(11) - i, c(3)), c(2))]
    return i, n, forms


def test_counting_down_indices_survive_flatten_buffer():
    """Regression (graph fuzzer, seed 915: case_3448c91982, flip over repeat of a symbolic
    length): ``FlattenBuffer`` simplifies indices with ``IterMapSimplify``, which turns
    ``(-1 - i) // 3 + n`` into ``i // -3 + n - 1`` (wrong for i = 1). ``lowering_safe``
    rewrites every floordiv/floormod of a counting-down iterator so that it counts up; each
    form here keeps its values through IterMapSimplify, at constant and symbolic offsets."""
    from vtc_tvm.mapping import _eval_np, lowering_safe

    i, n, forms = _counting_down_forms()
    broken = 0
    for form in forms:
        safe = lowering_safe(form, [i])
        for size in (1, 2, 5):
            dom = {i: tvm.ir.Range.from_min_extent(0, n * 3)}
            env = {i: np.arange(3 * size, dtype=np.int64), n: np.int64(size)}
            want = _eval_np(form, env, {})
            np.testing.assert_array_equal(_eval_np(safe, env, {}), want, err_msg=str(form))
            flattened = tvm.sym.iter_map_simplify([safe], dom, check_level=1)[0]
            np.testing.assert_array_equal(np.broadcast_to(_eval_np(flattened, env, {}), want.shape), want,
                                          err_msg=f"{form} -> {safe} -> {flattened}")
            raw = tvm.sym.iter_map_simplify([form], dom, check_level=1)[0]
            broken += not np.array_equal(np.broadcast_to(_eval_np(raw, env, {}), want.shape), want)
    # The workaround is still needed (TVM 0.27): when this fails, TVM fixed IterMapSimplify.
    assert broken > 0


def test_indices_that_count_up_or_mix_are_left_alone():
    from vtc_tvm.mapping import lowering_safe

    i, j, n = (tvm.tirx.Var(v, "int64") for v in "ijn")
    c = lambda v: tvm.tirx.IntImm("int64", v)
    for form in (tvm.tirx.floordiv(i + c(2), c(3)), tvm.tirx.floordiv(i - j + c(1), c(3)),
                 tvm.tirx.floormod(i - n, c(4)), tvm.tirx.floordiv(n - c(1), c(2))):
        assert lowering_safe(form, [i, j]).same_as(form)


@pytest.mark.parametrize("size", [1, 2, 4])
def test_flip_over_repeat_of_symbolic_length(size):
    """The graph that found it, end to end on LLVM."""
    x = relax.Var("x", relax.TensorType((n,), F32))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        out = bb.emit(relax.op.flip(bb.emit(relax.op.repeat(x, 3)), axis=0))
        bb.emit_func_output(out)
    vm = relax.VirtualMachine(tvm.compile(vtc_tvm.VirtualTensorize()(bb.get()), target="llvm"), tvm.cpu())
    a = np.random.default_rng(size).standard_normal(size).astype(F32)
    np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(a)).numpy(), np.repeat(a, 3)[::-1])


def test_divisions_by_a_symbolic_size_of_a_multiple_plus_a_remainder_simplify():
    """``(x*n + r) // n`` -> ``x`` and ``% n`` -> ``r`` when ``0 <= r < n`` (TVM's analyzer only
    does this for constant divisors). Left in, they made an expand_dims + broadcast copy opaque to
    FuseOps: one kernel more than stock (fuzz case_43ef0e0e36)."""
    from tvm.ir import Range

    from vtc_tvm.mapping import _symbolic_divmods

    n, a, r = (tvm.tirx.Var(name, "int64") for name in ("n", "a", "r"))
    i64 = lambda v: tvm.tirx.IntImm("int64", v)
    ana = tvm.sym.Analyzer()
    ana.bind(a, Range(i64(0), i64(2)))
    ana.bind(r, Range(i64(0), n))
    div, mod = _symbolic_divmods(tvm.tirx.floordiv(a * n + r, n), ana), _symbolic_divmods(tvm.tirx.floormod(n * a + r, n), ana)
    assert div.same_as(a) and mod.same_as(r)
    # a remainder that may reach n is left alone
    kept = tvm.tirx.floordiv(a * n + r + i64(1), n)
    assert tvm_ffi.structural_equal(_symbolic_divmods(kept, ana), kept)


def test_reshapes_read_group_by_group():
    """An axis a reshape keeps keeps its index, and runs of axes with equal element counts are
    read on their own: expand_dims over ``(4, 6, n)`` reads ``x[v0, v1, v2]``. A flat index over
    all axes left divisions by ``6 * n`` that no analyzer simplifies (graph fuzz 928: WindowReduction
    took the argmax through it for a window read, and its CUDA build failed)."""
    from vtc_tvm.rules import reshape_groups

    assert reshape_groups((4, 6, n, 1), (4, 6, n)) == [([0], [0]), ([1], [1]), ([2], [2])]
    assert reshape_groups((24, n), (4, 6, n)) == [([0], [0, 1]), ([1], [2])]
    assert reshape_groups((4, 6 * n), (4, 6, n)) == [([0], [0]), ([1], [1, 2])]
    assert reshape_groups((6, 4), (4, 6)) == [([0, 1], [0, 1])]
    assert reshape_groups((1,), (1, 1)) == []
    assert reshape_groups((n,), (2, n)) is None  # counts that cannot match: one flat group
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 6, n), F32))
    mapping = get_rule("relax.expand_dims")(bb.normalize(R.expand_dims(x, -1))).mapping
    (piece,) = mapping.pieces
    assert all(tvm_ffi.structural_equal(i, v) for i, v in zip(piece.indices, mapping.vars[:3]))
    for shape, new in [((3, 4, 5), (12, 5)), ((3, 4, 5), (2, 6, 5)), ((2, 1, 6), (3, 1, 4)), ((6, 4), (4, 6))]:
        x = relax.Var("x", relax.TensorType(shape, F32))
        call = bb.normalize(R.reshape(x, new))
        data = np.arange(np.prod(shape), dtype="float32").reshape(shape)
        got = get_rule("relax.reshape")(call).mapping.apply_numpy([data])
        np.testing.assert_array_equal(got, data.reshape(new))
