"""On-device profiling: the cost model's last word on an edge.

The static strategy (contiguity classes, the DLight rule check) predicts whether a consumer that
reads through a mapping is faster than a copy followed by the original consumer; profiling
measures it. For every edge the strategy accepts, :class:`EdgeProfiler` builds and times, on
the target's device:

* *physical*: the copy kernel that materialises the virtual tensor, plus the original consumer;
* *virtual*: the rewritten consumer.

The edge is taken only if virtual <= physical x (1 + ``tolerance``). Kernels are scheduled the
way the ``"vtc"`` pipeline schedules them (our rules, then DLight's, on GPU targets), fed random
data (index inputs are 0, always in range) and timed with ``time_evaluator``. Timings are cached by
structural hash, so the 32 identical layers of a model are profiled once, and kept in a
persistent :class:`ProfileDB` (a JSON file, ``~/.cache/vtc_tvm/profile.json`` unless told
otherwise) keyed by the structural hashes of (original consumer, copy, rewritten consumer) and
the target (:func:`target_key`): a second compile of the same model measures nothing.

Without profiling, the pass still uses what was measured before (:class:`MeasuredEdges`): the
database shipped with the package (``measured/``: the benchmark workloads' edges, measured on
an H200 with ``benchmarks/run.py --vtc-profile``) and the file ``$VTC_TVM_PROFILE_DB`` names,
if any. Their entries decide the edges whose three kernels they hold, on the target they were
measured for; every other edge keeps the analytic cost. An entry is only found for the kernels
that measured it: a change of the rewrite (or of TVM) misses, and falls back to the analytic
decision.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Dict, Optional, Tuple, Union

import numpy as np
import tvm
import tvm_ffi
from tvm import tirx

logger = logging.getLogger("vtc_tvm")
DEFAULT_DB = Path(os.path.expanduser("~/.cache/vtc_tvm/profile.json"))
SHIPPED_DB = Path(__file__).parent / "measured" / "edges.json"


def target_key(target) -> str:
    """The target part of a key: for CUDA, the kind and architecture (a measurement holds for
    what the kernels compile to, not for how the target was spelled); otherwise the target's
    string."""
    target = tvm.target.Target(target)
    if target.kind.name == "cuda" and target.attrs.get("arch"):
        return f"cuda -arch={target.attrs['arch']}"
    return str(target)


def kept_us(times, free_view: bool = False) -> float:
    """What the tensor costs where it stays physical, from ``[copy_us, consumer_us, virtual_us]``:
    its copy and the consumer, or for a free view (a reshape stock TVM does not copy either) the
    consumer alone."""
    copy_us, consumer_us, _ = times
    return consumer_us if free_view else copy_us + consumer_us


def verdict(times, tolerance: float, free_view: bool = False) -> Tuple[bool, str]:
    """``(take, reason)`` from ``[copy_us, consumer_us, virtual_us]``: take the edge iff the
    rewritten consumer is not slower than what the tensor costs kept physical (:func:`kept_us`,
    within ``tolerance``)."""
    copy_us, consumer_us, virtual_us = times
    take = virtual_us <= kept_us(times, free_view) * (1 + tolerance)
    kept = (f"consumer {consumer_us:.1f} us (a free view: no copy to save)" if free_view else
            f"copy {copy_us:.1f} + consumer {consumer_us:.1f} us")
    return take, f"profiled: {virtual_us:.1f} us {'<=' if take else '>'} {kept}"


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
        return "/".join(str(h) for h in hashes) + "@" + target_key(target)

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

    # the reason of an edge taken without a timing
    unmeasured = "not profiled (a symbolic shape, or a kernel that does not build alone)"

    def covers(self, original: tirx.PrimFunc) -> bool:  # noqa: ARG002 - every edge is measured
        return True

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

    def compare(self, original: tirx.PrimFunc, copy: tirx.PrimFunc, rewritten: tirx.PrimFunc,
                free_view: bool = False) -> Optional[Tuple[bool, str]]:
        """``(take, reason)``, or None when a kernel cannot be profiled (symbolic shapes).
        ``free_view``: the tensor is a reshape stock TVM does not copy (:func:`verdict`)."""
        key = ProfileDB.key(original, copy, rewritten, self.target)
        times = self.db.get(key)
        if times is None:
            times = [self.time_us(f) for f in (copy, original, rewritten)]
            if any(t is None for t in times):
                return None
            self.db.put(key, times)
        return verdict(times, self.tolerance, free_view)

    def time_us(self, func: tirx.PrimFunc) -> Optional[float]:
        """Median run time of ``func`` alone, in microseconds (None for symbolic shapes, and
        for a kernel that does not build on its own: DLight's Reduction rule schedules the bare
        q K^T of a grown cache into a cross-thread reduction TVM cannot lower; the pipeline fuses
        it with its scale first)."""
        key = tvm_ffi.structural_hash(func)
        if key not in self._cache:
            args = _random_args(func, self.device)
            if args is None:
                return None
            try:
                kernel = self._build(func)
            except Exception:  # noqa: BLE001 - a TVM build error is a kernel we cannot time
                logger.info("not profiled: %s does not build on its own", func.attrs.get("global_symbol", "a kernel")
                            if func.attrs else "a kernel")
                return None
            timer = kernel.mod.time_evaluator("main", self.device, number=self.number, repeat=self.repeat)
            self._cache[key] = float(np.median(timer(*args).results)) * 1e6
        return self._cache[key]

    def _build(self, func):
        mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
        with self.target:
            if "gpu" in self.target.keys:
                from .schedules import ApplySchedules

                mod = ApplySchedules(self.target)(mod)  # the "vtc" pipeline's rules: ours, then DLight's
            return tvm.compile(mod, target=self.target)


class MeasuredEdges:
    """What was measured before, for a compile that does not profile: read-only entries of
    :data:`SHIPPED_DB` and ``$VTC_TVM_PROFILE_DB`` for one target. :meth:`compare` is
    :meth:`EdgeProfiler.compare` without the device: an edge with no entry gets None (the
    analytic decision stands). :meth:`for_target` gives None when nothing was measured for the
    target, so other targets pay nothing."""

    unmeasured = None  # an edge without an entry keeps its analytic verdict

    def __init__(self, target, entries: Dict[str, list], tolerance: float = 0.02):
        self.target, self.entries, self.tolerance = tvm.target.Target(target), entries, tolerance
        self.originals = {key.split("/", 1)[0] for key in entries}

    def covers(self, original: tirx.PrimFunc) -> bool:
        """Whether an entry measured ``original`` (one hash: the copy kernel and the rewrite of
        the other edges are not built)."""
        return str(tvm_ffi.structural_hash(original)) in self.originals

    @classmethod
    def for_target(cls, target, paths=None) -> Optional["MeasuredEdges"]:
        if target is None:
            return None
        if paths is None:
            paths = [SHIPPED_DB] + ([os.environ["VTC_TVM_PROFILE_DB"]] if os.environ.get("VTC_TVM_PROFILE_DB") else [])
        suffix = "@" + target_key(target)
        entries = {}
        for path in paths:
            entries.update({k: v for k, v in _read_entries(path).items() if k.endswith(suffix)})
        return cls(target, entries) if entries else None

    def compare(self, original: tirx.PrimFunc, copy: tirx.PrimFunc, rewritten: tirx.PrimFunc,
                free_view: bool = False) -> Optional[Tuple[bool, str]]:
        times = self.entries.get(ProfileDB.key(original, copy, rewritten, self.target))
        if times is None:
            return None
        take, reason = verdict(times, self.tolerance, free_view)
        return take, reason.replace("profiled:", "measured before:", 1)


_ENTRIES: Dict[Tuple[str, float], Dict[str, list]] = {}


def _read_entries(path) -> Dict[str, list]:
    """A database file's entries ({} when absent or damaged), read once per file version."""
    path = Path(path)
    try:
        stamp = (str(path), path.stat().st_mtime)
    except OSError:
        return {}
    if stamp not in _ENTRIES:
        try:
            _ENTRIES[stamp] = json.loads(path.read_text())
        except (OSError, ValueError):
            _ENTRIES[stamp] = {}
    return _ENTRIES[stamp]


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
