"""Run a Python program, unchanged, under torch.profiler for a bounded window of its decode steps.

The program's code is not changed; its environment gains ``TEARDOWN_CUPTI=1`` when the window starts (CUDA ≥ 12.6,
not already set), so that its steps after the window run without CUPTI attached.

``bubblescope profile`` starts ``<python> [flags] profile_runner.py CONFIG.json (SCRIPT | -m MODULE) [args]``.
This file is run by path in the program's own interpreter, so it imports only the standard library at import
time (torch once the program is set up) and nothing of bubblescope but Kineto's log filter, loaded from its file.

A program without step markers still has steps: each token is one call of the model. Light hooks count them:
an *outermost* call — one made while no other counted call is active — of ``torch.nn.Module.__call__``, of a
function made by ``torch.compile`` (gpt-fast compiles a function, so its model runs inside compiled code and no
module call happens at run time), or of ``torch.cuda.CUDAGraph.replay``. Calls are tallied per key (the module's
class, the compiled function's name, the replay); the step count is the highest tally, so a loop that calls two
outermost modules per token (a model, then a sampler module) still counts one step per token, and a prefill
under another key merges with the next step at most (work before the first token under another key, such as
the reference engine capturing its graphs, three model calls a graph, adds that many early steps). Inside code that dynamo traces the hooks do nothing.

The window (:class:`StepWindow`): after ``skip`` steps the profiler starts, runs for ``steps`` steps (or
``seconds``), stops and writes the trace; then as many steps again are timed without it, so the profiler's cost
per step can be stated from the same hooks' timestamps. The program's stdout, stderr and exit status are its
own. The state file (CONFIG's ``state``) is written at the window's start, at its end and at exit, atomically,
so a program that is killed after the window still leaves its trace and counts behind. A state write that fails
(a full disk) does not stop the program: its OS error goes to ``bubblescope profile`` through a pipe (CONFIG's
``report_fd``), which then publishes nothing.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and sys.path[0] and os.path.abspath(sys.path[0]) == _HERE:
    # `python profile_runner.py` put bubblescope's package folder first on sys.path, where its modules would
    # shadow the program's (`models`, `errors`); the program's own sys.path[0] is set in _target().
    del sys.path[0]

import json  # noqa: E402  (after sys.path is cleaned)
import runpy  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

STATE_SCHEMA = "bubblescope.profile-run/1"
# Exit status when the profiling set-up itself fails (torch missing in the program's interpreter): the CLI's
# bad-input code, told apart from the program's own status by the state file's "status".
SETUP_FAILED = 2


class StepWindow:
    """Which steps are profiled: a pure state machine fed with step boundaries (no torch, no clock of its own).

    Phases: ``skip`` (steps 0 .. skip-1, unprofiled, timed) → ``warm`` (step ``skip``: profiled, the profiler's
    own warm-up) → ``window`` (profiled) → ``reference`` (as many steps timed unprofiled) → ``done``. The skipped
    steps are the baseline, taken before any profiler ran: once a CUDA profiler has run, the process may keep paying
    for it (Kineto leaves CUPTI attached unless ``TEARDOWN_CUPTI=1``, pytorch/pytorch#144455; the runner sets it
    where CUDA ≥ 12.6 and it is unset, and some cost remains), so the steps after the window are timed beside it,
    not instead. Tracing costs
    more in its first step (a first step 8× the median was seen on CPU), which is why ``torch.profiler.schedule``
    has a ``warmup`` phase; here that step stays in the trace, as its first step, and the report leaves it out
    of the step figures. :meth:`boundary` is called when step ``k`` begins (k = 0, 1, ...), with the time in ns,
    and answers ``"start"`` (start the profiler, then call :meth:`started`), ``"stop"`` (call :meth:`stopping`
    first, then stop and export, then :meth:`stopped`) or None.

    Args:
        skip: steps left out before the window (warm-up, prefill, compilation), ≥ 0.
        steps: steps in the window, ≥ 1; or None with ``seconds``.
        seconds: the window's length in s, > 0: it ends at the first step boundary at or after it.

    Attributes:
        before_ns: step boundaries of the skipped steps, ns: each one's start, and the profiler's start (the end
            of the last).
        window_ns: step boundaries of the window, ns: its first step's start (the end of the profiler's warm-up
            step), each next step's start, and the end of its last step (before the profiler stopped).
        reference_ns: step boundaries of the unprofiled steps timed after the window, ns (the step in which the
            profiler stopped and the trace was written is left out).
    """

    def __init__(self, skip: int, steps: int | None = None, seconds: float | None = None):
        if (steps is None) == (seconds is None):
            raise ValueError("give steps or seconds, not both or neither")
        self.skip, self.steps, self.seconds = skip, steps, seconds
        self.phase = "skip"
        self.before_ns: list[int] = []
        self.window_ns: list[int] = []
        self.reference_ns: list[int] = []
        self.first_step: int | None = None  # the window's first step
        self._after_stop = False

    def window_steps(self) -> int:
        """Steps in the window so far (complete or cut by the program's end)."""
        return max(len(self.window_ns) - 1, 0)

    def boundary(self, k: int, now_ns: int) -> str | None:
        """Step ``k`` begins at ``now_ns``: what to do (see the class doc)."""
        if self.phase == "skip":
            self.before_ns.append(now_ns)
            if k >= self.skip:
                self.first_step = k
                return "start"
            return None
        if self.phase == "warm":
            self.phase = "window"
            self.window_ns = [now_ns]
            return None
        if self.phase == "window":
            n = len(self.window_ns)  # steps begun in the window so far
            full = (n >= self.steps if self.steps is not None
                    else now_ns - self.window_ns[0] >= self.seconds * 1e9)
            if full:
                return "stop"
            self.window_ns.append(now_ns)
            return None
        if self.phase == "reference":
            if self._after_stop:  # the step that stopped the profiler and wrote the trace is not timed
                self._after_stop = False
                self.reference_ns = [now_ns]
                return None
            self.reference_ns.append(now_ns)
            if len(self.reference_ns) > self.window_steps():
                self.phase = "done"
        return None

    def started(self, now_ns: int) -> None:
        """The profiler runs from ``now_ns`` on: its warm-up step starts here."""
        self.phase = "warm"
        self.window_ns = []

    def stopping(self, now_ns: int) -> None:
        """The window's last step ended at ``now_ns`` (the profiler is about to stop)."""
        if self.window_ns:  # else the program ended in the warm-up step: no window step
            self.window_ns.append(now_ns)

    def stopped(self) -> None:
        """The profiler has stopped and the trace is written: the reference steps follow."""
        self.phase = "reference"
        self._after_stop = True


def _report(fd: int | None, doc: dict) -> None:
    """Tell ``bubblescope profile`` ``doc`` through the pipe it passed (CONFIG's ``report_fd``): one JSON line,
    which needs no disk space; nothing when there is no pipe or it is closed."""
    if fd is None:
        return
    try:
        os.write(fd, (json.dumps(doc) + "\n").encode("utf-8"))
    except (OSError, ValueError):
        pass


def _atomic_json(path: str, doc: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".state.", suffix=".tmp", dir=os.path.dirname(path) or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise


def _quiet():
    """Kineto's start/stop marker filter (:mod:`bubblescope.profiler.kineto_log`), loaded from its file beside
    this one; a no-op context when it cannot be loaded."""
    import contextlib
    import importlib.util

    try:
        spec = importlib.util.spec_from_file_location("_bubblescope_kineto_log",
                                                      os.path.join(_HERE, "profiler", "kineto_log.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod.drop_kineto_markers
    except Exception:  # noqa: BLE001 - only the log lines' filter is lost
        return contextlib.nullcontext


class Recorder:
    """The hooks' state: outermost-call tallies, the window, the profiler, the state file.

    Args:
        config: ``{"skip", "steps", "seconds", "trace", "state"}`` (trace and state: file paths).
    """

    def __init__(self, config: dict):
        self.config = config
        self.window = StepWindow(config["skip"], config.get("steps"), config.get("seconds"))
        self.counts: dict[str, int] = {}
        self.steps = 0  # the highest tally: steps begun
        self.depth = 0
        self.graph_replays = 0  # every CUDA-graph replay, counted as a step or not
        self.pid = os.getpid()
        self.prof = None
        self.trace_written = False
        self.quiet = _quiet()
        self.error: str | None = None
        self.closed_by: str | None = None  # what ended the window: "length" or "program-end"
        self.report_fd: int | None = config.get("report_fd")
        self.write_error: str | None = None  # the first state write that failed (a full disk): the OS error
        if self.report_fd is not None:
            try:  # the program's own child processes do not get the pipe
                os.set_inheritable(self.report_fd, False)
            except OSError:
                self.report_fd = None

    def enter(self, key: str) -> bool:
        """An outermost call of ``key`` begins (only then does it count): True when it was counted, and the
        caller must call :meth:`leave` when it returns."""
        if self.depth or os.getpid() != self.pid:  # nested, or in a forked child
            return False
        self.depth = 1
        n = self.counts.get(key, 0) + 1
        self.counts[key] = n
        if n > self.steps:
            self.steps = n
            try:
                self._boundary(n - 1)
            except Exception as exc:  # noqa: BLE001 - the profiler failing must not end the program
                self.error = f"{type(exc).__name__}: {exc}"
                self.window.phase = "done"
        return True

    def leave(self) -> None:
        self.depth = 0

    def _boundary(self, k: int) -> None:
        action = self.window.boundary(k, time.perf_counter_ns())
        if action == "start":
            self._start()
        elif action == "stop":
            self.window.stopping(time.perf_counter_ns())
            self.closed_by = "length"
            self._stop()
            self.window.stopped()

    def _start(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            activities.append(ProfilerActivity.CUDA)
            # CUPTI torn down when the window stops, so the program's later steps run at full speed again (the
            # rule and its measurement: profiler.capture.release_cupti_after_profiling; not imported, as nothing
            # of bubblescope is loaded into the program)
            cuda = torch.version.cuda or "0.0"
            if tuple(int(x) for x in cuda.split(".")[:2]) >= (12, 6):
                os.environ.setdefault("TEARDOWN_CUPTI", "1")
            torch.cuda.synchronize()  # the window's kernels are its own, not the skipped steps' still in flight
        prof = profile(activities=activities, record_shapes=False)
        with self.quiet():
            prof.start()  # raises while another profiler runs (one the program started itself)
        self.prof = prof
        self.window.started(time.perf_counter_ns())
        self.write_state("window")

    def _stop(self) -> None:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # the window's last kernels end inside the trace
        prof, self.prof = self.prof, None
        with self.quiet():
            prof.stop()
        prof.export_chrome_trace(self.config["trace"])
        self.trace_written = True
        self.write_state("reference")

    def finish(self) -> None:
        """At the program's end: a window still open is closed and its trace written."""
        if self.prof is not None:
            self.window.stopping(time.perf_counter_ns())
            self.closed_by = "program-end"
            self._stop()
            self.window.phase = "done"

    def write_state(self, status: str, exit_code: int | None = None, message: str | None = None) -> None:
        """Write the state file (atomically). A write that fails (a full disk, the file size limit) never ends
        the program: its OS error is sent to ``bubblescope profile`` through the report pipe (:func:`_report`),
        the first time only, and the recording then counts as incomplete there."""
        try:
            self._write_state(status, exit_code, message)
        except OSError as exc:
            if self.write_error is None:
                self.write_error = exc.strerror or (os.strerror(exc.errno) if exc.errno else type(exc).__name__)
                _report(self.report_fd, {"write_error": self.write_error, "status": status})

    def _write_state(self, status: str, exit_code: int | None, message: str | None) -> None:
        w = self.window
        _atomic_json(self.config["state"], {
            "schema": STATE_SCHEMA, "status": status, "exit_code": exit_code, "message": message,
            "error": self.error, "steps_counted": self.steps, "calls": dict(self.counts),
            "graph_replays": self.graph_replays,
            "skip": w.skip, "steps": w.steps, "seconds": w.seconds, "first_step": w.first_step,
            "window_steps": w.window_steps(), "before_ns": list(w.before_ns), "window_ns": list(w.window_ns),
            "reference_ns": list(w.reference_ns), "closed_by": self.closed_by,
            "trace": self.config["trace"] if self.trace_written else None,
            "cuda": _cuda_used()})


def _cuda_used() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized())


def install(rec: Recorder):
    """Count outermost calls of modules, ``torch.compile``d functions and CUDA-graph replays into ``rec``.

    Returns:
        A function that puts back what was replaced (``torch.nn.Module.__call__``,
        ``torch.cuda.CUDAGraph.replay``, ``torch.compile``); the runner never needs it, a test does.
    """
    import functools

    import torch

    compiling = torch.compiler.is_compiling

    def counted(fn, key_of):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            if compiling() or not rec.enter(key_of(args)):  # traced by dynamo, or nested
                return fn(*args, **kwargs)
            try:
                return fn(*args, **kwargs)
            finally:
                rec.leave()
        return call

    saved = (torch.nn.Module.__call__, torch.cuda.CUDAGraph.replay, torch.compile)

    def restore() -> None:
        torch.nn.Module.__call__, torch.cuda.CUDAGraph.replay, torch.compile = saved

    torch.nn.Module.__call__ = counted(torch.nn.Module.__call__,
                                       lambda args: f"module {type(args[0]).__qualname__}")
    replay = counted(torch.cuda.CUDAGraph.replay, lambda args: "CUDAGraph.replay")

    @functools.wraps(replay)
    def replay_counted(*args, **kwargs):
        rec.graph_replays += 1  # nested ones too (inside a compiled call): they show the graphs are in use
        return replay(*args, **kwargs)

    torch.cuda.CUDAGraph.replay = replay_counted
    compile_ = torch.compile

    @functools.wraps(compile_)
    def compile_counted(model=None, **kwargs):
        if model is None:  # @torch.compile(mode=...): a decorator to apply
            return lambda fn: compile_counted(fn, **kwargs)
        out = compile_(model, **kwargs)
        if isinstance(model, torch.nn.Module) or not callable(out):  # modules are counted by Module.__call__
            return out
        name = getattr(model, "__qualname__", None) or type(model).__qualname__
        return counted(out, lambda args: f"compiled {name}")

    torch.compile = compile_counted
    return restore


def _target(spec: list[str]) -> tuple[str, str]:
    """``(kind, name)`` of ``SCRIPT args`` or ``-m MODULE args``; sets ``sys.argv`` and ``sys.path[0]`` as
    ``python SCRIPT`` / ``python -m MODULE`` would."""
    if spec[0] == "-m":
        sys.argv = [spec[1], *spec[2:]]  # runpy puts the module's file name in argv[0]
        if not sys.flags.safe_path:
            sys.path.insert(0, os.getcwd())
        return "module", spec[1]
    sys.argv = list(spec)
    if not sys.flags.safe_path:
        sys.path.insert(0, os.path.dirname(os.path.abspath(spec[0])))
    return "script", spec[0]


def main(argv: list[str]) -> int:
    """``profile_runner.py CONFIG.json (SCRIPT | -m MODULE) [args]``: run the program, return its exit status."""
    with open(argv[0], encoding="utf-8") as fh:
        config = json.load(fh)
    kind, name = _target(argv[1:])
    rec = Recorder(config)
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        rec.write_state("setup-failed", SETUP_FAILED, f"torch cannot be imported by {sys.executable} ({exc})")
        return SETUP_FAILED
    install(rec)  # before the program's own imports: `from torch import compile` gets the counted one
    if kind == "module":
        import importlib.util

        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            rec.write_state("setup-failed", SETUP_FAILED, f"no module named {name!r} for {sys.executable}")
            return SETUP_FAILED
    rec.write_state("running")
    code, message = 0, None
    try:
        if kind == "module":
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(name, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)  # sys.exit("message") prints it, as Python does
    except KeyboardInterrupt:
        traceback.print_exc()
        code, message = 130, "KeyboardInterrupt"
    except BaseException as exc:  # the program's own error: its traceback, as Python prints it
        traceback.print_exc()
        code = 1
        text = str(exc).strip().splitlines()
        message = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    try:
        rec.finish()
    except Exception as exc:  # noqa: BLE001 - said in the state; the program's status stands
        rec.error = f"{type(exc).__name__}: {exc}"
    rec.write_state("exited", code, message)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
