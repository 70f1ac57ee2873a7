"""Our own traces, recorded on the H200 (tests/data, provenance in h200_traces_provenance.json).

Llama-3.2-1B dummy bf16 weights, reference engine eager and CUDA graph, 3 profiled decode steps. Expected
values come from an independent plain ``json`` reading here: kernels whose launch (by correlation id)
falls inside each ``bubblescope.decode_step#i`` range, and the launch API calls inside those ranges.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bubblescope.profiler.trace import load_trace
from bubblescope.profiler.trace.steps import step_metrics
from bubblescope.profiler.trace.summary import summarize_traces
from bubblescope.profiler.trace.timeline import timeline_summary

DATA = Path(__file__).parent / "data"
LAUNCHES = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch"}


def _independent(name: str) -> dict:
    with gzip.open(DATA / name, "rt") as fh:
        ev = json.load(fh)["traceEvents"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev
                   if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                   and e["name"].startswith("bubblescope.decode_step#"))
    runtime = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")]

    def step_of(ts):
        return next((i for i, (a, b) in enumerate(steps) if a <= ts <= b), None)

    corr_step = {e["args"]["correlation"]: step_of(e["ts"]) for e in runtime if "correlation" in e.get("args", {})}
    kernels = [0] * len(steps)
    for e in ev:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            s = corr_step.get(e["args"].get("correlation"))
            if s is not None:
                kernels[s] += 1
    launches = [0] * len(steps)
    for e in runtime:
        s = step_of(e["ts"])
        if s is not None and e["name"].split("_v")[0] in LAUNCHES:
            launches[s] += 1
    return {"steps": len(steps), "kernels": kernels, "launches": launches}


@pytest.mark.parametrize("mode", ["eager", "cudagraph"])
def test_kernels_and_launches_per_step_match_an_independent_count(mode):
    name = f"h200_reference_{mode}.json.gz"
    want = _independent(name)
    trace = load_trace(DATA / name)
    per_step = step_metrics(trace, "bubblescope.decode_step", 5.0)
    assert len(per_step) == want["steps"] == 3
    assert per_step["kernels"].tolist() == want["kernels"]
    assert per_step["launches"].tolist() == want["launches"]
    summ = timeline_summary(trace)
    assert summ["available"] and summ["kernels_per_step"] == pytest.approx(sum(want["kernels"]) / 3)


def test_cuda_graph_has_far_fewer_launches_and_less_idle():
    eager = timeline_summary(load_trace(DATA / "h200_reference_eager.json.gz"))
    graph = timeline_summary(load_trace(DATA / "h200_reference_cudagraph.json.gz"))
    # 16 layers of op-by-op Llama: hundreds of kernels per token either way; the graph replays them from
    # one cudaGraphLaunch, so launches collapse and the GPU idles far less between kernels.
    assert eager["kernels_per_step"] > 500 and graph["kernels_per_step"] > 500
    assert eager["launches_per_step"] >= eager["kernels_per_step"] * 0.9
    assert graph["launches_per_step"] <= 5
    assert graph["launches_per_step"] * 100 < eager["launches_per_step"]
    assert eager["bubble_ratio"] > 0.5 > graph["bubble_ratio"]


def test_summary_json_shape_for_recorded_traces():
    s = summarize_traces([str(DATA / "h200_reference_cudagraph.json.gz")])
    (f,) = s["files"]
    (dev,) = f["devices"]
    assert s["schema"] == "bubblescope.trace/1" and dev["kernels"] > 0
    assert 0 < dev["busy_us"] <= dev["span_us"] and dev["bubble_ratio"] == pytest.approx(1 - dev["busy_us"] / dev["span_us"])
