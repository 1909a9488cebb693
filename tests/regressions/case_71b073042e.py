"""Fuzzer regression (crash, strategy 'contiguity', ops: conv2d, flatten, strided_slice).

Found by tests/fuzz.py:
    [crash] strategy='contiguity' stage=cuda build: AttributeError: dtype is only available on a Var with BufferType

Run: pytest tests/test_fuzz.py -k case_71b073042e   (tests/test_fuzz.py runs every saved case)
"""

import tvm  # noqa: F401 - symbolic sizes are tvm.tirx.Var
from tvm import relax

INPUTS = [  # name, shape, dtype, index range [low, high) per last-axis slot (strings: expressions of the symbolic sizes)
    ('x1', (4, 1, 4, 'n'), 'float32', None, None),
    ('w4', (3, 1, 1, 2), 'float32', None, None),
]
DATA_SEED = 188
SIZES = [{'n': 1}, {'n': 5}]  # run once per entry (one compiled module)
TARGET = 'cuda'  # built, not run: see tests/fuzz.py's build_differential


def build():
    bb = relax.BlockBuilder()
    n = tvm.tirx.Var('n', 'int64')
    x1 = relax.Var('x1', relax.TensorType((4, 1, 4, n), 'float32'))
    w4 = relax.Var('w4', relax.TensorType((3, 1, 1, 2), 'float32'))
    with bb.function("main", [x1, w4]):
        m2 = bb.emit(relax.op.strided_slice(x1, axes=[0, 1, 3, 2], begin=[0, 3, 0, -1], end=[6, -9223372036854775808, 9223372036854775807, 4], strides=[1, -3, 1, 1]))
        c5 = bb.emit(relax.op.nn.conv2d(m2, w4, strides=1, padding=1))
        bb.emit_func_output(c5)
    return bb.get()
