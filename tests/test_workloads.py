"""The benchmark workloads (benchmarks/workloads.py) and the paper-suite harness (benchmarks/run.py).

Small configs on LLVM: every workload builds, stock TVM and vtc-tvm agree, the torch twin (when
torch is importable) computes the same function, and the harness runs end to end.
"""

import json
import os

import numpy as np
import pytest
import tvm

from benchmarks import run as bench
from benchmarks.workloads import WORKLOADS, is_weight, load_torch, torch_module
from vtc_tvm.report import compile_variants, run_vm


def _close(got, want, rtol):
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert np.isfinite(g).all()
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * float(np.abs(w).max()))


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_stock_and_vtc_agree(name):
    wl = WORKLOADS[name]
    cfg = wl.config("small")
    mod = wl.build(cfg)
    assert tvm.relax.analysis.well_formed(mod) is not False  # None (no complaint) in TVM 0.27
    inputs = wl.inputs(mod, cfg, seed=7)
    assert all(np.abs(a).max() > 0 for a in inputs if a.size)  # random, never zeros
    variants = compile_variants(mod, "llvm")
    stock = run_vm(variants["stock"][1], tvm.cpu(), inputs)
    vtc = run_vm(variants["vtc"][1], tvm.cpu(), inputs)
    _close(vtc, stock, 1e-4)
    census_stock, census_vtc = variants["stock"][0], variants["vtc"][0]
    assert census_vtc["data_movement"] <= census_stock["data_movement"]


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_torch_twin_matches(name):
    torch = pytest.importorskip("torch")
    wl = WORKLOADS[name]
    cfg = wl.config("small")
    mod = wl.build(cfg)
    inputs = wl.inputs(mod, cfg, seed=3)
    ex = tvm.compile(mod, target="llvm", relax_pipeline=tvm.relax.get_default_pipeline(tvm.target.Target("llvm")))
    want = run_vm(ex, tvm.cpu(), inputs)
    module, acts = load_torch(torch_module(wl, cfg), mod, inputs)
    assert len(acts) == sum(not is_weight(p.name) for p in mod["main"].params)
    with torch.no_grad():
        out = module(*acts)
    got = [out.numpy()] if isinstance(out, torch.Tensor) else [o.numpy() for o in out]
    _close(got, want, 1e-4)


def test_configs_real_sizes():
    """The real configs are what the docs say (built as Relax only: no compile)."""
    cfg = WORKLOADS["gemma2_decode"].config("real", 16, "float16")
    assert (cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.intermediate) == (3584, 16, 8, 256, 14336)
    assert WORKLOADS["llama_decode"].config("real", 1).ctx == 4096
    assert WORKLOADS["llama_prefill"].config("real", 1).seq == 512
    mod = WORKLOADS["shufflenet_v2"].build(WORKLOADS["shufflenet_v2"].config("real", 1, "float16"))
    assert [int(d) for d in mod["main"].body.ty.shape] == [1, 1000]


def test_classify_kernel():
    classes = {"fused_matmul": "compute", "fused_matmul_add": "compute", "transpose": "dm"}
    assert bench.classify_kernel("fused_matmul_add_kernel", classes) == "compute"
    assert bench.classify_kernel("transpose_kernel", classes) == "dm"
    assert bench.classify_kernel("transpose_kernel_1", classes) == "dm"
    assert bench.classify_kernel("cutlass_gemm", classes) == "other"


def test_harness_end_to_end(tmp_path):
    rc = bench.main(["--suite", "paper", "--target", "llvm", "--size", "small", "--repeat", "3",
                     "--out", str(tmp_path)])
    assert rc == 0
    result = json.loads((tmp_path / "paper.json").read_text())
    for key in ("commit", "date", "device", "tvm", "torch", "cases"):
        assert key in result
    assert {c["workload"] for c in result["cases"]} == set(bench.SUITES["paper"])
    for case in result["cases"]:
        assert "error" not in case, case
        for key in bench.KEYS:
            assert key in case
        assert case["stock_ms"] > 0 and case["vtc_ms"] > 0
        assert case["max_rel_err"] < 1e-4
        assert case["vtc_kernels"] <= case["stock_kernels"]
    dated = [f for f in os.listdir(tmp_path) if f.startswith("paper_") and f.endswith(".json")]
    assert len(dated) == 1
    assert (tmp_path / "paper.md").read_text().count("\n|") >= len(result["cases"]) + 1


def test_harness_from_onnx(tmp_path):
    """``--source onnx``: the same workloads imported from their ONNX twins through from_onnx."""
    rc = bench.main(["--suite", "paper", "--target", "llvm", "--size", "small", "--repeat", "2",
                     "--cases", "llama_decode", "shufflenet_unit", "--source", "onnx", "--out", str(tmp_path)])
    assert rc == 0
    result = json.loads((tmp_path / "paper.json").read_text())
    assert result["source"] == "onnx" and len(result["cases"]) == 2
    for case in result["cases"]:
        assert case["source"] == "onnx" and "error" not in case, case
        assert case["max_rel_err"] < 1e-4
        assert case["vtc_dm_kernels"] < case["stock_dm_kernels"]
