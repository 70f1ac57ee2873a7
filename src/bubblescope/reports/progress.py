"""A rich progress bar on stderr while large trace files are read (``diagnose trace``).

Only files of at least :data:`MIN_BYTES` get a bar, and only when stderr is a terminal, so piped or
captured output stays clean. The bar counts bytes of the file as stored (compressed for ``.gz``).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator

MIN_BYTES = 4 << 20  # 4 MiB on disk: about 1 s of reading; smaller files finish before a bar helps


@contextlib.contextmanager
def trace_progress(force: bool = False) -> Iterator[Callable[[str], Callable[[int, int], None] | None]]:
    """Yield ``for_file(path)``, which returns a ``(done_bytes, total_bytes)`` callback drawing that
    file's bar, or None for a small file (or when stderr is not a terminal, unless ``force``)."""
    if not force and not _stderr_is_tty():  # no bar to draw: spare the rich import (~50 ms of start-up)
        yield lambda path: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(stderr=True)
    progress = Progress(
        TextColumn("reading {task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not (force or console.is_terminal),
    )

    def for_file(path: str) -> Callable[[int, int], None] | None:
        try:
            size = os.path.getsize(path)
        except OSError:
            return None  # the reader reports the missing or unreadable file
        if size < MIN_BYTES:
            return None
        task = progress.add_task(os.path.basename(path), total=size)
        return lambda done, total: progress.update(task, completed=done, total=total)

    with progress:
        yield for_file


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False
