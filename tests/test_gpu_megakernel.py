"""GPU-only: the compiled megakernel against the reference engine (skipped on CPU; CPU runs the interpreter tests)."""

from __future__ import annotations

import pytest
import torch

from bubblescope.generation import teacher_forced_logits
from bubblescope.models import dummy_weights, get_preset
from bubblescope.reference_engine import ReferenceEngine

pytestmark = pytest.mark.gpu


def _impls():
    """The kernel implementations this GPU runs (the Gluon one needs Hopper)."""
    if not torch.cuda.is_available():
        return ["triton"]
    return ["gluon", "triton"] if torch.cuda.get_device_capability()[0] == 9 else ["triton"]


# Qwen3 (q/k-norm in the Gluon attention task, head_dim 128) on the Gluon kernel only: the Triton kernel's
# whole-head QKV path is checked on CPU under the interpreter.
CASES = [(m, i) for i in _impls() for m in ("llama-3.2-1b", "qwen3-0.6b") if m == "llama-3.2-1b" or i == "gluon"]


@pytest.mark.parametrize("model,impl", CASES)
@pytest.mark.parametrize("variant", ["fused", "stages", "noprefetch"])
def test_megakernel_matches_reference_bf16(variant, model, impl):
    from bubblescope.megakernel_engine import MegakernelEngine

    w = dummy_weights(get_preset(model), "cuda", torch.bfloat16, seed=1)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, w.config.vocab_size, (16,), generator=g).tolist()
    forced = torch.randint(3, w.config.vocab_size, (24,), generator=g).tolist()
    ref = teacher_forced_logits(ReferenceEngine(w, "eager", 64), prompt, forced)
    truth = teacher_forced_logits(ReferenceEngine(w.to(dtype=torch.float32), "eager", 64), prompt, forced)
    eng = MegakernelEngine(w, max_seq_len=64, variant=variant, impl=impl)
    assert eng.compile_info()["implementation"] == impl
    got = teacher_forced_logits(eng, prompt, forced)

    def rel(a, b):
        return ((a - b).norm(dim=-1) / b.norm(dim=-1)).max().item()

    # Both bf16 engines round at the same points but accumulate in different orders; the float32 model on
    # the same weights says which is off: the megakernel must be about as close to it as the reference is.
    assert rel(got, truth) < 1.5 * rel(ref, truth) + 1e-3, (rel(got, truth), rel(ref, truth))
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.95


def test_megakernel_fp32_tiny_matches_reference_tightly():
    from bubblescope.megakernel_engine import MegakernelEngine

    w = dummy_weights(get_preset("tiny-llama"), "cuda", torch.float32, seed=2)
    prompt, forced = [1, 5, 9, 4], list(range(10, 40))
    ref = teacher_forced_logits(ReferenceEngine(w, "eager", 64), prompt, forced)
    got = teacher_forced_logits(MegakernelEngine(w, max_seq_len=64), prompt, forced)
    # TF32 is off for Triton's fp32 dot only if the kernel uses tl.dot; matvecs here are fp32 FMA reductions
    assert (got - ref).abs().max().item() < 1e-3


FP8_CASES = [("llama-3.2-1b", "fp8", i) for i in _impls()] + [("llama-3.2-1b", "fp8-all", i) for i in _impls()] + [
    (m, "fp8", "gluon") for m in ("qwen3-0.6b", "qwen2.5-0.5b") if "gluon" in _impls()]


@pytest.mark.parametrize("model,fmt,impl", FP8_CASES)
def test_megakernel_fp8_matches_reference_fused(model, fmt, impl):
    """FP8 weights on each kernel (``auto`` picks the Gluon one on Hopper, the Triton one by name; with Qwen3's
    q/k-norm and Qwen2.5's biases and 16-row tiles) match reference-fused over the same FP8 weights: all stream the e4m3 tiles, scale each row's
    float32 sum once and round at the same points, so they differ by float32 summation order only (a bf16 rounding
    may then fall either way and carry through the layers). The float32 model over the same quantized weights says
    which is off: the megakernel must be about as close to it as reference-fused is. The Gluon kernel's automatic
    matvec for FP8 is the tensor cores' (each box widened to f16 in registers, multiplied against the staged vector
    rounded to f16; a 16-bit head beside them read as 16-bit boxes of the same bytes)."""
    _check_fp8(model, fmt, impl, None, "mma")


@pytest.mark.parametrize("model,fmt", [("llama-3.2-1b", "fp8"), ("llama-3.2-1b", "fp8-all"), ("qwen3-0.6b", "fp8"),
                                       ("qwen2.5-0.5b", "fp8")])
def test_gluon_megakernel_fp8_on_the_cuda_cores_matches_reference_fused(model, fmt):
    """``mv_widen=convert`` with FP8 weights, by name: each e4m3 pair converted and summed in float32 on the CUDA
    cores, held to the same bounds as the tensor-core form."""
    if "gluon" not in _impls():
        pytest.skip("the Gluon kernel needs an sm_90 GPU")
    from bubblescope.megakernel_engine import MegakernelParams
    _check_fp8(model, fmt, "gluon", MegakernelParams(mv_widen="convert"), "convert")


def _check_fp8(model, fmt, impl, params, widen):
    from bubblescope.fused_engine import FusedEngine
    from bubblescope.megakernel_engine import MegakernelEngine

    w = dummy_weights(get_preset(model), "cuda", torch.bfloat16, seed=1).as_format(fmt)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, w.config.vocab_size, (16,), generator=g).tolist()
    forced = torch.randint(3, w.config.vocab_size, (48,), generator=g).tolist()
    fused = teacher_forced_logits(FusedEngine(w, max_seq_len=80), prompt, forced).float()
    truth = teacher_forced_logits(ReferenceEngine(w.to(dtype=torch.float32), "eager", 80), prompt, forced)
    eng = MegakernelEngine(w, params=params, max_seq_len=80, impl=impl)
    info = eng.compile_info()
    assert info["implementation"] == impl and info["weights"] == fmt
    if params is None:
        auto = "gluon" if "gluon" in _impls() else "triton"
        assert MegakernelEngine(w, max_seq_len=80).compile_info()["implementation"] == auto
    if impl == "gluon":
        assert info["gluon"]["mv_widen"] == widen and info["gluon"]["BK"] == 256, info["gluon"]
    got = teacher_forced_logits(eng, prompt, forced).float()

    def rel(a, b):
        return ((a - b).norm(dim=-1) / b.norm(dim=-1)).max().item()

    assert rel(got, truth) < 1.5 * rel(fused, truth) + 1e-3, (rel(got, truth), rel(fused, truth))
    assert rel(got, fused) < 2 * rel(fused, truth) + 1e-3, (rel(got, fused), rel(fused, truth))
    assert (got.argmax(-1) == fused.argmax(-1)).float().mean().item() >= 0.95


def test_triton_megakernel_fp8_fp32_tiny_matches_reference_fused_tightly():
    """float32 activations, FP8 projections and LM head: the megakernel and reference-fused agree to float32
    summation order, and both with the reference engine's dequantizing matvecs."""
    from bubblescope.fused_engine import FusedEngine
    from bubblescope.megakernel_engine import MegakernelEngine

    w = dummy_weights(get_preset("tiny-llama"), "cuda", torch.float32, seed=2).as_format("fp8-all")
    prompt, forced = [1, 5, 9, 4], list(range(10, 40))
    fused = teacher_forced_logits(FusedEngine(w, max_seq_len=64), prompt, forced)
    ref = teacher_forced_logits(ReferenceEngine(w, "eager", 64), prompt, forced)
    got = teacher_forced_logits(MegakernelEngine(w, max_seq_len=64), prompt, forced)
    assert (got - fused).abs().max().item() < 1e-3
    assert (got - ref).abs().max().item() < 1e-3


_HOPPER = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                             reason="the Gluon megakernel needs a Hopper GPU")


@_HOPPER
@pytest.mark.parametrize("model", ["llama-3.2-1b", "qwen3-0.6b", "qwen2.5-0.5b", "qwen3-1.7b", "llama-3.2-3b",
                                   "llama-3.1-8b"])
def test_gluon_argmax_agreement_256_random_tokens(model):
    """Issues 10 and 14 (every preset): bf16 teacher-forced argmax agreement >= 99 % with the reference over 256 random
    tokens, and a relative logit error against the fp32 model no larger than the bf16 reference's own (+10 %); the
    ``auto`` choice is the Gluon kernel for each (Qwen3: q/k-norm in the attention task).

    Where the bf16 reference itself agrees with the fp32 model on fewer than 99 % of the steps, 99 % against it
    asks the impossible of any other bf16 summation order: on Llama-3.1-8B's random weights (32 layers, 128,256
    tokens) the reference agrees with fp32 on 94.1 % of the steps, and each of the megakernel's 17 flips sat at an
    fp32 top-1/top-2 margin (0.007–0.069) below both engines' own largest logit error (~0.10) (H200,
    ``benchmarks/results/h200-2026-12-01-s6/check_gluon_check_8b_argmax.json``). There the bar is the reference's own
    agreement with fp32 less 2 points, and on every step whose fp32 margin exceeds twice the reference's largest logit
    error (rounding of that size cannot flip it) the two must agree on >= 99 %."""
    from bubblescope.megakernel_engine import MegakernelEngine

    w = dummy_weights(get_preset(model), "cuda", torch.bfloat16, seed=3)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, w.config.vocab_size, (4,), generator=g).tolist()
    forced = torch.randint(3, w.config.vocab_size, (256,), generator=g).tolist()
    eng = MegakernelEngine(w, max_seq_len=300)
    assert eng.compile_info()["implementation"] == "gluon"
    assert eng.compile_info()["gluon"]["qk_norm_in_attn"] == w.config.qk_norm
    # auto_matvec: the tensor cores for the thin preset (16-row tiles by auto_rows), the CUDA cores for the rest
    assert (eng.compile_info()["gluon"]["mv_widen"] == "mma") == (model == "qwen2.5-0.5b"), eng.compile_info()
    got = teacher_forced_logits(eng, prompt, forced)
    ref = teacher_forced_logits(ReferenceEngine(w, "eager", 300), prompt, forced)
    truth = teacher_forced_logits(ReferenceEngine(w.to(dtype=torch.float32), "eager", 300), prompt, forced)

    def rel(a, b):
        return ((a - b).norm() / b.norm()).item()

    same = got.argmax(-1) == ref.argmax(-1)
    ref_vs_truth = (ref.argmax(-1) == truth.argmax(-1)).float().mean().item()
    bar = 0.99 if ref_vs_truth >= 0.99 else ref_vs_truth - 0.02
    assert same.float().mean().item() >= bar, (same.float().mean().item(), ref_vs_truth)
    top2 = truth.float().topk(2, dim=-1).values
    decided = (top2[:, 0] - top2[:, 1]) > 2 * (ref.float() - truth.float()).abs().amax(-1)
    assert decided.sum().item() >= 32, decided.sum().item()  # enough steps for the check to mean something
    assert same[decided].float().mean().item() >= 0.99, (same[decided].float().mean().item(), decided.sum().item())
    assert rel(got, truth) <= 1.1 * rel(ref, truth), (rel(got, truth), rel(ref, truth))


@_HOPPER
def test_gluon_qwen3_fp32_tiny_matches_reference_tightly():
    """Qwen3 fp32 (head_dim 64 != hidden / heads, untied, GQA) on the Gluon kernel: QKV tiles of 32 rows hold half
    a head, so q/k-norm and RoPE run in the attention task; four position splits of 4 positions, so the split
    holding the new position moves from 0 to 3 while decoding."""
    from bubblescope.megakernel_engine import MegakernelEngine
    from bubblescope.megakernel_engine.schedule import MegakernelParams
    from bubblescope.models import ModelConfig

    cfg = ModelConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=64, vocab_size=97, rope_theta=1e6, rms_norm_eps=1e-6,
                      qk_norm=True, model_type="qwen3", tie_word_embeddings=False, max_position_embeddings=64,
                      name="qwen3-tiny")
    w = dummy_weights(cfg, "cuda", torch.float32, seed=6)
    prompt, forced = [1, 5, 9, 4], list(range(10, 40))
    ref = teacher_forced_logits(ReferenceEngine(w, "eager", 64), prompt, forced)
    # 32 rows asked for: the automatic choice gives this thin model 16 (auto_rows)
    eng = MegakernelEngine(w, MegakernelParams(kv_splits=4, attn_min_chunk=4, max_rows=32), max_seq_len=64,
                           impl="gluon")
    assert eng.compile_info()["gluon"]["qk_norm_in_attn"] and eng.compile_info()["gluon"]["BR"] == 32
    got = teacher_forced_logits(eng, prompt, forced)
    assert (got - ref).abs().max().item() < 1e-3


@_HOPPER
@pytest.mark.parametrize("kw", [{"mv_ahead": 0}, {"slot_boxes": 2}, {"inflight": 0}, {"norm_load": "after"},
                                {"weight_eviction": ""}])
def test_gluon_other_forms_match_reference_tightly(kw):
    """Non-default forms on a tiny Qwen2 fp32 model whose column chunks (128 fp32) are odd in number (hidden 384:
    3; intermediate 640: 5, paired by split_k): the matvec's ring loop without its read ahead, and with two boxes
    per slot (a slot's second box lies past K and meets TMA's zeros), with no cap on the slots in flight, with
    the RMSNorm weights loaded after the sum of squares, and with the weight stream's TMA loads without an L2 policy
    (the default is evict_first, the PTX rewrite of gluon/ptx.py)."""
    from bubblescope.megakernel_engine import MegakernelEngine
    from bubblescope.megakernel_engine.schedule import MegakernelParams
    from bubblescope.models import ModelConfig

    cfg = ModelConfig(hidden_size=384, intermediate_size=640, num_hidden_layers=2, num_attention_heads=6,
                      num_key_value_heads=2, vocab_size=101, attention_bias=True, model_type="qwen2",
                      tie_word_embeddings=False, max_position_embeddings=64, name="qwen2-tiny-odd")
    w = dummy_weights(cfg, "cuda", torch.float32, seed=7)
    prompt, forced = [1, 5, 9, 4], list(range(10, 40))
    ref = teacher_forced_logits(ReferenceEngine(w, "eager", 64), prompt, forced)
    eng = MegakernelEngine(w, MegakernelParams(**kw), max_seq_len=64, impl="gluon")
    info = eng.compile_info()["gluon"]
    assert all(info[k] == v for k, v in kw.items() if k in info), info
    got = teacher_forced_logits(eng, prompt, forced)
    assert (got - ref).abs().max().item() < 1e-3


@_HOPPER
@pytest.mark.parametrize("slot_boxes", [1, 2])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_gluon_tensor_core_matvec_matches_reference(qk_norm, slot_boxes):
    """``mv_widen=mma`` (every matvec on the tensor cores: ldmatrix from the 128-byte-swizzled ring, the staged
    vector broadcast as B) on a small bf16 GQA model whose intermediate size (1,400 = 5.47 boxes of 256 columns,
    21.9 of 64) ends inside a 64-column box and leaves the last down slot past K (with two boxes per slot, 648 of
    its 1,024 columns), and whose vocabulary (1,000) ends inside an LM-head tile, with and without q/k-norm, with
    one and two boxes per ring slot: as close to the float32 model as the bf16 reference is, and the same argmax on
    ≥ 95 % of 24 forced steps."""
    from bubblescope.megakernel_engine import MegakernelEngine, MegakernelParams
    from bubblescope.models.config import ModelConfig

    cfg = ModelConfig(name="gqa-mv-mma", hidden_size=512, intermediate_size=1400, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=64, vocab_size=1000,
                      max_position_embeddings=256, tie_word_embeddings=not qk_norm, qk_norm=qk_norm,
                      attention_bias=qk_norm, model_type="qwen3" if qk_norm else "llama")
    w = dummy_weights(cfg, "cuda", torch.bfloat16, seed=8)
    g = torch.Generator().manual_seed(9)
    prompt = torch.randint(3, cfg.vocab_size, (40,), generator=g).tolist()
    forced = torch.randint(3, cfg.vocab_size, (24,), generator=g).tolist()
    ref = teacher_forced_logits(ReferenceEngine(w, "eager", 128), prompt, forced)
    truth = teacher_forced_logits(ReferenceEngine(w.to(dtype=torch.float32), "eager", 128), prompt, forced)
    eng = MegakernelEngine(w, MegakernelParams(mv_widen="mma", max_rows=32, slot_boxes=slot_boxes), max_seq_len=128,
                           impl="gluon")
    info = eng.compile_info()["gluon"]
    assert (info["mv_widen"], info["slot_boxes"]) == ("mma", slot_boxes), info
    got = teacher_forced_logits(eng, prompt, forced)

    def rel(a, b):
        return ((a - b).norm(dim=-1) / b.norm(dim=-1)).max().item()

    assert rel(got, truth) < 1.5 * rel(ref, truth) + 1e-3, (rel(got, truth), rel(ref, truth))
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.95


_ATTN_VARIANTS = {"late": {"attn_operands": "late", "attn_new_row": "block", "attn_combine": "warps"},
                  "early": {"attn_operands": "early"},
                  "late-row": {"attn_operands": "late", "attn_new_row": "row", "attn_combine": "lanes"}}


@_HOPPER
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("operands", list(_ATTN_VARIANTS))
@pytest.mark.parametrize("n_prompt", [1500, 60])
def test_gluon_mma_attention_matches_reference_over_several_blocks(qk_norm, operands, n_prompt):
    """``attn_layout=mma`` (q·Kᵀ and P·V on the tensor cores, P rounded to bf16) on a small bf16 GQA model, with
    and without Qwen3's q/k-norm, with the operands converted after the dependency wait (``late``: the whole first
    block after it, the split combine in the warps layout) or before it (``early``), and after it with the first
    block's older rows loaded before the wait and the split combine's reductions in one warp's lanes
    (``late-row``: ``attn_new_row=row``, ``attn_combine=lanes``): after a 1,500-token prompt every position split
    holds two K/V blocks (the online softmax rescales across them; the newest position in a split's second block),
    after 60 tokens one (the newest position in the first block, patched into the early operands or the older
    rows). As close to the float32 model as the bf16 reference is, and the same argmax on ≥ 95 % of 24 forced
    steps."""
    from bubblescope.megakernel_engine import MegakernelEngine, MegakernelParams
    from bubblescope.models.config import ModelConfig

    cfg = ModelConfig(name="gqa-mma", hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=512,
                      max_position_embeddings=2048, tie_word_embeddings=not qk_norm, qk_norm=qk_norm,
                      model_type="qwen3" if qk_norm else "llama")
    w = dummy_weights(cfg, "cuda", torch.bfloat16, seed=4)
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(3, cfg.vocab_size, (n_prompt,), generator=g).tolist()
    forced = torch.randint(3, cfg.vocab_size, (24,), generator=g).tolist()
    ref = teacher_forced_logits(ReferenceEngine(w, "eager", 1536), prompt, forced)
    truth = teacher_forced_logits(ReferenceEngine(w.to(dtype=torch.float32), "eager", 1536), prompt, forced)
    kw = _ATTN_VARIANTS[operands]
    eng = MegakernelEngine(w, MegakernelParams(attn_layout="mma", **kw), max_seq_len=1536, impl="gluon")
    assert eng.compile_info()["gluon"]["attn_layout"] == "mma"
    assert all(eng.compile_info()["gluon"][k] == v for k, v in kw.items()), eng.compile_info()["gluon"]
    got = teacher_forced_logits(eng, prompt, forced)

    def rel(a, b):
        return ((a - b).norm(dim=-1) / b.norm(dim=-1)).max().item()

    assert rel(got, truth) < 1.5 * rel(ref, truth) + 1e-3, (rel(got, truth), rel(ref, truth))
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.95
