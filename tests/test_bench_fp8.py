"""``benchmarks/decode_latency.py --weights``: the formats it times, the FP8 entries' speed-up over bf16 and their
table, and the accuracy checks it records, on CPU over a tiny model (the timing itself needs a GPU)."""

from __future__ import annotations


import pytest
import torch

from bubblescope.generation import teacher_forced_logits
from bubblescope.models.weights import dummy_weights
from bubblescope.reference_engine import ReferenceEngine

from .conftest import load_benchmark
from .test_megakernel_schedule import TINY


_script = load_benchmark


dl, run = _script("decode_latency"), _script("run")


def test_weights_option_lists_bf16_first_and_refuses_other_formats():
    assert "--weights" in run.decode_latency_options()
    assert dl.weight_formats("bf16") == ["bf16"]
    assert dl.weight_formats("fp8") == ["bf16", "fp8"]
    assert dl.weight_formats("fp8-all,bf16,fp8,fp8") == ["bf16", "fp8-all", "fp8"]
    with pytest.raises(ValueError, match="--weights: unknown format 'int4'; use bf16, fp8, fp8-all"):
        dl.weight_formats("fp8,int4")


def test_fp8_entries_sit_beside_bf16_with_their_speedup_and_table():
    ok = lambda p50, toks: {"status": "ok", "token_ms_p50": p50, "token_ms_p99": p50, "token_ms_mean": p50,  # noqa
                            "tokens": toks, "effective_GBps": None, "util_peak": None, "util_copy": None}
    entry = {"engines": {"reference": ok(10.0, [1, 2, 3, 4]), "reference+fp8": ok(8.0, [1, 2, 5, 4]),
                         "reference-fused": ok(1.0, [1, 2, 3, 4]), "reference-fused+fp8": ok(0.625, [1, 2, 3, 4]),
                         "megakernel": {"status": "failed", "reason": "x"},
                         "megakernel+fp8": ok(0.5, [1, 2, 3, 4])}}
    dl.finish_entry(entry, [1, 2, 3, 4])
    e = entry["engines"]
    assert e["reference-fused+fp8"]["speedup_vs_bf16"] == 1.6 and e["reference+fp8"]["speedup_vs_bf16"] == 1.25
    assert e["megakernel+fp8"]["speedup_vs_bf16"] is None and "speedup_vs_bf16" not in e["reference-fused"]
    assert e["reference+fp8"]["greedy_agreement_vs_reference"] == 0.75
    assert e["reference+fp8"]["greedy_identical_prefix"] == 2 and "tokens" not in e["reference+fp8"]
    e["reference-fused+fp8"]["vs_reference"] = {"top1": 1.0, "rel_logit_err_max": 0.004, "rel_logit_err_mean": 0.002,
                                               "rows": 17}
    entry["quantization"] = {"fp8": {"top1": 0.98, "rel_logit_err_max": 0.05, "rel_logit_err_mean": 0.03,
                                     "rows": 257}}
    doc = {"device": {"name": "GPU"}, "date": "d", "commit": "c", "versions": {"torch": "t", "triton": "u"},
           "copy_GBps": None, "models": {"m": entry}}
    md = dl.markdown_table(doc)
    assert "| × bf16 |" in md
    assert "| m | reference-fused+fp8 | 0.625 |" in md and md.split("reference-fused+fp8 | 0.625")[1].split("\n")[0] \
        .rstrip().endswith("| 1.60 |")
    assert "| m | megakernel+fp8 | 0.500 |" in md and "— (megakernel not run) |" in md
    assert "m fp8 against bf16 (reference engine): teacher-forced top-1 0.980 over 257 rows" in md
    assert "m reference-fused+fp8: logits against the reference engine over the same weights, 17" in md
    bf16_only = dl.markdown_table({**doc, "models": {"m": {"engines": {"reference": e["reference"]}}}})
    assert "× bf16" not in bf16_only


def test_accuracy_checks_compare_fp8_with_bf16_and_with_the_reference():
    w = dummy_weights(TINY["gqa-tied-llama3"], seed=1)
    w8 = w.as_format("fp8")
    prompt, tokens = [1, 5, 9], [3, 7, 11, 13, 2, 8]
    q = dl.quantization_accuracy({"bf16": w, "fp8": w8, "fp8-all": w.as_format("fp8-all")}, tokens, prompt, 4, 32)
    a = teacher_forced_logits(ReferenceEngine(w, max_seq_len=32), prompt, tokens[:4])
    b = teacher_forced_logits(ReferenceEngine(w8, max_seq_len=32), prompt, tokens[:4])
    rel = ((a - b).norm(dim=-1) / a.norm(dim=-1))
    assert q["fp8"]["rows"] == 5 and q["fp8"]["rel_logit_err_max"] == pytest.approx(rel.max().item())
    assert q["fp8"]["top1"] == (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    assert q["fp8"]["rel_logit_err_max"] > 0 and q["fp8-all"]["rows"] == 5 and q["fp8-all"]["rel_logit_err_max"] > 0
    assert dl.quantization_accuracy({"bf16": w, "fp8": w8}, None, prompt, 4, 32) == {
        "fp8": {"reason": "the bf16 reference engine did not run"}}
    forced, logits = dl.reference_check(w8, 64, prompt, 32, steps=3)
    assert len(forced) == 3 and torch.equal(logits, teacher_forced_logits(ReferenceEngine(w8, max_seq_len=32),
                                                                          prompt, forced))
    same = dl.logit_errors(logits, logits)
    assert same == {"top1": 1.0, "rel_logit_err_max": 0.0, "rel_logit_err_mean": 0.0, "rows": 4}


def test_the_fp8_suite_times_the_engines_with_an_fp8_path_beside_their_bf16_runs(tmp_path):
    (case,) = run.plan("fp8", ["llama-3.2-1b"], tmp_path, 300, [])
    argv = case.argv
    assert argv[argv.index("--weights") + 1] == "fp8"
    assert argv[argv.index("--engines") + 1].split(",") == [
        "reference", "reference-compile", "reference-fused", "reference-fused-pdl", "megakernel", "megakernel-triton"]
