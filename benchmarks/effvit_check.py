"""Which part of the vtc pipeline changes EfficientViT attention's numerics on a GPU?

Builds each named case of benchmarks.run (default: the EfficientViT-B1 attention block; real
size, batch 1, fp16) as stock TVM, stock + our schedules, and the vtc pipeline with DLight's
rules alone / with our schedules, runs all on the same inputs and prints each one's relative L2
error against stock. Usage: ``python3 benchmarks/effvit_check.py [CASE ...]``.
"""
import sys

import numpy as np
import tvm
from tvm import relax

from benchmarks.run import CASES
from vtc_tvm.pipeline import cuda_target, vtc_pipeline

target = cuda_target()
dev = tvm.cuda(0) if tvm.cuda(0).exist else None
for name in sys.argv[1:] or ["effvit_attn"]:
    batch = 1
    wl = CASES[name]
    cfg = wl.config("real", batch, "float16")
    mod = wl.build(cfg)
    inputs = wl.inputs(mod, cfg, seed=0)
    variants = {
        "stock": relax.get_default_pipeline(target),
        "stock_sched": relax.get_pipeline("stock_vtc_schedules", target=target),
        "vtc_dlight": vtc_pipeline(target, schedules="dlight"),
        "vtc_ours": vtc_pipeline(target, schedules="vtc"),
    }
    outs = {}
    for variant, pipe in variants.items():
        ex = tvm.compile(mod, target, relax_pipeline=pipe)
        if dev is None:
            print(variant, "built")
            continue
        vm = relax.VirtualMachine(ex, dev)
        out = vm["main"](*[tvm.runtime.tensor(a, dev) for a in inputs])
        outs[variant] = out.numpy().astype("float64")
    if dev is not None:
        ref = outs["stock"]
        for variant, o in outs.items():
            err = np.linalg.norm(o - ref) / np.linalg.norm(ref)
            print(f"{name} b{batch} {variant}: rel L2 vs stock {err:.2e}", flush=True)
