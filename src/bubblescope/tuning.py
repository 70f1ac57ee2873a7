"""One-knob tuning curves: change one parameter of an engine, measure each value at a few contexts.

"Change one parameter at a time, record its metrics, and build a parameter→performance curve; otherwise
nothing can be attributed." :func:`tune` builds the engine once per value of the knob (everything else at
its default, or at ``base``), and per context records p50/p99 ms/token (host wall time, token on the host),
the effective bandwidth and its share of the NVML peak (GPU), the intra-kernel wait ratio (from the
kernel's own timestamps, when the timeline variant fits), the greedy tokens' agreement with the reference
engine, and the compiled kernel's registers, spills, shared memory and residency. A value that does not
parse, validate, compile or fit the SM, or that gets stuck, becomes a row with the reason; it never stops
the sweep. The document is versioned (:data:`SCHEMA`); ``reports/tune_result.py`` turns it into per-length choices.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import statistics
from pathlib import Path

import numpy as np
import torch

from .errors import BubblescopeError, EngineUnavailable, KernelStuck
from .wording import count

SCHEMA = "bubblescope.tune/1"
# Engines whose construction takes a parameter object, and which fields are tuning knobs. The Triton
# megakernel's variants share MegakernelParams; a future kernel registers its own class here.
TUNABLE = {"megakernel": "fused", "megakernel-gluon": "fused", "megakernel-triton": "fused",
           "megakernel-stages": "stages", "megakernel-noprefetch": "noprefetch"}
# Fields that are switches for tests or diagnostics, not performance knobs.
NOT_KNOBS = {"num_programs", "timeline", "spin_cap", "cooperative"}
# What the seed calls the knob families: tile size, pipeline depth, thread organisation, prefetch.
FAMILY = {"rows_qkv": "tile rows", "rows_o": "tile rows", "rows_gateup": "tile rows", "rows_down": "tile rows",
          "rows_lm": "tile rows", "max_rows": "tile rows", "gateup_blocks": "tile rows", "lm_blocks": "tile rows",
          "block_k": "tile columns", "block_s": "tile columns", "num_stages": "pipeline depth",
          "programs_per_sm": "residency", "num_warps": "threads", "max_registers": "registers",
          "kv_splits": "attention split", "attn_kv_heads": "attention split", "attn_min_chunk": "attention split",
          "attn_reduce": "attention split", "prefetch": "prefetch", "prefetch_ahead": "prefetch",
          "prefetch_next": "prefetch", "weight_eviction": "cache policy", "spin_sleep_ns": "waiting",
          "fast_launch": "launch", "split_k": "tile rows", "l2_ahead": "prefetch",
          "wait_prefetch": "prefetch", "wait_prefetch_ops": "prefetch", "wait_prefetch_mode": "prefetch",
          "inflight": "pipeline depth", "norm_load": "prefetch",
          # Gluon kernel only (MegakernelParams says what each does and what it measured)
          "slot_boxes": "pipeline depth", "mv_widen": "matvec", "mv_ahead": "matvec",
          "sig_gate": "weight-stream gate", "attn_gate": "weight-stream gate", "lm_pick": "greedy pick",
          "attn_layout": "attention layout", "attn_operands": "attention layout", "attn_new_row": "attention layout",
          "qk_norm_in_attn": "attention layout", "attn_combine": "attention split"}


def _params_class(engine: str):
    if engine not in TUNABLE:
        raise BubblescopeError(f"--engine: {engine!r} has no tuning knobs; tunable engines: {', '.join(TUNABLE)}")
    from .megakernel_engine import MegakernelParams
    return MegakernelParams


def implementations() -> dict[str, list[str]]:
    """Parameter class name -> the tunable engines that take it (engines sharing one class share knobs)."""
    groups: dict[str, list[str]] = {}
    for engine in TUNABLE:
        groups.setdefault(_params_class(engine).__name__, []).append(engine)
    return groups


def base_params(engine: str, device_type: str = "cuda"):
    """The parameters ``tune`` holds fixed on a ``device_type`` ("cuda" or "cpu") unless told otherwise: the class
    defaults on a GPU, the interpreter's ``CPU_PARAMS`` on a CPU (small tiles keep it to seconds).

    Raises:
        BubblescopeError: ``engine`` has no parameters to tune.
    """
    cls = _params_class(engine)
    from .megakernel_engine import CPU_PARAMS
    return cls() if device_type == "cuda" else CPU_PARAMS


def knobs(engine: str = "megakernel", device_type: str = "cuda") -> list[dict]:
    """The knobs of ``engine``: ``[{"name", "type", "default", "family"}]`` from its parameter dataclass
    (``type`` as annotated, e.g. ``"int | None"``; a None default means "chosen automatically"); ``default`` is the
    value :func:`tune` holds on a ``device_type`` device (:func:`base_params`).

    Raises:
        BubblescopeError: ``engine`` has no parameters to tune.
    """
    cls = _params_class(engine)
    base = base_params(engine, device_type)
    return [{"name": f.name, "type": str(f.type), "default": getattr(base, f.name), "family": FAMILY.get(f.name, "other")}
            for f in dataclasses.fields(cls) if f.name not in NOT_KNOBS]


def parse_value(knob: dict, text: str):
    """``text`` as a value of ``knob`` (from :func:`knobs`): ``auto``/``none`` -> None where allowed,
    ``true``/``false``/``on``/``off`` for bools, else int or str by the annotation.

    Raises:
        ValueError: the text is not a value of that type (the tuner makes it a row with this reason).
    """
    t, s = knob["type"], text.strip()
    if s.lower() in ("auto", "none") and "None" in t:
        return None
    if t.startswith("bool"):
        if s.lower() in ("1", "true", "on", "yes"):
            return True
        if s.lower() in ("0", "false", "off", "no"):
            return False
        raise ValueError(f"{knob['name']} takes true/false, got {s!r}")
    if t.startswith("int"):
        try:
            return int(s, 0)
        except ValueError:
            raise ValueError(f"{knob['name']} takes an integer, got {s!r}") from None
    return s


def unique_values(knob: dict, values: list[str]) -> tuple[list[str], list[str]]:
    """(``values`` with repeats left out, the first of each kept in order; one note per repeated value).

    Values repeat when they parse to the same value (:func:`parse_value`: ``3`` and ``0x3``, ``on`` and
    ``true``), or, where they do not parse, when their text is the same: measuring one value twice would only
    make two rows of the same thing and let noise pick a "best" between them.
    """
    groups: dict[tuple, list[str]] = {}
    for text in values:
        try:
            key = ("value", parse_value(knob, text))
        except ValueError:
            key = ("text", text.strip())
        groups.setdefault(key, []).append(text)
    notes = []
    for texts in groups.values():
        if len(texts) > 1:
            same = len(set(texts)) == 1
            twice = "twice" if len(texts) == 2 else f"{len(texts)} times"
            notes.append(f"--values: {texts[0]} given {twice}: measured once" if same else
                         f"--values: {', '.join(texts[:-1])} and {texts[-1]} are one value of {knob['name']}: "
                         f"measured once, as {texts[0]}")
    return [texts[0] for texts in groups.values()], notes


def _knob(engine: str, name: str) -> dict:
    table = {k["name"]: k for k in knobs(engine)}
    if name not in table:
        raise BubblescopeError(f"--knob: {engine} has no knob {name!r}; see `bubblescope tune --list` "
                               f"({', '.join(table)})")
    return table[name]


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:400]


def _pct(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


def tune(model: str, knob: str, values: list[str], contexts: list[int] | None = None, engine: str = "megakernel",
         checkpoint: str | None = None, device: str | None = None, dtype: str | None = None,
         steps: int | None = None, base: dict | None = None, seed: int = 0, command: str | None = None,
         on_row=None, out: str | Path | None = None, prefill: str | None = None) -> dict:
    """Measure ``engine`` on ``model`` once per value of ``knob``; returns the ``bubblescope.tune/1`` document.

    Args:
        values: the values as typed (strings), parsed by :func:`parse_value`.
        contexts: KV-cache lengths (positions) to measure at; each is a random prompt of that length, then
            ``steps`` greedy decode steps (default 64 on a GPU, 3 on a CPU, where the megakernel runs under
            Triton's interpreter). Default contexts: 128 and 4096 on a GPU, 8 and 16 on a CPU.
        out: a directory the results will be written to, checked before minutes of measuring.
        base: other parameter fields to hold fixed (default: the engine's defaults for the device).
        on_row: called with each finished row (progress).
        prefill: the engine's prefill of each context's prompt, ``batched`` (None: the default) or ``stepwise``
            (one decode launch per prompt token); recorded as ``prefill``. Decode steps are timed either way.

    Returns:
        ``{"schema", "created", "command", "engine", "knob", "family", "values", "contexts", "steps",
        "device": {type, name, nvml_peak_GBps}, "model": {name, source, dtype}, "base_params", "prefill", "rows",
        "notes", "best"}``; ``values`` without repeats and ``notes`` saying which were left out
        (:func:`unique_values`); a row is ``{"value", "text", "status": ok|invalid|failed, "reason", "compile",
        "points": [{context, token_ms_p50, token_ms_p99, token_ms_mean, token_ms_samples (every timed step, ms),
        effective_GBps, util_peak, intrakernel_wait_ratio, timeline_reason, token_agreement}]}``; ``best`` lists per
        context the ok value with the lowest p50, its lead over the next and the noise of its samples
        (``reports.tune_result.best_per_context``).

    Raises:
        BubblescopeError: unknown engine, knob, model, dtype, device or prefill mode; an engine the device rules
            out (before the model loads); no values; a context below 1 or beyond the model's positions.
    """
    from .engines import build_engine, check_prefill, prepare_triton, unavailable_before_load
    from .generation import random_ids
    from .models import load_model, resolve_device, run_dtype
    from .profiler.hardware import device_info
    from .reports.tune_result import best_per_context

    spec = _knob(engine, knob)
    check_prefill(prefill, engine)
    if not values:
        raise BubblescopeError("--values: no values given")
    values, notes = unique_values(spec, values)
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        raise BubblescopeError(f"--out {out}: exists and is not a directory")
    for target in ([Path(out) / "tune.json", Path(out) / "tune.html"] if out is not None else []):
        if target.exists() and not target.is_file():  # found now, not after the measurements
            raise BubblescopeError(f"--out {out}: {target} exists and is not a regular file")
    dev = resolve_device(device)
    prepare_triton(dev)
    if why := unavailable_before_load(engine, dev):  # said before the model loads, as diagnose and generate do
        raise BubblescopeError(f"--engine {engine}: {why}")
    on_gpu = dev.type == "cuda"
    if contexts is not None and not contexts:  # "--contexts ," is not the same as leaving the option out
        raise BubblescopeError("--contexts: no context lengths given")
    contexts = contexts or ([128, 4096] if on_gpu else [8, 16])
    if any(c < 1 for c in contexts):
        raise BubblescopeError(f"--contexts: need positive context lengths, got {contexts}")
    steps = steps if steps is not None else (64 if on_gpu else 3)
    if steps < 1:
        raise BubblescopeError(f"--steps: must be at least 1, got {steps}")
    tdtype = run_dtype(dtype, dev)
    loaded = load_model(model, checkpoint=checkpoint, device=dev, dtype=tdtype, seed=seed)
    cfg = loaded.config
    max_seq = max(contexts) + steps + 2
    if max_seq > cfg.max_position_embeddings:
        raise BubblescopeError(f"--contexts: {max(contexts)} + {count(steps, 'step')} exceed {cfg.name}'s "
                               f"max_position_embeddings {cfg.max_position_embeddings}")
    fixed = base_params(engine, dev.type).replace(**(base or {}))
    info = device_info(dev if on_gpu else "cpu")
    peak = info.get("nvml_peak_GBps") if on_gpu else None
    gen = torch.Generator().manual_seed(seed)
    prompts = {c: random_ids(cfg.vocab_size, c, gen) for c in sorted(set(contexts))}
    reference = _reference_checker(loaded.weights, max_seq)
    rows = []
    for text in values:
        build = functools.partial(build_engine, prefill=prefill) if prefill else build_engine
        row = _row(text, spec, engine, fixed, loaded, max_seq, prompts, steps, peak, reference, build)
        rows.append(row)
        if on_row:
            on_row(row)
    doc = {"schema": SCHEMA, "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "command": command or "bubblescope.tuning.tune(...)", "engine": engine, "knob": knob,
           "family": spec["family"], "values": list(values), "contexts": sorted(set(contexts)), "steps": steps,
           "device": {"type": dev.type, "name": info.get("name"), "nvml_peak_GBps": peak},
           "model": {"name": cfg.name, "source": loaded.source, "dtype": str(tdtype).replace("torch.", ""),
                     "config_sha256": cfg.config_sha256()},
           "base_params": {k: v for k, v in dataclasses.asdict(fixed).items() if k != knob},
           "prefill": prefill or "batched",
           "rows": rows, "notes": notes}
    doc["best"] = best_per_context(doc)
    return doc


def _reference_checker(weights, max_seq: int):
    """A function (prompt, tokens) -> fraction of greedy tokens the reference engine agrees with, teacher-
    forced on the tuned engine's own tokens (no extra step of the tuned engine)."""
    from .engines import build_engine
    from .generation import teacher_forced_logits
    ref = build_engine("reference", weights, max_seq)

    def agreement(prompt: list[int], tokens: list[int]) -> float:
        picks = teacher_forced_logits(ref, prompt, tokens[:-1]).argmax(-1).tolist()
        return sum(a == b for a, b in zip(picks, tokens)) / len(tokens)
    return agreement


def _row(text, spec, engine, base_params, loaded, max_seq, prompts, steps, peak, reference, build_engine) -> dict:
    row = {"value": None, "text": text, "status": "ok", "reason": None, "compile": None, "points": []}
    try:
        row["value"] = value = parse_value(spec, text)
        params = base_params.replace(**{spec["name"]: value})
        params.validate()
    except (ValueError, TypeError, BubblescopeError) as e:
        row.update(status="invalid", reason=str(e))
        return row
    try:
        eng = build_engine(engine, loaded.weights, max_seq, params=params)
    except Exception as e:  # noqa: BLE001  (a compile error, out of resources, no residency: a row, not a crash)
        row.update(status="failed", reason=f"does not build: {_one_line(e)}")
        return row
    info = eng.compile_info()
    row["compile"] = {k: info.get(k) for k in ("registers", "spills", "shared_bytes", "num_warps", "programs_per_sm",
                                               "requested_programs_per_sm", "grid", "tasks_per_step")}
    try:
        for c, prompt in prompts.items():
            row["points"].append(_point(eng, loaded, c, prompt, steps, peak, reference))
    except (KernelStuck, RuntimeError) as e:
        row.update(status="failed", reason=f"fails at run time: {_one_line(e)}")
    finally:
        del eng
        if loaded.weights.device.type == "cuda":  # the next value packs another copy of the weights
            import gc
            gc.collect()
            torch.cuda.empty_cache()
    return row


def _point(eng, loaded, context: int, prompt: list[int], steps: int, peak, reference) -> dict:
    from .generation import generate, greedy_step
    from .megakernel_engine.timeline import intrakernel_summary
    from .profiler.traffic import bandwidth, step_traffic

    res = generate(eng, prompt, steps + 1, eos_ids=())
    p50, p99 = _pct(res.token_ms, 50), _pct(res.token_ms, 99)
    traffic = step_traffic(loaded.config, loaded.weights.dtype.itemsize, context + steps // 2)
    bw = bandwidth(traffic["total_bytes"], p50, peak) if loaded.weights.device.type == "cuda" else {}
    wait, why = None, None
    if hasattr(eng, "timeline"):
        with eng.timeline() as rec:
            greedy_step(eng, res.tokens[-1])
        if rec.frame is not None:
            wait = intrakernel_summary(rec.frame, max_programs=1)["wait_ratio"]
        why = rec.reason
    return {"context": context, "token_ms_p50": p50, "token_ms_p99": p99,
            "token_ms_mean": statistics.fmean(res.token_ms) if res.token_ms else None,
            "token_ms_samples": [float(x) for x in res.token_ms],
            "effective_GBps": bw.get("effective_GBps"), "util_peak": bw.get("util_peak"),
            "intrakernel_wait_ratio": wait, "timeline_reason": why,
            "token_agreement": reference(prompt, res.tokens)}
