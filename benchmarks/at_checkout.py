"""Run a module of another checkout of vtc-tvm (an earlier commit, for a before/after run) with
this venv's TVM stack.

    python benchmarks/at_checkout.py DIR MODULE [ARGS...]
    e.g.  git archive 39e5df7 | tar -x -C /tmp/before && cd /tmp/before &&
          VTC_TVM_NATIVE_LIB=$PWD/../main/build/.../libvtc_tvm_native.so \\
          python ../main/benchmarks/at_checkout.py /tmp/before benchmarks.compile_time --out /tmp/ct_before

``PYTHONPATH`` alone is not enough: the editable install (``pip install -e .``) puts a finder for
``vtc_tvm`` on ``sys.meta_path`` ahead of the path, so the venv's checkout would be imported
instead. This drops that finder, puts ``DIR/python`` and ``DIR`` first on the path and checks
that ``vtc_tvm`` comes from ``DIR``. A checkout without a built native solver needs
``$VTC_TVM_NATIVE_LIB`` (the solver's C++ is the same library across commits that share
``src/``).
"""

import os
import runpy
import sys


def use_checkout(root: str) -> None:
    """Import ``vtc_tvm`` (and ``benchmarks``) from the checkout at ``root`` from now on."""
    root = os.path.abspath(root)
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__]
    sys.path[:0] = [os.path.join(root, "python"), root]
    import vtc_tvm

    if not os.path.abspath(vtc_tvm.__file__).startswith(root + os.sep):
        sys.exit(f"vtc_tvm was imported from {vtc_tvm.__file__}, not from {root}")


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__.split("\n\n")[1])
    root, module = sys.argv[1], sys.argv[2]
    use_checkout(root)
    sys.argv = [module] + sys.argv[3:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
