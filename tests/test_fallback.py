"""``--engine auto`` and the fallback decoder: a megakernel that gets stuck mid-generation hands the rest of
the generation to the reference, which replays the same history; the tokens must equal an uninterrupted
reference run's (greedy: the reference's own continuation is the independent oracle)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from bubblescope.engines import build_engine  # noqa: E402
from bubblescope.errors import KernelStuck  # noqa: E402
from bubblescope.fallback import FallbackDecoder, choose_auto  # noqa: E402
from bubblescope.generation import SamplingParams, generate  # noqa: E402
from bubblescope.models import load_llama2c  # noqa: E402
from bubblescope.models.weights import dummy_weights  # noqa: E402
from bubblescope.reference_engine import ReferenceEngine  # noqa: E402

from .conftest import STORIES, needs_stories  # noqa: E402
from .test_megakernel_schedule import TINY  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU test: the megakernel under the interpreter")


def _stuck_at(engine, call: int) -> None:
    """Make the megakernel's ``call``-th kernel step (0-based; a stepwise prefill's steps included, a batched
    prefill runs none) really get stuck: one of
    its DOWN tasks then needs one increment more than GATEUP ever makes, as in test_megakernel's stuck test."""
    from bubblescope.megakernel_engine.schedule import F_NEED, F_OP, OP_DOWN
    table = engine._tables[0][1]
    slot = next(i for i in range(table.shape[1]) if table[0, i, F_OP] == OP_DOWN)
    step, calls = engine._step, []

    def step_with_fault(*a, **k):
        if len(calls) == call:
            table[0, slot, F_NEED] += 1
        calls.append(1)
        return step(*a, **k)
    engine._step = step_with_fault


def _fallback(weights, max_seq, stuck_call, prefill="batched"):
    from bubblescope.megakernel_engine import MegakernelEngine
    mk = MegakernelEngine(weights, max_seq_len=max_seq, prefill=prefill)
    _stuck_at(mk, stuck_call)
    return FallbackDecoder(mk, lambda: ReferenceEngine(weights, max_seq_len=max_seq))


@needs_stories
def test_stuck_megakernel_mid_generation_continues_on_reference_without_losing_a_token():
    w = load_llama2c(STORIES)
    prompt = [1, 403, 407, 261]  # 4 prompt tokens, prefilled in one batch: no kernel step
    want = generate(ReferenceEngine(w, max_seq_len=64), prompt, 40, eos_ids=()).tokens
    dec = _fallback(w, 64, stuck_call=20)  # the 21st decode step (at position 4 + 20) gets stuck
    got = generate(dec, prompt, 40, eos_ids=())
    assert got.tokens == want
    assert len(got.fallbacks) == 1
    fb = got.fallbacks[0]
    assert (fb["from"], fb["to"], fb["position"]) == ("megakernel", "reference", 4 + 20)
    assert fb["error"].startswith("KernelStuck: megakernel task stuck: DOWN")
    assert dec.name == "reference" and dec.position == len(prompt) + 39


def test_stuck_in_prefill_and_sampled_decode_replays_on_reference():
    """Sampling path (decode, not decode_greedy): same seeded samples as the reference alone, with the
    failure caught at its own step (strict check)."""
    cfg = TINY["gqa-tied-llama3"]
    w = dummy_weights(cfg, seed=3)
    params = SamplingParams(temperature=0.8, top_k=20, seed=5)
    want = generate(ReferenceEngine(w, max_seq_len=32), [3, 4, 5], 12, params, eos_ids=()).tokens
    for call in (1, 7):  # in the prefill (token by token: kernel steps 0-2), then in the 5th decode step
        dec = _fallback(w, 32, stuck_call=call, prefill="stepwise")
        got = generate(dec, [3, 4, 5], 12, params, eos_ids=())
        assert got.tokens == want, call
        assert [f["position"] for f in got.fallbacks] == [0 if call < 3 else call]


class _LaunchFails:
    """A primary whose kernel launch fails at decode step ``k`` (what a CUDA or Triton launch error raises)."""

    def __init__(self, inner, k):
        self.inner, self.k, self.name = inner, k, "fake-fused"
        self.config, self.device = inner.config, inner.device

    @property
    def position(self):
        return self.inner.position

    def reset(self):
        self.inner.reset()

    def prefill(self, ids):
        return self.inner.prefill(ids)

    def decode(self, tok):
        if self.inner.position == self.k:
            raise RuntimeError("CUDA error: unspecified launch failure\nmore lines")
        return self.inner.decode(tok)


def test_launch_error_falls_back_and_is_recorded_once():
    w = dummy_weights(TINY["mha-untied"], seed=2)
    want = generate(ReferenceEngine(w, max_seq_len=32), [7, 8], 10, eos_ids=()).tokens
    dec = FallbackDecoder(_LaunchFails(ReferenceEngine(w, max_seq_len=32), k=5),
                          lambda: ReferenceEngine(w, max_seq_len=32))
    got = generate(dec, [7, 8], 10, eos_ids=())
    assert got.tokens == want
    assert got.fallbacks == [{"from": "fake-fused", "to": "reference", "position": 5,
                              "error": "RuntimeError: CUDA error: unspecified launch failure"}]
    again = generate(dec, [7, 8], 10, eos_ids=())  # sticky: the next generation runs on the reference alone
    assert again.tokens == want and again.fallbacks == []


def test_auto_on_cpu_picks_the_reference_and_says_why():
    w = dummy_weights(TINY["mha-untied"])
    name, reason = choose_auto(w)
    assert name == "reference" and "no CUDA device" in reason
    # Fresh-user finding: the reason said "name --engine megakernel", an option `diagnose model` does not have
    # (it takes --engines); the hint now fits both commands.
    assert reason.endswith("; ask for megakernel instead of auto to run it anyway") and "--engine" not in reason
    dec = build_engine("auto", w, 16)
    assert dec.name == "reference" and dec.auto_choice == {"engine": "reference", "reason": reason}


@needs_stories
def test_generate_cli_engine_auto_reports_the_choice():
    from typer.testing import CliRunner

    from bubblescope.cli import app
    r = CliRunner().invoke(app, ["generate", str(STORIES), "--prompt-ids", "1", "--max-new-tokens", "8",
                                 "--engine", "auto"])
    assert r.exit_code == 0, r.output
    assert "engine auto: reference (no CUDA device" in r.output


def test_diagnose_engines_auto_measures_the_reference_when_the_chosen_megakernel_fails(monkeypatch, tmp_path):
    """As on a GPU where auto picks the megakernel and it gets stuck: the failed entry stays, and the reference
    is measured next with a ``fallback`` naming the failure."""
    import bubblescope.fallback as fb
    from bubblescope.diagnosis import diagnose
    from bubblescope.megakernel_engine import MegakernelEngine

    monkeypatch.setattr(fb, "choose_auto", lambda w: ("megakernel", "test: as on a GPU"))

    def stuck(self, *a, **k):
        raise KernelStuck("megakernel task stuck: DOWN layer 0 (injected)")
    monkeypatch.setattr(MegakernelEngine, "_step", stuck)
    res = diagnose("tiny-llama", engines=["auto"], prompt_len=4, gen_len=4, runs=1, warmup=0, context_sweep=[],
                   profile_steps=2, out=tmp_path, write=False)
    mk, ref = res.engines
    assert (mk["name"], mk["status"], mk["auto"]["reason"]) == ("megakernel", "failed", "test: as on a GPU")
    assert ref["name"] == "reference" and ref["status"] == "ok"
    assert ref["fallback"] == {"from": "megakernel", "error": "KernelStuck: megakernel task stuck: DOWN layer 0 "
                                                             "(injected)"}
    assert "--engines auto: megakernel (test: as on a GPU)" in res.doc["device"]["notes"]
    from bubblescope.reports.results import validate_results
    assert validate_results(res.doc) == []


def test_auto_falls_back_to_the_reference_when_the_megakernel_cannot_be_built(monkeypatch):
    import bubblescope.engines as engines
    import bubblescope.fallback as fb
    from bubblescope.errors import EngineUnavailable

    monkeypatch.setattr(fb, "choose_auto", lambda w: ("megakernel", "test: as on a GPU"))
    real = engines.get_engine_spec

    def spec(name):
        s = real(name)
        if name != "megakernel":
            return s

        def unavailable(*a, **k):
            raise EngineUnavailable("timeline kernel fits 0 programs per SM")
        return type(s)(s.name, s.description, unavailable)
    monkeypatch.setattr(engines, "get_engine_spec", spec)
    dec = build_engine("auto", dummy_weights(TINY["mha-untied"]), 16)
    assert dec.name == "reference"
    assert dec.auto_choice["reason"] == ("the megakernel could not be built here (EngineUnavailable: timeline kernel "
                                         "fits 0 programs per SM)")


def test_fallback_decoder_does_not_forward_launching_ahead():
    """Steps launched ahead would bypass the history replayed on a failure: generate() must take the stepwise
    path through a FallbackDecoder (hasattr false), even over an engine that can launch ahead."""
    from bubblescope.fallback import FallbackDecoder

    class Ahead:
        name, config, device, position = "x", None, torch.device("cpu"), 0

        def launch_greedy(self, token):  # pragma: no cover - must not be reached
            raise AssertionError

    dec = FallbackDecoder(Ahead(), make_backup=lambda: None)
    assert not any(hasattr(dec, a) for a in ("launch_greedy", "next_greedy_token", "discard_queued"))
