"""Device timeline metrics of a parsed :class:`~.frames.Trace`: pure functions, no printing.

Definitions follow docs/design.md ("Metric definitions"): busy_us is the length of the union of a
device's activity intervals over all streams, span_us is last end − first start, bubble_ratio =
1 − busy/span. Idle gaps between busy intervals are split as in Holistic Trace Analysis' idle-time
breakdown, with the threshold in µs: host-wait when the next activity's launch call started at or
after the previous activity ended, else kernel-wait when the gap is below ``threshold_us``, else
other. This module gives those interval metrics per device (:func:`device_summary`,
:func:`idle_breakdown`) and GPU time by kernel category and name (:func:`kernel_breakdown`,
:func:`top_kernels`) as pandas frames of what :mod:`.arraysummary` computes on numpy columns (the
numpy cores are :mod:`.intervals`'s), and the idle threshold's default and check (:func:`check_threshold`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ...errors import BubblescopeError
from .arrays import as_arrays
from .arraysummary import breakdown_table, device_table, window_rows
from .intervals import ratio

if TYPE_CHECKING:
    import pandas as pd

    from .frames import Trace

# HTA 0.5 defaults consecutive_kernel_delay to 30, documented as ns but compared with µs trace
# times (so 30 µs). Back-to-back bs-1 decode kernels launched ahead sit 1-4 µs apart, so 5 µs
# separates the launch gap from a real stall.
DEFAULT_IDLE_THRESHOLD_US = 5.0
TOP_KERNELS = 15


def check_threshold(threshold_us: float) -> float:
    """Return ``threshold_us`` as float; BubblescopeError unless it is a finite number >= 0."""
    try:
        value = float(threshold_us)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise BubblescopeError(f"--idle-threshold-us {threshold_us!r}: must be a finite number of µs >= 0")
    return value


def device_summary(
    trace: Trace, window: tuple[float, float] | None = None, threshold_us: float = DEFAULT_IDLE_THRESHOLD_US
) -> pd.DataFrame:
    """Per device: device, kernels, memcpys, memsets, streams, busy_us, span_us, bubble_ratio,
    first_us, last_us, host_wait_us, kernel_wait_us, other_idle_us (µs, float64).

    ``window`` = (start_us, end_us) in trace µs clips activities to that range first (span_us is then
    the clipped last end − first start). Devices are ids as in the trace (``args.device``, else pid;
    -1 where absent). Empty frame when the trace has no GPU activity.
    """
    import pandas as pd

    return pd.DataFrame(device_table(as_arrays(trace), check_threshold(threshold_us), window))


def idle_breakdown(
    trace: Trace, window: tuple[float, float] | None = None, threshold_us: float = DEFAULT_IDLE_THRESHOLD_US
) -> pd.DataFrame:
    """Idle time between busy intervals per device: device, idle_us, host_wait_us, kernel_wait_us,
    other_us (µs) and host_wait_share, kernel_wait_share, other_share (of idle_us; NaN if no idle)."""
    summary = device_summary(trace, window, threshold_us)
    out = summary[["device", "host_wait_us", "kernel_wait_us", "other_idle_us"]].rename(
        columns={"other_idle_us": "other_us"}
    )
    out.insert(1, "idle_us", out[["host_wait_us", "kernel_wait_us", "other_us"]].sum(axis=1))
    for col in ("host_wait", "kernel_wait", "other"):
        out[f"{col}_share"] = ratio(out[f"{col}_us"], out["idle_us"])
    out["threshold_us"] = float(threshold_us)
    return out

def _breakdown(trace: Trace, window: tuple[float, float] | None, device: int | None, by_name: bool,
               n: int | None = None) -> pd.DataFrame:
    """:func:`.arraysummary.breakdown_table` of the activities in scope (``window`` clip, one ``device``
    or all; durations clipped to the window) as a frame."""
    import pandas as pd

    arrays = as_arrays(trace)
    rows, ts, end = window_rows(arrays, window)
    dur = None if window is None else end - ts
    if device is not None:
        mine = arrays.gpu["device"][rows] == device
        rows, dur = rows[mine], None if dur is None else dur[mine]
    return pd.DataFrame(breakdown_table(arrays, rows, by_name, n, dur))


def kernel_breakdown(
    trace: Trace, window: tuple[float, float] | None = None, device: int | None = None
) -> pd.DataFrame:
    """GPU time by kernel category (``categories.CATEGORIES``): category, count, total_us (sum of
    durations, µs), share (of all GPU-activity time in scope: ``window`` clip, one ``device`` or all);
    sorted by total_us descending."""
    return _breakdown(trace, window, device, by_name=False)


def top_kernels(
    trace: Trace, n: int = TOP_KERNELS, window: tuple[float, float] | None = None, device: int | None = None
) -> pd.DataFrame:
    """The ``n`` GPU activities (by name) with most total time: name, category, count, total_us,
    share (of all GPU-activity time in scope, as in :func:`kernel_breakdown`)."""
    return _breakdown(trace, window, device, by_name=True, n=int(n))
