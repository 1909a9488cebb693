"""Crash classes found on real models (issue 15), each shaped like the model that hit it.

1. An ONNX ``Expand`` whose target shape is a runtime input: the rewritten ``broadcast_to`` was
   hoisted above the ``match_cast`` that defines the symbolic dims its shape uses, and VM shape
   lowering failed ("PrimExpr ... has not been computed"). Stock TVM compiles it.
2. The memory guard's give-up path named Relax variables by ``.name_hint`` (GlobalVar's
   attribute; Relax variables have ``.name``) and raised AttributeError whenever it ran.
"""

import numpy as np
import onnx
import pytest
import tvm
import tvm.relax.frontend.onnx  # noqa: F401  (not loaded by `import tvm`)
from onnx import TensorProto
from onnx import helper as oh
from tvm import relax

import vtc_tvm
from vtc_tvm import transform as vt_transform

LLVM = tvm.target.Target("llvm")


def _expand_model():
    """x -> Transpose -> Expand(shape from the input ``s``) -> Relu, as an exporter writes it."""
    nodes = [oh.make_node("Transpose", ["x"], ["xt"], perm=[2, 1, 0]),
             oh.make_node("Expand", ["xt", "s"], ["e"]),
             oh.make_node("Relu", ["e"], ["y"])]
    graph = oh.make_graph(nodes, "expand_runtime_shape",
                          [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 3]),
                           oh.make_tensor_value_info("s", TensorProto.INT64, [3])],
                          [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def _run(ex, *arrays):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


def test_expand_to_a_runtime_shape_compiles_and_matches_stock(rng):
    mod = relax.frontend.onnx.from_onnx(_expand_model())
    report = []
    vtc = tvm.compile(mod, LLVM, relax_pipeline=relax.get_pipeline("vtc", target=LLVM, report=report))
    stock = tvm.compile(mod, LLVM, relax_pipeline=relax.get_default_pipeline(LLVM))
    # The transpose is read through by the broadcast (the edge that was hoisted too far).
    assert any(d["virtual"] and d["consumer"] == "broadcast_to" for d in report), report
    x = rng.standard_normal((1, 4, 3)).astype("float32")
    for shape in ([3, 4, 2], [3, 4, 1], [3, 4, 7]):
        s = np.array(shape, dtype="int64")
        want = np.maximum(np.broadcast_to(x.transpose(2, 1, 0), shape), 0)
        np.testing.assert_array_equal(_run(vtc, x, s), _run(stock, x, s))
        np.testing.assert_array_equal(_run(vtc, x, s), want)


def test_memory_guard_give_up_path_reports_relax_variables(monkeypatch):
    """When no refusal brings planned memory under stock's, the module is left as it was and
    each taken edge is reported physical, by the names Relax variables have."""
    from tests.conftest import emit, make_module

    mod = make_module([((8, 16), "float32"), ((8, 4), "float32")],
                      lambda x, w: emit(relax.op.matmul(emit(relax.op.permute_dims(x, [1, 0])), w)))
    # Planned memory: stock's module 0 bytes, every rewritten one more (no trial can succeed).
    monkeypatch.setattr("vtc_tvm.report.kernel_census",
                        lambda m, target, stores=False: {"planned_bytes": 0 if not stores else 1})
    report = []
    out = vtc_tvm.VirtualTensorize(strategy="all", target=LLVM, memory_guard=True, report=report)(mod)
    tvm.ir.assert_structural_equal(out, mod)
    give_up = [d for d in report if d["reason"].startswith("memory guard: no refusal")]
    assert give_up and all(isinstance(d["tensor"], str) and isinstance(d["consumer"], str) for d in give_up)
    assert not any(d["virtual"] for d in give_up)
    assert vt_transform.GUARD_TRIALS >= 1
