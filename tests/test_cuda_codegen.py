"""Relax -> CUDA codegen works without a GPU, and nvcc (when present) accepts the source."""

import shutil

import pytest
import tvm
from tvm.script import ir as I, relax as R
from tvm.support import nvcc


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


def _find_module(mod, kind):
    """Depth-first search of the import tree (VM executable -> llvm host -> cuda device)."""
    if mod.kind == kind:
        return mod
    for sub in mod.imports:
        found = _find_module(sub, kind)
        if found is not None:
            return found
    return None


@pytest.fixture(scope="module")
def cuda_target():
    # A tag, not "cuda": plain "cuda" silently falls back to sm_50.
    return tvm.target.Target("nvidia/nvidia-h100")


@pytest.fixture(scope="module")
def cuda_source(cuda_target):
    ex = tvm.compile(TransposeMatmulAdd, target=cuda_target)
    cuda = _find_module(ex.mod, "cuda")
    assert cuda is not None, "no cuda module among the executable's imports"
    return cuda.inspect_source()


def test_cuda_source_generated(cuda_source):
    assert "__global__" in cuda_source


def test_nvcc_compiles_source(cuda_target, cuda_source):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH: CUDA source generated but not compiled")
    with cuda_target:  # compile_cuda reads Target.current() even when arch is given
        ptx = nvcc.compile_cuda(cuda_source, target_format="ptx", arch="sm_90", compiler="nvcc")
    assert b".entry" in ptx
