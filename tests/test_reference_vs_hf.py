"""The reference engine against Hugging Face transformers (the independent oracle), fp32.

Weights are random (our seeded dummy init), written as a Hugging Face checkpoint by transformers'
own ``save_pretrained`` and read back by our loader, so the loader is checked on a real HF directory too.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from bubblescope.generation import generate, teacher_forced_logits  # noqa: E402
from bubblescope.models import ModelConfig, dummy_weights, load_hf_checkpoint  # noqa: E402
from bubblescope.reference_engine import ReferenceEngine  # noqa: E402

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}

CASES = {
    # GQA (4 q heads per kv head), llama3 RoPE scaling whose bands fall inside head_dim, tied head
    "llama-gqa-llama3-tied": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
                                  num_key_value_heads=2, vocab_size=211, rope_theta=10000.0, rope_scaling=LLAMA3,
                                  tie_word_embeddings=True, max_position_embeddings=512),
    # MHA, untied head, plain RoPE
    "llama-mha-untied": dict(hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=4,
                             num_key_value_heads=4, vocab_size=150, tie_word_embeddings=False,
                             max_position_embeddings=512),
    # Qwen2: q/k/v biases
    "qwen2-bias": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=199, rope_theta=1e6, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, attention_bias=True, model_type="qwen2",
                       max_position_embeddings=512),
    # Qwen3: per-head q/k RMSNorm, head_dim != hidden / heads
    "qwen3-qknorm": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32, vocab_size=177, rope_theta=1e6, rms_norm_eps=1e-6,
                         tie_word_embeddings=False, qk_norm=True, model_type="qwen3", max_position_embeddings=512),
}


def _hf_model_and_ours(case: str, tmp_path):
    cfg = ModelConfig(name=case, **CASES[case])
    ours = dummy_weights(cfg, seed=7)
    d = cfg.to_hf_dict()
    d.pop("architectures")
    hf_cfg = transformers.AutoConfig.for_model(**d)
    hf = transformers.AutoModelForCausalLM.from_config(hf_cfg).eval()
    missing, unexpected = hf.load_state_dict(ours.hf_state_dict(), strict=False)
    assert not unexpected and all("lm_head" in m for m in missing)
    if cfg.tie_word_embeddings:
        hf.tie_weights()
    hf.save_pretrained(tmp_path / case, safe_serialization=True)
    loaded = load_hf_checkpoint(tmp_path / case)
    assert loaded.config.qk_norm == cfg.qk_norm and loaded.config.attention_bias == cfg.attention_bias
    return hf, loaded


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers(case, tmp_path):
    hf, weights = _hf_model_and_ours(case, tmp_path)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, weights.config.vocab_size, (9,), generator=g).tolist()
    forced = torch.randint(3, weights.config.vocab_size, (32,), generator=g).tolist()
    eng = ReferenceEngine(weights, max_seq_len=64)
    ours = teacher_forced_logits(eng, prompt, forced)                # (33, V): prefill, then 32 decode steps
    with torch.no_grad():
        ref = hf(torch.tensor([prompt + forced])).logits[0, len(prompt) - 1:]   # (33, V)
    assert ours.shape == ref.shape
    err = (ours - ref).abs().max().item()
    assert err < 1e-4, f"max abs logit error {err}"


@pytest.mark.parametrize("case", ["llama-gqa-llama3-tied", "qwen3-qknorm"])
def test_greedy_tokens_match_transformers(case, tmp_path):
    hf, weights = _hf_model_and_ours(case, tmp_path)
    prompt = [5, 17, 3]
    eng = ReferenceEngine(weights, max_seq_len=80)
    ours = generate(eng, prompt, 64, eos_ids=()).tokens
    # transformers without a cache: a full forward per step, argmax of the last position
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(64):
            ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
    assert ours == ids[len(prompt):]


def test_prefill_equals_decode(tmp_path):
    cfg = ModelConfig(name="t", **CASES["llama-gqa-llama3-tied"])
    w = dummy_weights(cfg, seed=3)
    toks = torch.randint(3, cfg.vocab_size, (12,), generator=torch.Generator().manual_seed(0))
    eng = ReferenceEngine(w, max_seq_len=32)
    eng.reset()
    full = eng.model(toks, torch.arange(12), last_only=False)       # prefill: all 12 positions in one forward
    eng.reset()
    steps = [eng.prefill(toks[:1]).clone()] + [eng.decode(int(t)).clone() for t in toks[1:]]
    assert (torch.stack(steps) - full).abs().max().item() < 1e-4
    assert eng.position == 12


def test_context_buckets_are_powers_of_two_from_256_capped_at_the_cache():
    from bubblescope.reference_engine.engine import kv_bucket

    # position p needs p + 1 cache positions
    assert [kv_bucket(p, 5000) for p in (0, 255, 256, 511, 512, 1023, 1024, 4095, 4096)] == \
        [256, 256, 512, 512, 1024, 1024, 2048, 4096, 5000]
    assert kv_bucket(10, 64) == 64 and kv_bucket(63, 64) == 64


@pytest.mark.parametrize("mode", ["eager", "compile"])
def test_logits_across_a_context_bucket_match_transformers(mode, tmp_path):
    """Decode steps at positions 250-261, on both sides of the 256-position bucket's edge: the compiled steps
    attend over 256, then 300 cache positions (one compilation each), the eager ones over the positions in use."""
    hf, weights = _hf_model_and_ours("llama-gqa-llama3-tied", tmp_path)
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(3, weights.config.vocab_size, (250,), generator=g).tolist()
    forced = torch.randint(3, weights.config.vocab_size, (12,), generator=g).tolist()
    eng = ReferenceEngine(weights, mode=mode, max_seq_len=300)
    ours = teacher_forced_logits(eng, prompt, forced)                # (13, V)
    with torch.no_grad():
        ref = hf(torch.tensor([prompt + forced])).logits[0, len(prompt) - 1:]
    err = (ours - ref).abs().max().item()
    assert err < 1e-4, f"max abs logit error {err}"


def test_prepare_compiles_every_bucket_before_the_steps_that_use_them(tmp_path):
    """``prepare`` compiles the buckets of the decode steps' positions and no other (300-311: the 512-position
    bucket alone, one graph in dynamo's count, not the 256 one the prompt's positions would fall in); the steps
    then compile nothing more, and their logits still match transformers."""
    from torch._dynamo.utils import counters

    hf, weights = _hf_model_and_ours("llama-mha-untied", tmp_path)
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(3, weights.config.vocab_size, (300,), generator=g).tolist()
    forced = torch.randint(3, weights.config.vocab_size, (12,), generator=g).tolist()
    eng = ReferenceEngine(weights, mode="compile", max_seq_len=512)
    start = counters["stats"]["unique_graphs"]
    eng.prepare(len(prompt), len(prompt) + len(forced) - 1)
    before = counters["stats"]["unique_graphs"]
    assert before - start == 1
    eng.reset()
    rows = [eng.prefill(torch.tensor(prompt)).clone()] + [eng.decode(t).clone() for t in forced]
    assert counters["stats"]["unique_graphs"] == before
    with torch.no_grad():
        ref = hf(torch.tensor([prompt + forced])).logits[0, len(prompt) - 1:]
    assert (torch.stack(rows) - ref).abs().max().item() < 1e-4
