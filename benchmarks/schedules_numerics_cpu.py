"""CPU-side numerics of :mod:`vtc_tvm.schedules` on the real decode kernels (no GPU needed).

For each kernel of the vtc decode layer (real size) that our rules take, three versions run on
llvm on the same random fp16 inputs: the kernel as the pipeline hands it to the scheduler
(16-bit accumulation, summed serially: what DLight's SIMT Matmul does per thread over its
tile), our scheduled kernel with its thread loops made serial (float32 partials, the same sum
order as on the GPU: lanes, then splits), and a float64-accumulating reference. Prints and
writes relative L2 errors against the reference.

What this does NOT show: the GPU's cross-thread lowering (shuffles, barriers) and DLight's own
tiled sum order (it cannot run on llvm); the H200 script measures whole layers against float64.

    python benchmarks/schedules_numerics_cpu.py --workloads gemma2_decode llama_decode --batch 1
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import tvm
import tvm_ffi
from tvm import tirx

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.schedules_h200 import fused_kernels  # noqa: E402
from vtc_tvm.pipeline import cuda_target  # noqa: E402
from vtc_tvm.schedules import TensorCoreGEMM, batched_gemv, our_rules, tensor_core_gemm, widen_accumulator  # noqa: E402


def serial(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every thread-bound loop serial (runs on llvm; same loop nest otherwise)."""
    def on_for(loop):
        if loop.kind == tirx.ForKind.THREAD_BINDING:
            return tirx.For(loop.loop_var, loop.min, loop.extent, tirx.ForKind.SERIAL, loop.body, None,
                            loop.annotations)
        return loop

    return tirx.PrimFunc(func.params, tvm_ffi.structural_map(func.body, (tirx.For, on_for), order="post"),
                         ret_type=func.ret_type, attrs=func.attrs)


def run_llvm(func, arrays):
    lib = tvm.tirx.build(tvm.IRModule({"k": func.with_attr("global_symbol", "k")}), target="llvm")
    args = [tvm.runtime.tensor(a) for a in arrays]
    lib["k"](*args)
    return args[-1].numpy().astype(np.float64)


def reference(func):
    """``func`` accumulating in float64 (inputs and the one final rounding as in ``func``)."""
    found = batched_gemv.single_reduction(func)
    sch, block = found
    return widen_accumulator(sch, block, "float64").mod["main"]


def rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="+", default=["gemma2_decode", "llama_decode"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--size", default="real")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    target = cuda_target()
    rows = []
    for name in args.workloads:
        for kname, func in fused_kernels(name, args.size, args.batch, target, "float16").items():
            with target:
                rule = next((r for r in our_rules(target) if r.apply(func, target, False) is not None), None)
            if rule is None:
                continue
            with target:
                if isinstance(rule, TensorCoreGEMM):  # WMMA does not run on llvm: its loop nest does
                    sch, form, epilogue = batched_gemv.prepare(func)
                    scheduled = tensor_core_gemm.schedule(sch, form, epilogue, tensor_core_gemm.plan(form, target),
                                                          tensorize=False).mod["main"]
                else:
                    scheduled = rule.apply(func, target, False).mod["main"]
            rng = np.random.default_rng(0)
            arrays = [rng.uniform(-1, 1, [int(s) for s in p.shape]).astype(str(p.dtype)) for p in func.params]
            ref = run_llvm(reference(func), [a.copy() for a in arrays])
            row = {"workload": name, "kernel": kname, "rule": type(rule).__name__,
                   "fp16_serial": rel(run_llvm(func, [a.copy() for a in arrays]), ref),
                   "ours_fp32": rel(run_llvm(serial(scheduled), [a.copy() for a in arrays]), ref)}
            rows.append(row)
            print(f"{name:<15}{kname:<32}{row['rule']:<16} fp16 accumulate {row['fp16_serial']:.2e}   "
                  f"ours (fp32) {row['ours_fp32']:.2e}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": "python benchmarks/schedules_numerics_cpu.py " + " ".join(argv or sys.argv[1:]),
                       "inputs": "uniform(-1, 1) fp16, seed 0", "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
