"""``bubblescope profile``'s parts that need no program run: the step window, the profiler's cost, the counting
hooks, the report's profile section and the command line it accepts."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from bubblescope.errors import BubblescopeError
from bubblescope.profile_command import parse_program
from bubblescope.profile_program import exit_status, profile_section, relocated, with_unprofiled
from bubblescope.reports.profile_report import not_reached_message, outcome_lines
from bubblescope.profile_runner import Recorder, StepWindow, install

MS = 1_000_000  # ns


def _feed(window: StepWindow, times_ms: list[float]) -> list[str | None]:
    """Step k begins at times_ms[k]; the profiler's start and stop take no time."""
    actions = []
    for k, t in enumerate(times_ms):
        now = int(t * MS)
        action = window.boundary(k, now)
        actions.append(action)
        if action == "start":
            window.started(now)
        elif action == "stop":
            window.stopping(now)
            window.stopped()
    return actions


def test_window_skips_then_warms_up_then_records_steps_then_times_as_many_without_the_profiler():
    w = StepWindow(skip=2, steps=3)
    # steps begin every 10 ms; step 2 is the profiler's warm-up, steps 3-5 the window; step 6, which stops the
    # profiler and writes the trace, is not timed; steps 7-9 are the reference
    actions = _feed(w, [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110])
    assert actions[:7] == [None, None, "start", None, None, None, "stop"]
    assert w.first_step == 2 and w.window_steps() == 3
    assert w.window_ns == [30 * MS, 40 * MS, 50 * MS, 60 * MS]
    assert w.reference_ns == [70 * MS, 80 * MS, 90 * MS, 100 * MS]  # 3 steps, then done
    assert w.phase == "done"
    assert w.before_ns == [0, 10 * MS, 20 * MS]  # the skipped steps 0 and 1, ended by the profiler's start


def test_window_of_seconds_ends_at_the_first_step_after_it():
    w = StepWindow(skip=0, seconds=0.025)
    actions = _feed(w, [0, 10, 20, 30, 40, 50])
    assert actions == ["start", None, None, None, "stop", None]  # 40 ms: the first start 25 ms or more after 10
    assert w.window_steps() == 3 and w.window_ns == [10 * MS, 20 * MS, 30 * MS, 40 * MS]


def test_a_program_ending_in_the_warm_up_step_has_an_empty_window():
    w = StepWindow(skip=1, steps=3)
    _feed(w, [0, 10])
    w.stopping(15 * MS)
    assert w.window_steps() == 0 and w.window_ns == []


def test_window_needs_steps_or_seconds():
    with pytest.raises(ValueError):
        StepWindow(skip=0)
    with pytest.raises(ValueError):
        StepWindow(skip=0, steps=2, seconds=1.0)


class _Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x)


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(_Layer(), _Layer())

    def forward(self, x):
        return self.layers(x)


class _Sampler(torch.nn.Module):
    def forward(self, logits):
        return logits.argmax(-1)


def _recorder(tmp_path, skip=100, steps=1) -> Recorder:
    return Recorder({"skip": skip, "steps": steps, "seconds": None, "trace": str(tmp_path / "t.json"),
                     "state": str(tmp_path / "state.json")})


def test_hooks_count_outermost_calls_once_per_step_whatever_is_nested(tmp_path):
    rec = _recorder(tmp_path)
    restore = install(rec)
    try:
        model, sampler, x = _Model(), _Sampler(), torch.zeros(1, 4)
        for _ in range(5):  # a model and a sampler module per token, each with nested modules
            sampler(model(x))
        model(x)  # a sixth model call alone
    finally:
        restore()
    assert rec.counts == {"module _Model": 6, "module _Sampler": 5}
    assert rec.steps == 6 and rec.depth == 0
    assert torch.nn.Module.__call__ is torch.nn.Module._wrapped_call_impl  # put back


def test_hooks_count_a_compiled_function_and_not_what_it_calls(tmp_path):
    rec = _recorder(tmp_path)
    restore = install(rec)
    try:
        model, x = _Model(), torch.zeros(1, 4)

        def decode_one_token(x):  # gpt-fast compiles a function that calls the model
            return model(x) * 2

        step = torch.compile(decode_one_token, backend="eager", fullgraph=True)
        for _ in range(4):
            step(x)
    finally:
        restore()
        torch._dynamo.reset()
    assert rec.counts == {"compiled test_hooks_count_a_compiled_function_and_not_what_it_calls.<locals>."
                          "decode_one_token": 4}
    assert torch.compile.__module__.startswith("torch")  # put back


def test_a_call_that_raises_leaves_no_call_open(tmp_path):
    rec = _recorder(tmp_path)
    restore = install(rec)
    try:
        with pytest.raises(RuntimeError):
            _Model()(torch.zeros(1, 3))  # wrong width
        _Sampler()(torch.zeros(1, 4))
    finally:
        restore()
    assert rec.depth == 0 and rec.counts == {"module _Model": 1, "module _Sampler": 1}


def _state(**kw) -> dict:
    base = {"status": "exited", "steps_counted": 40, "calls": {"module M": 40}, "skip": 3, "steps": 4,
            # profiled steps 2, 2, 6, 2 ms (median 2); unprofiled 1, 1, 1, 5 ms (median 1, mean 2): medians compared
            "seconds": None, "first_step": 3, "window_ns": [0, 2 * MS, 4 * MS, 10 * MS, 12 * MS],
            "reference_ns": [20 * MS, 21 * MS, 22 * MS, 23 * MS, 28 * MS], "closed_by": "length",
            "trace": "/x/window.trace.json", "error": None}
    return {**base, **kw}


def _program():
    return parse_program([sys.executable, __file__, "8"])


def test_profile_section_from_the_runner_state():
    summary_file = {"path": "p", "step_marker": None, "steps": {"steps": 5},
                    "step_detection": {"steps": 6, "description": "steps: 6, from a repeating 7-op sequence"},
                    "bandwidth": {"peak_GBps": 4.0, "summary": {"bytes_per_step": 2_000_000}}}
    s = profile_section(_state(), 0, _program(), summary_file)
    assert s["status"] == "complete" and s["tokens_generated"] == 4 and s["steps_found"] == 5
    assert s["first_step"] == 4 and s["step_source"] == "steps: 6, from a repeating 7-op sequence"
    # 2 MB in the unprofiled median step of 1 ms: 2 GB/s, half of a 4 GB/s peak
    assert s["effective_GBps_unprofiled"] == 2.0 and s["util_peak_unprofiled"] == 0.5
    assert "without the profiler: 2.0 GB/s, 50.0% of peak" in " ".join(outcome_lines(s, "x.py"))
    assert s["step_ms_p50_profiled"] == 2.0 and s["step_ms_p50_unprofiled"] == 1.0
    assert s["profiler_overhead_pct"] == 100.0 and s["reference_steps"] == 4
    assert s["command"] == [__file__, "8"] and s["interpreter"] == sys.executable
    cut = profile_section(_state(closed_by="program-end", window_ns=[0, MS, 3 * MS], reference_ns=[]), 1,
                          _program(), None)
    assert cut["status"] == "cut" and cut["tokens_generated"] == 2 and cut["profiler_overhead_pct"] is None
    assert cut["overhead_reason"].startswith("no step ran without the profiler") and cut["reference_from"] is None
    assert any("ended inside the window (2 steps of 4 steps recorded, from step 4)" in line
               for line in outcome_lines(cut, "tiny.py"))
    never = profile_section(_state(trace=None, first_step=None, window_ns=[], reference_ns=[], steps_counted=2),
                            0, _program(), None)
    assert never["status"] == "not-reached"
    assert not_reached_message(never, {}, "tiny.py") == ("COMMAND tiny.py: ended after 2 steps, before the window "
                                                         "(it starts after --skip 3); nothing recorded: lower --skip")
    killed = {**_state(trace=None, window_ns=[0, MS]), "status": "window"}
    assert not_reached_message(profile_section(killed, 137, _program(), None), killed, "x.py") == (
        "COMMAND x.py: ended inside the window without exiting normally (os._exit or a signal, exit status 137): "
        "the profiler's trace was never written")
    none = profile_section(_state(trace=None, first_step=None, steps_counted=0), 0, _program(), None)
    assert "made no step profile can count" in not_reached_message(none, {}, "tiny.py")


def test_relocated_names_the_published_trace_and_exit_status_of_a_signal():
    summary = {"files": [{"path": "/s/t.gz", "x": 1}], "findings": [{"file": "/s/t.gz"}, {"file": None}]}
    moved = relocated(summary, "/s/t.gz", "/out/t.gz")
    assert moved["files"] == [{"path": "/out/t.gz", "x": 1}]
    assert moved["findings"] == [{"file": "/out/t.gz"}, {"file": None}]
    assert summary["files"][0]["path"] == "/s/t.gz"  # the input is left as it was
    assert exit_status(-9) == 137 and exit_status(3) == 3


def test_commands_profile_accepts(tmp_path, monkeypatch):
    script = tmp_path / "gen.py"
    script.write_text("print(1)\n")
    p = parse_program([sys.executable, "-u", str(script), "--tokens", "8"])
    assert p.interpreter == os.path.abspath(sys.executable) and p.flags == ("-u",)
    assert p.target == (str(script), "--tokens", "8") and p.label == str(script)
    m = parse_program([sys.executable, "-X", "dev", "-m", "pkg.gen", "-n", "3"])
    assert m.flags == ("-X", "dev") and m.target == ("-m", "pkg.gen", "-n", "3") and m.label == "-m pkg.gen"
    bare = parse_program([str(script), "a"])
    assert bare.interpreter == sys.executable and bare.target == (str(script), "a")
    shebang = tmp_path / "gen"
    shebang.write_text("#!/usr/bin/env python3\nprint(1)\n")
    assert parse_program([str(shebang)]).target == (str(shebang),)
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    assert parse_program([Path(sys.executable).name, str(script)]).interpreter == os.path.abspath(sys.executable)


@pytest.mark.parametrize("words, message", [
    ([], "COMMAND: missing; give the program after `--`"),
    (["ls", "-l"], "COMMAND ls: not a Python program; profile runs"),
    (["no-such-tool-xyz"], "COMMAND no-such-tool-xyz: not found (and not a Python program)"),
    (["nosuch.py"], "COMMAND nosuch.py: no such file"),
    (["python3.99"], "COMMAND python3.99: not found on PATH"),
    ([sys.executable], "no script or -m MODULE given"),
    ([sys.executable, "-m"], "-m: no module name given"),
    ([sys.executable, "-c", "print(1)"], "-c: a program given as text cannot be profiled"),
    ([sys.executable, "--version"], "--version: an interpreter option profile does not pass on"),
    ([sys.executable, "missing.py"], "COMMAND missing.py: no such file"),
])
def test_commands_profile_refuses(words, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BubblescopeError) as e:
        parse_program(words)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_directory_and_a_file_that_is_not_python_are_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("hello\n")
    with pytest.raises(BubblescopeError, match="notes.txt: not a Python program"):
        parse_program([str(tmp_path / "notes.txt")])
    with pytest.raises(BubblescopeError, match="is a directory"):
        parse_program([sys.executable, str(tmp_path)])


def test_graph_replays_count_as_steps_only_when_outermost(tmp_path, monkeypatch):
    # a stand-in for the replay of a captured graph (none can be captured without a GPU), put in before the hooks
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda self: None)
    rec = _recorder(tmp_path)
    restore = install(rec)
    try:
        graph = object.__new__(torch.cuda.CUDAGraph)
        for _ in range(3):  # a loop replaying its captured step: one step per replay
            torch.cuda.CUDAGraph.replay(graph)

        class Replayer(torch.nn.Module):  # cudagraph trees replay inside the compiled module's call
            def forward(self):
                torch.cuda.CUDAGraph.replay(graph)

        Replayer()()
    finally:
        restore()
    assert rec.counts == {"CUDAGraph.replay": 3, "module test_graph_replays_count_as_steps_only_when_outermost."
                                                "<locals>.Replayer": 1}
    assert rec.steps == 3 and rec.graph_replays == 4


def test_the_unprofiled_baseline_is_the_skipped_steps_before_the_window_without_the_first_two():
    # skipped steps: prefill 50 ms, first decode 9 ms, then 1, 1, 3, 1 ms; profiled window 2, 2, 6, 2 ms (median
    # 2); after the window 1.5 ms each (the profiler's cost lasted): the baseline is the last four skipped steps
    # (as many as the window's), median 1 ms, not the 1.5 ms after it
    before = [0, 50 * MS, 59 * MS, 60 * MS, 61 * MS, 64 * MS, 65 * MS]
    after = [20 * MS + int(1.5 * MS) * i for i in range(5)]
    s = profile_section(_state(before_ns=before, reference_ns=after), 0, _program(), None)
    assert s["reference_from"] == "before" and s["reference_steps"] == 4 and s["step_ms_p50_unprofiled"] == 1.0
    assert s["profiler_overhead_pct"] == 100.0 and s["step_ms_p50_after"] == 1.5
    lines = outcome_lines(s, "x.py")
    assert "over 4 steps before the window without it" in " ".join(lines)
    moved = [line for line in lines if line.startswith("the steps without the profiler changed over the run")]
    # against the 1.5 ms after the window the profiled 2 ms median is +33.3 %
    assert moved and ("1.000 ms (median) before the window, 1.500 ms after it (+50.0%)" in moved[0]
                      and moved[0].endswith("against the steps after it the profiler costs +33.3 %"))
    # faster after the window (a warm-up still going on before it) is said too
    faster = profile_section(_state(before_ns=before, reference_ns=[20 * MS + int(0.8 * MS) * i for i in range(5)]),
                             0, _program(), None)
    assert any("0.800 ms after it (-20.0%)" in line for line in outcome_lines(faster, "x.py"))
    # steps after the window within 10 % of the baseline: nothing said
    same = profile_section(_state(before_ns=before, reference_ns=[20 * MS + int(1.05 * MS) * i for i in range(5)]),
                           0, _program(), None)
    assert not any(line.startswith("the steps without the profiler changed") for line in outcome_lines(same, "x.py"))
    # a skip too short to leave a clean step: the steps after the window are the baseline, and said to be
    short = profile_section(_state(before_ns=[0, 50 * MS, 59 * MS], reference_ns=after), 0, _program(), None)
    assert short["reference_from"] == "after" and short["step_ms_p50_unprofiled"] == 1.5
    assert "after the window without it" in " ".join(outcome_lines(short, "x.py"))


def test_the_bandwidth_verdict_also_states_the_steps_without_the_profiler():
    from bubblescope.reports.trace_tables import bandwidth_rows

    # 2 MB a step, a 4 GB/s peak: floor 500 µs; the trace's median step 2 ms (4×), the unprofiled one 1 ms (2×,
    # 2 GB/s, half of the peak)
    bw = {"peak_GBps": 4.0, "verdict": "2.000 ms per step, 4.00× the floor of 0.500 ms",
          "summary": {"bytes_per_step": 2_000_000, "floor_us": 500.0, "step_us_p50": 2000.0, "effective_GBps": 1.0,
                      "util_peak": 0.25, "over_floor_us": 1500.0, "over_floor_x": 4.0}}
    summary = {"files": [{"path": "p", "bandwidth": bw}], "findings": []}
    section = profile_section(_state(), 0, _program(), {"bandwidth": bw})
    out = with_unprofiled(summary, section)
    got = out["files"][0]["bandwidth"]
    assert got["summary"]["step_us_p50_unprofiled"] == 1000.0 and got["summary"]["over_floor_x_unprofiled"] == 2.0
    assert got["summary"]["util_peak_unprofiled"] == 0.5 and got["summary"]["step_us_p50"] == 2000.0
    assert got["verdict"] == ("2.000 ms per step, 4.00× the floor of 0.500 ms; without the profiler 1.000 ms per "
                              "step (4 steps after the window), 2.00× the floor: 50% of peak")
    rows = dict(bandwidth_rows(got))
    assert rows["step time without the profiler"] == "1.00 ms"
    assert rows["effective bandwidth without it"] == "2.0 GB/s, 50.0 % of peak, 2.00× the floor"
    assert summary["files"][0]["bandwidth"] is bw and "step_us_p50_unprofiled" not in bw["summary"]  # pure
    # no floor (peak unknown), or no unprofiled step: nothing added, and the table has no such row
    no_floor = {"files": [{"path": "p", "bandwidth": {**bw, "summary": {**bw["summary"], "floor_us": None}}}]}
    assert with_unprofiled(no_floor, section) == no_floor
    bare = profile_section(_state(reference_ns=[]), 0, _program(), {"bandwidth": bw})
    assert with_unprofiled(summary, bare) == summary
    assert "step time without the profiler" not in dict(bandwidth_rows(bw))


def test_a_baseline_of_one_step_is_named_in_the_singular():
    # --skip 3: prefill 50 ms and first decode 9 ms left out, one clean step of 1 ms before the window
    bw = {"peak_GBps": 4.0, "verdict": "2.000 ms per step, 4.00× the floor of 0.500 ms",
          "summary": {"bytes_per_step": 2_000_000, "floor_us": 500.0, "step_us_p50": 2000.0}}
    section = profile_section(_state(before_ns=[0, 50 * MS, 59 * MS, 60 * MS]), 0, _program(), {"bandwidth": bw})
    assert section["reference_from"] == "before" and section["reference_steps"] == 1
    verdict = with_unprofiled({"files": [{"path": "p", "bandwidth": bw}]}, section)["files"][0]["bandwidth"]["verdict"]
    assert verdict.endswith("; without the profiler 1.000 ms per step (1 step before the window), 2.00× the floor: "
                            "50% of peak")
    assert "over 1 step before the window without it" in " ".join(outcome_lines(section, "x.py"))
