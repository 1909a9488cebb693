"""Schedule-rule fuzzer: random kernels of the kinds our CUDA rules take, checked on the CPU.

The graph fuzzer (``tests/fuzz.py``) keeps tensors small (4096 elements), below the sizes our
schedule rules take. Here each case is one random layer at a size they do take, often read
through a data-movement op that ``VirtualTensorize`` inlines into the layer's loads: a dense,
depthwise or grouped convolution, a pooling window or a GEMM (few rows, few columns, batched),
fp16 or fp32, a static or symbolic batch, an epilogue (bias, ReLU, SiLU, scale, cast), the input
transposed, sliced, padded or concatenated first. Each is built through the ``"vtc"`` pipeline
for CUDA (a case that neither stock TVM nor vtc builds is discarded; one that only stock builds
is a crash), and every kernel one of our rules took is run on llvm with its thread loops serial
against the kernel it was given (:mod:`tests.schedule_semantics`; WMMA ones through their
untensorized twins).

    python -m tests.schedule_fuzz --cases 300 --seed 1 [--minutes 20] [--nvcc]

prints each failing case (``--replay SEED`` rebuilds case ``SEED``) and the kernels each rule took.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time

import numpy as np
import tvm
from tvm import relax, tirx

from vtc_tvm.pipeline import cuda_target, vtc_pipeline
from tests.fuzz import cuda_build
from tests.schedule_semantics import Recorder

TARGET = cuda_target()
EPILOGUES = ("none", "bias", "relu", "silu", "scale", "bias+relu")
PRODUCERS = ("none", "none", "transpose", "slice", "concat", "pad")


class Case:
    """Case ``seed``: ``describe`` says what it is, ``build()`` gives its Relax module."""

    def __init__(self, seed: int):
        self.seed = seed
        rng = np.random.default_rng(seed)
        self.dtype = str(rng.choice(["float16", "float16", "float32"]))
        self.kind = str(rng.choice(["conv", "conv", "depthwise", "pool", "matmul", "projection"]))
        self.batch = rng.choice([1, 2, "n"]) if self.kind in ("conv", "depthwise", "pool") else 1
        self.epilogue = str(rng.choice(EPILOGUES)) if self.kind != "pool" else "none"
        self.producer = str(rng.choice(PRODUCERS))
        if self.kind in ("conv", "depthwise", "pool"):
            self.cin = int(rng.choice([3, 8, 16, 24, 32, 48])) if self.kind == "conv" else int(rng.integers(8, 97))
            self.cout = int(rng.choice([4, 8, 10, 16, 24, 32, 40, 64])) if self.kind == "conv" else self.cin
            self.k = int(rng.choice([1, 3, 3, 5]))
            self.stride = int(rng.choice([1, 1, 2]))
            self.hw = (int(rng.integers(8, 41)), int(rng.integers(8, 41)))
            self.groups = 1 if self.kind == "conv" else self.cin
            per_group = int(rng.choice([2, 4, 8]))
            if self.kind == "depthwise" and rng.random() < 0.3 and self.cin % per_group == 0:
                self.groups = self.cin // per_group  # grouped: a few input channels a group
            self.pool = str(rng.choice(["max", "avg"]))
        elif self.kind == "matmul":
            self.m = int(rng.choice([1, 4, 16, 32, int(rng.integers(256, 1200))]))
            self.kdim = int(rng.choice([16, 64, 128, 256, 512]))
            self.n = int(rng.choice([8, 16, 24, 32, 48, 128, 512]))
            self.heads, self.transposed = int(rng.choice([1, 1, 4])), False
        else:  # a decode projection: a few rows against a weight of 1-2 M elements, often W[n, k]
            self.m = int(rng.choice([1, 2, 3, 8, 16, 17, 32]))
            self.kdim = int(rng.choice([256, 512, 1024, 2048]))
            self.n = (1 << 20) // self.kdim * int(rng.choice([1, 2]))
            self.heads, self.transposed = 1, bool(rng.random() < 0.5)
        # Drawn after all the above, so that every earlier case keeps what it was: a quarter of
        # the dense convolutions get more than 64 channels on both sides (DLight's tensor-core
        # tile where static, FittedTensorCoreGEMM's where the batch is symbolic).
        if self.kind == "conv" and rng.random() < 0.25:
            self.cin = int(rng.choice([72, 96]))
            self.cout = int(rng.choice([80, 128, 160, 256]))
            self.k = int(rng.choice([1, 3]))

    @property
    def describe(self) -> str:
        skip = {"seed"}
        return f"case {self.seed}: " + ", ".join(f"{k}={v}" for k, v in vars(self).items() if k not in skip)

    # -- building ---------------------------------------------------------------------------------
    def _var(self, name, shape):
        return relax.Var(name, relax.TensorType(shape, self.dtype))

    def _input(self, bb, params, shape, axis):
        """A tensor of ``shape`` for the layer, through the case's producer op (along ``axis``)."""
        if self.producer == "transpose":
            perm = list(range(len(shape)))
            perm[-1], perm[-2] = perm[-2], perm[-1]
            x = self._var("x", [shape[p] for p in perm])
            params.append(x)
            return bb.emit(relax.op.permute_dims(x, perm))
        if self.producer == "slice" and isinstance(shape[axis], int):
            x = self._var("x", [d + 3 if i == axis else d for i, d in enumerate(shape)])
            params.append(x)
            return bb.emit(relax.op.strided_slice(x, [axis], [2], [2 + shape[axis]]))
        if self.producer == "concat" and isinstance(shape[axis], int) and shape[axis] >= 2:
            half = shape[axis] // 2
            a = self._var("a", [half if i == axis else d for i, d in enumerate(shape)])
            b = self._var("b", [shape[axis] - half if i == axis else d for i, d in enumerate(shape)])
            params += [a, b]
            return bb.emit(relax.op.concat([a, b], axis))
        if self.producer == "pad" and len(shape) == 4:
            x = self._var("x", shape[:2] + [shape[2] - 2, shape[3] - 2])
            params.append(x)
            return bb.emit(relax.op.nn.pad(x, [0, 0, 0, 0, 1, 1, 1, 1]))
        x = self._var("x", shape)
        params.append(x)
        return x

    def _epilogue(self, bb, params, y, channels, axis):
        if self.epilogue == "none":
            return y
        if "bias" in self.epilogue:
            shape = [1] * len(y.ty.shape)
            shape[axis] = channels
            b = self._var("bias", shape)
            params.append(b)
            y = bb.emit(relax.op.add(y, b))
        if "relu" in self.epilogue:
            y = bb.emit(relax.op.nn.relu(y))
        if self.epilogue == "silu":
            y = bb.emit(relax.op.nn.silu(y))
        if self.epilogue == "scale":
            y = bb.emit(relax.op.multiply(y, relax.const(0.5, self.dtype)))
        return y

    def build(self) -> tvm.IRModule:
        bb = relax.BlockBuilder()
        params: list = []
        n = tirx.Var("n", "int64") if self.batch == "n" else int(self.batch)
        with bb.function("main"):
            with bb.dataflow():
                if self.kind in ("matmul", "projection"):
                    lead = [self.heads] if self.heads > 1 else []
                    x = self._input(bb, params, lead + [self.m, self.kdim], len(lead) + 1)
                    if self.transposed:  # x @ W.T, W[n, k] as LLM checkpoints hold it
                        w = self._var("w", [self.n, self.kdim])
                        params.append(w)
                        y = bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(w))))
                    else:
                        w = self._var("w", lead + [self.kdim, self.n])
                        params.append(w)
                        y = bb.emit(relax.op.matmul(x, w))
                    y = self._epilogue(bb, params, y, self.n, len(lead) + 1)
                else:
                    h, w_ = self.hw
                    x = self._input(bb, params, [n, self.cin, h, w_], 1)
                    if self.kind == "pool":
                        op = relax.op.nn.max_pool2d if self.pool == "max" else relax.op.nn.avg_pool2d
                        y = bb.emit(op(x, (self.k, self.k), (self.stride, self.stride), (self.k // 2,) * 4))
                    else:
                        wt = self._var("w", [self.cout, self.cin // self.groups, self.k, self.k])
                        params.append(wt)
                        y = bb.emit(relax.op.nn.conv2d(x, wt, strides=self.stride, padding=self.k // 2,
                                                       groups=self.groups))
                    y = self._epilogue(bb, params, y, self.cout, 1)
                out = bb.emit_output(y)
            bb.emit_func_output(out, params)
        return bb.get()


def stock_builds(case: Case) -> bool:
    """Whether stock TVM's default CUDA pipeline builds the case (else it is discarded: e.g. a 1x1
    depthwise convolution, whose one-term reduction trips an assertion in DLight's GEMV rule)."""
    try:
        tvm.compile(case.build(), target=TARGET)
        return True
    except Exception:  # noqa: BLE001 - whatever stock raises, the case says nothing about us
        return False


def run_case(case: Case, nvcc_check: bool = False):
    """``(rules that took a kernel, problems, skipped)`` of one case."""
    recorder = Recorder(TARGET)
    pipeline = vtc_pipeline(TARGET, schedules=recorder.rules)
    if nvcc_check:
        cuda_build(case.build(), pipeline)  # the source through nvcc where it is on PATH
    else:
        tvm.compile(case.build(), target=TARGET, relax_pipeline=pipeline)
    problems, skipped = recorder.check(seed=case.seed)
    return [t.rule for t in recorder.taken], problems, skipped


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0, help="first case seed (cases are seed, seed + 1, ...)")
    ap.add_argument("--minutes", type=float, default=float("inf"))
    ap.add_argument("--nvcc", action="store_true", help="also compile each case's CUDA with nvcc")
    ap.add_argument("--replay", type=int, help="run case SEED alone, verbosely")
    args = ap.parse_args(argv)
    if args.replay is not None:
        case = Case(args.replay)
        print(case.describe)
        print(case.build().script())
        print(run_case(case, args.nvcc))
        return 0
    start, taken, failures, crashes, done, discarded = time.time(), collections.Counter(), [], [], 0, 0
    beyond_stock = 0  # cases stock TVM cannot build and the vtc pipeline builds (checked like the rest)
    last = args.seed - 1
    for seed in range(args.seed, args.seed + args.cases):
        if time.time() - start > args.minutes * 60:
            break
        last, case = seed, Case(seed)
        stock_ok = stock_builds(case)
        try:
            rules, problems, skipped = run_case(case, args.nvcc)
        except Exception as err:  # noqa: BLE001 - a crash of the build is a finding too
            if not stock_ok:  # both fail: a limit of TVM's, not a finding
                discarded += 1
                continue
            crashes.append(f"{case.describe}\n    {type(err).__name__}: {str(err).strip().splitlines()[-1:]}")
            print("CRASH", crashes[-1], flush=True)
            continue
        done += 1
        beyond_stock += not stock_ok
        taken.update(rules)
        taken.update({f"skipped ({why})": n for why, n in skipped.items()})
        if problems:
            failures.append(f"{case.describe}\n    " + "\n    ".join(problems))
            print("MISMATCH", failures[-1], flush=True)
    print(f"\ncases {done + discarded} (seeds {args.seed}..{last}), {discarded} discarded (stock and vtc failed), "
          f"{beyond_stock} built by vtc where stock failed, {time.time() - start:.0f}s")
    print(f"kernels our rules took (checked on llvm): {dict(taken)}")
    print(f"mismatches {len(failures)}, crashes {len(crashes)}")
    return 1 if failures or crashes else 0


if __name__ == "__main__":
    sys.exit(main())
