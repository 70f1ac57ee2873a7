"""A vocabulary of 1 to 3 ids: the random prompts of diagnose model, tune and --tp drew from [3, vocab_size), which
is empty there (torch.randint raised "random_ from is out of bounds")."""

from __future__ import annotations

import json

import torch

from bubblescope.generation import random_ids

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 172,
          "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 8,
          "rope_theta": 10000.0, "rms_norm_eps": 1e-05, "tie_word_embeddings": True,
          "max_position_embeddings": 64, "hidden_act": "silu", "bos_token_id": 0, "eos_token_id": 0}


def test_random_ids_stay_in_the_vocabulary_and_avoid_the_special_ids_when_there_is_room():
    gen = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    assert random_ids(1, 5, gen()) == [0, 0, 0, 0, 0]  # the only id there is
    assert random_ids(4, 5, gen()) == [3, 3, 3, 3, 3]  # one id past the special ones
    for vocab in (2, 3):
        ids = random_ids(vocab, 300, gen())
        assert set(ids) == set(range(vocab))  # drawn from the whole vocabulary
    ids = random_ids(512, 300, gen())
    assert min(ids) >= 3 and max(ids) < 512
    assert ids == torch.randint(3, 512, (300,), generator=gen()).tolist()  # the prompts of larger models unchanged


def test_diagnose_model_runs_a_three_id_vocabulary(tmp_path):
    from typer.testing import CliRunner

    from bubblescope.cli import app
    cfg = tmp_path / "v3.json"
    cfg.write_text(json.dumps({**CONFIG, "vocab_size": 3}))
    r = CliRunner().invoke(app, ["diagnose", "model", str(cfg), "--engines", "reference", "--device", "cpu",
                                 "--runs", "1", "--warmup", "0", "--prompt-len", "4", "--gen-len", "2",
                                 "--profile-steps", "1", "--format", "json", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["model"]["config"]["vocab_size"] == 3
    assert [e["status"] for e in doc["engines"]] == ["ok"]


def test_tune_runs_a_two_id_vocabulary(tmp_path):
    from typer.testing import CliRunner

    from bubblescope.cli import app
    cfg = tmp_path / "v2.json"
    cfg.write_text(json.dumps({**CONFIG, "vocab_size": 2}))
    r = CliRunner().invoke(app, ["tune", str(cfg), "--knob", "prefetch", "--values", "off", "--steps", "1",
                                 "--contexts", "4", "--device", "cpu", "--format", "json",
                                 "--out", str(tmp_path / "t")])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [(row["value"], row["status"]) for row in doc["rows"]] == [("off", "ok")]
