"""Fuzzer regression (crash, strategy 'contiguity', ops: flip, relu, repeat, sum, take).

Found by tests/fuzz.py:
    [crash] strategy='contiguity' stage=cuda build: ValueError: Check failed: n_deepest_reduction_loops == reduction_loops.size() (0 vs. 1) : Cross-thread reduction requires all the reduction-related loops to be the deepest among all statements outside the desired block. However, block lv4_red needs cross-thread reduction, while the reduction-related loops outside of it are not the deepest statements, which violates the condition. Error in pass: _pipeline Location (TVMScript): Access path: <root>.functions[I.GlobalVar("sum_vtc")].body.predicate.ty Note: The underlined object is the nearest visible parent of this path. (... 10 lines skipped ...) for ax0_ax1_ax2_fused_0 in T.thread_binding(T.int64(1), thread="blockIdx.x"): for ax0_ax1_ax2_fused_1 in T.thread_binding(T.int64(1024), thread="threadIdx.x"): with T.sblock("compute"): v0 = T.axis.spatial(T.int64(21), (ax0_ax1_ax2_fused_0 * T.int64(1024) + ax0_ax1_ax2_fused_1) // T.int64(12)) v1 = T.axis.spatial(T.int64(6), (ax0_ax1_ax2_fused_0 * T.int64(1024) + ax0_ax1_ax2_fused_1) % T.int64(12) // T.int64(2)) v2 = T.axis.spatial(T.int64(2), (ax0_ax1_ax2_fused_0 * T.int64(1024) + ax0_ax1_ax2_fused_1) % T.int64(2)) T.where(ax0_ax1_ax2_fused_0 * T.int64(1024) + ax0_ax1_ax2_fused_1 < T.int64(252)) T.reads(lv_src0[v0 // T.int64(3), v1, v2]) T.writes(compute[v0, v1, v2]) compute[v0, v1, v2] = T.max(lv_src0[v0 // T.int64(3), v1, v2], T.float32(0.0)) @T.prim_func(s_tir=True) ^^^^^^^^^^^^^^^^^^^^^^^^ def sum_vtc(lv4_src0: ...

Run: pytest tests/test_fuzz.py -k case_4d66e154a7   (tests/test_fuzz.py runs every saved case)
"""

import tvm  # noqa: F401 - symbolic sizes are tvm.tirx.Var
from tvm import relax

INPUTS = [  # name, shape, dtype, index range [low, high) per last-axis slot
    ('x1', (7, 6, 2), 'float32', None, None),
]
DATA_SEED = 0
TARGET = 'cuda'  # built, not run: see tests/fuzz.py's build_differential


def build():
    bb = relax.BlockBuilder()
    x1 = relax.Var('x1', relax.TensorType((7, 6, 2), 'float32'))
    with bb.function("main", [x1]):
        m2 = bb.emit(relax.op.repeat(x1, 3, axis=0))
        c6 = bb.emit(relax.op.nn.relu(m2))
        m7 = bb.emit(relax.op.repeat(c6, 3, axis=-3))
        m8 = bb.emit(relax.op.flip(m7, axis=-3))
        c9 = bb.emit(relax.op.sum(m7, axis=[-1], keepdims=True))
        bb.emit_func_output(relax.Tuple([m8, c9]))
    return bb.get()
