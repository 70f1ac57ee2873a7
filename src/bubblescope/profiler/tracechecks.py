"""Event patterns that would count GPU time twice or give impossible numbers, found and named.

- :func:`drop_repeated`: a GPU activity repeated exactly, or nested inside another of the same name
  on the same device and stream (a profiler writing one kernel twice, a range re-emitted around
  itself), is counted once: the outer (first) one is kept. :func:`drop_repeated_ranges` does the same for
  ``record_function`` ranges (so a step range is one step), :func:`drop_repeated_calls` for CPU API calls
  repeated exactly.
- :func:`overlap_notes`: streams of one device running at the same time. busy_us is a union and
  counts that time once; category and kernel totals sum durations and count it per activity, so the
  warning gives the size of the difference.
- :func:`skew_note`: kernels that start before the CPU call that launched them. CUPTI takes GPU
  times from the GPU's clock and CPU times from the host's; when the two disagree, launch delays come
  out negative, and the warning says by how much.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..wording import count, plural

if TYPE_CHECKING:
    from .tracearrays import TraceArrays


def _repeats(table: dict[str, Any], keys: tuple[str, ...], nested: bool) -> tuple[Any, Any]:
    """(rows to drop, of which repeated exactly) of ``table`` (numpy columns with ts_us and end_us): within one
    group of equal ``keys`` columns, a row whose [ts_us, end_us] equals an earlier one's, or, with ``nested``,
    lies inside an earlier-starting (or equal, longer) one's. Bool masks aligned with the table."""
    import numpy as np

    from .intervals import group_cummax

    n = len(table["ts_us"])
    none = np.zeros(n, dtype=bool)
    if n < 2:
        return none, none
    ts, end = table["ts_us"], table["end_us"]
    cols = [table[k] for k in keys]
    order = np.lexsort((-end, ts, *reversed(cols)))  # the outer range first among equal starts
    t, e = ts[order], end[order]
    head = np.zeros(n, dtype=bool)
    head[0] = True
    for col in cols:
        c = col[order]
        head[1:] |= c[1:] != c[:-1]
    same = np.zeros(n, dtype=bool)
    same[1:] = ~head[1:] & (t[1:] == t[:-1]) & (e[1:] == e[:-1])
    if nested:
        reach = group_cummax(np.cumsum(head) - 1, e)
        inside = np.zeros(n, dtype=bool)
        inside[1:] = ~head[1:] & (e[1:] <= reach[:-1])
    else:
        inside = same
    drop, exact = none.copy(), none.copy()
    drop[order], exact[order] = inside, same
    return drop, exact


def _without(table: dict[str, Any], drop: Any) -> dict[str, Any]:
    return {key: arr[~drop] for key, arr in table.items()} if drop.any() else table


def drop_repeated(gpu: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(``gpu`` without repeated or same-name nested activities, warnings naming what was merged).

    ``gpu`` is the gpu table of a :class:`~.tracearrays.TraceArrays` (numpy columns name codes,
    device, stream, ts_us, end_us, ...). Within one (device, stream, name), an activity whose
    [ts_us, end_us] lies inside an earlier-starting (or equal, longer) one is dropped. Row order of
    the kept activities is unchanged.
    """
    drop, same = _repeats(gpu, ("device", "stream", "name"), nested=True)
    if not drop.any():
        return gpu, []
    notes = []
    if same.any():
        notes.append(
            f"{count(int(same.sum()), 'GPU activity', 'GPU activities')} repeated exactly (same device, stream, name, "
            "start and duration): "
            "counted once"
        )
    nested = int(drop.sum() - same.sum())
    if nested:
        notes.append(
            f"{count(nested, 'GPU activity', 'GPU activities')} nested inside another of the same name on the same "
            "device and stream: "
            "counted once (the outer one kept)"
        )
    return _without(gpu, drop), notes


def drop_repeated_ranges(annotations: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(``annotations`` without repeated or same-name nested ranges, warnings naming what was dropped).

    A ``record_function`` range repeated exactly (same pid, tid, name, start and duration: a trace written
    twice into one file, a merge of overlapping captures), or nested inside an earlier-starting one of the same
    name on the same thread (a ``ProfilerStep#3`` inside ``ProfilerStep#3``, a decorated function that calls
    itself), would make two steps of one; the outer (first) one is kept, as :func:`drop_repeated` keeps the
    outer GPU activity. Row order of the kept ranges is unchanged."""
    drop, same = _repeats(annotations, ("pid", "tid", "name"), nested=True)
    if not drop.any():
        return annotations, []
    notes = []
    if same.any():
        notes.append(f"{count(int(same.sum()), 'range')} (record_function) repeated exactly (same thread, name, "
                     "start and duration): counted once")
    nested = int(drop.sum() - same.sum())
    if nested:
        notes.append(f"{count(nested, 'range')} (record_function) nested inside another of the same name on the "
                     "same thread: counted once (the outer one kept)")
    return _without(annotations, drop), notes


def drop_repeated_calls(runtime: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(``runtime`` without CPU API calls repeated exactly, a warning naming how many), so a launch or a
    synchronize written twice (same pid, tid, name, correlation, start and duration) counts once. Calls of one
    name nested in one another are left alone: a runtime call may wrap a driver call, and those differ by name."""
    drop, _ = _repeats(runtime, ("pid", "tid", "name", "correlation"), nested=False)
    if not drop.any():
        return runtime, []
    return _without(runtime, drop), [
        f"{count(int(drop.sum()), 'CPU API call')} repeated exactly (same thread, name, correlation id, start and "
        "duration): counted once"]


def overlap_notes(devices: list[dict], arrays: TraceArrays) -> list[str]:
    """One warning per device whose streams run at the same time: the summed busy time of its
    streams (each a union) minus the device's busy_us, in µs.

    ``devices`` are the ``devices`` entries of a trace summary (device, streams, busy_us). Differences
    within float64 rounding of the trace's times (an ulp per interval) are not overlap.
    """
    import numpy as np

    from .intervals import interval_stats, pair_codes
    from .tracecolumns import _NA

    gpu = arrays.gpu
    if not len(gpu["ts_us"]):
        return []
    device = gpu["device"]
    stream = np.where(gpu["stream"] == _NA, -1, gpu["stream"])
    key, pairs = pair_codes(device, stream)
    ts, end = gpu["ts_us"], gpu["end_us"]
    keys, stats = interval_stats(key, ts, end, np.full(len(ts), np.nan), 0.0)
    per_stream = stats["busy_us"]
    stream_device = pairs[keys, 0]
    notes = []
    for dev in devices:
        mine = device == dev["device"]
        overlap = float(per_stream[stream_device == dev["device"]].sum()) - dev["busy_us"]
        rounding = 2 * int(mine.sum()) * float(np.spacing(np.abs(end[mine]).max()))
        if dev["streams"] > 1 and overlap > rounding:
            notes.append(
                f"device {dev['device']}: its {dev['streams']} streams run at the same time for {overlap:,.3f} µs: "
                "busy and idle time count that time once, category and kernel totals (summed durations) once "
                "per activity"
            )
    return notes


def skew_note(arrays: TraceArrays) -> str | None:
    """A warning when GPU activities start before their launch call (CPU/GPU clock skew), else None."""
    from .tracearrays import launch_rows

    rows = launch_rows(arrays)
    launched = rows >= 0
    launched[launched] = arrays.runtime["is_launch"][rows[launched]]
    delays = arrays.gpu["ts_us"][launched] - arrays.runtime["ts_us"][rows[launched]]
    early = delays < 0
    if not early.any():
        return None
    return (
        f"{int(early.sum())} of {count(len(delays), 'launched GPU activity', 'launched GPU activities')} "
        f"{plural(int(early.sum()), 'starts', 'start')} before {plural(int(early.sum()), 'its', 'their')} launch call, "
        "by up to "
        f"{-float(delays[early].min()):,.3f} µs: the CPU and GPU clocks disagree, so those launch delays are "
        "negative and host-wait idle time is undercounted"
    )
