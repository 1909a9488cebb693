"""Strategies: which (virtual tensor, consumer) edges to take.

A strategy is a callable ``(mapping, contiguity, consumer_pattern) -> Decision``. Built-in:

* ``"all"``: every legal edge (for testing and for exploring).
* ``"contiguity"`` (default, the paper's contiguity classes, no profiling): take fully
  contiguous mappings (Type I) always; take partially contiguous mappings whose run is at least
  one coalesced transaction into tiled consumers (GEMM/conv stage tiles through shared memory,
  so a unit-stride run along *any* axis suffices); take strided or indirect mappings only into
  consumers that read each element about once (elementwise, broadcast, injective, reductions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, Union

from .analysis import COMM_REDUCE, OUT_EWISE_FUSABLE, Contiguity

COALESCED_BYTES = 128  # one fully coalesced warp transaction (32 lanes x 4 bytes)
# A virtual tensor keeps every source it reads alive until its consumer runs. Chains of
# concat/shuffle/split (ShuffleNet's pass-through half) compose into mappings over the outputs of
# many earlier units; reading them all saves one copy but pins several times the tensor's bytes.
MAX_PINNED = 2


def pins_too_much(mapping) -> bool:
    """Whether ``mapping`` reads more than :data:`MAX_PINNED` sources holding more than
    :data:`MAX_PINNED` times its own elements (composition stops before such a mapping: the
    intermediate tensor is materialised instead)."""
    data = mapping.data_sources()
    if len(data) <= MAX_PINNED or mapping.symbols:
        return False
    pinned = sum(math.prod(mapping.source_shape(j)) for j in data)
    return pinned > MAX_PINNED * mapping.size


@dataclass(frozen=True)
class Decision:
    take: bool
    reason: str


def _dtype_bytes(dtype: str) -> int:
    bits = int("".join(ch for ch in dtype if ch.isdigit()) or 32)
    return max(bits // 8, 1)


def take_all(mapping, contig: Contiguity, pattern: int) -> Decision:
    return Decision(True, "strategy 'all'")


def by_contiguity(mapping, contig: Contiguity, pattern: int) -> Decision:
    run = COALESCED_BYTES // _dtype_bytes(mapping.dtype)
    if contig.full:
        return Decision(True, "fully contiguous (type I)")
    if pattern <= COMM_REDUCE:
        return Decision(True, f"consumer reads each element once (op pattern {pattern})")
    if pattern == OUT_EWISE_FUSABLE:
        longest = max(contig.inner_run, contig.best_axis_run)
        if longest >= run:
            return Decision(True, f"unit-stride run {longest} >= {run} into a tiled consumer")
        return Decision(False, f"longest unit-stride run {longest} < {run} into a tiled consumer "
                               "that re-reads elements")
    if contig.inner_run >= run:
        return Decision(True, f"row-major run {contig.inner_run} >= {run}")
    return Decision(False, f"row-major run {contig.inner_run} < {run} into an opaque consumer")


STRATEGIES: Dict[str, Callable] = {"all": take_all, "contiguity": by_contiguity}


def get_strategy(strategy: Union[str, Callable]) -> Callable:
    if callable(strategy):
        return strategy
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {sorted(STRATEGIES)} "
                         "or pass a callable (mapping, contiguity, op_pattern) -> Decision")
    return STRATEGIES[strategy]
