"""Fuzzer regression (worse, strategy 'contiguity', ops: add, expand_dims, permute_dims, relu).

Found by tests/fuzz.py:
    [worse] strategy='contiguity' stage=census: 2 kernels launched, stock 1

Run: pytest tests/test_fuzz.py -k case_156724c08c   (tests/test_fuzz.py runs every saved case)
"""

import tvm  # noqa: F401 - symbolic sizes are tvm.tirx.Var
from tvm import relax

INPUTS = [  # name, shape, dtype, index range [low, high) per last-axis slot (strings: expressions of the symbolic sizes)
    ('x4', (8, 'n', 'n', 8), 'float32', None, None),
]
DATA_SEED = 0
SIZES = [{'n': 1}, {'n': 6}]  # run once per entry (one compiled module)
TARGET = 'cuda'  # built, not run: see tests/fuzz.py's build_differential


def build():
    bb = relax.BlockBuilder()
    n = tvm.tirx.Var('n', 'int64')
    x4 = relax.Var('x4', relax.TensorType((8, n, n, 8), 'float32'))
    with bb.function("main", [x4]):
        with bb.dataflow():
            m6 = bb.emit(relax.op.expand_dims(x4, axis=0))
            m9 = bb.emit(relax.op.permute_dims(m6, axes=[3, 1, 2, 0, 4]))
            c10 = bb.emit(relax.op.add(m9, m9))
            m11 = bb.emit(relax.op.permute_dims(c10, axes=[0, 1, 2, 3, 4]))
            out = bb.emit_output(m11)
        bb.emit_func_output(out)
    return bb.get()
