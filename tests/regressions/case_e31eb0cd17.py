"""Fuzzer regression (crash, strategy 'contiguity', ops: add, expand_dims, pad, relu).

Found by tests/fuzz.py:
    [crash] strategy='contiguity' stage=compile/run: InternalError: Check failed: (CanProveDivisible(info.padding_factor, divisor)) is false: The padding factor T.int64(2) * (n + T.int64(2)) * (n + T.int64(2)) * T.int64(2) is not divisible by T.int64(2) * (n + T.int64(2)) * T.int64(2) for the split sym.IterSplitExpr(span=None, ty=T.int64, source=sym.IterMark(source=fused, extent=T.int64(2) * (n + T.int64(2)) * T.int64(2) * T.int64(2)), lower_factor=T.int64(1), extent=T.int64(2) * (n + T.int64(2)) * T.int64(2) * T.int64(2), scale=T.int64(1)) Error in pass: RewriteDataflowReshape Location (TVMScript): Access path: <root>.functions[I.GlobalVar("expand_dims")].body.predicate.ty Note: The underlined object is the nearest visible parent of this path. (... 9 lines skipped ...) @T.prim_func(private=True, s_tir=True) def add_vtc(lv_src0: T.Buffer((T.int64(2), T.int64(2), "n", T.int64(2)), "float32"), lv_src0_1: T.Buffer((T.int64(2), T.int64(2), n, T.int64(2)), "float32"), n: T.int64, T_add: T.Buffer((T.int64(2), T.int64(2), n + T.int64(2), T.int64(2)), "float32")): T.func_attr({"op_pattern": 8, "tirx.noalias": True, "vtc.virtual_inputs": {"lv": [T.index_map(lambda v0, v1, v2, v3: (v0, v1, v2, v3))]}}) # with T.sblock("root"): for ax0, ax1, ax2, ax3 in T.grid(T.int64(2), T.int64(2), n + T.int64(2), T.int64(2)): with T.sblock("T_add"): v_ax0, v_ax1, v_ax2, v_ax3 = T.axis.remap("SSSS", [ax0, ax1, ax2, ax3]) T.reads(lv_src0[v_ax0, v_ax1, T.max(T.min(v_ax2, n - T.int64(1)), T.int64(0)), ...

    (the rewritten relu is opaque (op pattern 8), so expand_dims is no longer fused into it and
    becomes a standalone PrimFunc whose input dim is n + 2; stock TVM's RewriteDataflowReshape
    ICHECK-fails on such a reshape-like PrimFunc -- a TVM bug (stock pad -> take ->
    expand_dims hits it too) that vtc's output exposes)

Run: pytest tests/test_fuzz.py -k case_e31eb0cd17   (tests/test_fuzz.py runs every saved case)
"""

import tvm  # noqa: F401 - symbolic sizes are tvm.tirx.Var
from tvm import relax

INPUTS = [  # name, shape, dtype, index range [low, high) per last-axis slot (strings: expressions of the symbolic sizes)
    ('x1', (2, 2, 'n', 2), 'float32', None, None),
]
DATA_SEED = 0
SIZES = [{'n': 1}, {'n': 2}]  # run once per entry (one compiled module)


def build():
    bb = relax.BlockBuilder()
    n = tvm.tirx.Var('n', 'int64')
    x1 = relax.Var('x1', relax.TensorType((2, 2, n, 2), 'float32'))
    with bb.function("main", [x1]):
        with bb.dataflow():
            m3 = bb.emit(relax.op.nn.pad(x1, [0, 0, 0, 0, 0, 2, 0, 0]))
            c4 = bb.emit(relax.op.add(m3, m3))
            c5 = bb.emit(relax.op.nn.relu(m3))
            m6 = bb.emit(relax.op.expand_dims(c5, axis=-5))
            out = bb.emit_output(relax.Tuple([c4, m6]))
        bb.emit_func_output(out)
    return bb.get()
