"""Decode steps of a parsed :class:`~.frames.Trace`: pure functions, no printing.

Kernels belong to a decode step through their launch call's correlation id (a CUDA-graph
replay's kernels all carry the cudaGraphLaunch's), the launch call being inside the step's
``record_function`` range on the same thread.

This module finds the steps (:func:`find_steps`), assigns GPU activities to them
(:func:`assign_steps`), computes per-step metrics (:func:`step_metrics`) and the delay from each
launch call to its kernel's start (:func:`launch_delays`), as pandas frames of the numbers
:mod:`.arraysummary` computes on the trace's columns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import arraysummary as az
from .arrays import as_arrays
from .intervals import ratio
from .metrics import DEFAULT_IDLE_THRESHOLD_US, check_threshold
from .schema import NA

if TYPE_CHECKING:
    import pandas as pd

    from .frames import Trace

DEFAULT_STEP_MARKER = "bubblescope.decode_step"


def find_steps(trace: Trace, step_marker: str = DEFAULT_STEP_MARKER) -> pd.DataFrame:
    """Decode-step ranges: annotations named ``step_marker`` or ``step_marker#<anything>``.

    Returns step (0.. in time order), name, pid, tid, ts_us, dur_us, end_us, matched_by: "thread"
    when the marker's thread made CUDA calls (launches are matched on that pid/tid), "time" when it
    made none (some exporters put the marker on another pid; launches are then matched by time only),
    and overlap_us. BubblescopeError for an empty marker.

    Overlapping ranges (on one thread, pid and tid): ``overlap_us`` is how long a step's range shares with the
    next step that starts on its thread (0 for most; a nested step's whole length for the outer one). Ranges
    are kept as recorded (``dur_us`` is each step's own wall time); a CPU call, and with it its kernels,
    belongs to the latest-starting step whose range holds the call's start: the later step in an overlap,
    the inner one in a nest, the outer one again after the inner one ends. No call counts in two steps.
    :func:`.arraysummary.overlap_note` words the warning.
    """
    import numpy as np
    import pandas as pd

    arrays = as_arrays(trace)
    st = az.find_steps(arrays, step_marker)
    return pd.DataFrame({
        "step": st["step"],
        "name": pd.array(arrays.texts[st["name"]], dtype="str"),
        **{k: pd.arrays.IntegerArray(st[k], st[k] == NA) for k in ("pid", "tid")},
        **{k: st[k] for k in ("ts_us", "dur_us", "end_us")},
        "matched_by": np.where(st["thread"], "thread", "time").astype(object),
        "overlap_us": st["overlap_us"],
    })


def assign_steps(trace: Trace, step_marker: str = DEFAULT_STEP_MARKER) -> pd.Series:
    """Step index (as in :func:`find_steps`) of every GPU activity, ``<NA>`` where its launch call is in
    no step; an Int64 Series aligned with ``trace.gpu``."""
    import pandas as pd

    arrays = as_arrays(trace)
    gpu_step, _ = az.gpu_steps(arrays, az.find_steps(arrays, step_marker))
    return pd.Series(pd.array(gpu_step, dtype="Int64"), index=trace.gpu.index, name="step").where(gpu_step >= 0)


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
    import pandas as pd

    threshold_us = check_threshold(threshold_us)
    arrays = as_arrays(trace)
    steps = az.find_steps(arrays, step_marker)
    t, _, _ = az.step_table(arrays, steps, threshold_us)
    out = {"step": t["step"], "name": pd.array(arrays.texts[steps["name"]], dtype="str")}
    out.update({k: t[k] for k in ("ts_us", "wall_us", "kernels", "launches", "launch_us", "sync_us", "gpu_busy_us",
                                  "gpu_span_us", "bubble_ratio")})
    out["launch_share"] = ratio(t["launch_us"], t["wall_us"])
    out["sync_share"] = ratio(t["sync_us"], t["wall_us"])
    out.update({k: t[k] for k in ("host_wait_us", "kernel_wait_us", "other_idle_us")})
    out["device"] = pd.array([t["device"]] * len(t["step"]), dtype="Int64")
    return pd.DataFrame(out)


def launch_delays(trace: Trace) -> pd.DataFrame:
    """Per GPU activity launched by a launch API (see ``apis.LAUNCH_APIS``): name, kind, device,
    stream, correlation, launch_name, launch_ts_us, start_us, delay_us = start − launch call start (µs),
    first_in_launch (False for the later kernels of a CUDA-graph replay, which share one launch)."""
    rows, delay, first = az.launch_delays(as_arrays(trace))
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
