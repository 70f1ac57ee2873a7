"""Rank body of ``test_gpu_tp.py``, started by torchrun (as ``bubblescope diagnose model --tp`` starts its ranks):
eager and CUDA-graph TP greedy tokens and teacher-forced logits of a small float32 config, saved per rank.

Not a test module (no ``test_`` prefix): ``python -m torch.distributed.run --standalone --nproc-per-node 2
tests/tp_gpu_worker.py OUT_DIR``.
"""

from __future__ import annotations

import faulthandler
import sys

import torch
import torch.distributed as dist

from bubblescope.generation import generate, teacher_forced_logits
from bubblescope.models import dummy_weights
from bubblescope.models.config import ModelConfig
from bubblescope.reference_engine.tp import TPReferenceEngine, init_distributed

CFG = ModelConfig(hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=4, vocab_size=4099, max_position_embeddings=512, name="tp-gpu")
PROMPT = list(range(5, 37))


def main(out: str) -> None:
    faulthandler.dump_traceback_later(150, exit=True)  # a hung collective prints where each rank is
    rank, _, dev = init_distributed()
    try:
        w = dummy_weights(CFG, str(dev), torch.float32, seed=3)
        seen = {}
        for mode in ("eager", "cudagraph"):
            eng = TPReferenceEngine(w, mode, 128)
            seen[mode] = generate(eng, PROMPT, 64, eos_ids=()).tokens
            seen[mode + "_logits"] = teacher_forced_logits(eng, PROMPT, seen[mode][:16]).cpu()
        torch.save(seen, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
