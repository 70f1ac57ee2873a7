"""Which trace events are kept, and how their fields become typed, cleaned numpy columns.

:class:`_Columns` keeps the events of each table (GPU activities, runtime/driver calls, annotations,
flows) as typed numpy column chunks: int64 ids (a sentinel for "absent"), float64 times, int32 codes
into one shared vocabulary for names, shared tuples for grid/block. Rows arrive column-wise from the
batch decoder (:mod:`.tracebatch`) or one event dict at a time (:meth:`_Columns.add`, for text the
batch decoder refuses: NaN literals, lone surrogates, odd types), then become whole columns per
table at the end (:meth:`_Columns.arrays`, built by :mod:`.traceframes`); rows with unusable times
are dropped and every oddity is counted for ``Trace.warnings``. ``B``/``E`` duration events are paired into complete events
(:mod:`.tracepairs`).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from decimal import Decimal, InvalidOperation
from typing import Any

# Chrome-trace category -> activity kind. Old Kineto wrote the capitalised names.
GPU_KINDS = {
    "kernel": "kernel",
    "Kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "Memcpy": "memcpy",
    "gpu_memset": "memset",
    "Memset": "memset",
}
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "Runtime", "cuda_driver", "Driver"})
# torch's legacy autograd profiler (torch.autograd.profiler ``EventList.export_chrome_trace``, torch 1.x with
# use_cuda=True) writes complete events without a category: operators on pid "CPU functions" (tid the thread),
# kernels on pid "CUDA functions" with tid the device index, linked to their operator only by flow events. Its
# kernels are GPU kernels (device = tid, stream unknown); it records no launch call.
LEGACY_GPU_PID = "CUDA functions"
LEGACY_KERNELS = ("kernels of a legacy autograd-profiler export (pid 'CUDA functions', no category) read as GPU "
                  "kernels of device tid, stream unknown; that format records no launch calls, so launch and "
                  "per-step figures are unavailable (a torch.profiler trace has them)")
FLOW_PHASES = frozenset({"s", "t", "f"})
# Every phase of the Trace Event Format (duration B/E, complete X, instant i/I, counter C, async b/n/e and the
# deprecated S/T/p/F, flow s/t/f, sample P, object N/O/D, metadata M, memory dump V/v, mark R, clock sync c,
# context ( and ), linked id =). An event of another phase (or none) is ignored, as viewers do, and counted.
PHASES = frozenset("BEXiICbneSTpFstfPNODMVvRc()=")
UNKNOWN_PHASE = "events of an unknown phase (ph) ignored"
_NA = -(1 << 63)  # int64 sentinel for "absent" in int columns
# |ts| or dur beyond this (2^63 µs) is corrupt: spans and sums of such times overflow float64 to inf.
_MAX_TIME_US = float(1 << 63)
# Beyond 2^53 µs (~285 years after 1970 in µs; ns written as µs reach ~1.7e18) float64 cannot hold every integer
# µs: integer ts are then rebased onto the trace's smallest one before they become floats (traceframes).
_EXACT_US = 1 << 53
# Beyond 2^43 µs (~8.8e12: Kineto's absolute epoch times are ~1.7e15) float64's spacing exceeds 1 ns, so the three
# decimals of ns that Kineto writes after the µs are lost. Such ts are read from their text, exactly, as int64 ns
# (numpy timedelta64[ns] columns) and rebased onto the trace's first µs before they become floats (traceframes).
NS_EXACT_US = 1 << 43
_LONG_NUMBER = 16  # characters: a number written this long may hold more digits than float64 keeps
_SURROGATE = re.compile("[\ud800-\udfff]")
# Where an int column's values come from, as the warnings name it (others: pid, tid, or args.<column>); a GPU
# activity's device and stream fall back on its pid and tid when args has none.
INT_LABELS = {("flows", "id"): "flow id", ("gpu", "device"): "args.device (or pid)",
              ("gpu", "stream"): "args.stream (or tid)"}
# What an int that is not one becomes, as the warnings say it; by default null. The GPU table's unknown device is
# -1 (traceframes.build_arrays), which the reports show.
INT_NULL_SHOWN = {"args.device (or pid)": "-1 (device unknown)"}


def _float(value: Any) -> float:
    """A JSON number, or a string holding one (the Trace Event Format's writers use both), as float;
    NaN for anything else (null, bools, text, ints beyond float)."""
    if type(value) is float:
        return value
    if type(value) is int:
        try:
            return float(value)
        except OverflowError:
            return math.nan
    if type(value) is str or type(value) is Decimal:
        try:
            return float(value)
        except (ValueError, OverflowError):
            return math.nan
    return math.nan


def long_float(text: str) -> float | str:
    """A JSON float literal as float, or as its text when it is long enough to hold more digits than float64
    keeps (``1733456789012345.678``: µs since the epoch with ns); the JSON decoders' float hook, so that such a
    ``ts`` can be read exactly (:func:`exact_ns`). Strings are what the Trace Event Format allows for numbers."""
    return float(text) if len(text) < _LONG_NUMBER else text


def exact_ns(value: Any) -> int | None:
    """A time in µs (an int, a float, a numeric string or a Decimal) as an exact integer of ns (rounded half to
    even below 1 ns); None when it is no finite number."""
    if type(value) is int:
        return value * 1000
    if type(value) is str:  # the common form, µs with up to 3 decimals, without Decimal's cost
        whole, dot, frac = value.strip().partition(".")
        digits = whole[1:] if whole[:1] in "+-" else whole
        if digits.isdigit() and digits.isascii() and (not dot or (len(frac) <= 3 and frac.isdigit()
                                                                  and frac.isascii())):
            ns = int(frac.ljust(3, "0")) if frac else 0
            return int(whole) * 1000 + (-ns if whole.startswith("-") else ns)
    try:
        d = Decimal(repr(value)) if type(value) is float else Decimal(value.strip() if type(value) is str else value)
    except (InvalidOperation, TypeError, ValueError):
        return None
    if not d.is_finite():
        return None
    return int(d.scaleb(3).to_integral_value())


def _int(value: Any) -> int | None:
    """An int64 id from an int, an integral float or a numeric string; None for anything else."""
    if type(value) is float and value.is_integer():
        value = int(value)
    elif type(value) is str:
        try:
            value = int(value)
        except ValueError:
            number = _float(value)
            value = int(number) if math.isfinite(number) and number.is_integer() else None
    if type(value) is int and -(1 << 63) <= value < (1 << 63):
        return value
    return None


_GPU_COLUMNS = (
    "name",
    "kind",
    "device",
    "stream",
    "ts_us",
    "dur_us",
    "correlation",
    "external_id",
    "grid",
    "block",
    "registers_per_thread",
    "shared_memory_bytes",
    "blocks_per_sm",
    "warps_per_sm",
    "occupancy_pct",
)
_RUNTIME_COLUMNS = ("name", "category", "pid", "tid", "ts_us", "dur_us", "correlation", "external_id")
_ANNOTATION_COLUMNS = ("name", "pid", "tid", "ts_us", "dur_us")
_FLOW_COLUMNS = ("id", "phase", "ts_us", "pid", "tid", "cat")
_INT_COLUMNS = frozenset({"device", "stream", "correlation", "external_id", "pid", "tid", "id"})
_FLOAT_COLUMNS = frozenset({"ts_us", "dur_us", *_GPU_COLUMNS[10:]})
# Complete-event category -> the table it goes to (a GPU kind, "runtime" or "annotation").
_X_TABLES = {**GPU_KINDS, **{c: "runtime" for c in RUNTIME_CATEGORIES}, "user_annotation": "annotation"}
# str: a numeric string, parsed with the column (non-numeric: excluded then); Decimal: an exact time (tracepairs)
_NUMBER = (int, float, str, Decimal)
_EMPTY: dict = {}
_PLAIN_NUMBERS = frozenset({int, float, type(None)})
TABLE_COLUMNS = {"gpu": _GPU_COLUMNS, "runtime": _RUNTIME_COLUMNS, "annotations": _ANNOTATION_COLUMNS,
                 "flows": _FLOW_COLUMNS}
# What a summary never reads (load_trace(lean=True) leaves it out): launch ids and kernel shapes.
_LEAN_DROPPED = frozenset({"external_id", "grid", "block", "shared_memory_bytes", "blocks_per_sm", "warps_per_sm",
                           "occupancy_pct"})
LEAN_COLUMNS = {t: tuple(c for c in cols if c not in _LEAN_DROPPED) for t, cols in TABLE_COLUMNS.items()}
_FLUSH_ROWS = 1 << 16  # event dicts kept as tuples before they become typed columns


class _Columns:
    """The kept events of each table as typed column chunks, turned into frames once by :meth:`frames`.

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
        self.dims: dict[tuple, tuple | None] = {}  # one shared tuple per distinct grid/block
        self.pairs: list[dict] = []  # B/E events, paired into complete events by frames()
        self.odd: Counter[str] = Counter()
        self.bad_ints: Counter[str] = Counter()
        self.bad_text = 0
        self.events = 0
        self.origin_us = 0  # what was subtracted from every ts (µs, exact; traceframes.rebase_times)
        self.exact_times = False  # batches decode ts from their text (ts beyond float64's ns seen; tracebatch)
        self.gpu_excluded = 0  # GPU activities (kernel, memcpy, memset) dropped for unusable times, of all reasons

    # ---- the per-event fallback -----------------------------------------------------------
    def add(self, ev: Any) -> None:
        self.events += 1
        if type(ev) is not dict:
            self.odd["non-object entries in traceEvents ignored"] += 1
            return
        ph = ev.get("ph")
        if ph == "X":
            self.add_complete(ev)
        elif type(ph) is str and ph in FLOW_PHASES and self.keep_flows:
            self._pend(
                "flows", (ev.get("id", _NA), ph, ev.get("ts"), ev.get("pid", _NA), ev.get("tid", _NA), ev.get("cat"))
            )
        elif ph == "B" or ph == "E":
            self.pairs.append(ev)
        elif type(ph) is not str or ph not in PHASES:
            self.odd[UNKNOWN_PHASE] += 1

    def add_complete(self, ev: dict) -> None:
        """One complete (``X``) event dict, or a paired ``B``/``E`` made into one."""
        cat = ev.get("cat")
        try:
            table = _X_TABLES.get(cat)
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
            row = (name, cat, ev.get("pid", _NA), ev.get("tid", _NA), ts, dur, args.get("correlation", _NA),
                   args.get("External id", args.get("external id", _NA)))
            self._pend("runtime", row)
        elif table == "annotation":
            self._pend("annotations", (name, ev.get("pid", _NA), ev.get("tid", _NA), ts, dur))
        else:
            if legacy:
                self.odd[LEGACY_KERNELS] += 1
                args = {"device": ev.get("tid", _NA), "stream": _NA, **args}
            row = (
                name,
                table,
                args.get("device", ev.get("pid", _NA)),
                args.get("stream", ev.get("tid", _NA)),
                ts,
                dur,
                args.get("correlation", _NA),
                args.get("External id", args.get("external id", _NA)),
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
            if key in _INT_COLUMNS:
                label = INT_LABELS.get((table, key)) or (key if key in ("pid", "tid") else "args." + key)
                chunk[key] = self._ints(vals, label)
            elif key == "ts_us":
                chunk[key] = self._times(vals)
            elif key in _FLOAT_COLUMNS:
                chunk[key] = self._floats(vals)
            elif key in ("grid", "block"):
                chunk[key] = np.fromiter(self._dims(vals), dtype=object, count=len(vals))  # never a 2-D array
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
                i = _int(v)
                if i is None:
                    clean.append(_NA)
                    if v is not None:
                        self.bad_ints[column] += 1
                else:
                    clean.append(i)
            arr = np.array(clean, dtype=np.int64)
        return arr

    @classmethod
    def _times(cls, values: list) -> Any:
        """Timestamps: int64 when every value is an integer within int64, timedelta64[ns] (exact ns) when some
        value written as text (a long float, a string) lies beyond float64's ns (:data:`NS_EXACT_US`), both kept
        exact until the trace's origin is known (:func:`.traceframes.rebase_times`); else float64 as
        :meth:`_floats`."""
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
        floats = cls._floats(values)
        big = np.isfinite(floats) & (np.abs(floats) >= NS_EXACT_US)
        if not big.any():
            return floats
        ns = [exact_ns(v) for v in values]
        limit = 1 << 63
        if any(n is not None and not -limit < n < limit for n in ns):  # beyond int64 ns: float64 (rounded)
            return floats
        out = np.array([_NA if n is None else n for n in ns], dtype=np.int64).view("m8[ns]")  # _NA is NaT
        return out

    @staticmethod
    def time_checks(ts: Any) -> tuple[Any, Any]:
        """(finite, zero) masks of a :meth:`_times` column (float64, int64 or timedelta64[ns])."""
        import numpy as np

        if ts.dtype.kind == "m":
            return ~np.isnat(ts), ts.view(np.int64) == 0
        return np.isfinite(ts), ts == 0

    @staticmethod
    def _floats(values: list) -> Any:
        import numpy as np

        if isinstance(values, np.ndarray):
            return values.astype(np.float64, copy=False)
        try:
            # dtype=None first: numpy would parse strings and bools itself, unlike _float.
            arr = np.array(values) if len(values) else np.zeros(0)
            if arr.ndim == 1 and arr.dtype.kind in "if":
                return arr.astype(np.float64, copy=False)
            if arr.ndim == 1 and set(map(type, values)) <= _PLAIN_NUMBERS:  # numbers and nulls
                return np.array(values, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):
            pass
        return np.array([_float(v) for v in values], dtype=np.float64)

    def _dims(self, values: list) -> list:
        """[8, 1, 1] -> (8, 1, 1), one shared tuple per distinct value; None unless a list of ints."""
        seen = self.dims
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

    # ---- frames -----------------------------------------------------------------------------
    def arrays(self) -> tuple[Any, dict[str, dict[str, Any]]]:
        """(texts of the codes, numpy columns per table), see :func:`.traceframes.build_arrays`; the
        column chunks are consumed."""
        from .traceframes import build_arrays

        return build_arrays(self)
