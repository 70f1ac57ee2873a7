"""Command-line interface (typer). Parses options, calls the library, maps errors to exit codes.

Exit codes: 0 success; 1 a gate check failed; 2 bad input (a one-line ``error:`` message, no traceback).
"""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path
from typing import List, Optional

import typer

from .errors import BubblescopeError, path_error
from .wording import count

TUNED_FILE = "a tuned file from `bubblescope tune --save`"
PREFILL_HELP = ("Megakernel engines' prefill: batched (default: the prompt through batched GEMMs and attention, its "
                "K/V written into the kernel's cache, then decode in the kernel; on a GPU one CUDA graph per "
                "64-position bucket of prompt length) or stepwise (one decode launch per "
                "prompt token, the ablation). Other engines always prefill in one forward.")
WEIGHTS_HELP = ("Weight format: bf16 (no quantization: every weight in --dtype), fp8 (the projections in FP8 e4m3 with "
                "a float32 scale per output row, quantized at load) or fp8-all (the LM head too). Default: the "
                "checkpoint's own (an FP8 compressed-tensors checkpoint stays FP8). FP8 runs on the reference, "
                "reference-fused and megakernel engines (not hf).")

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Profile and diagnose batch-size-1 LLM decode: bubbles, launches, bandwidth.")
diagnose_app = typer.Typer(no_args_is_help=True, help="Diagnose a model (measure it) or a trace you already have.")
app.add_typer(diagnose_app, name="diagnose")


def _print_version(value: bool) -> None:
    if value:
        from .version import __version__
        typer.echo(f"bubblescope {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="Print bubblescope's version and exit.")) -> None:
    pass


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _say_warnings(captured) -> None:
    from .libwarnings import notes
    for line in notes(captured):
        typer.echo(f"note: library warning: {line}", err=True)


def user_errors(fn):
    """Turn BubblescopeError, and an OSError about a path the user named (:func:`~.errors.path_error`: too long,
    no permission, not a directory, a symlink loop), into a one-line message and exit code 2 (never a
    traceback). Warnings of the libraries the command drives are held back while it runs
    (:func:`~.libwarnings.library_warnings`) and said once each, as notes on stderr, before any error line."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from .libwarnings import library_warnings

        captured: list = []
        try:
            with library_warnings(captured):
                result = fn(*args, **kwargs)
        except BubblescopeError as e:
            _say_warnings(captured)
            _fail(str(e))
        except OSError as e:
            message = path_error(e)
            _say_warnings(captured)
            if message is None:
                raise
            _fail(message)
        except BaseException:
            _say_warnings(captured)
            raise
        _say_warnings(captured)
        return result
    return wrapper


def _ints(text: str | None, label: str) -> list[int] | None:
    """``text`` as integers: items separated by one comma (spaces around it allowed), each an optional minus and
    ASCII digits; Python's ``int`` alone would also take ``1_0`` and non-ASCII digits, and splitting on runs of
    separators would skip the empty item of ``1,,2``. ``[]`` for text with no items; None when ``text`` is None.

    Raises:
        BubblescopeError: any other text, naming ``label``.
    """
    if text is None:
        return None
    items = [t.strip() for t in text.split(",")]
    if not any(items):
        return []  # the caller names what was missing ("no token ids in ...")
    if not all(re.fullmatch(r"-?[0-9]+", t, flags=re.ASCII) for t in items):
        raise BubblescopeError(f"{label}: expected comma-separated integers, got {text!r}")
    return [int(t) for t in items]


def _path(path: Path | None, label: str) -> Path | None:
    """``path`` unchanged, or a one-line error when it is not valid UTF-8 (undecodable bytes in argv arrive
    as lone surrogates, which the trace exporter and the JSON/HTML writers cannot encode)."""
    if path is not None:
        try:
            str(path).encode("utf-8")
        except UnicodeEncodeError:
            raise BubblescopeError(f"{label}: path {str(path).encode('utf-8', 'replace').decode()!r} is not "
                                   "valid UTF-8; use a path in the terminal's encoding") from None
    return path


def _file(value: str | None, label: str, what: str, write: bool = False, required: bool = False) -> Path | None:
    """A file-valued option (or argument) ``label`` as a Path; None when left out. Checked before any model loads
    or anything is written.

    ``what`` names the file in the message ("a tuned file from `bubblescope tune --save`"); ``write``: the command
    writes the file, checked by :func:`~.reports.results.check_destination` (what ``atomic_write_text`` refuses),
    else reads it; ``required``: an argument, which cannot be left out.

    Raises:
        BubblescopeError: an empty value (``Path("")`` is ``.``, the current directory, which would be read or
            written in its place); for reading, an existing directory; for writing, what ``check_destination``
            refuses (a directory or device, a missing or unwritable folder); a path that is not valid UTF-8
            (:func:`_path`).
    """
    if value is None:
        return None
    if not value.strip():
        raise BubblescopeError(f"{label}: empty; {'' if required else 'leave it out or '}name {what}")
    path = _path(Path(value), label)
    if write:
        from .reports.results import check_destination
        return check_destination(path, label)
    if path.is_dir():
        raise BubblescopeError(f"{label} {path}: is a directory; name {what}")
    return path


def _as_typed(value: str) -> str:
    """typer parser of a path option or argument: the value as typed, a str (a ``Path`` annotation turns an
    empty value into ``Path("")``, which is ``.``, so :func:`_file` could not refuse it)."""
    return value


_as_typed.__name__ = "path"  # the type --help shows (<path>), as for a Path annotation


def _out(out: str, default: str) -> Path:
    """``--out`` as a Path; an empty value is refused (``Path("")`` is the current directory, whose files a run
    would replace), not taken as the default or as ``.``."""
    if not out.strip():
        raise BubblescopeError(f"--out: empty; leave it out for the default ({default}) or name a directory")
    return _path(Path(out), "--out")


def _seed(seed: int, recorded: bool = False) -> int:
    # torch.Generator.manual_seed takes 64 bits; beyond that it raises a bare ValueError. A seed recorded in
    # results.json (diagnose model) is a non-negative integer there (docs/results-schema.md).
    if recorded and not 0 <= seed < 1 << 64:
        raise BubblescopeError(f"--seed: diagnose model records it in results.json: use 0 to 2**64 - 1, got {seed}")
    if not -(1 << 63) <= seed < 1 << 64:
        raise BubblescopeError(f"--seed: must fit in 64 bits (from -2**63 to 2**64 - 1), got {seed}")
    return seed


@app.command()
@user_errors
def generate(
    model: str = typer.Argument(..., help="Preset name, checkpoint directory, config.json or llama2.c .bin."),
    checkpoint: Optional[str] = typer.Option(None, help="Weights to load instead of MODEL's."),
    tokenizer: Optional[str] = typer.Option(None, help="tokenizer.json or llama2.c tokenizer .bin."),
    prompt: str = typer.Option("", help="Prompt text (needs a tokenizer)."),
    prompt_ids: Optional[str] = typer.Option(None, "--prompt-ids", help="Prompt as comma-separated token ids."),
    max_new_tokens: int = typer.Option(128, min=1, help="Tokens to generate after the prompt."),
    temperature: float = typer.Option(0.0, help="0 means greedy; top-k and top-p apply only above 0."),
    top_k: int = typer.Option(0, min=0, help="Keep the k most likely tokens; 0 disables top-k."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling mass in (0, 1]; 1 disables top-p."),
    seed: int = typer.Option(0, help="Seed of the sampler and of dummy weights."),
    engine: str = typer.Option("reference", help="Any engine of `bubblescope engines` (reference, megakernel, hf, "
                               "...), or auto: the megakernel where it runs, falling back to the reference if it "
                               "fails."),
    mode: str = typer.Option("eager", help="Reference engine mode: eager, cudagraph or compile."),
    device: Optional[str] = typer.Option(None, help="cpu or cuda (default: cuda if available)."),
    dtype: Optional[str] = typer.Option(None, help="float32, bfloat16 or float16 (default: bf16 on GPU, fp32 on CPU)."),
    tuning: Optional[str] = typer.Option(None, parser=_as_typed, help="Tuned file from `bubblescope tune --save`: "
                                         "the megakernel takes the entry for prompt + new tokens."),
    prefill: Optional[str] = typer.Option(None, help=PREFILL_HELP),
    weights: Optional[str] = typer.Option(None, "--weights", help=WEIGHTS_HELP),
    warmup: int = typer.Option(0, min=0, help="Untimed greedy generations of the same prompt and length before the "
                               "timed one (the first generation of a process can run slower throughout: the hf engine's "
                               "ran 2.5× slower than its second on an H200)."),
):
    """Generate text: the text (prompt included, as llama2.c prints it) on stdout, timing on stderr."""
    from .generate_command import generate_text
    from .generation import SamplingParams
    from .tuned import load_tuning

    seed = _seed(seed)
    tuning = _file(tuning, "--tuning", TUNED_FILE)
    tuned = load_tuning(tuning) if tuning is not None else None
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    ids = _ints(prompt_ids, "--prompt-ids")
    if ids == []:
        raise BubblescopeError(f"--prompt-ids: no token ids in {prompt_ids!r}")
    generate_text(model, params, checkpoint=checkpoint, tokenizer=tokenizer, prompt=prompt, prompt_ids=ids,
                  max_new_tokens=max_new_tokens, engine=engine, mode=mode, device=device, dtype=dtype, tuning=tuned,
                  prefill=prefill, weights=weights, warmup=warmup, out=sys.stdout,
                  say=lambda line: typer.echo(line, err=True))


@diagnose_app.command("model")
@user_errors
def diagnose_model(
    model: Optional[str] = typer.Argument(None, help="Preset, checkpoint directory, config.json or llama2.c .bin "
                                          "(default: llama-3.2-1b on a GPU, stories260k or tiny-llama on CPU)."),
    checkpoint: Optional[str] = typer.Option(None, help="Weights to load instead of MODEL's (HF directory or "
                                             "llama2.c .bin)."),
    engines: Optional[str] = typer.Option(None, help="Comma-separated engine names (default: all but "
                                          "megakernel-gluon and megakernel-triton, the kernels megakernel picks "
                                          "between; see `bubblescope engines`); auto: the megakernel where it "
                                          "runs, else the reference."),
    prompt_len: Optional[int] = typer.Option(None, "--prompt-len", help="Prompt tokens (default: 128 on a GPU, "
                                             "16 on CPU)."),
    gen_len: Optional[int] = typer.Option(None, "--gen-len", help="Tokens generated per timed run (default: 128 "
                                          "on a GPU, 32 on CPU)."),
    runs: int = typer.Option(3, help="Timed generations per engine (their tokens are pooled for p50/p99)."),
    warmup: int = typer.Option(1, help="Untimed generations per engine before the timed runs."),
    context_sweep: Optional[str] = typer.Option(None, "--context-sweep", help="Contexts to time, e.g. 128,1024,4096 "
                                                "(default on a GPU; none on CPU); 'none' for none."),
    profile_steps: int = typer.Option(8, "--profile-steps", help="Decode steps captured in each engine's trace."),
    dtype: Optional[str] = typer.Option(None, help="float32, bfloat16 or float16 (default: bf16 on GPU, fp32 on CPU)."),
    device: Optional[str] = typer.Option(None, help="cpu or cuda (default: cuda if available)."),
    out: str = typer.Option("bubblescope-out", help="Directory for results.json, report.html, traces/ "
                            "(replaced together at the end of the run; other files are kept)."),
    fmt: str = typer.Option("text", "--format", help="text or json."),
    seed: int = typer.Option(0, help="Seed of the prompt, the dummy weights and the sampler."),
    tuning: Optional[str] = typer.Option(None, parser=_as_typed, help="Tuned file from `bubblescope tune --save`: "
                                         "megakernel engines take the entry for prompt + generated length."),
    counters: bool = typer.Option(False, "--counters", help="Also read hardware counters of each engine's top "
                                  "kernels with Nsight Compute (ncu), in a subprocess."),
    tp: int = typer.Option(1, "--tp", min=1, help="Tensor-parallel ranks: runs the reference engine on N local "
                           "processes through torchrun and writes tp.json plus one trace per rank."),
    prefill: Optional[str] = typer.Option(None, help=PREFILL_HELP),
    weights: Optional[str] = typer.Option(None, "--weights", help=WEIGHTS_HELP),
):
    """Measure a model on every engine; write results.json, report.html and traces; print the report."""
    from .diagnosis import command_line, diagnose

    out = _out(out, "bubblescope-out")
    tuning = _file(tuning, "--tuning", TUNED_FILE)
    if fmt not in ("text", "json"):
        raise BubblescopeError(f"--format: unknown format {fmt!r}; use text or json")
    # an empty value is not the same as leaving the argument out (the default), so it is refused, not defaulted
    for label, value in (("MODEL", model), ("--dtype", dtype), ("--device", device)):
        if value is not None and not value.strip():
            raise BubblescopeError(f"{label}: empty; leave it out for the default")
    sweep = [] if context_sweep in ("none", "") else _ints(context_sweep, "--context-sweep")  # None: the default
    if sweep == [] and context_sweep not in ("none", ""):
        raise BubblescopeError(f"--context-sweep: no context lengths in {context_sweep!r}; 'none' for none")
    seed = _seed(seed, recorded=True)
    if tp > 1 and weights not in (None, "bf16"):
        raise BubblescopeError(f"--weights {weights}: the tensor-parallel reference (--tp {tp}) runs unquantized "
                               "weights only; leave --weights out or use bf16")
    if tp > 1:
        from .tplaunch import launch_tp, tp_options

        raise typer.Exit(launch_tp(tp, **tp_options(
            engines=engines, context_sweep=context_sweep, device=device, tuning=tuning, counters=counters,
            prefill=prefill, model=model, checkpoint=checkpoint, prompt_len=prompt_len, gen_len=gen_len, runs=runs,
            warmup=warmup, profile_steps=profile_steps, dtype=dtype, out=str(out), seed=seed, command=command_line(),
            format=fmt)))
    names = [e.strip() for e in engines.split(",") if e.strip()] if engines is not None else None
    if names == []:  # "--engines ''" or ",,": not the same as leaving the option out (every engine)
        raise BubblescopeError(f"--engines: no engine names in {engines!r}; see `bubblescope engines`")
    results = diagnose(model, checkpoint=checkpoint, engines=names, prompt_len=prompt_len, gen_len=gen_len,
                       runs=runs, warmup=warmup, context_sweep=sweep, dtype=dtype, device=device, out=out,
                       profile_steps=profile_steps, seed=seed, progress=fmt == "text", command=command_line(),
                       tuning=tuning, counters=counters, prefill=prefill, weights=weights)
    if fmt == "json":
        sys.stdout.write(results.to_json())
    else:
        from rich.console import Console

        from .reports.terminal import render_results
        render_results(results, Console())
        typer.echo(f"wrote {out / 'results.json'}, {out / 'report.html'}", err=True)


@diagnose_app.command("trace")
@user_errors
def diagnose_trace(
    paths: List[str] = typer.Argument(..., parser=_as_typed, help="Kineto / torch.profiler Chrome traces (.json "
                                      "or .json.gz), or directories: their trace files are read, other files "
                                      "skipped with a note."),
    fmt: str = typer.Option("text", "--format", help="text or json."),
    step_marker: Optional[str] = typer.Option(None, "--step-marker", help="record_function name (or prefix) "
                                              "of a decode step (default: bubblescope.decode_step, else "
                                              "torch.profiler's ProfilerStep#N)."),
    idle_threshold_us: float = typer.Option(5.0, "--idle-threshold-us",
                                            help="Gaps shorter than this (µs) count as kernel-wait."),
    wide: bool = typer.Option(False, "--wide", help="Full kernel names (default: cut to 72 characters)."),
    ranks: bool = typer.Option(False, "--ranks", help="The files are one trace per rank of one job, in rank "
                               "order (automatic when their distributedInfo ranks differ)."),
    skip_steps: int | None = typer.Option(None, "--skip-steps", min=0, help="Warm-up steps left out of the step "
                                          "figures (default: as many as the trace records, else 0)."),
    html: Optional[str] = typer.Option(None, "--html", help="Also write a self-contained HTML report here (the "
                                       "tables, a per-step busy/idle plot, the findings); not when a trace is "
                                       "unreadable."),
    model: Optional[str] = typer.Option(None, "--model", help="The traced model (preset, HF directory or "
                                        "config.json): bytes per step, GB/s, % of peak and the floor per step."),
    bytes_per_step: Optional[int] = typer.Option(None, "--bytes-per-step", help="Bytes a decode step moves, "
                                                 "when there is no model to name."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="The model's weight and KV-cache dtype (default "
                                        "bfloat16)."),
    context: Optional[int] = typer.Option(None, "--context", help="KV positions the first step reads (each later "
                                          "step one more); default: the trace's record, else weights only."),
    peak_gbps: Optional[float] = typer.Option(None, "--peak-gbps", help="Peak memory bandwidth, GB/s (default: "
                                              "the trace's GPU in the datasheet table, else NVML on the machine "
                                              "that took it)."),
    json_out: Optional[str] = typer.Option(None, "--json", parser=_as_typed, help="Also write the result for "
                                           "`bubblescope gate` here (bubblescope.trace-result/1)."),
):
    """Bubble ratio, busy/span, idle breakdown, kernels and launches per step of existing traces.

    Steps are the step marker's ranges, or, without any, found from what repeats once per token (CUDA-graph
    launches, one kernel per step, a repeating kernel sequence). With --model or --bytes-per-step, each step's
    bytes, GB/s, % of peak and distance from the floor. With one trace per rank, also NCCL share, cross-rank
    skew and the slowest rank per step. Then findings: what limits the traced decode (launches, host syncs,
    kernel boundaries, warm-up, NCCL, rank skew) and what to do.
    """
    from .profiler.trace.ranksummary import unmerged_ranks_note
    from .profiler.trace.summary import file_errors
    from .reports.progress import trace_progress
    from .trace_inputs import model_inputs, refuse_input, trace_files
    from .tracediagnose import check_context, check_peak, diagnose_trace_files, resolve_step_bytes

    if fmt not in ("text", "json"):
        raise BubblescopeError(f"--format: unknown format {fmt!r}; use text or json")
    html_path = _file(html, "--html", "the HTML file to write", write=True)  # before any trace is read
    json_path = _file(json_out, "--json", "the result file to write", write=True)
    check_context(context, resolve_step_bytes(model, bytes_per_step, dtype))  # bad options before any reading
    check_peak(peak_gbps)
    for p in paths:  # Path("") is ".", whose trace files would be read in its place
        if not p.strip():
            raise BubblescopeError("PATHS: an empty path; name a trace file or a directory of traces")
    files, skipped = trace_files([Path(p) for p in paths])  # any name the OS takes (not _path: QA finding)
    for path, option in ((html_path, "--html"), (json_path, "--json")):
        refuse_input(path, files, option)
        refuse_input(path, model_inputs(model), option, "the --model config")
    if html_path is not None and json_path is not None and html_path.resolve() == json_path.resolve():
        raise BubblescopeError(f"--json {json_path}: is the --html file too; choose another path")
    notes = list(skipped)
    for note in skipped:
        typer.echo(f"note: {note}", err=True)
    with trace_progress() as progress:
        summary = diagnose_trace_files([str(p) for p in files], step_marker=step_marker,
                                       threshold_us=idle_threshold_us, skip_steps=skip_steps, ranks=ranks,
                                       model=model, bytes_per_step=bytes_per_step, dtype=dtype, context=context,
                                       peak_gbps=peak_gbps, progress=progress)
    findings = summary.pop("findings")
    note = unmerged_ranks_note(summary) if not ranks else None
    if note:
        notes.append(note)
        typer.echo(f"note: {note}", err=True)
    errors = file_errors(summary)
    for path, option in ((html_path, "--html"), (json_path, "--json")):
        if path is not None and errors:  # a report of part of the input would read as the whole: none at all
            typer.echo(f"note: {option} {path}: not written, {count(len(errors), 'trace')} could not be read",
                       err=True)
    if (json_path is not None or html_path is not None) and not errors:  # both or neither
        from .tracediagnose import write_trace_outputs
        for path in write_trace_outputs(summary, findings, json_path, html_path,
                                        command=" ".join(["bubblescope"] + sys.argv[1:]), notes=notes):
            typer.echo(f"wrote {path}", err=True)
    if len(errors) == len(summary["files"]):
        pass  # nothing readable: only the errors below, no empty report
    elif fmt == "json":
        from .reports.json_out import summary_json
        sys.stdout.write(summary_json({**summary, "findings": findings}))
    else:
        from rich.console import Console

        from .reports.ranks_terminal import render_ranks
        from .reports.trace_terminal import render_trace_findings, render_trace_summary
        console = Console()
        render_trace_summary(summary, console, wide=wide)
        render_ranks(summary["ranks"], console)
        render_trace_findings(findings, console)
    if errors:  # every readable file was reported above; one line per unreadable one, then exit 2
        for message in errors[:-1]:
            typer.echo(f"error: {message}", err=True)
        raise BubblescopeError(errors[-1])


@app.command(context_settings={"allow_interspersed_args": False})
@user_errors
def profile(
    command: Optional[List[str]] = typer.Argument(None, metavar="-- COMMAND [ARGS]...",
                                                  help="The program, unchanged: `python SCRIPT.py ARGS...`, "
                                                  "`python -m MODULE ARGS...` or `SCRIPT.py ARGS...`."),
    skip: int = typer.Option(10, "--skip", help="Steps run before the window (warm-up, prefill, compilation)."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Steps in the window (default 20)."),
    seconds: Optional[float] = typer.Option(None, "--seconds", help="Or the window's length in seconds: it ends at "
                                            "the first step that starts after it."),
    out: str = typer.Option("bubblescope-profile", help="Directory for profile.json, profile.html and "
                            "profile.trace.json.gz (replaced together; other files left alone)."),
    model: Optional[str] = typer.Option(None, "--model", help="The model decoded (preset, HF directory or "
                                        "config.json): bytes per step, GB/s, % of peak and the floor, as "
                                        "diagnose trace."),
    bytes_per_step: Optional[int] = typer.Option(None, "--bytes-per-step", help="Bytes a decode step moves, "
                                                 "when there is no model to name."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="The model's weight and KV-cache dtype (default "
                                        "bfloat16)."),
    context: Optional[int] = typer.Option(None, "--context", help="KV positions the trace's first step reads "
                                          "(step --skip of the run: about prompt + --skip; each later step one "
                                          "more); default: weights only."),
    peak_gbps: Optional[float] = typer.Option(None, "--peak-gbps", help="Peak memory bandwidth, GB/s (default: "
                                              "the GPU in the datasheet table, else NVML)."),
    idle_threshold_us: float = typer.Option(5.0, "--idle-threshold-us",
                                            help="Gaps shorter than this (µs) count as kernel-wait."),
    wide: bool = typer.Option(False, "--wide", help="Full kernel names (default: cut to 72 characters)."),
):
    """Run a Python program under torch.profiler, unchanged, and report a window of its decode steps.

    Steps are counted by light hooks (outermost nn.Module calls, torch.compile'd function calls, CUDA-graph
    replays): after --skip steps, --steps steps (or --seconds) are recorded, then as many are timed without the
    profiler to state its cost. The program's output and exit status are its own; the report is diagnose
    trace's, of the recorded window.
    """
    from .profile_command import parse_program
    from .profile_program import check_analysis, profile_program

    if skip < 0:
        raise BubblescopeError(f"--skip: must be 0 or more, got {skip}")
    if steps is not None and seconds is not None:
        raise BubblescopeError("--steps and --seconds: give one of them, not both")
    if steps is not None and steps < 1:
        raise BubblescopeError(f"--steps: must be 1 or more, got {steps}")
    if seconds is not None and not 0 < seconds < float("inf"):
        raise BubblescopeError(f"--seconds: must be a positive number of seconds, got {seconds:g}")
    from .profiler.trace.metrics import check_threshold
    check_threshold(idle_threshold_us)  # before the program runs, not after
    analysis = check_analysis({"model": model, "bytes_per_step": bytes_per_step, "dtype": dtype, "context": context,
                               "peak_gbps": peak_gbps})
    program = parse_program(list(command or []))
    if steps is None and seconds is None:
        steps = 20
    outcome = profile_program(program, _out(out, "bubblescope-profile"), skip, steps, seconds,
                              idle_threshold_us, analysis, command=" ".join(["bubblescope"] + sys.argv[1:]))
    for note in outcome.notes:
        typer.echo(f"note: {note}", err=True)
    if outcome.summary is not None:
        from rich.console import Console

        from .reports.trace_terminal import render_trace_findings, render_trace_summary
        console = Console()
        render_trace_summary(outcome.summary, console, wide=wide)
        render_trace_findings(outcome.summary["findings"], console)
    if outcome.written:
        typer.echo(f"wrote {', '.join(map(str, outcome.written))}", err=True)
    if outcome.error is not None:
        typer.echo(f"error: {outcome.error}", err=True)
    raise typer.Exit(outcome.exit_code)


@app.command()
@user_errors
def report(
    results_path: str = typer.Argument(..., metavar="RESULTS.json", parser=_as_typed,
                                       help="A results.json of `diagnose model`."),
    html: Optional[str] = typer.Option(None, parser=_as_typed, help="Also write the HTML report here (not over "
                                       "RESULTS.json)."),
    fmt: str = typer.Option("text", "--format", help="text (rich) or json."),
    bf16: Optional[str] = typer.Option(None, "--bf16", parser=_as_typed, help="The results.json of the same "
                                       "diagnose model run with --weights bf16: its timings join an FP8 "
                                       "RESULTS.json's quantization table (speed-up per engine)."),
):
    """Re-render a results.json (terminal and/or HTML) without measuring anything; the findings and the ladder
    are derived again from its numbers."""
    from .reports.results import load_results

    if fmt not in ("text", "json"):  # before anything is written
        raise BubblescopeError(f"--format: unknown format {fmt!r}; use text or json")
    results_path = _file(results_path, "RESULTS.json", "a results.json of `diagnose model`", required=True)
    bf16 = _file(bf16, "--bf16", "the results.json of a diagnose model run with --weights bf16")
    html = _file(html, "--html", "the HTML file to write", write=True)
    if html is not None and html.exists() and results_path.exists() and html.resolve() == results_path.resolve():
        raise BubblescopeError(f"--html {html}: is the input results file; choose another path")
    from .reports.findings import rederive

    # An empty engine list is a valid document (the schema allows it): rendered as such, never refused.
    results = load_results(results_path)
    rederive(results.doc)  # findings and ladder from the document's numbers, by this version's rules
    if bf16 is not None:  # the quantization ablation across the two runs
        from .reports.quantization import paired_rows
        results.doc["quantization"] = paired_rows(results.doc, load_results(bf16).doc)
    if html is not None:
        from .reports.html import write_html
        write_html(results, html, "--html")
        typer.echo(f"wrote {html}", err=True)
    if fmt == "json":
        sys.stdout.write(results.to_json())
    else:
        from rich.console import Console

        from .reports.terminal import render_results
        render_results(results, Console())


@app.command()
@user_errors
def gate(
    results_path: str = typer.Argument(..., metavar="RESULTS.json", parser=_as_typed,
                                       help="The results.json to check."),
    engine: Optional[str] = typer.Option(None, help="Engine to check (default: megakernel if ok, else the fastest)."),
    min_bandwidth_util: Optional[float] = typer.Option(None, "--min-bandwidth-util",
                                                       help="Lowest fraction of NVML peak bandwidth (0.35 = 35 %)."),
    max_bubble_ratio: Optional[float] = typer.Option(None, "--max-bubble-ratio",
                                                     help="Highest bubble ratio (0-1) as the reports show it: the "
                                                          "GPU's idle share of the timed step, or a one-kernel step's "
                                                          "in-kernel wait; a trace's: idle share of its steps."),
    max_token_p99_ms: Optional[float] = typer.Option(None, "--max-token-p99-ms", help="Highest p99 ms per token."),
    baseline: Optional[str] = typer.Option(None, parser=_as_typed,
                                           help="An older results.json to compare against."),
    max_regression: Optional[float] = typer.Option(None, "--max-regression", help="e.g. 0.05 = 5 % slower allowed."),
    allow_mismatch: bool = typer.Option(False, "--allow-mismatch", help="Compare against a baseline of another "
                                        "model, architecture, dtype, device or workload anyway."),
):
    """CI gate: exit 0 when every check holds, 1 when one fails, 2 on unusable input.

    RESULTS.json is a `diagnose model` results.json or a `diagnose trace --json` / `profile` result (then every
    trace file is checked; --max-token-p99-ms holds its p99 ms per step).
    """
    from rich.console import Console

    from .reports.gate import render_gate
    from .reports.trace_gate import load_gate_document, run_any_gate

    results_path = _file(results_path, "RESULTS.json", "the results.json to check", required=True)
    baseline = _file(baseline, "--baseline", "an older results.json")
    doc = load_gate_document(results_path)
    base = load_gate_document(baseline) if baseline is not None else None
    rep = run_any_gate(doc, engine=engine, min_bandwidth_util=min_bandwidth_util, max_bubble_ratio=max_bubble_ratio,
                       max_token_p99_ms=max_token_p99_ms, baseline=base, max_regression=max_regression,
                       allow_mismatch=allow_mismatch)
    render_gate(rep, Console())
    raise typer.Exit(rep.exit_code)


@app.command()
@user_errors
def tune(
    model: Optional[str] = typer.Argument(None, help="Preset, checkpoint directory, config.json or llama2.c .bin."),
    knob: Optional[str] = typer.Option(None, help="The parameter to vary (see --list)."),
    values: Optional[str] = typer.Option(None, help="Comma-separated values of the knob, e.g. 256,512,1024."),
    contexts: Optional[str] = typer.Option(None, help="KV-cache lengths to measure at (default: 128,4096 on a GPU, "
                                           "8,16 on CPU)."),
    engine: str = typer.Option("megakernel", help="A tunable engine (see --list)."),
    steps: Optional[int] = typer.Option(None, help="Decode steps timed per point (default: 64 on GPU, 3 on CPU)."),
    checkpoint: Optional[str] = typer.Option(None, help="Weights to load instead of MODEL's (HF directory or "
                                             "llama2.c .bin)."),
    device: Optional[str] = typer.Option(None, help="cpu or cuda (default: cuda if available)."),
    dtype: Optional[str] = typer.Option(None, help="float32, bfloat16 or float16 (default: bf16 on GPU, fp32 on CPU)."),
    seed: int = typer.Option(0, help="Seed of the prompt and of dummy weights."),
    out: str = typer.Option("bubblescope-tune", help="Directory for tune.json and tune.html."),
    save: Optional[str] = typer.Option(None, parser=_as_typed, help="Write the best value per context range here "
                                       "(for --tuning)."),
    fmt: str = typer.Option("text", "--format", help="text or json."),
    list_knobs: bool = typer.Option(False, "--list", help="List each tunable engine's knobs and exit."),
    prefill: Optional[str] = typer.Option(None, help=PREFILL_HELP),
):
    """One-knob tuning curve: latency, % of peak, wait ratio and compiled resources per value and context."""
    import json

    from .tuning import implementations, knobs
    from .tuning import tune as run_tune

    if list_knobs:
        from .models import resolve_device
        from .reports.tune_report import knob_list_lines

        dev = resolve_device(device)  # the defaults tune holds there, as its page lists them
        groups = {cls: (engs, knobs(engs[0], dev.type)) for cls, engs in implementations().items()}
        for line in knob_list_lines(groups, dev.type):
            typer.echo(line)
        return
    if fmt not in ("text", "json"):
        raise BubblescopeError(f"--format: unknown format {fmt!r}; use text or json")
    if model is None or knob is None or values is None:
        raise BubblescopeError("tune: give MODEL, --knob and --values (or --list)")
    out = _out(out, "bubblescope-tune")
    from .diagnosis import command_line
    from .reports.tune_report import render_tune, write_tune_outputs

    save = _file(save, "--save", "the tuned file to write", write=True)  # before minutes of measuring
    if save is not None and save.resolve() in {(out / n).resolve() for n in ("tune.json", "tune.html")}:
        raise BubblescopeError(f"--save {save}: is where --out {out} writes {save.name}; name another file")
    vals = [v.strip() for v in values.split(",") if v.strip()]
    doc = run_tune(model, knob, vals, _ints(contexts, "--contexts"), engine=engine, checkpoint=checkpoint,
                   device=device, dtype=dtype, steps=steps, seed=_seed(seed), command=command_line(), out=out,
                   prefill=prefill)
    for note in doc["notes"]:  # values given twice, measured once
        typer.echo(f"note: {note}", err=True)
    if not any(r["status"] == "ok" for r in doc["rows"]):  # nothing measured: an error, and --out as it was
        from .reports.tune_report import not_run
        for value, status, reason in not_run(doc):
            typer.echo(f"note: {knob}={value}: {status}: {reason}", err=True)
        kept = f"--out {out} and --save {save} left as they were" if save is not None else f"--out {out} left as it was"
        raise BubblescopeError(f"--values: no value of {knob} ran ok ({count(len(doc['rows']), 'value')} tried, "
                               f"why above); {kept}")
    write_tune_outputs(doc, out, save)
    if fmt == "json":
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        from rich.console import Console
        render_tune(doc, Console())
    typer.echo(f"wrote {out / 'tune.json'}, {out / 'tune.html'}" + (f", {save}" if save else ""), err=True)


@app.command()
def presets():
    """List the built-in model presets."""
    from .models.config import PRESETS
    for name, c in PRESETS.items():
        typer.echo(f"{name:14s} {c.num_parameters() / 1e6:10.1f} M params  {c.model_type}")


@app.command("engines")
def list_engines():
    """List the engines diagnose can measure."""
    from .engines import ENGINES
    from .reports.listing import listing_console, render_listing
    render_listing([(spec.name, spec.description) for spec in ENGINES.values()], listing_console())


class _Stream:
    """``sys.stdout`` / ``sys.stderr`` as they are, with a record of a write or flush that failed (a full device, a
    closed file), so that :func:`main` can tell a failed terminal from a failed file of a command."""

    def __init__(self, stream):
        self._stream, self.failed = stream, None

    def write(self, text):
        try:
            return self._stream.write(text)
        except OSError as e:
            self.failed = e
            raise

    def flush(self):
        try:
            return self._stream.flush()
        except OSError as e:
            self.failed = e
            raise

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _terminated(signum, frame) -> None:
    """SIGTERM / SIGHUP: leave as Ctrl-C does (staging folders removed, ``--out`` as it was), with the shell's
    status for a death by that signal (128 + its number)."""
    raise SystemExit(128 + signum)


def _say_stream_error(e: OSError) -> None:
    """One line on standard error (where it still takes one) for a failed write to the terminal's streams, both
    then pointed at the null device so that the interpreter's own flush at exit prints no traceback."""
    import os
    line = f"error: standard output: cannot write ({e.strerror or e})\n"
    try:
        os.write(2, line.encode())
    except OSError:
        pass
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
        except (OSError, ValueError, AttributeError):
            pass


def main() -> None:
    """Entry point: like ``app()``, but a usage error (bad option value, unknown option) is one line too.

    Click raises those as ``ClickException``s; typer vendors click in recent versions, so they are
    recognised by their interface (``format_message`` + ``exit_code``), not by class. A reader that closes
    the pipe early (``| head``) ends the command as it ends ``cat``: by SIGPIPE, silently (Python ignores the
    signal, and click then turns the EPIPE into exit 1).
    """
    import signal
    if hasattr(signal, "SIGPIPE"):  # not on Windows
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    for name in ("SIGTERM", "SIGHUP"):  # `timeout`, CI and a closed terminal end a run as Ctrl-C does
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), _terminated)
    streams = sys.stdout, sys.stderr = _Stream(sys.stdout), _Stream(sys.stderr)
    try:
        rc = app(standalone_mode=False)
    except OSError as e:  # the commands turn their own files' write errors into one line; this is the terminal's
        if not any(s.failed for s in streams):
            raise
        _say_stream_error(e)
        sys.exit(2)
    except Exception as e:
        if not (hasattr(e, "format_message") and hasattr(e, "exit_code")):
            raise
        ctx = getattr(e, "ctx", None)
        if type(e).__name__ == "NoArgsIsHelpError" and ctx is not None:
            typer.echo(ctx.get_help())
            sys.exit(0)
        typer.echo(f"error: {' '.join(e.format_message().split())}", err=True)
        sys.exit(e.exit_code)
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
