"""Megakernel host side without Triton: scheduler invariants, weight packing, the PyTorch oracle of the
instruction table (against the reference engine), and timeline decoding."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from bubblescope.errors import BubblescopeError, KernelStuck
from bubblescope.generation import teacher_forced_logits
from bubblescope.megakernel_engine.interpreter import ScheduleInterpreter
from bubblescope.megakernel_engine.packing import (
    gateup_rows,
    pack_weights,
    qk_permutation,
)
from bubblescope.megakernel_engine.schedule import (
    F_GIDX,
    F_SIGINC,
    F_SIGNAL,
    F_TICKET,
    OP_ATTN,
    OP_GATEUP,
    OP_LMHEAD,
    OP_OPROJ,
    OP_QKV,
    MegakernelParams,
    build_schedule,
    lower,
    pick_rows,
)
from bubblescope.megakernel_engine.timeline import (
    chrome_events,
    decode_timeline,
    edge_summary,
    intrakernel_summary,
    stage_edges,
)
from bubblescope.models.config import ModelConfig, get_preset
from bubblescope.models.weights import dummy_weights
from bubblescope.reference_engine import ReferenceEngine

L3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 16}
TINY = {
    "gqa-tied-llama3": ModelConfig(hidden_size=32, intermediate_size=44, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=64, rope_scaling=L3, rope_theta=500000.0,
                                   tie_word_embeddings=True, max_position_embeddings=64, name="gqa"),
    "mha-untied": ModelConfig(hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=4, vocab_size=64, max_position_embeddings=64, name="mha"),
    "qwen2-bias": ModelConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, vocab_size=64, attention_bias=True, model_type="qwen2",
                              rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=64, name="qwen2"),
    "qwen3-qknorm": ModelConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=16, vocab_size=64, qk_norm=True, model_type="qwen3",
                                rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=64, name="qwen3"),
}
# Several tiles per stage, several K chunks, 3 attention splits (some empty early on), partial last tiles.
SMALL = MegakernelParams(rows_qkv=8, rows_o=8, rows_gateup=12, rows_down=8, rows_lm=24, kv_splits=3, attn_kv_heads=1,
                         block_k=16, block_s=2, num_programs=5)
PROMPT, FORCED = [1, 5, 9], [3, 7, 11, 13]


def _params(cfg):
    return SMALL.replace(rows_qkv=2 * cfg.head_dim) if cfg.qk_norm else SMALL


# ---- scheduler -------------------------------------------------------------------------------------------
def test_pick_rows_balances_over_the_grid():
    # 3072 QKV rows on 528 programs: 6 rows gives one tile per program, 4 or 8 would give two on some.
    assert pick_rows(3072, 528, 8, multiple=2) == 6
    # One program: fewest tasks wins (the per-task overhead).
    assert pick_rows(172, 1, 512) == 172
    assert pick_rows(100, 4, 8, multiple=4) % 4 == 0


@pytest.mark.parametrize("attn_reduce", ["fused", "stage"])
def test_llama_1b_schedule_invariants(attn_reduce):
    cfg = get_preset("llama-3.2-1b")
    sch = build_schedule(cfg, MegakernelParams(attn_reduce=attn_reduce, lm_blocks=4, gateup_blocks=2), 528)
    tasks = sch.tasks
    assert [t.gidx for t in tasks] == list(range(len(tasks)))
    # Every waited-on counter is complete before the waiter in the global order (topological), and the
    # need equals the increments per step (whole-stage dependencies). A fused-reduction ATTN task takes a
    # ticket; its group signals once, when the group's last ticket is taken.
    signalled = [0] * sch.num_counters
    splits = sch.tiling.kv_splits
    tickets = [0] * sch.num_counters
    for t in tasks:
        if t.wait >= 0:
            assert signalled[t.wait] == t.need == sch.increments[t.wait]
        if t.ticket >= 0:
            tickets[t.ticket] += 1
            if tickets[t.ticket] == splits:  # (with every split in use)
                signalled[t.signal] += 1
        elif t.signal >= 0:
            signalled[t.signal] += 1
    assert signalled == sch.increments
    assert (sch.tasks_per_opcode().get("ATTN_REDUCE", 0) == 0) == (attn_reduce == "fused")
    assert sch.tiling.kv_splits == 64  # auto: 528 programs // 8 kv heads, capped at KV_SPLITS_CAP
    # Each program's queue is increasing in global order; all tasks appear exactly once.
    table, counts = sch.table, sch.counts
    gidx = [table[p, :counts[p], F_GIDX].tolist() for p in range(sch.num_programs)]
    assert all(q == sorted(q) for q in gidx)
    assert sorted(g for q in gidx for g in q) == list(range(len(tasks)))
    # Tiles cover each matrix exactly once.
    for op, total in ((OP_QKV, (cfg.q_size + 2 * cfg.kv_size) // 2), (OP_GATEUP, cfg.intermediate_size),
                      (OP_LMHEAD, cfg.vocab_size)):
        # several register tiles per GATEUP / LMHEAD task: 8192 / (4 pairs · 2) and 128256 / (8 rows · 4)
        n = sum(t.op == op and t.layer == cfg.num_hidden_layers - 1 for t in tasks)
        assert n == {OP_QKV: 512, OP_GATEUP: 1024, OP_LMHEAD: 4008}[op]
        cover = np.zeros(total, dtype=int)
        for t in tasks:
            if t.op == op and t.layer == cfg.num_hidden_layers - 1:
                cover[t.a1:t.a1 + t.a2] += 1
        assert (cover == 1).all(), op
    n_attn = sum(t.op == OP_ATTN and t.layer == 0 for t in tasks)
    assert n_attn == cfg.num_key_value_heads * sch.tiling.kv_splits
    # QKV tiles balance over the grid (the docs/design.md probe's 768 tiles on 528 programs did not).
    assert sch.tasks_per_opcode()["QKV"] == 512 * cfg.num_hidden_layers


@pytest.mark.parametrize("attn_reduce,per_layer", [("fused", 5), ("stage", 6)])
def test_stage_schedules_drop_counters_and_keep_tasks(attn_reduce, per_layer):
    sch = build_schedule(TINY["gqa-tied-llama3"], SMALL.replace(attn_reduce=attn_reduce), 5)
    stages = sch.stage_schedules()
    assert len(stages) == per_layer * 2 + 1
    assert all(t.wait == -1 and t.signal == -1 for s in stages for t in s.tasks)
    assert sorted(t.gidx for s in stages for t in s.tasks) == list(range(len(sch.tasks)))


def test_params_validation():
    with pytest.raises(BubblescopeError, match="block_k"):
        MegakernelParams(block_k=100).validate()
    with pytest.raises(BubblescopeError, match="rows_qkv"):
        MegakernelParams(rows_qkv=7).validate()
    with pytest.raises(BubblescopeError, match="multiple of 16"):
        build_schedule(TINY["qwen3-qknorm"], MegakernelParams(rows_qkv=8), 1)
    for bad in ("later", "oproj"):  # oproj: the O-proj tasks combining the splits, no longer a form
        with pytest.raises(BubblescopeError, match="attn_reduce must be fused or stage"):
            MegakernelParams(attn_reduce=bad).validate()
    with pytest.raises(BubblescopeError, match="prefetch_next names unknown opcode.*FOO"):
        MegakernelParams(prefetch_next="OPROJ,foo").validate()
    with pytest.raises(BubblescopeError, match="weight_eviction"):
        MegakernelParams(weight_eviction="evict_never").validate()
    # the Triton kernel's weight loads: auto is no hint (even either way,
    # benchmarks/results/h200-2026-11-29-b/megakernel_check_d.json); a choice stands
    from bubblescope.megakernel_engine.schedule import resolve_tiling
    from bubblescope.megakernel_engine.triton_kernel.host import kernel_constexprs
    cfg = TINY["gqa-tied-llama3"]
    for choice, hint in (("auto", ""), ("", ""), ("evict_first", "evict_first"), ("evict_last", "evict_last")):
        p = MegakernelParams(weight_eviction=choice)
        cx = kernel_constexprs(cfg, resolve_tiling(cfg, p, 1), p, 64, False, False, 0)
        assert cx["W_EVICT"] == hint, (choice, cx["W_EVICT"])
    with pytest.raises(BubblescopeError, match="lm_blocks must be a positive integer"):
        MegakernelParams(lm_blocks=0).validate()
    assert build_schedule(TINY["gqa-tied-llama3"], MegakernelParams(prefetch_next="oproj, attn"), 1).tiling.pf_next_ops \
        == (OP_ATTN, OP_OPROJ)


# ---- packing -----------------------------------------------------------------------------------------------
def test_packing_makes_rope_pairs_contiguous():
    cfg = TINY["gqa-tied-llama3"]
    w = dummy_weights(cfg, seed=0)
    sch = build_schedule(cfg, SMALL, 1)
    t = sch.tiling
    packed = pack_weights(w, t, 16)
    d, half = cfg.head_dim, cfg.head_dim // 2
    stack = torch.cat([w.layers[1].q_proj, w.layers[1].k_proj, w.layers[1].v_proj])
    for j in range((cfg.q_size + 2 * cfg.kv_size) // 2):  # pair j: rows (i, i + D/2) of stacked head j // (D/2)
        lo = (j // t.hb) * 2 * t.hb + j % t.hb
        assert torch.equal(packed.wqkv[1, lo], stack[(j // half) * d + j % half])
        assert torch.equal(packed.wqkv[1, lo + t.hb], stack[(j // half) * d + half + j % half])
    # A task's rows are one block: pairs [a1, a1 + a2) live exactly in packed rows [2·a1, 2·(a1 + a2)).
    for task in (x for x in sch.tasks if x.op == OP_QKV and x.layer == 0):
        rows = {(j // t.hb) * 2 * t.hb + j % t.hb + k * t.hb for j in range(task.a1, task.a1 + task.a2) for k in (0, 1)}
        assert rows == set(range(2 * task.a1, 2 * (task.a1 + task.a2)))
    assert sorted(qk_permutation(64, 8, 2).tolist()) == list(range(64))
    g, u = gateup_rows(cfg.intermediate_size, t.gb)
    assert torch.equal(packed.wgu[0, g], w.layers[0].gate_proj) and torch.equal(packed.wgu[0, u], w.layers[0].up_proj)
    assert t.i_pad % t.gb == 0 and t.i_pad >= cfg.intermediate_size  # 44 pairs in blocks of 6: padded to 48
    pad = torch.ones(2 * t.i_pad, dtype=torch.bool)
    pad[g], pad[u] = False, False
    assert packed.wgu.shape[1] == 2 * t.i_pad and (packed.wgu[0, pad] == 0).all()


# ---- the oracle against the reference engine ---------------------------------------------------------------
@pytest.mark.parametrize("name", list(TINY))
def test_oracle_matches_reference(name):
    cfg = TINY[name]
    w = dummy_weights(cfg, seed=1)
    ref = teacher_forced_logits(ReferenceEngine(w, max_seq_len=32), PROMPT, FORCED)
    got = teacher_forced_logits(ScheduleInterpreter(w, params=_params(cfg), max_seq_len=32), PROMPT, FORCED)
    assert (got - ref).abs().max().item() < 1e-4


def test_oracle_bisects_by_layer_against_reference_hidden_states():
    cfg = TINY["gqa-tied-llama3"]
    w = dummy_weights(cfg, seed=2)
    ref = ReferenceEngine(w, max_seq_len=32)
    hidden = []
    hooks = [layer.register_forward_hook(lambda m, i, o: hidden.append(o[-1].clone())) for layer in ref.model.layers]
    ref.prefill(torch.tensor([4]))
    for h in hooks:
        h.remove()
    orc = ScheduleInterpreter(w, params=SMALL, max_seq_len=32)
    for layer in range(cfg.num_hidden_layers):
        orc.reset()
        bufs = orc.step(4, stop_after=(layer, "DOWN"))
        assert (bufs["x"] - hidden[layer]).abs().max().item() < 1e-5
        assert orc.position == 0  # a partial step does not advance


def test_oracle_runs_interleaved_programs_and_detects_deadlock():
    cfg = TINY["mha-untied"]
    w = dummy_weights(cfg, seed=3)
    one = ScheduleInterpreter(w, params=SMALL.replace(num_programs=1), max_seq_len=16)
    many = ScheduleInterpreter(w, params=SMALL.replace(num_programs=7), max_seq_len=16)
    for tok in (2, 9, 4):
        one.step(tok)
        many.run_programs(tok)
    assert torch.equal(one.buffers["logits"], many.buffers["logits"])
    # Put a consumer before its producer in one program's queue: every program ends up waiting.
    bad = ScheduleInterpreter(w, params=SMALL.replace(num_programs=1), max_seq_len=16)
    table = bad.schedule.table.clone()
    table[0, [0, 1]] = table[0, [1, 0]].clone()  # swap QKV tile 0 after tile 1: fine (same stage) ...
    first_attn = next(t.gidx for t in bad.schedule.tasks if t.op == OP_ATTN)
    table[0, [0, first_attn]] = table[0, [first_attn, 0]].clone()  # ... but ATTN first can never run
    bad.schedule.table = table
    with pytest.raises(KernelStuck, match="ATTN layer 0"):
        bad.run_programs(2)


def test_oracle_raises_kernel_stuck_on_unmeetable_dependency():
    cfg = TINY["gqa-tied-llama3"]
    orc = ScheduleInterpreter(dummy_weights(cfg), params=SMALL, max_seq_len=16)
    k = next(i for i, t in enumerate(orc.schedule.tasks) if t.op == OP_GATEUP and t.layer == 1)
    orc.schedule.tasks[k] = replace(orc.schedule.tasks[k], need=orc.schedule.tasks[k].need + 1)
    with pytest.raises(KernelStuck, match="GATEUP layer 1 tile 0"):
        orc.step(3)


# ---- timeline decoding (synthetic stamps) -------------------------------------------------------------------
def test_timeline_decode_summary_and_chrome_events():
    cfg = TINY["gqa-tied-llama3"]
    sch = build_schedule(cfg, SMALL, 3)
    p, t = sch.table.shape[:2]
    rng = np.random.default_rng(0)
    base = 10_000_000 + rng.integers(0, 1000, size=(p, t))
    stamps = np.stack([base, base + 500, base + 2500], axis=-1)  # wait 0.5 µs, busy 2 µs per task
    df = decode_timeline([sch], [torch.from_numpy(stamps)])
    assert len(df) == len(sch.tasks)
    assert df["ts_us"].min() == 0 and (df["ts_us"] <= df["ready_us"]).all() and (df["ready_us"] <= df["end_us"]).all()
    assert df.groupby("name").size().to_dict() == sch.tasks_per_opcode()
    s = intrakernel_summary(df)
    assert s["wait_ratio"] == pytest.approx(0.5 / 2.5)
    assert s["programs"] == 3 and s["tasks_per_step"] == len(sch.tasks)
    assert [b["opcode"] for b in s["by_opcode"]][:2] == ["QKV", "ATTN"]
    assert sum(b["tasks"] for b in s["by_opcode"]) == len(sch.tasks)
    ev = chrome_events(df, ts_offset_us=1000.0)
    json.dumps(ev)
    assert all(e["ph"] == "X" and e["dur"] >= 0 and e["ts"] >= 1000.0 and isinstance(e["tid"], int) for e in ev)
    assert {e["tid"] for e in ev} == {0, 1, 2} and ev[0]["cat"] not in ("kernel", "Kernel")


def _stamp_grid():
    """The hand-built Gluon timelines' schedule (TINY gqa-tied-llama3 on 2 programs), its opcode per slot (P, T)
    and the slots' start stamps (ns): 10 ms + 10 µs per slot, so no two tasks overlap."""
    sch = build_schedule(TINY["gqa-tied-llama3"], SMALL, 2)
    p, t = sch.table.shape[:2]
    return sch, sch.table[..., 0].numpy(), 10_000_000 + np.arange(p * t).reshape(p, t) * 10_000


def test_gluon_timeline_producer_stamps_become_load_columns_and_events():
    """5 stamps per task (Gluon): the producer issued each weighted task's first tile 3 µs before the consumer
    started it and its last 1 µs after; attention tasks (no weights) keep 0 stamps -> NaN, no load event."""
    sch, ops, base = _stamp_grid()
    weighted = ops != OP_ATTN
    load0 = np.where(weighted, base - 3000, 0)
    load1 = np.where(weighted, base + 1000, 0)
    stamps = np.stack([base, base + 500, base + 2500, load0, load1], axis=-1)
    df = decode_timeline([sch], [torch.from_numpy(stamps)])
    assert df["load_start_us"].isna().tolist() == (df["name"] == "ATTN").tolist()
    w = df.dropna(subset=["load_start_us"])
    assert ((w["ts_us"] - w["load_start_us"]) == 3.0).all() and ((w["load_end_us"] - w["ts_us"]) == 1.0).all()
    assert intrakernel_summary(df)["producer_lead_us_p50"] == 3.0
    ev = chrome_events(df)
    loads = [e for e in ev if e["cat"] == "megakernel_load"]
    assert len(loads) == len(w) and all(e["dur"] == 4.0 and e["args"]["lead_us"] == 3.0 for e in loads)
    assert {e["pid"] for e in loads} == {"megakernel (intra-kernel) producer"}


def test_gluon_attention_phase_stamps_become_their_own_columns():
    """Attention tasks have no weights, so the Gluon consumer writes their math-done and ticket stamps into the
    producer's two slots: they become ``math_end_us``/``ticket_us`` (not load times) and ``attn_phases``; a weight
    task's slots stay load times. Hand-built: ready +0.5 µs, math +1.5, ticket +2.25, end +3.0 (µs from start)."""
    sch, ops, base = _stamp_grid()
    attn = ops == OP_ATTN
    t3 = np.where(attn, base + 1500, base - 3000)
    t4 = np.where(attn, base + 2250, base + 1000)
    stamps = np.stack([base, base + 500, base + 3000, t3, t4], axis=-1)
    df = decode_timeline([sch], [torch.from_numpy(stamps)])
    a, w = df[df["name"] == "ATTN"], df[df["name"] != "ATTN"]
    assert len(a) and a["load_start_us"].isna().all() and w["math_end_us"].isna().all()
    assert ((a["math_end_us"] - a["ready_us"]).round(9) == 1.0).all() and ((a["end_us"] - a["ticket_us"]).round(9) == 0.75).all()
    assert ((w["ts_us"] - w["load_start_us"]) == 3.0).all()
    ph = intrakernel_summary(df)["attn_phases"]
    assert ph["math_us"]["p50"] == pytest.approx(1.0) and ph["ticket_us"]["max"] == pytest.approx(0.75)
    assert ph["combine_us"]["p50"] == pytest.approx(0.75)
    assert intrakernel_summary(df)["producer_lead_us_p50"] == 3.0  # attention tasks do not enter the lead


def test_gluon_weight_task_phase_stamps():
    """The Gluon consumer's two more stamps per weight task (input staged, last ring slot consumed) become
    ``staged_us``/``mv_end_us`` and ``task_phases`` per opcode; attention tasks leave them 0 (NaN). Hand-built:
    ready +0.5 µs, staged +1.75, matvec done +2.5, end +3.0 (µs from start); QKV tasks stage 0.25 µs longer."""
    from bubblescope.megakernel_engine.schedule import OP_QKV
    from bubblescope.megakernel_engine.timeline import task_phases
    sch, ops, base = _stamp_grid()
    attn, qkv = ops == OP_ATTN, ops == OP_QKV
    t5 = np.where(attn, 0, base + 1750 + np.where(qkv, 250, 0))
    t6 = np.where(attn, 0, base + 2500)
    stamps = np.stack([base, base + 500, base + 3000, base - 3000, base + 1000, t5, t6], axis=-1)
    df = decode_timeline([sch], [torch.from_numpy(stamps)])
    assert df.loc[df["name"] == "ATTN", "staged_us"].isna().all()
    assert not df.loc[df["name"] != "ATTN", ["staged_us", "mv_end_us"]].isna().any().any()
    ph = {r["opcode"]: r for r in intrakernel_summary(df)["task_phases"]}
    assert "ATTN" not in ph and list(ph)[:2] == ["QKV", "OPROJ"]  # pipeline order
    assert ph["QKV"]["stage_us_p50"] == pytest.approx(1.5) and ph["QKV"]["mv_us_p50"] == pytest.approx(0.5)
    assert ph["DOWN"]["stage_us_p50"] == pytest.approx(1.25) and ph["DOWN"]["mv_us_p50"] == pytest.approx(0.75)
    assert ph["GATEUP"]["epilogue_us_p50"] == pytest.approx(0.5) == ph["GATEUP"]["epilogue_us_max"]
    slots = np.arange(ops.shape[1])[None, :] < sch.counts.numpy()[:, None]
    assert ph["QKV"]["tasks"] == int((qkv & slots).sum())
    assert task_phases(df.drop(columns=["staged_us", "mv_end_us"])) is None  # 5 stamps: no phases


def test_gluon_attention_task_phase_stamps():
    """With 7 stamps an attention task's slots 5 and 6 hold q in registers and its block loop done: they become
    ``q_in_us``/``blocks_end_us`` (weight tasks' ``staged_us`` stay theirs) and split ``attn_phases["math_us"]``
    into ``q_us`` + ``blocks_us`` + ``warps_us``. Hand-built: ready +0.5 µs, q +0.75, blocks +1.25, math +1.5,
    ticket +2.25, end +3.0; weight tasks staged +1.75, matvec +2.5."""
    sch, ops, base = _stamp_grid()
    attn = ops == OP_ATTN
    t3 = np.where(attn, base + 1500, base - 3000)
    t4 = np.where(attn, base + 2250, base + 1000)
    t5 = np.where(attn, base + 750, base + 1750)
    t6 = np.where(attn, base + 1250, base + 2500)
    stamps = np.stack([base, base + 500, base + 3000, t3, t4, t5, t6], axis=-1)
    df = decode_timeline([sch], [torch.from_numpy(stamps)])
    a, w = df[df["name"] == "ATTN"], df[df["name"] != "ATTN"]
    assert a["staged_us"].isna().all() and w["q_in_us"].isna().all() and w["blocks_end_us"].isna().all()
    assert ((w["staged_us"] - w["ready_us"]).round(9) == 1.25).all()
    ph = intrakernel_summary(df)["attn_phases"]
    assert ph["q_us"]["p50"] == pytest.approx(0.25) and ph["blocks_us"]["max"] == pytest.approx(0.5)
    assert ph["warps_us"]["p50"] == pytest.approx(0.25) and ph["math_us"]["p50"] == pytest.approx(1.0)
    assert "ATTN" not in {r["opcode"] for r in intrakernel_summary(df)["task_phases"]}


def test_attn_critical_takes_apart_the_last_attention_task_of_each_layer():
    """Three layers by hand (µs): per layer two QKV tasks (the last ends at 10·layer + 2) and three attention tasks;
    the one that ends last is the critical one whatever the others' phases. Its phases by layer: after_qkv 0.5 /
    0.25 / 1.0, q 1.0 / 1.5 / 0.5, blocks 1.0 / 1.0 / 2.0, ticket 0.75 / 0.5 / 1.0, combine 3.0 / 2.0 / 2.5; a
    decoy task ends earlier with longer q and blocks. A weight task and a skipped split (NaN stamps) are ignored."""
    import pandas as pd
    from bubblescope.megakernel_engine.timeline import attn_critical
    crit = [(0.5, 1.0, 1.0, 0.75, 3.0), (0.25, 1.5, 1.0, 0.5, 2.0), (1.0, 0.5, 2.0, 1.0, 2.5)]
    rows = []  # name, layer, ready, q_in, math_end, ticket, end
    for layer, (after, q, blocks, ticket, comb) in enumerate(crit):
        t0 = 10.0 * layer
        rows += [("QKV", layer, t0, None, None, None, t0 + 1.0), ("QKV", layer, t0, None, None, None, t0 + 2.0)]
        r = t0 + 2.0 + after
        rows.append(("ATTN", layer, r, r + q, r + q + blocks, r + q + blocks + ticket,
                     r + q + blocks + ticket + comb))
        rows.append(("ATTN", layer, r, r + q + 0.5, r + q + blocks + 1.0, r + q + blocks + 1.5, r + q + blocks + 2.0))
        rows.append(("ATTN", layer, r, None, None, None, r + 0.1))  # a skipped split: no phase stamps
    df = pd.DataFrame(rows, columns=["name", "layer", "ready_us", "q_in_us", "math_end_us", "ticket_us", "end_us"])
    df["blocks_end_us"] = df["math_end_us"]
    out = attn_critical(df.sample(frac=1.0, random_state=1))
    assert out["layers"] == 3
    for k, v in {"after_qkv_us": 0.5, "q_us": 1.0, "blocks_us": 1.0, "ticket_us": 0.75, "combine_us": 2.5}.items():
        assert out[k] == pytest.approx(v), k
    assert out["total_us"] == pytest.approx(6.25)  # the layers' sums 6.25 / 5.25 / 7.0
    assert attn_critical(df.drop(columns=["q_in_us"])) is None


def test_stage_edges_hand_built_chain():
    """Two layers by hand (µs): each stage's first consumer starts a fixed time after the upstream stage's last
    end, except ATTN, which waits on part of QKV and starts 1 µs before the last QKV tile ends."""
    import pandas as pd
    rows = []  # (name, layer, ready, end) per task; ts = ready - 0.5
    t = 0.0
    for layer in range(2):
        for name, hop, span, n in (("QKV", 1.0, 3.0, 2), ("ATTN", -1.0, 2.0, 2), ("OPROJ", 2.0, 4.0, 3),
                                   ("GATEUP", 1.5, 10.0, 4), ("DOWN", 0.5, 5.0, 2)):
            if layer == 0 and name == "QKV":
                hop = 0.0
            first = t + hop
            for k in range(n):  # the tasks' ready times spread over the first half of the span, the last ends it
                rows.append((name, layer, first + k * span / (2 * n), first + span if k == n - 1 else first + span / 2))
            t = first + span
    first = t + 0.25
    rows.append(("LMHEAD", 1, first, first + 7.0))
    df = pd.DataFrame(rows, columns=["name", "layer", "ready_us", "end_us"]).sample(frac=1.0, random_state=0)
    df["ts_us"] = df["ready_us"] - 0.5
    e = stage_edges(df)
    assert e["edge"].tolist() == ["QKV", "QKV→ATTN", "ATTN→OPROJ", "OPROJ→GATEUP", "GATEUP→DOWN", "DOWN→QKV",
                                  "QKV→ATTN", "ATTN→OPROJ", "OPROJ→GATEUP", "GATEUP→DOWN", "DOWN→LMHEAD"]
    assert e["hop_us"].iloc[1:].round(9).tolist() == [-1.0, 2.0, 1.5, 0.5, 1.0, -1.0, 2.0, 1.5, 0.5, 0.25]
    assert e["span_us"].round(9).tolist() == [3.0, 2.0, 4.0, 10.0, 5.0, 3.0, 2.0, 4.0, 10.0, 5.0, 7.0]
    assert e["tasks"].tolist() == [2, 2, 3, 4, 2, 2, 2, 3, 4, 2, 1]
    summ = {r["edge"]: r for r in edge_summary(e)}
    assert summ["ATTN→OPROJ"]["stages"] == 2 and summ["ATTN→OPROJ"]["hop_us_p50"] == pytest.approx(2.0)
    assert summ["DOWN→LMHEAD"]["span_us_p50"] == pytest.approx(7.0) and "QKV" not in summ
    assert list(summ)[0] == "QKV→ATTN"


def test_lower_pads_empty_slots():
    sch = build_schedule(TINY["gqa-tied-llama3"], SMALL, 1)
    table, counts = lower(sch.tasks[:5], 3, sch.num_counters)
    assert counts.tolist() == [2, 2, 1] and table.shape == (3, 2, table.shape[2]) and (table[2, 1] == 0).all()


# ---- compiled mode without a GPU ----------------------------------------------------------------------------
_COMPILE = """
import json, torch
from bubblescope.megakernel_engine.residency import DeviceLimits, programs_per_sm
from bubblescope.megakernel_engine.triton_kernel.offline import compile_offline
from bubblescope.megakernel_engine.schedule import MegakernelParams
from bubblescope.models.config import get_preset
h200 = DeviceLimits("H200", 132, 65536, 2048, 233472, 32, (9, 0))
out = []
for model, dtype, params, prefetch in (
        ("llama-3.2-1b", torch.bfloat16, MegakernelParams(), 2),
        ("llama-3.2-1b", torch.bfloat16, MegakernelParams(timeline=True, spin_sleep_ns=64), 1),
        ("qwen3-0.6b", torch.float32, MegakernelParams(max_rows=256, block_k=64), 0)):
    info = compile_offline(get_preset(model), dtype, params, prefetch=prefetch)
    info["fit"] = programs_per_sm(info["registers"], info["num_warps"], info["shared_bytes"], h200)[0]
    out.append({k: info[k] for k in ("registers", "spill_store_bytes", "shared_bytes", "fit", "cooperative")})
print(json.dumps(out))
"""


@pytest.mark.slow
def test_kernel_compiles_for_sm90_and_default_keeps_four_programs_per_sm():
    """Compiled-mode code paths (prefetch asm, %globaltimer, nanosleep, q/k-norm, bias-free bf16/fp32) through
    Triton and ptxas for sm_90a, in a subprocess where triton is not in interpreter mode."""
    from .conftest import compile_in_subprocess

    default, timeline, qwen3 = compile_in_subprocess(_COMPILE, timeout=600)
    assert default["fit"] >= 4, default  # residency of the default config on an H200 (docs/design.md: 4/SM)
    assert default["registers"] <= 128 and timeline["registers"] <= 128  # the maxnreg cap holds
    assert default["cooperative"] is True
    assert timeline["registers"] and qwen3["registers"]


def test_signals_are_batched_per_program_stage_run():
    sch = build_schedule(get_preset("llama-3.2-1b"), MegakernelParams(attn_reduce="stage"), 528)
    rows = sch.table[sch.table[..., F_SIGINC] > 0]
    totals = torch.zeros(sch.num_counters, dtype=torch.long).index_add_(0, rows[:, F_SIGNAL].long(),
                                                                        rows[:, F_SIGINC].long())
    assert totals.tolist() == sch.increments  # every stage still adds one per task
    assert len(rows) < sum(t.signal >= 0 for t in sch.tasks)  # but with fewer atomics


def test_fused_attention_tickets_replace_static_signals():
    cfg = get_preset("llama-3.2-1b")
    sch = build_schedule(cfg, MegakernelParams(), 528)
    attn = sch.table[sch.table[..., 0] == OP_ATTN]
    # No ATTN row signals statically; each names its group's ticket counter (one per layer and kv head).
    assert (attn[:, F_SIGINC] == 0).all()
    tickets = attn[:, F_TICKET].unique()
    assert len(tickets) == cfg.num_hidden_layers * cfg.num_key_value_heads
    assert sch.counter_name(int(tickets[0])) == "layer 0 ATTN tickets of kv-head group 0"
    # Ticket counters are rewound every step (not stage counters); each OPROJ waits for one signal per group.
    assert all(sch.increments[int(c)] == 0 for c in tickets)
    oproj = next(t for t in sch.tasks if t.op == OP_OPROJ)
    assert oproj.need == cfg.num_key_value_heads


def test_register_cap_keeps_the_requested_programs_resident():
    from bubblescope.megakernel_engine.triton_kernel.host import register_cap
    # 65536 registers per SM (sm_90) / (4 programs · 4 warps · 32 threads) = 128 per thread.
    assert register_cap(MegakernelParams()) == 128
    # 65536 / (3 · 4 · 32) = 170.7, down to a multiple of 8 (per-warp allocation of 256 registers).
    assert register_cap(MegakernelParams(programs_per_sm=3)) == 168
    assert register_cap(MegakernelParams(num_warps=8, programs_per_sm=1)) == 255  # the ISA's maximum
    assert register_cap(MegakernelParams(max_registers=96)) == 96


_TEXT = """
import json, subprocess, tempfile
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from bubblescope.megakernel_engine.residency import cubin_text_bytes

@triton.jit
def axpy(x_ptr, y_ptr, a, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, a * tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)

src = triton.compiler.ASTSource(axpy, {"x_ptr": "*fp32", "y_ptr": "*fp32", "a": "fp32", "n": "i32",
                                       "BLOCK": "constexpr"}, {"BLOCK": 256})
ck = triton.compile(src, target=GPUTarget("cuda", 90, 32))
with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
    f.write(ck.asm["cubin"])
    f.flush()
    elf = subprocess.run([sys_cuobjdump, "-elf", f.name], capture_output=True, text=True, check=True).stdout
print(json.dumps({"ours": cubin_text_bytes(ck.asm["cubin"]), "elf": elf}))
"""


def test_cubin_text_bytes_matches_cuobjdump(tmp_path):
    """:func:`residency.cubin_text_bytes` on a small Triton kernel compiled offline for sm_90 against the size
    ``cuobjdump -elf`` (Triton's bundled copy) lists for the same ``.text.<kernel>`` section; and a non-ELF input is
    refused."""
    import importlib.util
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    from bubblescope.megakernel_engine.residency import cubin_text_bytes

    with pytest.raises(ValueError, match="not a little-endian ELF64"):
        cubin_text_bytes(b"\x7fELF\x01\x01" + bytes(58))
    spec = importlib.util.find_spec("triton")
    tool = Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump" if spec else None
    if tool is None or not tool.is_file():
        pytest.skip("triton with its bundled cuobjdump is not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = tmp_path / "axpy.py"  # a @triton.jit function must live in a file
    script.write_text(f"sys_cuobjdump = {str(tool)!r}\n" + _TEXT)
    run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    # cuobjdump's section table: "<index> <offset> <size> <entsize> <flags> PROGBITS ... .text.<name>", in hex
    listed = {m.group(2): int(m.group(1), 16) for m in re.finditer(
        r"^\s*\w+\s+\w+\s+(\w+)\s.*\sPROGBITS\s.*\s\.text\.(\S+)\s*$", got["elf"], re.M)}
    assert listed and got["ours"] == listed and list(listed) == ["axpy"], (got["ours"], listed)
