"""Host time per decode step by top-level CPU operator (``profiler/trace/hostops.py``) on hand-built traces: every
expected number is worked out by hand in the comments from the times the builders type in."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bubblescope.profiler.trace import summary as summary_module
from bubblescope.profiler.trace.cpuops import parsed_cpu_ops
from bubblescope.profiler.trace.hostops import host_bound, host_op_breakdown
from bubblescope.profiler.trace.load import read_trace_arrays
from bubblescope.profiler.trace.summary import summarize_traces

from . import tracegen as tg

PERIOD = 300.0  # µs from one token's first operator to the next one's


def host_loop_events(steps: int = 5, t0: float = 1000.0) -> list[dict]:
    """A host-bound eager decode loop without step markers; token i starts at T = t0 + i × 300 µs:

    - ``aten::embedding`` [T, T+20), launching ``embed`` (call T+5, 2 µs; kernel T+7, 2 µs);
    - ``aten::linear`` [T+30, T+60) with ``aten::addmm`` [T+32, T+58) inside it (nested: not top level),
      launching ``gemv`` (call T+35; kernel T+37, 3 µs); again [T+70, T+100) (call T+75; kernel T+77, 3 µs);
    - ``aten::argmax`` [T+110, T+120) launching ``argmax`` (call T+112; kernel T+114, 2 µs);
    - ``aten::item`` [T+125, T+140), no launch; then Python (sampling) until the next token's T + 300.

    The steps are found from the launches: the longest host gap is before ``embed``'s call, so step k runs
    from T_k + 5 to T_{k+1} + 5 (300 µs), and the last one to its last kernel's end, T + 116 (111 µs). The GPU
    is busy 10 µs of each token: bubble ratio far above 0.5, all of it waiting for the host's next launch.
    """
    ev, corr = tg.meta_events(), 1
    for i in range(steps):
        t = t0 + i * PERIOD
        ev.append(tg.cpu_op("aten::embedding", t, 20))
        ev += [tg.launch(t + 5, 2, corr), tg.kernel("embed", t + 7, 2, corr)]
        for start in (30, 70):
            ev += [tg.cpu_op("aten::linear", t + start, 30), tg.cpu_op("aten::addmm", t + start + 2, 26),
                   tg.launch(t + start + 5, 2, corr + 1), tg.kernel("gemv", t + start + 7, 3, corr + 1)]
            corr += 1
        ev += [tg.cpu_op("aten::argmax", t + 110, 10), tg.launch(t + 112, 2, corr + 1),
               tg.kernel("argmax", t + 114, 2, corr + 1), tg.cpu_op("aten::item", t + 125, 15)]
        corr += 2
    return ev


def _summary(tmp_path, events, name="t.json", **kw):
    return summarize_traces([tg.write(tmp_path / name, tg.document(events, rank=None))], **kw)["files"][0]


def _ops(tmp_path, events):
    return parsed_cpu_ops(read_trace_arrays(tg.write(tmp_path / "ops.json", tg.document(events, rank=None))))


def _rows(host_ops):
    return {r["name"]: r for r in host_ops["rows"]}


# ---- a host-bound loop without markers -------------------------------------------------------------------------
def test_a_host_bound_markerless_loop_gets_its_host_time_by_operator(tmp_path):
    f = _summary(tmp_path, host_loop_events(5))
    assert f["step_detection"]["method"] == "sequence" and f["steps"]["steps"] == 5
    h = f["host_ops"]
    assert h["thread"] == {"pid": tg.CPU_PID, "tid": tg.CPU_TID} and h["steps"] == 5 and h["reason"] is None
    # walls: 4 steps of 300 µs and the last of 111 µs (T+5 to its argmax kernel's end, T+116)
    wall = (4 * 300 + 111) / 5
    assert h["mean_step_wall_us"] == pytest.approx(wall)
    # By start: step k holds its own linears (2 × 30 µs), argmax (10) and item (15), and the next token's embedding
    # (20), which starts 5 µs before the step's end; token 0's embedding starts before the first step. The last
    # step ends at T+116: no item (T+125) and no next embedding; its argmax (T+110) starts inside it.
    expected = {  # name: (calls per step, µs per step)
        "aten::linear": (10 / 5, 10 * 30 / 5),
        "aten::embedding": (4 / 5, 4 * 20 / 5),
        "aten::item": (4 / 5, 4 * 15 / 5),
        "aten::argmax": (5 / 5, 5 * 10 / 5),
    }
    # covered by operators, clipped to the step: steps 0-3 [T+5, T+305): embedding 15 + linears 60 + argmax 10 +
    # item 15 + the next embedding's first 5 = 105, outside 195; step 4 [T+5, T+116): 15 + 60 + argmax's 6 = 81,
    # outside 30
    outside = (4 * (300 - 105) + (111 - 81)) / 5
    assert [r["name"] for r in h["rows"]] == list(expected) + ["outside operators"]  # by time; no "other" row
    rows = _rows(h)
    for name, (calls, host_us) in expected.items():
        assert rows[name]["kind"] == "operator"
        assert rows[name]["calls_per_step"] == pytest.approx(calls)
        assert rows[name]["host_us_per_step"] == pytest.approx(host_us)
        assert rows[name]["share"] == pytest.approx(host_us / wall)
    assert "aten::addmm" not in rows  # inside aten::linear
    out = rows["outside operators"]
    assert out["kind"] == "outside" and out["calls_per_step"] is None
    assert out["host_us_per_step"] == pytest.approx(outside) and out["share"] == pytest.approx(outside / wall)


def test_operators_past_the_top_n_are_summed_in_one_row(tmp_path):
    ops = _ops(tmp_path, host_loop_events(5))
    starts = 1000.0 + np.arange(5) * PERIOD + 5
    ends = np.append(starts[1:], starts[-1] + 111)
    h = host_op_breakdown(ops, starts, ends, n=2)
    wall = (4 * 300 + 111) / 5
    assert [r["name"] for r in h["rows"]] == ["aten::linear", "aten::embedding", "other operators",
                                              "outside operators"]
    other = h["rows"][2]
    # aten::item (4 calls of 15 µs) and aten::argmax (5 of 10 µs) over 5 steps
    assert other["kind"] == "other" and other["calls_per_step"] == pytest.approx(9 / 5)
    assert other["host_us_per_step"] == pytest.approx((60 + 50) / 5)
    assert other["share"] == pytest.approx(22 / wall)


def test_skip_steps_leaves_the_warm_up_steps_out(tmp_path):
    f = _summary(tmp_path, host_loop_events(5), skip_steps=2)
    h = f["host_ops"]
    # steps 2, 3 (300 µs, 105 µs covered) and 4 (111 µs, 81 covered)
    wall = (2 * 300 + 111) / 3
    assert h["steps"] == 3 and h["mean_step_wall_us"] == pytest.approx(wall)
    rows = _rows(h)
    assert rows["aten::embedding"]["calls_per_step"] == pytest.approx(2 / 3)
    assert rows["aten::linear"]["host_us_per_step"] == pytest.approx(60.0)
    assert rows["outside operators"]["host_us_per_step"] == pytest.approx((2 * 195 + 30) / 3)


# ---- a marked loop ---------------------------------------------------------------------------------------------
def marked_loop_events(steps: int = 4, t0: float = 0.0, marker: str = "ProfilerStep") -> list[dict]:
    """``steps`` marked steps of 500 µs (``ProfilerStep#i`` [S, S+500)), S = t0 + i × 500. Inside each:
    ``aten::linear`` [S+10, S+110) launching ``gemv`` (call S+20, kernel S+22, 5 µs), ``aten::copy_``
    [S+150, S+175) launching ``copy`` (call S+160, kernel S+162, 2 µs) and ``aten::linear`` again [S+200, S+300)
    (call S+210, kernel S+212, 5 µs). Top-level operators cover 225 µs of each step; the GPU is busy 12."""
    ev, corr = tg.meta_events(), 1
    for i in range(steps):
        s = t0 + i * 500
        ev.append(tg.annotation(f"{marker}#{i}", s, 500))
        for start, name, kernel, dur in ((10, "aten::linear", "gemv", 100), (150, "aten::copy_", "copy", 25),
                                         (200, "aten::linear", "gemv", 100)):
            ev += [tg.cpu_op(name, s + start, dur), tg.launch(s + start + 10, 2, corr),
                   tg.kernel(kernel, s + start + 12, 5 if kernel == "gemv" else 2, corr)]
            corr += 1
    return ev


def test_a_profiler_step_marked_loop(tmp_path):
    f = _summary(tmp_path, marked_loop_events(4))
    assert f["step_marker"] == "ProfilerStep"
    h = f["host_ops"]
    assert h["steps"] == 4 and h["mean_step_wall_us"] == 500.0
    assert [(r["name"], r["calls_per_step"], r["host_us_per_step"], r["share"]) for r in h["rows"]] == [
        ("aten::linear", 2.0, 200.0, 0.4),
        ("aten::copy_", 1.0, 25.0, 0.05),
        ("outside operators", None, 275.0, 0.55),  # 500 - 225
    ]


def test_absolute_kineto_times_are_moved_onto_the_steps_time(tmp_path):
    # µs since the epoch with ns digits, as older Kineto writes them: the parser subtracts an origin from its
    # columns, the operators (kept in the file's time) must be moved by the same
    t0 = 1_733_456_789_012_345.5
    f = _summary(tmp_path, marked_loop_events(4, t0=t0))
    rows = _rows(f["host_ops"])
    assert rows["aten::linear"]["calls_per_step"] == 2.0 and rows["aten::copy_"]["calls_per_step"] == 1.0
    # float64 holds these times to 0.25 µs
    assert rows["aten::linear"]["host_us_per_step"] == pytest.approx(200.0, abs=1.0)
    assert rows["outside operators"]["host_us_per_step"] == pytest.approx(275.0, abs=1.0)


# ---- when it is not computed, or cannot be -----------------------------------------------------------------------
def test_a_gpu_bound_trace_does_not_pick_its_operators(tmp_path, monkeypatch):
    def refuse(arrays):
        raise AssertionError("the top-level CPU operators were picked for a GPU-bound trace")

    monkeypatch.setattr(summary_module, "parsed_cpu_ops", refuse)
    # each step: 3 kernels of 100 µs, each launched (2 µs) when the previous one ends, 5 µs of sampling: the GPU
    # idles 11 of 317 µs (bubble ratio 0.035)
    events, _ = tg.decode_loop_events(6, ["a", "b", "c"], kernel_us=100.0, step_gap_us=5.0)
    f = _summary(tmp_path, events)
    assert f["steps"]["available"] and f["steps"]["bubble_ratio"] < 0.5
    assert f["host_ops"] is None


def test_a_trace_without_cpu_operator_events_says_so(tmp_path):
    # 3 kernels of 10 µs per step, each after a 2-µs launch, 50 µs of sampling: host-bound (bubble ratio 0.65)
    events, _ = tg.decode_loop_events(6, ["a", "b", "c"])
    f = _summary(tmp_path, events)
    assert host_bound(f["steps"])
    h = f["host_ops"]
    assert h["rows"] is None and h["thread"] is None and h["steps"] == 6
    assert h["reason"].startswith("no top-level CPU operators in the trace")


def test_no_steps_or_no_operators_in_them_give_no_numbers(tmp_path):
    ops = _ops(tmp_path, host_loop_events(3))
    h = host_op_breakdown(ops, [], [])
    assert h["rows"] is None and h["steps"] == 0 and h["mean_step_wall_us"] is None
    assert h["reason"] == "no decode steps to divide the host's time by"
    h = host_op_breakdown(None, [0.0], [10.0])
    assert h["rows"] is None and h["reason"].startswith("no top-level CPU operators")
    h = host_op_breakdown(ops, [50_000.0], [60_000.0])  # long after the loop
    assert h["rows"] is None and h["thread"] == {"pid": 1, "tid": 1}
    assert h["reason"] == "none of the 15 top-level CPU operators of thread 1/1 starts inside one of the 1 decode steps"
    with pytest.raises(ValueError):
        host_op_breakdown(ops, [0.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        host_op_breakdown(ops, [0.0], [1.0], n=0)


def test_host_bound_needs_a_high_bubble_ratio_and_host_wait_first():
    def steps(bubble, host, kernel, other=0.0, available=True):
        return {"available": available, "bubble_ratio": bubble,
                "idle": {"host_wait_us": host, "kernel_wait_us": kernel, "other_us": other}}

    assert host_bound(steps(0.5, 10.0, 10.0))  # the threshold, and a tie, count
    assert not host_bound(steps(0.49, 10.0, 1.0))
    assert not host_bound(steps(0.9, 10.0, 11.0))  # kernel boundaries, not the host
    assert not host_bound(steps(0.9, 10.0, 1.0, other=20.0))
    assert not host_bound(steps(0.9, None, 1.0)) and not host_bound(steps(None, 10.0, 1.0))
    assert not host_bound(steps(0.9, 10.0, 1.0, available=False)) and not host_bound(None)


# ---- the reports -------------------------------------------------------------------------------------------------
def test_terminal_html_and_result_document_show_the_table(tmp_path):
    from rich.console import Console

    from bubblescope.reports.trace_html import render_trace_html
    from bubblescope.reports.trace_result import trace_result, validate_trace_result
    from bubblescope.reports.trace_terminal import render_trace_summary

    summary = summarize_traces([tg.write(tmp_path / "m.json", tg.document(marked_loop_events(4), rank=None))])
    console = Console(record=True, width=100, color_system=None)
    render_trace_summary(summary, console)
    text = console.export_text()
    joined = " ".join(text.split())  # the title folds over two lines above a narrow table
    title = "Host time per decode step (top-level CPU operators, thread 1/1)"
    assert joined.index("Kernel categories in the decode steps") < joined.index(title)
    lines = [" ".join(line.replace("│", " ").split()) for line in text.splitlines()]
    for row in ("aten::linear 2 200.0 µs 40.0 %", "aten::copy_ 1 25.0 µs 5.0 %",
                "outside operators — 275.0 µs 55.0 %"):
        assert row in lines
    assert "Means over 4 measured steps; share: of the mean step wall time, 500.0 µs." in joined
    html = render_trace_html(summary, [])
    assert title in html and "<td>aten::copy_</td>" in html and "275.0 µs" in html
    doc = trace_result(summary, [])
    assert doc["files"][0]["host_ops"] == summary["files"][0]["host_ops"] and not validate_trace_result(doc)
    json.dumps(doc, allow_nan=False)


def test_terminal_says_why_there_is_no_table(tmp_path):
    from rich.console import Console

    from bubblescope.reports.trace_terminal import render_trace_summary

    events, _ = tg.decode_loop_events(6, ["a", "b", "c"])
    summary = summarize_traces([tg.write(tmp_path / "t.json", tg.document(events, rank=None))])
    console = Console(record=True, width=100, color_system=None)
    render_trace_summary(summary, console)
    assert ("Host time per decode step (top-level CPU operators): unavailable (no top-level CPU operators in "
            "the trace") in " ".join(console.export_text().split())
