"""Host time per decode step by top-level CPU operator: where the host's step goes when the host is the limit.

A host-bound decode loop (the GPU idle most of the step, waiting for the host's next launch) is as fast as the
host gets through one step. The GPU figures say that it waits, not on what: the top-level torch operators the
loop's thread runs (:func:`~.cpuops.parsed_cpu_ops`: ``aten::linear``, ``aten::embedding``, not the
``aten::addmm`` inside one) say where the host's time goes, and the time between them is the loop's own Python,
or a wait in a call the profiler does not record as an operator.

:func:`host_op_breakdown` is the table; :func:`host_bound` says when it answers a question (picking the top-level
operators out of all the parse kept sorts and walks them, which a GPU-bound trace should not pay for).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .values import json_float

if TYPE_CHECKING:
    import numpy as np

# Operators named in the table, by time per step; the rest are summed in one "other operators" row.
TOP_OPS = 10
OTHER = "other operators"
OUTSIDE = "outside operators"
# Host-bound: the GPU idles at least this share of the decode window (the launch-bound finding's bubble ratio,
# reports.finding_base's launch_bound_min_bubble_ratio), waiting for the host more than for anything else.
HOST_BOUND_MIN_BUBBLE_RATIO = 0.5


def host_bound(steps: dict | None) -> bool:
    """Whether the decode steps of a :func:`~.timeline.step_figures` summary are host-bound: measured (steps
    found and GPU activity linked), a bubble ratio of at least :data:`HOST_BOUND_MIN_BUBBLE_RATIO`, and host-wait
    the largest of the idle parts per step (host-wait, kernel-wait, other; ties go to host-wait). False when any
    of these figures is missing."""
    if not steps or not steps.get("available"):
        return False
    bubble, idle = steps.get("bubble_ratio"), steps.get("idle") or {}
    host, kernel, other = (idle.get(k) for k in ("host_wait_us", "kernel_wait_us", "other_us"))
    if bubble is None or host is None or bubble < HOST_BOUND_MIN_BUBBLE_RATIO:
        return False
    return host >= (kernel or 0.0) and host >= (other or 0.0)


def host_op_breakdown(ops: dict | None, step_ts_us: Any, step_end_us: Any, origin_us: float = 0.0,
                      n: int = TOP_OPS) -> dict:
    """Host time per decode step by top-level CPU operator name.

    Args:
        ops: the top-level operators of one thread, disjoint and in time order, as :func:`~.cpuops.parsed_cpu_ops`
            returns them (``name`` object array of str, ``pid``, ``tid`` int64,
            ``ts_us``, ``end_us`` float64 µs in the file's time), or None (none read).
        step_ts_us, step_end_us: the start and end of each decode step to count (float64 µs, the trace
            columns' time: the measured steps, warm-up left out), one entry per step.
        origin_us: what the trace columns subtracted from the file's times (``TraceArrays.origin_us``): the
            operators are moved onto the steps' time by it.
        n: operators named in the table (> 0).

    Returns:
        ``{"thread": {"pid": int, "tid": int} | None, "steps": int, "mean_step_wall_us": float | None,
        "rows": [row] | None, "reason": str | None}``. ``mean_step_wall_us`` is the mean step wall time (end −
        start), what every ``share`` divides: the rows are means over the steps, so their shares of the mean
        step add up to about 1 (a slow first step moves the mean from the median). A row is ``{"name": str,
        "kind": "operator" | "other" | "outside", "calls_per_step": float | None, "host_us_per_step": float,
        "share": float | None}``:

        - one per operator name (the ``n`` with most time per step, by time, then name): an operator call
          belongs to the latest-starting step whose range holds its start (a call spanning a step's end counts
          whole in the step it starts in); ``calls_per_step`` and ``host_us_per_step`` (the summed durations
          of its calls) are means over the steps, calls outside every step left out;
        - ``other operators`` (only when more than ``n`` names): the rest, summed;
        - ``outside operators`` (always, ``calls_per_step`` None): per step, its wall time minus the time of
          its range covered by top-level operators (clipped to the range), the mean over the steps: the
          loop's own Python, or the host waiting in a call that is not an operator.

        ``share`` = ``host_us_per_step`` / ``mean_step_wall_us`` (None when that is 0). The shares need not sum
        to exactly 1: the operators count a call spanning a step boundary whole where it starts, the
        ``outside operators`` row each step's own range. ``rows`` is None, with ``reason`` saying why, for no
        steps, no operators, or no operator starting inside any step; no number is made up then.

    Raises:
        ValueError: ``n`` < 1, or step starts and ends of different lengths.
    """
    import numpy as np

    if n < 1:
        raise ValueError(f"n={n!r}: must be at least 1")
    a, b = np.asarray(step_ts_us, dtype=float).reshape(-1), np.asarray(step_end_us, dtype=float).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"{len(a)} step starts but {len(b)} step ends")
    k = len(a)
    wall = float(np.mean(b - a)) if k else None
    out: dict[str, Any] = {"thread": None, "steps": k, "mean_step_wall_us": json_float(wall), "rows": None,
                           "reason": None}
    if ops is not None and len(ops.get("name", ())):
        out["thread"] = {"pid": int(ops["pid"][0]), "tid": int(ops["tid"][0])}
    if not k:
        out["reason"] = "no decode steps to divide the host's time by"
        return out
    if out["thread"] is None:
        out["reason"] = "no top-level CPU operators in the trace (it holds no cpu_op events)"
        return out
    ts = np.asarray(ops["ts_us"], dtype=float) - origin_us
    end = np.asarray(ops["end_us"], dtype=float) - origin_us
    owner = _owners(ts, a, b)
    inside = owner >= 0
    if not inside.any():
        thread = out["thread"]
        out["reason"] = (f"none of the {len(ts)} top-level CPU operators of thread {thread['pid']}/{thread['tid']} "
                         f"starts inside one of the {k} decode steps")
        return out
    index: dict[str, int] = {}  # name -> code (np.unique of the names as text would widen every one to the longest)
    code = np.fromiter((index.setdefault(str(v), len(index)) for v in ops["name"][inside].tolist()), dtype=np.int64,
                       count=int(inside.sum()))
    names = list(index)
    calls = np.bincount(code, minlength=len(names)) / k
    host = np.bincount(code, weights=(end - ts)[inside], minlength=len(names)) / k
    order = sorted(range(len(names)), key=lambda i: (-host[i], names[i]))
    rows = [_row(str(names[i]), "operator", float(calls[i]), float(host[i]), wall) for i in order[:n]]
    rest = order[n:]
    if rest:
        rows.append(_row(OTHER, "other", float(calls[rest].sum()), float(host[rest].sum()), wall))
    covered = _covered(ts, end, a, b)
    rows.append(_row(OUTSIDE, "outside", None, float(np.mean(np.clip((b - a) - covered, 0, None))), wall))
    out["rows"] = rows
    return out


def _row(name: str, kind: str, calls: float | None, host_us: float, wall: float | None) -> dict:
    return {"name": name, "kind": kind, "calls_per_step": calls, "host_us_per_step": json_float(host_us),
            "share": json_float(host_us / wall) if wall else None}


def _owners(ts: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per operator (starts ``ts``, in order), the index of the latest-starting step whose range [a, b) holds its
    start, -1 for none: steps are laid over the operators in order of their start, a later one overwriting,
    so an inner (nested) step keeps its operators and the outer one gets those after it back."""
    import numpy as np

    owner = np.full(len(ts), -1, dtype=np.int64)
    for i in np.argsort(a, kind="stable").tolist():
        lo, hi = np.searchsorted(ts, a[i], "left"), np.searchsorted(ts, b[i], "left")
        owner[lo:hi] = i
    return owner


def _covered(ts: np.ndarray, end: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per step [a, b), the µs of it inside operators (disjoint, in time order), each clipped to the range."""
    import numpy as np

    # the operators that overlap a step: those ending after its start and starting before its end (disjoint
    # operators in time order end in order too)
    lo, hi = np.searchsorted(end, a, "right"), np.searchsorted(ts, b, "left")
    out = np.zeros(len(a))
    for i, (first, stop) in enumerate(zip(lo.tolist(), hi.tolist())):
        if stop > first:
            out[i] = float((np.minimum(end[first:stop], b[i]) - np.maximum(ts[first:stop], a[i])).sum())
    return out
