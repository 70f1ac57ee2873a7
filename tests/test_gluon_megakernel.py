"""The Gluon megakernel on a CPU: its host schedule checked by the PyTorch oracle against the reference engine,
its choice rules, and the kernel itself compiled for sm_90 (Gluon does not run under the interpreter, so its
numerics are checked on the GPU: tests/test_gpu_megakernel.py)."""

from __future__ import annotations

import json

import pytest
import torch

from bubblescope.generation import teacher_forced_logits
from bubblescope.megakernel_engine.gluon.host import (
    DEFAULT_ROWS,
    SMEM_PER_BLOCK_SM90,
    gluon_choice,
    gluon_constexprs,
    gluon_params,
    gluon_tiling,
    gluon_unsupported,
    resolve_eviction,
)
from bubblescope.megakernel_engine.interpreter import ScheduleInterpreter
from bubblescope.megakernel_engine.schedule import MegakernelParams
from bubblescope.models import load_llama2c
from bubblescope.models.config import ModelConfig, get_preset
from bubblescope.models.weights import dummy_weights
from bubblescope.reference_engine import ReferenceEngine

from .conftest import STORIES, compile_in_subprocess, needs_stories
from .test_megakernel_schedule import FORCED, PROMPT, TINY


def _oracle(w, grid, **kw):
    """The oracle over exactly the Gluon kernel's tiling (one BR-row tile per weight task, one kv head per
    attention task, the fused split reduction), lowered for ``grid`` CTAs."""
    params = gluon_params(w.config, MegakernelParams(**kw), dtype=w.dtype).replace(num_programs=grid)
    return ScheduleInterpreter(w, params=params, max_seq_len=48)


@pytest.mark.parametrize("name", list(TINY))
def test_gluon_schedule_matches_reference_on_tiny_configs(name):
    cfg = TINY[name]
    w = dummy_weights(cfg, seed=4)
    ref = teacher_forced_logits(ReferenceEngine(w, max_seq_len=48), PROMPT, FORCED)
    orc = _oracle(w, grid=5, attn_min_chunk=2, kv_splits=3)  # several splits: the ticket reduction path
    got = teacher_forced_logits(orc, PROMPT, FORCED)
    assert (got - ref).abs().max().item() < 1e-4
    t = orc.schedule.tiling
    assert t.hb == t.rows_qkv // 2 and t.attn_kv_heads == 1 and t.attn_fused


def test_gluon_schedule_interleaved_programs_equal_one_program():
    """All 5 CTAs' queues interleaved as resident CTAs could run them: same logits as the topological order."""
    w = dummy_weights(TINY["gqa-tied-llama3"], seed=5)
    one, many = _oracle(w, grid=1), _oracle(w, grid=5)
    for tok in (3, 8, 1):
        one.step(tok)
        many.run_programs(tok)
    assert torch.equal(one.buffers["logits"], many.buffers["logits"])


@needs_stories
def test_gluon_schedule_stories260k_greedy_matches_reference():
    w = load_llama2c(STORIES)
    prompt = [1, 403, 407, 261]
    ref = ReferenceEngine(w, max_seq_len=64)
    orc = _oracle(w, grid=132)
    a, b = [], []
    for eng, out in ((ref, a), (orc, b)):
        logits = eng.prefill(torch.tensor(prompt))
        for _ in range(24):
            tok = int(torch.as_tensor(logits).float().argmax())
            out.append(tok)
            logits = eng.decode(tok)
    assert a == b


def test_gluon_tiling_for_llama_1b_on_an_h200():
    cfg = get_preset("llama-3.2-1b")
    t = gluon_tiling(cfg, MegakernelParams(), 132)
    cx = gluon_constexprs(cfg, t, gluon_params(cfg, MegakernelParams()), 2048, torch.bfloat16, has_bias=False)
    assert t.rows_qkv == t.rows_lm == t.rows_gateup == DEFAULT_ROWS and t.hb == DEFAULT_ROWS // 2
    assert t.rows_o == t.rows_down == DEFAULT_ROWS // 2  # split_k = 2: half the rows over two column boxes
    assert cx["BK"] == 256 and cx["NCH_H"] == 8 and cx["NCH_I"] == 32  # 512-byte box rows, K / BK chunks
    ring = cx["NS"] * cx["BR"] * cx["BK"] * 2
    assert ring + cx["KCH"] * cx["BK"] * 2 <= SMEM_PER_BLOCK_SM90
    big = get_preset("llama-3.1-8b")  # its 14336-wide staged vector leaves room for fewer slots
    cx8 = gluon_constexprs(big, gluon_tiling(big, MegakernelParams(), 132), gluon_params(big, MegakernelParams()),
                           2048, torch.bfloat16, has_bias=False)
    assert cx8["NS"] * 32 * 256 * 2 + cx8["KCH"] * 256 * 2 <= SMEM_PER_BLOCK_SM90 - 8192 < (cx8["NS"] + 1) * 16384 \
        + cx8["KCH"] * 512


def test_gluon_rows_follow_the_qkv_stage_width():
    """16-row tiles where the QKV stage at 32 rows leaves over half the SMs idle: Qwen2.5-0.5B has 14·64 + 2·2·64 =
    1152 QKV rows = 36 tasks of 32 (< 66 of 132 SMs); Qwen3-0.6B 16·128 + 2·8·128 = 4096 rows = 128 tasks,
    Llama-3.2-1B 2048 + 2·512 = 3072 rows = 96 tasks keep 32. An explicit max_rows still wins."""
    from bubblescope.megakernel_engine.gluon.host import auto_rows
    qwen25, qwen3, llama = get_preset("qwen2.5-0.5b"), get_preset("qwen3-0.6b"), get_preset("llama-3.2-1b")
    assert (auto_rows(qwen25, 132), auto_rows(qwen3, 132), auto_rows(llama, 132)) == (16, 32, 32)
    assert auto_rows(qwen25, 64) == 32  # 36 tasks fill over half of a 64-SM GPU
    t = gluon_tiling(qwen25, MegakernelParams(mv_widen="bits"), 132)  # on the CUDA cores
    assert (t.rows_qkv, t.rows_gateup, t.rows_lm, t.rows_o, t.rows_down) == (16, 16, 16, 8, 8)
    assert gluon_tiling(qwen25, MegakernelParams(mv_widen="bits", max_rows=32), 132).rows_qkv == 32
    # the automatic tensor-core matvec of a thin model (auto_matvec) needs 16 rows per half: 32
    t = gluon_tiling(qwen25, MegakernelParams(), 132)
    assert (t.rows_qkv, t.rows_gateup, t.rows_lm, t.rows_o, t.rows_down) == (32, 32, 32, 16, 16)


def test_gluon_matvec_follows_the_model():
    """auto_matvec: thin models (16-row tiles by auto_rows) under the tensor-core attention get the tensor-core
    matvec with two boxes per slot; the
    32-row presets, fp32 weights (mma needs 16-bit) and a thin model on a GPU it fills keep the CUDA cores with one
    box; ``mma`` by name takes two boxes unless one is asked for."""
    from bubblescope.megakernel_engine.gluon.host import auto_matvec
    qwen25, llama, qwen3 = get_preset("qwen2.5-0.5b"), get_preset("llama-3.2-1b"), get_preset("qwen3-0.6b")
    auto = MegakernelParams()
    assert auto_matvec(qwen25, auto, 132, 2) == ("mma", 2)
    assert auto_matvec(qwen25, auto, 132, 4) == ("bits", 1)  # fp32 weights (MV_BITS then widens nothing)
    assert auto_matvec(qwen25, auto, 64, 2) == ("bits", 1)  # 36 QKV tasks of 32 rows fill half of 64 SMs
    assert auto_matvec(llama, auto, 132, 2) == ("bits", 1) and auto_matvec(qwen3, auto, 132, 2) == ("bits", 1)
    assert auto_matvec(llama, MegakernelParams(mv_widen="mma"), 132, 2) == ("mma", 2)
    assert auto_matvec(llama, MegakernelParams(mv_widen="mma", slot_boxes=1), 132, 2) == ("mma", 1)
    assert auto_matvec(qwen25, MegakernelParams(slot_boxes=1), 132, 2) == ("mma", 1)
    # 8 consumer warps: a slot of two boxes holds 8 64-column boxes, one per warp, so mma still runs
    assert auto_matvec(qwen25, MegakernelParams(num_warps=8), 132, 2) == ("mma", 2)
    assert auto_matvec(qwen25, MegakernelParams(num_warps=16), 132, 2) == ("bits", 1)
    assert auto_matvec(qwen25, auto, 132, 2, "warps") == ("bits", 1)  # measured with the tensor-core attention
    # the user's rows and boxes are what the rule checks: 16-row tiles give 8 rows per half, too few for an mma tile;
    # one box per slot gives 4 64-column boxes, too few for 8 warps
    assert auto_matvec(qwen25, MegakernelParams(max_rows=16), 132, 2) == ("bits", 1)
    assert auto_matvec(qwen25, MegakernelParams(max_rows=16, split_k=1), 132, 2) == ("bits", 1)
    assert auto_matvec(qwen25, MegakernelParams(slot_boxes=1, num_warps=8), 132, 2) == ("bits", 1)
    t16 = gluon_tiling(qwen25, MegakernelParams(max_rows=16), 132)  # 16 rows on the CUDA cores
    assert (t16.rows_qkv, t16.rows_o) == (16, 8)
    p16 = gluon_params(qwen25, MegakernelParams(max_rows=16))
    assert gluon_constexprs(qwen25, t16, p16, 512, torch.bfloat16, True)["MV_BITS"]
    assert gluon_params(qwen25, MegakernelParams(attn_layout="warps")).mv_widen == "bits"
    p = gluon_params(qwen25, auto)
    assert (p.mv_widen, p.slot_boxes, p.rows_qkv) == ("mma", 2, 32)
    assert gluon_params(qwen25, p) == p  # resolving twice changes nothing (gluon_tiling resolves again)


def test_gluon_inflight_is_a_cap_below_the_ring():
    """``inflight`` reaches the kernel as INFLIGHT where it is below the ring's slots (the 1B: 12 slots of one 16 KB
    box); at or above them, or 0, it caps nothing and is recorded as 0. The default (None) is 64 KB per SM: 4 slots
    of one 16 KB box, 2 of two."""
    from bubblescope.megakernel_engine.gluon.host import gluon_choice
    cfg = get_preset("llama-3.2-1b")

    def cx(**kw):
        p = gluon_params(cfg, MegakernelParams(**kw))
        t = gluon_tiling(cfg, p, 132)
        c = gluon_constexprs(cfg, t, p, 512, torch.bfloat16, False)
        return c["NS"], c["INFLIGHT"], gluon_choice(t, c)["inflight"]
    assert cx() == (12, 4, 4) and cx(slot_boxes=2) == (6, 2, 2) and cx(inflight=0) == (12, 0, 0)
    assert cx(max_rows=64, slot_boxes=2) == (3, 2, 2)  # 64 KB slots: 64 KB // 64 KB is 1, at least 2
    assert cx(inflight=4) == (12, 4, 4) and cx(inflight=11) == (12, 11, 11)
    assert cx(inflight=12) == (12, 0, 0) and cx(inflight=40) == (12, 0, 0)
    assert cx(inflight=4, slot_boxes=2) == (6, 4, 4) and cx(inflight=6, slot_boxes=2) == (6, 0, 0)


def test_gluon_switches_are_checked():
    """The prepared switches refuse what they do not support: bad values (params.validate) and the warp-local
    attention on a q/k-norm model (gluon_params), each naming the field."""
    from bubblescope.errors import BubblescopeError
    for kw, msg in (({"attn_layout": "rows"}, "attn_layout must be auto, blocks, warps or mma"),
                    ({"lm_pick": "warp"}, "lm_pick must be task or cta"),
                    ({"sig_gate": -2}, "sig_gate must be an integer >= -1"),
                    ({"sig_gate": True}, "sig_gate must be an integer >= -1"),
                    ({"mv_widen": "fast"}, "mv_widen must be auto, convert, bits or mma"),
                    ({"attn_operands": "soon"}, "attn_operands must be early or late"),
                    ({"mv_ahead": 2}, "mv_ahead must be 0 or 1"),
                    ({"mv_ahead": True}, "mv_ahead must be 0 or 1"),
                    ({"slot_boxes": 4}, "slot_boxes must be 1 or 2"),
                    ({"attn_new_row": "rows"}, "attn_new_row must be auto, block or row"),
                    ({"attn_combine": "shfl"}, "attn_combine must be auto, warps or lanes"),
                    ({"attn_gate": -3}, "attn_gate must be an integer >= -1"),
                    ({"block_s": 48}, "block_s must be a power of two"),
                    ({"inflight": -1}, "inflight must be None or an integer >= 0"),
                    ({"norm_load": "early"}, "norm_load must be after, beside or prefetch"),
                    ({"inflight": True}, "inflight must be None or an integer >= 0")):
        with pytest.raises(BubblescopeError, match=msg):
            MegakernelParams(**kw).validate()
    MegakernelParams(block_s=None, attn_gate=None).validate()  # None: the kernel chooses
    with pytest.raises(BubblescopeError, match="attn_layout=warps does not support q/k-norm"):
        gluon_params(get_preset("qwen3-0.6b"), MegakernelParams(attn_layout="warps"))
    assert gluon_params(get_preset("qwen3-0.6b"), MegakernelParams(attn_layout="mma")).attn_layout == "mma"
    cfg = get_preset("llama-3.2-1b")  # mma.sync takes 16-bit operands: fp32 weights are refused by name
    p = gluon_params(cfg, MegakernelParams(attn_layout="mma"))
    with pytest.raises(BubblescopeError, match="attn_layout=mma needs 16-bit weights"):
        gluon_constexprs(cfg, gluon_tiling(cfg, p, 132), p, 512, torch.float32, False)
    assert gluon_constexprs(cfg, gluon_tiling(cfg, p, 132), p, 512, torch.bfloat16, False)["ATTN_MMA"]
    # auto: evict_first only under the Triton whose TMA-load PTX gluon/ptx.py rewrites; explicit choices stand
    assert [resolve_eviction("auto", v) for v in ("3.6.0", "3.6.1+git1234", "3.7.0", "4.0.0")] == [
        "evict_first", "evict_first", "", ""]
    assert [resolve_eviction(c, "3.6.0") for c in ("", "evict_first")] == ["", "evict_first"]
    assert gluon_params(cfg, MegakernelParams(weight_eviction="")).weight_eviction == ""
    pe = gluon_params(cfg, MegakernelParams(weight_eviction="evict_last"))  # the Triton kernel's policy, by name
    with pytest.raises(BubblescopeError, match="weight_eviction=evict_last is the Triton kernel's"):
        gluon_constexprs(cfg, gluon_tiling(cfg, pe, 132), pe, 512, torch.bfloat16, False)
    wide = ModelConfig(hidden_size=2048, intermediate_size=4096, num_hidden_layers=2, num_attention_heads=32,
                       num_key_value_heads=1, head_dim=64, vocab_size=1000)  # 32 query heads per kv head
    pw = gluon_params(wide, MegakernelParams(attn_layout="mma"))
    with pytest.raises(BubblescopeError, match="at most 16 query heads per kv head"):
        gluon_constexprs(wide, gluon_tiling(wide, pw, 132), pw, 512, torch.bfloat16, False)
    assert gluon_params(get_preset("llama-3.2-1b"), MegakernelParams(attn_layout="warps")).attn_layout == "warps"
    # auto: the tensor cores for 16-bit weights; for fp32, warp-local where there is no q/k-norm and at most 4 query
    # heads per kv head (groups: 4, 7, 2 and 4), else blocks; the 32-head group above falls back too
    models = ("llama-3.2-1b", "qwen2.5-0.5b", "qwen3-0.6b", "llama-3.1-8b")
    assert [gluon_params(get_preset(m), MegakernelParams()).attn_layout for m in models] == ["mma"] * 4
    assert [gluon_params(get_preset(m), MegakernelParams(), dtype=torch.float32).attn_layout
            for m in models] == ["warps", "blocks", "blocks", "warps"]
    assert gluon_params(wide, MegakernelParams()).attn_layout == "blocks"
    assert gluon_params(get_preset("qwen2.5-0.5b"), MegakernelParams(attn_layout="warps")).attn_layout == "warps"


def test_gluon_support_rules_name_the_reason():
    llama = get_preset("llama-3.2-1b")
    assert gluon_unsupported(llama, torch.bfloat16, (9, 0)) is None
    assert "Hopper" in gluon_unsupported(llama, torch.bfloat16, (8, 0))
    assert "CUDA GPU" in gluon_unsupported(llama, torch.bfloat16, None)
    assert gluon_unsupported(get_preset("qwen3-0.6b"), torch.bfloat16, (9, 0)) is None  # q/k-norm in ATTN
    odd = TINY["mha-untied"].__class__(**{**vars(TINY["mha-untied"]), "intermediate_size": 42})
    assert "16-byte" in gluon_unsupported(odd, torch.bfloat16, (9, 0))  # 42 × 2 bytes per row


def test_cpu_engine_falls_back_to_triton_and_says_why():
    from bubblescope.megakernel_engine.engine import choose_impl
    w = dummy_weights(TINY["gqa-tied-llama3"], seed=0)
    impl, why = choose_impl(w, "auto")
    assert impl == "triton" and "CUDA GPU" in why
    from bubblescope.errors import EngineUnavailable
    with pytest.raises(EngineUnavailable, match="CUDA GPU"):
        choose_impl(w, "gluon")


def test_gluon_kernel_takes_the_engine_arguments_as_its_tuples():
    """``pack_args`` turns the arguments the engine and the launcher bind by name into exactly the kernel's runtime
    arguments: each tuple of ``ARG_TUPLES`` in its order (FP8 row scales not given: None), the five descriptors and
    the scalars by name, and the integers that change between launches top-level and unspecialised (Triton's
    ``do_not_specialize`` does not reach into a tuple)."""
    pytest.importorskip("triton.experimental.gluon")
    from bubblescope.megakernel_engine.gluon import kernel
    from bubblescope.megakernel_engine.gluon.host import ARG_TUPLES, pack_args
    fn = kernel.megakernel
    named = ("wqkv_desc", "wo_desc", "wgu_desc", "wdown_desc", "head_desc", "max_tasks", "spin_cap", "advance",
             "tok_in", "eps", "sm_scale")
    flat = {n: n for n in named} | {n: n for k, names in ARG_TUPLES.items() if k != "scales" for n in names}
    packed = pack_args(flat)
    assert sorted(packed) == sorted(p.name for p in fn.params if not p.is_constexpr)
    assert {k: packed[k] for k in ARG_TUPLES} == {k: v if k != "scales" else (None,) * 5 for k, v in ARG_TUPLES.items()}
    assert all(packed[n] == n for n in named)
    assert sorted(p.name for p in fn.params if p.do_not_specialize) == ["advance", "max_tasks", "spin_cap", "tok_in"]
    fp8 = pack_args(flat | {"sqkv_ptr": 1, "so_ptr": 2, "sgu_ptr": 3, "sdown_ptr": 4, "slm_ptr": None})
    assert fp8["scales"] == (1, 2, 3, 4, None)


_COMPILE = """
import json, torch
from bubblescope.megakernel_engine.gluon.host import compile_offline
from bubblescope.megakernel_engine.schedule import MegakernelParams
from bubblescope.models.config import get_preset
out = []
for model, dtype, params in (
        ("llama-3.2-1b", torch.bfloat16, MegakernelParams()),
        ("llama-3.2-1b", torch.bfloat16, MegakernelParams(prefetch="off", timeline=True)),
        ("llama-3.2-1b", torch.bfloat16, MegakernelParams(lm_pick="task", attn_layout="blocks", sig_gate=-1)),
        ("llama-3.2-1b", torch.bfloat16, MegakernelParams(mv_widen="convert", attn_gate=2)),
        ("llama-3.2-1b", torch.bfloat16, MegakernelParams(attn_layout="warps", timeline=True)),
        ("llama-3.2-1b", torch.bfloat16, MegakernelParams(attn_operands="early", timeline=True)),
        ("qwen2.5-0.5b", torch.bfloat16, MegakernelParams(attn_layout="blocks")),
        ("qwen3-0.6b", torch.bfloat16, MegakernelParams(attn_layout="blocks")),
        ("qwen3-0.6b", torch.bfloat16, MegakernelParams(sig_gate=-1, attn_gate=0)),
        ("qwen2.5-0.5b", torch.bfloat16, MegakernelParams()),
        ("qwen3-0.6b", torch.bfloat16, MegakernelParams()),
        ("qwen3-0.6b", torch.bfloat16, MegakernelParams(prefetch="off", timeline=True)),
        ("qwen3-0.6b", torch.bfloat16, MegakernelParams(attn_operands="early")),
        ("llama-3.1-8b", torch.bfloat16, MegakernelParams()),
        ("llama-3.2-1b", torch.bfloat16, MegakernelParams(mv_ahead=0, timeline=True)),
        ("llama-3.2-1b", torch.bfloat16, MegakernelParams(slot_boxes=2, prefetch="off", timeline=True)),
        ("qwen2.5-0.5b", torch.bfloat16, MegakernelParams(slot_boxes=2, mv_ahead=1)),
        ("stories260k", torch.float32, MegakernelParams(mv_ahead=1, slot_boxes=2)),
        ("llama-3.2-1b", torch.bfloat16, MegakernelParams(attn_new_row="block", attn_combine="warps", timeline=True)),
        ("qwen3-0.6b", torch.bfloat16, MegakernelParams(attn_new_row="row", attn_combine="lanes")),
        ("qwen2.5-0.5b", torch.bfloat16, MegakernelParams(attn_new_row="row", attn_combine="lanes",
                                                          attn_layout="warps")),
        ("llama-3.2-1b", torch.bfloat16, MegakernelParams(inflight=0)),
        ("llama-3.2-1b", torch.bfloat16, MegakernelParams(norm_load="after", timeline=True)),
        ("llama-3.1-8b", torch.bfloat16, MegakernelParams(norm_load="beside")),
        ("stories260k", torch.float32, MegakernelParams())):
    info = compile_offline(get_preset(model), dtype, params)
    out.append({k: info[k] for k in ("registers", "spill_store_bytes", "shared_bytes", "num_warps")})
print(json.dumps(out))
"""


def _assert_fits_one_sm(info: dict) -> None:
    """No spills, and registers × warps and shared memory within one H200 SM (65536 registers, 227 KB of shared
    memory per block), so one CTA per SM is resident."""
    assert info["spill_store_bytes"] == 0, info
    assert info["registers"] * info["num_warps"] * 32 <= 65536, info
    assert info["shared_bytes"] <= SMEM_PER_BLOCK_SM90, info


@pytest.mark.slow
def test_gluon_kernel_and_variants_compile_for_sm90_within_one_sm():
    """The Gluon kernel (default: the tensor-core attention; noprefetch + timeline; the non-default switches: a
    greedy-pick atomic per LM-head task, block attention, no signal gate; Triton's bf16 widening with the attention
    gate; the attention gate alone on Qwen3; the tensor-core attention's early operands, with the timeline and with
    q/k-norm; the CUDA-core attention layouts: warp-local with the timeline, blocks
    with 7 query heads per kv head and with q/k-norm); Qwen2 biases with 7 query heads per kv head, Qwen3 q/k-norm
    in the attention task with head_dim 128 (default and noprefetch + timeline), head_dim 128 with a 14336-wide
    staged vector, fp32; the matvec without its box read ahead (mv_ahead=0) with the timeline, and in fp32 with two
    boxes per ring slot; two boxes per slot with noprefetch + timeline, and on Qwen2.5 (a zero-filled box); the
    first block's older rows before the wait with the split combine in one warp's lanes: on the 1B with the timeline,
    with q/k-norm (Qwen3) and in the warp-local layout with 7 query heads per kv head (Qwen2.5))
    through Triton and ptxas for sm_90a,
    in a subprocess (Triton's mode is per process): no spills, and registers × warps and shared memory within
    one H200 SM (65536 registers, 227 KB of shared memory per block), so one CTA per SM is resident."""
    for info in compile_in_subprocess(_COMPILE):
        _assert_fits_one_sm(info)


@pytest.mark.slow
def test_gluon_tma_loads_with_an_l2_evict_first_policy_compile_for_sm90():
    """``weight_eviction="evict_first"`` (``gluon/ptx.py``): ptxas assembles the rewritten PTX for sm_90 (its machine code is
    measured), every TMA load of the kernel carries the policy (none does with ``weight_eviction=""``), the
    registers, spills and shared memory are those of the kernel without it, and ``auto`` builds the kernel its
    resolution names."""
    out = compile_in_subprocess(
        "import json, torch\n"
        "from bubblescope.models.config import get_preset\n"
        "from bubblescope.megakernel_engine.gluon.host import compile_offline\n"
        "from bubblescope.megakernel_engine.schedule import MegakernelParams\n"
        "out = []\n"
        "for m, t in (('llama-3.2-1b', ''), ('llama-3.2-1b', 'evict_first'), ('qwen2.5-0.5b', 'evict_first'),\n"
        "             ('llama-3.2-1b', 'auto')):\n"
        "    i = compile_offline(get_preset(m), torch.bfloat16, MegakernelParams(weight_eviction=t))\n"
        "    out.append({k: i[k] for k in ('registers', 'spill_store_bytes', 'shared_bytes', 'num_warps',\n"
        "                                  'tma_loads', 'tma_loads_l2_hinted', 'text_bytes')})\n"
        "print(json.dumps(out))\n")
    normal, hinted, qwen, default = out
    # auto: evict_first under Triton 3.6 (the version CI installs), no policy under another
    assert default == (hinted if resolve_eviction("auto") == "evict_first" else normal), out
    assert normal["tma_loads"] > 0 and normal["tma_loads_l2_hinted"] == 0, normal
    assert hinted["tma_loads"] == normal["tma_loads"] == hinted["tma_loads_l2_hinted"], out
    assert qwen["tma_loads"] == qwen["tma_loads_l2_hinted"] > 0, qwen  # the tensor-core matvec's 64-column boxes
    for k in ("registers", "spill_store_bytes", "shared_bytes", "num_warps"):
        assert hinted[k] == normal[k], (k, out)
    assert hinted["text_bytes"] > 0
    for info in out:
        _assert_fits_one_sm(info)


# ---- Qwen3: q/k-norm and RoPE in the attention task ------------------------------------------------------------
# head_dim != hidden / heads, untied heads, GQA; BR chosen so that a QKV tile holds part of a head (BR/2 < D/2).
QWEN3 = {
    "d64-br32": (ModelConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=64, vocab_size=97, rope_theta=1e6, rms_norm_eps=1e-6,
                             qk_norm=True, model_type="qwen3", tie_word_embeddings=False,
                             max_position_embeddings=64, name="qwen3-d64"), {}),
    "gqa4-d32-br4": (ModelConfig(hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=8,
                                 num_key_value_heads=2, head_dim=32, vocab_size=131, rope_theta=1e6,
                                 rms_norm_eps=1e-6, qk_norm=True, model_type="qwen3", tie_word_embeddings=False,
                                 max_position_embeddings=64, name="qwen3-gqa4"), {"max_rows": 4}),
}


def _qwen3(name, seed=6):
    cfg, kw = QWEN3[name]
    return dummy_weights(cfg, seed=seed), kw


def _hf_logits(w, prompt, forced):
    """transformers' own model (Qwen3ForCausalLM here) on the same weights, fp32: (T, V) logits from the last
    prompt position on."""
    transformers = pytest.importorskip("transformers")
    d = w.config.to_hf_dict()
    arch = d.pop("architectures")
    hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**d)).eval()
    assert type(hf).__name__ == arch[0]
    missing, unexpected = hf.load_state_dict(w.hf_state_dict(), strict=False)
    assert not unexpected and all("lm_head" in m for m in missing)
    with torch.no_grad():
        return hf(torch.tensor([prompt + forced])).logits[0, len(prompt) - 1:]


@pytest.mark.parametrize("name", list(QWEN3))
def test_gluon_qwen3_qknorm_in_attention_matches_reference_and_transformers(name):
    w, kw = _qwen3(name)
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(3, w.config.vocab_size, (5,), generator=g).tolist()
    forced = torch.randint(3, w.config.vocab_size, (30,), generator=g).tolist()
    orc = _oracle(w, grid=5, attn_min_chunk=2, kv_splits=3, **kw)  # the new position moves through the splits
    t = orc.schedule.tiling
    assert t.qk_norm_attn and t.rows_qkv % w.config.head_dim != 0  # QKV tiles hold part of a head
    got = teacher_forced_logits(orc, prompt, forced)
    ref = teacher_forced_logits(ReferenceEngine(w, max_seq_len=48), prompt, forced)
    hf = _hf_logits(w, prompt, forced)
    assert (got - ref).abs().max().item() < 1e-4
    assert (got - hf).abs().max().item() < 1e-4


def test_gluon_qwen3_no_task_reads_the_new_k_before_it_is_written():
    """With the K cache poisoned (NaN) at every position from the current one on, before each step, the logits
    stay those of the reference: only the split holding the new position writes cache[pos], and before anyone
    reads it; QKV tasks leave it alone (raw k goes to k_new)."""
    w, kw = _qwen3("gqa4-d32-br4", seed=8)
    orc = _oracle(w, grid=7, attn_min_chunk=2, kv_splits=4, **kw)
    ref = ReferenceEngine(w, max_seq_len=48)
    tokens = [3, 17, 5, 99, 42, 7, 8, 64, 11, 2]
    ref_logits = ref.prefill(torch.tensor(tokens[:1])).float()
    for n, tok in enumerate(tokens):
        orc.buffers["k_cache"][:, :, n:] = float("nan")
        if n == 4:  # mid-way: after the QKV stage of layer 0 the new position of the cache is still untouched
            mid = orc.step(tok, stop_after=(0, "QKV"))
            assert mid["k_cache"][0, :, n].isnan().all() and not mid["k_new"].isnan().any()
            orc.buffers["k_cache"][:, :, n:] = float("nan")
        orc.run_programs(tok)
        if n:
            ref_logits = ref.decode(tok).float()
        assert (orc.buffers["logits"] - ref_logits).abs().max().item() < 1e-4
    assert not orc.buffers["k_cache"][:, :, :len(tokens)].isnan().any()


def test_gluon_tile_choice_per_model_is_recorded():
    """The Gluon tiling of each model (compile_info()["gluon"] and the offline compile's report): Qwen3-0.6B
    (head_dim 128, 2 query heads per kv head) gets 32-position attention blocks and q/k-norm in the attention
    task, Llama-3.2-1B (head_dim 64) 64-position blocks and RoPE in the QKV epilogue."""
    from bubblescope.megakernel_engine.gluon.host import gluon_choice
    out = {}
    for name in ("qwen3-0.6b", "llama-3.2-1b", "qwen2.5-0.5b"):
        cfg = get_preset(name)
        params = gluon_params(cfg, MegakernelParams())
        t = gluon_tiling(cfg, MegakernelParams(), 132)
        out[name] = gluon_choice(t, gluon_constexprs(cfg, t, params, 2048, torch.bfloat16, cfg.attention_bias))
    assert out["qwen3-0.6b"] == {"BR": 32, "BK": 256, "ring": 12, "slot_boxes": 1, "split_k": 2, "rows_od": 16,
                                 "block_s": 32,
                                 "min_chunk": 32, "splits": 16, "qk_norm_in_attn": True, "attn_layout": "mma",
                                 "lm_pick": "cta", "sig_gate": 3, "attn_gate": 0, "mv_widen": "bits",
                                 "attn_operands": "late", "mv_ahead": 1, "attn_new_row": "block",
                                 "attn_combine": "warps", "inflight": 4, "norm_load": "prefetch",
                                 "weight_eviction": resolve_eviction("auto")}
    assert out["llama-3.2-1b"]["block_s"] == 64 and not out["llama-3.2-1b"]["qk_norm_in_attn"]
    # auto: the first block's older rows before the wait and the combine in lanes, except with q/k-norm (above)
    for name in ("llama-3.2-1b", "qwen2.5-0.5b"):
        assert (out[name]["attn_new_row"], out[name]["attn_combine"]) == ("row", "lanes"), out[name]
    # the gate at 0 on every model, with q/k-norm or without (h200-2026-12-02-s18/gluon_check_r50_*.json)
    assert out["llama-3.2-1b"]["attn_gate"] == 0 and out["qwen2.5-0.5b"]["attn_gate"] == 0
    assert out["llama-3.2-1b"]["attn_layout"] == "mma" and out["qwen2.5-0.5b"]["attn_layout"] == "mma"
    # 7 query heads per kv head: padded to 16 rows on the tensor cores, so the block follows head_dim only
    assert out["qwen2.5-0.5b"]["block_s"] == 64 and out["qwen2.5-0.5b"]["min_chunk"] == 32
    assert out["llama-3.2-1b"]["min_chunk"] == 32
    assert gluon_params(get_preset("qwen2.5-0.5b"), MegakernelParams(), dtype=torch.float32).block_s == 32  # blocks
    kept = gluon_params(get_preset("qwen2.5-0.5b"), MegakernelParams(block_s=32, attn_min_chunk=32))
    assert (kept.block_s, kept.attn_min_chunk) == (32, 32)  # explicit values are kept
    # an explicit block_s is kept, also the value that was once the field's default (32 was read as "auto")
    assert gluon_params(get_preset("llama-3.2-1b"), MegakernelParams(block_s=32)).block_s == 32
    assert gluon_params(get_preset("llama-3.2-1b"), MegakernelParams()).block_s == 64
    # a thin QKV stage: 32 rows with the tensor-core matvec and two boxes per slot (auto_matvec)
    assert {k: out["qwen2.5-0.5b"][k] for k in ("BR", "rows_od", "mv_widen", "slot_boxes", "ring")} == {
        "BR": 32, "rows_od": 16, "mv_widen": "mma", "slot_boxes": 2, "ring": 6}
    json.dumps(out)  # results.json carries it as is


def test_auto_picks_gluon_for_qwen3_on_hopper(monkeypatch):
    """On an sm_90 device (its capability stubbed: no GPU here) ``auto`` chooses the Gluon kernel for Qwen3-0.6B and
    Qwen2.5-0.5B, and still the Triton one on sm_80."""
    from types import SimpleNamespace

    from bubblescope.megakernel_engine.engine import choose_impl
    cap = {"v": (9, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap["v"])
    for name in ("qwen3-0.6b", "qwen2.5-0.5b"):
        w = SimpleNamespace(config=get_preset(name), dtype=torch.bfloat16, device=torch.device("cuda"),
                            weight_format="bf16")
        assert choose_impl(w, "auto")[0] == "gluon"
    cap["v"] = (8, 0)
    assert choose_impl(w, "auto") == ("triton", "the Gluon megakernel targets Hopper (sm_90); this GPU is sm_80")


# ---- mv_widen=mma: the matvec on the tensor cores --------------------------------------------------------------
_MMA_COMPILE = r"""
import json, sys
sys.path.insert(0, "src")
import torch
from bubblescope.megakernel_engine.gluon.host import compile_offline
from bubblescope.megakernel_engine.schedule import MegakernelParams
from bubblescope.models.config import get_preset
out = []
for model, params in (("llama-3.2-1b", MegakernelParams(timeline=True)),
                      ("llama-3.2-1b", MegakernelParams(mv_widen="mma", slot_boxes=1, timeline=True)),
                      ("qwen3-0.6b", MegakernelParams(mv_widen="mma")),
                      ("qwen2.5-0.5b", MegakernelParams()),
                      ("llama-3.1-8b", MegakernelParams(mv_widen="mma", prefetch="off"))):
    info = compile_offline(get_preset(model), torch.bfloat16, params)
    out.append({k: info[k] for k in ("registers", "spill_store_bytes", "shared_bytes", "num_warps", "text_bytes")}
               | {"mv_widen": info["gluon"]["mv_widen"], "ring": info["gluon"]["ring"]})
print(json.dumps(out))
"""


def test_gluon_tensor_core_matvec_is_refused_where_it_cannot_run():
    """``mv_widen=mma`` names what it needs: 16-bit weights, 16 rows per matvec (16-row tiles asked for give 8 per
    half), and a 64-column box per consumer warp in each slot; a K that is not a multiple of 64 is fine
    (TMA zero-fills the columns past it); where it can run, the choice is recorded (``mv_ahead`` as 1: the
    tensor-core matvec always reads a slot ahead)."""
    from bubblescope.errors import BubblescopeError

    def constexprs(cfg, dtype=torch.bfloat16, **kw):
        p = gluon_params(cfg, MegakernelParams(mv_widen="mma", **kw), dtype=dtype)
        return gluon_constexprs(cfg, gluon_tiling(cfg, p, 132, dtype), p, 512, dtype, False)

    with pytest.raises(BubblescopeError, match="mv_widen=mma needs 16-bit or FP8 weights; got 32-bit"):
        constexprs(get_preset("llama-3.2-1b"), torch.float32, attn_layout="blocks")
    with pytest.raises(BubblescopeError, match=r"at least 16 rows per matvec .* got 8 \(BR 16, split_k 2\)"):
        constexprs(get_preset("qwen2.5-0.5b"), max_rows=16)
    odd = ModelConfig(hidden_size=512, intermediate_size=1400, num_hidden_layers=2, num_attention_heads=8,
                      num_key_value_heads=2, head_dim=64, vocab_size=1000)  # 1400 = 21.875 × 64: TMA zero-fills
    assert constexprs(odd, max_rows=32)["MV_MMA"]  # the last 64-column box past K, as the unswizzled ring's
    with pytest.raises(BubblescopeError, match="across the 8 consumer warps and a slot holds 4"):
        constexprs(get_preset("llama-3.2-1b"), num_warps=8, slot_boxes=1)
    cfg = get_preset("qwen2.5-0.5b")
    p = gluon_params(cfg, MegakernelParams(mv_widen="mma", max_rows=32))
    t = gluon_tiling(cfg, p, 132)
    cx = gluon_constexprs(cfg, t, p, 512, torch.bfloat16, False)
    assert cx["MV_MMA"] and not cx["MV_BITS"] and gluon_choice(t, cx)["mv_widen"] == "mma"
    p0 = p.replace(mv_ahead=0)
    assert gluon_choice(t, gluon_constexprs(cfg, t, p0, 512, torch.bfloat16, False))["mv_ahead"] == 1
    assert gluon_choice(t, gluon_constexprs(cfg, t, p.replace(mv_widen="bits"), 512, torch.bfloat16,
                                            False))["mv_widen"] == "bits"


@pytest.mark.slow
def test_gluon_tensor_core_matvec_compiles_for_sm90_within_one_sm():
    """``mv_widen=mma`` through Triton and ptxas for sm_90a (the 1B with the timeline and one box per slot, against
    the CUDA-core default's machine code; Qwen3-0.6B's q/k-norm, Qwen2.5's automatic choice, the 8B without
    prefetch, these three with two boxes per slot, auto under ``mma``), in a subprocess: no spills, registers ×
    warps and shared memory within one H200 SM, and the ring as deep in bytes as the default's (the swizzled ring
    takes the same bytes: 12 slots of one 16 KB box, or 6 of two; the 8B's larger staged vector leaves 11 or 5)."""
    base, *out = compile_in_subprocess(_MMA_COMPILE)
    # the tensor-core matvec reaches the kernel: the 1B's machine code shrinks (offline: 73 KB against 93 KB)
    assert base["mv_widen"] == "bits" and out[0]["text_bytes"] < 0.9 * base["text_bytes"], (base, out[0])
    for info in out:
        assert info["mv_widen"] == "mma", info
        _assert_fits_one_sm(info)
    assert [i["ring"] for i in out] == [12, 6, 6, 5], out
