"""Megakernel check on a GPU: correctness, timing, intra-kernel timeline, parameter sweep — in one bounded run.

Sections (each failure is caught, recorded in the JSON and printed; the run goes on):

1. ``stories``: stories260K fp32 greedy generation, megakernel vs the reference engine, token for token.
2. ``correctness``: llama-3.2-1b dummy bf16 weights; each variant teacher-forced over ``--steps`` steps
   against ReferenceEngine (each ``--reference-modes``): per step argmax agreement, max abs and relative
   logit error; the LM-head argmax partials checked against the logits' argmax.
3. ``timing``: per variant (and the reference modes) at ``--context`` positions: warm-up, then per step
   the CUDA-event time of the decode call and the host wall time with the token on the host
   (median, p10, p90, p99), effective bandwidth from the analytic bytes per step.
4. ``timeline``: the fused and noprefetch variants with the intra-kernel timeline: wait ratio, per-opcode
   busy/wait, span.
5. ``sweep``: parameter configs (programs per SM, rows per task, BLOCK_K, num_warps, KV splits, ...) of the
   fused variant: compile info (registers, spills, residency), a 4-step correctness spot check, step time.

Stops starting new work when ``--max-seconds`` is reached; the JSON (``--out``) is rewritten after every
section so a killed run keeps what it measured. ``--device cpu`` runs every code path under the Triton
interpreter on small models (slow, for testing this script without a GPU).

Example: ``python benchmarks/megakernel_gpu_check.py --out runs/mk_check.json --max-seconds 540``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--model", default=None, help="preset for dummy weights (default llama-3.2-1b; stories260k on cpu)")
    ap.add_argument("--dtype", default=None, help="default bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--stories", default=".carry/models/stories260K/stories260K.bin", help="llama2.c stories260K path")
    ap.add_argument("--stories-tokens", type=int, default=None, help="greedy tokens (default 200; 16 on cpu)")
    ap.add_argument("--steps", type=int, default=None, help="teacher-forced steps (default 32; 3 on cpu)")
    ap.add_argument("--context", type=int, default=None, help="KV positions for timing (default 128; 8 on cpu)")
    ap.add_argument("--timed-steps", type=int, default=None, help="timed decode steps (default 100; 3 on cpu)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps before timing (default 10; 1 on cpu)")
    ap.add_argument("--variants", default="fused,stages,noprefetch")
    ap.add_argument("--reference-modes", default="eager,cudagraph", help="on cpu only eager is possible")
    ap.add_argument("--sweep", default="default", choices=("default", "quick", "tune2", "tune3", "tune4", "tune5", "tune6", "attn", "attn4", "attn5", "attn6",
                             "attn7", "none"))
    ap.add_argument("--sections", default="stories,correctness,timing,timeline,sweep")
    ap.add_argument("--max-seconds", type=float, default=540.0, help="stop starting new work after this")
    ap.add_argument("--out", default="megakernel_gpu_check.json")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    cpu = a.device == "cpu"
    defaults = dict(model="stories260k" if cpu else "llama-3.2-1b", dtype="float32" if cpu else "bfloat16",
                    stories_tokens=16 if cpu else 200, steps=3 if cpu else 32, context=8 if cpu else 128,
                    timed_steps=3 if cpu else 100, warmup=1 if cpu else 10)
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if cpu:
        a.reference_modes = "eager"
    return a


ARGS = parse_args()
if ARGS.device == "cpu":  # before anything imports triton: the CPU megakernel runs under the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from bubblescope.generation import generate, greedy_step, prepare_for, teacher_forced_logits  # noqa: E402
from bubblescope.megakernel_engine import MegakernelEngine, MegakernelParams  # noqa: E402
from bubblescope.megakernel_engine.engine import CPU_PARAMS  # noqa: E402
from bubblescope.megakernel_engine.timeline import intrakernel_summary  # noqa: E402
from bubblescope.models.config import get_preset  # noqa: E402
from bubblescope.models.weights import dummy_weights, load_llama2c, parse_dtype  # noqa: E402
from bubblescope.profiler.traffic import step_traffic  # noqa: E402
from bubblescope.reference_engine import ReferenceEngine  # noqa: E402

T0 = time.monotonic()
RESULT: dict = {"args": vars(ARGS), "errors": [], "sections": {}}


def left() -> float:
    return ARGS.max_seconds - (time.monotonic() - T0)


def save() -> None:
    RESULT["elapsed_s"] = round(time.monotonic() - T0, 1)
    out = Path(ARGS.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(RESULT, indent=1, default=repr))
    os.replace(tmp, out)


def record_error(where: str, e: BaseException) -> dict:
    err = {"where": where, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=6)}
    RESULT["errors"].append(err)
    print(f"  !! {where}: {err['error'].splitlines()[0][:300]}", flush=True)
    return {"error": err["error"]}


def pct(xs: list[float]) -> dict:
    t = torch.tensor(xs, dtype=torch.float64)
    q = torch.quantile(t, torch.tensor([0.1, 0.5, 0.9, 0.99], dtype=torch.float64)).tolist()
    return {"p10": q[0], "median": q[1], "p90": q[2], "p99": q[3], "n": len(xs)}


def sync() -> None:
    if ARGS.device == "cuda":
        torch.cuda.synchronize()


def free() -> None:
    if ARGS.device == "cuda":
        torch.cuda.empty_cache()


def base_params() -> MegakernelParams | None:
    return CPU_PARAMS if ARGS.device == "cpu" else None


def build(weights, variant="fused", params=None, max_seq_len=None):
    t = time.monotonic()
    e = MegakernelEngine(weights, params=params or base_params(), max_seq_len=max_seq_len, variant=variant)
    sync()
    return e, time.monotonic() - t


def compare(got: torch.Tensor, ref: torch.Tensor) -> dict:
    """Per-step argmax agreement, max abs and relative (L2) logit error of (steps, V) float32 logits."""
    abs_err = (got - ref).abs().amax(-1)
    rel = (got - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-30)
    agree = got.argmax(-1) == ref.argmax(-1)
    return {"argmax_agreement": agree.float().mean().item(), "argmax_agree_per_step": agree.int().tolist(),
            "max_abs_err": abs_err.max().item(), "max_rel_err": rel.max().item(),
            "max_abs_err_per_step": [round(x, 5) for x in abs_err.tolist()],
            "rel_err_per_step": [round(x, 6) for x in rel.tolist()]}


# ---- sections ---------------------------------------------------------------------------------------------
def section_stories() -> dict:
    path = Path(ARGS.stories)
    if not path.is_file():
        return {"skipped": f"{path} not found"}
    w = load_llama2c(path, device=ARGS.device)
    n = ARGS.stories_tokens
    ref = generate(ReferenceEngine(w, max_seq_len=256), [1], n, eos_ids=())
    out = {"tokens": n}
    for variant in ARGS.variants.split(","):
        if left() < 0:
            break
        try:
            e, build_s = build(w, variant, max_seq_len=256)
            got = generate(e, [1], n, eos_ids=())
            e.synchronize_and_check()
            first_diff = next((i for i, (a, b) in enumerate(zip(got.tokens, ref.tokens)) if a != b), None)
            out[variant] = {"identical": got.tokens == ref.tokens, "first_difference": first_diff,
                            "build_s": round(build_s, 2), "compile": e.compile_info()}
        except Exception as ex:  # noqa: BLE001
            out[variant] = record_error(f"stories/{variant}", ex)
        print(f"  stories260K {variant}: {out[variant].get('identical', out[variant].get('error'))}", flush=True)
    return out


def section_correctness(w, refs: dict) -> dict:
    gen = torch.Generator().manual_seed(ARGS.seed)
    prompt = torch.randint(3, w.config.vocab_size, (8,), generator=gen).tolist()
    # Force seeded random tokens, so every engine sees the same inputs. (Not the reference's greedy
    # continuation: dummy weights repeat one token forever, which would make agreement trivially 1.)
    forced = [int(t) for t in torch.randint(3, w.config.vocab_size, (ARGS.steps - 1,), generator=gen)]
    want = {m: teacher_forced_logits(r, prompt, forced) for m, r in refs.items()}
    out = {"prompt_len": len(prompt), "steps": len(forced) + 1}
    names = list(want)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            out[f"{a}_vs_{b}"] = compare(want[a], want[b])
            print(f"  {a} vs {b}: argmax agreement {out[f'{a}_vs_{b}']['argmax_agreement']:.3f}, max rel err "
                  f"{out[f'{a}_vs_{b}']['max_rel_err']:.2e}", flush=True)
    for variant in ARGS.variants.split(","):
        if left() < 0:
            break
        try:
            e, build_s = build(w, variant, max_seq_len=max(ARGS.context + ARGS.timed_steps + ARGS.warmup,
                                                           len(prompt) + ARGS.steps) + 8)
            got = teacher_forced_logits(e, prompt, forced)
            greedy_ok = int(e.greedy_token().item()) == int(got[-1].argmax())  # picked on the device
            e.synchronize_and_check()
            out[variant] = {m: compare(got, r) for m, r in want.items()}
            out[variant].update(build_s=round(build_s, 2), greedy_partials_ok=greedy_ok, compile=e.compile_info())
            for m0 in want:
                print(f"  {variant}: argmax agreement {out[variant][m0]['argmax_agreement']:.3f}, max rel err "
                  f"{out[variant][m0]['max_rel_err']:.2e}, max abs {out[variant][m0]['max_abs_err']:.3g} "
                  f"(vs {m0}); build {build_s:.1f}s; regs {e.compile_info().get('registers')}, "
                      f"grid {e.compile_info().get('grid')}", flush=True)
            del e
            free()
        except Exception as ex:  # noqa: BLE001
            out[variant] = record_error(f"correctness/{variant}", ex)
    return out


def time_decoder(dec, cfg, steps: int | None = None) -> dict:
    """Prefill ``--context`` random tokens, warm up, then time decode steps (token on the host each step)."""
    steps = steps or ARGS.timed_steps
    gen = torch.Generator().manual_seed(ARGS.seed + 1)
    prompt = torch.randint(3, cfg.vocab_size, (ARGS.context,), generator=gen).to(ARGS.device)
    prepare_for(dec, ARGS.context, ARGS.warmup + 2 * steps)   # the reference's bucket graphs, before the timed steps
    tok = int(torch.argmax(dec.prefill(prompt)))
    for _ in range(ARGS.warmup):
        tok = int(torch.argmax(dec.decode(tok)))
    host, dev = [], []
    cuda = ARGS.device == "cuda"
    for _ in range(steps):
        if cuda:
            ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            ev0.record()
        t0 = time.perf_counter()
        logits = dec.decode(tok)
        if cuda:
            ev1.record()
        tok = int(torch.argmax(logits))  # the token on the host: a sync
        host.append((time.perf_counter() - t0) * 1e3)
        if cuda:
            dev.append(ev0.elapsed_time(ev1))
    # The generate() path: an engine's fused greedy step (megakernel: the argmax picked on the device and
    # read back with the status copy) where it has one, else argmax(decode).
    greedy_host, greedy_ok = [], True
    for _ in range(steps):
        t0 = time.perf_counter()
        nxt = greedy_step(dec, tok)
        greedy_host.append((time.perf_counter() - t0) * 1e3)
        if hasattr(dec, "last_logits"):  # (outside the timed region)
            greedy_ok &= nxt == int(torch.argmax(dec.last_logits()))
        tok = nxt
    ctx = ARGS.context + ARGS.warmup + steps
    nbytes = step_traffic(cfg, torch.finfo(parse_dtype(ARGS.dtype)).bits // 8, ctx)["total_bytes"]
    out = {"host_ms": pct(host), "greedy_host_ms": pct(greedy_host), "greedy_matches_argmax": bool(greedy_ok),
           "context": ARGS.context}
    if dev:
        out["device_ms"] = pct(dev)
        out["effective_GBps"] = nbytes / (out["device_ms"]["median"] * 1e-3) / 1e9
    out["host_effective_GBps"] = nbytes / (out["host_ms"]["median"] * 1e-3) / 1e9
    out["bytes_per_step"] = nbytes
    return out


def fmt_time(t: dict) -> str:
    d = t.get("device_ms", t["host_ms"])
    return (f"device median {d['median']:.3f} ms (p10 {d['p10']:.3f}, p90 {d['p90']:.3f}, p99 {d['p99']:.3f}); "
            f"host median {t['host_ms']['median']:.3f} ms; greedy-step host median {t['greedy_host_ms']['median']:.3f} "
            f"ms (= argmax: {t['greedy_matches_argmax']}); "
            f"{t.get('effective_GBps', t['host_effective_GBps']):.0f} GB/s")


def section_timing(w, refs: dict) -> dict:
    out = {}
    for m, r in refs.items():
        if left() < 0:
            break
        try:
            out[f"reference-{m}"] = time_decoder(r, w.config)
            print(f"  reference-{m}: {fmt_time(out[f'reference-{m}'])}", flush=True)
        except Exception as ex:  # noqa: BLE001
            out[f"reference-{m}"] = record_error(f"timing/reference-{m}", ex)
    for variant in ARGS.variants.split(","):
        if left() < 0:
            break
        try:
            e, _ = build(w, variant, max_seq_len=ARGS.context + 2 * ARGS.timed_steps + ARGS.warmup + 8)
            out[variant] = time_decoder(e, w.config)
            e.synchronize_and_check()
            out[variant]["compile"] = e.compile_info()
            print(f"  {variant}: {fmt_time(out[variant])}", flush=True)
            del e
            free()
        except Exception as ex:  # noqa: BLE001
            out[variant] = record_error(f"timing/{variant}", ex)
    return out


def timeline_of(e, cfg) -> dict:
    gen = torch.Generator().manual_seed(ARGS.seed + 2)
    prompt = torch.randint(3, cfg.vocab_size, (ARGS.context,), generator=gen).to(ARGS.device)
    tok = int(torch.argmax(e.prefill(prompt)))
    for _ in range(ARGS.warmup):
        tok = int(torch.argmax(e.decode(tok)))
    with e.timeline() as rec:
        for _ in range(3):
            tok = int(torch.argmax(e.decode(tok)))
    e.synchronize_and_check()
    if rec.frame is None:
        return {"skipped": rec.reason}
    s = intrakernel_summary(rec.frame)
    s.pop("tasks")
    return s


def section_timeline(w) -> dict:
    out = {}
    for variant in ("fused", "noprefetch"):
        if variant not in ARGS.variants.split(",") or left() < 0:
            continue
        try:
            e, _ = build(w, variant, max_seq_len=ARGS.context + ARGS.warmup + 16)
            out[variant] = timeline_of(e, w.config)
            s = out[variant]
            if "wait_ratio" in s:
                print(f"  {variant}: wait ratio {s['wait_ratio']:.3f}, span {s['span_us']:.1f} us, "
                      f"{s['tasks_per_step']} tasks on {s['programs']} programs", flush=True)
                for b in s["by_opcode"]:
                    print(f"      {b['opcode']:<12} tasks {b['tasks']:>6}  busy {b['busy_us']:>12.1f} us  "
                          f"wait {b['wait_us']:>12.1f} us", flush=True)
            del e
            free()
        except Exception as ex:  # noqa: BLE001
            out[variant] = record_error(f"timeline/{variant}", ex)
    return out


def sweep_configs() -> list[tuple[str, dict]]:
    if ARGS.sweep == "none":
        return []
    if ARGS.device == "cpu":  # exercise the sweep path with interpreter-sized tiles
        return [("cpu-default", {}), ("rows128-k32", dict(max_rows=128, block_k=32)), ("bad-block-k", dict(block_k=3))]
    quick = [("default", {}), ("pps3", dict(programs_per_sm=3)), ("k1024", dict(block_k=1024)),
             ("rows4", dict(max_rows=4))]
    if ARGS.sweep == "quick":
        return quick
    if ARGS.sweep == "attn":  # attention at long context: more splits, longer position chunks
        return [("default", {}), ("bs32", dict(block_s=32)), ("bs64", dict(block_s=64)),
                ("splits32-bs32", dict(kv_splits=32, block_s=32)), ("splits64-bs64", dict(kv_splits=64, block_s=64))]
    if ARGS.sweep == "tune4":  # fourth round: fused attention reduction, multi-tile tasks, prefetch of the next task
        old = dict(attn_reduce="stage", kv_splits=16, attn_min_chunk=1)  # the round-3 default
        return [("default", {}), ("old-default", old), ("fused-s16-mc1", dict(kv_splits=16, attn_min_chunk=1)),
                ("stage-s32-mc16", dict(attn_reduce="stage")), ("s16", dict(kv_splits=16)), ("s64", dict(kv_splits=64)),
                ("mc32", dict(attn_min_chunk=32)),
                ("lm2", dict(lm_blocks=2)), ("lm4", dict(lm_blocks=4)), ("lm8", dict(lm_blocks=8)),
                ("gu2", dict(gateup_blocks=2)), ("gu4", dict(gateup_blocks=4)),
                ("pf-oproj", dict(prefetch_next="OPROJ")), ("pf-oproj-attn", dict(prefetch_next="OPROJ,ATTN")),
                ("pf-all", dict(prefetch_next="QKV,ATTN,OPROJ,GATEUP,DOWN,LMHEAD")),
                ("lm4-gu2", dict(lm_blocks=4, gateup_blocks=2)),
                ("lm4-gu2-pf", dict(lm_blocks=4, gateup_blocks=2, prefetch_next="OPROJ,ATTN")),
                ("lm8-gu4-pf", dict(lm_blocks=8, gateup_blocks=4, prefetch_next="OPROJ,ATTN")),
                ("lm4-gu2-pf-rows6", dict(lm_blocks=4, gateup_blocks=2, prefetch_next="OPROJ,ATTN", max_rows=6)),
                ("evict", dict(weight_eviction="evict_first")),
                ("lm4-gu2-pf-evict", dict(lm_blocks=4, gateup_blocks=2, prefetch_next="OPROJ,ATTN",
                                          weight_eviction="evict_first")),
                ("old-default-again", old), ("default-again", {})]
    old = dict(attn_reduce="stage", kv_splits=16, attn_min_chunk=1)  # the round-3 default
    if ARGS.sweep == "tune5":  # fifth round: skipped empty splits, 64 splits by default
        return [("default", {}), ("old-default", old), ("s32", dict(kv_splits=32)), ("s16", dict(kv_splits=16)),
                ("mc8", dict(attn_min_chunk=8)), ("mc32", dict(attn_min_chunk=32)), ("stage", dict(attn_reduce="stage")),
                ("evict", dict(weight_eviction="evict_first")), ("default-again", {}), ("old-default-again", old)]
    if ARGS.sweep in ("tune6", "attn6"):  # sixth round: the register cap (maxnreg) restores 4 programs per SM
        return [("default", {}), ("old-default", old), ("s32", dict(kv_splits=32)), ("s16", dict(kv_splits=16)),
                ("pps3-cap168", dict(programs_per_sm=3)), ("default-again", {})]
    if ARGS.sweep == "attn7":  # seventh round: longer position chunks and more splits under the register cap
        return [("default", {}), ("bs32", dict(block_s=32)), ("bs64", dict(block_s=64)), ("s128", dict(kv_splits=128)),
                ("s128-bs32", dict(kv_splits=128, block_s=32)), ("mc32-bs32", dict(attn_min_chunk=32, block_s=32)),
                ("default-again", {})]
    if ARGS.sweep == "attn5":
        return [("default", {}), ("old-default", old), ("s32", dict(kv_splits=32)), ("mc32", dict(attn_min_chunk=32)),
                ("mc64", dict(attn_min_chunk=64))]
    if ARGS.sweep == "attn4":  # long context: split count and chunk
        return [("default", {}), ("old-default", dict(attn_reduce="stage", kv_splits=16, attn_min_chunk=1)),
                ("s64", dict(kv_splits=64)), ("s64-bs32", dict(kv_splits=64, block_s=32)),
                ("s32-bs32", dict(block_s=32)), ("s16", dict(kv_splits=16))]
    if ARGS.sweep == "tune3":  # third round: prefetch the next task's weights
        return [("k1024", {}), ("ahead1", dict(prefetch_ahead=1)), ("ahead1-line", dict(prefetch_ahead=1, prefetch="line")),
                ("ahead1-splits8", dict(prefetch_ahead=1, kv_splits=8)), ("k1024-again", {})]
    if ARGS.sweep == "tune2":  # second round, around block_k 1024 (the first round's best)
        return [("k1024", {}), ("k512", dict(block_k=512)), ("k2048", dict(block_k=2048)),
                ("lm16", dict(rows_lm=16)), ("lm32", dict(rows_lm=32)), ("splits8", dict(kv_splits=8)),
                ("attn2", dict(attn_kv_heads=2)), ("line", dict(prefetch="line")), ("rows6", dict(max_rows=6)),
                ("w2-pps8", dict(num_warps=2, programs_per_sm=8)), ("w2-pps6", dict(num_warps=2, programs_per_sm=6)),
                ("stages2", dict(num_stages=2)), ("rows4", dict(max_rows=4)), ("pps3", dict(programs_per_sm=3)),
                ("w8-pps2-k2048", dict(num_warps=8, programs_per_sm=2, block_k=2048))]
    return quick + [
        ("pps2", dict(programs_per_sm=2)), ("k256", dict(block_k=256)), ("rows16", dict(max_rows=16)),
        ("w8-k1024", dict(num_warps=8, block_k=1024)), ("splits4", dict(kv_splits=4)), ("splits32", dict(kv_splits=32)),
        ("prefetch-line", dict(prefetch="line")), ("sleep64", dict(spin_sleep_ns=64)),
        ("rows4-k1024-pps4", dict(max_rows=4, block_k=1024, programs_per_sm=4)), ("stages2", dict(num_stages=2)),
        ("slow-launch", dict(fast_launch=False)),
    ]


def section_sweep(w, refs: dict) -> list[dict]:
    gen = torch.Generator().manual_seed(ARGS.seed + 3)
    prompt = torch.randint(3, w.config.vocab_size, (8,), generator=gen).tolist()
    forced = [int(x) for x in torch.randint(3, w.config.vocab_size, (3,), generator=gen)]
    want = teacher_forced_logits(next(iter(refs.values())), prompt, forced)
    rows, slowest = [], 30.0
    for name, kw in sweep_configs():
        if left() < slowest:  # do not start a config that probably cannot finish in time
            rows.append({"config": name, "params": kw, "skipped": "out of time"})
            print_sweep_row(rows[-1])
            continue
        row = {"config": name, "params": kw}
        t_config = time.monotonic()
        try:
            params = (base_params() or MegakernelParams()).replace(**kw)
            e, build_s = build(w, "fused", params=params,
                               max_seq_len=ARGS.context + 2 * ARGS.timed_steps + ARGS.warmup + 8)
            row["build_s"] = round(build_s, 2)
            row["compile"] = e.compile_info()
            got = teacher_forced_logits(e, prompt, forced)
            c = compare(got, want)
            row["correct"] = {"argmax_agreement": c["argmax_agreement"], "max_rel_err": c["max_rel_err"]}
            row["timing"] = time_decoder(e, w.config, steps=max(4, ARGS.timed_steps // 2))
            e.synchronize_and_check()
            del e
            free()
        except Exception as ex:  # noqa: BLE001
            row.update(record_error(f"sweep/{name}", ex))
        slowest = max(slowest, 1.2 * (time.monotonic() - t_config))
        rows.append(row)
        print_sweep_row(row)
        RESULT["sections"]["sweep"] = rows
        save()
    return rows


def print_sweep_row(r: dict) -> None:
    if "error" in r or "skipped" in r:
        print(f"  {r['config']:<18} {r.get('error', r.get('skipped'))[:160]}", flush=True)
        return
    c, t = r["compile"], r["timing"]
    d = t.get("device_ms", t["host_ms"])
    print(f"  {r['config']:<18} regs {c.get('registers')!s:>4} spills {c.get('spills')!s:>4} "
          f"pps {c.get('programs_per_sm')!s:>2}/{c.get('fit_programs_per_sm')!s:<2} grid {c.get('grid')!s:>5} "
          f"tasks {c.get('tasks_per_step'):>6}  median {d['median']:.3f} ms p90 {d['p90']:.3f}  "
          f"greedy-host {t['greedy_host_ms']['median']:.3f} ms  "
          f"{t.get('effective_GBps', t['host_effective_GBps']):7.0f} GB/s  "
          f"agree {r['correct']['argmax_agreement']:.2f} "
          f"rel {r['correct']['max_rel_err']:.1e}  build {r['build_s']:.0f}s", flush=True)


def main() -> int:
    import triton
    RESULT["env"] = {"python": sys.version.split()[0], "torch": torch.__version__, "triton": triton.__version__,
                     "device": torch.cuda.get_device_name() if ARGS.device == "cuda" else "cpu",
                     "triton_interpret": os.environ.get("TRITON_INTERPRET")}
    print(f"megakernel check on {RESULT['env']['device']} (torch {torch.__version__}, triton {triton.__version__}); "
          f"budget {ARGS.max_seconds:.0f}s", flush=True)
    if ARGS.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device", flush=True)
        return 2
    sections = ARGS.sections.split(",")
    if "stories" in sections:
        print("[stories260K fp32 greedy]", flush=True)
        try:
            RESULT["sections"]["stories"] = section_stories()
        except Exception as ex:  # noqa: BLE001
            RESULT["sections"]["stories"] = record_error("stories", ex)
        save()
    w = refs = None
    if any(s in sections for s in ("correctness", "timing", "timeline", "sweep")) and left() > 0:
        try:
            cfg = get_preset(ARGS.model)
            w = dummy_weights(cfg, ARGS.device, parse_dtype(ARGS.dtype), seed=ARGS.seed)
            max_len = max(ARGS.context + 2 * ARGS.timed_steps + ARGS.warmup, 8 + ARGS.steps) + 8
            # "fp32" = the eager reference on the same weights upcast to float32: the numerical truth both
            # bf16 engines are compared with (their difference from each other alone cannot say who is off).
            refs = {m: (ReferenceEngine(w.to(dtype=torch.float32), mode="eager", max_seq_len=max_len) if m == "fp32"
                        else ReferenceEngine(w, mode=m, max_seq_len=max_len))
                    for m in ARGS.reference_modes.split(",")}
            print(f"[{cfg.name} dummy {ARGS.dtype}: {w.nbytes() / 1e9:.2f} GB]", flush=True)
        except Exception as ex:  # noqa: BLE001
            record_error("setup", ex)
    for name, fn in (("correctness", lambda: section_correctness(w, refs)), ("timing", lambda: section_timing(w, refs)),
                     ("timeline", lambda: section_timeline(w)), ("sweep", lambda: section_sweep(w, refs))):
        if name not in sections:
            continue
        if w is None:
            RESULT["sections"][name] = {"skipped": "out of time" if left() < 0 else "setup failed (see errors)"}
            continue
        if left() < 0:
            RESULT["sections"][name] = {"skipped": "out of time"}
            print(f"[{name}] skipped: out of time", flush=True)
            continue
        print(f"[{name}] ({left():.0f}s left)", flush=True)
        try:
            RESULT["sections"][name] = fn()
        except Exception as ex:  # noqa: BLE001
            RESULT["sections"][name] = record_error(name, ex)
        save()
    save()
    print(f"done in {time.monotonic() - T0:.0f}s; {len(RESULT['errors'])} error(s); wrote {ARGS.out}", flush=True)
    return 1 if RESULT["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
