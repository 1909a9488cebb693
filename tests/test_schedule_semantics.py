"""Every kernel our schedule rules take in the paper workloads' CUDA builds computes, with its
thread loops serial on llvm, what the kernel computed before scheduling (tests/schedule_semantics.py)."""

import pytest
import tvm

from vtc_tvm.pipeline import cuda_target, vtc_pipeline
from tests.conftest import conv_kernel
from tests.schedule_semantics import Recorder, Taken, check

TARGET = cuda_target()

# (workload, batch) at real size -> the rules of ours that must take at least one kernel there
CASES = {
    ("yolo_c3k2", 1): {"FittedTensorCoreGEMM"},  # its narrow convolutions starve NarrowGEMM's grid
    ("effvit_attn", 1): {"WindowReduction"},
    ("shufflenet_unit", 1): {"WindowReduction"},
    ("shufflenet_v2", 1): {"WindowReduction", "NarrowGEMM"},
    ("llama_decode", 1): {"LowBatchGEMM", "DecodeAttention"},
    ("llama_decode", 16): {"DecodeAttention", "TensorCoreGEMM"},
    ("gemma2_decode", 1): {"LowBatchGEMM", "DecodeAttention"},
}


@pytest.mark.slow
@pytest.mark.parametrize("name,batch", list(CASES))
def test_our_kernels_compute_what_they_were_given(name, batch):
    from benchmarks.workloads import WORKLOADS

    wl = WORKLOADS[name]
    recorder = Recorder(TARGET)
    mod = wl.build(wl.config("real", batch, "float16"))
    tvm.compile(mod, target=TARGET, relax_pipeline=vtc_pipeline(TARGET, schedules=recorder.rules))
    assert CASES[name, batch] <= {t.rule for t in recorder.taken}
    problems, skipped = recorder.check()
    assert not problems
    assert not skipped  # WMMA kernels too, through their untensorized twins


def test_a_wrong_schedule_is_caught():
    """The check is not vacuous: a schedule of another function (the same conv with a relu) is
    reported, the right one is not."""
    from vtc_tvm.schedules import WindowReduction

    plain, with_relu = conv_kernel(C=32, H=12, relu=False), conv_kernel(C=32, H=12, relu=True)
    with TARGET:
        right = WindowReduction().apply(plain, TARGET, False).mod["main"]
        wrong = WindowReduction().apply(with_relu, TARGET, False).mod["main"]
    assert check(Taken("WindowReduction", plain, right)) is None
    assert "differs" in check(Taken("WindowReduction", plain, wrong))


@pytest.mark.slow
def test_schedule_fuzz_campaign():
    """A short run of tests/schedule_fuzz.py: random layers (convolutions, pooling, GEMMs, decode
    projections; fp16/fp32, symbolic batches, read through movement ops) through the "vtc" CUDA
    pipeline, every kernel our rules took checked on llvm; the rules were exercised."""
    from tests.schedule_fuzz import Case, run_case

    taken = set()
    for seed in range(40):
        rules, problems, _ = run_case(Case(seed))
        assert not problems, Case(seed).describe
        taken.update(rules)
    assert {"NarrowGEMM", "WindowReduction", "LowBatchGEMM"} <= taken


def test_tensor_core_rows_read_through_an_odd_slice_compile():
    """tests/schedule_fuzz.py case 1148: a 32-row projection whose rows are ``x[:, 2:258]``.
    TensorCoreGEMM staged the rows 8 halves a thread; through the slice those are no aligned
    vector, and TVM printed the gather as ``make_uint4`` of 8 values, which nvcc rejects. The
    staging now takes the widest vector the mapping provably reads aligned."""
    import shutil

    from tests.schedule_fuzz import Case, run_case

    case = Case(1148)
    assert (case.kind, case.producer, case.m) == ("projection", "slice", 32)
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH: the CUDA source cannot be compiled here")
    rules, problems, skipped = run_case(case, nvcc_check=True)
    assert rules == ["TensorCoreGEMM"] and not problems and not skipped


def test_a_consumer_dlight_raises_on_is_ranked_by_our_rules():
    """tests/schedule_fuzz.py case 2052: a 1x1 depthwise convolution (a one-term reduction) read
    through a concat. DLight's GEMV rule asserts on the consumer as the planner sees it
    (``assert r_loops``), and the planner's comparison of the rewrite with the original let the
    assertion end the build, where stock TVM builds the graph (029afbe kept the concat physical).
    The rewrite is now ranked by the "vtc" pipeline's rules (``rewrite._best_by_default_rules``):
    the concat is virtual, the build finishes, and the module still builds
    with DLight's rules alone (``schedules="dlight"``), as stock's does."""
    import vtc_tvm
    from tests.schedule_fuzz import TARGET, Case, run_case, stock_builds

    case = Case(2052)
    assert (case.kind, case.k, case.groups, case.producer) == ("depthwise", 1, case.cin, "concat")
    assert stock_builds(case)
    report = []
    vtc_tvm.VirtualTensorize(target=TARGET, report=report)(case.build())
    assert [(e["consumer"], e["virtual"]) for e in report] == [("conv2d", True)], report
    _, problems, _ = run_case(case)  # (DLight's rules, guarded, schedule its kernels)
    assert not problems
    tvm.compile(case.build(), target=TARGET, relax_pipeline=vtc_pipeline(TARGET, schedules="dlight"))
