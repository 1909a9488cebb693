"""Built-in models, built in code as high-level Relax the way frontends emit them.

Every builder returns an IRModule whose ``main`` takes inputs and weights as parameters (static
shapes) and computes inside one dataflow block, with the data-movement ops (permute_dims, reshape,
strided_slice, split, concat, expand_dims, broadcast_to) spelled out as importers produce them.

Parameter names follow a convention that :func:`random_inputs` relies on:
``w_*`` weights (matmul ``(in, out)`` or conv ``OIHW``), ``b_*`` biases, ``*norm`` RMSNorm gains,
``cos``/``sin`` rotary tables, ``mask`` an additive causal mask; anything else is an activation.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import tvm
from tvm import relax
from tvm.relax import op as R


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """One Llama-3 decoder layer; defaults are Llama-3-8B decoding 1 token with a 4096-long cache."""

    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 14336
    batch: int = 16
    ctx: int = 4096  # length of the past KV cache
    seq: int = 1  # new tokens: 1 = decode, > 1 = prefill (then a causal mask is an input)
    eps: float = 1e-5
    dtype: str = "float32"
    # "grow": new_k = concat(past_k, k), a new tensor; "static": past_k has room for the new
    # tokens (ctx + seq rows), which are written at rows ctx.. (slice_scatter; HF's StaticCache):
    # with VirtualTensorize(inplace=["past_k", "past_v"]) the cache is updated in place.
    kv_cache: str = "grow"

    @classmethod
    def small(cls, **kw) -> "LlamaConfig":
        small = cls(hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=512, batch=2, ctx=32)
        return dataclasses.replace(small, **kw)

    @classmethod
    def real(cls, **kw) -> "LlamaConfig":
        return cls(**kw)


@dataclasses.dataclass(frozen=True)
class ShuffleNetConfig:
    """A ShuffleNetV2 stride-1 unit (NCHW); defaults are stage 2 of ShuffleNetV2 1.0x."""

    channels: int = 116
    height: int = 28
    width: int = 28
    batch: int = 16
    dtype: str = "float32"

    @classmethod
    def small(cls, **kw) -> "ShuffleNetConfig":
        return dataclasses.replace(cls(channels=16, height=8, width=8, batch=2), **kw)

    @classmethod
    def real(cls, **kw) -> "ShuffleNetConfig":
        return cls(**kw)


def _param(name, shape, dtype):
    return relax.Var(name, relax.TensorType(shape, dtype))


def _finish(bb: relax.BlockBuilder, params, build) -> tvm.IRModule:
    """Emit ``build(*params)`` as function ``main`` with a single dataflow block."""
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build(*params))
        bb.emit_func_output(out)
    return bb.get()


def kv_cache_len(cfg) -> int:
    """Rows of the ``past_k``/``past_v`` inputs: the past (``grow``) or past + new (``static``)."""
    if cfg.kv_cache not in ("grow", "static"):
        raise ValueError(f"kv_cache must be 'grow' or 'static', not {cfg.kv_cache!r}")
    return cfg.ctx + (cfg.seq if cfg.kv_cache == "static" else 0)


def append_kv(cfg, past, new):
    """The cache with the new rows at ``ctx..``: a concat (``grow``) or a ``slice_scatter`` into
    the rows reserved for them (``static``)."""
    if cfg.kv_cache == "static":
        return R.slice_scatter(past, new, cfg.ctx, cfg.ctx + cfg.seq, 1, axis=2)
    return R.concat([past, new], axis=2)


def llama_decoder_layer(cfg: LlamaConfig = LlamaConfig.small()) -> tvm.IRModule:
    """Llama-3 decoder layer as HF ``LlamaDecoderLayer`` traces it (eager attention, KV cache).

    ``main(x, cos, sin, past_k, past_v, [mask], weights...) -> (out, new_k, new_v)``.
    """
    B, S, T, D = cfg.batch, cfg.seq, cfg.ctx + cfg.seq, cfg.head_dim
    H, KV, hid, dt = cfg.heads, cfg.kv_heads, cfg.hidden, cfg.dtype
    n_rep = H // KV
    assert H % KV == 0 and D % 2 == 0
    bb = relax.BlockBuilder()
    emit = bb.emit
    cache_len = kv_cache_len(cfg)
    params = [
        _param("x", (B, S, hid), dt),
        _param("cos", (B, S, D), dt),
        _param("sin", (B, S, D), dt),
        _param("past_k", (B, KV, cache_len, D), dt),
        _param("past_v", (B, KV, cache_len, D), dt),
    ]
    if S > 1:
        params.append(_param("mask", (B, 1, S, T), dt))
    params += [
        _param("input_norm", (hid,), dt),
        _param("w_q", (hid, H * D), dt),
        _param("w_k", (hid, KV * D), dt),
        _param("w_v", (hid, KV * D), dt),
        _param("w_o", (H * D, hid), dt),
        _param("post_norm", (hid,), dt),
        _param("w_gate", (hid, cfg.intermediate), dt),
        _param("w_up", (hid, cfg.intermediate), dt),
        _param("w_down", (cfg.intermediate, hid), dt),
    ]

    def heads(t, n):  # (B, S, n*D) -> (B, n, S, D): view(...).transpose(1, 2)
        return emit(R.permute_dims(emit(R.reshape(t, (B, S, n, D))), [0, 2, 1, 3]))

    def rope(t, cos, sin):  # t * cos + rotate_half(t) * sin
        lo = emit(R.strided_slice(t, axes=[3], begin=[0], end=[D // 2]))
        hi = emit(R.strided_slice(t, axes=[3], begin=[D // 2], end=[D]))
        rot = emit(R.concat([emit(R.negative(hi)), lo], axis=3))
        return emit(R.add(emit(R.multiply(t, cos)), emit(R.multiply(rot, sin))))

    def repeat_kv(t):  # (B, KV, T, D) -> (B, H, T, D): [:, :, None].expand(...).reshape(...)
        if n_rep == 1:
            return t
        t = emit(R.broadcast_to(emit(R.expand_dims(t, 2)), (B, KV, n_rep, T, D)))
        return emit(R.reshape(t, (B, H, T, D)))

    def build(x, cos, sin, past_k, past_v, *rest):
        mask, rest = (rest[0], rest[1:]) if S > 1 else (None, rest)
        input_norm, w_q, w_k, w_v, w_o, post_norm, w_gate, w_up, w_down = rest
        h = emit(R.nn.rms_norm(x, input_norm, axes=-1, epsilon=cfg.eps))
        q, k, v = (heads(emit(R.matmul(h, w)), n) for w, n in ((w_q, H), (w_k, KV), (w_v, KV)))
        cos = emit(R.expand_dims(cos, 1))  # unsqueeze(1): broadcast over heads
        sin = emit(R.expand_dims(sin, 1))
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        new_k, new_v = (emit(append_kv(cfg, past, t)) for past, t in ((past_k, k), (past_v, v)))
        kt = emit(R.permute_dims(repeat_kv(new_k), [0, 1, 3, 2]))
        scores = emit(R.multiply(emit(R.matmul(q, kt)), relax.const(1 / math.sqrt(D), dt)))
        if mask is not None:
            scores = emit(R.add(scores, mask))
        if dt != "float32":  # HF: softmax(..., dtype=float32).to(q.dtype)
            probs = emit(R.astype(emit(R.nn.softmax(emit(R.astype(scores, "float32")))), dt))
        else:
            probs = emit(R.nn.softmax(scores, axis=-1))
        attn = emit(R.matmul(probs, repeat_kv(new_v)))
        attn = emit(R.reshape(emit(R.permute_dims(attn, [0, 2, 1, 3])), (B, S, H * D)))
        x = emit(R.add(x, emit(R.matmul(attn, w_o))))
        h = emit(R.nn.rms_norm(x, post_norm, axes=-1, epsilon=cfg.eps))
        gate = emit(R.nn.silu(emit(R.matmul(h, w_gate))))
        mlp = emit(R.matmul(emit(R.multiply(gate, emit(R.matmul(h, w_up)))), w_down))
        return relax.Tuple([emit(R.add(x, mlp)), new_k, new_v])

    return _finish(bb, params, build)


def shufflenet_unit(cfg: ShuffleNetConfig = ShuffleNetConfig.small()) -> tvm.IRModule:
    """ShuffleNetV2 stride-1 unit with batch-norm folded into conv biases.

    ``main(x, w_pw1, b_pw1, w_dw, b_dw, w_pw2, b_pw2) -> y``, all NCHW / OIHW.
    """
    N, C, Hh, W, dt = cfg.batch, cfg.channels, cfg.height, cfg.width, cfg.dtype
    assert C % 2 == 0
    c = C // 2
    bb = relax.BlockBuilder()
    emit = bb.emit
    params = [
        _param("x", (N, C, Hh, W), dt),
        _param("w_pw1", (c, c, 1, 1), dt),
        _param("b_pw1", (1, c, 1, 1), dt),
        _param("w_dw", (c, 1, 3, 3), dt),
        _param("b_dw", (1, c, 1, 1), dt),
        _param("w_pw2", (c, c, 1, 1), dt),
        _param("b_pw2", (1, c, 1, 1), dt),
    ]

    def conv(t, w, b, **kw):
        return emit(R.add(emit(R.nn.conv2d(t, w, **kw)), b))

    def build(x, w_pw1, b_pw1, w_dw, b_dw, w_pw2, b_pw2):
        halves = emit(R.split(x, 2, axis=1))  # x.chunk(2, dim=1)
        x1, x2 = emit(relax.TupleGetItem(halves, 0)), emit(relax.TupleGetItem(halves, 1))
        y = emit(R.nn.relu(conv(x2, w_pw1, b_pw1)))
        y = conv(y, w_dw, b_dw, padding=(1, 1), groups=c)
        y = emit(R.nn.relu(conv(y, w_pw2, b_pw2)))
        y = emit(R.concat([x1, y], axis=1))
        y = emit(R.reshape(y, (N, 2, c, Hh, W)))  # channel_shuffle(y, groups=2)
        y = emit(R.permute_dims(y, [0, 2, 1, 3, 4]))
        return R.reshape(y, (N, C, Hh, W))

    return _finish(bb, params, build)


BUILTIN_MODELS = {
    "llama": (llama_decoder_layer, LlamaConfig),
    "shufflenet": (shufflenet_unit, ShuffleNetConfig),
}


def build_model(name: str, size: str = "small", **config) -> tvm.IRModule:
    """``BUILTIN_MODELS[name]`` at ``size`` ("small" or "real"); ``config`` overrides fields (dtype=...)."""
    builder, cfg_cls = BUILTIN_MODELS[name]
    return builder(getattr(cfg_cls, size)(**config))


def random_inputs(mod: tvm.IRModule, seed: int = 0) -> list[np.ndarray]:
    """Fresh random numpy arrays for every parameter of ``main``, in order.

    Scaled so activations stay O(1) through the model (see the naming convention above): weights get
    std 1/sqrt(fan_in), so attention logits stay O(1) and softmax is not saturated.
    """
    rng = np.random.default_rng(seed)
    arrays = []
    for p in mod["main"].params:
        shape = tuple(int(d) for d in p.ty.shape)
        name = p.name
        if name.startswith("w_"):  # matmul (in, out) or conv OIHW
            fan_in = shape[0] if len(shape) == 2 else int(np.prod(shape[1:]))
            a = rng.standard_normal(shape) / math.sqrt(fan_in)
        elif name.startswith("b_"):
            a = 0.1 * rng.standard_normal(shape)
        elif name.endswith("norm"):
            a = 1 + 0.1 * rng.standard_normal(shape)
        elif name in ("cos", "sin"):  # rotate_half pairs element i with i + D/2: same angle
            theta = rng.uniform(0, 2 * math.pi, shape[:-1] + (shape[-1] // 2,))
            a = np.concatenate([theta, theta], axis=-1)
            a = np.cos(a) if name == "cos" else np.sin(a)
        elif name == "mask":  # (B, 1, S, T): query i sees the cache and new tokens <= i
            S, T = shape[-2:]
            a = np.where(np.arange(T)[None, :] <= np.arange(S)[:, None] + T - S, 0.0, -1e4)
            a = np.broadcast_to(a, shape)
        else:
            a = rng.standard_normal(shape)
        arrays.append(np.ascontiguousarray(a, dtype=str(p.ty.dtype)))
    return arrays
