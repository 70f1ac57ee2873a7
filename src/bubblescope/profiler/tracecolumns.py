"""Which trace events are kept, and how their fields become typed, cleaned pandas columns.

:class:`_Columns` receives every decoded event: complete events of the GPU, runtime/driver and
annotation categories and flow events are kept as one tuple each (names interned), all else is
dropped. :meth:`_Columns.frames` turns the tuples into one frame per table at the end, column by
column: nullable int64 for ids, float64 for times, tuples for grid/block, text for names; rows
with unusable times are dropped and every oddity is counted for ``Trace.warnings``.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

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
FLOW_PHASES = frozenset({"s", "t", "f"})
_NA = -(1 << 63)  # int64 sentinel for "absent" in int columns
# |ts| or dur beyond this (2^63 µs) is corrupt: spans and sums of such times overflow float64 to inf.
_MAX_TIME_US = float(1 << 63)
_SURROGATE = re.compile("[\ud800-\udfff]")


def _float(value: Any) -> float:
    """A JSON number as float; NaN for anything else (strings, null, bools, ints beyond float)."""
    if type(value) is float:
        return value
    if type(value) is int:
        try:
            return float(value)
        except OverflowError:
            return math.nan
    return math.nan


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
_NUMBER = (int, float)
_EMPTY: dict = {}


class _Columns:
    """Rows of the kept events (tuples, names interned), turned into frames once by :meth:`frames`.

    :meth:`add` runs once per event, so it only checks types and appends; range checks, int64
    overflow and NaN are handled column-wise afterwards.
    """

    def __init__(self) -> None:
        self.gpu: list[tuple] = []
        self.runtime: list[tuple] = []
        self.annotations: list[tuple] = []
        self.flows: list[tuple] = []
        self.names: dict[str, str] = {}
        self.odd: Counter[str] = Counter()
        self.bad_ints: Counter[str] = Counter()
        self.events = 0

    def _name(self, raw: Any) -> str:
        if type(raw) is str:
            return self.names.setdefault(raw, raw)
        return self.names.setdefault(str(raw), str(raw)) if raw is not None else ""

    def add(self, ev: Any) -> None:
        self.events += 1
        if type(ev) is not dict:
            self.odd["non-object entries in traceEvents ignored"] += 1
            return
        ph = ev.get("ph")
        if ph == "X":
            cat = ev.get("cat")
            try:
                table = _X_TABLES.get(cat)
            except TypeError:  # a list or object as category: no table of ours
                table = None
            name = ev.get("name")
            if table is None:
                if cat not in ("cpu_op", "Operator") or not str(name).startswith("ProfilerStep#"):
                    return
                table = "annotation"  # old torch wrote ProfilerStep#N as a CPU op
            ts, dur = ev.get("ts"), ev.get("dur")
            if type(ts) not in _NUMBER or type(dur) not in _NUMBER:
                self.odd["complete events without a finite numeric ts/dur excluded"] += 1
                return
            if ts == 0 and dur == 0:
                self.odd["events with ts 0 and dur 0 excluded"] += 1
                return
            args = ev.get("args")
            if type(args) is not dict:
                args = _EMPTY
            name = self._name(name)
            if table == "runtime":
                self.runtime.append(
                    (
                        name,
                        self._name(cat),
                        ev.get("pid", _NA),
                        ev.get("tid", _NA),
                        ts,
                        dur,
                        args.get("correlation", _NA),
                        args.get("External id", args.get("external id", _NA)),
                    )
                )
            elif table == "annotation":
                self.annotations.append((name, ev.get("pid", _NA), ev.get("tid", _NA), ts, dur))
            else:
                self.gpu.append(
                    (
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
                )
        elif type(ph) is str and ph in FLOW_PHASES:
            self.flows.append(
                (ev.get("id", _NA), ph, ev.get("ts"), ev.get("pid", _NA), ev.get("tid", _NA), self._name(ev.get("cat")))
            )

    def _ints(self, values: list, column: str) -> Any:
        import numpy as np
        import pandas as pd

        try:
            arr = np.array(values) if values else np.zeros(0, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):  # lists of uneven length among them
            arr = None
        if arr is None or arr.dtype != np.int64 or arr.ndim != 1:  # None, floats, strings, lists, beyond int64
            clean = []
            for v in values:
                if type(v) is float and v.is_integer():
                    v = int(v)
                if type(v) is int and -(1 << 63) <= v < (1 << 63):
                    clean.append(v)
                else:
                    clean.append(_NA)
                    if v is not None:
                        self.bad_ints[column] += 1
            arr = np.array(clean, dtype=np.int64)
        return pd.arrays.IntegerArray(arr, arr == _NA)

    @staticmethod
    def _floats(values: list) -> Any:
        import numpy as np

        try:
            arr = np.array(values, dtype=np.float64) if values else np.zeros(0)
            if arr.ndim == 1:
                return arr
        except (TypeError, ValueError, OverflowError):
            pass
        return np.array([_float(v) for v in values], dtype=np.float64)

    @staticmethod
    def _dims(values: list) -> list:
        """[8, 1, 1] -> (8, 1, 1), one shared tuple per distinct value; None unless a list of ints."""
        seen: dict[tuple, tuple | None] = {}
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

    def frame(self, rows: list[tuple], columns: tuple[str, ...], label: str) -> pd.DataFrame:
        """One table's rows as a frame; rows with non-finite ts/dur, a negative dur or |ts|/dur beyond
        2^63 µs are dropped."""
        import numpy as np
        import pandas as pd

        cols = [[row[i] for row in rows] for i in range(len(columns))]  # 6x faster than zip(*rows)
        data: dict[str, Any] = {}
        for key, values in zip(columns, cols):
            if key in _INT_COLUMNS:
                data[key] = self._ints(
                    values,
                    "flow id" if label == "flows" and key == "id" else key if key in ("pid", "tid") else "args." + key,
                )
            elif key in _FLOAT_COLUMNS:
                data[key] = self._floats(values)
            elif key in ("grid", "block"):
                data[key] = pd.Series(self._dims(values), dtype=object)
            else:
                data[key] = pd.Series(values, dtype="str")
        frame = pd.DataFrame(data)
        if "dur_us" in frame:
            ts, dur = frame["ts_us"].to_numpy(), frame["dur_us"].to_numpy()
            bad = ~(np.isfinite(ts) & np.isfinite(dur))
            negative = dur < 0
            huge = ~bad & ((np.abs(ts) > _MAX_TIME_US) | (dur > _MAX_TIME_US))
            if bad.any():
                self.odd["complete events without a finite numeric ts/dur excluded"] += int(bad.sum())
            if negative.any():
                self.odd["events with negative dur excluded"] += int(negative.sum())
            if huge.any():
                self.odd["events with |ts| or dur beyond 2^63 µs excluded"] += int(huge.sum())
            if bad.any() or negative.any() or huge.any():
                frame = frame[~(bad | negative | huge)].reset_index(drop=True)
            frame.insert(frame.columns.get_loc("dur_us") + 1, "end_us", frame["ts_us"] + frame["dur_us"])
        return frame

    def frames(self) -> dict[str, pd.DataFrame]:
        out = {
            "gpu": self.frame(self.gpu, _GPU_COLUMNS, "gpu"),
            "runtime": self.frame(self.runtime, _RUNTIME_COLUMNS, "runtime"),
            "annotations": self.frame(self.annotations, _ANNOTATION_COLUMNS, "annotations"),
            "flows": self.frame(self.flows, _FLOW_COLUMNS, "flows"),
        }
        # \ud800-style escapes give lone surrogates, which cannot be encoded or printed.
        fix = {}
        for name in self.names:
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                fix[name] = _SURROGATE.sub("\ufffd", name)
        self.bad_text = sum(1 for name in self.names if "\ufffd" in name or name in fix)
        if fix:
            for frame in out.values():
                for col in ("name", "category", "cat"):
                    if col in frame:
                        frame[col] = frame[col].map(lambda n: fix.get(n, n))
        return out
