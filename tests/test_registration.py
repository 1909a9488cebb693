"""vtc_tvm plugs into TVM's registries: pass, global function, pipeline, entry point."""

import os
import subprocess
import sys
from importlib.metadata import entry_points

import tvm
import vtc_tvm  # noqa: F401  (registration happens on import)
from tvm import relax
from tvm.script import ir as I, relax as R


@I.ir_module
class Tiny:
    @R.function
    def main(x: R.Tensor((4, 8), "float32"), w: R.Tensor((4, 16), "float32")):
        with R.dataflow():
            y = R.matmul(R.permute_dims(x), w)
            R.output(y)
        return y


def test_pass_exposed_in_relax_transform():
    assert isinstance(relax.transform.VirtualTensorize(), tvm.transform.Pass)
    from tvm.relax.transform import VirtualTensorize  # the import form works too

    assert VirtualTensorize is vtc_tvm.VirtualTensorize


def test_global_func_registered():
    factory = tvm.get_global_func("transform.VirtualTensorize", allow_missing=True)
    assert factory is not None
    assert isinstance(factory(), tvm.transform.Pass)


def test_required_resolves_by_name():
    # Sequential looks each required name up as the global func "transform.<name>" and runs it first.
    vt_name = relax.transform.VirtualTensorize().info.name
    seen = []

    @tvm.instrument.pass_instrument
    class Record:
        def run_before_pass(self, mod, info):
            seen.append(info.name)

    @tvm.transform.module_pass(opt_level=0, name="NeedsVT", required=["VirtualTensorize"])
    def needs_vt(mod, ctx):
        return mod

    with tvm.transform.PassContext(instruments=[Record()]):
        out = tvm.transform.Sequential([needs_vt])(Tiny)
    assert isinstance(out, tvm.IRModule)
    assert vt_name in seen and seen.index(vt_name) < seen.index("NeedsVT"), seen


def test_pipeline_registered():
    assert isinstance(relax.get_pipeline("vtc", target=tvm.target.Target("llvm")), tvm.transform.Pass)


def test_entry_point_declared():
    eps = {ep.name: ep.value for ep in entry_points(group="tvm.backends")}
    assert eps.get("vtc_tvm") == "vtc_tvm:_autoload", "reinstall with `pip install -e .` (./vtc test does)"


def test_autoload_on_plain_import_tvm():
    # A fresh interpreter that never imports vtc_tvm still gets the pass, via the entry point.
    env = {k: v for k, v in os.environ.items() if k != "TVM_DEVICE_BACKEND_AUTOLOAD"}
    code = "import tvm; assert hasattr(tvm.relax.transform, 'VirtualTensorize')"
    proc = subprocess.run([sys.executable, "-c", code],
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
