"""On-device profiling: the cost model's last word on an edge.

The static strategy (contiguity classes, the DLight rule check) predicts whether a consumer that
reads through a mapping is faster than a copy followed by the original consumer; profiling
measures it. For every edge the strategy accepts, :class:`EdgeProfiler` builds and times, on
the target's device:

* *physical*: the copy kernel that materialises the virtual tensor, plus the original consumer;
* *virtual*: the rewritten consumer.

The edge is taken only if virtual <= physical x (1 + ``tolerance``). Kernels are scheduled the
way the pipeline schedules them (DLight's default rules on GPU targets), fed random data (index
inputs are 0, always in range) and timed with ``time_evaluator``. Timings are cached by
structural hash, so the 32 identical layers of a model are profiled once.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np
import tvm
import tvm_ffi
from tvm import tirx

class EdgeProfiler:
    """Times candidate kernels on ``target``'s device (see the module docstring)."""

    def __init__(self, target, tolerance: float = 0.02, number: int = 10, repeat: int = 5):
        self.target = tvm.target.Target(target)
        self.tolerance, self.number, self.repeat = tolerance, number, repeat
        kind = self.target.kind.name
        self.device = tvm.cpu(0) if kind in ("llvm", "c") else tvm.device(kind, 0)
        if not self.device.exist:
            raise RuntimeError(f"profiling needs a {self.target.kind.name} device and none is visible")
        self._cache: Dict[int, float] = {}

    def compare(self, original: tirx.PrimFunc, copy: tirx.PrimFunc,
                rewritten: tirx.PrimFunc) -> Optional[Tuple[bool, str]]:
        """``(take, reason)``, or None when a kernel cannot be profiled (symbolic shapes)."""
        times = [self.time_us(f) for f in (copy, original, rewritten)]
        if any(t is None for t in times):
            return None
        copy_us, consumer_us, virtual_us = times
        physical_us = copy_us + consumer_us
        take = virtual_us <= physical_us * (1 + self.tolerance)
        return take, (f"profiled: {virtual_us:.1f} us {'<=' if take else '>'} copy {copy_us:.1f} + "
                      f"consumer {consumer_us:.1f} us")

    def time_us(self, func: tirx.PrimFunc) -> Optional[float]:
        """Median run time of ``func`` alone, in microseconds (None for symbolic shapes)."""
        key = tvm_ffi.structural_hash(func)
        if key not in self._cache:
            args = _random_args(func, self.device)
            if args is None:
                return None
            kernel = self._build(func)
            timer = kernel.mod.time_evaluator("main", self.device, number=self.number, repeat=self.repeat)
            self._cache[key] = float(np.median(timer(*args).results)) * 1e6
        return self._cache[key]

    def _build(self, func):
        mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
        with self.target:
            if "gpu" in self.target.keys:
                from tvm.s_tir import dlight

                from .rewrite import _dlight_rules

                mod = dlight.ApplyDefaultSchedule(*_dlight_rules())(mod)
            return tvm.compile(mod, target=self.target)


def _random_args(func: tirx.PrimFunc, device):
    rng = np.random.default_rng(0)
    args = []
    for p in func.params:
        if not tirx.is_buffer_var(p) or not all(isinstance(d, tirx.IntImm) for d in p.shape):
            return None
        shape, dtype = [int(d) for d in p.shape], str(p.dtype)
        try:
            data = rng.standard_normal(shape).astype(dtype) if "float" in dtype else np.zeros(shape, dtype)
        except TypeError:  # a dtype numpy does not have (bfloat16)
            return None
        args.append(tvm.runtime.tensor(data, device))
    return args
