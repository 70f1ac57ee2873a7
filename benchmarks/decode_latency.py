"""Decode latency of every engine in one process (vLLM latency-benchmark style).

For each model and engine: warm-up generations, then ``--runs`` timed generations of ``--gen-len`` tokens
after a ``--prompt-len`` prompt; per-token host wall time (token on the host) as raw samples plus
percentiles; effective bandwidth from the analytic bytes per step (``profiler.traffic``) against the NVML
peak and the measured copy bandwidth; the ratio to ``reference-compile`` measured in the same run; greedy
token agreement with ``reference`` (eager) over the whole generation; optional long-context points.

    PYTHONPATH=src python3 benchmarks/decode_latency.py --models llama-3.2-1b --out benchmarks/results/x.json

Writes JSON (raw samples, percentiles, device, date, commit, versions) and a markdown table beside it.
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


def _commit() -> str | None:
    """``$BUBBLESCOPE_COMMIT`` when set (a copied tree's .git may be stale: benchmarks/run.py sets it),
    else ``git rev-parse``."""
    if os.environ.get("BUBBLESCOPE_COMMIT"):
        return os.environ["BUBBLESCOPE_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=10).stdout.strip() or None
    except Exception:
        return None


def skip_reason(name: str, device) -> str | None:
    """Why engine ``name`` (``ENGINE`` or ``ENGINE@stepwise``) is not timed on ``device`` (a ``torch.device``):
    not in the engine registry, or ruled out there whatever the model (``engines.unavailable_before_load``: a
    package it needs, a GPU it needs). None when it may run; building it can still rule it out (recorded as
    skipped too, with the reason ``EngineUnavailable`` gives)."""
    from bubblescope.engines import ENGINES, unavailable_before_load

    base = name.partition("@")[0]
    if base not in ENGINES:
        return f"not in the engine registry (known: {', '.join(ENGINES)})"
    return unavailable_before_load(base, device)


def _percentile(xs, q):
    import numpy as np
    return float(np.percentile(xs, q))


def bench_engine(name, weights, prompt, gen_len, runs, warmup, max_seq, long_contexts, deadline):
    import torch

    from bubblescope.engines import build_engine
    from bubblescope.generation import generate

    t0 = time.time()
    # "ENGINE@stepwise": the engine with generate()'s launch-ahead off (the host reads each token before the
    # next step is launched), to time what keeping one step in flight saves, in the same run
    base, _, how = name.partition("@")
    ahead = how != "stepwise"
    eng = build_engine(base, weights, max_seq)
    for _ in range(warmup):
        generate(eng, prompt, min(gen_len, 32), eos_ids=(), launch_ahead=ahead)
    samples, ttft, tokens = [], [], None
    for _ in range(runs):
        res = generate(eng, prompt, gen_len, eos_ids=(), launch_ahead=ahead)
        samples += res.token_ms
        ttft.append(res.ttft_ms)
        tokens = res.tokens
        if time.time() > deadline:
            break
    out = {"token_ms_samples": [round(x, 5) for x in samples], "ttft_ms": statistics.median(ttft),
           "token_ms_p50": _percentile(samples, 50), "token_ms_p10": _percentile(samples, 10), "token_ms_p90": _percentile(samples, 90),
           "token_ms_p99": _percentile(samples, 99), "token_ms_mean": statistics.fmean(samples), "tokens": tokens,
           "build_and_run_s": None, "long_context": []}
    if hasattr(eng, "compile_info"):
        out["compile"] = eng.compile_info()
    for c in long_contexts:
        if time.time() > deadline:
            break
        g = torch.Generator().manual_seed(c)
        p = torch.randint(3, weights.config.vocab_size, (c,), generator=g).tolist()
        res = generate(eng, p, 33, eos_ids=(), launch_ahead=ahead)
        out["long_context"].append({"context": c, "token_ms_p50": _percentile(res.token_ms, 50),
                                    "token_ms_samples": [round(x, 5) for x in res.token_ms]})
    out["build_and_run_s"] = round(time.time() - t0, 2)
    del eng
    gc.collect()
    torch.cuda.empty_cache()
    return out


def _write_json(doc: dict, out: Path) -> None:
    """Atomic write; called after every engine, so a run cut short keeps what it measured."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, out)


def _cell(value, spec: str, missing: str) -> str:
    """``value`` formatted with ``spec``, or ``missing`` (a dash and why) where it was not measured: a table cell
    never reads ``nan``."""
    return missing if value is None else format(value, spec)


def markdown_table(doc: dict) -> str:
    """The markdown table of a decode_latency JSON document ``doc`` (one row per model and engine).

    The ratio to reference-compile and the greedy agreement with reference exist only when those engines ran
    ok in the same model's run; otherwise the cell says which engine was missing, not ``nan``.
    """
    dev = doc["device"]
    lines = [f"Decode latency, {dev['name']}, {doc['date']}, commit {doc['commit']}, torch "
             f"{doc['versions']['torch']}, triton {doc['versions']['triton']}; NVML peak "
             f"{_cell(dev.get('nvml_peak_GBps'), '.0f', '—')} GB/s, measured copy "
             f"{_cell(doc.get('copy_GBps'), '.0f', '—')} GB/s.", "",
             "| model | engine | p50 ms | p99 ms | tok/s | GB/s | % peak | % copy | × ref-compile | greedy = ref |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for model, e in doc["models"].items():
        engines = e["engines"]
        ran = {name for name, r in engines.items() if r.get("status") == "ok"}
        no_compile = "— (reference-compile not run)" if "reference-compile" not in ran else "—"
        no_ref = "— (reference not run)" if "reference" not in ran else "—"
        for name, r in engines.items():
            if r.get("status") != "ok":
                lines.append(f"| {model} | {name} | {r.get('status')}: {(r.get('reason') or '')[:60]} |||||||")
                continue
            util = {k: None if r.get(k) is None else 100 * r[k] for k in ("util_peak", "util_copy")}
            lines.append(
                f"| {model} | {name} | {r['token_ms_p50']:.3f} | {r['token_ms_p99']:.3f} | "
                f"{1000 / r['token_ms_mean']:.0f} | {_cell(r.get('effective_GBps'), '.0f', '—')} | "
                f"{_cell(util['util_peak'], '.1f', '—')} | {_cell(util['util_copy'], '.1f', '—')} | "
                f"{_cell(r.get('speedup_vs_reference_compile'), '.2f', no_compile)} | "
                f"{_cell(r.get('greedy_agreement_vs_reference'), '.3f', no_ref)} |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    """The command line (``benchmarks/run.py`` reads it to see which options this version has)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="llama-3.2-1b")
    ap.add_argument("--engines", help="engine names; ENGINE@stepwise times ENGINE with generate()'s launch-ahead off",
                    default="reference,reference-cudagraph,reference-compile,reference-fused,reference-fused-pdl,"
                            "megakernel-noprefetch,megakernel")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--long-contexts", default="4096", help="comma-separated contexts timed per engine ('' none)")
    ap.add_argument("--long-context-engines", default="reference-compile,megakernel")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-seconds", type=float, default=400)
    ap.add_argument("--out", default="benchmarks/results/decode_latency.json")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)

    import torch

    from bubblescope.errors import EngineUnavailable
    from bubblescope.models import dummy_weights, get_preset, parse_dtype
    from bubblescope.profiler.hardware import device_info, measure_copy_bandwidth
    from bubblescope.profiler.traffic import bandwidth, step_traffic

    if not torch.cuda.is_available():
        print("decode_latency: needs a CUDA GPU", file=sys.stderr)
        return 2
    deadline = time.time() + args.max_seconds
    info = device_info("cuda:0")
    copy = measure_copy_bandwidth("cuda:0")
    dtype = parse_dtype(args.dtype)
    longs = [int(c) for c in args.long_contexts.split(",") if c.strip()]
    doc = {"benchmark": "decode_latency", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "commit": _commit(), "device": {k: info.get(k) for k in ("name", "sm_count", "nvml_peak_GBps",
                                                                   "max_mem_clock_MHz", "bus_width_bits",
                                                                   "driver_version", "cuda_version")},
           "copy_GBps": copy["copy_GBps"], "versions": {"torch": torch.__version__,
                                                        "triton": info.get("triton_version"),
                                                        "python": sys.version.split()[0]},
           "workload": {"prompt_len": args.prompt_len, "gen_len": args.gen_len, "runs": args.runs,
                        "dtype": args.dtype, "weights": "dummy (seed 0)"},
           "models": {}}
    for model in [m for m in args.models.split(",") if m]:
        cfg = get_preset(model)
        w = dummy_weights(cfg, "cuda", dtype, seed=0)
        prompt = torch.randint(3, cfg.vocab_size, (args.prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
        max_seq = max([args.prompt_len + args.gen_len + 8] + [c + 40 for c in longs])
        mean_ctx = args.prompt_len + args.gen_len // 2
        traffic = step_traffic(cfg, dtype.itemsize, mean_ctx)
        entry = {"bytes_per_step": traffic["total_bytes"], "context_for_bytes": mean_ctx, "engines": {}}
        for name in [e for e in args.engines.split(",") if e]:
            if time.time() > deadline:
                entry["engines"][name] = {"status": "skipped", "reason": "time budget (--max-seconds) spent"}
                continue
            if why := skip_reason(name, w.device):
                entry["engines"][name] = {"status": "skipped", "reason": why}
                print(f"{model} {name}: skipped: {why}", flush=True)
                continue
            lc = longs if name in args.long_context_engines.split(",") else []
            try:
                r = bench_engine(name, w, prompt, args.gen_len, args.runs, args.warmup, max_seq, lc, deadline)
            except EngineUnavailable as e:  # this model or device rules it out: a skip with the reason
                entry["engines"][name] = {"status": "skipped", "reason": str(e)}
                print(f"{model} {name}: skipped: {e}", flush=True)
                continue
            except Exception as e:  # record and continue: one engine must not sink the run
                entry["engines"][name] = {"status": "failed", "reason": f"{type(e).__name__}: {str(e)[:300]}"}
                print(f"{model} {name}: FAILED {e}", file=sys.stderr)
                continue
            bw = bandwidth(traffic["total_bytes"], r["token_ms_p50"], info.get("nvml_peak_GBps"), copy["copy_GBps"])
            r.update(status="ok", **bw)
            for pt in r["long_context"]:
                t = step_traffic(cfg, dtype.itemsize, pt["context"] + 16)
                pt.update(bytes_per_step=t["total_bytes"], kv_bytes=t["kv_read_bytes"] + t["kv_write_bytes"],
                          **bandwidth(t["total_bytes"], pt["token_ms_p50"], info.get("nvml_peak_GBps")))
            entry["engines"][name] = r
            doc["models"][model] = entry
            _write_json(doc, Path(args.out))
            print(f"{model} {name}: p50 {r['token_ms_p50']:.3f} ms  p99 {r['token_ms_p99']:.3f} ms  "
                  f"{(bw['util_peak'] or 0) * 100:.1f}% of peak", flush=True)
        ref = entry["engines"].get("reference", {}).get("tokens")
        base = entry["engines"].get("reference-compile", {}).get("token_ms_p50")
        for name, r in entry["engines"].items():
            if r.get("status") != "ok":
                continue
            if ref:
                n = min(len(ref), len(r["tokens"]))
                r["greedy_agreement_vs_reference"] = sum(a == b for a, b in zip(ref[:n], r["tokens"][:n])) / n
                r["greedy_identical_prefix"] = next((i for i in range(n) if ref[i] != r["tokens"][i]), n)
            r["speedup_vs_reference_compile"] = base / r["token_ms_p50"] if base else None
            r.pop("tokens", None)
        doc["models"][model] = entry
        del w
        gc.collect()
        torch.cuda.empty_cache()
    out = Path(args.out)
    _write_json(doc, out)
    md = markdown_table(doc)
    out.with_suffix(".md").write_text(md)
    print(md, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
