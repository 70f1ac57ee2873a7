"""Parse a Kineto / Chrome trace (``.json`` or ``.json.gz``) once into pandas frames.

The ``traceEvents`` array is streamed: the file is decoded in 4 Mi-character chunks and each event
is decoded on its own by the C JSON scanner (``json.scanner.make_scanner``); only the fields the
metrics use are kept, as one tuple per kept event with interned names, and become typed columns
once at the end. Memory is the decoded chunk plus the kept fields, not a Python dict per event as
``json.load`` builds (``benchmarks/trace_parse.py`` measures time and peak RSS against Holistic
Trace Analysis). The C scanner is the floor: about 5 µs per event on one core.

Units: every ``ts``/``dur`` of the Chrome trace format is in microseconds whatever
``displayTimeUnit`` says (that key only sets the viewer's display unit, see the Trace Event Format
spec); ``baseTimeNanoseconds`` is kept in ``metadata`` but not added, so times stay as written.
"""

from __future__ import annotations

import gzip
import io
import json
import json.scanner
import math
import os
import re
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import BubblescopeError

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
# The API calls that put a kernel (or a whole CUDA graph) on a stream; Triton launches through the
# driver's cuLaunchKernel. Names are compared without CUPTI's version/stream suffixes (_v11060, _ptsz).
LAUNCH_APIS = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cudaGraphLaunch",
        "cuGraphLaunch",
        "cudaLaunchCooperativeKernel",
        "cuLaunchCooperativeKernel",
    }
)
SYNC_APIS = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
        "cuEventSynchronize",
    }
)
FLOW_PHASES = frozenset({"s", "t", "f"})
_API_SUFFIX = re.compile(r"(?:_v\d+|_ptsz|_ptds)+$")
_CHUNK_CHARS = 1 << 22  # decoded characters read per refill (4 Mi)
_MAX_EVENT_CHARS = 1 << 26  # one event larger than 64 Mi characters is treated as malformed
_NA = -(1 << 63)  # int64 sentinel for "absent" in int columns
# |ts| or dur beyond this (2^63 µs) is corrupt: spans and sums of such times overflow float64 to inf.
_MAX_TIME_US = float(1 << 63)
_WS = re.compile(r"[ \t\n\r]*")
_SURROGATE = re.compile("[\ud800-\udfff]")
_NUMBER_TAIL = re.compile(r"[0-9.eE+\-]*")
_COMMA = re.compile(r"[ \t\n\r]*,[ \t\n\r]*")


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


def api_base_name(name: str) -> str:
    """``cudaLaunchKernelExC_v11060`` -> ``cudaLaunchKernelExC`` (CUPTI callback names carry versions)."""
    return _API_SUFFIX.sub("", name)


@dataclass(frozen=True)
class Trace:
    """One parsed trace file. Times are absolute trace microseconds (float64).

    Frames (one row per event kept; ``<NA>`` where a field is absent):

    - ``gpu``: GPU activities (complete events of category kernel/memcpy/memset), sorted by
      (device, ts_us): name, kind ∈ {kernel, memcpy, memset}, device (``args.device``, else pid, else -1),
      stream (``args.stream``, else tid), ts_us, dur_us, end_us, correlation, external_id, grid,
      block (tuples), registers_per_thread, shared_memory_bytes, blocks_per_sm, warps_per_sm,
      occupancy_pct (Kineto's "est. achieved occupancy %").
    - ``runtime``: CUDA runtime/driver API calls on the CPU, sorted by ts_us: name, category, pid,
      tid, ts_us, dur_us, end_us, correlation, external_id, is_launch, is_sync.
    - ``annotations``: ``record_function`` ranges (category ``user_annotation``, plus legacy
      ``ProfilerStep#N`` CPU ops), sorted by ts_us: name, pid, tid, ts_us, dur_us, end_us.
    - ``flows``: flow events (ph s/t/f): id, phase, ts_us, pid, tid, cat.

    ``metadata`` holds every top-level key except ``traceEvents`` (displayTimeUnit,
    baseTimeNanoseconds, deviceProperties, distributedInfo, ...). ``warnings`` lists odd but
    survivable input, counted (one line per kind of oddity).
    """

    path: str
    rank: int | None
    metadata: dict
    gpu: pd.DataFrame = field(repr=False)
    runtime: pd.DataFrame = field(repr=False)
    annotations: pd.DataFrame = field(repr=False)
    flows: pd.DataFrame = field(repr=False)
    warnings: list[str]
    event_count: int = 0


class _Text:
    """A sliding window over the decoded file from which JSON values are scanned one at a time."""

    def __init__(self, stream: io.TextIOBase):
        self._stream = stream
        self.buf = ""
        self.pos = 0
        self.offset = 0  # characters dropped from the front of buf so far
        self.eof = False
        self.scanner = json.scanner.make_scanner(json.JSONDecoder())

    def fill(self) -> bool:
        if self.eof:
            return False
        chunk = self._stream.read(_CHUNK_CHARS)
        if not chunk:
            self.eof = True
            return False
        self.offset += self.pos
        self.buf = self.buf[self.pos :] + chunk
        self.pos = 0
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
                # continue in the next chunk ("-1" of "-1.5"); objects and strings end unambiguously.
                if self.eof or (
                    end < len(self.buf) and (type(obj) not in (int, float) or not _NUMBER_TAIL.fullmatch(self.buf, end))
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


def _open_text(path: str) -> io.TextIOBase:
    """Open as text, gunzipping when the file starts with the gzip magic (not by its suffix)."""
    raw = open(path, "rb")  # noqa: SIM115 - closed by the wrapper
    head = raw.peek(2)[:2] if hasattr(raw, "peek") else b""
    binary = gzip.GzipFile(fileobj=raw, mode="rb") if head == b"\x1f\x8b" else raw
    # Invalid UTF-8 in kernel names must not stop the parse: decode with U+FFFD replacement.
    # utf-8-sig: a byte-order mark some Windows tools write is skipped, not a JSON error.
    return io.TextIOWrapper(binary, encoding="utf-8-sig", errors="replace", newline="")


def _parse(text: _Text, cols: _Columns) -> tuple[dict, bool]:
    """Walk the top level; stream ``traceEvents``; return (metadata, had_events_array)."""
    meta: dict = {}
    first = text.peek()
    if first == "[":  # the Chrome "JSON Array Format": a bare list of events, closing ] optional
        _parse_events(text, cols, allow_unclosed=True)
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
            return meta, found
        key = text.value()
        if not isinstance(key, str) or text.peek() != ":":
            raise text.error("expected an object key")
        text.pos += 1
        if key == "traceEvents":
            if text.peek() != "[":
                raise ValueError("traceEvents is not an array")
            _parse_events(text, cols, allow_unclosed=False)
            found = True
        else:
            meta[key] = text.value()
        c = text.peek()
        if c == ",":
            text.pos += 1
        elif c != "}":
            raise text.error("expected ',' or '}'" if c else "file ends early (truncated?)")


def _parse_events(text: _Text, cols: _Columns, allow_unclosed: bool) -> None:
    text.pos += 1  # the '['
    add = cols.add
    if text.peek() == "]":
        text.pos += 1
        return
    scan, comma = text.scanner, _COMMA.match
    while True:
        # Fast path, kept in locals: whole event objects inside the window separated by commas.
        # It stops at anything else (an event cut by the window, the closing bracket, bad JSON).
        buf, pos, size, need_value = text.buf, text.pos, len(text.buf), True
        while True:
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
            if pos >= size:
                break
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


def parse_rank(value: Any) -> int | None:
    """``distributedInfo.rank`` as an int, however written (1, "1", 1.0); None if absent or not a number."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value.strip()) if isinstance(value, str) else float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if number.is_integer() else None


def load_trace(path: str | os.PathLike) -> Trace:
    """Parse one Chrome/Kineto trace file (plain or gzipped JSON) into a :class:`Trace`.

    Raises BubblescopeError (one line naming the file) when the file is missing, unreadable, a
    truncated or corrupt gzip, not JSON, or JSON without a ``traceEvents`` array. Odd events (ts 0
    and dur 0, missing ts/dur, integers beyond int64, invalid UTF-8) are excluded or repaired and
    counted in ``Trace.warnings``.
    """
    path = os.fspath(path)
    cols = _Columns()
    try:
        with _open_text(path) as stream:
            meta, found = _parse(_Text(stream), cols)
    except FileNotFoundError:
        raise BubblescopeError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise BubblescopeError(f"{path}: is a directory, not a trace file") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise BubblescopeError(f"{path}: corrupt or truncated gzip ({exc})") from None
    except OSError as exc:
        raise BubblescopeError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except (ValueError, RecursionError) as exc:
        raise BubblescopeError(f"{path}: not a Chrome trace: {exc}") from None
    if not found:
        raise BubblescopeError(f"{path}: JSON without a traceEvents array (not a Chrome trace)")

    frames = cols.frames()
    gpu = frames["gpu"]
    gpu["device"] = gpu["device"].fillna(-1)  # neither args.device nor pid: one unknown device
    gpu = gpu.sort_values(["device", "ts_us"], kind="stable", ignore_index=True)
    runtime = frames["runtime"].sort_values("ts_us", kind="stable", ignore_index=True)
    names = runtime["name"].unique()
    runtime["is_launch"] = runtime["name"].isin([n for n in names if api_base_name(n) in LAUNCH_APIS])
    runtime["is_sync"] = runtime["name"].isin([n for n in names if api_base_name(n) in SYNC_APIS])
    annotations = frames["annotations"].sort_values("ts_us", kind="stable", ignore_index=True)
    flows = frames["flows"]

    warnings = [f"{n} {what}" for what, n in cols.odd.items()]
    warnings += [f"{n} integers in {col} beyond int64 or not integers, set to null" for col, n in cols.bad_ints.items()]
    if cols.bad_text:
        warnings.append(f"{cols.bad_text} distinct names had invalid UTF-8 (replaced by U+FFFD)")
    linked = gpu["correlation"].isin(runtime["correlation"].dropna()).to_numpy(dtype=bool, na_value=False)
    if len(gpu) and not linked.all():
        warnings.append(
            f"{int((~linked).sum())} of {len(gpu)} GPU activities have no CPU call with "
            "their correlation id (launch unknown)"
        )
    rank_raw = meta.get("distributedInfo", {}).get("rank") if isinstance(meta.get("distributedInfo"), dict) else None
    rank = parse_rank(rank_raw)
    if rank_raw is not None and rank is None:
        warnings.append(f"distributedInfo.rank {rank_raw!r} is not an integer; rank unknown")
    return Trace(
        path=path,
        rank=rank,
        metadata=meta,
        gpu=gpu,
        runtime=runtime,
        annotations=annotations,
        flows=flows,
        warnings=warnings,
        event_count=cols.events,
    )
