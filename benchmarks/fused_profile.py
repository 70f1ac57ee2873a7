"""Where a fused op-by-op decode step spends its time: per kernel, mean duration and achieved bandwidth.

Builds ``FusedEngine`` over seeded dummy weights (tile sizes and PDL from the options), prefills, captures the
step's CUDA graph, and records ``--steps`` replays with torch.profiler (CUPTI). Per kernel name: launches per
step, mean µs, weight bytes per launch where the kernel streams a known matrix, GB/s; and the step's GPU busy time
(the union of kernel intervals) against its span, whose difference is the time between kernels: the launch,
drain and fill bubbles that PDL and a megakernel remove.

    PYTHONPATH=src python3 benchmarks/fused_profile.py --model llama-3.2-1b --pdl --out fused_profile.json
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--pdl", action="store_true")
    ap.add_argument("--block-n", type=int, default=None)
    ap.add_argument("--block-k", type=int, default=None)
    ap.add_argument("--fused-reduce", type=int, default=None)
    ap.add_argument("--norm-stats", default=None)
    ap.add_argument("--pdl-early", type=int, default=None)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default="fused_profile.json")
    args = ap.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile

    from bubblescope.fused_engine import FusedEngine, FusedParams
    from bubblescope.models import dummy_weights, get_preset

    cfg = get_preset(args.model)
    w = dummy_weights(cfg, "cuda", torch.bfloat16, seed=0)
    p = FusedParams()
    for key in ("block_n", "block_k", "fused_reduce", "norm_stats", "pdl_early"):
        if getattr(args, key) is not None:
            setattr(p, key, type(getattr(p, key))(getattr(args, key)))
    eng = FusedEngine(w, max_seq_len=512, pdl=args.pdl, params=p)
    prompt = torch.randint(3, cfg.vocab_size, (128,), generator=torch.Generator().manual_seed(0))
    eng.prefill(prompt)
    eng.decode_greedy(int(prompt[-1]))
    for _ in range(5):
        eng._graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            eng._graph.replay()
        torch.cuda.synchronize()
    import os
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        events = json.load(open(path))["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel" and e.get("ph") == "X"), key=lambda e: e["ts"])
    per = {}
    for e in kernels:
        d = per.setdefault(e["name"], {"launches": 0, "total_us": 0.0})
        d["launches"] += 1
        d["total_us"] += e["dur"]
    n = args.steps
    rows = []
    for name, d in per.items():
        rows.append({"kernel": name.split("_kernel")[0] + "_kernel" if "_kernel" in name else name[:60],
                     "per_step": d["launches"] / n, "mean_us": d["total_us"] / d["launches"],
                     "per_step_us": d["total_us"] / n})
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in kernels]
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in spans:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += (cur_e - cur_s) if cur_e is not None else 0
    span = spans[-1][1] - spans[0][0] if spans else 0
    doc = {"model": args.model, "pdl": args.pdl, "params": vars(p), "device": torch.cuda.get_device_name(),
           "kernels_per_step": eng.kernels_per_step(), "step_span_us": span / n, "step_busy_us": busy / n,
           "kernels": sorted(rows, key=lambda r: -r["per_step_us"])}
    json.dump(doc, open(args.out, "w"), indent=1)
    print(f"{args.model} pdl={args.pdl} {vars(p)}: span {span / n:.1f} µs/step, busy {busy / n:.1f}, "
          f"between kernels {(span - busy) / n:.1f}")
    for r in doc["kernels"]:
        print(f"  {r['kernel'][:40]:40s} x{r['per_step']:.0f}  {r['mean_us']:.2f} µs  {r['per_step_us']:.1f} µs/step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
