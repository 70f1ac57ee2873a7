"""One engine's profiled run: a torch.profiler (CUPTI) trace of a few decode steps, its timeline metrics and, for
the megakernel engines, the kernel's own per-task timeline (the intra-kernel view)."""

from __future__ import annotations

import tempfile
from contextlib import nullcontext
from pathlib import Path
import torch

from .plan import Bench, RunPlan

# Profiled decode steps left out of every figure: the first carries the profiler's own start (CUPTI's first
# activity buffers, libraries loaded on first use), on top of the unprofiled warm-up steps before the trace.
PROFILE_WARMUP_STEPS = 1


def profile_engine(name: str, engine, entry: dict, plan: RunPlan, bench: Bench) -> None:
    """Trace ``workload.profile_steps`` (+ :data:`PROFILE_WARMUP_STEPS`) greedy decode steps of ``engine`` after
    its prompt into ``<bench.traces>/traces/<name>.json.gz`` and fill ``entry``'s ``timeline``
    (:func:`~bubblescope.profiler.trace.timeline.timeline_summary` without the first profiled step, plus the
    ``step_timeline`` of a middle step; GPU-only figures None on a CPU), ``intrakernel`` (engines with a
    ``timeline()`` recorder: :func:`~bubblescope.megakernel_engine.timeline.intrakernel_summary` and the binned
    activity, whose events are appended to the trace) and ``trace_path`` (relative to the run's folder; None when
    the run writes nothing and the trace went to a temporary folder).

    Raises:
        OutputNotWritten: the trace could not be written.
    """
    from ..profiler.capture import append_trace_events, capture_decode_trace
    from ..profiler.trace.timeline import step_timeline, timeline_summary
    from ..profiler.trace import load_trace

    out = bench.traces if bench.traces is not None else Path(tempfile.mkdtemp(prefix="bubblescope-"))
    (out / "traces").mkdir(parents=True, exist_ok=True)
    path = out / "traces" / f"{name}.json.gz"
    steps = plan.workload.profile_steps
    timeline_ctx = engine.timeline() if hasattr(engine, "timeline") else nullcontext(None)
    with timeline_ctx as intra:
        cap = capture_decode_trace(engine, torch.tensor(bench.prompt), steps=steps + PROFILE_WARMUP_STEPS,
                                   warmup=3, out_path=path, profiled_warmup=PROFILE_WARMUP_STEPS,
                                   dtype=plan.dtype_name, weights=bench.loaded.weights.weight_format)
    trace = load_trace(cap.trace_path)
    # the first profiled step is left out of every figure (PROFILE_WARMUP_STEPS); the summary says how many
    summary = timeline_summary(trace, skip_steps=PROFILE_WARMUP_STEPS)
    summary["warmup_steps"] = PROFILE_WARMUP_STEPS
    if summary.get("available") and summary.get("steps"):
        summary["step_timeline"] = step_timeline(
            trace, step_index=PROFILE_WARMUP_STEPS + min(summary["steps"] - 1, steps // 2))
    else:
        summary["step_timeline"] = None
    if not cap.gpu:
        # No CUDA activity was recorded: launch and sync counts would be zeros that measured nothing.
        summary["available"] = False
        summary["reason"] = summary.get("reason") or cap.note
        for key in ("launches_per_step", "launches_per_s", "launch_share", "sync_share"):
            summary[key] = None
    entry["timeline"] = summary
    if intra is not None and getattr(intra, "frame", None) is not None:
        from ..megakernel_engine.timeline import chrome_events, intrakernel_summary
        df = intra.frame
        # only megakernel engines know their tasks' weight bytes and ring slot, which the weight stream's feed needs
        task_bytes = slot = None
        if hasattr(engine, "task_weight_bytes"):
            task_bytes, slot = engine.task_weight_bytes(), engine.ring_slot_bytes()
        entry["intrakernel"] = intrakernel_summary(df, task_bytes=task_bytes, slot_bytes=slot)
        entry["intrakernel"]["activity"] = activity(df, engine, bench, steps)
        append_trace_events(cap.trace_path, chrome_events(df, ts_offset_us=intra.ts_offset_us))
    entry["trace_path"] = str(path.relative_to(out)) if bench.traces is not None else None


def activity(df, engine, bench: Bench, profile_steps: int) -> dict | None:
    """The binned megakernel view of the profiled step (all programs; ``df`` the kernel's per-task timeline
    frame), bandwidth estimated from the tasks' bytes at the step's context (prompt + half the
    ``profile_steps``)."""
    from ..reports.intrakernel import activity_profile, opcode_bytes

    weights = bench.loaded.weights
    context = len(bench.prompt) + profile_steps // 2
    grid = getattr(engine, "compile_info", lambda: {})() or {}
    return activity_profile(df, programs=grid.get("grid"),
                            bytes_by_opcode=opcode_bytes(weights.config, weights.dtype.itemsize, context))
