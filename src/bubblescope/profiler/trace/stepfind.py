"""Decode steps of a trace that marks none: found from what repeats once per token.

A decode loop does the same work for every token, so its trace is one sequence of calls repeated. Without
``record_function`` step ranges, the steps are found in the sequence of *units* the host issued:

- with GPU activity: the launch calls (kernel launches, ``cudaGraphLaunch``, memcpy/memset calls) of the busiest
  host thread whose work ran on the main device, in call order; a unit is named by its kernel, or, for a
  CUDA-graph replay, by its kernel count and first kernel, so one graph launch is one unit;
- without GPU activity: the top-level CPU operators of the busiest thread (:mod:`.cpuops`).

:func:`~.periodic.repeating_steps` then finds the period of that sequence: the steps, with prefill and warm-up
(a first period that differs) before them; a trace with no repeating structure has none (none are invented).

How the steps were found is named (:func:`find_decode_steps`' ``detection``): a CUDA-graph launch per step, one
kernel holding most of a step's GPU time (a megakernel), or a repeating kernel sequence, with a confidence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...wording import count, plural
from .apis import api_base_name
from .arrays import TraceArrays, launch_rows
from .graphs import GRAPH_APIS
from .intervals import pair_codes, unique_ints
from .periodic import confidence, repeating_steps

if TYPE_CHECKING:
    import numpy as np


# A step is "one kernel" (a megakernel) when one of its units holds this share of its GPU time.
MEGAKERNEL_MIN_SHARE = 0.8


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
    """The CPU-side units of :func:`~.cpuops.parsed_cpu_ops`' operators: ``{"kind": "cpu-ops", "token",
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

    s, length = found["starts"], found["length"]
    lengths = found.get("lengths") or [length]
    size = f"{lengths[0]}–{lengths[-1]}" if len(lengths) > 1 else f"{length}"   # variants of differing lengths
    exact = s[found["matching"]]
    out: dict[str, Any] = {"megakernel": None, "graph_launches_per_step": None}
    if units["kind"] == "cpu-ops":
        out.update(method="cpu-ops", unit="CPU op", what=f"a repeating {size}-op sequence of top-level CPU ops")
        return out
    pos = exact[:, None] + np.arange(length)  # (exact steps, units per step): the common step's (first) units
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
        out.update(method="sequence", what=f"a repeating {size}-{out['unit']} sequence{made_of}")
    return out


def find_decode_steps(arrays: TraceArrays, cpu_ops: dict | None = None) -> tuple[dict | None, dict]:
    """Decode steps of a trace without step markers (the module doc), as step ranges and how they were found.

    Args:
        arrays: the parsed trace.
        cpu_ops: its top-level CPU operators (:func:`~.cpuops.parsed_cpu_ops`), used when no GPU activity is
            linked to a launch call; None: none.

    Returns:
        ``(steps, detection)``. ``steps`` is None when none were found, else the step ranges in the form of
        :func:`.arraysummary.find_steps` (step, pid, tid, ts_us, dur_us, end_us, thread, overlap_us; µs): step
        k runs from its first unit's call to step k + 1's first call, the last step to the later of its last
        call's end and its GPU work's end, so every call of the loop between two tokens is in one step.
        ``detection``: ``{"method": "cuda-graph" | "megakernel" | "sequence" | "cpu-ops" | None, "steps",
        "units_per_step", "unit", "matching_steps", "prefix_units", "suffix_units", "coverage", "confidence",
        "megakernel", "graph_launches_per_step", "variants", "cycle", "description", "reason"}``. ``cycle`` > 1: the
        common sequence repeats exactly only every ``cycle`` steps, in ``variants`` forms of one length or of
        lengths a unit or so apart (the steps then count as matching by their length; ``units_per_step`` is the
        shortest).
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
    cycle, variants = found.get("cycle", 1), found.get("variants", 1)
    if cycle > 1:  # one length, the units changing from token to token: say so, and count same-length steps
        text = (f"steps: {k}, from {how['what']} in {variants} variants (units that change from token to token; "
                f"the same sequence every {cycle} steps); confidence {conf}: {matching} of {k} {plural(k, 'step')} "
                f"of {'its length' if len(found.get('lengths') or ()) < 2 else 'a variant length'}, {found['coverage']:.0%} of the {count(found['units'], noun, nouns)}")
    else:
        text = (f"steps: {k}, from {how['what']}; confidence {conf}: {matching} of {k} "
                f"{plural(k, 'step')} repeat it exactly, {found['coverage']:.0%} of the "
                f"{count(found['units'], noun, nouns)} in steps of its length")
    if prefix:
        text += f", the {count(prefix, noun, nouns)} before the first step left out (prefill, warm-up)"
    detection = _detection(how["method"], k, units_per_step=found["length"], unit=how["unit"],
                           matching_steps=matching, prefix_units=prefix, suffix_units=found["suffix"],
                           coverage=found["coverage"], confidence=conf, megakernel=how["megakernel"],
                           graph_launches_per_step=how["graph_launches_per_step"], variants=variants,
                           cycle=cycle, description=text)
    return steps, detection


def _detection(method: str | None, steps: int, reason: str | None = None, **fields: Any) -> dict:
    out = {"method": method, "marker": None, "steps": steps, "units_per_step": None, "unit": None,
           "matching_steps": None, "prefix_units": None, "suffix_units": None, "coverage": None,
           "confidence": None, "megakernel": None, "graph_launches_per_step": None, "variants": None, "cycle": None,
           "description": None, "reason": reason}
    out.update(fields)
    if reason is not None:
        out["description"] = f"steps: none found ({reason}); no steps are made up"
    return out


def marker_detection(marker: str, steps: int) -> dict:
    """The ``detection`` dict of steps marked by ``record_function`` ranges named ``marker``."""
    return {**_detection("marker", steps), "marker": marker, "confidence": "high",
            "description": f"steps: {steps}, from the {marker!r} ranges"}
