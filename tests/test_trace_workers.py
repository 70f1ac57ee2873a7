"""The parse split over worker processes (``profiler.trace.workers``) gives exactly the serial parse's columns.

Small read windows (``profiler.trace.file._CHUNK_CHARS``) make even a small trace many windows, so every real
and hand-built trace below goes through the workers window by window; the serial reference reads it
with the default windows in process. The hand-built trace is made to fool the cut at a window's end
(event boundaries guessed from "}, {"): names holding "}, {", brackets, commas and escaped quotes,
args holding a list of objects, a NaN literal the batch decoder refuses, B/E pairs spread over the
file; the kept values are also checked against the events as the test wrote them.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bubblescope.profiler.trace import file as tracefile, workers as traceworkers
from bubblescope.profiler.trace.load import read_trace_arrays
from bubblescope.profiler.trace.summary import summarize_trace

from . import tracegen as tg
from .conftest import ROOT, TRACES

REAL = sorted(TRACES.glob("*.json.gz")) + sorted((ROOT / "tests" / "data").glob("*.json.gz"))
ODD_NAMES = ['k}, {"ph": "X"}', 'tmpl<{lambda(float)#1}, std::array<char*, 1ul> >', 'say \\"hi\\" }, { [a, b]',
             "plain", "ümlaut µs ✓", "x\\\\}, {y"]


def _same(a, b) -> None:
    # Text codes follow the order texts are first met, which depends on the window size even in
    # process (each window's kernels are coded before its CPU calls): compare the texts themselves.
    assert sorted(a.texts.tolist()) == sorted(b.texts.tolist())
    assert a.warnings == b.warnings and a.event_count == b.event_count and a.metadata == b.metadata
    for table in ("gpu", "runtime", "annotations", "flows"):
        x, y = getattr(a, table), getattr(b, table)
        assert list(x) == list(y), table
        for key in x:
            if x[key].dtype == np.int32:
                assert a.texts[x[key]].tolist() == b.texts[y[key]].tolist(), (table, key)
            elif x[key].dtype == object:
                assert x[key].tolist() == y[key].tolist(), (table, key)
            else:
                assert x[key].dtype == y[key].dtype, (table, key)
                assert np.array_equal(x[key], y[key], equal_nan=x[key].dtype.kind == "f"), (table, key)


@pytest.fixture
def spy(monkeypatch):
    """Counts of windows merged from workers and of rewinds after a refused window."""
    seen = {"merged": 0, "rewound": 0}
    merge, rewind = traceworkers._merge, traceworkers.Workers._rewind

    def counted_merge(cols, result):
        seen["merged"] += 1
        merge(cols, result)

    def counted_rewind(self, text, drop=True):
        seen["rewound"] += 1
        rewind(self, text, drop)

    monkeypatch.setattr(traceworkers, "_merge", counted_merge)
    monkeypatch.setattr(traceworkers.Workers, "_rewind", counted_rewind)
    return seen


@pytest.mark.skipif(not REAL, reason=f"no real traces in {TRACES} or tests/data")
@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_real_traces_same_with_workers(path, monkeypatch, spy):
    serial = {opts: read_trace_arrays(path, workers=0, flows=opts[0], lean=opts[1])
              for opts in ((True, False), (False, True))}
    monkeypatch.setattr(tracefile, "_CHUNK_CHARS", 8192)
    for (flows, lean), ref in serial.items():
        par = read_trace_arrays(path, workers=2, flows=flows, lean=lean)
        _same(par, ref)
        assert summarize_trace(par) == summarize_trace(ref)
    assert spy["merged"] > 0  # the windows really went through the workers


def _odd_events(n: int = 600) -> list[dict]:
    ev = tg.meta_events()
    for i in range(n):
        t = 1000.0 + 10 * i
        name = ODD_NAMES[i // 5 % len(ODD_NAMES)] if i % 5 == 0 else f"gemv_{i % 3}"
        ev.append(tg.launch(t, 2, i + 1))
        k = tg.kernel(name, t + 3, 4 + i % 3, i + 1, stream=7 + i % 2)
        if i % 13 == 0:
            k["args"]["list"] = [{"a": 1}, {"b": "}, {"}, {"c": [1, 2]}]  # "}, {" between objects
        if i % 11 == 0:
            k["ts"] = str(k["ts"])  # a numeric string, as the Trace Event Format allows
        ev.append(k)
        if i % 50 == 0:
            ev.append({"ph": "B", "cat": "user_annotation", "name": f"range {i}", "pid": 1, "tid": 1, "ts": t})
        if i % 50 == 30:
            ev.append({"ph": "E", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": t})
    return ev


def test_hand_built_trace_same_with_workers(tmp_path, monkeypatch, spy):
    events = _odd_events()
    path = tg.write(tmp_path / "odd.json.gz", tg.document(events))
    ref = read_trace_arrays(path, workers=0)
    monkeypatch.setattr(tracefile, "_CHUNK_CHARS", 2048)
    par = read_trace_arrays(path, workers=2)
    _same(par, ref)
    assert spy["merged"] > 10 and spy["rewound"] > 0  # windows decoded by workers, and wrong cuts undone
    # Independently of both parses: the kernels as written, by start time.
    kernels = sorted((float(e["ts"]), e["name"], e["dur"]) for e in events if e.get("cat") == "kernel")
    got = sorted(zip(par.gpu["ts_us"].tolist(), par.texts[par.gpu["name"]].tolist(), par.gpu["dur_us"].tolist()))
    assert got == kernels
    ranges = {par.texts[c]: d for c, d in zip(par.annotations["name"].tolist(), par.annotations["dur_us"].tolist())}
    assert ranges == {f"range {i}": 300.0 for i in range(0, 600, 50)}  # each B closed by the E 30 events later


def test_refused_windows_fall_back_in_process(tmp_path, monkeypatch, spy):
    # NaN literals are refused by msgspec: each such window is rewound and read in process; once
    # over a quarter of the windows are refused, the rest of the file is. Same columns and warnings.
    events = _odd_events(400)
    spoiled = [e for e in events if e.get("cat") == "kernel"][::40]
    for e in spoiled:
        e["dur"] = "nan_here"
    path = tg.write(tmp_path / "nan.json", json.dumps(tg.document(events)).replace('"nan_here"', "NaN"))
    ref = read_trace_arrays(path, workers=0)
    monkeypatch.setattr(tracefile, "_CHUNK_CHARS", 2048)
    par = read_trace_arrays(path, workers=2)
    _same(par, ref)
    assert spy["rewound"] >= traceworkers._MAX_REFUSED
    assert f"{len(spoiled)} complete events without a finite numeric ts/dur excluded" in par.warnings
    assert all(math.isfinite(x) for x in par.gpu["dur_us"].tolist())


def test_dead_workers_fall_back_in_process(tmp_path, monkeypatch):
    path = tg.write(tmp_path / "t.json", tg.document(_odd_events(300)))
    ref = read_trace_arrays(path, workers=0)
    monkeypatch.setattr(tracefile, "_CHUNK_CHARS", 2048)
    monkeypatch.setattr(traceworkers, "_SERVE", "import sys; sys.exit(3)")  # workers that end at once
    _same(read_trace_arrays(path, workers=2), ref)


def test_worker_count_by_size_and_override(monkeypatch):
    monkeypatch.delenv("BUBBLESCOPE_TRACE_WORKERS", raising=False)
    monkeypatch.setattr(traceworkers.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(traceworkers.os, "getloadavg", lambda: (0.5, 0.5, 0.5), raising=False)
    limit = traceworkers.MIN_PARALLEL_BYTES
    assert traceworkers.worker_count(limit - 1, gz=False) == 0
    assert traceworkers.worker_count(limit, gz=False) == 2
    assert traceworkers.worker_count(-(-limit // 10), gz=True) == 2  # gzip counted at 10× its size
    assert traceworkers.worker_count(limit // 10 - 1, gz=True) == 0
    monkeypatch.setattr(traceworkers.os, "getloadavg", lambda: (1.2, 0.5, 0.5), raising=False)
    assert traceworkers.worker_count(limit * 100, gz=False) == 0  # no idle core: workers would only compete
    monkeypatch.setattr(traceworkers.os, "getloadavg", lambda: (0.0, 0.0, 0.0), raising=False)
    monkeypatch.setattr(traceworkers.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert traceworkers.worker_count(limit * 100, gz=False) == 0  # one core: nothing to split over
    monkeypatch.setenv("BUBBLESCOPE_TRACE_WORKERS", "3")
    assert traceworkers.worker_count(10, gz=False) == 3


def test_worker_pipes_are_widened_to_one_mebibyte(tmp_path):
    """Linux pipes hold 64 KiB: a window of megabytes crossed in ~80 writes and wake-ups per side. The
    workers' pipes are raised to 1 MiB (F_SETPIPE_SZ, within the default pipe-max-size), as the kernel reports."""
    fcntl = pytest.importorskip("fcntl")
    if not hasattr(fcntl, "F_GETPIPE_SZ"):
        pytest.skip("no F_GETPIPE_SZ: not Linux")
    from pathlib import Path

    limit = Path("/proc/sys/fs/pipe-max-size")
    if limit.is_file() and int(limit.read_text()) < 1 << 20:
        pytest.skip(f"pipe-max-size is {limit.read_text().strip()} bytes here: the pipes keep their size")
    from bubblescope.profiler.trace.events import EventTables

    pool = traceworkers.Workers(1, EventTables())
    try:
        proc = pool.procs[0]
        sizes = [fcntl.fcntl(s.fileno(), fcntl.F_GETPIPE_SZ) for s in (proc.stdin, proc.stdout)]
    finally:
        pool.close(kill=True)
    assert sizes == [1 << 20, 1 << 20]
