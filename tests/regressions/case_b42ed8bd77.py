"""Fuzzer regression (crash, strategy 'contiguity', ops: argmax, expand_dims, permute_dims).

Found by tests/fuzz.py:
    [crash] strategy='contiguity' stage=cuda build: InternalError: Check failed: scope != "global" (global vs. global) : Cannot allocate global memory when targeting CUDA. You must pass all global arrays as input instead

Two faults: the reshape rule read expand_dims's source through a flat index, leaving divisions by
``6 * n`` the analyzer cannot simplify (a "window" read to WindowReduction), and WindowReduction
moved only the first of argmax's two reduction outputs to registers, leaving the other in global
memory inside the kernel. Fixed: reshapes read group by group (``vtc_tvm.rules.reshape_groups``),
WindowReduction takes one-output reductions only, and every rule of the "vtc" pipeline is guarded
by ``vtc_tvm.scratch.check_scratch`` (a schedule with a global intermediate inside the kernel
passes the kernel to the next rule).

Run: pytest tests/test_fuzz.py -k case_b42ed8bd77   (tests/test_fuzz.py runs every saved case)
"""

import tvm  # noqa: F401 - symbolic sizes are tvm.tirx.Var
from tvm import relax

INPUTS = [  # name, shape, dtype, index range [low, high) per last-axis slot (strings: expressions of the symbolic sizes)
    ('x2', (4, 6, 'n'), 'float32', None, None),
]
DATA_SEED = 0
SIZES = [{'n': 1}, {'n': 4}]  # run once per entry (one compiled module)
TARGET = 'cuda'  # built, not run: see tests/fuzz.py's build_differential


def build():
    bb = relax.BlockBuilder()
    n = tvm.tirx.Var('n', 'int64')
    x2 = relax.Var('x2', relax.TensorType((4, 6, n), 'float32'))
    with bb.function("main", [x2]):
        m3 = bb.emit(relax.op.expand_dims(x2, axis=-1))
        m5 = bb.emit(relax.op.permute_dims(m3, axes=[0, 1, 2, 3]))
        c7 = bb.emit(relax.op.argmax(m5, axis=0))
        bb.emit_func_output(c7)
    return bb.get()
