"""Fuzzer regression (crash, strategy 'contiguity', ops: conv2d).

Found by tests/fuzz.py:
    [crash] strategy='contiguity' stage=cuda build: ValueError: Mismatched conv2d_nchw.strides on argument #2 when calling: `k(x1: Tensor([T.int64(3), T.int64(7), n, T.int64(1)], float32), w3: Tensor([T.int64(3), T.int64(7), T.int64(1), T.int64(1)], float32), conv2d_nchw: Tensor([T.int64(3), T.int64(3), (n - T.int64(1)) // T.int64(2) + T.int64(1), T.int64(1)], float32))`, expected to be compact array

Run: pytest tests/test_fuzz.py -k case_7b970e547d   (tests/test_fuzz.py runs every saved case)
"""

import tvm  # noqa: F401 - symbolic sizes are tvm.tirx.Var
from tvm import relax

INPUTS = [  # name, shape, dtype, index range [low, high) per last-axis slot (strings: expressions of the symbolic sizes)
    ('x1', (3, 7, 'n', 1), 'float32', None, None),
    ('w3', (3, 7, 1, 1), 'float32', None, None),
]
DATA_SEED = 0
SIZES = [{'n': 1}, {'n': 2}]  # run once per entry (one compiled module)
TARGET = 'cuda'  # built, not run: see tests/fuzz.py's build_differential


def build():
    bb = relax.BlockBuilder()
    n = tvm.tirx.Var('n', 'int64')
    x1 = relax.Var('x1', relax.TensorType((3, 7, n, 1), 'float32'))
    w3 = relax.Var('w3', relax.TensorType((3, 7, 1, 1), 'float32'))
    with bb.function("main", [x1, w3]):
        c4 = bb.emit(relax.op.nn.conv2d(x1, w3, strides=2, padding=0))
        bb.emit_func_output(c4)
    return bb.get()
