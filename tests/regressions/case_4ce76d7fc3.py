"""Fuzzer regression (mismatch, strategy 'contiguity', ops: softmax, strided_slice).

Found by tests/fuzz.py:
    [mismatch] strategy='contiguity' stage=compare: output 0 float32(1, 2): 2/2 elements differ; first at (0, 0): got np.float32(0.31355312), expected np.float32(0.5246132)

Run: pytest tests/test_fuzz.py -k case_4ce76d7fc3   (tests/test_fuzz.py runs every saved case)
"""

import tvm  # noqa: F401 - symbolic sizes are tvm.tirx.Var
from tvm import relax

INPUTS = [  # name, shape, dtype, index range [low, high) per last-axis slot
    ('x1', (3, 2), 'float32', None, None),
]
DATA_SEED = 0


def build():
    bb = relax.BlockBuilder()
    x1 = relax.Var('x1', relax.TensorType((3, 2), 'float32'))
    with bb.function("main", [x1]):
        with bb.dataflow():
            c2 = bb.emit(relax.op.nn.softmax(x1, axis=-2))
            m3 = bb.emit(relax.op.strided_slice(c2, axes=[-2], begin=[1], end=[9223372036854775807], strides=[2]))
            m4 = bb.emit(relax.op.strided_slice(c2, axes=[-2], begin=[0], end=[1], strides=[2]))
            out = bb.emit_output(relax.Tuple([m3, m4]))
        bb.emit_func_output(out)
    return bb.get()
