"""vtc_tvm.schedules.NarrowGEMM: which kernels it takes (GEMMs and dense convolutions with few
output channels), that its tile is fitted to them where DLight's is 64 channels wide, that the
schedules compute the same function with float32 sums (on llvm with the thread loops serial),
compile to CUDA with nvcc, and that a pipeline launches as many kernels with it as without."""

import re

import pytest
import tvm
from tvm import relax
from tvm.s_tir import dlight as dl
from tvm.s_tir.analysis import verify_well_formed

import vtc_tvm.schedules as S
from vtc_tvm.pipeline import cuda_target, vtc_pipeline
from vtc_tvm.schedules.narrow_gemm import MICRO, THREADS, fitted_config, starves_the_gpu
from tests.conftest import (allocated_buffers, assert_float32_sums, assert_nvcc_compiles, assert_same_on_llvm,
                            conv_kernel, cuda_source_of, fused_kernels)
from tests.fuzz import cuda_sources

TARGET = cuda_target()
RULE = S.NarrowGEMM()


def dense(C, cin, k=3, stride=1, H=20, **kw):
    return lambda dtype: conv_kernel(C, k, stride, groups=1, cin=cin, H=H, dtype=dtype, **kw)


def matmul(m, k, n):
    def make(dtype):
        x = relax.Var("x", relax.TensorType((m, k), dtype))
        w = relax.Var("w", relax.TensorType((k, n), dtype))
        (func,) = fused_kernels(lambda bb, x, w: relax.op.matmul(x, w), [x, w])
        return func
    return make


TAKEN = {  # name -> (kernel of dtype, output channels J)
    "3x3 16 -> 8 (a YOLO11n bottleneck)": (dense(8, 16), 8),
    "3x3 8 -> 16": (dense(16, 8), 16),
    "1x1 32 -> 32 + bias + relu": (dense(32, 32, k=1), 32),
    "RGB stem 3 -> 16, stride 2": (dense(16, 3, stride=2, H=40), 16),
    "1x1 6 -> 10, no epilogue (a tile of 12)": (dense(10, 6, k=1, bias=False, relu=False), 10),
    "matmul 512 x 40 @ 40 x 24": (matmul(512, 40, 24), 24),
}


def _schedule(func, rule=RULE, target=TARGET):
    with target:
        sch = rule.apply(func, target, False)
    return None if sch is None else sch.mod["main"]


def _shared_shapes(func) -> list:
    """The shapes of the shared-memory buffers a schedule stages its operands in."""
    return sorted([int(d) for d in buf.shape] for buf in allocated_buffers(func) if buf.scope() == "shared")


@pytest.mark.parametrize("name", list(TAKEN))
def test_takes_narrow_gemms_and_sums_in_float32(name):
    make, _ = TAKEN[name]
    scheduled = _schedule(make("float16"))
    assert scheduled is not None and verify_well_formed(scheduled)
    assert_float32_sums(make, scheduled)


@pytest.mark.parametrize("name", list(TAKEN))
def test_tile_fits_the_columns_where_dlight_pads_to_64(name):
    """Both stage the operands in shared memory padded to their tile: DLight's second operand
    (the weights) has 64 rows, ours the output channels rounded up to MICRO."""
    make, cols = TAKEN[name]
    func = make("float16")
    with TARGET:
        stock = dl.gpu.Matmul().apply(func, TARGET, False).mod["main"]
    fitted = -(-cols // MICRO) * MICRO
    assert 64 in {s[1] for s in _shared_shapes(stock)}
    ours = {s[1] for s in _shared_shapes(_schedule(func))}
    assert fitted in ours and 64 not in ours


@pytest.mark.parametrize("cols", [1, 3, 8, 10, 16, 24, 32])
def test_fitted_config(cols):
    config = fitted_config(cols, 72)
    assert config.block_size_y * config.micro_size_y >= cols > (config.block_size_y - 1) * config.micro_size_y
    assert THREADS // 2 < config.block_size_x * config.block_size_y <= THREADS
    assert config.block_size_x & (config.block_size_x - 1) == 0  # a power of two
    assert fitted_config(cols, 8).micro_size_k == 8 and config.micro_size_k == 16


def test_symbolic_batch_is_taken_and_runs():
    func = conv_kernel(16, 3, 1, groups=1, cin=8, N="n", H=12)
    scheduled = _schedule(func)
    assert scheduled is not None
    assert_same_on_llvm(func, scheduled, dims={"n": 3}, tol=2.0 ** -8)


@pytest.mark.parametrize("make,why", [
    (dense(64, 48, k=1), "64 output channels: DLight's 64-wide tile fits"),
    (dense(40, 16), "40 > max_cols: DLight's padding wastes under half"),
    (lambda dtype: conv_kernel(16, 3, 1, groups=1, cin=8, N=1, H=8, dtype=dtype), "64 output pixels < min_rows"),
    (lambda dtype: conv_kernel(16, 3, 1, dtype=dtype), "a depthwise conv is no GEMM (WindowReduction's)"),
    (matmul(1, 256, 16), "a GEMV: one row"),
])
def test_declines(make, why):
    assert _schedule(make("float16")) is None, why


@pytest.mark.parametrize("cols,cin,k", [(8, 16, 3), (16, 8, 3), (32, 32, 1)])
def test_leaves_dlight_the_grids_its_tile_would_starve(cols, cin, k):
    """C3k2's three narrow convolutions at 160 x 160 (limit 6): one image gives this tile 100 to
    400 blocks where DLight's 32-row tile gives 800 (fewer than 4 an SM on 132 SMs against
    more), declined; 16 images give 1600 to 6400, taken (measured on an H100, session 22)."""
    assert starves_the_gpu(25600, fitted_config(cols, cin * k * k), TARGET)
    assert _schedule(dense(cols, cin, k=k, H=160, N=1)("float16")) is None
    assert _schedule(dense(cols, cin, k=k, H=160, N=16)("float16")) is not None


def test_declines_softmax_and_cpu_targets():
    x = relax.Var("x", relax.TensorType((64, 32), "float16"))
    (softmax,) = fused_kernels(lambda bb, x: relax.op.nn.softmax(x), [x])
    assert _schedule(softmax) is None
    assert _schedule(dense(16, 8)("float16"), target=tvm.target.Target("llvm")) is None


def test_cuda_source_compiles_with_nvcc():
    funcs = [_schedule(make("float16")) for make, _ in TAKEN.values()]
    funcs.append(_schedule(conv_kernel(16, 3, 1, groups=1, cin=8, N="n", H=12)))
    src = cuda_source_of(funcs, TARGET)
    assert len(re.findall(r"__global__[^;{]*\{", src)) == len(funcs)  # kernels defined
    assert_nvcc_compiles(src, TARGET)


@pytest.mark.slow
def test_yolo_c3k2_launches_as_many_kernels_with_the_rule():
    """The YOLO11n C3k2 block at batch 16 through the "vtc" pipeline, our rules against DLight's
    alone: the same kernels, and the rule took the block's narrow convolutions (8, 16 and 32
    channels; at batch 1 or 2 limit 6 leaves DLight some of them)."""
    from benchmarks.workloads import WORKLOADS

    taken = []

    class Recording(S.NarrowGEMM):
        def apply(self, func, target, tunable):
            sch = super().apply(func, target, tunable)
            if sch is not None:
                taken.append(func)
            return sch

    rules = [S.Guarded(Recording()) if isinstance(S.unguarded(r), S.NarrowGEMM) else r for r in S.default_rules(TARGET)]
    wl = WORKLOADS["yolo_c3k2"]
    mod = wl.build(wl.config("real", 16, "float16"))
    kernels = {}
    for name, schedules in (("ours", rules), ("dlight", "dlight")):
        src = cuda_sources(tvm.compile(mod, target=TARGET, relax_pipeline=vtc_pipeline(TARGET, schedules=schedules)))
        kernels[name] = len(re.findall(r"__global__[^;{]*\{", src))
    assert kernels["ours"] == kernels["dlight"] > 0
    assert len(taken) == 3
