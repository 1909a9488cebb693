"""Kernel census of every workload in the repo, stock vs vtc, for the global plan (issue 12).

``python -m benchmarks.plan_census [--size small|real] [--targets llvm,cuda] [--label after]``
adds one column set (``--label``) to ``benchmarks/results/plan_census.json`` and rewrites
``plan_census.md``: per workload and target, stock's kernels / copy kernels / planned bytes and
the vtc pass + store side's (``report.kernel_census``, the "vtc" pipeline's options). Run it
once on main at 5db7270 with ``--label before`` and once on this branch with ``--label after``
(the CUDA census compiles nothing for a GPU: it needs none).
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import tvm

import vtc_tvm
from vtc_tvm.pipeline import cuda_target
from vtc_tvm.report import kernel_census

RESULTS = Path(__file__).resolve().parent / "results"


def census(size, targets):
    from benchmarks.workloads import WORKLOADS

    rows = []
    for name, wl in WORKLOADS.items():
        mod = wl.build(wl.config(size, 1, "float16" if size == "real" else "float32"))
        for tname in targets:
            target = cuda_target() if tname == "cuda" else tvm.target.Target("llvm")
            stock = kernel_census(mod, target)
            vtc = kernel_census(vtc_tvm.VirtualTensorize(target=target, memory_guard=True)(mod), target, stores=True)
            rows.append({"workload": name, "target": tname,
                         "stock": {k: stock[k] for k in ("kernels", "data_movement", "planned_bytes")},
                         "vtc": {k: vtc[k] for k in ("kernels", "data_movement", "planned_bytes")}})
            print(rows[-1], flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="small")
    ap.add_argument("--targets", default="llvm,cuda")
    ap.add_argument("--label", default="after")
    ap.add_argument("--md-only", action="store_true", help="rewrite the .md from the .json")
    args = ap.parse_args(argv)
    path = RESULTS / "plan_census.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    # The commit of the vtc_tvm that ran (PYTHONPATH may point at another checkout).
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(vtc_tvm.__file__).parent).stdout.strip()
    if not args.md_only:
        data[args.label] = {"commit": commit, "size": args.size, "rows": census(args.size, args.targets.split(","))}
    RESULTS.mkdir(exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    labels = sorted(data, key=lambda lab: lab != "before")
    md = ["# Kernel census per workload (kernels / copy kernels / planned bytes)", "",
          "Columns: " + ", ".join(f"{lab} = commit {data[lab]['commit']} ({data[lab]['size']})" for lab in labels), "",
          "| workload | target | stock | " + " | ".join(f"vtc {lab}" for lab in labels) + " |",
          "|---|---|---|" + "---|" * len(labels)]
    keys = [(r["workload"], r["target"]) for r in data[labels[0]]["rows"]]
    fmt = lambda c: f"{c['kernels']} / {c['data_movement']} / {c['planned_bytes']}"  # noqa: E731
    for key in keys:
        cells, stock = [], None
        for lab in labels:
            row = next((r for r in data[lab]["rows"] if (r["workload"], r["target"]) == key), None)
            stock = stock or (row and row["stock"])
            cells.append(fmt(row["vtc"]) if row else "-")
        md.append(f"| {key[0]} | {key[1]} | {fmt(stock)} | " + " | ".join(cells) + " |")
    (RESULTS / "plan_census.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
