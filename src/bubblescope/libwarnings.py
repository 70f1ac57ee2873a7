"""Warnings of the libraries bubblescope drives (torch, transformers, Triton, matplotlib, numpy), captured instead
of printed over the report, and said once each as a short note.

Two channels carry them: Python's :mod:`warnings` (torch turns its C++ ``TORCH_WARN`` into a ``UserWarning``
there) and the libraries' :mod:`logging` loggers (transformers logs through its own handler on stderr).
:func:`library_warnings` records both while its block runs and restores both afterwards; :func:`notes` turns the
records into one line per distinct warning, with how often it came.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from dataclasses import dataclass
from pathlib import PurePath

# Loggers of libraries that print through a handler of their own (not only through the root logger).
LOGGERS = ("transformers", "torch", "triton", "huggingface_hub", "tokenizers", "matplotlib", "numexpr")
# Warning categories Python's default filters hide outside __main__: not shown here either.
HIDDEN = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)
MESSAGE_WIDTH = 200  # characters of a warning's first line kept in its note


@dataclass(frozen=True)
class Captured:
    """One warning: which library (``torch``), its kind (``UserWarning``, or a log level), its first line."""

    source: str
    kind: str
    message: str


def _source(filename: str) -> str:
    """The installed package a warning was raised in (``…/site-packages/torch/profiler/x.py`` → ``torch``), or ""
    when it was raised elsewhere: a warning from a library's C++ code (torch's ``TORCH_WARN``) carries the file of
    the Python line that called it, which names the caller, not the library."""
    parts = PurePath(filename).parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts and parts.index(marker) + 1 < len(parts):
            return PurePath(parts[parts.index(marker) + 1]).stem
    return ""


def _first_line(text) -> str:
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= MESSAGE_WIDTH else line[: MESSAGE_WIDTH - 1] + "…"


class _Collect(logging.Handler):
    def __init__(self, into: list[Captured]) -> None:
        super().__init__(logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001  (a malformed log call must not break the run)
            message = str(record.msg)
        self.into.append(Captured(record.name.split(".")[0], record.levelname.lower(), _first_line(message)))


@contextlib.contextmanager
def library_warnings(into: list[Captured] | None = None):
    """Record, instead of printing, every Python warning and every WARNING-or-worse record of the :data:`LOGGERS`
    while the block runs; yields the list (``into``, or a new one) of :class:`Captured` as they come. Filters,
    ``showwarning`` and the loggers' handlers are restored on exit, whatever happens in the block.

    A handler a library adds to its logger inside the block is held back until the block ends, then kept, with the
    ``propagate`` the library left: transformers installs its stderr handler when it is first imported, which
    bubblescope does lazily, inside the block."""
    into = [] if into is None else into
    handler = _Collect(into)
    saved = []
    for name in LOGGERS:
        logger = logging.getLogger(name)
        late: list[logging.Handler] = []
        saved.append((logger, list(logger.handlers), logger.propagate, late, logger.__dict__.get("addHandler")))
        logger.handlers = [handler]
        logger.propagate = False
        logger.addHandler = late.append  # an instance attribute: shadows Logger.addHandler until restored
    try:
        with warnings.catch_warnings():  # restores the filters and showwarning on exit
            warnings.simplefilter("always")  # counted here, said once by notes()
            for hidden in HIDDEN:  # what Python does not show by default stays unshown
                warnings.simplefilter("ignore", hidden)

            def keep(message, category, filename, lineno, file=None, line=None):  # in order with the log records
                into.append(Captured(_source(filename), category.__name__, _first_line(message)))
            warnings.showwarning = keep
            yield into
    finally:
        for logger, handlers, propagate, late, own_add in saved:
            if own_add is None:
                del logger.addHandler
            else:
                logger.addHandler = own_add
            logger.handlers = handlers + [h for h in late if h not in handlers]
            logger.propagate = logger.propagate if late else propagate


def notes(captured: list[Captured]) -> list[str]:
    """One line per distinct warning, in the order first seen: ``torch UserWarning: <first line> (3 times)``, the
    source left out where it is not known (:func:`_source`), a logger's records as ``transformers warning: ...``."""
    counts: dict[Captured, int] = {}
    for c in captured:
        counts[c] = counts.get(c, 0) + 1
    return [f"{c.source + ' ' if c.source else ''}{c.kind}: {c.message}" + (f" ({n} times)" if n > 1 else "")
            for c, n in counts.items()]
