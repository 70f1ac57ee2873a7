"""Resolve what the user named (a preset, a checkpoint directory, a config.json, a llama2.c file) into a model."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import BubblescopeError
from ..wording import first_few
from .config import PRESETS, ModelConfig, get_preset
from .quant import FP8_DTYPE, parse_weight_format
from .tokenizer import TokenizerCutShort, load_tokenizer
from .weights import ModelWeights, dummy_weights, load_hf_checkpoint, load_llama2c

# Where a preset's real file may live: (preset, relative path) — searched under BUBBLESCOPE_MODELS (a
# path list) and ../shared/models relative to the working directory.
KNOWN_FILES = {"stories260k": "stories260K/stories260K.bin"}


@dataclass
class LoadedModel:
    """A model ready for an engine: weights, an optional tokenizer, and where they came from."""

    weights: ModelWeights
    tokenizer: object | None
    source: str          # "dummy" | "hf" | "llama2c"
    path: str | None
    warnings: list[str] = field(default_factory=list)  # one line each, e.g. non-finite weights

    @property
    def config(self) -> ModelConfig:
        return self.weights.config


def model_search_dirs() -> list[Path]:
    """``$BUBBLESCOPE_MODELS`` entries (os.pathsep-separated), then ``../shared/models`` from the working
    directory, then ``../shared/models`` beside this source checkout (so it does not depend on the cwd); each
    directory once (by its resolved path: run from the checkout, the last two are one), as first named."""
    dirs = [Path(p) for p in os.environ.get("BUBBLESCOPE_MODELS", "").split(os.pathsep) if p]
    checkout = Path(__file__).resolve().parents[4] / "shared" / "models"  # <repo>/src/bubblescope/models/ -> ../shared
    seen: set[Path] = set()
    out = []
    for d in dirs + [Path("..") / "shared" / "models", checkout]:
        if d.resolve() not in seen:
            seen.add(d.resolve())
            out.append(d)
    return out


def find_model_file(preset: str) -> Path | None:
    """The real checkpoint of a preset (only stories260k has one we know of), or None if not found."""
    rel = KNOWN_FILES.get(preset.lower())
    if rel is None:
        return None
    for d in model_search_dirs():
        for cand in (d / rel, d / Path(rel).name):
            if cand.is_file():
                return cand.resolve()
    return None


def resolve_device(device: str | None) -> torch.device:
    """``None``/"auto" -> cuda if available else cpu.

    Raises:
        BubblescopeError: cuda asked for on a machine without a GPU, ``cuda:N`` beyond the visible GPUs, ``cpu:N``
            with N > 0 (torch runs every core as the one device ``cpu``, so ``cpu:5`` would be taken silently as
            ``cpu``), or an unknown device string.
    """
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise BubblescopeError(f"--device: unknown device {device!r}; use cpu or cuda") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BubblescopeError(f"--device {device}: no CUDA GPU is available on this machine")
    if dev.type == "cuda" and dev.index is not None and dev.index >= (n := torch.cuda.device_count()):
        # torch.device takes any index; its first use failed with a traceback (get_device_properties's bare
        # AssertionError "Invalid device id", or "invalid device ordinal" at an allocation)
        visible = "cuda:0" if n == 1 else f"cuda:0 to cuda:{n - 1}"
        raise BubblescopeError(f"--device {device}: no such GPU on this machine (visible: {visible})")
    if dev.type not in ("cuda", "cpu"):
        raise BubblescopeError(f"--device: unsupported device {device!r}; use cpu or cuda")
    if dev.type == "cpu" and dev.index not in (None, 0):
        raise BubblescopeError(f"--device {device}: the CPU is one device (torch runs on all its cores), it has no "
                               f"index {dev.index}; use cpu")
    return dev


def _tokenizer_beside(path: Path, vocab_size: int) -> Path | None:
    """The tokenizer file beside the weights, by the names the README documents: ``tokenizer.json`` (Hugging
    Face), ``tok{vocab_size}.bin`` (llama2.c names its tokenizers after the vocabulary: ``tok512.bin`` beside
    stories260K) or ``tokenizer.bin`` (llama2.c's default). Any other ``tok*.bin`` (``tok4096.bin`` beside a
    512-token model, ``tokens.bin``) is not taken: it was loaded as the tokenizer and failed the run."""
    folder = path if path.is_dir() else path.parent
    for name in ("tokenizer.json", f"tok{vocab_size}.bin", "tokenizer.bin"):
        if (folder / name).is_file():
            return folder / name
    return None


def _load_path(p: Path, device, dtype, seed, label: str | None = None) -> tuple[ModelWeights, str]:
    """Weights and their source ("hf", "dummy", "llama2c") of path ``p``; ``label`` (the option that named
    it, e.g. ``--checkpoint``) leads a missing path's error."""
    if not p.exists():
        raise BubblescopeError(f"{label + ': ' if label else ''}{p}: no such file or directory")
    if p.is_dir():
        return load_hf_checkpoint(p, device, dtype), "hf"
    if p.suffix == ".json":
        return dummy_weights(ModelConfig.from_hf_config(p), device, dtype, seed), "dummy"
    if p.suffix == ".safetensors":
        return load_hf_checkpoint(p.parent, device, dtype), "hf"
    return load_llama2c(p, device, dtype), "llama2c"


def load_model(model: str, checkpoint: str | None = None, tokenizer: str | None = None,
               device: str | torch.device | None = None, dtype: torch.dtype = torch.float32,
               seed: int = 0, weight_format: str | None = None) -> LoadedModel:
    """Load ``model``: a preset name or a path, with optional explicit checkpoint and tokenizer paths.

    * preset name: dummy weights of its config, except a preset whose real file is found
      (``find_model_file``), which is loaded;
    * a directory with ``config.json`` + safetensors: a Hugging Face checkpoint;
    * a ``config.json``: dummy weights of that config;
    * any other file: a llama2.c ``.bin``.
    A tokenizer beside the weights (``tokenizer.json``, ``tok{vocab_size}.bin`` such as ``tok512.bin``,
    ``tokenizer.bin``: :func:`_tokenizer_beside`) is found by itself; one that fails to load only adds a warning
    (a ``--prompt-ids`` run needs none), unless the file is cut short (:class:`~.tokenizer.TokenizerCutShort`: a
    damaged download is refused, not worked around), while an explicit ``tokenizer`` that fails is an error.
    ``checkpoint`` replaces MODEL's weights (and so its config); when MODEL names something else (a preset of
    other shapes, another path), the returned warnings say that MODEL was ignored (:func:`ignored_model`).
    ``weight_format`` (``--weights``: ``bf16``, ``fp8``, ``fp8-all``; :meth:`~.weights.ModelWeights.as_format`)
    quantizes or dequantizes the loaded weights; None keeps the checkpoint's form (an FP8 checkpoint stays FP8; one
    with only some projections in FP8 has the rest quantized too, with a warning, so that every projection streams
    the same bytes).

    Raises:
        BubblescopeError: unknown preset, missing path, unsupported config, malformed weights, a tokenizer file
            cut short (named or found beside the weights), an unknown ``weight_format``; an empty MODEL,
            ``checkpoint`` or ``tokenizer``, or a ``tokenizer`` that is not a file (both before anything is loaded).
    """
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    fmt = parse_weight_format(weight_format)
    for label, value in (("MODEL", model), ("--checkpoint", checkpoint), ("--tokenizer", tokenizer)):
        if value is not None and not str(value).strip():  # Path("") is ".", which would be searched instead
            raise BubblescopeError(f"{label}: empty; give a preset name or a path")
    if tokenizer is not None and not Path(tokenizer).is_file():  # found now, not after the weights are loaded
        why = "is a directory, not a" if Path(tokenizer).is_dir() else "no such"
        raise BubblescopeError(f"--tokenizer {tokenizer}: {why} tokenizer file (tokenizer.json or a llama2.c .bin)")
    path = checkpoint
    if path is None and model.lower() not in PRESETS:
        if not Path(model).exists() and os.sep not in model and not model.endswith((".bin", ".json")):
            get_preset(model)  # raises "unknown model preset ..., known presets: ..."
        path = model
    if path is None:
        path = find_model_file(model)
    if path is None:
        weights, source = dummy_weights(get_preset(model), dev, dtype, seed), "dummy"
    else:
        weights, source = _load_path(Path(path), dev, dtype, seed, "--checkpoint" if checkpoint is not None else None)
    if fmt is None and weights.weight_format == "mixed":
        fmt = "fp8-all" if not isinstance(weights.lm_head, torch.Tensor) else "fp8"
        weights.notes.append(f"weights: the checkpoint stores only some projections in FP8; the others were "
                             f"quantized at load too ({fmt}), so every projection streams FP8")
    if fmt is not None and fmt != weights.weight_format:
        weights = weights.as_format(fmt)
    tok_path = Path(tokenizer) if tokenizer else (_tokenizer_beside(Path(path), weights.config.vocab_size)
                                                  if path else None)
    tok, warnings = None, []
    if tok_path is not None:
        try:
            tok = load_tokenizer(tok_path, vocab_size=weights.config.vocab_size if tok_path.suffix != ".json" else None,
                                 bos_token_id=weights.config.bos_token_id)
        except BubblescopeError as e:
            if tokenizer or isinstance(e, TokenizerCutShort):  # asked for by name, or a damaged file: the run's error
                raise
            # Found by its name only: a run given --prompt-ids needs no tokenizer, so a broken one beside the weights
            # must not fail it; a --prompt run then stops at "this model has no tokenizer" after this line.
            warnings.append(f"tokenizer: {tok_path} beside the model not loaded ({e}); pass --tokenizer for --prompt")
    warnings += weights.notes + nonfinite_weights(weights)
    if checkpoint is not None and (note := ignored_model(model, checkpoint, weights.config)):
        warnings.insert(0, note)
    return LoadedModel(weights, tok, source, str(path) if path else None, warnings)


def _shapes(cfg: ModelConfig) -> tuple:
    """What makes two configs the same model to measure: its architecture and tensor shapes."""
    return (cfg.model_type, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.num_attention_heads,
            cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size, cfg.tie_word_embeddings, cfg.attention_bias,
            cfg.qk_norm)


def ignored_model(model: str, checkpoint: str, loaded: ModelConfig) -> str | None:
    """One note line when ``--checkpoint`` (whose config is ``loaded``) was loaded in place of a MODEL that names
    something else: a preset of other shapes, or another path (not read at all). None when MODEL is the same
    path, or a preset with the checkpoint's shapes (its real weights, as ``--checkpoint`` is meant for)."""
    preset = PRESETS.get(model.lower())
    if preset is not None:
        if _shapes(preset) == _shapes(loaded):
            return None
        size = lambda c: (f"{c.num_parameters() / 1e9:.2f} B" if c.num_parameters() >= 1e9  # noqa: E731
                          else f"{c.num_parameters() / 1e6:.3g} M") + " parameters"
        return (f"model: MODEL {model} ignored: --checkpoint {checkpoint} holds {loaded.name} ({size(loaded)}), "
                f"not {model}'s shapes ({size(preset)}); the checkpoint was loaded")
    if Path(model).exists() and Path(model).resolve() == Path(checkpoint).resolve():
        return None
    return f"model: MODEL {model} ignored: --checkpoint {checkpoint} ({loaded.name}) was loaded in its place"


def nonfinite_weights(weights: ModelWeights, shown: int = 3) -> list[str]:
    """One warning line when any weight tensor holds NaN or ±Inf (a broken conversion or checkpoint), naming
    up to ``shown`` tensors (Hugging Face names) with their count of non-finite elements; else []."""
    bad = []
    for name, t in weights.hf_state_dict().items():
        if t.dtype == FP8_DTYPE:  # e4m3fn has NaN (no Inf); torch has no isfinite for it
            t = t.to(torch.float32)
        n = int((~torch.isfinite(t)).sum()) if t.is_floating_point() else 0
        if n:
            bad.append(f"{name}: {n} of {t.numel()}")
    if not bad:
        return []
    some = f"{len(bad)} tensors hold" if len(bad) > 1 else "1 tensor holds"
    return [f"weights: {some} NaN or Inf values ({first_few(bad, '; ', shown)}); logits and "
            "generated text will be garbage"]
