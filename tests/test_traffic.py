"""Analytic bytes per decode step, checked against hand counts and published parameter counts.

Published totals (model cards / ``model.num_parameters()`` on the Hub): Llama-3.2-1B 1,235,814,400;
Qwen2.5-0.5B 494,032,768; Llama-3.1-8B 8,030,261,248; Qwen3-0.6B 0.44 B non-embedding parameters.
The traffic rule turns a parameter count into a per-step read count as: total - embedding table +
one embedding row + (a tied LM head, which the total counted only once as the embedding).
"""

from __future__ import annotations

import pytest

from bubblescope.errors import BubblescopeError
from bubblescope.models.config import ModelConfig, get_preset
from bubblescope.profiler.traffic import bandwidth, floor_ms, step_traffic, traffic_table


def test_llama_3_2_1b_bf16_context_128_by_hand():
    # H 2048, I 8192, 16 layers, 32 q heads and 8 kv heads of 64, vocab 128256, tied.
    layer = (2048 * 2048          # q_proj
             + 2 * 512 * 2048     # k_proj, v_proj
             + 2048 * 2048        # o_proj
             + 3 * 8192 * 2048    # gate, up, down
             + 2 * 2048)          # two RMSNorm weights
    weights = 2048 + 16 * layer + 2048 + 128256 * 2048
    # Hub total counts the tied table once as the embedding; traffic adds one row on top of it.
    assert weights == 1_235_814_400 + 2048
    kv_read = 2 * 16 * 8 * 64 * 128 * 2
    t = step_traffic(get_preset("llama-3.2-1b"), 2, 128)
    assert t["weight_bytes"] == 2 * weights == 2_471_632_896
    assert t["kv_read_bytes"] == kv_read == 4_194_304
    assert t["kv_write_bytes"] == 2 * 16 * 8 * 64 * 2
    assert t["total_bytes"] == 2_471_632_896 + 4_194_304 + 32_768
    assert t["embedding_bytes"] == 2048 * 2
    assert t["lm_head_bytes"] == 128256 * 2048 * 2
    assert 2.47e9 < t["total_bytes"] < 2.48e9  # docs/design.md: "2.47 GB"


def test_qwen3_0_6b_head_dim_differs_from_hidden_over_heads():
    cfg = get_preset("qwen3-0.6b")
    assert cfg.head_dim == 128 != cfg.hidden_size // cfg.num_attention_heads
    q, kv = 16 * 128, 8 * 128
    layer = 1024 * q + 2 * 1024 * kv + q * 1024 + 3 * 1024 * 3072 + 2 * 1024 + 2 * 128  # + q_norm, k_norm
    assert 28 * layer == 440_466_432  # the model card's "non-embedding 0.44B"
    expect_weights = 4 * (1024 + 28 * layer + 1024 + 151936 * 1024)
    t = step_traffic(cfg, 4, 1000)
    assert t["weight_bytes"] == expect_weights
    assert t["kv_read_bytes"] == 2 * 28 * 8 * 128 * 1000 * 4
    assert t["kv_write_bytes"] == 2 * 28 * 8 * 128 * 4


def test_qwen2_5_0_5b_biases():
    cfg = get_preset("qwen2.5-0.5b")
    hub_total = 494_032_768
    embedding = 151936 * 896
    t = step_traffic(cfg, 2, 0)
    assert t["weight_bytes"] == 2 * (hub_total + 896)  # tied: total already holds the table once (as lm_head)
    assert t["kv_read_bytes"] == 0
    # Without the q/k/v biases (896 + 2 * 128 per layer) the count must drop by exactly that.
    no_bias = step_traffic(cfg.replace(attention_bias=False), 2, 0)
    assert t["weight_bytes"] - no_bias["weight_bytes"] == 2 * 24 * (896 + 128 + 128)
    assert t["lm_head_bytes"] == 2 * embedding


def test_untied_llama_3_1_8b():
    cfg = get_preset("llama-3.1-8b")
    assert not cfg.tie_word_embeddings
    hub_total = 8_030_261_248
    table = 128256 * 4096
    t = step_traffic(cfg, 2, 4096)
    assert t["weight_bytes"] == 2 * (hub_total - table + 4096)  # embedding table -> one row; head read whole
    assert t["kv_read_bytes"] == 2 * 32 * 8 * 128 * 4096 * 2
    # A tied variant reads the same bytes per step: the head is read whole either way.
    assert step_traffic(cfg.replace(tie_word_embeddings=True), 2, 4096) == t


def test_stories260k_fp32():
    # llama2.c header: dim 64, hidden 172, 5 layers, 8 heads, 4 kv heads (head 8), vocab 512, shared.
    layer = 64 * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 172 * 64 + 2 * 64
    assert 512 * 64 + 5 * layer + 64 == 260_032  # "260K"
    t = step_traffic(get_preset("stories260k"), 4, 10, kv_dtype_bytes=2)
    assert t["weight_bytes"] == 4 * (64 + 5 * layer + 64 + 512 * 64)
    assert t["kv_read_bytes"] == 2 * 5 * 4 * 8 * 10 * 2
    assert t["kv_write_bytes"] == 2 * 5 * 4 * 8 * 2


@pytest.mark.parametrize("tied", [True, False])
def test_weight_bytes_match_dummy_weights(tied):
    torch = pytest.importorskip("torch")
    from bubblescope.models.weights import dummy_weights

    cfg = ModelConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, vocab_size=50, tie_word_embeddings=tied,
                      attention_bias=True, model_type="qwen2", name="tiny")
    w = dummy_weights(cfg, dtype=torch.bfloat16)
    row = 32 * 2
    table = 50 * 32 * 2
    t = step_traffic(cfg, 2, 5)
    # nbytes counts a tied table once; traffic reads it whole as the LM head plus one embedding row.
    expected = w.nbytes() + row if tied else w.nbytes() - table + row
    assert t["weight_bytes"] == expected


def test_traffic_table_sums_to_step_traffic():
    cfg = get_preset("qwen3-0.6b")
    df = traffic_table(cfg, 2, 300)
    t = step_traffic(cfg, 2, 300)
    assert int(df["bytes"].sum()) == t["total_bytes"]
    assert int(df.loc[df["kind"] == "weight", "bytes"].sum()) == t["weight_bytes"]
    assert df.loc[df["component"] == "layers.q_norm", "elements"].item() == 28 * 128
    assert abs(df["share_pct"].sum() - 100.0) < 1e-9


def test_bandwidth_and_floor():
    # 2.5 GB in 1.25 ms = 2000 GB/s; against 4000 peak 0.5, against 2500 copy 0.8.
    b = bandwidth(2_500_000_000, 1.25, peak_GBps=4000.0, copy_GBps=2500.0)
    assert b["effective_GBps"] == pytest.approx(2000.0)
    assert b["util_peak"] == pytest.approx(0.5)
    assert b["util_copy"] == pytest.approx(0.8)
    assert bandwidth(1000, 1.0) == {"effective_GBps": pytest.approx(1e-3), "util_peak": None, "util_copy": None}
    assert bandwidth(1000, None, 1.0, 1.0) == {"effective_GBps": None, "util_peak": None, "util_copy": None}
    # docs/design.md: Llama-3.2-1B's 2.47 GB floors at 0.51 ms (NVML peak 4.81 TB/s) and 0.58 ms (copy 4.26 TB/s).
    assert floor_ms(2.47e9, 4814.0) == pytest.approx(0.513, abs=1e-3)
    assert floor_ms(2.47e9, 4260.0) == pytest.approx(0.580, abs=1e-3)
    assert floor_ms(1, None) is None


@pytest.mark.parametrize("kwargs", [dict(dtype_bytes=0, context=1), dict(dtype_bytes=2, context=-1),
                                    dict(dtype_bytes=2.0, context=1), dict(dtype_bytes=2, context=10**9)])
def test_step_traffic_rejects_bad_input(kwargs):
    with pytest.raises(BubblescopeError) as e:
        step_traffic(get_preset("stories260k"), **kwargs)
    assert "\n" not in str(e.value)


def test_bandwidth_rejects_non_positive_rates():
    with pytest.raises(BubblescopeError):
        bandwidth(1, 0.0)
    with pytest.raises(BubblescopeError):
        bandwidth(1, 1.0, peak_GBps=-1)
    with pytest.raises(BubblescopeError):
        floor_ms(-5, 1.0)


def test_real_stories260k_checkpoint_bytes():
    from pathlib import Path

    path = Path(__file__).resolve().parents[1].parent / "shared" / "models" / "stories260K" / "stories260K.bin"
    if not path.is_file():
        pytest.skip(f"{path} absent (../shared holds the real stories260K checkpoint)")
    # File = 28-byte header + fp32 tensors; drop the two unused RoPE tables (seq_len 512 × head_dim/2 4 each).
    stored_weight_bytes = path.stat().st_size - 28 - 2 * 512 * 4 * 4
    t = step_traffic(get_preset("stories260k"), 4, 1)
    # Shared classifier: the file stores the table once; traffic adds one embedding row (64 fp32).
    assert t["weight_bytes"] == stored_weight_bytes + 64 * 4


def test_rank_traffic_llama_3_1_8b_tp2_by_hand():
    from bubblescope.profiler.traffic import rank_step_traffic

    # H 4096, I 14336, 32 layers, 32 q heads / 8 KV heads of 128, vocab 128256, untied; rank = half of each.
    layer = (2048 * 4096 + 2 * 512 * 4096 + 4096 * 2048  # q (16 heads), k and v (4 heads), o (its 2048 columns)
             + 3 * 7168 * 4096                           # gate, up, down: 7168 of 14336 rows/columns
             + 2 * 4096)                                 # the two RMSNorm weights, whole on every rank
    weights = 4096 + 32 * layer + 4096 + 64128 * 4096    # embedding row, layers, final norm, half the LM head
    t = rank_step_traffic(get_preset("llama-3.1-8b"), 2, 1024, 2)
    assert t["weight_bytes"] == 2 * weights
    assert t["kv_read_bytes"] == 2 * 32 * 4 * 128 * 1024 * 2 and t["kv_write_bytes"] == 2 * 32 * 4 * 128 * 2
    assert t["allreduce_count"] == 64 and t["allreduce_bytes"] == 64 * 4096 * 2
    assert t["allgather_bytes"] == 128256 * 2
    assert t["bus_bytes"] == 64 * 4096 * 2 * 2 * 1 / 2 + 128256 * 2 * 1 / 2
    one = rank_step_traffic(get_preset("llama-3.1-8b"), 2, 1024, 1)
    assert one["bus_bytes"] == 0 and one["total_bytes"] == step_traffic(get_preset("llama-3.1-8b"), 2, 1024)["total_bytes"]


def test_rank_traffic_uneven_vocab_and_bad_split():
    from bubblescope.profiler.traffic import bound_by, rank_step_traffic

    cfg = ModelConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=101)
    assert rank_step_traffic(cfg, 4, 0, 2)["lm_head_bytes"] == 51 * 64 * 4  # ceil(101 / 2) rows
    with pytest.raises(BubblescopeError, match="num_key_value_heads 2 is not a multiple of 4"):
        rank_step_traffic(cfg, 4, 0, 4)
    # 4.8e9 bytes at 4800 GB/s: a 1000 µs floor; NCCL 1200 µs per step is the larger part.
    assert bound_by(4_800_000_000, 4800.0, 1200.0) == {"hbm_floor_us": 1000.0, "nccl_us": 1200.0,
                                                       "bound": "communication"}
    assert bound_by(4_800_000_000, 4800.0, 900.0)["bound"] == "hbm"
    assert bound_by(4_800_000_000, None, 900.0)["bound"] is None


def test_llama_3_2_1b_fp8_by_hand():
    # projections 1 byte each plus a float32 scale per output row; norms, the embedding row and (fp8) the LM head
    # stay 2 bytes
    proj = 2048 * 2048 + 2 * 512 * 2048 + 2048 * 2048 + 3 * 8192 * 2048
    rows = 2048 + 2 * 512 + 2048 + 2 * 8192 + 2048
    head = 128256 * 2048
    fp8 = step_traffic(get_preset("llama-3.2-1b"), 2, 128, weights="fp8")
    assert fp8["weight_bytes"] == 16 * (proj + 4 * rows + 2 * 2048 * 2) + 2 * 2048 * 2 + 2 * head
    assert fp8["lm_head_bytes"] == 2 * head and fp8["kv_read_bytes"] == 4_194_304
    every = step_traffic(get_preset("llama-3.2-1b"), 2, 128, weights="fp8-all")
    assert every["weight_bytes"] == fp8["weight_bytes"] - 2 * head + head + 4 * 128256
    assert every["lm_head_bytes"] == head + 4 * 128256
    # 1.50 GB with the bf16 head, 1.24 GB without: the floor at the H200's NVML peak falls from 0.51 to 0.26 ms
    assert round(fp8["total_bytes"] / 1e9, 2) == 1.50 and round(every["total_bytes"] / 1e9, 2) == 1.24
    assert floor_ms(every["total_bytes"], 4814.0) == pytest.approx(0.258, abs=1e-3)
    df = traffic_table(get_preset("llama-3.2-1b"), 2, 128, weights="fp8-all")
    assert int(df["bytes"].sum()) == every["total_bytes"]
    assert df.loc[df["component"] == "layers.down_proj.scale", "bytes"].item() == 16 * 2048 * 4


@pytest.mark.parametrize("fmt", ["fp8", "fp8-all"])
@pytest.mark.parametrize("tied", [True, False])
def test_fp8_weight_bytes_match_quantized_dummy_weights(fmt, tied):
    torch = pytest.importorskip("torch")
    from bubblescope.models.weights import dummy_weights

    cfg = ModelConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, vocab_size=50, tie_word_embeddings=tied,
                      attention_bias=True, model_type="qwen2", name="tiny")
    w = dummy_weights(cfg, dtype=torch.bfloat16).as_format(fmt)
    t = step_traffic(cfg, 2, 5, weights=fmt)
    table, row = 50 * 32 * 2, 32 * 2
    # the step reads every stored weight but the embedding table, of which it reads one row; a tied bf16 head is
    # the table, read whole
    expected = w.nbytes() - table + row + (table if tied and fmt == "fp8" else 0)
    assert t["weight_bytes"] == expected


def test_step_traffic_rejects_an_unknown_weight_format():
    with pytest.raises(BubblescopeError, match="weights must be one of bf16, fp8, fp8-all, got 'int4'"):
        step_traffic(get_preset("llama-3.2-1b"), 2, 1, weights="int4")
