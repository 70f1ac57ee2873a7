"""Which engines a default run measures, and the decode-latency benchmark's table without ``nan``."""

from __future__ import annotations


import pytest

from bubblescope import diagnosis
from bubblescope.diagnosis import plan
from bubblescope.engines import BY_NAME_ONLY, ENGINES, default_engines, get_engine_spec

from .conftest import load_benchmark


def test_one_megakernel_runs_by_default_and_the_others_by_name():
    names = default_engines()
    assert "megakernel" in names and "reference" in names
    assert "megakernel-gluon" not in names and "megakernel-triton" not in names
    assert names == [n for n in ENGINES if n not in {"megakernel-gluon", "megakernel-triton"}]  # registry order
    for name in BY_NAME_ONLY:  # still there when named
        assert get_engine_spec(name).name == name


def test_diagnose_without_engines_runs_the_default_list(tmp_path, monkeypatch):
    """The default list is the one ``diagnose`` measures (here cut to the eager reference to stay fast)."""
    monkeypatch.setattr(plan, "default_engines", lambda: ["reference"])
    res = diagnosis.diagnose("tiny-llama", prompt_len=4, gen_len=3, runs=1, warmup=0, profile_steps=2,
                             device="cpu", write=False)
    assert [e["name"] for e in res.doc["engines"]] == ["reference"]


def _bench():
    return load_benchmark("decode_latency")


def _row(p50: float, **extra) -> dict:
    return {"status": "ok", "token_ms_p50": p50, "token_ms_p99": p50 * 1.1, "token_ms_mean": p50,
            "effective_GBps": 2000.0, "util_peak": 0.6, "util_copy": 0.7, **extra}


def _doc(engines: dict) -> dict:
    return {"device": {"name": "NVIDIA H100", "nvml_peak_GBps": 3352.3}, "date": "2026-12-06T00:00:00+00:00",
            "commit": "abc1234", "versions": {"torch": "2.13.0", "triton": "3.6.0"}, "copy_GBps": 2900.0,
            "models": {"llama-3.2-1b": {"engines": engines}}}


def test_latency_table_says_which_engine_was_missing_instead_of_nan():
    """Without ``reference`` in the run there is no greedy agreement, without ``reference-compile`` no ratio:
    each cell says so (the tables of 2026-11-29 printed ``nan``)."""
    md = _bench().markdown_table(_doc({"megakernel": _row(0.9, speedup_vs_reference_compile=None)}))
    assert "nan" not in md
    row = next(line for line in md.splitlines() if "| megakernel |" in line)
    assert row == ("| llama-3.2-1b | megakernel | 0.900 | 0.990 | 1111 | 2000 | 60.0 | 70.0 | "
                   "— (reference-compile not run) | — (reference not run) |")


def test_latency_table_prints_the_measured_ratio_and_agreement():
    md = _bench().markdown_table(_doc({
        "reference": _row(3.0, greedy_agreement_vs_reference=1.0, speedup_vs_reference_compile=0.5),
        "reference-compile": _row(1.5, greedy_agreement_vs_reference=1.0, speedup_vs_reference_compile=1.0),
        "megakernel": _row(0.75, greedy_agreement_vs_reference=0.984375, speedup_vs_reference_compile=2.0),
        "megakernel-stages": {"status": "failed", "reason": "RuntimeError: out of resources"}}))
    rows = {line.split(" | ")[1]: line for line in md.splitlines() if line.startswith("| llama")}
    assert rows["megakernel"].endswith("| 2.00 | 0.984 |")
    assert rows["reference"].endswith("| 0.50 | 1.000 |")
    assert "failed: RuntimeError: out of resources" in rows["megakernel-stages"]
    assert "NVML peak 3352 GB/s, measured copy 2900 GB/s." in md


@pytest.mark.parametrize("copy", [None, 2900.0])
def test_latency_table_header_without_a_copy_measurement(copy):
    doc = _doc({"megakernel": _row(0.9)})
    doc["copy_GBps"] = copy
    md = _bench().markdown_table(doc)
    assert ("measured copy —" in md) == (copy is None) and "nan" not in md
