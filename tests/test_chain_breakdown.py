"""``benchmarks/chain_breakdown.py``'s weight-stream feed and layer chain on hand-built two-layer frames, and its
task sizes for the 1B against the hand-computed tile bytes."""

from __future__ import annotations


import pandas as pd
import pytest

from .conftest import load_benchmark


def _load():
    return load_benchmark("chain_breakdown")


def _frame() -> pd.DataFrame:
    nan = float("nan")
    rows = [  # name, layer, end, first issue, last issue, matvec end
        ("QKV", 0, 2.0, 0.0, 0.5, 1.5), ("ATTN", 0, 4.0, nan, nan, nan), ("OPROJ", 0, 6.0, 1.0, 1.0, 5.5),
        ("GATEUP", 0, 8.0, 2.0, 2.0, 7.5), ("DOWN", 0, 10.0, 3.0, 3.0, 9.5),
        # layer 1: the QKV task's 8 slots issued over [8, 9] (before the stretch), its matvec ends at 12
        ("QKV", 1, 13.0, 8.0, 9.0, 12.0), ("ATTN", 1, 16.0, nan, nan, nan), ("OPROJ", 1, 20.0, 19.0, 19.0, 19.5),
        ("GATEUP", 1, 26.0, 15.0, 15.0, 25.0), ("DOWN", 1, 30.0, 25.0, 25.0, 29.0),
    ]
    return pd.DataFrame(rows, columns=["name", "layer", "end_us", "load_start_us", "load_end_us", "mv_end_us"])


def test_stream_feed_counts_the_bytes_issued_in_each_window():
    """Layer 1's stretch is [10, 20) µs (the previous DOWN end → its O-proj end): the gate-up task (128 KB at 15)
    and the O-proj task (64 KB at 19) fall in it, the QKV task's slots (at 8–9) before it; the rest [20, 30) holds
    the down task (256 KB at 25). Rates in TB/s = bytes / µs / 1e6; the QKV matvec ends 3 µs after its last issue."""
    cb = _load()
    nbytes = {"QKV": 131072, "OPROJ": 65536, "GATEUP": 131072, "DOWN": 262144, "LMHEAD": 131072}
    feed = cb.stream_feed(_frame(), nbytes)
    assert feed["layer"].tolist() == [1]
    row = feed.iloc[0]
    assert row["stretch_us"] == 10.0 and row["rest_us"] == 10.0
    assert row["stretch_tbps"] == pytest.approx((131072 + 65536) / 10 / 1e6)
    assert row["rest_tbps"] == pytest.approx(262144 / 10 / 1e6)
    assert row["layer_tbps"] == pytest.approx((131072 + 65536 + 262144) / 20 / 1e6)
    assert row["qkv_mv_after_last_issue_us"] == 3.0


def test_task_bytes_of_the_1b():
    """Llama-3.2-1B's default Gluon tiles: 32 rows over hidden 2048 (QKV, gate-up, LM head), 16 rows (split_k 2)
    over 2048 (O-proj) and over intermediate 8192 (down), 2 bytes each."""
    cb = _load()
    assert cb.task_bytes("llama-3.2-1b") == {"QKV": 32 * 2048 * 2, "OPROJ": 16 * 2048 * 2, "GATEUP": 32 * 2048 * 2,
                                             "DOWN": 16 * 8192 * 2, "LMHEAD": 32 * 2048 * 2}


def test_layer_chain_spans_and_the_first_gate_up_staging():
    """Layer 1 of a hand-built frame: spans from each upstream stage's last end; the QKV phases are medians over
    its tasks; ``g_stage`` only counts each CTA's first gate-up task (program 0: staged 1.0 µs after ready; program
    1: 3.0; their later tasks stage nothing and are left out), so it is the median of 1.0 and 3.0. A second frame
    with four down tasks ending at 6, 8, 9 and 10 gives ``d_tail`` 10 − 6.6 (their 10th percentile, interpolated)."""
    cb = _load()
    nan = float("nan")
    rows = [  # name, layer, program, ready, staged, mv end, end
        ("QKV", 0, 0, 0.0, 0.5, 1.0, 2.0), ("ATTN", 0, 1, 2.0, nan, nan, 4.0), ("OPROJ", 0, 0, 4.0, 4.5, 5.0, 6.0),
        ("GATEUP", 0, 0, 6.0, 6.5, 7.0, 8.0), ("DOWN", 0, 1, 8.0, 8.5, 9.0, 10.0),
        ("QKV", 1, 0, 11.0, 12.0, 14.0, 15.0), ("QKV", 1, 1, 11.0, 13.0, 14.0, 16.0),
        ("ATTN", 1, 0, 16.0, nan, nan, 19.0), ("OPROJ", 1, 1, 19.0, 19.5, 20.0, 21.0),
        ("GATEUP", 1, 0, 22.0, 23.0, 24.0, 25.0), ("GATEUP", 1, 0, 25.0, 25.0, 26.0, 27.0),
        ("GATEUP", 1, 1, 22.0, 25.0, 26.0, 28.0), ("GATEUP", 1, 1, 28.0, 28.0, 29.0, 30.0),
        ("DOWN", 1, 0, 30.0, 31.0, 32.0, 34.0),
    ]
    df = pd.DataFrame(rows, columns=["name", "layer", "program", "ready_us", "staged_us", "mv_end_us", "end_us"])
    chain = cb.layer_chain(df).set_index("layer")
    one = chain.loc[1]
    assert (one["qkv_span"], one["attn_span"], one["o_span"], one["g_span"], one["d_span"]) == (6.0, 3.0, 2.0, 9.0,
                                                                                                4.0)
    assert (one["qkv_stage"], one["qkv_mv"], one["qkv_epi"]) == (1.5, 1.5, 1.5)
    assert one["g_stage"] == 2.0
    assert chain.loc[0]["g_stage"] == 0.5
    # the hops: QKV tasks ready 1.0 after the previous DOWN end (10), first gate-up tasks 1.0 after the O-proj end
    # (21); one task per upstream stage here, so no spread
    assert (one["qkv_ready"], one["g_ready"], one["d_tail"], one["o_tail"]) == (1.0, 1.0, 0.0, 0.0)
    assert pd.isna(chain.loc[0]["qkv_ready"])
    spread = pd.concat([df[(df["layer"] == 0) & (df["name"] != "DOWN")], df[df["layer"] == 1],
                        pd.DataFrame([("DOWN", 0, p, 5.0, 5.5, 5.8, end) for p, end in enumerate((6.0, 8.0, 9.0, 10.0))],
                                     columns=df.columns)])
    assert cb.layer_chain(spread).set_index("layer").loc[1]["d_tail"] == pytest.approx(10.0 - 6.6)


def test_task_bytes_follow_the_params():
    """Qwen2.5-0.5B (hidden 896, q 896, intermediate 4864): 32-row tiles by default (its tensor-core
    matvec), 16 rows where max_rows asks for them, as its older frames ran."""
    cb = _load()
    h, i = 896, 4864
    assert cb.task_bytes("qwen2.5-0.5b")["QKV"] == 32 * h * 2 and cb.task_bytes("qwen2.5-0.5b")["DOWN"] == 16 * i * 2
    old = cb.task_bytes("qwen2.5-0.5b", {"max_rows": 16})
    assert (old["QKV"], old["OPROJ"], old["DOWN"]) == (16 * h * 2, 8 * h * 2, 8 * i * 2)


def test_goal_budget_on_a_hand_built_layer():
    """Two hand-built layers, one task per stage (µs). The LM head of Qwen3-0.6B (151,936 × 1,024 × 2 bytes) at
    4.0 TB/s takes 311,164,928 / 4e6 = 77.79 µs, so 0.40 ms leaves (400 − 77.79) / 28 = 11.507 µs per layer. Each
    weight stage's link is its hop (median over layers; layer 0's QKV has none) plus its staging, matvec and
    epilogue; the floor adds the attention's block math alone, ``with_attention_us`` its whole critical task."""
    cb = _load()
    nan = float("nan")
    cols = ["name", "layer", "program", "ready_us", "staged_us", "mv_end_us", "end_us", "q_in_us", "blocks_end_us",
            "math_end_us", "ticket_us"]
    rows = []
    for layer, t in ((0, 0.0), (1, 20.0)):
        rows += [("QKV", layer, 0, t + 0.5, t + 1.0, t + 2.0, t + 3.0, nan, nan, nan, nan),
                 # attention: ready 0.5 after the QKV end, q 1.0, blocks 2.0, ticket 0.5, combine 1.0 (total 5.0)
                 ("ATTN", layer, 1, t + 3.5, nan, nan, t + 8.0, t + 4.5, t + 6.5, t + 6.5, t + 7.0),
                 ("OPROJ", layer, 0, t + 8.5, t + 8.75, t + 9.75, t + 10.5, nan, nan, nan, nan),
                 ("GATEUP", layer, 0, t + 11.0, t + 11.5, t + 12.5, t + 13.0, nan, nan, nan, nan),
                 ("DOWN", layer, 1, t + 13.5, t + 13.75, t + 15.25, t + 16.0, nan, nan, nan, nan)]
    df = pd.DataFrame(rows, columns=cols)
    g = cb.goal_budget(df, "qwen3-0.6b", 0.40, 4.0)
    assert g["lm_head_us"] == pytest.approx(151936 * 1024 * 2 / 4e6, abs=0.01)
    assert g["budget_layer_us"] == pytest.approx((400 - 151936 * 1024 * 2 / 4e6) / 28, abs=1e-3)
    # QKV: hop = layer 1's ready 20.5 − layer 0's DOWN end 16.0 = 4.5 (the median over its one hop), staging 0.5,
    # matvec 1.0, epilogue 1.0 → 7.0
    assert g["stage_links_us"] == {"QKV": 7.0, "OPROJ": 2.5, "GATEUP": 2.5, "DOWN": 3.0}
    assert g["link_floor_us"] == pytest.approx(7.0 + 2.5 + 2.5 + 3.0 + 2.0)  # + the attention's blocks alone
    assert g["with_attention_us"] == pytest.approx(7.0 + 2.5 + 2.5 + 3.0 + 5.0)
