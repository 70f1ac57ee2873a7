"""Hugging Face checkpoints whose layout no engine implements are refused (one line, exit 2), and their supported
neighbours keep loading and agree with transformers' logits. Every checkpoint here is written by transformers'
own ``save_pretrained`` (the independent source), with random weights (its init leaves biases at zero, which
would hide a dropped bias)."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from bubblescope.errors import BubblescopeError, EngineUnavailable  # noqa: E402
from bubblescope.generation import teacher_forced_logits  # noqa: E402
from bubblescope.models import ModelConfig, dummy_weights, load_hf_checkpoint  # noqa: E402
from bubblescope.reference_engine import ReferenceEngine  # noqa: E402

SIZES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=256)
PROMPT, FORCED = [5, 17, 3, 9, 200, 31], [11, 2, 40, 7, 30, 99, 4, 61]  # 14 positions: beyond a window of 4


def _save(tmp_path, name: str, config_cls: str, model_cls: str = "", **fields):
    """A tiny model of transformers' ``config_cls`` with random weights, saved (safetensors) under tmp_path/name."""
    cfg = getattr(transformers, config_cls)(**SIZES, **fields)
    model_cls = model_cls or config_cls.replace("Config", "ForCausalLM")
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(cfg).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in pname else 0.2 * torch.randn_like(p))
    model.save_pretrained(tmp_path / name, safe_serialization=True)
    return tmp_path / name


def _edit_config(path, **changes):
    d = json.loads((path / "config.json").read_text())
    d.update(changes)
    (path / "config.json").write_text(json.dumps(d))


def _assert_agrees_with_transformers(path):
    """Our loader + reference engine against transformers' own load of the same folder, teacher-forced fp32."""
    weights = load_hf_checkpoint(path)
    ours = teacher_forced_logits(ReferenceEngine(weights, max_seq_len=32), PROMPT, FORCED)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([PROMPT + FORCED])).logits[0, len(PROMPT) - 1:]
    err = (ours - ref).abs().max().item()
    assert err < 1e-4, f"max abs logit error {err}"
    return weights


def _diagnose_hf(path, tmp_path):
    from typer.testing import CliRunner

    from bubblescope.cli import app

    return CliRunner().invoke(app, ["diagnose", "model", str(path), "--engines", "hf", "--device", "cpu", "--runs",
                                    "1", "--warmup", "0", "--prompt-len", "4", "--gen-len", "2", "--profile-steps",
                                    "1", "--out", str(tmp_path / "out")])


def _assert_refused(r, message, tmp_path):
    assert r.exit_code == 2 and r.stdout == "" and r.stderr == f"error: {message}\n", (r.exit_code, r.output)
    assert not (tmp_path / "out").exists()


# --- 1. o_proj biases -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("config_cls, model_type", [("LlamaConfig", "llama"), ("Qwen3Config", "qwen3")])
def test_attention_bias_with_an_o_proj_bias_is_refused(tmp_path, config_cls, model_type):
    """LlamaAttention / Qwen3Attention put bias=attention_bias on o_proj as well as q/k/v; the loader dropped the
    o_proj bias (wrong logits, 100 % agreement in diagnose) and the hf engine failed on a meta tensor."""
    path = _save(tmp_path, model_type, config_cls, attention_bias=True)
    from safetensors import safe_open
    with safe_open(str(path / "model.safetensors"), "pt") as fh:
        assert "model.layers.0.self_attn.o_proj.bias" in fh.keys()
    message = (f"{path / 'config.json'}: attention_bias=true (q/k/v and o_proj biases) is not supported for "
               f"model_type {model_type} (only qwen2's q/k/v biases are)")
    _assert_refused(_diagnose_hf(path, tmp_path), message, tmp_path)


def test_qwen2_q_k_v_biases_still_load_and_agree(tmp_path):
    path = _save(tmp_path, "qwen2", "Qwen2Config", tie_word_embeddings=False)
    weights = _assert_agrees_with_transformers(path)
    assert weights.config.attention_bias and weights.layers[0].q_bias.abs().max() > 0.1


def test_mistral_ignores_attention_bias_as_transformers_does(tmp_path):
    """MistralAttention has no biases whatever attention_bias says; the loader expected q/k/v biases."""
    path = _save(tmp_path, "mistral", "MistralConfig", sliding_window=None, attention_bias=True)
    assert json.loads((path / "config.json").read_text())["attention_bias"] is True
    assert not _assert_agrees_with_transformers(path).config.attention_bias


# --- tensors the model does not use ------------------------------------------------------------------------------

def test_tensors_the_model_does_not_use_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file
    path = _save(tmp_path, "llama", "LlamaConfig")
    sd = load_file(path / "model.safetensors")
    for i in range(2):
        sd[f"model.layers.{i}.self_attn.o_proj.bias"] = torch.ones(64)
    save_file(sd, path / "model.safetensors", metadata={"format": "pt"})
    message = (f"{path}: checkpoint holds 2 tensors that model_type llama with this config.json does not use: "
               "model.layers.0.self_attn.o_proj.bias, model.layers.1.self_attn.o_proj.bias")
    _assert_refused(_diagnose_hf(path, tmp_path), message, tmp_path)


def test_tied_checkpoint_storing_lm_head_and_inv_freq_still_loads_and_agrees(tmp_path):
    """A tied model that also stores lm_head.weight (some conversions do) and old rotary inv_freq buffers."""
    from safetensors.torch import load_file, save_file
    path = _save(tmp_path, "tied", "LlamaConfig", tie_word_embeddings=True)
    sd = load_file(path / "model.safetensors")
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()
    sd["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    save_file(sd, path / "model.safetensors", metadata={"format": "pt"})
    weights = _assert_agrees_with_transformers(path)
    assert weights.lm_head is weights.embed_tokens


def test_tied_config_with_a_differing_lm_head_keeps_it_untied_and_warns_as_transformers_does(tmp_path, caplog):
    """tie_word_embeddings: true, and the checkpoint's lm_head.weight differs from the embedding: the loader used
    the embedding as the head. transformers keeps both untied and warns ("both are present in the checkpoints with
    different values, so we will NOT tie them"); logits agree with its load, and the loader warns likewise."""
    import logging

    from safetensors.torch import load_file, save_file

    from bubblescope.models import load_model
    path = _save(tmp_path, "tied", "LlamaConfig", tie_word_embeddings=True)
    sd = load_file(path / "model.safetensors")
    sd["lm_head.weight"] = 0.2 * torch.randn(sd["model.embed_tokens.weight"].shape, generator=torch.Generator()
                                             .manual_seed(1))
    save_file(sd, path / "model.safetensors", metadata={"format": "pt"})
    with caplog.at_level(logging.WARNING):
        weights = _assert_agrees_with_transformers(path)  # transformers' own load: the differing head kept
    assert "will NOT tie them" in caplog.text  # transformers warns (its logger)
    assert torch.equal(weights.lm_head, sd["lm_head.weight"])
    assert torch.equal(weights.embed_tokens, sd["model.embed_tokens.weight"])
    assert not weights.config.tie_word_embeddings
    assert weights.config.num_parameters() == sum(t.numel() for t in sd.values())  # the head counted: two tensors
    note = (f"weights: config.json ties the embeddings (tie_word_embeddings: true) but {path} holds an lm_head.weight "
            "that differs from model.embed_tokens.weight: both are used untied, as transformers does; set "
            "tie_word_embeddings to false to silence this")
    assert load_model(str(path)).warnings == [note]


def test_tied_config_with_an_equal_lm_head_stays_tied_without_a_note(tmp_path):
    from safetensors.torch import load_file, save_file

    from bubblescope.models import load_model
    path = _save(tmp_path, "tied", "LlamaConfig", tie_word_embeddings=True)
    sd = load_file(path / "model.safetensors")
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()
    save_file(sd, path / "model.safetensors", metadata={"format": "pt"})
    loaded = load_model(str(path))
    assert loaded.weights.lm_head is loaded.weights.embed_tokens and loaded.config.tie_word_embeddings
    assert loaded.warnings == []


# --- 2. Qwen sliding window --------------------------------------------------------------------------------------

@pytest.mark.parametrize("config_cls, model_type", [("Qwen2Config", "qwen2"), ("Qwen3Config", "qwen3")])
@pytest.mark.parametrize("layer_types", [True, False], ids=["layer_types", "max_window_layers"])
def test_use_sliding_window_is_refused(tmp_path, config_cls, model_type, layer_types):
    """use_sliding_window=true was accepted and ignored (full attention where transformers slides)."""
    path = _save(tmp_path, model_type, config_cls, use_sliding_window=True, sliding_window=4, max_window_layers=1)
    if not layer_types:  # written by transformers 5; older configs decide by max_window_layers alone
        d = json.loads((path / "config.json").read_text())
        assert d.pop("layer_types") == ["full_attention", "sliding_attention"]
        (path / "config.json").write_text(json.dumps(d))
    message = (f"{path / 'config.json'}: use_sliding_window=true (sliding_window=4 on 1 of 2 layers, from layer 1) "
               f"is not supported for model_type {model_type}")
    _assert_refused(_diagnose_hf(path, tmp_path), message, tmp_path)


def test_sliding_window_without_use_sliding_window_still_loads_and_agrees(tmp_path):
    """Qwen2.5 ships sliding_window set with use_sliding_window false: full attention in transformers."""
    path = _save(tmp_path, "qwen2", "Qwen2Config", tie_word_embeddings=True)
    _edit_config(path, sliding_window=4, use_sliding_window=False, max_window_layers=0)
    _assert_agrees_with_transformers(path)


def test_use_sliding_window_on_no_layer_still_loads_and_agrees(tmp_path):
    path = _save(tmp_path, "qwen3", "Qwen3Config", use_sliding_window=True, sliding_window=4, max_window_layers=2)
    _assert_agrees_with_transformers(path)


def test_use_sliding_window_must_be_a_bool(tmp_path):
    path = _save(tmp_path, "qwen2", "Qwen2Config")
    _edit_config(path, use_sliding_window="false")
    with pytest.raises(BubblescopeError) as info:
        ModelConfig.from_hf_config(path)
    assert str(info.value) == (f"{path / 'config.json'}: config field use_sliding_window must be true, false or "
                               'null, got "false"')


# --- 2b. Mistral's sliding window ---------------------------------------------------------------------------------
# PROMPT + FORCED is 14 positions: with max_position_embeddings=14, a window of 14 cannot hide a key (a query at
# position 13 sees keys 13 - k < 14 back), a window of 13 hides key 0 from the last query.

@pytest.mark.parametrize("window", [None, 14, 15, 10_000])
def test_mistral_window_that_never_binds_loads_and_agrees(tmp_path, window):
    """A Mistral sliding_window at least max_position_embeddings was refused, though attention with it is full
    attention; transformers' own load of the folder applies the window (the independent source)."""
    path = _save(tmp_path, "mistral", "MistralConfig", sliding_window=window, max_position_embeddings=14)
    assert json.loads((path / "config.json").read_text())["sliding_window"] == window
    weights = _assert_agrees_with_transformers(path)
    assert weights.config.model_type == "mistral" and weights.config.max_position_embeddings == 14


@pytest.mark.parametrize("window", [13, 4, 1, 0])
def test_mistral_window_below_the_positions_is_refused(tmp_path, window):
    path = _save(tmp_path, "mistral", "MistralConfig", sliding_window=14, max_position_embeddings=14)
    _edit_config(path, sliding_window=window)
    message = (f"{path / 'config.json'}: Mistral with sliding_window={window} is not supported (below "
               "max_position_embeddings=14, so attention would slide; the engines implement full attention)")
    _assert_refused(_diagnose_hf(path, tmp_path), message, tmp_path)


def test_a_window_one_below_the_positions_does_change_transformers_logits(tmp_path):
    """Why 13 is refused and 14 not: over these 14 positions transformers' window of 13 moves the last logits away
    from full attention (so the agreement test above reaches the window's edge), a window of 14 leaves them."""
    path = _save(tmp_path, "mistral", "MistralConfig", sliding_window=14, max_position_embeddings=14)
    ids = torch.tensor([PROMPT + FORCED])
    logits = {}
    for window in (None, 14, 13):
        _edit_config(path, sliding_window=window)
        hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        with torch.no_grad():
            logits[window] = hf(ids).logits[0]
    assert (logits[14] - logits[None]).abs().max().item() < 1e-5
    assert (logits[13][:-1] - logits[None][:-1]).abs().max().item() < 1e-5  # positions 0-12: nothing hidden yet
    assert (logits[13][-1] - logits[None][-1]).abs().max().item() > 1e-2


@pytest.mark.parametrize("window", ["4096", True, 14.5])
def test_mistral_sliding_window_must_be_an_integer_or_null(tmp_path, window):
    path = _save(tmp_path, "mistral", "MistralConfig", sliding_window=None, max_position_embeddings=14)
    _edit_config(path, sliding_window=window)
    with pytest.raises(BubblescopeError) as info:
        ModelConfig.from_hf_config(path)
    assert str(info.value) == (f"{path / 'config.json'}: config field sliding_window must be an integer or null, "
                               f"got {json.dumps(window)}")


def test_hf_engine_runs_a_mistral_config_with_full_attention_beyond_4096_positions():
    """MistralConfig's sliding_window defaults to 4096 when absent: the hf engine (built from to_hf_dict) slid
    beyond 4096 positions where the config said null and the reference engine attends to every position."""
    from bubblescope.engines import build_engine
    cfg = ModelConfig(**SIZES, model_type="mistral", max_position_embeddings=4200)
    weights = dummy_weights(cfg, seed=1)
    prompt = torch.randint(3, 256, (4150,), generator=torch.Generator().manual_seed(0)).tolist()
    got = teacher_forced_logits(build_engine("hf", weights, 4160), prompt, [7, 9])
    ref = teacher_forced_logits(ReferenceEngine(weights, max_seq_len=4160), prompt, [7, 9])
    assert (got - ref).abs().max().item() < 1e-4


# --- 3. the hf engine on a layout transformers builds differently ------------------------------------------------

@pytest.mark.parametrize("changes, message", [
    (dict(model_type="llama", attention_bias=True), "engine hf: transformers' LlamaForCausalLM has parameters these "
     "weights lack: model.layers.0.self_attn.o_proj.bias, model.layers.1.self_attn.o_proj.bias"),
    (dict(model_type="qwen3", qk_norm=True, attention_bias=True), "engine hf: transformers' Qwen3ForCausalLM has no "
     "parameters for these weights: model.layers.0.self_attn.q_proj.bias, model.layers.0.self_attn.k_proj.bias, "
     "model.layers.0.self_attn.v_proj.bias and 3 more"),
])
def test_hf_engine_refuses_weights_it_would_leave_on_meta_or_drop(changes, message):
    """A programmatic config (q/k/v biases on a Llama) failed in the first forward: "Tensor on device meta"."""
    from bubblescope.engines import build_engine
    with pytest.raises(EngineUnavailable) as info:
        build_engine("hf", dummy_weights(ModelConfig(**SIZES, **changes)), 16)
    assert str(info.value) == message


# --- 4. a bare base model; NaN weights ---------------------------------------------------------------------------

def test_a_bare_base_model_is_refused_naming_what_is_missing(tmp_path):
    path = _save(tmp_path, "base", "LlamaConfig", model_cls="LlamaModel")
    assert json.loads((path / "config.json").read_text())["architectures"] == ["LlamaModel"]
    message = (f"{path}: a bare base model, not a causal LM: its tensor names lack the 'model.' prefix "
               "(embed_tokens.weight, not model.embed_tokens.weight) and it has no lm_head.weight")
    _assert_refused(_diagnose_hf(path, tmp_path), message, tmp_path)


def test_nan_weights_raise_no_all_nan_warning_in_the_interpreted_megakernel():
    """Triton's interpreter computes tl.max with np.nanmax: "RuntimeWarning: All-NaN slice encountered" reached
    the terminal; the loader's note already names the tensor."""
    if torch.cuda.is_available():
        pytest.skip("the interpreted megakernel runs on CPU-only machines")
    from bubblescope.megakernel_engine import MegakernelEngine
    from bubblescope.megakernel_engine.triton_kernel.host import load_kernel
    try:
        load_kernel(True)
    except EngineUnavailable as e:
        pytest.skip(str(e))
    w = dummy_weights(ModelConfig(**SIZES), seed=1)
    w.norm[3] = float("nan")
    eng = MegakernelEngine(w, max_seq_len=16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logits = eng.prefill(torch.tensor(PROMPT[:3]))
        eng.decode(int(PROMPT[3]))
    assert logits.isnan().all()
    assert not [str(c.message) for c in caught if "All-NaN" in str(c.message)]


# --- 5. config fields as transformers 5 reads them ---------------------------------------------------------------

def test_mistral_without_a_sliding_window_key_slides_at_4096_as_mistralconfig_does(tmp_path):
    """MistralConfig's ``sliding_window: int | None = 4096``: a config.json without the key slides at 4096. It was
    read as no window, so a model of 8192 positions ran full attention where transformers slides."""
    path = _save(tmp_path, "mistral", "MistralConfig", sliding_window=None, max_position_embeddings=8192)
    d = json.loads((path / "config.json").read_text())
    del d["sliding_window"]
    (path / "config.json").write_text(json.dumps(d))
    assert transformers.AutoConfig.from_pretrained(path).sliding_window == 4096  # the independent source
    message = (f"{path / 'config.json'}: Mistral with sliding_window=4096 (MistralConfig's default: config.json has "
               "no sliding_window) is not supported (below max_position_embeddings=8192, so attention would slide; "
               "the engines implement full attention)")
    _assert_refused(_diagnose_hf(path, tmp_path), message, tmp_path)
    _edit_config(path, max_position_embeddings=4096)  # the default window never binds within 4096 positions
    cfg = _assert_agrees_with_transformers(path).config
    assert cfg.sliding_window == 4096 and cfg.to_hf_dict()["sliding_window"] == 4096
    assert ModelConfig.from_hf_dict(cfg.to_hf_dict()).sliding_window == 4096


def test_mistral_null_window_round_trips_as_null(tmp_path):
    path = _save(tmp_path, "mistral", "MistralConfig", sliding_window=None, max_position_embeddings=8192)
    cfg = _assert_agrees_with_transformers(path).config
    assert cfg.sliding_window is None and cfg.to_hf_dict()["sliding_window"] is None
    assert transformers.MistralConfig.from_dict(cfg.to_hf_dict()).sliding_window is None


L3 = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}


@pytest.mark.parametrize("changes, theta, scaling", [
    # transformers' convert_rope_params_to_dict: setdefault("rope_theta", <top-level>) on the rope dict
    (dict(rope_theta=10000.0, rope_parameters={"rope_type": "default", "rope_theta": 500.0}), 500.0, None),
    (dict(rope_theta=10000.0, rope_scaling={"rope_type": "default", "rope_theta": 500.0}), 500.0, None),
    # a non-empty rope_scaling replaces rope_parameters whole, its theta included
    (dict(rope_theta=10000.0, rope_scaling={**L3, "original_max_position_embeddings": 4},
          rope_parameters={"rope_type": "default", "rope_theta": 500.0}), 10000.0,
     {**L3, "original_max_position_embeddings": 4}),
    (dict(rope_theta=10000.0, rope_scaling={}, rope_parameters={"rope_type": "default", "rope_theta": 500.0}),
     500.0, None),
    (dict(rope_theta=777.0, rope_parameters={"rope_type": "default"}), 777.0, None),
    # standardize_rope_params: llama3's original_max_position_embeddings defaults to max_position_embeddings (was 8192)
    (dict(rope_theta=500.0, rope_scaling=dict(L3)), 500.0, {**L3, "original_max_position_embeddings": 32}),
    (dict(rope_parameters={**L3, "rope_theta": 300.0}), 300.0, {**L3, "original_max_position_embeddings": 32}),
])
def test_rope_theta_given_twice_follows_transformers(tmp_path, changes, theta, scaling):
    """rope_theta both at the top level and inside rope_parameters / rope_scaling: the top-level one was used,
    transformers uses the inner one (logits off by ~1)."""
    path = _save(tmp_path, "llama", "LlamaConfig", max_position_embeddings=32)
    d = json.loads((path / "config.json").read_text())
    for key in ("rope_theta", "rope_scaling", "rope_parameters"):
        d.pop(key, None)
    d.update(changes)
    (path / "config.json").write_text(json.dumps(d))
    cfg = _assert_agrees_with_transformers(path).config
    assert (cfg.rope_theta, cfg.rope_scaling) == (theta, scaling)
    assert transformers.LlamaConfig.from_dict(cfg.to_hf_dict()).rope_parameters["rope_theta"] == theta


def test_tensor_stored_in_two_shards_is_refused(tmp_path):
    """With two safetensors files holding the same tensor, the later file's copy silently won."""
    from safetensors.torch import load_file, save_file
    path = _save(tmp_path, "llama", "LlamaConfig")
    sd = load_file(path / "model.safetensors")
    (path / "model.safetensors").unlink()
    names = sorted(sd)
    dup = "model.layers.1.self_attn.k_proj.weight"
    first = {k: sd[k] for k in names[:len(names) // 2]} | {dup: sd[dup] * 2}
    second = {k: sd[k] for k in names[len(names) // 2:]}
    assert dup in second
    save_file(first, path / "a.safetensors", metadata={"format": "pt"})
    save_file(second, path / "b.safetensors", metadata={"format": "pt"})
    message = f"{path}: tensor {dup} is stored twice, in a.safetensors and in b.safetensors"
    _assert_refused(_diagnose_hf(path, tmp_path), message, tmp_path)
    # An index naming one shard per tensor does not make the second copy harmless.
    index = {"metadata": {}, "weight_map": {k: "a.safetensors" if k in first else "b.safetensors" for k in names}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    _assert_refused(_diagnose_hf(path, tmp_path), message, tmp_path)
    save_file({k: v for k, v in first.items() if k != dup}, path / "a.safetensors", metadata={"format": "pt"})
    _assert_agrees_with_transformers(path)


@pytest.mark.parametrize("changes, message", [
    (dict(bos_token_id=256), "bos_token_id 256 is outside the vocabulary (vocab_size 256: token ids 0 to 255)"),
    (dict(eos_token_id=[2, 300]), "eos_token_id 300 is outside the vocabulary (vocab_size 256: token ids 0 to 255)"),
    (dict(bos_token_id=-1), "bos_token_id must be a token id (an integer >= 0) or null, got -1"),
    (dict(eos_token_id=[2, -1]), "eos_token_id must be a token id or a list of them, got (2, -1)"),
    (dict(bos_token_id=1.0), "bos_token_id must be a token id (an integer >= 0) or null, got 1.0"),
])
def test_bos_and_eos_outside_the_vocabulary_are_refused(tmp_path, changes, message):
    """transformers only warns (PreTrainedConfig.validate_token_ids); the engines start a prompt with bos (an
    index error in the embedding) and stop at eos (never generated)."""
    path = _save(tmp_path, "llama", "LlamaConfig")
    _edit_config(path, **changes)
    _assert_refused(_diagnose_hf(path, tmp_path), f"{path / 'config.json'}: {message}", tmp_path)


def test_pad_token_id_as_transformers_builds_it(tmp_path):
    """pad_token_id is used by no engine, and Hub configs store -1 (transformers' comment in validate_token_ids),
    which transformers' nn.Embedding(padding_idx=-1) takes; 256 of 256 it cannot build."""
    path = _save(tmp_path, "llama", "LlamaConfig", bos_token_id=255, eos_token_id=[0, 255])
    _edit_config(path, pad_token_id=-1)
    assert _assert_agrees_with_transformers(path).config.eos_token_id == (0, 255)
    _edit_config(path, pad_token_id=256)
    with pytest.raises(AssertionError, match="Padding_idx must be within num_embeddings"):
        transformers.AutoModelForCausalLM.from_pretrained(path)
    message = (f"{path / 'config.json'}: pad_token_id 256 is outside the vocabulary (vocab_size 256: -256 to 255, "
               "as transformers' nn.Embedding(padding_idx=pad_token_id) requires)")
    _assert_refused(_diagnose_hf(path, tmp_path), message, tmp_path)


def test_rope_theta_whose_float32_frequencies_overflow_is_refused(tmp_path):
    path = _save(tmp_path, "llama", "LlamaConfig")
    _edit_config(path, rope_parameters={"rope_type": "default", "rope_theta": 1e-300})  # where transformers 5 reads it
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert hf.model.rotary_emb.inv_freq.isinf().sum() == 7  # transformers' float32 inv_freq: 1 / 0 past i = 0
    cos, _ = hf.model.rotary_emb(torch.zeros(1, 2, 64), torch.arange(2)[None])
    assert cos.isnan().any()  # position * inf: its RoPE rotates by NaN
    message = (f"{path / 'config.json'}: rope_theta 1e-300 is too small: RoPE's inverse frequencies "
               "theta^(-2i/head_dim) overflow float32 (non-finite) for head_dim 16")
    _assert_refused(_diagnose_hf(path, tmp_path), message, tmp_path)
    _edit_config(path, rope_parameters={"rope_type": "default", "rope_theta": 0.5})  # below 1, finite: loads
    _assert_agrees_with_transformers(path)


@pytest.mark.parametrize("config_cls, model_type", [("Qwen2Config", "qwen2"), ("Qwen3Config", "qwen3")])
@pytest.mark.parametrize("kinds", [["full_attention"], ["full_attention"] * 3])
def test_layer_types_of_another_length_are_refused(tmp_path, config_cls, model_type, kinds):
    """transformers 5 raises "`num_hidden_layers` (2) must be equal to the number of `layer_types` (1)"
    (PreTrainedConfig.validate_layer_type); the loader read the first entries and ran."""
    path = _save(tmp_path, model_type, config_cls)
    _edit_config(path, layer_types=kinds, use_sliding_window=True, sliding_window=4)
    with pytest.raises(Exception, match="must be equal to the number of `layer_types`"):
        transformers.AutoConfig.from_pretrained(path)
    message = (f"{path / 'config.json'}: config field layer_types has {len(kinds)} entries, but num_hidden_layers is 2 "
               "(transformers requires one per layer)")
    _assert_refused(_diagnose_hf(path, tmp_path), message, tmp_path)
    _edit_config(path, layer_types=["full_attention"] * 2)
    _assert_agrees_with_transformers(path)


def test_llama_without_rms_norm_eps_uses_transformers_default(tmp_path):
    """LlamaConfig's rms_norm_eps defaults to 1e-6 (as Mistral's and Qwen's do); the loader took 1e-5. Small
    embeddings (mean square ~1e-5) make the difference show in the logits."""
    from safetensors.torch import load_file, save_file
    path = _save(tmp_path, "llama", "LlamaConfig")
    sd = load_file(path / "model.safetensors")
    sd["model.embed_tokens.weight"] = sd["model.embed_tokens.weight"] * 0.015
    save_file(sd, path / "model.safetensors", metadata={"format": "pt"})
    d = json.loads((path / "config.json").read_text())
    del d["rms_norm_eps"]
    (path / "config.json").write_text(json.dumps(d))
    assert transformers.AutoConfig.from_pretrained(path).rms_norm_eps == 1e-6
    weights = _assert_agrees_with_transformers(path)
    assert weights.config.rms_norm_eps == 1e-6
    # The old default moves these logits beyond the tolerance (so the check above can fail).
    old = type(weights)(weights.config.replace(rms_norm_eps=1e-5), weights.embed_tokens, weights.layers, weights.norm,
                        weights.lm_head)
    ours, theirs = (teacher_forced_logits(ReferenceEngine(w, max_seq_len=32), PROMPT, FORCED) for w in (weights, old))
    assert (ours - theirs).abs().max().item() > 1e-3
