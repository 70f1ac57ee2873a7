"""What the megakernel's programs do over one decode step, binned: per-opcode busy, waiting, idle, and the
weight-streaming bandwidth estimated from each task's bytes and timestamps.

Input: one step's task frame (``megakernel_engine.timeline.decode_timeline`` columns ``name``, ``program``,
``layer``, ``ts_us``, ``ready_us``, ``end_us``) or the ``intrakernel.tasks`` records of a results document
(``opcode``, ``program``, ``layer``, ``start_us``, ``ready_us``, ``end_us``). A task waits from its start to
``ready`` (dependencies met) and is busy from ``ready`` to ``end``; a program not inside any task is idle.
The result is a results document's ``intrakernel.activity`` section: ``diagnose model`` computes it from the
frame, and the megakernel figure (:mod:`.megakernel_plots`) from the task records of a document without one;
it sits with the reports so that both can reach it.

Bandwidth estimate: a task's bytes (:func:`opcode_bytes`: the weights of its (layer, opcode) divided evenly
among that pair's tasks; attention reads the KV cache) are spread uniformly over the whole task, start to end,
because the kernel issues weight loads before it waits on the dependency (docs/design.md, "Megakernel"). Where the
frame has the Gluon producer's stamps (``load_start_us``: its first TMA issue for the task, often long before
the consumer starts it, while the ring fills during an earlier wait), the task's bytes are spread from that
issue to the task's end instead: spreading them over the consumer's window alone put the estimate above the
NVML peak on the H200 (2026-12-01). It is an estimate of when bytes move, not a measurement: the counters are
per task, not per load.
"""

from __future__ import annotations

import numpy as np

WAITING, IDLE = "waiting", "idle"


def opcode_bytes(config, dtype_bytes: int, context: int) -> dict[str, int]:
    """Bytes one (layer, opcode) reads per decode step, by the megakernel's opcode names.

    QKV ``hidden × (heads + 2·kv_heads) × head_dim``, OPROJ ``heads × head_dim × hidden``, GATEUP
    ``2 × hidden × intermediate``, DOWN ``intermediate × hidden``, LMHEAD ``vocab × hidden`` (weights, times
    ``dtype_bytes``); ATTN the KV cache at ``context`` positions, ``2 × kv_heads × head_dim × context``;
    ATTN_REDUCE and NOP 0 (partials of a few kB). Norm weights (one vector each) are left out.

    Args:
        config: a :class:`~bubblescope.models.config.ModelConfig` (Hugging Face field names).
        dtype_bytes: bytes per weight element (2 for bf16).
        context: KV-cache positions the attention reads.
    """
    h, hd = config.hidden_size, config.head_dim
    nh, nkv = config.num_attention_heads, config.num_key_value_heads
    return {k: int(v * dtype_bytes) for k, v in {
        "QKV": h * (nh + 2 * nkv) * hd, "ATTN": 2 * nkv * hd * context, "ATTN_REDUCE": 0, "OPROJ": nh * hd * h,
        "GATEUP": 2 * h * config.intermediate_size, "DOWN": config.intermediate_size * h,
        "LMHEAD": config.vocab_size * h, "NOP": 0}.items()}


def _columns(tasks) -> dict[str, np.ndarray]:
    """Arrays opcode, program, layer, start, ready, end from a frame or a list of task records."""
    if hasattr(tasks, "columns"):  # a decode_timeline frame
        start = tasks["ts_us"].to_numpy(float)
        load = tasks["load_start_us"].to_numpy(float) if "load_start_us" in tasks.columns else start
        return {"opcode": tasks["name"].astype(str).to_numpy(), "program": tasks["program"].to_numpy(),
                "layer": tasks["layer"].to_numpy(), "start": start,
                "ready": tasks["ready_us"].to_numpy(float), "end": tasks["end_us"].to_numpy(float),
                "load": np.where(np.isfinite(load), np.minimum(load, start), start)}
    return {"opcode": np.array([str(t["opcode"]) for t in tasks]), "program": np.array([t["program"] for t in tasks]),
            "layer": np.array([-1 if t.get("layer") is None else t["layer"] for t in tasks]),
            "start": np.array([t["start_us"] for t in tasks], float),
            "ready": np.array([t["ready_us"] for t in tasks], float),
            "end": np.array([t["end_us"] for t in tasks], float),
            "load": np.array([t.get("load_start_us") if t.get("load_start_us") is not None else t["start_us"]
                              for t in tasks], float)}


def _binned(a: np.ndarray, b: np.ndarray, w: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Per bin, Σ_i w_i × |[a_i, b_i) ∩ bin| / bin width: the w-weighted mean count of open intervals.

    Uses F(t) = Σ w_i · clip(t − a_i, 0, b_i − a_i) = Σ_{a_i<t} w_i (t − a_i) − Σ_{b_i<t} w_i (t − b_i) with
    sorted prefix sums, so 75,000 tasks cost O(n log n), not n × bins.
    """
    def ramp(x, weights, t):
        order = np.argsort(x)
        xs, ws = x[order], weights[order]
        cw, cwx = np.concatenate([[0], np.cumsum(ws)]), np.concatenate([[0], np.cumsum(ws * xs)])
        k = np.searchsorted(xs, t, side="left")
        return cw[k] * t - cwx[k]
    b = np.maximum(a, b)
    f = ramp(a, w, edges) - ramp(b, w, edges)
    return np.diff(f) / np.diff(edges)


def activity_profile(tasks, bins: int = 160, programs: int | None = None,
                     bytes_by_opcode: dict[str, int] | None = None) -> dict | None:
    """Binned view of one megakernel step.

    Args:
        tasks: a ``decode_timeline`` frame or ``intrakernel.tasks`` records (times in µs, any origin).
        bins: number of equal time bins over first start → last end.
        programs: programs in the grid (default: distinct programs in ``tasks``); idle = programs − busy − waiting.
        bytes_by_opcode: :func:`opcode_bytes`; with it, ``GBps`` is estimated (see the module docstring).

    Returns:
        ``{"t_us": bin starts (µs from the first start, or the first load issue where earlier), "bin_us", "programs", "states": {opcode: mean
        programs busy on it per bin, ..., "waiting": ..., "idle": ...}, "GBps": per bin or None,
        "bytes": Σ task bytes or None}``, lists rounded to 5 significant digits; None for no tasks.
    """
    c = _columns(tasks)
    if len(c["start"]) == 0:
        return None
    c["load"] = np.minimum(c["load"], c["start"])
    t0, t1 = float(c["load"].min()), float(c["end"].max())  # the producer's first load issue may come first
    span = max(t1 - t0, 1e-9)
    edges = np.linspace(0.0, span, bins + 1)
    start, ready, end = c["start"] - t0, np.clip(c["ready"] - t0, c["start"] - t0, None), c["end"] - t0
    ready = np.minimum(ready, np.maximum(end, start))
    n = int(programs or len(np.unique(c["program"])))
    ones = np.ones(len(start))
    states = {}
    for op in dict.fromkeys(c["opcode"]):  # first-seen order = pipeline order
        m = c["opcode"] == op
        states[str(op)] = _binned(ready[m], end[m], ones[m], edges)
    states[WAITING] = _binned(start, ready, ones, edges)
    states[IDLE] = np.clip(n - sum(states.values()), 0, None)
    gbps, total = None, None
    if bytes_by_opcode is not None:
        per_task = np.zeros(len(start))
        pairs = np.char.add(np.char.add(c["opcode"].astype(str), "/"), c["layer"].astype(str))
        keys, counts = np.unique(pairs, return_counts=True)
        count = dict(zip(keys, counts))
        for i, (op, key) in enumerate(zip(c["opcode"], pairs)):
            per_task[i] = bytes_by_opcode.get(op, 0) / count[key]
        load = c["load"] - t0
        dur = np.maximum(end - load, 1e-9)
        gbps = _binned(load, end, per_task / dur, edges) * 1e6 / 1e9  # bytes/µs → GB/s
        total = float(per_task.sum())

    def r(x):  # 5 significant digits: GB/s under the CPU interpreter are 1e-3, on an H200 1e3
        return [float(f"{v:.5g}") for v in x]
    return {"t_us": r(edges[:-1]), "bin_us": float(f"{span / bins:.6g}"), "programs": n,
            "states": {k: r(v) for k, v in states.items()}, "GBps": r(gbps) if gbps is not None else None,
            "bytes": total}
