"""Fuzzer regression (mismatch, strategy 'contiguity', ops: concat, flip, layout_transform, permute_dims, repeat).

Found by tests/fuzz.py:
    [mismatch] strategy='contiguity' stage=compare: output 0 float32(3,): 2/3 elements differ; first at (1,): got np.float32(0.0), expected np.float32(0.12573022) at sizes {'n': 1}

Run: pytest tests/test_fuzz.py -k case_3448c91982   (tests/test_fuzz.py runs every saved case)
"""

import tvm  # noqa: F401 - symbolic sizes are tvm.tirx.Var
from tvm import relax

INPUTS = [  # name, shape, dtype, index range [low, high) per last-axis slot (strings: expressions of the symbolic sizes)
    ('x1', ('n',), 'float32', None, None),
]
DATA_SEED = 0
SIZES = [{'n': 1}, {'n': 2}]  # run once per entry (one compiled module)


def build():
    bb = relax.BlockBuilder()
    n = tvm.tirx.Var('n', 'int64')
    x1 = relax.Var('x1', relax.TensorType((n,), 'float32'))
    with bb.function("main", [x1]):
        m3 = bb.emit(relax.op.repeat(x1, 3))
        m5 = bb.emit(relax.op.permute_dims(m3, axes=[0]))
        m7 = bb.emit(relax.op.flip(m5, axis=0))
        bb.emit_func_output(m7)
    return bb.get()
