"""Terminal text that wraps by word without ever splitting a number from its unit.

rich wraps a :class:`~rich.text.Text` at any whitespace, a no-break space included, so "1.2 ms" at the end of a
line became "1.2" / "ms". :class:`Wrapped` wraps at render time, at the console's width, on plain spaces only,
treating a number and the unit after it (:data:`UNIT`) as one word; styles of the Text are kept. A word wider
than the line (a kernel name) is folded, as rich does.
"""

from __future__ import annotations

import re

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.text import Text

# Units (and counted nouns) that follow a number in the reports: "1.2 ms", "62.0 %", "3,107 GB/s", "1.07x",
# "412 kernels". The space before them is not a break point.
UNIT = (r"(?:%|ms|µs|us|ns|s|GB/s|TB/s|GB|MB|kB|B|x|×|tokens?|kernels?|launches|steps?|runs?|programs?|tasks?"
        r"|values?|checks?|bins?|files?|ranks?|SMs|bytes|MHz|columns?)(?![\w/])")
_GLUE = re.compile(r"(?<=[\d.])[ \u00a0](?=" + UNIT + ")")
_WORD = re.compile(r"[^ \n]+")


def glue_units(text: str) -> str:
    """``text`` with the space between each number and its unit made a no-break space (U+00A0), same length."""
    return _GLUE.sub("\u00a0", text)


def break_points(text: str, width: int) -> list[tuple[int, int]]:
    """``(start, end)`` offsets of each line of ``text`` wrapped greedily at ``width`` columns (≥ 1) on plain
    spaces and newlines, a number and its unit kept together; a word longer than ``width`` is cut into pieces
    of ``width``. Lines hold no leading or trailing spaces."""
    width = max(1, width)
    glued = glue_units(text)
    lines: list[tuple[int, int]] = []
    pos = 0
    for para in glued.split("\n"):
        p0, p1 = pos, pos + len(para)
        pos = p1 + 1
        start = end = None
        for word in _WORD.finditer(glued, p0, p1):
            ws, we = word.span()
            while we - ws > width:  # fold a word wider than the line
                if start is not None:
                    lines.append((start, end))
                    start = None
                lines.append((ws, ws + width))
                ws += width
            if start is None:
                start, end = ws, we
            elif we - start <= width:
                end = we
            else:
                lines.append((start, end))
                start, end = ws, we
        lines.append((start, end) if start is not None else (p0, p0))
    return lines


class Wrapped:
    """A rich renderable: ``text`` (a str or a styled :class:`~rich.text.Text`) wrapped at the console's width by
    :func:`break_points`, every line indented by ``indent`` spaces and continuation lines by ``hang`` more."""

    def __init__(self, text: Text | str, hang: int = 0, style: str = "", indent: int = 0) -> None:
        self.text = text if isinstance(text, Text) else Text(str(text), style=style)
        self.hang, self.indent = hang, indent

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = max(1, options.max_width - self.indent)
        first = True
        for start, end in _lines(self.text.plain, width, self.hang):
            line = self.text[start:end]
            pad = self.indent + (self.hang if not first else 0)
            if pad:  # spaces before the line, none after it (rich's Padding fills lines to the full width)
                line = Text(" " * pad) + line
            line.no_wrap, line.overflow, line.end = True, "crop", "\n"
            first = False
            yield line

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        # narrowest: the longest word (a number with its unit is one); widest: the text on one line
        plain = glue_units(self.text.plain)
        longest = max((len(w) for w in _WORD.findall(plain)), default=0) + self.indent + self.hang
        widest = max((len(line) for line in plain.split("\n")), default=0) + self.indent
        return Measurement(min(longest, options.max_width), min(widest, options.max_width))


def _lines(plain: str, width: int, hang: int) -> list[tuple[int, int]]:
    """Lines of ``plain``: the first at ``width``, the rest at ``width - hang``."""
    first = break_points(plain, width)
    if not hang or len(first) <= 1:
        return first
    head = first[0]
    rest = break_points(plain[head[1]:].lstrip(" "), max(1, width - hang))
    offset = len(plain) - len(plain[head[1]:].lstrip(" "))
    return [head] + [(s + offset, e + offset) for s, e in rest]
