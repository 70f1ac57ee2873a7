"""The JSON-ready timeline of one engine's decode: :func:`timeline_summary` (the metrics the results
file stores) and :func:`step_timeline` (one step's activities, for the timeline plot).

Both are built from the step assignment of :mod:`.steps` and the interval metrics of :mod:`.metrics`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import BubblescopeError
from .categories import categorize_frame
from .metrics import (
    DEFAULT_IDLE_THRESHOLD_US,
    TOP_KERNELS,
    _breakdown,
    _ratio,
    check_threshold,
    device_summary,
    json_float,
    records,
)
from .steps import (
    DEFAULT_STEP_MARKER,
    _gpu_steps,
    _launch_delay_arrays,
    _step_table,
    find_steps,
)
from ..wording import count

if TYPE_CHECKING:
    from .trace import Trace


def check_skip_steps(skip_steps: int) -> int:
    """Return ``skip_steps`` as int; BubblescopeError unless it is an integer >= 0."""
    import numpy as np

    if isinstance(skip_steps, bool) or not isinstance(skip_steps, (int, np.integer)) or skip_steps < 0:
        raise BubblescopeError(f"skip_steps {skip_steps!r}: must be an integer >= 0")
    return int(skip_steps)


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
        every = f"all {len(steps)} steps are" if len(steps) != 1 else "the only step is"
        out["reason"] = f"{every} warm-up (skip_steps={skip_steps})"
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
    _, delay, first = _launch_delay_arrays(trace)
    pick = trace.gpu.index.get_indexer(mine.index)
    delays = delay[pick][first[pick] & ~np.isnan(delay[pick])]
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
            f"step {step_index}: out of range, the trace has {count(len(steps), 'step')} marked {step_marker!r}"
        )
    t0 = float(steps["ts_us"].iloc[int(step_index)])
    gpu_step, rt_step = _gpu_steps(trace, steps)
    gpu = trace.gpu[gpu_step == int(step_index)]
    if "category" not in gpu:  # load_trace adds it; a hand-built frame may lack it
        gpu = gpu.assign(category=categorize_frame(gpu))
    gpu = gpu.sort_values("ts_us", kind="stable")
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
