"""Multi-rank analysis: one parsed :class:`~.frames.Trace` per rank of a distributed
(tensor-parallel) decode, merged by step index. Pure functions returning DataFrames, no printing.

Per rank and step (:func:`rank_steps`): the step's GPU start/end on the rank's main device (first
activity start, last activity end of the kernels its step launched), busy_us (union, all streams),
nccl_us (union of the NCCL kernels: names containing ``nccl``, case-insensitive, as NCCL names every
device kernel ``ncclKernel_*`` / ``ncclDevKernel_*``), compute_us (union of the other activities) and
nccl_share = nccl_us / span_us (the share of the step's GPU extent spent inside communication kernels,
waiting for the other ranks included).

Across ranks (:func:`cross_rank_steps`), steps are matched by their number when every step range is named
``<marker>#<N>`` with N unique on its rank (``ProfilerStep#N``, ``bubblescope.decode_step#N``): two ranks whose
traces start at different steps (a profiler started a step later on one) compare step N with step N, not the
first step of each; otherwise by their position after ``skip_steps``. start_skew_us
and end_skew_us are max − min over ranks of the step's GPU start and end; the slowest rank is the one with
the most compute_us (in a tensor-parallel step the others wait for it inside their all-reduces, so its NCCL
time is the shortest). Skews compare timestamps of different processes: exact on one host (Kineto stamps
with the host clock), off by the clock offset between nodes otherwise.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ...errors import BubblescopeError
from .intervals import STATS, interval_stats, ratio
from .metrics import DEFAULT_IDLE_THRESHOLD_US, check_threshold, device_summary
from .steps import DEFAULT_STEP_MARKER, assign_steps, step_metrics

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from .frames import Trace

NCCL_PATTERN = "nccl"
STEP_COLUMNS = ["rank", "step", "device", "start_us", "end_us", "span_us", "busy_us", "compute_us", "nccl_us",
                "nccl_share", "kernels", "nccl_kernels", "wall_us", "index", "number"]
_STEP_NUMBER = re.compile(r"#(\d+)$")


def step_number(name: str) -> int | None:
    """N of a step range named ``<marker>#N`` (``ProfilerStep#12`` -> 12), else None."""
    m = _STEP_NUMBER.search(str(name))
    return int(m.group(1)) if m else None


def is_nccl(names: pd.Series) -> pd.Series:
    """Boolean Series: the activity name contains ``nccl`` (any case)."""
    return names.astype(str).str.contains(NCCL_PATTERN, case=False, regex=False)


def rank_ids(traces: list[Trace]) -> list[int]:
    """Each trace's rank: ``distributedInfo.rank`` when every trace has one, else the position in the list.

    Raises:
        BubblescopeError: two traces claim the same rank (one line naming both files).
    """
    if not traces:
        raise BubblescopeError("multi-rank summary: no traces given")
    if any(t.rank is None for t in traces):
        return list(range(len(traces)))
    seen: dict[int, str] = {}
    for t in traces:
        if t.rank in seen:
            raise BubblescopeError(f"{t.path}: rank {t.rank} again (also {seen[t.rank]}); give one trace per rank")
        seen[t.rank] = t.path
    return [t.rank for t in traces]


def _interval_stats(
    groups: np.ndarray, start: np.ndarray, end: np.ndarray, launch_ts: np.ndarray, threshold_us: float
) -> pd.DataFrame:
    """Union and idle split of intervals per group key (:func:`.intervals.interval_stats`); one row per
    key (index ``group``), columns ``intervals.STATS`` (µs)."""
    import pandas as pd

    if len(start) == 0:
        return pd.DataFrame(columns=list(STATS), dtype=float)
    keys, stats = interval_stats(groups, start, end, launch_ts, threshold_us)
    return pd.DataFrame(stats, index=pd.Index(keys, name="group"))


def _union_by_step(gpu: pd.DataFrame) -> pd.Series:
    """Union length (µs) of the activities in ``gpu`` per step (column ``step``)."""
    import pandas as pd

    if gpu.empty:
        return pd.Series(dtype=float)
    nan = gpu["ts_us"].to_numpy() * float("nan")
    stats = _interval_stats(gpu["step"].to_numpy(), gpu["ts_us"].to_numpy(), gpu["end_us"].to_numpy(), nan, 0.0)
    return stats["busy_us"]


def one_rank_steps(trace: Trace, rank: int, step_marker: str = DEFAULT_STEP_MARKER,
                   threshold_us: float = DEFAULT_IDLE_THRESHOLD_US) -> pd.DataFrame:
    """Per decode step of one rank's trace: the columns of ``STEP_COLUMNS`` (times in trace µs).

    ``step`` and ``index`` are the step's position in the trace (as :func:`~.steps.find_steps`
    numbers them, 0..), ``number`` the N of its name ``<marker>#N`` (:func:`step_number`; NaN without one).
    ``start_us``/``end_us`` are the first start / last end of the step's GPU activities on the main device
    (the one :func:`~.steps.step_metrics` reports); ``wall_us`` is the CPU step range.
    NaN where a step launched no GPU work.
    """
    import numpy as np
    import pandas as pd

    table = step_metrics(trace, step_marker, threshold_us)
    out = pd.DataFrame({"rank": np.full(len(table), rank, dtype=np.int64), "step": table["step"].to_numpy()})
    out["device"] = table["device"].to_numpy()
    step = assign_steps(trace, step_marker)
    keep = step.notna().to_numpy(dtype=bool).copy()
    device = table["device"].iloc[0] if len(table) else pd.NA
    if pd.isna(device):
        keep[:] = False
    else:
        keep &= (trace.gpu["device"] == device).to_numpy(dtype=bool, na_value=False)
    gpu = trace.gpu[keep].assign(step=step[keep].astype("int64"))
    nccl = is_nccl(gpu["name"]).to_numpy(dtype=bool)
    by = gpu.groupby("step")
    idx = out["step"]
    out["start_us"] = by["ts_us"].min().reindex(idx).to_numpy()
    out["end_us"] = by["end_us"].max().reindex(idx).to_numpy()
    out["span_us"] = out["end_us"] - out["start_us"]
    out["busy_us"] = table["gpu_busy_us"].to_numpy()
    out["compute_us"] = _union_by_step(gpu[~nccl]).reindex(idx, fill_value=0.0).to_numpy()
    out["nccl_us"] = _union_by_step(gpu[nccl]).reindex(idx, fill_value=0.0).to_numpy()
    out.loc[out["span_us"].isna(), ["compute_us", "nccl_us"]] = np.nan
    out["nccl_share"] = ratio(out["nccl_us"].to_numpy(), out["span_us"].fillna(0).to_numpy())
    kernels = gpu[gpu["kind"] == "kernel"]
    out["kernels"] = table["kernels"].to_numpy()
    out["nccl_kernels"] = kernels[is_nccl(kernels["name"]).to_numpy(dtype=bool)].groupby("step").size() \
        .reindex(idx, fill_value=0).to_numpy().astype(np.int64)
    out["wall_us"] = table["wall_us"].to_numpy()
    out["index"] = out["step"]
    out["number"] = np.array([step_number(n) for n in table["name"]], dtype=float)  # NaN: no number
    return out[STEP_COLUMNS]


def rank_steps(traces: list[Trace], step_marker: str = DEFAULT_STEP_MARKER, skip_steps: int = 0,
               threshold_us: float = DEFAULT_IDLE_THRESHOLD_US) -> pd.DataFrame:
    """:func:`one_rank_steps` of every trace, warm-up steps (the first ``skip_steps`` of each rank) dropped, and
    the steps every rank has matched up (:func:`matched_by`): by ``number`` when every step of every rank has a
    unique one (the steps whose number every rank has, in number order), else by position (the first as many as
    every rank has). ``step`` is the matched step, renumbered from 0; ``index`` stays the step's position in its
    own trace. Sorted by (step, rank).

    Raises:
        BubblescopeError: duplicate ranks (:func:`rank_ids`) or a bad threshold.
    """
    import pandas as pd

    threshold_us = check_threshold(threshold_us)
    frames = []
    for rank, trace in zip(rank_ids(traces), traces):
        f = one_rank_steps(trace, rank, step_marker, threshold_us)
        frames.append(f[f["index"] >= skip_steps])
    if matched_by(frames) == "number":
        common = sorted(set.intersection(*(set(f["number"].astype(int)) for f in frames)))
        at = {n: i for i, n in enumerate(common)}
        frames = [f[f["number"].isin(common)].assign(step=lambda d: d["number"].astype(int).map(at)) for f in frames]
    else:
        common = min(len(f) for f in frames)
        frames = [f.iloc[:common].assign(step=lambda d: d["index"] - skip_steps) for f in frames]
    out = pd.concat(frames, ignore_index=True)
    return out.sort_values(["step", "rank"], kind="stable", ignore_index=True)


def matched_by(frames: list[pd.DataFrame]) -> str:
    """``"number"`` when every step of every frame (:func:`one_rank_steps`) has a number and no rank repeats
    one, else ``"position"``: how :func:`rank_steps` matches the ranks' steps."""
    for f in frames:
        if f["number"].isna().any() or not f["number"].is_unique:
            return "position"
    return "number"


def cross_rank_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """One row per step of :func:`rank_steps`: step, ranks, start_skew_us, end_skew_us (max − min over
    ranks of start_us / end_us), first_start_rank, last_start_rank, last_end_rank, slowest_rank (most
    compute_us), slowest_compute_us, fastest_compute_us, compute_skew_us (their difference), span_us (first
    start to last end over ranks), nccl_share_max, nccl_share_min. Each ``*_rank`` is NaN (null in JSON) when
    two or more ranks tie for it (the same first start, the same most compute...): naming the first of them
    would single out a rank the trace does not. Steps without GPU work drop out."""
    import pandas as pd

    cols = ["step", "ranks", "start_skew_us", "end_skew_us", "first_start_rank", "last_start_rank", "last_end_rank",
            "slowest_rank", "slowest_compute_us", "fastest_compute_us", "compute_skew_us", "span_us",
            "nccl_share_max", "nccl_share_min"]
    s = steps.dropna(subset=["start_us"])
    if s.empty:
        return pd.DataFrame(columns=cols)
    by = s.groupby("step")

    def rank_at(col: str, which: str) -> pd.Series:
        # the rank with the step's least (which="min") or most ("max") ``col``; NaN on a tie, where idxmin /
        # idxmax would name the first of the tied ranks
        tied = (s[col] == by[col].transform(which)).groupby(s["step"]).sum() > 1
        at = s.loc[getattr(by[col], "idx" + which)(), ["step", "rank"]].set_index("step")["rank"]
        return at.astype(float).mask(tied)

    out = pd.DataFrame({"ranks": by["rank"].nunique()})
    out["start_skew_us"] = by["start_us"].max() - by["start_us"].min()
    out["end_skew_us"] = by["end_us"].max() - by["end_us"].min()
    out["first_start_rank"] = rank_at("start_us", "min")
    out["last_start_rank"] = rank_at("start_us", "max")
    out["last_end_rank"] = rank_at("end_us", "max")
    out["slowest_rank"] = rank_at("compute_us", "max")
    out["slowest_compute_us"] = by["compute_us"].max()
    out["fastest_compute_us"] = by["compute_us"].min()
    out["compute_skew_us"] = out["slowest_compute_us"] - out["fastest_compute_us"]
    out["span_us"] = by["end_us"].max() - by["start_us"].min()
    out["nccl_share_max"] = by["nccl_share"].max()
    out["nccl_share_min"] = by["nccl_share"].min()
    return out.rename_axis("step").reset_index()[cols]


def rank_summary(traces: list[Trace], steps: pd.DataFrame,
                 threshold_us: float = DEFAULT_IDLE_THRESHOLD_US) -> pd.DataFrame:
    """One row per rank over its decode window (first start to last end of its steps in ``steps``, the
    output of :func:`rank_steps`): rank, path, device, steps, kernels, busy_us, span_us, bubble_ratio
    (1 − busy/span of all the device's activity in the window), nccl_us, nccl_share (summed nccl_us over
    summed step span_us), compute_us_per_step and nccl_us_per_step (medians), slowest_steps (steps where
    this rank was the slowest)."""
    import numpy as np
    import pandas as pd

    slow = cross_rank_steps(steps)["slowest_rank"].value_counts()
    rows = []
    for rank, trace in zip(rank_ids(traces), traces):
        mine = steps[(steps["rank"] == rank) & steps["start_us"].notna()]
        row = {"rank": rank, "path": trace.path, "device": np.nan, "steps": len(mine), "kernels": 0,
               "busy_us": np.nan, "span_us": np.nan, "bubble_ratio": np.nan}
        if len(mine):
            device = int(mine["device"].iloc[0])
            window = (float(mine["start_us"].min()), float(mine["end_us"].max()))
            dev = device_summary(trace, window, threshold_us)
            dev = dev[dev["device"] == device].iloc[0]
            row.update(device=device, kernels=int(mine["kernels"].sum()), busy_us=float(dev["busy_us"]),
                       span_us=float(dev["span_us"]), bubble_ratio=float(dev["bubble_ratio"]))
        span = mine["span_us"].sum()
        row.update(nccl_us=float(mine["nccl_us"].sum()) if len(mine) else np.nan,
                   nccl_share=float(mine["nccl_us"].sum() / span) if span > 0 else np.nan,
                   compute_us_per_step=float(mine["compute_us"].median()) if len(mine) else np.nan,
                   nccl_us_per_step=float(mine["nccl_us"].median()) if len(mine) else np.nan,
                   slowest_steps=int(slow.get(rank, 0)))
        rows.append(row)
    return pd.DataFrame(rows)


def rank_activities(traces: list[Trace], steps: pd.DataFrame, step_marker: str = DEFAULT_STEP_MARKER,
                    max_steps: int = 3) -> pd.DataFrame:
    """The GPU activities of the first ``max_steps`` compared steps of every rank, on one time axis, for the
    ranks' timeline plot: rank, step (as in ``steps``, the output of :func:`rank_steps`), name, nccl (bool),
    start_us, end_us (µs from the earliest start of those steps over all ranks), sorted by (rank, start_us)."""
    import pandas as pd

    cols = ["rank", "step", "name", "nccl", "start_us", "end_us"]
    shown = steps[(steps["step"] < max_steps) & steps["start_us"].notna()]
    if shown.empty:
        return pd.DataFrame(columns=cols)
    frames = []
    for rank, trace in zip(rank_ids(traces), traces):
        mine = shown[shown["rank"] == rank]
        if mine.empty:
            continue
        # the steps of this trace (by their position in it) -> the compared step they are
        compared = steps[steps["rank"] == rank]
        step = assign_steps(trace, step_marker).map(dict(zip(compared["index"].tolist(), compared["step"].tolist())))
        keep = (step.isin(mine["step"].tolist()) & (trace.gpu["device"] == mine["device"].iloc[0])) \
            .to_numpy(dtype=bool, na_value=False)
        g = trace.gpu[keep]
        frames.append(pd.DataFrame({"rank": rank, "step": step[keep].astype("int64").to_numpy(),
                                    "name": g["name"].to_numpy(), "nccl": is_nccl(g["name"]).to_numpy(dtype=bool),
                                    "start_us": g["ts_us"].to_numpy(), "end_us": g["end_us"].to_numpy()}))
    out = pd.concat(frames, ignore_index=True)
    t0 = float(shown["start_us"].min())
    out["start_us"] -= t0
    out["end_us"] -= t0
    return out.sort_values(["rank", "start_us"], kind="stable", ignore_index=True)[cols]
