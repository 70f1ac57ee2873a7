"""Stream the JSON text of a Chrome trace: walk the top level, hand the ``traceEvents`` entries on.

A :class:`~.tracefile._Reader` thread reads the file and decodes it to text window by window;
:class:`_Text` is the sliding window the parser works on.
:func:`_parse` walks the top-level object key by key (or a bare event array) with the standard
library's C scanner and keeps every other key as metadata. Inside ``traceEvents``, the whole events
of each window are handed to :func:`~bubblescope.profiler.tracebatch.add_batch` (msgspec, one call
per window); what it refuses, and the event cut off at a window's end, go one at a time to
:meth:`~bubblescope.profiler.tracecolumns._Columns.add`. Malformed or truncated text raises a
one-line ``ValueError`` naming the character position.
"""

from __future__ import annotations

import json
import json.scanner
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .tracecolumns import long_float

if TYPE_CHECKING:
    from .tracecolumns import _Columns
    from .tracefile import _Reader
    from .traceworkers import Workers

_MAX_EVENT_CHARS = 1 << 26  # one event larger than 64 Mi characters is treated as malformed
_MAX_COMMAS = 4096  # '{' looked at from a window's end for the start of an event
_BATCH_TRIES = 3  # cuts tried per window before reading it event by event
_WS = re.compile(r"[ \t\n\r]*")
_NUMBER_TAIL = re.compile(r"[0-9.eE+\-]*")
_COMMA = re.compile(r"[ \t\n\r]*,[ \t\n\r]*")


class _Text:
    """A sliding window over the decoded file from which JSON values are scanned one at a time."""

    def __init__(self, reader: _Reader, progress: Callable[[int], None] | None = None):
        self._reader = reader
        self._progress = progress  # called with the bytes of the file read so far, after each refill
        self.buf = ""
        self.pos = 0
        self.offset = 0  # characters dropped from the front of buf so far
        self.eof = False
        # long float literals stay text (tracecolumns.long_float), so that a ts beyond float64's ns is read exactly
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
            raise self.error("file ends early (truncated?)")
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
                    what = "ends inside a JSON value (truncated?)" if self.eof and cut else exc.msg
                    raise self.error(what, exc.pos) from None
            if not self.fill():
                self.eof = True

    def error(self, what: str, pos: int | None = None) -> ValueError:
        at = self.offset + (self.pos if pos is None else pos)
        return ValueError(f"invalid JSON at character {at}: {what}")

def _parse(text: _Text, cols: _Columns, workers: Workers | None = None) -> tuple[dict, bool]:
    """Walk the top level; stream ``traceEvents`` (windows decoded by ``workers`` when given);
    return (metadata, had_events_array)."""
    meta: dict = {}
    first = text.peek()
    if first == "[":  # the Chrome "JSON Array Format": a bare list of events, closing ] optional
        _parse_events(text, cols, True, workers)
        _end(text)
        if cols.events and cols.odd["non-object entries in traceEvents ignored"] == cols.events:
            raise ValueError("is a JSON array without a single event object")
        return meta, True
    if first != "{":
        if first == "":
            raise ValueError("is empty")
        text.value()  # raises "invalid JSON" when it is not JSON at all
        raise ValueError("is JSON but not a trace (top level is not an object with traceEvents)")
    text.pos += 1
    found = False
    while True:
        c = text.peek()
        if c == "}":
            text.pos += 1
            _end(text)
            return meta, found
        key = text.value()
        if not isinstance(key, str) or text.peek() != ":":
            raise text.error("expected an object key")
        text.pos += 1
        if key == "traceEvents":
            if text.peek() != "[":
                raise ValueError("traceEvents is not an array")
            _parse_events(text, cols, False, workers)
            found = True
        else:
            meta[key] = text.value()
        c = text.peek()
        if c == ",":
            text.pos += 1
        elif c != "}":
            raise text.error("expected ',' or '}'" if c else "file ends early (truncated?)")


def _end(text: _Text) -> None:
    """After the top-level value: only whitespace may follow (the Trace Event Format has one JSON value per
    file); anything else, such as a second document appended to the file, raises a one-line error."""
    if text.peek():
        raise text.error("data after the end of the trace (one JSON value per file)")


def _batch_end(buf: str, pos: int, hi: int) -> int:
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


def _add_batches(text: _Text, cols: _Columns) -> bool | None:
    """Decode every whole event from the cursor to the window's last "}," with msgspec at once.

    A "}," inside a string or a nested object makes the text up to it invalid JSON, so msgspec refuses
    it rather than splitting an event; the cut is then tried again, one event earlier. Returns True
    when events were decoded, None when the window holds no cut, False when msgspec refused the text
    (odd values), so the caller reads this window event by event.
    """
    from .tracebatch import add_batch

    buf, pos, hi = text.buf, text.pos, len(text.buf)
    if not buf.startswith("{", pos):
        return None
    for _ in range(_BATCH_TRIES):
        end = _batch_end(buf, pos, hi)
        if end < 0:
            return None
        if add_batch(cols, buf[pos : end + 1]):
            text.pos = _COMMA.match(buf, end + 1).end()
            return True
        hi = end
    return False


def _parse_events(text: _Text, cols: _Columns, allow_unclosed: bool, workers: Workers | None = None) -> None:
    text.pos += 1  # the '['
    add = cols.add
    if text.peek() == "]":
        text.pos += 1
        return
    scan, comma = text.scanner, _COMMA.match
    while True:
        if workers is not None and workers.active:
            if workers.dispatch(text) and text.fill():
                continue
            workers.collect(text)  # every window in flight merged before anything is read here
        if _add_batches(text, cols) and text.fill():
            continue  # the window's cut-off last event, completed by the next window: batch again
        # Whatever the batch left in the window, event by event, kept in locals: whole event objects
        # separated by commas. It stops at anything else (an event cut by the window, the closing
        # bracket, bad JSON).
        buf, pos, size, need_value = text.buf, text.pos, len(text.buf), True
        while pos < size:
            try:
                ev, end = scan(buf, pos)
            except (StopIteration, json.JSONDecodeError):
                break
            if type(ev) is not dict or end >= size:
                break
            add(ev)
            m = comma(buf, end)
            if m is None:
                pos, need_value = end, False
                break
            pos = m.end()
        text.pos = pos
        if need_value:  # the careful path: refills the window, or raises a one-line error
            c = text.peek()
            if c == "]":  # after a trailing comma, as trace writers killed mid-way leave it
                text.pos += 1
                return
            if c == "" and allow_unclosed:
                return
            add(text.value())
        c = text.peek()
        if c == ",":
            text.pos += 1
            text.peek()
        elif c == "]":
            text.pos += 1
            return
        elif c == "" and allow_unclosed:
            return
        else:
            raise text.error("expected ',' or ']' in traceEvents" if c else "file ends early (truncated?)")
