"""Fuzzer regression (crash, strategy 'contiguity', ops: add, permute_dims, split).

Found by tests/fuzz.py:
    [crash] strategy='contiguity' stage=cuda build: AssertionError: ((3,), (2,))

Run: pytest tests/test_fuzz.py -k case_dabe30303d   (tests/test_fuzz.py runs every saved case)
"""

import tvm  # noqa: F401 - symbolic sizes are tvm.tirx.Var
from tvm import relax

INPUTS = [  # name, shape, dtype, index range [low, high) per last-axis slot
    ('x1', (2,), 'float32', None, None),
    ('x3', (1,), 'float32', None, None),
]
DATA_SEED = 0
TARGET = 'cuda'  # built, not run: see tests/fuzz.py's build_differential


def build():
    bb = relax.BlockBuilder()
    x1 = relax.Var('x1', relax.TensorType((2,), 'float32'))
    x3 = relax.Var('x3', relax.TensorType((1,), 'float32'))
    with bb.function("main", [x1, x3]):
        c4 = bb.emit(relax.op.add(x1, x3))
        t6 = bb.emit(relax.op.split(c4, [3], axis=-1))
        m7 = bb.emit(relax.TupleGetItem(t6, 0))
        m9 = bb.emit(relax.op.permute_dims(m7, axes=[0]))
        m11 = bb.emit(relax.op.permute_dims(m9, axes=[0]))
        bb.emit_func_output(m11)
    return bb.get()
