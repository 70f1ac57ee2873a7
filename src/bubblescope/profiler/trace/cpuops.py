"""The top-level CPU operators of a trace, for finding decode steps in a trace without GPU activity and for the
host's time per step by operator (:mod:`.hostops`).

The trace's tables keep GPU activities, CUDA API calls and ``record_function`` ranges, not torch's operator events
(category ``cpu_op``, ``Operator`` in old exports), which no GPU metric reads. A CPU-only run has nothing else: its
decode steps show only as a repeating sequence of operators; a host-bound one spends its step in them. The parse
keeps those events apart (:class:`~.opevents.CpuOps`, ``TraceArrays.cpu_ops``) and :func:`parsed_cpu_ops` picks
the top-level ones, once per trace and only when asked: operators not inside another operator of their thread
(``aten::linear``, not the ``aten::addmm`` it calls), the calls a decode loop makes. :func:`read_cpu_ops` gives
the same from a file read on its own (msgspec decodes only the few fields read here, a piece of the text at a time).
"""

from __future__ import annotations

import os
import re
import zlib
from array import array
from collections.abc import Iterator
from contextlib import closing
from typing import TYPE_CHECKING, Any

from ...errors import BubblescopeError
from .file import open_text_bytes
from .opevents import CPU_OP_CATEGORIES, CpuOps, number

if TYPE_CHECKING:
    import numpy as np

    from .arrays import TraceArrays

# Text decoded at a time: the events of a piece are built, filtered and dropped before the next is read (4 MiB
# pieces read a 530 MB trace faster than 32 MiB ones, in half the memory).
PIECE_BYTES = 1 << 22
_LOOP_ROWS = 1 << 16
_MAX_TRIES = 4096  # '{' looked at from a piece's end for the start of an event
_WS, _COMMA, _CLOSE = b" \t\n\r", ord(","), ord("}")
_NEXT = re.compile(rb"[ \t\n\r]*,[ \t\n\r]*")  # the separator after an event's end


def _doc_type() -> Any:
    """The msgspec type of a trace document with only the fields this module reads (others skipped unbuilt)."""
    import msgspec

    event = msgspec.defstruct("CpuOpEvent", [(k, Any, None) for k in ("ph", "cat", "name", "pid", "tid", "ts",
                                                                       "dur")])
    return msgspec.defstruct("CpuOpTrace", [("traceEvents", list[event], [])])


def read_cpu_ops(path: str | os.PathLike) -> dict[str, np.ndarray] | None:
    """The top-level CPU operators of the busiest thread of trace ``path``, in time order, or None when the
    file cannot be read again or holds none.

    Returns:
        ``{"name": object array of str, "pid", "tid": int64 (the thread's, repeated), "ts_us", "end_us":
        float64 µs}``. Top level: an operator whose start lies within an earlier operator of the same thread
        (pid, tid), ending no later than it, is nested and left out. The thread is the one with most top-level
        operators (the decode loop's; a data-loader thread has fewer).
    """
    import msgspec
    import numpy as np

    # Kept compactly (a large trace has millions of operators): codes and times in typed arrays, one string per
    # distinct name and thread.
    threads: dict[tuple[str, str], int] = {}  # (pid, tid) as text -> code
    texts: dict[str, int] = {}  # operator name -> code
    thread, name, ts, end = array("q"), array("q"), array("d"), array("d")
    try:
        for events in _pieces(path):
            for ev in events:
                if ev.ph != "X" or ev.cat not in CPU_OP_CATEGORIES or type(ev.name) is not str:
                    continue
                t, dur = ev.ts, ev.dur
                if type(t) is not float or type(dur) is not float or t - t or dur - dur:  # not both finite floats
                    t, dur = number(t), number(dur)
                    if t is None or dur is None:
                        continue
                if dur < 0:
                    continue
                thread.append(threads.setdefault((str(ev.pid), str(ev.tid)), len(threads)))
                name.append(texts.setdefault(ev.name, len(texts)))
                ts.append(t)
                end.append(t + dur)
    except (OSError, EOFError, zlib.error, BubblescopeError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    if not ts:
        return None
    return top_level_ops(CpuOps(names=np.array(list(texts), dtype=object), name=np.frombuffer(name, dtype=np.int64),
                                threads=list(threads), thread=np.frombuffer(thread, dtype=np.int64),
                                ts_us=np.frombuffer(ts, dtype=np.float64), end_us=np.frombuffer(end, dtype=np.float64)))


def parsed_cpu_ops(arrays: TraceArrays) -> dict[str, np.ndarray] | None:
    """:func:`top_level_ops` of the operators the parse of ``arrays`` kept (``arrays.cpu_ops``), computed once per
    trace (kept in ``arrays.cache``): what :func:`read_cpu_ops` reads from its file, without reading it again. None
    when the trace holds no operator, or was not read by the parse (built from frames made otherwise)."""
    if "cpu_ops" not in arrays.cache:
        arrays.cache["cpu_ops"] = top_level_ops(arrays.cpu_ops)
    return arrays.cache["cpu_ops"]


def top_level_ops(ops: CpuOps | None) -> dict[str, np.ndarray] | None:
    """The top-level operators of the busiest thread of ``ops``, in time order, as :func:`read_cpu_ops` returns
    them; None when ``ops`` is None or empty. Equal (thread, start, end) keep the order of ``ops`` (the file's)."""
    import numpy as np

    if ops is None or not len(ops):
        return None
    keys = ops.threads  # by code
    rank = np.empty(len(keys), dtype=np.int64)  # each thread's place in (pid, tid) text order
    rank[sorted(range(len(keys)), key=keys.__getitem__)] = np.arange(len(keys))
    code, t0, t1 = ops.thread, ops.ts_us, ops.end_us
    # per thread by start, an enclosing op before its child (one thread, the usual case, needs no thread key)
    order = np.lexsort((-t1, t0, rank[code]) if len(keys) > 1 else (-t1, t0))
    kept, last, reach = array("q"), -1, 0.0
    for lo in range(0, len(order), _LOOP_ROWS):  # as Python numbers a block at a time
        rows = order[lo:lo + _LOOP_ROWS]
        for i, c, a, b in zip(rows.tolist(), code[rows].tolist(), t0[rows].tolist(), t1[rows].tolist()):
            if c == last and a < reach:  # starts inside an earlier op of the thread: nested
                continue
            last, reach = c, b
            kept.append(i)
    kept = np.frombuffer(kept, dtype=np.int64)
    per = np.bincount(code[kept], minlength=len(keys))
    main = max(range(len(keys)), key=lambda k: (per[k], keys[k]))
    mine = kept[code[kept] == main]
    pid, tid = (_int(v) for v in keys[main])
    return {"name": ops.names[ops.name[mine]], "pid": np.full(len(mine), pid, dtype=np.int64),
            "tid": np.full(len(mine), tid, dtype=np.int64), "ts_us": t0[mine], "end_us": t1[mine]}


def _pieces(path: str | os.PathLike) -> Iterator[list]:
    """The trace's events, decoded :data:`PIECE_BYTES` of text at a time (a large trace's whole text and its
    decoded events never held at once): lists of the events of :func:`_doc_type`.

    The text is cut after an event, where a ``}`` closes it and ``, {`` opens the next (past the
    ``traceEvents`` key): each piece is made a document of its own (the head closed with ``]}``, the others
    opened with ``{"traceEvents": [``), and decodes only when the cut closed an event at the top level of the
    array (a cut inside a string or a nested object leaves it unbalanced). When a piece does not decode, the
    file is decoded whole instead.

    Raises:
        OSError, EOFError, zlib.error: the file cannot be read; msgspec.DecodeError / ValidationError: it is
            no JSON trace.
    """
    import msgspec

    decoder = msgspec.json.Decoder(_doc_type())
    with closing(open_text_bytes(os.fspath(path))) as f:
        buf, first = f.read(PIECE_BYTES), True
        bare = buf.lstrip()[:1] == b"["  # the JSON-array form of the Trace Event Format
        while True:
            more = f.read(PIECE_BYTES)
            if not more:
                break
            buf += more
            lo = (buf.find(b"[") + 1 if bare else buf.find(b'"traceEvents"')) if first else 0
            cut = _cut(buf, lo) if lo > 0 or not first else -1
            if cut < 0:
                continue
            piece, buf = buf[:cut + 1], buf[_NEXT.match(buf, cut + 1).end():]
            if first:
                text = (b'{"traceEvents": ' + piece + b"]}") if bare else piece + b"]}"
            else:
                text = b'{"traceEvents": [' + piece + b"]}"
            try:
                events = decoder.decode(text).traceEvents
            except (msgspec.DecodeError, msgspec.ValidationError):
                yield from _whole(path, decoder)
                return
            first = False
            yield events
        if first:
            text = (b'{"traceEvents": ' + buf + b"}") if bare else buf
        else:
            text = b'{"traceEvents": [' + buf + (b"}" if bare else b"")
        yield decoder.decode(text).traceEvents


def _whole(path: str | os.PathLike, decoder: Any) -> Iterator[list]:
    """The file's events decoded in one piece (a file whose cuts :func:`_pieces` could not place)."""
    with closing(open_text_bytes(os.fspath(path))) as f:
        raw = b"".join(iter(lambda: f.read(PIECE_BYTES), b""))
    if raw.lstrip()[:1] == b"[":  # the JSON-array form of the Trace Event Format
        raw = b'{"traceEvents": ' + raw + b"}"
    yield decoder.decode(raw).traceEvents


def _cut(buf: bytes, lo: int) -> int:
    """Index of the last ``}`` in ``buf[lo:]`` followed by a comma and a ``{`` (whitespace allowed between), where
    an event may end; -1 if none is found near the end."""
    hi = len(buf)
    for _ in range(_MAX_TRIES):
        p = buf.rfind(b"{", lo, hi)
        if p <= lo:
            return -1
        q = p - 1
        while q > lo and buf[q] in _WS:
            q -= 1
        if buf[q] == _COMMA:
            q -= 1
            while q > lo and buf[q] in _WS:
                q -= 1
            if buf[q] == _CLOSE:
                return q
        hi = p
    return -1


def _int(text: str) -> int:
    """A pid or tid as int64 (a named one, as some exporters write, hashed into the positive range)."""
    try:
        value = int(text)
    except ValueError:
        return zlib.crc32(text.encode("utf-8", "replace"))
    return value if -(1 << 63) < value < (1 << 63) else zlib.crc32(text.encode())
