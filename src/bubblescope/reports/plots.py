"""Figures of a results document, built on ``matplotlib.figure.Figure`` with the Agg canvas.

Each ``*_figure`` function is pure: it reads engine entries and returns a new Figure, or None when
the document holds nothing to draw (the report then says "not measured"). No pyplot, so no global
figure registry and no backend switching; matplotlib is imported on first use, not at import.
"""

from __future__ import annotations

import io
import textwrap

from . import palette
from .results import dig, ordered
from ..wording import count

_DPI = 100
_SAVE_DPI = 200  # high-DPI PNG: sharp on a 2x screen and when zoomed
_WIDTH_IN = 10.0
_WAIT_COLOUR = palette.WAIT
DECADE = 10  # data spanning this factor or more is drawn on a log axis: a linear one crushes the small values


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


def _plain(value, _pos=None) -> str:
    """A tick label as a plain number (``4,096``, ``0.5``), never ``2^12`` or ``10^3``."""
    return f"{value:,.0f}" if value >= 10 or float(value).is_integer() else f"{value:.3g}"


def ticks_at(ax, axis: str, values) -> None:
    """Major ticks of ``axis`` ("x" or "y") exactly at ``values`` (the contexts or knob values measured), labelled
    as plain numbers, no minor ticks: a log-2 axis otherwise reads 2^7, 2^10, 2^12."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_locator(FixedLocator(sorted(set(values))))
    target.set_major_formatter(FuncFormatter(_plain))
    target.set_minor_locator(NullLocator())


def log_axis(ax, axis: str) -> None:
    """Put ``axis`` on a log-10 scale with ticks at 1, 2 and 5 of each decade, labelled as plain numbers."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(FuncFormatter(_plain))
    target.set_minor_formatter(NullFormatter())


def spans_decades(values) -> bool:
    """True when the positive ``values`` span a factor of :data:`DECADE` or more."""
    pos = [v for v in values if v is not None and v > 0]
    return bool(pos) and max(pos) / min(pos) >= DECADE


def _bars(ax, left, width, y, height, colours) -> None:
    """Draw many rectangles as one collection (thousands of tasks stay fast)."""
    from matplotlib.collections import PolyCollection

    verts = [((x, b), (x + w, b), (x + w, b + height), (x, b + height)) for x, w, b in zip(left, width, y)]
    ax.add_collection(PolyCollection(verts, facecolors=colours, edgecolors="none", linewidths=0))
    ax.autoscale_view()


def _patches(colours: dict) -> list:
    from matplotlib.patches import Patch

    return [Patch(color=c, label=_label(n)) for n, c in colours.items()]


def _legend(ax, colours: dict, **kw) -> None:
    ax.legend(handles=_patches(colours), fontsize=8, **kw)


def _figure_legend(fig, handles, where: str = "lower", ncol: int = 4) -> None:
    """One legend for the whole figure, in a band of its own above or below the axes (constrained layout makes
    room for it), so it is never clipped by the image's edge nor drawn over the data."""
    if handles:
        fig.legend(handles=handles, fontsize=8, loc=f"outside {where} center", ncol=max(1, min(len(handles), ncol)),
                   frameon=False)


def figure_png(fig) -> bytes:
    """Render a Figure to PNG bytes (Agg)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_SAVE_DPI)
    return buf.getvalue()


def step_timeline_figure(engines: list[dict]):
    """One decode step per engine (``timeline.step_timeline``), each on its own µs axis from the step's first event:
    a shared axis would draw a 30 µs step as a sliver beside a 28 ms one, so every panel is scaled to its own step
    and its title gives that step's span.

    Rows per engine: one per GPU stream (kernels coloured by category, :mod:`.palette`) and one for CPU launch
    calls. Returns None when no engine has a step timeline.
    """
    steps = [(e, e["timeline"]["step_timeline"]) for e in ordered(engines)
             if dig(e, "timeline", "step_timeline") and (e["timeline"]["step_timeline"].get("kernels")
                                                         or e["timeline"]["step_timeline"].get("launches"))]
    if not steps:
        return None
    colours = palette.colours(sorted({k["category"] for _, st in steps for k in st.get("kernels") or []}))
    heights = [1 + len({k["stream"] for k in st.get("kernels") or []}) for _, st in steps]
    fig, axes = _new_figure(1.2 + 0.45 * sum(heights) + 0.75 * len(steps), rows=len(steps),
                            gridspec_kw={"height_ratios": heights})
    for ax, (eng, st) in zip(axes, steps):
        kernels, launches = st.get("kernels") or [], st.get("launches") or []
        events = kernels + launches
        t0 = min(ev["start_us"] for ev in events)
        span = max(ev["start_us"] + ev["dur_us"] for ev in events) - t0
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
        ax.set_xlim(0, span * 1.01 if span > 0 else 1)
        ax.invert_yaxis()
        ax.set_title(f"{_label(eng['name'])}: one step, {span:,.1f} µs from first to last event (own scale)",
                     fontsize=9, loc="left")
        ax.set_xlabel("µs since the step's first event", fontsize=8)
        ax.grid(alpha=0.3, axis="x")
    _figure_legend(fig, _patches(colours) + _patches({"CPU launch call": "#555555"}), "upper", ncol=6)
    return fig


def ladder_figure(engines: list[dict], device: dict):
    """The ablation ladder: ms/token p50 per engine (its :mod:`.palette` colour), with the bandwidth floors as
    vertical lines.

    Floors are ``bytes_per_step / bandwidth`` at the NVML peak and at the measured copy bandwidth,
    drawn when both are known (DESIGN.md, "effective_bandwidth"). The axis is logarithmic when the bars span a
    decade or more (a CPU run's interpreted megakernel beside the eager reference). Returns None without any p50.
    """
    rows = [e for e in ordered(engines) if dig(e, "latency", "token_ms_p50") is not None]
    if not rows:
        return None
    fig, (ax,) = _new_figure(1.4 + 0.4 * len(rows))
    p50 = [e["latency"]["token_ms_p50"] for e in rows]
    nbytes = next((dig(e, "bandwidth", "bytes_per_step") for e in rows if dig(e, "bandwidth", "bytes_per_step")), None)
    floors = []
    for key, what, style in (("nvml_peak_GBps", "NVML peak", "--"), ("copy_GBps", "measured copy", ":")):
        gbps = (device or {}).get(key)
        if nbytes and gbps:
            floors.append((nbytes / (gbps * 1e9) * 1e3, what, style))
    log = spans_decades(p50 + [f for f, _, _ in floors])
    left = min(p50 + [f for f, _, _ in floors]) / 2 if log else 0
    ax.barh(range(len(rows)), [v - left for v in p50], left=left, color=[palette.engine_colour(e["name"]) for e in rows])
    for i, v in enumerate(p50):
        ax.annotate(f"{v:,.3f} ms", (v, i), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [_label(e["name"]) for e in rows], fontsize=8)
    ax.invert_yaxis()
    for floor_ms, what, style in floors:
        ax.axvline(floor_ms, color=palette.LIMIT, linestyle=style, label=f"floor at {what}: {floor_ms:.3f} ms")
    if floors:
        ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=2, frameon=False)
    else:
        ax.set_title("no bandwidth floors: the device's bandwidth is unknown (CPU run)", fontsize=8, loc="left")
    if log:
        log_axis(ax, "x")
        ax.set_xlim(left, max(p50) * 3)  # room for the value labels on a log axis
        ax.set_xlabel("ms per token (p50, log scale)")
    else:
        ax.set_xlim(0, max(p50) * 1.18)
        ax.set_xlabel("ms per token (p50)")
    ax.grid(alpha=0.3, axis="x", which="major")
    return fig


def categories_figure(engines: list[dict]):
    """Share of GPU time per kernel category (``timeline.categories``), one stacked bar per engine; colours from
    :mod:`.palette`, the legend in its own band below the axes."""
    rows = [e for e in ordered(engines) if dig(e, "timeline", "categories")]
    if not rows:
        return None
    colours = palette.colours(sorted({c["category"] for e in rows for c in e["timeline"]["categories"]}))
    fig, (ax,) = _new_figure(1.6 + 0.4 * len(rows) + 0.25 * ((len(colours) + 4) // 5))
    for i, eng in enumerate(rows):
        left = 0.0
        for cat in sorted(eng["timeline"]["categories"], key=lambda c: c["category"]):
            ax.barh(i, cat["share"] * 100, left=left, color=colours[cat["category"]])
            left += cat["share"] * 100
    ax.set_yticks(range(len(rows)), [_label(e["name"]) for e in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of GPU kernel time")
    _figure_legend(fig, _patches(colours), "lower", ncol=5)
    return fig


def latency_figure(engines: list[dict]):
    """Distribution of per-token latency (``latency.token_ms_samples``) as one ECDF per engine (its :mod:`.palette`
    colour); the x axis is logarithmic when the samples span a decade or more."""
    rows = [e for e in ordered(engines) if dig(e, "latency", "token_ms_samples")]
    if not rows:
        return None
    fig, (ax,) = _new_figure(3.2)
    for i, eng in enumerate(rows):
        xs = sorted(eng["latency"]["token_ms_samples"])
        ys = [100 * (i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=_label(eng["name"]), color=palette.engine_colour(eng["name"]),
                linewidth=1.6, linestyle=("-", "--", "-.", ":")[i % 4])
    samples = [x for e in rows for x in e["latency"]["token_ms_samples"]]
    log = spans_decades(samples)  # engines a decade apart: a linear axis crushes the fast ones
    if log:
        log_axis(ax, "x")
    ax.set_xlabel("ms per token" + (" (log scale)" if log else ""))
    ax.set_ylabel("% of tokens at or below")
    ax.set_ylim(0, 101)
    ax.grid(alpha=0.3, which="major")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return fig


def sweep_figure(engines: list[dict], device: dict):
    """Effective GB/s and ms/token p50 against context length (``sweep``), NVML peak and copy marked.

    Each engine keeps its :mod:`.palette` colour and marker, and the markers shrink from one engine to the next,
    so that engines measuring the same (their points on top of each other) all stay visible. The context axis is
    logarithmic with ticks at the contexts measured (128, 1,024, 4,096), the value axes go log when their data span
    a decade. Without any bandwidth (a CPU run) only the latency panel is drawn. The legend, in a band below,
    lists every engine drawn in either panel.
    """
    rows = [e for e in ordered(engines) if any(r.get("token_ms_p50") is not None for r in e.get("sweep") or [])]
    if not rows:
        return None
    has_bw = any(r.get("effective_GBps") is not None for e in rows for r in e["sweep"])
    ncol = min(len(rows) + 2 * has_bw, 4)
    fig, axes = _new_figure(3.4 + 0.25 * ((len(rows) + 2 * has_bw + ncol - 1) // ncol), cols=2 if has_bw else 1)
    bw_ax, ms_ax = (axes[0], axes[1]) if has_bw else (None, axes[0])
    contexts, handles = set(), {}
    for i, eng in enumerate(rows):
        pts = sorted(eng["sweep"], key=lambda r: r["context"])
        style = {"color": palette.engine_colour(eng["name"]), "marker": palette.engine_marker(eng["name"]),
                 "markersize": max(9 - 1.5 * i, 3.5), "linewidth": max(2.2 - 0.3 * i, 1.0),
                 "label": _label(eng["name"]), "zorder": 3 + i}
        bw = [(r["context"], r["effective_GBps"]) for r in pts if r.get("effective_GBps") is not None]
        ms = [(r["context"], r["token_ms_p50"]) for r in pts if r.get("token_ms_p50") is not None]
        contexts |= {c for c, _ in bw + ms}
        if bw and bw_ax is not None:
            (handles[style["label"]],) = bw_ax.plot(*zip(*bw), **style)
        (line,) = ms_ax.plot(*zip(*ms), **style)
        handles.setdefault(style["label"], line)
    for key, what, style in (("nvml_peak_GBps", "NVML peak", "--"), ("copy_GBps", "measured copy", ":")):
        if (device or {}).get(key) and bw_ax is not None:
            handles[what] = bw_ax.axhline(device[key], color=palette.LIMIT, linestyle=style, label=what)
    for ax, ylabel in ((bw_ax, "effective GB/s"), (ms_ax, "ms per token (p50)")):
        if ax is None:
            continue
        ax.set_xscale("log", base=2)
        ticks_at(ax, "x", contexts)
        ax.set_xlabel("context length (tokens)")
        ys = [y for line in ax.get_lines() for y in line.get_ydata() if y > 0]
        if spans_decades(ys):  # one slow engine would flatten every other line
            log_axis(ax, "y")
            ylabel += " (log scale)"
        else:
            ax.set_ylim(bottom=0, top=max(ys, default=1) * 1.1)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="major")
    if not has_bw:
        ms_ax.set_title("no bandwidth panel: effective GB/s was not measured in this run", fontsize=8, loc="left")
    _figure_legend(fig, list(handles.values()), "lower", ncol=4)
    return fig


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
    from ..profiler.intrakernel import IDLE, WAITING, activity_profile

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
        _bars(g_ax, [(t["start_us"] - t0) * scale for t in shown],
              [max(t["ready_us"] - t["start_us"], 0) * scale for t in shown],
              [rows[t["program"]] - 0.4 for t in shown], 0.8, [_WAIT_COLOUR] * len(shown))
        _bars(g_ax, [(t["ready_us"] - t0) * scale for t in shown],
              [max(t["end_us"] - t["ready_us"], 0) * scale for t in shown],
              [rows[t["program"]] - 0.4 for t in shown], 0.8, [colours[str(t["opcode"])] for t in shown])
        g_ax.set_yticks(range(len(picks)), [f"program {p}" for p in picks], fontsize=8)
        g_ax.set_ylim(len(picks) - 0.5, -0.5)
        g_ax.set_ylabel("program", fontsize=8)
        g_ax.set_title(f"(c) {len(picks)} chosen program{'s' if len(picks) > 1 else ''} at full resolution "
                       "(most, least and median waiting): each task's wait, then its work",
                       fontsize=9, loc="left")
        used = [op for op in opcodes if any(str(t["opcode"]) == op for t in shown)]
        _legend(g_ax, {"waiting on a dependency": _WAIT_COLOUR, **{f"busy: {op}": colours[op] for op in used}},
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
