"""Kernel census of the decode layers with the store side (issue 16), CUDA codegen, no GPU.

``python -m benchmarks.store_census [--size small] [--batches 1,16]`` writes
``benchmarks/results/store_census.json`` and ``store_census.md``: for the Llama and Gemma-2
decode layers with a grow-by-concat KV cache (``llama_decode``, ``gemma2_decode``) and with a
static cache updated in place (``*_decode_static``, ``inplace=`` the workload's cache
parameters), stock's and vtc's launched kernels, copy kernels (named), planned bytes
(``report.kernel_census``), the compiled CUDA kernels (``__global__`` in the source of the
``"vtc"`` pipeline's build against stock's) and the store side's decisions. Nothing is timed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import tvm
from tvm import relax

import vtc_tvm
from vtc_tvm.pipeline import cuda_target, vtc_pipeline
from vtc_tvm.report import device_source, kernel_census

RESULTS = Path(__file__).resolve().parent / "results"
DECODE = ("llama_decode", "gemma2_decode", "llama_decode_static", "gemma2_decode_static")
KEYS = ("kernels", "data_movement", "data_movement_kernels", "planned_bytes")


def census(size: str, batches) -> list:
    from benchmarks.workloads import WORKLOADS

    target = cuda_target()
    rows = []
    for name in DECODE:
        wl = WORKLOADS[name]
        for batch in batches:
            mod = wl.build(wl.config(size, batch))
            options = dict(target=target, inplace=wl.inplace, memory_guard=True)
            stock = kernel_census(mod, target)
            vtc = kernel_census(vtc_tvm.VirtualTensorize(**options)(mod), target, stores=True)
            report = []
            built = {
                "stock": tvm.compile(mod, target, relax_pipeline=relax.get_default_pipeline(target)),
                "vtc": tvm.compile(mod, target, relax_pipeline=vtc_pipeline(target, report=report,
                                                                             inplace=wl.inplace)),
            }
            compiled = {k: device_source(ex, "cuda").count("__global__") for k, ex in built.items()}
            rows.append({"workload": name, "batch": batch, "inplace": list(wl.inplace),
                         "stock": {k: stock[k] for k in KEYS}, "vtc": {k: vtc[k] for k in KEYS},
                         "compiled_kernels": compiled,
                         "stores": [{k: d[k] for k in ("tensor", "consumer", "virtual", "reason")}
                                    for d in report if d.get("side") == "store"]})
            print({k: rows[-1][k] for k in ("workload", "batch", "stock", "vtc", "compiled_kernels")}, flush=True)
    return rows


def markdown(data: dict) -> str:
    lines = [f"# Store-side kernel census of the decode layers (CUDA codegen, no GPU; commit {data['commit']}, "
             f"size {data['size']})", "",
             "`python -m benchmarks.store_census`. Launched kernels and copy kernels of `main` after fusion "
             "(`report.kernel_census`), planned intermediate bytes, and compiled `__global__` kernels of the "
             "`\"vtc\"` pipeline's CUDA build; the `*_static` rows pass the workload's cache parameters as "
             "`inplace=`. Not timed.", "",
             "| workload | batch | kernels stock / vtc | copy kernels stock / vtc | copy kernels left (vtc) "
             "| planned bytes stock / vtc | compiled kernels stock / vtc |",
             "|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        s, v, c = r["stock"], r["vtc"], r["compiled_kernels"]
        left = ", ".join(v["data_movement_kernels"]) or "none"
        lines.append(f"| {r['workload']} | {r['batch']} | {s['kernels']} / {v['kernels']} | "
                     f"{s['data_movement']} / {v['data_movement']} | {left} | {s['planned_bytes']} / "
                     f"{v['planned_bytes']} | {c['stock']} / {c['vtc']} |")
    lines += ["", "Store-side decisions (the `\"vtc\"` pipeline's report, `side: store`):", ""]
    for r in data["rows"]:
        for d in r["stores"]:
            lines.append(f"- {r['workload']} b{r['batch']}: {d['tensor']} -> {d['consumer']}: "
                         f"{'stored' if d['virtual'] else 'refused'} ({d['reason']})")
    lines += ["", "A grow-by-concat cache (`llama_decode`, `gemma2_decode`) keeps one copy kernel: the past "
              "rows are copied into the new T+1-row tensor, which the caller's buffer has no room for "
              "(inherent; README, Limitations). With a static cache updated in place no copy kernel is left."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="small")
    ap.add_argument("--batches", default="1,16")
    args = ap.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(vtc_tvm.__file__).parent).stdout.strip()
    data = {"commit": commit, "size": args.size,
            "rows": census(args.size, [int(b) for b in args.batches.split(",")])}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "store_census.json").write_text(json.dumps(data, indent=1))
    (RESULTS / "store_census.md").write_text(markdown(data))


if __name__ == "__main__":
    main()
