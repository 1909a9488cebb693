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
