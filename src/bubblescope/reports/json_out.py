"""JSON text of a trace summary, with time values at a fixed precision.

The figures are sums and differences of float32/float64 microsecond timestamps, so they carry binary rounding
leftovers (``103.17399999999996``, ``12.300000000000001``) that mean nothing: Kineto records ``ts``/``dur`` in
µs with at most 3 decimals (ns resolution). Only the JSON text is rounded; the summary the other reports and
the metrics use keeps its values.
"""

from __future__ import annotations

import json
import math

TIME_DECIMALS = 3  # µs -> ns, the resolution of a Kineto timestamp
TIME_SUFFIXES = ("_us",)


def round_times(value, decimals: int = TIME_DECIMALS, _in_time: bool = False):
    """A copy of ``value`` (JSON-like: dicts, lists, scalars) whose time floats are rounded to ``decimals``.

    A float is a time when its key ends with ``_us``, or when it sits anywhere below such a key (the
    ``launch_delay_us`` statistics ``{"p50": ..., "max": ...}``). Non-finite floats, ints, bools, strings and
    the other floats (shares, ratios) are returned unchanged.
    """
    if isinstance(value, dict):
        return {k: round_times(v, decimals, _in_time or (isinstance(k, str) and k.endswith(TIME_SUFFIXES)))
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [round_times(v, decimals, _in_time) for v in value]
    if _in_time and isinstance(value, float) and math.isfinite(value):
        return round(value, decimals)
    return value


def summary_json(summary: dict) -> str:
    """The JSON text (indented, newline-terminated) ``diagnose trace --format json`` prints for ``summary``.

    Raises:
        ValueError: ``summary`` holds NaN or infinity (strict JSON has neither).
    """
    return json.dumps(round_times(summary), indent=2, allow_nan=False) + "\n"
