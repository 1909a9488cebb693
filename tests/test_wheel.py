"""The package as a user installs it: a wheel built from the repository (by whatever build
backend pyproject.toml names) into a fresh venv, whose ``vtc-tvm`` command then works.

The venv sees this interpreter's site-packages through a ``.pth`` file (TVM is not downloaded
again) and gets the wheel with ``--no-deps``; ``PYTHONPATH`` is cleared so the installed copy,
not the checkout, is what runs.
"""

import json
import os
import subprocess
import sys
import sysconfig
import zipfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(cmd, cwd, env=None, timeout=600):
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, f"{cmd}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


@pytest.mark.slow
def test_wheel_installs_a_working_console_script(tmp_path):
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist, ROOT], tmp_path)
    wheel = next(dist.glob("vtc_tvm-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        scripts = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert any(n.endswith("LICENSE") for n in names) and "Apache" in meta
    assert "Requires-Dist: tqdm" in meta and "vtc-tvm = vtc_tvm" in scripts

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    python = venv / "bin" / "python"
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path, env).stdout
    paths = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (tmp_path / site.strip() / "outer_site_packages.pth").write_text("\n".join(paths) + "\n")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel],
         tmp_path, env)

    where = _run([python, "-c", "import vtc_tvm; print(vtc_tvm.__file__)"], tmp_path, env).stdout
    assert where.startswith(str(venv)), where  # the installed copy, not the checkout
    vtc_tvm_cmd = venv / "bin" / "vtc-tvm"
    assert "--model" in _run([vtc_tvm_cmd, "demo", "--help"], tmp_path, env).stdout

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 4)).astype("float32"), "w")
    graph = h.make_graph([h.make_node("Transpose", ["x"], ["t"], perm=[1, 0]), h.make_node("MatMul", ["t", "w"], ["y"])],
                         "g", [h.make_tensor_value_info("x", TP.FLOAT, [8, 3])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [3, 4])], [w])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "tiny.onnx")
    r = _run([vtc_tvm_cmd, "compile", "tiny.onnx", "--check", "--json", "-q", "-o", "tiny.so"], tmp_path, env)
    out = json.loads(r.stdout)
    assert out["ok"] and out["check"]["ok"] and (tmp_path / "tiny.so").stat().st_size > 0
