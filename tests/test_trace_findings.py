"""Findings of ``diagnose trace`` (reports.trace_findings) on hand-built traces: each rule fires where the numbers,
worked out by hand below, cross its threshold, with those numbers as evidence, and stays silent just below it or
when its input is missing. Also the two recorded H200 traces of tests/data and a real trace of ../shared."""

from __future__ import annotations

import pytest

from bubblescope.profiler.trace.ranksummary import summarize_rank_traces
from bubblescope.reports.trace_findings import find_trace, finding_subject

from . import tracegen as tg
from .conftest import TRACES
from .test_ranks import RANK0, RANK1, _rank_events

MARK = "bubblescope.decode_step"


def _step(events: list, i: int, start: float, wall: float) -> None:
    events.append(tg.annotation(f"{MARK}#{i}", start, wall))


def launch_bound_events(kernels: int = 100) -> list[dict]:
    """3 steps of 1000 µs at 0, 1000, 2000. In each, ``kernels`` kernels of 2 µs at s+10+8i, each launched
    (cudaLaunchKernel, 2 µs) at s+7+8i, 3 µs after the previous kernel ended: every 6-µs gap is host-wait.
    Per step (100 kernels): busy 200, span 794, host-wait 99 × 6 = 594, launch time 200 of a 1000-µs wall.
    Decode window [10, 2804): busy 600 of 2794, bubble ratio 1 - 600/2794."""
    ev, corr = [], 0
    for i, s in enumerate((0, 1000, 2000)):
        _step(ev, i, s, 1000)
        for k in range(kernels):
            corr += 1
            ev += [tg.launch(s + 7 + 8 * k, 2, corr), tg.kernel("gemv", s + 10 + 8 * k, 2, corr)]
    return tg.meta_events() + ev


def graph_events() -> list[dict]:
    """3 steps of 1000 µs; in each one cudaGraphLaunch (s+5, 5 µs) replays 10 kernels of 10 µs at s+20+20i, all
    with its correlation id. Per step: busy 100, span 190; window [20, 2210): bubble ratio 1 - 300/2190."""
    ev = []
    for i, s in enumerate((0, 1000, 2000)):
        _step(ev, i, s, 1000)
        corr = 100 + i
        ev.append(tg.api("cudaGraphLaunch", s + 5, 5, corr))
        ev += [tg.kernel("fused", s + 20 + 20 * k, 10, corr) for k in range(10)]
    return tg.meta_events() + ev


def synced_events() -> list[dict]:
    """Steps at 0 (3000 µs: a slow first step), 3000, 4000, 5000 (1000 µs each). In each: launches at s+10 and
    s+12 queue k1 [s+20, s+220) and k2 [s+220, s+420); cudaStreamSynchronize [s+16, s+420); then a launch at
    s+600 runs k3 [s+610, s+910): the GPU waited 190 µs for it (host-wait). 3 launches and kernels per step.
    sync share 4 × 404 / 6000 over all steps (3 × 404 / 3000 without the first)."""
    ev, corr = [], 0
    for i, (s, wall) in enumerate(((0, 3000), (3000, 1000), (4000, 1000), (5000, 1000))):
        _step(ev, i, s, wall)
        for at, ts, dur in ((s + 10, s + 20, 200), (s + 12, s + 220, 200), (s + 600, s + 610, 300)):
            corr += 1
            ev += [tg.launch(at, 2, corr), tg.kernel("k", ts, dur, corr)]
        ev.append(tg.api("cudaStreamSynchronize", s + 16, 404, 1000 + i))
    return tg.meta_events() + ev


def gap_events(gap: float = 2) -> list[dict]:
    """3 steps of 800 µs at 0, 800, 1600; 50 launches (2 µs) at s+3i queue 50 kernels of 10 µs at s+200+(10+gap)i:
    49 gaps of ``gap`` µs per step, kernel-wait when shorter than 5 µs (98 µs per step for 2 µs, 12.25 % of the
    800-µs step)."""
    ev, corr = [], 0
    for i, s in enumerate((0, 800, 1600)):
        _step(ev, i, s, 800)
        for k in range(50):
            corr += 1
            ev += [tg.launch(s + 3 * k, 2, corr), tg.kernel("k", s + 200 + (10 + gap) * k, 10, corr)]
    return tg.meta_events() + ev


def idle_events(queued: bool = False) -> list[dict]:
    """No step marker: kernels of 10 µs at 0, 100, 200, each launched 5 µs before it starts (after the previous
    one ended: host-wait), or all three launched at -20, -18, -16 (``queued``: the gaps are "other" idle).
    Busy 30 of a 210-µs span. Three different kernels: nothing repeats, so no steps are found either."""
    at = (-20, -18, -16) if queued else (-5, 95, 195)
    ev = []
    for corr, (a, ts) in enumerate(zip(at, (0, 100, 200)), start=1):
        ev += [tg.launch(a, 2, corr), tg.kernel(f"k{corr}", ts, 10, corr)]
    return tg.meta_events() + ev


def _find(tmp_path, events, name="t.json", **kw):
    path = tg.write(tmp_path / name, tg.document(events, rank=None))
    return find_trace(summarize_rank_traces([path], **kw)), str(path)


def _rules(findings):
    return [f["rule"] for f in findings]


def test_launch_bound_fires_with_the_step_figures_as_evidence(tmp_path):
    found, path = _find(tmp_path, launch_bound_events())
    assert _rules(found) == ["launch-bound"]
    (f,) = found
    assert f["severity"] == "problem" and f["file"] == path and f["rank"] is None
    assert f["evidence"] == {"bubble_ratio": pytest.approx(1 - 600 / 2794), "kernels_per_step": 100,
                             "launches_per_step": 100, "launch_share": pytest.approx(0.2),
                             "host_wait_per_step_us": pytest.approx(594)}
    assert f["title"] == "Launch-bound: the GPU is idle 79% of the decode window across 100 kernels per step"
    assert "CUDA graph" in f["advice"] and 'mode="reduce-overhead"' in f["advice"] and "megakernel" in f["advice"]


def test_launch_bound_silent_below_100_kernels_per_step(tmp_path):
    found, _ = _find(tmp_path, launch_bound_events(kernels=99))
    assert "launch-bound" not in _rules(found)


def test_bubble_bound_fires_on_one_graph_launch_per_step(tmp_path):
    found, _ = _find(tmp_path, graph_events())
    assert _rules(found) == ["bubble-bound"]
    (f,) = found
    assert f["severity"] == "problem"  # idle 86 % of the window: more than half
    assert f["evidence"]["bubble_ratio"] == pytest.approx(1 - 300 / 2190)
    assert f["evidence"]["launches_per_step"] == 1 and f["evidence"]["kernels_per_step"] == 10
    assert f["title"] == "Bubble-bound: 1 launch per step, yet the GPU is idle 86% of the decode window"


def test_host_sync_and_warm_up(tmp_path):
    found, _ = _find(tmp_path, synced_events())
    assert _rules(found) == ["host-sync", "warm-up"]
    sync, warm = found
    assert sync["evidence"] == {"sync_share": pytest.approx(4 * 404 / 6000), "host_wait_per_step_us": 190,
                                "step_wall_us": 1000, "host_wait_share": 0.19}
    assert sync["severity"] == "warn" and ".item()" in sync["advice"] and "non_blocking=True" in sync["advice"]
    assert warm["evidence"] == {"slow_steps": 1, "skipped_steps": 0, "warmup_wall_us": 3000,
                                "median_step_wall_us": 1000, "warmup_over_median": 3.0}
    assert warm["title"].startswith("Warm-up: the first step took 3.00 ms, 3.0x the median of the rest (1.00 ms)")
    assert "--skip-steps 1" in warm["advice"]


def test_warm_up_silent_once_skipped(tmp_path):
    found, _ = _find(tmp_path, synced_events(), skip_steps=1)
    assert _rules(found) == ["host-sync"]
    assert found[0]["evidence"]["sync_share"] == pytest.approx(3 * 404 / 3000)


def _walls(*walls, skip=0):
    rows = [{"step": i, "warmup": i < skip, "wall_us": w} for i, w in enumerate(walls)]
    return {"files": [{"path": "w.json", "rank": None, "devices": [], "steps": None, "step_rows": rows}]}


def test_warm_up_counts_every_slow_leading_step():
    (f,) = find_trace(_walls(4000, 2500, 1000, 1100, 900))  # median 1100: 4000 and 2500 are >= 1650, then 1000 not
    assert f["evidence"] == {"slow_steps": 2, "skipped_steps": 0, "warmup_wall_us": 4000, "median_step_wall_us": 1000,
                             "warmup_over_median": 4.0}
    assert f["title"].startswith("Warm-up: the first 2 steps took up to 4.00 ms, 4.0x the median of the rest")
    assert "--skip-steps 2" in f["advice"]
    assert _rules(find_trace(_walls(4000, 2500, 1000, 1100, 900, skip=1))) == ["warm-up"]  # one still counted
    assert find_trace(_walls(4000, 2500, 1000, 1100, 900, skip=2)) == []  # both left out already
    assert find_trace(_walls(1400, 1000, 1000)) == []  # 1.4x: below 1.5x
    assert find_trace(_walls(3000, 1000)) == []  # two steps: too few to tell
    assert find_trace(_walls(10, 1, 0, 0)) == []  # the rest lasted nothing: no ratio to give


def test_kernel_gaps_fire_at_2_us_and_not_at_5(tmp_path):
    found, _ = _find(tmp_path, gap_events())
    assert _rules(found) == ["kernel-gaps"]
    assert found[0]["evidence"] == {"kernel_wait_per_step_us": pytest.approx(98), "step_wall_us": 800,
                                    "kernel_wait_share": 0.1225, "kernels_per_step": 50, "threshold_us": 5.0}
    found, _ = _find(tmp_path, gap_events(gap=5), name="u.json")  # 5-µs gaps are not shorter than 5 µs
    assert _rules(found) == []


def test_host_idle_only_without_step_figures(tmp_path):
    found, path = _find(tmp_path, idle_events())
    assert _rules(found) == ["host-idle"]
    assert found[0]["evidence"] == {"device": 0, "bubble_ratio": pytest.approx(1 - 30 / 210), "host_wait_share": 1.0,
                                    "busy_us": 30, "span_us": 210, "kernels": 3}
    assert "record_function" in found[0]["advice"]
    found, _ = _find(tmp_path, idle_events(queued=True), name="q.json")
    assert found == []  # as idle, but the host had queued every kernel: not waiting on the host


def test_rules_stay_silent_on_missing_inputs():
    summary = {"files": [{"path": "x", "rank": None, "devices": [{"device": 0, "bubble_ratio": None, "idle": {}}],
                          "steps": {"available": True, "bubble_ratio": None, "kernels_per_step": None, "idle": {}},
                          "step_rows": [{"step": 0, "wall_us": None}]},
                         {"path": "bad.json", "error": "bad.json: not a Chrome trace"}],
               "ranks": {"world_size": 2, "median": {}, "per_rank": [], "per_step": []}}
    assert find_trace(summary) == []
    assert find_trace({"files": []}) == []


def test_unknown_threshold_is_refused():
    with pytest.raises(KeyError, match="nope"):
        find_trace({"files": []}, {"nope": 1})


def test_thresholds_can_be_overridden(tmp_path):
    s = summarize_rank_traces([tg.write(tmp_path / "t.json", tg.document(launch_bound_events(99), rank=None))])
    # 99 kernels idle 79 % of the window: below launch-bound's count, so the GPU's idle time is gpu-idle's
    assert _rules(find_trace(s)) == ["gpu-idle"]
    assert _rules(find_trace(s, {"launch_bound_min_kernels_per_step": 99})) == ["launch-bound"]


def _rank_files(tmp_path, kernels0, kernels1):
    return [tg.write(tmp_path / f"rank{r}.json.gz", tg.document(_rank_events(r, k), rank=r))
            for r, k in ((0, kernels0), (1, kernels1))]


def test_nccl_heavy_and_rank_skew_on_two_ranks(tmp_path):
    """test_ranks' two ranks: NCCL shares 20/60, 7/57, 20/50, 11/49 (median (11/49 + 1/3) / 2); compute skews 10
    and 8 over step spans 62 and 51 (medians 9 of 56.5); start skews 5 and 2; rank 1 the slowest in both steps."""
    found = find_trace(summarize_rank_traces(_rank_files(tmp_path, RANK0, RANK1)))
    assert _rules(found) == ["nccl-heavy", "rank-skew"]
    nccl, skew = found
    assert nccl["file"] is None and finding_subject(nccl) == "all ranks"
    assert nccl["evidence"] == {"nccl_share": pytest.approx((11 / 49 + 1 / 3) / 2), "world_size": 2,
                                "nccl_per_step_min_us": 9, "nccl_per_step_max_us": 20, "compute_skew_us": 9}
    assert skew["evidence"] == {"start_skew_us": 3.5, "compute_skew_us": 9, "step_span_us": 56.5,
                                "start_skew_share": round(3.5 / 56.5, 4), "compute_skew_share": round(9 / 56.5, 4),
                                "slowest_rank": 1, "slowest_steps": 2}
    assert skew["title"] == ("Rank imbalance: median compute skew 16% of the step's span across 2 ranks; rank 1 was "
                             "the slowest in 2 of 2 steps")


def test_balanced_ranks_without_nccl_get_no_rank_finding(tmp_path):
    same = [(c, "gemv", ts, end, 7) for c, _, ts, end, _ in RANK0]
    found = find_trace(summarize_rank_traces(_rank_files(tmp_path, same, same)))
    assert not {"nccl-heavy", "rank-skew"} & set(_rules(found))


@pytest.mark.parametrize("mode, rules", [("eager", ["launch-bound"]),
                                         ("cudagraph", ["host-sync", "kernel-gaps", "warm-up"])])
def test_recorded_h200_traces(mode, rules):
    """The reference engine on the H200 (tests/data): eager launches 754 kernels a step and idles 87 % of the
    window; the CUDA graph replays them in 3 launches, syncs on the host every step, and its first step is the
    slowest."""
    from pathlib import Path

    s = summarize_rank_traces([Path(__file__).parent / "data" / f"h200_reference_{mode}.json.gz"])
    found = find_trace(s)
    assert _rules(found) == rules
    steps = s["files"][0]["steps"]
    if mode == "eager":
        assert found[0]["evidence"]["kernels_per_step"] == steps["kernels_per_step"] == 754
        assert found[0]["evidence"]["bubble_ratio"] == steps["bubble_ratio"]
    else:
        assert found[0]["evidence"]["sync_share"] == steps["sync_share"]


@pytest.mark.skipif(not TRACES.is_dir(), reason=f"{TRACES} not found (../shared is absent)")
def test_real_a100_trace_without_steps_gets_host_idle():
    s = summarize_rank_traces([TRACES / "a100_alexnet.json.gz"])
    found = find_trace(s)
    assert _rules(found) == ["host-idle"]
    dev = s["files"][0]["devices"][0]
    assert found[0]["evidence"]["bubble_ratio"] == dev["bubble_ratio"] > 0.99
    assert found[0]["evidence"]["host_wait_share"] == dev["idle"]["host_wait_share"]


def host_idle_step_events(pause_us: float = 13e6) -> list[dict]:
    """4 steps; in each, 5 launches (2 µs) at s+10+20k queue 5 kernels of 10 µs at s+15+20k. Step 2 pauses the
    host ``pause_us`` (13 s) before its last launch, as a host-side sleep or data load would. Steps start at 0,
    1000, 2000 and 3000 + the pause. Busy 50 µs per step; the decode window [15, 3000 + pause + 105) is idle
    all but 200 µs of it."""
    ev, corr = [], 0
    starts = (0, 1000, 2000, 3000 + pause_us)
    for i, s in enumerate(starts):
        wall = 1000 + (pause_us if i == 2 else 0)
        _step(ev, i, s, wall)
        for k in range(5):
            at = s + 10 + 20 * k + (pause_us if i == 2 and k == 4 else 0)
            corr += 1
            ev += [tg.launch(at, 2, corr), tg.kernel("k", at + 5, 10, corr)]
    return tg.meta_events() + ev


def test_gpu_idle_for_the_host_in_one_step_is_a_finding(tmp_path):
    """13 s of host idle inside one step of 5 kernels: too few kernels for launch-bound, too many launches for
    bubble-bound, no synchronize call for host-sync; "Findings: none" was wrong."""
    found, _ = _find(tmp_path, host_idle_step_events())
    assert _rules(found) == ["gpu-idle"]
    (f,) = found
    window = 3000 + 13e6 + 105 - 15
    assert f["evidence"]["bubble_ratio"] == pytest.approx(1 - 200 / window)
    assert f["evidence"]["kernels_per_step"] == 5 and f["evidence"]["slowest_step"] == 2
    assert f["evidence"]["slowest_step_wall_us"] == pytest.approx(1000 + 13e6)
    assert f["title"].startswith("GPU idle 100% of the decode window across 5 kernels per step")
    assert "waiting for the host" in f["title"]


def test_gpu_idle_silent_while_the_gpu_is_mostly_busy(tmp_path):
    busy, _ = _find(tmp_path, gap_events())  # 25 % of the window idle across 50 kernels: kernel gaps only
    assert _rules(busy) == ["kernel-gaps"]


def _bandwidth_entry(busy_us: float, nbytes: int, floor_us: float, util: float) -> dict:
    """A file entry with a median GPU busy time per step and a bandwidth summary, numbers typed in by hand."""
    return {"path": "t.json", "rank": None, "steps": {"gpu_busy_us_per_step": busy_us},
            "bandwidth": {"model": "llama-3.2-1b", "dtype": "bfloat16",
                          "summary": {"floor_us": floor_us, "bytes_per_step": nbytes, "util_peak": util,
                                      "over_floor_x": 1 / util, "effective_GBps": util * 3350,
                                      "step_us_p50": floor_us / util}}}


def test_bytes_that_the_gpu_could_not_have_moved_are_a_problem_not_a_bandwidth_figure():
    """A tiny model's trace read as Llama-3.2-1B: 2.472 GB in a step whose GPU was busy 226.4 µs would need
    10,918 GB/s, 3.26x the H100's 3,350 GB/s (floor 737.9 µs)."""
    entry = _bandwidth_entry(226.4, 2_472_000_000, 737.9, 0.142)
    (f,) = find_trace({"files": [entry]})
    assert f["rule"] == "bytes-mismatch" and f["severity"] == "problem"
    assert f["evidence"] == {"gpu_busy_us_per_step": 226.4, "floor_us": 737.9, "bytes_per_step": 2_472_000_000,
                             "needed_GBps": 10918.7, "needed_over_peak": 3.2593}
    assert "llama-3.2-1b in bfloat16, which this trace did not run" in f["advice"]
    # a step whose GPU was busy the floor's length or longer is silent; so are bytes that fit an on-chip cache
    assert find_trace({"files": [_bandwidth_entry(740.0, 2_472_000_000, 737.9, 0.142)]}) == []
    assert find_trace({"files": [_bandwidth_entry(20.0, 100_000_000, 29.9, 0.142)]}) == []


def test_bytes_beyond_the_trace_are_not_called_near_the_bandwidth_limit():
    """At 120 % of peak by wall time the near-limit rule would have fired: the mismatch speaks instead."""
    entry = _bandwidth_entry(600.0, 2_472_000_000, 737.9, 1.2)
    assert _rules(find_trace({"files": [entry]})) == ["bytes-mismatch"]
    entry["steps"]["gpu_busy_us_per_step"] = 800.0
    assert _rules(find_trace({"files": [entry]})) == ["near-bandwidth-limit"]
