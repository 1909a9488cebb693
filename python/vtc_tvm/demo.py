"""Stock TVM vs VirtualTensorize on a built-in model: same inputs, same outputs, fewer copies.

    vtc-tvm demo [--model llama|shufflenet] [--size small|real] [--target auto|llvm|cuda|...]
    python -m vtc_tvm.demo [same options]

Exit codes as ``vtc-tvm`` (:mod:`vtc_tvm.errors`): 3 when the outputs disagree, 4 when the
target's device is missing.
"""

from __future__ import annotations

import sys

import numpy as np
import tvm

from .models import BUILTIN_MODELS, build_model, random_inputs


def mismatch(ref: list[np.ndarray], got: list[np.ndarray], dtype: str = "") -> str | None:
    """Why ``got`` disagrees with ``ref`` (None when it agrees), by :mod:`vtc_tvm.check`'s
    scale-aware tolerances (``dtype`` is unused: each output's own dtype decides)."""
    from .check import compare_outputs

    bad = [e for e in compare_outputs(ref, got) if not e.ok]
    return None if not bad else f"output {bad[0].index}: {bad[0].describe()}"


def add_arguments(ap) -> None:
    ap.add_argument("--model", choices=sorted(BUILTIN_MODELS), default="llama")
    ap.add_argument("--size", choices=["small", "real"], default="small")
    ap.add_argument("--target", default="auto",
                    help="auto (cuda when a GPU is visible, else llvm), or any TVM target")
    ap.add_argument("--dtype", choices=["auto", "float32", "float16"], default="auto",
                    help="auto: float16 on cuda, float32 on llvm")
    ap.add_argument("--repeat", type=int, default=10, help="timed runs per variant")
    ap.add_argument("--seed", type=int, default=0)


def run(args, console, out: dict) -> int:
    """The demo for parsed ``args`` (see :func:`vtc_tvm.cli.main`); fills ``out`` for --json."""
    from tvm import relax

    from .cli import _say, device_for, resolve_target
    from .errors import ExitCode
    from .pipeline import store_side_pipeline
    from .report import kernel_census, run_vm, time_vm
    from .transform import VirtualTensorize

    target = resolve_target(args.target, console)
    dev = device_for(target, "demo")
    gpu = "gpu" in target.keys
    dtype = args.dtype if args.dtype != "auto" else ("float16" if gpu else "float32")
    with console.phase(f"building the {args.model} model ({args.size}, {dtype})"):
        mod = build_model(args.model, args.size, dtype=dtype)
        inputs = random_inputs(mod, args.seed)
    with console.phase("planning (VirtualTensorize)"):
        vtc_mod = VirtualTensorize(target=target, memory_guard=True)(mod)
    with console.phase("counting kernels and planned memory"):
        census = {"stock": kernel_census(mod, target), "vtc": kernel_census(vtc_mod, target, stores=True)}
    pipelines = {"stock": (mod, relax.get_default_pipeline(target)), "vtc": (vtc_mod, store_side_pipeline(target))}
    rows, outputs = {}, {}
    for name, (m, pipeline) in pipelines.items():
        with console.phase(f"building {name} ({target.kind.name})"):
            ex = tvm.compile(m, target=target, relax_pipeline=pipeline)
        with console.phase(f"running and timing {name} ({args.repeat} runs)"):
            outputs[name] = run_vm(ex, dev, inputs)
            ms = time_vm(ex, dev, inputs, args.repeat)
        c = census[name]
        rows[name] = {"kernels": c["kernels"], "data_movement": c["data_movement"],
                      "planned_bytes": c["planned_bytes"], "ms": ms}
    why = mismatch(outputs["stock"], outputs["vtc"])
    out.update(model=args.model, size=args.size, dtype=dtype, target=target.kind.name, variants=rows,
               agree=why is None, mismatch=why)
    lines = [f"{args.model} ({args.size}, {dtype}) on {target.kind.name}",
             f"{'':8}{'kernels':>9}{'data-mv':>9}{'mem MiB':>10}{'ms':>10}"]
    for name, r in rows.items():
        mib = "n/a" if r["planned_bytes"] is None else f"{r['planned_bytes'] / 2**20:.3f}"
        lines.append(f"{name:8}{r['kernels']:>9}{r['data_movement']:>9}{mib:>10}{r['ms']:>10.3f}")
    if why:
        _say(args, lines)
        console.error(f"MISMATCH: vtc disagrees with stock TVM: {why}")
        return ExitCode.MISMATCH
    _say(args, lines + ["outputs agree"])
    return ExitCode.OK


def main(argv=None) -> int:
    from .cli import main as cli_main

    return cli_main(["demo", *(sys.argv[1:] if argv is None else argv)], prog="python -m vtc_tvm")


if __name__ == "__main__":
    sys.exit(main())
