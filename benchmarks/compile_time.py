"""Compile time of the Relax pipeline, stock vs ``"vtc"`` (issue 12).

``python -m benchmarks.compile_time [--repeat 3] [--layers 1,4,16,32]`` writes
``benchmarks/results/compile_time.json`` and ``.md``:

* the real Llama-3-8B decode layer (``benchmarks.workloads`` real config), CUDA target;
* whole ShuffleNetV2 / EfficientViT-B1 / YOLO11n from ONNX with weights as constants, when
  ``benchmarks.whole_models`` is present (helper "models"'s branch);
* the pass alone (``VirtualTensorize`` with the pipeline's options) on 1/4/16/32 Llama-style
  layers (the small layer repeated, inlined into one ``main``).

"Compile" is the Relax pipeline (``relax.get_default_pipeline(target)`` / ``relax.get_pipeline(
"vtc", target=target)`` applied to the module: legalization, fusion, DLight scheduling, memory
planning), not the CUDA code generation, which both share. Runs are interleaved (stock, vtc,
stock, ...) and the median is reported: this machine is shared and absolute times are noisy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import tvm
from tvm import relax

import vtc_tvm  # noqa: F401
from vtc_tvm import models
from vtc_tvm.pipeline import cuda_target

RESULTS = Path(__file__).resolve().parent / "results"


def llama_layers(n: int) -> tvm.IRModule:
    """``n`` small Llama-style decoder layers chained through ``x`` in one ``main`` (weights and
    caches shared: the structure, not the parameters, is what the pass sees)."""
    layer_mod = models.llama_decoder_layer(models.LlamaConfig.small())
    layer = layer_mod["main"].without_attr("global_symbol")
    params = [relax.Var(p.name, p.ty) for p in layer.params]
    bb = relax.BlockBuilder()
    gv = bb.add_func(layer, "layer")
    with bb.function("main", params):
        with bb.dataflow():
            x = params[0]
            for _ in range(n):
                out = bb.emit(relax.Call(gv, [x] + params[1:]))
                x = bb.emit(relax.TupleGetItem(out, 0))
            y = bb.emit_output(x)
        bb.emit_func_output(y)
    mod = relax.transform.InlinePrivateFunctions()(bb.get())
    return relax.transform.DeadCodeElimination()(relax.transform.Normalize()(mod))


def _median_pair(run_stock, run_vtc, repeat):
    stock, vtc = [], []
    for _ in range(repeat):
        for fn, acc in ((run_stock, stock), (run_vtc, vtc)):
            t = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t)
    return statistics.median(stock), statistics.median(vtc)


def pipeline_times(mod, target, repeat):
    return _median_pair(lambda: relax.get_default_pipeline(target)(mod),
                        lambda: relax.get_pipeline("vtc", target=target)(mod), repeat)


def whole_models():
    try:
        from benchmarks import whole_models as wm
    except ImportError as err:
        print(f"whole models skipped: benchmarks.whole_models is not on this branch ({err})")
        return {}
    found = {}
    for name in ("shufflenet_v2", "efficientvit_b1", "yolo11n"):
        try:
            found[name] = wm.relax_module(name) if hasattr(wm, "relax_module") else None
        except Exception as err:  # noqa: BLE001 - report, do not guess
            print(f"{name} skipped: {err}")
    return {k: v for k, v in found.items() if v is not None}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--layers", default="1,4,16,32")
    ap.add_argument("--skip-real", action="store_true")
    args = ap.parse_args(argv)
    target = cuda_target()
    rows = []
    if not args.skip_real:
        from benchmarks.workloads import WORKLOADS

        wl = WORKLOADS["llama_decode"]
        mod = wl.build(wl.config("real", 1, "float16"))
        s, v = pipeline_times(mod, target, args.repeat)
        rows.append({"workload": "llama_decode real (Llama-3-8B layer)", "stock_s": s, "vtc_s": v, "ratio": v / s})
        for name, mod in whole_models().items():
            s, v = pipeline_times(mod, target, args.repeat)
            rows.append({"workload": f"{name} (ONNX, whole)", "stock_s": s, "vtc_s": v, "ratio": v / s})
    layers = []
    for n in [int(k) for k in args.layers.split(",")]:
        mod = llama_layers(n)
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            vtc_tvm.VirtualTensorize(target=target, memory_guard=True)(mod)
            times.append(time.perf_counter() - t)
        layers.append({"layers": n, "pass_s": statistics.median(times)})
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    data = {"commit": commit, "target": str(target.kind.name), "repeat": args.repeat, "pipelines": rows,
            "pass_by_layers": layers}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "compile_time.json").write_text(json.dumps(data, indent=1))
    md = [f"# Compile time, stock vs vtc (commit {commit}, CUDA target, Relax pipeline, median of {args.repeat})",
          "", "| workload | stock s | vtc s | vtc / stock |", "|---|---|---|---|"]
    md += [f"| {r['workload']} | {r['stock_s']:.2f} | {r['vtc_s']:.2f} | {r['ratio']:.2f}x |" for r in rows]
    md += ["", "VirtualTensorize alone on small Llama-style layers inlined into one `main`:", "",
           "| layers | pass s |", "|---|---|"] + [f"| {r['layers']} | {r['pass_s']:.2f} |" for r in layers]
    (RESULTS / "compile_time.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
