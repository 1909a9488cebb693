"""Which schedule rule takes each kernel of a model's CUDA build, with each GEMM's extents; no GPU.

``python -m benchmarks.rule_census [--models yolo11n ...] [--size real] [--batches 16]`` builds each
model through the ``"vtc"`` pipeline for CUDA (sm_90) with every rule of
:func:`vtc_tvm.schedules.default_rules` recording the kernels it schedules, and writes
``benchmarks/results/rule_census.json`` and ``rule_census.md``: per model and batch, the kernels
each rule took, and for every GEMM (a reduction DLight's Matmul normalises) its ``I x J x K``
(output rows, output columns, reduction; for a convolution: pixels, output channels, window
times input channels), dtype, the rule that took it and whether the kernel runs on tensor
cores. It says where a schedule rule applies; nothing is timed.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import time
from pathlib import Path

import tvm_ffi
from tvm import tirx
from tvm.s_tir import SBlock

from vtc_tvm import schedules as S
from vtc_tvm.pipeline import cuda_target, vtc_pipeline
from vtc_tvm.schedules import batched_gemv
from vtc_tvm.schedules.narrow_gemm import narrow_extents
from vtc_tvm.schedules.recording import Recording
from vtc_tvm.schedules.window_reduction import static_extent

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("yolo11n", "efficientvit_b1", "shufflenet_v2_whole")


def gemm_facts(func) -> dict | None:
    """``{"I", "J", "K", "dtype"}`` of ``func``'s GEMM block (None: no GEMM)."""
    for block in batched_gemv._blocks(func):
        extents = narrow_extents(block)
        if extents is not None:
            return {"I": extents[0], "J": extents[1], "K": static_extent(block, tirx.IterVar.CommReduce),
                    "dtype": str(block.reads[0].source.dtype)}
    return None


def _on_tensor_cores(func) -> bool:
    scopes = []
    tvm_ffi.structural_walk(func.body, (SBlock, lambda b: scopes.extend(buf.scope() for buf in b.alloc_buffers)),
                            order="post")
    return any(scope.startswith("wmma.") for scope in scopes)


def _rule_name(rule) -> str:
    """The rule's class name; a guarded rule by the rule it guards (``Matmul``, not ``Guarded``)."""
    return type(S.unguarded(rule)).__name__


def census(model: str, size: str, batch: int, dtype: str = "float16") -> dict:
    from benchmarks.whole_models import WHOLE_WORKLOADS

    target = cuda_target()
    taken: list = []  # (rule name, GEMM facts or None, tensor cores) of each kernel a rule takes
    rules = [Recording(r, lambda rule, func, sch: taken.append(
        (_rule_name(rule), gemm_facts(func), _on_tensor_cores(sch.mod["main"])))) for r in S.default_rules(target)]
    wl = WHOLE_WORKLOADS[model]
    mod = wl.build(wl.config(size, batch, dtype))
    start = time.time()
    with target:
        vtc_pipeline(target, schedules=rules)(mod)
    gemms = [dict(facts, rule=rule, tensor_cores=tc) for rule, facts, tc in taken if facts is not None]
    return {"model": model, "size": size, "batch": batch, "dtype": dtype, "pipeline_s": round(time.time() - start, 1),
            "kernels_by_rule": dict(collections.Counter(rule for rule, _, _ in taken)), "gemms": gemms}


def markdown(data: dict) -> str:
    lines = [f"# Schedule rules by kernel (CUDA sm_90 codegen, no GPU; commit {data['commit']})", "",
             f"`{data['command']}`", ""]
    for row in data["rows"]:
        gemms = row["gemms"]
        simt = [g for g in gemms if not g["tensor_cores"]]
        lines += [f"## {row['model']} ({row['size']}, batch {row['batch']}, {row['dtype']})", "",
                  f"Kernels by rule: {row['kernels_by_rule']}. GEMM kernels: {len(gemms)}, on tensor cores "
                  f"{len(gemms) - len(simt)}.", "", "| I | J | K | rule | tensor cores |", "|---|---|---|---|---|"]
        lines += [f"| {g['I']} | {g['J']} | {g['K']} | {g['rule']} | {'yes' if g['tensor_cores'] else 'no'} |"
                  for g in sorted(gemms, key=lambda g: -(g["I"] or 0) * (g["J"] or 0) * (g["K"] or 0))]
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--size", default="real", choices=("small", "real"))
    ap.add_argument("--batches", nargs="+", type=int, default=[16])
    ap.add_argument("--out", type=Path, default=RESULTS)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = ap.parse_args(argv)
    rows = []
    for model in args.models:
        for batch in args.batches:
            rows.append(census(model, args.size, batch))
            print(model, batch, rows[-1]["kernels_by_rule"], flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    data = {"commit": commit, "command": " ".join(["python -m benchmarks.rule_census", *argv]), "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rule_census.json").write_text(json.dumps(data, indent=1) + "\n")
    (args.out / "rule_census.md").write_text(markdown(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
