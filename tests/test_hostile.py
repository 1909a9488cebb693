"""Hostile inputs for VirtualTensorize: odd shapes, aliasing, several functions, pre-fused
modules, external consumers, non-dataflow code, other dtypes, symbolic shapes.

Every case is compiled four ways on LLVM and run on the same fresh random inputs:

* stock: ``relax.get_default_pipeline(llvm)`` on the original module (the reference),
* ``VirtualTensorize()`` then the default pipeline,
* ``VirtualTensorize(strategy="all")`` then the default pipeline,
* ``vtc_pipeline(llvm)`` (load side + store side + stock pipeline).

Outputs must be equal (fp32: rtol = atol = 1e-6; integers exactly), the pass output must pass
``relax.analysis.check_well_formed``, and the pass must never raise. Some cases also check the
result against numpy, and some check what became of the movement ops.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Optional, Sequence

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.ir import Op
from tvm.script import ir as I, relax as R

import vtc_tvm
from vtc_tvm.pipeline import vtc_pipeline

from .conftest import FUSE, LLVM, _to_numpy, emit, make_module, module_of, random_inputs

F32, F16, I32 = "float32", "float16", "int32"
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
VARIANTS = ["contiguity", "all", "pipeline"]
CALL_TIR = Op.get("relax.call_tir")
MOVEMENT_OPS = {"relax.permute_dims", "relax.reshape", "relax.strided_slice", "relax.concat",
                "relax.expand_dims", "relax.broadcast_to", "relax.flip", "relax.squeeze"}


# -- harness ---------------------------------------------------------------------------------
@dataclasses.dataclass
class Case:
    build: Callable[[], tvm.IRModule]
    # (function name, parameter specs) to call; the specs drive the random inputs
    calls: Sequence = ()
    # optional numpy reference per function name: fn(*inputs) -> list of arrays
    ref: Dict[str, Callable] = dataclasses.field(default_factory=dict)
    # optional pass applied before VirtualTensorize (and before the stock reference)
    pre: Optional[Callable[[tvm.IRModule], tvm.IRModule]] = None
    # optional extra check on the VirtualTensorize output: fn(out_mod, report, strategy)
    post: Optional[Callable] = None


CASES: Dict[str, Case] = {}


def case(name, calls=None, **kw):
    def deco(build):
        CASES[name] = Case(build=build, calls=calls, **kw)
        return build
    return deco


def _compile(mod, pipeline):
    ex = tvm.compile(mod, target="llvm", relax_pipeline=pipeline)
    return relax.VirtualMachine(ex, tvm.cpu())


def _call(vm, fname, inputs):
    return _to_numpy(vm[fname](*[tvm.runtime.tensor(a) for a in inputs]))


def assert_same(got, expected, what="", fp32_tol=1e-6):
    """vtc vs stock: 1e-6 (same arithmetic order); numpy vs stock: pass a looser fp32_tol, since
    numpy's matmul sums in another order."""
    assert len(got) == len(expected), what
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g.shape == e.shape and g.dtype == e.dtype, (what, i, g.shape, e.shape, g.dtype, e.dtype)
        if np.issubdtype(e.dtype, np.floating):
            tol = fp32_tol if e.dtype != np.float16 else 1e-3
            np.testing.assert_allclose(g, e, rtol=tol, atol=tol, err_msg=f"{what} output {i}")
        else:
            np.testing.assert_array_equal(g, e, err_msg=f"{what} output {i}")


def _default():
    return relax.get_default_pipeline(LLVM)


def _prepared(c: Case):
    mod = c.build()
    if c.pre is not None:
        with LLVM:
            mod = c.pre(mod)
    return mod


def check_case(c: Case, variant: str, rng):
    mod = _prepared(c)
    inputs = [(fname, _inputs(specs, rng)) for fname, specs in c.calls]
    stock = _compile(mod, _default())
    expected = [_call(stock, f, args) for f, args in inputs]
    for (f, args), exp in zip(inputs, expected):
        if f in c.ref:
            assert_same([np.asarray(a) for a in c.ref[f](*args)], exp, f"stock vs numpy ({f})", fp32_tol=1e-5)

    report: list = []
    if variant == "pipeline":
        vm = _compile(mod, vtc_pipeline(LLVM, report=report))
    else:
        out = vtc_tvm.VirtualTensorize(strategy=variant, report=report)(mod)
        assert relax.analysis.check_well_formed(out), out
        if c.post is not None:
            c.post(out, report, variant)
        vm = _compile(out, _default())
    for entry in report:  # (store-side entries say so: "side": "store")
        assert set(entry) - {"side"} == {"tensor", "consumer", "virtual", "reason"}, entry
        assert entry.get("side", "store") == "store", entry
    for (f, args), exp in zip(inputs, expected):
        assert_same(_call(vm, f, args), exp, f"{variant} vs stock ({f})")


def _inputs(specs, rng):
    """random_inputs, plus bool scalars: ``((), "bool", v, v + 1)`` is the constant ``v``."""
    out = []
    for spec in specs:
        if spec[1] == "bool":
            out.append(np.array(bool(spec[2])))
        else:
            out.extend(random_inputs([spec], rng))
    return out


def op_count(mod, names=MOVEMENT_OPS):
    """Relax-level calls of the given ops in every Relax function."""
    n = [0]

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, Op) and e.op.name in names:
            n[0] += 1

    for _, f in mod.functions_items():
        if isinstance(f, relax.Function):
            relax.analysis.post_order_visit(f, visit)
    return n[0]


def calls_to(mod, fname_prefix):
    n = [0]

    def visit(e):
        if isinstance(e, relax.Call) and e.op.same_as(CALL_TIR) \
                and e.args[0].name_hint.startswith(fname_prefix):
            n[0] += 1

    for _, f in mod.functions_items():
        if isinstance(f, relax.Function):
            relax.analysis.post_order_visit(f, visit)
    return n[0]


# -- zero-size dimensions ----------------------------------------------------------------------
P = [((0, 8), F32), ((0, 5), F32)]
case("zero_permute_matmul", calls=[("main", P)],
     ref={"main": lambda x, w: [x.T @ w]})(lambda: make_module(P, lambda x, w: R.matmul(R.permute_dims(x), w)))

P_Z1 = [((0, 8), F32)]
case("zero_permute_sum", calls=[("main", P_Z1)],
     ref={"main": lambda x: [x.T.sum(axis=1)]})(
    lambda: make_module(P_Z1, lambda x: R.sum(R.permute_dims(x), axis=[1])))

P_Z2 = [((4, 8), F32), ((4, 3), F32)]
# strided_slice with begin == end: an empty axis (4, 0), then a matmul over the empty axis
case("zero_slice_empty_axis", calls=[("main", P_Z2)],
     ref={"main": lambda x, w: [x[:, 3:3].T @ w, x[:, 3:3].sum(axis=1)]})(
    lambda: make_module(P_Z2, lambda x, w: (
        R.matmul(R.permute_dims(emit(R.strided_slice(x, axes=[1], begin=[3], end=[3]))), w),
        R.sum(R.strided_slice(x, axes=[1], begin=[3], end=[3]), axis=[1]))))

P_Z3 = [((0, 8), F32), ((3, 8), F32), ((8, 2), F32)]
case("zero_concat_part", calls=[("main", P_Z3)],
     ref={"main": lambda a, b, w: [np.concatenate([a, b]) @ w, np.concatenate([b, a]).sum(axis=0)]})(
    lambda: make_module(P_Z3, lambda a, b, w: (
        R.matmul(R.concat([a, b], 0), w),
        R.sum(R.concat([b, a], 0), axis=[0]))))

P_Z4 = [((3, 0), F32), ((3, 4), F32)]
case("zero_concat_axis1_then_transpose", calls=[("main", P_Z4)],
     ref={"main": lambda a, b: [np.exp(np.concatenate([a, b], 1).T)]})(
    lambda: make_module(P_Z4, lambda a, b: R.exp(R.permute_dims(R.concat([a, b], 1)))))

# -- 0-d tensors ----------------------------------------------------------------------------
P_S = [((), F32), ((3, 4), F32)]
case("scalar_expand_dims_add", calls=[("main", P_S)],
     ref={"main": lambda s, y: [y + s.reshape(1, 1)]})(
    lambda: make_module(P_S, lambda s, y: R.add(R.expand_dims(s, [0, 1]), y)))

case("scalar_broadcast_multiply", calls=[("main", P_S)],
     ref={"main": lambda s, y: [np.broadcast_to(s, (3, 4)) * y]})(
    lambda: make_module(P_S, lambda s, y: R.multiply(R.broadcast_to(s, (3, 4)), y)))

case("scalar_reshape_chain_matmul", calls=[("main", P_S)],
     ref={"main": lambda s, y: [s.reshape(1, 1) @ y[:1, :]]})(
    lambda: make_module(P_S, lambda s, y: R.matmul(
        R.permute_dims(R.reshape(s, (1, 1))), R.strided_slice(y, axes=[0], begin=[0], end=[1]))))

P_S2 = [((), F32)]
case("scalar_sum_of_broadcast", calls=[("main", P_S2)],
     ref={"main": lambda s: [np.broadcast_to(s, (5, 2)).sum()]})(
    lambda: make_module(P_S2, lambda s: R.sum(R.broadcast_to(R.expand_dims(s, [0]), (5, 2)))))

# -- int64 extremes in slice bounds -----------------------------------------------------------
P_X = [((4, 8), F32), ((4, 3), F32)]
case("slice_int64_extremes_reverse", calls=[("main", P_X)],
     ref={"main": lambda x, w: [x[:, ::-1].T @ w]})(
    lambda: make_module(P_X, lambda x, w: R.matmul(R.permute_dims(R.strided_slice(
        x, axes=[0, 1], begin=[I64_MIN, I64_MAX], end=[I64_MAX, I64_MIN], strides=[1, -1])), w)))

case("slice_int64_extremes_step_neg2", calls=[("main", P_X)],
     ref={"main": lambda x, w: [np.exp(np.exp(x[::-2, 7:I64_MIN:-3])), x[I64_MIN:I64_MAX:3, :].sum(axis=0)]})(
    lambda: make_module(P_X, lambda x, w: (
        R.exp(R.exp(R.strided_slice(x, axes=[0, 1], begin=[I64_MAX, 7], end=[I64_MIN, I64_MIN],
                                    strides=[-2, -3]))),
        R.sum(R.strided_slice(x, axes=[0], begin=[I64_MIN], end=[I64_MAX], strides=[3]), axis=[0]))))

P_X2 = [((6, 5), F32)]
case("slice_negative_bounds_and_huge_begin", calls=[("main", P_X2)],
     ref={"main": lambda x: [np.exp(x[-4:-1:2, ::-1]), np.exp(x[I64_MAX:I64_MAX, :]).reshape(0, 5)]})(
    lambda: make_module(P_X2, lambda x: (
        R.exp(R.strided_slice(x, axes=[0, 1], begin=[-4, -1], end=[-1, I64_MIN], strides=[2, -1])),
        R.exp(R.strided_slice(x, axes=[0], begin=[I64_MAX], end=[I64_MAX])))))

# -- aliasing: one tensor passed twice to one op --------------------------------------------
P_A = [((5, 7), F32)]
case("alias_add_same_transpose", calls=[("main", P_A)],
     ref={"main": lambda x: [x.T + x.T]})(
    lambda: make_module(P_A, lambda x: _twice(R.permute_dims(x), R.add)))

P_A2 = [((6, 6), F32)]
case("alias_matmul_square_transpose", calls=[("main", P_A2)],
     ref={"main": lambda x: [x.T @ x.T]})(
    lambda: make_module(P_A2, lambda x: _twice(R.permute_dims(x), R.matmul)))

P_A3 = [((3, 4), F32)]
case("alias_concat_same_part", calls=[("main", P_A3)],
     ref={"main": lambda a: [np.concatenate([a, a], 0).sum(axis=0), np.concatenate([a, a], 1)]})(
    lambda: make_module(P_A3, lambda a: (
        R.sum(R.concat([a, a], 0), axis=[0]),
        R.negative(R.negative(R.concat([a, a], 1))))))

P_A4 = [((4, 4), F32)]
case("alias_transpose_and_original", calls=[("main", P_A4)],
     ref={"main": lambda x: [x.T @ x + x.T]})(
    lambda: make_module(P_A4, lambda x: _tt(x)))

# -- dead movement ops ------------------------------------------------------------------------
P_D = [((4, 8), F32)]


def _dead_body(x):
    emit(R.permute_dims(x), "dead_t")
    r = emit(R.reshape(x, (8, 4)), "dead_r")
    emit(R.strided_slice(R.permute_dims(r), axes=[0], begin=[1], end=[3]), "dead_chain")
    emit(R.concat([x, x], 0), "dead_cat")
    return R.exp(x)


def _no_movement_left(out, report, strategy):
    assert op_count(out) == 0, out["main"]
    assert calls_to(out, "vtc_copy") == 0, out["main"]


case("dead_movement_ops", calls=[("main", P_D)], ref={"main": lambda x: [np.exp(x)]},
     post=_no_movement_left)(lambda: make_module(P_D, _dead_body))

# -- outputs aliasing inputs --------------------------------------------------------------------
P_O = [((8, 4), F32), ((8, 6), F32)]
case("output_is_param", calls=[("main", P_O)],
     ref={"main": lambda x, w: [x, x.T @ w, w]})(
    lambda: make_module(P_O, lambda x, w: (x, R.matmul(R.permute_dims(x), w), w)))

case("output_is_reshape_of_param", calls=[("main", P_O)],
     ref={"main": lambda x, w: [x.reshape(4, 8), x.T @ w]})(
    lambda: make_module(P_O, lambda x, w: (R.reshape(x, (4, 8)), R.matmul(R.permute_dims(x), w))))

case("output_is_transpose_of_param_used_again", calls=[("main", P_O)],
     ref={"main": lambda x, w: [x.T, x.T @ w, x]})(
    lambda: make_module(P_O, lambda x, w: _out_t(x, w)))


def _out_t(x, w):
    t = emit(R.permute_dims(x))
    return t, R.matmul(t, w), x


def _ret_param_nodataflow():
    """A function returning its own parameter directly, no dataflow block, no compute."""
    x = relax.Var("x", relax.TensorType((3, 3), F32))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        bb.emit_func_output(relax.Tuple([x, x]))
    return bb.get()


case("return_param_twice_no_compute", calls=[("main", [((3, 3), F32)])],
     ref={"main": lambda x: [x, x]})(_ret_param_nodataflow)


# -- several functions and calls between them --------------------------------------------------
def _two_funcs():
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((6, 4), F32))
    w = relax.Var("w", relax.TensorType((6, 6), F32))
    with bb.function("helper", [a, w]):
        with bb.dataflow():
            t = bb.emit(R.permute_dims(a))               # (4, 6)
            gv = bb.emit_output(R.matmul(t, w))          # (4, 6)
        bb.emit_func_output(gv)
    helper = bb.get().get_global_var("helper")
    x = relax.Var("x", relax.TensorType((4, 6), F32))
    w2 = relax.Var("w2", relax.TensorType((6, 6), F32))
    with bb.function("main", [x, w2]):
        with bb.dataflow():
            xt = bb.emit(R.permute_dims(x))              # (6, 4): passed to another function
            h = bb.emit(relax.Call(helper, [xt, w2]))    # (4, 6)
            c = bb.emit(R.concat([h, R.permute_dims(xt)], 0))  # (8, 6); permute(xt) == x
            gv = bb.emit_output(relax.Tuple([R.sum(c, axis=[0]), R.sum(R.permute_dims(h), axis=[1]), h]))
        bb.emit_func_output(gv)
    return bb.get()


def _ref_two_funcs(x, w2):
    h = x @ w2
    return [np.concatenate([h, x], 0).sum(axis=0), h.T.sum(axis=1), h]


case("call_between_relax_functions",
     calls=[("main", [((4, 6), F32), ((6, 6), F32)]), ("helper", [((6, 4), F32), ((6, 6), F32)])],
     ref={"main": _ref_two_funcs, "helper": lambda a, w: [a.T @ w]})(_two_funcs)


def _add_func_module():
    """main calls a function added with ``bb.add_func`` (a Relax function built separately)."""
    inner_bb = relax.BlockBuilder()
    y = relax.Var("y", relax.TensorType((3, 4), F32))
    with inner_bb.function("inner", [y], private=True):
        with inner_bb.dataflow():
            gv = inner_bb.emit_output(R.sum(R.reshape(R.permute_dims(y), (2, 6)), axis=[0]))
        inner_bb.emit_func_output(gv)
    inner = inner_bb.get()["inner"]
    bb = relax.BlockBuilder()
    g = bb.add_func(inner, "inner")
    x = relax.Var("x", relax.TensorType((4, 3), F32))
    with bb.function("main", [x]):
        with bb.dataflow():
            r = bb.emit(relax.Call(g, [R.permute_dims(x)]))
            gv = bb.emit_output(R.add(r, R.strided_slice(R.flip(R.reshape(x, (2, 6)), 1), axes=[0], begin=[0], end=[1])))
        bb.emit_func_output(gv)
    return bb.get()


case("call_add_func_private",
     calls=[("main", [((4, 3), F32)])],
     ref={"main": lambda x: [x.reshape(2, 6).sum(axis=0)[None, :] + x.reshape(2, 6)[:, ::-1][:1]]})(
    _add_func_module)


# -- already fused / legalized modules ---------------------------------------------------------
P_F = [((8, 4), F32), ((8, 6), F32), ((2, 16), F32), ((4, 5), F32)]


def _fused_body(x, w, y, v):
    a = R.matmul(R.permute_dims(R.exp(x)), w)                          # transpose -> matmul
    b = R.matmul(R.permute_dims(R.reshape(R.exp(y), (8, 4))), R.exp(R.reshape(x, (8, 4))))  # reshape+transpose copy
    c = R.sum(R.add(R.concat([R.exp(v), R.exp(v)], 0), relax.const(1.0, F32)), axis=[1])   # concat -> add -> sum
    return a, b, c


def _ref_fused(x, w, y, v):
    return [np.exp(x).T @ w, np.exp(y).reshape(8, 4).T @ np.exp(x.reshape(8, 4)),
            (np.concatenate([np.exp(v)] * 2) + 1).sum(axis=1)]


def _legalize(mod):
    return relax.transform.LegalizeOps()(mod)


case("after_legalize_ops", calls=[("main", P_F)], ref={"main": _ref_fused}, pre=_legalize)(
    lambda: make_module(P_F, _fused_body))
case("after_fuse_tir", calls=[("main", P_F)], ref={"main": _ref_fused}, pre=FUSE)(
    lambda: make_module(P_F, _fused_body))


# -- external call_dps_packed consumer --------------------------------------------------------
PACKED = "vtc_test.hostile_negate"


def _negate_into(src, dst):
    """DPS packed function: ``dst = -src`` (outputs are passed after the inputs)."""
    dst.copyfrom(-src.numpy())


tvm_ffi.register_global_func(PACKED, _negate_into, override=True)


def _packed_body(x, w):
    t = emit(R.permute_dims(x))                                             # (4, 8)
    n = emit(relax.call_dps_packed(PACKED, relax.Tuple([t]), out_ty=relax.TensorType((4, 8), F32)))
    return R.matmul(t, w), n


def _packed_materialised(out, report, strategy):
    # the external function reads a real (4, 8) tensor: the transpose stays, exactly once
    assert op_count(out, {"relax.permute_dims"}) + calls_to(out, "vtc_copy") == 1, out["main"]


P_P = [((8, 4), F32), ((8, 6), F32)]
case("call_dps_packed_consumer", calls=[("main", P_P)],
     ref={"main": lambda x, w: [x.T @ w, -x.T]}, post=_packed_materialised)(
    lambda: make_module(P_P, _packed_body))


# -- non-dataflow bindings --------------------------------------------------------------------
def _no_dataflow():
    x = relax.Var("x", relax.TensorType((8, 4), F32))
    w = relax.Var("w", relax.TensorType((8, 6), F32))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        t = bb.emit(R.permute_dims(x))
        m = bb.emit(R.matmul(t, w))
        c = bb.emit(R.concat([t, R.permute_dims(R.strided_slice(w, axes=[1], begin=[0], end=[4]))], 1))
        s = bb.emit(R.sum(c, axis=[1]))
        bb.emit_func_output(relax.Tuple([m, s]))
    return bb.get()


case("no_dataflow_block", calls=[("main", P_P)],
     ref={"main": lambda x, w: [x.T @ w, np.concatenate([x.T, w[:, :4].T], 1).sum(axis=1)]})(_no_dataflow)


def _mixed_blocks():
    """A binding block, then a dataflow block, then another binding block."""
    x = relax.Var("x", relax.TensorType((8, 4), F32))
    w = relax.Var("w", relax.TensorType((8, 6), F32))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        t = bb.emit(R.permute_dims(x))                    # outside: consumed inside the dataflow block
        with bb.dataflow():
            m = bb.emit(R.matmul(t, w))
            u = bb.emit_output(R.permute_dims(m))         # (6, 4): consumed outside
        r = bb.emit(R.matmul(u, t))                       # (6, 8)
        bb.emit_func_output(r)
    return bb.get()


case("mixed_dataflow_and_plain_blocks", calls=[("main", P_P)],
     ref={"main": lambda x, w: [(x.T @ w).T @ x.T]})(_mixed_blocks)

def _two_dataflow_blocks():
    """A virtual tensor that is the output of one dataflow block, consumed in the next one.
    (The pass's BlockBuilder merges the two adjacent blocks; the stock module keeps both.)"""
    x = relax.Var("x", relax.TensorType((4, 6), F32))
    w = relax.Var("w", relax.TensorType((4, 5), F32))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            e = bb.emit(R.exp(x))                          # a DataflowVar of block 1
            t = bb.emit_output(R.permute_dims(e))          # (6, 4), output of block 1
        with bb.dataflow():
            gv = bb.emit_output(R.matmul(t, w))            # (6, 5) in block 2
        bb.emit_func_output(gv)
    return bb.get()


case("dataflow_output_consumed_in_next_block", calls=[("main", [((4, 6), F32), ((4, 5), F32)])],
     ref={"main": lambda x, w: [np.exp(x).T @ w]})(_two_dataflow_blocks)


def _dataflow_output_consumed_outside():
    """Minimal form of the same thing: the consumer is a plain binding after the block."""
    x = relax.Var("x", relax.TensorType((4, 6), F32))
    w = relax.Var("w", relax.TensorType((6, 4), F32))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            e = bb.emit(R.exp(x))
            t = bb.emit_output(R.permute_dims(e))
        r = bb.emit(R.add(t, w))
        bb.emit_func_output(r)
    return bb.get()


case("dataflow_output_consumed_outside_block", calls=[("main", [((4, 6), F32), ((6, 4), F32)])],
     ref={"main": lambda x, w: [np.exp(x).T + w]})(_dataflow_output_consumed_outside)


@I.ir_module
class IfModule:
    @R.function
    def main(c: R.Tensor((), "bool"), x: R.Tensor((8, 4), "float32"), w: R.Tensor((8, 6), "float32")):
        t = R.permute_dims(x)                 # defined outside the branches, used in both
        if c:
            r = R.matmul(t, w)
        else:
            u = R.permute_dims(R.exp(x))
            r = R.add(R.matmul(u, w), R.matmul(t, w))
        return r


_IF_P = [((8, 4), F32), ((8, 6), F32)]
case("if_branches", calls=[("main", [((), "bool", 1, 2)] + _IF_P), ("main", [((), "bool", 0, 1)] + _IF_P)],
     ref={"main": lambda c, x, w: [x.T @ w if c else np.exp(x).T @ w + x.T @ w]})(lambda: IfModule)

_CONST = np.arange(32, dtype=np.float32).reshape(8, 4) / 7.0
case("constant_source", calls=[("main", [((8, 6), F32)])],
     ref={"main": lambda w: [_CONST.T @ w, _CONST[::-1].sum(axis=0)]})(
    lambda: make_module([((8, 6), F32)], lambda w: (
        R.matmul(R.permute_dims(relax.const(_CONST)), w),
        R.sum(R.flip(relax.const(_CONST), 0), axis=[0]))))


def _tuple_wrapped(x, w):
    t = emit(R.permute_dims(x))                     # (4, 8)
    tup = emit(relax.Tuple([t, x]))
    return R.matmul(emit(relax.TupleGetItem(tup, 0)), w), R.sum(t, axis=[1])


case("virtual_inside_tuple", calls=[("main", P_P)],
     ref={"main": lambda x, w: [x.T @ w, x.T.sum(axis=1)]})(lambda: make_module(P_P, _tuple_wrapped))

# -- other dtypes -----------------------------------------------------------------------------
P_H = [((16, 8), F16), ((16, 4), F16)]
case("fp16_transpose_matmul", calls=[("main", P_H)])(
    lambda: make_module(P_H, lambda x, w: R.matmul(R.permute_dims(x), w)))

P_I = [((6, 5), I32), ((5, 6), I32)]
case("int32_transpose_add_sum", calls=[("main", [((6, 5), I32, -50, 50), ((5, 6), I32, -50, 50)])],
     ref={"main": lambda x, y: [x.T + y, (x.T + y).sum(axis=0, dtype=np.int32)]})(
    lambda: make_module(P_I, lambda x, y: _add_sum(x, y)))


def _add_sum(x, y):
    a = emit(R.add(R.permute_dims(x), y))
    return a, R.sum(R.permute_dims(R.concat([R.permute_dims(a)], 0)), axis=[0])


case("int32_transpose_matmul", calls=[("main", [((6, 5), I32, -20, 20), ((6, 3), I32, -20, 20)])],
     ref={"main": lambda x, w: [(x.T @ w).astype(np.int32)]})(
    lambda: make_module([((6, 5), I32), ((6, 3), I32)], lambda x, w: R.matmul(R.permute_dims(x), w)))


# -- symbolic shapes ----------------------------------------------------------------------------
def _symbolic():
    n = tvm.tirx.Var("n", "int64")
    xs = [relax.Var("x", relax.TensorType((n, 8), F32)), relax.Var("w", relax.TensorType((n, 4), F32))]
    return module_of(xs, lambda x, w: R.matmul(emit(R.permute_dims(x)), w))


def _symbolic_flows(out, report, strategy):
    assert not any("symbolic" in e["reason"] for e in report), report
    if strategy == "all":
        assert op_count(out, {"relax.permute_dims"}) == 0, out["main"]


case("symbolic_transpose_matmul", calls=[("main", [((5, 8), F32), ((5, 4), F32)]),
                                         ("main", [((1, 8), F32), ((1, 4), F32)])],
     ref={"main": lambda x, w: [x.T @ w]}, post=_symbolic_flows)(_symbolic)


# -- helpers used by the bodies above (defined late; looked up at build time) ------------------
def _twice(expr, op):
    v = emit(expr)
    return op(v, v)


def _tt(x):
    t = emit(R.permute_dims(x))
    return R.add(R.matmul(t, x), t)


# -- tests ------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile(name, variant, rng):
    check_case(CASES[name], variant, rng)


@pytest.mark.parametrize("strategy", ["contiguity", "all"])
def test_dps_packed_func_really_runs(strategy, rng):
    """The registered packed func is called by the compiled module (not folded away)."""
    seen = []

    def spy(src, dst):
        seen.append(tuple(src.shape))
        dst.copyfrom(-src.numpy())

    tvm_ffi.register_global_func(PACKED, spy, override=True)
    try:
        mod = _prepared(CASES["call_dps_packed_consumer"])
        out = vtc_tvm.VirtualTensorize(strategy=strategy)(mod)
        x, w = random_inputs(P_P, rng)
        res = _call(_compile(out, _default()), "main", [x, w])
        assert seen == [(4, 8)], seen
        np.testing.assert_allclose(res[1], -x.T, rtol=0, atol=0)
    finally:
        tvm_ffi.register_global_func(PACKED, _negate_into, override=True)


@pytest.mark.parametrize("strategy", ["contiguity", "all"])
def test_dps_packed_consumer_is_reported(strategy):
    """The external consumer keeps the tensor physical, and the report says so (like a call to a
    Relax function does: 'consumer is not a rewritable call_tir')."""
    report = []
    vtc_tvm.VirtualTensorize(strategy=strategy, report=report)(_prepared(CASES["call_dps_packed_consumer"]))
    ext = [e for e in report if "call_dps_packed" in e["consumer"] or PACKED in e["consumer"]]
    assert ext and not any(e["virtual"] for e in ext), report


@pytest.mark.parametrize("strategy", ["contiguity", "all"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_pass_twice(name, strategy):
    """Running the pass on its own output never raises and stays well formed."""
    once = vtc_tvm.VirtualTensorize(strategy=strategy)(_prepared(CASES[name]))
    twice = vtc_tvm.VirtualTensorize(strategy=strategy)(once)
    assert relax.analysis.check_well_formed(twice), twice
