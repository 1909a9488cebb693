"""Stock TVM vs vtc-tvm on the CPU (llvm), as a user times them: ``vtc-tvm bench`` on ONNX files.

    python -m benchmarks.cpu_bench [--onnx-dir DIR] [--rounds 9] [--runs 2] [--out benchmarks/results] [NAME ...]

Every workload's ONNX twin at its small size (``benchmarks/onnx_models.py``, weights as inputs)
and the three whole models at real size, batch 1 (``benchmarks/whole_models.py``, weights as
constants), each through the CLI in a process of its own: both builds, the kernel census and
planned bytes, then interleaved rounds (stock, vtc, stock, ...) of ``repeat`` runs, medians;
``--runs`` such processes a model, since a process's memory layout moves its timings by more
than its rounds do. The table shows each run's speed-up and the range of the per-round ratios
over all runs: the noise a "slower than stock" reading has to clear. Writes ``cpu_bench.json`` and ``cpu_bench.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from . import onnx_models, whole_models

HERE = os.path.dirname(os.path.abspath(__file__))
# Runs a round per model, so that a round takes about a second on a 2-core machine (data).
REPEAT = {"shufflenet_v2_whole": 8, "efficientvit_b1": 2, "yolo11n": 1}
SMALL_REPEAT = 200


def models(onnx_dir: str, names) -> list:
    """(name, path, repeat) of every model to time, writing the ONNX files that are missing."""
    found = []
    for name in sorted(onnx_models.ONNX_BUILDERS):
        if not names or name in names:
            path = onnx_models.small_path(name, onnx_dir)
            if not os.path.isfile(path):
                onnx_models.write_small(onnx_dir, [name])
            found.append((name, path, SMALL_REPEAT))
    for name in whole_models.WHOLE_MODELS:
        if not names or name in names:
            found.append((name, whole_models.write_model(name, onnx_dir), REPEAT.get(name, 1)))
    return found


def bench(path: str, rounds: int, repeat: int) -> dict:
    """``vtc-tvm bench --json`` of one model (its own process: a crash is a row, not the end)."""
    cmd = [sys.executable, "-c", "import sys; from vtc_tvm.cli import main; sys.exit(main())", "bench", path,
           "--target", "llvm", "--json", "-q", "--rounds", str(rounds), "--repeat", str(repeat)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"ok": False, "exit_code": done.returncode, "error": (done.stderr or done.stdout).strip()[-500:]}


def row(name: str, outs: list) -> dict:
    """One model's row from its runs' ``bench`` results (the first failure, if any)."""
    failed = [o for o in outs if not o.get("ok")]
    if failed:
        return {"model": name, "ok": False, "exit_code": failed[0].get("exit_code"), "error": failed[0].get("error")}
    s, v = outs[0]["variants"]["stock"], outs[0]["variants"]["vtc"]
    ratios = [a / b for o in outs for a, b in zip(o["variants"]["stock"]["round_medians_ms"],
                                                   o["variants"]["vtc"]["round_medians_ms"])]
    speedups = [o["speedup"] for o in outs]
    return {"model": name, "ok": True, "stock_ms": s["median_ms"], "vtc_ms": v["median_ms"],
            "speedup": float(np.median(speedups)), "run_speedups": speedups,
            "round_ratio_min": min(ratios), "round_ratio_max": max(ratios),
            "kernels": [s["kernels"], v["kernels"]], "copies": [s["data_movement"], v["data_movement"]],
            "planned_bytes": [s["planned_bytes"], v["planned_bytes"]], "rounds": outs[0]["rounds"],
            "repeat": outs[0]["repeat"]}


def markdown(result: dict) -> str:
    lines = [f"# Stock TVM vs vtc-tvm on the CPU (llvm), `vtc-tvm bench` (commit `{result['commit']}`)", "",
             f"{result['date']}, {result['machine']}; `{result['command']}`. Medians of interleaved rounds; "
             "ms: the first run's medians; speed-up: the median over the runs (each run a process); "
             "'round ratios': the range of stock/vtc over every round of every run (the noise).", "",
             "| model | stock ms | vtc ms | speed-up | runs | round ratios | kernels s/v | copies s/v | planned MiB s/v |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if not r["ok"]:
            lines.append(f"| {r['model']} | failed (exit {r['exit_code']}): {r['error']} ||||||||")
            continue
        mib = "/".join("n/a" if b is None else f"{b / 2 ** 20:.3f}" for b in r["planned_bytes"])
        lines.append(f"| {r['model']} | {r['stock_ms']:.3f} | {r['vtc_ms']:.3f} | {r['speedup']:.3f}x | "
                     f"{', '.join(f'{x:.3f}' for x in r['run_speedups'])} | {r['round_ratio_min']:.3f}-{r['round_ratio_max']:.3f} | {r['kernels'][0]}/{r['kernels'][1]} | "
                     f"{r['copies'][0]}/{r['copies'][1]} | {mib} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--onnx-dir", default=os.path.join(tempfile.gettempdir(), "vtc_onnx"))
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--runs", type=int, default=2, help="processes a model (each its own builds and rounds)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("names", nargs="*", help="workloads or whole models (default: all)")
    args = ap.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=HERE).stdout.strip()
    result = {"commit": commit, "date": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()} CPUs",
              "command": "python -m benchmarks.cpu_bench " + " ".join(argv if argv is not None else sys.argv[1:]),
              "rows": []}
    for name, path, repeat in models(args.onnx_dir, args.names):
        t0 = time.time()
        outs = [bench(path, args.rounds, repeat) for _ in range(args.runs)]
        result["rows"].append({**row(name, outs), "seconds": round(time.time() - t0, 1)})
        r = result["rows"][-1]
        print(f"{name}: " + (f"{r['speedup']:.3f}x (runs {r['run_speedups']}, rounds {r['round_ratio_min']:.3f}-{r['round_ratio_max']:.3f}), "
                             f"kernels {r['kernels']}, copies {r['copies']}" if r["ok"] else f"failed: {r['error']}"),
              f"[{r['seconds']} s]", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cpu_bench.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "cpu_bench.md"), "w") as f:
        f.write(markdown(result))
    print(markdown(result))
    return 0 if all(r["ok"] for r in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
