"""Compile time, stock TVM vs the ``"vtc"`` pipeline (issue 12).

    python -m benchmarks.compile_time [--repeat 3] [--targets llvm,cuda] [--models ...] [--layers 1,4,16,32]
                                      [--first cuda:llama_decode:1,cuda:llama_decode:16]

writes ``benchmarks/results/compile_time.json`` and ``.md``:

* whole compiles: ``tvm.compile(mod, target, relax_pipeline=...)`` with
  ``relax.get_default_pipeline(target)`` (stock) and ``vtc_pipeline(target)`` (vtc: memory guard
  on, as users get it) of the real Llama-3-8B decode layer (``benchmarks.workloads``, real
  config) and of whole ShuffleNetV2 x1.0 / EfficientViT-B1 / YOLO11n imported from ONNX with
  their weights as constants (``benchmarks.whole_models``, made from a seed; ``load_onnx``).
  LLVM: the Relax pipeline and LLVM code generation. CUDA: the Relax pipeline (DLight
  scheduling) and CUDA source generation; nvcc/NVRTC runs only when the module is loaded on a
  GPU (``shared/TVM_NOTES.md``), so it is not timed. float32 on LLVM, float16 on CUDA, batch 1.
* the pass alone (``VirtualTensorize`` with the pipeline's options, CUDA target: DLight's rule
  check included) on 1/4/16/32 small Llama-style layers inlined into one ``main``.

* first compiles (``--first``): one compile in a fresh process for each variant, as a user's
  first ``tvm.compile`` costs, one-time imports included (TVM's tensor intrinsics: 6-25 s here
  when imported; the batch-16 decode layer is where stock imports none and vtc used to, until
  :mod:`vtc_tvm.schedules.wmma`). ``--first-root`` runs another checkout's code (a before run).

Every vtc compile of the first two tables is cold: the pass's caches are cleared first
(``candidates.clear_caches``), as in a fresh process. Runs are interleaved (stock, vtc, stock, ...)
and the medians of wall time and of process CPU time are reported: the machine is shared, so CPU
time (work done, whatever the contention) is the steadier of the two; the load average is
recorded. In those two tables the model import and TVM's one-time import of its tensor
intrinsics (DLight's first tensor-core match) happen before any timing; the third has them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import tvm
from tvm import relax

import vtc_tvm  # noqa: F401
from vtc_tvm import candidates, models
from vtc_tvm.errors import last_line
from vtc_tvm.pipeline import cuda_target, vtc_pipeline

from benchmarks import report_files

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("llama_decode", "shufflenet_v2_whole", "efficientvit_b1", "yolo11n")
TARGETS = ("llvm", "cuda")


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


def _target(name: str) -> tvm.target.Target:
    return cuda_target() if name == "cuda" else tvm.target.Target(name)


def model(name: str, target_name: str) -> tvm.IRModule:
    """The real Llama-3-8B layer, or a whole model from ONNX with its weights as constants."""
    dtype = "float16" if target_name == "cuda" else "float32"
    if name == "llama_decode":
        from benchmarks.workloads import WORKLOADS

        wl = WORKLOADS[name]
        return wl.build(wl.config("real", 1, dtype))
    from benchmarks.whole_models import whole_model
    from vtc_tvm.onnx_import import load_onnx

    return load_onnx(whole_model(name, "real", 1, dtype=dtype))


def _timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def _pass_seconds():
    """A pass instrument that adds up the wall time of the VirtualTensorize pass."""
    seconds = {"VirtualTensorize": 0.0}
    started = {}

    @tvm.instrument.pass_instrument
    class _Timer:
        def run_before_pass(self, _mod, info):
            if info.name in seconds:
                started[info.name] = time.perf_counter()

        def run_after_pass(self, _mod, info):
            if info.name in started:
                seconds[info.name] += time.perf_counter() - started.pop(info.name)

    return _Timer(), seconds


def compile_times(mod, target, repeat: int) -> dict:
    """Median wall / CPU seconds of the stock and the vtc compile of ``mod`` (interleaved)."""
    runs = {"stock": [], "vtc": []}
    for _ in range(repeat):
        for variant in runs:
            pipeline = relax.get_default_pipeline(target) if variant == "stock" else vtc_pipeline(target)
            candidates.clear_caches()  # a cold compile
            timer, seconds = _pass_seconds()
            with tvm.transform.PassContext(instruments=[timer]):
                wall, cpu = _timed(lambda: tvm.compile(mod, target=target, relax_pipeline=pipeline))
            runs[variant].append((wall, cpu, seconds["VirtualTensorize"]))
    row = {"runs": {v: [[round(x, 3) for x in r] for r in rs] for v, rs in runs.items()}}
    for variant, rs in runs.items():
        row[f"{variant}_wall_s"] = statistics.median(r[0] for r in rs)
        row[f"{variant}_cpu_s"] = statistics.median(r[1] for r in rs)
    row["vtc_pass_s"] = statistics.median(r[2] for r in runs["vtc"])
    row["ratio_wall"] = row["vtc_wall_s"] / row["stock_wall_s"]
    row["ratio_cpu"] = row["vtc_cpu_s"] / row["stock_cpu_s"]
    return row


def pass_by_layers(layers, repeat: int) -> list:
    target = cuda_target()
    rows = []
    for n in layers:
        mod = llama_layers(n)
        runs = []
        for _ in range(repeat):
            candidates.clear_caches()
            with target:
                runs.append(_timed(lambda: vtc_tvm.VirtualTensorize(target=target, memory_guard=True)(mod)))
        rows.append({"layers": n, "pass_wall_s": statistics.median(r[0] for r in runs),
                     "pass_cpu_s": statistics.median(r[1] for r in runs),
                     "runs": [[round(x, 3) for x in r] for r in runs]})
        print(json.dumps(rows[-1]), flush=True)
    return rows


# One compile in this fresh process, of a workload at real size, with the code of the checkout at
# ROOT (benchmarks/at_checkout.py): prints its wall and CPU seconds as JSON.
_FIRST_COMPILE = """
import json, runpy, sys, time
runpy.run_path({at_checkout!r})["use_checkout"]({root!r})
import tvm
from tvm import relax
from vtc_tvm.pipeline import cuda_target, vtc_pipeline
from benchmarks.workloads import WORKLOADS
wl = WORKLOADS[{name!r}]
mod = wl.build(wl.config("real", {batch}, "float16" if {target!r} == "cuda" else "float32"))
target = cuda_target() if {target!r} == "cuda" else tvm.target.Target({target!r})
pipeline = relax.get_default_pipeline(target) if {variant!r} == "stock" else vtc_pipeline(target)
wall, cpu = time.perf_counter(), time.process_time()
tvm.compile(mod, target=target, relax_pipeline=pipeline)
print(json.dumps({{"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}}))
"""


def first_compiles(cases, repeat: int, root: str) -> list:
    """Per ``target:workload:batch`` case, the medians of ``repeat`` first compiles in fresh
    processes, stock and vtc interleaved."""
    at_checkout = str(Path(__file__).resolve().parent / "at_checkout.py")
    rows = []
    for case in cases:
        target, name, batch = case.split(":")
        row = {"target": target, "model": name, "batch": int(batch), "runs": {"stock": [], "vtc": []}}
        for _ in range(repeat):
            for variant in row["runs"]:
                code = _FIRST_COMPILE.format(at_checkout=at_checkout, root=root, name=name, batch=int(batch),
                                             target=target, variant=variant)
                out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
                if out.returncode:
                    raise RuntimeError(f"{case} {variant} in a fresh process: {last_line(out.stderr)}")
                t = json.loads(out.stdout.strip().splitlines()[-1])
                row["runs"][variant].append([round(t["wall_s"], 3), round(t["cpu_s"], 3)])
        for variant, runs in row["runs"].items():
            row[f"{variant}_wall_s"] = statistics.median(r[0] for r in runs)
            row[f"{variant}_cpu_s"] = statistics.median(r[1] for r in runs)
        row["ratio_wall"] = row["vtc_wall_s"] / row["stock_wall_s"]
        print(json.dumps({k: v for k, v in row.items() if k != "runs"}), flush=True)
        rows.append(row)
    return rows


def _commit(here=Path(__file__).parent) -> str:
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=here).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True, cwd=here).stdout.strip()
    return sha.strip() + ("+dirty" if dirty else "")


def markdown(data: dict) -> str:
    md = [f"# Compile time, stock vs vtc (commit {data['commit']})", "",
          f"`{data['command']}` on {data['host']} ({data['cpus']} cores, shared with other jobs; load average "
          f"{data['load_before']} before, {data['load_after']} after). Medians of {data['repeat']} interleaved runs, "
          "each vtc compile cold (the pass's caches cleared). Wall time moves with the machine's load; "
          "CPU time (the process's work) is the steadier ratio.", ""] + _tables(data)
    before = data.get("before")
    if before:
        md += ["", f"## Before (commit {before['commit']}, the same command and script"
               f"{', ' + before['note'] if before.get('note') else ''}; load average {before['load_before']} "
               f"before, {before['load_after']} after)", ""] + _tables(before)
    return "\n".join(md) + "\n"


def _tables(data: dict) -> list:
    md = []
    if data["compiles"]:
        md += ["Whole compiles (`tvm.compile`: the Relax pipeline plus code generation; CUDA: to CUDA source, no "
               "nvcc), batch 1, float32 on LLVM, float16 on CUDA:", "",
               "| target | model | stock wall s | vtc wall s | vtc / stock (wall) | stock CPU s | vtc CPU s | "
               "vtc / stock (CPU) | of which VirtualTensorize s |",
               "|---|---|---|---|---|---|---|---|---|"]
    for r in data["compiles"]:
        if "error" in r:
            md.append(f"| {r['target']} | {r['model']} | error: {r['error']} |||||||")
            continue
        md.append(f"| {r['target']} | {r['model']} | {r['stock_wall_s']:.2f} | {r['vtc_wall_s']:.2f} | "
                  f"{r['ratio_wall']:.2f}x | {r['stock_cpu_s']:.2f} | {r['vtc_cpu_s']:.2f} | {r['ratio_cpu']:.2f}x | "
                  f"{r['vtc_pass_s']:.2f} |")
    if data["pass_by_layers"]:
        md += ["", "VirtualTensorize alone (CUDA target: DLight's rule check included; memory guard on) on small "
               "Llama-style layers inlined into one `main`, cold:", "",
               "| layers | pass wall s | pass CPU s |", "|---|---|---|"]
        md += [f"| {r['layers']} | {r['pass_wall_s']:.2f} | {r['pass_cpu_s']:.2f} |" for r in data["pass_by_layers"]]
    if data.get("first_compiles"):
        md += ["", f"First compile in a fresh process (one-time imports included; code of "
               f"{data.get('first_root_commit', data['commit'])}), real size, float16 on CUDA:", "",
               "| target | workload | batch | stock wall s | vtc wall s | vtc / stock (wall) | stock CPU s | vtc CPU s |",
               "|---|---|---|---|---|---|---|---|"]
        md += [f"| {r['target']} | {r['model']} | {r['batch']} | {r['stock_wall_s']:.2f} | {r['vtc_wall_s']:.2f} | "
               f"{r['ratio_wall']:.2f}x | {r['stock_cpu_s']:.2f} | {r['vtc_cpu_s']:.2f} |" for r in data["first_compiles"]]
    return md


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--models", default=",".join(MODELS), help="'' for none")
    ap.add_argument("--layers", default="1,4,16,32", help="'' for none")
    ap.add_argument("--first", default="cuda:llama_decode:1,cuda:llama_decode:16",
                    help="target:workload:batch cases compiled once in fresh processes ('' for none)")
    ap.add_argument("--first-root", default=str(Path(__file__).resolve().parent.parent),
                    help="the checkout whose code the fresh processes run (default: this one)")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--before", help="a compile_time.json of an earlier commit, shown below (its 'commit' and "
                                     "'note' keys say what it is)")
    ap.add_argument("--render", action="store_true", help="only rewrite the .md from the .json in --out "
                                                          "(with --before)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.render:
        data = json.loads((out / "compile_time.json").read_text())
        if args.before:
            data["before"] = json.loads(Path(args.before).read_text())
            (out / "compile_time.json").write_text(json.dumps(data, indent=1))
        (out / "compile_time.md").write_text(markdown(data))
        return
    load_before = [round(x, 2) for x in os.getloadavg()]
    commit, first_root_commit = _commit(), _commit(args.first_root)  # the code measured, not the code at the end
    import tvm.s_tir.tensor_intrin  # noqa: F401  (a one-time import DLight's first tensor-core match does)

    compiles = []
    for target_name in [t for t in args.targets.split(",") if t]:
        target = _target(target_name)
        for name in [m for m in args.models.split(",") if m]:
            row = {"target": target_name, "model": name}
            try:
                row.update(compile_times(model(name, target_name), target, args.repeat))
            except Exception as err:  # noqa: BLE001 - a failing compile is a result
                row["error"] = f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:200]}"
            print(json.dumps({k: v for k, v in row.items() if k != "runs"}), flush=True)
            compiles.append(row)
    layers = pass_by_layers([int(k) for k in args.layers.split(",") if k], args.repeat)
    first = first_compiles([c for c in args.first.split(",") if c], args.repeat, args.first_root)
    data = {"commit": commit, "command": "python -m benchmarks.compile_time " + " ".join(
        sys.argv[1:] if argv is None else argv), "tvm": tvm.__version__, "host": platform.node(),
        "cpus": os.cpu_count(), "load_before": load_before, "load_after": [round(x, 2) for x in os.getloadavg()],
        "repeat": args.repeat, "compiles": compiles, "pass_by_layers": layers, "first_compiles": first,
        "first_root_commit": first_root_commit}
    if args.before:
        data["before"] = json.loads(Path(args.before).read_text())
    report_files.write(out, "compile_time", data, markdown(data))


if __name__ == "__main__":
    main()
