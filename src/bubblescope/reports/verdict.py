"""The verdict: what limits the fastest engine and the baseline, in one or two sentences, and one action.

The baseline is the strongest op-by-op rung (:func:`.ladder.best_op_by_op`: the fastest ``reference*`` engine),
what a user without a megakernel can run today; the eager reference's own figure is in the ladder.

A pure function of a results document (like the findings, it reads only the document), shown first in the
terminal and HTML reports. Bottleneck clauses, first that applies:

* a one-kernel step with an intra-kernel timeline (the tables' bubble is its in-kernel wait): the share of
  program-time spent waiting on dependencies and the opcode that waits most (``intrakernel.by_opcode``);
* a GPU timeline with the GPU idle at least 20 % of the step (the one bubble ratio,
  :func:`.ladder.bubble_ratio`): idle share and kernels per step — the launch/bubble regime;
* a bandwidth figure: the share of NVML peak it streams — the memory-bound regime;
* else the latency only (a CPU run has no GPU timeline).

When another engine completes the workload's request much sooner end to end than the fastest by p50
(:data:`REQUEST_SLOWER_MIN`), the verdict says so, with the fastest's mean against its p50.

On a CPU run the megakernel and fused engines time Triton's interpreter (:func:`.ladder.interpreted`): they are
neither the fastest nor the baseline while another engine has a latency, and are compared with none.
"""

from __future__ import annotations

from .findings import SEVERITIES, THRESHOLDS, at_ceiling, in_kernel_advice
from .ladder import GPU_IDLE, IN_KERNEL, best_op_by_op, bubble_ratio, interpreted, is_op_by_op, request_times
from .results import dig, ordered
from ..wording import count

IDLE_MIN = 0.2  # below this share of idle GPU time, bubbles are not what limits an engine
# The fastest engine by p50 whose request takes this factor longer end to end than another engine's is not the
# fastest for a user: its slow steps (recompiles, a heavy tail) outweigh the median; below it, the two orders
# differ by run-to-run noise (CPU runs spread by ±10 % and more).
REQUEST_SLOWER_MIN = 1.2


def _ms(v: float) -> str:
    return f"{v:.3f} ms/token" if v < 10 else f"{v:.1f} ms/token"


def bottleneck(eng: dict, doc: dict) -> str:
    """One clause naming what limits ``eng``, with its evidence in units (%, GB/s, kernels, µs)."""
    if interpreted(eng, doc):
        return "timed under Triton's CPU interpreter, which says nothing of the kernel's speed"
    util, gbps = dig(eng, "bandwidth", "util_peak"), dig(eng, "bandwidth", "effective_GBps")
    stream = f"streams {gbps:,.0f} GB/s ({util:.0%} of NVML peak)" if util is not None and gbps is not None else None
    bubble, source = bubble_ratio(eng)  # the tables' figure: in-kernel wait only for a one-kernel step
    by = dig(eng, "intrakernel", "by_opcode") or []
    if source == IN_KERNEL and by and dig(doc, "device", "type") == "cuda":
        top = max(by, key=lambda r: r.get("wait_us") or 0)
        total = sum(r.get("wait_us") or 0 for r in by)
        most = f", mostly {top['opcode']} ({top['wait_us'] / total:.0%} of the waiting)" if total > 0 else ""
        return f"{bubble:.0%} of program-time waiting on dependencies{most}" + (f"; {stream}" if stream else "")
    kernels = dig(eng, "timeline", "kernels_per_step")
    if bubble is not None and source == GPU_IDLE and bubble >= IDLE_MIN:
        between = f" between {count(kernels, 'kernel', fmt='.0f')}" if kernels is not None else ""
        return f"GPU idle {bubble:.0%} of each step{between}" + (f"; {stream}" if stream else "")
    if stream:
        return ("memory-bound, " if util >= 0.6 else "") + stream + (
            f", GPU idle {bubble:.0%} of the step" if bubble is not None and source == GPU_IDLE else "")
    if dig(doc, "device", "type") != "cuda":
        return "measured on the CPU: no GPU timeline or bandwidth to say more"
    return "no timeline or bandwidth measured"


def _fastest(engines: list[dict]) -> dict | None:
    timed = [e for e in engines if dig(e, "latency", "token_ms_p50") is not None]
    return min(timed, key=lambda e: e["latency"]["token_ms_p50"]) if timed else None


def _action(best: dict, findings: list[dict]) -> str:
    rank = {"problem": 0, "warn": 1, "info": 2}
    own = sorted((f for f in findings if f.get("engine") == best["name"] and f.get("severity") != "info"),
                 key=lambda f: rank.get(f.get("severity"), 3))
    if own:
        return own[0]["advice"]
    util = dig(best, "bandwidth", "util_peak")
    if at_ceiling(best, THRESHOLDS):  # judged against the copy bandwidth measured on this GPU, as near-limit does
        return (f"Decode is at the measured bandwidth ceiling ({best['bandwidth']['util_copy']:.0%} of the copy "
                "bandwidth): only fewer bytes per token (quantized weights, a smaller KV cache) will make it faster.")
    bubble, source = bubble_ratio(best)
    if source == IN_KERNEL and bubble >= IDLE_MIN and util is not None:
        return in_kernel_advice(best)
    if util is not None:
        return "Keep more bytes in flight per SM (bigger tiles, more programs per SM, loads issued ahead)."
    return "Run on a GPU for the timeline and bandwidth numbers that say where the time goes."


def _request_caveat(best: dict, engines: list[dict], doc: dict) -> str:
    """" Per request, X finishes first (...)" when another of ``engines`` completes the workload's request at
    least :data:`REQUEST_SLOWER_MIN` times sooner end to end than ``best`` (the fastest by p50), with ``best``'s
    mean and p50 TPOT, which say why; "" otherwise."""
    e2e = {e["name"]: request_times(e, doc)["e2e_ms"] for e in engines + [best]}
    ours = e2e.get(best["name"])
    timed = [e for e in engines if e2e.get(e["name"]) is not None and e is not best]
    if ours is None or not timed:
        return ""
    quick = min(timed, key=lambda e: e2e[e["name"]])
    if ours < REQUEST_SLOWER_MIN * e2e[quick["name"]]:
        return ""
    lat = best.get("latency") or {}
    mean, p50 = lat.get("token_ms_mean"), lat.get("token_ms_p50")
    why = (f": {best['name']}'s mean TPOT {mean:.3f} ms is {mean / p50:.1f}x its p50, slow steps the median hides"
           if mean is not None and p50 and mean > p50 else "")
    return (f" Per request, {quick['name']} finishes first ({e2e[quick['name']]:,.1f} against {ours:,.1f} ms end "
            f"to end){why}.")


def verdict(doc: dict) -> dict | None:
    """``{"text": one or two sentences, "action": one sentence, "best": name, "baseline": name | None}``,
    or None when no engine has a latency."""
    ok = ordered([e for e in doc.get("engines") or [] if e.get("status") == "ok"])
    # Interpreter timings (a CPU run's megakernel and fused engines) are compared with nothing.
    measured = [e for e in ok if not interpreted(e, doc)]
    best = _fastest(measured) or _fastest(ok)
    if best is None:
        return None
    p50 = best["latency"]["token_ms_p50"]
    rest = [e for e in measured if e is not best and dig(e, "latency", "token_ms_p50") is not None]
    # The baseline is the strongest op-by-op engine (what users without a megakernel run); when an op-by-op engine
    # is itself the fastest, it is compared with the fastest of the others (a megakernel), else the slowest.
    base = best_op_by_op(rest) if not is_op_by_op(best) else None
    if base is None:
        others = [e for e in rest if not is_op_by_op(e)] or rest
        base = min(others, key=lambda e: e["latency"]["token_ms_p50"]) if others else None
    base_p50 = dig(base, "latency", "token_ms_p50") if base else None
    speed = f", {base_p50 / p50:.2f}x faster than {base['name']}" if base_p50 else ""
    text = f"Fastest: {best['name']} at {_ms(p50)}{speed}: {bottleneck(best, doc)}."
    if base is not None:
        b = f" at {_ms(base_p50)}" if base_p50 else ""
        # When an op-by-op engine is itself the fastest, the engine it is compared with is no baseline.
        label = "Baseline (best op-by-op)" if not is_op_by_op(best) and is_op_by_op(base) else "Compared with"
        why = bottleneck(base, doc)
        text += f" {label} {base['name']}{b}" + (f": {why}." if why != bottleneck(best, doc) else ".")
    text += _request_caveat(best, measured, doc)
    return {"text": text, "action": _action(best, doc.get("findings") or []), "best": best["name"],
            "baseline": base["name"] if base else None}


def severity_legend() -> list[tuple[str, str]]:
    """``(severity, meaning)`` pairs, most severe first."""
    return list(SEVERITIES.items())
