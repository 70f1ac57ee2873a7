"""Safe output folders: a run is staged in a hidden folder inside ``--out`` and published at the end.

``diagnose`` writes ``results.json``, ``report.html`` and ``traces/`` into ``OUT/.bubblescope-partial-XXXX``
(``diagnose --tp`` writes ``tp.json``, ``ranks_timeline.png`` and ``traces/`` there);
:meth:`RunFolder.publish` then replaces every run entry of ``OUT`` (:data:`OWNED`, of either kind) by the new
ones (renames on one file system), so ``OUT`` holds either the previous complete run or the new one, never a
mix: traces of engines the new run did not measure go with the old ``traces/``, and a ``tp.json`` left by a
tensor-parallel run goes when a single-process run is published (its traces are gone), and the other way
round. An interrupted run (Ctrl-C, SIGTERM, SIGHUP, an exception) removes its staging folder and leaves ``OUT`` as
it was; one killed outright leaves a staging folder that the next run removes, unless the process that wrote it
(its ``.owner`` file) still runs: two runs may share ``OUT``. Other files in ``OUT`` are never touched.
Since ``traces/`` is replaced whole, a run refuses to start (:func:`check_out_dir`) while ``OUT/traces/`` holds
anything a run does not write there (:func:`foreign_trace`): only ``<engine>.json.gz`` and
``<engine>-rank<r>.json.gz`` files are a run's.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from .errors import BubblescopeError, OutputNotWritten, os_reason

OWNED = ("results.json", "report.html", "traces", "tp.json", "ranks_timeline.png")
PREFIX = ".bubblescope-partial-"
# The names a run writes into traces/: <engine>.json.gz, and <engine>-rank<r>.json.gz for a --tp run
# (engine names are lower-case words joined by '-', e.g. megakernel-noprefetch, reference-tp2-cudagraph).
RUN_TRACE = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*\.json\.gz")


def foreign_trace(out: str | os.PathLike) -> Path | None:
    """The first entry (by name) of ``out/traces/`` that no run writes (anything but a regular file named as
    :data:`RUN_TRACE`), or None: publishing a run would delete it with the old ``traces/``."""
    traces = Path(out) / "traces"
    if traces.is_symlink() or not traces.exists():  # a link is moved away, not followed: its target stays
        return None
    if not traces.is_dir():
        return traces
    try:
        entries = sorted(traces.iterdir())
    except OSError:
        return traces
    for entry in entries:
        if entry.is_symlink() or not entry.is_file() or not RUN_TRACE.fullmatch(entry.name):
            return entry
    return None


def _refuse_foreign(out: Path, then: str) -> None:
    """Raise BubblescopeError when ``out/traces/`` holds an entry no run writes (:func:`foreign_trace`)."""
    foreign = foreign_trace(out)
    if foreign is not None:
        raise BubblescopeError(f"--out {out}: {foreign} was not written by bubblescope and a run replaces "
                               f"{out / 'traces'} whole; {then}")


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it and ``os.replace``: the file is whole or
    absent, and no temporary is left.

    Raises:
        OutputNotWritten: the write failed (disk full, over the file size limit), with the OS error.
    """
    path = Path(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only; run outputs are meant to be shared
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise OutputNotWritten(f"{path}: cannot write ({os_reason(exc)})", path, os_reason(exc)) from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def check_out_dir(out: str | os.PathLike) -> None:
    """Refuse, before a run starts, an ``out`` that :class:`RunFolder` could not create or write into.

    Raises:
        BubblescopeError: ``out`` (or the nearest existing folder above it) is not a directory or not writable;
            ``out/traces/`` holds an entry no run writes (:func:`foreign_trace`), which publishing would delete.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BubblescopeError(f"--out {out}: cannot create the output directory (Not a directory)")
    existing = out.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise BubblescopeError(f"--out {out}: cannot create the output directory ({existing} is not a directory)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise BubblescopeError(f"--out {out}: cannot create the output directory (Permission denied)")
    _refuse_foreign(out, "move it away or choose another --out")


OWNER = ".owner"  # in each staging folder: the process id of the run writing it


def _owned_temp_dir(out: Path) -> Path:
    """A new staging folder in ``out`` holding :data:`OWNER` (this process's id), so that a run starting beside
    it can tell a live run's folder from one left by a run that was killed outright."""
    path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=out))
    (path / OWNER).write_text(f"{os.getpid()}\n")
    return path


def _owner_alive(folder: Path) -> bool:
    """Whether the process named by ``folder``'s :data:`OWNER` still runs (on this machine); False where the file
    is missing or unreadable (a folder of a run killed before writing it, or of an older version)."""
    try:
        pid = int((folder / OWNER).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    if pid == os.getpid():
        return False  # this process's own leftover (an earlier run in it), not a live neighbour
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by another user
        pass
    return True


class RunFolder:
    """Context manager: ``with RunFolder(out) as stage: ...write under stage...; publish()``.

    Leaving the block without :meth:`publish` (an exception, KeyboardInterrupt) deletes the staging folder; an
    :class:`~bubblescope.errors.OutputNotWritten` raised inside (a full disk) comes out worded for ``OUT``: the
    file as the run would have named it there, the OS error, and that the previous run was left as it was.
    ``owned``: the names a run of this kind writes into ``OUT`` (default :data:`OWNED`, ``diagnose``'s; ``bubblescope
    profile`` owns its own ``profile.*`` files, so the two kinds of run can share a folder without removing each
    other's).

    Raises:
        BubblescopeError: ``out`` cannot be created or written (a file, under a file, no permission).
    """

    def __init__(self, out: str | os.PathLike, owned: tuple[str, ...] = OWNED):
        self.out = Path(out)
        self.owned = owned
        if self.out.exists() and not self.out.is_dir():
            raise BubblescopeError(f"--out {self.out}: cannot create the output directory (Not a directory)")
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            for stale in self.out.glob(PREFIX + "*"):  # left by a run that was killed outright
                if not _owner_alive(stale):  # another run's, still writing: not stale
                    shutil.rmtree(stale, ignore_errors=True)
            self.stage = _owned_temp_dir(self.out)
        except OSError as exc:
            raise BubblescopeError(f"--out {self.out}: cannot create the output directory "
                                   f"({exc.strerror or type(exc).__name__})") from None
        self.published = False

    def __enter__(self) -> "RunFolder":
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if not self.published:
            shutil.rmtree(self.stage, ignore_errors=True)
            if isinstance(exc, OutputNotWritten):
                raise self._unwritten(exc) from None

    def _unwritten(self, exc: OutputNotWritten) -> OutputNotWritten:
        """``exc`` worded for ``OUT``: the file named where the run would have put it (not in the staging folder,
        which is gone), the OS error, and that the previous run is left as it was."""
        where = Path(exc.path) if exc.path else None
        try:
            name = where.relative_to(self.stage) if where is not None else None
        except ValueError:  # a file outside the staging folder: named as it is
            name = where
        what = f"cannot write {name}" if name is not None else "cannot write the run's files"
        return OutputNotWritten(f"--out {self.out}: {what} ({exc.reason or exc}); the previous run is left as it "
                                "was", self.out / name if name is not None else None, exc.reason)

    def publish(self) -> None:
        """Replace ``OUT``'s run entries (``owned``: results.json, report.html, traces/ ...) by the staged ones
        (absent ones removed).

        All or nothing: if a move fails (e.g. an entry of the previous run cannot be moved), the moves already made
        are undone in reverse order, so ``OUT`` keeps the previous run whole, and the staging folder is removed.

        Raises:
            BubblescopeError: a move failed (names ``OUT`` and the entry), or ``OUT/traces/`` holds an entry no
                run writes (:func:`foreign_trace`); nothing is moved then.
        """
        if "traces" in self.owned:  # put there while the run measured
            _refuse_foreign(self.out, "the previous run is left as it was")
        trash = _owned_temp_dir(self.out)
        done: list[tuple[Path, Path]] = []  # (from, to) of each move made, to undo
        try:
            for name in self.owned:
                if (self.out / name).exists() or (self.out / name).is_symlink():
                    os.replace(self.out / name, trash / name)
                    done.append((self.out / name, trash / name))
                if (self.stage / name).exists():
                    os.replace(self.stage / name, self.out / name)
                    done.append((self.stage / name, self.out / name))
        except OSError as exc:
            for src, dst in reversed(done):
                try:
                    os.replace(dst, src)
                except OSError:
                    pass
            shutil.rmtree(trash, ignore_errors=True)
            raise BubblescopeError(f"--out {self.out}: cannot replace {name} there "
                                   f"({exc.strerror or type(exc).__name__}); the previous run is left as it was") \
                from None
        self.published = True
        shutil.rmtree(trash, ignore_errors=True)
        shutil.rmtree(self.stage, ignore_errors=True)
