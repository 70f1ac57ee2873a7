"""Figures of a results document, built on ``matplotlib.figure.Figure`` with the Agg canvas.

Each ``*_figure`` function is pure: it reads engine entries and returns a new Figure, or None when
the document holds nothing to draw (the report then says "not measured"). No pyplot, so no global
figure registry and no backend switching; matplotlib is imported on first use, not at import.
"""

from __future__ import annotations

import io

from .results import dig, ordered
from ..wording import count

_DPI = 100
_SAVE_DPI = 200  # high-DPI PNG: sharp on a 2x screen and when zoomed
_WIDTH_IN = 10.0
_WAIT_COLOUR = "#a0a0a0"


def _new_figure(height_in: float, rows: int = 1, cols: int = 1, **subplot_kw):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(_WIDTH_IN, height_in), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False, **subplot_kw)
    return fig, [ax for row in axes for ax in row]


def _label(text) -> str:
    # Names come from traces; a "$" would switch matplotlib into mathtext.
    return str(text).replace("$", r"\$")


def _palette(names) -> dict:
    from matplotlib import colormaps

    cmap = colormaps["tab20" if len(names) > 10 else "tab10"]
    return {name: cmap(i % cmap.N) for i, name in enumerate(names)}


def _bars(ax, left, width, y, height, colours) -> None:
    """Draw many rectangles as one collection (thousands of tasks stay fast)."""
    from matplotlib.collections import PolyCollection

    verts = [((x, b), (x + w, b), (x + w, b + height), (x, b + height)) for x, w, b in zip(left, width, y)]
    ax.add_collection(PolyCollection(verts, facecolors=colours, edgecolors="none", linewidths=0))
    ax.autoscale_view()


def _legend(ax, colours: dict, **kw) -> None:
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=c, label=_label(n)) for n, c in colours.items()], fontsize=8, **kw)


def figure_png(fig) -> bytes:
    """Render a Figure to PNG bytes (Agg)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_SAVE_DPI)
    return buf.getvalue()


def step_timeline_figure(engines: list[dict]):
    """One decode step per engine (``timeline.step_timeline``), on a shared µs axis from step start.

    Rows per engine: one per GPU stream (kernels coloured by category) and one for CPU launch calls.
    Returns None when no engine has a step timeline.
    """
    steps = [(e, e["timeline"]["step_timeline"]) for e in ordered(engines)
             if dig(e, "timeline", "step_timeline") and (e["timeline"]["step_timeline"].get("kernels")
                                                         or e["timeline"]["step_timeline"].get("launches"))]
    if not steps:
        return None
    colours = _palette(sorted({k["category"] for _, st in steps for k in st.get("kernels") or []}))
    heights = [1 + len({k["stream"] for k in st.get("kernels") or []}) for _, st in steps]
    fig, axes = _new_figure(0.9 + 0.45 * sum(heights) + 0.35 * len(steps), rows=len(steps), sharex=True,
                            gridspec_kw={"height_ratios": heights})
    for ax, (eng, st) in zip(axes, steps):
        kernels, launches = st.get("kernels") or [], st.get("launches") or []
        t0 = min(ev["start_us"] for ev in kernels + launches)
        streams = sorted({k["stream"] for k in kernels}, key=str)
        rows = ["CPU launches"] + [f"GPU stream {s}" for s in streams]
        for row, s in enumerate(streams, start=1):
            ks = [k for k in kernels if k["stream"] == s]
            _bars(ax, [k["start_us"] - t0 for k in ks], [k["dur_us"] for k in ks], [row - 0.4] * len(ks), 0.8,
                  [colours[k["category"]] for k in ks])
        _bars(ax, [c["start_us"] - t0 for c in launches], [c["dur_us"] for c in launches],
              [-0.4] * len(launches), 0.8, ["#555555"] * len(launches))
        ax.set_yticks(range(len(rows)), [_label(r) for r in rows], fontsize=8)
        ax.set_ylim(-0.6, len(rows) - 0.4)
        ax.invert_yaxis()
        ax.set_title(_label(eng["name"]), fontsize=9, loc="left")
    axes[-1].set_xlabel("µs since the step's first event")
    if colours:
        _legend(axes[0], colours, loc="lower right", bbox_to_anchor=(1, 1), frameon=False,
                ncol=min(len(colours), 6))
    return fig


def ladder_figure(engines: list[dict], device: dict):
    """The ablation ladder: ms/token p50 per engine, with the bandwidth floors as vertical lines.

    Floors are ``bytes_per_step / bandwidth`` at the NVML peak and at the measured copy bandwidth,
    drawn when both are known (docs/design.md, "effective_bandwidth"). Returns None without any p50.
    """
    rows = [e for e in ordered(engines) if dig(e, "latency", "token_ms_p50") is not None]
    if not rows:
        return None
    fig, (ax,) = _new_figure(1.2 + 0.4 * len(rows))
    p50 = [e["latency"]["token_ms_p50"] for e in rows]
    ax.barh(range(len(rows)), p50, color="#4c72b0")
    for i, v in enumerate(p50):
        ax.annotate(f"{v:.3f} ms", (v, i), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [_label(e["name"]) for e in rows], fontsize=8)
    ax.invert_yaxis()
    nbytes = next((dig(e, "bandwidth", "bytes_per_step") for e in rows if dig(e, "bandwidth", "bytes_per_step")), None)
    for key, what, style in (("nvml_peak_GBps", "NVML peak", "--"), ("copy_GBps", "measured copy", ":")):
        gbps = (device or {}).get(key)
        if nbytes and gbps:
            floor_ms = nbytes / (gbps * 1e9) * 1e3
            ax.axvline(floor_ms, color="#c44e52", linestyle=style, label=f"floor at {what}: {floor_ms:.3f} ms")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=2, frameon=False)
    else:
        ax.set_title("no bandwidth floors: the device's bandwidth is unknown (CPU run)", fontsize=8, loc="left")
    ax.set_xlabel("ms per token (p50)")
    ax.set_xlim(0, max(p50) * 1.18)
    return fig


def categories_figure(engines: list[dict]):
    """Share of GPU time per kernel category (``timeline.categories``), one stacked bar per engine."""
    rows = [e for e in ordered(engines) if dig(e, "timeline", "categories")]
    if not rows:
        return None
    colours = _palette(sorted({c["category"] for e in rows for c in e["timeline"]["categories"]}))
    fig, (ax,) = _new_figure(1.4 + 0.4 * len(rows))
    for i, eng in enumerate(rows):
        left = 0.0
        for cat in sorted(eng["timeline"]["categories"], key=lambda c: c["category"]):
            ax.barh(i, cat["share"] * 100, left=left, color=colours[cat["category"]])
            left += cat["share"] * 100
    ax.set_yticks(range(len(rows)), [_label(e["name"]) for e in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of GPU kernel time")
    _legend(ax, colours, loc="upper center", bbox_to_anchor=(0.5, -0.35 - 0.1 / len(rows)),
            ncol=min(len(colours), 6))
    return fig


def latency_figure(engines: list[dict]):
    """Distribution of per-token latency (``latency.token_ms_samples``) as one ECDF per engine."""
    rows = [e for e in ordered(engines) if dig(e, "latency", "token_ms_samples")]
    if not rows:
        return None
    fig, (ax,) = _new_figure(3.2)
    for eng in rows:
        xs = sorted(eng["latency"]["token_ms_samples"])
        ys = [100 * (i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=_label(eng["name"]))
    samples = [x for e in rows for x in e["latency"]["token_ms_samples"] if x > 0]
    if samples and max(samples) / min(samples) >= 10:  # engines a decade apart: a linear axis crushes the fast ones
        ax.set_xscale("log")
    ax.set_xlabel("ms per token" + (" (log scale)" if ax.get_xscale() == "log" else ""))
    ax.set_ylabel("% of tokens at or below")
    ax.set_ylim(0, 101)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return fig


def sweep_figure(engines: list[dict], device: dict):
    """Effective GB/s and ms/token p50 against context length (``sweep``), NVML peak and copy marked."""
    rows = [e for e in ordered(engines) if any(r.get("token_ms_p50") is not None for r in e.get("sweep") or [])]
    if not rows:
        return None
    fig, (bw_ax, ms_ax) = _new_figure(3.4 + 0.25 * ((len(rows) + 2) // 4), cols=2)
    for eng in rows:
        pts = sorted(eng["sweep"], key=lambda r: r["context"])
        bw = [(r["context"], r["effective_GBps"]) for r in pts if r.get("effective_GBps") is not None]
        ms = [(r["context"], r["token_ms_p50"]) for r in pts if r.get("token_ms_p50") is not None]
        if bw:
            bw_ax.plot(*zip(*bw), marker="o", label=_label(eng["name"]))
        ms_ax.plot(*zip(*ms), marker="o", label=_label(eng["name"]))
    for key, what, style in (("nvml_peak_GBps", "NVML peak", "--"), ("copy_GBps", "measured copy", ":")):
        if (device or {}).get(key):
            bw_ax.axhline(device[key], color="#c44e52", linestyle=style, label=what)
    for ax, ylabel in ((bw_ax, "effective GB/s"), (ms_ax, "ms per token (p50)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length (tokens)")
        ys = [y for line in ax.get_lines() for y in line.get_ydata() if y > 0]
        if ys and max(ys) / min(ys) >= 10:  # one slow engine would flatten every other line
            ax.set_yscale("log")
            ylabel += " (log scale)"
        else:
            ax.set_ylim(bottom=0)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
    handles, labels = bw_ax.get_legend_handles_labels()
    if handles:  # one legend for both panels, below them: never over the data
        fig.legend(handles, labels, fontsize=8, loc="outside lower center", ncol=min(len(handles), 4), frameon=False)
    return fig


GANTT_PROGRAMS = 6
_IDLE_COLOUR = "#ececec"


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
    against the NVML peak, when both are known — the bubble in the memory pipeline.
    (c) A Gantt of a few chosen programs (:func:`chosen_programs`) at full resolution: wait (grey) then
    busy (opcode colour) per task. Legends sit outside the data. Returns None without task timestamps.
    """
    from ..profiler.intrakernel import IDLE, WAITING, activity_profile

    ik = engine.get("intrakernel") or {}
    tasks = ik.get("tasks") or []
    act = ik.get("activity") or (activity_profile(tasks) if tasks else None)
    if not tasks and not act:
        return None
    opcodes = [s for s in (act["states"] if act else {}) if s not in (WAITING, IDLE)]
    opcodes += sorted({str(t["opcode"]) for t in tasks} - set(opcodes))
    colours = _palette(opcodes)
    peak = (device or {}).get("nvml_peak_GBps")
    has_bw = bool(act and act.get("GBps"))
    picks = chosen_programs(tasks) if tasks else []
    # Interpreter runs last seconds: label in ms then, so the axis never needs a "1e6" offset.
    span_us = (act["bin_us"] * len(act["t_us"])) if act else max(t["end_us"] for t in tasks)
    unit, scale = ("ms", 1e-3) if span_us >= 10_000 else ("µs", 1.0)
    heights = [3.0] + ([2.0] if has_bw else []) + ([0.5 + 0.4 * len(picks)] if picks else [])
    fig, axes = _new_figure(1.0 + sum(heights) * 0.9, rows=len(heights), sharex=True,
                            gridspec_kw={"height_ratios": heights})
    ax = axes[0]
    if act:
        t = [(x + act["bin_us"] / 2) * scale for x in act["t_us"]]
        n = act["programs"] or 1
        layers = [(op, colours[op]) for op in opcodes if op in act["states"]] + [
            (WAITING, _WAIT_COLOUR), (IDLE, _IDLE_COLOUR)]
        ax.stackplot(t, *[[100 * v / n for v in act["states"][name]] for name, _ in layers],
                     colors=[c for _, c in layers], labels=[_label(f"busy: {op}") if op not in (WAITING, IDLE)
                                                             else ("waiting on a dependency" if op == WAITING
                                                                   else "idle (no task)") for op, _ in layers],
                     linewidth=0)
        ax.set_ylim(0, 100)
        ax.set_ylabel(f"% of {count(n, 'program')}")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title(f"{_label(engine['name'])}: (a) what the programs do over one step", fontsize=9, loc="left")
    row = 1
    if has_bw:
        bw_ax = axes[row]
        row += 1
        t = [(x + act["bin_us"] / 2) * scale for x in act["t_us"]]
        bw_ax.plot(t, act["GBps"], color="#4c72b0", linewidth=1.2, label="weights + KV streamed (estimate)")
        if peak:
            bw_ax.axhline(peak, color="#c44e52", linestyle="--", label=f"NVML peak {peak:,.0f} GB/s")
        bw_ax.set_ylabel("GB/s")
        bw_ax.set_ylim(bottom=0)
        bw_ax.grid(alpha=0.3)
        bw_ax.set_title("(b) weight-streaming bandwidth, from the tasks' bytes and timestamps", fontsize=9, loc="left")
        bw_ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    if picks:
        g_ax = axes[row]
        t0 = min(t["start_us"] for t in tasks)
        rows = {p: i for i, p in enumerate(picks)}
        shown = [t for t in tasks if t["program"] in rows]
        _bars(g_ax, [(t["start_us"] - t0) * scale for t in shown],
              [max(t["ready_us"] - t["start_us"], 0) * scale for t in shown],
              [rows[t["program"]] - 0.4 for t in shown], 0.8, [_WAIT_COLOUR] * len(shown))
        _bars(g_ax, [(t["ready_us"] - t0) * scale for t in shown],
              [max(t["end_us"] - t["ready_us"], 0) * scale for t in shown],
              [rows[t["program"]] - 0.4 for t in shown], 0.8, [colours[str(t["opcode"])] for t in shown])
        g_ax.set_yticks(range(len(picks)), [f"program {p}" for p in picks], fontsize=8)
        g_ax.set_ylim(len(picks) - 0.5, -0.5)
        g_ax.set_title(f"(c) {len(picks)} chosen program{'s' if len(picks) > 1 else ''} at full resolution "
                       "(most, least and median waiting)",
                       fontsize=9, loc="left")
        if not act:
            _legend(g_ax, {**colours, "waiting on a dependency": _WAIT_COLOUR}, loc="upper left",
                    bbox_to_anchor=(1.01, 1.0), frameon=False)
    axes[-1].set_xlabel(f"{unit} since the step's first task")
    return fig
