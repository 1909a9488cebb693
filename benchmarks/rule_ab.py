"""Each of our schedule rules against the schedule it displaces, in one GPU run (the decision data).

    python -m benchmarks.rule_ab [--workloads yolo_c3k2 shufflenet_unit ...] [--batch 1 16]
                                 [--variants default no_fitted_tc ...] [--repeat 20] [--out DIR] [--dry]

Each workload (paper components and whole models, real size, fp16) goes through the ``"vtc"``
pipeline once per variant of the rule list, the load side shared (the same plan; only the
schedules differ):

* ``default``: :func:`vtc_tvm.schedules.default_rules`
* ``no_<rule>``: without one of our rules (its kernels fall to the next rule, in the end DLight's);
  skipped where the rule takes no kernel of the workload in ``default``'s build
* ``tc_narrow``: :class:`~vtc_tvm.schedules.FittedTensorCoreGEMM` before ``NarrowGEMM`` and down
  to 1 output channel (tensor cores with J padded to 16 against the fitted SIMT tile)
* ``dlight``: DLight's rules alone (the ``vtc_dlight`` column of ``benchmarks.schedules_h200``)

On a GPU every variant is timed in turn (``benchmarks.timing.time_interleaved``, activations
rotated), its output compared with ``default``'s (relative L2), and each kernel timed with CUPTI
(torch.profiler); ``--dry`` (no GPU) builds the variants only. Writes ``DIR/rule_ab.json`` and
prints a table last: a rule stays in the default list where its variant is not slower.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib

import tvm
from tvm import relax

import vtc_tvm
from vtc_tvm import schedules as S
from vtc_tvm.pipeline import cuda_target, store_side_pipeline
from vtc_tvm.schedules.recording import Recording

RULES = {"no_window": S.WindowReduction, "no_decode_attention": S.DecodeAttention,
         "no_tensor_core_gemm": S.TensorCoreGEMM, "no_low_batch_gemm": S.LowBatchGEMM,
         "no_narrow": S.NarrowGEMM, "no_fitted_tc": S.FittedTensorCoreGEMM}
VARIANTS = ("default", *RULES, "tc_narrow", "dlight")
WORKLOADS = ("yolo_c3k2", "shufflenet_unit", "effvit_attn", "llama_decode", "yolo11n")


def rules(variant: str, target) -> list:
    """The rule list of ``variant`` (see the module docstring)."""
    default = S.default_rules(target)
    if variant == "default":
        return default
    if variant == "dlight":
        return S.stock_rules(target)
    if variant == "tc_narrow":
        rest = [r for r in default if not isinstance(S.unguarded(r), S.FittedTensorCoreGEMM)]
        at = next(i for i, r in enumerate(rest) if isinstance(S.unguarded(r), S.NarrowGEMM))
        return rest[:at] + [S.Guarded(S.FittedTensorCoreGEMM(min_cols=0))] + rest[at:]
    return [r for r in default if not isinstance(S.unguarded(r), RULES[variant])]


def _workload(name):
    from benchmarks.whole_models import WHOLE_WORKLOADS
    from benchmarks.workloads import WORKLOADS as COMPONENTS

    return COMPONENTS[name] if name in COMPONENTS else WHOLE_WORKLOADS[name]


def run_case(name: str, batch: int, variants, args, target, dev, torch) -> dict:
    from benchmarks.run import _flat, gpu_kernel_us, rel_l2
    from benchmarks.timing import rotation, time_interleaved
    from benchmarks.workloads import is_weight

    wl = _workload(name)
    cfg = wl.config(args.size, batch, "float16")
    mod = wl.build(cfg)
    row = {"workload": name, "batch": batch, "variants": {}}
    with target:
        planned = vtc_tvm.VirtualTensorize(target=target, memory_guard=True, inplace=getattr(wl, "inplace", ()))(mod)
    exes, took = {}, set()
    record = lambda rule, func, sch: took.add(type(S.unguarded(rule)))  # noqa: E731 - the rules default's build used
    for v in sorted(variants, key=lambda v: v != "default"):  # default first: it says which rules apply
        if v in RULES and RULES[v] not in took or v == "tc_narrow" and S.NarrowGEMM not in took:
            row["variants"][v] = {"skipped": "the rule takes no kernel here"}
            continue
        t0 = time.time()
        try:
            listed = rules(v, target)
            if v == "default":
                listed = [Recording(r, record) for r in listed]
            pipeline = store_side_pipeline(target, schedules=listed)
            exes[v] = tvm.compile(planned, target=target, relax_pipeline=pipeline)
            row["variants"][v] = {"compile_s": round(time.time() - t0, 2)}
        except Exception as err:  # noqa: BLE001 - a variant that does not build is a result
            row["variants"][v] = {"error": f"{type(err).__name__}: {str(err).strip().splitlines()[-1:]}"}
    if args.dry or not exes:
        return row
    inputs = wl.inputs(mod, cfg, zlib.crc32(f"{name}/{batch}/{time.time_ns()}".encode()))
    sets = rotation(inputs, lambda a: tvm.runtime.tensor(a, dev), device=dev,
                    shared=[is_weight(p.name) for p in mod["main"].params])
    vms = {v: relax.VirtualMachine(ex, dev) for v, ex in exes.items()}
    ref = _flat(vms["default"]["main"](*sets[0])) if "default" in vms else None
    timings = time_interleaved({v: (vm["main"], sets) for v, vm in vms.items()}, device=dev, repeat=args.repeat)
    for v, vm in vms.items():
        entry = row["variants"][v]
        entry["ms"] = timings[v].median_ms
        entry["iqr_ms"] = timings[v].as_dict().get("iqr_ms")
        if ref is not None:
            entry["rel_l2_vs_default"] = rel_l2(_flat(vm["main"](*sets[0])), ref)
        if torch is not None:
            per = gpu_kernel_us(vm["main"], sets, torch)
            entry["kernel_us"] = {k: round(us, 2) for k, us in sorted(per.items(), key=lambda kv: -kv[1])}
    return row


def table(rows) -> str:
    lines = ["| workload | batch | variant | ms | vs default | rel L2 vs default |", "|---|---|---|---|---|---|"]
    for row in rows:
        base = row["variants"].get("default", {}).get("ms")
        for v, e in row["variants"].items():
            ms = e.get("ms")
            ratio = f"{ms / base:.2f}x" if ms and base else "-"
            err = e.get("rel_l2_vs_default")
            lines.append(f"| {row['workload']} | {row['batch']} | {v} | "
                         f"{f'{ms:.3f}' if ms else e.get('error', e.get('skipped', 'built'))} | {ratio} | "
                         f"{f'{err:.1e}' if err is not None else '-'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 16])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--size", choices=("real", "small"), default="real")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--dry", action="store_true", help="build only (no GPU)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="skip the cases left after this many seconds")
    args = ap.parse_args(argv)
    target = cuda_target()
    dev = None if args.dry else tvm.cuda(0)
    torch = None
    if not args.dry:
        from benchmarks.run import _torch

        torch = _torch()
    start, rows = time.time(), []
    for name in args.workloads:
        for batch in args.batch:
            if time.time() - start > args.budget_s:
                rows.append({"workload": name, "batch": batch, "skipped": "budget", "variants": {}})
                continue
            rows.append(run_case(name, batch, args.variants, args, target, dev, torch))
            print(table(rows[-1:]), flush=True)
    from benchmarks.run import _commit

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "rule_ab.json"), "w") as f:
        json.dump({"commit": _commit(), "argv": sys.argv[1:] if argv is None else list(argv), "rows": rows}, f,
                  indent=1)
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
