"""Each kept trace event typed into its table's column chunks (:class:`EventTables`), the events stage of a parse.

Rows arrive column-wise from the batch decoder (:mod:`.batch`: the whole events of a text window in one
msgspec call) or one event dict at a time (:meth:`EventTables.add`, for text the batch decoder refuses: NaN
literals, lone surrogates, odd types); both give the same typed chunks: int64 ids (:data:`~.schema.NA` for
"absent"), float64 times (exact ints or ns where float64 would lose digits), int32 codes into one shared
vocabulary for names, shared tuples for grid/block. ``B``/``E`` duration events are kept aside, to be paired
into complete events (:mod:`.pairs`) when the chunks become whole columns (:func:`.columns.build_arrays`);
every oddity is counted for ``Trace.warnings``.
"""

from __future__ import annotations

from collections import Counter
from decimal import Decimal
from typing import Any

from .schema import (
    FLOAT_COLUMNS,
    FLOW_PHASES,
    GPU_KINDS,
    INT_COLUMNS,
    INT_LABELS,
    LEAN_COLUMNS,
    LEGACY_GPU_PID,
    LEGACY_KERNELS,
    NA,
    NS_EXACT_US,
    PHASES,
    TABLE_COLUMNS,
    UNKNOWN_PHASE,
    X_TABLES,
)
from .opevents import CpuOpRows
from .values import as_float, as_int, exact_ns

# str: a numeric string, parsed with the column (non-numeric: excluded then); Decimal: an exact time (pairs)
_NUMBER = (int, float, str, Decimal)
_EMPTY: dict = {}
_PLAIN_NUMBERS = frozenset({int, float, type(None)})
_FLUSH_ROWS = 1 << 16  # event dicts kept as tuples before they become typed columns


class EventTables:
    """The kept events of each table as typed column chunks, made whole columns once by
    :func:`.columns.build_arrays`.

    :meth:`extend` takes one batch of rows column-wise (lists of raw JSON values) and types it at once,
    so memory holds numpy arrays, not Python objects per event. :meth:`add` takes one event dict (the
    fallback path) and keeps a tuple until :data:`_FLUSH_ROWS` of them are typed together.
    """

    def __init__(self, keep_flows: bool = True, lean: bool = False) -> None:
        self.keep_flows = keep_flows  # flow events (a quarter of a Kineto trace) are no metric's input
        self.lean = lean
        self.columns = LEAN_COLUMNS if lean else TABLE_COLUMNS  # the columns kept per table
        self.pending: dict[str, list[tuple]] = {t: [] for t in TABLE_COLUMNS}
        self.chunks: dict[str, list[dict]] = {t: [] for t in TABLE_COLUMNS}
        self.vocab: list[str] = []  # code -> text of every name, category, kind and phase
        self.codes: dict[str, int] = {}
        self.shapes: dict[tuple, tuple | None] = {}  # one shared tuple per distinct grid/block
        self.pairs: list[dict] = []  # B/E events, paired into complete events by columns.build_arrays
        self.odd: Counter[str] = Counter()
        self.bad_ints: Counter[str] = Counter()
        self.bad_text = 0
        self.events = 0
        self.origin_us = 0  # what was subtracted from every ts (µs, exact; columns.rebase_times)
        self.exact_times = False  # batches decode ts from their text (ts beyond float64's ns seen; batch)
        self.gpu_excluded = 0  # GPU activities (kernel, memcpy, memset) dropped for unusable times, of all reasons
        self.cpu_ops = CpuOpRows()  # operator events, kept apart: no table holds them, the host-time figures read them

    # ---- the per-event fallback -----------------------------------------------------------
    def add(self, ev: Any) -> None:
        self.events += 1
        if type(ev) is not dict:
            self.odd["non-object entries in traceEvents ignored"] += 1
            return
        ph = ev.get("ph")
        if ph == "X":
            self.cpu_ops.add(ev)
            self.add_complete(ev)
        elif type(ph) is str and ph in FLOW_PHASES and self.keep_flows:
            self._pend(
                "flows", (ev.get("id", NA), ph, ev.get("ts"), ev.get("pid", NA), ev.get("tid", NA), ev.get("cat"))
            )
        elif ph == "B" or ph == "E":
            self.pairs.append(ev)
        elif type(ph) is not str or ph not in PHASES:
            self.odd[UNKNOWN_PHASE] += 1

    def add_complete(self, ev: dict) -> None:
        """One complete (``X``) event dict, or a paired ``B``/``E`` made into one."""
        cat = ev.get("cat")
        try:
            table = X_TABLES.get(cat)
        except TypeError:  # a list or object as category: no table of ours
            table = None
        name = ev.get("name")
        legacy = False
        if table is None:
            if cat is None and ev.get("pid") == LEGACY_GPU_PID:
                table, legacy = "kernel", True
            elif cat not in ("cpu_op", "Operator") or not str(name).startswith("ProfilerStep#"):
                return
            else:
                table = "annotation"  # old torch wrote ProfilerStep#N as a CPU op
        ts, dur = ev.get("ts"), ev.get("dur")
        if type(ts) not in _NUMBER or type(dur) not in _NUMBER:
            self.odd["complete events without a finite numeric ts/dur excluded"] += 1
            self.gpu_excluded += table in GPU_KINDS.values()
            return
        if ts == 0 and dur == 0:
            self.odd["events with ts 0 and dur 0 excluded"] += 1
            self.gpu_excluded += table in GPU_KINDS.values()
            return
        args = ev.get("args")
        if type(args) is not dict:
            args = _EMPTY
        if table == "runtime":
            row = (name, cat, ev.get("pid", NA), ev.get("tid", NA), ts, dur, args.get("correlation", NA),
                   args.get("External id", args.get("external id", NA)))
            self._pend("runtime", row)
        elif table == "annotation":
            self._pend("annotations", (name, ev.get("pid", NA), ev.get("tid", NA), ts, dur))
        else:
            if legacy:
                self.odd[LEGACY_KERNELS] += 1
                args = {"device": ev.get("tid", NA), "stream": NA, **args}
            row = (
                name,
                table,
                args.get("device", ev.get("pid", NA)),
                args.get("stream", ev.get("tid", NA)),
                ts,
                dur,
                args.get("correlation", NA),
                args.get("External id", args.get("external id", NA)),
                args.get("grid"),
                args.get("block"),
                args.get("registers per thread"),
                args.get("shared memory"),
                args.get("blocks per SM"),
                args.get("warps per SM"),
                args.get("est. achieved occupancy %"),
            )
            self._pend("gpu", row)

    def _pend(self, table: str, row: tuple) -> None:
        rows = self.pending[table]
        rows.append(row)
        if len(rows) >= _FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        """Type the pending event tuples (kept in arrival order before any later batch)."""
        for table, rows in self.pending.items():
            if rows:
                columns = TABLE_COLUMNS[table]
                self.extend(table, {c: [row[i] for row in rows] for i, c in enumerate(columns)})
                rows.clear()

    # ---- typed columns ----------------------------------------------------------------------
    def extend(self, table: str, values: dict[str, list]) -> None:
        """Append one batch of rows of ``table``, given column-wise as raw JSON values (only the
        columns of :attr:`columns` are read)."""
        import numpy as np

        chunk: dict[str, Any] = {}
        for key in self.columns[table]:
            vals = values[key]
            if key in INT_COLUMNS:
                label = INT_LABELS.get((table, key)) or (key if key in ("pid", "tid") else "args." + key)
                chunk[key] = self._ints(vals, label)
            elif key == "ts_us":
                chunk[key] = self.times(vals)
            elif key in FLOAT_COLUMNS:
                chunk[key] = self.floats(vals)
            elif key in ("grid", "block"):
                chunk[key] = np.fromiter(self.dims(vals), dtype=object, count=len(vals))  # never a 2-D array
            else:
                chunk[key] = self.encode(vals)
        self.chunks[table].append(chunk)

    def encode(self, values: list) -> Any:
        """Texts (str, or null/other values as ``str()``/"") as int32 codes into :attr:`vocab`."""
        import numpy as np

        codes = self.codes
        try:
            uniq = dict.fromkeys(values)
        except TypeError:  # unhashable names (lists): their text
            values = [v if type(v) is str else ("" if v is None else str(v)) for v in values]
            uniq = dict.fromkeys(values)
        local = {}
        for v in uniq:
            text = v if type(v) is str else ("" if v is None else str(v))
            code = codes.get(text)
            if code is None:
                code = codes[text] = len(self.vocab)
                self.vocab.append(text)
            local[v] = code
        return np.fromiter(map(local.__getitem__, values), dtype=np.int32, count=len(values))

    def _ints(self, values: list, column: str) -> Any:
        import numpy as np

        try:
            arr = np.array(values) if len(values) else np.zeros(0, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):  # lists of uneven length among them
            arr = None
        if arr is None or arr.dtype != np.int64 or arr.ndim != 1:  # None, floats, strings, lists, beyond int64
            clean = []
            for v in values:
                i = as_int(v)
                if i is None:
                    clean.append(NA)
                    if v is not None:
                        self.bad_ints[column] += 1
                else:
                    clean.append(i)
            arr = np.array(clean, dtype=np.int64)
        return arr

    @classmethod
    def times(cls, values: list) -> Any:
        """Timestamps: int64 when every value is an integer within int64, timedelta64[ns] (exact ns) when some
        value written as text (a long float, a string) lies beyond float64's ns (:data:`NS_EXACT_US`), both kept
        exact until the trace's origin is known (:func:`.columns.rebase_times`); else float64 as
        :meth:`floats`."""
        import numpy as np

        if isinstance(values, np.ndarray):
            return values if values.dtype == np.int64 or values.dtype.kind == "m" \
                else values.astype(np.float64, copy=False)
        try:
            arr = np.array(values) if len(values) else None
        except (TypeError, ValueError, OverflowError):
            arr = None
        if arr is not None and arr.ndim == 1 and arr.dtype == np.int64:
            return arr
        if arr is not None and arr.ndim == 1 and arr.dtype.kind in "if":  # numbers only: nothing more exact to read
            return arr.astype(np.float64, copy=False)
        floats = cls.floats(values)
        big = np.isfinite(floats) & (np.abs(floats) >= NS_EXACT_US)
        if not big.any():
            return floats
        ns = [exact_ns(v) for v in values]
        limit = 1 << 63
        if any(n is not None and not -limit < n < limit for n in ns):  # beyond int64 ns: float64 (rounded)
            return floats
        out = np.array([NA if n is None else n for n in ns], dtype=np.int64).view("m8[ns]")  # NA is NaT
        return out

    @staticmethod
    def time_checks(ts: Any) -> tuple[Any, Any]:
        """(finite, zero) masks of a :meth:`times` column (float64, int64 or timedelta64[ns])."""
        import numpy as np

        if ts.dtype.kind == "m":
            return ~np.isnat(ts), ts.view(np.int64) == 0
        return np.isfinite(ts), ts == 0

    @staticmethod
    def floats(values: list) -> Any:
        import numpy as np

        if isinstance(values, np.ndarray):
            return values.astype(np.float64, copy=False)
        try:
            # dtype=None first: numpy would parse strings and bools itself, unlike as_float.
            arr = np.array(values) if len(values) else np.zeros(0)
            if arr.ndim == 1 and arr.dtype.kind in "if":
                return arr.astype(np.float64, copy=False)
            if arr.ndim == 1 and set(map(type, values)) <= _PLAIN_NUMBERS:  # numbers and nulls
                return np.array(values, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):
            pass
        return np.array([as_float(v) for v in values], dtype=np.float64)

    def dims(self, values: list) -> list:
        """[8, 1, 1] -> (8, 1, 1), one shared tuple per distinct value; None unless a list of ints."""
        seen = self.shapes
        if all(type(v) is tuple or v is None for v in values):  # from the batch decoder: ints already
            return [v if v is None else seen.setdefault(v, v) for v in values]
        out = []
        for v in values:
            if type(v) is list:
                key = tuple(v)
                try:
                    if key not in seen:
                        seen[key] = key if all(type(x) is int for x in key) else None
                    out.append(seen[key])
                except TypeError:  # nested lists or objects: unhashable, and not dims anyway
                    out.append(None)
            else:
                out.append(None)
        return out
