"""Fuzzer regression (worse, strategy 'contiguity', ops: add, broadcast_to, expand_dims, permute_dims).

Found by tests/fuzz.py:
    [worse] strategy='contiguity' stage=census: 2 kernels launched, stock 1

Run: pytest tests/test_fuzz.py -k case_43ef0e0e36   (tests/test_fuzz.py runs every saved case)
"""

import tvm  # noqa: F401 - symbolic sizes are tvm.tirx.Var
from tvm import relax

INPUTS = [  # name, shape, dtype, index range [low, high) per last-axis slot (strings: expressions of the symbolic sizes)
    ('x1', (2, 'n'), 'float32', None, None),
]
DATA_SEED = 0
SIZES = [{'n': 1}, {'n': 4}]  # run once per entry (one compiled module)
TARGET = 'cuda'  # built, not run: see tests/fuzz.py's build_differential


def build():
    bb = relax.BlockBuilder()
    n = tvm.tirx.Var('n', 'int64')
    x1 = relax.Var('x1', relax.TensorType((2, n), 'float32'))
    with bb.function("main", [x1]):
        with bb.dataflow():
            c3 = bb.emit(relax.op.add(x1, x1))
            m4 = bb.emit(relax.op.expand_dims(c3, axis=[-4, -3]))
            m5 = bb.emit(relax.op.broadcast_to(m4, [1, 4, 1, 2, n]))
            out = bb.emit_output(m5)
        bb.emit_func_output(out)
    return bb.get()
