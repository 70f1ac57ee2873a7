"""The top-level CPU operators of a trace, for finding decode steps in a trace without GPU activity.

The trace parser keeps GPU activities, CUDA API calls and ``record_function`` ranges, not torch's operator
events (category ``cpu_op``, ``Operator`` in old exports), which no GPU metric reads. A CPU-only run has nothing
else: its decode steps show only as a repeating sequence of operators. This module reads those events from the
file on their own (msgspec decodes only the few fields read here), only when they are needed, and
keeps the top-level ones: operators not inside another operator of their thread (``aten::linear``, not the
``aten::addmm`` it calls), the calls a decode loop makes.
"""

from __future__ import annotations

import gzip
import os
import zlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

CPU_OP_CATEGORIES = frozenset({"cpu_op", "Operator"})


def _doc_type() -> Any:
    """The msgspec type of a trace document with only the fields this module reads (others skipped unbuilt)."""
    import msgspec

    event = msgspec.defstruct("CpuOpEvent", [(k, Any, None) for k in ("ph", "cat", "name", "pid", "tid", "ts",
                                                                       "dur")])
    return msgspec.defstruct("CpuOpTrace", [("traceEvents", list[event], [])])


def _number(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return out if out == out and abs(out) != float("inf") else None


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

    doc_type = _doc_type()
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        if raw.lstrip()[:1] == b"[":  # the JSON-array form of the Trace Event Format
            raw = b'{"traceEvents": ' + raw + b"}"
        doc = msgspec.json.decode(raw, type=doc_type)
    except (OSError, EOFError, zlib.error, msgspec.DecodeError, msgspec.ValidationError):
        return None
    rows = []
    for ev in doc.traceEvents:
        if ev.ph != "X" or ev.cat not in CPU_OP_CATEGORIES or not isinstance(ev.name, str):
            continue
        ts, dur = _number(ev.ts), _number(ev.dur)
        if ts is None or dur is None or dur < 0:
            continue
        rows.append((str(ev.pid), str(ev.tid), ts, ts + dur, ev.name))
    if not rows:
        return None
    rows.sort(key=lambda r: (r[0], r[1], r[2], -r[3]))  # per thread by start; an enclosing op before its child
    top = []
    reach = {}
    for pid, tid, ts, end, name in rows:
        key = (pid, tid)
        if key in reach and ts < reach[key]:  # starts inside an earlier op of the thread: nested
            continue
        reach[key] = end
        top.append((key, ts, end, name))
    threads: dict = {}
    for key, *_ in top:
        threads[key] = threads.get(key, 0) + 1
    main = max(threads, key=lambda k: (threads[k], k))
    mine = [r for r in top if r[0] == main]
    pid, tid = (_int(v) for v in main)
    return {"name": np.array([r[3] for r in mine], dtype=object),
            "pid": np.full(len(mine), pid, dtype=np.int64), "tid": np.full(len(mine), tid, dtype=np.int64),
            "ts_us": np.array([r[1] for r in mine], dtype=float), "end_us": np.array([r[2] for r in mine], dtype=float)}


def _int(text: str) -> int:
    """A pid or tid as int64 (a named one, as some exporters write, hashed into the positive range)."""
    try:
        value = int(text)
    except ValueError:
        return zlib.crc32(text.encode("utf-8", "replace"))
    return value if -(1 << 63) < value < (1 << 63) else zlib.crc32(text.encode())
