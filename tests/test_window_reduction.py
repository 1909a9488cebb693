"""vtc_tvm.schedules.WindowReduction: which kernels it takes (depthwise convolutions, pooling
windows), that its schedules are well-formed, compute the same function (on llvm with the
thread loops serial, as tests/test_schedules.py does), compile to CUDA with nvcc, and that the
pipelines launch as many kernels with it as without."""

import re

import pytest
import tvm
from tvm import relax
from tvm.s_tir.analysis import verify_well_formed

from tvm.script import tirx as T

import vtc_tvm.schedules as S
from vtc_tvm.pipeline import cuda_target, vtc_pipeline
from vtc_tvm.scratch import check_scratch
from vtc_tvm.schedules import batched_gemv
from tests.conftest import (assert_float32_sums, assert_nvcc_compiles, assert_same_on_llvm, conv_kernel as conv,
                            cuda_source_of, fused_kernels)
from tests.fuzz import cuda_sources

TARGET = cuda_target()
RULE = S.WindowReduction()


def pool(kind="max", k=3, stride=2, C=64, H=28, dtype="float16"):
    x = relax.Var("x", relax.TensorType((2, C, H, H), dtype))
    op = relax.op.nn.max_pool2d if kind == "max" else relax.op.nn.avg_pool2d
    (func,) = fused_kernels(lambda bb, x: op(x, (k, k), (stride, stride), (k // 2,) * 4), [x])
    return func


def _schedule(func, rule=RULE, target=TARGET):
    with target:
        sch = rule.apply(func, target, False)
    return None if sch is None else sch.mod["main"]


TAKEN = {  # name -> kernel of dtype
    "dw3x3 s2 + bias + relu": lambda dtype: conv(dtype=dtype),
    "dw3x3 s1, no epilogue": lambda dtype: conv(stride=1, bias=False, relu=False, dtype=dtype),
    "dw5x5 + bias": lambda dtype: conv(C=64, k=5, stride=1, relu=False, dtype=dtype),
    "max pool 3x3": lambda dtype: pool("max", dtype=dtype),
    "avg pool 3x3": lambda dtype: pool("avg", dtype=dtype),
    # EfficientViT's grouped 1x1 conv: 8 input channels a group, over a unit window (legalized
    # group_conv2d_nchw keeps its 1x1 window axes; a dense conv2d_nchw of 1x1 drops them)
    "grouped 1x1, 8 channels a group": lambda dtype: conv(C=96, k=1, stride=1, groups=12, relu=False, dtype=dtype),
}


@pytest.mark.parametrize("name", list(TAKEN))
def test_takes_windows_and_preserves_semantics(name):
    """Scheduled (threads serial) against the kernel as FuseTIR wrote it, both in fp16, and both
    against the same kernel in float32: ours sums in a float32 register, so it is at least as
    close to the float32 result as the unscheduled fp16 kernel, up to one fp16 rounding."""
    scheduled = _schedule(TAKEN[name]("float16"))
    assert scheduled is not None and verify_well_formed(scheduled)
    assert_float32_sums(TAKEN[name], scheduled)


@pytest.mark.parametrize("name", list(TAKEN))
def test_takes_only_what_dlight_leaves_to_its_reduction_rules(name):
    """What this rule takes, DLight's Matmul (the implicit-GEMM tiling of dense convolutions)
    would not: the rule replaces GeneralReduction's one-output-a-block (or Fallback's) schedule."""
    from tvm.s_tir import dlight as dl

    func = TAKEN[name]("float16")
    with TARGET:
        assert dl.gpu.Matmul().apply(func, TARGET, False) is None


def test_one_thread_an_output_element_in_one_kernel():
    """The epilogue runs in the same thread on the register (one kernel, no cross-thread sums),
    and the grid covers the outputs: 2 x 116 x 14 x 14 elements, 256 a block."""
    src = cuda_source_of([_schedule(conv())], TARGET)
    assert len(re.findall(r"__global__[^;{]*\{", src)) == 1  # one kernel defined
    assert "__syncthreads" not in src and "__shfl" not in src
    assert "float" in src  # the float32 accumulator


def test_symbolic_batch_is_taken_and_runs():
    func = conv(N="n", C=32, H=12)
    scheduled = _schedule(func)
    assert scheduled is not None
    assert_same_on_llvm(func, scheduled, dims={"n": 3})


@pytest.mark.parametrize("make,why", [
    (lambda: conv(C=32, groups=1), "a dense 3x3 conv sums 32 x 9 = 288 terms an output"),
    (lambda: conv(C=16, cin=3, groups=1), "an RGB stem (27 terms) is an implicit GEMM: DLight's Matmul tiles it"),
    (lambda: conv(C=32, k=1, groups=1), "a dense 1x1 conv (a GEMM) reads no window"),
    (lambda: conv(C=4, N=1, H=8), "4 x 4 x 4 = 64 outputs: below min_outputs"),
])
def test_declines(make, why):
    assert _schedule(make()) is None, why


def test_declines_gemms_softmax_and_cpu_targets():
    x = relax.Var("x", relax.TensorType((64, 32), "float16"))
    w = relax.Var("w", relax.TensorType((32, 64), "float16"))
    (gemm,) = fused_kernels(lambda bb, x, w: relax.op.matmul(x, w), [x, w])
    (softmax,) = fused_kernels(lambda bb, x: relax.op.nn.softmax(x), [x])
    assert _schedule(gemm) is None and _schedule(softmax) is None
    assert _schedule(conv(), target=tvm.target.Target("llvm")) is None


@T.prim_func(private=True, s_tir=True)
def window_argmax(x: T.Buffer((T.int64(2050),), "float32"), out: T.Buffer((T.int64(2048),), "int64")):
    """An argmax over sliding windows of 3: one reduction block writing two buffers (index, value)."""
    T.func_attr({"op_pattern": 4, "tirx.noalias": True})
    temp_v0 = T.sblock_alloc_buffer((T.int64(2048),), "int64")
    temp_v1 = T.sblock_alloc_buffer((T.int64(2048),))
    for i, k in T.grid(T.int64(2048), T.int64(3)):
        with T.sblock("temp"):
            v_i, v_k = T.axis.remap("SR", [i, k])
            T.reads(x[v_i + v_k])
            T.writes(temp_v0[v_i], temp_v1[v_i])
            with T.init():
                temp_v0[v_i] = T.int64(-1)
                temp_v1[v_i] = T.float32(-3.4e38)
            v0: T.int64 = T.Select(temp_v1[v_i] >= x[v_i + v_k], temp_v0[v_i], v_k)
            v1: T.float32 = T.Select(temp_v1[v_i] >= x[v_i + v_k], temp_v1[v_i], x[v_i + v_k])
            temp_v0[v_i] = v0
            temp_v1[v_i] = v1
    for i in range(T.int64(2048)):
        with T.sblock("out"):
            v_i = T.axis.spatial(T.int64(2048), i)
            T.reads(temp_v0[v_i])
            T.writes(out[v_i])
            out[v_i] = temp_v0[v_i]


class _TwoOutputsTaken(S.WindowReduction):
    """The rule without its one-output limit (as it was before graph fuzz 928)."""

    def accepts(self, stmt):
        return True


def test_declines_a_reduction_with_two_outputs_and_the_guard_catches_one_taken():
    """Graph fuzz 928 (tests/regressions/case_b42ed8bd77.py): the rule took an argmax and moved
    only the first of its two outputs to registers; the other stayed a global buffer inside the
    kernel and CUDA code generation stopped. The rule declines such blocks now; a schedule that
    still did so is caught by vtc_tvm.scratch and, guarded, passes the kernel on."""
    assert _schedule(window_argmax) is None
    with TARGET:
        sch = _TwoOutputsTaken()._schedule(*batched_gemv.single_reduction(window_argmax), 256)
        with pytest.raises(Exception, match="Cannot allocate global memory"):
            tvm.tirx.build(tvm.IRModule({"k": sch.mod["main"].with_attr("global_symbol", "k")}), target=TARGET)
        with pytest.raises(ValueError, match="temp_v1 in global memory inside the kernel"):
            check_scratch(sch, window_argmax, TARGET)
        assert _TwoOutputsTaken().apply(window_argmax, TARGET, False) is not None
        assert S.Guarded(_TwoOutputsTaken()).apply(window_argmax, TARGET, False) is None
        for taken in TAKEN.values():  # the rule's own schedules allocate nothing global: not lowered
            kernel = taken("float16")
            check_scratch(RULE.apply(kernel, TARGET, False), kernel, TARGET)


def test_cuda_source_compiles_with_nvcc():
    funcs = [_schedule(make("float16")) for make in TAKEN.values()] + [_schedule(conv(N="n", C=32, H=12))]
    assert_nvcc_compiles(cuda_source_of(funcs, TARGET), TARGET)


@pytest.mark.slow
def test_shufflenet_unit_launches_as_many_kernels_with_the_rule():
    """The ShuffleNet unit (depthwise 3x3 convolutions, one of them read through the channel
    shuffle's mapping by vtc) through the "vtc" pipeline with our rules and with DLight's alone:
    the same kernels, and ours scheduled every depthwise one (no cross-thread sums left)."""
    from benchmarks.workloads import WORKLOADS

    wl = WORKLOADS["shufflenet_unit"]
    mod = wl.build(wl.config("small", 2, "float16"))
    sources = {s: cuda_sources(tvm.compile(mod, target=TARGET, relax_pipeline=vtc_pipeline(TARGET, schedules=s)))
               for s in ("vtc", "dlight")}
    kernels = {s: re.findall(r"__global__ void(?: __launch_bounds__\(\d+\))? (\w+)\([^;{]*\{(.*?)\n\}", src, re.S)
               for s, src in sources.items()}
    assert len(kernels["vtc"]) == len(kernels["dlight"]) > 0
    cross_thread_convs = {s: [name for name, body in ks if "conv2d" in name and "__shfl" in body]
                          for s, ks in kernels.items()}
    assert cross_thread_convs["dlight"] and not cross_thread_convs["vtc"]
