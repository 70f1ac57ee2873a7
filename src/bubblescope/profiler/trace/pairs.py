"""Duration events written as ``B``/``E`` pairs, made into complete (``X``) events.

The Trace Event Format gives a slice either as one complete event (``ph: "X"`` with ``dur``) or as a
begin event (``ph: "B"``) and an end event (``ph: "E"``) on the same thread (pid, tid); "the E event
closes the most recent B on that thread" (slices nest as a stack), and "args from the E event are
merged with those of the B event". Name and category are the B event's; an E without a B, or a B
never closed, is counted and ignored.
"""

from __future__ import annotations

import math
from collections import Counter
from decimal import Decimal
from typing import Any

from .values import as_float, exact_ns


def _time(ts: Any) -> Any:
    """A B/E ``ts`` kept as exact as written: an int within int64 as is, a numeric string (a long float literal
    comes as one, see ``values.long_float``) as a Decimal, a float as is; NaN when no finite number."""
    if type(ts) is int and -(1 << 63) <= ts < 1 << 63:  # integers stay exact (huge ts, see columns.rebase_times)
        return ts
    if type(ts) is str:
        ns = exact_ns(ts)
        return math.nan if ns is None else Decimal(ns).scaleb(-3)
    return as_float(ts)


def _minus(end: Any, begin: Any) -> Any:
    """end − begin, exact where either is a Decimal (a float taken by its shortest repr)."""
    if type(end) is Decimal or type(begin) is Decimal:
        as_dec = lambda v: v if type(v) is Decimal else Decimal(repr(v)) if type(v) is float else Decimal(v)  # noqa: E731
        return as_dec(end) - as_dec(begin)
    return end - begin


def _thread(ev: dict) -> tuple:
    key = (ev.get("pid"), ev.get("tid"))
    try:
        hash(key)
    except TypeError:  # a list or object as pid/tid: its text identifies the thread
        key = (repr(key[0]), repr(key[1]))
    return key


def pair_durations(events: list[dict], odd: Counter) -> list[dict]:
    """Complete-event dicts (ts, dur in µs: ints when both ends are, Decimals where one was written as text, else
    floats) of the ``B``/``E`` pairs among
    ``events`` (decoded event dicts in file order). Unpaired or timeless events are counted in ``odd`` (the
    reader's warning counter) under a one-line description."""
    threads: dict[tuple, list[tuple[float, int, dict]]] = {}
    for i, ev in enumerate(events):
        ts = _time(ev.get("ts"))
        if not math.isfinite(ts):
            odd["'B'/'E' events without a finite numeric ts ignored"] += 1
            continue
        threads.setdefault(_thread(ev), []).append((ts, i, ev))
    out: list[dict] = []
    lone_ends = open_begins = 0
    for evs in threads.values():
        evs.sort(key=lambda t: (t[0], t[1]))  # time order; file order among equal times
        stack: list[tuple[float, dict]] = []
        for ts, _, ev in evs:
            if ev.get("ph") == "B":
                stack.append((ts, ev))
                continue
            if not stack:
                lone_ends += 1
                continue
            begin_ts, begin = stack.pop()
            args: Any = begin.get("args")
            end_args = ev.get("args")
            if isinstance(args, dict) and isinstance(end_args, dict):
                args = {**args, **end_args}
            elif not isinstance(args, dict):
                args = end_args
            x = {k: v for k, v in begin.items() if k in ("pid", "tid", "id")}
            x.update(
                ph="X",
                cat=begin.get("cat", ev.get("cat")),
                name=begin.get("name", ev.get("name")),
                ts=begin_ts,
                dur=_minus(ts, begin_ts),
                args=args if isinstance(args, dict) else {},
            )
            out.append(x)
        open_begins += len(stack)
    if lone_ends:
        odd["'E' events without an open 'B' on their thread ignored"] += lone_ends
    if open_begins:
        odd["'B' events never closed by an 'E' on their thread ignored"] += open_begins
    return out
