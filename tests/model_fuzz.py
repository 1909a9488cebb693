"""Real models as a user hands them to TVM, and model-level differential fuzzing.

Part 1, the models (used by tests/test_real_models.py too): the shipped ONNX files
(``benchmarks/onnx/*.onnx``) keep every float weight as a graph input. A user's model has them
as initializers, which ``from_onnx`` turns into Relax *constants*; ``relax.transform.BindParams``
does the same to a module that has them as parameters. :func:`load_model` gives all three
forms (``WEIGHT_FORMS``) with the same seeded random weights (He-scaled, so activations keep
their size through deep ReLU stacks).

Part 2, the fuzzer: a :class:`ModelCase` (a model, a seed and the mutations the seed draws) is
a real model with

1. identity *sandwiches* of data-movement ops inserted after random bindings of ``main``:
   transpose + inverse transpose, reshape + reshape back, concat-then-slice, slices-then-concat,
   gather by a permutation + gather by its inverse, pad-then-slice, expand-then-slice, flip twice.
   The values are unchanged, so stock TVM on the same module is the oracle, while the movement
   ops compose with the model's own (a shuffle's reshape/transpose) and feed its real consumers;
2. the batch made symbolic (ONNX ``dim_param``; reshape targets that name the batch copy it);
3. weights as inputs, initializers or bound with ``BindParams``;
4. ``LegalizeOps`` run first (a module of ``call_tir``) or not;
5. the entry point: the ``"vtc"`` pipeline, ``VirtualTensorize`` then the default pipeline, or
   ``VirtualTensorize`` then ``store_side_pipeline``; strategy ``contiguity`` or ``all``.

Stock TVM (default pipeline) and the vtc build run on the same fresh random inputs (every
batch size of a symbolic case from one compiled module); outputs must agree to a relative L2
error of ``REL_L2`` (fp32). A case stock TVM cannot build is discarded. Campaign::

    python -m tests.model_fuzz --cases 40 --seed 1 [--minutes 10]

prints one line per case and the counts (cases, discarded, passed, mismatches, crashes).
Limits: 1. mutations are identity sandwiches only (the model's own ops are not changed);
2. a symbolic batch reaches only models whose reshapes keep the batch as their first dim
(others are discarded by stock TVM's failure); 3. LLVM only (CUDA codegen is covered by
tests/test_real_models.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import glob
import os
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
ENTRY_POINTS = ("vtc_pipeline", "vt_default", "vt_stores")
SANDWICHES = ("transpose", "reshape", "concat_slice", "slices_concat", "gather", "pad_slice", "expand_slice",
              "flip")
REL_L2 = 1e-5
LLVM = tvm.target.Target("llvm")


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
    * ``"bind"``: parameters bound with ``relax.transform.BindParams`` (constants too).

    ``weight_arrays`` is ``{}`` unless the weights stay inputs."""
    model = onnx_file(name)
    if batch_symbolic:
        model = symbolic_batch(model)
    w = random_weights(model, seed)
    if weights == "initializers":
        return load_onnx(with_initializers(model, w)), {}
    mod = load_onnx(model)
    if weights == "bind":
        mod = relax.transform.BindParams("main", {n: tvm.runtime.tensor(a) for n, a in w.items()})(mod)
        return mod, {}
    if weights != "inputs":
        raise ValueError(f"weights must be one of {WEIGHT_FORMS}, not {weights!r}")
    return mod, w


def activations(mod: tvm.IRModule, weight_arrays: dict, seed: int, sizes: Optional[dict] = None) -> List[np.ndarray]:
    """Fresh random arguments for ``main``: standard normal activations (symbolic dims from
    ``sizes`` by name), then the given weights by parameter name."""
    rng = np.random.default_rng([seed, 11])
    args = []
    for p in mod["main"].params:
        if p.name in weight_arrays:
            args.append(weight_arrays[p.name])
            continue
        shape = [int(d) if isinstance(d, tvm.tirx.IntImm) else int(sizes[d.name]) for d in p.ty.shape.values]
        args.append(rng.standard_normal(shape).astype(str(p.ty.dtype)))
    return args


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


def relative_l2(got, want) -> float:
    """The worst relative L2 error over the outputs (inf on a shape/dtype mismatch, 0 for two
    zero tensors)."""
    worst = 0.0
    if len(got) != len(want):
        return float("inf")
    for g, w in zip(got, want):
        if g.shape != w.shape or g.dtype != w.dtype or not np.isfinite(g).all() or not np.isfinite(w).all():
            return float("inf")
        diff = float(np.linalg.norm((g - w).astype("float64")))
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


@dataclasses.dataclass
class ModelCase:
    """One model-level fuzz case; everything but ``model`` and ``seed`` is drawn from the seed
    by :meth:`draw` (``dataclasses.replace`` pins a choice)."""

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

    @classmethod
    def draw(cls, seed: int, models=None) -> "ModelCase":
        rng = np.random.default_rng([seed, 1])
        models = list(models or MODELS)
        model = str(models[rng.integers(len(models))])
        sym = bool(rng.random() < 0.3)
        batch = _dims(next(i for i in onnx_file(model).graph.input if not is_weight(i.name)))[0]
        return cls(model=model, seed=seed,
                   weights=str(rng.choice(WEIGHT_FORMS)), batch_symbolic=sym,
                   legalize_first=bool(rng.random() < 0.35), entry=str(rng.choice(ENTRY_POINTS)),
                   strategy=str(rng.choice(["contiguity", "all"])), rate=float(rng.choice([0.15, 0.3, 0.6])),
                   sizes=({"N": batch}, {"N": 1}, {"N": 3}) if sym else ())

    def module(self):
        """``(mod, weight_arrays, sandwiches inserted)``."""
        mod, w = load_model(self.model, self.weights, self.seed, self.batch_symbolic)
        mod, kinds = insert_sandwiches(mod, np.random.default_rng([self.seed, 2]), self.rate, limit=self.limit)
        if self.legalize_first:
            with LLVM:
                mod = relax.transform.LegalizeOps()(mod)
        return mod, w, kinds


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
        stock = build_stock(mod)
        want = [run(stock, a) for a in sets]
    except Exception as err:  # noqa: BLE001
        raise Discard(f"{type(err).__name__}: {str(err).strip().splitlines()[-1:]}") from err
    ex = build_vtc(mod, case.entry, strategy=case.strategy)
    worst = max(relative_l2(run(ex, a), wa) for a, wa in zip(sets, want))
    assert worst <= REL_L2, f"{case}: relative L2 error {worst:.3g} > {REL_L2} (sandwiches {kinds})"
    return {"rel_l2": worst, "sandwiches": kinds}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="model-level differential fuzzing (stock TVM vs vtc-tvm)")
    ap.add_argument("--cases", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0, help="first case seed (cases use seed, seed+1, ...)")
    ap.add_argument("--minutes", type=float, default=float("inf"))
    ap.add_argument("--models", nargs="*", default=None, help=f"subset of {MODELS}")
    args = ap.parse_args(argv)
    t_end = time.time() + args.minutes * 60
    counts = dict.fromkeys(("cases", "discarded", "passed", "mismatches", "crashes",
                                "generator_errors"), 0)
    failures = []
    for s in range(args.seed, args.seed + args.cases):
        if time.time() > t_end:
            break
        case = ModelCase.draw(s, args.models)
        counts["cases"] += 1
        t0 = time.time()
        try:
            info = check_model_case(case)
            counts["passed"] += 1
            status = f"ok rel_l2={info['rel_l2']:.1e} sandwiches={len(info['sandwiches'])}"
        except Discard as d:
            counts["discarded"] += 1
            status = f"discarded (stock: {d})"
        except GeneratorError as err:
            counts["generator_errors"] += 1
            failures.append((case, err))
            status = f"GENERATOR ERROR {' '.join(str(err).split())[:300]}"
        except AssertionError as err:
            counts["mismatches"] += 1
            failures.append((case, err))
            status = f"MISMATCH {err}"
        except Exception as err:  # noqa: BLE001
            counts["crashes"] += 1
            failures.append((case, err))
            status = f"CRASH {type(err).__name__}: {' '.join(str(err).split())[:300]}"
        print(f"[{time.time() - t0:5.1f}s] {case}: {status}", flush=True)
    print("==== summary ====\n" + "  ".join(f"{k}={v}" for k, v in counts.items()))
    for case, err in failures:
        print(f"FAILED {case}: {type(err).__name__}: {' '.join(str(err).split())[:500]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
