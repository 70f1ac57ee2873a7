"""The CPU operators the parse keeps (``profiler/trace/opevents.py``) give the top-level operators and the host time
per step that an independent reading of the file gives (``tests/cpuops_reference.py``), to the bit, in process,
event by event and through worker processes; and the summary reads the file once."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bubblescope.profiler.trace import batch, file as tracefile, summary as summary_module
from bubblescope.profiler.trace import workers as traceworkers
from bubblescope.profiler.trace.arrays import TraceArrays
from bubblescope.profiler.trace.cpuops import parsed_cpu_ops
from bubblescope.profiler.trace.load import read_trace_arrays
from bubblescope.profiler.trace.summary import summarize_traces

from . import tracegen as tg
from .cpuops_reference import reference_cpu_ops
from .test_trace_hostops import host_loop_events, marked_loop_events

EAGER = Path(__file__).resolve().parent / "data" / "h200_reference_eager.json.gz"


def _same(a: dict | None, b: dict | None) -> None:
    assert (a is None) == (b is None)
    if a is not None:
        assert a.keys() == b.keys()
        for key in a:
            assert a[key].dtype == b[key].dtype and a[key].tolist() == b[key].tolist(), key


def odd_operator_events() -> list[dict]:
    """Operators written every way the trace format allows, on two threads of pid 1: the loop of
    :func:`~.test_trace_hostops.host_loop_events` on thread 1/1, and beside it what the typing must treat as
    the reference reading does."""
    ev = host_loop_events(4)

    def op(name, ts, dur, **kw):
        return {**tg.cpu_op(name, ts, dur), **kw}

    ev += [
        op("int_times", 3000, 20),  # ints
        op("text_times", "3030.25", "10.5"),  # numeric strings
        op("zero", 0, 0),  # kept: the tables drop ts 0 with dur 0, an operator list does not
        op("negative", 3050.0, -1.0),  # left out
        op("no_ts", None, 5.0),  # left out
        op("bad_text", "soon", 5.0),  # left out
        op(7, 3060.0, 5.0),  # a name that is no text: left out
        op("ProfilerStep#9", 3070.0, 50.0),  # old torch's step: a table's step range and an operator
        op("old_category", 3130.0, 5.0, cat="Operator"),
        op("pid_as_text", 3140.0, 5.0, pid="1"),  # thread "1"/"1": the same thread as pid 1
        op("same_times_a", 3150.0, 5.0), op("same_times_b", 3150.0, 5.0),  # the first in the file is kept
        op("outer", 3160.0, 20.0), op("inner_late", 3165.0, 30.0), op("after", 3181.0, 2.0),
        op("no_tid", 3190.0, 5.0, tid=None), {k: v for k, v in op("tid_absent", 3200.0, 5.0).items() if k != "tid"},
        op("bool_pid", 3210.0, 5.0, pid=True),  # thread "True"/"1", not 1/1 (the batch decoder refuses a bool)
        op("float_pid", 3220.0, 5.0, pid=1.0),  # thread "1.0"/"1"
        op("other_thread", 10.0, 5.0, tid=2),
        {"ph": "B", "cat": "cpu_op", "name": "paired", "pid": 1, "tid": 1, "ts": 3230.0},  # no operator here
        {"ph": "E", "cat": "cpu_op", "name": "paired", "pid": 1, "tid": 1, "ts": 3240.0},
    ]
    return ev


def _parsed(path, workers: int = 0):
    return parsed_cpu_ops(read_trace_arrays(path, flows=False, lean=True, workers=workers))


@pytest.mark.parametrize("events", [odd_operator_events(), marked_loop_events(4, t0=1_733_456_789_012_345.5),
                                    marked_loop_events(4, t0=float(1 << 54))],
                         ids=["odd", "absolute-ns", "beyond-2^53"])
def test_the_parse_keeps_the_operators_an_independent_reading_finds(tmp_path, monkeypatch, events):
    path = tg.write(tmp_path / "t.json", tg.document(events, rank=None))
    want = reference_cpu_ops(path)
    assert want is not None
    _same(_parsed(path), want)
    monkeypatch.setattr(tracefile, "_CHUNK_CHARS", 2048)  # many windows: each one's events sent to a worker
    _same(_parsed(path, workers=2), want)
    monkeypatch.setattr(batch, "add_batch", lambda cols, text: False)  # every event read one at a time
    _same(_parsed(path), want)


@pytest.mark.parametrize("decoder", ["batch", "per-event"])
def test_every_odd_operator_is_typed_as_the_reference_reading_types_it(tmp_path, decoder):
    events = odd_operator_events()
    if decoder == "batch":  # a bool or float pid makes the batch decoder refuse the window
        events = [e for e in events if type(e.get("pid", 0)) is int]
    path = tg.write(tmp_path / "t.json", tg.document(events, rank=None))
    ops = read_trace_arrays(path).cpu_ops
    names = set(ops.names[ops.name].tolist())
    assert {"int_times", "text_times", "zero", "ProfilerStep#9", "old_category", "inner_late"} <= names
    assert not {"negative", "no_ts", "bad_text", "paired", "7"} & names
    odd = {("True", "1"), ("1.0", "1")} if decoder == "per-event" else set()
    assert {("1", "1"), ("1", "2"), ("1", "None")} | odd == set(ops.threads)  # "1" and 1 one thread, absent "None"
    top = parsed_cpu_ops(read_trace_arrays(path))
    assert top["tid"][0] == 1 and "same_times_b" not in top["name"].tolist()
    assert "inner_late" not in top["name"].tolist() and "after" in top["name"].tolist()
    _same(top, reference_cpu_ops(path))


def _without_gpu(events: list[dict]) -> list[dict]:
    return [e for e in events if e.get("ph") == "M" or e.get("cat") == "cpu_op"]


@pytest.mark.parametrize("workers", ["0", "2"])
@pytest.mark.parametrize("case", ["eager", "markerless", "marked", "absolute", "cpu-only"])
def test_the_summary_reads_the_file_once_and_gives_the_same_host_time(tmp_path, monkeypatch, case, workers):
    if case == "eager":
        path = EAGER
    else:
        events = {"markerless": lambda: host_loop_events(6), "marked": lambda: marked_loop_events(5),
                  "absolute": lambda: marked_loop_events(5, t0=1_733_456_789_012_345.5),
                  "cpu-only": lambda: _without_gpu(host_loop_events(12))}[case]()
        path = tg.write(tmp_path / "t.json", tg.document(events, rank=None))
    monkeypatch.setenv("BUBBLESCOPE_TRACE_WORKERS", workers)
    merged = []
    merge = traceworkers._merge
    monkeypatch.setattr(traceworkers, "_merge", lambda cols, result: merged.append(1) or merge(cols, result))
    monkeypatch.setattr(tracefile, "_CHUNK_CHARS", 1 << 16 if case == "eager" else 2048)
    # what the summary gives with the operators of an independent reading of the file
    with monkeypatch.context() as ref:
        ref.setattr(summary_module, "parsed_cpu_ops", lambda arrays: reference_cpu_ops(arrays.path))
        want = summarize_traces([path])["files"][0]

    opened, open_trace = [], tracefile.open_trace
    monkeypatch.setattr("bubblescope.profiler.trace.load.open_trace", lambda p: opened.append(p) or open_trace(p))
    merged.clear()
    got = summarize_traces([path])["files"][0]
    assert opened == [str(path)]
    assert (len(merged) > 0) == (workers != "0")
    assert json.dumps(got) == json.dumps(want)
    if case == "cpu-only":
        assert got["step_detection"]["method"] == "cpu-ops" and got["host_ops"] is None
    else:
        assert got["host_ops"]["rows"] and got["host_ops"]["reason"] is None


def test_a_trace_built_from_frames_without_operators_has_none(tmp_path):
    path = tg.write(tmp_path / "t.json", tg.document(host_loop_events(3), rank=None))
    trace = read_trace_arrays(path).to_trace()
    assert parsed_cpu_ops(TraceArrays.from_trace(trace))["name"].tolist()[:2] == ["aten::embedding",
                                                                                              "aten::linear"]
    bare = type(trace)(path=trace.path, rank=trace.rank, metadata=trace.metadata, gpu=trace.gpu,
                       runtime=trace.runtime, annotations=trace.annotations, flows=trace.flows,
                       warnings=trace.warnings)
    assert parsed_cpu_ops(TraceArrays.from_trace(bare)) is None
    assert np.array_equal(read_trace_arrays(path).cpu_ops.ts_us, trace.cpu_ops.ts_us)
