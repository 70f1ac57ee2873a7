"""The results document: schema ``bubblescope.results/1``, validation, loading and atomic writing.

The document is plain JSON, the only input of ``bubblescope report`` and ``bubblescope gate``; every
key and unit is described in ``docs/results-schema.md``. A value that could not be measured is
``null``, never 0; validation enforces that where 0 cannot be real (a latency, a bandwidth, bytes per
step must be positive). Extra keys are allowed, so a newer writer can add fields without breaking
older readers.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import tempfile
import zlib
from datetime import datetime
from pathlib import Path
from typing import Any

from ..errors import BubblescopeError, OutputNotWritten, os_reason

SCHEMA = "bubblescope.results/1"

# The ablation ladder, from plain eager PyTorch to the fused kernel; reports list engines in this
# order so each step's gain reads left to right. Unknown engine names follow, in document order.
ENGINE_ORDER = ("reference", "reference-cudagraph", "reference-compile", "reference-fused", "reference-fused-pdl",
                "hf", "megakernel-stages", "megakernel-noprefetch", "megakernel")

# ---- the schema as data -------------------------------------------------------------------------
# A key ending in "?" may be null; in "??", also absent (a key added after documents were written).
# Values: a kind name (below), "list[kind]", "dict[kind]", a tuple of
# allowed strings, a nested dict (a sub-record) or a one-element list holding a record spec.
_KINDS = {
    "str": "a string",
    "bool": "true or false",
    "int": "an integer >= 0",
    "num": "a finite number >= 0",
    "pos": "a finite number > 0 (0 is not a measurement: use null)",
    "frac": "a fraction in [0, 1]",
    "real": "a finite number",
    "label": "a string or an integer",
    "dict": "an object",
}

_LATENCY = {"ttft_ms?": "pos", "e2e_ms??": "pos", "token_ms_mean?": "pos", "token_ms_p50?": "pos", "token_ms_p90?": "pos",
            "token_ms_p99?": "pos", "tok_per_s?": "pos", "decode_share?": "frac",
            "token_ms_samples?": "list[pos]", "ttft_ms_samples?": "list[pos]",
            "first_run??": {"token_ms_p50?": "pos", "ttft_ms?": "pos", "tokens": "int"}}
_BANDWIDTH = {"bytes_per_step?": "pos", "kv_bytes_per_step?": "num", "effective_GBps?": "pos",
              "util_peak?": "num", "util_copy?": "num"}
_SHARE_ROW = {"category": "str", "count": "int", "total_us": "num", "share": "frac"}
_TIMELINE = {
    "available": "bool", "reason?": "str", "steps?": "int", "warmup_steps??": "int", "device?": "label",
    "kernels_per_step?": "num", "launches_per_step?": "num", "launches_per_s?": "num",
    "bubble_ratio?": "frac", "bubble_ratio_steps?": "list[frac]", "launch_share?": "frac",
    "sync_share?": "frac", "gpu_busy_us_per_step?": "num", "step_wall_us?": "pos",
    "idle?": {"host_wait_us?": "num", "kernel_wait_us?": "num", "other_us?": "num", "threshold_us?": "num"},
    "launch_delay_us?": {"p50?": "real", "p90?": "real", "max?": "real"},
    "top_kernels?": [{"name": "str", **_SHARE_ROW}],
    "categories?": [_SHARE_ROW],
    "max_registers_per_thread?": "int",
    "step_timeline?": {
        "kernels": [{"name": "str", "category": "str", "stream": "label", "start_us": "real", "dur_us": "num"}],
        "launches": [{"name": "str", "start_us": "real", "dur_us": "num"}]},
}
# intrakernel.stream_feed's values (timeline.stream_feed): null where a window was empty or a stamp absent
_FEED = {"chain_us?": "real", "chain_GBps?": "real", "mlp_us?": "real", "mlp_GBps?": "real", "layer_GBps?": "real",
         "qkv_mv_after_last_issue_us?": "real"}
_INTRAKERNEL = {
    "wait_ratio?": "frac", "programs?": "int", "tasks_per_step?": "int", "activity??": "dict",
    "by_opcode?": [{"opcode": "label", "tasks": "int", "busy_us": "num", "wait_us": "num"}],
    "attn_phases??": "dict", "attn_critical??": "dict",
    "task_phases??": [{"opcode": "label", "tasks": "int", "stage_us_p50": "real", "mv_us_p50": "real",
                       "epilogue_us_p50": "real", "epilogue_us_max": "real"}],
    "edges??": [{"edge": "str", "stages": "int", "hop_us_p50": "real", "hop_us_max": "real", "span_us_p50": "num"}],
    "stream_feed??": {"median": _FEED, "per_layer": [{"layer": "int", **_FEED}]},
    "tasks?": [{"program": "int", "opcode": "label", "layer?": "int",
                "start_us": "real", "ready_us": "real", "end_us": "real"}],
}
_COMPILE = {"registers?": "int", "spills?": "int", "shared_bytes?": "int", "num_warps?": "int", "text_bytes??": "int",
            "programs_per_sm?": "int", "grid?": "int"}
_CORRECTNESS = {"reference?": "str", "steps?": "int", "token_agreement?": "frac",
                "max_abs_logit_diff?": "num", "rel_logit_err?": "num",
                "kl_vs_fp32??": "num", "nll??": "num", "nll_fp32??": "num", "ref_kl_vs_fp32??": "num",
                "ref_nll??": "num", "fidelity_matched??": "bool",
                "vs_unquantized??": {"token_agreement": "frac", "max_abs_logit_diff?": "num", "rel_logit_err?": "num"}}
_SWEEP_ROW = {"context": "int", "token_ms_p50?": "pos", "ttft_ms??": "pos", "bytes_per_step?": "pos",
              "kv_bytes_per_step?": "num", "effective_GBps?": "pos", "util_peak?": "num"}
_ENGINE = {
    "name": "str", "description": "str", "status": ("ok", "skipped", "failed"), "reason?": "str",
    "latency?": _LATENCY, "bandwidth?": _BANDWIDTH, "timeline?": _TIMELINE, "intrakernel?": _INTRAKERNEL,
    "compile?": _COMPILE, "correctness?": _CORRECTNESS, "sweep?": [_SWEEP_ROW], "trace_path?": "str",
}
# "good" is what older results documents used for near-bandwidth-limit (now "info"): still readable.
_FINDING = {"rule": "str", "severity": ("info", "warn", "problem", "good"), "engine?": "str", "title": "str",
            "evidence": "dict[real]", "advice": "str"}
# reports.ladder.ladder: derived from the engines, written with them (absent in documents written before it)
_LADDER_ROW = {"engine": "str", "rung": "str", "removes": "str", "status": ("ok", "skipped", "failed", "not run"),
               "reason?": "str", "token_ms_p50?": "pos", "util_peak?": "num", "kernels_per_step?": "num",
               "bubble_ratio?": "frac", "bubble_source?": "str", "bubble_us?": "num",
               "idle_us?": {"host_wait_us": "num", "kernel_wait_us": "num", "other_us": "num"}, "below?": "str",
               "step_us?": "real", "kl_vs_fp32?": "num", "nll?": "num", "fidelity_matched?": "bool"}
_DOCUMENT = {
    "schema": "str", "created": "str", "command": "str",
    "versions": {"bubblescope": "str", "python?": "str", "torch?": "str", "triton?": "str",
                 "transformers?": "str", "cuda?": "str", "driver?": "str"},
    "device": {"type": ("cuda", "cpu"), "name": "str", "sm_count?": "int", "l2_bytes?": "int",
               "nvml_peak_GBps?": "pos", "copy_GBps?": "pos", "max_sm_clock_MHz?": "pos",
               "max_mem_clock_MHz?": "pos", "bus_width_bits?": "int", "notes": "list[str]",
               "threads??": {"torch_threads?": "int", "omp_num_threads?": "str", "cpu_count?": "int"}},
    "model": {"name": "str", "source": ("dummy", "hf", "llama2c"), "path?": "str", "parameters?": "int",
              "weight_bytes?": "int", "dtype": "str", "weights??": ("bf16", "fp8", "fp8-all"), "config?": "dict"},
    "workload": {"prompt_len": "int", "gen_len": "int", "runs": "int", "warmup": "int",
                 "context_sweep": "list[int]", "seed?": "int", "prefill??": ("batched", "stepwise")},
    "engines": [_ENGINE],
    "findings": [_FINDING],
    "ladder??": [_LADDER_ROW],
}


def _is_kind(value: Any, kind: str) -> bool:
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "dict":
        return isinstance(value, dict)
    if kind == "label":
        return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if kind == "int":
        return isinstance(value, int) and value >= 0
    try:
        if not math.isfinite(value):
            return False
    except OverflowError:  # an integer literal beyond float range (1e400 written out in digits)
        return False
    return {"real": True, "num": value >= 0, "pos": value > 0, "frac": 0 <= value <= 1}[kind]


def _describe(spec: Any) -> str:
    if isinstance(spec, tuple):
        return "one of " + ", ".join(repr(s) for s in spec)
    if isinstance(spec, dict):
        return "an object"
    if isinstance(spec, list):
        return "a list of objects"
    if spec.startswith("list["):
        return f"a list, each item {_KINDS[spec[5:-1]]}"
    if spec.startswith("dict["):
        return f"an object, each value {_KINDS[spec[5:-1]]}"
    return _KINDS[spec]


def _shown(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return type(value).__name__
    text = json.dumps(value, default=repr)
    return text if len(text) <= 40 else text[:37] + "..."


def _check(value: Any, spec: Any, path: str, problems: list[str]) -> None:
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            problems.append(f"{path}: expected an object, got {_shown(value)}")
            return
        for key, sub in spec.items():
            name, nullable = key.rstrip("?"), key.endswith("?")
            where = f"{path}.{name}" if path else name
            if name not in value:
                if not key.endswith("??"):  # "??": added later, so documents written before may lack it
                    problems.append(f"{where}: missing")
            elif value[name] is None:
                if not nullable:
                    problems.append(f"{where}: expected {_describe(sub)}, got null")
            else:
                _check(value[name], sub, where, problems)
    elif isinstance(spec, list):
        if not isinstance(value, list):
            problems.append(f"{path}: expected a list, got {_shown(value)}")
            return
        for i, item in enumerate(value):
            _check(item, spec[0], f"{path}[{i}]", problems)
    elif isinstance(spec, tuple):
        if value not in spec:
            problems.append(f"{path}: expected {_describe(spec)}, got {_shown(value)}")
    elif spec.startswith(("list[", "dict[")):
        container, kind = (list if spec.startswith("list[") else dict), spec[5:-1]
        items = value.values() if isinstance(value, dict) else value
        if not isinstance(value, container) or not all(_is_kind(v, kind) for v in items):
            problems.append(f"{path}: expected {_describe(spec)}, got {_shown(value)}")
    elif not _is_kind(value, spec):
        problems.append(f"{path}: expected {_describe(spec)}, got {_shown(value)}")


def _check_semantics(doc: dict, problems: list[str]) -> None:
    if doc.get("schema") != SCHEMA:
        problems.append(f"schema: expected {SCHEMA!r}, got {_shown(doc.get('schema'))}")
    created = doc.get("created")
    if isinstance(created, str):
        try:
            # fromisoformat accepts a trailing "Z" only from Python 3.11 on.
            datetime.fromisoformat(created[:-1] + "+00:00" if created.endswith("Z") else created)
        except ValueError:
            problems.append(f"created: expected an ISO-8601 timestamp, got {_shown(created)}")
    engines = doc.get("engines") if isinstance(doc.get("engines"), list) else []
    seen: set[str] = set()
    for i, eng in enumerate(engines):
        if not isinstance(eng, dict):
            continue
        name = eng.get("name")
        if not isinstance(name, str):  # a wrong type is reported by the schema check
            continue
        if name in seen:
            problems.append(f"engines[{i}].name: duplicate engine name {name!r}")
        seen.add(name)
        if eng.get("status") == "ok" and "latency" in eng and eng["latency"] is None:
            problems.append(f"engines[{i}].latency: an engine with status 'ok' must report latency")
        if eng.get("status") in ("skipped", "failed") and "reason" in eng and eng["reason"] is None:
            problems.append(f"engines[{i}].reason: a {eng['status']} engine must give a reason")
        lat = eng.get("latency")
        if isinstance(lat, dict):
            pcts = [(k, lat.get(k)) for k in ("token_ms_p50", "token_ms_p90", "token_ms_p99")]
            known = [(k, v) for k, v in pcts if _is_kind(v, "pos")]
            for (ka, va), (kb, vb) in zip(known, known[1:]):
                if va > vb:
                    problems.append(f"engines[{i}].latency: {ka} {va} exceeds {kb} {vb}")


def validate_results(doc: Any) -> list[str]:
    """Check a results document against schema ``bubblescope.results/1``.

    Checks every required key is present (value ``null`` where the schema allows it), the type and
    range of every value (latencies, bandwidths and bytes must be > 0 or null; fractions in [0, 1];
    no NaN or infinity), the ISO-8601 ``created`` timestamp, unique engine names, that an ``ok``
    engine reports latency and a skipped/failed one gives a reason, and p50 <= p90 <= p99.

    Args:
        doc: the parsed JSON (any value; a non-object is reported, not raised).

    Returns:
        One line per problem, e.g. ``"engines[0].latency.token_ms_p50: expected a finite number > 0
        (0 is not a measurement: use null), got 0"``; an empty list means valid.
    """
    if not isinstance(doc, dict):
        return [f"document: expected an object, got {_shown(doc)}"]
    problems: list[str] = []
    _check(doc, _DOCUMENT, "", problems)
    _check_semantics(doc, problems)
    return problems


def dig(obj: Any, *keys: str | int) -> Any:
    """``obj[k1][k2]...``, or None when any level is missing or null (the reports' null-safe read)."""
    for key in keys:
        if isinstance(obj, dict):
            obj = obj.get(key)
        elif isinstance(obj, list) and isinstance(key, int) and -len(obj) <= key < len(obj):
            obj = obj[key]
        else:
            return None
        if obj is None:
            return None
    return obj


def ordered(engines: list[dict]) -> list[dict]:
    """Engines in ablation-ladder order (:data:`ENGINE_ORDER`), unknown names last in document order."""
    rank = {name: i for i, name in enumerate(ENGINE_ORDER)}
    indexed = list(enumerate(engines))
    indexed.sort(key=lambda p: (rank.get(p[1].get("name"), len(rank)), p[0]))
    return [eng for _, eng in indexed]


class Results:
    """A results document (the parsed JSON dict, kept as is in :attr:`doc`).

    Construction does not validate, so :mod:`bubblescope.diagnosis` can fill a document step by step;
    :func:`load_results` and :func:`write_results` validate.
    """

    def __init__(self, doc: dict) -> None:
        self.doc = doc

    @property
    def engines(self) -> list[dict]:
        """The engine entries in document order (empty when absent)."""
        return list(self.doc.get("engines") or [])

    @property
    def ok_engines(self) -> list[dict]:
        """Engines with status ``ok``, in document order."""
        return [e for e in self.engines if e.get("status") == "ok"]

    def engine(self, name: str) -> dict:
        """The entry of engine ``name``.

        Raises:
            BubblescopeError: no engine of that name in the document.
        """
        for eng in self.engines:
            if eng.get("name") == name:
                return eng
        have = ", ".join(str(e.get("name")) for e in self.engines) or "none"
        raise BubblescopeError(f"engine {name!r}: not in the results (engines: {have})")

    def to_json(self) -> str:
        """The document as indented JSON text.

        Raises:
            ValueError: the document holds NaN or infinity (the schema wants null instead).
        """
        return json.dumps(self.doc, indent=2, allow_nan=False, ensure_ascii=False) + "\n"


def load_results(path: str | os.PathLike) -> Results:
    """Read and validate a results JSON file (``.json``, or gzip-compressed ``.json.gz`` for archives;
    gzip is recognised by its magic bytes, and a UTF-8 byte-order mark is skipped).

    Raises:
        BubblescopeError: the file is missing or unreadable, not JSON, of another schema, or invalid
            (the one-line message names the path and the first problem).
    """
    path = Path(path)
    try:
        data = path.read_bytes()
        # gzip is told by its magic bytes, not the name: a renamed archive still loads.
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        text = data.decode("utf-8-sig")  # -sig: a leading byte-order mark is skipped
    except FileNotFoundError:
        raise BubblescopeError(f"{path}: no such results file") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise BubblescopeError(f"{path}: corrupt or truncated gzip file ({str(exc) or type(exc).__name__})") from None
    except UnicodeDecodeError as exc:
        raise BubblescopeError(f"{path}: not UTF-8 text (invalid byte at offset {exc.start})") from None
    except OSError as exc:
        raise BubblescopeError(f"{path}: cannot read results file ({exc.strerror or type(exc).__name__})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BubblescopeError(f"{path}: not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise BubblescopeError(f"{path}: not a results document (JSON nested too deeply)") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else None
        raise BubblescopeError(f"{path}: not a bubblescope results document (schema {got!r}, expected {SCHEMA!r})")
    problems = validate_results(doc)
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise BubblescopeError(f"{path}: invalid results document: {problems[0]}{more}")
    return Results(doc)


def write_results(results: Results | dict, path: str | os.PathLike) -> Path:
    """Validate, then write the document atomically (a temporary file beside ``path``, then ``os.replace``).

    Returns:
        The path written.

    Raises:
        ValueError: the document is invalid (a bug in whoever built it; nothing is written).
        BubblescopeError: the destination cannot be written.
    """
    doc = results.doc if isinstance(results, Results) else results
    problems = validate_results(doc)
    if problems:
        raise ValueError(f"refusing to write an invalid results document: {problems[0]}")
    return atomic_write_text(path, Results(doc).to_json())


def _where(path: Path, option: str | None) -> str:
    return f"{option} {path}" if option else str(path)


def _refuse_non_file(path: Path, where: str) -> None:
    if path.exists() and not path.is_file():
        raise BubblescopeError(f"{where}: exists and is not a regular file (a directory or device); give a file path")


def check_destination(path: str | os.PathLike, option: str | None = None) -> Path:
    """``path`` as a Path when :func:`atomic_write_text` can write it as far as can be told before any work:
    not an existing directory or device, in an existing directory this process may write into.

    Raises:
        BubblescopeError: one line naming ``option`` (``--html``) and what is wrong.
    """
    path = Path(path)
    where = _where(path, option)
    _refuse_non_file(path, where)
    parent = path.parent
    if not parent.is_dir():
        raise BubblescopeError(f"{where}: no such directory {str(parent)!r}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise BubblescopeError(f"{where}: cannot write here (permission denied)")
    return path


def atomic_write_text(path: str | os.PathLike, text: str, option: str | None = None) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file and ``os.replace``.

    A reader never sees a half-written file; on failure the old file, if any, is untouched. An
    existing ``path`` that is not a regular file (a directory, ``/dev/null``, a pipe) is refused,
    since the rename would replace it rather than write into it. ``option``: the CLI option that gave
    ``path`` (``--html``), named first in the error messages.

    Raises:
        BubblescopeError: the directory is missing or not writable, or ``path`` is not a regular file.
    """
    atomic_write_texts([(path, text, option)])
    return Path(path)


def atomic_write_texts(files: list[tuple[str | os.PathLike, str, str | None]]) -> None:
    """Write several ``(path, text, option)`` as :func:`atomic_write_text` writes one: every text goes to a
    temporary file next to its path first, and only when all are written are they renamed into place, so a file
    that cannot be written leaves the others as they were (a rename failing midway, after the staging, is not
    undone). No temporary file is left, whatever fails.

    Raises:
        BubblescopeError: as :func:`atomic_write_text`, naming the file that could not be written; a failed
            write itself (disk full, over the file size limit) is an :class:`~bubblescope.errors.OutputNotWritten`
            carrying the OS error.
    """
    staged: list[tuple[str, Path, str]] = []
    try:
        for path, text, option in files:
            path = Path(path)
            where = _where(path, option)
            _refuse_non_file(path, where)
            try:
                fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            except OSError as exc:
                raise OutputNotWritten(f"{where}: cannot write here ({os_reason(exc)})", path, os_reason(exc)) \
                    from None
            staged.append((tmp, path, where))
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    fh.write(text)
                # mkstemp creates the file 0600; a report is meant to be shared like any other file.
                os.chmod(tmp, 0o644)
            except OSError as exc:  # disk full (ENOSPC), over the file size limit (EFBIG)
                raise OutputNotWritten(f"{where}: cannot write here ({os_reason(exc)})", path, os_reason(exc)) \
                    from None
        for tmp, path, where in staged:
            try:
                os.replace(tmp, path)
            except OSError as exc:  # the destination turned out unwritable
                raise OutputNotWritten(f"{where}: cannot write here ({os_reason(exc)})", path, os_reason(exc)) \
                    from None
    finally:
        for tmp, _, _ in staged:
            Path(tmp).unlink(missing_ok=True)
