"""Vectorised schedules for the copy kernels that stay (GPU targets; codegen only here)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import numpy as np
import pytest
import tvm
from tvm import relax

from tests.conftest import run_llvm, serial_threads
from vtc_tvm.analysis import _non_root_blocks
from vtc_tvm.copy_schedule import ScheduleCopies, _piecewise_lanes, schedule_copy, schedule_piecewise, vector_lanes
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
    # contiguous in memory, but a vector would cross rows of 5: its indices are no ramps (fuzz
    # case_b4e1c0f1a7: TVM's CUDA code generator printed the int32x8 index arithmetic wrongly)
    (lambda a: R.flatten(a), [(4, 4, 8, 5)], 1),
    (lambda a: R.flatten(a), [(4, 4, 8, 16)], 8),                                       # rows of 16: ramps
    (lambda a: R.reshape(a, (2, 64)), [(2, 4, 16)], 8),
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


# -- a grown cache whose new row is computed in the same kernel (schedule_piecewise) -----------
def _rope(t, cos, sin, half):
    rotated = R.concat((R.negative(R.strided_slice(t, [3], [half], [2 * half])),
                        R.strided_slice(t, [3], [0], [half])), axis=3)
    return R.add(R.multiply(t, cos), R.multiply(rotated, sin))


def _grow_with_rope(past, x, cos, sin, dtype=F16):
    """``concat(past, rope(x as heads))`` along the sequence: Llama's K cache, grown."""
    b, h, _, d = (int(v) for v in past.ty.shape)
    new = R.permute_dims(R.reshape(x, (b, 1, h, d)), [0, 2, 1, 3])
    if dtype != F16:  # rope in float32, the cache in float16 (a conversion along the row)
        new = R.astype(_rope(R.astype(new, dtype), R.astype(cos, dtype), R.astype(sin, dtype), d // 2), F16)
    else:
        new = _rope(new, cos, sin, d // 2)
    return R.concat((past, new), axis=2)


def _fused_kernels(mod, target):
    with target:
        fused = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                                          relax.transform.FuseOps(), relax.transform.FuseTIR()])(mod)
    return [f for _, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]


ROPE_SHAPES = [(2, 2, 40, 64), (2, 1, 128), (1, 1, 1, 64), (1, 1, 1, 64)]


def test_rope_into_a_grown_cache_moves_16_bytes_per_thread():
    """The K cache's kernel (past rows copied, the new row's rope computed) loads and stores
    16 bytes a thread; DLight's Fallback gave it one element (248 against 61 us on the H200 for
    the Llama-3-8B cache at batch 16). The source must compile: TVM prints an 8-lane gather as
    an 8-argument ``make_uint4`` of element loads, which nvcc rejects, so the clamped index of the rotated half is
    simplified under its branch first."""
    target = cuda_target()
    mod = _module(_grow_with_rope, *ROPE_SHAPES)
    src = device_source(tvm.compile(mod, target=target, relax_pipeline=vtc_pipeline(target)))
    (kernel,) = [k for k in src.split('extern "C" __global__ void ')[1:] if "concat" in k.split("{")[0] and "{" in k]
    assert "*(uint4*)(x0_ptr" in kernel  # the past rows: 16-byte loads
    assert "_ptr[" not in kernel  # no element-wise loads (a gather) anywhere
    if shutil.which("nvcc"):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "k.cu")
            with open(path, "w") as f:
                f.write(src)
            done = subprocess.run(["nvcc", "--ptx", "-arch", "sm_90", "-U__CUDA_NO_HALF_OPERATORS__",
                                   "-U__CUDA_NO_HALF_CONVERSIONS__", "-o", os.path.join(tmp, "k.ptx"), path],
                                  capture_output=True, text=True)
            assert done.returncode == 0, done.stderr[-2000:]


def test_piecewise_schedule_preserves_semantics():
    """The scheduled kernel, threads serial, on llvm: equal to the unscheduled one, bit for bit."""
    (func,) = [f for f in _fused_kernels(_module(_grow_with_rope, *ROPE_SHAPES), cuda_target())
               if schedule_piecewise(f, cuda_target()) is not None]
    rng = np.random.default_rng(0)
    arrays = [rng.uniform(-1, 1, [int(s) for s in p.shape]).astype(str(p.dtype)) for p in func.params]
    want = run_llvm(func, [a.copy() for a in arrays])
    got = run_llvm(serial_threads(schedule_piecewise(func, cuda_target())), [a.copy() for a in arrays])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("build, why", [
    (lambda past, x, cos, sin: R.concat((past, R.multiply(x, x)), axis=3), "pieces change inside a row"),
    (lambda past, x, cos, sin: _grow_with_rope(past, x, cos, sin, dtype="float32"), "a conversion along the row"),
    (lambda past, x, cos, sin: R.concat((past, R.multiply(R.permute_dims(x, [0, 1, 3, 2]), cos)), axis=2),
     "a strided load along the row"),
])
def test_piecewise_schedule_declines(build, why):
    shapes = {"pieces change inside a row": [(2, 2, 8, 64), (2, 2, 8, 8), (1,), (1,)],
              "a conversion along the row": ROPE_SHAPES,
              "a strided load along the row": [(2, 2, 40, 64), (2, 2, 64, 1), (1, 1, 1, 64), (1,)]}[why]
    funcs = _fused_kernels(_module(build, *shapes), cuda_target())
    assert funcs and all(schedule_piecewise(f, cuda_target()) is None for f in funcs), why
    # declined for the reason named: the concatenation's copy piece itself qualifies
    looks = [_piecewise_lanes(_non_root_blocks(f)[-1], loads_checked=False) for f in funcs]
    assert max(looks) == (1 if why == "pieces change inside a row" else 8), why
