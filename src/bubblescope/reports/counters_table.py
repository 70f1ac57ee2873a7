"""The hardware-counter section (``counters``, from ``diagnose model --counters``) as rows both reports show, and
as a rich table that fits an 80-column terminal.

Pure functions of the document's section: ncu metric names are kept whole (their underscores and dots are how
Nsight Compute names them, and how a reader searches its documentation); numbers carry their units.
"""

from __future__ import annotations

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from .layout import Wrapped
from .tables import MISSING, fmt, us
from ..wording import count

# (header, ncu metric name, unit shown after the value). ncu reports these in percent and registers.
COLUMNS = (("DRAM % peak", "dram__throughput.avg.pct_of_peak_sustained_elapsed", "%"),
           ("L2 hit", "lts__t_sector_hit_rate.pct", "%"),
           ("warps active", "sm__warps_active.avg.pct_of_peak_sustained_active", "%"),
           ("regs", "launch__registers_per_thread", ""))
HEADERS = ("engine", "kernel", "launches", "time", *(h for h, _, _ in COLUMNS), "top stall (% of active warps)")
KERNELS_SHOWN = 3


def _pct(value) -> str:
    return MISSING if value is None else f"{value:.1f} %"


def top_stall(kernel: dict) -> str:
    """The largest warp-stall reason of a kernel with its share, ``long_scoreboard 21.6 %`` (the ncu reason name
    as written), or "—"."""
    stalls = kernel.get("stalls") or {}
    if not stalls:
        return MISSING
    name, pct = max(stalls.items(), key=lambda kv: (kv[1] if kv[1] is not None else -1))
    return f"{name} {_pct(pct)}"


def counter_rows(section: dict | None) -> list[list[str]]:
    """One row of :data:`HEADERS` per profiled kernel (the first :data:`KERNELS_SHOWN` of each engine), and one
    ``[engine, "unavailable: <reason>", ...]`` row per engine whose counters could not be read."""
    out = []
    for e in (section or {}).get("engines") or []:
        if not e.get("available"):
            out.append([str(e.get("engine")), f"unavailable: {e.get('reason')}"] + [""] * (len(HEADERS) - 2))
            continue
        for k in (e.get("kernels") or [])[:KERNELS_SHOWN]:
            m = k.get("metrics") or {}
            cells = [_pct(m.get(metric)) if unit == "%" else fmt(m.get(metric), "count") for _, metric, unit in COLUMNS]
            out.append([str(e.get("engine")), str(k.get("name")), fmt(k.get("launches"), "count"),
                        us(k.get("duration_us")), *cells, top_stall(k)])
    return out


def provenance(section: dict | None) -> str | None:
    """Which run the counters come from, in words: ncu profiles ``bubblescope generate`` in a subprocess, a
    workload other than the timed runs (its prompt and new tokens from the recorded command), after skipping
    ``launch_skip`` launches; None without a profiled engine."""
    engines = [e for e in (section or {}).get("engines") or [] if e.get("available")]
    if not engines:
        return None
    argv = [str(a) for a in engines[0].get("command") or []]

    def after(flag: str) -> str | None:
        return argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else None

    ids, new = after("--prompt-ids"), after("--max-new-tokens")
    workload = ", ".join(p for p in (
        count(len(ids.split(",")), "prompt token") if ids else None,
        count(int(new), "new token") if new and new.isdigit() else None) if p)
    skips = sorted({e.get("launch_skip") for e in engines if e.get("launch_skip") is not None})
    skipped = f", after skipping {'/'.join(f'{s:,}' for s in skips)} launches" if skips else ""
    return (f"Counters come from a separate run: Nsight Compute (ncu) profiled `bubblescope generate` of each engine"
            f"{' (' + workload + ')' if workload else ''}{skipped}, not the timed runs above; each kernel is "
            "replayed once per counter pass. Top stall: the warp-stall reason with the largest share of active warps.")


def counters_renderable(section: dict):
    """The counters section for a rich console: the reason when unavailable, else a table with one heading row per
    engine and under it its kernels (names shortened, :func:`~.kernel_names.short_kernel_name`, and folded; their
    top stall on a line of their own), the numbers in columns that never wrap; then where the counters come from.
    Fits 80 columns."""
    from .kernel_names import short_kernel_name

    if not section.get("available"):
        return Wrapped(f"Hardware counters (ncu): unavailable — {section.get('reason')}", hang=2)
    table = Table(box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False, show_edge=False)
    headers = ("engine / kernel / top stall", "time", "DRAM\n% peak", "L2\nhit", "warps\nactive",
               "regs")
    for i, h in enumerate(headers):
        table.add_column(h, justify="left" if i == 0 else "right", no_wrap=i != 0, overflow="fold",
                         ratio=1 if i == 0 else None)
    engine = None
    for row in counter_rows(section):
        name, kernel, _launches, time, *metrics, stall = row
        if name != engine:
            engine = name
            if not kernel.startswith("unavailable: "):
                table.add_row(Text(name, style="bold"))
        if kernel.startswith("unavailable: "):
            table.add_row(Wrapped(Text(f"{name}: {kernel}", style="dim"), hang=2))
            continue
        cell = Text.assemble(f"  {short_kernel_name(kernel)}", ("\n    top stall: " + stall) if stall != MISSING else "")
        table.add_row(cell, time, *metrics)
    parts = [Text("Hardware counters (ncu), top kernels", style="bold"), table]
    line = provenance(section)
    if line:
        parts.append(Wrapped(Text(line, style="dim")))
    return Group(*parts)
