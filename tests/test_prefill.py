"""The megakernel's batched prefill (``megakernel_engine.prefill``) against its token-by-token prefill.

The stepwise prefill runs the decode kernel once per prompt token, so its KV cache is what decoding writes; the
batched one must leave the same cache (same values in the same (layer, kv head, position, dim) places), the same
last-position logits, position and device-side greedy token, so that decoding continues identically. The oracle
(``interpreter.ScheduleInterpreter``, the plain-PyTorch model of the kernel's tasks) gives a second stepwise cache.

CPU tests run the Triton kernel under TRITON_INTERPRET=1 (set by conftest before Triton is imported); GPU tests are
marked ``gpu``.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch

from bubblescope.errors import BubblescopeError, EngineUnavailable
from bubblescope.generation import generate, teacher_forced_logits
from bubblescope.models import dummy_weights, get_preset, load_llama2c
from bubblescope.torch_ops import prefix_causal_attention

from .conftest import STORIES, needs_stories
from .test_megakernel_schedule import TINY

PROMPT7 = [1, 5, 9, 4, 7, 60, 33]  # odd length; with chunks of 3: 3 + 3 + 1, the later ones attend to a prefix


@pytest.fixture(scope="module")
def interpreter():
    """The Triton kernel in interpreter mode (CPU); on a CUDA machine Triton is compiled there: skip."""
    from bubblescope.megakernel_engine.triton_kernel.host import load_kernel
    try:
        load_kernel(True)
    except EngineUnavailable as e:
        pytest.skip(f"CUDA machine: triton is in compiled mode here ({e})")


def _engines(w, max_seq_len, chunk=3, prefill_graphs=None, **kw):
    from bubblescope.megakernel_engine import MegakernelEngine
    batched = MegakernelEngine(w, max_seq_len=max_seq_len, prefill_chunk=chunk, prefill_graphs=prefill_graphs, **kw)
    stepwise = MegakernelEngine(w, max_seq_len=max_seq_len, prefill="stepwise", **kw)
    return batched, stepwise


def _close(got: torch.Tensor, want: torch.Tensor, tol: float = 1e-5) -> None:
    """Equal to ``tol`` absolute and relative (float32 sums in another order differ by a few ulp)."""
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def _assert_same_prefill(batched, stepwise, ids: list[int], tol: float = 1e-5) -> None:
    """Prefill both with ``ids``: caches, logits, position and the device-side greedy token agree."""
    lb = batched.prefill(torch.tensor(ids)).clone()
    ls = stepwise.prefill(torch.tensor(ids)).clone()
    for name in ("k_cache", "v_cache"):
        got = getattr(batched, name)
        _close(got, getattr(stepwise, name), tol)
        assert not got[:, :, len(ids):].any()  # nothing written past the prompt
    _close(lb, ls, 10 * tol)
    assert torch.equal(batched.last_logits().cpu(), lb.cpu())  # the logits decoding starts from are the returned ones
    assert batched.position == stepwise.position == len(ids)
    assert batched.greedy_token().item() == stepwise.greedy_token().item() == int(ls.argmax())


def _continue(engine, n: int) -> list[int]:
    """``n`` greedy decode steps after a prefill, the first from the token the prefill left on the device
    (``launch_greedy(None)``: position and input token come from the engine's state, not from the host)."""
    tokens = []
    for _ in range(n):
        engine.launch_greedy(None)
        tokens.append(engine.next_greedy_token())
    return tokens


# ---- CPU: tiny random configs and stories260K ----------------------------------------------------------------------
@pytest.mark.parametrize("name", list(TINY))
def test_batched_prefill_leaves_the_stepwise_cache_and_continues_alike(interpreter, name):
    """GQA with llama3 RoPE scaling, MHA untied, Qwen2 biases, Qwen3 q/k-norm; fp32, three chunks."""
    from bubblescope.megakernel_engine.interpreter import ScheduleInterpreter

    w = dummy_weights(TINY[name], seed=1)
    batched, stepwise = _engines(w, 16)
    _assert_same_prefill(batched, stepwise, PROMPT7)
    oracle = ScheduleInterpreter(w, max_seq_len=16)
    oracle.prefill(torch.tensor(PROMPT7))
    _close(batched.k_cache, oracle.buffers["k_cache"])
    _close(batched.v_cache, oracle.buffers["v_cache"])
    assert _continue(batched, 3) == _continue(stepwise, 3)
    assert batched.position == stepwise.position == len(PROMPT7) + 3
    _close(batched.k_cache, stepwise.k_cache)


def test_one_token_and_the_context_limit(interpreter):
    cfg = TINY["gqa-tied-llama3"]
    w = dummy_weights(cfg, seed=2)
    batched, stepwise = _engines(w, 6, chunk=4)
    _assert_same_prefill(batched, stepwise, [9])
    _assert_same_prefill(batched, stepwise, [3, 1, 4, 1, 5, 9])  # the whole cache: a chunk of 4, then 2
    with pytest.raises(BubblescopeError, match="the KV cache of 6 positions is full"):
        batched.decode(2)
    before = batched.k_cache.clone()
    with pytest.raises(BubblescopeError, match=r"^prompt: 7 tokens do not fit the KV cache of 6 positions$"):
        batched.prefill(torch.arange(7))
    with pytest.raises(BubblescopeError, match=r"^prompt: token id 64 outside the vocabulary of 64$"):
        batched.prefill(torch.tensor([1, 64]))
    assert torch.equal(batched.k_cache, before) and batched.position == 6  # a refused prompt changes nothing


@pytest.mark.parametrize("name", ["gqa-tied-llama3", "qwen3-qknorm"])
def test_the_padded_pass_a_graph_captures_leaves_the_stepwise_cache(interpreter, name):
    """The pass a prefill graph captures, run eagerly on a CPU: prompts padded to their bucket (here the whole
    16-position cache) give the stepwise cache with nothing past the prompt, the same logits and greedy token, and
    decoding continues alike; one token and the context limit too."""
    w = dummy_weights(TINY[name], seed=4)
    batched, stepwise = _engines(w, 16, chunk=16, prefill_graphs=True)
    for ids in ([9], PROMPT7, [(3 * i) % 60 + 2 for i in range(16)]):
        _assert_same_prefill(batched, stepwise, ids)
    _assert_same_prefill(batched, stepwise, PROMPT7)
    assert _continue(batched, 3) == _continue(stepwise, 3)
    _close(batched.k_cache, stepwise.k_cache)


@needs_stories
def test_stories260k_batched_prefill_equals_stepwise(interpreter):
    w = load_llama2c(STORIES)
    batched, stepwise = _engines(w, 32, chunk=4)
    prompt = [1, 403, 407, 261, 378, 434, 288, 6, 341]  # 9 ids: chunks of 4, 4, 1
    _assert_same_prefill(batched, stepwise, prompt)
    assert _continue(batched, 3) == _continue(stepwise, 3)
    _close(batched.k_cache, stepwise.k_cache)


def test_prefix_causal_attention_matches_a_float64_loop():
    """Each query of a chunk at positions S-T..S-1 sees keys 0..its position; query head h reads kv head h // g."""
    g = torch.Generator().manual_seed(0)
    nh, nkv, d = 4, 2, 8
    for t, s in ((3, 7), (5, 5), (1, 6)):
        q, k, v = (torch.randn(n, m, d, generator=g) for n, m in ((nh, t), (nkv, s), (nkv, s)))
        got = prefix_causal_attention(q, k, v, nh // nkv).numpy()
        qn, kn, vn = (x.double().numpy() for x in (q, k, v))
        for h in range(nh):
            for i in range(t):
                n = s - t + i + 1
                sc = kn[h // 2, :n] @ qn[h, i] / math.sqrt(d)
                p = np.exp(sc - sc.max())
                np.testing.assert_allclose(got[h, i], (p / p.sum()) @ vn[h // 2, :n], atol=1e-6)


def test_prefill_mode_is_checked_and_passed_only_where_it_exists(interpreter):
    from bubblescope.engines import build_engine, check_prefill, takes_prefill
    from bubblescope.megakernel_engine.prefill import PREFILL_MODES
    from bubblescope import engines

    assert engines.PREFILL_MODES == PREFILL_MODES  # the registry's copy (it must not import torch)
    w = dummy_weights(TINY["mha-untied"], seed=0)
    assert build_engine("megakernel", w, 8, prefill="stepwise").compile_info()["prefill"] == "stepwise"
    assert build_engine("megakernel", w, 8).prefill_mode == "batched"
    assert build_engine("reference", w, 8, prefill="batched").name == "reference"  # what it always does
    with pytest.raises(BubblescopeError, match=r"^--prefill stepwise: engine reference prefills the prompt in one "):
        build_engine("reference", w, 8, prefill="stepwise")
    with pytest.raises(BubblescopeError, match=r"^--prefill: unknown mode 'chunked'; use one of batched, stepwise$"):
        check_prefill("chunked", "megakernel")
    assert takes_prefill("megakernel-noprefetch") and takes_prefill("auto") and not takes_prefill("hf")


# ---- CLI: the option reaches the engine builder, and bad values are one line, exit 2 ---------------------------------
def _cli(*args):
    from typer.testing import CliRunner

    from bubblescope.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


class _Built(Exception):
    pass


@pytest.mark.parametrize("command, where", [
    (["generate", "tiny-llama", "--prompt-ids", "1", "--engine", "megakernel", "--device", "cpu"], "engines"),
    (["diagnose", "model", "tiny-llama", "--engines", "megakernel", "--device", "cpu", "--out", "OUT"], "diagnosis.measure"),
    (["tune", "tiny-llama", "--knob", "block_k", "--values", "16", "--device", "cpu", "--out", "OUT"], "engines"),
])
def test_the_prefill_option_reaches_the_engine(tmp_path, monkeypatch, command, where):
    import importlib

    seen = []

    def build(name, weights, max_seq_len, params=None, prefill=None):
        if name != "reference":  # diagnose and tune build the reference first (the oracle, the checker)
            seen.append((name, prefill))
            raise _Built(name)
        from bubblescope.reference_engine import ReferenceEngine
        return ReferenceEngine(weights, max_seq_len=max_seq_len)

    monkeypatch.setattr(importlib.import_module(f"bubblescope.{where}"), "build_engine", build)
    r = _cli(*[tmp_path / "o" if a == "OUT" else a for a in command], "--prefill", "stepwise")
    assert seen and seen[0] == ("megakernel", "stepwise"), r.output
    assert isinstance(r.exception, (_Built, SystemExit)), r.exception  # tune records a build error as its row


@pytest.mark.parametrize("args, message", [
    (["generate", "tiny-llama", "--prompt-ids", "1", "--prefill", "stepwise"],
     "--prefill stepwise: engine reference prefills the prompt in one batched forward; token-by-token prefill is "
     "the megakernel engines' ablation"),
    (["generate", "tiny-llama", "--prompt-ids", "1", "--engine", "megakernel", "--prefill", "chunked"],
     "--prefill: unknown mode 'chunked'; use one of batched, stepwise"),
    (["diagnose", "model", "tiny-llama", "--engines", "reference,hf", "--prefill", "stepwise", "--out", "OUT"],
     "--prefill stepwise: none of the engines (reference, hf) has a prefill choice; token-by-token prefill is the "
     "megakernel engines' ablation"),
    # auto stands for the reference on a CPU: the ablation was run as a batched prefill and recorded as stepwise
    (["diagnose", "model", "tiny-llama", "--engines", "auto", "--prefill", "stepwise", "--out", "OUT"],
     "--prefill stepwise: auto chose reference (no CUDA device (cpu)"),
    (["generate", "tiny-llama", "--prompt-ids", "1", "--engine", "auto", "--prefill", "stepwise"],
     "--prefill stepwise: auto chose reference (no CUDA device (cpu)"),
    (["diagnose", "model", "tiny-llama", "--tp", "2", "--prefill", "stepwise", "--out", "OUT"],
     "--prefill stepwise: not supported with --tp"),
    (["tune", "tiny-llama", "--knob", "block_k", "--values", "16", "--prefill", "x", "--out", "OUT"],
     "--prefill: unknown mode 'x'"),
    (["generate", "stories260k", "--engine", "megakernel", "--prefill", "batched", "--max-new-tokens", "1",
      "--prompt-ids", ",".join(["7"] * 512)],
     "--prompt-ids: 512 prompt tokens + 1 new token exceed the model's 512 positions"),
    (["generate", "stories260k", "--engine", "megakernel", "--weights", "fp8", "--max-new-tokens", "5",
      "--prompt", "Once upon a time " * 200],
     "--prompt: 802 prompt tokens + 5 new tokens exceed the model's 512 positions"),
    (["diagnose", "model", "tiny-llama", "--engines", "megakernel", "--prompt-len", "65536", "--out", "OUT"],
     "--prompt-len 65536 + --gen-len 32 + --profile-steps 8: the workload needs 65584 positions"),
])
def test_bad_prefill_and_a_prompt_beyond_the_context_are_one_line(tmp_path, args, message):
    if args[1] == "stories260k" and not STORIES.is_file():
        pytest.skip(f"{STORIES} not found")
    r = _cli(*[tmp_path / "o" if a == "OUT" else a for a in args], "--device", "cpu")
    assert (r.exit_code, r.stdout) == (2, ""), r.output
    assert r.stderr.startswith(f"error: {message}") and r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / "o").exists()


# ---- the context sweep records the prefill of each context ----------------------------------------------------------
def test_sweep_point_records_the_time_to_first_token():
    """A decoder whose prefill takes at least 30 ms: the sweep row's ttft_ms holds it, its decode steps do not."""
    from bubblescope.diagnosis.measure import sweep_point
    from bubblescope.reference_engine import ReferenceEngine
    from bubblescope.reports.results import validate_results

    from . import resultsgen

    cfg = TINY["mha-untied"]
    eng = ReferenceEngine(dummy_weights(cfg, seed=0), max_seq_len=64)
    slow = eng.prefill
    eng.prefill = lambda ids: (time.sleep(0.03), slow(ids))[1]
    row = sweep_point(eng, cfg, 12, 4, {"nvml_peak_GBps": None, "copy_GBps": None}, seed=0)
    assert row["context"] == 12 and row["ttft_ms"] >= 30 and row["token_ms_p50"] < 30
    doc = resultsgen.healthy_doc()
    doc["engines"][0]["sweep"] = [row]
    doc["workload"]["prefill"] = "stepwise"
    assert validate_results(doc) == []
    doc["workload"]["prefill"] = "chunked"
    assert validate_results(doc) == ["workload.prefill: expected one of 'batched', 'stepwise', got \"chunked\""]


# ---- GPU ------------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@needs_stories
def test_gpu_stories260k_fp32_greedy_200_tokens_after_batched_prefill_equal_stepwise():
    w = load_llama2c(STORIES).to("cuda")
    batched, stepwise = _engines(w, 512, chunk=64)
    for prompt in ([1], [1, 403, 407, 261, 378, 434, 288, 6, 341], [1] + [(7 * i) % 509 + 3 for i in range(150)]):
        _assert_same_prefill(batched, stepwise, prompt, tol=1e-4)
        a = generate(batched, prompt, 200, eos_ids=())
        b = generate(stepwise, prompt, 200, eos_ids=())
        assert a.tokens == b.tokens, len(prompt)
    # the context limit: a whole-cache prompt, then the cache is full
    _assert_same_prefill(batched, stepwise, [(5 * i) % 509 + 3 for i in range(512)], tol=1e-4)


@pytest.mark.gpu
@needs_stories
def test_gpu_prefill_graphs_serve_their_bucket_and_equal_the_eager_pass():
    """fp32 stories260K: prompts from 1 to the whole cache through the captured prefill graphs leave the stepwise
    cache and continue with the eager batched prefill's greedy tokens; one graph per 64-position bucket used."""
    from bubblescope.megakernel_engine import MegakernelEngine

    w = load_llama2c(STORIES).to("cuda")
    graphed, stepwise = _engines(w, 560, chunk=512)   # room for 40 tokens after a 512-token prompt
    eager = MegakernelEngine(w, max_seq_len=560, prefill_chunk=512, prefill_graphs=False)
    for n in (1, 9, 63, 64, 65, 200, 512):
        prompt = [1] + [(7 * i) % 509 + 3 for i in range(n - 1)]
        _assert_same_prefill(graphed, stepwise, prompt, tol=1e-4)
        assert generate(graphed, prompt, 40, eos_ids=()).tokens == generate(eager, prompt, 40, eos_ids=()).tokens, n
    assert graphed.prefill_graphs_captured() == 4 and eager.prefill_graphs_captured() == 0   # buckets 64, 128, 256, 512


@pytest.mark.gpu
@needs_stories
@pytest.mark.parametrize("error", ["capture", "memory"])
def test_gpu_a_refused_capture_runs_the_eager_pass(monkeypatch, error):
    """A capture the torch build refuses turns the graphs off, its first cause kept; one that runs out of memory
    leaves that bucket eager only. Either way the prompt leaves the stepwise cache (the refused warm-up's writes
    past the prompt undone) and the next prompt too."""
    from bubblescope.megakernel_engine.prefill import BatchedPrefill

    real = BatchedPrefill._padded_pass

    def refuse(self, n, k_cache, v_cache):
        if torch.cuda.is_current_stream_capturing():
            raise (RuntimeError("operation not permitted when stream is capturing") if error == "capture" else
                   torch.cuda.OutOfMemoryError("CUDA out of memory"))
        return real(self, n, k_cache, v_cache)

    monkeypatch.setattr(BatchedPrefill, "_padded_pass", refuse)
    batched, stepwise = _engines(load_llama2c(STORIES).to("cuda"), 64, chunk=64)
    _assert_same_prefill(batched, stepwise, PROMPT7, tol=1e-4)
    _assert_same_prefill(batched, stepwise, [4, 2], tol=1e-4)
    assert batched.prefill_graphs_captured() == 0
    if error == "capture":
        assert batched.prefill_graph_error() == "RuntimeError: operation not permitted when stream is capturing"
    else:
        assert batched.prefill_graph_error() is None


def _rel(a, b):
    return ((a - b).norm(dim=-1) / b.norm(dim=-1)).max().item()


@pytest.mark.gpu
@pytest.mark.parametrize("n_prompt", [128, 333])
def test_gpu_llama_1b_bf16_teacher_forced_agreement_after_batched_prefill(n_prompt):
    """bf16 on dummy Llama-3.2-1B weights: batched and stepwise prefill give the same greedy tokens on >= 99 % of the
    teacher-forced positions, and the batched one is about as close to the float32 model as the stepwise one."""
    from bubblescope.reference_engine import ReferenceEngine

    w = dummy_weights(get_preset("llama-3.2-1b"), "cuda", torch.bfloat16, seed=1)
    g = torch.Generator().manual_seed(n_prompt)
    prompt = torch.randint(3, w.config.vocab_size, (n_prompt,), generator=g).tolist()
    forced = torch.randint(3, w.config.vocab_size, (64,), generator=g).tolist()
    batched, stepwise = _engines(w, 512, chunk=128)
    got = teacher_forced_logits(batched, prompt, forced)
    step = teacher_forced_logits(stepwise, prompt, forced)
    truth = teacher_forced_logits(ReferenceEngine(w.to(dtype=torch.float32), "eager", 512), prompt, forced)
    assert (got.argmax(-1) == step.argmax(-1)).float().mean().item() >= 0.99
    assert _rel(got, truth) < 1.5 * _rel(step, truth) + 1e-3, (_rel(got, truth), _rel(step, truth))


@pytest.mark.gpu
def test_gpu_long_prompt_in_chunks_matches_the_reference():
    """4,000 tokens in chunks of 2,048 (the second attends to the first's keys under a mask) against the reference
    engine's one-forward prefill, bf16 Llama-3.2-1B dummy weights; and in one pass (the default chunk)."""
    from bubblescope.megakernel_engine import MegakernelEngine
    from bubblescope.reference_engine import ReferenceEngine

    w = dummy_weights(get_preset("llama-3.2-1b"), "cuda", torch.bfloat16, seed=3)
    g = torch.Generator().manual_seed(4000)
    prompt = torch.randint(3, w.config.vocab_size, (4000,), generator=g).tolist()
    forced = torch.randint(3, w.config.vocab_size, (32,), generator=g).tolist()
    ref = teacher_forced_logits(ReferenceEngine(w, "eager", 4096), prompt, forced)
    truth = teacher_forced_logits(ReferenceEngine(w.to(dtype=torch.float32), "eager", 4096), prompt, forced)
    for chunk in (2048, 4096):
        got = teacher_forced_logits(MegakernelEngine(w, max_seq_len=4096, prefill_chunk=chunk), prompt, forced)
        assert (got.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.95, chunk
        assert _rel(got, truth) < 1.5 * _rel(ref, truth) + 1e-3, (chunk, _rel(got, truth), _rel(ref, truth))


@pytest.mark.gpu
def test_gpu_qwen3_bf16_cache_after_batched_prefill_is_the_kernels():
    """Qwen3 (q/k-norm; on Hopper the Gluon kernel norms and rotates k in its attention task): the cache the batched
    prefill writes is the one the kernel's steps write, to bf16 rounding: layer 0 (one rounding apart) within 1 %,
    and over all 28 layers, where the roundings carry through the residual stream, about as close to the float32
    model's cache (the batched prefill over the same weights in float32) as the kernel's own."""
    w = dummy_weights(get_preset("qwen3-0.6b"), "cuda", torch.bfloat16, seed=1)
    batched, stepwise = _engines(w, 128, chunk=32)
    from bubblescope.megakernel_engine import MegakernelEngine
    truth = MegakernelEngine(w.to(dtype=torch.float32), max_seq_len=128, prefill_chunk=32)
    prompt = torch.randint(3, w.config.vocab_size, (77,), generator=torch.Generator().manual_seed(0)).tolist()
    for e in (batched, stepwise, truth):
        e.prefill(torch.tensor(prompt))

    def rel(a, b):
        return ((a.float() - b.float()).norm() / b.float().norm()).item()

    for name in ("k_cache", "v_cache"):
        a, b, t = getattr(batched, name), getattr(stepwise, name), getattr(truth, name)
        assert rel(a[0], b[0]) < 1e-2, name
        assert rel(a, t) < 1.5 * rel(b, t) + 1e-3, (name, rel(a, t), rel(b, t))


# ---- the benchmark script -----------------------------------------------------------------------------------------
def test_prefill_benchmark_writes_ttft_per_length_and_engine(interpreter, tmp_path):
    """``benchmarks/prefill.py``'s document on CPU (tiny model, fp32): the layout the benchmarks driver reads, raw
    samples kept, the first tokens the reference engine's, the ratio the two medians' quotient."""
    import json

    from .conftest import load_benchmark

    bench = load_benchmark("prefill")
    out = tmp_path / "prefill.json"
    assert bench.main(["--device", "cpu", "--dtype", "float32", "--models", "stories260k", "--lengths", "1,6",
                       "--stepwise-lengths", "", "--engines", "reference,megakernel,no-such-engine", "--runs", "2",
                       "--warmup", "0", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "prefill" and {"device", "date", "commit", "versions"} <= set(doc)
    lengths = doc["models"]["stories260k"]["prompt_lengths"]
    assert set(lengths) == {"1", "6"}
    w = dummy_weights(get_preset("stories260k"), seed=0)
    gen = torch.Generator().manual_seed(0)
    from bubblescope.reference_engine import ReferenceEngine
    ref = ReferenceEngine(w, max_seq_len=16)
    for n in (1, 6):
        prompt = torch.randint(3, 512, (n,), generator=gen)  # the script's prompts: one generator, in length order
        engines = lengths[str(n)]["engines"]
        assert engines["no-such-engine"]["status"] == "skipped"
        for name in ("reference", "megakernel"):
            r = engines[name]
            assert r["status"] == "ok" and len(r["ttft_ms_samples"]) == r["runs"] == 2, name
            assert r["ttft_ms"] == pytest.approx(sum(r["ttft_ms_samples"]) / 2, rel=1e-3)  # the median of two
            assert r["first_token"] == int(ref.prefill(prompt).argmax()), (n, name)
        assert "megakernel-stepwise-prefill" not in engines  # --stepwise-lengths '': none (one launch per token)
        case = lengths[str(n)]
        assert case["best_reference"]["engine"] == "reference"
        assert case["megakernel_vs_best_reference"] == pytest.approx(
            engines["megakernel"]["ttft_ms"] / engines["reference"]["ttft_ms"])
    assert "| stories260k | 6 | megakernel / reference |" in out.with_suffix(".md").read_text()
