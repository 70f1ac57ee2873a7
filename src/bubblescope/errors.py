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
