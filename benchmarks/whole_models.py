"""Whole models as users run them: ShuffleNetV2 x1.0, EfficientViT-B1 and YOLO11n as ONNX files.

Each builder writes the graph that ``torch.onnx.export`` of the public model (eval mode, batch
norm folded into the convolutions, opset 18) contains, op for op, with weights drawn from a
seed instead of a checkpoint (so no torch, torchvision, timm or ultralytics is needed):

* ``shufflenet_v2_whole``: torchvision ``shufflenet_v2_x1_0`` (stages 4/8/4, widths
  24/116/232/464/1024; ``chunk`` is a ``Split``, ``channel_shuffle`` Reshape -> Transpose ->
  Reshape, the classifier a ``Gemm``). 2,278,604 parameters.
* ``efficientvit_b1``: mit-han-lab ``efficientvit_cls_b1`` (widths 16/32/64/128/256, depths
  1/2/3/3/4, head dim 16, ``ClsHead`` 1536/1600): DSConv / MBConv blocks with HardSwish,
  and in stages 3-4 ``EfficientViTBlock`` = LiteMLA (qkv conv, 5x5 depthwise + grouped 1x1
  aggregation, Concat, Reshape, Slice q/k/v, ReLU, Transpose, Pad, two MatMuls, the
  normalising Div) + MBConv, each with its residual. 9.1M parameters (9,102,024 counted here from the source; published rounded).
* ``yolo11n``: ultralytics ``yolo11n.yaml`` detection model at 640x640 (scale n: depth 0.5,
  width 0.25): Conv (BN folded) + SiLU, C3k2 (with C3k where the yaml asks), SPPF, C2PSA
  (multi-head attention over the P5 map), nearest Resize + Concat in the neck, and the
  ``Detect`` head as exported: per level box / class branches, Reshape + Concat over the
  levels, Split, DFL (Reshape, Transpose, Softmax, 1x1 Conv), the distance-to-box decode with
  constant anchors and strides, Sigmoid, Concat -> ``(B, 84, 8400)``. 2,624,080 parameters
  (2,616,248 after BN folding, ultralytics' "fused" count).

Parameter counts are the published, unfolded ones: the float initializers (``*.weight``,
``*.bias``) plus one per channel of every folded batch norm (a BN has a scale and a shift, its
folded form one bias); the number of folded channels is in the model's metadata
(``vtc.folded_bn_channels``). Weights are He-scaled normals (``numpy.random.RandomState(seed)``)
with damped residual branches, so activations stay O(1) through every model.

``batch`` is an int or a name (``"N"``): a named batch is a ``dim_param`` and every Reshape
target copies it with ``0`` (ONNX's "keep this dim"), so the graph stays valid at any batch.
``size="small"`` keeps every op kind and block type but shrinks widths, depths and
resolution (for CI). Real-size files are tens of MB, so they are not committed: generate them
on demand, deterministically from the seed::

    python -m benchmarks.whole_models --out DIR [--size real|small] [--batch 1 16 N] [names...]

API::

    whole_model(name, size="real", batch=1, seed=0, dtype="float32") -> onnx.ModelProto
    param_count(model) -> int            (the published parameter count)
    model_path(name, out_dir, ...) / write_model(...)   (the on-disk cache)
    WHOLE_WORKLOADS                      (for ``python -m benchmarks.run --suite whole``)

Limits: (1) opset 18, float32 or float16; no pre/post-processing beyond what the exported
graph holds (no NMS for YOLO). (2) EfficientViT's quadratic attention branch (used when a
map has no more tokens than the head dim) is not built: such a configuration is refused.
(3) The graphs are what the exporters write, not byte-identical exports: node names and the
spelling of a few shape constants differ (e.g. a dynamic batch is a ``0`` in a Reshape target,
where the dynamo exporter writes a ``Shape``/``Concat`` chain).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Union

import numpy as np
import onnx
from onnx import helper as oh
from onnx import numpy_helper

from benchmarks.onnx_models import INT64_MAX, _Graph

Batch = Union[int, str]
BN_KEY = "vtc.folded_bn_channels"


# ----------------------------------------------------------------------------------------------
# A graph writer with seeded weights
# ----------------------------------------------------------------------------------------------
class _Net(_Graph):
    """``_Graph`` plus weights as initializers (drawn from a seed) and the torch layers that
    every model here is made of. ``self.B`` is the batch entry of a Reshape target."""

    def __init__(self, name: str, dtype: str, batch: Batch, seed: int):
        super().__init__(name, dtype)
        self.rng = np.random.RandomState(seed)
        self.batch = batch
        self.B = batch if isinstance(batch, int) else 0
        self.bn_channels = 0

    def param(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(array, dtype=self.dtype), name))
        return name

    def const(self, name: str, array: np.ndarray) -> str:
        """A constant that is not a parameter (anchors, strides)."""
        return self.param(f"const.{name}", array)

    def floats(self, values: Sequence[float]) -> str:
        """A float32 1-D initializer that is not a parameter (Resize scales)."""
        name = self._fresh("floats")
        self.inits.append(numpy_helper.from_array(np.array(values, dtype=np.float32), name))
        return name

    def conv2d(self, t, name: str, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1,
               bias: bool = False, bn: bool = False, act: Optional[str] = None, gain: float = 1.0):
        """``nn.Conv2d`` (padding k // 2), optionally followed by a batch norm folded into it (the
        folded form has a bias) and an activation. He-scaled weights; ``gain`` damps a branch."""
        fan_in = cin // groups * k * k
        std = gain * (math.sqrt(2.0) if act else 1.0) / math.sqrt(fan_in)
        w = self.param(f"{name}.weight", self.rng.standard_normal((cout, cin // groups, k, k)) * std)
        inputs = [t, w]
        if bias or bn:
            inputs.append(self.param(f"{name}.bias", 0.05 * self.rng.standard_normal(cout)))
        if bn:
            self.bn_channels += cout
        y = self.op("Conv", inputs, kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4,
                    dilations=[1, 1], group=groups)
        return self.act(y, act)

    def act(self, t, kind: Optional[str]):
        if kind is None:
            return t
        if kind == "relu":
            return self.op("Relu", [t])
        if kind == "silu":  # torch.onnx writes nn.SiLU as x * sigmoid(x)
            return self.silu(t)
        if kind == "hswish":
            return self.op("HardSwish", [t])
        raise ValueError(f"unknown activation {kind!r}")

    def linear(self, t, name: str, cin: int, cout: int, bias: bool = True, gain: float = 1.0):
        """``nn.Linear``: ``Gemm(transB=1)`` with a bias, ``MatMul`` by the transposed weight without."""
        w = self.rng.standard_normal((cout, cin)) * gain / math.sqrt(cin)
        if bias:
            b = self.param(f"{name}.bias", 0.05 * self.rng.standard_normal(cout))
            return self.op("Gemm", [t, self.param(f"{name}.weight", w), b], transB=1)
        return self.op("MatMul", [t, self.param(f"{name}.weight", w.T)])

    def layer_norm(self, t, name: str, c: int, eps: float = 1e-5):
        g = self.param(f"{name}.weight", 1 + 0.1 * self.rng.standard_normal(c))
        b = self.param(f"{name}.bias", 0.05 * self.rng.standard_normal(c))
        return self.op("LayerNormalization", [t, g, b], axis=-1, epsilon=eps)

    def finish_model(self, outputs: Sequence[str]) -> onnx.ModelProto:
        model = self.finish(outputs)
        oh.set_model_props(model, {BN_KEY: str(self.bn_channels)})
        return model


def param_count(model: onnx.ModelProto) -> int:
    """The published parameter count: float ``*.weight`` / ``*.bias`` initializers plus one per
    folded batch-norm channel (see the module docstring)."""
    n = sum(int(np.prod(t.dims)) for t in model.graph.initializer
            if t.name.endswith((".weight", ".bias")))
    props = {p.key: p.value for p in model.metadata_props}
    return n + int(props.get(BN_KEY, 0))


def _start(name: str, dtype: str, batch: Batch, seed: int, input_name: str, chw) -> _Net:
    g = _Net(name, dtype, batch, seed)
    g.input(input_name, (batch, *chw))
    return g


# ----------------------------------------------------------------------------------------------
# ShuffleNetV2 x1.0 (torchvision)
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShuffleNetV2Spec:
    stages_repeats: tuple = (4, 8, 4)
    stages_out_channels: tuple = (24, 116, 232, 464, 1024)
    classes: int = 1000
    size: int = 224

    @classmethod
    def small(cls):
        return cls(stages_repeats=(2, 2, 2), stages_out_channels=(8, 16, 32, 64, 128), classes=10, size=64)


def _down(s: int, k: int = 3, stride: int = 2) -> int:
    """Spatial size after a k x k window with padding k // 2."""
    return (s + 2 * (k // 2) - k) // stride + 1


def shufflenet_v2_onnx(spec: ShuffleNetV2Spec, batch: Batch = 1, seed: int = 0,
                       dtype: str = "float32") -> onnx.ModelProto:
    """torchvision ``ShuffleNetV2`` (``InvertedResidual`` units, channel shuffle by 2)."""
    g = _start("shufflenet_v2_x1_0", dtype, batch, seed, "input", (3, spec.size, spec.size))
    c0 = spec.stages_out_channels[0]
    x = g.conv2d("input", "conv1", 3, c0, 3, stride=2, bn=True, act="relu")
    x = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    s = _down(_down(spec.size))
    inp = c0

    def shuffle(t, c, s):  # channel_shuffle(x, 2): view(B, 2, c/2, h, w).transpose(1, 2).view(B, -1, h, w)
        t = g.transpose(g.reshape(t, (g.B, 2, c // 2, s, s)), (0, 2, 1, 3, 4))
        return g.reshape(t, (g.B, -1, s, s))

    for si, (reps, oup) in enumerate(zip(spec.stages_repeats, spec.stages_out_channels[1:4]), start=2):
        bf = oup // 2
        for i in range(reps):
            name, stride = f"stage{si}.{i}", 2 if i == 0 else 1
            if stride == 1:
                x1, x2 = g.split(x, [bf, bf], axis=1)
            else:
                x1 = g.conv2d(x, f"{name}.branch1.0", inp, inp, 3, stride=2, groups=inp, bn=True)
                x1 = g.conv2d(x1, f"{name}.branch1.2", inp, bf, 1, bn=True, act="relu")
                x2 = x
            cin = inp if stride == 2 else bf
            y = g.conv2d(x2, f"{name}.branch2.0", cin, bf, 1, bn=True, act="relu")
            y = g.conv2d(y, f"{name}.branch2.3", bf, bf, 3, stride=stride, groups=bf, bn=True)
            y = g.conv2d(y, f"{name}.branch2.5", bf, bf, 1, bn=True, act="relu")
            s = _down(s) if stride == 2 else s
            x = shuffle(g.concat([x1, y], axis=1), oup, s)
            inp = oup
    last = spec.stages_out_channels[-1]
    x = g.conv2d(x, "conv5", inp, last, 1, bn=True, act="relu")
    x = g.op("ReduceMean", [x, g.ints([2, 3])], keepdims=0)  # x.mean([2, 3])
    return g.finish_model([g.linear(x, "fc", last, spec.classes)])


# ----------------------------------------------------------------------------------------------
# EfficientViT-B1 (mit-han-lab, classification)
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EfficientViTSpec:
    width_list: tuple = (16, 32, 64, 128, 256)
    depth_list: tuple = (1, 2, 3, 3, 4)
    dim: int = 16
    expand_ratio: int = 4
    head_widths: tuple = (1536, 1600)
    classes: int = 1000
    size: int = 224
    eps: float = 1e-15  # LiteMLA's

    @classmethod
    def small(cls):
        return cls(width_list=(8, 16, 24, 32, 48), depth_list=(1, 2, 2, 1, 1), dim=8, head_widths=(64, 80),
                   classes=10, size=96)


def _lite_mla(g: _Net, x, name: str, c: int, s: int, dim: int, eps: float, damp: float):
    """``LiteMLA(c, c, dim=dim, norm=(None, "bn2d"), scales=(5,))`` with ReLU linear attention."""
    heads = c // dim
    td = heads * dim
    qkv = g.conv2d(x, f"{name}.qkv.conv", c, 3 * td, 1)
    agg = g.conv2d(qkv, f"{name}.aggreg.0.0", 3 * td, 3 * td, 5, groups=3 * td)
    agg = g.conv2d(agg, f"{name}.aggreg.0.1", 3 * td, 3 * td, 1, groups=3 * heads)
    t = g.concat([qkv, agg], axis=1)
    t = g.cast(t, "float32", g.dtype)  # relu_linear_att runs in float32 (qkv.float())
    t = g.reshape(t, (g.B, -1, 3 * dim, s * s))
    q = g.op("Relu", [g.slice(t, 2, 0, dim)])
    k = g.op("Relu", [g.slice(t, 2, dim, 2 * dim)])
    v = g.slice(t, 2, 2 * dim, INT64_MAX)
    kt = g.transpose(k, (0, 1, 3, 2))
    # F.pad(v, (0, 0, 0, 1), value=1): ONNX pads list every axis' begin, then every axis' end
    vp = g.op("Pad", [v, g.ints([0, 0, 0, 0, 0, 0, 1, 0]), g.scalar(1.0, "float32")], mode="constant")
    out = g.op("MatMul", [g.op("MatMul", [vp, kt]), q])
    num, den = g.slice(out, 2, 0, -1), g.slice(out, 2, -1, INT64_MAX)
    out = g.op("Div", [num, g.op("Add", [den, g.scalar(eps, "float32")])])
    out = g.cast(g.reshape(out, (g.B, -1, s, s)), g.dtype, "float32")
    return g.conv2d(out, f"{name}.proj.conv", 2 * td, c, 1, bn=True, gain=damp)


def _mbconv(g: _Net, x, name: str, cin: int, cout: int, stride: int, expand: int, fewer_norm: bool,
            gain: float = 1.0):
    """``MBConv``: 1x1 expand, 3x3 depthwise (both HardSwish), 1x1 project (BN, no activation);
    ``fewer_norm``: the first two have a bias and no BN."""
    mid = round(cin * expand)
    x = g.conv2d(x, f"{name}.inverted_conv.conv", cin, mid, 1, bias=fewer_norm, bn=not fewer_norm, act="hswish")
    x = g.conv2d(x, f"{name}.depth_conv.conv", mid, mid, 3, stride=stride, groups=mid, bias=fewer_norm,
                 bn=not fewer_norm, act="hswish")
    return g.conv2d(x, f"{name}.point_conv.conv", mid, cout, 1, bn=True, gain=gain)


def efficientvit_onnx(spec: EfficientViTSpec, batch: Batch = 1, seed: int = 0,
                      dtype: str = "float32") -> onnx.ModelProto:
    """``efficientvit_cls_b1``: ``EfficientViTBackbone`` + ``ClsHead``."""
    W, D = spec.width_list, spec.depth_list
    damp = 0.5  # residual branches end at half He scale, so ~20 residual adds keep x O(1)
    g = _start("efficientvit_b1", dtype, batch, seed, "input", (3, spec.size, spec.size))
    x = g.conv2d("input", "backbone.input_stem.op_list.0.conv", 3, W[0], 3, stride=2, bn=True, act="hswish")
    s = _down(spec.size)
    for i in range(D[0]):  # DSConv + identity
        name = f"backbone.input_stem.op_list.{i + 1}.main"
        y = g.conv2d(x, f"{name}.depth_conv.conv", W[0], W[0], 3, groups=W[0], bn=True, act="hswish")
        y = g.conv2d(y, f"{name}.point_conv.conv", W[0], W[0], 1, bn=True, gain=damp)
        x = g.op("Add", [y, x])
    cin = W[0]
    for st, (w, d) in enumerate(zip(W[1:3], D[1:3]), start=0):  # MBConv stages
        for i in range(d):
            stride = 2 if i == 0 else 1
            name = f"backbone.stages.{st}.op_list.{i}.main"
            y = _mbconv(g, x, name, cin, w, stride, spec.expand_ratio, False, gain=1.0 if stride == 2 else damp)
            x = y if stride == 2 else g.op("Add", [y, x])
            s = _down(s) if stride == 2 else s
            cin = w
    for st, (w, d) in enumerate(zip(W[3:], D[3:]), start=2):  # downsample MBConv + EfficientViT blocks
        x = _mbconv(g, x, f"backbone.stages.{st}.op_list.0.main", cin, w, 2, spec.expand_ratio, True)
        s, cin = _down(s), w
        if s * s <= spec.dim:
            raise ValueError(f"a {s}x{s} map needs LiteMLA's quadratic attention, which is not built")
        for i in range(d):
            name = f"backbone.stages.{st}.op_list.{i + 1}"
            y = _lite_mla(g, x, f"{name}.context_module.main", w, s, spec.dim, spec.eps, damp)
            x = g.op("Add", [y, x])
            y = _mbconv(g, x, f"{name}.local_module.main", w, w, 1, spec.expand_ratio, True, gain=damp)
            x = g.op("Add", [y, x])
    h0, h1 = spec.head_widths
    x = g.conv2d(x, "head.op_list.0.conv", cin, h0, 1, bn=True, act="hswish")
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1)  # AdaptiveAvgPool2d(1), LinearLayer's flatten
    x = g.act(g.layer_norm(g.linear(x, "head.op_list.2.linear", h0, h1, bias=False), "head.op_list.2.norm", h1),
              "hswish")
    return g.finish_model([g.linear(x, "head.op_list.3.linear", h1, spec.classes)])


# ----------------------------------------------------------------------------------------------
# YOLO11n (ultralytics, detection)
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class YOLO11Spec:
    depth: float = 0.50  # scale n of yolo11.yaml
    width: float = 0.25
    max_channels: int = 1024
    classes: int = 80
    size: int = 640
    reg_max: int = 16

    @classmethod
    def small(cls):
        return cls(width=0.125, classes=8, size=128)

    def ch(self, c: int) -> int:  # parse_model: make_divisible(min(c2, max_channels) * width, 8)
        return int(math.ceil(min(c, self.max_channels) * self.width / 8) * 8)

    def n(self, n: int) -> int:
        return max(round(n * self.depth), 1)


class _Yolo:
    """The ultralytics blocks (``nn/modules/conv.py``, ``block.py``, ``head.py``) on a ``_Net``."""

    def __init__(self, g: _Net):
        self.g = g

    def conv(self, x, name, c1, c2, k=1, s=1, groups=1, act=True):  # Conv: conv (no bias) + BN + SiLU
        return self.g.conv2d(x, f"{name}.conv", c1, c2, k, stride=s, groups=groups, bn=True,
                             act="silu" if act else None)

    def bottleneck(self, x, name, c1, c2, shortcut=True, k=(3, 3), e=0.5):
        c_ = int(c2 * e)
        y = self.conv(self.conv(x, f"{name}.cv1", c1, c_, k[0]), f"{name}.cv2", c_, c2, k[1])
        return self.g.op("Add", [x, y]) if shortcut and c1 == c2 else y

    def c3k(self, x, name, c1, c2, n=2, shortcut=True, e=0.5, k=3):
        c_ = int(c2 * e)
        a = self.conv(x, f"{name}.cv1", c1, c_)
        for i in range(n):
            a = self.bottleneck(a, f"{name}.m.{i}", c_, c_, shortcut, k=(k, k), e=1.0)
        b = self.conv(x, f"{name}.cv2", c1, c_)
        return self.conv(self.g.concat([a, b], axis=1), f"{name}.cv3", 2 * c_, c2)

    def c3k2(self, x, name, c1, c2, n=1, c3k=False, e=0.5, shortcut=True):
        c = int(c2 * e)
        y = list(self.g.split(self.conv(x, f"{name}.cv1", c1, 2 * c), [c, c], axis=1))  # .chunk(2, 1)
        for i in range(n):
            m = f"{name}.m.{i}"
            y.append(self.c3k(y[-1], m, c, c, 2, shortcut) if c3k else self.bottleneck(y[-1], m, c, c, shortcut))
        return self.conv(self.g.concat(y, axis=1), f"{name}.cv2", (2 + n) * c, c2)

    def sppf(self, x, name, c1, c2, k=5):
        c_ = c1 // 2
        y = [self.conv(x, f"{name}.cv1", c1, c_)]
        for _ in range(3):
            y.append(self.g.op("MaxPool", [y[-1]], kernel_shape=[k, k], strides=[1, 1], pads=[k // 2] * 4))
        return self.conv(self.g.concat(y, axis=1), f"{name}.cv2", 4 * c_, c2)

    def attention(self, x, name, dim, s, num_heads, attn_ratio=0.5):
        g = self.g
        head_dim = dim // num_heads
        key_dim = int(head_dim * attn_ratio)
        qkv = self.conv(x, f"{name}.qkv", dim, dim + 2 * key_dim * num_heads, act=False)
        t = g.reshape(qkv, (g.B, num_heads, 2 * key_dim + head_dim, s * s))
        q, k, v = g.split(t, [key_dim, key_dim, head_dim], axis=2)
        attn = g.op("Mul", [g.op("MatMul", [g.transpose(q, (0, 1, 3, 2)), k]), g.scalar(key_dim ** -0.5)])
        attn = g.op("Softmax", [attn], axis=-1)
        out = g.reshape(g.op("MatMul", [v, g.transpose(attn, (0, 1, 3, 2))]), (g.B, dim, s, s))
        pe = self.conv(g.reshape(v, (g.B, dim, s, s)), f"{name}.pe", dim, dim, 3, groups=dim, act=False)
        return self.conv(g.op("Add", [out, pe]), f"{name}.proj", dim, dim, act=False)

    def c2psa(self, x, name, c1, s, n=1, e=0.5):
        g = self.g
        c = int(c1 * e)
        a, b = g.split(self.conv(x, f"{name}.cv1", c1, 2 * c), [c, c], axis=1)
        for i in range(n):  # PSABlock(c, attn_ratio=0.5, num_heads=c // 64)
            m = f"{name}.m.{i}"
            b = g.op("Add", [b, self.attention(b, f"{m}.attn", c, s, num_heads=c // 64)])
            f = self.conv(self.conv(b, f"{m}.ffn.0", c, 2 * c), f"{m}.ffn.1", 2 * c, c, act=False)
            b = g.op("Add", [b, f])
        return self.conv(g.concat([a, b], axis=1), f"{name}.cv2", 2 * c, c1)

    def upsample(self, x):  # nn.Upsample(scale_factor=2, mode="nearest")
        g = self.g
        scales = g.floats([1.0, 1.0, 2.0, 2.0])
        return g.op("Resize", [x, "", scales], mode="nearest", coordinate_transformation_mode="asymmetric",
                    nearest_mode="floor")

    def detect(self, feats, name, chs, sizes, spec: YOLO11Spec, strides=(8, 16, 32)):
        """``Detect`` (not legacy: DWConv class branch) in export mode: decoded boxes + class scores."""
        g = self.g
        nc, rm = spec.classes, spec.reg_max
        no = nc + 4 * rm
        c2, c3 = max(16, chs[0] // 4, 4 * rm), max(chs[0], min(nc, 100))
        levels = []
        for i, (x, c, s) in enumerate(zip(feats, chs, sizes)):
            box = self.conv(self.conv(x, f"{name}.cv2.{i}.0", c, c2, 3), f"{name}.cv2.{i}.1", c2, c2, 3)
            box = g.conv2d(box, f"{name}.cv2.{i}.2", c2, 4 * rm, 1, bias=True)
            cls = self.conv(self.conv(x, f"{name}.cv3.{i}.0.0", c, c, 3, groups=c), f"{name}.cv3.{i}.0.1", c, c3)
            cls = self.conv(self.conv(cls, f"{name}.cv3.{i}.1.0", c3, c3, 3, groups=c3), f"{name}.cv3.{i}.1.1", c3, c3)
            cls = g.conv2d(cls, f"{name}.cv3.{i}.2", c3, nc, 1, bias=True)
            levels.append(g.reshape(g.concat([box, cls], axis=1), (g.B, no, -1)))  # xi.view(B, no, -1)
        x_cat = g.concat(levels, axis=2)
        a = sum(s * s for s in sizes)
        box, cls = g.split(x_cat, [4 * rm, nc], axis=1)
        # DFL: conv(x.view(b, 4, c1, a).transpose(2, 1).softmax(1)).view(b, 4, a), conv weight = arange(c1)
        t = g.op("Softmax", [g.transpose(g.reshape(box, (g.B, 4, rm, a)), (0, 2, 1, 3))], axis=1)
        w = g.param(f"{name}.dfl.conv.weight", np.arange(rm).reshape(1, rm, 1, 1))
        dist = g.reshape(g.op("Conv", [t, w], kernel_shape=[1, 1], strides=[1, 1], pads=[0] * 4, dilations=[1, 1],
                              group=1), (g.B, 4, a))
        anchors, stride_t = _anchors(sizes, strides)
        anc = g.const("anchors", anchors[None])  # self.anchors.unsqueeze(0): (1, 2, a)
        lt, rb = g.split(dist, [2, 2], axis=1)  # dist2bbox(xywh=True): distance.chunk(2, 1)
        x1y1, x2y2 = g.op("Sub", [anc, lt]), g.op("Add", [anc, rb])
        c_xy = g.op("Div", [g.op("Add", [x1y1, x2y2]), g.scalar(2.0)])
        wh = g.op("Sub", [x2y2, x1y1])
        dbox = g.op("Mul", [g.concat([c_xy, wh], axis=1), g.const("strides", stride_t)])
        return g.concat([dbox, g.op("Sigmoid", [cls])], axis=1)


def _anchors(sizes, strides, offset=0.5):
    """ultralytics ``make_anchors``, transposed as ``Detect`` keeps them: (2, a) points, (1, a) strides."""
    points, stride_t = [], []
    for s, st in zip(sizes, strides):
        sy, sx = np.meshgrid(np.arange(s) + offset, np.arange(s) + offset, indexing="ij")
        points.append(np.stack([sx, sy], -1).reshape(-1, 2))
        stride_t.append(np.full((s * s, 1), st))
    return np.concatenate(points).T, np.concatenate(stride_t).T


def yolo11_onnx(spec: YOLO11Spec, batch: Batch = 1, seed: int = 0, dtype: str = "float32") -> onnx.ModelProto:
    """``yolo11.yaml`` (backbone + head) at scale n, as ``YOLO("yolo11n.pt").export(format="onnx")``."""
    g = _start("yolo11n", dtype, batch, seed, "images", (3, spec.size, spec.size))
    Y, ch, n = _Yolo(g), spec.ch, spec.n(2)
    s3, s4, s5 = (spec.size // 2 ** k for k in (3, 4, 5))  # P3, P4, P5 map sizes
    l0 = Y.conv("images", "model.0", 3, ch(64), 3, 2)
    l1 = Y.conv(l0, "model.1", ch(64), ch(128), 3, 2)
    l2 = Y.c3k2(l1, "model.2", ch(128), ch(256), n, False, 0.25)
    l3 = Y.conv(l2, "model.3", ch(256), ch(256), 3, 2)
    l4 = Y.c3k2(l3, "model.4", ch(256), ch(512), n, False, 0.25)
    l5 = Y.conv(l4, "model.5", ch(512), ch(512), 3, 2)
    l6 = Y.c3k2(l5, "model.6", ch(512), ch(512), n, True)
    l7 = Y.conv(l6, "model.7", ch(512), ch(1024), 3, 2)
    l8 = Y.c3k2(l7, "model.8", ch(1024), ch(1024), n, True)
    l9 = Y.sppf(l8, "model.9", ch(1024), ch(1024), 5)
    l10 = Y.c2psa(l9, "model.10", ch(1024), s5, n)
    l12 = g.concat([Y.upsample(l10), l6], axis=1)
    l13 = Y.c3k2(l12, "model.13", ch(1024) + ch(512), ch(512), n, False)
    l15 = g.concat([Y.upsample(l13), l4], axis=1)
    l16 = Y.c3k2(l15, "model.16", ch(512) + ch(512), ch(256), n, False)
    l17 = Y.conv(l16, "model.17", ch(256), ch(256), 3, 2)
    l19 = Y.c3k2(g.concat([l17, l13], axis=1), "model.19", ch(256) + ch(512), ch(512), n, False)
    l20 = Y.conv(l19, "model.20", ch(512), ch(512), 3, 2)
    l22 = Y.c3k2(g.concat([l20, l10], axis=1), "model.22", ch(512) + ch(1024), ch(1024), n, True)
    out = Y.detect([l16, l19, l22], "model.23", (ch(256), ch(512), ch(1024)), (s3, s4, s5), spec)
    return g.finish_model([out])


# ----------------------------------------------------------------------------------------------
# Registry, cache, benchmark hook
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WholeModel:
    name: str
    spec_cls: type
    builder: Callable  # (spec, batch, seed, dtype) -> ModelProto
    published_params: int  # the real model's count (see the module docstring)
    description: str

    def spec(self, size: str = "real"):
        if size not in ("real", "small"):
            raise ValueError(f"size must be 'real' or 'small', not {size!r}")
        return self.spec_cls() if size == "real" else self.spec_cls.small()


WHOLE_MODELS: Dict[str, WholeModel] = {m.name: m for m in [
    WholeModel("shufflenet_v2_whole", ShuffleNetV2Spec, shufflenet_v2_onnx, 2_278_604,
               "torchvision ShuffleNetV2 x1.0, whole network, 224x224 (ONNX, BN folded)"),
    WholeModel("efficientvit_b1", EfficientViTSpec, efficientvit_onnx, 9_102_024,  # published: 9.1M
               "mit-han-lab EfficientViT-B1 classification, 224x224 (ONNX, BN folded)"),
    WholeModel("yolo11n", YOLO11Spec, yolo11_onnx, 2_624_080,
               "ultralytics YOLO11n detection with Detect/DFL decode, 640x640 (ONNX, BN folded)"),
]}


def whole_model(name: str, size: str = "real", batch: Batch = 1, seed: int = 0,
                dtype: str = "float32") -> onnx.ModelProto:
    """The ONNX model ``name`` (checked, shape-inferred), weights drawn from ``seed``."""
    if name not in WHOLE_MODELS:
        raise KeyError(f"no whole model {name!r} (have: {', '.join(WHOLE_MODELS)})")
    m = WHOLE_MODELS[name]
    return m.builder(m.spec(size), batch, seed, dtype)


def model_path(name: str, out_dir: str, size: str = "real", batch: Batch = 1, seed: int = 0,
               dtype: str = "float32") -> str:
    return os.path.join(out_dir, f"{name}_{size}_b{batch}_s{seed}_{dtype}.onnx")


def write_model(name: str, out_dir: str, size: str = "real", batch: Batch = 1, seed: int = 0,
                dtype: str = "float32", overwrite: bool = False) -> str:
    """Write (or find, in the cache ``out_dir``) one model file; deterministic in its arguments."""
    path = model_path(name, out_dir, size, batch, seed, dtype)
    if overwrite or not os.path.isfile(path):
        os.makedirs(out_dir, exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        onnx.save(whole_model(name, size, batch, seed, dtype), tmp, save_as_external_data=False)
        os.replace(tmp, path)  # a concurrent reader never sees half a file
    return path


def random_inputs(model: onnx.ModelProto, seed: int = 0, dims: Optional[Dict[str, int]] = None,
                  dtype: Optional[str] = None) -> Dict[str, np.ndarray]:
    """Standard-normal arrays for every graph input; named dims are sized by ``dims``."""
    rng = np.random.RandomState(seed)
    out = {}
    for i in model.graph.input:
        shape = [d.dim_value if d.HasField("dim_value") else (dims or {})[d.dim_param]
                 for d in i.type.tensor_type.shape.dim]
        dt = dtype or onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
        out[i.name] = rng.standard_normal(shape).astype(dt)
    return out


@dataclass(frozen=True)
class WholeConfig:
    """What ``benchmarks.run`` records of a case (``vars(cfg)``)."""
    model: str
    size: str
    batch: int
    dtype: str
    seed: int = 0


@dataclass
class WholeWorkload:
    """A whole model in the shape ``benchmarks.run.run_case`` expects of a ``Workload``: the module
    is ``from_onnx`` of the generated file (weights as constants), the only input the image batch.
    Its PyTorch peer is the same ONNX graph run with torch ops (:meth:`torch_module`,
    :mod:`benchmarks.onnx_torch`): the kernels eager PyTorch runs for the exported module."""
    name: str
    description: str
    torch_forward: Optional[Callable] = None  # no forward of (weights, cfg, *acts): torch_module instead

    def torch_module(self, cfg: WholeConfig):
        from .onnx_torch import torch_module

        return torch_module(whole_model(cfg.model, cfg.size, cfg.batch, cfg.seed, cfg.dtype))

    def config(self, size="small", batch=None, dtype="float32") -> WholeConfig:
        return WholeConfig(self.name, size, 1 if batch is None else batch, dtype)

    def build(self, cfg: WholeConfig):
        from vtc_tvm.onnx_import import load_onnx

        return load_onnx(whole_model(cfg.model, cfg.size, cfg.batch, cfg.seed, cfg.dtype))

    def inputs(self, mod, cfg: WholeConfig, seed=0) -> List[np.ndarray]:
        rng = np.random.RandomState(seed)
        return [rng.standard_normal([int(d) for d in p.ty.shape]).astype(cfg.dtype) for p in mod["main"].params]


WHOLE_WORKLOADS: Dict[str, WholeWorkload] = {n: WholeWorkload(n, m.description) for n, m in WHOLE_MODELS.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="cache directory for the .onnx files")
    ap.add_argument("--size", choices=["real", "small"], default="real")
    ap.add_argument("--batch", nargs="+", default=["1", "16", "N"], help="ints, or a name for a symbolic batch")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("names", nargs="*", help=f"models (default: all of {', '.join(WHOLE_MODELS)})")
    args = ap.parse_args(argv)
    for name in args.names or WHOLE_MODELS:
        for b in args.batch:
            batch = int(b) if b.isdigit() else b
            path = write_model(name, args.out, args.size, batch, args.seed, args.dtype, args.overwrite)
            print(f"{path}  {os.path.getsize(path) / 2 ** 20:.1f} MiB  "
                  f"{param_count(onnx.load(path, load_external_data=False)):,} parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
