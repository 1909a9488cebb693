"""An ONNX graph run with torch operators: the whole models' PyTorch peer.

The whole models (:mod:`benchmarks.whole_models`) are ONNX files written from a seed, not torch
modules, and the GPU machine has no ONNX-to-torch converter. :func:`torch_module` interprets the
graph node by node with the torch operator each ONNX op is exported from (``Conv`` is
``F.conv2d``, ``HardSwish`` ``F.hardswish``, ``Resize`` ``F.interpolate``...), weights as
buffers, the constant int64 inputs (shapes, split sizes, axes, pads) read once. Eager, the loop
runs the kernels eager PyTorch would run for the original module; ``torch.compile`` traces
through the loop (the node list is fixed) to one graph. Float buffers follow the input's dtype
on the first call (``float64`` for the harness's float64 reference).

Limits: the ops the three whole models use (``OPS``), default attributes elsewhere; constant
shapes; a node whose op is missing raises ``NotImplementedError`` when the module is built.
"""

from __future__ import annotations

from typing import Callable, Dict

import numpy as np
import onnx
from onnx import numpy_helper


def _attrs(node) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _values(array):
    """An initializer as a tuple of Python numbers (dynamo traces those, not numpy arrays)."""
    return None if array is None else tuple(np.asarray(array).reshape(-1).tolist())


def _pairs(pads):
    """ONNX ``pads`` [b1, b2, ..., e1, e2, ...] of the spatial dims: symmetric ones as a tuple."""
    half = len(pads) // 2
    if list(pads[:half]) != list(pads[half:]):
        raise NotImplementedError(f"asymmetric pads {pads}")
    return tuple(int(p) for p in pads[:half])


def _ops() -> Dict[str, Callable]:
    """op type -> ``f(inputs, consts, attrs)``; ``inputs`` are tensors (None for an empty name or
    an int64 initializer), ``consts`` the same inputs as flat tuples where they are initializers."""
    import torch
    import torch.nn.functional as F

    def conv(x, c, a):
        return F.conv2d(x[0], x[1], x[2] if len(x) > 2 else None, stride=tuple(a.get("strides", (1, 1))),
                        padding=_pairs(a.get("pads", (0, 0, 0, 0))), dilation=tuple(a.get("dilations", (1, 1))),
                        groups=a.get("group", 1))

    def reshape(x, c, a):
        shape = [int(d) for d in c[1]]
        shape = [x[0].shape[i] if d == 0 else d for i, d in enumerate(shape)]
        return x[0].reshape(shape)

    def split(x, c, a):
        return torch.split(x[0], [int(s) for s in c[1]], dim=a.get("axis", 0))

    def slice_(x, c, a):
        starts, ends = c[1], c[2]
        axes = c[3] if len(c) > 3 and c[3] is not None else range(len(starts))
        steps = c[4] if len(c) > 4 and c[4] is not None else [1] * len(starts)
        index = [slice(None)] * x[0].dim()
        for ax, s, e, st in zip(axes, starts, ends, steps):
            index[ax] = slice(s, None if e >= np.iinfo(np.int64).max // 2 else e, st)
        return x[0][tuple(index)]

    def pad(x, c, a):
        pads = [int(p) for p in c[1]]
        n = len(pads) // 2
        flat = []  # torch: last dim first, (begin, end) each
        for d in reversed(range(n)):
            flat += [pads[d], pads[d + n]]
        value = float(c[2][0]) if len(c) > 2 and c[2] is not None else 0.0
        mode = a.get("mode", "constant")
        return F.pad(x[0], flat, mode=mode.decode() if isinstance(mode, bytes) else mode, value=value)

    def reduce_mean(x, c, a):
        return x[0].mean(dim=[int(d) for d in c[1]], keepdim=bool(a.get("keepdims", 1)))

    def gemm(x, c, a):
        b = x[1].t() if a.get("transB", 0) else x[1]
        a_ = x[0].t() if a.get("transA", 0) else x[0]
        y = a_ @ b * a.get("alpha", 1.0)
        return y + x[2] * a.get("beta", 1.0) if len(x) > 2 and x[2] is not None else y

    def resize(x, c, a):
        scales = [float(s) for s in c[2]]
        if a.get("mode", b"nearest") not in (b"nearest", "nearest") or scales[:2] != [1.0, 1.0]:
            raise NotImplementedError("Resize: nearest over the spatial dims only")
        return F.interpolate(x[0], scale_factor=tuple(scales[2:]), mode="nearest")

    def max_pool(x, c, a):
        return F.max_pool2d(x[0], tuple(a["kernel_shape"]), tuple(a.get("strides", a["kernel_shape"])),
                            _pairs(a.get("pads", (0, 0, 0, 0))))

    def layer_norm(x, c, a):
        axis = a.get("axis", -1) % x[0].dim()
        return F.layer_norm(x[0], x[0].shape[axis:], x[1], x[2] if len(x) > 2 else None, a.get("epsilon", 1e-5))

    return {
        "Conv": conv, "Reshape": reshape, "Split": split, "Slice": slice_, "Pad": pad, "Gemm": gemm,
        "Resize": resize, "MaxPool": max_pool, "LayerNormalization": layer_norm, "ReduceMean": reduce_mean,
        "Relu": lambda x, c, a: F.relu(x[0]),
        "Sigmoid": lambda x, c, a: torch.sigmoid(x[0]),
        "HardSwish": lambda x, c, a: F.hardswish(x[0]),
        "Add": lambda x, c, a: x[0] + x[1],
        "Sub": lambda x, c, a: x[0] - x[1],
        "Mul": lambda x, c, a: x[0] * x[1],
        "Div": lambda x, c, a: x[0] / x[1],
        "MatMul": lambda x, c, a: torch.matmul(x[0], x[1]),
        "Concat": lambda x, c, a: torch.cat(x, dim=a["axis"]),
        "Transpose": lambda x, c, a: x[0].permute(*a["perm"]),
        "Softmax": lambda x, c, a: torch.softmax(x[0], dim=a.get("axis", -1)),
        "GlobalAveragePool": lambda x, c, a: x[0].mean(dim=(2, 3), keepdim=True),
        "Flatten": lambda x, c, a: x[0].flatten(a.get("axis", 1)),
    }


# Inputs read as constants (shapes, sizes, axes, pads, scales): never tensors, so never buffers
# (a float32 ``Resize`` scale kept as a buffer would be cast to fp16 on every call, a kernel more)
CONST_INPUTS = {"Reshape": {1}, "Split": {1}, "Slice": {1, 2, 3, 4}, "Pad": {1, 2, 3}, "ReduceMean": {1},
                "Resize": {1, 2, 3}}


def torch_module(model: onnx.ModelProto):
    """An ``nn.Module`` computing ``model``: ``forward(*inputs)`` returns the graph's outputs (a
    tensor, or a tuple for several)."""
    import torch

    ops = _ops()
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    missing = sorted({n.op_type for n in model.graph.node} - set(ops))
    if missing:
        raise NotImplementedError(f"ONNX ops without a torch spelling here: {missing}")

    tensors = {i for n in model.graph.node for k, i in enumerate(n.input) if k not in CONST_INPUTS.get(n.op_type, ())}

    class OnnxModule(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.slots: Dict[str, str] = {}  # initializer name -> buffer attribute
            for i, (name, array) in enumerate(consts.items()):
                if array.dtype.kind == "f" and name in tensors:
                    self.register_buffer(f"w{i}", torch.from_numpy(np.array(array)))  # a writable copy
                    self.slots[name] = f"w{i}"
            # the constant inputs' values (weights stay buffers: no tuple of millions of floats)
            self.nodes = [(ops[n.op_type], list(n.input), list(n.output), _attrs(n),
                           [_values(consts.get(i)) if k in CONST_INPUTS.get(n.op_type, ()) else None
                            for k, i in enumerate(n.input)]) for n in model.graph.node]
            self.inputs = [i.name for i in model.graph.input if i.name not in consts]
            self.outputs = [o.name for o in model.graph.output]

        def forward(self, *xs):
            env = dict(zip(self.inputs, xs))
            dtype = xs[0].dtype
            for name, slot in self.slots.items():
                w = getattr(self, slot)
                env[name] = w if w.dtype == dtype else w.to(dtype)
            for fn, ins, outs, attrs, cs in self.nodes:
                y = fn([env.get(i) for i in ins], cs, attrs)  # None: empty, or an int64 constant (in cs)
                if len(outs) == 1:
                    env[outs[0]] = y
                else:
                    env.update(zip(outs, y))
            ys = tuple(env[o] for o in self.outputs)
            return ys[0] if len(ys) == 1 else ys

    return OnnxModule()
