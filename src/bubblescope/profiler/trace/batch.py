"""Decode a run of whole ``traceEvents`` entries at once with msgspec and keep them as typed columns.

:func:`add_batch` gets the JSON text of consecutive events (``{...}, {...}``), decodes it in one
call into :class:`_Event` structs that hold only the fields the metrics read (msgspec skips the
rest without building them), picks the kept events by (ph, cat) and hands each table's fields to
:meth:`~.events.EventTables.extend` column by column: no dict per event and
no Python call per event. Field types are strict where the Trace Event Format is (numbers or numeric
strings for times and ids); text they refuse (NaN literals, a list as category, lone surrogates,
ids beyond 64 bits) makes :func:`add_batch` return False before anything is kept, and the caller
reads those events one at a time with the standard library instead, so both paths give the same
columns.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import TYPE_CHECKING, Any, Union

import msgspec

from .schema import FLOW_PHASES, LEGACY_GPU_PID, LEGACY_KERNELS, NA, NS_EXACT_US, PHASES, UNKNOWN_PHASE, X_TABLES
from .values import long_float

if TYPE_CHECKING:
    from .events import EventTables

_Id = Union[int, str, None]
_Num = Union[int, float, str, None]
_UNSET = msgspec.UNSET


class _Args(msgspec.Struct, gc=False):
    device: Union[_Id, msgspec.UnsetType] = _UNSET
    stream: Union[_Id, msgspec.UnsetType] = _UNSET
    correlation: _Id = NA
    external_id: Union[_Id, msgspec.UnsetType] = msgspec.field(name="External id", default=_UNSET)
    external_id_lower: _Id = msgspec.field(name="external id", default=NA)
    grid: Union[tuple[int, ...], None] = None  # anything else: the per-event path keeps it as null
    block: Union[tuple[int, ...], None] = None
    registers: Any = msgspec.field(name="registers per thread", default=None)
    shared_memory: Any = msgspec.field(name="shared memory", default=None)
    blocks_per_sm: Any = msgspec.field(name="blocks per SM", default=None)
    warps_per_sm: Any = msgspec.field(name="warps per SM", default=None)
    occupancy: Any = msgspec.field(name="est. achieved occupancy %", default=None)


class _LeanArgs(msgspec.Struct, gc=False):
    """The args a summary reads (``load_trace(lean=True)``): msgspec skips the others unbuilt."""

    device: Union[_Id, msgspec.UnsetType] = _UNSET
    stream: Union[_Id, msgspec.UnsetType] = _UNSET
    correlation: _Id = NA
    registers: Any = msgspec.field(name="registers per thread", default=None)


class _Event(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: _Id = NA
    tid: _Id = NA
    ts: _Num = None
    dur: _Num = None
    args: Union[_Args, None, msgspec.UnsetType] = _UNSET


class _FlowEvent(_Event, gc=False):
    id: _Id = NA  # only flow events read it


class _LeanEvent(_Event, gc=False):
    args: Union[_LeanArgs, None, msgspec.UnsetType] = _UNSET


class _LeanFlowEvent(_LeanEvent, gc=False):
    id: _Id = NA


@functools.cache
def _decoding(lean: bool, flows: bool, exact: bool = False) -> tuple[Any, type, Any]:
    """(decoder of a list of events, args type, args of an event without them) for the columns kept. ``exact``:
    ``ts`` is decoded untyped with :func:`~.values.long_float` as the float hook, so a long float literal
    stays text, to be read as exact ns (:meth:`~.events.EventTables.times`)."""
    event = (_LeanFlowEvent if flows else _LeanEvent) if lean else (_FlowEvent if flows else _Event)
    args = _LeanArgs if lean else _Args
    if not exact:
        return msgspec.json.Decoder(list[event]), args, args()
    exact_event = msgspec.defstruct(f"_Exact{event.__name__}", [("ts", Any, None)], bases=(event,), gc=False)
    return msgspec.json.Decoder(list[exact_event], float_hook=long_float), args, args()


class _NeedExact(Exception):
    """A batch holds float ``ts`` beyond float64's ns (:data:`~.schema.NS_EXACT_US`): decode it again,
    exactly."""


# Table code per complete-event category (1-3 GPU kinds, 4 runtime, 5 annotation, 6 maybe a step, 10 maybe a
# legacy export's kernel: no category); 0 for an event kept nowhere, -1 for one of an unknown phase (counted).
_KINDS = ("kernel", "memcpy", "memset")
_X_CODE = {cat: (_KINDS.index(t) + 1 if t in _KINDS else 4 if t == "runtime" else 5) for cat, t in X_TABLES.items()}
_X_CODE.update({"cpu_op": 6, "Operator": 6, None: 10})
_PH_CODE = {**{p: 7 for p in FLOW_PHASES}, "B": 8, "E": 9}


class _Codes(dict):
    """(ph, cat) -> table code, computed on the first sight of each pair: one C-level dict lookup per
    event instead of a Python expression. TypeError for an unhashable ph or cat (a list)."""

    def __missing__(self, key: tuple) -> int:
        ph, cat = key
        code = _X_CODE.get(cat, 0) if ph == "X" else _PH_CODE.get(ph, 0 if type(ph) is str and ph in PHASES else -1)
        if len(self) < 4096:  # a trace with a new category per event must not grow this without bound
            self[key] = code
        return code


_CODES = _Codes()


def _args(sub: list[_Event], kind: type, empty: Any) -> list:
    """Each event's args, ``empty`` (every field at its default) where it has none or null."""
    args = [e.args for e in sub]
    if None not in args and _UNSET not in args:
        return args
    return [a if type(a) is kind else empty for a in args]


def _steps(names: list) -> Any:
    """Whether each CPU-op name is old torch's ``ProfilerStep#N`` (bool array), each distinct name tested once."""
    import numpy as np

    try:
        test = {n: str(n).startswith("ProfilerStep#") for n in dict.fromkeys(names)}
    except TypeError:  # an unhashable name (a list): tested one by one
        return np.array([str(n).startswith("ProfilerStep#") for n in names], dtype=bool)
    return np.fromiter(map(test.__getitem__, names), dtype=bool, count=len(names))


def _either(first: list, second: list) -> list:
    """``first`` where set, else ``second`` (a JSON key absent from the event is UNSET)."""
    if _UNSET not in first:
        return first
    return [b if a is _UNSET else a for a, b in zip(first, second)]


def _complete(cols: EventTables, sub: list[_Event], odd: dict, exact: bool) -> tuple[list[_Event], Any, Any]:
    """Drop complete events without usable times (counted as the per-event path counts them);
    return (kept events, ts, dur): dur float64, ts int64 when all integers, timedelta64[ns] when read exactly,
    else float64 (see ``EventTables.times``). Raises :class:`_NeedExact` when not ``exact`` and a float ts lies
    beyond float64's ns (its text must be read again)."""
    import numpy as np

    ts = cols.times([e.ts for e in sub])
    if not exact and ts.dtype == np.float64:
        big = np.abs(ts) >= NS_EXACT_US
        if big.any() and (np.isfinite(ts[big]) & (ts[big] != np.floor(ts[big]))).any():
            raise _NeedExact
    dur = cols.floats([e.dur for e in sub])
    finite_ts, zero_ts = cols.time_checks(ts)
    finite = finite_ts & np.isfinite(dur)
    zero = finite & zero_ts & (dur == 0)
    if not finite.all() or zero.any():
        if not finite.all():
            odd["complete events without a finite numeric ts/dur excluded"] += int((~finite).sum())
        if zero.any():
            odd["events with ts 0 and dur 0 excluded"] += int(zero.sum())
        keep = finite & ~zero
        sub = [e for e, k in zip(sub, keep.tolist()) if k]
        ts, dur = ts[keep], dur[keep]
    return sub, ts, dur


def add_batch(cols: EventTables, text: str) -> bool:
    """Keep the events of ``text`` (JSON objects separated by commas); False, keeping nothing, when
    msgspec refuses the text or a value's type (the caller then reads it event by event)."""
    return add_array(cols, f"[{text}]")  # one copy of the text; "[" + text + "]" makes two


def add_array(cols: EventTables, doc: str | bytes) -> bool:
    """:func:`add_batch` of a whole JSON array of events, as text or UTF-8 bytes (a worker process's input)."""
    if cols.exact_times:  # an earlier batch needed it: so will this one (one trace, one clock)
        return _add_array(cols, doc, exact=True)
    try:
        return _add_array(cols, doc, exact=False)
    except _NeedExact:  # nothing was kept: read it again with ts as written
        cols.exact_times = True
        return _add_array(cols, doc, exact=True)


def _add_array(cols: EventTables, doc: str | bytes, exact: bool) -> bool:
    import numpy as np

    decoder, kind, empty = _decoding(cols.lean, cols.keep_flows, exact)
    try:
        events = decoder.decode(doc)
        code = _CODES.__getitem__  # a list comprehension reads slots faster than an attrgetter would
        codes = np.fromiter([code((e.ph, e.cat)) for e in events], dtype=np.int8, count=len(events))
    except (msgspec.DecodeError, TypeError):  # TypeError: a list or object as ph or cat
        return False
    odd: Counter[str] = Counter()
    unknown = int((codes < 0).sum())
    if unknown:
        odd[UNKNOWN_PHASE] += unknown
    tables: dict[str, dict[str, list]] = {}
    maybe = ops = np.flatnonzero(codes == 6)  # CPU operators, old torch's steps among them
    if len(maybe) and ("ProfilerStep#" if type(doc) is str else b"ProfilerStep#") in doc:  # old torch's steps
        codes[maybe[_steps([events[i].name for i in maybe.tolist()])]] = 5
    maybe = np.flatnonzero(codes == 10)
    legacy = np.zeros(0, dtype=np.int64)
    if len(maybe):  # a legacy autograd-profiler export's kernels (schema.LEGACY_GPU_PID): kernels
        legacy = maybe[np.fromiter((events[i].pid == LEGACY_GPU_PID for i in maybe.tolist()), dtype=bool,
                                   count=len(maybe))]
        codes[maybe] = 0
        codes[legacy] = 1
    gpu = np.flatnonzero((codes >= 1) & (codes <= 3))
    gpu_excluded = 0
    if len(gpu):
        sub, ts, dur = _complete(cols, [events[i] for i in gpu.tolist()], odd, exact)
        gpu_excluded = len(gpu) - len(sub)
        kinds = [_KINDS[c - 1] for c in codes[gpu].tolist()] if len(sub) == len(gpu) else None
        if kinds is None:  # some rows were dropped: take the kinds of the kept ones
            kinds = [X_TABLES[e.cat] for e in sub]
        args = _args(sub, kind, empty)
        device = _either([a.device for a in args], [e.pid for e in sub])
        stream = _either([a.stream for a in args], [e.tid for e in sub])
        if len(legacy):  # device = tid, stream unknown, unless args say otherwise (as the per-event path reads them)
            for j, e in enumerate(sub):
                if e.cat is None and e.pid == LEGACY_GPU_PID:
                    odd[LEGACY_KERNELS] += 1
                    a = args[j]
                    device[j] = e.tid if a.device is _UNSET else a.device
                    stream[j] = NA if a.stream is _UNSET else a.stream
        tables["gpu"] = gpu = {
            "name": [e.name for e in sub],
            "kind": kinds,
            "device": device,
            "stream": stream,
            "ts_us": ts,
            "dur_us": dur,
            "correlation": [a.correlation for a in args],
            "registers_per_thread": [a.registers for a in args],
        }
        if not cols.lean:
            gpu.update({
                "external_id": _either([a.external_id for a in args], [a.external_id_lower for a in args]),
                "grid": [a.grid for a in args],
                "block": [a.block for a in args],
                "shared_memory_bytes": [a.shared_memory for a in args],
                "blocks_per_sm": [a.blocks_per_sm for a in args],
                "warps_per_sm": [a.warps_per_sm for a in args],
                "occupancy_pct": [a.occupancy for a in args],
            })
    runtime = np.flatnonzero(codes == 4)
    if len(runtime):
        sub, ts, dur = _complete(cols, [events[i] for i in runtime.tolist()], odd, exact)
        args = _args(sub, kind, empty)
        tables["runtime"] = {
            "name": [e.name for e in sub],
            "category": [e.cat for e in sub],
            "pid": [e.pid for e in sub],
            "tid": [e.tid for e in sub],
            "ts_us": ts,
            "dur_us": dur,
            "correlation": [a.correlation for a in args],
        }
        if not cols.lean:
            tables["runtime"]["external_id"] = _either([a.external_id for a in args],
                                                       [a.external_id_lower for a in args])
    annotations = np.flatnonzero(codes == 5)
    if len(annotations):
        sub, ts, dur = _complete(cols, [events[i] for i in annotations.tolist()], odd, exact)
        tables["annotations"] = {
            "name": [e.name for e in sub],
            "pid": [e.pid for e in sub],
            "tid": [e.tid for e in sub],
            "ts_us": ts,
            "dur_us": dur,
        }
    flows = np.flatnonzero(codes == 7) if cols.keep_flows else ()
    if len(flows):
        sub = [events[i] for i in flows.tolist()]
        tables["flows"] = {
            "id": [e.id for e in sub],
            "phase": [e.ph for e in sub],
            "ts_us": [e.ts for e in sub],
            "pid": [e.pid for e in sub],
            "tid": [e.tid for e in sub],
            "cat": [e.cat for e in sub],
        }
    pairs = np.flatnonzero(codes >= 8)
    if len(pairs) and not exact:  # a B/E time beyond float64's ns is read again from its text, as X times are
        ts = [events[i].ts for i in pairs.tolist()]
        if any(type(t) is float and abs(t) >= NS_EXACT_US and not t.is_integer() for t in ts):
            raise _NeedExact
    # Everything is typed and checked: keep it, after the event dicts the fallback path holds.
    cols.flush()
    cols.events += len(events)
    cols.gpu_excluded += gpu_excluded
    for key, n in odd.items():
        cols.odd[key] += n
    for table, values in tables.items():
        cols.extend(table, values)
    for i in pairs.tolist():
        cols.pairs.append(_as_dict(events[i]))
    if len(ops):
        sub = [events[i] for i in ops.tolist()]
        cols.cpu_ops.extend([e.name for e in sub], [e.pid for e in sub], [e.tid for e in sub], [e.ts for e in sub],
                            [e.dur for e in sub])
    return True


def _as_dict(ev: _Event) -> dict:
    """A B/E event as the dict the per-event path would have built (absent keys left out)."""
    out: dict[str, Any] = {"ph": ev.ph}
    for key in ("cat", "name", "ts"):
        value = getattr(ev, key)
        if value is not None:
            out[key] = value
    for key in ("pid", "tid"):
        value = getattr(ev, key)
        if value != NA:
            out[key] = value
    a = ev.args
    if type(a) is _Args or type(a) is _LeanArgs:  # the JSON keys of the fields it was decoded with
        values = zip(type(a).__struct_encode_fields__, (getattr(a, f) for f in type(a).__struct_fields__))
        out["args"] = {k: v for k, v in values if v is not _UNSET and v is not None and v != NA}
    return out
