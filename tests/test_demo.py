"""`python -m vtc_tvm.demo` end to end, as a user runs it."""

import subprocess
import sys

import pytest
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from vtc_tvm import demo, pipeline


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


def test_demo_rejects_bad_arguments():
    r = _demo("--model", "resnet")
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_demo_reports_mismatch(monkeypatch, capsys):
    # A "vtc" pipeline that drops the ReLUs changes the numbers: exit code 1 and a clear message.
    real_pipeline = pipeline.vtc_pipeline

    @tvm.transform.module_pass(opt_level=0, name="DropReLU")
    def drop_relu(mod, _ctx):
        main = relax.dpl.rewrite_call(is_op("relax.nn.relu")(wildcard()), lambda e, _: e.args[0], mod["main"])
        functions = dict(mod.functions_items())
        functions[mod.get_global_var("main")] = main
        return tvm.IRModule(functions)  # a new module: the stock one must stay intact

    monkeypatch.setattr(pipeline, "vtc_pipeline",
                        lambda target, **kw: tvm.transform.Sequential([drop_relu, real_pipeline(target, **kw)]))
    assert demo.main(["--model", "shufflenet", "--target", "llvm", "--repeat", "1"]) == 1
    assert "MISMATCH" in capsys.readouterr().err
