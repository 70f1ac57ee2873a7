"""Counts in user-facing text: "1 run", "3 runs" (never "1 runs"); the first few of a list."""

from __future__ import annotations


def plural(n: float, noun: str, many: str | None = None) -> str:
    """``noun`` for exactly one, else its plural (``many``, or ``noun + "s"``); ``n`` may be a float count
    (1.0 is one). Irregular plurals are passed as ``many`` ("activity", "activities")."""
    return noun if n == 1 else (many if many is not None else noun + "s")


def count(n: float, noun: str, many: str | None = None, fmt: str = "") -> str:
    """``n`` formatted with ``fmt`` (e.g. ``",.0f"``), a space, and :func:`plural` of ``noun``:
    ``count(1, "run") == "1 run"``, ``count(3, "run") == "3 runs"``."""
    text = f"{n:{fmt}}"
    return f"{text} {plural(1 if text == '1' else n, noun, many)}"


def first_few(items: list[str], sep: str = ", ", shown: int = 3) -> str:
    """The first ``shown`` of ``items`` joined by ``sep``, then " and N more" for the rest:
    ``first_few(["a", "b", "c", "d"]) == "a, b, c and 1 more"``."""
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    return sep.join(items[:shown]) + more
