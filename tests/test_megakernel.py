"""The Triton megakernel on CPU under TRITON_INTERPRET=1 (one program, topological instruction list),
against the reference engine, the PyTorch oracle of the same table, and its own variants.

The interpreter mode is fixed when triton is first imported in a process, so this module sets
TRITON_INTERPRET=1 before anything imports triton (on a machine without CUDA only: with a GPU, the
process keeps compiled Triton and these CPU tests are skipped; the GPU has benchmarks/megakernel_gpu_check.py).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import json  # noqa: E402

import pytest  # noqa: E402

from bubblescope.errors import BubblescopeError, EngineUnavailable, KernelStuck  # noqa: E402
from bubblescope.generation import generate, teacher_forced_logits  # noqa: E402
from bubblescope.megakernel_engine import MegakernelEngine, MegakernelParams  # noqa: E402
from bubblescope.megakernel_engine.interpreter import ScheduleInterpreter  # noqa: E402
from bubblescope.megakernel_engine.schedule import F_NEED, F_OP, F_LAYER, OP_DOWN  # noqa: E402
from bubblescope.megakernel_engine.timeline import chrome_events, intrakernel_summary  # noqa: E402
from bubblescope.models import load_llama2c  # noqa: E402
from bubblescope.models.weights import dummy_weights  # noqa: E402
from bubblescope.reference_engine import ReferenceEngine  # noqa: E402

from .conftest import STORIES, needs_stories  # noqa: E402
from .test_megakernel_schedule import FORCED, PROMPT, TINY  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _interpreter():
    from bubblescope.megakernel_engine.triton_kernel.host import load_kernel
    try:
        load_kernel(True)
    except EngineUnavailable as e:
        if torch.cuda.is_available():
            pytest.skip(f"CUDA machine: triton is in compiled mode here ({e})")
        raise


# Moderate tiles: a few tasks per stage (several K chunks, 2 splits, partial tiles) at an interpreter-friendly count.
MID = MegakernelParams(rows_qkv=24, rows_o=16, rows_gateup=32, rows_down=16, rows_lm=40, kv_splits=2,
                       attn_kv_heads=1, block_k=16, block_s=2)


def _mid(cfg):
    return MID.replace(rows_qkv=2 * cfg.head_dim) if cfg.qk_norm else MID


@needs_stories
def test_stories260k_greedy_200_tokens_identical_to_reference():
    w = load_llama2c(STORIES)
    ref = generate(ReferenceEngine(w, max_seq_len=256), [1], 200, eos_ids=())
    mk = generate(MegakernelEngine(w, max_seq_len=256), [1], 200, eos_ids=())
    assert len(mk.tokens) == 200
    assert mk.tokens == ref.tokens


@pytest.mark.parametrize("name", list(TINY))
def test_tiny_configs_match_reference_and_oracle(name):
    cfg = TINY[name]
    w = dummy_weights(cfg, seed=1)
    ref = teacher_forced_logits(ReferenceEngine(w, max_seq_len=32), PROMPT, FORCED)
    engine = MegakernelEngine(w, params=_mid(cfg), max_seq_len=32)
    got = teacher_forced_logits(engine, PROMPT, FORCED)
    orc = teacher_forced_logits(ScheduleInterpreter(w, params=_mid(cfg), max_seq_len=32), PROMPT, FORCED)
    assert (got - ref).abs().max().item() < 1e-4
    assert (got - orc).abs().max().item() < 1e-4
    assert engine.compile_info()["tasks_per_step"] > 6 * cfg.num_hidden_layers  # several tiles per stage ran
    assert engine.greedy_token().item() == int(torch.argmax(got[-1]))  # the LM-head tasks' atomic_max key


@pytest.mark.parametrize("attn_reduce", ["fused", "stage"])
def test_multi_block_tasks_and_many_splits_match_reference(attn_reduce):
    # GATEUP / LMHEAD tasks of several register tiles (the last one partial), and 40 splits of one position
    # each (24-28 in use, the rest skipped): the reduction walks them in blocks of 16, and the fused one runs
    # in the last ticket holder.
    cfg = TINY["gqa-tied-llama3"]
    w = dummy_weights(cfg, seed=2)
    params = MID.replace(gateup_blocks=3, lm_blocks=4, kv_splits=40, attn_min_chunk=1, attn_reduce=attn_reduce)
    prompt = list(range(3, 3 + 24))
    ref = teacher_forced_logits(ReferenceEngine(w, max_seq_len=40), prompt, FORCED)
    engine = MegakernelEngine(w, params=params, max_seq_len=40)
    got = teacher_forced_logits(engine, prompt, FORCED)
    orc = teacher_forced_logits(ScheduleInterpreter(w, params=params, max_seq_len=40), prompt, FORCED)
    assert (got - ref).abs().max().item() < 1e-4
    assert (got - orc).abs().max().item() < 1e-4
    per_op = engine.compile_info()["tasks_per_opcode"]
    assert ("ATTN_REDUCE" in per_op) == (attn_reduce == "stage")
    assert per_op["LMHEAD"] == -(-cfg.vocab_size // (40 * 4))


def test_decode_greedy_picks_torch_argmax_with_negative_logits_and_ties():
    # Untied LM head whose rows are c_r · u: logits are c_r · (u · h). With u · h < 0 every logit is negative,
    # so the device pick must order negative floats correctly; repeated c_r make ties (first row wins).
    cfg = TINY["mha-untied"]
    w = dummy_weights(cfg, seed=3)
    u = w.lm_head[7].clone()
    coef = torch.tensor([3.0, 1.0, 2.0, 1.0, 5.0, 1.0, 4.0])[torch.arange(cfg.vocab_size) % 7]
    w.lm_head.copy_(coef[:, None] * u[None, :])
    e = MegakernelEngine(w, params=MID.replace(lm_blocks=2), max_seq_len=16)
    logits = e.prefill(torch.tensor([1, 2]))
    if logits[0] > 0:  # make u · h negative for this input
        w.lm_head.neg_()
        e = MegakernelEngine(w, params=MID.replace(lm_blocks=2), max_seq_len=16)
        logits = e.prefill(torch.tensor([1, 2]))
    assert (logits < 0).all()
    assert int(torch.argmax(logits)) == 1  # the smallest c_r (1.0, first at row 1)
    assert e.greedy_token().item() == 1
    tok = e.decode_greedy(5)
    assert tok == int(torch.argmax(e.last_logits()))
    # Random weights over several steps: the fused greedy step equals argmax of the same step's logits.
    w = dummy_weights(TINY["gqa-tied-llama3"], seed=5)
    e = MegakernelEngine(w, params=MID.replace(lm_blocks=3), max_seq_len=16)
    tok = int(torch.argmax(e.prefill(torch.tensor([1, 2, 3]))))
    for _ in range(6):
        nxt = e.decode_greedy(tok)
        assert nxt == int(torch.argmax(e.last_logits()))
        tok = nxt
    # A device-side token (read from the state, not passed as a kernel argument) gives the same step.
    a = MegakernelEngine(w, params=MID.replace(lm_blocks=3), max_seq_len=16)
    b = MegakernelEngine(w, params=MID.replace(lm_blocks=3), max_seq_len=16)
    a.prefill(torch.tensor([1, 2, 3]))
    b.prefill(torch.tensor([1, 2, 3]))
    assert torch.equal(a.decode(torch.tensor([7])), b.decode(7))


def test_variants_give_the_same_logits_as_fused():
    w = dummy_weights(TINY["gqa-tied-llama3"], seed=4)
    out = {}
    for variant in ("fused", "stages", "noprefetch"):
        e = MegakernelEngine(w, params=MID, max_seq_len=32, variant=variant)
        out[e.name] = teacher_forced_logits(e, PROMPT, FORCED)
    assert set(out) == {"megakernel", "megakernel-stages", "megakernel-noprefetch"}
    assert torch.equal(out["megakernel"], out["megakernel-stages"])
    assert torch.equal(out["megakernel"], out["megakernel-noprefetch"])


def test_unmeetable_dependency_raises_kernel_stuck_naming_the_task():
    cfg = TINY["mha-untied"]
    e = MegakernelEngine(dummy_weights(cfg), params=MID.replace(spin_cap=20), max_seq_len=16)
    table = e._tables[0][1]
    slot = next(i for i in range(table.shape[1]) if table[0, i, F_OP] == OP_DOWN and table[0, i, F_LAYER] == 1)
    table[0, slot, F_NEED] += 1  # one increment more than the GATEUP stage ever makes
    e.prefill(torch.tensor([3]))  # batched in torch: no kernel step yet
    with pytest.raises(KernelStuck, match=r"DOWN layer 1 tile 0 .*program 0.*layer 1 GATEUP"):
        e.decode(4)
    with pytest.raises(KernelStuck):  # the engine stays failed until reset
        e.decode(4)
    table[0, slot, F_NEED] -= 1
    e.reset()
    e.prefill(torch.tensor([3]))
    e.decode(4)


def test_timeline_decodes_and_exports():
    cfg = TINY["gqa-tied-llama3"]
    e = MegakernelEngine(dummy_weights(cfg), params=MID, max_seq_len=16)
    with pytest.raises(BubblescopeError, match="timeline"):
        e.last_timeline()
    e.prefill(torch.tensor([1, 2]))
    with e.timeline() as rec:
        e.decode(3)
    df = rec.frame
    assert rec.reason is None and rec.ts_offset_us > 0
    assert len(df) == len(e.schedule.tasks)
    assert df.groupby("name").size().to_dict() == e.schedule.tasks_per_opcode()
    assert ((df["ts_us"] <= df["ready_us"]) & (df["ready_us"] <= df["end_us"])).all()
    assert list(df["task"].sort_values()) == list(range(len(df)))
    # One program, topological order: tasks start in gidx order and never overlap.
    ordered = df.sort_values("task")
    assert (ordered["ts_us"].diff().dropna() > 0).all()
    assert (ordered["ts_us"].iloc[1:].values >= ordered["end_us"].iloc[:-1].values).all()
    s = intrakernel_summary(df)
    assert 0 <= s["wait_ratio"] < 1 and s["programs"] == 1
    ev = chrome_events(df, rec.ts_offset_us)
    json.dumps(ev)
    assert all(x["ph"] == "X" and x["tid"] == 0 for x in ev)
    e.decode(4)  # outside the block: not recorded
    with pytest.raises(BubblescopeError):
        e.last_timeline()


def test_user_errors():
    cfg = TINY["gqa-tied-llama3"]
    w = dummy_weights(cfg)
    with pytest.raises(BubblescopeError, match="variant"):
        MegakernelEngine(w, variant="nope")
    with pytest.raises(EngineUnavailable, match="head_dim"):
        MegakernelEngine(dummy_weights(cfg.replace(head_dim=12)))
    e = MegakernelEngine(w, max_seq_len=4)
    with pytest.raises(BubblescopeError, match="do not fit"):
        e.prefill(torch.arange(5))
    with pytest.raises(BubblescopeError, match="vocabulary"):
        e.prefill(torch.tensor([64]))
    e.prefill(torch.tensor([1, 2, 3]))
    e.decode(4)
    assert e.position == 4
    with pytest.raises(BubblescopeError, match="full"):
        e.decode(5)
    info = e.compile_info()
    assert {"registers", "spills", "shared_bytes", "num_warps", "programs_per_sm", "grid"} <= set(info)
    assert info["grid"] == 1 and info["interpret"] is True


def test_generate_keeps_one_step_ahead_and_undoes_it_at_eos():
    """generate() launches step k+1 before reading step k's token (launch_greedy / next_greedy_token). Stopping at
    an EOS with the next step launched must give the reference's tokens and leave the engine where a stepwise
    run would be: same position, and the next decode gives the logits of a fresh engine fed the same history."""
    w = dummy_weights(TINY["mha-untied"], "cpu", torch.float32, seed=2)  # tokens 23, 51, 14, 13, 59, ...
    full = generate(ReferenceEngine(w, max_seq_len=64), PROMPT, 8, eos_ids=()).tokens
    stop = next(k for k in range(2, 8) if full[k] not in full[:k])  # a token first seen after two decode steps
    eos = full[stop]
    mk = MegakernelEngine(w, MID, max_seq_len=64)
    got = generate(mk, PROMPT, 8, eos_ids=(eos,), launch_ahead=True)  # auto is stepwise on a CPU
    assert got.tokens == full[:stop + 1] and got.stopped_at_eos
    assert mk.position == len(PROMPT) + stop  # the launched-ahead step was undone
    after = mk.decode(eos).clone()
    fresh = MegakernelEngine(w, MID, max_seq_len=64)
    fresh.prefill(torch.tensor(PROMPT))
    for tok in full[:stop]:  # the same history through the same steps (the prompt batched, the rest decoded)
        fresh.decode(tok)
    assert torch.equal(after, fresh.decode(eos))
    # without EOS every launched step is read: nothing left queued, position = prompt + tokens - 1
    mk2 = MegakernelEngine(w, MID, max_seq_len=64)
    assert generate(mk2, PROMPT, 6, eos_ids=(), launch_ahead=True).tokens == full[:6]
    assert mk2.position == len(PROMPT) + 5


def test_generate_launches_ahead_only_where_launches_are_asynchronous(monkeypatch):
    """On a CPU the interpreter runs a step inside its launch, so a step launched ahead would be timed with the
    token before it (one token carrying two steps, the last one free): auto keeps CPU generation stepwise."""
    w = dummy_weights(TINY["mha-untied"], "cpu", torch.float32, seed=2)
    mk = MegakernelEngine(w, MID, max_seq_len=64)
    stepwise, fused = [], mk.decode_greedy
    monkeypatch.setattr(mk, "decode_greedy", lambda tok: stepwise.append(tok) or fused(tok))
    res = generate(mk, PROMPT, 4, eos_ids=())
    assert len(stepwise) == 3  # one decode_greedy per decode step: the stepwise loop
    stepwise.clear()
    assert generate(mk, PROMPT, 4, eos_ids=(), launch_ahead=True).tokens == res.tokens and stepwise == []


def test_launch_greedy_misuse_is_a_one_line_error():
    w = dummy_weights(TINY["gqa-tied-llama3"], "cpu", torch.float32, seed=0)
    mk = MegakernelEngine(w, MID, max_seq_len=64)
    with pytest.raises(BubblescopeError, match="no previous step"):
        mk.launch_greedy(None)
    with pytest.raises(BubblescopeError, match="no step queued"):
        mk.next_greedy_token()
    mk.prefill(torch.tensor(PROMPT))
    mk.launch_greedy(5)
    mk.launch_greedy(None)
    with pytest.raises(BubblescopeError, match="at most 2"):
        mk.launch_greedy(None)
    with pytest.raises(BubblescopeError, match="unread"):
        mk.decode(5)
    assert mk.discard_queued() == 2 and mk.position == len(PROMPT)
