"""Fuzzer regression (crash, strategy 'contiguity', ops: reshape, split).

Found by tests/fuzz.py:
    [crash] strategy='contiguity' stage=VirtualTensorize: TypeError: Mismatched type on argument #2 when calling: `relax.op.call_tir(0: ir.Expr, 1: ir.Tuple, 2: Array<relax.TensorType>) -> ir.Expr`. Expected `Array<relax.TensorType>` but got `Array[index 0: ir.TupleType]`

    (a split of a symbolic axis stays physical, so it becomes a *consumer* of the virtual
    reshape; the rewritten consumer is a multi-output call_tir and transform.py passes its
    TupleType as ``out_ty``)

Run: pytest tests/test_fuzz.py -k case_b8be389619   (tests/test_fuzz.py runs every saved case)
"""

import tvm  # noqa: F401 - symbolic sizes are tvm.tirx.Var
from tvm import relax

INPUTS = [  # name, shape, dtype, index range [low, high) per last-axis slot (strings: expressions of the symbolic sizes)
    ('x1', ('n', 1, 1, 2), 'float32', None, None),
]
DATA_SEED = 0
SIZES = [{'n': 1}, {'n': 2}]  # run once per entry (one compiled module)


def build():
    bb = relax.BlockBuilder()
    n = tvm.tirx.Var('n', 'int64')
    x1 = relax.Var('x1', relax.TensorType((n, 1, 1, 2), 'float32'))
    with bb.function("main", [x1]):
        m2 = bb.emit(relax.op.reshape(x1, [-1]))
        t3 = bb.emit(relax.op.split(m2, 2, axis=-1))
        m4 = bb.emit(relax.TupleGetItem(t3, 0))
        bb.emit_func_output(m4)
    return bb.get()
