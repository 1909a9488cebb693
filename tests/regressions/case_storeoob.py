"""Fuzzer regression (heap corruption, strategy 'contiguity', ops: expand_dims, nn.pad, permute_dims, softmax, strided_slice, take).

Found by tests/fuzz.py (seed 707; seed 606 died the same way): the process aborted with
"corrupted size vs. prev_size". The store side took the strided slice of the softmax (a function
output, one piece reading its source at v + offset) for a concat input and redirected the softmax
into it: the softmax wrote its whole output at negative offsets, out of the slice's bounds. A
source must now lie wholly inside the destination (``vtc_tvm.inverse``: a slice is not one-to-one).

Run: pytest tests/test_fuzz.py -k case_storeoob   (tests/test_fuzz.py runs every saved case)
"""

from tvm import relax

INPUTS = [  # name, shape, dtype, index range [low, high) per last-axis slot
    ('x1', (1, 6), 'float32', None, None),
    ('x2', (4, 2, 5, 7), 'float32', None, None),
    ('x3', (8, 5), 'float32', None, None),
    ('i5', (3, 3), 'int32', (-12,), (12,)),
]
DATA_SEED = 2182


def build():
    bb = relax.BlockBuilder()
    x1 = relax.Var('x1', relax.TensorType((1, 6), 'float32'))
    x2 = relax.Var('x2', relax.TensorType((4, 2, 5, 7), 'float32'))
    x3 = relax.Var('x3', relax.TensorType((8, 5), 'float32'))
    i5 = relax.Var('i5', relax.TensorType((3, 3), 'int32'))
    with bb.function("main", [x1, x2, x3, i5]):
        with bb.dataflow():
            m4 = bb.emit(relax.op.expand_dims(x2, axis=[-4, -1]))
            m6 = bb.emit(relax.op.permute_dims(i5, axes=[1, 0]))
            m7 = bb.emit(relax.op.take(x1, m6, axis=1, mode='wrap'))
            c8 = bb.emit(relax.op.nn.softmax(m4, axis=-6))
            m9 = bb.emit(relax.op.permute_dims(m4, axes=[1, 0, 5, 3, 4, 2]))
            m10 = bb.emit(relax.op.strided_slice(c8, axes=[4, 0, -1, 2], begin=[-1, 2147483647, -9223372036854775808, 9223372036854775807], end=[8, 2, 2, -9223372036854775808], strides=[1, -1, 3, -2]))
            m11 = bb.emit(relax.op.nn.pad(m7, [2, 1, 1, 2, 2, 2]))
            out = bb.emit_output(relax.Tuple([m9, m10, m11]))
        bb.emit_func_output(out)
    return bb.get()
