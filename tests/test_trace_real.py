"""The parser and metrics on the real Kineto traces in ../shared/traces, checked against a plain
``json`` + ``gzip`` reading and a loop-based interval union written here, independently of the code."""

from __future__ import annotations

import gzip
import json

import pytest

from bubblescope.profiler.trace import load_trace
from bubblescope.profiler.trace import metrics as m
from bubblescope.profiler.trace import steps as st
from bubblescope.profiler.trace import timeline as tm
from bubblescope.profiler.trace.summary import summarize_traces

from .conftest import TRACES

pytestmark = pytest.mark.skipif(not TRACES.is_dir(), reason=f"{TRACES} not found (../shared is absent)")

GPU_CATS = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}
CPU_CATS = {"cuda_runtime", "cuda_driver", "Runtime"}


def _events(name: str) -> list[dict]:
    with gzip.open(TRACES / name, "rt") as fh:
        return json.load(fh)["traceEvents"]


def _reference(events: list[dict], threshold: float = 5.0) -> dict:
    """busy/span and the idle split per device, by a sweep over activities sorted by start."""
    launch_ts = {
        e["args"]["correlation"]: e["ts"]
        for e in events
        if e.get("ph") == "X" and e.get("cat") in CPU_CATS and "correlation" in e.get("args", {})
    }
    per_dev: dict = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS:
            dev = e["args"].get("device", e["pid"])
            per_dev.setdefault(dev, []).append(
                (e["ts"], e["ts"] + e["dur"], launch_ts.get(e["args"].get("correlation")))
            )
    out = {}
    for dev, acts in per_dev.items():
        acts.sort(key=lambda a: a[0])
        busy, host, kern, other = 0.0, 0.0, 0.0, 0.0
        cur_start, cur_end = acts[0][0], acts[0][1]
        for start, end, launched in acts[1:]:
            if start > cur_end:
                busy += cur_end - cur_start
                gap = start - cur_end
                if launched is not None and launched >= cur_end:
                    host += gap
                elif gap < threshold:
                    kern += gap
                else:
                    other += gap
                cur_start, cur_end = start, end
            else:
                cur_end = max(cur_end, end)
        busy += cur_end - cur_start
        span = max(a[1] for a in acts) - acts[0][0]
        out[dev] = {"n": len(acts), "busy": busy, "span": span, "host": host, "kern": kern, "other": other}
    return out


@pytest.mark.parametrize(
    "name",
    [
        "a100_alexnet.json.gz",
        "legacy_categories_rank1.json.gz",
        "multistream_event_sync.json.gz",
        "triton_culaunchkernel.json.gz",
    ],
)
def test_device_metrics_match_a_plain_reading(name):
    events = _events(name)
    ref = _reference(events)
    tr = load_trace(TRACES / name)
    # alexnet's PARAM benchmark wraps its measured forward in a second range of the same name (one nested in the
    # other, counted once, as the Trace Event Format nests them); nothing else is odd in these traces
    nested = ["2 ranges (record_function) nested inside another of the same name on the same thread: counted once "
              "(the outer one kept)"]
    assert tr.warnings == (nested if name == "a100_alexnet.json.gz" else [])
    assert len(tr.runtime) == sum(1 for e in events if e.get("ph") == "X" and e.get("cat") in CPU_CATS)
    summary = m.device_summary(tr).set_index("device")
    assert sorted(summary.index) == sorted(ref)
    for dev, r in ref.items():
        row = summary.loc[dev]
        assert row["kernels"] + row["memcpys"] + row["memsets"] == r["n"]
        assert row["busy_us"] == pytest.approx(r["busy"], abs=1e-3)
        assert row["span_us"] == pytest.approx(r["span"], abs=1e-3)
        assert row["bubble_ratio"] == pytest.approx(
            1 - r["busy"] / r["span"] if r["span"] else float("nan"), nan_ok=True
        )
        assert (row["host_wait_us"], row["kernel_wait_us"], row["other_idle_us"]) == pytest.approx(
            (r["host"], r["kern"], r["other"]), abs=1e-3
        )


def test_a100_alexnet():
    events = _events("a100_alexnet.json.gz")
    tr = load_trace(TRACES / "a100_alexnet.json.gz")
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert len(kernels) == 79 and (tr.gpu["kind"] == "kernel").sum() == 79
    assert (
        sorted(tr.gpu.loc[tr.gpu["kind"] == "kernel", "stream"].unique())
        == sorted({e["args"]["stream"] for e in kernels})
        == [7, 20]
    )
    assert tr.rank == 0 and tr.metadata["deviceProperties"][0]["numSms"] == 108
    assert tr.runtime["is_launch"].sum() == sum(1 for e in events if e.get("name") == "cudaLaunchKernel") == 79
    syncs = {"cudaStreamSynchronize", "cudaDeviceSynchronize"}
    assert tr.runtime["is_sync"].sum() == sum(
        1 for e in events if e.get("cat") == "cuda_runtime" and e["name"] in syncs
    )
    # every kernel's launch delay: its start minus the cudaLaunchKernel with its correlation
    launch = {e["args"]["correlation"]: e["ts"] for e in events if e.get("name") == "cudaLaunchKernel"}
    want = sorted(k["ts"] - launch[k["args"]["correlation"]] for k in kernels)
    assert sorted(st.launch_delays(tr)["delay_us"]) == want
    # the measured forward passes as "steps": the second is nested in the first under the same name, so they are one
    # step (the outer range), holding every launch inside it
    marker = "[param|pytorch.model.alex_net|0|0|0|measure|forward]"
    steps = [e for e in events if e.get("name") == marker]
    outer = steps[0]
    assert steps[1]["ts"] + steps[1]["dur"] <= outer["ts"] + outer["dur"]
    inside = {
        e["args"]["correlation"]
        for e in events
        if e.get("name") == "cudaLaunchKernel" and outer["ts"] <= e["ts"] < outer["ts"] + outer["dur"]
    }
    table = st.step_metrics(tr, marker)
    assert table["kernels"].tolist() == [sum(1 for k in kernels if k["args"]["correlation"] in inside)]
    assert table["wall_us"].tolist() == [outer["dur"]]


def test_a100_alexnet_streams_overlap_warning():
    """The summary names the time streams 7 and 20 run at once (a warning; no
    number changes). Expected from the raw events: per-stream unions summed minus the device union."""
    events = [e for e in _events("a100_alexnet.json.gz") if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]

    def union(intervals):
        total, reach = 0.0, -float("inf")
        for start, end in sorted(intervals):
            total += max(0.0, end - max(start, reach))
            reach = max(reach, end)
        return total

    spans = [(e["ts"], e["ts"] + e["dur"], e["args"]["stream"]) for e in events]
    overlap = sum(union([(a, b) for a, b, s in spans if s == st_]) for st_ in {s for *_, s in spans}) - union(
        [(a, b) for a, b, _ in spans]
    )
    warnings = summarize_traces([TRACES / "a100_alexnet.json.gz"])["files"][0]["warnings"]
    assert overlap > 0 and any(w.startswith(f"device 0: its 2 streams run at the same time for {overlap:,.3f} µs") for w in warnings)


def test_triton_culaunchkernel():
    tr = load_trace(TRACES / "triton_culaunchkernel.json.gz")
    assert tr.metadata["displayTimeUnit"] == "ms" and tr.rank is None
    k = tr.gpu.iloc[0]
    assert (k["name"], k["ts_us"], k["dur_us"], k["registers_per_thread"]) == (
        "triton_poi_fused_add_cos_sin_0",
        2413669097444.592,
        1.76,
        16,
    )
    launch = tr.runtime[tr.runtime["is_launch"]]
    assert launch["name"].tolist() == ["cuLaunchKernel"] and launch["category"].tolist() == ["cuda_driver"]
    delay = st.launch_delays(tr)["delay_us"].iloc[0]
    assert delay == pytest.approx(2413669097444.592 - 2413669097399.166, abs=1e-3)
    s = tm.timeline_summary(tr, "ProfilerStep")  # the step range lies on another pid: matched by time
    assert s["available"] and s["steps"] == 1 and s["kernels_per_step"] == 1 and s["launches_per_step"] == 1
    assert s["step_wall_us"] == pytest.approx(13336315.805)
    assert s["launch_share"] == pytest.approx(47.768 / 13336315.805)
    assert s["sync_share"] == pytest.approx(16.846 / 13336315.805)


def test_legacy_and_multistream():
    legacy = load_trace(TRACES / "legacy_categories_rank1.json.gz")
    events = _events("legacy_categories_rank1.json.gz")
    assert legacy.rank == 1 and len(legacy.gpu) == 4 and legacy.runtime["is_launch"].sum() == 4
    want = sorted(e["args"]["external id"] for e in events if e.get("cat") == "Kernel")
    assert sorted(legacy.gpu["external_id"].tolist()) == want
    multi = load_trace(TRACES / "multistream_event_sync.json.gz")
    assert multi.gpu["kind"].value_counts().to_dict() == {"kernel": 3, "memset": 3}
    assert sorted(multi.gpu["stream"].unique()) == [20, 24, 28]
    # unpaired flow events are kept as they are, not needed for linking
    assert len(multi.flows) == sum(1 for e in _events("multistream_event_sync.json.gz") if e.get("ph") in ("s", "f"))


def test_summarize_directory_of_traces():
    s = summarize_traces([TRACES])
    assert [f["path"].rsplit("/", 1)[-1] for f in s["files"]] == sorted(p.name for p in TRACES.glob("*.json.gz"))
    assert [f["rank"] for f in s["files"]] == [0, 1, 0, None]
    assert s["files"][3]["step_marker"] == "ProfilerStep" and s["files"][0]["steps"] is None
    json.dumps(s, allow_nan=False)
