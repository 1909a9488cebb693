"""Kernel micro-benchmark: does a consumer that reads through a mapping stay fast?

For each (consumer, mapping) pair at a realistic size this builds three Relax modules and
compiles them with the same scheduler:

* ``stock``: the movement op(s) + the consumer, as TVM compiles them (copy kernel + consumer),
* ``alone``: the consumer on a physical tensor of the virtual shape (what the consumer costs
  when its input is contiguous),
* ``vtc``:   ``VirtualTensorize(strategy="all")`` of ``stock`` (the consumer reads the sources).

On a GPU it checks vtc against stock numerically and times every kernel with CUPTI
(torch.profiler). Without a GPU (``--dry``) it only compiles, which catches scheduling failures.

    python -m benchmarks.kernels [--dry] [--cases NAME ...] [--out DIR] [--tuner dlight|ms:N]
                                 [--tuning-dir DIR] [--ms-budget-s S] [--ms-fake-runner] [--ms-...]

With ``--tuner ms:N`` every case's kernels (stock, alone, vtc) are tuned first, N trials per task,
into one database (``benchmarks/tuning/kernels``; see :mod:`benchmarks.tuning`), and the results
go to ``kernels_ms.json``/``.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, List, Sequence

import numpy as np
import tvm
from tvm import relax
from tvm.relax import op as R

import vtc_tvm
from vtc_tvm.pipeline import cuda_target
from vtc_tvm.report import uses_tensor_cores

from . import tuning

F16 = "float16"
DEFAULT_TUNING_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tuning", "kernels")


@dataclass
class Case:
    consumer: str
    mapping: str
    sources: Sequence  # [(shape, dtype)] of the movement op's physical inputs
    movement: Callable  # (bb, *source vars) -> virtual var
    others: Sequence  # [(shape, dtype)] of the consumer's other inputs
    consume: Callable  # (bb, virtual, *others) -> output
    flops: float = 0.0

    @property
    def name(self):
        return f"{self.consumer}/{self.mapping}"


def _repeat_kv(bb, k, n_rep=4):
    b, h, t, d = (int(x) for x in k.ty.shape)
    k = bb.emit(R.expand_dims(k, [2]))
    k = bb.emit(R.broadcast_to(k, (b, h, n_rep, t, d)))
    return bb.emit(R.reshape(k, (b, h * n_rep, t, d)))


def _mm(bb, a, b):
    return bb.emit(R.matmul(a, b))


B, CTX, H, KVH, D, HID, FFN, TOK = 16, 4096, 32, 8, 128, 4096, 14336, 512
CASES: List[Case] = [
    Case("gemm", "transpose", [((HID, HID), F16)], lambda bb, w: bb.emit(R.permute_dims(w)),
         [((TOK, HID), F16)], lambda bb, wt, x: _mm(bb, x, wt), 2 * TOK * HID * HID),
    Case("gemv", "transpose", [((FFN, HID), F16)], lambda bb, w: bb.emit(R.permute_dims(w)),
         [((B, HID), F16)], lambda bb, wt, x: _mm(bb, x, wt), 2 * B * HID * FFN),
    Case("attn_qk", "gqa+transpose", [((B, KVH, CTX, D), F16)],
         lambda bb, k: bb.emit(R.permute_dims(_repeat_kv(bb, k), [0, 1, 3, 2])),
         [((B, H, 1, D), F16)], lambda bb, kt, q: _mm(bb, q, kt), 2 * B * H * CTX * D),
    Case("attn_pv", "gqa", [((B, KVH, CTX, D), F16)], lambda bb, v: _repeat_kv(bb, v),
         [((B, H, 1, CTX), F16)], lambda bb, v, p: _mm(bb, p, v), 2 * B * H * CTX * D),
    Case("gemm", "concat", [((TOK, HID // 2), F16), ((TOK, HID // 2), F16)],
         lambda bb, a, b: bb.emit(R.concat([a, b], axis=1)),
         [((HID, HID), F16)], lambda bb, x, w: _mm(bb, x, w), 2 * TOK * HID * HID),
    Case("gemm", "strided_slice", [((2 * TOK, HID), F16)],
         lambda bb, x: bb.emit(R.strided_slice(x, axes=[0], begin=[1], end=[2 * TOK], strides=[2])),
         [((HID, HID), F16)], lambda bb, x, w: _mm(bb, x, w), 2 * TOK * HID * HID),
    Case("gemm", "gather", [((32000, HID), F16), ((TOK,), "int64")],
         lambda bb, e, i: bb.emit(R.take(e, i, axis=0)),
         [((HID, HID), F16)], lambda bb, x, w: _mm(bb, x, w), 2 * TOK * HID * HID),
    Case("softmax", "transpose", [((CTX, B * H), F16)], lambda bb, x: bb.emit(R.permute_dims(x)),
         [], lambda bb, x: bb.emit(R.nn.softmax(x, axis=-1))),
    Case("rmsnorm", "transpose+reshape", [((B, H, TOK // 8, D), F16)],
         lambda bb, x: bb.emit(R.reshape(bb.emit(R.permute_dims(x, [0, 2, 1, 3])), (B, TOK // 8, H * D))),
         [((H * D,), F16)], lambda bb, x, g: bb.emit(R.nn.rms_norm(x, g, axes=[-1]))),
    Case("add", "transpose", [((HID, HID), F16)], lambda bb, x: bb.emit(R.permute_dims(x)),
         [((HID, HID), F16)], lambda bb, xt, y: bb.emit(R.add(xt, y))),
    Case("sum", "strided_slice", [((B * H, 2 * CTX), F16)],
         lambda bb, x: bb.emit(R.strided_slice(x, axes=[1], begin=[0], end=[2 * CTX], strides=[2])),
         [], lambda bb, x: bb.emit(R.sum(x, axis=-1))),
    Case("conv2d_nchw", "channel_shuffle", [((B, 232, 28, 28), F16)],
         lambda bb, x: bb.emit(R.reshape(bb.emit(R.permute_dims(bb.emit(R.reshape(x, (B, 2, 116, 28, 28))), [0, 2, 1, 3, 4])), (B, 232, 28, 28))),
         [((232, 232, 1, 1), F16)], lambda bb, x, w: bb.emit(R.nn.conv2d(x, w)), 2 * B * 232 * 232 * 28 * 28),
]


def _function(params, body):
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(bb))
        bb.emit_func_output(out)
    return bb.get()


def build_modules(case: Case, target=None):
    srcs = [relax.Var(f"s{i}", relax.TensorType(s, d)) for i, (s, d) in enumerate(case.sources)]
    others = [relax.Var(f"o{i}", relax.TensorType(s, d)) for i, (s, d) in enumerate(case.others)]
    holder = {}

    def stock_body(bb):
        v = case.movement(bb, *srcs)
        holder["virtual"] = v.ty
        return case.consume(bb, v, *others)

    stock = _function(srcs + others, stock_body)
    phys = relax.Var("v", holder["virtual"])
    alone = _function([phys] + others, lambda bb: case.consume(bb, phys, *others))
    report = []
    vtc = vtc_tvm.VirtualTensorize(strategy="all", report=report, target=target)(stock)
    return stock, alone, vtc, report


def default_strategy_takes(case: Case, report) -> bool:
    """Would the default "contiguity" strategy take this edge? (re-derived from the mapping)"""
    return bool(report) and all(r["virtual"] for r in report) and all(
        "contiguity" not in r["reason"] for r in report)


def compile_module(mod, target, tuner, work_dir=None, settings=None, runner=None, stats=None):
    """Compile with DLight (``"dlight"``) or MetaSchedule (``"ms:TRIALS"`` trials per task,
    tensor-core search space on CUDA) through :func:`benchmarks.tuning.compile_metaschedule`:
    the database in ``work_dir`` is shared by all modules, so a kernel is tuned once."""
    if tuner == "dlight":
        return tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
    settings = settings or tuning.TuneSettings(trials=int(tuner.split(":")[1]))
    work = work_dir or os.environ.get("VTC_TUNING_DIR") or DEFAULT_TUNING_DIR
    # ``mod`` is already rewritten where it is the vtc module: the stock pipeline compiles it.
    return tuning.compile_metaschedule(mod, target, work, settings, variant="stock", runner=runner, stats=stats)


def _random(mod, rng):
    out = []
    for p in mod["main"].params:
        shape = [int(d) for d in p.ty.shape]
        dtype = str(p.ty.dtype)
        if dtype.startswith("int"):
            out.append(rng.integers(0, 4096, shape).astype(dtype))
        else:
            out.append((rng.standard_normal(shape) * 0.5).astype(dtype))
    return out


def _gpu_kernel_us(ex, dev, input_sets, iters=50):
    """Mean GPU time per call of every kernel, by name (CUPTI through torch.profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    vm = relax.VirtualMachine(ex, dev)
    args = [[tvm.runtime.tensor(a, dev) for a in s] for s in input_sets]
    for i in range(5):
        vm["main"](*args[i % len(args)])
    dev.sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(iters):
            vm["main"](*args[i % len(args)])
        dev.sync()
    torch.cuda.synchronize()
    times = {}
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if t and "memcpy" not in ev.key.lower() and "memset" not in ev.key.lower():
            times[ev.key] = t / iters
    return times


def run(cases, target, tuner, dry, gpu_mem_bw=4.3e12, tc_flops=7.9e14, tuning_dir=None, settings=None, runner=None,
        on_row=None):
    rows = []
    tuning_dir = tuning_dir or os.environ.get("VTC_TUNING_DIR") or DEFAULT_TUNING_DIR
    dev = tvm.cuda(0) if not dry else None
    rng = np.random.default_rng(0)
    for case in cases:
        t0 = time.time()
        row = {"consumer": case.consumer, "mapping": case.mapping, "dtype": case.sources[0][1],
               "shape": [list(s) for s, _ in case.sources] + [list(s) for s, _ in case.others],
               "scheduler": tuner.split(":")[0], "trials": int(tuner.split(":")[1]) if ":" in tuner else 0}
        try:
            stock, alone, vtc, report = build_modules(case, target)
            row["virtualized"] = bool(report) and all(r["virtual"] for r in report)
            row["default_strategy_takes"] = _default_takes(stock, target)
            row["decisions"] = report
            mods = (("stock", stock), ("alone", alone), ("vtc", vtc))
            if tuner != "dlight":  # tune the three modules' kernels together, then compile each
                settings = settings or tuning.TuneSettings(trials=int(tuner.split(":")[1]))
                row["metaschedule"] = {}
                t1 = time.time()
                tuning.tune([tuning.fuse(m, target) for _, m in mods], target, tuning_dir,
                            settings, runner=runner, label=case.name, stats=row["metaschedule"])
                row["tune_s"] = round(time.time() - t1, 1)
            exes = {}
            for k, m in mods:
                stats = {}
                exes[k] = compile_module(m, target, tuner, tuning_dir, settings, runner, stats)
                if stats:
                    row[f"{k}_ms_kernels"] = stats.get("ms_kernels")
            row["tensor_cores"] = uses_tensor_cores(exes["vtc"])
            row["stock_tensor_cores"] = uses_tensor_cores(exes["alone"])
            if not dry:
                inputs = [_random(stock, rng) for _ in range(3)]
                outs = {}
                for k in ("stock", "vtc"):
                    vm = relax.VirtualMachine(exes[k], dev)
                    outs[k] = vm["main"](*[tvm.runtime.tensor(a, dev) for a in inputs[0]]).numpy().astype("float64")
                err = np.linalg.norm(outs["vtc"] - outs["stock"]) / max(np.linalg.norm(outs["stock"]), 1e-30)
                row["rel_l2_vs_stock"] = float(err)
                row["finite"] = bool(np.isfinite(outs["vtc"]).all())
                alone_inputs = [[_alone_input(alone, s, case, rng)] + s[len(case.sources):] for s in inputs]
                t_stock = _gpu_kernel_us(exes["stock"], dev, inputs)
                t_alone = _gpu_kernel_us(exes["alone"], dev, alone_inputs)
                t_vtc = _gpu_kernel_us(exes["vtc"], dev, inputs)
                consumer_names = set(t_alone)
                row["stock_copy_us"] = sum(v for k, v in t_stock.items() if k not in consumer_names)
                row["stock_consumer_us"] = sum(t_alone.values())
                row["stock_total_us"] = sum(t_stock.values())
                row["vtc_consumer_us"] = sum(t_vtc.values())
                row["kernels"] = {"stock": t_stock, "alone": t_alone, "vtc": t_vtc}
            moved = sum(math.prod(s) * np.dtype(d).itemsize for s, d in case.sources) + sum(
                math.prod(s) * np.dtype(d).itemsize for s, d in case.others)
            out_bytes = math.prod(int(x) for x in stock["main"].body.ty.shape) * 2
            row["floor_us"] = max((moved + out_bytes) / gpu_mem_bw, case.flops / tc_flops) * 1e6
        except Exception as err:  # noqa: BLE001 - a failing case is a result, reported as such
            import traceback

            traceback.print_exc()
            msg = [ln for ln in str(err).strip().splitlines() if ln.strip() and "^^^" not in ln]
            row["error"] = f"{type(err).__name__}: {(msg or [''])[-1][:300]}"
        row["seconds"] = round(time.time() - t0, 1)
        rows.append(row)
        print(_fmt(row), flush=True)
        if on_row is not None:
            on_row(rows)  # a run killed later keeps what it measured
    return rows


def _default_takes(stock, target):
    report = []
    vtc_tvm.VirtualTensorize(report=report, target=target)(stock)
    return bool(report) and all(r["virtual"] for r in report)


def _alone_input(alone, inputs, case, rng):
    """The physical input of the consumer-alone module, with the same distribution."""
    p = alone["main"].params[0]
    shape = [int(d) for d in p.ty.shape]
    return (rng.standard_normal(shape) * 0.5).astype(str(p.ty.dtype))


def _fmt(row):
    if "error" in row:
        return f"{row['consumer']:>12} {row['mapping']:<18} ERROR {row['error']}"
    if "vtc_consumer_us" not in row:
        return f"{row['consumer']:>12} {row['mapping']:<18} compiled ({row['seconds']} s) tc={row['tensor_cores']}"
    return (f"{row['consumer']:>12} {row['mapping']:<18} copy {row['stock_copy_us']:9.1f} "
            f"consumer {row['stock_consumer_us']:9.1f} vtc {row['vtc_consumer_us']:9.1f} "
            f"floor {row['floor_us']:8.1f} us  err {row['rel_l2_vs_stock']:.1e} tc={row['tensor_cores']}")


def markdown(rows) -> str:
    """One row per pair. ``vtc us`` is the whole vtc module: where the edge is not taken
    (virtualized: no) it still contains the copy kernel, so it compares with copy + consumer."""
    lines = ["| consumer | mapping | scheduler | virtualized | stock copy us | stock consumer us | "
             "vtc us | vtc / consumer | floor us | default takes | tensor cores | rel err |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "vtc_consumer_us" not in r:
            lines.append(f"| {r['consumer']} | {r['mapping']} | {r['scheduler']} | | {r.get('error', 'not run')} ||||||||")
            continue
        lines.append(
            f"| {r['consumer']} | {r['mapping']} | {r['scheduler']} | "
            f"{'yes' if r.get('virtualized', True) else 'no'} | {r['stock_copy_us']:.1f} | "
            f"{r['stock_consumer_us']:.1f} | {r['vtc_consumer_us']:.1f} | "
            f"{r['vtc_consumer_us'] / r['stock_consumer_us']:.2f} | {r['floor_us']:.1f} | "
            f"{'yes' if r['default_strategy_takes'] else 'no'} | {'yes' if r['tensor_cores'] else 'no'} | "
            f"{r['rel_l2_vs_stock']:.1e} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry", action="store_true", help="compile only (no GPU needed)")
    ap.add_argument("--cases", nargs="*", help="substrings of case names to run")
    ap.add_argument("--tuner", default="dlight", help="dlight or ms:TRIALS")
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    ap.add_argument("--tuning-dir", default=os.environ.get("VTC_TUNING_DIR") or DEFAULT_TUNING_DIR,
                    help="MetaSchedule database shared by all cases (default benchmarks/tuning/kernels)")
    tuning.add_arguments(ap, default_tasks="all")
    args = ap.parse_args(argv)
    target = cuda_target()
    cases = [c for c in CASES if not args.cases or any(s in c.name for s in args.cases)]
    if not args.dry and not tvm.cuda(0).exist:
        sys.exit("no CUDA GPU found: use --dry to compile only")
    settings = runner = None
    if args.tuner.startswith("ms:"):
        settings = tuning.settings_from_args(args, int(args.tuner.split(":")[1]))
        args.tuning_dir, runner = tuning.runner_from_args(args, DEFAULT_TUNING_DIR)
        tuning.pooled_builder(settings.builder_workers, settings.builder_timeout)  # its workers warm up now
    elif args.tuner != "dlight":
        sys.exit(f"--tuner must be dlight or ms:N, not {args.tuner!r}")
    t0 = time.time()
    result = {"commit": _commit(),
              "date": time.strftime("%Y-%m-%d"),
              "device": _device_name(args.dry), "tvm": tvm.__version__, "tuner": args.tuner,
              "argv": sys.argv[1:] if argv is None else list(argv), "rows": []}
    if settings is not None:
        result["metaschedule"] = tuning.describe(settings, args.tuning_dir, runner)
    os.makedirs(args.out, exist_ok=True)
    base = "kernels" if args.tuner == "dlight" else "kernels_ms"  # a MetaSchedule run keeps the DLight files

    def write(rows):
        result["rows"] = rows
        result["total_s"] = round(time.time() - t0, 1)
        with open(os.path.join(args.out, f"{base}.json"), "w") as f:
            json.dump(result, f, indent=1)
        with open(os.path.join(args.out, f"{base}.md"), "w") as f:
            f.write(markdown(rows) + "\n")

    if settings is not None:  # tune every case's kernels first, largest first (see tuning.tune_groups)
        t1 = time.time()
        result["metaschedule_tuning"] = {}
        try:
            mods = [tuning.fuse(m, target) for case in cases for m in build_modules(case, target)[:3]]
            tuning.tune(mods, target, args.tuning_dir, settings, runner=runner, label="all cases",
                        stats=result["metaschedule_tuning"])
        except Exception as err:  # noqa: BLE001 - the cases then tune (or fail) one by one
            import traceback

            traceback.print_exc()
            result["metaschedule_tuning"]["error"] = f"{type(err).__name__}: {str(err)[:300]}"
        result["metaschedule_tuning"]["seconds"] = round(time.time() - t1, 1)
    rows = run(cases, target, args.tuner, args.dry, tuning_dir=args.tuning_dir, settings=settings, runner=runner,
               on_row=write)
    write(rows)
    print(markdown(rows))
    return 0 if all("error" not in r for r in rows) else 1


def _commit() -> str:
    """The git commit; on the device machine (a copy without .git) pass VTC_COMMIT."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        if out.returncode == 0:
            return out.stdout.strip()
    except OSError:
        pass
    return os.environ.get("VTC_COMMIT", "unknown")


def _device_name(dry):
    if dry:
        return "none (compile only)"
    try:
        import torch

        return torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001
        return "cuda"


if __name__ == "__main__":
    sys.exit(main())
