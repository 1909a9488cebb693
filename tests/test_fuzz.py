"""CI-sized differential fuzzing campaign (see tests/fuzz.py) plus the saved regressions.

The campaign is derandomized (fixed examples on every run). About a third of the graphs have
symbolic dimensions and run at 2-3 concrete sizes from one compiled module. ~0.4 s per graph on
a 2-core machine: 300 graphs take about 2 minutes. ``VTC_FUZZ_EXAMPLES`` overrides the count.
A second, smaller campaign builds the graphs for CUDA (``VTC_FUZZ_CUDA_EXAMPLES``, default 20).
"""

import dataclasses
import glob
import importlib.util
import os

import pytest
from hypothesis import HealthCheck, assume, given, note, settings

from .fuzz import (REGRESSION_DIR, StockFailure, VtcFailure, check_case, check_regression, describe,
                   graphs)

EXAMPLES = int(os.environ.get("VTC_FUZZ_EXAMPLES", "300"))
CUDA_EXAMPLES = int(os.environ.get("VTC_FUZZ_CUDA_EXAMPLES", "20"))  # ~2 s a graph (three CUDA builds)


def _check(case):
    try:
        check_case(case)
    except StockFailure:
        assume(False)  # stock TVM cannot build/run this graph: not ours to judge
    except VtcFailure as failure:
        note(describe(case, failure))
        raise


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck), print_blob=False)
@given(graphs())
def test_fuzz_stock_vs_vtc(case):
    _check(case)


@pytest.mark.slow
@settings(max_examples=CUDA_EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck), print_blob=False)
@given(graphs())
def test_fuzz_cuda_builds(case):
    """The GPU path without a GPU: stock's CUDA build against the "vtc" pipeline's (each
    strategy builds, nvcc accepts the source, no more kernels nor planned memory than stock)."""
    _check(dataclasses.replace(case, target="cuda"))


def _regressions():
    return sorted(glob.glob(os.path.join(REGRESSION_DIR, "case_*.py")))


@pytest.mark.parametrize("strategy", ["contiguity", "all"])
@pytest.mark.parametrize("path", _regressions(), ids=lambda p: os.path.basename(p)[:-3])
def test_fuzz_regression(path, strategy):
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    known = getattr(module, "KNOWN_FAILURE", None)  # a wrong answer found and not fixed yet
    if known:
        with pytest.raises(Exception):  # strict: once it passes, this fails and the mark must go
            check_regression(module, strategy)
        pytest.xfail(known)
    check_regression(module, strategy)


def test_crash_signatures_ignore_temporary_paths_and_keep_the_first_diagnostic():
    """nvcc names a random temporary directory and ends every failure with the same line: a
    shrinking replay of one bug must give the same signature (else hypothesis calls the failure
    flaky and the case was lost: CUDA seed 919), two different compile errors different ones."""
    from tests.fuzz import _norm

    def nvcc(tmp, error):
        return (f"RuntimeError: Compilation error:\n/tmp/{tmp}/tvm_kernels.cu(78): warning #177-D: unused\n"
                f"/tmp/{tmp}/tvm_kernels.cu(138): error: {error}\n"
                f'5 errors detected in the compilation of "/tmp/{tmp}/tvm_kernels.cu".')

    first = _norm(nvcc("tmpuwqieldm", "too many arguments in function call"))
    assert first == _norm(nvcc("tmpdjjem20a", "too many arguments in function call"))
    assert first != _norm(nvcc("tmpuwqieldm", "identifier \"x\" is undefined"))
    assert _norm("Traceback ...\nValueError: shapes (3, 4) and x12") == "ValueError: shapes (N, N) and N"
