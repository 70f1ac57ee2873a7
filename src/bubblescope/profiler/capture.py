"""Capture a Kineto (torch.profiler) Chrome trace of greedy decode steps, each marked as a range.

Each measured step runs inside ``torch.profiler.record_function("<marker>#<i>")``, so the trace
parser can assign kernels to steps through their launches' correlation ids. The trace is written
gzip-compressed and atomically: a reader never sees half a file. Only public torch.profiler API is
used (``profile``, ``ProfilerActivity``, ``record_function``, ``export_chrome_trace`` to a plain
``.json`` path), unchanged from torch 2.0 through 2.13.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BubblescopeError, OutputNotWritten, os_reason
from .kineto_log import quiet_start_stop

STEP_MARKER = "bubblescope.decode_step"
# Top-level trace key holding the KV positions the first marked step reads (start_position + 1: the cache and
# the new token), so `diagnose trace --model` knows each step's context without --context.
CONTEXT_KEY = "bubblescope_first_context"
# How many of the trace's marked steps are warm-up (the profiler's own first steps, slower): ``diagnose trace``
# leaves them out by default, as the run that wrote the trace did, so both state the same step figures.
WARMUP_KEY = "bubblescope_warmup_steps"
# The run's dtype (``float32``, ``bfloat16``, ``float16``) and weight format (``bf16``, ``fp8``, ``fp8-all``), so
# `diagnose trace --model` counts the bytes the traced decode moved without --dtype (a float32 step moves twice a
# bfloat16 one's).
DTYPE_KEY = "bubblescope_dtype"
WEIGHTS_KEY = "bubblescope_weights"
CPU_ONLY_NOTE = "CPU-only capture: GPU metrics unavailable"


@dataclass(frozen=True)
class CaptureResult:
    """What :func:`capture_decode_trace` wrote.

    Attributes:
        trace_path: the gzip-compressed Chrome trace (``.json.gz``).
        steps: measured decode steps in the trace (one ``<marker>#<i>`` range each, i = 0..steps-1).
        gpu: whether CUDA activity (kernels, memcpys) was captured.
        note: why GPU metrics are missing, or None.
        tokens: every greedy token generated after the prompt, in order: the prefill's, the warm-up
            steps', then the measured steps' (1 + warmup + steps tokens).
        start_position: ``decoder.position`` (KV-cache length) before the first measured step; measured
            step i runs at position ``start_position + i``.
    """

    trace_path: Path
    steps: int
    gpu: bool
    note: str | None
    tokens: list[int] = field(default_factory=list)
    start_position: int = 0


def _check_count(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise BubblescopeError(f"capture: {name} must be an integer >= {low}, got {value!r}")


def _atomic_write(path: Path, write) -> None:
    """Create ``path`` whole or not at all: ``write(binary file)`` fills a temp file in the same
    directory (gzip-compressed if ``path`` ends in ``.gz``), then ``os.replace`` puts it in place.
    BubblescopeError when the directory is not writable or ``path`` is a directory (nothing is written);
    OutputNotWritten (with the OS error) when the write itself fails (disk full, over the file size limit).
    No temporary file is left either way."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise OutputNotWritten(f"{path}: cannot write the trace here ({os_reason(exc)})", path, os_reason(exc)) \
            from None
    try:
        with os.fdopen(fd, "wb") as raw:
            if path.name.endswith(".gz"):
                with gzip.GzipFile(fileobj=raw, mode="wb") as out:
                    write(out)
            else:
                write(raw)
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; a trace is meant to be shared like any other file
        os.replace(tmp, path)
    except OSError as exc:  # disk full, over the file size limit, or the destination is a directory
        raise OutputNotWritten(f"{path}: cannot write the trace ({os_reason(exc)})", path, os_reason(exc)) \
            from None
    finally:
        with suppress(FileNotFoundError):
            os.remove(tmp)


def export_failure(raw: str) -> str | None:
    """Why Kineto could not write its trace to ``raw``, or None when it did.

    Kineto (``export_chrome_trace``) writes ``<raw>.tmp`` and renames it over ``raw`` at the end; a failed write
    is only logged ("Failed to write to log file!"), never raised, and leaves the ``.tmp`` behind with ``raw``
    empty (or absent). The OS error is found again by writing one more byte to that leftover (EFBIG over the file size
    limit, ENOSPC on a full disk). The leftover is removed."""
    leftover = raw + ".tmp"
    if not os.path.exists(leftover):
        return None if os.path.exists(raw) and os.path.getsize(raw) > 0 else "the profiler wrote nothing"
    try:
        with open(leftover, "ab") as fh:
            fh.write(b" ")
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        return os_reason(exc)
    finally:
        with suppress(FileNotFoundError):
            os.remove(leftover)
    return "the profiler could not write it"


def _greedy_step(decoder, token: int) -> int:
    """One greedy decode step as the Decoder protocol defines it (docs/design.md, "The Decoder protocol"): the
    engine's optional ``decode_greedy`` (the argmax picked on the device), else the argmax of ``decode``'s logits
    taken to the host. Written against the protocol, not imported from the engines, which sit above the
    profiler."""
    import torch

    fused = getattr(decoder, "decode_greedy", None)
    return fused(token) if callable(fused) else int(torch.argmax(decoder.decode(token)))


def release_cupti_after_profiling() -> None:
    """Ask Kineto to tear CUPTI down when a profiler stops (``TEARDOWN_CUPTI=1``, which libkineto reads
    at the process's first stop), unless the environment already says otherwise.

    Without it CUPTI stays attached after ``torch.profiler`` stops and every later kernel pays for it: on an H100
    (torch 2.11, CUDA 13.0) the reference engine's CUDA-graph step ran 2.66 ms before any profiling, 2.94 after
    one profiler run and 3.09 after two; with the teardown 2.68 and 2.76 after either. ``diagnose model`` times each
    engine after the previous ones were profiled, so without it an engine's place in the run would move its
    latency. Left alone below CUDA 12.6, where re-initialising CUPTI after a teardown can crash with CUDA graphs
    (torch's profiler turns the teardown off there itself)."""
    import torch

    cuda = torch.version.cuda
    if cuda and tuple(int(x) for x in cuda.split(".")[:2]) >= (12, 6):
        os.environ.setdefault("TEARDOWN_CUPTI", "1")


def capture_decode_trace(decoder, prompt_ids, steps: int = 8, warmup: int = 3,
                         out_path: str | os.PathLike | None = None,
                         step_marker: str = STEP_MARKER, profiled_warmup: int = 0, dtype: str | None = None,
                         weights: str | None = None) -> CaptureResult:
    """Profile ``steps`` greedy decode steps of ``decoder`` and write a ``.json.gz`` Chrome trace.

    Procedure: ``decoder.prepare(first, last)`` for the decode steps' positions where the decoder has it;
    ``decoder.reset()``;
    ``prefill(prompt_ids)``; ``warmup`` greedy decode steps unprofiled (CUDA-graph capture, Triton compilation and
    allocator growth happen in these two stages, not in the trace); then, under ``torch.profiler.profile(activities=[CPU]
    (+ [CUDA] on a cuda decoder), record_shapes=False)`` (CUPTI released when it stops:
    :func:`release_cupti_after_profiling`), ``steps`` steps each inside ``record_function(f"{step_marker}#{i}")``.
    A step includes taking the greedy token to the host as ``generate()`` does (:func:`_greedy_step`: the
    engine's fused greedy step when it has one, else ``int(decode(tok).argmax())``): that host sync is part of
    per-token latency. On a CPU decoder only CPU activity is captured: ``gpu`` is False and ``note`` says GPU metrics are unavailable
    (no zeros are made up).

    Args:
        decoder: a :class:`bubblescope.generation.Decoder` (``name``, ``config``, ``device``, ``position``).
        prompt_ids: token ids, a sequence of ints or a LongTensor (T,), T >= 1.
        out_path: where to write; must end in ``.json.gz``; default
            ``bubblescope-out/<decoder.name>.trace.json.gz``. Parent directories are created.
        profiled_warmup: how many of the ``steps`` the caller leaves out of its figures as warm-up, recorded in
            the trace (metadata :data:`WARMUP_KEY`, beside the first step's context :data:`CONTEXT_KEY`) so that
            ``diagnose trace`` leaves out the same steps.
        dtype, weights: the run's dtype name (``bfloat16``) and weight format (``bf16``, ``fp8``, ``fp8-all``),
            recorded (:data:`DTYPE_KEY`, :data:`WEIGHTS_KEY`) when given, for ``diagnose trace --model``'s bytes.

    Raises:
        BubblescopeError: an empty prompt, ``steps`` < 1, ``warmup`` < 0, ``profiled_warmup`` outside
            [0, ``steps``), a marker that is empty or holds
            ``#``, an ``out_path`` not ending in ``.json.gz``, or prompt + warmup + steps beyond
            ``decoder.config.max_position_embeddings``.
        OutputNotWritten: the trace could not be written (disk full, over the file size limit; the OS error in
            the message); nothing is left at ``out_path``.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    _check_count("steps", steps, 1)
    _check_count("warmup", warmup, 0)
    _check_count("profiled_warmup", profiled_warmup, 0)
    if profiled_warmup >= steps:
        raise BubblescopeError(f"capture: profiled_warmup {profiled_warmup} leaves none of the {steps} steps measured")
    if not isinstance(step_marker, str) or not step_marker or "#" in step_marker:
        raise BubblescopeError(f"capture: step_marker must be a non-empty string without '#', got {step_marker!r}")
    path = Path(out_path) if out_path is not None else Path("bubblescope-out") / f"{decoder.name}.trace.json.gz"
    if not path.name.endswith(".json.gz"):
        raise BubblescopeError(f"{path}: trace output must end in .json.gz")
    try:
        prompt = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(-1).to(decoder.device)
    except (TypeError, ValueError, RuntimeError) as e:
        raise BubblescopeError(f"capture: prompt_ids must be integer token ids ({e.__class__.__name__})") from None
    if prompt.numel() == 0:
        raise BubblescopeError("capture: prompt_ids is empty; give at least one token")
    needed = prompt.numel() + warmup + steps
    limit = decoder.config.max_position_embeddings
    if needed > limit:
        raise BubblescopeError(f"capture: prompt ({prompt.numel()}) + warmup ({warmup}) + steps ({steps}) = "
                               f"{needed} positions exceed {decoder.config.name}'s max_position_embeddings {limit}")
    path.parent.mkdir(parents=True, exist_ok=True)

    gpu = torch.device(decoder.device).type == "cuda"
    prepare = getattr(decoder, "prepare", None)   # the Decoder protocol's optional hook: captures before the trace
    if callable(prepare):
        prepare(prompt.numel(), needed - 1)
    decoder.reset()
    tok = int(decoder.prefill(prompt).argmax())
    tokens = [tok]
    for _ in range(warmup):
        tok = _greedy_step(decoder, tok)
        tokens.append(tok)
    start_position = int(decoder.position)

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    if gpu:
        release_cupti_after_profiling()
        torch.cuda.synchronize(decoder.device)
    with quiet_start_stop(profile(activities=activities, record_shapes=False)) as prof:
        for i in range(steps):
            with record_function(f"{step_marker}#{i}"):
                tok = _greedy_step(decoder, tok)
            tokens.append(tok)
        if gpu:
            torch.cuda.synchronize(decoder.device)
        prof.add_metadata_json(CONTEXT_KEY, str(start_position + 1))
        prof.add_metadata_json(WARMUP_KEY, str(int(profiled_warmup)))
        for key, value in ((DTYPE_KEY, dtype), (WEIGHTS_KEY, weights)):
            if value is not None:
                prof.add_metadata_json(key, json.dumps(str(value)))

    try:
        fd, raw = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".json", dir=path.parent)
    except OSError as exc:
        raise OutputNotWritten(f"{path}: cannot write the trace here ({os_reason(exc)})", path, os_reason(exc)) \
            from None
    os.close(fd)
    try:
        prof.export_chrome_trace(raw)
        if (why := export_failure(raw)) is not None:
            raise OutputNotWritten(f"{path}: cannot write the trace ({why})", path, why)

        def copy(out) -> None:
            with open(raw, "rb") as src:
                shutil.copyfileobj(src, out)

        _atomic_write(path, copy)
    finally:
        with suppress(FileNotFoundError):
            os.remove(raw)
    return CaptureResult(trace_path=path, steps=steps, gpu=gpu, note=None if gpu else CPU_ONLY_NOTE,
                         tokens=tokens, start_position=start_position)


def append_trace_events(trace_path: str | os.PathLike, events: list[dict]) -> None:
    """Add Chrome-trace events to an existing ``.json.gz`` (or plain ``.json``) trace, atomically.

    For the megakernel's intra-kernel timeline, e.g. ``{"ph": "M", "name": "process_name", "pid":
    "megakernel (intra-kernel)", "args": {"name": "megakernel (intra-kernel)"}}`` and ``{"ph": "X",
    "name": "rmsnorm_qkv L3", "cat": "megakernel_task", "pid": "megakernel (intra-kernel)", "tid": sm,
    "ts": µs, "dur": µs}``; ``ts`` must be on the trace's own µs clock, and ``cat`` must not be a GPU
    activity category (``kernel``...) or the trace parser counts the events as kernels. Works on both
    the object form (``{"traceEvents": [...]}``, what Kineto writes) and the bare-array form.

    Raises:
        BubblescopeError: the file is missing, not (gzip) JSON or not a trace, or an event is not a dict
            with ``ph`` and ``name``.
        OutputNotWritten: the new file could not be written (the old one is left as it was).
    """
    path = Path(trace_path)
    if not path.is_file():
        raise BubblescopeError(f"{path}: no such trace file")
    if not isinstance(events, (list, tuple)):
        raise BubblescopeError(f"trace events: expected a list of event dicts, got {type(events).__name__}")
    for k, ev in enumerate(events):
        if not isinstance(ev, dict) or not isinstance(ev.get("ph"), str) or "name" not in ev:
            raise BubblescopeError(f"trace events: event {k} must be a dict with 'ph' and 'name', got {ev!r:.80}")
    compressed = path.name.endswith(".gz")
    try:
        opener = gzip.open if compressed else open
        with opener(path, "rt", encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BubblescopeError(f"{path}: not a {'gzip ' if compressed else ''}JSON trace ({e.__class__.__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''})") from None
    if isinstance(data, list):
        data.extend(events)
    elif isinstance(data, dict) and isinstance(data.get("traceEvents", []), list):
        data.setdefault("traceEvents", []).extend(events)
    else:
        raise BubblescopeError(f"{path}: not a Chrome trace (expected a list or an object with traceEvents)")
    _atomic_write(path, lambda out: out.write(json.dumps(data).encode()))
