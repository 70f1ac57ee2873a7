"""Findings rules: each fires on a document built to trigger it, with the document's numbers as evidence."""

from __future__ import annotations

import pytest

from . import resultsgen as g
from bubblescope.reports.findings import THRESHOLDS, find
from bubblescope.reports.results import validate_results


LEAD = "megakernel-vs-op-by-op"  # fires on every GPU document with both a megakernel and an op-by-op engine


def _engine_findings(doc: dict) -> list[dict]:
    """The findings of ``doc`` less the megakernel's lead over the best op-by-op engine (tested on its own)."""
    return [f for f in find(doc) if f["rule"] != LEAD]


def _only(findings: list[dict], rule: str) -> dict:
    findings = [f for f in findings if f["rule"] != LEAD or rule == LEAD]
    assert [f["rule"] for f in findings] == [rule], findings
    return findings[0]


def test_silent_on_healthy_and_on_unmeasured_documents():
    assert [f["rule"] for f in find(g.healthy_doc())] == [LEAD]  # context (info), no engine rule
    assert find(g.null_metrics_doc()) == []


def test_launch_bound():
    doc = g.healthy_doc()
    tl = g.idle(g.engine(doc, "reference-cudagraph"), 0.62)
    tl.update(kernels_per_step=412, launches_per_step=412, launch_share=0.55)
    f = _only(find(doc), "launch-bound")
    assert f["engine"] == "reference-cudagraph" and f["severity"] == "problem"
    # 0.62 of the 1.1 ms step (the p50 the latency table shows) = 682 µs
    assert f["evidence"] == {"bubble_ratio": 0.62, "kernels_per_step": 412, "launches_per_step": 412,
                             "launch_share": 0.55, "bubble_us": 682.0}
    assert f["title"] == "Launch-bound: the GPU is idle 62% of each step (682 µs of the 1,100 µs step) across 412 kernels"


def test_launch_bound_thresholds_are_inclusive_and_need_both_inputs():
    doc = g.healthy_doc()
    ref = g.engine(doc, "reference-cudagraph")
    tl = g.idle(ref, 0.5)
    tl.update(kernels_per_step=100, launches_per_step=100)
    assert [f["rule"] for f in _engine_findings(doc)] == ["launch-bound"]
    g.idle(ref, 0.49)
    assert _engine_findings(doc) == []
    g.idle(ref, 0.9)
    tl.update(kernels_per_step=None)
    assert _engine_findings(doc) == []


def test_bubble_bound_on_a_graphed_step():
    doc = g.healthy_doc()
    g.idle(g.engine(doc, "reference-cudagraph"), 0.31)
    f = _only(find(doc), "bubble-bound")
    assert f["engine"] == "reference-cudagraph" and f["severity"] == "warn"
    assert f["evidence"] == {"bubble_ratio": 0.31, "launches_per_step": 1, "kernels_per_step": 180,
                             "util_copy": 0.5304, "bubble_us": 341.0}  # 0.31 × 1,100 µs
    assert f["title"] == ("Bubble-bound: 1 launch per step, yet the GPU is idle 31% of it (341 µs of the 1,100 µs "
                          "step); it streams 53% of the measured copy bandwidth")


def test_bubble_bound_on_a_megakernel_is_its_in_kernel_wait():
    doc = g.healthy_doc()
    g.engine(doc, "megakernel")["intrakernel"]["wait_ratio"] = 0.27
    f = _only(find(doc), "bubble-bound")
    assert f["engine"] == "megakernel" and f["evidence"]["bubble_ratio"] == 0.27
    assert f["evidence"]["bubble_us"] == 216.0  # 0.27 × 800 µs
    assert f["title"].startswith("Bubble-bound: one kernel per step, yet its programs wait on dependencies 27% of "
                                 "program-time (the megakernel's own clock)")


def test_host_gaps_between_megakernel_steps_are_no_bubble():
    """The H100 run flagged the megakernel "Bubble-bound" from the idle time between its steps (0.198 / 0.273):
    a one-kernel step's bubble is its in-kernel wait (5 % here), so nothing fires."""
    doc = g.healthy_doc()
    g.engine(doc, "megakernel")["timeline"]["bubble_ratio"] = 0.273
    assert _engine_findings(doc) == []


def test_bubbles_at_the_measured_ceiling_are_not_bubble_bound():
    doc = g.healthy_doc()
    ref = g.engine(doc, "reference-cudagraph")
    g.idle(ref, 0.31)
    ref["bandwidth"]["util_copy"] = 0.96
    assert [f["rule"] for f in _engine_findings(doc)] == ["near-bandwidth-limit"]


def test_gpu_idle_between_a_few_kernels_is_a_finding():
    """81 kernels at 78 % idle: too few kernels for launch-bound, too many launches for bubble-bound; the rule
    between them names where the idle time goes."""
    doc = g.healthy_doc()
    ref = g.engine(doc, "reference-cudagraph")
    tl = g.idle(ref, 0.78)
    tl.update(kernels_per_step=81, launches_per_step=81)
    tl["idle"].update(host_wait_us=800.0, kernel_wait_us=60.0)  # other_us 6.0
    f = _only(find(doc), "gpu-idle")
    assert f["severity"] == "problem"
    # 858 µs idle in the timed step: the gaps between queued kernels (60) and the other gaps (6) keep their µs,
    # the host's wait takes the rest (792), so the parts add up to the total
    assert f["title"] == ("GPU idle 78% of each step (858 µs of the 1,100 µs step) across 81 kernels: 792.0 µs "
                          "waiting for the host, 60.0 µs in gaps between kernels, 6.0 µs in other gaps per step")
    assert 792.0 + 60.0 + 6.0 == f["evidence"]["bubble_us"] == 858.0
    assert "host" in f["advice"] and f["evidence"]["host_wait_per_step_us"] == 792.0
    tl["idle"].update(host_wait_us=10.0, kernel_wait_us=700.0, other_us=0.0)
    f = _only(find(doc), "gpu-idle")
    assert "fewer, larger kernels" in f["advice"] and "other gaps" not in f["title"]  # no "0.0 µs" part
    g.idle(ref, 0.45)  # under half the step: not what limits it
    assert _engine_findings(doc) == []


def test_near_bandwidth_limit_is_judged_against_the_measured_copy():
    doc = g.healthy_doc()
    bw = g.engine(doc, "megakernel")["bandwidth"]
    bw.update(util_peak=0.86, util_copy=0.97, effective_GBps=4140.3)
    f = _only(find(doc), "near-bandwidth-limit")
    assert f["severity"] == "info"
    assert f["evidence"] == {"util_copy": 0.97, "util_peak": 0.86, "effective_GBps": 4140.3, "copy_GBps": 4260.0}
    assert f["title"] == ("At the measured bandwidth ceiling: 4,140 GB/s is 97% of the copy bandwidth measured on "
                          "this GPU (4,260 GB/s) and 86% of NVML peak")


@pytest.mark.parametrize("util_copy", [0.93, None])
def test_81_percent_of_peak_is_not_done_below_the_measured_ceiling(util_copy):
    """81 % of NVML peak while a plain chain of the same matvecs reached 85 %: not "done" unless the copy
    measured on the GPU says so, and never asserted without a measurement."""
    doc = g.healthy_doc()
    g.engine(doc, "megakernel")["bandwidth"].update(util_peak=0.81, util_copy=util_copy)
    if util_copy is None:
        doc["device"]["copy_GBps"] = None
    assert _engine_findings(doc) == []


def test_prefill_dominated_when_ttft_exceeds_the_decode_time():
    doc = g.healthy_doc()
    g.engine(doc, "reference-cudagraph")["latency"]["ttft_ms"] = 150.0  # 127 decode steps × 1.1 ms = 139.7 ms
    f = _only(find(doc), "prefill-dominated")
    assert f["severity"] == "info" and f["engine"] == "reference-cudagraph"
    assert f["title"] == ("Prefill-dominated on reference-cudagraph: TTFT 150.00 ms exceeds the 127 decode steps' "
                          "139.70 ms (prompt 32 tokens, 128 new tokens)")
    assert f["evidence"] == {"ttft_ms": 150.0, "decode_ms": 139.7, "e2e_ms": 289.7, "tpot_p50_ms": 1.1,
                             "gen_len": 128, "prompt_len": 32}


def test_prefill_dominated_reads_the_measured_generation_time():
    doc = g.healthy_doc()
    lat = g.engine(doc, "reference-cudagraph")["latency"]
    lat.update(ttft_ms=150.0, e2e_ms=320.0)  # measured decode 170 ms > TTFT: decode dominates
    assert _engine_findings(doc) == []
    lat.update(e2e_ms=280.0)  # decode 130 ms < TTFT
    assert _only(find(doc), "prefill-dominated")["evidence"]["decode_ms"] == 130.0


def test_prefill_dominated_does_not_fire_while_decode_dominates():
    """A TTFT of 12.5 ms against 127 decode steps of 1.1 ms: decode is most of the request, whatever a stored
    decode share says."""
    doc = g.healthy_doc()
    g.engine(doc, "reference-cudagraph")["latency"]["decode_share"] = 0.31
    assert _engine_findings(doc) == []


def _cold_doc(first_tpot: float, first_ttft: float, tokens: int = 127) -> dict:
    """The healthy document with the graphed reference's first generation (timed: 1.1 ms/token, TTFT 12.5 ms)."""
    doc = g.healthy_doc()
    g.engine(doc, "reference-cudagraph")["latency"]["first_run"] = {
        "token_ms_p50": first_tpot, "ttft_ms": first_ttft, "tokens": tokens}
    return doc


def test_cold_start_when_the_first_generation_is_slow():
    """A first generation at 2.75 ms/token (2.5 × the timed 1.1) with a 200 ms TTFT (16 × the timed 12.5 ms)."""
    doc = _cold_doc(2.75, 200.0)
    assert validate_results(doc) == []
    f = _only(find(doc), "cold-start")
    assert f["severity"] == "info" and f["engine"] == "reference-cudagraph"
    assert f["title"] == ("Cold start on reference-cudagraph: the first generation ran at 2.750 ms/token, 2.5× the "
                          "timed 1.100 ms/token, and took 200.000 ms to its first token, 16.0× the timed 12.500 ms")
    assert f["evidence"] == {"first_tpot_p50_ms": 2.75, "tpot_p50_ms": 1.1, "tpot_first_over_timed": 2.5,
                             "first_ttft_ms": 200.0, "ttft_ms": 12.5, "ttft_first_over_timed": 16.0,
                             "first_run_tokens": 127}
    assert "warm each engine" in f["advice"]


def test_cold_start_from_the_decode_steps_or_the_prefill_alone():
    # TPOT 1.76 ms = 1.6 × 1.1, 127 steps × 0.66 ms = 83.8 ms lost; TTFT as timed: the title names the decode only
    f = _only(find(_cold_doc(1.76, 12.5)), "cold-start")
    assert f["evidence"]["tpot_first_over_timed"] == 1.6
    assert f["title"] == ("Cold start on reference-cudagraph: the first generation ran at 1.760 ms/token, 1.6× the "
                          "timed 1.100 ms/token")
    # TTFT 37.5 ms = 3 × 12.5 ms, 25 ms above it; a faster first decode (0.9 ms/token) is not called slow
    f = _only(find(_cold_doc(0.9, 37.5)), "cold-start")
    assert f["evidence"]["ttft_first_over_timed"] == 3.0
    assert f["title"] == ("Cold start on reference-cudagraph: the first generation took 37.500 ms to its first "
                          "token, 3.0× the timed 12.500 ms")


@pytest.mark.parametrize("first_tpot, first_ttft, tokens", [
    (1.3, 14.0, 127),    # close to the timed 1.1 ms/token and 12.5 ms
    (1.6, 30.0, 127),    # 1.45× the TPOT, 2.4× the TTFT: both under their ratios
    (2.2, 12.5, 3),      # 2× the TPOT, but 3 steps × 1.1 ms = 3.3 ms lost: below the 10 ms floor
])
def test_cold_start_silent_when_the_first_generation_is_close(first_tpot, first_ttft, tokens):
    assert _engine_findings(_cold_doc(first_tpot, first_ttft, tokens)) == []


def test_cold_start_needs_10_ms_above_the_timed_ttft():
    """A TTFT ratio far above 3 but a few ms in all (0.2 ms timed, 5 ms first) is noise, not a cold start."""
    doc = _cold_doc(1.1, 5.0)
    g.engine(doc, "reference-cudagraph")["latency"]["ttft_ms"] = 0.2
    assert _engine_findings(doc) == []
    g.engine(doc, "reference-cudagraph")["latency"]["first_run"]["ttft_ms"] = 10.2  # 51×, 10 ms above: fires
    assert _only(find(doc), "cold-start")["evidence"]["first_ttft_ms"] == 10.2


def test_cold_start_silent_without_a_first_run():
    doc = g.healthy_doc()  # documents written before latency.first_run
    assert "first_run" not in g.engine(doc, "reference-cudagraph")["latency"]
    assert _engine_findings(doc) == []
    g.engine(doc, "reference-cudagraph")["latency"]["first_run"] = None  # warmup 0
    doc["workload"]["warmup"] = 0
    assert validate_results(doc) == [] and _engine_findings(doc) == []
    doc = _cold_doc(2.75, 200.0)
    g.engine(doc, "reference-cudagraph")["latency"]["first_run"]["token_ms_p50"] = None  # one input null
    assert _engine_findings(doc) == []
    doc = _cold_doc(2.75, 200.0)
    g.engine(doc, "reference-cudagraph")["latency"]["ttft_ms"] = None
    assert _engine_findings(doc) == []


def _row(context, p50, nbytes, kv):
    return {"context": context, "token_ms_p50": p50, "bytes_per_step": nbytes, "kv_bytes_per_step": kv,
            "effective_GBps": None, "util_peak": None}


def test_kv_bound_at_long_context():
    doc = g.healthy_doc()
    g.engine(doc, "megakernel")["sweep"] = [
        _row(32768, 1.3, 3_300_000_000, 1_320_000_000),  # out of order on purpose: the rule sorts
        _row(128, 0.8, 2_000_000_000, 20_000_000),
        _row(4096, 0.9, 2_200_000_000, 160_000_000),
    ]
    f = _only(find(doc), "kv-bound")
    assert f["evidence"] == {"context_short": 128, "context_long": 32768, "kv_share_long": 0.4,
                             "token_ms_p50_short": 0.8, "token_ms_p50_long": 1.3, "latency_growth": 1.625}
    # A large KV share whose latency does not grow is not a problem.
    g.engine(doc, "megakernel")["sweep"][0]["token_ms_p50"] = 0.85
    assert _engine_findings(doc) == []


def test_fused_path_slower_than_expected():
    doc = g.healthy_doc()
    mk = g.engine(doc, "megakernel")
    mk["bandwidth"]["util_peak"] = 0.41
    mk["compile"].update(registers=255, spills=24, programs_per_sm=1)
    f = _only(find(doc), "fused-slow")
    assert f["evidence"] == {"util_peak": 0.41, "registers": 255, "spills": 24, "programs_per_sm": 1}
    assert f["title"] == ("Fused path slower than expected: 41% of peak with register spills and poor residency "
                          "and high register use")


@pytest.mark.parametrize("compile_info, fires", [
    ({"registers": 128, "spills": 0, "programs_per_sm": 4}, False),
    ({"registers": 128, "spills": 8, "programs_per_sm": 4}, True),
    ({"registers": 128, "spills": 2, "programs_per_sm": 4}, False),  # the H200 default: 2 words, harmless
    ({"registers": 128, "spills": 0, "programs_per_sm": 1}, True),
    ({"registers": 200, "spills": 0, "programs_per_sm": 4}, True),
    ({"registers": None, "spills": None, "programs_per_sm": None}, False),
])
def test_fused_slow_causes(compile_info, fires):
    doc = g.healthy_doc()
    mk = g.engine(doc, "megakernel")
    mk["bandwidth"]["util_peak"] = 0.41
    mk["compile"].update(compile_info)
    assert [f["rule"] for f in _engine_findings(doc)] == (["fused-slow"] if fires else [])


def test_fused_slow_ignores_the_gluon_kernels_one_cta_per_sm():
    """The H200 diagnose of 2026-12-01 flagged megakernel-stages (Gluon, 255 registers, 1 CTA/SM by design) with
    "cut registers until 2 programs fit": wrong advice for a TMA-ring kernel. Spills still count."""
    doc = g.healthy_doc()
    mk = g.engine(doc, "megakernel")
    mk["bandwidth"]["util_peak"] = 0.10
    mk["compile"].update(registers=255, spills=0, programs_per_sm=1, implementation="gluon")
    assert _engine_findings(doc) == []
    mk["compile"].update(spills=24)
    assert _only(find(doc), "fused-slow")["title"].endswith("with register spills")


def test_fused_slow_only_for_megakernel_engines():
    doc = g.healthy_doc()
    ref = g.engine(doc, "reference-cudagraph")
    ref["compile"] = {"registers": 255, "spills": 24, "shared_bytes": None, "num_warps": None,
                      "programs_per_sm": 1, "grid": None}
    ref["bandwidth"]["util_peak"] = 0.3
    assert _engine_findings(doc) == []


def test_numerical_divergence():
    doc = g.healthy_doc()
    g.engine(doc, "reference-cudagraph")["correctness"].update(token_agreement=0.96875, max_abs_logit_diff=0.5)
    f = _only(find(doc), "numerical-divergence")
    assert f["evidence"] == {"token_agreement": 0.96875, "steps": 32, "max_abs_logit_diff": 0.5,
                             "rel_logit_err": 0.0}
    assert "reference" in f["title"]


def test_unstable_heavy_tail():
    doc = g.healthy_doc()
    g.engine(doc, "megakernel")["latency"].update(token_ms_p90=1.0, token_ms_p99=1.6)
    f = _only(find(doc), "unstable")
    assert f["evidence"] == {"token_ms_p50": 0.8, "token_ms_p99": 1.6, "p99_over_p50": 2.0}
    assert f["title"] == "Unstable latency: p99 1.600 ms is 2.00x the p50 0.800 ms"
    g.engine(doc, "megakernel")["latency"].update(token_ms_p99=1.2)  # 1.5x: the limit itself is not a heavy tail
    assert _engine_findings(doc) == []


def test_unstable_title_and_evidence_print_a_figure_one_way():
    """p50 10.80145 ms printed 10.801 in the title and 10.802 from its 4-decimal evidence (10.8015)."""
    from bubblescope.reports.tables import evidence_text

    doc = g.healthy_doc()
    g.engine(doc, "megakernel")["latency"].update(token_ms_p50=10.80145, token_ms_p90=12.0, token_ms_p99=20.66546)
    f = _only(find(doc), "unstable")
    text = evidence_text(f["evidence"])
    assert f["title"] == "Unstable latency: p99 20.665 ms is 1.91x the p50 10.801 ms"
    assert "10.801" in text and "20.665" in text and "10.802" not in text and "20.666" not in text


def _cpu_tail_doc(threads: dict | None) -> dict:
    doc = g.healthy_doc()
    doc["device"]["type"] = "cpu"
    if threads is not None:
        doc["device"]["threads"] = threads
    g.engine(doc, "megakernel")["latency"].update(token_ms_p90=1.0, token_ms_p99=1.6)
    return doc


def test_cpu_thread_advice_reads_the_environment_the_run_had():
    f = _only(find(_cpu_tail_doc({"torch_threads": 1, "omp_num_threads": "1", "cpu_count": 2})), "unstable")
    assert "OMP_NUM_THREADS was 1 already" in f["advice"] and "try OMP_NUM_THREADS=1" not in f["advice"]
    assert f["evidence"]["omp_num_threads"] == 1 and f["evidence"]["torch_threads"] == 1
    f = _only(find(_cpu_tail_doc({"torch_threads": 2, "omp_num_threads": None, "cpu_count": 2})), "unstable")
    assert "torch ran 2 threads on 2 cores with OMP_NUM_THREADS unset" in f["advice"]
    assert "try OMP_NUM_THREADS=1" in f["advice"]
    f = _only(find(_cpu_tail_doc({"torch_threads": 1, "omp_num_threads": None, "cpu_count": 8})), "unstable")
    assert "OMP_NUM_THREADS=1" not in f["advice"] and "one thread already" in f["advice"]
    f = _only(find(_cpu_tail_doc(None)), "unstable")  # a document without the record: a conditional advice
    assert "If OMP_NUM_THREADS is not set" in f["advice"]


def test_latency_growing_with_context_is_not_called_unstable():
    doc = g.healthy_doc()
    eng = g.engine(doc, "reference-cudagraph")
    eng["sweep"][2]["token_ms_p50"] = 1.6  # 4096 tokens: +45 % latency for +5 % bytes
    f = _only(find(doc), "context-growth")
    bytes_growth = (2_480_000_000 + 32_768 * 4096) / (2_480_000_000 + 32_768 * 128)
    assert f["evidence"]["bytes_growth"] == pytest.approx(bytes_growth, abs=1e-4)
    assert f["evidence"]["latency_growth"] == pytest.approx(1.6 / 1.1, abs=1e-4)
    assert f["evidence"]["sweep_latency_over_bytes_growth"] == pytest.approx((1.6 / 1.1) / bytes_growth, abs=1e-4)
    assert f["title"] == ("Latency grows faster than bytes with context: 1.45x ms/token for 1.05x bytes per step "
                          "from 128 tokens to 4,096 tokens")
    eng["sweep"][2]["token_ms_p50"] = 1.3  # 1.18x for 1.05x bytes: within the allowance
    assert _engine_findings(doc) == []


def test_skipped_engines_are_ignored_and_findings_fit_the_schema():
    doc = g.healthy_doc()
    hf = g.engine(doc, "hf")
    hf["latency"] = {"decode_share": 0.1}
    g.engine(doc, "megakernel")["bandwidth"]["util_copy"] = 0.97
    g.idle(g.engine(doc, "reference-cudagraph"), 0.7).update(kernels_per_step=300, launches_per_step=300)
    found = find(doc)
    # Ladder order: reference-cudagraph before megakernel, whatever the document order; the document's rules last.
    assert [(f["engine"], f["rule"]) for f in found] == [("reference-cudagraph", "launch-bound"),
                                                        ("megakernel", "near-bandwidth-limit"),
                                                        ("megakernel", LEAD)]
    hf["latency"] = None
    doc["findings"] = found
    assert validate_results(doc) == []


def test_threshold_overrides():
    doc = g.healthy_doc()
    f = _only(find(doc, {"near_limit_min_util_copy": 0.7}), "near-bandwidth-limit")
    assert f["evidence"]["util_copy"] == 0.7293
    assert THRESHOLDS["near_limit_min_util_copy"] == 0.95
    with pytest.raises(KeyError, match="no_such_threshold"):
        find(doc, {"no_such_threshold": 1})


def _rung(doc: dict, name: str, p50: float, bubble: float | None = None, kernels: float = 180,
          launches: float = 1) -> dict:
    """An op-by-op engine entry named ``name`` (the graphed reference's, retimed to ``p50`` ms)."""
    import copy

    eng = copy.deepcopy(g.engine(doc, "reference-cudagraph"))
    eng["name"] = name
    eng["latency"].update(token_ms_p50=p50, token_ms_p90=p50, token_ms_p99=p50)
    g.idle(eng, bubble).update(kernels_per_step=kernels, launches_per_step=launches)
    doc["engines"].append(eng)
    return eng


def test_the_megakernel_is_measured_against_the_best_op_by_op_engine():
    doc = g.healthy_doc()
    eager = _rung(doc, "reference", 3.4, bubble=0.6, kernels=412, launches=412)  # eager: 0.6 × 3,400 µs = 2,040 µs of bubbles
    _rung(doc, "reference-fused-pdl", 0.85, bubble=0.04, kernels=97)  # 0.04 × 850 µs = 34 µs left
    eager["timeline"]["launch_share"] = 0.2
    assert [f["rule"] for f in find(doc)] == ["launch-bound", LEAD]  # the eager engine's own problem, then the lead
    f = _only(find(doc)[1:], LEAD)
    assert f["engine"] == "megakernel" and f["severity"] == "info"
    assert f["title"] == ("The megakernel is 1.06x the best op-by-op engine (reference-fused-pdl): 0.800 vs 0.850 "
                          "ms/token, 50.0 µs per token; reference-fused-pdl already removes 2,006 of the 2,040 µs of "
                          "bubbles per step of the eager reference")
    assert f["evidence"] == {"megakernel_token_ms_p50": 0.8, "best_op_by_op_token_ms_p50": 0.85,
                             "speedup_over_best_op_by_op": 1.0625, "step_saved_us": 50.0, "eager_bubble_us": 2040.0,
                             "best_op_by_op_bubble_us": 34.0, "bubbles_removed_us": 2006.0}


def test_a_megakernel_that_is_not_ahead_is_said_so():
    doc = g.healthy_doc()
    _rung(doc, "reference-fused-pdl", 0.76, bubble=0.04)
    f = _only(find(doc), LEAD)
    assert f["severity"] == "warn"
    assert f["title"] == ("The megakernel is not ahead: reference-fused-pdl (op-by-op) runs 0.760 ms/token, the "
                          "megakernel 0.800 ms/token (1.05x its time)")


def test_the_megakernels_lead_needs_both_engines_on_a_gpu():
    doc = g.healthy_doc()
    g.engine(doc, "reference-cudagraph")["status"] = "failed"
    assert LEAD not in [f["rule"] for f in find(doc)]
    doc = g.healthy_doc()
    doc["device"]["type"] = "cpu"  # the interpreter's megakernel times say nothing about the kernel
    assert LEAD not in [f["rule"] for f in find(doc)]


def test_report_derives_the_findings_again_from_the_numbers(tmp_path):
    """A results.json written by an older version carries a bubble-bound finding on the megakernel from the host
    gaps between its steps; `report` shows the findings its tables support, not the stale ones."""
    from typer.testing import CliRunner

    from bubblescope.cli import app
    from bubblescope.reports.results import write_results

    doc = g.healthy_doc()
    g.engine(doc, "megakernel")["timeline"]["bubble_ratio"] = 0.273
    doc["findings"] = [{"rule": "bubble-bound", "severity": "warn", "engine": "megakernel",
                        "title": "Bubble-bound: 1 launch(es) per step, yet the GPU is idle 27% of it",
                        "evidence": {"bubble_ratio": 0.273}, "advice": "Fuse neighbouring kernels."}]
    path = write_results(doc, tmp_path / "results.json")
    r = CliRunner().invoke(app, ["report", str(path), "--format", "json"])
    assert r.exit_code == 0
    import json
    out = json.loads(r.stdout)
    assert [f["rule"] for f in out["findings"]] == [LEAD]
    assert [row["engine"] for row in out["ladder"]][-1] == "megakernel"
    r = CliRunner().invoke(app, ["report", str(path)], env={"COLUMNS": "100"})
    assert r.exit_code == 0 and "Bubble-bound" not in r.stdout and "1.38x the best op-by-op engine" in r.stdout


def test_a_rung_slower_than_the_one_below_is_explained_with_both_rungs_numbers():
    doc = g.healthy_doc()
    _rung(doc, "reference-fused", 1.0, bubble=0.05, kernels=97)
    pdl = _rung(doc, "reference-fused-pdl", 1.03, bubble=0.03, kernels=97)  # 30 µs slower: 3 % of 1,000 µs
    f = _only(find(doc), "rung-slower")
    assert f["engine"] == "reference-fused-pdl" and f["severity"] == "warn"
    assert f["title"] == ("reference-fused-pdl is 30.0 µs per token slower than the rung below it, reference-fused "
                          "(1.030 vs 1.000 ms/token): removing inter-kernel drain and fill did not pay here (bubble "
                          "ratio 0.030 vs 0.050, 47% vs 47% of NVML peak)")
    assert f["evidence"]["step_us"] == -30.0 and f["evidence"]["below_token_ms_p50"] == 1.0
    pdl["latency"].update(token_ms_p50=1.01, token_ms_p90=1.01, token_ms_p99=1.01)  # 10 µs: within the spread
    assert "rung-slower" not in [x["rule"] for x in find(doc)]
    pdl["latency"].update(token_ms_p50=1.03, token_ms_p90=1.03, token_ms_p99=1.03)
    doc["device"]["type"] = "cpu"  # CPU runs time the interpreter: no ladder finding
    assert "rung-slower" not in [x["rule"] for x in find(doc)]
