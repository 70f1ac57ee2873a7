"""The process Nsight Compute profiles for ``benchmarks/run.py --suite counters``: a Gluon megakernel on a preset's random bf16
weights, a 4-token prefill then greedy decode steps, with the ``MegakernelParams`` fields given as JSON.

    ncu ... python3 benchmarks/ncu_target.py llama-3.2-1b '{"attn_new_row": "block"}' [steps]

Kept to the engine API every version of the source has (``build_engine``, ``prefill``, ``decode_greedy``), so the
same script can run against an older commit's ``src`` (``PYTHONPATH``) for a contrast.
"""
from __future__ import annotations

import json
import sys


def main() -> None:
    import torch

    from bubblescope.engines import build_engine
    from bubblescope.megakernel_engine import MegakernelParams
    from bubblescope.models.config import get_preset
    from bubblescope.models.weights import dummy_weights
    model, params = sys.argv[1], json.loads(sys.argv[2] if len(sys.argv) > 2 else "{}")
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 32
    w = dummy_weights(get_preset(model), device="cuda", dtype=torch.bfloat16, seed=0)
    eng = build_engine("megakernel-gluon", w, 512, params=MegakernelParams(**params))
    eng.prefill(torch.tensor([1, 2, 3, 4], device="cuda"))
    tok = 5
    for _ in range(steps):
        tok = eng.decode_greedy(tok)
    torch.cuda.synchronize()
    print(json.dumps({"model": model, "params": params, "steps": steps, "last_token": tok,
                      "compile": eng.compile_info()}, default=str)[:2000])


if __name__ == "__main__":
    main()
