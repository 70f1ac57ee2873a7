"""A few decode steps of the fused op-by-op engines on small configs, for compute-sanitizer on a GPU.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_fused.py

Each case generates 8 greedy tokens with ``reference-fused`` (CUDA graph) and, on sm_90+, ``reference-fused-pdl``
(CUDA graph + Programmatic Dependent Launch), with the fused attention reduction off and on, and prints them
beside the reference engine's: memcheck finds out-of-bounds accesses of the masked tiles (odd hidden and
intermediate sizes, a vocabulary ending inside a program's rows), racecheck shared-memory hazards.
"""

from __future__ import annotations

import sys


def main() -> int:
    import torch

    from bubblescope.fused_engine import FusedEngine, FusedParams
    from bubblescope.generation import generate
    from bubblescope.models import dummy_weights, get_preset
    from bubblescope.models.config import ModelConfig
    from bubblescope.reference_engine import ReferenceEngine

    odd = ModelConfig(name="tiny-odd", hidden_size=384, intermediate_size=640, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, head_dim=64, vocab_size=1000,
                      max_position_embeddings=64)
    qwen3 = ModelConfig(name="tiny-qwen3", hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=512,
                        max_position_embeddings=512, tie_word_embeddings=False, qk_norm=True, model_type="qwen3")
    pdl = [False] + ([True] if torch.cuda.get_device_capability()[0] >= 9 else [])
    bad = 0
    for cfg in (get_preset("tiny-llama"), odd, qwen3):
        w = dummy_weights(cfg, "cuda", torch.bfloat16, seed=0)
        want = generate(ReferenceEngine(w, max_seq_len=48), list(range(3, 30)), 8, eos_ids=()).tokens
        for use_pdl in pdl:
            for fused_reduce in (False, True):
                eng = FusedEngine(w, max_seq_len=48, pdl=use_pdl,
                                  params=FusedParams(block_n=16, block_k=256, splits=4, fused_reduce=fused_reduce))
                got = generate(eng, list(range(3, 30)), 8, eos_ids=()).tokens
                torch.cuda.synchronize()
                bad += got != want
                print(cfg.name, f"pdl={use_pdl}", f"fused_reduce={fused_reduce}", got, "== reference" if got == want
                      else f"!= reference {want}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
