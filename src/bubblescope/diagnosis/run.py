"""The run: plan, load the model once, measure each engine in turn, derive the findings and the ladder, and
publish ``results.json``, ``report.html`` and the traces together (:class:`~bubblescope.outdir.RunFolder`)."""

from __future__ import annotations

import gc
from contextlib import nullcontext
from pathlib import Path

import torch

from ..engines import get_engine_spec, takes_prefill
from ..errors import BubblescopeError, EngineUnavailable, KernelStuck, OutputNotWritten
from ..generation import random_ids
from ..models import load_model
from ..outdir import RunFolder
from .document import new_document
from .measure import measure_engine, oracle, unquantized_oracle
from .plan import Bench, RunPlan, check_positions, nothing_ran, plan_run


def diagnose(model: str | None = None, checkpoint: str | None = None, engines: list[str] | None = None,
             prompt_len: int | None = None, gen_len: int | None = None, runs: int = 3, warmup: int = 1,
             context_sweep: list[int] | None = None, dtype: str | None = None, device: str | None = None,
             out: str | Path = "bubblescope-out", profile_steps: int = 8, seed: int = 0,
             progress: bool = False, command: str | None = None, write: bool = True, tuning: str | None = None,
             counters: bool = False, prefill: str | None = None, weights: str | None = None):
    """Measure ``model`` on each engine and return a :class:`~bubblescope.reports.results.Results`.

    Defaults (:mod:`~bubblescope.diagnosis.plan`): on a GPU, ``llama-3.2-1b`` with dummy bfloat16 weights, prompt
    128, 128 new tokens, context sweep 128/1024/4096; on a CPU-only machine stories260K (float32) when its file is
    found (``--checkpoint``, ``$BUBBLESCOPE_MODELS`` or ``../shared/models``), else the ``tiny-llama`` dummy
    preset, prompt 16, 32 new tokens, no sweep. Writes ``out/results.json``, ``out/report.html`` and one
    trace per engine under ``out/traces/`` unless ``write`` is False: staged in a hidden folder and
    published together at the end, replacing the previous run's (an interrupted run leaves the previous
    run intact; see :mod:`bubblescope.outdir`). ``tuning``: a tuned file (``bubblescope tune --save``);
    megakernel engines take the entry for prompt + generated length, recorded in their entry's ``tuning``.
    ``counters``: also read each ok engine's hardware counters with Nsight Compute
    (``counters.collect_counters``) into the document's ``counters`` section, which says why when it cannot.
    ``prefill``: the megakernel engines' prefill, ``batched`` (None: the default) or ``stepwise`` (one decode
    launch per prompt token, the ablation); recorded as ``workload.prefill``; other engines prefill in one forward.
    ``progress``: a progress bar on stderr; ``command``: the command line recorded as the results' provenance.
    ``weights``: ``bf16``, ``fp8`` or ``fp8-all`` (``--weights``; None: the checkpoint's own form), recorded as
    ``model.weights``; bytes per step and bandwidth count the FP8 bytes (``profiler.traffic``). Weights quantized
    here are also compared with the model before quantization: each engine's ``correctness.vs_unquantized``
    (:func:`~.measure.unquantized_oracle`).

    Raises:
        BubblescopeError: bad options (unknown engine/model/dtype/device, non-positive lengths, a context
            that does not fit the model, an ``out`` that cannot be a directory or written into (refused before
            the model is loaded), a bad tuned file); every engine skipped (nothing written then, see
            :func:`~.plan.nothing_ran`; before the model is loaded when the device alone rules every engine out,
            :func:`~bubblescope.engines.unavailable_before_load`); an unknown ``prefill``, or ``stepwise`` when no
            engine asked for has a prefill choice.
        OutputNotWritten: a trace, results.json or report.html could not be written (disk full, over the file
            size limit): the run stops there, whichever engine was measuring, and ``out`` keeps the previous run.
    """
    plan = plan_run(model, checkpoint=checkpoint, engines=engines, prompt_len=prompt_len, gen_len=gen_len,
                    runs=runs, warmup=warmup, context_sweep=context_sweep, dtype=dtype, device=device, out=out,
                    profile_steps=profile_steps, seed=seed, command=command, write=write, tuning=tuning,
                    counters=counters, prefill=prefill, weights=weights)
    work = plan.workload
    loaded, unquantized = load_in_format(plan)
    cfg = loaded.config
    names, auto = resolve_auto(list(plan.engines), loaded.weights)
    if work.prefill == "stepwise" and not any(takes_prefill(n) for n in names):  # auto chose the reference
        from ..fallback import stepwise_refused
        raise stepwise_refused(auto["engine"], auto["reason"])
    # the trace's warm-up steps (3 unprofiled, PROFILE_WARMUP_STEPS profiled) fit in the generated length
    max_seq = check_positions(cfg, work.prompt_len, work.gen_len, work.profile_steps, work.context_sweep)
    if plan.write:
        # Found now, not after minutes of measuring: an output path taken by a directory (or a device).
        out = plan.out
        for target in [out / "results.json", out / "report.html"] + [out / "traces" / f"{n}.json.gz" for n in names]:
            if target.exists() and not target.is_file():
                raise BubblescopeError(f"--out {out}: {target} exists and is not a regular file")
    doc = new_document(plan, loaded, auto)
    prompt = tuple(random_ids(cfg.vocab_size, work.prompt_len, torch.Generator().manual_seed(work.seed)))
    # Everything is written into a staging folder and published at the end (see outdir.RunFolder).
    created = plan.write and not plan.out.exists()
    with (RunFolder(plan.out) if plan.write else nullcontext()) as stage:
        bench = Bench(loaded=loaded, prompt=prompt, max_seq=max_seq, traces=stage.stage if plan.write else None)
        # the unquantized model's logits on the tokens every engine is forced with; its weights freed at once
        prior = unquantized_oracle(plan, bench, unquantized) if unquantized is not None else None
        del unquantized
        _free(plan.device)
        results = run_engines(plan, bench, doc, names, auto, progress, prior)
        # nothing measured: nothing published, so the previous run's results stay (the staging folder goes
        # with the block)
        nothing = nothing_ran(doc["engines"]) if all(e["status"] == "skipped" for e in doc["engines"]) else None
        if plan.write and not nothing:
            from ..reports.html import write_html
            from ..reports.results import write_results
            write_results(results, stage.stage / "results.json")
            write_html(results, stage.stage / "report.html")
            stage.publish()
    if nothing:
        if created:  # the folder this run made, empty again
            try:
                plan.out.rmdir()
            except OSError:
                pass
        raise BubblescopeError(nothing)
    return results


def load_in_format(plan: RunPlan):
    """``(loaded, unquantized)``: the model of ``plan`` in its weight format (:func:`~bubblescope.models.load_model`),
    and the weights before quantization when ``fp8`` / ``fp8-all`` quantized them here (None otherwise: no
    quantization, or a checkpoint stored in FP8)."""
    work = plan.workload
    fp8 = plan.weights in ("fp8", "fp8-all")
    loaded = load_model(plan.model, checkpoint=plan.checkpoint, device=plan.device, dtype=plan.dtype, seed=work.seed,
                        weight_format=None if fp8 else plan.weights)
    if not fp8:
        return loaded, None
    unquantized = loaded.weights if loaded.weights.weight_format == "bf16" else None
    loaded.weights = loaded.weights.as_format(plan.weights)
    return loaded, unquantized


def run_engines(plan: RunPlan, bench: Bench, doc: dict, names: list[str], auto: dict | None = None,
                progress: bool = False, prior: dict | None = None):
    """Measure each engine of ``names`` (``auto`` resolved, :func:`resolve_auto`) into ``doc["engines"]``, one
    entry each (``ok``, ``skipped`` with the reason, or ``failed`` with its one-line error), read the hardware
    counters when ``plan.counters``, add the findings and the ladder, and return the
    :class:`~bubblescope.reports.results.Results`. ``auto``: what ``--engines auto`` chose (its failure adds the
    reference as the fallback); ``prior``: :func:`~.measure.unquantized_oracle`'s tokens and logits, or None.

    Raises:
        OutputNotWritten: a trace could not be written (the disk, not the engine: the run stops).
    """
    from ..reports.findings import find
    from ..reports.ladder import ladder
    from ..reports.results import Results

    dev = bench.loaded.weights.device
    notes = doc["device"]["notes"]
    truth = None
    with _Progress(progress, total=len(names)) as bar:
        for name in with_fallback(names, auto, doc["engines"]):
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
                if name in plan.skips:
                    raise EngineUnavailable(plan.skips[name])
                if truth is None:
                    truth = oracle(plan, bench, prior)
                    if truth["fp32_reason"]:
                        notes.append(f"numerical fidelity against fp32 not measured: {truth['fp32_reason']}")
                measure_engine(name, entry, plan, bench, doc, truth, bar.update)
            except EngineUnavailable as e:
                entry.update(status="skipped", reason=str(e))
            except OutputNotWritten:  # the disk, not the engine: the run stops, the previous one stays
                raise
            except (KernelStuck, RuntimeError, BubblescopeError, ValueError, AssertionError) as e:
                entry.update(status="failed", reason=_one_line(e))
            doc["engines"].append(entry)
            _free(dev)
            bar.update(f"{name}: {entry['status']}", advance=1)
        if plan.counters:
            from ..counters import collect_counters
            doc["counters"] = collect_counters(doc, plan.model, str(dev), plan.dtype_name, plan.workload.seed,
                                               plan.checkpoint, plan.tuning_path, progress=bar.update)
        bar.update("diagnose: done")
    if not plan.on_gpu and any(e["name"].startswith("megakernel") and e["status"] == "ok" for e in doc["engines"]):
        notes.append("megakernel engines ran under the Triton CPU interpreter (one program): their latency, "
                     "bandwidth and intra-kernel timeline measure the interpreter, not the kernel; only their "
                     "correctness numbers carry over to a GPU")
    doc["findings"] = find(doc)
    doc["ladder"] = ladder(doc)
    return Results(doc)


def resolve_auto(names: list[str], weights) -> tuple[list[str], dict | None]:
    """Replace ``auto`` in the engine list by the engine it stands for here (``fallback.choose_auto``), and
    return ``(names, {"engine", "reason"})``; ``(names, None)`` unchanged without ``auto``."""
    if "auto" not in names:
        return names, None
    from ..fallback import choose_auto
    chosen, reason = choose_auto(weights)
    return list(dict.fromkeys(chosen if n == "auto" else n for n in names)), {"engine": chosen, "reason": reason}


def with_fallback(names: list[str], auto: dict | None, entries: list[dict]):
    """The engines to measure; when the engine ``auto`` chose fails (a stuck task, a launch error), the
    reference is measured next in its place (unless it is in the list anyway), its entry's ``fallback``
    naming the failure. ``entries``: the engine entries measured so far (the last one is read)."""
    from ..fallback import BACKUP, PRIMARY
    for name in names:
        yield name
        if auto and name == auto["engine"] == PRIMARY and BACKUP not in names and entries[-1]["status"] == "failed":
            entries[-1]["fallback_to"] = BACKUP
            yield BACKUP


def _free(dev: torch.device) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:500]


class _Progress:
    """A rich progress bar on stderr, or nothing (library use)."""

    def __init__(self, enabled: bool, total: int):
        self.bar = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(),
                                TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                                console=Console(stderr=True), transient=False)
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
