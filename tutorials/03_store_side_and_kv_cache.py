"""
.. _tutorial-store-side:

Producers that write into their destination, and an in-place KV-cache update
============================================================================

Store side: the inputs of a concat become views of the concat's output, and the kernels that
produce them store straight into their slice (the "vtc" pipeline does this after FuseTIR).
In place: ``VirtualTensorize(inplace=["cache"])`` lets a scatter into the ``cache`` parameter
write only the new rows into the caller's tensor, instead of copying the whole cache; and when a
kernel of ours computes those rows (a K projection), it stores them into the cache itself.
It runs on the CPU (its checks read CPU kernel names; on CUDA, see the README's limits of the
in-place updates).

Run it as a script: ``.venv/bin/python tutorials/03_store_side_and_kv_cache.py``.
"""

# %%
# Two GEMMs whose results are concatenated
# ----------------------------------------
# A YOLO / DenseNet pattern. With the store side, each GEMM writes its slice of the concat.

import numpy as np
import tvm
from tvm import relax
from tvm.relax import op as R

import vtc_tvm
from vtc_tvm.pipeline import vtc_pipeline
from vtc_tvm.report import kernel_census

target = tvm.target.Target("llvm")
rng = np.random.default_rng()

x = relax.Var("x", relax.TensorType((64, 32), "float32"))
w1 = relax.Var("w1", relax.TensorType((32, 48), "float32"))
w2 = relax.Var("w2", relax.TensorType((32, 16), "float32"))
bb = relax.BlockBuilder()
with bb.function("main", [x, w1, w2]):
    with bb.dataflow():
        a = bb.emit(R.nn.relu(bb.emit(R.matmul(x, w1))))
        b = bb.emit(R.matmul(x, w2))
        out = bb.emit_output(R.concat([a, b], axis=1))
    bb.emit_func_output(out)
mod = bb.get()

stock = kernel_census(mod, target)
vtc = kernel_census(vtc_tvm.VirtualTensorize()(mod), target, stores=True)
print(f"stock: {stock['kernels']} kernels ({stock['data_movement']} copies), {stock['planned_bytes']} B of intermediates")
print(f"vtc:   {vtc['kernels']} kernels ({vtc['data_movement']} copies), {vtc['planned_bytes']} B of intermediates")

args = [rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32") for p in mod["main"].params]
results = []
for pipeline in (relax.get_default_pipeline(target), relax.get_pipeline("vtc", target=target)):
    ex = tvm.compile(mod, target=target, relax_pipeline=pipeline)
    results.append(relax.VirtualMachine(ex, tvm.cpu())["main"](*map(tvm.runtime.tensor, args)).numpy())
np.testing.assert_allclose(results[1], results[0], rtol=1e-6, atol=1e-6)

# %%
# A KV cache updated in place
# ---------------------------
# ``scatter_nd`` at a runtime position; ``inplace=["cache"]`` writes only the new rows into the
# caller's tensor.
B, H, T, D = 1, 2, 16, 8
cache = relax.Var("cache", relax.TensorType((B, H, T, D), "float32"))
rows = relax.Var("rows", relax.TensorType((B, H, 1, D), "float32"))
where = relax.Var("where", relax.TensorType((B, H, 1, 3), "int64"))  # (b, h, position)
bb = relax.BlockBuilder()
with bb.function("main", [cache, rows, where]):
    with bb.dataflow():
        out = bb.emit_output(R.scatter_nd(cache, where, rows, reduction="update"))
    bb.emit_func_output(out)
kv = bb.get()

decisions = []
kv_inplace = vtc_tvm.VirtualTensorize(inplace=["cache"], report=decisions)(kv)
print(decisions[-1]["reason"])
pos = 5
cache_np = rng.standard_normal((B, H, T, D)).astype("float32")
rows_np = rng.standard_normal((B, H, 1, D)).astype("float32")
b, h = np.meshgrid(np.arange(B), np.arange(H), indexing="ij")
where_np = np.stack([b, h, np.full_like(b, pos)], -1)[:, :, None, :].astype("int64")
cache_tvm = tvm.runtime.tensor(cache_np)
ex = tvm.compile(kv_inplace, target=target, relax_pipeline=relax.get_default_pipeline(target))
relax.VirtualMachine(ex, tvm.cpu())["main"](cache_tvm, tvm.runtime.tensor(rows_np), tvm.runtime.tensor(where_np))
expected = cache_np.copy()
expected[:, :, pos] = rows_np[:, :, 0]
np.testing.assert_array_equal(cache_tvm.numpy(), expected)  # the caller's cache was updated

# %%
# The producer stores into the cache
# ----------------------------------
# The rows come from a K projection and a RoPE-like scaling: with the ``"vtc"`` pipeline the
# scaling kernel reads the projection through the reshape/transpose (load side) and stores its
# rows into the cache at ``where`` (store side): the rows never exist as a tensor of their own.
x = relax.Var("x", relax.TensorType((B, 1, 16), "float32"))
wk = relax.Var("wk", relax.TensorType((16, H * D), "float32"))
cos = relax.Var("cos", relax.TensorType((B, 1, 1, D), "float32"))
bb = relax.BlockBuilder()
with bb.function("main", [cache, x, wk, cos, where]):
    with bb.dataflow():
        k = bb.emit(R.permute_dims(bb.emit(R.reshape(bb.emit(R.matmul(x, wk)), (B, 1, H, D))), [0, 2, 1, 3]))
        out = bb.emit_output(R.scatter_nd(cache, where, bb.emit(R.multiply(k, cos)), reduction="update"))
    bb.emit_func_output(out)
proj = bb.get()
with target:
    lowered = vtc_pipeline(target, inplace=["cache"])(proj)
kernels = sorted(gv.name_hint for gv, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc))
print("kernels:", kernels)  # the matmul, and the scaling writing into the cache ("..._into_...")
assert any("_into_" in k for k in kernels) and len(kernels) == 2
x_np, wk_np, cos_np = (rng.standard_normal([int(d) for d in v.ty.shape]).astype("float32") for v in (x, wk, cos))
cache_tvm = tvm.runtime.tensor(cache_np)
ex = tvm.compile(proj, target=target, relax_pipeline=vtc_pipeline(target, inplace=["cache"]))
relax.VirtualMachine(ex, tvm.cpu())["main"](cache_tvm, *map(tvm.runtime.tensor, (x_np, wk_np, cos_np, where_np)))
expected = cache_np.copy()
expected[:, :, pos] = (x_np @ wk_np).reshape(B, H, D) * cos_np[:, 0]
np.testing.assert_allclose(cache_tvm.numpy(), expected, rtol=1e-5, atol=1e-5)
print("concat producers and the in-place KV cache agree with stock TVM / numpy")
