"""A BERT-base encoder from ONNX, as a user exports it, stock vs vtc: kernels, copy kernels,
planned bytes and compile time (CPU only: the CUDA build compiles to source, no GPU needed).

    python -m benchmarks.encoder_census [--layers 12] [--seq 128] [--repeat 3] [--out DIR]

writes ``encoder_census.json`` / ``.md``. The model is :func:`benchmarks.onnx_models.bert_encoder_onnx`
at BERT-base size (hidden 768, 12 heads, FFN 3072) with random weights as ONNX initializers (so
Relax constants, as ``from_onnx`` gives a user), batch 1 and a symbolic batch (``dim_param``), fp16
on CUDA (``vtc_tvm.pipeline.cuda_target()``) and fp32 on LLVM. Kernel counts are
:func:`vtc_tvm.report.kernel_census` (kernels a call launches after fusion; the ``"vtc"`` pipeline's
options); compile times are :func:`benchmarks.compile_time.compile_times` (interleaved medians,
each vtc compile cold). No latency: that needs the GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import tvm

import vtc_tvm
from benchmarks import report_files
from benchmarks.compile_time import _commit, _target, compile_times
from benchmarks.onnx_models import bert_encoder_onnx
from vtc_tvm.onnx_import import load_onnx
from vtc_tvm.report import kernel_census

RESULTS = Path(__file__).resolve().parent / "results"


def encoder(layers: int, seq: int, dtype: str, symbolic_batch: bool) -> tvm.IRModule:
    """BERT-base imported from ONNX with its weights as initializers (random, seeded)."""
    from tests.model_fuzz import random_weights, symbolic_batch as make_symbolic, with_initializers

    model = bert_encoder_onnx(batch=1, seq=seq, hidden=768, heads=12, ffn=3072, layers=layers, dtype=dtype)
    if symbolic_batch:
        model = make_symbolic(model)
    weights = {n: a.astype(dtype) for n, a in random_weights(model, seed=0).items()}
    return load_onnx(with_initializers(model, weights))


def row(target_name: str, layers: int, seq: int, symbolic_batch: bool, repeat: int) -> dict:
    target = _target(target_name)
    mod = encoder(layers, seq, "float16" if target_name == "cuda" else "float32", symbolic_batch)
    with target:
        new = vtc_tvm.VirtualTensorize(target=target, memory_guard=True)(mod)
    stock, vtc = kernel_census(mod, target), kernel_census(new, target, stores=True)
    out = {"target": target_name, "batch": "N" if symbolic_batch else 1,
           **{f"{k}_{key}": c[key] for k, c in (("stock", stock), ("vtc", vtc))
              for key in ("kernels", "data_movement", "planned_bytes")}}
    out.update({k: v for k, v in compile_times(mod, target, repeat).items() if k != "runs"})
    print(json.dumps(out), flush=True)
    return out


def markdown(data: dict) -> str:
    md = [f"# BERT-base encoder from ONNX, stock vs vtc (commit {data['commit']})", "",
          f"`{data['command']}`: {data['layers']} layers, sequence {data['seq']}, weights as ONNX initializers "
          "(Relax constants), fp16 on CUDA (to source: no GPU needed), fp32 on LLVM. Kernels / copy kernels / "
          "planned bytes: `report.kernel_census` (None: symbolic sizes are not planned statically). Compile: "
          f"`tvm.compile` CPU seconds, medians of {data['repeat']} interleaved runs on a shared 2-core machine. "
          "No latency: it needs the GPU.", "",
          "| target | batch | kernels stock / vtc | copy kernels stock / vtc | planned bytes stock / vtc | "
          "compile CPU s stock / vtc |", "|---|---|---|---|---|---|"]
    for r in data["rows"]:
        md.append(f"| {r['target']} | {r['batch']} | {r['stock_kernels']} / {r['vtc_kernels']} | "
                  f"{r['stock_data_movement']} / {r['vtc_data_movement']} | {r['stock_planned_bytes']} / "
                  f"{r['vtc_planned_bytes']} | {r['stock_cpu_s']:.2f} / {r['vtc_cpu_s']:.2f} |")
    return "\n".join(md) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--targets", default="cuda,llvm")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    commit = _commit()
    import tvm.s_tir.tensor_intrin  # noqa: F401  (DLight's one-time import, outside the timing)
    rows = [row(t, args.layers, args.seq, sym, args.repeat)
            for t in args.targets.split(",") if t for sym in (False, True)]
    data = {"commit": commit, "command": "python -m benchmarks.encoder_census " + " ".join(
        sys.argv[1:] if argv is None else argv), "layers": args.layers, "seq": args.seq, "repeat": args.repeat,
        "rows": rows}
    report_files.write(args.out, "encoder_census", data, markdown(data))


if __name__ == "__main__":
    main()
