"""Fuzzer regression (crash, strategy 'contiguity', ops: flatten).

Found by tests/fuzz.py (CUDA, seed 919, reduced by hand to the binding that crashed):
    [crash] strategy='contiguity' stage=cuda build: nvcc: too many arguments in function call
The materialised flatten of a (4, 4, 8, 5) tensor is contiguous in memory, so the copy schedule
vectorised it 8 lanes wide; its source indices (``j // 5 % 8, j % 5``) are no ramps over 8
lanes and TVM's CUDA code generator printed their int32x8 arithmetic as invalid CUDA.

Run: pytest tests/test_fuzz.py -k case_b4e1c0f1a7   (tests/test_fuzz.py runs every saved case)
"""

import tvm  # noqa: F401 - symbolic sizes are tvm.tirx.Var
from tvm import relax

INPUTS = [  # name, shape, dtype, index range [low, high) per last-axis slot
    ('x1', (4, 4, 8, 5), 'float16', None, None),
]
DATA_SEED = 1522
TARGET = 'cuda'  # built, not run: see tests/fuzz.py's build_differential


def build():
    bb = relax.BlockBuilder()
    x1 = relax.Var('x1', relax.TensorType((4, 4, 8, 5), 'float16'))
    with bb.function("main", [x1]):
        with bb.dataflow():
            m7 = bb.emit(relax.op.flatten(x1))
            out = bb.emit_output(m7)
        bb.emit_func_output(out)
    return bb.get()
