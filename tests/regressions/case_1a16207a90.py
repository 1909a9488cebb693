"""Fuzzer regression (crash, strategy 'contiguity', ops: add, pad).

Found by tests/fuzz.py:
    [crash] strategy='contiguity' stage=VirtualTensorize: ValueError: Any must take at least 1 argument

Run: pytest tests/test_fuzz.py -k case_1a16207a90   (tests/test_fuzz.py runs every saved case)
"""

from tvm import relax

INPUTS = [  # name, shape, dtype, index range [low, high) per last-axis slot
    ('x1', (), 'float32', None, None),
]
DATA_SEED = 0


def build():
    bb = relax.BlockBuilder()
    x1 = relax.Var('x1', relax.TensorType((), 'float32'))
    with bb.function("main", [x1]):
        with bb.dataflow():
            m1 = bb.emit(relax.op.nn.pad(x1, []))
            c2 = bb.emit(relax.op.add(m1, m1))
            out = bb.emit_output(c2)
        bb.emit_func_output(out)
    return bb.get()
