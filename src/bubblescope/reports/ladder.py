"""The ablation ladder of a results document, and the figures every report and finding shares with it.

Pure functions of a results document (like :mod:`.findings` and :mod:`.verdict`), so the tables, the findings,
the verdict and the gate all read the same numbers:

* :func:`bubble_ratio` — the one bubble ratio of an engine. A step of one kernel (a megakernel) keeps the GPU
  "busy" for the whole kernel, so its idle share would only count the host's gaps between steps (the profiled
  run reads each token before it launches the next; the timed runs launch ahead): for it, the bubble is the
  in-kernel dependency wait from the megakernel's own clock (``intrakernel.wait_ratio``). Every other engine's is
  the GPU's idle share of the timed step (:func:`gpu_idle_ratio`), split by cause in :func:`idle_parts`.
* :func:`best_op_by_op` — the strongest op-by-op rung: the fastest ``reference*`` engine that ran.
* :func:`ladder` — one row per rung (eager → CUDA graph → compile → fused → fused + PDL → megakernel without
  prefetch → megakernel): ms/token, % of peak, kernels per step, bubble ratio, the mechanism the rung removes,
  the step in µs from the rung below that ran, and its numerical fidelity against an fp32 run.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from .results import dig

# (engine, label, what the rung removes compared with the rung below it). The megakernel rung is also filled by
# the implementation named on the command line when `megakernel` itself did not run.
RUNGS: tuple[tuple[str, str, str], ...] = (
    ("reference", "eager", "baseline (a launch per op)"),
    ("reference-cudagraph", "CUDA graph", "Python/launch overhead"),
    ("reference-compile", "compile", "per-op traffic (inductor)"),
    ("reference-fused", "fused", "per-op traffic (hand-fused)"),
    ("reference-fused-pdl", "fused + PDL", "inter-kernel drain and fill"),
    ("megakernel-noprefetch", "megakernel without prefetch", "kernel boundaries (one kernel)"),
    # The prefetch hides the wait rather than shortening it: the programs' waiting share may rise as the step
    # gets shorter, so the rung names the stall of the weight stream, not the wait.
    ("megakernel", "megakernel", "weight loads stalled behind dependency waits"),
)
_MEGAKERNEL_STAND_INS = ("megakernel-gluon", "megakernel-triton")
OP_BY_OP_PREFIX = "reference"
# Engines whose decode step is Triton kernels: off CUDA they run under Triton's CPU interpreter.
TRITON_PREFIXES = ("megakernel", "reference-fused")
IN_KERNEL, GPU_IDLE = "in-kernel wait", "GPU idle"

# Numerical fidelity: an engine is "matched" when, on the same teacher-forced tokens, its KL divergence from the
# fp32 run is at most the run-dtype reference's own times KL_REL (plus KL_ABS nats, the floor that float32 runs,
# whose reference KL is 0, need) and its NLL at most the reference's plus NLL_ABS nats per token. Our choice: a
# quarter above the reference's KL and 0.01 nat/token are well under what a real precision loss costs (bf16
# against fp32 logits) and above the run-to-run spread of two kernels accumulating in another order.
FIDELITY_TOLERANCE: Mapping[str, float] = MappingProxyType({"kl_rel": 1.25, "kl_abs": 1e-6, "nll_abs": 0.01})


def is_op_by_op(eng: dict) -> bool:
    """Whether ``eng`` (an engine entry) is an op-by-op engine: the ``reference`` family (eager, graphed, compiled,
    fused)."""
    return str(eng.get("name", "")).startswith(OP_BY_OP_PREFIX)


def interpreted(eng: dict, doc: dict) -> bool:
    """Whether ``eng`` (an engine entry of ``doc``) ran its Triton kernels under Triton's CPU interpreter: a
    megakernel or fused engine (:data:`TRITON_PREFIXES`) of a run whose ``device.type`` is not ``cuda``. Its
    latency measures the interpreter, not the kernel, so it is no yardstick for another engine."""
    return dig(doc, "device", "type") != "cuda" and str(eng.get("name", "")).startswith(TRITON_PREFIXES)


def one_kernel_step(eng: dict) -> bool:
    """Whether the profiled decode step of ``eng`` ran one kernel (``timeline.kernels_per_step`` is 1)."""
    kernels = dig(eng, "timeline", "kernels_per_step")
    return kernels is not None and kernels <= 1


def bubble_ratio(eng: dict) -> tuple[float | None, str | None]:
    """The one bubble ratio of ``eng`` (a fraction) and where it comes from.

    Returns:
        ``(intrakernel.wait_ratio, "in-kernel wait")`` for a step of one kernel with the megakernel's own timeline
        (program-time spent waiting on dependencies / program-time, docs/design.md, ``intrakernel_wait_ratio``);
        else ``(gpu_idle_ratio(eng), "GPU idle")`` (:func:`gpu_idle_ratio`: the idle share of the timed step);
        ``(None, None)``
        when neither was measured (a CPU run has no GPU timeline).
    """
    wait = dig(eng, "intrakernel", "wait_ratio")
    if wait is not None and one_kernel_step(eng):
        return wait, IN_KERNEL
    idle = gpu_idle_ratio(eng)
    return (idle, GPU_IDLE) if idle is not None else (None, None)


def gpu_idle_ratio(eng: dict) -> float | None:
    """The GPU's idle share of the timed decode step (a fraction): 1 − ``timeline.gpu_busy_us_per_step`` (µs, the
    profiled steps' union of GPU activity) / :func:`step_us` (µs, the timed p50), clipped to [0, 1]; the profiled
    window's own ``timeline.bubble_ratio`` where either is missing; None where that is missing too.

    Why not the profiled window's ratio alone: the profiler adds a cost to every launch on the host, so a
    host-bound engine's profiled step is longer than its timed one (an eager reference on an H200: 27.1 ms
    profiled against a 10.8 ms p50) while the GPU's busy time per step barely moves; that ratio applied to the
    timed step would put more µs of idle in it than the step has beside the GPU's work.
    """
    busy, step = dig(eng, "timeline", "gpu_busy_us_per_step"), step_us(eng)
    if busy is not None and step is not None and step > 0:
        return round(min(max(1.0 - busy / step, 0.0), 1.0), 6)  # 6 decimals: no float noise in the JSON
    return dig(eng, "timeline", "bubble_ratio")


def idle_parts(eng: dict) -> dict | None:
    """:func:`bubble_us` of a "GPU idle" engine split by cause, µs per timed step: ``{"host_wait_us",
    "kernel_wait_us", "other_us"}`` (the causes of ``timeline.idle``, docs/design.md), summing to
    :func:`bubble_us`; None for an in-kernel bubble or where a figure is missing.

    The profiled run's split is carried over to the timed step on the assumption that the profiler's cost is the
    host's: the gaps between kernels already queued (``kernel_wait_us``) and the other gaps keep their µs (cut to
    what the timed step has), and waiting for the host takes the rest.
    """
    lost, source = bubble_us(eng), bubble_ratio(eng)[1]
    idle = dig(eng, "timeline", "idle") or {}
    host, gaps, other = (idle.get(k) for k in ("host_wait_us", "kernel_wait_us", "other_us"))
    if lost is None or source != GPU_IDLE or None in (host, gaps):
        return None
    gaps = min(gaps, lost)
    other = min(other or 0.0, lost - gaps)
    return {"host_wait_us": lost - gaps - other, "kernel_wait_us": gaps, "other_us": other}


def step_us(eng: dict) -> float | None:
    """The engine's decode step in µs: its median ms/token (``latency.token_ms_p50``) × 1000."""
    p50 = dig(eng, "latency", "token_ms_p50")
    return None if p50 is None else p50 * 1e3


def bubble_us(eng: dict) -> float | None:
    """µs of each step lost to bubbles: :func:`bubble_ratio` × :func:`step_us`; None when either is unknown."""
    ratio, step = bubble_ratio(eng)[0], step_us(eng)
    return None if ratio is None or step is None else ratio * step


def request_times(eng: dict, doc: dict) -> dict:
    """The workload's request on ``eng`` (prompt P tokens, then ``workload.gen_len`` = n new tokens), in ms.

    Returns:
        ``{"ttft_ms"`` (time to the first token: prefill and its sampling, ``latency.ttft_ms``), ``"tpot_p50_ms"``,
        ``"tpot_p99_ms"`` (time per output token after the first: ``latency.token_ms_p50`` / ``_p99``),
        ``"e2e_ms"`` (the measured generation time, ``latency.e2e_ms``, median over the timed runs; in documents
        without it, TTFT + (n − 1) × TPOT p50), ``"e2e_measured"`` (which of the two), ``"decode_ms"`` (e2e −
        TTFT: the n − 1 decode steps)``}``; None where an input is missing.
    """
    lat = (eng or {}).get("latency") or {}
    ttft, p50, p99 = lat.get("ttft_ms"), lat.get("token_ms_p50"), lat.get("token_ms_p99")
    e2e, measured = lat.get("e2e_ms"), lat.get("e2e_ms") is not None
    n = dig(doc, "workload", "gen_len")
    if e2e is None and None not in (ttft, p50) and isinstance(n, int) and n >= 1:
        e2e = ttft + (n - 1) * p50
    return {"ttft_ms": ttft, "tpot_p50_ms": p50, "tpot_p99_ms": p99, "e2e_ms": e2e, "e2e_measured": measured,
            "decode_ms": None if e2e is None or ttft is None else max(e2e - ttft, 0.0)}


def _timed(engines: list[dict]) -> list[dict]:
    return [e for e in engines if e.get("status") == "ok" and dig(e, "latency", "token_ms_p50") is not None]


def best_op_by_op(engines: list[dict]) -> dict | None:
    """The strongest op-by-op rung: the ``ok`` ``reference*`` engine of ``engines`` with the lowest
    ``latency.token_ms_p50`` (the first in the list on a tie); None when none was timed."""
    refs = [e for e in _timed(engines) if is_op_by_op(e)]
    return min(refs, key=lambda e: e["latency"]["token_ms_p50"]) if refs else None


def megakernel_rung(engines: list[dict]) -> dict | None:
    """The engine entry on the megakernel rung: ``megakernel``, else the fastest of the implementations named
    by hand (``megakernel-gluon``, ``megakernel-triton``) that ran; None when none is in ``engines``."""
    by_name = {e.get("name"): e for e in engines}
    if "megakernel" in by_name:
        return by_name["megakernel"]
    stand_ins = [by_name[n] for n in _MEGAKERNEL_STAND_INS if n in by_name]
    timed = _timed(stand_ins)
    if timed:
        return min(timed, key=lambda e: e["latency"]["token_ms_p50"])
    return stand_ins[0] if stand_ins else None


def fidelity_matched(kl: float | None, nll: float | None, ref_kl: float | None, ref_nll: float | None,
                     tolerance: Mapping[str, float] = FIDELITY_TOLERANCE) -> bool | None:
    """Whether an engine's KL divergence from the fp32 run (``kl``, nats, mean over positions) and its NLL of the
    token history (``nll``, nats/token) are no worse than the run-dtype reference's (``ref_kl``, ``ref_nll``)
    within :data:`FIDELITY_TOLERANCE`; None when any input is missing."""
    if None in (kl, nll, ref_kl, ref_nll):
        return None
    return bool(kl <= ref_kl * tolerance["kl_rel"] + tolerance["kl_abs"]
                and nll <= ref_nll + tolerance["nll_abs"])


def _row(engine: str, label: str, mechanism: str, eng: dict | None) -> dict:
    status = eng.get("status") if eng else "not run"
    reason = eng.get("reason") if eng else "not in this run (name it in --engines)"
    ratio, source = bubble_ratio(eng) if eng and status == "ok" else (None, None)
    c = (eng or {}).get("correctness") or {}
    ok = status == "ok"
    return {"engine": (eng or {}).get("name", engine), "rung": label, "removes": mechanism, "status": status,
            "reason": None if ok else reason,
            "token_ms_p50": dig(eng, "latency", "token_ms_p50") if ok else None,
            "util_peak": dig(eng, "bandwidth", "util_peak") if ok else None,
            "kernels_per_step": dig(eng, "timeline", "kernels_per_step") if ok else None,
            "bubble_ratio": ratio, "bubble_source": source,
            "bubble_us": bubble_us(eng) if ok else None, "idle_us": idle_parts(eng) if ok else None,
            "below": None, "step_us": None,
            "kl_vs_fp32": c.get("kl_vs_fp32") if ok else None, "nll": c.get("nll") if ok else None,
            "fidelity_matched": c.get("fidelity_matched") if ok else None}


def ladder(doc: dict) -> list[dict]:
    """One row per rung of :data:`RUNGS`, eager first, of a results document.

    Each row: ``engine``, ``rung`` (its label), ``removes`` (the mechanism it removes compared with the rung
    below), ``status`` (``ok``, ``skipped``, ``failed``, or ``not run`` when the engine is not in the document),
    ``reason`` (why it did not run; None when ok), ``token_ms_p50`` (ms), ``util_peak`` (fraction of NVML peak),
    ``kernels_per_step``, ``bubble_ratio`` and ``bubble_source`` (:func:`bubble_ratio`), ``bubble_us`` (µs of
    the step), ``idle_us`` (a "GPU idle" bubble's µs by cause, :func:`idle_parts`; None otherwise), ``below``
    (the nearest rung beneath that was timed) and ``step_us`` (its p50 minus this one's, in µs: how much this
    rung's mechanism saved; negative when this rung is slower), ``kl_vs_fp32`` (nats), ``nll`` (nats/token) and
    ``fidelity_matched`` (from ``correctness``). Values not measured are None.
    """
    engines = doc.get("engines") or []
    by_name = {e.get("name"): e for e in engines}
    rows = []
    below = None
    for engine, label, mechanism in RUNGS:
        eng = megakernel_rung(engines) if engine == "megakernel" else by_name.get(engine)
        row = _row(engine, label, mechanism, eng)
        if row["token_ms_p50"] is not None:
            if below is not None:
                row["below"] = below["engine"]
                row["step_us"] = (below["token_ms_p50"] - row["token_ms_p50"]) * 1e3
            below = row
        rows.append(row)
    return rows
