"""Fuzzer regression (crash, strategy 'contiguity', ops: nn.pad, strided_slice, argmax).

Found by tests/fuzz.py (long campaign, seed 202):
    [crash] strategy='contiguity' stage=VirtualTensorize: InternalError: TIR is ill-formed: buffer gv1
    is used at <root>...block.reads[0].source without a prior DeclBuffer or other declaration.
    (the slice selects only padding, so every load of the consumer became a constant and its
    read region still named the removed parameter)

Run: pytest tests/test_fuzz.py -k case_padslice0   (tests/test_fuzz.py runs every saved case)
"""

from tvm import relax

INPUTS = [  # name, shape, dtype, index range [low, high) per last-axis slot
    ('x1', (1, 1, 1), 'float32', None, None),
]
DATA_SEED = 0


def build():
    bb = relax.BlockBuilder()
    x1 = relax.Var('x1', relax.TensorType((1, 1, 1), 'float32'))
    with bb.function("main", [x1]):
        m2 = bb.emit(relax.op.nn.pad(x1, [0, 0, 0, 1, 0, 0]))
        m3 = bb.emit(relax.op.strided_slice(m2, axes=[-2], begin=[1], end=[9223372036854775807], strides=[2]))
        c5 = bb.emit(relax.op.argmax(m3, axis=-3))
        bb.emit_func_output(c5)
    return bb.get()
