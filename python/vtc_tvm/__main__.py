"""``python -m vtc_tvm``: the ``vtc-tvm`` command line (see :mod:`vtc_tvm.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m vtc_tvm"))
