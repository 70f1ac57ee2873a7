"""A parsed trace as pandas frames (:class:`Trace`, what :func:`~.load.load_trace` returns), and a table of
numpy columns made a frame (:func:`frame_of`).

Times are absolute trace microseconds (float64). The Chrome trace format's ``ts``/``dur`` are µs whatever
``displayTimeUnit`` says (that key only sets the viewer's display unit, see the Trace Event Format spec);
``baseTimeNanoseconds`` is kept in ``metadata`` but not added, so times stay as written, except where float64
would lose their digits (:func:`~.columns.rebase_times`; the origin is ``TraceArrays.origin_us``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .schema import INT_COLUMNS, NA

if TYPE_CHECKING:
    import pandas as pd

    from .opevents import CpuOps


@dataclass(frozen=True)
class Trace:
    """One parsed trace file. Times are absolute trace microseconds (float64).

    Frames (one row per event kept; ``<NA>`` where a field is absent):

    - ``gpu``: GPU activities (complete events of category kernel/memcpy/memset), sorted by
      (device, ts_us): name, kind ∈ {kernel, memcpy, memset}, device (``args.device``, else pid, else -1),
      stream (``args.stream``, else tid), ts_us, dur_us, end_us, correlation, external_id, grid,
      block (tuples), registers_per_thread, shared_memory_bytes, blocks_per_sm, warps_per_sm,
      occupancy_pct (Kineto's "est. achieved occupancy %"), category (:func:`.categories.categorize`
      of name and kind).
    - ``runtime``: CUDA runtime/driver API calls on the CPU, sorted by ts_us: name, category, pid,
      tid, ts_us, dur_us, end_us, correlation, external_id, is_launch, is_sync.
    - ``annotations``: ``record_function`` ranges (category ``user_annotation``, plus legacy
      ``ProfilerStep#N`` CPU ops), sorted by ts_us: name, pid, tid, ts_us, dur_us, end_us.
    - ``flows``: flow events (ph s/t/f): id, phase, ts_us, pid, tid, cat.

    ``metadata`` holds every top-level key except ``traceEvents`` (displayTimeUnit,
    baseTimeNanoseconds, deviceProperties, distributedInfo, ...). ``warnings`` lists odd but
    survivable input, counted (one line per kind of oddity). ``cpu_ops``: the CPU-operator events
    the parse read (:class:`~.opevents.CpuOps`), None for a trace built otherwise.
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
    cpu_ops: CpuOps | None = field(default=None, repr=False, compare=False)


def frame_of(data: dict[str, Any], texts: Any) -> pd.DataFrame:
    """A table of :func:`.columns.table_arrays` as a DataFrame: ints as nullable Int64 (``<NA>`` for ``NA``),
    codes as pandas strings, other columns as they are (no copy)."""
    import pandas as pd

    out: dict[str, Any] = {}
    for key, arr in data.items():
        if arr.dtype.kind == "i" and key in INT_COLUMNS:
            out[key] = pd.arrays.IntegerArray(arr, arr == NA)
        elif arr.dtype.kind == "i":
            out[key] = pd.array(texts[arr], dtype="str")
        else:
            out[key] = arr
    return pd.DataFrame(out, copy=False)
