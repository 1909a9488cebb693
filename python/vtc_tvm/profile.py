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
structural hash, so the 32 identical layers of a model are profiled once, and kept in a
persistent :class:`ProfileDB` (a JSON file, ``~/.cache/vtc_tvm/profile.json`` unless told
otherwise) keyed by the structural hashes of (original consumer, copy, rewritten consumer) and
the target string: a second compile of the same model measures nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, Optional, Tuple, Union

import numpy as np
import tvm
import tvm_ffi
from tvm import tirx

DEFAULT_DB = Path(os.path.expanduser("~/.cache/vtc_tvm/profile.json"))


class ProfileDB:
    """Measured edge timings that outlive a compile: ``{key: [copy_us, consumer_us, virtual_us]}``
    in a JSON file (written after every new measurement; a damaged file is started afresh).
    ``path``: the file; None: ``$VTC_TVM_PROFILE_DB`` or :data:`DEFAULT_DB`; False: in memory
    only."""

    def __init__(self, path: Union[str, Path, None, bool] = None):
        if path is None:
            path = os.environ.get("VTC_TVM_PROFILE_DB") or DEFAULT_DB
        self.path = None if path is False else Path(path)
        try:
            self.entries = json.loads(self.path.read_text()) if self.path is not None else {}
        except (OSError, ValueError):
            self.entries = {}

    @staticmethod
    def key(original, copy, rewritten, target) -> str:
        hashes = [tvm_ffi.structural_hash(f) for f in (original, copy, rewritten)]
        return "/".join(str(h) for h in hashes) + "@" + str(target)

    def get(self, key):
        return self.entries.get(key)

    def put(self, key, times):
        self.entries[key] = list(times)
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.entries, indent=0))
        tmp.replace(self.path)


class EdgeProfiler:
    """Times candidate kernels on ``target``'s device (see the module docstring); ``db``: a
    :class:`ProfileDB`, its path, or None for the default file."""

    def __init__(self, target, tolerance: float = 0.02, number: int = 10, repeat: int = 5,
                 db: Union[ProfileDB, str, Path, None] = None):
        self.db = db if isinstance(db, ProfileDB) else ProfileDB(db)
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
        key = ProfileDB.key(original, copy, rewritten, self.target)
        times = self.db.get(key)
        if times is None:
            times = [self.time_us(f) for f in (copy, original, rewritten)]
            if any(t is None for t in times):
                return None
            self.db.put(key, times)
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
