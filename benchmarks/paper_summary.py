"""Issue 13's paper-suite criteria, computed from ``benchmarks.run`` JSON files (not by hand).

    python -m benchmarks.paper_summary RUN.json [RUN.json ...] [--json]

Rows are (workload, batch) cases; a later file's row replaces an earlier one's, so a run of a few
cases can be laid over a full run (the output names the file each row came from: a mixed set
is visible as such). Reported: the geomean of the speed-up over stock over all rows and over
the *component* rows, the smallest speed-up, and on how many component rows vtc-tvm is faster
than torch's best mode timed in the same run (``torch_best_ms``: the best of the modes that
row ran, listed with it). The component rows are the paper's component workloads: the Llama-3
and Gemma-2 decode layers, Llama-3 prefill, EfficientViT attention and YOLO C3K2, at each batch
(10 rows at batch 1 and 16); ShuffleNet (unit and whole) rows count in the overall geomean only.
Rows of the whole suite (``--suite whole``: ShuffleNetV2, EfficientViT-B1, YOLO11n from ONNX)
have a bar of their own: vtc at least as fast as stock on all six (model x batch) rows
(``whole_met``); they stay out of the paper suite's numbers.

Issue 13's bar: geomean >= 1.5x with no row below 1.0x, and ahead of torch on at least 6 of the
10 component rows. ``met`` says whether these rows reach it; a row without a torch time, or an
error, does not count as ahead, and fewer than 10 component rows cannot meet it.

Where a row has the middle column (``stock_sched_ms``: stock TVM with our schedule rules, no
virtual tensors), the speed-up splits into the schedules' part (stock / stock + schedules) and
the virtual tensors' part (stock + schedules / vtc), each with its geomean and smallest value:
the bar is on the product, the split says where the gain comes from.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

COMPONENTS = ("llama_decode", "gemma2_decode", "llama_prefill", "effvit_attn", "yolo_c3k2")
BAR = {"geomean": 1.5, "min_speedup": 1.0, "ahead_of_torch": 6, "component_rows": 10}
WHOLE = ("shufflenet_v2_whole", "efficientvit_b1", "yolo11n")  # the whole suite's models
WHOLE_ROWS = 6  # three models at batch 1 and 16, each with vtc >= stock


def rows_of(paths) -> dict:
    """{(workload, batch): row} over ``paths`` in order (later files win), each row tagged with
    the file it came from."""
    rows = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for case in data.get("cases", []):
            rows[(case["workload"], case["batch"])] = dict(case, source=path)
    return rows


def _geomean(values) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summary(rows: dict) -> dict:
    table, speedups, component_speedups, ahead = [], [], [], 0
    order = lambda key: (COMPONENTS.index(key[0]) if key[0] in COMPONENTS else len(COMPONENTS), key)  # noqa: E731
    whole = []
    for (name, batch), r in sorted(rows.items(), key=lambda kv: order(kv[0])):
        ok = not r.get("error") and r.get("stock_ms") and r.get("vtc_ms")
        speedup = r["stock_ms"] / r["vtc_ms"] if ok else None
        component = name in COMPONENTS
        torch_ms = r.get("torch_best_ms")
        is_ahead = bool(ok and torch_ms and r["vtc_ms"] < torch_ms)
        if name in WHOLE:
            whole.append(speedup)
        elif speedup is not None:
            speedups.append(speedup)
            if component:
                component_speedups.append(speedup)
        ahead += int(component and is_ahead)
        sched_ms = r.get("stock_sched_ms") if ok else None
        table.append({"case": f"{name}/b{batch}", "component": component, "whole": name in WHOLE,
                      "stock_ms": r.get("stock_ms"),
                      "vtc_ms": r.get("vtc_ms"), "speedup": speedup,
                      "schedule_gain": r["stock_ms"] / sched_ms if sched_ms else None,
                      "virtual_gain": sched_ms / r["vtc_ms"] if sched_ms else None, "torch_best_ms": torch_ms,
                      "torch_best_mode": r.get("torch_best_mode"),
                      "torch_modes": sorted(k[len("torch_"):-len("_ms")] for k in r
                                            if k.startswith("torch_") and k.endswith("_ms")
                                            and k not in ("torch_best_ms",) and r[k] is not None),
                      "ahead_of_torch": is_ahead, "numerics_ok": r.get("numerics_ok"),
                      "error": r.get("error"), "source": r["source"]})
    result = {"rows": table, "geomean": _geomean(speedups), "component_geomean": _geomean(component_speedups),
              "min_speedup": min(speedups) if speedups else None,
              "component_rows": sum(1 for t in table if t["component"]), "ahead_of_torch": ahead,
              "sources": sorted({t["source"] for t in table})}
    for part in ("schedule_gain", "virtual_gain"):
        values = [t[part] for t in table if t[part] is not None and not t["whole"]]
        result[f"{part}_geomean"] = _geomean(values)
        result[f"{part}_min"] = min(values) if values else None
    result["met"] = bool(
        result["geomean"] is not None and result["geomean"] >= BAR["geomean"]
        and result["min_speedup"] >= BAR["min_speedup"] and ahead >= BAR["ahead_of_torch"]
        and result["component_rows"] >= BAR["component_rows"]
        and all(t["speedup"] is not None and t["numerics_ok"] is not False for t in table if not t["whole"]))
    result["whole_rows"] = len(whole)
    result["whole_at_least_stock"] = sum(1 for w in whole if w is not None and w >= 1.0)
    result["whole_met"] = result["whole_rows"] >= WHOLE_ROWS and result["whole_at_least_stock"] == len(whole)
    return result


def _f(v, fmt="{:.3f}") -> str:
    return "-" if v is None else fmt.format(v)


def markdown(s: dict) -> str:
    lines = ["| case | stock ms | vtc ms | speed-up (schedules x virtual) | torch best ms (mode; modes run) "
             "| vtc ahead | from |", "|---|---|---|---|---|---|---|"]
    for t in s["rows"]:
        torch_cell = (f"{_f(t['torch_best_ms'])} ({t['torch_best_mode']}; {', '.join(t['torch_modes'])})"
                      if t["torch_best_ms"] else "-")
        label = " (whole model)" if t["whole"] else "" if t["component"] else " (not a component)"
        lines.append(f"| {t['case']}{label} | {_f(t['stock_ms'])} | "
                     f"{_f(t['vtc_ms'])} | {_f(t['speedup'], '{:.2f}x')}{_split(t)} | {torch_cell} | "
                     f"{'yes' if t['ahead_of_torch'] else 'no'} | {t['source']} |")
    paper_rows = sum(1 for t in s["rows"] if not t["whole"])
    lines += ["", f"Geomean over stock: {_f(s['geomean'], '{:.2f}x')} over {paper_rows} rows, "
                  f"{_f(s['component_geomean'], '{:.2f}x')} over the {s['component_rows']} component rows; "
                  f"smallest {_f(s['min_speedup'], '{:.3f}x')}; ahead of torch's best on {s['ahead_of_torch']} "
                  f"of {s['component_rows']} component rows. Issue 13's bar (geomean >= {BAR['geomean']}x, none "
                  f"< {BAR['min_speedup']}x, ahead on >= {BAR['ahead_of_torch']} of {BAR['component_rows']}): "
                  f"{'met' if s['met'] else 'not met'}"
                  + (f" (rows from {len(s['sources'])} runs)" if len(s["sources"]) > 1 else "") + "."]
    if s["whole_rows"]:
        lines += ["", f"Whole models: vtc-tvm at least as fast as stock on {s['whole_at_least_stock']} of "
                      f"{s['whole_rows']} rows; issue 13's bar (all {WHOLE_ROWS} model x batch rows): "
                      f"{'met' if s['whole_met'] else 'not met'}."]
    if s["virtual_gain_geomean"] is not None:
        lines += ["", f"Split (rows with the stock + schedules column): our schedules "
                      f"{_f(s['schedule_gain_geomean'], '{:.2f}x')} geomean (smallest {_f(s['schedule_gain_min'], '{:.3f}x')}), "
                      f"virtual tensors {_f(s['virtual_gain_geomean'], '{:.2f}x')} geomean "
                      f"(smallest {_f(s['virtual_gain_min'], '{:.3f}x')})."]
    return "\n".join(lines)


def _split(t) -> str:
    if t["schedule_gain"] is None:
        return ""
    return f" ({_f(t['schedule_gain'], '{:.2f}')} x {_f(t['virtual_gain'], '{:.2f}')})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="benchmarks.run JSON files, later ones overriding earlier rows")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args(argv)
    s = summary(rows_of(args.runs))
    print(json.dumps(s, indent=1) if args.json else markdown(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
