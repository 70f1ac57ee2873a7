"""Terminal view (rich) of the multi-rank section of ``diagnose trace`` (``profiler.ranksummary``)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .tables import fmt
from .trace_terminal import _us
from ..wording import count

STEPS_SHOWN = 16  # the per-step table keeps its head; the medians cover every step


def render_ranks(section: dict | None, console: Console) -> None:
    """Print the ``ranks`` dict: one row per rank (busy, span, bubble ratio, NCCL share, compute and NCCL
    time per step, steps where it was the slowest), the median cross-rank skews, then one row per step
    (start/end skew, slowest rank, compute skew, NCCL share range) and the section's warnings. Nothing
    when ``section`` is None."""
    if not section:
        return
    console.rule(Text(f"{section['world_size']} ranks, marker {section['step_marker']!r}, "
                      f"{count(section['steps'], 'step')} compared"), align="left")
    per_rank = Table(title="Per rank (decode window)", title_justify="left")
    for h in ("rank", "device", "kernels", "busy", "span", "bubble ratio", "NCCL share", "compute/step",
              "NCCL/step", "slowest in"):
        per_rank.add_column(h, justify="right")
    for r in section["per_rank"]:
        per_rank.add_row(str(r["rank"]), fmt(r.get("device"), "count"), fmt(r.get("kernels"), "count"),
                         _us(r.get("busy_us")), _us(r.get("span_us")), fmt(r.get("bubble_ratio"), "ratio"),
                         fmt(r.get("nccl_share"), "pct"), _us(r.get("compute_us_per_step")),
                         _us(r.get("nccl_us_per_step")), count(r.get('slowest_steps', 0), 'step'))
    console.print(per_rank)
    m = section.get("median") or {}
    console.print(f"median over steps: start skew {_us(m.get('start_skew_us'))}, end skew "
                  f"{_us(m.get('end_skew_us'))}, compute skew {_us(m.get('compute_skew_us'))}, "
                  f"NCCL share {fmt(m.get('nccl_share'), 'pct')}")
    steps = Table(title="Per step, across ranks", title_justify="left")
    for h in ("step", "start skew", "end skew", "slowest rank", "compute skew", "span", "NCCL share min–max"):
        steps.add_column(h, justify="right")
    for s in section["per_step"][:STEPS_SHOWN]:
        steps.add_row(str(s["step"]), _us(s.get("start_skew_us")), _us(s.get("end_skew_us")),
                      fmt(s.get("slowest_rank"), "count"), _us(s.get("compute_skew_us")), _us(s.get("span_us")),
                      f"{fmt(s.get('nccl_share_min'), 'pct')}–{fmt(s.get('nccl_share_max'), 'pct')}")
    console.print(steps)
    for w in section.get("warnings") or []:
        console.print(Text(f"warning: {w}", style="yellow"))
