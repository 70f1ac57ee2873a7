"""``bubblescope diagnose trace`` on several files: each its own result, a bad one reported alone;
the progress callback of the reader; no torch (nor pandas) import on the way."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bubblescope.profiler.trace import load_trace
from bubblescope.profiler.tracesummary import summarize_traces
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
    from bubblescope.profiler import tracefile

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
