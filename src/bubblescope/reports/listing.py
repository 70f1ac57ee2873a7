"""Listings the CLI prints (``bubblescope engines``): names in a column of their own, descriptions wrapped by word
beside them, the whole at most :data:`MAX_WIDTH` columns wide whatever the terminal's width."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from .layout import Wrapped

MAX_WIDTH = 100  # a listing wider than this is hard to read, however wide the terminal


def listing_console(file=None) -> Console:
    """A rich Console on stdout (or ``file``) as wide as the terminal but at most :data:`MAX_WIDTH` columns."""
    probe = Console(file=file)
    return Console(file=file, width=min(probe.width, MAX_WIDTH))


def render_listing(rows: list[tuple[str, str]], console: Console) -> None:
    """Print ``(name, description)`` rows: the names in a column as wide as the longest, never wrapped; each
    description wrapped by word (:class:`~.layout.Wrapped`) under itself, lines carrying no trailing blanks."""
    width = max((len(name) for name, _ in rows), default=0) + 2
    for name, description in rows:
        console.print(Wrapped(Text.assemble((name.ljust(width), "bold"), description), hang=width))
