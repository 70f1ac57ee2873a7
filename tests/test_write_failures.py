"""Outputs on a full disk: a write that fails (EFBIG over ``ulimit -f``, as ENOSPC on a full disk) stops the
command with exit code 2 and the OS error in one line, leaves no temporary file, and keeps the previous outputs
byte for byte.

The limit is set with ``RLIMIT_FSIZE`` in a child process that ignores SIGXFSZ, so that a write past it raises
EFBIG ("File too large") instead of killing the process, as the kernel does when the signal is ignored
(``setrlimit(2)``).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from . import resultsgen as g
from .conftest import ROOT

pytestmark = pytest.mark.skipif(not hasattr(resource, "RLIMIT_FSIZE"), reason="needs RLIMIT_FSIZE (POSIX)")

EFBIG = os.strerror(27)  # "File too large"


def _cap(limit: int):
    """A ``preexec_fn``: files capped at ``limit`` bytes, SIGXFSZ ignored so that the write raises EFBIG."""
    def cap():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return cap


def _python(code: str, limit: int, cwd: Path) -> subprocess.CompletedProcess:
    """``python -c CODE`` with files capped at ``limit`` bytes."""
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
                          preexec_fn=_cap(limit), capture_output=True, text=True, timeout=60)


def _limited(args: list[str], limit: int, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m bubblescope ARGS`` with files capped at ``limit`` bytes."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "bubblescope", *args], cwd=cwd, env=env, preexec_fn=_cap(limit),
                          capture_output=True, text=True, timeout=300)


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones included) by relative path, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.slow  # a whole diagnose run (torch, the model, the profiler) in a child process
def test_diagnose_that_cannot_write_its_trace_keeps_the_previous_run(tmp_path):
    """The trace (tens of kB) is over a 4 kB limit: the run stops (it used to go on, mark the engine failed,
    publish a run without it and exit 0, leaving Kineto's half-written temporary in traces/)."""
    out = tmp_path / "out"
    (out / "traces").mkdir(parents=True)
    previous = {"results.json": b'{"previous": "run"}\n', "report.html": b"<p>previous</p>\n",
                "traces/reference.json.gz": b"previous trace bytes"}
    for name, data in previous.items():
        (out / name).write_bytes(data)
    r = _limited(["diagnose", "model", "tiny-llama", "--engines", "reference", "--device", "cpu", "--prompt-len", "4",
                  "--gen-len", "2", "--runs", "1", "--warmup", "0", "--profile-steps", "1", "--out", "out"],
                 4096, tmp_path)
    assert r.returncode == 2, r.stderr
    assert _error_line(r.stderr) == (f"error: --out out: cannot write traces/reference.json.gz ({EFBIG}); the "
                                     "previous run is left as it was")
    assert "Traceback" not in r.stderr
    assert _snapshot(out) == previous  # nothing added (no staging folder, no temporary), nothing changed


def test_report_html_that_cannot_be_written_keeps_the_old_page(tmp_path):
    doc = g.healthy_doc()
    doc["engines"], doc["findings"] = [], []  # a valid document whose page renders without plots: a quick test
    (tmp_path / "results.json").write_text(json.dumps(doc))
    (tmp_path / "page.html").write_bytes(b"<p>old page</p>")
    before = _snapshot(tmp_path)
    r = _limited(["report", "results.json", "--html", "page.html"], 2048, tmp_path)
    assert r.returncode == 2, r.stderr
    assert _error_line(r.stderr) == f"error: --html page.html: cannot write here ({EFBIG})"
    assert _snapshot(tmp_path) == before


def test_trace_html_that_cannot_be_written_leaves_no_temporary(tmp_path):
    events = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10, "dur": 5,
               "args": {"device": 0, "stream": 7}}]
    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": events}))
    before = _snapshot(tmp_path)
    r = _limited(["diagnose", "trace", "t.json", "--html", "t.html"], 2048, tmp_path)
    assert r.returncode == 2, r.stderr
    assert _error_line(r.stderr) == f"error: --html t.html: cannot write here ({EFBIG})"
    assert _snapshot(tmp_path) == before


def test_tune_outputs_that_cannot_be_written_leave_out_as_it_was(tmp_path):
    """``tune`` writes tune.json, tune.html and --save through one staged write (its measuring is tested in
    test_tuning.py): over the limit, the old files stay, no temporary is left, and the error is one line."""
    out = tmp_path / "t"
    out.mkdir()
    (out / "tune.json").write_bytes(b'{"old": 1}')
    (out / "tune.html").write_bytes(b"<p>old</p>")
    before = _snapshot(tmp_path)
    code = ("import json, sys\n"
            "from bubblescope.errors import BubblescopeError\n"
            "from bubblescope.reports.results import atomic_write_texts\n"
            "try:\n"
            "    atomic_write_texts([('t/tune.json', 'x' * 100000, None), ('t/tune.html', 'y', None)])\n"
            "except BubblescopeError as e:\n"
            "    print(type(e).__name__, e, e.reason, sep='|')\n")

    r = _python(code, 4096, tmp_path)
    assert r.stdout.strip() == f"OutputNotWritten|t/tune.json: cannot write here ({EFBIG})|{EFBIG}", r.stderr
    assert _snapshot(tmp_path) == before


def test_a_profiler_export_that_failed_is_found_with_its_os_error(tmp_path):
    """Kineto logs a failed write ("Failed to write to log file!") and returns normally, leaving ``<raw>.tmp``
    behind and ``raw`` empty; the failure is found by that leftover, and its OS error by one more byte."""
    (tmp_path / "raw.json").write_bytes(b"")
    (tmp_path / "raw.json.tmp").write_bytes(b"x" * 4096)  # at the limit, as Kineto leaves it
    code = ("from bubblescope.profiler.capture import export_failure\n"
            "print(export_failure('raw.json'))\n")
    r = _python(code, 4096, tmp_path)
    assert r.stdout.strip() == EFBIG, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw.json"]  # the leftover removed


def test_a_profiler_export_that_worked_is_not_a_failure(tmp_path):
    from bubblescope.profiler.capture import export_failure

    (tmp_path / "raw.json").write_bytes(b'{"traceEvents": []}')
    assert export_failure(str(tmp_path / "raw.json")) is None
    (tmp_path / "empty.json").write_bytes(b"")
    assert export_failure(str(tmp_path / "empty.json")) == "the profiler wrote nothing"


def test_run_folder_names_the_unwritten_file_under_out_and_removes_the_stage(tmp_path):
    from bubblescope.errors import OutputNotWritten
    from bubblescope.outdir import RunFolder

    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_bytes(b"old")
    with pytest.raises(OutputNotWritten) as info:
        with RunFolder(out) as folder:
            (folder.stage / "traces").mkdir()
            (folder.stage / "traces" / "a.json.gz").write_bytes(b"half")
            raise OutputNotWritten("inner", folder.stage / "traces" / "a.json.gz", "No space left on device")
    assert str(info.value) == (f"--out {out}: cannot write traces/a.json.gz (No space left on device); the previous "
                               "run is left as it was")
    assert _snapshot(out) == {"results.json": b"old"}


def test_a_live_runs_staging_folder_is_kept_and_a_dead_ones_removed(tmp_path):
    """Two runs sharing --out: the second removed every staging folder on start, the first's too, which then
    published a results.json naming traces that were gone. Now only folders whose writer has exited go."""
    from bubblescope.outdir import OWNER, PREFIX, RunFolder

    out = tmp_path / "out"
    out.mkdir()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        folders = {}
        for name, pid in (("live", live.pid), ("dead", dead.pid), ("unowned", None)):
            folders[name] = out / f"{PREFIX}{name}"
            (folders[name] / "traces").mkdir(parents=True)
            if pid is not None:
                (folders[name] / OWNER).write_text(f"{pid}\n")
        with RunFolder(out) as folder:
            assert (folder.stage / OWNER).read_text() == f"{os.getpid()}\n"
            assert folders["live"].is_dir() and not folders["dead"].exists() and not folders["unowned"].exists()
    finally:
        live.kill()
        live.wait()


@pytest.mark.slow  # a diagnose run in a child process, stopped by SIGTERM
def test_sigterm_leaves_out_as_it_was(tmp_path):
    """`timeout` and CI stop a run with SIGTERM: the staging folder stayed in --out (Ctrl-C removed it)."""
    import time

    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text("previous")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    p = subprocess.Popen([sys.executable, "-m", "bubblescope", "diagnose", "model", "tiny-llama", "--engines",
                          "reference", "--runs", "50", "--out", str(out)], cwd=tmp_path, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not list(out.glob(".bubblescope-partial-*")) and time.time() < deadline and p.poll() is None:
        time.sleep(0.2)
    assert p.poll() is None, p.stderr.read()
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM
    assert sorted(x.name for x in out.iterdir()) == ["results.json"] and (out / "results.json").read_text() == "previous"


# ---- bubblescope profile on a full disk ---------------------------------------------------------------------

# A decode loop of one nn.Linear per step; exits with status RC (default 0).
LOOP = ("import os, sys, torch\n"
        "m = torch.nn.Linear(16, 16)\n"
        "x = torch.randn(1, 16)\n"
        "with torch.no_grad():\n"
        "    for _ in range(60):\n"
        "        x = m(x)\n"
        "print('loop done')\n"
        "sys.exit(int(os.environ.get('RC', '0')))\n")
PROFILE_ARGS = ["profile", "--out", "pout", "--skip", "30", "--steps", "5", "--", sys.executable, "loop.py"]
STATE_LIMIT = 600  # room for the runner's configuration, not for its state once the window has begun
# (30 step times of about 17 digits each)


def _previous_profile(tmp_path: Path) -> dict[str, bytes]:
    """A whole previous ``profile`` run in ``tmp_path/pout``: its files by name."""
    (tmp_path / "loop.py").write_text(LOOP)
    r = subprocess.run([sys.executable, "-m", "bubblescope", *PROFILE_ARGS], cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    previous = _snapshot(tmp_path / "pout")
    assert sorted(previous) == ["profile.html", "profile.json", "profile.trace.json.gz"]
    return previous


@pytest.mark.slow  # two profiled runs of a small program
def test_profile_whose_state_cannot_be_written_keeps_the_previous_run(tmp_path):
    """The runner's state file is over the limit once the window has begun: no traceback from the runner, the
    program's output passes through, nothing is published (the trace is never kept alone), no staging folder is
    left, and the error is one line naming --out as typed."""
    previous = _previous_profile(tmp_path)
    r = _limited(PROFILE_ARGS, STATE_LIMIT, tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stdout.strip() == "loop done"
    assert "Traceback" not in r.stderr and "wrote" not in r.stderr
    assert _error_line(r.stderr) == (f"error: --out pout: cannot write the run's files ({EFBIG}); the previous run "
                                     "is left as it was")
    assert _snapshot(tmp_path / "pout") == previous  # byte for byte; nothing added


@pytest.mark.slow  # two profiled runs of a small program
def test_profile_of_a_failing_program_on_a_full_disk_keeps_its_exit_status(tmp_path):
    previous = _previous_profile(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "RC": "3"}
    r = subprocess.run([sys.executable, "-m", "bubblescope", *PROFILE_ARGS], cwd=tmp_path, env=env,
                       preexec_fn=_cap(STATE_LIMIT), capture_output=True, text=True, timeout=300)
    assert r.returncode == 3, r.stderr  # the program's own status
    assert r.stdout.strip() == "loop done"
    assert "Traceback" not in r.stderr
    assert _error_line(r.stderr).startswith("error: --out pout: cannot write the run's files (")
    assert _snapshot(tmp_path / "pout") == previous


def test_profile_whose_trace_was_cut_short_publishes_nothing(tmp_path, monkeypatch):
    """Kineto renames its trace into place even when its last write failed (a full disk): the trace ends early.
    Such a trace is never published in place of the previous run's files."""
    from typer.testing import CliRunner

    from bubblescope import profile_program as pp
    from bubblescope.cli import app

    def cut_short(program, stage, skip, steps, seconds):
        (stage / pp.RAW_TRACE).write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::li')
        state = {"status": "exited", "trace": str(stage / pp.RAW_TRACE), "first_step": 2, "steps_counted": 8,
                 "window_ns": [0, 1000, 2000], "reference_ns": [], "closed_by": "length", "skip": 2, "steps": 2}
        return 0, state

    monkeypatch.setattr(pp, "run_program", cut_short)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "decode.py").write_text("print('decoding')\n")
    out = tmp_path / "pout"
    out.mkdir()
    previous = {name: f"previous {name}".encode() for name in pp.OUT_FILES}
    for name, data in previous.items():
        (out / name).write_bytes(data)
    r = CliRunner().invoke(app, ["profile", "--out", "pout", "--skip", "2", "--steps", "2", "--", sys.executable,
                                 "decode.py"])
    assert r.exit_code == 2, r.output
    assert r.stderr.strip() == ("error: --out pout: cannot write profile.trace.json.gz (the profiler's trace ends "
                                "early: its last write failed, as on a full disk); the previous run is left as it "
                                "was")
    assert _snapshot(out) == previous  # no staging folder, nothing replaced


@pytest.mark.slow  # a profiled program in a child process, stopped by SIGTERM
def test_sigterm_to_profile_stops_the_program_and_leaves_out_as_it_was(tmp_path):
    """SIGTERM to `bubblescope profile` left its program running, still writing into the removed staging folder."""
    import time

    (tmp_path / "loop.py").write_text("import time\nimport torch\nm = torch.nn.Linear(4, 4)\nx = torch.randn(1, 4)\n"
                                      "for _ in range(100000):\n    m(x)\n"
                                      "    with open('beat', 'a') as f:\n        f.write('x')\n"
                                      "    time.sleep(0.01)\n")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    p = subprocess.Popen([sys.executable, "-m", "bubblescope", "profile", "--out", str(out), "--skip", "2", "--steps",
                          "100000", "--", sys.executable, "loop.py"], cwd=tmp_path, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (tmp_path / "beat").exists() and time.time() < deadline and p.poll() is None:
        time.sleep(0.2)
    time.sleep(1)
    assert p.poll() is None, p.stderr.read()
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM
    beats = (tmp_path / "beat").stat().st_size
    time.sleep(1)
    assert (tmp_path / "beat").stat().st_size == beats  # the program is gone: no beat since
    assert not out.exists() or list(out.iterdir()) == []
