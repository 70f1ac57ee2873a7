"""The complete CPU-operator events of a trace (category ``cpu_op``, ``Operator`` in old exports), kept compactly as
the parse reads them: what :mod:`.cpuops` picks the top-level operators from, without reading the file again.

No table of the parse keeps them (no GPU metric reads them). :class:`CpuOpRows` takes them from the batch decoder
(:mod:`.batch`, column-wise), from the per-event path (:meth:`CpuOpRows.add`) and from worker processes
(:meth:`CpuOpRows.export` / :meth:`CpuOpRows.merge`, in file order), and types them alike on every path: an event
is kept when its name is text and its ``ts`` and ``dur`` are numbers (JSON numbers, or strings holding one),
finite, ``dur`` not negative (``ts`` 0 with ``dur`` 0 is kept, unlike in the tables); its thread is the text of its
pid and tid (an absent one is ``"None"``), its times float64 µs as written in the file (not moved by the parse's
``origin_us``), its end ``ts + dur``. ``B``/``E`` pairs are not read as operators. :class:`CpuOps` holds the
result: 24 bytes per operator (two int32 codes, two float64 times), one string per distinct name and thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .schema import NA

if TYPE_CHECKING:
    import numpy as np

CPU_OP_CATEGORIES = frozenset({"cpu_op", "Operator"})
_FLUSH_ROWS = 1 << 16  # event tuples of the per-event path kept before they are typed together
_PLAIN_IDS = frozenset({int, str, type(None)})  # pid/tid types whose equal dict keys are equal texts


@dataclass(eq=False)
class CpuOps:
    """Every kept CPU-operator event of one trace, in file order (see the module doc).

    ``names``: object array of str, the text of each name code; ``name``: int32 name codes, one per operator;
    ``threads``: ``(pid text, tid text)`` of each thread code; ``thread``: int32 thread codes; ``ts_us``,
    ``end_us``: float64 µs in the file's time. The four per-operator arrays have one length.
    """

    names: Any
    name: Any
    threads: list[tuple[str, str]]
    thread: Any
    ts_us: Any
    end_us: Any

    def __len__(self) -> int:
        return len(self.ts_us)


def _number(value: Any) -> float | None:
    """A time as an operator event's ``ts``/``dur``: ``float(value)`` when that is finite, else None (null, text
    that is no number, lists, NaN, infinities)."""
    try:
        out = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return out if out == out and abs(out) != float("inf") else None


def _floats(values: list) -> np.ndarray:
    """:func:`_number` of each value as float64, NaN for None; numbers only are converted by numpy at once (an int
    rounds as ``float()`` rounds it)."""
    import numpy as np

    try:
        arr = np.array(values) if values else np.zeros(0)
        if arr.ndim == 1 and arr.dtype.kind in "bif":
            return arr.astype(np.float64, copy=False)
    except (TypeError, ValueError, OverflowError):  # lists of uneven length among them
        pass
    out = [_number(v) for v in values]
    return np.array([np.nan if v is None else v for v in out], dtype=np.float64)


def _id_text(value: Any) -> str:
    """A pid or tid as its thread's text: ``str()`` of the value as written, ``"None"`` when absent (the batch
    decoder's :data:`~.schema.NA`)."""
    return "None" if type(value) is int and value == NA else str(value)


class CpuOpRows:
    """The CPU-operator events of one parse as typed chunks, made one :class:`CpuOps` by :meth:`columns`."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}  # name -> code
        self.threads: dict[tuple[str, str], int] = {}  # (pid text, tid text) -> code
        self.chunks: list[tuple[Any, Any, Any, Any]] = []  # (name, thread int32; ts_us, end_us float64)
        self.pending: list[tuple] = []  # (name, pid, tid, ts, dur) of the per-event path, in file order

    def add(self, ev: dict) -> None:
        """One complete (``X``) event dict of the per-event path; kept when it is a CPU operator."""
        cat = ev.get("cat")
        if type(cat) is str and cat in CPU_OP_CATEGORIES:
            self.pending.append((ev.get("name"), ev.get("pid"), ev.get("tid"), ev.get("ts"), ev.get("dur")))
            if len(self.pending) >= _FLUSH_ROWS:
                self.flush()

    def flush(self) -> None:
        """Type the pending event tuples (before any later batch: the chunks stay in file order)."""
        if self.pending:
            names, pids, tids, ts, durs = (list(c) for c in zip(*self.pending))
            self.pending = []
            # bools and floats as their text: 1, 1.0 and True are one dict key but three threads
            pids, tids = ([v if type(v) in _PLAIN_IDS else str(v) for v in ids] for ids in (pids, tids))
            self._keep(names, pids, tids, ts, durs)

    def extend(self, names: list, pids: list, tids: list, ts: list, durs: list) -> None:
        """One batch of CPU-operator events, column-wise as raw JSON values (pid/tid :data:`~.schema.NA` when
        absent), after the pending ones."""
        self.flush()
        self._keep(names, pids, tids, ts, durs)

    def _keep(self, names: list, pids: list, tids: list, ts: list, durs: list) -> None:
        import numpy as np

        start, dur = _floats(ts), _floats(durs)
        keep = np.isfinite(start) & np.isfinite(dur) & (dur >= 0)
        if set(map(type, names)) != {str}:
            keep &= np.fromiter((type(n) is str for n in names), dtype=bool, count=len(names))
        if not keep.all():
            rows = np.flatnonzero(keep)
            take = rows.tolist()
            names, pids, tids = ([col[i] for i in take] for col in (names, pids, tids))
            start, dur = start[rows], dur[rows]
        if not len(start):
            return
        self.chunks.append((self._name_codes(names), self._thread_codes(pids, tids), start, start + dur))

    def _name_codes(self, names: list) -> np.ndarray:
        import numpy as np

        codes = self.names
        local = {v: codes.setdefault(v, len(codes)) for v in dict.fromkeys(names)}
        return np.fromiter(map(local.__getitem__, names), dtype=np.int32, count=len(names))

    def _thread_codes(self, pids: list, tids: list) -> np.ndarray:
        """Thread codes of pids and tids of :data:`_PLAIN_IDS` types (ints, texts, None)."""
        import numpy as np

        codes = self.threads
        if len(dict.fromkeys(pids)) == 1 and len(dict.fromkeys(tids)) == 1:  # a window of one thread's operators
            return np.full(len(pids), codes.setdefault((_id_text(pids[0]), _id_text(tids[0])), len(codes)),
                           dtype=np.int32)
        pairs = list(zip(pids, tids))
        local = {p: codes.setdefault((_id_text(p[0]), _id_text(p[1])), len(codes)) for p in dict.fromkeys(pairs)}
        return np.fromiter(map(local.__getitem__, pairs), dtype=np.int32, count=len(pairs))

    def export(self) -> dict:
        """What a worker process sends back: the chunks with the texts of their codes."""
        self.flush()
        return {"names": list(self.names), "threads": list(self.threads), "chunks": self.chunks}

    def merge(self, part: dict) -> None:
        """Append a worker's :meth:`export` (the next window of the file), its codes made this parse's."""
        import numpy as np

        self.flush()
        names = np.array([self.names.setdefault(t, len(self.names)) for t in part["names"]], dtype=np.int32)
        threads = np.array([self.threads.setdefault(tuple(k), len(self.threads)) for k in part["threads"]],
                           dtype=np.int32)
        for name, thread, ts, end in part["chunks"]:
            self.chunks.append((names[name], threads[thread], ts, end))

    def columns(self) -> CpuOps:
        """The kept operators as one :class:`CpuOps` (no rows when the trace has none); the chunks are dropped."""
        import numpy as np

        self.flush()
        chunks = [list(c) for c in self.chunks]
        self.chunks = []
        parts = []
        for i, dtype in enumerate((np.int32, np.int32, np.float64, np.float64)):
            parts.append(np.concatenate([c[i] for c in chunks]) if chunks else np.zeros(0, dtype=dtype))
            for c in chunks:  # each column's chunks freed once joined: memory holds the operators once plus a column
                c[i] = None
        return CpuOps(names=np.array(list(self.names), dtype=object), name=parts[0], threads=list(self.threads),
                      thread=parts[1], ts_us=parts[2], end_us=parts[3])
