"""The weight stream's feed (``timeline.stream_feed``) on hand-built frames with hand-computed rates, its place in
``intrakernel_summary`` and the reports, and ``schedule.task_weight_bytes`` against hand-computed tile sizes."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

if not torch.cuda.is_available():  # MegakernelEngine below runs the interpreter's kernel on CPU (see test_megakernel)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from rich.console import Console  # noqa: E402

from . import resultsgen as g  # noqa: E402
from bubblescope.errors import BubblescopeError, EngineUnavailable  # noqa: E402
from bubblescope.megakernel_engine.gluon.host import gluon_tiling  # noqa: E402
from bubblescope.megakernel_engine.schedule import (  # noqa: E402
    OP_ATTN, MegakernelParams, build_schedule, task_weight_bytes,
)
from bubblescope.megakernel_engine.timeline import (  # noqa: E402
    STREAM_FEED_COLUMNS, decode_timeline, intrakernel_summary, stream_feed,
)
from bubblescope.models.config import get_preset  # noqa: E402
from bubblescope.models.weights import dummy_weights  # noqa: E402
from bubblescope.reports.html import render_html  # noqa: E402
from bubblescope.reports.results import validate_results  # noqa: E402
from bubblescope.reports.terminal import render_results  # noqa: E402

from .test_megakernel_schedule import TINY  # noqa: E402

NAN = float("nan")
KB16 = 16384
# Under 32 KB each: every task is one ring slot, issued at its load_start_us.
ONE_SLOT = {"QKV": 16384, "OPROJ": 20480, "GATEUP": 24576, "DOWN": 28672, "LMHEAD": 16384}


def _frame(rows) -> pd.DataFrame:
    """A decode_timeline-like frame from (name, layer, end, first issue, last issue, matvec end) rows, with the
    columns intrakernel_summary also reads (one program; each task starts 1 µs before it ends)."""
    df = pd.DataFrame(rows, columns=["name", "layer", "end_us", "load_start_us", "load_end_us", "mv_end_us"])
    df["program"] = 0
    df["ts_us"] = df["end_us"] - 1.0
    df["ready_us"] = df["ts_us"]
    df["dur_us"] = 1.0
    df["wait_us"] = 0.0
    return df


def _three_layers() -> pd.DataFrame:
    return _frame([
        ("QKV", 0, 2.0, 0.0, 0.0, 1.0), ("ATTN", 0, 4.0, NAN, NAN, NAN), ("OPROJ", 0, 6.0, 1.0, 1.0, 5.0),
        ("GATEUP", 0, 8.0, 2.0, 2.0, 7.0), ("DOWN", 0, 10.0, 3.0, 3.0, 9.0),
        # layer 1: chain [10, 20), mlp [20, 30)
        ("QKV", 1, 13.0, 10.5, 10.5, 12.0), ("QKV", 1, 14.0, 11.0, 11.0, 13.5), ("ATTN", 1, 16.0, NAN, NAN, NAN),
        ("OPROJ", 1, 20.0, 14.0, 14.0, 19.0),
        ("GATEUP", 1, 24.0, 19.5, 19.5, 23.0),  # issued early, inside the chain
        ("GATEUP", 1, 26.0, 21.0, 21.0, 25.0), ("DOWN", 1, 30.0, 25.0, 25.0, 29.0),
        # layer 2: chain [30, 40), mlp [40, 52); its QKV task is issued at 29, in layer 1's MLP window
        ("QKV", 2, 33.0, 29.0, 29.0, 32.0), ("ATTN", 2, 36.0, NAN, NAN, NAN), ("OPROJ", 2, 40.0, 33.0, 33.0, 39.0),
        ("GATEUP", 2, 44.0, 41.0, 41.0, 43.0), ("DOWN", 2, 50.0, 45.0, 45.0, 49.0),
        ("DOWN", 2, 52.0, 47.0, 47.0, 51.0), ("LMHEAD", 2, 56.0, 51.5, 51.5, 55.0),
    ])


def test_bytes_issued_in_each_window_give_the_rates():
    """Layer 1: chain [10, 20) holds QKV 16384 + QKV 16384 + OPROJ 20480 + the early GATEUP 24576 = 77824 B over
    10 µs = 7.7824 GB/s; mlp [20, 30) holds GATEUP 24576 + DOWN 28672 + layer 2's QKV 16384 = 69632 B / 10 µs.
    Layer 2: chain [30, 40) only OPROJ 20480 B; mlp [40, 52) GATEUP 24576 + 2 × DOWN 28672 + LMHEAD 16384 = 98304 B
    over 12 µs = 8.192 GB/s. Layer 0 has no previous DOWN: no row."""
    feed = stream_feed(_three_layers(), ONE_SLOT)
    assert list(feed.columns) == STREAM_FEED_COLUMNS
    assert feed["layer"].tolist() == [1, 2]
    one, two = feed.iloc[0], feed.iloc[1]
    assert (one["chain_us"], one["mlp_us"], two["chain_us"], two["mlp_us"]) == (10.0, 10.0, 10.0, 12.0)
    assert one["chain_GBps"] == pytest.approx(7.7824)
    assert one["mlp_GBps"] == pytest.approx(6.9632)
    assert one["layer_GBps"] == pytest.approx((77824 + 69632) / 20 / 1e3)
    assert two["chain_GBps"] == pytest.approx(2.048)
    assert two["mlp_GBps"] == pytest.approx(8.192)
    assert two["layer_GBps"] == pytest.approx((20480 + 98304) / 22 / 1e3)
    # QKV matvec end − last issue: layer 1's tasks 1.5 and 2.5 µs (median 2.0), layer 2's one task 3.0
    assert feed["qkv_mv_after_last_issue_us"].tolist() == [2.0, 3.0]


def test_a_task_straddling_the_boundary_is_split_by_its_slots():
    """A 4-slot gate-up task (65536 B) issued from 18 to 21 µs puts slots at
    18, 19, 20, 21: two (32768 B) in layer 1's chain [10, 20), two in its mlp [20, 30). A 3-slot O-proj task
    (49152 B) from 19 to 20 µs puts slots at 19, 19.5 and 20: the window is half-open, so the one at 20 is the
    mlp's. A 40000-byte QKV task is 3 slots (40000 / 16384 = 2.44: the last part-filled) of 40000 / 3 B at 12, 17
    and 22 µs."""
    nbytes = {"QKV": 40000, "OPROJ": 49152, "GATEUP": 65536, "DOWN": 0}
    df = _frame([
        ("OPROJ", 0, 6.0, NAN, NAN, NAN), ("DOWN", 0, 10.0, NAN, NAN, NAN),
        ("QKV", 1, 14.0, 12.0, 22.0, 23.0),
        ("OPROJ", 1, 20.0, 19.0, 20.0, 20.0), ("GATEUP", 1, 26.0, 18.0, 21.0, 25.0),
        ("DOWN", 1, 30.0, NAN, NAN, NAN),
    ])
    (row,) = stream_feed(df, nbytes).to_dict(orient="records")
    chain = 2 * 40000 / 3 + 2 * 16384 + 2 * 16384  # QKV's slots at 12, 17; O-proj's at 19, 19.5; gate-up's at 18, 19
    mlp = 40000 / 3 + 16384 + 2 * 16384  # QKV's last slot (22), O-proj's at 20, gate-up's at 20 and 21
    assert row["chain_GBps"] == pytest.approx(chain / 10 / 1e3)
    assert row["mlp_GBps"] == pytest.approx(mlp / 10 / 1e3)
    assert row["qkv_mv_after_last_issue_us"] == 1.0


def test_the_last_slot_is_issued_exactly_at_the_last_issue():
    """8 slots from 4.12 to 20.0 µs, the chain ending at 20.0: 7 × (15.88 / 7) + 4.12 rounds to 19.999999999999996
    in floating point, but np.linspace puts the last point on its stop, so that slot is the MLP's."""
    df = _frame([("OPROJ", 0, 2.0, NAN, NAN, NAN), ("DOWN", 0, 4.0, NAN, NAN, NAN),
                 ("OPROJ", 1, 20.0, NAN, NAN, NAN), ("GATEUP", 1, 25.0, 4.12, 20.0, 24.0),
                 ("DOWN", 1, 30.0, NAN, NAN, NAN)])
    (row,) = stream_feed(df, {"GATEUP": 8 * KB16}).to_dict(orient="records")
    assert row["chain_GBps"] == pytest.approx(7 * KB16 / 16 / 1e3)
    assert row["mlp_GBps"] == pytest.approx(KB16 / 10 / 1e3)


def test_frames_without_the_stamps_or_layers_give_no_feed():
    """The Triton kernel's frame has no load columns; a Gluon frame whose weight tasks lack stamps, or with one
    layer, has nothing to measure: an empty frame of the same columns, and the summary says None."""
    tri = _three_layers().drop(columns=["load_start_us", "load_end_us", "mv_end_us"])
    unstamped = _three_layers().assign(load_start_us=NAN, load_end_us=NAN)
    one_layer = _three_layers().query("layer == 0")
    for df in (tri, unstamped, one_layer, _three_layers().iloc[:0]):
        feed = stream_feed(df, ONE_SLOT)
        assert feed.empty and list(feed.columns) == STREAM_FEED_COLUMNS
    assert stream_feed(_three_layers(), {}).empty
    assert stream_feed(_three_layers().query("name != 'OPROJ'"), ONE_SLOT).empty
    for df in (tri, unstamped, one_layer):
        assert intrakernel_summary(df, task_bytes=ONE_SLOT)["stream_feed"] is None


def test_summary_holds_medians_and_rows_without_nan():
    """Medians over layers 1 and 2, 3 decimals; without task bytes, None. A frame without ``mv_end_us`` gives
    None (not NaN: results.json is strict JSON) for the QKV tail."""
    df = _three_layers()
    assert intrakernel_summary(df)["stream_feed"] is None
    sf = intrakernel_summary(df, task_bytes=ONE_SLOT)["stream_feed"]
    assert sf["median"]["chain_GBps"] == round((7.7824 + 2.048) / 2, 3)
    assert sf["median"]["mlp_us"] == 11.0 and sf["median"]["qkv_mv_after_last_issue_us"] == 2.5
    assert [r["layer"] for r in sf["per_layer"]] == [1, 2]
    assert sf["per_layer"][1]["mlp_GBps"] == 8.192 and sf["per_layer"][1]["layer_GBps"] == round(118784 / 22e3, 3)
    sf = intrakernel_summary(df.drop(columns=["mv_end_us"]), task_bytes=ONE_SLOT)["stream_feed"]
    assert sf["median"]["qkv_mv_after_last_issue_us"] is None and sf["median"]["chain_us"] == 10.0
    json.dumps(sf, allow_nan=False)


def test_decoded_gluon_stamps_feed_the_stream():
    """Through decode_timeline: TINY gqa-tied-llama3 (2 layers) on 2 programs, tasks 10 µs apart, every weight
    task issuing all its tiles at its own start. Then the chain's bytes are the task bytes of the weight tasks that
    start in [layer 0's last DOWN end, layer 1's last OPROJ end), summed here from the frame's starts."""
    cfg = TINY["gqa-tied-llama3"]
    sch = build_schedule(cfg, MegakernelParams(rows_qkv=8, rows_o=8, rows_gateup=12, rows_down=8, rows_lm=24,
                                               kv_splits=3, attn_kv_heads=1, num_programs=5), 2)
    p, t = sch.table.shape[:2]
    ops = sch.table[..., 0].numpy()
    base = 10_000_000 + np.arange(p * t).reshape(p, t) * 10_000
    load = np.where(ops != OP_ATTN, base, 0)
    stamps = np.stack([base, base + 500, base + 2500, load, load, base + 1000, base + 2000], axis=-1)
    df = decode_timeline([sch], [torch.from_numpy(stamps)])
    nbytes = {"QKV": 70000, "OPROJ": 50000, "GATEUP": 90000, "DOWN": 33000, "LMHEAD": 20000}
    (row,) = stream_feed(df, nbytes).to_dict(orient="records")
    ends = df.groupby(["layer", "name"])["end_us"].max()
    lo, mid = ends[(0, "DOWN")], ends[(1, "OPROJ")]
    w = df[df["name"] != "ATTN"]
    inside = w[(w["ts_us"] >= lo) & (w["ts_us"] < mid)]
    assert len(inside) > 0
    assert row["layer"] == 1 and row["chain_us"] == pytest.approx(mid - lo)
    assert row["chain_GBps"] == pytest.approx(inside["name"].map(nbytes).sum() / (mid - lo) / 1e3)
    assert row["qkv_mv_after_last_issue_us"] == pytest.approx(2.0)  # mv end at start + 2 µs, last issue at start


def test_task_weight_bytes_of_the_1b_gluon_tiling():
    """Llama-3.2-1B (hidden 2048, 32 heads × 64 = q 2048, intermediate 8192, vocab 128256) with the default Gluon
    tiling on 132 SMs: 32-row tiles (QKV, gate-up, LM head) and 16-row tiles (split_k 2: O-proj, down), bf16."""
    cfg = get_preset("llama-3.2-1b")
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim, cfg.intermediate_size) == (2048, 32, 64, 8192)
    t = gluon_tiling(cfg, MegakernelParams(), 132)
    assert (t.rows_qkv, t.rows_o, t.rows_gateup, t.rows_down, t.rows_lm) == (32, 16, 32, 16, 32)
    assert task_weight_bytes(cfg, t, 2) == {"QKV": 131072, "OPROJ": 65536, "GATEUP": 131072, "DOWN": 262144,
                                            "LMHEAD": 131072}
    # the Triton kernel's GATEUP / LMHEAD tasks may loop over several register tiles; 4-byte weights
    wide = task_weight_bytes(cfg, replace(t, gateup_blocks=2, lm_blocks=3), 4)
    assert (wide["GATEUP"], wide["LMHEAD"], wide["DOWN"]) == (32 * 2 * 2048 * 4, 32 * 3 * 2048 * 4, 16 * 8192 * 4)
    for bad in (0, -2, 2.0, True):
        with pytest.raises(BubblescopeError, match="elem_bytes"):
            task_weight_bytes(cfg, t, bad)


def test_engine_task_weight_bytes_uses_its_tiling_and_dtype():
    """A CPU MegakernelEngine (fp32 dummy weights, explicit tiles) on TINY gqa-tied-llama3 (hidden 32, q 4 × 8 = 32,
    intermediate 44): rows 24 / 16 / 32 / 16 / 40, LM head tasks of 2 blocks, 4 bytes each."""
    from bubblescope.megakernel_engine import MegakernelEngine
    from bubblescope.megakernel_engine.triton_kernel.host import load_kernel
    try:
        load_kernel(True)
    except EngineUnavailable as e:
        pytest.skip(f"triton is in compiled mode in this process ({e})")
    params = MegakernelParams(rows_qkv=24, rows_o=16, rows_gateup=32, rows_down=16, rows_lm=40, kv_splits=2,
                              attn_kv_heads=1, block_k=16, block_s=2, lm_blocks=2)
    e = MegakernelEngine(dummy_weights(TINY["gqa-tied-llama3"]), params=params, max_seq_len=16)
    assert e.task_weight_bytes() == {"QKV": 24 * 32 * 4, "OPROJ": 16 * 32 * 4, "GATEUP": 32 * 32 * 4,
                                     "DOWN": 16 * 44 * 4, "LMHEAD": 80 * 32 * 4}


def _doc_with_feed(feed):
    doc = g.healthy_doc()
    g.engine(doc, "megakernel")["intrakernel"]["stream_feed"] = feed
    return doc


FEED = {"median": {"chain_us": 12.896, "chain_GBps": 1698.853, "mlp_us": 24.512, "mlp_GBps": 4058.764,
                   "layer_GBps": 3233.43, "qkv_mv_after_last_issue_us": 3.712},
        "per_layer": [{"layer": 1, "chain_us": 12.896, "chain_GBps": 1698.853, "mlp_us": 24.512,
                       "mlp_GBps": 4058.764, "layer_GBps": 3233.43, "qkv_mv_after_last_issue_us": 3.712}]}
LINE = "1.70 TB/s over the attention chain (12.9 µs per layer), 4.06 TB/s over the MLP (24.5 µs)"


def test_reports_show_the_feed_only_where_the_document_has_it():
    console = Console(record=True, width=200, color_system=None)
    doc = _doc_with_feed(FEED)
    assert validate_results(doc) == []
    render_results(doc, console)
    text = console.export_text()
    assert f"  megakernel: {LINE}" in text and "Weight stream fed" in text
    assert f"weight stream fed (tiles issued, median over layers)</th><td class=\"num\">{LINE}</td>" in render_html(doc)
    for doc in (_doc_with_feed(None), g.healthy_doc()):
        console = Console(record=True, width=200, color_system=None)
        render_results(doc, console)
        assert "Weight stream" not in console.export_text() and "weight stream fed" not in render_html(doc)


def test_the_ring_slot_size_sets_the_slots_per_task():
    """With 32 KB slots (two boxes per slot: Qwen2.5-0.5B's tensor-core matvec) a 57344-byte QKV task is 2 slots
    (57344 / 32768 = 1.75), at its first (15 µs, the chain) and last issue (25 µs, the mlp): 28672 B each; with the
    default 16 KB it is 4 slots at 15, 18.33, 21.67 and 25 µs, two in each window."""
    df = _frame([("OPROJ", 0, 2.0, NAN, NAN, NAN), ("DOWN", 0, 10.0, NAN, NAN, NAN),
                 ("QKV", 1, 26.0, 15.0, 25.0, NAN), ("OPROJ", 1, 20.0, NAN, NAN, NAN),
                 ("DOWN", 1, 30.0, NAN, NAN, NAN)])
    (wide,) = stream_feed(df, {"QKV": 57344}, slot_bytes=32768).to_dict(orient="records")
    assert wide["chain_GBps"] == pytest.approx(28672 / 10 / 1e3) and wide["mlp_GBps"] == pytest.approx(28672 / 10 / 1e3)
    (narrow,) = stream_feed(df, {"QKV": 57344}).to_dict(orient="records")
    assert narrow["chain_GBps"] == pytest.approx(2 * 14336 / 10 / 1e3)
    summary = intrakernel_summary(df, task_bytes={"QKV": 57344}, slot_bytes=32768)["stream_feed"]
    assert summary["median"]["chain_GBps"] == pytest.approx(2.867, abs=1e-3)


def test_a_layer_without_its_predecessor_gets_no_row():
    """Layers 0 and 2 only (a frame missing layer 1): layer 2's chain would start at layer 1's last down task,
    which is not there, so no row; with layers 0 and 1 present, layer 1 gets its row."""
    rows = [("OPROJ", 0, 2.0, NAN, NAN, NAN), ("DOWN", 0, 4.0, NAN, NAN, NAN),
            ("GATEUP", 2, 9.0, 5.0, 5.0, NAN), ("OPROJ", 2, 8.0, NAN, NAN, NAN), ("DOWN", 2, 10.0, NAN, NAN, NAN)]
    assert stream_feed(_frame(rows), {"GATEUP": KB16}).empty
    rows[2:] = [(n, 1, e, a, b, m) for n, _, e, a, b, m in rows[2:]]
    (row,) = stream_feed(_frame(rows), {"GATEUP": KB16}).to_dict(orient="records")
    assert row["layer"] == 1 and row["chain_GBps"] == pytest.approx(KB16 / 4 / 1e3)


def test_report_line_and_schema_for_null_and_malformed_feeds():
    """A feed whose values are null reads as dashes, a document without it has no line, and a value of the wrong
    type fails validation (the reports would otherwise meet it)."""
    from bubblescope.reports.tables import stream_feed_line
    med = {k: None for k in STREAM_FEED_COLUMNS[1:]}
    assert stream_feed_line({"stream_feed": {"median": med, "per_layer": []}}) == (
        "— TB/s over the attention chain (— µs per layer), — TB/s over the MLP (— µs)")
    assert stream_feed_line({}) is None and stream_feed_line(None) is None
    doc = g.healthy_doc()
    eng = next(e for e in doc["engines"] if e.get("intrakernel"))
    eng["intrakernel"]["stream_feed"] = {"median": dict(med, chain_GBps=1699.0), "per_layer": []}
    assert validate_results(doc) == []
    eng["intrakernel"]["stream_feed"] = {"median": dict(med, chain_GBps="x"), "per_layer": []}
    assert any("chain_GBps" in p for p in validate_results(doc))


def test_ring_slot_bytes_of_the_presets():
    """One ring slot as the Gluon kernel issues it (SB boxes of BR rows × 512 bytes): the 1B's bf16 default is one
    box of 32 × 256 bf16 (16384 B); Qwen2.5-0.5B's tensor-core matvec puts two such boxes in a slot (32768 B)."""
    from bubblescope.megakernel_engine.gluon.host import gluon_constexprs, gluon_params, ring_slot_bytes
    out = {}
    for name in ("llama-3.2-1b", "qwen2.5-0.5b"):
        cfg = get_preset(name)
        p = gluon_params(cfg, MegakernelParams())
        out[name] = ring_slot_bytes(gluon_constexprs(cfg, gluon_tiling(cfg, p, 132), p, 512, torch.bfloat16,
                                                     cfg.attention_bias), 2)
    assert out == {"llama-3.2-1b": 32 * 256 * 2, "qwen2.5-0.5b": 2 * 32 * 256 * 2}
