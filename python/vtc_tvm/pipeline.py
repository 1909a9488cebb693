"""The ``"vtc"`` Relax pipeline: VirtualTensorize followed by the stock pipeline."""

import tvm
from tvm import relax

PIPELINE_NAME = "vtc"


def vtc_pipeline(target=None, **options) -> tvm.transform.Pass:
    """VirtualTensorize, then TVM's default pipeline for ``target``.

    ``options`` go to :func:`vtc_tvm.VirtualTensorize` (``strategy``, ``ops``, ...). Without a
    target the stock target-independent build pipeline follows (no fusion, as ``"default"``).
    """
    from .transform import VirtualTensorize

    if target is None:
        stock = relax.pipeline.default_build_pipeline()
    else:
        target = tvm.target.Target(target)
        stock = relax.get_default_pipeline(target)
        options.setdefault("target", target)
    return tvm.transform.Sequential([VirtualTensorize(**options), stock], name="vtc_pipeline")


def register():
    if PIPELINE_NAME not in relax.pipeline.PIPELINE_MAP:
        relax.register_pipeline(PIPELINE_NAME)(vtc_pipeline)


def cuda_target(arch: str = "sm_90") -> tvm.target.Target:
    """The H100/H200 CUDA target with a plain ``sm_90`` arch.

    The ``nvidia/nvidia-h100`` tag says ``sm_90a``, which DLight's ``check_sm_version`` parses
    as -1: its Matmul rule then never uses tensor cores (TVM 0.27). Same attributes otherwise.
    """
    config = dict(tvm.target.Target("nvidia/nvidia-h100").export())
    config["arch"] = arch
    return tvm.target.Target(config)
