"""Decode layers with and without :mod:`vtc_tvm.schedules` (issue 13, item 1), for the H200.

Builds each decode layer four ways and, per batch, checks numerics against float64 and times it:

* ``stock_dlight``  stock TVM's default pipeline (DLight rules)
* ``stock_ours``    the ``stock_vtc_schedules`` pipeline: stock + our rules before DLight's
* ``vtc_ours``      vtc-tvm with ``schedules="vtc"``
* ``vtc_dlight``    vtc-tvm with DLight's rules (today's default)

Run on the device (real sizes, fp16)::

    source .devbundle/install.sh && python benchmarks/schedules_h200.py --batch 1 16

and as a dry run anywhere (llvm, small sizes, float32): ``--target llvm --size small``. Writes
``$OUT/schedules_h200.json`` (``--out``) and prints a table last. Latency: ``time_evaluator``
medians (number >= 20, repeat >= 10); per-kernel GPU time: torch.profiler (CUPTI) when torch is
importable; the float64 reference is the workload's torch twin in float64 on the same inputs
(or, without torch, the Relax workload itself in float64 on llvm). ``--budget-s`` skips the
cases left once that many seconds are spent (recorded as skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import zlib

import numpy as np
import tvm
from tvm import relax

if __package__ in (None, ""):  # run as a script: benchmarks/ is a package of the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import vtc_tvm  # noqa: F401,E402  (registers the pipelines)
from vtc_tvm.pipeline import cuda_target, stock_vtc_schedules_pipeline, vtc_pipeline  # noqa: E402

from benchmarks.run import _flat, fp64_reference, gpu_kernel_us, rel_l2  # noqa: E402
from benchmarks.workloads import WORKLOADS  # noqa: E402

VARIANTS = ("stock_dlight", "stock_ours", "vtc_ours", "vtc_dlight")
TOLERANCE = {"float16": 1e-2, "float32": 1e-4}
# Reading the weights and the KV cache once at the H200's HBM bandwidth.
HBM_BYTES_PER_S = 4.3e12


def pipeline(variant: str, target):
    if variant == "stock_dlight":
        return relax.get_default_pipeline(target)
    if variant == "stock_ours":
        return stock_vtc_schedules_pipeline(target)
    return vtc_pipeline(target, schedules="vtc" if variant == "vtc_ours" else "dlight")


def _torch():
    try:
        import torch

        return torch if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - no torch: numerics and timing without it
        return None


def reference_fp64(wl, size, batch, mod, inputs, torch):
    """Float64 outputs for ``inputs``: the torch twin on the GPU, else the Relax workload in
    float64 on llvm (stock build pipeline)."""
    if torch is not None:
        return fp64_reference(wl, wl.config(size, batch, "float16"), mod, inputs, torch), "torch twin, float64"
    mod64 = wl.build(wl.config(size, batch, "float64"))
    ex = tvm.compile(mod64, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [tvm.runtime.tensor(a.astype(np.float64) if a.dtype.kind == "f" else a) for a in inputs]
    return _flat(vm["main"](*args)), "relax workload, float64, llvm"


def hbm_floor_ms(inputs) -> float:
    """Milliseconds to read every input once (weights + KV cache dominate) at HBM bandwidth."""
    return sum(a.nbytes for a in inputs) / HBM_BYTES_PER_S * 1e3


def run_case(name, batch, args, target, dev, torch, deadline):
    wl = WORKLOADS[name]
    gpu = target.kind.name == "cuda"
    dtype = "float16" if gpu else "float32"
    cfg = wl.config(args.size, batch, dtype)
    mod = wl.build(cfg)
    seed = zlib.crc32(f"{name}/{batch}/{time.time_ns()}".encode())
    inputs = wl.inputs(mod, cfg, seed)
    row = {"workload": name, "batch": batch, "size": args.size, "dtype": dtype, "seed": seed,
           "hbm_floor_ms": hbm_floor_ms(inputs), "variants": {}}
    ref, row["reference"] = reference_fp64(wl, args.size, batch, mod, inputs, torch)
    dev_args = [tvm.runtime.tensor(a, dev) for a in inputs]
    for variant in args.variants:
        res = row["variants"].setdefault(variant, {})
        if time.time() > deadline:
            res["skipped"] = "time budget spent"
            continue
        try:
            t0 = time.time()
            ex = tvm.compile(mod, target=target, relax_pipeline=pipeline(variant, target))
            res["compile_s"] = round(time.time() - t0, 2)
            vm = relax.VirtualMachine(ex, dev)
            out = _flat(vm["main"](*dev_args))
            res["rel_err_fp64"] = rel_l2(out, ref)
            res["numerics_ok"] = bool(res["rel_err_fp64"] < TOLERANCE[dtype])
            te = vm.time_evaluator("main", dev, number=args.number, repeat=args.repeat)(*dev_args)
            res["ms"] = float(np.median(te.results)) * 1e3
            res["hbm_fraction"] = row["hbm_floor_ms"] / res["ms"] if res["ms"] else None
            if gpu and torch is not None:
                per = gpu_kernel_us(vm["main"], [dev_args], torch)
                res["gpu_us"] = sum(per.values())
                res["kernel_us"] = {k: round(us, 2) for k, us in sorted(per.items(), key=lambda kv: -kv[1])}
            del vm, ex
        except Exception as err:  # noqa: BLE001 - one failing variant is reported, not fatal
            traceback.print_exc()
            res["error"] = f"{type(err).__name__}: {str(err)[-400:]}"
        print(f"  {name} b{batch} {variant}: {json.dumps({k: v for k, v in res.items() if k != 'kernel_us'})}",
              flush=True)
    return row


def table(rows) -> str:
    head = f"{'workload':<15}{'b':>3} {'floor ms':>9}" + "".join(f"{v:>22}" for v in VARIANTS)
    lines = [head, "  (each variant: median ms / rel. err vs float64)"]
    for r in rows:
        cells = []
        for v in VARIANTS:
            res = r["variants"].get(v, {})
            if "ms" in res:
                cells.append(f"{res['ms']:>9.3f} / {res['rel_err_fp64']:.1e}")
            else:
                cells.append(("skipped" if "skipped" in res else "error" if "error" in res else "-").rjust(20))
        lines.append(f"{r['workload']:<15}{r['batch']:>3} {r['hbm_floor_ms']:>9.3f}" + "".join(f"{c:>22}" for c in cells))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--target", choices=["cuda", "llvm"], default="cuda")
    ap.add_argument("--size", choices=["real", "small"], default="real")
    ap.add_argument("--workloads", nargs="+", default=["llama_decode", "gemma2_decode"])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--number", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=450.0)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)

    target = cuda_target() if args.target == "cuda" else tvm.target.Target("llvm")
    dev = tvm.cuda(0) if args.target == "cuda" else tvm.cpu()
    torch = _torch() if args.target == "cuda" else None
    deadline = time.time() + args.budget_s
    rows = []
    for name in args.workloads:
        for batch in args.batch:
            rows.append(run_case(name, batch, args, target, dev, torch, deadline))
    result = {"target": str(target.kind.name), "arch": str(target.attrs.get("arch", "")),
              "device": torch.cuda.get_device_name(0) if torch is not None else str(dev),
              "tvm": tvm.__version__, "timing": f"time_evaluator number={args.number} repeat={args.repeat}, median",
              "command": " ".join(["python", "benchmarks/schedules_h200.py"] + (argv if argv is not None else sys.argv[1:])),
              "rows": rows}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "schedules_h200.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {path}")
    print(table(rows))
    return result


if __name__ == "__main__":
    main()
