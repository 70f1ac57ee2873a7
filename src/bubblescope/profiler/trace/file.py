"""Read a trace file as text, window by window, in a thread beside the parser: the first stage of a parse.

:func:`open_trace` tells gzip from plain JSON by the magic bytes; :class:`_Gunzip` inflates gzip
members in large pieces (ISA-L when installed, :func:`_inflater`); :class:`Reader` decodes UTF-8
(invalid bytes replaced, a byte-order mark skipped) and queues the windows for
:class:`~.window.Text`.
"""

from __future__ import annotations

import codecs
import os
import queue
import stat
import threading
import zlib
from typing import Any

from ...errors import BubblescopeError

_CHUNK_CHARS = 1 << 22  # decoded characters read per refill (4 Mi)
_FIRST_CHARS = 1 << 18  # the first refill: parsing starts after 256 Ki characters, not 4 Mi, are inflated


def check_regular(path: str) -> None:
    """Refuse, before it is opened, a path that is neither a regular file nor a pipe this process already holds
    (``<(cmd)``, ``/dev/stdin`` fed by ``|``): opening a named pipe (FIFO) waits for a writer, maybe forever, and a
    device or socket is no trace file. A missing path or a directory is left to ``open`` to report.

    Raises:
        BubblescopeError: ``"<path>: not a regular file (a named pipe); pass a file"`` (or a device, a socket).
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return
    if stat.S_ISFIFO(mode) and "/fd/pipe:[" in os.path.realpath(path):  # an anonymous pipe: it has a writer
        return
    what = "a named pipe" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) \
        else "a socket" if stat.S_ISSOCK(mode) else "not a file"
    raise BubblescopeError(f"{path}: not a regular file ({what}); pass a file")


def open_trace(path: str) -> tuple[Any, bool]:
    """(the file opened for reading bytes, whether it is gzip): by the gzip magic, not the suffix.
    Pipes are read as they come (nothing here seeks).

    Raises:
        BubblescopeError: not a regular file or a pipe (:func:`check_regular`).
        OSError: the file cannot be opened (missing, a directory, no permission); the caller names the file.
    """
    check_regular(path)
    raw = open(path, "rb")  # noqa: SIM115 - closed by the caller
    head = raw.peek(2)[:2] if hasattr(raw, "peek") else b""
    return raw, head == b"\x1f\x8b"


def _inflater() -> Any:
    """A gzip decompressor: ISA-L's (``isal``, about twice zlib's speed on x86-64 and ARM) when it is
    installed, else zlib's; both have zlib's ``decompressobj`` interface."""
    try:
        from isal import isal_zlib
    except ImportError:
        return zlib.decompressobj(wbits=31)
    return isal_zlib.decompressobj(wbits=31)


class _Gunzip:
    """gzip members (RFC 1952; several in a row, as ``cat a.gz b.gz`` gives) inflated in large
    pieces (:func:`_inflater`): each call releases the GIL for the whole piece, which ``gzip.GzipFile``
    (128 KiB steps of Python code) does not, so inflation overlaps the JSON decoding on another core."""

    def __init__(self, raw: Any):
        self._raw = raw
        self._inflate = _inflater()

    def close(self) -> None:
        self._raw.close()

    def read(self, size: int) -> bytes:
        """About 8-10× ``size`` // 8 bytes of JSON text; b"" at the end. EOFError when the file ends
        inside a member, zlib.error when it is corrupt."""
        while True:
            data = self._raw.read(max(1, size // 8))
            if not data:
                if not self._inflate.eof:
                    raise EOFError("compressed file ended before the end-of-stream marker was reached")
                return b""
            out = []
            while data:
                if self._inflate.eof:
                    if not data.strip(b"\0"):  # zero padding after the last member, as gzip allows
                        break
                    self._inflate = _inflater()
                try:
                    out.append(self._inflate.decompress(data))
                except Exception as exc:  # isal's IsalError is no zlib.error: one type for the caller
                    raise zlib.error(str(exc)) from None
                data = self._inflate.unused_data
            if any(out):
                return b"".join(out)


class _Counted:
    """A binary file whose reads are counted: the progress in bytes, also for a pipe (whose ``tell()`` raises
    "Illegal seek")."""

    def __init__(self, raw: Any):
        self._raw = raw
        self.done = 0

    def read(self, size: int) -> bytes:
        data = self._raw.read(size)
        self.done += len(data)
        return data


class Reader(threading.Thread):
    """Reads and decodes the file ahead of the parser, one window at a time, in its own thread.

    Inflating gzip releases the GIL, so on two cores it runs beside the JSON decoding; at most two
    windows wait in the queue. Errors (corrupt gzip, I/O) are handed over and raised by :meth:`get`.
    """

    def __init__(self, raw: Any, gz: bool):
        super().__init__(daemon=True, name="bubblescope-trace-reader")
        self._raw = _Counted(raw)
        self._binary = _Gunzip(self._raw) if gz else self._raw
        self._queue: queue.Queue = queue.Queue(maxsize=2)
        self._halt = threading.Event()
        # utf-8-sig: a byte-order mark some Windows tools write is skipped, not a JSON error. Invalid
        # UTF-8 in kernel names must not stop the parse: decoded with U+FFFD replacement.
        self._decoder = codecs.getincrementaldecoder("utf-8-sig")(errors="replace")

    def run(self) -> None:
        try:
            size = min(_FIRST_CHARS, _CHUNK_CHARS)
            while not self._halt.is_set():
                data = self._binary.read(size)
                size = _CHUNK_CHARS
                text = self._decoder.decode(data, final=not data)
                if text or not data:
                    self._put((text, self._raw.done, None))
                if not data:
                    return
        except BaseException as exc:  # noqa: BLE001 - re-raised in the parsing thread by get()
            self._put(("", 0, exc))

    def _put(self, item: tuple) -> None:
        while not self._halt.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def get(self) -> tuple[str, int]:
        """(next decoded text, '' at the end; bytes of the file read so far)."""
        text, done, exc = self._queue.get()
        if exc is not None:
            raise exc
        return text, done

    def close(self) -> None:
        self._halt.set()
        self.join()
