"""GPU activities, ranges and CPU calls written twice, counted once: the cleaning of a parse's columns.

- :func:`drop_repeated`: a GPU activity repeated exactly, or nested inside another of the same name
  on the same device and stream (a profiler writing one kernel twice, a range re-emitted around
  itself), is counted once: the outer (first) one is kept. Summed, such a pair would count GPU time twice.
- :func:`drop_repeated_ranges` does the same for ``record_function`` ranges (so a step range is one step),
  :func:`drop_repeated_calls` for CPU API calls repeated exactly.
"""

from __future__ import annotations

from typing import Any

from ...wording import count
from .intervals import group_cummax


def _repeats(table: dict[str, Any], keys: tuple[str, ...], nested: bool) -> tuple[Any, Any]:
    """(rows to drop, of which repeated exactly) of ``table`` (numpy columns with ts_us and end_us): within one
    group of equal ``keys`` columns, a row whose [ts_us, end_us] equals an earlier one's, or, with ``nested``,
    lies inside an earlier-starting (or equal, longer) one's. Bool masks aligned with the table."""
    import numpy as np

    n = len(table["ts_us"])
    none = np.zeros(n, dtype=bool)
    if n < 2:
        return none, none
    ts, end = table["ts_us"], table["end_us"]
    cols = [table[k] for k in keys]
    order = np.lexsort((-end, ts, *reversed(cols)))  # the outer range first among equal starts
    t, e = ts[order], end[order]
    head = np.zeros(n, dtype=bool)
    head[0] = True
    for col in cols:
        c = col[order]
        head[1:] |= c[1:] != c[:-1]
    same = np.zeros(n, dtype=bool)
    same[1:] = ~head[1:] & (t[1:] == t[:-1]) & (e[1:] == e[:-1])
    if nested:
        reach = group_cummax(np.cumsum(head) - 1, e)
        inside = np.zeros(n, dtype=bool)
        inside[1:] = ~head[1:] & (e[1:] <= reach[:-1])
    else:
        inside = same
    drop, exact = none.copy(), none.copy()
    drop[order], exact[order] = inside, same
    return drop, exact


def _without(table: dict[str, Any], drop: Any) -> dict[str, Any]:
    return {key: arr[~drop] for key, arr in table.items()} if drop.any() else table


def drop_repeated(gpu: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(``gpu`` without repeated or same-name nested activities, warnings naming what was merged).

    ``gpu`` is the gpu table of a :class:`~.arrays.TraceArrays` (numpy columns name codes,
    device, stream, ts_us, end_us, ...). Within one (device, stream, name), an activity whose
    [ts_us, end_us] lies inside an earlier-starting (or equal, longer) one is dropped. Row order of
    the kept activities is unchanged.
    """
    drop, same = _repeats(gpu, ("device", "stream", "name"), nested=True)
    if not drop.any():
        return gpu, []
    notes = []
    if same.any():
        notes.append(
            f"{count(int(same.sum()), 'GPU activity', 'GPU activities')} repeated exactly (same device, stream, name, "
            "start and duration): "
            "counted once"
        )
    nested = int(drop.sum() - same.sum())
    if nested:
        notes.append(
            f"{count(nested, 'GPU activity', 'GPU activities')} nested inside another of the same name on the same "
            "device and stream: "
            "counted once (the outer one kept)"
        )
    return _without(gpu, drop), notes


def drop_repeated_ranges(annotations: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(``annotations`` without repeated or same-name nested ranges, warnings naming what was dropped).

    A ``record_function`` range repeated exactly (same pid, tid, name, start and duration: a trace written
    twice into one file, a merge of overlapping captures), or nested inside an earlier-starting one of the same
    name on the same thread (a ``ProfilerStep#3`` inside ``ProfilerStep#3``, a decorated function that calls
    itself), would make two steps of one; the outer (first) one is kept, as :func:`drop_repeated` keeps the
    outer GPU activity. Row order of the kept ranges is unchanged."""
    drop, same = _repeats(annotations, ("pid", "tid", "name"), nested=True)
    if not drop.any():
        return annotations, []
    notes = []
    if same.any():
        notes.append(f"{count(int(same.sum()), 'range')} (record_function) repeated exactly (same thread, name, "
                     "start and duration): counted once")
    nested = int(drop.sum() - same.sum())
    if nested:
        notes.append(f"{count(nested, 'range')} (record_function) nested inside another of the same name on the "
                     "same thread: counted once (the outer one kept)")
    return _without(annotations, drop), notes


def drop_repeated_calls(runtime: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(``runtime`` without CPU API calls repeated exactly, a warning naming how many), so a launch or a
    synchronize written twice (same pid, tid, name, correlation, start and duration) counts once. Calls of one
    name nested in one another are left alone: a runtime call may wrap a driver call, and those differ by name."""
    drop, _ = _repeats(runtime, ("pid", "tid", "name", "correlation"), nested=False)
    if not drop.any():
        return runtime, []
    return _without(runtime, drop), [
        f"{count(int(drop.sum()), 'CPU API call')} repeated exactly (same thread, name, correlation id, start and "
        "duration): counted once"]
