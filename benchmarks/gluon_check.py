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


def _interleaved(*configs):
    """(name, impl, params) configs, then each again ("-again"), so every round times each config twice apart and
    the spread between a config and its repeat shows the sweep's noise."""
    return list(configs) + [(f"{n}-again", impl, kw) for n, impl, kw in configs]


# Interleaved sweeps of MegakernelParams on the Gluon kernel, one per question, named by what they vary. Each
# config's default is the engine's (``MegakernelParams()``); the records under benchmarks/results keep the configs
# they ran (``gluon_check_*.json``: its ``params`` per config), and benchmarks/NOTES.md says what each knob measured.
SWEEPS = {
    # the noise floor: the same config three times
    "noise": [("default", "gluon", {}), ("default-again", "gluon", {}), ("default-3", "gluon", {})],
    # the plain-Triton kernel beside the Gluon kernel
    "kernels": _interleaved(("triton-default", "triton", {}), ("default", "gluon", {})),
    # the weight ring: slots and rows per tile
    "ring": _interleaved(("default", "gluon", {}), ("ns8", "gluon", {"num_stages": 8}),
                         ("ns16", "gluon", {"num_stages": 16}), ("br16", "gluon", {"max_rows": 16})),
    # the weight stream: the in-flight cap, its L2 policy, when the RMSNorm weights load
    "stream": _interleaved(("default", "gluon", {}), ("no-cap", "gluon", {"inflight": 0}),
                           ("no-evict-first", "gluon", {"weight_eviction": ""}),
                           ("norm-after", "gluon", {"norm_load": "after"})),
    # the gates that hold the producer behind a signalling task (sig_gate) and an attention task (attn_gate)
    "gates": _interleaved(("default", "gluon", {}), ("sg6", "gluon", {"sig_gate": 6}),
                          ("sg-off", "gluon", {"sig_gate": -1}), ("ag2", "gluon", {"attn_gate": 2}),
                          ("ag-off", "gluon", {"attn_gate": -1})),
    # the attention's shapes and split handling
    "attention": _interleaved(("default", "gluon", {}), ("chunk64", "gluon", {"attn_min_chunk": 64}),
                              ("bs128", "gluon", {"block_s": 128}), ("new-row-block", "gluon", {"attn_new_row": "block"}),
                              ("combine-warps", "gluon", {"attn_combine": "warps"})),
    # the consumer's matvec: widening, tensor cores, boxes per slot, read-ahead
    "matvec": _interleaved(("default", "gluon", {}), ("bits", "gluon", {"mv_widen": "bits"}),
                           ("mma", "gluon", {"mv_widen": "mma"}), ("sb1", "gluon", {"slot_boxes": 1}),
                           ("no-ahead", "gluon", {"mv_ahead": 0})),
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
        # the timings first: printed after the resolved params, the cut would hide them
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
    ap.add_argument("--sweep", default="noise", choices=tuple(SWEEPS))
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
