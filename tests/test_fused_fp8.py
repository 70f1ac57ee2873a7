"""The fused engine's FP8 path on CPU under TRITON_INTERPRET=1: the matvec kernels over float8_e4m3fn weights and
float32 row scales against a float64 numpy reference of q·s, the whole engine against the reference engine's torch
FP8-dequantize matvecs over the same quantized weights (to float32 rounding), stories260K's FP8 agreement with its
float32 model, and the kernels compiled for sm_90 with their e4m3 conversion. Engines that have no FP8 path refuse
it by name, and projections partly in FP8 are refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bubblescope.errors import EngineUnavailable
from bubblescope.generation import teacher_forced_logits
from bubblescope.models import load_llama2c
from bubblescope.models.quant import quantize_fp8
from bubblescope.models.weights import dummy_weights
from bubblescope.reference_engine import ReferenceEngine

from .conftest import STORIES, needs_stories
from .test_megakernel_schedule import FORCED, PROMPT, TINY

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA machine: Triton runs compiled here")


def _np(t):
    return t.detach().double().numpy()


def _deq(q):
    """q · s in float64, from the stored FP8 values and scales (numpy, not the package's dequantize)."""
    return _np(q.qweight.float()) * _np(q.scale)[:, None]


def test_fp8_matvec_gateup_and_lmhead_kernels_match_numpy():
    from bubblescope.fused_engine import kernels as K
    tl = __import__("triton").language
    g = torch.Generator().manual_seed(8)
    N, Kd, H, eps = 13, 37, 21, 1e-5                      # rows and columns masked in every program
    w = quantize_fp8(torch.randn(N, Kd, generator=g) * torch.linspace(0.01, 3, N)[:, None])
    w.qweight[5] = 0                                      # a zero row, scale 0
    w.scale[5] = 0
    a, x = torch.randn(Kd, generator=g), torch.randn(N, generator=g)
    x0, ss = x.clone(), torch.zeros(1)
    K.matvec_residual_kernel[(4,)](w.qweight, a, x, ss, N=N, K=Kd, BLOCK_N=4, BLOCK_K=16, STATS_OUT=False,
                                   ACT=tl.float32, USE_PDL=False, ws_ptr=w.scale, W_FP8=True)
    np.testing.assert_allclose(_np(x), _np(x0) + _deq(w) @ _np(a), rtol=1e-5, atol=1e-5)
    assert x[5] == x0[5]

    xs, nw = torch.randn(H, generator=g), torch.rand(H, generator=g) + 0.5
    wg, wu = quantize_fp8(torch.randn(N, H, generator=g)), quantize_fp8(torch.randn(N, H, generator=g) / 9)
    out = torch.zeros(N)
    K.gateup_kernel[(2,)](xs, nw, wg.qweight, wu.qweight, out, torch.zeros(1), eps, I=N, H=H, BLOCK_N=8, BLOCK_K=8,
                          STATS_IN=False, ACT=tl.float32, USE_PDL=False, wgs_ptr=wg.scale, wus_ptr=wu.scale,
                          W_FP8=True)
    h = _np(xs) / np.sqrt((_np(xs) ** 2).mean() + eps) * _np(nw)
    gate, up = _deq(wg) @ h, _deq(wu) @ h
    np.testing.assert_allclose(_np(out), gate / (1 + np.exp(-gate)) * up, rtol=1e-5, atol=1e-5)

    V = 45
    head = quantize_fp8(torch.randn(V, H, generator=g) / 4)
    logits, keys = torch.zeros(V), torch.full((4,), -2 ** 63, dtype=torch.int64)
    K.lmhead_kernel[(6,)](xs, nw, head.qweight, logits, keys, torch.zeros(1), eps, V=V, H=H, BLOCK_N=8, BLOCK_K=16,
                          NSLOT=4, STATS_IN=False, ACT=tl.float32, USE_PDL=False, ws_ptr=head.scale, W_FP8=True)
    np.testing.assert_allclose(_np(logits), _deq(head) @ h, rtol=1e-5, atol=1e-5)


def _fused(w, grid_per_sm=0):
    from bubblescope.fused_engine import FusedEngine, FusedParams
    return FusedEngine(w, max_seq_len=32, params=FusedParams(block_n=8, block_k=16, block_s=2, splits=3,
                                                              fused_reduce=True, norm_stats="atomic",
                                                              grid_per_sm=grid_per_sm))


@pytest.mark.parametrize("name,fmt,grid_per_sm", [("gqa-tied-llama3", "fp8-all", 0), ("mha-untied", "fp8", 0),
                                                  ("qwen2-bias", "fp8-all", 0), ("qwen3-qknorm", "fp8", 0),
                                                  ("gqa-tied-llama3", "fp8-all", 2)])
def test_fused_fp8_matches_the_dequantizing_reference(name, fmt, grid_per_sm):
    # the same quantized weights: the reference dequantizes each matrix (q·s) and runs F.linear; the kernels stream
    # the FP8 tiles and scale each row's sum once (grid_per_sm 2: persistent programs over several row blocks, each
    # block's scales carried with its tiles)
    w = dummy_weights(TINY[name], seed=0).as_format(fmt)
    want = teacher_forced_logits(ReferenceEngine(w, max_seq_len=32), PROMPT, FORCED)
    fe = _fused(w, grid_per_sm)
    got = teacher_forced_logits(fe, PROMPT, FORCED)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()
    assert fe.compile_info()["weights"] == fmt
    # and not the unquantized model's logits: the FP8 path is really taken
    plain = teacher_forced_logits(ReferenceEngine(dummy_weights(TINY[name], seed=0), max_seq_len=32), PROMPT, FORCED)
    assert (got - plain).abs().max() > 1e-3


# stories260K's own greedy continuation of "Once upon a time" (float32 reference engine), as text
STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she "
         "saw a big, red ball. She wanted to play with it, but it was too high.")


@needs_stories
def test_stories260k_fp8_fused_equals_reference_and_agrees_with_float32():
    from bubblescope.fused_engine import FusedEngine
    from bubblescope.models.tokenizer import load_tokenizer

    ids = load_tokenizer(STORIES.parent / "tok512.bin", vocab_size=512, bos_token_id=1).encode(STORY, bos=True)
    prompt, forced = ids[:5], ids[5:]                                # 5 + 57 tokens
    w32 = load_llama2c(STORIES)
    w8 = w32.as_format("fp8")
    ref8, fe8 = ReferenceEngine(w8, max_seq_len=80), FusedEngine(w8, max_seq_len=80)
    got, want = teacher_forced_logits(fe8, prompt, forced[:2]), teacher_forced_logits(ref8, prompt, forced[:2])
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()
    # quantization's cost: top-1 agreement of the FP8 model with the float32 one, teacher-forced on real text (the
    # issue's bar, 97 %, is for 256 tokens; 58 rows here keep the test fast)
    a = teacher_forced_logits(ReferenceEngine(w32, max_seq_len=80), prompt, forced)
    b = teacher_forced_logits(ref8, prompt, forced)
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.97
    assert 0 < ((a - b).norm(dim=-1) / a.norm(dim=-1)).max() < 0.2


def test_engines_without_an_fp8_path_refuse_it():
    """``hf`` runs unquantized weights only; projections partly in FP8 are refused by the engines whose kernels
    stream FP8 (one kernel variant for every matrix). The megakernel's FP8 path: tests/test_megakernel_fp8.py."""
    from bubblescope.engines import build_engine
    import importlib.util

    if importlib.util.find_spec("transformers"):
        with pytest.raises(EngineUnavailable, match="fp8"):
            build_engine("hf", dummy_weights(TINY["mha-untied"], seed=0).as_format("fp8"), 32)
    mixed = dummy_weights(TINY["mha-untied"], seed=0)
    mixed.layers[0].q_proj = quantize_fp8(mixed.layers[0].q_proj)
    assert mixed.weight_format == "mixed"
    for name in ("reference-fused", "megakernel-triton"):
        with pytest.raises(EngineUnavailable, match="partly in FP8"):
            build_engine(name, mixed, 32)


def test_fp8_kernels_compile_for_sm90_without_spills():
    """The FP8 variants compiled by Triton and ptxas for sm_90 at real shapes (Llama-3.2-1B with its LM head in FP8,
    Qwen3-0.6B's q/k-norm, Qwen2.5-0.5B's biases), in a fresh interpreter: no spills, registers × warps within one
    SM, PDL's wait, and an e4m3 conversion (``cvt`` from ``e4m3x2``) in every kernel that reads weights."""
    from .conftest import compile_in_subprocess

    script = ("import json\nfrom bubblescope.models.config import get_preset\n"
              "from bubblescope.fused_engine.offline import compile_offline\n"
              "print(json.dumps({m: compile_offline(get_preset(m), weight_format=f) for m, f in "
              "(('llama-3.2-1b', 'fp8-all'), ('qwen3-0.6b', 'fp8'), ('qwen2.5-0.5b', 'fp8'))}))")
    out = compile_in_subprocess(script)
    streams = {"qkv_rope_kernel", "matvec_residual_kernel", "gateup_kernel"}
    for model, kernels in out.items():
        for k in kernels:
            assert k["spill_store_bytes"] in (0, None) and k["registers"] * k["num_warps"] * 32 <= 65536, (model, k)
            assert k["griddepcontrol"], (model, k)
            fp8 = k["kernel"] in streams or (k["kernel"] == "lmhead_kernel" and model == "llama-3.2-1b")
            assert k["fp8"] == fp8, (model, k)
