"""Findings rules: each fires on a document built to trigger it, with the document's numbers as evidence."""

from __future__ import annotations

import pytest

from . import resultsgen as g
from bubblescope.reports.findings import THRESHOLDS, find
from bubblescope.reports.results import validate_results


def _only(findings: list[dict], rule: str) -> dict:
    assert [f["rule"] for f in findings] == [rule], findings
    return findings[0]


def test_silent_on_healthy_and_on_unmeasured_documents():
    assert find(g.healthy_doc()) == []
    assert find(g.null_metrics_doc()) == []


def test_launch_bound():
    doc = g.healthy_doc()
    tl = g.engine(doc, "reference-cudagraph")["timeline"]
    tl.update(bubble_ratio=0.62, kernels_per_step=412, launches_per_step=412, launch_share=0.55)
    f = _only(find(doc), "launch-bound")
    assert f["engine"] == "reference-cudagraph" and f["severity"] == "problem"
    assert f["evidence"] == {"bubble_ratio": 0.62, "kernels_per_step": 412, "launches_per_step": 412,
                             "launch_share": 0.55}
    assert "62%" in f["title"] and "412 kernels" in f["title"]


def test_launch_bound_thresholds_are_inclusive_and_need_both_inputs():
    doc = g.healthy_doc()
    tl = g.engine(doc, "reference-cudagraph")["timeline"]
    tl.update(bubble_ratio=0.5, kernels_per_step=100, launches_per_step=100)
    assert [f["rule"] for f in find(doc)] == ["launch-bound"]
    tl.update(bubble_ratio=0.49)
    assert find(doc) == []
    tl.update(bubble_ratio=0.9, kernels_per_step=None)
    assert find(doc) == []


def test_bubble_bound():
    doc = g.healthy_doc()
    g.engine(doc, "megakernel")["timeline"]["bubble_ratio"] = 0.31
    f = _only(find(doc), "bubble-bound")
    assert f["engine"] == "megakernel"
    assert f["evidence"] == {"bubble_ratio": 0.31, "launches_per_step": 1, "kernels_per_step": 1}


def test_near_bandwidth_limit_is_good_news():
    doc = g.healthy_doc()
    g.engine(doc, "megakernel")["bandwidth"]["util_peak"] = 0.86
    f = _only(find(doc), "near-bandwidth-limit")
    assert f["severity"] == "info"
    assert f["evidence"] == {"util_peak": 0.86, "effective_GBps": 3106.6, "util_copy": 0.7293}


def test_prefill_dominated():
    doc = g.healthy_doc()
    g.engine(doc, "reference-cudagraph")["latency"]["decode_share"] = 0.31
    f = _only(find(doc), "prefill-dominated")
    assert f["severity"] == "info"
    assert f["evidence"] == {"decode_share": 0.31, "ttft_ms": 12.5, "token_ms_p50": 1.1, "gen_len": 128}


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
    assert find(doc) == []


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
    assert [f["rule"] for f in find(doc)] == (["fused-slow"] if fires else [])


def test_fused_slow_ignores_the_gluon_kernels_one_cta_per_sm():
    """The H200 diagnose of 2026-12-01 flagged megakernel-stages (Gluon, 255 registers, 1 CTA/SM by design) with
    "cut registers until 2 programs fit": wrong advice for a TMA-ring kernel. Spills still count."""
    doc = g.healthy_doc()
    mk = g.engine(doc, "megakernel")
    mk["bandwidth"]["util_peak"] = 0.10
    mk["compile"].update(registers=255, spills=0, programs_per_sm=1, implementation="gluon")
    assert find(doc) == []
    mk["compile"].update(spills=24)
    assert _only(find(doc), "fused-slow")["title"].endswith("with register spills")


def test_fused_slow_only_for_megakernel_engines():
    doc = g.healthy_doc()
    ref = g.engine(doc, "reference-cudagraph")
    ref["compile"] = {"registers": 255, "spills": 24, "shared_bytes": None, "num_warps": None,
                      "programs_per_sm": 1, "grid": None}
    ref["bandwidth"]["util_peak"] = 0.3
    assert find(doc) == []


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
    assert f["evidence"]["token_ms_p50"] == 0.8 and f["evidence"]["token_ms_p99"] == 1.6
    assert f["evidence"]["p99_over_p50"] == 2.0


def test_unstable_across_context_lengths():
    doc = g.healthy_doc()
    eng = g.engine(doc, "reference-cudagraph")
    eng["sweep"][2]["token_ms_p50"] = 1.6  # 4096 tokens: +45 % latency for +5 % bytes
    f = _only(find(doc), "unstable")
    bytes_growth = (2_480_000_000 + 32_768 * 4096) / (2_480_000_000 + 32_768 * 128)
    assert f["evidence"]["sweep_latency_over_bytes_growth"] == pytest.approx((1.6 / 1.1) / bytes_growth, abs=1e-4)
    assert f["evidence"]["p99_over_p50"] == pytest.approx(1.15 / 1.1, abs=1e-4)


def test_skipped_engines_are_ignored_and_findings_fit_the_schema():
    doc = g.healthy_doc()
    hf = g.engine(doc, "hf")
    hf["latency"] = {"decode_share": 0.1}
    g.engine(doc, "megakernel")["bandwidth"]["util_peak"] = 0.9
    g.engine(doc, "reference-cudagraph")["timeline"].update(bubble_ratio=0.7, kernels_per_step=300,
                                                            launches_per_step=300)
    found = find(doc)
    # Ladder order: reference-cudagraph before megakernel, whatever the document order.
    assert [(f["engine"], f["rule"]) for f in found] == [("reference-cudagraph", "launch-bound"),
                                                        ("megakernel", "near-bandwidth-limit")]
    hf["latency"] = None
    doc["findings"] = found
    assert validate_results(doc) == []


def test_threshold_overrides():
    doc = g.healthy_doc()
    f = _only(find(doc, {"near_limit_min_util_peak": 0.6}), "near-bandwidth-limit")
    assert f["evidence"]["util_peak"] == 0.6453
    assert THRESHOLDS["near_limit_min_util_peak"] == 0.80
    with pytest.raises(KeyError, match="no_such_threshold"):
        find(doc, {"no_such_threshold": 1})
