"""Figures of a ``diagnose trace`` summary: GPU busy against idle per decode step, per file and per rank.

Pure, like :mod:`.plots` (with the figure functions of :mod:`.figure_base`): each function reads the summary's rows and returns a
new Figure, or None when there is nothing to draw. Times are the summary's µs, drawn in ms.
"""

from __future__ import annotations

from .figure_base import label as _label
from .figure_base import new_figure as _new_figure

_BUSY, _NCCL, _IDLE, _WALL = "#4c72b0", "#dd8452", "#c8c8c8", "#222222"


def _legend(ax, **kw) -> None:
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, **kw)


def _step_axis(ax) -> None:
    """Whole step numbers only on the x axis."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def step_busy_figure(rows: list[dict]):
    """One stacked bar per step of a file's ``step_rows``: GPU busy (union of its activities) and GPU idle (span −
    busy), in ms, with the CPU step's wall time as a tick; warm-up steps (``--skip-steps``) are drawn faded. None
    when no step has GPU activity."""
    rows = [r for r in rows if r.get("busy_us") is not None and r.get("span_us") is not None]
    if not rows:
        return None
    fig, (ax,) = _new_figure(2.8)
    x = [r["step"] for r in rows]
    busy = [r["busy_us"] / 1e3 for r in rows]
    idle = [(r["span_us"] - r["busy_us"]) / 1e3 for r in rows]
    from matplotlib.colors import to_rgba

    alpha = [0.35 if r.get("warmup") else 1.0 for r in rows]
    ax.bar(x, busy, color=[to_rgba(_BUSY, a) for a in alpha], label="GPU busy")
    ax.bar(x, idle, bottom=busy, color=[to_rgba(_IDLE, a) for a in alpha], label="GPU idle (span − busy)")
    walls = [(r["step"], r["wall_us"] / 1e3) for r in rows if r.get("wall_us") is not None]
    if walls:
        ax.scatter(*zip(*walls), marker="_", s=200, color=_WALL, label="CPU step wall time", zorder=3)
    ax.set_xlabel("decode step" + (" (faded: warm-up, left out of the step figures)"
                                   if any(r.get("warmup") for r in rows) else ""))
    ax.set_ylabel("ms")
    _step_axis(ax)
    _legend(ax)
    return fig


def rank_steps_figure(section: dict | None):
    """One panel per rank of a ``ranks`` section: per step, stacked NCCL time, the rest of the GPU busy time
    (compute not overlapping NCCL) and GPU idle (span − busy), in ms. None without a section or rows."""
    rows = [r for r in (section or {}).get("rank_steps") or []
            if all(r.get(k) is not None for k in ("busy_us", "span_us", "nccl_us"))]
    if not rows:
        return None
    ranks = sorted({r["rank"] for r in rows})
    fig, axes = _new_figure(0.6 + 1.5 * len(ranks), rows=len(ranks), sharex=True, sharey=True)
    for ax, rank in zip(axes, ranks):
        mine = [r for r in rows if r["rank"] == rank]
        x = [r["step"] for r in mine]
        nccl = [r["nccl_us"] / 1e3 for r in mine]
        compute = [(r["busy_us"] - r["nccl_us"]) / 1e3 for r in mine]
        idle = [(r["span_us"] - r["busy_us"]) / 1e3 for r in mine]
        ax.bar(x, compute, color=_BUSY, label="compute (GPU busy outside NCCL)")
        ax.bar(x, nccl, bottom=compute, color=_NCCL, label="NCCL")
        ax.bar(x, idle, bottom=[c + n for c, n in zip(compute, nccl)], color=_IDLE, label="GPU idle (span − busy)")
        ax.set_ylabel(_label(f"rank {rank}\nms"), fontsize=8)
    axes[-1].set_xlabel("decode step (after --skip-steps)")
    _step_axis(axes[-1])
    _legend(axes[0])
    return fig
