"""The HTML report in a real headless browser (Chromium from the system packages)."""

from __future__ import annotations

import html
import re
import shutil
import subprocess

import pytest

from . import resultsgen as g
from bubblescope.reports.findings import find
from bubblescope.reports.html import render_html
from bubblescope.reports.megakernel_plots import chosen_programs

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)")

# First thing in <head>: record console errors, uncaught exceptions and failed resource loads; after load,
# count the images that decoded. The results land in <body data-*> for --dump-dom.
PROBE = """<script>
window.__errors = [];
const __err = console.error.bind(console);
console.error = (...a) => { window.__errors.push(a.join(" ")); __err(...a); };
window.addEventListener("error", e => window.__errors.push(String(e.message || (e.target && e.target.src))), true);
window.addEventListener("load", () => {
  const imgs = Array.from(document.images);
  document.body.dataset.imgsTotal = imgs.length;
  document.body.dataset.imgsOk = imgs.filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.dataset.errors = JSON.stringify(window.__errors);
});
</script>"""


def _dom(page: str, tmp_path) -> str:
    path = tmp_path / "report.html"
    path.write_text(page.replace("<head>", "<head>" + PROBE, 1))
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
             "--disable-background-networking", "--disable-component-update", f"--user-data-dir={tmp_path / 'p'}",
             "--virtual-time-budget=5000", "--dump-dom", path.as_uri()]
    return subprocess.run(flags, capture_output=True, text=True, timeout=180).stdout


def _gpu_doc() -> dict:
    doc = g.healthy_doc()
    g.engine(doc, "reference-cudagraph")["timeline"].update(bubble_ratio=0.62, kernels_per_step=412)
    doc["findings"] = find(doc)
    return doc


@pytest.mark.parametrize("doc", [_gpu_doc(), g.null_metrics_doc()], ids=["h200-like", "cpu-null"])
def test_report_renders_without_console_errors_and_every_image_loads(tmp_path, doc):
    page = render_html(doc)
    dom = _dom(page, tmp_path)
    n = page.count("<img")
    assert f'data-imgs-total="{n}"' in dom and f'data-imgs-ok="{n}"' in dom, dom[-2000:]
    assert 'data-errors="[]"' in dom, re.findall(r'data-errors="[^"]*"', dom)


def test_megakernel_view_has_one_gantt_row_per_chosen_program(tmp_path):
    doc = _gpu_doc()
    dom = html.unescape(_dom(render_html(doc), tmp_path))
    tasks = g.engine(doc, "megakernel")["intrakernel"]["tasks"]
    rows = ", ".join(f"program {p}" for p in chosen_programs(tasks))
    assert f"Gantt rows: {rows}" in dom and rows == "program 0, program 1, program 2, program 3"


# --- what a reader sees: images drawn, nothing overflowing its container, a screenshot that is not blank --------

# After load: every <details> opened (their tables count too), then each element whose box passes the body's right
# edge is listed (content of a box that scrolls sideways excepted: it scrolls by design), and whether the
# page itself scrolls sideways. Kernel cells report their shown text and title (the full name).
LAYOUT_PROBE = """<script>
window.addEventListener("load", () => {
  document.querySelectorAll("details").forEach(d => { d.open = true; });
  const imgs = Array.from(document.images);
  const edge = document.body.getBoundingClientRect().right + 1;
  const over = [];
  const scrolls = el => ["auto", "scroll"].includes(getComputedStyle(el).overflowX);
  for (const el of document.body.querySelectorAll("*")) {
    let inside = false;
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) inside = inside || scrolls(p);
    if (inside) continue;
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.right > edge) over.push(el.tagName + (el.id ? "#" + el.id : ""));
  }
  const kernels = Array.from(document.querySelectorAll("td.kernel")).map(td => [td.textContent, td.title]);
  document.body.dataset.imgsTotal = imgs.length;
  document.body.dataset.imgsOk = imgs.filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.dataset.overflow = JSON.stringify(over);
  document.body.dataset.sideways = document.documentElement.scrollWidth > window.innerWidth ? "yes" : "no";
  document.body.dataset.kernels = JSON.stringify(kernels);
});
</script>"""


def _layout(page: str, tmp_path, width: int = 1280) -> dict:
    import json

    path = tmp_path / f"page{width}.html"
    path.write_text(page.replace("<head>", "<head>" + LAYOUT_PROBE, 1), encoding="utf-8")
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
             "--disable-quic", "--disable-background-networking", "--disable-component-update",
             f"--user-data-dir={tmp_path / f'p{width}'}", f"--window-size={width},1000", "--virtual-time-budget=5000",
             "--dump-dom", path.as_uri()]
    dom = subprocess.run(flags, capture_output=True, text=True, timeout=180).stdout
    found = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', dom[dom.index("<body"):dom.index(">", dom.index("<body"))]))
    out = {k: html.unescape(v) for k, v in found.items()}
    return {"imgs": (int(out["imgs-total"]), int(out["imgs-ok"])), "overflow": json.loads(out["overflow"]),
            "sideways": out["sideways"], "kernels": json.loads(out["kernels"])}


def _not_blank(page: str, tmp_path) -> None:
    """A screenshot of the page holds drawn content: many colours, most of it not white."""
    from PIL import Image

    from bubblescope.reports.html import screenshot_html

    src = tmp_path / "shot.html"
    src.write_text(page, encoding="utf-8")
    png = screenshot_html(src, tmp_path / "shot.png", width=1280, height=2400)
    with Image.open(png) as im:
        rgb = im.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 20) or []
        white = sum(n for n, c in colours if c == (255, 255, 255))
    assert len(colours) > 50 and white < 0.95 * rgb.width * rgb.height


def doc_kernel(doc: dict) -> str:
    return g.engine(doc, "reference-cudagraph")["timeline"]["top_kernels"][0]["name"]


def _reader_doc() -> dict:
    from bubblescope.reports.intrakernel import activity_profile

    doc = _gpu_doc()
    doc["counters"] = g.counters_section()
    mk = g.engine(doc, "megakernel")
    mk["intrakernel"]["activity"] = activity_profile(mk["intrakernel"]["tasks"], bins=40, bytes_by_opcode={
        "qkv": 1e6, "attn": 1e5, "oproj": 1e6, "mlp": 1e6, "lm_head": 1e9})  # passes the NVML peak: said in words
    long = ("void at::native::elementwise_kernel<128, 4, " + "at::native::Functor<float>, " * 12
            + "float>(int, at::native::Functor<float>)")
    g.engine(doc, "reference-cudagraph")["timeline"]["top_kernels"][0]["name"] = long
    return doc


@pytest.mark.parametrize("width", [1280, 800])
def test_the_report_as_a_reader_sees_it(tmp_path, width):
    """Every figure decodes, no table or figure runs past the page (narrow windows included), kernel names show
    short with the full name as their title; and the check does fire on an element wider than the page."""
    doc = _reader_doc()
    page = render_html(doc)
    seen = _layout(page, tmp_path, width)
    n = page.count("<img")
    assert seen["imgs"] == (n, n) and n == 6  # five sections' figures and one megakernel view
    assert seen["overflow"] == [] and seen["sideways"] == "no", seen["overflow"]
    assert [text for text, title in seen["kernels"] if title == doc_kernel(doc)] == [
        "at::native::elementwise_kernel<…>(…)"]
    wide = page.replace("<h2 id=\"findings\">", '<div id="too-wide" style="width:3000px">x</div><h2 id="findings">', 1)
    assert _layout(wide, tmp_path, width)["overflow"] == ["DIV#too-wide"]


def test_the_report_screenshot_is_not_blank(tmp_path):
    _not_blank(render_html(_reader_doc()), tmp_path)


def test_the_trace_report_as_a_reader_sees_it(tmp_path):
    from bubblescope.profiler.trace.ranksummary import summarize_rank_traces
    from bubblescope.reports.trace_findings import find_trace
    from bubblescope.reports.trace_html import render_trace_html

    from . import tracegen as tg
    from .test_trace_findings import launch_bound_events

    full = ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>"
            "(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8::Params)")
    events = [dict(e, name=full) if e.get("name") == "gemv" else e for e in launch_bound_events(20)]
    path = tg.write(tmp_path / "t.json", tg.document(events, rank=None))
    summary = summarize_rank_traces([path])
    page = render_trace_html(summary, find_trace(summary))
    seen = _layout(page, tmp_path)
    n = page.count("<img")
    assert seen["imgs"] == (n, n) and n >= 1
    assert seen["overflow"] == [] and seen["sideways"] == "no", seen["overflow"]
    assert ["cutlass::Kernel2<…>(…)", full] in seen["kernels"]
    _not_blank(page, tmp_path)
