"""Tile sizes of the fused op-by-op engine, timed as pure CUDA-graph replays (no host in the loop).

For each model and each (block_n, block_k, num_warps, pdl, early trigger, L2 prefetch, …) in the grid: build ``FusedEngine`` over seeded dummy
weights, prefill ``--prompt-len`` random tokens, then time ``--steps`` graph replays (each one decode step whose
greedy token feeds the next on the device) between CUDA events, ``--rounds`` times, interleaving the configs so
clock drift hits all alike. Reports the median ms per step, the effective bandwidth of the step's bytes
(``profiler.traffic``) against the NVML peak, and whether the greedy tokens equal the default config's.

    PYTHONPATH=src python3 benchmarks/fused_sweep.py --models llama-3.2-1b --out fused_sweep.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="llama-3.2-1b")
    ap.add_argument("--block-n", default="2,4,8")
    ap.add_argument("--block-k", default="1024,2048")
    ap.add_argument("--warps", default="4")
    ap.add_argument("--pdl", default="0,1")
    ap.add_argument("--fused-reduce", default="1")
    ap.add_argument("--norm-stats", default="reload")
    ap.add_argument("--down-block-k", default="0,4096", help="the down projection's columns per tile (0: --block-k)")
    ap.add_argument("--pdl-early", default="0,1", help="with PDL, let the next kernel launch at the first instruction")
    ap.add_argument("--prefetch-o", default="0", help="the attention kernel pulls the O-projection into L2")
    ap.add_argument("--prefetch-gateup-kb", default="0", help="… and this many KB of the gate and of the up matrix")
    ap.add_argument("--grid-per-sm", default="0", help="O-proj, gate/up and down as persistent grids of N programs "
                    "per SM (0: one program per row block)")
    ap.add_argument("--block-s", default="16", help="KV positions per attention block")
    ap.add_argument("--variants", default="",
                    help="FusedParams overrides tried on every config above, ';' between variants, ',' between "
                         "key=value pairs (an empty variant: none), e.g. ';splits=1,block_s=64;gateup_warps=8'")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-seconds", type=float, default=300)
    ap.add_argument("--out", default="fused_sweep.json")
    args = ap.parse_args(argv)

    import torch

    from bubblescope.fused_engine import FusedEngine, FusedParams
    from bubblescope.models import dummy_weights, get_preset
    from bubblescope.profiler.hardware import device_info
    from bubblescope.profiler.traffic import step_traffic

    deadline = time.time() + args.max_seconds
    info = device_info("cuda:0")
    ints = lambda s: [int(v) for v in s.split(",") if v]  # noqa: E731
    grid = list(itertools.product(ints(args.block_n), ints(args.block_k), ints(args.warps), ints(args.pdl),
                                  ints(args.fused_reduce), args.norm_stats.split(","), ints(args.down_block_k),
                                  ints(args.pdl_early), ints(args.prefetch_o), ints(args.prefetch_gateup_kb),
                                  ints(args.grid_per_sm), ints(args.block_s)))
    grid = [g for g in grid if g[3] or not g[7]]   # the early trigger only exists with PDL
    value = lambda t: int(t) if t.strip().lstrip("-").isdigit() else t.strip()  # noqa: E731
    variants = [dict((kv.split("=")[0].strip(), value(kv.split("=")[1])) for kv in v.split(",") if kv.strip())
                for v in args.variants.split(";")]
    grid = [(*g, v) for g in grid for v in variants]
    doc = {"benchmark": "fused_sweep", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "commit": os.environ.get("BUBBLESCOPE_COMMIT"), "device": info.get("name"),
           "nvml_peak_GBps": info.get("nvml_peak_GBps"), "versions": {"torch": torch.__version__,
                                                                    "triton": info.get("triton_version")},
           "steps": args.steps, "rounds": args.rounds, "models": {}}
    for model in args.models.split(","):
        cfg = get_preset(model)
        w = dummy_weights(cfg, "cuda", torch.bfloat16, seed=0)
        prompt = torch.randint(3, cfg.vocab_size, (args.prompt_len,), generator=torch.Generator().manual_seed(0))
        max_seq = args.prompt_len + args.steps * args.rounds + 64
        traffic = step_traffic(cfg, 2, args.prompt_len + args.steps * args.rounds // 2)
        engines, rows = {}, {}
        for bn, bk, nw, pdl, fr, ns, dk, early, pfo, pfgu, gps, bs, var in grid:
            key = (f"n{bn}_k{bk}_w{nw}_pdl{pdl}{'e' if early else ''}_fr{fr}_{ns}_dk{dk}_pf{pfo}-{pfgu}_g{gps}_s{bs}"
                   + "".join(f"_{k}{v}" for k, v in var.items()))
            rows[key] = {"block_n": bn, "block_k": bk, "num_warps": nw, "pdl": bool(pdl), "pdl_early": bool(early),
                         "fused_reduce": bool(fr), "norm_stats": ns, "down_block_k": dk, "prefetch_o": bool(pfo),
                         "prefetch_gateup_kb": pfgu, "grid_per_sm": gps, "block_s": bs, **var, "variant": var}
            try:
                eng = FusedEngine(w, max_seq_len=max_seq, pdl=bool(pdl),
                                  params=FusedParams(**{**dict(block_n=bn, block_k=bk, num_warps=nw,
                                                               fused_reduce=bool(fr), norm_stats=ns, down_block_k=dk,
                                                               pdl_early=bool(early), prefetch_o=bool(pfo),
                                                               prefetch_gateup_kb=pfgu, grid_per_sm=gps, block_s=bs),
                                                        **var}))
                eng.prefill(prompt)
                eng.decode_greedy(int(prompt[-1]))          # compiles and captures
                engines[key] = eng
                rows[key]["ms"] = []
            except Exception as e:  # a config that does not compile or fit is recorded, not fatal
                rows[key]["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            if time.time() > deadline:
                break
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for r in range(args.rounds):
            for key, eng in engines.items():
                eng.prefill(prompt)
                eng.decode_greedy(int(prompt[-1]))
                for _ in range(3):
                    eng._graph.replay()
                torch.cuda.synchronize()
                start.record()
                for _ in range(args.steps):
                    eng._graph.replay()
                end.record()
                torch.cuda.synchronize()
                rows[key]["ms"].append(start.elapsed_time(end) / args.steps)
        ref_tokens = None
        for key, eng in engines.items():  # the greedy chain of a fresh prefill: every config must pick the same
            eng.prefill(prompt)
            t, toks = int(prompt[-1]), []
            for _ in range(16):
                t = eng.decode_greedy(t)
                toks.append(t)
            ref_tokens = ref_tokens or toks
            row = rows[key]
            row["ms_p50"] = statistics.median(row["ms"])
            row["GBps"] = traffic["total_bytes"] / row["ms_p50"] / 1e6
            row["util_peak"] = row["GBps"] / info["nvml_peak_GBps"] if info.get("nvml_peak_GBps") else None
            row["tokens_equal_first_config"] = toks == ref_tokens
            row["kernels_per_step"] = eng.kernels_per_step()
        doc["models"][model] = {"bytes_per_step": traffic["total_bytes"], "configs": rows}
        best = sorted((r for r in rows.values() if "ms_p50" in r), key=lambda r: r["ms_p50"])
        for r in best[:8]:
            print(f"{model} n{r['block_n']} k{r['block_k']} w{r['num_warps']} pdl{int(r['pdl'])}"
                  f"{'e' if r['pdl_early'] else ''} "
                  f"fr{int(r['fused_reduce'])} {r['norm_stats']} dk{r['down_block_k']} "
                  f"pf{int(r['prefetch_o'])}-{r['prefetch_gateup_kb']} g{r['grid_per_sm']} s{r['block_s']} "
                  f"{r['variant'] or ''}: "
                  f"{r['ms_p50']:.4f} ms  {100 * (r['util_peak'] or 0):.1f}% peak  same={r['tokens_equal_first_config']}",
                  flush=True)
        for r in rows.values():
            if "error" in r:
                print(f"{model} n{r['block_n']} k{r['block_k']} w{r['num_warps']} pdl{int(r['pdl'])}: {r['error']}")
        del engines, w
        torch.cuda.empty_cache()
        Path(args.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
