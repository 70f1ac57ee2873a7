"""Tensor-parallel reference engine on CPU: two gloo processes against the single-process engine (TP=1).

One ``torch.multiprocessing.spawn`` of two ranks (process start-up dominates, ~6 s) runs every case; each
rank saves what it saw and the parent compares with :class:`ReferenceEngine` run in-process.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch

from bubblescope.errors import BubblescopeError
from bubblescope.generation import generate, teacher_forced_logits
from bubblescope.models import load_llama2c
from bubblescope.models.config import ModelConfig
from bubblescope.models.weights import dummy_weights
from bubblescope.reference_engine import ReferenceEngine
from bubblescope.reference_engine.tp import TPReferenceEngine, check_tp, shard_weights

from .conftest import STORIES

PROMPT, FORCED = [3, 17, 42, 8, 60], [5, 61, 7, 30, 2, 63]  # ids below the smallest vocab (64)
STORY_TOKENS = 40


def _configs() -> dict[str, ModelConfig]:
    # Odd vocabularies make the last LM-head shard padded; GQA group 2; Qwen2 biases; Qwen3 q/k norms + tied head.
    base = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=101, max_position_embeddings=64)
    return {
        "llama": ModelConfig(**base, name="tiny-llama-tp"),
        "qwen2": ModelConfig(**{**base, "vocab_size": 64}, attention_bias=True, model_type="qwen2", name="q2"),
        "qwen3": ModelConfig(**{**base, "vocab_size": 97}, qk_norm=True, head_dim=32, tie_word_embeddings=True,
                             model_type="qwen3", name="q3"),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, port: int, out_dir: str, stories: str | None) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        seen = {}
        for key, cfg in _configs().items():
            eng = TPReferenceEngine(dummy_weights(cfg, seed=7), max_seq_len=32)
            seen[key] = teacher_forced_logits(eng, PROMPT, FORCED)
            eng.reset()
            seen[key + "_all"] = eng.model(torch.tensor(PROMPT), torch.arange(len(PROMPT)), last_only=False).clone()
            seen[key + "_kv_heads"] = eng.model.layers[0].kv_cache.k_cache.shape[1]
            seen["name"] = eng.name
        if stories:
            eng = TPReferenceEngine(load_llama2c(stories), max_seq_len=STORY_TOKENS + 1)
            seen["stories"] = generate(eng, [1], STORY_TOKENS, eos_ids=()).tokens
        torch.save(seen, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def tp2(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp2")
    stories = str(STORIES) if STORIES.is_file() else None
    torch.multiprocessing.spawn(_rank_main, args=(_free_port(), str(out), stories), nprocs=2)
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


@pytest.mark.parametrize("key", ["llama", "qwen2", "qwen3"])
def test_tp2_logits_match_tp1(tp2, key):
    cfg = _configs()[key]
    ref = ReferenceEngine(dummy_weights(cfg, seed=7), max_seq_len=32)
    want = teacher_forced_logits(ref, PROMPT, FORCED)                         # (7, V)
    assert tp2[0][key].shape == want.shape == (len(FORCED) + 1, cfg.vocab_size)
    assert (tp2[0][key] - want).abs().max().item() < 1e-5
    assert torch.equal(tp2[0][key], tp2[1][key])                               # every rank gets the same logits
    ref.reset()
    all_pos = ref.model(torch.tensor(PROMPT), torch.arange(len(PROMPT)), last_only=False)
    assert tp2[0][key + "_all"].shape == (len(PROMPT), cfg.vocab_size)
    assert (tp2[0][key + "_all"] - all_pos).abs().max().item() < 1e-5
    assert tp2[0][key + "_kv_heads"] == cfg.num_key_value_heads // 2           # each rank caches its KV heads
    assert tp2[0]["name"] == "reference-tp2"


def test_tp2_greedy_tokens_match_tp1_stories260k(tp2):
    if not STORIES.is_file():
        pytest.skip(f"{STORIES} not found (../shared is absent and $BUBBLESCOPE_MODELS unset)")
    ref = ReferenceEngine(load_llama2c(STORIES), max_seq_len=STORY_TOKENS + 1)
    want = generate(ref, [1], STORY_TOKENS, eos_ids=()).tokens
    assert len(set(want)) > 5  # a real story, not one token repeated
    assert tp2[0]["stories"] == want and tp2[1]["stories"] == want


def test_shard_shapes_and_padding():
    cfg = _configs()["llama"]
    w = dummy_weights(cfg, seed=1)
    s0, s1 = shard_weights(w, 0, 2), shard_weights(w, 1, 2)
    # head_dim 16: 2 of 4 query heads (32 rows), 1 of 2 KV heads (16 rows), half of 96 MLP rows
    assert s0.layers[0].q_proj.shape == (32, 64) and s0.layers[0].k_proj.shape == (16, 64)
    assert s0.layers[0].o_proj.shape == (64, 32) and s0.layers[0].down_proj.shape == (64, 48)
    assert torch.equal(s1.layers[0].k_proj, w.layers[0].k_proj[16:])
    assert torch.equal(torch.cat([s0.layers[1].o_proj, s1.layers[1].o_proj], 1), w.layers[1].o_proj)
    assert torch.equal(torch.cat([s0.layers[1].up_proj, s1.layers[1].up_proj]), w.layers[1].up_proj)
    assert s1.lm_head.shape == (51, 64) and torch.equal(s1.lm_head[:50], w.lm_head[51:])
    assert not s1.lm_head[50].any()  # padding row past the vocabulary


def test_check_tp_errors():
    cfg = _configs()["llama"]  # 4 heads, 2 KV heads
    with pytest.raises(BubblescopeError, match="num_key_value_heads 2 is not a multiple of 4"):
        check_tp(cfg, 4)
    with pytest.raises(BubblescopeError, match="must be an integer >= 1"):
        check_tp(cfg, 0)
    with pytest.raises(BubblescopeError, match="not initialized"):
        TPReferenceEngine(dummy_weights(cfg))


def _cli(*args):
    from typer.testing import CliRunner

    from bubblescope.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def test_cli_tp_refuses_a_split_before_spawning(tmp_path):
    r = _cli("diagnose", "model", "stories260k", "--tp", "3", "--out", tmp_path / "o")
    assert r.exit_code == 2
    assert r.output.strip() == ("error: --tp 3: stories260k's num_key_value_heads 4 is not a multiple of 3 "
                                "(each rank must hold whole heads and equal MLP slices)")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("option, value, message", [
    ("--runs", 0, "--runs: must be at least 1, got 0"),
    ("--gen-len", 0, "--gen-len: must be at least 2, got 0"),
    ("--prompt-len", 0, "--prompt-len: must be at least 1, got 0"),
    ("--profile-steps", 0, "--profile-steps: must be at least 1, got 0"),
])
def test_cli_tp_refuses_a_bad_workload_before_spawning(tmp_path, monkeypatch, option, value, message):
    """Fresh-user finding: `diagnose model tiny-llama --tp 2 --runs 0` ran torchrun and exited 0 with no
    measurement (and --gen-len 0 silently became the default), where the same options without --tp exit 2."""
    import subprocess

    def spawn(*a, **k):
        raise AssertionError("torchrun was started")

    monkeypatch.setattr(subprocess, "run", spawn)
    r = _cli("diagnose", "model", "tiny-llama", "--tp", "2", option, value, "--out", tmp_path / "o")
    assert r.exit_code == 2, r.output
    assert r.output.strip() == f"error: {message}"
    assert not (tmp_path / "o").exists()


def test_cli_tp2_end_to_end_on_gloo(tmp_path):
    """`diagnose model --tp 2` through torchrun on CPU: tp.json on rank 0, one trace per rank."""
    import json
    import os
    import subprocess
    import sys

    from bubblescope.models.config import get_preset
    from bubblescope.profiler.trace import load_trace
    from bubblescope.profiler.traffic import rank_step_traffic

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "bubblescope", "diagnose", "model", "tiny-llama", "--tp", "2",
                        "--prompt-len", "4", "--gen-len", "4", "--runs", "1", "--profile-steps", "2",
                        "--out", str(tmp_path), "--format", "json"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads((tmp_path / "tp.json").read_text())
    assert json.loads(r.stdout) == doc  # rank 0 prints what it wrote
    (eng,) = doc["engines"]
    assert doc["world_size"] == 2 and eng["name"] == "reference-tp2" and doc["device"]["backend"] == "gloo"
    want = rank_step_traffic(get_preset("tiny-llama"), 4, 4 + 4 // 2, 2)
    assert eng["tp"]["rank_bytes_per_step"] == want["total_bytes"] and eng["tp"]["bus_bytes"] == want["bus_bytes"]
    assert len(eng["latency"]["token_ms_samples"]) == 3  # 4 tokens: the prefill's and 3 decode steps
    ranks = [load_trace(tmp_path / p).rank for p in eng["trace_paths"]]
    assert ranks == [0, 1]  # Kineto wrote each process's rank
