"""Decode the ``traceEvents`` windows of a large trace in worker processes, two or more at once.

One process parses about 400 k events/s all told (msgspec into structs, then typed columns; 2.7 µs
per event of a 21.6M-event Kineto trace): the parse of a 5 GB trace is bound by that one core.
:class:`Workers` starts plain child interpreters (``python -c``, so neither ``fork`` in a threaded
process nor the re-import of ``__main__`` that ``multiprocessing`` would do) and hands each one, in
turn, the text of a window's whole events (cut at the last "}, {" as
:func:`~.window.batch_end` finds it, sent as UTF-8 bytes over its stdin). A worker runs
:func:`~.batch.add_array` on it into a fresh :class:`~.events.EventTables` and sends the
column chunks, with its own vocabulary, back pickled; the parsing process merges them in file
order (:func:`_merge`), so the columns, codes, warnings and their order are those of the serial
parse.

A cut is only a guess at an event boundary (a "}, {" inside a kernel name would fool it). The
serial path finds out at once (msgspec refuses the text); here the parser has moved on, so the
text of every window in flight is kept until its result is in: when a worker refuses one,
:meth:`Workers.collect` puts that text and all after it back in front of the parser's window
(results of later windows are dropped: they may start mid-event) and the next window is read in
process, with the serial path's retries and event-by-event fallback. When over a quarter of the
windows are refused (NaN literals everywhere), the rest of the file is read in process. A worker
that dies does the same for everything in flight, and the rest of the file is read in process.
"""

from __future__ import annotations

import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from collections import deque
from typing import TYPE_CHECKING, Any

from .schema import FLOAT_COLUMNS, INT_COLUMNS
from .window import COMMA, batch_end

if TYPE_CHECKING:
    from .events import EventTables
    from .window import Text

# JSON text below which workers cost more than they save: each costs ~0.3 CPU s to start (interpreter,
# numpy, msgspec), and a 53 MB trace parsed in ~0.5 s in process came out 0.4-0.8 s slower with two.
MIN_PARALLEL_BYTES = 256 << 20
MAX_WORKERS = 4  # beyond this the parsing process (gunzip, cuts, merging) is the bottleneck
_HEAD = struct.Struct("<Q")  # frame length, bytes
_IN_FLIGHT = 2  # windows queued per worker: one being decoded, one waiting
_MAX_REFUSED = 3  # refused windows (and over a quarter of those sent) before the rest is read in process
_SERVE = "from bubblescope.profiler.trace.workers import serve; serve()"


def worker_count(size: int, gz: bool) -> int:
    """Worker processes for a trace file of ``size`` bytes on disk: one per core up to
    :data:`MAX_WORKERS`, or 0 (decode in process) below :data:`MIN_PARALLEL_BYTES` of JSON (a gzip
    file counted as 10× its size, Kineto's usual ratio), on one core, or when no core is idle (the
    1-minute load average within one of the core count, as ``make --load-average`` judges it: the
    workers' start-up and hand-over, ~20 % more CPU time, then only slow the parse down).
    ``BUBBLESCOPE_TRACE_WORKERS=N`` overrides it (0: always in process)."""
    forced = os.environ.get("BUBBLESCOPE_TRACE_WORKERS", "").strip()
    if forced.isdigit():
        return int(forced)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows: no load average
        load = 0.0
    if cores < 2 or cores - load < 1 or size * (10 if gz else 1) < MIN_PARALLEL_BYTES:
        return 0
    return min(cores, MAX_WORKERS)


def _widen(stream: Any) -> None:
    """Raise a pipe's capacity from Linux's 64 KiB to 1 MiB (``F_SETPIPE_SZ``, the default
    ``/proc/sys/fs/pipe-max-size``): a window of megabytes then crosses in a few writes and wake-ups, not
    in a hundred. Elsewhere, or when refused, the pipe stays as it is."""
    try:
        import fcntl

        fcntl.fcntl(stream.fileno(), fcntl.F_SETPIPE_SZ, 1 << 20)
    except (ImportError, AttributeError, OSError):
        pass


def _read_frame(stream: Any) -> bytes | None:
    head = stream.read(_HEAD.size)
    if len(head) < _HEAD.size:
        return None
    size = _HEAD.unpack(head)[0]
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("frame cut short")
    return data


def serve() -> None:
    """The worker's loop: a config frame (``lean``, ``flows``), then one JSON array of events per
    frame on stdin, answered in order by one pickled result per frame on stdout (None: refused);
    an empty frame or end of input ends it."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes our stdin
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    from .batch import add_array
    from .events import EventTables

    config = pickle.loads(_read_frame(stdin))
    while True:
        doc = _read_frame(stdin)
        if not doc:
            return
        cols = EventTables(keep_flows=config["flows"], lean=config["lean"])
        result = _export(cols) if add_array(cols, doc) else None
        del doc
        payload = pickle.dumps(result, protocol=5)
        stdout.write(_HEAD.pack(len(payload)))
        stdout.write(payload)
        stdout.flush()


def _pump(stream: Any, box: queue.Queue) -> None:
    """Write each queued tuple of byte strings to ``stream`` as one frame; None closes it."""
    try:
        while True:
            parts = box.get()
            if parts is None:
                break
            stream.write(_HEAD.pack(sum(map(len, parts))))
            for part in parts:
                stream.write(part)
            stream.flush()
    except OSError:  # the worker is gone: the parser sees it from its results
        pass
    finally:
        try:
            stream.close()
        except OSError:
            pass


def _export(cols: EventTables) -> dict:
    return {"events": cols.events, "gpu_excluded": cols.gpu_excluded, "odd": dict(cols.odd),
            "bad_ints": dict(cols.bad_ints), "vocab": cols.vocab, "chunks": cols.chunks, "pairs": cols.pairs,
            "cpu_ops": cols.cpu_ops.export()}


def _merge(cols: EventTables, result: dict) -> None:
    """Append a worker's decoded window to ``cols`` as :func:`~.batch.add_array` would have:
    its texts re-coded into ``cols``' vocabulary (new ones appended in the worker's order of first
    sight, which is the serial order), counts added, chunks, B/E events and CPU operators appended."""
    import numpy as np

    cols.flush()
    cols.events += result["events"]
    cols.gpu_excluded += result["gpu_excluded"]
    for key, n in result["odd"].items():
        cols.odd[key] += n
    for key, n in result["bad_ints"].items():
        cols.bad_ints[key] += n
    codes, vocab = cols.codes, cols.vocab
    remap = np.empty(len(result["vocab"]), dtype=np.int32)
    for i, text in enumerate(result["vocab"]):
        code = codes.get(text)
        if code is None:
            code = codes[text] = len(vocab)
            vocab.append(text)
        remap[i] = code
    for table, chunks in result["chunks"].items():
        for chunk in chunks:
            for key, arr in chunk.items():
                if key in ("grid", "block"):  # one shared tuple per distinct shape, as the serial path keeps
                    chunk[key] = np.fromiter(cols.dims(arr.tolist()), dtype=object, count=len(arr))
                elif key not in INT_COLUMNS and key not in FLOAT_COLUMNS:
                    chunk[key] = remap[arr]
            cols.chunks[table].append(chunk)
    cols.pairs.extend(result["pairs"])
    cols.cpu_ops.merge(result["cpu_ops"])


class Workers:
    """``n`` worker processes decoding windows for one parse; see the module doc. Use as a context
    manager (the processes are ended on exit)."""

    def __init__(self, n: int, cols: EventTables):
        self.cols = cols
        # the folder holding the bubblescope package (this module's path less one level per dotted name part),
        # put on the workers' PYTHONPATH so that they import this same copy
        root = os.path.abspath(__file__)
        for _ in range(__name__.count(".") + 1):
            root = os.path.dirname(root)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        # stderr silenced: a worker that fails is seen by its missing results, and the file is then
        # read in process; no traceback of a child reaches the user.
        self.procs: list[Any] = []
        try:
            for _ in range(n):
                self.procs.append(subprocess.Popen([sys.executable, "-c", _SERVE], stdin=subprocess.PIPE,
                                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env))
        except OSError:
            for proc in self.procs:
                proc.kill()
                proc.wait()
            raise
        for proc in self.procs:
            _widen(proc.stdin)
            _widen(proc.stdout)
        # One writer thread per worker: a worker writing a result while we write it the next window
        # must not block us, and a pipe write releases the GIL for the whole window.
        self.outboxes = [queue.Queue() for _ in self.procs]
        self.writers = [threading.Thread(target=_pump, args=(p.stdin, q), daemon=True, name="bubblescope-trace-send")
                        for p, q in zip(self.procs, self.outboxes)]
        for thread in self.writers:
            thread.start()
        config = pickle.dumps({"lean": cols.lean, "flows": cols.keep_flows})
        for box in self.outboxes:
            box.put((config,))
        # (worker, its events as sent, the separator after them) per window in flight
        self.pending: deque[tuple[Any, Any, str]] = deque()
        self.sent = 0
        self.refused = 0
        self.active = True

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


    def dispatch(self, text: Text) -> bool:
        """Send the window's whole events, from the cursor to its last cut, to the next worker and move
        the cursor past them; False (nothing sent) when the window holds no cut or the workers are off.
        Results are merged as the queue fills; a refused window rewinds ``text`` (see the module doc)."""
        buf, pos = text.buf, text.pos
        if not self.active or not buf.startswith("{", pos):
            return False
        end = batch_end(buf, pos, len(buf))
        if end < 0:
            return False
        k = self.sent % len(self.procs)
        proc = self.procs[k]
        if not self.writers[k].is_alive():  # its pipe broke: a worker gone
            self._fail(text)
            return False
        if buf.isascii():  # characters are bytes: one copy of the window, not a slice and its copy
            data: Any = memoryview(buf.encode("ascii"))[pos : end + 1]
        else:
            data = buf[pos : end + 1].encode("utf-8", "surrogatepass")
        self.outboxes[k].put((b"[", data, b"]"))
        self.sent += 1
        text.pos = COMMA.match(buf, end + 1).end()
        self.pending.append((proc, data, buf[end + 1 : text.pos]))
        return self.collect(text, len(self.procs) * _IN_FLIGHT - 1)

    def collect(self, text: Text, keep: int = 0) -> bool:
        """Merge results, oldest first, until at most ``keep`` windows are in flight; False when one
        was refused or a worker failed (``text`` is rewound then, and the next window is read in process)."""
        while len(self.pending) > keep:
            proc = self.pending[0][0]
            try:
                frame = _read_frame(proc.stdout)
                if frame is None:
                    raise EOFError("worker ended")
                result = pickle.loads(frame)
            except (OSError, EOFError, pickle.UnpicklingError):
                self._fail(text)
                return False
            if result is None:
                self.refused += 1
                self._rewind(text)
                if self.refused >= _MAX_REFUSED and 4 * self.refused > self.sent:  # an odd file: its
                    self.close()  # windows would be decoded twice
                return False
            self.pending.popleft()
            _merge(self.cols, result)
        return True

    def _rewind(self, text: Text, drop: bool = True) -> None:
        """Put the text of every window in flight back in front of the parser's window (the oldest's
        result already read); with ``drop``, the later ones' results are read and dropped."""
        back = "".join(bytes(data).decode("utf-8", "surrogatepass") + sep for _, data, sep in self.pending)
        text.offset += text.pos - len(back)
        text.buf = back + text.buf[text.pos :]
        text.pos = 0
        for proc, _, _ in list(self.pending)[1:] if drop else ():
            try:
                _read_frame(proc.stdout)
            except (OSError, EOFError):
                pass
        self.pending.clear()

    def _fail(self, text: Text) -> None:
        self._rewind(text, drop=False)
        self.close(kill=True)

    def close(self, kill: bool = False) -> None:
        """End the worker processes: their stdin closed, then killed if ``kill`` or not gone within 5 s."""
        self.active = False
        for box in self.outboxes:
            box.put(None)
        for proc in self.procs:
            if kill:
                proc.kill()
        for thread in self.writers:
            thread.join()
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        self.procs = []
