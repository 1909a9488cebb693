"""vtc_tvm.schedules.FittedTensorCoreGEMM: which GEMMs it takes (many rows, 33..128 output channels,
where DLight's Matmul stays on CUDA cores), that its WMMA schedule computes the kernel with
float32 sums (its untensorized twin on llvm, thread loops serial), compiles to CUDA with nvcc,
fits its tile to the GEMM and copies along the contiguous axes."""

import re

import pytest
import tvm
from tvm import relax
from tvm.s_tir.analysis import verify_well_formed

import vtc_tvm.schedules as S
from vtc_tvm.pipeline import cuda_target
from vtc_tvm.schedules import batched_gemv
from vtc_tvm.schedules.fitted_tensor_core import ACC_PAD, Tile, contiguous_axes, plan, shared_bytes
from tests.conftest import (allocated_buffers, assert_nvcc_compiles, assert_same_on_llvm, conv_kernel, cuda_source_of,
                            fused_kernels, launchable, shared_memory_bytes)
from tests.schedule_semantics import reference

TARGET = cuda_target()
RULE = S.FittedTensorCoreGEMM()
TWIN = S.FittedTensorCoreGEMM(tensorize=False)


def dense(C, cin, k=3, stride=1, H=20, **kw):
    return lambda: conv_kernel(C, k, stride, groups=1, cin=cin, H=H, **kw)


def matmul(m, k, n, batch=None):
    def make():
        rows = tvm.tirx.Var(m, "int64") if isinstance(m, str) else m
        x = relax.Var("x", relax.TensorType((rows, k) if batch is None else (batch, rows, k), "float16"))
        w = relax.Var("w", relax.TensorType((k, n), "float16"))
        (func,) = fused_kernels(lambda bb, x, w: relax.op.matmul(x, w), [x, w])
        return func
    return make


TAKEN = {  # name -> (kernel, output channels J); 2 images unless said
    "1x1 48 -> 64 (YOLO11n C3k2's cv2)": (dense(64, 48, k=1), 64),
    "3x3 64 -> 64 (YOLO11n's heaviest)": (dense(64, 64), 64),
    "1x1 64 -> 64, a 64 x 64 x 64 tile": (dense(64, 64, k=1), 64),
    "1x1 64 -> 80 (YOLO11n's class head)": (dense(80, 64, k=1), 80),
    "3x3 stride 2 40 -> 48, no relu": (dense(48, 40, stride=2, H=40, relu=False), 48),
    "1x1 16 -> 128, no epilogue": (dense(128, 16, k=1, H=24, bias=False, relu=False), 128),
    "matmul 600 x 48 @ 48 x 100": (matmul(600, 48, 100), 100),
    "matmul 512 x 200 @ 200 x 56 (K of 13 steps)": (matmul(512, 200, 56), 56),
    "batched 3 x 300 x 40 @ 40 x 64": (matmul(300, 40, 64, batch=3), 64),
    "1x1 48 -> 160: two blocks of 80 channels": (dense(160, 48, k=1), 160),
    "1x1 48 -> 64, a symbolic batch": (dense(64, 48, k=1, N="n"), 64),
    "3x3 128 -> 128, a symbolic batch (DLight raises)": (dense(128, 128, H=12, N="n"), 128),
    "3x3 96 -> 256, a symbolic batch (DLight raises)": (dense(256, 96, H=8, N="n", relu=False), 256),
    "batched 2 x n x 128 @ 128 x 256 (DLight raises)": (matmul("n", 128, 256, batch=2), 256),
}


def _schedule(func, rule=RULE, target=TARGET):
    with target:
        sch = rule.apply(func, target, False)
    return None if sch is None else sch.mod["main"]


@pytest.mark.parametrize("name", list(TAKEN))
def test_takes_and_its_twin_sums_in_float32(name):
    """Taken onto WMMA; the same schedule with the tiles as loops computes the kernel as it is
    with float32 sums (the widened reference), every element within two fp16 roundings."""
    func = TAKEN[name][0]()
    scheduled = _schedule(func)
    assert scheduled is not None and verify_well_formed(scheduled)
    assert any(b.scope().startswith("wmma.") for b in allocated_buffers(scheduled))
    twin = _schedule(func, TWIN)
    assert not any(b.scope().startswith("wmma.") for b in allocated_buffers(twin))
    for n in (1, 3):  # a symbolic batch bound to a size the tile divides, and one it does not
        assert_same_on_llvm(reference(func), twin, dims={"n": n}, tol=2.0 ** -9)


def test_cuda_source_compiles_with_nvcc():
    """Every kernel above as CUDA through nvcc. The 64 x 64 x 64 tile is the case that made the
    scopes differ: with operands and results both in ``shared.dyn``, StorageRewrite put the
    results in an operand's buffer and LowerIntrin rejected the float32 pointer into it."""
    funcs = [_schedule(make()) for make, _ in TAKEN.values()]
    src = cuda_source_of(funcs, TARGET)
    assert len(re.findall(r"__global__[^;{]*\{", src)) == len(funcs)
    assert src.count("nvcuda::wmma::mma_sync") >= len(funcs)
    assert_nvcc_compiles(src, TARGET)


@pytest.mark.parametrize("name", list(TAKEN))
def test_tile_fits_the_columns(name):
    """The results are staged ``BN + ACC_PAD`` floats a row (more where :func:`result_pad` says),
    BN the columns rounded up to 16, or shared evenly by the fewest blocks of at most 128
    (DLight's tensor-core tile is 128 wide, its rows unpadded)."""
    make, cols = TAKEN[name]
    func = make()
    src = cuda_source_of([_schedule(func)], TARGET)
    blocks = -(-cols // 128)
    bn = -(-(-(-cols // blocks)) // 16) * 16
    sch, block = batched_gemv.single_reduction(func)
    rows, _, red = RULE.extents(sch.get(block))
    tile = plan(rows, cols, red, batched_gemv.sm_count(TARGET))
    assert tile.bn == bn and tile.acc_pad in (ACC_PAD, ACC_PAD + 32)
    assert re.search(rf"store_matrix_sync\([^;]*, {bn + tile.acc_pad}, nvcuda::wmma::mem_row_major\)", src)


@pytest.mark.parametrize("name", list(TAKEN))
def test_a_block_shared_memory_launches(name):
    """The kernel's shared buffers by scope: static (operands) and dynamic (results) sum to at most
    48 KiB, or the dynamic part alone reaches it. C3k2's cv2 at batch 16 (21 + 34 KiB) failed to
    launch on an H100 before its results were padded (benchmarks/results, session 22)."""
    size = shared_memory_bytes(_schedule(TAKEN[name][0]()), TARGET)
    assert launchable(*size), size


def test_every_planned_tile_launches():
    """:func:`plan` over rows (symbolic, few, many), 33..512 columns and 1..1152 reduction terms."""
    for rows in (None, 300, 5000, 409600):
        for cols in range(33, 513, 7):
            for red in (1, 16, 40, 48, 64, 100, 576, 1152):
                tile = plan(rows, cols, red, 132)
                assert launchable(*shared_bytes(tile.bm, tile.bn, tile.bk, tile.acc_pad)), (rows, cols, red, tile)


@pytest.mark.parametrize("args,tile", [
    # C3k2's cv2 at batch 16: one 48-term step; results padded to 100 floats a row (shared_bytes)
    ((409600, 64, 48, 132), Tile(128, 64, 48, 4, 2, 36)),
    ((102400, 64, 576, 132), Tile(128, 64, 64, 4, 2, 36)),
    ((25600, 64, 576, 132), Tile(64, 64, 64, 4, 2)),  # 400 blocks of 128 would not fill 132 SMs twice
    ((6400, 80, 64, 132), Tile(32, 80, 64, 2, 1)),  # 5 fragments along J: one warp column
    ((800, 56, 200, 132), Tile(32, 64, 16, 2, 2)),  # 13 steps of 16: no larger step divides
    ((1000, 40, 144, 132), Tile(32, 48, 48, 2, 1)),
    ((None, 128, 1152, 132), Tile(128, 128, 64, 4, 2)),  # a symbolic I: the full tile
    ((None, 320, 96, 132), Tile(128, 112, 48, 4, 1)),  # 3 blocks along J, 7 fragments each
])
def test_plan(args, tile):
    assert plan(*args) == tile


def test_copies_run_along_the_contiguous_axes():
    """NCHW convolution: the pixels (I) are contiguous in the input and the output, K in the
    weights; row-major ``x[I, K] @ w[K, J]``: K in x, J in w and the output."""
    conv = batched_gemv.single_reduction(dense(64, 48, k=1)())
    assert contiguous_axes(conv[0].get(conv[1])) == (True, False, True)
    gemm = batched_gemv.single_reduction(matmul(600, 48, 100)())
    assert contiguous_axes(gemm[0].get(gemm[1])) == (False, True, False)


@pytest.mark.parametrize("make,why", [
    (dense(32, 48, k=1), "32 channels: NarrowGEMM's"),
    (dense(32, 48, k=1, N="n"), "32 channels, a symbolic batch: NarrowGEMM's"),
    (dense(128, 128, k=1), "every extent static and > 64: DLight's own tensor-core tile"),
    (dense(64, 48, k=1, H=8, N=1), "64 output pixels < min_rows"),
    (lambda: conv_kernel(64, 3, 1, H=20), "a depthwise conv is no GEMM (WindowReduction's)"),
    (lambda: conv_kernel(64, 1, 1, groups=1, cin=48, H=20, dtype="float32"), "fp32: no fp32 WMMA"),
    (matmul(16, 4096, 64), "16 rows: a decode projection (TensorCoreGEMM's, LowBatchGEMM's)"),
    (matmul("n", 256, 256), "symbolic rows of a plain GEMM, J and K > 64: DLight's tile builds"),
])
def test_declines(make, why):
    assert _schedule(make()) is None, why


def test_declines_old_gpus_cpus_and_do_not_tensorize():
    func = dense(64, 48, k=1)()
    assert _schedule(func, target=tvm.target.Target({"kind": "cuda", "arch": "sm_61"})) is None
    assert _schedule(func, target=tvm.target.Target("llvm")) is None
    assert _schedule(func.with_attr("dlight.do_not_tensorize", True)) is None


def test_an_fp16_convolution_with_a_symbolic_batch_builds():
    """A 3x3 fp16 convolution of 128 channels with a dynamic batch, as an ONNX export with a
    ``batch`` dim gives it: in TVM 0.27's default CUDA pipeline DLight's tensor-core schedule
    raises on it (its padding of the symbolic rows leaves a scope ``compute_at`` refuses); the
    "vtc" and "stock_vtc_schedules" pipelines build it (the source through nvcc where on PATH)."""
    from vtc_tvm.pipeline import stock_vtc_schedules_pipeline, vtc_pipeline
    from tests.fuzz import cuda_build

    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 128, 20, 20), "float16"))
    w = relax.Var("w", relax.TensorType((128, 128, 3, 3), "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, padding=1))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    for pipeline in (vtc_pipeline(TARGET), stock_vtc_schedules_pipeline(TARGET)):
        cuda_build(bb.get(), pipeline)


def test_a_concat_read_by_a_convolution_stock_cannot_build_stays_virtual():
    """The concat before a 3x3 fp16 convolution of 128 channels with a symbolic batch (YOLO11n's
    C3k2, exported with a dynamic batch): DLight raises on the convolution, so there is no DLight
    rule to rank the rewrite against; ranked by the vtc pipeline's own rules
    (``rewrite._best_by_default_rules``: FittedTensorCoreGEMM takes both forms) the concat stays
    virtual, the module builds for CUDA, and the kernel reading through the concat computes on
    llvm (its untensorized twin, threads serial) what it was given."""
    import vtc_tvm
    from vtc_tvm.pipeline import vtc_pipeline
    from tests.fuzz import cuda_build
    from tests.schedule_semantics import Recorder, check_all

    n = tvm.tirx.Var("n", "int64")
    a, b = (relax.Var(v, relax.TensorType((n, 64, 12, 12), "float16")) for v in "ab")
    w = relax.Var("w", relax.TensorType((128, 128, 3, 3), "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [a, b, w]):
        with bb.dataflow():
            c = bb.emit(relax.op.concat([a, b], axis=1))
            out = bb.emit_output(relax.op.nn.relu(relax.op.nn.conv2d(c, w, padding=1)))
        bb.emit_func_output(out)
    report = []
    vtc_tvm.VirtualTensorize(target=TARGET, report=report)(bb.get())
    assert [(e["consumer"], e["virtual"]) for e in report] == [("conv2d", True)], report
    recorder = Recorder(TARGET)
    cuda_build(bb.get(), vtc_pipeline(TARGET, schedules=recorder.rules))
    taken = [t for t in recorder.taken if t.rule == "FittedTensorCoreGEMM"]
    assert len(taken) == 1 and len(taken[0].kernel.params) == 4  # a, b, w and the output: no concat copy
    problems, skipped = check_all(taken)
    assert not problems and not skipped, (problems, skipped)


def test_the_schedule_check_reports_a_block_that_cannot_launch(monkeypatch):
    """The fuzzers' schedule check (:func:`tests.schedule_semantics.check`) reports the block the
    results' padding avoids: 21 KiB static + 34 KiB dynamic with a symbolic batch."""
    from tests.schedule_semantics import Taken, check
    from vtc_tvm.schedules import fitted_tensor_core

    monkeypatch.setattr(fitted_tensor_core, "result_pad", lambda bm, bn, bk: ACC_PAD)
    kernel = TAKEN["1x1 48 -> 64, a symbolic batch"][0]()
    problem = check(Taken("FittedTensorCoreGEMM", kernel, _schedule(kernel), _schedule(kernel, TWIN), TARGET))
    assert problem is not None and "do not launch" in problem, problem
