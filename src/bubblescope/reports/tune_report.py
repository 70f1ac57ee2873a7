"""Reports of a tune document (``bubblescope.tune/1``): a rich table, and one self-contained HTML page with the
parameter→latency curve per context, where values that spill or lose residency are marked (the cliffs).

Pure renderers: they read the document and measure nothing.
"""

from __future__ import annotations

from pathlib import Path

from . import tables
from .layout import Wrapped
from ..wording import count

# Headers break over two lines so that all twelve columns fit an 80-column terminal.
COLUMNS = ("value", "context", "p50\nms", "p99\nms", "%\npeak", "wait", "agree", "regs", "spills", "smem\nB",
           "progs\n/SM", "grid")


def show_value(value) -> str:
    """A parameter value as ``tune --list`` and the tune page print it: None (the kernel chooses) as ``auto``, an
    empty string as ``""``."""
    return "auto" if value is None else '""' if value == "" else str(value)


def knob_list_lines(groups: dict, device_type: str, width: int = 100) -> list[str]:
    """The lines of ``tune --list``: per parameter class (``{class name: (engines, knobs)}``, knobs as
    ``tuning.knobs`` gives them for ``device_type``) a heading naming its engines, wrapped at ``width``, then one
    line per knob with its type, the default tune holds on that device (:func:`show_value`, as the tune page shows
    it) and its family."""
    import textwrap

    lines = []
    for cls, (engines, knobs) in groups.items():
        lines += textwrap.wrap(f"{', '.join(engines)} ({cls}); defaults on {device_type}, as `tune` holds them there:",
                               width=width, subsequent_indent="    ", break_on_hyphens=False)
        lines += [f"  {k['name']:18s} {k['type']:12s} default {show_value(k['default']):8s} {k['family']}"
                  for k in knobs]
    return lines


def cliff(row: dict) -> str | None:
    """Why a row sits on a performance cliff, or None: spills (local memory traffic per thread), or fewer
    resident programs per SM than requested (the grid shrinks)."""
    c = row.get("compile") or {}
    why = []
    if c.get("spills"):
        why.append(f"{count(c['spills'], 'spilled word')}")
    want, got = c.get("requested_programs_per_sm"), c.get("programs_per_sm")
    if want and got is not None and got < want:
        why.append(f"{got} of {count(want, 'program')} per SM resident")
    return "; ".join(why) or None


def rows(doc: dict) -> list[list[str]]:
    """One table row per (value, context) of the values that ran (see :func:`not_run` for the others)."""
    out = []
    for r in doc["rows"]:
        c = r.get("compile") or {}
        comp = [tables.fmt(c.get(k)) for k in ("registers", "spills", "shared_bytes", "programs_per_sm", "grid")]
        for p in r["points"] if r["status"] == "ok" else []:
            out.append([r["text"], str(p["context"]), tables.fmt(p["token_ms_p50"], "ms"),
                        tables.fmt(p["token_ms_p99"], "ms"), tables.fmt(p["util_peak"], "pct"),
                        tables.fmt(p["intrakernel_wait_ratio"], "pct"), tables.fmt(p["token_agreement"], "pct"),
                        *comp])
    return out


def not_run(doc: dict) -> list[tuple[str, str, str]]:
    """``(value, status, reason)`` of each value that did not parse, validate, build or run."""
    return [(r["text"], r["status"], r.get("reason") or "") for r in doc["rows"] if r["status"] != "ok"]


def ran_on_cpu(doc: dict) -> bool:
    """Some value ran (status ok) on a CPU, i.e. under Triton's interpreter: the CPU note applies."""
    return doc["device"]["type"] != "cuda" and any(r["status"] == "ok" for r in doc["rows"])


def title(doc: dict) -> str:
    return (f"tune {doc['engine']} {doc['knob']} ({doc['family']}) on {doc['model']['name']} "
            f"({doc['model']['dtype']}), {doc['device']['name']}, {doc['steps']} decode steps per point")


def render_tune(doc: dict, console) -> None:
    """Print the tune table and the best value per context to a rich ``console``."""
    from rich import box
    from rich.table import Table

    body = rows(doc)
    # A column nobody measured (on a CPU: % of peak and the compiled resources) only costs width; the
    # value column stays so that the table still says what was tried.
    keep = [i for i in range(len(COLUMNS)) if i == 0 or not body or any(r[i] != tables.MISSING for r in body)]
    # SIMPLE_HEAD's column divider is already a space: padding would double every gap.
    t = Table(box=box.SIMPLE_HEAD, padding=0, pad_edge=False)
    for i in keep:
        t.add_column(COLUMNS[i], justify="left" if i == 0 else "right", no_wrap=True)
    for row in body:
        t.add_row(*(row[i] for i in keep))
    # A table title wraps at the table's width, which is narrow once columns are left out.
    console.print(title(doc), markup=False, highlight=False)
    console.print(t)
    dropped = [COLUMNS[i].replace("\n/", "/").replace("\n", " ") for i in range(len(COLUMNS)) if i not in keep]
    if dropped:
        console.print(f"not measured (columns left out): {', '.join(dropped)}", soft_wrap=True)
    for value, status, reason in not_run(doc):
        console.print(f"{doc['knob']}={value}: {status}: {reason}", markup=False, highlight=False, soft_wrap=True)
    for b in doc["best"]:
        console.print(Wrapped(best_line(doc, b), hang=2))
    for r in doc["rows"]:
        if cliff(r):
            console.print(f"cliff: {doc['knob']}={r['text']}: {cliff(r)}", soft_wrap=True)
    if ran_on_cpu(doc):
        console.print("CPU run: the megakernel ran under Triton's interpreter; its timings measure the interpreter, "
                      "and % of peak, registers and residency need a GPU")


def best_line(doc: dict, b: dict) -> str:
    """What one entry of ``doc["best"]`` (:func:`~.tune_result.best_per_context`) allows to be said: "best"
    only when the lowest p50's lead over the next value exceeds the noise of its own samples; "within noise" when it
    does not; "lowest p50" when the noise or a second value is not known."""
    knob, ms = doc["knob"], tables.fmt(b["token_ms_p50"], "ms")
    head = f"context {b['context']}: {knob}={b['text']} ({ms} ms/token p50)"
    lead, noise, nxt = b.get("lead_ms"), b.get("noise_ms"), b.get("runner_up")
    if nxt is None:
        return f"lowest p50 at {head}: the only value that ran, nothing to rank it against"
    gap = f"{tables.fmt(lead, 'ms')} ms ahead of {knob}={nxt}"
    if noise is None:
        return f"lowest p50 at {head}, {gap}; its samples' spread was not recorded, so no value is called best"
    spread = f"the spread of its own samples (IQR {tables.fmt(noise, 'ms')} ms)"
    if b.get("within_noise"):
        return f"within noise at {head}: {gap}, no more than {spread}; no value is best"
    return f"best at {head}: {gap}, more than {spread}"


def best_verdict(b: dict) -> str:
    """One word or two for the tune page's table: "best", "within noise" or "lowest p50" (see :func:`best_line`)."""
    if b.get("runner_up") is None or b.get("noise_ms") is None:
        return "lowest p50"
    return "within noise" if b.get("within_noise") else "best"


def tune_figure(doc: dict):
    """p50 ms/token against the knob's value, one line per context; cliff values circled in red. None when
    no value ran ok. Non-numeric values are placed at equal steps in the given order."""
    from .figure_base import label, new_figure, ticks_at

    ok = [r for r in doc["rows"] if r["status"] == "ok" and r["points"]]
    if not ok:
        return None
    numeric = all(isinstance(r["value"], (int, float)) and not isinstance(r["value"], bool) for r in ok)
    xs = {r["text"]: (r["value"] if numeric else i) for i, r in enumerate(ok)}
    fig, (ax,) = new_figure(4.0)
    for c in doc["contexts"]:
        pts = [(xs[r["text"]], p["token_ms_p50"], r) for r in ok for p in r["points"]
               if p["context"] == c and p["token_ms_p50"] is not None]
        if not pts:
            continue
        pts.sort(key=lambda t: t[0])
        ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], marker="o", label=f"context {c}")
        bad = [(x, y) for x, y, r in pts if cliff(r)]
        if bad:
            ax.scatter([x for x, _ in bad], [y for _, y in bad], s=160, facecolors="none", edgecolors="red",
                       label="spills / lost residency" if c == doc["contexts"][0] else None)
    if numeric and len(xs) > 2 and min(xs.values()) > 0 and max(xs.values()) / min(xs.values()) >= 8:
        ax.set_xscale("log", base=2)
    if numeric:  # ticks at the values tried, as plain numbers (a log-2 axis would read 2^8, 2^10)
        ticks_at(ax, "x", list(xs.values()))
    else:
        ax.set_xticks(list(xs.values()), [label(t) for t in xs])
    ax.set_xlabel(label(doc["knob"]))
    ax.set_ylabel("p50 ms/token")
    ax.legend(fontsize=8)
    return fig


def render_tune_html(doc: dict) -> str:
    """One self-contained HTML page (jinja2, autoescape on) of a tune document."""
    from .html import png_uri, render_template

    return render_template(
        "tune.html.j2", title=title(doc), command=doc["command"], created=doc["created"], headers=COLUMNS,
        rows=rows(doc), not_run=not_run(doc),
        plot=png_uri(tune_figure(doc)),
        best=[(b["context"], b["text"], tables.fmt(b["token_ms_p50"], "ms"), b.get("runner_up") or tables.MISSING,
               tables.fmt(b.get("lead_ms"), "ms"), tables.fmt(b.get("noise_ms"), "ms"), best_verdict(b),
               best_line(doc, b)) for b in doc["best"]],
        cliffs=[(r["text"], cliff(r)) for r in doc["rows"] if cliff(r)], knob=doc["knob"],
        base=sorted((k, show_value(v)) for k, v in doc["base_params"].items()), cpu=ran_on_cpu(doc),
        device_type=doc["device"].get("type"))


def write_tune_outputs(doc: dict, out: str | Path, save: str | Path | None = None) -> None:
    """Write ``out/tune.json`` and ``out/tune.html`` (creating ``out``), and the tuned file ``save`` when given;
    each staged before any is renamed into place (:func:`~.results.atomic_write_texts`): a file that cannot be
    written leaves ``out`` and ``save`` as they were.

    Raises:
        BubblescopeError: ``out`` cannot be a directory or a file cannot be written; ``--save`` with no value
            that ran ok.
    """
    import json

    from ..errors import BubblescopeError
    from .results import atomic_write_texts
    from .tune_result import tuned_document

    out = Path(out)
    files = [(out / "tune.json", json.dumps(doc, indent=2) + "\n", None),
             (out / "tune.html", render_tune_html(doc), None)]
    if save is not None:  # raises before anything is written when there is nothing to save
        files.append((save, json.dumps(tuned_document(doc), indent=2) + "\n", "--save"))
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise BubblescopeError(f"--out {out}: cannot create the directory ({why})") from None
    try:
        atomic_write_texts(files)
    except BaseException:
        if created and not any(out.iterdir()):
            out.rmdir()
        raise
