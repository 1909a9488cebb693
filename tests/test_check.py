"""The scale-aware output comparison of ``--check`` (:mod:`vtc_tvm.check`)."""

import numpy as np

from vtc_tvm.check import compare_output, compare_outputs


def test_large_outputs_with_reordered_sums_pass(rng):
    """Outputs up to ~4e7 from reordered float32 sums: the old elementwise check (rtol = atol =
    1e-5) said MISMATCH on such outputs (issue 14)."""
    ref = (rng.standard_normal((64, 64)) * 1e7).astype("float32")
    # errors of a reordered reduction scale with the summands, not with each result: 1e-7 of
    # the output's scale everywhere, so small results carry large relative errors
    got = (ref + 1e-7 * np.abs(ref).max() * rng.standard_normal(ref.shape)).astype("float32")
    assert not np.allclose(got, ref, rtol=1e-5, atol=1e-5)  # what the old check said: MISMATCH
    e = compare_output(0, ref, got)
    assert e.ok and not e.exact and e.rel_l2 < 1e-6 and e.scale == float(np.abs(ref).max())
    assert e.max_rel == e.max_abs / e.scale


def test_real_errors_fail(rng):
    ref = rng.standard_normal((32, 32)).astype("float32")
    one_wrong = ref.copy()
    one_wrong[3, 4] += 0.05 * np.abs(ref).max()  # 5% of the scale in one element
    e = compare_output(0, ref, one_wrong)
    assert not e.ok and e.max_rel > 1e-3 and "of max|ref|" in e.describe()
    assert not compare_output(0, ref, -ref).ok


def test_fp16_is_looser_and_exact_is_exact(rng):
    ref = rng.standard_normal(256).astype("float16")
    got = (ref.astype("float32") * (1 + 2e-3)).astype("float16")
    assert compare_output(0, ref, got).ok
    assert not compare_output(0, ref.astype("float32"), got.astype("float32")).ok
    assert compare_output(0, ref, ref.copy()).describe() == "bit-identical"


def test_integers_shapes_nans_and_counts():
    a = np.arange(6, dtype="int64")
    assert compare_output(0, a, a.copy()).ok and not compare_output(0, a, a + 1).ok
    assert "shape (3, 2) != reference (6,)" in compare_output(0, a, a.reshape(3, 2)).describe()
    f = np.array([1.0, np.nan, 3.0], dtype="float32")
    assert compare_output(0, f, f.copy()).ok
    assert not compare_output(0, np.ones(3, "float32"), f).ok
    assert compare_output(0, np.zeros(4, "float32"), np.zeros(4, "float32")).ok
    assert not compare_output(0, np.zeros(4, "float32"), np.ones(4, "float32")).ok
    errors = compare_outputs([a, a], [a])
    assert [e.ok for e in errors] == [True, False] and "1 outputs, the reference has 2" in errors[1].describe()
