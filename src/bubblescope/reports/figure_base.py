"""What every figure of the reports is built with: a constrained-layout ``matplotlib.figure.Figure`` on the Agg
canvas (no pyplot, no global state; matplotlib imported on first use), names made safe for matplotlib's text,
readable axes (plain-number ticks, log axes across decades), bars drawn in bulk, legends that stay in the image,
and PNG output.
"""

from __future__ import annotations

import io

_DPI = 100
_SAVE_DPI = 200  # high-DPI PNG: sharp on a 2x screen and when zoomed
_WIDTH_IN = 10.0
DECADE = 10  # data spanning this factor or more is drawn on a log axis: a linear one crushes the small values


def new_figure(height_in: float, rows: int = 1, cols: int = 1, **subplot_kw):
    """A new Figure :data:`_WIDTH_IN` inches wide and ``height_in`` high with a ``rows`` × ``cols`` grid of axes
    (``subplot_kw`` to ``Figure.subplots``); returns ``(figure, [axes in row order])``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(_WIDTH_IN, height_in), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False, **subplot_kw)
    return fig, [ax for row in axes for ax in row]


def label(text) -> str:
    """``text`` as matplotlib shows it literally: names come from traces, and a "$" would switch to mathtext."""
    return str(text).replace("$", r"\$")


def plain(value, _pos=None) -> str:
    """A tick label as a plain number (``4,096``, ``0.5``), never ``2^12`` or ``10^3``."""
    return f"{value:,.0f}" if value >= 10 or float(value).is_integer() else f"{value:.3g}"


def ticks_at(ax, axis: str, values) -> None:
    """Major ticks of ``axis`` ("x" or "y") exactly at ``values`` (the contexts or knob values measured), labelled
    as plain numbers, no minor ticks: a log-2 axis otherwise reads 2^7, 2^10, 2^12."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_locator(FixedLocator(sorted(set(values))))
    target.set_major_formatter(FuncFormatter(plain))
    target.set_minor_locator(NullLocator())


def log_axis(ax, axis: str) -> None:
    """Put ``axis`` on a log-10 scale with ticks at 1, 2 and 5 of each decade, labelled as plain numbers."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(FuncFormatter(plain))
    target.set_minor_formatter(NullFormatter())


def spans_decades(values) -> bool:
    """True when the positive ``values`` span a factor of :data:`DECADE` or more."""
    pos = [v for v in values if v is not None and v > 0]
    return bool(pos) and max(pos) / min(pos) >= DECADE


def bars(ax, left, width, y, height, colours) -> None:
    """Draw many rectangles as one collection (thousands of tasks stay fast)."""
    from matplotlib.collections import PolyCollection

    verts = [((x, b), (x + w, b), (x + w, b + height), (x, b + height)) for x, w, b in zip(left, width, y)]
    ax.add_collection(PolyCollection(verts, facecolors=colours, edgecolors="none", linewidths=0))
    ax.autoscale_view()


def patches(colours: dict) -> list:
    """Legend handles: one coloured patch per ``{name: colour}``."""
    from matplotlib.patches import Patch

    return [Patch(color=c, label=label(n)) for n, c in colours.items()]


def legend(ax, colours: dict, **kw) -> None:
    """A legend of ``{name: colour}`` patches on ``ax`` (``kw`` to ``Axes.legend``)."""
    ax.legend(handles=patches(colours), fontsize=8, **kw)


def figure_legend(fig, handles, where: str = "lower", ncol: int = 4) -> None:
    """One legend for the whole figure, in a band of its own above or below the axes (constrained layout makes
    room for it), so it is never clipped by the image's edge nor drawn over the data."""
    if handles:
        fig.legend(handles=handles, fontsize=8, loc=f"outside {where} center", ncol=max(1, min(len(handles), ncol)),
                   frameon=False)


def figure_png(fig) -> bytes:
    """Render a Figure to PNG bytes (Agg)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_SAVE_DPI)
    return buf.getvalue()


