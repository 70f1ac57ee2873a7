"""Listing commands stay light, report never overwrites its input, generate streams its text."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from . import resultsgen as g
from .conftest import ROOT, STORIES, STORIES_TOK, needs_stories


@pytest.mark.parametrize("command", ["presets", "engines"])
def test_listing_commands_do_not_import_torch(command):
    """`presets` and `engines` took 7 s importing torch; they need only the registries."""
    code = ("import sys; sys.argv = ['bubblescope', %r]\nfrom bubblescope.cli import app\ntry:\n    app()\n"
            "except SystemExit:\n    pass\nprint('torch imported' if 'torch' in sys.modules else 'no torch')") % command
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "no torch"
    assert ("llama-3.2-1b" if command == "presets" else "megakernel") in r.stdout


def test_report_refuses_to_overwrite_its_input(tmp_path):
    """`report r.json --html r.json` silently replaced the results with HTML."""
    from typer.testing import CliRunner

    from bubblescope.cli import app
    path = tmp_path / "r.json"
    text = json.dumps(g.healthy_doc())
    path.write_text(text)
    (tmp_path / "sub").mkdir()
    for target in (path, tmp_path / "sub" / ".." / "r.json"):
        r = CliRunner().invoke(app, ["report", str(path), "--html", str(target)])
        assert r.exit_code == 2 and r.stderr.startswith(f"error: --html {target}: is the input results file")
        assert path.read_text() == text


class _Writes(io.StringIO):
    def __init__(self):
        super().__init__()
        self.chunks = []

    def write(self, s):
        self.chunks.append(s)
        return super().write(s)


@needs_stories
def test_generate_streams_text_as_it_is_produced():
    """`generate` printed nothing until the end. The stream writes after each token; what it has written
    after k tokens is the tokenizer's own decode of the prompt and those k tokens (or a prefix of it
    when the last piece is an incomplete character), and the whole equals decode(prompt + tokens)."""
    from bubblescope.engines import build_engine
    from bubblescope.generation import TextStream, generate
    from bubblescope.models import load_llama2c
    from bubblescope.models.tokenizer import Llama2cTokenizer

    weights = load_llama2c(STORIES)
    tok = Llama2cTokenizer(STORIES_TOK)
    ids = tok.encode("Once upon a time", bos=True)
    out = _Writes()
    stream = TextStream(tok, ids, out)
    seen = []

    def on_token(t):
        stream.push(t)
        seen.append((len(out.chunks), out.getvalue()))

    res = generate(build_engine("reference", weights, 64), ids, 24, on_token=on_token)
    stream.close()
    assert out.chunks[0] == tok.decode(ids)
    for k, (n_writes, text) in enumerate(seen, start=1):
        assert tok.decode(ids + res.tokens[:k]).startswith(text)
    assert seen[-1][0] > len(res.tokens) // 2  # written token by token, not once at the end
    assert out.getvalue() == tok.decode(ids + res.tokens) + "\n"


def test_stream_without_tokenizer_writes_ids():
    from bubblescope.generation import TextStream

    out = io.StringIO()
    s = TextStream(None, [1, 5], out)
    assert out.getvalue() == "1 5"
    s.push(7)
    assert out.getvalue() == "1 5 7"
    s.close()
    assert out.getvalue() == "1 5 7\n"


def _diagnose(out, **kw):
    from bubblescope.diagnosis import diagnose
    return diagnose("tiny-llama", engines=["reference"], prompt_len=4, gen_len=3, runs=1, warmup=0,
                    profile_steps=2, device="cpu", out=out, **kw)


def test_an_interrupted_run_leaves_the_previous_run_and_a_new_run_leaves_no_stale_traces(tmp_path, monkeypatch):
    """Ctrl-C left the previous results.json/report.html beside new traces, and a run with fewer engines kept
    old traces (CI uploaded them). Now the folder holds one complete run: the old one after an interrupt,
    the new one (and only its traces) after success. A file of the user's own is never touched."""
    import bubblescope.diagnosis.measure as dg

    out = tmp_path / "out"
    (out / "traces").mkdir(parents=True)
    (out / "traces" / "megakernel.json.gz").write_bytes(b"old trace")
    (out / "results.json").write_text("old results")
    (out / "report.html").write_text("old report")
    (out / "notes.txt").write_text("mine")
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    real = dg.profile_engine

    def interrupted(*args):
        real(*args)              # the new trace is written (into the staging folder) ...
        raise KeyboardInterrupt  # ... then the user presses Ctrl-C

    monkeypatch.setattr(dg, "profile_engine", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _diagnose(out)
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before and sorted(p.name for p in out.iterdir()) == ["notes.txt", "report.html",
                                                                         "results.json", "traces"]
    monkeypatch.setattr(dg, "profile_engine", real)
    _diagnose(out)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "report.html", "results.json", "traces"]
    assert [p.name for p in (out / "traces").iterdir()] == ["reference.json.gz"]
    doc = json.loads((out / "results.json").read_text())
    assert [e["name"] for e in doc["engines"]] == ["reference"]
    assert doc["engines"][0]["trace_path"] == "traces/reference.json.gz"
    assert (out / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert (out / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("model, expected", [
    (None, "model: none given and stories260k's weights file was not found (searched {tmp}"),
    ("stories260k", "model: stories260k's weights file was not found (searched {tmp}"),
])
def test_a_missing_model_file_is_said_in_the_report(tmp_path, monkeypatch, model, expected):
    """`make diagnose` without the stories260K file silently measured tiny-llama dummy weights: the report
    must say what was looked for, where, and what was measured instead."""
    from rich.console import Console

    import bubblescope.models.loader as loader
    from bubblescope.diagnosis import diagnose
    from bubblescope.reports.terminal import render_results

    monkeypatch.setattr(loader, "model_search_dirs", lambda: [tmp_path / "models"])
    res = diagnose(model, engines=["reference"], prompt_len=4, gen_len=3, runs=1, warmup=0, profile_steps=2,
                   device="cpu", write=False)
    notes = res.doc["device"]["notes"]
    assert any(n.startswith(expected.format(tmp=tmp_path)) for n in notes), notes
    assert res.doc["model"]["source"] == "dummy"
    console = Console(record=True, width=200)
    render_results(res, console)
    assert expected.format(tmp=tmp_path) in console.export_text()


def test_diagnose_trace_reads_the_trace_files_of_a_folder_and_skips_the_rest(tmp_path):
    """`diagnose trace DIR` stopped at the first non-trace file (the run's own results.json). A diagnose
    output folder holds results.json, report.html and traces; each non-trace file gets one note."""
    from typer.testing import CliRunner

    from bubblescope.cli import app

    from . import tracegen as tg
    big = {"schemaVersion": 1, "deviceProperties": [{"id": i, "pad": "x" * 4000} for i in range(8)]}
    tg.write(tmp_path / "a.json.gz", tg.document(tg.decode_trace_events()))
    tg.write(tmp_path / "b.pt.trace.json", {**big, "traceEvents": tg.decode_trace_events()})  # key after 32 kB
    (tmp_path / "results.json").write_text(json.dumps(g.healthy_doc()))
    (tmp_path / "report.html").write_text("<!DOCTYPE html>")
    (tmp_path / "other.json").write_text('{"a": 1}')
    (tmp_path / "traces").mkdir()
    r = CliRunner().invoke(app, ["diagnose", "trace", str(tmp_path), "--format", "json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert [f["path"] for f in summary["files"]] == [str(tmp_path / "a.json.gz"), str(tmp_path / "b.pt.trace.json")]
    # The numbers are those of the same trace read directly (test_trace_metrics checks them by hand).
    assert summary["files"][0]["devices"] == summary["files"][1]["devices"]
    assert r.stderr.splitlines() == [
        f"note: skipped {tmp_path / 'other.json'}: JSON without traceEvents (not a Chrome trace)",
        f"note: skipped {tmp_path / 'report.html'}: not JSON",
        f"note: skipped {tmp_path / 'results.json'}: a bubblescope results document (read it with "
        "`bubblescope report`)"]
    (tmp_path / "empty").mkdir()
    r = CliRunner().invoke(app, ["diagnose", "trace", str(tmp_path / "empty")])
    assert r.exit_code == 2 and r.stderr == f"error: {tmp_path / 'empty'}: directory holds no Chrome trace file (it is empty)\n"


def test_a_truncated_trace_in_a_folder_is_an_error_not_a_note(tmp_path):
    """A rank trace cut in half inside a folder is an error (exit 2), as the same file named directly is (not a
    note with exit 0), and the readable trace beside it is still summarized."""
    import gzip

    from typer.testing import CliRunner

    from bubblescope.cli import app

    from . import tracegen as tg
    good = tg.write(tmp_path / "rank0.json.gz", tg.document(tg.decode_trace_events()))
    data = gzip.compress(json.dumps(tg.document(tg.decode_trace_events(), rank=1)).encode())
    (tmp_path / "rank1.json.gz").write_bytes(data[:len(data) // 2])
    r = CliRunner().invoke(app, ["diagnose", "trace", str(tmp_path), "--format", "json"])
    assert r.exit_code == 2, r.output
    assert [f["path"] for f in json.loads(r.stdout)["files"]][0] == str(good)
    assert r.stderr.startswith(f"error: {tmp_path / 'rank1.json.gz'}") and "note: skipped" not in r.stderr


def test_every_option_and_argument_has_help_text():
    """Many `diagnose model` options had no help text."""
    import typer.main

    from bubblescope.cli import app
    group = typer.main.get_command(app)
    missing = []

    def walk(cmd, path):
        for sub in getattr(cmd, "commands", {}).values():
            walk(sub, path + [sub.name])
        for p in getattr(cmd, "params", []):
            if not (getattr(p, "help", None) or "").strip() and p.name != "help":
                missing.append(" ".join(path) + f" {p.name}")
    walk(group, ["bubblescope"])
    assert missing == []


def test_diagnose_trace_on_a_diagnose_model_output_folder_reads_its_traces_subfolder(tmp_path):
    """`diagnose trace bubblescope-out` said "directory holds no Chrome trace file": `diagnose model` writes
    its traces to traces/<engine>.json.gz, one level down."""
    from typer.testing import CliRunner

    from bubblescope.cli import app

    from . import tracegen as tg
    (tmp_path / "traces").mkdir()
    tg.write(tmp_path / "traces" / "reference.json.gz", tg.document(tg.decode_trace_events()))
    (tmp_path / "results.json").write_text(json.dumps(g.healthy_doc()))
    (tmp_path / "report.html").write_text("<!DOCTYPE html>")
    r = CliRunner().invoke(app, ["diagnose", "trace", str(tmp_path), "--format", "json"])
    assert r.exit_code == 0, r.output
    direct = CliRunner().invoke(app, ["diagnose", "trace", str(tmp_path / "traces" / "reference.json.gz"),
                                      "--format", "json"])
    files, files_direct = json.loads(r.stdout)["files"], json.loads(direct.stdout)["files"]
    assert [f["path"] for f in files] == [str(tmp_path / "traces" / "reference.json.gz")]
    assert files[0]["devices"] == files_direct[0]["devices"] and files[0]["devices"]
    assert f"note: reading {tmp_path / 'traces'}: {tmp_path} holds no trace itself" in r.stderr
    # An empty traces/ folder still gives the one-line error.
    (tmp_path / "traces" / "reference.json.gz").unlink()
    r = CliRunner().invoke(app, ["diagnose", "trace", str(tmp_path)])
    assert r.exit_code == 2 and r.stderr.startswith(f"error: {tmp_path}: directory holds no Chrome trace file")


def test_a_failed_publish_leaves_the_previous_run_whole(tmp_path, monkeypatch):
    """When an entry of the previous run cannot be moved aside (a read-only traces/), the moves made are undone:
    OUT holds the previous run exactly (not the new results.json beside the old traces/), no staging folder stays,
    and the error names OUT."""
    import os

    from bubblescope.errors import BubblescopeError
    from bubblescope.outdir import PREFIX, RunFolder

    out = tmp_path / "out"
    (out / "traces").mkdir(parents=True)
    (out / "results.json").write_text("old results")
    (out / "report.html").write_text("old report")
    (out / "traces" / "a.json.gz").write_text("old trace")
    real = os.replace

    def failing(src, dst):
        if str(src).endswith(os.sep + "traces") and PREFIX not in str(src).rsplit(os.sep, 2)[-2]:
            raise PermissionError(13, "Permission denied")  # the previous run's traces/ cannot be moved
        return real(src, dst)

    with pytest.raises(BubblescopeError, match=r"--out .*out: cannot replace traces there \(Permission denied\)"):
        with RunFolder(out) as run:
            (run.stage / "results.json").write_text("new results")
            (run.stage / "report.html").write_text("new report")
            (run.stage / "traces").mkdir()
            (run.stage / "traces" / "b.json.gz").write_text("new trace")
            monkeypatch.setattr(os, "replace", failing)
            run.publish()
    monkeypatch.setattr(os, "replace", real)
    assert (out / "results.json").read_text() == "old results"
    assert (out / "report.html").read_text() == "old report"
    assert sorted(p.name for p in (out / "traces").iterdir()) == ["a.json.gz"]
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "results.json", "traces"]


def test_logit_agreement_records_non_finite_differences_as_null():
    """A model with one NaN weight must not crash `diagnose model` after the whole measurement (results.json
    refuses a max_abs_logit_diff of NaN). Hand-computed: rows (1, 2) and (3, 1) against (1, 0) and (0, 4)
    differ by (0, 2) and (3, −3): max |Δ| 3, relative errors 2/1 and √18/4, argmax agreement 0 of 2; with a NaN
    logit the two differences are null and the numbers stay JSON-safe."""
    import math

    import torch

    from bubblescope.diagnosis import logit_agreement

    got = torch.tensor([[1.0, 2.0], [3.0, 1.0]])
    ref = torch.tensor([[1.0, 0.0], [0.0, 4.0]])
    out = logit_agreement(got, ref)
    assert out["token_agreement"] == 0.0 and out["max_abs_logit_diff"] == 3.0
    assert out["rel_logit_err"] == pytest.approx(2.0)
    assert logit_agreement(got, ref[[1, 0]])["rel_logit_err"] == pytest.approx(math.sqrt(5))  # (2, 1) over ‖(1, 0)‖
    bad = logit_agreement(torch.tensor([[float("nan"), 1.0], [3.0, 1.0]]), ref)
    assert bad["max_abs_logit_diff"] is None and bad["rel_logit_err"] is None
    json.dumps(bad, allow_nan=False)


@pytest.mark.parametrize("command, default", [
    (["diagnose", "model", "tiny-llama", "--engines", "reference", "--device", "cpu"], "bubblescope-out"),
    (["tune", "tiny-llama", "--knob", "block_k", "--values", "16", "--device", "cpu"], "bubblescope-tune"),
])
def test_an_empty_out_is_refused_not_taken_as_the_current_directory(tmp_path, monkeypatch, command, default):
    """`diagnose model ... --out ""` replaced ./results.json and ./traces/ (Path("") is "."), exit 0."""
    from typer.testing import CliRunner

    from bubblescope.cli import app
    monkeypatch.chdir(tmp_path)
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "mine.txt").write_text("mine")
    (tmp_path / "results.json").write_text("my results")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    for out in ("", " "):
        r = CliRunner().invoke(app, [*command, "--out", out])
        assert r.exit_code == 2, r.output
        assert r.stderr == f"error: --out: empty; leave it out for the default ({default}) or name a directory\n"
        assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
        assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "traces"]


def _no_weights_load(monkeypatch) -> None:
    """Make loading any weights (a preset's dummy ones, a file, a folder) fail the test."""
    import bubblescope.models.loader as loader

    def no_load(*a, **k):
        raise AssertionError("weights were loaded")
    monkeypatch.setattr(loader, "dummy_weights", no_load)
    monkeypatch.setattr(loader, "_load_path", no_load)


TUNED = "a tuned file from `bubblescope tune --save`"
CPU_RUN = ["--device", "cpu", "--prompt-ids", "1", "--max-new-tokens", "1"]
TUNE_RUN = ["tune", "tiny-llama", "--knob", "block_k", "--values", "16", "--device", "cpu", "--out", "t"]


@pytest.mark.parametrize("args, empty, directory", [
    (["generate", "tiny-llama", *CPU_RUN, "--tuning", "{}"],
     f"--tuning: empty; leave it out or name {TUNED}", f"--tuning d: is a directory; name {TUNED}"),
    (["generate", "tiny-llama", *CPU_RUN, "--tokenizer", "{}"], "--tokenizer: empty; give a preset name or a path",
     "--tokenizer d: is a directory, not a tokenizer file (tokenizer.json or a llama2.c .bin)"),
    (["generate", "tiny-llama", *CPU_RUN, "--checkpoint", "{}"], "--checkpoint: empty; give a preset name or a path",
     None),  # a checkpoint may be a directory (a Hugging Face folder)
    (["diagnose", "model", "tiny-llama", "--device", "cpu", "--out", "o", "--tuning", "{}"],
     f"--tuning: empty; leave it out or name {TUNED}", f"--tuning d: is a directory; name {TUNED}"),
    (["diagnose", "model", "tiny-llama", "--device", "cpu", "--out", "o", "--checkpoint", "{}"],
     "--checkpoint: empty; give a preset name or a path", None),
    (["report", "{}"], "RESULTS.json: empty; name a results.json of `diagnose model`",
     "RESULTS.json d: is a directory; name a results.json of `diagnose model`"),
    (["report", "r.json", "--html", "{}"], "--html: empty; leave it out or name the HTML file to write",
     "--html d: exists and is not a regular file (a directory or device); give a file path"),
    (["gate", "{}", "--max-bubble-ratio", "0.5"], "RESULTS.json: empty; name the results.json to check",
     "RESULTS.json d: is a directory; name the results.json to check"),
    (["gate", "r.json", "--baseline", "{}", "--max-regression", "0.1"],
     "--baseline: empty; leave it out or name an older results.json",
     "--baseline d: is a directory; name an older results.json"),
    ([*TUNE_RUN, "--save", "{}"], "--save: empty; leave it out or name the tuned file to write",
     "--save d: exists and is not a regular file (a directory or device); give a file path"),
    ([*TUNE_RUN, "--checkpoint", "{}"], "--checkpoint: empty; give a preset name or a path", None),
    (["diagnose", "trace", "{}"], "PATHS: an empty path; name a trace file or a directory of traces",
     None),  # a directory of traces is an input
    (["diagnose", "trace", "t.json", "--html", "{}"], "--html: empty; leave it out or name the HTML file to write",
     "--html d: exists and is not a regular file (a directory or device); give a file path"),
], ids=["generate --tuning", "generate --tokenizer", "generate --checkpoint", "diagnose --tuning",
         "diagnose --checkpoint", "report RESULTS", "report --html", "gate RESULTS", "gate --baseline", "tune --save",
         "tune --checkpoint", "trace PATHS", "trace --html"])
def test_an_empty_or_directory_path_is_refused_before_anything_loads(tmp_path, monkeypatch, args, empty, directory):
    """Path("") is ".": `report r.json --html ""` said "--html .: exists and is not a regular file", `gate r.json
    --baseline ""` ".: cannot read results file (Is a directory)", `--tuning ""` "--tuning .: not a readable JSON
    file (IsADirectoryError)"; a --tokenizer directory was found out only after the weights had loaded."""
    from typer.testing import CliRunner

    from bubblescope.cli import app
    _no_weights_load(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    (tmp_path / "r.json").write_text(json.dumps(g.healthy_doc()))
    before = sorted((str(p), p.read_bytes() if p.is_file() else b"") for p in tmp_path.rglob("*"))
    for value, message in [("", empty), (" ", empty), ("d", directory)]:
        if message is None:
            continue
        r = CliRunner().invoke(app, [a.format(value) for a in args])
        assert (r.exit_code, r.stdout, r.stderr) == (2, "", f"error: {message}\n")
        assert sorted((str(p), p.read_bytes() if p.is_file() else b"") for p in tmp_path.rglob("*")) == before


def test_path_options_keep_their_path_type_in_help():
    """The path options became str (to see an empty value): --help still shows them as <path>."""
    from typer.testing import CliRunner

    from bubblescope.cli import app
    for command, option in [("report", "--html"), ("gate", "--baseline"), ("tune", "--save"),
                            ("generate", "--tuning")]:
        r = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "100"})
        line = next(line for line in r.stdout.splitlines() if f"{option} " in line)
        assert line.split(option)[1].split()[0] == "<path>", line


def test_no_engine_that_can_run_is_said_before_the_model_loads(tmp_path, monkeypatch):
    """`diagnose model --engines reference-cudagraph,megakernel-gluon` on CPU loaded the model (minutes for a big
    one) before saying that no engine ran; `generate --engine megakernel-gluon` too, without naming the option."""
    from typer.testing import CliRunner

    from bubblescope.cli import app
    _no_weights_load(monkeypatch)
    r = CliRunner().invoke(app, ["diagnose", "model", str(tmp_path / "no-such-model"), "--device", "cpu", "--engines",
                                 "reference-cudagraph,megakernel-gluon", "--out", str(tmp_path / "out")])
    assert (r.exit_code, r.stdout) == (2, "") and r.stderr == (
        "error: --engines: no engine ran on this machine (reference-cudagraph: reference mode cudagraph needs a "
        "CUDA device; megakernel-gluon: the Gluon megakernel needs a CUDA GPU (the CPU interpreter cannot run "
        "Gluon))\n")
    assert list(tmp_path.iterdir()) == []
    for args, message in [(["--engine", "megakernel-gluon"], "--engine megakernel-gluon: the Gluon megakernel needs "
                            "a CUDA GPU (the CPU interpreter cannot run Gluon)"),
                          (["--mode", "cudagraph"], "--mode cudagraph: reference mode cudagraph needs a CUDA device")]:
        r = CliRunner().invoke(app, ["generate", "tiny-llama", *CPU_RUN, *args])
        assert (r.exit_code, r.stdout, r.stderr) == (2, "", f"error: {message}\n")


def test_engines_that_need_what_is_missing_are_known_before_a_model(monkeypatch):
    """unavailable_before_load gives the reason the engine's build would raise, without any model."""
    import torch

    from bubblescope.engines import ENGINES, build_engine, unavailable_before_load
    from bubblescope.errors import BubblescopeError, EngineUnavailable
    from bubblescope.models import dummy_weights, get_preset
    cpu = torch.device("cpu")
    assert {n: unavailable_before_load(n, cpu) for n in ENGINES} == {
        n: None for n in ENGINES} | {
        "reference-cudagraph": "reference mode cudagraph needs a CUDA device",
        "reference-fused-pdl": "Programmatic Dependent Launch needs an NVIDIA GPU of compute capability 9.0 (Hopper) "
                               "or newer",
        "megakernel-gluon": "the Gluon megakernel needs a CUDA GPU (the CPU interpreter cannot run Gluon)"}
    assert unavailable_before_load("auto", cpu) is None
    for package in ("triton", "transformers"):  # as if not installed: find_spec None, import raises ImportError
        monkeypatch.setitem(sys.modules, package, None)
    missing = {n: unavailable_before_load(n, cpu) for n in ENGINES}
    assert missing == {"reference": None, "reference-cudagraph": "reference mode cudagraph needs a CUDA device",
                       "reference-compile": None, "hf": "engine hf needs transformers, which is not installed"} | {
        n: "the megakernel needs Triton, which is not installed" for n in ENGINES if n.startswith("megakernel")} | {
        n: "the fused engines need Triton, which is not installed" for n in ("reference-fused", "reference-fused-pdl")}
    weights = dummy_weights(get_preset("tiny-llama"))
    for name in ("hf", "megakernel", "reference-cudagraph"):  # the words building it raises
        with pytest.raises(EngineUnavailable) as info:
            build_engine(name, weights, 16)
        assert str(info.value) == missing[name]
    with pytest.raises(BubblescopeError, match="--engines: unknown engine 'nope'"):
        unavailable_before_load("nope", cpu, "--engines")


def test_one_engine_that_can_run_keeps_the_run(tmp_path):
    """When any engine may run, the run goes on and the others are skipped in results.json, as before."""
    from typer.testing import CliRunner

    from bubblescope.cli import app
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["diagnose", "model", "tiny-llama", "--engines", "reference-cudagraph,reference",
                                 "--device", "cpu", "--gen-len", "2", "--prompt-len", "2", "--runs", "1", "--warmup",
                                 "0", "--profile-steps", "1", "--out", str(out), "--format", "json"])
    assert r.exit_code == 0, r.output
    engines = {e["name"]: (e["status"], e["reason"]) for e in json.loads(r.stdout)["engines"]}
    assert engines == {"reference-cudagraph": ("skipped", "reference mode cudagraph needs a CUDA device"),
                       "reference": ("ok", None)}
    assert (out / "results.json").is_file()


@pytest.mark.parametrize("foreign", ["notes.txt", "sub/", "mine.json"])
def test_a_file_of_the_users_in_traces_is_refused_not_deleted(tmp_path, foreign):
    """A run replaces OUT/traces/ whole: a file bubblescope did not write there would go with it."""
    from typer.testing import CliRunner

    from bubblescope.cli import app
    out = tmp_path / "out"
    (out / "traces").mkdir(parents=True)
    (out / "traces" / "reference.json.gz").write_bytes(b"old trace")
    entry = out / "traces" / foreign.rstrip("/")
    entry.mkdir() if foreign.endswith("/") else entry.write_text("mine")
    (out / "results.json").write_text("old results")
    before = sorted(str(p) for p in out.rglob("*"))
    r = CliRunner().invoke(app, ["diagnose", "model", "tiny-llama", "--engines", "reference", "--device", "cpu",
                                 "--out", str(out)])
    assert r.exit_code == 2, r.output
    assert r.stderr == (f"error: --out {out}: {entry} was not written by bubblescope and a run replaces "
                        f"{out / 'traces'} whole; move it away or choose another --out\n")
    assert sorted(str(p) for p in out.rglob("*")) == before and (out / "results.json").read_text() == "old results"


def test_a_run_that_measures_nothing_exits_2_and_leaves_out_alone(tmp_path):
    """`--engines reference-cudagraph,megakernel-gluon` on CPU: both skipped, yet results were written, exit 0."""
    from typer.testing import CliRunner

    from bubblescope.cli import app
    out = tmp_path / "out"
    (out / "traces").mkdir(parents=True)
    (out / "traces" / "reference.json.gz").write_bytes(b"old trace")
    (out / "results.json").write_text("old results")
    fresh = tmp_path / "fresh" / "out"
    for target in (out, fresh):
        before = sorted((str(p), p.read_bytes() if p.is_file() else b"") for p in out.rglob("*"))
        r = CliRunner().invoke(app, ["diagnose", "model", "tiny-llama", "--engines",
                                     "reference-cudagraph,megakernel-gluon", "--device", "cpu", "--gen-len", "2",
                                     "--prompt-len", "2", "--runs", "1", "--warmup", "0", "--profile-steps", "1",
                                     "--out", str(target)])
        assert r.exit_code == 2, r.output
        assert r.stderr.splitlines()[-1] == (
            "error: --engines: no engine ran on this machine (reference-cudagraph: reference mode cudagraph needs a "
            "CUDA device; megakernel-gluon: the Gluon megakernel needs a CUDA GPU (the CPU interpreter cannot run "
            "Gluon))")
        assert sorted((str(p), p.read_bytes() if p.is_file() else b"") for p in out.rglob("*")) == before
    assert not fresh.exists()


def test_diagnose_help_lists_trace_in_whole_sentences():
    """`bubblescope diagnose --help` broke the trace line mid-sentence ("with one" / "trace per rank")."""
    r = subprocess.run([sys.executable, "-m", "bubblescope", "diagnose", "--help"], capture_output=True, text=True,
                       cwd=ROOT, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    lines = [line.strip("│ ") for line in r.stdout.splitlines()]
    at = next(i for i, line in enumerate(lines) if line.startswith("trace "))
    assert lines[at:at + 2] == ["trace  Bubble ratio, busy/span, idle breakdown, kernels and launches per",
                                "step of existing traces."]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a device whose writes fail, Linux)")
@pytest.mark.parametrize("args", [["presets"], ["engines"],
                                  ["generate", "tiny-llama", "--prompt-ids", "1,2,3", "--max-new-tokens", "2"]])
def test_standard_output_on_a_full_device_is_one_line_and_exit_2(args):
    """Every command's stdout on a full device ended in a traceback and exit 1 (the gate's "check failed")."""
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "bubblescope", *args], stdout=full, stderr=subprocess.PIPE,
                           text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == "error: standard output: cannot write (No space left on device)", r.stderr
