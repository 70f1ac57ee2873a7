"""Numbers as trace files write them, and as the JSON summaries write them back.

The Trace Event Format's writers give numbers as JSON numbers or as strings holding one; times are µs, often
with three decimals of ns (Kineto's absolute ``1733456789012345.678``). :func:`as_float`, :func:`as_int` and
:func:`exact_ns` read such values without raising; :func:`long_float` is the JSON decoders' float hook that
keeps a literal too long for float64 as text, so that :func:`exact_ns` can read it exactly.
:func:`parse_rank` reads ``distributedInfo.rank``; :func:`json_float` is the other way: a number as the
summaries store it (None for what was not measured, never NaN).
"""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation
from typing import Any

_LONG_NUMBER = 16  # characters: a number written this long may hold more digits than float64 keeps


def as_float(value: Any) -> float:
    """A JSON number, or a string holding one (the Trace Event Format's writers use both), as float;
    NaN for anything else (null, bools, text, ints beyond float)."""
    if type(value) is float:
        return value
    if type(value) is int:
        try:
            return float(value)
        except OverflowError:
            return math.nan
    if type(value) is str or type(value) is Decimal:
        try:
            return float(value)
        except (ValueError, OverflowError):
            return math.nan
    return math.nan


def long_float(text: str) -> float | str:
    """A JSON float literal as float, or as its text when it is long enough to hold more digits than float64
    keeps (``1733456789012345.678``: µs since the epoch with ns); the JSON decoders' float hook, so that such a
    ``ts`` can be read exactly (:func:`exact_ns`). Strings are what the Trace Event Format allows for numbers."""
    return float(text) if len(text) < _LONG_NUMBER else text


def exact_ns(value: Any) -> int | None:
    """A time in µs (an int, a float, a numeric string or a Decimal) as an exact integer of ns (rounded half to
    even below 1 ns); None when it is no finite number."""
    if type(value) is int:
        return value * 1000
    if type(value) is str:  # the common form, µs with up to 3 decimals, without Decimal's cost
        whole, dot, frac = value.strip().partition(".")
        digits = whole[1:] if whole[:1] in "+-" else whole
        if digits.isdigit() and digits.isascii() and (not dot or (len(frac) <= 3 and frac.isdigit()
                                                                  and frac.isascii())):
            ns = int(frac.ljust(3, "0")) if frac else 0
            return int(whole) * 1000 + (-ns if whole.startswith("-") else ns)
    try:
        d = Decimal(repr(value)) if type(value) is float else Decimal(value.strip() if type(value) is str else value)
    except (InvalidOperation, TypeError, ValueError):
        return None
    if not d.is_finite():
        return None
    return int(d.scaleb(3).to_integral_value())


def as_int(value: Any) -> int | None:
    """An int64 id from an int, an integral float or a numeric string; None for anything else."""
    if type(value) is float and value.is_integer():
        value = int(value)
    elif type(value) is str:
        try:
            value = int(value)
        except ValueError:
            number = as_float(value)
            value = int(number) if math.isfinite(number) and number.is_integer() else None
    if type(value) is int and -(1 << 63) <= value < (1 << 63):
        return value
    return None


def parse_rank(value: Any) -> int | None:
    """``distributedInfo.rank`` (or ``world_size``) as an int, however written (1, "1", 1.0); None if absent, not
    a whole number (NaN, Infinity, an integer beyond float range) or negative: ranks count from 0."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value.strip()) if isinstance(value, str) else float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return int(number) if number.is_integer() and number >= 0 else None


def json_float(value: Any, digits: int | None = None) -> float | None:
    """JSON-ready float: None for NaN/None/inf (unmeasurable), never 0."""
    if value is None:
        return None
    value = float(value)
    if not math.isfinite(value):
        return None
    return round(value, digits) if digits is not None else value
