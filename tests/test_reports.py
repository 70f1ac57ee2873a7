"""Terminal and HTML reports: pure renderings of a results document."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess

import pytest
from rich.console import Console

from . import resultsgen as g
from bubblescope.errors import BubblescopeError
from bubblescope.reports import html as html_mod
from bubblescope.reports import megakernel_plots, plots
from bubblescope.reports.html import render_html, screenshot_html, write_html
from bubblescope.reports.results import load_results, write_results
from bubblescope.reports.terminal import render_results

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SECTIONS_WITH_PLOTS = 6  # step timeline, ladder, categories, latency, sweep, one intra-megakernel timeline


def _terminal_text(doc) -> str:
    console = Console(record=True, width=200, color_system=None)
    render_results(doc, console)
    return console.export_text()


@pytest.fixture(scope="module")
def healthy_html() -> str:
    doc = g.healthy_doc()
    doc["findings"] = [g.a_finding()]
    return render_html(doc)


def test_terminal_report_shows_the_document_numbers():
    doc = g.healthy_doc()
    doc["findings"] = [g.a_finding()]
    text = _terminal_text(doc)
    assert "GPU: NVIDIA H200" in text and "NVML peak 4814 GB/s" in text and "measured copy 4260 GB/s" in text
    mk = [line.split() for line in text.splitlines() if line.strip().startswith("megakernel ")]
    assert mk[0] == ["megakernel", "0.800", "0.830", "1250.0", "3107", "64.5", "%", "72.9", "%"]
    # one request: TTFT 10 ms; the end to end not recorded, so TTFT + 127 steps × 0.8 ms = 111.6 ms, marked "~"
    # no first run recorded (a document written before latency.first_run): its two columns show the missing mark
    assert mk[1] == ["megakernel", "10.000", "~101.6", "~111.6", "—", "—"]
    ref = [line.split() for line in text.splitlines() if line.strip().startswith("reference-cudagraph ")]
    assert ref[2] == ["reference-cudagraph", "180", "1", "0.060", "1.2", "%", "85.0", "%", "100.0", "%"]
    # the ladder: the megakernel saves 1,100 − 800 µs per token against the graphed reference below it
    assert mk[3] == ["megakernel", "0.800", "64.5", "%", "1", "0.050*", "+300.0"]
    assert "hf: skipped — transformers is not installed" in text
    assert "reference-compile: failed — torch.compile raised InductorError" in text
    assert "bubble ratio 62.0 %, kernels per step 412" in text and "Use CUDA graphs." in text


def test_a_graphed_prefill_is_named_beside_the_ttft_and_only_then():
    """An engine whose prefill replayed CUDA graphs (``compile.prefill_graphs``) is named in the latency note of the
    terminal and HTML reports; without one (or with the graphs off after a failed capture) the note is the plain
    one."""
    from bubblescope.reports.results import validate_results
    from bubblescope.reports.tables import LATENCY_NOTE, latency_note

    doc = g.healthy_doc()
    plain = _terminal_text(doc)
    assert "CUDA graph per" not in plain and latency_note(doc) == LATENCY_NOTE
    mk = next(e for e in doc["engines"] if e["name"] == "megakernel")
    mk.setdefault("compile", {})["prefill_graphs"] = False
    assert latency_note(doc) == LATENCY_NOTE
    mk["compile"]["prefill_graphs"] = True
    assert validate_results(doc) == []
    note = latency_note(doc)
    assert note.startswith(LATENCY_NOTE) and "the TTFT of megakernel: a batched prefill replayed as a CUDA graph" in note
    assert "the TTFT of megakernel: a batched prefill" in " ".join(_terminal_text(doc).split())
    assert "the TTFT of megakernel: a batched prefill" in render_html(doc)


def test_the_first_run_shows_beside_the_timed_request():
    """The megakernel's first generation (2.4 ms/token, TTFT 241 ms against the timed 0.8 ms and 10 ms) in its
    request row of the terminal and HTML reports; the graphed reference, whose run had no warm-up (first_run
    null), and the hf entry without latency show the missing mark."""
    from bubblescope.reports.results import validate_results

    doc = g.healthy_doc()
    g.engine(doc, "megakernel")["latency"]["first_run"] = {"token_ms_p50": 2.4, "ttft_ms": 241.0, "tokens": 127}
    g.engine(doc, "reference-cudagraph")["latency"]["first_run"] = None
    assert validate_results(doc) == []
    text = _terminal_text(doc)

    def request_row(name: str) -> list[str]:  # an engine's second row: the latency table's, then the request's
        return [line.split() for line in text.splitlines() if line.split()[:1] == [name]][1]

    assert request_row("megakernel") == ["megakernel", "10.000", "~101.6", "~111.6", "2.400", "241.000"]
    assert request_row("reference-cudagraph") == ["reference-cudagraph", "12.500", "~139.7", "~152.2", "—", "—"]
    assert request_row("hf") == ["hf"] + ["—"] * 5
    assert "first run: the first, untimed generation in this process" in " ".join(text.split())
    page = render_html(doc)
    assert "<th>first run TPOT ms</th><th>first run TTFT ms</th>" in page
    assert ">2.400</td>" in page and ">241.000</td>" in page
    assert "first run: the first, untimed generation in this process" in page


def test_terminal_report_without_a_gpu_says_so_and_prints_dashes():
    text = _terminal_text(g.null_metrics_doc())
    assert "CPU only — GPU metrics unavailable" in text
    mk = [line.split() for line in text.splitlines() if line.strip().startswith("megakernel ")]
    assert mk[0] == ["megakernel"] + ["—"] * 6 and mk[1] == ["megakernel"] + ["—"] * 5
    assert mk[2] == ["megakernel"] + ["—"] * 6
    assert "Findings: none" in text


def test_terminal_prints_markup_and_templates_literally():
    doc = g.healthy_doc()
    g.engine(doc, "hf")["reason"] = "[bold red]not installed[/] void f<int, 4>() at:fire:"
    text = _terminal_text(doc)
    assert "hf: skipped — [bold red]not installed[/] void f<int, 4>() at:fire:" in text


def test_loaded_results_render_the_same_numbers(tmp_path):
    doc = g.healthy_doc()
    mk = g.engine(doc, "megakernel")
    mk["latency"].update(token_ms_p50=0.7712, token_ms_p90=0.7801, token_ms_p99=0.7934, tok_per_s=1296.68)
    mk["bandwidth"].update(effective_GBps=3222.6, util_peak=0.66938, util_copy=0.75648)
    mk["intrakernel"]["wait_ratio"] = 0.0123  # one kernel per step: the bubble ratio shown is its in-kernel wait
    mk["timeline"]["bubble_ratio"] = 0.2  # the host's gaps between steps: shown nowhere
    path = write_results(doc, tmp_path / "r.json")
    loaded = load_results(path)
    expected = ["0.771", "0.793", "1296.7", "3223", "66.9 %", "75.6 %", "0.012*"]
    text = _terminal_text(loaded)
    page = render_html(loaded)
    for cell in expected:
        assert cell in text
        assert f">{cell}</td>" in page


def test_html_embeds_every_plot_as_png(healthy_html):
    sources = re.findall(r'<img alt="[^"]*" src="([^"]*)">', healthy_html)
    assert healthy_html.count("<img") == len(sources) == SECTIONS_WITH_PLOTS
    for src in sources:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]).startswith(PNG_MAGIC)
    assert "not measured.</p>" not in healthy_html
    assert not re.search(r'(src|href)="(https?:)?//', healthy_html)  # self-contained


def test_html_escapes_kernel_names_and_document_text(healthy_html):
    assert "void f&lt;int, 4&gt;()" in healthy_html
    assert "void f<int, 4>()" not in healthy_html
    doc = g.healthy_doc()
    g.engine(doc, "hf")["reason"] = "<script>alert(1)</script>"
    page = render_html(doc)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>" not in page


def test_html_headline_and_findings(healthy_html):
    assert ">0.800</td>" in healthy_html and ">64.5 %</td>" in healthy_html and ">2259</td>" in healthy_html
    assert "bubble ratio 62.0 %, kernels per step 412" in healthy_html
    assert "transformers is not installed" in healthy_html
    assert "GPU: NVIDIA H200" in healthy_html


def test_html_with_all_null_metrics_says_not_measured():
    page = render_html(g.null_metrics_doc())
    assert "<img" not in page
    assert page.count("not measured.</p>") == SECTIONS_WITH_PLOTS
    assert "CPU only — GPU metrics unavailable" in page
    assert "no CUDA device: no kernel timeline" in page


def test_ladder_floors_are_bytes_over_bandwidth():
    doc = g.healthy_doc()
    fig = plots.ladder_figure(doc["engines"][:2], doc["device"])
    floors = sorted(line.get_xdata()[0] for line in fig.axes[0].lines)
    # 2 485 242 880 bytes per step at 4814.3 GB/s (NVML peak) and 4260 GB/s (measured copy).
    assert floors == pytest.approx([0.516221, 0.583390], abs=1e-6)
    bars = sorted(p.get_width() for p in fig.axes[0].patches)
    assert bars == pytest.approx([0.8, 1.1])


def test_plots_return_none_without_data():
    doc = g.null_metrics_doc()
    ok = doc["engines"][:2]
    assert plots.step_timeline_figure(ok) is None
    assert plots.ladder_figure(ok, doc["device"]) is None
    assert plots.categories_figure(ok) is None
    assert plots.latency_figure(ok) is None
    assert plots.sweep_figure(ok, doc["device"]) is None
    assert megakernel_plots.intrakernel_figure(ok[0]) is None
    full = g.healthy_doc()
    fig = plots.step_timeline_figure(full["engines"])
    # each step on its own scale, its span in the title: the CUDA-graph step's launch at 0 µs, its 12 kernels from
    # 2 µs, 4 × (30 + 4 + 12 µs + 3 gaps of 1.5 µs) less the last gap = 202.5 µs; the megakernel's 8 + 768 µs
    assert [ax.get_title(loc="left") for ax in fig.axes] == [
        "reference-cudagraph: one profiled step, 202.5 µs from first to last event; timed TPOT p50 1,100.0 µs "
        "(own scale)",
        "megakernel: one profiled step, 776.0 µs from first to last event; timed TPOT p50 800.0 µs (own scale)"]
    assert [ax.get_xlim()[1] for ax in fig.axes] == pytest.approx([202.5 * 1.01, 776.0 * 1.01])


def test_write_html_is_atomic_and_reports_bad_paths(tmp_path):
    out = write_html(g.null_metrics_doc(), tmp_path / "r.html")
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]
    with pytest.raises(BubblescopeError, match="cannot write here"):
        write_html(g.null_metrics_doc(), tmp_path / "missing" / "r.html")


def test_screenshot_without_chromium_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setattr(html_mod.shutil, "which", lambda name: None)
    page = tmp_path / "r.html"
    page.write_text("<html></html>")
    with pytest.raises(BubblescopeError, match="found on PATH"):
        screenshot_html(page, tmp_path / "r.png")


CHROMIUM = shutil.which("chromium")
IMAGE_CHECK = """<script>
window.addEventListener("load", () => {
  const imgs = Array.from(document.images);
  document.body.dataset.imgsTotal = imgs.length;
  document.body.dataset.imgsOk = imgs.every(i => i.complete && i.naturalWidth > 0) ? "yes" : "no";
});
</script>"""


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_chromium_loads_every_image_and_screenshots(tmp_path, healthy_html):
    page = tmp_path / "report.html"
    page.write_text(healthy_html.replace("</body>", IMAGE_CHECK + "</body>"))
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert f'data-imgs-total="{SECTIONS_WITH_PLOTS}"' in dom
    assert 'data-imgs-ok="yes"' in dom
    shot = screenshot_html(page, tmp_path / "report.png", 1200, 1600)
    data = shot.read_bytes()
    assert data.startswith(PNG_MAGIC)
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1200, 1600)


def test_html_names_each_megakernels_kernel_and_tile_shapes():
    """The tile shapes chosen per model are on the page: the Gluon choice from ``compile.gluon``, the
    Triton rows from ``compile.tiling``."""
    from bubblescope.reports.tables import kernel_tiling

    gluon = {"implementation": "gluon", "gluon": {"BR": 32, "BK": 256, "ring": 12, "split_k": 2, "rows_od": 16,
                                                  "block_s": 32, "min_chunk": 32, "splits": 16,
                                                  "qk_norm_in_attn": True}}
    assert kernel_tiling(gluon) == ("gluon: BR 32 · BK 256 · ring 12 · split_k 2 · rows_od 16 · block_s 32 · "
                                    "min_chunk 32 · splits 16 · q/k-norm in attention")
    thin = {"implementation": "gluon", "gluon": {"BR": 32, "BK": 256, "ring": 6, "slot_boxes": 2, "split_k": 2,
                                                 "rows_od": 16, "block_s": 64, "min_chunk": 32, "splits": 16,
                                                 "qk_norm_in_attn": False, "mv_widen": "mma"}}
    assert kernel_tiling(thin) == ("gluon: BR 32 · BK 256 · ring 6 · slot_boxes 2 · split_k 2 · rows_od 16 · "
                                   "block_s 64 · min_chunk 32 · splits 16 · matvec mma")
    triton = {"implementation": "triton", "tiling": {"rows_qkv": 6, "rows_o": 4, "rows_gateup": 8, "rows_down": 4,
                                                     "rows_lm": 8, "kv_splits": 64}}
    assert kernel_tiling(triton) == "triton: rows qkv/o/gateup/down/lm 6/4/8/4/8 · splits 64"
    assert kernel_tiling({"registers": 40}) == "—"
    doc = g.healthy_doc()
    g.engine(doc, "megakernel")["compile"].update(gluon)
    page = render_html(doc)
    assert "<th>kernel and tiles</th>" in page and "gluon: BR 32 · BK 256 · ring 12" in page
    # the terminal report names them too, for the megakernel only (the reference has no tiles)
    g.engine(doc, "megakernel")["compile"].update(thin)
    text = _terminal_text(doc)
    assert "Kernels and tiles" in text and "  megakernel: gluon: BR 32 · BK 256 · ring 6 · slot_boxes 2" in text
    assert "matvec mma" in text and "  reference: " not in text


def test_results_without_engines_are_rendered_not_refused(tmp_path):
    """The schema allows an empty ``engines`` list (docs/results-schema.md: "may be empty"), so `report` renders
    such a document (exit 0, the HTML written) instead of refusing it; the terminal says there is nothing to
    report, and its findings, stale with no engine to attach them to, are shown by neither report."""
    from typer.testing import CliRunner

    from bubblescope.cli import app

    doc = g.healthy_doc()
    doc["engines"] = []
    finding = g.a_finding()
    doc["findings"] = [finding]
    path = write_results(doc, tmp_path / "results.json")
    r = CliRunner().invoke(app, ["report", str(path), "--html", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.stderr
    assert r.stdout.strip() == "Nothing to report: the results hold no engine"
    page = (tmp_path / "r.html").read_text()
    assert "No engine measured a latency" in page and finding["title"] not in page
    r = CliRunner().invoke(app, ["report", str(path), "--format", "json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["engines"] == []
    assert _terminal_text(doc).strip() == "Nothing to report: the results hold no engine"


def test_html_report_shows_the_dependency_chain_and_attention_phases():
    """The megakernel section lists each dependency edge (hop and span µs), the attention task's phases and the
    parts of each layer's last attention task, with the values of the document (1 decimal), and the document stays
    valid with them."""
    doc = g.healthy_doc()
    ik = g.engine(doc, "megakernel")["intrakernel"]
    ik["edges"] = [{"edge": "ATTN→OPROJ", "stages": 16, "hop_us_p50": 0.22, "hop_us_max": 0.29, "span_us_p50": 3.78},
                   {"edge": "QKV→ATTN", "stages": 16, "hop_us_p50": -8.56, "hop_us_max": -7.36, "span_us_p50": 16.11}]
    ik["attn_phases"] = {"math_us": {"p50": 2.85, "max": 3.49}, "ticket_us": {"p50": 0.83, "max": 2.02},
                         "combine_us": {"p50": 0.29, "max": 3.2}, "q_us": {"p50": 0.1, "max": 1.34},
                         "blocks_us": {"p50": 1.73, "max": 2.24}, "warps_us": {"p50": 1.18, "max": 1.22}}
    ik["attn_critical"] = {"after_qkv_us": 0.496, "q_us": 1.392, "blocks_us": 0.992, "ticket_us": 0.8,
                           "combine_us": 2.832, "total_us": 6.688, "layers": 16}
    ik["task_phases"] = [{"opcode": "QKV", "tasks": 96, "stage_us_p50": 1.42, "mv_us_p50": 2.61,
                          "epilogue_us_p50": 1.04, "epilogue_us_max": 1.96}]
    from bubblescope.reports.results import validate_results
    assert validate_results(doc) == []
    page = html_mod.render_html(doc)
    assert re.search(r"<td>ATTN→OPROJ</td><td class=\"num\">16</td><td class=\"num\">0\.2</td>"
                     r"<td class=\"num\">0\.3</td><td class=\"num\">3\.8</td>", page)
    assert "<td>QKV→ATTN</td>" in page and ">-8.6<" in page
    assert "attention: wait → math done, µs p50 / max</th><td class=\"num\">2.9 / 3.5</td>" in page
    assert "attention: ticket → end (combine), µs p50 / max</th><td class=\"num\">0.3 / 3.2</td>" in page
    assert "attention: q → K/V blocks done, µs p50 / max</th><td class=\"num\">1.7 / 2.2</td>" in page
    assert "attention: blocks → warps combined, µs p50 / max</th><td class=\"num\">1.2 / 1.2</td>" in page
    assert ("attention, last task of each layer: after QKV / q / blocks / ticket / combine; total (the median of "
            "each layer&#39;s sum), µs p50</th><td class=\"num\">0.5 / 1.4 / 1.0 / 0.8 / 2.8; total 6.7</td>") in page
    assert re.search(r"<td>QKV</td><td class=\"num\">96</td><td class=\"num\">1\.4</td><td class=\"num\">2\.6</td>"
                     r"<td class=\"num\">1\.0</td><td class=\"num\">2\.0</td>", page)
