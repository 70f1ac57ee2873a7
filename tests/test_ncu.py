"""Nsight Compute counters: the ``--csv`` parser, the launch plan, the missing / refused ncu paths, and the
findings that read them.

``tests/data/ncu_handwritten.csv`` is HAND-WRITTEN after ncu's ``--csv --print-units base`` format (long
format, every field quoted, the column names ncu uses, ``==PROF==`` lines and the application's own output
before the header, thousands grouped with commas, ``n/a`` for a metric with no value). Launch 0 of
``megakernel`` carries counters recorded on the H200 (DRAM 48.8 % of peak, L2 hit 35 %,
warps active 24.9 %, 2.52 GB read, 1.07 ms); launch 1 and the argmax kernel are made up to exercise
aggregation. ``tests/data/ncu_h200_megakernel.csv`` is a CSV RECORDED on the H200 (2026-12-01, the Gluon
megakernel on llama-3.2-1b, the command in ``benchmarks/results/h200-2026-12-01-s4/ncu_megakernel.cmd``): its
values below are what ncu printed there.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bubblescope.counters import collect_counters, generate_argv, launch_plan
from bubblescope.errors import BubblescopeError
from bubblescope.profiler.ncu import kernel_summary, ncu_command, parse_ncu_csv, run_ncu, stall_reasons
from bubblescope.reports.findings import find

CSV = (Path(__file__).parent / "data" / "ncu_handwritten.csv").read_text()
RECORDED = (Path(__file__).parent / "data" / "ncu_h200_megakernel.csv").read_text()
ARGMAX = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, " \
         "unsigned int, long, 4> >(at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, long, 4>)"


def test_parse_skips_the_preamble_and_reads_grouped_numbers():
    rows = parse_ncu_csv(CSV)
    assert len(rows) == 18
    first = rows[0]
    assert (first["id"], first["kernel"], first["metric"], first["unit"], first["value"]) == \
        (0, "megakernel", "dram__bytes_read.sum", "byte", 2.52e9)
    assert rows[-1]["kernel"] == ARGMAX and rows[-1]["value"] is None and rows[-1]["text"] == "n/a"
    with pytest.raises(BubblescopeError, match="no CSV header"):
        parse_ncu_csv("==PROF== Connected to process 1\n==WARNING== No kernels were profiled.\n")


def test_recorded_h200_csv_parses_with_every_metric_we_ask_for():
    from bubblescope.profiler.ncu import METRICS
    rows = parse_ncu_csv(RECORDED)  # the generate command's own output and ==PROF== lines come first
    assert {r["metric"] for r in rows} == set(METRICS)  # ncu on the H200 accepted every metric name we ask for
    (mk,) = kernel_summary(rows)
    assert (mk["name"], mk["launches"]) == ("megakernel", 1)
    assert mk["duration_us"] == pytest.approx(790.208)                    # "790,208" ns
    assert mk["metrics"]["dram__bytes_read.sum"] == 2_473_451_776
    assert mk["metrics"]["dram__throughput.avg.pct_of_peak_sustained_elapsed"] == pytest.approx(65.14)
    assert mk["metrics"]["launch__registers_per_thread"] == 255
    assert next(iter(stall_reasons(mk["metrics"]).items())) == ("barrier", pytest.approx(48.44))


def test_low_occupancy_finding_skips_the_warp_specialized_gluon_kernel():
    (mk,) = kernel_summary(parse_ncu_csv(RECORDED))
    doc = {"device": {"type": "cuda"}, "counters": {"available": True, "engines": [
        {"engine": "megakernel", "available": True, "kernels": [mk]}]}}
    eng = {"name": "megakernel", "status": "ok", "compile": {"implementation": "triton"}}
    ids = lambda e: {f["rule"] for f in find({**doc, "engines": [e]})}  # noqa: E731
    assert "counters-low-occupancy" in ids(eng)
    assert "counters-low-occupancy" not in ids({**eng, "compile": {"implementation": "gluon"}})


def test_kernel_summary_means_per_kernel_and_durations_in_us():
    mk, am = kernel_summary(parse_ncu_csv(CSV))
    assert mk["name"] == "megakernel" and mk["launches"] == 2
    assert mk["duration_us"] == pytest.approx(1070.0 + 1030.0)          # 1,070,000 ns + 1,030.00 µs
    assert mk["metrics"]["dram__throughput.avg.pct_of_peak_sustained_elapsed"] == pytest.approx((48.8 + 50.8) / 2)
    assert mk["metrics"]["dram__bytes_read.sum"] == pytest.approx(2.5e9)
    assert mk["metrics"]["lts__t_sector_hit_rate.pct"] == pytest.approx(36.0)
    assert mk["units"]["launch__registers_per_thread"] == "register/thread"
    assert (am["name"], am["duration_us"], am["metrics"].get("lts__t_sector_hit_rate.pct")) == (ARGMAX, 36.0, None)
    assert list(stall_reasons(mk["metrics"]).items()) == [("long_scoreboard", pytest.approx(41.0)),
                                                         ("membar", pytest.approx(13.0))]


def test_missing_ncu_says_why_and_does_not_raise(monkeypatch, tmp_path):
    monkeypatch.setenv("BUBBLESCOPE_NCU", str(tmp_path / "no-ncu"))
    res = run_ncu(["python", "-c", "pass"], launch_skip=0, launch_count=1)
    assert res["available"] is False and "ncu (Nsight Compute) not found" in res["reason"]
    doc = {"device": {"type": "cuda"}, "engines": [{"name": "megakernel", "status": "ok"}]}
    section = collect_counters(doc, "llama-3.2-1b", "cuda:0", "bfloat16")
    assert section["available"] is False and "not found" in section["reason"] and section["engines"] == []
    cpu = collect_counters({"device": {"type": "cpu"}, "engines": []}, "tiny-llama", "cpu", "float32")
    assert cpu["available"] is False and cpu["reason"].startswith("CPU run")


def _fake_ncu(monkeypatch, tmp_path):
    exe = tmp_path / "ncu"
    exe.write_text("")
    monkeypatch.setenv("BUBBLESCOPE_NCU", str(exe))
    return str(exe)


def test_run_ncu_command_line_and_refused_counters(monkeypatch, tmp_path):
    exe = _fake_ncu(monkeypatch, tmp_path)
    seen = []

    def ok(cmd, **kw):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout=CSV, stderr="")
    res = run_ncu(["python3", "-m", "bubblescope", "generate"], 20, 1, kernel_regex="megakernel", runner=ok)
    assert res["available"] and res["kernels"][0]["name"] == "megakernel"
    cmd = seen[0]
    assert cmd[0] == exe and cmd[-4:] == ["python3", "-m", "bubblescope", "generate"]
    for flag, value in (("--clock-control", "none"), ("--launch-skip", "20"), ("--launch-count", "1"),
                        ("-k", "regex:megakernel"), ("--print-units", "base")):
        assert cmd[cmd.index(flag) + 1] == value
    assert "--csv" in cmd and "lts__t_sector_hit_rate.pct" in cmd[cmd.index("--metrics") + 1].split(",")

    def refused(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, stdout="==PROF== Connected to process 9\n", stderr=(
            "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance "
            "Counters on the target device 0.\n"))
    res = run_ncu(["x"], 0, 1, runner=refused)
    assert res["available"] is False and "ERR_NVGPUCTRPERM" in res["reason"] and "run as root" in res["reason"]

    def hangs(cmd, **kw):
        raise subprocess.TimeoutExpired(cmd, kw["timeout"])
    assert run_ncu(["x"], 0, 1, runner=hangs, timeout_s=5)["reason"] == "ncu timed out after 5 s"


def test_launch_plan_and_the_profiled_command():
    assert launch_plan({"name": "megakernel", "compile": {"launches_per_step": 1}}) == \
        {"kernel_regex": "megakernel", "launch_skip": 16, "launch_count": 1}
    assert launch_plan({"name": "megakernel-stages", "compile": {"launches_per_step": 82}})["launch_skip"] == 16 * 82
    assert launch_plan({"name": "reference", "timeline": {"kernels_per_step": 770.4}}) == \
        {"kernel_regex": None, "launch_skip": 16 * 770, "launch_count": 300}
    argv = generate_argv("llama-3.2-1b", "megakernel", "cuda:0", "bfloat16", 0, tuning="t.json")
    assert argv[1:5] == ["-m", "bubblescope", "generate", "llama-3.2-1b"] and argv[-2:] == ["--tuning", "t.json"]


def test_counters_feed_findings(monkeypatch, tmp_path):
    _fake_ncu(monkeypatch, tmp_path)
    eng = {"name": "megakernel", "status": "ok", "compile": {"launches_per_step": 1}}
    doc = {"device": {"type": "cuda"}, "engines": [eng]}
    doc["counters"] = collect_counters(doc, "llama-3.2-1b", "cuda:0", "bfloat16", run=lambda target, **plan: {
        "available": True, "reason": None, "command": ["ncu"],
        "kernels": kernel_summary(parse_ncu_csv(CSV))})
    assert doc["counters"]["available"] and doc["counters"]["engines"][0]["launch_skip"] == 16
    got = {f["rule"]: f for f in find(doc)}
    occ, mem = got["counters-low-occupancy"], got["counters-memory"]
    assert occ["title"] == "Low occupancy from 255 registers: 25.0 % of warps active in the top kernel (ncu)"
    assert occ["evidence"]["launch__registers_per_thread"] == 255
    assert mem["title"] == ("DRAM throughput 49.8 % of peak in the top kernel (ncu); L2 hit rate 36 %: weights "
                            "stream from HBM, as expected at batch 1; warps mostly stalled on long_scoreboard (41.0 %)")


def test_diagnose_counters_on_cpu_says_why_and_goes_on(tmp_path):
    from rich.console import Console

    from bubblescope.diagnosis import diagnose
    from bubblescope.reports.terminal import render_results
    res = diagnose("tiny-llama", engines=["reference"], prompt_len=4, gen_len=4, runs=1, warmup=0, context_sweep=[],
                   profile_steps=2, out=tmp_path, counters=True)
    assert res.engines[0]["status"] == "ok"
    assert res.doc["counters"]["available"] is False and res.doc["counters"]["reason"].startswith("CPU run")
    console = Console(record=True, width=200)
    render_results(res, console)
    assert "Hardware counters (ncu): unavailable — CPU run" in console.export_text()
