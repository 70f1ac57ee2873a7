"""Figures a reader can read: fixed colours per name, legends inside the image, readable ticks, log axes across
decades, every series visible, each step on its own scale, the bandwidth estimate's excess said in words, a
labelled Gantt, and the HTML sections that go with them (counters, the sweep's numbers, short kernel names)."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess

import pytest
from matplotlib.colors import to_hex

from . import resultsgen as g
from bubblescope.reports import megakernel_plots, palette, plots
from bubblescope.reports.html import render_html
from bubblescope.reports.kernel_names import demangle, short_kernel_name


@pytest.fixture
def no_png(monkeypatch):
    """Pages whose text is under test, without encoding each figure as a 200-DPI PNG (seconds each)."""
    from bubblescope.reports import html

    monkeypatch.setattr(html, "png_uri", lambda fig: None if fig is None else "data:image/png;base64,")


def _drawn(fig):
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _inside(fig, artist) -> bool:
    """The artist's box lies within the figure's (a clipped legend pokes out of it)."""
    box, page = artist.get_window_extent(_drawn(fig)), fig.bbox
    return box.x0 >= page.x0 - 1 and box.y0 >= page.y0 - 1 and box.x1 <= page.x1 + 1 and box.y1 <= page.y1 + 1


def _bar_colours(ax) -> dict:
    """``{ytick label: bar colour}`` of a horizontal bar chart with one bar per row."""
    labels = [t.get_text() for t in ax.get_yticklabels()]
    bars = sorted(ax.patches, key=lambda p: p.get_y())
    return {label: to_hex(bar.get_facecolor()) for label, bar in zip(labels, bars)}


# --- colours: one fixed palette keyed by name --------------------------------------------------------------------

def test_an_engine_keeps_its_colour_whatever_else_ran():
    """The ladder coloured bars by position: the megakernel was blue in one report and orange in the next."""
    two = g.healthy_doc()
    four = g.healthy_doc()
    extra = copy.deepcopy(g.engine(four, "reference-cudagraph"))
    extra["name"] = "reference"
    extra["latency"]["token_ms_p50"] = 2.5
    four["engines"].insert(0, extra)
    small = _bar_colours(plots.ladder_figure(two["engines"][:2], two["device"]).axes[0])
    big = _bar_colours(plots.ladder_figure(four["engines"][:3], four["device"]).axes[0])
    assert small["megakernel"] == big["megakernel"] == palette.ENGINES["megakernel"]
    assert small["reference-cudagraph"] == big["reference-cudagraph"] != big["reference"]
    # a name the palette does not know gets the same colour every time, never the limit red
    assert palette.engine_colour("my-engine") == palette.engine_colour("my-engine") != palette.LIMIT


def test_a_category_keeps_its_colour_and_the_legend_stays_in_the_image():
    """Colours followed the sorted list of categories present, so "norm" changed colour when "attention" was
    missing; the legend hung below the axes at a fixed offset and was clipped by the image's edge."""
    doc = g.healthy_doc()
    ok = doc["engines"][:2]
    fig = plots.categories_figure(ok)
    (legend,) = fig.legends
    assert _inside(fig, legend)
    shown = {t.get_text(): to_hex(h.get_facecolor()) for t, h in zip(legend.get_texts(), legend.legend_handles)}
    assert shown == {"attention": palette.CATEGORIES["attention"], "gemv": palette.CATEGORIES["gemv"],
                     "megakernel": palette.CATEGORIES["megakernel"], "norm": palette.CATEGORIES["norm"]}
    cats = g.engine(doc, "reference-cudagraph")["timeline"]["categories"]
    cats[:] = [c for c in cats if c["category"] != "attention"]
    legend = plots.categories_figure(ok).legends[0]
    again = {t.get_text(): to_hex(h.get_facecolor()) for t, h in zip(legend.get_texts(), legend.legend_handles)}
    assert again["norm"] == shown["norm"] and "attention" not in again


# --- axes: log where data span decades, ticks at readable values -------------------------------------------------

def test_the_ladder_goes_log_across_decades_with_plain_ticks():
    """A CPU run: the eager reference at 1.089 ms and the interpreted megakernel at 373 ms on one linear axis
    left the reference a sliver; across 2.5 decades the axis is logarithmic, its ticks plain numbers."""
    doc = g.null_metrics_doc()
    ref, mk = g.engine(doc, "reference-cudagraph"), g.engine(doc, "megakernel")
    ref["latency"]["token_ms_p50"], mk["latency"]["token_ms_p50"] = 1.089, 373.343
    ax = plots.ladder_figure(doc["engines"][:2], doc["device"]).axes[0]
    _drawn(ax.figure)
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "ms per token (p50, log scale)"
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert "1" in labels and "100" in labels and not any("^" in t or "$" in t for t in labels)
    # within a decade (0.8 vs 1.1 ms) it stays linear from 0
    ax = plots.ladder_figure(g.healthy_doc()["engines"][:2], g.healthy_doc()["device"]).axes[0]
    assert ax.get_xscale() == "linear" and ax.get_xlim()[0] == 0


def test_sweep_ticks_are_the_contexts_measured_not_powers_of_two():
    fig = plots.sweep_figure(g.healthy_doc()["engines"][:2], g.healthy_doc()["device"])
    _drawn(fig)
    for ax in fig.axes:
        assert [t.get_text() for t in ax.get_xticklabels()] == ["128", "1,024", "4,096"]
        assert list(ax.get_xticks()) == [128, 1024, 4096]


def test_every_sweep_series_is_visible_and_named_even_without_bandwidth():
    """Two engines measuring the same drew one line over the other; on a CPU (no GB/s) the legend, taken from
    the empty bandwidth panel, was missing altogether."""
    doc = g.healthy_doc()
    mk = g.engine(doc, "megakernel")
    twin = copy.deepcopy(mk)
    twin["name"] = "megakernel-triton"
    doc["engines"].append(twin)
    for eng in doc["engines"][:2] + [twin]:
        for r in eng["sweep"]:
            r.update(effective_GBps=None, util_peak=None)
    fig = plots.sweep_figure([doc["engines"][0], doc["engines"][1], twin], doc["device"])
    (ax,) = fig.axes  # no bandwidth: the latency panel alone
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"megakernel", "megakernel-triton", "reference-cudagraph"}
    same = lines["megakernel"], lines["megakernel-triton"]
    assert list(same[0].get_ydata()) == list(same[1].get_ydata())  # on top of each other...
    assert same[0].get_marker() != same[1].get_marker()              # ...told apart by marker
    assert same[0].get_markersize() != same[1].get_markersize()      # and the one below shows around the other
    (legend,) = fig.legends
    assert {t.get_text() for t in legend.get_texts()} == set(lines) and _inside(fig, legend)


# --- the step timeline: each step on its own scale ---------------------------------------------------------------

def test_a_short_step_is_not_flattened_by_a_long_one():
    """One shared 0–28 ms axis drew a 30 µs step as a sliver; each step now spans its own axis."""
    doc = g.healthy_doc()
    mk = g.engine(doc, "megakernel")
    mk["timeline"]["step_timeline"]["kernels"][0]["dur_us"] = 28_000.0  # 8 µs + 28 ms
    fig = plots.step_timeline_figure(doc["engines"][:2])
    spans = [ax.get_xlim()[1] for ax in fig.axes]
    assert spans == pytest.approx([202.5 * 1.01, 28_008.0 * 1.01])
    assert all(ax.get_xlabel() == "µs since the step's first event" for ax in fig.axes)
    (legend,) = fig.legends
    assert _inside(fig, legend) and "CPU launch call" in [t.get_text() for t in legend.get_texts()]


# --- inside the megakernel: (b) above the peak, (c) labelled ---------------------------------------------------------

def test_bandwidth_above_the_peak_is_said_in_words():
    """By hand: bins at 1,000, 5,000 and 6,000 GB/s against a 4,800 GB/s peak: 2 of 3 bins above it, at most
    6,000 GB/s = 1.25x the peak. At or below the peak, or without a peak, nothing is said."""
    act = {"GBps": [1000.0, 5000.0, 6000.0]}
    line = megakernel_plots.bandwidth_over_peak(act, 4800.0)
    assert line.startswith("The estimate exceeds the NVML peak in 2 of 3 bins (at most 6,000 GB/s, 1.25x the peak)")
    assert megakernel_plots.bandwidth_over_peak({"GBps": [1000.0, 4800.0]}, 4800.0) is None
    assert megakernel_plots.bandwidth_over_peak(act, None) is None and megakernel_plots.bandwidth_over_peak(None, 4800.0) is None


def _mk_with_activity(peak_scale: float) -> dict:
    from bubblescope.reports.intrakernel import activity_profile

    doc = g.healthy_doc()
    mk = g.engine(doc, "megakernel")
    # 4 programs' lm_head tasks (50 µs each) carry 1 GB each: 4e9 B over ~50 µs is far above any HBM
    nbytes = {"qkv": 1e6, "attn": 1e5, "oproj": 1e6, "mlp": 1e6, "lm_head": 1e9 * peak_scale}
    mk["intrakernel"]["activity"] = activity_profile(mk["intrakernel"]["tasks"], bins=40, bytes_by_opcode=nbytes)
    return doc


def test_panel_b_and_the_page_say_when_the_estimate_passes_the_peak(no_png):
    over = _mk_with_activity(1.0)
    fig = megakernel_plots.intrakernel_figure(g.engine(over, "megakernel"), over["device"])
    assert "The estimate exceeds the NVML peak" in fig.axes[1].get_title(loc="left")
    assert "(b): The estimate exceeds the NVML peak in" in render_html(over)
    under = _mk_with_activity(1e-6)
    fig = megakernel_plots.intrakernel_figure(g.engine(under, "megakernel"), under["device"])
    assert "exceeds" not in fig.axes[1].get_title(loc="left") and "exceeds the NVML peak" not in render_html(under)


def test_the_gantt_has_axes_units_and_a_legend():
    doc = _mk_with_activity(1e-6)
    fig = megakernel_plots.intrakernel_figure(g.engine(doc, "megakernel"), doc["device"])
    gantt = fig.axes[-1]
    assert gantt.get_ylabel() == "program" and gantt.get_xlabel() == "µs since the step's first task"
    labels = [t.get_text() for t in gantt.get_legend().get_texts()]
    assert labels == ["waiting on a dependency", "busy: qkv", "busy: attn", "busy: oproj", "busy: mlp",
                      "busy: lm_head"]
    assert _inside(fig, gantt.get_legend())


# --- HTML sections ----------------------------------------------------------------------------------------------

def test_counters_have_an_html_section_with_metric_names_whole(no_png):
    doc = g.healthy_doc()
    assert 'id="counters"' not in render_html(doc)  # not asked for: no section
    doc["counters"] = g.counters_section()
    page = render_html(doc)
    section = page[page.index('id="counters"'):page.index('id="environment"')]
    row = re.search(r"<tr><td>megakernel</td>.*?</tr>", section, re.S).group(0)
    assert re.findall(r"<td[^>]*>(.*?)</td>", row) == ["megakernel", "megakernel_persistent", "1", "795.5 µs",
                                                       "64.7 %", "2.4 %", "12.5 %", "255", "barrier 48.5 %"]
    assert "long_scoreboard 61.0 %" in section and "dram__throughput.avg.pct_of_peak_sustained_elapsed" in section
    assert "unavailable: ERR_NVGPUCTRPERM: no permission to read counters" in section
    assert "(4 prompt tokens, 32 new tokens), after skipping 16/2,880 launches, not the timed runs" in section
    doc["counters"] = {"tool": "ncu", "available": False, "reason": "CPU run: no GPU", "engines": []}
    assert "Hardware counters: unavailable — CPU run: no GPU" in render_html(doc)


def test_the_sweep_numbers_are_in_the_page(no_png):
    page = render_html(g.healthy_doc())
    table = page[page.index("The sweep's numbers"):]
    row = re.search(r"<tr><td>megakernel</td>.*?</tr>", table, re.S).group(0)
    # _sweep by hand: (2,480,000,000 + 32,768 × 128) B / 0.8 ms = 3,105.2 GB/s = 64.5 % of 4,814.3
    assert re.findall(r"<td[^>]*>(.*?)</td>", row) == ["megakernel", "128", "0.800", "3105", "64.5 %"]


def test_kernel_names_are_shortened_with_the_full_name_as_a_title(no_png):
    full = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
            "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)")
    assert short_kernel_name(full) == "at::native::vectorized_elementwise_kernel<…>(…)"
    assert short_kernel_name("triton_poi_fused_add_0") == "triton_poi_fused_add_0"
    assert short_kernel_name("Memcpy DtoD (Device -> Device)") == "Memcpy DtoD (Device -> Device)"
    assert short_kernel_name("void f<int, 4>()") == "f<…>()"
    assert short_kernel_name("void at::native::(anonymous namespace)::max_pool_forward_nchw<float>(int, float*)") \
        == "at::native::(anonymous namespace)::max_pool_forward_nchw<…>(…)"
    assert short_kernel_name("a::b<(x>1)>") == "a::b<…>" and short_kernel_name("k<") == "k<"  # unbalanced: as is
    assert short_kernel_name("x" * 100) == "x" * 79 + "…"
    doc = g.healthy_doc()
    page = render_html(doc)
    assert '<td class="kernel" title="void f&lt;int, 4&gt;()">f&lt;…&gt;()</td>' in page


@pytest.mark.skipif(shutil.which("c++filt") is None, reason="no c++filt (binutils) to compare the demangler with")
def test_demangling_agrees_with_cxxfilt():
    mangled = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_"
    expected = subprocess.run(["c++filt", mangled], capture_output=True, text=True).stdout.strip()
    got = demangle(mangled)
    if got == mangled:
        pytest.skip("no libstdc++ demangler loadable here")
    assert got == expected and short_kernel_name(mangled) == "at::native::vectorized_elementwise_kernel<…>(…)"
    assert demangle("_Znot a symbol") == "_Znot a symbol" and demangle("plain") == "plain"


def test_the_tune_curve_ticks_at_the_values_tried():
    """block_k 64, 256, 1024 on a log-2 axis read 2^6, 2^8, 2^10; the ticks are now the values themselves."""
    from bubblescope.reports.tune_report import tune_figure

    def row(v, ms):
        return {"value": v, "text": str(v), "status": "ok", "reason": None, "compile": None,
                "points": [{"context": 128, "token_ms_p50": ms}]}
    doc = {"knob": "block_k", "contexts": [128], "rows": [row(64, 1.3), row(256, 1.2), row(1024, 1.25)]}
    ax = tune_figure(doc).axes[0]
    _drawn(ax.figure)
    assert ax.get_xscale() == "log" and [t.get_text() for t in ax.get_xticklabels()] == ["64", "256", "1,024"]
