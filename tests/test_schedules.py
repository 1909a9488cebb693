"""vtc_tvm.schedules: which kernels the small-batch rules take, that their schedules are
well-formed, compile to CUDA (nvcc) and compute the same function, and the pipeline wiring.

No GPU here: a scheduled kernel's semantics are checked by running it on llvm with its thread
loops made serial (same loop nest, splits, rfactor and compute-at regions; NOT checked: the GPU
lowering of the cross-thread sums and barriers, which the H200 script checks end to end).
"""

import re
import shutil

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, te, tirx
from tvm.s_tir.analysis import verify_well_formed
from tvm.support import nvcc
from tvm.script import tirx as T

import vtc_tvm.schedules as S
from vtc_tvm.rewrite import normalize_loops
from vtc_tvm.pipeline import _backend, cuda_target, stock_vtc_schedules_pipeline, vtc_pipeline
from vtc_tvm.schedules import batched_gemv, tensor_core_gemm
from tests.conftest import run_llvm, serial_threads
from tests.fuzz import cuda_sources

TARGET = cuda_target()
SMALL = dict(gemm=S.LowBatchGEMM(min_weight=1, min_reduction=1), attn=S.DecodeAttention(min_context=8),
             gemm1=S.LowBatchGEMM(min_weight=1, min_reduction=1), tc=S.TensorCoreGEMM(min_weight=1))


# -- kernels -----------------------------------------------------------------------------------
def _func(tensors):
    return te.create_prim_func(tensors).without_attr("global_symbol")


def projection(M=16, K=512, N=256, dtype="float16", epilogue=False, w_nk=False):
    """``C[m, 0, n] = sum_k A[m, 0, k] * W[k, n]`` (``W[n, k]`` with w_nk), optionally ``+ X``."""
    A = te.placeholder((M, 1, K), dtype, "A")
    W = te.placeholder((N, K) if w_nk else (K, N), dtype, "W")
    k = te.reduce_axis((0, K), "k")
    C = te.compute((M, 1, N), lambda i, s, j: te.sum(A[i, s, k] * (W[j, k] if w_nk else W[k, j]), axis=k),
                   name="matmul")
    if not epilogue:
        return _func([A, W, C])
    X = te.placeholder((M, 1, N), dtype, "X")
    return _func([A, W, X, te.compute((M, 1, N), lambda i, s, j: C[i, s, j] + X[i, s, j], name="T_add")])


def mapped_projection(M=4, heads=4, D=32, N=64, dtype="float16"):
    """The vtc form of the output projection: ``A`` read as ``A[b, k // D, 0, k % D]``."""
    A = te.placeholder((M, heads, 1, D), dtype, "A")
    W = te.placeholder((heads * D, N), dtype, "W")
    k = te.reduce_axis((0, heads * D), "k")
    C = te.compute((M, 1, N), lambda i, s, j: te.sum(A[i, k // D, 0, k % D] * W[k, j], axis=k), name="matmul")
    return _func([A, W, C])


def projection_into_cache(M=4, K=256, heads=2, D=64, T_=5, pos=4):
    """The store side's form: the K/V projection writes its row straight into a cache,
    ``C[m, n // D, pos, n % D] = sum_k A[m, 0, k] * W[k, n]`` (the rest of ``C`` untouched)."""
    from tvm.script import tirx as T

    N = heads * D

    @T.prim_func(private=True, s_tir=True)
    def into(A: T.Buffer((M, 1, K), "float16"), W: T.Buffer((K, N), "float16"),
             C: T.Buffer((M, heads, T_, D), "float16")):
        for i0, i1, i2, k in T.grid(M, 1, N, K):
            with T.sblock("matmul"):
                m, s, n, r = T.axis.remap("SSSR", [i0, i1, i2, k])
                with T.init():
                    C[m, n // D, pos, n % D] = T.float16(0)
                C[m, n // D, pos, n % D] = C[m, n // D, pos, n % D] + A[m, s, r] * W[r, n]

    return into


def gqa_scores(B=2, H=8, KV=2, T=33, D=64, dtype="float16"):
    """vtc's q K^T over the un-expanded cache: ``S[b, h, 0, t] = sum_d q[b, h, 0, d] K[b, h // g, t, d]``,
    with ``h`` split into (kv head, group) as vtc's loop normalisation emits it."""
    q = te.placeholder((B, H, 1, D), dtype, "q")
    K = te.placeholder((B, KV, T, D), dtype, "K")
    d = te.reduce_axis((0, D), "d")
    g = H // KV
    return normalize_loops(_func([q, K, te.compute(
        (B, H, 1, T), lambda b, h, s, t: te.sum(q[b, h, s, d] * K[b, h // g, t, d], axis=d), name="matmul")]))


def classifier_head(N=100, K=320, dtype="float16"):
    """``x[1, K] @ W[N, K]^T + b``: a classifier head (EfficientViT-B1's is 1000 x 1600); the
    rows' unit axis is dropped, so the kernel has no rows loop at all."""
    A = te.placeholder((1, K), dtype, "A")
    W = te.placeholder((N, K), dtype, "W")
    bias = te.placeholder((N,), dtype, "bias")
    k = te.reduce_axis((0, K), "k")
    C = te.compute((1, N), lambda i, j: te.sum(A[i, k] * W[j, k], axis=k), name="matmul")
    return _func([A, W, bias, te.compute((1, N), lambda i, j: C[i, j] + bias[j], name="add")])


def test_classifier_head_without_a_rows_loop_is_scheduled():
    """Regression (found on the H200: whole EfficientViT-B1 at batch 1 failed to compile in the
    "vtc" pipeline with 'not enough values to unpack'): the write-back of a kernel with no rows
    loop, under a one-block (unsplit) tiling."""
    func = classifier_head(N=1000, K=1600)
    form = batched_gemv.prepare(func)[1]
    with TARGET:
        for tiling in (batched_gemv.plan(form, TARGET), batched_gemv.Tiling(8, 8, 4, 1, "red", kin=8)):
            sch, form, epilogue = batched_gemv.prepare(func)
            assert form.rows == () and batched_gemv.schedule(sch, form, epilogue, tiling) is not None
        assert S.LowBatchGEMM().apply(func, TARGET, False) is not None


def gqa_values(B=2, H=8, KV=2, T=33, D=64, dtype="float16"):
    """vtc's probs V: ``O[b, h, 0, d] = sum_t P[b, h, 0, t] V[b, h // g, t, d]`` (context reduced)."""
    p = te.placeholder((B, H, 1, T), dtype, "p")
    V = te.placeholder((B, KV, T, D), dtype, "V")
    t = te.reduce_axis((0, T), "t")
    g = H // KV
    return normalize_loops(_func([p, V, te.compute(
        (B, H, 1, D), lambda b, h, s, d: te.sum(p[b, h, s, t] * V[b, h // g, t, d], axis=t), name="matmul")]))


def _schedule(rule, func):
    with TARGET:
        sch = rule.apply(func, TARGET, False)
    return None if sch is None else sch.mod["main"]


# -- matching ----------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [lambda: projection(), lambda: projection(epilogue=True),
                                  lambda: projection(w_nk=True), lambda: mapped_projection(),
                                  lambda: projection(M=64), lambda: projection(dtype="bfloat16")])
def test_low_batch_gemm_takes_projections(make):
    func = _schedule(SMALL["gemm"], make())
    assert func is not None
    assert verify_well_formed(func)
    assert tvm.s_tir.analysis.verify_gpu_code(func, {"max_threads_per_block": 1024,
                                                      "max_shared_memory_per_block": 48 * 1024})


@pytest.mark.parametrize("make", [lambda: projection(M=65), lambda: projection(dtype="float32"),
                                  lambda: gqa_scores()])
def test_low_batch_gemm_declines(make):
    assert _schedule(SMALL["gemm"], make()) is None
    assert _schedule(S.LowBatchGEMM(min_rows=2, min_weight=1), projection(M=1)) is None


def test_low_batch_gemm_default_threshold_declines_small_weights():
    assert _schedule(S.LowBatchGEMM(), projection(K=512, N=256)) is None
    assert _schedule(S.LowBatchGEMM(), projection(K=1024, N=1024)) is not None


def test_low_batch_gemm_declines_short_reductions():
    """A 1x1 convolution at batch 1 (64 output channels over 48 inputs, 25600 pixels: YOLO's
    C3K2 on the H200, 0.470 against DLight's 0.068 ms) is no few-row GEMM against a weight."""
    assert _schedule(S.LowBatchGEMM(min_weight=1), projection(M=64, K=48, N=4096)) is None
    assert _schedule(S.LowBatchGEMM(min_weight=1), projection(M=64, K=256, N=4096)) is not None


TC_TAKES = [lambda: projection(), lambda: projection(epilogue=True), lambda: projection(w_nk=True),
            lambda: mapped_projection(M=16, heads=4, D=64, N=128), lambda: projection(M=32, K=256, N=128),
            lambda: projection(M=64, K=256, N=64, w_nk=True)]


@pytest.mark.parametrize("make", TC_TAKES)
def test_tensor_core_gemm_takes_projections_and_compiles(make):
    """16..64 rows, W[k, n] or W[n, k], A read through a mapping, an epilogue: WMMA kernels that
    pass TVM's GPU checks and compile with nvcc."""
    func = _schedule(SMALL["tc"], make())
    assert func is not None and verify_well_formed(func)
    assert tvm.s_tir.analysis.verify_gpu_code(func, {"max_threads_per_block": 1024,
                                                      "max_shared_memory_per_block": 48 * 1024})
    with TARGET:
        src = tvm.tirx.build(tvm.IRModule({"k": func.with_attr("global_symbol", "k")}), target=TARGET)
    src = src.imports[0].inspect_source()
    assert "wmma::mma_sync" in src and "wmma::load_matrix_sync" in src
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH: CUDA source generated but not compiled")
    with TARGET:
        assert nvcc.compile_cuda(src, target_format="ptx", arch="sm_90", compiler="nvcc")


@pytest.mark.parametrize("make", [lambda: projection(M=8), lambda: projection(M=1), lambda: projection(M=24),
                                  lambda: projection(M=80, K=256, N=128), lambda: projection(dtype="bfloat16"),
                                  lambda: projection(dtype="float32"), lambda: projection(N=40),
                                  lambda: projection(K=520), lambda: gqa_scores(), lambda: legalized_conv()])
def test_tensor_core_gemm_declines(make):
    """Rows not a multiple of 16 (or > 64), non-fp16, N % 16, a reduction that no split divides,
    attention (batch axes), a convolution: not ours (LowBatchGEMM or DLight takes them)."""
    assert _schedule(SMALL["tc"], make()) is None


def test_tensor_core_gemm_needs_a_cuda_target_with_wmma():
    func = projection()
    assert S.TensorCoreGEMM(min_weight=1).apply(func, tvm.target.Target("llvm"), False) is None
    old = tvm.target.Target({"kind": "cuda", "arch": "sm_61"})
    with old:
        assert S.TensorCoreGEMM(min_weight=1).apply(func, old, False) is None
    assert S.TensorCoreGEMM().apply(func, TARGET, False) is None  # a 512 x 256 weight: below min_weight
    capability = tensor_core_gemm.compute_capability
    assert [capability(tvm.target.Target({"kind": "cuda", "arch": a})) for a in ("sm_61", "sm_90", "sm_90a")] \
        == [61, 90, 90]
    assert capability(tvm.target.Target("llvm")) == 0


def test_tensor_core_plan_fills_the_h200():
    """The Llama-3-8B projections at batch 16 get the splits the H200 sweep picked (session 11)."""
    from vtc_tvm.schedules import tensor_core_gemm as tc

    def planned(N, K):
        return tc.plan(batched_gemv.GemvForm("b", (), (0,), (1,), (2,), 1, 16, N, K, None, "cols", "float16"), TARGET)

    assert planned(14336, 4096) == tc.TCTiling(4, 2, 4, 8)  # gate / up
    assert planned(4096, 14336) == tc.TCTiling(4, 2, 4, 32)  # down
    assert planned(4096, 4096).split == 16 and planned(1024, 4096).split == 16
    assert planned(40, 4096) is None


@pytest.mark.parametrize("make", TC_TAKES[:5])
@pytest.mark.parametrize("tiling", [None, "2,2,2,2", "1,1,1,4"])
def test_tensor_core_loop_nest_preserves_semantics(make, tiling):
    """The WMMA schedule's loop nest (staging, split, rfactor, reindexed operands, epilogue) with
    the 16x16 tiles left as loops (``tensorize=False``) computes what the widened kernel does on
    llvm; the tensorized kernels' numerics are checked on the H200 (benchmarks/schedules_h200.py)."""
    from vtc_tvm.schedules import tensor_core_gemm as tc

    func = make()
    sch, form, epilogue = batched_gemv.prepare(func)
    tiling = tc.plan(form, TARGET) if tiling is None else tc.TCTiling(*map(int, tiling.split(",")))
    scheduled = tc.schedule(sch, form, epilogue, tiling, tensorize=False).mod["main"]
    arrays = _inputs(func, np.random.default_rng(5))
    want = run_llvm(batched_gemv.prepare(func)[0].mod["main"], [a.copy() for a in arrays]).astype(np.float64)
    got = run_llvm(serial_threads(scheduled), [a.copy() for a in arrays]).astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=2 ** -10, atol=2 ** -10 * np.abs(want).max())
    assert np.abs(want).max() > 1


def test_decode_attention_needs_a_long_context_on_the_right_axis():
    """The context is q K^T's column axis: a 17-column product over a 1024-long reduction
    (EfficientViT's k^T v at batch 16, 0.471 against DLight's 0.372 ms) is not decode attention."""
    assert _schedule(S.DecodeAttention(), gqa_scores(B=2, H=4, KV=4, T=17, D=1024)) is None
    assert _schedule(S.DecodeAttention(), gqa_scores(B=2, H=4, KV=4, T=300, D=64)) is not None


@pytest.mark.parametrize("make", [gqa_scores, gqa_values, lambda: gqa_scores(KV=8)])
def test_decode_attention_takes_both_gemms(make):
    func = _schedule(SMALL["attn"], make())
    assert func is not None and verify_well_formed(func)


@pytest.mark.parametrize("make", [lambda: projection(), lambda: gqa_scores(dtype="float32"),
                                  lambda: gqa_scores(H=64, KV=2)])  # 32 rows per KV head > max_rows
def test_decode_attention_declines(make):
    assert _schedule(SMALL["attn"], make()) is None


def legalized_conv(C=96, groups=12, kernel=1, dtype="float16"):
    """A grouped conv2d as LegalizeOps writes it (EfficientViT's grouped 1x1 and 5x5 convs): its
    input index mixes output and window axes (``x[n, c, h + ry, w + rx]``)."""
    x = relax.Var("x", relax.TensorType((1, C, 32, 32), dtype))
    w = relax.Var("w", relax.TensorType((C, C // groups, kernel, kernel), dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.conv2d(x, w, padding=kernel // 2, groups=groups))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    return next(f for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc))


@pytest.mark.parametrize("rule", [SMALL["gemm"], SMALL["attn"], S.DecodeAttention(), S.LowBatchGEMM(min_weight=1)])
def test_rules_decline_convolutions(rule):
    """Found on the H200: DecodeAttention took a grouped conv of EfficientViT as a batched GEMV
    (its window index read as an operand axis) and the vtc build was 3.2e-2 from stock."""
    for conv in (legalized_conv(), legalized_conv(C=96, groups=96, kernel=5)):
        assert _schedule(rule, conv) is None


def test_match_classifies_axes():
    sch, block = batched_gemv.single_reduction(gqa_values(B=2, H=8, KV=2, T=33, D=64))
    form = batched_gemv.match(sch, block)
    assert (form.B, form.M, form.N, form.K, form.inner) == (2 * 2, 4, 64, 33, "cols")
    sch, block = batched_gemv.single_reduction(gqa_scores(B=2, H=8, KV=2, T=33, D=64))
    form = batched_gemv.match(sch, block)
    assert (form.B, form.M, form.N, form.K, form.inner) == (2 * 2, 4, 33, 64, "red")


# -- semantics (llvm, thread loops serial) ------------------------------------------------------
def _inputs(func, rng):
    return [rng.uniform(-1, 1, [int(s) for s in p.shape]).astype(str(p.dtype)) for p in func.params]


@pytest.mark.parametrize("rule,make", [
    ("gemm", lambda: projection(M=4, K=256, N=128, epilogue=True)),
    ("gemm1", lambda: projection(M=1, K=512, N=256, epilogue=True)),  # lanes along the columns
    ("gemm", lambda: projection(M=3, K=96, N=40, w_nk=True)),
    ("gemm", lambda: mapped_projection()),
    ("gemm", lambda: projection_into_cache()),  # the whole cache compared: other rows untouched
    ("attn", lambda: gqa_scores()),
    ("attn", lambda: gqa_values()),
])
def test_schedule_preserves_semantics(rule, make):
    """The scheduled kernel (threads serial) computes what the widened, unscheduled one does, up
    to the order of the float32 sums (final outputs round to fp16 once: <= 1 ulp apart)."""
    func = make()
    scheduled = _schedule(SMALL[rule], func)
    widened = batched_gemv.prepare(func)[0].mod["main"]
    arrays = _inputs(func, np.random.default_rng(7))
    want = run_llvm(widened, [a.copy() for a in arrays]).astype(np.float64)
    got = run_llvm(serial_threads(scheduled), [a.copy() for a in arrays]).astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=2 ** -10, atol=2 ** -10 * np.abs(want).max())
    assert np.abs(want).max() > 1  # not a vacuous comparison of zeros


@pytest.mark.parametrize("tiling", [batched_gemv.Tiling(2, 8, 2, 3), batched_gemv.Tiling(1, 32, 1, 2),
                                    batched_gemv.Tiling(4, 4, 4, 1), batched_gemv.Tiling(8, 4, 2, 1, "cols"),
                                    batched_gemv.Tiling(16, 2, 1, 3, "cols"),
                                    # shared-memory tail over the warps, kin consecutive terms a step
                                    batched_gemv.Tiling(8, 4, 2, 2, "cols", kin=4, tail="shared"),
                                    batched_gemv.Tiling(16, 2, 4, 1, "cols", kin=2, tail="shared"),
                                    batched_gemv.Tiling(2, 8, 4, 3, "red", kin=2),
                                    batched_gemv.Tiling(2, 4, 2, 1, "red", kin=8)])
@pytest.mark.parametrize("make", [lambda: projection(M=4, K=256, N=128, epilogue=True), lambda: gqa_values(),
                                  lambda: gqa_scores(T=80, D=64), lambda: classifier_head()])
def test_split_tilings_preserve_semantics(make, tiling):
    """Reduction split over blocks (float32 partials + a second kernel), odd splits included."""
    func = make()
    sch, form, epilogue = batched_gemv.prepare(func)
    scheduled = batched_gemv.schedule(sch, form, epilogue, tiling).mod["main"]
    assert verify_well_formed(scheduled)
    arrays = _inputs(func, np.random.default_rng(11))
    want = run_llvm(batched_gemv.prepare(func)[0].mod["main"], [a.copy() for a in arrays]).astype(np.float64)
    got = run_llvm(serial_threads(scheduled), [a.copy() for a in arrays]).astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=2 ** -10, atol=2 ** -10 * np.abs(want).max())


def test_unaligned_weight_reads_are_not_vectorised():
    """A weight read at a column offset (a slice) gets scalar loads: a 128-bit load would fault."""
    A = te.placeholder((4, 1, 256), "float16", "A")
    W = te.placeholder((256, 136), "float16", "W")
    k = te.reduce_axis((0, 256), "k")
    C = te.compute((4, 1, 128), lambda i, s, j: te.sum(A[i, s, k] * W[k, j + 3], axis=k), name="matmul")
    sch, form, _ = batched_gemv.prepare(_func([A, W, C]))
    assert not form.aligned and batched_gemv.plan(form, TARGET).vec == 1
    sch, form, _ = batched_gemv.prepare(projection(M=4, K=256, N=128))
    assert form.aligned and batched_gemv.plan(form, TARGET).vec > 1


def test_plan_lane_orientation():
    """1 and 16 rows against one weight: lanes along the contiguous columns, the warps' partials
    (M x 4 a lane) summed through shared memory (16 rows fit: 4 warps x 16 x 128 x 4 bytes), 4
    weight rows a step; 64 rows do not fit: lanes along the reduction. One row of many heads
    (probs V over a batch of heads): TVM's cross-warp sum. q K^T (reduction contiguous):
    16-byte loads along the reduction."""
    plan = lambda f: batched_gemv.plan(batched_gemv.prepare(f)[1], TARGET)
    one, many, most = (plan(projection(M=m, K=4096, N=4096)) for m in (1, 16, 64))
    assert (one.lanes, one.tail, one.vec, one.kin) == ("cols", "shared", 4, 4)
    assert (many.lanes, many.tail, many.vec, many.split, many.kin) == ("cols", "shared", 4, 16, 4)
    assert most.lanes == "red"
    heads = plan(gqa_values(H=8, KV=8, T=300, D=64))
    assert (heads.lanes, heads.tail) == ("cols", "allreduce")
    scores = plan(gqa_scores(T=80, D=64))
    assert (scores.lanes, scores.kin) == ("red", 8)


def test_float32_accumulation_is_more_accurate():
    """A 4096-long fp16 reduction (a decode attention over the whole cache): the widened sum is
    within output rounding of float64, fp16 accumulation is not."""
    func = gqa_values(B=1, H=4, KV=2, T=4096, D=16)
    rng = np.random.default_rng(3)
    p = rng.uniform(0, 1, (1, 4, 1, 4096)).astype("float16")
    v = rng.uniform(-1, 1, (1, 2, 4096, 16)).astype("float16")
    ref = np.einsum("bhst,bhtd->bhsd", p.astype(np.float64), v.astype(np.float64)[:, [0, 0, 1, 1]])
    zeros = np.zeros((1, 4, 1, 16), "float16")
    half = run_llvm(func, [p, v, zeros.copy()])
    wide = run_llvm(serial_threads(_schedule(SMALL["attn"], func)), [p, v, zeros.copy()])
    err = lambda o: np.linalg.norm(o.astype(np.float64) - ref) / np.linalg.norm(ref)
    assert err(wide) < 1e-3 < err(half)


# -- CUDA ---------------------------------------------------------------------------------------
def test_store_through_mapping_keeps_register_accumulators():
    """A projection stored into a cache row (``C[m, n // D, pos, n % D]``) accumulates in the
    iteration space's layout: its float32 partials are registers indexed by constants, not by
    ``blockIdx`` arithmetic (which spilled them to local memory: 190 against 22 us on the H200)."""
    func = _schedule(SMALL["gemm"], projection_into_cache(M=16, K=4096, heads=8, D=128, T_=9, pos=8))
    with TARGET:
        src = tvm.tirx.build(tvm.IRModule({"k": func.with_attr("global_symbol", "k")}), target=TARGET)
    src = src.imports[0].inspect_source()
    local = re.findall(r"_local_ptr\[([^\]]*)\]", src)
    assert local and not [i for i in local if "blockIdx" in i]


def test_cuda_source_compiles_with_nvcc():
    funcs = {"gemm": _schedule(SMALL["gemm"], projection(epilogue=True)),
             "scores": _schedule(SMALL["attn"], gqa_scores()), "values": _schedule(SMALL["attn"], gqa_values())}
    mod = tvm.IRModule({n: f.with_attr("global_symbol", n) for n, f in funcs.items()})
    with TARGET:
        lib = tvm.tirx.build(mod, target=TARGET)
    src = lib.imports[0].inspect_source()
    assert "__shfl_down_sync" in src  # the cross-lane sums are warp shuffles
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH: CUDA source generated but not compiled")
    with TARGET:
        assert nvcc.compile_cuda(src, target_format="ptx", arch="sm_90", compiler="nvcc")


# -- wiring -------------------------------------------------------------------------------------
def test_default_rules_are_ours_then_tvms():
    stock = [p for p in _backend(TARGET).legalize_passes(TARGET) if p.info.name == "ApplyDefaultSchedule"][0].rules
    rules = S.default_rules(TARGET)
    ours = [S.WindowReduction, S.DecodeAttention, S.TensorCoreGEMM, S.LowBatchGEMM, S.NarrowGEMM,
            S.FittedTensorCoreGEMM]
    assert all(isinstance(r, S.Guarded) for r in rules)
    assert [type(r.rule) for r in rules] == ours + [type(r) for r in stock]
    assert "ApplyDefaultSchedule" in S.ApplySchedules(TARGET).info.name


def test_a_dlight_rule_that_raises_passes_the_kernel_on():
    """tests/schedule_fuzz.py case 1313, a 1x1 depthwise convolution with stride 2 after a pad:
    DLight's GEMV rule asserts on it (a one-term reduction), which ends stock TVM's build; with
    the rule guarded the next rule schedules it, the "vtc" build finishes and the kernel computes
    on llvm (threads serial) what it was given."""
    from tests.schedule_fuzz import Case, run_case

    case = Case(1313)
    assert (case.kind, case.k, case.groups, case.stride) == ("depthwise", 1, case.cin, 2)
    gemv = next(r for r in S.stock_rules(TARGET) if type(r).__name__ == "GEMV")
    from tests.conftest import FUSE

    kernels = [f for _, f in FUSE(case.build()).functions_items() if isinstance(f, tirx.PrimFunc)]
    raised = [f for f in kernels if _raises(gemv, f)]
    assert raised  # DLight's GEMV raises on the convolution
    assert all(S.Guarded(gemv).apply(f, TARGET, False) is None for f in raised)
    _, problems, _ = run_case(case)
    assert not problems


def test_an_error_of_our_rule_is_a_defect_in_the_schedule_checks(monkeypatch):
    """In a build an error of our rule costs the kernel its schedule (the guard passes it on);
    the CPU checks of our schedules (tests/schedule_semantics.py's Recorder, which every fuzzer's
    schedule check uses) count it as a problem with the rule's name and the error."""
    from vtc_tvm.schedules.recording import Recording
    from tests.conftest import conv_kernel
    from tests.schedule_semantics import Recorder

    def boom(self, func, target, tunable):
        raise RuntimeError("first line\nboom")

    monkeypatch.setattr(S.WindowReduction, "apply", boom)
    recorder = Recorder(TARGET)
    (window,) = [r for r in recorder.rules if isinstance(r, Recording) and isinstance(S.unguarded(r.rule), S.WindowReduction)]
    with TARGET:
        assert window.apply(conv_kernel(C=32, H=12, relu=False), TARGET, False) is None
    assert recorder.raised == ["WindowReduction raised RuntimeError: boom"] and not recorder.taken
    problems, _ = recorder.check()
    assert problems == recorder.raised


def test_an_error_of_our_rule_is_a_warning_once_in_a_build(monkeypatch, caplog):
    """In :func:`vtc_tvm.schedules.default_rules` an error of our rule is logged as a warning
    (a defect of vtc_tvm the user should see), once a process for each rule and error; DLight's
    errors stay debug messages (tests/schedule_fuzz.py case 1313's GEMV assertion)."""
    import logging

    from vtc_tvm.schedules import guard
    from tests.conftest import FUSE, conv_kernel
    from tests.schedule_fuzz import Case

    def boom(self, func, target, tunable):
        raise RuntimeError("boom")

    monkeypatch.setattr(S.WindowReduction, "apply", boom)
    monkeypatch.setattr(guard, "_REPORTED", set())
    (window,) = [r for r in S.default_rules(TARGET) if isinstance(S.unguarded(r), S.WindowReduction)]
    with TARGET, caplog.at_level(logging.DEBUG, logger="vtc_tvm"):
        for c in (16, 32):
            assert window.apply(conv_kernel(C=c, H=12, relu=False), TARGET, False) is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "WindowReduction" in warnings[0].getMessage() and "boom" in warnings[0].getMessage()
    caplog.clear()
    gemv = next(r for r in S.default_rules(TARGET) if type(S.unguarded(r)).__name__ == "GEMV")
    kernels = [f for _, f in FUSE(Case(1313).build()).functions_items() if isinstance(f, tirx.PrimFunc)]
    with TARGET, caplog.at_level(logging.DEBUG, logger="vtc_tvm"):
        assert any(gemv.apply(f, TARGET, False) is None for f in kernels)
    assert any("GEMV raised" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@T.prim_func(private=True, s_tir=True)
def _sum_through_repeat(x: T.Buffer((T.int64(21), T.int64(6), T.int64(2)), "float32"),
                        out: T.Buffer((T.int64(63), T.int64(6), T.int64(1)), "float32")):
    T.func_attr({"tirx.noalias": True})
    for i, j, o, k in T.grid(T.int64(63), T.int64(6), T.int64(1), T.int64(2)):
        with T.sblock("red"):
            vi, vj, vo, vk = T.axis.remap("SSSR", [i, j, o, k])
            with T.init():
                out[vi, vj, vo] = T.float32(0.0)
            out[vi, vj, vo] = out[vi, vj, vo] + x[vi // T.int64(3), vj, vk]


def test_a_cross_thread_reduction_tvm_cannot_lower_passes_the_kernel_on():
    """Graph fuzz 930 (tests/regressions/case_4d66e154a7.py): a sum over the last axis read through
    ``repeat(x, 3, axis=0)``. DLight's Reduction rule leaves a spatial loop inside its thread-bound
    reduction loop and TVM's LowerCrossThreadReduction stopped the build; the check runs that pass
    on every schedule, so the guarded rule passes the kernel on and the next rule's schedule
    builds and computes (threads serial, on llvm) the sum it was given."""
    from tvm.s_tir import dlight as dl

    from vtc_tvm.scratch import check_scratch
    from tests.schedule_semantics import Taken, check

    with TARGET:
        sch = dl.gpu.Reduction().apply(_sum_through_repeat, TARGET, False)
        with pytest.raises(ValueError, match="cross-thread reduction"):
            check_scratch(sch, _sum_through_repeat, TARGET)
        assert S.Guarded(dl.gpu.Reduction()).apply(_sum_through_repeat, TARGET, False) is None
        rules = S.default_rules(TARGET)
        taken = next(s for s in (r.apply(_sum_through_repeat, TARGET, False) for r in rules) if s is not None)
    tvm.tirx.build(tvm.IRModule({"k": taken.mod["main"].with_attr("global_symbol", "k")}), target=TARGET)
    assert check(Taken("next rule", _sum_through_repeat, taken.mod["main"], target=TARGET)) is None


def test_a_dlight_schedule_tvm_cannot_compile_passes_the_kernel_on():
    """A matmul over a slice clamped on a symbolic axis (extent ``min(1, n)``, graph fuzz 927,
    tests/regressions/case_b3855f0659.py, read through the slice's mapping): DLight's Matmul
    schedules it, and TVM's lowering leaves a shared buffer of symbolic size that CUDA code
    generation rejects. :mod:`vtc_tvm.scratch` says so before any build; guarded, the next rule
    schedules it and the kernel builds. A kernel without such an extent is not lowered to check."""
    from tvm.s_tir import dlight as dl

    from vtc_tvm.scratch import check_scratch, has_clamped_extent

    from tests.regressions.case_b3855f0659 import build

    import vtc_tvm

    rewritten = vtc_tvm.VirtualTensorize(target=TARGET)(build())  # the consumer read through the slice
    (kernel,) = [f for gv, f in rewritten.functions_items() if isinstance(f, tirx.PrimFunc)]
    assert has_clamped_extent(kernel)
    with TARGET:
        sch = dl.gpu.Matmul().apply(kernel, TARGET, False)
    with pytest.raises(ValueError, match="shared buffer of symbolic size"):
        check_scratch(sch, kernel, TARGET)
    with pytest.raises(Exception, match="constant size stack allocation"):
        tvm.tirx.build(tvm.IRModule({"k": sch.mod["main"].with_attr("global_symbol", "k")}), target=TARGET)
    with TARGET:
        assert S.Guarded(dl.gpu.Matmul()).apply(kernel, TARGET, False) is None
        fallback = S.Guarded(dl.gpu.Fallback()).apply(kernel, TARGET, False)
    tvm.tirx.build(tvm.IRModule({"k": fallback.mod["main"].with_attr("global_symbol", "k")}), target=TARGET)
    symbolic = relax.transform.LegalizeOps()(_matmul_module(tirx.Var("m", "int64")))["matmul"]
    assert not has_clamped_extent(symbolic)  # a plain symbolic extent: nothing to lower


def _matmul_module(rows):
    b = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, 4, 4, 8), "float32"))
    w = relax.Var("w", relax.TensorType((5, 4), "float32"))
    with b.function("main", [x, w]):
        with b.dataflow():
            out = b.emit_output(relax.op.matmul(w, x))
        b.emit_func_output(out)
    return b.get()


def _raises(rule, func) -> bool:
    try:
        with TARGET:
            rule.apply(func, TARGET, False)
        return False
    except Exception:  # noqa: BLE001 - whatever it raises
        return True


def test_pipelines_registered_and_checked():
    assert "stock_vtc_schedules" in relax.pipeline.PIPELINE_MAP
    assert relax.get_pipeline("stock_vtc_schedules", target=TARGET).info.name == "stock_vtc_schedules"
    assert relax.get_pipeline("vtc", target=TARGET, schedules="vtc").info.name == "vtc_pipeline"
    with pytest.raises(ValueError, match="schedules"):
        vtc_pipeline(TARGET, schedules="fast")
    for bad in ([], [S.LowBatchGEMM, "Fallback"]):
        with pytest.raises(ValueError, match="DLight rules"):
            vtc_pipeline(TARGET, schedules=bad)


def test_pipeline_takes_a_users_rule_list():
    """``schedules=[rules]``: exactly those rules schedule the kernels (here DLight's Fallback
    alone, so the projection that LowBatchGEMM takes under "vtc" gets no batched GEMV)."""
    from tvm.s_tir import dlight as dl

    x = relax.Var("x", relax.TensorType((16, 1, 4096), "float16"))
    w = relax.Var("w", relax.TensorType((4096, 1024), "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, w))
        bb.emit_func_output(out)
    mod = bb.get()
    own = cuda_sources(tvm.compile(mod, target=TARGET, relax_pipeline=vtc_pipeline(TARGET, schedules=[dl.gpu.Fallback()])))
    ours = cuda_sources(tvm.compile(mod, target=TARGET, relax_pipeline=vtc_pipeline(TARGET, schedules="vtc")))
    # the batched GEMV's reduction-factor buffers (rfactor), which Fallback never makes
    assert "acc_rf" in ours and "acc_rf" not in own


def _small_decode(dtype="float16"):
    from benchmarks.workloads import WORKLOADS

    wl = WORKLOADS["llama_decode"]
    return wl.build(wl.config("small", 2, dtype))


@pytest.mark.slow
def test_decode_layer_builds_with_our_schedules():
    """A decode layer just large enough for the default thresholds (weights of 1024 x 1024, a
    256-long cache) through both pipelines that use our rules: it builds, and our rules (not
    DLight's) scheduled its attention GEMMs, read through the virtual tensors' mappings, and
    its projections."""
    from benchmarks.workloads import WORKLOADS
    from vtc_tvm.pipeline import fusion_passes
    from vtc_tvm.transform import VirtualTensorize

    wl = WORKLOADS["llama_decode"]
    mod = wl.build(wl.config("small", 2, "float16").__class__.small(
        hidden=1024, intermediate=1024, ctx=256, batch=2, seq=1, dtype="float16"))
    for pipe in (vtc_pipeline(TARGET, schedules="vtc"), stock_vtc_schedules_pipeline(TARGET)):
        ex = tvm.compile(mod, target=TARGET, relax_pipeline=pipe)
        assert "__global__" in cuda_sources(ex)

    with TARGET:
        virtual = VirtualTensorize(target=TARGET, memory_guard=True)(mod)
        ours, dlight = (tvm.transform.Sequential(fusion_passes(TARGET, schedules=s))(virtual) for s in ("vtc", "dlight"))
    changed = {gv.name_hint for gv, f in ours.functions.items()
               if isinstance(f, tirx.PrimFunc) and not tvm_ffi.structural_equal(f, dlight[gv.name_hint])}
    mapped = {gv.name_hint for gv, f in dlight.functions.items()
              if isinstance(f, tirx.PrimFunc) and "vtc.virtual_inputs" in (f.attrs or {}) and "matmul" in gv.name_hint}
    assert len(mapped) >= 2 and mapped <= changed  # q K^T and probs V over the un-expanded cache
    # + gate, up and down (1024 x 1024 weights); q/k/v/o (<= 1024 x 256) fall under min_weight
    assert len([n for n in changed - mapped if "matmul" in n]) == 3


@pytest.mark.slow
def test_h200_script_dry_run(tmp_path):
    """benchmarks/schedules_h200.py end to end on llvm at the small size (float32, one batch)."""
    from benchmarks import schedules_h200

    result = schedules_h200.main(["--target", "llvm", "--size", "small", "--batch", "1", "--workloads",
                                  "llama_decode", "--number", "1", "--repeat", "1", "--out", str(tmp_path)])
    (row,) = result["rows"]
    assert set(row["variants"]) == set(schedules_h200.VARIANTS)
    for res in row["variants"].values():
        assert res["numerics_ok"] and res["ms"] > 0, res
    assert (tmp_path / "schedules_h200.json").exists()


@pytest.mark.slow
def test_h200_sweep_candidates_build_for_cuda():
    """Every candidate of the H200 script's kernel sweep schedules and builds for CUDA (small
    layer: the timing itself needs the GPU)."""
    from benchmarks import schedules_h200

    found = schedules_h200.sweep_candidates(2, "small", TARGET, rules=list(SMALL.values()))
    assert {"DecodeAttention", "LowBatchGEMM"} <= {info["rule"] for info, _ in found.values()}
    info, makes = next(iter(found.values()))
    funcs = {label.replace("-", "_"): make().with_attr("global_symbol", label) for label, make in makes.items()}
    with TARGET:
        lib = tvm.tirx.build(tvm.IRModule(funcs), target=TARGET)
    assert lib.imports[0].inspect_source().count("__global__") >= len(funcs)


def test_h200_kernel_timer_runs_on_llvm():
    """The sweep's one-kernel timer (tvm.compile of a PrimFunc + time_evaluator) works; on the
    H200 it times the CUDA kernels."""
    from benchmarks.schedules_h200 import _time_kernel

    us, nbytes, out = _time_kernel(projection(M=2, K=64, N=32), tvm.target.Target("llvm"), tvm.cpu(), 2, 2)
    assert us > 0 and nbytes == (2 * 64 + 64 * 32 + 2 * 32) * 2
    rng = np.random.default_rng(0)  # the timer's inputs: out is the GEMM of them
    a, w = (rng.uniform(-1, 1, s).astype("float16") for s in [(2, 1, 64), (64, 32)])
    np.testing.assert_allclose(out, a.astype(np.float64) @ w.astype(np.float64), rtol=1e-2, atol=2e-2)
