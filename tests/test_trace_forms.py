"""Every Trace Event Format form and event pattern that must give the same (hand-computed) numbers.

B/E duration pairs, numbers written as strings, repeated and same-name nested GPU events, streams
running at once and CPU/GPU clock skew; each case checks the numbers against values worked out in
the comments and the warning that says what was merged. Each trace is read twice: by the msgspec
batch decoder and, with it switched off, by the per-event standard-library path, which must agree.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest

from bubblescope.profiler.trace import batch as tracebatch
from bubblescope.profiler.trace import load_trace
from bubblescope.profiler.trace.summary import summarize_traces

from . import tracegen as tg

ROOT = Path(__file__).resolve().parents[1]
REAL = sorted(glob.glob(str(ROOT.parent / "shared" / "traces" / "*.json.gz"))) + sorted(
    glob.glob(str(ROOT / "tests" / "data" / "*.json.gz"))
)


@pytest.fixture(params=["batch", "per-event"])
def reader(request, monkeypatch):
    """Which decoder reads the trace: msgspec batches, or the per-event fallback for all of it."""
    if request.param == "per-event":
        monkeypatch.setattr(tracebatch, "add_batch", lambda cols, text: False)
    return request.param


def _summary(path) -> dict:
    return summarize_traces([path])["files"][0]


def _begin_end(ev: dict, end_args: dict | None = None) -> list[dict]:
    """The complete event ``ev`` written as a B/E pair (E has only ph, pid, tid, ts, optional args)."""
    begin = {k: v for k, v in ev.items() if k != "dur"}
    begin["ph"] = "B"
    end = {"ph": "E", "pid": ev["pid"], "tid": ev["tid"], "ts": ev["ts"] + ev["dur"]}
    if end_args is not None:
        end["args"] = end_args
    return [begin, end]


def test_begin_end_pairs_give_the_complete_event_numbers(tmp_path, reader):
    # decode_trace_events with every kernel, launch and step range written as B/E pairs gives exactly
    # the numbers of the X-event trace. Written as a tracer would: in time order, an E before a B of the
    # same time (a slice ends as the next begins), a zero-length slice's B before its E; and with the GPU
    # events first, so the file is not in time order across threads and pairing must sort by thread.
    events = tg.decode_trace_events()
    keyed = []
    for i, ev in enumerate(e for e in events if e.get("ph") == "X"):
        begin, end = _begin_end(ev)
        keyed += [((ev["pid"] != 0, begin["ts"], 1, i), begin), ((ev["pid"] != 0, end["ts"], 2 if ev["dur"] == 0 else 0, i), end)]
    pairs = [ev for _, ev in sorted(keyed, key=lambda kv: kv[0])]
    as_x = _summary(tg.write(tmp_path / "x.json", tg.document(events)))
    as_be = _summary(tg.write(tmp_path / "be.json", tg.document(tg.meta_events() + pairs)))
    assert as_be["devices"] == as_x["devices"] and as_be["steps"] == as_x["steps"]
    assert as_be["devices"][0]["kernels"] == 8 and as_be["devices"][0]["busy_us"] == 20 + 3 + 6 + 0 + 5 + 4 + 5 + 1
    assert as_be["warnings"] == as_x["warnings"]


def test_begin_end_nesting_args_merge_and_unpaired(tmp_path, reader):
    # On one GPU stream: B outer@100, B inner@102, E@104 (closes inner: 2 µs), E@110 (closes outer:
    # 10 µs); the E of the outer one carries the correlation id (args merged into the B's). A lone E
    # and an unclosed B are counted and ignored.
    gpu = {"pid": 0, "tid": 7, "cat": "kernel"}
    events = [
        {**gpu, "ph": "B", "name": "outer", "ts": 100, "args": {"device": 0, "stream": 7}},
        {**gpu, "ph": "B", "name": "inner", "ts": 102, "args": {"device": 0, "stream": 7, "correlation": 2}},
        {"ph": "E", "pid": 0, "tid": 7, "ts": 104},
        {"ph": "E", "pid": 0, "tid": 7, "ts": 110, "args": {"correlation": 1}},
        {"ph": "E", "pid": 0, "tid": 8, "ts": 120},
        {**gpu, "ph": "B", "name": "never_closed", "ts": 130},
        tg.launch(95, 2, 1),
        tg.launch(96, 2, 2),
    ]
    tr = load_trace(tg.write(tmp_path / "n.json", tg.document(events)))
    got = tr.gpu[["name", "ts_us", "dur_us", "correlation"]].values.tolist()
    assert sorted(got) == [["inner", 102.0, 2.0, 2], ["outer", 100.0, 10.0, 1]]
    assert "1 'E' event without an open 'B' on its thread ignored" in tr.warnings
    assert "1 'B' event never closed by an 'E' on its thread ignored" in tr.warnings
    dev = _summary(tr.path)["devices"][0]
    assert (dev["kernels"], dev["busy_us"], dev["span_us"]) == (2, 10.0, 10.0)


def test_gpu_work_only_as_begin_end_is_not_a_cpu_only_trace(tmp_path, reader):
    events = _begin_end(tg.kernel("k", 50, 4, 1)) + [tg.launch(45, 2, 1)]
    s = _summary(tg.write(tmp_path / "g.json", tg.document(events)))
    assert "no GPU activity in trace (CPU-only run)" not in s["warnings"]
    assert s["devices"][0]["busy_us"] == 4.0


def test_numeric_strings_are_numbers(tmp_path, reader):
    # The same two kernels and launches with ts/dur/ids written as JSON strings: identical frames.
    def stringify(ev):
        out = {**ev, "ts": str(ev["ts"]), "dur": str(ev["dur"]), "pid": str(ev["pid"]), "tid": str(ev["tid"])}
        out["args"] = {k: (str(v) if isinstance(v, int) else v) for k, v in ev["args"].items()}
        return out

    events = [tg.launch(95, 1, 1), tg.kernel("k1", 100.5, 10, 1), tg.launch(96, 1, 2), tg.kernel("k2", 1e2, 2.25, 2)]
    plain = load_trace(tg.write(tmp_path / "p.json", tg.document(events)))
    texts = load_trace(tg.write(tmp_path / "s.json", tg.document([stringify(e) for e in events])))
    assert texts.gpu.equals(plain.gpu) and texts.runtime.equals(plain.runtime) and texts.warnings == []
    assert texts.gpu["ts_us"].tolist() == [100.0, 100.5] and texts.gpu["correlation"].tolist() == [2, 1]


def test_repeated_and_nested_same_name_events_count_once(tmp_path, reader):
    # k [100,110] written twice (same device, stream, name, times); r [120,140] with another r [125,130]
    # nested inside it on the same stream; r [125,130] on stream 8 is another stream's work and stays;
    # k [105,108] named differently ("k2") inside k stays too. Counted: k, k2, r (outer), r (s8) = 4.
    events = [
        tg.launch(90, 1, 1),
        tg.kernel("k", 100, 10, 1),
        tg.kernel("k", 100, 10, 1),
        tg.kernel("k2", 105, 3, 2),
        tg.kernel("r", 120, 20, 3),
        tg.kernel("r", 125, 5, 3),
        tg.kernel("r", 125, 5, 4, stream=8),
    ]
    tr = load_trace(tg.write(tmp_path / "d.json", tg.document(events)))
    assert sorted(zip(tr.gpu["name"], tr.gpu["ts_us"], tr.gpu["stream"])) == [
        ("k", 100, 7), ("k2", 105, 7), ("r", 120, 7), ("r", 125, 8)
    ]
    assert (
        "1 GPU activity repeated exactly (same device, stream, name, start and duration): counted once"
        in tr.warnings
    )
    assert (
        "1 GPU activity nested inside another of the same name on the same device and stream: counted once "
        "(the outer one kept)" in tr.warnings
    )
    dev = _summary(tr.path)["devices"][0]
    # busy: [100,110] + [120,140] = 30; totals: k 10, k2 3, r 20 + 5
    assert (dev["kernels"], dev["busy_us"]) == (4, 30.0)
    assert {k["name"]: (k["count"], k["total_us"]) for k in dev["top_kernels"]} == {
        "k": (1, 10.0), "k2": (1, 3.0), "r": (2, 25.0)
    }


def test_streams_running_at_once_are_named_with_the_overlap(tmp_path, reader):
    # s7: [100,110], [112,120]; s8: [105,115] -> union [100,120] = 20 busy; per-stream busy 18 + 10 = 28;
    # the streams overlap for 8 µs (105-110 and 112-115).
    events = [
        tg.launch(90, 1, 1), tg.kernel("a", 100, 10, 1),
        tg.launch(91, 1, 2), tg.kernel("b", 112, 8, 2),
        tg.launch(92, 1, 3), tg.kernel("c", 105, 10, 3, stream=8),
    ]
    s = _summary(tg.write(tmp_path / "o.json", tg.document(events)))
    assert s["devices"][0]["busy_us"] == 20.0
    assert (
        "device 0: its 2 streams run at the same time for 8.000 µs: busy and idle time count that time once, "
        "category and kernel totals (summed durations) once per activity" in s["warnings"]
    )
    one_stream = [tg.launch(90, 1, 1), tg.kernel("a", 100, 10, 1), tg.launch(91, 1, 2), tg.kernel("b", 112, 8, 2)]
    assert not any("same time" in w for w in _summary(tg.write(tmp_path / "1.json", tg.document(one_stream)))["warnings"])


def test_clock_skew_is_named_with_its_size(tmp_path, reader):
    # k1 starts 2.5 µs before its launch call (ts 100 vs 102.5), k2 1 µs before (ts 200 vs 201), k3 after.
    events = [
        tg.launch(102.5, 3, 1), tg.kernel("k1", 100, 5, 1),
        tg.launch(201, 3, 2), tg.kernel("k2", 200, 5, 2),
        tg.launch(290, 3, 3), tg.kernel("k3", 300, 5, 3),
    ]
    s = _summary(tg.write(tmp_path / "skew.json", tg.document(events)))
    assert (
        "2 of 3 launched GPU activities start before their launch call, by up to 2.500 µs: the CPU and GPU "
        "clocks disagree, so those launch delays are negative and host-wait idle time is undercounted"
        in s["warnings"]
    )
    fine = [tg.launch(90, 3, 1), tg.kernel("k1", 100, 5, 1)]
    assert not any("clocks disagree" in w for w in _summary(tg.write(tmp_path / "ok.json", tg.document(fine)))["warnings"])


@pytest.mark.parametrize("path", REAL, ids=[Path(p).name for p in REAL])
def test_batch_reader_equals_the_per_event_reader_on_real_traces(path, monkeypatch):
    """The msgspec batch reader against the per-event standard-library reader (the reader before issue
    12, kept as the fallback): the same frames, warnings and summary on every real trace."""
    if not Path(path).is_file():
        pytest.skip(f"{path}: not present")
    fast = load_trace(path)
    fast_summary = json.dumps(summarize_traces([path]), sort_keys=True)
    monkeypatch.setattr(tracebatch, "add_batch", lambda cols, text: False)
    slow = load_trace(path)
    for table in ("gpu", "runtime", "annotations", "flows"):
        assert getattr(fast, table).equals(getattr(slow, table)), table
    assert fast.warnings == slow.warnings and fast.event_count == slow.event_count
    assert fast_summary == json.dumps(summarize_traces([path]), sort_keys=True)


def test_real_traces_present_for_the_comparison():
    if not REAL:
        pytest.skip("no real traces in ../shared/traces or tests/data")
    assert any("h200_reference" in p for p in REAL)


def test_gzip_of_several_members_and_zero_padding(tmp_path):
    # A trace gzipped in two members (as `cat a.gz b.gz` or a writer flushing in parts gives), padded
    # with zeros after the last member, reads as the whole text.
    text = json.dumps(tg.document(tg.decode_trace_events())).encode()
    import gzip

    half = len(text) // 2
    path = tmp_path / "members.json.gz"
    path.write_bytes(gzip.compress(text[:half]) + gzip.compress(text[half:]) + bytes(16))
    whole = load_trace(tg.write(tmp_path / "one.json", text))
    parts = load_trace(path)
    assert parts.gpu.equals(whole.gpu) and parts.runtime.equals(whole.runtime) and len(parts.gpu) == 10
