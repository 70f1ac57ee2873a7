"""Terminal output a reader can read: wrapped without parting numbers from units, within 80 and 100 columns; the
context sweep and the counters printed; library warnings held back as notes; `engines`, `gate` and `tune` formatted."""

from __future__ import annotations

import logging
import re
import warnings

import pytest
from rich.console import Console
from rich.text import Text
from typer.testing import CliRunner

from . import resultsgen as g
from bubblescope.cli import app
from bubblescope.libwarnings import library_warnings, notes
from bubblescope.reports.gate import render_gate, run_gate
from bubblescope.reports.layout import Wrapped, break_points
from bubblescope.reports.results import write_results
from bubblescope.reports.terminal import render_results

# a number and the unit after it, as the reports write them
NUMBER_UNIT = re.compile(r"\d[\d,]*(?:\.\d+)? (?:%|ms|µs|s|GB/s|GB|MB|kB|x)(?![\w/])")


def _text(renderable_or_doc, width: int) -> str:
    console = Console(record=True, width=width, color_system=None)
    if isinstance(renderable_or_doc, dict):
        render_results(renderable_or_doc, console)
    else:
        console.print(renderable_or_doc)
    return console.export_text()


def _counter_doc() -> dict:
    doc = g.healthy_doc()
    doc["counters"] = g.counters_section()
    # a finding whose evidence names ncu metrics (as the counters rules write them), typed in by hand
    doc["findings"] = [{"rule": "counters-memory", "severity": "info", "engine": "megakernel",
                        "title": "DRAM throughput 64.7 % of peak in the top kernel (ncu)",
                        "evidence": {"dram__throughput.avg.pct_of_peak_sustained_elapsed": 64.7,
                                     "lts__t_sector_hit_rate.pct": 2.44, "dram__bytes_read.sum": 2_473_532_160.0,
                                     "duration_us": 795.52, "stall_long_scoreboard_pct": 21.57},
                        "advice": "long_scoreboard stalls wait on global loads (more bytes in flight help)."}]
    return doc


def test_wrapping_keeps_each_number_with_its_unit():
    """rich wraps at any space, a no-break space included: "1.2" / "ms". By hand at width 20: the words are
    "aaaa bbbb cccc" (14) then "12.5 ms" would end at 22, so it opens the next line, whole."""
    text = "aaaa bbbb cccc 12.5 ms dddd 62.0 %, 3,107 GB/s"
    lines = [text[s:e] for s, e in break_points(text, 20)]
    assert lines == ["aaaa bbbb cccc", "12.5 ms dddd 62.0 %,", "3,107 GB/s"]
    word = "kernel" * 5
    assert [word[s:e] for s, e in break_points(word, 12)] == ["kernelkernel"] * 2 + ["kernel"]  # folded
    styled = _text(Wrapped(Text.assemble(("WARN", "bold"), " aaaa bbbb cccc 12.5 ms"), hang=2, indent=1), 20)
    assert styled.splitlines() == [" WARN aaaa bbbb cccc", "   12.5 ms"]  # 19 columns after the indent


@pytest.mark.parametrize("width", [80, 100])
def test_the_report_with_counters_fits_and_never_splits_a_number(width):
    doc = _counter_doc()
    text = _text(doc, width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    joined = " ".join(text.split())
    for found in NUMBER_UNIT.findall(joined):
        assert any(found in line for line in lines), found  # every number+unit whole on one line
    # metric names whole, with their underscores; the stall reason as ncu names it
    assert "dram__throughput.avg.pct_of_peak_sustained_elapsed 64.7 %" in joined
    assert "lts__t_sector_hit_rate.pct 2.4 %" in joined and "stall long_scoreboard 21.6 %" in joined
    at = next(i for i, line in enumerate(lines) if line.startswith("  megakernel_persistent"))
    assert lines[at - 1].strip() == "megakernel"  # the engine's heading row
    assert lines[at].split() == ["megakernel_persistent", "795.5", "µs", "64.7", "%", "2.4", "%", "12.5", "%", "255"]
    assert lines[at + 1].strip() == "top stall: barrier 48.5 %"
    assert "top stall: long_scoreboard 61.0 %" in joined  # the ncu reason name, underscore kept
    assert "hf: unavailable: ERR_NVGPUCTRPERM:" in joined
    assert "Counters come from a separate run:" in joined and "not the timed runs above" in joined


def test_the_context_sweep_prints_in_the_terminal():
    text = _text(g.healthy_doc(), 80)
    lines = text.splitlines()
    start = lines.index("Context sweep: ms per token and bandwidth against context length")
    # _sweep by hand: (2,480,000,000 + 32,768 × 4,096) B / 0.85 ms = 3,075.6 GB/s = 63.9 % of 4,814.3
    assert lines[start + 3].split() == ["reference-cudagraph", "128", "1.100", "2258", "46.9", "%"]
    assert lines[start + 8].split() == ["4,096", "0.850", "3076", "63.9", "%"]
    doc = g.healthy_doc()
    for eng in doc["engines"]:
        eng["sweep"] = []
    assert "Context sweep" not in _text(doc, 80)


def test_a_cpu_sweep_leaves_out_and_names_the_bandwidth_column_nobody_measured():
    doc = g.healthy_doc()
    for eng in doc["engines"][:2]:
        for r in eng["sweep"]:
            r["util_peak"] = None
    text = _text(doc, 80)
    assert "% peak" not in text.split("Context sweep")[1].splitlines()[1] and "not measured: % peak" in text


def test_library_warnings_are_held_back_and_said_once_each():
    log = logging.getLogger("transformers.modeling_utils")
    with library_warnings() as caught:
        for _ in range(3):
            warnings.warn("To copy construct from a tensor, use clone()", UserWarning)
        warnings.warn("an old API", DeprecationWarning)  # hidden by Python's defaults: hidden here too
        log.warning("Some weights were not initialized")
    assert notes(caught) == ["UserWarning: To copy construct from a tensor, use clone() (3 times)",
                             "transformers warning: Some weights were not initialized"]
    with warnings.catch_warnings(record=True) as after:
        warnings.simplefilter("always")
        warnings.warn("outside", UserWarning)
    assert len(after) == 1  # the filters are back


def test_a_handler_a_library_installs_inside_the_block_prints_nothing_until_it_ends():
    """transformers installs its stderr handler ("[transformers] ...") when first imported, which bubblescope does
    inside the block: a warning it logged then printed in the middle of the run, beside its note."""
    import io

    logger = logging.getLogger("tokenizers")
    before = list(logger.handlers), logger.propagate
    printed = io.StringIO()
    own = logging.StreamHandler(printed)
    try:
        with library_warnings() as caught:
            logger.addHandler(own)  # what the library's first import does
            logger.propagate = False
            logging.getLogger("tokenizers.models").warning("field out of range")
        assert printed.getvalue() == ""
        assert notes(caught) == ["tokenizers warning: field out of range"]
        assert own in logger.handlers and logger.propagate is False and "addHandler" not in vars(logger)
        logging.getLogger("tokenizers.models").warning("after the block")
        assert printed.getvalue() == "after the block\n"  # the library's set-up holds afterwards
    finally:
        logger.handlers, logger.propagate = before


def test_a_torch_warning_never_reaches_the_report(tmp_path, monkeypatch):
    """A torch UserWarning (raised by torch's C++ code) printed in the middle of the output; now it is a note on
    stderr after the report, and stdout holds the report alone."""
    import torch

    from bubblescope.reports import terminal

    real = terminal.render_results

    def noisy(results, console):
        torch.tensor(torch.tensor([1.0]))  # torch warns: copy construct from a tensor
        real(results, console)
    monkeypatch.setattr(terminal, "render_results", noisy)
    path = write_results(g.healthy_doc(), tmp_path / "r.json")
    r = CliRunner().invoke(app, ["report", str(path)])
    assert r.exit_code == 0, r.output
    assert "Warning" not in r.stdout and "copy construct" not in r.stdout and "Latency (ms per token)" in r.stdout
    (note,) = [line for line in r.stderr.splitlines() if "copy construct" in line]
    assert note.startswith("note: library warning: UserWarning: To copy construct from a tensor")


def test_engines_fits_100_columns_on_a_wide_terminal(monkeypatch):
    from bubblescope.engines import ENGINES

    monkeypatch.setenv("COLUMNS", "200")
    r = CliRunner().invoke(app, ["engines"])
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    assert max(map(len, lines)) <= 100 and all(line == line.rstrip() for line in lines)
    assert [line.split()[0] for line in lines if not line.startswith(" ")] == list(ENGINES)
    for spec in ENGINES.values():
        assert spec.description in " ".join(r.stdout.split())


def test_gate_prints_numbers_with_units():
    rep = run_gate(g.healthy_doc(), min_bandwidth_util=0.6454, max_bubble_ratio=0.1, max_token_p99_ms=1.0)
    # 0.6453 vs 0.6454 would both read 64.5 %: shown to the decimal that tells them apart
    assert [c.detail for c in rep.checks] == ["util_peak 64.53 %, limit 64.54 %: fails",
                                              "bubble_ratio (in-kernel wait) 5.0 %, limit 10.0 %: holds",
                                              "token_ms_p99 0.830 ms, limit 1.000 ms: holds"]
    console = Console(record=True, width=80, color_system=None)
    render_gate(rep, console)
    text = console.export_text()
    assert "64.53 %" in text and "0.830 ms" in text and "0.6453" not in text and "0.83," not in text
    old = g.healthy_doc()
    new = g.healthy_doc()
    g.engine(new, "megakernel")["bandwidth"]["effective_GBps"] = 2994.3
    rep = run_gate(new, baseline=old, max_regression=0.05)
    assert rep.checks[1].detail == ("effective_GBps 2,994 GB/s, limit 2,959 GB/s: holds (baseline 3,107 GB/s, "
                                    "allowed regression 5%)")
