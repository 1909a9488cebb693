"""Differential fuzzer: stock TVM vs ``VirtualTensorize`` on random Relax graphs.

Hypothesis draws a random Relax function (BlockBuilder, high-level ops) that mixes the
data-movement ops vtc-tvm has rules for -- chained, branching, several virtual inputs per
consumer -- and feeds them into compute ops. Each graph is compiled three times on LLVM with the
fused default pipeline (stock, ``VirtualTensorize()``, ``VirtualTensorize("all")``; the two vtc
builds with the store side after FuseTIR, as in the ``"vtc"`` pipeline) and run on the same
random inputs. The outputs must agree (fp32: rtol = atol = 1e-6, ints: exact, fp16:
1e-3) and the transformed module must be well formed; any exception on the vtc side is a
failure. Graphs that stock TVM itself cannot build or run are discarded.

About 30% of the graphs are *symbolic*: some parameters have one or two symbolic dimensions
(``n``, ``b``: int64 ``tvm.tirx.Var``, shared by every parameter that uses them), the graph is
built on those shapes, and each module is compiled ONCE and run at 2-3 concrete sizes (the first
one sets every symbol to 1), on fresh random inputs per size. The generator keeps such programs
valid at every size it runs: a symbolic dimension is only ever combined with a provably equal
one or with a static 1, slices of a symbolic axis are never empty, a symbolic axis is split only
into sections that provably divide it, and so on.

With ``--target cuda`` the differential is the build, as no GPU runs here: stock TVM's default
CUDA pipeline builds the graph (else it is discarded), then the ``"vtc"`` pipeline must build it
with each strategy (DLight and our schedule rules, the source through nvcc where it is on PATH),
the default strategy launching no more kernels and planning no more memory than stock. Every
kernel one of our schedule rules took runs on llvm with its thread loops serial against the
kernel before scheduling (:mod:`tests.schedule_semantics`; WMMA ones through their untensorized
twins); the numerics of the rest, DLight's schedules, are checked on the GPU only (the
benchmarks, ``vtc-tvm --check``).

A graph is kept as the Python source that builds it (``Case.code``), so a failing example
prints, and is saved as, a standalone script.

Long campaign outside pytest::

    python -m tests.fuzz --graphs 2000 --seed 1 [--minutes 20] [--no-save] [--symbolic-percent 30]
                         [--target llvm|cuda]

prints the counts (generated, discarded, passed, mismatches, crashes; each also for the symbolic
graphs alone) and writes every new, shrunk failure to ``tests/regressions/case_<hash>.py`` as a
standalone pytest test (a symbolic case also saves its ``SIZES``).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import hashlib
import math
import os
import re
import shutil
import sys
import textwrap
import time
from typing import Dict, List, Optional, Tuple

import numpy as np
from hypothesis import HealthCheck, assume, given, seed as hyp_seed, settings
from hypothesis import strategies as st

import tvm
from tvm import relax

import vtc_tvm
from vtc_tvm.pipeline import store_side_pipeline
from tests.schedule_semantics import Recorder

# CUDA mode: kernels our schedule rules took, by rule, each checked on llvm (tests.schedule_semantics)
SCHEDULE_CHECKS: collections.Counter = collections.Counter()
REGRESSION_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "regressions")
MAX_ELEMS = 4096          # largest tensor a graph may create
INT64_MAX, INT64_MIN = 2**63 - 1, -(2**63)
TOLERANCE = {"float32": (1e-6, 1e-6), "float16": (1e-3, 1e-3)}   # (rtol, atol); ints: exact
STRATEGIES = ("contiguity", "all")
SYMBOLS = ("n", "b")       # names of the symbolic dimensions (int64 tirx Vars)
SYMBOLIC_PERCENT = 30     # share of symbolic graphs
MOVEMENT_OPS = ("permute_dims", "reshape", "flatten", "squeeze", "expand_dims", "strided_slice",
                "split", "concat", "stack", "broadcast_to", "tile", "repeat", "flip", "pad",
                "take", "gather_elements", "gather_nd", "layout_transform")


# ----------------------------------------------------------------------------------------------
# Cases
# ----------------------------------------------------------------------------------------------
Dim = object   # int, or Python source of an int64 expression over SYMBOLS ("n", "n * 2", ...)


@dataclasses.dataclass
class Input:
    name: str
    shape: Tuple[Dim, ...]
    dtype: str
    low: Optional[Tuple[Dim, ...]] = None    # integer index inputs: [low, high) per last-axis slot
    high: Optional[Tuple[Dim, ...]] = None   # (one pair when all slots share the range)


@dataclasses.dataclass
class Case:
    inputs: List[Input]
    body: List[str]           # lines inside ``with bb.dataflow():`` (or the plain function body)
    outputs: List[str]
    dtype: str
    dataflow: bool = True
    data_seed: int = 0
    ops: Tuple[str, ...] = ()
    symbols: Tuple[str, ...] = ()                 # symbolic dimensions (names in SYMBOLS)
    sizes: Tuple[Dict[str, int], ...] = ()        # concrete sizes to run at (symbolic cases)
    target: str = "llvm"                          # "cuda": the build is the differential (no GPU here)

    # -- source ------------------------------------------------------------------------------
    def build_source(self) -> str:
        """Source of ``build() -> IRModule``."""
        lines = ["def build():", "    bb = relax.BlockBuilder()"]
        for sym in self.symbols:
            lines.append(f"    {sym} = tvm.tirx.Var({sym!r}, 'int64')")
        for i in self.inputs:
            lines.append(f"    {i.name} = relax.Var({i.name!r}, relax.TensorType({shape_src(i.shape)}, {i.dtype!r}))")
        params = ", ".join(i.name for i in self.inputs)
        lines.append(f"    with bb.function(\"main\", [{params}]):")
        ind = "        "
        if self.dataflow:
            lines.append(ind + "with bb.dataflow():")
            ind += "    "
        lines += [ind + ln for ln in self.body]
        out = self.outputs[0] if len(self.outputs) == 1 else f"relax.Tuple([{', '.join(self.outputs)}])"
        if self.dataflow:
            lines.append(ind + f"out = bb.emit_output({out})")
            lines.append("        bb.emit_func_output(out)")
        else:
            lines.append(ind + f"bb.emit_func_output({out})")
        lines.append("    return bb.get()")
        return "\n".join(lines) + "\n"

    def inputs_source(self) -> str:
        what = "name, shape, dtype, index range [low, high) per last-axis slot"
        if self.symbols:
            what += " (strings: expressions of the symbolic sizes)"
        specs = ",\n".join(
            f"    ({i.name!r}, {tuple(i.shape)!r}, {i.dtype!r}, {i.low!r}, {i.high!r})" for i in self.inputs)
        src = f"INPUTS = [  # {what}\n{specs},\n]\nDATA_SEED = {self.data_seed}\n"
        if self.symbols:
            src += f"SIZES = {list(self.sizes)!r}  # run once per entry (one compiled module)\n"
        if self.target != "llvm":
            src += f"TARGET = {self.target!r}  # built, not run: see tests/fuzz.py's build_differential\n"
        return src

    def script(self) -> str:
        return self.inputs_source() + "\n\n" + self.build_source()

    def build(self) -> tvm.IRModule:
        ns = {"relax": relax, "tvm": tvm}
        exec(self.build_source(), ns)  # noqa: S102 - our own generated source
        return ns["build"]()

    def input_sets(self) -> List[Tuple[Optional[Dict[str, int]], List[np.ndarray]]]:
        return input_sets([(i.name, i.shape, i.dtype, i.low, i.high) for i in self.inputs], self.data_seed,
                          list(self.sizes) if self.symbols else None)


# -- symbolic dimensions -----------------------------------------------------------------------
_T = tvm.tirx
_SYM_VARS = {s: _T.Var(s, "int64") for s in SYMBOLS}   # for evaluating Dim sources only


def dim_value(e, sizes: Dict[str, int]) -> int:
    """The value of a dimension (int, Dim source or PrimExpr) at concrete symbol sizes."""
    if isinstance(e, (int, np.integer)):
        return int(e)
    if isinstance(e, str):
        e = eval(e, {"tvm": tvm, **_SYM_VARS})  # noqa: S307 - our own generated source
        if isinstance(e, int):
            return e
    if isinstance(e, _T.IntImm):
        return int(e.value)
    if isinstance(e, _T.Var):
        return int(sizes[e.name])
    if isinstance(e, _T.Cast):
        return dim_value(e.value, sizes)
    binary = {_T.Add: lambda a, b: a + b, _T.Sub: lambda a, b: a - b, _T.Mul: lambda a, b: a * b,
              _T.FloorDiv: lambda a, b: a // b, _T.FloorMod: lambda a, b: a % b, _T.Min: min, _T.Max: max}
    for cls, fn in binary.items():
        if isinstance(e, cls):
            return fn(dim_value(e.a, sizes), dim_value(e.b, sizes))
    raise ValueError(f"cannot evaluate dimension {e!r} ({type(e).__name__})")


def dim_src(e) -> Dim:
    """Python source of a dimension (int for a static one); evaluates with the symbols as
    ``tvm.tirx.Var`` and ``tvm`` in scope."""
    if isinstance(e, (int, np.integer)):
        return int(e)
    if isinstance(e, str):
        return e
    if isinstance(e, _T.IntImm):
        return int(e.value)

    def go(x, top=False):
        if isinstance(x, _T.IntImm):
            return str(int(x.value))
        if isinstance(x, _T.Var):
            return x.name
        for cls, op in ((_T.Add, "+"), (_T.Sub, "-"), (_T.Mul, "*"), (_T.FloorDiv, "//"), (_T.FloorMod, "%")):
            if isinstance(x, cls):
                txt = f"{go(x.a)} {op} {go(x.b)}"
                return txt if top else f"({txt})"
        for cls, fn in ((_T.Min, "min"), (_T.Max, "max")):
            if isinstance(x, cls):
                return f"tvm.tirx.{fn}({go(x.a, True)}, {go(x.b, True)})"
        if isinstance(x, _T.Cast):
            return go(x.value, top)
        raise ValueError(f"cannot print dimension {x!r} ({type(x).__name__})")
    return go(e, True)


def shape_src(shape) -> str:
    """Source of a shape tuple (symbolic dims unquoted)."""
    parts = [str(dim_src(d)) for d in shape]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def concrete(shape, sizes: Optional[Dict[str, int]]) -> Tuple[int, ...]:
    return tuple(dim_value(d, sizes or {}) for d in shape)


def make_inputs(specs, data_seed, sizes: Optional[Dict[str, int]] = None, k: int = 0) -> List[np.ndarray]:
    """Random inputs for ``specs``; ``sizes`` binds the symbolic dimensions; ``k`` (the index of
    the size) gives fresh data per size (``k == 0`` is the seed of static cases)."""
    rng = np.random.default_rng(data_seed if k == 0 else [data_seed, k])
    arrays = []
    for _name, shape, dtype, low, high in specs:
        shape = concrete(shape, sizes)
        if low is not None:  # index tensor: per-slot range along the last axis
            low, high = concrete(low, sizes), concrete(high, sizes)
            if len(low) == 1:
                a = rng.integers(low[0], high[0], size=shape)
            else:
                a = np.stack([rng.integers(lo, hi, size=shape[:-1]) for lo, hi in zip(low, high)], axis=-1)
            arrays.append(np.asarray(a, dtype=dtype).reshape(shape))
        elif dtype.startswith("int"):
            arrays.append(rng.integers(-5, 6, size=shape).astype(dtype))
        else:
            arrays.append(rng.standard_normal(size=shape).astype(dtype))
    return arrays


def input_sets(specs, data_seed, sizes: Optional[List[Dict[str, int]]] = None):
    """``[(sizes or None, arrays)]``: one set for a static case, one per size otherwise."""
    if not sizes:
        return [(None, make_inputs(specs, data_seed))]
    return [(sz, make_inputs(specs, data_seed, sz, k)) for k, sz in enumerate(sizes)]


# ----------------------------------------------------------------------------------------------
# Generator
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Val:
    name: str
    shape: Tuple[object, ...]   # int per static dim, the (Relax-inferred) PrimExpr per symbolic one
    kind: str          # "input" | "move" | "compute"
    uses: int = 0


def _monomial(e):
    """``(coefficient, [symbol vars])`` if ``e`` is a product of constants and symbols."""
    if isinstance(e, int):
        return e, []
    if isinstance(e, _T.IntImm):
        return int(e.value), []
    if isinstance(e, _T.Var):
        return 1, [e]
    if isinstance(e, _T.Mul):
        ma, mb = _monomial(e.a), _monomial(e.b)
        if ma is not None and mb is not None:
            return ma[0] * mb[0], ma[1] + mb[1]
    return None


def _n_symbols(e) -> int:
    """How many symbol occurrences a dimension has (``n * n`` has 2)."""
    if isinstance(e, _T.Var):
        return 1
    if isinstance(e, (int, _T.IntImm)):
        return 0
    if isinstance(e, _T.Cast):
        return _n_symbols(e.value)
    return _n_symbols(e.a) + _n_symbols(e.b) if hasattr(e, "a") else 2


def _primes(m):
    out, p = [], 2
    while m > 1:
        while m % p == 0:
            out.append(p)
            m //= p
        p += 1
    return out


class _Gen:
    """Draws one graph; every op is type-checked (normalized) as it is added."""

    def __init__(self, draw, dtype):
        self.draw = draw
        self.dtype = dtype
        self.inputs: List[Input] = []
        self.body: List[str] = []
        self.pool: List[Val] = []
        self.ns: Dict[str, object] = {"relax": relax, "tvm": tvm}
        self.nb = relax.BlockBuilder()
        self.counter = 0
        self.ops: List[str] = []
        self.leaves: List[Val] = []   # results that are only ever outputs
        self.symbols: List[str] = []  # symbolic graphs: the symbols parameters define
        self.sizes: List[Dict[str, int]] = [{}]
        self.ana = tvm.sym.Analyzer()

    # -- helpers -------------------------------------------------------------------------------
    def ints(self, lo, hi):
        return self.draw(st.integers(lo, hi))

    def choice(self, seq):
        return self.draw(st.sampled_from(list(seq)))

    def coin(self, p=0.5):
        return self.draw(st.integers(0, 999)) < int(p * 1000)

    def rare(self, p):
        """True with probability ``p``; shrinks towards False."""
        return self.draw(st.integers(0, 999)) >= 1000 - int(p * 1000)

    def fresh(self, prefix):
        self.counter += 1
        return f"{prefix}{self.counter}"

    # -- symbolic dimensions -------------------------------------------------------------------
    def set_symbols(self, symbols, sizes):
        self.symbols, self.sizes = list(symbols), [dict(sz) for sz in sizes]
        for sym in symbols:
            self.ns[sym] = tvm.tirx.Var(sym, "int64")

    @staticmethod
    def static(d) -> bool:
        return isinstance(d, int)

    def sym_or(self, d, p=0.2):
        """In a symbolic graph, sometimes a symbol (as a PrimExpr) instead of ``d``."""
        if self.symbols and self.rare(p):
            return self.ns[self.choice(self.symbols)]
        return d

    def pick_axis(self, x: Val) -> int:
        """An axis of ``x``; in a symbolic graph often one of its symbolic axes."""
        sym = [a for a, d in enumerate(x.shape) if not self.static(d)]
        if sym and self.coin(0.5):
            return self.choice(sym)
        return self.ints(0, len(x.shape) - 1)

    def deq(self, a, b) -> bool:
        """``a == b`` provably, for every size (what Relax can prove too)."""
        if self.static(a) and self.static(b):
            return a == b
        a = tvm.tirx.const(a, "int64") if self.static(a) else a
        b = tvm.tirx.const(b, "int64") if self.static(b) else b
        return bool(self.ana.can_prove_equal(a, b))

    def shape_eq(self, s1, s2) -> bool:
        return len(s1) == len(s2) and all(self.deq(a, b) for a, b in zip(s1, s2))

    def min_dim(self, d) -> int:
        """The smallest value of a dimension over the sizes this graph runs at."""
        return min(dim_value(d, sz) for sz in self.sizes)

    def shape_ok(self, shape) -> bool:
        """Non-empty and at most MAX_ELEMS at every size."""
        for sz in self.sizes:
            try:
                dims = [dim_value(d, sz) for d in shape]
            except ValueError:
                return False
            if min(dims, default=1) < 1 or math.prod(dims) > MAX_ELEMS:
                return False
        return True

    def new_input(self, shape, dtype=None, low=None, high=None, prefix="x") -> Val:
        name = self.fresh(prefix)
        dtype = dtype or self.dtype
        shape = tuple(dim_src(d) for d in shape)
        if low is not None:
            low, high = tuple(dim_src(d) for d in low), tuple(dim_src(d) for d in high)
        self.inputs.append(Input(name, shape, dtype, low, high))
        self.ns[name] = var = relax.Var(name, relax.TensorType(eval(shape_src(shape), self.ns), dtype))  # noqa: S307
        v = Val(name, tuple(int(d) if isinstance(d, _T.IntImm) else d for d in var.ty.shape.values), "input")
        if low is None:
            self.pool.append(v)
        return v

    def emit(self, rhs: str, kind: str, op: str, add_to_pool=True) -> Optional[Val]:
        """Type-check ``rhs``; on success add ``name = bb.emit(rhs)``. None if the result is
        empty or too large at some size, or (symbolic graphs) of unknown shape or rejected by
        Relax (nothing is added then)."""
        try:
            expr = self.nb.normalize(eval(rhs, self.ns))  # noqa: S307 - our own generated source
        except Exception:  # noqa: BLE001
            if not self.symbols:
                raise
            return None
        ty = expr.ty
        name = self.fresh("t" if isinstance(ty, relax.TupleType) else ("m" if kind == "move" else "c"))
        if isinstance(ty, relax.TensorType):
            if ty.shape is None:
                return None
            shape = tuple(int(d) if isinstance(d, _T.IntImm) else d for d in ty.shape.values)
            if not self.shape_ok(shape):
                return None
        else:
            shape = ()
        self.ns[name] = relax.Var(name, ty)
        self.body.append(f"{name} = bb.emit({rhs})")
        self.ops.append(op)
        v = Val(name, shape, kind)
        if add_to_pool and isinstance(ty, relax.TensorType):
            self.pool.append(v)
        elif kind == "compute":
            self.leaves.append(v)
        return v

    def pick(self, prefer=None, rank_ok=lambda r: True) -> Optional[Val]:
        cands = [v for v in self.pool if rank_ok(len(v.shape))]
        if not cands:
            return None
        if prefer:
            pref = [v for v in cands if v.kind == prefer]
            if pref and self.coin(0.75):
                cands = pref
        if self.symbols:  # symbolic graphs: mostly work on the symbolic-shaped values
            sym = [v for v in cands if not all(self.static(d) for d in v.shape)]
            if sym and self.coin(0.6):
                cands = sym
        # index from the most recent: shrinks towards the newest value
        v = cands[len(cands) - 1 - self.ints(0, len(cands) - 1)]
        return v

    def use(self, *vals):
        for v in vals:
            v.uses += 1

    def axis_code(self, axis, rank):
        """An axis, sometimes written negatively."""
        return axis - rank if self.coin(0.3) else axis

    # -- movement ops --------------------------------------------------------------------------
    def movement(self) -> Optional[Val]:
        x = self.pick(prefer=None)
        if x is None:
            return None
        r = len(x.shape)
        # rank-0 tensors (full reductions, scalar take indices) only reshape / broadcast
        op = self.choice(MOVEMENT_OPS if r else ("reshape", "expand_dims", "broadcast_to", "flatten",
                                                  "tile", "permute_dims", "pad"))
        fn = getattr(self, "mv_" + op)
        out = fn(x, r)
        if out is None and r:  # not applicable to this tensor: a permute always is
            out = self.mv_permute_dims(x, r)
        return out

    def _mv(self, x, rhs, op):
        out = self.emit(rhs, "move", op)
        if out is not None:
            self.use(x)
        return out

    def mv_permute_dims(self, x, r):
        if r > 1 and self.coin(0.15):
            return self._mv(x, f"relax.op.permute_dims({x.name})", "permute_dims")
        axes = list(self.draw(st.permutations(list(range(r)))))
        return self._mv(x, f"relax.op.permute_dims({x.name}, axes={axes})", "permute_dims")

    def mv_reshape(self, x, r):
        if not all(self.static(d) for d in x.shape):
            return self._reshape_symbolic(x)
        n = math.prod(x.shape)
        primes = _primes(n)
        rank = self.ints(1, 5)
        dims = [1] * rank
        for q in primes:
            dims[self.ints(0, rank - 1)] *= q
        if self.coin(0.25):
            dims[self.ints(0, rank - 1)] = -1
        return self._mv(x, f"relax.op.reshape({x.name}, {dims})", "reshape")

    def _reshape_symbolic(self, x):
        """Distribute the factors of the size (primes, symbols, other symbolic dims as a whole)
        over the new dims: the element count stays provably the same."""
        atoms = []
        for d in x.shape:
            mono = _monomial(d)
            if mono is None:
                atoms.append(f"({dim_src(d)})")
            else:
                atoms += [str(q) for q in _primes(mono[0])] + [v.name for v in mono[1]]
        rank = self.ints(1, 5)
        dims = [[] for _ in range(rank)]
        for atom in atoms:
            dims[self.ints(0, rank - 1)].append(atom)
        srcs = []
        for parts in dims:
            const = math.prod(int(a) for a in parts if a.isdigit())
            syms = [a for a in parts if not a.isdigit()]
            srcs.append(" * ".join(syms + ([str(const)] if const != 1 or not syms else [])))
        if self.coin(0.25):
            srcs[self.ints(0, rank - 1)] = "-1"
        return self._mv(x, f"relax.op.reshape({x.name}, [{', '.join(srcs)}])", "reshape")

    def mv_flatten(self, x, r):
        return self._mv(x, f"relax.op.flatten({x.name})", "flatten")

    def mv_squeeze(self, x, r):
        ones = [a for a, d in enumerate(x.shape) if self.static(d) and d == 1]
        if not ones or r == 1:
            return self.mv_expand_dims(x, r)
        # (no axes: Relax cannot tell which symbolic dims are 1)
        if self.coin(0.25) and len(ones) < r and all(self.static(d) for d in x.shape):
            return self._mv(x, f"relax.op.squeeze({x.name})", "squeeze")
        k = self.ints(1, min(len(ones), r - 1))
        axes = sorted(self.draw(st.permutations(ones))[:k])
        axes = [self.axis_code(a, r) for a in axes]
        arg = axes[0] if len(axes) == 1 and self.coin() else axes
        return self._mv(x, f"relax.op.squeeze({x.name}, axis={arg})", "squeeze")

    def mv_expand_dims(self, x, r):
        if r >= 5:
            return None
        k = self.ints(1, 2)
        new_r = r + k
        axes = sorted(self.draw(st.permutations(list(range(new_r))))[:k])
        axes = [self.axis_code(a, new_r) for a in axes]
        arg = axes[0] if len(axes) == 1 and self.coin() else axes
        return self._mv(x, f"relax.op.expand_dims({x.name}, axis={arg})", "expand_dims")

    def _bound(self, d):
        kind = self.ints(0, 9)
        if kind <= 6:
            return self.ints(-d - 2, d + 2)
        return self.choice([INT64_MAX, INT64_MIN, 2**31 - 1, -(2**31), d + 100, -d - 100])

    def mv_strided_slice(self, x, r):
        k = self.ints(1, r)
        axes = list(self.draw(st.permutations(list(range(r)))))[:k]
        begin, end, strides = [], [], []
        for a in axes:
            d = x.shape[a]
            if not self.static(d):  # never empty, whatever the size
                b, e, step = self._symbolic_slice(self._shares_symbol(x.shape, a))
                begin.append(b)
                end.append(e)
                strides.append(step)
                continue
            step = self.choice([1, 1, 2, 3, -1, -1, -2, -3])
            b, e = self._bound(d), self._bound(d)
            if not len(range(*slice(b, e, step).indices(d))):
                b, e = e, b  # an empty slice: stock TVM rejects it, try the other way round
            if not len(range(*slice(b, e, step).indices(d))):
                e = INT64_MAX if step > 0 else INT64_MIN
            begin.append(b)
            end.append(e)
            strides.append(step)
        if all(self.static(d) for d in x.shape):
            axes_c = [self.axis_code(a, r) for a in axes]
        else:  # stock TVM cannot slice a symbolic-shaped tensor along a negative axis
            axes_c = axes
        if all(s == 1 for s in strides) and self.coin():
            rhs = f"relax.op.strided_slice({x.name}, axes={axes_c}, begin={begin}, end={end})"
        else:
            rhs = f"relax.op.strided_slice({x.name}, axes={axes_c}, begin={begin}, end={end}, strides={strides})"
        return self._mv(x, rhs, "strided_slice")

    @staticmethod
    def _shares_symbol(shape, axis) -> bool:
        """Does a symbol of dim ``axis`` also occur in another dim of ``shape``?"""
        names = {v.name for v in tvm.tirx.analysis.undefined_vars(shape[axis])}
        return any(names & {v.name for v in tvm.tirx.analysis.undefined_vars(d)}
                   for a, d in enumerate(shape) if a != axis and not isinstance(d, int))

    def _symbolic_slice(self, shared: bool):
        """(begin, end, step) of a slice of a symbolic axis that is non-empty at every size >= 1.

        Only patterns stock TVM 0.27 gets right (it is the oracle): it miscompiles ``[-1::-2]``
        and ``[MAX::-2]`` of any symbolic axis, and, where the axis' symbol also occurs in another
        dim (``shared``; e.g. ``(n, n)[:, -1:]``), slices that begin at -1 or -2 or run backwards
        from 0 (wrong values, or an uninitialized output)."""
        k = self.ints(1, 3)
        pats = [
            (0, INT64_MAX, 1),              # everything
            (0, k, 1),                      # the first min(k, n)
            (0, INT64_MAX, k + 1),          # strided (stays physical in vtc)
            (INT64_MAX, INT64_MIN, -1),     # reversed
            (-1, INT64_MIN, -1),            # reversed
            (-3, INT64_MAX, 1),             # the last min(3, n)
        ]
        if not shared:
            pats += [(-k, INT64_MAX, 1),    # the last min(k, n)
                     (-1, INT64_MAX, 1),    # the last one (the LLM "last token")
                     (-1, INT64_MAX, k + 1)]  # the last one, strided
        return self.choice(pats)

    def mv_split(self, x, r):
        axis = self.pick_axis(x)
        d = x.shape[axis]
        if not self.static(d):
            # a symbolic axis: only into sections that provably divide it
            mono = _monomial(d)
            divs = [q for q in (1, 2, 3, 4) if mono is not None and mono[0] % q == 0]
            arg = str(self.choice(divs)) if divs else "1"
        elif self.coin():
            parts = self.ints(1, min(d, 4))
            arg = str(parts)
        else:
            k = self.ints(1, 3)
            idx = sorted(set(self.ints(0, d) for _ in range(k)))  # strictly increasing
            if self.coin(0.2):
                idx[-1] = d + self.ints(0, 3)  # past the end
            arg = str(idx)
        t = self.emit(f"relax.op.split({x.name}, {arg}, axis={self.axis_code(axis, r)})", "move", "split")
        if t is None:
            return None
        self.use(x)
        if isinstance(self.ns[t.name].ty, relax.TensorType):  # one section: a plain tensor
            return t
        fields = self.ns[t.name].ty.fields
        live = [i for i, f in enumerate(fields)
                if isinstance(f, relax.TensorType) and f.shape is not None and self.shape_ok(f.shape.values)]
        if not live:
            return None
        n_take = self.ints(1, len(live))
        chosen = sorted(self.draw(st.permutations(live))[:n_take])
        last = None
        for i in chosen:
            v = self.emit(f"relax.TupleGetItem({t.name}, {i})", "move", "split")
            last = v or last
        return last

    def _compatible_pieces(self, x, axis, same_shape):
        """2..4 tensors that concat/stack with ``x`` along ``axis``."""
        r = len(x.shape)
        n = self.ints(2, 4)
        pieces = [x]
        for _ in range(n - 1):
            how = self.ints(0, 3)
            if how == 0:
                pieces.append(x)  # the same tensor twice
            elif how == 1:
                shape = list(x.shape)
                if not same_shape:
                    shape[axis] = self.sym_or(self.ints(1, 6), 0.3)
                pieces.append(self.new_input(shape))
            elif how == 2:
                compat = [v for v in self.pool if len(v.shape) == r and all(
                    (a == axis and not same_shape) or self.deq(v.shape[a], x.shape[a]) for a in range(r))]
                pieces.append(compat[self.ints(0, len(compat) - 1)] if compat else x)
            else:  # another view of x, emitted first
                fa = self.ints(0, r - 1)
                v = self.emit(f"relax.op.flip({x.name}, axis={fa})", "move", "flip")
                pieces.append(v if v is not None else x)
                if v is not None:
                    self.use(x)
        perm = list(self.draw(st.permutations(list(range(len(pieces))))))
        return [pieces[i] for i in perm]

    def _tuple_arg(self, pieces):
        lst = "[" + ", ".join(p.name for p in pieces) + "]"
        if self.coin(0.25):  # a bound tuple variable instead of a literal
            t = self.emit(f"relax.Tuple({lst})", "move", "tuple", add_to_pool=False)
            return t.name
        return lst

    def mv_concat(self, x, r):
        axis = self.pick_axis(x)
        pieces = self._compatible_pieces(x, axis, same_shape=False)
        arg = self._tuple_arg(pieces)
        out = self.emit(f"relax.op.concat({arg}, axis={self.axis_code(axis, r)})", "move", "concat")
        if out is not None:
            self.use(*pieces)
        return out

    def mv_stack(self, x, r):
        if r >= 5:
            return None
        axis = self.ints(0, r)
        pieces = self._compatible_pieces(x, 0, same_shape=True)
        arg = self._tuple_arg(pieces)
        out = self.emit(f"relax.op.stack({arg}, axis={self.axis_code(axis, r + 1)})", "move", "stack")
        if out is not None:
            self.use(*pieces)
        return out

    def mv_broadcast_to(self, x, r):
        # a static 1 may become anything (a symbol too); a symbolic dim stays itself
        lead = [self.sym_or(self.ints(1, 4)) for _ in range(self.ints(0, max(0, min(2, 5 - r))))]
        shape = lead + [self.sym_or(self.ints(1, 4)) if self.static(d) and d == 1 else d for d in x.shape]
        shape = "[" + ", ".join(str(dim_src(d)) for d in shape) + "]"
        return self._mv(x, f"relax.op.broadcast_to({x.name}, {shape})", "broadcast_to")

    def mv_tile(self, x, r):
        n = self.ints(max(1, r - 1), min(r + 1, 5))  # shorter repeats are left-padded with 1s
        reps = [self.ints(1, 3) for _ in range(n)]
        arg = reps[0] if n == 1 and self.coin() else reps
        return self._mv(x, f"relax.op.tile({x.name}, {arg})", "tile")

    def mv_repeat(self, x, r):
        reps = self.ints(1, 3)
        if self.coin(0.2):
            return self._mv(x, f"relax.op.repeat({x.name}, {reps})", "repeat")
        axis = self.axis_code(self.ints(0, r - 1), r)
        return self._mv(x, f"relax.op.repeat({x.name}, {reps}, axis={axis})", "repeat")

    def mv_flip(self, x, r):
        axis = self.axis_code(self.ints(0, r - 1), r)
        return self._mv(x, f"relax.op.flip({x.name}, axis={axis})", "flip")

    def mv_pad(self, x, r):
        width = []
        for _ in range(r):
            width += [self.ints(0, 2), self.ints(0, 2)]
        value = self.choice([0.0, 1.5, -2.25] if self.dtype != "int32" else [0.0, 3.0, -2.0, 1.5])
        if self.coin(0.3):
            return self._mv(x, f"relax.op.nn.pad({x.name}, {width})", "pad")
        return self._mv(x, f"relax.op.nn.pad({x.name}, {width}, pad_value={value})", "pad")

    def index_input(self, shape, dtype, low, high, any_shape=False) -> Val:
        """An index tensor: a function input, sometimes seen through a movement op (a virtual
        index tensor); the values stay in range."""
        how = self.ints(0, 3) if shape else 0
        if how == 2 and any_shape and len(shape) > 1:  # permuted input, any shape is fine
            perm = list(self.draw(st.permutations(list(range(len(shape))))))
            src = self.new_input([shape[p] for p in perm], dtype, low, high, prefix="i")
            inv = [perm.index(a) for a in range(len(shape))]
            v = self.emit(f"relax.op.permute_dims({src.name}, axes={inv})", "move", "permute_dims",
                          add_to_pool=False)
            return v
        src = self.new_input(shape, dtype, low, high, prefix="i")
        if how == 1 and len(low) == 1:
            axis = self.ints(0, len(shape) - 1)
            return self.emit(f"relax.op.flip({src.name}, axis={axis})", "move", "flip", add_to_pool=False)
        if how == 3 and len(low) == 1:  # concat of two index inputs
            axis = self.ints(0, len(shape) - 1)
            cut = self.ints(0, shape[axis]) if self.static(shape[axis]) else 0
            if 0 < cut < shape[axis]:
                s1, s2 = list(shape), list(shape)
                s1[axis], s2[axis] = cut, shape[axis] - cut
                self.inputs.pop()
                a = self.new_input(s1, dtype, low, high, prefix="i")
                b = self.new_input(s2, dtype, low, high, prefix="i")
                return self.emit(f"relax.op.concat([{a.name}, {b.name}], axis={axis})", "move", "concat",
                                 add_to_pool=False)
        return src

    def mv_take(self, x, r):
        axis = self.pick_axis(x)
        n = x.shape[axis]
        mode = self.choice(["fast", "fast", "clip", "wrap"])
        if mode == "fast":
            lo, hi = 0, n
        elif mode == "clip":
            lo, hi = -3, n + 3
        else:
            lo, hi = -2 * n, 2 * n
        irank = self.ints(0, 2)
        ishape = [self.sym_or(self.ints(1, 4)) for _ in range(irank)]
        idx = self.index_input(ishape, self.choice(["int64", "int32"]), (lo,), (hi,), any_shape=True)
        mode_arg = "" if mode == "fast" and self.coin() else f", mode={mode!r}"
        out = self.emit(f"relax.op.take({x.name}, {idx.name}, axis={self.axis_code(axis, r)}{mode_arg})",
                        "move", "take")
        if out is not None:
            self.use(x)
        return out

    def mv_gather_elements(self, x, r):
        axis = self.pick_axis(x)
        ishape = [self.sym_or(self.ints(1, 6)) if a == axis else
                  self.ints(1, d) if self.static(d) else (d if self.coin() else 1) for a, d in enumerate(x.shape)]
        idx = self.index_input(ishape, self.choice(["int64", "int32"]), (0,), (x.shape[axis],))
        out = self.emit(f"relax.op.gather_elements({x.name}, {idx.name}, axis={self.axis_code(axis, r)})",
                        "move", "gather_elements")
        if out is not None:
            self.use(x)
        return out

    def mv_gather_nd(self, x, r):
        b = self.ints(0, min(1, r - 1))
        k = self.ints(1, r - b)
        m = self.ints(0, 2)
        ishape = list(x.shape[:b]) + [self.ints(1, 3) for _ in range(m)] + [k]
        lows = tuple(0 for _ in range(k))
        highs = tuple(x.shape[b + q] for q in range(k))
        idx = self.index_input(ishape, "int64", lows, highs)  # Relax: int64 only
        bd = f", batch_dims={b}" if b or self.coin() else ""
        out = self.emit(f"relax.op.gather_nd({x.name}, {idx.name}{bd})", "move", "gather_nd")
        if out is not None:
            self.use(x)
        return out

    def mv_layout_transform(self, x, r):
        if r >= 5:
            return None
        names = [f"a{i}" for i in range(r)]
        if self.coin():
            axis = self.pick_axis(x)
            f = self.ints(2, 4)
            d = x.shape[axis]
            if not self.static(d):  # a symbolic axis: only split by a factor that divides it
                mono = _monomial(d)
                divs = [q for q in (2, 3, 4) if mono is not None and mono[0] % q == 0]
                if not divs:
                    return None
                f = self.choice(divs)
            outs = names[:axis] + [f"{names[axis]} // {f}", f"{names[axis]} % {f}"] + names[axis + 1:]
            pad = self.static(d) and d % f != 0
        else:
            outs = [names[i] for i in self.draw(st.permutations(list(range(r))))]
            pad = False
        lam = f"lambda {', '.join(names)}: ({', '.join(outs)},)"
        pv = ""
        if pad:
            pv = f", pad_value={self.choice([0.0, 2.0] if self.dtype != 'int32' else [0, 2])}"
        return self._mv(x, f"relax.op.layout_transform({x.name}, index_map={lam}{pv})", "layout_transform")

    # -- compute ops ---------------------------------------------------------------------------
    def compute(self) -> Optional[Val]:
        floaty = self.dtype == "float32"
        ops = ["add", "multiply", "subtract", "relu"]
        if floaty:
            ops += ["matmul", "matmul", "sum", "max", "mean", "softmax", "conv2d",
                    "cumsum", "argmax", "sort", "astype"]
        elif self.dtype == "float16":
            ops += ["max"]
        op = self.choice(ops)
        x = self.pick(prefer="move")
        if x is None:
            return None
        r = len(x.shape)
        if r == 0 and op not in ("add", "multiply", "subtract", "relu"):
            op = "relu"
        if op in ("add", "multiply", "subtract"):
            how = self.ints(0, 3)
            if how == 0:  # another value of the same shape (often virtual too)
                same = [v for v in self.pool if self.shape_eq(v.shape, x.shape)]
                y = same[self.ints(0, len(same) - 1)]
            elif how == 1:
                y = x
            elif how == 2:
                y = self.new_input(x.shape)
            else:  # broadcasting operand
                k = self.ints(min(1, r), r)
                y = self.new_input(tuple(1 if self.coin(0.3) else d for d in x.shape[r - k:]))  # 1s broadcast
            a, b = (x, y) if self.coin() else (y, x)
            out = self.emit(f"relax.op.{op}({a.name}, {b.name})", "compute", op)
            if out is not None:
                self.use(x, y)
            return out
        if op == "relu":
            rhs = f"relax.op.nn.relu({x.name})"
        elif op == "cumsum" and sum(_n_symbols(d) for d in x.shape) > 1:
            # stock TVM takes minutes to compile cumsum over several symbolic dims (e.g. (7, n, n, n))
            rhs = f"relax.op.nn.relu({x.name})"
            op = "relu"
        elif op == "cumsum":
            rhs = f"relax.op.cumsum({x.name}, axis={self.axis_code(self.ints(0, r - 1), r)})"
        elif op == "argmax":
            rhs = f"relax.op.argmax({x.name}, axis={self.axis_code(self.ints(0, r - 1), r)})"
        elif op == "sort":
            rhs = f"relax.op.sort({x.name}, axis={self.axis_code(self.ints(0, r - 1), r)})"
        elif op == "astype":
            rhs = f"relax.op.astype({x.name}, 'float64')"
        elif op == "matmul":
            both = [v for v in self.pool if len(v.shape) == 2 and self.deq(v.shape[0], x.shape[-1])]
            if both and self.coin(0.3):  # two (often virtual) operands
                y = both[self.ints(0, len(both) - 1)]
                self.use(y)
                rhs = f"relax.op.matmul({x.name}, {y.name})"
            elif r >= 2 and self.coin(0.3):  # x on the right: (M, K) @ x
                a = self.new_input((self.ints(1, 8), x.shape[-2]), prefix="w")
                rhs = f"relax.op.matmul({a.name}, {x.name})"
            else:
                w = self.new_input((x.shape[-1], self.ints(1, 8)), prefix="w")
                rhs = f"relax.op.matmul({x.name}, {w.name})"
        elif op in ("sum", "max", "mean"):
            axis = self.axis_code(self.ints(0, r - 1), r)
            keep = self.coin(0.3)
            rhs = f"relax.op.{op}({x.name}, axis=[{axis}], keepdims={keep})"
        elif op == "softmax":
            rhs = f"relax.op.nn.softmax({x.name}, axis={self.axis_code(self.ints(0, r - 1), r)})"
        else:  # conv2d
            if r != 4:
                x4 = self.pick(prefer="move", rank_ok=lambda k: k == 4)
                if x4 is None:
                    rhs = f"relax.op.nn.relu({x.name})"
                    op = "relu"
                else:
                    x = x4
            if op == "conv2d":
                _, c, h, w_ = x.shape
                pad = self.ints(0, 1)
                h, w_ = self.min_dim(h), self.min_dim(w_)   # the kernel fits at every size
                kh, kw = self.ints(1, min(3, h + 2 * pad)), self.ints(1, min(3, w_ + 2 * pad))
                wt = self.new_input((self.ints(1, 4), c, kh, kw), prefix="w")
                stride = self.ints(1, 2)
                rhs = f"relax.op.nn.conv2d({x.name}, {wt.name}, strides={stride}, padding={pad})"
        # argmax / astype change the dtype: leaves only (outputs), never reused
        out = self.emit(rhs, "compute", op, add_to_pool=op not in ("argmax", "astype"))
        if out is not None:
            self.use(x)
        return out


@st.composite
def graphs(draw, max_ops: int = 8, symbolic_percent: int = SYMBOLIC_PERCENT) -> Case:
    dtype = ["float32"] * 7 + ["int32"] * 2 + ["float16"]
    dtype = dtype[draw(st.integers(0, 9))]  # shrinks towards float32
    g = _Gen(draw, dtype)
    symbolic = g.ints(0, 99) >= 100 - symbolic_percent   # shrinks towards a static graph
    shapes = [[g.ints(1, 8) for _ in range(g.ints(1, 4))] for _ in range(g.ints(1, 3))]
    if symbolic:
        # 1-2 symbols, each a bare dim of some parameter (which defines it); parameters that
        # draw the same symbol share it (a batch or sequence dim that must agree)
        symbols = list(SYMBOLS[:g.ints(1, 2)])
        for shape in shapes:
            for a in range(len(shape)):
                if g.rare(0.35) and sum(isinstance(d, str) for d in shape) < 2:  # 1-2 per parameter
                    shape[a] = g.choice(symbols)
        if not any(isinstance(d, str) for shape in shapes for d in shape):
            shapes[0][g.ints(0, len(shapes[0]) - 1)] = symbols[0]
        symbols = [sym for sym in symbols if any(d == sym for shape in shapes for d in shape)]
        # every symbol is 1 in the first run, then 2..6, then (sometimes) anything in 1..7
        sizes = [{sym: 1 for sym in symbols}, {sym: g.ints(2, 6) for sym in symbols}]
        if g.rare(0.5):
            sizes.append({sym: g.ints(1, 7) for sym in symbols})
        g.set_symbols(symbols, sizes)
    for shape in shapes:
        g.new_input([g.ns[d] if isinstance(d, str) else d for d in shape])
    n_ops = g.ints(1, max_ops)
    for _ in range(n_ops):
        kind = g.ints(0, 9)
        if kind < 6:
            g.movement()
        else:
            g.compute()
    produced = [v for v in g.pool if v.kind != "input"]
    assume(produced)
    produced += [v for v in g.leaves]
    outs = [v for v in produced if v.uses == 0]
    extra = [v for v in produced if v.uses > 0 and g.coin(0.15)]  # a used value also returned
    outs = [v.name for v in produced if v in outs or v in extra]
    data_seed = g.ints(0, 2**16)
    return Case(g.inputs, g.body, outs, dtype, dataflow=not g.coin(0.1), data_seed=data_seed,
                ops=tuple(g.ops), symbols=tuple(g.symbols), sizes=tuple(g.sizes) if g.symbols else ())


# ----------------------------------------------------------------------------------------------
# Differential runner
# ----------------------------------------------------------------------------------------------
class StockFailure(Exception):
    """Stock TVM cannot build or run the graph: not a vtc bug, the graph is discarded."""


class VtcFailure(AssertionError):
    def __init__(self, kind, strategy, stage, detail, signature):
        super().__init__(f"[{kind}] strategy={strategy!r} stage={stage}: {detail}")
        self.kind, self.strategy, self.stage, self.detail, self.signature = kind, strategy, stage, detail, signature


_PIPELINE = None


def _pipeline():
    global _PIPELINE
    if _PIPELINE is None:
        _PIPELINE = relax.get_default_pipeline(tvm.target.Target("llvm"))
    return _PIPELINE


def compile_vm(mod, stores=False):
    """Stock's pipeline; with ``stores``, plus the store side after FuseTIR (as vtc's)."""
    pipeline = store_side_pipeline(tvm.target.Target("llvm")) if stores else _pipeline()
    ex = tvm.compile(mod, target="llvm", relax_pipeline=pipeline)
    return relax.VirtualMachine(ex, tvm.cpu())


def run_vm(vm, arrays):
    out = vm["main"](*[tvm.runtime.tensor(a) for a in arrays])
    outs = list(out) if not isinstance(out, tvm.runtime.Tensor) else [out]
    return [o.numpy() for o in outs]


def compile_and_run(mod, arrays):
    return run_vm(compile_vm(mod), arrays)


def _norm(msg: str) -> str:
    """An error message with names and numbers stripped: groups one bug's crashes. Its last line,
    or a compiler's first diagnostic (nvcc ends with "N errors detected in ...", the same for
    every bug)."""
    lines = [ln.strip() for ln in msg.strip().splitlines() if ln.strip()]
    diagnostics = [ln for ln in lines if ": error: " in ln or ln.startswith("error: ")]
    line = diagnostics[0] if diagnostics else lines[-1] if lines else ""
    # file paths (nvcc names its random temporary directory: a shrinking replay of the same bug
    # would otherwise count as another bug, and hypothesis reported the failure as flaky)
    line = re.sub(r"(?:/[\w.\-]+)+", "PATH", line)
    line = re.sub(r"\b[a-zA-Z_]+\d+\b", "N", line)
    line = re.sub(r"-?\d+", "N", line)
    return line[:120]


def compare(expected, got, dtype_tol) -> Optional[str]:
    if len(expected) != len(got):
        return f"{len(got)} outputs, expected {len(expected)}"
    for k, (e, g) in enumerate(zip(expected, got)):
        if e.shape != g.shape or e.dtype != g.dtype:
            return f"output {k}: {g.dtype}{g.shape}, expected {e.dtype}{e.shape}"
        if e.dtype.kind in "iub":
            bad = e != g
        else:
            rtol, atol = TOLERANCE.get(str(e.dtype), (1e-6, 1e-6))
            bad = ~np.isclose(g, e, rtol=rtol, atol=atol, equal_nan=True)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            return (f"output {k} {e.dtype}{e.shape}: {int(bad.sum())}/{e.size} elements differ; "
                    f"first at {where}: got {g[where]!r}, expected {e[where]!r}")
    return None


def differential(mod: tvm.IRModule, arrays, strategies=STRATEGIES, reports=None):
    """Raise StockFailure / VtcFailure; return the transformed modules on agreement.

    ``arrays``: the inputs (a list of arrays), or ``input_sets(...)``: ``[(sizes, arrays)]``,
    one entry per concrete size of a symbolic module. Each module is compiled once and run on
    every set."""
    sets = arrays if arrays and isinstance(arrays[0], tuple) else [(None, arrays)]
    try:
        vm = compile_vm(mod)
        expected = [run_vm(vm, xs) for _, xs in sets]
    except Exception as err:  # noqa: BLE001
        raise StockFailure(f"{type(err).__name__}: {str(err).strip().splitlines()[-1:]}") from err
    symbolic = sets[0][0] is not None
    tag = "sym:" if symbolic else ""
    results = {}
    for strategy in strategies:
        report = [] if reports is None else reports.setdefault(strategy, [])
        stage = "VirtualTensorize"
        try:
            new = vtc_tvm.VirtualTensorize(strategy=strategy, report=report)(mod)
            stage = "check_well_formed"
            if not relax.analysis.check_well_formed(new):
                raise VtcFailure("crash", strategy, stage, "transformed module is not well formed",
                                 tag + "crash:ill-formed")
            stage = "compile/run"
            vm = compile_vm(new, stores=True)
            for k, (sizes, xs) in enumerate(sets):
                at = f" at sizes {sizes}" if symbolic else ""
                try:
                    got = run_vm(vm, xs)
                except Exception as err:  # noqa: BLE001
                    raise VtcFailure("crash", strategy, "run" + at, f"{type(err).__name__}: {err}",
                                     f"{tag}crash:run:{type(err).__name__}:{_norm(str(err))}") from err
                problem = compare(expected[k], got, None)
                if problem:
                    raise VtcFailure("mismatch", strategy, "compare", problem + at, tag + "mismatch")
        except VtcFailure:
            raise
        except Exception as err:  # noqa: BLE001
            detail = f"{type(err).__name__}: {err}"
            raise VtcFailure("crash", strategy, stage, detail,
                             f"{tag}crash:{stage}:{type(err).__name__}:{_norm(str(err))}") from err
        results[strategy] = new
    return results


def cuda_sources(ex) -> str:
    """The CUDA source of a built executable (its device modules, imported by the host's)."""
    found, todo = [], [ex.mod]
    while todo:
        m = todo.pop()
        if m.kind == "cuda":
            found.append(m.inspect_source())
        todo += list(m.imports)
    return "\n".join(found)


def cuda_build(mod: tvm.IRModule, pipeline=None) -> None:
    """Build ``mod`` for the H100/H200 CUDA target (``pipeline``: stock's default when None) and
    compile its source with nvcc where nvcc is on PATH."""
    from vtc_tvm.pipeline import cuda_target

    target = cuda_target()
    ex = tvm.compile(mod, target=target) if pipeline is None else tvm.compile(mod, target=target, relax_pipeline=pipeline)
    src = cuda_sources(ex)
    if src and shutil.which("nvcc"):
        from tvm.support import nvcc

        with target:  # nvcc asks the current target for its compute version
            nvcc.compile_cuda(src, target_format="ptx", arch="sm_90", compiler="nvcc")


def build_differential(mod: tvm.IRModule, strategies=STRATEGIES, symbolic: bool = False):
    """The CUDA side, where no GPU can run the kernels: stock TVM's default CUDA pipeline must
    build the graph (else it is discarded); then each strategy's module must build through the
    rest of the ``"vtc"`` pipeline (store side, DLight and our schedule rules, nvcc), as
    :func:`differential` builds it on LLVM, every kernel our rules scheduled must compute on
    llvm, its threads serial, what it computed before (:mod:`tests.schedule_semantics`), and the
    default strategy must launch no more kernels
    and plan no more memory than stock (:func:`vtc_tvm.report.kernel_census`; ``"all"`` takes
    every legal edge, whatever it costs). Raise StockFailure / VtcFailure."""
    from vtc_tvm.pipeline import cuda_target
    from vtc_tvm.report import kernel_census

    target = cuda_target()
    tag = "sym:" if symbolic else ""
    try:
        cuda_build(mod)
        stock = kernel_census(mod, target)
    except Exception as err:  # noqa: BLE001
        raise StockFailure(f"{type(err).__name__}: {str(err).strip().splitlines()[-1:]}") from err
    for strategy in strategies:
        recorder = Recorder(target)
        try:  # the "vtc" pipeline's options: memory guard on
            new = vtc_tvm.VirtualTensorize(strategy=strategy, target=target, memory_guard=True)(mod)
            cuda_build(new, store_side_pipeline(target, schedules=recorder.rules))
            problems, skipped = recorder.check()
            SCHEDULE_CHECKS.update(t.rule for t in recorder.taken)
            SCHEDULE_CHECKS.update({f"skipped ({why})": n for why, n in skipped.items()})
            ours = kernel_census(new, target, stores=True) if strategy == STRATEGIES[0] else None
        except Exception as err:  # noqa: BLE001
            raise VtcFailure("crash", strategy, "cuda build", f"{type(err).__name__}: {err}",
                             f"{tag}crash:cuda:{type(err).__name__}:{_norm(str(err))}") from err
        if problems:  # a kernel one of our rules scheduled, run on llvm with serial threads
            raise VtcFailure("mismatch", strategy, "schedule semantics", "; ".join(problems), tag + "schedule")
        if ours is None:
            continue  # "all" takes every legal edge, whatever it costs: no census against stock
        if ours["kernels"] > stock["kernels"]:
            raise VtcFailure("worse", strategy, "census", f"{ours['kernels']} kernels launched, stock "
                             f"{stock['kernels']}", tag + "kernels")
        if None not in (ours["planned_bytes"], stock["planned_bytes"]) and ours["planned_bytes"] > stock["planned_bytes"]:
            raise VtcFailure("worse", strategy, "census", f"{ours['planned_bytes']} planned bytes, stock "
                             f"{stock['planned_bytes']}", tag + "memory")


def check_case(case: Case):
    mod = case.build()
    if case.target == "cuda":
        return build_differential(mod, symbolic=bool(case.symbols))
    return differential(mod, case.input_sets())


def prune(case: Case) -> Case:
    """Drop bindings and inputs that no output depends on."""
    needed = set()
    for o in case.outputs:
        needed |= set(re.findall(r"\b\w+\b", o))
    body = []
    for line in reversed(case.body):
        name, rhs = line.split(" = ", 1)
        if name in needed:
            body.append(line)
            needed |= set(re.findall(r"\b\w+\b", rhs))
    keep = {i.name for i in case.inputs if i.name in needed}
    if case.symbols:
        # a symbol still in use must stay defined: keep a parameter that has it as a bare dim
        def words(inp):
            dims = tuple(inp.shape) + tuple(inp.low or ()) + tuple(inp.high or ())
            return {w for d in dims if isinstance(d, str) for w in re.findall(r"\b\w+\b", d)}
        used = needed.union(*[words(i) for i in case.inputs if i.name in keep])
        symbols = tuple(sym for sym in case.symbols if sym in used)
        for sym in symbols:
            if not any(sym in i.shape for i in case.inputs if i.name in keep):
                definer = next((i for i in case.inputs if sym in i.shape), None)
                if definer is not None:
                    keep.add(definer.name)
        if symbols:  # (a case that loses all its symbols keeps them: it stays a symbolic case)
            sizes = tuple({sym: sz[sym] for sym in symbols} for sz in case.sizes)
            case = dataclasses.replace(case, symbols=symbols, sizes=sizes)
    inputs = [i for i in case.inputs if i.name in keep]
    return dataclasses.replace(case, body=body[::-1], inputs=inputs)


def reduce_case(case: Case, failure: "VtcFailure", budget_s: float = 60.0):
    """After hypothesis' shrinking: drop outputs (and what only they need) while the same
    failure persists. Returns (case, failure)."""
    t_end = time.time() + budget_s

    def fails(c):
        try:
            check_case(c)
        except VtcFailure as f:
            return f if f.signature == failure.signature else None
        except Exception:  # noqa: BLE001 - stock failure, bad candidate
            return None
        return None

    cand = prune(case)
    f = fails(cand) if cand.body != case.body or cand.inputs != case.inputs else None
    if f is not None:
        case, failure = cand, f
    progress = True
    while progress and time.time() < t_end:
        progress = False
        for k in range(len(case.outputs)):
            if len(case.outputs) == 1:
                break
            cand = prune(dataclasses.replace(case, outputs=case.outputs[:k] + case.outputs[k + 1:]))
            f = fails(cand)
            if f is not None:
                case, failure, progress = cand, f, True
                break
    return case, failure


# ----------------------------------------------------------------------------------------------
# Regression files
# ----------------------------------------------------------------------------------------------
_REGRESSION_TEMPLATE = '''\
"""Fuzzer regression ({kind}, strategy {strategy!r}, ops: {ops}).

Found by tests/fuzz.py:
{detail}

Run: pytest tests/test_fuzz.py -k {name}   (tests/test_fuzz.py runs every saved case)
"""

import tvm  # noqa: F401 - symbolic sizes are tvm.tirx.Var
from tvm import relax

{script}'''


def check_regression(module, strategy: str):
    """Run a saved regression file (its ``build``, ``INPUTS``, ``DATA_SEED`` and, for a symbolic
    case, ``SIZES``)."""
    if getattr(module, "TARGET", "llvm") == "cuda":
        build_differential(module.build(), strategies=(strategy,), symbolic=hasattr(module, "SIZES"))
        return
    sets = input_sets(module.INPUTS, module.DATA_SEED, getattr(module, "SIZES", None))
    differential(module.build(), sets, strategies=(strategy,))


def regression_source(case: Case, failure: VtcFailure, path: str) -> str:
    detail = textwrap.indent(textwrap.shorten(str(failure), 1500, placeholder=" ..."), "    ")
    return _REGRESSION_TEMPLATE.format(kind=failure.kind, strategy=failure.strategy,
                                       ops=", ".join(sorted(set(case.ops))), detail=detail,
                                       script=case.script(), name=os.path.basename(path)[:-3])


def save_regression(case: Case, failure: VtcFailure) -> str:
    os.makedirs(REGRESSION_DIR, exist_ok=True)
    h = hashlib.sha1(case.script().encode()).hexdigest()[:10]
    path = os.path.join(REGRESSION_DIR, f"case_{h}.py")
    with open(path, "w") as f:
        f.write(regression_source(case, failure, path))
    return path


def describe(case: Case, failure: Optional[BaseException] = None) -> str:
    parts = ["# ---- minimal failing case " + "-" * 50, case.script()]
    try:
        parts.append("# TVMScript:\n" + textwrap.indent(case.build().script(), "# "))
    except Exception as err:  # noqa: BLE001
        parts.append(f"# (cannot build: {err})")
    if failure is not None:
        parts.append(f"# failure: {failure}")
    return "\n".join(parts)


# ----------------------------------------------------------------------------------------------
# Campaign (outside pytest)
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Stats:
    generated: int = 0
    discarded: int = 0
    passed: int = 0
    mismatches: int = 0
    worse: int = 0   # CUDA: the default strategy launches more kernels or plans more memory than stock
    crashes: int = 0
    shrink_runs: int = 0
    seconds: float = 0.0
    symbolic: Dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(
        ("generated", "discarded", "passed", "mismatches", "worse", "crashes"), 0))   # symbolic graphs only


@dataclasses.dataclass
class Bug:
    signature: str
    ops: frozenset          # ops of the shrunk case (a mismatch is "known" if a graph contains them)
    case: Case
    failure: VtcFailure
    path: Optional[str] = None
    hits: int = 1


class Campaign:
    def __init__(self, budget: int, deadline: float, save: bool, verbose: bool,
                 symbolic_percent: int = SYMBOLIC_PERCENT, target: str = "llvm"):
        self.stats = Stats()
        self.target = target
        self.bugs: List[Bug] = []
        self.budget, self.deadline, self.save, self.verbose = budget, deadline, save, verbose
        self.symbolic_percent = symbolic_percent
        self.shrinking = False
        self.last_fail: Optional[Tuple[Case, VtcFailure]] = None

    def _known(self, failure: VtcFailure, case: Case) -> Optional[Bug]:
        ops = set(case.ops)
        for bug in self.bugs:
            # a wrong answer (or a kernel count) is "known" only in graphs with the ops of its shrunk case
            wrong = bug.signature.split(":")[-1] in ("mismatch", "kernels", "memory")
            if failure.signature == bug.signature and (not wrong or bug.ops <= ops):
                return bug
        return None

    def check(self, case: Case):
        case = dataclasses.replace(case, target=self.target)
        if not self.shrinking:
            if self.stats.generated >= self.budget or time.time() > self.deadline:
                return  # budget spent: the rest of this round is a no-op
            self.stats.generated += 1
            if case.symbols:
                self.stats.symbolic["generated"] += 1
        else:
            self.stats.shrink_runs += 1
        if LAST_CASE_FILE:  # a segfault kills the campaign: leave the case behind
            with open(LAST_CASE_FILE, "w") as f:
                f.write(case.script())
        try:
            check_case(case)
        except StockFailure:
            if not self.shrinking:
                self.stats.discarded += 1
                self._count_symbolic(case, "discarded")
            assume(False)
        except VtcFailure as failure:
            if not self.shrinking:
                if failure.kind in ("mismatch", "worse"):
                    what = "mismatches" if failure.kind == "mismatch" else "worse"
                    setattr(self.stats, what, getattr(self.stats, what) + 1)
                    self._count_symbolic(case, what)
                else:
                    self.stats.crashes += 1
                    self._count_symbolic(case, "crashes")
            known = self._known(failure, case)
            if known is not None:
                if not self.shrinking:
                    known.hits += 1
                return
            if self.shrinking and failure.signature != self.last_fail[1].signature:
                return  # shrinking must not slip to another bug (it is found in a later round)
            self.shrinking = True
            self.last_fail = (case, failure)
            raise
        else:
            if not self.shrinking:
                self.stats.passed += 1
                self._count_symbolic(case, "passed")

    def _record(self, case: Case, failure: VtcFailure, t0: float):
        """A new bug: reduced, saved (with ``save``) and printed."""
        case, failure = reduce_case(case, failure)
        bug = Bug(failure.signature, frozenset(case.ops), case, failure)
        if self.save:
            bug.path = save_regression(case, failure)
        self.bugs.append(bug)
        print(f"\n=== new bug #{len(self.bugs)}: {failure.signature}  (shrunk in {time.time() - t0:.0f}s)")
        print(describe(case, failure))
        if bug.path:
            print(f"# saved: {bug.path}")
        sys.stdout.flush()

    def _count_symbolic(self, case: Case, what: str):
        if case.symbols:
            self.stats.symbolic[what] += 1

    def run(self, seed: int, round_size: int = 150):
        r = 0
        while self.stats.generated < self.budget and time.time() < self.deadline:
            self.shrinking, self.last_fail = False, None

            @hyp_seed(seed * 1000 + r)
            @settings(max_examples=min(round_size, self.budget - self.stats.generated) + 50, deadline=None,
                      database=None, derandomize=False, report_multiple_bugs=False,
                      suppress_health_check=list(HealthCheck), print_blob=False)
            @given(graphs(symbolic_percent=self.symbolic_percent))
            def _round(case):
                self.check(case)

            t0 = time.time()
            try:
                _round()
            except VtcFailure:
                self._record(*self.last_fail, t0)
            except Exception as err:  # noqa: BLE001 - e.g. hypothesis giving up on a round
                print(f"round {r}: {type(err).__name__}: {err}")
                if self.last_fail is not None:  # a failure hypothesis could not replay is kept all the same
                    self._record(*self.last_fail, t0)
            r += 1
            s = self.stats
            print(f"[{time.time() - START:.0f}s] generated={s.generated} (symbolic {s.symbolic['generated']}) "
                  f"discarded={s.discarded} passed={s.passed} mismatches={s.mismatches} worse={s.worse} "
                  f"crashes={s.crashes} bugs={len(self.bugs)}", flush=True)


START = time.time()
LAST_CASE_FILE = os.environ.get("VTC_FUZZ_LAST_CASE")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--minutes", type=float, default=float("inf"), help="stop after this long")
    ap.add_argument("--no-save", action="store_true", help="do not write tests/regressions/")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--symbolic-percent", type=int, default=SYMBOLIC_PERCENT,
                    help=f"share of graphs with symbolic dimensions (default {SYMBOLIC_PERCENT})")
    ap.add_argument("--target", choices=("llvm", "cuda"), default="llvm",
                    help="llvm: built and run against stock; cuda: built only (see build_differential)")
    args = ap.parse_args(argv)
    camp = Campaign(args.graphs, START + args.minutes * 60, not args.no_save, args.verbose,
                    args.symbolic_percent, args.target)
    camp.run(args.seed)
    s = camp.stats
    print("\n==== summary ====")
    sy = s.symbolic
    print(f"generated   {s.generated}   (symbolic: {sy['generated']})")
    print(f"discarded   {s.discarded}   (stock TVM failed; symbolic: {sy['discarded']})")
    print(f"passed      {s.passed}   (symbolic: {sy['passed']})")
    print(f"mismatches  {s.mismatches}   (symbolic: {sy['mismatches']})")
    print(f"worse       {s.worse}   (CUDA: more kernels or planned memory than stock; symbolic: {sy['worse']})")
    print(f"crashes     {s.crashes}   (symbolic: {sy['crashes']})")
    print(f"shrink runs {s.shrink_runs}")
    print(f"time        {time.time() - START:.0f}s")
    if args.target == "cuda":
        print(f"scheduled   {dict(SCHEDULE_CHECKS)}   (kernels our rules took, checked on llvm)")
    print(f"distinct bugs: {len(camp.bugs)}")
    for k, b in enumerate(camp.bugs, 1):
        print(f"  #{k} {b.signature}  hits={b.hits}  ops={sorted(b.ops)}  {b.path or ''}")
    return 1 if camp.bugs else 0


if __name__ == "__main__":
    sys.exit(main())
