"""The kernel benchmark compiles its cases for CUDA without a GPU (``--dry``)."""

import json
import subprocess
import sys


def test_kernels_dry_run(tmp_path):
    cmd = [sys.executable, "-m", "benchmarks.kernels", "--dry", "--cases", "sum/", "softmax/", "attn_pv",
           "--out", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads((tmp_path / "kernels.json").read_text())["rows"]
    assert {(row["consumer"], row["mapping"]) for row in rows} == {
        ("sum", "strided_slice"), ("softmax", "transpose"), ("attn_pv", "gqa")}
    for row in rows:
        assert "error" not in row, row
        assert row["virtualized"], row["decisions"]  # all three edges stay schedulable by DLight


def _run_json(path, cases):
    path.write_text(json.dumps({"cases": [dict(zip(("workload", "batch", "stock_ms", "vtc_ms", "torch_best_ms"), c),
                                               numerics_ok=True, torch_best_mode="eager", torch_eager_ms=c[4])
                                          for c in cases]}))
    return str(path)


def test_paper_summary_applies_issue_13s_bar_to_the_rows(tmp_path):
    """benchmarks.paper_summary: geomean over stock (all rows, component rows), the smallest
    speed-up, rows ahead of torch's best; a later run's row replaces an earlier one's."""
    import math

    from benchmarks import paper_summary

    components = ["llama_decode", "gemma2_decode", "llama_prefill", "effvit_attn", "yolo_c3k2"]
    # 10 component rows at 2x, 6 of them ahead of torch (vtc 1 ms, torch 1.5 or 0.5 ms), plus a
    # ShuffleNet row at 1.1x that is not a component
    cases = [(name, b, 2.0, 1.0, 1.5 if i * 2 + k < 6 else 0.5) for i, name in enumerate(components)
             for k, b in enumerate((1, 16))] + [("shufflenet_unit", 1, 1.1, 1.0, None)]
    full = _run_json(tmp_path / "full.json", cases)
    s = paper_summary.summary(paper_summary.rows_of([full]))
    assert s["component_rows"] == 10 and s["ahead_of_torch"] == 6 and s["met"]
    assert math.isclose(s["component_geomean"], 2.0) and math.isclose(s["geomean"], (2.0 ** 10 * 1.1) ** (1 / 11))
    assert math.isclose(s["min_speedup"], 1.1)
    # a later run of one case: slower than stock and behind torch there
    later = _run_json(tmp_path / "later.json", [("llama_decode", 1, 1.0, 1.25, 1.0)])
    s = paper_summary.summary(paper_summary.rows_of([full, later]))
    assert s["ahead_of_torch"] == 5 and math.isclose(s["min_speedup"], 0.8) and not s["met"]
    assert s["sources"] == sorted([full, later])
    assert "not met (rows from 2 runs)" in paper_summary.markdown(s)


def test_paper_summary_splits_the_speedup_where_the_middle_column_ran(tmp_path):
    """stock / vtc = (stock / stock + schedules) x (stock + schedules / vtc), each part's geomean
    and smallest value; rows without the middle column stay out of the split."""
    import math

    from benchmarks import paper_summary

    path = tmp_path / "run.json"
    path.write_text(json.dumps({"cases": [
        {"workload": "shufflenet_v2", "batch": 16, "stock_ms": 6.0, "stock_sched_ms": 1.5, "vtc_ms": 1.25},
        {"workload": "llama_decode", "batch": 1, "stock_ms": 0.6, "stock_sched_ms": 0.3, "vtc_ms": 0.2},
        {"workload": "yolo_c3k2", "batch": 1, "stock_ms": 0.07, "vtc_ms": 0.06}]}))
    s = paper_summary.summary(paper_summary.rows_of([str(path)]))
    assert math.isclose(s["schedule_gain_geomean"], math.sqrt(4.0 * 2.0))
    assert math.isclose(s["virtual_gain_geomean"], math.sqrt(1.2 * 1.5)) and math.isclose(s["virtual_gain_min"], 1.2)
    row = next(t for t in s["rows"] if t["case"] == "shufflenet_v2/b16")
    assert math.isclose(row["schedule_gain"] * row["virtual_gain"], row["speedup"])
    md = paper_summary.markdown(s)
    assert "4.80x (4.00 x 1.20)" in md and "virtual tensors 1.34x geomean (smallest 1.200x)" in md


def test_cpu_bench_times_a_model_through_the_cli(tmp_path):
    """benchmarks.cpu_bench: writes the workload's ONNX twin, runs 'vtc-tvm bench' on it in a
    process of its own and tabulates the census and the interleaved rounds (no timing asserted)."""
    cmd = [sys.executable, "-m", "benchmarks.cpu_bench", "--rounds", "2", "--runs", "2", "--onnx-dir", str(tmp_path / "onnx"),
           "--out", str(tmp_path), "shufflenet_unit"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads((tmp_path / "cpu_bench.json").read_text())
    [row] = result["rows"]
    assert row["ok"] and row["model"] == "shufflenet_unit" and row["rounds"] == 2
    assert row["kernels"][1] < row["kernels"][0] and row["copies"][1] < row["copies"][0]  # the shuffle's copy
    assert len(row["run_speedups"]) == 2
    assert all(row["round_ratio_min"] <= x <= row["round_ratio_max"] for x in row["run_speedups"])
    assert "| shufflenet_unit |" in (tmp_path / "cpu_bench.md").read_text()


def test_compile_time_first_compiles_run_a_checkouts_code_in_fresh_processes():
    """benchmarks.compile_time --first: each compile in a process of its own, with the code of
    the checkout named (here this one), stock and vtc, medians and the ratio."""
    import os

    from benchmarks import compile_time

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    (row,) = compile_time.first_compiles(["llvm:llama_decode:1"], 1, root)
    assert (row["target"], row["model"], row["batch"]) == ("llvm", "llama_decode", 1)
    for variant in ("stock", "vtc"):
        (run,) = row["runs"][variant]
        assert run[0] > 0 and row[f"{variant}_wall_s"] == run[0]
    assert row["ratio_wall"] == row["vtc_wall_s"] / row["stock_wall_s"]


def test_encoder_census_rows_of_one_encoder_layer():
    """benchmarks.encoder_census: one BERT-base layer and one ViT-B/16 layer from ONNX (weights as
    initializers) on LLVM: the vtc build launches fewer kernels than stock and no copy kernel."""
    from benchmarks import encoder_census

    for name, copies in (("bert_base", 4), ("vit_b16", 5)):
        row = encoder_census.row(name, "llvm", layers=1, symbolic_batch=False, repeat=1)
        assert row["stock_data_movement"] == copies and row["vtc_data_movement"] == 0, row
        assert row["vtc_kernels"] < row["stock_kernels"]
        assert row["vtc_planned_bytes"] <= row["stock_planned_bytes"]


def test_rule_census_names_the_rule_of_every_gemm(tmp_path):
    """benchmarks.rule_census on the small fp16 YOLO11n at batch 2 (CUDA codegen): every kernel is
    counted under the rule that took it, each GEMM has its extents, and FittedTensorCoreGEMM's
    are on tensor cores, NarrowGEMM's not (<= 32 channels)."""
    from benchmarks import rule_census

    assert rule_census.main(["--models", "yolo11n", "--size", "small", "--batches", "2", "--out", str(tmp_path)]) == 0
    (row,) = json.loads((tmp_path / "rule_census.json").read_text())["rows"]
    gemms = row["gemms"]
    assert sum(row["kernels_by_rule"].values()) >= len(gemms) > 0
    ours = [g for g in gemms if g["rule"] == "FittedTensorCoreGEMM"]
    assert ours and all(g["tensor_cores"] and g["J"] > 32 for g in ours)
    assert all(not g["tensor_cores"] and g["J"] <= 32 for g in gemms if g["rule"] == "NarrowGEMM")
    assert "Guarded" not in row["kernels_by_rule"] and "Matmul" in row["kernels_by_rule"]  # DLight's by name
    assert "| I | J | K | rule | tensor cores |" in (tmp_path / "rule_census.md").read_text()


def test_rule_ab_builds_the_variants_that_matter(tmp_path):
    """benchmarks.rule_ab --dry (no GPU) on the small C3k2 block: default's build says which of our
    rules apply; the variant without NarrowGEMM (the one that takes its convolutions) and the
    tensor-core alternative build, the variants of rules that take nothing are skipped."""
    from benchmarks import rule_ab

    assert rule_ab.main(["--dry", "--size", "small", "--workloads", "yolo_c3k2", "--batch", "16",
                         "--variants", "default", "no_narrow", "no_decode_attention", "tc_narrow",
                         "--out", str(tmp_path)]) == 0
    (row,) = json.loads((tmp_path / "rule_ab.json").read_text())["rows"]
    got = row["variants"]
    assert {"compile_s"} == set(got["default"]) == set(got["no_narrow"]) == set(got["tc_narrow"])
    assert "skipped" in got["no_decode_attention"]


def test_paper_summary_whole_models_have_their_own_bar(tmp_path):
    """Rows of the whole suite: vtc >= stock on all six (model x batch) rows; they stay out of the
    paper suite's geomean, smallest speed-up and bar."""
    from benchmarks import paper_summary

    whole = [(m, b, 10.0, 9.0 if m != "yolo11n" or b == 1 else 10.5, None)
             for m in paper_summary.WHOLE for b in (1, 16)]
    path = _run_json(tmp_path / "whole.json", whole + [("yolo_c3k2", 1, 2.0, 1.0, 3.0)])
    s = paper_summary.summary(paper_summary.rows_of([path]))
    assert s["whole_rows"] == 6 and s["whole_at_least_stock"] == 5 and not s["whole_met"]
    assert s["min_speedup"] == 2.0 and s["geomean"] == 2.0  # the one paper row
    assert "at least as fast as stock on 5 of 6 rows" in paper_summary.markdown(s)
    fixed = _run_json(tmp_path / "fixed.json", [("yolo11n", 16, 10.0, 9.9, None)])
    s = paper_summary.summary(paper_summary.rows_of([path, fixed]))
    assert s["whole_met"] and s["whole_at_least_stock"] == 6
