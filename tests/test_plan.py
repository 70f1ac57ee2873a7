"""The run plan of ``diagnose``: every default and check decided once, before the model loads, into a frozen plan
that the measuring stages only read."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from bubblescope.diagnosis import diagnose
from bubblescope.diagnosis.plan import CPU_DEFAULT_SKIPS, DEFAULT_SWEEP, plan_run, workload_lengths
from bubblescope.engines import default_engines
from bubblescope.errors import BubblescopeError
from bubblescope.models import run_dtype

from .conftest import STORIES


def test_cpu_defaults_are_the_documented_ones():
    """docs/cli.md and `diagnose model --help`: on CPU a 16-token prompt, 32 new tokens, no sweep, 3 runs after 1
    warm-up, 8 profiled steps, float32, stories260k when its file is found (else tiny-llama), every default
    engine with the timing-only ablations skipped."""
    plan = plan_run(device="cpu", write=False)
    w = plan.workload
    assert (w.prompt_len, w.gen_len, w.context_sweep, w.runs, w.warmup, w.profile_steps, w.seed, w.prefill) == \
        (16, 32, (), 3, 1, 8, 0, None)
    assert plan.dtype == torch.float32 and plan.dtype_name == "float32"
    assert plan.model == ("stories260k" if STORIES.is_file() else "tiny-llama") and plan.requested_model is None
    assert plan.engines == tuple(default_engines())
    assert set(CPU_DEFAULT_SKIPS) <= set(plan.skips)
    assert "needs a CUDA" in plan.skips["reference-cudagraph"] and "reference" not in plan.skips
    assert w.record() == {"prompt_len": 16, "gen_len": 32, "runs": 3, "warmup": 1, "context_sweep": [], "seed": 0,
                          "prefill": "batched"}


def test_gpu_defaults_without_a_gpu():
    """The GPU branch of each default, read without a GPU: prompt 128, 128 new tokens, bfloat16, the
    128/1024/4096 sweep."""
    cuda = torch.device("cuda")
    assert workload_lengths(None, None, cuda) == (128, 128)
    assert workload_lengths(7, None, cuda) == (7, 128) and workload_lengths(None, 9, torch.device("cpu")) == (16, 9)
    assert run_dtype(None, cuda) == torch.bfloat16 and run_dtype(None, torch.device("cpu")) == torch.float32
    assert run_dtype("fp16", cuda) == torch.float16 and run_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    assert DEFAULT_SWEEP["cuda"] == (128, 1024, 4096)


def test_given_options_are_kept_and_the_plan_cannot_change():
    plan = plan_run("tiny-llama", engines=["reference", "reference-fused", "reference"], prompt_len=5, gen_len=6,
                    context_sweep=[64, 8, 64], dtype="bf16", device="cpu", write=False, seed=3,
                    prefill="batched")
    assert plan.engines == ("reference", "reference-fused")  # a name given twice runs once
    assert plan.skips == {}  # named ablations run, even on CPU
    assert plan.workload.context_sweep == (8, 64) and plan.dtype == torch.bfloat16
    assert (plan.workload.prompt_len, plan.workload.gen_len, plan.workload.seed) == (5, 6, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.workload.gen_len = 7
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.dtype = torch.float32
    with pytest.raises(TypeError):
        plan.skips["reference"] = "no"


@pytest.mark.parametrize("kwargs, message", [
    ({"gen_len": 1}, "--gen-len: must be at least 2, got 1"),
    ({"context_sweep": [0, 16]}, "--context-sweep: contexts must be positive, got [0, 16]"),
    ({"dtype": "fp8x"}, "--dtype: unknown dtype 'fp8x'"),
    ({"engines": ["nope"]}, "--engines: unknown engine 'nope'"),
    ({"engines": ["reference"], "prefill": "stepwise"}, "--prefill stepwise: none of the engines (reference)"),
    # the device rules every engine out: said before the dtype is read
    ({"engines": ["reference-cudagraph"], "dtype": "fp8x"}, "--engines: no engine ran on this machine "
                                                             "(reference-cudagraph: "),
])
def test_bad_options_are_refused_by_the_plan(kwargs, message):
    with pytest.raises(BubblescopeError) as e:
        plan_run("tiny-llama", device="cpu", write=False, **kwargs)
    assert str(e.value).startswith(message), str(e.value)


def test_the_run_records_its_plan(monkeypatch):
    """The results document's workload and dtype are the plan's, and the measuring stages build each engine
    with the plan's KV length (prompt + new tokens + profiled steps + 8 spare)."""
    import bubblescope.diagnosis.measure as measure

    built = []
    real = measure.build_engine

    def build(name, weights, max_seq_len, **kw):
        built.append((name, max_seq_len, weights.dtype))
        return real(name, weights, max_seq_len, **kw)

    monkeypatch.setattr(measure, "build_engine", build)
    doc = diagnose("tiny-llama", engines=["reference"], prompt_len=4, gen_len=3, runs=1, warmup=0, profile_steps=2,
                   dtype="bf16", device="cpu", write=False).doc
    assert doc["workload"] == {"prompt_len": 4, "gen_len": 3, "runs": 1, "warmup": 0, "context_sweep": [], "seed": 0,
                               "prefill": "batched"}
    assert doc["model"]["dtype"] == "bfloat16"
    assert built == [("reference", 4 + 3 + 2 + 8, torch.bfloat16)] * 2  # the oracle's reference, then the engine
