"""User-facing errors.

Every problem caused by the user's input (a path, a file, an option) is raised as a
:class:`BubblescopeError` whose message is one line naming the input and what is wrong.
The CLI prints that line and exits with code 2, without a traceback.
"""

from __future__ import annotations

import errno
import os


class BubblescopeError(Exception):
    """Bad input: the message is a one-line explanation fit for the terminal."""


class EngineUnavailable(BubblescopeError):
    """An engine cannot run here (no GPU, no Triton, unsupported model feature).

    ``diagnose`` lists such an engine as ``skipped`` with this message as the reason.
    """


class OutputNotWritten(BubblescopeError):
    """An output file could not be written: the disk is full (ENOSPC), the file is over the size limit (EFBIG,
    ``ulimit -f``), or another I/O error. It is never one engine's failure: the command stops (exit code 2), no
    temporary file is left, and the previous outputs stay as they were.

    ``path`` is the file that failed and ``reason`` the OS error's text (``File too large``), so that a caller
    that staged the file elsewhere can name it where the user will look for it.
    """

    def __init__(self, message: str, path: str | os.PathLike | None = None, reason: str | None = None):
        super().__init__(message)
        self.path = None if path is None else os.fspath(path)
        self.reason = reason


def os_reason(exc: OSError) -> str:
    """The OS error's own words (``File too large``, ``No space left on device``), or its type's name."""
    return exc.strerror or (os.strerror(exc.errno) if exc.errno else type(exc).__name__)


class KernelStuck(RuntimeError):
    """A megakernel task waited past its spin cap (a dependency that never arrived).

    This is a bug in the schedule or the kernel, not bad input; the message names the task.
    """


# OSErrors that say what is wrong with a path as named (too long, not searchable, a file where a folder should be,
# a symlink loop, no permission, a read-only file system), not that the program went wrong.
_PATH_ERRNOS = frozenset(getattr(errno, name) for name in ("ENAMETOOLONG", "EACCES", "EPERM", "ENOTDIR", "ELOOP",
                                                           "EROFS", "EISDIR") if hasattr(errno, name))


def path_error(e: BaseException) -> str | None:
    """The one-line message (``<path>: <strerror>``) of an OSError about a path the user named, else None.

    Only an OSError that carries a filename and one of the path errnos above (ENAMETOOLONG, EACCES, ENOTDIR,
    ELOOP, ...) qualifies: one without a filename, or with another errno, is a bug to see in full.
    """
    if not isinstance(e, OSError) or e.filename is None or e.errno not in _PATH_ERRNOS:
        return None
    name = os.fsdecode(e.filename) if isinstance(e.filename, (str, bytes, os.PathLike)) else str(e.filename)
    if not name.isprintable():  # a newline or control character would break the one line
        name = repr(name)
    return f"{name}: {e.strerror or os.strerror(e.errno)}"
