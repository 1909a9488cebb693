"""CI-sized model-level fuzzing (tests/model_fuzz.py): fixed cases, so every run is the same.

Each case is a shipped model (whole, or a block of its bindings) with identity sandwiches of
movement ops inserted, its weights in one of the forms, maybe a symbolic batch or legalized
first, through one vtc entry point; it must match stock TVM. Together the light cases cover
every entry point and weight form, both strategies, a symbolic batch, a legalized module, and
blocks that start inside a tuple (split) and take a symbolic batch. The drawn campaign is
``python -m tests.model_fuzz`` (records in tests/README.md).
"""

import dataclasses
import json
import os
import subprocess
import sys

import pytest
from tvm import relax

from .model_fuzz import ModelCase, check_model_case, extract_block, load_model

CASES = [
    ModelCase("shufflenet_unit", 101, weights="inputs", batch_symbolic=True, entry="vt_stores",
              sizes=({"N": 2}, {"N": 1}, {"N": 3})),
    # Read idx[24] of a 24-element gather index in a pad's condition and segfaulted about half of
    # the time, before index-tensor loads were clamped (tests/test_crash_regressions.py).
    ModelCase("effvit_attn", 102, weights="bind", legalize_first=True, entry="vtc_pipeline", strategy="all"),
    ModelCase("yolo_c3k2", 103, weights="initializers", entry="vt_default", rate=0.6),
    # Campaign seed 111171 (shrunk): FuseOps fused a relu into the channel shuffle's two-output
    # copy kernel, whose buffers had int32 extents against the relu's int64: FuseTIR raised
    # "Inconsistent buffers ... mapped to the same relax var" (candidates.copy_kernel_of)
    ModelCase("shufflenet_v2", 111171, weights="inputs", legalize_first=True, entry="vt_stores", rate=0.6, limit=5),
]
# Blocks (the campaign's usual case), all in ONE child that forks a grandchild per case, as the
# campaign does (tests/model_fuzz.outcome_in_child).
BLOCK_CASES = [
    # the channel shuffle (reshape, transpose, reshape) with a symbolic batch, every sandwich kind allowed
    ModelCase("shufflenet_unit", 32, weights="bind", batch_symbolic=True, legalize_first=True, entry="vt_stores",
              strategy="all", rate=1.0, sizes=({"N": 2}, {"N": 1}, {"N": 3}), limit=4, block=(11, 4)),
    # starts at a TupleGetItem of the split: the window grows back to the split
    ModelCase("yolo_c3k2", 10, weights="mixed", entry="vt_default", strategy="all", rate=1.0, limit=4, block=(5, 6)),
    # the first block campaign's crash (seed 100449, shrunk): a gather sandwich on a split half
    # concatenated with the other half's relu; the store side left the gathered half as a copy
    # kernel without the index tensors it reads (graph form: tests/regressions/case_storegather.py)
    ModelCase("shufflenet_v2", 100449, weights="inputs", entry="vtc_pipeline", rate=0.6, limit=1, block=(23, 10)),
    # attention of a decoder layer: scores, mask, a concat, the GQA expand + broadcast, softmax, reshape
    ModelCase("llama_prefill", 102, weights="initializers", entry="vtc_pipeline", strategy="all", rate=0.6,
              limit=4, block=(36, 10)),
]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ids(c):
    return f"{c.model}-{c.seed}"


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_model_case_matches_stock(case):
    """Each case in a child process: a crash of a generated kernel fails this case, not the run."""
    code = ("import sys; from tests.model_fuzz import ModelCase, check_model_case; "
            f"info = check_model_case({case!r}); "
            "assert info['sandwiches'], 'no movement op was inserted: the case tests nothing new'")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"


@pytest.mark.slow
def test_campaign_case_legalized_take_into_concat():
    """Seed 2 of the first campaign (llama_decode, bound weights, legalized, strategy "all", no
    cap on sandwiches then): crashed in mapping.to_prim_func before analysis cast int32 index
    loads to int64 (unit test: tests/test_input_forms.py). The case as ``ModelCase.draw(2, whole=True)``
    drew it then: draws depend on the list of models, which has grown since."""
    case = ModelCase(model="llama_decode", seed=2, weights="bind", batch_symbolic=False, legalize_first=True,
                     entry="vtc_pipeline", strategy="all", rate=0.6, sizes=(), limit=12, block=())
    check_model_case(dataclasses.replace(case, limit=1000))


def test_campaign_case_constant_piece_copied_into_a_concat():
    """Model seed 121589 (the ViT with half its weights bound, store side): the class token, a
    constant once bound, is a piece of the concat the store side copies into its destination; the
    log line about it read the constant's name, which a constant has not (AttributeError)."""
    case = ModelCase(model="vit", seed=121589, weights="mixed", batch_symbolic=False, legalize_first=False,
                     entry="vt_stores", strategy="contiguity", rate=0.3, sizes=(), limit=2, block=())
    assert check_model_case(case)["rel_l2"] == 0.0


def test_block_cases_match_stock():
    code = ("import json; from tests.model_fuzz import ModelCase, _warm, outcome_in_child; _warm(); "
            f"print('RESULTS', json.dumps([outcome_in_child(c) for c in {BLOCK_CASES!r}]))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULTS "))
    results = json.loads(line[len("RESULTS "):])
    bad = [(c, r) for c, r in zip(BLOCK_CASES, results) if r["status"] != "passed"]
    assert not bad, bad
    assert all("sandwiches=0" not in r["detail"] for r in results), results


def test_block_parameters_are_tensors_defining_their_symbols():
    """A window that starts after a split reads its tuple: it grows back to the split; a window
    inside the shuffle with a symbolic batch takes one tensor whose shape has the bare batch."""
    mod, w = load_model("yolo_c3k2", "inputs")
    ops = [b.value.op.name if hasattr(b.value, "op") else type(b.value).__name__
           for b in mod["main"].body.blocks[0].bindings]
    k = ops.index("TupleGetItem")
    block = extract_block(mod, k, 2)
    first = block["main"].body.blocks[0].bindings[0].value
    assert first.op.name == "relax.split", block["main"]
    assert all(isinstance(p.ty, relax.TensorType) for p in block["main"].params)

    mod, _ = load_model("shufflenet_unit", "bind", batch_symbolic=True)
    block = extract_block(mod, 12, 3)   # reshape, transpose, reshape
    (param,) = block["main"].params
    assert str(param.ty.shape.values[0]) == "N", param.ty
    names = [b.value.op.name for b in block["main"].body.blocks[0].bindings[:3]]
    assert names == ["relax.reshape", "relax.permute_dims", "relax.reshape"], names


def test_a_child_that_dies_or_hangs_is_that_case_crash(monkeypatch):
    """The campaign's fork harness: a segfault of a generated kernel, or a hang, is reported as
    the case's crash (with the signal), and the campaign goes on."""
    import signal
    import time

    from . import model_fuzz

    case = ModelCase("shufflenet_unit", 0)
    monkeypatch.setattr(model_fuzz, "outcome", lambda c: os.kill(os.getpid(), signal.SIGSEGV))
    res = model_fuzz.outcome_in_child(case, timeout_s=60)
    assert (res["status"], res["signature"]) == ("crash", "crash:signal 11"), res
    monkeypatch.setattr(model_fuzz, "outcome", lambda c: time.sleep(60))
    t0 = time.time()
    res = model_fuzz.outcome_in_child(case, timeout_s=1)
    assert (res["status"], res["signature"]) == ("crash", "crash:timeout") and time.time() - t0 < 30, res
    monkeypatch.setattr(model_fuzz, "outcome", lambda c: {"status": "passed", "detail": str(c.seed), "signature": ""})
    assert model_fuzz.outcome_in_child(case)["detail"] == "0"


def test_relative_l2_compares_boolean_outputs():
    """A block of a model can return a boolean tensor (model fuzz seed 131009, a Swin stage):
    the comparison must not subtract booleans (numpy refuses) but compare them."""
    import numpy as np

    from tests.model_fuzz import relative_l2

    a = np.array([True, False, True])
    assert relative_l2([a], [a.copy()]) == 0.0
    assert relative_l2([a], [~a]) > 0
