"""A few megakernel decode steps on a small config, for compute-sanitizer (memcheck, racecheck) on a GPU.

    compute-sanitizer --tool memcheck python3 benchmarks/sanitize_megakernel.py [gluon|triton|auto ...]
"""

from __future__ import annotations

import sys


def main() -> int:
    import torch

    from bubblescope.generation import generate
    from bubblescope.megakernel_engine import MegakernelEngine, MegakernelParams
    from bubblescope.models import dummy_weights, get_preset

    # The default, and one with every split in use (fused reduction by the last ticket holder), multi-tile
    # GATEUP / LMHEAD tasks and the next-task prefetch.
    busy = MegakernelParams(kv_splits=4, attn_min_chunk=1, lm_blocks=2, gateup_blocks=2, prefetch_next="OPROJ,ATTN")
    impls = sys.argv[1:] or ["auto"]
    for impl in impls:
        for dtype in (torch.float32, torch.bfloat16):
            w = dummy_weights(get_preset("tiny-llama"), "cuda", dtype, seed=0)
            early = MegakernelParams(attn_operands="early")  # (the tensor-core attention's layout: bf16 only)
            # the attention's split switches (Gluon only): the first block's older rows before the wait with the combine's
            # reductions in lanes
            lanes = MegakernelParams(kv_splits=4, attn_min_chunk=1, attn_combine="lanes", attn_new_row="row")
            for variant, params in (("fused", None), ("stages", None), ("fused", busy), ("stages", busy),
                                    ("fused", early), ("fused", lanes)):
                if params is early and (impl != "gluon" or dtype != torch.bfloat16):
                    continue
                if params is lanes and impl != "gluon":
                    continue
                if impl == "gluon" and params is busy:  # Gluon tasks are single tiles; keep its split settings
                    params = MegakernelParams(kv_splits=4, attn_min_chunk=1)
                eng = MegakernelEngine(w, params=params, max_seq_len=32, variant=variant, impl=impl)
                toks = generate(eng, [1, 2, 3, 4], 6, eos_ids=()).tokens
                eng.synchronize_and_check()
                name = ("default" if params is None else "early" if params is early else "lanes" if params is lanes
                        else "busy")
                print(impl, eng.impl, dtype, variant, name, toks, flush=True)
    if "gluon" in impls or "auto" in impls:  # Qwen3's q/k-norm in the tensor-core attention, two K/V blocks per split
        # (a short prompt: the prefill is one launch per token, slow under racecheck)
        from bubblescope.models.config import ModelConfig
        cfg = ModelConfig(name="tiny-qwen3", hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=512,
                          max_position_embeddings=512, tie_word_embeddings=False, qk_norm=True, model_type="qwen3")
        for operands in ("late", "early"):  # the operands converted after / before the wait (row pos patched in)
            eng = MegakernelEngine(dummy_weights(cfg, "cuda", torch.bfloat16, seed=0), max_seq_len=96, impl="gluon",
                                   params=MegakernelParams(kv_splits=2, block_s=32, attn_operands=operands))
            toks = generate(eng, list(range(3, 75)), 6, eos_ids=()).tokens  # 72 positions: 37 per split
            eng.synchronize_and_check()
            print("gluon", cfg.name, eng.compile_info()["gluon"]["attn_layout"], operands, toks, flush=True)
        # the tensor-core matvec (mv_widen=mma): ldmatrix from the swizzled ring, the last down slot a
        # quarter past K (intermediate 1408), the vocabulary ending inside an LM-head tile
        cfg = ModelConfig(name="tiny-mv-mma", hidden_size=512, intermediate_size=1408, num_hidden_layers=2,
                          num_attention_heads=8, num_key_value_heads=2, head_dim=64, vocab_size=1000,
                          max_position_embeddings=64)
        eng = MegakernelEngine(dummy_weights(cfg, "cuda", torch.bfloat16, seed=0), max_seq_len=32, impl="gluon",
                               params=MegakernelParams(mv_widen="mma", max_rows=32))
        toks = generate(eng, [1, 2, 3, 4], 6, eos_ids=()).tokens
        eng.synchronize_and_check()
        print("gluon", cfg.name, eng.compile_info()["gluon"]["mv_widen"], toks, flush=True)
        # the weight stream's TMA loads with and without the L2 evict_first policy (the default:
        # a PTX rewrite, gluon/ptx.py), on a model whose vocabulary ends inside an LM-head tile and whose hidden 384
        # is 1.5 column chunks; run with PYTORCH_NO_CUDA_MEMORY_CACHING=1 so that memcheck sees each tensor's own
        # bounds
        cfg = ModelConfig(name="tiny-odd", hidden_size=384, intermediate_size=640, num_hidden_layers=2,
                          num_attention_heads=6, num_key_value_heads=2, head_dim=64, vocab_size=1000,
                          max_position_embeddings=64)
        for kw in ({"weight_eviction": ""}, {"weight_eviction": "evict_first"}):
            eng = MegakernelEngine(dummy_weights(cfg, "cuda", torch.bfloat16, seed=0), max_seq_len=32, impl="gluon",
                                   params=MegakernelParams(**kw))
            toks = generate(eng, [1, 2, 3, 4], 6, eos_ids=()).tokens
            eng.synchronize_and_check()
            print("gluon", cfg.name, kw, toks, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
