"""Kineto's start/stop marker lines, kept off the user's stderr without hiding Kineto's real messages.

torch 2.13's libkineto writes ``USDT:<date> <pid>:<tid> SyncActivityProfilerHandler.cpp:52] profiler_start``
(and ``...:59] profiler_stop``) to the process's stderr (C++ ``std::cerr``, file descriptor 2) every time a
``torch.profiler.profile`` starts or stops. ``USDT`` is Kineto's highest log severity, above ``ERROR``, so
``KINETO_LOG_LEVEL`` could only hide these lines together with Kineto's errors (measured with torch 2.13.0:
levels 0-5 print them, 6 prints nothing at all). Instead, :func:`drop_kineto_markers` points descriptor 2 at
a temporary file while the profiler starts or stops, then writes back every line except those two markers.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from contextlib import contextmanager

# Kineto's log prefix is "<SEVERITY>:<date> <time> <pid>:<tid> <file>:<line>] <message>".
_MARKER = re.compile(rb"USDT:[^\]\n]*\] profiler_(start|stop)\r?\n?")


def strip_markers(data: bytes) -> bytes:
    """``data`` (bytes written to stderr) without Kineto's ``USDT ... profiler_start`` / ``profiler_stop``
    lines; every other byte is kept, in order."""
    return b"".join(line for line in data.splitlines(keepends=True) if not _MARKER.fullmatch(line))


@contextmanager
def drop_kineto_markers():
    """Inside the block, file descriptor 2 goes to a temporary file; on exit whatever was written there
    (by C++ or Python) goes to the real stderr minus Kineto's start/stop markers (:func:`strip_markers`).

    Wrap only the profiler's ``start()`` / ``stop()`` calls: output inside the block reaches the terminal
    at its end, not as it is written. Where descriptor 2 cannot be duplicated (closed), nothing is
    redirected. Raises nothing of its own."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            try:
                sys.stderr.flush()
            except (OSError, ValueError, AttributeError):
                pass
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = memoryview(strip_markers(tmp.read()))
            while kept:
                kept = kept[os.write(2, kept):]


@contextmanager
def quiet_start_stop(prof):
    """``with prof:`` for a ``torch.profiler.profile``, its ``__enter__`` and ``__exit__`` (where Kineto
    starts and stops) inside :func:`drop_kineto_markers`; the block's own stderr output stays live."""
    with drop_kineto_markers():
        prof.__enter__()
    try:
        yield prof
    except BaseException:
        with drop_kineto_markers():
            if not prof.__exit__(*sys.exc_info()):
                raise
    else:
        with drop_kineto_markers():
            prof.__exit__(None, None, None)
