"""The ``vtc-tvm`` command line (also ``python -m vtc_tvm``).

    vtc-tvm compile MODEL.onnx [--target T] [-o lib.so] [--check] [--report]
    vtc-tvm explain MODEL.onnx [-o report.html]      # HTML + PNG: what became virtual and why
    vtc-tvm bench   MODEL.onnx [--target T]          # stock vs vtc latency, interleaved medians
    vtc-tvm tune    MODEL.onnx --work-dir DIR --trials N [--seconds S]
    vtc-tvm demo    [--model llama|shufflenet] [--size small|real]

Every subcommand takes ``--json`` (one JSON object on stdout instead of the text), ``-q``
(no progress or notes) and ``--debug`` (tracebacks and TVM's own warnings; ``VTC_TVM_DEBUG=1``
does the same). ``--target`` takes anything ``tvm.target.Target`` takes (a kind such as
``llvm``, a tag such as ``nvidia/nvidia-a100``, a JSON dict); ``cuda`` alone means
:func:`vtc_tvm.pipeline.cuda_target` (sm_90) or the visible GPU's architecture.

Errors are one ``error:`` line on stderr (its last line) and a distinct exit code, listed in
:mod:`vtc_tvm.errors`. Limits: 1. ONNX models only (Relax modules: use the Python API).
2. ``--check`` draws random inputs (standard normal floats, 0/1 integers), so index inputs see
only those values. 3. timings are of ``main`` through the Relax VM, inputs already on device.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import warnings

import numpy as np

from .errors import ExitCode, UserError, exit_code_table, from_input_error
from .progress import Console, silence_native_stderr

CHECK_SIZE = 3  # size of a symbolic dim in --check / bench inputs when no --dim gives one


# -- arguments -----------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """argparse whose errors are ours (one line, exit code USAGE), not a usage dump + exit 2."""

    def error(self, message):
        raise UserError(f"{message} (see {self.prog} --help)", ExitCode.USAGE)


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of text")
    common.add_argument("-q", "--quiet", action="store_true", help="no progress lines or notes on stderr")
    common.add_argument("--debug", action="store_true",
                        help="show tracebacks and TVM's warnings (also VTC_TVM_DEBUG=1)")
    return common


def _model_args(p, target_default: str):
    p.add_argument("model", metavar="MODEL.onnx")
    p.add_argument("--target", default=target_default,
                   help="a TVM target: kind (llvm, cuda), tag (nvidia/nvidia-a100) or JSON dict; "
                        f"'cuda' = vtc_tvm.pipeline.cuda_target() (default: {target_default})")
    p.add_argument("--shape", action="append", default=[], metavar="NAME=D1,D2,...",
                   help="static shape of an input (needed for unknown dims) (repeatable)")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                   help="make a named symbolic dim static at SIZE (others stay symbolic; "
                        f"--check/bench inputs size them {CHECK_SIZE}) (repeatable)")
    p.add_argument("--strategy", choices=["contiguity", "all"], default="contiguity")
    p.add_argument("--ops", default=None, metavar="OP,OP",
                   help="restrict VirtualTensorize to these Relax ops (e.g. permute_dims,concat)")
    p.add_argument("--inplace", default="", metavar="PARAM,PARAM",
                   help="parameters that may be updated in place (KV caches): a static cache of fixed "
                        "capacity written by ScatterND/ScatterElements/slice_scatter then gets only the new "
                        "rows written. A grow-by-concat cache (Concat(past, new)) always copies its past rows "
                        "into the new tensor (the caller's buffer has no room for them): give the model a "
                        "static cache and name it here")
    p.add_argument("--profile", action="store_true",
                   help="time every accepted edge on the target's device and keep it only if not slower")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")


def parser(prog: str = "vtc-tvm") -> _Parser:
    epilog = exit_code_table().replace("``", "'")
    ap = _Parser(prog=prog, description="vtc-tvm: virtual tensors for Apache TVM Relax.",
                 epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True, metavar="{compile,explain,bench,tune,demo}",
                            parser_class=_Parser)
    common = _common()
    kw = dict(parents=[common], epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)

    c = sub.add_parser("compile", help="import an ONNX model, apply VirtualTensorize, compile it", **kw)
    _model_args(c, "llvm")
    c.add_argument("-o", "--out", metavar="lib.so", help="export the compiled vtc library")
    c.add_argument("--check", action="store_true",
                   help="run stock and vtc on random inputs: vtc vs stock, both vs onnxruntime")
    c.add_argument("--report", action="store_true", help="print the decisions and the kernel counts")

    e = sub.add_parser("explain", help="an HTML + PNG report: the points-to graph, mappings, reasons", **kw)
    _model_args(e, "llvm")
    e.add_argument("-o", "--out", metavar="REPORT.html", help="where to write the page (default: MODEL.vtc.html)")
    e.add_argument("--time", action="store_true", help="also time stock and vtc (needs the target's device)")
    e.add_argument("--repeat", type=int, default=10, help="timed runs per round with --time")

    b = sub.add_parser("bench", help="time stock TVM and vtc (interleaved rounds, medians)", **kw)
    _model_args(b, "auto")
    b.add_argument("--repeat", type=int, default=10, help="timed runs per round")
    b.add_argument("--rounds", type=int, default=5, help="interleaved rounds (stock, vtc, stock, ...)")

    t = sub.add_parser("tune", help="MetaSchedule tuning of the vtc module (vtc_tvm.tuning)", **kw)
    _model_args(t, "auto")
    t.add_argument("--work-dir", required=True, metavar="DIR", help="tuning database and logs")
    t.add_argument("--trials", required=True, type=_positive(int), metavar="N", help="trials per task")
    t.add_argument("--seconds", type=_positive(float), default=None, metavar="S", help="tuning time budget")

    from . import demo

    d = sub.add_parser("demo", help="stock TVM vs VirtualTensorize on a built-in model", **kw)
    demo.add_arguments(d)
    return ap


def _positive(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not value > 0 or not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a positive {kind.__name__}")
        return value

    parse.__name__ = kind.__name__
    return parse


def parse_shapes(items) -> dict:
    shapes = {}
    for text in items:
        name, eq, dims = text.rpartition("=")  # rpartition: ONNX input names may contain '='
        try:
            shape = [int(d) for d in dims.split(",")]
        except ValueError:
            shape = None
        if not eq or not name or not shape or min(shape) <= 0:
            raise UserError(f"--shape {text!r} is not NAME=D1,D2,... with positive integer sizes",
                            ExitCode.BAD_SHAPE)
        shapes[name] = shape
    return shapes


def parse_dims(items) -> dict:
    dims = {}
    for text in items:
        name, eq, size = text.rpartition("=")
        if not eq or not name or not size.isdigit() or int(size) <= 0:
            raise UserError(f"--dim {text!r} is not NAME=SIZE with a positive integer size", ExitCode.BAD_SHAPE)
        dims[name] = int(size)
    return dims


def _names(text) -> list:
    return [n.strip() for n in (text or "").split(",") if n.strip()]


# -- target and device -----------------------------------------------------------------------
def resolve_target(text: str, console: Console):
    """``text`` as a ``tvm.target.Target`` (BAD_TARGET when TVM refuses it)."""
    import tvm

    from .pipeline import cuda_target

    if text == "auto":
        text = "cuda" if _has_gpu() else "llvm"
    if text == "cuda":
        if _has_gpu():
            major, minor = tvm.cuda(0).compute_version.split(".")
            arch = f"sm_{major}{minor}"
            console.note(f"--target cuda: the visible GPU's architecture {arch} "
                         "(attributes of vtc_tvm.pipeline.cuda_target())")
            return cuda_target(arch)
        console.note("--target cuda means vtc_tvm.pipeline.cuda_target(): H100/H200, sm_90 "
                     "(give a tag or a JSON dict for another GPU)")
        return cuda_target()
    spec = text
    if text.lstrip().startswith("{"):
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"--target {text!r}: not valid JSON ({e.msg} at {e.pos})", ExitCode.BAD_TARGET) from None
    try:
        target = tvm.target.Target(spec)
    except Exception as e:  # noqa: BLE001 - TVM raises ValueError / TVMError variants
        msg = " ".join(str(e).split()).split("[")[0][:240]
        raise UserError(f"--target {text!r}: {msg}", ExitCode.BAD_TARGET) from None
    if target.kind.name == "cuda" and tvm.get_global_func("target.build.cuda", allow_missing=True) is None:
        raise UserError(f"--target {text!r}: this TVM build has no CUDA support", ExitCode.BAD_TARGET)
    return target


def _has_gpu() -> bool:
    import tvm

    try:
        return bool(tvm.cuda(0).exist)
    except Exception:  # noqa: BLE001 - no CUDA runtime in this TVM build
        return False


def device_for(target, why: str):
    """The device that runs ``target``'s code; NO_DEVICE (naming ``why``) when none is visible."""
    import tvm

    kind = target.kind.name
    dev = tvm.cpu(0) if kind in ("llvm", "c") else tvm.device(kind, 0)
    try:
        present = bool(dev.exist)
    except Exception:  # noqa: BLE001 - runtime not built in
        present = False
    if not present:
        hint = " (drop --check to only compile)" if why == "--check" else ""
        raise UserError(f"{why} runs on a {kind} device and none is visible{hint}", ExitCode.NO_DEVICE)
    return dev


# -- the shared steps ------------------------------------------------------------------------------
class Session:
    """One model through the steps the subcommands share: import, plan, build, run."""

    def __init__(self, args, console: Console):
        self.args, self.console = args, console
        self.shapes, self.dims = parse_shapes(args.shape), parse_dims(args.dim)
        self.target = resolve_target(args.target, console)
        self.chosen = None  # the vtc_tvm.plan.Plan, once planned
        self._vtc = None

    def load(self):
        from .onnx_import import InputError, load_onnx
        from .options import check_inplace, check_ops

        try:
            self.ops = check_ops(_names(self.args.ops) or None)
        except (ValueError, TypeError) as e:
            raise UserError(str(e).replace("ops: ", "--ops: ", 1), ExitCode.BAD_OPTION) from None
        with self.console.phase(f"importing {os.path.basename(self.args.model)}"):
            try:
                self.mod = load_onnx(self.args.model, self.shapes, dims=self.dims)
            except InputError as e:
                raise from_input_error(e) from None
        self.inplace = _names(self.args.inplace)
        try:
            check_inplace(self.inplace, self.mod)
        except ValueError as e:
            raise UserError(str(e).replace("inplace: ", "--inplace: ", 1), ExitCode.BAD_OPTION) from None
        return self.mod

    def plan(self):
        """``main`` after VirtualTensorize (memory guard on, as in the ``"vtc"`` pipeline): the
        plan (kept in ``self.chosen``) and its emission, as the pass makes them."""
        from . import emit, plan

        if self._vtc is None:
            what = "planning (VirtualTensorize" + (", profiling edges on the device)" if self.args.profile else ")")
            if self.args.profile:
                device_for(self.target, "--profile")
            with self.console.phase(what):
                self.chosen = plan(self.mod, self.target, self.args.strategy, ops=self.ops, inplace=self.inplace,
                                   profile=self.args.profile, memory_guard=True)
                self._vtc = emit(self.mod, self.chosen)
        return self._vtc

    def build(self, variant: str):
        """Executable of ``variant`` ("stock": TVM's default pipeline; "vtc": the planned module
        through the stock pipeline with the store side)."""
        import tvm
        from tvm import relax

        from .pipeline import store_side_pipeline

        with self.console.phase(f"building {variant} ({self.target.kind.name})"):
            if variant == "stock":
                return tvm.compile(self.mod, target=self.target, relax_pipeline=relax.get_default_pipeline(self.target))
            return tvm.compile(self.plan(), target=self.target, relax_pipeline=store_side_pipeline(self.target))

    def census(self):
        from .report import kernel_census

        with self.console.phase("counting kernels and planned memory"):
            return {"stock": kernel_census(self.mod, self.target),
                    "vtc": kernel_census(self.plan(), self.target, stores=True)}

    def inputs(self):
        """Random inputs of ``main`` (seeded), with a description of what was drawn."""
        rng = np.random.default_rng(self.args.seed)
        arrays, described = [], []
        for p in self.mod["main"].params:
            shape, dtype = [_size(d) for d in p.ty.shape], str(p.ty.dtype)
            if dtype.startswith("float") or dtype == "bfloat16":
                arrays.append(rng.standard_normal(shape).astype(dtype))
                dist = "normal(0, 1)"
            else:
                arrays.append(rng.integers(0, 2, shape).astype(dtype))
                dist = "integers 0/1"
            described.append({"name": p.name, "shape": shape, "dtype": dtype, "values": dist})
        return arrays, described


def _size(dim) -> int:
    """A parameter dim at the check size (symbolic dims left by --dim are CHECK_SIZE)."""
    import tvm
    import tvm_ffi

    sized = tvm_ffi.structural_map(dim, (tvm.ir.Var, lambda v: tvm.tirx.IntImm(str(v.ty), CHECK_SIZE)),
                                   order="post")
    return int(tvm.sym.Analyzer().simplify(sized))


def _census_row(c) -> dict:
    return {k: c[k] for k in ("kernels", "data_movement", "planned_bytes")}


# -- subcommands ---------------------------------------------------------------------------------
def cmd_compile(args, console: Console, out: dict) -> ExitCode:
    s = Session(args, console)
    if args.check:
        dev = device_for(s.target, "--check")
    s.load()
    s.plan()
    executables = {"vtc": s.build("vtc")}
    out.update(model=args.model, target=str(s.target.kind.name), target_json=dict(s.target.export()),
               strategy=args.strategy)
    lines = [f"compiled {args.model} for {s.target.kind.name} (strategy {args.strategy})"]
    if args.report:
        from .explain import unique_decisions

        census, rows = s.census(), unique_decisions(s.chosen.rows)
        out.update(decisions=rows, census={k: _census_row(v) for k, v in census.items()})
        lines += _report_lines(rows, census)
    if args.out:
        with console.phase(f"writing {args.out}"):
            executables["vtc"].export_library(args.out)
        out["library"] = os.path.abspath(args.out)
        lines.append(f"wrote {args.out}")
    code = ExitCode.OK
    if args.check:
        executables = {"stock": s.build("stock"), **executables}
        result = check(s, executables, dev)
        out["check"] = result
        lines += _check_lines(result)
        code = ExitCode.OK if result["ok"] else ExitCode.MISMATCH
    _say(args, lines)
    return code


def _report_lines(rows, census) -> list:
    lines = [f"decisions ({len(rows)}):"]
    table = [(r["tensor"], r["consumer"], "virtual" if r["virtual"] else "physical", r["reason"]) for r in rows]
    widths = [max([len(h)] + [len(r[k]) for r in table]) for k, h in enumerate(("tensor", "consumer", "kind"))]
    for r in [("tensor", "consumer", "kind", "reason")] + table:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[3])
    (sk, sd), (vk, vd) = [(census[v]["kernels"], census[v]["data_movement"]) for v in ("stock", "vtc")]
    lines.append(f"kernels: stock {sk} ({sd} data-movement) -> vtc {vk} ({vd} data-movement)")
    return lines


def check(s: Session, executables: dict, dev) -> dict:
    """Run every build on the same random inputs; vtc vs stock, then both vs onnxruntime."""
    from .check import compare_outputs, tolerance
    from .report import run_vm

    inputs, described = s.inputs()
    outs = {}
    for name, ex in executables.items():
        with s.console.phase(f"running {name}"):
            outs[name] = run_vm(ex, dev, inputs)
    ort, why = _onnxruntime(s.args.model, s.mod, inputs)
    comparisons = [("vtc", "stock")]
    if ort is not None:
        outs["onnxruntime"] = ort
        comparisons += [("stock", "onnxruntime"), ("vtc", "onnxruntime")]
    result = {"inputs": described, "seed": s.args.seed,
              "outputs": [{"index": i, "shape": list(o.shape), "dtype": str(o.dtype),
                           "tolerance": dict(zip(("rel_l2", "max_rel"), tolerance(str(o.dtype)) or (0, 0)))}
                          for i, o in enumerate(outs["stock"])],
              "onnxruntime": "used" if ort is not None else f"skipped ({why})", "comparisons": []}
    for got, ref in comparisons:
        errors = compare_outputs(outs[ref], outs[got])
        result["comparisons"].append({"got": got, "ref": ref, "ok": all(e.ok for e in errors),
                                      "outputs": [e.to_json() for e in errors]})
    result["ok"] = all(c["ok"] for c in result["comparisons"])
    return result


def _check_lines(result) -> list:
    shown = [f"{i['name']}{i['shape']} {i['dtype']}" for i in result["inputs"]]
    ins = ", ".join(shown[:4]) + (f" and {len(shown) - 4} more" if len(shown) > 4 else "")
    kinds = ", ".join(sorted({i["values"] for i in result["inputs"]}))
    lines = [f"check: inputs (seed {result['seed']}; {kinds or 'no inputs'}): {ins or 'none'}"]
    for o in result["outputs"]:
        tol = o["tolerance"]
        bound = (f"rel-L2 <= {tol['rel_l2']:g} and max|err|/max|ref| <= {tol['max_rel']:g}"
                 if tol["rel_l2"] else "exact")
        lines.append(f"check: output {o['index']}: {o['shape']} {o['dtype']} (tolerance: {bound})")
    if result["onnxruntime"] != "used":
        lines.append(f"check: onnxruntime {result['onnxruntime']}")
    for c in result["comparisons"]:
        verdict = "ok" if c["ok"] else "MISMATCH"
        detail = "; ".join(f"output {e['index']}: {_describe(e)}" for e in c["outputs"])
        lines.append(f"check: {c['got']} vs {c['ref']}: {verdict} ({detail})")
    return lines


def _describe(e: dict) -> str:
    from .check import OutputError

    return OutputError(**e).describe()


def _onnxruntime(path: str, mod, inputs):
    """onnxruntime's outputs, or (None, why) when it is not installed or cannot run the model."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None, "onnxruntime is not installed"
    try:
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        return [np.asarray(o) for o in sess.run(None, dict(zip(names, inputs)))], None
    except Exception as e:  # noqa: BLE001 - e.g. an op onnxruntime lacks
        return None, " ".join(str(e).split())[:200]


def cmd_bench(args, console: Console, out: dict) -> ExitCode:
    from .report import run_vm, time_vm

    s = Session(args, console)
    dev = device_for(s.target, "bench")
    s.load()
    census = s.census()
    executables = {v: s.build(v) for v in ("stock", "vtc")}
    inputs, described = s.inputs()
    samples = {v: [] for v in executables}
    with console.phase(f"timing ({args.rounds} interleaved rounds of {args.repeat} runs)"):
        for ex in executables.values():
            run_vm(ex, dev, inputs)  # warm-up (and a crash here is not a timing)
        for _ in range(args.rounds):
            for v, ex in executables.items():
                samples[v].append(time_vm(ex, dev, inputs, args.repeat))
    med = {v: float(np.median(t)) for v, t in samples.items()}
    out.update(model=args.model, target=s.target.kind.name, inputs=described, rounds=args.rounds,
               repeat=args.repeat, variants={v: {**_census_row(census[v]), "median_ms": med[v],
                                                  "round_medians_ms": samples[v]} for v in executables},
               speedup=med["stock"] / med["vtc"] if med["vtc"] > 0 else None)
    _say(args, bench_lines(out))
    return ExitCode.OK


def bench_lines(out: dict) -> list:
    """The text table of a ``bench`` result (its ``--json`` object)."""
    lines = [f"{out['model']} on {out['target']}: medians of {out['rounds']} interleaved rounds x {out['repeat']} runs",
             f"{'':8}{'kernels':>9}{'data-mv':>9}{'mem MiB':>10}{'ms':>10}"]
    for v, c in out["variants"].items():
        mib = "n/a" if c["planned_bytes"] is None else f"{c['planned_bytes'] / 2**20:.3f}"
        lines.append(f"{v:8}{c['kernels']:>9}{c['data_movement']:>9}{mib:>10}{c['median_ms']:>10.3f}")
    if out["speedup"]:
        lines.append(f"speed-up: {out['speedup']:.2f}x")
    return lines


def cmd_tune(args, console: Console, out: dict) -> ExitCode:
    import importlib
    import importlib.util

    if importlib.util.find_spec(f"{__package__}.tuning") is None:
        raise UserError("tuning support is not installed in this build (no module vtc_tvm.tuning)",
                        ExitCode.NO_TUNING)
    tuning = importlib.import_module(f"{__package__}.tuning")  # its own import errors are crashes
    s = Session(args, console)
    device_for(s.target, "tune")
    mod = s.load()
    stats = {}
    with console.phase(f"planning and tuning ({args.trials} trials per task"
                       + (f", at most {args.seconds:g} s)" if args.seconds else ")")):
        # tune() runs the vtc pipeline's front itself (VirtualTensorize with these options).
        tuning.tune(mod, s.target, args.work_dir, max_trials_per_task=args.trials, max_seconds=args.seconds,
                    progress=not args.quiet, stats=stats, strategy=args.strategy, ops=s.ops,
                    inplace=s.inplace, memory_guard=True)
    out.update(model=args.model, target=s.target.kind.name, work_dir=os.path.abspath(args.work_dir),
               trials=args.trials, seconds=args.seconds, result=_jsonable(stats))
    _say(args, [f"tuned {args.model} for {s.target.kind.name}: database in {args.work_dir}"])
    return ExitCode.OK


def cmd_explain(args, console: Console, out: dict) -> ExitCode:
    from . import explain

    s = Session(args, console)
    dev = device_for(s.target, "--time") if args.time else None
    s.load()
    s.plan()
    census = s.census()
    if args.time:
        from .report import time_vm

        executables = {v: s.build(v) for v in ("stock", "vtc")}
        inputs, _ = s.inputs()
        with console.phase("timing stock and vtc"):
            for v, ex in executables.items():
                census[v]["latency_ms"] = time_vm(ex, dev, inputs, args.repeat)
    plan = explain.plan_of(s.mod, s.chosen, census, args.model)
    html_path = args.out or os.path.splitext(os.path.basename(args.model))[0] + ".vtc.html"
    with console.phase(f"rendering {html_path}"):
        written = explain.write_report(plan, html_path, title=os.path.basename(args.model))
    if written.get("png_skipped"):
        console.note(f"no PNG: {written['png_skipped']}")
    out.update(model=args.model, target=s.target.kind.name, plan=plan, files=written)
    summary = plan["summary"]
    _say(args, [f"{args.model}: {summary['virtual']} of {summary['tensors']} movement tensors virtual; "
                f"kernels {summary['kernels']['stock']} -> {summary['kernels']['vtc']}",
                f"wrote {written['html']}" + (f" and {written['png']}" if written.get("png") else "")])
    return ExitCode.OK


def cmd_demo(args, console: Console, out: dict) -> ExitCode:
    from . import demo

    return demo.run(args, console, out)


COMMANDS = {"compile": cmd_compile, "explain": cmd_explain, "bench": cmd_bench, "tune": cmd_tune, "demo": cmd_demo}


# -- output and the driver -------------------------------------------------------------------
def _say(args, lines) -> None:
    if not args.json:
        print("\n".join(lines), flush=True)


def _jsonable(value):
    """``value`` with non-finite floats as strings and unknown objects as their ``str``."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bool, int, str)) or value is None:
        return value
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else str(float(value))
    if isinstance(value, np.integer):
        return int(value)
    return str(value)


def main(argv=None, prog: str = "vtc-tvm") -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv or bool(os.environ.get("VTC_TVM_DEBUG"))
    wants_json = "--json" in argv
    tvm_logger = logging.getLogger("tvm")
    level = tvm_logger.level
    with silence_native_stderr(not debug) as stream, warnings.catch_warnings():
        if not debug:
            warnings.simplefilter("ignore")
            tvm_logger.setLevel(logging.ERROR)
        console = Console(quiet="-q" in argv or "--quiet" in argv, stream=stream)
        out: dict = {}
        try:
            ap = parser(prog)
            args = ap.parse_args(argv)
            out["command"] = args.command
            code = COMMANDS[args.command](args, console, out)
        except UserError as e:
            code = e.code
            console.error(str(e))
            out.update(error=str(e))
        except KeyboardInterrupt:
            code = ExitCode.INTERRUPTED
            console.error("interrupted")
            out.update(error="interrupted")
        except Exception as e:  # noqa: BLE001 - a crash: one line unless --debug
            if debug:
                raise
            code = ExitCode.INTERNAL
            msg = " ".join(str(e).split())[:300]
            console.error(f"internal error: {type(e).__name__}: {msg} (--debug shows the traceback)")
            out.update(error=f"{type(e).__name__}: {msg}")
        finally:
            tvm_logger.setLevel(level)
        if wants_json:
            out.update(exit_code=int(code), ok=code == ExitCode.OK)
            print(json.dumps(_jsonable(out), indent=1), flush=True)
        return int(code)
