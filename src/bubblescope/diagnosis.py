"""The main job: measure a model on every engine, side by side, into one results document.

``diagnose(...)`` = for each engine: build; warm up; R timed generations (host wall time per token with
the token on the host); one profiled run (torch.profiler/CUPTI trace -> timeline metrics); effective
bandwidth vs the NVML peak and the measured copy bandwidth; teacher-forced correctness against the
reference engine; an optional context sweep. Then findings, ``results.json`` and ``report.html`` in ``out``.
Nothing here renders; ``reports`` does.
"""

from __future__ import annotations

import datetime as _dt
import gc
import platform
import statistics
import sys
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from .version import __version__
from .engines import (build_engine, check_prefill, default_engines, get_engine_spec, prepare_triton, takes_prefill,
                      unavailable_before_load)
from .errors import BubblescopeError, EngineUnavailable, KernelStuck, OutputNotWritten
from .generation import SamplingParams, generate, random_ids, teacher_forced_logits
from .models import find_model_file, load_model, parse_dtype, resolve_device
from .outdir import RunFolder, check_out_dir

GPU_DEFAULT_MODEL, CPU_DEFAULT_MODEL, CPU_FALLBACK_MODEL = "llama-3.2-1b", "stories260k", "tiny-llama"
SWEEP_STEPS = 16           # decode steps timed at each context of the sweep
CORRECTNESS_STEPS = 64     # teacher-forced steps compared against the reference engine
# Profiled decode steps left out of every figure: the first carries the profiler's own start (CUPTI's first
# activity buffers, libraries loaded on first use), on top of the unprofiled warm-up steps before the trace.
PROFILE_WARMUP_STEPS = 1


def _percentile(xs: list[float], q: float) -> float | None:
    """numpy's linear-interpolated percentile ``q`` (0-100) of ``xs``, or None for no samples."""
    return float(np.percentile(xs, q)) if xs else None


def latency_stats(token_ms: list[float], ttft_ms: list[float], decode_shares: list[float],
                  e2e_ms: list[float] | None = None) -> dict:
    """Token latency summary (ms): mean, p50, p90, p99 of per-token host wall times (the TPOT: time per output
    token after the first), TTFT median, tokens/s = 1000 / mean, the decode share of total generation time
    (median over runs), and ``e2e_ms``: the median over runs of each generation's measured time (TTFT plus its
    decode steps; None without ``e2e_ms``)."""
    mean = statistics.fmean(token_ms) if token_ms else None
    return {
        "ttft_ms": statistics.median(ttft_ms) if ttft_ms else None,
        "e2e_ms": statistics.median(e2e_ms) if e2e_ms else None,
        "token_ms_mean": mean,
        "token_ms_p50": _percentile(token_ms, 50),
        "token_ms_p90": _percentile(token_ms, 90),
        "token_ms_p99": _percentile(token_ms, 99),
        "tok_per_s": 1000.0 / mean if mean else None,
        "decode_share": statistics.median(decode_shares) if decode_shares else None,
        "token_ms_samples": [round(x, 5) for x in token_ms],
        "ttft_ms_samples": [round(x, 5) for x in ttft_ms],
    }


def model_notes(requested: str | None, model: str, source: str, dev: torch.device,
                checkpoint: str | None = None) -> list[str]:
    """Plain-words notes when the measured model is not what a user may assume: a default chosen for them
    (neither MODEL nor ``checkpoint`` given), a missing weights file replaced by another model or by seeded
    dummy weights (text is then meaningless; timings and bytes are those of the real shapes)."""
    from .models.loader import KNOWN_FILES, model_search_dirs

    searched = ", ".join(str(d) for d in model_search_dirs())
    notes = []
    if requested is None and checkpoint is None:
        if dev.type == "cpu" and model == CPU_FALLBACK_MODEL:
            notes.append(f"model: none given and {CPU_DEFAULT_MODEL}'s weights file was not found (searched "
                         f"{searched}; set BUBBLESCOPE_MODELS or pass MODEL), so the {CPU_FALLBACK_MODEL} preset "
                         "with seeded dummy weights was measured")
        else:
            notes.append(f"model: none given; measured the default {model} for a {dev.type.upper()} run")
    if source == "dummy":
        if model.lower() in KNOWN_FILES and requested is not None:
            notes.append(f"model: {model}'s weights file was not found (searched {searched}), so seeded dummy "
                         "weights of its config were measured")
        elif not (requested is None and model == CPU_FALLBACK_MODEL):
            notes.append(f"model: {model} ran with seeded dummy weights (real shapes and bytes, meaningless text)")
    return notes


def default_model(device: torch.device, checkpoint: str | None) -> str:
    """The model when MODEL is left out: ``checkpoint`` when given (it is what the user named); else on a GPU
    llama-3.2-1b (dummy weights), on CPU stories260k when its file is found, else tiny-llama."""
    if checkpoint:
        return checkpoint
    if device.type == "cuda":
        return GPU_DEFAULT_MODEL
    return CPU_DEFAULT_MODEL if find_model_file(CPU_DEFAULT_MODEL) else CPU_FALLBACK_MODEL


# Ablations whose only purpose is timing: under Triton's CPU interpreter their timings mean nothing.
CPU_DEFAULT_SKIPS = {
    "reference-fused": "its kernels under the CPU Triton interpreter run program by program (about a second per "
                       "step): its timing measures the interpreter (run on a GPU, or name it in --engines to check "
                       "its numerics)",
    "megakernel-stages": "timing ablation: under the CPU Triton interpreter it measures the interpreter, not "
                         "fusion (run on a GPU, or name it in --engines)",
    "megakernel-noprefetch": "timing ablation: the L2 prefetch it removes does not exist in the CPU Triton "
                             "interpreter (run on a GPU, or name it in --engines)",
}


def check_workload(**values: int | None) -> None:
    """Check the workload sizes by their option names (``prompt_len``, ``gen_len``, ``runs``, ``warmup``,
    ``profile_steps``, in tokens, runs or steps); None (the default, still to be chosen) passes. ``gen_len``
    needs 2: the first token comes from prefill, the timed decode steps from the rest.

    Raises:
        BubblescopeError: ``--<option>: must be at least <n>, got <v>``.
    """
    lows = {"prompt_len": 1, "gen_len": 2, "runs": 1, "warmup": 0, "profile_steps": 1}
    for key, v in values.items():
        if v is not None and v < lows[key]:
            raise BubblescopeError(f"--{key.replace('_', '-')}: must be at least {lows[key]}, got {v}")


def check_positions(cfg, prompt_len: int, gen_len: int, profile_steps: int, sweep=(), extra_steps: int = 0) -> int:
    """The KV-cache length (positions) a workload needs: the timed run (prompt + generated + profiled steps +
    ``extra_steps`` + 8 spare) or the largest sweep context plus its timed steps, whichever is longer.

    Raises:
        BubblescopeError: ``cfg`` (a ModelConfig) has fewer ``max_position_embeddings``; the message names the
            options to lower.
    """
    run = prompt_len + gen_len + profile_steps + extra_steps + 8
    need = max([run] + [c + SWEEP_STEPS + 1 for c in sweep])
    if need > cfg.max_position_embeddings:
        what = (f"--prompt-len {prompt_len} + --gen-len {gen_len} + --profile-steps {profile_steps}" if run >= need
                else f"--context-sweep {max(sweep)}")
        raise BubblescopeError(f"{what}: the workload needs {need} positions (with spare steps) but {cfg.name} "
                               f"supports max_position_embeddings={cfg.max_position_embeddings}")
    return need


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _free(dev: torch.device) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


class _Progress:
    """A rich progress bar on stderr, or nothing (library use)."""

    def __init__(self, enabled: bool, total: int):
        self.bar = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                TimeElapsedColumn(), console=Console(stderr=True), transient=False)
            self.task = self.bar.add_task("diagnose", total=total)

    def __enter__(self):
        if self.bar:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self.bar:
            self.bar.__exit__(*exc)

    def update(self, text: str, advance: int = 0) -> None:
        if self.bar:
            self.bar.update(self.task, description=text, advance=advance)
            if advance and not self.bar.console.is_terminal:
                # Piped or logged (CI): a live bar draws nothing until the end, so say each engine's outcome.
                self.bar.console.print(text)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:500]


def _threads() -> dict:
    """The CPU threads this run had: torch's intra-op threads, ``$OMP_NUM_THREADS`` as set (None: unset) and the
    machine's cores (for the findings' thread advice, which must not ask for what is set already)."""
    import os
    return {"torch_threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "cpu_count": os.cpu_count()}


def _versions(dev_info: dict) -> dict:
    try:
        import transformers
        tf = transformers.__version__
    except ImportError:
        tf = None
    return {"bubblescope": __version__, "python": platform.python_version(), "torch": torch.__version__,
            "triton": dev_info.get("triton_version"), "transformers": tf, "cuda": dev_info.get("cuda_version"),
            "driver": dev_info.get("driver_version")}


def diagnose(model: str | None = None, checkpoint: str | None = None, engines: list[str] | None = None,
             prompt_len: int | None = None, gen_len: int | None = None, runs: int = 3, warmup: int = 1,
             context_sweep: list[int] | None = None, dtype: str | None = None, device: str | None = None,
             out: str | Path = "bubblescope-out", profile_steps: int = 8, seed: int = 0,
             progress: bool = False, command: str | None = None, write: bool = True, tuning: str | None = None,
             counters: bool = False, prefill: str | None = None):
    """Measure ``model`` on each engine and return a :class:`~bubblescope.reports.results.Results`.

    Defaults: on a GPU, ``llama-3.2-1b`` with dummy bfloat16 weights, prompt 128, 128 new tokens, context
    sweep 128/1024/4096; on a CPU-only machine stories260K (float32) when its file is found
    (``--checkpoint``, ``$BUBBLESCOPE_MODELS`` or ``../shared/models``), else the ``tiny-llama`` dummy
    preset, prompt 16, 32 new tokens, no sweep. Writes ``out/results.json``, ``out/report.html`` and one
    trace per engine under ``out/traces/`` unless ``write`` is False: staged in a hidden folder and
    published together at the end, replacing the previous run's (an interrupted run leaves the previous
    run intact; see :mod:`bubblescope.outdir`). ``tuning``: a tuned file (``bubblescope tune --save``);
    megakernel engines take the entry for prompt + generated length, recorded in their entry's ``tuning``.
    ``counters``: also read each ok engine's hardware counters with Nsight Compute
    (``counters.collect_counters``) into the document's ``counters`` section, which says why when it cannot.
    ``prefill``: the megakernel engines' prefill, ``batched`` (None: the default) or ``stepwise`` (one decode
    launch per prompt token, the ablation); recorded as ``workload.prefill``; other engines prefill in one forward.

    Raises:
        BubblescopeError: bad options (unknown engine/model/dtype/device, non-positive lengths, a context
            that does not fit the model, an ``out`` that cannot be a directory or written into (refused before
            the model is loaded), a bad tuned file); every engine skipped (nothing written then, see
            :func:`nothing_ran`; before the model is loaded when the device alone rules every engine out,
            :func:`~bubblescope.engines.unavailable_before_load`); an unknown ``prefill``, or ``stepwise`` when no
            engine asked for has a prefill choice.
        OutputNotWritten: a trace, results.json or report.html could not be written (disk full, over the file
            size limit): the run stops there, whichever engine was measuring, and ``out`` keeps the previous run.
    """
    from .tuned import load_tuning
    from .profiler.hardware import device_info, measure_copy_bandwidth
    from .reports.results import SCHEMA

    tuned = load_tuning(tuning) if tuning is not None else None
    dev = resolve_device(device)
    prepare_triton(dev)
    on_gpu = dev.type == "cuda"
    # Default: every registered engine but the kernels `megakernel` already stands for (engines.BY_NAME_ONLY);
    # those that cannot run here are listed as skipped with the reason.
    names = list(dict.fromkeys(engines)) if engines else default_engines()  # a name given twice runs once
    skips = CPU_DEFAULT_SKIPS if not on_gpu and not engines else {}
    for n in names:
        if n != "auto":
            get_engine_spec(n, "--engines")
    check_prefill(prefill)
    if prefill == "stepwise" and not any(takes_prefill(n) for n in names):  # it would change nothing measured
        raise BubblescopeError(f"--prefill stepwise: none of the engines ({', '.join(names)}) has a prefill choice; "
                               "token-by-token prefill is the megakernel engines' ablation")
    prompt_len = prompt_len if prompt_len is not None else (128 if on_gpu else 16)
    gen_len = gen_len if gen_len is not None else (128 if on_gpu else 32)
    sweep = sorted(set(context_sweep)) if context_sweep is not None else ([128, 1024, 4096] if on_gpu else [])
    check_workload(prompt_len=prompt_len, gen_len=gen_len, runs=runs, warmup=warmup, profile_steps=profile_steps)
    if any(c < 1 for c in sweep):
        raise BubblescopeError(f"--context-sweep: contexts must be positive, got {sweep}")
    if write:  # before the model is loaded or anything is measured
        check_out_dir(out)
    # Known before the model loads: every engine asked for needs what this machine lacks (a GPU, a package), e.g.
    # `--engines reference-cudagraph,megakernel-gluon` on CPU. When any engine may run, the loop below skips the
    # rest with the same reasons.
    ruled_out = [{"name": n, "reason": skips.get(n) or unavailable_before_load(n, dev, "--engines")} for n in names]
    if all(e["reason"] for e in ruled_out):
        raise BubblescopeError(nothing_ran(ruled_out))
    skips = {e["name"]: e["reason"] for e in ruled_out if e["reason"]}  # not built again below to find out
    requested, model = model, model or default_model(dev, checkpoint)
    tdtype = parse_dtype(dtype or ("bfloat16" if on_gpu else "float32"))
    loaded = load_model(model, checkpoint=checkpoint, device=dev, dtype=tdtype, seed=seed)
    cfg = loaded.config
    names, auto = _resolve_auto(names, loaded.weights)
    # the trace's warm-up steps (3 unprofiled, PROFILE_WARMUP_STEPS profiled) fit in the generated length
    max_seq = check_positions(cfg, prompt_len, gen_len, profile_steps, sweep)

    out = Path(out)
    if write:
        # Found now, not after minutes of measuring: an output path taken by a directory (or a device).
        for target in [out / "results.json", out / "report.html"] + [out / "traces" / f"{n}.json.gz" for n in names]:
            if target.exists() and not target.is_file():
                raise BubblescopeError(f"--out {out}: {target} exists and is not a regular file")
    info = device_info(dev if on_gpu else "cpu")
    copy = measure_copy_bandwidth(dev) if on_gpu else {"copy_GBps": None, "reason": "CPU run"}
    notes = (model_notes(requested, model, loaded.source, dev, checkpoint) + loaded.warnings
             + list(info.get("notes") or []))
    if tuned is not None and (unchecked := tuned.check_model(cfg)):
        notes.append(unchecked)
    if not on_gpu:
        notes.append("CPU only: no GPU on this machine, so GPU timeline and bandwidth metrics are unavailable")
    if copy.get("reason") and on_gpu:
        notes.append(f"copy bandwidth not measured: {copy['reason']}")
    if auto:
        notes.append(f"--engines auto: {auto['engine']} ({auto['reason']})")
    doc = {
        "schema": SCHEMA,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command or "bubblescope.diagnose(...)",
        "versions": _versions(info),
        "device": {"type": dev.type, "name": info.get("name"), "sm_count": info.get("sm_count"),
                   "l2_bytes": info.get("l2_bytes"), "nvml_peak_GBps": info.get("nvml_peak_GBps"),
                   "copy_GBps": copy.get("copy_GBps"), "max_sm_clock_MHz": info.get("max_sm_clock_MHz"),
                   "max_mem_clock_MHz": info.get("max_mem_clock_MHz"),
                   "bus_width_bits": info.get("bus_width_bits"), "notes": notes, "threads": _threads()},
        "model": {"name": cfg.name if loaded.source != "dummy" or model.lower() != cfg.name else model,
                  "source": loaded.source, "path": loaded.path, "parameters": cfg.num_parameters(),
                  "weight_bytes": loaded.weights.nbytes(), "dtype": str(tdtype).replace("torch.", ""),
                  "config": cfg.to_hf_dict()},
        "workload": {"prompt_len": prompt_len, "gen_len": gen_len, "runs": runs, "warmup": warmup,
                     "context_sweep": sweep, "seed": seed, "prefill": prefill or "batched"},
        "engines": [],
        "findings": [],
    }
    gen = torch.Generator().manual_seed(seed)
    prompt = random_ids(cfg.vocab_size, prompt_len, gen)
    # Everything is written into a staging folder and published at the end (see outdir.RunFolder).
    created = write and not out.exists()
    with (RunFolder(out) if write else nullcontext()) as stage:
        ctx = dict(doc=doc, loaded=loaded, prompt=prompt, gen_len=gen_len, runs=runs, warmup=warmup, sweep=sweep,
                   max_seq=max_seq, out=stage.stage if write else out, profile_steps=profile_steps, write=write,
                   seed=seed, tuning=tuned, prefill=prefill)
        counters_args = (model, checkpoint, tuning) if counters else None
        results = _run_engines(names, skips, ctx, progress, auto, counters_args)
        # nothing measured: nothing published, so the previous run's results stay (the staging folder goes
        # with the block)
        nothing = nothing_ran(doc["engines"]) if all(e["status"] == "skipped" for e in doc["engines"]) else None
        if write and not nothing:
            from .reports.html import write_html
            from .reports.results import write_results
            write_results(results, stage.stage / "results.json")
            write_html(results, stage.stage / "report.html")
            stage.publish()
    if nothing:
        if created:  # the folder this run made, empty again
            try:
                out.rmdir()
            except OSError:
                pass
        raise BubblescopeError(nothing)
    return results


def nothing_ran(entries: list[dict]) -> str:
    """The one-line error when every engine of ``entries`` (results.json engine entries) was skipped: each
    engine with its reason."""
    why = "; ".join(f"{e['name']}: {e.get('reason') or 'skipped'}" for e in entries)
    return f"--engines: no engine ran on this machine ({why})"


def _run_engines(names: list[str], skips: dict[str, str], ctx: dict, progress: bool, auto: dict | None = None,
                 counters_args: tuple | None = None):
    """Measure each engine into ``ctx["doc"]`` (traces under ``ctx["out"]/traces``), add the findings and
    return the :class:`Results`. ``auto``: what ``--engines auto`` chose (its failure adds the reference as the
    fallback); ``counters_args``: (model, checkpoint, tuning) to read hardware counters afterwards, or None."""
    from .reports.findings import find
    from .reports.ladder import ladder
    from .reports.results import Results

    doc, dev = ctx["doc"], ctx["loaded"].weights.device
    on_gpu, notes = dev.type == "cuda", doc["device"]["notes"]
    oracle = None
    with _Progress(progress, total=len(names)) as bar:
        for name in _with_fallback(names, auto, doc["engines"]):
            bar.update(f"{name}: building")
            entry = {"name": name, "description": get_engine_spec(name).description, "status": "ok",
                     "reason": None, "latency": None, "bandwidth": None, "timeline": None, "intrakernel": None,
                     "compile": None, "correctness": None, "sweep": [], "trace_path": None}
            if auto and name == auto["engine"]:
                entry["auto"] = auto
            if doc["engines"] and doc["engines"][-1].get("fallback_to") == name:
                failed = doc["engines"][-1]
                entry["fallback"] = {"from": failed["name"], "error": failed["reason"]}
            try:
                if name in skips:
                    raise EngineUnavailable(skips[name])
                if oracle is None:
                    oracle = _oracle(ctx)
                    if oracle["fp32_reason"]:
                        notes.append(f"numerical fidelity against fp32 not measured: {oracle['fp32_reason']}")
                _measure(name, entry, ctx, oracle, bar)
            except EngineUnavailable as e:
                entry.update(status="skipped", reason=str(e))
            except OutputNotWritten:  # the disk, not the engine: the run stops, the previous one stays
                raise
            except (KernelStuck, RuntimeError, BubblescopeError, ValueError, AssertionError) as e:
                entry.update(status="failed", reason=_one_line(e))
            doc["engines"].append(entry)
            _free(dev)
            bar.update(f"{name}: {entry['status']}", advance=1)
        if counters_args is not None:
            from .counters import collect_counters
            model, checkpoint, tuning = counters_args
            doc["counters"] = collect_counters(doc, model, str(dev), doc["model"]["dtype"], ctx["seed"], checkpoint,
                                               tuning, progress=bar.update)
        bar.update("diagnose: done")
    if not on_gpu and any(e["name"].startswith("megakernel") and e["status"] == "ok" for e in doc["engines"]):
        notes.append("megakernel engines ran under the Triton CPU interpreter (one program): their latency, "
                     "bandwidth and intra-kernel timeline measure the interpreter, not the kernel; only their "
                     "correctness numbers carry over to a GPU")
    doc["findings"] = find(doc)
    doc["ladder"] = ladder(doc)
    return Results(doc)


def _resolve_auto(names: list[str], weights) -> tuple[list[str], dict | None]:
    """Replace ``auto`` in the engine list by the engine it stands for here (``fallback.choose_auto``)."""
    if "auto" not in names:
        return names, None
    from .fallback import choose_auto
    chosen, reason = choose_auto(weights)
    return list(dict.fromkeys(chosen if n == "auto" else n for n in names)), {"engine": chosen, "reason": reason}


def _with_fallback(names: list[str], auto: dict | None, entries: list[dict]):
    """The engines to measure; when the engine ``auto`` chose fails (a stuck task, a launch error), the
    reference is measured next in its place (unless it is in the list anyway), its entry's ``fallback``
    naming the failure."""
    from .fallback import BACKUP, PRIMARY
    for name in names:
        yield name
        if auto and name == auto["engine"] == PRIMARY and BACKUP not in names and entries[-1]["status"] == "failed":
            entries[-1]["fallback_to"] = BACKUP
            yield BACKUP


def _oracle(ctx: dict) -> dict:
    """The tokens every engine is teacher-forced with, the reference engine's logits (float32, CPU), the fp32
    reference's on the same tokens (``fp32``; None with ``fp32_reason`` when it could not run) and the run-dtype
    reference's own fidelity against it (``ref_fidelity``, :func:`bubblescope.fidelity.fidelity`).

    Real weights: the reference's own greedy continuation (realistic text). Dummy weights: seeded random
    ids, because random tied embeddings make greedy decoding repeat one token, which every engine would
    "agree" on trivially.
    """
    ref = build_engine("reference", ctx["loaded"].weights, ctx["max_seq"])
    steps = min(CORRECTNESS_STEPS, ctx["gen_len"])
    if ctx["loaded"].source == "dummy":
        gen = torch.Generator().manual_seed(ctx["seed"] + 1)
        forced = random_ids(ctx["loaded"].config.vocab_size, steps, gen)
    else:
        forced = generate(ref, ctx["prompt"], steps + 1, eos_ids=()).tokens[:steps]
    logits = teacher_forced_logits(ref, ctx["prompt"], forced)
    del ref
    from .fidelity import fp32_oracle
    # the same tokens through the reference in float32: the bar of each engine's KL and NLL
    return {"forced": forced, "logits": logits,
            **fp32_oracle(ctx["loaded"].weights, ctx["prompt"], forced, ctx["max_seq"], logits)}


def _measure(name: str, entry: dict, ctx: dict, oracle: dict, bar: _Progress) -> None:
    from .profiler.traffic import bandwidth, step_traffic

    doc, loaded = ctx["doc"], ctx["loaded"]
    cfg = loaded.config
    dev = loaded.weights.device
    from .tuned import describe_pick, engine_params
    prompt = ctx["prompt"]
    params, entry["tuning"] = engine_params(ctx["tuning"], name, len(prompt) + ctx["gen_len"], dev.type)
    if entry["tuning"]:
        doc["device"]["notes"].append(describe_pick(entry["tuning"], name))
    engine = build_engine(name, loaded.weights, ctx["max_seq"], params=params,
                          prefill=ctx["prefill"] if takes_prefill(name) else None)
    bar.update(f"{name}: warm-up")
    for _ in range(ctx["warmup"]):
        generate(engine, prompt, ctx["gen_len"], eos_ids=())
    token_ms, ttft, shares, e2e = [], [], [], []
    for r in range(ctx["runs"]):
        bar.update(f"{name}: timed run {r + 1}/{ctx['runs']}")
        _sync(dev)
        res = generate(engine, prompt, ctx["gen_len"], SamplingParams(), eos_ids=())
        token_ms += res.token_ms
        ttft.append(res.ttft_ms)
        shares.append(res.decode_share)
        e2e.append(res.total_ms)
    entry["latency"] = latency_stats(token_ms, ttft, [s for s in shares if s is not None], e2e)

    dtype_bytes = loaded.weights.dtype.itemsize
    mean_ctx = len(prompt) + ctx["gen_len"] // 2
    traffic = step_traffic(cfg, dtype_bytes, mean_ctx)
    dev_doc = doc["device"]
    bw = bandwidth(traffic["total_bytes"], entry["latency"]["token_ms_p50"],
                   dev_doc["nvml_peak_GBps"], dev_doc["copy_GBps"])
    entry["bandwidth"] = {"bytes_per_step": traffic["total_bytes"],
                          "kv_bytes_per_step": traffic["kv_read_bytes"] + traffic["kv_write_bytes"],
                          "context": mean_ctx, **bw}

    bar.update(f"{name}: correctness")
    got = teacher_forced_logits(engine, prompt, oracle["forced"])
    ref = oracle["logits"]
    from .fidelity import fidelity_entry
    entry["correctness"] = {"reference": "reference", "steps": int(ref.shape[0]), **logit_agreement(got, ref),
                            **fidelity_entry(got, oracle["forced"], oracle)}

    bar.update(f"{name}: profiling")
    _profile(name, engine, entry, ctx)
    if hasattr(engine, "compile_info"):
        entry["compile"] = engine.compile_info()

    for c in ctx["sweep"]:
        bar.update(f"{name}: context {c}")
        entry["sweep"].append(_sweep_point(engine, cfg, c, dtype_bytes, dev_doc, ctx["seed"]))
    del engine


def _profile(name: str, engine, entry: dict, ctx: dict) -> None:
    from .profiler.capture import append_trace_events, capture_decode_trace
    from .profiler.trace.timeline import step_timeline, timeline_summary
    from .profiler.trace import load_trace

    out = ctx["out"] if ctx["write"] else Path(_tmpdir())
    (out / "traces").mkdir(parents=True, exist_ok=True)
    path = out / "traces" / f"{name}.json.gz"
    steps = ctx["profile_steps"]
    timeline_ctx = engine.timeline() if hasattr(engine, "timeline") else nullcontext(None)
    with timeline_ctx as intra:
        cap = capture_decode_trace(engine, torch.tensor(ctx["prompt"]), steps=steps + PROFILE_WARMUP_STEPS,
                                   warmup=3, out_path=path)
    trace = load_trace(cap.trace_path)
    # the first profiled step is left out of every figure (PROFILE_WARMUP_STEPS); the summary says how many
    summary = timeline_summary(trace, skip_steps=PROFILE_WARMUP_STEPS)
    summary["warmup_steps"] = PROFILE_WARMUP_STEPS
    if summary.get("available") and summary.get("steps"):
        summary["step_timeline"] = step_timeline(
            trace, step_index=PROFILE_WARMUP_STEPS + min(summary["steps"] - 1, steps // 2))
    else:
        summary["step_timeline"] = None
    if not cap.gpu:
        # No CUDA activity was recorded: launch and sync counts would be zeros that measured nothing.
        summary["available"] = False
        summary["reason"] = summary.get("reason") or cap.note
        for key in ("launches_per_step", "launches_per_s", "launch_share", "sync_share"):
            summary[key] = None
    entry["timeline"] = summary
    if intra is not None and getattr(intra, "frame", None) is not None:
        from .megakernel_engine.timeline import chrome_events, intrakernel_summary
        df = intra.frame
        # only megakernel engines know their tasks' weight bytes and ring slot, which the weight stream's feed needs
        task_bytes = slot = None
        if hasattr(engine, "task_weight_bytes"):
            task_bytes, slot = engine.task_weight_bytes(), engine.ring_slot_bytes()
        entry["intrakernel"] = intrakernel_summary(df, task_bytes=task_bytes, slot_bytes=slot)
        entry["intrakernel"]["activity"] = _activity(df, engine, ctx)
        append_trace_events(cap.trace_path, chrome_events(df, ts_offset_us=intra.ts_offset_us))
    entry["trace_path"] = str(path.relative_to(out)) if ctx["write"] else None


def logit_agreement(got, ref) -> dict:
    """An engine's teacher-forced logits ``got`` against the reference's ``ref`` (both float32 (steps, V)):
    ``token_agreement`` (share of steps with the same argmax), ``max_abs_logit_diff`` (max |got − ref|) and
    ``rel_logit_err`` (max over steps of ‖got − ref‖₂ / ‖ref‖₂). A difference that is not finite (NaN or infinite
    logits, e.g. from NaN weights, which loading warns about) is recorded as None: results.json holds finite
    numbers or null (docs/results-schema.md)."""
    import math

    def finite(v: float) -> float | None:
        return v if math.isfinite(v) else None
    agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    rel = ((got - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-30)).max().item()
    return {"token_agreement": agree, "max_abs_logit_diff": finite((got - ref).abs().max().item()),
            "rel_logit_err": finite(rel)}


def _activity(df, engine, ctx: dict) -> dict | None:
    """The binned megakernel view of the profiled step (all programs), bandwidth estimated from the
    tasks' bytes at the step's context (prompt + half the profiled steps)."""
    from .reports.intrakernel import activity_profile, opcode_bytes

    weights = ctx["loaded"].weights
    context = len(ctx["prompt"]) + ctx["profile_steps"] // 2
    grid = getattr(engine, "compile_info", lambda: {})() or {}
    return activity_profile(df, programs=grid.get("grid"),
                            bytes_by_opcode=opcode_bytes(weights.config, weights.dtype.itemsize, context))


def _tmpdir() -> str:
    import tempfile
    return tempfile.mkdtemp(prefix="bubblescope-")


def _sweep_point(engine, cfg, context: int, dtype_bytes: int, dev_doc: dict, seed: int) -> dict:
    """Median decode-step time (ms, host wall, token on the host) at ``context`` positions of KV cache, and
    ``ttft_ms``: the time to first token of that generation (the prefill of a ``context``-token prompt, ms)."""
    from .profiler.traffic import bandwidth, step_traffic

    gen = torch.Generator().manual_seed(seed + context)
    prompt = random_ids(cfg.vocab_size, context, gen)
    res = generate(engine, prompt, SWEEP_STEPS + 1, eos_ids=())
    p50 = _percentile(res.token_ms, 50)
    traffic = step_traffic(cfg, dtype_bytes, context + SWEEP_STEPS // 2)
    bw = bandwidth(traffic["total_bytes"], p50, dev_doc["nvml_peak_GBps"], dev_doc["copy_GBps"])
    return {"context": context, "token_ms_p50": p50, "ttft_ms": res.ttft_ms,
            "bytes_per_step": traffic["total_bytes"],
            "kv_bytes_per_step": traffic["kv_read_bytes"] + traffic["kv_write_bytes"],
            "effective_GBps": bw["effective_GBps"], "util_peak": bw["util_peak"]}


def command_line() -> str:
    """The command as typed (for the results' provenance)."""
    return " ".join(["bubblescope"] + sys.argv[1:])
