"""numpy cores of the interval metrics, shared by the DataFrame API (:mod:`.metrics`) and the
array summary (:mod:`.arraysummary`): grouping in first-appearance order, per-group running maxima,
the union and idle split of intervals per group. No pandas: ``diagnose trace`` runs on these alone.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

STATS = ("busy_us", "span_us", "first_us", "last_us", "host_wait_us", "kernel_wait_us", "other_idle_us")


_DENSE_SPAN = 1 << 22  # integers spanning fewer values than this are made unique through a table


def unique_ints(values: np.ndarray, return_index: bool = False) -> tuple[np.ndarray, ...]:
    """``np.unique(values, [return_index=True,] return_inverse=True)`` (sorted distinct values, [index of
    each one's first occurrence,] int64 index of each value's distinct value), the same arrays; for
    integers spanning fewer than 4 Mi values (devices, streams, text codes) through a presence table in
    O(n) instead of a sort."""
    import numpy as np

    values = np.asarray(values)
    n = len(values)
    if n == 0 or values.dtype.kind not in "iu" or int(values.max()) - int(values.min()) >= _DENSE_SPAN:
        out = np.unique(values, return_index=return_index, return_inverse=True)
        return (*out[:-1], out[-1].reshape(-1).astype(np.int64))
    lo = values.min()
    shifted = (values - lo).astype(np.intp)
    present = np.zeros(int(shifted.max()) + 1, dtype=bool)
    present[shifted] = True
    offsets = np.flatnonzero(present)
    inverse = (np.cumsum(present) - 1)[shifted].astype(np.int64)
    uniq = (offsets + lo).astype(values.dtype)
    if not return_index:
        return uniq, inverse
    first = np.full(len(uniq), n, dtype=np.intp)
    np.minimum.at(first, inverse, np.arange(n))
    return uniq, first, inverse


def factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(code per value, distinct values in order of first appearance), as ``pandas.factorize`` gives
    them for values without nulls: codes are int64 indices into the distinct values."""
    import numpy as np

    values = np.asarray(values)
    if len(values) == 0:
        return np.zeros(0, dtype=np.int64), values[:0]
    uniq, first, inverse = unique_ints(values, return_index=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank[inverse.reshape(-1)], uniq[order]


def pair_codes(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(code per row, the distinct (a, b) rows as an (n, 2) int64 array, sorted) of two int64 columns."""
    import numpy as np

    ua, ca = unique_ints(a)
    ub, cb = unique_ints(b)
    width = max(len(ub), 1)
    uniq, codes = unique_ints(ca * width + cb)
    rows = np.stack([np.asarray(ua, dtype=np.int64)[uniq // width], np.asarray(ub, dtype=np.int64)[uniq % width]],
                    axis=1)
    return codes.reshape(-1), rows.reshape(-1, 2)


def group_cummax(code: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Running maximum of float ``values`` within each run of equal ``code`` (codes ascending, runs
    contiguous). Few runs (devices, streams, steps): one ``maximum.accumulate`` per run; many: values
    are ranked once, so that one accumulate over rank + run offset never reaches into the run before."""
    import numpy as np

    n = len(values)
    if n == 0:
        return values.copy()
    starts = np.flatnonzero(np.diff(code)) + 1
    if len(starts) < 4096:
        out = np.empty(n)
        for lo, hi in zip([0, *starts.tolist()], [*starts.tolist(), n]):
            np.maximum.accumulate(values[lo:hi], out=out[lo:hi])
        return out
    order = np.argsort(values, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    base = code.astype(np.int64) * n
    return values[order][np.maximum.accumulate(base + rank) - base]


def interval_stats(
    groups: np.ndarray, start: np.ndarray, end: np.ndarray, launch_ts: np.ndarray, threshold_us: float
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(sorted distinct group keys, {each of ``STATS``: float64 array per key}) of intervals [start, end]
    (µs): busy_us the length of their union, span_us last end − first start, and the idle gaps between
    union pieces split (docs/design.md, after Holistic Trace Analysis' idle-time breakdown) into host-wait
    (the next activity's launch call, ``launch_ts``, started at or after the previous end; NaN: never),
    kernel-wait (otherwise, gap below ``threshold_us``) and other."""
    import numpy as np

    n = len(start)
    if n == 0:
        return np.asarray(groups)[:0], {k: np.zeros(0) for k in STATS}
    if np.all(groups[1:] >= groups[:-1]) and np.all((start[1:] >= start[:-1]) | (groups[1:] != groups[:-1])):
        g, s, e, lt = groups, start, end, launch_ts  # already by group then start (gpu is sorted so)
    else:
        order = np.lexsort((start, groups))
        g, s, e, lt = groups[order], start[order], end[order], launch_ts[order]
    head = np.ones(n, dtype=bool)
    head[1:] = g[1:] != g[:-1]
    code = np.cumsum(head) - 1
    reach = group_cummax(code, e)  # furthest end so far in the group
    prev = np.full(n, -np.inf)
    prev[1:] = reach[:-1]
    new = head | (s > prev)  # an activity starting after everything before it opens an interval
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, n - 1)
    k = int(code[-1]) + 1
    gap_rows = new & ~head
    gap = s[gap_rows] - prev[gap_rows]
    host = lt[gap_rows] >= prev[gap_rows]  # NaN launch time (no launch call) is never host-wait
    short = ~host & (gap < threshold_us)
    gc = code[gap_rows]
    ends = np.bincount(code, minlength=k)
    out = {
        # bincount of an empty array returns ints whatever the weights; keep every column float.
        "busy_us": np.bincount(code[first], weights=reach[last] - s[first], minlength=k).astype(float),
        "first_us": s[head],
        "last_us": reach[np.cumsum(ends) - 1],
        "host_wait_us": np.bincount(gc, weights=gap * host, minlength=k).astype(float),
        "kernel_wait_us": np.bincount(gc, weights=gap * short, minlength=k).astype(float),
        "other_idle_us": np.bincount(gc, weights=gap * (~host & ~short), minlength=k).astype(float),
    }
    out["span_us"] = out["last_us"] - out["first_us"]
    return g[head], {key: out[key] for key in STATS}


def ratio(num: Any, den: Any) -> Any:
    """num/den with NaN where den is not > 0 (scalars or arrays)."""
    import numpy as np

    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.divide(num, den)
    return np.where(np.asarray(den) > 0, out, np.nan) if np.ndim(out) else (out if den > 0 else math.nan)


def first_of_each(keys: np.ndarray) -> np.ndarray:
    """True at the first occurrence of each value of ``keys`` (``~pandas.Series.duplicated()``)."""
    import numpy as np

    out = np.zeros(len(keys), dtype=bool)
    if len(keys):
        out[np.unique(keys, return_index=True)[1]] = True
    return out


def range_owners(ts: np.ndarray, end: np.ndarray, at: np.ndarray) -> np.ndarray:
    """For each time of ``at`` (µs): the position (into ``ts``/``end``) of the latest-starting range
    [ts, end) holding it, -1 for none. Ranges may overlap or nest: a point in an overlap goes to the later
    range, one in a nest to the inner range, one after the inner range's end to the outer one again. Equal
    starts: the earlier position. The time axis is cut at every start and end and each piece given its
    owner by a sweep with a heap (2 x ranges steps); ranges that do not overlap skip the sweep."""
    import heapq

    import numpy as np

    order = np.argsort(ts, kind="stable")
    if len(order) < 2 or np.all(end[order][:-1] <= ts[order][1:]):  # no overlap: the last range started
        k = np.searchsorted(ts[order], at, side="right") - 1
        inside = (k >= 0) & (at < end[order][np.maximum(k, 0)]) if len(order) else np.zeros(len(at), dtype=bool)
        return np.where(inside, order[np.maximum(k, 0)] if len(order) else -1, -1)
    bounds = np.unique(np.concatenate([ts, end]))
    owner = np.full(len(bounds), -1, dtype=np.int64)
    active: list[tuple[float, int]] = []  # (-start, position): the latest start on top
    j = 0
    for b, edge in enumerate(bounds.tolist()):
        while j < len(order) and ts[order[j]] <= edge:
            heapq.heappush(active, (-float(ts[order[j]]), int(order[j])))
            j += 1
        while active and end[active[0][1]] <= edge:  # ended ranges leave lazily, when they come on top
            heapq.heappop(active)
        owner[b] = active[0][1] if active else -1
    k = np.searchsorted(bounds, at, side="right") - 1
    return np.where(k >= 0, owner[np.maximum(k, 0)], -1)
