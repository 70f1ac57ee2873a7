"""The ablation ladder (reports.ladder), the one bubble ratio, numerical fidelity against fp32, and how the
reports show them: every number is worked out by hand from the hand-built documents of tests/resultsgen.py."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from rich.console import Console

from . import resultsgen as g
from bubblescope.fidelity import fidelity, fp32_logits
from bubblescope.reports import tables
from bubblescope.reports.findings import rederive
from bubblescope.reports.html import render_html
from bubblescope.reports.ladder import (FIDELITY_TOLERANCE, GPU_IDLE, IN_KERNEL, RUNGS, best_op_by_op, bubble_ratio,
                                        fidelity_matched, ladder, request_times)
from bubblescope.reports.results import validate_results
from bubblescope.reports.terminal import render_results

PDL_REASON = "PDL needs a Hopper GPU (programmatic dependent launch, sm_90)"


def _add(doc: dict, name: str, p50: float | None = None, status: str = "ok", reason: str | None = None,
         bubble: float | None = None, kernels: float | None = None, launches: float | None = None,
         correctness: dict | None = None) -> dict:
    """An engine entry called ``name`` made from the graphed reference's, retimed to ``p50`` ms."""
    eng = copy.deepcopy(g.engine(doc, "reference-cudagraph"))
    eng.update(name=name, status=status, reason=reason)
    if status != "ok":
        eng.update(latency=None, bandwidth=None, timeline=None, correctness=None, sweep=[])
    else:
        eng["latency"].update(token_ms_p50=p50, token_ms_p90=p50, token_ms_p99=p50)
        g.idle(eng, bubble).update(kernels_per_step=kernels, launches_per_step=launches)
        if correctness:
            eng["correctness"].update(correctness)
    doc["engines"].append(eng)
    return eng


def _ladder_doc() -> dict:
    """The H200 document plus the eager reference (3.4 ms, idle 60 % across 412 kernels) and a skipped
    reference-fused-pdl; reference-compile failed; megakernel-noprefetch and reference-fused did not run."""
    doc = g.healthy_doc()
    _add(doc, "reference", 3.4, bubble=0.6, kernels=412, launches=412)
    _add(doc, "reference-fused-pdl", status="skipped", reason=PDL_REASON)
    return doc


def test_ladder_rows_carry_the_documents_numbers_and_the_step_from_the_rung_below():
    rows = {r["engine"]: r for r in ladder(_ladder_doc())}
    assert [r["engine"] for r in ladder(_ladder_doc())] == [name for name, _, _ in RUNGS]
    eager, graph, mk = rows["reference"], rows["reference-cudagraph"], rows["megakernel"]
    assert eager["status"] == "ok" and eager["below"] is None and eager["step_us"] is None
    assert eager["bubble_ratio"] == 0.6 and eager["bubble_source"] == GPU_IDLE
    assert eager["bubble_us"] == pytest.approx(2040.0)  # 0.6 × 3,400 µs
    # CUDA graph: 3.4 → 1.1 ms, 2,300 µs saved by removing Python and launch overhead
    assert graph["below"] == "reference" and graph["step_us"] == pytest.approx(2300.0)
    assert graph["removes"] == "Python/launch overhead" and graph["kernels_per_step"] == 180
    # the megakernel against the nearest rung below that ran (compile failed, fused and PDL did not run)
    assert mk["below"] == "reference-cudagraph" and mk["step_us"] == pytest.approx(300.0)
    assert (mk["bubble_ratio"], mk["bubble_source"]) == (0.05, IN_KERNEL) and mk["bubble_us"] == pytest.approx(40.0)
    assert mk["util_peak"] == 0.6453 and mk["token_ms_p50"] == 0.8
    assert rows["reference-compile"]["status"] == "failed"
    assert rows["reference-compile"]["reason"] == "torch.compile raised InductorError"
    assert rows["reference-fused-pdl"]["status"] == "skipped" and rows["reference-fused-pdl"]["reason"] == PDL_REASON
    assert rows["reference-fused"]["status"] == "not run" and "--engines" in rows["reference-fused"]["reason"]
    for row in (rows["reference-fused-pdl"], rows["reference-fused"]):
        assert row["token_ms_p50"] is None and row["step_us"] is None


def test_a_slower_rung_saves_a_negative_step():
    doc = _ladder_doc()
    _add(doc, "reference-fused", 1.0, bubble=0.05, kernels=97, launches=1)
    _add(doc, "reference-fused-pdl", 1.02, bubble=0.03, kernels=97, launches=1)
    doc["engines"] = [e for e in doc["engines"] if e["status"] == "ok"]
    rows = {r["engine"]: r for r in ladder(doc)}
    assert rows["reference-fused"]["step_us"] == pytest.approx(100.0)
    assert rows["reference-fused-pdl"]["step_us"] == pytest.approx(-20.0)  # PDL 20 µs slower here
    assert rows["megakernel"]["below"] == "reference-fused-pdl" and rows["megakernel"]["step_us"] == pytest.approx(220)


def test_the_megakernel_rung_takes_the_implementation_named_by_hand():
    doc = g.healthy_doc()
    g.engine(doc, "megakernel")["name"] = "megakernel-gluon"
    mk = ladder(doc)[-1]
    assert mk["rung"] == "megakernel" and mk["engine"] == "megakernel-gluon" and mk["token_ms_p50"] == 0.8


@pytest.mark.parametrize("kernels, wait, idle, expected", [
    (1, 0.27, 0.198, (0.27, IN_KERNEL)),     # one kernel: its own clock, not the host gaps between steps
    (1, None, 0.198, (0.198, GPU_IDLE)),     # one kernel without a task timeline
    (81, 0.3, 0.78, (0.78, GPU_IDLE)),       # megakernel-stages: many kernels, the GPU's idle share
    (None, 0.4, None, (None, None)),         # CPU: no GPU timeline (the interpreter's wait is no bubble)
])
def test_one_bubble_ratio(kernels, wait, idle, expected):
    eng = {"timeline": {"kernels_per_step": kernels, "bubble_ratio": idle}, "intrakernel": {"wait_ratio": wait}}
    assert bubble_ratio(eng) == expected


def test_the_best_op_by_op_engine_is_the_fastest_reference_engine():
    doc = _ladder_doc()
    assert best_op_by_op(doc["engines"])["name"] == "reference-cudagraph"
    _add(doc, "reference-fused", 0.9, bubble=0.05, kernels=97, launches=1)
    assert best_op_by_op(doc["engines"])["name"] == "reference-fused"
    assert best_op_by_op([e for e in doc["engines"] if e["name"] == "megakernel"]) is None


def test_request_times_use_the_measured_generation_or_say_they_estimate():
    doc = g.healthy_doc()
    mk = g.engine(doc, "megakernel")
    r = request_times(mk, doc)  # not recorded: TTFT 10 + 127 × 0.8 ms
    assert r["e2e_ms"] == pytest.approx(111.6) and r["decode_ms"] == pytest.approx(101.6) and not r["e2e_measured"]
    assert (r["ttft_ms"], r["tpot_p50_ms"], r["tpot_p99_ms"]) == (10.0, 0.8, 0.83)
    mk["latency"]["e2e_ms"] = 115.0
    r = request_times(mk, doc)
    assert r["e2e_ms"] == 115.0 and r["decode_ms"] == pytest.approx(105.0) and r["e2e_measured"]


@pytest.mark.parametrize("kl, nll, matched", [
    (0.002 * 1.25 + 1e-6, 2.51, True),     # at the tolerance on both
    (0.001, 2.49, True),                    # better than the reference
    (0.002 * 1.25 + 2e-6, 2.50, False),     # KL past it
    (0.002, 2.5101, False),                 # NLL past it
    (None, 2.5, None),
])
def test_fidelity_matched_within_the_stated_tolerance(kl, nll, matched):
    assert FIDELITY_TOLERANCE == {"kl_rel": 1.25, "kl_abs": 1e-6, "nll_abs": 0.01}
    assert fidelity_matched(kl, nll, 0.002, 2.5) is matched


def test_kl_and_nll_against_hand_computed_values():
    """Two positions over a vocabulary of 2. Position 0: the engine's logits (0, 0) give p = (1/2, 1/2), the
    fp32 run's (ln 3, 0) q = (3/4, 1/4): KL(q‖p) = 3/4 ln(3/2) + 1/4 ln(1/2); its target 0 costs ln 2 (fp32:
    ln 4/3). Position 1: equal logits, KL 0, no target. Means over 2 positions (KL) and 1 target (NLL)."""
    got = torch.tensor([[0.0, 0.0], [1.0, 2.0]], dtype=torch.float64)
    ref = torch.tensor([[math.log(3), 0.0], [1.0, 2.0]], dtype=torch.float64)
    f = fidelity(got, ref, [0])
    assert f["kl_vs_fp32"] == pytest.approx((0.75 * math.log(1.5) + 0.25 * math.log(0.5)) / 2, abs=1e-12)
    assert f["nll"] == pytest.approx(math.log(2), abs=1e-12)
    assert f["nll_fp32"] == pytest.approx(math.log(4 / 3), abs=1e-12)
    assert fidelity(ref, ref, [0])["kl_vs_fp32"] == 0.0
    nan = fidelity(torch.full((2, 2), float("nan")), ref, [0])
    assert nan["kl_vs_fp32"] is None and nan["nll"] is None


def test_a_bf16_reference_against_its_fp32_run():
    """The tiny model in bfloat16 against the same weights in float32, on the same tokens: a small positive KL,
    an NLL near the fp32 run's, and the float32 logits are those of the weights cast up (the weights are the
    bf16 ones: casting them up loses nothing)."""
    from bubblescope.engines import build_engine
    from bubblescope.generation import teacher_forced_logits
    from bubblescope.models import dummy_weights, get_preset

    cfg = get_preset("tiny-llama")
    w16 = dummy_weights(cfg, "cpu", torch.bfloat16, seed=0)
    prompt, forced = [5, 9, 17, 33], [40, 41, 42]
    got = teacher_forced_logits(build_engine("reference", w16, 16), prompt, forced)
    ref32 = fp32_logits(w16, prompt, forced, 16)
    assert ref32.dtype == torch.float32 and ref32.shape == got.shape == (4, cfg.vocab_size)
    f = fidelity(got, ref32, forced)
    assert 0 < f["kl_vs_fp32"] < 0.05 and abs(f["nll"] - f["nll_fp32"]) < 0.1
    w32 = w16.to(dtype=torch.float32)
    assert torch.equal(ref32, teacher_forced_logits(build_engine("reference", w32, 16), prompt, forced))


def test_the_ladder_in_the_json_is_valid_and_checked():
    doc = rederive(_ladder_doc())
    assert doc["ladder"] == ladder(doc) and validate_results(doc) == []
    doc["ladder"][0]["status"] = "maybe"
    assert any(p.startswith("ladder[0].status") for p in validate_results(doc))


def _fidelity_doc() -> dict:
    doc = _ladder_doc()
    for name, kl, nll, matched in (("reference", 3.1e-4, 2.4133, True), ("reference-cudagraph", 3.1e-4, 2.4133, True),
                                   ("megakernel", 9.2e-4, 2.4391, False)):
        g.engine(doc, name)["correctness"].update(kl_vs_fp32=kl, nll=nll, nll_fp32=2.4102, ref_kl_vs_fp32=3.1e-4,
                                                  ref_nll=2.4133, fidelity_matched=matched)
    return rederive(doc)


def test_terminal_shows_the_ladder_its_fidelity_and_the_rungs_not_run():
    console = Console(record=True, width=100, color_system=None)
    render_results(_fidelity_doc(), console)
    text = console.export_text()
    lines = [line.split() for line in text.splitlines()]
    assert ["reference-cudagraph", "1.100", "46.9", "%", "180", "0.060", "+2,300.0"] in lines
    assert ["megakernel", "0.800", "64.5", "%", "1", "0.050*", "+300.0"] in lines
    assert ["megakernel", "weight", "loads", "stalled", "behind", "dependency", "waits", "0.00092", "2.4391",
            "no"] in lines
    assert ["reference", "baseline", "(a", "launch", "per", "op)", "0.00031", "2.4133", "yes"] in lines
    joined = " ".join(text.split())
    assert f"reference-fused-pdl — skipped: {PDL_REASON}" in joined
    assert "the bfloat16 reference's own KL 0.00031 nats and NLL 2.4133 nats/token (fp32 NLL 2.4102)" in joined
    assert max(len(line) for line in text.splitlines()) <= 100


def test_html_shows_the_ladder_table():
    page = render_html(_fidelity_doc())
    section = page[page.index('id="ladder"'):page.index('id="categories"')]
    assert ("<td>megakernel</td><td class=\"num\">0.800</td><td class=\"num\">64.5 %</td><td class=\"num\">1</td>"
            "<td class=\"num\">0.050*</td><td class=\"num\">+300.0</td><td>weight loads stalled behind dependency waits</td>"
            "<td class=\"num\">0.00092</td><td class=\"num\">2.4391</td><td class=\"num\">no</td>") in section
    assert f"reference-fused-pdl — skipped: {PDL_REASON}" in section
    assert '<tr class="notok"><td>reference-fused-pdl</td>' in section


def test_no_ladder_table_when_no_rung_was_timed():
    doc = g.null_metrics_doc()  # ok engines whose latency is all null
    page = render_html(doc)
    assert "<th>removes (vs the rung below)</th>" not in page
    text = Console(record=True, width=100, color_system=None)
    render_results(doc, text)
    assert "Ablation ladder" not in text.export_text()


def test_steps_note_says_how_many_warm_up_steps_were_left_out():
    doc = g.healthy_doc()
    assert tables.steps_note(doc) == "per-step figures: medians over 8 profiled decode steps"
    for eng in doc["engines"]:
        if eng["status"] == "ok":
            eng["timeline"]["warmup_steps"] = 1
    assert tables.steps_note(doc) == ("per-step figures: medians over 8 profiled decode steps; 1 warm-up step left "
                                      "out of every figure")
    console = Console(record=True, width=100, color_system=None)
    render_results(doc, console)
    assert "1 warm-up step left out of every figure" in " ".join(console.export_text().split())
    assert "1 warm-up step left out of every figure" in render_html(doc)


def test_counters_say_they_ran_another_workload():
    doc = g.healthy_doc()
    doc["counters"] = {"tool": "ncu", "available": False, "reason": "ncu not found", "engines": [],
                       "workload": {"prompt_len": 4, "new_tokens": 32, "skipped_steps": 16}}
    line = tables.counters_workload_line(doc)
    assert line == ("counters read on `bubblescope generate` with a 4-token prompt, one decode step's launches "
                    "after 16 steps: not the workload of the tables above (prompt 32 tokens, 128 new tokens)")
    console = Console(record=True, width=100, color_system=None)
    render_results(doc, console)
    assert "not the workload of the tables above" in " ".join(console.export_text().split())
    del doc["counters"]["workload"]
    assert tables.counters_workload_line(doc) is None


def test_without_room_for_the_fp32_run_fidelity_is_null_with_the_reason(monkeypatch):
    from bubblescope import fidelity as fid
    from bubblescope.errors import EngineUnavailable
    from bubblescope.models import dummy_weights, get_preset

    def no_room(*args, **kwargs):
        raise EngineUnavailable("the float32 copy of the weights does not fit in the device's memory")

    monkeypatch.setattr(fid, "fp32_logits", no_room)
    w16 = dummy_weights(get_preset("tiny-llama"), "cpu", torch.bfloat16, seed=0)
    oracle = fid.fp32_oracle(w16, [1, 2], [3], 8, torch.zeros(2, 4))
    assert oracle == {"fp32": None, "ref_fidelity": None,
                      "fp32_reason": "the float32 copy of the weights does not fit in the device's memory"}
    assert fid.fidelity_entry(torch.zeros(2, 4), [3], oracle) == {
        "kl_vs_fp32": None, "nll": None, "nll_fp32": None, "ref_kl_vs_fp32": None, "ref_nll": None,
        "fidelity_matched": None}
    # float32 weights are their own fp32 run: nothing to copy, the reference's KL is 0
    w32 = w16.to(dtype=torch.float32)
    logits = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    oracle = fid.fp32_oracle(w32, [1], [0], 8, logits)
    assert oracle["fp32"] is logits and oracle["ref_fidelity"]["kl_vs_fp32"] == 0.0
    entry = fid.fidelity_entry(logits, [0], oracle)
    assert entry["fidelity_matched"] is True and entry["nll"] == entry["ref_nll"] == pytest.approx(
        math.log(1 + math.e))  # -log softmax([0, 1])[0]


def test_a_cpu_run_says_its_megakernel_rungs_time_the_interpreter():
    doc = g.healthy_doc()
    assert tables.ladder_note(doc) == tables.LADDER_NOTE
    doc["device"]["type"] = "cpu"
    assert tables.ladder_note(doc).endswith("on this CPU run the megakernel rungs time the Triton interpreter, not "
                                            "the kernel")
    fused = copy.deepcopy(next(e for e in doc["engines"] if e["name"] == "reference-cudagraph"))
    fused["name"] = "reference-fused"
    doc["engines"].append(fused)
    assert tables.ladder_note(doc).endswith("on this CPU run the megakernel and fused rungs time the Triton "
                                            "interpreter, not the kernel")
    doc["engines"] = [e for e in doc["engines"] if not e["name"].startswith("megakernel")]
    assert tables.ladder_note(doc).endswith("on this CPU run the fused rungs time the Triton interpreter, not the "
                                            "kernel")
    assert tables.steps_note(g.null_metrics_doc()) is None  # no GPU timeline: no per-step figures to qualify


def test_gpu_idle_is_the_timed_steps_share_not_the_profiled_windows():
    """The profiler's cost per launch lengthens a host-bound step: an H200's graphed reference idled 29 % of its
    profiled window, yet its GPU was busy 2,893 µs of each 3,305 µs timed step, so at most 412 µs (12.5 %) idle."""
    from bubblescope.reports.ladder import bubble_us, idle_parts

    doc = g.healthy_doc()
    ref = g.engine(doc, "reference-cudagraph")
    ref["latency"]["token_ms_p50"] = 3.305
    ref["timeline"].update(bubble_ratio=0.29, gpu_busy_us_per_step=2893.0, kernels_per_step=81,
                           idle={"host_wait_us": 900.0, "kernel_wait_us": 20.0, "other_us": 5.0})
    ratio, source = bubble_ratio(ref)
    assert source == GPU_IDLE and ratio == pytest.approx(412 / 3305, abs=1e-6)
    assert bubble_us(ref) == pytest.approx(412.0, abs=0.01)
    # the gaps between queued kernels and the other gaps keep their µs; the host's wait is the rest, so the parts
    # add up to the idle µs the tables show
    parts = idle_parts(ref)
    assert parts["kernel_wait_us"] == 20.0 and parts["other_us"] == 5.0
    assert parts["host_wait_us"] == pytest.approx(387.0, abs=0.01)
    row = next(r for r in ladder(doc) if r["engine"] == "reference-cudagraph")  # the JSON carries the same split
    assert row["idle_us"] == parts and sum(parts.values()) == pytest.approx(row["bubble_us"], abs=1e-9)
    ref["timeline"]["idle"]["kernel_wait_us"] = 500.0  # more gap µs than the timed step has idle: cut to it
    assert idle_parts(ref) == pytest.approx({"host_wait_us": 0.0, "kernel_wait_us": 412.0, "other_us": 0.0},
                                            abs=0.01)
    ref["timeline"]["gpu_busy_us_per_step"] = 3400.0  # busier than the timed step: no idle, not a negative one
    assert bubble_ratio(ref) == (0.0, GPU_IDLE)
    ref["timeline"]["gpu_busy_us_per_step"] = None  # no busy time recorded: the profiled window's own figure
    assert bubble_ratio(ref) == (0.29, GPU_IDLE) and idle_parts(ref) is not None


def test_the_verdict_quotes_the_bubble_the_tables_show():
    """A megakernel step of two kernels (the kernel and the greedy pick): its table bubble is the GPU's idle share,
    so the verdict must not lead with the in-kernel wait the table does not show (40 % against 0.180)."""
    from bubblescope.reports.verdict import verdict

    doc = g.healthy_doc()
    mk = g.engine(doc, "megakernel")
    mk["intrakernel"]["wait_ratio"] = 0.40
    g.idle(mk, 0.18)["kernels_per_step"] = 2
    assert bubble_ratio(mk) == (0.18, GPU_IDLE)
    v = verdict(rederive(doc))
    assert v["best"] == "megakernel" and "program-time" not in v["text"]
    assert v["text"].startswith("Fastest: megakernel at 0.800 ms/token") and "GPU idle 18% of the step" in v["text"]
    mk["timeline"]["kernels_per_step"] = 1  # one kernel: the in-kernel wait is the table's bubble and the verdict's
    v = verdict(rederive(doc))
    assert bubble_ratio(mk) == (0.40, IN_KERNEL) and "40% of program-time waiting on dependencies" in v["text"]
