"""Time to first token (prefill) of each engine at several prompt lengths, in one process.

For each model and prompt length: each engine is built once, warmed up at that length (untimed: cuBLAS heuristics,
first-call allocations), then timed ``--runs`` times, each time ``generate(engine, prompt, 1)``: the prefill plus the
first token on the host, as ``diagnose`` measures TTFT. Recorded per case: the median ``ttft_ms`` and the raw
samples, the first token (engines should agree on it), and per length the megakernel's TTFT over the best
reference engine's (the goal: at most 1.1). The megakernel with token-by-token prefill (one decode launch per
prompt token, the ablation) is timed at ``--stepwise-lengths`` only: it is slow by design.

    PYTHONPATH=src python3 benchmarks/prefill.py --models llama-3.2-1b,llama-3.1-8b --out benchmarks/results/x.json

Writes JSON (``"benchmark": "prefill"``, device, date, commit, versions, ``models`` → model → ``prompt_lengths`` →
length → ``engines`` → engine → ``ttft_ms``) after every case, so a run cut short keeps what it measured, and a
markdown table beside it. A case stops taking samples after ``--case-seconds``; cases left when ``--max-seconds``
is spent are recorded as skipped.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

STEPWISE = "megakernel-stepwise-prefill"  # the megakernel built with prefill="stepwise"
REFERENCES = ("reference", "reference-cudagraph", "reference-compile", "reference-fused", "reference-fused-pdl")


def _commit() -> str | None:
    """``$BUBBLESCOPE_COMMIT`` when set (a copied tree's .git may be stale), else ``git rev-parse``."""
    if os.environ.get("BUBBLESCOPE_COMMIT"):
        return os.environ["BUBBLESCOPE_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=10).stdout.strip() or None
    except Exception:
        return None


def _write_json(doc: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, out)


def _sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_case(engine, prompt: list[int], runs: int, warmup: int, case_deadline: float) -> dict:
    """TTFT of ``engine`` on ``prompt``: ``warmup`` untimed generations of one token, then up to ``runs`` timed ones
    (fewer once ``case_deadline``, a ``time.time()``, has passed; at least one). ms. The warm-ups' TTFTs are kept
    apart (``warmup_ttft_ms``): the first pays one-time costs at this length (compilation, a prefill graph's
    capture)."""
    from bubblescope.generation import generate

    warm = [generate(engine, prompt, 1, eos_ids=()).ttft_ms for _ in range(warmup)]
    samples, first = [], None
    for _ in range(runs):
        _sync(engine.device)
        res = generate(engine, prompt, 1, eos_ids=())
        samples.append(res.ttft_ms)
        first = res.tokens[0]
        if time.time() > case_deadline:
            break
    return {"status": "ok", "ttft_ms": statistics.median(samples), "ttft_ms_samples": [round(x, 4) for x in samples],
            "runs": len(samples), "first_token": first, "warmup_ttft_ms": [round(x, 4) for x in warm]}


def _build(name: str, weights, max_seq: int):
    from bubblescope.engines import build_engine
    if name == STEPWISE:
        return build_engine("megakernel", weights, max_seq, prefill="stepwise")
    return build_engine(name, weights, max_seq)


def bench_model(model: str, args, doc: dict, out: Path, deadline: float) -> None:
    import torch

    from bubblescope.engines import ENGINES
    from bubblescope.models import dummy_weights, get_preset, parse_dtype

    cfg = get_preset(model)
    dev = torch.device(args.device)
    weights = dummy_weights(cfg, dev, parse_dtype(args.dtype), seed=args.seed)
    lengths = [n for n in args.lengths if n <= cfg.max_position_embeddings]
    max_seq = max(lengths) + 8
    gen = torch.Generator().manual_seed(args.seed)
    prompts = {n: torch.randint(3, cfg.vocab_size, (n,), generator=gen).tolist() for n in lengths}
    entry = doc["models"][model] = {"dtype": args.dtype, "weights": f"dummy (seed {args.seed})", "max_seq_len": max_seq,
                                    "prompt_lengths": {str(n): {"engines": {}} for n in lengths}}
    names = list(args.engines) + ([STEPWISE] if args.stepwise_lengths else [])
    for name in names:
        cases = {n: entry["prompt_lengths"][str(n)]["engines"] for n in lengths
                 if name != STEPWISE or n in args.stepwise_lengths}
        base = "megakernel" if name == STEPWISE else name
        if base not in ENGINES:
            for table in cases.values():
                table[name] = {"status": "skipped", "reason": f"engine {base} is not registered here"}
            continue
        if time.time() > deadline:
            for table in cases.values():
                table[name] = {"status": "skipped", "reason": "time budget (--max-seconds) spent"}
            continue
        try:
            engine = _build(name, weights, max_seq)
        except Exception as e:  # one engine must not sink the run
            for table in cases.values():
                table[name] = {"status": "failed", "reason": f"does not build: {type(e).__name__}: {str(e)[:300]}"}
            continue
        for n, table in cases.items():
            if time.time() > deadline:
                table[name] = {"status": "skipped", "reason": "time budget (--max-seconds) spent"}
                continue
            try:
                table[name] = r = time_case(engine, prompts[n], args.runs, args.warmup,
                                            min(deadline, time.time() + args.case_seconds))
                print(f"{model} {n:5d} {name:28s} TTFT {r['ttft_ms']:9.3f} ms ({r['runs']} runs)", flush=True)
            except Exception as e:
                table[name] = {"status": "failed", "reason": f"{type(e).__name__}: {str(e)[:300]}"}
                print(f"{model} {n} {name}: FAILED {e}", file=sys.stderr, flush=True)
            _write_json(doc, out)
        del engine
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    for n in lengths:
        summarize_length(entry["prompt_lengths"][str(n)])
    del weights
    gc.collect()


def summarize_length(case: dict) -> None:
    """Add ``best_reference`` (the fastest ok reference engine and its TTFT) and ``megakernel_vs_best_reference``
    (megakernel TTFT / that TTFT; the goal is <= 1.1) to one prompt length's entry."""
    ok = {k: v for k, v in case["engines"].items() if v.get("status") == "ok"}
    refs = {k: v["ttft_ms"] for k, v in ok.items() if k in REFERENCES}
    best = min(refs, key=refs.get) if refs else None
    case["best_reference"] = {"engine": best, "ttft_ms": refs[best]} if best else None
    mk = ok.get("megakernel", {}).get("ttft_ms")
    case["megakernel_vs_best_reference"] = mk / refs[best] if best and mk else None


def markdown(doc: dict) -> str:
    lines = [f"Prefill (TTFT, median ms), {doc['device']['name']}, {doc['date']}, commit {doc['commit']}, torch "
             f"{doc['versions']['torch']}, triton {doc['versions']['triton']}.", "",
             "| model | prompt | engine | TTFT ms | runs | first token |", "|---|---|---|---|---|---|"]
    for model, m in doc["models"].items():
        for n, case in m["prompt_lengths"].items():
            for name, r in case["engines"].items():
                if r.get("status") != "ok":
                    lines.append(f"| {model} | {n} | {name} | {r.get('status')}: {r.get('reason', '')[:60]} | | |")
                else:
                    lines.append(f"| {model} | {n} | {name} | {r['ttft_ms']:.3f} | {r['runs']} | {r['first_token']} |")
            ratio = case.get("megakernel_vs_best_reference")
            if ratio is not None:
                lines.append(f"| {model} | {n} | megakernel / {case['best_reference']['engine']} | {ratio:.2f}× | | |")
    return "\n".join(lines) + "\n"


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="llama-3.2-1b,llama-3.1-8b")
    ap.add_argument("--lengths", type=_ints, default=[128, 1024, 4096], help="prompt lengths, tokens")
    ap.add_argument("--engines", type=lambda s: [e for e in s.split(",") if e],
                    default=["reference-compile", "reference-fused", "megakernel"],
                    help="engines timed at every length (one not registered here is recorded as skipped)")
    ap.add_argument("--stepwise-lengths", type=_ints, default=[128],
                    help=f"lengths at which {STEPWISE} (one decode launch per prompt token) is timed ('' none)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only to check the script (the Triton interpreter)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--case-seconds", type=float, default=30, help="stop taking samples of a case after this")
    ap.add_argument("--max-seconds", type=float, default=480, help="skip the cases left after this")
    ap.add_argument("--out", default="benchmarks/results/prefill.json")
    args = ap.parse_args(argv)

    import torch

    from bubblescope.engines import prepare_triton

    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("prefill: needs a CUDA GPU (or --device cpu to check the script)", file=sys.stderr)
        return 2
    prepare_triton(dev)
    from bubblescope import __version__
    from bubblescope.profiler.hardware import device_info

    deadline = time.time() + args.max_seconds
    info = device_info(str(dev) if dev.type == "cuda" else "cpu")
    doc = {"benchmark": "prefill", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "commit": _commit(),
           "device": {k: info.get(k) for k in ("name", "type", "sm_count", "nvml_peak_GBps", "max_sm_clock_MHz",
                                               "driver_version", "cuda_version")},
           "versions": {"bubblescope": __version__, "torch": torch.__version__, "triton": info.get("triton_version"),
                        "python": sys.version.split()[0]},
           "workload": {"lengths": args.lengths, "stepwise_lengths": args.stepwise_lengths, "runs": args.runs,
                        "warmup": args.warmup, "dtype": args.dtype, "case_seconds": args.case_seconds,
                        "measure": "generate(engine, prompt, 1).ttft_ms: prefill + first token on the host"},
           "models": {}}
    out = Path(args.out)
    for model in [m for m in args.models.split(",") if m]:
        bench_model(model, args, doc, out, deadline)
        _write_json(doc, out)
    _write_json(doc, out)
    md = markdown(doc)
    out.with_suffix(".md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
