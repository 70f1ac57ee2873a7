"""Terminal view (rich) of the multi-rank section of ``diagnose trace`` (``profiler.ranksummary``)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import trace_tables as tt

STEPS_SHOWN = 16  # the per-step table keeps its head; the medians cover every step


def _table(title: str, headers: tuple[str, ...], rows: list[list[str]]) -> Table:
    table = Table(title=title, title_justify="left")
    for h in headers:
        table.add_column(h, justify="right")
    for row in rows:
        table.add_row(*row)
    return table


def render_ranks(section: dict | None, console: Console) -> None:
    """Print the ``ranks`` dict: one row per rank (busy, span, bubble ratio, NCCL share, compute and NCCL
    time per step, steps where it was the slowest), the median cross-rank skews, then one row per step
    (start/end skew, slowest rank, compute skew, NCCL share range) and the section's warnings. Nothing
    when ``section`` is None."""
    if not section:
        return
    console.rule(Text(tt.ranks_title(section)), align="left")
    console.print(_table("Per rank (decode window)", tt.RANK_HEADERS, tt.rank_rows(section)))
    console.print(tt.rank_median_line(section))
    console.print(_table("Per step, across ranks", tt.RANK_STEP_HEADERS, tt.rank_step_rows(section, STEPS_SHOWN)))
    for w in section.get("warnings") or []:
        console.print(Text(f"warning: {w}", style="yellow"))
