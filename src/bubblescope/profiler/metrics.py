"""Device timeline metrics of a parsed :class:`~bubblescope.profiler.trace.Trace`: pure functions, no printing.

Definitions follow DESIGN.md ("Metric definitions"): busy_us is the length of the union of a
device's activity intervals over all streams, span_us is last end − first start, bubble_ratio =
1 − busy/span. Idle gaps between busy intervals are split as in Holistic Trace Analysis' idle-time
breakdown, with the threshold in µs: host-wait when the next activity's launch call started at or
after the previous activity ended, else kernel-wait when the gap is below ``threshold_us``, else
other. This module owns those interval metrics per device (:func:`device_summary`,
:func:`idle_breakdown`), GPU time by kernel category and name (:func:`kernel_breakdown`,
:func:`top_kernels`), their JSON forms (:func:`json_float`, :func:`records`) and the helpers the
step metrics (:mod:`.steps`) and the JSON summaries (:mod:`.timeline`) share.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..errors import BubblescopeError
from .categories import categorize_frame
from .intervals import STATS as _STATS
from .intervals import interval_stats, pair_codes  # noqa: F401 - pair_codes: part of this module's API
from .intervals import ratio as _ratio

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from .trace import Trace

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
        raise BubblescopeError(f"idle threshold {threshold_us!r}: must be a finite number of µs >= 0")
    return value


def _interval_stats(
    groups: np.ndarray, start: np.ndarray, end: np.ndarray, launch_ts: np.ndarray, threshold_us: float
) -> pd.DataFrame:
    """Union and idle split of intervals per group key (:func:`.intervals.interval_stats`); one row per
    key (index ``group``), columns ``_STATS`` (µs)."""
    import pandas as pd

    if len(start) == 0:
        return pd.DataFrame(columns=list(_STATS), dtype=float)
    keys, stats = interval_stats(groups, start, end, launch_ts, threshold_us)
    return pd.DataFrame(stats, index=pd.Index(keys, name="group"))


def _launch_rows(trace: Trace) -> np.ndarray:
    """Per GPU activity, the position in ``trace.runtime`` of the CPU call with its correlation (-1 if none).

    Kept on the trace between calls (a summary asks for it five times; each sorts every CPU call),
    keyed by the frames' identity and lengths so a replaced or resized frame is looked up again.
    """
    key = (id(trace.gpu), id(trace.runtime), len(trace.gpu), len(trace.runtime))
    cached = trace.__dict__.get("_launch_rows_cache")
    if cached is not None and cached[0] == key:
        return cached[1].copy()
    rows = _match_launches(trace)
    object.__setattr__(trace, "_launch_rows_cache", (key, rows))
    return rows.copy()


def _match_launches(trace: Trace) -> np.ndarray:
    import numpy as np

    rt_ok = trace.runtime["correlation"].notna().to_numpy()
    rc = trace.runtime["correlation"].to_numpy(dtype="int64", na_value=0)[rt_ok]
    gc = trace.gpu["correlation"].to_numpy(dtype="int64", na_value=0)
    values, first = np.unique(rc, return_index=True)  # runtime is time-sorted: the earliest call per id
    if len(values) == 0:
        return np.full(len(gc), -1, dtype=np.int64)
    i = np.minimum(np.searchsorted(values, gc), len(values) - 1)
    hit = (values[i] == gc) & trace.gpu["correlation"].notna().to_numpy()
    return np.where(hit, np.flatnonzero(rt_ok)[first][i], -1)


# The columns interval and breakdown metrics read; selecting them first keeps row filters from
# copying the other (grid, occupancy, ...) columns of a trace of millions of activities.
_INTERVAL_COLUMNS = ("name", "kind", "device", "stream", "ts_us", "dur_us", "end_us", "category")


def _windowed(trace: Trace, window: tuple[float, float] | None) -> pd.DataFrame:
    """GPU activities overlapping ``window`` (start_us, end_us), clipped to it; all of them if None.
    Columns: those of ``_INTERVAL_COLUMNS`` the trace has; index as in ``trace.gpu``."""
    gpu = trace.gpu[[c for c in _INTERVAL_COLUMNS if c in trace.gpu]]
    if window is None:
        return gpu
    w0, w1 = float(window[0]), float(window[1])
    if not w1 >= w0:
        raise BubblescopeError(f"window {window!r}: end must not be before start")
    gpu = gpu[((gpu["end_us"] >= w0) & (gpu["ts_us"] <= w1)).to_numpy()].copy()
    gpu["ts_us"] = gpu["ts_us"].clip(lower=w0)
    gpu["end_us"] = gpu["end_us"].clip(upper=w1)
    gpu["dur_us"] = gpu["end_us"] - gpu["ts_us"]
    return gpu


def _stats_by(gpu: pd.DataFrame, key: np.ndarray, launch_ts: np.ndarray, threshold_us: float) -> pd.DataFrame:
    return _interval_stats(key, gpu["ts_us"].to_numpy(), gpu["end_us"].to_numpy(), launch_ts, threshold_us)


def _launch_ts(trace: Trace, gpu: pd.DataFrame) -> np.ndarray:
    import numpy as np

    rows = _launch_rows(trace)[trace.gpu.index.get_indexer(gpu.index)]
    ts = trace.runtime["ts_us"].to_numpy()
    return np.where(rows >= 0, ts[np.maximum(rows, 0)] if len(ts) else np.nan, np.nan)


def _devices(gpu: pd.DataFrame) -> np.ndarray:
    return gpu["device"].to_numpy(dtype="int64", na_value=-1)


def device_summary(
    trace: Trace, window: tuple[float, float] | None = None, threshold_us: float = DEFAULT_IDLE_THRESHOLD_US
) -> pd.DataFrame:
    """Per device: device, kernels, memcpys, memsets, streams, busy_us, span_us, bubble_ratio,
    first_us, last_us, host_wait_us, kernel_wait_us, other_idle_us (µs, float64).

    ``window`` = (start_us, end_us) in trace µs clips activities to that range first (span_us is then
    the clipped last end − first start). Devices are ids as in the trace (``args.device``, else pid;
    -1 where absent). Empty frame when the trace has no GPU activity.
    """
    import numpy as np
    import pandas as pd

    threshold_us = check_threshold(threshold_us)
    gpu = _windowed(trace, window)
    dev = _devices(gpu)
    stats = _stats_by(gpu, dev, _launch_ts(trace, gpu), threshold_us)
    code = np.searchsorted(stats.index.to_numpy(), dev)  # stats rows are the sorted device ids
    kind = gpu["kind"].to_numpy()
    out = pd.DataFrame(index=stats.index)
    for name, col in (("kernel", "kernels"), ("memcpy", "memcpys"), ("memset", "memsets")):
        out[col] = np.bincount(code[kind == name], minlength=len(out)).astype(np.int64)
    _, pairs = pair_codes(code.astype(np.int64), gpu["stream"].to_numpy(dtype="int64", na_value=-1))
    out["streams"] = np.bincount(pairs[:, 0], minlength=len(out)).astype(np.int64)
    out = out.join(stats)
    out.insert(out.columns.get_loc("span_us") + 1, "bubble_ratio", 1 - _ratio(out["busy_us"], out["span_us"]))
    return out.rename_axis("device").reset_index()


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
        out[f"{col}_share"] = _ratio(out[f"{col}_us"], out["idle_us"])
    out["threshold_us"] = float(threshold_us)
    return out

def _breakdown(gpu: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """count, total_us and share per ``by`` (["category"] or ["name", "category"]; a name has one category)."""
    import numpy as np
    import pandas as pd

    if gpu.empty:
        return pd.DataFrame(columns=[*by, "count", "total_us", "share"])
    cats = (gpu["category"] if "category" in gpu else categorize_frame(gpu)).to_numpy()
    codes, uniques = pd.factorize(gpu[by[0]].to_numpy() if by[0] != "category" else cats)
    out = pd.DataFrame({by[0]: np.asarray(uniques, dtype=object)})
    if len(by) > 1:
        first = np.full(len(uniques), len(codes))
        np.minimum.at(first, codes, np.arange(len(codes)))
        out["category"] = cats[first]
    out["count"] = np.bincount(codes, minlength=len(uniques)).astype(np.int64)
    out["total_us"] = np.bincount(codes, weights=gpu["dur_us"].to_numpy(dtype=float), minlength=len(uniques))
    total = out["total_us"].sum()
    out["share"] = out["total_us"] / total if total > 0 else math.nan
    return out.sort_values(["total_us", "count"], ascending=False, kind="stable", ignore_index=True)


def _scope(trace: Trace, window: tuple[float, float] | None, device: int | None) -> pd.DataFrame:
    gpu = _windowed(trace, window)
    if device is None:
        return gpu
    mine = (gpu["device"] == device).to_numpy(dtype=bool, na_value=False)
    return gpu if mine.all() else gpu[mine]


def kernel_breakdown(
    trace: Trace, window: tuple[float, float] | None = None, device: int | None = None
) -> pd.DataFrame:
    """GPU time by kernel category (``categories.CATEGORIES``): category, count, total_us (sum of
    durations, µs), share (of all GPU-activity time in scope: ``window`` clip, one ``device`` or all);
    sorted by total_us descending."""
    return _breakdown(_scope(trace, window, device), ["category"])


def top_kernels(
    trace: Trace, n: int = TOP_KERNELS, window: tuple[float, float] | None = None, device: int | None = None
) -> pd.DataFrame:
    """The ``n`` GPU activities (by name) with most total time: name, category, count, total_us,
    share (of all GPU-activity time in scope, as in :func:`kernel_breakdown`)."""
    return _breakdown(_scope(trace, window, device), ["name", "category"]).head(int(n))


def json_float(value: Any, digits: int | None = None) -> float | None:
    """JSON-ready float: None for NaN/None/inf (unmeasurable), never 0."""
    if value is None:
        return None
    value = float(value)
    if not math.isfinite(value):
        return None
    return round(value, digits) if digits is not None else value


def records(frame: pd.DataFrame, cols: list[str]) -> list[dict]:
    """Rows of a breakdown frame as JSON-ready dicts (count int, total_us/share float or None, else str)."""
    return [
        {
            c: (json_float(v) if c in ("total_us", "share") else (int(v) if c == "count" else str(v)))
            for c, v in zip(cols, row)
        }
        for row in frame[cols].itertuples(index=False)
    ]
