"""The top-level CPU operators of a trace, for finding decode steps in a trace without GPU activity and for the
host's time per step by operator (:mod:`.hostops`).

The trace's tables keep GPU activities, CUDA API calls and ``record_function`` ranges, not torch's operator events
(category ``cpu_op``, ``Operator`` in old exports), which no GPU metric reads. A CPU-only run has nothing else: its
decode steps show only as a repeating sequence of operators; a host-bound one spends its step in them. The parse
keeps those events apart (:class:`~.opevents.CpuOps`, ``TraceArrays.cpu_ops``) and :func:`parsed_cpu_ops` picks
the top-level ones, once per trace and only when asked: operators not inside another operator of their thread
(``aten::linear``, not the ``aten::addmm`` it calls), the calls a decode loop makes.
"""

from __future__ import annotations

import zlib
from array import array
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from .arrays import TraceArrays
    from .opevents import CpuOps

_LOOP_ROWS = 1 << 16


def parsed_cpu_ops(arrays: TraceArrays) -> dict[str, np.ndarray] | None:
    """:func:`top_level_ops` of the operators the parse of ``arrays`` kept (``arrays.cpu_ops``), computed once per
    trace (kept in ``arrays.cache``). None when the trace holds no operator, or was not read by the parse (built
    from frames made otherwise)."""
    if "cpu_ops" not in arrays.cache:
        arrays.cache["cpu_ops"] = top_level_ops(arrays.cpu_ops)
    return arrays.cache["cpu_ops"]


def top_level_ops(ops: CpuOps | None) -> dict[str, np.ndarray] | None:
    """The top-level operators of the busiest thread of ``ops``, in time order; None when ``ops`` is None or empty.

    Returns:
        ``{"name": object array of str, "pid", "tid": int64 (the thread's, repeated), "ts_us", "end_us":
        float64 µs}``. Per thread in start order (an enclosing operator before its child; equal (start, end) in
        the order of ``ops``, the file's), an operator that starts before the end of the last one kept is nested
        and left out. The thread is the one with most top-level operators (the decode loop's; a data-loader
        thread has fewer).
    """
    import numpy as np

    if ops is None or not len(ops):
        return None
    keys = ops.threads  # by code
    rank = np.empty(len(keys), dtype=np.int64)  # each thread's place in (pid, tid) text order
    rank[sorted(range(len(keys)), key=keys.__getitem__)] = np.arange(len(keys))
    code, t0, t1 = ops.thread, ops.ts_us, ops.end_us
    # per thread by start, an enclosing op before its child (one thread, the usual case, needs no thread key)
    order = np.lexsort((-t1, t0, rank[code]) if len(keys) > 1 else (-t1, t0))
    kept, last, reach = array("q"), -1, 0.0
    for lo in range(0, len(order), _LOOP_ROWS):  # as Python numbers a block at a time
        rows = order[lo:lo + _LOOP_ROWS]
        for i, c, a, b in zip(rows.tolist(), code[rows].tolist(), t0[rows].tolist(), t1[rows].tolist()):
            if c == last and a < reach:  # starts inside an earlier op of the thread: nested
                continue
            last, reach = c, b
            kept.append(i)
    kept = np.frombuffer(kept, dtype=np.int64)
    per = np.bincount(code[kept], minlength=len(keys))
    main = max(range(len(keys)), key=lambda k: (per[k], keys[k]))
    mine = kept[code[kept] == main]
    pid, tid = (_int(v) for v in keys[main])
    return {"name": ops.names[ops.name[mine]], "pid": np.full(len(mine), pid, dtype=np.int64),
            "tid": np.full(len(mine), tid, dtype=np.int64), "ts_us": t0[mine], "end_us": t1[mine]}


def _int(text: str) -> int:
    """A pid or tid as int64 (a named one, as some exporters write, hashed into the positive range)."""
    try:
        value = int(text)
    except ValueError:
        return zlib.crc32(text.encode("utf-8", "replace"))
    return value if -(1 << 63) < value < (1 << 63) else zlib.crc32(text.encode())
