"""Vectorised schedules for the copy kernels that stay (GPU targets; codegen only here)."""

from __future__ import annotations

import pytest
import tvm
from tvm import relax

from vtc_tvm.copy_schedule import ScheduleCopies, schedule_copy, vector_lanes
from vtc_tvm.pipeline import cuda_target, vtc_pipeline
from vtc_tvm.report import device_source
from vtc_tvm.rules import get_rule

R = relax.op
F16 = "float16"


def _mapping(op, *shapes, dtype=F16):
    xs = [relax.Var(f"x{i}", relax.TensorType(s, dtype)) for i, s in enumerate(shapes)]
    call = relax.BlockBuilder().normalize(op(*xs))
    return get_rule(call.op.name)(call).mapping


@pytest.mark.parametrize("op, shapes, lanes", [
    (lambda a, b: R.concat((a, b), axis=2), [(2, 3, 40, 128), (2, 3, 1, 128)], 8),  # KV cache append
    (lambda a: R.permute_dims(a, [0, 2, 1, 3]), [(2, 4, 6, 64)], 8),                  # head transpose
    (lambda a: R.strided_slice(a, [1], [8], [40]), [(3, 48)], 8),                       # aligned start
    (lambda a: R.strided_slice(a, [1], [4], [36]), [(3, 48)], 4),                       # 8-byte aligned
    (lambda a: R.strided_slice(a, [1], [3], [35]), [(3, 48)], 1),                       # misaligned
    (lambda a, b: R.concat((a, b), axis=1), [(4, 24), (4, 8)], 1),                      # piece changes inside a row
    (lambda a: R.permute_dims(a), [(16, 64)], 1),                                       # strided inner axis
    (lambda a: R.nn.pad(a, [1, 2, 0, 0]), [(4, 56)], 8),                                # pad of whole rows
    (lambda a: R.nn.pad(a, [0, 0, 8, 0]), [(4, 56)], 1),                                # padding inside a row
])
def test_vector_lanes_only_where_proven(op, shapes, lanes):
    assert vector_lanes(_mapping(op, *shapes)) == lanes


def test_fp32_vectors_are_four_wide():
    assert vector_lanes(_mapping(lambda a: R.permute_dims(a, [1, 0, 2]), (4, 6, 32), dtype="float32")) == 4


def _module(op, *shapes):
    xs = [relax.Var(f"x{i}", relax.TensorType(s, F16)) for i, s in enumerate(shapes)]
    bb = relax.BlockBuilder()
    with bb.function("main", xs):
        with bb.dataflow():
            out = bb.emit_output(op(*xs))
        bb.emit_func_output(out)
    return bb.get()


def test_kv_cache_append_moves_16_bytes_per_thread():
    target = cuda_target()
    mod = _module(lambda a, b: R.concat((a, b), axis=2), (16, 8, 512, 128), (16, 8, 1, 128))
    src = device_source(tvm.compile(mod, target=target, relax_pipeline=vtc_pipeline(target)))
    assert "uint4" in src and "__launch_bounds__(256)" in src
    stock = device_source(tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target)))
    assert "uint4" not in stock  # DLight's Fallback: one element per thread


def test_unaligned_copy_is_left_to_dlight():
    target = cuda_target()
    mod = _module(lambda a: R.strided_slice(a, [1], [3], [35]), (64, 48))
    with target:
        fused = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                                          relax.transform.FuseOps(), relax.transform.FuseTIR()])(mod)
        out = ScheduleCopies(target)(fused)
    funcs = [f for _, f in out.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert funcs and not any("tirx.is_scheduled" in (f.attrs or {}) for f in funcs)
    assert schedule_copy(funcs[0], tvm.target.Target("llvm")) is None  # GPU targets only


def test_store_side_copy_into_a_grown_cache_is_vectorised():
    """The past rows of a grown cache whose new row the producer stores straight into it: the
    store side's ``vtc_copy_into`` (a box of a larger output, not an index copy) moves 16 bytes
    a thread, not DLight's one element (231 against 61 us for a 134 MB cache on the H200)."""
    target = cuda_target()

    def grow(past, x, w):
        new = R.permute_dims(R.reshape(R.matmul(x, w), (4, 1, 2, 64)), [0, 2, 1, 3])
        return R.concat((past, new), axis=2)

    mod = _module(grow, (4, 2, 32, 64), (4, 1, 256), (256, 128))
    src = device_source(tvm.compile(mod, target=target, relax_pipeline=vtc_pipeline(target)))
    into = [k for k in src.split('extern "C" __global__ void ')[1:] if "vtc_copy_into_kernel(" in k.split("{")[0]]
    assert into and all("uint4" in k for k in into if "{" in k)  # (declarations have no body)
