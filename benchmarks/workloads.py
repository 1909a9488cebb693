"""The paper's workloads, each defined once as a Relax builder and once as a matching torch module.

Every workload has a ``small`` config (CPU tests) and a ``real`` config (GPU benchmark), built by
``make_config(size, batch, dtype)``. The Relax builder (torch-free) returns an IRModule whose
``main`` takes activations first, then weights, following the naming convention of
:mod:`vtc_tvm.models` (``w_*`` weights, ``b_*`` biases, ``*norm`` gains, ``cos``/``sin``, ``mask``).
The torch module (torch imported lazily, only for the peer timings) holds the weights as buffers
under the same names and takes the activations as ``forward`` arguments;
:func:`load_torch` copies the SAME random arrays into it, so both compute one function.

Workloads (real sizes):

* ``llama_decode``  Llama-3-8B decoder layer, 1 new token, KV cache of 4096 (``vtc_tvm.models``)
* ``llama_prefill`` Llama-3-8B decoder layer, 512 new tokens, empty cache, causal mask
* ``gemma2_decode`` Gemma-2-9B decoder layer (local sliding-window attention, window 4096,
  attention logit soft-capping 50, GQA 16 q / 8 kv heads, head_dim 256, GeGLU), 1 token, cache 4096
* ``effvit_attn``   EfficientViT-B1 LiteMLA block (ReLU linear attention, multi-scale 5x5) on
  stage 3 (128 channels) at 32x32 (r512), with its residual
* ``yolo_c3k2``     YOLOv11n C3k2 block (model.2: 32 -> 64 channels, e=0.25, one Bottleneck) at 160x160
* ``shufflenet_unit`` ShuffleNetV2 1.0x stage-2 stride-1 unit (``vtc_tvm.models``), 116 ch, 28x28
* ``shufflenet_v2`` the whole ShuffleNetV2 1.0x at 224x224 (batch-norm folded into conv biases)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Sequence

import numpy as np
import tvm
from tvm import relax
from tvm.relax import op as R

from vtc_tvm import models
from vtc_tvm.models import LlamaConfig, ShuffleNetConfig


# ----------------------------------------------------------------------------------------------
# Relax helpers
# ----------------------------------------------------------------------------------------------
def _param(name, shape, dtype):
    return relax.Var(name, relax.TensorType(tuple(int(s) for s in shape), dtype))


def _finish(params, build) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build(bb, *params))
        bb.emit_func_output(out)
    return bb.get()


def is_weight(name: str) -> bool:
    """Weights live in the torch module; everything else is a ``forward`` argument."""
    return name.startswith(("w_", "b_")) or name.endswith("norm")


# ----------------------------------------------------------------------------------------------
# Gemma-2-9B decoder layer
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Gemma2Config:
    hidden: int = 3584
    heads: int = 16
    kv_heads: int = 8
    head_dim: int = 256
    intermediate: int = 14336
    batch: int = 16
    ctx: int = 4096
    seq: int = 1
    window: int = 4096  # sliding window of the local layers; None = global attention
    softcap: float = 50.0  # attn_logit_softcapping
    query_pre_attn_scalar: float = 256.0
    eps: float = 1e-6
    dtype: str = "float32"
    kv_cache: str = "grow"  # or "static": see vtc_tvm.models.LlamaConfig

    @classmethod
    def small(cls, **kw):
        return dataclasses.replace(cls(hidden=128, heads=4, kv_heads=2, head_dim=32, intermediate=256,
                                       batch=2, ctx=32, window=16), **kw)

    @classmethod
    def real(cls, **kw):
        return cls(**kw)


def gemma2_params(cfg: Gemma2Config):
    B, S, T, D, dt = cfg.batch, cfg.seq, cfg.ctx + cfg.seq, cfg.head_dim, cfg.dtype
    H, KV, hid, ffn = cfg.heads, cfg.kv_heads, cfg.hidden, cfg.intermediate
    C = models.kv_cache_len(cfg)
    return [("x", (B, S, hid)), ("cos", (B, S, D)), ("sin", (B, S, D)), ("past_k", (B, KV, C, D)),
            ("past_v", (B, KV, C, D)), ("mask", (B, 1, S, T)), ("input_norm", (hid,)),
            ("w_q", (hid, H * D)), ("w_k", (hid, KV * D)), ("w_v", (hid, KV * D)), ("w_o", (H * D, hid)),
            ("post_attn_norm", (hid,)), ("pre_ffw_norm", (hid,)), ("w_gate", (hid, ffn)),
            ("w_up", (hid, ffn)), ("w_down", (ffn, hid)), ("post_ffw_norm", (hid,))], dt


def gemma2_decoder_layer(cfg: Gemma2Config) -> tvm.IRModule:
    """HF ``Gemma2DecoderLayer`` (eager attention). ``main(x, cos, sin, past_k, past_v, mask, weights...)``
    -> ``(out, new_k, new_v)``. RMSNorm scales by ``1 + w``; the mask carries the sliding window."""
    specs, dt = gemma2_params(cfg)
    B, S, T, D = cfg.batch, cfg.seq, cfg.ctx + cfg.seq, cfg.head_dim
    H, KV = cfg.heads, cfg.kv_heads
    n_rep = H // KV
    params = [_param(n, s, dt) for n, s in specs]

    def build(bb, x, cos, sin, past_k, past_v, mask, input_norm, w_q, w_k, w_v, w_o, post_attn_norm,
              pre_ffw_norm, w_gate, w_up, w_down, post_ffw_norm):
        emit = bb.emit
        one = relax.const(1.0, dt)

        def norm(t, g):
            return emit(R.nn.rms_norm(t, emit(R.add(g, one)), axes=-1, epsilon=cfg.eps))

        def heads(t, n):
            return emit(R.permute_dims(emit(R.reshape(t, (B, S, n, D))), [0, 2, 1, 3]))

        def rope(t, c, s):
            lo = emit(R.strided_slice(t, axes=[3], begin=[0], end=[D // 2]))
            hi = emit(R.strided_slice(t, axes=[3], begin=[D // 2], end=[D]))
            rot = emit(R.concat([emit(R.negative(hi)), lo], axis=3))
            return emit(R.add(emit(R.multiply(t, c)), emit(R.multiply(rot, s))))

        def repeat_kv(t):
            t = emit(R.broadcast_to(emit(R.expand_dims(t, 2)), (B, KV, n_rep, T, D)))
            return emit(R.reshape(t, (B, H, T, D)))

        h = norm(x, input_norm)
        q, k, v = (heads(emit(R.matmul(h, w)), n) for w, n in ((w_q, H), (w_k, KV), (w_v, KV)))
        c, s = emit(R.expand_dims(cos, 1)), emit(R.expand_dims(sin, 1))
        q, k = rope(q, c, s), rope(k, c, s)
        new_k, new_v = (emit(models.append_kv(cfg, past, t)) for past, t in ((past_k, k), (past_v, v)))
        kt = emit(R.permute_dims(repeat_kv(new_k), [0, 1, 3, 2]))
        scale = relax.const(cfg.query_pre_attn_scalar ** -0.5, dt)
        scores = emit(R.astype(emit(R.multiply(emit(R.matmul(q, kt)), scale)), "float32"))
        cap = relax.const(cfg.softcap, "float32")
        scores = emit(R.multiply(emit(R.tanh(emit(R.divide(scores, cap)))), cap))
        scores = emit(R.add(scores, emit(R.astype(mask, "float32"))))
        probs = emit(R.astype(emit(R.nn.softmax(scores, axis=-1)), dt))
        attn = emit(R.matmul(probs, repeat_kv(new_v)))
        attn = emit(R.reshape(emit(R.permute_dims(attn, [0, 2, 1, 3])), (B, S, H * D)))
        x = emit(R.add(x, norm(emit(R.matmul(attn, w_o)), post_attn_norm)))
        h = norm(x, pre_ffw_norm)
        gate = emit(R.nn.gelu_tanh(emit(R.matmul(h, w_gate))))
        mlp = emit(R.matmul(emit(R.multiply(gate, emit(R.matmul(h, w_up)))), w_down))
        return relax.Tuple([emit(R.add(x, norm(mlp, post_ffw_norm))), new_k, new_v])

    return _finish(params, build)


def _gemma2_inputs(mod, cfg: Gemma2Config, seed):
    arrays = models.random_inputs(mod, seed)
    names = [p.name for p in mod["main"].params]
    S, T = cfg.seq, cfg.ctx + cfg.seq
    q = np.arange(S)[:, None] + T - S  # absolute position of each query
    t = np.arange(T)[None, :]
    ok = t <= q
    if cfg.window:
        ok &= t > q - cfg.window
    mask = np.broadcast_to(np.where(ok, 0.0, -1e4), (cfg.batch, 1, S, T))
    arrays[names.index("mask")] = np.ascontiguousarray(mask, dtype=cfg.dtype)
    return arrays


# ----------------------------------------------------------------------------------------------
# EfficientViT-B1 LiteMLA (multi-scale ReLU linear attention)
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EffViTConfig:
    channels: int = 128
    dim: int = 16  # head dim; heads = channels // dim
    height: int = 32
    width: int = 32
    scale: int = 5  # the one aggregation kernel of EfficientViT-B1 (scales=(5,))
    eps: float = 1e-15
    batch: int = 16
    dtype: str = "float32"

    @classmethod
    def small(cls, **kw):
        return dataclasses.replace(cls(channels=32, dim=8, height=8, width=8, batch=2), **kw)

    @property
    def eps_value(self) -> float:
        """``eps`` as ``dtype`` holds it. EfficientViT's 1e-15 is 0 in float16; a token whose ReLU'd
        query is all zero (probability about 2**-dim: ~4 tokens in a batch-16 input) then computes
        0 / 0 = NaN in the output (what made ``effvit_attn/b16`` non-finite in stock TVM and
        PyTorch alike: it was never an overflow; at the real size the largest intermediate, the
        attention numerator/denominator, is ~9e3). The smallest normal float16 (6.1e-5) makes that
        token 0 and leaves every other one as it was (a denominator is a sum of positive terms, the
        smallest nonzero one ~12). float32/64 keep 1e-15."""
        return max(self.eps, float(np.finfo(self.dtype).tiny))

    @classmethod
    def real(cls, **kw):
        return cls(**kw)


def effvit_params(cfg: EffViTConfig):
    C, td = cfg.channels, cfg.channels  # total_dim = heads * dim, with heads = channels // dim
    k = cfg.scale
    return [("x", (cfg.batch, C, cfg.height, cfg.width)), ("w_qkv", (3 * td, C, 1, 1)),
            ("w_agg_dw", (3 * td, 1, k, k)), ("w_agg_pw", (3 * td, cfg.dim, 1, 1)),
            ("w_proj", (C, 2 * td, 1, 1)), ("b_proj", (1, C, 1, 1))], cfg.dtype


def effvit_attention(cfg: EffViTConfig) -> tvm.IRModule:
    """EfficientViT ``LiteMLA`` + residual: ``x + proj(relu_linear_att(cat[qkv, aggreg(qkv)]))``."""
    specs, dt = effvit_params(cfg)
    N, C, Hh, W, d = cfg.batch, cfg.channels, cfg.height, cfg.width, cfg.dim
    heads, td = C // d, C
    params = [_param(n, s, dt) for n, s in specs]

    def build(bb, x, w_qkv, w_agg_dw, w_agg_pw, w_proj, b_proj):
        emit = bb.emit
        qkv = emit(R.nn.conv2d(x, w_qkv))
        agg = emit(R.nn.conv2d(qkv, w_agg_dw, padding=(cfg.scale // 2,) * 2, groups=3 * td))
        agg = emit(R.nn.conv2d(agg, w_agg_pw, groups=3 * heads))
        ms = emit(R.concat([qkv, agg], axis=1))
        t = emit(R.reshape(ms, (N, 2 * heads, 3 * d, Hh * W)))

        def part(i):
            return emit(R.strided_slice(t, axes=[2], begin=[i * d], end=[(i + 1) * d]))

        q, k, v = emit(R.nn.relu(part(0))), emit(R.nn.relu(part(1))), part(2)
        kt = emit(R.permute_dims(k, [0, 1, 3, 2]))
        vp = emit(R.nn.pad(v, [0, 0, 0, 0, 0, 1, 0, 0], pad_value=1.0))
        vk = emit(R.matmul(vp, kt))
        out = emit(R.matmul(vk, q))
        num = emit(R.strided_slice(out, axes=[2], begin=[0], end=[d]))
        den = emit(R.strided_slice(out, axes=[2], begin=[d], end=[d + 1]))
        out = emit(R.divide(num, emit(R.add(den, relax.const(cfg.eps_value, dt)))))
        out = emit(R.reshape(out, (N, 2 * td, Hh, W)))
        y = emit(R.add(emit(R.nn.conv2d(out, w_proj)), b_proj))
        return R.add(x, y)

    return _finish(params, build)


# ----------------------------------------------------------------------------------------------
# YOLOv11n C3k2
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class C3k2Config:
    c1: int = 32
    c2: int = 64
    e: float = 0.25
    n: int = 1
    height: int = 160
    width: int = 160
    batch: int = 16
    dtype: str = "float32"

    @property
    def c(self):
        return int(self.c2 * self.e)

    @classmethod
    def small(cls, **kw):
        return dataclasses.replace(cls(c1=16, c2=32, e=0.5, height=8, width=8, batch=2), **kw)

    @classmethod
    def real(cls, **kw):
        return cls(**kw)


def c3k2_params(cfg: C3k2Config):
    c, c_ = cfg.c, int(cfg.c * 0.5)
    specs = [("x", (cfg.batch, cfg.c1, cfg.height, cfg.width)), ("w_cv1", (2 * c, cfg.c1, 1, 1)),
             ("b_cv1", (1, 2 * c, 1, 1))]
    for i in range(cfg.n):
        specs += [(f"w_m{i}_cv1", (c_, c, 3, 3)), (f"b_m{i}_cv1", (1, c_, 1, 1)),
                  (f"w_m{i}_cv2", (c, c_, 3, 3)), (f"b_m{i}_cv2", (1, c, 1, 1))]
    specs += [("w_cv2", (cfg.c2, (2 + cfg.n) * c, 1, 1)), ("b_cv2", (1, cfg.c2, 1, 1))]
    return specs, cfg.dtype


def yolo_c3k2(cfg: C3k2Config) -> tvm.IRModule:
    """Ultralytics ``C3k2(c1, c2, n, c3k=False, e)``: cv1 -> chunk(2) -> Bottlenecks on the last part
    -> cat(all parts) -> cv2; every Conv is conv + folded BN + SiLU; Bottleneck has its shortcut."""
    specs, dt = c3k2_params(cfg)
    params = [_param(n, s, dt) for n, s in specs]

    def build(bb, x, *ws):
        emit = bb.emit

        def conv(t, w, b, pad=0):
            return emit(R.nn.silu(emit(R.add(emit(R.nn.conv2d(t, w, padding=(pad, pad))), b))))

        y = conv(x, ws[0], ws[1])
        halves = emit(R.split(y, 2, axis=1))
        parts = [emit(relax.TupleGetItem(halves, 0)), emit(relax.TupleGetItem(halves, 1))]
        for i in range(cfg.n):
            w1, b1, w2, b2 = ws[2 + 4 * i: 6 + 4 * i]
            last = parts[-1]
            parts.append(emit(R.add(last, conv(conv(last, w1, b1, 1), w2, b2, 1))))
        return conv(emit(R.concat(parts, axis=1)), ws[-2], ws[-1])

    return _finish(params, build)


# ----------------------------------------------------------------------------------------------
# ShuffleNetV2 1.0x (whole network)
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShuffleNetV2Config:
    stem: int = 24
    stages: tuple = (116, 232, 464)
    repeats: tuple = (4, 8, 4)
    last: int = 1024
    classes: int = 1000
    size: int = 224
    batch: int = 16
    dtype: str = "float32"

    @classmethod
    def small(cls, **kw):
        return dataclasses.replace(cls(stem=8, stages=(16, 32, 64), repeats=(2, 2, 1), last=64, classes=10,
                                       size=32, batch=2), **kw)

    @classmethod
    def real(cls, **kw):
        return cls(**kw)


def _shufflenet_v2_plan(cfg: ShuffleNetV2Config):
    """[(unit name, stride, in ch, out ch)] of every unit."""
    plan, inp = [], cfg.stem
    for s, (oup, rep) in enumerate(zip(cfg.stages, cfg.repeats)):
        for i in range(rep):
            plan.append((f"s{s}u{i}", 2 if i == 0 else 1, inp, oup))
            inp = oup
    return plan


def shufflenet_v2_params(cfg: ShuffleNetV2Config):
    specs = [("x", (cfg.batch, 3, cfg.size, cfg.size)), ("w_stem", (cfg.stem, 3, 3, 3)),
             ("b_stem", (1, cfg.stem, 1, 1))]
    for name, stride, inp, oup in _shufflenet_v2_plan(cfg):
        c = oup // 2
        if stride == 2:
            specs += [(f"w_{name}_b1dw", (inp, 1, 3, 3)), (f"b_{name}_b1dw", (1, inp, 1, 1)),
                      (f"w_{name}_b1pw", (c, inp, 1, 1)), (f"b_{name}_b1pw", (1, c, 1, 1))]
        cin = inp if stride == 2 else c
        specs += [(f"w_{name}_pw1", (c, cin, 1, 1)), (f"b_{name}_pw1", (1, c, 1, 1)),
                  (f"w_{name}_dw", (c, 1, 3, 3)), (f"b_{name}_dw", (1, c, 1, 1)),
                  (f"w_{name}_pw2", (c, c, 1, 1)), (f"b_{name}_pw2", (1, c, 1, 1))]
    specs += [("w_last", (cfg.last, cfg.stages[-1], 1, 1)), ("b_last", (1, cfg.last, 1, 1)),
              ("w_fc", (cfg.last, cfg.classes)), ("b_fc", (cfg.classes,))]
    return specs, cfg.dtype


def shufflenet_v2(cfg: ShuffleNetV2Config) -> tvm.IRModule:
    """torchvision ``shufflenet_v2_x1_0`` with batch-norm folded: ``main(x, weights...) -> logits``."""
    specs, dt = shufflenet_v2_params(cfg)
    params = [_param(n, s, dt) for n, s in specs]
    names = [n for n, _ in specs]

    def build(bb, *vs):
        emit = bb.emit
        P = dict(zip(names, vs))
        x = P["x"]
        N = cfg.batch

        def conv(t, key, stride=1, pad=0, groups=1, relu=True):
            y = emit(R.add(emit(R.nn.conv2d(t, P["w_" + key], strides=(stride, stride), padding=(pad, pad),
                                            groups=groups)), P["b_" + key]))
            return emit(R.nn.relu(y)) if relu else y

        def shuffle(t):
            _, C, Hh, W = (int(d) for d in t.ty.shape)
            t = emit(R.reshape(t, (N, 2, C // 2, Hh, W)))
            return emit(R.reshape(emit(R.permute_dims(t, [0, 2, 1, 3, 4])), (N, C, Hh, W)))

        x = conv(x, "stem", stride=2, pad=1)
        x = emit(R.nn.max_pool2d(x, pool_size=(3, 3), strides=(2, 2), padding=(1, 1)))
        for name, stride, inp, oup in _shufflenet_v2_plan(cfg):
            c = oup // 2
            if stride == 1:
                halves = emit(R.split(x, 2, axis=1))
                x1, x2 = emit(relax.TupleGetItem(halves, 0)), emit(relax.TupleGetItem(halves, 1))
            else:
                x1 = conv(conv(x, f"{name}_b1dw", 2, 1, groups=inp, relu=False), f"{name}_b1pw")
                x2 = x
            y = conv(x2, f"{name}_pw1")
            y = conv(y, f"{name}_dw", stride, 1, groups=c, relu=False)
            y = conv(y, f"{name}_pw2")
            x = shuffle(emit(R.concat([x1, y], axis=1)))
        x = conv(x, "last")
        x = emit(R.mean(x, axis=[2, 3]))
        return R.add(emit(R.matmul(x, P["w_fc"])), P["b_fc"])

    return _finish(params, build)


def _kaiming_inputs(mod, cfg, seed):
    """He-scaled conv weights (x sqrt 2) so activations keep their size through ~50 ReLU layers."""
    arrays = models.random_inputs(mod, seed)
    for i, p in enumerate(mod["main"].params):
        if p.name.startswith("w_") and p.name != "w_fc":
            arrays[i] = (arrays[i] * math.sqrt(2)).astype(arrays[i].dtype)
    return arrays


# ----------------------------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------------------------
@dataclass
class Workload:
    name: str
    config_cls: type
    builder: Callable  # cfg -> IRModule (Relax, torch-free)
    torch_forward: Callable  # (P: P[name] is a torch weight, cfg, *activations) -> tensor or tuple
    real_overrides: Dict = dataclasses.field(default_factory=dict)
    small_overrides: Dict = dataclasses.field(default_factory=dict)
    inputs_fn: Callable = None  # (mod, cfg, seed) -> list of numpy arrays
    inplace: tuple = ()  # parameters vtc may update in place (VirtualTensorize(inplace=...))
    description: str = ""

    def config(self, size="small", batch=None, dtype="float32"):
        over = dict(self.real_overrides if size == "real" else self.small_overrides)
        if batch is not None:
            over["batch"] = batch
        return getattr(self.config_cls, size)(dtype=dtype, **over)

    def build(self, cfg) -> tvm.IRModule:
        return self.builder(cfg)

    def inputs(self, mod, cfg, seed=0) -> List[np.ndarray]:
        """Fresh random arrays for every parameter of ``main`` (never zeros)."""
        if self.inputs_fn is not None:
            return self.inputs_fn(mod, cfg, seed)
        return models.random_inputs(mod, seed)


# ---- torch forwards (torch imported lazily) -----------------------------------------------------
def _rms(t, g, eps):
    import torch

    tf = t.float()
    return (tf * torch.rsqrt(tf.pow(2).mean(-1, keepdim=True) + eps) * g.float()).to(t.dtype)


def _rope(t, cos, sin, D):
    import torch

    lo, hi = t[..., : D // 2], t[..., D // 2:]
    return t * cos + torch.cat([-hi, lo], dim=-1) * sin


def _repeat_kv(t, n_rep):
    B, KV, T, D = t.shape
    return t[:, :, None].expand(B, KV, n_rep, T, D).reshape(B, KV * n_rep, T, D)


def _append_kv(cfg, past, new):
    import torch

    return torch.cat([past[:, :, :cfg.ctx], new], dim=2)  # (grow: all of past; static: its first ctx rows)


def _llama_torch(P, cfg: LlamaConfig, x, cos, sin, past_k, past_v, mask=None):
    import torch

    B, S, H, KV, D = cfg.batch, cfg.seq, cfg.heads, cfg.kv_heads, cfg.head_dim
    h = _rms(x, P["input_norm"], cfg.eps)

    def heads(t, n):
        return t.view(B, S, n, D).transpose(1, 2)

    q, k, v = heads(h @ P["w_q"], H), heads(h @ P["w_k"], KV), heads(h @ P["w_v"], KV)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q, k = _rope(q, cos, sin, D), _rope(k, cos, sin, D)
    new_k, new_v = _append_kv(cfg, past_k, k), _append_kv(cfg, past_v, v)
    scores = (q @ _repeat_kv(new_k, H // KV).transpose(-1, -2)) * (1 / math.sqrt(D))
    if mask is not None:
        scores = scores + mask
    probs = torch.softmax(scores.float(), dim=-1).to(x.dtype)
    attn = (probs @ _repeat_kv(new_v, H // KV)).transpose(1, 2).reshape(B, S, H * D)
    x = x + attn @ P["w_o"]
    h = _rms(x, P["post_norm"], cfg.eps)
    mlp = (torch.nn.functional.silu(h @ P["w_gate"]) * (h @ P["w_up"])) @ P["w_down"]
    return x + mlp, new_k, new_v


def _gemma2_torch(P, cfg: Gemma2Config, x, cos, sin, past_k, past_v, mask):
    import torch

    B, S, H, KV, D = cfg.batch, cfg.seq, cfg.heads, cfg.kv_heads, cfg.head_dim

    def norm(t, g):
        return _rms(t, g + 1, cfg.eps)

    def heads(t, n):
        return t.view(B, S, n, D).transpose(1, 2)

    h = norm(x, P["input_norm"])
    q, k, v = heads(h @ P["w_q"], H), heads(h @ P["w_k"], KV), heads(h @ P["w_v"], KV)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q, k = _rope(q, cos, sin, D), _rope(k, cos, sin, D)
    new_k, new_v = _append_kv(cfg, past_k, k), _append_kv(cfg, past_v, v)
    scores = ((q @ _repeat_kv(new_k, H // KV).transpose(-1, -2)) * cfg.query_pre_attn_scalar ** -0.5).float()
    scores = torch.tanh(scores / cfg.softcap) * cfg.softcap + mask.float()
    probs = torch.softmax(scores, dim=-1).to(x.dtype)
    attn = (probs @ _repeat_kv(new_v, H // KV)).transpose(1, 2).reshape(B, S, H * D)
    x = x + norm(attn @ P["w_o"], P["post_attn_norm"])
    h = norm(x, P["pre_ffw_norm"])
    mlp = (torch.nn.functional.gelu(h @ P["w_gate"], approximate="tanh") * (h @ P["w_up"])) @ P["w_down"]
    return x + norm(mlp, P["post_ffw_norm"]), new_k, new_v


def _shufflenet_unit_torch(P, cfg: ShuffleNetConfig, x):
    import torch
    import torch.nn.functional as F

    N, C, Hh, W = x.shape
    c = C // 2
    x1, x2 = x.chunk(2, dim=1)
    y = F.relu(F.conv2d(x2, P["w_pw1"]) + P["b_pw1"])
    y = F.conv2d(y, P["w_dw"], padding=1, groups=c) + P["b_dw"]
    y = F.relu(F.conv2d(y, P["w_pw2"]) + P["b_pw2"])
    y = torch.cat([x1, y], dim=1)
    return y.view(N, 2, c, Hh, W).transpose(1, 2).reshape(N, C, Hh, W)


def _effvit_torch(P, cfg: EffViTConfig, x):
    import torch
    import torch.nn.functional as F

    N, C, Hh, W = x.shape
    d, td = cfg.dim, cfg.channels
    heads = td // d
    qkv = F.conv2d(x, P["w_qkv"])
    agg = F.conv2d(F.conv2d(qkv, P["w_agg_dw"], padding=cfg.scale // 2, groups=3 * td), P["w_agg_pw"],
                   groups=3 * heads)
    t = torch.cat([qkv, agg], dim=1).reshape(N, -1, 3 * d, Hh * W)
    q, k, v = F.relu(t[:, :, :d]), F.relu(t[:, :, d:2 * d]), t[:, :, 2 * d:]
    v = F.pad(v, (0, 0, 0, 1), mode="constant", value=1)
    out = (v @ k.transpose(-1, -2)) @ q
    out = out[:, :, :-1] / (out[:, :, -1:] + cfg.eps_value)
    out = out.reshape(N, -1, Hh, W)
    return x + F.conv2d(out, P["w_proj"]) + P["b_proj"]


def _c3k2_torch(P, cfg: C3k2Config, x):
    import torch
    import torch.nn.functional as F

    def conv(t, key, pad=0):
        return F.silu(F.conv2d(t, P["w_" + key], padding=pad) + P["b_" + key])

    y = list(conv(x, "cv1").chunk(2, dim=1))
    for i in range(cfg.n):
        y.append(y[-1] + conv(conv(y[-1], f"m{i}_cv1", 1), f"m{i}_cv2", 1))
    return conv(torch.cat(y, dim=1), "cv2")


def _shufflenet_v2_torch(P, cfg: ShuffleNetV2Config, x):
    import torch
    import torch.nn.functional as F

    def conv(t, key, stride=1, pad=0, groups=1, relu=True):
        y = F.conv2d(t, P["w_" + key], stride=stride, padding=pad, groups=groups) + P["b_" + key]
        return F.relu(y) if relu else y

    def shuffle(t):
        N, C, Hh, W = t.shape
        return t.view(N, 2, C // 2, Hh, W).transpose(1, 2).reshape(N, C, Hh, W)

    x = F.max_pool2d(conv(x, "stem", 2, 1), 3, 2, 1)
    for name, stride, inp, oup in _shufflenet_v2_plan(cfg):
        c = oup // 2
        if stride == 1:
            x1, x2 = x.chunk(2, dim=1)
        else:
            x1, x2 = conv(conv(x, f"{name}_b1dw", 2, 1, groups=inp, relu=False), f"{name}_b1pw"), x
        y = conv(conv(conv(x2, f"{name}_pw1"), f"{name}_dw", stride, 1, groups=c, relu=False), f"{name}_pw2")
        x = shuffle(torch.cat([x1, y], dim=1))
    x = conv(x, "last").mean(dim=(2, 3))
    return x @ P["w_fc"] + P["b_fc"]


WORKLOADS: Dict[str, Workload] = {w.name: w for w in [
    Workload("llama_decode", LlamaConfig, models.llama_decoder_layer, _llama_torch,
             real_overrides=dict(ctx=4096, seq=1), small_overrides=dict(seq=1),
             description="Llama-3-8B decoder layer, decode 1 token, KV cache 4096"),
    Workload("llama_prefill", LlamaConfig, models.llama_decoder_layer, _llama_torch,
             real_overrides=dict(ctx=0, seq=512), small_overrides=dict(ctx=0, seq=16),
             description="Llama-3-8B decoder layer, prefill 512 tokens, causal mask"),
    Workload("gemma2_decode", Gemma2Config, gemma2_decoder_layer, _gemma2_torch,
             inputs_fn=_gemma2_inputs,
             description="Gemma-2-9B decoder layer (local attention, window 4096, softcap 50), decode, cache 4096"),
    # HF's StaticCache: the caches have rows reserved for the new token, updated in place by vtc
    # (stock copies the whole cache in its slice_scatter).
    Workload("llama_decode_static", LlamaConfig, models.llama_decoder_layer, _llama_torch,
             real_overrides=dict(ctx=4096, seq=1, kv_cache="static"), small_overrides=dict(seq=1, kv_cache="static"),
             inplace=("past_k", "past_v"),
             description="Llama-3-8B decoder layer, decode 1 token, static KV cache 4096 + 1 updated in place"),
    Workload("gemma2_decode_static", Gemma2Config, gemma2_decoder_layer, _gemma2_torch,
             real_overrides=dict(kv_cache="static"), small_overrides=dict(kv_cache="static"),
             inputs_fn=_gemma2_inputs, inplace=("past_k", "past_v"),
             description="Gemma-2-9B decoder layer, decode, static KV cache 4096 + 1 updated in place"),
    Workload("effvit_attn", EffViTConfig, effvit_attention, _effvit_torch,
             description="EfficientViT-B1 LiteMLA block (128 ch, 32x32, scales (5,)) + residual"),
    Workload("yolo_c3k2", C3k2Config, yolo_c3k2, _c3k2_torch,
             description="YOLOv11n C3k2 block (model.2: 32->64 ch, e=0.25, n=1) at 160x160"),
    Workload("shufflenet_unit", ShuffleNetConfig, models.shufflenet_unit, _shufflenet_unit_torch,
             description="ShuffleNetV2 1.0x stage-2 stride-1 unit (116 ch, 28x28)"),
    Workload("shufflenet_v2", ShuffleNetV2Config, shufflenet_v2, _shufflenet_v2_torch,
             inputs_fn=_kaiming_inputs, description="ShuffleNetV2 1.0x, whole network, 224x224"),
]}


# ----------------------------------------------------------------------------------------------
# torch side: one module per workload holding the same weights
# ----------------------------------------------------------------------------------------------
def has_torch_twin(workload) -> bool:
    """Whether ``workload`` has a PyTorch peer: a torch forward, or a module of its own (the whole
    models: their ONNX graph run with torch ops, :mod:`benchmarks.onnx_torch`)."""
    return getattr(workload, "torch_forward", None) is not None or hasattr(workload, "torch_module")


def torch_module(workload: Workload, cfg):
    """An ``nn.Module`` computing ``workload`` for ``cfg``; weights are buffers named like the Relax
    parameters (empty until :func:`load_torch`), ``forward`` takes the activations in order and
    hands the module itself to the torch forward as its ``P`` (``P[name]`` is the buffer). A
    workload with a ``torch_module(cfg)`` of its own (weights inside) gives that instead."""
    if hasattr(workload, "torch_module"):
        return workload.torch_module(cfg)
    import torch

    class _Module(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.names: List[str] = []

        def __getitem__(self, name):  # ``P["w_q"]`` in the forwards: the buffer itself, no dict per call
            return getattr(self, name)

        def forward(self, *acts):
            return workload.torch_forward(self, cfg, *acts)

    mod = _Module()
    mod.__class__.__name__ = workload.name
    return mod


def load_torch(module, mod: tvm.IRModule, arrays: Sequence[np.ndarray], device="cpu"):
    """Copy the weights among ``arrays`` (ordered as ``mod["main"].params``) into ``module`` and return
    the activations as torch tensors on ``device``, in ``forward`` order."""
    import torch

    acts = []
    for p, a in zip(mod["main"].params, arrays):
        t = torch.from_numpy(np.ascontiguousarray(a)).to(device)
        if is_weight(p.name):
            if p.name not in module.names:
                module.names.append(p.name)
            module.register_buffer(p.name, t)
        else:
            acts.append(t)
    return module.to(device), acts
