"""The WMMA tensor intrinsics :mod:`.tensor_core_gemm` tensorizes with, registered on demand.

TVM registers its tensor intrinsics when ``tvm.s_tir.tensor_intrin`` is imported: about 250 of
them (CUDA's, and the CPUs'), each parsed from TVMScript. That import takes 6 to 25 s (this
2-core machine: 25 s with ``import tvm`` alone loaded). TVMScript's ``T.prim_func`` calls
``inspect.stack()``; inside an import, every frame of importlib's frozen modules makes
``inspect.getmodule`` scan all of ``sys.modules`` (~1100 after ``import tvm``). A first compile
whose batch-16 projections take tensor cores paid it in full: 22.6 s for the Llama-3-8B decode
layer, against 0.8 s for stock TVM, which imports nothing there.

The five intrinsics the rule needs are made here by TVM's own generators
(``get_wmma_load_intrin`` and its siblings in ``tvm/s_tir/tensor_intrin/cuda.py``). Only the
module's imports and its undecorated functions are executed, from its source; none of its
registrations run (about 0.2 s). They are registered under ``vtc_`` names, so TVM's module can
still register its own names when something imports it later (DLight's Matmul does so for larger
GEMMs). Should that source not give the generators (a TVM layout other than 0.27's), the module
is imported instead: slower, same intrinsics.
"""

from __future__ import annotations

import ast
import functools
import importlib
import logging
import os

import tvm
from tvm.s_tir import TensorIntrin

logger = logging.getLogger("vtc_tvm")

_GENERATORS = ("get_wmma_load_intrin", "get_wmma_fill_intrin", "get_wmma_store_intrin", "get_wmma_sync_intrin")
TVM_SOURCE = os.path.join(os.path.dirname(tvm.s_tir.__file__), "tensor_intrin", "cuda.py")


@functools.lru_cache(maxsize=None)
def generators(path: str = TVM_SOURCE) -> dict:
    """TVM's WMMA generator functions, by name, from the source at ``path``."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        # imports and plain functions; no registration, no decorated (globally registered) function
        tree.body = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
                     or isinstance(n, ast.FunctionDef) and not n.decorator_list]
        # compiled under the file's own name and lines: TVMScript reads each prim_func's source there
        namespace = {"__name__": __name__ + ".generators", "__file__": path}
        exec(compile(tree, path, "exec"), namespace)  # noqa: S102 - TVM's installed source
        return {name: namespace[name] for name in _GENERATORS}
    except Exception as err:  # noqa: BLE001 - any other layout of TVM's source: import it instead
        logger.info("WMMA generators not taken from %s (%s): importing tvm.s_tir.tensor_intrin", path, err)
        return _imported()


def _imported() -> dict:
    module = importlib.import_module("tvm.s_tir.tensor_intrin.cuda")
    return {name: getattr(module, name) for name in _GENERATORS}


def intrinsic(name: str, generator: str, *args) -> str:
    """``vtc_<name>``: TVM's ``generator(*args)`` (desc, impl) registered once under that name."""
    name = "vtc_" + name
    if TensorIntrin.get(name, allow_missing=True) is None:
        try:
            pair = generators()[generator](*args)
        except Exception:  # noqa: BLE001 - a generator that needs more of its module than its functions
            pair = _imported()[generator](*args)
        TensorIntrin.register(name, *pair)
    return name


__all__ = ["TVM_SOURCE", "generators", "intrinsic"]
