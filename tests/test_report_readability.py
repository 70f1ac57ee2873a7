"""Reports a performance engineer reads at a glance — verdict, units, 80 columns, megakernel view."""

from __future__ import annotations

import copy
import re

import pytest
from rich.console import Console

from . import resultsgen as g
from bubblescope.reports import megakernel_plots, plots
from bubblescope.reports.findings import find
from bubblescope.reports.html import render_html
from bubblescope.reports.tables import evidence_text
from bubblescope.reports.terminal import render_results
from bubblescope.reports.verdict import verdict


def _launch_bound_doc() -> dict:
    """The hand-built H200 document with the CUDA-graph engine idle 62 % of each step across 412 kernels."""
    doc = g.healthy_doc()
    g.idle(g.engine(doc, "reference-cudagraph"), 0.62).update(kernels_per_step=412, launches_per_step=412,
                                                              launch_share=0.55)
    doc["findings"] = find(doc)
    return doc


def test_verdict_names_the_bottleneck_of_the_best_and_the_baseline_with_units():
    """One or two sentences: fastest engine and its bottleneck, the baseline's, then one action. The numbers
    are the document's: megakernel 0.8 ms, waits 5 % with qkv and mlp 14 µs each (tie -> first, qkv),
    cudagraph 1.1 ms = 1.375x, idle 62 % between 412 kernels; 3106.6 GB/s = 65 % of 4814.3."""
    v = verdict(_launch_bound_doc())
    assert v["best"] == "megakernel" and v["baseline"] == "reference-cudagraph"
    assert v["text"] == ("Fastest: megakernel at 0.800 ms/token, 1.38x faster than reference-cudagraph: 5% of "
                         "program-time waiting on dependencies, mostly qkv (50% of the waiting); streams 3,107 GB/s "
                         "(65% of NVML peak). Baseline (best op-by-op) reference-cudagraph at 1.100 ms/token: GPU "
                         "idle 62% of each step between 412 kernels; streams 2,259 GB/s (47% of NVML peak).")
    assert v["action"].startswith("Keep more bytes in flight")


def test_verdict_prefers_the_eager_reference_as_baseline_and_takes_the_action_of_a_problem():
    doc = _launch_bound_doc()
    ref = g.engine(doc, "reference-cudagraph")
    ref["name"] = "reference"  # the eager op-by-op engine is the baseline whenever it ran
    doc["findings"] = find(doc)
    g.engine(doc, "megakernel")["latency"]["token_ms_p50"] = 1.2  # now the reference is the fastest
    doc["findings"] = find(doc)
    v = verdict(doc)
    assert v["best"] == "reference" and v["baseline"] == "megakernel"
    problem = next(f for f in doc["findings"] if f["severity"] == "problem" and f["engine"] == "reference")
    assert v["action"] == problem["advice"]


def test_verdict_does_not_call_a_slower_megakernel_the_baseline():
    """A CPU run where the eager reference beat the megakernel printed "Baseline megakernel", though the
    README defines the baseline as the eager reference."""
    doc = _launch_bound_doc()
    g.engine(doc, "reference-cudagraph")["name"] = "reference"
    g.engine(doc, "megakernel")["latency"]["token_ms_p50"] = 1.65  # 1.5x the reference's 1.1 ms
    v = verdict(doc)
    assert v["best"] == "reference" and v["baseline"] == "megakernel"
    assert "Baseline" not in v["text"]
    assert v["text"].startswith("Fastest: reference at 1.100 ms/token, 1.50x faster than megakernel: ")
    assert " Compared with megakernel at 1.650 ms/token: " in v["text"]


def test_severities_mean_something():
    """launch-bound (62 % idle) is a problem; prefill-dominated is info; near-limit is info, not 'good'; the
    megakernel's lead over the best op-by-op engine is context (info)."""
    doc = _launch_bound_doc()
    g.engine(doc, "megakernel")["latency"]["ttft_ms"] = 120.0  # 127 steps × 0.8 ms = 101.6 ms of decode
    g.engine(doc, "megakernel")["bandwidth"]["util_copy"] = 0.96
    sev = {f["rule"]: f["severity"] for f in find(doc)}
    assert sev == {"launch-bound": "problem", "near-bandwidth-limit": "info", "prefill-dominated": "info",
                   "megakernel-vs-op-by-op": "info"}


def test_evidence_is_rounded_with_units():
    """No raw `key=0.850682`: each value rounded, with the unit its name implies."""
    ev = {"bubble_ratio": 0.850682, "kernels_per_step": 412, "token_ms_p50": 1.22841, "effective_GBps": 3106.6,
          "latency_growth": 1.07312, "context_long": 4096, "spills": 12}
    assert evidence_text(ev) == ("bubble ratio 85.1 %, kernels per step 412, token p50 1.228 ms, effective "
                                 "3,107 GB/s, latency growth 1.07x, context long 4,096 tokens, spills 12")
    # the unit word of a key moves onto its value; a value not measured keeps the key whole
    assert evidence_text({"busy_us": 999.0, "span_us": None}) == "busy 999.0 µs, span us —"
    # from 1,000 µs in ms, from 1,000,000 µs in s (a whole trace's span), as the trace tables show times
    assert evidence_text({"busy_us": 66141.0, "span_us": 12920244.0}) == "busy 66.14 ms, span 12.92 s"


def test_terminal_at_80_columns_never_splits_a_number():
    """At 80 columns the findings table split `token_ms_p50=1.` / `2284`. Every number of the headline and
    of the evidence must appear whole on one line, and no line may pass 80 columns."""
    doc = _launch_bound_doc()
    g.engine(doc, "megakernel")["latency"].update(token_ms_p50=1.22841, token_ms_p90=1.3, token_ms_p99=1.9)
    g.engine(doc, "megakernel")["name"] = "megakernel-noprefetch"  # the longest engine name
    doc["findings"] = find(doc)
    console = Console(record=True, width=80, color_system=None)
    render_results(doc, console)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    for f in doc["findings"]:
        for part in evidence_text(f["evidence"]).split(", "):
            assert part in " ".join(text.split()), part  # lines joined, the padding of wrapped lines dropped
        number = re.findall(r"\d[\d,]*\.?\d* ?(?:%|ms|GB/s|x)?", evidence_text(f["evidence"]))
        for n in number:
            assert any(n.strip() in line for line in text.splitlines()), n
    assert "1.228" in text and "1.900" in text
    assert text.lstrip().startswith("╭─ Verdict")


def test_html_opens_with_the_verdict_and_explains_severity_and_sync():
    page = render_html(_launch_bound_doc())
    body = page[page.index("<body>"):]
    assert body.index('id="verdict"') < body.index('id="headline"')
    assert "Fastest: megakernel at 0.800 ms/token" in body and "<b>Action:</b>" in body
    assert "problem</span>: limits this engine now" in body
    assert "sync share: fraction of the step wall time the host spends blocked" in body
    assert "bubble ratio 62.0 %, kernels per step 412" in body


def test_ablation_caption_promises_floor_lines_only_when_drawn():
    gpu, cpu = render_html(g.healthy_doc()), render_html(g.null_metrics_doc())
    assert "red\nlines are the floors" in gpu and "no floor lines" not in gpu
    cpu_doc = g.healthy_doc()
    cpu_doc["device"].update(nvml_peak_GBps=None, copy_GBps=None)
    page = render_html(cpu_doc)
    assert "no floor lines" in page and "red\nlines are the floors" not in page
    assert cpu  # the null document still renders


def _mk_doc(programs: int) -> dict:
    """A megakernel entry with ``programs`` programs of 3 tasks each; program p waits p µs before QKV."""
    doc = g.healthy_doc()
    mk = g.engine(doc, "megakernel")
    tasks = []
    for p in range(programs):
        t = 0.0
        for op, busy in (("QKV", 10.0), ("OPROJ", 5.0), ("DOWN", 8.0)):
            wait = float(p % 7) if op == "QKV" else 0.5
            tasks.append({"program": p, "opcode": op, "layer": 0, "start_us": t, "ready_us": t + wait,
                          "end_us": t + wait + busy})
            t += wait + busy
    mk["intrakernel"] = {"wait_ratio": 0.1, "programs": programs, "tasks_per_step": len(tasks),
                         "by_opcode": [], "tasks": tasks}
    return doc


def test_megakernel_view_draws_a_few_programs_at_full_resolution():
    """528 programs drawn into ~620 px showed one row in 23; now (c) holds at most GANTT_PROGRAMS rows, one per
    chosen program, among them the one that waits most (p % 7 == 6) and least (p % 7 == 0)."""
    doc = _mk_doc(528)
    fig = megakernel_plots.intrakernel_figure(g.engine(doc, "megakernel"), doc["device"])
    gantt = fig.axes[-1]
    labels = [t.get_text() for t in gantt.get_yticklabels()]
    assert 3 <= len(labels) <= megakernel_plots.GANTT_PROGRAMS
    assert "program 524" in labels and "program 0" in labels  # 524 % 7 == 6: last of those waiting most
    assert gantt.get_xlabel() == "µs since the step's first task"
    area = fig.axes[0]
    assert area.get_ylabel() == "% of 528 programs" and area.get_ylim() == (0, 100)
    legend = area.get_legend()
    assert legend is not None and legend.get_bbox_to_anchor().x0 > area.get_window_extent().x1 - 1  # outside


def test_megakernel_view_with_one_program_has_a_labelled_row():
    """On CPU (one program) the y-axis read −0.5…0.5 with no name; now it is the row 'program 0'."""
    doc = _mk_doc(1)
    fig = megakernel_plots.intrakernel_figure(g.engine(doc, "megakernel"), doc["device"])
    assert [t.get_text() for t in fig.axes[-1].get_yticklabels()] == ["program 0"]


def test_megakernel_view_draws_the_estimated_bandwidth_against_the_peak():
    from bubblescope.reports.intrakernel import activity_profile

    doc = _mk_doc(4)
    mk = g.engine(doc, "megakernel")
    mk["intrakernel"]["activity"] = activity_profile(mk["intrakernel"]["tasks"], bins=40,
                                                     bytes_by_opcode={"QKV": 4000, "OPROJ": 2000, "DOWN": 3200})
    fig = megakernel_plots.intrakernel_figure(mk, doc["device"])
    bw = fig.axes[1]
    assert bw.get_ylabel() == "GB/s"
    peak = [line for line in bw.get_lines() if line.get_linestyle() == "--"]
    assert peak and peak[0].get_ydata()[0] == 4814.3


def test_activity_profile_matches_a_hand_computed_step():
    """Two programs: QKV waits [0,1) runs [1,3) with 3000 B; OPROJ waits [1,2) runs [2,4) with 6000 B.
    Per 1-µs bin by hand: QKV busy 0,1,1,0; OPROJ 0,0,1,1; waiting 1,1,0,0; idle 1,0,0,1; bandwidth
    (bytes spread over start..end): 1000 B/µs = 1 GB/s for QKV on [0,3), 2 GB/s for OPROJ on [1,4)."""
    from bubblescope.reports.intrakernel import activity_profile

    tasks = [{"program": 0, "opcode": "QKV", "layer": 0, "start_us": 10, "ready_us": 11, "end_us": 13},
             {"program": 1, "opcode": "OPROJ", "layer": 0, "start_us": 11, "ready_us": 12, "end_us": 14}]
    a = activity_profile(tasks, bins=4, bytes_by_opcode={"QKV": 3000, "OPROJ": 6000})
    assert a["t_us"] == [0, 1, 2, 3] and a["programs"] == 2
    assert a["states"] == {"QKV": [0, 1, 1, 0], "OPROJ": [0, 0, 1, 1], "waiting": [1, 1, 0, 0], "idle": [1, 0, 0, 1]}
    assert a["GBps"] == pytest.approx([1, 3, 3, 2]) and a["bytes"] == 9000


def test_activity_profile_spreads_bytes_from_the_producers_first_load():
    """The Gluon frame's ``load_start_us``: QKV's weights issued at 8 µs (2 µs before the consumer starts it at
    10) and the task ends at 12, so its 4000 B spread over [8, 12) = 1 GB/s per 1-µs bin from the first issue;
    OPROJ (no load stamp: NaN) keeps its own [11, 13) window, 2000 B → 1 GB/s. The axis starts at the first
    issue. By hand per bin [8,9) .. [12,13): 1, 1, 1, 2, 1."""
    import pandas as pd

    from bubblescope.reports.intrakernel import activity_profile

    frame = pd.DataFrame({"name": ["QKV", "OPROJ"], "program": [0, 1], "layer": [0, 0], "ts_us": [10.0, 11.0],
                          "ready_us": [10.0, 11.5], "end_us": [12.0, 13.0], "load_start_us": [8.0, float("nan")]})
    a = activity_profile(frame, bins=5, bytes_by_opcode={"QKV": 4000, "OPROJ": 2000})
    assert a["t_us"] == [0, 1, 2, 3, 4]
    assert a["GBps"] == pytest.approx([1, 1, 1, 2, 1]) and a["bytes"] == 6000
    assert a["states"]["waiting"] == pytest.approx([0, 0, 0, 0.5, 0])  # OPROJ waits [11, 11.5)


def test_opcode_bytes_sum_to_the_analytic_weights():
    """Per layer QKV+OPROJ+GATEUP+DOWN plus LMHEAD equal the config's matrices (norms and embedding aside)."""
    from bubblescope.models import get_preset
    from bubblescope.reports.intrakernel import opcode_bytes

    cfg = get_preset("llama-3.2-1b")
    b = opcode_bytes(cfg, 2, context=0)
    per_layer = 2048 * (32 + 2 * 8) * 64 + 32 * 64 * 2048 + 3 * 2048 * 8192
    assert (b["QKV"] + b["OPROJ"] + b["GATEUP"] + b["DOWN"]) == 2 * per_layer
    assert b["LMHEAD"] == 2 * 128256 * 2048 and b["ATTN"] == 0


def test_sweep_and_latency_axes_go_log_across_a_decade_and_keep_legends_off_the_data():
    """One 82 ms point flattened every other sweep line; three engines collapsed at 0 on a linear CDF."""
    doc = g.healthy_doc()
    ref = g.engine(doc, "reference-cudagraph")
    ref["sweep"][0]["token_ms_p50"] = 82.0
    ref["latency"]["token_ms_samples"] = [82.0, 83.0]
    fig = plots.sweep_figure(doc["engines"][:2], doc["device"])
    ms_ax = fig.axes[1]
    assert ms_ax.get_yscale() == "log" and "(log scale)" in ms_ax.get_ylabel()
    assert all(ax.get_legend() is None for ax in fig.axes) and fig.legends  # one figure legend, below
    fig = plots.latency_figure(doc["engines"][:2])
    assert fig.axes[0].get_xscale() == "log"
    same = plots.sweep_figure(g.healthy_doc()["engines"][:2], doc["device"])
    assert same.axes[1].get_yscale() == "linear"


def test_activity_of_a_real_megakernel_step_conserves_programs_and_bytes():
    """On a real (interpreted) megakernel step's frame: at every bin, busy + waiting + idle = programs; the
    bandwidth curve integrates back to the tasks' bytes, which sum to the config's matrices per layer plus
    the LM head plus the KV cache at the context (hand formula from the config fields)."""
    import torch

    from bubblescope.megakernel_engine import MegakernelEngine
    from bubblescope.models.weights import dummy_weights
    from bubblescope.reports.intrakernel import activity_profile, opcode_bytes

    from . import test_megakernel as tm
    cfg = tm.TINY["gqa-tied-llama3"]
    e = MegakernelEngine(dummy_weights(cfg), params=tm.MID, max_seq_len=16)
    e.prefill(torch.tensor([1, 2]))
    with e.timeline() as rec:
        e.decode(3)
    act = activity_profile(rec.frame, bins=50, bytes_by_opcode=opcode_bytes(cfg, 4, context=3))
    total = [sum(v[i] for v in act["states"].values()) for i in range(50)]
    assert total == pytest.approx([1.0] * 50, abs=1e-3) and act["programs"] == 1
    h, hd, nh, nkv, inter = (cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads,
                             cfg.intermediate_size)
    per_layer = h * (nh + 2 * nkv) * hd + nh * hd * h + 3 * h * inter + 2 * nkv * hd * 3
    assert act["bytes"] == pytest.approx(4 * (cfg.num_hidden_layers * per_layer + cfg.vocab_size * h))
    assert sum(act["GBps"]) * act["bin_us"] * 1e3 == pytest.approx(act["bytes"], rel=1e-3)


def test_verdict_baseline_is_the_best_op_by_op_engine_when_eager_did_not_run():
    """The H200 diagnose of 2026-12-01 ran reference-compile and four megakernel variants without the eager
    reference: the verdict compared against megakernel-stages (the slowest, an ablation). Users compare the
    megakernel with the op-by-op engine they run today, so the fastest reference-* engine is the baseline."""
    doc = _launch_bound_doc()
    slow = dict(g.engine(doc, "megakernel"), name="megakernel-stages")
    slow["latency"] = dict(slow["latency"], token_ms_p50=5.0)
    doc["engines"].append(slow)
    doc["findings"] = find(doc)
    v = verdict(doc)
    assert v["best"] == "megakernel" and v["baseline"] == "reference-cudagraph"
    assert "1.38x faster than reference-cudagraph" in v["text"]


def test_verdict_action_for_the_gluon_kernel_does_not_ask_for_what_it_already_does():
    doc = _launch_bound_doc()
    mk = g.engine(doc, "megakernel")
    mk["intrakernel"]["wait_ratio"] = 0.26
    mk["compile"]["implementation"] = "gluon"
    doc["findings"] = find(doc)
    assert verdict(doc)["action"].startswith("Shorten the dependency chain")
    assert "dependency-chain table" not in verdict(doc)["action"]  # no edges recorded: no table to point at
    mk["intrakernel"]["edges"] = [{"edge": "ATTN→OPROJ", "stages": 16, "hop_us_p50": 1.2, "hop_us_max": 3.0,
                                   "span_us_p50": 9.5}]
    doc["findings"] = find(doc)
    assert "(the HTML report's dependency-chain table" in verdict(doc)["action"]
    # the Triton kernel already prefetches into L2 before each wait: not asked to, pointed at what is left
    mk["compile"]["implementation"] = "triton"
    doc["findings"] = find(doc)
    action = verdict(doc)["action"]
    assert action.startswith("Each task's weights are already prefetched into L2") and "megakernel-gluon" in action
    # the megakernel's bubble-bound finding (26 % in-kernel wait) gives the same advice the verdict takes
    assert next(f for f in doc["findings"] if f["rule"] == "bubble-bound")["advice"] == action
    # the ablation without prefetch is pointed at the rung that prefetches, whatever its implementation
    mk["compile"]["prefetch"] = 0
    doc["findings"] = find(doc)
    assert verdict(doc)["action"].startswith("This kernel loads each task's weights only once")
    mk["compile"].update(implementation=None, prefetch=None)
    doc["findings"] = find(doc)
    assert verdict(doc)["action"].startswith("Hide the waits")


def test_table_titles_fit_an_80_column_terminal_with_one_short_engine():
    """QA finding: with one engine named "reference" (a CPU run) the latency table is 61 columns wide and
    rich wrapped its title at that width: "... dim =" / "not run" on two lines of an 80-column terminal."""
    doc = g.null_metrics_doc()
    doc["engines"] = doc["engines"][:1]
    doc["engines"][0]["name"] = "reference"
    console = Console(width=80, record=True)
    render_results(doc, console)
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    assert "Latency (ms per token) and bandwidth; — = not measured, dim = not run" in lines
    assert "Launches, bubbles and correctness" in lines
    assert max(map(len, lines)) <= 80


def test_counts_of_one_are_singular_in_the_report():
    """QA finding: "1 runs" in the workload line (a `--runs 1` run); the same for every count + noun."""
    from bubblescope.reports.tables import workload_line
    from bubblescope.wording import count

    doc = g.null_metrics_doc()
    doc["workload"].update(runs=1, warmup=1, prompt_len=1)
    assert workload_line(doc).startswith("prompt 1 token, generate ")
    assert "1 run after 1 warm-up run," in workload_line(doc)
    doc["workload"].update(runs=3, warmup=0)
    assert "3 runs after 0 warm-up runs," in workload_line(doc)
    assert (count(1, "kernel", fmt=".0f"), count(0.96, "kernel", fmt=".0f"), count(2, "kernel")) == \
        ("1 kernel", "1 kernel", "2 kernels")
    console = Console(width=80, record=True)
    render_results(doc, console)
    assert not re.search(r"\b1 (runs|tokens|steps|kernels|checks|positions)\b", console.export_text())


def test_workload_line_names_the_generated_tokens_and_an_empty_sweep():
    """Fresh-user finding: a CPU run printed "generate 32, ..., context sweep [—]", as if the sweep were not
    measured, though the CPU default (or --context-sweep none) asks for no sweep."""
    from bubblescope.reports.tables import workload_line

    doc = g.null_metrics_doc()
    doc["workload"].update(prompt_len=16, gen_len=32, runs=3, warmup=1, context_sweep=[], seed=0)
    assert workload_line(doc) == "prompt 16 tokens, generate 32 tokens, 3 runs after 1 warm-up run, no context " \
                                 "sweep, seed 0"
    doc["workload"].update(gen_len=1, context_sweep=[128, 4096])
    assert "generate 1 token, " in workload_line(doc) and "context sweep [128, 4096], seed 0" in workload_line(doc)


def test_a_long_engine_name_stays_on_one_line_of_the_latency_table():
    """At 80 columns the latency table wrapped `megakernel-noprefetc` / `h`. The engine column is as wide as the
    longest name, and CPU-sized numbers (hundreds of ms per token, seconds of TTFT) still fit whole."""
    import copy

    doc = g.healthy_doc()
    slow = copy.deepcopy(g.engine(doc, "megakernel"))
    slow["name"] = "megakernel-noprefetch"
    slow["latency"].update(token_ms_p50=123.4567, token_ms_p99=234.567, ttft_ms=1234.567, tok_per_s=8.1,
                           first_run={"token_ms_p50": 345.6789, "ttft_ms": 45678.9123, "tokens": 127})
    doc["engines"].append(slow)
    console = Console(record=True, width=80, color_system=None)
    render_results(doc, console)
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    row = next(line for line in lines if line.startswith("megakernel-noprefetch  123.457"))
    assert row.split() == ["megakernel-noprefetch", "123.457", "234.567", "8.1", "3107", "64.5", "%", "72.9", "%"]
    request = next(line for line in lines if line.startswith("megakernel-noprefetch  1234.567"))
    assert request.split() == ["megakernel-noprefetch", "1234.567", "~15679.0", "~16913.6",  # + 127 × 123.4567
                               "345.679", "45678.912"]  # the first run: CPU-sized too
    # latency, request, timeline, the ladder's two tables and the context sweep; no "h" line
    assert sum(line.split()[:1] == ["megakernel-noprefetch"] for line in lines) == 6
    assert not any(line.strip() in ("h", "dagraph") for line in lines)


def _cpu_doc(**p50s: float) -> dict:
    """A CPU-only document whose ok engines have the given p50 ms/token and nothing else measured."""
    doc = g.null_metrics_doc()
    template = g.engine(doc, "megakernel")
    doc["engines"] = [dict(template, name=name, latency=dict(template["latency"], token_ms_p50=ms))
                      for name, ms in p50s.items()]
    doc["findings"] = []
    return doc


def test_cpu_verdict_compares_no_engine_with_an_interpreted_megakernel_or_fused_engine():
    """On a CPU the megakernel and fused engines run under Triton's interpreter (183.5 and 488.8 ms/token here):
    "468x faster than megakernel" measured the interpreter. reference-compile is compared with hf only,
    11.12 / 0.392 = 28.37x, and the shared CPU clause is said once."""
    v = verdict(_cpu_doc(**{"reference-compile": 0.392, "megakernel": 183.5, "reference-fused": 488.8}))
    assert (v["best"], v["baseline"]) == ("reference-compile", None)
    assert v["text"] == ("Fastest: reference-compile at 0.392 ms/token: measured on the CPU: no GPU timeline or "
                         "bandwidth to say more.")
    v = verdict(_cpu_doc(**{"reference-compile": 0.392, "hf": 11.12, "megakernel": 183.5}))
    assert (v["best"], v["baseline"]) == ("reference-compile", "hf")
    assert v["text"] == ("Fastest: reference-compile at 0.392 ms/token, 28.37x faster than hf: measured on the "
                         "CPU: no GPU timeline or bandwidth to say more. Compared with hf at 11.1 ms/token.")


def test_cpu_verdict_of_interpreted_engines_alone_says_so_and_compares_nothing():
    v = verdict(_cpu_doc(**{"megakernel": 183.5, "megakernel-stages": 240.0}))
    assert (v["best"], v["baseline"]) == ("megakernel", None)
    assert v["text"] == ("Fastest: megakernel at 183.5 ms/token: timed under Triton's CPU interpreter, which says "
                         "nothing of the kernel's speed.")


def test_gpu_verdict_still_compares_the_fused_engine_and_the_megakernel():
    """On CUDA the same names are real kernels: reference-fused 1.1 ms is the baseline of the 0.8 ms megakernel."""
    doc = _launch_bound_doc()
    g.engine(doc, "reference-cudagraph")["name"] = "reference-fused"
    v = verdict(doc)
    assert (v["best"], v["baseline"]) == ("megakernel", "reference-fused")
    assert "1.38x faster than reference-fused" in v["text"]


def test_html_megakernel_facts_are_labelled_in_words():
    """The megakernel's wait share was labelled with its internal key, `intrakernel_wait_ratio`."""
    wait = g.engine(g.healthy_doc(), "megakernel")["intrakernel"]["wait_ratio"]
    body = render_html(g.healthy_doc())
    assert f"<th>program-time waiting on dependencies</th><td class=\"num\">{wait * 100:.1f} %</td>" in body
    assert "intrakernel_wait_ratio" not in body


def test_the_latency_note_says_tok_per_s_comes_from_the_mean_tpot():
    """A CPU run showed TPOT p50 0.896 ms beside 75.8 tok/s: tok/s is 1000 / the mean TPOT (samples 1, 1, 1, 97 ms:
    p50 1 ms, mean 25 ms, 40 tok/s), and the note under the table said nothing of it."""
    from bubblescope.diagnosis.measure import latency_stats

    stats = latency_stats([1.0, 1.0, 1.0, 97.0], [5.0], [0.9])
    assert (stats["token_ms_p50"], stats["tok_per_s"]) == (1.0, 40.0)
    console = Console(record=True, width=100)
    render_results(g.healthy_doc(), console)
    assert "tok/s: 1000 / the mean TPOT" in " ".join(console.export_text().split())
    assert "tok/s: 1000 / the mean TPOT" in render_html(g.healthy_doc())


def test_verdict_says_when_the_fastest_by_p50_is_not_the_fastest_request():
    """A CPU run: reference-compile's p50 0.433 ms beat the eager reference's 0.858, but its mean TPOT was
    15.369 ms (recompiles in the timed steps) and its request took 88.1 ms end to end against 28.9."""
    doc = g.healthy_doc()
    doc["engines"] = [e for e in doc["engines"] if e["name"] == "reference-cudagraph"]
    fast = doc["engines"][0]
    fast["latency"].update(token_ms_p50=0.433, token_ms_mean=15.369, e2e_ms=88.1, ttft_ms=1.6)
    steady = copy.deepcopy(fast)
    steady["name"] = "reference"
    steady["latency"].update(token_ms_p50=0.858, token_ms_mean=0.902, e2e_ms=28.9, ttft_ms=1.4)
    doc["engines"].insert(0, steady)
    text = verdict(doc)["text"]
    assert text.startswith("Fastest: reference-cudagraph at 0.433 ms/token")
    assert text.endswith(" Per request, reference finishes first (28.9 against 88.1 ms end to end): "
                         "reference-cudagraph's mean TPOT 15.369 ms is 35.5x its p50, slow steps the median hides.")
    fast["latency"].update(e2e_ms=34.0)  # 1.18x: within the noise of two orders, not said
    assert "Per request" not in verdict(doc)["text"]
