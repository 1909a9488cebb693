"""Fuzzer regression (crash, strategy 'contiguity', ops: flip, permute_dims, tile).

Found by tests/fuzz.py:
    [crash] strategy='contiguity' stage=compile/run: InternalError: Check failed: (allow_override) is false: Binding of variable rmod as I.Range(T.int64(0), T.int64(1)) conflicts with previous binding as ir.Range(0x7fc5b0b2c7e0)

Run: pytest tests/test_fuzz.py -k case_5e6f7941a7   (tests/test_fuzz.py runs every saved case)
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
        m2 = bb.emit(relax.op.permute_dims(x1, axes=[0]))
        m3 = bb.emit(relax.op.tile(m2, 1))
        m4 = bb.emit(relax.op.flip(m3, axis=-1))
        bb.emit_func_output(m4)
    return bb.get()
