"""End-to-end benchmark of the paper's workloads: stock TVM vs vtc-tvm (vs PyTorch when importable).

    python -m benchmarks.run --suite paper --target cuda --tuner dlight|ms:N [--batch 1 16] [--cases ...]
                             [--out DIR] [--repeat 100] [--max-autotune] [--no-torch-compile] [--dry]
                             [--tuning-dir DIR] [--ms-budget-s S] [--ms-tasks anchor|all] [--ms-fake-runner]
    python -m benchmarks.run --suite paper --target llvm --size small --repeat 3      (CPU smoke run)

Per case (workload x batch), in one process: build stock TVM (``relax.get_default_pipeline``) and
vtc-tvm (``vtc_pipeline``) with the same scheduler (DLight, or MetaSchedule ``ms:N`` through
:mod:`benchmarks.tuning`, one database per workload in ``--tuning-dir``/<workload>, every case's
kernels tuned up front); count kernels and data-movement kernels; check vtc against stock (rel L2;
fp16 < 1e-2, fp32 < 1e-4) and, with torch on the GPU, stock, vtc and torch against the torch twin
run in float64 (for fp16, ``numerics_ok`` is vtc vs float64 < 1e-2); time both with
:func:`benchmarks.timing.time_callable`, the one timing function of TVM and torch alike (median of
``--repeat`` measurements of back-to-back calls, activations rotated over copies exceeding 2x the
L2, L2 flushed before each measurement); per-kernel GPU time (CUPTI via
torch.profiler) split into data movement vs compute; peak memory of one call; and PyTorch on the
same function and weights, timed the same way: eager, torch.compile default, max-autotune and CUDA
graphs (``--torch-modes``), each failure recorded, and their best. ``--dry`` only compiles (no
device needed).

Memory: ``*_peak_mib`` is measured on CUDA as the drop of ``dev.available_global_memory`` over
one call of a fresh VM after the pooled allocator was cleared (pool growth: intermediates +
outputs, 2 MiB granularity); on CPU / ``--dry`` it is the planned bytes (``*_planned_mib``, static
memory planning of intermediates, outputs excluded). ``peak_source`` says which.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import subprocess
import sys
import time
import traceback
import zlib

import numpy as np
import tvm
from tvm import relax

import vtc_tvm  # noqa: F401  (registers the pass)
from vtc_tvm.analysis import is_data_movement
from vtc_tvm.pipeline import cuda_target, store_side_pipeline, vtc_pipeline
from vtc_tvm.report import fused_module, kernel_census, uses_tensor_cores
from vtc_tvm.transform import VirtualTensorize

from . import tuning
from .timing import cache_bytes, copies_for, rotation, time_callable, time_interleaved
from .whole_models import WHOLE_WORKLOADS
from .workloads import WORKLOADS, has_torch_twin, is_weight, load_torch, torch_module

SUITES = {"paper": ["llama_decode", "llama_prefill", "gemma2_decode", "effvit_attn", "yolo_c3k2",
                    "shufflenet_unit", "shufflenet_v2"],
          "whole": list(WHOLE_WORKLOADS),  # whole ONNX models (benchmarks/whole_models.py); torch peer: benchmarks/onnx_torch.py
          "static_cache": ["llama_decode_static", "gemma2_decode_static"]}
CASES = {**WORKLOADS, **WHOLE_WORKLOADS}
MIB = 2 ** 20
HERE = os.path.dirname(os.path.abspath(__file__))


# ----------------------------------------------------------------------------------------------
# Building
# ----------------------------------------------------------------------------------------------
def parse_tuner(tuner: str):
    if tuner == "dlight":
        return "dlight", 0
    if tuner.startswith("ms:"):
        return "metaschedule", int(tuner.split(":", 1)[1])
    raise ValueError(f"--tuner must be dlight or ms:N, not {tuner!r}")


def build(mod, target, variant: str, tuner: str, tuning_dir: str | None = None, settings=None, runner=None,
          stats: dict | None = None, vtc_options: dict | None = None, vtc_mod=None):
    """Compile ``mod`` as ``variant`` ("stock" or "vtc") with the given scheduler.

    ``vtc_options`` go to :func:`vtc_tvm.VirtualTensorize` (DLight only; e.g. ``profile``).
    ``vtc_mod``: ``mod`` already through the load side (with ``vtc_options``, under the target):
    with DLight, the vtc build then runs the rest of the ``"vtc"`` pipeline on it
    (:func:`vtc_tvm.pipeline.store_side_pipeline`) instead of planning again.

    MetaSchedule (``ms:N``): :func:`benchmarks.tuning.compile_metaschedule` with ``settings``
    (default: :class:`~benchmarks.tuning.TuneSettings` with N trials), the database in
    ``tuning_dir`` and ``runner`` (default: a ``LocalRunner``; tests pass a fake one).
    """
    kind, trials = parse_tuner(tuner)
    if kind == "dlight":
        if variant == "stock":
            pipeline = relax.get_default_pipeline(target)
        elif variant == "stock_sched":  # stock TVM + vtc_tvm.schedules, no virtual tensors
            pipeline = relax.get_pipeline("stock_vtc_schedules", target=target)
        elif vtc_mod is not None:
            mod, pipeline = vtc_mod, store_side_pipeline(target)
        else:
            pipeline = vtc_pipeline(target, **(vtc_options or {}))
        return tvm.compile(mod, target=target, relax_pipeline=pipeline)
    settings = settings or tuning.TuneSettings(trials=trials)
    return tuning.compile_metaschedule(mod, target, tuning_dir, settings, variant=variant, runner=runner,
                                       stats=stats)


def kernel_classes(fused) -> dict:
    """PrimFunc name -> "dm" (only moves data) or "compute"."""
    out = {}
    for gv, f in fused.functions_items():
        if isinstance(f, tvm.tirx.PrimFunc):
            try:
                out[gv.name_hint] = "dm" if is_data_movement(f) else "compute"
            except Exception:  # noqa: BLE001
                out[gv.name_hint] = "compute"
    return out


def classify_kernel(kernel: str, classes: dict) -> str:
    """CUDA kernel names are the PrimFunc name + ``_kernel`` (maybe numbered); longest prefix wins."""
    best = None
    for name in classes:
        if kernel == name or kernel.startswith(name + "_kernel"):
            if best is None or len(name) > len(best):
                best = name
    return classes[best] if best else "other"


# ----------------------------------------------------------------------------------------------
# Measuring
# ----------------------------------------------------------------------------------------------
def _torch():
    try:
        import torch

        return torch if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001
        return None


def _nbytes(arrays):
    return sum(a.nbytes for a in arrays)


def gpu_kernel_us(call, sets, torch, iters=20):
    """Mean GPU time per call of every kernel, by name (CUPTI through torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    for i in range(3):
        call(*sets[i % len(sets)])
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(iters):
            call(*sets[i % len(sets)])
        torch.cuda.synchronize()
    times = {}
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        k = ev.key.lower()
        if t and "memcpy" not in k and "memset" not in k:
            times[ev.key] = t / iters
    return times


def tvm_peak_mib(ex, dev, args):
    """Pool growth over one call of a fresh VM (intermediates + outputs), in MiB."""
    clear = tvm.get_global_func("vm.builtin.memory_manager.clear")
    vm = relax.VirtualMachine(ex, dev)
    out = vm["main"](*args)  # loads the kernels
    dev.sync()
    del out
    clear()
    dev.sync()
    before = dev.available_global_memory
    out = vm["main"](*args)
    dev.sync()
    after = dev.available_global_memory
    del out, vm
    clear()
    return (before - after) / MIB


def _flat(o):
    if isinstance(o, tvm.runtime.Tensor):
        return [o.numpy()]
    if hasattr(o, "detach"):  # a torch tensor; float64 keeps a float64 reference exact
        return [o.detach().cpu().double().numpy()]
    return [a for x in o for a in _flat(x)]


def rel_l2(outs, ref):
    errs = []
    for a, b in zip(outs, ref):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if not np.isfinite(a).all():
            return float("inf")
        errs.append(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
    return float(max(errs))


# ----------------------------------------------------------------------------------------------
# One case
# ----------------------------------------------------------------------------------------------
def run_case(wl, batch, args, target, dev, torch):
    gpu = target.kind.name == "cuda"
    dtype = "float16" if gpu else "float32"
    tol = 1e-2 if dtype == "float16" else 1e-4
    kind, trials = parse_tuner(args.tuner)
    row = {"workload": wl.name, "batch": batch, "size": args.size, "dtype": dtype, "scheduler": kind,
           "trials": trials, "description": wl.description}
    t_case = time.time()
    cfg = wl.config(args.size, batch, dtype)
    row["config"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(cfg).items()}
    if getattr(args, "source", "builder") == "onnx":  # the path a TVM user takes: from_onnx
        from .onnx_models import onnx_module

        mod = onnx_module(wl.name, cfg)
    else:
        mod = wl.build(cfg)
    row["source"] = getattr(args, "source", "builder")
    tuning_dir = os.path.join(args.tuning_dir, wl.name)
    settings, runner = getattr(args, "ms_settings", None), getattr(args, "ms_runner", None)
    if kind == "metaschedule":
        # Tune stock's and vtc's kernels together first (a spent --ms-budget-s then hits both alike);
        # the two builds below find every record in the database.
        settings = settings or tuning.TuneSettings(trials=trials)
        row["tuning_dir"] = tuning_dir
        row["metaschedule"] = {}
        t0 = time.time()
        tuning.tune_variants(mod, target, tuning_dir, settings, runner=runner, label="stock+vtc",
                             stats=row["metaschedule"])
        row["tune_s"] = round(time.time() - t0, 2)

    exes, fused = {}, {}
    vtc_options = {"memory_guard": True, "inplace": getattr(wl, "inplace", ()),  # as vtc_pipeline; updatable caches
                   **(getattr(args, "vtc_options", None) or {})}
    # On GPUs with DLight, a middle column: stock TVM with our small-batch schedules (the schedule
    # gain and the virtual-tensor gain each visible).
    variants = ("stock", "stock_sched", "vtc") if gpu and kind == "dlight" else ("stock", "vtc")
    # The load side once: its module is what the vtc build (DLight; MetaSchedule plans inside its
    # own fusion), the census and the kernel classes all start from. Under the target, as inside
    # the "vtc" pipeline.
    decisions = []
    t0 = time.time()
    with target:
        vtc_mod = VirtualTensorize(target=target, report=decisions, **vtc_options)(mod)
    load_side_s = time.time() - t0
    if vtc_options.get("profile") is not None:  # what on-device profiling decided, edge by edge
        row["vtc_profiled"] = [f"{d['tensor']} -> {d['consumer']}: {d['reason']}"
                               for d in decisions if "profiled" in d["reason"]]
    for variant in variants:
        t0 = time.time()
        stats = {}
        exes[variant] = build(mod, target, variant, args.tuner, tuning_dir, settings=settings, runner=runner,
                              stats=stats, vtc_options=vtc_options, vtc_mod=vtc_mod)
        # vtc's compile time includes its load side (run once, above) where its build used it
        row[f"{variant}_compile_s"] = round(time.time() - t0 + (load_side_s if variant == "vtc" and kind == "dlight"
                                                                else 0.0), 2)
        if stats:
            row[f"{variant}_ms_kernels"] = stats.get("ms_kernels")  # kernels scheduled by MetaSchedule
        source, stores = (vtc_mod, True) if variant == "vtc" else (mod, False)
        fused_mod = fused_module(source, target, stores)
        census = kernel_census(source, target, stores, fused=fused_mod)
        row[f"{variant}_kernels"] = census["kernels"]
        row[f"{variant}_dm_kernels"] = census["data_movement"]
        row[f"{variant}_planned_mib"] = census["planned_bytes"] / MIB
        fused[variant] = kernel_classes(fused_mod)
    row["vtc_tensor_cores"] = uses_tensor_cores(exes["vtc"]) if gpu else None
    row["stock_tensor_cores"] = uses_tensor_cores(exes["stock"]) if gpu else None
    if args.dry:
        row["peak_source"] = "planned"
        row["stock_peak_mib"], row["vtc_peak_mib"] = row["stock_planned_mib"], row["vtc_planned_mib"]
        row["seconds"] = round(time.time() - t_case, 1)
        return row

    # Numerics: fresh random inputs (seed per case), vtc vs stock.
    seed = zlib.crc32(f"{wl.name}/{batch}/{time.time_ns()}".encode())  # fresh every run
    inputs = wl.inputs(mod, cfg, seed)
    row["input_mib"] = _nbytes(inputs) / MIB
    # activations rotated over distinct copies, one copy of the weights (as the torch module holds them)
    sets = rotation(inputs, lambda a: tvm.runtime.tensor(a, dev), device=dev,
                    shared=[is_weight(p.name) for p in mod["main"].params])
    row["rotated_sets"] = len(sets)
    vms = {v: relax.VirtualMachine(exes[v], dev) for v in exes}
    outs = {v: _flat(vms[v]["main"](*sets[0])) for v in vms}
    row["max_rel_err"] = rel_l2(outs["vtc"], outs["stock"])  # vtc vs stock
    row["numerics_basis"] = "vtc vs stock"
    row["numerics_ok"] = bool(row["max_rel_err"] < tol)
    ref = outs["stock"]

    # Latency (the VM function called in a loop, exactly as the torch peers' forward below), and
    # time_evaluator as a cross-check (no rotation).
    # stock and vtc measured in turn, so a drift of the shared GPU falls on both alike.
    timings = time_interleaved({v: (vm["main"], sets) for v, vm in vms.items()}, device=dev, repeat=args.repeat)
    for v, vm in vms.items():
        timing = timings[v]
        row[f"{v}_ms"] = timing.median_ms
        row[f"{v}_timing"] = timing.as_dict()
        te = vm.time_evaluator("main", dev, number=1, repeat=args.repeat)(*sets[0])
        row[f"{v}_ms_time_evaluator"] = float(np.median(te.results)) * 1e3
    row["speedup"] = row["stock_ms"] / row["vtc_ms"] if row["vtc_ms"] else None
    if "stock_sched_ms" in row:
        row["sched_speedup"] = row["stock_ms"] / row["stock_sched_ms"] if row["stock_sched_ms"] else None
    row["timing"] = (f"benchmarks.timing.time_interleaved (stock and vtc in turn): {timing.method}, "
                     f"median of {args.repeat} measurements")

    # Per-kernel GPU time, split into data movement / compute.
    if gpu and torch is not None:
        for v, vm in vms.items():
            per = gpu_kernel_us(vm["main"], sets, torch)
            split = {"dm": 0.0, "compute": 0.0, "other": 0.0}
            for k, us in per.items():
                split[classify_kernel(k, fused[v])] += us
            row[f"{v}_dm_us"], row[f"{v}_compute_us"], row[f"{v}_other_us"] = split["dm"], split["compute"], split["other"]
            row[f"{v}_gpu_us"] = sum(per.values())
            row[f"{v}_kernel_us"] = {k: round(us, 2) for k, us in sorted(per.items(), key=lambda kv: -kv[1])}
            row[f"{v}_launched_kernels"] = len(per)
    del vms

    # Peak memory of one call.
    if gpu:
        row["peak_source"] = "measured: dev.available_global_memory drop over one call (pool growth)"
        try:
            for v in exes:
                row[f"{v}_peak_mib"] = tvm_peak_mib(exes[v], dev, sets[0])
        except Exception as err:  # noqa: BLE001 - fall back to the plan
            row["peak_source"] = f"planned (measuring failed: {type(err).__name__}: {str(err)[:100]})"
            row["stock_peak_mib"], row["vtc_peak_mib"] = row["stock_planned_mib"], row["vtc_planned_mib"]
    else:
        row["peak_source"] = "planned"
        row["stock_peak_mib"], row["vtc_peak_mib"] = row["stock_planned_mib"], row["vtc_planned_mib"]

    # Numerics against a float64 reference: the torch twin in float64 on the same inputs/weights.
    ref64 = None
    if torch is not None and gpu and has_torch_twin(wl):
        try:
            ref64 = fp64_reference(wl, cfg, mod, inputs, torch)
            row["stock_rel_err_fp64"] = rel_l2(outs["stock"], ref64)
            row["vtc_rel_err_fp64"] = rel_l2(outs["vtc"], ref64)
            if "stock_sched" in outs:
                row["stock_sched_rel_err_fp64"] = rel_l2(outs["stock_sched"], ref64)
            if dtype == "float16":
                row["numerics_basis"] = "vtc vs fp64 torch twin"
                row["numerics_ok"] = bool(row["vtc_rel_err_fp64"] < tol)
        except Exception as err:  # noqa: BLE001 - recorded; numerics_ok stays vtc vs stock
            traceback.print_exc()
            row["fp64_error"] = f"{type(err).__name__}: {str(err)[:300]}"
            ref64 = None
            torch.cuda.empty_cache()
    del outs

    if torch is not None and gpu and not args.no_torch and has_torch_twin(wl):
        try:
            _torch_peers(row, wl, cfg, mod, inputs, ref, args, torch, ref64)
        except Exception as err:  # noqa: BLE001 - a failing peer is reported, not fatal
            traceback.print_exc()
            row["torch_error"] = f"{type(err).__name__}: {str(err)[:300]}"
    row["seconds"] = round(time.time() - t_case, 1)
    return row


def fp64_reference(wl, cfg, mod, inputs, torch, device="cuda"):
    """The outputs of the workload's torch twin run in float64 on ``inputs`` (activations and
    weights upcast from the very arrays TVM ran on), as float64 numpy arrays. The twin's RMSNorm
    and softmax upcast with ``.float()`` like HF's code, so those two steps run in float32."""
    arrays = [a.astype(np.float64) if a.dtype.kind == "f" else a for a in inputs]
    module, acts = load_torch(torch_module(wl, cfg), mod, arrays, device=device)
    module.eval()
    try:
        with torch.no_grad():
            return _flat(module(*acts))
    finally:
        del module, acts
        if device == "cuda":
            torch.cuda.empty_cache()


TORCH_MODES = {  # --torch-modes name: (result key prefix, torch.compile arguments; None: eager)
    "eager": ("torch_eager", None),
    "compile": ("torch_compile", {}),
    "max-autotune": ("torch_compile_max_autotune", {"mode": "max-autotune"}),
    "cudagraphs": ("torch_compile_cudagraphs", {"mode": "reduce-overhead"}),
}


def _torch_peers(row, wl, cfg, mod, inputs, ref, args, torch, ref64=None):
    """The torch twin as eager, torch.compile default, max-autotune and CUDA graphs (``args.torch_modes``),
    each timed by :func:`time_callable` like the TVM side (a failing mode is recorded, not fatal),
    and the best of them (``torch_best_ms``, ``torch_best_mode``)."""
    module, acts = load_torch(torch_module(wl, cfg), mod, inputs, device="cuda")
    module.eval()
    act_bytes = sum(a.nbytes for p, a in zip(mod["main"].params, inputs) if not is_weight(p.name))
    n_sets = copies_for(act_bytes, cache_bytes("cuda"))
    act_sets = [acts] + [[a.clone() for a in acts] for _ in range(n_sets - 1)]
    with torch.no_grad():
        out = module(*acts)
        flat = _flat(out)
        row["torch_rel_err_vs_stock"] = rel_l2(flat, ref)
        row["torch_numerics_ok"] = bool(row["torch_rel_err_vs_stock"] < 1e-2)
        if ref64 is not None:
            row["torch_rel_err_fp64"] = rel_l2(flat, ref64)
        del out, flat
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        module(*acts)
        torch.cuda.synchronize()
        row["torch_eager_peak_mib"] = (torch.cuda.max_memory_allocated() - base) / MIB
        for mode in args.torch_modes:
            key, kw = TORCH_MODES[mode]
            try:
                fn = module
                if kw is not None:
                    torch._dynamo.reset()
                    t0 = time.time()
                    fn = torch.compile(module, **kw)
                    fn(*acts)
                    torch.cuda.synchronize()
                    row[f"{key}_compile_s"] = round(time.time() - t0, 1)
                timing = time_callable(fn, act_sets, device="cuda", repeat=args.repeat)
                row[f"{key}_ms"] = timing.median_ms
                row[f"{key}_timing"] = timing.as_dict()
                if kw is not None:
                    flat = _flat(fn(*acts))
                    row[f"{key}_rel_err_vs_stock"] = rel_l2(flat, ref)
                    if ref64 is not None:
                        row[f"{key}_rel_err_fp64"] = rel_l2(flat, ref64)
                    del flat
            except Exception as err:  # noqa: BLE001 - a failing mode is a result
                traceback.print_exc()
                row[f"{key}_error"] = f"{type(err).__name__}: {str(err)[:300]}"
            torch.cuda.empty_cache()
    timed = {mode: row[TORCH_MODES[mode][0] + "_ms"] for mode in args.torch_modes
             if row.get(TORCH_MODES[mode][0] + "_ms") is not None}
    if timed:
        row["torch_best_mode"] = min(timed, key=timed.get)
        row["torch_best_ms"] = timed[row["torch_best_mode"]]
    del module, act_sets, acts
    torch._dynamo.reset()
    torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------
# Reporting
# ----------------------------------------------------------------------------------------------
KEYS = ["workload", "batch", "scheduler", "trials", "stock_ms", "stock_sched_ms", "vtc_ms", "torch_eager_ms", "torch_compile_ms",
        "torch_best_ms",
        "stock_peak_mib", "vtc_peak_mib", "stock_kernels", "vtc_kernels", "stock_dm_us", "vtc_dm_us", "max_rel_err",
        "vtc_rel_err_fp64", "stock_planned_mib", "vtc_planned_mib"]


def _f(v, fmt="{:.3f}"):
    if v is None:
        return "-"
    if isinstance(v, float):
        return fmt.format(v)
    return str(v)


def table(rows) -> str:
    cols = [("case", lambda r: f"{r['workload']}/b{r['batch']}"),
            ("stock ms", lambda r: _f(r.get("stock_ms"))), ("vtc ms", lambda r: _f(r.get("vtc_ms"))),
            ("speedup", lambda r: _f(r.get("speedup"), "{:.2f}x")),
            ("eager ms", lambda r: _f(r.get("torch_eager_ms"))),
            ("compile ms", lambda r: _f(r.get("torch_compile_ms"))),
            ("graphs ms", lambda r: _f(r.get("torch_compile_cudagraphs_ms"))),
            ("torch best ms", lambda r: _f(r.get("torch_best_ms")) + (f" ({r['torch_best_mode']})"
                                                                      if r.get("torch_best_mode") else "")),
            ("kernels s/v", lambda r: f"{_f(r.get('stock_kernels'))}/{_f(r.get('vtc_kernels'))}"),
            ("dm kern s/v", lambda r: f"{_f(r.get('stock_dm_kernels'))}/{_f(r.get('vtc_dm_kernels'))}"),
            ("dm us s/v", lambda r: f"{_f(r.get('stock_dm_us'), '{:.1f}')}/{_f(r.get('vtc_dm_us'), '{:.1f}')}"),
            ("peak MiB s/v", lambda r: f"{_f(r.get('stock_peak_mib'), '{:.1f}')}/{_f(r.get('vtc_peak_mib'), '{:.1f}')}"),
            ("rel err v/s", lambda r: _f(r.get("max_rel_err"), "{:.1e}")),
            ("fp64 err s/v/t", lambda r: "/".join(_f(r.get(k), "{:.1e}") for k in
                                                  ("stock_rel_err_fp64", "vtc_rel_err_fp64", "torch_rel_err_fp64"))),
            ("build s s/v", lambda r: f"{_f(r.get('stock_compile_s'))}/{_f(r.get('vtc_compile_s'))}"),
            ("note", lambda r: r.get("error", "") or r.get("torch_error", "")[:60])]
    lines = ["| " + " | ".join(c for c, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(str(fn(r)) for _, fn in cols) + " |")
    return "\n".join(lines)


def markdown(result) -> str:
    rows = result["cases"]
    out = [f"# vtc-tvm paper suite ({result['date']})", "",
           f"commit `{result['commit']}`, device {result['device']}, tvm {result['tvm']}, torch {result['torch']}, "
           f"target `{result['target']}`, tuner `{result['tuner']}`, repeat {result['repeat']}"
           + (" (compile only)" if result.get("dry") else ""), "",
           "s/v = stock TVM / vtc-tvm. Latency: median per call. dm us: GPU time of data-movement kernels per call "
           "(CUPTI). rel err v/s: relative L2 of vtc against stock; fp64 err s/v/t: of stock, vtc and torch eager "
           "against the torch twin in float64. Peak: " + (rows[0].get("peak_source", "") if rows else ""), "",
           table(rows), ""]
    for name in result.get("charts", []):
        out.append(f"![{name}]({name})")
    return "\n".join(out) + "\n"


def charts(rows, out_dir, stem) -> list:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001
        print("matplotlib not importable: no charts")
        return []
    done = [r for r in rows if r.get("stock_ms") is not None]
    made = []
    labels = [f"{r['workload']}\nb{r['batch']}" for r in done]
    x = np.arange(len(done))
    if done:
        series = [("stock TVM", "stock_ms"), ("vtc-tvm", "vtc_ms"), ("torch eager", "torch_eager_ms"),
                  ("torch.compile", "torch_compile_ms"), ("torch max-autotune", "torch_compile_max_autotune_ms"),
                  ("torch CUDA graphs", "torch_compile_cudagraphs_ms")]
        series = [s for s in series if any(r.get(s[1]) for r in done)]
        fig, ax = plt.subplots(figsize=(max(8, len(done) * 1.2), 4.5))
        w = 0.8 / len(series)
        for i, (lab, key) in enumerate(series):
            base = [r["stock_ms"] for r in done]
            ax.bar(x + i * w, [(r.get(key) or 0) / b for r, b in zip(done, base)], w, label=lab)
        ax.set_xticks(x + 0.4 - w / 2, labels, fontsize=7)
        ax.set_ylabel("latency / stock TVM (lower is better)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        made.append(_save(fig, out_dir, f"{stem}_latency.png", plt))
    dm = [r for r in done if r.get("stock_dm_us") is not None]
    if dm:
        fig, ax = plt.subplots(figsize=(max(8, len(dm) * 1.2), 4.5))
        xs = np.arange(len(dm))
        total = [r["stock_gpu_us"] or 1.0 for r in dm]
        for j, v in enumerate(("stock", "vtc")):  # GPU time normalised to stock's total: share + reduction
            comp = [(r[f"{v}_compute_us"] + r.get(f"{v}_other_us", 0)) / t for r, t in zip(dm, total)]
            mov = [r[f"{v}_dm_us"] / t for r, t in zip(dm, total)]
            ax.bar(xs + j * 0.4, comp, 0.4, label=f"{v} compute", color=("C0", "C2")[j])
            ax.bar(xs + j * 0.4, mov, 0.4, bottom=comp, label=f"{v} data movement", color=("C1", "C3")[j])
        ax.set_xticks(xs + 0.2, [f"{r['workload']}\nb{r['batch']}\n{t:.0f} us" for r, t in zip(dm, total)], fontsize=7)
        ax.set_ylabel("GPU kernel time / stock total (left stock, right vtc)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        made.append(_save(fig, out_dir, f"{stem}_dm_share.png", plt))
    mem = [r for r in rows if r.get("stock_peak_mib") is not None]
    if mem:
        fig, ax = plt.subplots(figsize=(max(8, len(mem) * 1.2), 4.5))
        xs = np.arange(len(mem))
        keys = [("stock TVM", "stock_peak_mib"), ("vtc-tvm", "vtc_peak_mib"), ("torch eager", "torch_eager_peak_mib")]
        for j, (lab, key) in enumerate(keys):
            ax.bar(xs + j * 0.27, [r.get(key) or 0 for r in mem], 0.27, label=lab)
        ax.set_xticks(xs + 0.27, [f"{r['workload']}\nb{r['batch']}" for r in mem], fontsize=7)
        ax.set_ylabel("peak memory of one call (MiB)")
        ax.set_yscale("symlog")
        ax.legend(fontsize=7)
        fig.tight_layout()
        made.append(_save(fig, out_dir, f"{stem}_memory.png", plt))
    return made


def _save(fig, out_dir, name, plt):
    fig.savefig(os.path.join(out_dir, name), dpi=120)
    plt.close(fig)
    return name


def _commit() -> str:
    env = os.environ.get("VTC_COMMIT")
    if env:
        return env
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE)
        if out.returncode == 0:
            return out.stdout.strip()
    except OSError:
        pass
    return "unknown"


def _device(target, dry, torch):
    if dry:
        return "none (compile only)"
    if target.kind.name != "cuda":
        return "cpu"
    if torch is not None:
        return torch.cuda.get_device_name(0)
    return "cuda"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="paper", choices=sorted(SUITES))
    ap.add_argument("--target", default="cuda", choices=["cuda", "llvm"])
    ap.add_argument("--tuner", default="dlight", help="dlight or ms:N (MetaSchedule, N trials per task)")
    ap.add_argument("--batch", type=int, nargs="+", help="default: 1 16 (real size), 1 (small)")
    ap.add_argument("--cases", nargs="*", help="workload names (or substrings) to run")
    ap.add_argument("--size", choices=["small", "real"], help="default: real on cuda, small on llvm")
    ap.add_argument("--source", choices=["builder", "onnx"], default="builder",
                    help="the Relax builders, or their ONNX twins imported with from_onnx (benchmarks/onnx_models.py)")
    ap.add_argument("--repeat", type=int, default=100)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--tuning-dir", default=os.path.join(HERE, "tuning"),
                    help="MetaSchedule databases, one folder per workload: DIR/<workload> (default benchmarks/tuning)")
    ap.add_argument("--dry", action="store_true", help="compile only, no device needed")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch peers")
    ap.add_argument("--no-torch-compile", action="store_true", help="torch eager only")
    ap.add_argument("--torch-modes", nargs="+", choices=sorted(TORCH_MODES), default=list(TORCH_MODES),
                    help="the torch peers to time (default all: eager, compile, max-autotune, cudagraphs)")
    ap.add_argument("--vtc-profile", action="store_true",
                    help="VirtualTensorize(profile=True): time every accepted edge on the GPU and keep only "
                         "those that are faster (DLight, needs the device)")
    ap.add_argument("--cuda-graphs", action="store_true",
                    help='(default now) torch.compile(mode="reduce-overhead") is in --torch-modes')
    ap.add_argument("--max-autotune", action="store_true",
                    help='(default now) torch.compile(mode="max-autotune") is in --torch-modes')
    tuning.add_arguments(ap, default_tasks="anchor")
    args = ap.parse_args(argv)
    args.size = args.size or ("real" if args.target == "cuda" else "small")
    if args.no_torch_compile:
        args.torch_modes = ["eager"]
    args.batch = args.batch or ([1, 16] if args.size == "real" else [1])
    kind, trials = parse_tuner(args.tuner)
    args.ms_settings = args.ms_runner = None
    if kind == "metaschedule":
        args.ms_settings = tuning.settings_from_args(args, trials)
        args.tuning_dir, args.ms_runner = tuning.runner_from_args(args, os.path.join(HERE, "tuning"))
        tuning.pooled_builder(args.ms_settings.builder_workers, args.ms_settings.builder_timeout)  # warm up now

    if args.vtc_profile and (kind != "dlight" or args.dry):
        sys.exit("--vtc-profile needs --tuner dlight and a device (not --dry)")

    if args.target == "cuda":
        target = cuda_target()
    elif kind == "metaschedule":  # MetaSchedule's CPU search space needs num-cores
        target = tvm.target.Target({"kind": "llvm", "num-cores": os.cpu_count() or 1})
    else:
        target = tvm.target.Target("llvm")
    names = [n for n in SUITES[args.suite] if not args.cases or any(c in n for c in args.cases)]
    dev = None
    torch = None
    if not args.dry:
        dev = tvm.cuda(0) if args.target == "cuda" else tvm.cpu(0)
        if args.target == "cuda":
            if not dev.exist:
                sys.exit("no CUDA GPU found: use --dry to compile only")
            torch = None if args.no_torch else _torch()
    if args.vtc_profile:  # one profiler for every case: its cache keys kernels by structure
        from vtc_tvm.profile import EdgeProfiler

        args.vtc_options = {"profile": EdgeProfiler(target)}
    try:
        import torch as _t

        torch_version = _t.__version__
    except Exception:  # noqa: BLE001
        torch_version = None

    now = datetime.datetime.now()
    result = {"commit": _commit(), "date": now.strftime("%Y-%m-%d"), "time": now.strftime("%H:%M:%S"),
              "device": _device(target, args.dry, torch), "tvm": tvm.__version__, "torch": torch_version,
              "target": str(target.kind.name) + (f" {target.arch}" if args.target == "cuda" else ""),
              "tuner": args.tuner, "suite": args.suite, "size": args.size, "source": args.source, "repeat": args.repeat,
              "dry": args.dry, "vtc_profile": args.vtc_profile,
              "argv": sys.argv[1:] if argv is None else list(argv), "cases": []}
    if args.ms_settings is not None:
        result["metaschedule"] = tuning.describe(args.ms_settings, args.tuning_dir, args.ms_runner)
    if args.target == "cuda":  # one-off import (~15-45 s) that DLight's tensor-core rule would pay in case 1
        t0 = time.time()
        importlib.import_module("tvm.s_tir.tensor_intrin")
        result["tensor_intrin_import_s"] = round(time.time() - t0, 1)
    if kind == "metaschedule":  # tune every case's kernels first, largest first (see tuning.tune_groups)
        t0 = time.time()
        result["metaschedule_tuning"] = {}
        try:
            groups = []
            for name in names:
                mods = []
                for batch in args.batch:
                    cfg = CASES[name].config(args.size, batch, "float16" if args.target == "cuda" else "float32")
                    mod = CASES[name].build(cfg)
                    mods += [tuning.fuse(mod, target, v) for v in ("stock", "vtc")]
                groups.append((os.path.join(args.tuning_dir, name), mods))
            tuning.tune_groups(groups, target, args.ms_settings, runner=args.ms_runner, label="all cases",
                               stats=result["metaschedule_tuning"])
        except Exception as err:  # noqa: BLE001 - the cases then tune (or fail) one by one
            traceback.print_exc()
            result["metaschedule_tuning"]["error"] = f"{type(err).__name__}: {str(err)[:300]}"
        result["metaschedule_tuning"]["seconds"] = round(time.time() - t0, 1)
    os.makedirs(args.out, exist_ok=True)
    args.base = "paper" if kind == "dlight" else "paper_ms"  # a MetaSchedule run keeps the DLight files
    stem = f"{args.base}_{now.strftime('%Y-%m-%d_%H%M%S')}"
    t_all = time.time()
    for name in names:
        for batch in args.batch:
            print(f"== {name} batch {batch}", flush=True)
            try:
                row = run_case(CASES[name], batch, args, target, dev, torch)
            except Exception as err:  # noqa: BLE001 - a failing case is a result
                traceback.print_exc()
                msg = [ln for ln in str(err).strip().splitlines() if ln.strip() and "^^^" not in ln]
                row = {"workload": name, "batch": batch, "scheduler": parse_tuner(args.tuner)[0],
                       "trials": parse_tuner(args.tuner)[1],
                       "error": f"{type(err).__name__}: {(msg or [''])[-1][:300]}"}
            for k in KEYS:
                row.setdefault(k, None)
            result["cases"].append(row)
            print("   " + json.dumps({k: row.get(k) for k in KEYS[4:] + ["seconds", "error"] if row.get(k) is not None},
                                     default=str), flush=True)
            _write(result, args, stem)  # after every case, so a killed run keeps what it measured
            if torch is not None:
                torch.cuda.empty_cache()
    result["total_s"] = round(time.time() - t_all, 1)
    result["charts"] = charts(result["cases"], args.out, args.base)
    _write(result, args, stem)
    print(table(result["cases"]))
    print(f"total {result['total_s']} s; wrote {args.out}/{args.base}.json, {stem}.json, {args.base}.md")
    bad = [r for r in result["cases"] if r.get("error") or r.get("numerics_ok") is False]
    return 1 if bad else 0


def _write(result, args, stem=None):
    base = getattr(args, "base", "paper")
    for name in [f"{base}.json"] + ([f"{stem}.json"] if stem else []):
        with open(os.path.join(args.out, name), "w") as f:
            json.dump(result, f, indent=1, default=str)
    with open(os.path.join(args.out, f"{base}.md"), "w") as f:
        f.write(markdown(result))


if __name__ == "__main__":
    sys.exit(main())
