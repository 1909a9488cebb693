"""Check the torch peers' timing: the Llama-3-8B decode layer twin timed by
:func:`benchmarks.timing.time_callable` (what ``benchmarks.run`` reports) and by
``triton.testing.do_bench`` (when triton is importable), in one run, side by side.

    python -m benchmarks.peer_check [--batch 1 16] [--modes eager compile cudagraphs max-autotune]
                                    [--repeat 100] [--out FILE.json]

An independent PyTorch twin of this layer, timed with do_bench on the H200, gave torch.compile
0.386 ms (b1) and 0.870 ms (b16), eager 0.793 / 2.100 ms (printed as ``reference``): the two
columns here should agree with each other and with those. The differences to expect: do_bench
flushes the L2 before every call and times each call alone (events around one call), ours rotates
the activations and times ``number`` calls back to back; weights (436 MiB, far above the L2) are
cold for both.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

REFERENCE_MS = {("compile", 1): 0.386, ("compile", 16): 0.870, ("eager", 1): 0.793, ("eager", 16): 2.100}
MODES = {"eager": None, "compile": {}, "max-autotune": {"mode": "max-autotune"},
         "cudagraphs": {"mode": "reduce-overhead"}}


def twin(batch: int):
    """The torch twin of ``llama_decode`` (real size, fp16, cache 4096) on the GPU, its activation
    sets for the rotation, and the TVM-side input count (for the record)."""
    import torch  # noqa: F401

    from .timing import cache_bytes, copies_for
    from .workloads import WORKLOADS, is_weight, load_torch, torch_module

    wl = WORKLOADS["llama_decode"]
    cfg = wl.config("real", batch, "float16")
    mod = wl.build(cfg)
    inputs = wl.inputs(mod, cfg, seed=batch)
    module, acts = load_torch(torch_module(wl, cfg), mod, inputs, device="cuda")
    module.eval()
    act_bytes = sum(a.nbytes for p, a in zip(mod["main"].params, inputs) if not is_weight(p.name))
    sets = [acts] + [[a.clone() for a in acts] for _ in range(copies_for(act_bytes, cache_bytes("cuda")) - 1)]
    return module, sets


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--modes", nargs="+", choices=sorted(MODES), default=["eager", "compile"])
    ap.add_argument("--repeat", type=int, default=100, help="time_callable measurements")
    ap.add_argument("--out", default=None, help="also write the rows as JSON")
    args = ap.parse_args(argv)

    try:
        import torch
    except ImportError:
        sys.exit("peer_check needs PyTorch (and a CUDA GPU)")
    if not torch.cuda.is_available():
        sys.exit("peer_check needs a CUDA GPU")
    from .timing import time_callable

    try:
        from triton.testing import do_bench
    except ImportError:
        do_bench = None
        print("triton not importable: do_bench column left out", flush=True)
    rows = []
    for batch in args.batch:
        module, sets = twin(batch)
        with torch.no_grad():
            for mode in args.modes:
                row = {"batch": batch, "mode": mode, "reference_do_bench_ms": REFERENCE_MS.get((mode, batch))}
                try:
                    fn = module
                    if MODES[mode] is not None:
                        torch._dynamo.reset()
                        t0 = time.time()
                        fn = torch.compile(module, **MODES[mode])
                        fn(*sets[0])
                        torch.cuda.synchronize()
                        row["compile_s"] = round(time.time() - t0, 1)
                    timing = time_callable(fn, sets, device="cuda", repeat=args.repeat)
                    row["time_callable_ms"] = timing.median_ms
                    row["time_callable"] = timing.as_dict()
                    if do_bench is not None:
                        acts = sets[0]
                        row["do_bench_ms"] = float(do_bench(lambda: fn(*acts), warmup=25, rep=200,
                                                            return_mode="median"))
                except Exception as err:  # noqa: BLE001 - a failing mode is a result
                    row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
                rows.append(row)
                print(json.dumps(row), flush=True)
        del module, sets
        torch._dynamo.reset()
        torch.cuda.empty_cache()

    print(f"\nLlama-3-8B decode layer twin on {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print("| batch | mode | time_callable ms | do_bench ms | ratio | reference (do_bench, independent twin) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        ours, theirs = r.get("time_callable_ms"), r.get("do_bench_ms")
        ratio = f"{ours / theirs:.2f}" if ours and theirs else "-"
        cells = [f"{v:.3f}" if isinstance(v, float) else "-" for v in (ours, theirs, r["reference_do_bench_ms"])]
        print(f"| {r['batch']} | {r['mode']} | {cells[0]} | {cells[1]} | {ratio} | {cells[2]} |"
              + (f" {r['error'][:80]}" if r.get("error") else ""))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 1 if any(r.get("error") for r in rows) or not all(np.isfinite(r.get("time_callable_ms", np.nan))
                                                                for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
