"""Parse a Kineto / Chrome trace (``.json`` or ``.json.gz``) once into pandas frames.

The ``traceEvents`` array is streamed: the file is decoded in 4 Mi-character windows, and the whole
events of each window are decoded by msgspec in one call into small typed structs (only the fields
the metrics use), then kept as typed numpy columns per table; no dict per event is built. Events
msgspec refuses (NaN literals, lone surrogates, odd types) are read one at a time by the standard
library's C scanner, into the same columns. Memory is one window plus the kept columns
(``benchmarks/trace_parse.py`` measures time and peak RSS against Holistic Trace Analysis). Large
files have their windows decoded by worker processes, one per core, with the same result.

Units: every ``ts``/``dur`` of the Chrome trace format is in microseconds whatever
``displayTimeUnit`` says (that key only sets the viewer's display unit, see the Trace Event Format
spec); ``baseTimeNanoseconds`` is kept in ``metadata`` but not added, so times stay as written, except
where float64 would lose their digits: integer ``ts`` beyond 2^53 µs, and float ``ts`` beyond 2^43 µs
(absolute µs with ns decimals), are kept exact and counted from the trace's first µs
(:func:`~.traceframes.rebase_times`; the origin is ``TraceArrays.origin_us``).

Reading is split over modules: :mod:`.tracefile` reads and inflates the file in a thread,
:mod:`.tracejson` streams the JSON text, :mod:`.tracebatch` decodes runs of events with msgspec,
:mod:`.traceworkers` does that in worker processes for large files, :mod:`.tracecolumns` keeps
the fields of each event, :mod:`.traceframes` builds the typed, cleaned columns, :mod:`.tracepairs` makes ``B``/``E`` pairs complete events,
:mod:`.tracearrays` ties them together into numpy columns (what ``diagnose trace`` computes on,
without pandas), and this one holds the :class:`Trace` container of pandas frames, the launch/sync
API names and :func:`load_trace`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

# GPU_KINDS, RUNTIME_CATEGORIES and FLOW_PHASES (which events become which table) live with the
# column building; they stay importable from here.
from .tracecolumns import FLOW_PHASES, GPU_KINDS, RUNTIME_CATEGORIES  # noqa: F401

if TYPE_CHECKING:
    import pandas as pd

# The API calls that put a kernel (or a whole CUDA graph) on a stream; Triton launches through the
# driver's cuLaunchKernel. Names are compared without CUPTI's version/stream suffixes (_v11060, _ptsz), and HIP
# calls as their CUDA counterparts (cuda_api_name).
LAUNCH_APIS = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cudaGraphLaunch",
        "cuGraphLaunch",
        "cudaLaunchCooperativeKernel",
        "cudaLaunchCooperativeKernelMultiDevice",
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
_API_SUFFIX = re.compile(r"(?:_v\d+|_ptsz|_ptds|_spt)+$")
# ROCm's HIP API (what Kineto records through roctracer / rocprofiler on AMD GPUs, in the same cuda_runtime
# category) mirrors CUDA's: a hip* runtime call is the cuda* call of the same name (hipLaunchKernel,
# hipGraphLaunch, hipStreamSynchronize, hipMemcpyAsync, ...), and these, named otherwise, are the CUDA calls
# they stand for (HIP's module API is CUDA's driver API; hipExt* add events or flags to a plain launch).
_HIP_NAMES = {
    "hipModuleLaunchKernel": "cuLaunchKernel",
    "hipExtModuleLaunchKernel": "cuLaunchKernel",
    "hipHccModuleLaunchKernel": "cuLaunchKernel",
    "hipModuleLaunchCooperativeKernel": "cuLaunchCooperativeKernel",
    "hipExtLaunchKernel": "cudaLaunchKernel",
    "hipLaunchKernelExC": "cudaLaunchKernelExC",
    "hipExtLaunchMultiKernelMultiDevice": "cudaLaunchCooperativeKernelMultiDevice",
    "hipLaunchCooperativeKernelMultiDevice": "cudaLaunchCooperativeKernelMultiDevice",
    "hipCtxSynchronize": "cuCtxSynchronize",
}


def api_base_name(name: str) -> str:
    """``cudaLaunchKernelExC_v11060`` -> ``cudaLaunchKernelExC`` (CUPTI callback names carry versions)."""
    return _API_SUFFIX.sub("", name)


def cuda_api_name(name: str) -> str:
    """The CUDA call a runtime/driver API call is, by name: :func:`api_base_name`, with a HIP call (ROCm) named as
    its CUDA counterpart (``hipLaunchKernel`` -> ``cudaLaunchKernel``, ``hipModuleLaunchKernel`` ->
    ``cuLaunchKernel``, ``hipMemcpyAsync`` -> ``cudaMemcpyAsync``); what :data:`LAUNCH_APIS` and
    :data:`SYNC_APIS` are matched against."""
    base = api_base_name(name)
    if not base.startswith("hip"):
        return base
    return _HIP_NAMES.get(base) or "cuda" + base[3:]


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


def parse_rank(value: Any) -> int | None:
    """``distributedInfo.rank`` as an int, however written (1, "1", 1.0); None if absent or not a number."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value.strip()) if isinstance(value, str) else float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if number.is_integer() else None


def load_trace(
    path: str | os.PathLike, progress: Callable[[int, int], None] | None = None, flows: bool = True,
    lean: bool = False,
) -> Trace:
    """Parse one Chrome/Kineto trace file (plain or gzipped JSON) into a :class:`Trace`.

    ``progress(done, total)``, if given, is called with the bytes of the file read so far and the
    file's size (bytes, as on disk: compressed for .gz) after each 4 Mi-character window.
    ``flows=False`` leaves ``Trace.flows`` empty (no metric reads it; it is a quarter of a Kineto
    trace's events, so the summary skips it). ``lean=True`` also leaves out the columns no summary
    metric reads: ``external_id`` of gpu and runtime, and gpu's grid, block, shared_memory_bytes,
    blocks_per_sm, warps_per_sm and occupancy_pct (msgspec then skips those args unbuilt: less time
    and memory; every other column is the same).

    Raises BubblescopeError (one line naming the file) when the file is missing, unreadable, a
    truncated or corrupt gzip, not JSON, or JSON without a ``traceEvents`` array. Odd events (ts 0
    and dur 0, missing ts/dur, integers beyond int64, invalid UTF-8) are excluded or repaired and
    counted in ``Trace.warnings``.
    """
    from .tracearrays import read_trace_arrays

    return read_trace_arrays(path, progress, flows, lean).to_trace()
