"""Decode the megakernel's per-task timestamps into a CUPTI-like frame, summarise it, export it.

The kernel (``TIMELINE`` on) writes, per (program, queue slot), three int64 nanosecond stamps: when the
program picked the task up (``start``), when its dependency counter was satisfied (``ready``) and when it
had signalled completion (``end``) — from ``%globaltimer`` on the GPU (one clock for all SMs), from the
host's monotonic clock under the interpreter. The instruction table says which task each slot held.

Definitions (docs/design.md, "intrakernel_wait_ratio"): a task's ``wait_us = ready − start`` (spinning on
dependencies, including its prefetch issue), its busy time ``end − ready``; ``wait_ratio = Σ wait /
Σ (end − start)`` over all tasks: the fraction of program-time spent waiting on dependencies. Program
time between tasks (reading the next instruction) is not in any task.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from .schedule import F_GIDX, F_LAYER, F_OP, F_TILE, OPCODE_NAMES, OPCODES, Schedule

@dataclass
class IntraKernelTimeline:
    """What ``MegakernelEngine.timeline()`` yields; filled when the ``with`` block ends.

    ``frame``: the last step's :func:`decode_timeline` frame (None if no step ran, or the timeline kernel
    could not run — then ``reason`` says why). ``ts_offset_us``: where the frame's origin (its first task
    start) sits on the host's monotonic clock in µs — exact under the interpreter (the stamps are that
    clock); on a GPU an estimate, the host time just before the step's launch (the GPU clock is another
    domain). To overlay on a CUPTI trace exactly, set it to the ``ts`` of that step's kernel event.
    """

    frame: pd.DataFrame | None = None
    ts_offset_us: float = 0.0
    reason: str | None = None


COLUMNS = ["name", "program", "layer", "task", "tile", "launch", "ts_us", "ready_us", "end_us", "dur_us", "wait_us"]
# Gluon kernel only: when its producer warp issued the task's first and last weight tile (µs, NaN for tasks
# without weights). ``load_start_us < ts_us`` means the weights were on their way before the task began.
LOAD_COLUMNS = ["load_start_us", "load_end_us"]
# Gluon kernel only, attention tasks (they have no weights, so their consumer uses those two stamps): when the task's
# math was done (q and the new K/V had arrived) and when it drew its ticket (partials stored and fenced; a single
# split: its output published). The rest up to ``end_us`` is the combine and signal of the last ticket holder.
ATTN_COLUMNS = ["math_end_us", "ticket_us"]
# Gluon kernel only, weight tasks: when the consumer had its input vector staged in shared memory (after the
# dependency wait: the input's L2 round trip and, for QKV / gate-up / LM head, its RMSNorm) and when it had consumed
# the task's last ring slot (the matvec, waiting on the weights still in flight). The rest up to ``end_us`` is the
# epilogue, the output stores and, for a stage's last task on the CTA, the release and the signal.
PHASE_COLUMNS = ["staged_us", "mv_end_us"]
# Gluon kernel only, attention tasks, in those two stamps: when q was in registers (its L2 round trip after the
# wait; normed and rotated with q/k-norm) and when the loop over the split's K/V blocks was done (before the
# warp-local layout's cross-warp combine; the same as ``math_end_us`` in the block layout).
ATTN_PHASE_COLUMNS = ["q_in_us", "blocks_end_us"]


def _by_opcode(df: pd.DataFrame):
    """``(name, rows)`` groups of ``df`` by opcode name, in pipeline order (the opcodes' numbers: QKV first, LM
    head last)."""
    return sorted(df.groupby("name"), key=lambda kv: OPCODES.get(kv[0], 99))


def decode_timeline(schedules: list[Schedule], stamps: list[torch.Tensor]) -> pd.DataFrame:
    """One row per executed task of one decode step.

    Args:
        schedules: the schedule of each launch of the step (one for ``fused``; one per stage for ``stages``).
        stamps: for each launch, the int64 (programs, max_tasks, 3) stamp buffer it wrote (any device).

    Returns:
        DataFrame with :data:`COLUMNS`: ``name`` (opcode), ``program``, ``layer``, ``task`` (global index in
        the step's topological order), ``tile`` (index within its (layer, opcode)), ``launch``; times in µs
        relative to the earliest start: ``ts_us``, ``ready_us``, ``end_us``, ``dur_us = end − ts``,
        ``wait_us = ready − ts``; with 5 stamps per task (Gluon), also :data:`LOAD_COLUMNS` and
        :data:`ATTN_COLUMNS`, with 7 also :data:`PHASE_COLUMNS` and :data:`ATTN_PHASE_COLUMNS`. Sorted by start
        time.
    """
    parts = []
    for launch, (sch, buf) in enumerate(zip(schedules, stamps)):
        table = sch.table.numpy()
        counts = sch.counts.numpy()
        ts = buf.detach().cpu().numpy().astype(np.int64)
        slots = np.arange(table.shape[1])[None, :] < counts[:, None]  # (P, T) occupied slots
        prog, slot = np.nonzero(slots)
        rows = table[prog, slot]
        cols = {"name": [OPCODE_NAMES[int(o)] for o in rows[:, F_OP]], "program": prog, "layer": rows[:, F_LAYER],
                "task": rows[:, F_GIDX], "tile": rows[:, F_TILE], "launch": launch,
                "t0": ts[prog, slot, 0], "t1": ts[prog, slot, 1], "t2": ts[prog, slot, 2]}
        if ts.shape[-1] >= 5:  # the Gluon kernel's producer: first and last weight-load issue (0: no weights)
            cols["t3"], cols["t4"] = ts[prog, slot, 3], ts[prog, slot, 4]
        if ts.shape[-1] >= 7:  # the Gluon kernel's task phases (weight tasks: staging, matvec; attention: q, blocks)
            cols["t5"], cols["t6"] = ts[prog, slot, 5], ts[prog, slot, 6]
        parts.append(pd.DataFrame(cols))
    df = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["t0", "t1", "t2"])
    origin = df["t0"].min() if len(df) else 0
    df["ts_us"] = (df["t0"] - origin) / 1e3
    df["ready_us"] = (df["t1"] - origin) / 1e3
    df["end_us"] = (df["t2"] - origin) / 1e3
    df["dur_us"] = df["end_us"] - df["ts_us"]
    df["wait_us"] = df["ready_us"] - df["ts_us"]
    extra = []
    if "t3" in df:  # a weight task's producer stamps, an attention task's phases; 0 (not written): NaN
        attn = (df["name"] == "ATTN").to_numpy()
        for col, t, mine in (("load_start_us", "t3", ~attn), ("load_end_us", "t4", ~attn),
                             ("math_end_us", "t3", attn), ("ticket_us", "t4", attn)):
            df[col] = np.where(mine & (df[t] > 0), (df[t] - origin) / 1e3, np.nan)
        extra = LOAD_COLUMNS + ATTN_COLUMNS
    if "t5" in df:
        attn = (df["name"] == "ATTN").to_numpy()
        for col, t, mine in (("staged_us", "t5", ~attn), ("mv_end_us", "t6", ~attn),
                             ("q_in_us", "t5", attn), ("blocks_end_us", "t6", attn)):
            df[col] = np.where(mine & (df[t] > 0), (df[t] - origin) / 1e3, np.nan)
        extra = extra + PHASE_COLUMNS + ATTN_PHASE_COLUMNS
    df = df.drop(columns=[c for c in ("t0", "t1", "t2", "t3", "t4", "t5", "t6") if c in df]).sort_values(
        ["ts_us", "program"], kind="stable")
    return df.reset_index(drop=True)[COLUMNS + extra]


def intrakernel_summary(df: pd.DataFrame, max_programs: int | None = 24,
                        task_bytes: dict[str, int] | None = None, slot_bytes: int | None = None) -> dict:
    """Summary of one step's timeline (from :func:`decode_timeline`).

    Returns a dict: ``producer_lead_us_p50`` (Gluon: median µs between a task's first weight-tile issue and
    its consumer's start; None for the Triton kernel), ``wait_ratio`` (Σ wait / Σ (end − start)), ``programs`` (distinct programs that ran
    tasks), ``tasks_per_step``, ``span_us`` (first start to last end), ``by_opcode`` — a list of
    {opcode, tasks, busy_us (Σ end − ready), wait_us (Σ ready − start)} in pipeline order —, ``edges``
    (:func:`edge_summary`: per dependency edge the median µs from the last upstream task's end to the first
    consumer's start, and the consumer stage's span), ``attn_phases`` (:func:`attn_phases`), ``attn_critical``
    (:func:`attn_critical`), ``task_phases`` (:func:`task_phases`), and ``tasks``:
    [{program, opcode, layer, start_us, ready_us, end_us}] in start order (times in µs, 3 decimals).
    The statistics use every task; ``tasks`` lists only ``max_programs`` programs evenly spaced over the
    grid (Llama-3.2-1B runs ~75,000 tasks per step: all of them would make a 16 MB results file),
    named in ``tasks_programs``; ``None`` keeps all. ``stream_feed``: with ``task_bytes`` (bytes per task by
    opcode, ``schedule.task_weight_bytes``; ``slot_bytes`` the ring slot's bytes, :data:`RING_SLOT_BYTES` if None)
    and a frame :func:`stream_feed` finds layers in (the Gluon kernel),
    ``{"median": {column: median over layers}, "per_layer": [row]}`` of its columns (µs, GB/s; 3 decimals, NaN as
    None); otherwise None.
    """
    total = float(df["dur_us"].sum())
    programs = sorted(int(p) for p in df["program"].unique())
    if max_programs is not None and len(programs) > max_programs:
        picks = np.unique(np.linspace(0, len(programs) - 1, max(max_programs, 1)).round().astype(int))
        programs = [programs[k] for k in picks]
    shown = programs
    by = []
    for name, g in _by_opcode(df):
        by.append({"opcode": name, "tasks": int(len(g)), "busy_us": float((g["end_us"] - g["ready_us"]).sum()),
                   "wait_us": float(g["wait_us"].sum())})
    lead = (df["ts_us"] - df["load_start_us"]).dropna() if "load_start_us" in df else None
    return {
        # Gluon only: how far ahead of the consumer's task start the producer issued its first weight tile
        "producer_lead_us_p50": float(lead.median()) if lead is not None and len(lead) else None,
        "wait_ratio": float(df["wait_us"].sum()) / total if total > 0 else 0.0,
        "programs": int(df["program"].nunique()),
        "tasks_per_step": int(len(df)),
        "span_us": float(df["end_us"].max() - df["ts_us"].min()) if len(df) else 0.0,
        "by_opcode": by,
        "edges": edge_summary(stage_edges(df)),
        "attn_phases": attn_phases(df),
        "attn_critical": attn_critical(df),
        "task_phases": task_phases(df),
        "stream_feed": _stream_feed_summary(df, task_bytes, slot_bytes or RING_SLOT_BYTES),
        "tasks_programs": shown,
        "tasks": [{"program": int(r.program), "opcode": r.name, "layer": int(r.layer),
                   "start_us": round(float(r.ts_us), 3), "ready_us": round(float(r.ready_us), 3),
                   "end_us": round(float(r.end_us), 3)}
                  for r in df[df["program"].isin(shown)].itertuples(index=False)],
    }


# The Gluon kernel's usual weight ring slot (one 16 KB box); the engine knows its own (MegakernelEngine.
# ring_slot_bytes: two boxes per slot on Qwen2.5-0.5B's tensor-core matvec, 8 KB with 16-row fp32 tiles)
RING_SLOT_BYTES = 16384
STREAM_FEED_COLUMNS = ["layer", "chain_us", "chain_GBps", "mlp_us", "mlp_GBps", "layer_GBps",
                       "qkv_mv_after_last_issue_us"]


def _slot_issues(w: pd.DataFrame, task_bytes: dict[str, int], slot_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Issue times (µs) and bytes of every ring slot of the weight tasks ``w``: a task's bytes in
    ``max(1, ceil(bytes / slot_bytes))`` equal slots (the producer's slots per task: a task's last slot may be
    part-filled) at evenly spaced times from its first to its last issue, the same points as
    ``np.linspace(load_start_us, load_end_us, n)`` (its arithmetic, vectorised over the tasks)."""
    nbytes = w["name"].map(task_bytes).to_numpy(float)
    n = np.maximum(1, np.ceil(nbytes / slot_bytes).astype(np.int64))
    task = np.repeat(np.arange(len(w)), n)
    k = np.arange(len(task)) - np.repeat(np.cumsum(n) - n, n)  # slot index within its task
    s0, e0 = w["load_start_us"].to_numpy(float)[task], w["load_end_us"].to_numpy(float)[task]
    step = (e0 - s0) / np.maximum(n[task] - 1, 1)
    t = k * step + s0
    last = (k == n[task] - 1) & (n[task] > 1)
    t[last] = e0[last]  # linspace puts the last point exactly on the stop
    return t, (nbytes / n)[task]


def stream_feed(df: pd.DataFrame, task_bytes: dict[str, int], slot_bytes: int = RING_SLOT_BYTES) -> pd.DataFrame:
    """The rate the Gluon kernel's weight stream is fed, per decoder layer: bytes of weight tiles its producer
    warps issue per µs over all SMs, over the QKV → attention → O-proj chain and over the MLP.

    A producer reissues a ring slot only once its consumer has freed it, so while the consumers wait on the
    dependency chain the stream idles: on Llama-3.2-1B it was fed at 1.7 TB/s over the chain against ~4.0 over the
    rest of the layer (``benchmarks/chain_breakdown.py`` on the frames of
    ``benchmarks/results/h200-2026-12-02-s14/chain_lt8_llama-3.2-1b_default_df52673.json``; this is that script's
    analysis, moved into the product). Rule: each weight task's bytes are spread
    evenly over its ring slots of ``slot_bytes`` (``max(1, ceil(bytes / slot_bytes))`` of them), issued at evenly
    spaced times from its
    ``load_start_us`` to its ``load_end_us`` (``np.linspace``), and a slot counts in the window ``[lo, hi)`` that
    holds its issue time. For each layer L ≥ 1 whose layer L − 1 is in the frame: ``chain`` runs from layer
    L − 1's last DOWN task end to layer L's last OPROJ task end, ``mlp`` from there to layer L's last DOWN task end.

    Args:
        df: one step's :func:`decode_timeline` frame; uses ``name``, ``layer``, ``end_us``, :data:`LOAD_COLUMNS`
            and, where present, ``mv_end_us``.
        task_bytes: bytes of weights one task of each opcode streams (``schedule.task_weight_bytes``); tasks of
            other opcodes, and tasks without both load stamps, issue nothing.
        slot_bytes: bytes of one ring slot of the kernel that ran (``MegakernelEngine.ring_slot_bytes``: 16 KB for
            one 16-bit box of 32 rows × 256 columns, 32 KB with two boxes per slot).

    Returns:
        One row per layer, :data:`STREAM_FEED_COLUMNS`: ``layer`` (int), ``chain_us`` / ``mlp_us`` (window lengths,
        µs), ``chain_GBps`` / ``mlp_GBps`` / ``layer_GBps`` (bytes issued in the window / its length, GB/s =
        bytes / µs / 1e3; NaN for a window of length ≤ 0), ``qkv_mv_after_last_issue_us`` (median over the layer's
        QKV tasks of ``mv_end_us − load_end_us``: how long the matvec ran on after its last tile was issued; NaN
        without ``mv_end_us``). Empty (same columns) for a frame without :data:`LOAD_COLUMNS` (the Triton kernel),
        without stamped weight tasks, or without two consecutive layers that both have DOWN and OPROJ tasks. Never
        raises on such frames.
    """
    empty = pd.DataFrame({c: pd.Series(dtype="int64" if c == "layer" else "float64") for c in STREAM_FEED_COLUMNS})
    if not set(LOAD_COLUMNS + ["name", "layer", "end_us"]) <= set(df.columns):
        return empty
    w = df[df["name"].isin(list(task_bytes))].dropna(subset=LOAD_COLUMNS)
    stages = df[df["name"].isin(["OPROJ", "DOWN"])].groupby(["layer", "name"])["end_us"].max().unstack()
    if not len(w) or not {"OPROJ", "DOWN"} <= set(stages.columns):
        return empty
    ends = stages[["OPROJ", "DOWN"]].dropna()
    t, b = _slot_issues(w, task_bytes, slot_bytes)

    def rate(lo: float, hi: float) -> float:  # bytes / µs / 1e3 = GB/s
        return float(b[(t >= lo) & (t < hi)].sum() / (hi - lo) / 1e3) if hi > lo else float("nan")

    rows = []
    for layer in ends.index:
        if layer - 1 not in ends.index:
            continue
        lo = float(ends.loc[layer - 1, "DOWN"])
        mid, hi = float(ends.loc[layer, "OPROJ"]), float(ends.loc[layer, "DOWN"])
        q = w[(w["layer"] == layer) & (w["name"] == "QKV")]
        after = (q["mv_end_us"] - q["load_end_us"]).median() if "mv_end_us" in q else float("nan")
        rows.append({"layer": int(layer), "chain_us": mid - lo, "chain_GBps": rate(lo, mid), "mlp_us": hi - mid,
                     "mlp_GBps": rate(mid, hi), "layer_GBps": rate(lo, hi),
                     "qkv_mv_after_last_issue_us": float(after)})
    return pd.DataFrame(rows, columns=STREAM_FEED_COLUMNS) if rows else empty


def _stream_feed_summary(df: pd.DataFrame, task_bytes: dict[str, int] | None, slot_bytes: int) -> dict | None:
    """:func:`stream_feed` for the results: medians over layers and the per-layer rows, 3 decimals, NaN as None
    (the results are strict JSON); None without ``task_bytes`` or without rows."""
    feed = stream_feed(df, task_bytes, slot_bytes) if task_bytes else None
    if feed is None or not len(feed):
        return None

    def clean(v: float) -> float | None:
        return None if pd.isna(v) else round(float(v), 3)

    med = feed.drop(columns=["layer"]).median()
    return {"median": {k: clean(v) for k, v in med.items()},
            "per_layer": [{"layer": int(r["layer"]), **{k: clean(r[k]) for k in STREAM_FEED_COLUMNS[1:]}}
                          for r in feed.to_dict(orient="records")]}


def stage_edges(df: pd.DataFrame) -> pd.DataFrame:
    """The step's dependency chain, one row per (layer, opcode) stage in pipeline order.

    Each stage waits on the stage before it (QKV on the previous layer's DOWN, ATTN on QKV, OPROJ on ATTN, GATEUP
    on OPROJ, DOWN on GATEUP, LMHEAD on the last DOWN). Columns: ``layer``, ``opcode``, ``edge`` ("ATTN→OPROJ"),
    ``tasks``; times in µs from :func:`decode_timeline`'s origin: ``first_ready_us`` (the first of its tasks whose
    dependency was met), ``last_end_us`` (its last task's end, after the signal); ``hop_us`` = first_ready −
    the upstream stage's last_end: how long after the last upstream task signalled the first consumer could start
    (the signal's round trip plus the poll; negative where a task waits on part of the upstream stage, e.g. an
    attention task on its own kv head's QKV tiles); ``span_us`` = last_end − first_ready. The first stage has
    ``hop_us`` NaN. A layer's critical path is the sum of its hops and spans.
    """
    cols = ["layer", "opcode", "edge", "tasks", "first_ready_us", "last_end_us", "hop_us", "span_us"]
    if not len(df):
        return pd.DataFrame(columns=cols)
    g = df.groupby(["layer", "name"], sort=False).agg(tasks=("ready_us", "size"), first_ready_us=("ready_us", "min"),
                                                      last_end_us=("end_us", "max")).reset_index()
    g = g.rename(columns={"name": "opcode"})
    g["_rank"] = g["opcode"].map(OPCODES)
    g = g.sort_values(["layer", "_rank"], kind="stable").reset_index(drop=True)
    prev_end = g["last_end_us"].shift(1)
    g["edge"] = g["opcode"].shift(1).fillna("") + "→" + g["opcode"]
    g.loc[0, "edge"] = g.loc[0, "opcode"]
    g["hop_us"] = g["first_ready_us"] - prev_end
    g["span_us"] = g["last_end_us"] - g["first_ready_us"]
    return g[cols]


def edge_summary(edges: pd.DataFrame) -> list[dict]:
    """Per edge name of :func:`stage_edges` (over the layers): ``edge``, ``stages``, ``hop_us_p50``,
    ``hop_us_max``, ``span_us_p50`` (the consumer stage's first-ready → last-end), in pipeline order."""
    out = []
    for edge, g in edges.dropna(subset=["hop_us"]).groupby("edge", sort=False):
        out.append({"edge": edge, "stages": int(len(g)), "hop_us_p50": float(g["hop_us"].median()),
                    "hop_us_max": float(g["hop_us"].max()), "span_us_p50": float(g["span_us"].median())})
    return out


def attn_phases(df: pd.DataFrame) -> dict | None:
    """Where an attention task's time after its wait goes (Gluon kernel, :data:`ATTN_COLUMNS`), µs over the
    tasks that ran: ``math_us`` (ready → math done: q and the new K/V's round trip plus the blocks' math),
    ``ticket_us`` (math done → ticket drawn: partial stores, fence, the ticket's round trip) and ``combine_us``
    (ticket → end: for the last ticket holder of each kv head the combine and its signal), each as
    ``{"p50": …, "max": …}``; with :data:`ATTN_PHASE_COLUMNS` also math_us's parts ``q_us`` (ready → q in
    registers), ``blocks_us`` (→ the block loop done) and ``warps_us`` (→ math done: the cross-warp combine of the
    warp-local layout, 0 in the block and tensor-core layouts). None without those stamps."""
    if "math_end_us" not in df:
        return None
    a = df.dropna(subset=ATTN_COLUMNS)
    if not len(a):
        return None
    parts = {"math_us": a["math_end_us"] - a["ready_us"], "ticket_us": a["ticket_us"] - a["math_end_us"],
             "combine_us": a["end_us"] - a["ticket_us"]}
    if set(ATTN_PHASE_COLUMNS) <= set(a.columns) and a[ATTN_PHASE_COLUMNS].notna().all(axis=None):
        parts.update(q_us=a["q_in_us"] - a["ready_us"], blocks_us=a["blocks_end_us"] - a["q_in_us"],
                     warps_us=a["math_end_us"] - a["blocks_end_us"])
    return {k: {"p50": float(v.median()), "max": float(v.max())} for k, v in parts.items()}


def attn_critical(df: pd.DataFrame) -> dict | None:
    """The attention task that ends each layer's attention stage (the last to end: the combiner whose signal the
    O-proj tasks wait for), taken apart (Gluon kernel, :data:`ATTN_COLUMNS` and :data:`ATTN_PHASE_COLUMNS`): per
    phase the median over layers, µs — ``after_qkv_us`` (the layer's last QKV end → its ready: the signal, the poll
    and whatever the CTA ran before it), ``q_us`` (ready → q in registers, with the K/V block loaded after the wait
    when it holds the new position), ``blocks_us`` (→ math done), ``ticket_us`` (→ ticket drawn) and ``combine_us``
    (→ end: the combine and the signal); ``total_us`` is the sum: the attention's share of the layer's chain.
    Its ``combine_us`` was the largest part on Llama-3.2-1B (2.9 of 6.7 µs,
    ``benchmarks/results/h200-2026-12-02-s10/timeline_llama-3.2-1b.json``). None without
    those stamps."""
    cols = ATTN_COLUMNS + ATTN_PHASE_COLUMNS
    if not set(cols) <= set(df.columns):
        return None
    a = df[df["name"] == "ATTN"].dropna(subset=cols)
    if not len(a):
        return None
    crit = a.loc[a.groupby("layer")["end_us"].idxmax()].set_index("layer")
    qkv_end = df[df["name"] == "QKV"].groupby("layer")["end_us"].max()
    parts = pd.DataFrame({"after_qkv_us": crit["ready_us"] - qkv_end.reindex(crit.index),
                          "q_us": crit["q_in_us"] - crit["ready_us"],
                          "blocks_us": crit["math_end_us"] - crit["q_in_us"],
                          "ticket_us": crit["ticket_us"] - crit["math_end_us"],
                          "combine_us": crit["end_us"] - crit["ticket_us"]})
    med = {k: float(v) for k, v in parts.median().items() if not np.isnan(v)}
    med["total_us"] = float(parts.sum(axis=1, min_count=1).median())
    return {**med, "layers": int(len(parts))}


def task_phases(df: pd.DataFrame) -> list[dict] | None:
    """Where a weight task's time after its dependency wait goes (Gluon kernel, :data:`PHASE_COLUMNS`), per opcode,
    µs over its tasks: ``stage_us`` (ready → input staged: the input vector's L2 round trip, plus RMSNorm where the
    stage normalises; 0 when the CTA's previous task of the same stage staged it), ``mv_us`` (staged → last ring
    slot consumed: the matvec, and waiting for weight tiles still in flight), ``epilogue_us`` (→ end: RoPE /
    SwiGLU / residual / greedy key, the stores and, for a CTA's last task of a stage, the release and the signal).
    A list of ``{"opcode", "tasks", "stage_us_p50", "mv_us_p50", "epilogue_us_p50", "epilogue_us_max"}`` in
    pipeline order; None without those stamps."""
    if "staged_us" not in df:
        return None
    w = df.dropna(subset=PHASE_COLUMNS)
    if not len(w):
        return None
    out = []
    for name, g in _by_opcode(w):
        epi = g["end_us"] - g["mv_end_us"]
        out.append({"opcode": name, "tasks": int(len(g)),
                    "stage_us_p50": float((g["staged_us"] - g["ready_us"]).median()),
                    "mv_us_p50": float((g["mv_end_us"] - g["staged_us"]).median()),
                    "epilogue_us_p50": float(epi.median()), "epilogue_us_max": float(epi.max())})
    return out


def chrome_events(df: pd.DataFrame, ts_offset_us: float = 0.0, pid: str = "megakernel (intra-kernel)") -> list[dict]:
    """Chrome-trace complete events (``ph: "X"``), one ``tid`` per program, to show beside CUPTI kernels.

    ``ts_offset_us`` places the step on the trace's clock (e.g. the CUPTI kernel's ``ts``). Each event's
    ``args`` hold layer, task, tile and the wait (µs) before its dependencies were met. With the Gluon
    kernel's :data:`LOAD_COLUMNS`, each task with weights also gets a ``load <opcode>`` event under the process
    ``<pid> producer`` (same ``tid``): from its first to its last weight-tile issue, so Perfetto shows the
    weight stream running ahead of the compute beside it.
    """
    events = [{"name": r.name, "cat": "megakernel_task", "ph": "X", "ts": ts_offset_us + float(r.ts_us),
               "dur": float(r.dur_us), "pid": pid, "tid": int(r.program),
               "args": {"layer": int(r.layer), "task": int(r.task), "tile": int(r.tile), "wait_us": float(r.wait_us)}}
              for r in df.itertuples(index=False)]
    if "load_start_us" in df:
        loads = df.dropna(subset=LOAD_COLUMNS)
        events += [{"name": f"load {r.name}", "cat": "megakernel_load", "ph": "X",
                    "ts": ts_offset_us + float(r.load_start_us), "dur": max(0.0, float(r.load_end_us - r.load_start_us)),
                    "pid": f"{pid} producer", "tid": int(r.program),
                    "args": {"layer": int(r.layer), "task": int(r.task),
                             "lead_us": float(r.ts_us - r.load_start_us)}}
                   for r in loads.itertuples(index=False)]
    return events
