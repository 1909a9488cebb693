"""Model-fuzz regression (crash, both strategies, ops: split, take, relu, concat).

Found by tests/model_fuzz.py (seeds 100398 and 100449: ShuffleNetV2 blocks, a gather sandwich
inserted after a split half that is concatenated with the other half's relu; the graph fuzzer's
5454 graphs of seed 909 had not drawn it). The store side made the relu store into the concat
and left the gathered half as one copy kernel, built from its piece of the copy: that piece reads
the take's index tensors (``src[idx2[idx1[u]]]``) but the kernel took only its data source, and
TIR's FlattenBuffer failed: "Buffer src1 is used before its definition". The leftover copy now
takes the index tensors its piece reads (``vtc_tvm.stores._StoreRewriter._emit_rest``).

Run: pytest tests/test_fuzz.py -k case_storegather   (tests/test_fuzz.py runs every saved case)
"""

import numpy as np
from tvm import relax

INPUTS = [  # name, shape, dtype, index range [low, high) per last-axis slot
    ('x1', (2, 16, 4, 4), 'float32', None, None),
]
DATA_SEED = 100449
PERM = np.array([2, 4, 3, 6, 5, 0, 1, 7], dtype="int64")


def build():
    bb = relax.BlockBuilder()
    x1 = relax.Var('x1', relax.TensorType((2, 16, 4, 4), 'float32'))
    with bb.function("main", [x1]):
        with bb.dataflow():
            parts = bb.emit(relax.op.split(x1, [8], axis=1))
            a = bb.emit(relax.TupleGetItem(parts, 0))
            b = bb.emit(relax.TupleGetItem(parts, 1))
            g = bb.emit(relax.op.take(a, relax.const(PERM), axis=1))
            g = bb.emit(relax.op.take(g, relax.const(np.argsort(PERM)), axis=1))
            r = bb.emit(relax.op.nn.relu(b))
            out = bb.emit_output(relax.op.concat([g, r], axis=1))
        bb.emit_func_output(out)
    return bb.get()
