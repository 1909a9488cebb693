"""Fuzzer regression (crash, strategy 'contiguity', ops: add, permute_dims, reshape, strided_slice).

Found by tests/fuzz.py:
    [crash] strategy='contiguity' stage=check_well_formed: transformed module is not well formed

    (the add's PrimFunc is re-legalized by vtc from shapes min(I64, n) and
    min(I64, n) - min(0, n), equal for n >= 0 but not provably so there: its output buffer is
    max(...) of both, while the call_tir keeps the binding's type as out_ty -> FValidate of
    call_tir fails; the module still runs correctly)

Run: pytest tests/test_fuzz.py -k case_c4bd77d211   (tests/test_fuzz.py runs every saved case)
"""

import tvm  # noqa: F401 - symbolic sizes are tvm.tirx.Var
from tvm import relax

INPUTS = [  # name, shape, dtype, index range [low, high) per last-axis slot (strings: expressions of the symbolic sizes)
    ('x1', ('n', 1, 1, 1), 'float32', None, None),
    ('x6', ('tvm.tirx.min(9223372036854775807, n) - tvm.tirx.min(0, n)', 1, 1, 1), 'float32', None, None),
]
DATA_SEED = 0
SIZES = [{'n': 1}, {'n': 2}, {'n': 7}]  # run once per entry (one compiled module)


def build():
    bb = relax.BlockBuilder()
    n = tvm.tirx.Var('n', 'int64')
    x1 = relax.Var('x1', relax.TensorType((n, 1, 1, 1), 'float32'))
    x6 = relax.Var('x6', relax.TensorType((tvm.tirx.min(9223372036854775807, n) - tvm.tirx.min(0, n), 1, 1, 1), 'float32'))
    with bb.function("main", [x1, x6]):
        m5 = bb.emit(relax.op.strided_slice(x1, axes=[0], begin=[0], end=[9223372036854775807]))
        c7 = bb.emit(relax.op.add(m5, x6))
        bb.emit_func_output(c7)
    return bb.get()
