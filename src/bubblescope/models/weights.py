"""Weights in one layout both engines read, and the loaders that fill it.

Layout: Hugging Face / ``nn.Linear`` convention, every projection ``(out_features, in_features)``,
RoPE in the rotate_half convention (llama2.c checkpoints are permuted on load, as llama2.c's
``export.py`` does for its Hugging Face export). Sources:

* a Hugging Face checkpoint directory (``config.json`` + ``*.safetensors``, optionally sharded with
  ``model.safetensors.index.json``) — safetensors only, nothing is ever unpickled;
* a llama2.c legacy ``.bin`` (7 int32 header, then float32 tensors);
* seeded dummy weights for any config (vLLM's ``--load-format dummy`` idea: real shapes, so speed is real).

A projection (and, with ``fp8-all``, the LM head) may be a :class:`~.quant.QuantizedLinear` instead of a tensor:
FP8 e4m3 with a float32 scale per output row, quantized at load (:meth:`ModelWeights.as_format`) or read from a
compressed-tensors checkpoint.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from ..errors import BubblescopeError
from .config import ModelConfig
from .quant import (FP8_DTYPE, LINEAR_NAMES, QuantizedLinear, check_quantization_config, checkpoint_linear,
                    quantize_fp8)
from ..wording import count, first_few

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """``"bfloat16"`` / ``"bf16"`` / ``torch.bfloat16`` -> ``torch.bfloat16`` (likewise float32, float16).

    Raises:
        BubblescopeError: an unknown name (the message lists the accepted ones).
    """
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[str(name).lower()]
    except KeyError:
        raise BubblescopeError(f"--dtype: unknown dtype {name!r}; use float32, bfloat16 or float16") from None


def run_dtype(name: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """The dtype a run loads its weights in: ``name`` parsed by :func:`parse_dtype`, or when None (or empty) the
    default for ``device``: bfloat16 on a GPU (the dtype decode is served in), float32 on a CPU (where
    bfloat16 matmuls are emulated and slow).

    Raises:
        BubblescopeError: an unknown name (:func:`parse_dtype`).
    """
    return parse_dtype(name or ("bfloat16" if device.type == "cuda" else "float32"))


@dataclass
class LayerWeights:
    """One decoder layer. H = hidden_size, Q = q_size, KV = kv_size, I = intermediate_size, D = head_dim.

    The seven projections are tensors in the activation dtype, or :class:`~.quant.QuantizedLinear` (FP8)."""

    input_layernorm: torch.Tensor           # (H,)
    q_proj: torch.Tensor                    # (Q, H)
    k_proj: torch.Tensor                    # (KV, H)
    v_proj: torch.Tensor                    # (KV, H)
    o_proj: torch.Tensor                    # (H, Q)
    post_attention_layernorm: torch.Tensor  # (H,)
    gate_proj: torch.Tensor                 # (I, H)
    up_proj: torch.Tensor                   # (I, H)
    down_proj: torch.Tensor                 # (H, I)
    q_bias: torch.Tensor | None = None      # (Q,)   Qwen2
    k_bias: torch.Tensor | None = None      # (KV,)  Qwen2
    v_bias: torch.Tensor | None = None      # (KV,)  Qwen2
    q_norm: torch.Tensor | None = None      # (D,)   Qwen3
    k_norm: torch.Tensor | None = None      # (D,)   Qwen3

    def tensors(self) -> dict[str, torch.Tensor]:
        """Present tensors by field name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


# our field name -> Hugging Face parameter name inside ``model.layers.{i}.``
_HF_LAYER_NAMES = {
    "input_layernorm": "input_layernorm.weight", "q_proj": "self_attn.q_proj.weight",
    "k_proj": "self_attn.k_proj.weight", "v_proj": "self_attn.v_proj.weight",
    "o_proj": "self_attn.o_proj.weight", "post_attention_layernorm": "post_attention_layernorm.weight",
    "gate_proj": "mlp.gate_proj.weight", "up_proj": "mlp.up_proj.weight", "down_proj": "mlp.down_proj.weight",
    "q_bias": "self_attn.q_proj.bias", "k_bias": "self_attn.k_proj.bias", "v_bias": "self_attn.v_proj.bias",
    "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight",
}


@dataclass
class ModelWeights:
    """All weights of a model. ``lm_head`` is the same tensor object as ``embed_tokens`` when tied.

    ``lm_head`` may be a :class:`~.quant.QuantizedLinear` (``fp8-all``), then distinct from the embedding.
    ``notes``: what the loader did that the user should know (one line each), e.g. a tied config whose
    checkpoint holds a different ``lm_head.weight``."""

    config: ModelConfig
    embed_tokens: torch.Tensor  # (V, H)
    layers: list[LayerWeights]
    norm: torch.Tensor          # (H,)
    lm_head: torch.Tensor | QuantizedLinear  # (V, H)
    notes: list[str] = field(default_factory=list)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.device

    @property
    def dtype(self) -> torch.dtype:
        """The activation dtype: that of the embedding, norms and unquantized weights."""
        return self.embed_tokens.dtype

    @property
    def weight_format(self) -> str:
        """``fp8-all`` (projections and LM head in FP8), ``fp8`` (projections), ``bf16`` (none: every weight in
        :attr:`dtype`), or ``mixed`` (some projections only, as a checkpoint may store them)."""
        quantized = [isinstance(getattr(l, n), QuantizedLinear) for l in self.layers for n in LINEAR_NAMES]
        head = isinstance(self.lm_head, QuantizedLinear)
        if all(quantized) and quantized:
            return "fp8-all" if head else "fp8"
        return "mixed" if any(quantized) or head else "bf16"

    def layer_names(self) -> list[str]:
        """Field names present in every layer (optional ones depend on the family)."""
        return list(self.layers[0].tensors())

    def nbytes(self) -> int:
        """Bytes of all distinct weight tensors (a tied head counted once; FP8 weights 1 byte each plus their
        float32 row scales)."""
        seen, total = set(), 0
        for t in [self.embed_tokens, self.norm, self.lm_head] + [t for l in self.layers for t in l.tensors().values()]:
            if id(t) not in seen:
                seen.add(id(t))
                total += t.nbytes() if isinstance(t, QuantizedLinear) else t.numel() * t.element_size()
        return total

    def to(self, device: str | torch.device | None = None, dtype: torch.dtype | None = None) -> "ModelWeights":
        """A copy on ``device`` / in ``dtype`` (floating tensors only; FP8 projections stay FP8), keeping a tied
        head tied."""
        def mv(t):
            if isinstance(t, QuantizedLinear):
                return t.to(device)
            return None if t is None else t.to(device=device, dtype=dtype)
        emb = mv(self.embed_tokens)
        head = emb if self.lm_head is self.embed_tokens else mv(self.lm_head)
        layers = [LayerWeights(**{f.name: mv(getattr(l, f.name)) for f in fields(l)}) for l in self.layers]
        return ModelWeights(self.config, emb, layers, mv(self.norm), head, list(self.notes))

    def as_format(self, fmt: str) -> "ModelWeights":
        """These weights in weight format ``fmt`` (:data:`~.quant.WEIGHT_FORMATS`): ``bf16`` dequantizes any FP8
        weight to :attr:`dtype`; ``fp8`` quantizes the projections (:func:`~.quant.quantize_fp8`) and keeps the
        LM head in :attr:`dtype` (dequantized if it was FP8); ``fp8-all`` quantizes the LM head too (a tied head
        becomes its own FP8 copy; the embedding stays). Weights already in the asked form are shared, not
        copied; the result replaces ``self`` (drop it to free the unquantized weights).

        Raises:
            BubblescopeError: an unknown format.
        """
        from .quant import parse_weight_format

        parse_weight_format(fmt)
        act = self.dtype

        def conv(t, quantize: bool):
            if isinstance(t, QuantizedLinear):
                return t if quantize else t.dequantize(act)
            return quantize_fp8(t) if quantize else t

        layers = [LayerWeights(**{f.name: conv(getattr(l, f.name), fmt != "bf16") if f.name in LINEAR_NAMES
                                  else getattr(l, f.name) for f in fields(l)}) for l in self.layers]
        head = conv(self.lm_head, fmt == "fp8-all")
        if self.config.tie_word_embeddings and not isinstance(head, QuantizedLinear):
            head = self.embed_tokens
        return ModelWeights(self.config, self.embed_tokens, layers, self.norm, head, list(self.notes))

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Hugging Face parameter names -> tensors (e.g. for ``LlamaForCausalLM.load_state_dict``). An FP8 weight
        is written in the compressed-tensors layout: ``<name>.weight`` float8_e4m3fn (out, in) and
        ``<name>.weight_scale`` float32 (out, 1)."""
        sd = {"model.embed_tokens.weight": self.embed_tokens, "model.norm.weight": self.norm}

        def put(key: str, t) -> None:
            if isinstance(t, QuantizedLinear):
                sd[key], sd[key + "_scale"] = t.qweight, t.scale[:, None]
            else:
                sd[key] = t
        put("lm_head.weight", self.lm_head)
        for i, layer in enumerate(self.layers):
            for name, t in layer.tensors().items():
                put(f"model.layers.{i}.{_HF_LAYER_NAMES[name]}", t)
        return sd


def _expected_layer_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    h, q, kv, i, d = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size, cfg.head_dim
    shapes = {"input_layernorm": (h,), "q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
              "post_attention_layernorm": (h,), "gate_proj": (i, h), "up_proj": (i, h), "down_proj": (h, i)}
    if cfg.attention_bias:
        shapes.update(q_bias=(q,), k_bias=(kv,), v_bias=(kv,))
    if cfg.qk_norm:
        shapes.update(q_norm=(d,), k_norm=(d,))
    return shapes


def _check_fits(cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> None:
    """Refuse a config whose weights exceed the device's total memory (a typo'd size in a config.json
    would otherwise end in an allocator traceback, or in the kernel's OOM killer)."""
    need = cfg.num_parameters() * torch.empty((), dtype=dtype).element_size()
    try:
        if device.type == "cuda":
            total = torch.cuda.get_device_properties(device).total_memory
        else:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError, RuntimeError):  # no sysconf (Windows): let the allocator decide
        return
    if need > total:
        raise BubblescopeError(f"model config {cfg.name}: its weights need {need / 2**30:,.1f} GiB in "
                               f"{str(dtype).replace('torch.', '')}, more than the {total / 2**30:,.1f} GiB of "
                               f"{device.type} memory")


def dummy_weights(cfg: ModelConfig, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                  seed: int = 0) -> ModelWeights:
    """Seeded random weights of the config's real shapes.

    Projections ~ N(0, 1/in_features) (keeps activations O(1) through the layers); embeddings ~ N(0, 1);
    norm weights 1 + N(0, 0.05²); biases ~ N(0, 0.02²). Generated on ``device`` directly (a 1B model
    takes well under a second on a GPU). The same seed on the same device type gives the same weights.

    Raises:
        BubblescopeError: the weights alone would exceed the device's total memory.
    """
    _check_fits(cfg, torch.device(device), dtype)
    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(shape, std, mean=0.0):
        t = torch.empty(shape, device=device, dtype=torch.float32)
        t.normal_(mean, std, generator=gen)
        return t.to(dtype)

    shapes = _expected_layer_shapes(cfg)
    layers = []
    for _ in range(cfg.num_hidden_layers):
        tensors = {}
        for name, shape in shapes.items():
            if name.endswith("layernorm") or name.endswith("_norm"):
                tensors[name] = rnd(shape, 0.05, 1.0)
            elif name.endswith("_bias"):
                tensors[name] = rnd(shape, 0.02)
            else:
                tensors[name] = rnd(shape, shape[1] ** -0.5)
        layers.append(LayerWeights(**tensors))
    emb = rnd((cfg.vocab_size, cfg.hidden_size), 1.0)
    head = emb if cfg.tie_word_embeddings else rnd((cfg.vocab_size, cfg.hidden_size), cfg.hidden_size ** -0.5)
    return ModelWeights(cfg, emb, layers, rnd((cfg.hidden_size,), 0.05, 1.0), head)


# ---- Hugging Face safetensors --------------------------------------------------------------------
def _safetensors_files(ckpt: Path) -> list[Path]:
    index = ckpt / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError, RecursionError) as e:
            raise BubblescopeError(f"{index}: not a valid safetensors index ({e})") from None
        if not isinstance(weight_map, dict):
            raise BubblescopeError(f"{index}: not a valid safetensors index (weight_map is not an object)")
        bad = next((f for f in weight_map.values()
                    if not isinstance(f, str) or Path(f).name != f or f in ("", ".", "..")), None)
        if bad is not None:
            raise BubblescopeError(f"{index}: not a valid safetensors index (shard {bad!r} is not a file name "
                                   "in the checkpoint directory)")
        files = [ckpt / f for f in sorted(set(weight_map.values()))]
        for f in files:
            if not f.is_file():
                raise BubblescopeError(f"{index}: names shard {f.name}, which is missing")
        return files
    files = sorted(ckpt.glob("*.safetensors"))
    if not files:
        if list(ckpt.glob("*.bin")) or list(ckpt.glob("*.pt")) or list(ckpt.glob("*.pth")):
            raise BubblescopeError(f"{ckpt}: only pickle weights (*.bin/*.pt) found; bubblescope reads safetensors only")
        raise BubblescopeError(f"{ckpt}: no *.safetensors files")
    return files


def load_hf_checkpoint(path: str | Path, device: str | torch.device = "cpu",
                       dtype: torch.dtype | None = None) -> ModelWeights:
    """Load a Hugging Face checkpoint directory (config.json + safetensors, sharded or not).

    Args:
        dtype: target dtype; ``None`` keeps the checkpoint's.

    Raises:
        BubblescopeError: missing directory/config.json, unsupported architecture, a missing tensor
            (named), a tensor of the wrong shape, an unreadable safetensors file, a tensor stored in two
            safetensors files (named, with both files; with or without an index), a bare base model (tensor
            names without the ``model.`` prefix), or tensors the model would not use (the first few named:
            nothing in the checkpoint is dropped silently; only ``rotary_emb.inv_freq`` buffers and a tied
            model's ``lm_head.weight`` equal to its embedding are ignored).

    A tied config (``tie_word_embeddings: true``) whose checkpoint holds an ``lm_head.weight`` that differs from
    the embedding loads both untied (the returned config says ``tie_word_embeddings=False``), as transformers
    does, with a line in ``notes`` saying so.

    FP8 checkpoints in the compressed-tensors layout (``quantization_config`` with ``quant_method:
    compressed-tensors``, per-channel static FP8 weights: :func:`~.quant.check_quantization_config`) load their
    projections (and LM head, if quantized) as :class:`~.quant.QuantizedLinear`: ``<name>.weight`` float8_e4m3fn
    with ``<name>.weight_scale``; ``dtype`` applies to the other tensors. Any other ``quantization_config``, an
    FP8 tensor without its scale, or a scale without a quantization_config is refused with a one-line error.
    """
    from safetensors import safe_open
    from safetensors import SafetensorError

    ckpt = Path(path)
    if not ckpt.exists():
        raise BubblescopeError(f"{path}: no such file or directory")
    if not ckpt.is_dir():
        raise BubblescopeError(f"{path}: a Hugging Face checkpoint must be a directory")
    cfg = ModelConfig.from_hf_config(ckpt)
    # config.json was read and checked by from_hf_config; its quantization_config is checked here
    quant_cfg = json.loads((ckpt / "config.json").read_text()).get("quantization_config")
    notes = [] if quant_cfg is None else check_quantization_config(quant_cfg, str(ckpt / "config.json"))
    quantized = quant_cfg is not None
    tensors: dict[str, torch.Tensor] = {}
    where: dict[str, Path] = {}
    for f in _safetensors_files(ckpt):
        try:
            with safe_open(str(f), framework="pt", device="cpu") as fh:
                for key in fh.keys():
                    if key in where:
                        # The later file silently replaced the earlier tensor; which copy is meant cannot be
                        # told (an index maps each name to one shard, a folder without one maps none), so
                        # neither is chosen.
                        raise BubblescopeError(f"{ckpt}: tensor {key} is stored twice, in {where[key].name} and "
                                               f"in {f.name}")
                    where[key] = f
                    tensors[key] = fh.get_tensor(key)
        except (SafetensorError, OSError, ValueError) as e:
            raise BubblescopeError(f"{f}: cannot read safetensors file ({e})") from None

    if "model.embed_tokens.weight" not in tensors and "embed_tokens.weight" in tensors:
        # A bare LlamaModel / Qwen2Model (save_pretrained of the base model): no prefix and usually no LM head.
        head = "" if cfg.tie_word_embeddings or "lm_head.weight" in tensors else " and it has no lm_head.weight"
        raise BubblescopeError(f"{ckpt}: a bare base model, not a causal LM: its tensor names lack the 'model.' "
                               f"prefix (embed_tokens.weight, not model.embed_tokens.weight){head}")
    used: set[str] = set()

    def take(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        used.add(name)
        t = tensors.get(name)
        if t is None:
            raise BubblescopeError(f"{ckpt}: checkpoint is missing tensor {name}")
        if tuple(t.shape) != shape:
            raise BubblescopeError(f"{ckpt}: tensor {name} has shape {tuple(t.shape)}, expected {shape}")
        if not t.dtype.is_floating_point:  # int or bool weights would be cast silently into nonsense
            raise BubblescopeError(f"{ckpt}: tensor {name} has dtype {str(t.dtype).replace('torch.', '')}, "
                                   "expected a floating-point dtype")
        if t.dtype == FP8_DTYPE:  # FP8 means nothing without its scale
            raise BubblescopeError(f"{ckpt}: tensor {name} is stored in float8_e4m3fn without a {name}_scale")
        return t.to(device=device, dtype=dtype or t.dtype)

    def take_linear(name: str, shape: tuple[int, int]) -> torch.Tensor | QuantizedLinear:
        """A projection: FP8 with its row scales where ``<name>_scale`` is stored (compressed-tensors), else a
        plain tensor."""
        if name + "_scale" not in tensors:
            return take(name, shape)
        if not quantized:
            raise BubblescopeError(f"{ckpt}: tensor {name}_scale is stored but config.json has no "
                                   "quantization_config saying how to read it")
        if name not in tensors:
            raise BubblescopeError(f"{ckpt}: checkpoint is missing tensor {name}")
        used.update((name, name + "_scale"))
        return checkpoint_linear(tensors[name], tensors[name + "_scale"], name, shape, str(ckpt)).to(device)

    h, v = cfg.hidden_size, cfg.vocab_size
    layers = []
    for i in range(cfg.num_hidden_layers):
        layers.append(LayerWeights(**{
            name: (take_linear if name in LINEAR_NAMES else take)(f"model.layers.{i}.{_HF_LAYER_NAMES[name]}", shape)
            for name, shape in _expected_layer_shapes(cfg).items()}))
    emb = take("model.embed_tokens.weight", (v, h))
    file_head, file_emb = tensors.get("lm_head.weight"), tensors["model.embed_tokens.weight"]
    if cfg.tie_word_embeddings and "lm_head.weight_scale" in tensors:
        cfg = cfg.replace(tie_word_embeddings=False)
        notes.append(f"weights: config.json ties the embeddings (tie_word_embeddings: true) but {ckpt} holds an FP8 "
                     "lm_head.weight (with lm_head.weight_scale): the FP8 head and the embedding are used untied")
    elif cfg.tie_word_embeddings and file_head is not None and not (
            file_head.shape == file_emb.shape and torch.equal(file_head, file_emb.to(file_head.dtype))):
        # transformers (5.x, PreTrainedModel.tie_weights) does not tie two different tensors: it keeps both and warns
        # "both are present in the checkpoints with different values, so we will NOT tie them". So do we.
        cfg = cfg.replace(tie_word_embeddings=False)
        notes.append(f"weights: config.json ties the embeddings (tie_word_embeddings: true) but {ckpt} holds an "
                     "lm_head.weight that differs from model.embed_tokens.weight: both are used untied, as "
                     "transformers does; set tie_word_embeddings to false to silence this")
    head = emb if cfg.tie_word_embeddings else take_linear("lm_head.weight", (v, h))
    norm = take("model.norm.weight", (h,))
    unused = [k for k in tensors if k not in used and not k.endswith("rotary_emb.inv_freq")
              and not (k == "lm_head.weight" and cfg.tie_word_embeddings)]
    if unused:  # e.g. o_proj biases: refused rather than dropped, which left logits wrong
        raise BubblescopeError(f"{ckpt}: checkpoint holds {count(len(unused), 'tensor')} that model_type "
                               f"{cfg.model_type} with this config.json does not use: {first_few(unused)}")
    return ModelWeights(cfg, emb, layers, norm, head, notes)


def save_hf_checkpoint(weights: ModelWeights, path: str | Path) -> None:
    """Write ``config.json`` + ``model.safetensors`` (a tied head stored once, as transformers does). FP8 weights
    are written in the compressed-tensors layout with its ``quantization_config`` (:data:`~.quant.
    QUANTIZATION_CONFIG`, naive-quantized: weights only), which :func:`load_hf_checkpoint` reads back; an FP8 head
    of a tied config is stored as its own ``lm_head.weight`` with the config untied."""
    from safetensors.torch import save_file

    from .quant import QUANTIZATION_CONFIG

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    sd = {k: v.contiguous().cpu() for k, v in weights.hf_state_dict().items()}
    cfg = weights.config.to_hf_dict()
    if weights.config.tie_word_embeddings and isinstance(weights.lm_head, QuantizedLinear):
        cfg["tie_word_embeddings"] = False
    elif weights.config.tie_word_embeddings:
        sd.pop("lm_head.weight")
    if weights.weight_format != "bf16":
        cfg["quantization_config"] = dict(QUANTIZATION_CONFIG, ignore=[] if isinstance(
            weights.lm_head, QuantizedLinear) else ["lm_head"])
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))


# ---- llama2.c legacy .bin --------------------------------------------------------------------------
_LLAMA2C_HEADER = struct.Struct("<7i")


def _permute_rotate_half(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder each head's rows from interleaved RoPE pairs (i, i+1) to rotate_half halves (i, i + D/2).

    Same as ``permute_original`` in llama2.c's export.py (its Hugging Face export).
    """
    out_f, in_f = w.shape
    return w.view(n_heads, out_f // n_heads // 2, 2, in_f).transpose(1, 2).reshape(out_f, in_f)


def load_llama2c(path: str | Path, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32) -> ModelWeights:
    """Load a llama2.c legacy checkpoint (karpathy/llama2.c ``run.c`` format, version 0).

    Header: 7 int32 — dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size (negative: the
    classifier is stored separately), seq_len. Then float32 tensors in order: token_embedding (V, dim),
    rms_att (L, dim), wq (L, dim, dim), wk (L, kv_dim, dim), wv (L, kv_dim, dim), wo (L, dim, dim),
    rms_ffn (L, dim), w1 (L, hidden, dim), w2 (L, dim, hidden), w3 (L, hidden, dim), rms_final (dim),
    freq_cis_real and freq_cis_imag (seq_len, head_size/2 each; unused), wcls (V, dim) if not shared.

    Raises:
        BubblescopeError: missing file, impossible header, or a size different from the header's
            (the message gives the expected number of bytes).
    """
    import numpy as np

    p = Path(path)
    if not p.is_file():
        raise BubblescopeError(f"{path}: no such file")
    size = p.stat().st_size
    if size < _LLAMA2C_HEADER.size:
        raise BubblescopeError(f"{p}: truncated llama2.c checkpoint ({count(size, 'byte')}, header alone is 28)")
    with open(p, "rb") as fh:
        dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = _LLAMA2C_HEADER.unpack(fh.read(28))
    shared = vocab > 0
    vocab = abs(vocab)
    if min(dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len) <= 0 or dim % n_heads or n_heads % n_kv \
            or max(dim, hidden, vocab, seq_len) > 1 << 22 or n_layers > 4096:
        raise BubblescopeError(
            f"{p}: not a llama2.c checkpoint (header dim={dim} hidden_dim={hidden} n_layers={n_layers} "
            f"n_heads={n_heads} n_kv_heads={n_kv} vocab_size={vocab} seq_len={seq_len})")
    head = dim // n_heads
    kv_dim = head * n_kv
    shapes = [("embed", (vocab, dim)), ("rms_att", (n_layers, dim)), ("wq", (n_layers, dim, dim)),
              ("wk", (n_layers, kv_dim, dim)), ("wv", (n_layers, kv_dim, dim)), ("wo", (n_layers, dim, dim)),
              ("rms_ffn", (n_layers, dim)), ("w1", (n_layers, hidden, dim)), ("w2", (n_layers, dim, hidden)),
              ("w3", (n_layers, hidden, dim)), ("rms_final", (dim,)), ("freq_real", (seq_len, head // 2)),
              ("freq_imag", (seq_len, head // 2))]
    if not shared:
        shapes.append(("wcls", (vocab, dim)))
    n_floats = sum(int(np.prod(s)) for _, s in shapes)
    expected = 28 + 4 * n_floats
    if size != expected:
        kind = "truncated" if size < expected else "oversized"
        raise BubblescopeError(f"{p}: {kind} llama2.c checkpoint: {size} bytes, expected {expected} from its header")
    flat = torch.from_numpy(np.fromfile(p, dtype="<f4", offset=28, count=n_floats).copy())
    t, off = {}, 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        t[name] = flat[off:off + n].view(shape)
        off += n
    cfg = ModelConfig(hidden_size=dim, intermediate_size=hidden, num_hidden_layers=n_layers,
                      num_attention_heads=n_heads, num_key_value_heads=n_kv, vocab_size=vocab,
                      rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=shared,
                      max_position_embeddings=seq_len, bos_token_id=1, eos_token_id=(2,), name=p.stem.lower())
    mv = lambda x: x.to(device=device, dtype=dtype).contiguous()  # noqa: E731
    layers = [LayerWeights(
        input_layernorm=mv(t["rms_att"][i]), q_proj=mv(_permute_rotate_half(t["wq"][i], n_heads)),
        k_proj=mv(_permute_rotate_half(t["wk"][i], n_kv)), v_proj=mv(t["wv"][i]), o_proj=mv(t["wo"][i]),
        post_attention_layernorm=mv(t["rms_ffn"][i]), gate_proj=mv(t["w1"][i]), up_proj=mv(t["w3"][i]),
        down_proj=mv(t["w2"][i])) for i in range(n_layers)]
    emb = mv(t["embed"])
    return ModelWeights(cfg, emb, layers, mv(t["rms_final"]), emb if shared else mv(t["wcls"]))
