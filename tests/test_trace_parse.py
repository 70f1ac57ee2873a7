"""load_trace on hand-built traces: every variant and odd input the parser must survive."""

from __future__ import annotations

import gzip
import json

import pytest

from bubblescope.errors import BubblescopeError
from bubblescope.profiler.trace import file as tracefile
from bubblescope.profiler.trace import load_trace
from bubblescope.profiler.trace.values import parse_rank

from . import tracegen as tg


def _one_line_error(path) -> str:
    with pytest.raises(BubblescopeError) as info:
        load_trace(path)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg
    return msg


def test_basic_columns_and_values(tmp_path):
    path = tg.write(tmp_path / "t.json", tg.document(tg.decode_trace_events()))
    tr = load_trace(path)
    assert tr.path == str(path) and tr.rank == 0
    assert len(tr.gpu) == 10 and len(tr.runtime) == 8 and len(tr.flows) == 4
    # gpu_user_annotation copies are not step ranges; the two steps and the unrelated range are.
    assert sorted(tr.annotations["name"]) == [
        "bubblescope.decode_step#0",
        "bubblescope.decode_step#1",
        "unrelated_range",
    ]
    k2 = tr.gpu[tr.gpu["name"] == "rmsnorm_b"].iloc[0]
    assert (k2["kind"], k2["device"], k2["stream"], k2["ts_us"], k2["dur_us"], k2["end_us"], k2["correlation"]) == (
        "kernel",
        0,
        8,
        105.0,
        15.0,
        120.0,
        2,
    )
    assert tr.gpu["kind"].value_counts().to_dict() == {"kernel": 9, "memcpy": 1}
    # sorted by (device, ts): device 1's kernel last
    assert list(tr.gpu["device"]) == [0] * 9 + [1]
    assert list(tr.gpu["ts_us"])[:3] == [100.0, 105.0, 130.0]
    launches = tr.runtime[tr.runtime["is_launch"]]
    assert sorted(launches["name"].unique()) == ["cudaGraphLaunch", "cudaLaunchKernel"] and len(launches) == 6
    assert list(tr.runtime.loc[tr.runtime["is_sync"], "name"]) == ["cudaStreamSynchronize"]
    assert tr.warnings == ["1 of 10 GPU activities has no CPU call with their correlation id (launch unknown)"]
    assert tr.metadata["deviceProperties"][0]["numSms"] == 132 and "traceEvents" not in tr.metadata


def test_kernel_launch_args_and_driver_and_exc_variants(tmp_path):
    ev = [
        tg.kernel(
            "k",
            10,
            2,
            1,
            **{
                "registers per thread": 40,
                "shared memory": 1024,
                "blocks per SM": 0.5,
                "warps per SM": 2.0,
                "grid": [8, 1, 1],
                "block": [128, 1, 1],
                "est. achieved occupancy %": 3,
            },
        ),
        tg.api("cuLaunchKernel", 5, 1, 1, cat="cuda_driver"),
        tg.api("cudaLaunchKernelExC_v11060", 20, 1, 2),
        tg.api("cuLaunchKernelEx", 30, 1, 3, cat="cuda_driver"),
        tg.api("cudaEventSynchronize", 40, 1, 4),
        tg.api("cuCtxSynchronize", 50, 1, 5, cat="cuda_driver"),
        tg.api("cudaMalloc", 60, 1, 6),
    ]
    tr = load_trace(tg.write(tmp_path / "t.json", tg.document(ev)))
    k = tr.gpu.iloc[0]
    assert (
        k["registers_per_thread"],
        k["shared_memory_bytes"],
        k["blocks_per_sm"],
        k["warps_per_sm"],
        k["occupancy_pct"],
        k["grid"],
        k["block"],
    ) == (40, 1024, 0.5, 2.0, 3, (8, 1, 1), (128, 1, 1))
    rt = tr.runtime.set_index("name")
    assert list(rt["is_launch"]) == [True, True, True, False, False, False]
    assert list(rt["is_sync"]) == [False, False, False, True, True, False]
    assert rt.loc["cuLaunchKernel", "category"] == "cuda_driver"


def test_legacy_categories_lowercase_external_id_and_int_us(tmp_path):
    ev = [
        {
            "ph": "X",
            "cat": "Kernel",
            "name": "k",
            "pid": 0,
            "tid": 7,
            "ts": 100,
            "dur": 6,
            "args": {"device": 0, "stream": 7, "correlation": 11, "external id": 77},
        },
        {
            "ph": "X",
            "cat": "Runtime",
            "name": "cudaLaunchKernel",
            "pid": 5,
            "tid": 5,
            "ts": 90,
            "dur": 4,
            "args": {"correlation": 11, "external id": 77},
        },
        {
            "ph": "X",
            "cat": "Memcpy",
            "name": "Memcpy HtoD",
            "pid": 0,
            "tid": 7,
            "ts": 110,
            "dur": 0,
            "args": {"device": 0, "stream": 7, "correlation": 12},
        },
        {"ph": "X", "cat": "Memset", "name": "Memset", "pid": 0, "tid": 7, "ts": 111, "dur": 1, "args": {}},
    ]
    tr = load_trace(tg.write(tmp_path / "legacy.json", {"traceEvents": ev, "distributedInfo": {"rank": "1"}}))
    assert tr.rank == 1
    assert list(tr.gpu["kind"]) == ["kernel", "memcpy", "memset"]
    assert list(tr.gpu["external_id"].astype("float").fillna(-1)) == [77, -1, -1]
    assert tr.gpu["dur_us"].tolist() == [6.0, 0.0, 1.0]  # the 0-µs memcpy is kept
    assert tr.runtime.iloc[0][["external_id", "is_launch"]].tolist() == [77, True]
    # device falls back to pid when args.device is absent (the memset)
    assert tr.gpu["device"].tolist() == [0, 0, 0]


@pytest.mark.parametrize("unit", ["ms", "ns", "us"])
def test_display_time_unit_does_not_scale(tmp_path, unit):
    doc = tg.document(
        [tg.kernel("k", 1000.5, 2.25, 1), tg.launch(990, 3, 1)],
        displayTimeUnit=unit,
        baseTimeNanoseconds=1727743122000000000,
    )
    tr = load_trace(tg.write(tmp_path / "t.json", doc))
    assert tr.gpu[["ts_us", "dur_us", "end_us"]].iloc[0].tolist() == [1000.5, 2.25, 1002.75]
    assert tr.metadata["displayTimeUnit"] == unit
    assert tr.metadata["baseTimeNanoseconds"] == 1727743122000000000


@pytest.mark.parametrize(
    "raw,expected", [(3, 3), ("1", 1), (1.0, 1), (" 2 ", 2), (None, None), (True, None), ("rank1", None), (1.5, None)]
)
def test_parse_rank(raw, expected):
    assert parse_rank(raw) == expected


def test_rank_formats_in_file(tmp_path):
    for raw, want in (("1", 1), (1.0, 1), (4, 4)):
        assert load_trace(tg.write(tmp_path / "r.json", tg.document([], rank=raw))).rank == want
    tr = load_trace(tg.write(tmp_path / "r.json", tg.document([], rank="first")))
    assert tr.rank is None and any("rank 'first'" in w for w in tr.warnings)
    assert load_trace(tg.write(tmp_path / "r.json", tg.document([], rank=None))).rank is None


def test_gzip_detected_by_content_not_name(tmp_path):
    doc = tg.document(tg.decode_trace_events())
    plain = load_trace(tg.write(tmp_path / "a.json", doc))
    gz = load_trace(tg.write(tmp_path / "a.json.gz", doc))
    gz_named_json = load_trace(tg.write(tmp_path / "b.json", doc, gz=True))
    for other in (gz, gz_named_json):
        assert other.gpu.drop(columns=["grid", "block"]).equals(plain.gpu.drop(columns=["grid", "block"]))
        assert other.runtime.equals(plain.runtime)


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_small_chunks_give_the_same_frames(tmp_path, monkeypatch, chunk):
    # Refill logic: events, numbers, literals and strings cut at every place by a small read window.
    doc = tg.document(tg.decode_trace_events(), displayTimeUnit="ms", flag=True, nothing=None, neg=-1.5e-3)
    path = tg.write(tmp_path / "t.json.gz", doc)
    whole = load_trace(path)
    monkeypatch.setattr(tracefile, "_CHUNK_CHARS", chunk)
    cut = load_trace(path)
    assert cut.gpu.equals(whole.gpu) and cut.runtime.equals(whole.runtime)
    assert cut.annotations.equals(whole.annotations) and cut.flows.equals(whole.flows)
    assert cut.metadata == whole.metadata == {k: v for k, v in doc.items() if k != "traceEvents"}


def test_metadata_only_and_cpu_only_traces(tmp_path):
    tr = load_trace(tg.write(tmp_path / "m.json", tg.document(tg.meta_events())))
    assert tr.gpu.empty and tr.runtime.empty and tr.annotations.empty and tr.event_count == 3
    assert list(tr.gpu.columns[:7]) == ["name", "kind", "device", "stream", "ts_us", "dur_us", "end_us"]
    cpu = load_trace(
        tg.write(
            tmp_path / "c.json",
            tg.document([tg.annotation("bubblescope.decode_step#0", 0.5, 10), tg.api("cudaMalloc", 1, 2, 3)]),
        )
    )
    assert cpu.gpu.empty and len(cpu.runtime) == 1 and cpu.warnings == []


def test_zero_events_excluded_and_counted(tmp_path):
    zeros = [tg.kernel("z", 0, 0, 1), tg.launch(0, 0, 2), tg.annotation("bubblescope.decode_step#9", 0, 0)]
    ev = zeros + [tg.kernel("k", 100, 5, 3), tg.launch(90, 2, 3), tg.kernel("k0", 0, 4, 4)]
    tr = load_trace(tg.write(tmp_path / "z.json", tg.document(ev)))
    assert tr.gpu["name"].tolist() == ["k0", "k"]  # ts 0 with a real duration is kept
    assert len(tr.runtime) == 1 and tr.annotations.empty
    assert "3 events with ts 0 and dur 0 excluded" in tr.warnings


def test_bad_numbers_are_excluded_or_nulled(tmp_path):
    big = 2**70
    events = [
        tg.kernel("k", 10, 1, big),
        tg.api("cudaLaunchKernel", 5, 1, big),
        tg.kernel("k2", 20, 1, 2, stream=big),
        tg.kernel("nan_ts", "NAN_HERE", 1, 3),
        tg.kernel("text_dur", 30, "one", 4),
    ]
    text = json.dumps(tg.document(events)).replace('"NAN_HERE"', "NaN")
    tr = load_trace(tg.write(tmp_path / "big.json", text))
    # A numeric string ("1") is a number (see test_numeric_strings_are_numbers);
    # text that is no number still excludes the event.
    assert tr.gpu["name"].tolist() == ["k", "k2"]
    assert tr.gpu["correlation"].isna().tolist() == [True, False]
    assert tr.gpu["stream"].isna().tolist() == [False, True]
    assert tr.runtime["correlation"].isna().all()
    assert "2 complete events without a finite numeric ts/dur excluded" in tr.warnings
    assert "2 integers in args.correlation beyond int64 or not integers, set to null" in tr.warnings
    assert "1 integer in args.stream (or tid) beyond int64 or not an integer, set to null" in tr.warnings
    assert str(tr.gpu["correlation"].dtype) == "Int64"


def test_invalid_utf8_and_lone_surrogates(tmp_path):
    raw = json.dumps(tg.document([tg.kernel("NAME_A", 10, 1, 1), tg.kernel("NAME_B", 20, 1, 2)])).encode()
    raw = raw.replace(b"NAME_A", b"bad\xff\xfename").replace(b"NAME_B", b"sur\\ud800x")
    tr = load_trace(tg.write(tmp_path / "u.json.gz", raw))
    assert tr.gpu["name"].tolist() == ["bad\ufffd\ufffdname", "sur\ufffdx"]
    assert "2 distinct names had invalid UTF-8 (replaced by U+FFFD)" in tr.warnings
    json.dumps(tr.gpu["name"].tolist(), ensure_ascii=False).encode("utf-8")


def test_a_repaired_name_equal_to_another_is_one_name(tmp_path):
    """"k" + a lone surrogate repairs to "k\ufffd", which another kernel is already called: one name then, so the
    two kernels (2 µs and 3 µs) are one line of the top kernels, 2 calls and 5 µs."""
    from bubblescope.profiler.trace.summary import summarize_traces

    raw = json.dumps(tg.document([tg.kernel("NAME_A", 10, 2, 1), tg.kernel("k\ufffd", 20, 3, 2)])).encode()
    path = tg.write(tmp_path / "same.json", raw.replace(b"NAME_A", b"k\\ud800"))
    tr = load_trace(path)
    assert tr.gpu["name"].tolist() == ["k\ufffd", "k\ufffd"]
    assert "2 distinct names had invalid UTF-8 (replaced by U+FFFD)" in tr.warnings
    (top,) = summarize_traces([path])["files"][0]["devices"][0]["top_kernels"]
    assert (top["name"], top["count"], top["total_us"]) == ("k\ufffd", 2, 5.0)


def test_bare_array_format_with_and_without_closing_bracket(tmp_path):
    events = [tg.kernel("k", 10, 1, 1), tg.launch(5, 1, 1)]
    closed = load_trace(tg.write(tmp_path / "a.json", events))
    unclosed = load_trace(tg.write(tmp_path / "b.json", json.dumps(events)[:-1] + ",\n"))
    assert len(closed.gpu) == len(unclosed.gpu) == 1 and closed.rank is None


@pytest.mark.parametrize("workers", [0, 2])
def test_trailing_data_is_refused_and_trailing_whitespace_kept(tmp_path, monkeypatch, workers):
    """After the complete top-level value only whitespace may follow (the bare array may stop without its
    "]"); gzipped or not, in process or through the worker processes (small windows: many of them)."""
    from bubblescope.profiler.trace.load import read_trace_arrays

    monkeypatch.setattr(tracefile, "_CHUNK_CHARS", 4096)
    events = tg.decode_trace_events() * 40
    doc, bare = json.dumps(tg.document(events)), json.dumps(events)
    ok = {"doc.json": doc + "\n \t\r\n", "bare.json.gz": bare + "\n", "open.json": bare[:-1] + ",\n\n"}
    for name, text in ok.items():
        path = tg.write(tmp_path / name, text.encode())
        assert read_trace_arrays(path, workers=workers).event_count == len(events), name
    for name, text in {"junk.json": doc + "garbage", "twice.json.gz": doc + doc, "bare.json": bare + "]"}.items():
        path = tg.write(tmp_path / name, text.encode())
        with pytest.raises(BubblescopeError) as info:
            read_trace_arrays(path, workers=workers)
        at = len(bare if name == "bare.json" else doc)
        assert str(info.value) == (f"{path}: not a Chrome trace: invalid JSON at character {at}: data after the end "
                                   "of the trace (one JSON value per file)")


@pytest.mark.parametrize("path", ["batch", "per event"])
def test_events_of_an_unknown_phase_are_ignored_and_counted(tmp_path, path):
    """Viewers ignore a phase they do not know; so does the parser, which now says how many it ignored (they
    were dropped without a word). Every phase of the Trace Event Format is known, used or not."""
    known = [{"ph": ph, "name": "n", "cat": "c", "ts": 1, "pid": 0, "tid": 0, "id": 1}
             for ph in "iICbneSTpFPNODMVvRc()="]
    unknown = [{"ph": "Z", "ts": 1}, {"ph": "", "ts": 2}, {"ph": 5, "ts": 3}, {"name": "no ph", "ts": 4},
               {**tg.kernel("xx", 5, 1, 99), "ph": "XX"}]
    events = tg.decode_trace_events() + known + unknown
    if path == "per event":  # a NaN literal: the batch decoder refuses the window, read one event at a time
        events = [{"ph": "C", "name": "nan", "ts": float("nan"), "pid": 0}] + events
    tr = load_trace(tg.write(tmp_path / "ph.json", tg.document(events)))
    assert len(tr.gpu) == 10 and "5 events of an unknown phase (ph) ignored" in tr.warnings
    one = load_trace(tg.write(tmp_path / "one.json", tg.document(tg.decode_trace_events() + unknown[:1])))
    assert "1 event of an unknown phase (ph) ignored" in one.warnings


def test_non_object_events_are_counted(tmp_path):
    tr = load_trace(tg.write(tmp_path / "n.json", tg.document([1, "x", None, tg.kernel("k", 1, 1, 1)])))
    assert len(tr.gpu) == 1 and "3 non-object entries in traceEvents ignored" in tr.warnings


@pytest.mark.parametrize(
    "content,needle",
    [
        (b"", "is empty"),
        (b"hello, not json", "invalid JSON"),
        (b'{"foo": 1, "bar": [1, 2]}', "without a traceEvents array"),
        (b"[1, 2, 3", "without a single event object"),
        (b"42", "not a trace"),
        (b'{"traceEvents": {"a": 1}}', "traceEvents is not an array"),
        (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1', "truncated"),
        (b'{"traceEvents": [{"ph": "X"} {"ph": "X"}]}', "expected ',' or ']'"),
        # one JSON value per file: trailing data (junk, a second document) was ignored
        (b'{"traceEvents": []}garbage', "invalid JSON at character 19: data after the end of the trace"),
        (b'{"traceEvents": []}\n{"traceEvents": []}\n', "invalid JSON at character 20: data after the end"),
        (b'[{"ph": "X"}] x', "invalid JSON at character 14: data after the end of the trace"),
    ],
)
def test_bad_files_raise_one_line(tmp_path, content, needle):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    assert needle in _one_line_error(path)


def test_truncated_and_corrupt_gzip(tmp_path):
    data = gzip.compress(json.dumps(tg.document(tg.decode_trace_events() * 50)).encode())
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(data[: len(data) // 2])
    assert "truncated" in _one_line_error(cut)
    corrupt = tmp_path / "corrupt.json.gz"
    corrupt.write_bytes(data[:20] + bytes(200) + data[220:])
    assert "gzip" in _one_line_error(corrupt)


def test_missing_file_and_directory(tmp_path):
    assert "no such file" in _one_line_error(tmp_path / "nope.json")
    assert "directory" in _one_line_error(tmp_path)


def test_unhashable_category_phase_and_dims_are_ignored_not_fatal(tmp_path):
    """A list or object where a string or int belongs (cat, ph, flow id/ts, grid) must not raise."""
    good = tg.kernel("k", 10, 1, 1, grid=[8, 1, 1])
    events = [
        good,
        tg.launch(5, 1, 1),
        {**tg.kernel("cat_list", 20, 1, 2), "cat": ["kernel"]},
        {**tg.kernel("cat_obj", 30, 1, 3), "cat": {}},
        {**tg.kernel("ph_list", 40, 1, 4), "ph": ["X"]},
        {**tg.kernel("ph_obj", 50, 1, 5), "ph": {"X": 1}},
        tg.kernel("nested_dims", 60, 1, 6, grid=[[1], 2], block="x"),
        {"ph": "s", "id": [1], "ts": [5], "pid": [], "tid": {}, "cat": ["ac2g"]},
        {"ph": "f", "id": 2**80, "ts": "x", "pid": 0, "tid": 7, "cat": "ac2g"},
    ]
    tr = load_trace(tg.write(tmp_path / "odd.json", tg.document(events)))
    assert tr.gpu["name"].tolist() == ["k", "nested_dims"]
    assert tr.gpu["grid"].tolist() == [(8, 1, 1), None] and tr.gpu["block"].tolist() == [None, None]
    assert tr.flows["phase"].tolist() == ["s", "f"] and tr.flows["id"].isna().all()
    assert tr.flows["ts_us"].isna().all()
    assert "2 integers in flow id beyond int64 or not integers, set to null" in tr.warnings


def test_times_beyond_2_63_us_are_excluded(tmp_path):
    """ts + dur overflowing float64 (or spans of such times) would put inf into the JSON summary."""
    events = [
        tg.kernel("ok", 10, 1, 1),
        tg.launch(5, 1, 1),
        tg.kernel("overflow_end", 1.7e308, 1.7e308, 2),
        tg.kernel("huge_ts", -1e300, 1, 3),
        tg.kernel("huge_dur", 20, 1e19, 4),
        tg.kernel("ns_clock", 1.7e18, 1, 5),  # nanoseconds written as µs: odd, but finite sums
    ]
    tr = load_trace(tg.write(tmp_path / "huge.json", tg.document(events)))
    assert tr.gpu["name"].tolist() == ["ok", "ns_clock"]
    assert "3 events with |ts| or dur beyond 2^63 µs excluded" in tr.warnings
    assert tr.gpu["end_us"].tolist() == [11.0, 1.7e18 + 1]


def test_utf8_byte_order_mark_is_skipped(tmp_path):
    raw = b"\xef\xbb\xbf" + json.dumps(tg.document([tg.kernel("k", 10, 1, 1), tg.launch(5, 1, 1)])).encode()
    for name in ("bom.json", "bom.json.gz"):  # write() gzips the .gz one
        tr = load_trace(tg.write(tmp_path / name, raw))
        assert tr.gpu["name"].tolist() == ["k"] and tr.warnings == []


def test_lean_load_keeps_the_same_values_of_fewer_columns(tmp_path):
    """lean=True (what the summary reads) gives the full load's frames minus the dropped columns, on a
    real trace and on odd forms (B/E pairs with args, lower-case "external id", dims msgspec refuses);
    the category column is categorize() of each row's name and kind."""
    from pathlib import Path

    from bubblescope.profiler.trace.categories import categorize

    dropped_gpu = ["external_id", "grid", "block", "shared_memory_bytes", "blocks_per_sm", "warps_per_sm",
                   "occupancy_pct"]
    be = {"cat": "kernel", "name": "be_kernel", "pid": 0, "tid": 7,
          "args": {"device": 0, "stream": 7, "correlation": 9, "grid": [2, 1, 1], "registers per thread": 40}}
    odd = [
        *tg.decode_trace_events(),
        {**be, "ph": "B", "ts": 300}, {**be, "ph": "E", "ts": 312.5},
        {**tg.launch(295, 1, 9), "args": {"correlation": 9, "external id": 77}},
        tg.kernel("nested_dims", 400, 1, 10, grid=[[1], 2], block="x"),
    ]
    paths = [tg.write(tmp_path / "odd.json", tg.document(odd))]
    real = Path(__file__).parent / "data" / "h200_reference_eager.json.gz"
    paths += [real] if real.is_file() else []
    for path in paths:
        full, lean = load_trace(path, flows=False), load_trace(path, flows=False, lean=True)
        assert lean.gpu.equals(full.gpu.drop(columns=dropped_gpu)), path
        assert lean.runtime.equals(full.runtime.drop(columns=["external_id"])), path
        assert lean.annotations.equals(full.annotations) and lean.warnings == full.warnings, path
        assert lean.event_count == full.event_count
        expected = [categorize(n, k) for n, k in zip(full.gpu["name"], full.gpu["kind"])]
        assert full.gpu["category"].tolist() == expected and len(expected) > 0
    assert full.gpu["registers_per_thread"].notna().any()  # a kept arg, read by both decoders
    be_row = load_trace(paths[0], lean=True).gpu.set_index("name").loc["be_kernel"]
    assert (be_row["ts_us"], be_row["dur_us"], be_row["correlation"], be_row["registers_per_thread"]) == (
        300.0, 12.5, 9, 40.0)


def test_old_torch_profiler_steps_and_events_without_args(tmp_path):
    """Old torch wrote ProfilerStep#N as a CPU op (cat cpu_op or Operator): those, and only those, become
    step annotations, whatever else shares the batch (repeated op names, a number or a list as name). A
    kernel with "args": null or no args takes device and stream from pid and tid, no correlation."""
    ops = [{"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 5, "args": {"External id": 1}}
           for cat, name, ts in [("cpu_op", "aten::mm", 1), ("cpu_op", "ProfilerStep#1", 2), ("cpu_op", "aten::mm", 3),
                                 ("Operator", "ProfilerStep#2", 4), ("cpu_op", 7, 5), ("cpu_op", ["ProfilerStep#9"], 6),
                                 ("python_function", "ProfilerStep#8", 7)]]
    bare = {"ph": "X", "cat": "kernel", "name": "no_args", "pid": 3, "tid": 21, "ts": 40, "dur": 2}
    events = [tg.kernel("k", 10, 1, 1), tg.launch(5, 1, 1), *ops, {**bare, "args": None}, {**bare, "ts": 50}]
    for unhashable in (True, False):  # a list as a name: the batch's names are then tested one by one
        evs = events if unhashable else [e for e in events if not isinstance(e["name"], list)]
        tr = load_trace(tg.write(tmp_path / f"old{unhashable}.json", tg.document(evs)))
        assert tr.annotations["name"].tolist() == ["ProfilerStep#1", "ProfilerStep#2"]
        assert tr.annotations["ts_us"].tolist() == [2.0, 4.0]
        gpu = tr.gpu.set_index("ts_us")
        assert gpu.loc[[40.0, 50.0], "device"].tolist() == [3, 3] and gpu.loc[[40.0, 50.0], "stream"].tolist() == [21, 21]
        assert gpu.loc[[40.0, 50.0], "correlation"].isna().all() and gpu.loc[10.0, "correlation"] == 1


@pytest.mark.parametrize("workers", ["0", "2"])
def test_an_event_excluded_for_its_ts_is_said_once_and_not_as_kept(tmp_path, monkeypatch, workers):
    """An integer ts 1.2e29 (beyond int64, so read as a float) was said both "kept, rounded" (beyond 2^53 µs) and
    "excluded" (beyond 2^63 µs); ts 1e400 (inf) "kept, rounded" and "without a finite ts excluded". Each event is
    now counted once: a float ts beyond 2^53 µs is "kept, rounded" only when the event is kept."""
    monkeypatch.setenv("BUBBLESCOPE_TRACE_WORKERS", workers)
    events = [tg.kernel("ok", 10, 1, 1), tg.launch(5, 1, 1),
              tg.kernel("int_huge", "INT_HUGE", 5, 2),       # 123456789012345678901234567890: excluded, beyond 2^63
              tg.kernel("inf", "INF_TS", 5, 3),              # 1e400 parses as inf: excluded, not finite
              tg.kernel("neg", 1.5e17, -1, 4),               # beyond 2^53 but excluded for its negative dur
              tg.kernel("kept", 1.5e17, 2, 5)]               # beyond 2^53 and kept: the one rounded event
    text = (json.dumps(tg.document(events)).replace('"INT_HUGE"', "123456789012345678901234567890")
            .replace('"INF_TS"', "1e400"))
    tr = load_trace(tg.write(tmp_path / "t.json", text))
    assert tr.gpu["name"].tolist() == ["ok", "kept"]
    assert [w for w in tr.warnings if "excluded" in w or "2^53" in w] == [
        "1 complete event without a finite numeric ts/dur excluded",
        "1 event with negative dur excluded",
        "1 event with |ts| or dur beyond 2^63 µs excluded",
        "1 event with a non-integer ts beyond 2^53 µs kept, its times rounded by float64 (off by over 1 µs)"]


def test_a_device_that_is_no_integer_is_shown_as_the_warning_says(tmp_path):
    """pid "x" (no args.device: args is a string) became device -1 while the warning said "args.device ... set to
    null"; tid {"a": 1} was blamed on args.stream."""
    text = ('{"traceEvents": [{"ph":"X","name":"k","cat":"kernel","ts":10,"dur":5,"pid":"x","tid":{"a":1},'
            '"args":"zz"}]}')
    tr = load_trace(tg.write(tmp_path / "w.json", text))
    assert tr.gpu["device"].tolist() == [-1] and tr.gpu["stream"].isna().tolist() == [True]
    assert "1 integer in args.device (or pid) beyond int64 or not an integer, set to -1 (device unknown)" in tr.warnings
    assert "1 integer in args.stream (or tid) beyond int64 or not an integer, set to null" in tr.warnings
