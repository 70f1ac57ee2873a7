"""Where a fused op-by-op decode step spends its time: per kernel, mean duration and achieved bandwidth.

Builds ``FusedEngine`` over seeded dummy weights (tile sizes and PDL from the options), prefills, captures the
step's CUDA graph, and records ``--steps`` replays with torch.profiler (CUPTI) — back to back, or with ``--loop
greedy`` as ``generate()`` runs them (one step launched ahead, each token copied to the host), whose first kernel's
start lag shows what the step boundary costs. Per kernel name: launches per
step, mean µs; and the step's GPU busy time (the union of kernel intervals) against its span, whose difference is
the time between kernels: the launch, drain and fill bubbles that PDL and a megakernel remove.

Under PDL the kernels overlap (each launches while its predecessor drains), so a kernel's duration counts time
spent waiting for the one before it. What each kernel adds to the step is instead its *marginal* time: the end of
its interval minus the end of the previous kernel's (the kernels of a step depend on one another in launch order,
so these deltas sum to the step's span). ``roles`` gives, per role in the layer (QKV, attention, O-proj, gate/up,
down, LM head, greedy pick), the mean marginal µs, the weight bytes the kernel streams, and bytes ÷ marginal time
in GB/s: the rate the weight stream reaches across that kernel, drain and fill included.

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
    ap.add_argument("--grid-per-sm", type=int, default=None)
    ap.add_argument("--block-s", type=int, default=None)
    ap.add_argument("--token-store", default=None, help="copy or mapped (FusedParams.token_store)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--loop", choices=("replay", "greedy"), default="replay",
                    help="replay: the step's graph back to back; greedy: launch_greedy one step ahead with each "
                         "token copied to the host, as generate() decodes")
    ap.add_argument("--out", default="fused_profile.json")
    args = ap.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile

    from bubblescope.fused_engine import FusedEngine, FusedParams
    from bubblescope.models import dummy_weights, get_preset

    cfg = get_preset(args.model)
    w = dummy_weights(cfg, "cuda", torch.bfloat16, seed=0)
    p = FusedParams()
    for key in ("block_n", "block_k", "fused_reduce", "norm_stats", "pdl_early", "grid_per_sm", "block_s",
                "token_store"):
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
        if args.loop == "replay":
            for _ in range(args.steps):
                eng._graph.replay()
        else:
            eng.launch_greedy(None)
            for _ in range(args.steps - 1):
                eng.launch_greedy(None)
                eng.next_greedy_token()
            eng.next_greedy_token()
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
    doc = {"model": args.model, "pdl": args.pdl, "loop": args.loop, "params": vars(p), "device": torch.cuda.get_device_name(),
           "kernels_per_step": eng.kernels_per_step(), "step_span_us": span / n, "step_busy_us": busy / n,
           "kernels": sorted(rows, key=lambda r: -r["per_step_us"]),
           "roles": marginal_by_role(kernels, plan_roles(eng), role_bytes(cfg, w.dtype.itemsize), n)}
    json.dump(doc, open(args.out, "w"), indent=1)
    print(f"{args.model} pdl={args.pdl} {vars(p)}: span {span / n:.1f} µs/step, busy {busy / n:.1f}, "
          f"between kernels {(span - busy) / n:.1f}")
    for r in doc["kernels"]:
        print(f"  {r['kernel'][:40]:40s} x{r['per_step']:.0f}  {r['mean_us']:.2f} µs  {r['per_step_us']:.1f} µs/step")
    for r in doc["roles"] or []:
        gbps = f"{r['gbps']:.0f} GB/s" if r["gbps"] else ""
        print(f"  {r['role']:12s} x{r['per_step']:.0f}  marginal {r['marginal_us']:.2f} µs  "
              f"start lag {r['start_lag_us']:+.2f} µs  {gbps}")
    return 0


def plan_roles(eng) -> list[str]:
    """The role of each kernel of the engine's step, in launch order (O-proj and down share one kernel)."""
    roles, names = [], {"qkv_rope_kernel": "qkv", "qk_norm_kernel": "qk_norm", "attn_split_kernel": "attention",
                        "attn_reduce_kernel": "attn_reduce", "gateup_kernel": "gate_up", "lmhead_kernel": "lm_head",
                        "argmax_kernel": "argmax"}
    for kernel, *_ in eng._plan:
        name = kernel.fn.__name__
        if name == "matvec_residual_kernel":
            roles.append("down" if roles and roles[-1] == "gate_up" else "o_proj")
        else:
            roles.append(names.get(name, name))
    return roles


def role_bytes(cfg, itemsize: int) -> dict[str, int]:
    """Weight bytes each role streams per launch (matrices only; norms, KV cache and activations left out)."""
    H, I, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    return {"qkv": (cfg.q_size + 2 * cfg.kv_size) * H * itemsize, "o_proj": H * cfg.q_size * itemsize,
            "gate_up": 2 * I * H * itemsize, "down": H * I * itemsize, "lm_head": V * H * itemsize}


def marginal_by_role(kernels: list[dict], roles: list[str], nbytes: dict[str, int], steps: int) -> list[dict] | None:
    """Mean marginal µs per role: each kernel's end minus the previous kernel's end (kernels in start order,
    ``len(roles)`` per step); ``start_lag_us``: its start minus the previous kernel's end (negative: it launched
    while that one ran, as PDL allows). None when the trace's kernel count is not ``steps × len(roles)``."""
    k = len(roles)
    if len(kernels) != steps * k:
        return None
    acc: dict[str, list[float]] = {}
    for i in range(1, len(kernels)):
        prev_end = kernels[i - 1]["ts"] + kernels[i - 1]["dur"]
        e = kernels[i]
        a = acc.setdefault(roles[i % k], [0, 0.0, 0.0])
        a[0] += 1
        a[1] += e["ts"] + e["dur"] - prev_end
        a[2] += e["ts"] - prev_end
    out = []
    for role in dict.fromkeys(roles):
        cnt, marg, lag = acc[role]
        mean = marg / cnt
        b = nbytes.get(role)
        out.append({"role": role, "per_step": roles.count(role), "marginal_us": mean,
                    "per_step_us": mean * roles.count(role), "start_lag_us": lag / cnt, "weight_bytes": b,
                    "gbps": b / mean / 1e3 if b and mean > 0 else None})
    return out


if __name__ == "__main__":
    sys.exit(main())
