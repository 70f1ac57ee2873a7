"""Terminal view (rich) of the multi-rank section of ``diagnose trace`` (``profiler.trace.ranksummary``)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import trace_tables as tt
from .layout import Wrapped

STEPS_SHOWN = 16  # the per-step tables keep their head; the medians cover every step


def _table(title: str, headers: tuple[str, ...], rows: list[list[str]]) -> Table:
    """A boxed table of right-aligned columns whose cells never wrap (headers may hold a line break): the rank
    tables are split so that each fits an 80-column terminal."""
    table = Table(title=title, title_justify="left")
    for h in headers:
        table.add_column(h, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    return table


def render_ranks(section: dict | None, console: Console) -> None:
    """Print the ``ranks`` dict, in tables that each fit 80 columns: per rank, its decode window (GPU, kernels,
    busy, span, bubble ratio, NCCL share) then its per-step medians (compute and NCCL time per step, steps where
    it was the slowest); the median cross-rank skews and NCCL share; per step (the first :data:`STEPS_SHOWN`),
    its timing across ranks (start and end skew, span, the first rank to start, the last to start, the last to
    end) then compute and NCCL (slowest rank, compute skew, NCCL share range); then the section's warnings.
    A per-step rank where ranks tie shows as "tie". Nothing when ``section`` is None."""
    if not section:
        return
    console.rule(Text(tt.ranks_title(section)), align="left")
    console.print(_table("Per rank (decode window)", tt.RANK_WINDOW_HEADERS, tt.rank_window_rows(section)))
    console.print(_table("Per rank, median per step", tt.RANK_MEDIAN_HEADERS, tt.rank_median_rows(section)))
    for line in tt.rank_median_lines(section):
        console.print(Wrapped(line, hang=2))
    console.print(_table("Per step, across ranks: timing", tt.RANK_TIMING_HEADERS,
                         tt.rank_timing_rows(section, STEPS_SHOWN)))
    console.print(_table("Per step, across ranks: compute and NCCL", tt.RANK_WORK_HEADERS,
                         tt.rank_work_rows(section, STEPS_SHOWN)))
    for w in section.get("warnings") or []:
        console.print(Wrapped(Text(f"warning: {w}", style="yellow"), hang=2))
