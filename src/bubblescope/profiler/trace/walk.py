"""Walk the JSON text of a Chrome trace: the top level key by key, the ``traceEvents`` entries handed on.

:func:`parse` walks the top-level object (or a bare event array) on a :class:`~.window.Text` and keeps
every other key as metadata. Inside ``traceEvents``, the whole events of each window are handed to
:func:`~.batch.add_batch` (msgspec, one call per window), or to worker processes (:mod:`.workers`) for a
large file; what msgspec refuses, and the event cut off at a window's end, go one at a time to
:meth:`~.events.EventTables.add`. Malformed or truncated text raises a one-line ``ValueError`` naming the
character position.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .window import COMMA, TRUNCATED, batch_end

if TYPE_CHECKING:
    from .events import EventTables
    from .window import Text
    from .workers import Workers

_BATCH_TRIES = 3  # cuts tried per window before reading it event by event


def parse(text: Text, cols: EventTables, workers: Workers | None = None) -> tuple[dict, bool]:
    """Walk the top level of ``text``, keeping the events in ``cols`` (windows decoded by ``workers`` when given).

    Returns:
        ``(metadata, had_events_array)``: every top-level key but ``traceEvents``, and whether that array was
        there (a bare event array counts as one).

    Raises:
        ValueError: malformed or truncated JSON, or JSON that is no trace (one line, with the character
            position); what the reader thread raises (OSError, EOFError, zlib.error) passes through.
    """
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
            raise text.error("expected ',' or '}'" if c else f"file ends early {TRUNCATED}")


def _end(text: Text) -> None:
    """After the top-level value: only whitespace may follow (the Trace Event Format has one JSON value per
    file); anything else, such as a second document appended to the file, raises a one-line error."""
    if text.peek():
        raise text.error("data after the end of the trace (one JSON value per file)")


def _add_batches(text: Text, cols: EventTables) -> bool | None:
    """Decode every whole event from the cursor to the window's last "}," with msgspec at once.

    A "}," inside a string or a nested object makes the text up to it invalid JSON, so msgspec refuses
    it rather than splitting an event; the cut is then tried again, one event earlier. Returns True
    when events were decoded, None when the window holds no cut, False when msgspec refused the text
    (odd values), so the caller reads this window event by event.
    """
    from .batch import add_batch  # looked up per call: tests replace it to force the per-event path

    buf, pos, hi = text.buf, text.pos, len(text.buf)
    if not buf.startswith("{", pos):
        return None
    for _ in range(_BATCH_TRIES):
        end = batch_end(buf, pos, hi)
        if end < 0:
            return None
        if add_batch(cols, buf[pos : end + 1]):
            text.pos = COMMA.match(buf, end + 1).end()
            return True
        hi = end
    return False


def _parse_events(text: Text, cols: EventTables, allow_unclosed: bool, workers: Workers | None = None) -> None:
    text.pos += 1  # the '['
    add = cols.add
    if text.peek() == "]":
        text.pos += 1
        return
    scan, comma = text.scanner, COMMA.match
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
            raise text.error("expected ',' or ']' in traceEvents" if c else f"file ends early {TRUNCATED}")
