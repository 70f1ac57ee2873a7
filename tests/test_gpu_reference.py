"""GPU-only checks of the reference engine's modes and of a captured CUDA timeline (skipped on CPU)."""

from __future__ import annotations

import pytest
import torch

from bubblescope.generation import generate
from bubblescope.models import dummy_weights, get_preset
from bubblescope.reference_engine import ReferenceEngine

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def llama1b():
    return dummy_weights(get_preset("llama-3.2-1b"), "cuda", torch.bfloat16, seed=0)


def test_cudagraph_and_compile_match_eager_greedy(llama1b):
    # positions 200-326: the captured and compiled steps attend over 256, then 340 cache positions (two graphs)
    prompt = torch.randint(3, 128256, (200,), generator=torch.Generator().manual_seed(0)).tolist()
    eager = generate(ReferenceEngine(llama1b, "eager", 340), prompt, 128, eos_ids=()).tokens
    graph = generate(ReferenceEngine(llama1b, "cudagraph", 340), prompt, 128, eos_ids=()).tokens
    # the same kernels but the attention's length (the bucket against the positions in use): masked positions add
    # exact zeros, yet the attention kernel may split its sums differently, so bf16 greedy may part at a near-tie
    assert sum(a == b for a, b in zip(graph, eager)) / len(eager) >= 0.95
    comp = generate(ReferenceEngine(llama1b, "compile", 340), prompt, 128, eos_ids=()).tokens
    # inductor fuses ops and may round bf16 intermediates differently; still, long greedy agreement
    agree = sum(a == b for a, b in zip(comp, eager)) / len(eager)
    assert agree >= 0.95, agree


def test_bucket_graphs_match_eager_logits_across_an_edge_and_after_a_reset(llama1b):
    """Teacher-forced steps at positions 250-261 (the graphs of the 256- and 340-position buckets), then a short
    run that replays the 256 bucket's graph again after the longer one: logits within bf16 noise of eager's."""
    from bubblescope.generation import teacher_forced_logits

    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, 128256, (250,), generator=g).tolist()
    forced = torch.randint(3, 128256, (12,), generator=g).tolist()
    eager = ReferenceEngine(llama1b, "eager", 340)
    want = teacher_forced_logits(eager, prompt, forced)
    want_short = teacher_forced_logits(eager, prompt[:20], forced[:4])
    for mode in ("cudagraph", "compile"):
        eng = ReferenceEngine(llama1b, mode, 340)
        for got, ref in ((teacher_forced_logits(eng, prompt, forced), want),
                         (teacher_forced_logits(eng, prompt[:20], forced[:4]), want_short)):
            rel = ((got - ref).abs().max() / ref.abs().max()).item()
            same_top1 = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
            assert rel < 5e-2 and same_top1 >= 0.9, (mode, rel, same_top1)


def test_captured_timeline_graph_has_far_fewer_launches(llama1b, tmp_path):
    from bubblescope.profiler.capture import capture_decode_trace
    from bubblescope.profiler.trace.timeline import timeline_summary
    from bubblescope.profiler.trace import load_trace

    prompt = torch.arange(3, 67)
    summ = {}
    for mode in ("eager", "cudagraph"):
        eng = ReferenceEngine(llama1b, mode, 128)
        cap = capture_decode_trace(eng, prompt, steps=4, warmup=3, out_path=tmp_path / f"{mode}.json.gz")
        assert cap.gpu
        summ[mode] = timeline_summary(load_trace(cap.trace_path))
    # 16 layers × ~20 ops each in eager; the graph replay is one cudaGraphLaunch (+ the token fill, argmax, copy)
    assert summ["eager"]["kernels_per_step"] > 200
    assert summ["cudagraph"]["kernels_per_step"] >= summ["eager"]["kernels_per_step"] * 0.9
    assert summ["cudagraph"]["launches_per_step"] <= 8 < summ["eager"]["launches_per_step"]
