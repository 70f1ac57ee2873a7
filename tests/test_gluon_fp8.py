"""The Gluon megakernel with FP8 weights (``--weights fp8`` / ``fp8-all``) on a CPU: its ring and tiling, the switches it
refuses, the TMA descriptors of a 16-bit head among FP8 boxes, the schedule over its tiling checked by the PyTorch
oracle against the reference engine, and the kernel compiled for sm_90. Its numerics run on the GPU
(tests/test_gpu_megakernel.py)."""

from __future__ import annotations

import pytest
import torch

from bubblescope.errors import BubblescopeError
from bubblescope.generation import teacher_forced_logits
from bubblescope.megakernel_engine.gluon.host import (
    SMEM_PER_BLOCK_SM90,
    TMA_BOX_MAX,
    gluon_choice,
    gluon_constexprs,
    gluon_params,
    gluon_tiling,
    gluon_unsupported,
    mv_mma_unsupported,
    ring_slot_bytes,
    weight_descriptors,
)
from bubblescope.megakernel_engine.interpreter import ScheduleInterpreter
from bubblescope.megakernel_engine.packing import pack_weights
from bubblescope.megakernel_engine.schedule import MegakernelParams
from bubblescope.models.config import get_preset
from bubblescope.models.weights import dummy_weights
from bubblescope.reference_engine import ReferenceEngine

from .conftest import compile_in_subprocess
from .test_megakernel_schedule import FORCED, PROMPT, TINY


def _resolved(cfg, fmt, dtype=torch.bfloat16, **kw):
    p = gluon_params(cfg, MegakernelParams(**kw), 132, dtype, fmt)
    t = gluon_tiling(cfg, p, 132, dtype, fmt)
    return t, gluon_constexprs(cfg, t, p, 512, dtype, False, weight_format=fmt)


def test_gluon_fp8_ring_holds_the_bytes_of_the_16_bit_ring():
    """1-byte boxes: 256 columns (the TMA box limit; bf16's 512-byte rows are 256 columns too), 8 KB slots at 32 rows,
    twice the slots (24 × 8 KB = 12 × 16 KB), twice the slots in flight under the same 64 KB cap, the activations'
    16-byte vectors unchanged, and the CUDA-core widening by conversion (the bf16 bit trick reads bf16 pairs)."""
    cfg = get_preset("llama-3.2-1b")
    _, bf = _resolved(cfg, "bf16")
    t, f8 = _resolved(cfg, "fp8", mv_widen="convert")  # the CUDA-core form, by name: auto takes the tensor cores
    _, fa = _resolved(cfg, "fp8-all", mv_widen="convert")
    assert bf["BK"] == f8["BK"] == TMA_BOX_MAX == 256
    assert (f8["BR"], ring_slot_bytes(f8, 1), f8["NS"]) == (32, 32 * 256, 24)
    assert f8["NS"] * ring_slot_bytes(f8, 1) == bf["NS"] * ring_slot_bytes(bf, 2) == 12 * 16384
    assert (bf["INFLIGHT"], f8["INFLIGHT"]) == (4, 8)
    assert f8["VEC"] == bf["VEC"] == 8
    assert bf["MV_BITS"] and not f8["MV_BITS"] and gluon_choice(t, f8)["mv_widen"] == "convert"
    assert (bf["W_FP8"], bf["HEAD_FP8"], f8["W_FP8"], f8["HEAD_FP8"], fa["W_FP8"], fa["HEAD_FP8"]) == \
        (False, False, True, False, True, True)
    # auto: FP8 on the tensor cores on every model, two 256-column boxes (16 KB) a slot, the same 192 KB ring;
    # bf16 only on the thin one (Qwen2.5-0.5B), the 32-row presets keeping the CUDA-core bit trick
    for name, bf16_mma in (("llama-3.2-1b", False), ("qwen2.5-0.5b", True), ("llama-3.1-8b", False)):
        m = get_preset(name)
        ta, a8 = _resolved(m, "fp8")
        assert (a8["MV_MMA"], a8["SB"], a8["BR"], gluon_choice(ta, a8)["mv_widen"]) == (True, 2, 32, "mma"), name
        assert a8["NS"] * ring_slot_bytes(a8, 1) <= 12 * 16384
        assert _resolved(m, "bf16")[1]["MV_MMA"] == bf16_mma, name


def test_gluon_fp8_refusals_name_the_reason():
    cfg = get_preset("llama-3.2-1b")
    assert gluon_unsupported(cfg, torch.bfloat16, (9, 0), "fp8") is None
    assert gluon_unsupported(cfg, torch.float16, (9, 0), "fp8-all") is None
    assert "16-bit activations" in gluon_unsupported(cfg, torch.float32, (9, 0), "fp8")
    # the tensor cores take FP8 by name (widened to f16): two 256-column boxes a slot, four 128-byte boxes for the
    # four consumer warps; one box a slot holds two, too few for eight warps
    _, mma = _resolved(cfg, "fp8", mv_widen="mma")
    assert (mma["MV_MMA"], mma["SB"], mma["BK"], mma["BR"]) == (True, 2, 256, 32)
    with pytest.raises(BubblescopeError, match="splits a slot's 128-column boxes across the 8 consumer warps and a "
                                               "slot holds 2"):
        _resolved(cfg, "fp8", mv_widen="mma", slot_boxes=1, num_warps=8)
    assert "needs 16-bit or FP8 weights; got 32-bit" in mv_mma_unsupported(cfg, 4, 32, 2, 128, 2, 4)
    for kw in ({"l2_ahead": 2}, {"wait_prefetch": 2}):
        with pytest.raises(BubblescopeError, match="l2_ahead and wait_prefetch run with 16-bit weights only"):
            _resolved(cfg, "fp8", **kw)
    _resolved(cfg, "bf16", l2_ahead=2)  # still fine in bf16


def test_gluon_fp8_descriptors_give_a_16_bit_head_the_bytes_of_an_fp8_box():
    """``--weights fp8``: FP8 layer boxes [BR, 256] (O-proj / down [BR/2, 256]) and the bf16 head's [BR, 128], 8 KB
    each; ``fp8-all``: the head's boxes are FP8 [BR, 256] too (a model whose FP8 rows are 16-byte multiples, as TMA
    needs)."""
    cfg = TINY["qwen2-bias"]
    for fmt, head in (("fp8", (torch.bfloat16, 2)), ("fp8-all", (torch.float8_e4m3fn, 1))):
        w = dummy_weights(cfg, "cpu", torch.bfloat16, seed=0).as_format(fmt)
        t, cx = _resolved(cfg, fmt)
        p = pack_weights(w, t, 64)
        d = weight_descriptors(p, cx["BR"], cx["BK"], cx["SPLIT"], cx["MV_MMA"])
        bk, br = cx["BK"], cx["BR"]
        assert d["wqkv_desc"].base.dtype == torch.float8_e4m3fn and d["wqkv_desc"].block_shape == [br, bk]
        assert d["wo_desc"].block_shape == d["wdown_desc"].block_shape == [br // cx["SPLIT"], bk]
        assert d["head_desc"].base.dtype == head[0]
        assert d["head_desc"].block_shape == [br, bk // head[1]]
        nbytes = {k: v.block_shape[0] * v.block_shape[1] * v.base.element_size() for k, v in d.items()}
        assert nbytes["head_desc"] == nbytes["wqkv_desc"] == nbytes["wgu_desc"] == br * bk
        # the tensor-core matvec's boxes: 128 bytes a row, 128-byte swizzled (FP8: 128 columns, a bf16 head 64)
        m = weight_descriptors(p, cx["BR"], cx["BK"], cx["SPLIT"], True)
        assert m["wqkv_desc"].block_shape == [br, 128] and m["wo_desc"].block_shape == [br // cx["SPLIT"], 128]
        assert m["head_desc"].block_shape == [br, 128 // head[1]]
        assert {v.layout.swizzle_byte_width for v in m.values()} == {128}


@pytest.mark.parametrize("fmt", ["fp8", "fp8-all"])
@pytest.mark.parametrize("name", ["gqa-tied-llama3", "qwen2-bias", "qwen3-qknorm"])
def test_gluon_fp8_schedule_matches_reference(name, fmt):
    """The task graph over the Gluon FP8 tiling (BR-row tiles, gate/up packed in BR/2 blocks with their scales beside
    them), run by the PyTorch oracle, against the reference engine on the same FP8 weights (float32 activations:
    both dequantize to the same float32 products, so only summation order differs)."""
    cfg = TINY[name]
    w = dummy_weights(cfg, "cpu", torch.float32, seed=3).as_format(fmt)
    params = gluon_params(cfg, MegakernelParams(), 132, torch.bfloat16, fmt).replace(num_programs=5)
    ref = teacher_forced_logits(ReferenceEngine(w, "eager", 48), PROMPT, FORCED)
    got = teacher_forced_logits(ScheduleInterpreter(w, params=params, max_seq_len=48), PROMPT, FORCED)
    assert (got - ref).abs().max().item() < 1e-4


FP8_BUILDS = (("llama-3.2-1b", "fp8", "auto"), ("llama-3.2-1b", "fp8-all", "auto"), ("qwen3-0.6b", "fp8", "auto"),
              ("qwen2.5-0.5b", "fp8", "auto"), ("llama-3.1-8b", "fp8-all", "auto"), ("llama-3.2-1b", "fp8", "convert"))
_COMPILE = """
import json, torch
from bubblescope.models.config import get_preset
from bubblescope.megakernel_engine.gluon.host import compile_offline
out = []
from bubblescope.megakernel_engine.schedule import MegakernelParams
for model, fmt, widen in (('llama-3.2-1b', 'bf16', 'auto'), ('llama-3.2-1b', 'fp8', 'auto'),
                          ('llama-3.2-1b', 'fp8-all', 'auto'), ('qwen3-0.6b', 'fp8', 'auto'),
                          ('qwen2.5-0.5b', 'fp8', 'auto'), ('llama-3.1-8b', 'fp8-all', 'auto'),
                          ('llama-3.2-1b', 'fp8', 'convert')):
    i = compile_offline(get_preset(model), torch.bfloat16, MegakernelParams(mv_widen=widen), weight_format=fmt)
    out.append({k: i[k] for k in ('registers', 'spill_store_bytes', 'shared_bytes', 'num_warps', 'ring_bytes',
                                  'tma_loads', 'fp8_converts', 'mma_sync')})
print(json.dumps(out))
"""


@pytest.mark.slow
def test_gluon_fp8_kernel_compiles_for_sm90_within_one_sm():
    """The FP8 kernel through Triton and ptxas for sm_90a (the 1B with a bf16 head and all-FP8, Qwen3's q/k-norm,
    Qwen2.5's biases and 16-row tiles, the 8B's 14336-wide staged vector; every matvec on the tensor cores, as auto
    chooses for FP8, and the 1B's on the CUDA cores by name): no spills (8 bytes on the 8B's tensor-core form, which
    measured 10 % faster than its CUDA-core form on an H100 all the same), registers × warps and shared
    memory within one H200 SM, a ring as deep in bytes as the bf16 kernel's (192 KB), and the e4m3 conversion in its
    code (none in the bf16 kernel)."""
    bf, *fp8 = compile_in_subprocess(_COMPILE)
    assert bf["fp8_converts"] == 0, bf
    for (model, fmt, _), info in zip(FP8_BUILDS, fp8):
        assert info["spill_store_bytes"] <= (8 if model == "llama-3.1-8b" else 0), (model, fmt, info)
        assert info["registers"] * info["num_warps"] * 32 <= 65536, info
        assert info["shared_bytes"] <= SMEM_PER_BLOCK_SM90, info
        assert info["fp8_converts"] > 0, info
    assert fp8[0]["ring_bytes"] == fp8[1]["ring_bytes"] == bf["ring_bytes"] == 12 * 16384, (bf, fp8)
    # FP8 on the tensor cores (auto): the same ring bytes; mma.sync for every matvec, not only attention's as in
    # the CUDA-core form
    assert fp8[-1]["ring_bytes"] == bf["ring_bytes"] and fp8[0]["mma_sync"] > 4 * fp8[-1]["mma_sync"], fp8
