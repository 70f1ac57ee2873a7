"""Event patterns that give a trace summary numbers to be read with care, found and named as warnings.

- :func:`overlap_notes`: streams of one device running at the same time. busy_us is a union and
  counts that time once; category and kernel totals sum durations and count it per activity, so the
  warning gives the size of the difference.
- :func:`skew_note`: kernels that start before the CPU call that launched them. CUPTI takes GPU
  times from the GPU's clock and CPU times from the host's; when the two disagree, launch delays come
  out negative, and the warning says by how much.
"""

from __future__ import annotations

from ...wording import count, plural
from .arrays import TraceArrays, launch_rows
from .intervals import interval_stats, pair_codes
from .schema import NA


def overlap_notes(devices: list[dict], arrays: TraceArrays) -> list[str]:
    """One warning per device whose streams run at the same time: the summed busy time of its
    streams (each a union) minus the device's busy_us, in µs.

    ``devices`` are the ``devices`` entries of a trace summary (device, streams, busy_us). Differences
    within float64 rounding of the trace's times (an ulp per interval) are not overlap.
    """
    import numpy as np

    gpu = arrays.gpu
    if not len(gpu["ts_us"]):
        return []
    device = gpu["device"]
    stream = np.where(gpu["stream"] == NA, -1, gpu["stream"])
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
