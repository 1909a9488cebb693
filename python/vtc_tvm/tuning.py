"""MetaSchedule tuning of the kernels the ``"vtc"`` pipeline (or the stock one) produces.

Two entry points, after TVM's ``static_shape_tuning`` pipeline:

* :func:`tune` ``(mod, target, work_dir, max_trials_per_task=64, max_seconds=None, runner=None,
  progress=True, vtc=True, **vtc_options)``: runs the front of the pipeline (VirtualTensorize,
  legalization, fusion, the store side), tunes every fused kernel ``work_dir``'s database has no
  record for, and returns the fused module with the database applied (``tirx.is_scheduled``
  kernels). Compile it with ``tvm.compile(tuned, target, relax_pipeline=finish_pipeline(target))``
  (the untuned build's schedule rules for the kernels without a record, then lowering).
* the Relax pipeline ``"vtc_tuning"`` (:func:`tuning_pipeline`):
  ``relax.get_pipeline("vtc_tuning", target=..., work_dir=..., max_trials_per_task=64,
  max_seconds=None, runner=None)`` = VirtualTensorize + the backend's legalize/fuse passes + the
  store side + :func:`tune_kernels` (tune what is missing, ``MetaScheduleApplyDatabase``) + the
  ``"vtc"`` pipeline's schedule rules for the rest (``schedules=``: ours, then DLight's, on GPUs)
  + the backend's lowering, pass for pass as ``"vtc"``.

A second compile with the same ``work_dir`` finds every kernel in the database and tunes nothing
(nothing is built or measured), so the database is the persistent cache of the tuning.

Budget: ``max_trials_per_task`` measured candidates per kernel, and/or ``max_seconds`` for the
whole tuning. The granularity of ``max_seconds`` is one task: a kernel whose tuning has started
finishes it (one batch of ``max_trials_per_task`` candidates, plus the measurement of the
untuned schedule), and no kernel starts after the budget is spent; those stay with the untuned build's
rules. Kernels are tuned largest FLOP count first, so a budget drops the smallest ones.

How a task is tuned (:class:`TuneSettings`), cheap per trial:

1. its trials are measured in one batch, picked by a small evolutionary search (population 64
   instead of TVM's 512; with one batch the cost model is the random one and there are no genetic
   rounds, since an untrained XGBoost model ranks at random);
2. on CUDA the tensor-core space first, the plain CUDA space when it has no valid candidate (a GEMV);
3. the schedule the untuned build gives the kernel (the ``"vtc"`` pipeline's: our rules, then
   DLight's; stock's: DLight's) is measured by the same builder and runner and its time kept next
   to the database (``baselines.json``): a record is applied only where it beats it
   (:func:`apply_database`), so the tuned build is never worse than the untuned one;
4. kernels that load through a loaded index (gather) get in-bounds integer inputs (all zero):
   MetaSchedule fills inputs at random, and an out-of-bounds read poisons the CUDA context.

Builder and runner: one pool of build workers for the whole process (:func:`pooled_builder`),
each importing ``tvm.s_tir.tensor_intrin`` once when it starts, outside the build timeout (TVM's
``LocalBuilder`` starts a fresh pool per batch and times that 15-45 s import against its 30 s
default); a ``LocalRunner`` without ``min_repeat_ms``. ``runner=`` takes any MetaSchedule runner,
e.g. ``ms.runner.RPCRunner`` through TVM's RPC tracker (:func:`rpc_runner` builds one with the same
measurement settings) to spread the measurements over several GPUs or hosts.

Databases: ``work_dir`` holds MetaSchedule's ``database_workload.json`` and
``database_tuning_record.json`` (every measured trial) and, rewritten after every task,
``database_workload.json.xz`` / ``database_tuning_record.json.xz``: the best record of every
workload, the form to commit or ship (:func:`open_database` brings them back).

Limits: 1. static shapes only (MetaSchedule tunes no symbolic kernel: such kernels stay with
DLight); 2. a kernel whose workload does not survive MetaSchedule's JSON round trip is found again
only within the process that tuned it (logged as a warning); 3. on CPU targets MetaSchedule needs
``num-cores`` in the target: it is added (``os.cpu_count()``) where missing; 4. the baseline is a
time, not a record (our rules' float32 widening rewrites the kernel, so their trace does not
replay on the task's workload): MetaSchedule's search does not start from it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import logging
import lzma
import os
import random
import shutil
import tempfile
import time

import numpy as np
import tvm
from tvm import relax

from .errors import last_line

logger = logging.getLogger(__name__)

# A partial of a stdlib function pickles by reference, so build workers can run it whatever
# module imports this one (a function of a test module or of ``__main__`` may not unpickle there).
_warm_worker = functools.partial(importlib.import_module, "tvm.s_tir.tensor_intrin")

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"


def _print(msg):
    print(msg, flush=True)


@dataclasses.dataclass
class TuneSettings:
    """Knobs of one MetaSchedule run (per task)."""

    trials: int = 16  # measured candidates per task
    population: int = 64  # EvolutionarySearch population_size (TVM default 512)
    genetic_iters: int | None = None  # genetic_num_iters (TVM default 4); None: 2 with XGBoost, else 0
    init_measured_ratio: float = 0.2  # share of the population seeded from measured records
    init_min_unmeasured: int = 32  # fresh random samples at least (TVM default 50)
    per_iter: int | None = None  # num_trials_per_iter; default: all trials in one batch
    builder_workers: int | None = None  # default os.cpu_count()
    builder_timeout: float = 120.0
    runner_timeout: float = 30.0
    number: int = 5  # calls per measurement
    repeat: int = 3  # measurements per candidate (MetaSchedule keeps their mean)
    space: str = "auto"  # "auto": cuda-tensorcore on CUDA, the target default elsewhere
    tasks: str = "anchor"  # "anchor": only kernels with a matmul/conv; "all"
    deadline: float | None = None  # time.time() after which no new task is tuned
    seed: int = 0
    dlight_baseline: bool = True  # also measure the untuned build's schedule of each tuned task: records apply if faster
    baseline: object = "dlight"  # whose schedule that is: "dlight", "vtc" (ours, then DLight's), or a rule list
    index_inputs_in_bounds: bool = True  # the runner zero-fills integer inputs, so gathers can be tuned
    cold_l2: bool = True  # on GPUs, time each call alone after the device's L2 is overwritten (cold_costs)

    def strategy(self, max_fail_count: int = 5, min_population: int = 0):
        """``max_fail_count``: sampling rounds without enough valid candidates before giving up
        (TVM default 5). A GEMV (M=1) in the plain CUDA space needs more rounds and a larger
        population (samples per round): most of its random tilings fail VerifyGPUCode."""
        from tvm.s_tir import meta_schedule as ms

        population = max(self.population, min_population)
        return ms.search_strategy.EvolutionarySearch(
            population_size=population, genetic_num_iters=self.genetic_num_iters(),
            init_measured_ratio=self.init_measured_ratio,
            init_min_unmeasured=min(self.init_min_unmeasured, population), max_fail_count=max_fail_count)

    def cost_model(self) -> str:
        """XGBoost only pays off when a task has more than one measured batch to learn from."""
        return "xgb" if (self.per_iter or self.trials) < self.trials else "random"

    def genetic_num_iters(self) -> int:
        """Evolving the population under a random cost model only costs time (~40% of the search)."""
        if self.genetic_iters is not None:
            return self.genetic_iters
        return 2 if self.cost_model() == "xgb" else 0

    def fallback_space(self, target) -> str | None:
        """The space to retry a task in when the tensor-core space yields no valid candidate."""
        return "cuda" if self.space == "auto" and target.kind.name == "cuda" else None

    def space_generator(self, target, kind=None):
        from tvm.s_tir import meta_schedule as ms

        kind = kind or self.space
        if kind == "auto":
            kind = "cuda-tensorcore" if target.kind.name == "cuda" else "post-order-apply"
        if kind == "post-order-apply":
            return "post-order-apply"
        return ms.space_generator.PostOrderApply(sch_rules=kind, postprocs=kind, mutator_probs=kind)


# ----------------------------------------------------------------------------------------------
# Builder and runners
# ----------------------------------------------------------------------------------------------
def _pooled_builder_cls():
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
    from tvm.s_tir.meta_schedule.builder import local_builder as lb
    from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

    @derived_object
    class PooledBuilder(PyBuilder):
        """``LocalBuilder``'s build, but one worker pool for the whole process (warmed once)."""

        def __init__(self, max_workers: int, timeout_sec: float, initializer=_warm_worker):
            super().__init__()
            self.max_workers = max_workers
            self.timeout_sec = timeout_sec
            self.builds = 0  # candidates built so far (all batches)
            self.pool = PopenPoolExecutor(max_workers=max_workers, timeout=timeout_sec, initializer=initializer)
            # Start every worker now (each imports tensor_intrin), overlapping the main process's work.
            self._warm = [self.pool.submit(os.getpid) for _ in range(max_workers)]

        def build(self, build_inputs):
            BUILD_TIMES["start"] = time.time()
            self.builds += len(build_inputs)
            args = [(None, None, b.mod, b.target, lb._serialize_params(b.params)) for b in build_inputs]
            results = []
            for r in self.pool.map_with_error_catching(lambda x: lb._worker_func(*x), args):
                if r.status == StatusKind.COMPLETE:
                    results.append(BuilderResult(r.value, None))
                elif r.status == StatusKind.TIMEOUT:
                    results.append(BuilderResult(None, f"PooledBuilder: Timeout, killed after {self.timeout_sec} s"))
                else:
                    results.append(BuilderResult(None, "PooledBuilder: An exception occurred\n" + str(r.value)))
            BUILD_TIMES["end"] = time.time()
            return results

    return PooledBuilder


_CACHE = {}
BUILD_TIMES = {}  # start/end of the PooledBuilder's last batch (for the progress lines)


def pooled_builder(workers: int | None = None, timeout_sec: float = 120.0):
    """The process-wide build pool (created on first use)."""
    key = ("builder", workers or os.cpu_count() or 1, timeout_sec)
    if key not in _CACHE:
        _CACHE[key] = _pooled_builder_cls()(key[1], timeout_sec)
    return _CACHE[key]


def evaluator_config(settings: TuneSettings):
    """``number x repeat`` calls per candidate, without TVM's ``min_repeat_ms`` (>= 100 ms each)."""
    from tvm.s_tir import meta_schedule as ms

    return ms.runner.EvaluatorConfig(number=settings.number, repeat=settings.repeat, min_repeat_ms=0,
                                     enable_cpu_cache_flush=False)


def cold_costs(rt_mod, device, evaluator_config, repeated_args, l2_bytes=None) -> list:
    """MetaSchedule's run evaluator with every call timed alone on a cold L2 (a GPU device whose
    L2 size the runtime reports; elsewhere MetaSchedule's own evaluator): ``number x repeat``
    single calls, each after TVM's ``time_evaluator`` copies twice the L2's size on the device
    (``cache_flush_bytes``).

    MetaSchedule's default times ``number`` calls back to back: a kernel whose weight fits in the
    L2 (a 4096 x 4096 fp16 projection: 32 MB against the H200's 50 MB) is then timed with the
    weight in cache, while in a model it comes from DRAM (a record measured 47 us in the layer
    against the baseline's 23 us that it beat in the runner). Cold, both are timed as the model
    runs them. ``l2_bytes``: the L2 size to assume instead of the device's."""
    from tvm.s_tir.meta_schedule.runner.utils import run_evaluator_common

    l2 = l2_bytes or (device.l2_cache_size_bytes if device.dlpack_device_type() != 1 else None)  # 1: kDLCPU
    if not l2:
        return run_evaluator_common(rt_mod, device, evaluator_config, repeated_args)
    evaluator = rt_mod.time_evaluator(rt_mod.entry_name, device, number=1,
                                      repeat=evaluator_config.number * evaluator_config.repeat,
                                      min_repeat_ms=0, cache_flush_bytes=2 * int(l2))
    costs = []
    for args in repeated_args:
        device.sync()
        costs += [float(c) for c in evaluator(*args).results]
    return costs


def cold_costs_rpc(session, rt_mod, device, evaluator_config, repeated_args) -> list:
    """:func:`cold_costs` for ``RPCRunner`` (the module and device are the remote session's)."""
    return cold_costs(rt_mod, device, evaluator_config, repeated_args)


def _ship_by_value():
    """Runner workers (and RPC servers) may not import this package: its functions travel by value."""
    import sys

    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def local_runner(settings: TuneSettings):
    """The process-wide ``LocalRunner`` (one worker, kept between tasks)."""
    from tvm.s_tir import meta_schedule as ms

    key = ("runner", settings.number, settings.repeat, settings.runner_timeout, settings.cold_l2)
    if key not in _CACHE:
        _ship_by_value()
        _CACHE[key] = ms.runner.LocalRunner(timeout_sec=settings.runner_timeout,
                                            evaluator_config=evaluator_config(settings),
                                            f_alloc_argument=alloc_in_bounds,
                                            f_run_evaluator=cold_costs if settings.cold_l2 else None)
    return _CACHE[key]


def rpc_runner(tracker_host: str, tracker_port: int, tracker_key: str, max_workers: int = 1,
               settings: TuneSettings | None = None, session_timeout_sec: float = 60.0):
    """TVM's ``RPCRunner`` through the RPC tracker at ``tracker_host:tracker_port``: each candidate
    runs on a free server registered under ``tracker_key`` (``max_workers`` at a time, e.g. one
    per GPU), measured like :func:`local_runner` (same evaluator, in-bounds integer inputs)."""
    from tvm.s_tir import meta_schedule as ms

    settings = settings or TuneSettings()
    _ship_by_value()
    config = ms.runner.RPCConfig(tracker_host=tracker_host, tracker_port=int(tracker_port), tracker_key=tracker_key,
                                 session_timeout_sec=session_timeout_sec)
    return ms.runner.RPCRunner(rpc_config=config, evaluator_config=evaluator_config(settings),
                               f_alloc_argument=alloc_in_bounds_rpc, max_workers=max_workers,
                               f_run_evaluator=cold_costs_rpc if settings.cold_l2 else None)


def _alloc_in_bounds(random_fill, device, args_info, alloc_repeat):
    from tvm.s_tir.meta_schedule.runner.utils import alloc_argument_common

    def fill(tensor):
        if "int" in str(tensor.dtype):
            tensor.copyfrom(np.zeros(tensor.shape, str(tensor.dtype)))
        else:
            random_fill(tensor)

    return alloc_argument_common(fill, device, args_info, alloc_repeat)


def alloc_in_bounds(device, args_info, alloc_repeat):
    """The runner's arguments: random floats as MetaSchedule fills them, integers all zero.

    MetaSchedule fills every input at random, so a kernel that loads through a loaded index
    (gather/take) would read out of bounds, and an illegal address poisons the runner's CUDA
    context for every later candidate. Index 0 is valid for any gather, so such kernels can be
    tuned too (their timing then reads one row over and over: cache-friendly, a lower bound).
    """
    from tvm.s_tir.meta_schedule.utils import get_global_func_with_default_on_worker

    random_fill = get_global_func_with_default_on_worker("tvm.contrib.random.random_fill_for_measure", None)
    return _alloc_in_bounds(random_fill, device, args_info, alloc_repeat)


def alloc_in_bounds_rpc(session, device, args_info, alloc_repeat):
    """:func:`alloc_in_bounds` for ``RPCRunner`` (the fill function of the remote session)."""
    from tvm.s_tir.meta_schedule.utils import get_global_func_on_rpc_session

    random_fill = get_global_func_on_rpc_session(session, "tvm.contrib.random.random_fill_for_measure",
                                                 "Please make sure 'USE_RANDOM' is turned ON in the config.cmake.")
    return _alloc_in_bounds(random_fill, device, args_info, alloc_repeat)


def fake_runner(seed: int = 0):
    """A runner that measures nothing: deterministic pseudo-random ``run_secs`` (1-100 us) for every
    built candidate, and the build error for a failed one. Lets the whole tuning flow (search,
    builds, database, reload, apply, codegen) run on a machine without the target device."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture, RunnerResult

    @derived_object
    class _Future(PyRunnerFuture):
        def __init__(self, secs):
            super().__init__()
            self.secs = secs

        def done(self):
            return True

        def result(self):
            return RunnerResult(self.secs, None)

    @derived_object
    class FakeRunner(PyRunner):
        def __init__(self, seed):
            super().__init__()
            self.rng = random.Random(seed)
            self.calls = 0

        def run(self, runner_inputs):
            self.calls += len(runner_inputs)
            return [_Future([self.rng.uniform(1e-6, 1e-4)] * 3) for _ in runner_inputs]

    return FakeRunner(seed)


# ----------------------------------------------------------------------------------------------
# Database files
# ----------------------------------------------------------------------------------------------
def _paths(work_dir):
    return os.path.join(work_dir, WORKLOAD_FILE), os.path.join(work_dir, RECORD_FILE)


STAMP_FILE = ".packed"  # sha256 of the *.json.xz this folder's plain files last wrote (git-ignored)


def _packed_digest(work_dir) -> str | None:
    import hashlib

    h = hashlib.sha256()
    for p in _paths(work_dir):
        if not os.path.exists(p + ".xz"):
            return None
        with open(p + ".xz", "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def open_database(work_dir: str, log=_print):
    """The JSONDatabase of ``work_dir``, with the committed ``*.json.xz`` records brought in.

    Without the plain files (a fresh checkout, the GPU machine) the ``*.json.xz`` are unpacked
    into them. With both, the ``*.json.xz`` are merged in only when this folder did not write them
    itself (their digest differs from ``.packed``: e.g. they came back from the GPU machine), and
    only for workloads the plain database has no record of.

    The tensor intrinsics are registered first: records of tensor-core schedules contain
    ``tensorize`` instructions that name them, and parsing such a record without them fails
    (inside ``parallel_for_dynamic``, which is how the first H200 attempt died).
    """
    from tvm.s_tir import meta_schedule as ms

    importlib.import_module("tvm.s_tir.tensor_intrin")
    os.makedirs(work_dir, exist_ok=True)
    digest = _packed_digest(work_dir)
    plain = all(os.path.exists(p) for p in _paths(work_dir))
    if digest is not None and not plain:
        for p in _paths(work_dir):
            with lzma.open(p + ".xz", "rb") as f, open(p + ".part", "wb") as g:
                shutil.copyfileobj(f, g)
            os.replace(p + ".part", p)
        _write_stamp(work_dir, digest)
    db = ms.database.JSONDatabase(work_dir=work_dir)
    if digest is not None and plain and _read(os.path.join(work_dir, STAMP_FILE)) != digest:
        with tempfile.TemporaryDirectory() as tmp:
            for p in _paths(work_dir):
                with lzma.open(p + ".xz", "rb") as f, open(os.path.join(tmp, os.path.basename(p)), "wb") as g:
                    shutil.copyfileobj(f, g)
            added = 0
            for rec in ms.database.JSONDatabase(work_dir=tmp).get_all_tuning_records():
                wkl = db.commit_workload(rec.workload.mod)
                if db.get_top_k(wkl, 1):
                    continue
                db.commit_tuning_record(ms.database.TuningRecord(rec.trace, wkl, rec.run_secs, rec.target,
                                                                 rec.args_info))
                added += 1
        log(f"    tuning db {work_dir}: merged {added} record(s) from *.json.xz")
        pack_database(db, work_dir)
    return db


def _write_stamp(work_dir, digest):
    with open(os.path.join(work_dir, STAMP_FILE), "w") as f:
        f.write(digest + "\n")


def pack_database(db, work_dir: str) -> int:
    """Write the best record of every workload to ``work_dir/*.json.xz`` (the committed form)."""
    from tvm.s_tir import meta_schedule as ms

    with tempfile.TemporaryDirectory() as tmp:
        out = ms.database.JSONDatabase(work_dir=tmp)
        db.dump_pruned(out)  # the best record of every workload
        n = len(out)
        for name in (WORKLOAD_FILE, RECORD_FILE):
            # mtime 0 in the xz header: the same records give the same bytes
            with open(os.path.join(tmp, name), "rb") as f, lzma.open(os.path.join(work_dir, name + ".xz.part"),
                                                                    "wb", preset=9 | lzma.PRESET_EXTREME) as g:
                shutil.copyfileobj(f, g)
            os.replace(os.path.join(work_dir, name + ".xz.part"), os.path.join(work_dir, name + ".xz"))
    _write_stamp(work_dir, _packed_digest(work_dir))
    return n


def reloadable(task) -> bool:
    """Whether the task's workload survives the JSON round trip (a later process can find its record)."""
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    w = ms.database.Workload(task.dispatched[0])
    return bool(tvm_ffi.structural_equal(ms.database.Workload.from_json(w.as_json()).mod, task.dispatched[0]))


def strip_metadata(mod: tvm.IRModule) -> tvm.IRModule:
    """Drop the ``vtc.*`` attributes of the kernels (the record of which mappings were inlined).
    They do not change the code, but an index map over a data-dependent index (gather) holds a
    free variable that is a new one after every JSON round trip, so a kernel carrying it would
    never be found again in a MetaSchedule database."""
    out = mod
    for gv, f in mod.functions_items():
        if isinstance(f, tvm.tirx.PrimFunc) and f.attrs:
            keys = [k for k in f.attrs.keys() if str(k).startswith("vtc.")]  # noqa: SIM118 (DictAttrs)
            if keys:
                for k in keys:
                    f = f.without_attr(k)
                if out is mod:
                    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
                out[gv] = f
    return out


# ----------------------------------------------------------------------------------------------
# Tuning
# ----------------------------------------------------------------------------------------------
def _progress_callback(state):
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

    @derived_object
    class Progress(PyMeasureCallback):
        def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
            state["measured"] = time.time()
            state["batches"] = state.get("batches", 0) + 1
            state["trials"] += len(measure_candidates)
            state["built"] += sum(1 for b in builder_results if b.error_msg is None)
            for r in runner_results:
                if r.error_msg is None and r.run_secs:
                    state["ran"] += 1
                    t = sum(float(s) for s in r.run_secs) / len(r.run_secs)
                    state["best"] = min(state["best"], t)
                elif r.error_msg and not state.get("error"):
                    state["error"] = last_line(r.error_msg)
            if state.get("bar") is not None:
                state["bar"].update(len(measure_candidates))

    return Progress()


def ms_logger_without_unnamed_handlers() -> logging.Logger:
    """MetaSchedule's logger, ready for another tuning in this process.

    MetaSchedule rebuilds its logging config from the handlers already on its logger and cannot
    handle unnamed ones (``AttributeError`` in ``tune``: pytest's capture handlers, after an
    earlier tuning in the same process), so those are removed."""
    ms_logger = logging.getLogger("tvm.s_tir.meta_schedule")
    for handler in [h for h in ms_logger.handlers if h.get_name() is None]:
        ms_logger.removeHandler(handler)
    return ms_logger


def _quiet_ms_logging():
    """MetaSchedule's console output: warnings only (the full log stays in ``work_dir/logs``)."""
    ms_logger = ms_logger_without_unnamed_handlers()
    # Its console handler takes the logger's level at configuration time (it then sets DEBUG).
    if not os.environ.get("VTC_MS_VERBOSE"):
        ms_logger.setLevel(logging.WARNING)


ANCHOR_WORDS = ("matmul", "conv", "dense", "bmm")


def indirect(mod: tvm.IRModule) -> bool:
    """Whether a kernel loads through a loaded index (gather/take): tuned only with a runner
    that fills integers in bounds (:func:`alloc_in_bounds`, the default)."""
    import tvm_ffi
    from tvm.ir import TensorLoad

    found = []

    def on_load(load):
        for i in load.indices:
            tvm_ffi.structural_walk(i, (TensorLoad, lambda _: found.append(True)), order="post")

    for _, f in mod.functions_items():
        if isinstance(f, tvm.tirx.PrimFunc):
            tvm_ffi.structural_walk(f.body, (TensorLoad, on_load), order="post")
    return bool(found)


def _selected(task, settings) -> bool:
    if not settings.index_inputs_in_bounds and indirect(task.dispatched[0]):
        return False
    if settings.tasks == "all":
        return True
    return any(w in task.task_name for w in ANCHOR_WORDS)


def _flops(task) -> float:
    try:
        from tvm.s_tir.analysis import estimate_tir_flops

        return float(estimate_tir_flops(task.dispatched[0])) * max(int(task.weight), 1)
    except Exception:  # noqa: BLE001
        return 0.0


_FAILED = set()  # structural hashes of tasks whose tuning failed in this process (not retried)


def _key(task):
    import tvm_ffi

    return tvm_ffi.structural_hash(task.dispatched[0])


def _tune_one(ctx, work_dir, settings, builder, runner, db, bar=None):
    """Tune one TuneContext (its trials in ``settings.per_iter`` batches); (progress state, error)."""
    from tvm.s_tir import meta_schedule as ms

    state = {"trials": 0, "built": 0, "ran": 0, "best": float("inf"), "bar": bar}
    BUILD_TIMES.clear()
    try:
        ms.tune.tune_tasks(
            tasks=[ctx], task_weights=[1.0], work_dir=work_dir, max_trials_global=settings.trials,
            max_trials_per_task=settings.trials, num_trials_per_iter=settings.per_iter or settings.trials,
            builder=builder, runner=runner, database=db, task_scheduler="round-robin",
            cost_model=settings.cost_model(),
            measure_callbacks=list(ms.measure_callback.MeasureCallback.create("default")) + [_progress_callback(state)])
        return state, state.get("error", "")
    except Exception as e:  # noqa: BLE001 - an untunable task falls back (other space, then DLight)
        return state, f"{type(e).__name__}: {last_line(e)}"


def baseline_rules(baseline, target) -> list:
    """The schedule rules :class:`TuneSettings`' ``baseline`` names, in the order the build
    tries them."""
    from .schedules import default_rules, stock_rules

    if baseline == "vtc":
        return default_rules(target)
    if baseline == "dlight":
        return stock_rules(target)
    return list(baseline)


def measure_baseline(task, target, builder, runner, baseline="dlight") -> float | None:
    """Run time (microseconds) of the schedule the untuned build gives ``task`` (the first of
    ``baseline``'s rules, :func:`baseline_rules`, that takes it), measured with the tuning run's
    own builder and runner; None where no rule schedules it or it fails to build or run.

    It is kept next to the database (:func:`save_baseline`), not as a record: our rules rewrite
    the TIR besides scheduling it (float32 accumulation), so their traces do not replay on the
    task's workload. :func:`apply_database` applies a record only where it beats this time, so
    the tuned build is never worse than the untuned one: at a budget of a few random candidates
    (a GEMV has no tensor-core sketch) MetaSchedule alone lost to DLight by 3x on the H200, and
    to our small-batch rules by more."""
    from tvm.s_tir import meta_schedule as ms

    mod = task.dispatched[0]
    try:
        sch = None
        with target:
            for rule in baseline_rules(baseline, target):
                sch = rule.apply(mod["main"], target, False)
                if sch is not None:
                    break
        if isinstance(sch, list):
            sch = sch[0] if sch else None
        if sch is None:
            return None
        (built,) = builder.build([ms.builder.BuilderInput(sch.mod, target)])
        if built.error_msg:
            return None
        args_info = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
        (future,) = runner.run([ms.runner.RunnerInput(built.artifact_path, target.kind.name, args_info)])
        result = future.result()
    except Exception:  # noqa: BLE001 - a baseline that cannot be measured is simply not recorded
        return None
    if result.error_msg or not result.run_secs:
        return None
    return float(np.mean([float(t) for t in result.run_secs])) * 1e6


BASELINE_FILE = "baselines.json"  # {workload shash: the untuned build's time of it, us}


def load_baselines(work_dir) -> dict:
    try:
        with open(os.path.join(work_dir, BASELINE_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError, TypeError):
        return {}


def _workload_key(mod: tvm.IRModule) -> str:
    import tvm_ffi

    return str(tvm_ffi.structural_hash(mod))


def save_baseline(work_dir: str, mod: tvm.IRModule, us: float) -> None:
    """Keep ``us`` as the untuned build's time of the task whose workload is ``mod``."""
    baselines = load_baselines(work_dir)
    baselines[_workload_key(mod)] = round(us, 3)
    tmp = os.path.join(work_dir, BASELINE_FILE + ".part")
    with open(tmp, "w") as f:
        json.dump(dict(sorted(baselines.items())), f, indent=0)
    os.replace(tmp, os.path.join(work_dir, BASELINE_FILE))


def faster_than_baseline(db, baselines: dict):
    """A database with the best record of each of ``db``'s workloads that beats its baseline
    time (all of them where none was measured)."""
    from tvm.s_tir import meta_schedule as ms

    out = ms.database.MemoryDatabase()
    seen = set()
    for rec in db.get_all_tuning_records():
        wkl, key = rec.workload, _workload_key(rec.workload.mod)
        if key in seen:
            continue
        seen.add(key)
        (best,) = db.get_top_k(wkl, 1)
        base = baselines.get(key)
        if base is not None and (not best.run_secs
                                 or float(np.mean([float(t) for t in best.run_secs])) * 1e6 >= base):
            continue
        out.commit_tuning_record(ms.database.TuningRecord(best.trace, out.commit_workload(wkl.mod), best.run_secs,
                                                          best.target, best.args_info))
    return out


def _progress_bar(total, enabled):
    if not enabled or total <= 0:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # the per-task lines still say where tuning is
        return None
    return tqdm(total=total, unit="trial", desc="MetaSchedule", dynamic_ncols=True)


def tune_groups(groups, target, settings: TuneSettings, runner=None, builder=None, label: str = "",
                stats: dict | None = None, log=_print, quiet_if_done: bool = False, progress: bool = False):
    """Tune the kernels of every ``(work_dir, [fused modules])`` group that its database has no
    record for, one task after the other; returns the databases, in group order.

    Only tasks ``settings.tasks`` selects are tuned ("anchor": kernels with a matmul/conv, the
    rest stays with DLight; "all"), the largest FLOP count first over all groups, until
    ``settings.deadline`` (a ``time.time()`` value) passes; the rest are left to DLight and
    counted as skipped. So tuning all the cases of a run up front (stock and vtc modules
    together) makes a spent budget drop the smallest kernels of any case, alike for both variants.
    ``progress``: a tqdm bar over the trials (the per-task lines go through it).
    """
    from tvm.s_tir import meta_schedule as ms

    t_start = time.time()
    stats = {} if stats is None else stats
    tag = f" {label}" if label else ""
    stats.update(tasks=0, in_db=0, tuned=0, failed=0, skipped=0, tune_s=0.0)
    dbs, todo = [], []  # todo: (task, group index)
    with target:
        for g, (work_dir, fused_mods) in enumerate(groups):
            db = open_database(work_dir, log=log)
            dbs.append(db)
            tasks, seen = [], set()
            for fused in fused_mods:
                for t in ms.relax_integration.extract_tasks(fused, target):
                    if _key(t) not in seen:
                        seen.add(_key(t))
                        tasks.append(t)
            lost = [t.task_name for t in tasks if not reloadable(t)]
            if lost:
                log(f"    metaschedule{tag}: WARNING: not found again after a JSON round trip (records for this "
                    f"process only): {', '.join(lost)}")
            has = [db.query_tuning_record(t.dispatched[0], target, "main") is not None for t in tasks]
            stats["tasks"] += len(tasks)
            stats["in_db"] += sum(has)
            todo += [(t, g) for t, h in zip(tasks, has) if not h and _selected(t, settings) and _key(t) not in _FAILED]
        todo.sort(key=lambda tg: _flops(tg[0]), reverse=True)
        where = f" in {len(groups)} databases" if len(groups) > 1 else ""
        if quiet_if_done and not todo:
            return dbs
        log(f"    metaschedule{tag}: {stats['tasks']} tasks{where}, {stats['in_db']} in the database, {len(todo)} to "
            f"tune x {settings.trials} trials, {stats['tasks'] - stats['in_db'] - len(todo)} left to DLight")
        if not todo or settings.trials <= 0:
            return dbs
        _quiet_ms_logging()
        builder = builder or pooled_builder(settings.builder_workers, settings.builder_timeout)
        runner = runner or local_runner(settings)
        bar = _progress_bar(len(todo) * settings.trials, progress)
        if bar is not None:
            log = bar.write
        try:
            _tune_todo(todo, groups, dbs, target, settings, builder, runner, stats, log, bar)
        finally:
            if bar is not None:
                bar.close()
        stats["tune_s"] = round(time.time() - t_start, 1)
        log(f"    metaschedule{tag}: {stats['tuned']} tuned, {stats['failed']} failed, {stats['skipped']} skipped "
            f"in {stats['tune_s']} s; best records in " + ", ".join(sorted({w for w, _ in groups})) + " (*.json.xz)")
    return dbs


def _tune_todo(todo, groups, dbs, target, settings, builder, runner, stats, log, bar):
    """The loop of :func:`tune_groups`: one task after the other, until the deadline."""
    from tvm.s_tir import meta_schedule as ms

    for i, (task, g) in enumerate(todo):
        if settings.deadline is not None and time.time() > settings.deadline:
            stats["skipped"] = len(todo) - i
            log(f"      tuning budget spent: {len(todo) - i} task(s) left to DLight: "
                + ", ".join(t.task_name for t, _ in todo[i:]))
            break
        work_dir, db = groups[g][0], dbs[g]
        t_task = t0 = time.time()
        if bar is not None:
            bar.set_postfix_str(task.task_name[:40])
        _quiet_ms_logging()
        ctx = ms.relax_integration.extracted_tasks_to_tune_contexts(
            [task], work_dir=work_dir, space=settings.space_generator(target), strategy=settings.strategy(),
            seed=settings.seed)[0][0]
        state, err = _tune_one(ctx, work_dir, settings, builder, runner, db, bar)
        space = ""
        if not state["ran"] and settings.fallback_space(target):  # e.g. GEMV (M=1): no tensor-core sketch
            kind = settings.fallback_space(target)
            _quiet_ms_logging()
            retry, _ = ms.relax_integration.extracted_tasks_to_tune_contexts(
                [task], work_dir=work_dir, space=settings.space_generator(target, kind),
                strategy=settings.strategy(max_fail_count=30, min_population=128), seed=settings.seed)
            if bar is not None:
                bar.total += settings.trials
            t0 = time.time()
            state, err2 = _tune_one(retry[0], work_dir, settings, builder, runner, db, bar)
            space = f" [{kind} space; tensor-core space: {err or 'no valid candidate'}]"
            err = err2
        if state["ran"]:
            stats["tuned"] += 1
        else:
            stats["failed"] += 1
            _FAILED.add(_key(task))
        base_us = measure_baseline(task, target, builder, runner, settings.baseline) \
            if settings.dlight_baseline else None
        if base_us is not None:
            save_baseline(work_dir, task.dispatched[0], base_us)
            stats["baseline_better"] = stats.get("baseline_better", 0) + int(base_us <= state["best"] * 1e6)
        best = f"{state['best'] * 1e6:.1f} us" if state["best"] < float("inf") else "none"
        split = ""
        if "end" in BUILD_TIMES and state.get("batches") == 1:  # one batch: search, build, run
            split = (f" (search {BUILD_TIMES['start'] - t0:.1f} + build "
                     f"{BUILD_TIMES['end'] - BUILD_TIMES['start']:.1f} + run {state['measured'] - BUILD_TIMES['end']:.1f})")
        name = task.task_name if len(groups) == 1 else f"{os.path.basename(work_dir)}:{task.task_name}"
        if base_us is not None:
            best += f" (untuned {base_us:.1f} us)"
        log(f"      [{i + 1}/{len(todo)}] {name} ({_flops(task) / 1e9:.2f} GFLOP): "
            f"{state['trials']} trials, {state['built']} built, {state['ran']} ran, best {best}; "
            f"{time.time() - t_task:.1f} s{split}{space}" + (f"  ({err})" if err and not state["ran"] else ""))
        pack_database(db, work_dir)  # after every task: a killed run keeps what it tuned


def tune_fused(fused_mods: list[tvm.IRModule], target, work_dir: str, settings: TuneSettings, runner=None,
               builder=None, label: str = "", stats: dict | None = None, log=_print, quiet_if_done: bool = False,
               progress: bool = False):
    """Tune the kernels of the modules ``fused_mods`` (each after ``FuseTIR``) that ``work_dir``'s
    database has no record for (see :func:`tune_groups`); returns the database."""
    return tune_groups([(work_dir, fused_mods)], target, settings, runner=runner, builder=builder, label=label,
                       stats=stats, log=log, quiet_if_done=quiet_if_done, progress=progress)[0]


def apply_database(fused: tvm.IRModule, target, db, work_dir: str | None = None) -> tvm.IRModule:
    """``fused`` with every kernel ``db`` has a record for replaced by its best schedule; with
    ``work_dir``, only where that beats the untuned build's time kept there
    (:func:`measure_baseline`): the other kernels are left to the build's own rules."""
    baselines = load_baselines(work_dir) if work_dir else {}
    if baselines:
        db = faster_than_baseline(db, baselines)
    with target, db:
        return relax.transform.MetaScheduleApplyDatabase()(fused)


def scheduled_kernels(mod: tvm.IRModule) -> list[str]:
    """Names of the PrimFuncs MetaSchedule scheduled (``tirx.is_scheduled``)."""
    return sorted(gv.name_hint for gv, f in mod.functions_items()
                  if isinstance(f, tvm.tirx.PrimFunc) and f.attrs and f.attrs.get("tirx.is_scheduled"))


# ----------------------------------------------------------------------------------------------
# Pipelines
# ----------------------------------------------------------------------------------------------
def tuning_target(target) -> tvm.target.Target:
    """``target``, with ``num-cores`` on CPU targets (MetaSchedule's CPU space needs it)."""
    target = tvm.target.Target(target)
    if target.kind.name == "llvm" and "num-cores" not in target.attrs:
        config = dict(target.export())
        config["num-cores"] = os.cpu_count() or 1
        target = tvm.target.Target(config)
    return target


def split_pipeline(target, vtc: bool = True, schedules=None, **vtc_options):
    """(front, rest) of the ``"vtc"`` pipeline (or the stock one with ``vtc=False``), cut where DLight
    would schedule the fused kernels (``ApplyDefaultSchedule``).

    ``schedules`` (as :func:`vtc_tvm.pipeline.vtc_pipeline`'s) schedules the kernels MetaSchedule
    has no record for; default: the ``"vtc"`` pipeline's (``"vtc"``: our small-batch rules, then
    DLight's), DLight's for the stock one. A partial budget thus leaves the kernels it did not
    reach to what the untuned build would use (on the H200 the static Llama decode layer at
    batch 16 took 1.329 ms with DLight behind 6 of 12 tuned tasks, against 1.116 ms untuned).

    ``front`` ends with ``FuseTIR`` (vtc: the store side and the copy schedules); ``rest`` starts
    with DLight (which skips the kernels MetaSchedule scheduled; CPU backends have none), then
    lowers and finalizes. The two together are the pipeline's passes, in order.
    """
    from .pipeline import _backend, fusion_passes
    from .transform import VirtualTensorize

    backend = _backend(target)
    if schedules is None:
        schedules = "vtc" if vtc else "dlight"
    fusion = fusion_passes(target, stores=vtc, report=vtc_options.get("report"), schedule_copies=vtc,
                           schedules=schedules)
    # CPU backends have no DLight: the cut is after fusion
    cut = next((i for i, p in enumerate(fusion) if p.info.name == "ApplyDefaultSchedule"), len(fusion))
    front = list(backend.library_dispatch_passes(target)) + fusion[:cut]
    rest = fusion[cut:] + list(backend.dataflow_lower_passes(target)) + list(backend.finalize_passes(target))
    load_side = []
    if vtc:
        options = {"memory_guard": True, **vtc_options, "target": target}  # as vtc_pipeline
        load_side = [VirtualTensorize(**options)]
    return load_side + front, rest


def _in_target(target, passes, name):
    seq = tvm.transform.Sequential(passes)

    @tvm.transform.module_pass(opt_level=0, name=name)
    def _run(mod, _ctx):
        with target:
            return seq(mod)

    return _run


def _with_baseline(settings, schedules, vtc):
    """``settings`` whose baseline record of each task is the schedule the kernels without a
    record get (the rules :func:`split_pipeline`'s ``rest`` schedules with)."""
    return dataclasses.replace(settings or TuneSettings(tasks="all"),
                               baseline=schedules or ("vtc" if vtc else "dlight"))


def _settings(max_trials_per_task, settings):
    return dataclasses.replace(settings or TuneSettings(tasks="all"), trials=int(max_trials_per_task))


def tune_kernels(target, work_dir: str, max_trials_per_task: int = 64, max_seconds: float | None = None,
                 runner=None, progress: bool = True, settings: TuneSettings | None = None, builder=None,
                 stats: dict | None = None) -> tvm.transform.Pass:
    """The pass that tunes the fused kernels of a module (after ``FuseTIR``) that ``work_dir``'s
    database has no record for, then applies the database (``MetaScheduleApplyDatabase``).

    ``settings`` (:class:`TuneSettings`, default: every kernel, ``tasks="all"``) is taken with
    ``trials=max_trials_per_task``; ``max_seconds`` counts from when the pass runs. ``stats``
    receives the counts of :func:`tune_groups` (tasks, in_db, tuned, failed, skipped, tune_s).
    """
    target = tuning_target(target)
    settings = _settings(max_trials_per_task, settings)

    @tvm.transform.module_pass(opt_level=0, name="vtc.MetaScheduleTuneKernels")
    def _tune(mod, _ctx):
        run = settings if max_seconds is None else dataclasses.replace(settings, deadline=time.time() + max_seconds)
        mod = strip_metadata(mod)
        log = _print if progress else logger.info
        db = tune_fused([mod], target, work_dir, run, runner=runner, builder=builder, stats=stats, log=log,
                        progress=progress)
        return apply_database(mod, target, db, work_dir)

    return _tune


def tuning_pipeline(target, work_dir: str, max_trials_per_task: int = 64, max_seconds: float | None = None,
                    runner=None, progress: bool = True, vtc: bool = True, settings: TuneSettings | None = None,
                    builder=None, stats: dict | None = None, schedules=None, **vtc_options) -> tvm.transform.Pass:
    """The ``"vtc_tuning"`` pipeline: :func:`split_pipeline`'s front, :func:`tune_kernels`, its rest.

    As TVM's ``static_shape_tuning`` pipeline, with the vtc passes (``vtc=False``: the stock ones)
    and a whole build: ``tvm.compile(mod, target, relax_pipeline=relax.get_pipeline("vtc_tuning",
    target=target, work_dir="tuning_logs"))``. ``max_trials_per_task=0`` only applies the database.
    """
    target = tuning_target(target)
    front, rest = split_pipeline(target, vtc, schedules, **vtc_options)
    settings = _with_baseline(settings, schedules, vtc)
    tune_pass = tune_kernels(target, work_dir, max_trials_per_task, max_seconds, runner, progress, settings, builder,
                             stats)
    return _in_target(target, front + [tune_pass] + rest, "vtc_tuning_pipeline")


def finish_pipeline(target, vtc: bool = True, schedules=None) -> tvm.transform.Pass:
    """What follows :func:`tune`: the schedule rules for the kernels without a record
    (:func:`split_pipeline`'s ``schedules``), lowering, finalizing."""
    target = tuning_target(target)
    return _in_target(target, split_pipeline(target, vtc, schedules)[1], "vtc_tuning_finish")


def tune(mod: tvm.IRModule, target, work_dir: str, max_trials_per_task: int = 64, max_seconds: float | None = None,
         runner=None, progress: bool = True, vtc: bool = True, *, settings: TuneSettings | None = None,
         builder=None, stats: dict | None = None, **vtc_options) -> tvm.IRModule:
    """Tune the kernels of ``mod`` as the ``"vtc"`` pipeline fuses them (stock's with ``vtc=False``)
    and return the fused module with ``work_dir``'s database applied.

    Build it with ``tvm.compile(tuned, target, relax_pipeline=finish_pipeline(target, vtc))``
    (the untuned build's rules schedule the kernels without a record). ``vtc_options`` go to
    :func:`vtc_tvm.VirtualTensorize`; the rest as :func:`tune_kernels`.
    """
    target = tuning_target(target)
    front, _ = split_pipeline(target, vtc, **vtc_options)
    settings = _with_baseline(settings, None, vtc)
    tune_pass = tune_kernels(target, work_dir, max_trials_per_task, max_seconds, runner, progress, settings, builder,
                             stats)
    return _in_target(target, front + [tune_pass], "vtc_tune")(mod)
