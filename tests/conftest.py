"""Shared helpers for the core acceptance tests: build, run, and inspect small Relax modules."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.s_tir import SBlock

import vtc_tvm  # noqa: F401  (registers the pass)
from vtc_tvm.analysis import is_data_movement

# profile=True keeps its measurements in a file: the tests' own, never the user's cache.
os.environ.setdefault("VTC_TVM_PROFILE_DB", os.path.join(tempfile.mkdtemp(prefix="vtc_profile_"), "profile.json"))

LLVM = tvm.target.Target("llvm")
FUSE = tvm.transform.Sequential([
    relax.transform.LegalizeOps(),
    relax.transform.AnnotateTIROpPattern(),
    relax.transform.FuseOps(),
    relax.transform.FuseTIR(),
])


def param(shape, dtype="float32", low=None, high=None):
    """A parameter spec; ``low``/``high`` bound the random integers of an index tensor."""
    return (tuple(shape), dtype, low, high)


def _spec(p):
    if len(p) == 4:
        return p
    shape, dtype = p
    return (tuple(shape), dtype, None, None)


def emit(expr, name=None):
    """Bind ``expr`` in the block being built (to reuse one value twice)."""
    return relax.BlockBuilder.current().emit(expr, name_hint=name or "")


def make_module(params, body, name="main", mod=None):
    """A Relax module whose function ``name`` has ``params`` ((shape, dtype) tuples or
    :func:`param`) and one dataflow block computing ``body(*vars)`` (an Expr or a tuple)."""
    xs = []
    for i, p in enumerate(params):
        shape, dtype, _, _ = _spec(p)
        xs.append(relax.Var(f"x{i}", relax.TensorType(shape, dtype)))
    return module_of(xs, body, name, mod)


def module_of(xs, body, name="main", mod=None):
    """Like :func:`make_module`, for parameters given as ``relax.Var`` (e.g. symbolic shapes)."""
    bb = relax.BlockBuilder(mod)
    with bb.function(name, xs):
        with bb.dataflow():
            out = body(*xs)
            if isinstance(out, (list, tuple)):
                out = relax.Tuple([emit(o) for o in out])
            gv = bb.emit_output(out)
        bb.emit_func_output(gv)
    return bb.get()


def random_inputs(params, rng):
    arrays = []
    for p in params:
        shape, dtype, low, high = _spec(p)
        if dtype.startswith("int"):
            arrays.append(rng.integers(low or 0, high or 2, size=shape).astype(dtype))
        else:
            arrays.append(rng.standard_normal(shape).astype(dtype))
    return arrays


def run(mod, inputs, fused=True, func="main"):
    """Compile on LLVM (with FuseOps/FuseTIR when ``fused``) and return the outputs as numpy."""
    pipeline = relax.get_default_pipeline(LLVM) if fused else "default"
    ex = tvm.compile(mod, target="llvm", relax_pipeline=pipeline)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm[func](*[tvm.runtime.tensor(a) for a in inputs])
    return _to_numpy(out)


def _to_numpy(out):
    if isinstance(out, tvm.runtime.Tensor):
        return [out.numpy()]
    return [a for o in out for a in _to_numpy(o)]


def called_prim_funcs(mod):
    """(name, PrimFunc) of every call_tir in the module's Relax functions, in call order."""
    found = []
    call_tir = tvm.ir.Op.get("relax.call_tir")

    def visit(e):
        if isinstance(e, relax.Call) and e.op.same_as(call_tir):
            found.append((e.args[0].name_hint, mod[e.args[0]]))

    for _, f in mod.functions_items():
        if isinstance(f, relax.Function):
            relax.analysis.post_order_visit(f, visit)
    return found


def kernels(mod):
    """[(kernel name, is data movement)] after LegalizeOps, AnnotateTIROpPattern, FuseOps, FuseTIR."""
    with LLVM:
        fused = FUSE(mod)
    return [(n, is_data_movement(f)) for n, f in called_prim_funcs(fused)]


def legalized_names(mod):
    """Names of the PrimFuncs LegalizeOps makes for ``mod``."""
    with LLVM:
        legal = relax.transform.LegalizeOps()(mod)
    return [n for n, _ in called_prim_funcs(legal)]


@pytest.fixture
def rng(request):
    """A fresh random generator per test; the seed is printed (shown on failure).
    Set VTC_TEST_SEED to replay one."""
    seed = int(os.environ.get("VTC_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    print(f"\n[{request.node.name}] seed={seed} (replay with VTC_TEST_SEED={seed})")
    return np.random.default_rng(seed)


def matmul_transposed_weight(m=32, k=48, n=64, dtype="float32"):
    """``x @ w.T``: stock TVM runs a transpose kernel and a matmul; vtc one matmul reading ``w``
    through the transpose (the tuning tests' module)."""
    x = relax.Var("x", relax.TensorType((m, k), dtype))
    w = relax.Var("w", relax.TensorType((n, k), dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, bb.emit(relax.op.permute_dims(w))))
        bb.emit_func_output(out)
    return bb.get()


def serial_threads(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """A GPU-scheduled kernel with its thread loops made serial, to run on llvm (same loop nest,
    splits, vectorised loops and compute-at regions; not checked: the GPU memory scopes)."""
    def on_for(loop):
        if loop.kind == tirx.ForKind.THREAD_BINDING:
            return tirx.For(loop.loop_var, loop.min, loop.extent, tirx.ForKind.SERIAL, loop.body, None,
                            loop.annotations)
        return loop

    body = tvm_ffi.structural_map(func.body, (tirx.For, on_for), order="post")
    return tirx.PrimFunc(func.params, body, ret_type=func.ret_type, attrs=func.attrs).with_attr("global_symbol", "k")


def run_llvm_all(func, arrays) -> list:
    """Run ``func`` on llvm over numpy ``arrays`` (and scalars); return every argument afterwards."""
    lib = tvm.tirx.build(tvm.IRModule({"k": func.with_attr("global_symbol", "k")}), target="llvm")
    args = [tvm.runtime.tensor(a) if isinstance(a, np.ndarray) else a for a in arrays]  # scalars as they are
    lib["k"](*args)
    return [a.numpy() if isinstance(a, tvm.runtime.Tensor) else a for a in args]


def run_llvm(func, arrays):
    """Run ``func`` on llvm over numpy ``arrays`` (the last is the output); return the output."""
    return run_llvm_all(func, arrays)[-1]


def allocated_buffers(func) -> list:
    """The buffers a (scheduled) PrimFunc's blocks allocate (shared, local, wmma... stages)."""
    found = []
    tvm_ffi.structural_walk(func.body, (SBlock, lambda b: found.extend(b.alloc_buffers)), order="post")
    return found


def fused_kernels(build, params):
    """The fused PrimFuncs of a Relax function (``build(bb, *params) -> output``) after LegalizeOps,
    FuseOps and FuseTIR: the kernels the schedule rules see."""
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build(bb, *params))
        bb.emit_func_output(out)
    return [f for _, f in FUSE(bb.get()).functions_items() if isinstance(f, tirx.PrimFunc)]


def conv_kernel(C=116, k=3, stride=2, groups=None, cin=None, bias=True, relu=True, N=2, H=28, dtype="float16"):
    """The one kernel of ``relu(conv2d(x, w) + b)``, depthwise unless ``groups`` says otherwise;
    ``N`` may be a name (a symbolic batch)."""
    groups = groups or C
    cin = cin or C
    n = tirx.Var(N, "int64") if isinstance(N, str) else N
    x = relax.Var("x", relax.TensorType((n, cin, H, H), dtype))
    w = relax.Var("w", relax.TensorType((C, cin // groups, k, k), dtype))
    b = relax.Var("b", relax.TensorType((1, C, 1, 1), dtype))

    def build(bb, x, w, b):
        y = bb.emit(relax.op.nn.conv2d(x, w, strides=stride, padding=k // 2, groups=groups))
        if bias:
            y = bb.emit(relax.op.add(y, b))
        return relax.op.nn.relu(y) if relu else y

    (func,) = fused_kernels(build, [x, w, b])
    return func


def kernel_arrays(func, rng, dims=None, size=None):
    """Uniform(-1, 1) arrays for every parameter of ``func``, zeros for integer ones (indices in
    bounds for any gather), its value for a symbolic size passed as a scalar; ``dims`` binds
    symbolic sizes by name, ``size`` any other, and an extent that is an expression of them (a
    strided convolution's ``(n - 1) // 2 + 1``) is evaluated (``tests/regressions/case_7b970e547d.py``: bound to ``size`` itself, the output
    array had the wrong shape)."""
    def extent(d):
        if isinstance(d, tirx.IntImm):
            return int(d)
        analyzer = tvm.sym.Analyzer()
        for v in tirx.analysis.undefined_vars(d):
            analyzer.bind(v, tirx.IntImm(str(v.ty), (dims or {}).get(v.name, size)))
        return int(analyzer.simplify(d))

    def shape(p):
        return [extent(d) for d in p.shape]

    def array(p):
        if not tirx.is_buffer_var(p):  # a symbolic size passed on its own: its value
            return extent(p)
        if str(p.dtype).startswith(("int", "uint", "bool")):
            return np.zeros(shape(p), str(p.dtype))
        return rng.uniform(-1, 1, shape(p)).astype(str(p.dtype))

    return [array(p) for p in func.params]


def assert_float32_sums(make, scheduled, seed=3):
    """``scheduled`` (a GPU schedule of ``make("float16")``, threads made serial) computes the
    kernel with float32 sums: against the same kernel in float32 it is at least as close as the
    fp16 kernel as FuseTIR wrote it, up to one fp16 rounding."""
    func = make("float16")
    arrays = kernel_arrays(func, np.random.default_rng(seed))
    stock = run_llvm(func, [a.copy() for a in arrays]).astype(np.float64)
    ours = run_llvm(serial_threads(scheduled), [a.copy() for a in arrays]).astype(np.float64)
    exact = run_llvm(make("float32"), [a.astype("float32") for a in arrays]).astype(np.float64)
    scale = np.abs(exact).max()
    assert scale > 0.5  # not a comparison of zeros
    ulp = 2.0 ** -10 * scale
    assert np.abs(ours - exact).max() <= np.abs(stock - exact).max() + ulp
    np.testing.assert_allclose(ours, exact, rtol=0, atol=2 * ulp)


def assert_same_on_llvm(func, scheduled, dims=None, seed=5, tol=2.0 ** -9):
    """``scheduled`` (threads made serial) against ``func`` on the same random arrays (``dims``
    binds symbolic extents), within ``tol`` of the output's scale."""
    arrays = kernel_arrays(func, np.random.default_rng(seed), dims=dims)
    want = run_llvm(func, [a.copy() for a in arrays]).astype(np.float64)
    got = run_llvm(serial_threads(scheduled), [a.copy() for a in arrays]).astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * np.abs(want).max())


def cuda_source_of(funcs, target) -> str:
    """The CUDA source of scheduled PrimFuncs built together for ``target``."""
    mod = tvm.IRModule({f"k{i}": f.with_attr("global_symbol", f"k{i}") for i, f in enumerate(funcs)})
    with target:
        return tvm.tirx.build(mod, target=target).imports[0].inspect_source()


def shared_memory_bytes(func, target) -> tuple[int, int]:
    """A scheduled PrimFunc's static and dynamic shared bytes a block, as TVM's lowering leaves
    them (:func:`vtc_tvm.scratch.lower`)."""
    from vtc_tvm.scratch import lower

    (size,) = tvm.s_tir.analysis.calculate_allocated_bytes(lower(func, target)).values()
    return int(size.get("shared", 0)), int(size.get("shared.dyn", 0))


def launchable(static: int, dynamic: int, opt_in_max: int = 227 * 1024) -> bool:
    """Whether a block with these shared bytes launches under TVM 0.27's CUDA launcher, which opts
    in above 48 KiB only where the dynamic part alone reaches 48 KiB (``opt_in_max``: Hopper's)."""
    limit = 48 * 1024
    return static <= limit and (static + dynamic <= limit or dynamic >= limit and static + dynamic <= opt_in_max)


def assert_nvcc_compiles(src: str, target) -> None:
    """``src`` compiles to PTX for sm_90 with nvcc (the test is skipped, saying so, without nvcc)."""
    import shutil

    from tvm.support import nvcc

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH: CUDA source generated but not compiled")
    with target:  # nvcc asks the current target for its compute version
        assert nvcc.compile_cuda(src, target_format="ptx", arch="sm_90", compiler="nvcc")
