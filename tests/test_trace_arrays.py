"""The numpy side of trace reading and summaries: the grouping functions against pandas, the interval
split against a hand-computed timeline, and the column form (TraceArrays) against the pandas form
(Trace) of the same files: same frames, same summary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bubblescope.profiler.trace import intervals
from bubblescope.profiler.trace import load_trace
from bubblescope.profiler.trace.arrays import TraceArrays
from bubblescope.profiler.trace.load import read_trace_arrays
from bubblescope.profiler.trace.summary import summarize_trace

from . import tracegen as tg

DATA = Path(__file__).resolve().parent / "data"
SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"


def test_factorize_is_pandas_factorize():
    values = np.random.default_rng(1).integers(-5, 50, 2000)
    codes, uniques = intervals.factorize(values)
    ref_codes, ref_uniques = pd.factorize(values)
    assert codes.tolist() == ref_codes.tolist() and uniques.tolist() == ref_uniques.tolist()
    assert intervals.first_of_each(values).tolist() == (~pd.Series(values).duplicated()).tolist()


@pytest.mark.parametrize("runs", [3, 6000])  # one accumulate per run, and the ranked form for many runs
def test_group_cummax_is_pandas_groupby_cummax(runs):
    rng = np.random.default_rng(runs)
    code = np.sort(rng.integers(0, runs, 30000))
    values = rng.random(30000) * 1e6
    expected = pd.Series(values).groupby(code).cummax().to_numpy()
    assert np.array_equal(intervals.group_cummax(code, values), expected)


def test_pair_codes_rows_and_codes_agree():
    a = np.array([3, 1, 3, 1, 3, 9])
    b = np.array([7, 7, 7, 8, 2, 7])
    codes, rows = intervals.pair_codes(a, b)
    assert rows.tolist() == [[1, 7], [1, 8], [3, 2], [3, 7], [9, 7]]
    assert [tuple(rows[c]) for c in codes] == list(zip(a.tolist(), b.tolist()))


def test_interval_stats_by_hand():
    # group 0: [0, 10] and [5, 12] overlap (busy 12), gap 12 -> 20 whose launch came at 14 (after the
    # previous end: host wait 8), [20, 25]; gap 25 -> 27, launched at 1 (before: a 2 µs kernel wait
    # under the 5 µs threshold), [27, 30]; gap 30 -> 40, launched at 2 (other: 10 µs), [40, 41].
    # group 4: one activity [100, 103].
    start = np.array([0.0, 5, 20, 27, 40, 100])
    end = np.array([10.0, 12, 25, 30, 41, 103])
    launch = np.array([np.nan, np.nan, 14, 1, 2, np.nan])
    keys, s = intervals.interval_stats(np.array([0, 0, 0, 0, 0, 4]), start, end, launch, 5.0)
    assert keys.tolist() == [0, 4]
    assert s["busy_us"].tolist() == [12 + 5 + 3 + 1, 3]
    assert s["span_us"].tolist() == [41, 3]
    assert s["host_wait_us"].tolist() == [8, 0]
    assert s["kernel_wait_us"].tolist() == [2, 0]
    assert s["other_idle_us"].tolist() == [10, 0]


@pytest.mark.parametrize("seed", range(20))
def test_range_owners_is_the_latest_starting_range_holding_each_point(seed):
    """Against a plain loop over the ranges: overlapping, nested, equal, zero-length and disjoint ranges
    (seeds without an overlap take the searchsorted path), points on every start and end and between."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 9))
    ts = rng.integers(0, 30, n).astype(float) * 10
    end = ts + rng.choice([0, 5, 10, 20, 40, 150], n)
    if seed % 4 == 0:  # disjoint ranges in shuffled order
        ts = np.sort(rng.choice(np.arange(0, 400, 20), n, replace=False)).astype(float)[rng.permutation(n)]
        end = ts + rng.integers(0, 20, n)
    at = np.concatenate([ts, end, rng.uniform(-10, 500, 50)])
    want = []
    for x in at.tolist():
        holding = [i for i in range(n) if ts[i] <= x < end[i]]
        want.append(max(holding, key=lambda i: (ts[i], -i)) if holding else -1)  # equal starts: earlier position
    assert intervals.range_owners(ts, end, at).tolist() == want


def _traces():
    out = [DATA / "h200_reference_eager.json.gz", DATA / "h200_reference_cudagraph.json.gz"]
    return out + (sorted(SHARED.glob("*.json*")) if SHARED.is_dir() else [])


@pytest.mark.parametrize("path", _traces(), ids=lambda p: p.name)
def test_columns_and_frames_give_the_same_summary(path):
    arrays = read_trace_arrays(path, flows=False, lean=True)
    frames = load_trace(path, flows=False, lean=True)
    for table in ("gpu", "runtime", "annotations"):
        pd.testing.assert_frame_equal(getattr(arrays.to_trace(), table), getattr(frames, table))
    direct = summarize_trace(arrays)
    assert json.dumps(direct) == json.dumps(summarize_trace(frames))  # through TraceArrays.from_trace
    assert direct["devices"], "a real trace has GPU activity"


def test_from_trace_of_a_hand_built_frame_without_derived_columns(tmp_path):
    """A Trace whose gpu frame lacks category and registers_per_thread, and runtime is_launch/is_sync."""
    events = [tg.annotation("bubblescope.decode_step#0", 80, 40), tg.launch(90, 1, 1), tg.kernel("gemv_kernel", 100, 4, 1),
              tg.launch(95, 1, 2), tg.kernel("rms_norm_kernel", 110, 2, 2)]
    trace = load_trace(tg.write(tmp_path / "t.json", tg.document(events)))
    bare = type(trace)(path=trace.path, rank=trace.rank, metadata=trace.metadata,
                       gpu=trace.gpu.drop(columns=["category", "registers_per_thread"]),
                       runtime=trace.runtime.drop(columns=["is_launch", "is_sync"]),
                       annotations=trace.annotations, flows=trace.flows, warnings=trace.warnings)
    arrays = TraceArrays.from_trace(bare)
    assert [arrays.texts[c] for c in arrays.gpu["category"]] == ["gemm/gemv", "norm"]
    assert arrays.runtime["is_launch"].tolist() == [True, True]
    got = summarize_trace(bare)
    assert got["steps"]["kernels_per_step"] == 2.0
    assert got["devices"][0]["busy_us"] == 6.0
    assert got == summarize_trace(trace)
