"""Sampling and the token loop, checked against numpy-computed distributions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bubblescope.generation import SamplingParams, generate, sample
from bubblescope.models import dummy_weights, get_preset
from bubblescope.reference_engine import ReferenceEngine

LOGITS = torch.tensor([2.0, 1.0, 0.5, -1.0, 0.0])


def _freqs(params: SamplingParams, n: int = 6000) -> np.ndarray:
    g = torch.Generator().manual_seed(params.seed)
    counts = np.bincount([sample(LOGITS, params, g) for _ in range(n)], minlength=LOGITS.numel())
    return counts / n


def test_greedy_is_argmax():
    assert sample(LOGITS, SamplingParams()) == 0
    assert sample(torch.tensor([0.0, 3.0, 3.0]), SamplingParams()) == 1  # first maximum on ties


def test_temperature_matches_softmax():
    p = np.exp(LOGITS.numpy() / 0.7)
    p /= p.sum()
    assert np.abs(_freqs(SamplingParams(temperature=0.7, seed=1)) - p).max() < 0.025


def test_a_tiny_temperature_is_the_greedy_limit_not_a_nan_crash():
    """--temperature 1e-45 made logits / T overflow to inf and softmax NaN: torch.multinomial raised (a
    traceback). As T -> 0 the softmax puts all mass on the maximum, shared between tied maxima."""
    for t in (1e-45, 1e-30):
        assert _freqs(SamplingParams(temperature=t, seed=4), n=200).tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
        assert _freqs(SamplingParams(temperature=t, top_k=2, top_p=0.5, seed=4), n=50)[0] == 1.0
    g = torch.Generator().manual_seed(5)
    tied = np.bincount([sample(torch.tensor([0.0, 3.0, 3.0]), SamplingParams(temperature=1e-45), g)
                        for _ in range(2000)], minlength=3) / 2000
    assert tied[0] == 0 and abs(tied[1] - 0.5) < 0.05


def test_top_k_and_top_p_truncate_then_renormalize():
    e = np.exp(LOGITS.numpy())
    k2 = np.where(np.isin(np.arange(5), [0, 1]), e, 0)
    assert np.abs(_freqs(SamplingParams(temperature=1.0, top_k=2, seed=2)) - k2 / k2.sum()).max() < 0.025
    # softmax mass sorted: 0.53, 0.19, 0.12, 0.07(id 4), 0.03 -> top_p 0.8 keeps ids 0, 1, 2 (0.53+0.19 < 0.8)
    p = e / e.sum()
    keep = np.isin(np.arange(5), [0, 1, 2])
    assert p[0] + p[1] < 0.8 <= p[0] + p[1] + p[2]
    nucleus = np.where(keep, p, 0)
    assert np.abs(_freqs(SamplingParams(temperature=1.0, top_p=0.8, seed=3)) - nucleus / nucleus.sum()).max() < 0.025


def test_seeded_generation_is_reproducible_and_stops_at_eos():
    cfg = get_preset("tiny-llama")
    eng = ReferenceEngine(dummy_weights(cfg, seed=0), max_seq_len=64)
    p = SamplingParams(temperature=1.0, top_p=0.9, seed=11)
    a = generate(eng, [1, 2, 3], 20, p, eos_ids=()).tokens
    b = generate(eng, [1, 2, 3], 20, p, eos_ids=()).tokens
    assert a == b and len(a) == 20
    greedy = generate(eng, [1, 2, 3], 20, eos_ids=()).tokens
    stop = greedy[5]
    cut = generate(eng, [1, 2, 3], 20, eos_ids=(stop,))
    assert cut.tokens == greedy[:greedy.index(stop) + 1] and cut.stopped_at_eos
    assert len(cut.token_ms) == len(cut.tokens) - 1 and cut.ttft_ms > 0


def test_cache_overflow_is_a_clear_error():
    from bubblescope.errors import BubblescopeError
    eng = ReferenceEngine(dummy_weights(get_preset("tiny-llama")), max_seq_len=8)
    with pytest.raises(BubblescopeError, match="do not fit the KV cache of 8 positions"):
        eng.prefill(torch.arange(9))
    with pytest.raises(BubblescopeError, match="KV cache of 8 positions is full"):
        generate(eng, [1, 2, 3], 10, eos_ids=())


def test_prepare_is_given_the_positions_the_decode_steps_take(tmp_path):
    """generate(), teacher_forced_logits() and the trace capture call the optional ``prepare(first, last)`` hook,
    before the prompt, with exactly the positions their decode steps then run at (seen by ``decode``)."""
    from bubblescope.generation import generate, teacher_forced_logits
    from bubblescope.profiler.capture import capture_decode_trace
    from bubblescope.models import dummy_weights, get_preset
    from bubblescope.reference_engine import ReferenceEngine

    class Spy(ReferenceEngine):
        def __init__(self, weights):
            super().__init__(weights, "eager", 64)
            self.calls, self.seen = [], []

        def prepare(self, first, last):
            self.calls.append((first, last, len(self.seen)))

        def decode(self, token):
            self.seen.append(self.position)
            return super().decode(token)

    eng = Spy(dummy_weights(get_preset("tiny-llama"), seed=0))
    generate(eng, [5, 6, 7], 10, eos_ids=())
    assert eng.calls == [(3, 11, 0)] and eng.seen == list(range(3, 12))
    eng.calls, eng.seen = [], []
    teacher_forced_logits(eng, [5, 6, 7, 8], [9, 10, 11])
    assert eng.calls == [(4, 6, 0)] and eng.seen == [4, 5, 6]
    eng.calls, eng.seen = [], []
    capture_decode_trace(eng, [5, 6, 7], steps=4, warmup=2, out_path=tmp_path / "t.json.gz")
    assert eng.calls == [(3, 8, 0)] and eng.seen == list(range(3, 9))
