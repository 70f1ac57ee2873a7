"""Decode steps of a trace that marks none: found from what repeats once per token.

A decode loop does the same work for every token, so its trace is one sequence of calls repeated. Without
``record_function`` step ranges, the steps are found in the sequence of *units* the host issued:

- with GPU activity: the launch calls (kernel launches, ``cudaGraphLaunch``, memcpy/memset calls) of the busiest
  host thread whose work ran on the main device, in call order; a unit is named by its kernel, or, for a
  CUDA-graph replay, by its kernel count and first kernel, so one graph launch is one unit;
- without GPU activity: the top-level CPU operators of the busiest thread (:mod:`.cpuops`).

:func:`repeating_steps` then looks for the unit that occurs once per step: cut at each occurrence of a unit,
the sequence falls into segments, and for the unit that starts each step, most segments are the same sequence
(compared by a position-weighted hash of their units, so order counts). Of the units that cut the most units
into identical segments, the one after the longest median host gap is the step's first unit (the gap
between tokens: sampling, a host sync). Segments from the first to the last identical one are the steps;
those before are prefill and warm-up (a first period that differs), those after a tail. A trace where no
sequence repeats at least :data:`MIN_STEPS` times, or where the repeats cover less than
:data:`MIN_COVERAGE` of the units, has no steps found: none are invented.

How the steps were found is named (:func:`find_decode_steps`' ``detection``): a CUDA-graph launch per step, one
kernel holding most of a step's GPU time (a megakernel), or a repeating kernel sequence, with a confidence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..wording import count, plural
from .graphs import GRAPH_APIS
from .intervals import pair_codes, unique_ints
from .trace import api_base_name
from .tracearrays import launch_rows

if TYPE_CHECKING:
    import numpy as np

    from .tracearrays import TraceArrays

MIN_STEPS = 3  # fewer repeats cannot tell a period from a coincidence
MIN_COVERAGE = 0.5  # the steps must hold at least this share of the units, or the "period" is a detail
# A step is "one kernel" (a megakernel) when one of its units holds this share of its GPU time.
MEGAKERNEL_MIN_SHARE = 0.8
_MAX_SHIFTS = 4096  # step boundaries tried per anchor (all of them for steps of up to this many units)
_HASH_SEED = 0x5EED_0D1E


def _prefix_hashes(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Prefix sums (uint64, wrapping) of two random values per distinct token, the second also weighted by
    position, from which :func:`_segment_hash` gets any segment's hash in O(1)."""
    import numpy as np

    _, code = unique_ints(tokens)
    rng = np.random.default_rng(_HASH_SEED)
    r1 = rng.integers(1, 1 << 63, size=int(code.max()) + 1, dtype=np.uint64)
    r2 = rng.integers(1, 1 << 63, size=int(code.max()) + 1, dtype=np.uint64)
    a, b = r1[code], r2[code]
    zero = np.zeros(1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return (np.concatenate([zero, np.cumsum(a, dtype=np.uint64)]),
                np.concatenate([zero, np.cumsum(b, dtype=np.uint64)]),
                np.concatenate([zero, np.cumsum(b * np.arange(len(tokens), dtype=np.uint64), dtype=np.uint64)]))


def _segment_hash(h: tuple, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Hash (uint64) of each segment [start, end) of the tokens: the sum of its tokens' first values, the sum of
    their second values weighted by position within the segment, and its length, mixed. Equal sequences hash
    equal; different ones collide with probability about 2^-64."""
    import numpy as np

    a, b, c = h
    s, e = np.asarray(start, dtype=np.int64), np.asarray(end, dtype=np.int64)
    su = s.astype(np.uint64)
    with np.errstate(over="ignore"):
        h1 = a[e] - a[s]
        h2 = (c[e] - c[s]) - su * (b[e] - b[s])
        length = (e - s).astype(np.uint64)
        return h1 ^ (h2 * np.uint64(0x9E3779B97F4A7C15)) ^ (length * np.uint64(0xC2B2AE3D27D4EB4F))


def _not_found(reason: str, n: int) -> dict:
    return {"found": False, "reason": reason, "units": n}


def repeating_steps(tokens: np.ndarray, gap_before: np.ndarray, min_steps: int = MIN_STEPS,
                    min_coverage: float = MIN_COVERAGE) -> dict:
    """Steps of a unit sequence that repeats once per step (the algorithm of the module doc).

    Args:
        tokens: (n,) int64, one code per unit in issue order (equal codes: the same kernel or operator).
        gap_before: (n,) float64 µs, host time between the previous unit's end and this unit's start (the
            step boundary is put where it is longest).
        min_steps: fewest identical segments that make a period.
        min_coverage: least share of the units the steps must hold.

    Returns:
        ``{"found": True, "starts", "ends": int64 arrays (unit index of each step's first unit, and one past
        its last), "matching": bool array (the step is the common sequence exactly), "length": units in the
        common sequence, "anchor": the token of each step's first unit, "prefix": units before the first step,
        "suffix": units after the last, "coverage": share of the units in steps as long as the common
        sequence, "units": n, "reason": None}``,
        or ``{"found": False, "reason": str, "units": n}``.
    """
    import numpy as np

    tokens = np.asarray(tokens)
    n = len(tokens)
    if n < min_steps:
        return _not_found(f"only {count(n, 'unit')}: too few to repeat {min_steps} times", n)
    gap_before = np.asarray(gap_before, dtype=float)
    h = _prefix_hashes(tokens)
    values, code = unique_ints(tokens)
    order = np.argsort(code, kind="stable")  # positions grouped by token, ascending within each
    bounds = np.concatenate([[0], np.cumsum(np.bincount(code, minlength=len(values)))])
    candidates = []
    for c in np.flatnonzero(np.diff(bounds) >= min_steps).tolist():
        p = order[bounds[c]:bounds[c + 1]]
        sig = _segment_hash(h, p[:-1], p[1:])
        uniq, counts = np.unique(sig, return_counts=True)
        common = uniq[counts.argmax()]
        same = sig == common
        length = int(p[1:][same][0] - p[:-1][same][0])
        tail = p[-1] + length <= n and _segment_hash(h, p[-1:], p[-1:] + length)[0] == common
        repeats = int(counts.max()) + int(tail)
        if repeats < min_steps:
            continue
        gap = float(np.median(gap_before[p[:-1][same]]))
        candidates.append((repeats * length, length, repeats, gap, c, common))
    if not candidates:
        return _not_found(f"no sequence of units repeats {min_steps} times or more", n)
    _, length, _, _, c, _ = max(candidates, key=lambda t: (t[0], -t[1], t[3]))
    starts, ends, matching = _aligned(h, order[bounds[c]:bounds[c + 1]], length, gap_before)
    first, last = int(np.argmax(matching)), len(matching) - 1 - int(np.argmax(matching[::-1]))
    starts, ends, matching = starts[first:last + 1], ends[first:last + 1], matching[first:last + 1]
    # steps of the common length (the same calls, maybe other kernels: a context that changes the attention
    # kernel) must hold most units; a short motif repeating inside one long pass is not a step
    regular = (ends - starts) == length
    coverage = float((ends - starts)[regular].sum() / n)
    if coverage < min_coverage:
        return _not_found(f"the most repeated sequence ({count(length, 'unit')}, {int(matching.sum())} times) "
                          f"covers only {coverage:.0%} of the {n} units", n)
    return {"found": True, "starts": starts.astype(np.int64), "ends": ends.astype(np.int64), "matching": matching,
            "length": length, "anchor": values[c], "prefix": int(starts[0]), "suffix": int(n - ends[-1]),
            "coverage": coverage, "units": n, "reason": None}


def _aligned(h: tuple, p: np.ndarray, length: int, gap_before: np.ndarray) -> tuple[np.ndarray, ...]:
    """(starts, ends, matching) of the segments cut ``d`` units before each occurrence ``p`` of the anchor.

    The anchor need not be a step's first unit (a loop whose once-per-token calls come after its layers), so
    every ``d`` in [0, length) is tried: the boundary goes after the longest median host gap (where a token
    ends: sampling, a sync) when that gap is at least twice the one of the ``d`` that makes the most segments
    the common sequence and loses at most one of them; else that ``d`` (a trace cut mid-step loses a step at
    each end otherwise)."""
    import numpy as np

    n = len(gap_before)
    shifts = np.arange(length)
    if length > _MAX_SHIFTS:  # a very long step: try only the boundaries after the longest gaps
        typical = np.array([np.median(gap_before[np.clip(p - d, 0, n - 1)]) for d in range(length)])
        shifts = np.sort(np.argsort(-typical, kind="stable")[:_MAX_SHIFTS])
    tried = []
    for d in shifts.tolist():
        starts = p[p >= d] - d
        if not len(starts):
            continue
        ends = np.append(starts[1:], min(int(starts[-1]) + length, n))
        sig = _segment_hash(h, starts, ends)
        uniq, counts = np.unique(sig, return_counts=True)
        matching = sig == uniq[counts.argmax()]
        tried.append((int(counts.max()), float(np.median(gap_before[starts[matching]])), -d, starts, ends, matching))
    most = max(tried, key=lambda t: t[:3])
    gap = max((t for t in tried if t[0] >= most[0] - 1), key=lambda t: t[1:3])
    pick = gap if gap[1] > 0 and gap[1] >= 2 * most[1] else most
    return pick[3], pick[4], pick[5]


def confidence(steps: int, matching: int, coverage: float) -> str:
    """``high`` (8 steps or more, 90 % of them the common sequence exactly, 80 % of the units in steps),
    ``medium`` (70 % exact, half the units) or ``low``: how much the step count can be trusted."""
    share = matching / steps if steps else 0.0
    if steps >= 8 and share >= 0.9 and coverage >= 0.8:
        return "high"
    return "medium" if share >= 0.7 and coverage >= 0.5 else "low"


def launch_units(arrays: TraceArrays) -> dict | None:
    """The GPU-side units of the module doc, or None when no GPU activity is linked to a launch call.

    Returns ``{"kind": "launches", "token", "ts_us", "end_us", "gpu_end_us", "busy_us", "activities", "name",
    "graph", "kernel", "pid", "tid", "device"}``: per unit (a CPU call, in call order) its token (int64), call
    start and end, its GPU activities' last end and summed duration (µs), their count, the first one's name
    code, whether the call is a CUDA-graph launch and whether its first activity is a kernel.
    """
    import numpy as np

    gpu, rt = arrays.gpu, arrays.runtime
    if not len(gpu["ts_us"]) or not len(rt["ts_us"]):
        return None
    ids, per = np.unique(gpu["device"], return_counts=True)
    device = int(ids[per.argmax()])
    rows = np.flatnonzero(gpu["device"] == device)
    call = launch_rows(arrays)[rows]
    rows, call = rows[call >= 0], call[call >= 0]
    if not len(call):
        return None
    thread, _ = pair_codes(rt["pid"][call], rt["tid"][call])
    mine = thread == np.bincount(thread).argmax()  # the decode loop's thread: most calls with GPU work
    rows, call = rows[mine], call[mine]
    order = np.lexsort((gpu["ts_us"][rows], call))  # by call, then by start within a graph replay
    rows, call = rows[order], call[order]
    calls, first, inverse = unique_ints(call, return_index=True)
    first = np.sort(first)
    activities = np.bincount(inverse).astype(np.int64)
    names = gpu["name"][rows[first]].astype(np.int64)
    api = np.array([api_base_name(t) in GRAPH_APIS for t in arrays.texts.tolist()], dtype=bool)
    graph = api[rt["name"][calls]]
    token, _ = pair_codes(np.where(graph, activities, 0), names)  # a replay: its kernel count and first kernel
    ts, end = rt["ts_us"][calls], rt["ts_us"][calls] + rt["dur_us"][calls]
    return {"kind": "launches", "token": token.astype(np.int64), "ts_us": ts, "end_us": end,
            "gpu_end_us": np.maximum.reduceat(gpu["end_us"][rows], first),
            "busy_us": np.add.reduceat(gpu["dur_us"][rows], first), "activities": activities, "name": names,
            "graph": graph, "kernel": arrays.texts[gpu["kind"][rows[first]]] == "kernel", "pid": rt["pid"][calls],
            "tid": rt["tid"][calls], "device": device}


def op_units(ops: dict) -> dict:
    """The CPU-side units of :func:`~.cpuops.read_cpu_ops`' operators: ``{"kind": "cpu-ops", "token",
    "ts_us", "end_us", "names" (str per unit), "pid", "tid"}``."""
    import numpy as np

    names, token = np.unique(ops["name"].astype(str), return_inverse=True)
    return {"kind": "cpu-ops", "token": token.reshape(-1).astype(np.int64), "ts_us": ops["ts_us"],
            "end_us": ops["end_us"], "names": ops["name"], "pid": ops["pid"], "tid": ops["tid"]}


def _gaps(units: dict) -> np.ndarray:
    import numpy as np

    ts, end = units["ts_us"], units["end_us"]
    gap = np.zeros(len(ts))
    if len(ts) > 1:
        gap[1:] = np.clip(ts[1:] - np.maximum.accumulate(end)[:-1], 0, None)
    return gap


def _describe(units: dict, found: dict, texts: Any) -> dict:
    """The method, its words and the step's make-up, from the steps that are the common sequence."""
    import numpy as np

    s, e = found["starts"], found["ends"]
    k, length = len(s), found["length"]
    exact = s[found["matching"]]
    out: dict[str, Any] = {"megakernel": None, "graph_launches_per_step": None}
    if units["kind"] == "cpu-ops":
        out.update(method="cpu-ops", unit="CPU op", what=f"a repeating {length}-op sequence of top-level CPU ops")
        return out
    pos = exact[:, None] + np.arange(length)  # (exact steps, units per step): the common step's units
    graph, acts, busy = units["graph"][pos[0]], units["activities"][pos], units["busy_us"][pos]
    kernels = units["kernel"][pos[0]]
    single = not graph.any() and bool((acts == 1).all()) and bool(kernels.all())
    out["unit"] = "kernel" if single else "call"
    share = busy.sum(axis=0) / max(float(busy.sum()), 1e-300)
    top = int(share.argmax())
    graph_kernels = float(acts[:, graph].sum()) / max(float(acts.sum()), 1)
    if graph.any() and graph_kernels >= 0.5:
        g = int(graph.sum())
        out.update(method="cuda-graph", graph_launches_per_step=g,
                   what=f"CUDA-graph launches ({count(g, 'graph launch', 'graph launches')} and "
                        f"{count(length - g, 'other call')} per step)")
    elif share[top] >= MEGAKERNEL_MIN_SHARE and acts[0, top] == 1 and not graph[top]:
        name = str(texts[units["name"][pos[0, top]]])
        out.update(method="megakernel", megakernel=name,
                   what=f"one kernel per step ({name}, {share[top]:.0%} of the step's GPU time)")
    else:
        made_of = "" if single else f" ({count(int(acts[0][kernels].sum()), 'kernel')})"
        out.update(method="sequence", what=f"a repeating {length}-{out['unit']} sequence{made_of}")
    return out


def find_decode_steps(arrays: TraceArrays, cpu_ops: dict | None = None) -> tuple[dict | None, dict]:
    """Decode steps of a trace without step markers (the module doc), as step ranges and how they were found.

    Args:
        arrays: the parsed trace.
        cpu_ops: its top-level CPU operators (:func:`~.cpuops.read_cpu_ops`), used when no GPU activity is
            linked to a launch call; None: none.

    Returns:
        ``(steps, detection)``. ``steps`` is None when none were found, else the step ranges in the form of
        :func:`.arraysummary.find_steps` (step, pid, tid, ts_us, dur_us, end_us, thread, overlap_us; µs): step
        k runs from its first unit's call to step k + 1's first call, the last step to the later of its last
        call's end and its GPU work's end, so every call of the loop between two tokens is in one step.
        ``detection``: ``{"method": "cuda-graph" | "megakernel" | "sequence" | "cpu-ops" | None, "steps",
        "units_per_step", "unit", "matching_steps", "prefix_units", "suffix_units", "coverage", "confidence",
        "megakernel", "graph_launches_per_step", "description", "reason"}``.
    """
    import numpy as np

    units = launch_units(arrays)
    if units is None and cpu_ops is not None and len(cpu_ops.get("name", ())):
        units = op_units(cpu_ops)
    if units is None:
        why = ("no launch call is linked to the GPU activity" if len(arrays.gpu["ts_us"])
               else "no GPU activity and no CPU operators in the trace")
        return None, _detection(None, 0, reason=why)
    found = repeating_steps(units["token"], _gaps(units))
    noun, nouns = ("launch", "launches") if units["kind"] == "launches" else ("CPU op", "CPU ops")
    if not found["found"]:
        return None, _detection(None, 0, reason=f"no repeating structure in the {count(found['units'], noun, nouns)}: "
                                                 f"{found['reason']}")
    s, e = found["starts"], found["ends"]
    k = len(s)
    start = units["ts_us"][s]
    last_end = float(units["end_us"][s[-1]:e[-1]].max())
    if units["kind"] == "launches":
        last_end = max(last_end, float(units["gpu_end_us"][s[-1]:e[-1]].max()))
    end = np.append(start[1:], last_end)
    steps = {"step": np.arange(k, dtype=np.int64), "pid": np.full(k, units["pid"][s[0]], dtype=np.int64),
             "tid": np.full(k, units["tid"][s[0]], dtype=np.int64), "ts_us": start.astype(float),
             "end_us": end.astype(float), "dur_us": (end - start).astype(float),
             "thread": np.full(k, units["kind"] == "launches"), "overlap_us": np.zeros(k)}
    how = _describe(units, found, arrays.texts)
    matching = int(found["matching"].sum())
    conf = confidence(k, matching, found["coverage"])
    prefix = found["prefix"]
    text = (f"steps: {k}, from {how['what']}; confidence {conf}: {matching} of {k} "
            f"{plural(k, 'step')} repeat it exactly, {found['coverage']:.0%} of the "
            f"{count(found['units'], noun, nouns)} in steps of its length")
    if prefix:
        text += f", the {count(prefix, noun, nouns)} before the first step left out (prefill, warm-up)"
    detection = _detection(how["method"], k, units_per_step=found["length"], unit=how["unit"],
                           matching_steps=matching, prefix_units=prefix, suffix_units=found["suffix"],
                           coverage=found["coverage"], confidence=conf, megakernel=how["megakernel"],
                           graph_launches_per_step=how["graph_launches_per_step"], description=text)
    return steps, detection


def _detection(method: str | None, steps: int, reason: str | None = None, **fields: Any) -> dict:
    out = {"method": method, "marker": None, "steps": steps, "units_per_step": None, "unit": None,
           "matching_steps": None, "prefix_units": None, "suffix_units": None, "coverage": None,
           "confidence": None, "megakernel": None, "graph_launches_per_step": None, "description": None,
           "reason": reason}
    out.update(fields)
    if reason is not None:
        out["description"] = f"steps: none found ({reason}); no steps are made up"
    return out


def marker_detection(marker: str, steps: int) -> dict:
    """The ``detection`` dict of steps marked by ``record_function`` ranges named ``marker``."""
    return {**_detection("marker", steps), "marker": marker, "confidence": "high",
            "description": f"steps: {steps}, from the {marker!r} ranges"}
