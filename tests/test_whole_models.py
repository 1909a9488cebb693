"""Whole ONNX models (benchmarks/whole_models.py) as a TVM user imports and compiles them.

Real size: the ONNX checker, strict shape inference, the output shapes and the published
parameter counts. Small size (same op structure): ``from_onnx`` (weights as constants, the
default) compiled by stock TVM and by the ``"vtc"`` pipeline on LLVM, both against onnxruntime
on fresh random inputs (relative L2 <= 1e-4), at a static batch and a symbolic one (``N``).
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import onnx
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import vtc_tvm  # noqa: F401  (registers the "vtc" pipeline)
from benchmarks import whole_models as WM

ort = pytest.importorskip("onnxruntime", reason="onnxruntime (the test extra) is the reference")

LLVM = tvm.target.Target("llvm")
NAMES = list(WM.WHOLE_MODELS)
OUTPUT = {"shufflenet_v2_whole": (1000,), "efficientvit_b1": (1000,), "yolo11n": (84, 8400)}
TOL = 1e-4

@functools.lru_cache(maxsize=None)
def _model(name, size, batch, seed=0):
    return WM.whole_model(name, size, batch, seed)


# ---- real size: cheap structural checks ------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_real_size_checks_and_parameter_count(name):
    model = _model(name, "real", 1)
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    out = inferred.graph.output[0].type.tensor_type.shape
    assert tuple(d.dim_value for d in out.dim) == (1,) + OUTPUT[name]
    assert WM.param_count(model) == WM.WHOLE_MODELS[name].published_params
    assert model.ByteSize() > 8 * 2 ** 20  # the weights are in the file (no external data)


def test_published_counts():
    """torchvision's and ultralytics' exact counts; EfficientViT-B1 is published as 9.1M."""
    counts = {n: m.published_params for n, m in WM.WHOLE_MODELS.items()}
    assert counts["shufflenet_v2_whole"] == 2_278_604  # torchvision ShuffleNet_V2_X1_0_Weights meta
    assert counts["yolo11n"] == 2_624_080  # "YOLO11n summary: ..., 2,624,080 parameters"
    assert round(counts["efficientvit_b1"] / 1e5) == 91  # "EfficientViT-B1 r224: 9.1M params"


def test_yolo_folded_count_is_ultralytics_fused_count():
    model = _model("yolo11n", "real", 1)
    folded = sum(int(np.prod(t.dims)) for t in model.graph.initializer if t.name.endswith((".weight", ".bias")))
    assert folded == 2_616_248  # "YOLO11n summary (fused): ..., 2,616,248 parameters"


@pytest.mark.parametrize("name", NAMES)
def test_symbolic_batch_stays_symbolic(name):
    """The batch is ``dim_param`` N in the file and a symbolic dim of ``main`` after import (ONNX's
    own shape inference loses the name at YOLO's Resize, so TVM's result is what is checked)."""
    model = _model(name, "small", "N")
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    ret = list(_import(model)["main"].ty.ret.shape)
    assert isinstance(ret[0], tvm.tirx.Var) and ret[0].name == "N"
    assert all(isinstance(d, tvm.tirx.IntImm) for d in ret[1:])


def _import(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # from_onnx's renaming notices
        return from_onnx(model)  # keep_params_in_input=False: weights are constants


def test_deterministic_from_seed(tmp_path):
    a = WM.whole_model("shufflenet_v2_whole", "small", 2, seed=3).SerializeToString()
    assert a == WM.whole_model("shufflenet_v2_whole", "small", 2, seed=3).SerializeToString()
    assert a != WM.whole_model("shufflenet_v2_whole", "small", 2, seed=4).SerializeToString()
    path = WM.write_model("shufflenet_v2_whole", str(tmp_path), "small", 2, seed=3)
    with open(path, "rb") as f:
        assert f.read() == a


def test_small_keeps_every_op_kind():
    """The small configuration has the real one's op types (only fewer of them)."""
    for name in NAMES:
        ops = lambda size: {n.op_type for n in _model(name, size, 1 if size == "real" else 2).graph.node}  # noqa: E731
        assert ops("small") == ops("real"), name


# ---- small size: TVM against onnxruntime ------------------------------------------------------
def _compile_and_compare(name, batch, pipeline):
    model = _model(name, "small", batch)
    feeds = WM.random_inputs(model, seed=np.random.randint(1 << 30), dims={"N": 3})
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    mod = _import(model)
    assert [p.name for p in mod["main"].params] == list(feeds)
    ex = tvm.compile(mod, LLVM, relax_pipeline=pipeline)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in feeds.values()]).numpy()
    assert out.shape == ref.shape
    err = np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref)
    assert err <= TOL, f"{name} batch {batch}: rel L2 {err:.2e}"


# Every model at a static batch; the symbolic batch of the larger two is covered by the vtc test
# below (also against onnxruntime), which keeps this file's compile time down.
@pytest.mark.parametrize("name, batch", [(n, 2) for n in NAMES] + [("shufflenet_v2_whole", "N")])
def test_stock_tvm_matches_onnxruntime(name, batch):
    _compile_and_compare(name, batch, relax.get_default_pipeline(LLVM))


@pytest.mark.slow
@pytest.mark.parametrize("name, batch", [
    ("shufflenet_v2_whole", 2),
    ("shufflenet_v2_whole", "N"),
    ("efficientvit_b1", 2),
    ("efficientvit_b1", "N"),
    ("yolo11n", "N"),
])
def test_vtc_pipeline_matches_onnxruntime(name, batch):
    _compile_and_compare(name, batch, relax.get_pipeline("vtc", target=LLVM))


# ---- CUDA: fp16 with a symbolic batch, as users export them ---------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_vtc_builds_fp16_with_a_symbolic_batch_for_cuda(name):
    """Each model in fp16 with its batch a ``dim_param``, through the "vtc" pipeline for CUDA:
    it builds (the source through nvcc where on PATH) and every kernel our schedule rules took
    computes on llvm, threads serial, what it was given (tests/schedule_semantics.py; WMMA
    kernels through their untensorized twins). Stock TVM 0.27's default CUDA pipeline raises on
    YOLO11n so (DLight's tensor-core schedule of an fp16 convolution of > 64 channels with a
    symbolic batch; ``vtc_tvm.schedules.fitted_tensor_core``)."""
    from vtc_tvm.pipeline import cuda_target, vtc_pipeline
    from tests.fuzz import cuda_build
    from tests.schedule_semantics import Recorder

    recorder = Recorder(cuda_target())
    cuda_build(_import(WM.whole_model(name, "small", "N", 0, "float16")),
               vtc_pipeline(cuda_target(), schedules=recorder.rules))
    problems, skipped = recorder.check()
    assert recorder.taken and not problems and not skipped
    if name == "yolo11n":
        assert "FittedTensorCoreGEMM" in {t.rule for t in recorder.taken}


# ---- the benchmark hook -----------------------------------------------------------------------
def test_benchmark_suite_registers_whole_models():
    from benchmarks import run

    assert run.SUITES["whole"] == NAMES
    wl = run.CASES["yolo11n"]
    cfg = wl.config("small", 2, "float32")
    mod = wl.build(cfg)
    (x,) = wl.inputs(mod, cfg, seed=1)
    assert x.shape == (2, 3, 128, 128) and wl.torch_forward is None
