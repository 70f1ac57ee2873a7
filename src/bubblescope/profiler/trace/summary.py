"""``diagnose trace``: summarize one or more existing trace files into a JSON-ready dict.

Schema ``bubblescope.trace/1``::

    {"schema": "bubblescope.trace/1",
     "files": [{"path": str, "rank": int | None, "step_marker": str | None,
                "step_detection": <stepfind detection dict: method ("marker", "cuda-graph", "megakernel",
                                   "sequence", "cpu-ops" or None), steps, confidence, description, reason, ...>,
                "devices": [{"device": int, "kernels", "memcpys", "memsets", "streams": int,
                             "busy_us", "span_us": float, "bubble_ratio": float | None,
                             "idle": {"idle_us", "host_wait_us", "kernel_wait_us", "other_us",
                                      "host_wait_share", "kernel_wait_share", "other_share",
                                      "threshold_us"},
                             "categories": [{category, count, total_us, share}],
                             "top_kernels": [{name, category, count, total_us, share}]}],
                "steps": <timeline.timeline_summary dict> | None,
                "step_rows": [<timeline.step_figures row: step, warmup, wall_us, busy_us, span_us,
                               bubble_ratio, kernels, launches>],
                "graphs": <graphs.graph_summary dict> | None,      # CUDA-graph replays, when launched
                "host_ops": <hostops.host_op_breakdown dict> | None,  # host-bound decode steps only
                "device_properties": {"name", "total_memory_bytes", "sm_count", "compute_capability"} | None,
                "host_name": str | None, "first_context": int | None,
                "dtype": str | None, "weights": str | None,
                "warnings": [str]}
               | {"path": str, "error": str}]}   # a file that could not be read (keep_going)

Device figures cover the whole trace; ``steps`` covers the decode steps (the medians over the measured steps),
``step_rows`` each of them, the warm-up steps included (flagged), in step order. Steps are the step marker's
ranges; in a trace without any, they are found from what repeats once per token (:mod:`.stepfind`), and
``step_detection`` says how and with what confidence (``step_marker`` stays None). ``host_ops`` is the host's
time per measured step by top-level CPU operator, computed only for host-bound steps (:func:`.hostops.host_bound`),
from the operators the parse kept (:func:`.cpuops.parsed_cpu_ops`); None otherwise. ``device_properties`` is
the trace's ``deviceProperties`` entry of the step device, ``host_name`` Kineto's, ``first_context`` the KV
positions of the first marked step where bubblescope's capture recorded them (:data:`CONTEXT_KEY`), ``dtype``
and ``weights`` the run's dtype and weight format where it recorded them (:data:`DTYPE_KEY`, :data:`WEIGHTS_KEY`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ...errors import BubblescopeError
from ...reports.trace_result import CPU_ONLY, no_gpu_reason
from ...wording import count, plural
from ..capture import CONTEXT_KEY, DTYPE_KEY, WARMUP_KEY, WEIGHTS_KEY
from ..gpus import device_properties
from . import metrics
from .arrays import TraceArrays
from .arraysummary import breakdown, device_table, find_steps, overlap_note, step_devices
from .checks import overlap_notes, skew_note
from .cpuops import parsed_cpu_ops
from .graphs import graph_summary
from .heap import parse_heap
from .hostops import host_bound, host_op_breakdown
from .load import read_trace_arrays
from .stepfind import find_decode_steps, marker_detection
from .steps import DEFAULT_STEP_MARKER
from .timeline import check_skip_steps, step_figures
from .values import json_float

if TYPE_CHECKING:
    from .frames import Trace

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


def _idle(table: dict, i: int, threshold_us: float) -> dict:
    parts = {k: float(table[c][i]) for k, c in (("host_wait_us", "host_wait_us"), ("kernel_wait_us", "kernel_wait_us"),
                                                 ("other_us", "other_idle_us"))}
    idle = sum(parts.values())
    shares = {k.replace("_us", "_share"): (v / idle if idle > 0 else None) for k, v in parts.items()}
    return {"idle_us": idle, **parts, **shares, "threshold_us": threshold_us}


def _devices(arrays: TraceArrays, threshold_us: float) -> list[dict]:
    import numpy as np

    table = device_table(arrays, threshold_us)
    out = []
    for i, device in enumerate(table["device"].tolist()):
        rows = np.flatnonzero(arrays.gpu["device"] == device)
        out.append(
            {
                "device": device,
                **{k: int(table[k][i]) for k in ("kernels", "memcpys", "memsets", "streams")},
                "busy_us": float(table["busy_us"][i]),
                "span_us": float(table["span_us"][i]),
                "bubble_ratio": json_float(table["bubble_ratio"][i]),
                "idle": _idle(table, i, threshold_us),
                "categories": breakdown(arrays, rows, by_name=False),
                "top_kernels": breakdown(arrays, rows, by_name=True, n=metrics.TOP_KERNELS),
            }
        )
    return out


def left_out_note(arrays: TraceArrays, steps: dict, device: int | None) -> str | None:
    """One line naming the devices whose step-linked GPU activities the step figures (of ``device`` only) leave
    out, or None when there are none."""
    if device is None:
        return None
    others = {d: n for d, n in step_devices(arrays, steps).items() if d != device}
    if not others:
        return None
    names = ", ".join("unknown" if d < 0 else str(d) for d in sorted(others))
    n = sum(others.values())
    activities = count(n, "step-linked GPU activity", "step-linked GPU activities")
    return f"steps: the step figures are of device {device} only; {activities} on {plural(len(others), 'device')} " \
           f"{names} left out"


def _marker(arrays: TraceArrays, step_marker: str | None) -> tuple[str | None, Any]:
    """(marker used, its steps), or (None, None) when no candidate marks any step."""
    for marker in (step_marker,) if step_marker is not None else AUTO_STEP_MARKERS:
        steps = find_steps(arrays, marker)
        if len(steps["step"]):
            return marker, steps
    return None, None


def summarize_trace(
    trace: Trace | TraceArrays,
    step_marker: str | None = None,
    threshold_us: float = metrics.DEFAULT_IDLE_THRESHOLD_US,
    skip_steps: int | None = None,
) -> dict:
    """The ``files[i]`` entry of :func:`summarize_traces` for an already parsed trace (pandas frames
    or numpy columns; computed on the columns). ``skip_steps`` None: the warm-up steps the trace records
    (:data:`WARMUP_KEY`, bubblescope's own traces), else 0."""
    with parse_heap():  # sorts and copies of whole columns: freed pages reused, not faulted in again
        return _summarize(trace, step_marker, threshold_us, skip_steps)


def _summarize(trace: Trace | TraceArrays, step_marker: str | None, threshold_us: float,
               skip_steps: int | None) -> dict:
    arrays = trace if isinstance(trace, TraceArrays) else TraceArrays.from_trace(trace)
    recorded = _metadata_int(arrays.metadata, WARMUP_KEY)
    skip_steps = (recorded or 0) if skip_steps is None else skip_steps
    threshold_us = metrics.check_threshold(threshold_us)
    warnings = list(arrays.warnings)
    cpu_only = no_gpu_reason(arrays.gpu_excluded) if not len(arrays.gpu["ts_us"]) else None
    if cpu_only:
        warnings.append(cpu_only)
    marker, steps = _marker(arrays, step_marker)
    summary, step_rows = None, []
    if marker is None:
        tried = (step_marker,) if step_marker is not None else AUTO_STEP_MARKERS
        ops = parsed_cpu_ops(arrays) if cpu_only else None  # a CPU-only run's steps are in its operators
        steps, detection = find_decode_steps(arrays, ops)
        if steps is None:
            warnings.append(f"no step marker ({' or '.join(map(repr, tried))}) in trace and "
                            f"{detection['reason']}: whole-trace figures only")
        else:
            summary, step_rows = step_figures(arrays, DEFAULT_STEP_MARKER, skip_steps, threshold_us, steps=steps)
            if summary["reason"] == CPU_ONLY and cpu_only:
                summary["reason"] = cpu_only
            if summary["reason"] and summary["reason"] != cpu_only:
                warnings.append(f"steps: {summary['reason']}")
            left = left_out_note(arrays, steps, summary["device"])
            if left:
                warnings.append(left)
    else:
        detection = marker_detection(marker, len(steps["step"]))
        # Without any CUDA call in the trace there is no launch to match, by thread or by time.
        by_time = int((~steps["thread"]).sum()) if len(arrays.runtime["pid"]) else 0
        if by_time:
            warnings.append(
                f"{by_time} of {count(len(steps['step']), 'step')} marked {marker!r} {plural(by_time, 'lies', 'lie')} "
                f"on a thread without CUDA calls: launches matched to {plural(by_time, 'it', 'them')} by time only"
            )
        cut = overlap_note(steps, marker)
        if cut:
            warnings.append(cut)
        summary, step_rows = step_figures(arrays, marker, skip_steps, threshold_us)
        if summary["reason"] == CPU_ONLY and cpu_only:  # the trace's own reason (GPU events all excluded?)
            summary["reason"] = cpu_only
        if summary["reason"] and summary["reason"] != cpu_only:  # the CPU-only reason is said once, above
            warnings.append(f"steps: {summary['reason']}")
        left = left_out_note(arrays, steps, summary["device"])
        if left:
            warnings.append(left)
    devices = _devices(arrays, threshold_us)
    warnings += overlap_notes(devices, arrays)
    skew = skew_note(arrays)
    if skew:
        warnings.append(skew)
    return {
        "path": arrays.path,
        "rank": arrays.rank,
        "step_marker": marker,
        "step_detection": detection,
        "devices": devices,
        "steps": summary,
        "step_rows": step_rows,
        "graphs": graph_summary(arrays, summary["device"] if summary else None),
        "host_ops": _host_ops(arrays, steps, summary, skip_steps),
        "device_properties": device_properties(arrays.metadata, summary["device"] if summary else None),
        "host_name": _text(arrays.metadata.get("host_name")),
        "first_context": _first_context(arrays.metadata),
        "dtype": _recorded(arrays.metadata, DTYPE_KEY, ("float32", "bfloat16", "float16")),
        "weights": _recorded(arrays.metadata, WEIGHTS_KEY, ("bf16", "fp8", "fp8-all")),
        "warmup_steps": skip_steps,
        "warmup_steps_recorded": recorded,
        "warnings": warnings,
    }


def _host_ops(arrays: TraceArrays, steps: dict | None, summary: dict | None, skip_steps: int) -> dict | None:
    """The measured steps' host time by CPU operator when they are host-bound, else None: a GPU-bound trace
    does not pay for picking its top-level operators."""
    if steps is None or not host_bound(summary):
        return None
    measured = steps["step"] >= skip_steps
    return host_op_breakdown(parsed_cpu_ops(arrays), steps["ts_us"][measured], steps["end_us"][measured],
                             arrays.origin_us)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _first_context(metadata: dict) -> int | None:
    """The KV positions the first marked step reads, where the trace records it (:data:`CONTEXT_KEY`, written
    by :func:`~.capture.capture_decode_trace`); None otherwise."""
    return _metadata_int(metadata, CONTEXT_KEY)


def _recorded(metadata: dict, key: str, known: tuple[str, ...]) -> str | None:
    """The name the trace records under ``key`` when it is one of ``known``; None otherwise (other traces, or
    a value this version does not know)."""
    value = metadata.get(key)
    return value if isinstance(value, str) and value in known else None


def _metadata_int(metadata: dict, key: str) -> int | None:
    """A non-negative integer the trace records under ``key`` (as torch.profiler's ``add_metadata`` writes it, a
    string, or a number), else None."""
    value = metadata.get(key)
    if isinstance(value, str):  # torch.profiler's add_metadata writes strings
        value = value.strip()
        value = int(value) if value.isdigit() else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def summarize_traces(
    paths: Iterable[str | os.PathLike],
    step_marker: str | None = None,
    threshold_us: float = metrics.DEFAULT_IDLE_THRESHOLD_US,
    skip_steps: int | None = None,
    keep_going: bool = False,
    progress: Callable[[str], Callable[[int, int], None] | None] | None = None,
) -> dict:
    """Parse each trace (directories expand to their trace files) and summarize it; see the module doc.

    ``step_marker`` None tries ``bubblescope.decode_step`` then ``ProfilerStep``. ``threshold_us`` is
    the kernel-wait threshold of the idle breakdown (µs); ``skip_steps`` drops warm-up steps (None: as many
    as each trace records, :data:`WARMUP_KEY`, else none).
    Raises BubblescopeError for a bad path or option (the CLI exits 2), and for a bad file unless
    ``keep_going``: then that file's entry is ``{"path": str, "error": str}`` (the one-line message)
    and the other files are summarized. ``progress(path)`` may return a ``(done, total)`` bytes
    callback for :func:`~.load.load_trace`. A trace without GPU activity is
    summarized with ``"devices": []`` and a warning.
    """
    threshold_us = metrics.check_threshold(threshold_us)
    skip_steps = None if skip_steps is None else check_skip_steps(skip_steps)
    if step_marker is not None and (not isinstance(step_marker, str) or not step_marker.strip()):
        raise BubblescopeError(f"--step-marker {step_marker!r}: must be a non-empty name")
    files = []
    for path, trace, error in iter_traces(paths, keep_going, progress):
        files.append(error or summarize_trace(trace, step_marker, threshold_us, skip_steps))
        del trace  # one file's frames in memory at a time
    return {"schema": SCHEMA, "files": files}


def iter_traces(paths, keep_going: bool = False, progress=None):
    """``(path, TraceArrays or None, None or {"path", "error"})`` per file of :func:`expand_paths` (flows
    and the columns no summary reads are not kept); a bad file raises BubblescopeError unless
    ``keep_going``, then gives its one-line error entry."""
    for path in expand_paths(paths):
        try:
            trace = read_trace_arrays(path, progress(path) if progress is not None else None, flows=False,
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
