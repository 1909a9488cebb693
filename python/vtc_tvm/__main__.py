"""Command line: ``python -m vtc_tvm demo [...]`` and ``python -m vtc_tvm compile MODEL.onnx [...]``.

Exit codes: 0 ok, 1 numeric mismatch (``--check``), 2 bad input or usage (one ``error:`` line on
stderr, never a traceback; set VTC_TVM_DEBUG=1 to get the traceback of a compile failure).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np


class _Parser(argparse.ArgumentParser):
    # argparse prints the usage first; the contract is that stderr starts with "error:".
    def error(self, message):
        raise _Fail(f"{message} (see {self.prog} --help)")


class _Fail(Exception):
    """Bad input or usage: reported as one ``error:`` line, exit code 2."""


def _shape_arg(text: str) -> tuple[str, list[int]]:
    name, eq, dims = text.rpartition("=")  # rpartition: ONNX input names may contain '='
    try:
        shape = [int(d) for d in dims.split(",")]
    except ValueError:
        shape = None
    if not eq or not name or not shape or min(shape) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=D1,D2,... with positive integer sizes")
    return name, shape


def _dim_arg(text: str) -> tuple[str, int]:
    name, eq, size = text.rpartition("=")
    if not eq or not name or not size.isdigit() or int(size) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=SIZE with a positive integer size")
    return name, int(size)


def _parser() -> _Parser:
    ap = _Parser(prog="python -m vtc_tvm", description="vtc-tvm: virtual tensors for TVM Relax.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="{demo,compile}")
    sub.add_parser("demo", help="stock TVM vs VirtualTensorize on a built-in model (see demo --help)")
    c = sub.add_parser("compile", help="import an ONNX model, apply VirtualTensorize and compile it")
    c.add_argument("model", metavar="MODEL.onnx")
    c.add_argument("--target", choices=["llvm", "cuda"], default="llvm")
    c.add_argument("--strategy", choices=["contiguity", "all"], default="contiguity")
    c.add_argument("--shape", type=_shape_arg, action="append", default=[], metavar="NAME=D1,D2,...",
                   help="static shape of an input (needed for unknown dims; named symbolic dims "
                        "otherwise stay symbolic) (repeatable)")
    c.add_argument("--dim", type=_dim_arg, action="append", default=[], metavar="NAME=SIZE",
                   help=f"size of a symbolic dim for --check (default {_CHECK_SIZE}) (repeatable)")
    c.add_argument("--check", action="store_true",
                   help="compare vtc with stock TVM (and onnxruntime when installed) on random inputs")
    c.add_argument("--out", metavar="lib.so", help="export the compiled vtc library")
    c.add_argument("--report", action="store_true", help="print the decisions and the kernel counts")
    c.add_argument("--seed", type=int, default=0, help="seed of the --check inputs")
    return ap


def _target(name: str, need_device: bool):
    import tvm

    from .pipeline import cuda_target

    if name == "llvm":
        return tvm.target.Target("llvm"), tvm.cpu(0)
    if tvm.get_global_func("target.build.cuda", allow_missing=True) is None:
        raise _Fail("--target cuda: this TVM build has no CUDA support")
    if need_device and not tvm.cuda(0).exist:
        raise _Fail("--check --target cuda needs a CUDA GPU and none is visible (drop --check to only compile)")
    return cuda_target(), tvm.cuda(0)


def _stage(what: str, fn, *args):
    """Run a TVM step; its failure on this model is bad input, reported in one line."""
    try:
        return fn(*args)
    except Exception as e:
        if os.environ.get("VTC_TVM_DEBUG"):
            raise
        msg = " ".join(str(e).split())[:300]
        raise _Fail(f"{what} failed: {type(e).__name__}: {msg} (VTC_TVM_DEBUG=1 shows the traceback)") from None


_CHECK_SIZE = 3  # symbolic dims of --check inputs without a --dim


def _random_inputs(mod, seed: int, dims: dict) -> list[np.ndarray]:
    """Random values for ``main``'s parameters (symbolic dims sized by ``dims``, by name);
    integers are 0/1 so index inputs stay in range."""
    rng = np.random.default_rng(seed)
    arrays = []
    for p in mod["main"].params:
        shape, dtype = [_size(d, dims) for d in p.ty.shape], str(p.ty.dtype)
        if dtype.startswith("float") or dtype == "bfloat16":
            arrays.append(rng.standard_normal(shape).astype(dtype))
        else:
            arrays.append(rng.integers(0, 2, shape).astype(dtype))
    return arrays


def _size(dim, dims: dict) -> int:
    """A parameter dim at the --check sizes: symbolic dims by name (default _CHECK_SIZE)."""
    import tvm
    import tvm_ffi

    sized = tvm_ffi.structural_map(dim, (tvm.ir.Var, lambda v: tvm.tirx.IntImm(
        str(v.ty), dims.get(v.name, _CHECK_SIZE))), order="post")
    return int(tvm.sym.Analyzer().simplify(sized))


def _onnxruntime(path: str, inputs: list[np.ndarray]):
    """onnxruntime's outputs, or (None, why) when it is not installed or cannot run the model."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None, "not installed"
    try:
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        return sess.run(None, dict(zip(names, inputs))), None
    except Exception as e:
        return None, " ".join(str(e).split())[:200]


def _check(args, mod, executables, dev) -> int:
    from .demo import mismatch
    from .report import run_vm

    # numpy lacks e.g. bfloat16
    inputs = _stage("making random inputs", _random_inputs, mod, args.seed, dict(args.dim))
    outs = {name: _stage(f"running the {name} build", run_vm, ex, dev, inputs) for name, ex in executables.items()}
    ort, why = _onnxruntime(args.model, inputs)
    if ort is None:
        print(f"check: onnxruntime skipped ({why})")
    else:
        outs["onnxruntime"] = [np.asarray(o) for o in ort]
    ref_name = "onnxruntime" if ort is not None else "stock"
    ref, failed = outs[ref_name], 0
    for name in [n for n in outs if n != ref_name]:
        bad = mismatch(ref, outs[name], str(ref[0].dtype))
        print(f"check: {name} vs {ref_name}: {'MISMATCH ' + bad if bad else 'ok'}")
        failed += bool(bad)
    return 1 if failed else 0


def _report(decisions, census):
    print(f"decisions ({len(decisions)}):")
    rows = [(str(d["tensor"]), str(d["consumer"]), "virtual" if d["virtual"] else "physical", str(d["reason"]))
            for d in decisions]
    widths = [max([len(h)] + [len(r[k]) for r in rows]) for k, h in enumerate(("tensor", "consumer", "kind"))]
    for r in [("tensor", "consumer", "kind", "reason")] + rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[3])
    (sk, sd), (vk, vd) = [(c["kernels"], c["data_movement"]) for c in census]
    print(f"kernels: stock {sk} ({sd} data-movement) -> vtc {vk} ({vd} data-movement)")


def compile_cmd(args) -> int:
    import tvm
    from tvm import relax

    from . import VirtualTensorize
    from .onnx_import import InputError, load_onnx
    from .report import kernel_census

    target, dev = _target(args.target, args.check)
    try:
        mod = load_onnx(args.model, dict(args.shape))
    except InputError as e:
        raise _Fail(str(e)) from None
    decisions: list = []
    vtc_pass = VirtualTensorize(args.strategy, report=decisions, target=target, memory_guard=True)
    vtc = _stage("VirtualTensorize", vtc_pass, mod)

    def build(m):
        return tvm.compile(m, target=target, relax_pipeline=relax.get_default_pipeline(target))

    executables = {"vtc": _stage("compiling", build, vtc)}
    if args.check:
        executables = {"stock": _stage("compiling (stock)", build, mod), **executables}
    print(f"compiled {args.model} for {target.kind.name} (strategy {args.strategy})")
    if args.report:
        _report(decisions, [_stage("kernel census", kernel_census, m, target) for m in (mod, vtc)])
    if args.out:
        _stage(f"writing {args.out}", executables["vtc"].export_library, args.out)
        print(f"wrote {args.out}")
    return _check(args, mod, executables, dev) if args.check else 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv[:1] == ["demo"]:  # the demo parses its own options
            from . import demo

            return demo.main(argv[1:])
        args = _parser().parse_args(argv)
        return compile_cmd(args)
    except _Fail as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
