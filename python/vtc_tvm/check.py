"""Scale-aware comparison of model outputs (``--check``).

An element-wise ``allclose`` at 1e-5 fails float32 models whose outputs reach 1e7 although two
builds agree to the last bits of their reductions. Here each output is judged by two numbers,
both relative to the output's size:

* ``rel_l2`` = ||got - ref||_2 / ||ref||_2,
* ``max_rel`` = max|got - ref| / scale, with scale = max|ref| (1 for an all-zero reference).

Integer and boolean outputs must be equal. Limits: 1. an output whose values span many orders
of magnitude can hide an error in its small entries (scale is the largest one); 2. NaN or Inf
anywhere in ``got`` where ``ref`` is finite fails; equal non-finite values pass.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional, Sequence

import numpy as np

# (rel_l2, max_rel) bounds per dtype: float32 reductions reorder by ~1e-7 per step; fp16 keeps
# 11 bits and accumulates long sums in fp16 (TVM's fp16 matmul).
TOLERANCES = {
    "float64": (1e-9, 1e-8),
    "float32": (1e-4, 1e-3),
    "float16": (1e-2, 2e-2),
    "bfloat16": (2e-2, 5e-2),
}


@dataclass
class OutputError:
    """How one output compares; ``ok`` says whether it is within the dtype's tolerance."""

    index: int
    shape: tuple
    dtype: str
    rel_l2: float
    max_abs: float
    scale: float
    max_rel: float
    exact: bool
    ok: bool
    why: str = ""

    def describe(self) -> str:
        if self.why:
            return self.why
        if self.exact:
            return "bit-identical"
        return f"rel-L2 {self.rel_l2:.2e}, max|err| {self.max_abs:.3g} = {self.max_rel:.2e} of max|ref| {self.scale:.3g}"

    def to_json(self) -> dict:
        return asdict(self)


def tolerance(dtype: str) -> Optional[tuple]:
    """(rel_l2, max_rel) for a float dtype; None for dtypes compared exactly."""
    return TOLERANCES.get(str(dtype))


def compare_output(index: int, ref: np.ndarray, got: np.ndarray) -> OutputError:
    ref, got = np.asarray(ref), np.asarray(got)
    dtype = str(ref.dtype)
    if ref.shape != got.shape:
        return OutputError(index, tuple(got.shape), dtype, np.inf, np.inf, 0.0, np.inf, False, False,
                           f"shape {tuple(got.shape)} != reference {tuple(ref.shape)}")
    exact = bool(np.array_equal(ref, got, equal_nan=ref.dtype.kind == "f"))
    tol = tolerance(dtype)
    if tol is None or ref.size == 0:
        return OutputError(index, ref.shape, dtype, 0.0 if exact else np.inf, 0.0 if exact else np.inf,
                           0.0, 0.0 if exact else np.inf, exact, exact, "" if exact else "values differ")
    a, b = ref.astype("float64"), got.astype("float64")
    finite = np.isfinite(a)
    if not np.array_equal(finite, np.isfinite(b)) or not np.array_equal(a[~finite], b[~finite], equal_nan=True):
        return OutputError(index, ref.shape, dtype, np.inf, np.inf, 0.0, np.inf, False, False,
                           "NaN/Inf where the reference has none (or different ones)")
    diff = b[finite] - a[finite]
    scale = float(np.abs(a[finite]).max()) if finite.any() else 0.0
    norm = float(np.linalg.norm(a[finite]))
    rel_l2 = float(np.linalg.norm(diff)) / norm if norm > 0 else float(np.linalg.norm(diff) > 0) * np.inf
    max_abs = float(np.abs(diff).max()) if diff.size else 0.0
    max_rel = max_abs / (scale if scale > 0 else 1.0)
    ok = exact or (rel_l2 <= tol[0] and max_rel <= tol[1])
    return OutputError(index, ref.shape, dtype, rel_l2, max_abs, scale, max_rel, exact, ok)


def compare_outputs(ref: Sequence[np.ndarray], got: Sequence[np.ndarray]) -> list:
    """One :class:`OutputError` per output; a count mismatch is an error at the first missing."""
    errors = [compare_output(i, r, g) for i, (r, g) in enumerate(zip(ref, got))]
    if len(ref) != len(got):
        errors.append(OutputError(min(len(ref), len(got)), (), "", np.inf, np.inf, 0.0, np.inf, False, False,
                                  f"{len(got)} outputs, the reference has {len(ref)}"))
    return errors
