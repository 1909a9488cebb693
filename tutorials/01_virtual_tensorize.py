"""Tutorial 1: remove a transpose and a GQA expansion with VirtualTensorize.

Run:  .venv/bin/python tutorials/01_virtual_tensorize.py

A TVM user writes ``relax.transform.VirtualTensorize()`` in their pipeline (or uses the
``"vtc"`` pipeline). This script shows what the pass decides, what the rewritten kernel looks
like, and checks the numbers against stock TVM.
"""

import numpy as np
import tvm
from tvm import relax
from tvm.relax import op as R

import vtc_tvm  # noqa: F401  (registers relax.transform.VirtualTensorize and the "vtc" pipeline)

# 1. A Relax module the way importers produce it: q @ repeat_kv(k)^T, as in Llama's attention.
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

# 2. The pass: the movement chain becomes one mapping, the matmul reads k through it.
decisions = []
vmod = relax.transform.VirtualTensorize(report=decisions)(mod)
for d in decisions:
    print(f"{d['tensor']} -> {d['consumer']}: {'virtual' if d['virtual'] else 'physical'} ({d['reason']})")
rewritten = next(f for gv, f in vmod.functions_items() if gv.name_hint.endswith("_vtc"))
print("mapping recorded on the kernel:", rewritten.attrs["vtc.virtual_inputs"])

# 3. Compile both with the same (fused) default pipeline and compare on fresh random inputs.
target = tvm.target.Target("llvm")
rng = np.random.default_rng()
args = [rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32") for p in mod["main"].params]
results = []
for m in (mod, vmod):
    ex = tvm.compile(m, target=target, relax_pipeline=relax.get_default_pipeline(target))
    results.append(relax.VirtualMachine(ex, tvm.cpu())["main"](*map(tvm.runtime.tensor, args)).numpy())
np.testing.assert_allclose(results[1], results[0], rtol=1e-6, atol=1e-6)

# 4. Or in one call: the "vtc" pipeline = VirtualTensorize + the stock pipeline (+ store side).
ex = tvm.compile(mod, target=target, relax_pipeline=relax.get_pipeline("vtc", target=target))
got = relax.VirtualMachine(ex, tvm.cpu())["main"](*map(tvm.runtime.tensor, args)).numpy()
np.testing.assert_allclose(got, results[0], rtol=1e-6, atol=1e-6)
print("stock and vtc agree")
