"""``benchmarks/run.py``, the benchmark driver: the cases each suite plans, a case's time limit, log and status,
the records a run leaves (environment, manifest, tarball), and ``decode_latency.py``'s skip rule for engines the
registry does not know or the device cannot run. Every case here is a short Python process, so this runs on CPU."""

from __future__ import annotations

import json
import sys
import tarfile
import time
from pathlib import Path

import pytest

from .conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


_load = load_benchmark


run = _load("run")


def test_decode_and_ladder_plan_one_decode_latency_case_per_model(tmp_path):
    cases = run.plan("decode", ["llama-3.2-1b", "qwen3-0.6b"], tmp_path, 300, [])
    assert [c.name for c in cases] == ["decode_latency_llama-3.2-1b", "decode_latency_qwen3-0.6b"]
    argv = cases[1].argv
    assert argv[1].endswith("benchmarks/decode_latency.py") and argv[argv.index("--models") + 1] == "qwen3-0.6b"
    assert argv[argv.index("--out") + 1] == str(tmp_path / "decode_latency_qwen3-0.6b.json")
    ladder = run.plan("ladder", ["llama-3.2-1b"], tmp_path, 400, ["--runs", "2"])[0].argv
    # the ladder in its order, eager to the megakernel, and the extra arguments passed through
    assert ladder[ladder.index("--engines") + 1].split(",") == [
        "reference", "reference-cudagraph", "reference-compile", "reference-fused", "reference-fused-pdl",
        "megakernel-noprefetch", "megakernel"]
    assert ladder[-2:] == ["--runs", "2"]
    cases = run.plan("ladder", ["llama-3.2-1b"], tmp_path, 400, [])
    assert [c.name for c in cases] == ["decode_latency_ladder_llama-3.2-1b", "fused_sweep_llama-3.2-1b",
                                       "fused_profile_llama-3.2-1b", "fused_profile_llama-3.2-1b_pdl",
                                       "fused_profile_llama-3.2-1b_pdl_early"]
    early = cases[-1].argv
    assert early[early.index("--pdl-early") + 1] == "1" and "--pdl" in early


def test_prefill_and_fp8_say_not_available_until_their_code_exists(tmp_path):
    prefill = run.plan("prefill", ["llama-3.2-1b"], tmp_path, 300, [])[0]
    if (ROOT / "benchmarks" / "prefill.py").is_file():
        assert prefill.skip is None and "main" in " ".join(prefill.argv)
    else:
        assert prefill.argv is None and prefill.skip.startswith("not available")
    fp8 = run.plan("fp8", ["llama-3.2-1b"], tmp_path, 300, [])[0]
    if "--weights" in run.decode_latency_options():
        assert fp8.argv[fp8.argv.index("--weights") + 1] == "fp8"
    else:
        assert fp8.argv is None and fp8.skip.startswith("not available")


def test_the_other_suites_plan_their_scripts(tmp_path):
    assert run.plan("gpu-tests", ["m"], tmp_path, 500, [])[0].argv[3:6] == ["-q", "-m", "gpu"]
    assert run.plan("trace-parse", ["m"], tmp_path, 600, [])[0].argv[1].endswith("trace_parse.py")
    sweep = run.plan("sweep", ["llama-3.2-1b"], tmp_path, 200, [], "gates", (128, 4096))
    assert [c.name for c in sweep] == ["gluon_check_gates_llama-3.2-1b-128", "gluon_check_gates_llama-3.2-1b-4096"]
    assert {c.name for c in run.plan("sanitize", ["m"], tmp_path, 200, [])} == {
        "sanitizer_memcheck", "sanitizer_racecheck", "sanitizer_fused_memcheck", "sanitizer_fused_racecheck"}


def _case(name, code, limit=30.0):
    return run.Case(name, [sys.executable, "-c", code], limit)


def test_a_case_past_its_limit_is_killed_and_recorded_as_timeout(tmp_path):
    t0 = time.monotonic()
    o = run.run_case(_case("slow", "import time; print('started', flush=True); time.sleep(60)", limit=1.0),
                     tmp_path, dict(__import__("os").environ))
    assert time.monotonic() - t0 < 20
    assert (o.status, o.rc) == ("timeout", 124)
    log = (tmp_path / "slow.log").read_text()
    assert "started" in log and log.rstrip().endswith("rc=124")


def test_a_case_records_its_status_log_and_headline(tmp_path):
    env = dict(__import__("os").environ)
    ok = run.run_case(_case("fine", "print('3 passed, 1 skipped')"), tmp_path, env)
    bad = run.run_case(_case("broken", "import sys; print('boom'); sys.exit(3)"), tmp_path, env)
    skipped = run.run_case(run.Case("absent", None, 10, skip="not available: x"), tmp_path, env)
    assert (ok.status, ok.rc, ok.headline) == ("ok", 0, "3 passed, 1 skipped")
    assert (bad.status, bad.rc, bad.headline) == ("failed", 3, "boom")
    assert (skipped.status, skipped.rc, skipped.headline) == ("skipped", None, "not available: x")
    assert not (tmp_path / "absent.log").exists()


def test_headline_of_a_decode_latency_record(tmp_path):
    rec = tmp_path / "d.json"
    rec.write_text(json.dumps({"models": {"llama-3.2-1b": {"engines": {
        "reference": {"status": "ok", "token_ms_p50": 11.0},
        "reference-fused-pdl": {"status": "skipped", "reason": "needs Hopper"},
        "megakernel": {"status": "ok", "token_ms_p50": 0.7104}}}}}))
    case = run.Case("d", ["x"], 1, record=str(rec))
    assert run.headline(case, tmp_path / "none.log", tmp_path) == \
        "llama-3.2-1b: p50 ms reference 11.000, megakernel 0.710; 1 skipped"


def test_a_run_leaves_environment_manifest_and_tarball(tmp_path, monkeypatch, capsys):
    cases = [_case("first", "print('hello')"), _case("second", "import sys; sys.exit(1)"),
             run.Case("third", None, 5, skip="ncu (Nsight Compute) not found on PATH")]
    monkeypatch.setattr(run, "plan", lambda *a, **k: cases)
    monkeypatch.setenv("BUBBLESCOPE_COMMIT", "0123abc")
    out = tmp_path / "rec"
    rc = run.main(["--suite", "decode", "--out", str(out), "--wheels", str(tmp_path / "none")])
    assert rc == 1  # the second case failed
    env = json.loads((out / "env.json").read_text())
    assert env["commit"] == "0123abc" and env["date"].endswith("+00:00") and "torch" in env["versions"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert [(c["name"], c["status"]) for c in manifest["cases"]] == [("first", "ok"), ("second", "failed"),
                                                                      ("third", "skipped")]
    with tarfile.open(tmp_path / "rec.tgz") as tar:
        assert {"rec/env.json", "rec/manifest.json", "rec/first.log", "rec/second.log"} <= set(tar.getnames())


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "never"
    assert run.main(["--suite", "ladder", "--models", "llama-3.2-1b", "--out", str(out), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "decode_latency_ladder_llama-3.2-1b: [400 s]" in text and "reference-fused-pdl" in text
    assert not out.exists()


def test_an_unknown_suite_is_a_usage_error():
    with pytest.raises(SystemExit) as e:
        run.main(["--suite", "everything"])
    assert e.value.code == 2


def test_decode_latency_skips_engines_the_registry_or_device_rules_out():
    import torch

    from bubblescope.reference_engine.engine import CUDAGRAPH_NEEDS_CUDA
    dl = _load("decode_latency")
    cpu = torch.device("cpu")
    assert dl.skip_reason("no-such-engine", cpu).startswith("not in the engine registry")
    assert dl.skip_reason("reference-cudagraph", cpu) == CUDAGRAPH_NEEDS_CUDA
    assert dl.skip_reason("reference", cpu) is None and dl.skip_reason("reference@stepwise", cpu) is None


def test_decode_latency_reads_engine_params_after_the_engine_name():
    import torch

    dl = _load("decode_latency")
    assert dl.param_overrides("stepwise") == {} and dl.param_overrides("") == {}
    assert dl.param_overrides("norm_stats=atomic:gateup_block_n=4") == {"norm_stats": "atomic", "gateup_block_n": 4}
    cpu = torch.device("cpu")
    assert "the fused engines and the megakernels only" in dl.skip_reason("reference@block_n=2", cpu)
    assert dl.skip_reason("reference-fused@norm_stats=atomic", cpu) is None
