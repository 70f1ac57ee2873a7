"""``bubblescope generate`` as a library call: the streamed text against a greedy loop written here, the last line's
arithmetic, and the engine name ``--engine`` and ``--mode`` give."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
import torch

from bubblescope.errors import BubblescopeError
from bubblescope.generate_command import engine_name, generate_text, summary_line
from bubblescope.generation import GenerationResult, SamplingParams
from bubblescope.models import load_model

from .conftest import STORIES, needs_stories


def _greedy(model: str, prompt: list[int], new: int, **load) -> list[int]:
    """Greedy tokens of the eager reference engine, by hand: prefill, then argmax and decode until ``new`` tokens or
    an EOS id."""
    from bubblescope.reference_engine import ReferenceEngine

    loaded = load_model(model, device=torch.device("cpu"), dtype=torch.float32, seed=0, **load)
    eng = ReferenceEngine(loaded.weights, max_seq_len=len(prompt) + new)
    tokens = [int(torch.argmax(eng.prefill(torch.tensor(prompt))))]
    while len(tokens) < new and tokens[-1] not in loaded.config.eos_token_id:
        tokens.append(int(torch.argmax(eng.decode(tokens[-1]))))
    return tokens


def test_ids_stream_out_as_the_greedy_loop_gives_them():
    """No tokenizer (tiny-llama dummy weights): the prompt and each new id on stdout, separated by spaces; the
    last stderr line names the engine, the device and the weights, and counts the tokens."""
    out, said = io.StringIO(), []
    prompt = [5, 17, 42]
    res = generate_text("tiny-llama", SamplingParams(), prompt_ids=prompt, max_new_tokens=6, device="cpu",
                        out=out, say=said.append)
    tokens = _greedy("tiny-llama", prompt, 6)
    assert res.tokens == tokens
    assert out.getvalue() == " ".join(str(t) for t in prompt + tokens) + "\n"
    assert said[-1].startswith("reference on CPU, dummy weights of tiny-llama: TTFT ")
    assert said[-1].endswith(f", {len(tokens)} tokens")


def test_warmup_runs_whole_untimed_generations_first(monkeypatch):
    """``warmup=2``: two greedy generations of the prompt's full length before the timed one, whose sampled text
    is what it is without them (the sampler's generator untouched)."""
    import bubblescope.generation as gen

    calls, real = [], gen.generate

    def counted(dec, ids, n, *args, **kwargs):
        calls.append((len(ids), n, dict(kwargs)))
        return real(dec, ids, n, *args, **kwargs)

    monkeypatch.setattr(gen, "generate", counted)
    sampling = SamplingParams(temperature=0.8, top_k=20, seed=3)
    runs = []
    for warmup in (0, 2):
        out = io.StringIO()
        generate_text("tiny-llama", sampling, prompt_ids=[5, 17, 42], max_new_tokens=6, device="cpu", warmup=warmup,
                      out=out, say=lambda line: None)
        runs.append(out.getvalue())
    assert [(n, new) for n, new, _ in calls] == [(3, 6), (3, 6), (3, 6), (3, 6)]
    assert calls[1][2] == calls[2][2] == {"eos_ids": ()} and "on_token" in calls[3][2]
    assert runs[0] == runs[1]


@needs_stories
def test_text_streams_out_through_the_tokenizer():
    out, said = io.StringIO(), []
    res = generate_text(str(STORIES), SamplingParams(), prompt="Once upon a time", max_new_tokens=8, device="cpu",
                        out=out, say=said.append)
    loaded = load_model(str(STORIES), device=torch.device("cpu"), dtype=torch.float32, seed=0)
    ids = loaded.tokenizer.encode("Once upon a time", bos=True)
    assert res.tokens == _greedy(str(STORIES), ids, 8)
    assert out.getvalue() == loaded.tokenizer.decode(ids + res.tokens) + "\n"
    assert said[-1].startswith(f"reference on CPU, {loaded.source} weights {loaded.path}: TTFT ")


def test_prompt_checks_come_before_the_model_loads(monkeypatch):
    import bubblescope.models as models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(BubblescopeError, match="--prompt and --prompt-ids: give one of them"):
        generate_text("tiny-llama", SamplingParams(), prompt="hi", prompt_ids=[1], device="cpu", out=io.StringIO(),
                      say=print)
    with pytest.raises(BubblescopeError, match="--mode compile: sets the reference engine's mode"):
        generate_text("tiny-llama", SamplingParams(), engine="megakernel", mode="compile", device="cpu",
                      out=io.StringIO(), say=print)


def test_engine_name_from_engine_and_mode():
    assert engine_name("reference", "eager") == "reference"
    assert engine_name("reference", "compile") == "reference-compile"
    assert engine_name("megakernel", "eager") == "megakernel"
    with pytest.raises(BubblescopeError, match="--mode: unknown mode 'fast'"):
        engine_name("reference", "fast")


@pytest.mark.parametrize("token_ms, tokens, new, speed", [
    # 2 decode steps of 1 and 3 ms: 2.000 ms/token mean, 1000 * 2 / 4 ms = 500.0 tok/s
    ([1.0, 3.0], [7, 8, 9], 3, "decode 2.000 ms/token, 500.0 tok/s, 3 tokens"),
    ([], [7], 1, "no decode step (--max-new-tokens 1: the one token is the prefill's, timed in TTFT), 1 token"),
    ([], [2], 5, "no decode step (the first token was EOS), 1 token"),
])
def test_summary_line(token_ms, tokens, new, speed):
    res = GenerationResult(prompt_ids=[1], tokens=tokens, ttft_ms=2.5, token_ms=token_ms)
    loaded = SimpleNamespace(config=SimpleNamespace(name="tiny-llama"), source="dummy", path=None)
    assert summary_line(res, "megakernel", "CPU", loaded, new, interpreted=True) == (
        f"megakernel on CPU (Triton CPU interpreter: slow by design), dummy weights of tiny-llama: TTFT 2.50 ms, "
        f"{speed}")
