"""Findings about one engine against another, read off the ablation ladder (:mod:`.ladder`): the megakernel
against the strongest op-by-op rung, and a rung slower than the one below it. GPU runs only: a CPU run times the
Triton interpreter, whose megakernel says nothing about the kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .finding_base import engine_finding as _finding
from .finding_base import rounded as _round
from .ladder import best_op_by_op, bubble_us, ladder, megakernel_rung
from .results import dig


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
                "speedup_over_best_op_by_op": round(best_ms / mk_ms, 4),
                "step_saved_us": _round((best_ms - mk_ms) * 1e3),
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


# Rules of the whole document, run after the engines' own (findings.find).
DOC_RULES: tuple[Callable[[dict, Mapping[str, float]], list[dict]], ...] = (_megakernel_lead, _rung_slower)
