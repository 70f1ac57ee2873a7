"""The sliding window of decoded text a parse works on, and where the whole events in it end.

:class:`Text` holds the text of the file from the cursor on, refilled window by window from the
:class:`~.file.Reader`, and scans one JSON value at a time with the standard library's C scanner (long
float literals kept as text, :func:`~.values.long_float`). :func:`batch_end` finds the last event boundary
in a window, where the batch decoder (:mod:`.walk`) or a worker process (:mod:`.workers`) cuts it.
Malformed or truncated text raises a one-line ``ValueError`` naming the character position.
"""

from __future__ import annotations

import json
import json.scanner
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .values import long_float

if TYPE_CHECKING:
    from .file import Reader

_MAX_EVENT_CHARS = 1 << 26  # one event larger than 64 Mi characters is treated as malformed
_MAX_COMMAS = 4096  # '{' looked at from a window's end for the start of an event
_WS = re.compile(r"[ \t\n\r]*")
_NUMBER_TAIL = re.compile(r"[0-9.eE+\-]*")
COMMA = re.compile(r"[ \t\n\r]*,[ \t\n\r]*")  # the separator between two events
# The words of every "the file stops here" error (here and in .walk), which `profile` reads as a trace whose last
# write failed (a full disk) rather than a bad trace.
TRUNCATED = "(truncated?)"


class Text:
    """A sliding window over the decoded file from which JSON values are scanned one at a time."""

    def __init__(self, reader: Reader, progress: Callable[[int], None] | None = None):
        self._reader = reader
        self._progress = progress  # called with the bytes of the file read so far, after each refill
        self.buf = ""
        self.pos = 0
        self.offset = 0  # characters dropped from the front of buf so far
        self.eof = False
        # long float literals stay text (values.long_float), so that a ts beyond float64's ns is read exactly
        self.scanner = json.scanner.make_scanner(json.JSONDecoder(parse_float=long_float))

    def fill(self) -> bool:
        if self.eof:
            return False
        chunk, done = self._reader.get()
        if not chunk:
            self.eof = True
            return False
        self.offset += self.pos
        self.buf = self.buf[self.pos :] + chunk
        self.pos = 0
        if self._progress is not None:
            self._progress(done)
        return True

    def peek(self) -> str:
        """Skip whitespace; return the next character ('' at end of file)."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.fill():
                return ""

    def value(self) -> Any:
        """Scan one JSON value after the cursor, reading more text while it may just be cut off."""
        if not self.peek():
            raise self.error(f"file ends early {TRUNCATED}")
        while True:
            try:
                obj, end = self.scanner(self.buf, self.pos)
                # A number followed by nothing but number characters up to the window's end may
                # continue in the next chunk ("-1" of "-1.5"; a long float comes as str); objects end unambiguously.
                if self.eof or (
                    end < len(self.buf)
                    and (type(obj) not in (int, float, str) or not _NUMBER_TAIL.fullmatch(self.buf, end))
                ):
                    self.pos = end
                    return obj
            except StopIteration as exc:
                # Raised where a value should start (also inside an object: {"a": tr), e.g. for
                # a literal cut short; its value is that position.
                at = exc.value if isinstance(exc.value, int) else self.pos
                if self.eof or at < len(self.buf) - 8:
                    raise self.error("expected a JSON value", at) from None
            except json.JSONDecodeError as exc:
                # The scanner reports a value cut by the window's end near that end, or as an
                # unterminated string; anything else is malformed input.
                cut = exc.pos >= len(self.buf) - 8 or exc.msg.startswith("Unterminated string")
                if self.eof or not cut or len(self.buf) - self.pos > _MAX_EVENT_CHARS:
                    what = f"ends inside a JSON value {TRUNCATED}" if self.eof and cut else exc.msg
                    raise self.error(what, exc.pos) from None
            if not self.fill():
                self.eof = True

    def error(self, what: str, pos: int | None = None) -> ValueError:
        at = self.offset + (self.pos if pos is None else pos)
        return ValueError(f"invalid JSON at character {at}: {what}")


def batch_end(buf: str, pos: int, hi: int) -> int:
    """Index of the last ``}`` in ``buf[pos:hi]`` followed by a comma and a ``{`` (whitespace allowed
    between): the end of an event when that ``}`` closes one at the top level of the array (kernel
    names such as ``{lambda(float)#1}, std::array`` hold "}," but rarely "}, {"); -1 if none is near
    the end of the window."""
    ws = " \t\n\r"
    for _ in range(_MAX_COMMAS):
        p = buf.rfind("{", pos, hi)
        if p <= pos:
            return -1
        q = p - 1
        while q > pos and buf[q] in ws:
            q -= 1
        if buf[q] == ",":
            q -= 1
            while q > pos and buf[q] in ws:
                q -= 1
            if buf[q] == "}":
                return q
        hi = p
    return -1
