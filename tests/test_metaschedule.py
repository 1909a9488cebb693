"""MetaSchedule works end to end in this environment: tune, store, reload, apply, run."""

import functools
import importlib
import logging
from importlib.metadata import version

import numpy as np
import pytest
import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms

N = 64


def test_tvm_ffi_pin():
    assert version("apache-tvm-ffi") == "0.1.14.post0", (
        "apache-tvm-ffi must be 0.1.14.post0: with 0.1.15.post2 and apache-tvm 0.27.0.post1, "
        "IR serialization (tvm::ffi::ToJSONGraph) segfaults, which kills MetaSchedule tuning"
    )


def _matmul():
    a = te.placeholder((N, N), "float32", name="A")
    b = te.placeholder((N, N), "float32", name="B")
    k = te.reduce_axis((0, N), name="k")
    c = te.compute((N, N), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


@pytest.mark.slow
def test_tune_reload_and_apply(tmp_path):
    mod = _matmul()
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})  # llvm tuning requires num-cores
    # Build workers import tvm.s_tir.tensor_intrin inside the timed build (~15 s on 2 cores), so
    # warm them up front and raise the 30 s default timeout. A partial of a stdlib function
    # pickles by reference, unlike a function of this test module, which workers cannot import.
    warm = functools.partial(importlib.import_module, "tvm.s_tir.tensor_intrin")
    ms.tune_tir(
        mod=mod,
        target=target,
        work_dir=str(tmp_path),
        max_trials_global=8,
        num_trials_per_iter=8,
        builder=ms.builder.LocalBuilder(max_workers=2, timeout_sec=120, initializer=warm),
        runner=ms.runner.LocalRunner(timeout_sec=60),
        seed=0,
    )

    db = ms.database.JSONDatabase(work_dir=str(tmp_path))  # reopened from disk
    assert len(db) > 0, "no successful tuning record (all builds/runs failed?)"
    sch = ms.tir_integration.compile_tir(db, mod, target)
    assert sch is not None

    lib = tvm.compile(sch.mod, target=target)
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((N, N), dtype="float32") for _ in range(2))
    c = tvm.runtime.empty((N, N), "float32", tvm.cpu())
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
    np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_tune_rewritten_consumer_through_relax(tmp_path):
    """MetaSchedule tunes a consumer that reads through a mapping (GQA repeat_kv + transpose),
    its records reload, and the tuned module matches stock TVM."""
    from tvm import relax
    from tvm.relax import op as R

    import vtc_tvm

    q = relax.Var("q", relax.TensorType((1, 4, 2, 16), "float32"))
    k = relax.Var("k", relax.TensorType((1, 2, 32, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [q, k]):
        with bb.dataflow():
            kx = bb.emit(R.reshape(bb.emit(R.broadcast_to(bb.emit(R.expand_dims(k, [2])), (1, 2, 2, 32, 16))),
                                   (1, 4, 32, 16)))
            out = bb.emit_output(R.matmul(q, bb.emit(R.permute_dims(kx, [0, 1, 3, 2]))))
        bb.emit_func_output(out)
    mod = bb.get()
    vmod = vtc_tvm.VirtualTensorize(strategy="all")(mod)  # at this tiny size "contiguity" declines
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    warm = functools.partial(importlib.import_module, "tvm.s_tir.tensor_intrin")
    # MetaSchedule rebuilds its logging config from the handlers already on its logger and cannot
    # handle unnamed ones (pytest's capture handlers after an earlier tuning in this process).
    ms_logger = logging.getLogger("tvm.s_tir.meta_schedule")
    for handler in [h for h in ms_logger.handlers if h.get_name() is None]:
        ms_logger.removeHandler(handler)
    with target:
        fused = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                                          relax.transform.FuseOps(), relax.transform.FuseTIR()])(vmod)
        # One kernel: the matmul reads k un-expanded (no (1, 4, 32, 16) buffer anywhere).
        kernels = [f for _, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
        assert len(kernels) == 1 and all(tuple(int(d) for d in p.shape) != (1, 4, 32, 16)
                                         for p in kernels[0].params)
        ms.relax_integration.tune_relax(
            fused, params={}, target=target, work_dir=str(tmp_path), max_trials_global=4,
            num_trials_per_iter=4, seed=0,
            builder=ms.builder.LocalBuilder(max_workers=2, timeout_sec=120, initializer=warm),
            runner=ms.runner.LocalRunner(timeout_sec=60))
        db = ms.database.JSONDatabase(work_dir=str(tmp_path))  # reopened from disk
        assert len(db) > 0
        tuned = relax.transform.MetaScheduleApplyDatabase(str(tmp_path))(fused)
    assert any(f.attrs and f.attrs.get("tirx.is_scheduled") for _, f in tuned.functions_items()
               if isinstance(f, tvm.tirx.PrimFunc))
    rng = np.random.default_rng()
    args = [rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32") for p in mod["main"].params]

    def run(m):
        ex = tvm.compile(m, target=target, relax_pipeline=relax.get_default_pipeline(target))
        return relax.VirtualMachine(ex, tvm.cpu())["main"](*map(tvm.runtime.tensor, args)).numpy()

    np.testing.assert_allclose(run(tuned), run(mod), rtol=1e-5, atol=1e-5)
