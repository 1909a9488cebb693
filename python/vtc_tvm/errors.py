"""Exit codes of the ``vtc-tvm`` command line, the error that carries one, and the one-line form
of an error message (:func:`last_line`).

====  ===============================================================================
code  meaning
====  ===============================================================================
0     success
1     internal error: a crash in vtc-tvm or TVM (``--debug`` shows the traceback)
2     usage: unknown option, missing or malformed argument
3     numeric mismatch (``--check``): a build disagrees with its reference
4     no device: the run needs the target's device (e.g. a CUDA GPU) and none is visible
5     bad target: ``--target`` is not a target TVM can build for
6     bad shape: a ``--shape``/``--dim`` value is malformed or conflicts with the model
7     unknown name: ``--shape``/``--dim`` names no input / symbolic dim of the model
8     bad pass option: ``--ops`` names an op without a rule, ``--inplace`` a non-parameter
9     invalid model: missing, unreadable or malformed file, ONNX checker failure, unsupported dtype
10    unsupported model: an ONNX op (or construct) TVM's ONNX frontend cannot convert
11    tuning support is not installed in this build
130   interrupted (Ctrl-C)
====  ===============================================================================
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    INTERNAL = 1
    USAGE = 2
    MISMATCH = 3
    NO_DEVICE = 4
    BAD_TARGET = 5
    BAD_SHAPE = 6
    UNKNOWN_NAME = 7
    BAD_OPTION = 8
    INVALID_MODEL = 9
    UNSUPPORTED_MODEL = 10
    NO_TUNING = 11
    INTERRUPTED = 130


def exit_code_table() -> str:
    """The table of the module docstring, for ``--help``."""
    rows = [line.split(None, 1) for line in __doc__.splitlines() if line[:1].isdigit()]
    return "exit codes:\n" + "\n".join(f"  {code:>3}  {meaning}" for code, meaning in rows)


class UserError(Exception):
    """A problem with the user's input: reported as one ``error:`` line and ``code``."""

    def __init__(self, message: str, code: ExitCode):
        super().__init__(message)
        self.code = ExitCode(code)


def last_line(err, limit: int = 200) -> str:
    """The last non-blank line of ``err``'s message, at most ``limit`` characters: TVM's errors end
    with their message, after a traceback. The exception's type name when the message is empty."""
    lines = [ln for ln in str(err).splitlines() if ln.strip()]
    return lines[-1].strip()[:limit] if lines else type(err).__name__


def from_input_error(err) -> UserError:
    """The :class:`UserError` of an :class:`vtc_tvm.onnx_import.InputError`."""
    from . import onnx_import as oi

    code = {oi.ModelError: ExitCode.INVALID_MODEL, oi.UnsupportedOpError: ExitCode.UNSUPPORTED_MODEL,
            oi.ShapeError: ExitCode.BAD_SHAPE, oi.UnknownNameError: ExitCode.UNKNOWN_NAME}.get(
        type(err), ExitCode.UNSUPPORTED_MODEL)
    return UserError(str(err), code)
