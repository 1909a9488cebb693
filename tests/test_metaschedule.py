"""MetaSchedule works end to end in this environment: tune, store, reload, apply, run."""

import functools
import importlib
from importlib.metadata import version

import numpy as np
import pytest
import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms

from vtc_tvm.tuning import ms_logger_without_unnamed_handlers

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
    ms_logger_without_unnamed_handlers()  # pytest's capture handlers, when tests/test_tuning.py tuned first
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
    with target:
        fused = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                                          relax.transform.FuseOps(), relax.transform.FuseTIR()])(vmod)
        # One kernel: the matmul reads k un-expanded (no (1, 4, 32, 16) buffer anywhere).
        kernels = [f for _, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
        assert len(kernels) == 1 and all(tuple(int(d) for d in p.shape) != (1, 4, 32, 16)
                                         for p in kernels[0].params)
        ms_logger_without_unnamed_handlers()
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


def _matmul_transpose_fp16(m=64, k=128, n=256):
    """``x @ w.T`` in float16: a transpose kernel + a tensor-core matmul for stock TVM."""
    from tests.conftest import matmul_transposed_weight

    return matmul_transposed_weight(m, k, n, "float16")


@pytest.mark.slow
def test_benchmark_tuning_flow_for_cuda_without_gpu(tmp_path):
    """The harnesses' MetaSchedule path (benchmarks/tuning.py) for the CUDA tensor-core space, with a
    fake runner: tune stock and vtc into one database, reload it from disk (and from the committed
    ``*.json.xz`` alone), apply it, compile for CUDA; the tuned matmuls use tensor cores."""
    import shutil

    from tvm import relax

    from benchmarks import tuning
    from vtc_tvm.pipeline import cuda_target
    from vtc_tvm.report import device_source, uses_tensor_cores

    builder = tuning.pooled_builder(workers=1)  # its worker imports tensor_intrin while we work
    target = cuda_target()
    mod = _matmul_transpose_fp16()
    work = tmp_path / "db"
    # MetaSchedule's own candidates only (the fake runner's times could make DLight's record win)
    settings = tuning.TuneSettings(trials=3, population=16, init_min_unmeasured=8, dlight_baseline=False)
    runner = tuning.fake_runner(seed=0)

    stats = {v: {} for v in ("stock", "vtc")}
    exes = {v: tuning.compile_metaschedule(mod, target, str(work), settings, variant=v, runner=runner,
                                           builder=builder, stats=stats[v]) for v in ("stock", "vtc")}
    # stock: transpose (left to DLight: not an anchor) + matmul; vtc: one matmul reading w transposed
    assert stats["stock"]["tasks"] == 2 and stats["stock"]["tuned"] == 1, stats
    assert stats["vtc"]["tasks"] == 1 and stats["vtc"]["tuned"] == 1, stats
    calls = runner.calls
    assert calls >= 2 * settings.trials - 1
    for v, ex in exes.items():
        assert uses_tensor_cores(ex), v
        if shutil.which("nvcc"):  # the tuned CUDA source compiles (to PTX with MMA instructions)
            from tvm.support import nvcc

            with target:
                ptx = nvcc.compile_cuda(device_source(ex, "cuda"), target_format="ptx", arch="sm_90",
                                        compiler="nvcc")
            assert b"mma" in bytes(ptx), v

    # A fresh JSONDatabase from the files on disk has both tuned matmuls; applying it schedules them.
    db = ms.database.JSONDatabase(work_dir=str(work))
    assert len(db) >= 2 * settings.trials - 1
    for v in ("stock", "vtc"):
        fused = tuning.fuse(mod, target, v)
        with target:
            applied = relax.transform.MetaScheduleApplyDatabase(str(work))(fused)
        assert [n for n in tuning.scheduled_kernels(applied) if "matmul" in n], (v, tuning.scheduled_kernels(applied))

    # The committed form (best record per workload, xz) is enough: nothing is tuned again.
    packed = tmp_path / "packed"
    packed.mkdir()
    for name in (tuning.WORKLOAD_FILE, tuning.RECORD_FILE):
        shutil.copy(work / (name + ".xz"), packed / (name + ".xz"))
    for v in ("stock", "vtc"):
        again = {}
        ex = tuning.compile_metaschedule(mod, target, str(packed), settings, variant=v, runner=runner,
                                         builder=builder, stats=again)
        assert again["tuned"] == 0 and again["in_db"] == stats[v]["tuned"], (v, again)
        assert again["ms_kernels"] == stats[v]["ms_kernels"] and uses_tensor_cores(ex)
    assert runner.calls == calls
    assert len(ms.database.JSONDatabase(work_dir=str(packed))) == 2  # one record per tuned workload


def test_baseline_time_guards_the_records(tmp_path):
    """Each tuned task's untuned schedule is measured by the same runner and kept next to the
    database (not as a record: our rules' traces do not replay); a record is applied only where
    it beats that time, so the tuned build is never worse than the untuned one."""
    import json

    from tvm import relax

    from benchmarks import tuning
    from vtc_tvm import tuning as vtuning
    from vtc_tvm.pipeline import cuda_target

    builder = tuning.pooled_builder(workers=1)
    target = cuda_target()
    fused = tuning.fuse(_matmul_transpose_fp16(), target, "vtc")
    counts = {}
    for baseline in (False, True):
        work = tmp_path / f"db{int(baseline)}"
        settings = tuning.TuneSettings(trials=2, population=16, init_min_unmeasured=8, dlight_baseline=baseline)
        runner = tuning.fake_runner(seed=0)
        tuning.tune([fused], target, str(work), settings, runner=runner, builder=builder)
        db = ms.database.JSONDatabase(work_dir=str(work))
        counts[baseline] = (len(db), runner.calls, vtuning.load_baselines(str(work)))
    assert counts[True][0] == counts[False][0], counts  # no record of its own ...
    assert counts[True][1] == counts[False][1] + 1, counts  # ... measured by the same runner ...
    assert counts[False][2] == {} and len(counts[True][2]) == 1, counts  # ... and kept beside the database
    work = tmp_path / "db1"
    db = ms.database.JSONDatabase(work_dir=str(work))
    for base_us, applied in ((1e9, True), (0.0, False)):  # slower than every record / faster
        (key,) = vtuning.load_baselines(str(work))
        (work / vtuning.BASELINE_FILE).write_text(json.dumps({key: base_us}))
        out = vtuning.apply_database(fused, target, db, str(work))
        assert bool([n for n in tuning.scheduled_kernels(out) if "matmul" in n]) is applied, base_us
    with target:  # the unguarded application still takes the record
        assert [n for n in tuning.scheduled_kernels(relax.transform.MetaScheduleApplyDatabase(str(work))(fused))
                if "matmul" in n]


def test_vtc_baseline_is_our_rules_then_dlight():
    """The ``"vtc_tuning"`` pipeline's baseline is the schedule of the ``"vtc"`` build: our rules
    first, then exactly TVM's list; the stock build's is TVM's list."""
    from vtc_tvm import schedules
    from vtc_tvm import tuning as vtuning
    from vtc_tvm.pipeline import cuda_target

    target = cuda_target()
    ours, stock = schedules.our_rules(target), schedules.stock_rules(target)
    assert [type(getattr(r, "rule", r)) for r in vtuning.baseline_rules("vtc", target)] == [type(r) for r in ours + stock]
    assert [type(r) for r in vtuning.baseline_rules("dlight", target)] == [type(r) for r in stock]
    assert vtuning._with_baseline(None, None, True).baseline == "vtc"
    assert vtuning._with_baseline(None, None, False).baseline == "dlight"


@pytest.mark.slow
def test_paper_harness_metaschedule_dry(tmp_path):
    """``benchmarks.run --tuner ms:N --dry`` for CUDA with the fake runner: every case's anchor
    kernels are tuned up front into <tuning dir>/<workload>, the builds then find them all."""
    import json

    from benchmarks import run as bench
    from benchmarks import tuning

    tuning.pooled_builder(1)  # shared with the test above when both run (one warm-up)
    rc = bench.main(["--suite", "paper", "--target", "cuda", "--size", "small", "--batch", "1", "--dry",
                     "--cases", "shufflenet_unit", "--tuner", "ms:2", "--ms-fake-runner", "--ms-builders", "1",
                     "--ms-population", "8", "--tuning-dir", str(tmp_path / "tuning"), "--out", str(tmp_path)])
    assert rc == 0
    result = json.loads((tmp_path / "paper_ms.json").read_text())
    assert result["metaschedule"]["runner"].startswith("fake")
    pre = result["metaschedule_tuning"]
    # stock's and vtc's pointwise convs (the small depthwise conv may find no valid CUDA candidate
    # among so few random samples: it then stays with DLight, as any untunable kernel does)
    assert pre["tuned"] >= 2 and "error" not in pre, pre
    (row,) = result["cases"]
    assert "error" not in row, row
    assert row["metaschedule"]["tuned"] == 0  # all found in the database
    assert row["stock_ms_kernels"] >= 1 and row["vtc_ms_kernels"] >= 1
    assert row["stock_tensor_cores"] is not None
    assert (tmp_path / "tuning" / "shufflenet_unit" / (tuning.RECORD_FILE + ".xz")).exists()


def test_tuning_database_files(tmp_path):
    """The committed form of a benchmark database (benchmarks/tuning.py): the best record per
    workload, xz-compressed, unpacked where no plain files exist, merged in (once) where they do."""
    import shutil

    from benchmarks import tuning

    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    mods = []
    for n in (16, 32):
        a = te.placeholder((n,), "float32", name="A")
        b = te.compute((n,), lambda i: a[i] + 1, name="B")
        mods.append(tvm.IRModule({"main": te.create_prim_func([a, b])}))

    def record(db, mod, secs):
        from tvm import s_tir

        sch = s_tir.Schedule(mod)
        sch.get_sblock("B")
        db.commit_tuning_record(ms.database.TuningRecord(sch.trace, db.commit_workload(mod), [secs], target,
                                                         ms.arg_info.ArgInfo.from_prim_func(mod["main"])))

    first, second = tmp_path / "first", tmp_path / "second"
    db = tuning.open_database(str(first))
    record(db, mods[0], 2e-5)
    record(db, mods[0], 1e-5)
    assert tuning.pack_database(db, str(first)) == 1  # best record of the one workload

    second.mkdir()  # a fresh checkout: only the committed files
    for name in (tuning.WORKLOAD_FILE, tuning.RECORD_FILE):
        shutil.copy(first / (name + ".xz"), second / (name + ".xz"))
    db2 = tuning.open_database(str(second))
    assert len(db2) == 1 and (second / tuning.WORKLOAD_FILE).exists()
    assert float(db2.query_tuning_record(mods[0], target, "main").run_secs[0]) == pytest.approx(1e-5)

    record(db, mods[1], 3e-5)  # tuned elsewhere later: comes back as new *.json.xz
    tuning.pack_database(db, str(first))
    for name in (tuning.WORKLOAD_FILE, tuning.RECORD_FILE):
        shutil.copy(first / (name + ".xz"), second / (name + ".xz"))
    db3 = tuning.open_database(str(second))
    assert len(db3) == 2 and db3.query_tuning_record(mods[1], target, "main") is not None
    assert len(tuning.open_database(str(second))) == 2  # merged once, not again
    assert len(tuning.open_database(str(first))) == 3  # the folder that wrote them merges nothing


def test_gather_kernels_are_tuned_with_indices_in_bounds(tmp_path, monkeypatch):
    """A kernel that loads through a loaded index is tuned by the real LocalRunner: integer inputs
    are zero-filled (random ones would read out of bounds). Its worker process cannot import
    ``benchmarks``, so the allocator travels by value."""
    from tvm import relax
    from tvm.relax import op as R

    from benchmarks import tuning

    x = relax.Var("x", relax.TensorType((512, 64), "float32"))
    ids = relax.Var("ids", relax.TensorType((16,), "int64"))
    w = relax.Var("w", relax.TensorType((64, 64), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, ids, w]):
        with bb.dataflow():
            out = bb.emit_output(R.matmul(bb.emit(R.take(x, ids, axis=0)), w))
        bb.emit_func_output(out)
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    fused = tuning.fuse(bb.get(), target, "vtc")
    (kernel,) = [f for _, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert tuning.indirect(tvm.IRModule({"main": kernel}))
    monkeypatch.chdir(tmp_path)
    stats = {}
    settings = tuning.TuneSettings(trials=2, population=16, init_min_unmeasured=8, tasks="all", builder_workers=1)
    tuning.tune([fused], target, str(tmp_path / "db"), settings, stats=stats)
    assert stats["tuned"] == 1 and stats["failed"] == 0, stats
