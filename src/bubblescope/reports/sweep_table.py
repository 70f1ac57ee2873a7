"""The context sweep (``engines[].sweep``) as a table: per engine and context length, p50 ms/token, effective
GB/s and % of the NVML peak. Pure; the terminal prints it, the HTML report shows it under its figure."""

from __future__ import annotations

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from .layout import Wrapped
from .results import ordered
from .tables import MISSING, fmt

HEADERS = ("engine", "context", "p50 ms/tok", "GB/s", "% peak")
NOTE = ("each point: median of the decode steps timed right after a prefill of that many tokens (a short, cold "
        "run), so it can differ from the headline, which pools every token of the timed runs")


def sweep_rows(doc: dict) -> list[list[str]]:
    """One row of :data:`HEADERS` per engine (ladder order) and context (ascending) of the ok engines' sweeps;
    the engine named on its first row only. Empty when no engine has a sweep."""
    out = []
    for eng in ordered(doc.get("engines") or []):
        if eng.get("status") != "ok":
            continue
        pts = sorted((r for r in eng.get("sweep") or [] if isinstance(r.get("context"), int)),
                     key=lambda r: r["context"])
        for i, r in enumerate(pts):
            out.append([str(eng["name"]) if i == 0 else "", f"{r['context']:,}", fmt(r.get("token_ms_p50"), "ms"),
                        fmt(r.get("effective_GBps"), "gbps"), fmt(r.get("util_peak"), "pct")])
    return out


def sweep_renderable(doc: dict):
    """The sweep table for a rich console (numbers never wrap; columns nobody measured, such as GB/s on a CPU,
    left out and named), or None without a sweep."""
    rows = sweep_rows(doc)
    if not rows:
        return None
    keep = [i for i in range(len(HEADERS)) if i < 3 or any(r[i] != MISSING for r in rows)]
    table = Table(box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False, show_edge=False)
    for i in keep:
        table.add_column(HEADERS[i], justify="left" if i == 0 else "right", no_wrap=True)
    for row in rows:
        table.add_row(*(Text(row[i]) for i in keep))
    dropped = [HEADERS[i] for i in range(len(HEADERS)) if i not in keep]
    parts = [Text("Context sweep: ms per token and bandwidth against context length", style="bold"), table,
             Wrapped(Text(NOTE + (f"; not measured: {', '.join(dropped)}" if dropped else ""), style="dim"))]
    return Group(*parts)
