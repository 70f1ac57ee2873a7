"""Terminal view (rich) of a tensor-parallel run's ``tp.json`` (``bubblescope.tp/1``)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .layout import Wrapped
from .ranks_terminal import render_ranks
from .tables import fmt
from .tables import us as _us


def render_tp(doc: dict, console: Console) -> None:
    """Print the engine's latency and per-rank bandwidth, the collectives and what bounds the step, the
    multi-rank timeline summary (:func:`render_ranks`) and the findings. None shows as "—"."""
    (eng,) = doc["engines"]
    lat, bw, tp = eng.get("latency") or {}, eng.get("bandwidth") or {}, eng.get("tp") or {}
    console.rule(Text(f"{eng['name']}: {doc['model']['name']} on {doc['world_size']} ranks "
                      f"({doc['device'].get('name') or doc['device']['type']}, {doc['device']['backend']})"),
                 align="left")
    table = Table(show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("p50 / p99 ms per token", f"{fmt(lat.get('token_ms_p50'), 'ms')} / {fmt(lat.get('token_ms_p99'), 'ms')}"),
        ("bytes per step per rank", fmt(tp.get("rank_bytes_per_step"), "bytes")),
        ("effective GB/s per rank (% of peak)",
         f"{fmt(bw.get('effective_GBps'), 'gbps')} ({fmt(bw.get('util_peak'), 'pct')})"),
        ("all-reduces per step × payload", f"{tp.get('allreduce_count')} × "
                                           f"{fmt((tp.get('allreduce_bytes') or 0) / max(tp.get('allreduce_count') or 1, 1), 'bytes')}"),
        ("NCCL time per step (rank that waited least)", _us(tp.get("nccl_us_per_step"))),
        ("achieved bus bandwidth", f"{fmt(tp.get('bus_GBps'), 'gbps')} GB/s"),
        ("HBM floor per rank (at NVML peak)", _us(tp.get("hbm_floor_us"))),
        ("step bounded by", str(tp.get("bound") or "—")),
    ]
    for label, value in rows:
        table.add_row(label, value)
    console.print(table)
    render_ranks(doc.get("ranks"), console)
    for note in doc.get("notes") or []:
        console.print(Wrapped(Text(f"note: {note}", style="yellow"), hang=2))
    for f in doc.get("findings") or []:
        console.print(Wrapped(f"{f['severity']}: {f['title']} — {f['advice']}", hang=2))
