"""Decode layers with and without :mod:`vtc_tvm.schedules` (issue 13, item 1), for the H200.

Builds each decode layer four ways and, per batch, checks numerics against float64 and times it:

* ``stock_dlight``  stock TVM's default pipeline (DLight rules)
* ``stock_ours``    the ``stock_vtc_schedules`` pipeline: stock + our rules before DLight's
* ``vtc_ours``      vtc-tvm with ``schedules="vtc"``
* ``vtc_dlight``    vtc-tvm with DLight's rules
* ``vtc_ms``        vtc-tvm through the ``"vtc_tuning"`` pipeline: MetaSchedule tunes every kernel
  (``--ms-trials`` a task, ``--ms-budget-s`` in all; the untuned schedule of each task, ours or
  DLight's, is measured too and a record applies only where it is faster), the rest falls to our
  rules and DLight (opt-in: ``--variants ... vtc_ms``)

Workloads with updatable caches (``*_static``) get the workload's ``inplace=`` in the vtc builds.

Run on the device (real sizes, fp16)::

    source .devbundle/install.sh && python benchmarks/schedules_h200.py --batch 1 16

and as a dry run anywhere (llvm, small sizes, float32): ``--target llvm --size small``. Writes
``$OUT/schedules_h200.json`` (``--out``) and prints a table last. Latency: ``time_evaluator``
medians (number >= 20, repeat >= 10); per-kernel GPU time: torch.profiler (CUPTI) when torch is
importable; the float64 reference is the workload's torch twin in float64 on the same inputs
(or, without torch, the Relax workload itself in float64 on llvm). ``--budget-s`` skips the
cases left once that many seconds are spent (recorded as skipped).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
import time
import traceback
import zlib

import numpy as np
import tvm
from tvm import relax

if __package__ in (None, ""):  # run as a script: benchmarks/ is a package of the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import vtc_tvm  # noqa: F401,E402  (registers the pipelines)
from vtc_tvm.pipeline import cuda_target, stock_vtc_schedules_pipeline, vtc_pipeline  # noqa: E402

from benchmarks.run import _flat, fp64_reference, gpu_kernel_us, rel_l2  # noqa: E402
from benchmarks.workloads import WORKLOADS  # noqa: E402

VARIANTS = ("stock_dlight", "stock_ours", "vtc_ours", "vtc_dlight")
OPT_IN = ("vtc_ms",)
TOLERANCE = {"float16": 1e-2, "float32": 1e-4}
# Reading the weights and the KV cache once at the H200's HBM bandwidth.
HBM_BYTES_PER_S = 4.3e12


def pipeline(variant: str, target, inplace=(), args=None, stats=None):
    if variant == "vtc_ms":
        from vtc_tvm import tuning

        return tuning.tuning_pipeline(target, work_dir=args.ms_dir, max_trials_per_task=args.ms_trials,
                                      max_seconds=args.ms_budget_s, progress=False, stats=stats,
                                      inplace=tuple(inplace))
    if variant == "stock_dlight":
        return relax.get_default_pipeline(target)
    if variant == "stock_ours":
        return stock_vtc_schedules_pipeline(target)
    return vtc_pipeline(target, schedules="vtc" if variant == "vtc_ours" else "dlight", inplace=tuple(inplace))


def _torch():
    try:
        import torch

        return torch if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - no torch: numerics and timing without it
        return None


def reference_fp64(wl, size, batch, mod, inputs, torch):
    """Float64 outputs for ``inputs``: the torch twin on the GPU, else the Relax workload in
    float64 on llvm (stock build pipeline)."""
    if torch is not None:
        return fp64_reference(wl, wl.config(size, batch, "float16"), mod, inputs, torch), "torch twin, float64"
    mod64 = wl.build(wl.config(size, batch, "float64"))
    ex = tvm.compile(mod64, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [tvm.runtime.tensor(a.astype(np.float64) if a.dtype.kind == "f" else a) for a in inputs]
    return _flat(vm["main"](*args)), "relax workload, float64, llvm"


def hbm_floor_ms(inputs) -> float:
    """Milliseconds to read every input once (weights + KV cache dominate) at HBM bandwidth."""
    return sum(a.nbytes for a in inputs) / HBM_BYTES_PER_S * 1e3


def run_case(name, batch, args, target, dev, torch, deadline):
    wl = WORKLOADS[name]
    gpu = target.kind.name == "cuda"
    dtype = "float16" if gpu else "float32"
    cfg = wl.config(args.size, batch, dtype)
    mod = wl.build(cfg)
    seed = zlib.crc32(f"{name}/{batch}/{time.time_ns()}".encode())
    inputs = wl.inputs(mod, cfg, seed)
    row = {"workload": name, "batch": batch, "size": args.size, "dtype": dtype, "seed": seed,
           "hbm_floor_ms": hbm_floor_ms(inputs), "variants": {}}
    ref, row["reference"] = reference_fp64(wl, args.size, batch, mod, inputs, torch)
    dev_args = [tvm.runtime.tensor(a, dev) for a in inputs]
    for variant in args.variants:
        res = row["variants"].setdefault(variant, {})
        if time.time() > deadline:
            res["skipped"] = "time budget spent"
            continue
        try:
            t0 = time.time()
            ex = tvm.compile(mod, target=target, relax_pipeline=pipeline(variant, target, getattr(wl, "inplace", ()), args,
                                                                        res.setdefault("metaschedule", {})))
            if not res["metaschedule"]:
                del res["metaschedule"]
            res["compile_s"] = round(time.time() - t0, 2)
            vm = relax.VirtualMachine(ex, dev)
            out = _flat(vm["main"](*dev_args))
            res["rel_err_fp64"] = rel_l2(out, ref)
            res["numerics_ok"] = bool(res["rel_err_fp64"] < TOLERANCE[dtype])
            te = vm.time_evaluator("main", dev, number=args.number, repeat=args.repeat)(*dev_args)
            res["ms"] = float(np.median(te.results)) * 1e3
            res["hbm_fraction"] = row["hbm_floor_ms"] / res["ms"] if res["ms"] else None
            if gpu and torch is not None:
                per = gpu_kernel_us(vm["main"], [dev_args], torch)
                res["gpu_us"] = sum(per.values())
                res["kernel_us"] = {k: round(us, 2) for k, us in sorted(per.items(), key=lambda kv: -kv[1])}
            del vm, ex
        except Exception as err:  # noqa: BLE001 - one failing variant is reported, not fatal
            traceback.print_exc()
            res["error"] = f"{type(err).__name__}: {str(err)[-400:]}"
        print(f"  {name} b{batch} {variant}: {json.dumps({k: v for k, v in res.items() if k != 'kernel_us'})}",
              flush=True)
    return row


# -- kernel sweep: evidence for the rules' default tilings -------------------------------------
SWEEP_SPLITS = (1, 2, 4, 8, 16)
SWEEP_TN = (2, 4)  # warps along the columns when the lanes run along the reduction


def fused_kernels(name, size, batch, target, dtype):
    """The decode layer's PrimFuncs as the vtc pipeline hands them to the scheduler."""
    from vtc_tvm.pipeline import _backend
    from vtc_tvm.stores import VirtualTensorizeStores
    from vtc_tvm.transform import VirtualTensorize

    wl = WORKLOADS[name]
    mod = wl.build(wl.config(size, batch, dtype))
    passes = [p for p in _backend(target).legalize_passes(target) if p.info.name != "ApplyDefaultSchedule"]
    passes.insert(next(i for i, p in enumerate(passes) if p.info.name == "FuseTIR") + 1, VirtualTensorizeStores(target))
    with target:
        mod = tvm.transform.Sequential(passes)(VirtualTensorize(target=target, memory_guard=True)(mod))
    return {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}


def _time_kernel(func, target, dev, number, repeat):
    """(median us, bytes of the arguments, the outputs of one call) of ``func`` alone on random
    inputs of seed 0 (the same for every candidate of a kernel, so their outputs compare)."""
    ex = tvm.compile(tvm.IRModule({"k": func.with_attr("global_symbol", "k")}), target=target)
    lib = ex.jit() if hasattr(ex, "jit") else ex
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.uniform(-1, 1, [int(x) for x in p.shape]).astype(str(p.dtype)), dev)
            for p in func.params]
    lib["k"](*args)
    out = args[-1].numpy().astype(np.float64)  # the written buffer (an in-place destination too)
    te = lib.time_evaluator("k", dev, number=number, repeat=repeat)(*args)
    return float(np.median(te.results)) * 1e6, sum(a.numpy().nbytes for a in args), out


SHARED_TAIL_BYTES = 48 * 1024  # static shared memory a block may use without opting in


def _shared_tail_and_vector_tilings(form):
    """Lanes on the columns with the warps' partials summed through shared memory (``cols_sh``:
    vec columns and kin reduction terms a lane a step, tk warps along the reduction), and q K^T
    with 16-byte loads along the reduction (``red_vk``)."""
    from vtc_tvm.schedules import batched_gemv as G

    out = {}
    if form.inner == "cols" and form.aligned:
        for vec in (4, 8):
            for tk in (2, 4):
                if tk * form.M * 32 * vec * 4 > SHARED_TAIL_BYTES or form.M * vec > 128 or form.N % vec:
                    continue
                for kin in (1, 2, 4):
                    for split in (1, 2, 4, 8, 16, 32):
                        warps = form.B * -(-form.N // (32 * vec)) * tk * split
                        if (not 512 <= warps <= 16384 or form.K // (tk * kin * split) < 8
                                or form.B > 1 and split > 4):
                            continue
                        out[f"cols_sh_v{vec}_tk{tk}_kin{kin}_split{split}"] = G.Tiling(
                            32, tk, vec, split, "cols", kin=kin, tail="shared")
    elif form.inner == "red":
        kin = 8  # 16 bytes of fp16
        for tk in (8, 16):
            if form.K % (tk * kin):
                continue
            for vec in (2, 4, 8):
                for tn in (2, 4, 8):
                    out[f"red_vk_tk{tk}_v{vec}_tn{tn}"] = G.Tiling(tn, tk, vec, 1, "red", kin=kin)
    return out


def _tensor_core_tilings(form, target):
    """``{label: TCTiling}``: the planned WMMA tiling (``tc_planned``) and its neighbours (``tc_w*``)
    for the kernels :class:`vtc_tvm.schedules.TensorCoreGEMM` takes."""
    from vtc_tvm.schedules import tensor_core_gemm as TC

    planned = TC.plan(form, target) if TC.applicable(form) else None
    if planned is None:
        return {}
    out = {"tc_planned": planned}
    for warps, jt in ((4, 2), (8, 1), (4, 1), (2, 2)):
        for kt, split in ((4, planned.split), (8, planned.split), (4, max(2, planned.split // 2)),
                          (4, planned.split * 2)):
            t = TC.TCTiling(warps, jt, kt, split)
            if t != planned and TC.fits(form, t):
                out[f"tc_w{warps}_j{jt}_k{kt}_s{split}"] = t
    return out


def sweep_candidates(batch, size, target, rules=None):
    """``{kernel: (info, {label: make scheduled PrimFunc})}`` for every kernel of the vtc decode
    layer that our rules take: DLight's schedule, the planned tiling and alternatives."""
    from tvm.s_tir import dlight as dl

    import vtc_tvm.schedules as S
    from vtc_tvm.schedules import batched_gemv as G
    from vtc_tvm.schedules import tensor_core_gemm as TC

    rules = rules or S.our_rules(target)
    found = {}
    for kname, func in fused_kernels("llama_decode", size, batch, target, "float16").items():
        with target:
            rule = next((r for r in rules if r.apply(func, target, False) is not None), None)
        if rule is None:
            continue
        _, form, _ = G.prepare(func)
        planned = G.plan(form, target)
        info = {"rule": type(rule).__name__, "B": form.B, "M": form.M, "N": form.N, "K": form.K,
                "inner": form.inner, "planned": str(planned)}
        tilings = {"planned": planned}
        for split in SWEEP_SPLITS:
            for tn in SWEEP_TN:  # lanes along the reduction, tn warps along the columns
                tilings[f"red_tn{tn}_split{split}"] = G.Tiling(tn, min(32, form.K), planned.vec, split, "red")
            if form.inner == "cols":  # lanes along the columns, 8 warps along the reduction
                tilings[f"cols_split{split}"] = G.Tiling(min(32, -(-form.N // planned.vec)), min(8, form.K),
                                                         planned.vec, split, "cols")
        tilings.update(_shared_tail_and_vector_tilings(form))
        tilings = {k: t for k, t in tilings.items() if k == "planned" or t != planned}

        def dlight(func=func):
            with target:
                return dl.ApplyDefaultSchedule(*S.stock_rules(target))(tvm.IRModule({"main": func}))["main"]

        def widened_dlight(func=func):
            # float32 accumulation (as our rules), then DLight's own schedule of the result
            with target:
                return dl.ApplyDefaultSchedule(*S.stock_rules(target))(
                    tvm.IRModule({"main": G.prepare(func)[0].mod["main"]}))["main"]

        makes = {"dlight": dlight, "widened_dlight": widened_dlight}
        for label, tiling in tilings.items():
            makes[label] = lambda func=func, tiling=tiling: G.schedule(*G.prepare(func), tiling).mod["main"]
        tc_tilings = _tensor_core_tilings(form, target)
        if tc_tilings:
            info["tc_planned"] = str(tc_tilings["tc_planned"])
        for label, tiling in tc_tilings.items():
            makes[label] = lambda func=func, tiling=tiling: TC.schedule(*G.prepare(func), tiling).mod["main"]
        found[kname] = (info, makes)
    return found


def sweep(batch, args, target, dev, deadline):
    """Each candidate of :func:`sweep_candidates` timed alone (microseconds, GB/s of its
    inputs and outputs)."""
    out = {}
    shapes = set()
    for kname, (info, makes) in sweep_candidates(batch, args.size, target).items():
        if time.time() > deadline:
            out["skipped"] = "time budget spent"
            break
        shape = tuple(info[k] for k in ("B", "M", "N", "K", "inner"))
        if args.sweep_unique and shape in shapes:
            out[kname] = dict(info, same_shape_as_swept=True)
            continue
        shapes.add(shape)
        row = out.setdefault(kname, dict(info))
        reference = None  # DLight's output (first label): every candidate is checked against it
        for label, make in makes.items():
            if (args.sweep_labels and label != "dlight"
                    and not any(fnmatch.fnmatchcase(label, pat) for pat in args.sweep_labels)):
                continue
            if time.time() > deadline:
                row["skipped"] = "time budget spent"
                break
            try:
                with target:
                    us, nbytes, result = _time_kernel(make(), target, dev, args.number * 2, args.repeat)
                row[label] = {"us": round(us, 2), "GBps": round(nbytes / us / 1e3, 1)}
                if reference is None:
                    reference = result
                else:
                    row[label]["rel_err_vs_dlight"] = float(rel_l2(result, reference))
            except Exception as err:  # noqa: BLE001 - recorded
                row[label] = {"error": f"{type(err).__name__}: {str(err)[-200:]}"}
        timed = [(v["us"], k) for k, v in row.items() if isinstance(v, dict) and "us" in v]
        if timed:
            row["best"] = min(timed)[1]
        print(f"  sweep b{batch} {kname} {info['planned']}: "
              + ", ".join(f"{k} {v.get('us', v.get('error'))}" for k, v in row.items() if isinstance(v, dict))
              + f"; best {row.get('best')}", flush=True)
    return out


def table(rows) -> str:
    shown = [v for v in VARIANTS + OPT_IN if any(v in r["variants"] for r in rows)]
    head = f"{'workload':<15}{'b':>3} {'floor ms':>9}" + "".join(f"{v:>22}" for v in shown)
    lines = [head, "  (each variant: median ms / rel. err vs float64)"]
    for r in rows:
        cells = []
        for v in shown:
            res = r["variants"].get(v, {})
            if "ms" in res:
                cells.append(f"{res['ms']:>9.3f} / {res['rel_err_fp64']:.1e}")
            else:
                cells.append(("skipped" if "skipped" in res else "error" if "error" in res else "-").rjust(20))
        lines.append(f"{r['workload']:<15}{r['batch']:>3} {r['hbm_floor_ms']:>9.3f}" + "".join(f"{c:>22}" for c in cells))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--target", choices=["cuda", "llvm"], default="cuda")
    ap.add_argument("--size", choices=["real", "small"], default="real")
    ap.add_argument("--workloads", nargs="+", default=["llama_decode", "gemma2_decode"])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS + OPT_IN)
    ap.add_argument("--ms-trials", type=int, default=16, help="vtc_ms: MetaSchedule trials a task")
    ap.add_argument("--ms-budget-s", type=float, default=300.0, help="vtc_ms: tuning seconds in all")
    ap.add_argument("--ms-dir", default=None, help="vtc_ms: the database folder (default: OUT/ms_db)")
    ap.add_argument("--number", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=450.0)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--no-sweep", action="store_true", help="skip the per-kernel tiling sweep (cuda only)")
    ap.add_argument("--sweep-batch", type=int, nargs="+", help="batches to sweep (default: --batch)")
    ap.add_argument("--sweep-labels", nargs="+",
                    help="candidates to time, e.g. dlight widened_dlight planned 'cols_sh_*' (globs; default: all)")
    ap.add_argument("--sweep-unique", action="store_true",
                    help="sweep one kernel of each shape (B, M, N, K, layout): the fused twins are skipped")
    args = ap.parse_args(argv)
    args.ms_dir = args.ms_dir or os.path.join(args.out, "ms_db")

    target = cuda_target() if args.target == "cuda" else tvm.target.Target("llvm")
    dev = tvm.cuda(0) if args.target == "cuda" else tvm.cpu()
    torch = _torch() if args.target == "cuda" else None
    deadline = time.time() + args.budget_s
    result = {"target": str(target.kind.name), "arch": str(target.attrs.get("arch", "")),
              "device": torch.cuda.get_device_name(0) if torch is not None else str(dev),
              "tvm": tvm.__version__, "timing": f"time_evaluator number={args.number} repeat={args.repeat}, median",
              "command": " ".join(["python", "benchmarks/schedules_h200.py"] + (argv if argv is not None else sys.argv[1:])),
              "rows": [], "kernel_sweep": {}}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "schedules_h200.json")

    def save():  # after every step: a run stopped at the device's time limit keeps what it did
        with open(path, "w") as f:
            json.dump(result, f, indent=1)

    if args.target == "cuda" and not args.no_sweep:
        for batch in args.sweep_batch or args.batch:
            result["kernel_sweep"][str(batch)] = sweep(batch, args, target, dev, deadline)
            save()
    rows = result["rows"]
    for name in args.workloads:
        for batch in args.batch:
            rows.append(run_case(name, batch, args, target, dev, torch, deadline))
            save()
    save()
    print(f"wrote {path}")
    print(table(rows))
    return result


if __name__ == "__main__":
    main()
