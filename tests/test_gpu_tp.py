"""Two-GPU checks of the tensor-parallel reference engine over NCCL (skipped without two CUDA devices).

Eager and CUDA-graph TP=2 on a small float32 config must give TP=1's greedy tokens, and the graph replay (the
step's all-reduces and the logits all-gather captured inside it) must give the eager TP=2 logits (within 1e-5).
NVLink multicast stays off (NCCL_NVLS_ENABLE=0) as the device notes ask.
"""

from __future__ import annotations

import os

import pytest
import torch

from bubblescope.generation import generate, teacher_forced_logits
from bubblescope.models import dummy_weights
from bubblescope.models.config import ModelConfig
from bubblescope.reference_engine import ReferenceEngine

from .test_tp import _free_port

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")]

CFG = ModelConfig(hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=4, vocab_size=4099, max_position_embeddings=512, name="tp-gpu")
PROMPT = list(range(5, 37))


def _rank(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from bubblescope.reference_engine.tp import TPReferenceEngine

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        w = dummy_weights(CFG, f"cuda:{rank}", torch.float32, seed=3)
        seen = {}
        for mode in ("eager", "cudagraph"):
            eng = TPReferenceEngine(w, mode, 128)
            seen[mode] = generate(eng, PROMPT, 64, eos_ids=()).tokens
            seen[mode + "_logits"] = teacher_forced_logits(eng, PROMPT, seen[mode][:16])
        torch.save(seen, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_tp2_nccl_eager_and_cudagraph_match_tp1(tmp_path):
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    torch.multiprocessing.spawn(_rank, args=(_free_port(), str(tmp_path)), nprocs=2)
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    w = dummy_weights(CFG, "cuda:0", torch.float32, seed=3)
    want = generate(ReferenceEngine(w, "eager", 128), PROMPT, 64, eos_ids=()).tokens
    assert got[0]["eager"] == want and got[1]["eager"] == want
    assert got[0]["cudagraph"] == want
    assert (got[0]["cudagraph_logits"] - got[0]["eager_logits"]).abs().max().item() < 1e-5
