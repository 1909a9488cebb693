"""`vtc-tvm demo` (also `python -m vtc_tvm.demo`, what `./vtc demo` runs) end to end, as a user runs it."""

import json
import subprocess
import sys

import pytest
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from vtc_tvm import demo, transform
from vtc_tvm.errors import ExitCode


def _demo(*args):
    cmd = [sys.executable, "-m", "vtc_tvm.demo", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("model", ["llama", "shufflenet"])
def test_demo_small_llvm(model):
    r = _demo("--model", model, "--size", "small", "--target", "llvm", "--repeat", "3")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[1].split() == ["kernels", "data-mv", "mem", "MiB", "ms"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:4]}
    assert set(rows) == {"stock", "vtc"} and all(len(v) == 4 for v in rows.values())
    assert "outputs agree" in r.stdout
    # never silent: each phase is announced on stderr (not a terminal here)
    assert "vtc-tvm: planning (VirtualTensorize) ..." in r.stderr and "vtc-tvm: building vtc (llvm): done" in r.stderr


def test_demo_json(capsys):
    assert demo.main(["--model", "shufflenet", "--target", "llvm", "--repeat", "1", "--json", "-q"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["agree"] and set(out["variants"]) == {"stock", "vtc"}
    assert out["variants"]["vtc"]["data_movement"] < out["variants"]["stock"]["data_movement"]


def test_demo_rejects_bad_arguments():
    r = _demo("--model", "resnet")
    assert r.returncode == ExitCode.USAGE and "invalid choice" in r.stderr.strip().splitlines()[-1]


def test_demo_reports_mismatch(monkeypatch, capsys):
    # A "VirtualTensorize" that drops the ReLUs changes the numbers: its own exit code, a clear message.
    real = transform.VirtualTensorize

    def dropping_relu(**kw):
        @tvm.transform.module_pass(opt_level=0, name="DropReLU")
        def drop_relu(mod, _ctx):
            main = relax.dpl.rewrite_call(is_op("relax.nn.relu")(wildcard()), lambda e, _: e.args[0], mod["main"])
            functions = dict(mod.functions_items())
            functions[mod.get_global_var("main")] = main
            return real(**kw)(tvm.IRModule(functions))  # a new module: the stock one must stay intact

        return drop_relu

    monkeypatch.setattr(transform, "VirtualTensorize", dropping_relu)
    assert demo.main(["--model", "shufflenet", "--target", "llvm", "--repeat", "1"]) == ExitCode.MISMATCH
    err = capsys.readouterr().err
    assert "error: MISMATCH: vtc disagrees with stock TVM: output 0:" in err
