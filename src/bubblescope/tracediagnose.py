"""``diagnose trace`` as a library call: summary, bandwidth against the floor, findings.

:func:`diagnose_trace_files` is what ``bubblescope diagnose trace`` and ``bubblescope profile`` both run on
trace files: :func:`~.profiler.trace.ranksummary.summarize_rank_traces` (steps from markers, or found without them),
then, given a model (or a byte count per step), each file's ``bandwidth`` section (:func:`add_bandwidth`:
bytes, effective GB/s, % of peak and the floor per step), then the findings. The model and the peak are
resolved here, in the order the CLI documents:

- bytes per step: ``--model`` (a preset, a Hugging Face directory or its ``config.json``; weights + the KV
  cache at each step's context when the context is known, from ``--context`` or from the trace, else weights
  only) or ``--bytes-per-step`` (fixed);
- peak: ``--peak-gbps``; else the trace's ``deviceProperties`` in the table of known GPUs (vendor datasheets,
  :mod:`.profiler.gpus`); else NVML, when the trace was taken on this machine (its ``host_name`` is this host's
  and NVML has a GPU of the trace's name); else unknown, said so, and no percentage.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from .errors import BubblescopeError

# bytes per element of the dtypes a decode's weights and KV cache are stored in
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
DEFAULT_DTYPE = "bfloat16"


@dataclass(frozen=True)
class StepBytes:
    """What one decode step moves: from a model config (``config``, in ``dtype``, its projections stored as
    ``weights``: ``bf16`` or, for an FP8 checkpoint, ``fp8`` / ``fp8-all``) or a fixed count."""

    source: str  # "model" or "bytes-per-step"
    model: str | None
    dtype: str | None
    config: Any = None  # a models.config.ModelConfig
    fixed: int | None = None
    weights: str | None = None  # the weight format of a model (profiler.traffic.WEIGHT_FORMATS), else None
    # where dtype and weights came from: "--dtype" / "config" (the user's), or "default" (bfloat16, bf16), which
    # a trace's own record of its run replaces (bandwidth_section)
    dtype_source: str | None = None
    weights_source: str | None = None

    def at(self, context: int | None) -> tuple[int, str]:
        """(bytes, what they include) of a step reading ``context`` KV positions (None: unknown).

        A model's step moves its weights (:func:`~.profiler.traffic.step_traffic`'s ``weight_bytes``) plus, at a
        known context, the KV cache read and the new position written (``total_bytes``).

        Raises:
            BubblescopeError: a context beyond the model's ``max_position_embeddings``.
        """
        if self.config is None:
            return int(self.fixed), "given"
        from .profiler.traffic import step_traffic

        traffic = step_traffic(self.config, DTYPE_BYTES[self.dtype], context or 0, weights=self.weights or "bf16")
        if context is None:
            return traffic["weight_bytes"], "weights"
        return traffic["total_bytes"], "weights+kv"


def resolve_step_bytes(model: str | None = None, bytes_per_step: int | None = None,
                       dtype: str | None = None) -> StepBytes | None:
    """The :class:`StepBytes` of the CLI's ``--model``/``--bytes-per-step``/``--dtype``, or None when neither
    is given. A model is a preset name, a Hugging Face checkpoint directory or a ``config.json`` (its config
    only: no weights are read); ``dtype`` (default bfloat16) is the weights' and KV cache's. A config with a
    ``quantization_config`` is an FP8 checkpoint (compressed-tensors, per channel: :mod:`.models.quant_config`):
    its projections count 1 byte per weight plus a float32 scale per output row (the LM head too unless ignored),
    as ``diagnose model --weights fp8`` counts them; any other quantization is refused, its bytes unknown here.

    Raises:
        BubblescopeError: both or an empty ``model``, an unknown preset, a config that cannot be read or is not
            supported (a quantization other than FP8 per channel), ``bytes_per_step`` ≤ 0, ``dtype`` without a
            model, empty or unknown. Each message names the option.
    """
    from pathlib import Path

    if model is not None and bytes_per_step is not None:
        raise BubblescopeError("--model and --bytes-per-step: give one of them, not both")
    if dtype is not None and model is None:
        raise BubblescopeError("--dtype: sets the model's bytes per weight; give --model too (--bytes-per-step is "
                               "already in bytes)")
    if bytes_per_step is not None:
        if isinstance(bytes_per_step, bool) or not isinstance(bytes_per_step, int) or bytes_per_step <= 0:
            raise BubblescopeError(f"--bytes-per-step: must be a whole number of bytes > 0, got {bytes_per_step!r}")
        return StepBytes("bytes-per-step", None, None, fixed=bytes_per_step)
    if model is None:
        return None
    if not model.strip():
        raise BubblescopeError("--model: empty; give a preset name, a model directory or a config.json")
    if dtype is not None and not dtype.strip():
        raise BubblescopeError(f"--dtype: empty; leave it out for the default ({DEFAULT_DTYPE})")
    name = _DTYPE_ALIASES.get((dtype or DEFAULT_DTYPE).lower(), (dtype or DEFAULT_DTYPE).lower())
    if name not in DTYPE_BYTES:
        raise BubblescopeError(f"--dtype: unknown dtype {dtype!r}; use {', '.join(DTYPE_BYTES)}")
    from .models.config import PRESETS, ModelConfig

    weights, weights_source = "bf16", "default"
    try:
        if model.lower() in PRESETS:
            cfg = PRESETS[model.lower()]
        elif Path(model).is_dir() or model.endswith(".json"):
            cfg = ModelConfig.from_hf_config(model)
            weights = _checkpoint_weights(Path(model) / "config.json" if Path(model).is_dir() else Path(model))
            weights_source = "config"
        elif Path(model).exists():
            raise BubblescopeError(f"{model}: not a model directory or config.json (a llama2.c .bin holds no "
                                   "config to read: give --bytes-per-step)")
        else:
            raise BubblescopeError(f"unknown model {model!r}: not a preset ({', '.join(PRESETS)}), a model "
                                   "directory or a config.json")
    except BubblescopeError as e:
        raise BubblescopeError(f"--model: {e}") from None
    return StepBytes("model", cfg.name, name, config=cfg, weights=weights,
                     dtype_source="default" if dtype is None else "--dtype", weights_source=weights_source)


def _checkpoint_weights(config_json) -> str:
    """The weight format of a ``config.json`` already read and checked by ``ModelConfig.from_hf_config``:
    ``bf16`` without a ``quantization_config``, else ``fp8`` or ``fp8-all``.

    Raises:
        BubblescopeError: a quantization other than compressed-tensors FP8 per channel (named).
    """
    import json

    from .models.quant_config import check_quantization_config, quantized_weights

    qc = json.loads(config_json.read_text()).get("quantization_config")
    if qc is None:
        return "bf16"
    check_quantization_config(qc, str(config_json))
    return quantized_weights(qc)


def check_peak(peak_gbps: float | None) -> float | None:
    """``--peak-gbps`` as a float, or None.

    Raises:
        BubblescopeError: not a finite number > 0 (GB/s).
    """
    if peak_gbps is None:
        return None
    if isinstance(peak_gbps, bool) or not isinstance(peak_gbps, (int, float)) or not 0 < peak_gbps < math.inf:
        raise BubblescopeError(f"--peak-gbps: must be a number of GB/s > 0, got {peak_gbps!r}")
    return float(peak_gbps)


def check_context(context: int | None, step_bytes: StepBytes | None) -> int | None:
    """``--context`` (KV positions the first step reads) as an int, or None.

    Raises:
        BubblescopeError: negative, beyond the model's ``max_position_embeddings`` (said before any trace is read
            or program run, not after), or given without ``--model`` (a fixed byte count has no KV cache to size).
    """
    if context is None:
        return None
    if step_bytes is None or step_bytes.config is None:
        raise BubblescopeError("--context: sizes the model's KV cache; give --model too")
    if isinstance(context, bool) or not isinstance(context, int) or context < 0:
        raise BubblescopeError(f"--context: must be a whole number of positions >= 0, got {context!r}")
    limit = step_bytes.config.max_position_embeddings
    if context > limit:
        raise BubblescopeError(f"--context {context}: beyond {step_bytes.model}'s max_position_embeddings {limit}")
    return context


def resolve_peak(entry: dict, peak_gbps: float | None = None, nvml: bool = True) -> dict:
    """The peak memory bandwidth of a trace file's GPU (``entry``: a file of the trace summary), in the order of
    the module doc: ``{"peak_GBps": float | None, "source": str | None, "device": str | None, "reason": str |
    None}`` (``reason``: why the peak is unknown). ``nvml=False`` leaves NVML out."""
    props = entry.get("device_properties") or {}
    name, memory = props.get("name"), props.get("total_memory_bytes")
    if peak_gbps is not None:
        return {"peak_GBps": peak_gbps, "source": "--peak-gbps", "device": name, "reason": None}
    if not entry.get("devices"):
        return {"peak_GBps": None, "source": None, "device": None,
                "reason": "no GPU activity in the trace (CPU-only run)"}
    from .profiler.gpus import lookup_peak

    known = lookup_peak(name, memory)
    if known["peak_GBps"] is not None:
        return {"peak_GBps": known["peak_GBps"], "source": f"datasheet ({known['source']})", "device": name,
                "reason": None}
    why = known["reason"]
    if nvml and name:
        local = _local_peak(entry.get("host_name"), name, memory)
        if local["peak_GBps"] is not None:
            return {**local, "device": name, "reason": None}
        why = f"{why}; {local['reason']}"
    return {"peak_GBps": None, "source": None, "device": name, "reason": why}


def _local_peak(host: str | None, name: str, memory: int | None) -> dict:
    """This machine's NVML peak of a GPU named ``name``, when the trace's ``host`` is this machine."""
    if not host:
        return {"peak_GBps": None, "source": None, "reason": "the trace has no host_name, so NVML of this "
                                                              "machine cannot stand for its GPU"}
    if host != socket.gethostname():
        return {"peak_GBps": None, "source": None, "reason": f"the trace was taken on {host}, not this machine"}
    from .profiler.hardware import local_gpus

    gpus, why = local_gpus()
    for gpu in gpus:
        same_memory = (memory is None or gpu["memory_bytes"] is None
                       or abs(gpu["memory_bytes"] - memory) <= 0.02 * memory)
        if gpu["name"] == name and same_memory and gpu["nvml_peak_GBps"]:
            return {"peak_GBps": gpu["nvml_peak_GBps"], "source": f"NVML of this machine's {name}", "reason": None}
    return {"peak_GBps": None, "source": None, "reason": why or f"NVML on this machine has no {name}"}


def bandwidth_section(entry: dict, step_bytes: StepBytes, context: int | None = None,
                      peak_gbps: float | None = None, nvml: bool = True) -> dict:
    """A trace file's ``bandwidth`` section: per step, bytes moved, effective GB/s, % of peak, the floor
    (bytes ÷ peak) and the distance from it (:mod:`.profiler.floor`).

    Step k (``step_rows``' ``step``, warm-up included, from 0) reads ``context + k`` positions, ``context``
    being ``--context`` or else the trace's own record (``first_context``); with neither, the bytes are the
    weights only (``kv`` says which: ``weights+kv``, ``weights`` or ``given``).

    Returns:
        ``{"model", "dtype", "weights" (``bf16``, ``fp8``, ``fp8-all``; None with a byte count), "dtype_source",
        "weights_source" (``--dtype`` / ``config``, ``trace`` (the trace's record of its run, over the defaults),
        ``default``; None with a byte count), "bytes_source"
        ("model" | "bytes-per-step"), "kv", "context_source" ("--context",
        "trace" or None), "first_context", "peak_GBps", "peak_source", "peak_reason", "device", "summary"
        (:func:`~.profiler.floor.floor_summary`), "rows" (:func:`~.profiler.floor.floor_rows`), "verdict",
        "reason"}``; ``reason`` (and no rows) when the file has no step times.

    Raises:
        BubblescopeError: a step's context beyond the model's positions (named ``--context``).
    """
    from .profiler.floor import floor_rows, floor_summary, floor_verdict

    if step_bytes.config is not None:  # the trace's record of its run's dtype and weights over the defaults
        recorded = {k: entry.get(k) for k in ("dtype", "weights")
                    if entry.get(k) is not None and getattr(step_bytes, f"{k}_source") == "default"}
        if recorded:
            step_bytes = replace(step_bytes, **recorded, **{f"{k}_source": "trace" for k in recorded})
    first, source = (context, "--context") if context is not None else (entry.get("first_context"), "trace")
    if first is None or step_bytes.config is None:
        first, source = None, None
    peak = resolve_peak(entry, peak_gbps, nvml)
    out = {"model": step_bytes.model, "dtype": step_bytes.dtype, "weights": step_bytes.weights,
           "dtype_source": step_bytes.dtype_source, "weights_source": step_bytes.weights_source,
           "bytes_source": step_bytes.source, "kv": None,
           "context_source": source, "first_context": first, "peak_GBps": peak["peak_GBps"],
           "peak_source": peak["source"], "peak_reason": peak["reason"], "device": peak["device"],
           "summary": None, "rows": [], "verdict": None, "reason": None}
    rows = [r for r in entry.get("step_rows") or [] if r.get("wall_us") is not None]
    if not rows:
        out["reason"] = "no decode steps with a time in this trace"
        return out
    contexts = [None if first is None else first + int(r["step"]) for r in rows]
    try:
        sized = [step_bytes.at(c) for c in contexts]
    except BubblescopeError as e:
        raise BubblescopeError(f"--context {first}: {e}" if source == "--context" else
                               f"{entry.get('path')}: the trace's context {first}: {e}") from None
    out["kv"] = sized[0][1]
    out["rows"] = floor_rows(rows, [b for b, _ in sized], peak["peak_GBps"], contexts)
    out["summary"] = floor_summary(out["rows"], peak["peak_GBps"])
    out["verdict"] = floor_verdict(out["summary"], peak["peak_GBps"], peak["reason"])
    return out


def add_bandwidth(summary: dict, step_bytes: StepBytes | None, context: int | None = None,
                  peak_gbps: float | None = None, nvml: bool = True) -> dict:
    """``summary`` (``bubblescope.trace/1``) with a ``bandwidth`` section in each readable file entry
    (:func:`bandwidth_section`), in place; returned for chaining. Without ``step_bytes`` nothing is added.

    Raises:
        BubblescopeError: as :func:`bandwidth_section`.
    """
    for f in summary.get("files") or []:
        if "error" not in f and step_bytes is not None:
            f["bandwidth"] = bandwidth_section(f, step_bytes, context, peak_gbps, nvml)
    return summary


def diagnose_trace_files(paths: Iterable[str | os.PathLike], *, step_marker: str | None = None,
                         threshold_us: float = 5.0, skip_steps: int | None = None, ranks: bool = False,
                         model: str | None = None, bytes_per_step: int | None = None, dtype: str | None = None,
                         context: int | None = None, peak_gbps: float | None = None, progress=None) -> dict:
    """Diagnose trace files: the ``bubblescope.trace/1`` summary of
    :func:`~.profiler.trace.ranksummary.summarize_rank_traces` (a bad file becomes an ``{"path", "error"}`` entry),
    each readable file's ``bandwidth`` (:func:`add_bandwidth`, when ``model`` or ``bytes_per_step`` is given)
    and ``findings`` (:func:`~.reports.trace_findings.find_trace`). What ``diagnose trace`` and ``profile``
    report.

    Args:
        paths: trace files (``.json`` / ``.json.gz``) or directories of them.
        step_marker: the steps' ``record_function`` name (None: ours, then ``ProfilerStep``, then found
            without markers).
        threshold_us: kernel-wait gap threshold, µs. skip_steps: warm-up steps left out of the step figures
            (None: as many as the trace records, bubblescope's own traces, else none).
        ranks: the files are one trace per rank (in rank order).
        model, bytes_per_step, dtype: what a step moves (:func:`resolve_step_bytes`).
        context: KV positions the first step reads (:func:`check_context`). peak_gbps: the peak, GB/s.
        progress: ``progress(path)`` → a ``(done, total)`` bytes callback or None, as the summary takes it.

    Raises:
        BubblescopeError: a bad option (checked before any trace is read), path or context.
    """
    from .profiler.trace.ranksummary import summarize_rank_traces
    from .reports.trace_findings import find_trace

    step_bytes = resolve_step_bytes(model, bytes_per_step, dtype)
    context = check_context(context, step_bytes)
    peak_gbps = check_peak(peak_gbps)
    if peak_gbps is not None and step_bytes is None:
        raise BubblescopeError("--peak-gbps: the peak is compared with each step's bytes; give --model or "
                               "--bytes-per-step too")
    summary = summarize_rank_traces([os.fspath(p) for p in paths], step_marker=step_marker,
                                    threshold_us=threshold_us, skip_steps=skip_steps, force=ranks,
                                    keep_going=True, progress=progress)
    add_bandwidth(summary, step_bytes, context, peak_gbps)
    summary["findings"] = find_trace(summary)
    return summary


def write_trace_outputs(summary: dict, findings: list[dict], json_path: str | os.PathLike | None = None,
                        html_path: str | os.PathLike | None = None, command: str = "",
                        notes: list[str] | None = None) -> list[str]:
    """Write ``diagnose trace``'s ``--json`` result (:func:`~.reports.trace_result.trace_result`) and ``--html``
    report (:func:`~.reports.trace_html.render_trace_html`) together: both are rendered and staged first and
    renamed into place only when both are written (:func:`~.reports.results.atomic_write_texts`), so a file that
    cannot be written (a full disk) leaves the other one as the previous run left it too.

    Returns:
        The paths written, ``--json``'s first.

    Raises:
        BubblescopeError: a destination that cannot be written, named by its option (nothing is replaced then).
    """
    from .reports.results import atomic_write_texts

    files = []
    if json_path is not None:
        from .reports.trace_result import trace_result, trace_result_text
        files.append((json_path, trace_result_text(trace_result(summary, findings, command=command)), "--json"))
    if html_path is not None:
        from .reports.trace_html import render_trace_html
        files.append((html_path, render_trace_html(summary, findings, command, notes), "--html"))
    atomic_write_texts(files)
    return [os.fspath(path) for path, _, _ in files]
