"""Fuzzer regression (crash, strategy 'contiguity', ops: pad, permute_dims, strided_slice, take).

Found by tests/fuzz.py:
    [crash] strategy='contiguity' stage=compile/run: ValueError: Check failed: (small.has_value() && (bits == 64 || (*small >= -(int64_t{1} << (bits - 1)) && *small < (int64_t{1} << (bits - 1))))) is false: Literal value 36893488147419103224 exceeds range of int64

Run: pytest tests/test_fuzz.py -k case_b627b06f22   (tests/test_fuzz.py runs every saved case)
"""

import tvm  # noqa: F401 - symbolic sizes are tvm.tirx.Var
from tvm import relax

INPUTS = [  # name, shape, dtype, index range [low, high) per last-axis slot (strings: expressions of the symbolic sizes)
    ('x3', (1, 'n', 1), 'float32', None, None),
]
DATA_SEED = 0
SIZES = [{'n': 1}, {'n': 2}]  # run once per entry (one compiled module)


def build():
    bb = relax.BlockBuilder()
    n = tvm.tirx.Var('n', 'int64')
    x3 = relax.Var('x3', relax.TensorType((1, n, 1), 'float32'))
    with bb.function("main", [x3]):
        m4 = bb.emit(relax.op.nn.pad(x3, [0, 0, 0, 0, 0, 0]))
        m8 = bb.emit(relax.op.nn.pad(m4, [0, 0, 0, 2, 0, 0]))
        m10 = bb.emit(relax.op.strided_slice(m8, axes=[0, 2, 1], begin=[0, 0, -1], end=[9223372036854775807, -9223372036854775808, 9223372036854775807], strides=[1, -2, 1]))
        bb.emit_func_output(m10)
    return bb.get()
