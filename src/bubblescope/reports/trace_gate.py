"""The CI gate on ``diagnose trace --json`` / ``profile`` results (``bubblescope.trace-result/1``).

``bubblescope gate`` reads either document kind (:func:`load_gate_document`) and :func:`run_any_gate` sends
a ``diagnose model`` results document to :func:`~.gate.run_gate` and a trace result here. The checks are the
same options on a trace's figures, every readable trace file checked (one row per file):

- ``--min-bandwidth-util``: ``util_peak`` (the median step's bytes / step time / peak) ≥ F;
- ``--max-bubble-ratio``: ``bubble_ratio`` ≤ F;
- ``--max-token-p99-ms``: ``step_ms_p99`` (ms per step, p99) ≤ F;
- ``--baseline OLD --max-regression F``: ``step_ms_p50`` ≤ old × (1 + F) and ``effective_GBps`` ≥ old / (1 + F),
  file by file.

Exit codes as :mod:`.gate`: a null metric fails its check (a gate that cannot see does not pass). A baseline of
the other kind, or of another model or device (or number of files), is "not comparable": exit 2, unless
``--allow-mismatch`` for the model and device (never for the kind).
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from pathlib import Path
from typing import Any

from ..errors import BubblescopeError
from .gate import Check, GateReport, check_limits, run_gate
from .trace_result import SCHEMA, is_trace_result, validate_trace_result

KINDS = {True: "a trace result (diagnose trace --json, profile)", False: "a results document (diagnose model)"}


def load_gate_document(path: str | os.PathLike) -> dict:
    """A document the gate reads: a trace result (validated here) or a ``diagnose model`` results document
    (:func:`~.results.load_results`, whose messages say what is wrong with an unreadable file).

    Raises:
        BubblescopeError: the file is missing, unreadable or not JSON, or an invalid document of either kind.
    """
    from .results import load_results

    try:
        data = Path(path).read_bytes()
        doc = json.loads((gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).decode("utf-8-sig"))
    except (OSError, EOFError, zlib.error, ValueError, RecursionError):
        doc = None
    if not is_trace_result(doc):
        return load_results(path).doc
    problems = validate_trace_result(doc)
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise BubblescopeError(f"{path}: invalid trace result: {problems[0]}{more}")
    return doc


def trace_mismatches(doc: dict, baseline: dict) -> list[str]:
    """``"model: llama-3.2-1b vs baseline qwen3-0.6b"`` for each of model name, dtype, weight format and device
    name that differ between two trace results (empty when comparable). A result written before the weight format
    was recorded has no ``model.weights``: its model's weights were counted unquantized (bf16)."""
    out = []
    for label, section, key in (("model", "model", "name"), ("dtype", "model", "dtype"),
                                ("weights", "model", "weights"), ("device", "device", "name")):
        new, old = (doc.get(section) or {}).get(key), (baseline.get(section) or {}).get(key)
        if key == "weights" and doc["model"].get("name") is not None:
            new = new or "bf16"
        if key == "weights" and baseline["model"].get("name") is not None:
            old = old or "bf16"
        if new != old:
            out.append(f"{label}: {new} vs baseline {old}")
    return out


def _label(f: dict) -> str:
    name = os.path.basename(str(f.get("path")))
    return name if f.get("rank") is None else f"{name} (rank {f['rank']})"


def _check(name: str, subject: str, measured: Any, limit: float, holds, what: str) -> Check:
    if measured is None:
        return Check(name, subject, None, limit, False, f"{what} not measured (null): failing closed")
    ok = bool(holds(measured, limit))
    return Check(name, subject, measured, limit, ok, f"{what} {measured:.6g}, limit {limit:.6g}: "
                                                      f"{'holds' if ok else 'fails'}")


def run_trace_gate(doc: dict, min_bandwidth_util: float | None = None, max_bubble_ratio: float | None = None,
                   max_token_p99_ms: float | None = None, baseline: dict | None = None,
                   max_regression: float | None = None, allow_mismatch: bool = False) -> GateReport:
    """Check every file of a trace result (the module doc's checks, each only when its limit is given).

    Returns:
        A :class:`~.gate.GateReport` (``engine``: "trace result"), one check per file and limit; exit code 0
        when all hold, 1 when one fails.

    Raises:
        BubblescopeError: an invalid document, a bad limit, ``baseline`` without ``max_regression`` or the
            reverse, no check requested, no readable file, or a baseline not comparable (another kind; another
            model, dtype or device unless ``allow_mismatch``; another number of files).
    """
    check_limits(min_bandwidth_util, max_bubble_ratio, max_token_p99_ms, max_regression, baseline)
    for what, d in (("results", doc), ("baseline", baseline)):
        problems = validate_trace_result(d) if d is not None else []
        if problems:
            raise BubblescopeError(f"{what}: invalid trace result: {problems[0]}")
    files = doc["files"]
    if not files:
        raise BubblescopeError("results: the trace result holds no trace file to gate")
    if baseline is not None:
        diff = trace_mismatches(doc, baseline)
        if len(baseline["files"]) != len(files):
            raise BubblescopeError(f"gate: the baseline is not comparable ({len(files)} trace files vs "
                                   f"{len(baseline['files'])} in the baseline)")
        if diff and not allow_mismatch:
            raise BubblescopeError(f"gate: the baseline is not comparable ({'; '.join(diff)}); "
                                   "pass --allow-mismatch to compare anyway")
    checks = []
    for i, f in enumerate(files):
        who = _label(f)
        if min_bandwidth_util is not None:
            checks.append(_check("min_bandwidth_util", who, f.get("util_peak"), min_bandwidth_util,
                                 lambda m, lim: m >= lim, "util_peak"))
        if max_bubble_ratio is not None:
            checks.append(_check("max_bubble_ratio", who, f.get("bubble_ratio"), max_bubble_ratio,
                                 lambda m, lim: m <= lim, "bubble_ratio"))
        if max_token_p99_ms is not None:
            checks.append(_check("max_token_p99_ms", who, f.get("step_ms_p99"), max_token_p99_ms,
                                 lambda m, lim: m <= lim, "step_ms_p99 (ms)"))
        if baseline is not None:
            old = baseline["files"][i]
            for metric, slower in (("step_ms_p50", True), ("effective_GBps", False)):
                before = old.get(metric)
                if before is None:
                    checks.append(Check(f"regression_{metric}", who, f.get(metric), None, False,
                                        f"baseline {metric} not measured (null): failing closed"))
                    continue
                limit = before * (1 + max_regression) if slower else before / (1 + max_regression)
                c = _check(f"regression_{metric}", who, f.get(metric), limit,
                           (lambda m, lim: m <= lim) if slower else (lambda m, lim: m >= lim), metric)
                checks.append(Check(c.name, c.engine, c.measured, c.limit, c.passed,
                                    f"{c.detail} (baseline {before:.6g}, allowed regression {max_regression:.0%})"))
    return GateReport("trace result", tuple(checks))


def run_any_gate(doc: dict, engine: str | None = None, baseline: dict | None = None, **limits: Any) -> GateReport:
    """:func:`~.gate.run_gate` for a ``diagnose model`` results document, :func:`run_trace_gate` for a trace
    result (``engine`` is refused there: a trace has no engines).

    Raises:
        BubblescopeError: the two documents are of different kinds ("not comparable"), ``engine`` with a trace
            result, or what the gate it runs raises.
    """
    trace = is_trace_result(doc)
    if baseline is not None and is_trace_result(baseline) != trace:
        raise BubblescopeError(f"gate: the baseline is not comparable: {KINDS[trace]} against "
                               f"{KINDS[not trace]}")
    if not trace:
        return run_gate(doc, engine=engine, baseline=baseline, **limits)
    if engine is not None:
        raise BubblescopeError(f"--engine {engine}: a trace result ({SCHEMA}) has no engines; leave --engine out")
    return run_trace_gate(doc, baseline=baseline, **limits)
