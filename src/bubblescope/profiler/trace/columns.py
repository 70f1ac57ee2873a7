"""The kept events' column chunks of an :class:`~.events.EventTables` turned into one set of numpy columns per
table (:func:`build_arrays`): the columns stage of a parse.

Column by column: each column's chunks are concatenated and freed before the next, rows are dropped
(unusable times, counted) and sorted by index arrays rather than by DataFrame copies, so the peak
is about the columns once plus one column; texts stay int32 codes into the shared vocabulary until a
frame is asked for (pandas strings then, :func:`~.frames.frame_of`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from .heap import release_freed_memory
from .pairs import pair_durations
from .schema import EXACT_US, FLOAT_COLUMNS, INT_COLUMNS, MAX_TIME_US, NA

if TYPE_CHECKING:
    from .events import EventTables

_SURROGATE = re.compile("[\ud800-\udfff]")  # a lone surrogate: text that cannot be UTF-8


def table_arrays(
    cols: EventTables, table: str, sort_by: tuple[str, ...] = (), na_fill: dict | None = None
) -> dict[str, Any]:
    """One table's chunks as numpy columns (ints int64 with ``NA`` for absent, texts int32 codes into
    the vocabulary, ``end_us`` after ``dur_us``); rows with non-finite ts/dur, a negative dur or
    |ts|/dur beyond 2^63 µs are dropped; absent ints in ``na_fill``'s columns take its value; rows
    are stably sorted by ``sort_by``. Column by column, so memory holds the columns once plus one."""
    import numpy as np

    columns = cols.columns[table]
    chunks = cols.chunks[table]
    # rows whose float ts lies beyond 2^53 µs (marked by rebase_times): counted below only if they are kept
    rounded = (np.concatenate([c.pop("rounded", None) if "rounded" in c else np.zeros(len(c["ts_us"]), dtype=bool)
                               for c in chunks]) if any("rounded" in c for c in chunks) else None)
    raw: dict[str, Any] = {}
    for key in columns:
        parts = [c[key] for c in chunks]
        for c in chunks:
            del c[key]  # free each column's chunks once concatenated
        if parts:
            raw[key] = np.concatenate(parts)
            del parts
            release_freed_memory()
        else:
            raw[key] = np.zeros(0, dtype=np.int64 if key in INT_COLUMNS else np.float64
                                if key in FLOAT_COLUMNS else object if key in ("grid", "block") else np.int32)
    cols.chunks[table] = []
    rows = None  # the rows kept, in output order (None: all, as read)
    if "dur_us" in raw:
        ts, dur = raw["ts_us"], raw["dur_us"]
        bad = ~(np.isfinite(ts) & np.isfinite(dur))
        negative = dur < 0
        huge = ~bad & ((np.abs(ts) > MAX_TIME_US) | (dur > MAX_TIME_US))
        if bad.any():
            cols.odd["complete events without a finite numeric ts/dur excluded"] += int(bad.sum())
        if negative.any():
            cols.odd["events with negative dur excluded"] += int(negative.sum())
        if huge.any():
            cols.odd["events with |ts| or dur beyond 2^63 µs excluded"] += int(huge.sum())
        drop = bad | negative | huge
        if drop.any():
            rows = np.flatnonzero(~drop)
            if table == "gpu":
                cols.gpu_excluded += int(drop.sum())
            if rounded is not None:
                rounded &= ~drop  # an excluded event is said once, by the reason it was excluded
    if rounded is not None and rounded.any():
        cols.odd[ROUNDED] += int(rounded.sum())
    for key, value in (na_fill or {}).items():
        raw[key][raw[key] == NA] = value
    if sort_by:
        keys = [raw[k] if rows is None else raw[k][rows] for k in reversed(sort_by)]
        order = np.lexsort(keys)  # stable: equal keys keep the file's order
        rows = order if rows is None else rows[order]
    data: dict[str, Any] = {}
    for key in columns:
        arr = raw.pop(key)
        data[key] = arr if rows is None else arr[rows]
        if key == "dur_us":
            data["end_us"] = data["ts_us"] + data["dur_us"]
    return data


def vocabulary(cols: EventTables) -> tuple[Any, Any]:
    """(texts of the codes as an object array, None or the code each code becomes): names with lone
    surrogates are repaired (counted in ``cols.bad_text``); when a repaired text equals another
    code's, both become the first one's code, so that one text has one code."""
    import numpy as np

    texts = np.empty(len(cols.vocab), dtype=object)
    for i, text in enumerate(cols.vocab):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = _SURROGATE.sub("\ufffd", text)
            cols.bad_text += 1
        else:
            cols.bad_text += "\ufffd" in text
        texts[i] = text
    if not cols.bad_text or len(set(texts.tolist())) == len(texts):
        return texts, None
    first: dict[str, int] = {}
    canon = np.array([first.setdefault(t, i) for i, t in enumerate(texts.tolist())], dtype=np.int32)
    return texts, canon


ROUNDED = "events with a non-integer ts beyond 2^53 µs kept, their times rounded by float64 (off by over 1 µs)"


def rebase_times(cols: EventTables) -> int:
    """Turn every table's ``ts_us`` chunks into float64 and return the trace's time origin (µs, an exact int).

    The origin is 0 (times as in the file) unless times were kept exact beyond what float64 holds: integer
    timestamps beyond 2^53 µs, where float64 loses whole µs (spacing 256 µs at 1.7e18), or times read as exact ns
    (timedelta64[ns] chunks: float ts beyond 2^43 µs, whose ns digits float64 loses, such as Kineto's absolute
    ``1733456789012345.678``). Then it is the smallest such time's whole µs, subtracted exactly before the
    conversion, so times, durations and gaps stay exact (to the ns). Float timestamps beyond 2^53 µs were rounded
    when parsed; they are shifted by the same origin and marked (a ``rounded`` mask in their chunk), to be counted
    in ``cols.odd`` (:data:`ROUNDED`) by :func:`table_arrays` when the row is kept: a ts beyond 2^63 µs or not
    finite is excluded there, and said once, as excluded."""
    import numpy as np

    chunks = [c for table in cols.chunks.values() for c in table if len(c["ts_us"])]
    ints = [c["ts_us"] for c in chunks if c["ts_us"].dtype == np.int64]
    nss = [c["ts_us"].view(np.int64) for c in chunks if c["ts_us"].dtype.kind == "m"]
    nss = [v[v != NA] for v in nss]
    nss = [v for v in nss if len(v)]
    origin = 0
    if ints:
        low, high = min(int(a.min()) for a in ints), max(int(a.max()) for a in ints)
        if max(-low, high) > EXACT_US and high - low < 1 << 62:  # no int64 overflow in ts - origin
            origin = low
    if nss:  # whole µs of the smallest exact time (ns floored to µs), ints' included
        low_ns = min(int(v.min()) for v in nss)
        origin = min(low_ns // 1000, min(int(a.min()) for a in ints)) if ints else low_ns // 1000
    for c in chunks:
        ts = c["ts_us"]
        if ts.dtype == np.int64:
            c["ts_us"] = (ts - origin if origin else ts).astype(np.float64)
        elif ts.dtype.kind == "m":  # exact ns: µs from the origin, NaT (absent) as NaN
            ns = ts.view(np.int64)
            out = (ns - origin * 1000).astype(np.float64) / 1000.0
            out[ns == NA] = np.nan
            c["ts_us"] = out
        else:  # finite and within 2^63 µs: beyond, table_arrays excludes the row (and says so) instead
            rounded = np.isfinite(ts) & (np.abs(ts) > EXACT_US) & (np.abs(ts) <= MAX_TIME_US)
            if rounded.any():
                c["rounded"] = rounded
            if origin:
                c["ts_us"] = ts - float(origin)
    return origin


def build_arrays(cols: EventTables) -> tuple[Any, dict[str, dict[str, Any]]]:
    """(texts of the codes, one :func:`table_arrays` dict per table): the B/E pairs made complete
    events and kept, pending event dicts typed, times rebased (:func:`rebase_times`, the origin in
    ``cols.origin_us``); gpu sorted by (device, ts_us) with device -1 where
    unknown, runtime and annotations by ts_us, flows as read."""
    import numpy as np

    for ev in pair_durations(cols.pairs, cols.odd):
        cols.add_complete(ev)
    cols.pairs = []
    cols.flush()
    cols.origin_us = rebase_times(cols)
    texts, canon = vocabulary(cols)
    tables = {
        "gpu": table_arrays(cols, "gpu", ("device", "ts_us"), {"device": -1}),  # -1: device unknown
        "runtime": table_arrays(cols, "runtime", ("ts_us",)),
        "annotations": table_arrays(cols, "annotations", ("ts_us",)),
        "flows": table_arrays(cols, "flows"),
    }
    if canon is not None:
        for data in tables.values():
            for key, arr in data.items():
                if arr.dtype == np.int32:
                    data[key] = canon[arr]
    return texts, tables
