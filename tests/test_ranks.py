"""Multi-rank merge on two synthetic per-rank traces; every expected number is worked out by hand below.

Rank 0 (device 0), step 0: gemv [10,40) s7, ncclAllReduce [40,60) s20, gemv [60,70) s7 -> start 10, end 70,
span 60, busy 60, compute 40, nccl 20 (share 1/3). Step 1: gemv [110,130), nccl [130,150), silu [155,160) ->
start 110, end 160, span 50, busy 45, compute 25, nccl 20 (share 0.4).
Rank 1 (device 1), step 0: gemv [15,55), nccl [55,62), gemv [62,72) -> start 15, end 72, span 57, busy 57,
compute 50, nccl 7. Step 1: gemv [112,140), nccl [140,151) s20 and nccl [145,150) s21 (overlapping: union 11),
silu [156,161) -> start 112, end 161, span 49, busy 44, compute 33, nccl 11.
Across ranks: step 0 start skew 5, end skew 2, slowest rank 1 (compute 50 vs 40); step 1 start skew 2,
end skew 1, slowest rank 1 (33 vs 25).
"""

from __future__ import annotations

import pytest

from bubblescope.errors import BubblescopeError
from bubblescope.profiler.trace.ranks import cross_rank_steps, rank_steps, rank_summary
from bubblescope.profiler.trace import load_trace

from . import tracegen as tg

NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _rank_events(device: int, kernels: list[tuple[int, str, float, float, int]]) -> list[dict]:
    ev = [tg.annotation("bubblescope.decode_step#0", 0, 100), tg.annotation("bubblescope.decode_step#1", 100, 100)]
    for corr, name, ts, end, stream in kernels:
        step_start = 0 if ts < 100 else 100
        ev.append(tg.launch(step_start + corr % 10, 1, corr))
        ev.append(tg.kernel(name, ts, end - ts, corr, stream=stream, device=device))
    return tg.meta_events() + ev


RANK0 = [(1, "gemv", 10, 40, 7), (2, NCCL, 40, 60, 20), (3, "gemv", 60, 70, 7),
         (11, "gemv", 110, 130, 7), (12, NCCL, 130, 150, 20), (13, "silu", 155, 160, 7)]
RANK1 = [(1, "gemv", 15, 55, 7), (2, NCCL, 55, 62, 20), (3, "gemv", 62, 72, 7),
         (11, "gemv", 112, 140, 7), (12, NCCL, 140, 151, 20), (14, NCCL, 145, 150, 21), (13, "silu", 156, 161, 7)]


@pytest.fixture
def traces(tmp_path):
    out = []
    for rank, kernels in ((1, RANK1), (0, RANK0)):  # out of order on purpose: ranks come from distributedInfo
        path = tg.write(tmp_path / f"rank{rank}.json.gz", tg.document(_rank_events(rank, kernels), rank=rank))
        out.append(load_trace(path))
    return out


def test_rank_steps(traces):
    s = rank_steps(traces)
    assert s[["step", "rank"]].values.tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]
    assert s["device"].tolist() == [0, 1, 0, 1]
    assert s["start_us"].tolist() == [10, 15, 110, 112]
    assert s["end_us"].tolist() == [70, 72, 160, 161]
    assert s["busy_us"].tolist() == [60, 57, 45, 44]
    assert s["compute_us"].tolist() == [40, 50, 25, 33]
    assert s["nccl_us"].tolist() == [20, 7, 20, 11]
    assert s["nccl_share"].tolist() == pytest.approx([20 / 60, 7 / 57, 20 / 50, 11 / 49])
    assert s["kernels"].tolist() == [3, 3, 3, 4] and s["nccl_kernels"].tolist() == [1, 1, 1, 2]


def test_cross_rank_skew_and_slowest(traces):
    x = cross_rank_steps(rank_steps(traces))
    assert x["start_skew_us"].tolist() == [5, 2] and x["end_skew_us"].tolist() == [2, 1]
    assert x["slowest_rank"].tolist() == [1, 1] and x["compute_skew_us"].tolist() == [10, 8]
    assert x["last_start_rank"].tolist() == [1, 1] and x["first_start_rank"].tolist() == [0, 0]
    assert x["span_us"].tolist() == [62, 51]
    assert x["nccl_share_max"].tolist() == pytest.approx([1 / 3, 0.4])


def test_skip_steps_renumbers(traces):
    s = rank_steps(traces, skip_steps=1)
    assert s["step"].tolist() == [0, 0] and s["start_us"].tolist() == [110, 112]


def test_rank_summary(traces):
    s = rank_steps(traces)
    r = rank_summary(traces, s).set_index("rank")
    assert r.loc[0, "busy_us"] == 105 and r.loc[0, "span_us"] == 150
    assert r.loc[0, "bubble_ratio"] == pytest.approx(1 - 105 / 150)
    assert r.loc[1, "busy_us"] == 101 and r.loc[1, "span_us"] == 146
    assert r.loc[0, "nccl_share"] == pytest.approx(40 / 110) and r.loc[1, "nccl_share"] == pytest.approx(18 / 106)
    assert r.loc[1, "slowest_steps"] == 2 and r.loc[0, "slowest_steps"] == 0
    assert r.loc[0, "kernels"] == 6 and r.loc[1, "kernels"] == 7


def test_duplicate_ranks(tmp_path):
    paths = [tg.write(tmp_path / f"t{i}.json", tg.document(_rank_events(0, RANK0), rank=0)) for i in range(2)]
    with pytest.raises(BubblescopeError, match="rank 0 again"):
        rank_steps([load_trace(p) for p in paths])


def _cli(*args):
    from typer.testing import CliRunner

    from bubblescope.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def test_cli_folder_of_rank_traces(traces, tmp_path):
    import json

    r = _cli("diagnose", "trace", tmp_path, "--format", "json")
    assert r.exit_code == 0, r.output
    ranks = json.loads(r.stdout)["ranks"]
    assert ranks["world_size"] == 2 and ranks["steps"] == 2
    shares = sorted([20 / 60, 7 / 57, 20 / 50, 11 / 49])  # median of 4 = mean of the middle two
    assert ranks["median"] == {"start_skew_us": 3.5, "end_skew_us": 1.5, "compute_skew_us": 9.0,
                               "nccl_share": pytest.approx((shares[1] + shares[2]) / 2)}
    assert [s["slowest_rank"] for s in ranks["per_step"]] == [1, 1]
    text = _cli("diagnose", "trace", tmp_path / "rank0.json.gz", tmp_path / "rank1.json.gz", "--skip-steps", "1")
    assert text.exit_code == 0, text.output
    assert "2 ranks" in text.stdout and "1 step compared" in text.stdout


def test_cli_ranks_needs_two_files(traces, tmp_path):
    r = _cli("diagnose", "trace", tmp_path / "rank0.json.gz", "--ranks")
    assert r.exit_code == 2 and "at least two files" in r.output


@pytest.mark.parametrize("second", ["same", "link"])
def test_cli_ranks_refuses_one_file_given_as_two_ranks(traces, tmp_path, second):
    """`diagnose trace --ranks X X` reported two identical ranks (skew 0, rank 0 slowest every step)."""
    first = tmp_path / "rank0.json.gz"
    if second == "link":
        (tmp_path / "link.json.gz").symlink_to(first)
        what = f"{first} and {tmp_path / 'link.json.gz'} are the same file"
    else:
        what = f"{first} is given twice"
    r = _cli("diagnose", "trace", "--ranks", first, tmp_path / "rank1.json.gz",
             first if second == "same" else tmp_path / "link.json.gz")
    assert r.exit_code == 2, r.output
    assert r.stderr == f"error: --ranks: {what} (ranks 0 and 2); give one trace per rank\n" and r.stdout == ""


def test_rank_activities_share_one_axis(traces):
    from bubblescope.profiler.trace.ranks import rank_activities
    from bubblescope.reports.rank_plots import rank_timeline_figure

    a = rank_activities(traces, rank_steps(traces), max_steps=1)  # step 0 only; t0 = rank 0's start at 10 µs
    assert a["rank"].tolist() == [0, 0, 0, 1, 1, 1]
    assert a["start_us"].tolist() == [0, 30, 50, 5, 45, 52] and a["end_us"].tolist() == [30, 50, 60, 45, 52, 62]
    assert a["nccl"].tolist() == [False, True, False, False, True, False]
    fig = rank_timeline_figure(a)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["rank 0", "rank 1"]
    assert rank_timeline_figure(a.iloc[:0]) is None


def test_rank_tagged_files_without_common_steps_get_no_section(tmp_path):
    from bubblescope.profiler.trace.ranksummary import summarize_rank_traces

    plain = [tg.kernel("gemv", 10, 5, 1)]  # rank-tagged, but no step marker
    paths = [tg.write(tmp_path / f"r{r}.json", tg.document(tg.meta_events() + plain, rank=r)) for r in range(2)]
    assert summarize_rank_traces(paths)["ranks"] is None
    with pytest.raises(BubblescopeError) as info:
        summarize_rank_traces(paths, force=True)
    # Fresh-user finding: with no marker in any file, "the traces do not share one step marker (a: no step
    # marker; b: no step marker)" read as if they had different ones; now it says what was looked for.
    assert str(info.value) == ("--ranks: no trace has a step marker ('bubblescope.decode_step' or 'ProfilerStep'); "
                               "name the steps' record_function with --step-marker")
    # Files with different markers are each named with what they have.
    marked = tg.document(tg.meta_events() + plain + [tg.annotation("ProfilerStep#0", 5, 20)], rank=1)
    paths[1] = tg.write(tmp_path / "rank1.json", marked)
    with pytest.raises(BubblescopeError) as info:
        summarize_rank_traces(paths, force=True)
    assert str(info.value) == (f"--ranks: the traces do not share one step marker ({paths[0]}: no step marker; "
                               f"{paths[1]}: 'ProfilerStep')")


def test_tp_comm_entry_and_communication_bound_finding(traces):
    from bubblescope.profiler.trace.ranksummary import multirank_section
    from bubblescope.reports.findings import find
    from bubblescope.tpdiagnose import _comm

    section = multirank_section(traces, "bubblescope.decode_step")
    traffic = {"world_size": 2, "allreduce_count": 4, "allreduce_bytes": 6000, "allgather_bytes": 3000,
               "bus_bytes": 9000, "total_bytes": 4_800_000}
    tp = _comm(section, traffic, 4800.0)
    # least NCCL time per step over ranks: min(20, 7) = 7 and min(20, 11) = 11 -> median 9 µs;
    # HBM floor 4.8 MB at 4800 GB/s = 1 µs; bus 9000 B in 9 µs = 1 GB/s.
    assert tp["nccl_us_per_step"] == 9 and tp["hbm_floor_us"] == pytest.approx(1.0)
    assert tp["bound"] == "communication" and tp["bus_GBps"] == pytest.approx(1.0)
    doc = {"engines": [{"name": "reference-tp2", "status": "ok", "tp": tp}]}
    (f,) = [f for f in find(doc) if f["rule"] == "communication-bound"]
    assert f["evidence"]["nccl_us_per_step"] == 9 and f["engine"] == "reference-tp2"
    assert not [f for f in find({"engines": [{"name": "x", "status": "ok",
                                              "tp": _comm(section, traffic, 0.001)}]})
                if f["rule"] == "communication-bound"]  # a 4.8 s floor: HBM bounds the step


def test_cli_says_why_rank_traces_were_not_merged(tmp_path):
    """Two files naming ranks 0 and 1 whose steps carry no marker: each is reported alone, and a note on stderr says
    why and how to merge them; with the markers the note is gone (the merge happened)."""
    bare = [e for e in _rank_events(0, RANK0) if "decode_step" not in e.get("name", "")]
    bare1 = [e for e in _rank_events(1, RANK1) if "decode_step" not in e.get("name", "")]
    a = tg.write(tmp_path / "a.json", tg.document(bare, rank=0))
    b = tg.write(tmp_path / "b.json", tg.document(bare1, rank=1))
    r = _cli("diagnose", "trace", a, b)
    assert r.exit_code == 0, r.output
    assert "note: the files name ranks 0 and 1 but not one shared step marker (found: none)" in r.stderr
    assert "--step-marker" in r.stderr
    c = tg.write(tmp_path / "c.json", tg.document(_rank_events(0, RANK0), rank=0))
    d = tg.write(tmp_path / "d.json", tg.document(_rank_events(1, RANK1), rank=1))
    merged = _cli("diagnose", "trace", c, d)
    assert merged.exit_code == 0 and "note: the files name ranks" not in merged.stderr
    same = _cli("diagnose", "trace", a, tg.write(tmp_path / "e.json", tg.document(bare, rank=0)))
    assert "note: the files name ranks" not in same.stderr  # one rank twice: not one job's ranks


# --- ties in the per-step rank columns; the tables in 80 columns ---------------------------------------------------
# Two ranks, one kernel per step. Step 0: both start at 30 (a tie for the first and the last start), rank 0 ends at
# 35, rank 1 at 38 (last end 1, end skew 3); compute 5 against 8 (slowest 1, skew 3); span 30-38 = 8. Step 1: rank 0
# [130, 140), rank 1 [132, 140): first start 0, last start 1 (skew 2), both end at 140 (a tie for the last end, skew
# 0); compute 10 against 8 (slowest 0, skew 2); span 10.
TIED = {0: [(30, 5), (130, 10)], 1: [(30, 8), (132, 8)]}


def _tied_traces(tmp_path):
    paths = []
    for rank, kernels in TIED.items():
        ev = [tg.annotation("bubblescope.decode_step#0", 0, 100), tg.annotation("bubblescope.decode_step#1", 100, 100)]
        for corr, (ts, dur) in enumerate(kernels, start=1):
            ev += [tg.launch(ts - 20, 2, corr), tg.kernel("gemv", ts, dur, corr, device=rank)]
        paths.append(tg.write(tmp_path / f"tied{rank}.json", tg.document(ev, rank=rank)))
    return paths


def _table(lines: list[str], title: str) -> list[list[str]]:
    """The body cells of the boxed table printed under ``title``."""
    at = lines.index(next(line for line in lines if line.startswith(title)))
    body = lines[at + 1:]
    body = body[:next(i for i, line in enumerate(body) if line.startswith("└"))]
    start = next(i for i, line in enumerate(body) if line.startswith("┡"))
    return [[c.strip() for c in line.strip().strip("│").split("│")] for line in body[start + 1:]]


def test_tied_ranks_are_named_as_a_tie_not_as_the_first_of_them(tmp_path):
    """first_start_rank, last_start_rank and last_end_rank named the first of tied ranks (idxmin / idxmax), where
    slowest_rank already named none."""
    import subprocess
    import sys

    from bubblescope.profiler.trace.ranksummary import summarize_rank_traces
    from .conftest import ROOT

    paths = _tied_traces(tmp_path)
    per_step = summarize_rank_traces(paths)["ranks"]["per_step"]
    keys = ("first_start_rank", "last_start_rank", "last_end_rank", "slowest_rank")
    assert [[s[k] for k in keys] for s in per_step] == [[None, None, 1, 1], [0, 1, None, 0]]
    assert [(s["start_skew_us"], s["end_skew_us"], s["span_us"], s["compute_skew_us"]) for s in per_step] == \
        [(0, 3, 8, 3), (2, 0, 10, 2)]
    r = subprocess.run([sys.executable, "-m", "bubblescope", "diagnose", "trace", *map(str, paths), "--ranks"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    section = lines[next(i for i, line in enumerate(lines) if line.startswith("2 ranks, marker")):]
    assert max(len(line) for line in section) <= 80 and "…" not in "".join(section)
    assert _table(section, "Per step, across ranks: timing") == [
        ["0", "0.0 µs", "3.0 µs", "8.0 µs", "tie", "tie", "1"],
        ["1", "2.0 µs", "0.0 µs", "10.0 µs", "0", "1", "tie"]]
    assert _table(section, "Per step, across ranks: compute and NCCL") == [
        ["0", "1", "3.0 µs", "0.0 %–0.0 %"], ["1", "0", "2.0 µs", "0.0 %–0.0 %"]]
    assert _table(section, "Per rank (decode window)") == [
        ["0", "0", "2", "15.0 µs", "110.0 µs", f"{1 - 15 / 110:.3f}", "0.0 %"],
        ["1", "1", "2", "16.0 µs", "110.0 µs", f"{1 - 16 / 110:.3f}", "0.0 %"]]
    assert _table(section, "Per rank, median per step") == [["0", "7.5 µs", "0.0 µs", "1 step"],
                                                            ["1", "8.0 µs", "0.0 µs", "1 step"]]


def test_the_rank_tables_fit_80_columns_at_their_widest():
    """The per-rank table (10 columns) and the per-step table (7) wrapped every row onto two lines at 80 columns.
    Widest cells: 4-digit steps and ranks, 7-digit kernel counts, times of 9,999.99 s, 100.0 % shares."""
    import io

    from rich.console import Console

    from bubblescope.reports.ranks_terminal import render_ranks
    big = 9_999.99e6  # µs: "9,999.99 s"
    rank = {"rank": 1000, "device": 7, "kernels": 1_234_567, "busy_us": big, "span_us": big, "bubble_ratio": 0.999,
            "nccl_share": 1.0, "compute_us_per_step": big, "nccl_us_per_step": big, "slowest_steps": 9999}
    step = {"step": 9999, "start_skew_us": big, "end_skew_us": big, "span_us": big, "first_start_rank": 1000,
            "last_start_rank": 1001, "last_end_rank": None, "slowest_rank": 1002, "compute_skew_us": big,
            "nccl_share_min": 1.0, "nccl_share_max": 1.0}
    section = {"world_size": 1024, "step_marker": "bubblescope.decode_step", "steps": 9999, "per_rank": [rank],
               "per_step": [step], "median": {"start_skew_us": big, "end_skew_us": big, "compute_skew_us": big,
                                              "nccl_share": 1.0}, "warnings": []}
    out = io.StringIO()
    render_ranks(section, Console(file=out, width=80, color_system=None))
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in out.getvalue()
    assert _table(lines, "Per rank (decode window)") == [["1000", "7", "1234567", "9,999.99 s", "9,999.99 s", "0.999",
                                                          "100.0 %"]]
    assert _table(lines, "Per rank, median per step") == [["1000", "9,999.99 s", "9,999.99 s", "9999 steps"]]
    assert _table(lines, "Per step, across ranks: timing") == [["9999", "9,999.99 s", "9,999.99 s", "9,999.99 s",
                                                                "1000", "1001", "tie"]]
    assert _table(lines, "Per step, across ranks: compute and NCCL") == [["9999", "1002", "9,999.99 s",
                                                                          "100.0 %–100.0 %"]]
    assert "median skew over steps: start 9,999.99 s, end 9,999.99 s, compute 9,999.99 s" in lines
    assert "median NCCL share of a rank's step: 100.0 %" in lines


def _numbered_rank(tmp_path, rank: int, numbers: list[int], offset: float, world: int = 2):
    """Rank ``rank``'s trace of steps ProfilerStep#N, N in ``numbers``: step N is [100 (N - 4), + 100), its
    launch at +5 and one gemv kernel [+10 + offset, +40 + offset) on device ``rank``."""
    ev = []
    for n in numbers:
        t = 100 * (n - 4)
        ev += [tg.annotation(f"ProfilerStep#{n}", t, 100), tg.launch(t + 5, 1, n),
               tg.kernel("gemv", t + 10 + offset, 30, n, device=rank)]
    doc = tg.document(tg.meta_events() + ev, distributedInfo={"backend": "nccl", "rank": rank, "world_size": world})
    return tg.write(tmp_path / f"r{rank}.json", doc)


def test_ranks_are_matched_by_step_number_not_position(tmp_path):
    """Rank 0's profiler recorded ProfilerStep#4 to #6, rank 1's #5 to #7 (it started a step later). Matched by
    position, rank 0's #4 (kernel at 10) met rank 1's #5 (kernel at 112): a skew of 102 µs, a whole step wrong.
    By number, #5 meets #5 and #6 meets #6: start skews of 2 µs (110 vs 112, 210 vs 212), and a warning says so."""
    from bubblescope.profiler.trace.ranksummary import summarize_rank_traces

    paths = [_numbered_rank(tmp_path, 0, [4, 5, 6], 0), _numbered_rank(tmp_path, 1, [5, 6, 7], 2)]
    section = summarize_rank_traces(paths, step_marker="ProfilerStep")["ranks"]
    assert [s["start_skew_us"] for s in section["per_step"]] == [2.0, 2.0]
    rows = sorted((r["step"], r["rank"], r["number"], r["start_us"]) for r in section["rank_steps"])
    assert rows == [(0, 0, 5, 110.0), (0, 1, 5, 112.0), (1, 0, 6, 210.0), (1, 1, 6, 212.0)]
    assert section["warnings"] == [
        "the ranks' traces hold different steps (rank 0: #4 to #6, rank 1: #5 to #7); steps were matched by their "
        "number (ProfilerStep#N), not their position: compared 2 steps present on every rank, #5 to #6"]


def test_ranks_holding_the_same_steps_need_no_note(tmp_path):
    from bubblescope.profiler.trace.ranksummary import summarize_rank_traces

    paths = [_numbered_rank(tmp_path, 0, [4, 5, 6], 0), _numbered_rank(tmp_path, 1, [4, 5, 6], 3)]
    section = summarize_rank_traces(paths, step_marker="ProfilerStep")["ranks"]
    assert [s["start_skew_us"] for s in section["per_step"]] == [3.0, 3.0, 3.0]
    assert section["warnings"] == [] and section["missing_ranks"] is None


def test_a_rank_missing_from_the_set_is_named(tmp_path):
    """Ranks 0, 1 and 3 of a world size 4: the merge went on as if the job had three ranks, saying nothing."""
    from bubblescope.profiler.trace.ranksummary import summarize_rank_traces

    paths = [_numbered_rank(tmp_path, r, [4, 5], r, world=4) for r in (0, 1, 3)]
    section = summarize_rank_traces(paths, step_marker="ProfilerStep")["ranks"]
    assert section["missing_ranks"] == [2]
    assert section["warnings"] == ["ranks 0, 1, 3 of world size 4 given: rank 2 missing; the cross-rank figures "
                                   "(skews, slowest rank) cover only the ranks given"]
    assert [s["start_skew_us"] for s in section["per_step"]] == [3.0, 3.0]  # ranks 0 and 3: 10 vs 13
