"""Inside one megakernel step: what its programs do, the weight stream's estimated bandwidth against the NVML peak,
and a Gantt of a few programs at full resolution, from the kernel's own task timestamps (``intrakernel``).

Pure, like :mod:`.plots`: each function reads an engine entry and returns a new Figure, a list or a sentence.
"""

from __future__ import annotations

import textwrap

from . import palette
from .figure_base import bars, label, legend, new_figure
from ..wording import count

_WAIT_COLOUR = palette.WAIT
GANTT_PROGRAMS = 6
_IDLE_COLOUR = palette.IDLE


def chosen_programs(tasks: list[dict], k: int = GANTT_PROGRAMS) -> list[int]:
    """Up to ``k`` programs worth drawing at full resolution: the one that waits most, the one that waits
    least, the median, then others evenly spread, in program order."""
    waits: dict[int, float] = {}
    for t in tasks:
        waits[t["program"]] = waits.get(t["program"], 0.0) + max(t["ready_us"] - t["start_us"], 0.0)
    by_wait = sorted(waits, key=lambda p: (waits[p], p))
    picks = [by_wait[-1], by_wait[0], by_wait[len(by_wait) // 2]]
    spread = sorted(waits)
    picks += [spread[round(i * (len(spread) - 1) / max(k - 1, 1))] for i in range(k)]
    return sorted(list(dict.fromkeys(picks))[:k]) if len(waits) > k else sorted(waits)


def intrakernel_figure(engine: dict, device: dict | None = None):
    """Inside one megakernel step, three panels on one µs axis.

    (a) What the programs do: stacked area of the mean share of programs busy on each opcode, waiting on a
    dependency, or idle (``intrakernel.activity``; without it, computed from the sampled ``tasks``).
    (b) Weight-streaming bandwidth estimated from the tasks' bytes and timestamps (``activity.GBps``, GB/s)
    against the NVML peak, when both are known — the bubble in the memory pipeline. Where the estimate rises above
    the peak (:func:`bandwidth_over_peak`), the panel says so in words: the estimate spreads each task's bytes over
    its own start → end, so tasks whose loads were issued earlier (prefetch) pile up in a short window.
    (c) A Gantt of a few chosen programs (:func:`chosen_programs`) at full resolution: wait (grey) then
    busy (opcode colour) per task, with its own legend, the programs on the y axis and the time unit on the x axis.
    Colours are :mod:`.palette`'s. Legends sit outside the data. Returns None without task timestamps.
    """
    from .intrakernel import IDLE, WAITING, activity_profile

    ik = engine.get("intrakernel") or {}
    tasks = ik.get("tasks") or []
    act = ik.get("activity") or (activity_profile(tasks) if tasks else None)
    if not tasks and not act:
        return None
    opcodes = [s for s in (act["states"] if act else {}) if s not in (WAITING, IDLE)]
    opcodes += sorted({str(t["opcode"]) for t in tasks} - set(opcodes))
    colours = palette.colours(opcodes, palette.opcode_colour)
    peak = (device or {}).get("nvml_peak_GBps")
    has_bw = bool(act and act.get("GBps"))
    picks = chosen_programs(tasks) if tasks else []
    # Interpreter runs last seconds: label in ms then, so the axis never needs a "1e6" offset.
    span_us = (act["bin_us"] * len(act["t_us"])) if act else max(t["end_us"] for t in tasks)
    unit, scale = ("ms", 1e-3) if span_us >= 10_000 else ("µs", 1.0)
    heights = [3.0] + ([2.0] if has_bw else []) + ([0.5 + 0.4 * len(picks)] if picks else [])
    fig, axes = new_figure(1.0 + sum(heights) * 0.9, rows=len(heights), sharex=True,
                            gridspec_kw={"height_ratios": heights})
    ax = axes[0]
    if act:
        t = [(x + act["bin_us"] / 2) * scale for x in act["t_us"]]
        n = act["programs"] or 1
        layers = [(op, colours[op]) for op in opcodes if op in act["states"]] + [
            (WAITING, _WAIT_COLOUR), (IDLE, _IDLE_COLOUR)]
        ax.stackplot(t, *[[100 * v / n for v in act["states"][name]] for name, _ in layers],
                     colors=[c for _, c in layers], labels=[label(f"busy: {op}") if op not in (WAITING, IDLE)
                                                             else ("waiting on a dependency" if op == WAITING
                                                                   else "idle (no task)") for op, _ in layers],
                     linewidth=0)
        ax.set_ylim(0, 100)
        ax.set_ylabel(f"% of {count(n, 'program')}")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title(f"{label(engine['name'])}: (a) what the programs do over one step", fontsize=9, loc="left")
    row = 1
    if has_bw:
        bw_ax = axes[row]
        row += 1
        t = [(x + act["bin_us"] / 2) * scale for x in act["t_us"]]
        bw_ax.plot(t, act["GBps"], color="#4c72b0", linewidth=1.2, label="weights + KV streamed (estimate)")
        if peak:
            bw_ax.axhline(peak, color=palette.LIMIT, linestyle="--", label=f"NVML peak {peak:,.0f} GB/s")
        bw_ax.set_ylabel("GB/s")
        bw_ax.set_ylim(bottom=0)
        bw_ax.grid(alpha=0.3)
        over = bandwidth_over_peak(act, peak)  # said in the title, over no data
        bw_ax.set_title("(b) weight-streaming bandwidth, from the tasks' bytes and timestamps"
                        + ("\n" + "\n".join(textwrap.wrap(over, 110)) if over else ""), fontsize=9, loc="left",
                        color="black")
        bw_ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    if picks:
        g_ax = axes[row]
        t0 = min(t["start_us"] for t in tasks)
        rows = {p: i for i, p in enumerate(picks)}
        shown = [t for t in tasks if t["program"] in rows]
        bars(g_ax, [(t["start_us"] - t0) * scale for t in shown],
              [max(t["ready_us"] - t["start_us"], 0) * scale for t in shown],
              [rows[t["program"]] - 0.4 for t in shown], 0.8, [_WAIT_COLOUR] * len(shown))
        bars(g_ax, [(t["ready_us"] - t0) * scale for t in shown],
              [max(t["end_us"] - t["ready_us"], 0) * scale for t in shown],
              [rows[t["program"]] - 0.4 for t in shown], 0.8, [colours[str(t["opcode"])] for t in shown])
        g_ax.set_yticks(range(len(picks)), [f"program {p}" for p in picks], fontsize=8)
        g_ax.set_ylim(len(picks) - 0.5, -0.5)
        g_ax.set_ylabel("program", fontsize=8)
        g_ax.set_title(f"(c) {len(picks)} chosen program{'s' if len(picks) > 1 else ''} at full resolution "
                       "(most, least and median waiting): each task's wait, then its work",
                       fontsize=9, loc="left")
        used = [op for op in opcodes if any(str(t["opcode"]) == op for t in shown)]
        legend(g_ax, {"waiting on a dependency": _WAIT_COLOUR, **{f"busy: {op}": colours[op] for op in used}},
                loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        g_ax.grid(alpha=0.3, axis="x")
    axes[-1].set_xlabel(f"{unit} since the step's first task")
    return fig


def bandwidth_over_peak(act: dict | None, peak: float | None) -> str | None:
    """The sentence panel (b) shows when its estimated bandwidth (``activity.GBps``, GB/s) rises above the NVML
    ``peak`` (GB/s), e.g. ``"The estimate exceeds the NVML peak in 3 of 40 bins (at most 5,210 GB/s, 1.08x the
    peak): ..."``; None when it stays at or below it, or either is unknown. HBM cannot deliver more than its peak,
    so the excess is the estimate's: it spreads each task's bytes evenly over that task's start → end, and bytes
    a task's loads brought in earlier (prefetched, or still in L2) land in too short a window."""
    gbps = [v for v in (act or {}).get("GBps") or [] if v is not None]
    if not peak or not gbps or max(gbps) <= peak:
        return None
    over = sum(v > peak for v in gbps)
    return (f"The estimate exceeds the NVML peak in {over} of {count(len(gbps), 'bin')} (at most {max(gbps):,.0f} "
            f"GB/s, {max(gbps) / peak:.2f}x the peak): HBM cannot, so there the estimate is too high; it spreads "
            "each task's bytes over the task's own start → end, and bytes loaded earlier (prefetched, or in L2) "
            "land in too short a window.")
