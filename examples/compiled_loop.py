"""A gpt-fast style decode loop: a static KV cache and a ``torch.compile``d ``decode_one_token``, with or without
CUDA graphs, over bubblescope's reference Llama with seeded random weights (nothing downloaded).

An ordinary user program, with no step marker and nothing of the profiler in it, to run under
``bubblescope profile`` unchanged::

    bubblescope profile --model llama-3.2-1b -- python examples/compiled_loop.py --cuda-graphs      # GPU
    bubblescope profile --model llama-3.2-1b -- python examples/compiled_loop.py --no-cuda-graphs
    bubblescope profile --skip 3 --steps 8 -- python examples/compiled_loop.py --no-compile     # CPU, eager

As gpt-fast's ``generate``: the prompt is prefilled eagerly, then each new token is one call of the compiled
``decode_one_token`` (``mode="reduce-overhead"``: inductor's kernels replayed as a CUDA graph; without CUDA
graphs, inductor's default mode), the position advanced outside it. Each token is taken to the host as it is
made, as a server streaming tokens does, so the host time per token is the token's latency. It prints how many
tokens it generated, the host time per token and, after compiling, how many times inductor fell back from CUDA
graphs (``cudagraph_skips``: a graph-less run where graphs were asked for).
"""

from __future__ import annotations

import argparse
import time

import torch

from bubblescope.models.config import get_preset
from bubblescope.models.weights import dummy_weights
from bubblescope.reference_engine.model import Transformer


def decode_one_token(model: Transformer, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """tok, pos: LongTensor (1,) -> the greedy next token, LongTensor (1,)."""
    logits = model(tok, pos)                                                   # (V,)
    return torch.argmax(logits, dim=-1, keepdim=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cuda = torch.cuda.is_available()
    parser.add_argument("--preset", default="llama-3.2-1b" if cuda else "tiny-llama")
    parser.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
                        help="compile with mode='reduce-overhead' (CUDA graphs) or inductor's default mode")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                        help="--no-compile: the same loop eagerly (a CPU run without a C++ compiler's wait)")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--device", default="cuda" if cuda else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    weights = dummy_weights(get_preset(args.preset), device=device, dtype=dtype, seed=args.seed)
    model = Transformer(weights, max_seq_len=args.prompt_len + args.new_tokens).eval()
    step = decode_one_token
    if args.compile:
        mode = "reduce-overhead" if args.cuda_graphs else None
        step = torch.compile(decode_one_token, mode=mode, fullgraph=True)
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    prompt = torch.randint(0, weights.config.vocab_size, (args.prompt_len,), generator=gen).to(device)

    tokens = []
    with torch.inference_mode():
        start = time.perf_counter()
        tok = torch.argmax(model(prompt, torch.arange(args.prompt_len, device=device)), dim=-1, keepdim=True)
        tokens.append(int(tok))
        pos = torch.tensor([args.prompt_len], device=device)
        for _ in range(args.new_tokens - 1):
            tok = step(model, tok, pos).clone()  # the compiled graph's output buffer is reused by the next call
            pos += 1
            tokens.append(int(tok))  # the token on the host, as it is streamed
        seconds = time.perf_counter() - start
    skips = None
    if args.compile:
        from torch._dynamo.utils import counters
        skips = sum(counters["inductor"].get(k, 0) for k in ("cudagraph_skips",))
    print(f"generated {len(tokens)} tokens after a {args.prompt_len}-token prompt: "
          f"{seconds / len(tokens) * 1e3:.3f} ms/token (host time, prefill and compilation included)"
          + (f"; cudagraph_skips {skips}" if skips is not None else ""))


if __name__ == "__main__":
    main()
