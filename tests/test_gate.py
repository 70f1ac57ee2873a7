"""CI gate: exit 0 when every check holds, 1 when one fails (a null metric fails), errors for bad input."""

from __future__ import annotations

import pytest
from rich.console import Console

from . import resultsgen as g
from bubblescope.errors import BubblescopeError
from bubblescope.reports.gate import render_gate, run_gate
from bubblescope.reports.results import Results


def test_all_checks_hold():
    report = run_gate(g.healthy_doc(), min_bandwidth_util=0.6, max_bubble_ratio=0.1, max_token_p99_ms=1.0)
    assert report.engine == "megakernel" and report.exit_code == 0
    assert [(c.name, c.measured, c.limit, c.passed) for c in report.checks] == [
        ("min_bandwidth_util", 0.6453, 0.6, True),
        ("max_bubble_ratio", 0.05, 0.1, True),  # one kernel per step: its in-kernel wait, as the reports show
        ("max_token_p99_ms", 0.83, 1.0, True)]


def test_a_failing_check_exits_1():
    report = run_gate(Results(g.healthy_doc()), min_bandwidth_util=0.7, max_token_p99_ms=0.82)
    assert report.exit_code == 1
    assert [(c.name, c.passed) for c in report.checks] == [("min_bandwidth_util", False), ("max_token_p99_ms", False)]
    assert report.checks[0].detail == "util_peak 64.5 %, limit 70.0 %: fails"


def test_a_missing_metric_fails_closed():
    doc = g.healthy_doc()
    g.engine(doc, "megakernel")["intrakernel"]["wait_ratio"] = None
    g.idle(g.engine(doc, "megakernel"), None)
    report = run_gate(doc, max_bubble_ratio=0.5)
    (check,) = report.checks
    assert report.exit_code == 1 and check.measured is None and not check.passed
    assert "not measured" in check.detail


def test_engine_choice():
    doc = g.healthy_doc()
    assert run_gate(doc, engine="reference-cudagraph", max_token_p99_ms=2).checks[0].measured == 1.15
    g.engine(doc, "megakernel")["status"] = "failed"
    g.engine(doc, "megakernel")["reason"] = "kernel stuck"
    slow = dict(g.engine(doc, "reference-cudagraph"), name="reference")
    slow["latency"] = dict(slow["latency"], token_ms_p50=5.0, token_ms_p90=5.1, token_ms_p99=5.2)
    doc["engines"].append(slow)
    # megakernel is not ok, so the fastest ok engine is gated: reference-cudagraph (1.1 ms) over reference (5 ms).
    assert run_gate(doc, max_token_p99_ms=2).engine == "reference-cudagraph"


def _with_megakernel(p50, gbps):
    doc = g.healthy_doc()
    mk = g.engine(doc, "megakernel")
    mk["latency"].update(token_ms_p50=p50, token_ms_p90=p50, token_ms_p99=p50)
    mk["bandwidth"]["effective_GBps"] = gbps
    return doc


def test_baseline_within_allowed_regression_passes():
    # Baseline: 0.8 ms, 3106.6 GB/s. 5 % allows up to 0.84 ms and down to 3106.6 / 1.05 = 2958.67 GB/s.
    report = run_gate(_with_megakernel(0.83, 2994.3), baseline=g.healthy_doc(), max_regression=0.05)
    assert report.exit_code == 0
    assert [(c.name, c.measured) for c in report.checks] == [("regression_token_ms_p50", 0.83),
                                                             ("regression_effective_GBps", 2994.3)]
    assert report.checks[0].limit == pytest.approx(0.84)
    assert report.checks[1].limit == pytest.approx(2958.666667)


def test_baseline_regression_fails():
    report = run_gate(_with_megakernel(0.9, 2761.4), baseline=g.healthy_doc(), max_regression=0.05)
    assert report.exit_code == 1
    assert [c.passed for c in report.checks] == [False, False]
    assert "baseline 0.8" in report.checks[0].detail


def test_baseline_metric_missing_fails_closed():
    old = g.healthy_doc()
    g.engine(old, "megakernel")["bandwidth"]["effective_GBps"] = None
    report = run_gate(g.healthy_doc(), baseline=old, max_regression=0.05)
    assert [c.passed for c in report.checks] == [True, False]
    assert report.checks[1].limit is None and report.exit_code == 1


def test_a_baseline_without_the_engine_is_named_as_the_baseline():
    """Was "engine 'megakernel': not in the results (engines: none)": which results, the run's or the
    baseline's, was left to guess."""
    old = g.healthy_doc()
    old["engines"] = []
    with pytest.raises(BubblescopeError) as info:
        run_gate(g.healthy_doc(), baseline=old, max_regression=0.05)
    assert str(info.value) == "--baseline: engine 'megakernel': not in the results (engines: none)"


@pytest.mark.parametrize("kwargs, message", [
    ({}, "no checks requested"),
    ({"engine": "nope", "max_bubble_ratio": 0.1}, "--engine: engine 'nope': not in the results"),
    ({"engine": "hf", "max_bubble_ratio": 0.1}, "--engine: engine 'hf': status skipped (transformers is not installed)"),
    ({"min_bandwidth_util": -0.1}, "--min-bandwidth-util: must be a number in [0, 1]"),
    ({"max_bubble_ratio": 1.5}, "--max-bubble-ratio: must be a number in [0, 1]"),
    ({"max_token_p99_ms": float("nan")}, "--max-token-p99-ms: must be a number >= 0"),
    ({"max_regression": 0.05}, "--baseline and --max-regression must be given together"),
    ({"baseline": "BASE"}, "--baseline and --max-regression must be given together"),
])
def test_unusable_input_raises(kwargs, message):
    if kwargs.get("baseline") == "BASE":
        kwargs["baseline"] = g.healthy_doc()
    with pytest.raises(BubblescopeError) as info:
        run_gate(g.healthy_doc(), **kwargs)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_invalid_documents_raise():
    bad = g.healthy_doc()
    del bad["device"]
    with pytest.raises(BubblescopeError, match="results: invalid results document: device: missing"):
        run_gate(bad, max_bubble_ratio=0.1)
    with pytest.raises(BubblescopeError, match="baseline: invalid results document: device: missing"):
        run_gate(g.healthy_doc(), baseline=bad, max_regression=0.1)
    old = g.healthy_doc()
    old["engines"] = [e for e in old["engines"] if e["name"] != "megakernel"]
    with pytest.raises(BubblescopeError, match="engine 'megakernel': not in the results"):
        run_gate(g.healthy_doc(), baseline=old, max_regression=0.1)
    with pytest.raises(BubblescopeError, match="no engine with status ok"):
        run_gate(g.null_metrics_doc() | {"engines": g.healthy_doc()["engines"][2:]}, max_bubble_ratio=0.1)


def test_render_gate():
    console = Console(record=True, width=160, color_system=None)
    render_gate(run_gate(g.healthy_doc(), min_bandwidth_util=0.7, max_bubble_ratio=0.1), console)
    text = console.export_text()
    assert "engine megakernel" in text
    assert "min_bandwidth_util" in text and "FAIL" in text and "PASS" in text
    assert "gate FAILED: 1 of 2 checks failed (exit 1)" in text


def test_render_gate_fits_80_columns():
    # A regression check has the longest names and numbers; at 80 columns (a pipe, a CI log) the table used to be
    # cropped on the right: its border and the end of the detail column were cut off.
    console = Console(record=True, width=80, color_system=None)
    render_gate(run_gate(_with_megakernel(0.83, 2994.3), baseline=g.healthy_doc(), max_regression=0.05), console)
    lines = console.export_text().splitlines()
    rows = [ln.rstrip() for ln in lines if ln.startswith(("│", "┃", "┏", "┡", "└"))]
    assert rows and all(ln[-1] in "│┃┓┩┘" for ln in rows), "\n".join(rows)
    assert max(len(ln.rstrip()) for ln in lines) <= 80
    assert "baseline 0.800 ms, allowed regression 5%" in " ".join(ln.strip("│ ") for ln in rows)


def _run_cli(*args):
    from typer.testing import CliRunner

    from bubblescope.cli import app
    return CliRunner().invoke(app, [str(a) for a in args])


def test_cli_exit_codes_on_hostile_results(tmp_path):
    """gate exits 2 with one ``error:`` line, never a traceback, on a document that once crashed
    validation (an integer beyond float range), and 1 on a document whose metrics are null."""
    import json

    huge = g.healthy_doc()
    huge["engines"][0]["latency"]["token_ms_p99"] = 10**400
    (tmp_path / "huge.json").write_text(json.dumps(huge))
    (tmp_path / "null.json").write_text(json.dumps(g.null_metrics_doc()))
    r = _run_cli("gate", tmp_path / "huge.json", "--max-bubble-ratio", "0.5")
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit) and r.stdout == ""
    expected = (f"error: {tmp_path / 'huge.json'}: invalid results document: engines[0].latency.token_ms_p99: "
                "expected a finite number > 0 (0 is not a measurement: use null), got 1000000000000000000000000000000000000...")
    assert r.stderr.strip().splitlines() == [expected]
    r = _run_cli("gate", tmp_path / "null.json", "--engine", "megakernel", "--max-bubble-ratio", "0.5")
    assert r.exit_code == 1 and r.stdout.endswith("gate FAILED: 1 of 1 check failed (exit 1)\n")


def test_report_with_a_bad_format_writes_no_html(tmp_path):
    import json

    (tmp_path / "r.json").write_text(json.dumps(g.healthy_doc()))
    r = _run_cli("report", tmp_path / "r.json", "--format", "xml", "--html", tmp_path / "r.html")
    assert r.exit_code == 2 and r.stderr == "error: --format: unknown format 'xml'; use text or json\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
    (tmp_path / "dir.html").mkdir()
    r = _run_cli("report", tmp_path / "r.json", "--html", tmp_path / "dir.html")
    assert r.exit_code == 2 and r.stderr.startswith(f"error: --html {tmp_path / 'dir.html'}: exists and is not a regular file")
    r = _run_cli("report", tmp_path / "r.json", "--html", tmp_path / "no" / "r.html")
    assert r.exit_code == 2 and r.stderr == f"error: --html {tmp_path / 'no' / 'r.html'}: no such directory {str(tmp_path / 'no')!r}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.html", "r.json"]


@pytest.mark.parametrize("path, value, shown", [
    (("model", "name"), "stories260k", "model: llama-3.2-1b vs baseline stories260k"),
    (("model", "dtype"), "float32", "dtype: bfloat16 vs baseline float32"),
    (("device", "name"), "x86_64 (2 cores)", "device: NVIDIA H200 vs baseline x86_64 (2 cores)"),
    (("workload", "gen_len"), 32, "gen_len: 128 vs baseline 32"),
])
def test_baseline_of_another_model_device_or_workload_is_refused(tmp_path, path, value, shown):
    """An H200 llama-3.2-1b run gated against a CPU stories260K baseline must not pass: the two must
    agree on model, dtype, device name and workload, or the gate exits 2 unless --allow-mismatch."""
    import json

    base = g.healthy_doc()
    base[path[0]][path[1]] = value
    # A faster baseline: the regression checks would fail if they ran.
    for eng in base["engines"]:
        if eng["status"] == "ok":
            eng["latency"]["token_ms_p50"] *= 0.5
            eng["bandwidth"]["effective_GBps"] /= 0.5
    with pytest.raises(BubblescopeError, match="baseline is not comparable") as info:
        run_gate(g.healthy_doc(), baseline=base, max_regression=0.05)
    assert shown in str(info.value) and "--allow-mismatch" in str(info.value)
    assert run_gate(g.healthy_doc(), baseline=base, max_regression=0.05, allow_mismatch=True).exit_code == 1
    (tmp_path / "new.json").write_text(json.dumps(g.healthy_doc()))
    (tmp_path / "base.json").write_text(json.dumps(base))
    r = _run_cli("gate", tmp_path / "new.json", "--baseline", tmp_path / "base.json", "--max-regression", "0.05")
    assert r.exit_code == 2 and r.stderr.startswith("error: gate: the baseline is not comparable (")
    r = _run_cli("gate", tmp_path / "new.json", "--baseline", tmp_path / "base.json", "--max-regression", "0.05",
                 "--allow-mismatch")
    assert r.exit_code == 1 and "regression_token_ms_p50" in r.stdout


@pytest.mark.parametrize("option, value, hint", [
    ("--min-bandwidth-util", "35", "did you mean 0.35 for 35 %?"),
    ("--max-bubble-ratio", "20", "did you mean 0.2 for 20 %?"),
])
def test_a_limit_given_in_percent_gets_a_hint(tmp_path, option, value, hint):
    """A gate limit given in percent (35 for 0.35) is an error with the fraction suggested."""
    import json

    (tmp_path / "r.json").write_text(json.dumps(g.healthy_doc()))
    r = _run_cli("gate", tmp_path / "r.json", option, value)
    assert r.exit_code == 2 and hint in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("key, value, shown", [
    ("num_hidden_layers", 2, "num_hidden_layers: 16 vs baseline 2"),
    ("hidden_size", 1024, "hidden_size: 2048 vs baseline 1024"),
])
def test_a_baseline_of_another_architecture_is_not_comparable(key, value, shown):
    """Two runs of one model name (a checkpoint folder called "model", say) with 16 and 2 layers are two
    workloads: the slower one is not a regression of the other, so the gate refuses (exit 2) rather than fail."""
    base = g.healthy_doc()
    base["model"]["config"][key] = value
    with pytest.raises(BubblescopeError, match="baseline is not comparable") as info:
        run_gate(g.healthy_doc(), baseline=base, max_regression=0.05)
    assert shown in str(info.value)


def test_a_baseline_of_another_size_is_not_comparable_without_a_config():
    """Where a document records no config (it may be null), the parameter count still tells the models apart;
    with both the same, the regression checks run (here they hold: the same numbers)."""
    base, new = g.healthy_doc(), g.healthy_doc()
    base["model"]["config"] = new["model"]["config"] = None
    assert run_gate(new, baseline=base, max_regression=0.05).exit_code == 0
    base["model"]["config"] = {"hidden_size": 2048, "num_hidden_layers": 2}  # one config recorded: not compared
    assert run_gate(new, baseline=base, max_regression=0.05).exit_code == 0
    base["model"]["parameters"] = new["model"]["parameters"] // 8
    with pytest.raises(BubblescopeError, match="baseline is not comparable") as info:
        run_gate(new, baseline=base, max_regression=0.05)
    assert f"parameters: {new['model']['parameters']} vs baseline {base['model']['parameters']}" in str(info.value)
