"""MetaSchedule tuning shared by both harnesses (``benchmarks.run`` and ``benchmarks.kernels``).

:func:`compile_metaschedule` fuses a module (stock or vtc pipeline), tunes the fused kernels that
the database in ``work_dir`` has no record for, applies the database and finishes the pipeline
(DLight schedules whatever has no record). :func:`tune_groups` tunes the kernels of many modules
(all cases of a run) up front, largest first, under an optional time budget. Stock and vtc share
``work_dir``, so a kernel both variants contain is tuned once.

Cheap per trial, for a device budget of minutes:

* each task is measured in ONE batch of ``trials`` candidates, picked by a small evolutionary
  search (:class:`TuneSettings`: population 64 instead of 512; with one batch the cost model is
  the random one and there are no genetic rounds: an untrained XGBoost model ranks at random);
* one pool of build workers for the whole process (``PooledBuilder``), ``os.cpu_count()`` of
  them, each importing ``tvm.s_tir.tensor_intrin`` once when it starts (:data:`_warm_worker`,
  outside the build timeout). TVM's ``LocalBuilder`` starts a fresh pool for every batch, which
  costs that import (15-45 s) per batch;
* the runner measures ``number x repeat`` calls without ``min_repeat_ms`` (TVM's default makes
  every candidate run for >= 100 ms).

Every task prints one line (trials, valid builds, runs, best time, and the seconds split into
search + build + run), so a GPU log shows where the time goes.

Databases: ``work_dir`` holds MetaSchedule's ``database_workload.json`` and
``database_tuning_record.json`` (every measured trial; git-ignored) and, rewritten after every
task, ``database_workload.json.xz`` / ``database_tuning_record.json.xz``: the best record of every
workload. Those two are what gets committed (see :func:`open_database` for how they come back).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
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

# A partial of a stdlib function pickles by reference, so build workers can run it whatever
# module imports this one (a function of a test module or of ``__main__`` may not unpickle there).
_warm_worker = functools.partial(importlib.import_module, "tvm.s_tir.tensor_intrin")

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"


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
    dlight_baseline: bool = True  # also measure DLight's schedule of each tuned task: the best record wins
    index_inputs_in_bounds: bool = True  # the runner zero-fills integer inputs, so gathers can be tuned

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


def add_arguments(ap, default_tasks: str = "anchor"):
    """The ``--ms-*`` options of both harnesses (``--tuner ms:N`` sets the trials per task)."""
    d = TuneSettings()
    g = ap.add_argument_group("MetaSchedule (--tuner ms:N: N measured trials per task)")
    g.add_argument("--ms-tasks", choices=["anchor", "all"], default=default_tasks,
                   help=f"which kernels to tune: anchor = those with a matmul/conv (the rest stays with DLight), "
                        f"all (default {default_tasks})")
    g.add_argument("--ms-budget-s", type=float, default=None,
                   help="stop tuning new tasks this many seconds after start (the rest falls back to DLight)")
    g.add_argument("--ms-population", type=int, default=d.population, help="evolutionary search population")
    g.add_argument("--ms-genetic-iters", type=int, default=None,
                   help="evolution rounds (default 0 with one measured batch per task, else 2)")
    g.add_argument("--ms-init-measured-ratio", type=float, default=d.init_measured_ratio)
    g.add_argument("--ms-per-iter", type=int, default=None, help="trials per measured batch (default: all at once)")
    g.add_argument("--ms-number", type=int, default=d.number, help="runner: calls per measurement")
    g.add_argument("--ms-repeat", type=int, default=d.repeat, help="runner: measurements per candidate")
    g.add_argument("--ms-builders", type=int, default=None, help="build workers (default: os.cpu_count())")
    g.add_argument("--ms-no-dlight-baseline", action="store_true",
                   help="do not record DLight's schedule of each tuned task next to MetaSchedule's candidates")
    g.add_argument("--ms-fake-runner", action="store_true",
                   help="measure nothing (pseudo-random times): checks the tuning flow without a device; "
                        "its database goes to a scratch folder unless --tuning-dir is given")


def settings_from_args(args, trials: int) -> TuneSettings:
    return TuneSettings(
        trials=trials, population=args.ms_population, genetic_iters=args.ms_genetic_iters,
        init_measured_ratio=args.ms_init_measured_ratio, per_iter=args.ms_per_iter, number=args.ms_number,
        repeat=args.ms_repeat, builder_workers=args.ms_builders, tasks=args.ms_tasks,
        deadline=None if args.ms_budget_s is None else time.time() + args.ms_budget_s,
        dlight_baseline=not args.ms_no_dlight_baseline)


def runner_from_args(args, default_dir: str):
    """(tuning dir, runner): the fake runner never writes into the default (committed) databases."""
    if not args.ms_fake_runner:
        return args.tuning_dir, None
    tuning_dir = args.tuning_dir
    if os.path.abspath(tuning_dir) == os.path.abspath(default_dir):
        tuning_dir = os.path.join(tempfile.gettempdir(), "vtc_fake_tuning")
        print(f"--ms-fake-runner: databases go to {tuning_dir} (not {default_dir})", flush=True)
    return tuning_dir, fake_runner(0)


def describe(settings: TuneSettings, tuning_dir: str, runner=None) -> dict:
    """What a result file records about the tuning run."""
    d = dataclasses.asdict(settings)
    d.pop("deadline", None)
    d["tuning_dir"] = tuning_dir
    d["runner"] = "fake (no measurement)" if runner is not None else "LocalRunner"
    d["cost_model"] = settings.cost_model()
    d["genetic_iters"] = settings.genetic_num_iters()
    return d


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
            self.pool = PopenPoolExecutor(max_workers=max_workers, timeout=timeout_sec, initializer=initializer)
            # Start every worker now (each imports tensor_intrin), overlapping the main process's work.
            self._warm = [self.pool.submit(os.getpid) for _ in range(max_workers)]

        def build(self, build_inputs):
            BUILD_TIMES["start"] = time.time()
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


def local_runner(settings: TuneSettings):
    """The process-wide ``LocalRunner`` (one worker, kept between tasks)."""
    from tvm.s_tir import meta_schedule as ms

    key = ("runner", settings.number, settings.repeat, settings.runner_timeout)
    if key not in _CACHE:
        cfg = ms.runner.EvaluatorConfig(number=settings.number, repeat=settings.repeat, min_repeat_ms=0,
                                        enable_cpu_cache_flush=False)
        import sys

        import cloudpickle

        # The runner's worker process may not import ``benchmarks``: ship alloc_in_bounds by value.
        cloudpickle.register_pickle_by_value(sys.modules[__name__])
        _CACHE[key] = ms.runner.LocalRunner(timeout_sec=settings.runner_timeout, evaluator_config=cfg,
                                            f_alloc_argument=alloc_in_bounds)
    return _CACHE[key]


def alloc_in_bounds(device, args_info, alloc_repeat):
    """The runner's arguments: random floats as MetaSchedule fills them, integers all zero.

    MetaSchedule fills every input at random, so a kernel that loads through a loaded index
    (gather/take) would read out of bounds, and an illegal address poisons the runner's CUDA
    context for every later candidate. Index 0 is valid for any gather, so such kernels can be
    tuned too (their timing then reads one row over and over: cache-friendly, a lower bound).
    """
    import numpy as np
    from tvm.s_tir.meta_schedule.runner.utils import alloc_argument_common
    from tvm.s_tir.meta_schedule.utils import get_global_func_with_default_on_worker

    random_fill = get_global_func_with_default_on_worker("tvm.contrib.random.random_fill_for_measure", None)

    def fill(tensor):
        if "int" in str(tensor.dtype):
            tensor.copyfrom(np.zeros(tensor.shape, str(tensor.dtype)))
        else:
            random_fill(tensor)

    return alloc_argument_common(fill, device, args_info, alloc_repeat)


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


def open_database(work_dir: str):
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
        print(f"    tuning db {work_dir}: merged {added} record(s) from *.json.xz", flush=True)
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
                    state["error"] = str(r.error_msg).strip().splitlines()[-1][:200]

    return Progress()


def _quiet_ms_logging():
    """MetaSchedule's console output: warnings only (the full log stays in ``work_dir/logs``)."""
    # MetaSchedule rebuilds its logging config from the handlers already on its logger and cannot
    # handle unnamed ones (pytest's capture handlers, after an earlier tuning in this process).
    ms_logger = logging.getLogger("tvm.s_tir.meta_schedule")
    for handler in [h for h in ms_logger.handlers if h.get_name() is None]:
        ms_logger.removeHandler(handler)
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


def _tune_one(ctx, work_dir, settings, builder, runner, db):
    """Tune one TuneContext (its trials in ``settings.per_iter`` batches); (progress state, error)."""
    from tvm.s_tir import meta_schedule as ms

    state = {"trials": 0, "built": 0, "ran": 0, "best": float("inf")}
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
        lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
        return state, f"{type(e).__name__}: {lines[-1][:200] if lines else ''}"


def dlight_record(task, target, builder, runner, db) -> float | None:
    """Measure DLight's schedule of ``task`` with the tuning run's own builder and runner and
    commit it to ``db`` as one more record (microseconds; None where DLight has no schedule or it
    fails to build or run). The database's best is then never worse than what the build would
    get without it: at a budget of a few random candidates (a GEMV has no tensor-core sketch),
    MetaSchedule alone lost to DLight by 3x on the H200."""
    from tvm.s_tir import meta_schedule as ms

    from vtc_tvm.rewrite import _dlight_schedule

    mod = task.dispatched[0]
    try:
        with target:
            _, sch = _dlight_schedule(mod["main"], target)
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
    db.commit_tuning_record(ms.database.TuningRecord(sch.trace, db.commit_workload(mod), result.run_secs, target,
                                                     args_info))
    return float(np.mean([float(t) for t in result.run_secs])) * 1e6


def tune(fused_mods: list[tvm.IRModule], target, work_dir: str, settings: TuneSettings, runner=None,
         builder=None, label: str = "", stats: dict | None = None, log=print, quiet_if_done: bool = False):
    """Tune the kernels of the modules ``fused_mods`` (each after ``FuseTIR``) that ``work_dir``'s
    database has no record for (see :func:`tune_groups`); returns the database."""
    return tune_groups([(work_dir, fused_mods)], target, settings, runner=runner, builder=builder, label=label,
                       stats=stats, log=log, quiet_if_done=quiet_if_done)[0]


def tune_groups(groups, target, settings: TuneSettings, runner=None, builder=None, label: str = "",
                stats: dict | None = None, log=print, quiet_if_done: bool = False):
    """Tune the kernels of every ``(work_dir, [fused modules])`` group that its database has no
    record for, one task after the other; returns the databases, in group order.

    Only tasks ``settings.tasks`` selects are tuned ("anchor": kernels with a matmul/conv, the
    rest stays with DLight; "all"), the largest FLOP count first over all groups, until
    ``settings.deadline`` (a ``time.time()`` value) passes; the rest are left to DLight and
    counted as skipped. So tuning all the cases of a run up front (stock and vtc modules
    together) makes a spent budget drop the smallest kernels of any case, alike for both variants.
    """
    from tvm.s_tir import meta_schedule as ms

    t_start = time.time()
    stats = {} if stats is None else stats
    tag = f" {label}" if label else ""
    stats.update(tasks=0, in_db=0, tuned=0, failed=0, skipped=0, tune_s=0.0)
    dbs, todo = [], []  # todo: (task, group index)
    with target:
        for g, (work_dir, fused_mods) in enumerate(groups):
            db = open_database(work_dir)
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
                    f"process only): {', '.join(lost)}", flush=True)
            has = [db.query_tuning_record(t.dispatched[0], target, "main") is not None for t in tasks]
            stats["tasks"] += len(tasks)
            stats["in_db"] += sum(has)
            todo += [(t, g) for t, h in zip(tasks, has) if not h and _selected(t, settings) and _key(t) not in _FAILED]
        todo.sort(key=lambda tg: _flops(tg[0]), reverse=True)
        where = f" in {len(groups)} databases" if len(groups) > 1 else ""
        if quiet_if_done and not todo:
            return dbs
        log(f"    metaschedule{tag}: {stats['tasks']} tasks{where}, {stats['in_db']} in the database, {len(todo)} to "
            f"tune x {settings.trials} trials, {stats['tasks'] - stats['in_db'] - len(todo)} left to DLight", flush=True)
        if not todo or settings.trials <= 0:
            return dbs
        _quiet_ms_logging()
        builder = builder or pooled_builder(settings.builder_workers, settings.builder_timeout)
        runner = runner or local_runner(settings)
        for i, (task, g) in enumerate(todo):
            if settings.deadline is not None and time.time() > settings.deadline:
                stats["skipped"] = len(todo) - i
                log(f"      tuning budget spent: {len(todo) - i} task(s) left to DLight: "
                    + ", ".join(t.task_name for t, _ in todo[i:]), flush=True)
                break
            work_dir, db = groups[g][0], dbs[g]
            t_task = t0 = time.time()
            _quiet_ms_logging()
            ctx = ms.relax_integration.extracted_tasks_to_tune_contexts(
                [task], work_dir=work_dir, space=settings.space_generator(target), strategy=settings.strategy(),
                seed=settings.seed)[0][0]
            state, err = _tune_one(ctx, work_dir, settings, builder, runner, db)
            space = ""
            if not state["ran"] and settings.fallback_space(target):  # e.g. GEMV (M=1): no tensor-core sketch
                kind = settings.fallback_space(target)
                _quiet_ms_logging()
                retry, _ = ms.relax_integration.extracted_tasks_to_tune_contexts(
                    [task], work_dir=work_dir, space=settings.space_generator(target, kind),
                    strategy=settings.strategy(max_fail_count=30, min_population=128), seed=settings.seed)
                t0 = time.time()
                state, err2 = _tune_one(retry[0], work_dir, settings, builder, runner, db)
                space = f" [{kind} space; tensor-core space: {err or 'no valid candidate'}]"
                err = err2
            if state["ran"]:
                stats["tuned"] += 1
            else:
                stats["failed"] += 1
                _FAILED.add(_key(task))
            dlight_us = dlight_record(task, target, builder, runner, db) if settings.dlight_baseline else None
            if dlight_us is not None:
                stats["dlight_better"] = stats.get("dlight_better", 0) + int(dlight_us < state["best"] * 1e6)
            best = f"{state['best'] * 1e6:.1f} us" if state["best"] < float("inf") else "none"
            split = ""
            if "end" in BUILD_TIMES and state.get("batches") == 1:  # one batch: search, build, run
                split = (f" (search {BUILD_TIMES['start'] - t0:.1f} + build "
                         f"{BUILD_TIMES['end'] - BUILD_TIMES['start']:.1f} + run {state['measured'] - BUILD_TIMES['end']:.1f})")
            name = task.task_name if len(groups) == 1 else f"{os.path.basename(work_dir)}:{task.task_name}"
            if dlight_us is not None:
                best += f" (DLight {dlight_us:.1f} us)"
            log(f"      [{i + 1}/{len(todo)}] {name} ({_flops(task) / 1e9:.2f} GFLOP): "
                f"{state['trials']} trials, {state['built']} built, {state['ran']} ran, best {best}; "
                f"{time.time() - t_task:.1f} s{split}{space}" + (f"  ({err})" if err and not state["ran"] else ""),
                flush=True)
            pack_database(db, work_dir)  # after every task: a killed run keeps what it tuned
        stats["tune_s"] = round(time.time() - t_start, 1)
        log(f"    metaschedule{tag}: {stats['tuned']} tuned, {stats['failed']} failed, {stats['skipped']} skipped "
            f"in {stats['tune_s']} s; best records in " + ", ".join(sorted({w for w, _ in groups})) + " (*.json.xz)",
            flush=True)
    return dbs


def tune_and_apply(fused: tvm.IRModule, target, work_dir: str, settings: TuneSettings, runner=None,
                   builder=None, label: str = "", stats: dict | None = None, log=print) -> tvm.IRModule:
    """:func:`tune` the kernels of ``fused`` (after ``FuseTIR``), then return ``fused`` with every
    kernel that has a record replaced by its best schedule (marked ``tirx.is_scheduled``)."""
    stats = {} if stats is None else stats
    db = tune([fused], target, work_dir, settings, runner=runner, builder=builder, label=label, stats=stats, log=log,
              quiet_if_done=True)
    with target, db:
        applied = relax.transform.MetaScheduleApplyDatabase()(fused)
    stats["ms_kernels"] = len(scheduled_kernels(applied))
    return applied


# ----------------------------------------------------------------------------------------------
# Pipelines
# ----------------------------------------------------------------------------------------------
def _backend(target):
    from tvm.relax import backend

    if target.kind.name == "cuda":
        return backend.cuda.pipeline
    if target.kind.name == "llvm":
        return backend.cpu_generic.pipeline
    return backend.gpu_generic.pipeline


def split_pipeline(target, variant: str = "stock"):
    """(front, rest) of the stock or vtc pipeline, cut where DLight would schedule the fused kernels.

    ``front`` ends with ``FuseTIR`` (vtc: and the store side); ``rest`` starts with DLight (which
    skips kernels MetaSchedule scheduled), then lowers and finalizes.
    """
    from vtc_tvm.pipeline import fusion_passes
    from vtc_tvm.transform import VirtualTensorize

    backend = _backend(target)
    legal = fusion_passes(target, stores=True) if variant == "vtc" else list(backend.legalize_passes(target))
    cut = next((i for i, p in enumerate(legal) if "ApplyDefaultSchedule" in p.info.name), len(legal))
    front = ([VirtualTensorize(target=target, memory_guard=True)] if variant == "vtc" else []) + list(
        backend.library_dispatch_passes(target)) + legal[:cut]
    rest = legal[cut:] + list(backend.dataflow_lower_passes(target)) + list(backend.finalize_passes(target))
    return front, rest


def fuse(mod, target, variant: str = "stock") -> tvm.IRModule:
    """``mod`` through the front of the pipeline: the fused kernels MetaSchedule tunes."""
    front, _ = split_pipeline(target, variant)
    with target:
        return strip_metadata(tvm.transform.Sequential(front)(mod))


def tune_variants(mod, target, work_dir: str, settings: TuneSettings, variants=("stock", "vtc"), runner=None,
                  builder=None, label: str = "", stats: dict | None = None):
    """Tune the kernels of ``mod`` compiled as each of ``variants`` together (before compiling them
    with :func:`compile_metaschedule`, which then finds every record in the database)."""
    fused = [fuse(mod, target, v) for v in variants]
    return tune(fused, target, work_dir, settings, runner=runner, builder=builder, label=label, stats=stats)


def compile_metaschedule(mod, target, work_dir: str, settings: TuneSettings, variant: str = "stock",
                         runner=None, builder=None, label: str = "", stats: dict | None = None):
    """Stock (``relax.get_default_pipeline``) or vtc (``vtc_pipeline``) compile of ``mod`` with
    MetaSchedule in place of DLight for every fused kernel it has (or now tunes) a record for."""
    _, rest = split_pipeline(target, variant)
    fused = fuse(mod, target, variant)
    tuned = tune_and_apply(fused, target, work_dir, settings, runner=runner, builder=builder,
                           label=label or variant, stats=stats)
    rest_seq = tvm.transform.Sequential(rest)

    @tvm.transform.module_pass(opt_level=0, name="vtc_bench_ms_rest")
    def _rest(m, _ctx):
        with target:
            return rest_seq(m)

    return tvm.compile(tuned, target=target, relax_pipeline=_rest)


def scheduled_kernels(mod: tvm.IRModule) -> list[str]:
    """Names of the PrimFuncs MetaSchedule scheduled (``tirx.is_scheduled``)."""
    return sorted(gv.name_hint for gv, f in mod.functions_items()
                  if isinstance(f, tvm.tirx.PrimFunc) and f.attrs and f.attrs.get("tirx.is_scheduled"))


# ----------------------------------------------------------------------------------------------
# Command line: inspect databases, collect the committed files
# ----------------------------------------------------------------------------------------------
def _databases(root):
    for dirpath, _dirs, files in sorted(os.walk(root)):
        if WORKLOAD_FILE + ".xz" in files or WORKLOAD_FILE in files:
            yield dirpath


def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(description="MetaSchedule databases of the benchmarks")
    sub = ap.add_subparsers(dest="cmd", required=True)
    info = sub.add_parser("info", help="records and best time per workload of every database under DIR")
    info.add_argument("dir", nargs="?", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tuning"))
    col = sub.add_parser("collect", help="copy every *.json.xz under SRC to DEST (same layout): what to commit")
    col.add_argument("src")
    col.add_argument("dest")
    args = ap.parse_args(argv)
    if args.cmd == "collect":
        n = 0
        for d in _databases(args.src):
            for name in (WORKLOAD_FILE, RECORD_FILE):
                src = os.path.join(d, name + ".xz")
                if os.path.exists(src):
                    out = os.path.join(args.dest, os.path.relpath(d, args.src))
                    os.makedirs(out, exist_ok=True)
                    shutil.copy2(src, out)
                    n += 1
        print(f"copied {n} file(s) to {args.dest}")
        return 0
    for d in _databases(args.dir):
        db = open_database(d)
        with tempfile.TemporaryDirectory() as tmp:
            pruned = ms_database(tmp)
            db.dump_pruned(pruned)
            best = sorted(1e6 * sum(float(x) for x in r.run_secs) / len(r.run_secs)
                          for r in pruned.get_all_tuning_records() if r.run_secs)
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".xz"))
        print(f"{d}: {len(db)} records, {len(best)} tuned workloads (best us: "
              f"{', '.join(f'{t:.1f}' for t in best)}), {size / 1024:.1f} KiB in *.json.xz")
    return 0


def ms_database(work_dir):
    from tvm.s_tir import meta_schedule as ms

    return ms.database.JSONDatabase(work_dir=work_dir)


if __name__ == "__main__":
    import sys

    sys.exit(main())
