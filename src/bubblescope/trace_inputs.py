"""Which files ``diagnose trace`` reads: files as given, and the trace files of a directory.

A directory (such as a ``diagnose model --out`` folder, or a torch.profiler ``tensorboard_trace_handler``
folder) holds other files too: ``results.json``, ``report.html``. Each regular file in it is sniffed —
gunzipped when it starts with the gzip magic, then the first MiB of text looked at — and kept when it looks
like Chrome Trace Event Format (a JSON array, or an object with a ``traceEvents`` key); the others are
skipped with a one-line note saying why, except that a ``.json`` / ``.gz`` file that cannot be read (a truncated
gzip, no permission) is kept, so the parser reports it as an error. Not recursive, except that a folder with no
trace of its own is read through its ``traces/`` subfolder, where ``diagnose model`` writes them.
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path

from .errors import BubblescopeError
from .wording import count

SNIFF_BYTES = 1 << 20
GZIP_MAGIC = b"\x1f\x8b"


def sniff_trace(path: str | os.PathLike) -> str | None:
    """None when ``path`` looks like a Chrome/Kineto trace (plain or gzipped JSON), else why not (one line).

    Reads at most :data:`SNIFF_BYTES` of decompressed text: the Trace Event Format puts either ``[`` first
    (JSON array format) or an object whose ``traceEvents`` key Kineto writes after a few kB of metadata.
    """
    return _sniff(path)[0]


def _sniff(path: str | os.PathLike) -> tuple[str | None, bool]:
    """:func:`sniff_trace`'s answer, and whether the file could be read (opened and, if gzipped, decompressed)."""
    try:
        with open(path, "rb") as f:
            head = f.read(2)
            f.seek(0)
            raw = gzip.GzipFile(fileobj=f).read(SNIFF_BYTES) if head == GZIP_MAGIC else f.read(SNIFF_BYTES)
    except (OSError, EOFError, zlib.error) as exc:
        return f"unreadable ({getattr(exc, 'strerror', None) or exc})", False
    return _kind(raw), True


def _kind(raw: bytes) -> str | None:
    """None when the first bytes ``raw`` of a readable file look like a trace, else why not."""
    text = raw.decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")
    if text.startswith("["):
        return None
    if not text.startswith("{"):
        return "not JSON"
    if '"traceEvents"' in text:
        return None
    if '"bubblescope.results/' in text:
        return "a bubblescope results document (read it with `bubblescope report`)"
    return "JSON without traceEvents (not a Chrome trace)"


def trace_files(paths: list[str | os.PathLike]) -> tuple[list[str], list[str]]:
    """``(files to read, notes on skipped files)``: a path that is not a directory is kept as given (a missing
    or bad file is reported by the parser, beside the other files' results); a directory gives its trace
    files, sorted by name, or those of its ``traces/`` subfolder when it holds none itself (the layout
    ``diagnose model --out`` writes).

    Raises:
        BubblescopeError: no paths, or a directory with no trace file in it (the message names what was
            skipped).
    """
    files, notes = [], []
    if not paths:
        raise BubblescopeError("no trace paths given")
    for path in map(Path, paths):
        if not path.is_dir():
            files.append(str(path))
            continue
        found, skipped = _trace_files_of(path)
        sub = path / "traces"
        if not found and sub.is_dir() and not sub.is_symlink():
            # `diagnose model --out DIR` writes its traces to DIR/traces/: take DIR as meaning them.
            found, more = _trace_files_of(sub)
            skipped += more
            if found:
                skipped.append(f"reading {sub}: {path} holds no trace itself (a `diagnose model` output folder)")
        if not found:
            raise BubblescopeError(f"{path}: directory holds no Chrome trace file"
                                   + (f" ({count(len(skipped), 'other file')} skipped)" if skipped
                                      else " (it is empty)"))
        files += found
        notes += skipped
    return files, notes


def refuse_input(out: Path | None, files: list[str], option: str, what: str = "an input trace") -> None:
    """Refuse an output path (``option``, e.g. ``--html``) that is one of the input ``files`` to be read (the
    traces, or ``what`` else: the ``--model`` config): writing it would replace an input.

    Raises:
        BubblescopeError: ``out`` is one of ``files`` (the same file, by resolved path).
    """
    if out is None or not out.exists():
        return
    for f in files:
        if Path(f).exists() and Path(f).resolve() == out.resolve():
            raise BubblescopeError(f"{option} {out}: is {what} ({f}); choose another path")


def model_inputs(model: str | None) -> list[str]:
    """The files ``--model`` reads when it is a path: a ``config.json`` (named, or in the named folder) and the
    ``generation_config.json`` beside it (``ModelConfig.from_hf_config``); none for a preset name."""
    if model is None or not model.strip():
        return []
    path = Path(model)
    config = path / "config.json" if path.is_dir() else path
    return [str(config), str(config.parent / "generation_config.json")] if config.is_file() else []


def _trace_files_of(folder: Path) -> tuple[list[str], list[str]]:
    """``(trace files, notes on skipped files)`` of the regular files directly in ``folder``, by name."""
    found, skipped = [], []
    for entry in sorted(folder.iterdir()):
        if not entry.is_file():
            continue
        why, readable = _sniff(entry)
        if why is None or (not readable and entry.name.endswith((".json", ".gz"))):
            # a trace-named file that cannot be read (truncated gzip, no permission) is an error of the run, as
            # when named directly, not a note: a half-written rank trace must not drop out of a folder silently
            found.append(str(entry))
        else:
            skipped.append(f"skipped {entry}: {why}")
    return found, skipped
