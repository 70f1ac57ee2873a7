"""The JSON-ready timeline of one engine's decode: :func:`timeline_summary` (the metrics the results
file stores), :func:`step_figures` (the same and one row per step, for ``diagnose trace``) and
:func:`step_timeline` (one step's activities, for the timeline plot).

The summary is computed on numpy columns (:mod:`.arraysummary`, no pandas), the step timeline from
the step assignment of :mod:`.steps`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import BubblescopeError
from ...reports.trace_result import CPU_ONLY
from ...wording import count
from . import arraysummary as az
from .arrays import TraceArrays, as_arrays
from .intervals import ratio
from .metrics import DEFAULT_IDLE_THRESHOLD_US, TOP_KERNELS, check_threshold
from .schema import NA
from .steps import DEFAULT_STEP_MARKER
from .values import json_float

if TYPE_CHECKING:
    from .frames import Trace

# the keys of a step row of step_figures (diagnose trace's per-step table)
STEP_ROW_KEYS = ("step", "warmup", "wall_us", "busy_us", "span_us", "bubble_ratio", "kernels", "launches")


def check_skip_steps(skip_steps: int) -> int:
    """Return ``skip_steps`` as int (Python or numpy integers); BubblescopeError unless it is an integer >= 0."""
    import numbers  # numpy's integers register as Integral: no numpy import before a trace is being read

    if isinstance(skip_steps, bool) or not isinstance(skip_steps, numbers.Integral) or skip_steps < 0:
        raise BubblescopeError(f"--skip-steps {skip_steps!r}: must be an integer >= 0")
    return int(skip_steps)


def timeline_summary(
    trace: Trace | TraceArrays,
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
    return step_figures(trace, step_marker, skip_steps, threshold_us)[0]


def step_figures(
    trace: Trace | TraceArrays,
    step_marker: str = DEFAULT_STEP_MARKER,
    skip_steps: int = 0,
    threshold_us: float = DEFAULT_IDLE_THRESHOLD_US,
    steps: dict | None = None,
) -> tuple[dict, list[dict]]:
    """``(timeline_summary(...), step rows)``: the summary of :func:`timeline_summary`, computed once, and one
    JSON-ready row per marked step, the warm-up ones included (``warmup`` True for the first ``skip_steps``)::

        {"step": int, "warmup": bool, "wall_us": float (the CPU step range), "busy_us", "span_us": float | None
         (union and extent of the step's GPU activities on the summary's device), "bubble_ratio": float | None
         (1 - busy / span), "kernels", "launches": int}

    Times in µs; None where a step launched no GPU work. No rows when no step is marked. ``steps``: step ranges
    found otherwise (:func:`~.stepfind.find_decode_steps`, in the form of :func:`~.arraysummary.find_steps`) in
    place of ``step_marker``'s. Raises BubblescopeError for a bad threshold or skip count, as
    :func:`timeline_summary`.
    """
    import numpy as np

    arrays = as_arrays(trace)
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
    steps = az.find_steps(arrays, step_marker) if steps is None else steps
    if not len(steps["step"]):
        out["reason"] = f"no step marker {step_marker!r} in trace"
        return out, []
    table, rows, step_of = az.step_table(arrays, steps, threshold_us)
    step_rows = _step_rows(table, skip_steps)
    measured = table["step"] >= skip_steps
    table = {k: (v[measured] if isinstance(v, np.ndarray) else v) for k, v in table.items()}
    if not measured.any():
        every = f"all {len(steps['step'])} steps are" if len(steps["step"]) != 1 else "the only step is"
        out["reason"] = f"{every} warm-up (skip_steps={skip_steps})"
        return out, step_rows
    rows = rows[step_of >= skip_steps]
    wall = float(np.median(table["wall_us"]))
    launches = float(np.median(table["launches"]))
    out.update(
        steps=int(measured.sum()),
        launches_per_step=launches,
        step_wall_us=json_float(wall),
        launches_per_s=json_float(launches / (wall / 1e6)) if wall > 0 else None,
        launch_share=json_float(ratio(table["launch_us"].sum(), table["wall_us"].sum())),
        sync_share=json_float(ratio(table["sync_us"].sum(), table["wall_us"].sum())),
    )
    gpu = arrays.gpu
    if not len(gpu["ts_us"]):
        out["reason"] = CPU_ONLY
        return out, step_rows
    if not len(rows):
        out["reason"] = (
            "no GPU activity linked to the steps (no launch inside a step carries a kernel's correlation id)"
        )
        return out, step_rows
    device = int(gpu["device"][rows[0]])
    decode_window = (float(gpu["ts_us"][rows].min()), float(gpu["end_us"][rows].max()))
    in_window = az.device_table(arrays, threshold_us, decode_window)
    _, delay, first = az.launch_delays(arrays)
    delays = delay[rows][first[rows] & ~np.isnan(delay[rows])]
    kernels = rows[arrays.texts[gpu["kind"][rows]] == "kernel"]
    regs = gpu["registers_per_thread"][kernels]
    regs = regs[~np.isnan(regs)]
    out.update(
        available=True,
        device=device,
        kernels_per_step=float(np.median(table["kernels"])),
        bubble_ratio=json_float(in_window["bubble_ratio"][np.flatnonzero(in_window["device"] == device)[0]]),
        bubble_ratio_steps=[json_float(v) for v in table["bubble_ratio"].tolist()],
        gpu_busy_us_per_step=json_float(_nan_stat(np.median, table["gpu_busy_us"])),
        idle={
            "host_wait_us": json_float(_nan_stat(np.mean, table["host_wait_us"])),
            "kernel_wait_us": json_float(_nan_stat(np.mean, table["kernel_wait_us"])),
            "other_us": json_float(_nan_stat(np.mean, table["other_idle_us"])),
            "threshold_us": threshold_us,
        },
        launch_delay_us={
            k: (json_float(np.percentile(delays, q)) if len(delays) else None)
            for k, q in (("p50", 50), ("p90", 90), ("max", 100))
        },
        top_kernels=az.breakdown(arrays, rows, by_name=True, n=TOP_KERNELS),
        categories=az.breakdown(arrays, rows, by_name=False),
        max_registers_per_thread=int(regs.max()) if len(regs) else None,
    )
    return out, step_rows


def _step_rows(table: dict, skip_steps: int) -> list[dict]:
    """The rows of :func:`step_figures` from an :func:`~.arraysummary.step_table` of every step."""
    columns = (table["step"], table["wall_us"], table["gpu_busy_us"], table["gpu_span_us"], table["bubble_ratio"],
               table["kernels"], table["launches"])
    return [dict(zip(STEP_ROW_KEYS, (int(step), int(step) < skip_steps, *map(json_float, times), int(k), int(n))))
            for step, *times, k, n in zip(*(c.tolist() for c in columns))]


def _nan_stat(stat: Any, values: Any) -> float | None:
    """``stat`` of the non-NaN values (as pandas' skipna reductions), None when there are none."""
    import numpy as np

    values = values[~np.isnan(values)]
    return float(stat(values)) if len(values) else None


def step_timeline(
    trace: Trace | TraceArrays, step_marker: str = DEFAULT_STEP_MARKER, step_index: int = 0
) -> dict:
    """One step's activities for a timeline plot, times in µs relative to the step range's start:
    ``{"kernels": [{name, category, stream, start_us, dur_us}], "launches": [{name, start_us, dur_us}]}``
    (all GPU activities of the step by start, every launch call in it). BubblescopeError if no such step."""
    import numpy as np

    arrays = as_arrays(trace)
    steps = az.find_steps(arrays, step_marker)
    i = int(step_index)
    if not 0 <= i < len(steps["step"]):
        raise BubblescopeError(
            f"step {step_index}: out of range, the trace has {count(len(steps['step']), 'step')} marked {step_marker!r}"
        )
    t0 = float(steps["ts_us"][i])
    gpu_step, rt_step = az.gpu_steps(arrays, steps)
    gpu, rt, texts = arrays.gpu, arrays.runtime, arrays.texts
    rows = np.flatnonzero(gpu_step == i)
    rows = rows[np.argsort(gpu["ts_us"][rows], kind="stable")]
    calls = np.flatnonzero((rt_step == i) & rt["is_launch"])
    return {
        "kernels": [
            {"name": texts[n], "category": texts[c], "stream": None if s == NA else s, "start_us": t - t0,
             "dur_us": d}
            for n, c, s, t, d in zip(gpu["name"][rows].tolist(), gpu["category"][rows].tolist(),
                                     gpu["stream"][rows].tolist(), gpu["ts_us"][rows].tolist(),
                                     gpu["dur_us"][rows].tolist())
        ],
        "launches": [
            {"name": texts[n], "start_us": t - t0, "dur_us": d}
            for n, t, d in zip(rt["name"][calls].tolist(), rt["ts_us"][calls].tolist(), rt["dur_us"][calls].tolist())
        ],
    }
