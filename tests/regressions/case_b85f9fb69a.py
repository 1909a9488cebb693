"""Fuzzer regression (mismatch, strategy 'contiguity', ops: flip, repeat).

Found by tests/fuzz.py:
    [mismatch] strategy='contiguity' stage=compare: output 0 float32(4,): 2/4 elements differ; first at (1,): got np.float32(0.12573022), expected np.float32(-0.13210486)

Run: pytest tests/test_fuzz.py -k case_b85f9fb69a   (tests/test_fuzz.py runs every saved case)
"""

from tvm import relax

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
