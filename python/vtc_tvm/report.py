"""Measuring what virtual tensors buy: kernel census, planned memory, latency, stock-vs-vtc builds."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tvm
from tvm import relax
from tvm.ir import Op

from .pipeline import _backend, fusion_passes

_KERNEL_CALLS = (Op.get("relax.call_tir"), Op.get("relax.call_tir_inplace"))
_ALLOC_STORAGE = Op.get("relax.memory.alloc_storage")


def _as_target(target) -> tvm.target.Target:
    return target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)


def _calls(func: relax.Function, ops) -> list[relax.Call]:
    found = []

    def visit(e):
        if isinstance(e, relax.Call) and any(e.op.same_as(o) for o in ops):
            found.append(e)

    relax.analysis.post_order_visit(func, visit)
    return found


def _census_passes(target: tvm.target.Target, stores: bool):
    """The target pipeline's own passes (:func:`vtc_tvm.pipeline.fusion_passes` and the
    backend's lists, not a copy of them), in two parts: up to the kernels ``main`` launches
    (library dispatch, fusion, with the store side when ``stores``, and dataflow lowering up to
    ``RewriteDataflowReshape``, which turns a lone reshape kernel into a zero-copy view), then on
    to static memory planning (it acts on explicit allocations, made by ``CallTIRRewrite``).
    Scheduling is left out: it changes no kernel and costs a build's time."""
    backend = _backend(target)
    fuse = list(backend.library_dispatch_passes(target)) + [
        p for p in fusion_passes(target, stores, schedule_copies=False) if p.info.name != "ApplyDefaultSchedule"]
    lower = list(backend.dataflow_lower_passes(target))
    at = next(i for i, p in enumerate(lower) if p.info.name == "RewriteDataflowReshape") + 1
    plan = [p for p in backend.finalize_passes(target) if p.info.name == "StaticPlanBlockMemory"]
    return fuse + lower[:at], lower[at:] + plan


def fused_module(mod: tvm.IRModule, target, stores: bool = False) -> tvm.IRModule:
    """``mod`` as :func:`kernel_census` counts its kernels: after the target pipeline's fusion
    (its PrimFunc names are the kernels'); ``stores`` adds the store side after ``FuseTIR``."""
    target = _as_target(target)
    with target:
        return tvm.transform.Sequential(_census_passes(target, stores)[0])(mod)


def kernel_census(mod: tvm.IRModule, target, stores: bool = False, fused: tvm.IRModule = None) -> dict:
    """Kernels launched by ``main`` after TVM's fusion, how many only move data, and planned memory.

    Returns ``kernels``, ``data_movement`` (kernels whose PrimFunc ``is_data_movement``; their
    names in ``data_movement_kernels``),
    ``planned_bytes`` (intermediate storage after static memory planning; outputs excluded) and
    ``memory_estimate`` (the text of ``relax.analysis.estimate_memory_usage``). ``stores`` adds
    the store side after ``FuseTIR``, as the ``"vtc"`` pipeline does. ``fused``: ``mod`` already
    through :func:`fused_module` (same ``stores``), to count without fusing again.
    """
    from .analysis import is_data_movement  # lazy: the analysis module is written alongside

    target = _as_target(target)
    with target:
        mod = fused if fused is not None else fused_module(mod, target, stores)
        kernels = _calls(mod["main"], _KERNEL_CALLS)
        planned = tvm.transform.Sequential(_census_passes(target, stores)[1])(mod)
    movers = [c.args[0].name_hint for c in kernels if is_data_movement(mod[c.args[0]])]
    return {
        "kernels": len(kernels),
        "data_movement": len(movers),
        "data_movement_kernels": movers,
        "planned_bytes": _planned_bytes(planned["main"]),
        "memory_estimate": _memory_estimate(planned),
    }


def _memory_estimate(mod) -> str:
    """``relax.analysis.estimate_memory_usage`` (which in TVM 0.27 fails on symbolic sizes)."""
    try:
        return relax.analysis.estimate_memory_usage(mod)
    except AttributeError:
        return "no estimate: storage sizes are symbolic"


def _planned_bytes(func):
    """Bytes of the static storage allocations; None when a size is symbolic."""
    sizes = [c.args[0].values[0] for c in _calls(func, [_ALLOC_STORAGE])]
    if not all(isinstance(s, tvm.tirx.IntImm) for s in sizes):
        return None
    return sum(int(s.value) for s in sizes)


def compile_variants(mod: tvm.IRModule, target, **options) -> dict:
    """Build ``mod`` with TVM's default pipeline ("stock") and with the ``"vtc"`` pipeline.

    Returns name -> (census, executable); ``options`` go to VirtualTensorize. The default
    pipeline is passed explicitly because ``tvm.compile``'s own default does no fusion on CPU.
    """
    from .pipeline import vtc_pipeline
    from .transform import VirtualTensorize

    target = _as_target(target)
    vtc_mod = VirtualTensorize(target=target, **options)(mod)
    return {
        "stock": (kernel_census(mod, target),
                  tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))),
        "vtc": (kernel_census(vtc_mod, target, stores=True),
                tvm.compile(mod, target=target, relax_pipeline=vtc_pipeline(target, **options))),
    }


def device_source(ex, kind: str = "cuda") -> str:
    """Generated device source of an executable ("" if there is none): the import tree goes
    VM executable -> llvm host module -> device module."""

    def find(m):
        if m.kind == kind:
            return m
        return next((r for r in map(find, m.imports) if r is not None), None)

    found = find(ex.mod)
    return found.inspect_source() if found is not None else ""


def uses_tensor_cores(ex) -> bool:
    """Whether the CUDA code issues matrix instructions (WMMA / MMA / WGMMA)."""
    src = device_source(ex, "cuda")
    return any(k in src for k in ("wmma", "mma.sync", "wgmma", "ldmatrix"))


def run_vm(ex, dev, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run ``main`` once; the (possibly nested tuple) result flattened to numpy arrays."""
    out = relax.VirtualMachine(ex, dev)["main"](*[tvm.runtime.tensor(a, dev) for a in inputs])

    def flat(o):
        return [o.numpy()] if isinstance(o, tvm.runtime.Tensor) else [a for x in o for a in flat(x)]

    return flat(out)


def time_vm(ex, dev, inputs: Sequence[np.ndarray], repeat: int = 10) -> float:
    """Median latency of ``main`` in milliseconds over ``repeat`` timed runs (after a warm-up run)."""
    vm = relax.VirtualMachine(ex, dev)
    args = [tvm.runtime.tensor(a, dev) for a in inputs]
    res = vm.time_evaluator("main", dev, number=1, repeat=repeat)(*args)
    return float(np.median(res.results)) * 1e3
