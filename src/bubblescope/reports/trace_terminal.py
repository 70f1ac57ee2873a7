"""Terminal view (rich) of a ``bubblescope.trace/1`` summary, as ``diagnose trace`` prints it."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..profiler.timeline import CPU_ONLY, is_no_gpu_reason
from .tables import MISSING, fmt

NAME_WIDTH = 72  # kernel names are C++ templates of hundreds of characters; the head identifies them
TOP_SHOWN = 10
IDLE_PARTS = ("host_wait", "kernel_wait", "other")
TIME_COLUMNS = ("busy", "span", "total")


def _short(name: str, wide: bool = False) -> Text:
    name = " ".join(str(name).split())
    return Text(name if wide or len(name) <= NAME_WIDTH else name[: NAME_WIDTH - 1] + "…")


def _us(value) -> str:
    """µs with the unit that keeps 3-4 significant digits readable (µs, ms or s); from 10,000 s on (a corrupt
    ``dur`` such as 1e15) in powers of ten ("1.00e+09 s"), as wide as "9,999.99 s", so the tables keep their
    80-column layout."""
    if value is None:
        return MISSING
    if abs(value) >= 1e10:
        return f"{value / 1e6:.2e} s"
    for unit, size in (("s", 1e6), ("ms", 1e3)):
        if abs(value) >= size:
            return f"{value / size:,.2f} {unit}"
    return f"{value:,.1f} µs"


def _table(title: str, headers: list[str], name_width: int = NAME_WIDTH) -> Table:
    table = Table(title=title, title_justify="left")
    for i, header in enumerate(headers):
        # A long kernel name folds onto more lines (names that differ only in their tail stay apart); numbers
        # and times ("66.14 ms") never wrap.
        table.add_column(
            header,
            justify="left" if i == 0 or header in ("name", "category") else "right",
            no_wrap=header not in ("name", "category"),
            overflow="fold" if header in ("name", "category") else "ellipsis",
            min_width=min(24, name_width) if header == "name" else (9 if header in TIME_COLUMNS else None),
            ratio=1 if header == "name" else None,
        )
    return table


def _devices(devices: list[dict]) -> list[Table]:
    """Two narrow tables (activity, then idle split), so both fit an 80-column terminal."""
    activity = _table(
        "GPU activity per device (whole trace)",
        ["GPU", "kernels", "memcpy", "memset", "streams", "busy", "span", "bubble\nratio"],
    )
    idle = _table(
        f"Idle time per device (kernel-wait: gaps < {fmt((devices[0].get('idle') or {}).get('threshold_us'))} µs)",
        ["device", "host-wait", "kernel-wait", "other"],
    )
    for d in devices:
        counts = (fmt(d.get(k), "count") for k in ("kernels", "memcpys", "memsets", "streams"))
        activity.add_row(
            str(d["device"]), *counts, _us(d.get("busy_us")), _us(d.get("span_us")), fmt(d.get("bubble_ratio"), "ratio")
        )
        split = d.get("idle") or {}
        idle.add_row(
            str(d["device"]),
            *(f"{_us(split.get(k + '_us'))} ({fmt(split.get(k + '_share'), 'pct')})" for k in IDLE_PARTS),
        )
    return [activity, idle]


def _steps(steps: dict, marker: str | None) -> Table:
    # The marker is user input ("[/]" would be rich markup): a Text title prints it literally.
    table = Table(title=Text(f"Decode steps (marker {marker!r})"), title_justify="left", show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    idle = steps.get("idle") or {}
    delay = steps.get("launch_delay_us") or {}
    rows = [
        ("measured steps", fmt(steps.get("steps"), "count")),
        ("device", fmt(steps.get("device"))),
        ("step wall time (median)", _us(steps.get("step_wall_us"))),
        ("GPU busy per step (median)", _us(steps.get("gpu_busy_us_per_step"))),
        ("kernels per step", fmt(steps.get("kernels_per_step"), "count")),
        ("launches per step", fmt(steps.get("launches_per_step"), "count")),
        ("launches per s", fmt(steps.get("launches_per_s"), "rate")),
        ("bubble ratio (decode window)", fmt(steps.get("bubble_ratio"), "ratio")),
        ("launch share", fmt(steps.get("launch_share"), "pct")),
        ("sync share", fmt(steps.get("sync_share"), "pct")),
        (
            f"idle per step: host-wait / kernel-wait (<{fmt(idle.get('threshold_us'))} µs) / other",
            " / ".join(_us(idle.get(k)) for k in ("host_wait_us", "kernel_wait_us", "other_us")),
        ),
        ("launch delay p50 / p90 / max", " / ".join(_us(delay.get(k)) for k in ("p50", "p90", "max"))),
        ("max registers per thread", fmt(steps.get("max_registers_per_thread"), "count")),
    ]
    for label, value in rows:
        table.add_row(escape(label), value)
    return table


def _breakdown(title: str, rows: list[dict], with_name: bool, width: int, wide: bool = False) -> Table:
    # The name gets what the other columns (category, count 5, total 9, share 7) and borders (16) leave.
    category = max([len("category")] + [len(str(r.get("category"))) for r in rows])
    headers = (["name"] if with_name else []) + ["category", "count", "total", "share"]
    table = _table(title, headers, name_width=min(NAME_WIDTH, width - category - 37))
    for r in rows:
        cells = [_short(r["name"], wide)] if with_name else []
        table.add_row(
            *cells,
            Text(str(r["category"])),
            fmt(r.get("count"), "count"),
            _us(r.get("total_us")),
            fmt(r.get("share"), "pct"),
        )
    return table


def render_trace_summary(summary: dict, console: Console, wide: bool = False) -> None:
    """Print a :func:`bubblescope.profiler.tracesummary.summarize_traces` result to ``console``.

    Per file: a header (path, rank, step marker), a device table (kernels, memcpys, memsets,
    streams, busy/span, bubble ratio, idle split with shares), the decode-step metrics when steps
    were found (or why they are unavailable), the top kernels and categories (of the decode steps
    when available, else of each device), and the file's warnings. Names are printed literally
    (no rich markup), folded over lines and cut to ``NAME_WIDTH`` characters unless ``wide``; None shows
    as "—".
    """
    for f in summary.get("files") or []:
        rank = "" if f.get("rank") is None else f"  rank {f['rank']}"
        console.rule(Text(f"{f.get('path')}{rank}"), align="left")
        if "error" in f:  # a file that could not be read; the others are still shown
            console.print(Text(f"error: {f['error']}", style="red"))
            continue
        devices = f.get("devices") or []
        no_gpu = next((w for w in f.get("warnings") or [] if is_no_gpu_reason(w)), CPU_ONLY)
        if devices:
            for table in _devices(devices):
                console.print(table)
        elif no_gpu == CPU_ONLY:
            console.print("No GPU activity in this trace (CPU-only run): GPU metrics unavailable.")
        else:  # there was GPU activity, all of it invalid: not a CPU-only run
            console.print(Text(no_gpu[0].upper() + no_gpu[1:] + "."))
        steps = f.get("steps")
        if steps is not None:
            console.print(_steps(steps, f.get("step_marker")))
        if steps is not None and steps.get("available"):
            console.print(
                _breakdown(
                    f"Top kernels in the decode steps (device {steps.get('device')})",
                    (steps.get("top_kernels") or [])[:TOP_SHOWN],
                    True,
                    console.width,
                    wide,
                )
            )
            console.print(
                _breakdown("Kernel categories in the decode steps", steps.get("categories") or [], False, console.width)
            )
        else:
            for d in devices:
                console.print(
                    _breakdown(
                        f"Top kernels, device {d['device']}",
                        (d.get("top_kernels") or [])[:TOP_SHOWN],
                        True,
                        console.width,
                        wide,
                    )
                )
                console.print(
                    _breakdown(
                        f"Kernel categories, device {d['device']}", d.get("categories") or [], False, console.width
                    )
                )
        for w in f.get("warnings") or []:
            if not devices and w == no_gpu:  # said above, with what it means
                continue
            console.print(Text(f"warning: {w}", style="yellow"))
