"""Decode latency of every engine in one process (vLLM latency-benchmark style).

For each model and engine: warm-up generations, then ``--runs`` timed generations of ``--gen-len`` tokens
after a ``--prompt-len`` prompt; per-token host wall time (token on the host) as raw samples plus
percentiles; effective bandwidth from the analytic bytes per step (``profiler.traffic``) against the NVML
peak and the measured copy bandwidth; the ratio to ``reference-compile`` measured in the same run; greedy
token agreement with ``reference`` (eager) over the whole generation; optional long-context points.

``--weights fp8`` (or ``fp8-all``, or both) times every engine again over the same weights quantized to FP8 e4m3
with a float32 scale per output row (``bubblescope.models.quant``): entries ``<engine>+fp8`` beside the bf16 ones,
each with its own bytes per step (``profiler.traffic``, ``weights=``), its speed-up over the same engine in bf16
(``speedup_vs_bf16``) and its teacher-forced logits against the reference engine over the same FP8 weights
(``rel_logit_err_vs_reference``, ``top1_vs_reference``); per model, ``quantization[fmt]`` holds the FP8 model's
teacher-forced top-1 agreement with the bf16 one and their relative logit error over ``--accuracy-tokens`` tokens
(the bf16 reference's own greedy continuation; dummy weights, so a check of the path, not of a real model).

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

    base, _, how = name.partition("@")
    if base not in ENGINES:
        return f"not in the engine registry (known: {', '.join(ENGINES)})"
    if "=" in how and base not in FUSED and not base.startswith("megakernel"):
        return "parameter overrides (ENGINE@key=value) apply to the fused engines and the megakernels only"
    return unavailable_before_load(base, device)


FUSED = ("reference-fused", "reference-fused-pdl")


def param_overrides(how: str) -> dict:
    """``key=value:key=value...`` after an engine name's ``@`` (``:`` between pairs; ``,`` separates engines):
    FusedParams (the fused engines) or MegakernelParams (the megakernels) overrides, integers where the value is
    one; ``{}`` for ``stepwise`` or nothing."""
    if "=" not in how:
        return {}
    value = lambda t: int(t) if t.strip().lstrip("-").isdigit() else t.strip()  # noqa: E731
    return {kv.split("=")[0].strip(): value(kv.split("=", 1)[1]) for kv in how.split(":") if kv.strip()}


def _percentile(xs, q):
    import numpy as np
    return float(np.percentile(xs, q))


def logit_errors(got, want) -> dict:
    """Teacher-forced logits ``got`` against ``want`` (both float32 (T, V)): ``top1`` = share of rows with the same
    argmax, ``rel_logit_err_max`` / ``_mean`` = max / mean over rows of ‖got − want‖₂ / ‖want‖₂."""
    rel = (got - want).norm(dim=-1) / want.norm(dim=-1).clamp_min(1e-30)
    return {"top1": (got.argmax(-1) == want.argmax(-1)).float().mean().item(),
            "rel_logit_err_max": rel.max().item(), "rel_logit_err_mean": rel.mean().item(), "rows": int(got.shape[0])}


def bench_engine(name, weights, prompt, gen_len, runs, warmup, max_seq, long_contexts, deadline, check=None):
    """Time engine ``name`` over ``weights``; ``check`` = (forced tokens, reference logits): its teacher-forced
    logits on them compared with the reference's (:func:`logit_errors`) into ``vs_reference``."""
    import torch

    from bubblescope.engines import build_engine
    from bubblescope.generation import generate, teacher_forced_logits

    t0 = time.time()
    # "ENGINE@stepwise": the engine with generate()'s launch-ahead off (the host reads each token before the
    # next step is launched), to time what keeping one step in flight saves, in the same run
    # "ENGINE@key=value:key=value": the engine with those parameters (FusedParams or MegakernelParams; its defaults
    # otherwise), timed beside the default one in the same run
    base, _, how = name.partition("@")
    ahead = how != "stepwise"
    overrides = param_overrides(how)
    if overrides and base in FUSED:
        from bubblescope.fused_engine import FusedEngine, FusedParams
        eng = FusedEngine(weights, max_seq_len=max_seq, pdl=base == "reference-fused-pdl",
                          params=FusedParams(**overrides))
    elif overrides:
        from bubblescope.megakernel_engine import MegakernelParams
        eng = build_engine(base, weights, max_seq, params=MegakernelParams(**overrides))
    else:
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
    if check is not None:
        forced, want = check
        out["vs_reference"] = logit_errors(teacher_forced_logits(eng, prompt, forced), want)
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


def weight_formats(value: str) -> list[str]:
    """``--weights``: bf16 first (the baseline every FP8 entry is compared with), then the FP8 formats named.

    Raises:
        ValueError: a format not in ``bubblescope.models.quant.WEIGHT_FORMATS`` (a one-line message).
    """
    from bubblescope.profiler.traffic import WEIGHT_FORMATS

    names = [f.strip() for f in value.split(",") if f.strip()]
    if bad := [f for f in names if f not in WEIGHT_FORMATS]:
        raise ValueError(f"--weights: unknown format {bad[0]!r}; use {', '.join(WEIGHT_FORMATS)}")
    return ["bf16"] + [f for f in dict.fromkeys(names) if f != "bf16"]


def reference_check(weights, vocab_size: int, prompt: list[int], max_seq: int, steps: int = 16):
    """(forced tokens, logits): ``steps`` seeded tokens and the eager reference engine's teacher-forced logits over
    ``weights``, which an engine over the same weights must reproduce (``bench_engine``'s ``check``); fewer where
    the prompt leaves less room in ``max_seq`` positions."""
    import torch

    from bubblescope.engines import build_engine
    from bubblescope.generation import teacher_forced_logits

    steps = max(0, min(steps, max_seq - len(prompt) - 1))
    forced = torch.randint(3, vocab_size, (steps,), generator=torch.Generator().manual_seed(1)).tolist()
    ref = build_engine("reference", weights, max_seq)
    logits = teacher_forced_logits(ref, prompt, forced)
    del ref
    return forced, logits


def quantization_accuracy(variants: dict, ref_tokens: list[int] | None, prompt: list[int], n: int,
                          max_seq: int) -> dict:
    """Per FP8 format: the eager reference engine over it against the same engine over the bf16 weights,
    teacher-forced on the bf16 reference's greedy tokens (the first ``n``): :func:`logit_errors`'s ``top1`` (the
    top-1 agreement with the bf16 model) and relative logit errors; ``{"reason"}`` when the bf16 reference has no
    tokens (not run, or failed)."""
    from bubblescope.engines import build_engine
    from bubblescope.generation import teacher_forced_logits

    if not ref_tokens:
        return {f: {"reason": "the bf16 reference engine did not run"} for f in variants if f != "bf16"}
    forced = ref_tokens[:n]
    base = teacher_forced_logits(build_engine("reference", variants["bf16"], max_seq), prompt, forced)
    return {f: logit_errors(teacher_forced_logits(build_engine("reference", w, max_seq), prompt, forced), base)
            for f, w in variants.items() if f != "bf16"}


def finish_entry(entry: dict, ref: list[int] | None) -> None:
    """Per ok engine of a model's ``entry``: greedy agreement with the reference's tokens ``ref`` (and the identical
    prefix), the speed-up over reference-compile and, for ``<engine>+<format>``, over the same engine in bf16
    (None where that one did not run ok); then the token lists are dropped."""
    engines = entry["engines"]
    base = engines.get("reference-compile", {}).get("token_ms_p50")
    for name, r in engines.items():
        if r.get("status") != "ok":
            continue
        if ref:
            n = min(len(ref), len(r["tokens"]))
            r["greedy_agreement_vs_reference"] = sum(a == b for a, b in zip(ref[:n], r["tokens"][:n])) / n
            r["greedy_identical_prefix"] = next((i for i in range(n) if ref[i] != r["tokens"][i]), n)
        r["speedup_vs_reference_compile"] = base / r["token_ms_p50"] if base else None
        if "+" in name:
            plain = engines.get(name.partition("+")[0], {})
            r["speedup_vs_bf16"] = plain["token_ms_p50"] / r["token_ms_p50"] if plain.get("status") == "ok" else None
    for r in engines.values():
        r.pop("tokens", None)


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
    ok in the same model's run; otherwise the cell says which engine was missing, not ``nan``. A run with FP8
    entries (``<engine>+fp8``) adds a ``× bf16`` column (the same engine's bf16 p50 over this one's) and, below
    the table, each model's FP8 accuracy against bf16 and each FP8 engine's logits against the reference engine
    over the same FP8 weights.
    """
    dev = doc["device"]
    fp8 = any("+" in name for e in doc["models"].values() for name in e["engines"])
    lines = [f"Decode latency, {dev['name']}, {doc['date']}, commit {doc['commit']}, torch "
             f"{doc['versions']['torch']}, triton {doc['versions']['triton']}; NVML peak "
             f"{_cell(dev.get('nvml_peak_GBps'), '.0f', '—')} GB/s, measured copy "
             f"{_cell(doc.get('copy_GBps'), '.0f', '—')} GB/s.", "",
             "| model | engine | p50 ms | p99 ms | tok/s | GB/s | % peak | % copy | × ref-compile | greedy = ref |"
             + (" × bf16 |" if fp8 else ""),
             "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if fp8 else "")]
    notes = []
    for model, e in doc["models"].items():
        engines = e["engines"]
        ran = {name for name, r in engines.items() if r.get("status") == "ok"}
        no_compile = "— (reference-compile not run)" if "reference-compile" not in ran else "—"
        no_ref = "— (reference not run)" if "reference" not in ran else "—"
        for name, r in engines.items():
            if r.get("status") != "ok":
                lines.append(f"| {model} | {name} | {r.get('status')}: {(r.get('reason') or '')[:60]} |||||||"
                             + ("|" if fp8 else ""))
                continue
            util = {k: None if r.get(k) is None else 100 * r[k] for k in ("util_peak", "util_copy")}
            vs_bf16 = (" — |" if "+" not in name else
                       f" {_cell(r.get('speedup_vs_bf16'), '.2f', f'— ({name.partition(chr(43))[0]} not run)')} |")
            lines.append(
                f"| {model} | {name} | {r['token_ms_p50']:.3f} | {r['token_ms_p99']:.3f} | "
                f"{1000 / r['token_ms_mean']:.0f} | {_cell(r.get('effective_GBps'), '.0f', '—')} | "
                f"{_cell(util['util_peak'], '.1f', '—')} | {_cell(util['util_copy'], '.1f', '—')} | "
                f"{_cell(r.get('speedup_vs_reference_compile'), '.2f', no_compile)} | "
                f"{_cell(r.get('greedy_agreement_vs_reference'), '.3f', no_ref)} |"
                + (vs_bf16 if fp8 else ""))
            if (v := r.get("vs_reference")) is not None:
                notes.append(f"{model} {name}: logits against the reference engine over the same weights, "
                             f"{v['rows']} teacher-forced rows: top-1 {v['top1']:.3f}, relative error max "
                             f"{v['rel_logit_err_max']:.2e}")
        for fmt, q in (e.get("quantization") or {}).items():
            notes.append(f"{model} {fmt} against bf16 (reference engine): " + (
                q["reason"] if "reason" in q else f"teacher-forced top-1 {q['top1']:.3f} over {q['rows']} rows, "
                f"relative logit error mean {q['rel_logit_err_mean']:.3f}, max {q['rel_logit_err_max']:.3f}"))
    return "\n".join(lines + ([""] + [f"- {n}" for n in notes] if notes else [])) + "\n"


def build_parser() -> argparse.ArgumentParser:
    """The command line (``benchmarks/run.py`` reads it to see which options this version has)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="llama-3.2-1b")
    ap.add_argument("--engines", help="engine names; ENGINE@stepwise times ENGINE with generate()'s launch-ahead off; "
                    "ENGINE@key=value:key=value a fused engine or megakernel with those parameters (e.g. "
                    "reference-fused-pdl@norm_stats=atomic, megakernel@slot_boxes=2)",
                    default="reference,reference-cudagraph,reference-compile,reference-fused,reference-fused-pdl,"
                            "megakernel-noprefetch,megakernel")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--long-contexts", default="4096", help="comma-separated contexts timed per engine ('' none)")
    ap.add_argument("--long-context-engines", default="reference-compile,megakernel")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--weights", default="bf16", help="weight formats timed, comma-separated: bf16 (always, the "
                    "baseline), fp8, fp8-all; an FP8 format adds an entry <engine>+<format> beside each engine's")
    ap.add_argument("--accuracy-tokens", type=int, default=256, help="teacher-forced tokens of the FP8 accuracy check")
    ap.add_argument("--max-seconds", type=float, default=400)
    ap.add_argument("--out", default="benchmarks/results/decode_latency.json")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        formats = weight_formats(args.weights)   # a bad option is said before anything runs
    except ValueError as e:
        print(f"decode_latency: {e}", file=sys.stderr)
        return 2

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
                        "dtype": args.dtype, "weights": "dummy (seed 0)", "weight_formats": formats},
           "models": {}}
    for model in [m for m in args.models.split(",") if m]:
        cfg = get_preset(model)
        w = dummy_weights(cfg, "cuda", dtype, seed=0)
        variants = {"bf16": w, **{f: w.as_format(f) for f in formats[1:]}}   # the same weights, quantized
        prompt = torch.randint(3, cfg.vocab_size, (args.prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
        max_seq = max([args.prompt_len + args.gen_len + 8] + [c + 40 for c in longs])
        mean_ctx = args.prompt_len + args.gen_len // 2
        traffic = {f: step_traffic(cfg, dtype.itemsize, mean_ctx, weights=f) for f in formats}
        entry = {"bytes_per_step": traffic["bf16"]["total_bytes"], "context_for_bytes": mean_ctx, "engines": {}}
        if len(formats) > 1:
            entry["bytes_per_step_by_weights"] = {f: t["total_bytes"] for f, t in traffic.items()}
        checks = {}  # format -> (forced tokens, the reference engine's teacher-forced logits over those weights)
        for name in [e for e in args.engines.split(",") if e]:
            for fmt in formats:
                label = name if fmt == "bf16" else f"{name}+{fmt}"
                if time.time() > deadline:
                    entry["engines"][label] = {"status": "skipped", "reason": "time budget (--max-seconds) spent"}
                    continue
                if why := skip_reason(name, w.device):
                    entry["engines"][label] = {"status": "skipped", "reason": why}
                    print(f"{model} {label}: skipped: {why}", flush=True)
                    continue
                lc = longs if name in args.long_context_engines.split(",") else []
                try:
                    if fmt != "bf16" and fmt not in checks:
                        checks[fmt] = reference_check(variants[fmt], cfg.vocab_size, prompt, max_seq)
                    r = bench_engine(name, variants[fmt], prompt, args.gen_len, args.runs, args.warmup, max_seq, lc,
                                     deadline, check=checks.get(fmt))
                except EngineUnavailable as e:  # this model or device rules it out: a skip with the reason
                    entry["engines"][label] = {"status": "skipped", "reason": str(e)}
                    print(f"{model} {label}: skipped: {e}", flush=True)
                    continue
                except Exception as e:  # record and continue: one engine must not sink the run
                    entry["engines"][label] = {"status": "failed", "reason": f"{type(e).__name__}: {str(e)[:300]}"}
                    print(f"{model} {label}: FAILED {e}", file=sys.stderr)
                    continue
                nbytes = traffic[fmt]["total_bytes"]
                bw = bandwidth(nbytes, r["token_ms_p50"], info.get("nvml_peak_GBps"), copy["copy_GBps"])
                r.update(status="ok", weights=fmt, bytes_per_step=nbytes, **bw)
                for pt in r["long_context"]:
                    t = step_traffic(cfg, dtype.itemsize, pt["context"] + 16, weights=fmt)
                    pt.update(bytes_per_step=t["total_bytes"], kv_bytes=t["kv_read_bytes"] + t["kv_write_bytes"],
                              **bandwidth(t["total_bytes"], pt["token_ms_p50"], info.get("nvml_peak_GBps")))
                entry["engines"][label] = r
                doc["models"][model] = entry
                _write_json(doc, Path(args.out))
                print(f"{model} {label}: p50 {r['token_ms_p50']:.3f} ms  p99 {r['token_ms_p99']:.3f} ms  "
                      f"{(bw['util_peak'] or 0) * 100:.1f}% of peak", flush=True)
        ref = entry["engines"].get("reference", {}).get("tokens")
        if len(formats) > 1:
            try:
                entry["quantization"] = quantization_accuracy(variants, ref, prompt, args.accuracy_tokens, max_seq)
            except Exception as e:  # recorded: the timings above stand without it
                entry["quantization"] = {f: {"reason": f"{type(e).__name__}: {str(e)[:300]}"} for f in formats[1:]}
        finish_entry(entry, ref)
        doc["models"][model] = entry
        del w, variants
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
