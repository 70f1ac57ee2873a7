"""FP8 (e4m3fn, per-row float32 scale) weights against a numpy reference written here from the OCP 8-bit floating
point specification: the e4m3fn grid enumerated from its bit layout (bias 7, 3 mantissa bits, subnormals at
exponent 0, S.1111.111 the only NaN), scale = amax / 448 in float32, round to nearest with ties to the even
mantissa, saturation at ±448; then the weights' byte count and format changes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bubblescope.errors import BubblescopeError
from bubblescope.models import load_model
from bubblescope.models.quant import QuantizedLinear, parse_weight_format, quantize_fp8
from bubblescope.models.weights import dummy_weights

from .test_megakernel_schedule import TINY


def _e4m3fn_grid() -> tuple[np.ndarray, np.ndarray]:
    """Every finite e4m3fn value (sorted, float64) and whether its mantissa's last bit is 0 (for ties)."""
    vals, even = [], []
    for bits in range(128):                     # the sign handled by symmetry
        e, m = bits >> 3, bits & 7
        if e == 15 and m == 7:                  # S.1111.111: NaN
            continue
        v = m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        vals.append(v)
        even.append(m % 2 == 0)
    vals, even = np.array(vals), np.array(even)
    neg = vals[1:]                              # -0 is 0
    order = np.argsort(np.concatenate([-neg, vals]))
    return np.concatenate([-neg, vals])[order], np.concatenate([even[1:], even])[order]


GRID, EVEN = _e4m3fn_grid()


def _round_e4m3(x: np.ndarray) -> np.ndarray:
    """Round to nearest e4m3fn value, ties to the even mantissa; |x| > 448 saturates (the clamp before the cast)."""
    x = np.clip(x.astype(np.float64), -448, 448)
    hi = np.clip(np.searchsorted(GRID, x), 1, len(GRID) - 1)
    lo = hi - 1
    dlo, dhi = x - GRID[lo], GRID[hi] - x
    pick_hi = (dhi < dlo) | ((dhi == dlo) & EVEN[hi])
    return np.where(pick_hi, GRID[hi], GRID[lo])


def np_quantize(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w = w.astype(np.float32)
    scale = (np.abs(w).max(axis=1) / np.float32(448)).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1))
    return _round_e4m3(w / safe[:, None]), scale


def test_grid_is_the_e4m3fn_one():
    assert len(GRID) == 253 and GRID.max() == 448 and GRID.min() == -448   # 2·126 non-zero finite values + 0
    assert GRID[GRID > 0].min() == 2.0 ** -9                              # the smallest subnormal


def test_quantize_matches_numpy_scales_rounding_and_zero_rows():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 40, generator=g)
    w[1] *= 1e-3                       # small rows: the scale makes them use the whole range
    w[2] = 0                           # a zero row: scale 0, no 0/0
    w[3] = 0
    w[3, 7] = -2.5                     # one non-zero element: exactly −448 after scaling
    w[4, :5] = torch.tensor([448.0, 1.0625, 1.1875, -3.0 * 2 ** -10, 2.0 ** -10])  # amax 448: scale exactly 1
    w[4, 5:] = 0.5
    q = quantize_fp8(w)
    want_q, want_s = np_quantize(w.numpy())
    assert q.qweight.dtype == torch.float8_e4m3fn and q.scale.dtype == torch.float32
    assert q.qweight.shape == (6, 40) and q.scale.shape == (6,)
    np.testing.assert_array_equal(q.scale.numpy(), want_s)
    np.testing.assert_array_equal(q.qweight.float().numpy(), want_q)
    # hand-computed: ties to the even mantissa (1.0625 -> 1.0, 1.1875 -> 1.25), subnormal ties (1.5·2^-9 -> 2^-8,
    # 0.5·2^-9 -> 0), the row's largest magnitude at exactly ±448
    assert q.qweight[4, :5].float().tolist() == [448.0, 1.0, 1.25, -2.0 ** -8, 0.0] and q.scale[4] == 1.0
    assert q.qweight[3, 7].float() == -448.0 and q.scale[3] == np.float32(2.5) / np.float32(448)
    assert (q.qweight.float().abs().amax(1)[[0, 1, 3, 4]] == 448).all()
    assert q.scale[2] == 0 and not q.qweight[2].float().any()
    deq = q.dequantize(torch.float32)
    assert torch.isfinite(deq).all() and not deq[2].any()
    np.testing.assert_array_equal(deq.numpy(), (want_q * want_s[:, None]).astype(np.float32))
    assert q.nbytes() == 6 * 40 + 4 * 6


def test_bf16_weights_quantize_as_their_float32_values():
    w = (torch.randn(4, 24, generator=torch.Generator().manual_seed(1)) * 3).to(torch.bfloat16)
    q = quantize_fp8(w)
    want_q, want_s = np_quantize(w.float().numpy())
    np.testing.assert_array_equal(q.qweight.float().numpy(), want_q)
    np.testing.assert_array_equal(q.scale.numpy(), want_s)
    assert q.dequantize(torch.bfloat16).dtype == torch.bfloat16


def test_quantize_refuses_what_is_not_a_float_matrix():
    with pytest.raises(BubblescopeError, match="2-D floating-point"):
        quantize_fp8(torch.ones(3))
    with pytest.raises(BubblescopeError, match="2-D floating-point"):
        quantize_fp8(torch.ones(3, 3, dtype=torch.int32))


def _expected_nbytes(cfg, act_bytes: int, fmt: str) -> int:
    """Bytes of a model in ``fmt`` from its config: projections 1 byte + 4 per output row in FP8."""
    h, q, kv, i, v = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size, cfg.vocab_size
    proj = {"q": (q, h), "k": (kv, h), "v": (kv, h), "o": (h, q), "gate": (i, h), "up": (i, h), "down": (h, i)}
    per_layer = 2 * h * act_bytes + (cfg.head_dim * 2 * act_bytes if cfg.qk_norm else 0) \
        + ((q + 2 * kv) * act_bytes if cfg.attention_bias else 0)
    per_layer += sum(o * n * (1 if fmt != "bf16" else act_bytes) + (4 * o if fmt != "bf16" else 0)
                     for o, n in proj.values())
    head = {"bf16": 0 if cfg.tie_word_embeddings else v * h * act_bytes,
            "fp8": 0 if cfg.tie_word_embeddings else v * h * act_bytes, "fp8-all": v * h + 4 * v}[fmt]
    return v * h * act_bytes + cfg.num_hidden_layers * per_layer + h * act_bytes + head


@pytest.mark.parametrize("name", ["mha-untied", "gqa-tied-llama3", "qwen2-bias", "qwen3-qknorm"])
@pytest.mark.parametrize("fmt", ["bf16", "fp8", "fp8-all"])
def test_formats_count_their_real_bytes_and_keep_embeddings_and_norms(name, fmt):
    cfg = TINY[name]
    w = dummy_weights(cfg, dtype=torch.bfloat16, seed=0).as_format(fmt)
    assert w.weight_format == fmt and w.dtype == torch.bfloat16
    assert w.nbytes() == _expected_nbytes(cfg, 2, fmt)
    layer = w.layers[0]
    assert isinstance(layer.down_proj, QuantizedLinear) == (fmt != "bf16")
    assert layer.input_layernorm.dtype == torch.bfloat16 and w.embed_tokens.dtype == torch.bfloat16
    assert isinstance(w.lm_head, QuantizedLinear) == (fmt == "fp8-all")
    if cfg.tie_word_embeddings and fmt != "fp8-all":
        assert w.lm_head is w.embed_tokens


def test_back_to_bf16_dequantizes_and_fp8_all_to_fp8_unties_nothing():
    cfg = TINY["gqa-tied-llama3"]
    w = dummy_weights(cfg, dtype=torch.float32, seed=2)
    w8 = w.as_format("fp8-all")
    back = w8.as_format("bf16")
    q = w8.layers[1].gate_proj
    assert torch.equal(back.layers[1].gate_proj, q.qweight.float() * q.scale[:, None])
    assert back.lm_head is back.embed_tokens                  # the tied head is the embedding again
    assert w8.as_format("fp8").lm_head is w8.embed_tokens
    assert w8.as_format("fp8-all").layers[0].q_proj is w8.layers[0].q_proj   # already FP8: shared, not redone


def test_weight_format_option_and_load_model():
    assert parse_weight_format(None) is None and parse_weight_format("fp8-all") == "fp8-all"
    with pytest.raises(BubblescopeError, match=r"--weights: unknown weight format 'int4'; use bf16, fp8, fp8-all"):
        parse_weight_format("int4")
    loaded = load_model("tiny-llama", device="cpu", weight_format="fp8")
    assert loaded.weights.weight_format == "fp8" and not loaded.warnings
    with pytest.raises(BubblescopeError, match="--weights"):
        load_model("tiny-llama", device="cpu", weight_format="fp4")


def test_generate_names_the_fp8_weights_and_refuses_a_bad_format_before_loading():
    import io

    from bubblescope.generate_command import generate_text
    from bubblescope.generation import SamplingParams

    lines = []
    generate_text("tiny-llama", SamplingParams(), prompt_ids=[1, 2], max_new_tokens=3, device="cpu", weights="fp8",
                  out=io.StringIO(), say=lines.append)
    assert "dummy weights of tiny-llama in fp8:" in lines[-1]
    with pytest.raises(BubblescopeError, match="--weights: unknown weight format 'fp4'"):
        generate_text("no-such-model", SamplingParams(), prompt_ids=[1], device="cpu", weights="fp4",
                      out=io.StringIO(), say=lines.append)
