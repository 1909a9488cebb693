"""Fuzzer regression (mismatch, strategy 'contiguity', ops: concat, flatten, flip, permute_dims, reshape, tuple).

Found by tests/fuzz.py:
    [mismatch] strategy='contiguity' stage=compare: output 0 float32(32, 1): 16/32 elements differ; first at (16, 0): got np.float32(-0.70373523), expected np.float32(-0.7322674)

Run: pytest tests/test_fuzz.py -k case_10bd8a2712   (tests/test_fuzz.py runs every saved case)
"""

from tvm import relax

INPUTS = [  # name, shape, dtype, index range [low, high) per last-axis slot
    ('x1', (2, 2, 4), 'float32', None, None),
]
DATA_SEED = 0


def build():
    bb = relax.BlockBuilder()
    x1 = relax.Var('x1', relax.TensorType((2, 2, 4), 'float32'))
    with bb.function("main", [x1]):
        m2 = bb.emit(relax.op.reshape(x1, [-1, 1]))
        m3 = bb.emit(relax.op.permute_dims(m2))
        m4 = bb.emit(relax.op.permute_dims(m3))
        m9 = bb.emit(relax.op.flip(m4, axis=0))
        t10 = bb.emit(relax.Tuple([m4, m9]))
        m11 = bb.emit(relax.op.concat(t10, axis=-2))
        bb.emit_func_output(m11)
    return bb.get()
