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
        stock = relax.get_default_pipeline(tvm.target.Target(target))
    return tvm.transform.Sequential([VirtualTensorize(**options), stock], name="vtc_pipeline")


def register():
    if PIPELINE_NAME not in relax.pipeline.PIPELINE_MAP:
        relax.register_pipeline(PIPELINE_NAME)(vtc_pipeline)
