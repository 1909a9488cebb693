"""One timing function for TVM and PyTorch: :func:`time_callable`.

Both sides are timed the same way, so the numbers compare:

1. ``fn(*inputs)`` is called from a Python loop, ``number`` calls per measurement, with the
   device synchronised only before and after the loop: a callable whose host side (launches,
   Python) is slower than its kernels is measured at its host speed, and one whose kernels are
   slower at theirs, alike for a TVM VM function and a torch module's ``forward``;
2. the calls rotate over several input sets (:func:`rotation`: distinct buffers whose total
   exceeds twice the L2), so no call finds its activations in the cache; weights are one copy
   shared by every set, as in a deployed model (and as the torch module holds them);
3. with ``flush_l2`` a buffer of twice the L2 is overwritten before every measurement (outside
   the timed region), so the first call starts cold; weights that fit in L2 are then hot for the
   later calls of a measurement on both sides alike;
4. ``repeat`` measurements; the result is their median, per call. Callables compared with one
   another (stock and vtc) are timed by :func:`time_interleaved`, one measurement of each in turn.

On CUDA the region is bracketed by CUDA events on the current stream when torch is present
(TVM's VM and torch both launch on the default stream) and by host clocks around a device sync
otherwise; on the CPU by host clocks.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Sequence

import numpy as np

H200_L2_BYTES = 60 * 2 ** 20  # what PyTorch reports on the H200 (/work/.library/device KINDS.md)
CPU_CACHE_BYTES = 64 * 2 ** 20  # larger than the last-level cache of the CI machines


@dataclasses.dataclass
class Timing:
    """Per-call times of :func:`time_callable` (ms)."""

    median_ms: float
    times_ms: list  # one per measurement, per call
    number: int  # calls per measurement
    repeat: int  # measurements
    sets: int  # input sets rotated over
    method: str  # how the region was timed

    def as_dict(self) -> dict:
        spread = float(np.percentile(self.times_ms, 75) - np.percentile(self.times_ms, 25))
        return {"median_ms": self.median_ms, "iqr_ms": spread, "number": self.number, "repeat": self.repeat,
                "sets": self.sets, "method": self.method}


def _torch_cuda():
    try:
        import torch

        return torch if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - torch is optional
        return None


def _is_cuda(device) -> bool:
    if isinstance(device, str):
        return device.startswith("cuda")
    if hasattr(device, "device_type"):  # tvm.runtime.Device (kDLCUDA = 2)
        return int(device.device_type) == 2
    return getattr(device, "type", None) == "cuda"  # torch.device


def cache_bytes(device) -> int:
    """The L2 of the CUDA device (as torch reports it; the H200's when torch is absent), or a size
    above the CPU's last-level cache."""
    if not _is_cuda(device):
        return CPU_CACHE_BYTES
    torch = _torch_cuda()
    if torch is not None:
        return int(torch.cuda.get_device_properties(0).L2_cache_size) or H200_L2_BYTES
    return H200_L2_BYTES


class _Clock:
    """How to synchronise, bracket a region and evict the cache on one device."""

    def __init__(self, device, flush_bytes: int):
        self.cuda = _is_cuda(device)
        self.torch = _torch_cuda() if self.cuda else None
        self._scratch = None
        self.flush_bytes = flush_bytes
        if self.cuda and self.torch is None:
            import tvm

            self.tvm_dev = tvm.cuda(0)
        self.method = ("cuda events (torch)" if self.torch is not None else
                       "host clock around device sync" if self.cuda else "host clock")

    def sync(self):
        if self.torch is not None:
            self.torch.cuda.synchronize()
        elif self.cuda:
            self.tvm_dev.sync()

    def start(self):
        if self.torch is not None:
            ev = self.torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def stop(self, start) -> float:
        """ms since ``start``, once the device has finished."""
        if self.torch is not None:
            end = self.torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end))
        self.sync()
        return (time.perf_counter() - start) * 1e3

    def flush(self):
        """Overwrite ``flush_bytes`` of device (or host) memory: nothing of the last call stays cached."""
        if self.torch is not None:
            if self._scratch is None:
                self._scratch = self.torch.empty(self.flush_bytes, dtype=self.torch.int8, device="cuda")
            self._scratch.zero_()
        elif self.cuda:
            import tvm

            if self._scratch is None:
                self._scratch = [tvm.runtime.empty((self.flush_bytes,), "int8", self.tvm_dev) for _ in range(2)]
            self._scratch[0].copyto(self._scratch[1])
        else:
            if self._scratch is None:
                self._scratch = np.empty(self.flush_bytes, np.int8)
            self._scratch.fill(1)


def time_callable(fn: Callable, input_sets: Sequence[Sequence], *, device, warmup: int = 10,
                  number: int | None = None, repeat: int = 30, flush_l2: bool = True,
                  min_measure_ms: float = 10.0) -> Timing:
    """Median time per call of ``fn(*input_sets[i])`` (see the module docstring for the method).

    ``device``: "cuda", "cpu", a ``tvm.runtime.Device`` or a ``torch.device``. ``number``: calls
    per measurement; None picks enough calls for ``min_measure_ms`` per measurement (the rotation
    goes on across measurements). ``warmup`` calls come first (compilation, CUDA graph capture, the
    VM's first allocations stay out of the numbers).
    """
    return time_interleaved({"": (fn, input_sets)}, device=device, warmup=warmup, number=number, repeat=repeat,
                            flush_l2=flush_l2, min_measure_ms=min_measure_ms)[""]


def time_interleaved(callables: dict, *, device, warmup: int = 10, number: int | None = None, repeat: int = 30,
                     flush_l2: bool = True, min_measure_ms: float = 10.0) -> dict:
    """:func:`time_callable` of several callables, ``{name: (fn, input_sets)}`` -> ``{name: Timing}``,
    their measurements interleaved (a, b, a, b, ...): a drift of the shared device's speed during
    the run falls on all of them alike, so their ratio does not depend on which one ran first."""
    clock = _Clock(device, 2 * cache_bytes(device))
    plans = {}
    for name, (fn, input_sets) in callables.items():
        sets = list(input_sets)
        if not sets:
            raise ValueError(f"time_callable needs at least one input set ({name or 'fn'} has none)")
        for i in range(max(warmup, 1)):
            fn(*sets[i % len(sets)])
        clock.sync()
        n = number
        if n is None:
            t0 = clock.start()
            fn(*sets[0])
            n = max(1, math.ceil(min_measure_ms / max(clock.stop(t0), 1e-3)))
        plans[name] = (fn, sets, n)
    times = {name: [] for name in plans}
    calls = {name: 0 for name in plans}  # the rotation goes on across measurements
    for _ in range(repeat):
        for name, (fn, sets, n) in plans.items():
            if flush_l2:
                clock.flush()
            clock.sync()  # the device is idle when the region starts: the first launch counts
            t0 = clock.start()
            k = calls[name]
            for j in range(n):
                fn(*sets[(k + j) % len(sets)])
            calls[name] = k + n
            times[name].append(clock.stop(t0) / n)
    return {name: Timing(float(np.median(times[name])), times[name], n, repeat, len(sets), clock.method)
            for name, (fn, sets, n) in plans.items()}


def copies_for(nbytes: int, cache: int, max_copies: int = 64) -> int:
    """How many copies of ``nbytes`` make a rotation over more than twice ``cache`` (1 if one does)."""
    return 1 if nbytes >= 2 * cache else min(max_copies, math.ceil(2 * cache / max(nbytes, 1)))


def rotation(arrays: Sequence[np.ndarray], to_device: Callable, *, shared: Sequence[bool] | None = None,
             device="cuda", max_copies: int = 64) -> list:
    """Input sets to rotate over: ``to_device(array)`` copies of the arrays not ``shared`` (distinct
    buffers, same values), enough that they exceed twice the device's cache together; the
    ``shared`` ones (weights) are converted once and appear in every set."""
    shared = list(shared) if shared is not None else [False] * len(arrays)
    rotated = sum(a.nbytes for a, s in zip(arrays, shared) if not s)
    n = copies_for(rotated, cache_bytes(device), max_copies) if rotated else 1
    once = {i: to_device(a) for i, (a, s) in enumerate(zip(arrays, shared)) if s}
    return [[once[i] if i in once else to_device(a) for i, a in enumerate(arrays)] for _ in range(n)]
