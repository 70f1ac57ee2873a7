"""Timeline metrics of a parsed :class:`~bubblescope.profiler.trace.Trace`: pure functions, no printing.

Definitions follow DESIGN.md ("Metric definitions"): busy_us is the length of the union of a
device's activity intervals over all streams, span_us is last end − first start, bubble_ratio =
1 − busy/span. Idle gaps between busy intervals are split as in Holistic Trace Analysis' idle-time
breakdown, with the threshold in µs: host-wait when the next activity's launch call started at or
after the previous activity ended, else kernel-wait when the gap is below ``threshold_us``, else
other. Kernels belong to a decode step through their launch call's correlation id (a CUDA-graph
replay's kernels all carry the cudaGraphLaunch's), the launch call being inside the step's
``record_function`` range on the same thread.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..errors import BubblescopeError
from .categories import categorize_frame

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from .trace import Trace

DEFAULT_STEP_MARKER = "bubblescope.decode_step"
# HTA 0.5 defaults consecutive_kernel_delay to 30, documented as ns but compared with µs trace
# times (so 30 µs). Back-to-back bs-1 decode kernels launched ahead sit 1-4 µs apart, so 5 µs
# separates the launch gap from a real stall.
DEFAULT_IDLE_THRESHOLD_US = 5.0
TOP_KERNELS = 15
_STATS = ("busy_us", "span_us", "first_us", "last_us", "host_wait_us", "kernel_wait_us", "other_idle_us")


def check_threshold(threshold_us: float) -> float:
    """Return ``threshold_us`` as float; BubblescopeError unless it is a finite number >= 0."""
    try:
        value = float(threshold_us)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise BubblescopeError(f"idle threshold {threshold_us!r}: must be a finite number of µs >= 0")
    return value


def check_skip_steps(skip_steps: int) -> int:
    """Return ``skip_steps`` as int; BubblescopeError unless it is an integer >= 0."""
    import numpy as np

    if isinstance(skip_steps, bool) or not isinstance(skip_steps, (int, np.integer)) or skip_steps < 0:
        raise BubblescopeError(f"skip_steps {skip_steps!r}: must be an integer >= 0")
    return int(skip_steps)


def _interval_stats(
    groups: np.ndarray, start: np.ndarray, end: np.ndarray, launch_ts: np.ndarray, threshold_us: float
) -> pd.DataFrame:
    """Union and idle split of intervals per group key; one row per key, columns ``_STATS`` (µs)."""
    import numpy as np
    import pandas as pd

    n = len(start)
    if n == 0:
        return pd.DataFrame(columns=list(_STATS), dtype=float)
    order = np.lexsort((start, groups))
    g, s, e, lt = groups[order], start[order], end[order], launch_ts[order]
    head = np.ones(n, dtype=bool)
    head[1:] = g[1:] != g[:-1]
    code = np.cumsum(head) - 1
    reach = pd.Series(e).groupby(code).cummax().to_numpy()  # furthest end so far in the group
    prev = np.full(n, -np.inf)
    prev[1:] = reach[:-1]
    new = head | (s > prev)  # an activity starting after everything before it opens an interval
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, n - 1)
    k = int(code[-1]) + 1
    busy = np.bincount(code[first], weights=reach[last] - s[first], minlength=k).astype(float)
    gap_rows = new & ~head
    gap = s[gap_rows] - prev[gap_rows]
    host = lt[gap_rows] >= prev[gap_rows]  # NaN launch time (no launch call) is never host-wait
    short = ~host & (gap < threshold_us)
    gc = code[gap_rows]
    ends = np.bincount(code, minlength=k)
    out = pd.DataFrame(
        {
            "busy_us": busy,
            "first_us": s[head],
            "last_us": reach[np.cumsum(ends) - 1],
            # bincount of an empty array returns ints whatever the weights; keep every column float.
            "host_wait_us": np.bincount(gc, weights=gap * host, minlength=k).astype(float),
            "kernel_wait_us": np.bincount(gc, weights=gap * short, minlength=k).astype(float),
            "other_idle_us": np.bincount(gc, weights=gap * (~host & ~short), minlength=k).astype(float),
        },
        index=pd.Index(g[head], name="group"),
    )
    out["span_us"] = out["last_us"] - out["first_us"]
    return out[list(_STATS)]


def _ratio(num: Any, den: Any) -> Any:
    """num/den with NaN where den is 0 (works on scalars and Series)."""
    import numpy as np

    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.divide(num, den)
    return np.where(np.asarray(den) > 0, out, np.nan) if np.ndim(out) else (out if den > 0 else math.nan)


def _launch_rows(trace: Trace) -> np.ndarray:
    """Per GPU activity, the position in ``trace.runtime`` of the CPU call with its correlation (-1 if none)."""
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


def _windowed(trace: Trace, window: tuple[float, float] | None) -> pd.DataFrame:
    """GPU activities overlapping ``window`` (start_us, end_us), clipped to it; all of them if None."""
    gpu = trace.gpu
    if window is None:
        return gpu
    w0, w1 = float(window[0]), float(window[1])
    if not w1 >= w0:
        raise BubblescopeError(f"window {window!r}: end must not be before start")
    gpu = gpu[(gpu["end_us"] >= w0) & (gpu["ts_us"] <= w1)].copy()
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
    pairs = np.unique(np.stack([code, gpu["stream"].to_numpy(dtype="int64", na_value=-1)]), axis=1)
    out["streams"] = np.bincount(pairs[0], minlength=len(out)).astype(np.int64)
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


def find_steps(trace: Trace, step_marker: str = DEFAULT_STEP_MARKER) -> pd.DataFrame:
    """Decode-step ranges: annotations named ``step_marker`` or ``step_marker#<anything>``.

    Returns step (0.. in time order), name, pid, tid, ts_us, dur_us, end_us, matched_by: "thread"
    when the marker's thread made CUDA calls (launches are matched on that pid/tid), "time" when it
    made none (some exporters put the marker on another pid; launches are then matched by time only).
    """
    import numpy as np
    import pandas as pd

    if not isinstance(step_marker, str) or not step_marker.strip():
        raise BubblescopeError(f"step marker {step_marker!r}: must be a non-empty name")
    ann = trace.annotations
    names = ann["name"]
    prefix = step_marker if step_marker.endswith("#") else step_marker + "#"
    steps = ann[((names == step_marker) | names.str.startswith(prefix)).to_numpy(dtype=bool)]
    steps = steps.reset_index(drop=True)
    steps.insert(0, "step", np.arange(len(steps), dtype=np.int64))
    threads = {
        (p, t)
        for p, t in zip(trace.runtime["pid"].tolist(), trace.runtime["tid"].tolist())
        if not (pd.isna(p) or pd.isna(t))
    }
    steps["matched_by"] = [
        "thread" if (p, t) in threads else "time" for p, t in zip(steps["pid"].tolist(), steps["tid"].tolist())
    ]
    return steps


def _runtime_steps(trace: Trace, steps: pd.DataFrame) -> np.ndarray:
    """Per CPU call in ``trace.runtime``: the step whose range holds its start on its thread (-1: none)."""
    import numpy as np

    rt = trace.runtime
    out = np.full(len(rt), -1, dtype=np.int64)
    ts = rt["ts_us"].to_numpy()
    pid = rt["pid"].to_numpy(dtype="float64", na_value=np.nan)
    tid = rt["tid"].to_numpy(dtype="float64", na_value=np.nan)
    for (p, t, how), grp in steps.groupby(["pid", "tid", "matched_by"], dropna=False, sort=False):
        if how == "thread":  # a marker without pid/tid never has CUDA calls on its thread, so p, t are set
            sel = np.flatnonzero((pid == float(p)) & (tid == float(t)))
        else:
            sel = np.arange(len(rt))
        grp = grp.sort_values("ts_us")
        k = np.searchsorted(grp["ts_us"].to_numpy(), ts[sel], side="right") - 1
        inside = (k >= 0) & (ts[sel] < grp["end_us"].to_numpy()[np.maximum(k, 0)])
        out[sel[inside]] = grp["step"].to_numpy()[k[inside]]
    return out


def _gpu_steps(trace: Trace, steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(step per GPU activity, step per CPU call), -1 where unassigned."""
    import numpy as np

    rt_step = _runtime_steps(trace, steps)
    rows = _launch_rows(trace)
    gpu_step = np.where(rows >= 0, rt_step[np.maximum(rows, 0)] if len(rt_step) else -1, -1)
    return gpu_step, rt_step


def assign_steps(trace: Trace, step_marker: str = DEFAULT_STEP_MARKER) -> pd.Series:
    """Step index (as in :func:`find_steps`) of every GPU activity, ``<NA>`` where its launch call is in
    no step; an Int64 Series aligned with ``trace.gpu``."""
    import pandas as pd

    gpu_step, _ = _gpu_steps(trace, find_steps(trace, step_marker))
    return pd.Series(pd.array(gpu_step, dtype="Int64"), index=trace.gpu.index, name="step").where(gpu_step >= 0)


def _main_device(gpu: pd.DataFrame) -> int | None:
    if gpu.empty:
        return None
    counts = gpu["device"].value_counts()
    return int(counts[counts == counts.max()].index.min())


def _step_table(trace: Trace, steps: pd.DataFrame, threshold_us: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-step metrics, the step-assigned GPU activities of the main device with step/category/launch_ts)."""
    import numpy as np
    import pandas as pd

    gpu_step, rt_step = _gpu_steps(trace, steps)
    mine = trace.gpu[gpu_step >= 0].assign(step=gpu_step[gpu_step >= 0])
    device = _main_device(mine)
    mine = mine[mine["device"] == device] if device is not None else mine
    mine = mine.assign(launch_ts_us=_launch_ts(trace, mine), category=categorize_frame(mine))
    stats = _stats_by(mine, mine["step"].to_numpy(), mine["launch_ts_us"].to_numpy(), threshold_us)

    table = steps[["step", "name", "ts_us"]].copy()
    table["wall_us"] = steps["dur_us"]
    kernels = mine[mine["kind"] == "kernel"].groupby("step").size()
    table["kernels"] = kernels.reindex(table["step"], fill_value=0).to_numpy().astype("int64")
    rt = trace.runtime
    in_step = rt_step >= 0
    ends = steps["end_us"].to_numpy()[np.maximum(rt_step, 0)]
    # min(dur, step end - start) rather than min(end, step end) - start: exact for calls inside the step
    overlap = np.clip(np.minimum(rt["dur_us"].to_numpy(), ends - rt["ts_us"].to_numpy()), 0, None)
    for flag, count_col, time_col in (("is_launch", "launches", "launch_us"), ("is_sync", None, "sync_us")):
        sel = in_step & rt[flag].to_numpy(dtype=bool)
        if count_col:
            table[count_col] = np.bincount(rt_step[sel], minlength=len(steps)).astype("int64")
        table[time_col] = np.bincount(rt_step[sel], weights=overlap[sel], minlength=len(steps)).astype(float)
    per = stats.reindex(table["step"])
    table["gpu_busy_us"] = per["busy_us"].to_numpy()
    table["gpu_span_us"] = per["span_us"].to_numpy()
    table["bubble_ratio"] = 1 - _ratio(table["gpu_busy_us"].to_numpy(), table["gpu_span_us"].to_numpy())
    table["launch_share"] = _ratio(table["launch_us"].to_numpy(), table["wall_us"].to_numpy())
    table["sync_share"] = _ratio(table["sync_us"].to_numpy(), table["wall_us"].to_numpy())
    for col in ("host_wait_us", "kernel_wait_us", "other_idle_us"):
        table[col] = per[col].to_numpy()
    table["device"] = pd.array([device] * len(table), dtype="Int64")
    return table.reset_index(drop=True), mine


def step_metrics(
    trace: Trace, step_marker: str = DEFAULT_STEP_MARKER, threshold_us: float = DEFAULT_IDLE_THRESHOLD_US
) -> pd.DataFrame:
    """One row per decode step (all steps, warm-up included).

    Columns: step, name, ts_us, wall_us (the step range's duration), kernels (kernel activities
    launched in the step on that device), launches (launch API calls in the step), gpu_busy_us / gpu_span_us /
    bubble_ratio (union, extent and 1 − busy/span of the step's activities), launch_us / sync_us (CPU
    µs inside launch / synchronize calls, clipped to the step), launch_share / sync_share (those over
    wall_us), host_wait_us, kernel_wait_us, other_idle_us (the step's idle gaps), device. GPU columns
    cover the device with most step activity; NaN where the step has no GPU activity.
    """
    threshold_us = check_threshold(threshold_us)
    table, _ = _step_table(trace, find_steps(trace, step_marker), threshold_us)
    return table


def launch_delays(trace: Trace) -> pd.DataFrame:
    """Per GPU activity launched by a launch API (see ``trace.LAUNCH_APIS``): name, kind, device,
    stream, correlation, launch_name, launch_ts_us, start_us, delay_us = start − launch call start (µs),
    first_in_launch (False for the later kernels of a CUDA-graph replay, which share one launch)."""
    import numpy as np

    rows = _launch_rows(trace)
    rt = trace.runtime
    launched = rows >= 0
    launched[launched] = rt["is_launch"].to_numpy(dtype=bool)[rows[launched]]
    gpu = trace.gpu[launched]
    r = rows[launched]
    out = gpu[["name", "kind", "device", "stream", "correlation"]].copy()
    out["launch_name"] = rt["name"].to_numpy()[r]
    out["launch_ts_us"] = rt["ts_us"].to_numpy()[r]
    out["start_us"] = gpu["ts_us"]
    out["delay_us"] = out["start_us"] - out["launch_ts_us"]
    first = np.ones(len(out), dtype=bool)
    if len(out):
        first = ~out.sort_values("start_us", kind="stable").duplicated("correlation").reindex(out.index).to_numpy()
    out["first_in_launch"] = first
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
    return gpu if device is None else gpu[(gpu["device"] == device).to_numpy(dtype=bool, na_value=False)]


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


def timeline_summary(
    trace: Trace,
    step_marker: str = DEFAULT_STEP_MARKER,
    skip_steps: int = 0,
    threshold_us: float = DEFAULT_IDLE_THRESHOLD_US,
) -> dict:
    """The JSON-ready timeline metrics of one engine's decode, as the results file stores them.

    Keys (exactly): available, reason, steps, device, kernels_per_step, launches_per_step,
    launches_per_s, bubble_ratio (decode window: first activity of the first measured step to the
    last end of the last one, all of the device's activity counted), bubble_ratio_steps (per measured
    step), launch_share, sync_share (summed over steps / summed wall time), gpu_busy_us_per_step,
    step_wall_us (median µs), idle {host_wait_us, kernel_wait_us, other_us, threshold_us} (mean per
    step), launch_delay_us {p50, p90, max} (first kernel of each launch, numpy linear percentiles),
    top_kernels (15), categories, max_registers_per_thread. Per-step counts are medians over the
    measured steps (the first ``skip_steps`` are warm-up). Unmeasurable values are None; without GPU
    activity ``available`` is False and only CPU-side values are filled.
    """
    import numpy as np

    threshold_us = check_threshold(threshold_us)
    skip_steps = check_skip_steps(skip_steps)
    out: dict[str, Any] = {
        "available": False,
        "reason": None,
        "steps": 0,
        "device": None,
        "kernels_per_step": None,
        "launches_per_step": None,
        "launches_per_s": None,
        "bubble_ratio": None,
        "bubble_ratio_steps": [],
        "launch_share": None,
        "sync_share": None,
        "gpu_busy_us_per_step": None,
        "step_wall_us": None,
        "idle": {"host_wait_us": None, "kernel_wait_us": None, "other_us": None, "threshold_us": threshold_us},
        "launch_delay_us": {"p50": None, "p90": None, "max": None},
        "top_kernels": [],
        "categories": [],
        "max_registers_per_thread": None,
    }
    steps = find_steps(trace, step_marker)
    if steps.empty:
        out["reason"] = f"no step marker {step_marker!r} in trace"
        return out
    table, mine = _step_table(trace, steps, threshold_us)
    table = table[table["step"] >= skip_steps]
    if table.empty:
        out["reason"] = f"all {len(steps)} steps are warm-up (skip_steps={skip_steps})"
        return out
    mine = mine[mine["step"] >= skip_steps]
    wall = float(table["wall_us"].median())
    launches = float(table["launches"].median())
    out.update(
        steps=len(table),
        launches_per_step=launches,
        step_wall_us=json_float(wall),
        launches_per_s=json_float(launches / (wall / 1e6)) if wall > 0 else None,
        launch_share=json_float(_ratio(table["launch_us"].sum(), table["wall_us"].sum())),
        sync_share=json_float(_ratio(table["sync_us"].sum(), table["wall_us"].sum())),
    )
    if trace.gpu.empty:
        out["reason"] = "no GPU activity in trace (CPU-only run)"
        return out
    if mine.empty:
        out["reason"] = (
            "no GPU activity linked to the steps (no launch inside a step carries a kernel's correlation id)"
        )
        return out
    device = int(mine["device"].iloc[0])
    decode_window = (float(mine["ts_us"].min()), float(mine["end_us"].max()))
    in_window = device_summary(trace, decode_window, threshold_us)
    row = in_window[in_window["device"] == device].iloc[0]
    delays = launch_delays(trace).reindex(mine.index).dropna(subset=["delay_us"])
    delays = delays[delays["first_in_launch"].astype(bool)]["delay_us"].to_numpy(dtype=float)
    regs = mine.loc[mine["kind"] == "kernel", "registers_per_thread"].max()
    out.update(
        available=True,
        device=device,
        kernels_per_step=float(table["kernels"].median()),
        bubble_ratio=json_float(row["bubble_ratio"]),
        bubble_ratio_steps=[json_float(v) for v in table["bubble_ratio"]],
        gpu_busy_us_per_step=json_float(table["gpu_busy_us"].median()),
        idle={
            "host_wait_us": json_float(table["host_wait_us"].mean()),
            "kernel_wait_us": json_float(table["kernel_wait_us"].mean()),
            "other_us": json_float(table["other_idle_us"].mean()),
            "threshold_us": threshold_us,
        },
        launch_delay_us={
            k: (json_float(np.percentile(delays, q)) if len(delays) else None)
            for k, q in (("p50", 50), ("p90", 90), ("max", 100))
        },
        top_kernels=records(
            _breakdown(mine, ["name", "category"]).head(TOP_KERNELS), ["name", "category", "count", "total_us", "share"]
        ),
        categories=records(_breakdown(mine, ["category"]), ["category", "count", "total_us", "share"]),
        max_registers_per_thread=None if regs != regs or regs is None else int(regs),
    )
    return out


def step_timeline(trace: Trace, step_marker: str = DEFAULT_STEP_MARKER, step_index: int = 0) -> dict:
    """One step's activities for a timeline plot, times in µs relative to the step range's start:
    ``{"kernels": [{name, category, stream, start_us, dur_us}], "launches": [{name, start_us, dur_us}]}``
    (all GPU activities of the step, every launch call in it). BubblescopeError if no such step."""
    import numpy as np

    steps = find_steps(trace, step_marker)
    if not 0 <= int(step_index) < len(steps):
        raise BubblescopeError(
            f"step {step_index}: out of range, the trace has {len(steps)} steps marked {step_marker!r}"
        )
    t0 = float(steps["ts_us"].iloc[int(step_index)])
    gpu_step, rt_step = _gpu_steps(trace, steps)
    gpu = trace.gpu[gpu_step == int(step_index)]
    gpu = gpu.assign(category=categorize_frame(gpu)).sort_values("ts_us", kind="stable")
    rt = trace.runtime[(rt_step == int(step_index)) & trace.runtime["is_launch"].to_numpy(dtype=bool)]
    stream = gpu["stream"].to_numpy(dtype="float64", na_value=np.nan)
    return {
        "kernels": [
            {
                "name": n,
                "category": c,
                "stream": None if s != s else int(s),
                "start_us": float(t - t0),
                "dur_us": float(d),
            }
            for n, c, s, t, d in zip(gpu["name"], gpu["category"], stream, gpu["ts_us"], gpu["dur_us"])
        ],
        "launches": [
            {"name": n, "start_us": float(t - t0), "dur_us": float(d)}
            for n, t, d in zip(rt["name"], rt["ts_us"], rt["dur_us"])
        ],
    }
