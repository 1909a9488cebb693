"""MetaSchedule for both harnesses (``benchmarks.run`` and ``benchmarks.kernels``): a thin caller
of :mod:`vtc_tvm.tuning`, which holds the machinery (settings, the warm build pool, the runners
with in-bounds integer inputs, the untuned build's baseline time, the database files, the tuning loop).

This module adds what only the harnesses need: the ``--ms-*`` command-line options, compiling one
variant ("stock" or "vtc") with MetaSchedule (:func:`compile_metaschedule`) and tuning stock and
vtc into one database first (:func:`tune_variants`; stock and vtc share ``work_dir``, so a kernel
both variants contain is tuned once), and ``python -m benchmarks.tuning info|collect`` for the
committed databases (``benchmarks/tuning/<workload>/*.json.xz``).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time

import tvm

from vtc_tvm.tuning import (  # noqa: F401  (re-exported: the harnesses and tests use these names)
    RECORD_FILE,
    WORKLOAD_FILE,
    TuneSettings,
    alloc_in_bounds,
    apply_database,
    fake_runner,
    indirect,
    local_runner,
    open_database,
    pack_database,
    pooled_builder,
    reloadable,
    rpc_runner,
    scheduled_kernels,
    strip_metadata,
    tune_groups,
)
from vtc_tvm.tuning import split_pipeline as _split_pipeline
from vtc_tvm.tuning import tune_fused as tune  # noqa: F401  (the harnesses' name)


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
                   help="do not measure the untuned schedule of each tuned task (records then apply unguarded)")
    g.add_argument("--ms-fake-runner", action="store_true",
                   help="measure nothing (pseudo-random times): checks the tuning flow without a device; "
                        "its database goes to a scratch folder unless --tuning-dir is given")
    g.add_argument("--ms-rpc", metavar="HOST:PORT:KEY", default=None,
                   help="measure through TVM's RPC tracker at HOST:PORT on the servers registered as KEY "
                        "(ms.runner.RPCRunner; one worker per server: --ms-rpc-workers)")
    g.add_argument("--ms-rpc-workers", type=int, default=1, help="RPC sessions measured at a time")


def settings_from_args(args, trials: int) -> TuneSettings:
    return TuneSettings(
        trials=trials, population=args.ms_population, genetic_iters=args.ms_genetic_iters,
        init_measured_ratio=args.ms_init_measured_ratio, per_iter=args.ms_per_iter, number=args.ms_number,
        repeat=args.ms_repeat, builder_workers=args.ms_builders, tasks=args.ms_tasks,
        deadline=None if args.ms_budget_s is None else time.time() + args.ms_budget_s,
        dlight_baseline=not args.ms_no_dlight_baseline)


def runner_from_args(args, default_dir: str):
    """(tuning dir, runner): None is the default ``LocalRunner``; the fake runner never writes into
    the default (committed) databases."""
    if getattr(args, "ms_rpc", None):
        host, port, key = args.ms_rpc.rsplit(":", 2)
        return args.tuning_dir, rpc_runner(host, int(port), key, max_workers=args.ms_rpc_workers,
                                           settings=settings_from_args(args, 0))
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
    d["runner"] = "LocalRunner" if runner is None else (
        "fake (no measurement)" if type(runner).__name__ == "FakeRunner" else type(runner).__name__)
    d["cost_model"] = settings.cost_model()
    d["genetic_iters"] = settings.genetic_num_iters()
    return d


def tune_and_apply(fused: tvm.IRModule, target, work_dir: str, settings: TuneSettings, runner=None,
                   builder=None, label: str = "", stats: dict | None = None) -> tvm.IRModule:
    """:func:`tune` the kernels of ``fused`` (after ``FuseTIR``), then return ``fused`` with every
    kernel that has a record replaced by its best schedule (marked ``tirx.is_scheduled``)."""
    stats = {} if stats is None else stats
    db = tune([fused], target, work_dir, settings, runner=runner, builder=builder, label=label, stats=stats,
              quiet_if_done=True)
    applied = apply_database(fused, target, db, work_dir)
    stats["ms_kernels"] = len(scheduled_kernels(applied))
    return applied


# ----------------------------------------------------------------------------------------------
# Pipelines
# ----------------------------------------------------------------------------------------------
def split_pipeline(target, variant: str = "stock"):
    """(front, rest) of the stock or vtc pipeline (:func:`vtc_tvm.tuning.split_pipeline`), DLight
    behind MetaSchedule on both sides: the harness compares the same tuner and fallback."""
    return _split_pipeline(target, vtc=variant == "vtc", schedules="dlight")


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
