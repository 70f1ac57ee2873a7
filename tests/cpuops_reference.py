"""An independent reading of a trace's top-level CPU operators, for tests: the whole file through ``json`` (gzip
by its magic bytes), the operator events typed by the rules ``profiler/trace/opevents.py`` states, and the
top-level pick done in plain Python, to hold the parse's operators (``cpuops.parsed_cpu_ops``) against.

Rules: a complete (``X``) event of category ``cpu_op`` or ``Operator`` whose name is text and whose ``ts`` and
``dur`` are finite numbers (or strings holding one), ``dur`` not negative; its thread is ``(str(pid), str(tid))``
(an absent one ``"None"``), its end ``ts + dur``. Per thread, in (start, later end first, file order) order, an
operator that starts before the end of the last one kept is nested and left out. The thread with most kept
operators (ties: the larger ``(pid, tid)`` text) is the one returned.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from pathlib import Path

import numpy as np


def _time(value) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return out if math.isfinite(out) else None


def _id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        return zlib.crc32(text.encode("utf-8", "replace"))
    return value if -(1 << 63) < value < (1 << 63) else zlib.crc32(text.encode())


def reference_cpu_ops(path: str | Path) -> dict[str, np.ndarray] | None:
    """``{"name", "pid", "tid", "ts_us", "end_us"}`` of the busiest thread's top-level operators (as
    ``cpuops.top_level_ops`` returns them), or None when the trace holds no operator."""
    raw = Path(path).read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    events = doc if isinstance(doc, list) else doc.get("traceEvents", [])
    ops = []  # (thread, start, end, name, file order)
    for i, ev in enumerate(events):
        if not isinstance(ev, dict) or ev.get("ph") != "X" or ev.get("cat") not in ("cpu_op", "Operator"):
            continue
        ts, dur, name = _time(ev.get("ts")), _time(ev.get("dur")), ev.get("name")
        if type(name) is not str or ts is None or dur is None or dur < 0:
            continue
        ops.append(((str(ev.get("pid")), str(ev.get("tid"))), ts, ts + dur, name, i))
    if not ops:
        return None
    kept: dict[tuple[str, str], list] = {}
    for thread, start, end, name, _ in sorted(ops, key=lambda o: (o[0], o[1], -o[2], o[4])):
        mine = kept.setdefault(thread, [])
        if mine and start < mine[-1][1]:
            continue
        mine.append((start, end, name))
    thread = max(kept, key=lambda t: (len(kept[t]), t))
    rows = kept[thread]
    return {"name": np.array([r[2] for r in rows], dtype=object),
            "pid": np.full(len(rows), _id(thread[0]), dtype=np.int64),
            "tid": np.full(len(rows), _id(thread[1]), dtype=np.int64),
            "ts_us": np.array([r[0] for r in rows], dtype=np.float64),
            "end_us": np.array([r[1] for r in rows], dtype=np.float64)}
