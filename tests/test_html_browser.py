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
from bubblescope.reports.plots import chosen_programs

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
