"""The paper workloads as ONNX models (benchmarks/onnx_models.py), imported with ``from_onnx``.

Small float32 configs on LLVM. For every workload: the model is valid ONNX with its weights as
graph inputs; onnxruntime on it == the Relax builder compiled by stock TVM; the imported module
compiled with the ``"vtc"`` pipeline == onnxruntime; and VirtualTensorize removes exactly as many
data-movement kernels from the imported module as from the Relax builder's module.
"""

import collections
import functools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from tvm import relax

from benchmarks.onnx_models import EXTRA_MODELS, ONNX_BUILDERS, OPSET, onnx_model, onnx_module, small_path
from benchmarks.workloads import WORKLOADS
from vtc_tvm import VirtualTensorize
from vtc_tvm.pipeline import vtc_pipeline
from vtc_tvm.report import kernel_census, run_vm

TARGET = tvm.target.Target("llvm")
NAMES = sorted(ONNX_BUILDERS)
# Relax data-movement ops whose counts must agree between the builder and the import. The
# importer emits ONNX Pad (constant mode) as a TOPI ``call_tir`` to ``pad``, not relax.nn.pad.
_MOVEMENT = {"relax.permute_dims", "relax.reshape", "relax.strided_slice", "relax.split", "relax.concat",
             "relax.expand_dims", "relax.broadcast_to", "relax.nn.pad"}
# Data-movement kernels of stock TVM (after fusion) on the small configs.
STOCK_DM = {"llama_decode": 4, "llama_prefill": 4, "gemma2_decode": 4, "effvit_attn": 2, "yolo_c3k2": 2,
            "shufflenet_unit": 2, "shufflenet_v2": 5}
# VirtualTensorize leaves every shuffle of the whole ShuffleNetV2 physical: its consumers are
# 1x1 convolutions and the contiguity strategy refuses short unit-stride runs (builder and ONNX).
NO_REDUCTION = {"shufflenet_v2"}


@functools.cache
def _case(name):
    wl = WORKLOADS[name]
    cfg = wl.config("small")
    model = onnx_model(name, cfg)
    return wl, cfg, wl.build(cfg), model, onnx_module(name, cfg, model)


def _ort(model, arrays):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: a for i, a in zip(model.graph.input, arrays)})


def _close(got, want, rtol=1e-4):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert np.isfinite(g).all() and np.abs(w).max() > 0
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * float(np.abs(w).max()))


def _params(mod):
    return [(p.name, tuple(int(d) for d in p.ty.shape), str(p.ty.dtype)) for p in mod["main"].params]


def _movement_ops(mod):
    counts = collections.Counter()

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op):
            name = e.op.name
            if name == "relax.call_tir" and e.args[0].name_hint == "pad":
                name = "relax.nn.pad"
            if name in _MOVEMENT:
                counts[name] += 1

    relax.analysis.post_order_visit(mod["main"], visit)
    return counts


@pytest.mark.parametrize("name", NAMES)
def test_model_is_valid_onnx_with_weights_as_inputs(name):
    _, _, builder, model, imported = _case(name)
    onnx.checker.check_model(model, full_check=True)
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [OPSET]
    # Every float tensor is a graph input named like the builder's parameter; initializers are
    # int64 shapes/indices or float scalars only.
    assert [(i.name, tuple(d.dim_value for d in i.type.tensor_type.shape.dim)) for i in model.graph.input] \
        == [(n, s) for n, s, _ in _params(builder)]
    for t in model.graph.initializer:
        assert t.data_type == onnx.TensorProto.INT64 or len(t.dims) == 0, t.name
    assert _params(imported) == _params(builder)
    # Op for op: the imported module has the builder's data-movement ops, no more, no fewer.
    assert _movement_ops(imported) == _movement_ops(builder)
    assert sum(_movement_ops(builder).values()) > 0


@pytest.mark.parametrize("name", NAMES)
def test_committed_small_model_is_current(name):
    """benchmarks/onnx/<name>_small.onnx is what ``python -m benchmarks.onnx_models`` writes."""
    _, _, _, model, _ = _case(name)
    assert onnx.load(small_path(name)) == model


@pytest.mark.parametrize("name", NAMES)
def test_onnxruntime_matches_relax_builder_on_stock_tvm(name):
    wl, cfg, builder, model, _ = _case(name)
    arrays = wl.inputs(builder, cfg, seed=11)
    ex = tvm.compile(builder, target=TARGET, relax_pipeline=relax.get_default_pipeline(TARGET))
    _close(run_vm(ex, tvm.cpu(), arrays), _ort(model, arrays))


@pytest.mark.parametrize("name", NAMES)
def test_imported_module_on_vtc_pipeline_matches_onnxruntime(name):
    wl, cfg, _, model, imported = _case(name)
    arrays = wl.inputs(imported, cfg, seed=12)  # the imported main's params drive the inputs
    ex = tvm.compile(imported, target=TARGET, relax_pipeline=vtc_pipeline(TARGET))
    _close(run_vm(ex, tvm.cpu(), arrays), _ort(model, arrays))


@pytest.mark.parametrize("name", NAMES)
def test_virtual_tensorize_removes_data_movement_from_imported_module(name):
    _, _, builder, _, imported = _case(name)
    census, decisions = {}, {}
    for source, mod in (("builder", builder), ("onnx", imported)):
        report = []
        census[source] = (kernel_census(mod, TARGET)["data_movement"],
                          kernel_census(VirtualTensorize(target=TARGET, report=report)(mod), TARGET,
                                        stores=True)["data_movement"])
        # The edges left physical, with the reason (tensor names differ between the two paths).
        decisions[source] = sorted((d["consumer"], d["reason"]) for d in report if not d["virtual"])
    stock, vtc = census["onnx"]
    assert stock == STOCK_DM[name]
    assert census["onnx"] == census["builder"]  # no gap between the ONNX path and the builder
    assert decisions["onnx"] == decisions["builder"]
    if name in NO_REDUCTION:
        # The load side takes none of these edges (below); the store side may still remove a copy
        # (shufflenet_v2: a channel shuffle after a concat stored through its inverse, 5 -> 4).
        assert vtc <= stock
        assert decisions["onnx"] and all(c == "conv2d" and "unit-stride run" in r for c, r in decisions["onnx"])
    else:
        assert vtc < stock


def test_real_configs_import_with_builder_params():
    """The real (GPU) configs in float16: valid models whose imported main matches the builder."""
    for name in NAMES:
        wl = WORKLOADS[name]
        cfg = wl.config("real", 1, "float16")
        mod = onnx_module(name, cfg)  # raises unless main's params equal the builder's
        assert all(dt == "float16" for _, _, dt in _params(mod))


def test_empty_kv_cache_is_a_static_zero_size_input():
    """llama_prefill's cache has 0 rows: the import keeps it static (from_onnx alone would make
    the dim symbolic, since ONNX dim_value 0 reads as unknown)."""
    _, cfg, _, _, imported = _case("llama_prefill")
    assert cfg.ctx == 0
    past_k = next(p for p in imported["main"].params if p.name == "past_k")
    assert [int(d) for d in past_k.ty.shape] == [cfg.batch, cfg.kv_heads, 0, cfg.head_dim]


def test_unknown_workload_is_a_clear_error():
    with pytest.raises(KeyError, match="no ONNX model for 'resnet'"):
        onnx_model("resnet", None)


@pytest.mark.parametrize("name", sorted(EXTRA_MODELS))
def test_model_without_a_workload_twin_is_current_and_matches_onnxruntime(name):
    """A shipped model with no Relax builder (the BERT encoder): the committed file is what
    ``python -m benchmarks.onnx_models`` writes, and stock TVM's import of it, built by stock TVM
    and by the ``"vtc"`` pipeline, computes what onnxruntime does on random inputs."""
    from vtc_tvm.onnx_import import load_onnx

    model = EXTRA_MODELS[name]()
    assert onnx.load(small_path(name)) == model
    onnx.checker.check_model(model, full_check=True)
    rng = np.random.default_rng(13)
    arrays = [(rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]) * 0.2).astype("float32")
              for i in model.graph.input]
    want = _ort(model, arrays)
    mod = load_onnx(model)
    for pipeline in (relax.get_default_pipeline(TARGET), vtc_pipeline(TARGET)):
        ex = tvm.compile(mod, target=TARGET, relax_pipeline=pipeline)
        _close(run_vm(ex, tvm.cpu(), arrays), want)
