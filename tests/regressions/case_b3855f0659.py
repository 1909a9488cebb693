"""Fuzzer regression (crash, strategy 'contiguity', ops: expand_dims, flatten, flip, matmul, pad, permute_dims, stack, strided_slice).

Found by tests/fuzz.py:
    [crash] strategy='contiguity' stage=cuda build: InternalError: Check failed: (dim_imm) is false: Can only handle constant size stack allocation for now

Run: pytest tests/test_fuzz.py -k case_b3855f0659   (tests/test_fuzz.py runs every saved case)
"""

import tvm  # noqa: F401 - symbolic sizes are tvm.tirx.Var
from tvm import relax

INPUTS = [  # name, shape, dtype, index range [low, high) per last-axis slot (strings: expressions of the symbolic sizes)
    ('x2', ('n', 6, 5, 8), 'float32', None, None),
    ('w11', (5, 4), 'float32', None, None),
]
DATA_SEED = 5
SIZES = [{'n': 1}, {'n': 4}]  # run once per entry (one compiled module)
TARGET = 'cuda'  # built, not run: see tests/fuzz.py's build_differential


def build():
    bb = relax.BlockBuilder()
    n = tvm.tirx.Var('n', 'int64')
    x2 = relax.Var('x2', relax.TensorType((n, 6, 5, 8), 'float32'))
    w11 = relax.Var('w11', relax.TensorType((5, 4), 'float32'))
    with bb.function("main", [x2, w11]):
        with bb.dataflow():
            m3 = bb.emit(relax.op.permute_dims(x2))
            m5 = bb.emit(relax.op.permute_dims(m3))
            m10 = bb.emit(relax.op.strided_slice(m5, axes=[2, 1, 0], begin=[0, 4, 0], end=[4, 0, 1], strides=[1, -1, 1]))
            c12 = bb.emit(relax.op.matmul(w11, m10))
            out = bb.emit_output(c12)
        bb.emit_func_output(out)
    return bb.get()
