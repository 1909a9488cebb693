"""The built-in models compute what they claim: TVM (fused LLVM build) vs an independent numpy version."""

import math

import numpy as np
import pytest
import tvm

from vtc_tvm.models import (
    BUILTIN_MODELS,
    LlamaConfig,
    ShuffleNetConfig,
    build_model,
    llama_decoder_layer,
    random_inputs,
    shufflenet_unit,
)
from vtc_tvm.report import compile_variants, run_vm


def _rms_norm(x, g, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def llama_reference(cfg: LlamaConfig, p: dict) -> list[np.ndarray]:
    B, S, H, KV, D = cfg.batch, cfg.seq, cfg.heads, cfg.kv_heads, cfg.head_dim

    def heads(t, n):
        return t.reshape(B, S, n, D).transpose(0, 2, 1, 3)

    def rope(t):  # rotate_half as a 90-degree rotation of the (i, i + D/2) pairs
        lo, hi = t[..., : D // 2], t[..., D // 2 :]
        c, s = p["cos"][:, None, :, : D // 2], p["sin"][:, None, :, : D // 2]
        return np.concatenate([lo * c - hi * s, hi * c + lo * s], axis=-1)

    h = _rms_norm(p["x"], p["input_norm"], cfg.eps)
    q, k, v = rope(heads(h @ p["w_q"], H)), rope(heads(h @ p["w_k"], KV)), heads(h @ p["w_v"], KV)
    new_k = np.concatenate([p["past_k"], k], axis=2)
    new_v = np.concatenate([p["past_v"], v], axis=2)
    kr, vr = np.repeat(new_k, H // KV, axis=1), np.repeat(new_v, H // KV, axis=1)  # head h uses kv h // n_rep
    scores = np.einsum("bhsd,bhtd->bhst", q, kr) / math.sqrt(D) + p.get("mask", 0)
    attn = np.einsum("bhst,bhtd->bshd", _softmax(scores), vr).reshape(B, S, H * D)
    x = p["x"] + attn @ p["w_o"]
    h = _rms_norm(x, p["post_norm"], cfg.eps)
    g = h @ p["w_gate"]
    return [x + (g / (1 + np.exp(-g)) * (h @ p["w_up"])) @ p["w_down"], new_k, new_v]


def shufflenet_reference(cfg: ShuffleNetConfig, p: dict) -> list[np.ndarray]:
    N, C, H, W = p["x"].shape
    c = C // 2

    def pointwise(t, w, b):
        return np.einsum("oi,nihw->nohw", w[:, :, 0, 0], t) + b

    def depthwise(t, w, b):
        tp = np.pad(t, ((0, 0), (0, 0), (1, 1), (1, 1)))
        taps = [(dy, dx) for dy in range(3) for dx in range(3)]
        return sum(w[None, :, 0, dy, dx, None, None] * tp[:, :, dy : dy + H, dx : dx + W] for dy, dx in taps) + b

    relu = lambda t: np.maximum(t, 0)  # noqa: E731
    y = relu(pointwise(p["x"][:, c:], p["w_pw1"], p["b_pw1"]))
    y = relu(pointwise(depthwise(y, p["w_dw"], p["b_dw"]), p["w_pw2"], p["b_pw2"]))
    y = np.concatenate([p["x"][:, :c], y], axis=1)
    # channel shuffle with 2 groups: output channel 2*i + g is input channel g*c + i
    return [np.stack([y[:, :c], y[:, c:]], axis=2).reshape(N, C, H, W)]


CASES = {
    "llama-decode": (llama_decoder_layer, llama_reference, LlamaConfig.small()),
    "llama-prefill": (llama_decoder_layer, llama_reference, LlamaConfig.small(seq=4)),
    "llama-mha": (llama_decoder_layer, llama_reference, LlamaConfig.small(kv_heads=4)),
    "shufflenet": (shufflenet_unit, shufflenet_reference, ShuffleNetConfig.small()),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_model_matches_numpy(case):
    builder, reference, cfg = CASES[case]
    mod = builder(cfg)
    inputs = random_inputs(mod, seed=7)
    names = [p.name for p in mod["main"].params]
    want = reference(cfg, {n: a.astype("float64") for n, a in zip(names, inputs)})
    for variant, (_, ex) in compile_variants(mod, "llvm").items():  # stock and vtc
        got = run_vm(ex, tvm.cpu(), inputs)
        assert len(got) == len(want), variant
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=variant)
            assert np.abs(w).max() > 0.1  # the random scaling keeps values alive (no dead relu / softmax)


@pytest.mark.parametrize("name", sorted(BUILTIN_MODELS))
def test_real_size_shapes_and_dtype(name):
    # Only builds IR: real sizes are for the GPU, but their shapes and dtypes must be right.
    mod = build_model(name, "real", dtype="float16")
    ret = mod["main"].ret_ty
    outs = ret.fields if hasattr(ret, "fields") else [ret]
    shapes = [tuple(int(d) for d in o.shape) for o in outs]
    if name == "llama":
        assert shapes == [(16, 1, 4096), (16, 8, 4097, 128), (16, 8, 4097, 128)]
    else:
        assert shapes == [(16, 116, 28, 28)]
    assert all(str(o.dtype) == "float16" for o in outs)
    assert all(str(p.ty.dtype) == "float16" for p in mod["main"].params)


def test_random_inputs_fresh_and_reproducible():
    mod = build_model("llama", dtype="float16")
    a, b, c = random_inputs(mod, 0), random_inputs(mod, 0), random_inputs(mod, 1)
    assert [x.dtype for x in a] == [np.float16] * len(a)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0], c[0])
