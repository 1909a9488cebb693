"""`python -m vtc_tvm compile`: a good model end to end, and one clean `error:` line (exit 2) for
every kind of bad input."""

import subprocess
import sys

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

from vtc_tvm.__main__ import main


def _save(tmp_path, nodes, inputs, outputs, inits=(), name="m.onnx", extra_opsets=()):
    graph = h.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), *extra_opsets])
    path = tmp_path / name
    onnx.save(model, path)
    return str(path)


@pytest.fixture
def good_model(tmp_path):
    """MatMul -> Transpose -> MatMul with a symbolic batch dim N."""
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((8, 8)).astype("float32"), rng.standard_normal((4, 5)).astype("float32")
    nodes = [h.make_node("MatMul", ["x", "w1"], ["a"]), h.make_node("Transpose", ["a"], ["t"], perm=[1, 0]),
             h.make_node("MatMul", ["t", "w2"], ["y"])]
    return _save(tmp_path, nodes, [h.make_tensor_value_info("x", TP.FLOAT, ["N", 8])],
                 [h.make_tensor_value_info("y", TP.FLOAT, [8, 5])], [("w1", w1), ("w2", w2)])


def _identity_model(tmp_path, elem_type):
    return _save(tmp_path, [h.make_node("Identity", ["x"], ["y"])], [h.make_tensor_value_info("x", elem_type, [2, 3])],
                 [h.make_tensor_value_info("y", elem_type, [2, 3])], name=f"identity{elem_type}.onnx")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "vtc_tvm", *args], capture_output=True, text=True, timeout=300)


def test_compile_check_report(good_model, tmp_path):
    lib = tmp_path / "lib.so"
    r = _cli("compile", good_model, "--shape", "x=4,8", "--strategy", "all", "--check", "--report", "--out", str(lib))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "decisions (" in r.stdout and " virtual " in r.stdout
    assert "kernels: stock 3 (1 data-movement) -> vtc 2 (0 data-movement)" in r.stdout
    assert "check: vtc vs onnxruntime: ok" in r.stdout and "MISMATCH" not in r.stdout
    assert lib.stat().st_size > 0


def test_mismatch_exits_1(good_model, monkeypatch, capsys):
    # A "VirtualTensorize" that negates the output: the check must catch it.
    import vtc_tvm
    from tvm import relax

    def negate(*_args, **_kw):
        @tvm.transform.module_pass(opt_level=0, name="Negate")
        def negate_pass(mod, _ctx):
            f = mod["main"]
            return tvm.IRModule({"main": relax.Function(f.params, relax.op.negative(f.body), f.ret_ty, attrs=f.attrs)})
        return negate_pass

    monkeypatch.setattr(vtc_tvm, "VirtualTensorize", negate)
    assert main(["compile", good_model, "--shape", "x=4,8", "--check"]) == 1
    assert "check: vtc vs onnxruntime: MISMATCH" in capsys.readouterr().out


def _bad_models(tmp_path):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x08\x07 this is not a protobuf \xff\xfe\x00" * 8)
    frob = h.make_node("Frobnicate", ["x"], ["y"], domain="com.example", name="frob0")
    f32 = ([h.make_tensor_value_info("x", TP.FLOAT, [2, 3])], [h.make_tensor_value_info("y", TP.FLOAT, [2, 3])])
    return {
        "missing file": ([str(tmp_path / "nope.onnx")], "no such file"),
        "directory": ([str(tmp_path)], "not a file"),
        "garbage bytes": ([str(garbage)], "malformed protobuf"),
        "checker failure": ([_save(tmp_path, [h.make_node("Relu", ["zz"], ["y"])], *f32, name="c.onnx")],
                            "invalid ONNX model"),
        "unknown op": ([_save(tmp_path, [frob], *f32, name="u.onnx",
                              extra_opsets=[h.make_opsetid("com.example", 1)])],
                       "unsupported op com.example::Frobnicate (node 'frob0')"),
        "complex64 input": ([_identity_model(tmp_path, TP.COMPLEX64)], "unsupported element type COMPLEX64"),
        "string input": ([_identity_model(tmp_path, TP.STRING)], "unsupported element type STRING"),
    }


@pytest.mark.parametrize("case", ["missing file", "directory", "garbage bytes", "checker failure", "unknown op",
                                  "complex64 input", "string input"])
def test_bad_model(tmp_path, case):
    args, message = _bad_models(tmp_path)[case]
    _assert_error(_cli("compile", *args), message)


def test_symbolic_dim_stays_symbolic(good_model):
    """A named symbolic dim (dim_param N) is kept: the transpose still becomes virtual, and
    --check runs at the --dim size against onnxruntime (the model is only valid for N = 4)."""
    for extra in (["--dim", "N=4"],):
        r = _cli("compile", good_model, "--strategy", "all", "--check", "--report", *extra)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "kernels: stock 3 (1 data-movement) -> vtc 2 (0 data-movement)" in r.stdout
        assert "check: vtc vs onnxruntime: ok" in r.stdout, r.stdout


def test_symbolic_dims_default_check_size(tmp_path):
    """Batch and sequence symbolic: MatMul -> Transpose -> Softmax, checked at the default size."""
    w = np.random.default_rng(1).standard_normal((8, 8)).astype("float32")
    nodes = [h.make_node("MatMul", ["x", "w"], ["a"]), h.make_node("Transpose", ["a"], ["t"], perm=[0, 2, 1]),
             h.make_node("Softmax", ["t"], ["y"], axis=-1)]
    path = _save(tmp_path, nodes, [h.make_tensor_value_info("x", TP.FLOAT, ["B", "S", 8])],
                 [h.make_tensor_value_info("y", TP.FLOAT, ["B", 8, "S"])], [("w", w)], name="bs.onnx")
    r = _cli("compile", path, "--strategy", "all", "--check", "--report")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "kernels: stock 3 (1 data-movement) -> vtc 2 (0 data-movement)" in r.stdout
    assert "check: vtc vs onnxruntime: ok" in r.stdout, r.stdout


def test_unknown_dim_needs_shape(tmp_path):
    path = _save(tmp_path, [h.make_node("Relu", ["x"], ["y"])], [h.make_tensor_value_info("x", TP.FLOAT, [None, 8])],
                 [h.make_tensor_value_info("y", TP.FLOAT, [None, 8])], name="unknown.onnx")
    _assert_error(_cli("compile", path), "input 'x' has unknown dim 0 in shape [?, 8]; "
                                         "give static sizes with --shape x=D,8")
    r = _cli("compile", path, "--shape", "x=4,8")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("shape, message", [
    ("x=4,a", "not NAME=D1,D2,..."), ("x", "not NAME=D1,D2,..."), ("x=0,8", "positive integer sizes"),
    ("x=-1,8", "positive integer sizes"),
    ("x=4", "1 dims given, the model says rank 2"), ("x=4,7", "dim 1 must be 8"), ("z=4,8", "unknown input 'z'"),
])
def test_bad_shape(good_model, shape, message):
    _assert_error(_cli("compile", good_model, "--shape", shape), message)


def test_usage_errors(good_model):
    _assert_error(_cli(), "required")
    _assert_error(_cli("compile", good_model, "--target", "metal"), "invalid choice")


@pytest.mark.skipif(tvm.get_global_func("target.build.cuda", allow_missing=True) is None, reason="no CUDA build")
def test_cuda(good_model):
    r = _cli("compile", good_model, "--shape", "x=4,8", "--target", "cuda")  # codegen only: no GPU needed
    assert r.returncode == 0, r.stderr
    if not tvm.cuda(0).exist:
        _assert_error(_cli("compile", good_model, "--shape", "x=4,8", "--target", "cuda", "--check"),
                      "needs a CUDA GPU")


def _assert_error(r, message):
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith("error:") and "Traceback" not in r.stderr, r.stderr
    assert message in r.stderr
