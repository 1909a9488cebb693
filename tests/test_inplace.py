"""In-place KV-cache updates: only the new rows are written, the caller's cache is the output."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax import op as R

from vtc_tvm.analysis import _non_root_blocks
from vtc_tvm.transform import VirtualTensorize

LLVM = tvm.target.Target("llvm")
B, H, T, D = 2, 3, 8, 4


def _module(update):
    """main(cache, ...) -> (attention output over the updated cache, updated cache)."""
    cache = relax.Var("cache", relax.TensorType((B, H, T, D), "float32"))
    q = relax.Var("q", relax.TensorType((B, H, 1, D), "float32"))
    new = relax.Var("new", relax.TensorType((B, H, 1, D), "float32"))
    extra, updated_fn = update
    bb = relax.BlockBuilder()
    with bb.function("main", [cache, q, new] + extra):
        with bb.dataflow():
            updated = bb.emit(updated_fn(cache, new, *extra))
            scores = bb.emit(R.matmul(q, bb.emit(R.permute_dims(updated, [0, 1, 3, 2]))))
            out = bb.emit_output(relax.Tuple([scores, updated]))
        bb.emit_func_output(out)
    return bb.get()


def _scatter_nd():
    idx = relax.Var("idx", relax.TensorType((B, H, 1, 3), "int64"))
    return [idx], lambda cache, new, i: R.scatter_nd(cache, i, new, reduction="update")


def _scatter_elements():
    idx = relax.Var("idx", relax.TensorType((B, H, 1, D), "int64"))
    return [idx], lambda cache, new, i: R.scatter_elements(cache, i, new, axis=2)


def _slice_scatter():
    return [], lambda cache, new: R.slice_scatter(cache, new, 5, 6, 1, axis=2)


def _inputs(kind, pos, rng):
    cache = rng.standard_normal((B, H, T, D)).astype("float32")
    args = [cache, rng.standard_normal((B, H, 1, D)).astype("float32"),
            rng.standard_normal((B, H, 1, D)).astype("float32")]
    if kind == "scatter_nd":
        b, h = np.meshgrid(np.arange(B), np.arange(H), indexing="ij")
        args.append(np.stack([b, h, np.full_like(b, pos)], -1)[:, :, None, :].astype("int64"))
    elif kind == "scatter_elements":  # negative positions count from the end, as in TOPI
        args.append(np.full((B, H, 1, D), pos - T, "int64"))
    return args


UPDATES = {"scatter_nd": _scatter_nd, "scatter_elements": _scatter_elements, "slice_scatter": _slice_scatter}


@pytest.mark.parametrize("kind", sorted(UPDATES))
def test_update_in_place(kind):
    rng = np.random.default_rng()
    pos = 5  # slice_scatter's position is static
    mod = _module(UPDATES[kind]())
    report = []
    vmod = VirtualTensorize(inplace=["cache"], report=report)(mod)
    assert any(r["virtual"] and "in place" in r["reason"] for r in report), report
    args = _inputs(kind, pos, rng)

    def run(m, arrays):
        ex = tvm.compile(m, target=LLVM, relax_pipeline=relax.get_default_pipeline(LLVM))
        tensors = [tvm.runtime.tensor(a) for a in arrays]
        out = relax.VirtualMachine(ex, tvm.cpu())["main"](*tensors)
        return [o.numpy() for o in out], tensors[0].numpy()

    (want_scores, want_cache), stock_input = run(mod, args)
    (got_scores, got_cache), vtc_input = run(vmod, args)
    np.testing.assert_allclose(got_scores, want_scores, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got_cache, want_cache)
    np.testing.assert_array_equal(stock_input, args[0])  # stock leaves the argument alone
    np.testing.assert_array_equal(vtc_input, want_cache)  # vtc updated the caller's cache itself
    untouched = np.ones(T, bool)
    untouched[pos] = False
    np.testing.assert_array_equal(got_cache[:, :, untouched], args[0][:, :, untouched])  # bit-identical

    # Not copied: the update kernel iterates over the new rows only, never over the cache.
    kernel = next(f for gv, f in vmod.functions_items() if gv.name_hint.endswith("_inplace"))
    (block,) = _non_root_blocks(kernel)
    assert np.prod([int(iv.dom.extent) for iv in block.iter_vars]) == B * H * D


def test_not_in_place_without_permission_or_when_read_elsewhere():
    mod = _module(_scatter_nd())
    report = []
    VirtualTensorize(report=report)(mod)
    assert not any("in place" in r["reason"] for r in report)

    cache = relax.Var("cache", relax.TensorType((B, H, T, D), "float32"))
    new = relax.Var("new", relax.TensorType((B, H, 1, D), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [cache, new]):
        with bb.dataflow():
            updated = bb.emit(R.slice_scatter(cache, new, 5, 6, 1, axis=2))
            out = bb.emit_output(R.add(updated, cache))  # the old cache is still needed
        bb.emit_func_output(out)
    report = []
    VirtualTensorize(inplace=["cache"], report=report)(bb.get())
    assert any(not r["virtual"] and "read elsewhere" in r["reason"] for r in report), report


@pytest.mark.parametrize("kind", sorted(UPDATES))
def test_update_in_place_compiles_for_cuda(kind):
    from vtc_tvm.pipeline import cuda_target

    from vtc_tvm.report import device_source

    target = cuda_target()
    report = []
    vmod = VirtualTensorize(inplace=["cache"], target=target, report=report)(_module(UPDATES[kind]()))
    ex = tvm.compile(vmod, target=target, relax_pipeline=relax.get_default_pipeline(target))
    # (DLight's analysis asserts on scatter_elements' data-dependent store: ScheduleCopies gives
    # it vtc_tvm.copy_schedule.schedule_update instead)
    assert any("updated in place" in r["reason"] and r["virtual"] for r in report), report
    assert "_inplace_kernel" in device_source(ex)


def _projected_module(update):
    """The rows come from a K projection (x @ w, to heads, times cos): a kernel of ours."""
    cache = relax.Var("cache", relax.TensorType((B, H, T, D), "float32"))
    x = relax.Var("x", relax.TensorType((B, 1, 8), "float32"))
    w = relax.Var("w", relax.TensorType((8, H * D), "float32"))
    cos = relax.Var("cos", relax.TensorType((B, 1, 1, D), "float32"))
    extra, updated_fn = update
    bb = relax.BlockBuilder()
    with bb.function("main", [cache, x, w, cos] + extra):
        with bb.dataflow():
            k = bb.emit(R.permute_dims(bb.emit(R.reshape(bb.emit(R.matmul(x, w)), (B, 1, H, D))), [0, 2, 1, 3]))
            rows = bb.emit(R.multiply(k, cos))
            out = bb.emit_output(updated_fn(cache, rows, *extra))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("kind", sorted(UPDATES))
def test_producer_writes_its_rows_into_the_cache(kind):
    from vtc_tvm.pipeline import vtc_pipeline

    rng = np.random.default_rng()
    pos = 5
    mod = _projected_module(UPDATES[kind]())
    cache, _q, _new, *index = _inputs(kind, pos, rng)
    args = [cache, rng.standard_normal((B, 1, 8)).astype("float32"),
            rng.standard_normal((8, H * D)).astype("float32"), rng.standard_normal((B, 1, 1, D)).astype("float32")]
    args += index

    def run(pipeline):
        ex = tvm.compile(mod, target=LLVM, relax_pipeline=pipeline)
        tensors = [tvm.runtime.tensor(a) for a in args]
        return relax.VirtualMachine(ex, tvm.cpu())["main"](*tensors).numpy(), tensors[0].numpy()

    want, _ = run(relax.get_default_pipeline(LLVM))
    report = []
    got, caller_cache = run(vtc_pipeline(LLVM, inplace=["cache"], report=report))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(caller_cache, got)  # updated in place
    untouched = np.ones(T, bool)
    untouched[pos] = False
    np.testing.assert_array_equal(got[:, :, untouched], cache[:, :, untouched])

    # The rows never exist as a tensor of their own: their producer stores into the cache
    # (FuseOps already fuses an elementwise producer into a slice update; the store side does
    # it for the indexed updates).
    with LLVM:
        lowered = vtc_pipeline(LLVM, inplace=["cache"])(mod)
    tensors = []
    relax.analysis.post_order_visit(lowered["main"].body, lambda e: tensors.append(
        (tuple(int(d) for d in e.ty.shape), str(e.ty.dtype)))
        if isinstance(e, relax.Var) and isinstance(e.ty, relax.TensorType) else None)
    assert ((B, H, 1, D), "float32") not in tensors, lowered["main"]


@pytest.mark.parametrize("kind", ["scatter_nd", "slice_scatter"])
def test_producer_into_the_cache_compiles_for_cuda(kind):
    from vtc_tvm.pipeline import cuda_target, vtc_pipeline
    from vtc_tvm.report import device_source

    target = cuda_target()
    report = []
    ex = tvm.compile(_projected_module(UPDATES[kind]()), target=target,
                     relax_pipeline=vtc_pipeline(target, inplace=["cache"], report=report))
    src = device_source(ex)
    if kind == "scatter_nd":
        assert any(r.get("side") == "store" and r["virtual"] for r in report), report
        assert "_into_" in src
    else:
        assert "slice_scatter_inplace" in src
