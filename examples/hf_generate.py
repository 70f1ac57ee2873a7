"""Hugging Face ``model.generate`` on a Llama built from its config with random weights (nothing downloaded).

An ordinary user program, with no step marker and nothing of the profiler in it, to run under
``bubblescope profile`` unchanged::

    bubblescope profile --model llama-3.2-1b -- python examples/hf_generate.py             # GPU: bf16, 1B
    bubblescope profile --skip 3 --steps 8 -- python examples/hf_generate.py --tiny        # CPU: fp32, tiny

It greedily generates exactly ``--new-tokens`` tokens (EOS cannot end it early: random weights would stop
anywhere) after a ``--prompt-len`` prompt of seeded random ids, and prints how many it generated and the host
time per token. ``--warmup N`` first runs one untimed ``generate`` of N tokens (CUDA context, cuBLAS handles and
kernel modules load on first use), so the printed time is a warm generation's.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

# Llama-3.2-1B's config.json (meta-llama/Llama-3.2-1B on the Hugging Face hub), the fields that shape the model.
LLAMA_3_2_1B = {"vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                "tie_word_embeddings": True,
                "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                "bos_token_id": 128000, "eos_token_id": 128001}
# A model small enough for a CPU test: the same architecture, 2 layers of width 64.
TINY = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
        "tie_word_embeddings": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="the tiny config (fp32, for a CPU)")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=0, help="tokens of one untimed generate before the timed one")
    args = parser.parse_args()

    dtype = torch.bfloat16 if args.device.startswith("cuda") and not args.tiny else torch.float32
    config = LlamaConfig(**(TINY if args.tiny else LLAMA_3_2_1B))
    config._attn_implementation = "sdpa"
    torch.manual_seed(args.seed)
    torch.set_default_dtype(dtype)
    with torch.device(args.device):  # weights made on the device: a 1B model in well under a second on a GPU
        model = LlamaForCausalLM(config).eval()
    torch.set_default_dtype(torch.float32)
    prompt = torch.randint(0, config.vocab_size, (1, args.prompt_len), device=args.device)
    mask = torch.ones_like(prompt)

    def generate(n):
        return model.generate(prompt, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                              pad_token_id=0)

    with torch.inference_mode():
        if args.warmup > 0:
            generate(args.warmup)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = generate(args.new_tokens)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    new = out.shape[1] - args.prompt_len
    print(f"generated {new} tokens after a {args.prompt_len}-token prompt: {seconds / new * 1e3:.3f} ms/token "
          f"(host time, prefill included)")


if __name__ == "__main__":
    main()
