"""Every ONNX data-movement op, imported with ``load_onnx`` between compute ops: onnxruntime ==
stock TVM == VirtualTensorize (both strategies) on LLVM, and no more data-movement kernels than stock."""

import numpy as np
import onnx
import pytest
import tvm
from tvm import relax
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

from vtc_tvm import VirtualTensorize
from vtc_tvm.onnx_import import load_onnx
from vtc_tvm.report import kernel_census, run_vm

ort = pytest.importorskip("onnxruntime")

INT64_MAX, INT64_MIN = 2**63 - 1, -(2**63)
TARGET = tvm.target.Target("llvm")
_rng = np.random.default_rng(0)  # weights only; the inputs are fresh per test


def build(mod):
    return tvm.compile(mod, target=TARGET, relax_pipeline=relax.get_default_pipeline(TARGET))


def W(*shape):
    return _rng.standard_normal(shape).astype("float32")


def I(*values):
    return np.array(values, dtype="int64")


def node(op, inputs, outputs=("m",), **attrs):
    return h.make_node(op, list(inputs), list(outputs), **attrs)


def mm(k, src="m", out="y", name="w_out"):
    """The consumer: MatMul of ``src`` (last dim ``k``) with a fresh [k, 5] weight."""
    return [node("MatMul", [src, name], [out])], {name: W(k, 5)}


def conv(cin, src="m"):
    """The consumer: 3x3 Conv (padding 1) with ``cin`` input channels."""
    return [node("Conv", [src, "w_conv"], ["y"], pads=[1, 1, 1, 1])], {"w_conv": W(3, cin, 3, 3)}


def case(x_shape, movement, inits=None, consumer=([], {}), opset=17):
    """x -> producer -> a -> ``movement`` -> m -> consumer -> y, as an ONNX model.

    The producer is a MatMul (a 1x1 Conv for NCHW inputs): TVM fuses an elementwise producer
    with a following movement op, which would leave nothing for the census to count.
    """
    c_nodes, c_inits = consumer
    if len(x_shape) == 4:
        producer, w_in = node("Conv", ["x", "w_in"], ["a"]), W(x_shape[1], x_shape[1], 1, 1)
    else:
        producer, w_in = node("MatMul", ["x", "w_in"], ["a"]), W(x_shape[-1], x_shape[-1])
    nodes = [producer] + movement + c_nodes
    inits = {"w_in": w_in, **(inits or {}), **c_inits}
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, x_shape)],
                         [h.make_value_info("y", onnx.TypeProto())],
                         [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)  # fills in y's type


def split_add(sizes):
    """Split along axis 1; each part feeds its own MatMul, then a Sum."""
    parts = [f"p{k}" for k in range(len(sizes))]
    nodes = [node("Split", ["a", "split"], parts, axis=1)]
    inits = {"split": I(*sizes)}
    for k, (p, s) in enumerate(zip(parts, sizes)):
        nodes.append(node("MatMul", [p, f"w{k}"], [f"q{k}"]))
        inits[f"w{k}"] = W(s, 5)
    nodes.append(node("Sum", [f"q{k}" for k in range(len(sizes))], ["y"]))
    return nodes, inits, ([], {})


CASES = {
    "Transpose": lambda: case([4, 8], [node("Transpose", ["a"], perm=[1, 0])], consumer=mm(4)),
    "Transpose_ReduceSum": lambda: case(
        [4, 6, 8], [node("Transpose", ["a"], perm=[2, 0, 1])], {"ax": I(2)},
        ([node("ReduceSum", ["m", "ax"], ["r"], keepdims=0), node("Add", ["r", "b"], ["y"])], {"b": W(8, 4)})),
    "Reshape": lambda: case([2, 3, 4], [node("Reshape", ["a", "s"])], {"s": I(-1, 4)}, mm(4)),
    "Reshape_transposing": lambda: case([2, 3, 4], [node("Reshape", ["a", "s"])], {"s": I(4, 6)}, mm(6)),
    "Flatten": lambda: case([2, 3, 4], [node("Flatten", ["a"], axis=1)], consumer=mm(12)),
    "Squeeze": lambda: case([4, 1, 8], [node("Squeeze", ["a", "ax"])], {"ax": I(1)}, mm(8)),
    "Unsqueeze": lambda: case([4, 8], [node("Unsqueeze", ["a", "ax"])], {"ax": I(0, 3)}, mm(1)),
    "Slice": lambda: case([6, 10], [node("Slice", ["a", "st", "en", "ax", "sp"])],
                          {"st": I(1, 2), "en": I(INT64_MAX, 9), "ax": I(0, 1), "sp": I(2, 3)}, mm(3)),
    "Slice_negative_step": lambda: case([6, 10], [node("Slice", ["a", "st", "en", "ax", "sp"])],
                                        {"st": I(-1, 8), "en": I(INT64_MIN, 0), "ax": I(1, 0), "sp": I(-2, -3)},
                                        mm(5)),
    "Split_equal": lambda: case([4, 8], *split_add([4, 4])),
    "Split_uneven": lambda: case([4, 8], *split_add([3, 5])),
    "Concat": lambda: case([4, 8], [node("MatMul", ["x", "wc"], ["b"]), node("Concat", ["a", "b"], axis=1)],
                           {"wc": W(8, 6)}, mm(14)),
    "Gather": lambda: case([6, 8], [node("Gather", ["a", "idx"], axis=0)], {"idx": I(4, -1, 1, 5)}, mm(8)),
    "Gather_axis1": lambda: case([4, 8], [node("Gather", ["a", "idx"], axis=1)], {"idx": I(7, 0, 0, 3, 2)}, mm(5)),
    "GatherElements": lambda: case([4, 6], [node("GatherElements", ["a", "idx"], axis=1)],
                                   {"idx": np.array([[0, 5, 1], [2, 2, 3], [5, 4, 0], [1, 1, 1]], "int64")}, mm(3)),
    "GatherND": lambda: case([4, 6, 8], [node("GatherND", ["a", "idx"])],
                             {"idx": np.array([[0, 1], [3, 5], [2, 2]], "int64")}, mm(8)),
    "Expand": lambda: case([4, 1], [node("Expand", ["a", "s"])], {"s": I(2, 4, 8)}, mm(8)),
    "Tile": lambda: case([2, 4], [node("Tile", ["a", "r"])], {"r": I(2, 3)}, mm(12)),
    "Pad_constant": lambda: case([1, 2, 5, 5], [node("Pad", ["a", "p", "v"], mode="constant")],
                                 {"p": I(0, 0, 1, 2, 0, 0, 2, 0), "v": np.array(0.5, "float32")}, conv(2)),
    "DepthToSpace_DCR": lambda: case([1, 8, 3, 3], [node("DepthToSpace", ["a"], blocksize=2, mode="DCR")],
                                     consumer=conv(2)),
    "DepthToSpace_CRD": lambda: case([1, 8, 3, 3], [node("DepthToSpace", ["a"], blocksize=2, mode="CRD")],
                                     consumer=conv(2)),
    "SpaceToDepth": lambda: case([1, 2, 6, 6], [node("SpaceToDepth", ["a"], blocksize=2)], consumer=conv(8)),
    "Identity": lambda: case([4, 8], [node("Identity", ["a"])], consumer=mm(8)),
    "Split_num_outputs_opset18": lambda: case(
        [4, 8], [node("Split", ["a"], ["p0", "p1"], axis=1, num_outputs=2), node("Sub", ["p0", "p1"], ["m"])],
        consumer=mm(4), opset=18),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_movement_op(name):
    model = CASES[name]()
    mod = load_onnx(model)
    seed = int(np.random.SeedSequence().entropy % 2**32)
    x_shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(seed).standard_normal(x_shape).astype("float32")
    (ref,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})

    mods = {"stock": mod}
    for strategy in ("all", "contiguity"):
        mods[strategy] = VirtualTensorize(strategy, target=TARGET)(mod)
    results = {k: run_vm(build(m), tvm.cpu(), [x])[0] for k, m in mods.items()}
    census = {k: kernel_census(m, TARGET) for k, m in mods.items()}
    print(f"{name}: data-movement/all kernels " + ", ".join(
        f"{k} {c['data_movement']}/{c['kernels']}" for k, c in census.items()))

    for variant, got in results.items():
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5, err_msg=f"{variant} vs onnxruntime, seed {seed}")
    assert census["all"]["data_movement"] <= census["stock"]["data_movement"]
