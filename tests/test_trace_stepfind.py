"""Decode steps in traces without markers, and kernels inside CUDA-graph replays: hand-built traces whose
steps, times and graph figures are computed by hand in ``tracegen``'s docstrings and here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bubblescope.profiler.trace.periodic import repeating_steps
from bubblescope.profiler.trace.summary import summarize_traces

from . import tracegen as tg


def _summary(tmp_path, events, name="t.json", **kw):
    return summarize_traces([tg.write(tmp_path / name, tg.document(events, rank=None))], **kw)["files"][0]


def _found(tokens, gaps=None):
    tokens = np.asarray(tokens)
    return repeating_steps(tokens, np.zeros(len(tokens)) if gaps is None else np.asarray(gaps, dtype=float))


def test_a_period_whose_once_per_step_unit_is_not_first_still_gives_every_step():
    # the loop's once-per-token units (5, 6) come after its layers (1, 2, 1): cutting at them would lose a step at
    # each end; 0 and 9 before the loop are its set-up
    found = _found([0, 9] + [1, 2, 1, 5, 6] * 4)
    assert found["found"] and found["length"] == 5
    assert found["starts"].tolist() == [2, 7, 12, 17] and found["ends"].tolist() == [7, 12, 17, 22]
    assert found["prefix"] == 2 and found["suffix"] == 0 and found["matching"].all()


def test_an_irregular_step_is_counted_and_flagged():
    tokens = [1, 2, 3] * 5 + [1, 2, 7, 3] + [1, 2, 3] * 5  # one step launched an extra kernel
    found = _found(tokens)
    assert len(found["starts"]) == 11 and found["matching"].tolist() == [True] * 5 + [False] + [True] * 5
    assert found["ends"][5] - found["starts"][5] == 4


def test_no_steps_from_too_few_repeats_or_a_motif_inside_one_pass():
    assert not _found([1, 2, 3, 1, 2, 3])["found"]  # two passes: not enough to call it a period
    one_pass = list(range(100, 130)) + [5, 6, 7] * 3 + list(range(200, 230))  # a 3-kernel motif in one pass
    found = _found(one_pass)
    assert not found["found"] and "covers only 13%" in found["reason"]


def test_the_boundary_goes_after_the_longest_host_gap():
    tokens = [1, 2, 3, 4] * 6
    gaps = [10.0, 1.0, 1.0, 1.0] * 6  # the host pauses before each 1: that is where a token ends
    gaps_before_3 = [1.0, 1.0, 10.0, 1.0] * 6
    assert _found(tokens, gaps)["starts"].tolist() == [0, 4, 8, 12, 16, 20]
    assert _found(tokens, gaps_before_3)["starts"][0] == 2


def test_a_step_whose_kernels_cycle_from_token_to_token_is_one_token_not_the_cycle():
    # each token: layer 0's attention kernel is one of four (picked by the context's alignment), then two layers
    # with the common one, LM head, sampling; the exact sequence repeats every 4 tokens, and a variant's kernel
    # occurs once per 4 tokens, so the exact period alone would call 4 tokens a step
    tokens, gaps = [0, 1, 2], [0.0, 0.0, 0.0]
    for t in range(40):
        step = [10, 20 + t % 4, 11, 12] + [10, 19, 11, 12] * 2 + [30, 31]
        tokens += step
        gaps += [9.0] + [0.0] * (len(step) - 1)  # the host pauses before each token (sampling)
    found = _found(tokens, gaps)
    assert found["found"] and found["length"] == 14 and (found["cycle"], found["variants"]) == (4, 4)
    assert found["starts"].tolist() == [3 + 14 * t for t in range(40)] and found["matching"].all()
    assert found["prefix"] == 3 and found["suffix"] == 0


def _layer(attn):
    return [1, 2, 3, attn, 4, 5, 1, 6, 7, 8, 5]  # norm, qkv, rope, attention, o-proj, add, norm, mlp ..., add


def _token_loop(tokens_n, attn_of, layers=16, prefill=(50, 51) * 16 + (52,)):
    """(units, gaps) of a loop of ``tokens_n`` tokens: embedding (0), ``layers`` layers whose attention unit is
    ``attn_of(token, layer)``, final norm, LM head (9), argmax (10); 180 units a token with 16 layers; a prefill
    first, the host pausing 50 µs before each token."""
    units, gaps = list(prefill), [3.0] * len(prefill)
    for t in range(tokens_n):
        step = [0] + [u for layer in range(layers) for u in _layer(attn_of(t, layer))] + [1, 9, 10]
        units += step
        gaps += [50.0] + [3.0] * (len(step) - 1)
    return units, gaps


@pytest.mark.parametrize("cycle", [2, 3, 4])
def test_a_kernel_that_cycles_in_every_layer_gives_one_step_per_token(cycle):
    # every layer's attention kernel is variant t % cycle: no unit occurs once per cycle, so the exact period (the
    # cycle) has no anchor; the embedding's segments are the 180-unit tokens, in `cycle` variants
    units, gaps = _token_loop(24, lambda t, layer: 100 + t % cycle)
    found = _found(units, gaps)
    assert found["found"] and found["length"] == 180 and (found["cycle"], found["variants"]) == (cycle, cycle)
    assert found["starts"].tolist() == [33 + 180 * t for t in range(24)] and found["matching"].all()
    assert (found["prefix"], found["suffix"]) == (33, 0)


def test_a_kernel_that_cycles_in_one_of_sixteen_layers_gives_one_step_per_token():
    # layer 0's attention cycles over 3 variants, the other 15 layers share one kernel: the exact period (3 tokens,
    # 7 whole repeats in 24 tokens) covered less than the 11-unit layer (360 of 384 layers), which became the step
    units, gaps = _token_loop(24, lambda t, layer: 100 + t % 3 if layer == 0 else 99)
    found = _found(units, gaps)
    assert found["length"] == 180 and (found["cycle"], found["variants"]) == (3, 3)
    assert found["starts"].tolist() == [33 + 180 * t for t in range(24)] and found["prefix"] == 33


def test_identical_layers_with_the_tokens_own_units_are_one_step_per_token():
    same = _found(*_token_loop(20, lambda t, layer: 99))
    assert same["length"] == 180 and (same["cycle"], same["variants"]) == (1, 1) and len(same["starts"]) == 20
    # sliding and global attention layers alternating: a layer pair repeats too, but the token covers more
    pairs = _found(*_token_loop(20, lambda t, layer: 98 + layer % 2, layers=32, prefill=()))
    assert pairs["length"] == 356 and pairs["cycle"] == 1 and len(pairs["starts"]) == 20


def test_markerless_loop_whose_attention_kernel_cycles_in_every_layer_is_described(tmp_path):
    def names(i):
        return ["embed"] + [k for _ in range(16) for k in ("rmsnorm", "gemv_qkv", f"flash_split{i % 3}", "gemv_o",
                                                               "add")] + ["lm_head", "argmax"]
    events, want = tg.decode_loop_events(12, names, prefill=["gemm_prefill"] * 3)
    f = _summary(tmp_path, events)
    d = f["step_detection"]
    assert d["steps"] == 12 and d["units_per_step"] == 83 and (d["cycle"], d["variants"]) == (3, 3), d
    assert d["prefix_units"] == 3 and d["matching_steps"] == 12
    assert d["description"].startswith("steps: 12, from a repeating 83-kernel sequence in 3 variants (units that "
                                       "change from token to token; the same sequence every 3 steps)")
    assert [r["wall_us"] for r in f["step_rows"]] == [want["step_us"]] * 11 + [83 * 12.0]


def test_a_unit_repeated_per_layer_is_not_taken_for_the_step():
    # four identical layers, then the token's own units: as many as a layer's, so a layer's length divides the
    # step's (15 = 5 × 3) but a step holds 4 layers, not 5; and a layer unit's segments, 3, 3, 3 and 6 units long,
    # cycle in form but lie too far apart in length to be a token's variants
    found = _found([10, 11, 12] * 4 + [30, 31, 32] + ([10, 11, 12] * 4 + [30, 31, 32]) * 19)
    assert found["length"] == 15 and found["cycle"] == 1 and len(found["starts"]) == 20
    one = _found(([10, 11, 12] * 4 + [30]) * 20)  # a one-unit tail
    assert one["length"] == 13 and one["cycle"] == 1 and len(one["starts"]) == 20


def test_variants_one_kernel_apart_are_still_one_step_per_token():
    # two layers; the attention kernel alternates, and every odd token launches one more kernel (a copy made
    # for a misaligned context): the exact sequence spans 2 tokens, but the embedding's segments of 26 and 27 units
    # are the tokens, in 2 variants
    units, gaps = _token_loop(20, lambda t, layer: 100 + t % 2, layers=2, prefill=(50, 51, 52))
    for t in range(19, -1, -1):  # from the end, so the positions before are unshifted
        if t % 2:
            at = 3 + 26 * t + 5
            units[at:at] = [77]
            gaps[at:at] = [3.0]
    found = _found(units, gaps)
    assert found["found"] and (found["cycle"], found["variants"], found["lengths"]) == (2, 2, [26, 27])
    assert len(found["starts"]) == 20 and found["matching"].all() and found["prefix"] == 3
    assert (found["ends"] - found["starts"]).tolist() == [26, 27] * 10 and found["ends"][-1] == len(units)


def _variant_loop(tokens_n, pause_us, odd=True, mid_pause_us=None):
    """(units, gaps) of a 2-layer loop of ``tokens_n`` tokens whose odd tokens (``odd``) launch one more kernel
    (88, a copy of a misaligned context) and three more in each layer, and another attention kernel: 26 and 33
    units, so the exact sequence spans two tokens and 88 occurs once in it. The host pauses ``pause_us`` before
    each token and 3 µs between launches, and ``mid_pause_us`` (if given) before the final norm (a sync between the
    layers and the LM head)."""
    units, gaps = [50, 51, 52], [3.0] * 3
    for t in range(tokens_n):
        v = t % 2 if odd else 0
        layer = [1, 2, 3, 100 + v] + [77] * (3 * v) + [4, 5, 1, 6, 7, 8, 5]
        step = [0] + [88] * v + layer * 2 + [1, 9, 10]
        units += step
        gaps += [pause_us] + [3.0] * (len(step) - 1)
        if mid_pause_us is not None:
            gaps[-3] = mid_pause_us
    return units, gaps


def test_token_variants_far_apart_in_length_are_told_apart_by_the_hosts_pause():
    # odd tokens 27 % longer than even ones: too far apart to be variants of one length, and kernel 88 occurs once
    # per two tokens, so the exact period is two tokens; the host's 500 µs pause before every token (sampling, a
    # sync), against 3 µs between launches, cuts each period into its two tokens
    units, gaps = _variant_loop(20, 500.0)
    found = _found(units, gaps)
    assert found["found"] and (found["cycle"], found["lengths"]) == (2, [26, 33]) and found["length"] == 26
    assert len(found["starts"]) == 20 and found["matching"].all() and found["prefix"] == 3
    assert (found["ends"] - found["starts"]).tolist() == [26, 33] * 10 and found["ends"][-1] == len(units)


def _with_extra_kernel(token):
    """``_variant_loop(20, 500.0)`` with token ``token`` launching one more kernel (99) in its first layer."""
    units, gaps = _variant_loop(20, 500.0)
    at = 3 + sum(26 if t % 2 == 0 else 33 for t in range(token)) + 5  # inside that token
    units.insert(at, 99)
    gaps.insert(at, 3.0)
    return units, gaps


def test_a_token_with_an_extra_kernel_is_cut_from_its_period_too():
    # the same loop, token 7 launching one more kernel (99) in its first layer: its two-token period (60 units)
    # is no common step, yet the host pauses before token 7 as before every token, so it is cut there too:
    # one step per token, the odd one 34 units long and counted as not matching
    units, gaps = _with_extra_kernel(7)
    found = _found(units, gaps)
    assert found["found"] and (found["cycle"], found["lengths"]) == (2, [26, 33]) and len(found["starts"]) == 20
    assert (found["ends"] - found["starts"]).tolist() == [26, 33] * 3 + [26, 34] + [26, 33] * 6
    assert found["matching"].tolist() == [True] * 7 + [False] + [True] * 12
    assert found["prefix"] == 3 and found["suffix"] == 0 and found["variants"] == 2
    assert found["coverage"] == (len(units) - 3 - 34) / len(units)


def test_whole_tokens_outside_the_first_and_last_period_are_steps_too():
    # token 6 launches one more kernel (99): the periods that keep the most exact repeats are then (odd, even)
    # pairs, from token 1 to token 18, which leaves token 0 before the first and token 19 after the last; each is
    # one of the tokens' own sequences (26 and 33 units), so each is a step: 20 steps, not 18
    units, gaps = _with_extra_kernel(6)
    found = _found(units, gaps)
    assert found["found"] and (found["cycle"], found["lengths"]) == (2, [26, 33]) and len(found["starts"]) == 20
    assert (found["ends"] - found["starts"]).tolist() == [26, 33] * 3 + [27, 33] + [26, 33] * 6
    assert found["starts"][0] == 3 and found["prefix"] == 3 and found["suffix"] == 0
    assert found["ends"][-1] == len(units) and found["matching"].tolist() == [True] * 6 + [False] + [True] * 13


def test_no_pause_between_tokens_leaves_the_exact_period_whole():
    # the same loop launching ahead (no pause between tokens): nothing tells two tokens from one, so the steps are
    # the exact period of two tokens
    found = _found(*_variant_loop(20, 3.0))
    assert found["length"] == 59 and found["cycle"] == 1 and len(found["starts"]) == 10


def test_a_pause_no_longer_than_the_work_between_launches_splits_nothing():
    # a host-bound loop whose gaps between launches (30 µs) are near the pause before a token (100 µs): the
    # pause does not stand out, so the exact period stays whole
    units, gaps = _variant_loop(20, 100.0)
    gaps = [30.0 if g == 3.0 else g for g in gaps]
    found = _found(units, gaps)
    assert found["length"] == 59 and found["cycle"] == 1


def test_a_pause_between_the_layers_and_the_head_does_not_split_a_token():
    # identical tokens that sync before their final norm as long as between tokens: the pieces (23 and 3 units)
    # lie far apart in length, so one token, not two; and without that sync nothing is split either
    units, gaps = _variant_loop(20, 500.0, odd=False, mid_pause_us=500.0)
    found = _found(units, gaps)
    assert found["length"] == 26 and found["cycle"] == 1 and len(found["starts"]) == 20
    same = _found(*_variant_loop(20, 500.0, odd=False))
    assert same["length"] == 26 and same["cycle"] == 1 and len(same["starts"]) == 20


def _phase_loop(tokens_n, change_at, prefill=True):
    """(units, gaps) of a 2-layer float32 Hugging Face ``generate`` as an H100 ran it: every token 28 launches; a
    copy kernel takes one of three forms by the context's alignment (forms 0, 1, 0, 2 over four tokens) and, from
    token ``change_at`` on, each layer's softmax another specialisation (the keys outgrew it); with ``prefill`` a
    first pass of the same calls whose GEMM is another kernel."""
    units, gaps = [], []
    if prefill:
        step = [0] + ([1, 2, 55, 4, 5, 6, 7, 8, 9, 10, 11, 12] * 2) + [13, 14, 15]
        units += step
        gaps += [50.0] + [3.0] * (len(step) - 1)
    for t in range(tokens_n):
        soft = 20 if t < change_at else 21
        copy = (30, 31, 30, 32)[t % 4]
        step = [0] + ([1, 2, 3, 4, soft, 6, 7, 8, 9, 10, 11, 12] * 2) + [13, copy, 15]
        units += step
        gaps += [50.0] + [3.0] * (len(step) - 1)
    return units, gaps


def test_steps_run_on_through_a_kernel_that_changes_with_the_context():
    # the common sequence (copy form 0, the first softmax) holds only a quarter of the tokens; the tokens after the
    # softmax changed are steps as much as those before (no steps cut off as a suffix), the prefill stays out
    units, gaps = _phase_loop(21, change_at=12)
    found = _found(units, gaps)
    assert found["found"] and found["length"] == 28 and found["prefix"] == 28 and found["suffix"] == 0
    assert found["starts"].tolist() == [28 + 28 * t for t in range(21)]
    # an earlier phase that repeats itself is taken in too: the common sequence now lies after the change
    later = _found(*_phase_loop(24, change_at=4, prefill=False))
    assert later["starts"].tolist() == [28 * t for t in range(24)] and later["prefix"] == 0


@pytest.mark.parametrize("layers", [2, 4, 16])
def test_a_host_sync_in_every_layer_does_not_cut_a_token_into_layers(layers):
    # identical tokens: embedding (0), then per layer its attention (1-6), a host sync as long as the pause
    # between tokens (a router's .item()), its MLP (11-14); LM head and sampling (20-22). The pieces between the
    # pauses lie within 50 % of each other in length (7, 10, ..., 7 units), but they begin with the attention or
    # the MLP, not with the embedding as a token does: one step per token, not per layer
    units, gaps = [50, 51, 52], [3.0] * 3
    for _ in range(20):
        step, pause = [0], [500.0]
        for _ in range(layers):
            step += [1, 2, 3, 4, 5, 6, 11, 12, 13, 14]
            pause += [3.0] * 6 + [400.0] + [3.0] * 3
        units, gaps = units + step + [20, 21, 22], gaps + pause + [3.0] * 3
    found = _found(units, gaps)
    assert found["found"] and found["cycle"] == 1 and found["length"] == 1 + 10 * layers + 3
    assert len(found["starts"]) == 20 and found["matching"].all() and found["prefix"] == 3 and found["suffix"] == 0


def test_a_common_sequence_shorter_than_the_anchors_period_is_read_without_a_split():
    # anchor 1's segments are 1 0 / 1 0 0 0: its common one is 2 units long, yet at the boundary picked the most
    # frequent step is the 1-unit one (0 or 1 alone), ending one unit before the trace does; the host's pause
    # profile over 2 units would read past the last unit
    tokens = [0, 0, 1, 0, 1, 0] * 3
    found = _found(tokens, [500.0, 3.0, 3.0, 3.0, 3.0, 3.0] * 3)
    assert found["found"] and found["cycle"] == 1 and found["length"] == 2
    assert found["starts"].tolist() == [0, 1, 3, 5, 6, 7, 9, 11, 12, 13, 15, 17]
    assert found["ends"].tolist() == [1, 3, 5, 6, 7, 9, 11, 12, 13, 15, 17, 18]


def test_markerless_loop_with_variants_of_two_lengths_is_described(tmp_path):
    layer = ["norm", "gemv_qkv", "rope", "attn", "gemv_o", "add", "norm", "gemv_gate_up", "silu_mul", "gemv_down"]

    def names(i):  # 24 kernels a token, 25 in the odd ones (a copy before the second layer's attention)
        layers = layer[:3] + [f"attn_align{i % 2}"] + layer[4:] + layer[:3] + ["pad_copy"] * (i % 2) + layer[3:]
        return ["embed"] + layers + ["norm", "gemv_lm_head", "argmax"]
    events, want = tg.decode_loop_events(12, names, prefill=["gemm_qkv_prefill"])
    d = _summary(tmp_path, events)["step_detection"]
    assert d["steps"] == 12 and d["units_per_step"] == 24 and (d["cycle"], d["variants"]) == (2, 2), d
    assert d["matching_steps"] == 12
    assert d["description"].startswith("steps: 12, from a repeating 24–25-kernel sequence in 2 variants (units that "
                                       "change from token to token; the same sequence every 2 steps)")


def test_markerless_loop_with_cycling_kernels_is_described(tmp_path):
    def names(i):
        return ["embed", "gemv_qkv", f"attn_align{i % 2}", "gemv_o", "argmax"]
    events, want = tg.decode_loop_events(12, names, prefill=["gemm_qkv_prefill"])
    d = _summary(tmp_path, events)["step_detection"]
    assert d["steps"] == 12 and d["units_per_step"] == 5 and (d["cycle"], d["variants"]) == (2, 2), d
    assert d["matching_steps"] == 12 and d["confidence"] == "high"
    assert d["description"].startswith("steps: 12, from a repeating 5-kernel sequence in 2 variants (units that "
                                       "change from token to token; the same sequence every 2 steps)")


def test_markerless_eager_loop_with_a_different_prefill(tmp_path):
    names = ["embed", "gemv_qkv", "attn_decode", "gemv_o", "argmax"]
    events, want = tg.decode_loop_events(12, names, prefill=["gemm_qkv_prefill", "attn_prefill", "gemm_o_prefill"])
    f = _summary(tmp_path, events)
    d = f["step_detection"]
    assert f["step_marker"] is None and d["method"] == "sequence" and d["steps"] == 12
    assert d["units_per_step"] == 5 and d["prefix_units"] == 3 and d["matching_steps"] == 12
    assert d["confidence"] == "high" and (d["cycle"], d["variants"]) == (1, 1)
    assert d["description"].startswith("steps: 12, from a repeating 5-kernel sequence; confidence high")
    assert "3 launches before the first step left out" in d["description"]
    rows = f["step_rows"]
    # start to start: 5 × (2 + 10) + 50 = 110 µs; the last step ends with its last kernel (5 × 12 = 60 µs)
    assert [r["wall_us"] for r in rows] == [want["step_us"]] * 11 + [60.0]
    assert [r["kernels"] for r in rows] == [5] * 12 and [r["launches"] for r in rows] == [5] * 12
    assert [r["busy_us"] for r in rows] == [50.0] * 12
    steps = f["steps"]
    assert steps["steps"] == 12 and steps["kernels_per_step"] == 5
    # decode window: first kernel of step 0 to the end of the last one, busy 12 × 50 of it
    span = want["step_starts"][-1] + 60 - (want["step_starts"][0] + 2)
    assert steps["bubble_ratio"] == pytest.approx(1 - 600 / span)
    assert f["graphs"] is None


def test_skip_steps_applies_to_found_steps(tmp_path):
    events, _ = tg.decode_loop_events(10, ["a", "b", "c"])
    f = _summary(tmp_path, events, skip_steps=2)
    assert [r["warmup"] for r in f["step_rows"]] == [True, True] + [False] * 8 and f["steps"]["steps"] == 8


def test_graph_launch_steps_and_their_replays(tmp_path):
    events, want = tg.graph_loop_events(6, [("g_a", 1, 4), ("g_b", 6, 3), ("g_c", 10, 2)])
    f = _summary(tmp_path, events)
    d = f["step_detection"]
    assert d["method"] == "cuda-graph" and d["steps"] == 6 and d["graph_launches_per_step"] == 1
    assert d["units_per_step"] == 3  # copy_input, the graph launch, the token's copy (the sync launches nothing)
    assert "from CUDA-graph launches (1 graph launch and 2 other calls per step)" in d["description"]
    rows = f["step_rows"]
    assert [r["kernels"] for r in rows] == [4] * 6 and [r["launches"] for r in rows] == [2] * 6
    # steps start 44 µs apart (graph call at +5, replay to +22, copy to +24, 20 µs on the host)
    assert [r["wall_us"] for r in rows[:-1]] == [44.0] * 5 and rows[-1]["wall_us"] == 24.0
    g = f["graphs"]
    assert g["replays"] == 6 and g["graphs"] == 1 and g["kernels_per_replay"] == 3
    assert g["kernel_share"] == pytest.approx(18 / 24)  # the 6 copy_input kernels run outside the graph
    assert g["busy_us_per_replay"] == 9 and g["span_us_per_replay"] == 11 and g["gap_inside_us_per_replay"] == 2
    assert g["gap_inside_share"] == pytest.approx(2 / 11)
    firsts, lasts = [r[0] for r in want["replays"]], [r[1] for r in want["replays"]]
    assert g["gap_between_us_p50"] == g["gap_between_us_max"] == pytest.approx(firsts[1] - lasts[0]) == 33
    assert g["by_graph"] == [{"first_kernel": "g_a", "kernels": 3, "replays": 6, "busy_us_per_replay": 9.0,
                              "gap_inside_us_per_replay": 2.0}]


def test_graph_replays_are_attributed_in_a_marked_trace_too(tmp_path):
    f = _summary(tmp_path, tg.decode_trace_events())  # step 1 replays g1..g3 from one cudaGraphLaunch
    assert f["step_marker"] == "bubblescope.decode_step" and f["step_detection"]["method"] == "marker"
    g = f["graphs"]
    # kernels [165,170], [171,175], [180,185]: busy 14 of a 20-µs span
    assert g["replays"] == 1 and g["kernels_per_replay"] == 3 and g["busy_us_per_replay"] == 14
    assert g["gap_inside_us_per_replay"] == 6 and g["gap_between_us_p50"] is None


def test_one_kernel_per_step_is_named_a_megakernel(tmp_path):
    ev, t = tg.meta_events(), 0.0
    for i in range(10):  # both launched at once, then the host waits for the token (a sync) and samples 25 µs
        ev += [tg.launch(t, 2, 3 * i + 1), tg.kernel("decode_megakernel", t + 2, 500, 3 * i + 1),
               tg.launch(t + 3, 2, 3 * i + 2), tg.kernel("argmax_small", t + 502, 3, 3 * i + 2),
               tg.api("cudaStreamSynchronize", t + 6, 499, 3 * i + 3)]
        t += 530
    f = _summary(tmp_path, ev)
    d = f["step_detection"]
    assert d["method"] == "megakernel" and d["megakernel"] == "decode_megakernel" and d["steps"] == 10
    assert "one kernel per step (decode_megakernel, 99% of the step's GPU time)" in d["description"]
    assert [r["wall_us"] for r in f["step_rows"][:-1]] == [530.0] * 9


def test_no_repeating_structure_invents_no_steps(tmp_path):
    events, _ = tg.decode_loop_events(1, [f"kernel_{i}" for i in range(30)])
    f = _summary(tmp_path, events)
    assert f["steps"] is None and f["step_rows"] == [] and f["step_detection"]["method"] is None
    assert f["step_detection"]["description"].startswith("steps: none found (no repeating structure in the 30 "
                                                         "launches")
    assert any("whole-trace figures only" in w and "no repeating structure" in w for w in f["warnings"])


def test_a_cpu_only_decode_loop_finds_its_steps_from_the_operators(tmp_path):
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    layers = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    x, tokens = torch.randn(1, 32), 17
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        layers(torch.randn(6, 32))  # the prefill: the same operators on 6 rows
        for _ in range(tokens):
            tok = int(layers(x).argmax())
            x = torch.randn(1, 32) + tok
    path = tmp_path / "cpu.json"
    prof.export_chrome_trace(str(path))
    f = summarize_traces([path])["files"][0]
    d = f["step_detection"]
    assert d["method"] == "cpu-ops" and abs(d["steps"] - tokens) <= 1, d
    assert "top-level CPU ops" in d["description"] and f["steps"]["reason"].startswith("no GPU activity")
    assert len(f["step_rows"]) == d["steps"] and all(r["wall_us"] > 0 for r in f["step_rows"])


def test_reports_name_how_steps_were_found_the_floor_and_the_replays(tmp_path):
    from rich.console import Console

    from bubblescope.reports.trace_html import render_trace_html
    from bubblescope.reports.trace_terminal import render_trace_summary
    from bubblescope.tracediagnose import diagnose_trace_files

    events, _ = tg.graph_loop_events(6, [("g_a<int>", 1, 4), ("g_b", 6, 3), ("g_c", 10, 2)])
    path = tg.write(tmp_path / "g.json", tg.document(events, rank=None))
    summary = diagnose_trace_files([path], bytes_per_step=1_000_000, peak_gbps=100.0)
    findings = summary.pop("findings")
    console = Console(record=True, width=100, color_system=None)
    render_trace_summary(summary, console)
    text = " ".join(console.export_text().split())
    # steps of 44 µs (the last 24 µs: median 44); 1 MB at 100 GB/s: a 10-µs floor
    verdict = "44.0 µs per step, 4.40× the floor of 10.0 µs (34.0 µs above it): 23% of the 100 GB/s peak"
    for part in ("Decode steps (no marker: found from CUDA-graph launches)", "steps: 6, from CUDA-graph launches",
                 f"Bandwidth: {verdict}", "CUDA-graph replays (device 0)", "replays (distinct graphs) │ 6 (1)"):
        assert part in text, part
    html = render_trace_html(summary, findings)
    assert verdict in html and "CUDA-graph replays (device 0)" in html and "steps: 6, from CUDA-graph" in html
    assert "g_a&lt;int&gt;" in html and "g_a<int>" not in html


def test_a_real_markerless_hugging_face_generate_trace_gives_one_step_per_token():
    # bubblescope profile of examples/hf_generate.py --tiny on an H100 (tests/data/h100_hf_generate_provenance.json):
    # the profiler's warm-up step and a 20-step window, 157 launches a token, no markers; a copy kernel cycles
    # over four tokens and the softmax kernel changes after the 12th, so no sequence holds for every token
    path = Path(__file__).parent / "data" / "h100_hf_generate_tiny_markerless.json.gz"
    f = summarize_traces([str(path)], skip_steps=1)["files"][0]
    d = f["step_detection"]
    assert d["method"] == "sequence" and d["steps"] == 21 and d["units_per_step"] == 157, d
    assert (d["prefix_units"], d["suffix_units"], d["coverage"]) == (0, 0, 1.0)
    assert f["steps"]["steps"] == 20  # the window's steps, the profiler's warm-up step left out
