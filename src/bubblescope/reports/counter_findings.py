"""Findings from the hardware counters of ``diagnose model --counters`` (the document's ``counters`` section,
read by Nsight Compute on the profiled engine's top kernel).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .finding_base import engine_finding as _finding


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


COUNTER_RULES: tuple[Callable[[dict, dict, Mapping[str, float]], dict | None], ...] = (
    _counters_occupancy, _counters_memory)
