"""User-facing errors.

Every problem caused by the user's input (a path, a file, an option) is raised as a
:class:`BubblescopeError` whose message is one line naming the input and what is wrong.
The CLI prints that line and exits with code 2, without a traceback.
"""

from __future__ import annotations


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
