"""A parsed trace as numpy columns (:class:`TraceArrays`): what ``diagnose trace`` computes on, without pandas.

:func:`~.load.read_trace_arrays` gives one; :meth:`TraceArrays.to_trace` wraps the same columns in the pandas
frames of :class:`~.frames.Trace` (what :func:`~.load.load_trace` returns), and :meth:`TraceArrays.from_trace`
goes back, so every summary has one numpy implementation. Kernels are classified (:func:`categories_of`) and
launch/sync calls flagged (:func:`api_flags`) once per trace; :func:`launch_rows` links each GPU activity to
the CPU call that launched it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .apis import LAUNCH_APIS, SYNC_APIS, cuda_api_name
from .categories import categorize
from .frames import Trace, frame_of
from .schema import INT_COLUMNS, NA

if TYPE_CHECKING:
    import numpy as np

    from .opevents import CpuOps

# The columns of each table the summaries read, and what stands in for a column a hand-built frame lacks.
_TEXT_COLUMNS = {"gpu": ("name", "kind", "category"), "runtime": ("name", "category"), "annotations": ("name",),
                 "flows": ("phase", "cat")}


@dataclass
class TraceArrays:
    """One parsed trace as numpy columns per table; the columns and row orders of :class:`~.frames.Trace`'s
    frames (see its doc), with these representations:

    - texts (name, kind, category, phase, cat): int32 codes into ``texts`` (object array);
    - integer ids (device, stream, correlation, external_id, pid, tid, id): int64, absent = ``NA``
      (-2^63); gpu ``device`` is -1 where unknown;
    - times (µs) and the kernel-shape numbers: float64 (NaN where absent); grid/block: object tuples;
    - runtime ``is_launch``/``is_sync``: bool.

    ``origin_us``: the exact integer µs subtracted from every time of the file (0 unless its integer ``ts``
    exceed 2^53 µs, see :func:`~.columns.rebase_times`): ``ts_us`` + ``origin_us`` is the file's time.
    ``gpu_excluded``: GPU activities of the file dropped for unusable times (counted in ``warnings`` by reason).
    ``cpu_ops``: the CPU-operator events the parse read (:class:`~.opevents.CpuOps`, times in the file's time:
    ``origin_us`` not subtracted), None for a trace built from frames made otherwise.
    """

    path: str
    rank: int | None
    metadata: dict
    texts: Any
    gpu: dict[str, Any]
    runtime: dict[str, Any]
    annotations: dict[str, Any]
    flows: dict[str, Any]
    warnings: list[str]
    event_count: int = 0
    gpu_excluded: int = 0
    origin_us: int = 0
    cpu_ops: CpuOps | None = field(default=None, repr=False)
    cache: dict = field(default_factory=dict, repr=False)  # derived arrays (launch rows), computed once

    def to_trace(self) -> Trace:
        """The same trace as pandas frames (ints nullable Int64, texts pandas strings); columns shared."""
        return Trace(path=self.path, rank=self.rank, metadata=self.metadata, gpu=frame_of(self.gpu, self.texts),
                     runtime=frame_of(self.runtime, self.texts), annotations=frame_of(self.annotations, self.texts),
                     flows=frame_of(self.flows, self.texts), warnings=list(self.warnings),
                     event_count=self.event_count, cpu_ops=self.cpu_ops)

    @classmethod
    def from_trace(cls, trace: Trace) -> TraceArrays:
        """The arrays of a :class:`~.frames.Trace` (from :func:`~.load.load_trace` or built by hand: a
        missing ``category``, ``is_launch``/``is_sync`` or ``registers_per_thread`` is derived or NaN)."""
        import numpy as np
        import pandas as pd

        frames = {"gpu": trace.gpu, "runtime": trace.runtime, "annotations": trace.annotations, "flows": trace.flows}
        keys = [(t, c) for t, frame in frames.items() for c in frame.columns if c in _TEXT_COLUMNS[t]]
        pieces = [frames[t][c].astype(object).fillna("").astype(str).to_numpy(dtype=object) for t, c in keys]
        codes, uniq = pd.factorize(np.concatenate(pieces) if pieces else np.zeros(0, dtype=object))
        texts = np.asarray(uniq, dtype=object)
        starts = np.cumsum([0] + [len(p) for p in pieces]).tolist()
        text_codes = {key: codes[starts[i] : starts[i + 1]].astype(np.int32) for i, key in enumerate(keys)}
        tables: dict[str, dict[str, Any]] = {}
        for table, frame in frames.items():
            out: dict[str, Any] = {}
            for col in frame.columns:
                series = frame[col]
                if (table, col) in text_codes:
                    out[col] = text_codes[table, col]
                elif col in INT_COLUMNS:
                    out[col] = series.to_numpy(dtype="int64", na_value=-1 if col == "device" else NA)
                elif col in ("is_launch", "is_sync"):
                    out[col] = series.to_numpy(dtype=bool, na_value=False)
                elif col in ("grid", "block"):
                    out[col] = series.to_numpy(dtype=object)
                else:
                    out[col] = series.to_numpy(dtype=float, na_value=np.nan)
            tables[table] = out
        gpu, runtime = tables["gpu"], tables["runtime"]
        gpu.setdefault("registers_per_thread", np.full(len(trace.gpu), np.nan))
        if "category" not in gpu:
            gpu["category"], texts = categories_of(gpu["name"], gpu["kind"], texts)
        if "is_launch" not in runtime:
            runtime.update(api_flags(runtime["name"], texts))
        return cls(path=trace.path, rank=trace.rank, metadata=trace.metadata, texts=texts, gpu=gpu, runtime=runtime,
                   annotations=tables["annotations"], flows=tables["flows"], warnings=list(trace.warnings),
                   event_count=trace.event_count, cpu_ops=trace.cpu_ops)


def common_origin(traces: list[TraceArrays]) -> None:
    """Put the times of ``traces`` (one job's ranks) on one origin, the smallest of their ``origin_us``, in place:
    each trace's times move by the exact integer difference of the origins, so cross-trace comparisons (skews)
    hold when some traces were rebased (:func:`~.columns.rebase_times`). Nothing changes when all origins are
    equal (0 for ordinary traces)."""
    if not traces:
        return
    origin = min(t.origin_us for t in traces)
    for t in traces:
        shift = float(t.origin_us - origin)
        if shift:
            for table in (t.gpu, t.runtime, t.annotations, t.flows):
                for key in ("ts_us", "end_us"):
                    if key in table:
                        table[key] = table[key] + shift
            t.origin_us = origin
            t.cache.clear()


def as_arrays(trace: Trace | TraceArrays) -> TraceArrays:
    """``trace`` as columns: itself if it is a TraceArrays, else :meth:`TraceArrays.from_trace`, kept on
    the Trace between calls (keyed by its frames' identity and lengths, so a replaced frame is converted again)."""
    if isinstance(trace, TraceArrays):
        return trace
    frames = (trace.gpu, trace.runtime, trace.annotations, trace.flows)
    key = tuple((id(f), len(f), len(f.columns)) for f in frames)
    cached = trace.__dict__.get("_arrays_cache")
    if cached is not None and cached[0] == key:
        return cached[1]
    arrays = TraceArrays.from_trace(trace)
    object.__setattr__(trace, "_arrays_cache", (key, arrays))
    return arrays


def categories_of(name: np.ndarray, kind: np.ndarray, texts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(category (:func:`.categories.categorize`) per GPU activity of name/kind codes as int32 codes,
    ``texts`` with the category names it lacked appended); each distinct (name, kind) is classified once."""
    import numpy as np

    if len(name) == 0:
        return np.zeros(0, dtype=np.int32), texts
    width = max(len(texts), 1)
    uniq, inverse = np.unique(name.astype(np.int64) * width + kind, return_inverse=True)
    cats = [categorize(texts[k // width], texts[k % width]) for k in uniq.tolist()]
    have = {t: i for i, t in enumerate(texts.tolist()) if t in set(cats)}
    added = [c for c in dict.fromkeys(cats) if c not in have]
    have.update({c: len(texts) + i for i, c in enumerate(added)})
    if added:
        texts = np.concatenate([texts, np.array(added, dtype=object)])
    return np.array([have[c] for c in cats], dtype=np.int32)[inverse.reshape(-1)], texts


def api_flags(name: np.ndarray, texts: np.ndarray) -> dict[str, np.ndarray]:
    """``is_launch`` and ``is_sync`` per CPU call of name codes (see ``apis.LAUNCH_APIS``/``SYNC_APIS``; a HIP
    call counts as its CUDA counterpart, ``apis.cuda_api_name``)."""
    import numpy as np

    launch = np.zeros(len(texts), dtype=bool)
    sync = np.zeros(len(texts), dtype=bool)
    for code in np.unique(name).tolist():
        base = cuda_api_name(texts[code])
        launch[code], sync[code] = base in LAUNCH_APIS, base in SYNC_APIS
    return {"is_launch": launch[name], "is_sync": sync[name]}


def launch_rows(arrays: TraceArrays) -> np.ndarray:
    """Per GPU activity, the row in ``arrays.runtime`` of the CPU call with its correlation id (-1 if
    none; the earliest such call, runtime being time-sorted). Computed once per trace; a copy."""
    import numpy as np

    rows = arrays.cache.get("launch_rows")
    if rows is None:
        rc_all, gc = arrays.runtime["correlation"], arrays.gpu["correlation"]
        rt_ok = rc_all != NA
        values, first = np.unique(rc_all[rt_ok], return_index=True)
        if len(values) == 0:
            rows = np.full(len(gc), -1, dtype=np.int64)
        else:
            i = np.minimum(np.searchsorted(values, gc), len(values) - 1)
            hit = (values[i] == gc) & (gc != NA)
            rows = np.where(hit, np.flatnonzero(rt_ok)[first][i], -1)
        arrays.cache["launch_rows"] = rows
    return rows.copy()
