"""The WMMA intrinsics of TensorCoreGEMM, registered without importing TVM's tensor_intrin package."""

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# In a fresh process: the five intrinsics (both weight layouts) are registered from TVM's generators
# without importing tvm.s_tir.tensor_intrin; then that module imports (its own names do not clash
# with ours), its generators give structurally equal intrinsics, and a source without the
# generators (or a generator failing when called) falls back to the module's own functions.
CHECK = textwrap.dedent("""
    import sys
    import tvm
    import tvm_ffi
    from tvm.s_tir import TensorIntrin
    from vtc_tvm.schedules import tensor_core_gemm, wmma

    names = {**tensor_core_gemm._intrinsics(True), **{k + "_t": v for k, v in tensor_core_gemm._intrinsics(False).items()}}
    assert "tvm.s_tir.tensor_intrin" not in sys.modules, "tensor_intrin was imported"
    assert "tvm.s_tir.tensor_intrin.cuda" not in sys.modules
    assert len(set(names.values())) == 7 and all(n.startswith("vtc_wmma_") for n in names.values()), names

    from tvm.s_tir.tensor_intrin import cuda as tc
    calls = {
        "load_a": ("get_wmma_load_intrin", 16, 16, 16, "float16", "shared.dyn", False, False),
        "load_b": ("get_wmma_load_intrin", 16, 16, 16, "float16", "global", True, False),
        "load_b_t": ("get_wmma_load_intrin", 16, 16, 16, "float16", "global", True, True),
        "store": ("get_wmma_store_intrin", 16, 16, 16, "float32", "global"),
        "init": ("get_wmma_fill_intrin", 16, 16, 16, "float32"),
        "compute": ("get_wmma_sync_intrin", 16, 16, 16, "float16", "float32", False),
        "compute_t": ("get_wmma_sync_intrin", 16, 16, 16, "float16", "float32", True),
    }
    for key, (gen, *args) in calls.items():
        ours = TensorIntrin.get(names[key])
        desc, impl = getattr(tc, gen)(*args)
        assert tvm_ffi.structural_equal(ours.desc, desc) and tvm_ffi.structural_equal(ours.impl, impl), key
    # TVM's own registrations of the same intrinsics are there too, under TVM's names
    assert tvm_ffi.structural_equal(TensorIntrin.get(tc.WMMA_SYNC_16x16x16_f16f16f32_INTRIN).desc,
                                   TensorIntrin.get(names["compute"]).desc)
    fallback = wmma.generators("/nonexistent/tensor_intrin/cuda.py")
    assert all(fallback[g] is getattr(tc, g) for g in wmma._GENERATORS)
    # a generator failing when called (it needs more of its module): the module's own is used
    wmma.generators = lambda path=None: {g: (lambda *args: 1 / 0) for g in wmma._GENERATORS}
    name = wmma.intrinsic("fill_fallback", "get_wmma_fill_intrin", 16, 16, 16, "float32")
    assert tvm_ffi.structural_equal(TensorIntrin.get(name).desc, tc.get_wmma_fill_intrin(16, 16, 16, "float32")[0])
    print("ok")
""")


def test_wmma_intrinsics_without_importing_tensor_intrin():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout[-2000:] + out.stderr[-4000:]
