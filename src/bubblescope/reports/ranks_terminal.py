"""Terminal view (rich) of the multi-rank section of ``diagnose trace`` (``profiler.ranksummary``)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .tables import fmt
from .trace_terminal import _us
from ..wording import count

STEPS_SHOWN = 16  # the per-step tables keep their head; the medians cover every step
TIE = "tie"       # a per-step rank column where two or more ranks tie (null in the JSON)


def _table(title: str, headers: list[str]) -> Table:
    """A boxed table of right-aligned columns whose cells never wrap (headers may hold a line break): the rank
    tables are split so that each fits an 80-column terminal."""
    table = Table(title=title, title_justify="left")
    for h in headers:
        table.add_column(h, justify="right", no_wrap=True)
    return table


def _rank(step: dict, key: str) -> str:
    """A per-step rank cell: the rank, or :data:`TIE` when the ranks tie for it (``None`` in a step that some
    ranks share: ``cross_rank_steps`` names no rank then)."""
    value = step.get(key)
    return TIE if value is None else fmt(value, "count")


def render_ranks(section: dict | None, console: Console) -> None:
    """Print the ``ranks`` dict, in tables that each fit 80 columns: per rank, its decode window (GPU, kernels,
    busy, span, bubble ratio, NCCL share) then its per-step medians (compute and NCCL time per step, steps where
    it was the slowest); the median cross-rank skews and NCCL share; per step (the first :data:`STEPS_SHOWN`),
    its timing across ranks (start and end skew, span, the first rank to start, the last to start, the last to
    end) then compute and NCCL (slowest rank, compute skew, NCCL share range); then the section's warnings.
    A per-step rank where ranks tie shows as "tie". Nothing when ``section`` is None."""
    if not section:
        return
    console.rule(Text(f"{section['world_size']} ranks, marker {section['step_marker']!r}, "
                      f"{count(section['steps'], 'step')} compared"), align="left")
    window = _table("Per rank (decode window)", ["rank", "GPU", "kernels", "busy", "span", "bubble\nratio",
                                                  "NCCL\nshare"])
    medians = _table("Per rank, median per step", ["rank", "compute\nper step", "NCCL\nper step",
                                                    "slowest\nin"])
    for r in section["per_rank"]:
        window.add_row(str(r["rank"]), fmt(r.get("device"), "count"), fmt(r.get("kernels"), "count"),
                       _us(r.get("busy_us")), _us(r.get("span_us")), fmt(r.get("bubble_ratio"), "ratio"),
                       fmt(r.get("nccl_share"), "pct"))
        medians.add_row(str(r["rank"]), _us(r.get("compute_us_per_step")), _us(r.get("nccl_us_per_step")),
                        count(r.get("slowest_steps", 0), "step"))
    console.print(window)
    console.print(medians)
    m = section.get("median") or {}
    console.print(f"median skew over steps: start {_us(m.get('start_skew_us'))}, end {_us(m.get('end_skew_us'))}, "
                  f"compute {_us(m.get('compute_skew_us'))}")
    console.print(f"median NCCL share of a rank's step: {fmt(m.get('nccl_share'), 'pct')}")
    timing = _table("Per step, across ranks: timing", ["step", "start\nskew", "end\nskew", "span",
                                                         "first\nstart", "last\nstart", "last\nend"])
    work = _table("Per step, across ranks: compute and NCCL", ["step", "slowest\nrank", "compute\nskew",
                                                                 "NCCL share\nmin–max"])
    for s in section["per_step"][:STEPS_SHOWN]:
        timing.add_row(str(s["step"]), _us(s.get("start_skew_us")), _us(s.get("end_skew_us")), _us(s.get("span_us")),
                       _rank(s, "first_start_rank"), _rank(s, "last_start_rank"), _rank(s, "last_end_rank"))
        work.add_row(str(s["step"]), _rank(s, "slowest_rank"), _us(s.get("compute_skew_us")),
                     f"{fmt(s.get('nccl_share_min'), 'pct')}–{fmt(s.get('nccl_share_max'), 'pct')}")
    console.print(timing)
    console.print(work)
    for w in section.get("warnings") or []:
        console.print(Text(f"warning: {w}", style="yellow"))
