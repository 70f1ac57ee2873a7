"""Read a trace file into columns: :func:`read_trace_arrays` (numpy, what ``diagnose trace`` computes on) and
:func:`load_trace` (the same as pandas frames).

The stages in order: :mod:`.file` reads and inflates the file in a thread; :mod:`.window` and :mod:`.walk`
stream its JSON text window by window (4 Mi characters) and hand the ``traceEvents`` entries on; :mod:`.batch`
decodes the whole events of each window in one msgspec call (only the fields the metrics use), in worker
processes for a large file (:mod:`.workers`); :mod:`.events` keeps them as typed column chunks per table, and
the CPU operator events apart (:mod:`.opevents`); :mod:`.columns` makes them whole numpy columns (``B``/``E``
pairs made complete events, :mod:`.pairs`); here they are cleaned (:mod:`.repeats`), classified and wrapped in a
:class:`~.arrays.TraceArrays`. No dict per event is built; memory is one window plus the kept columns
(``benchmarks/trace_parse.py`` measures time and peak RSS against Holistic Trace Analysis).
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...errors import BubblescopeError
from ...wording import count, plural
from .arrays import TraceArrays, api_flags, categories_of, launch_rows
from .columns import build_arrays
from .events import EventTables
from .file import Reader, open_trace
from .heap import parse_heap
from .repeats import drop_repeated, drop_repeated_calls, drop_repeated_ranges
from .schema import INT_NULL_SHOWN
from .values import parse_rank
from .walk import parse
from .window import Text

if TYPE_CHECKING:
    from .frames import Trace


# The plural words of the parser's count phrases (EventTables.odd), for a count of exactly one.
_SINGULAR = {"events": "event", "entries": "entry", "their": "its", "kernels": "kernel"}


def _one(phrase: str) -> str:
    """A count phrase of the parser ("complete events without ... excluded") worded for exactly one."""
    return " ".join(_SINGULAR.get(word, word) for word in phrase.split(" "))


def _workers(cols: EventTables, size: int, gz: bool, n: int | None) -> Any:
    from .workers import Workers, worker_count

    n = worker_count(size, gz) if n is None else n
    if n <= 0:
        return None
    try:
        return Workers(n, cols)
    except OSError:  # no interpreter to start (an embedded Python), no processes left: read in process
        return None


def read_trace_arrays(
    path: str | os.PathLike, progress: Callable[[int, int], None] | None = None, flows: bool = True,
    lean: bool = False, workers: int | None = None,
) -> TraceArrays:
    """Parse one Chrome/Kineto trace file (plain or gzipped JSON) into :class:`TraceArrays`.

    Arguments and errors as :func:`load_trace` (which is this plus :meth:`TraceArrays.to_trace`):
    BubblescopeError (one line naming the file) for a missing, unreadable, truncated or corrupt file, or JSON
    without a ``traceEvents`` array. ``workers``: the processes that decode the events beside this one
    (:mod:`.workers`; 0: none); None picks by the file's size, the cores and the load
    (:func:`~.workers.worker_count`). The result is the same either way.
    """
    path = os.fspath(path)
    cols = EventTables(keep_flows=flows, lean=lean)
    try:
        raw, gz = open_trace(path)
        with raw, parse_heap():
            size = os.fstat(raw.fileno()).st_size
            pool = _workers(cols, size, gz, workers)
            reader = Reader(raw, gz)
            reader.start()
            try:
                text = Text(reader, None if progress is None else (lambda done: progress(done, size)))
                meta, found = parse(text, cols, pool)
            finally:
                reader.close()
                if pool is not None:
                    pool.close(kill=True)
        if progress is not None:
            progress(size, size)
    except FileNotFoundError:
        raise BubblescopeError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise BubblescopeError(f"{path}: is a directory, not a trace file") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise BubblescopeError(f"{path}: corrupt or truncated gzip ({exc})") from None
    except OSError as exc:
        raise BubblescopeError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except (ValueError, RecursionError) as exc:
        raise BubblescopeError(f"{path}: not a Chrome trace: {exc}") from None
    if not found:
        raise BubblescopeError(f"{path}: JSON without a traceEvents array (not a Chrome trace)")

    with parse_heap():  # whole columns are built, sorted and copied: pages reused, not faulted in
        return _finish(path, cols, meta)


def _finish(path: str, cols: EventTables, meta: dict) -> TraceArrays:
    """The parsed columns cleaned, merged, classified and warned about (see :func:`read_trace_arrays`)."""
    texts, tables = build_arrays(cols)
    # gpu sorted by (device, ts_us), device -1 where neither args.device nor pid; runtime and
    # annotations by ts_us (stable: the file's order among equal times)
    gpu, merged = drop_repeated(tables["gpu"])
    gpu["category"], texts = categories_of(gpu["name"], gpu["kind"], texts)  # once here, not per metric
    runtime, repeated_calls = drop_repeated_calls(tables["runtime"])
    runtime.update(api_flags(runtime["name"], texts))
    annotations, repeated_ranges = drop_repeated_ranges(tables["annotations"])
    merged += repeated_calls + repeated_ranges

    warnings = [f"{n} {what if n != 1 else _one(what)}" for what, n in cols.odd.items()]
    warnings += [f"{count(n, 'integer')} in {col} beyond int64 or not {plural(n, 'an integer', 'integers')}, set to "
                 f"{INT_NULL_SHOWN.get(col, 'null')}" for col, n in cols.bad_ints.items()]
    warnings += merged
    if cols.bad_text:
        warnings.append(f"{count(cols.bad_text, 'distinct name')} had invalid UTF-8 (replaced by U+FFFD)")
    rank_raw = meta.get("distributedInfo", {}).get("rank") if isinstance(meta.get("distributedInfo"), dict) else None
    rank = parse_rank(rank_raw)
    arrays = TraceArrays(path=path, rank=rank, metadata=meta, texts=texts, gpu=gpu, runtime=runtime,
                         annotations=annotations, flows=tables["flows"], warnings=warnings,
                         event_count=cols.events, gpu_excluded=cols.gpu_excluded,
                         origin_us=cols.origin_us, cpu_ops=cols.cpu_ops.columns())
    unlinked = int((launch_rows(arrays) < 0).sum())  # computed once, kept for the summaries
    if unlinked:
        warnings.append(
            f"{unlinked} of {count(len(gpu['ts_us']), 'GPU activity', 'GPU activities')} "
            f"{plural(unlinked, 'has', 'have')} no CPU call with their correlation id (launch unknown)"
        )
    if rank_raw is not None and rank is None:
        warnings.append(f"distributedInfo.rank {rank_raw!r} is not an integer; rank unknown")
    return arrays


def load_trace(
    path: str | os.PathLike, progress: Callable[[int, int], None] | None = None, flows: bool = True,
    lean: bool = False,
) -> Trace:
    """Parse one Chrome/Kineto trace file (plain or gzipped JSON) into a :class:`~.frames.Trace`.

    ``progress(done, total)``, if given, is called with the bytes of the file read so far and the
    file's size (bytes, as on disk: compressed for .gz) after each 4 Mi-character window.
    ``flows=False`` leaves ``Trace.flows`` empty (no metric reads it; it is a quarter of a Kineto
    trace's events, so the summary skips it). ``lean=True`` also leaves out the columns no summary
    metric reads: ``external_id`` of gpu and runtime, and gpu's grid, block, shared_memory_bytes,
    blocks_per_sm, warps_per_sm and occupancy_pct (msgspec then skips those args unbuilt: less time
    and memory; every other column is the same).

    Raises BubblescopeError (one line naming the file) when the file is missing, unreadable, a
    truncated or corrupt gzip, not JSON, or JSON without a ``traceEvents`` array. Odd events (ts 0
    and dur 0, missing ts/dur, integers beyond int64, invalid UTF-8) are excluded or repaired and
    counted in ``Trace.warnings``.
    """
    return read_trace_arrays(path, progress, flows, lean).to_trace()
