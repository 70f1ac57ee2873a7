"""Fresh-user findings on the CLI: errors name the option as typed, sampling options are checked, the sync
metric has one name, a config file's model is named after it, trace JSON times carry no float leftovers, and
a closed pipe ends the command quietly."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from . import resultsgen as g
from .conftest import ROOT

TRACE = ROOT / "tests" / "data" / "h200_reference_eager.json.gz"
TINY = dict(model_type="llama", hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)


def _cli(*args):
    from typer.testing import CliRunner

    from bubblescope.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def _env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}


# --- 2. every bad-input error names the option as the user typed it -------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["diagnose", "trace", TRACE, "--step-marker", ""], "--step-marker '': must be a non-empty name"),
    (["diagnose", "trace", TRACE, "--step-marker", " "], "--step-marker ' ': must be a non-empty name"),
    (["diagnose", "trace", TRACE, "--idle-threshold-us", "-1"],
     "--idle-threshold-us -1.0: must be a finite number of µs >= 0"),
    (["diagnose", "trace", TRACE, "--idle-threshold-us", "nan"],
     "--idle-threshold-us nan: must be a finite number of µs >= 0"),
    (["diagnose", "trace", TRACE, "--idle-threshold-us", "inf"],
     "--idle-threshold-us inf: must be a finite number of µs >= 0"),
    (["diagnose", "model", "tiny-llama", "--engines", "reference,nope"],
     "--engines: unknown engine 'nope'; known engines: "),
    (["generate", "tiny-llama", "--prompt-ids", "1", "--engine", "nope"], "--engine: unknown engine 'nope'; known "),
    (["gate", "RESULTS", "--min-bandwidth-util", "-1"], "--min-bandwidth-util: must be a number in [0, 1], got -1.0"),
    (["gate", "RESULTS", "--max-bubble-ratio", "35"], "--max-bubble-ratio: must be a number in [0, 1], got 35.0 "
                                                      "(--max-bubble-ratio is a fraction: did you mean 0.35 for 35 %?)"),
    (["gate", "RESULTS", "--engine", "nope", "--max-bubble-ratio", "0.5"],
     "--engine: engine 'nope': not in the results"),
    (["diagnose", "model", "tiny-llama", "--engines", "reference", "--device", "cpu", "--prompt-len", "100000"],
     "--prompt-len 100000 + --gen-len 32 + --profile-steps 8: the workload needs 100048 positions (with spare "
     "steps) but tiny-llama supports max_position_embeddings="),
    (["diagnose", "model", "tiny-llama", "--engines", "reference", "--device", "cpu", "--context-sweep", "99999"],
     "--context-sweep 99999: the workload needs 100016 positions"),
    (["diagnose", "model", "", "--engines", "reference", "--device", "cpu"], "MODEL: empty; leave it out"),
    (["diagnose", "model", "--checkpoint", "/nonexistent", "--engines", "reference", "--device", "cpu"],
     "--checkpoint: /nonexistent: no such file or directory"),
    (["diagnose", "model", "tiny-llama", "--engines", "reference", "--dtype", ""], "--dtype: empty; leave it out"),
    (["diagnose", "model", "tiny-llama", "--engines", "reference", "--context-sweep", ",,"],
     "--context-sweep: no context lengths in ',,'"),
    (["diagnose", "model", "tiny-llama", "--engines", "reference", "--device", "cpu", "--seed", "-1"],
     "--seed: diagnose model records it in results.json: use 0 to 2**64 - 1, got -1"),
    (["tune", "tiny-llama", "--knob", "block_k", "--values", "16", "--steps", "0", "--device", "cpu"],
     "--steps: must be at least 1, got 0"),
    (["tune", "tiny-llama", "--knob", "block_k", "--values", "16", "--contexts", ",", "--device", "cpu"],
     "--contexts: no context lengths given"),
])
def test_bad_input_names_the_option(tmp_path, args, message):
    """Was "step marker ''", "idle threshold -1.0", "unknown engine", "gate: min_bandwidth_util": the Python
    names; `tune --steps 0` silently became the default 3."""
    results = tmp_path / "r.json"
    results.write_text(json.dumps(g.healthy_doc()))
    args = [results if a == "RESULTS" else a for a in args]
    r = _cli(*args, *(["--out", tmp_path / "o"] if args[0] in ("tune",) or args[:2] == ["diagnose", "model"]
                      else []))
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(f"error: {message}") and r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("gpus, message", [
    (0, "--device cuda:99: no CUDA GPU is available on this machine"),
    (1, "--device cuda:99: no such GPU on this machine (visible: cuda:0)"),
    (2, "--device cuda:99: no such GPU on this machine (visible: cuda:0 to cuda:1)"),
])
@pytest.mark.parametrize("command", [["diagnose", "model", "tiny-llama", "--engines", "reference"],
                                     ["generate", "tiny-llama", "--prompt-ids", "1"]])
def test_a_gpu_index_beyond_the_machine_is_one_line_naming_device(tmp_path, monkeypatch, gpus, message, command):
    """`--device cuda:99` said "--device cuda: ..." without a GPU and, with fewer GPUs than 100, passed the check
    and failed at the first allocation ("invalid device ordinal", a traceback) after the model was built."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    r = _cli(*command, "--device", "cuda:99", *(["--out", tmp_path / "o"] if command[0] == "diagnose" else []))
    assert r.exit_code == 2, r.output
    assert r.stderr == f"error: {message}\n" and r.stdout == ""
    assert not (tmp_path / "o").exists()


# --- 3. one name for the sync metric ---------------------------------------------------------------------------

def test_every_report_calls_sync_share_the_sync_share():
    """The headline table said "sync wait" and the trace view "sync share" for docs/design.md's sync_share."""
    from bubblescope.profiler.trace.summary import summarize_traces
    from bubblescope.reports.html import render_html
    from bubblescope.reports.terminal import render_results
    from bubblescope.reports.trace_terminal import render_trace_summary

    texts = {}
    console = Console(record=True, width=240)
    render_results(g.healthy_doc(), console)
    texts["terminal"] = console.export_text()
    console = Console(record=True, width=240)
    render_trace_summary(summarize_traces([str(TRACE)]), console)
    texts["trace"] = console.export_text()
    texts["html"] = render_html(g.healthy_doc())
    for name, text in texts.items():
        flat = " ".join(text.replace("</th><th>", " ").split()).lower()
        assert "sync share" in flat, name
        assert "sync wait" not in flat, name


# --- 4. a model given by a config file is named after it -------------------------------------------------------

def _config(path: Path, **extra) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**TINY, **extra}))
    return path


def test_config_names(tmp_path, monkeypatch):
    from bubblescope.models.config import ModelConfig

    name = lambda p: ModelConfig.from_hf_config(p).name  # noqa: E731
    assert name(_config(tmp_path / "qwen3-tiny.json")) == "qwen3-tiny"
    assert name(_config(tmp_path / "My-Model" / "config.json")) == "My-Model"
    assert name(tmp_path / "My-Model") == "My-Model"
    monkeypatch.chdir(tmp_path / "My-Model")
    assert name(Path("config.json")) == "My-Model"  # was "custom": Path("config.json").parent.name is ""
    snap = tmp_path / "hub" / "models--Qwen--Qwen3-0.6B" / "snapshots" / ("0123456789abcdef" * 3)[:40]
    assert name(_config(snap / "config.json")) == "Qwen/Qwen3-0.6B"
    other = tmp_path / "cache" / "snapshots" / ("fedcba9876543210" * 3)[:40]
    assert name(_config(other / "config.json", _name_or_path="meta-llama/Llama-3.2-1B")) == "meta-llama/Llama-3.2-1B"
    assert name(_config(other / "config.json", _name_or_path="/data/ckpt/run-7/")) == "run-7"
    assert name(_config(other / "config.json", model_type="qwen3")) == "qwen3"


def test_generate_names_a_config_file_model_after_the_file(tmp_path, monkeypatch):
    """`bubblescope generate cfg.json` said "dummy weights of custom"."""
    monkeypatch.chdir(tmp_path)
    _config(tmp_path / "cfg.json")
    r = _cli("generate", "cfg.json", "--prompt-ids", "1,2", "--max-new-tokens", "2", "--device", "cpu")
    assert r.exit_code == 0, r.output
    assert "dummy weights of cfg:" in r.stderr and "custom" not in r.stderr


# --- 5, 6. sampling options ------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "-0.5"])
def test_temperature_must_be_finite_and_not_negative(value):
    """--temperature inf was accepted (every logit / inf = 0: a uniform draw); nan and negatives got typer's
    "should be greater than or equal to 0", wrong for nan."""
    r = _cli("generate", "tiny-llama", "--prompt-ids", "1", "--temperature", value)
    assert r.exit_code == 2
    assert r.stderr == (f"error: --temperature: must be a finite number >= 0 (0 means greedy), "
                        f"got {float(value)}\n")


@pytest.mark.parametrize("value", ["1e-300", "7e-46"])
def test_a_temperature_float32_cannot_hold_is_refused(value):
    """--temperature 1e-300 became 0 in float32: logits / 0 gave NaN probabilities and a traceback. 7e-46 is
    below half of 2**-149 (7.006e-46), so it rounds to 0 too."""
    r = _cli("generate", "tiny-llama", "--prompt-ids", "1", "--temperature", value)
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == (f"error: --temperature: {value} is 0 in float32, where the logits are divided by it (NaN "
                        "probabilities); use 0 for greedy or at least 1.4e-45, the smallest positive float32\n")


def test_the_smallest_accepted_temperature_samples_the_most_likely_token():
    import torch

    from bubblescope.generation import MIN_TEMPERATURE, SamplingParams, sample
    assert MIN_TEMPERATURE == torch.finfo(torch.float32).smallest_normal * 2.0 ** -23  # 2**-126 * 2**-23
    logits = torch.tensor([0.5, 2.0, -1.0, 1.999])
    for t in (MIN_TEMPERATURE, 7.1e-46):  # 7.1e-46 rounds up to 2**-149
        params = SamplingParams(temperature=t)
        assert {sample(logits, params, torch.Generator().manual_seed(s)) for s in range(20)} == {1}


def test_top_p_nan_is_refused_by_its_own_message():
    r = _cli("generate", "tiny-llama", "--prompt-ids", "1", "--temperature", "1", "--top-p", "nan")
    assert r.exit_code == 2 and r.stderr == "error: --top-p: must be in (0, 1] (1 disables it), got nan\n"


def test_filters_without_sampling_are_warned_once():
    from bubblescope.generation import SamplingParams

    assert SamplingParams(top_k=5).unused() == [
        "--top-k 5 has no effect with --temperature 0 (greedy decoding takes the most likely token); give "
        "--temperature > 0 to sample"]
    assert [w.split()[0] for w in SamplingParams(top_k=5, top_p=0.9).unused()] == ["--top-k", "--top-p"]
    assert SamplingParams(temperature=0.7, top_k=5, top_p=0.9).unused() == []
    assert SamplingParams().unused() == []
    r = _cli("generate", "tiny-llama", "--prompt-ids", "1", "--max-new-tokens", "2", "--top-k", "5")
    assert r.exit_code == 0, r.output
    assert r.stderr.count("warning: --top-k 5 has no effect with --temperature 0") == 1
    r = _cli("generate", "tiny-llama", "--prompt-ids", "1", "--max-new-tokens", "2", "--top-k", "5",
             "--temperature", "0.8")
    assert r.exit_code == 0 and "warning" not in r.stderr


# --- 7. trace JSON times at a fixed precision ------------------------------------------------------------------

def test_round_times_rounds_only_times():
    from bubblescope.reports.json_out import round_times

    doc = {"busy_us": 12.300000000000001, "share": 0.12345678901, "kernels": 3, "marker": "x_us",
           "launch_delay_us": {"p50": 1.23456789, "n": 4}, "rows": [{"total_us": 103.17399999999996}],
           "span_us": None, "ok": True}
    assert round_times(doc) == {"busy_us": 12.3, "share": 0.12345678901, "kernels": 3, "marker": "x_us",
                                "launch_delay_us": {"p50": 1.235, "n": 4}, "rows": [{"total_us": 103.174}],
                                "span_us": None, "ok": True}
    assert doc["busy_us"] == 12.300000000000001  # the input is left alone


def test_trace_json_times_have_at_most_three_decimals():
    from bubblescope.profiler.trace.ranksummary import summarize_rank_traces

    r = subprocess.run([sys.executable, "-m", "bubblescope", "diagnose", "trace", str(TRACE), "--format", "json"],
                       capture_output=True, text=True, env=_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    printed = json.loads(r.stdout)
    from bubblescope.reports.trace_findings import find_trace

    exact = summarize_rank_traces([str(TRACE)], keep_going=True)
    exact["findings"] = find_trace(exact)  # printed after the summary; their evidence times rounded the same way
    pairs = []

    def walk(a, b, key, in_time):
        in_time = in_time or (isinstance(key, str) and key.endswith("_us"))
        if isinstance(a, dict):
            assert a.keys() == b.keys()
            for k in a:
                walk(a[k], b[k], k, in_time)
        elif isinstance(a, list):
            assert len(a) == len(b)
            for x, y in zip(a, b):
                walk(x, y, key, in_time)
        elif isinstance(b, float) and in_time:
            pairs.append((a, b))
        else:
            assert a == b, key

    walk(printed, json.loads(json.dumps(exact)), None, False)
    assert len(pairs) > 20
    for shown, value in pairs:
        assert shown == round(value, 3) and math.isclose(shown, value, abs_tol=5e-4)
    assert any(round(v, 3) != v for _, v in pairs)  # the summary itself keeps full precision


# --- 8. a closed pipe ends the command quietly -----------------------------------------------------------------

@pytest.mark.skipif(not hasattr(signal, "SIGPIPE"), reason="no SIGPIPE on this platform")
@pytest.mark.parametrize("args", [["diagnose", "trace", str(TRACE)], ["engines"]])
def test_a_closed_pipe_ends_the_command_like_cat(args):
    """`bubblescope diagnose trace X | head -3` exited 1 (click's EPIPE handling); now it ends by SIGPIPE, as
    cat and grep do (the shell reports 141), with nothing on stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "bubblescope", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=_env())
    proc.stdout.close()  # the reader is gone before the first line
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == -signal.SIGPIPE
    assert err == b""


def test_version_is_the_installed_distribution_version():
    """``bubblescope --version``: the package metadata's version (pyproject.toml), exit code 0."""
    from importlib.metadata import version

    from typer.testing import CliRunner

    from bubblescope.cli import app

    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.stdout.strip() == f"bubblescope {version('bubblescope')}"


# --- generate's wording and options that were taken silently --------------------------------------------------

@pytest.mark.parametrize("engine", ["reference", "megakernel"])
def test_one_new_token_is_said_as_no_decode_step_for_that_reason(engine):
    """`--max-new-tokens 1` printed "no decode step (the first token was EOS)" though it was not EOS; the
    megakernel's warm-up of 3 tokens overran its 2-position cache ("the KV cache of 2 positions is full")."""
    r = _cli("generate", "tiny-llama", "--device", "cpu", "--prompt-ids", "1", "--max-new-tokens", "1",
             "--engine", engine)
    assert r.exit_code == 0, r.output
    assert "no decode step (--max-new-tokens 1: the one token is the prefill's, timed in TTFT), 1 token\n" in r.stderr
    assert "EOS" not in r.stderr


@pytest.mark.parametrize("args", [
    ["generate", "tiny-llama", "--prompt-ids", "1"],
    ["diagnose", "model", "tiny-llama", "--out", "o"],
    ["diagnose", "model", "tiny-llama", "--tp", "2", "--out", "o"],
    ["tune", "tiny-llama", "--knob", "prefetch", "--values", "off", "--out", "o"],
])
def test_a_cpu_index_is_refused_not_ignored(tmp_path, monkeypatch, args):
    """`--device cpu:5` ran on the CPU as if it were `cpu`."""
    monkeypatch.chdir(tmp_path)
    r = _cli(*args, "--device", "cpu:5")
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == ("error: --device cpu:5: the CPU is one device (torch runs on all its cores), it has no index "
                        "5; use cpu\n")
    assert list(tmp_path.iterdir()) == []


def test_mode_with_another_engine_than_the_reference_is_refused():
    """--mode (the reference engine's eager/cudagraph/compile) was ignored silently with --engine megakernel."""
    r = _cli("generate", "tiny-llama", "--device", "cpu", "--prompt-ids", "1", "--engine", "megakernel",
             "--mode", "compile")
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == ("error: --mode compile: sets the reference engine's mode, not --engine megakernel's; leave "
                        "--mode out, or use --engine reference\n")


@pytest.mark.parametrize("value", ["1,,2", "1_0", "\u0661\u0662", "1 2", "0x10", "+-1"])
def test_prompt_ids_refuses_what_is_not_a_comma_separated_list_of_integers(value):
    r = _cli("generate", "tiny-llama", "--device", "cpu", "--prompt-ids", value, "--max-new-tokens", "1")
    assert r.exit_code == 2, r.output
    assert f"--prompt-ids: expected comma-separated integers, got {value!r}" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.output


def test_prompt_ids_accepts_spaces_around_its_commas():
    r = _cli("generate", "tiny-llama", "--device", "cpu", "--prompt-ids", " 1, 2 ,3", "--max-new-tokens", "1")
    assert r.exit_code == 0, r.output
