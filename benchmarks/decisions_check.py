"""Same decisions, same modules: a check for changes that should only make the pass faster.

    python -m benchmarks.decisions_check dump DIR [--cases cuda-llama_decode-real,...]
    python -m benchmarks.decisions_check compare DIR_BEFORE DIR_AFTER

``dump`` writes, per case (target x workload x size, plus 32 small Llama layers on CUDA), the
plan (``vtc_tvm.plan(mod, target, memory_guard=True).to_json()``), the pass's report rows, the
module ``VirtualTensorize`` emits and the module the whole ``"vtc"`` Relax pipeline returns
(store side and schedules included), each compile cold. Run it at two commits (a checkout of the
earlier one on ``PYTHONPATH``), then ``compare``: the JSON must be identical and the modules
structurally equal (``tvm_ffi.structural_equal``); it exits 1 on any difference. Workloads:
``llama_decode``, ``llama_decode_static``, ``gemma2_decode``, ``effvit_attn``, ``shufflenet_unit``,
``yolo_c3k2`` (``benchmarks.workloads``), small and real, float16 on CUDA, float32 on LLVM;
about a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

import tvm
import tvm_ffi

WORKLOADS = ("llama_decode", "llama_decode_static", "gemma2_decode", "effvit_attn", "shufflenet_unit", "yolo_c3k2")


def cases() -> list:
    found = [(t, name, size) for t in ("cuda", "llvm") for name in WORKLOADS for size in ("small", "real")]
    return found + [("cuda", "layers32", "small")]


def dump(out: str, only=None) -> None:
    import tvm.s_tir.tensor_intrin  # noqa: F401  (DLight's one-time import, outside the loop)

    import vtc_tvm
    from benchmarks.compile_time import llama_layers
    from benchmarks.workloads import WORKLOADS as BUILDERS
    from vtc_tvm import candidates
    from vtc_tvm.pipeline import cuda_target, vtc_pipeline

    os.makedirs(out, exist_ok=True)
    for tname, name, size in cases():
        key = f"{tname}-{name}-{size}"
        if only and key not in only:
            continue
        target = cuda_target() if tname == "cuda" else tvm.target.Target("llvm")
        if name == "layers32":
            mod, inplace = llama_layers(32), ()
        else:
            wl = BUILDERS[name]
            mod, inplace = wl.build(wl.config(size, 1, "float16" if tname == "cuda" else "float32")), wl.inplace
        candidates.clear_caches()
        plan = vtc_tvm.plan(mod, target, inplace=inplace, memory_guard=True)
        candidates.clear_caches()
        rows = []
        with target:
            emitted = vtc_tvm.VirtualTensorize(target=target, memory_guard=True, inplace=inplace, report=rows)(mod)
        candidates.clear_caches()
        with tvm.transform.PassContext(opt_level=3):
            lowered = vtc_pipeline(target, inplace=inplace)(mod)
        files = {"plan": plan.to_json(), "rows": json.dumps(rows, indent=1, default=str),
                 "emitted": tvm.ir.save_json(emitted), "lowered": tvm.ir.save_json(lowered)}
        for kind, text in files.items():
            with open(os.path.join(out, f"{key}.{kind}.json"), "w") as f:
                f.write(text)
        print(key, flush=True)


def compare(a: str, b: str) -> int:
    keys = sorted({os.path.basename(p).rsplit(".", 2)[0] for p in glob.glob(os.path.join(a, "*.json"))})
    bad = 0
    for key in keys:
        res = []
        for kind in ("plan", "rows"):
            same = _read(a, key, kind) == _read(b, key, kind)
            res.append(f"{kind}={'same' if same else 'DIFFERENT'}")
            bad += not same
        for kind in ("emitted", "lowered"):
            same = tvm_ffi.structural_equal(tvm.ir.load_json(_read(a, key, kind)), tvm.ir.load_json(_read(b, key, kind)))
            res.append(f"{kind}={'equal' if same else 'DIFFERENT'}")
            bad += not same
        print(key, " ".join(res))
    print(f"{len(keys)} cases, {bad} differences")
    return 1 if bad or not keys else 0


def _read(d, key, kind) -> str:
    with open(os.path.join(d, f"{key}.{kind}.json")) as f:
        return f.read()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("out")
    d.add_argument("--cases", help="comma-separated keys such as cuda-llama_decode-real (default: all)")
    c = sub.add_parser("compare")
    c.add_argument("before")
    c.add_argument("after")
    args = ap.parse_args(argv)
    if args.cmd == "dump":
        dump(args.out, args.cases.split(",") if args.cases else None)
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
