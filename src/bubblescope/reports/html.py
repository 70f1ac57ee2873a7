"""HTML report: one self-contained file (plots as base64 PNG) from a jinja2 template, autoescape on.

Kernel names are C++ templates full of ``<`` and ``>`` and traces can come from anyone, so every
value from the document is escaped by jinja2; the template marks nothing ``|safe``.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..errors import BubblescopeError
from . import counters_table, quantization, sweep_table, tables
from .kernel_names import short_kernel_name
from .results import Results, atomic_write_text, dig, ordered

_TEMPLATES = Path(__file__).parent / "templates"
_CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Headless, offline, no profile state: the same flags the test suite uses.
_CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                   "--disable-background-networking", "--disable-component-update", "--disable-sync",
                   "--hide-scrollbars")


def png_uri(fig) -> str | None:
    """A matplotlib Figure as a ``data:image/png;base64,...`` URI (the report stays one file); None for None."""
    from .figure_base import figure_png

    if fig is None:
        return None
    return "data:image/png;base64," + base64.b64encode(figure_png(fig)).decode("ascii")


def render_template(name: str, **context) -> str:
    """Render the jinja2 template ``name`` of ``reports/templates`` with ``context``: autoescape on (every
    value is escaped), undefined names an error (jinja2.UndefinedError), blocks trimmed."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(_TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    return env.get_template(name).render(**context)


def _share_rows(rows: list[dict] | None, keys: tuple[str, ...]) -> list[list[str]]:
    return [[*(str(r[k]) for k in keys), tables.fmt(r["count"], "count"), tables.fmt(r["total_us"], "rate"),
             tables.fmt(r["share"], "pct")] for r in rows or []]


def _kernel_tables(engines: list[dict]) -> list[dict]:
    out = []
    for eng in engines:
        cats, top = dig(eng, "timeline", "categories"), dig(eng, "timeline", "top_kernels")
        if cats or top:
            out.append({"name": eng["name"], "categories": _share_rows(cats, ("category",)),
                        "top_kernels": [[{"text": short_kernel_name(r[0]), "title": r[0]}, *r[1:]]
                                        for r in _share_rows(top, ("name", "category"))]})
    return out


def _intrakernel(engines: list[dict], device: dict) -> list[dict]:
    from .megakernel_plots import bandwidth_over_peak, chosen_programs, intrakernel_figure

    out = []
    for eng in engines:
        ik = eng.get("intrakernel")
        if ik is None:
            continue
        out.append({
            "name": eng["name"], "plot": png_uri(intrakernel_figure(eng, device)),
            "over_peak": bandwidth_over_peak(ik.get("activity"), (device or {}).get("nvml_peak_GBps")),
            "rows": [f"program {p}" for p in chosen_programs(ik.get("tasks") or [])],
            "facts": [("program-time waiting on dependencies", tables.fmt(ik.get("wait_ratio"), "pct")),
                      ("programs", tables.fmt(ik.get("programs"))),
                      ("tasks per step", tables.fmt(ik.get("tasks_per_step")))] + _attn_phase_facts(ik)
                     + _stream_feed_facts(ik),
            "by_opcode": [[tables.fmt(r.get("opcode"), "text"), tables.fmt(r.get("tasks")),
                           tables.fmt(r.get("busy_us"), "rate"), tables.fmt(r.get("wait_us"), "rate")]
                          for r in ik.get("by_opcode") or []],
            "edges": [[tables.fmt(r.get("edge"), "text"), tables.fmt(r.get("stages")),
                       tables.fmt(r.get("hop_us_p50"), "rate"), tables.fmt(r.get("hop_us_max"), "rate"),
                       tables.fmt(r.get("span_us_p50"), "rate")]
                      for r in ik.get("edges") or []],
            "phases": [[tables.fmt(r.get("opcode"), "text"), tables.fmt(r.get("tasks")),
                        *(tables.fmt(r.get(k), "rate") for k in ("stage_us_p50", "mv_us_p50", "epilogue_us_p50",
                                                                  "epilogue_us_max"))]
                       for r in ik.get("task_phases") or []]})
    return out


def _attn_phase_facts(ik: dict) -> list[tuple[str, str]]:
    """The Gluon attention task's phases after its wait (``intrakernel.attn_phases``), as report facts."""
    ph = ik.get("attn_phases") or {}
    names = (("math_us", "attention: wait → math done, µs p50 / max"),
             ("q_us", "attention: wait → q in registers, µs p50 / max"),
             ("blocks_us", "attention: q → K/V blocks done, µs p50 / max"),
             ("warps_us", "attention: blocks → warps combined, µs p50 / max"),
             ("ticket_us", "attention: math → ticket drawn, µs p50 / max"),
             ("combine_us", "attention: ticket → end (combine), µs p50 / max"))
    facts = [(label, f"{tables.fmt(ph[k].get('p50'), 'rate')} / {tables.fmt(ph[k].get('max'), 'rate')}")
             for k, label in names if isinstance(ph.get(k), dict)]
    crit = ik.get("attn_critical") or {}
    parts = ("after_qkv_us", "q_us", "blocks_us", "ticket_us", "combine_us")
    if all(isinstance(crit.get(k), (int, float)) for k in parts + ("total_us",)):
        # the total is the median of each layer's sum, not the sum of the medians: no "=" between them
        value = (" / ".join(tables.fmt(crit[k], "rate") for k in parts)
                 + f"; total {tables.fmt(crit['total_us'], 'rate')}")
        facts.append(("attention, last task of each layer: after QKV / q / blocks / ticket / combine; total (the "
                      "median of each layer's sum), µs p50", value))
    return facts


def _stream_feed_facts(ik: dict) -> list[tuple[str, str]]:
    """The weight stream's feed (``intrakernel.stream_feed``) as a report fact; none where the document has none."""
    line = tables.stream_feed_line(ik)
    return [("weight stream fed (tiles issued, median over layers)", line)] if line else []


def _counters(section: dict | None) -> dict | None:
    """The ``counters`` section for the template: None when the run did not ask for counters."""
    if section is None:
        return None
    return {"available": bool(section.get("available")), "reason": section.get("reason"),
            "headers": list(counters_table.HEADERS),
            "rows": [[r[0], r[1] if r[1].startswith("unavailable: ") else
                      {"text": short_kernel_name(r[1]), "title": r[1]}, *r[2:]]
                     for r in counters_table.counter_rows(section)],
            "provenance": counters_table.provenance(section),
            "metrics": [(h, metric) for h, metric, _ in counters_table.COLUMNS]}


def _details(engines: list[dict]) -> list[list[str]]:
    rows = []
    for eng in engines:
        c, k = eng.get("compile") or {}, eng.get("correctness") or {}
        if not c and not k:
            continue
        rows.append([eng["name"], tables.kernel_tiling(c), *(tables.fmt(c.get(key)) for key in
                                    ("registers", "spills", "shared_bytes", "num_warps", "programs_per_sm", "grid")),
                     tables.fmt(k.get("reference"), "text"), tables.fmt(k.get("steps")),
                     tables.fmt(k.get("token_agreement"), "pct"), tables.fmt(k.get("max_abs_logit_diff")),
                     tables.fmt(k.get("rel_logit_err"))])
    return rows


def _header(h: str) -> str:
    return h.replace("\n/", "/").replace("\n", " ")


def _ladder(doc: dict) -> dict:
    """The ladder table: every rung with its speed, what it removes and its fidelity; the rungs that did not run;
    the notes that say how to read it."""
    columns = tables.LADDER_COLUMNS + tables.FIDELITY_COLUMNS[1:]
    rows = tables.ladder_rows(doc, columns)
    return {"headers": [_header(h) for h, _, _ in columns], "numeric": [kind != "text" for _, _, kind in columns],
            "rows": [(r["status"] == "ok", cells) for r, cells in rows],
            "ran": any(r["token_ms_p50"] is not None for r, _ in rows), "not_run": tables.rungs_not_run(rows),
            "note": tables.ladder_note(doc), "fidelity_note": tables.fidelity_note(doc)}


def _quantization(doc: dict) -> dict | None:
    """The quantization ablation's table (:mod:`.quantization`), or None for a run without FP8 weights."""
    rows = doc.get("quantization") or quantization.quantization_rows(doc)
    if not rows:
        return None
    return {"title": quantization.title(doc), "headers": [_header(h) for h in quantization.headers(doc)],
            "rows": quantization.formatted_rows(rows), "note": quantization.note(doc),
            "missing": quantization.missing_note(rows, doc)}


def _context(doc: dict) -> dict:
    from . import plots

    engines = ordered(doc.get("engines") or [])
    ok = [e for e in engines if e.get("status") == "ok"]
    device = doc.get("device") or {}
    from .verdict import severity_legend, verdict

    return {
        "verdict": verdict(doc), "severities": severity_legend(), "sync_note": tables.SYNC_NOTE,
        "floors": bool(device.get("nvml_peak_GBps") or device.get("copy_GBps")),
        "title": f"bubblescope — {dig(doc, 'model', 'name')}",
        "device_line": tables.device_line(doc), "model_line": tables.model_line(doc),
        "workload_line": tables.workload_line(doc), "command": doc.get("command"), "created": doc.get("created"),
        "headers": [_header(h) for h, _, _ in tables.HEADLINE],
        "rows": tables.headline_rows(doc),
        "latency_note": tables.latency_note(doc), "bubble_note": tables.BUBBLE_NOTE, "steps_note": tables.steps_note(doc),
        "ladder": _ladder(doc),
        "not_run": tables.not_run(doc),
        "findings": [{"severity": f.get("severity"), "subject": f.get("engine") or tables.MISSING,
                      "title": f.get("title"), "evidence": tables.evidence_text(f.get("evidence")),
                      "advice": f.get("advice")} for f in (doc.get("findings") or [] if engines else [])],
        "timeline_reasons": [(e["name"], dig(e, "timeline", "reason") or "no step timeline recorded")
                             for e in ok if not dig(e, "timeline", "step_timeline")],
        "plots": {"timeline": png_uri(plots.step_timeline_figure(ok)),
                  "ladder": png_uri(plots.ladder_figure(ok, device)),
                  "categories": png_uri(plots.categories_figure(ok)),
                  "latency": png_uri(plots.latency_figure(ok)),
                  "sweep": png_uri(plots.sweep_figure(ok, device))},
        "sweep_headers": list(sweep_table.HEADERS), "sweep_rows": sweep_table.sweep_rows(doc),
        "quantization": _quantization(doc),
        "counters": _counters(doc.get("counters")),
        "kernel_tables": _kernel_tables(ok),
        "intrakernel": _intrakernel(ok, device),
        "details": _details(ok),
        "versions": sorted((doc.get("versions") or {}).items()),
        "device": [(k, tables.threads_text(v) if k == "threads" else tables.fmt(v))
                   for k, v in device.items() if k != "notes"],
        "notes": device.get("notes") or [],
        "traces": [(e["name"], e["trace_path"]) for e in engines if e.get("trace_path")],
    }


def render_html(results: Results | dict) -> str:
    """The HTML report of a results document, as one self-contained string.

    Sections: headline table, findings, one decode step's timeline per engine, the ablation ladder
    with bandwidth floors, kernel categories and top kernels, latency distributions, bandwidth and
    latency against context length, the intra-megakernel timeline, compile and correctness facts,
    environment. A section without data says "not measured". Pure: reads only the document.

    Args:
        results: a :class:`Results` or its document dict (assumed valid; see ``load_results``).
    """
    doc = results.doc if isinstance(results, Results) else results
    return render_template("report.html.j2", **_context(doc))


def write_html(results: Results | dict, path: str | os.PathLike, option: str | None = None) -> Path:
    """Render the HTML report and write it atomically (temp file, then ``os.replace``); ``option`` as
    :func:`~bubblescope.reports.results.atomic_write_text`.

    Returns:
        The path written.

    Raises:
        BubblescopeError: the destination directory is missing or not writable.
    """
    return atomic_write_text(path, render_html(results), option)


def find_chromium() -> str | None:
    """Path of a Chromium or Chrome executable on PATH, or None."""
    return next((p for p in map(shutil.which, _CHROMIUM_NAMES) if p), None)


def screenshot_html(html_path: str | os.PathLike, png_path: str | os.PathLike,
                    width: int = 1280, height: int = 2400) -> Path:
    """Take a PNG screenshot (``width`` × ``height`` CSS pixels) of an HTML file with headless Chromium.

    Runs offline with a throw-away profile; the PNG is written atomically.

    Returns:
        The PNG path.

    Raises:
        BubblescopeError: no Chromium on PATH, the HTML file is missing, the size is not positive,
            or Chromium failed or timed out (120 s).
    """
    html_path, png_path = Path(html_path).resolve(), Path(png_path)
    browser = find_chromium()
    if browser is None:
        raise BubblescopeError(f"screenshot: none of {', '.join(_CHROMIUM_NAMES)} found on PATH")
    if not html_path.is_file():
        raise BubblescopeError(f"{html_path}: no such HTML file")
    if not (isinstance(width, int) and isinstance(height, int) and width > 0 and height > 0):
        raise BubblescopeError(f"screenshot: size must be positive integers, got {width!r} x {height!r}")
    with tempfile.TemporaryDirectory(prefix="bubblescope-chromium-") as profile:
        shot = Path(profile) / "shot.png"
        cmd = [browser, *_CHROMIUM_FLAGS, f"--user-data-dir={profile}/user", f"--window-size={width},{height}",
               f"--screenshot={shot}", html_path.as_uri()]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            raise BubblescopeError(f"screenshot: {browser} timed out after 120 s on {html_path}") from None
        if proc.returncode != 0 or not shot.is_file() or shot.stat().st_size == 0:
            raise BubblescopeError(f"screenshot: {browser} exited with code {proc.returncode} and wrote no PNG")
        tmp = png_path.with_name(f".{png_path.name}.tmp")
        try:
            shutil.copyfile(shot, tmp)
            os.replace(tmp, png_path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise BubblescopeError(f"{png_path}: cannot write screenshot ({exc.strerror})") from None
    return png_path
