"""Relax -> CUDA codegen works without a GPU, and nvcc (when present) accepts the source."""

import shutil

import pytest
import tvm
from tvm.script import ir as I, relax as R
from tvm.support import nvcc

from vtc_tvm.report import device_source


@I.ir_module
class TransposeMatmulAdd:
    @R.function
    def main(
        x: R.Tensor((128, 64), "float32"),
        w: R.Tensor((128, 256), "float32"),
        b: R.Tensor((256,), "float32"),
    ):
        with R.dataflow():
            xt = R.permute_dims(x)
            y = R.add(R.matmul(xt, w), b)
            R.output(y)
        return y


@pytest.fixture(scope="module")
def cuda_target():
    # A tag, not "cuda": plain "cuda" silently falls back to sm_50.
    return tvm.target.Target("nvidia/nvidia-h100")


@pytest.fixture(scope="module")
def cuda_source(cuda_target):
    ex = tvm.compile(TransposeMatmulAdd, target=cuda_target)
    source = device_source(ex, "cuda")
    assert source, "no cuda module among the executable's imports"
    return source


def test_cuda_source_generated(cuda_source):
    assert "__global__" in cuda_source


def test_nvcc_compiles_source(cuda_target, cuda_source):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH: CUDA source generated but not compiled")
    with cuda_target:  # compile_cuda reads Target.current() even when arch is given
        ptx = nvcc.compile_cuda(cuda_source, target_format="ptx", arch="sm_90", compiler="nvcc")
    assert b".entry" in ptx


@pytest.mark.parametrize("model", ["llama", "shufflenet"])
def test_vtc_pipeline_compiles_real_models_for_cuda(model):
    """The "vtc" pipeline (load side, store side, DLight checks) builds the real-size built-in
    models for the H100/H200 target, and removes copy kernels there too."""
    from tvm import relax

    from vtc_tvm.models import build_model
    from vtc_tvm.pipeline import cuda_target
    from vtc_tvm.report import kernel_census
    from vtc_tvm.transform import VirtualTensorize

    target = cuda_target()
    mod = build_model(model, "real", dtype="float16")
    ex = tvm.compile(mod, target=target, relax_pipeline=relax.get_pipeline("vtc", target=target))
    assert "__global__" in device_source(ex, "cuda")
    stock = kernel_census(mod, target)
    vtc = kernel_census(VirtualTensorize(target=target)(mod), target, stores=True)
    assert vtc["data_movement"] < stock["data_movement"]
    assert vtc["planned_bytes"] < stock["planned_bytes"]
