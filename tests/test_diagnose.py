"""The main job as a library call, on CPU (tiny dummy model, reference engine only: fast)."""

from __future__ import annotations

import importlib

import pytest
import torch

import bubblescope
from bubblescope.reports.results import validate_results


def test_library_call_works_twice_and_fills_a_valid_document(tmp_path):
    # Importing submodules (the main job's own module included) must not shadow the lazily exported function.
    for mod in ("bubblescope.profiler.trace", "bubblescope.diagnosis"):
        importlib.import_module(mod)
    assert callable(bubblescope.diagnose)

    docs = []
    for i in range(2):
        res = bubblescope.diagnose("tiny-llama", engines=["reference"], prompt_len=4, gen_len=4, runs=1,
                                   warmup=0, profile_steps=2, device="cpu", out=tmp_path / str(i))
        docs.append(res.doc)
    for doc in docs:
        assert validate_results(doc) == []
        (eng,) = doc["engines"]
        assert eng["status"] == "ok" and eng["correctness"]["token_agreement"] == 1.0
        # a float32 run is its own fp32 reference: KL 0, the same NLL, matched
        c = eng["correctness"]
        assert c["kl_vs_fp32"] == 0.0 and c["nll"] == c["nll_fp32"] == c["ref_nll"] and c["fidelity_matched"] is True
        # the first profiled step is left out and counted; the 2 asked for remain
        assert eng["timeline"]["warmup_steps"] == 1 and eng["timeline"]["steps"] == 2
        # one run: its generation time is its TTFT plus its decode steps
        lat = eng["latency"]
        assert lat["e2e_ms"] == pytest.approx(lat["ttft_ms"] + sum(lat["token_ms_samples"]), abs=1e-3)
        assert doc["device"]["threads"]["torch_threads"] == torch.get_num_threads()
        assert doc["ladder"][0]["engine"] == "reference" and doc["ladder"][0]["token_ms_p50"] == lat["token_ms_p50"]
        assert eng["timeline"]["available"] is False and eng["timeline"]["launches_per_step"] is None
        assert len(eng["latency"]["token_ms_samples"]) == 3          # 4 tokens: 1 from prefill + 3 decode steps
        assert lat["first_run"] is None                               # no warm-up: no first run recorded
        assert doc["device"]["type"] == "cpu" and doc["model"]["source"] == "dummy"
    assert (tmp_path / "1" / "results.json").is_file() and (tmp_path / "1" / "report.html").is_file()
    assert (tmp_path / "1" / "traces" / "reference.json.gz").is_file()


def test_the_first_warm_up_generation_is_recorded_as_the_first_run(tmp_path, monkeypatch):
    """With 2 warm-ups, ``latency.first_run`` holds the first one: its per-token median, its TTFT and its
    gen_len − 1 = 5 decode steps, as the generation itself returned them (read here by wrapping ``generate``)."""
    import statistics

    from bubblescope.diagnosis import measure

    seen = []

    def recording(*args, **kwargs):
        res = real(*args, **kwargs)
        seen.append(res)
        return res

    real = measure.generate
    monkeypatch.setattr(measure, "generate", recording)
    res = bubblescope.diagnose("tiny-llama", engines=["reference"], prompt_len=4, gen_len=6, runs=1, warmup=2,
                               profile_steps=2, device="cpu", out=tmp_path)
    assert validate_results(res.doc) == []
    (eng,) = res.doc["engines"]
    first, timed = seen[0], seen[2]  # two warm-ups, then the timed run
    assert eng["latency"]["first_run"] == {"token_ms_p50": pytest.approx(statistics.median(first.token_ms)),
                                           "ttft_ms": first.ttft_ms, "tokens": 5}
    assert eng["latency"]["ttft_ms"] == timed.ttft_ms  # the timed figures are the timed run's, as before
