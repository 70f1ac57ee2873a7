"""The metrics of a trace summary computed on :class:`~.arrays.TraceArrays` with numpy alone.

Definitions are those of :mod:`.metrics` (device busy/span/idle split, GPU time by category and name)
and :mod:`.steps` (steps found by their ``record_function`` ranges, kernels assigned through their
launch call's correlation id); :func:`device_table` and :func:`breakdown` give their figures as
arrays and JSON-ready records, :func:`find_steps` and :func:`step_table` the per-step ones, which
:mod:`.timeline` and :mod:`.summary` turn into the summary dicts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import BubblescopeError
from ...wording import count, plural
from .arrays import TraceArrays, launch_rows
from .intervals import factorize, first_of_each, interval_stats, pair_codes, range_owners, ratio
from .schema import NA
from .values import json_float

if TYPE_CHECKING:
    import numpy as np

_KIND_COUNTS = (("kernel", "kernels"), ("memcpy", "memcpys"), ("memset", "memsets"))


def _launch_ts(arrays: TraceArrays, rows: np.ndarray) -> np.ndarray:
    """Start (µs) of the launch call of each GPU activity of ``rows`` (NaN: none)."""
    import numpy as np

    found = launch_rows(arrays)[rows]
    ts = arrays.runtime["ts_us"]
    return np.where(found >= 0, ts[np.maximum(found, 0)] if len(ts) else np.nan, np.nan)


def window_rows(
    arrays: TraceArrays, window: tuple[float, float] | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows of the GPU activities overlapping ``window`` (start_us, end_us), their starts and ends
    clipped to it); every activity, unclipped, when ``window`` is None. BubblescopeError when the
    window ends before it starts."""
    import numpy as np

    ts, end = arrays.gpu["ts_us"], arrays.gpu["end_us"]
    if window is None:
        return np.arange(len(ts)), ts, end
    w0, w1 = float(window[0]), float(window[1])
    if not w1 >= w0:
        raise BubblescopeError(f"window {window!r}: end must not be before start")
    rows = np.flatnonzero((end >= w0) & (ts <= w1))
    return rows, np.maximum(ts[rows], w0), np.minimum(end[rows], w1)


def device_table(
    arrays: TraceArrays, threshold_us: float, window: tuple[float, float] | None = None
) -> dict[str, np.ndarray]:
    """Per device (sorted ids): device, kernels, memcpys, memsets, streams (int64), busy_us, span_us,
    bubble_ratio (NaN when span is 0), first_us, last_us, host_wait_us, kernel_wait_us, other_idle_us
    (µs), as :func:`.metrics.device_summary`. ``window`` (start_us, end_us) clips activities first."""
    import numpy as np

    gpu = arrays.gpu
    rows, ts, end = window_rows(arrays, window)
    dev = gpu["device"][rows]
    keys, stats = interval_stats(dev, ts, end, _launch_ts(arrays, rows), threshold_us)
    code = np.searchsorted(keys, dev)
    out: dict[str, Any] = {"device": keys.astype(np.int64)}
    kind = gpu["kind"][rows]  # compared as codes: no string per activity
    for name, col in _KIND_COUNTS:
        mine = np.isin(kind, np.flatnonzero(arrays.texts == name))
        out[col] = np.bincount(code[mine], minlength=len(keys)).astype(np.int64)
    stream = gpu["stream"][rows]
    _, pairs = pair_codes(code.astype(np.int64), np.where(stream == NA, -1, stream))
    out["streams"] = np.bincount(pairs[:, 0], minlength=len(keys)).astype(np.int64)
    out.update(busy_us=stats["busy_us"], span_us=stats["span_us"],
               bubble_ratio=1 - ratio(stats["busy_us"], stats["span_us"]))
    out.update({k: stats[k] for k in ("first_us", "last_us", "host_wait_us", "kernel_wait_us", "other_idle_us")})
    return out


def breakdown_table(
    arrays: TraceArrays, rows: np.ndarray, by_name: bool, n: int | None = None, dur: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """GPU time of the activities ``rows`` by category, or by name (``by_name``) with each name's
    category: {name (if by_name), category (object str), count (int64), total_us (summed durations,
    µs; ``dur`` if given, else ``dur_us``), share (of the rows' total; NaN if 0)}, by total_us then
    count descending (ties: first seen first), the first ``n``."""
    import numpy as np

    gpu, texts = arrays.gpu, arrays.texts
    cats = gpu["category"][rows]
    codes, uniq = factorize(gpu["name"][rows] if by_name else cats)  # int codes: factorized by sorting
    first = np.full(len(uniq), len(codes))
    np.minimum.at(first, codes, np.arange(len(codes)))
    count = np.bincount(codes, minlength=len(uniq)).astype(np.int64)
    weights = (gpu["dur_us"][rows] if dur is None else dur).astype(float)
    total = np.bincount(codes, weights=weights, minlength=len(uniq)).astype(float)
    grand = total.sum()
    share = total / grand if grand > 0 else np.full(len(total), np.nan)
    order = np.lexsort((-count, -total))[:n]
    out = {"name": texts[uniq[order]].astype(object)} if by_name else {}
    out.update(category=texts[cats[first[order]]].astype(object), count=count[order], total_us=total[order],
               share=share[order])
    return out


def breakdown(arrays: TraceArrays, rows: np.ndarray, by_name: bool, n: int | None = None) -> list[dict]:
    """:func:`breakdown_table` as JSON-ready records (names str, count int, total_us/share float or None)."""
    table = breakdown_table(arrays, rows, by_name, n)
    return [{k: (json_float(v) if k in ("total_us", "share") else int(v) if k == "count" else str(v))
             for k, v in zip(table, row)} for row in zip(*table.values())]


def find_steps(arrays: TraceArrays, step_marker: str) -> dict[str, np.ndarray]:
    """Decode-step ranges, as :func:`.steps.find_steps`: annotations named ``step_marker`` or
    ``step_marker#<anything>``, in time order: step (0..), name (codes), pid, tid, ts_us, dur_us,
    end_us, thread (bool): True when the marker's thread made CUDA calls (launches are matched on
    that pid/tid), False when matched by time only, and overlap_us (float64, µs): how long a step's range
    shares with the next step that starts on its thread (pid, tid); 0 for most, a nested step's whole
    length for the outer one. Ranges stay as recorded; :func:`gpu_steps` gives each CPU call to the
    latest-starting range holding it, and :func:`overlap_note` words the warning."""
    import numpy as np

    if not isinstance(step_marker, str) or not step_marker.strip():
        raise BubblescopeError(f"--step-marker {step_marker!r}: must be a non-empty name")
    ann = arrays.annotations
    prefix = step_marker if step_marker.endswith("#") else step_marker + "#"
    present = np.unique(ann["name"]).tolist()
    marks = np.zeros(len(arrays.texts), dtype=bool)
    for code in present:
        text = arrays.texts[code]
        marks[code] = text == step_marker or text.startswith(prefix)
    rows = np.flatnonzero(marks[ann["name"]]) if len(ann["name"]) else np.zeros(0, dtype=np.int64)
    steps = {k: ann[k][rows] for k in ("name", "pid", "tid", "ts_us", "dur_us", "end_us")}
    steps["step"] = np.arange(len(rows), dtype=np.int64)
    threads = arrays.cache.get("threads")
    if threads is None:  # the few distinct threads with CUDA calls, not one Python tuple per call
        rt = arrays.runtime
        known = (rt["pid"] != NA) & (rt["tid"] != NA)
        threads = arrays.cache["threads"] = set(map(tuple, pair_codes(rt["pid"][known], rt["tid"][known])[1].tolist()))
    steps["thread"] = np.array([(p, t) in threads for p, t in zip(steps["pid"].tolist(), steps["tid"].tolist())],
                               dtype=bool)
    steps["overlap_us"] = _overlaps(steps)
    return steps


def _overlaps(steps: dict) -> np.ndarray:
    """overlap_us of :func:`find_steps`: per step, min(its end, the next one's end) − the next one's start,
    clipped at 0, the next one being the next to start on the same (pid, tid)."""
    import numpy as np

    out = np.zeros(len(steps["step"]))
    if len(out) < 2:
        return out
    thread = pair_codes(steps["pid"], steps["tid"])[0]
    order = np.lexsort((steps["ts_us"], thread))  # by thread, then start; stable among equal starts
    a, b = order[:-1], order[1:]
    same = thread[a] == thread[b]
    a, b = a[same], b[same]
    ts, end = steps["ts_us"], steps["end_us"]
    out[a] = np.clip(np.minimum(end[a], end[b]) - ts[b], 0, None)
    return out


def overlap_note(steps: Any, marker: str) -> str | None:
    """One warning line when step ranges of :func:`find_steps` (its dict, or the frame of
    :func:`.steps.find_steps`) overlap on a thread: how many, by how much (µs) and what is done about it;
    None when none do."""
    import numpy as np

    over = np.asarray(steps["overlap_us"], dtype=float) if "overlap_us" in steps else np.zeros(0)
    n = int((over > 0).sum())
    if not n:
        return None
    return (f"{n} of {count(len(over), 'step')} marked {marker!r} {plural(n, 'overlaps', 'overlap')} the next "
            f"step on {plural(n, 'its', 'their')} thread, by up to {float(over.max()):,.3f} µs "
            f"({float(over.sum()):,.3f} µs in all): each CPU call and its kernels count in the latest-starting "
            "step holding the call, never in two; step wall times are the ranges as recorded")


def _runtime_steps(arrays: TraceArrays, steps: dict) -> np.ndarray:
    """Per CPU call: the step whose range holds its start on its thread, the latest-starting one where
    ranges overlap or nest (:func:`.intervals.range_owners`); -1: none. Groups of steps (pid, tid, thread)
    in first-seen order; a later group's match wins."""
    import numpy as np

    rt = arrays.runtime
    out = np.full(len(rt["ts_us"]), -1, dtype=np.int64)
    ts, pid, tid = rt["ts_us"], rt["pid"], rt["tid"]
    if not len(steps["step"]):
        return out
    group, _ = factorize(pair_codes(pair_codes(steps["pid"], steps["tid"])[0], steps["thread"].astype(np.int64))[0])
    for g in range(int(group.max()) + 1):
        mine = np.flatnonzero(group == g)
        mine = mine[np.argsort(steps["ts_us"][mine], kind="stable")]
        if steps["thread"][mine[0]]:  # a marker without pid/tid never has CUDA calls on its thread
            sel = np.flatnonzero((pid == steps["pid"][mine[0]]) & (tid == steps["tid"][mine[0]]) & (pid != NA))
        else:
            sel = np.arange(len(ts))
        owner = range_owners(steps["ts_us"][mine], steps["end_us"][mine], ts[sel])
        hit = owner >= 0
        out[sel[hit]] = steps["step"][mine][owner[hit]]
    return out


def gpu_steps(arrays: TraceArrays, steps: dict) -> tuple[np.ndarray, np.ndarray]:
    """(step per GPU activity, step per CPU call), -1 where unassigned."""
    import numpy as np

    rt_step = _runtime_steps(arrays, steps)
    rows = launch_rows(arrays)
    gpu_step = np.where(rows >= 0, rt_step[np.maximum(rows, 0)] if len(rt_step) else -1, -1)
    return gpu_step, rt_step


def step_devices(arrays: TraceArrays, steps: dict) -> dict[int, int]:
    """Step-assigned GPU activities per device id (-1: unknown), as :func:`step_table` counts them to pick its
    main device."""
    import numpy as np

    gpu_step, _ = gpu_steps(arrays, steps)
    ids, counts = np.unique(arrays.gpu["device"][gpu_step >= 0], return_counts=True)
    return dict(zip(ids.tolist(), counts.tolist()))


def step_table(arrays: TraceArrays, steps: dict, threshold_us: float) -> tuple[dict, np.ndarray, np.ndarray]:
    """(per-step metrics as in :func:`.steps.step_metrics` (arrays, one per column, plus ``device``),
    the rows of the step-assigned GPU activities of the main device (the one with most of them; ties:
    lowest id), their steps)."""
    import numpy as np

    gpu, rt = arrays.gpu, arrays.runtime
    gpu_step, rt_step = gpu_steps(arrays, steps)
    rows = np.flatnonzero(gpu_step >= 0)
    device = None
    if len(rows):
        ids, counts = np.unique(gpu["device"][rows], return_counts=True)
        device = int(ids[counts == counts.max()].min())
        rows = rows[gpu["device"][rows] == device]
    step_of = gpu_step[rows]
    keys, stats = interval_stats(step_of, gpu["ts_us"][rows], gpu["end_us"][rows], _launch_ts(arrays, rows),
                                 threshold_us)
    n = len(steps["step"])
    table: dict[str, Any] = {"step": steps["step"], "ts_us": steps["ts_us"], "wall_us": steps["dur_us"]}
    is_kernel = arrays.texts[gpu["kind"][rows]] == "kernel" if len(rows) else np.zeros(0, dtype=bool)
    table["kernels"] = np.bincount(step_of[is_kernel], minlength=n).astype(np.int64)
    in_step = rt_step >= 0
    # no step at all: nothing to index (every call is outside, in_step is all False)
    ends = steps["end_us"][np.maximum(rt_step, 0)] if n else np.full(len(rt_step), np.nan)
    # min(dur, step end - start) rather than min(end, step end) - start: exact for calls inside the step
    overlap = np.clip(np.minimum(rt["dur_us"], ends - rt["ts_us"]), 0, None)
    for flag, count_col, time_col in (("is_launch", "launches", "launch_us"), ("is_sync", None, "sync_us")):
        sel = in_step & rt[flag]
        if count_col:
            table[count_col] = np.bincount(rt_step[sel], minlength=n).astype(np.int64)
        table[time_col] = np.bincount(rt_step[sel], weights=overlap[sel], minlength=n).astype(float)
    at = np.minimum(np.searchsorted(keys, steps["step"]), max(len(keys) - 1, 0))  # the step's stats row
    found = keys[at] == steps["step"] if len(keys) else np.zeros(n, dtype=bool)  # False: no GPU activity
    for col in ("busy_us", "span_us", "host_wait_us", "kernel_wait_us", "other_idle_us"):
        values = np.full(n, np.nan)
        values[found] = stats[col][at[found]]
        table["gpu_" + col if col in ("busy_us", "span_us") else col] = values
    table["bubble_ratio"] = 1 - ratio(table["gpu_busy_us"], table["gpu_span_us"])
    table["device"] = device
    return table, rows, step_of


def launch_delays(arrays: TraceArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row of the launch call of each GPU activity, -1 when not launched by a launch API; delay_us =
    start − that call's start, NaN when not launched; first_in_launch: the earliest-starting activity
    of each launch, ties in file order), all aligned with the gpu table."""
    import numpy as np

    rows = launch_rows(arrays)
    launched = rows >= 0
    launched[launched] = arrays.runtime["is_launch"][rows[launched]]
    rows = np.where(launched, rows, -1)
    start = arrays.gpu["ts_us"]
    delay = np.full(len(start), np.nan)
    delay[launched] = start[launched] - arrays.runtime["ts_us"][rows[launched]]
    first = np.zeros(len(start), dtype=bool)
    sel = np.flatnonzero(launched)
    if len(sel):
        order = sel[np.argsort(start[sel], kind="stable")]
        corr = arrays.gpu["correlation"][order]
        first[order] = first_of_each(np.where(corr == NA, 0, corr))
    return rows, delay, first
