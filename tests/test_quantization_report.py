"""The quantization ablation: ``diagnose model --weights fp8`` records the FP8 run (its bytes, and each engine's
logits against the unquantized model), and the report puts it beside a bf16 run (``report FP8.json --bf16
BF16.json``). Hand-built documents with hand-computed speed-ups, and a CPU run of a tiny model checked against the
reference engine run here over the same weights."""

from __future__ import annotations

import json

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

import bubblescope
from bubblescope.cli import app
from bubblescope.errors import BubblescopeError
from bubblescope.generation import teacher_forced_logits
from bubblescope.models import get_preset
from bubblescope.models.weights import dummy_weights
from bubblescope.profiler.traffic import step_traffic
from bubblescope.reference_engine import ReferenceEngine
from bubblescope.reports.html import render_html
from bubblescope.reports.quantization import check_pair, quantization_rows, quantization_table
from bubblescope.reports.results import validate_results, write_results
from bubblescope.reports.terminal import render_results

from .resultsgen import engine, healthy_doc


def _pair():
    """An FP8 run and its bf16 baseline: the megakernel skipped in FP8, the cudagraph engine 1.6× faster."""
    bf16, fp8 = healthy_doc(), healthy_doc()
    fp8["model"]["weights"] = "fp8"
    fp8["model"]["weight_bytes"] = 1_500_000_000
    mk = engine(fp8, "megakernel")
    mk.update(status="skipped", reason="megakernel streams unquantized weights only, not fp8", latency=None,
              bandwidth=None, timeline=None, intrakernel=None, compile=None, correctness=None, sweep=[])
    cg = engine(fp8, "reference-cudagraph")
    base_ms = engine(bf16, "reference-cudagraph")["latency"]["token_ms_p50"]
    cg["latency"]["token_ms_p50"] = base_ms / 1.6
    cg["bandwidth"]["util_peak"] = 0.41
    cg["correctness"]["vs_unquantized"] = {"token_agreement": 0.96875, "max_abs_logit_diff": 0.5,
                                           "rel_logit_err": 0.043}
    return fp8, bf16, base_ms


def test_rows_put_each_engine_beside_its_bf16_run():
    fp8, bf16, base_ms = _pair()
    assert validate_results(fp8) == []
    rows = quantization_rows(fp8, bf16)
    assert [r["engine"] for r in rows] == ["reference-cudagraph"]        # the skipped megakernel has no row
    (row,) = rows
    assert row["speedup_x"] == pytest.approx(1.6) and row["bf16_token_ms_p50"] == base_ms
    assert row["fp8_util_peak"] == 0.41 and row["bf16_util_peak"] == engine(bf16, "reference-cudagraph")[
        "bandwidth"]["util_peak"]
    assert (row["top1_vs_bf16"], row["rel_logit_err_vs_bf16"]) == (0.96875, 0.043)
    alone = quantization_rows(fp8)                                        # no bf16 run: accuracy only
    assert alone[0]["speedup_x"] is None and alone[0]["top1_vs_bf16"] == 0.96875
    df = quantization_table(fp8, bf16)
    assert list(df.columns)[:3] == ["engine", "bf16_token_ms_p50", "fp8_token_ms_p50"]
    assert df.loc[0, "speedup_x"] == pytest.approx(1.6)
    assert quantization_rows(bf16, fp8) == []                             # a bf16 run has no ablation


def test_the_pair_must_be_the_same_run_in_fp8_and_bf16():
    fp8, bf16, _ = _pair()
    check_pair(fp8, bf16)
    with pytest.raises(BubblescopeError, match="--bf16: RESULTS.json is not an FP8 run"):
        check_pair(bf16, fp8)
    with pytest.raises(BubblescopeError, match="the baseline is an FP8 run too"):
        check_pair(fp8, fp8)
    other = healthy_doc()
    other["workload"]["gen_len"] = 256
    with pytest.raises(BubblescopeError, match="workload.gen_len 128 vs 256"):
        check_pair(fp8, other)


def test_reports_show_the_section_only_for_an_fp8_run():
    fp8, bf16, _ = _pair()
    fp8["quantization"] = quantization_rows(fp8, bf16)
    console = Console(record=True, width=120)
    render_results(fp8, console)
    text = console.export_text()
    assert "Quantization: bf16 against fp8 weights" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("reference-cudagraph") and "1.600" in ln)
    assert "96.9 %" in line and "0.043" in line
    assert "projections in FP8 e4m3 (--weights fp8)" in text
    html = render_html(fp8)
    assert 'id="quantization"' in html and "1.600" in html
    console = Console(record=True, width=120)
    render_results(bf16, console)
    assert "Quantization" not in console.export_text() and 'id="quantization"' not in render_html(bf16)


def test_a_float32_run_names_its_unquantized_weights_fp32_not_bf16():
    """On a CPU the unquantized model is float32: the section said "bf16 against fp8" and "top-1 vs bf16" there.
    A bfloat16 run keeps its bf16 labels."""
    fp8, _, _ = _pair()
    fp8["model"]["dtype"] = "float32"
    console = Console(record=True, width=200)
    render_results(fp8, console)
    text = console.export_text()
    section = text[text.index("Quantization:"):]
    assert section.startswith("Quantization: fp32 against fp8 weights")
    header = section.splitlines()[1:3]  # the two-line header: "top-1 vs" over "fp32"
    assert "top-1 vs" in header[0] and header[1].split()[-2:] == ["fp32", "error"]
    assert "over the unquantized (fp32) weights" in section and "fp32 columns —: no fp32 run given" in section
    assert "bf16" not in section.replace("--bf16", "").replace("--weights bf16", "").replace("BF16.json", "")
    html = render_html(fp8)
    assert "Quantization: fp32 against fp8 weights" in html and "unquantized (fp32) weights" in html
    fp8["model"]["dtype"] = "bfloat16"
    assert "Quantization: bf16 against fp8 weights" in render_html(fp8)


def test_report_command_joins_the_two_runs(tmp_path):
    fp8, bf16, _ = _pair()
    write_results(fp8, tmp_path / "fp8.json")
    write_results(bf16, tmp_path / "bf16.json")
    runner = CliRunner()
    out = runner.invoke(app, ["report", str(tmp_path / "fp8.json"), "--bf16", str(tmp_path / "bf16.json"),
                              "--format", "json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["quantization"][0]["speedup_x"] == pytest.approx(1.6)
    bad = runner.invoke(app, ["report", str(tmp_path / "bf16.json"), "--bf16", str(tmp_path / "fp8.json")])
    assert bad.exit_code == 2 and "is not an FP8 run" in bad.output and "Traceback" not in bad.output


def test_diagnose_records_the_fp8_bytes_and_the_cost_against_the_unquantized_model(tmp_path):
    res = bubblescope.diagnose("tiny-llama", engines=["reference"], prompt_len=4, gen_len=6, runs=1, warmup=0,
                               profile_steps=1, device="cpu", out=tmp_path / "o", weights="fp8")
    doc = res.doc
    assert validate_results(doc) == [] and doc["model"]["weights"] == "fp8"
    cfg = get_preset("tiny-llama")
    w32 = dummy_weights(cfg, seed=0)
    assert doc["model"]["weight_bytes"] == w32.as_format("fp8").nbytes()
    (eng,) = doc["engines"]
    assert eng["bandwidth"]["bytes_per_step"] == step_traffic(cfg, 4, 4 + 3, weights="fp8")["total_bytes"]
    # the same comparison made here: the FP8 reference's teacher-forced logits against the float32 model's, on the
    # tokens the run forced (seeded random ids for dummy weights: diagnosis.measure._forced)
    gen = torch.Generator().manual_seed(0)
    from bubblescope.generation import random_ids
    prompt = random_ids(cfg.vocab_size, 4, gen)
    forced = random_ids(cfg.vocab_size, 6, torch.Generator().manual_seed(1))
    a = teacher_forced_logits(ReferenceEngine(w32, max_seq_len=64), prompt, forced)
    b = teacher_forced_logits(ReferenceEngine(w32.as_format("fp8"), max_seq_len=64), prompt, forced)
    got = eng["correctness"]["vs_unquantized"]
    assert got["token_agreement"] == (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    assert got["rel_logit_err"] == pytest.approx(((a - b).norm(dim=-1) / a.norm(dim=-1)).max().item(), rel=1e-5)
    assert 0 < got["rel_logit_err"] < 0.2
    assert eng["correctness"]["token_agreement"] == 1.0        # against the reference over the same FP8 weights


def test_counters_profile_the_fp8_kernels_of_an_fp8_run():
    from bubblescope.counters import collect_counters, generate_argv

    assert generate_argv("m", "reference-fused", "cuda:0", "bfloat16", 0, weights="fp8")[-2:] == ["--weights", "fp8"]
    assert "--weights" not in generate_argv("m", "reference-fused", "cuda:0", "bfloat16", 0)
    seen = []
    doc = {"device": {"type": "cuda"}, "model": {"weights": "fp8-all"},
           "engines": [{"name": "reference-fused", "status": "ok", "timeline": {"kernels_per_step": 12}}]}
    collect_counters(doc, "m", "cuda:0", "bfloat16", run=lambda argv, **plan: seen.append(argv) or {
        "available": False, "reason": "x", "command": argv, "kernels": []})
    assert seen[0][-2:] == ["--weights", "fp8-all"]
