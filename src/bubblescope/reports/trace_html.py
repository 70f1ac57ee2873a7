"""HTML report of ``diagnose trace``: one self-contained file (plots as base64 PNG) from a jinja2 template.

Shows what the terminal shows — per file the device and idle tables, the decode-step figures, top kernels and
categories, the host time per step by CPU operator (host-bound steps), warnings; the multi-rank tables — plus
each file's per-step table, a plot of GPU busy against idle per step (per rank too), and the findings. Tables
are formatted by :mod:`.trace_tables`, as in the terminal; kernel names come from traces, so every value is
escaped (autoescape on, nothing marked ``|safe``).
"""

from __future__ import annotations

import os
from pathlib import Path

from . import trace_tables as tt
from .html import png_uri, render_template
from .kernel_names import short_kernel_name
from .results import atomic_write_text
from .tables import MISSING, evidence_text

TOP_SHOWN = 15
STEP_ROWS_SHOWN = 500  # a long trace keeps its head in the table; the plot shows every step


def _headers(headers) -> list[str]:
    return [h.replace("\n", " ") for h in headers]


def named_rows(rows: list[list[str]]) -> list[list]:
    """Table rows whose first cell is a kernel name, that cell made ``{"text": short, "title": full}``
    (:func:`~.kernel_names.short_kernel_name`): the table shows the short name, hovering shows the whole one."""
    return [[{"text": short_kernel_name(r[0]), "title": r[0]}, *r[1:]] for r in rows]


def _breakdowns(f: dict) -> list[dict]:
    """Top kernels and categories: of the decode steps when measured, else of each device (as the terminal)."""
    steps = f.get("steps") or {}
    if steps.get("available"):
        sources = [(f"in the decode steps (device {steps.get('device')})", steps)]
    else:
        sources = [(f"device {d['device']}", d) for d in f.get("devices") or []]
    out = []
    for where, src in sources:
        out.append({"title": f"Top kernels {where}",
                    "headers": ["name", "category", "count", "total", "share"],
                    "rows": named_rows(tt.breakdown_rows((src.get("top_kernels") or [])[:TOP_SHOWN], True))})
        out.append({"title": f"Kernel categories {where}", "headers": ["category", "count", "total", "share"],
                    "rows": tt.breakdown_rows(src.get("categories") or [], False)})
    return out


def _file(f: dict) -> dict:
    if "error" in f:
        return {"path": f["path"], "rank": None, "error": f["error"]}
    devices, steps, rows = f.get("devices") or [], f.get("steps"), f.get("step_rows") or []
    from .trace_plots import step_busy_figure

    return {
        "path": f["path"], "rank": f.get("rank"), "error": None, "marker": f.get("step_marker"),
        "device_headers": _headers(tt.DEVICE_HEADERS), "device_rows": tt.device_rows(devices),
        "idle_title": tt.idle_title(devices), "idle_headers": list(tt.IDLE_HEADERS),
        "idle_rows": tt.idle_rows(devices),
        "steps": tt.step_metric_rows(steps) if steps else None,
        "steps_title": tt.steps_title(f),
        "steps_reason": (steps or {}).get("reason"),
        "detection": (f.get("step_detection") or {}).get("description"),
        "bandwidth": _bandwidth(f.get("bandwidth")),
        "graphs": tt.graph_rows(f["graphs"]) if f.get("graphs") else None,
        "graphs_device": (f.get("graphs") or {}).get("device"),
        "step_headers": _headers(tt.STEP_ROW_HEADERS), "step_rows": tt.step_table_rows(rows[:STEP_ROWS_SHOWN]),
        "step_rows_total": len(rows),
        "plot": png_uri(step_busy_figure(rows)),
        "breakdowns": _breakdowns(f),
        "host_ops": _host_ops(f.get("host_ops")),
        "warnings": f.get("warnings") or [],
    }


def _host_ops(host_ops: dict | None) -> dict | None:
    """The host time per step by CPU operator (as the terminal shows it), or None when it was not computed."""
    if not host_ops:
        return None
    return {"title": tt.host_ops_title(host_ops), "headers": _headers(tt.HOST_OP_HEADERS),
            "rows": tt.host_op_rows(host_ops), "note": tt.host_ops_note(host_ops), "reason": host_ops.get("reason")}


def _bandwidth(bw: dict | None) -> dict | None:
    """The bandwidth section's verdict, figures and per-step rows (the first :data:`STEP_ROWS_SHOWN`)."""
    if not bw:
        return None
    rows = bw.get("rows") or []
    return {"verdict": bw.get("verdict"), "reason": bw.get("reason"),
            "rows": tt.bandwidth_rows(bw) if bw.get("summary") else [],
            "step_headers": _headers(tt.BANDWIDTH_STEP_HEADERS),
            "step_rows": tt.bandwidth_step_rows(bw, STEP_ROWS_SHOWN), "step_rows_total": len(rows)}


def _ranks(section: dict | None) -> dict | None:
    if not section:
        return None
    from .trace_plots import rank_steps_figure

    return {"title": tt.ranks_title(section), "window_headers": _headers(tt.RANK_WINDOW_HEADERS),
            "window_rows": tt.rank_window_rows(section), "median_headers": _headers(tt.RANK_MEDIAN_HEADERS),
            "median_rows": tt.rank_median_rows(section), "median": tt.rank_median_lines(section),
            "timing_headers": _headers(tt.RANK_TIMING_HEADERS),
            "timing_rows": tt.rank_timing_rows(section, STEP_ROWS_SHOWN),
            "work_headers": _headers(tt.RANK_WORK_HEADERS), "work_rows": tt.rank_work_rows(section, STEP_ROWS_SHOWN),
            "steps_total": len(section["per_step"]),
            "warnings": section.get("warnings") or [], "plot": png_uri(rank_steps_figure(section))}


def render_trace_html(summary: dict, findings: list[dict], command: str | None = None,
                      notes: list[str] | None = None) -> str:
    """The HTML report of a trace summary, as one self-contained string. Pure: reads only its arguments.

    Args:
        summary: the dict of :func:`~bubblescope.profiler.trace.ranksummary.summarize_rank_traces`; unreadable
            files are listed with their error.
        findings: :func:`~bubblescope.reports.trace_findings.find_trace` of ``summary``.
        command: the command line, shown in the header (None: not shown).
        notes: lines shown under the file list (files skipped in a folder, ranks not merged).
    """
    from ..version import __version__
    from .trace_findings import TRACE_SEVERITIES, finding_subject

    files = summary.get("files") or []
    text = render_template(
        "trace_report.html.j2", title=f"bubblescope — trace report ({len(files)} file{'s' * (len(files) != 1)})",
        version=__version__, command=command, notes=notes or [], files=[_file(f) for f in files],
        ranks=_ranks(summary.get("ranks")), severities=list(TRACE_SEVERITIES.items()),
        findings=[{"severity": f.get("severity"), "subject": finding_subject(f), "rule": f.get("rule"),
                   "title": f.get("title"), "evidence": evidence_text(f.get("evidence")) or MISSING,
                   "advice": f.get("advice")} for f in findings])
    # A file name that is not valid UTF-8 reaches Python with its bytes as lone surrogates (surrogateescape);
    # UTF-8 HTML cannot hold them: each such byte shows as U+FFFD, as a terminal shows it.
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def write_trace_html(summary: dict, findings: list[dict], path: str | os.PathLike, option: str | None = None,
                     command: str | None = None, notes: list[str] | None = None) -> Path:
    """Render :func:`render_trace_html` and write it atomically (temp file, then ``os.replace``): a failure
    leaves no partial file. ``option`` names the CLI option in error messages (``--html``).

    Returns:
        The path written.

    Raises:
        BubblescopeError: the destination directory is missing or not writable, or ``path`` is not a file.
    """
    return atomic_write_text(path, render_trace_html(summary, findings, command, notes), option)
