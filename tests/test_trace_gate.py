"""``diagnose trace --model ... --json`` from the command line, and ``gate`` on its result: per-step GB/s from
the trace's own step times read independently, the result document, bad input, comparability."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bubblescope.errors import BubblescopeError
from bubblescope.reports.trace_gate import load_gate_document, run_any_gate

from . import resultsgen as g
from . import tracegen as tg

DATA = Path(__file__).parent / "data"
H200_TRACE = DATA / "h200_reference_cudagraph.json.gz"
# Llama-3.2-1B in bf16: 1,235,814,400 parameters (Hugging Face's count, the tied table once) + the embedding row
# a step reads besides the tied LM head (2048), 2 bytes each; the KV cache: 2 × 16 layers × 8 heads × 64 × 2 bytes
# per position.
LLAMA_1B_WEIGHT_BYTES = 2 * (1_235_814_400 + 2048)
LLAMA_1B_KV_BYTES = 32_768


def _cli(*args):
    from typer.testing import CliRunner

    from bubblescope.cli import app
    return CliRunner().invoke(app, [str(a) for a in args])


def _one_line_error(r, start):
    assert r.exit_code == 2 and r.exception is None or isinstance(r.exception, SystemExit), r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {start}"), r.stderr
    assert "Traceback" not in r.output


def test_per_step_GBps_from_the_traces_own_step_times():
    r = _cli("diagnose", "trace", H200_TRACE, "--model", "llama-3.2-1b", "--context", 36, "--format", "json")
    assert r.exit_code == 0, r.stderr
    (f,) = json.loads(r.stdout)["files"]
    bw = f["bandwidth"]
    with gzip.open(H200_TRACE, "rt") as fh:  # the marked steps' durations, read without bubblescope
        walls = [e["dur"] for e in sorted(json.load(fh)["traceEvents"], key=lambda e: e.get("ts", 0))
                 if e.get("cat") == "user_annotation" and e["name"].startswith("bubblescope.decode_step#")]
    assert len(walls) == len(bw["rows"]) == 3
    for k, (row, wall) in enumerate(zip(bw["rows"], walls)):
        nbytes = LLAMA_1B_WEIGHT_BYTES + (36 + k + 1) * LLAMA_1B_KV_BYTES
        assert row["bytes"] == nbytes and row["context"] == 36 + k
        assert row["effective_GBps"] == pytest.approx(nbytes / wall / 1e3, rel=1e-12)
        assert row["util_peak"] == pytest.approx(nbytes / wall / 1e3 / 4800, rel=1e-12)  # the H200 datasheet
        assert row["floor_us"] == pytest.approx(nbytes / 4800 / 1e3, abs=5e-4)  # µs printed to 3 decimals
    assert bw["peak_source"].startswith("datasheet (NVIDIA H200")


def _trace(tmp_path, name="t.json", gpu="NVIDIA H200", walls=(1000, 1200, 1100)):
    return tg.marked_steps_trace(tmp_path / name, gpu, walls)


def test_json_result_and_gate_on_it(tmp_path):
    out = tmp_path / "result.json"
    r = _cli("diagnose", "trace", _trace(tmp_path), "--bytes-per-step", 2_400_000_000, "--json", out)
    assert r.exit_code == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["schema"] == "bubblescope.trace-result/1" and doc["device"] == {
        "name": "NVIDIA H200", "peak_GBps": 4800.0, "peak_source": doc["device"]["peak_source"]}
    (f,) = doc["files"]
    # steps of 1000, 1200, 1100 µs: median 1.1 ms; 2.4e9 bytes in it: 2181.8 GB/s, 45.5 % of 4800; floor 0.5 ms
    assert f["steps"] == 3 and f["steps_found_by"] == "marker" and f["step_ms_p50"] == pytest.approx(1.1)
    assert f["step_ms_p99"] == pytest.approx(1.1 + 0.98 * 0.1)  # numpy's linear p99 of 1.0, 1.1, 1.2
    assert f["effective_GBps"] == pytest.approx(2.4e9 / 1100 / 1e3) and f["util_peak"] == pytest.approx(2.4e6 / 1100 / 4800)
    assert f["floor_ms"] == pytest.approx(0.5) and f["over_floor_ms"] == pytest.approx(0.6)
    # kernels [10, 410], [1010, 1410], [2210, 2610]: busy 1200 of a 2600-µs decode window
    assert f["bubble_ratio"] == pytest.approx(1 - 1200 / 2600) and f["kernels_per_step"] == 1
    ok = _cli("gate", out, "--min-bandwidth-util", 0.45, "--max-token-p99-ms", 1.2)
    assert ok.exit_code == 0 and "gate PASSED: 2 of 2 checks hold" in ok.stdout
    fail = _cli("gate", out, "--min-bandwidth-util", 0.5)
    assert fail.exit_code == 1 and "gate FAILED: 1 of 1 check failed" in fail.stdout
    (check,) = run_any_gate(load_gate_document(out), min_bandwidth_util=0.5).checks
    assert (check.name, check.engine, check.passed) == ("min_bandwidth_util", "t.json", False)
    assert check.detail == "util_peak 0.454545, limit 0.5: fails"


def test_gate_regression_and_not_comparable(tmp_path):
    old, new, other = tmp_path / "old.json", tmp_path / "new.json", tmp_path / "other.json"
    assert _cli("diagnose", "trace", _trace(tmp_path, "a.json"), "--model", "tiny-llama", "--json", old).exit_code == 0
    slower = _trace(tmp_path, "b.json", walls=(1300, 1300, 1300))
    assert _cli("diagnose", "trace", slower, "--model", "tiny-llama", "--json", new).exit_code == 0
    r = _cli("gate", new, "--baseline", old, "--max-regression", 0.1)
    assert r.exit_code == 1 and "regression_step_ms_p50" in r.stdout  # 1.3 ms > 1.1 ms × 1.1
    r = _cli("gate", new, "--baseline", old, "--max-regression", 0.2)
    assert r.exit_code == 0
    h100 = _trace(tmp_path, "c.json", gpu="NVIDIA H100 80GB HBM3")
    assert _cli("diagnose", "trace", h100, "--model", "tiny-llama", "--json", other).exit_code == 0
    _one_line_error(_cli("gate", other, "--baseline", old, "--max-regression", 0.1),
                    "gate: the baseline is not comparable (device: NVIDIA H100 80GB HBM3 vs baseline NVIDIA H200)")
    assert _cli("gate", other, "--baseline", old, "--max-regression", 0.5, "--allow-mismatch").exit_code == 0
    qwen = tmp_path / "qwen.json"
    assert _cli("diagnose", "trace", _trace(tmp_path, "d.json"), "--model", "qwen3-0.6b", "--json", qwen).exit_code == 0
    _one_line_error(_cli("gate", qwen, "--baseline", old, "--max-regression", 0.1),
                    "gate: the baseline is not comparable (model: qwen3-0.6b vs baseline tiny-llama)")
    results = tmp_path / "results.json"
    results.write_text(json.dumps(g.healthy_doc()))
    _one_line_error(_cli("gate", new, "--baseline", results, "--max-regression", 0.1),
                    "gate: the baseline is not comparable: a trace result")
    _one_line_error(_cli("gate", results, "--baseline", new, "--max-regression", 0.1),
                    "gate: the baseline is not comparable: a results document (diagnose model) against a trace")
    _one_line_error(_cli("gate", new, "--engine", "megakernel", "--max-bubble-ratio", 0.5),
                    "--engine megakernel: a trace result")


def test_gate_fails_closed_on_a_trace_result_without_bandwidth(tmp_path):
    out = tmp_path / "r.json"
    assert _cli("diagnose", "trace", _trace(tmp_path), "--json", out).exit_code == 0  # no model: no util
    r = _cli("gate", out, "--min-bandwidth-util", 0.1)
    assert r.exit_code == 1 and "gate FAILED" in r.stdout
    (check,) = run_any_gate(load_gate_document(out), min_bandwidth_util=0.1).checks
    assert check.measured is None and check.detail == "util_peak not measured (null): failing closed"
    broken = json.loads(out.read_text())
    broken["files"][0]["util_peak"] = "high"
    out.write_text(json.dumps(broken))
    _one_line_error(_cli("gate", out, "--min-bandwidth-util", 0.1), f"{out}: invalid trace result: files[0].util_peak")


@pytest.mark.parametrize("args, start", [
    (("--model", "no-such-model"), "--model: unknown model 'no-such-model'"),
    (("--bytes-per-step", 0), "--bytes-per-step: must be a whole number of bytes > 0, got 0"),
    (("--context", 10), "--context: sizes the model's KV cache; give --model too"),
    (("--bytes-per-step", 10, "--peak-gbps", 0), "--peak-gbps: must be a number of GB/s > 0, got 0.0"),
    (("--peak-gbps", 3000), "--peak-gbps: the peak is compared with each step's bytes"),
])
def test_bad_options_exit_2_and_leave_the_result_file(tmp_path, args, start):
    out = tmp_path / "r.json"
    out.write_text("previous run")
    _one_line_error(_cli("diagnose", "trace", _trace(tmp_path), *args, "--json", out), start)
    assert out.read_text() == "previous run"


def test_unknown_gpu_is_stated_not_an_error_and_an_unreadable_trace_writes_nothing(tmp_path):
    r = _cli("diagnose", "trace", _trace(tmp_path, gpu="Test GPU"), "--bytes-per-step", 1_000_000)
    assert r.exit_code == 0 and "peak bandwidth unknown (Test GPU is not in bubblescope's table" in \
        " ".join(r.stdout.split())
    out = tmp_path / "r.json"
    out.write_text("previous run")
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [')
    r = _cli("diagnose", "trace", _trace(tmp_path), bad, "--bytes-per-step", 1_000_000, "--json", out)
    assert r.exit_code == 2 and f"note: --json {out}: not written, 1 trace could not be read" in r.stderr
    assert out.read_text() == "previous run"


def test_a_captured_trace_records_its_context_and_the_bytes_follow_it(tmp_path):
    from bubblescope.profiler.capture import capture_decode_trace
    from bubblescope.tracediagnose import diagnose_trace_files

    from .test_capture import CFG, ToyDecoder

    config = tmp_path / "toy.json"
    config.write_text(json.dumps(CFG.to_hf_dict()))
    cap = capture_decode_trace(ToyDecoder(), [1, 2, 3], steps=4, warmup=2, out_path=tmp_path / "toy.json.gz")
    (f,) = diagnose_trace_files([cap.trace_path], model=str(config), dtype="float32")["files"]
    assert f["first_context"] == cap.start_position + 1 == 6  # 3 prompt + 2 warm-up positions, then its own
    bw = f["bandwidth"]
    assert bw["context_source"] == "trace" and [r["context"] for r in bw["rows"]] == [6, 7, 8, 9]
    # the toy model by hand (fp32): one layer of norms 2·16, q and o 2·16·16, k and v 2·8·16, MLP 3·32·16, plus an
    # embedding row, the final norm and the 40·16 LM head: 3,008 weights, 12,032 bytes; KV 2·8·4 = 64 bytes each
    with gzip.open(cap.trace_path, "rt") as fh:
        walls = [e["dur"] for e in sorted(json.load(fh)["traceEvents"], key=lambda e: e.get("ts", 0))
                 if e.get("cat") == "user_annotation" and e["name"].startswith("bubblescope.decode_step#")]
    for row, wall, context in zip(bw["rows"], walls, (6, 7, 8, 9)):
        assert row["bytes"] == 12_032 + (context + 1) * 64
        assert row["effective_GBps"] == pytest.approx(row["bytes"] / wall / 1e3, rel=1e-6)
    assert bw["peak_GBps"] is None and bw["verdict"].endswith("no floor or % of peak (give --peak-gbps)")


def test_a_captured_trace_records_its_warm_up_and_diagnose_trace_leaves_it_out(tmp_path):
    # diagnose model traces one more step than it measures and leaves the first out; the trace says so, so that
    # diagnose trace states the same figures by default, and --skip-steps still decides when given
    from bubblescope.profiler.capture import capture_decode_trace
    from bubblescope.tracediagnose import diagnose_trace_files

    from .test_capture import ToyDecoder

    cap = capture_decode_trace(ToyDecoder(), [1, 2, 3], steps=4, warmup=2, out_path=tmp_path / "toy.json.gz",
                               profiled_warmup=1)
    (f,) = diagnose_trace_files([cap.trace_path])["files"]
    assert (f["warmup_steps"], f["warmup_steps_recorded"]) == (1, 1)
    assert [r["warmup"] for r in f["step_rows"]] == [True, False, False, False]
    (g,) = diagnose_trace_files([cap.trace_path], skip_steps=0)["files"]
    assert (g["warmup_steps"], g["warmup_steps_recorded"]) == (0, 1) and not any(r["warmup"] for r in g["step_rows"])
    with pytest.raises(BubblescopeError, match="profiled_warmup 4 leaves none of the 4 steps measured"):
        capture_decode_trace(ToyDecoder(), [1, 2, 3], steps=4, profiled_warmup=4, out_path=tmp_path / "x.json.gz")


def test_a_recorded_warm_up_step_moves_the_median_step_out_of_the_figures(tmp_path):
    # three marked steps of 3,000 (the profiler's first, slow), 1,000 and 1,200 µs: with the record the median is
    # of 1,000 and 1,200 (1,100 µs); without it, of all three (1,200 µs)
    from bubblescope.tracediagnose import diagnose_trace_files

    plain = tg.marked_steps_trace(tmp_path / "plain.json", walls=(3000, 1000, 1200))
    doc = json.loads(plain.read_text())
    doc["bubblescope_warmup_steps"] = "1"
    recorded = tmp_path / "recorded.json"
    recorded.write_text(json.dumps(doc))
    (a,) = diagnose_trace_files([recorded], bytes_per_step=1_000_000)["files"]
    (b,) = diagnose_trace_files([plain], bytes_per_step=1_000_000)["files"]
    assert a["bandwidth"]["summary"]["step_us_p50"] == pytest.approx(1100.0) and a["warmup_steps_recorded"] == 1
    assert b["bandwidth"]["summary"]["step_us_p50"] == pytest.approx(1200.0) and b["warmup_steps_recorded"] is None


def test_a_captured_trace_records_its_dtype_and_the_bytes_follow_it_unless_dtype_is_given(tmp_path):
    """A float32 run's trace read with --model alone was counted in bfloat16, half its bytes."""
    from bubblescope.profiler.capture import capture_decode_trace
    from bubblescope.tracediagnose import diagnose_trace_files

    from .test_capture import CFG, ToyDecoder

    config = tmp_path / "toy.json"
    config.write_text(json.dumps(CFG.to_hf_dict()))
    cap = capture_decode_trace(ToyDecoder(), [1, 2, 3], steps=3, warmup=1, out_path=tmp_path / "toy.json.gz",
                               dtype="float32", weights="bf16")
    (f,) = diagnose_trace_files([cap.trace_path], model=str(config))["files"]
    assert (f["dtype"], f["weights"]) == ("float32", "bf16")
    bw = f["bandwidth"]
    # 3,008 weights of 4 bytes (the toy model counted by hand above) and 64 bytes per KV position in float32
    assert (bw["dtype"], bw["dtype_source"]) == ("float32", "trace")
    assert bw["rows"][0]["bytes"] == 12_032 + (bw["rows"][0]["context"] + 1) * 64
    (given,) = diagnose_trace_files([cap.trace_path], model=str(config), dtype="bf16")["files"]
    assert (given["bandwidth"]["dtype"], given["bandwidth"]["dtype_source"]) == ("bfloat16", "--dtype")
    assert given["bandwidth"]["rows"][0]["bytes"] == 6_016 + (given["bandwidth"]["rows"][0]["context"] + 1) * 32
    from bubblescope.reports.trace_tables import bandwidth_rows

    assert dict(bandwidth_rows(bw))["model"] == f"{bw['model']} in float32 (as the trace records its run)"
    assert dict(bandwidth_rows(given["bandwidth"]))["model"] == f"{bw['model']} in bfloat16"
    plain = capture_decode_trace(ToyDecoder(), [1, 2, 3], steps=3, warmup=1, out_path=tmp_path / "plain.json.gz")
    (old,) = diagnose_trace_files([plain.trace_path], model=str(config))["files"]
    assert old["dtype"] is None and (old["bandwidth"]["dtype"], old["bandwidth"]["dtype_source"]) == (
        "bfloat16", "default")
