"""Fuzzer regression (crash, strategy 'contiguity', ops: pad, permute_dims, strided_slice).

Found by tests/fuzz.py:
    [crash] strategy='contiguity' stage=VirtualTensorize: TypeError: Check failed: (a_ty->dtype == b_ty->dtype) is false: mismatched types. int64 vs. int32

Run: pytest tests/test_fuzz.py -k case_799027244e   (tests/test_fuzz.py runs every saved case)
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
        m4 = bb.emit(relax.op.nn.pad(x1, [1, 1]))
        m5 = bb.emit(relax.op.permute_dims(m4, axes=[0]))
        m6 = bb.emit(relax.op.permute_dims(m5, axes=[0]))
        m7 = bb.emit(relax.op.permute_dims(m6, axes=[0]))
        m8 = bb.emit(relax.op.permute_dims(m7, axes=[0]))
        m9 = bb.emit(relax.op.permute_dims(m8, axes=[0]))
        m10 = bb.emit(relax.op.strided_slice(m9, axes=[0], begin=[0], end=[1]))
        bb.emit_func_output(m10)
    return bb.get()
