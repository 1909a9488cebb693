"""Fuzzer regression (crash, strategy 'contiguity', ops: permute_dims, sort).

Found by tests/fuzz.py:
    [crash] strategy='contiguity' stage=compile/run: InternalError: Check failed: (it != flat_map_.end()) is false: Buffer out_buf is used before its definition (AllocBuffer/DeclBuffer/PrimFunc param) Error in pass: _pipeline Location (TVMScript): Access path: <root>.functions[I.GlobalVar("sort_into_gv")].body.block.body.value.ty Note: The underlined object is the nearest visible parent of this path. (... 3 lines skipped ...) @I.ir_module class Module: @T.prim_func(s_tir=True) def sort_into_gv(data_buf: T.Buffer((T.int64(1),), "float32", align=8), gv: T.Buffer((T.int64(1),), "float32")): T.func_attr({"op_pattern": 8, "target": T.target({"host": {"keys": ["cpu"], "kind": "llvm", "mtriple": "x86_64-conda-linux-gnu", "tag": ""}, "keys": ["cpu"], "kind": "llvm", "mtriple": "x86_64-conda-linux-gnu", "tag": ""}), "tirx.noalias": True}) with T.sblock("sort_cpu"): T.reads() T.writes() out_buf = T.Buffer((T.int64(1),), align=8) T.call_packed("tvm.contrib.sort.sort", T.tvm_stack_make_array(data_buf.data, T.tvm_stack_make_shape(T.int64(1)), 0, 1, T.float32(0.0), T.int64(0)), T.tvm_stack_make_array(out_buf.data, T.tvm_stack_make_shape(T.int64(1)), 0, 1, T.float32(0.0), T.int64(0)), -1, T.bool(True)) ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^

The store side redirected TVM's CPU sort (a packed call that writes ``out.data`` from C++) into
the identity permute's output; only producers that write their output through buffer stores in
blocks are redirected now (``stores._stores_its_output``).

Run: pytest tests/test_fuzz.py -k case_f4b68aa16a   (tests/test_fuzz.py runs every saved case)
"""

import tvm  # noqa: F401 - symbolic sizes are tvm.tirx.Var
from tvm import relax

INPUTS = [  # name, shape, dtype, index range [low, high) per last-axis slot
    ('x1', (1,), 'float32', None, None),
]
DATA_SEED = 0


def build():
    bb = relax.BlockBuilder()
    x1 = relax.Var('x1', relax.TensorType((1,), 'float32'))
    with bb.function("main", [x1]):
        with bb.dataflow():
            c2 = bb.emit(relax.op.sort(x1, axis=-1))
            m3 = bb.emit(relax.op.permute_dims(c2, axes=[0]))
            out = bb.emit_output(m3)
        bb.emit_func_output(out)
    return bb.get()
