"""Figures of a results document's engines: one decode step per engine, the ablation ladder, kernel categories,
latency distributions and the context sweep (:mod:`.megakernel_plots` draws inside the megakernel).

Each ``*_figure`` function is pure: it reads engine entries and returns a new Figure (:mod:`.figure_base`), or
None when the document holds nothing to draw (the report then says "not measured"). Colours come from
:mod:`.palette`, keyed by name.
"""

from __future__ import annotations

from . import palette
from .figure_base import (bars, figure_legend, figure_png, label, log_axis, new_figure, patches, spans_decades,
                          ticks_at)
from .results import dig, ordered

__all__ = ["figure_png", "step_timeline_figure", "ladder_figure", "categories_figure", "latency_figure",
           "sweep_figure"]


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
    fig, axes = new_figure(1.2 + 0.45 * sum(heights) + 0.75 * len(steps), rows=len(steps),
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
            bars(ax, [k["start_us"] - t0 for k in ks], [k["dur_us"] for k in ks], [row - 0.4] * len(ks), 0.8,
                  [colours[k["category"]] for k in ks])
        bars(ax, [c["start_us"] - t0 for c in launches], [c["dur_us"] for c in launches],
              [-0.4] * len(launches), 0.8, ["#555555"] * len(launches))
        ax.set_yticks(range(len(rows)), [label(r) for r in rows], fontsize=8)
        ax.set_ylim(-0.6, len(rows) - 0.4)
        ax.set_xlim(0, span * 1.01 if span > 0 else 1)
        ax.invert_yaxis()
        # the profiled step: the profiler's cost per launch lengthens a host-bound one, so say what the tables use
        p50 = dig(eng, "latency", "token_ms_p50")
        timed = f"; timed TPOT p50 {p50 * 1e3:,.1f} µs" if p50 is not None else ""
        ax.set_title(f"{label(eng['name'])}: one profiled step, {span:,.1f} µs from first to last event{timed} "
                     "(own scale)", fontsize=9, loc="left")
        ax.set_xlabel("µs since the step's first event", fontsize=8)
        ax.grid(alpha=0.3, axis="x")
    figure_legend(fig, patches(colours) + patches({"CPU launch call": "#555555"}), "upper", ncol=6)
    return fig


def ladder_figure(engines: list[dict], device: dict):
    """The ablation ladder: ms/token p50 per engine (its :mod:`.palette` colour), with the bandwidth floors as
    vertical lines.

    Floors are ``bytes_per_step / bandwidth`` at the NVML peak and at the measured copy bandwidth,
    drawn when both are known (docs/design.md, "effective_bandwidth"). The axis is logarithmic when the bars span a
    decade or more (a CPU run's interpreted megakernel beside the eager reference). Returns None without any p50.
    """
    rows = [e for e in ordered(engines) if dig(e, "latency", "token_ms_p50") is not None]
    if not rows:
        return None
    fig, (ax,) = new_figure(1.4 + 0.4 * len(rows))
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
    ax.set_yticks(range(len(rows)), [label(e["name"]) for e in rows], fontsize=8)
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
    fig, (ax,) = new_figure(1.6 + 0.4 * len(rows) + 0.25 * ((len(colours) + 4) // 5))
    for i, eng in enumerate(rows):
        left = 0.0
        for cat in sorted(eng["timeline"]["categories"], key=lambda c: c["category"]):
            ax.barh(i, cat["share"] * 100, left=left, color=colours[cat["category"]])
            left += cat["share"] * 100
    ax.set_yticks(range(len(rows)), [label(e["name"]) for e in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of GPU kernel time")
    figure_legend(fig, patches(colours), "lower", ncol=5)
    return fig


def latency_figure(engines: list[dict]):
    """Distribution of per-token latency (``latency.token_ms_samples``) as one ECDF per engine (its :mod:`.palette`
    colour); the x axis is logarithmic when the samples span a decade or more."""
    rows = [e for e in ordered(engines) if dig(e, "latency", "token_ms_samples")]
    if not rows:
        return None
    fig, (ax,) = new_figure(3.2)
    for i, eng in enumerate(rows):
        xs = sorted(eng["latency"]["token_ms_samples"])
        ys = [100 * (i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=label(eng["name"]), color=palette.engine_colour(eng["name"]),
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
    fig, axes = new_figure(3.4 + 0.25 * ((len(rows) + 2 * has_bw + ncol - 1) // ncol), cols=2 if has_bw else 1)
    bw_ax, ms_ax = (axes[0], axes[1]) if has_bw else (None, axes[0])
    contexts, handles = set(), {}
    for i, eng in enumerate(rows):
        pts = sorted(eng["sweep"], key=lambda r: r["context"])
        style = {"color": palette.engine_colour(eng["name"]), "marker": palette.engine_marker(eng["name"]),
                 "markersize": max(9 - 1.5 * i, 3.5), "linewidth": max(2.2 - 0.3 * i, 1.0),
                 "label": label(eng["name"]), "zorder": 3 + i}
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
    figure_legend(fig, list(handles.values()), "lower", ncol=4)
    return fig
