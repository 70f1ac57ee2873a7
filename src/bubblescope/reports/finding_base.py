"""What every findings module shares: the thresholds, the severities, a finding's shape, and the measured
bandwidth ceiling ("done") the rules and the verdict judge by.

Thresholds live in one table, :data:`THRESHOLDS` (each with its reason); rules take it merged with a caller's
overrides (:func:`merged_thresholds`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from .results import dig

THRESHOLDS: Mapping[str, float] = MappingProxyType({
    # launch-bound: the GPU idles most of the step and there are many kernels to launch.
    "launch_bound_min_bubble_ratio": 0.5,
    "launch_bound_min_kernels_per_step": 100,
    # bubble-bound: launches are already amortised (a CUDA graph or a megakernel), yet the GPU idles.
    "bubble_bound_min_bubble_ratio": 0.2,
    "bubble_bound_max_launches_per_step": 2,
    # gpu-idle: the GPU idles most of the step (launch-bound's ratio) across fewer kernels than launch-bound
    # needs and more launches than bubble-bound allows: the host, not the launch count, holds the GPU. It
    # uses launch-bound's ratio and counts.
    # near the bandwidth limit ("done"): judged against the copy bandwidth measured on the same GPU, not asserted
    # from the NVML peak: a plain chain of the 1B's matvecs in one CUDA graph with PDL streamed 85 % of NVML
    # peak on an H100 where the megakernel streamed 81 %, so 80 % of peak is not the ceiling. Within 5 % of the
    # measured device-to-device copy (read + write, profiler.hardware.measure_copy_bandwidth) is.
    "near_limit_min_util_copy": 0.95,
    # KV-bound: at the longest swept context the KV cache is this share of bytes per step, and
    # latency there is this factor above the shortest context's.
    "kv_bound_min_kv_share": 0.25,
    "kv_bound_min_latency_growth": 1.10,
    # fused path slower than expected: a megakernel below half of peak with spills or poor residency.
    # Spills count 4-byte words of local memory per thread (Triton's n_spills). The H200 default reports 2;
    # from 8 words (32 bytes) on they are worth a look.
    "fused_slow_max_util_peak": 0.5,
    "fused_slow_min_spills": 8,
    "fused_slow_min_programs_per_sm": 2,
    "fused_slow_max_registers": 200,
    # numerical divergence: any greedy token differing from the reference.
    "divergence_min_token_agreement": 1.0,
    # unstable: a heavy tail (p99 far above p50).
    "unstable_max_p99_over_p50": 1.5,
    # context-growth: across the sweep, ms/token grows this factor faster than bytes per step (memory-bound decode
    # time follows its bytes).
    "context_growth_max_excess": 1.25,
    # rung-slower: a rung of the ablation ladder is slower than the rung below it by more than this share of the
    # lower rung's p50 (run-to-run spread of a GPU decode step is about 1 %).
    "rung_slower_min_share": 0.02,
    # cold-start: the first generation in the process (latency.first_run) against the timed ones. Its TPOT p50 at
    # 1.5x the timed one, or its TTFT at 3x (a prefill is one forward, so a first-call cost shows larger there),
    # with at least 10 ms lost over the request either way: a host wall clock carries a few ms of scheduler and
    # page-fault noise, and a tiny model's 0.1 ms against 0.05 ms is no cold start worth a word.
    "cold_start_min_tpot_ratio": 1.5,
    "cold_start_min_ttft_ratio": 3.0,
    "cold_start_min_excess_ms": 10.0,
    # hardware counters (ncu, `diagnose model --counters`), in percent as ncu reports them.
    "counters_low_occupancy_max_warps_active_pct": 30.0,
    "counters_low_occupancy_min_registers": 128,
    "counters_l2_streaming_max_hit_rate_pct": 50.0,
})


# What a severity tells the reader (shown under the findings in the terminal and HTML reports).
SEVERITIES: Mapping[str, str] = MappingProxyType({
    "problem": "limits this engine now (half of the step or more lost, or wrong results): act on it first",
    "warn": "costs time or makes the numbers less trustworthy: worth a look",
    "info": "context for reading the numbers; nothing to fix",
})


def make_finding(rule: str, severity: str, subject: dict, title: str, evidence: dict, advice: str) -> dict:
    """A finding: ``rule``, ``severity``, the keys of ``subject`` (``engine`` here; ``file`` and ``rank`` for a
    trace), ``title``, ``evidence`` with its None values left out, ``advice``."""
    return {"rule": rule, "severity": severity, **subject, "title": title,
            "evidence": {k: v for k, v in evidence.items() if v is not None}, "advice": advice}


def engine_finding(rule: str, severity: str, engine: dict, title: str, evidence: dict, advice: str) -> dict:
    """:func:`make_finding` about one engine entry (its ``name`` as the finding's ``engine``)."""
    return make_finding(rule, severity, {"engine": engine.get("name")}, title, evidence, advice)


def rounded(value: float | None, digits: int = 4) -> float | None:
    """``value`` rounded to ``digits`` decimals for evidence (None stays None)."""
    return None if value is None else round(value, digits)


def at_ceiling(eng: dict, t: Mapping[str, float] = THRESHOLDS) -> bool:
    """Whether ``eng`` streams at the measured ceiling: ``bandwidth.util_copy`` (effective GB/s / the copy
    bandwidth measured on the same GPU) at least ``near_limit_min_util_copy``. False when no copy was measured:
    "done" is judged against a measurement, never asserted from the NVML peak."""
    util = dig(eng, "bandwidth", "util_copy")
    return util is not None and util >= t["near_limit_min_util_copy"]


def merged_thresholds(defaults: Mapping[str, float], overrides: Mapping[str, float] | None, what: str) -> dict:
    """``defaults`` with ``overrides`` applied. Raises KeyError naming the overrides ``defaults`` does not have
    (``unknown {what} thresholds: ...``)."""
    unknown = set(overrides or {}) - set(defaults)
    if unknown:
        raise KeyError(f"unknown {what} thresholds: {', '.join(sorted(unknown))}")
    return {**defaults, **(overrides or {})}
