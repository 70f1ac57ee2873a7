"""One engine measured on a loaded model: timed generations, effective bandwidth, teacher-forced correctness
against the reference engine, one profiled run and the context sweep, into its results.json engine entry.

Every stage reads the run's :class:`~.plan.RunPlan` and its :class:`~.plan.Bench` (the loaded model, the prompt,
the KV-cache length); none decides a default.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import numpy as np
import torch

from ..engines import build_engine, takes_prefill
from ..generation import SamplingParams, generate, random_ids, teacher_forced_logits
from .plan import SWEEP_STEPS, Bench, RunPlan
from .profiled import profile_engine

CORRECTNESS_STEPS = 64     # teacher-forced steps compared against the reference engine


def percentile(xs: list[float], q: float) -> float | None:
    """numpy's linear-interpolated percentile ``q`` (0-100) of ``xs``, or None for no samples."""
    return float(np.percentile(xs, q)) if xs else None


def latency_stats(token_ms: list[float], ttft_ms: list[float], decode_shares: list[float],
                  e2e_ms: list[float] | None = None) -> dict:
    """Token latency summary (ms): mean, p50, p90, p99 of per-token host wall times (the TPOT: time per output
    token after the first), TTFT median, tokens/s = 1000 / mean, the decode share of total generation time
    (median over runs), and ``e2e_ms``: the median over runs of each generation's measured time (TTFT plus its
    decode steps; None without ``e2e_ms``)."""
    mean = statistics.fmean(token_ms) if token_ms else None
    return {
        "ttft_ms": statistics.median(ttft_ms) if ttft_ms else None,
        "e2e_ms": statistics.median(e2e_ms) if e2e_ms else None,
        "token_ms_mean": mean,
        "token_ms_p50": percentile(token_ms, 50),
        "token_ms_p90": percentile(token_ms, 90),
        "token_ms_p99": percentile(token_ms, 99),
        "tok_per_s": 1000.0 / mean if mean else None,
        "decode_share": statistics.median(decode_shares) if decode_shares else None,
        "token_ms_samples": [round(x, 5) for x in token_ms],
        "ttft_ms_samples": [round(x, 5) for x in ttft_ms],
    }


def first_run_stats(token_ms: list[float], ttft_ms: float) -> dict:
    """The first generation of an engine in this process (its first untimed warm-up, which pays compiles, CUDA-graph
    captures and allocator growth): ``token_ms_p50``, the median of its per-token host wall times ``token_ms`` (ms,
    TPOT; None without a decode step), ``ttft_ms`` its time to first token (ms) and ``tokens``, the number of decode
    steps in ``token_ms``."""
    return {"token_ms_p50": percentile(token_ms, 50), "ttft_ms": ttft_ms, "tokens": len(token_ms)}


def logit_agreement(got, ref) -> dict:
    """An engine's teacher-forced logits ``got`` against the reference's ``ref`` (both float32 (steps, V)):
    ``token_agreement`` (share of steps with the same argmax), ``max_abs_logit_diff`` (max |got − ref|) and
    ``rel_logit_err`` (max over steps of ‖got − ref‖₂ / ‖ref‖₂). A difference that is not finite (NaN or infinite
    logits, e.g. from NaN weights, which loading warns about) is recorded as None: results.json holds finite
    numbers or null (docs/results-schema.md)."""
    import math

    def finite(v: float) -> float | None:
        return v if math.isfinite(v) else None
    agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    rel = ((got - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-30)).max().item()
    return {"token_agreement": agree, "max_abs_logit_diff": finite((got - ref).abs().max().item()),
            "rel_logit_err": finite(rel)}


def _forced(plan: RunPlan, bench: Bench, ref) -> list[int]:
    """The tokens every engine is teacher-forced with: min(:data:`CORRECTNESS_STEPS`, gen_len) of them; real
    weights: the reference ``ref``'s own greedy continuation (realistic text); dummy weights: seeded random ids,
    because random tied embeddings make greedy decoding repeat one token, which every engine would "agree" on
    trivially."""
    loaded, work = bench.loaded, plan.workload
    steps = min(CORRECTNESS_STEPS, work.gen_len)
    if loaded.source == "dummy":
        return random_ids(loaded.config.vocab_size, steps, torch.Generator().manual_seed(work.seed + 1))
    return generate(ref, bench.prompt, steps + 1, eos_ids=()).tokens[:steps]


def unquantized_oracle(plan: RunPlan, bench: Bench, weights) -> dict:
    """The model before quantization (``weights``, :class:`~bubblescope.models.weights.ModelWeights`) on the run's
    forced tokens (:func:`_forced`, real weights: this model's own greedy continuation): ``{"forced", "logits"}``,
    the eager reference engine's teacher-forced logits, float32 (steps + 1, V) on the CPU."""
    ref = build_engine("reference", weights, bench.max_seq)
    forced = _forced(plan, bench, ref)
    return {"forced": forced, "logits": teacher_forced_logits(ref, bench.prompt, forced)}


def oracle(plan: RunPlan, bench: Bench, prior: dict | None = None) -> dict:
    """The tokens every engine is teacher-forced with (``forced``: :func:`_forced`, or ``prior``'s), the reference
    engine's logits (``logits``, float32 (steps + 1, V) on the CPU), the fp32 reference's on the same tokens
    (``fp32``; None with ``fp32_reason`` when it could not run), the run-dtype reference's own fidelity against it
    (``ref_fidelity``, :func:`bubblescope.fidelity.fidelity`) and ``unquantized``: ``prior``'s logits of the
    model before quantization (:func:`unquantized_oracle`; None without one).
    """
    from ..fidelity import fp32_oracle

    loaded = bench.loaded
    ref = build_engine("reference", loaded.weights, bench.max_seq)
    forced = prior["forced"] if prior is not None else _forced(plan, bench, ref)
    logits = teacher_forced_logits(ref, bench.prompt, forced)
    del ref
    # the same tokens through the reference in float32: the bar of each engine's KL and NLL
    return {"forced": forced, "logits": logits, "unquantized": prior["logits"] if prior is not None else None,
            **fp32_oracle(loaded.weights, bench.prompt, forced, bench.max_seq, logits)}


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def measure_engine(name: str, entry: dict, plan: RunPlan, bench: Bench, doc: dict, truth: dict,
                   say: Callable[[str], None]) -> None:
    """Build engine ``name`` and fill its ``entry``: ``tuning`` (what ``plan.tuning`` gave it), ``latency``
    (:func:`latency_stats` of ``runs`` timed generations after ``warmup`` untimed ones, with ``first_run``: the
    first untimed one's :func:`first_run_stats`, None without a warm-up), ``bandwidth`` (bytes per
    step at the mean context, GB/s and fractions of ``doc``'s NVML peak and copy bandwidth), ``correctness``
    (teacher-forced against ``truth``, :func:`oracle`), ``timeline``/``intrakernel``/``trace_path``
    (:func:`~.profiled.profile_engine`), ``compile`` and one ``sweep`` row per context. ``say`` takes each
    stage's progress text. A tuned pick is added to ``doc``'s device notes.

    Raises:
        EngineUnavailable: the engine cannot run on this machine or model (from building it).
        OutputNotWritten: its trace could not be written.
    """
    from ..fidelity import fidelity_entry
    from ..profiler.traffic import bandwidth, step_traffic
    from ..tuned import describe_pick, engine_params

    loaded, work, prompt = bench.loaded, plan.workload, bench.prompt
    cfg, dev = loaded.config, loaded.weights.device
    params, entry["tuning"] = engine_params(plan.tuning, name, len(prompt) + work.gen_len, dev.type)
    if entry["tuning"]:
        doc["device"]["notes"].append(describe_pick(entry["tuning"], name))
    engine = build_engine(name, loaded.weights, bench.max_seq, params=params,
                          prefill=work.prefill if takes_prefill(name) else None)
    say(f"{name}: warm-up")
    first = None
    for w in range(work.warmup):
        res = generate(engine, prompt, work.gen_len, eos_ids=())
        if w == 0:  # the cost of a fresh process, recorded beside the timed figures
            first = first_run_stats(res.token_ms, res.ttft_ms)
    token_ms, ttft, shares, e2e = [], [], [], []
    for r in range(work.runs):
        say(f"{name}: timed run {r + 1}/{work.runs}")
        _sync(dev)
        res = generate(engine, prompt, work.gen_len, SamplingParams(), eos_ids=())
        token_ms += res.token_ms
        ttft.append(res.ttft_ms)
        shares.append(res.decode_share)
        e2e.append(res.total_ms)
    entry["latency"] = latency_stats(token_ms, ttft, [s for s in shares if s is not None], e2e)
    entry["latency"]["first_run"] = first

    dtype_bytes, fmt = loaded.weights.dtype.itemsize, loaded.weights.weight_format
    mean_ctx = len(prompt) + work.gen_len // 2
    traffic = step_traffic(cfg, dtype_bytes, mean_ctx, weights=fmt)
    dev_doc = doc["device"]
    bw = bandwidth(traffic["total_bytes"], entry["latency"]["token_ms_p50"],
                   dev_doc["nvml_peak_GBps"], dev_doc["copy_GBps"])
    entry["bandwidth"] = {"bytes_per_step": traffic["total_bytes"],
                          "kv_bytes_per_step": traffic["kv_read_bytes"] + traffic["kv_write_bytes"],
                          "context": mean_ctx, **bw}

    say(f"{name}: correctness")
    got = teacher_forced_logits(engine, prompt, truth["forced"])
    ref = truth["logits"]
    entry["correctness"] = {"reference": "reference", "steps": int(ref.shape[0]), **logit_agreement(got, ref),
                            **fidelity_entry(got, truth["forced"], truth)}
    if truth.get("unquantized") is not None:  # the quantization's cost, on the same tokens
        entry["correctness"]["vs_unquantized"] = logit_agreement(got, truth["unquantized"])

    say(f"{name}: profiling")
    profile_engine(name, engine, entry, plan, bench)
    if hasattr(engine, "compile_info"):
        entry["compile"] = engine.compile_info()

    for c in work.context_sweep:
        say(f"{name}: context {c}")
        entry["sweep"].append(sweep_point(engine, cfg, c, dtype_bytes, dev_doc, work.seed, fmt))
    del engine


def sweep_point(engine, cfg, context: int, dtype_bytes: int, dev_doc: dict, seed: int,
                weights: str = "bf16") -> dict:
    """Median decode-step time (ms, host wall, token on the host) at ``context`` positions of KV cache, and
    ``ttft_ms``: the time to first token of that generation (the prefill of a ``context``-token prompt, ms).
    ``dtype_bytes``: bytes per weight and KV element; ``dev_doc``: results.json's ``device`` (its NVML peak and
    copy bandwidth, GB/s, for ``util_peak``); the prompt is seeded by ``seed + context``; ``weights``: the weight
    format the bytes are counted in (``profiler.traffic.step_traffic``)."""
    from ..profiler.traffic import bandwidth, step_traffic

    gen = torch.Generator().manual_seed(seed + context)
    prompt = random_ids(cfg.vocab_size, context, gen)
    res = generate(engine, prompt, SWEEP_STEPS + 1, eos_ids=())
    p50 = percentile(res.token_ms, 50)
    traffic = step_traffic(cfg, dtype_bytes, context + SWEEP_STEPS // 2, weights=weights)
    bw = bandwidth(traffic["total_bytes"], p50, dev_doc["nvml_peak_GBps"], dev_doc["copy_GBps"])
    return {"context": context, "token_ms_p50": p50, "ttft_ms": res.ttft_ms,
            "bytes_per_step": traffic["total_bytes"],
            "kv_bytes_per_step": traffic["kv_read_bytes"] + traffic["kv_write_bytes"],
            "effective_GBps": bw["effective_GBps"], "util_peak": bw["util_peak"]}
