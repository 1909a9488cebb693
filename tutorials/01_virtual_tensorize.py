"""
.. _tutorial-virtual-tensorize:

Remove a transpose and a GQA expansion with VirtualTensorize
============================================================

A TVM user writes ``relax.transform.VirtualTensorize()`` in their pipeline (or uses the
``"vtc"`` pipeline). This tutorial shows what the pass decides, what the rewritten kernel looks
like, and checks the numbers against stock TVM. It runs on the CPU, or on CUDA when a GPU is
present.

Run it as a script: ``.venv/bin/python tutorials/01_virtual_tensorize.py``.
"""

# %%
# A Relax module the way importers produce it
# -------------------------------------------
# ``q @ repeat_kv(k)^T``, as in Llama's attention: stock TVM materialises the 4x expanded keys
# and then a transposed copy of them before the matmul.

import numpy as np
import tvm
from tvm import relax
from tvm.relax import op as R

import vtc_tvm  # registers relax.transform.VirtualTensorize and the "vtc" pipeline

q = relax.Var("q", relax.TensorType((1, 8, 4, 64), "float32"))  # 8 query heads
k = relax.Var("k", relax.TensorType((1, 2, 64, 64), "float32"))  # 2 key/value heads (GQA)
bb = relax.BlockBuilder()
with bb.function("main", [q, k]):
    with bb.dataflow():
        k5 = bb.emit(R.expand_dims(k, [2]))
        k5 = bb.emit(R.broadcast_to(k5, (1, 2, 4, 64, 64)))
        kx = bb.emit(R.reshape(k5, (1, 8, 64, 64)))  # repeat_kv: a 4x copy in stock TVM
        kt = bb.emit(R.permute_dims(kx, [0, 1, 3, 2]))  # and a transposed copy of that
        out = bb.emit_output(R.matmul(q, kt))
    bb.emit_func_output(out)
mod = bb.get()

# %%
# The pass
# --------
# The movement chain becomes one mapping, and the matmul reads ``k`` through it. Every decision
# is reported (tensor, consumer, virtual or not, and why).
decisions = []
vmod = relax.transform.VirtualTensorize(report=decisions)(mod)
for d in decisions:
    print(f"{d['tensor']} -> {d['consumer']}: {'virtual' if d['virtual'] else 'physical'} ({d['reason']})")
rewritten = next(f for gv, f in vmod.functions_items() if gv.name_hint.endswith("_vtc"))
print("mapping recorded on the kernel:", rewritten.attrs["vtc.virtual_inputs"])

# %%
# Compile both and compare
# ------------------------
# Both modules go through the same (fused) default pipeline and run on fresh random inputs. On a
# GPU machine the target is CUDA (``vtc_tvm.pipeline.cuda_target()``), otherwise the CPU.
gpu = tvm.cuda(0).exist
target = vtc_tvm.pipeline.cuda_target() if gpu else tvm.target.Target("llvm")
dev = tvm.cuda(0) if gpu else tvm.cpu(0)
tol = 1e-4 if gpu else 1e-6  # GPU schedules sum in another order
rng = np.random.default_rng()
args = [rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32") for p in mod["main"].params]
results = []
for m in (mod, vmod):
    ex = tvm.compile(m, target=target, relax_pipeline=relax.get_default_pipeline(target))
    vm = relax.VirtualMachine(ex, dev)
    results.append(vm["main"](*[tvm.runtime.tensor(a, dev) for a in args]).numpy())
np.testing.assert_allclose(results[1], results[0], rtol=tol, atol=tol)

# %%
# Or in one call
# --------------
# The ``"vtc"`` pipeline is VirtualTensorize + the stock pipeline (+ the store side after
# ``FuseTIR``).
ex = tvm.compile(mod, target=target, relax_pipeline=relax.get_pipeline("vtc", target=target))
got = relax.VirtualMachine(ex, dev)["main"](*[tvm.runtime.tensor(a, dev) for a in args]).numpy()
np.testing.assert_allclose(got, results[0], rtol=tol, atol=tol)
print("stock and vtc agree on", target.kind.name)
