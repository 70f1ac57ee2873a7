"""Decode steps of a parsed :class:`~bubblescope.profiler.trace.Trace`: pure functions, no printing.

Kernels belong to a decode step through their launch call's correlation id (a CUDA-graph
replay's kernels all carry the cudaGraphLaunch's), the launch call being inside the step's
``record_function`` range on the same thread.

This module finds the steps (:func:`find_steps`), assigns GPU activities to them
(:func:`assign_steps`), computes per-step metrics (:func:`step_metrics`) and the delay from each
launch call to its kernel's start (:func:`launch_delays`); the interval arithmetic (busy, span,
idle split) is :mod:`.metrics`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import BubblescopeError
from ..wording import count, plural
from .categories import categorize_frame
from .metrics import (
    DEFAULT_IDLE_THRESHOLD_US,
    _launch_rows,
    _launch_ts,
    _ratio,
    _stats_by,
    check_threshold,
    pair_codes,
)

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from .trace import Trace

DEFAULT_STEP_MARKER = "bubblescope.decode_step"


def find_steps(trace: Trace, step_marker: str = DEFAULT_STEP_MARKER) -> pd.DataFrame:
    """Decode-step ranges: annotations named ``step_marker`` or ``step_marker#<anything>``.

    Returns step (0.. in time order), name, pid, tid, ts_us, dur_us, end_us, matched_by: "thread"
    when the marker's thread made CUDA calls (launches are matched on that pid/tid), "time" when it
    made none (some exporters put the marker on another pid; launches are then matched by time only),
    and overlap_us.

    Overlapping ranges (on one thread, pid and tid): ``overlap_us`` is how long a step's range shares with the
    next step that starts on its thread (0 for most; a nested step's whole length for the outer one). Ranges
    are kept as recorded (``dur_us`` is each step's own wall time); a CPU call, and with it its kernels,
    belongs to the latest-starting step whose range holds the call's start: the later step in an overlap,
    the inner one in a nest, the outer one again after the inner one ends. No call counts in two steps.
    :func:`overlap_note` words the warning.
    """
    import numpy as np

    if not isinstance(step_marker, str) or not step_marker.strip():
        raise BubblescopeError(f"step marker {step_marker!r}: must be a non-empty name")
    ann = trace.annotations
    names = ann["name"]
    prefix = step_marker if step_marker.endswith("#") else step_marker + "#"
    steps = ann[((names == step_marker) | names.str.startswith(prefix)).to_numpy(dtype=bool)]
    steps = steps.reset_index(drop=True)
    steps.insert(0, "step", np.arange(len(steps), dtype=np.int64))
    rt = trace.runtime
    known = (rt["pid"].notna() & rt["tid"].notna()).to_numpy(dtype=bool)
    pairs = np.stack([rt["pid"].to_numpy(dtype="int64", na_value=0)[known],
                      rt["tid"].to_numpy(dtype="int64", na_value=0)[known]], axis=1)
    # the few distinct threads, not one Python tuple per CPU call
    threads = set(map(tuple, pair_codes(pairs[:, 0], pairs[:, 1])[1].tolist()))
    steps["matched_by"] = [
        "thread" if (p, t) in threads else "time" for p, t in zip(steps["pid"].tolist(), steps["tid"].tolist())
    ]
    ts, end = steps["ts_us"].to_numpy(dtype="float64"), steps["end_us"].to_numpy(dtype="float64")
    overlap = np.zeros(len(steps))
    for idx in steps.groupby(["pid", "tid"], dropna=False, sort=False).indices.values():
        idx = idx[np.argsort(ts[idx], kind="stable")]
        overlap[idx[:-1]] = np.clip(np.minimum(end[idx[:-1]], end[idx[1:]]) - ts[idx[1:]], 0, None)
    steps["overlap_us"] = overlap
    return steps


def _owners(ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cut the time axis at every step start and end: (boundaries sorted, the step owning each piece from
    its boundary to the next: the latest-starting range holding it, -1 for none). ``ts``/``end`` (µs) are
    one thread's steps; positions index them. A sweep over the 2 x steps boundaries with a heap."""
    import heapq

    import numpy as np

    bounds = np.unique(np.concatenate([ts, end]))
    starts = np.argsort(ts, kind="stable")
    owner = np.full(len(bounds), -1, dtype=np.int64)
    active: list[tuple[float, int]] = []  # (-start, position): the latest start on top
    j = 0
    for b, edge in enumerate(bounds):
        while j < len(starts) and ts[starts[j]] <= edge:
            heapq.heappush(active, (-ts[starts[j]], int(starts[j])))
            j += 1
        while active and end[active[0][1]] <= edge:  # ended ranges leave lazily, when they come on top
            heapq.heappop(active)
        owner[b] = active[0][1] if active else -1
    return bounds, owner


def overlap_note(steps: pd.DataFrame, marker: str) -> str | None:
    """One warning line when step ranges of :func:`find_steps` overlap on a thread (how many, by how much
    in µs, and what is done about it), else None."""
    over = steps["overlap_us"].to_numpy() if "overlap_us" in steps else []
    n = int((over > 0).sum()) if len(over) else 0
    if not n:
        return None
    return (f"{n} of {count(len(steps), 'step')} marked {marker!r} {plural(n, 'overlaps', 'overlap')} the next "
            f"step on {plural(n, 'its', 'their')} thread, by up to {float(over.max()):,.3f} µs "
            f"({float(over.sum()):,.3f} µs in all): each CPU call and its kernels count in the latest-starting "
            "step holding the call, never in two; step wall times are the ranges as recorded")


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
        bounds, owner = _owners(grp["ts_us"].to_numpy(dtype="float64"), grp["end_us"].to_numpy(dtype="float64"))
        k = np.searchsorted(bounds, ts[sel], side="right") - 1
        mine = np.where(k >= 0, owner[np.maximum(k, 0)], -1)
        hit = mine >= 0
        out[sel[hit]] = grp["step"].to_numpy()[mine[hit]]
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
    # the columns the step metrics and timeline_summary read, before the row filter copies them
    keep = ["name", "kind", "device", "stream", "ts_us", "dur_us", "end_us", "correlation", "registers_per_thread"]
    keep += ["category"] if "category" in trace.gpu else []  # load_trace's; a hand-built frame may lack it
    mine = trace.gpu[keep][gpu_step >= 0].assign(step=gpu_step[gpu_step >= 0])
    device = _main_device(mine)
    mine = mine[mine["device"] == device] if device is not None else mine
    mine = mine.assign(launch_ts_us=_launch_ts(trace, mine))
    if "category" not in mine:
        mine = mine.assign(category=categorize_frame(mine))
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


def _launch_delay_arrays(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(launch-call row per GPU activity or -1 when not launched by a launch API, delay_us = start −
    launch call start (NaN when not launched), first_in_launch), all aligned with ``trace.gpu``."""
    import numpy as np
    import pandas as pd

    rows = _launch_rows(trace)
    rt = trace.runtime
    launched = rows >= 0
    launched[launched] = rt["is_launch"].to_numpy(dtype=bool)[rows[launched]]
    rows = np.where(launched, rows, -1)
    start = trace.gpu["ts_us"].to_numpy()
    delay = np.full(len(start), np.nan)
    delay[launched] = start[launched] - rt["ts_us"].to_numpy()[rows[launched]]
    first = np.zeros(len(start), dtype=bool)
    sel = np.flatnonzero(launched)
    if len(sel):
        # the earliest-starting activity of each launch (a CUDA-graph replay's first kernel); ties: file order
        order = sel[np.argsort(start[sel], kind="stable")]
        corr = trace.gpu["correlation"].to_numpy(dtype="int64", na_value=0)[order]
        first[order] = ~pd.Series(corr).duplicated().to_numpy()
    return rows, delay, first


def launch_delays(trace: Trace) -> pd.DataFrame:
    """Per GPU activity launched by a launch API (see ``trace.LAUNCH_APIS``): name, kind, device,
    stream, correlation, launch_name, launch_ts_us, start_us, delay_us = start − launch call start (µs),
    first_in_launch (False for the later kernels of a CUDA-graph replay, which share one launch)."""
    rows, delay, first = _launch_delay_arrays(trace)
    launched = rows >= 0
    rt = trace.runtime
    r = rows[launched]
    out = trace.gpu[["name", "kind", "device", "stream", "correlation"]][launched].copy()
    out["launch_name"] = rt["name"].to_numpy()[r]
    out["launch_ts_us"] = rt["ts_us"].to_numpy()[r]
    out["start_us"] = trace.gpu["ts_us"].to_numpy()[launched]
    out["delay_us"] = delay[launched]
    out["first_in_launch"] = first[launched]
    return out
