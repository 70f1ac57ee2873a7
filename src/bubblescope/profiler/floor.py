"""Each decode step against the memory-bandwidth floor: bytes moved, effective GB/s, % of peak, floor, distance.

At batch size 1 a decode step must move its bytes (:mod:`.traffic`: the weights, plus the KV cache at the
step's context) between HBM and the SMs, so no step can be shorter than ``bytes / peak`` — the floor
(:func:`.traffic.floor_ms`; docs/design.md, ``effective_bandwidth``). Pure functions of the step times and bytes;
times in µs, rates in GB/s (10^9 bytes per second), utilisations as fractions.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import BubblescopeError
from .trace.values import json_float
from ..reports.tables import fmt, gbps_text
from ..reports.tables import us as us_text

ROW_KEYS = ("step", "warmup", "context", "bytes", "wall_us", "effective_GBps", "util_peak", "floor_us",
            "over_floor_us", "over_floor_x")


def _check(bytes_per_step: Sequence[int], peak_GBps: float | None) -> None:
    for b in bytes_per_step:
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not b > 0:
            raise BubblescopeError(f"floor: bytes per step must be > 0, got {b!r}")
    if peak_GBps is not None and (isinstance(peak_GBps, bool) or not isinstance(peak_GBps, (int, float))
                                  or not 0 < peak_GBps < float("inf")):
        raise BubblescopeError(f"floor: peak bandwidth must be a positive number of GB/s, got {peak_GBps!r}")


def _figures(nbytes: float, wall_us: float | None, peak_GBps: float | None) -> dict:
    """effective_GBps = bytes / wall_us / 10^3; util_peak = effective / peak; floor_us = bytes / peak / 10^3;
    over_floor_us = wall − floor; over_floor_x = wall / floor. None where an input is None (or wall ≤ 0)."""
    wall = wall_us if wall_us is not None and wall_us > 0 else None
    eff = nbytes / wall / 1e3 if wall is not None else None
    floor = nbytes / peak_GBps / 1e3 if peak_GBps is not None else None
    return {"effective_GBps": json_float(eff),
            "util_peak": json_float(eff / peak_GBps) if eff is not None and peak_GBps is not None else None,
            "floor_us": json_float(floor),
            "over_floor_us": json_float(wall - floor) if wall is not None and floor is not None else None,
            "over_floor_x": json_float(wall / floor) if wall is not None and floor else None}


def floor_rows(step_rows: list[dict], bytes_per_step: Sequence[int], peak_GBps: float | None,
               contexts: Sequence[int | None] | None = None) -> list[dict]:
    """One row per step (:data:`ROW_KEYS`): the step's bytes and time against the floor.

    Args:
        step_rows: ``{"step", "warmup", "wall_us"}`` per step (``diagnose trace``'s ``step_rows``; µs).
        bytes_per_step: bytes each step moves, aligned with ``step_rows`` (each > 0).
        peak_GBps: the device's peak memory bandwidth, GB/s; None: unknown (then no util, no floor).
        contexts: the KV positions each step reads, for the rows (None: not known).

    Raises:
        BubblescopeError: lengths that differ, a byte count ≤ 0, or a peak that is not a positive number.
    """
    if len(bytes_per_step) != len(step_rows) or (contexts is not None and len(contexts) != len(step_rows)):
        raise BubblescopeError("floor: one byte count (and context) per step row is needed")
    _check(bytes_per_step, peak_GBps)
    out = []
    for i, (row, nbytes) in enumerate(zip(step_rows, bytes_per_step)):
        out.append({"step": row.get("step"), "warmup": bool(row.get("warmup")),
                    "context": contexts[i] if contexts is not None else None, "bytes": int(nbytes),
                    "wall_us": row.get("wall_us"), **_figures(nbytes, row.get("wall_us"), peak_GBps)})
    return out


def floor_summary(rows: list[dict], peak_GBps: float | None) -> dict:
    """The median measured step (warm-up rows left out) against the floor, as ``diagnose model`` states its
    bandwidth: the median bytes over the median step time.

    Returns ``{"steps": measured steps with a time, "step_us_p50": median wall µs, "bytes_per_step": median
    bytes, "effective_GBps", "util_peak", "floor_us", "over_floor_us", "over_floor_x", "best_util_peak": the
    highest per-step utilisation}``; the figures None when no step has a time (or the peak is unknown).
    """
    import numpy as np

    timed = [r for r in rows if not r["warmup"] and r["wall_us"] is not None and r["wall_us"] > 0]
    if not timed:
        return {"steps": 0, "step_us_p50": None, "bytes_per_step": None, **_figures(1, None, None),
                "best_util_peak": None}
    wall = float(np.median([r["wall_us"] for r in timed]))
    nbytes = float(np.median([r["bytes"] for r in timed]))
    utils = [r["util_peak"] for r in timed if r["util_peak"] is not None]
    return {"steps": len(timed), "step_us_p50": json_float(wall), "bytes_per_step": int(round(nbytes)),
            **_figures(nbytes, wall, peak_GBps), "best_util_peak": json_float(max(utils)) if utils else None}


def floor_verdict(summary: dict, peak_GBps: float | None, peak_reason: str | None = None) -> str | None:
    """One line, the distance from the floor first: "0.912 ms per step, 1.78× the floor of 0.512 ms (0.400 ms
    above it): 56 % of the 4,814 GB/s peak, 2,715 GB/s effective"; with the peak unknown, the effective rate and
    why there is no floor. None when no step has a time."""
    wall, eff = summary.get("step_us_p50"), summary.get("effective_GBps")
    if wall is None or eff is None:
        return None
    if peak_GBps is None:
        why = f" ({peak_reason})" if peak_reason else ""
        return (f"{_ms(wall)} per step, {gbps_text(eff)} GB/s effective ({fmt(summary['bytes_per_step'], 'bytes')} "
                f"per step); peak bandwidth unknown{why}: no floor or % of peak (give --peak-gbps)")
    return (f"{_ms(wall)} per step, {summary['over_floor_x']:.2f}× the floor of {_ms(summary['floor_us'])} "
            f"({_ms(summary['over_floor_us'])} above it): {summary['util_peak']:.0%} of the {peak_GBps:,.0f} GB/s "
            f"peak, {gbps_text(eff)} GB/s effective")


def _ms(us: float) -> str:
    """ms with 3 decimals from 100 µs up; below, as the tables print µs (a tiny model's floor of 0.1 µs is not
    "0.000 ms")."""
    return f"{us / 1e3:,.3f} ms" if abs(us) >= 100 else us_text(us)
