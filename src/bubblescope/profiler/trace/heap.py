"""glibc heap settings while a trace is parsed: reuse freed pages instead of faulting in fresh ones.

Parsing allocates and frees a few text windows of megabytes per window (the decoded chunk, the
slice handed to msgspec). glibc serves such sizes with ``mmap`` or trims them off the heap top
once freed, so each new window touches fresh pages: a page fault per 4 KiB, which costs several
times the copy of the text itself. :func:`parse_heap` raises the mmap and
trim thresholds (``mallopt(3)``) for the parse and puts back glibc's defaults (128 KiB) and trims
after it. On other C libraries it does nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameter numbers (<malloc.h>)
_DEFAULT = 128 * 1024  # glibc's initial value of both
_MMAP_BELOW = 64 << 20  # text windows and per-window columns come from the heap; whole columns are mmap-ed
_TRIM_ABOVE = 32 << 20  # freed heap top kept for the next window up to this
_LIBC: Any = None


def libc() -> Any:
    """The C library (ctypes) when it has glibc's ``mallopt`` and ``malloc_trim``, else False."""
    global _LIBC
    if _LIBC is None:
        import ctypes
        import ctypes.util

        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC = lib if hasattr(lib, "mallopt") and hasattr(lib, "malloc_trim") else False
        except OSError:
            _LIBC = False
    return _LIBC


def release_freed_memory() -> None:
    """Hand freed heap pages back to the OS (glibc ``malloc_trim``; nothing elsewhere)."""
    lib = libc()
    if lib:
        lib.malloc_trim(0)


@contextlib.contextmanager
def parse_heap() -> Iterator[None]:
    """Within the block, freed heap memory up to 32 MiB is kept for reuse and blocks below 64 MiB
    come from the heap; after it, glibc's default thresholds are back and free pages are returned."""
    lib = libc()
    if lib:
        lib.mallopt(_M_MMAP_THRESHOLD, _MMAP_BELOW)
        lib.mallopt(_M_TRIM_THRESHOLD, _TRIM_ABOVE)
    try:
        yield
    finally:
        if lib:
            lib.mallopt(_M_MMAP_THRESHOLD, _DEFAULT)
            lib.mallopt(_M_TRIM_THRESHOLD, _DEFAULT)
            lib.malloc_trim(0)
