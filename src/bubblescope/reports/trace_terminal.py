"""Terminal view (rich) of a ``bubblescope.trace/1`` summary, as ``diagnose trace`` prints it."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from . import trace_tables as tt
from .layout import Wrapped
from .trace_result import CPU_ONLY, is_no_gpu_reason

NAME_WIDTH = 72  # kernel names are C++ templates of hundreds of characters; the head identifies them
TOP_SHOWN = 10
TIME_COLUMNS = ("busy", "span", "total", "per step")
TEXT_COLUMNS = ("name", "category", "operator")  # fold over lines; the others never wrap
NAME_COLUMNS = ("name", "operator")  # take the width the other columns leave


def _short(name: str, wide: bool = False) -> Text:
    name = " ".join(str(name).split())
    return Text(name if wide or len(name) <= NAME_WIDTH else name[: NAME_WIDTH - 1] + "…")


def _table(title: str, headers: list[str], name_width: int = NAME_WIDTH) -> Table:
    table = Table(title=title, title_justify="left")
    for i, header in enumerate(headers):
        # A long kernel name folds onto more lines (names that differ only in their tail stay apart); numbers
        # and times ("66.14 ms") never wrap.
        table.add_column(
            header,
            justify="left" if i == 0 or header in TEXT_COLUMNS else "right",
            no_wrap=header not in TEXT_COLUMNS,
            overflow="fold" if header in TEXT_COLUMNS else "ellipsis",
            min_width=min(24, name_width) if header in NAME_COLUMNS else (9 if header in TIME_COLUMNS else None),
            ratio=1 if header in NAME_COLUMNS else None,
        )
    return table


def _devices(devices: list[dict]) -> list[Table]:
    """Two narrow tables (activity, then idle split), so both fit an 80-column terminal."""
    activity = _table("GPU activity per device (whole trace)", list(tt.DEVICE_HEADERS))
    idle = _table(tt.idle_title(devices), list(tt.IDLE_HEADERS))
    for row in tt.device_rows(devices):
        activity.add_row(*row)
    for row in tt.idle_rows(devices):
        idle.add_row(*row)
    return [activity, idle]


def _rows_table(title: str, rows: list[tuple[str, str]], justify: str = "right") -> Table:
    # Titles and values may hold user input or names from traces ("[/]" would be rich markup): Text prints them
    # literally.
    table = Table(title=Text(title), title_justify="left", show_header=False)
    table.add_column("metric")
    table.add_column("value", justify=justify, overflow="fold")
    for label, value in rows:
        table.add_row(escape(label), Text(value))
    return table


def _bandwidth(bw: dict, console: Console) -> None:
    """The verdict (the distance from the floor first), then what it is computed from."""
    if bw.get("verdict"):
        console.print(Text.assemble(("Bandwidth: ", "bold"), bw["verdict"]))
    elif bw.get("reason"):
        console.print(Text(f"Bandwidth: {bw['reason']}"))
        return
    console.print(_rows_table("Bandwidth against the floor (median measured step)", tt.bandwidth_rows(bw), "left"))


def _breakdown(title: str, rows: list[dict], with_name: bool, width: int, wide: bool = False) -> Table:
    # The name gets what the other columns (category, count 5, total 9, share 7) and borders (16) leave.
    category = max([len("category")] + [len(str(r.get("category"))) for r in rows])
    headers = (["name"] if with_name else []) + ["category", "count", "total", "share"]
    table = _table(title, headers, name_width=min(NAME_WIDTH, width - category - 37))
    for row in tt.breakdown_rows(rows, with_name):
        names = [_short(row[0], wide)] if with_name else []
        table.add_row(*names, Text(row[len(names)]), *row[len(names) + 1:])
    return table


def _host_ops(host_ops: dict, console: Console, wide: bool) -> None:
    """Host time per decode step by top-level CPU operator, or the one line saying why there is none."""
    title = tt.host_ops_title(host_ops)
    if not host_ops.get("rows"):
        console.print(Wrapped(Text(f"{title}: unavailable ({host_ops.get('reason')})"), hang=2))
        return
    table = _table(title, list(tt.HOST_OP_HEADERS))
    for name, *rest in tt.host_op_rows(host_ops):
        table.add_row(_short(name, wide), *rest)
    console.print(table)
    console.print(Wrapped(Text(tt.host_ops_note(host_ops)), hang=0))


def render_trace_summary(summary: dict, console: Console, wide: bool = False) -> None:
    """Print a :func:`bubblescope.profiler.trace.summary.summarize_traces` result to ``console``.

    Per file: a header (path, rank, step marker), a device table (kernels, memcpys, memsets,
    streams, busy/span, bubble ratio, idle split with shares), the decode-step metrics when steps
    were found (or why they are unavailable), the top kernels and categories (of the decode steps
    when available, else of each device), the host time per step by CPU operator (host-bound steps only),
    and the file's warnings. Names are printed literally (no rich markup), folded over lines and cut to
    ``NAME_WIDTH`` characters unless ``wide``; None shows as "—".
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
        detection = f.get("step_detection") or {}
        if steps is not None:
            console.print(_rows_table(tt.steps_title(f), tt.step_metric_rows(steps)))
            if detection.get("method") not in (None, "marker"):
                console.print(Text(detection.get("description") or ""))
        if f.get("bandwidth"):
            _bandwidth(f["bandwidth"], console)
        if f.get("graphs"):
            console.print(_rows_table(f"CUDA-graph replays (device {f['graphs'].get('device')})",
                                      tt.graph_rows(f["graphs"])))
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
            if f.get("host_ops"):
                _host_ops(f["host_ops"], console, wide)
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
            console.print(Wrapped(Text(f"warning: {w}", style="yellow"), hang=2))


def render_trace_findings(findings: list[dict], console: Console) -> None:
    """Print the findings of :func:`~bubblescope.reports.trace_findings.find_trace` (severity, file, title;
    evidence; action; the severities' legend), or one line saying none fired."""
    from .terminal import findings_group
    from .trace_findings import TRACE_SEVERITIES, finding_subject

    if findings:
        console.print(findings_group(findings, finding_subject, list(TRACE_SEVERITIES.items())))
    else:
        console.print(Text("Findings: none (no rule fired, or the inputs were not measured)"))
