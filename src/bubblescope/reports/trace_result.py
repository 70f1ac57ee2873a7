"""The result document of ``diagnose trace --json`` (and ``profile``): schema ``bubblescope.trace-result/1``.

One compact document per run, for ``bubblescope gate`` and CI: per trace file its step count and how the steps
were found, ms per step (p50, p99), bubble ratio, and, with a model, bytes per step, effective GB/s,
utilisation of the peak and the floor, and for host-bound steps the host's time per step by CPU operator; the
model and device that make two documents comparable; the findings.
docs/results-schema.md describes every key. Rules as for ``bubblescope.results/1``: not measured is null, never
0; no NaN; fractions in [0, 1] except utilisations (a small model may exceed the peak from L2).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
from pathlib import Path
from typing import Any


SCHEMA = "bubblescope.trace-result/1"
SCHEMA_PREFIX = "bubblescope.trace-result/"
FILE_NUMBERS = ("step_ms_p50", "step_ms_p99", "bubble_ratio", "kernels_per_step", "launches_per_step",
                "bytes_per_step", "effective_GBps", "util_peak", "floor_ms", "over_floor_ms")
FRACTIONS = ("bubble_ratio",)  # in [0, 1]; util_peak may exceed 1 (a small model served from L2)
# What a trace summary says of a file without GPU activity to measure, as its steps' reason and as a warning
# (written by the profiler's trace summary, recognised by the views, so both read the words from here).
CPU_ONLY = "no GPU activity in trace (CPU-only run)"
_ALL_EXCLUDED = "excluded as invalid (see warnings): GPU metrics unavailable"


def no_gpu_reason(excluded: int) -> str:
    """Why a trace has no GPU activity to measure: :data:`CPU_ONLY`, or, when ``excluded`` (> 0) GPU activity
    events were all dropped as invalid (negative or missing ``dur``, ...), that (the warnings say why)."""
    if not excluded:
        return CPU_ONLY
    what = "the only GPU activity event was" if excluded == 1 else f"all {excluded} GPU activity events were"
    return f"{what} {_ALL_EXCLUDED}"


def is_no_gpu_reason(text: str) -> bool:
    """Whether ``text`` is one of :func:`no_gpu_reason`'s answers."""
    return text == CPU_ONLY or text.endswith(_ALL_EXCLUDED)


def _number(value: Any) -> float | None:
    """``value`` as a float when it is a finite JSON number, else None (an integer literal beyond float range,
    1e400 written out in digits, is not finite: float() of it would raise OverflowError)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _step_ms(rows: list[dict]) -> tuple[float | None, float | None]:
    """(p50, p99) of the measured steps' wall times in ms (numpy's linear percentiles), None without any."""
    import numpy as np

    walls = [r["wall_us"] for r in rows if not r.get("warmup") and r.get("wall_us") is not None]
    if not walls:
        return None, None
    return float(np.percentile(walls, 50)) / 1e3, float(np.percentile(walls, 99)) / 1e3


def _file(f: dict) -> dict:
    steps, detection, bw = f.get("steps") or {}, f.get("step_detection") or {}, f.get("bandwidth") or {}
    summary = bw.get("summary") or {}
    p50, p99 = _step_ms(f.get("step_rows") or [])
    props = f.get("device_properties") or {}

    def ms(us):
        return None if us is None else us / 1e3

    return {"path": f.get("path"), "rank": f.get("rank"), "device": bw.get("device") or props.get("name"),
            "steps": int(steps.get("steps") or 0), "steps_found_by": detection.get("method"),
            "step_confidence": detection.get("confidence"), "step_ms_p50": p50, "step_ms_p99": p99,
            "bubble_ratio": _number(steps.get("bubble_ratio")),
            "kernels_per_step": _number(steps.get("kernels_per_step")),
            "launches_per_step": _number(steps.get("launches_per_step")),
            "bytes_per_step": summary.get("bytes_per_step"), "kv": bw.get("kv"),
            "effective_GBps": _number(summary.get("effective_GBps")), "util_peak": _number(summary.get("util_peak")),
            "floor_ms": ms(_number(summary.get("floor_us"))),
            "over_floor_ms": ms(_number(summary.get("over_floor_us"))), "host_ops": f.get("host_ops")}


def trace_result(summary: dict, findings: list[dict], command: str = "", created: str | None = None) -> dict:
    """The result document of a trace summary with bandwidth sections (``tracediagnose.diagnose_trace_files``)
    and its findings. Files that could not be read are left out (the CLI writes no document then).

    ``model``: the ``--model`` name and dtype, or ``--bytes-per-step`` (``bytes_source``); ``device``: the first
    file's GPU name (``CPU`` for a CPU-only trace) and the peak used, with its source.
    """
    from ..version import __version__

    files = [f for f in summary.get("files") or [] if "error" not in f]
    rows = [_file(f) for f in files]
    bw = next((f.get("bandwidth") for f in files if f.get("bandwidth")), None) or {}
    device = next((r["device"] for r in rows if r["device"]), None)
    if device is None and files and not any(f.get("devices") for f in files):
        device = "CPU"
    return {"schema": SCHEMA, "created": created or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": command, "versions": {"bubblescope": __version__, "python": platform.python_version()},
            "model": {"name": bw.get("model"), "dtype": bw.get("dtype"), "weights": bw.get("weights"),
                      "bytes_source": bw.get("bytes_source")},
            "device": {"name": device, "peak_GBps": _number(bw.get("peak_GBps")), "peak_source": bw.get("peak_source")},
            "files": rows, "findings": findings}


def validate_trace_result(doc: Any) -> list[str]:
    """Problems of a ``bubblescope.trace-result/1`` document, one line each (empty when valid)."""
    if not isinstance(doc, dict):
        return ["not a JSON object"]
    problems = []
    if doc.get("schema") != SCHEMA:
        problems.append(f"schema: {doc.get('schema')!r}, expected {SCHEMA!r}")
    for key, kind in (("model", dict), ("device", dict), ("files", list), ("findings", list), ("command", str)):
        if not isinstance(doc.get(key), kind):
            problems.append(f"{key}: missing or not a {'object' if kind is dict else kind.__name__}")
    for i, f in enumerate(doc.get("files") if isinstance(doc.get("files"), list) else []):
        if not isinstance(f, dict):
            problems.append(f"files[{i}]: not an object")
            continue
        for key in FILE_NUMBERS:
            value = f.get(key)
            if value is not None and _number(value) is None:
                problems.append(f"files[{i}].{key}: {value!r} is not a finite number or null")
            elif value is not None and value < 0 and key != "over_floor_ms":
                problems.append(f"files[{i}].{key}: {value!r} is negative")
            elif key in FRACTIONS and value is not None and value > 1:
                problems.append(f"files[{i}].{key}: {value!r} is above 1 (a fraction)")
        if not isinstance(f.get("steps"), int) or isinstance(f.get("steps"), bool) or f["steps"] < 0:
            problems.append(f"files[{i}].steps: not an integer >= 0")
        host_ops = f.get("host_ops")
        if host_ops is not None and (not isinstance(host_ops, dict)
                                     or not isinstance(host_ops.get("rows"), (list, type(None)))):
            problems.append(f"files[{i}].host_ops: not null or an object whose rows are a list or null")
    return problems


def write_trace_result(doc: dict, path: str | os.PathLike, option: str | None = None) -> Path:
    """Validate ``doc``, then write it atomically (temporary file, then ``os.replace``): a failure leaves the
    previous file as it was.

    Raises:
        ValueError: the document is invalid (nothing is written).
        BubblescopeError: the destination cannot be written.
    """
    from .results import atomic_write_text

    return atomic_write_text(path, trace_result_text(doc), option)


def trace_result_text(doc: dict) -> str:
    """``doc`` as the JSON text :func:`write_trace_result` writes (indented, no NaN), once it is valid.

    Raises:
        ValueError: the document is invalid (:func:`validate_trace_result`).
    """
    problems = validate_trace_result(doc)
    if problems:
        raise ValueError(f"refusing to write an invalid trace result: {problems[0]}")
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"


def is_trace_result(doc: Any) -> bool:
    """Whether ``doc`` claims the trace-result schema (any version)."""
    return isinstance(doc, dict) and str(doc.get("schema", "")).startswith(SCHEMA_PREFIX)
