"""``bubblescope diagnose trace`` on several files: each its own result, a bad one reported alone;
the progress callback of the reader; no torch (nor pandas) import on the way."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bubblescope.profiler.trace import load_trace
from bubblescope.profiler.trace.summary import summarize_traces
from bubblescope.reports import progress as progress_mod

from . import tracegen as tg

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "bubblescope", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


def _good(tmp_path, name, busy):
    events = [tg.launch(90, 1, 1), tg.kernel("k", 100, busy, 1)]
    return tg.write(tmp_path / name, tg.document(events))


def test_several_files_each_own_result_and_a_bad_one_reported_alone(tmp_path):
    a, b = _good(tmp_path, "a.json", 4), _good(tmp_path, "b.json.gz", 7)
    bad = tmp_path / "bad.json"
    bad.write_text(cut := '{"traceEvents": [{"ph": "X", "ts": 1')
    r = _cli("diagnose", "trace", str(a), str(bad), str(b), "--format", "json")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"error: {bad}: not a Chrome trace: invalid JSON at character {len(cut)}: "
                                             "ends inside a JSON value (truncated?)"]
    files = json.loads(r.stdout)["files"]
    assert [f["path"] for f in files] == [str(a), str(bad), str(b)]
    assert [f["devices"][0]["busy_us"] for f in (files[0], files[2])] == [4.0, 7.0]
    assert files[1] == {"path": str(bad), "error": r.stderr.strip()[len("error: "):]}
    text = _cli("diagnose", "trace", str(a), str(bad), str(b))
    assert text.returncode == 2 and str(b) in text.stdout and "error: " in text.stdout


def test_only_bad_files_print_only_errors(tmp_path):
    r = _cli("diagnose", "trace", str(tmp_path / "none.json"), "--format", "json")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [f"error: {tmp_path / 'none.json'}: no such file"]


def test_library_raises_unless_keep_going(tmp_path):
    a = _good(tmp_path, "a.json", 4)
    try:
        summarize_traces([a, tmp_path / "missing.json"])
    except Exception as exc:  # noqa: BLE001 - the type is checked below
        assert type(exc).__name__ == "BubblescopeError" and "missing.json: no such file" in str(exc)
    else:
        raise AssertionError("no error for a missing file")
    s = summarize_traces([a, tmp_path / "missing.json"], keep_going=True)
    assert s["files"][1] == {"path": str(tmp_path / "missing.json"), "error": f"{tmp_path / 'missing.json'}: no such file"}


def test_progress_reports_bytes_up_to_the_file_size(tmp_path, monkeypatch):
    from bubblescope.profiler.trace import file as tracefile

    monkeypatch.setattr(tracefile, "_CHUNK_CHARS", 4096)  # many windows from a small file
    path = tg.write(tmp_path / "p.json", tg.document(tg.decode_trace_events() * 40))
    seen = []
    load_trace(path, progress=lambda done, total: seen.append((done, total)))
    size = path.stat().st_size
    assert len(seen) > 3 and all(t == size for _, t in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and seen[-1] == (size, size)


def test_progress_bar_only_for_large_files(tmp_path, monkeypatch):
    small = _good(tmp_path, "small.json", 4)
    with progress_mod.trace_progress(force=True) as for_file:
        assert for_file(str(small)) is None and for_file(str(tmp_path / "missing.json")) is None
        monkeypatch.setattr(progress_mod, "MIN_BYTES", 10)
        callback = for_file(str(small))
        assert callable(callback)
        callback(5, 10)


def test_diagnose_trace_imports_neither_torch_nor_triton(tmp_path):
    """Nor rich: stderr is a pipe here, so no progress bar can be drawn and --format json renders nothing.
    Nor pandas: the summary is computed on numpy columns. Nor pydantic: typer 0.29 imports it to coerce
    every option (~0.13 s of imports, more building adapters), which pyproject's typer range keeps out."""
    path = _good(tmp_path, "a.json", 4)
    code = (
        "import sys; from bubblescope.cli import main; sys.argv = ['bubblescope', 'diagnose', 'trace', "
        f"{str(path)!r}, '--format', 'json']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print([m for m in ('torch', 'triton', 'rich', 'pandas', 'pydantic') if m in sys.modules], file=sys.stderr)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.stderr.strip().splitlines()[-1] == "[]", r.stderr


def test_a_non_utf8_file_name_is_read_like_report_and_gate_read_theirs(tmp_path):
    """QA finding: `diagnose trace` refused a latin-1 byte in a file name ("not valid UTF-8") while `report` and
    `gate` opened theirs. The name arrives as bytes in argv, Python holds it with surrogateescape, the file
    opens through os.fsencode, and --format json keeps the name so that os.fsencode gives the bytes back."""
    import os

    raw = os.fsencode(tmp_path) + b"/caf\xe9.json"
    _good(tmp_path, "plain.json", 40)
    os.rename(tmp_path / "plain.json", raw)
    r = subprocess.run([sys.executable, "-m", "bubblescope", "diagnose", "trace", raw, "--format", "json"],
                       capture_output=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert os.fsencode(doc["files"][0]["path"]) == raw
    assert doc["files"][0]["devices"][0]["busy_us"] == 40.0  # the hand-made trace: one 40 µs kernel
    text = subprocess.run([sys.executable, "-m", "bubblescope", "diagnose", "trace", raw], capture_output=True,
                          cwd=ROOT, timeout=300)
    assert text.returncode == 0 and b"caf" in text.stdout, text.stderr
    # A folder holding the file finds it by content, as before.
    folder = subprocess.run([sys.executable, "-m", "bubblescope", "diagnose", "trace", os.fsencode(tmp_path),
                             "--format", "json"], capture_output=True, cwd=ROOT, timeout=300)
    assert folder.returncode == 0 and os.fsencode(json.loads(folder.stdout)["files"][0]["path"]) == raw


def test_a_pipe_is_read_and_a_named_pipe_is_refused_not_waited_on(tmp_path):
    """`diagnose trace <(cat good.json)` said "cannot read (Illegal seek)" (the progress asked the pipe for its
    position); `mkfifo f.json; diagnose trace f.json` hung waiting for a writer. `/dev/stdin < file` still works."""
    import os
    import shlex

    good = _good(tmp_path, "a.json", 4)
    cmd = f"{shlex.quote(sys.executable)} -m bubblescope diagnose trace --format json"
    for shell in (f"{cmd} <(cat {shlex.quote(str(good))})", f"cat {shlex.quote(str(good))} | {cmd} /dev/stdin",
                  f"{cmd} /dev/stdin < {shlex.quote(str(good))}"):
        r = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert r.returncode == 0 and r.stderr == "", (shell, r.stderr)
        assert json.loads(r.stdout)["files"][0]["devices"][0]["busy_us"] == 4.0
    fifo = tmp_path / "f.json"
    os.mkfifo(fifo)
    r = _cli("diagnose", "trace", str(fifo))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == f"error: {fifo}: not a regular file (a named pipe); pass a file\n"


def test_gpu_events_all_invalid_are_not_called_a_cpu_only_run(tmp_path):
    """12 kernels with negative dur printed "No GPU activity in this trace (CPU-only run)"."""
    ev = [tg.annotation("bubblescope.decode_step#0", 90, 200)]
    for i in range(12):
        ev += [tg.launch(95 + 10 * i, 2, i + 1), tg.kernel("k", 100 + 10 * i, -3, i + 1)]
    path = tg.write(tmp_path / "neg.json", tg.document(ev))
    no_dur = tg.kernel("k", 100, 3, 1)
    del no_dur["dur"]
    one = tg.write(tmp_path / "nodur.json", tg.document([tg.launch(95, 2, 1), no_dur]))
    r = _cli("diagnose", "trace", str(path), str(one))
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "CPU-only" not in text
    assert ("All 12 GPU activity events were excluded as invalid (see warnings): GPU metrics unavailable. Decode "
            "steps") in text
    assert "warning: 12 events with negative dur excluded" in text
    assert ("The only GPU activity event was excluded as invalid (see warnings): GPU metrics unavailable. warning: "
            "1 complete event without a finite numeric ts/dur excluded") in text
    files = summarize_traces([path, one])["files"]
    assert files[0]["steps"]["reason"] == ("all 12 GPU activity events were excluded as invalid (see warnings): "
                                           "GPU metrics unavailable")
    assert "steps: " + files[0]["steps"]["reason"] not in files[0]["warnings"]


def test_a_step_table_of_one_gpu_names_the_gpus_left_out(tmp_path):
    """One host thread launching on GPU 0 and GPU 1: the step table (device 0) said nothing of GPU 1."""
    ev = []
    for s in range(2):
        ev.append(tg.annotation(f"bubblescope.decode_step#{s}", 100 * s, 90))
        for j, dev in enumerate((0, 0, 1, 1)):
            corr = 10 * s + j + 1
            ev += [tg.launch(100 * s + 2 + 5 * j, 2, corr), tg.kernel("k", 100 * s + 30 + 10 * j, 5, corr, device=dev)]
    path = tg.write(tmp_path / "two_gpus.json", tg.document(ev))
    (f,) = summarize_traces([path])["files"]
    assert (f["steps"]["device"], f["steps"]["kernels_per_step"]) == (0, 2)
    assert "steps: the step figures are of device 0 only; 4 step-linked GPU activities on device 1 left out" \
        in f["warnings"]
    single = _good(tmp_path, "one.json", 4)
    assert not any("left out" in w for w in summarize_traces([single])["files"][0]["warnings"])


def test_a_tie_in_compute_names_no_slowest_rank(tmp_path):
    """Two ranks with the same compute per step: the per-step table named rank 0 "slowest"."""
    from bubblescope.profiler.trace.ranksummary import summarize_rank_traces

    def rank(r, busy):
        ev = [tg.annotation("bubblescope.decode_step#0", 0, 90), tg.launch(2, 2, 1), tg.kernel("k", 30, busy, 1)]
        return tg.write(tmp_path / f"rank{r}.json", tg.document(ev, rank=r))

    tie = summarize_rank_traces([rank(0, 5), rank(1, 5)])["ranks"]
    assert [s["slowest_rank"] for s in tie["per_step"]] == [None]
    assert [r["slowest_steps"] for r in tie["per_rank"]] == [0, 0]
    r = _cli("diagnose", "trace", str(tmp_path / "rank0.json"), str(tmp_path / "rank1.json"))
    lines = r.stdout.splitlines()
    per_step = lines[next(i for i, line in enumerate(lines) if line.startswith("Per step, across ranks: compute")):]
    row = next(line for line in per_step if line.startswith("│    0 │"))
    assert row.split("│")[2].strip() == "tie"  # step, slowest rank
    slow = summarize_rank_traces([rank(0, 5), rank(1, 8)])["ranks"]
    assert [s["slowest_rank"] for s in slow["per_step"]] == [1]
