"""Gluon megakernel check on the H200: correctness against the reference, then the intra-kernel timeline.

Sections (each in this process; run the script under ``timeout`` — a wrong ring accounting would hang in an
mbarrier wait, which has no timeout):

* ``stories``: stories260K fp32, ``--tokens`` greedy tokens, ``megakernel-gluon`` vs ``reference`` (eager).
* ``tiny``: tiny random fp32 configs (GQA, Qwen2 biases, untied head, Qwen3 q/k-norm with head_dim 128 and
  QKV tiles of part of a head), teacher-forced 40 random tokens: max abs logit error vs the reference.
* ``llama``: ``--model`` (default llama-3.2-1b; e.g. qwen3-0.6b) dummy bf16, ``--steps`` teacher-forced random
  tokens: argmax agreement with the bf16 reference, relative logit error of each against an fp32 reference on
  the same weights.
* ``timeline``: ``--model``: the Gluon kernel's per-task stamps for one step at ``--context``: wait ratio, per-opcode busy
  / wait (µs of program time), producer lead (first weight load issued before the task's consumer start).

Writes JSON (``--out``) after every section.
``PYTHONPATH=src python3 benchmarks/gluon_check.py --out runs/gluon_check.json``
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def section_stories(args, out):
    import torch

    from bubblescope.engines import build_engine
    from bubblescope.generation import generate
    from bubblescope.models import load_llama2c
    w = load_llama2c(args.stories, device="cuda", dtype=torch.float32)
    ref = build_engine("reference", w, 512)
    mk = build_engine("megakernel-gluon", w, 512, params=_params(args))
    prompt = [1, 403, 407, 261, 378]
    a = generate(ref, prompt, args.tokens, eos_ids=()).tokens
    b = generate(mk, prompt, args.tokens, eos_ids=()).tokens
    first = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
    out["stories"] = {"tokens": len(a), "identical": a == b, "first_mismatch": first, "compile": mk.compile_info()}


def _params(args):
    from bubblescope.megakernel_engine import MegakernelParams
    return MegakernelParams(**json.loads(args.params))


def _teacher_forced(engine, ids):
    import torch
    logits = [engine.prefill(torch.tensor(ids[:1])).float().cpu().clone()]
    for t in ids[1:]:
        logits.append(engine.decode(int(t)).float().cpu().clone())
    return torch.stack(logits)


def section_tiny(args, out):
    import torch

    from bubblescope.engines import build_engine
    from bubblescope.models.config import ModelConfig
    from bubblescope.models.weights import dummy_weights
    res = {}
    cfgs = {
        "gqa": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
                    num_key_value_heads=2, vocab_size=1000, tie_word_embeddings=True),
        "qwen2-bias-untied": dict(model_type="qwen2", hidden_size=256, intermediate_size=384, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=4, vocab_size=777, attention_bias=True,
                                  tie_word_embeddings=False),
        "qwen3-qknorm-d128": dict(model_type="qwen3", hidden_size=256, intermediate_size=384, num_hidden_layers=2,
                                  num_attention_heads=8, num_key_value_heads=4, head_dim=128, qk_norm=True,
                                  vocab_size=555, tie_word_embeddings=False),
    }
    for name, kw in cfgs.items():
        cfg = ModelConfig(name=name, max_position_embeddings=512, **kw)
        w = dummy_weights(cfg, device="cuda", dtype=torch.float32, seed=1)
        g = torch.Generator().manual_seed(2)
        ids = torch.randint(0, cfg.vocab_size, (40,), generator=g).tolist()
        ref = _teacher_forced(build_engine("reference", w, 512), ids)
        try:  # a params switch a model does not support (e.g. attn_layout=warps with q/k-norm) skips that one
            mk = _teacher_forced(build_engine("megakernel-gluon", w, 512, params=_params(args)), ids)
        except Exception as e:
            res[name] = {"error": f"{type(e).__name__}: {e}"[-400:]}
            continue
        res[name] = {"max_abs": float((ref - mk).abs().max()), "rel": _rel(mk, ref),
                     "argmax_agree": float((ref.argmax(-1) == mk.argmax(-1)).float().mean())}
    out["tiny"] = res


def section_llama(args, out):
    import torch

    from bubblescope.engines import build_engine
    from bubblescope.models.config import get_preset
    from bubblescope.models.weights import dummy_weights
    cfg = get_preset(args.model)
    w = dummy_weights(cfg, device="cuda", dtype=torch.bfloat16, seed=0)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, cfg.vocab_size, (args.steps,), generator=g).tolist()
    mk_eng = build_engine("megakernel-gluon", w, 1024, params=_params(args))
    mk = _teacher_forced(mk_eng, ids)
    info = mk_eng.compile_info()
    del mk_eng
    ref = _teacher_forced(build_engine("reference", w, 1024), ids)
    w32 = dummy_weights(cfg, device="cuda", dtype=torch.float32, seed=0)
    f32 = _teacher_forced(build_engine("reference", w32, 1024), ids)
    out["llama"] = {"model": args.model, "steps": len(ids), "argmax_agree_vs_bf16_ref": float((ref.argmax(-1) == mk.argmax(-1)).float().mean()),
                    "argmax_agree_vs_fp32": float((f32.argmax(-1) == mk.argmax(-1)).float().mean()),
                    "rel_err_mk_vs_fp32": _rel(mk, f32), "rel_err_ref_vs_fp32": _rel(ref, f32),
                    "max_rel_err_mk_vs_fp32_per_step": max(_rel(mk[k], f32[k]) for k in range(len(ids))),
                    "max_rel_err_ref_vs_fp32_per_step": max(_rel(ref[k], f32[k]) for k in range(len(ids))),
                    "argmax_agree_ref_vs_fp32": float((f32.argmax(-1) == ref.argmax(-1)).float().mean()),
                    "mismatches": _mismatches(mk, ref, f32), "compile": info}


def _mismatches(mk, ref, f32):
    """Where the megakernel's argmax differs from the bf16 reference's: the fp32 model's top-1 − top-2 logit margin
    there, and each bf16 engine's largest |logit − fp32 logit| at that step (a flip is rounding when the margin is
    below the errors)."""
    top2 = f32.float().topk(2, dim=-1).values
    margin = (top2[:, 0] - top2[:, 1])
    err_mk = (mk.float() - f32.float()).abs().amax(-1)
    err_ref = (ref.float() - f32.float()).abs().amax(-1)
    idx = (mk.argmax(-1) != ref.argmax(-1)).nonzero().flatten().tolist()
    return {"steps": idx, "fp32_margin": [round(float(margin[k]), 5) for k in idx],
            "max_abs_err_mk": [round(float(err_mk[k]), 5) for k in idx],
            "max_abs_err_ref": [round(float(err_ref[k]), 5) for k in idx],
            "fp32_margin_p50_all": round(float(margin.median()), 5),
            "max_abs_err_ref_p50_all": round(float(err_ref.median()), 5),
            "max_abs_err_mk_p50_all": round(float(err_mk.median()), 5)}


def section_timeline(args, out):
    import torch

    from bubblescope.engines import build_engine
    from bubblescope.megakernel_engine.timeline import intrakernel_summary
    from bubblescope.models.config import get_preset
    from bubblescope.models.weights import dummy_weights
    cfg = get_preset(args.model)
    w = dummy_weights(cfg, device="cuda", dtype=torch.bfloat16, seed=0)
    res = {"model": args.model}
    runs = [("megakernel-gluon", None), ("megakernel-noprefetch", None)]
    if args.params != "{}":
        runs.insert(1, ("megakernel-gluon+params", _params(args)))
    for name, params in runs:
        eng = build_engine(name.split("+")[0], w, args.context + 64, params=params)
        eng.prefill(torch.arange(3, 3 + args.context))
        with eng.timeline() as rec:
            for _ in range(3):
                eng.decode_greedy(5)
        if rec.frame is None:
            res[name] = {"reason": rec.reason}
            continue
        s = intrakernel_summary(rec.frame, max_programs=0)
        s.pop("tasks", None)
        df = rec.frame
        # the whole frame (every task of the last step) beside the JSON, for the critical-path analysis offline
        df.to_csv(Path(args.out).with_name(f"{Path(args.out).stem}_{args.model}_{name}_frame.csv.gz"), index=False,
                  float_format="%.3f")
        for r in s.get("task_phases") or []:
            print(f"   {name} {r['opcode']:>7} phases (µs p50): stage {r['stage_us_p50']:.2f}, matvec {r['mv_us_p50']:.2f}, "
                  f"epilogue {r['epilogue_us_p50']:.2f} (max {r['epilogue_us_max']:.2f}), {r['tasks']} tasks", flush=True)
        if s.get("attn_phases"):
            print(f"   {name} attention phases (µs): " + ", ".join(
                f"{k} p50 {v['p50']:.2f} max {v['max']:.2f}" for k, v in s["attn_phases"].items()), flush=True)
        for e in s.get("edges") or []:
            print(f"   {name} {e['edge']:>14}: hop p50 {e['hop_us_p50']:6.2f} µs, max {e['hop_us_max']:6.2f}; "
                  f"span p50 {e['span_us_p50']:6.2f} µs", flush=True)
        if "load_start_us" in df:
            lead = (df["ts_us"] - df["load_start_us"]).dropna()
            s["producer_lead_us_median"] = float(lead.median()) if len(lead) else None
        res[name] = s
        del eng
        torch.cuda.empty_cache()
    out["timeline"] = res


SWEEPS = {
    "r2": [("triton-default", "triton", {}), ("base", "gluon", {}), ("ns24", "gluon", {"num_stages": 24}),
           ("br32-ns12", "gluon", {"max_rows": 32, "num_stages": 12}), ("nw8", "gluon", {"num_warps": 8}),
           ("nw8-ns24", "gluon", {"num_warps": 8, "num_stages": 24}), ("chunk16", "gluon", {"attn_min_chunk": 16}),
           ("chunk64", "gluon", {"attn_min_chunk": 64})],
    "r3": [("triton-default", "triton", {}), ("default", "gluon", {}), ("bs64", "gluon", {"block_s": 64}),
           ("nw8", "gluon", {"num_warps": 8}), ("br16-ns24", "gluon", {"max_rows": 16, "num_stages": 24}),
           ("ns11", "gluon", {"num_stages": 11}), ("chunk32", "gluon", {"attn_min_chunk": 32})],
    "r3long": [("default", "gluon", {}), ("bs64", "gluon", {"block_s": 64}), ("splits8", "gluon", {"kv_splits": 8}),
               ("splits8-bs64", "gluon", {"kv_splits": 8, "block_s": 64})],
    "r6": [("triton-default", "triton", {}), ("default", "gluon", {}), ("split1", "gluon", {"split_k": 1}),
           ("bs64", "gluon", {"block_s": 64}), ("chunk32", "gluon", {"attn_min_chunk": 32}),
           ("br16-ns24", "gluon", {"max_rows": 16, "num_stages": 24}), ("nw8", "gluon", {"num_warps": 8})],
    "r6long": [("default", "gluon", {}), ("split1", "gluon", {"split_k": 1}), ("bs64", "gluon", {"block_s": 64}),
               ("bs64-splits32", "gluon", {"block_s": 64, "kv_splits": 32})],
    "r7": [("triton-default", "triton", {}), ("default", "gluon", {}), ("chunk16", "gluon", {"attn_min_chunk": 16}),
           ("bs32", "gluon", {"block_s": 32}), ("chunk64", "gluon", {"attn_min_chunk": 64})],
    "r7long": [("default", "gluon", {}), ("bs32", "gluon", {"block_s": 32}), ("splits32", "gluon", {"kv_splits": 32}),
               ("splits8", "gluon", {"kv_splits": 8})],
    "r8": [("triton-default", "triton", {}), ("default", "gluon", {}), ("l2-6", "gluon", {"l2_ahead": 6}),
           ("l2-12", "gluon", {"l2_ahead": 12}), ("l2-24", "gluon", {"l2_ahead": 24}), ("default-again", "gluon", {})],
    "r9": [("triton-default", "triton", {}), ("default", "gluon", {}), ("wp4", "gluon", {"wait_prefetch": 4}),
           ("wp8", "gluon", {"wait_prefetch": 8}), ("wp16", "gluon", {"wait_prefetch": 16}),
           ("wp8-all", "gluon", {"wait_prefetch": 8, "wait_prefetch_ops": "QKV,OPROJ,GATEUP,DOWN,LMHEAD"}),
           ("chunk64", "gluon", {"attn_min_chunk": 64}), ("wp8-chunk64", "gluon", {"wait_prefetch": 8, "attn_min_chunk": 64})],
    "r10": [("triton-default", "triton", {}), ("default", "gluon", {}), ("chunk64", "gluon", {"attn_min_chunk": 64}),
            ("wp2", "gluon", {"wait_prefetch": 2}), ("default-again", "gluon", {})],
    # r11 (ld.acquire polling against atomic polling, no difference) ran at 4f7a358; the knob is gone since
    # next session's first A/B: L2 prefetch past the ring from the load/store units instead of the TMA unit
    "r12": [("triton-default", "triton", {}), ("default", "gluon", {}),
            ("wpl4", "gluon", {"wait_prefetch": 4, "wait_prefetch_mode": "line"}),
            ("wpl8", "gluon", {"wait_prefetch": 8, "wait_prefetch_mode": "line"}),
            ("wpl16", "gluon", {"wait_prefetch": 16, "wait_prefetch_mode": "line"}),
            ("wpl8-all", "gluon", {"wait_prefetch": 8, "wait_prefetch_mode": "line",
                                   "wait_prefetch_ops": "QKV,OPROJ,GATEUP,DOWN,LMHEAD"}),
            ("default-again", "gluon", {})],
    # queue balance on thin models (run with --model qwen3-0.6b / qwen2.5-0.5b): BR 16 halves the O-proj / down
    # tiles, so a 1024-wide hidden size gives 128 such tasks for 132 SMs instead of 64
    "rows": [("triton-default", "triton", {}), ("default", "gluon", {}), ("br16", "gluon", {"max_rows": 16}),
             ("br16-ns24", "gluon", {"max_rows": 16, "num_stages": 24}), ("default-again", "gluon", {})],
    # r13 (attn_combine=oproj) and r14 (attn_depth=2) ran at cadb963 and c2f4963; their switches were removed
    # r15 ran at 6f53f65, whose defaults were lm_pick=task and attn_layout=blocks (both changed in session 6): one
    # greedy-pick atomic per CTA instead of one per LM-head task; the attention's warp-local online softmax, alone
    # and with one split per kv head up to 256 positions
    "r15": [("triton-default", "triton", {}), ("default", "gluon", {}), ("lm-cta", "gluon", {"lm_pick": "cta"}),
            ("warps", "gluon", {"attn_layout": "warps"}),
            ("warps-c128", "gluon", {"attn_layout": "warps", "attn_min_chunk": 128}),
            ("warps-c256", "gluon", {"attn_layout": "warps", "attn_min_chunk": 256}),
            ("default-again", "gluon", {}), ("lm-cta-again", "gluon", {"lm_pick": "cta"}),
            ("warps-again", "gluon", {"attn_layout": "warps"})],
    # r16 (mv_unroll=2: two ring slots per consumer round) ran at 6e26389; its switch was removed
    # session 6: the producer held back after a signalling task's tiles until its signal is out (sig_gate: tiles
    # allowed past it), and a shallower ring (fewer loads in flight ahead of the signal's stores)
    "r17": [("default", "gluon", {}), ("sg0", "gluon", {"sig_gate": 0}), ("sg2", "gluon", {"sig_gate": 2}),
            ("sg4", "gluon", {"sig_gate": 4}), ("ring6", "gluon", {"num_stages": 6}),
            ("default-again", "gluon", {}), ("sg0-again", "gluon", {"sig_gate": 0}),
            ("sg2-again", "gluon", {"sig_gate": 2})],
    # session 6, after sig_gate=2 became the default: its neighbours
    "r18": [("default", "gluon", {}), ("sg1", "gluon", {"sig_gate": 1}), ("sg3", "gluon", {"sig_gate": 3}),
            ("sg4", "gluon", {"sig_gate": 4}), ("sg-off", "gluon", {"sig_gate": -1}), ("default-again", "gluon", {}),
            ("sg3-again", "gluon", {"sig_gate": 3}), ("sg4-again", "gluon", {"sig_gate": 4})],
    # prepared in session 6 (not run yet): the bf16 widening by bits (one instruction per weight: 158 instead of
    # 195 instructions per slot in the 1B kernel's QKV loop, SASS), and sig_gate 3 / 4 beside the default 2
    "r19": [("default", "gluon", {}), ("bits", "gluon", {"mv_widen": "bits"}), ("sg3", "gluon", {"sig_gate": 3}),
            ("bits-sg3", "gluon", {"mv_widen": "bits", "sig_gate": 3}), ("default-again", "gluon", {}),
            ("bits-again", "gluon", {"mv_widen": "bits"}), ("sg3-again", "gluon", {"sig_gate": 3})],
    # session 7, mv_widen=bits the default: the producer held after an attention task until the task is done
    # (attn_gate: tiles allowed meanwhile), and sig_gate 3
    "r20": [("default", "gluon", {}), ("ag0", "gluon", {"attn_gate": 0}), ("ag2", "gluon", {"attn_gate": 2}),
            ("ag4", "gluon", {"attn_gate": 4}), ("sg3", "gluon", {"sig_gate": 3}),
            ("ag2-sg3", "gluon", {"attn_gate": 2, "sig_gate": 3}), ("default-again", "gluon", {}),
            ("ag2-again", "gluon", {"attn_gate": 2}), ("ag0-again", "gluon", {"attn_gate": 0})],
    # session 7: sig_gate 3 and attn_gate 0 together, and splits of at least 64 positions (fewer SMs in attention)
    "r21": [("default", "gluon", {}), ("sg3", "gluon", {"sig_gate": 3}),
            ("sg3-ag0", "gluon", {"sig_gate": 3, "attn_gate": 0}), ("chunk64", "gluon", {"attn_min_chunk": 64}),
            ("sg3-ag0-chunk64", "gluon", {"sig_gate": 3, "attn_gate": 0, "attn_min_chunk": 64}),
            ("default-again", "gluon", {}), ("sg3-ag0-again", "gluon", {"sig_gate": 3, "attn_gate": 0}),
            ("chunk64-again", "gluon", {"attn_min_chunk": 64})],
    "r21short": [("default", "gluon", {}), ("sg3", "gluon", {"sig_gate": 3}),
                 ("sg3-ag0", "gluon", {"sig_gate": 3, "attn_gate": 0}), ("default-again", "gluon", {}),
                 ("sg3-ag0-again", "gluon", {"sig_gate": 3, "attn_gate": 0})],
    # r22 (attn_sync=tagged: the attention splits meet through tagged partials, no ticket) ran at ee86bcf; slower on
    # both models, its switch was removed
    # prepared in session 7, run in session 8: the attention's q·Kᵀ and P·V on the tensor cores (attn_layout=mma;
    # the default since)
    "r23": [("default", "gluon", {}), ("mma", "gluon", {"attn_layout": "mma"}), ("default-again", "gluon", {}),
            ("mma-again", "gluon", {"attn_layout": "mma"})],
    # prepared in session 8 (not run yet), mma the default: fewer, longer splits now that a K/V block is cheap (a
    # kv head's whole context in one task skips the partials, the ticket and the combine), and at long context
    # more splits or 64-position blocks (head_dim 128 takes 32 by default)
    "r24": [("default", "gluon", {}), ("c64", "gluon", {"attn_min_chunk": 64}),
            ("c128", "gluon", {"attn_min_chunk": 128}), ("c256", "gluon", {"attn_min_chunk": 256}),
            ("c512", "gluon", {"attn_min_chunk": 512}),
            ("c128-bs64", "gluon", {"attn_min_chunk": 128, "block_s": 64}), ("default-again", "gluon", {}),
            ("c128-again", "gluon", {"attn_min_chunk": 128}), ("c256-again", "gluon", {"attn_min_chunk": 256})],
    "r25": [("default", "gluon", {}), ("early", "gluon", {"attn_operands": "early"}), ("default-again", "gluon", {}),
            ("early-again", "gluon", {"attn_operands": "early"}), ("default-3", "gluon", {}),
            ("early-3", "gluon", {"attn_operands": "early"})],
    "r26": [("default", "gluon", {}), ("c512-bs128", "gluon", {"attn_min_chunk": 512, "block_s": 128}),
            ("c512-bs128-early", "gluon", {"attn_min_chunk": 512, "block_s": 128, "attn_operands": "early"}),
            ("c512-bs64-early", "gluon", {"attn_min_chunk": 512, "attn_operands": "early"}),
            ("c256-bs128-early", "gluon", {"attn_min_chunk": 256, "block_s": 128, "attn_operands": "early"}),
            ("default-again", "gluon", {}),
            ("c512-bs128-early-again", "gluon", {"attn_min_chunk": 512, "block_s": 128, "attn_operands": "early"})],
    "r27": [("default", "gluon", {}), ("c256-bs128", "gluon", {"attn_min_chunk": 256, "block_s": 128}),
            ("c256-bs128-early", "gluon", {"attn_min_chunk": 256, "block_s": 128, "attn_operands": "early"}),
            ("default-again", "gluon", {}), ("c256-bs128-again", "gluon", {"attn_min_chunk": 256, "block_s": 128}),
            ("default-3", "gluon", {}), ("c256-bs128-3", "gluon", {"attn_min_chunk": 256, "block_s": 128})],
    "r28": [("c256-bs128", "gluon", {"attn_min_chunk": 256, "block_s": 128}),
            ("c32-bs32", "gluon", {"attn_min_chunk": 32, "block_s": 32}),
            ("c32-bs128", "gluon", {"attn_min_chunk": 32, "block_s": 128}),
            ("c32-bs64", "gluon", {"attn_min_chunk": 32, "block_s": 64}),
            ("c256-bs128-again", "gluon", {"attn_min_chunk": 256, "block_s": 128}),
            ("c32-bs32-again", "gluon", {"attn_min_chunk": 32, "block_s": 32}),
            ("c32-bs128-again", "gluon", {"attn_min_chunk": 32, "block_s": 128}),
            ("c32-bs64-again", "gluon", {"attn_min_chunk": 32, "block_s": 64})],
    # session 10: the consumer's matvec is on the layer's chain (QKV 1.9 µs, O-proj 1.0, the last gate-up 1.9 and
    # down 3.7 per task with their tiles in the ring): 8 consumer warps (last measured in round 2, before mma)
    "r29": [("default", "gluon", {}), ("nw8", "gluon", {"num_warps": 8}), ("default-again", "gluon", {}),
            ("nw8-again", "gluon", {"num_warps": 8}), ("default-3", "gluon", {}), ("nw8-3", "gluon", {"num_warps": 8})],
    # session 10: the matvec reads ring slot c + 1 into registers before slot c's products (mv_ahead=1), so the
    # shared-memory reads are in flight during the FMAs instead of before each slot's release
    "r30": [("default", "gluon", {}), ("ahead", "gluon", {"mv_ahead": 1}), ("default-again", "gluon", {}),
            ("ahead-again", "gluon", {"mv_ahead": 1}), ("default-3", "gluon", {}), ("ahead-3", "gluon", {"mv_ahead": 1})],
    # session 10: two boxes per ring slot (32 KB slots, half as many), so the consumer's per-slot release (a proxy
    # fence and two barriers of its warps) is paid once per two boxes; with and without mv_ahead
    "r31": [("default", "gluon", {}), ("ahead", "gluon", {"mv_ahead": 1}), ("sb2", "gluon", {"slot_boxes": 2}),
            ("sb2-ahead", "gluon", {"slot_boxes": 2, "mv_ahead": 1}), ("default-again", "gluon", {}),
            ("ahead-again", "gluon", {"mv_ahead": 1}), ("sb2-again", "gluon", {"slot_boxes": 2}),
            ("sb2-ahead-again", "gluon", {"slot_boxes": 2, "mv_ahead": 1})],
    # prepared in session 10 (not run yet): the critical attention task's q phase and combine (the layer's chain,
    # chain_breakdown.py): the first block's older rows before the wait (attn_new_row=row), the split combine's
    # reductions in one warp's lanes (attn_combine=lanes), both; the O-proj tasks combining the splits themselves
    # (attn_reduce=oproj: no ticket), alone and with row. attn_reduce=oproj lost (1B: 1.49 against 0.83 ms per
    # token) and was removed after r32 (session 11), so r32's oproj configs no longer build
    "r32": [("default", "gluon", {}), ("row", "gluon", {"attn_new_row": "row"}),
            ("lanes", "gluon", {"attn_combine": "lanes"}),
            ("row-lanes", "gluon", {"attn_new_row": "row", "attn_combine": "lanes"}),
            ("oproj", "gluon", {"attn_reduce": "oproj"}), ("oproj-row", "gluon", {"attn_reduce": "oproj",
                                                                                  "attn_new_row": "row"}),
            ("default-again", "gluon", {}), ("row-again", "gluon", {"attn_new_row": "row"}),
            ("lanes-again", "gluon", {"attn_combine": "lanes"}),
            ("row-lanes-again", "gluon", {"attn_new_row": "row", "attn_combine": "lanes"}),
            ("oproj-again", "gluon", {"attn_reduce": "oproj"}), ("oproj-row-again", "gluon", {"attn_reduce": "oproj",
                                                                                              "attn_new_row": "row"})],
    # session 11, with row + lanes the default (the combine 2.8 -> 1.6 us in the 1B's critical attention task):
    # does the split length's trade-off move (attn_min_chunk 64 / 16: fewer or more splits), and the signal gate
    # (sig_gate 2 / 4)? r32long: the 4096-token context that r32 ran out of time for
    "r33": [("default", "gluon", {}), ("chunk64", "gluon", {"attn_min_chunk": 64}),
            ("chunk16", "gluon", {"attn_min_chunk": 16}), ("sg2", "gluon", {"sig_gate": 2}),
            ("sg4", "gluon", {"sig_gate": 4}), ("default-again", "gluon", {}),
            ("chunk64-again", "gluon", {"attn_min_chunk": 64}), ("chunk16-again", "gluon", {"attn_min_chunk": 16}),
            ("sg2-again", "gluon", {"sig_gate": 2}), ("sg4-again", "gluon", {"sig_gate": 4})],
    "r32long": [("default", "gluon", {}), ("block-warps", "gluon", {"attn_new_row": "block", "attn_combine": "warps"}),
                ("default-again", "gluon", {}),
                ("block-warps-again", "gluon", {"attn_new_row": "block", "attn_combine": "warps"})],
    # prepared in session 11 (not run yet): the gates and the L2 prefetch past the ring, last measured on the kernels
    # of sessions 3-7 (before sig_gate 3, mma, row + lanes): the attention gate on a model without q/k-norm
    # (attn_gate 0 / 2), the consumers' L2 prefetch of 4 tiles past the ring during the O-proj wait (line, bulk)
    "r34": [("default", "gluon", {}), ("ag0", "gluon", {"attn_gate": 0}), ("ag2", "gluon", {"attn_gate": 2}),
            ("wpl4", "gluon", {"wait_prefetch": 4, "wait_prefetch_mode": "line"}),
            ("wpb4", "gluon", {"wait_prefetch": 4}), ("default-again", "gluon", {}),
            ("ag0-again", "gluon", {"attn_gate": 0}), ("ag2-again", "gluon", {"attn_gate": 2}),
            ("wpl4-again", "gluon", {"wait_prefetch": 4, "wait_prefetch_mode": "line"}),
            ("wpb4-again", "gluon", {"wait_prefetch": 4})],
    # measured in session 12 (mma-warps lost everywhere; the layout is removed, so these no longer run)
    # prepared in session 11: the tensor cores with each warp on its own positions (attn_layout=
    # mma-warps: a warp-local online softmax, one cross-warp combine per task), alone and with longer splits (its
    # super-block is 64 positions; attn_min_chunk 64 / 128: fewer splits, so fewer partials, tickets and combines)
    "r35": [("default", "gluon", {}), ("mw", "gluon", {"attn_layout": "mma-warps"}),
            ("mw-chunk64", "gluon", {"attn_layout": "mma-warps", "attn_min_chunk": 64}),
            ("mw-chunk128", "gluon", {"attn_layout": "mma-warps", "attn_min_chunk": 128}),
            ("default-again", "gluon", {}), ("mw-again", "gluon", {"attn_layout": "mma-warps"}),
            ("mw-chunk64-again", "gluon", {"attn_layout": "mma-warps", "attn_min_chunk": 64}),
            ("mw-chunk128-again", "gluon", {"attn_layout": "mma-warps", "attn_min_chunk": 128})],
    "r35long": [("default", "gluon", {}), ("mw", "gluon", {"attn_layout": "mma-warps"}),
                ("mw-splits8", "gluon", {"attn_layout": "mma-warps", "kv_splits": 8}),
                ("default-again", "gluon", {}), ("mw-again", "gluon", {"attn_layout": "mma-warps"}),
                ("mw-splits8-again", "gluon", {"attn_layout": "mma-warps", "kv_splits": 8})],
    # session 12: every matvec on the tensor cores (mv_widen=mma: ldmatrix from a 128-byte-swizzled ring, the staged
    # vector broadcast as B) against the CUDA cores' bits widening; Qwen2.5's 16-row tiles are too thin for an mma
    # tile (8 rows per half), so r36q compares 32-row tiles with and without it
    "r36": [("default", "gluon", {}), ("mma", "gluon", {"mv_widen": "mma"}), ("default-again", "gluon", {}),
            ("mma-again", "gluon", {"mv_widen": "mma"})],
    "r36q": [("default", "gluon", {}), ("r32", "gluon", {"max_rows": 32}),
             ("mma-r32", "gluon", {"mv_widen": "mma", "max_rows": 32}), ("default-again", "gluon", {}),
             ("r32-again", "gluon", {"max_rows": 32}), ("mma-r32-again", "gluon", {"mv_widen": "mma", "max_rows": 32})],
    # session 12, after r36 (the tensor-core matvec correct, the step even: the QKV matvec 1.92 µs against 1.76, i.e.
    # bound by its tiles' arrival, not by the FMAs): the signal gate lets 3 tiles past a signalling task, so most of
    # the next stage's tiles load after the signal; with the consumer's matvec cheaper, more tiles past it (6) or no
    # gate (-1)?
    "r37": [("default", "gluon", {}), ("mma", "gluon", {"mv_widen": "mma"}),
            ("mma-sg6", "gluon", {"mv_widen": "mma", "sig_gate": 6}),
            ("mma-sgoff", "gluon", {"mv_widen": "mma", "sig_gate": -1}), ("sg6", "gluon", {"sig_gate": 6}),
            ("default-again", "gluon", {}), ("mma-again", "gluon", {"mv_widen": "mma"}),
            ("mma-sg6-again", "gluon", {"mv_widen": "mma", "sig_gate": 6}),
            ("mma-sgoff-again", "gluon", {"mv_widen": "mma", "sig_gate": -1}),
            ("sg6-again", "gluon", {"sig_gate": 6})],
    "r37q": [("r32", "gluon", {"max_rows": 32}), ("mma-r32", "gluon", {"mv_widen": "mma", "max_rows": 32}),
             ("mma-r32-sg6", "gluon", {"mv_widen": "mma", "max_rows": 32, "sig_gate": 6}),
             ("mma-r32-sgoff", "gluon", {"mv_widen": "mma", "max_rows": 32, "sig_gate": -1}), ("default", "gluon", {}),
             ("r32-again", "gluon", {"max_rows": 32}), ("mma-r32-again", "gluon", {"mv_widen": "mma", "max_rows": 32}),
             ("mma-r32-sg6-again", "gluon", {"mv_widen": "mma", "max_rows": 32, "sig_gate": 6}),
             ("mma-r32-sgoff-again", "gluon", {"mv_widen": "mma", "max_rows": 32, "sig_gate": -1}),
             ("default-again", "gluon", {})],
    # session 12, after r37: with the tensor cores the matvec's FMAs are no longer its cost, but each ring slot's
    # release still is (a proxy fence and an arrive between two barriers of the consumer warps: the CUDA-core kernel's
    # warps stall at barriers for 47.8 % of their active cycles, ncu at f9da798); two boxes per slot pay it once per 32 KB
    "r38": [("default", "gluon", {}), ("mma", "gluon", {"mv_widen": "mma"}),
            ("mma-sb2", "gluon", {"mv_widen": "mma", "slot_boxes": 2}), ("default-again", "gluon", {}),
            ("mma-again", "gluon", {"mv_widen": "mma"}),
            ("mma-sb2-again", "gluon", {"mv_widen": "mma", "slot_boxes": 2})],
    "r38q": [("default", "gluon", {}), ("mma-r32", "gluon", {"mv_widen": "mma", "max_rows": 32}),
             ("mma-r32-sb2", "gluon", {"mv_widen": "mma", "max_rows": 32, "slot_boxes": 2}),
             ("default-again", "gluon", {}), ("mma-r32-again", "gluon", {"mv_widen": "mma", "max_rows": 32}),
             ("mma-r32-sb2-again", "gluon", {"mv_widen": "mma", "max_rows": 32, "slot_boxes": 2})],
    # prepared in session 12 (not run yet): r38q's Qwen2.5-0.5B with the tensor-core matvec, 32 rows and two boxes per
    # slot 0.713 / 0.724 against 0.761 / 0.766 (all 8 rounds lower); the same without the tensor cores, and on the
    # other presets (the 1B was even in r38)
    "r39": [("default", "gluon", {}), ("mma-sb2", "gluon", {"mv_widen": "mma", "slot_boxes": 2}),
            ("sb2", "gluon", {"slot_boxes": 2}), ("default-again", "gluon", {}),
            ("mma-sb2-again", "gluon", {"mv_widen": "mma", "slot_boxes": 2}),
            ("sb2-again", "gluon", {"slot_boxes": 2})],
    "r39q": [("default", "gluon", {}), ("mma-r32-sb2", "gluon", {"mv_widen": "mma", "max_rows": 32, "slot_boxes": 2}),
             ("r32-sb2", "gluon", {"max_rows": 32, "slot_boxes": 2}), ("default-again", "gluon", {}),
             ("mma-r32-sb2-again", "gluon", {"mv_widen": "mma", "max_rows": 32, "slot_boxes": 2}),
             ("r32-sb2-again", "gluon", {"max_rows": 32, "slot_boxes": 2})],
    # session 13: the producer's L2 burst at a layer's first gate-up tile (gu_burst: tiles past the ring's horizon,
    # per line from the producer's warp) for the QKV -> O-proj stretch: 2-12 % slower, removed after this sweep (its
    # entries no longer validate)
    "r40": [("default", "gluon", {}), ("gu8", "gluon", {"gu_burst": 8}), ("gu16", "gluon", {"gu_burst": 16}),
            ("default-again", "gluon", {}), ("gu8-again", "gluon", {"gu_burst": 8}),
            ("gu16-again", "gluon", {"gu_burst": 16})],
    # session 13: at most N ring slots requested and not landed per producer (inflight), for the HBM queue the chain's
    # tiles wait behind (~25 MB in flight at ~4 TB/s is ~6 µs); r41q for the 6-slot ring of two-box slots. "default" is
    # no cap, the default when r41 and r45 ran (before session 15's 64 KB per SM)
    "r41": [("default", "gluon", {"inflight": 0}), ("if3", "gluon", {"inflight": 3}), ("if4", "gluon", {"inflight": 4}),
            ("if6", "gluon", {"inflight": 6}), ("default-again", "gluon", {"inflight": 0}),
            ("if3-again", "gluon", {"inflight": 3}),
            ("if4-again", "gluon", {"inflight": 4}), ("if6-again", "gluon", {"inflight": 6})],
    "r41q": [("default", "gluon", {"inflight": 0}), ("if2", "gluon", {"inflight": 2}),
             ("if3", "gluon", {"inflight": 3}), ("if4", "gluon", {"inflight": 4}),
             ("default-again", "gluon", {"inflight": 0}), ("if2-again", "gluon", {"inflight": 2}),
             ("if3-again", "gluon", {"inflight": 3}), ("if4-again", "gluon", {"inflight": 4})],
    # session 13: the RMSNorm weights of a staged vector loaded beside the vector (not after its sum of squares),
    # and also asked of L2 before the dependency wait (norm_load)
    # "default" is `after`, the default when r42 ran (sessions 13-14)
    "r42": [("default", "gluon", {"norm_load": "after"}), ("beside", "gluon", {"norm_load": "beside"}),
            ("prefetch", "gluon", {"norm_load": "prefetch"}), ("default-again", "gluon", {"norm_load": "after"}),
            ("beside-again", "gluon", {"norm_load": "beside"}), ("prefetch-again", "gluon", {"norm_load": "prefetch"})],
    # session 15 (7c5fdff): the weight stream's TMA loads under an L2 evict_first policy (gluon/ptx.py), alone,
    # with the L2 toucher (r43) and with the consumers' L2 prefetch past the ring at a dependency wait (lines read by
    # loads, or asked of L2 ahead, survived an evict_first stream in benchmarks/l2_probe.py). evict_first alone won
    # (1-3 %) and became the default (auto); the toucher lost again and was removed (its entries no longer
    # validate: they raise and are recorded as errors). "default" is no policy, the default when r44 ran (its rows
    # now also run with session 15's in-flight cap)
    "r44": [("default", "gluon", {"weight_eviction": ""}), ("ef", "gluon", {"weight_eviction": "evict_first"}),
            ("ef-lt4", "gluon", {"weight_eviction": "evict_first", "l2_touch": 4}),
            ("ef-lt8", "gluon", {"weight_eviction": "evict_first", "l2_touch": 8}),
            ("ef-wpl4", "gluon", {"weight_eviction": "evict_first", "wait_prefetch": 4, "wait_prefetch_mode": "line"}),
            ("default-again", "gluon", {"weight_eviction": ""}), ("ef-again", "gluon", {"weight_eviction": "evict_first"}),
            ("ef-lt4-again", "gluon", {"weight_eviction": "evict_first", "l2_touch": 4}),
            ("ef-lt8-again", "gluon", {"weight_eviction": "evict_first", "l2_touch": 8}),
            ("ef-wpl4-again", "gluon", {"weight_eviction": "evict_first", "wait_prefetch": 4, "wait_prefetch_mode": "line"})],
    # session 15, after evict_first became the default: the in-flight cap again (r41: ~1 % on the 1B and the 8B
    # without the policy), now that the weight stream no longer evicts the chain's own lines from L2
    "r45": [("default", "gluon", {"inflight": 0}), ("if4", "gluon", {"inflight": 4}), ("if6", "gluon", {"inflight": 6}),
            ("default-again", "gluon", {"inflight": 0}), ("if4-again", "gluon", {"inflight": 4}),
            ("if6-again", "gluon", {"inflight": 6})],
    # prepared in session 15: the in-flight cap's default (64 KB per SM) against no cap, on the models r45 did not
    # measure (Qwen3-0.6B, Qwen3-1.7B, the 3B) and the 1B at 4096
    "r46": [("default", "gluon", {}), ("nocap", "gluon", {"inflight": 0}), ("default-again", "gluon", {}),
            ("nocap-again", "gluon", {"inflight": 0})],
    # session 16 (d80864d, 67cc0dc): the gate-up tasks adding their down products as float32 split-K partials with
    # atomics (fuse_down; no DOWN stage), then over 8 / 32 accumulator copies per layer (down_copies). Correct, 30-90 %
    # slower (NOTES, sixteenth session); removed after r49, so these entries no longer validate
    "r48": [("default", "gluon", {}), ("fd", "gluon", {"fuse_down": True}), ("default-again", "gluon", {}),
            ("fd-again", "gluon", {"fuse_down": True})],
    "r49": [("default", "gluon", {}), ("fd-c8", "gluon", {"fuse_down": True, "down_copies": 8}),
            ("fd-c32", "gluon", {"fuse_down": True, "down_copies": 32}), ("default-again", "gluon", {}),
            ("fd-c8-again", "gluon", {"fuse_down": True, "down_copies": 8}),
            ("fd-c32-again", "gluon", {"fuse_down": True, "down_copies": 32})],
    # prepared in session 15: the next attention task's old K/V asked of L2 by the task before it (kv_prefetch);
    # measured in session 16 (1B at 4096: 2 % slower; at 128 even) and removed, so its entries no longer validate
    "r47": [("default", "gluon", {}), ("kvpf", "gluon", {"kv_prefetch": True}), ("default-again", "gluon", {}),
            ("kvpf-again", "gluon", {"kv_prefetch": True})],
    # measured in session 14 at df52673 (the L2 toucher, a third warp reading the slots just past the producer's
    # horizon into L2: slower on the 1B, Qwen2.5-0.5B and the 8B; removed after r44, so its entries no longer validate)
    "r43": [("default", "gluon", {}), ("lt4", "gluon", {"l2_touch": 4}), ("lt8", "gluon", {"l2_touch": 8}),
            ("lt16", "gluon", {"l2_touch": 16}), ("default-again", "gluon", {}), ("lt4-again", "gluon", {"l2_touch": 4}),
            ("lt8-again", "gluon", {"l2_touch": 8}), ("lt16-again", "gluon", {"l2_touch": 16})],
    # session 18: the attention gate at long context. At 4096 the 1B's step grows 108 us against the goal's 52: each
    # split's K/V reads (64 KB) share HBM with the weight stream of every SM; r20 / r34 measured the gate at 128 only.
    # Since f5578ec (after this sweep) the gate's default is 0 on every model, so "default" here now equals "ag0"
    "r50": [("default", "gluon", {}), ("ag0", "gluon", {"attn_gate": 0}), ("ag2", "gluon", {"attn_gate": 2}),
            ("default-again", "gluon", {}), ("ag0-again", "gluon", {"attn_gate": 0}),
            ("ag2-again", "gluon", {"attn_gate": 2})],
    # prepared in session 18, run in session 19: with the gate at 0 (the default since r50) the producer issues nothing past an
    # attention task until it is done, so its ring is nearly empty during the attention and the O-proj task's tiles
    # (4 slots on the 1B) are requested only after it, on the chain (the 1B's chain 11.7 -> 12.5 us per layer with
    # the gate, its MLP 24.4 -> 23.7). Gates of 4 and 8 tiles let the next O-proj task's tiles in first
    "r51": [("default", "gluon", {}), ("ag4", "gluon", {"attn_gate": 4}), ("ag8", "gluon", {"attn_gate": 8}),
            ("off", "gluon", {"attn_gate": -1}), ("default-again", "gluon", {}), ("ag4-again", "gluon", {"attn_gate": 4}),
            ("ag8-again", "gluon", {"attn_gate": 8}), ("off-again", "gluon", {"attn_gate": -1})],
    # session 19: the attention's split and block shapes again on today's kernel (EARLY operands, the gate at 0,
    # evict_first, the in-flight cap): 128-position blocks (r26 measured them even at 4096 on the session-9 kernel;
    # at 4096 + 1..256 positions a split of 257-272 walks 5 blocks of 64, the last holding 1-16, or 3 of 128) and
    # splits of at least 64 positions (r24: 1 % slower at 128 then; the benchmark's 129-384 positions take 5-12
    # splits of 32, each one half-empty 64-position block, and a combine over all of them)
    "r52": [("default", "gluon", {}), ("bs128", "gluon", {"block_s": 128}), ("mc64", "gluon", {"attn_min_chunk": 64}),
            ("default-again", "gluon", {}), ("bs128-again", "gluon", {"block_s": 128}),
            ("mc64-again", "gluon", {"attn_min_chunk": 64})],
    # session 19: the signal gate again. sig_gate=3 (round 21) bounds the tiles a producer issues past a signalling
    # task until its signal is out, because the signal's release waited for this SM's weight loads in flight; since
    # session 15 the in-flight cap (64 KB per SM) bounds those loads anyway, and r36's frames said the chain's QKV
    # matvec waits for the 5 of its 8 tiles issued only after the previous stage's signal
    "r53": [("default", "gluon", {}), ("sg6", "gluon", {"sig_gate": 6}), ("sg12", "gluon", {"sig_gate": 12}),
            ("off", "gluon", {"sig_gate": -1}), ("default-again", "gluon", {}), ("sg6-again", "gluon", {"sig_gate": 6}),
            ("sg12-again", "gluon", {"sig_gate": 12}), ("off-again", "gluon", {"sig_gate": -1})],
    # r53 in session 19 (1f22e5590): sig_gate 6 ahead of 3 in every round on the 1B at 128 (0.765 / 0.749 against
    # 0.785 / 0.766, a drifting machine), 12 and off even with 3. r53b: 6 and 8 against 3, on more models
    "r53b": [("sg3", "gluon", {"sig_gate": 3}), ("sg6", "gluon", {"sig_gate": 6}), ("sg8", "gluon", {"sig_gate": 8}),
             ("sg3-again", "gluon", {"sig_gate": 3}), ("sg6-again", "gluon", {"sig_gate": 6}),
             ("sg8-again", "gluon", {"sig_gate": 8})],
    # r54 in session 20: Qwen3's attention split choices again (session 11 measured row + lanes 1.5 % slower there,
    # before the gates, the in-flight cap and evict_first; its combine is 2.5 µs of the 6.2 µs attention chain)
    "r54": [("default", "gluon", {}), ("lanes", "gluon", {"attn_combine": "lanes"}),
            ("row", "gluon", {"attn_new_row": "row"}),
            ("row-lanes", "gluon", {"attn_new_row": "row", "attn_combine": "lanes"}),
            ("default-again", "gluon", {}), ("lanes-again", "gluon", {"attn_combine": "lanes"}),
            ("row-again", "gluon", {"attn_new_row": "row"}),
            ("row-lanes-again", "gluon", {"attn_new_row": "row", "attn_combine": "lanes"})],
    "r24long": [("default", "gluon", {}), ("splits32", "gluon", {"kv_splits": 32}), ("bs64", "gluon", {"block_s": 64}),
                ("splits32-bs64", "gluon", {"kv_splits": 32, "block_s": 64}), ("default-again", "gluon", {}),
                ("splits32-again", "gluon", {"kv_splits": 32})],
    "r15long": [("default", "gluon", {}), ("warps", "gluon", {"attn_layout": "warps"}),
                ("default-again", "gluon", {}), ("warps-again", "gluon", {"attn_layout": "warps"})],
    "r9long": [("default", "gluon", {}), ("wp8", "gluon", {"wait_prefetch": 8}),
               ("wp16", "gluon", {"wait_prefetch": 16}), ("chunk64", "gluon", {"attn_min_chunk": 64})],
    "r2long": [("base", "gluon", {}), ("splits32", "gluon", {"kv_splits": 32}),
               ("splits64", "gluon", {"kv_splits": 64}), ("splits32-bs64", "gluon", {"kv_splits": 32, "block_s": 64}),
               ("bs64", "gluon", {"block_s": 64})],
}


def section_sweep(args, out):
    """Per config: build the engine with those params and prefill ``--context`` tokens; then ``--rounds`` rounds in
    which every config times ``--timed / --rounds`` greedy steps in turn (interleaved, so clock and neighbour
    drift hit all configs alike): median and p99 ms over all its steps, the per-round medians, compile info."""
    import statistics

    import numpy as np
    import torch

    from bubblescope.megakernel_engine import MegakernelEngine, MegakernelParams
    from bubblescope.models.config import get_preset
    from bubblescope.models.weights import dummy_weights
    cfg = get_preset(args.model)
    w = dummy_weights(cfg, device="cuda", dtype=torch.bfloat16, seed=0)
    res = out.setdefault(f"sweep_{args.sweep}_{args.context}", {})
    engines = {}
    for name, impl, kw in SWEEPS[args.sweep]:
        try:
            eng = MegakernelEngine(w, MegakernelParams(**kw), max_seq_len=args.context + args.timed + 64, impl=impl)
            eng.prefill(torch.arange(3, 3 + args.context))
            tok = 5
            for _ in range(10):
                tok = eng.decode_greedy(tok)
            engines[name] = (eng, tok, [], [])
            info = eng.compile_info()
            # "resolved": the Gluon choices the params resolved to (auto / None defaults named), as results.json's
            res[name] = {"params": kw, "resolved": info.get("gluon"), "impl": impl, "registers": info.get("registers"),
                         "spills": info.get("spills"), "shared_bytes": info.get("shared_bytes"),
                         "grid": info.get("grid"), "text_bytes": info.get("text_bytes")}
        except Exception as e:
            res[name] = {"params": kw, "error": f"{type(e).__name__}: {e}"[-800:]}
            print("  ", name, json.dumps(res[name])[:300], flush=True)
    per_round = max(1, args.timed // args.rounds)
    for _ in range(args.rounds):
        for name, (eng, tok, ts, medians) in list(engines.items()):
            try:
                mine = []
                for _ in range(per_round):
                    t0 = time.perf_counter()
                    tok = eng.decode_greedy(tok)
                    mine.append((time.perf_counter() - t0) * 1e3)
                ts += mine
                medians.append(statistics.median(mine))
                engines[name] = (eng, tok, ts, medians)
            except Exception as e:
                res[name]["error"] = f"{type(e).__name__}: {e}"[-800:]
                del engines[name]
    for name, (eng, tok, ts, medians) in engines.items():
        res[name].update({"ms_p50": statistics.median(ts), "ms_p99": float(np.percentile(ts, 99)),
                          "round_medians_ms": medians, "steps": len(ts)})
        # the timings first: the resolved params grew past the cut and hid them (session 20's first call)
        timing = {k: res[name][k] for k in ("ms_p50", "ms_p99", "round_medians_ms", "params", "registers", "spills")}
        print("  ", name, json.dumps(timing)[:300], flush=True)
    out["sweep"] = {"last": f"sweep_{args.sweep}_{args.context}"}


SECTIONS = {"sweep": section_sweep, "stories": section_stories, "tiny": section_tiny, "llama": section_llama, "timeline": section_timeline}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default="stories,tiny,llama,timeline")
    ap.add_argument("--stories", default=".carry/models/stories260K/stories260K.bin")
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--model", default="llama-3.2-1b", help="preset of the llama, timeline and sweep sections")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--sweep", default="r2", choices=tuple(SWEEPS))
    ap.add_argument("--timed", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds of the sweep")
    ap.add_argument("--params", default="{}", help="MegakernelParams fields (JSON) for the stories, llama and "
                    "timeline sections")
    ap.add_argument("--out", default="runs/gluon_check.json")
    a = ap.parse_args()
    out = {"started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    for name in a.sections.split(","):
        t0 = time.time()
        try:
            SECTIONS[name](a, out)
        except Exception as e:
            out[name] = {"error": f"{type(e).__name__}: {e}"[-2000:], "traceback": traceback.format_exc()[-3000:]}
        out.setdefault("seconds", {})[name] = round(time.time() - t0, 1)
        print(name, json.dumps(out[name], default=str)[:1500], flush=True)
        Path(a.out).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
