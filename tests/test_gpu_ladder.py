"""GPU-only: a bf16 diagnose of the eager reference, its CUDA graph and the megakernel fills the ladder, the fidelity
against fp32, the one bubble ratio and the warm-up count as the reports read them (skipped on CPU)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    from bubblescope.diagnosis import diagnose

    res = diagnose("llama-3.2-1b", engines=["reference", "reference-cudagraph", "megakernel"], prompt_len=32,
                   gen_len=32, runs=2, warmup=1, context_sweep=[], profile_steps=4, device="cuda",
                   out=tmp_path_factory.mktemp("ladder"))
    return res.doc


def test_every_engine_is_measured_against_an_fp32_run(doc):
    from bubblescope.reports.ladder import fidelity_matched

    ok = {e["name"]: e for e in doc["engines"] if e["status"] == "ok"}
    assert set(ok) == {"reference", "reference-cudagraph", "megakernel"}
    ref = ok["reference"]["correctness"]
    # bf16 against fp32: a positive KL; the eager reference is the bar itself
    assert ref["kl_vs_fp32"] > 0 and ref["kl_vs_fp32"] == pytest.approx(ref["ref_kl_vs_fp32"], rel=1e-3)
    assert abs(ref["nll"] - ref["nll_fp32"]) < 0.05 and ref["fidelity_matched"] is True
    for e in ok.values():
        c = e["correctness"]
        assert c["fidelity_matched"] == fidelity_matched(c["kl_vs_fp32"], c["nll"], c["ref_kl_vs_fp32"], c["ref_nll"])


def test_warm_up_is_left_out_and_the_megakernels_bubble_is_its_in_kernel_wait(doc):
    from bubblescope.reports.ladder import IN_KERNEL, bubble_ratio

    mk = next(e for e in doc["engines"] if e["name"] == "megakernel")
    assert mk["timeline"]["warmup_steps"] == 1 and mk["timeline"]["steps"] == 4
    assert mk["timeline"]["kernels_per_step"] == 1
    assert bubble_ratio(mk) == (mk["intrakernel"]["wait_ratio"], IN_KERNEL)
    rows = {r["engine"]: r for r in doc["ladder"]}
    assert rows["megakernel"]["bubble_source"] == IN_KERNEL
    assert rows["reference-cudagraph"]["below"] == "reference" and rows["reference-cudagraph"]["step_us"] > 0
    lat = mk["latency"]
    # two runs: the median of two generation times is their mean, TTFT's too, and the samples pool both runs
    assert lat["e2e_ms"] == pytest.approx(lat["ttft_ms"] + sum(lat["token_ms_samples"]) / 2, abs=1e-3)


def test_the_findings_compare_the_megakernel_with_the_best_op_by_op_engine(doc):
    lead = [f for f in doc["findings"] if f["rule"] == "megakernel-vs-op-by-op"]
    assert len(lead) == 1 and lead[0]["evidence"]["best_op_by_op_token_ms_p50"] == min(
        e["latency"]["token_ms_p50"] for e in doc["engines"] if e["name"].startswith("reference"))
    # the megakernel's bubble-bound finding, where there is one, is its in-kernel wait, not the host's gaps
    for f in doc["findings"]:
        if f["rule"] == "bubble-bound" and f["engine"] == "megakernel":
            assert f["evidence"]["bubble_ratio"] == next(
                e for e in doc["engines"] if e["name"] == "megakernel")["intrakernel"]["wait_ratio"]
