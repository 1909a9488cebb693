"""The ``vtc-tvm`` command line as a user drives it: ``python -m vtc_tvm`` in a fresh folder, small
ONNX models on LLVM; every user error gives one ``error:`` line and its own exit code."""

import glob
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

from vtc_tvm import cli
from vtc_tvm.errors import ExitCode

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = sorted(glob.glob(os.path.join(ROOT, "benchmarks", "onnx", "*.onnx")))
YOLO = os.path.join(ROOT, "benchmarks", "onnx", "yolo_c3k2_small.onnx")


def _save(tmp_path, nodes, inputs, outputs, inits=(), name="m.onnx", extra_opsets=()):
    graph = h.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), *extra_opsets])
    path = tmp_path / name
    onnx.save(model, path)
    return str(path)


@pytest.fixture
def good_model(tmp_path):
    """MatMul -> Transpose -> MatMul with a symbolic batch dim N (valid for N = 4 only)."""
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((8, 8)).astype("float32"), rng.standard_normal((4, 5)).astype("float32")
    nodes = [h.make_node("MatMul", ["x", "w1"], ["a"]), h.make_node("Transpose", ["a"], ["t"], perm=[1, 0]),
             h.make_node("MatMul", ["t", "w2"], ["y"])]
    return _save(tmp_path, nodes, [h.make_tensor_value_info("x", TP.FLOAT, ["N", 8])],
                 [h.make_tensor_value_info("y", TP.FLOAT, [8, 5])], [("w1", w1), ("w2", w2)])


def _cli(cwd, *args, env=None):
    return subprocess.run([sys.executable, "-m", "vtc_tvm", *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env={**os.environ, **(env or {})})


class _Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def _main(capsys, *args):
    """``cli.main`` in this process (no interpreter start-up: for the many cheap error cases)."""
    capsys.readouterr()
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return _Result(code, out, err)


def _assert_error(r, code, message):
    assert r.returncode == code, (r.returncode, r.stdout + r.stderr)
    lines = r.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error:") and "Traceback" not in r.stderr, r.stderr
    assert message in lines[-1], r.stderr


# -- the subcommands -------------------------------------------------------------------------------
def test_compile_check_report_out(good_model, tmp_path):
    r = _cli(tmp_path, "compile", good_model, "--shape", "x=4,8", "--strategy", "all", "--check", "--report",
             "-o", "lib.so")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "decisions (" in r.stdout and " virtual " in r.stdout
    assert "kernels: stock 3 (1 data-movement) -> vtc 2 (0 data-movement)" in r.stdout
    # vtc vs stock is always compared; both against onnxruntime; the inputs and tolerance are named
    assert "check: vtc vs stock: ok" in r.stdout and "check: vtc vs onnxruntime: ok" in r.stdout
    assert "check: stock vs onnxruntime: ok" in r.stdout and "MISMATCH" not in r.stdout
    assert "check: inputs (seed 0; normal(0, 1)): x[4, 8] float32" in r.stdout
    assert "rel-L2 <= 0.0001 and max|err|/max|ref| <= 0.001" in r.stdout
    assert (tmp_path / "lib.so").stat().st_size > 0
    # non-TTY stderr: phase lines, so long work is never silent
    assert "vtc-tvm: building vtc (llvm) ..." in r.stderr and "vtc-tvm: importing m.onnx: done" in r.stderr


def test_compile_json_and_quiet(good_model, tmp_path):
    r = _cli(tmp_path, "compile", good_model, "--dim", "N=4", "--check", "--report", "--json", "-q")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    out = json.loads(r.stdout)  # stdout is exactly one JSON object
    assert out["ok"] and out["exit_code"] == 0 and out["command"] == "compile"
    assert [(c["got"], c["ref"]) for c in out["check"]["comparisons"]] == [
        ("vtc", "stock"), ("stock", "onnxruntime"), ("vtc", "onnxruntime")]
    assert out["check"]["inputs"] == [{"name": "x", "shape": [4, 8], "dtype": "float32", "values": "normal(0, 1)"}]
    assert all(c["ok"] for c in out["check"]["comparisons"])
    assert {d["tensor"] for d in out["decisions"]} == {"t"}  # named after the ONNX tensor, not lv1


def test_symbolic_dims_stay_symbolic(tmp_path):
    """Batch and sequence symbolic: MatMul -> Transpose -> Softmax; --check sizes them 3."""
    w = np.random.default_rng(1).standard_normal((8, 8)).astype("float32")
    nodes = [h.make_node("MatMul", ["x", "w"], ["a"]), h.make_node("Transpose", ["a"], ["t"], perm=[0, 2, 1]),
             h.make_node("Softmax", ["t"], ["y"], axis=-1)]
    path = _save(tmp_path, nodes, [h.make_tensor_value_info("x", TP.FLOAT, ["B", "S", 8])],
                 [h.make_tensor_value_info("y", TP.FLOAT, ["B", 8, "S"])], [("w", w)], name="bs.onnx")
    r = _cli(tmp_path, "compile", path, "--strategy", "all", "--check", "--report", "--json", "-q")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["check"]["ok"], r.stdout
    assert out["census"]["stock"]["kernels"] == 3 and out["census"]["vtc"] == {
        "kernels": 2, "data_movement": 0, "planned_bytes": None}  # symbolic sizes: no static plan
    assert out["check"]["inputs"][0]["shape"] == [3, 3, 8]


def test_explain(tmp_path):
    r = _cli(tmp_path, "explain", YOLO, "--time", "--repeat", "2", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    page = (tmp_path / "yolo_c3k2_small.vtc.html").read_text()
    assert out["files"]["html"] == str(tmp_path / "yolo_c3k2_small.vtc.html")
    assert "<svg" in page and "<script" not in page and "http" not in page.split("<svg", 1)[0]
    plan = out["plan"]
    assert {"id", "name", "op", "onnx_node", "shape", "dtype", "bytes", "virtual", "reason"} <= set(plan["nodes"][0])
    assert {"id", "src", "dst", "kind", "consumer", "mapping", "gain_us", "kernels", "memory", "chosen",
            "reason"} <= set(plan["edges"][0])
    concat = next(n for n in plan["nodes"] if n["op"] == "concat")
    assert concat["onnx_node"] == "node_concat_0" and concat["virtual"] and "node_concat_0" in page
    # the concat's mapping as its consumer reads it, composed through the split's parts (virtual
    # too) down to the split's input and the add, in words
    assert concat["mapping"] == ("(i, j, k, l) -> mul_0[i, j, k, l] if j < 16 else mul_0[i, j, k, l] "
                                 "if j < 32 else add_3[i, j - 32, k, l]")
    assert all(n["virtual"] for n in plan["nodes"] if n["onnx_node"] == "node_split_0")
    assert any(e["gain_us"] is not None and e["chosen"] for e in plan["edges"])  # the planner's costs
    assert plan["summary"]["kernels"] == {"stock": 6, "vtc": 5}
    assert all(ms > 0 for ms in plan["summary"]["latency_ms"].values())  # --time: on the CPU here
    assert "not measured" not in page
    assert len({(e["src"], e["dst"], e["reason"]) for e in plan["edges"]}) == len(plan["edges"])  # no repeats
    if out["files"].get("png"):
        with open(out["files"]["png"], "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    else:
        print(f"PNG not checked: {out['files']['png_skipped']}")
        assert "no chromium" in out["files"]["png_skipped"]


def test_bench(tmp_path):
    r = _cli(tmp_path, "bench", YOLO, "--target", "llvm", "--rounds", "2", "--repeat", "2", "--json", "-q")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    v = out["variants"]
    assert set(v) == {"stock", "vtc"} and all(x["median_ms"] > 0 and len(x["round_medians_ms"]) == 2
                                              for x in v.values())
    assert (v["stock"]["kernels"], v["vtc"]["kernels"]) == (6, 5)
    table = cli.bench_lines(out)  # the text bench prints without --json
    assert table[1].split() == ["kernels", "data-mv", "mem", "MiB", "ms"]
    assert [line.split()[0] for line in table[2:4]] == ["stock", "vtc"] and table[4].startswith("speed-up: ")


def test_help_lists_exit_codes(capsys):
    for args in (["compile", "--help"], ["--help"]):
        with pytest.raises(SystemExit) as exit_:
            cli.main(args)
        assert exit_.value.code == 0
        out = capsys.readouterr().out
        assert "exit codes:" in out and "3  numeric mismatch" in out and "11  tuning support" in out
    assert all(c in out for c in ("compile", "explain", "bench", "tune", "demo"))


# -- numeric mismatch and crashes: in process, with a sabotaged emitter -------------------------------
def _negating_emit(mod, _plan):
    """What the CLI compiles (``vtc_tvm.emit`` of the plan), with its output negated."""
    from tvm import relax

    f = mod["main"]
    return tvm.IRModule({"main": relax.Function(f.params, relax.op.negative(f.body), f.ret_ty, attrs=f.attrs)})


def test_mismatch_has_its_own_exit_code(good_model, monkeypatch, capsys):
    import vtc_tvm

    monkeypatch.setattr(vtc_tvm, "emit", _negating_emit)
    assert cli.main(["compile", good_model, "--shape", "x=4,8", "--check"]) == ExitCode.MISMATCH == 3
    out = capsys.readouterr().out
    assert "check: vtc vs stock: MISMATCH" in out and "check: vtc vs onnxruntime: MISMATCH" in out
    assert "check: stock vs onnxruntime: ok" in out


def test_crash_is_exit_1_and_one_line(good_model, monkeypatch, capsys):
    import vtc_tvm

    def broken(*_a, **_k):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(vtc_tvm, "plan", broken)
    assert cli.main(["compile", good_model, "--shape", "x=4,8"]) == ExitCode.INTERNAL == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "error: internal error: RuntimeError: boom second line (--debug shows the traceback)"
    with pytest.raises(RuntimeError):
        cli.main(["compile", good_model, "--shape", "x=4,8", "--debug"])
    monkeypatch.setenv("VTC_TVM_DEBUG", "1")
    with pytest.raises(RuntimeError):
        cli.main(["compile", good_model, "--shape", "x=4,8"])


# -- user errors: one line, one exit code each ----------------------------------------------------
def _bad_models(tmp_path):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x08\x07 this is not a protobuf \xff\xfe\x00" * 8)
    frob = h.make_node("Frobnicate", ["x"], ["y"], domain="com.example", name="frob0")
    f32 = ([h.make_tensor_value_info("x", TP.FLOAT, [2, 3])], [h.make_tensor_value_info("y", TP.FLOAT, [2, 3])])
    c64 = h.make_tensor_value_info("x", TP.COMPLEX64, [2, 3])
    return {
        "missing file": (str(tmp_path / "nope.onnx"), ExitCode.INVALID_MODEL, "no such file"),
        "directory": (str(tmp_path), ExitCode.INVALID_MODEL, "not a file"),
        "garbage bytes": (str(garbage), ExitCode.INVALID_MODEL, "malformed protobuf"),
        "checker failure": (_save(tmp_path, [h.make_node("Relu", ["zz"], ["y"])], *f32, name="c.onnx"),
                            ExitCode.INVALID_MODEL, "invalid ONNX model"),
        "complex64 input": (_save(tmp_path, [h.make_node("Identity", ["x"], ["y"])], [c64],
                                  [h.make_tensor_value_info("y", TP.COMPLEX64, [2, 3])], name="cx.onnx"),
                            ExitCode.INVALID_MODEL, "unsupported element type COMPLEX64"),
        "unknown op": (_save(tmp_path, [frob], *f32, name="u.onnx", extra_opsets=[h.make_opsetid("com.example", 1)]),
                       ExitCode.UNSUPPORTED_MODEL, "unsupported op com.example::Frobnicate (node 'frob0')"),
    }


@pytest.mark.parametrize("case", ["missing file", "directory", "garbage bytes", "checker failure",
                                  "complex64 input", "unknown op"])
def test_bad_model(tmp_path, capsys, case):
    path, code, message = _bad_models(tmp_path)[case]
    _assert_error(_main(capsys, "compile", path), code, message)


def test_errors_from_a_shell(tmp_path):
    """The same errors through a real process: stderr ends in the one line, nothing else leaks."""
    path, code, message = _bad_models(tmp_path)["unknown op"]
    r = _cli(tmp_path, "compile", path)
    _assert_error(r, code, message)
    assert r.stderr.strip().splitlines()[0].startswith("vtc-tvm: importing u.onnx")  # the phase line
    r = _cli(tmp_path, "compile", path, "--json", "-q")
    assert r.stderr.strip().startswith(f"error: {message}") and len(r.stderr.strip().splitlines()) == 1
    assert json.loads(r.stdout)["exit_code"] == code


@pytest.mark.parametrize("args, code, message", [
    (["--shape", "x=4,a"], ExitCode.BAD_SHAPE, "not NAME=D1,D2,..."),
    (["--shape", "x=0,8"], ExitCode.BAD_SHAPE, "positive integer sizes"),
    (["--shape", "x=4"], ExitCode.BAD_SHAPE, "1 dims given, the model says rank 2"),
    (["--shape", "x=4,7"], ExitCode.BAD_SHAPE, "dim 1 must be 8"),
    (["--dim", "N=four"], ExitCode.BAD_SHAPE, "not NAME=SIZE"),
    (["--shape", "z=4,8"], ExitCode.UNKNOWN_NAME, "unknown input 'z'"),
    (["--dim", "M=4"], ExitCode.UNKNOWN_NAME, "--dim M: the model has no symbolic dim of that name (symbolic dims: N)"),
    (["--target", "metal-ish"], ExitCode.BAD_TARGET, "--target 'metal-ish': Target kind \"metal-ish\" is not defined"),
    (["--target", '{"kind": "llvm"'], ExitCode.BAD_TARGET, "not valid JSON"),
    (["--ops", "permute_dim"], ExitCode.BAD_OPTION, "'permute_dim' has no VirtualTensorize rule (did you mean "
                                                    "'relax.permute_dims'?)"),
    (["--inplace", "kv_cache"], ExitCode.BAD_OPTION, "--inplace: 'kv_cache' is not a parameter"),
    (["--frobnicate"], ExitCode.USAGE, "unrecognized arguments: --frobnicate"),
])
def test_user_errors(good_model, capsys, args, code, message):
    _assert_error(_main(capsys, "compile", good_model, *args), code, message)


def test_usage_errors(capsys, tmp_path):
    _assert_error(_main(capsys), ExitCode.USAGE, "required")
    _assert_error(_main(capsys, "tune", YOLO, "--trials", "4"), ExitCode.USAGE, "--work-dir")
    _assert_error(_main(capsys, "tune", YOLO, "--work-dir", tmp_path, "--trials", "0"), ExitCode.USAGE,
                  "'0' is not a positive int")
    _assert_error(_main(capsys, "tune", YOLO, "--work-dir", tmp_path, "--trials", "2", "--seconds", "-1"),
                  ExitCode.USAGE, "'-1' is not a positive float")
    _assert_error(_main(capsys, "demo", "--model", "resnet"), ExitCode.USAGE, "invalid choice: 'resnet'")


def test_tune_without_tuning_module(monkeypatch, capsys, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vtc_tvm.tuning" else real(name, *a))
    code = cli.main(["tune", YOLO, "--work-dir", str(tmp_path / "w"), "--trials", "2", "--json"])
    assert code == ExitCode.NO_TUNING == 11
    captured = capsys.readouterr()
    assert captured.err.strip() == "error: tuning support is not installed in this build (no module vtc_tvm.tuning)"
    assert json.loads(captured.out)["exit_code"] == 11


@pytest.mark.skipif(tvm.cuda(0).exist, reason="a GPU is visible: the no-GPU errors cannot happen here")
def test_no_gpu(good_model, tmp_path, capsys):
    _assert_error(_main(capsys, "compile", good_model, "--shape", "x=4,8", "--target", "cuda", "--check"),
                  ExitCode.NO_DEVICE, "--check runs on a cuda device and none is visible")
    r = _cli(tmp_path, "demo", "--target", "cuda")
    _assert_error(r, ExitCode.NO_DEVICE, "demo runs on a cuda device and none is visible")
    assert len(r.stderr.strip().splitlines()) <= 2, r.stderr  # a note and the error, no FFI traceback


@pytest.mark.skipif(tvm.get_global_func("target.build.cuda", allow_missing=True) is None,
                    reason="this TVM build has no CUDA codegen")
def test_cuda_codegen_without_warnings(good_model, tmp_path):
    """CUDA code is generated without a GPU; TVM's own warnings do not reach the user."""
    r = _cli(tmp_path, "compile", good_model, "--shape", "x=4,8", "--target", "cuda")
    assert r.returncode == 0, r.stderr
    assert "note: --target cuda means vtc_tvm.pipeline.cuda_target()" in r.stderr or tvm.cuda(0).exist
    assert "Warning" not in r.stderr and "warn" not in r.stderr.lower(), r.stderr


# -- the shipped models ------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("path", SHIPPED, ids=[os.path.basename(p)[:-5] for p in SHIPPED])
def test_check_ok_on_shipped_models(path, capsys):
    """Stock TVM and vtc are bit-identical on the CPU, and both agree with onnxruntime by the
    scale-aware tolerance (outputs reach 1e7 in some of these). In process: the shell path is
    tested above, and seven interpreter start-ups are not worth their time."""
    r = _main(capsys, "compile", path, "--check", "--json", "-q")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["check"]["ok"], json.dumps(out.get("check"), indent=1)
    vtc_vs_stock = out["check"]["comparisons"][0]
    assert (vtc_vs_stock["got"], vtc_vs_stock["ref"]) == ("vtc", "stock")
    assert all(o["exact"] for o in vtc_vs_stock["outputs"])
    assert out["check"]["onnxruntime"] == "used"


@pytest.mark.slow
def test_tune_tunes_then_reapplies_the_database(good_model, tmp_path):
    """``vtc-tvm tune``: MetaSchedule tunes the vtc module's kernels into the work dir; a second
    run finds every kernel there and tunes nothing."""
    work = tmp_path / "db"
    args = ("tune", good_model, "--target", "llvm", "--dim", "N=4", "--work-dir", work, "--trials", "2",
            "--json", "-q")
    first = _cli(tmp_path, *args)
    assert first.returncode == 0, first.stderr
    stats = json.loads(first.stdout)["result"]
    assert stats["tasks"] >= 1 and stats["tuned"] >= 1, stats
    assert glob.glob(str(work / "**" / "*.json*"), recursive=True)
    again = json.loads(_cli(tmp_path, *args).stdout)["result"]
    assert again["tuned"] == 0 and again["in_db"] == stats["tasks"], again
