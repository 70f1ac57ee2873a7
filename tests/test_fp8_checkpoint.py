"""FP8 checkpoints in the compressed-tensors layout, written here with safetensors: ``<name>.weight`` float8_e4m3fn
(out, in) + ``<name>.weight_scale`` (out, 1), ``quantization_config`` as compressed-tensors writes it for an
FP8-dynamic model (weights: float, 8 bits, channel, symmetric, static; activations: dynamic per token; lm_head
ignored). Loaded, then run by the reference engine against transformers over the dequantized weights; and every
other quantization config refused in one line."""

from __future__ import annotations

import json

import pytest
import torch

from bubblescope.errors import BubblescopeError
from bubblescope.generation import teacher_forced_logits
from bubblescope.models import load_model
from bubblescope.models.config import ModelConfig
from bubblescope.models.quant import QuantizedLinear
from bubblescope.models.weights import load_hf_checkpoint, save_hf_checkpoint
from bubblescope.reference_engine import ReferenceEngine

from .test_fp8_weights import np_quantize

CFG = ModelConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=96, max_position_embeddings=64, tie_word_embeddings=False,
                  name="tiny-fp8")
PROJ = {"self_attn.q_proj": (32, 32), "self_attn.k_proj": (16, 32), "self_attn.v_proj": (16, 32),
        "self_attn.o_proj": (32, 32), "mlp.gate_proj": (48, 32), "mlp.up_proj": (48, 32), "mlp.down_proj": (32, 48)}
FP8_DYNAMIC = {  # the quantization_config of a compressed-tensors FP8-dynamic checkpoint (llm-compressor's output)
    "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
    "global_compression_ratio": 1.5, "ignore": ["lm_head"], "kv_cache_scheme": None, "sparsity_config": {},
    "config_groups": {"group_0": {
        "targets": ["Linear"], "output_activations": None,
        "input_activations": {"dynamic": True, "num_bits": 8, "strategy": "token", "symmetric": True, "type": "float",
                              "group_size": None, "observer": None},
        "weights": {"dynamic": False, "num_bits": 8, "strategy": "channel", "symmetric": True, "type": "float",
                    "group_size": None, "block_structure": None, "actorder": None, "observer": "minmax"}}},
}


def _write(path, qc=FP8_DYNAMIC, scale_dtype=torch.bfloat16, edit=None):
    """A tiny FP8 checkpoint; returns {hf name: dequantized float32 weight} (the numpy reference's)."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(5)
    sd, dense = {}, {}
    h, v = CFG.hidden_size, CFG.vocab_size
    sd["model.embed_tokens.weight"] = torch.randn(v, h, generator=g).to(torch.bfloat16)
    sd["lm_head.weight"] = (torch.randn(v, h, generator=g) / 6).to(torch.bfloat16)
    sd["model.norm.weight"] = (1 + 0.05 * torch.randn(h, generator=g)).to(torch.bfloat16)
    for i in range(CFG.num_hidden_layers):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            sd[f"model.layers.{i}.{norm}.weight"] = (1 + 0.05 * torch.randn(h, generator=g)).to(torch.bfloat16)
        for name, shape in PROJ.items():
            w = torch.randn(*shape, generator=g) / shape[1] ** 0.5
            q, s = np_quantize(w.numpy())
            s = torch.from_numpy(s).to(scale_dtype)                               # stored as compressed-tensors does
            key = f"model.layers.{i}.{name}.weight"
            sd[key] = torch.from_numpy(q).to(torch.float8_e4m3fn)                # on the grid: exact
            sd[key + "_scale"] = s[:, None]
            dense[key] = torch.from_numpy(q).float() * s.float()[:, None]
    if edit:
        edit(sd)
    path.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(path / "model.safetensors"))
    d = CFG.to_hf_dict()
    if qc is not None:
        d["quantization_config"] = qc
    (path / "config.json").write_text(json.dumps(d))
    return {**{k: t.float() for k, t in sd.items() if "proj" not in k}, **dense}


def test_compressed_tensors_fp8_loads_and_matches_transformers_on_the_dequantized_weights(tmp_path):
    transformers = pytest.importorskip("transformers")
    dense = _write(tmp_path / "ckpt")
    w = load_hf_checkpoint(tmp_path / "ckpt", dtype=torch.float32)
    assert w.weight_format == "fp8" and w.dtype == torch.float32 and isinstance(w.lm_head, torch.Tensor)
    q = w.layers[1].up_proj
    assert isinstance(q, QuantizedLinear) and q.scale.dtype == torch.float32 and q.scale.shape == (48,)
    assert torch.equal(q.dequantize(torch.float32), dense["model.layers.1.mlp.up_proj.weight"])
    assert any("dynamically" in n and "weight-only" in n for n in w.notes)
    assert w.nbytes() == (96 * 32 * 2 + 32) * 4 + 2 * (2 * 32 * 4 + sum(o * i + 4 * o for o, i in PROJ.values()))

    d = CFG.to_hf_dict()
    d.pop("architectures")
    hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**d)).eval()
    hf.load_state_dict(dense, strict=True)
    prompt, forced = [1, 7, 42, 5], [9, 33, 2, 71, 15]
    with torch.no_grad():
        want = hf(torch.tensor([prompt + forced])).logits[0, len(prompt) - 1:].float()
    got = teacher_forced_logits(ReferenceEngine(w, max_seq_len=32), prompt, forced)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_weights_option_on_an_fp8_checkpoint(tmp_path):
    dense = _write(tmp_path / "ckpt")
    kept = load_model(str(tmp_path / "ckpt"), device="cpu", dtype=torch.float32)
    assert kept.weights.weight_format == "fp8"
    assert any("weight-only" in n for n in kept.warnings)
    plain = load_model(str(tmp_path / "ckpt"), device="cpu", dtype=torch.float32, weight_format="bf16").weights
    assert plain.weight_format == "bf16"
    assert torch.equal(plain.layers[0].q_proj, dense["model.layers.0.self_attn.q_proj.weight"])
    every = load_model(str(tmp_path / "ckpt"), device="cpu", dtype=torch.float32, weight_format="fp8-all").weights
    assert every.weight_format == "fp8-all" and every.layers[0].q_proj is not None


def test_save_and_load_round_trip_keeps_the_fp8_bytes(tmp_path):
    _write(tmp_path / "ckpt")
    w = load_hf_checkpoint(tmp_path / "ckpt").as_format("fp8-all")
    save_hf_checkpoint(w, tmp_path / "again")
    back = load_hf_checkpoint(tmp_path / "again")
    assert back.weight_format == "fp8-all" and back.nbytes() == w.nbytes()
    for a, b in ((back.lm_head, w.lm_head), (back.layers[1].o_proj, w.layers[1].o_proj)):
        assert torch.equal(a.qweight.view(torch.uint8), b.qweight.view(torch.uint8)) and torch.equal(a.scale, b.scale)


def _group(**weights):
    g = json.loads(json.dumps(FP8_DYNAMIC))
    g["config_groups"]["group_0"]["weights"].update(weights)
    return g


@pytest.mark.parametrize("qc,message", [
    ({"quant_method": "awq", "bits": 4}, "quantization_config quant_method 'awq' is not supported"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "quant_method 'fp8'"),
    ({**FP8_DYNAMIC, "format": "pack-quantized"}, "format 'pack-quantized'"),
    (_group(strategy="tensor"), "weights strategy 'tensor' \\(need 'channel'\\)"),
    (_group(strategy="group", group_size=128), "strategy 'group'"),
    (_group(type="int", num_bits=8), "weights type 'int'"),
    (_group(symmetric=False), "weights symmetric False"),
    ({**FP8_DYNAMIC, "kv_cache_scheme": {"num_bits": 8, "type": "float"}}, "kv_cache_scheme"),
    ({**FP8_DYNAMIC, "quantization_status": "frozen"}, "quantization_status 'frozen'"),
    (json.loads(json.dumps(FP8_DYNAMIC).replace('"dynamic": true', '"dynamic": false')),
     "input_activations with static scales"),
    ("fp8", "quantization_config of type str"),
])
def test_other_quantization_configs_are_refused_in_one_line(tmp_path, qc, message):
    _write(tmp_path / "ckpt", qc=qc)
    with pytest.raises(BubblescopeError, match=message) as e:
        load_hf_checkpoint(tmp_path / "ckpt")
    assert "\n" not in str(e.value) and "config.json" in str(e.value) and "FP8 e4m3 compressed-tensors" in str(e.value)


def test_malformed_fp8_tensors_are_named(tmp_path):
    key = "model.layers.0.mlp.down_proj.weight"
    _write(tmp_path / "a", qc=None)
    with pytest.raises(BubblescopeError, match="has no quantization_config"):
        load_hf_checkpoint(tmp_path / "a")

    def drop_scale(sd):
        del sd[key + "_scale"]
    _write(tmp_path / "b", edit=drop_scale)
    with pytest.raises(BubblescopeError, match=f"{key} is stored in float8_e4m3fn without a {key}_scale"):
        load_hf_checkpoint(tmp_path / "b")

    def bad_scale(sd):
        sd[key + "_scale"] = sd[key + "_scale"][:5]
    _write(tmp_path / "c", edit=bad_scale)
    with pytest.raises(BubblescopeError, match=f"{key}_scale has shape \\(5, 1\\)"):
        load_hf_checkpoint(tmp_path / "c")

    def dense_with_scale(sd):
        sd[key] = sd[key].to(torch.bfloat16)
    _write(tmp_path / "d", edit=dense_with_scale)
    with pytest.raises(BubblescopeError, match="dtype bfloat16, expected float8_e4m3fn"):
        load_hf_checkpoint(tmp_path / "d")

    def static_input_scale(sd):
        sd["model.layers.0.mlp.down_proj.input_scale"] = torch.ones(1)
    _write(tmp_path / "e", edit=static_input_scale)
    with pytest.raises(BubblescopeError, match="does not use: model.layers.0.mlp.down_proj.input_scale"):
        load_hf_checkpoint(tmp_path / "e")

    def nan_scale(sd):
        sd[key + "_scale"][3] = float("nan")
    _write(tmp_path / "f", edit=nan_scale)
    with pytest.raises(BubblescopeError, match="negative or non-finite"):
        load_hf_checkpoint(tmp_path / "f")
