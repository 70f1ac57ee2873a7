"""Findings of ``diagnose trace``: rules that read a trace summary and say what limits the traced decode.

The input is the ``bubblescope.trace/1`` dict of
:func:`~bubblescope.profiler.trace.ranksummary.summarize_rank_traces` (per-file ``devices``, ``steps``, ``step_rows``
and the multi-rank ``ranks`` section). Each rule is a pure function of one file entry (or of the ``ranks``
section) returning findings; a rule stays silent when an input it needs is missing or null. Findings have the
shape of :mod:`.findings`' (``rule``, ``severity``, ``title``, ``evidence``, ``advice``), with ``file`` and
``rank`` in place of ``engine`` (both None for a cross-rank finding). Evidence numbers are copied from the
summary, or derived from it (a ratio, rounded to 4 decimals), so a reader can check them in the JSON. Times are
µs, as in the summary.

Thresholds live in :data:`TRACE_THRESHOLDS`: the launch-bound and bubble-bound entries are :mod:`.findings`'
own (one definition for a measured model and a trace); the others are this module's, each with its reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from statistics import median
from types import MappingProxyType

from .findings import SEVERITIES, THRESHOLDS, make_finding, merged_thresholds
from .tables import fmt
from .tables import us as us_words
from ..wording import count

_SHARED = ("launch_bound_min_bubble_ratio", "launch_bound_min_kernels_per_step",
           "bubble_bound_min_bubble_ratio", "bubble_bound_max_launches_per_step")

TRACE_THRESHOLDS: Mapping[str, float] = MappingProxyType({
    **{k: THRESHOLDS[k] for k in _SHARED},
    # a trace has no copy measurement to judge "done" by: a device-to-device copy reaches 88-89 % of the NVML peak on
    # an H100 and an H200 (2,992 of 3,352 and 4,245 of 4,814 GB/s, benchmarks/results/h100-2026-12-06-ladder and
    # h200-2026-12-06-ladder), so a step at 85 % of the peak is within a few percent of that ceiling.
    "near_limit_min_util_peak": 0.85,
    # host-synchronised steps: the host spends this share of the step blocked in synchronize calls, and the
    # GPU then waits on the host (host-wait idle) for at least this share of the step wall time.
    "host_sync_min_sync_share": 0.2,
    "host_sync_min_host_wait_share": 0.1,
    # kernel boundaries: gaps shorter than the idle threshold between kernels add up to this share of a step.
    "kernel_gaps_min_share": 0.1,
    # a GPU idle for the host over a whole trace without step figures: idle this share of the trace span (the
    # launch-bound bubble ratio), and the host-wait part at least this share of that idle time.
    "host_idle_min_bubble_ratio": THRESHOLDS["launch_bound_min_bubble_ratio"],
    "host_idle_min_host_wait_share": 0.5,
    # warm-up: leading steps at least this factor slower than the median step, with enough steps to tell.
    "warmup_min_slowdown": 1.5,
    "warmup_min_steps": 3,
    # multi-rank: NCCL kernels fill this share of a step's GPU span (median over steps and ranks).
    "nccl_heavy_min_share": 0.25,
    # multi-rank: the median start or compute skew across ranks is this share of the median step span.
    "rank_skew_min_share": 0.1,
    # bytes that do not fit the trace: the GPU busy for less than this share of the floor (bytes ÷ peak) per step
    # would have streamed above the peak, so the model (or --dtype) is not what the trace ran; judged only where a
    # step's bytes exceed the largest on-chip cache of the GPU table (AMD MI300X's 256 MB Infinity Cache, from its
    # datasheet; NVIDIA's largest L2, B200's, is 126 MB), since bytes served from a cache need not meet the
    # HBM floor.
    "bytes_mismatch_max_busy_over_floor": 1.0,
    "bytes_mismatch_min_bytes": 256e6,
})

# What a severity tells the reader of a trace's findings (the words of SEVERITIES, said of a traced run).
TRACE_SEVERITIES: Mapping[str, str] = MappingProxyType({
    **SEVERITIES, "problem": "limits the traced decode now (half of the step or more lost): act on it first"})

_GRAPHS = ('capture the decode step in a CUDA graph (torch.cuda.graph, or torch.compile(mode="reduce-overhead"), '
           "which captures it for you)")
_MEGAKERNEL = "a persistent megakernel that runs the whole step as one kernel (bubblescope's megakernel engine)"


def _file_finding(f: dict, rule: str, severity: str, title: str, evidence: dict, advice: str) -> dict:
    return make_finding(rule, severity, {"file": f.get("path"), "rank": f.get("rank")}, title, evidence, advice)


def _ratio(a, b) -> float | None:
    return round(a / b, 4) if a is not None and b else None


def _measured(f: dict) -> dict | None:
    """The file's decode-step figures when they were measured (steps found, GPU activity linked)."""
    steps = f.get("steps")
    return steps if steps and steps.get("available") else None


def _launch_bound(f: dict, t: Mapping[str, float]) -> list[dict]:
    s = _measured(f) or {}
    bubble, kernels, launches = s.get("bubble_ratio"), s.get("kernels_per_step"), s.get("launches_per_step")
    if bubble is None or kernels is None:
        return []
    if bubble < t["launch_bound_min_bubble_ratio"] or kernels < t["launch_bound_min_kernels_per_step"]:
        return []
    if launches is not None and launches <= t["bubble_bound_max_launches_per_step"]:
        return []  # the launches are amortised already: bubble-bound's case, not this one
    return [_file_finding(
        f, "launch-bound", "problem",
        f"Launch-bound: the GPU is idle {bubble:.0%} of the decode window across "
        f"{count(kernels, 'kernel', fmt='.0f')} per step",
        {"bubble_ratio": bubble, "kernels_per_step": kernels, "launches_per_step": launches,
         "launch_share": s.get("launch_share"), "host_wait_per_step_us": (s.get("idle") or {}).get("host_wait_us")},
        f"The host cannot queue kernels as fast as the GPU runs them: {_GRAPHS}, so one launch replaces "
        f"the {launches or kernels:g} of a step; or fuse kernels (torch.compile) down to {_MEGAKERNEL}.")]


def _bubble_bound(f: dict, t: Mapping[str, float]) -> list[dict]:
    s = _measured(f) or {}
    bubble, launches = s.get("bubble_ratio"), s.get("launches_per_step")
    if bubble is None or launches is None:
        return []
    if bubble < t["bubble_bound_min_bubble_ratio"] or launches > t["bubble_bound_max_launches_per_step"]:
        return []
    return [_file_finding(
        f, "bubble-bound", "problem" if bubble >= 0.5 else "warn",
        f"Bubble-bound: {count(launches, 'launch', 'launches', fmt='g')} per step, yet the GPU is idle "
        f"{bubble:.0%} of the decode window",
        {"bubble_ratio": bubble, "launches_per_step": launches, "kernels_per_step": s.get("kernels_per_step"),
         "host_wait_per_step_us": (s.get("idle") or {}).get("host_wait_us"),
         "kernel_wait_per_step_us": (s.get("idle") or {}).get("kernel_wait_us")},
        "Launch overhead is gone (a CUDA graph or a megakernel); the gaps are between kernels inside the step or "
        "between steps: fuse neighbouring kernels, and keep the host's per-token work (sampling, .item(), copies "
        "to the CPU) off the critical path so the next replay is queued before this one ends.")]


def _gpu_idle(f: dict, t: Mapping[str, float]) -> list[dict]:
    # The gap between launch-bound (100 kernels or more) and bubble-bound (2 launches or fewer): a GPU idle most
    # of the decode window across a few kernels is held by the host, whatever its launch count.
    s = _measured(f) or {}
    bubble, kernels, launches = s.get("bubble_ratio"), s.get("kernels_per_step"), s.get("launches_per_step")
    if bubble is None or kernels is None or bubble < t["launch_bound_min_bubble_ratio"]:
        return []
    if kernels >= t["launch_bound_min_kernels_per_step"]:
        return []  # launch-bound's case (or bubble-bound's, with its launches amortised)
    if launches is not None and launches <= t["bubble_bound_max_launches_per_step"]:
        return []  # bubble-bound's case
    if _host_sync(f, t):
        return []  # host-sync names the cause: each step waits for the GPU to drain
    idle = s.get("idle") or {}
    host, gaps = idle.get("host_wait_us"), idle.get("kernel_wait_us")
    rows = [r for r in f.get("step_rows") or [] if not r.get("warmup") and r.get("wall_us") is not None]
    slowest = max(rows, key=lambda r: r["wall_us"], default=None)
    parts = [f"{us_words(v)} {what}" for v, what in ((host, "waiting for the host"), (gaps, "in gaps between kernels"))
             if v is not None]
    return [_file_finding(
        f, "gpu-idle", "problem",
        f"GPU idle {bubble:.0%} of the decode window across {count(kernels, 'kernel', fmt='.0f')} per step"
        + (f": {', '.join(parts)} per step (mean)" if parts else ""),
        {"bubble_ratio": bubble, "kernels_per_step": kernels, "launches_per_step": launches,
         "host_wait_per_step_us": host, "kernel_wait_per_step_us": gaps,
         "slowest_step": slowest["step"] if slowest else None,
         "slowest_step_wall_us": slowest["wall_us"] if slowest else None},
        "The GPU waits for the host, not for its launches: look at the slowest step's CPU side (Python work, a "
        "sleep, data loading, .item() or other copies to the CPU) and keep it off the decode loop; with the host "
        f"out of the way, {_GRAPHS}.")]


def _host_sync(f: dict, t: Mapping[str, float]) -> list[dict]:
    s = _measured(f) or {}
    sync, wall, host_wait = s.get("sync_share"), s.get("step_wall_us"), (s.get("idle") or {}).get("host_wait_us")
    share = _ratio(host_wait, wall)
    if sync is None or share is None:
        return []
    if sync < t["host_sync_min_sync_share"] or share < t["host_sync_min_host_wait_share"]:
        return []
    return [_file_finding(
        f, "host-sync", "problem" if share >= 0.5 else "warn",
        f"Host-synchronised steps: the host spends {sync:.0%} of each step blocked in synchronize calls, and "
        f"the GPU then waits {share:.0%} of the step for its next launch",
        {"sync_share": sync, "host_wait_per_step_us": host_wait, "step_wall_us": wall, "host_wait_share": share},
        "Each step blocks the host until the GPU drains (.item(), .cpu(), .tolist(), torch.cuda.synchronize(), a "
        "blocking copy), so the next step is queued only after the GPU went idle: keep the sampled token on the "
        "GPU as the next step's input, copy it out with non_blocking=True into pinned memory and read it a step "
        "later, or capture sampling in the step's CUDA graph too.")]


def _kernel_gaps(f: dict, t: Mapping[str, float]) -> list[dict]:
    s = _measured(f) or {}
    idle = s.get("idle") or {}
    gaps, wall = idle.get("kernel_wait_us"), s.get("step_wall_us")
    share = _ratio(gaps, wall)
    if share is None or share < t["kernel_gaps_min_share"]:
        return []
    return [_file_finding(
        f, "kernel-gaps", "warn",
        f"Kernel boundaries: {gaps:,.1f} µs per step ({share:.0%} of it) in GPU gaps shorter than "
        f"{idle.get('threshold_us'):g} µs between kernels",
        {"kernel_wait_per_step_us": gaps, "step_wall_us": wall, "kernel_wait_share": share,
         "kernels_per_step": s.get("kernels_per_step"), "threshold_us": idle.get("threshold_us")},
        "Every kernel boundary drains and refills the GPU even when the launches are queued or graphed: fewer, "
        "larger kernels (torch.compile's fusion), programmatic dependent launch to overlap a kernel's start with "
        f"its predecessor's tail, or {_MEGAKERNEL}.")]


def _host_idle(f: dict, t: Mapping[str, float]) -> list[dict]:
    if _measured(f):
        return []  # the step rules speak for this file
    out = []
    for d in f.get("devices") or []:
        bubble, host = d.get("bubble_ratio"), (d.get("idle") or {}).get("host_wait_share")
        if bubble is None or host is None:
            continue
        if bubble < t["host_idle_min_bubble_ratio"] or host < t["host_idle_min_host_wait_share"]:
            continue
        out.append(_file_finding(
            f, "host-idle", "warn",
            f"GPU {d['device']} idle {bubble:.0%} of the trace, {host:.0%} of that waiting for the host's next "
            "launch (whole trace: no decode-step figures)",
            {"device": d["device"], "bubble_ratio": bubble, "host_wait_share": host, "busy_us": d.get("busy_us"),
             "span_us": d.get("span_us"), "kernels": d.get("kernels")},
            "The trace span may include setup and time between profiled steps: mark each decode step with "
            'torch.profiler.record_function("bubblescope.decode_step") (or profile with torch.profiler.schedule, '
            "whose ProfilerStep#N ranges are read too) for per-step figures. Within a step the cure for a GPU "
            f"waiting on the host is fewer launches and no host syncs: {_GRAPHS}."))
    return out


def _warmup(f: dict, t: Mapping[str, float]) -> list[dict]:
    rows = [r for r in f.get("step_rows") or [] if r.get("wall_us") is not None]
    if len(rows) < t["warmup_min_steps"]:
        return []
    middle = median(r["wall_us"] for r in rows)
    lead = 0
    while lead < len(rows) and rows[lead]["wall_us"] >= t["warmup_min_slowdown"] * middle:
        lead += 1
    rest = [r["wall_us"] for r in rows[lead:]]
    # silent without a slow lead, when the slow lead is already left out (--skip-steps), or when there is no
    # "rest" of at least two steps (of some duration) to compare with
    if not lead or rows[lead - 1].get("warmup") or len(rest) < 2 or not median(rest):
        return []
    slowest, typical = max(r["wall_us"] for r in rows[:lead]), median(rest)
    skipped = sum(1 for r in rows if r.get("warmup"))
    return [_file_finding(
        f, "warm-up", "warn",
        ("Warm-up: the first step took " if lead == 1 else f"Warm-up: the first {lead} steps took up to ")
        + f"{slowest / 1e3:,.2f} ms, {slowest / typical:.1f}x the median of the rest ({typical / 1e3:,.2f} ms), "
        + f"and {'is' if lead == 1 else 'are'} counted in the step figures",
        {"slow_steps": lead, "skipped_steps": skipped, "warmup_wall_us": slowest, "median_step_wall_us": typical,
         "warmup_over_median": _ratio(slowest, typical)},
        f"Leave {'it' if lead == 1 else 'them'} out with --skip-steps {lead} (or profile with "
        "torch.profiler.schedule(wait=..., warmup=..., active=...)) so one-time work — CUDA-graph capture, "
        "torch.compile and Triton autotuning, cuBLAS heuristics, allocator growth — does not read as decode time.")]


def _ranks_finding(rule: str, severity: str, title: str, evidence: dict, advice: str) -> dict:
    return make_finding(rule, severity, {"file": None, "rank": None}, title, evidence, advice)


def _nccl_heavy(r: dict, t: Mapping[str, float]) -> list[dict]:
    share = (r.get("median") or {}).get("nccl_share")
    if share is None or share < t["nccl_heavy_min_share"]:
        return []
    per_rank = [p["nccl_us_per_step"] for p in r.get("per_rank") or [] if p.get("nccl_us_per_step") is not None]
    return [_ranks_finding(
        "nccl-heavy", "problem" if share >= 0.5 else "warn",
        f"Communication-heavy: NCCL kernels fill {share:.0%} of a step's GPU span (median over steps and ranks "
        f"of {r.get('world_size')})",
        {"nccl_share": share, "world_size": r.get("world_size"),
         "nccl_per_step_min_us": min(per_rank, default=None), "nccl_per_step_max_us": max(per_rank, default=None),
         "compute_skew_us": (r.get("median") or {}).get("compute_skew_us")},
        "NCCL time includes waiting for the slowest rank (see rank-skew): the least of the ranks is the "
        "collectives' own cost. Then: fewer, larger collectives (one all-reduce per layer, fused with the next "
        "norm), a one-shot all-reduce for batch-1's small messages (NCCL_PROTO=LL, or vLLM-style custom "
        "all-reduce), overlap of communication with the next layer's weight loads, or fewer ranks.")]


def _rank_skew(r: dict, t: Mapping[str, float]) -> list[dict]:
    m = r.get("median") or {}
    spans = [s["span_us"] for s in r.get("per_step") or [] if s.get("span_us") is not None]
    span = median(spans) if spans else None
    start, compute = m.get("start_skew_us"), m.get("compute_skew_us")
    start_share, compute_share = _ratio(start, span), _ratio(compute, span)
    hits = [(w, v) for w, v in (("start", start_share), ("compute", compute_share))
            if v is not None and v >= t["rank_skew_min_share"]]
    if not hits:
        return []
    slowest = max(r.get("per_rank") or [], key=lambda p: p.get("slowest_steps") or 0, default=None)
    what = " and ".join(f"{w} skew {v:.0%}" for w, v in hits)
    tail = (f"; rank {slowest['rank']} was the slowest in {slowest['slowest_steps']} of {count(r.get('steps'), 'step')}"
            if slowest and slowest.get("slowest_steps") else "")
    return [_ranks_finding(
        "rank-skew", "warn",
        f"Rank imbalance: median {what} of the step's span across {r.get('world_size')} ranks{tail}",
        {"start_skew_us": start, "compute_skew_us": compute, "step_span_us": span, "start_skew_share": start_share,
         "compute_skew_share": compute_share, "slowest_rank": slowest["rank"] if slowest else None,
         "slowest_steps": slowest.get("slowest_steps") if slowest else None},
        "The other ranks wait for the slowest one inside their all-reduces. A start skew comes from the hosts: "
        "one rank launches later (pin each rank to its NUMA node's cores, remove per-rank host work; a CUDA graph "
        "takes the host out of the step; across nodes it also holds the clocks' offset). A compute skew is on "
        "the GPUs: uneven shards, or a slower GPU (clocks, heat, another process: nvidia-smi -q -d PERFORMANCE).")]


def _busy_below_floor(f: dict, t: Mapping[str, float]) -> dict | None:
    """``{gpu_busy_us_per_step, floor_us, bytes_per_step, needed_GBps, needed_over_peak}`` (µs, bytes, GB/s, a
    factor) when the median step's GPU busy time is under the floor for bytes beyond any cache
    (:data:`TRACE_THRESHOLDS`), else None."""
    bw = f.get("bandwidth") or {}
    s = bw.get("summary") or {}
    busy = (f.get("steps") or {}).get("gpu_busy_us_per_step")
    floor, nbytes = s.get("floor_us"), s.get("bytes_per_step")
    if None in (busy, floor, nbytes) or busy <= 0 or nbytes < t["bytes_mismatch_min_bytes"]:
        return None
    if busy >= floor * t["bytes_mismatch_max_busy_over_floor"]:
        return None
    return {"gpu_busy_us_per_step": busy, "floor_us": floor, "bytes_per_step": nbytes,
            "needed_GBps": round(nbytes / busy / 1e3, 1), "needed_over_peak": _ratio(floor, busy)}


def _bytes_mismatch(f: dict, t: Mapping[str, float]) -> list[dict]:
    ev = _busy_below_floor(f, t)
    if ev is None:
        return []
    bw = f.get("bandwidth") or {}
    what = bw.get("model") or "the given byte count"
    return [_file_finding(
        f, "bytes-mismatch", "problem",
        f"The bytes do not fit this trace: the GPU was busy {us_words(ev['gpu_busy_us_per_step'])} of the median "
        f"step, under the {us_words(ev['floor_us'])} floor of {fmt(ev['bytes_per_step'], 'bytes')} at peak; "
        f"moving them would take {ev['needed_GBps']:,.0f} GB/s, {ev['needed_over_peak']:.2f}x the peak",
        ev,
        f"The bandwidth figures assume {what}"
        + (f" in {bw['dtype']}" if bw.get("dtype") else "") + ", which this trace did not run: give the traced "
        "model (--model, its config.json) and its dtype (--dtype), or --bytes-per-step.")]


def _near_floor(f: dict, t: Mapping[str, float]) -> list[dict]:
    s = (f.get("bandwidth") or {}).get("summary") or {}
    util = s.get("util_peak")
    if util is None or util < t["near_limit_min_util_peak"] or _busy_below_floor(f, t) is not None:
        return []  # (bytes that do not fit the trace are no bandwidth limit: bytes-mismatch says so)
    return [_file_finding(
        f, "near-bandwidth-limit", "info",
        f"Near the bandwidth limit: the median step is {s['over_floor_x']:.2f}× the floor, {util:.0%} of peak",
        {"util_peak": util, "effective_GBps": s.get("effective_GBps"), "step_wall_us": s.get("step_us_p50"),
         "floor_us": s.get("floor_us"), "over_floor_x": s.get("over_floor_x")},
        "A device copy reaches about 88-89 % of NVML peak on Hopper GPUs, so little is left to remove: fewer bytes "
        "per token (quantized weights, a smaller KV cache) are what make it faster; removing the remaining bubbles "
        "gains at most the distance to the floor.")]


def _steps_uncertain(f: dict, t: Mapping[str, float]) -> list[dict]:
    d = f.get("step_detection") or {}
    if d.get("method") in (None, "marker") or d.get("confidence") != "low" or not f.get("steps"):
        return []
    return [_file_finding(
        f, "steps-uncertain", "warn",
        f"Steps found without markers with low confidence: {d.get('matching_steps')} of "
        f"{count(d.get('steps'), 'step')} repeat the common sequence exactly",
        {"steps": d.get("steps"), "matching_steps": d.get("matching_steps"), "units_per_step": d.get("units_per_step"),
         "coverage": d.get("coverage")},
        "The step figures rest on a guessed period: mark each decode step with torch.profiler.record_function("
        '"bubblescope.decode_step") (or profile with torch.profiler.schedule) for steps that are known.')]


FILE_RULES: tuple[Callable[[dict, Mapping[str, float]], list[dict]], ...] = (
    _launch_bound, _bubble_bound, _gpu_idle, _host_sync, _kernel_gaps, _host_idle, _warmup, _bytes_mismatch,
    _near_floor, _steps_uncertain)
RANK_RULES: tuple[Callable[[dict, Mapping[str, float]], list[dict]], ...] = (_nccl_heavy, _rank_skew)


def finding_subject(finding: dict) -> str:
    """Who a trace finding is about, for the reports: its file (and rank), or "all ranks" for a cross-rank one."""
    if finding.get("file") is None:
        return "all ranks"
    rank = finding.get("rank")
    return str(finding["file"]) + ("" if rank is None else f" (rank {rank})")


def find_trace(summary: dict, thresholds: Mapping[str, float] | None = None) -> list[dict]:
    """Run every rule on a trace summary.

    Args:
        summary: the dict of :func:`~bubblescope.profiler.trace.ranksummary.summarize_rank_traces` (or
            ``summarize_traces``, without ``ranks``); unreadable files (``{"path", "error"}``) are skipped.
        thresholds: overrides for entries of :data:`TRACE_THRESHOLDS` (same names).

    Returns:
        Per readable file in order, its findings in rule order (:data:`FILE_RULES`), then the cross-rank ones
        (:data:`RANK_RULES`): dicts with ``rule``, ``severity`` (:data:`TRACE_SEVERITIES`), ``file`` (the path;
        None for a cross-rank finding), ``rank`` (the file's rank or None), ``title``, ``evidence`` ({name:
        number}, null inputs left out; ``_us`` keys in µs) and ``advice``.

    Raises:
        KeyError: a threshold override names no known threshold.
    """
    t = merged_thresholds(TRACE_THRESHOLDS, thresholds, "trace finding")
    out = []
    for f in summary.get("files") or []:
        if "error" not in f:
            for rule in FILE_RULES:
                out.extend(rule(f, t))
    if summary.get("ranks"):
        for rule in RANK_RULES:
            out.extend(rule(summary["ranks"], t))
    return out
