"""The top-level CPU operators read again from a trace file (``profiler/trace/cpuops.py``), a piece of its text at
a time: the same operators as from one piece, whatever the file's form and wherever the pieces are cut."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from bubblescope.profiler.trace import cpuops

from . import tracegen as tg


def loop_events(steps: int = 6) -> list[dict]:
    """Per step (start S = i × 100 µs) on thread 1/1: ``aten::linear`` [S, S+30) with ``aten::addmm`` [S+2, S+28)
    inside it, its launch (S+5) and kernel, ``aten::argmax`` [S+40, S+50), ``aten::item`` [S+60, S+75): three
    top-level operators per step. One ``aten::zeros`` on thread 1/2, which has fewer."""
    ev = tg.meta_events()
    for i in range(steps):
        s = i * 100.0
        ev += [tg.cpu_op("aten::linear", s, 30), tg.cpu_op("aten::addmm", s + 2, 26), tg.launch(s + 5, 2, i + 1),
               tg.kernel("gemv", s + 7, 3, i + 1), tg.cpu_op("aten::argmax", s + 40, 10),
               tg.cpu_op("aten::item", s + 60, 15)]
    return ev + [tg.cpu_op("aten::zeros", 50.0, 4.0, tid=2)]


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_the_top_level_operators_of_the_busiest_thread(tmp_path):
    ops = cpuops.read_cpu_ops(tg.write(tmp_path / "t.json", tg.document(loop_events(6), rank=None)))
    assert ops["name"].tolist() == ["aten::linear", "aten::argmax", "aten::item"] * 6  # no addmm, no zeros
    assert set(ops["pid"].tolist()) == {1} and set(ops["tid"].tolist()) == {1}
    s = np.repeat(np.arange(6) * 100.0, 3)
    assert ops["ts_us"].tolist() == (s + np.tile([0, 40, 60], 6)).tolist()
    assert ops["end_us"].tolist() == (s + np.tile([30, 50, 75], 6)).tolist()


@pytest.mark.parametrize("form", ["object", "indented", "array", "gzip", "events first"])
def test_reading_in_pieces_gives_what_one_piece_gives(tmp_path, monkeypatch, form):
    events = loop_events(6)
    doc = tg.document(events, rank=None)
    text = {"object": json.dumps(doc), "indented": json.dumps(doc, indent=2), "array": json.dumps(events),
            "gzip": json.dumps(doc),
            "events first": json.dumps({"traceEvents": events, **{k: v for k, v in doc.items() if k != "traceEvents"}}),
            }[form]
    path = tg.write(tmp_path / ("t.json.gz" if form == "gzip" else "t.json"), text)
    whole = cpuops.read_cpu_ops(path)
    assert len(whole["name"]) == 6 * 3

    def no_fallback(*args):
        raise AssertionError("a well-formed file was decoded whole")

    monkeypatch.setattr(cpuops, "_whole", no_fallback)
    for piece in (64, 300, 4096):  # cut after nearly every event, after a few, not at all
        monkeypatch.setattr(cpuops, "PIECE_BYTES", piece)
        assert _same(cpuops.read_cpu_ops(path), whole), (form, piece)


def test_a_name_that_looks_like_an_event_boundary_falls_back_to_one_piece(tmp_path, monkeypatch):
    events = loop_events(3)
    for e in events:
        if e.get("name") == "aten::item":
            e["name"] = 'aten::item}, {"ph": "X"'  # a cut after its "}" leaves an unclosed string: not decodable
    path = tg.write(tmp_path / "t.json", tg.document(events, rank=None))
    whole = cpuops.read_cpu_ops(path)
    monkeypatch.setattr(cpuops, "PIECE_BYTES", 128)
    fell_back = []
    whole_file = cpuops._whole
    monkeypatch.setattr(cpuops, "_whole", lambda *a: fell_back.append(1) or whole_file(*a))
    part = cpuops.read_cpu_ops(path)
    assert fell_back
    assert _same(part, whole) and part["name"].tolist().count('aten::item}, {"ph": "X"') == 3


def test_an_unreadable_truncated_or_operator_free_file_gives_none(tmp_path, monkeypatch):
    monkeypatch.setattr(cpuops, "PIECE_BYTES", 256)
    text = json.dumps(tg.document(loop_events(3), rank=None))
    assert cpuops.read_cpu_ops(tg.write(tmp_path / "cut.json", text[: len(text) // 2])) is None
    assert cpuops.read_cpu_ops(tmp_path / "missing.json") is None
    (tmp_path / "cut.json.gz").write_bytes(gzip.compress(text.encode())[:-20])
    assert cpuops.read_cpu_ops(tmp_path / "cut.json.gz") is None
    corrupt = bytearray(gzip.compress(text.encode()))
    corrupt[40:60] = b"\xff" * 20
    (tmp_path / "corrupt.json.gz").write_bytes(bytes(corrupt))
    assert cpuops.read_cpu_ops(tmp_path / "corrupt.json.gz") is None
    no_ops = [e for e in loop_events(3) if e.get("cat") != "cpu_op"]
    assert cpuops.read_cpu_ops(tg.write(tmp_path / "none.json", tg.document(no_ops, rank=None))) is None
