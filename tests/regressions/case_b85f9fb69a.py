"""Fuzzer regression (mismatch, strategy 'contiguity', ops: flip, repeat).

Found by tests/fuzz.py:
    [mismatch] strategy='contiguity' stage=compare: output 0 float32(4,): 2/4 elements differ; first at (1,): got np.float32(0.12573022), expected np.float32(-0.13210486)

Run: python tests/regressions/case_b85f9fb69a.py   or   pytest tests/regressions/case_b85f9fb69a.py
"""

import numpy as np
import tvm
from tvm import relax

import vtc_tvm

INPUTS = [  # name, shape, dtype, index range [low, high) per last-axis slot
    ('x1', (2,), 'float32', None, None),
]
DATA_SEED = 0


def build():
    bb = relax.BlockBuilder()
    x1 = relax.Var('x1', relax.TensorType((2,), 'float32'))
    with bb.function("main", [x1]):
        m2 = bb.emit(relax.op.repeat(x1, 2))
        m3 = bb.emit(relax.op.flip(m2, axis=-1))
        bb.emit_func_output(m3)
    return bb.get()


def make_inputs():
    rng = np.random.default_rng(DATA_SEED)
    arrays = []
    for _name, shape, dtype, low, high in INPUTS:
        if low is not None:
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


def run(mod, arrays):
    pipeline = relax.get_default_pipeline(tvm.target.Target("llvm"))
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm", relax_pipeline=pipeline), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in arrays])
    return [o.numpy() for o in (list(out) if not isinstance(out, tvm.runtime.Tensor) else [out])]


def test_case(strategy='contiguity'):
    mod, arrays = build(), make_inputs()
    expected = run(mod, arrays)
    new = vtc_tvm.VirtualTensorize(strategy=strategy)(mod)
    assert relax.analysis.check_well_formed(new)
    got = run(new, arrays)
    assert len(got) == len(expected)
    for e, g in zip(expected, got):
        assert e.shape == g.shape and e.dtype == g.dtype
        if e.dtype.kind in "iub":
            np.testing.assert_array_equal(g, e)
        else:
            tol = 1e-3 if e.dtype == np.float16 else 1e-6
            np.testing.assert_allclose(g, e, rtol=tol, atol=tol)


if __name__ == "__main__":
    print(build().script())
    for s in ("contiguity", "all"):
        test_case(s)
        print("strategy", s, "ok")
