"""Everything TVM can hand a user is input: each form of Relax module, through VirtualTensorize
and the vtc pipelines, is either transformed correctly (same outputs as stock TVM on fresh
random inputs) or left untouched; never a crash.

Forms: constants, already legalized ``call_tir``, ``call_tir_inplace``, tuple outputs and
tuple-typed parameters, ``match_cast``, several Relax functions calling each other, a function
without a dataflow block, ``num_input`` (MLC / ``LiftTransformParams`` style), ``call_dps_packed``,
symbolic shapes, a module of PrimFuncs only; and two crash classes found on real models:
a legalized ``take`` (whose index LegalizeOps narrows to int32) read through by a concat,
and GatherND legalized before the pass (issue 15, the memory guard path).
"""

import numpy as np
import onnx
import pytest
import tvm
import tvm.relax.frontend.onnx  # noqa: F401
from onnx import TensorProto
from onnx import helper as oh
from onnx import numpy_helper
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import vtc_tvm

from .model_fuzz import ENTRY_POINTS, LLVM, build_stock, build_vtc

ENTRIES = ENTRY_POINTS + ("vtc_pipeline_legalized",)


def _flat(out):
    if isinstance(out, tvm.runtime.Tensor):
        return [out.numpy()]
    return [a for o in out for a in _flat(o)]


def _call(ex, func, args):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return _flat(vm[func](*args))


def _tensors(arrays):
    return [tvm.runtime.tensor(a) if isinstance(a, np.ndarray) else a for a in arrays]


def check_all_entries(mod, make_args, func="main", rng=None, strategies=("contiguity", "all")):
    """Stock vs every entry point (and the vtc pipeline on the legalized module), bit for bit;
    returns the report of the last VirtualTensorize run."""
    args = make_args(rng)
    want = _call(build_stock(mod), func, _tensors(args))
    report = []
    for strategy in strategies:
        for entry in ENTRIES:
            m = mod
            if entry == "vtc_pipeline_legalized":
                with LLVM:
                    m = relax.transform.LegalizeOps()(mod)
                entry = "vtc_pipeline"
            report = []
            got = _call(build_vtc(m, entry, strategy=strategy, report=report), func, _tensors(args))
            assert len(got) == len(want)
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w, err_msg=f"{entry} {strategy}")
    return report


def _normal(rng, *shapes):
    return [rng.standard_normal(s).astype("float32") for s in shapes]


# ------------------------------------------------------------------------------------------------
def test_constants(rng):
    w = rng.standard_normal((16, 8)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            wt = bb.emit(relax.op.permute_dims(relax.const(w)))       # a transposed constant
            y = bb.emit(relax.op.matmul(bb.emit(relax.op.permute_dims(x)), wt))
            out = bb.emit_output(relax.op.add(y, relax.const(np.float32(1.0))))
        bb.emit_func_output(out)
    report = check_all_entries(bb.get(), lambda r: _normal(r, (8, 16)), rng=rng)
    assert report


@I.ir_module
class AlreadyLegalized:
    @T.prim_func(private=True, s_tir=True)
    def transpose(a: T.Buffer((8, 4), "float32"), b: T.Buffer((4, 8), "float32")):
        for i, j in T.grid(4, 8):
            with T.sblock("t"):
                vi, vj = T.axis.remap("SS", [i, j])
                b[vi, vj] = a[vj, vi]

    @T.prim_func(private=True, s_tir=True)
    def exp(a: T.Buffer((4, 8), "float32"), b: T.Buffer((4, 8), "float32")):
        for i, j in T.grid(4, 8):
            with T.sblock("e"):
                vi, vj = T.axis.remap("SS", [i, j])
                b[vi, vj] = T.exp(a[vi, vj])

    @R.function
    def main(x: R.Tensor((8, 4), "float32")):
        cls = AlreadyLegalized
        with R.dataflow():
            t = R.call_tir(cls.transpose, (x,), out_ty=R.Tensor((4, 8), "float32"))
            y = R.call_tir(cls.exp, (t,), out_ty=R.Tensor((4, 8), "float32"))
            R.output(y)
        return y


def test_call_tir_already_legalized(rng):
    report = check_all_entries(AlreadyLegalized, lambda r: _normal(r, (8, 4)), rng=rng)
    assert any(d["virtual"] for d in report), report  # the copy kernel is read through


@I.ir_module
class InPlace:
    @T.prim_func(private=True, s_tir=True)
    def add_inplace(a: T.Buffer((4, 8), "float32"), b: T.Buffer((4, 8), "float32")):
        T.func_attr({"op_pattern": 8})  # opaque: stock FuseTIR cannot fuse into in-place calls
        for i, j in T.grid(4, 8):
            with T.sblock("add"):
                vi, vj = T.axis.remap("SS", [i, j])
                a[vi, vj] = a[vi, vj] + b[vi, vj]

    @R.function
    def main(a: R.Tensor((4, 8), "float32"), b: R.Tensor((8, 4), "float32")):
        cls = InPlace
        with R.dataflow():
            bt = R.permute_dims(b)     # read by the in-place kernel (not the tensor it writes)
            y = R.call_tir_inplace(cls.add_inplace, (a, bt), out_ty=R.Tensor((4, 8), "float32"),
                                   inplace_indices=[0])
            z = R.nn.relu(R.permute_dims(y))
            R.output(z)
        return z


def test_call_tir_inplace(rng):
    """An opaque in-place kernel (MLC's KV-cache updates are such). Fused with its producer,
    stock TVM's FuseTIR itself fails ("Inconsistent buffers ... mapped to the same relax var")."""
    check_all_entries(InPlace, lambda r: _normal(r, (4, 8), (8, 4)), rng=rng)


@I.ir_module
class TupleParams:
    @R.function
    def main(t: R.Tuple(R.Tensor((8, 4), "float32"), R.Tensor((8, 6), "float32"))):
        with R.dataflow():
            a = t[0]
            b = t[1]
            at = R.permute_dims(a)
            y = R.matmul(at, b)
            c = R.concat((a, b), axis=1)
            s = R.split(c, [4], axis=1)
            z = R.nn.softmax(R.permute_dims(s[1]), axis=-1)
            R.output(y, z)
        return (y, (z, y))


def test_tuple_params_and_nested_tuple_outputs(rng):
    check_all_entries(TupleParams, lambda r: [tvm.runtime.convert(_tensors(_normal(r, (8, 4), (8, 6))))],
                      rng=rng)


@I.ir_module
class MatchCast:
    @R.function
    def main(x: R.Tensor("float32", ndim=2), w: R.Tensor((8, 4), "float32")):
        n = T.int64()
        with R.dataflow():
            xs = R.match_cast(x, R.Tensor((8, n), "float32"))
            xt = R.permute_dims(xs)
            y = R.matmul(xt, w)
            R.output(y)
        return y


def test_match_cast(rng):
    for n in (3, 5):
        check_all_entries(MatchCast, lambda r: _normal(r, (8, n), (8, 4)), rng=rng)


@I.ir_module
class Calls:
    @R.function
    def helper(x: R.Tensor((8, 4), "float32"), w: R.Tensor((8, 6), "float32")) -> R.Tensor((4, 6), "float32"):
        with R.dataflow():
            y = R.matmul(R.permute_dims(x), w)
            R.output(y)
        return y

    @R.function(private=True)
    def inner(x: R.Tensor((4, 6), "float32")) -> R.Tensor((6, 4), "float32"):
        with R.dataflow():
            y = R.exp(R.permute_dims(x))
            R.output(y)
        return y

    @R.function
    def main(x: R.Tensor((8, 4), "float32"), w: R.Tensor((8, 6), "float32")):
        cls = Calls
        y = cls.helper(x, w)
        z = cls.inner(y)
        with R.dataflow():
            u = R.add(R.permute_dims(z), y)
            R.output(u)
        return u


def test_functions_calling_each_other(rng):
    for func in ("main", "helper"):
        check_all_entries(Calls, lambda r: _normal(r, (8, 4), (8, 6)), func=func, rng=rng)


@I.ir_module
class NoDataflow:
    @R.function
    def main(x: R.Tensor((8, 4), "float32"), w: R.Tensor((8, 6), "float32")):
        xt = R.permute_dims(x)
        y = R.matmul(xt, w)
        r = R.reshape(y, (24,))
        z = R.nn.relu(r)
        return z


def test_function_without_dataflow_block(rng):
    check_all_entries(NoDataflow, lambda r: _normal(r, (8, 4), (8, 6)), rng=rng)


@I.ir_module
class NumInput:
    @R.function
    def main(x: R.Tensor((8, 4), "float32"), w: R.Tensor((6, 8), "float32")):
        R.func_attr({"num_input": 1})
        with R.dataflow():
            wt = R.permute_dims(w)
            y = R.matmul(R.permute_dims(x), wt)
            R.output(y)
        return y


def test_num_input_attribute(rng):
    check_all_entries(NumInput, lambda r: _normal(r, (8, 4), (6, 8)), rng=rng)
    out = vtc_tvm.VirtualTensorize(target=LLVM)(NumInput)
    assert int(out["main"].attrs["num_input"]) == 1


@tvm.register_global_func("vtc_test.copy_negate", override=True)
def _copy_negate(a, out):
    out.copyfrom(-a.numpy())


@I.ir_module
class DpsPacked:
    @R.function
    def main(x: R.Tensor((8, 4), "float32")):
        with R.dataflow():
            xt = R.permute_dims(x)     # an opaque consumer reads it: materialised
            y = R.call_dps_packed("vtc_test.copy_negate", (xt,), out_ty=R.Tensor((4, 8), "float32"))
            z = R.exp(R.permute_dims(y))
            R.output(z)
        return z


def test_call_dps_packed(rng):
    report = check_all_entries(DpsPacked, lambda r: _normal(r, (8, 4)), rng=rng)
    assert report


@I.ir_module
class Symbolic:
    @R.function
    def main(x: R.Tensor(("n", 8), "float32"), w: R.Tensor((8, 4), "float32")):
        n = T.int64()
        with R.dataflow():
            xr = R.reshape(x, (n, 2, 4))
            xt = R.permute_dims(xr, [0, 2, 1])
            xf = R.reshape(xt, (n, 8))
            y = R.matmul(xf, w)
            c = R.concat((y, y), axis=0)
            R.output(c)
        return c


def test_symbolic_shapes(rng):
    for n in (1, 5):
        check_all_entries(Symbolic, lambda r: _normal(r, (n, 8), (8, 4)), rng=rng)


@I.ir_module
class OnlyPrimFuncs:
    @T.prim_func(s_tir=True)
    def transpose(a: T.Buffer((8, 4), "float32"), b: T.Buffer((4, 8), "float32")):
        for i, j in T.grid(4, 8):
            with T.sblock("t"):
                vi, vj = T.axis.remap("SS", [i, j])
                b[vi, vj] = a[vj, vi]


def test_module_with_only_prim_funcs():
    """Nothing to transform: returned unchanged by the pass and by the whole vtc pipeline."""
    report = []
    tvm.ir.assert_structural_equal(vtc_tvm.VirtualTensorize(target=LLVM, report=report)(OnlyPrimFuncs),
                                   OnlyPrimFuncs)
    assert report == []
    out = relax.get_pipeline("vtc", target=LLVM)(OnlyPrimFuncs)
    assert [gv.name_hint for gv in out.get_global_vars()] == ["transpose"]


# -- crash classes found on real models --------------------------------------------------------------
def test_legalized_take_read_through_a_concat(rng):
    """A legalized take (LegalizeOps narrows its int64 constant index to an int32 buffer) whose
    input is a concat: the composed concat condition compared the int32 index with an int64
    bound and mapping.to_prim_func crashed (found by tests/model_fuzz.py on llama_decode)."""
    perm = rng.permutation(33).astype("int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 32), "float32"))
    y = relax.Var("y", relax.TensorType((4, 1), "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            c = bb.emit(relax.op.concat([x, y], axis=1))
            g = bb.emit(relax.op.take(c, relax.const(perm), axis=1))
            g2 = bb.emit(relax.op.take(g, relax.const(np.argsort(perm).astype("int64")), axis=1))
            out = bb.emit_output(relax.op.matmul(bb.emit(relax.op.permute_dims(g2, [1, 0])), x))
        bb.emit_func_output(out)
    with LLVM:
        legalized = relax.transform.LegalizeOps()(bb.get())
    check_all_entries(legalized, lambda r: _normal(r, (4, 32), (4, 1)), rng=rng)


def _gather_nd_model(rng):
    """An exporter's GatherND: data transposed, gathered by a constant index table (an
    initializer), then a MatMul with a constant weight and a Relu."""
    idx = np.stack([rng.integers(0, 2, (5,)), rng.integers(0, 6, (5,))], axis=-1).astype("int64")
    w = rng.standard_normal((4, 3)).astype("float32")
    nodes = [oh.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
             oh.make_node("GatherND", ["xt", "idx"], ["g"]),
             oh.make_node("MatMul", ["g", "w"], ["m"]),
             oh.make_node("Relu", ["m"], ["y"])]
    graph = oh.make_graph(nodes, "gather_nd", [oh.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 6])],
                          [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(idx, "idx"), numpy_helper.from_array(w, "w")])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def test_gather_nd_legalized_before_the_vtc_pipeline(rng):
    """Issue 15's shape: a GatherND model (constant index table and weight, as exported) through
    ``LegalizeOps`` and then the ``"vtc"`` pipeline (memory guard on) compiles and matches stock,
    as imported and legalized. (The guard's give-up path, where the reported crash was, is
    exercised by tests/test_crash_regressions.py; this model does not reach it.)"""
    mod = relax.frontend.onnx.from_onnx(_gather_nd_model(rng))
    with LLVM:
        legalized = relax.transform.LegalizeOps()(mod)
    assert "R.gather_nd(" in mod["main"].script() and "R.gather_nd(" not in legalized["main"].script()
    x = rng.standard_normal((2, 4, 6)).astype("float32")
    for m in (mod, legalized):
        want = _call(build_stock(m), "main", _tensors([x]))
        report = []
        ex = tvm.compile(m, LLVM, relax_pipeline=relax.get_pipeline("vtc", target=LLVM, report=report))
        np.testing.assert_array_equal(_call(ex, "main", _tensors([x])), want)
        assert report
