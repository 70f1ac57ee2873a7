"""Findings: rules that read a results document and say what limits each engine.

Each rule is a small function of one ``ok`` engine (and the document) returning a finding or None.
A rule stays silent when any input it needs is null. Evidence numbers are copied from the document
(or derived from it, e.g. a ratio, rounded to 4 decimals), so a reader can check them in the JSON.
Thresholds live in one table, :data:`THRESHOLDS`; ``find(doc, thresholds={...})`` overrides entries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from .results import dig, ordered
from ..wording import count

THRESHOLDS: Mapping[str, float] = MappingProxyType({
    # launch-bound: the GPU idles most of the step and there are many kernels to launch.
    "launch_bound_min_bubble_ratio": 0.5,
    "launch_bound_min_kernels_per_step": 100,
    # bubble-bound: launches are already amortised (a CUDA graph or a megakernel), yet the GPU idles.
    "bubble_bound_min_bubble_ratio": 0.2,
    "bubble_bound_max_launches_per_step": 2,
    # near the bandwidth limit: Hazy Research's Llama-1B megakernel reached 78 % of peak; 80 % is done.
    "near_limit_min_util_peak": 0.80,
    # prefill-dominated: decode is less than half of end-to-end time.
    "prefill_max_decode_share": 0.5,
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
    # unstable: a heavy tail, or latency growing across the sweep faster than bytes per step.
    "unstable_max_p99_over_p50": 1.5,
    "unstable_max_sweep_excess": 1.25,
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


def _finding(rule: str, severity: str, engine: dict, title: str, evidence: dict, advice: str) -> dict:
    return make_finding(rule, severity, {"engine": engine.get("name")}, title, evidence, advice)


def _launch_bound(eng: dict, doc: dict, t: Mapping[str, float]) -> dict | None:
    bubble, kernels = dig(eng, "timeline", "bubble_ratio"), dig(eng, "timeline", "kernels_per_step")
    if bubble is None or kernels is None:
        return None
    if bubble < t["launch_bound_min_bubble_ratio"] or kernels < t["launch_bound_min_kernels_per_step"]:
        return None
    return _finding(
        "launch-bound", "problem", eng,
        f"Launch-bound: the GPU is idle {bubble:.0%} of each step across {count(kernels, 'kernel', fmt='.0f')}",
        {"bubble_ratio": bubble, "kernels_per_step": kernels,
         "launches_per_step": dig(eng, "timeline", "launches_per_step"),
         "launch_share": dig(eng, "timeline", "launch_share")},
        "Replay the decode step as a CUDA graph (engine reference-cudagraph) or fuse kernels "
        "(reference-compile, megakernel) so launches stop gating the GPU.")


def _bubble_bound(eng: dict, doc: dict, t: Mapping[str, float]) -> dict | None:
    bubble, launches = dig(eng, "timeline", "bubble_ratio"), dig(eng, "timeline", "launches_per_step")
    if bubble is None or launches is None:
        return None
    if bubble < t["bubble_bound_min_bubble_ratio"] or launches > t["bubble_bound_max_launches_per_step"]:
        return None
    return _finding(
        "bubble-bound", "problem" if bubble >= 0.5 else "warn", eng,
        f"Bubble-bound: {launches:g} launch(es) per step, yet the GPU is idle {bubble:.0%} of it",
        {"bubble_ratio": bubble, "launches_per_step": launches,
         "kernels_per_step": dig(eng, "timeline", "kernels_per_step")},
        "Launch overhead is gone; the gaps are between kernels or steps on the GPU: fuse neighbouring "
        "kernels and keep the host's per-token work (sampling, copies) off the critical path.")


def _near_limit(eng: dict, doc: dict, t: Mapping[str, float]) -> dict | None:
    util = dig(eng, "bandwidth", "util_peak")
    if util is None or util < t["near_limit_min_util_peak"]:
        return None
    return _finding(
        "near-bandwidth-limit", "info", eng,
        f"Near the bandwidth limit: {util:.0%} of NVML peak HBM bandwidth",
        {"util_peak": util, "effective_GBps": dig(eng, "bandwidth", "effective_GBps"),
         "util_copy": dig(eng, "bandwidth", "util_copy")},
        "Decode here is done: only fewer bytes per token (quantized weights, a smaller KV cache) "
        "will make it faster.")


def _prefill_dominated(eng: dict, doc: dict, t: Mapping[str, float]) -> dict | None:
    share = dig(eng, "latency", "decode_share")
    if share is None or share >= t["prefill_max_decode_share"]:
        return None
    return _finding(
        "prefill-dominated", "info", eng,
        f"Prefill-dominated: decode is only {share:.0%} of end-to-end time",
        {"decode_share": share, "ttft_ms": dig(eng, "latency", "ttft_ms"),
         "token_ms_p50": dig(eng, "latency", "token_ms_p50"), "gen_len": dig(doc, "workload", "gen_len")},
        "Decode optimizations will not show end to end: generate more tokens (--gen-len) or "
        "optimize prefill first.")


def _sweep_points(eng: dict) -> list[dict]:
    """Sweep rows with latency and bytes known, shortest context first."""
    rows = [r for r in (eng.get("sweep") or [])
            if r.get("token_ms_p50") is not None and r.get("bytes_per_step") is not None]
    return sorted(rows, key=lambda r: r["context"])


def _kv_bound(eng: dict, doc: dict, t: Mapping[str, float]) -> dict | None:
    rows = [r for r in _sweep_points(eng) if r.get("kv_bytes_per_step") is not None]
    if len(rows) < 2:
        return None
    short, long = rows[0], rows[-1]
    kv_share = long["kv_bytes_per_step"] / long["bytes_per_step"]
    growth = long["token_ms_p50"] / short["token_ms_p50"]
    if kv_share < t["kv_bound_min_kv_share"] or growth < t["kv_bound_min_latency_growth"]:
        return None
    return _finding(
        "kv-bound", "warn", eng,
        f"KV-bound at long context: the KV cache is {kv_share:.0%} of bytes per step at "
        f"{count(long['context'], 'token')} and ms/token grows {growth:.2f}x",
        {"context_short": short["context"], "context_long": long["context"],
         "kv_share_long": round(kv_share, 4), "token_ms_p50_short": short["token_ms_p50"],
         "token_ms_p50_long": long["token_ms_p50"], "latency_growth": round(growth, 4)},
        "Shrink the KV read: a lower-precision KV cache, fewer KV heads (GQA), or split-KV "
        "(flash-decoding) attention so more SMs stream the cache.")


def _fused_slow(eng: dict, doc: dict, t: Mapping[str, float]) -> dict | None:
    util, comp = dig(eng, "bandwidth", "util_peak"), eng.get("compile")
    if not str(eng.get("name", "")).startswith("megakernel") or util is None or comp is None:
        return None
    spills, per_sm, regs = comp.get("spills"), comp.get("programs_per_sm"), comp.get("registers")
    # The Gluon kernel runs one CTA per SM by design (its bytes in flight are the TMA ring, not warps), and a
    # warp-specialized binary reports the per-thread maximum (255): only spills say something there.
    by_design = comp.get("implementation") == "gluon"
    causes = {"register spills": spills is not None and spills >= t["fused_slow_min_spills"],
              "poor residency": not by_design and per_sm is not None and per_sm < t["fused_slow_min_programs_per_sm"],
              "high register use": not by_design and regs is not None and regs >= t["fused_slow_max_registers"]}
    named = [c for c, hit in causes.items() if hit]
    if util >= t["fused_slow_max_util_peak"] or not named:
        return None
    advice = []
    if causes["register spills"]:
        advice.append("spilled registers go through local memory on the critical path: shrink the register "
                      "tiles (rows, block_k) or cap fewer programs per SM")
    if causes["poor residency"] or causes["high register use"]:
        advice.append("too few bytes in flight per SM: cut registers (smaller tiles, fewer warps, no "
                      "prefetch into registers) until at least 2 programs fit per SM")
    return _finding(
        "fused-slow", "problem", eng,
        f"Fused path slower than expected: {util:.0%} of peak with {' and '.join(named)}",
        {"util_peak": util, "registers": regs, "spills": spills, "programs_per_sm": per_sm},
        "; ".join(advice).capitalize() + ".")


def _divergence(eng: dict, doc: dict, t: Mapping[str, float]) -> dict | None:
    agree = dig(eng, "correctness", "token_agreement")
    if agree is None or agree >= t["divergence_min_token_agreement"]:
        return None
    ref = dig(eng, "correctness", "reference") or "the reference"
    return _finding(
        "numerical-divergence", "problem" if agree < 0.9 else "warn", eng,
        f"Numerical divergence: {agree:.1%} of greedy tokens agree with {ref}",
        {"token_agreement": agree, "steps": dig(eng, "correctness", "steps"),
         "max_abs_logit_diff": dig(eng, "correctness", "max_abs_logit_diff"),
         "rel_logit_err": dig(eng, "correctness", "rel_logit_err")},
        "Check accumulation order and precision (fp32 accumulators, norms and softmax in fp32) "
        "before trusting the speed numbers.")


def _unstable(eng: dict, doc: dict, t: Mapping[str, float]) -> dict | None:
    p50, p99 = dig(eng, "latency", "token_ms_p50"), dig(eng, "latency", "token_ms_p99")
    tail = p99 / p50 if p50 is not None and p99 is not None else None
    rows = _sweep_points(eng)
    # Memory-bound decode time scales with bytes per step; latency growing faster is unexplained.
    excess = max(((r["token_ms_p50"] / rows[0]["token_ms_p50"]) / (r["bytes_per_step"] / rows[0]["bytes_per_step"])
                  for r in rows[1:]), default=None)
    heavy_tail = tail is not None and tail > t["unstable_max_p99_over_p50"]
    unexplained = excess is not None and excess > t["unstable_max_sweep_excess"]
    if not heavy_tail and not unexplained:
        return None
    what = " and ".join(w for w, on in (("p99 far above p50", heavy_tail),
                                        ("latency grows faster than bytes across the sweep", unexplained)) if on)
    return _finding(
        "unstable", "warn", eng, f"Unstable latency: {what}",
        {"token_ms_p50": round(p50, 4) if p50 is not None else None,
         "token_ms_p99": round(p99, 4) if p99 is not None else None,
         "p99_over_p50": round(tail, 4) if tail is not None else None,
         "sweep_latency_over_bytes_growth": round(excess, 4) if excess is not None else None},
        "Silence other work on the CPU and raise --runs: timings on a shared CPU are noisy. With more torch threads "
        "than idle cores, set OMP_NUM_THREADS=1: the threads of one op wait on each other."
        if dig(doc, "device", "type") == "cpu" else
        "Pin clocks, silence other GPU work, raise --runs; if only long contexts are slow, look at the "
        "attention kernel's scaling (split-KV) and allocator or recompilation events in the trace.")


def _top_counters(eng: dict, doc: dict) -> dict | None:
    """The longest profiled kernel of ``eng`` in the document's ncu ``counters`` section, or None."""
    for e in (doc.get("counters") or {}).get("engines") or []:
        if e.get("engine") == eng.get("name") and e.get("available") and e.get("kernels"):
            return e["kernels"][0]
    return None


def _counters_occupancy(eng: dict, doc: dict, t: Mapping[str, float]) -> dict | None:
    k = _top_counters(eng, doc)
    m = (k or {}).get("metrics") or {}
    active, regs = m.get("sm__warps_active.avg.pct_of_peak_sustained_active"), m.get("launch__registers_per_thread")
    if active is None or regs is None or active > t["counters_low_occupancy_max_warps_active_pct"] \
            or regs < t["counters_low_occupancy_min_registers"]:
        return None
    if (eng.get("compile") or {}).get("implementation") == "gluon":
        # One CTA per SM by design: a TMA producer warp keeps the bytes in flight, not the warp count (the
        # H200 record of 2026-12-01: 12.5 % of warps active at 65 % of DRAM peak), so occupancy is not the lever.
        return None
    return _finding(
        "counters-low-occupancy", "warn", eng,
        f"Low occupancy from {regs:.0f} registers: {active:.1f} % of warps active in the top kernel (ncu)",
        {"sm__warps_active.avg.pct_of_peak_sustained_active": active, "launch__registers_per_thread": regs,
         "launch__occupancy_limit_registers": m.get("launch__occupancy_limit_registers"),
         "dram__throughput.avg.pct_of_peak_sustained_elapsed":
             m.get("dram__throughput.avg.pct_of_peak_sustained_elapsed")},
        "Few warps in flight cannot keep enough loads outstanding to saturate HBM: cut registers per thread "
        "(smaller tiles, a register cap) or move the loads to an asynchronous copy engine (TMA, cp.async).")


def _counters_memory(eng: dict, doc: dict, t: Mapping[str, float]) -> dict | None:
    k = _top_counters(eng, doc)
    m = (k or {}).get("metrics") or {}
    dram, hit = m.get("dram__throughput.avg.pct_of_peak_sustained_elapsed"), m.get("lts__t_sector_hit_rate.pct")
    if dram is None:
        return None
    stalls = k.get("stalls") or {}
    top = next(iter(stalls.items()), None)
    stream = hit is not None and hit <= t["counters_l2_streaming_max_hit_rate_pct"]
    title = f"DRAM throughput {dram:.1f} % of peak in the top kernel (ncu)"
    if hit is not None:
        title += (f"; L2 hit rate {hit:.0f} %: weights stream from HBM, as expected at batch 1" if stream
                  else f"; L2 hit rate {hit:.0f} %")
    if top:
        title += f"; warps mostly stalled on {top[0]} ({top[1]:.1f} %)"
    return _finding(
        "counters-memory", "info", eng, title,
        {"dram__throughput.avg.pct_of_peak_sustained_elapsed": dram, "lts__t_sector_hit_rate.pct": hit,
         "dram__bytes_read.sum": m.get("dram__bytes_read.sum"), "duration_us": k.get("duration_us"),
         **({f"stall_{top[0]}_pct": top[1]} if top else {})},
        "long_scoreboard stalls wait on global loads (more bytes in flight help); membar, barrier and sleeping "
        "stalls are the synchronisation between tasks; a high L2 hit rate with low DRAM throughput means the "
        "working set fits in L2 and the bandwidth numbers overstate HBM traffic.")


def _communication_bound(eng: dict, doc: dict, t: Mapping[str, float]) -> dict | None:
    # Only tensor-parallel runs carry "tp" (bubblescope.tpdiagnose); its numbers come from profiler.traffic.bound_by.
    tp = eng.get("tp") or {}
    floor, nccl = tp.get("hbm_floor_us"), tp.get("nccl_us_per_step")
    if floor is None or nccl is None or tp.get("bound") != "communication":
        return None
    return _finding(
        "communication-bound", "warn", eng,
        f"Communication-bound: {nccl:.1f} µs of NCCL kernels per step exceed the {floor:.1f} µs a rank needs "
        f"to stream its 1/{tp.get('world_size')} of the weights at peak",
        {"nccl_us_per_step": nccl, "hbm_floor_us": floor, "world_size": tp.get("world_size"),
         "allreduce_count": tp.get("allreduce_count"), "nccl_share": tp.get("nccl_share")},
        "fewer ranks, or fewer and larger collectives (fuse the O-proj/down all-reduces with the next norm, "
        "one-shot all-reduce for small messages), or overlap communication with the next layer's weight loads")


RULES: tuple[Callable[[dict, dict, Mapping[str, float]], dict | None], ...] = (
    _launch_bound, _bubble_bound, _near_limit, _prefill_dominated, _kv_bound, _fused_slow,
    _divergence, _unstable, _counters_occupancy, _counters_memory, _communication_bound)


def merged_thresholds(defaults: Mapping[str, float], overrides: Mapping[str, float] | None, what: str) -> dict:
    """``defaults`` with ``overrides`` applied. Raises KeyError naming the overrides ``defaults`` does not have
    (``unknown {what} thresholds: ...``)."""
    unknown = set(overrides or {}) - set(defaults)
    if unknown:
        raise KeyError(f"unknown {what} thresholds: {', '.join(sorted(unknown))}")
    return {**defaults, **(overrides or {})}


def find(doc: dict, thresholds: Mapping[str, float] | None = None) -> list[dict]:
    """Run every rule on every ``ok`` engine of a results document.

    Args:
        doc: a results document (``Results.doc``); skipped/failed engines are ignored.
        thresholds: overrides for entries of :data:`THRESHOLDS` (same names).

    Returns:
        Findings in engine ladder order, then rule order: dicts with ``rule``, ``severity``
        (:data:`SEVERITIES`), ``engine``, ``title``, ``evidence`` ({name: number}, null inputs
        left out) and one line of ``advice`` — the ``findings`` entries of the schema.

    Raises:
        KeyError: a threshold override names no known threshold.
    """
    t = merged_thresholds(THRESHOLDS, thresholds, "finding")
    out = []
    for eng in ordered([e for e in doc.get("engines") or [] if e.get("status") == "ok"]):
        out.extend(f for f in (rule(eng, doc, t) for rule in RULES) if f is not None)
    return out
