"""``bubblescope profile``: run a Python program under torch.profiler, unchanged, and report its window.

:func:`run_program` starts the program through :mod:`bubblescope.profile_runner` in its own interpreter, with
stdin, stdout and stderr its own, and returns what the runner recorded (its state file) and the exit status.
:func:`profile_section` turns that into the ``profile`` part of the report (pure); the trace itself is read by
the same code as ``diagnose trace`` (:func:`analyse_window`). :func:`profile_program` does all of it and writes
the three files of a run into ``--out`` as one: ``profile.json`` (the ``bubblescope.trace-result/1`` document of
``diagnose trace --json``, which ``gate`` reads, with the ``profile`` section), ``profile.html`` and
``profile.trace.json.gz``.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .errors import BubblescopeError
from .profiler.trace.window import TRUNCATED
from .profile_command import Program
from .wording import count

RUNNER = Path(__file__).with_name("profile_runner.py")
OUT_FILES = ("profile.json", "profile.html", "profile.trace.json.gz")
TRACE_NAME = "profile.trace.json.gz"
RAW_TRACE = "window.trace.json"
STATE = "state.json"
# Kineto renames its trace into place even when its last write failed, so a trace the reader finds cut short
# (profiler.trace.window.TRUNCATED in its error) is a write that failed, not a bad trace.
CUT_SHORT = "the profiler's trace ends early: its last write failed, as on a full disk"
WARMUP_STEPS = 1  # profiled steps before the window: the profiler's own warm-up (profile_runner.StepWindow)
# Skipped steps left out of the unprofiled baseline: the first call is the prompt's prefill (or an engine's
# preparation: the reference engine's graph captures count as calls of its model), the next carries the one-time
# work of a first decode (compilation, CUDA-graph capture, allocator growth)
BASELINE_LEFT_OUT = 2


def run_program(program: Program, stage: str | os.PathLike, skip: int, steps: int | None,
                seconds: float | None) -> tuple[int, dict]:
    """Run ``program`` under the runner, writing into the folder ``stage``; ``(exit status, runner state)``.

    The program inherits this process's stdin, stdout, stderr and environment. A first Ctrl-C reaches the
    program too (one process group) and is waited out, so the runner can close its window and write what it
    recorded; a second one kills the program. SIGTERM or SIGHUP to this process stops the program as well
    (terminated, killed after 10 s), so nothing goes on writing into ``stage`` once the run is over.

    Returns:
        The exit status (negative: killed by that signal) and the runner's state dict (keys of
        :meth:`~bubblescope.profile_runner.Recorder.write_state`), or ``{"status": "no-state"}`` when the
        program ended before the runner could write one (``os._exit``, a signal). Where a state write of the
        runner failed (a full disk), ``state["write_error"]`` is its OS error (``No space left on device``), sent
        through a pipe, since the state file on disk is then stale or absent.

    Raises:
        OutputNotWritten: the runner's configuration cannot be written into ``stage`` (a full disk), before the
            program runs.
        BubblescopeError: the interpreter cannot be started.
    """
    from .errors import OutputNotWritten, os_reason

    stage = Path(stage).absolute()  # the program may change its working directory
    read_end, write_end = os.pipe()
    try:
        config = {"skip": skip, "steps": steps, "seconds": seconds, "trace": str(stage / RAW_TRACE),
                  "state": str(stage / STATE), "report_fd": write_end}
        try:
            (stage / "config.json").write_text(json.dumps(config), encoding="utf-8")
        except OSError as exc:  # a full disk: said before the program runs, for --out (RunFolder)
            raise OutputNotWritten(f"{stage}: cannot write ({os_reason(exc)})", None, os_reason(exc)) from None
        argv = [program.interpreter, *program.flags, str(RUNNER), str(stage / "config.json"), *program.target]
        try:
            proc = subprocess.Popen(argv, pass_fds=(write_end,))
        except OSError as exc:
            raise BubblescopeError(f"COMMAND {program.interpreter}: cannot be started "
                                   f"({exc.strerror or type(exc).__name__})") from None
        os.close(write_end)
        write_end = None
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            try:
                code = proc.wait()
            except KeyboardInterrupt:
                proc.kill()
                code = proc.wait()
        except SystemExit:  # SIGTERM / SIGHUP to bubblescope (cli._terminated): the program is stopped too
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        reports = _read_reports(read_end)
    finally:
        os.close(read_end)
        if write_end is not None:
            os.close(write_end)
    try:
        state = json.loads((stage / STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        state = {"status": "no-state"}
    failed = [r["write_error"] for r in reports if isinstance(r.get("write_error"), str)]
    if failed:
        state = {**state, "write_error": failed[0]}
    return code, state


def _read_reports(fd: int) -> list[dict]:
    """The runner's report lines (JSON objects) waiting in the pipe ``fd``. Read without blocking: a process the
    program forked may still hold the pipe open, and the runner wrote its lines before it exited."""
    os.set_blocking(fd, False)
    data = b""
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    reports = []
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            reports.append(doc)
    return reports


def step_ms(boundaries_ns: list[int]) -> list[float]:
    """Step times in ms from step boundaries in ns (n + 1 boundaries give n steps)."""
    return [(b - a) / 1e6 for a, b in zip(boundaries_ns, boundaries_ns[1:])]


def profile_section(state: dict, exit_code: int, program: Program, file_summary: dict | None) -> dict:
    """The ``profile`` section of ``profile.json``. Pure: reads only its arguments.

    Keys: ``command`` (argv of the program), ``exit_code``, ``status`` (``complete``: the window ran its
    steps; ``cut``: the program ended inside it; ``not-reached``: it ended first), ``steps_counted`` (steps
    the hooks counted in the whole run: outermost ``nn.Module`` calls, ``torch.compile``d function calls or
    CUDA-graph replays, the highest tally of one callee), ``calls``
    (``{callee: outermost calls}``), ``graph_replays`` (every ``torch.cuda.CUDAGraph.replay`` of the run, those
    inside a compiled call too: CUDA graphs were in use), ``skip``, ``steps_requested``, ``seconds_requested``,
    ``first_step`` (the window's first step, counted from 0; the step before it is the profiler's warm-up, in the trace but left out
    of the step figures), ``tokens_generated`` (steps the hooks counted in the window),
    ``steps_found`` (decode steps the trace analysis found in the window, from markers or, as in a program
    without any, from what repeats once per token, the profiler's warm-up step left out; null where it found
    none), ``step_source`` (the analysis'
    words on how it found them, or why none), ``step_ms_p50_profiled``,
    ``step_ms_p50_unprofiled`` (median host time between step starts, ms, in the window and over the unprofiled
    baseline: the skipped steps before the window, the first :data:`BASELINE_LEFT_OUT` left out and at most as
    many as the window's, the latest; with none of those, the steps timed after the window), ``reference_steps``
    (the baseline's steps), ``reference_from`` (``before`` or ``after`` the window; null without a baseline),
    ``step_ms_p50_after`` (the median of the steps timed after the window, or null: it may differ from the
    baseline as the program's own step time moves or the profiler's cost outlasts the window),
    ``profiler_overhead_pct`` (the profiler's cost per
    step, %: the two medians' ratio − 1; null when a side has no step, with ``overhead_reason``),
    ``effective_GBps_unprofiled`` and ``util_peak_unprofiled`` (the trace's median bytes per step over the
    unprofiled median step time, GB/s, and over the peak: the bandwidth without the profiler's cost, where the
    host time between step starts is the token's, as in a loop that takes each token to the host; null without
    bytes, peak or unprofiled steps) and ``error`` (the runner's own error, e.g. the profiler failed to start;
    else null).
    """
    window, after = step_ms(state.get("window_ns") or []), step_ms(state.get("reference_ns") or [])
    before = step_ms(state.get("before_ns") or [])[BASELINE_LEFT_OUT:][-max(len(window), 1):]
    reference, reference_from = (before, "before") if before else (after, "after") if after else ([], None)
    p50 = (lambda xs: round(statistics.median(xs), 6) if xs else None)
    prof, ref = p50(window), p50(reference)
    overhead = round((prof / ref - 1.0) * 100.0, 3) if prof is not None and ref else None
    reason = None
    if overhead is None:
        reason = ("no profiled step" if not window else
                  f"no step ran without the profiler: none after the first {BASELINE_LEFT_OUT} before the window "
                  "(raise --skip), and the program ended before one after it")
    first = state.get("first_step")  # the profiler's warm-up step; the window follows it
    first = None if first is None else first + WARMUP_STEPS
    if state.get("trace") is None or first is None:
        status = "not-reached"
    elif state.get("closed_by") == "program-end":
        status = "cut"
    else:
        status = "complete"
    found, source, unprofiled_gbps, unprofiled_util = None, None, None, None
    bw = (file_summary or {}).get("bandwidth") or {}
    nbytes, peak = (bw.get("summary") or {}).get("bytes_per_step"), bw.get("peak_GBps")
    if nbytes and ref:
        unprofiled_gbps = round(nbytes / (ref * 1e-3) / 1e9, 3)  # bytes / s / 10^9
        unprofiled_util = round(unprofiled_gbps / peak, 6) if peak else None
    if file_summary is not None and "error" not in file_summary:
        detection = file_summary.get("step_detection") or {}
        found = (file_summary.get("steps") or {}).get("steps") or None  # after the profiler's warm-up step
        source = detection.get("description") or detection.get("reason")
    return {"command": list(program.target), "interpreter": program.interpreter, "exit_code": exit_code,
            "status": status, "steps_counted": state.get("steps_counted", 0), "calls": state.get("calls") or {},
            "graph_replays": state.get("graph_replays", 0),
            "skip": state.get("skip"), "steps_requested": state.get("steps"),
            "seconds_requested": state.get("seconds"), "first_step": first, "tokens_generated": len(window),
            "steps_found": found, "step_source": source, "step_ms_p50_profiled": prof,
            "step_ms_p50_unprofiled": ref, "reference_steps": len(reference), "reference_from": reference_from,
            "step_ms_p50_after": p50(after),
            "profiler_overhead_pct": overhead, "overhead_reason": reason,
            "effective_GBps_unprofiled": unprofiled_gbps, "util_peak_unprofiled": unprofiled_util,
            "error": state.get("error")}


def compress_trace(raw: str | os.PathLike, dest: str | os.PathLike) -> None:
    """gzip ``raw`` (Kineto's plain JSON) into ``dest``, then remove ``raw``.

    Raises:
        OutputNotWritten: the profiler could not write ``raw`` (Kineto only logs that: found by
            :func:`~.profiler.capture.export_failure`, with the OS error when it can be told), or the copy into
            ``dest`` failed (a full disk); ``dest`` is the file named, so that the caller, which writes into a
            staging folder (:class:`~.outdir.RunFolder`), names it where it would have been published.
    """
    from .errors import OutputNotWritten, os_reason
    from .profiler.capture import export_failure

    failure = export_failure(os.fspath(raw))
    if failure is not None:
        raise OutputNotWritten(f"{dest}: the profiler could not write the window's trace ({failure})", dest,
                               f"the profiler could not write the window's trace: {failure}")
    try:
        with open(raw, "rb") as src, gzip.open(dest, "wb", compresslevel=6) as out:
            shutil.copyfileobj(src, out, 1 << 20)
        os.remove(raw)
    except OSError as exc:
        raise OutputNotWritten(f"{dest}: cannot write the trace ({os_reason(exc)})", dest, os_reason(exc)) \
            from None


def check_analysis(analysis: dict | None) -> dict:
    """The model and bandwidth options of ``diagnose trace`` that were given (``model``, ``bytes_per_step``,
    ``dtype``, ``context``, ``peak_gbps``; None values dropped), checked as ``diagnose trace`` checks them, before
    the program runs.

    Raises:
        BubblescopeError: what :mod:`~bubblescope.tracediagnose` refuses (an unknown model, a config that cannot
            be read, bytes ≤ 0, a peak ≤ 0, a context without a model), naming the option.
    """
    from .tracediagnose import check_context, check_peak, resolve_step_bytes

    given = {k: v for k, v in (analysis or {}).items() if v is not None}
    step_bytes = resolve_step_bytes(given.get("model"), given.get("bytes_per_step"), given.get("dtype"))
    check_context(given.get("context"), step_bytes)
    if check_peak(given.get("peak_gbps")) is not None and step_bytes is None:
        raise BubblescopeError("--peak-gbps: the peak is compared with each step's bytes; give --model or "
                               "--bytes-per-step too")
    return given


def analyse_window(trace_path: str | os.PathLike, idle_threshold_us: float, analysis: dict | None = None) -> dict:
    """The ``diagnose trace`` summary of the window's trace: ``bubblescope.trace/1`` with each step's bandwidth
    against the floor when a model or byte count is given, and ``findings``
    (:func:`~bubblescope.tracediagnose.diagnose_trace_files`, with ``analysis`` of :func:`check_analysis`).

    Raises:
        BubblescopeError: the trace cannot be read, a bad option or context.
    """
    from .tracediagnose import diagnose_trace_files

    # The trace's first step is the profiler's warm-up step (profile_runner.StepWindow): left out of the figures.
    summary = diagnose_trace_files([str(trace_path)], threshold_us=idle_threshold_us, skip_steps=WARMUP_STEPS,
                                   **check_analysis(analysis))
    errors = [f["error"] for f in summary["files"] if "error" in f]
    if errors:
        raise BubblescopeError(errors[0])
    return summary


def with_unprofiled(summary: dict, section: dict) -> dict:
    """``summary`` with the window's bandwidth also stated without the profiler's cost. Pure: returns a new dict.

    The trace's step times carry the profiler's own cost (on an eager loop it can be most of the step), so the
    first file's bandwidth section gets, where a floor and the unprofiled median step (``section``, from
    :func:`profile_section`) exist, ``summary["step_us_p50_unprofiled"]``, ``effective_GBps_unprofiled`` (GB/s),
    ``util_peak_unprofiled`` (fraction of the peak) and ``over_floor_x_unprofiled`` (that step over the floor),
    and its verdict a clause with them; the traced figures stay as they are."""
    files = summary.get("files") or []
    bw = (files[0].get("bandwidth") or {}) if files else {}
    s, ref = bw.get("summary") or {}, section.get("step_ms_p50_unprofiled")
    floor, nbytes = s.get("floor_us"), s.get("bytes_per_step")
    if not ref or not floor or not nbytes or not bw.get("verdict"):
        return summary
    ref_us = ref * 1e3
    extra = {"step_us_p50_unprofiled": ref_us, "effective_GBps_unprofiled": section["effective_GBps_unprofiled"],
             "util_peak_unprofiled": section["util_peak_unprofiled"], "over_floor_x_unprofiled": ref_us / floor}
    clause = (f"; without the profiler {ref:,.3f} ms per step ({count(section['reference_steps'], 'step')} "
              f"{section['reference_from']} the window), {extra['over_floor_x_unprofiled']:.2f}× the floor: "
              f"{extra['util_peak_unprofiled']:.0%} of peak") if extra["util_peak_unprofiled"] is not None else ""
    first = {**files[0], "bandwidth": {**bw, "summary": {**s, **extra}, "verdict": bw["verdict"] + clause}}
    return {**summary, "files": [first, *files[1:]]}


def relocated(summary: dict, old: str, new: str) -> dict:
    """``summary`` with the trace path ``old`` (in the staging folder) named ``new`` (where it is published), in
    its files and findings. Pure: returns a new dict."""
    files = [{**f, "path": new} if f.get("path") == old else f for f in summary.get("files", [])]
    findings = [{**f, "file": new} if f.get("file") == old else f for f in summary.get("findings", [])]
    return {**summary, "files": files, "findings": findings}


def exit_status(code: int) -> int:
    """A child's status as a shell reports it: a signal N (``-N`` from :mod:`subprocess`) is 128 + N."""
    return 128 - code if code < 0 else code


@dataclass
class ProfileOutcome:
    """What :func:`profile_program` did.

    Attributes:
        exit_code: what ``bubblescope profile`` exits with: the program's status (a signal N as 128 + N), or 2
            where the program succeeded but nothing could be reported.
        summary: the analysed window (``bubblescope.trace/1`` with ``findings`` and ``profile``), or None.
        notes: one-line notes on the run (:func:`~bubblescope.reports.profile_report.outcome_lines`), the
            program's failure first.
        error: the one-line message when no report was made, else None.
        written: the files published into ``--out``.
    """

    exit_code: int
    summary: dict | None
    notes: list[str]
    error: str | None
    written: list[Path]


def profile_program(program: Program, out: str | os.PathLike, skip: int, steps: int | None, seconds: float | None,
                    idle_threshold_us: float, analysis: dict | None = None, command: str | None = None
                    ) -> ProfileOutcome:
    """Run ``program`` (:func:`run_program`), analyse its window as ``diagnose trace`` does and publish
    ``profile.json``, ``profile.html`` and ``profile.trace.json.gz`` into ``out`` together (a staging folder and
    renames, :class:`~bubblescope.outdir.RunFolder`): ``out`` keeps the previous run's files whole whatever fails.

    A program that fails, or ends inside the window, still has what was recorded reported, with a note; one that
    ends before the window leaves ``out`` as it was. Where the trace is written whole but cannot be analysed, the
    trace alone is published. Where the recording is incomplete because a write failed (a full disk: a state
    write of the runner failed, or the trace ends early), nothing is published: ``out`` keeps the previous run,
    and the error names ``out`` and the OS error; the exit status is the program's when it failed, else 2.

    Raises:
        BubblescopeError: ``out`` cannot be created or written, a refused analysis option (both before the
            program runs), or the outputs cannot be written (nothing published then).
    """
    from .errors import OutputNotWritten
    from .outdir import RunFolder

    analysis = check_analysis(analysis)
    out = Path(out)
    ran: dict = {}  # the program's exit status and failure note, once it has run
    try:
        return _profile_into(RunFolder(out, owned=OUT_FILES), program, skip, steps, seconds, idle_threshold_us,
                             analysis, command, ran)
    except OutputNotWritten as exc:  # nothing published; the program's own failure status passes through
        if not ran.get("status"):
            raise
        return ProfileOutcome(ran["status"], None, ran["notes"], str(exc), [])


def _profile_into(folder, program: Program, skip: int, steps: int | None, seconds: float | None,
                  idle_threshold_us: float, analysis: dict, command: str | None, ran: dict) -> ProfileOutcome:
    """:func:`profile_program` in the run folder ``folder`` (:class:`~bubblescope.outdir.RunFolder`); the
    program's exit status and failure notes are put into ``ran`` (``status``, ``notes``) once it has run."""
    from .errors import OutputNotWritten
    from .reports.profile_report import not_reached_message, outcome_lines
    from .reports.trace_html import write_trace_html
    from .reports.trace_result import write_trace_result

    out = folder.out
    final = str(out / TRACE_NAME)
    with folder:
        stage = folder.stage
        code, state = run_program(program, stage, skip, steps, seconds)
        status = exit_status(code)
        section = profile_section(state, status, program, None)
        failed = [f"{program.label}: exited with status {status}"] if status else []
        ran.update(status=status, notes=failed)
        if state.get("write_error"):  # the state file is stale or absent, the trace perhaps cut short
            raise OutputNotWritten(f"{stage}: cannot write ({state['write_error']})", None, state["write_error"])
        if section["status"] == "not-reached":
            return ProfileOutcome(status or 2, None, failed, not_reached_message(section, state, program.label), [])
        compress_trace(stage / RAW_TRACE, stage / TRACE_NAME)
        for name in (STATE, "config.json"):
            (stage / name).unlink(missing_ok=True)
        try:
            summary = analyse_window(stage / TRACE_NAME, idle_threshold_us, analysis)
        except BubblescopeError as exc:
            if TRUNCATED in str(exc):  # Kineto's last write failed unseen (a full disk): never published
                raise OutputNotWritten(f"{stage / TRACE_NAME}: {CUT_SHORT}", stage / TRACE_NAME, CUT_SHORT) \
                    from None
            folder.publish()
            return ProfileOutcome(status or 2, None, failed, f"{exc}; the trace is kept as {final}", [Path(final)])
        section = profile_section(state, status, program, summary["files"][0])
        summary = with_unprofiled(relocated(summary, str(stage / TRACE_NAME), final), section)
        notes = failed + outcome_lines(section, program.label)
        write_trace_result(profile_document(summary, section, command or ""), stage / "profile.json")
        write_trace_html(summary, summary["findings"], stage / "profile.html", command=command, notes=notes)
        summary = {**summary, "profile": section}
        folder.publish()
    return ProfileOutcome(status, summary, notes, None, [out / name for name in OUT_FILES])


def profile_document(summary: dict, section: dict, command: str = "") -> dict:
    """The ``profile.json`` document: the ``bubblescope.trace-result/1`` result of ``diagnose trace --json``
    (:func:`~bubblescope.reports.trace_result.trace_result`, which ``bubblescope gate`` reads) of the window,
    with the ``profile`` section (:func:`profile_section`) added. Pure."""
    from .reports.trace_result import trace_result

    return {**trace_result(summary, summary.get("findings") or [], command=command), "profile": section}
