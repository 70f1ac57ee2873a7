"""Findings: rules that read a results document and say what limits each engine.

Each rule is a small function of one ``ok`` engine (and the document) returning a finding or None
(:data:`RULES`, with the counters' of :mod:`.counter_findings`); the document-level rules of
:mod:`.ladder_findings` (the megakernel against the best op-by-op engine, a rung slower than the one below it)
return a list.
A rule stays silent when any input it needs is null. Evidence numbers are copied from the document
(or derived from it, e.g. a ratio, rounded to 4 decimals), so a reader can check them in the JSON. The
figures are those the tables show: the one bubble ratio of :func:`.ladder.bubble_ratio` (a one-kernel step's
in-kernel wait, else the GPU's idle share), the request times of :func:`.ladder.request_times`.
Thresholds live in one table, :data:`~.finding_base.THRESHOLDS` (re-exported here with the severities, the
finding shape and the ceiling test); ``find(doc, thresholds={...})`` overrides entries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .counter_findings import COUNTER_RULES
from .finding_base import (SEVERITIES, THRESHOLDS, at_ceiling, make_finding, merged_thresholds,  # noqa: F401
                           rounded as _round)
from .finding_base import engine_finding as _finding
from .ladder import IN_KERNEL, bubble_ratio, bubble_us, idle_parts, ladder, request_times, step_us
from .ladder_findings import DOC_RULES
from .results import dig, ordered
from ..wording import count

__all__ = ["SEVERITIES", "THRESHOLDS", "RULES", "at_ceiling", "find", "in_kernel_advice", "make_finding",
           "merged_thresholds", "rederive"]


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


def in_kernel_advice(eng: dict) -> str:
    """What to do about a megakernel's in-kernel dependency wait, by what the kernel already does (``compile``):
    with weight prefetch off (``compile.prefetch`` 0: the ``megakernel-noprefetch`` ablation) its loads wait
    behind each dependency, which the prefetching kernel removes; the Gluon kernel already streams weights ahead of
    the wait (its producer warp), so the chain itself must get shorter; the Triton kernel already prefetches each
    task's weights into L2 before its wait, so what is left is the chain and, on Hopper, the Gluon kernel."""
    c = eng.get("compile") or {}
    if c.get("prefetch") == 0 or c.get("variant") == "noprefetch":
        return ("This kernel loads each task's weights only once the task's inputs are ready (weight prefetch "
                "off, an ablation): the megakernel with prefetch (engine megakernel) loads them during the wait.")
    chain = (" (the HTML report's dependency-chain table: per edge, the hop from the last upstream end to the first "
             "consumer start, which is the signal and its poll, and the consumer stage's span)"
             if dig(eng, "intrakernel", "edges") else "")
    if c.get("implementation") == "gluon":
        return ("Shorten the dependency chain the most-waiting opcode sits on: fewer dependent memory round "
                f"trips in the stages before it{chain}, finer-grained edges (per head, per chunk), so the weight "
                "ring does not run full during the wait.")
    if c.get("implementation") == "triton":
        return ("Each task's weights are already prefetched into L2 before its wait; shorten the dependency "
                f"chain{chain} with finer-grained edges (per head, per chunk) on the opcode that waits most, or on "
                "Hopper run the Gluon kernel (engine megakernel-gluon), whose producer warp streams the weights "
                "into shared memory during the wait.")
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
    split = idle_parts(eng) or {}  # the timed step's idle µs by cause, summing to bubble_us
    host, gaps, other = (_round(split.get(k)) for k in ("host_wait_us", "kernel_wait_us", "other_us"))
    named = ((host, "waiting for the host"), (gaps, "in gaps between kernels"), (other or None, "in other gaps"))
    parts = [f"{v:,.1f} µs {what}" for v, what in named if v is not None]  # "other" only where there is some
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
         "host_wait_per_step_us": host, "kernel_wait_per_step_us": gaps, "other_idle_per_step_us": other,
         "bubble_us": _round(bubble_us(eng))},
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


def _cold_start(eng: dict, doc: dict, t: Mapping[str, float]) -> dict | None:
    """The first generation in the process (``latency.first_run``: compiles, graph captures, allocator growth)
    against the timed ones: its TPOT p50 at ``cold_start_min_tpot_ratio`` × the timed p50 or more with its decode
    steps ``cold_start_min_excess_ms`` slower in all, or its TTFT at ``cold_start_min_ttft_ratio`` × the timed TTFT
    or more and that many ms above it."""
    lat = eng.get("latency") or {}
    first_tpot, first_ttft = dig(lat, "first_run", "token_ms_p50"), dig(lat, "first_run", "ttft_ms")
    tokens, tpot, ttft = dig(lat, "first_run", "tokens"), lat.get("token_ms_p50"), lat.get("ttft_ms")
    values = (first_tpot, first_ttft, tokens, tpot, ttft)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values) or tpot <= 0 or ttft <= 0:
        return None
    floor = t["cold_start_min_excess_ms"]
    slow_decode = first_tpot >= t["cold_start_min_tpot_ratio"] * tpot and (first_tpot - tpot) * tokens >= floor
    slow_prefill = first_ttft >= t["cold_start_min_ttft_ratio"] * ttft and first_ttft - ttft >= floor
    if not (slow_decode or slow_prefill):
        return None
    tpot_x, ttft_x = first_tpot / tpot, first_ttft / ttft
    said = []  # the title names what was slow (the evidence keeps both)
    if slow_decode:
        said.append(f"ran at {first_tpot:.3f} ms/token, {tpot_x:.1f}× the timed {tpot:.3f} ms/token")
    if slow_prefill:
        said.append(f"took {first_ttft:.3f} ms to its first token, {ttft_x:.1f}× the timed {ttft:.3f} ms")
    return _finding(
        "cold-start", "info", eng,
        f"Cold start on {eng.get('name')}: the first generation {', and '.join(said)}",
        {"first_tpot_p50_ms": first_tpot, "tpot_p50_ms": tpot, "tpot_first_over_timed": _round(tpot_x),
         "first_ttft_ms": first_ttft, "ttft_ms": ttft, "ttft_first_over_timed": _round(ttft_x),
         "first_run_tokens": tokens},
        "A fresh process pays this once: warm each engine (one generation at the served prompt length) before "
        "taking traffic, or keep the process alive; bubblescope generate --warmup N and diagnose model time "
        "after untimed runs.")


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
    # ms to 3 decimals (µs) in the evidence and the title alike: a 4-decimal evidence printed at 3 rounded twice
    # (10.80145 → 10.8015 → 10.802 against the title's 10.801)
    ev50, ev99, ratio = round(p50, 3), round(p99, 3), round(p99 / p50, 4)
    return _finding(
        "unstable", "warn", eng,
        f"Unstable latency: p99 {ev99:.3f} ms is {ratio:.2f}x the p50 {ev50:.3f} ms",
        {"token_ms_p50": ev50, "token_ms_p99": ev99, "p99_over_p50": ratio,
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
    _launch_bound, _bubble_bound, _gpu_idle, _near_limit, _prefill_dominated, _cold_start, _kv_bound, _fused_slow,
    _divergence, _unstable, _context_growth, *COUNTER_RULES, _communication_bound)


def find(doc: dict, thresholds: Mapping[str, float] | None = None) -> list[dict]:
    """Run every rule on every ``ok`` engine of a results document.

    Args:
        doc: a results document (``Results.doc``); skipped/failed engines are ignored.
        thresholds: overrides for entries of :data:`THRESHOLDS` (same names).

    Returns:
        Findings in engine ladder order, then rule order (:data:`RULES`), then those of
        :data:`~.ladder_findings.DOC_RULES`: dicts with ``rule``, ``severity``
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
