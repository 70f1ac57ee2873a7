"""The top-level CPU operators of the busiest thread (``profiler/trace/cpuops.py``) picked from what the parse
keeps, in every form of the file, against times typed in by hand and an independent reading of the file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bubblescope.profiler.trace.cpuops import parsed_cpu_ops
from bubblescope.profiler.trace.load import read_trace_arrays

from . import tracegen as tg
from .cpuops_reference import reference_cpu_ops


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


@pytest.mark.parametrize("form", ["object", "indented", "array", "gzip", "events first"])
def test_the_top_level_operators_of_the_busiest_thread(tmp_path, form):
    events = loop_events(6)
    doc = tg.document(events, rank=None)
    text = {"object": json.dumps(doc), "indented": json.dumps(doc, indent=2), "array": json.dumps(events),
            "gzip": json.dumps(doc),
            "events first": json.dumps({"traceEvents": events, **{k: v for k, v in doc.items() if k != "traceEvents"}}),
            }[form]
    path = tg.write(tmp_path / ("t.json.gz" if form == "gzip" else "t.json"), text)
    ops = parsed_cpu_ops(read_trace_arrays(path))
    assert ops["name"].tolist() == ["aten::linear", "aten::argmax", "aten::item"] * 6  # no addmm, no zeros
    assert set(ops["pid"].tolist()) == {1} and set(ops["tid"].tolist()) == {1}
    s = np.repeat(np.arange(6) * 100.0, 3)
    assert ops["ts_us"].tolist() == (s + np.tile([0, 40, 60], 6)).tolist()
    assert ops["end_us"].tolist() == (s + np.tile([30, 50, 75], 6)).tolist()
    want = reference_cpu_ops(path)
    assert _same(ops, want) and all(ops[k].dtype == want[k].dtype for k in ops)


def test_a_trace_without_operators_has_none(tmp_path):
    no_ops = [e for e in loop_events(3) if e.get("cat") != "cpu_op"]
    assert parsed_cpu_ops(read_trace_arrays(tg.write(tmp_path / "none.json", tg.document(no_ops, rank=None)))) is None
