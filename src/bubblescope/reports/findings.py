"""Findings: rules that read a results document and say what limits each engine.

Each rule is a small function of one ``ok`` engine (and the document) returning a finding or None; the
document-level rules (:data:`DOC_RULES`, the megakernel against the best op-by-op engine) return a list.
A rule stays silent when any input it needs is null. Evidence numbers are copied from the document
(or derived from it, e.g. a ratio, rounded to 4 decimals), so a reader can check them in the JSON. The
figures are those the tables show: the one bubble ratio of :func:`.ladder.bubble_ratio` (a one-kernel step's
in-kernel wait, else the GPU's idle share), the request times of :func:`.ladder.request_times`.
Thresholds live in one table, :data:`THRESHOLDS`; ``find(doc, thresholds={...})`` overrides entries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from .ladder import (IN_KERNEL, best_op_by_op, bubble_ratio, bubble_us, ladder, megakernel_rung, request_times,
                     step_us)
from .results import dig, ordered
from ..wording import count

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


def _step_words(eng: dict) -> str:
    """ " (682 µs of the 1,100 µs step)": the bubble of a step in µs, where the step is known."""
    lost, step = bubble_us(eng), step_us(eng)
    return f" ({lost:,.0f} µs of the {step:,.0f} µs step)" if lost is not None and step is not None else ""


def _launch_bound(eng: dict, doc: dict, t: Mapping[str, float]) -> dict | None:
    bubble, source = bubble_ratio(eng)
    kernels, launches = dig(eng, "timeline", "kernels_per_step"), dig(eng, "timeline", "launches_per_step")
    if bubble is None or kernels is None or source == IN_KERNEL:
        return None
    if bubble < t["launch_bound_min_bubble_ratio"] or kernels < t["launch_bound_min_kernels_per_step"]:
        return None
    if launches is not None and launches <= t["bubble_bound_max_launches_per_step"]:
        return None  # the launches are amortised already: bubble-bound's case, not this one
    return _finding(
        "launch-bound", "problem", eng,
        f"Launch-bound: the GPU is idle {bubble:.0%} of each step{_step_words(eng)} across "
        f"{count(kernels, 'kernel', fmt='.0f')}",
        {"bubble_ratio": bubble, "kernels_per_step": kernels, "launches_per_step": launches,
         "launch_share": dig(eng, "timeline", "launch_share"), "bubble_us": _round(bubble_us(eng))},
        "Replay the decode step as a CUDA graph (engine reference-cudagraph) or fuse kernels "
        "(reference-compile, reference-fused, megakernel) so launches stop gating the GPU.")


def at_ceiling(eng: dict, t: Mapping[str, float] = THRESHOLDS) -> bool:
    """Whether ``eng`` streams at the measured ceiling: ``bandwidth.util_copy`` (effective GB/s / the copy
    bandwidth measured on the same GPU) at least ``near_limit_min_util_copy``. False when no copy was measured:
    "done" is judged against a measurement, never asserted from the NVML peak."""
    util = dig(eng, "bandwidth", "util_copy")
    return util is not None and util >= t["near_limit_min_util_copy"]


def in_kernel_advice(eng: dict) -> str:
    """What to do about a megakernel's in-kernel dependency wait: the Gluon kernel already loads weights before
    its inputs are ready (its producer warp), so there the chain itself must get shorter; elsewhere, hide it."""
    if dig(eng, "compile", "implementation") == "gluon":
        return ("Shorten the dependency chain the most-waiting opcode sits on: fewer dependent memory round "
                "trips in the stages before it (the chain table's spans; its hops are the signal and poll), "
                "finer-grained edges (per head, per chunk), so the weight ring does not run full during the wait.")
    return ("Hide the waits: issue the next task's weight loads before waiting on its dependency counter and "
            "use finer-grained dependencies (per head, per chunk) on the opcode that waits most.")


def _bubble_bound(eng: dict, doc: dict, t: Mapping[str, float]) -> dict | None:
    bubble, source = bubble_ratio(eng)
    launches = dig(eng, "timeline", "launches_per_step")
    if bubble is None or launches is None:
        return None
    if bubble < t["bubble_bound_min_bubble_ratio"] or launches > t["bubble_bound_max_launches_per_step"]:
        return None
    if at_ceiling(eng, t):  # streaming at the measured ceiling: the bubbles cost no bandwidth (near-limit says so)
        return None
    copy = dig(eng, "bandwidth", "util_copy")
    streams = f"; it streams {copy:.0%} of the measured copy bandwidth" if copy is not None else ""
    if source == IN_KERNEL:
        title = (f"Bubble-bound: one kernel per step, yet its programs wait on dependencies {bubble:.0%} of "
                 f"program-time (the megakernel's own clock){streams}")
        advice = in_kernel_advice(eng)
    else:
        title = (f"Bubble-bound: {count(launches, 'launch', 'launches', fmt='g')} per step, yet the GPU is idle "
                 f"{bubble:.0%} of it{_step_words(eng)}{streams}")
        advice = ("Launch overhead is gone; the gaps are between kernels or steps on the GPU: fuse neighbouring "
                  "kernels, overlap each kernel's start with its predecessor's tail (programmatic dependent "
                  "launch), and keep the host's per-token work (sampling, copies) off the critical path.")
    return _finding(
        "bubble-bound", "problem" if bubble >= 0.5 else "warn", eng, title,
        {"bubble_ratio": bubble, "launches_per_step": launches,
         "kernels_per_step": dig(eng, "timeline", "kernels_per_step"), "util_copy": copy,
         "bubble_us": _round(bubble_us(eng))}, advice)


def _gpu_idle(eng: dict, doc: dict, t: Mapping[str, float]) -> dict | None:
    bubble, source = bubble_ratio(eng)
    kernels, launches = dig(eng, "timeline", "kernels_per_step"), dig(eng, "timeline", "launches_per_step")
    if bubble is None or kernels is None or source == IN_KERNEL or bubble < t["launch_bound_min_bubble_ratio"]:
        return None
    if kernels >= t["launch_bound_min_kernels_per_step"]:
        return None  # launch-bound's (or, with few launches, bubble-bound's) case
    if launches is not None and launches <= t["bubble_bound_max_launches_per_step"]:
        return None  # bubble-bound's case
    host, gaps = dig(eng, "timeline", "idle", "host_wait_us"), dig(eng, "timeline", "idle", "kernel_wait_us")
    parts = [f"{v:,.1f} µs {what}" for v, what in ((host, "waiting for the host"), (gaps, "in gaps between kernels"))
             if v is not None]
    if host is not None and (gaps is None or host >= gaps):
        advice = ("The GPU waits for the host between kernels: keep the host's per-token work (Python, sampling, "
                  ".item(), copies) off the critical path, or replay the step as a CUDA graph so one launch "
                  "queues the whole step.")
    else:
        advice = ("Each kernel boundary drains and refills the GPU: fewer, larger kernels (fusion), programmatic "
                  "dependent launch to overlap each kernel's start with its predecessor's tail, or a megakernel.")
    return _finding(
        "gpu-idle", "problem", eng,
        f"GPU idle {bubble:.0%} of each step{_step_words(eng)} across {count(kernels, 'kernel', fmt='.0f')}"
        + (f": {', '.join(parts)} per step" if parts else ""),
        {"bubble_ratio": bubble, "kernels_per_step": kernels, "launches_per_step": launches,
         "host_wait_per_step_us": host, "kernel_wait_per_step_us": gaps, "bubble_us": _round(bubble_us(eng))},
        advice)


def _near_limit(eng: dict, doc: dict, t: Mapping[str, float]) -> dict | None:
    if not at_ceiling(eng, t):
        return None
    util, peak = dig(eng, "bandwidth", "util_copy"), dig(eng, "bandwidth", "util_peak")
    gbps, copy = dig(eng, "bandwidth", "effective_GBps"), dig(doc, "device", "copy_GBps")
    of_copy = f" ({copy:,.0f} GB/s)" if copy is not None else ""
    title = (f"At the measured bandwidth ceiling: {gbps:,.0f} GB/s is {util:.0%} of the copy bandwidth measured on "
             f"this GPU{of_copy}" if gbps is not None else
             f"At the measured bandwidth ceiling: {util:.0%} of the copy bandwidth measured on this GPU{of_copy}")
    if peak is not None:
        title += f" and {peak:.0%} of NVML peak"
    if util > 1:
        title += " (above the copy: part of each step's bytes come from L2, not HBM)"
    return _finding(
        "near-bandwidth-limit", "info", eng, title,
        {"util_copy": util, "util_peak": peak, "effective_GBps": gbps, "copy_GBps": copy},
        "Decode here is done: only fewer bytes per token (quantized weights, a smaller KV cache) "
        "will make it faster.")


def _prefill_dominated(eng: dict, doc: dict, t: Mapping[str, float]) -> dict | None:
    r = request_times(eng, doc)
    ttft, decode = r["ttft_ms"], r["decode_ms"]
    if ttft is None or decode is None or ttft <= decode:
        return None
    gen = dig(doc, "workload", "gen_len")
    steps = f"the {count(gen - 1, 'decode step')}' " if isinstance(gen, int) and gen > 1 else "the decode steps' "
    return _finding(
        "prefill-dominated", "info", eng,
        f"Prefill-dominated on {eng.get('name')}: TTFT {ttft:,.2f} ms exceeds {steps}{decode:,.2f} ms "
        f"(prompt {count(dig(doc, 'workload', 'prompt_len') or 0, 'token')}, {count(gen or 0, 'new token')})",
        {"ttft_ms": ttft, "decode_ms": _round(decode), "e2e_ms": _round(r["e2e_ms"]),
         "tpot_p50_ms": r["tpot_p50_ms"], "gen_len": gen, "prompt_len": dig(doc, "workload", "prompt_len")},
        "Decode optimizations will not show end to end for this request: optimize prefill first, or measure "
        "the request you serve (--prompt-len, --gen-len).")


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


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


def _thread_advice(doc: dict) -> str:
    """The CPU thread advice for noisy timings, from the threads this run had (``device.threads``): set
    OMP_NUM_THREADS=1 only where it was not set already and torch ran more than one thread."""
    th = dig(doc, "device", "threads") or {}
    omp, used, cores = th.get("omp_num_threads"), th.get("torch_threads"), th.get("cpu_count")
    if omp is not None:
        return (f"OMP_NUM_THREADS was {omp} already (torch ran {count(used or 0, 'thread')}): the noise is other "
                "work on the machine.")
    if used is not None and used <= 1:
        return "torch ran one thread already: the noise is other work on the machine."
    if used is not None:
        return (f"torch ran {count(used, 'thread')} on {count(cores or 0, 'core')} with OMP_NUM_THREADS unset: with "
                "more threads than idle cores the threads of one op wait on each other, so try OMP_NUM_THREADS=1.")
    return ("If OMP_NUM_THREADS is not set and other work shares the cores, try OMP_NUM_THREADS=1: the threads "
            "of one op wait on each other.")


def _unstable(eng: dict, doc: dict, t: Mapping[str, float]) -> dict | None:
    p50, p99 = dig(eng, "latency", "token_ms_p50"), dig(eng, "latency", "token_ms_p99")
    if p50 is None or p99 is None or p99 / p50 <= t["unstable_max_p99_over_p50"]:
        return None
    th = dig(doc, "device", "threads") or {}
    omp = th.get("omp_num_threads")
    cpu = dig(doc, "device", "type") == "cpu"
    return _finding(
        "unstable", "warn", eng,
        f"Unstable latency: p99 {p99:.3f} ms is {p99 / p50:.2f}x the p50 {p50:.3f} ms",
        {"token_ms_p50": round(p50, 4), "token_ms_p99": round(p99, 4), "p99_over_p50": round(p99 / p50, 4),
         "torch_threads": th.get("torch_threads") if cpu else None,
         "omp_num_threads": int(omp) if cpu and str(omp).isdigit() else None},
        "Silence other work on the CPU and raise --runs: timings on a shared CPU are noisy. " + _thread_advice(doc)
        if cpu else
        "Pin clocks, silence other GPU work and raise --runs; look for allocator, recompilation or "
        "CUDA-graph capture events in the trace's slow steps.")


def _context_growth(eng: dict, doc: dict, t: Mapping[str, float]) -> dict | None:
    rows = _sweep_points(eng)
    if len(rows) < 2:
        return None
    first = rows[0]

    def excess(r: dict) -> float:  # memory-bound decode time follows its bytes: latency growing faster is unexplained
        return (r["token_ms_p50"] / first["token_ms_p50"]) / (r["bytes_per_step"] / first["bytes_per_step"])

    worst = max(rows[1:], key=excess)
    if excess(worst) <= t["context_growth_max_excess"]:
        return None
    lat, nbytes = worst["token_ms_p50"] / first["token_ms_p50"], worst["bytes_per_step"] / first["bytes_per_step"]
    return _finding(
        "context-growth", "warn", eng,
        f"Latency grows faster than bytes with context: {lat:.2f}x ms/token for {nbytes:.2f}x bytes per step "
        f"from {count(first['context'], 'token', fmt=',')} to {count(worst['context'], 'token', fmt=',')}",
        {"context_short": first["context"], "context_long": worst["context"],
         "token_ms_p50_short": first["token_ms_p50"], "token_ms_p50_long": worst["token_ms_p50"],
         "latency_growth": round(lat, 4), "bytes_growth": round(nbytes, 4),
         "sweep_latency_over_bytes_growth": round(excess(worst), 4)},
        "Something besides the bytes grows with the context: look at the attention kernel's scaling (split-KV "
        "over more SMs, one pass over the cache) and at allocator or recompilation events in the trace.")


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


def _megakernel_lead(doc: dict, t: Mapping[str, float]) -> list[dict]:
    """The megakernel rung against the strongest op-by-op rung (the fastest ``reference*`` engine), on a GPU: how
    far ahead it is, and how many of the eager reference's bubble µs the op-by-op engine already removes; said
    plainly when the megakernel is not ahead. CPU runs time the Triton interpreter, so they say nothing here."""
    if dig(doc, "device", "type") != "cuda":
        return []
    ok = [e for e in doc.get("engines") or [] if e.get("status") == "ok"]
    mk, best = megakernel_rung(ok), best_op_by_op(ok)
    mk_ms, best_ms = dig(mk, "latency", "token_ms_p50"), dig(best, "latency", "token_ms_p50")
    if mk_ms is None or best_ms is None:
        return []
    eager = next((e for e in ok if e.get("name") == "reference"), None)
    m, n_left = bubble_us(eager) if eager else None, bubble_us(best)
    removed = m - n_left if m is not None and n_left is not None and best is not eager else None
    evidence = {"megakernel_token_ms_p50": mk_ms, "best_op_by_op_token_ms_p50": best_ms,
                "speedup_over_best_op_by_op": round(best_ms / mk_ms, 4), "step_saved_us": _round((best_ms - mk_ms) * 1e3),
                "eager_bubble_us": _round(m) if removed is not None else None,
                "best_op_by_op_bubble_us": _round(n_left), "bubbles_removed_us": _round(removed)}
    if mk_ms < best_ms:
        title = (f"The megakernel is {best_ms / mk_ms:.2f}x the best op-by-op engine ({best['name']}): {mk_ms:.3f} "
                 f"vs {best_ms:.3f} ms/token, {(best_ms - mk_ms) * 1e3:,.1f} µs per token")
        if removed is not None:
            title += (f"; {best['name']} already removes {removed:,.0f} of the {m:,.0f} µs of bubbles per step of the "
                      "eager reference")
        return [_finding("megakernel-vs-op-by-op", "info", mk, title, evidence,
                         "The megakernel's lead is what fusion, CUDA graphs and programmatic dependent launch do not "
                         "remove: read it against the ladder's rungs before crediting the megakernel with all of "
                         "the eager reference's bubbles.")]
    title = (f"The megakernel is not ahead: {best['name']} (op-by-op) runs {best_ms:.3f} ms/token, the megakernel "
             f"{mk_ms:.3f} ms/token ({mk_ms / best_ms:.2f}x its time)")
    if removed is not None:
        title += f"; {best['name']} removes {removed:,.0f} of the eager reference's {m:,.0f} µs of bubbles per step"
    return [_finding("megakernel-vs-op-by-op", "warn", mk, title, evidence,
                     f"Here fused kernels in CUDA graphs ({best['name']}) reach what the megakernel does: ship "
                     "the op-by-op engine, or find what the megakernel still waits on (its in-kernel wait, Inside "
                     "the megakernel).")]


def _rung_slower(doc: dict, t: Mapping[str, float]) -> list[dict]:
    """Each rung of the ladder (:func:`.ladder.ladder`) slower than the rung below it, on a GPU: the mechanism
    it removes did not pay here, said with both rungs' numbers."""
    if dig(doc, "device", "type") != "cuda":
        return []
    rows = {r["engine"]: r for r in ladder(doc)}
    by_name = {e.get("name"): e for e in doc.get("engines") or []}
    out = []
    for row in rows.values():
        below = rows.get(row["below"])
        if row["step_us"] is None or below is None:
            continue
        if -row["step_us"] < t["rung_slower_min_share"] * below["token_ms_p50"] * 1e3:
            continue  # faster, or slower within the run-to-run spread
        if row["engine"].startswith("megakernel") and below["engine"].startswith("reference"):
            continue  # a megakernel behind an op-by-op rung: megakernel-vs-op-by-op says so
        both = (row, below)
        peak = [f"{r['util_peak']:.0%}" if r["util_peak"] is not None else "—" for r in both]
        bub = [f"{r['bubble_ratio']:.3f}" if r["bubble_ratio"] is not None else "—" for r in both]
        out.append(_finding(
            "rung-slower", "warn", by_name.get(row["engine"], {"name": row["engine"]}),
            f"{row['engine']} is {-row['step_us']:,.1f} µs per token slower than the rung below it, {below['engine']} "
            f"({row['token_ms_p50']:.3f} vs {below['token_ms_p50']:.3f} ms/token): removing {row['removes']} did not "
            f"pay here (bubble ratio {bub[0]} vs {bub[1]}, {peak[0]} vs {peak[1]} of NVML peak)",
            {"token_ms_p50": row["token_ms_p50"], "below_token_ms_p50": below["token_ms_p50"],
             "step_us": _round(row["step_us"]), "bubble_ratio": row["bubble_ratio"],
             "below_bubble_ratio": below["bubble_ratio"], "util_peak": row["util_peak"],
             "below_util_peak": below["util_peak"]},
            "Where the bubble ratio fell but the step grew, the rung's kernels stream more slowly than the ones they "
            "replace (compare their % of peak and the top kernels); where the bubbles did not fall, its mechanism did "
            "not take effect (a graph not replayed, PDL not honoured by the driver, a prefetch that waits anyway)."))
    return out


RULES: tuple[Callable[[dict, dict, Mapping[str, float]], dict | None], ...] = (
    _launch_bound, _bubble_bound, _gpu_idle, _near_limit, _prefill_dominated, _kv_bound, _fused_slow,
    _divergence, _unstable, _context_growth, _counters_occupancy, _counters_memory, _communication_bound)
# Rules of the whole document, run after the engines' (findings about one engine against another).
DOC_RULES: tuple[Callable[[dict, Mapping[str, float]], list[dict]], ...] = (_megakernel_lead, _rung_slower)


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
        Findings in engine ladder order, then rule order (:data:`RULES`), then those of :data:`DOC_RULES`: dicts with ``rule``, ``severity``
        (:data:`SEVERITIES`), ``engine``, ``title``, ``evidence`` ({name: number}, null inputs
        left out) and one line of ``advice`` — the ``findings`` entries of the schema.

    Raises:
        KeyError: a threshold override names no known threshold.
    """
    t = merged_thresholds(THRESHOLDS, thresholds, "finding")
    out = []
    for eng in ordered([e for e in doc.get("engines") or [] if e.get("status") == "ok"]):
        out.extend(f for f in (rule(eng, doc, t) for rule in RULES) if f is not None)
    for doc_rule in DOC_RULES:
        out.extend(doc_rule(doc, t))
    return out


def rederive(doc: dict) -> dict:
    """``doc`` (a results document, changed in place and returned) with its ``findings`` and ``ladder`` derived
    again from its numbers by this version's rules (:func:`find`, :func:`.ladder.ladder`), so that re-rendering a
    document written by an older version never shows findings that disagree with the tables next to them."""
    doc["findings"] = find(doc)
    doc["ladder"] = ladder(doc)
    return doc
