"""Event patterns that would count GPU time twice or give impossible numbers, found and named.

- :func:`drop_repeated`: a GPU activity repeated exactly, or nested inside another of the same name
  on the same device and stream (a profiler writing one kernel twice, a range re-emitted around
  itself), is counted once: the outer (first) one is kept.
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


def drop_repeated(gpu: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(``gpu`` without repeated or same-name nested activities, warnings naming what was merged).

    ``gpu`` is the gpu table of a :class:`~.tracearrays.TraceArrays` (numpy columns name codes,
    device, stream, ts_us, end_us, ...). Within one (device, stream, name), an activity whose
    [ts_us, end_us] lies inside an earlier-starting (or equal, longer) one is dropped. Row order of
    the kept activities is unchanged.
    """
    import numpy as np

    from .intervals import group_cummax

    n = len(gpu["ts_us"])
    if n < 2:
        return gpu, []
    name, device, stream = gpu["name"], gpu["device"], gpu["stream"]
    ts, end = gpu["ts_us"], gpu["end_us"]
    order = np.lexsort((-end, ts, name, stream, device))  # the outer range first among equal starts
    d, s, k, t, e = device[order], stream[order], name[order], ts[order], end[order]
    head = np.ones(n, dtype=bool)
    head[1:] = (d[1:] != d[:-1]) | (s[1:] != s[:-1]) | (k[1:] != k[:-1])
    reach = group_cummax(np.cumsum(head) - 1, e)
    inside = np.zeros(n, dtype=bool)
    inside[1:] = ~head[1:] & (e[1:] <= reach[:-1])
    if not inside.any():
        return gpu, []
    same = np.zeros(n, dtype=bool)
    same[1:] = inside[1:] & (t[1:] == t[:-1]) & (e[1:] == e[:-1])
    keep = np.ones(n, dtype=bool)
    keep[order] = ~inside
    notes = []
    if same.any():
        notes.append(
            f"{count(int(same.sum()), 'GPU activity', 'GPU activities')} repeated exactly (same device, stream, name, "
            "start and duration): "
            "counted once"
        )
    nested = int(inside.sum() - same.sum())
    if nested:
        notes.append(
            f"{count(nested, 'GPU activity', 'GPU activities')} nested inside another of the same name on the same "
            "device and stream: "
            "counted once (the outer one kept)"
        )
    return {key: arr[keep] for key, arr in gpu.items()}, notes


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
