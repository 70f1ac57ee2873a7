"""The ranks' step timelines on one axis (a Figure; pure, like :mod:`.plots`)."""

from __future__ import annotations

from .figure_base import bars as _bars
from .figure_base import new_figure as _new_figure

_COMPUTE, _NCCL = "#4c72b0", "#dd8452"


def rank_timeline_figure(activities):
    """One row per rank, its GPU activities as bars on the shared time axis (µs from the first step's start):
    NCCL kernels in orange, the rest in blue; a thin line marks each step's extent. ``activities`` is
    :func:`bubblescope.profiler.trace.ranks.rank_activities`'s frame. None when it is empty."""
    if activities is None or activities.empty:
        return None
    ranks = sorted(activities["rank"].unique())
    fig, (ax,) = _new_figure(0.6 + 0.55 * len(ranks))
    row = {r: i for i, r in enumerate(ranks)}
    y = activities["rank"].map(row).to_numpy(dtype=float) - 0.35
    colours = [_NCCL if n else _COMPUTE for n in activities["nccl"]]
    _bars(ax, activities["start_us"].to_numpy(), (activities["end_us"] - activities["start_us"]).to_numpy(),
          y, 0.7, colours)
    for (rank, _), g in activities.groupby(["rank", "step"]):
        ax.hlines(row[rank] + 0.42, g["start_us"].min(), g["end_us"].max(), colors="black", linewidth=1)
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("µs from the first step's start (all ranks on one clock)")
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=_COMPUTE, label="compute"), Patch(color=_NCCL, label="NCCL")],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    return fig
