"""Kernels inside CUDA-graph replays, attributed to their graph launch.

A ``cudaGraphLaunch`` is one CPU call, but its replay runs every captured kernel, each carrying the launch's
correlation id. Counted per launch, a graph-captured decode reads as "1 launch per step"; this module counts
per replay what ran inside it: kernels, GPU busy time (the union of the replay's activities), span (first start
to last end), the gaps inside the replay (span − busy: kernel boundaries the graph cannot remove) and the gaps
between consecutive replays on the device (the host's time between tokens, or other work). Pure numpy on
:class:`~.arrays.TraceArrays`; times in µs.
"""

from __future__ import annotations

from .apis import api_base_name
from .arrays import TraceArrays, launch_rows
from .intervals import interval_stats, unique_ints
from .values import json_float

GRAPH_APIS = frozenset({"cudaGraphLaunch", "cuGraphLaunch"})


def graph_replays(arrays: TraceArrays) -> dict:
    """One entry per CUDA-graph launch whose replay has GPU activity, in launch order (numpy arrays):

    ``call`` (row in ``arrays.runtime``), ``device``, ``kernels`` (kernel activities in the replay),
    ``activities`` (all of them: memcpys and memsets too), ``first_us``, ``last_us`` (the replay's first start
    and last end), ``busy_us`` (union of its activities), ``span_us`` (last − first), ``gap_inside_us`` (span −
    busy), ``gap_before_us`` (this replay's first start − the previous replay's last end on the same device; NaN
    for a device's first replay) and ``first_kernel`` (name code of its earliest activity).
    """
    import numpy as np

    gpu, rt, texts = arrays.gpu, arrays.runtime, arrays.texts
    empty = {k: np.zeros(0) for k in ("call", "device", "kernels", "activities", "first_us", "last_us", "busy_us",
                                      "span_us", "gap_inside_us", "gap_before_us", "first_kernel")}
    if not len(gpu["ts_us"]) or not len(rt["ts_us"]):
        return empty
    is_graph = np.array([api_base_name(t) in GRAPH_APIS for t in texts.tolist()], dtype=bool)
    call = launch_rows(arrays)
    rows = np.flatnonzero(call >= 0)
    rows = rows[is_graph[rt["name"][call[rows]]]]
    if not len(rows):
        return empty
    calls, inverse = unique_ints(call[rows])
    _, stats = interval_stats(inverse, gpu["ts_us"][rows], gpu["end_us"][rows],
                                 np.full(len(rows), np.nan), 0.0)
    kernel = texts[gpu["kind"][rows]] == "kernel"
    order = np.lexsort((gpu["ts_us"][rows], inverse))
    first_row = rows[order][np.searchsorted(inverse[order], np.arange(len(calls)))]
    out = {"call": calls, "device": gpu["device"][first_row],
           "kernels": np.bincount(inverse[kernel], minlength=len(calls)),
           "activities": np.bincount(inverse, minlength=len(calls)), "first_us": stats["first_us"],
           "last_us": stats["last_us"], "busy_us": stats["busy_us"], "span_us": stats["span_us"],
           "first_kernel": gpu["name"][first_row]}
    out["gap_inside_us"] = out["span_us"] - out["busy_us"]
    by = np.lexsort((out["first_us"], out["device"]))  # per device, in time order
    gap = np.full(len(calls), np.nan)
    same = out["device"][by][1:] == out["device"][by][:-1]
    gap[by[1:][same]] = (out["first_us"][by][1:] - out["last_us"][by][:-1])[same]
    out["gap_before_us"] = gap
    return out


def graph_summary(arrays: TraceArrays, device: int | None = None) -> dict | None:
    """JSON-ready figures of the CUDA-graph replays on ``device`` (default: the device with most replays), or
    None when the trace launches no graph.

    Keys: ``device``, ``replays``, ``graphs`` (distinct graphs, told apart by kernel count and first kernel),
    ``kernels`` (in all replays), ``kernel_share`` (of the device's kernels: how much of the work the graphs
    hold), ``kernels_per_replay`` (median), ``busy_us_per_replay``, ``span_us_per_replay``,
    ``gap_inside_us_per_replay`` (medians, µs), ``gap_inside_share`` (summed gaps inside / summed spans),
    ``gap_between_us_p50`` / ``gap_between_us_max`` (gaps between consecutive replays, µs; None with one
    replay), and ``by_graph``: per distinct graph ``{first_kernel, kernels, replays, busy_us_per_replay,
    gap_inside_us_per_replay}``, most replayed first.
    """
    import numpy as np

    r = graph_replays(arrays)
    if not len(r["call"]):
        return None
    if device is None or not (r["device"] == device).any():
        ids, counts = np.unique(r["device"], return_counts=True)
        device = int(ids[counts.argmax()])
    mine = r["device"] == device
    r = {k: v[mine] for k, v in r.items()}
    gpu = arrays.gpu
    on_device = (gpu["device"] == device) & (arrays.texts[gpu["kind"]] == "kernel")
    between = r["gap_before_us"][~np.isnan(r["gap_before_us"])]
    _, key = unique_ints(r["kernels"].astype(np.int64) * (len(arrays.texts) + 1) + r["first_kernel"])
    by_graph = []
    for k in np.unique(key).tolist():
        sel = key == k
        by_graph.append({"first_kernel": str(arrays.texts[r["first_kernel"][sel][0]]),
                         "kernels": int(r["kernels"][sel][0]), "replays": int(sel.sum()),
                         "busy_us_per_replay": json_float(np.median(r["busy_us"][sel])),
                         "gap_inside_us_per_replay": json_float(np.median(r["gap_inside_us"][sel]))})
    by_graph.sort(key=lambda g: (-g["replays"], -g["kernels"]))
    return {
        "device": device,
        "replays": int(len(r["call"])),
        "graphs": len(by_graph),
        "kernels": int(r["kernels"].sum()),
        "kernel_share": json_float(r["kernels"].sum() / on_device.sum()) if on_device.any() else None,
        "kernels_per_replay": json_float(np.median(r["kernels"])),
        "busy_us_per_replay": json_float(np.median(r["busy_us"])),
        "span_us_per_replay": json_float(np.median(r["span_us"])),
        "gap_inside_us_per_replay": json_float(np.median(r["gap_inside_us"])),
        "gap_inside_share": json_float(r["gap_inside_us"].sum() / r["span_us"].sum()) if r["span_us"].sum() > 0
        else None,
        "gap_between_us_p50": json_float(np.median(between)) if len(between) else None,
        "gap_between_us_max": json_float(between.max()) if len(between) else None,
        "by_graph": by_graph,
    }
