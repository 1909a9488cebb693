"""The global planner's plan solver: which virtual-tensor edges to take.

The search is native (``src/solver/*.cc``, one implementation, exposed through tvm-ffi global
functions ``vtc_tvm.solver.solve`` and ``vtc_tvm.solver.is_feasible``); this module only
describes the problem, marshals it to plain ffi arrays and loads the library.

A :class:`Problem` is the opportunity graph: nodes are tensors, edge ``i = (src, dst)`` makes
tensor ``src`` a view of tensor ``dst`` (eliminating one movement op). A plan (a set of edges)
is feasible when

1. no two chosen edges share a conflict set,
2. for every ``(e, f)`` in ``requires`` with ``e`` chosen, ``f`` is chosen,
3. the chosen edges form no directed cycle (a tensor cannot be a view of itself),
4. ``sum(memory)`` and ``sum(kernels)`` over the chosen edges are within the budgets,
5. objective ``"memory"`` only: the total gain is ``>= -1e-9`` (0 up to float rounding).

The total gain is the sum of the chosen edges' ``gain`` plus the ``interactions`` of chosen
pairs. ``"latency"`` maximises it; ``"memory"`` minimises total memory, then maximises gain.
Edges that contribute nothing are not chosen. How the solver works (components, the paper's
greedy, branch and bound, budgets that couple components) is documented in
``src/solver/solve.h`` and ``search.h``.

The library is looked up, in order: the path in ``$VTC_TVM_NATIVE_LIB``; next to this package
(wheels and ``pip install -e .``); the CMake build tree (``build/``, ``build/<wheel tag>/``).
"""

from __future__ import annotations

import operator
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import tvm_ffi

__all__ = ["Problem", "Solution", "solve", "is_feasible", "LIBRARY_NAME", "LIBRARY_ENV"]

LIBRARY_NAME = "libvtc_tvm_native.so"
LIBRARY_ENV = "VTC_TVM_NATIVE_LIB"
_SOLVE = "vtc_tvm.solver.solve"
_IS_FEASIBLE = "vtc_tvm.solver.is_feasible"


@dataclass(frozen=True)
class Problem:
    """A plan problem (see the module docstring for the rules)."""

    num_nodes: int
    edges: Sequence[tuple[int, int]]
    gain: Sequence[float]
    kernels: Sequence[int]
    memory: Sequence[int]
    conflicts: Sequence[Sequence[int]] = ()
    requires: Sequence[tuple[int, int]] = ()
    interactions: Sequence[tuple[int, int, float]] = ()
    memory_budget: Optional[int] = 0
    kernel_budget: Optional[int] = 0
    objective: str = "latency"


@dataclass(frozen=True)
class Solution:
    """A feasible plan and its totals."""

    chosen: tuple[int, ...]
    gain: float
    memory: int
    kernels: int
    exact: bool
    components: tuple[tuple[str, int], ...]


def _library_candidates() -> list[Path]:
    package_dirs = [Path(p) for p in getattr(sys.modules.get(__package__), "__path__", [])]
    here = Path(__file__).resolve().parent
    if here not in package_dirs:
        package_dirs.insert(0, here)
    build = here.parent.parent / "build"
    return (
        [d / LIBRARY_NAME for d in package_dirs]
        + [build / LIBRARY_NAME]
        + sorted(build.glob(f"*/{LIBRARY_NAME}"))
    )


def _load_library() -> None:
    """Load the native library once; its static initialiser registers the global functions."""
    if tvm_ffi.get_global_func(_SOLVE, allow_missing=True) is not None:
        return  # already loaded (a reload of this module, or another copy of the package)
    explicit = os.environ.get(LIBRARY_ENV)
    if explicit:
        if not Path(explicit).is_file():
            raise ImportError(f"${LIBRARY_ENV} = {explicit!r} is not a file")
        candidates = [Path(explicit)]
    else:
        candidates = [p for p in _library_candidates() if p.is_file()]
    if not candidates:
        raise ImportError(
            f"vtc_tvm's native solver ({LIBRARY_NAME}) is not built: run `pip install -e .` "
            f"(or `./vtc test`) in the vtc-tvm checkout, or set ${LIBRARY_ENV} to its path"
        )
    tvm_ffi.load_module(str(candidates[0]))


_load_library()
_solve_native = tvm_ffi.get_global_func(_SOLVE)
_is_feasible_native = tvm_ffi.get_global_func(_IS_FEASIBLE)


def _ints(values: Sequence[int], what: str) -> list[int]:
    try:
        return [operator.index(v) for v in values]
    except TypeError as err:
        raise TypeError(f"{what}: expected integers ({err})") from None


def _tuples(values: Sequence[Sequence], arity: int, what: str) -> list[tuple]:
    out = []
    for i, value in enumerate(values):
        value = tuple(value)
        if len(value) != arity:
            raise ValueError(f"{what}[{i}] = {value!r} does not have {arity} entries")
        out.append(value)
    return out


def _budget(value: Optional[int], what: str) -> Optional[int]:
    return None if value is None else _ints([value], what)[0]


def _flatten(problem: Problem) -> list:
    """The flat argument list of the native functions (see src/solver/ffi_api.cc)."""
    edges = _tuples(problem.edges, 2, "edges")
    requires = _tuples(problem.requires, 2, "requires")
    interactions = _tuples(problem.interactions, 3, "interactions")
    return [
        operator.index(problem.num_nodes),
        _ints([s for s, _ in edges], "edges"),
        _ints([d for _, d in edges], "edges"),
        [float(g) for g in problem.gain],
        _ints(problem.kernels, "kernels"),
        _ints(problem.memory, "memory"),
        [_ints(s, "conflicts") for s in problem.conflicts],
        _ints([e for e, _ in requires], "requires"),
        _ints([f for _, f in requires], "requires"),
        _ints([a for a, _, _ in interactions], "interactions"),
        _ints([b for _, b, _ in interactions], "interactions"),
        [float(g) for _, _, g in interactions],
        _budget(problem.memory_budget, "memory_budget"),
        _budget(problem.kernel_budget, "kernel_budget"),
        str(problem.objective),
    ]


def solve(problem: Problem, method: str = "auto", max_exact_edges: int = 24) -> Solution:
    """Best feasible plan of ``problem``.

    ``method``: ``"auto"`` (branch and bound on components of at most ``max_exact_edges``
    edges, seeded with the greedy so never worse than it; the greedy on larger ones),
    ``"greedy"``, or ``"exact"`` (branch and bound on every component, up to a work cap;
    a component that hits it is reported ``"greedy"``). ``Solution.exact`` is True when the
    plan is proven optimal. Deterministic. Raises ValueError on malformed input.
    """
    chosen, gain, memory, kernels, exact, kinds, sizes = _solve_native(
        *_flatten(problem), str(method), operator.index(max_exact_edges)
    )
    return Solution(
        chosen=tuple(int(e) for e in chosen),
        gain=float(gain),
        memory=int(memory),
        kernels=int(kernels),
        exact=bool(exact),
        components=tuple((str(k), int(n)) for k, n in zip(kinds, sizes)),
    )


def is_feasible(problem: Problem, chosen: Sequence[int]) -> bool:
    """Whether the plan ``chosen`` meets rules 1-5 of the module docstring (natively)."""
    return bool(_is_feasible_native(*_flatten(problem), _ints(chosen, "chosen")))
