"""The paper workloads as ONNX models, imported through ``tvm.relax.frontend.onnx.from_onnx``.

Each builder here mirrors a Relax builder of :mod:`benchmarks.workloads` op for op, spelled the
way the PyTorch dynamo exporter (opset 18) writes the matching torch twin: ``view`` is a
``Reshape`` with a constant int64 shape, ``transpose`` a ``Transpose``, ``chunk`` a ``Split``
with a split-sizes input, ``t[..., a:]`` a ``Slice`` ending at INT64_MAX, ``t[:, :, None].expand``
an ``Unsqueeze`` + ``Expand``, SiLU ``Sigmoid`` + ``Mul``, RMSNorm
``Pow/ReduceMean/Add/Sqrt/Reciprocal/Mul/Mul``, GeLU-tanh its opset-18 decomposition.

Float weights are graph *inputs* (not initializers), in the same order and with the same names
as the Relax builder's ``main`` parameters, so the files are tiny and
``WORKLOADS[name].inputs(mod, cfg, seed)`` feeds the Relax module, the imported module and
onnxruntime alike. Integer shape/index constants (and float scalars such as ``eps``) are
initializers.

API::

    onnx_model(name, cfg)   -> onnx.ModelProto  (checked, shape-inferred)
    onnx_module(name, cfg)  -> tvm.IRModule     (imported with vtc_tvm.onnx_import.load_onnx)
    write_small(out_dir)    -> [paths]          (``python -m benchmarks.onnx_models [--out DIR]``)

A later ``benchmarks/run.py --source onnx`` only has to replace ``wl.build(cfg)`` by
``onnx_module(wl.name, cfg)``: the imported ``main`` takes the same parameters in the same order
(checked by :func:`onnx_module`), so inputs, the census and the timing code stay as they are.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import onnx
import tvm
from onnx import helper as oh
from onnx import numpy_helper

from benchmarks import workloads as W
from vtc_tvm.models import LlamaConfig, ShuffleNetConfig

OPSET = 18
INT64_MAX = 2**63 - 1  # what dynamo writes for an open-ended slice (t[..., a:])
ONNX_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "onnx")


# ----------------------------------------------------------------------------------------------
# A tiny graph writer
# ----------------------------------------------------------------------------------------------
class _Graph:
    """Collects nodes, inputs and initializers; node outputs are named ``<op>_<k>`` like dynamo's."""

    def __init__(self, name: str, dtype: str):
        self.name, self.dtype = name, dtype
        self.elem = oh.np_dtype_to_tensor_dtype(np.dtype(dtype))
        self.nodes: List[onnx.NodeProto] = []
        self.inputs: List[onnx.ValueInfoProto] = []
        self.inits: List[onnx.TensorProto] = []
        self._counts: Dict[str, int] = {}
        self._consts: Dict[tuple, str] = {}
        self.shape_of: Dict[str, tuple] = {}  # input name -> static shape

    def input(self, name: str, shape: Sequence) -> str:
        """A graph input; a ``str`` dim is a named symbolic dim (``dim_param``)."""
        dims = [s if isinstance(s, str) else int(s) for s in shape]
        self.inputs.append(oh.make_tensor_value_info(name, self.elem, dims))
        return name

    def _fresh(self, base: str) -> str:
        k = self._counts.get(base, 0)
        self._counts[base] = k + 1
        return f"{base}_{k}"

    def ints(self, values: Sequence[int]) -> str:
        """An int64 1-D initializer (a shape, axes, split sizes, ...), shared by equal values."""
        key = ("i64", tuple(int(v) for v in values))
        if key not in self._consts:
            name = self._fresh("val")
            self.inits.append(numpy_helper.from_array(np.array(key[1], dtype=np.int64), name))
            self._consts[key] = name
        return self._consts[key]

    def scalar(self, value: float, dtype: Optional[str] = None) -> str:
        """A 0-d float initializer (``eps``, a scale) in the graph's dtype unless told otherwise."""
        dtype = dtype or self.dtype
        key = (dtype, float(value))
        if key not in self._consts:
            name = self._fresh("scalar")
            self.inits.append(numpy_helper.from_array(np.array(value, dtype=dtype), name))
            self._consts[key] = name
        return self._consts[key]

    def constant(self, array: np.ndarray) -> str:
        """An initializer holding ``array`` (a model's registered buffer: an index table, a mask)."""
        name = self._fresh("buffer")
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(self, op_type: str, inputs: Sequence[str], n_out: int = 1, **attrs):
        outs = [self._fresh(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(oh.make_node(op_type, list(inputs), outs, name=f"node_{outs[0]}", **attrs))
        return outs[0] if n_out == 1 else outs

    # -- the torch-level spellings ------------------------------------------------------------
    def reshape(self, t, shape):
        return self.op("Reshape", [t, self.ints(shape)])

    def transpose(self, t, perm):
        return self.op("Transpose", [t], perm=list(perm))

    def unsqueeze(self, t, axis):
        return self.op("Unsqueeze", [t, self.ints([axis])])

    def slice(self, t, axis, start, end):
        return self.op("Slice", [t, self.ints([start]), self.ints([end]), self.ints([axis]), self.ints([1])])

    def split(self, t, sizes, axis):
        return self.op("Split", [t, self.ints(sizes)], n_out=len(sizes), axis=axis)

    def concat(self, ts, axis):
        return self.op("Concat", list(ts), axis=axis)

    def cast(self, t, to: str, frm: str):
        """``t.to(to)`` for a ``frm`` tensor; dynamo drops the casts that change nothing."""
        if to == frm:
            return t
        return self.op("Cast", [t], to=oh.np_dtype_to_tensor_dtype(np.dtype(to)))

    def silu(self, t):
        return self.op("Mul", [t, self.op("Sigmoid", [t])])

    def rms_norm(self, t, g, eps):
        """``_rms``: t.float() * rsqrt(t.float().pow(2).mean(-1, keepdim=True) + eps) * g."""
        tf = self.cast(t, "float32", self.dtype)
        var = self.op("ReduceMean", [self.op("Pow", [tf, self.scalar(2.0, "float32")]), self.ints([-1])],
                      keepdims=1)
        inv = self.op("Reciprocal", [self.op("Sqrt", [self.op("Add", [var, self.scalar(eps, "float32")])])])
        y = self.op("Mul", [self.op("Mul", [tf, inv]), self.cast(g, "float32", self.dtype)])
        return self.cast(y, self.dtype, "float32")

    def conv(self, t, w, b=None, stride=1, pad=0, groups=1):
        """``F.conv2d(t, w, stride, pad, groups) + b`` (the bias as a separate broadcast Add)."""
        kh, kw = self.shape_of[w][2:]
        y = self.op("Conv", [t, w], kernel_shape=[kh, kw], strides=[stride, stride], pads=[pad] * 4,
                    dilations=[1, 1], group=groups)
        return y if b is None else self.op("Add", [y, b])

    def finish(self, outputs: Sequence[str]) -> onnx.ModelProto:
        graph = oh.make_graph(self.nodes, self.name, self.inputs,
                              [oh.make_value_info(o, onnx.TypeProto()) for o in outputs], self.inits)
        model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", OPSET)],
                              producer_name="vtc-tvm benchmarks.onnx_models")
        model.ir_version = 8  # opset 18 needs IR >= 8; onnxruntime reads up to its own max
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)  # fills the output types
        del model.graph.value_info[:]  # intermediate shapes: a third of the file, re-inferred on load
        onnx.checker.check_model(model, full_check=True)
        return model


def _start(name: str, specs, dtype: str) -> _Graph:
    g = _Graph(name, dtype)
    for n, s in specs:
        g.input(n, s)
        g.shape_of[n] = tuple(int(d) for d in s)
    return g


# ----------------------------------------------------------------------------------------------
# Decoder layers (Llama-3, Gemma-2)
# ----------------------------------------------------------------------------------------------
def _llama_specs(cfg: LlamaConfig):
    B, S, T, D = cfg.batch, cfg.seq, cfg.ctx + cfg.seq, cfg.head_dim
    H, KV, hid, ffn = cfg.heads, cfg.kv_heads, cfg.hidden, cfg.intermediate
    specs = [("x", (B, S, hid)), ("cos", (B, S, D)), ("sin", (B, S, D)), ("past_k", (B, KV, cfg.ctx, D)),
             ("past_v", (B, KV, cfg.ctx, D))]
    if S > 1:
        specs.append(("mask", (B, 1, S, T)))
    specs += [("input_norm", (hid,)), ("w_q", (hid, H * D)), ("w_k", (hid, KV * D)), ("w_v", (hid, KV * D)),
              ("w_o", (H * D, hid)), ("post_norm", (hid,)), ("w_gate", (hid, ffn)), ("w_up", (hid, ffn)),
              ("w_down", (ffn, hid))]
    return specs


def _attention(g: _Graph, cfg, h, cos, sin, past_k, past_v, w_q, w_k, w_v):
    """q/k/v projections, RoPE, KV-cache concat and the GQA repeat shared by Llama and Gemma.
    Returns (q, new_k, new_v, repeat_kv)."""
    B, S, T, D = cfg.batch, cfg.seq, cfg.ctx + cfg.seq, cfg.head_dim
    H, KV = cfg.heads, cfg.kv_heads
    n_rep = H // KV

    def heads(t, n):  # t.view(B, S, n, D).transpose(1, 2)
        return g.transpose(g.reshape(t, (B, S, n, D)), (0, 2, 1, 3))

    def rope(t, c, s):  # t * cos + cat([-t[..., D/2:], t[..., :D/2]], -1) * sin
        lo = g.slice(t, 3, 0, D // 2)
        hi = g.slice(t, 3, D // 2, INT64_MAX)
        rot = g.concat([g.op("Neg", [hi]), lo], axis=-1)
        return g.op("Add", [g.op("Mul", [t, c]), g.op("Mul", [rot, s])])

    def repeat_kv(t):  # t[:, :, None].expand(B, KV, n_rep, T, D).reshape(B, H, T, D)
        if n_rep == 1:
            return t
        t = g.op("Expand", [g.unsqueeze(t, 2), g.ints((B, KV, n_rep, T, D))])
        return g.reshape(t, (B, H, T, D))

    q, k, v = (heads(g.op("MatMul", [h, w]), n) for w, n in ((w_q, H), (w_k, KV), (w_v, KV)))
    c, s = g.unsqueeze(cos, 1), g.unsqueeze(sin, 1)
    q, k = rope(q, c, s), rope(k, c, s)
    new_k = g.concat([past_k, k], axis=2)
    new_v = g.concat([past_v, v], axis=2)
    return q, new_k, new_v, repeat_kv


def llama_onnx(cfg: LlamaConfig) -> onnx.ModelProto:
    """``models.llama_decoder_layer`` (decode or prefill): the HF ``LlamaDecoderLayer`` twin."""
    B, S, D, H = cfg.batch, cfg.seq, cfg.head_dim, cfg.heads
    specs = _llama_specs(cfg)
    g = _start("llama_decoder_layer", specs, cfg.dtype)
    P = {n: n for n, _ in specs}
    x = P["x"]
    h = g.rms_norm(x, P["input_norm"], cfg.eps)
    q, new_k, new_v, repeat_kv = _attention(g, cfg, h, P["cos"], P["sin"], P["past_k"], P["past_v"],
                                            P["w_q"], P["w_k"], P["w_v"])
    kt = g.transpose(repeat_kv(new_k), (0, 1, 3, 2))
    scores = g.op("Mul", [g.op("MatMul", [q, kt]), g.scalar(1 / np.sqrt(D))])
    if S > 1:
        scores = g.op("Add", [scores, P["mask"]])
    probs = g.cast(g.op("Softmax", [g.cast(scores, "float32", cfg.dtype)], axis=-1), cfg.dtype, "float32")
    attn = g.op("MatMul", [probs, repeat_kv(new_v)])
    attn = g.reshape(g.transpose(attn, (0, 2, 1, 3)), (B, S, H * D))
    x = g.op("Add", [x, g.op("MatMul", [attn, P["w_o"]])])
    h = g.rms_norm(x, P["post_norm"], cfg.eps)
    gate = g.silu(g.op("MatMul", [h, P["w_gate"]]))
    mlp = g.op("MatMul", [g.op("Mul", [gate, g.op("MatMul", [h, P["w_up"]])]), P["w_down"]])
    return g.finish([g.op("Add", [x, mlp]), new_k, new_v])


def _gelu_tanh(g: _Graph, t):
    """0.5 * t * (1 + tanh(sqrt(2/pi) * (t + 0.044715 t^3))): Gelu is opset 20, this is 18."""
    inner = g.op("Add", [t, g.op("Mul", [g.op("Pow", [t, g.scalar(3.0)]), g.scalar(0.044715)])])
    th = g.op("Tanh", [g.op("Mul", [inner, g.scalar(float(np.sqrt(2 / np.pi)))])])
    return g.op("Mul", [g.op("Mul", [t, g.scalar(0.5)]), g.op("Add", [th, g.scalar(1.0)])])


def gemma2_onnx(cfg: W.Gemma2Config) -> onnx.ModelProto:
    """``workloads.gemma2_decoder_layer``: RMSNorm by ``1 + w``, soft-capped logits, GeGLU."""
    B, S, D, H = cfg.batch, cfg.seq, cfg.head_dim, cfg.heads
    specs, dt = W.gemma2_params(cfg)
    g = _start("gemma2_decoder_layer", specs, dt)
    P = {n: n for n, _ in specs}

    def norm(t, w):
        return g.rms_norm(t, g.op("Add", [w, g.scalar(1.0)]), cfg.eps)

    x = P["x"]
    h = norm(x, P["input_norm"])
    q, new_k, new_v, repeat_kv = _attention(g, cfg, h, P["cos"], P["sin"], P["past_k"], P["past_v"],
                                            P["w_q"], P["w_k"], P["w_v"])
    kt = g.transpose(repeat_kv(new_k), (0, 1, 3, 2))
    scores = g.op("Mul", [g.op("MatMul", [q, kt]), g.scalar(cfg.query_pre_attn_scalar ** -0.5)])
    scores = g.cast(scores, "float32", dt)
    cap = g.scalar(cfg.softcap, "float32")
    scores = g.op("Mul", [g.op("Tanh", [g.op("Div", [scores, cap])]), cap])
    scores = g.op("Add", [scores, g.cast(P["mask"], "float32", dt)])
    probs = g.cast(g.op("Softmax", [scores], axis=-1), dt, "float32")
    attn = g.op("MatMul", [probs, repeat_kv(new_v)])
    attn = g.reshape(g.transpose(attn, (0, 2, 1, 3)), (B, S, H * D))
    x = g.op("Add", [x, norm(g.op("MatMul", [attn, P["w_o"]]), P["post_attn_norm"])])
    h = norm(x, P["pre_ffw_norm"])
    gate = _gelu_tanh(g, g.op("MatMul", [h, P["w_gate"]]))
    mlp = g.op("MatMul", [g.op("Mul", [gate, g.op("MatMul", [h, P["w_up"]])]), P["w_down"]])
    return g.finish([g.op("Add", [x, norm(mlp, P["post_ffw_norm"])]), new_k, new_v])


# ----------------------------------------------------------------------------------------------
# Vision blocks
# ----------------------------------------------------------------------------------------------
def effvit_onnx(cfg: W.EffViTConfig) -> onnx.ModelProto:
    """``workloads.effvit_attention``: LiteMLA (ReLU linear attention, 5x5 aggregation) + residual."""
    N, C, Hh, Wd, d = cfg.batch, cfg.channels, cfg.height, cfg.width, cfg.dim
    heads, td = C // d, C
    specs, dt = W.effvit_params(cfg)
    g = _start("effvit_attention", specs, dt)
    qkv = g.conv("x", "w_qkv")
    agg = g.conv(qkv, "w_agg_dw", pad=cfg.scale // 2, groups=3 * td)
    agg = g.conv(agg, "w_agg_pw", groups=3 * heads)
    t = g.reshape(g.concat([qkv, agg], axis=1), (N, -1, 3 * d, Hh * Wd))  # .reshape(N, -1, 3d, HW)
    q = g.op("Relu", [g.slice(t, 2, 0, d)])
    k = g.op("Relu", [g.slice(t, 2, d, 2 * d)])
    v = g.slice(t, 2, 2 * d, INT64_MAX)
    kt = g.transpose(k, (0, 1, 3, 2))
    # F.pad(v, (0, 0, 0, 1), value=1): ONNX pads are [begin of every axis..., end of every axis...]
    vp = g.op("Pad", [v, g.ints([0, 0, 0, 0, 0, 0, 1, 0]), g.scalar(1.0)], mode="constant")
    out = g.op("MatMul", [g.op("MatMul", [vp, kt]), q])
    num = g.slice(out, 2, 0, -1)  # out[:, :, :-1]
    den = g.slice(out, 2, -1, INT64_MAX)  # out[:, :, -1:]
    out = g.op("Div", [num, g.op("Add", [den, g.scalar(cfg.eps)])])
    out = g.reshape(out, (N, -1, Hh, Wd))
    y = g.conv(out, "w_proj", "b_proj")
    return g.finish([g.op("Add", ["x", y])])


def c3k2_onnx(cfg: W.C3k2Config) -> onnx.ModelProto:
    """``workloads.yolo_c3k2``: Conv+SiLU, chunk(2) (a Split), Bottlenecks, Concat, Conv+SiLU."""
    specs, dt = W.c3k2_params(cfg)
    g = _start("yolo_c3k2", specs, dt)
    c = cfg.c

    def conv(t, key, pad=0):
        return g.silu(g.conv(t, "w_" + key, "b_" + key, pad=pad))

    parts = list(g.split(conv("x", "cv1"), [c, c], axis=1))
    for i in range(cfg.n):
        last = parts[-1]
        parts.append(g.op("Add", [last, conv(conv(last, f"m{i}_cv1", 1), f"m{i}_cv2", 1)]))
    return g.finish([conv(g.concat(parts, axis=1), "cv2")])


def _channel_shuffle(g: _Graph, t, N, C, Hh, Wd):
    """view(N, 2, C/2, H, W).transpose(1, 2).reshape(N, C, H, W)"""
    t = g.transpose(g.reshape(t, (N, 2, C // 2, Hh, Wd)), (0, 2, 1, 3, 4))
    return g.reshape(t, (N, C, Hh, Wd))


def shufflenet_unit_onnx(cfg: ShuffleNetConfig) -> onnx.ModelProto:
    """``models.shufflenet_unit``: chunk(2), pw-dw-pw branch, Concat, channel shuffle."""
    N, C, Hh, Wd = cfg.batch, cfg.channels, cfg.height, cfg.width
    c = C // 2
    specs = [("x", (N, C, Hh, Wd)), ("w_pw1", (c, c, 1, 1)), ("b_pw1", (1, c, 1, 1)),
             ("w_dw", (c, 1, 3, 3)), ("b_dw", (1, c, 1, 1)), ("w_pw2", (c, c, 1, 1)), ("b_pw2", (1, c, 1, 1))]
    g = _start("shufflenet_unit", specs, cfg.dtype)
    x1, x2 = g.split("x", [c, c], axis=1)
    y = g.op("Relu", [g.conv(x2, "w_pw1", "b_pw1")])
    y = g.conv(y, "w_dw", "b_dw", pad=1, groups=c)
    y = g.op("Relu", [g.conv(y, "w_pw2", "b_pw2")])
    return g.finish([_channel_shuffle(g, g.concat([x1, y], axis=1), N, C, Hh, Wd)])


def shufflenet_v2_onnx(cfg: W.ShuffleNetV2Config) -> onnx.ModelProto:
    """``workloads.shufflenet_v2``: torchvision ShuffleNetV2 with batch-norm folded."""
    specs, dt = W.shufflenet_v2_params(cfg)
    g = _start("shufflenet_v2", specs, dt)
    N = cfg.batch

    def conv(t, key, stride=1, pad=0, groups=1, relu=True):
        y = g.conv(t, "w_" + key, "b_" + key, stride=stride, pad=pad, groups=groups)
        return g.op("Relu", [y]) if relu else y

    def down(s):  # spatial size after a 3x3 window, stride 2, padding 1
        return (s + 2 - 3) // 2 + 1

    x = conv("x", "stem", 2, 1)
    x = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    s = down(down(cfg.size))
    for name, stride, inp, oup in W._shufflenet_v2_plan(cfg):
        c = oup // 2
        if stride == 1:
            x1, x2 = g.split(x, [c, c], axis=1)
        else:
            x1 = conv(conv(x, f"{name}_b1dw", 2, 1, groups=inp, relu=False), f"{name}_b1pw")
            x2 = x
            s = down(s)
        y = conv(x2, f"{name}_pw1")
        y = conv(y, f"{name}_dw", stride, 1, groups=c, relu=False)
        y = conv(y, f"{name}_pw2")
        x = _channel_shuffle(g, g.concat([x1, y], axis=1), N, oup, s, s)
    x = conv(x, "last")
    x = g.op("ReduceMean", [x, g.ints([2, 3])], keepdims=0)  # .mean(dim=(2, 3))
    return g.finish([g.op("Add", [g.op("MatMul", [x, "w_fc"]), "b_fc"])])


# ----------------------------------------------------------------------------------------------
# Registry and import
# ----------------------------------------------------------------------------------------------
ONNX_BUILDERS: Dict[str, Callable] = {
    "llama_decode": llama_onnx,
    "llama_prefill": llama_onnx,
    "gemma2_decode": gemma2_onnx,
    "effvit_attn": effvit_onnx,
    "yolo_c3k2": c3k2_onnx,
    "shufflenet_unit": shufflenet_unit_onnx,
    "shufflenet_v2": shufflenet_v2_onnx,
}


# ----------------------------------------------------------------------------------------------
# An encoder with no Relax twin: for the model tests and the model fuzzer only
# ----------------------------------------------------------------------------------------------
# (batch, sequence, hidden, heads, FFN, layers) of the small BERT-style encoder
BERT_SMALL = dict(batch=2, seq=16, hidden=64, heads=4, ffn=256, layers=2)
# (batch, image side, patch side, hidden, heads, FFN, layers, classes) of the small ViT
VIT_SMALL = dict(batch=2, image=32, patch=8, hidden=64, heads=4, ffn=128, layers=2, classes=10)


def _encoder_weights(i: int, H: int, ffn: int) -> list:
    """The weight inputs of encoder layer ``i`` (q/k/v/o, two layer norms, the FFN)."""
    return [(f"w_q{i}", (H, H)), (f"b_q{i}", (H,)), (f"w_k{i}", (H, H)), (f"b_k{i}", (H,)),
            (f"w_v{i}", (H, H)), (f"b_v{i}", (H,)), (f"w_o{i}", (H, H)), (f"b_o{i}", (H,)),
            (f"attn_norm{i}", (H,)), (f"b_attn_ln{i}", (H,)), (f"w_i{i}", (H, ffn)), (f"b_i{i}", (ffn,)),
            (f"w_out{i}", (ffn, H)), (f"b_out{i}", (H,)), (f"out_norm{i}", (H,)), (f"b_out_ln{i}", (H,))]


def _dense(g: _Graph, t, w, b):
    return g.op("Add", [g.op("MatMul", [t, w]), b])


def _layer_norm(g: _Graph, t, gain, bias, eps):
    return g.op("LayerNormalization", [t, gain, bias], axis=-1, epsilon=eps)


def _self_attention(g: _Graph, x, i: int, B: int, S: int, H: int, n: int, mask=None):
    """HF's self-attention of layer ``i`` (``BertSelfAttention``/``ViTSelfAttention``): q/k/v
    ``MatMul`` + bias reshaped into heads (k transposed to ``(0, 2, 3, 1)``), ``Div`` by sqrt(d),
    the additive ``mask``, ``Softmax``, the context transposed back, the output projection."""
    D = H // n
    q, k, v = (g.reshape(_dense(g, x, f"w_{p}{i}", f"b_{p}{i}"), (B, S, n, D)) for p in "qkv")
    q, kt, v = g.transpose(q, (0, 2, 1, 3)), g.transpose(k, (0, 2, 3, 1)), g.transpose(v, (0, 2, 1, 3))
    scores = g.op("Div", [g.op("MatMul", [q, kt]), g.scalar(float(np.sqrt(D)))])
    if mask is not None:
        scores = g.op("Add", [scores, mask])
    ctx = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
    return _dense(g, g.reshape(g.transpose(ctx, (0, 2, 1, 3)), (B, S, H)), f"w_o{i}", f"b_o{i}")


def _ffn(g: _Graph, t, i: int):
    """The FFN with the exact GELU: ``0.5 x (1 + erf(x / sqrt 2))`` as ``Div``/``Erf``/``Add``/``Mul``."""
    inter = _dense(g, t, f"w_i{i}", f"b_i{i}")
    erf = g.op("Erf", [g.op("Div", [inter, g.scalar(float(np.sqrt(2.0)))])])
    gelu = g.op("Mul", [g.op("Mul", [inter, g.scalar(0.5)]), g.op("Add", [erf, g.scalar(1.0)])])
    return _dense(g, gelu, f"w_out{i}", f"b_out{i}")


def bert_encoder_onnx(batch: int, seq: int, hidden: int, heads: int, ffn: int, layers: int,
                      dtype: str = "float32") -> onnx.ModelProto:
    """A BERT encoder (HF ``BertLayer`` x ``layers``, post-norm) as its ONNX export spells it: the
    attention mask's ``Unsqueeze``/``Unsqueeze``/``Sub``/``Mul`` extension, :func:`_self_attention`,
    ``LayerNormalization`` after each residual, :func:`_ffn`. Inputs ``x`` (embeddings,
    [B, S, H]) and ``attention_mask`` ([B, S]), weights as inputs, all of ``dtype``."""
    B, S, H = batch, seq, hidden
    specs = [("x", (B, S, H)), ("attention_mask", (B, S))]
    for i in range(layers):
        specs += _encoder_weights(i, H, ffn)
    g = _start("bert_encoder", specs, dtype)
    # the extended mask: (1 - mask[:, None, None, :]) * scale (HF scales by the dtype's minimum)
    ext = g.unsqueeze(g.unsqueeze("attention_mask", 1), 2)
    ext = g.op("Mul", [g.op("Sub", [g.scalar(1.0), ext]), g.scalar(-1.0)])
    x = "x"
    for i in range(layers):
        h = _layer_norm(g, g.op("Add", [_self_attention(g, x, i, B, S, H, heads, ext), x]),
                        f"attn_norm{i}", f"b_attn_ln{i}", 1e-12)
        x = _layer_norm(g, g.op("Add", [_ffn(g, h, i), h]), f"out_norm{i}", f"b_out_ln{i}", 1e-12)
    return g.finish([x])


def vit_onnx(batch: int, image: int, patch: int, hidden: int, heads: int, ffn: int, layers: int, classes: int,
             dtype: str = "float32") -> onnx.ModelProto:
    """A ViT classifier (HF ``ViTForImageClassification``, pre-norm) as its ONNX export spells it:
    the patch ``Conv``, ``flatten(2).transpose(1, 2)`` as ``Reshape`` + ``Transpose``, the class
    token ``Expand``-ed to the batch and ``Concat``-ed in front, the position embeddings ``Add``,
    ``layers`` x (``LayerNormalization``, :func:`_self_attention`, residual,
    ``LayerNormalization``, :func:`_ffn`, residual), the final norm and the classifier on token 0
    (``x[:, 0]``: a ``Gather`` of a scalar index). Input ``pixels`` ([B, 3, image, image])."""
    B, H, P = batch, hidden, (image // patch) ** 2
    S = P + 1
    specs = [("pixels", (B, 3, image, image)), ("w_patch", (H, 3, patch, patch)), ("b_patch", (H, 1, 1)),
             ("w_cls", (1, 1, H)), ("w_pos", (1, S, H))]
    for i in range(layers):
        specs += _encoder_weights(i, H, ffn)
    specs += [("final_norm", (H,)), ("b_final_ln", (H,)), ("w_head", (H, classes)), ("b_head", (classes,))]
    g = _start("vit", specs, dtype)
    patches = g.conv("pixels", "w_patch", "b_patch", stride=patch)
    tokens = g.transpose(g.reshape(patches, (B, H, P)), (0, 2, 1))
    cls = g.op("Expand", ["w_cls", g.ints((B, 1, H))])
    x = g.op("Add", [g.concat([cls, tokens], axis=1), "w_pos"])
    for i in range(layers):
        h = _layer_norm(g, x, f"attn_norm{i}", f"b_attn_ln{i}", 1e-12)
        x = g.op("Add", [_self_attention(g, h, i, B, S, H, heads), x])
        x = g.op("Add", [_ffn(g, _layer_norm(g, x, f"out_norm{i}", f"b_out_ln{i}", 1e-12), i), x])
    x = _layer_norm(g, x, "final_norm", "b_final_ln", 1e-12)
    first = g.op("Gather", [x, g.scalar(0, "int64")], axis=1)
    return g.finish([_dense(g, first, "w_head", "b_head")])


# (batch, side, channels, window, heads) of the small Swin stage
SWIN_SMALL = dict(batch=2, side=8, channels=32, window=4, heads=2)


def _swin_tables(ws: int, side: int, shift: int):
    """Swin's registered buffers: the relative position index of a ``ws`` x ``ws`` window
    ([ws^2 * ws^2] into the (2 ws - 1)^2 bias table) and the shifted windows' attention mask
    ([windows, ws^2, ws^2], 0 or -100), as HF ``SwinSelfAttention`` / ``SwinLayer`` compute them."""
    coords = np.stack(np.meshgrid(np.arange(ws), np.arange(ws), indexing="ij")).reshape(2, -1)
    rel = (coords[:, :, None] - coords[:, None, :]).transpose(1, 2, 0) + (ws - 1)
    index = (rel[..., 0] * (2 * ws - 1) + rel[..., 1]).reshape(-1).astype(np.int64)
    img = np.zeros((side, side))
    cnt = 0
    for hs in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
        for wsl in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
            img[hs, wsl] = cnt
            cnt += 1
    win = img.reshape(side // ws, ws, side // ws, ws).transpose(0, 2, 1, 3).reshape(-1, ws * ws)
    mask = np.where(win[:, None, :] != win[:, :, None], -100.0, 0.0)
    return index, mask


def swin_onnx(batch: int, side: int, channels: int, window: int, heads: int, dtype: str = "float32") -> onnx.ModelProto:
    """A Swin stage (HF ``SwinStage``: a block with windows, one with windows shifted by half a
    window, then ``SwinPatchMerging``) as its ONNX export spells it: the cyclic shift
    (``torch.roll``) as ``Slice`` + ``Concat`` per axis, window partition and reverse as
    ``Reshape`` + 6-D ``Transpose`` + ``Reshape``, the relative position bias ``Gather``-ed from its
    table by a constant index, reshaped, transposed and unsqueezed, the shifted windows' constant
    mask, and the patch merging's four strided slices ``x[:, i::2, j::2]`` concatenated. Input ``x``
    ([B, side^2, C]), weights as inputs."""
    B, L, C, ws, n = batch, side, channels, window, heads
    N, nW, shift = ws * ws, (side // window) ** 2, window // 2
    specs = [("x", (B, L * L, C))]
    for i in range(2):
        specs += [(f"pre_norm{i}", (C,)), (f"b_pre_ln{i}", (C,))] + _encoder_weights(i, C, 4 * C) + \
            [(f"w_rel{i}", ((2 * ws - 1) ** 2, n))]
    specs += [("merge_norm", (4 * C,)), ("b_merge_ln", (4 * C,)), ("w_reduce", (4 * C, 2 * C))]
    g = _start("swin_stage", specs, dtype)
    index, shift_mask = _swin_tables(ws, L, shift)
    rel_index, mask = g.constant(index), g.constant(shift_mask.astype(dtype).reshape(1, nW, 1, N, N))

    def roll(t, s):  # torch.roll(t, (s, s), dims=(1, 2)) on [B, L, L, C]
        for axis in (1, 2):
            k = s % L
            t = g.concat([g.slice(t, axis, L - k, L), g.slice(t, axis, 0, L - k)], axis)
        return t

    def windows(t):  # [B, L, L, C] -> [B * nW, N, C]
        t = g.transpose(g.reshape(t, (B, L // ws, ws, L // ws, ws, C)), (0, 1, 3, 2, 4, 5))
        return g.reshape(t, (B * nW, N, C))

    def unwindows(t):  # [B * nW, N, C] -> [B, L, L, C]
        t = g.transpose(g.reshape(t, (B, L // ws, L // ws, ws, ws, C)), (0, 1, 3, 2, 4, 5))
        return g.reshape(t, (B, L, L, C))

    x = "x"
    for i in range(2):
        s = shift if i == 1 else 0
        h = g.reshape(_layer_norm(g, x, f"pre_norm{i}", f"b_pre_ln{i}", 1e-5), (B, L, L, C))
        h = windows(roll(h, -s) if s else h)
        bias = g.reshape(g.op("Gather", [f"w_rel{i}", rel_index], axis=0), (N, N, n))
        bias = g.unsqueeze(g.transpose(bias, (2, 0, 1)), 0)
        q, k, v = (g.transpose(g.reshape(_dense(g, h, f"w_{p}{i}", f"b_{p}{i}"), (B * nW, N, n, C // n)),
                               (0, 2, 3, 1) if p == "k" else (0, 2, 1, 3)) for p in "qkv")
        scores = g.op("Add", [g.op("Div", [g.op("MatMul", [q, k]), g.scalar(float(np.sqrt(C // n)))]), bias])
        if s:
            scores = g.reshape(g.op("Add", [g.reshape(scores, (B, nW, n, N, N)), mask]), (B * nW, n, N, N))
        ctx = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
        ctx = _dense(g, g.reshape(g.transpose(ctx, (0, 2, 1, 3)), (B * nW, N, C)), f"w_o{i}", f"b_o{i}")
        ctx = unwindows(ctx)
        ctx = g.reshape(roll(ctx, s) if s else ctx, (B, L * L, C))
        x = g.op("Add", [x, ctx])
        x = g.op("Add", [x, _ffn(g, _layer_norm(g, x, f"attn_norm{i}", f"b_attn_ln{i}", 1e-5), i)])
    # patch merging: x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]
    grid = g.reshape(x, (B, L, L, C))
    parts = [g.op("Slice", [grid, g.ints([a, b]), g.ints([L, L]), g.ints([1, 2]), g.ints([2, 2])])
             for a, b in ((0, 0), (1, 0), (0, 1), (1, 1))]
    merged = g.reshape(g.concat(parts, axis=-1), (B, (L // 2) ** 2, 4 * C))
    merged = _layer_norm(g, merged, "merge_norm", "b_merge_ln", 1e-5)
    return g.finish([g.op("MatMul", [merged, "w_reduce"])])


# Shipped models that have no Relax workload twin (written next to the workloads' by write_small)
EXTRA_MODELS = {"bert_encoder": lambda: bert_encoder_onnx(**BERT_SMALL), "vit": lambda: vit_onnx(**VIT_SMALL),
                "swin_stage": lambda: swin_onnx(**SWIN_SMALL)}


def onnx_model(workload_name: str, cfg) -> onnx.ModelProto:
    """The ONNX twin of ``WORKLOADS[workload_name].build(cfg)`` (opset 18, weights as inputs)."""
    if workload_name not in ONNX_BUILDERS:
        raise KeyError(f"no ONNX model for {workload_name!r} (have: {', '.join(sorted(ONNX_BUILDERS))})")
    return ONNX_BUILDERS[workload_name](cfg)


def onnx_module(workload_name: str, cfg, model: Optional[onnx.ModelProto] = None) -> tvm.IRModule:
    """``onnx_model(workload_name, cfg)`` (or ``model``) imported by ``from_onnx`` (through
    :func:`vtc_tvm.onnx_import.load_onnx`). ``main``'s parameters are checked to be the Relax
    builder's, name for name and shape for shape, so ``wl.inputs(mod, cfg, seed)`` feeds it."""
    from vtc_tvm.onnx_import import load_onnx

    model = model if model is not None else onnx_model(workload_name, cfg)
    empty = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input
             if any(d.HasField("dim_value") and d.dim_value == 0 for d in i.type.tensor_type.shape.dim)}
    if empty:
        # A zero-size input (llama_prefill's empty KV cache, ctx=0): both from_onnx and load_onnx
        # read dim_value 0 as "unknown", and load_onnx refuses a 0 in shape_dict, so import
        # directly with the static shapes given.
        import warnings

        from tvm.relax.frontend.onnx import from_onnx

        onnx.checker.check_model(model)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = from_onnx(model, shape_dict=empty)
    else:
        mod = load_onnx(model)
    want = [(p.name, _shape(p)) for p in W.WORKLOADS[workload_name].build(cfg)["main"].params]
    got = [(p.name, _shape(p)) for p in mod["main"].params]
    if got != want:
        raise AssertionError(f"{workload_name}: imported main params {got} != builder params {want}")
    return mod


def _shape(p):
    return tuple(int(d) for d in p.ty.shape), str(p.ty.dtype)


def small_path(workload_name: str, out_dir: str = ONNX_DIR) -> str:
    return os.path.join(out_dir, f"{workload_name}_small.onnx")


def write_small(out_dir: str = ONNX_DIR, names: Optional[Sequence[str]] = None) -> List[str]:
    """Write the small (float32) config of every workload (and :data:`EXTRA_MODELS`) to
    ``<out_dir>/<name>_small.onnx``."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name in names or sorted(ONNX_BUILDERS) + sorted(EXTRA_MODELS):
        model = EXTRA_MODELS[name]() if name in EXTRA_MODELS else onnx_model(name, W.WORKLOADS[name].config("small"))
        path = small_path(name, out_dir)
        onnx.save(model, path)
        paths.append(path)
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=ONNX_DIR, help="directory for <workload>_small.onnx")
    ap.add_argument("names", nargs="*", help="workloads (default: all)")
    args = ap.parse_args(argv)
    for path in write_small(args.out, args.names or None):
        print(f"{path}  {os.path.getsize(path)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
