"""The quantization ablation: an FP8 run (``diagnose model --weights fp8``) per engine, against the bf16 model.

Speed comes from two documents, the FP8 run and a bf16 run of the same model, device and workload (``report
FP8.json --bf16 BF16.json``): ms per token and % of the NVML peak of each, and the speed-up, bf16 p50 / FP8 p50.
Accuracy comes from the FP8 run alone: each engine's teacher-forced logits against the reference engine over the
unquantized weights on the same tokens (``correctness.vs_unquantized``: top-1 agreement and the largest relative
logit error, ‖Δ‖₂ / ‖bf16‖₂). At batch size 1 the step's floor halves with the weight bytes; an op-by-op engine
gains less than 2× because its bubbles stay. Pure functions of the documents.
"""

from __future__ import annotations

from ..errors import BubblescopeError
from .gate import ARCHITECTURE
from .results import dig, ordered
from .tables import MISSING, fmt

# (header, key of a row, format)
COLUMNS = (
    ("Engine", "engine", "text"),
    ("bf16\nms/tok", "bf16_token_ms_p50", "ms"),
    ("FP8\nms/tok", "fp8_token_ms_p50", "ms"),
    ("speed-up\n×", "speedup_x", "ratio"),
    ("bf16\n% peak", "bf16_util_peak", "pct"),
    ("FP8\n% peak", "fp8_util_peak", "pct"),
    ("top-1 vs\nbf16", "top1_vs_bf16", "pct"),
    ("rel. logit\nerror", "rel_logit_err_vs_bf16", "sci"),
)
NOTE = ("speed-up: the bf16 run's p50 ms/token over the FP8 run's, same engine; % peak: effective bandwidth "
        "over the NVML peak, each run counting its own bytes (FP8: 1 byte per weight plus a float32 scale per "
        "row); top-1 and relative logit error: the engine's teacher-forced logits against the reference engine "
        "over the unquantized (bf16) weights on the same tokens, max over positions of ‖Δ‖₂ / ‖bf16‖₂")


def base_label(doc: dict) -> str:
    """The unquantized weights' type as the reports name it, from ``model.dtype``: ``bf16`` for a bfloat16 run (a
    GPU's), ``fp32`` for a float32 run (a CPU's), ``fp16``; the dtype itself otherwise, ``bf16`` when absent."""
    dtype = dig(doc, "model", "dtype")
    return {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}.get(dtype, dtype or "bf16")


def headers(doc: dict) -> list[str]:
    """:data:`COLUMNS`' headers, the unquantized run named by :func:`base_label`."""
    return [h.replace("bf16", base_label(doc)) for h, _, _ in COLUMNS]


def note(doc: dict) -> str:
    """:data:`NOTE`, the unquantized run named by :func:`base_label`."""
    return NOTE.replace("bf16", base_label(doc))


def is_fp8(doc: dict) -> bool:
    """Whether ``doc`` is a run with FP8 weights (``model.weights``)."""
    return dig(doc, "model", "weights") in ("fp8", "fp8-all")


def check_pair(doc: dict, bf16: dict) -> None:
    """Refuse a pair that is not an FP8 run and a bf16 run of the same model, dtype, device and workload.

    Raises:
        BubblescopeError: ``--bf16: ...``, naming what differs.
    """
    if not is_fp8(doc):
        raise BubblescopeError(f"--bf16: RESULTS.json is not an FP8 run (model.weights "
                               f"{dig(doc, 'model', 'weights')!r}; run diagnose model --weights fp8)")
    if dig(bf16, "model", "weights") not in (None, "bf16"):
        raise BubblescopeError(f"--bf16: the baseline is an FP8 run too (model.weights "
                               f"{dig(bf16, 'model', 'weights')!r})")
    keys = [("model", "name"), ("model", "dtype"), ("device", "name"), ("workload", "prompt_len"),
            ("workload", "gen_len")] + [("model", "config", k) for k in ARCHITECTURE]
    for path in keys:
        if dig(doc, *path) != dig(bf16, *path):
            raise BubblescopeError(f"--bf16: not the same run in bf16: {'.'.join(path)} {dig(doc, *path)!r} vs "
                                   f"{dig(bf16, *path)!r}")


def quantization_rows(doc: dict, bf16: dict | None = None) -> list[dict]:
    """One row per engine of the FP8 run ``doc`` that ran ok (ladder order): ``engine``, ``fp8_token_ms_p50``
    (ms), ``fp8_util_peak`` (fraction), ``bf16_token_ms_p50``, ``bf16_util_peak`` (the same engine's in ``bf16``,
    when it ran ok there; else None), ``speedup_x`` (bf16 / FP8 p50), ``top1_vs_bf16`` (fraction) and
    ``rel_logit_err_vs_bf16`` (``correctness.vs_unquantized``; None where not measured). [] when ``doc`` is not an
    FP8 run."""
    if not is_fp8(doc):
        return []
    base = {e.get("name"): e for e in (bf16 or {}).get("engines") or [] if e.get("status") == "ok"}
    rows = []
    for eng in ordered(doc.get("engines") or []):
        if eng.get("status") != "ok":
            continue
        other = base.get(eng.get("name"), {})
        fp8_ms, bf16_ms = dig(eng, "latency", "token_ms_p50"), dig(other, "latency", "token_ms_p50")
        rows.append({"engine": eng["name"], "fp8_token_ms_p50": fp8_ms,
                     "fp8_util_peak": dig(eng, "bandwidth", "util_peak"),
                     "bf16_token_ms_p50": bf16_ms, "bf16_util_peak": dig(other, "bandwidth", "util_peak"),
                     "speedup_x": bf16_ms / fp8_ms if bf16_ms and fp8_ms else None,
                     "top1_vs_bf16": dig(eng, "correctness", "vs_unquantized", "token_agreement"),
                     "rel_logit_err_vs_bf16": dig(eng, "correctness", "vs_unquantized", "rel_logit_err")})
    return rows


def paired_rows(doc: dict, bf16: dict) -> list[dict]:
    """:func:`quantization_rows` of an FP8 run and its bf16 run, the pair checked first (:func:`check_pair`).

    Raises:
        BubblescopeError: as :func:`check_pair`.
    """
    check_pair(doc, bf16)
    return quantization_rows(doc, bf16)


def quantization_table(doc: dict, bf16: dict | None = None):
    """:func:`quantization_rows` as a pandas DataFrame (columns with their units: ``fp8_token_ms_p50`` ms, ...)."""
    import pandas as pd

    return pd.DataFrame(quantization_rows(doc, bf16), columns=[key for _, key, _ in COLUMNS])


def formatted_rows(rows: list[dict]) -> list[list[str]]:
    """The rows as the reports show them (:data:`COLUMNS`' formats; "—" where not measured)."""
    return [[fmt(row[key], kind) for _, key, kind in COLUMNS] for row in rows]


def title(doc: dict) -> str:
    return (f"Quantization: {base_label(doc)} against {dig(doc, 'model', 'weights')} weights (FP8 e4m3, a float32 "
            "scale per output row), per engine")


def has_speed(rows: list[dict]) -> bool:
    """Whether any row has the bf16 run's timing (a ``--bf16`` document was given)."""
    return any(row["bf16_token_ms_p50"] is not None for row in rows)


def missing_note(rows: list[dict], doc: dict | None = None) -> str | None:
    """What the table lacks and how to get it, or None; the unquantized run named by :func:`base_label` of
    ``doc`` (``bf16`` without one)."""
    if rows and not has_speed(rows):
        label = base_label(doc or {})
        return (f"{label} columns {MISSING}: no {label} run given; run the same diagnose model with --weights bf16 "
                "(no quantization) and re-render with `bubblescope report FP8.json --bf16 BF16.json`")
    return None
