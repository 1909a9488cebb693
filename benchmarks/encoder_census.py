"""Transformer encoders from ONNX, as users export them, stock vs vtc: kernels, copy kernels,
planned bytes and compile time (CPU only: the CUDA build compiles to source, no GPU needed).

    python -m benchmarks.encoder_census [--layers 12] [--repeat 3] [--targets cuda,llvm] [--out DIR]

writes ``encoder_census.json`` / ``.md``. The models are :mod:`benchmarks.onnx_models`' BERT
encoder at BERT-base size (hidden 768, 12 heads, FFN 3072, sequence 128; batch 1 and a symbolic
batch, ``dim_param``) and ViT at ViT-B/16 size (224 x 224 images, 196 patches + the class token,
1000 classes; batch 1: TVM's importer cannot take its class token's ``Expand`` with a symbolic
batch) and Swin-T's first stage (56 x 56 tokens, windows of 7, a shifted block, the patch
merging; batch 1), with random weights as ONNX initializers (so Relax constants, as ``from_onnx`` gives a
user), fp16 on CUDA (``vtc_tvm.pipeline.cuda_target()``) and fp32 on LLVM. Kernel counts are
:func:`vtc_tvm.report.kernel_census` (kernels a call launches after fusion; the ``"vtc"``
pipeline's options); compile times are :func:`benchmarks.compile_time.compile_times`
(interleaved medians, each vtc compile cold). No latency: that needs the GPU.
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
from benchmarks.onnx_models import bert_encoder_onnx, swin_onnx, vit_onnx
from vtc_tvm.onnx_import import load_onnx
from vtc_tvm.report import kernel_census

RESULTS = Path(__file__).resolve().parent / "results"


MODELS = {
    "bert_base": lambda layers, dtype: bert_encoder_onnx(batch=1, seq=128, hidden=768, heads=12, ffn=3072,
                                                        layers=layers, dtype=dtype),
    "vit_b16": lambda layers, dtype: vit_onnx(batch=1, image=224, patch=16, hidden=768, heads=12, ffn=3072,
                                              layers=layers, classes=1000, dtype=dtype),
    # Swin-T's first stage (its two blocks and the patch merging; ``layers`` does not apply)
    "swin_t_stage1": lambda layers, dtype: swin_onnx(batch=1, side=56, channels=96, window=7, heads=3, dtype=dtype),
}
SYMBOLIC_BATCH = ("bert_base",)  # (the ViT's class token Expand fails TVM's importer with one)


def encoder(name: str, layers: int, dtype: str, symbolic_batch: bool) -> tvm.IRModule:
    """``MODELS[name]`` imported from ONNX with its weights as initializers (random, seeded)."""
    from tests.model_fuzz import random_weights, symbolic_batch as make_symbolic, with_initializers

    model = MODELS[name](layers, dtype)
    if symbolic_batch:
        model = make_symbolic(model)
    weights = {n: a.astype(dtype) for n, a in random_weights(model, seed=0).items()}
    return load_onnx(with_initializers(model, weights))


def row(name: str, target_name: str, layers: int, symbolic_batch: bool, repeat: int) -> dict:
    target = _target(target_name)
    mod = encoder(name, layers, "float16" if target_name == "cuda" else "float32", symbolic_batch)
    with target:
        new = vtc_tvm.VirtualTensorize(target=target, memory_guard=True)(mod)
    stock, vtc = kernel_census(mod, target), kernel_census(new, target, stores=True)
    out = {"model": name, "target": target_name, "batch": "N" if symbolic_batch else 1,
           **{f"{k}_{key}": c[key] for k, c in (("stock", stock), ("vtc", vtc))
              for key in ("kernels", "data_movement", "planned_bytes")}}
    out.update({k: v for k, v in compile_times(mod, target, repeat).items() if k != "runs"})
    print(json.dumps(out), flush=True)
    return out


def markdown(data: dict) -> str:
    md = [f"# Transformer encoders from ONNX, stock vs vtc (commit {data['commit']})", "",
          f"`{data['command']}`: BERT-base (sequence 128) and ViT-B/16 (224 x 224) with {data['layers']} layers, "
          "Swin-T's first stage (56 x 56 tokens, two blocks and the patch merging), "
          "weights as ONNX initializers "
          "(Relax constants), fp16 on CUDA (to source: no GPU needed), fp32 on LLVM. Kernels / copy kernels / "
          "planned bytes: `report.kernel_census` (None: symbolic sizes are not planned statically). Compile: "
          f"`tvm.compile` CPU seconds, medians of {data['repeat']} interleaved runs on a shared 2-core machine. "
          "No latency: it needs the GPU.", "",
          "| model | target | batch | kernels stock / vtc | copy kernels stock / vtc | planned bytes stock / vtc | "
          "compile CPU s stock / vtc |", "|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        md.append(f"| {r['model']} | {r['target']} | {r['batch']} | {r['stock_kernels']} / {r['vtc_kernels']} | "
                  f"{r['stock_data_movement']} / {r['vtc_data_movement']} | {r['stock_planned_bytes']} / "
                  f"{r['vtc_planned_bytes']} | {r['stock_cpu_s']:.2f} / {r['vtc_cpu_s']:.2f} |")
    return "\n".join(md) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--targets", default="cuda,llvm")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    commit = _commit()
    import tvm.s_tir.tensor_intrin  # noqa: F401  (DLight's one-time import, outside the timing)
    rows = [row(name, t, args.layers, sym, args.repeat) for name in MODELS for t in args.targets.split(",") if t
            for sym in ((False, True) if name in SYMBOLIC_BATCH else (False,))]
    data = {"commit": commit, "command": "python -m benchmarks.encoder_census " + " ".join(
        sys.argv[1:] if argv is None else argv), "layers": args.layers, "repeat": args.repeat,
        "rows": rows}
    report_files.write(args.out, "encoder_census", data, markdown(data))


if __name__ == "__main__":
    main()
