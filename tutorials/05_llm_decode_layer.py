"""
.. _tutorial-llm-decode:

Compile an LLM decode layer with fewer copies
=============================================

One Llama-3 decoder layer decoding one token against a KV cache, written the way Hugging Face's
``LlamaDecoderLayer`` traces it: the q/k/v heads are split out of the projections by
reshape + transpose, RoPE slices and concatenates half of each head, the new keys and values
are concatenated to the cache, and grouped-query attention expands the cache to every query head
(``repeat_kv``) before two GEMMs. In stock TVM each of those is a copy kernel; the expanded,
transposed cache alone is read and written in full for every token.

This tutorial builds the layer at a small size, shows what ``VirtualTensorize`` decides, counts
kernels, copy kernels and planned memory for stock TVM and the ``"vtc"`` pipeline, and checks
that both compute the same. It runs on the CPU, or on CUDA when a GPU is present (the measured
H200 numbers of the real-size layer are in the README).

Run it as a script: ``.venv/bin/python tutorials/05_llm_decode_layer.py``.
"""

# %%
# The layer
# ---------
# ``vtc_tvm.models.llama_decoder_layer`` builds ``main(x, cos, sin, past_k, past_v, weights...)
# -> (out, new_k, new_v)``. The small configuration: hidden 256, 4 query heads and 2 key/value
# heads of dimension 64, a 32-token cache, batch 1.

import collections

import numpy as np
import tvm
from tvm import relax

import vtc_tvm
from vtc_tvm.models import LlamaConfig, llama_decoder_layer, random_inputs
from vtc_tvm.report import compile_variants, run_vm

cfg = LlamaConfig.small(batch=1)
mod = llama_decoder_layer(cfg)

MOVEMENT = {"relax.permute_dims", "relax.reshape", "relax.strided_slice", "relax.concat",
            "relax.broadcast_to", "relax.expand_dims"}
ops = collections.Counter()
relax.analysis.post_order_visit(
    mod["main"], lambda e: isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and ops.update([e.op.name]))
print("movement ops in main:", {k: v for k, v in sorted(ops.items()) if k in MOVEMENT})

# %%
# What the pass decides
# ---------------------
# Each edge from a movement chain to its consumer is taken (the consumer reads the sources
# through the composed mapping) or left physical, with the reason. The target matters: on a GPU
# a rewrite is only kept if DLight still schedules the consumer with the same rule.
gpu = tvm.cuda(0).exist
target = vtc_tvm.pipeline.cuda_target() if gpu else tvm.target.Target("llvm")
dev = tvm.cuda(0) if gpu else tvm.cpu(0)

decisions = []
relax.transform.VirtualTensorize(target=target, report=decisions)(mod)
for d in decisions:
    print(f"{d['tensor']:>12} -> {d['consumer']:<16} {'virtual ' if d['virtual'] else 'physical'} {d['reason']}")

# %%
# Kernels, copies and memory
# --------------------------
# ``compile_variants`` builds the module with the stock pipeline and with the ``"vtc"`` pipeline
# and counts, after TVM's fusion, the kernels ``main`` launches, how many of them only move
# data, and the intermediate memory the static planner allocates.
variants = compile_variants(mod, target)
for name, (census, _) in variants.items():
    print(f"{name:>5}: {census['kernels']} kernels, {census['data_movement']} copy kernels, "
          f"{census['planned_bytes'] / 1024:.1f} KiB planned")
stock, vtc = (variants[v][0] for v in ("stock", "vtc"))
assert vtc["data_movement"] < stock["data_movement"]

# %%
# Same numbers
# ------------
# Fresh random inputs (weights scaled so activations stay O(1)); all three outputs (the hidden
# state and the grown K/V caches) must agree.
inputs = random_inputs(mod, seed=int(np.random.default_rng().integers(1 << 30)))
outs = {name: run_vm(ex, dev, inputs) for name, (_, ex) in variants.items()}
for a, b in zip(outs["vtc"], outs["stock"]):
    err = np.linalg.norm(a - b) / np.linalg.norm(b)
    assert err < 1e-4, err
print("vtc == stock on", target.kind.name, "for", len(outs["vtc"]), "outputs")
