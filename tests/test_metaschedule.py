"""MetaSchedule works end to end in this environment: tune, store, reload, apply, run."""

import functools
import importlib
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
