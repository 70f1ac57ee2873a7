"""``diagnose trace`` over one trace per rank: the per-file summaries plus a JSON-ready multi-rank section.

The result is the ``bubblescope.trace/1`` dict of :func:`~.summary.summarize_traces`
with one more key, ``ranks`` (None when the files are not one trace per rank of one job)::

    {"ranks": {"world_size": int, "missing_ranks": [int] | None, "step_marker": str, "skip_steps": int,
               "steps": int,
               "per_rank": [{rank, path, device, steps, kernels, busy_us, span_us, bubble_ratio, nccl_us,
                             nccl_share, compute_us_per_step, nccl_us_per_step, slowest_steps}],
               "per_step": [{step, ranks, start_skew_us, end_skew_us, first_start_rank, last_start_rank,
                             last_end_rank, slowest_rank, slowest_compute_us, fastest_compute_us,
                             compute_skew_us, span_us, nccl_share_max, nccl_share_min}],
               "rank_steps": [{rank, step, device, start_us, end_us, span_us, busy_us, compute_us, nccl_us,
                               nccl_share, kernels, nccl_kernels, wall_us, index, number}],
               "median": {start_skew_us, end_skew_us, compute_skew_us, nccl_share},
               "warnings": [str]}}

Definitions are :mod:`.ranks`'s; ``world_size`` counts the traces given, ``missing_ranks`` lists the ranks of the
job (``distributedInfo.world_size``) that none of them is for (:func:`missing_ranks`). Each file is parsed once. Times (``start_us``/``end_us``) are the files' µs, or,
where a file's integer ``ts`` exceed 2^53 µs, µs from the smallest origin of the ranks' rebased times
(:func:`~.arrays.common_origin`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from ...errors import BubblescopeError
from ...wording import count, plural
from . import metrics
from .arrays import TraceArrays, common_origin
from .frames import Trace
from .summary import AUTO_STEP_MARKERS, SCHEMA, iter_traces, summarize_trace
from .timeline import check_skip_steps
from .values import json_float, parse_rank


def is_multirank(traces: list[Trace] | list[TraceArrays]) -> bool:
    """True when there are at least two traces and each names a different ``distributedInfo.rank``."""
    return _distinct_ranks([t.rank for t in traces])


def _distinct_ranks(found: list) -> bool:
    return len(found) > 1 and None not in found and len(set(found)) == len(found)


def _records(frame) -> list[dict]:
    import numpy as np

    out = []
    for row in frame.to_dict("records"):
        out.append({k: (None if v is None or (isinstance(v, float) and not np.isfinite(v)) else
                        int(v) if isinstance(v, (np.integer, bool, np.bool_)) or (k.endswith("rank") or k == "number")
                        and v == v
                        else float(v) if isinstance(v, (float, np.floating)) else v) for k, v in row.items()})
    return out


def multirank_section(traces: list[Trace], step_marker: str, skip_steps: int = 0,
                      threshold_us: float = metrics.DEFAULT_IDLE_THRESHOLD_US) -> dict:
    """The ``ranks`` dict of the module doc for already parsed per-rank traces.

    Raises:
        BubblescopeError: two traces with the same rank, a bad threshold or skip count.
    """
    from . import ranks  # pandas: only for a multi-rank job

    skip_steps = check_skip_steps(skip_steps)
    steps = ranks.rank_steps(traces, step_marker, skip_steps, threshold_us)
    per_step = ranks.cross_rank_steps(steps)
    per_rank = ranks.rank_summary(traces, steps, threshold_us)
    own = [ranks.one_rank_steps(t, r, step_marker, threshold_us) for r, t in zip(ranks.rank_ids(traces), traces)]
    warnings = _matching_notes(own, steps, step_marker, skip_steps)
    missing, note = missing_ranks(traces)
    if note:
        warnings.insert(0, note)
    median = {c: json_float(per_step[c].median()) if len(per_step) else None
              for c in ("start_skew_us", "end_skew_us", "compute_skew_us")}
    median["nccl_share"] = json_float(steps["nccl_share"].median()) if len(steps) else None
    return {"world_size": len(traces), "missing_ranks": missing, "step_marker": step_marker, "skip_steps": skip_steps,
            "steps": int(len(per_step)), "per_rank": _records(per_rank), "per_step": _records(per_step),
            "rank_steps": _records(steps), "median": median, "warnings": warnings}


def _matching_notes(own: list, steps, marker: str, skip_steps: int) -> list[str]:
    """Warnings on how the ranks' steps were matched (:func:`~.ranks.rank_steps`), given each rank's own steps
    (:func:`~.ranks.one_rank_steps`): by number, when the ranks start or end at different step numbers (which
    steps were compared); by position, when the ranks recorded different numbers of steps."""
    from . import ranks

    kept = [f[f["index"] >= skip_steps] for f in own]
    compared = int(steps["step"].max()) + 1 if len(steps) else 0
    if ranks.matched_by(kept) == "number":
        spans = {int(f["rank"].iloc[0]): (int(f["number"].min()), int(f["number"].max())) for f in kept if len(f)}
        if len(set(spans.values())) <= 1:
            return []
        each = ", ".join(f"rank {r}: #{a} to #{b}" for r, (a, b) in sorted(spans.items()))
        numbers = steps["number"].dropna().astype(int)
        which = f"#{numbers.min()} to #{numbers.max()}" if len(numbers) else "none"
        return [f"the ranks' traces hold different steps ({each}{' after warm-up' if skip_steps else ''}); "
                f"steps were matched by their number ({marker}#N), not their position: compared "
                f"{count(compared, 'step')} present on every rank, {which}"]
    lengths = [len(f) for f in own]
    if len(set(lengths)) > 1:
        return [f"ranks recorded different numbers of steps ({', '.join(map(str, lengths))}); compared the first "
                f"{compared} after warm-up by position (the step names carry no #N to match them by)"]
    return []


# Missing ranks beyond this many are counted, not listed: a list that long says nothing a count does not, and a
# world size read from a file (10**12) must not make the list (or the set of range(world_size)) itself.
MAX_LISTED_MISSING = 4096


def missing_ranks(traces: list) -> tuple[list[int] | None, str | None]:
    """(ranks of the job that no trace is for, one warning line), from ``distributedInfo.world_size``: e.g.
    ranks 0, 1 and 3 given of a world size 4 -> ([2], "... rank 2 missing ..."). (None, None) when the traces
    do not agree on a world size or hold every rank; ([], line) when ranks are taken by position (no
    distributedInfo rank) and fewer traces than the world size are given, or when more than
    :data:`MAX_LISTED_MISSING` ranks are missing (counted in the line, not listed)."""
    sizes = {parse_rank((t.metadata.get("distributedInfo") or {}).get("world_size"))
             if isinstance(t.metadata.get("distributedInfo"), dict) else None for t in traces}
    if len(sizes) != 1 or None in sizes:
        return None, None
    world = sizes.pop()
    given = [t.rank for t in traces]
    if None in given:
        if world <= len(traces):
            return None, None
        return [], (f"{count(len(traces), 'trace')} of a job of world size {world}: {world - len(traces)} "
                    f"{plural(world - len(traces), 'rank is', 'ranks are')} missing; the cross-rank figures cover "
                    "only the traces given")
    inside = {r for r in given if r < world}
    if world - len(inside) > MAX_LISTED_MISSING:  # named by count, not listed: never range() of a huge world size
        return [], (f"ranks {', '.join(map(str, sorted(given)))} of world size {world} given: "
                    f"{world - len(inside):,} ranks missing; the cross-rank figures (skews, slowest rank) cover "
                    "only the ranks given")
    missing = sorted(set(range(world)) - inside)
    if not missing:
        return None, None
    listed = ", ".join(map(str, sorted(given)))
    gone = ", ".join(map(str, missing))
    return missing, (f"ranks {listed} of world size {world} given: {plural(len(missing), 'rank', 'ranks')} {gone} "
                     f"missing; the cross-rank figures (skews, slowest rank) cover only the ranks given")


def summarize_rank_traces(paths: Iterable[str | os.PathLike], step_marker: str | None = None,
                          threshold_us: float = metrics.DEFAULT_IDLE_THRESHOLD_US, skip_steps: int | None = None,
                          force: bool = False, keep_going: bool = False, progress=None) -> dict:
    """Per-file summaries (as ``summarize_traces``, with its ``keep_going`` and ``progress``) plus ``ranks``: the
    multi-rank section when the readable files are one trace per rank (:func:`is_multirank`, or ``force`` with
    ranks taken by position), else None. Only traces that name a rank (or all, with ``force``) stay in memory
    for the merge; the others are summarized and dropped, one at a time.

    Raises:
        BubblescopeError: a bad path or option, a bad file unless ``keep_going``; ``force`` with one trace, with
            one file given twice (two ranks of one trace), or with files of different step markers (without
            ``force`` such files get no ``ranks`` section).
    """
    threshold_us = metrics.check_threshold(threshold_us)
    skip_steps = None if skip_steps is None else check_skip_steps(skip_steps)  # None: each trace's record
    paths = list(paths)
    if force:  # ranks are taken by position: the same file twice would be two identical ranks
        first: dict[str, int] = {}
        for rank, path in enumerate(paths):
            seen = first.setdefault(os.path.realpath(path), rank)
            if seen != rank:
                same = (f"{os.fspath(path)} is given twice" if os.fspath(paths[seen]) == os.fspath(path)
                        else f"{os.fspath(paths[seen])} and {os.fspath(path)} are the same file")
                raise BubblescopeError(f"--ranks: {same} (ranks {seen} and {rank}); give one trace per rank")
    traces, files, unranked = [], [], 0
    for _path, trace, error in iter_traces(paths, keep_going, progress):
        if error is not None:
            files.append(error)
            continue
        files.append(summarize_trace(trace, step_marker, threshold_us, skip_steps))
        if force or (trace.rank is not None and not unranked):
            traces.append(trace)
        else:  # a trace without a rank: no automatic merge, so nothing needs to be kept
            unranked += 1
            traces.clear()
        del trace
    out = {"schema": SCHEMA, "files": files, "ranks": None}
    if force and len(traces) < 2:
        raise BubblescopeError("--ranks: needs one trace per rank (at least two files)")
    if not (force or (not unranked and is_multirank(traces))):
        return out
    files = [f for f in files if "error" not in f]
    markers = {f["step_marker"] for f in files}
    if len(markers) != 1 or None in markers:
        if not force:  # rank-tagged files without common steps: the per-file summaries are all there is
            return out
        if markers == {None}:  # nothing to share: say what was looked for and how to name another marker
            tried = (step_marker,) if step_marker is not None else AUTO_STEP_MARKERS
            raise BubblescopeError(f"--ranks: no trace has a step marker ({' or '.join(map(repr, tried))}); "
                                   "name the steps' record_function with --step-marker")
        found = "; ".join(f"{f['path']}: {repr(f['step_marker']) if f['step_marker'] else 'no step marker'}"
                          for f in files)
        raise BubblescopeError(f"--ranks: the traces do not share one step marker ({found})")
    # one time origin for all ranks (differs only where some traces' huge integer ts were rebased)
    common_origin(traces)
    # the cross-rank metrics work on pandas frames: built here, only for a multi-rank job
    out["ranks"] = multirank_section([t.to_trace() for t in traces], markers.pop(), skip_steps or 0, threshold_us)
    return out


def unmerged_ranks_note(summary: dict) -> str | None:
    """Why :func:`summarize_rank_traces` (without ``force``) reported readable files that name different
    ``distributedInfo`` ranks each alone: their step markers differ or are missing (the cross-rank metrics align
    steps). None when the files were merged, name fewer than two ranks, or repeat a rank."""
    if summary.get("ranks") is not None:
        return None
    files = [f for f in summary.get("files", []) if "error" not in f]
    ranks = [f.get("rank") for f in files]
    if not _distinct_ranks(ranks):  # the rule is_multirank applies to the traces
        return None
    markers = sorted({repr(f["step_marker"]) if f.get("step_marker") else "none" for f in files})
    names = [str(r) for r in sorted(ranks)]
    listed = ", ".join(names[:-1]) + " and " + names[-1]
    return (f"the files name ranks {listed} but not one shared step marker (found: "
            f"{', '.join(markers)}), so each is reported alone; name the steps' record_function with "
            "--step-marker to merge them")
