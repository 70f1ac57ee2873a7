"""`diagnose model --tp N` on CPU: its output folder is staged like the single-process run's, and every option
of `diagnose model` is either honoured or refused by name (fresh-user findings: a failed TP run left
half-written traces beside the previous run's results, and --counters, --tuning, --context-sweep, --warmup and
--device were dropped without a word).

The staging runs the real :func:`tp_diagnose` in this process as a one-rank gloo group (torchrun and NCCL are
not needed to check what lands in ``out``); the two-rank path through torchrun is
``test_tp.py::test_cli_tp2_end_to_end_on_gloo``; the launcher is :mod:`bubblescope.tplaunch`.
"""

from __future__ import annotations

import gzip
import json
import socket

import pytest

from bubblescope.errors import BubblescopeError
from bubblescope.outdir import PREFIX

WORKLOAD = dict(model="tiny-llama", prompt_len=4, gen_len=4, runs=1, profile_steps=2, seed=0)


def _cli(*args):
    from typer.testing import CliRunner

    from bubblescope.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture
def one_rank_group():
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _previous_run(out):
    """A folder as a single-process run leaves it, plus a file of the user's."""
    (out / "traces").mkdir(parents=True)
    (out / "results.json").write_text('{"old": true}')
    (out / "report.html").write_text("<html>old</html>")
    (out / "traces" / "reference.json.gz").write_bytes(gzip.compress(b"{}"))
    (out / "mine.txt").write_text("keep me")
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def _files(out):
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def test_a_failed_tp_run_leaves_the_previous_run_untouched(tmp_path, monkeypatch, one_rank_group):
    """The merge fails after every rank wrote its trace: before staging, traces/reference-tp1-rank0.json.gz was
    left in the previous run's traces/."""
    from bubblescope import tpdiagnose
    from bubblescope.reports import findings

    out = tmp_path / "out"
    before = _previous_run(out)

    def broken(doc):
        raise BubblescopeError("findings: simulated failure after the traces were written")

    monkeypatch.setattr(findings, "find", broken)
    with pytest.raises(BubblescopeError, match="simulated failure"):
        tpdiagnose.tp_diagnose(**WORKLOAD, out=out)
    assert _files(out) == before
    assert not list(out.glob(PREFIX + "*"))


def test_a_tp_run_replaces_the_previous_run_as_a_whole(tmp_path, monkeypatch, one_rank_group):
    """Published together: tp.json and this run's traces in, the previous run's results, report and traces out
    (they would describe another run), the user's own file kept; --warmup honoured (it was dropped)."""
    from bubblescope import generation, tpdiagnose

    calls = []
    real = generation.generate

    def counting(*a, **k):
        calls.append(a[2])  # tokens asked for
        return real(*a, **k)

    monkeypatch.setattr(generation, "generate", counting)
    out = tmp_path / "out"
    _previous_run(out)
    doc = tpdiagnose.tp_diagnose(**WORKLOAD, out=out, warmup=2, device="cpu")
    files = _files(out)
    assert sorted(files) == ["mine.txt", "tp.json", "traces/reference-tp1-rank0.json.gz"]
    assert files["mine.txt"] == b"keep me"
    assert json.loads(files["tp.json"]) == doc
    assert doc["workload"]["warmup"] == 2 and doc["device"]["backend"] == "gloo"
    assert calls == [4, 4, 4]  # two untimed generations of --gen-len tokens, then the one timed run
    assert not list(out.glob(PREFIX + "*"))


def test_an_out_that_is_a_file_is_refused_on_every_rank(tmp_path, one_rank_group):
    from bubblescope import tpdiagnose

    (tmp_path / "f").write_text("x")
    with pytest.raises(BubblescopeError, match=r"^--out .*f: cannot create the output directory \(Not a directory\)$"):
        tpdiagnose.tp_diagnose(**WORKLOAD, out=tmp_path / "f")
    assert (tmp_path / "f").read_text() == "x"


@pytest.mark.parametrize("args, message", [
    (["--counters"], "--counters: not supported with --tp (Nsight Compute profiles one process); run without "
                     "--tp to read hardware counters"),
    (["--tuning", "tuned.json"], "--tuning: not supported with --tp (tuned files set megakernel engines; --tp "
                                 "runs the reference engine)"),
    (["--context-sweep", "128,1024"], "--context-sweep: not supported with --tp (the tensor-parallel run times "
                                      "the prompt + generated context only); leave it out"),
    (["--device", "cpu:0"], "--device cpu:0: with --tp each rank uses GPU LOCAL_RANK; give cuda or cpu"),
    (["--device", "tpu"], "--device: unknown device 'tpu'; use cpu or cuda"),
    (["--engines", "megakernel"], "--engines with --tp: one of reference, reference-cudagraph, got 'megakernel'"),
    (["--warmup", "-1"], "--warmup: must be at least 0, got -1"),
    (["--dtype", "fp8"], "--dtype: unknown dtype 'fp8'; use float32, bfloat16 or float16"),
])
def test_cli_tp_refuses_options_it_cannot_honour_before_spawning(tmp_path, monkeypatch, args, message):
    import subprocess

    def spawn(*a, **k):
        raise AssertionError("torchrun was started")

    monkeypatch.setattr(subprocess, "run", spawn)
    r = _cli("diagnose", "model", "tiny-llama", "--tp", "2", *args, "--out", tmp_path / "o")
    assert r.exit_code == 2, r.output
    assert r.output == f"error: {message}\n"
    assert not (tmp_path / "o").exists()


def test_cli_tp_refuses_an_unwritable_out_before_spawning(tmp_path, monkeypatch):
    import subprocess

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("torchrun was started"))
    (tmp_path / "file").write_text("x")
    r = _cli("diagnose", "model", "tiny-llama", "--tp", "2", "--out", tmp_path / "file" / "o")
    assert r.exit_code == 2
    assert r.output == (f"error: --out {tmp_path / 'file' / 'o'}: cannot create the output directory "
                        f"({tmp_path / 'file'} is not a directory)\n")


def test_cli_tp_passes_the_honoured_options_to_the_ranks(tmp_path, monkeypatch):
    """What reaches the ranks (torchrun's last argument): --warmup and --device were dropped before."""
    import subprocess

    seen = {}

    def spawn(cmd, **k):
        seen.update(json.loads(cmd[-1]))
        return subprocess.CompletedProcess(cmd, 0, stderr="")

    monkeypatch.setattr(subprocess, "run", spawn)
    r = _cli("diagnose", "model", "tiny-llama", "--tp", "2", "--warmup", "3", "--device", "cpu", "--engines",
             "reference", "--context-sweep", "none", "--out", tmp_path / "o")
    assert r.exit_code == 0, r.output
    assert (seen["warmup"], seen["device"], seen["mode"], seen["out"]) == (3, "cpu", "eager", str(tmp_path / "o"))


def test_a_rank_error_is_one_line(tmp_path):
    """A bad input only a rank can see (an unknown model) was torchrun's ChildFailedError report plus a line
    pointing above it; now it is the rank's one line, exit 2, and nothing is written."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "bubblescope", "diagnose", "model", "no-such-model", "--tp", "2",
                        "--out", str(tmp_path / "o")], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2
    assert r.stderr.startswith("error: unknown model preset 'no-such-model'; known presets: ")
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_a_single_process_run_takes_away_a_previous_tp_run(tmp_path):
    """The other direction: publishing a single-process run left tp.json and ranks_timeline.png of a --tp run
    beside it, pointing at traces that were gone with the old traces/."""
    from bubblescope.outdir import RunFolder

    out = tmp_path / "out"
    (out / "traces").mkdir(parents=True)
    for name in ("tp.json", "ranks_timeline.png", "traces/reference-tp2-rank0.json.gz", "mine.txt"):
        (out / name).write_text("old")
    with RunFolder(out) as folder:
        (folder.stage / "traces").mkdir()
        (folder.stage / "traces" / "reference.json.gz").write_text("new")
        (folder.stage / "results.json").write_text("new")
        folder.publish()
    assert _files(out) == {"mine.txt": b"old", "results.json": b"new", "traces/reference.json.gz": b"new"}
