"""Configs, presets, loaders and tokenizers, including bad inputs of each kind."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bubblescope.errors import BubblescopeError
from bubblescope.models import ModelConfig, dummy_weights, get_preset, load_hf_checkpoint
from bubblescope.models.tokenizer import HFTokenizer, Llama2cTokenizer
from bubblescope.models.weights import save_hf_checkpoint

from .conftest import ROOT, STORIES, STORIES_TOK, needs_stories

TINY = ModelConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=64, max_position_embeddings=128, name="t")


def test_presets_match_public_configs():
    # Values from the public config.json files (meta-llama/Llama-3.2-1B, Qwen/Qwen3-0.6B) and parameter
    # counts from their model cards: Llama-3.2-1B 1.24 B, Qwen3-0.6B 0.6 B (0.44 B non-embedding).
    l1 = get_preset("llama-3.2-1b")
    assert (l1.hidden_size, l1.intermediate_size, l1.num_hidden_layers, l1.num_attention_heads,
            l1.num_key_value_heads, l1.head_dim, l1.vocab_size, l1.rope_theta, l1.rms_norm_eps,
            l1.tie_word_embeddings) == (2048, 8192, 16, 32, 8, 64, 128256, 500000.0, 1e-5, True)
    assert l1.rope_scaling == {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    assert round(l1.num_parameters() / 1e9, 2) == 1.24
    q = get_preset("qwen3-0.6b")
    assert (q.hidden_size, q.intermediate_size, q.num_hidden_layers, q.num_attention_heads,
            q.num_key_value_heads, q.head_dim, q.vocab_size, q.rope_theta, q.rms_norm_eps,
            q.tie_word_embeddings, q.qk_norm) == (1024, 3072, 28, 16, 8, 128, 151936, 1e6, 1e-6, True, True)
    assert round((q.num_parameters() - q.vocab_size * q.hidden_size) / 1e9, 2) == 0.44


def test_hf_config_round_trip_through_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    for name in ("llama-3.2-1b", "qwen2.5-0.5b", "qwen3-0.6b"):
        cfg = get_preset(name)
        (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
        hf = transformers.AutoConfig.from_pretrained(tmp_path)
        assert hf.num_key_value_heads == cfg.num_key_value_heads and hf.vocab_size == cfg.vocab_size
        back = ModelConfig.from_hf_config(tmp_path / "config.json")
        assert back.replace(name=cfg.name) == cfg


def test_every_preset_is_a_config_transformers_accepts_without_a_warning():
    """transformers checks a config as it builds it and logs what it finds wrong: tiny-llama's llama3 rope had
    original_max_position_embeddings 8192 = max_position_embeddings, which every run with the hf engine printed."""
    transformers = pytest.importorskip("transformers")
    from bubblescope.libwarnings import library_warnings, notes
    from bubblescope.models.config import PRESETS

    for name, cfg in PRESETS.items():
        d, digest = cfg.to_hf_dict(), cfg.config_sha256()
        with library_warnings() as caught:
            transformers.AutoConfig.for_model(d.pop("model_type"), **d)
        assert notes(caught) == [], name
        # transformers adds rope_theta to the rope dict it is given: the preset's own must stay as it was
        assert cfg.config_sha256() == digest and "rope_theta" not in (cfg.rope_scaling or {}), name


def test_sharded_checkpoint_and_missing_tensor(tmp_path):
    transformers = pytest.importorskip("transformers")
    w = dummy_weights(TINY, seed=1)
    d = TINY.to_hf_dict()
    d.pop("architectures")
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**d))
    hf.load_state_dict(w.hf_state_dict(), strict=False)
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="20KB", safe_serialization=True)
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    back = load_hf_checkpoint(tmp_path / "sharded")
    assert torch.equal(back.layers[1].down_proj, w.layers[1].down_proj)

    save_hf_checkpoint(w, tmp_path / "one")
    from safetensors.torch import load_file, save_file
    sd = load_file(tmp_path / "one" / "model.safetensors")
    del sd["model.layers.1.mlp.up_proj.weight"]
    save_file(sd, tmp_path / "one" / "model.safetensors")
    with pytest.raises(BubblescopeError, match=r"missing tensor model\.layers\.1\.mlp\.up_proj\.weight"):
        load_hf_checkpoint(tmp_path / "one")


def test_unsupported_architecture_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    with pytest.raises(BubblescopeError, match="unsupported architecture 'GPT2LMHeadModel'"):
        ModelConfig.from_hf_config(tmp_path)


def test_dummy_weights_are_seeded_and_typed():
    a, b = dummy_weights(TINY, dtype=torch.bfloat16, seed=5), dummy_weights(TINY, dtype=torch.bfloat16, seed=5)
    assert torch.equal(a.layers[0].q_proj, b.layers[0].q_proj) and a.dtype == torch.bfloat16
    assert not torch.equal(a.layers[0].q_proj, dummy_weights(TINY, seed=6).layers[0].q_proj.bfloat16())
    assert a.lm_head is a.embed_tokens if TINY.tie_word_embeddings else True
    # std of a projection ~ 1/sqrt(in_features)
    big = dummy_weights(get_preset("tiny-llama"), seed=0)
    std = big.layers[0].down_proj.float().std().item()
    assert abs(std - get_preset("tiny-llama").intermediate_size ** -0.5) < 0.01


@needs_stories
def test_llama2c_tokenizer_round_trip_and_known_ids():
    tok = Llama2cTokenizer(STORIES_TOK, 512)
    for text in ["Once upon a time, there was a little girl.", "héllo wörld ✓ 日本", "  two  spaces", "", "a\nb"]:
        assert tok.decode(tok.encode(text)) == text
    # byte fallback: '✓' is not a piece, so it is three byte tokens <0xE2><0x9C><0x93> = byte + 3
    ids = tok.encode("✓", bos=False)
    assert ids[-3:] == [0xE2 + 3, 0x9C + 3, 0x93 + 3]
    assert tok.encode("hi", bos=True)[0] == 1


def test_hf_tokenizer_round_trip(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
    t = Tokenizer(models.BPE(unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(["the cat sat on the mat"] * 50, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    t.save(str(tmp_path / "tokenizer.json"))
    tok = HFTokenizer(tmp_path / "tokenizer.json", bos_token_id=1)
    ids = tok.encode("the cat sat on the mat")
    assert ids[0] == 1 and len(ids) < 10 and tok.decode(ids) == "the cat sat on the mat"


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "bubblescope", *args], capture_output=True, text=True,
                          cwd=cwd or ROOT, timeout=300)


@pytest.mark.parametrize("args,needle", [
    (["generate", "/no/such/path.bin"], "no such file"),
    (["generate", "{tmp}"], "has no config.json"),
    (["generate", "{tmp}/gpt2"], "unsupported architecture 'GPT2LMHeadModel'"),
    (["generate", "{tmp}/short.bin"], "expected"),
    (["generate", "tiny-llama", "--device", "cuda"], "no CUDA GPU"),
    (["generate", "no-such-preset"], "known presets: llama-3.2-1b"),
    (["generate", "tiny-llama", "--prompt-ids", "1,2,3", "--max-new-tokens", "70000"], "exceed the model's"),
    (["generate", "tiny-llama", "--engine", "nope"], "known engines: reference"),
    (["generate", "tiny-llama", "--max-new-tokens", "0"], "Invalid value for '--max-new-tokens'"),
    (["diagnose", "model", "--runs", "abc"], "Invalid value for '--runs'"),
])
def test_bad_inputs_one_line_exit_2(tmp_path, args, needle):
    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("a GPU is present")
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"],
                                                                 "model_type": "gpt2"}))
    # a llama2.c header (dim 8, hidden 16, 1 layer, 2 heads, 2 kv heads, vocab 10, seq 4) and too few floats
    (tmp_path / "short.bin").write_bytes(struct.pack("<7i", 8, 16, 1, 2, 2, 10, 4) + b"\0" * 100)
    r = _cli(*[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_model_search_dirs_name_each_directory_once(monkeypatch):
    """Run from the checkout, ../shared/models and the one beside the checkout are the same directory: the note
    said "searched ../shared/models, /…/shared/models"."""
    from bubblescope.models.loader import model_search_dirs

    monkeypatch.delenv("BUBBLESCOPE_MODELS", raising=False)
    monkeypatch.chdir(ROOT)
    assert model_search_dirs() == [Path("../shared/models")]
    monkeypatch.setenv("BUBBLESCOPE_MODELS", os.pathsep.join(["/opt/m", "/opt/m/", str(ROOT.parent / "shared/models")]))
    assert model_search_dirs() == [Path("/opt/m"), ROOT.parent / "shared/models"]


def test_generate_without_the_stories_file_says_where_it_looked(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    import bubblescope.models.loader as loader
    from bubblescope.cli import app
    monkeypatch.setattr(loader, "model_search_dirs", lambda: [tmp_path / "models"])
    r = CliRunner().invoke(app, ["generate", "stories260k", "--prompt", "Once", "--max-new-tokens", "2"])
    assert r.exit_code == 2
    assert "stories260k's weights file was not found (searched " + str(tmp_path / "models") in r.output
    assert "set BUBBLESCOPE_MODELS" in r.output


@needs_stories
def test_generate_cli_prints_story_and_timing():
    r = _cli("generate", str(STORIES), "--prompt", "Once upon a time", "--max-new-tokens", "40")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Once upon a time") and len(r.stdout.split()) > 20
    assert "ms/token" in r.stderr and "TTFT" in r.stderr


@needs_stories
def test_prompt_longer_than_cache():
    r = _cli("generate", str(STORIES), "--prompt", "Once upon a time " * 200, "--max-new-tokens", "5")
    assert r.returncode == 2 and "exceed the model's 512 positions" in r.stderr


_GOOD_CFG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
             "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "vocab_size": 256, "max_position_embeddings": 512}


@pytest.mark.parametrize("changes, message", [
    ({"hidden_size": "abc"}, "config field hidden_size must be an integer, got 'abc'"),
    ({"hidden_size": None}, "config field hidden_size must be an integer, got None"),
    ({"hidden_size": 64.5}, "config field hidden_size must be an integer, got 64.5"),
    ({"hidden_size": True}, "config field hidden_size must be an integer, got True"),
    ({"num_attention_heads": 0}, "num_attention_heads must be a positive integer, got 0"),
    ({"model_type": ["llama"]}, "unsupported architecture 'LlamaForCausalLM' (model_type ['llama'])"),
    ({"architectures": "GPT2", "model_type": "gpt2"}, "unsupported architecture 'gpt2' (model_type 'gpt2')"),
    ({"rope_theta": "abc"}, "config field rope_theta must be a finite number, got 'abc'"),
    ({"rope_theta": -1}, "rope_theta must be a finite number > 0, got -1.0"),
    ({"rms_norm_eps": "x"}, "config field rms_norm_eps must be a finite number, got 'x'"),
    ({"eos_token_id": "abc"}, "eos_token_id must be a token id or a list of them, got 'abc'"),
    ({"eos_token_id": [{}]}, "eos_token_id must be a token id or a list of them, got ({},)"),
    ({"bos_token_id": "x"}, "bos_token_id must be a token id (an integer >= 0) or null, got 'x'"),
    ({"rope_scaling": "llama3"}, "rope_scaling must be an object or null, got 'llama3'"),
    ({"rope_scaling": {"rope_type": "llama3"}}, "llama3 rope_scaling.factor must be a finite number > 0, got None"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": "x"}}, "rope_scaling.factor must be a finite number > 0"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 4}},
     "llama3 rope_scaling.high_freq_factor 4 must exceed low_freq_factor 4"),
    ({"rope_parameters": [1]}, "rope_parameters must be an object or null, got [1]"),
    # bool("false") is True: these flipped the weight layout silently.
    ({"tie_word_embeddings": "false"}, 'config field tie_word_embeddings must be true, false or null, got "false"'),
    ({"attention_bias": 1}, "config field attention_bias must be true, false or null, got 1"),
    ({"mlp_bias": "no"}, 'config field mlp_bias must be true, false or null, got "no"'),
    # transformers derives these only when absent or null; an explicit 0 used to be replaced silently.
    ({"num_key_value_heads": 0}, "num_key_value_heads must be a positive integer, got 0"),
    ({"head_dim": 0}, "config field head_dim must be a positive integer or null, got 0"),
    ({"head_dim": -16}, "config field head_dim must be a positive integer or null, got -16"),
    # 64 / 3 heads: transformers' attention needs hidden_size = heads * head_dim without a head_dim field.
    ({"num_attention_heads": 3, "num_key_value_heads": 3},
     "hidden_size 64 is not divisible by num_attention_heads 3 and no head_dim is given"),
    ({"num_attention_heads": 3, "num_key_value_heads": 3, "head_dim": None},
     "hidden_size 64 is not divisible by num_attention_heads 3 and no head_dim is given"),
])
def test_bad_config_values_are_one_line_errors(tmp_path, changes, message):
    """Each of these raised ValueError, TypeError, KeyError, AttributeError or ZeroDivisionError (a
    traceback), or ran with NaN RoPE frequencies, before the fields were checked."""
    (tmp_path / "config.json").write_text(json.dumps({**_GOOD_CFG, **changes}))
    with pytest.raises(BubblescopeError) as info:
        ModelConfig.from_hf_config(tmp_path)
    assert message in str(info.value) and "\n" not in str(info.value)
    # The file to fix is named, not the model folder (QA finding).
    assert str(info.value).startswith(f"{tmp_path / 'config.json'}: "), str(info.value)


def test_heads_not_dividing_hidden_size_with_explicit_head_dim_is_accepted(tmp_path):
    # Qwen3-0.6B style: 1024 hidden, 16 heads of 128 (q_size 2048 != hidden_size) is valid with head_dim given.
    (tmp_path / "config.json").write_text(json.dumps({**_GOOD_CFG, "num_attention_heads": 3,
                                                      "num_key_value_heads": 3, "head_dim": 16}))
    cfg = ModelConfig.from_hf_config(tmp_path)
    assert (cfg.head_dim, cfg.q_size) == (16, 48)


def test_heads_not_dividing_hidden_size_exit_2_nothing_written(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({**_GOOD_CFG, "num_attention_heads": 3,
                                                            "num_key_value_heads": 3}))
    out = tmp_path / "out"
    r = _cli("diagnose", "model", str(tmp_path / "m"), "--out", str(out))
    assert r.returncode == 2 and r.stdout == "", r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {tmp_path / 'm' / 'config.json'}: ")
    assert lines[0].endswith("hidden_size 64 is not divisible by num_attention_heads 3 and no head_dim is given")
    assert not out.exists()


@pytest.mark.parametrize("key", ["torch_dtype", "dtype"])
@pytest.mark.parametrize("value", ["float99", "auto", "bfloat16", "float16", None])
def test_config_dtype_field_is_checked_as_transformers_reads_it(tmp_path, key, value):
    """transformers' PretrainedConfig resolves torch_dtype / dtype with getattr(torch, value): "float99" and
    "auto" fail there, so they are one-line errors naming the file, the field and the allowed values here."""
    transformers = pytest.importorskip("transformers")
    (tmp_path / "config.json").write_text(json.dumps({**_GOOD_CFG, key: value}))
    try:
        transformers.AutoConfig.from_pretrained(tmp_path)
        hf_ok = True
    except AttributeError:
        hf_ok = False
    if hf_ok:
        assert ModelConfig.from_hf_config(tmp_path).hidden_size == 64
        return
    with pytest.raises(BubblescopeError) as info:
        ModelConfig.from_hf_config(tmp_path)
    assert str(info.value) == (f"{tmp_path / 'config.json'}: config field {key} must be a torch dtype name "
                               f"(float32, float16, bfloat16, float64, ... as transformers reads it) or null, "
                               f"got {json.dumps(value)}")


@pytest.mark.parametrize("value", [5, ["bfloat16"]])
def test_config_dtype_of_wrong_json_type_is_refused(tmp_path, value):
    (tmp_path / "config.json").write_text(json.dumps({**_GOOD_CFG, "torch_dtype": value}))
    with pytest.raises(BubblescopeError, match=r"config field torch_dtype must be a torch dtype name"):
        ModelConfig.from_hf_config(tmp_path)


def test_bad_config_dtype_exit_2_nothing_written(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({**_GOOD_CFG, "torch_dtype": "float99"}))
    out = tmp_path / "out"
    r = _cli("diagnose", "model", str(tmp_path / "m"), "--out", str(out), "--engines", "reference")
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'm' / 'config.json'}: config field torch_dtype must be a torch dtype name (float32, "
        "float16, bfloat16, float64, ... as transformers reads it) or null, got \"float99\""]
    assert not out.exists()


def test_integral_floats_in_config_are_refused_as_transformers_does(tmp_path):
    """64.0 was accepted as 64; transformers 5's @strict LlamaConfig refuses it ("Field 'hidden_size' expected int,
    got float"), so the hf engine could not build what the other engines ran."""
    d = {**_GOOD_CFG, "hidden_size": 64.0, "head_dim": None}
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(BubblescopeError) as info:
        ModelConfig.from_hf_config(tmp_path)
    assert str(info.value) == f"{tmp_path / 'config.json'}: config field hidden_size must be an integer, got 64.0"
    transformers = pytest.importorskip("transformers")  # the independent source, where it is installed
    with pytest.raises(Exception, match="hidden_size"):
        transformers.LlamaConfig.from_dict(d)


def test_weights_beyond_memory_are_refused_before_allocating():
    cfg = TINY.replace(hidden_size=1 << 20, intermediate_size=1 << 22, vocab_size=1 << 20)
    with pytest.raises(BubblescopeError, match=r"model config t: its weights need [\d,.]+ GiB in float32, more "
                                               r"than the [\d,.]+ GiB of cpu memory"):
        dummy_weights(cfg)


@pytest.mark.parametrize("weight_map, message", [
    ([1, 2], "weight_map is not an object"),
    ({"a": 5}, "shard 5 is not a file name in the checkpoint directory"),
    ({"a": [1]}, "shard [1] is not a file name in the checkpoint directory"),
    ({"a": "../../model.safetensors"}, "shard '../../model.safetensors' is not a file name"),
])
def test_bad_safetensors_index(tmp_path, weight_map, message):
    save_hf_checkpoint(dummy_weights(TINY), tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(BubblescopeError) as info:
        load_hf_checkpoint(tmp_path)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_integer_weights_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file
    save_hf_checkpoint(dummy_weights(TINY), tmp_path)
    sd = load_file(tmp_path / "model.safetensors")
    sd["model.layers.0.mlp.up_proj.weight"] = (sd["model.layers.0.mlp.up_proj.weight"] * 100).to(torch.int32)
    save_file(sd, tmp_path / "model.safetensors")
    with pytest.raises(BubblescopeError, match=r"tensor model\.layers\.0\.mlp\.up_proj\.weight has dtype int32, "
                                               "expected a floating-point dtype"):
        load_hf_checkpoint(tmp_path)


@pytest.mark.parametrize("args, message", [
    (["generate", "tiny-llama", "--seed", str(10**23)], "error: --seed: must fit in 64 bits"),
    (["generate", "tiny-llama", "--prompt", "\udcff\udcfe"], "error: --prompt: not valid UTF-8 text"),
    (["diagnose", "model", "tiny-llama", "--engines", ",,"], "error: --engines: no engine names in ',,'"),
    # top-p 0 keeps no token (an error, not a traceback); a non-UTF-8 --out must not break trace export.
    (["generate", "tiny-llama", "--temperature", "1", "--top-p", "0"], "error: --top-p: must be in (0, 1]"),
    (["diagnose", "model", "tiny-llama", "--engines", "reference", "--out", "{tmp}/\udcff"],
     "error: --out: path '{tmp}/?' is not valid UTF-8"),
    (["generate", "tiny-llama", "--prompt", "hi", "--prompt-ids", "1,2"],
     "error: --prompt and --prompt-ids: give one of them, not both"),
    # were "--prompt: empty prompt and the model has no BOS token" and ".: directory has no config.json"
    (["generate", "tiny-llama", "--prompt-ids", ""], "error: --prompt-ids: no token ids in ''"),
    (["generate", "", "--prompt-ids", "1"], "error: MODEL: empty; give a preset name or a path"),
    (["diagnose", "model", "tiny-llama", "--checkpoint", " ", "--engines", "reference"],
     "error: --checkpoint: empty; give a preset name or a path"),
    (["diagnose", "model", "tiny-llama", "--engines", "reference", "--out", "{tmp}/file"],
     "error: --out {tmp}/file: cannot create the output directory (Not a directory)"),
    (["diagnose", "model", "tiny-llama", "--engines", "reference", "--out", "{tmp}/taken"],
     "error: --out {tmp}/taken: {tmp}/taken/results.json exists and is not a regular file"),
])
def test_cli_option_errors_are_one_line(tmp_path, args, message):
    """Each of these was a traceback (the --out ones only after the model was built or measured). The
    prompt is what Python makes of undecodable argv bytes: lone surrogates."""
    from typer.testing import CliRunner

    from bubblescope.cli import app

    def fill(text: str) -> str:
        return text.replace("{tmp}", str(tmp_path))

    (tmp_path / "file").write_text("x")
    (tmp_path / "taken" / "results.json").mkdir(parents=True)
    r = CliRunner().invoke(app, [fill(a) for a in args] + ["--gen-len", "4"] * (args[0] == "diagnose"))
    assert r.exit_code == 2 and r.stderr.strip().splitlines() == [r.stderr.strip()], r.output
    assert r.stderr.startswith(fill(message)) and r.stdout == ""
    assert sorted(p.name for p in (tmp_path / "taken").iterdir()) == ["results.json"]


@pytest.mark.parametrize("where", ["under a file", "read-only"])
def test_an_unwritable_out_is_refused_before_the_model_is_loaded(tmp_path, monkeypatch, where):
    """`diagnose model --out DIR` with DIR not creatable was refused only when the staging folder was made: after
    the model was loaded (minutes for a large checkpoint) and, on a GPU, the copy bandwidth measured."""
    import os

    from typer.testing import CliRunner

    import bubblescope.diagnosis.run as dg
    from bubblescope.cli import app

    if where == "under a file":
        (tmp_path / "file").write_text("x")
        out, why = tmp_path / "file" / "sub", f"{tmp_path / 'file'} is not a directory"
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only directory")
        (tmp_path / "ro").mkdir(mode=0o555)
        out, why = tmp_path / "ro" / "sub", "Permission denied"
    monkeypatch.setattr(dg, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    r = CliRunner().invoke(app, ["diagnose", "model", "tiny-llama", "--engines", "reference", "--device", "cpu",
                                 "--out", str(out)])
    assert r.exit_code == 2, r.output
    assert r.stderr == f"error: --out {out}: cannot create the output directory ({why})\n" and r.stdout == ""
    assert not out.exists()


def test_a_checkpoint_that_is_not_model_says_model_was_ignored(tmp_path):
    """`diagnose model llama-3.2-1b --checkpoint ck` measured ck's model without a word (the report named ck);
    `diagnose model --checkpoint ck` noted "none given; measured the default stories260k" for it. A preset of
    the checkpoint's shapes (its real weights, what --checkpoint is for) or the same path stays silent."""
    from typer.testing import CliRunner

    from bubblescope.cli import app
    from bubblescope.diagnosis import diagnose
    from bubblescope.models import load_model

    ck = str(tmp_path / "ck")
    save_hf_checkpoint(dummy_weights(get_preset("tiny-llama")), ck)
    other = (f"model: MODEL llama-3.2-1b ignored: --checkpoint {ck} holds ck (0.824 M parameters), not "
             "llama-3.2-1b's shapes (1.24 B parameters); the checkpoint was loaded")
    assert load_model("llama-3.2-1b", checkpoint=ck).warnings == [other]
    assert load_model("nope", checkpoint=ck).warnings == [
        f"model: MODEL nope ignored: --checkpoint {ck} (ck) was loaded in its place"]
    assert load_model("tiny-llama", checkpoint=ck).warnings == load_model(ck, checkpoint=ck).warnings == []
    r = CliRunner().invoke(app, ["generate", "llama-3.2-1b", "--checkpoint", ck, "--prompt-ids", "1",
                                 "--max-new-tokens", "2", "--device", "cpu"])
    assert r.exit_code == 0 and r.stderr.count(f"warning: {other}\n") == 1, r.output
    for model, expected in ((None, []), ("llama-3.2-1b", [other])):
        doc = diagnose(model, checkpoint=ck, engines=["reference"], prompt_len=4, gen_len=3, runs=1, warmup=0,
                       profile_steps=2, device="cpu", write=False).doc
        assert [n for n in doc["device"]["notes"] if n.startswith("model:")] == expected
        assert (doc["model"]["name"], doc["model"]["path"]) == ("ck", ck)


def test_non_finite_weights_are_warned_about(tmp_path):
    """NaN weights generated garbage silently; the warning names the tensor and counts its NaN/Inf elements
    (here 2 set by hand), in `generate` (stderr) and in diagnose's notes."""
    from safetensors.torch import load_file, save_file
    from typer.testing import CliRunner

    from bubblescope.cli import app
    from bubblescope.models import load_model
    save_hf_checkpoint(dummy_weights(TINY), tmp_path)
    sd = load_file(tmp_path / "model.safetensors")
    w = sd["model.layers.1.mlp.down_proj.weight"]
    w[0, 0], w[3, 5] = float("nan"), float("inf")
    save_file(sd, tmp_path / "model.safetensors")
    expected = (f"weights: 1 tensor holds NaN or Inf values (model.layers.1.mlp.down_proj.weight: 2 of {w.numel()}); "
                "logits and generated text will be garbage")
    assert load_model(str(tmp_path)).warnings == [expected]
    assert load_model("tiny-llama").warnings == []
    r = CliRunner().invoke(app, ["generate", str(tmp_path), "--prompt-ids", "1,2", "--max-new-tokens", "2"])
    assert r.exit_code == 0 and f"warning: {expected}\n" in r.stderr


@pytest.mark.parametrize("data", [b"", b"\x01\x02\x03"])
def test_a_tokenizer_file_too_short_for_its_header_is_a_one_line_error(tmp_path, data):
    """An empty (or 3-byte) tokenizer.bin raised UnboundLocalError (a traceback) instead of the truncation
    error: the header's 4 bytes were read before the offset the message names was set."""
    (tmp_path / "tok.bin").write_bytes(data)
    with pytest.raises(BubblescopeError) as info:
        Llama2cTokenizer(tmp_path / "tok.bin")
    assert str(info.value) == f"{tmp_path / 'tok.bin'}: not a llama2.c tokenizer file (truncated at byte 0)"
    r = _cli("generate", "tiny-llama", "--tokenizer", str(tmp_path / "tok.bin"), "--prompt", "hi")
    assert r.returncode == 2 and r.stderr.strip() == f"error: {info.value}" and r.stdout == ""


def _tiny_llama2c(path):
    """A llama2.c v0 checkpoint: dim 8, hidden 16, 1 layer, 2 heads, 2 kv heads, vocab 10 (shared), seq_len 4."""
    n = 10 * 8 + 8 + 4 * 8 * 8 + 8 + 3 * 16 * 8 + 8 + 2 * 4 * 2
    floats = torch.randn(n, generator=torch.Generator().manual_seed(0)) * 0.3
    path.write_bytes(struct.pack("<7i", 8, 16, 1, 2, 2, 10, 4) + floats.numpy().astype("<f4").tobytes())
    return path


@pytest.mark.parametrize("name", ["tok4096.bin", "tokens.bin"])
def test_another_file_beside_a_llama2c_bin_does_not_fail_a_prompt_ids_run(tmp_path, name):
    """Any tok*.bin beside the weights was loaded as the tokenizer, and an unrelated one failed even a
    --prompt-ids run, which needs no tokenizer. Only tok{vocab_size}.bin and tokenizer.bin are looked for."""
    from bubblescope.models import load_model
    model = _tiny_llama2c(tmp_path / "m.bin")
    (tmp_path / name).write_bytes(b"\x01\x02\x03")
    loaded = load_model(str(model))
    assert loaded.tokenizer is None and loaded.warnings == []
    r = _cli("generate", str(model), "--prompt-ids", "1,2", "--max-new-tokens", "1")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    r = _cli("generate", str(model), "--prompt", "hi")
    assert r.returncode == 2 and r.stderr.strip().endswith(
        "error: --prompt: this model has no tokenizer; pass --tokenizer or use --prompt-ids"), r.stderr
    with pytest.raises(BubblescopeError, match="truncated at byte 0"):  # named explicitly: its error is the run's
        load_model(str(model), tokenizer=str(tmp_path / name))


def _llama2c_tokenizer_bytes(pieces: list[bytes]) -> bytes:
    """A llama2.c tokenizer file as its exporter writes it: int32 max_token_length, then per token float32
    score, int32 length, the bytes."""
    out = struct.pack("<i", max(map(len, pieces)))
    for i, piece in enumerate(pieces):
        out += struct.pack("<fi", -float(i), len(piece)) + piece
    return out


@pytest.mark.parametrize("name, cut", [("tok10.bin", "header"), ("tokenizer.bin", "inside a token"),
                                       ("tok10.bin", "between tokens")])
def test_a_cut_short_llama2c_tokenizer_beside_the_model_is_refused(tmp_path, name, cut):
    """A tokenizer file cut short (an interrupted download) was taken as "not loaded", a warning, and the run
    went on; it is a damaged input and is refused in one line, found beside the model or named. Cut between two
    tokens, only the count the model expects tells (the format stores none)."""
    from bubblescope.models import load_model
    model = _tiny_llama2c(tmp_path / "m.bin")
    # 4 header bytes, then <unk> 8 + 5, <s> 8 + 3, </s> 8 + 4 and seven one-letter tokens 8 + 1 each: 103 bytes
    whole = _llama2c_tokenizer_bytes([b"<unk>", b"<s>", b"</s>", *(bytes([97 + i]) for i in range(7))])
    assert len(whole) == 103
    (tmp_path / name).write_bytes(whole)
    assert load_model(str(model)).tokenizer.vocab_size == 10  # the whole file loads
    # the last token's record starts at 94; its one byte of text would be byte 102
    cut_at = {"header": 3, "inside a token": 102, "between tokens": 94}[cut]
    (tmp_path / name).write_bytes(whole[:cut_at])
    expected = {"header": "not a llama2.c tokenizer file (truncated at byte 0)",
                "inside a token": "not a llama2.c tokenizer file (truncated at byte 102)",
                "between tokens": "holds 9 tokens, the model expects 10 (a truncated file, or another model's "
                                  "tokenizer)"}[cut]
    with pytest.raises(BubblescopeError) as info:
        load_model(str(model))
    assert str(info.value) == f"{tmp_path / name}: {expected}"
    if cut == "between tokens":  # once through the CLI (a child process): even a --prompt-ids run stops
        r = _cli("generate", str(model), "--prompt-ids", "1,2", "--max-new-tokens", "1")
        assert r.returncode == 2 and r.stderr.strip() == f"error: {info.value}" and r.stdout == ""


def _tokenizer_json(path):
    from tokenizers import Tokenizer, models
    Tokenizer(models.BPE(vocab={"<unk>": 0, "a": 1, "b": 2, "ab": 3}, merges=[("a", "b")], unk_token="<unk>")) \
        .save(str(path))
    return path.read_text()


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.95])
def test_a_cut_short_tokenizer_json_is_refused(tmp_path, keep):
    """tokenizer.json cut short anywhere (here after 10 %, 50 %, 95 % of its text) is refused as such, also when
    found beside a checkpoint, where a tokenizer that merely fails to load is a warning."""
    from bubblescope.models import load_model
    from bubblescope.models.tokenizer import TokenizerCutShort

    text = _tokenizer_json(tmp_path / "whole.json")
    assert HFTokenizer(tmp_path / "whole.json").vocab_size == 4
    short = text[:int(len(text) * keep)]
    ckpt = tmp_path / "ckpt"
    save_hf_checkpoint(dummy_weights(get_preset("tiny-llama"), "cpu", torch.float32, 0), ckpt)
    (ckpt / "tokenizer.json").write_text(short)
    message = (f"{ckpt / 'tokenizer.json'}: cut short: its JSON ends after {len(short.encode())} bytes inside a value "
               "(a truncated tokenizer.json; download or copy it again)")
    with pytest.raises(TokenizerCutShort) as info:
        load_model(str(ckpt))
    assert str(info.value) == message


def test_a_tokenizer_json_that_is_whole_but_not_a_tokenizer_stays_a_warning(tmp_path):
    """A whole JSON file the tokenizers library refuses is not cut short: beside a checkpoint it is a warning,
    as before (a --prompt-ids run needs no tokenizer)."""
    from bubblescope.models import load_model

    ckpt = tmp_path / "ckpt"
    save_hf_checkpoint(dummy_weights(get_preset("tiny-llama"), "cpu", torch.float32, 0), ckpt)
    (ckpt / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "NoSuchModel"}}')
    loaded = load_model(str(ckpt))
    assert loaded.tokenizer is None and len(loaded.warnings) == 1
    assert loaded.warnings[0].startswith(f"tokenizer: {ckpt / 'tokenizer.json'} beside the model not loaded (")


def _checkpoint(tmp_path):
    """tiny-llama (eos_token_id 2 in its config.json) saved as a Hugging Face folder."""
    ckpt = tmp_path / "ckpt"
    save_hf_checkpoint(dummy_weights(get_preset("tiny-llama"), "cpu", torch.float32, 0), ckpt)
    assert json.loads((ckpt / "config.json").read_text())["eos_token_id"] == 2
    return ckpt


@pytest.mark.parametrize("as_list", [False, True])
def test_generation_config_eos_is_where_generation_stops(tmp_path, as_list):
    """transformers' generate stops at its generation_config's eos_token_id (generation_config.json, loaded by
    from_pretrained), not config.json's; ours read only config.json's. The first greedy token of the prompt is
    made the eos here (alone, or in a list): generation stops right after it, where config.json's eos (2) would
    let it run on."""
    from bubblescope.generation import generate
    from bubblescope.models import load_model
    from bubblescope.reference_engine import ReferenceEngine

    ckpt = _checkpoint(tmp_path)
    weights = load_model(str(ckpt)).weights
    first = generate(ReferenceEngine(weights, max_seq_len=16), [1, 5, 9], 1, eos_ids=()).tokens[0]
    assert first != 2
    eos = [first + 1 if first + 1 != 2 else first + 2, first] if as_list else first
    (ckpt / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": eos}))
    transformers = pytest.importorskip("transformers")
    assert transformers.GenerationConfig.from_pretrained(ckpt).eos_token_id == eos  # what its generate stops at
    loaded = load_model(str(ckpt))
    assert loaded.config.eos_token_id == tuple(eos if as_list else [eos])
    res = generate(ReferenceEngine(loaded.weights, max_seq_len=16), [1, 5, 9], 6)
    assert res.tokens == [first] and res.stopped_at_eos


def test_generation_config_without_eos_keeps_config_json_eos(tmp_path):
    from bubblescope.models import load_model

    ckpt = _checkpoint(tmp_path)
    assert load_model(str(ckpt)).config.eos_token_id == (2,)  # no generation_config.json
    (ckpt / "generation_config.json").write_text(json.dumps({"do_sample": False, "eos_token_id": None}))
    assert load_model(str(ckpt)).config.eos_token_id == (2,)


@pytest.mark.parametrize("text, why", [
    ("[1, 2]", "expected a JSON object"),
    ('{"eos_token_id": "2"}', 'eos_token_id must be a token id or a list of them, got "2"'),
    ('{"eos_token_id": [2, -1]}', "eos_token_id must be a token id or a list of them, got [2, -1]"),
    ('{"eos_token_id": 999999}', "eos_token_id 999999 is outside the vocabulary (vocab_size 1024: token ids 0 to "
                                 "1023)"),
    ('{"eos_token_id": 2', "not valid JSON (JSONDecodeError: Expecting ',' delimiter: line 1 column 19 (char 18))"),
])
def test_a_bad_generation_config_is_refused_naming_it(tmp_path, text, why):
    from bubblescope.models import load_model

    ckpt = _checkpoint(tmp_path)
    (ckpt / "generation_config.json").write_text(text)
    with pytest.raises(BubblescopeError) as info:
        load_model(str(ckpt))
    assert str(info.value) == f"{ckpt / 'generation_config.json'}: {why}"
