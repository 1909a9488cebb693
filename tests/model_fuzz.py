"""Real models as a user hands them to TVM, and model-level differential fuzzing.

Part 1, the models (used by tests/test_real_models.py too): the shipped ONNX files
(``benchmarks/onnx/*.onnx``) keep every float weight as a graph input. A user's model has them
as initializers, which ``from_onnx`` turns into Relax *constants*; ``relax.transform.BindParams``
does the same to a module that has them as parameters. :func:`load_model` gives all three
forms (``WEIGHT_FORMS``) with the same seeded random weights (He-scaled, so activations keep
their size through deep ReLU stacks).

Part 2, the fuzzer: a :class:`ModelCase` (a model, a seed and the mutations the seed draws) is
a real model, or a *block* of it, with

0. the block: a window of 2-10 consecutive bindings of ``main`` (9 cases in 10; half of the
   windows around one of the model's own movement ops), cut out as a function of what it reads
   (:func:`extract_block`): the model's real ops, attributes, weights and shapes, a few
   kernels instead of dozens, so a case costs about a second instead of ten to sixty;
1. identity *sandwiches* of data-movement ops inserted after random bindings of ``main``:
   transpose + inverse transpose, reshape + reshape back, concat-then-slice, slices-then-concat,
   gather by a permutation + gather by its inverse, pad-then-slice, expand-then-slice, flip twice.
   The values are unchanged, so stock TVM on the same module is the oracle, while the movement
   ops compose with the model's own (a shuffle's reshape/transpose) and feed its real consumers;
2. the batch made symbolic (ONNX ``dim_param``; reshape targets that name the batch copy it);
3. weights as inputs, initializers, bound with ``BindParams``, or a random half bound;
4. ``LegalizeOps`` run first (a module of ``call_tir``) or not;
5. the entry point: the ``"vtc"`` pipeline, ``VirtualTensorize`` then the default pipeline, or
   ``VirtualTensorize`` then ``store_side_pipeline``; strategy ``contiguity`` or ``all``.

Stock TVM (default pipeline) and the vtc build run on the same fresh random inputs (every
batch size of a symbolic case from one compiled module), both on ``FUZZ_TARGET`` (LLVM -O0);
outputs must agree to a relative L2 error of ``REL_L2`` (fp32). A case stock TVM cannot build
is discarded. Campaign::

    python -m tests.model_fuzz --cases 1000 --seed 1 [--minutes 10] [--quiet] [--whole]

imports TVM once, then runs each case in a forked child (:func:`outcome_in_child`: a segfault
or a hang is that case's crash), prints one line per case (``--quiet``: failures and a line
per 100 cases) and the counts (cases, discarded, passed, mismatches, crashes); a failure is
shrunk (:func:`shrink`) and printed as a ``ModelCase(...)`` that replays it.
Limits: 1. mutations are identity sandwiches only (the model's own ops are not changed);
2. a symbolic batch reaches only models whose reshapes keep the batch as their first dim
(others, the decoder layers' ``Expand``, are discarded by TVM's importer); 3. LLVM only (CUDA
codegen is covered by tests/test_real_models.py); 4. a block's inputs are random normal
tensors, not the values the model's prefix would give them.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import glob
import json
import os
import select
import signal
import sys
import time
from typing import List, Optional

import numpy as np
import onnx
import tvm
from onnx import numpy_helper
from tvm import relax

import vtc_tvm
from vtc_tvm.onnx_import import load_onnx
from vtc_tvm.pipeline import store_side_pipeline

ONNX_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "onnx")
MODELS = sorted(os.path.basename(p)[: -len("_small.onnx")] for p in glob.glob(os.path.join(ONNX_DIR, "*_small.onnx")))
WEIGHT_FORMS = ("inputs", "initializers", "bind")
FUZZ_WEIGHT_FORMS = WEIGHT_FORMS + ("mixed",)   # mixed: a random half bound, the rest inputs
ENTRY_POINTS = ("vtc_pipeline", "vt_default", "vt_stores")
SANDWICHES = ("transpose", "reshape", "concat_slice", "slices_concat", "gather", "pad_slice", "expand_slice",
              "flip")
REL_L2 = 1e-5
LLVM = tvm.target.Target("llvm")
# The fuzzer's target, on both sides: LLVM without its IR optimizer. The comparison is of
# vtc-tvm's rewrite, not of LLVM's passes, and -O0 makes the IR codegen of a small model ~5x
# cheaper (shufflenet_unit: 0.2 s vs 1.4 s), which is most of a case's time.
FUZZ_TARGET = tvm.target.Target({"kind": "llvm", "opt-level": 0})


def is_weight(name: str) -> bool:
    """The naming convention of the benchmark workloads: ``w_*`` weights, ``b_*`` biases,
    ``*norm`` gains (activations: ``x``, ``cos``/``sin``, KV caches, masks)."""
    return name.startswith(("w_", "b_")) or name.endswith("norm")


# ----------------------------------------------------------------------------------------------
# Part 1: models with their weights as a user has them
# ----------------------------------------------------------------------------------------------
@functools.cache
def onnx_file(name: str) -> onnx.ModelProto:
    return onnx.load(os.path.join(ONNX_DIR, f"{name}_small.onnx"))


def _dims(value_info) -> list:
    return [d.dim_value for d in value_info.type.tensor_type.shape.dim]


def random_weights(model: onnx.ModelProto, seed: int) -> dict:
    """name -> array for every weight input: He-scaled over the fan-in (dims 1..), gains ~1."""
    rng = np.random.default_rng([seed, 7])
    weights = {}
    for i in model.graph.input:
        if is_weight(i.name):
            shape = _dims(i)
            a = rng.standard_normal(shape).astype("float32")
            if i.name.endswith("norm"):
                a = (1.0 + 0.1 * a).astype("float32")
            elif len(shape) > 1 and not i.name.startswith("b_"):
                a = (a * np.sqrt(2.0 / max(1, int(np.prod(shape[1:]))))).astype("float32")
            else:
                a = (0.1 * a).astype("float32")
            weights[i.name] = a
    return weights


def with_initializers(model: onnx.ModelProto, weights: dict) -> onnx.ModelProto:
    """A copy of ``model`` whose weight inputs are initializers holding ``weights``."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    keep = [i for i in out.graph.input if i.name not in weights]
    del out.graph.input[:]
    out.graph.input.extend(keep)
    out.graph.initializer.extend(numpy_helper.from_array(a, n) for n, a in weights.items())
    return out


def symbolic_batch(model: onnx.ModelProto, batch_name: str = "N") -> onnx.ModelProto:
    """A copy with dim 0 of every activation input named ``batch_name`` and every Reshape target
    whose first entry is the old batch copying dim 0 instead (ONNX: 0 = keep the input's dim)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    acts = [i for i in out.graph.input if not is_weight(i.name)]
    batch = _dims(acts[0])[0]
    for i in acts:
        d0 = i.type.tensor_type.shape.dim[0]
        if d0.dim_value == batch:
            d0.Clear()
            d0.dim_param = batch_name
    targets = {n.input[1] for n in out.graph.node if n.op_type == "Reshape"}
    for k, t in enumerate(out.graph.initializer):
        if t.name in targets:
            a = numpy_helper.to_array(t).copy()
            if a.size and a[0] == batch:
                a[0] = 0
                out.graph.initializer[k].CopyFrom(numpy_helper.from_array(a, t.name))
    return out


def load_model(name: str, weights: str = "initializers", seed: int = 0, batch_symbolic: bool = False):
    """``(mod, weight_arrays)``: the model imported with ``load_onnx`` (``from_onnx``), its weights

    * ``"inputs"``: parameters of ``main`` (as shipped; ``weight_arrays`` go after the activations),
    * ``"initializers"``: ONNX initializers, so Relax constants (what ``from_onnx(model)`` gives),
    * ``"bind"``: parameters bound with ``relax.transform.BindParams`` (constants too),
    * ``"mixed"``: a random half of them bound (seeded), the rest parameters.

    ``weight_arrays`` holds the weights that stay inputs."""
    model = onnx_file(name)
    if batch_symbolic:
        model = symbolic_batch(model)
    w = random_weights(model, seed)
    if weights == "initializers":
        return load_onnx(with_initializers(model, w)), {}
    mod = load_onnx(model)
    if weights in ("bind", "mixed"):
        names = sorted(w)
        if weights == "mixed":
            pick = np.random.default_rng([seed, 5]).random(len(names)) < 0.5
            names = [n for n, p in zip(names, pick) if p]
        mod = relax.transform.BindParams("main", {n: tvm.runtime.tensor(w[n]) for n in names})(mod)
        return mod, {n: a for n, a in w.items() if n not in names}
    if weights != "inputs":
        raise ValueError(f"weights must be one of {WEIGHT_FORMS}, not {weights!r}")
    return mod, w


def activations(mod: tvm.IRModule, weight_arrays: dict, seed: int, sizes: Optional[dict] = None) -> List[np.ndarray]:
    """Fresh random arguments for ``main``: standard normal activations (symbolic dims, or
    expressions of them such as a block's ``N * 2``, from ``sizes`` by name), then the given
    weights by parameter name."""
    rng = np.random.default_rng([seed, 11])
    args = []
    for p in mod["main"].params:
        if p.name in weight_arrays:
            args.append(weight_arrays[p.name])
            continue
        shape = [_concrete(d, sizes) for d in p.ty.shape.values]
        args.append(rng.standard_normal(shape).astype(str(p.ty.dtype)))
    return args


def _concrete(dim, sizes: Optional[dict]) -> int:
    if isinstance(dim, tvm.tirx.IntImm):
        return int(dim)
    ana = tvm.sym.Analyzer()
    for v in tvm.tirx.analysis.undefined_vars(dim):
        ana.bind(v, int(sizes[v.name]))
    return int(ana.simplify(dim))


# -- entry points ----------------------------------------------------------------------------------
def build_stock(mod, target=LLVM):
    return tvm.compile(mod, target, relax_pipeline=relax.get_default_pipeline(target))


def build_vtc(mod, entry: str, target=LLVM, strategy: str = "contiguity", report=None):
    """``mod`` compiled through one public entry point of vtc-tvm (``ENTRY_POINTS``)."""
    target = tvm.target.Target(target)
    if entry == "vtc_pipeline":
        return tvm.compile(mod, target, relax_pipeline=relax.get_pipeline(
            "vtc", target=target, strategy=strategy, report=report))
    new = vtc_tvm.VirtualTensorize(strategy=strategy, target=target, report=report)(mod)
    if entry == "vt_default":
        return tvm.compile(new, target, relax_pipeline=relax.get_default_pipeline(target))
    if entry == "vt_stores":
        return tvm.compile(new, target, relax_pipeline=store_side_pipeline(target, report=report))
    raise ValueError(f"entry must be one of {ENTRY_POINTS}, not {entry!r}")


def run(ex, args) -> List[np.ndarray]:
    from vtc_tvm.report import run_vm

    return run_vm(ex, tvm.cpu(), args)


def relative_l2(got, want, same_nonfinite: bool = False) -> float:
    """The worst relative L2 error over the outputs (inf on a shape/dtype mismatch, 0 for two
    zero tensors). A NaN or inf is an error (inf), or with ``same_nonfinite`` only where the
    other side has not the same one (a block's random inputs can be negative where the model
    would give it a sum of squares: sqrt gives NaN on both sides); the error is then over the
    finite elements."""
    worst = 0.0
    if len(got) != len(want):
        return float("inf")
    for g, w in zip(got, want):
        if g.shape != w.shape or g.dtype != w.dtype:
            return float("inf")
        if not np.isfinite(g).all() or not np.isfinite(w).all():
            finite = np.isfinite(w)
            if not same_nonfinite or not np.array_equal(g[~finite], w[~finite], equal_nan=True) \
                    or not np.isfinite(g[finite]).all():
                return float("inf")
            g, w = g[finite], w[finite]
        diff = float(np.linalg.norm(g.astype("float64") - w.astype("float64")))  # (bool outputs too)
        norm = float(np.linalg.norm(w.astype("float64")))
        worst = max(worst, diff / norm if norm else (0.0 if diff == 0 else float("inf")))
    return worst


# ----------------------------------------------------------------------------------------------
# Part 2: mutations
# ----------------------------------------------------------------------------------------------
def _static(shape):
    return [int(d) if isinstance(d, tvm.tirx.IntImm) else None for d in shape]


@relax.expr_functor.mutator
class _Sandwicher(relax.PyExprMutator):
    """Re-emits ``main``; after each dataflow binding of a float tensor, with probability
    ``rate``, an identity sandwich of movement ops whose result replaces the tensor's later uses."""

    def __init__(self, mod, rng, rate, kinds, limit):
        super().__init__(mod)
        self.rng, self.rate, self.kinds, self.limit = rng, rate, kinds, limit
        self.inserted: List[str] = []

    def visit_var_binding_(self, binding):
        value = self.visit_expr(binding.value)
        var = binding.var
        emit = self.builder_.emit if isinstance(var, relax.DataflowVar) else self.builder_.emit_output
        new = emit(value, var.name)
        self.set_var_remap(var, new)
        ty = new.ty
        if (isinstance(var, relax.DataflowVar) and isinstance(ty, relax.TensorType) and ty.shape is not None
                and str(ty.dtype).startswith("float") and len(ty.shape.values) >= 1
                and len(self.inserted) < self.limit and self.rng.random() < self.rate):
            kind = self.kinds[self.rng.integers(len(self.kinds))]
            out = self._sandwich(kind, new, list(ty.shape.values))
            if out is not None:
                self.inserted.append(kind)
                self.set_var_remap(var, out)

    def _sandwich(self, kind, x, shape):
        op, bb, rng = relax.op, self.builder_, self.rng
        r, static = len(shape), _static(shape)
        axes = [a for a in range(r) if static[a] is not None and static[a] >= 2]

        def e(expr):
            return bb.emit(expr)

        if kind == "transpose":
            if r < 2:
                return None
            perm = [int(a) for a in rng.permutation(r)]
            if perm == list(range(r)):
                perm = perm[1:] + perm[:1]
            return e(op.permute_dims(e(op.permute_dims(x, perm)), [int(a) for a in np.argsort(perm)]))
        if kind == "reshape":
            return e(op.reshape(e(op.reshape(x, [-1])), relax.ShapeExpr(shape)))
        if kind == "flip":
            a = int(rng.integers(r))
            return e(op.flip(e(op.flip(x, a)), a))
        if not axes:
            return None
        a = int(axes[rng.integers(len(axes))])
        d = static[a]
        if kind == "concat_slice":
            other = e(op.flip(x, a)) if rng.random() < 0.5 else x
            first = rng.random() < 0.5
            cat = e(op.concat([x, other] if first else [other, x], axis=a))
            return e(op.strided_slice(cat, [a], [0 if first else d], [d if first else 2 * d]))
        if kind == "slices_concat":
            k = int(rng.integers(1, d))
            lo = e(op.strided_slice(x, [a], [0], [k]))
            hi = e(op.strided_slice(x, [a], [k], [d]))
            return e(op.concat([lo, hi], axis=a))
        if kind == "gather":
            perm = rng.permutation(d).astype("int64")
            g = e(op.take(x, relax.const(perm), axis=a))
            return e(op.take(g, relax.const(np.argsort(perm).astype("int64")), axis=a))
        if kind == "pad_slice":
            lo, hi = int(rng.integers(0, 3)), int(rng.integers(1, 3))
            width = [0] * (2 * r)
            width[2 * a], width[2 * a + 1] = lo, hi
            return e(op.strided_slice(e(op.nn.pad(x, width)), [a], [lo], [lo + d]))
        if kind == "expand_slice":
            k = int(rng.integers(2, 4))
            big = e(op.broadcast_to(e(op.expand_dims(x, 0)), relax.ShapeExpr([k] + shape)))
            j = int(rng.integers(k))
            return e(op.squeeze(e(op.strided_slice(big, [0], [j], [j + 1])), [0]))
        raise ValueError(f"unknown sandwich {kind!r}")


def insert_sandwiches(mod: tvm.IRModule, rng, rate: float, kinds=SANDWICHES, limit: int = 12):
    """``(mod, kinds inserted)``: ``main`` with identity sandwiches after random bindings (at
    most ``limit``: each costs compile time)."""
    m = _Sandwicher(mod, rng, rate, list(kinds), limit)
    gv = mod.get_global_var("main")
    m.builder_.update_func(gv, m.visit_expr(mod["main"]))
    return relax.transform.Normalize()(m.builder_.finalize()), m.inserted


@relax.expr_functor.mutator
class _Cutter(relax.PyExprMutator):
    """Re-emits a window of ``main``'s bindings as a function of the values it reads."""

    def cut(self, bindings, free, outputs, name="main"):
        bb = self.builder_
        params = [relax.Var(v.name, v.ty) for v in free]
        for v, p in zip(free, params):
            self.set_var_remap(v, p)
        with bb.function(name, params):
            with bb.dataflow():
                for b in bindings:
                    value = self.visit_expr(b.value)
                    if isinstance(b, relax.MatchCast):
                        new = bb.match_cast(value, b.struct_info, b.var.name)
                    else:
                        new = bb.emit(value, b.var.name)
                    self.set_var_remap(b.var, new)
                outs = [bb.emit_output(self.get_var_remap(v)) for v in outputs]
            bb.emit_func_output(outs[0] if len(outs) == 1 else relax.Tuple(outs))
        return bb.finalize()[name]


def _defines_its_symbols(params) -> bool:
    """Every symbolic variable a parameter's shape uses is some parameter's bare dim (Relax
    can only read a symbol off a dimension that is exactly the symbol)."""
    bare, used = set(), set()
    for p in params:
        if not isinstance(p.ty, relax.TensorType) or p.ty.shape is None:
            continue
        for d in p.ty.shape.values:
            if isinstance(d, tvm.tirx.Var):
                bare.add(d.name)
            used.update(v.name for v in tvm.tirx.analysis.undefined_vars(d))
    return used <= bare


def extract_block(mod: tvm.IRModule, start: int, length: int) -> tvm.IRModule:
    """``main`` cut to the bindings ``[start, start + length)`` of its dataflow block: a real
    block of the model (its own ops, weights, constants and shapes), as a function of the
    values it reads (``main``'s parameters, and earlier bindings as new parameters), returning
    what the rest of the model reads from it (and its last binding).

    The window grows backwards over what a parameter cannot be (a tuple, a shape, an integer
    tensor: random inputs would not be valid indices) and until the parameters define every
    symbolic dim they use; at ``start = 0`` every value read is a parameter of ``main``."""
    func = mod["main"]
    blocks = func.body.blocks
    if len(blocks) != 1 or not isinstance(blocks[0], relax.DataflowBlock):
        raise ValueError("extract_block needs main with one dataflow block")
    bindings = list(blocks[0].bindings)
    start = max(0, min(start, len(bindings) - 1))
    end = min(len(bindings), start + max(1, length))
    main_params = list(func.params)

    def is_param(v):
        return any(v.same_as(p) for p in main_params)

    while True:
        window = bindings[start:end]
        defined = [b.var for b in window]
        free, seen = [], set()
        for b in window:
            symbols = relax.analysis.free_symbolic_vars(b.value)
            for v in relax.analysis.free_vars(b.value):
                if any(v.same_as(s) for s in symbols):  # a symbolic dim: a parameter's shape defines it
                    continue
                if any(v.same_as(d) for d in defined) or any(v.same_as(f) for f in free):
                    continue
                free.append(v)
        bad = [v for v in free if not is_param(v) and not (
            isinstance(v.ty, relax.TensorType) and str(v.ty.dtype).startswith("float"))]
        if start > 0 and (bad or not _defines_its_symbols(free)):
            start -= 1
            continue
        break
    later = bindings[end:]
    used_later = []
    for b in later:
        used_later.extend(relax.analysis.free_vars(b.value))
    used_later.extend(relax.analysis.free_vars(func.body.body))
    outputs = [v for v in defined if any(v.same_as(u) for u in used_later)]
    if not any(defined[-1].same_as(o) for o in outputs):
        outputs.append(defined[-1])
    # main's parameters first, in their order (a weight keeps its name: its array is passed by name)
    free.sort(key=lambda v: next((k for k, p in enumerate(main_params) if v.same_as(p)), len(main_params)))
    new_main = _Cutter().cut(window, free, outputs)
    out = tvm.IRModule({gv: f for gv, f in mod.functions.items() if gv.name_hint != "main"})
    out["main"] = new_main
    return relax.transform.Normalize()(out)


@dataclasses.dataclass
class ModelCase:
    """One model-level fuzz case; everything but ``model`` and ``seed`` is drawn from the seed
    by :meth:`draw` (``dataclasses.replace`` pins a choice). ``block = (start, length)`` cuts
    ``main`` to that window of its bindings (:func:`extract_block`); ``()`` is the whole model."""

    model: str
    seed: int
    weights: str = "initializers"
    batch_symbolic: bool = False
    legalize_first: bool = False
    entry: str = "vtc_pipeline"
    strategy: str = "contiguity"
    rate: float = 0.3
    sizes: tuple = ()
    limit: int = 12        # most sandwiches inserted
    block: tuple = ()

    @classmethod
    def draw(cls, seed: int, models=None, whole: bool = False) -> "ModelCase":
        """The case of ``seed``. ``whole`` draws the cases of the first campaigns (whole models,
        three weight forms); otherwise a second stream draws the window (whole model 1 in 10,
        else 2-10 bindings, half of the time around one of the model's own movement ops), the
        mixed weight form, and a sandwich rate for the window's size."""
        rng = np.random.default_rng([seed, 1])
        models = list(models or MODELS)
        model = str(models[rng.integers(len(models))])
        sym = bool(rng.random() < 0.3)
        batch = _dims(next(i for i in onnx_file(model).graph.input if not is_weight(i.name)))[0]
        case = cls(model=model, seed=seed,
                   weights=str(rng.choice(WEIGHT_FORMS)), batch_symbolic=sym,
                   legalize_first=bool(rng.random() < 0.35), entry=str(rng.choice(ENTRY_POINTS)),
                   strategy=str(rng.choice(["contiguity", "all"])), rate=float(rng.choice([0.15, 0.3, 0.6])),
                   sizes=({"N": batch}, {"N": 1}, {"N": 3}) if sym else ())
        if whole:
            return case
        rng = np.random.default_rng([seed, 3])
        if rng.random() < 0.25:
            case.weights = "mixed"
        if rng.random() < 0.1:
            return dataclasses.replace(case, limit=6)
        n = _binding_count(model)
        length = int(rng.integers(2, 11))
        moves = _movement_bindings(model)
        if moves and rng.random() < 0.5:
            start = int(moves[rng.integers(len(moves))]) - int(rng.integers(0, length))
        else:
            start = int(rng.integers(0, n))
        start = max(0, min(start, n - 1))
        return dataclasses.replace(case, block=(start, length), rate=float(rng.choice([0.3, 0.6, 1.0])), limit=4)

    def module(self):
        """``(mod, weight_arrays, sandwiches inserted)``."""
        mod, w = load_model(self.model, self.weights, self.seed, self.batch_symbolic)
        if self.block:
            mod = extract_block(mod, *self.block)
            names = {p.name for p in mod["main"].params}
            w = {n: a for n, a in w.items() if n in names}
        mod, kinds = insert_sandwiches(mod, np.random.default_rng([self.seed, 2]), self.rate, limit=self.limit)
        if self.legalize_first:
            with FUZZ_TARGET:
                mod = relax.transform.LegalizeOps()(mod)
        return mod, w, kinds


MOVEMENT_OPS = ("relax.permute_dims", "relax.reshape", "relax.strided_slice", "relax.concat", "relax.split",
                "relax.expand_dims", "relax.broadcast_to", "relax.squeeze", "relax.take", "relax.flip")


@functools.cache
def _main_bindings(model: str):
    """The ops of ``main``'s bindings, weights as inputs (the window is drawn on these; other
    weight forms or a symbolic batch may import a few bindings fewer: extract_block clamps)."""
    mod, _ = load_model(model, "inputs")
    return tuple(b.value.op.name if isinstance(b.value, relax.Call) and hasattr(b.value.op, "name") else ""
                 for b in mod["main"].body.blocks[0].bindings)


def _binding_count(model: str) -> int:
    return len(_main_bindings(model))


def _movement_bindings(model: str) -> List[int]:
    return [k for k, op in enumerate(_main_bindings(model)) if op in MOVEMENT_OPS]


class Discard(Exception):
    """Stock TVM cannot build or run the case."""


class GeneratorError(Exception):
    """The case could not be made (a bug of this fuzzer, not of vtc-tvm)."""


def check_model_case(case: ModelCase) -> dict:
    """Compile the case with stock TVM and through its vtc entry point, run both on fresh inputs
    (each size of a symbolic case), and return ``{"rel_l2", "sandwiches"}``. Raises
    :class:`Discard` if stock fails, AssertionError on a mismatch; any other exception is a crash
    of the vtc side."""
    from vtc_tvm.onnx_import import InputError

    try:
        mod, w, kinds = case.module()
    except InputError as err:  # TVM's ONNX importer cannot take the mutated model: stock fails too
        raise Discard(str(err)) from err
    except Exception as err:  # noqa: BLE001
        raise GeneratorError(f"{type(err).__name__}: {err}") from err
    sets = [activations(mod, w, case.seed + k, sz) for k, sz in enumerate(case.sizes or ({},))]
    try:
        stock = build_stock(mod, FUZZ_TARGET)
        want = [run(stock, a) for a in sets]
    except Exception as err:  # noqa: BLE001
        raise Discard(f"{type(err).__name__}: {str(err).strip().splitlines()[-1:]}") from err
    ex = build_vtc(mod, case.entry, FUZZ_TARGET, strategy=case.strategy)
    worst = max(relative_l2(run(ex, a), wa, same_nonfinite=True) for a, wa in zip(sets, want))
    assert worst <= REL_L2, f"{case}: relative L2 error {worst:.3g} > {REL_L2} (sandwiches {kinds})"
    return {"rel_l2": worst, "sandwiches": kinds}


def outcome(case: ModelCase) -> dict:
    """``check_model_case`` as a record: ``{"status": passed | discarded | mismatch | crash |
    generator_error, "detail", "signature"}`` (the signature groups one bug's failures)."""
    try:
        info = check_model_case(case)
        return {"status": "passed", "detail": f"rel_l2={info['rel_l2']:.1e} sandwiches={len(info['sandwiches'])}",
                "signature": ""}
    except Discard as d:
        return {"status": "discarded", "detail": f"stock: {d}", "signature": ""}
    except GeneratorError as err:
        return {"status": "generator_error", "detail": str(err), "signature": str(err).split(":")[0]}
    except AssertionError as err:
        return {"status": "mismatch", "detail": str(err), "signature": "mismatch"}
    except Exception as err:  # noqa: BLE001
        last = (str(err).strip().splitlines() or [""])[-1]
        return {"status": "crash", "detail": f"{type(err).__name__}: {err}",
                "signature": f"crash:{type(err).__name__}:{last[:120]}"}


def outcome_in_child(case: ModelCase, timeout_s: float = 300.0) -> dict:
    """:func:`outcome` in a forked child of this (already warm) process: each case starts from
    the same state, and a segfault, abort or hang of a generated kernel is a crash of that
    case, not the end of the campaign. The parent must not have run a VM (no TVM thread pool
    to lose across the fork)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        code = 0
        try:
            res = outcome(case)
        except BaseException as err:  # noqa: BLE001 - reported, never raised across the fork
            res = {"status": "crash", "detail": f"{type(err).__name__}: {err}", "signature": "crash:child"}
            code = 1
        with os.fdopen(w, "w") as f:
            f.write(json.dumps(res))
        os._exit(code)
    os.close(w)
    data, deadline = b"", time.time() + timeout_s
    with os.fdopen(r, "rb") as f:
        while True:
            ready, _, _ = select.select([f], [], [], max(0.0, deadline - time.time()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return {"status": "crash", "detail": f"timeout after {timeout_s:.0f}s", "signature": "crash:timeout"}
            chunk = os.read(f.fileno(), 1 << 16)
            if not chunk:
                break
            data += chunk
    _, st = os.waitpid(pid, 0)
    if data:
        return json.loads(data)
    how = f"signal {os.WTERMSIG(st)}" if os.WIFSIGNALED(st) else f"exit {os.WEXITSTATUS(st)}"
    return {"status": "crash", "detail": f"child died ({how}) without a result", "signature": f"crash:{how}"}


def shrink(case: ModelCase, result: dict, check=outcome_in_child, budget_s: float = 120.0):
    """A smaller case with the same failure signature: fewer sandwiches, then a narrower
    window, then the simpler settings (weights as inputs, no legalization, static batch).
    Returns ``(case, result)``."""
    t_end = time.time() + budget_s

    def candidates(c):
        yield from (dataclasses.replace(c, limit=k) for k in range(min(c.limit, 12)))
        if c.block and c.block[1] > 1:
            yield dataclasses.replace(c, block=(c.block[0] + 1, c.block[1] - 1))
            yield dataclasses.replace(c, block=(c.block[0], c.block[1] - 1))
        if c.weights != "inputs":
            yield dataclasses.replace(c, weights="inputs")
        if c.legalize_first:
            yield dataclasses.replace(c, legalize_first=False)
        if c.batch_symbolic:
            yield dataclasses.replace(c, batch_symbolic=False, sizes=())

    progress = True
    while progress and time.time() < t_end:
        progress = False
        for cand in candidates(case):
            if time.time() > t_end:
                break
            got = check(cand)
            if got["status"] == result["status"] and got["signature"] == result["signature"]:
                case, result, progress = cand, got, True
                break
    return case, result


def _warm():
    """Load what the first compile loads lazily (pipelines, importer, vtc modules), without a
    VM: every forked case then starts warm."""
    mod, _ = load_model("shufflenet_unit", "bind")
    mod = extract_block(mod, 11, 4)
    build_stock(mod, FUZZ_TARGET)
    for entry in ENTRY_POINTS:
        build_vtc(mod, entry, FUZZ_TARGET)
    for m in MODELS:
        _main_bindings(m)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="model-level differential fuzzing (stock TVM vs vtc-tvm)")
    ap.add_argument("--cases", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0, help="first case seed (cases use seed, seed+1, ...)")
    ap.add_argument("--minutes", type=float, default=float("inf"))
    ap.add_argument("--models", nargs="*", default=None, help=f"subset of {MODELS}")
    ap.add_argument("--whole", action="store_true", help="whole models only (the first campaigns' draw)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per case before it counts as a hang")
    ap.add_argument("--no-fork", action="store_true", help="run the cases in this process (debugging)")
    ap.add_argument("--no-shrink", action="store_true")
    ap.add_argument("--quiet", action="store_true", help="print only failures and a progress line per 100 cases")
    args = ap.parse_args(argv)
    os.environ.setdefault("TVM_NUM_THREADS", "1")  # one core per campaign (read when a child's pool starts)
    t_start = time.time()
    t_end = t_start + args.minutes * 60
    check = outcome if args.no_fork else (lambda c: outcome_in_child(c, args.timeout))
    if not args.no_fork:
        _warm()
    names = {"passed": "passed", "discarded": "discarded", "mismatch": "mismatches", "crash": "crashes",
             "generator_error": "generator_errors"}
    counts = dict.fromkeys(("cases", "discarded", "passed", "mismatches", "crashes", "generator_errors"), 0)
    failures, bugs = [], {}
    for s in range(args.seed, args.seed + args.cases):
        if time.time() > t_end:
            break
        case = ModelCase.draw(s, args.models, whole=args.whole)
        counts["cases"] += 1
        t0 = time.time()
        res = check(case)
        counts[names[res["status"]]] += 1
        failed = res["status"] not in ("passed", "discarded")
        if failed:
            failures.append((case, res))
        if failed or not args.quiet:
            print(f"[{time.time() - t0:5.1f}s] {case}: {res['status'].upper() if failed else res['status']} "
                  f"{' '.join(res['detail'].split())[:400]}", flush=True)
        if failed and res["signature"] not in bugs:
            small, sres = (case, res) if args.no_shrink else shrink(case, res, check)
            bugs[res["signature"]] = small
            print(f"=== new bug: {res['signature']}\n    shrunk: {small!r}\n    {' '.join(sres['detail'].split())[:800]}",
                  flush=True)
        if args.quiet and counts["cases"] % 100 == 0:
            el = time.time() - t_start
            print(f"[{el:.0f}s] " + "  ".join(f"{k}={v}" for k, v in counts.items())
                  + f"  ({counts['cases'] / el:.2f} cases/s)", flush=True)
    el = time.time() - t_start
    print("==== summary ====\n" + "  ".join(f"{k}={v}" for k, v in counts.items())
          + f"  seeds {args.seed}-{args.seed + counts['cases'] - 1}  {el:.0f}s ({counts['cases'] / el:.2f} cases/s)")
    for case, res in failures:
        print(f"FAILED {case!r}: {' '.join(res['detail'].split())[:500]}")
    for sig, small in bugs.items():
        print(f"BUG {sig}: {small!r}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
