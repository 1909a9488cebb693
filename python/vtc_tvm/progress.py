"""What the command line shows while it works: a tqdm bar per phase on a terminal, plain phase
lines (with a heartbeat every ``HEARTBEAT_S``) elsewhere, nothing with ``-q``; all on stderr.

Limits: 1. a phase has no inner progress (TVM's passes report none): the bar shows the elapsed
time, refreshed by a background thread. 2. ``silence_native_stderr`` redirects file descriptor
2 for the whole command, so TVM's C++ warnings (printed by the library, not through Python)
disappear; our own messages go to a duplicate of the original stderr.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

HEARTBEAT_S = 30.0


class Console:
    """Phase reporting and notes for one command (``stream``: where they go)."""

    def __init__(self, quiet: bool = False, stream=None):
        self.quiet = quiet
        self.stream = stream if stream is not None else sys.stderr
        try:
            self.tty = self.stream.isatty()
        except (AttributeError, ValueError):
            self.tty = False

    def note(self, message: str) -> None:
        if not self.quiet:
            print(f"note: {message}", file=self.stream, flush=True)

    def error(self, message: str) -> None:
        print(f"error: {message}", file=self.stream, flush=True)

    @contextlib.contextmanager
    def phase(self, what: str):
        """Report ``what`` while the body runs; yields nothing."""
        if self.quiet:
            yield
            return
        start = time.monotonic()
        stop = threading.Event()
        if self.tty:
            from tqdm import tqdm

            bar = tqdm(total=1, desc=what, file=self.stream, leave=True,
                       bar_format="{desc} {elapsed}{postfix}")

            def beat():
                while not stop.wait(0.5):
                    bar.refresh()
        else:
            bar = None
            print(f"vtc-tvm: {what} ...", file=self.stream, flush=True)

            def beat():
                while not stop.wait(HEARTBEAT_S):
                    print(f"vtc-tvm: still {what} ({time.monotonic() - start:.0f} s)", file=self.stream, flush=True)

        thread = threading.Thread(target=beat, daemon=True)
        thread.start()
        ok = False
        try:
            yield
            ok = True
        finally:
            stop.set()
            thread.join()
            took = time.monotonic() - start
            if bar is not None:
                bar.set_postfix_str("done" if ok else "failed", refresh=False)
                bar.update(1)
                bar.close()
            else:
                print(f"vtc-tvm: {what}: {'done' if ok else 'failed'} in {took:.1f} s", file=self.stream, flush=True)


@contextlib.contextmanager
def silence_native_stderr(enabled: bool = True):
    """Point file descriptor 2 at /dev/null while the body runs; yields a stream on the
    original stderr (``sys.stderr`` itself when it is not descriptor 2, e.g. under pytest)."""
    try:
        real = sys.stderr.fileno() == 2
    except (AttributeError, ValueError, OSError):
        real = False
    if not enabled or not real:
        yield sys.stderr
        return
    sys.stderr.flush()
    saved = os.dup(2)
    stream = os.fdopen(os.dup(saved), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    old_stderr = sys.stderr
    sys.stderr = stream  # Python-level writes (tracebacks included) still reach the user
    try:
        yield stream
    finally:
        sys.stderr = old_stderr
        stream.flush()
        os.dup2(saved, 2)
        os.close(saved)
        stream.close()
