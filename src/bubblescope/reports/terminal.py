"""Terminal report (rich): device and model header, headline table, engines not run, findings."""

from __future__ import annotations

from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from . import quantization, tables
from .counters_table import counters_renderable
from .layout import Wrapped
from .results import Results, ordered
from .sweep_table import sweep_renderable
from .verdict import severity_legend, verdict

# Document text goes into Text objects, never into markup strings: kernel names such as
# "void f<int, 4>()" or "a[b]" and words between colons (emoji codes) must print as they are.
_SEVERITY_STYLE = {"good": "bold green", "problem": "bold red", "warn": "bold yellow", "info": "bold cyan"}


def _engine_table(doc: dict, title: str, columns) -> Group:
    # The title is a line of its own, not the table's: rich wraps a table title at the table's width, which
    # with one short engine name is narrower than the title (it broke at 67 columns on an 80-column terminal).
    table = Table(box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False, show_edge=False)
    names = [str(e.get("name")) for e in doc.get("engines") or []]
    for i, (header, _, kind) in enumerate(columns):
        # Numbers never wrap (a split "1.2284" reads as two numbers), nor does the engine name
        # ("megakernel-noprefetch" split as "megakernel-noprefetc" / "h"): its column is as wide as the longest.
        table.add_column(header, justify="left" if kind == "text" else "right", no_wrap=True, overflow="fold",
                         min_width=max(map(len, names), default=None) if i == 0 else None)
    for eng, row in zip(ordered(doc.get("engines") or []), tables.headline_rows(doc, columns)):
        table.add_row(*map(Text, row), style=None if eng.get("status") == "ok" else "dim")
    return Group(Text(title, style="table.title"), table)


def _quantization(doc: dict, console: Console) -> None:
    """The quantization ablation of an FP8 run (``doc["quantization"]``, from ``report --bf16``, else the FP8 run's
    own rows: accuracy without the bf16 timings)."""
    rows = doc.get("quantization") or quantization.quantization_rows(doc)
    if not rows:
        return
    cells = quantization.formatted_rows(rows)
    # columns nobody measured (% peak on a CPU, bf16 timings without --bf16) left out, and named
    keep = [i for i in range(len(quantization.COLUMNS)) if i == 0 or any(r[i] != tables.MISSING for r in cells)]
    table = Table(box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False, show_edge=False)
    headers = quantization.headers(doc)
    for i in keep:
        kind = quantization.COLUMNS[i][2]
        table.add_column(headers[i], justify="left" if kind == "text" else "right", no_wrap=True)
    for row in cells:
        table.add_row(*(Text(row[i]) for i in keep))
    dropped = [headers[i].replace("\n", " ") for i in range(len(cells[0])) if i not in keep]
    console.print(Group(Text(quantization.title(doc), style="table.title"), table))
    console.print(Wrapped(Text(quantization.note(doc) + (f"; not measured: {', '.join(dropped)}" if dropped else ""),
                               style="dim")))
    if note := quantization.missing_note(rows, doc):
        console.print(Wrapped(Text(note, style="dim")))


def _ladder(doc: dict, console: Console) -> None:
    """The ablation ladder (speed per rung, then numerical fidelity per rung), with the rungs that did not run."""
    rows = tables.ladder_rows(doc)
    if not any(row["token_ms_p50"] is not None for row, _ in rows):
        return  # nothing timed: no rung to compare
    speed = ("Ablation ladder: eager → CUDA graph → compile → fused → fused + PDL → megakernel without prefetch → "
             "megakernel")
    for title, columns, note in ((speed, tables.LADDER_COLUMNS, tables.ladder_note(doc)),
                                 ("What each rung removes, and its numerical fidelity (teacher-forced, against "
                                  "an fp32 run)",
                                  tables.FIDELITY_COLUMNS, tables.fidelity_note(doc))):
        table = Table(box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False, show_edge=False)
        for i, (header, _, kind) in enumerate(columns):
            # numbers and names never wrap; the mechanism words may
            table.add_column(header, justify="left" if kind == "text" else "right", no_wrap=kind != "text" or i == 0,
                             min_width=max(len(r["engine"]) for r, _ in rows) if i == 0 else None,
                             ratio=1 if kind == "text" and i > 0 else None)
        for row, cells in tables.ladder_rows(doc, columns):
            table.add_row(*map(Text, cells), style=None if row["status"] == "ok" else "dim")
        console.print(Group(Text(title, style="table.title"), table))
        if note:
            console.print(Text(note, style="dim"))
    missing = tables.rungs_not_run(rows)
    if missing:
        console.print(Text("Rungs not run: " + "; ".join(missing), style="dim"))


def findings_group(findings: list[dict], subject, legend: list[tuple[str, str]]) -> Group:
    """One block per finding (severity, ``subject(finding)``, title; evidence; action), then the severity
    ``legend``, wrapped by word (:class:`~.layout.Wrapped`: a number never parts from its unit): a five-column
    table at 80 columns split numbers and names mid-word."""
    parts = [Text("Findings", style="bold")]
    for f in findings:
        sev = str(f.get("severity"))
        parts.append(Wrapped(Text.assemble((f"{sev.upper():7s}", _SEVERITY_STYLE.get(sev, "bold")), " ",
                                           (str(subject(f) or tables.MISSING), "bold"), ": ", str(f.get("title"))),
                             hang=8))
        parts.append(Wrapped(f"evidence: {tables.evidence_text(f.get('evidence'))}", hang=2, indent=2))
        parts.append(Wrapped(f"action: {f.get('advice')}", hang=2, indent=2))
    parts.append(Wrapped(Text("severity: " + "; ".join(f"{k} = {v}" for k, v in legend), style="dim")))
    return Group(*parts)


def _verdict(doc: dict):
    v = verdict(doc)
    if v is None:
        return Text("Verdict: no engine measured a latency", style="bold")
    body = Group(Wrapped(v["text"]), Wrapped(Text.assemble(("Action: ", "bold"), v["action"])))
    return Panel(body, title="Verdict", title_align="left")


def render_results(results: Results | dict, console: Console) -> None:
    """Print a results document to a rich console.

    Shows: which device it ran on (plainly "CPU only — GPU metrics unavailable" without a GPU), model,
    workload and command; the headline tables (ms/token p50/p99, tok/s, TTFT ms, effective GB/s,
    % of NVML peak and of measured copy bandwidth; kernels and launches per step, bubble ratio,
    launch/sync share, token agreement); each megakernel's implementation and tile shapes, and where present its
    weight stream's feed over the attention chain and the MLP; skipped/failed engines
    with reasons; findings with evidence.
    Values are read from the document only; null shows as "—". Document text prints literally (no
    rich markup or emoji codes are interpreted), so ``void f<int, 4>()`` or ``[bold]`` show as written.

    Args:
        results: a :class:`Results` or its document dict (assumed valid; see ``load_results``).
        console: where to print (``Console(record=True)`` captures it).
    """
    doc = results.doc if isinstance(results, Results) else results
    if not doc.get("engines"):  # no engine: nothing measured, and any findings could only be stale
        console.print(Text("Nothing to report: the results hold no engine", style="bold"))
        return
    header = Group(
        Wrapped(Text(tables.device_line(doc), style="bold"), hang=2),
        Wrapped(f"Model: {tables.model_line(doc)}", hang=2),
        Wrapped(f"Workload: {tables.workload_line(doc)}", hang=2),
        Wrapped(f"Command: {doc.get('command')}  ({doc.get('created')})", hang=2),
    )
    console.print(_verdict(doc))
    console.print(Panel(header, title="bubblescope results", title_align="left", expand=False))
    for note in (doc.get("device") or {}).get("notes") or []:
        console.print(Wrapped(Text(f"note: {note}", style="dim"), hang=2))
    console.print(_engine_table(doc, "Latency (ms per token) and bandwidth; — = not measured, dim = not run",
                                tables.LATENCY_COLUMNS))
    console.print(_engine_table(doc, tables.request_title(doc), tables.REQUEST_COLUMNS))
    console.print(Wrapped(Text(tables.latency_note(doc), style="dim")))
    steps = tables.steps_note(doc)
    console.print(_engine_table(doc, "Launches, bubbles and correctness" + (f" ({steps})" if steps else ""),
                                tables.TIMELINE_COLUMNS))
    console.print(Wrapped(Text(tables.BUBBLE_NOTE, style="dim")))
    console.print(Wrapped(Text(tables.SYNC_NOTE, style="dim")))
    _ladder(doc, console)
    _quantization(doc, console)
    sweep = sweep_renderable(doc)
    if sweep is not None:
        console.print(sweep)
    tiles = [(e["name"], tables.kernel_tiling(e.get("compile") or {})) for e in doc["engines"]]
    tiles = [(name, line) for name, line in tiles if line != "—"]
    if tiles:  # the tile shapes and matvec chosen for this model (they follow its config)
        console.print(Text("Kernels and tiles", style="bold"))
        for name, line in tiles:
            console.print(Wrapped(f"{name}: {line}", hang=2, indent=2))
    feeds = [(e["name"], tables.stream_feed_line(e.get("intrakernel"))) for e in doc["engines"]]
    feeds = [(name, line) for name, line in feeds if line]
    if feeds:  # where the HBM weight stream idles inside the megakernel (Gluon kernel only)
        console.print(Text("Weight stream fed (tiles issued, median over layers)", style="bold"))
        for name, line in feeds:
            console.print(Wrapped(f"{name}: {line}", hang=2, indent=2))
    skipped = tables.not_run(doc)
    if skipped:
        console.print(Text("Engines not run", style="bold"))
        for name, status, reason in skipped:
            console.print(Wrapped(f"{name}: {status} — {reason}", hang=2, indent=2))
    if doc.get("counters") is not None:
        console.print(counters_renderable(doc["counters"]))
        if line := tables.counters_workload_line(doc):
            console.print(Wrapped(Text(line, style="dim")))
    if doc.get("findings"):
        console.print(findings_group(doc["findings"], lambda f: f.get("engine"), severity_legend()))
    else:
        console.print(Wrapped("Findings: none (no rule fired, or the inputs were not measured)"))

