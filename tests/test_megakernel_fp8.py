"""The plain-Triton megakernel over FP8 weights, on CPU under TRITON_INTERPRET=1: the packed FP8 layout (the stored
e4m3 bytes and float32 row scales permuted as the rows; packing commutes with dequantizing), its byte counts, the
kernel's logits against the reference engine in float32 over weights dequantized here with numpy (q · s in float64),
its greedy tokens against the reference engine over the same FP8 weights (tiny models and stories260K), bf16
activations against the fused engine's FP8 kernels (the same rounding rule), and the Gluon kernel's refusal of FP8.

The interpreter mode is fixed when triton is first imported, so this module sets TRITON_INTERPRET=1 before anything
imports triton; on a CUDA machine Triton runs compiled and these tests are skipped (tests/test_gpu_megakernel.py
holds the GPU check).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from dataclasses import replace  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from bubblescope.errors import EngineUnavailable  # noqa: E402
from bubblescope.generation import generate, teacher_forced_logits  # noqa: E402
from bubblescope.megakernel_engine import MegakernelEngine, MegakernelParams  # noqa: E402
from bubblescope.megakernel_engine.engine import FP8_GLUON_REASON, choose_impl  # noqa: E402
from bubblescope.megakernel_engine.interpreter import ScheduleInterpreter  # noqa: E402
from bubblescope.megakernel_engine.packing import gateup_rows, pack_weights, qk_permutation  # noqa: E402
from bubblescope.megakernel_engine.schedule import build_schedule, task_weight_bytes  # noqa: E402
from bubblescope.models import load_llama2c  # noqa: E402
from bubblescope.models.quant import LINEAR_NAMES, QuantizedLinear, quantize_fp8  # noqa: E402
from bubblescope.models.weights import ModelWeights, dummy_weights  # noqa: E402
from bubblescope.reference_engine import ReferenceEngine  # noqa: E402

from .conftest import STORIES, needs_stories  # noqa: E402
from .test_megakernel_schedule import FORCED, PROMPT, TINY  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA machine: Triton runs compiled here")

FORMATS = ("fp8", "fp8-all")
# Moderate tiles (test_megakernel.MID): several tasks per stage, several K chunks, 2 splits, partial tiles.
MID = MegakernelParams(rows_qkv=24, rows_o=16, rows_gateup=32, rows_down=16, rows_lm=40, kv_splits=2,
                       attn_kv_heads=1, block_k=16, block_s=2)


@pytest.fixture(scope="module", autouse=True)
def _interpreter():
    from bubblescope.megakernel_engine.triton_kernel.host import load_kernel
    load_kernel(True)


def _mid(cfg):
    return MID.replace(rows_qkv=2 * cfg.head_dim) if cfg.qk_norm else MID


def _np_dequantized(w: ModelWeights) -> ModelWeights:
    """``w`` with every FP8 matrix replaced by q · s computed in float64 with numpy from the stored e4m3 values and
    scales, rounded once to float32 (not the package's dequantize); everything else shared."""
    def deq(t):
        if not isinstance(t, QuantizedLinear):
            return t
        q = t.qweight.float().numpy().astype(np.float64)      # every e4m3 value is exact in float32
        return torch.from_numpy((q * t.scale.numpy().astype(np.float64)[:, None]).astype(np.float32))
    layers = [replace(l, **{n: deq(getattr(l, n)) for n in LINEAR_NAMES}) for l in w.layers]
    return ModelWeights(w.config, w.embed_tokens, layers, w.norm, deq(w.lm_head))


# ---- packing ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_fp8_packing_keeps_the_bytes_and_permutes_the_scales_with_the_rows(fmt):
    cfg = TINY["qwen2-bias"]                      # biases packed beside FP8 rows; a tied head (fp8-all unties it)
    w = dummy_weights(cfg, seed=0).as_format(fmt)
    t = build_schedule(cfg, MID, 1).tiling
    p = pack_weights(w, t, 16)
    L, H, Q, KV, I, V = (cfg.num_hidden_layers, cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size,
                         cfg.vocab_size)
    assert p.fp8 and p.fp8_head == (fmt == "fp8-all")
    for name in ("wqkv", "wo", "wgu", "wdown"):
        assert getattr(p, name).dtype == torch.float8_e4m3fn and getattr(p, name).is_contiguous()
    assert p.sqkv.shape == (L, Q + 2 * KV) and p.sgu.shape == (L, 2 * t.i_pad)
    assert p.so.shape == (L, H) and p.sdown.shape == (L, H)
    assert all(s.dtype == torch.float32 for s in (p.sqkv, p.sgu, p.so, p.sdown))
    # packed row r of wqkv is stacked row perm[r], bytes and scale alike
    perm = qk_permutation(Q + 2 * KV, cfg.head_dim, t.hb)
    l1 = w.layers[1]
    stack = torch.cat([l1.q_proj.qweight.view(torch.uint8), l1.k_proj.qweight.view(torch.uint8),
                       l1.v_proj.qweight.view(torch.uint8)])
    assert torch.equal(p.wqkv[1].view(torch.uint8), stack[perm])
    assert torch.equal(p.sqkv[1], torch.cat([l1.q_proj.scale, l1.k_proj.scale, l1.v_proj.scale])[perm])
    g, u = gateup_rows(I, t.gb)
    assert torch.equal(p.wgu[0, g].view(torch.uint8), w.layers[0].gate_proj.qweight.view(torch.uint8))
    assert torch.equal(p.sgu[0, u], w.layers[0].up_proj.scale)
    pad = torch.ones(2 * t.i_pad, dtype=torch.bool)
    pad[g], pad[u] = False, False
    assert (p.wgu[:, pad].view(torch.uint8) == 0).all() and (p.sgu[:, pad] == 0).all()
    assert torch.equal(p.so[1], w.layers[1].o_proj.scale) and torch.equal(p.sdown[0], w.layers[0].down_proj.scale)
    # packing commutes with dequantizing: the packed q · s equals the packing of the dequantized weights
    plain = pack_weights(_np_dequantized(w), t, 16)
    for mat, scale in (("wqkv", "sqkv"), ("wgu", "sgu"), ("wo", "so"), ("wdown", "sdown")):
        got = getattr(p, mat).float() * getattr(p, scale)[..., None]
        assert torch.equal(got, getattr(plain, mat)), mat
    if fmt == "fp8-all":
        assert p.lm_head.dtype == torch.float8_e4m3fn and p.slm.shape == (V,)
        assert torch.equal(p.lm_head.float() * p.slm[:, None], plain.lm_head)
    else:
        assert p.slm is None and p.lm_head.data_ptr() == p.embed.data_ptr()   # still tied: one copy
    # bytes: 1 per FP8 weight, 4 per row scale, the float32 rest as stored, a tied head once
    f32 = 4
    rest = (V * H + H + 2 * L * H + 2 * 16 * (cfg.head_dim // 2) + L * (Q + 2 * KV)) * f32   # embed, norms, rope, bias
    layer = L * ((Q + 2 * KV) * H + H * Q + 2 * t.i_pad * H + H * I) + f32 * L * (Q + 2 * KV + 2 * t.i_pad + 2 * H)
    head = V * H + f32 * V if fmt == "fp8-all" else 0
    assert p.nbytes() == rest + layer + head


def test_unquantized_packing_has_no_scales():
    w = dummy_weights(TINY["mha-untied"], seed=0)
    p = pack_weights(w, build_schedule(w.config, MID, 1).tiling, 16)
    assert not p.fp8 and not p.fp8_head
    assert (p.sqkv, p.sgu, p.so, p.sdown, p.slm) == (None,) * 5
    assert p.wqkv.dtype == p.lm_head.dtype == torch.float32


# ---- the kernel against the references --------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", list(TINY))
def test_fp8_logits_match_the_float32_dequantized_reference(name, fmt):
    """Teacher-forced logits (batched prefill, then kernel steps) against the reference engine in float32 over q · s
    from numpy, and against the reference engine's own FP8 path and the table's PyTorch oracle over the same
    quantized weights: all float32, so within float32 summation order."""
    cfg = TINY[name]
    w = dummy_weights(cfg, seed=1).as_format(fmt)
    eng = MegakernelEngine(w, params=_mid(cfg), max_seq_len=32)
    got = teacher_forced_logits(eng, PROMPT, FORCED)
    want = teacher_forced_logits(ReferenceEngine(_np_dequantized(w), max_seq_len=32), PROMPT, FORCED)
    ref8 = teacher_forced_logits(ReferenceEngine(w, max_seq_len=32), PROMPT, FORCED)
    orc = teacher_forced_logits(ScheduleInterpreter(w, params=_mid(cfg), max_seq_len=32), PROMPT, FORCED)
    assert (got - want).abs().max().item() < 1e-4
    assert (got - ref8).abs().max().item() < 1e-4
    assert (got - orc).abs().max().item() < 1e-4
    info = eng.compile_info()
    assert info["weights"] == fmt and info["implementation"] == "triton"
    assert eng.greedy_token().item() == int(torch.argmax(got[-1]))
    # the FP8 path is really taken: not the unquantized model's logits
    plain = teacher_forced_logits(ReferenceEngine(dummy_weights(cfg, seed=1), max_seq_len=32), PROMPT, FORCED)
    assert (got - plain).abs().max().item() > 1e-3


def test_fp8_stepwise_prefill_matches_batched():
    """The prompt through kernel steps (every matvec FP8 in the kernel) against the batched prefill (each packed
    matrix dequantized for its GEMM): the same logits to float32 order."""
    cfg = TINY["gqa-tied-llama3"]
    w = dummy_weights(cfg, seed=2).as_format("fp8-all")
    a = teacher_forced_logits(MegakernelEngine(w, params=MID, max_seq_len=32, prefill="stepwise"), PROMPT, FORCED)
    b = teacher_forced_logits(MegakernelEngine(w, params=MID, max_seq_len=32), PROMPT, FORCED)
    assert (a - b).abs().max().item() < 1e-4


@pytest.mark.parametrize("fmt", FORMATS)
def test_fp8_greedy_tokens_equal_the_reference_engine(fmt):
    w = dummy_weights(TINY["mha-untied"], seed=2).as_format(fmt)
    ref = generate(ReferenceEngine(w, max_seq_len=64), PROMPT, 16, eos_ids=()).tokens
    got = generate(MegakernelEngine(w, MID, max_seq_len=64), PROMPT, 16, eos_ids=()).tokens
    assert got == ref and len(got) == 16


@pytest.mark.parametrize("name,fmt", [("gqa-tied-llama3", "fp8-all"), ("qwen2-bias", "fp8")])
def test_bf16_fp8_logits_match_the_fused_engine(name, fmt):
    """bf16 activations: the megakernel and the fused engine both scale each row's float32 sum once and round at the
    same points, so they agree but for float32 summation order (a rounding to bf16 may then fall either way); the
    reference engine rounds the dequantized weight to bf16 first and differs by more."""
    from bubblescope.fused_engine import FusedEngine, FusedParams

    cfg = TINY[name]
    w = dummy_weights(cfg, dtype=torch.bfloat16, seed=1).as_format(fmt)
    fused = FusedEngine(w, max_seq_len=32, params=FusedParams(block_n=8, block_k=16, block_s=2, splits=2))
    want = teacher_forced_logits(fused, PROMPT, FORCED).float()
    got = teacher_forced_logits(MegakernelEngine(w, params=_mid(cfg), max_seq_len=32), PROMPT, FORCED).float()
    assert (got - want).abs().max().item() <= 1e-2 * want.abs().max().item()
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@needs_stories
def test_stories260k_fp8_greedy_tokens_equal_the_reference_engine():
    w32 = load_llama2c(STORIES)
    for fmt, n in (("fp8", 48), ("fp8-all", 24)):
        w = w32.as_format(fmt)
        ref = generate(ReferenceEngine(w, max_seq_len=64), [1], n, eos_ids=()).tokens
        got = generate(MegakernelEngine(w, max_seq_len=64), [1], n, eos_ids=()).tokens
        assert got == ref, fmt


# ---- what streams, and what refuses FP8 -------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ("bf16",) + FORMATS)
def test_task_weight_bytes_count_fp8_rows_and_scales(fmt):
    cfg = TINY["mha-untied"]
    eng = MegakernelEngine(dummy_weights(cfg, seed=0).as_format(fmt), params=MID, max_seq_len=16)
    t = eng.schedule.tiling
    plain = task_weight_bytes(cfg, t, 4)                       # float32 activations: 4 bytes a weight
    got = eng.task_weight_bytes()
    if fmt == "bf16":
        assert got == plain
        return
    h = cfg.hidden_size
    assert got["QKV"] == t.rows_qkv * (h + 4) and got["OPROJ"] == t.rows_o * (cfg.q_size + 4)
    assert got["GATEUP"] == t.rows_gateup * t.gateup_blocks * (h + 4)
    assert got["DOWN"] == t.rows_down * (cfg.intermediate_size + 4)
    lm_rows = t.rows_lm * t.lm_blocks
    assert got["LMHEAD"] == (lm_rows * (h + 4) if fmt == "fp8-all" else plain["LMHEAD"])


def test_fp8_runs_on_gluon_by_name_and_by_auto_where_it_runs(monkeypatch):
    w8 = dummy_weights(TINY["mha-untied"], seed=0).as_format("fp8")
    with pytest.raises(EngineUnavailable, match="needs a CUDA GPU"):  # this CPU: the Gluon kernel cannot run
        MegakernelEngine(w8, params=MID, max_seq_len=16, impl="gluon")
    assert choose_impl(w8, "auto")[0] == "triton"
    # where the Gluon kernel runs (a Hopper GPU, here pretended): auto picks it for bf16 and for FP8 (saying why);
    # by name it runs FP8 beside 16-bit activations, and names why not beside float32 ones
    from bubblescope.megakernel_engine.gluon import host as GH
    real = GH.gluon_unsupported
    monkeypatch.setattr(GH, "gluon_unsupported", lambda cfg, dtype, cap, fmt="bf16": real(cfg, dtype, (9, 0), fmt))
    w16 = dummy_weights(TINY["qwen2-bias"], "cpu", torch.bfloat16, seed=0)  # FP8 rows of 16-byte multiples (TMA)
    assert choose_impl(w16, "auto")[0] == "gluon"
    assert choose_impl(w16.as_format("fp8"), "auto") == ("gluon", FP8_GLUON_REASON)
    assert choose_impl(w16.as_format("fp8"), "gluon")[0] == "gluon"
    assert choose_impl(w16.as_format("fp8-all"), "gluon")[0] == "gluon"
    odd = dummy_weights(TINY["mha-untied"], "cpu", torch.bfloat16, seed=0).as_format("fp8")
    with pytest.raises(EngineUnavailable, match="TMA needs 16-byte aligned weight rows; intermediate_size=40 × 1 "
                                                "bytes is not"):
        choose_impl(odd, "gluon")
    impl, why = choose_impl(w8, "auto")  # float32 activations
    assert impl == "triton" and "16-bit activations" in why
    with pytest.raises(EngineUnavailable, match="16-bit activations"):
        choose_impl(w8, "gluon")
    assert choose_impl(w8, "triton") == ("triton", "requested")


def test_fp8_through_the_engine_registry_and_mixed_refused():
    from bubblescope.engines import build_engine
    w8 = dummy_weights(TINY["mha-untied"], seed=0).as_format("fp8-all")
    for name in ("megakernel", "megakernel-triton"):
        eng = build_engine(name, w8, 16, params=MID)
        assert eng.compile_info()["weights"] == "fp8-all"
    mixed = dummy_weights(TINY["mha-untied"], seed=0)
    mixed.layers[0].q_proj = quantize_fp8(mixed.layers[0].q_proj)
    assert mixed.weight_format == "mixed"
    with pytest.raises(EngineUnavailable, match="partly in FP8"):
        MegakernelEngine(mixed, params=MID, max_seq_len=16)
