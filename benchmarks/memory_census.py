"""Planned memory per workload, stock vs vtc, and the plan's own prediction (issue 12).

``python -m benchmarks.memory_census [--label after] [--targets llvm,cuda] [--only NAME ...] [--pass-time]``
adds one column set (``--label``) to ``benchmarks/results/memory_census.json`` and rewrites
``memory_census.md``. Per case (the repo's workloads at small and real size, whole ShuffleNetV2
at batch 1 and 16, YOLO11n and EfficientViT-B1 at small size; LLVM and CUDA, compiled for
neither device): stock's and vtc's kernels, copy kernels and planned bytes
(``report.kernel_census``: the pipeline's fusion, the store side and ``StaticPlanBlockMemory``),
vtc's options as the ``"vtc"`` pipeline sets them (``memory_guard=True``), the plan's predicted
planned bytes (``Plan.summary["memory"]``, absent before the model existed) and the time of the
pass. Run it once with the tree to compare against on ``PYTHONPATH`` (``--label before``) and
once on this one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import tvm

import vtc_tvm
from vtc_tvm.pipeline import cuda_target
from vtc_tvm.report import kernel_census

RESULTS = Path(__file__).resolve().parent / "results"
FIELDS = ("kernels", "data_movement", "planned_bytes")


def cases(targets):
    from benchmarks.workloads import WORKLOADS

    out = []
    for t in targets:
        out += [("shufflenet_v2_whole", "real", 1, "float32", t), ("shufflenet_v2_whole", "real", 16, "float32", t),
                ("yolo11n", "small", 1, "float32", t), ("efficientvit_b1", "small", 1, "float32", t)]
        out += [(n, "small", 1, "float32", t) for n in WORKLOADS]
        out += [(n, "real", 1, "float16", t) for n in WORKLOADS]
    return out


def census(name, size, batch, dtype, tname):
    from benchmarks.whole_models import WHOLE_WORKLOADS
    from benchmarks.workloads import WORKLOADS

    wl = WORKLOADS.get(name) or WHOLE_WORKLOADS[name]
    mod = wl.build(wl.config(size, batch, dtype))
    target = cuda_target() if tname == "cuda" else tvm.target.Target("llvm")
    options = dict(target=target, memory_guard=True, inplace=getattr(wl, "inplace", ()))
    stock = kernel_census(mod, target)
    start = time.perf_counter()
    out = vtc_tvm.VirtualTensorize(**options)(mod)
    pass_s = time.perf_counter() - start
    vtc = kernel_census(out, target, stores=True)
    predicted = vtc_tvm.plan(mod, target, memory_guard=True, inplace=options["inplace"]).summary.get("memory", {})
    return {"case": f"{name}/{size}/b{batch}/{tname}",
            "stock": {k: stock[k] for k in FIELDS}, "vtc": {k: vtc[k] for k in FIELDS},
            "predicted": {"stock": predicted.get("stock_bytes"), "vtc": predicted.get("planned_bytes"),
                          "taken_back": predicted.get("taken_back")},
            "pass_s": round(pass_s, 2)}


PASS_TIME_CASES = [("shufflenet_v2_whole", "real", 1, "float32"), ("yolo11n", "small", 1, "float32"),
                   ("efficientvit_b1", "small", 1, "float32"), ("shufflenet_v2", "real", 1, "float16"),
                   ("llama_decode", "real", 1, "float16")]


def pass_time(rounds: int = 3) -> list:
    """Seconds of the pass on LLVM with and without the memory constraint, interleaved rounds
    after a warm-up (caches of rewrites and op patterns filled), medians."""
    import statistics

    from benchmarks.whole_models import WHOLE_WORKLOADS
    from benchmarks.workloads import WORKLOADS

    target = tvm.target.Target("llvm")
    rows = []
    for name, size, batch, dtype in PASS_TIME_CASES:
        wl = WORKLOADS.get(name) or WHOLE_WORKLOADS[name]
        mod = wl.build(wl.config(size, batch, dtype))
        times = {False: [], True: []}
        for guard in (False, True):
            vtc_tvm.VirtualTensorize(target=target, memory_guard=guard)(mod)  # warm-up
        for _ in range(rounds):
            for guard in (False, True):
                start = time.perf_counter()
                vtc_tvm.VirtualTensorize(target=target, memory_guard=guard)(mod)
                times[guard].append(time.perf_counter() - start)
        rows.append({"case": f"{name}/{size}/b{batch}/llvm", "without_s": round(statistics.median(times[False]), 2),
                     "with_s": round(statistics.median(times[True]), 2)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _mib(n):
    return "-" if n is None else f"{n / 2**20:.3f}"


def markdown(data) -> str:
    labels = sorted((lab for lab in data if lab != "pass_time"), key=lambda lab: lab != "before")
    md = ["# Planned memory per workload: stock vs vtc (issue 12)", "",
          "Columns: " + ", ".join(f"{lab} = commit {data[lab]['commit']}" for lab in labels) + ". "
          "Planned MiB = `StaticPlanBlockMemory`'s storage (intermediates; outputs excluded), from "
          "`report.kernel_census` (fusion + store side + planner, compiled for no device). copies = copy "
          "kernels (stock's / vtc's). `pred` = the plan's own prediction of vtc's planned bytes. "
          "Pass seconds on a shared, loaded 2-core machine (noisy).", "",
          "| case | stock MiB | " + " | ".join(f"vtc {lab} MiB | {lab} <= stock | copies {lab} | pass s {lab}"
                                                for lab in labels) + " | pred after = real |",
          "|---|---|" + "---|---|---|---|" * len(labels) + "---|"]
    keys = [r["case"] for r in data[labels[0]]["rows"]]
    for key in keys:
        cells, stock = [], None
        for lab in labels:
            row = next((r for r in data[lab]["rows"] if r["case"] == key), None)
            if row is None:
                cells.append("- | - | - | -")
                continue
            stock = stock or row["stock"]
            ok = "yes" if row["vtc"]["planned_bytes"] <= row["stock"]["planned_bytes"] else "**no**"
            cells.append(f"{_mib(row['vtc']['planned_bytes'])} | {ok} | "
                         f"{row['stock']['data_movement']} / {row['vtc']['data_movement']} | {row['pass_s']}")
        last = next((r for r in data[labels[-1]]["rows"] if r["case"] == key), None)
        pred = last and last["predicted"]["vtc"]
        match = "-" if not pred else ("yes" if pred[0] == last["vtc"]["planned_bytes"] else f"no ({pred[0]})")
        md.append(f"| {key} | {_mib(stock['planned_bytes'])} | " + " | ".join(cells) + f" | {match} |")
    if "pass_time" in data:
        t = data["pass_time"]
        md += ["", f"## The pass with and without the memory constraint (commit {t['commit']}, LLVM)", "",
               "Medians of interleaved rounds after a warm-up, on the same shared 2-core machine.", "",
               "| case | without s | with s |", "|---|---|---|"]
        md += [f"| {r['case']} | {r['without_s']} | {r['with_s']} |" for r in t["rows"]]
    return "\n".join(md) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", default="after")
    ap.add_argument("--targets", default="llvm,cuda")
    ap.add_argument("--only", nargs="*", default=None, help="case names (prefixes) to run")
    ap.add_argument("--md-only", action="store_true", help="rewrite the .md from the .json")
    ap.add_argument("--commit", help="the commit of the vtc_tvm that runs (default: git of its directory)")
    ap.add_argument("--pass-time", action="store_true", help="time the pass with and without the constraint")
    args = ap.parse_args(argv)
    path = RESULTS / "memory_census.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                           text=True, cwd=Path(vtc_tvm.__file__).parent).stdout.strip()
    if args.pass_time:
        data["pass_time"] = {"commit": commit, "rows": pass_time()}
        path.write_text(json.dumps(data, indent=1))
    elif not args.md_only:
        rows = []
        for case in cases(args.targets.split(",")):
            if args.only and not any(case[0].startswith(o) for o in args.only):
                continue
            rows.append(census(*case))
            print(json.dumps(rows[-1]), flush=True)
        data[args.label] = {"commit": commit, "rows": rows}
        RESULTS.mkdir(exist_ok=True)
        path.write_text(json.dumps(data, indent=1))
    (RESULTS / "memory_census.md").write_text(markdown(data))
    print(markdown(data))


if __name__ == "__main__":
    main()
