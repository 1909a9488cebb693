"""Compile time (and a latency cross-check) of the whole ONNX models, stock TVM vs the "vtc" pipeline.

    python -m benchmarks.whole_compile --target cuda|llvm [--batch 1 16] [--dtype float16] [--size real|small] --out DIR [names...]

For each model of :mod:`benchmarks.whole_models` (real size) and batch: import with
``load_onnx`` (weights as constants), then compile with the stock default pipeline, with the
``"vtc"`` pipeline (memory guard on, as users get it) and with the memory guard off; record the
wall-clock compile seconds, any error (a failing variant is a result), the median latency of
``time_evaluator`` (10 calls x 20 repeats) and the rel L2 of each variant's output against
stock's on one random input. One JSON file, ``DIR/whole_compile.json``, with the commit and the
device. This is a measurement tool; compile times on a shared machine are not comparable.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback

import numpy as np
import tvm
from tvm import relax

from benchmarks.run import _commit, rel_l2
from benchmarks.whole_models import WHOLE_MODELS, whole_model
from vtc_tvm.onnx_import import load_onnx
from vtc_tvm.pipeline import cuda_target, vtc_pipeline

VARIANTS = {
    "stock": lambda t: relax.get_default_pipeline(t),
    "vtc": lambda t: vtc_pipeline(t),
    "vtc_no_guard": lambda t: vtc_pipeline(t, memory_guard=False),
}


def measure(name: str, batch: int, dtype: str, target, dev, size: str = "real") -> dict:
    row = {"model": name, "size": size, "batch": batch, "dtype": dtype}
    t0 = time.time()
    mod = load_onnx(whole_model(name, size, batch, dtype=dtype))
    row["import_s"] = round(time.time() - t0, 2)
    x = np.random.RandomState(batch).standard_normal([int(d) for d in mod["main"].params[0].ty.shape])
    x = tvm.runtime.tensor(x.astype(dtype), dev)
    outs = {}
    for variant, pipeline in VARIANTS.items():
        t0 = time.time()
        try:
            ex = tvm.compile(mod, target, relax_pipeline=pipeline(target))
        except Exception as err:  # noqa: BLE001 - a failing variant is recorded
            traceback.print_exc()
            row[f"{variant}_error"] = f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:300]}"
            continue
        row[f"{variant}_compile_s"] = round(time.time() - t0, 2)
        vm = relax.VirtualMachine(ex, dev)
        outs[variant] = vm["main"](x).numpy()
        row[f"{variant}_ms"] = float(np.median(vm.time_evaluator("main", dev, number=10, repeat=20)(x).results)) * 1e3
    for variant in outs:
        if variant != "stock" and "stock" in outs:
            row[f"{variant}_rel_err_vs_stock"] = rel_l2([outs[variant]], [outs["stock"]])
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", choices=["cuda", "llvm"], default="cuda")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--dtype", default=None, help="default: float16 on cuda, float32 on llvm")
    ap.add_argument("--size", choices=["real", "small"], default="real")
    ap.add_argument("--out", required=True)
    ap.add_argument("names", nargs="*")
    args = ap.parse_args(argv)
    target = cuda_target() if args.target == "cuda" else tvm.target.Target("llvm")
    dev = tvm.cuda(0) if args.target == "cuda" else tvm.cpu(0)
    dtype = args.dtype or ("float16" if args.target == "cuda" else "float32")
    result = {"commit": _commit(), "tvm": tvm.__version__, "host": platform.node(), "cpus": os.cpu_count(),
              "target": args.target, "argv": sys.argv[1:] if argv is None else list(argv), "rows": []}
    if args.target == "cuda":
        result["device"] = str(getattr(dev, "device_name", "cuda"))
    os.makedirs(args.out, exist_ok=True)
    for name in args.names or WHOLE_MODELS:
        for batch in args.batch:
            row = measure(name, batch, dtype, target, dev, args.size)
            print(json.dumps(row), flush=True)
            result["rows"].append(row)
            with open(os.path.join(args.out, "whole_compile.json"), "w") as f:
                json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
