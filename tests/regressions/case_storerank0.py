"""Fuzzer regression (crash, strategy 'contiguity', ops: gather_nd, permute_dims, reshape, tuple).

Found by tests/fuzz.py (seed 505, the first campaign that compiled vtc with the store side):
    [crash] strategy='contiguity' stage=compile/run: RuntimeError: the store index does not match
    the destination's rank (VirtualTensorizeStores)

A reshape of a 0-d gather result to shape (1,) looked like a one-input concat with no offsets,
so the store side redirected the gather's store into it and the rank check fired inside a
structural map, as a RuntimeError. Such a reshape is not a slice of its output any more, and the
rank is checked before the rewrite.

Run: pytest tests/test_fuzz.py -k case_storerank0   (tests/test_fuzz.py runs every saved case)
"""

from tvm import relax

INPUTS = [  # name, shape, dtype, index range [low, high) per last-axis slot
    ('x1', (1,), 'float32', None, None),
    ('i6', (1,), 'int64', (0,), (1,)),
]
DATA_SEED = 0


def build():
    bb = relax.BlockBuilder()
    x1 = relax.Var('x1', relax.TensorType((1,), 'float32'))
    i6 = relax.Var('i6', relax.TensorType((1,), 'int64'))
    with bb.function("main", [x1, i6]):
        with bb.dataflow():
            m2 = bb.emit(relax.op.permute_dims(x1, axes=[0]))
            m4 = bb.emit(relax.op.permute_dims(m2, axes=[0]))
            m7 = bb.emit(relax.op.gather_nd(m4, i6, batch_dims=0))
            m8 = bb.emit(relax.op.reshape(m7, [1]))
            out = bb.emit_output(relax.Tuple([m4, m8]))
        bb.emit_func_output(out)
    return bb.get()
