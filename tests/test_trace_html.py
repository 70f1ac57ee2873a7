"""``diagnose trace`` with findings and ``--html``: the per-step rows of the summary, the findings in the terminal,
JSON and HTML outputs, the HTML file's content, and the refusals (empty, missing directory, an input trace, an
unreadable trace: no file left behind)."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from bubblescope.cli import app
from bubblescope.profiler.trace.ranksummary import summarize_rank_traces

from . import tracegen as tg
from .conftest import TRACES
from .test_ranks import RANK0, RANK1, _rank_events
from .test_trace_findings import launch_bound_events, synced_events


def _run(*args):
    return CliRunner().invoke(app, ["diagnose", "trace", *map(str, args)])


@pytest.fixture
def launch_bound(tmp_path):
    return tg.write(tmp_path / "lb.json", tg.document(launch_bound_events(), rank=None))


def test_step_rows_per_step_with_warm_up_flagged(tmp_path):
    """synced_events: walls 3000, 1000, 1000, 1000; busy 700 of a span [s+20, s+910) = 890 in each step."""
    path = tg.write(tmp_path / "s.json", tg.document(synced_events(), rank=None))
    rows = summarize_rank_traces([path], skip_steps=1)["files"][0]["step_rows"]
    assert rows == [{"step": i, "warmup": i == 0, "wall_us": wall, "busy_us": 700, "span_us": 890,
                     "bubble_ratio": pytest.approx(1 - 700 / 890), "kernels": 3, "launches": 3}
                    for i, wall in enumerate((3000, 1000, 1000, 1000))]


def test_text_output_ends_with_the_findings(launch_bound):
    r = _run(launch_bound)
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert out.index("Decode steps") < out.index("Findings") and "PROBLEM" in out
    assert "Launch-bound: the GPU is idle 79% of the decode window" in " ".join(out.split())


def test_text_output_says_when_no_rule_fired(tmp_path):
    path = tg.write(tmp_path / "one.json", tg.document([tg.launch(90, 1, 1), tg.kernel("k", 100, 4, 1)]))
    r = _run(path)
    assert r.exit_code == 0 and "Findings: none" in r.stdout


def test_json_adds_findings_and_keeps_its_keys(launch_bound):
    r = _run(launch_bound, "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert list(doc) == ["schema", "files", "ranks", "findings"] and doc["schema"] == "bubblescope.trace/1"
    (f,) = doc["findings"]
    assert f["rule"] == "launch-bound" and f["file"] == str(launch_bound)
    assert set(f) == {"rule", "severity", "file", "rank", "title", "evidence", "advice"}
    assert f["evidence"]["kernels_per_step"] == 100 and f["evidence"]["host_wait_per_step_us"] == 594
    assert doc["files"][0]["step_rows"][0] == {"step": 0, "warmup": False, "wall_us": 1000, "busy_us": 200,
                                               "span_us": 794, "bubble_ratio": pytest.approx(1 - 200 / 794),
                                               "kernels": 100, "launches": 100}


def test_html_holds_findings_step_table_and_plot(launch_bound, tmp_path):
    out = tmp_path / "report.html"
    r = _run(launch_bound, "--html", out)
    assert r.exit_code == 0, r.output
    assert r.stderr.strip().splitlines()[-1] == f"wrote {out}"
    html = out.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and "Launch-bound: the GPU is idle 79% of the decode window" in html
    assert "kernels per step 100" in html and "host wait per step 594.0 µs" in html  # the evidence
    # the per-step table: step 0 of 1000 µs, busy 200, span 794, idle 594, bubble ratio 0.748, 100 kernels
    row = re.search(r"<tr><td>0</td>.*?</tr>", html[html.index("<h3>Per step</h3>"):], re.S).group(0)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
    assert cells == ["0", "", "1.00 ms", "200.0 µs", "794.0 µs", "594.0 µs", "0.748", "100", "100"]
    assert "bubble ratio (decode window)" in html and "0.785" in html  # the step figures: 1 - 600/2794
    assert html.count('src="data:image/png;base64,') == 1  # the busy/idle plot, inside the file
    assert not re.search(r'(src|href)="(https?:|//)', html)  # self-contained


def test_html_escapes_kernel_names(tmp_path):
    events = [tg.launch(90, 1, 1), tg.kernel("<script>alert(1)</script>", 100, 4, 1)]
    path = tg.write(tmp_path / "x.json", tg.document(events))
    out = tmp_path / "x.html"
    assert _run(path, "--html", out).exit_code == 0
    html = out.read_text(encoding="utf-8")
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_html_of_two_ranks_holds_their_tables_plot_and_findings(tmp_path):
    for r, kernels in ((0, RANK0), (1, RANK1)):
        tg.write(tmp_path / f"rank{r}.json.gz", tg.document(_rank_events(r, kernels), rank=r))
    out = tmp_path / "ranks.html"
    r = _run(tmp_path, "--html", out)
    assert r.exit_code == 0, r.output
    html = out.read_text(encoding="utf-8")
    assert "2 ranks, marker &#39;bubblescope.decode_step&#39;, 2 steps compared" in html
    assert "Communication-heavy" in html and "Rank imbalance" in html and "all ranks" in html
    assert html.count('src="data:image/png;base64,') == 3  # each rank's steps, and the ranks together


@pytest.mark.parametrize("value", ["", "  "])
def test_empty_html_is_refused_before_reading(value, launch_bound, tmp_path):
    r = _run(tmp_path / "missing.json", "--html", value)  # refused before the (missing) trace is looked at
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == ["error: --html: empty; leave it out or name the HTML file to write"]


def test_html_in_a_missing_directory_or_over_an_input_is_refused(launch_bound, tmp_path):
    r = _run(launch_bound, "--html", tmp_path / "no" / "r.html")
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.strip() == f"error: --html {tmp_path / 'no' / 'r.html'}: no such directory {str(tmp_path / 'no')!r}"
    before = launch_bound.read_bytes()
    r = _run(launch_bound, "--html", launch_bound)
    assert r.exit_code == 2
    assert r.stderr.strip() == f"error: --html {launch_bound}: is an input trace ({launch_bound}); choose another path"
    assert launch_bound.read_bytes() == before
    r = _run(launch_bound, "--html", tmp_path)
    assert r.exit_code == 2 and "exists and is not a regular file" in r.stderr


def test_unreadable_trace_leaves_no_html(launch_bound, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "ts": 1')
    out = tmp_path / "out.html"
    r = _run(bad, "--html", out)
    assert r.exit_code == 2 and not out.exists()
    r = _run(launch_bound, bad, "--html", out)  # one good file beside it: still no report of part of the input
    assert r.exit_code == 2 and not out.exists()
    assert f"note: --html {out}: not written, 1 trace could not be read" in r.stderr
    assert "Launch-bound" in " ".join(r.stdout.split())  # the terminal still reports the readable file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "lb.json"]  # no temp file either


def test_an_existing_report_is_replaced_whole(launch_bound, tmp_path):
    out = tmp_path / "r.html"
    out.write_text("old")
    assert _run(launch_bound, "--html", out).exit_code == 0
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>") and (out.stat().st_mode & 0o777) == 0o644


@pytest.mark.skipif(not TRACES.is_dir(), reason=f"{TRACES} not found (../shared is absent)")
def test_html_of_a_real_trace(tmp_path):
    out = tmp_path / "alexnet.html"
    r = _run(TRACES / "a100_alexnet.json.gz", "--html", out)
    assert r.exit_code == 0, r.output
    html = out.read_text(encoding="utf-8")
    assert "GPU 0 idle 99% of the trace" in html and "a100_alexnet.json.gz" in html
    assert "ampere_sgemm_32x32_sliced1x4_tn" in html  # top kernels of the device (no steps in this trace)
