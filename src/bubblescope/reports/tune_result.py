"""What a tune document (``bubblescope.tune/1``) says: the best value per measured context, and the tuned file
(``bubblescope.tuned/1``) made of those choices.

Pure functions of the document :func:`bubblescope.tuning.tune` writes: :func:`best_per_context` is its ``best``
section (what the tune page reports), :func:`tuned_document` the file ``tune --save`` writes and
:func:`bubblescope.tuned.load_tuning` reads back. A range ends at the geometric mean of its context and the next
measured one (contexts are usually powers of two apart: 128 then 4096 splits at 724); the last range is open.
"""

from __future__ import annotations

import datetime as _dt
import math

from ..errors import BubblescopeError

SCHEMA = "bubblescope.tuned/1"


def spread_ms(samples) -> float | None:
    """The noise of one measured value: the interquartile range (p75 − p25, numpy's linear interpolation) of its
    repeated per-token samples, ms; None with fewer than 2 samples (nothing to say how much it varies)."""
    import numpy as np

    xs = [x for x in samples or [] if x is not None]
    if len(xs) < 2:
        return None
    p25, p75 = np.percentile(xs, [25, 75])
    return float(p75 - p25)


def best_per_context(doc: dict) -> list[dict]:
    """Per context of a tune document: the ok row with the lowest p50 ms/token, as ``{"context", "value", "text",
    "token_ms_p50", "runner_up", "lead_ms", "noise_ms", "within_noise"}``; a context where no value ran ok is left
    out.

    ``runner_up`` is the next value's text (None when one value ran), ``lead_ms`` its p50 minus the lowest, and
    ``noise_ms`` the leader's :func:`spread_ms` (of its ``token_ms_samples``). ``within_noise`` is True when the lead
    does not exceed that noise (the two cannot be told apart: no value is best), False when it does, None when
    either is unknown (one value, or no samples recorded)."""
    best = []
    for c in doc["contexts"]:
        cands = sorted(((p["token_ms_p50"], i, row, p) for i, row in enumerate(doc["rows"]) if row["status"] == "ok"
                        for p in row["points"] if p["context"] == c and p["token_ms_p50"] is not None),
                       key=lambda t: (t[0], t[1]))
        if not cands:
            continue
        ms, _, row, point = cands[0]
        nxt = next((t for t in cands[1:] if t[2]["text"] != row["text"]), None)
        lead = nxt[0] - ms if nxt else None
        noise = spread_ms(point.get("token_ms_samples"))
        best.append({"context": c, "value": row["value"], "text": row["text"], "token_ms_p50": ms,
                     "runner_up": nxt[2]["text"] if nxt else None, "lead_ms": lead, "noise_ms": noise,
                     "within_noise": None if lead is None or noise is None else lead <= noise})
    return best


def tuned_document(doc: dict) -> dict:
    """The ``bubblescope.tuned/1`` document of a tune document: ``{"schema", "created", "engine", "knob",
    "model", "device", "source", "ranges": [{"max_context" (int, or None for the last), "context",
    "params": {knob: value}, "token_ms_p50"}]}``.

    Raises:
        BubblescopeError: no value ran ok at any context (nothing to save).
    """
    best = best_per_context(doc)
    if not best:
        raise BubblescopeError("--save: no value of the knob ran ok, so there is nothing to save")
    ranges = []
    for i, b in enumerate(best):
        nxt = best[i + 1]["context"] if i + 1 < len(best) else None
        ranges.append({"max_context": None if nxt is None else int(math.sqrt(b["context"] * nxt)),
                       "context": b["context"], "params": {doc["knob"]: b["value"]},
                       "token_ms_p50": b["token_ms_p50"]})
    return {"schema": SCHEMA, "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "engine": doc["engine"], "knob": doc["knob"], "model": doc["model"], "device": doc["device"],
            "source": doc.get("command"), "ranges": ranges}
