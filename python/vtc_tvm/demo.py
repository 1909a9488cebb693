"""Stock TVM vs VirtualTensorize on a built-in model: same inputs, same outputs, fewer copies.

    python -m vtc_tvm.demo [--model llama|shufflenet] [--size small|real] [--target auto|llvm|cuda]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import tvm

from .pipeline import cuda_target
from .models import BUILTIN_MODELS, build_model, random_inputs
from .report import compile_variants, run_vm, time_vm

def pick_target(name: str) -> tuple[tvm.target.Target, tvm.runtime.Device]:
    if name == "auto":
        name = "cuda" if tvm.cuda(0).exist else "llvm"
    if name == "cuda":
        return cuda_target(), tvm.cuda(0)
    return tvm.target.Target("llvm"), tvm.cpu(0)


def mismatch(ref: list[np.ndarray], got: list[np.ndarray], dtype: str) -> str | None:
    """Why ``got`` disagrees with ``ref`` (None when it agrees)."""
    for i, (a, b) in enumerate(zip(ref, got)):
        a, b = a.astype("float64"), b.astype("float64")
        if a.shape != b.shape:
            return f"output {i}: shape {b.shape} != {a.shape}"
        if dtype == "float16":  # elementwise fp16 tolerances are meaningless after long reductions
            rel = np.linalg.norm(b - a) / max(np.linalg.norm(a), 1e-30)
            if not rel < 1e-2:
                return f"output {i}: relative L2 error {rel:.3g} >= 1e-2"
        elif not np.allclose(b, a, rtol=1e-5, atol=1e-5):
            return f"output {i}: max abs error {np.abs(b - a).max():.3g} (rtol 1e-5, atol 1e-5)"
    return None if len(ref) == len(got) else f"{len(got)} outputs, expected {len(ref)}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vtc_tvm.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(BUILTIN_MODELS), default="llama")
    ap.add_argument("--size", choices=["small", "real"], default="small")
    ap.add_argument("--target", choices=["auto", "llvm", "cuda"], default="auto")
    ap.add_argument("--dtype", choices=["auto", "float32", "float16"], default="auto",
                    help="auto: float16 on cuda, float32 on llvm")
    ap.add_argument("--repeat", type=int, default=10, help="timed runs per variant")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    target, dev = pick_target(args.target)
    dtype = args.dtype if args.dtype != "auto" else ("float16" if target.kind.name == "cuda" else "float32")
    mod = build_model(args.model, args.size, dtype=dtype)
    inputs = random_inputs(mod, args.seed)
    print(f"{args.model} ({args.size}, {dtype}) on {target.kind.name}")

    variants = compile_variants(mod, target)
    rows, outputs = {}, {}
    for name, (census, ex) in variants.items():
        outputs[name] = run_vm(ex, dev, inputs)
        rows[name] = (census["kernels"], census["data_movement"], census["planned_bytes"] / 2**20,
                      time_vm(ex, dev, inputs, args.repeat))

    print(f"{'':8}{'kernels':>9}{'data-mv':>9}{'mem MiB':>10}{'ms':>10}")
    for name, (k, dm, mib, ms) in rows.items():
        print(f"{name:8}{k:>9}{dm:>9}{mib:>10.3f}{ms:>10.3f}")

    why = mismatch(outputs["stock"], outputs["vtc"], dtype)
    if why:
        print(f"MISMATCH: vtc disagrees with stock TVM: {why}", file=sys.stderr)
        return 1
    print("outputs agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
