"""vtc-tvm: virtual tensors for Apache TVM Relax.

Importing this package registers

* ``tvm.relax.transform.VirtualTensorize`` (and the global function
  ``transform.VirtualTensorize`` so ``PassInfo(required=[...])`` resolves it by name),
* the Relax pipeline ``"vtc"`` (``relax.get_pipeline("vtc", target=...)``).

TVM also imports it at ``import tvm`` through the ``tvm.backends`` entry point
(``TVM_DEVICE_BACKEND_AUTOLOAD=0`` turns that off).
"""



def _autoload():
    """Entry point of the ``tvm.backends`` group: importing the package registers everything.

    Defined before the imports below, which import ``tvm`` and so may re-enter this package
    through TVM's backend autoloading.
    """


from .mapping import Mapping, Piece, VirtualTensor
from .rules import register_rule, get_rule, registered_ops
from .transform import VirtualTensorize, emit
from .plan import Plan, plan
from . import pipeline as _pipeline

__version__ = "0.1.0"

__all__ = [
    "Mapping",
    "Piece",
    "VirtualTensor",
    "VirtualTensorize",
    "emit",
    "Plan",
    "plan",
    "register_rule",
    "get_rule",
    "registered_ops",
]


def _register():
    import tvm
    import tvm_ffi

    tvm.relax.transform.VirtualTensorize = VirtualTensorize
    tvm_ffi.register_global_func("transform.VirtualTensorize", VirtualTensorize, override=True)
    _pipeline.register()


_register()
