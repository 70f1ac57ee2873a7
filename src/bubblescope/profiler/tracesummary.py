"""``diagnose trace``: summarize one or more existing trace files into a JSON-ready dict.

Schema ``bubblescope.trace/1``::

    {"schema": "bubblescope.trace/1",
     "files": [{"path": str, "rank": int | None, "step_marker": str | None,
                "devices": [{"device": int, "kernels", "memcpys", "memsets", "streams": int,
                             "busy_us", "span_us": float, "bubble_ratio": float | None,
                             "idle": {"idle_us", "host_wait_us", "kernel_wait_us", "other_us",
                                      "host_wait_share", "kernel_wait_share", "other_share",
                                      "threshold_us"},
                             "categories": [{category, count, total_us, share}],
                             "top_kernels": [{name, category, count, total_us, share}]}],
                "steps": <timeline.timeline_summary dict> | None,
                "warnings": [str]}
               | {"path": str, "error": str}]}   # a file that could not be read (keep_going)

Device figures cover the whole trace; ``steps`` covers the decode steps found by the step marker.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import BubblescopeError
from . import metrics
from .steps import DEFAULT_STEP_MARKER, find_steps, overlap_note
from .tracechecks import overlap_notes, skew_note
from .timeline import check_skip_steps, timeline_summary
from .trace import Trace, load_trace
from ..wording import count, plural

SCHEMA = "bubblescope.trace/1"
# Tried in order when no marker is given: ours, then torch.profiler's schedule steps.
AUTO_STEP_MARKERS = (DEFAULT_STEP_MARKER, "ProfilerStep")
TRACE_SUFFIXES = (".json", ".json.gz")


def expand_paths(paths: Iterable[str | os.PathLike]) -> list[str]:
    """Files to read: each path as given, a directory replaced by its ``*.json``/``*.json.gz`` files
    (sorted, not recursive). BubblescopeError for no paths or a directory without traces."""
    out: list[str] = []
    for path in paths:
        path = os.fspath(path)
        if os.path.isdir(path):
            found = sorted(
                os.path.join(path, f)
                for f in os.listdir(path)
                if f.endswith(TRACE_SUFFIXES) and os.path.isfile(os.path.join(path, f))
            )
            if not found:
                raise BubblescopeError(f"{path}: directory holds no .json or .json.gz trace files")
            out.extend(found)
        else:
            out.append(path)
    if not out:
        raise BubblescopeError("no trace paths given")
    return out


def _idle(row: Any, threshold_us: float) -> dict:
    parts = {
        k: float(row[c])
        for k, c in (
            ("host_wait_us", "host_wait_us"),
            ("kernel_wait_us", "kernel_wait_us"),
            ("other_us", "other_idle_us"),
        )
    }
    idle = sum(parts.values())
    shares = {k.replace("_us", "_share"): (v / idle if idle > 0 else None) for k, v in parts.items()}
    return {"idle_us": idle, **parts, **shares, "threshold_us": threshold_us}


def _devices(trace: Trace, threshold_us: float) -> list[dict]:
    table = metrics.device_summary(trace, threshold_us=threshold_us)
    out = []
    for _, row in table.iterrows():
        device = int(row["device"])
        out.append(
            {
                "device": device,
                **{k: int(row[k]) for k in ("kernels", "memcpys", "memsets", "streams")},
                "busy_us": float(row["busy_us"]),
                "span_us": float(row["span_us"]),
                "bubble_ratio": metrics.json_float(row["bubble_ratio"]),
                "idle": _idle(row, threshold_us),
                "categories": metrics.records(
                    metrics.kernel_breakdown(trace, device=device), ["category", "count", "total_us", "share"]
                ),
                "top_kernels": metrics.records(
                    metrics.top_kernels(trace, metrics.TOP_KERNELS, device=device),
                    ["name", "category", "count", "total_us", "share"],
                ),
            }
        )
    return out


def _marker(trace: Trace, step_marker: str | None) -> tuple[str | None, Any]:
    """(marker used, its steps frame), or (None, None) when no candidate marks any step."""
    for marker in (step_marker,) if step_marker is not None else AUTO_STEP_MARKERS:
        steps = find_steps(trace, marker)
        if len(steps):
            return marker, steps
    return None, None


def summarize_trace(
    trace: Trace,
    step_marker: str | None = None,
    threshold_us: float = metrics.DEFAULT_IDLE_THRESHOLD_US,
    skip_steps: int = 0,
) -> dict:
    """The ``files[i]`` entry of :func:`summarize_traces` for an already parsed trace."""
    threshold_us = metrics.check_threshold(threshold_us)
    warnings = list(trace.warnings)
    if trace.gpu.empty:
        warnings.append("no GPU activity in trace (CPU-only run)")
    marker, steps = _marker(trace, step_marker)
    summary = None
    if marker is None:
        tried = (step_marker,) if step_marker is not None else AUTO_STEP_MARKERS
        warnings.append(f"no step marker ({' or '.join(map(repr, tried))}) in trace: whole-trace figures only")
    else:
        by_time = int((steps["matched_by"] == "time").sum())
        if by_time:
            warnings.append(
                f"{by_time} of {count(len(steps), 'step')} marked {marker!r} {plural(by_time, 'lies', 'lie')} on a "
                f"thread without CUDA calls: launches matched to {plural(by_time, 'it', 'them')} by time only"
            )
        cut = overlap_note(steps, marker)
        if cut:
            warnings.append(cut)
        summary = timeline_summary(trace, marker, skip_steps, threshold_us)
        if summary["reason"]:
            warnings.append(f"steps: {summary['reason']}")
    devices = _devices(trace, threshold_us)
    warnings += overlap_notes(devices, trace.gpu)
    skew = skew_note(trace)
    if skew:
        warnings.append(skew)
    return {
        "path": trace.path,
        "rank": trace.rank,
        "step_marker": marker,
        "devices": devices,
        "steps": summary,
        "warnings": warnings,
    }


def summarize_traces(
    paths: Iterable[str | os.PathLike],
    step_marker: str | None = None,
    threshold_us: float = metrics.DEFAULT_IDLE_THRESHOLD_US,
    skip_steps: int = 0,
    keep_going: bool = False,
    progress: Callable[[str], Callable[[int, int], None] | None] | None = None,
) -> dict:
    """Parse each trace (directories expand to their trace files) and summarize it; see the module doc.

    ``step_marker`` None tries ``bubblescope.decode_step`` then ``ProfilerStep``. ``threshold_us`` is
    the kernel-wait threshold of the idle breakdown (µs); ``skip_steps`` drops warm-up steps.
    Raises BubblescopeError for a bad path or option (the CLI exits 2), and for a bad file unless
    ``keep_going``: then that file's entry is ``{"path": str, "error": str}`` (the one-line message)
    and the other files are summarized. ``progress(path)`` may return a ``(done, total)`` bytes
    callback for :func:`~bubblescope.profiler.trace.load_trace`. A trace without GPU activity is
    summarized with ``"devices": []`` and a warning.
    """
    threshold_us = metrics.check_threshold(threshold_us)
    skip_steps = check_skip_steps(skip_steps)
    if step_marker is not None and (not isinstance(step_marker, str) or not step_marker.strip()):
        raise BubblescopeError(f"step marker {step_marker!r}: must be a non-empty name")
    files = []
    for path, trace, error in iter_traces(paths, keep_going, progress):
        files.append(error or summarize_trace(trace, step_marker, threshold_us, skip_steps))
        del trace  # one file's frames in memory at a time
    return {"schema": SCHEMA, "files": files}


def iter_traces(paths, keep_going: bool = False, progress=None):
    """``(path, Trace or None, None or {"path", "error"})`` per file of :func:`expand_paths` (flows not read);
    a bad file raises BubblescopeError unless ``keep_going``, then gives its one-line error entry."""
    for path in expand_paths(paths):
        try:
            trace = load_trace(path, progress(path) if progress is not None else None, flows=False,
                               lean=True)
        except BubblescopeError as exc:
            if not keep_going:
                raise
            yield path, None, {"path": path, "error": str(exc)}
            continue
        yield path, trace, None


def file_errors(summary: dict) -> list[str]:
    """The one-line errors of the files :func:`summarize_traces` could not read (``keep_going``)."""
    return [f["error"] for f in summary.get("files", []) if "error" in f]
