"""CI-sized model-level fuzzing (tests/model_fuzz.py): fixed cases, so every run is the same.

Each case is a shipped model with identity sandwiches of movement ops inserted, its weights in
one of the three forms, maybe a symbolic batch or legalized first, through one vtc entry point;
it must match stock TVM. Together the light cases cover every entry point and weight form,
both strategies, a symbolic batch and a legalized module. The drawn campaign is
``python -m tests.model_fuzz`` (records in tests/README.md).
"""

import dataclasses
import os
import subprocess
import sys

import pytest

from .model_fuzz import ModelCase, check_model_case

CASES = [
    ModelCase("shufflenet_unit", 101, weights="inputs", batch_symbolic=True, entry="vt_stores",
              sizes=({"N": 2}, {"N": 1}, {"N": 3})),
    # Read idx[24] of a 24-element gather index in a pad's condition and segfaulted about half of
    # the time, before index-tensor loads were clamped (tests/test_crash_regressions.py).
    ModelCase("effvit_attn", 102, weights="bind", legalize_first=True, entry="vtc_pipeline", strategy="all"),
    ModelCase("yolo_c3k2", 103, weights="initializers", entry="vt_default", rate=0.6),
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
    loads to int64 (unit test: tests/test_input_forms.py)."""
    case = ModelCase.draw(2)
    assert (case.model, case.weights, case.legalize_first) == ("llama_decode", "bind", True)
    check_model_case(dataclasses.replace(case, limit=1000))
