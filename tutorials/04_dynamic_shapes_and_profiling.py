"""
.. _tutorial-dynamic-shapes:

Dynamic batch and sequence dimensions, and letting the device decide
====================================================================

Real deployments compile once for any sequence length. Symbolic dimensions flow through
VirtualTensorize's mappings: the attention below reads the KV cache -- past tokens (length
``m``) concatenated with the new ones (length ``n``), heads split out of the projection -- without
materialising the concatenation or the head transposes, for every ``m`` and ``n``.

The default strategy predicts from contiguity classes; ``profile=True`` also times each accepted
edge on the target's device (copy + original consumer against the rewritten consumer) and keeps
only the rewrites that are not slower. Timing needs concrete sizes, so a symbolic edge is not
profiled (its reason says so); here a static instance is profiled on the CPU (a GPU build
profiles on the GPU the same way, with ``target=vtc_tvm.pipeline.cuda_target()``).

Run it as a script: ``.venv/bin/python tutorials/04_dynamic_shapes_and_profiling.py``.
"""

# %%
# An attention over a growing KV cache
# ------------------------------------
# ``n`` new tokens, ``m`` cached ones: both symbolic.

import numpy as np
import tvm
from tvm import relax
from tvm.relax import op as R

import vtc_tvm  # noqa: F401  (registers relax.transform.VirtualTensorize)

HEADS, DIM = 4, 32


def attention(n, m):
    """softmax(q @ cat(past_k, k_new)^T) per head; n new tokens, m cached ones."""
    q = relax.Var("q", relax.TensorType((n, HEADS * DIM), "float32"))
    k_new = relax.Var("k_new", relax.TensorType((n, HEADS * DIM), "float32"))
    past_k = relax.Var("past_k", relax.TensorType((HEADS, m, DIM), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [q, k_new, past_k]):
        with bb.dataflow():
            qh = bb.emit(R.permute_dims(R.reshape(q, (n, HEADS, DIM)), [1, 0, 2]))  # (heads, n, dim)
            kh = bb.emit(R.permute_dims(R.reshape(k_new, (n, HEADS, DIM)), [1, 0, 2]))
            k = bb.emit(R.concat([past_k, kh], axis=1))  # (heads, m + n, dim): the grown cache
            scores = bb.emit_output(R.nn.softmax(R.matmul(qh, R.permute_dims(k, [0, 2, 1])), axis=-1))
        bb.emit_func_output(scores)
    return bb.get()


def show(report):
    for d in report:
        print(f"  {d['tensor']:>4} -> {d['consumer']:<8} {'virtual ' if d['virtual'] else 'physical'}  {d['reason']}")


# %%
# One module for every length
# ---------------------------
mod = attention(tvm.tirx.Var("n", "int64"), tvm.tirx.Var("m", "int64"))
report = []
vtc_mod = relax.transform.VirtualTensorize(target="llvm", report=report)(mod)
print("symbolic n, m:")
show(report)

# %%
# One build serves every (m, n)
# -----------------------------
# Checked against stock TVM at a few lengths.
target = tvm.target.Target("llvm")
builds = {name: relax.VirtualMachine(tvm.compile(m_, target, relax_pipeline=relax.get_default_pipeline(target)),
                                     tvm.cpu()) for name, m_ in (("stock", mod), ("vtc", vtc_mod))}
rng = np.random.default_rng(0)
for m_len, n_len in ((7, 1), (30, 5), (1, 12)):
    args = [rng.standard_normal((n_len, HEADS * DIM)).astype("float32"),
            rng.standard_normal((n_len, HEADS * DIM)).astype("float32"),
            rng.standard_normal((HEADS, m_len, DIM)).astype("float32")]
    outs = {k: vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy() for k, vm in builds.items()}
    np.testing.assert_allclose(outs["vtc"], outs["stock"], rtol=1e-5, atol=1e-6)
    print(f"m={m_len:>2} n={n_len:>2}: vtc == stock, output {outs['vtc'].shape}")

# %%
# A static instance, profiled
# ---------------------------
# The CPU times copy + consumer against the rewritten consumer, edge by edge.
report = []
relax.transform.VirtualTensorize(target="llvm", profile=True, report=report)(attention(16, 240))
print("static n=16, m=240, profiled on the CPU:")
show(report)
assert report and all("profiled:" in d["reason"] for d in report)
