"""Fuzzer regression (CUDA build, strategy 'contiguity', ops: add, permute_dims).

Found by tests/fuzz.py --target cuda (seed 917) as "6 CUDA kernels, stock's build has 4": a false
alarm of that mode's first version, which counted the distinct kernels in the CUDA source. Stock
launches 4 (add and three launches of one shared transpose kernel), vtc-tvm 3 (add, transpose and
one copy for the composed transpose pair): the check now counts launches (kernel_census). Kept as
a non-dataflow function (FuseOps fuses nothing there) with a function output read through a chain.

Run: pytest tests/test_fuzz.py -k case_faf22a7f91   (tests/test_fuzz.py runs every saved case)
"""

import tvm  # noqa: F401 - symbolic sizes are tvm.tirx.Var
from tvm import relax

INPUTS = [  # name, shape, dtype, index range [low, high) per last-axis slot
    ('x1', (4,), 'float32', None, None),
]
DATA_SEED = 0
TARGET = 'cuda'  # built, not run: see tests/fuzz.py's build_differential


def build():
    bb = relax.BlockBuilder()
    x1 = relax.Var('x1', relax.TensorType((4,), 'float32'))
    with bb.function("main", [x1]):
        c3 = bb.emit(relax.op.add(x1, x1))
        m4 = bb.emit(relax.op.permute_dims(c3, axes=[0]))
        m5 = bb.emit(relax.op.permute_dims(c3, axes=[0]))
        m6 = bb.emit(relax.op.permute_dims(m5, axes=[0]))
        bb.emit_func_output(relax.Tuple([m4, m6]))
    return bb.get()
