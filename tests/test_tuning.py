"""MetaSchedule for users (vtc_tvm.tuning): tune, save, re-apply without tuning, budgets, the
``"vtc_tuning"`` pipeline, and measurement through TVM's RPC tracker (all on the CPU, llvm)."""

import dataclasses
import time

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.runner import PyRunner

import vtc_tvm  # noqa: F401  (registers the pipelines)
from vtc_tvm import tuning

from tests.conftest import matmul_transposed_weight

TARGET = tvm.target.Target("llvm")  # tuning adds num-cores
# small and quick: 8 samples per search round, one warm build worker for every test of this file
FAST = tuning.TuneSettings(tasks="all", population=8, init_min_unmeasured=8, builder_workers=1)


def _inputs(mod):
    rng = np.random.default_rng()  # fresh every run
    return [rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32") for p in mod["main"].params]


def _run(ex, arrays):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*map(tvm.runtime.tensor, arrays)).numpy()


@derived_object
class CountingRunner(PyRunner):
    """Forwards to ``inner`` and counts the candidates it was given."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.calls = 0

    def run(self, runner_inputs):
        self.calls += len(runner_inputs)
        return self.inner.run(runner_inputs)


@pytest.fixture(scope="module")
def builder():
    return tuning.pooled_builder(FAST.builder_workers, FAST.builder_timeout)


def test_pipeline_registered():
    assert "vtc_tuning" in relax.pipeline.PIPELINE_MAP
    p = relax.get_pipeline("vtc_tuning", target=TARGET, work_dir="unused", max_trials_per_task=0)
    assert isinstance(p, tvm.transform.Pass)


def test_cold_costs_time_each_call_alone_after_overwriting_the_l2():
    """The runners' evaluator (``tuning.cold_costs``): with an L2 size, number x repeat single
    calls, each after TVM's time_evaluator overwrote twice that many bytes on the device; without
    one (the CPU), MetaSchedule's own evaluator (repeat means of number calls)."""
    from tvm import te

    a_ = te.placeholder((4096,), "float32", name="a")
    scale = te.create_prim_func([a_, te.compute((4096,), lambda i: a_[i] * 2.0, name="b")])
    rt_mod = tvm.tirx.build(scale.with_attr("global_symbol", "main"), target="llvm")
    dev = tvm.cpu()
    a = tvm.runtime.tensor(np.arange(4096, dtype="float32"), dev)
    b = tvm.runtime.empty((4096,), "float32", dev)
    config = ms.runner.EvaluatorConfig(number=2, repeat=3, min_repeat_ms=0, enable_cpu_cache_flush=False)
    cold = tuning.cold_costs(rt_mod, dev, config, [[a, b], [a, b]], l2_bytes=1 << 20)
    assert len(cold) == 12 and all(c > 0 for c in cold)
    np.testing.assert_array_equal(b.numpy(), 2 * np.arange(4096, dtype="float32"))
    warm = tuning.cold_costs(rt_mod, dev, config, [[a, b]])  # the CPU reports no L2: MetaSchedule's
    assert len(warm) == 3 and all(c > 0 for c in warm)
    assert tuning.local_runner(tuning.TuneSettings()).f_run_evaluator is tuning.cold_costs
    assert tuning.local_runner(tuning.TuneSettings(cold_l2=False)).f_run_evaluator is None


def test_untuned_kernels_keep_the_untuned_builds_rules():
    """On GPUs the kernels MetaSchedule has no record for get what the "vtc" pipeline gives them
    (our small-batch rules, then DLight's); the stock side and ``schedules="dlight"`` keep DLight's."""
    import vtc_tvm.schedules as S
    from vtc_tvm.pipeline import cuda_target

    cuda = cuda_target()

    def rules(**kw):
        rest = tuning.split_pipeline(cuda, **kw)[1]
        (apply,) = [p for p in rest if p.info.name == "ApplyDefaultSchedule"]
        return [type(getattr(r, "rule", r)) for r in apply.rules]  # DLight's rules as Guarded wraps them

    ours = [type(r) for r in S.our_rules(cuda)]
    assert rules()[:len(ours)] == ours
    assert rules()[len(ours):] == [type(r) for r in S.stock_rules(cuda)]
    assert rules(vtc=False) == rules(schedules="dlight") == [type(r) for r in S.stock_rules(cuda)]


@pytest.mark.slow
def test_tune_save_and_reapply_without_tuning(tmp_path, builder, capsys):
    """tune() with the LocalRunner: correct result, database files on disk, a progress bar; the
    same work_dir again (tune() and the "vtc_tuning" pipeline) builds and measures nothing."""
    mod = matmul_transposed_weight()
    work = str(tmp_path / "db")
    runner = CountingRunner(tuning.local_runner(FAST))
    stats = {}
    tuned = tuning.tune(mod, TARGET, work, max_trials_per_task=2, runner=runner, settings=FAST, builder=builder,
                        stats=stats)
    assert stats["tasks"] == 1 and stats["tuned"] == 1 and stats["failed"] == 0, stats  # one matmul (vtc)
    assert runner.calls >= 2  # 2 candidates (+ DLight's schedule where it has one)
    assert "MetaSchedule" in capsys.readouterr().err  # the tqdm bar
    (kernel,) = tuning.scheduled_kernels(tuned)
    assert "matmul" in kernel
    for name in (tuning.WORKLOAD_FILE, tuning.RECORD_FILE):
        assert (tmp_path / "db" / name).stat().st_size > 0
        assert (tmp_path / "db" / (name + ".xz")).exists()
    arrays = _inputs(mod)
    expect = arrays[0] @ arrays[1].T
    ex = tvm.compile(tuned, TARGET, relax_pipeline=tuning.finish_pipeline(TARGET))
    np.testing.assert_allclose(_run(ex, arrays), expect, rtol=1e-4, atol=1e-4)

    calls, builds, records = runner.calls, builder.builds, len(ms.database.JSONDatabase(work_dir=work))
    again = {}
    retuned = tuning.tune(mod, TARGET, work, max_trials_per_task=2, runner=runner, settings=FAST, builder=builder,
                          stats=again, progress=False)
    assert again["tuned"] == 0 and again["in_db"] == 1, again
    assert tuning.scheduled_kernels(retuned) == [kernel]
    assert "MetaSchedule" not in capsys.readouterr().err  # progress=False: no bar
    piped = {}
    ex = tvm.compile(mod, TARGET, relax_pipeline=relax.get_pipeline(
        "vtc_tuning", target=TARGET, work_dir=work, max_trials_per_task=2, runner=runner, settings=FAST,
        builder=builder, stats=piped, progress=False))
    assert piped["tuned"] == 0 and piped["in_db"] == 1, piped
    assert (runner.calls, builder.builds) == (calls, builds)  # nothing built, nothing measured
    assert len(ms.database.JSONDatabase(work_dir=work)) == records
    arrays = _inputs(mod)
    np.testing.assert_allclose(_run(ex, arrays), arrays[0] @ arrays[1].T, rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # alone, opening a database imports tvm.s_tir.tensor_intrin (~30 s of CPU)
def test_budget_in_seconds(tmp_path, builder):
    """A spent budget starts no task: every kernel stays with the default schedule, still correct."""
    mod = matmul_transposed_weight()
    runner = CountingRunner(tuning.local_runner(FAST))
    stats = {}
    builds = builder.builds
    t0 = time.time()
    tuned = tuning.tune(mod, TARGET, str(tmp_path / "db"), max_trials_per_task=2, max_seconds=0, runner=runner,
                        settings=FAST, builder=builder, stats=stats, vtc=False, progress=False)
    assert stats["tasks"] == 2 and stats["skipped"] == 2 and stats["tuned"] == 0, stats  # transpose + matmul
    assert runner.calls == 0 and builder.builds == builds
    assert time.time() - t0 < 120  # (the database opening imports tensor_intrin once)
    assert tuning.scheduled_kernels(tuned) == []
    arrays = _inputs(mod)
    ex = tvm.compile(tuned, TARGET, relax_pipeline=tuning.finish_pipeline(TARGET, vtc=False))
    np.testing.assert_allclose(_run(ex, arrays), arrays[0] @ arrays[1].T, rtol=1e-4, atol=1e-4)


def _wait_for_servers(host, port, key, n, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        servers = [s for s in tvm.rpc.connect_tracker(host, port).summary()["server_info"]
                   if s.get("key") == f"server:{key}"]
        if len(servers) >= n:
            return servers
        time.sleep(0.2)
    raise TimeoutError(f"{n} RPC servers did not register with the tracker in {timeout} s")


@pytest.mark.slow
def test_tune_through_rpc_tracker(tmp_path, builder):
    """Measurements through TVM's own tracker and two RPC servers on the loopback interface
    (ms.runner.RPCRunner, two sessions at a time): records land in the database and the tuned
    build computes x @ w.T."""
    from tvm.rpc import server as server_mod
    from tvm.rpc import tracker as tracker_mod

    host, key = "127.0.0.1", "vtc-test"
    tracker = tracker_mod.Tracker(host=host, port=19190, port_end=19290, silent=True)
    servers = []
    try:
        servers = [server_mod.Server(host=host, port=19300, port_end=19400, key=key, tracker_addr=(host, tracker.port),
                              silent=True) for _ in range(2)]
        assert len(_wait_for_servers(host, tracker.port, key, 2)) == 2
        runner = tuning.rpc_runner(host, tracker.port, key, max_workers=2, settings=FAST)
        mod = matmul_transposed_weight()
        work = str(tmp_path / "db")
        stats = {}
        tuned = tuning.tune(mod, TARGET, work, max_trials_per_task=2, runner=runner, builder=builder, stats=stats,
                            settings=dataclasses.replace(FAST, dlight_baseline=False), progress=False)
    finally:
        for s in servers:
            s.terminate()
        tracker.terminate()
    assert stats["tuned"] == 1 and stats["failed"] == 0, stats
    records = ms.database.JSONDatabase(work_dir=work).get_all_tuning_records()
    assert sum(1 for r in records if r.run_secs) >= 1  # measured on the servers
    arrays = _inputs(mod)
    ex = tvm.compile(tuned, TARGET, relax_pipeline=tuning.finish_pipeline(TARGET))
    np.testing.assert_allclose(_run(ex, arrays), arrays[0] @ arrays[1].T, rtol=1e-4, atol=1e-4)
