"""The ``"vtc"`` Relax pipeline: TVM's default pipeline for a target with virtual tensors.

Load side (:func:`VirtualTensorize`) runs first, on high-level ops; store side
(:func:`VirtualTensorizeStores`) runs right after ``FuseTIR``, where producers are final kernels.
Everything else is the stock pipeline of the target's backend, pass for pass.
"""

import tvm
from tvm import relax

PIPELINE_NAME = "vtc"
TUNING_PIPELINE_NAME = "vtc_tuning"


def _backend(target: tvm.target.Target):
    from tvm.relax import backend

    if target.kind.name == "cuda":
        return backend.cuda.pipeline
    if target.kind.name == "llvm":
        return backend.cpu_generic.pipeline
    return backend.gpu_generic.pipeline


SCHEDULES = ("dlight", "vtc")


def _with_schedules(passes: list, target, schedules) -> list:
    """``passes`` with the backend's ``ApplyDefaultSchedule`` replaced by
    :func:`vtc_tvm.schedules.ApplySchedules` when ``schedules == "vtc"``, or by
    ``dlight.ApplyDefaultSchedule(*schedules)`` when ``schedules`` is a sequence of DLight rules
    (a user's own list, most specialised first; ``"dlight"`` keeps the backend's)."""
    if isinstance(schedules, str):
        if schedules not in SCHEDULES:
            raise ValueError(f"schedules must be one of {SCHEDULES} or a list of DLight rules, not {schedules!r}")
        if schedules == "dlight":
            return passes
        from .schedules import ApplySchedules

        apply = ApplySchedules(target)
    else:
        from tvm.s_tir import dlight as dl

        rules = list(schedules)
        if not rules or not all(isinstance(r, dl.ScheduleRule) for r in rules):
            raise ValueError("schedules must be one of "
                             f"{SCHEDULES} or a non-empty list of DLight rules, not {schedules!r}")
        apply = dl.ApplyDefaultSchedule(*rules)
    return [apply if p.info.name == "ApplyDefaultSchedule" else p for p in passes]


def fusion_passes(target: tvm.target.Target, stores: bool = True, report=None,
                  schedule_copies: bool = True, schedules="dlight", dlight_next: bool = False) -> list:
    """The backend's legalize/fuse/schedule passes, with the store side after ``FuseTIR`` and,
    on GPU targets, vectorised schedules for the copy kernels that remain before DLight
    (``schedules="vtc"``: our small-batch rules before DLight's, :mod:`vtc_tvm.schedules`).
    ``dlight_next``: nothing runs between the copy schedules and DLight's pass (not so in the
    tuning pipeline, which tunes there): the copy schedules may keep the schedules their DLight
    check made (:func:`vtc_tvm.copy_schedule.ScheduleCopies`)."""
    from .copy_schedule import ScheduleCopies
    from .stores import VirtualTensorizeStores

    passes = _with_schedules(list(_backend(target).legalize_passes(target)), target, schedules)
    if stores:
        at = next(i for i, p in enumerate(passes) if p.info.name == "FuseTIR") + 1
        passes.insert(at, VirtualTensorizeStores(target, report=report))
    if schedule_copies and "gpu" in target.keys:
        at = next((i for i, p in enumerate(passes) if p.info.name == "ApplyDefaultSchedule"), len(passes))
        follows = at < len(passes) and passes[at].info.name == "ApplyDefaultSchedule"
        passes.insert(at, ScheduleCopies(target, dlight_next=dlight_next and follows
                                         and isinstance(schedules, str)))
    return passes


def vtc_pipeline(target=None, stores: bool = True, schedule_copies: bool = True,
                 schedules="vtc", **options) -> tvm.transform.Pass:
    """VirtualTensorize, then TVM's default pipeline for ``target`` (with the store side and,
    on GPU targets, vectorised copy kernels: :mod:`vtc_tvm.copy_schedule`).

    ``options`` go to :func:`vtc_tvm.VirtualTensorize` (``strategy``, ``ops``, ``report``,
    ``profile``, ...); ``memory_guard`` is on unless given (never plan more memory than stock).
    On GPU targets ``schedules="vtc"`` (the default) schedules with
    :func:`vtc_tvm.schedules.default_rules` (ours, then DLight's): on the H200 every decode layer
    ran faster and within 1e-2 of float64 with them (``benchmarks/results/schedules_h200.md``;
    some single kernels are still faster under DLight, see there); ``"dlight"`` is DLight's
    rules alone; a list of DLight rules is used as given (e.g. a rule of your own before
    ``vtc_tvm.schedules.default_rules(target)``). Without a target, the target ``tvm.compile``
    runs the pipeline under decides (:func:`_target_from_context`): a GPU target's pipeline as
    above; otherwise the stock target-independent build (no fusion, as TVM's own ``"default"``
    on the CPU), with no store side.
    """
    from .transform import VirtualTensorize

    if target is None:
        return _target_from_context(
            lambda t: vtc_pipeline(t, stores, schedule_copies, schedules, **options),
            lambda: tvm.transform.Sequential([VirtualTensorize(**options), relax.pipeline.default_build_pipeline()]),
            "vtc_pipeline")
    target = tvm.target.Target(target)
    options.setdefault("target", target)
    options.setdefault("memory_guard", True)
    return _in_target(target, [VirtualTensorize(**options)] + backend_passes(
        target, stores, options.get("report"), schedule_copies, schedules), "vtc_pipeline")


def backend_passes(target: tvm.target.Target, stores: bool = True, report=None,
                   schedule_copies: bool = True, schedules="dlight") -> list:
    """The stock pipeline of ``target``'s backend, pass for pass, with the store side and the
    copy schedules of :func:`fusion_passes`: what follows the load side."""
    backend = _backend(target)
    return (list(backend.library_dispatch_passes(target))
            + fusion_passes(target, stores, report, schedule_copies, schedules, dlight_next=True)
            + list(backend.dataflow_lower_passes(target)) + list(backend.finalize_passes(target)))


def _target_from_context(for_target, target_independent, name) -> tvm.transform.Pass:
    """A pipeline named without a target (``tvm.compile(mod, target, relax_pipeline="vtc")``):
    ``for_target(target)`` for the GPU target the pipeline runs under (``tvm.compile`` runs it
    in ``with target:``), as ``tvm.compile`` picks the target's pipeline for ``"default"`` on GPU
    targets; else ``target_independent()`` (no fusion, as stock's ``"default"`` on the CPU).
    Without this, a GPU build's kernels stayed unscheduled and compiled as host loops."""

    @tvm.transform.module_pass(opt_level=0, name=name)
    def _pipeline(mod, _ctx):
        target = tvm.target.Target.current(allow_none=True)
        if target is not None and "gpu" in target.keys:
            return for_target(target)(mod)
        return target_independent()(mod)

    return _pipeline


def _in_target(target, passes, name):
    @tvm.transform.module_pass(opt_level=0, name=name)
    def _pipeline(mod, _ctx):
        with target:
            return tvm.transform.Sequential(passes)(mod)

    return _pipeline


def store_side_pipeline(target, report=None, schedules="vtc") -> tvm.transform.Pass:
    """The stock pipeline of ``target`` with the store side only (for modules already through
    :func:`vtc_tvm.VirtualTensorize`), scheduled as :func:`vtc_pipeline` does."""
    target = tvm.target.Target(target)
    return _in_target(target, backend_passes(target, True, report, schedules=schedules), "store_side_pipeline")


def stock_vtc_schedules_pipeline(target=None) -> tvm.transform.Pass:
    """Stock TVM's default pipeline for ``target`` with :mod:`vtc_tvm.schedules`' rules before
    DLight's, and no virtual tensors (the middle column of stock / + schedules / vtc-tvm)."""
    if target is None:
        return _target_from_context(stock_vtc_schedules_pipeline, relax.pipeline.default_build_pipeline,
                                    "stock_vtc_schedules")
    target = tvm.target.Target(target)
    backend = _backend(target)
    passes = (list(backend.library_dispatch_passes(target))
              + _with_schedules(list(backend.legalize_passes(target)), target, "vtc")
              + list(backend.dataflow_lower_passes(target)) + list(backend.finalize_passes(target)))
    return _in_target(target, passes, "stock_vtc_schedules")


STOCK_SCHEDULES_PIPELINE_NAME = "stock_vtc_schedules"


def _tuning_pipeline(**kwargs) -> tvm.transform.Pass:
    """``"vtc_tuning"``: :func:`vtc_tvm.tuning.tuning_pipeline` (imported on use: no import cycle)."""
    from .tuning import tuning_pipeline

    return tuning_pipeline(**kwargs)


def register():
    if PIPELINE_NAME not in relax.pipeline.PIPELINE_MAP:
        relax.register_pipeline(PIPELINE_NAME)(vtc_pipeline)
    if STOCK_SCHEDULES_PIPELINE_NAME not in relax.pipeline.PIPELINE_MAP:
        relax.register_pipeline(STOCK_SCHEDULES_PIPELINE_NAME)(stock_vtc_schedules_pipeline)
    if TUNING_PIPELINE_NAME not in relax.pipeline.PIPELINE_MAP:
        relax.register_pipeline(TUNING_PIPELINE_NAME)(_tuning_pipeline)


def cuda_target(arch: str = "sm_90") -> tvm.target.Target:
    """The H100/H200 CUDA target with a plain ``sm_90`` arch.

    The ``nvidia/nvidia-h100`` tag says ``sm_90a``, which DLight's ``check_sm_version`` parses
    as -1: its Matmul rule then never uses tensor cores (TVM 0.27). Same attributes otherwise.
    """
    config = dict(tvm.target.Target("nvidia/nvidia-h100").export())
    config["arch"] = arch
    return tvm.target.Target(config)
