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


def test_pipeline_named_by_string_uses_the_compile_target():
    """``tvm.compile(mod, target, relax_pipeline="vtc")`` (a name, no target): TVM runs the
    pipeline under ``with target:``. On a GPU target every kernel must be scheduled for the
    device, as stock's ``"default"`` is; before, the kernels stayed unbound loops that TVM
    silently compiled for the host (a crash on the GPU). On the CPU it is the
    target-independent build, as stock's ``"default"``, and computes the right answer."""
    import numpy as np

    from vtc_tvm.report import device_source

    cuda = tvm.target.Target("nvidia/nvidia-h100")
    for name in ("vtc", "stock_vtc_schedules"):
        ex = tvm.compile(Tiny, target=cuda, relax_pipeline=name)
        source = device_source(ex, "cuda")
        assert "__global__" in source, f"{name}: no device kernel"
        assert "blockIdx" in source or "threadIdx" in source
    ex = tvm.compile(Tiny, target="llvm", relax_pipeline="vtc")
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((4, 8), dtype="float32"), rng.standard_normal((4, 16), dtype="float32")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w)).numpy()
    np.testing.assert_allclose(got, x.T @ w, rtol=1e-5, atol=1e-5)
