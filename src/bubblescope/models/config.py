"""Model configuration with Hugging Face field names, plus named presets.

Field names follow ``transformers``' ``LlamaConfig`` / ``Qwen2Config`` / ``Qwen3Config`` so a
``config.json`` maps onto :class:`ModelConfig` one to one. Preset values are copied from the public
``config.json`` files on the Hugging Face Hub (meta-llama/Llama-3.2-1B, Llama-3.2-3B, Llama-3.1-8B,
Qwen/Qwen2.5-0.5B, Qwen3-0.6B, Qwen3-1.7B) and from the llama2.c header of stories260K.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BubblescopeError

if TYPE_CHECKING:
    import torch


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _token_id(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _finite(v: Any) -> bool:
    """A real number (not a bool, string or null) that is neither NaN nor infinite."""
    try:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    except OverflowError:  # an integer beyond float range
        return False


# model_type in config.json -> our architecture family. Mistral without a sliding window (or with one that never
# binds: _check_window_never_binds) is Llama with other names; Qwen2 adds q/k/v biases; Qwen3 adds per-head q/k
# RMSNorm.
SUPPORTED_MODEL_TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only Llama-family transformer.

    Attributes use Hugging Face names. ``head_dim`` defaults to ``hidden_size // num_attention_heads``
    when absent (as in ``LlamaConfig``). ``rope_scaling`` is the raw dict, e.g. ``{"rope_type":
    "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192}``. ``eos_token_id`` is a tuple (HF allows an int or list).
    ``sliding_window`` (Mistral only) is null (no window) or a window of at least ``max_position_embeddings``,
    which never hides a key; :meth:`to_hf_dict` writes it back so transformers builds the same attention.
    """

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    head_dim: int = 0
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 2048
    bos_token_id: int | None = None
    eos_token_id: tuple[int, ...] = ()
    model_type: str = "llama"
    name: str = "custom"
    hidden_act: str = "silu"
    sliding_window: int | None = None  # Mistral only: a window that never binds (>= max_position_embeddings)
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.head_dim and _positive_int(self.hidden_size) and _positive_int(self.num_attention_heads):
            # Without an explicit head_dim, transformers' attention splits hidden_size into the heads
            # (LlamaAttention raised "hidden_size must be divisible by num_heads" before head_dim existed);
            # flooring the quotient would build a model whose q_proj no longer matches hidden_size.
            if self.hidden_size % self.num_attention_heads:
                raise BubblescopeError(
                    f"model config {self.name}: hidden_size {self.hidden_size} is not divisible by "
                    f"num_attention_heads {self.num_attention_heads} and no head_dim is given")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        eos = self.eos_token_id
        if eos is None:
            eos = ()
        elif isinstance(eos, int):
            eos = (eos,)
        if not isinstance(eos, (tuple, list)) or not all(_token_id(e) for e in eos):
            raise BubblescopeError(f"model config {self.name}: eos_token_id must be a token id or a list of them, "
                                   f"got {eos!r}")
        object.__setattr__(self, "eos_token_id", tuple(int(e) for e in eos))
        self.validate()

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def q_size(self) -> int:
        """Width of the query projection output, ``num_attention_heads * head_dim``."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of each of the key and value projection outputs, ``num_key_value_heads * head_dim``."""
        return self.num_key_value_heads * self.head_dim

    @property
    def gqa_group(self) -> int:
        """Query heads per KV head (1 = MHA)."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def family(self) -> str:
        """``llama``, ``qwen2`` or ``qwen3``."""
        return SUPPORTED_MODEL_TYPES[self.model_type]

    def layer_parameters(self) -> int:
        """Parameters of one decoder layer (projections, biases, norms)."""
        h, q, kv, i = self.hidden_size, self.q_size, self.kv_size, self.intermediate_size
        n = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h
        if self.attention_bias:
            n += q + 2 * kv
        if self.qk_norm:
            n += 2 * self.head_dim
        return n

    def num_parameters(self) -> int:
        """Total parameters, counting a tied LM head once (as ``model.num_parameters()`` does)."""
        n = self.vocab_size * self.hidden_size + self.num_hidden_layers * self.layer_parameters()
        n += self.hidden_size
        if not self.tie_word_embeddings:
            n += self.vocab_size * self.hidden_size
        return n

    def validate(self) -> None:
        """Check the shapes are consistent and the numbers usable.

        Raises:
            BubblescopeError: a field is non-positive, heads do not divide, the model type is unknown,
                rope_theta / rms_norm_eps / bos_token_id / llama3 rope_scaling are not usable numbers, rope_theta
                makes the float32 RoPE frequencies non-finite, or sliding_window is set on a model other than
                Mistral or binds (is below max_position_embeddings).
        """
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "vocab_size", "head_dim", "max_position_embeddings"):
            v = getattr(self, name)
            if not _positive_int(v):
                raise BubblescopeError(f"model config {self.name}: {name} must be a positive integer, got {v!r}")
        if not _finite(self.rope_theta) or self.rope_theta <= 0:
            raise BubblescopeError(f"model config {self.name}: rope_theta must be a finite number > 0, "
                                   f"got {self.rope_theta!r}")
        if not _finite(self.rms_norm_eps) or self.rms_norm_eps < 0:
            raise BubblescopeError(f"model config {self.name}: rms_norm_eps must be a finite number >= 0, "
                                   f"got {self.rms_norm_eps!r}")
        if self.bos_token_id is not None and not _token_id(self.bos_token_id):
            raise BubblescopeError(f"model config {self.name}: bos_token_id must be a token id (an integer >= 0) "
                                   f"or null, got {self.bos_token_id!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise BubblescopeError(
                f"model config {self.name}: num_attention_heads {self.num_attention_heads} is not a multiple "
                f"of num_key_value_heads {self.num_key_value_heads}")
        if self.head_dim % 2:
            raise BubblescopeError(f"model config {self.name}: head_dim {self.head_dim} must be even for RoPE")
        if self.rope_theta < 1:
            # inv_freq = theta ** (-2i / head_dim), in float32 as transformers' _compute_default_rope_parameters
            # computes it: a theta below 1 grows without bound as i grows (1e-300 is 0 in float32, so 1 / 0 = inf),
            # and non-finite frequencies make every logit NaN. Checked only below 1 (above, theta ** -x <= 1), so
            # building a preset does not import torch.
            if not bool(_default_inv_freq(self.rope_theta, self.head_dim).isfinite().all()):
                raise BubblescopeError(
                    f"model config {self.name}: rope_theta {self.rope_theta!r} is too small: RoPE's inverse "
                    f"frequencies theta^(-2i/head_dim) overflow float32 (non-finite) for head_dim {self.head_dim}")
        if self.sliding_window is not None:
            if self.model_type != "mistral":
                raise BubblescopeError(f"model config {self.name}: sliding_window is only kept for model_type "
                                       f"mistral (got {self.sliding_window!r} for {self.model_type})")
            _check_window_never_binds(f"model config {self.name}", self.sliding_window, self.max_position_embeddings)
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise BubblescopeError(
                f"model config {self.name}: unsupported model_type {self.model_type!r} "
                f"(supported: {', '.join(sorted(SUPPORTED_MODEL_TYPES))})")
        if self.hidden_act != "silu":
            raise BubblescopeError(f"model config {self.name}: unsupported hidden_act {self.hidden_act!r} (only silu)")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, dict):
            raise BubblescopeError(f"model config {self.name}: rope_scaling must be an object or null, "
                                   f"got {self.rope_scaling!r}")
        if self.rope_scaling:
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default"))
            if kind not in ("default", "llama3"):
                raise BubblescopeError(
                    f"model config {self.name}: unsupported rope_scaling type {kind!r} (supported: default, llama3)")
            if kind == "llama3":
                self._validate_llama3(self.rope_scaling)

    def _validate_llama3(self, rs: dict) -> None:
        # What rope_inv_freq reads: factor, the two band factors (high > low) and the old context, all required as
        # transformers requires them (_validate_llama3_rope_parameters raises KeyError "Missing required keys";
        # from_hf_dict fills original_max_position_embeddings from max_position_embeddings first, as
        # standardize_rope_params does).
        values = {key: rs.get(key) for key in ("factor", "low_freq_factor", "high_freq_factor",
                                               "original_max_position_embeddings")}
        for key, v in values.items():
            if not _finite(v) or v <= 0:
                raise BubblescopeError(f"model config {self.name}: llama3 rope_scaling.{key} must be a finite "
                                       f"number > 0, got {v!r}")
        if values["high_freq_factor"] <= values["low_freq_factor"]:
            raise BubblescopeError(f"model config {self.name}: llama3 rope_scaling.high_freq_factor "
                                   f"{values['high_freq_factor']!r} must exceed low_freq_factor "
                                   f"{values['low_freq_factor']!r}")

    def tp_shard(self, world_size: int) -> "ModelConfig":
        """The config one of ``world_size`` tensor-parallel ranks computes (Megatron-LM layout): query heads,
        KV heads and intermediate_size divided by ``world_size``; head_dim, hidden_size and vocab_size kept.

        Raises:
            BubblescopeError: ``world_size`` < 1, or num_key_value_heads, num_attention_heads or
                intermediate_size not a multiple of it (each rank holds whole heads and equal MLP slices).
        """
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise BubblescopeError(f"--tp: must be an integer >= 1, got {world_size!r}")
        for name in ("num_key_value_heads", "num_attention_heads", "intermediate_size"):
            value = getattr(self, name)
            if value % world_size:
                raise BubblescopeError(f"--tp {world_size}: {self.name}'s {name} {value} is not a multiple of "
                                       f"{world_size} (each rank must hold whole heads and equal MLP slices)")
        return self.replace(num_attention_heads=self.num_attention_heads // world_size,
                            num_key_value_heads=self.num_key_value_heads // world_size,
                            intermediate_size=self.intermediate_size // world_size, head_dim=self.head_dim)

    # ---- construction --------------------------------------------------------------------
    def replace(self, **changes: Any) -> "ModelConfig":
        """A copy with some fields changed (e.g. ``max_position_embeddings``)."""
        return dataclasses.replace(self, **changes)

    def to_hf_dict(self) -> dict:
        """The config as a Hugging Face ``config.json`` dict (loadable by ``transformers.AutoConfig``)."""
        arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                "qwen3": "Qwen3ForCausalLM"}[self.model_type]
        d = {
            "architectures": [arch], "model_type": self.model_type, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim, "vocab_size": self.vocab_size, "rope_theta": self.rope_theta,
            # a copy: transformers' config adds keys to the dict it is given (rope_theta), which would change
            # this config's own rope_scaling and so its config_sha256
            "rope_scaling": dict(self.rope_scaling) if self.rope_scaling is not None else None,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings, "hidden_act": self.hidden_act,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_id) if len(self.eos_token_id) != 1 else self.eos_token_id[0],
        }
        if self.model_type in ("llama", "mistral"):
            d["attention_bias"] = self.attention_bias
            d["mlp_bias"] = False
        if self.model_type == "mistral":
            # Written even when null: MistralConfig's sliding_window defaults to 4096 when the field is absent, so
            # leaving it out would make transformers (the hf engine) slide beyond 4096 positions.
            d["sliding_window"] = self.sliding_window
        return d

    def config_sha256(self) -> str:
        """SHA-256 (hex) of :meth:`to_hf_dict` as sorted-key JSON: the model's identity by its shapes and
        numbers, whatever it is called (a preset and a checkpoint folder of the same config agree)."""
        import hashlib
        return hashlib.sha256(json.dumps(self.to_hf_dict(), sort_keys=True).encode()).hexdigest()

    @classmethod
    def from_hf_dict(cls, d: dict, name: str = "custom") -> "ModelConfig":
        """Build from a parsed Hugging Face ``config.json``.

        Raises:
            BubblescopeError: unsupported architecture or model_type (named), a feature no engine implements
                (Mistral's ``sliding_window`` below ``max_position_embeddings``, 4096 when the key is absent as in
                ``MistralConfig``, or Qwen's sliding-window layers,
                o_proj biases of Llama / Qwen3 ``attention_bias``, ``mlp_bias``), a missing or ill-typed field, or a
                bos_token_id / eos_token_id outside the vocabulary or a pad_token_id transformers cannot build.
                A Mistral ``sliding_window`` of null, or of at least ``max_position_embeddings``, is full attention
                (:func:`_check_window_never_binds`) and loads.
        """
        d = dict(d)
        if isinstance(d.get("text_config"), dict) and "hidden_size" not in d:
            raise BubblescopeError(f"{name}: multimodal configs are not supported (model_type {d.get('model_type')!r})")
        model_type = d.get("model_type")
        archs = d.get("architectures")
        if not isinstance(model_type, str) or model_type not in SUPPORTED_MODEL_TYPES:
            shown = archs[0] if isinstance(archs, list) and archs else model_type
            raise BubblescopeError(
                f"{name}: unsupported architecture {shown!r} (model_type {model_type!r}); supported model types: "
                f"{', '.join(sorted(SUPPORTED_MODEL_TYPES))}")
        for key in ("tie_word_embeddings", "attention_bias", "mlp_bias"):
            # bool("false") is True: a string here would silently flip the layout.
            if d.get(key) is not None and not isinstance(d[key], bool):
                raise BubblescopeError(f"{name}: config field {key} must be true, false or null, got "
                                       f"{json.dumps(d[key])}")
        if d.get("mlp_bias"):
            raise BubblescopeError(f"{name}: mlp_bias=true is not supported")
        if d.get("attention_bias") and model_type in ("llama", "qwen3"):
            # LlamaAttention / Qwen3Attention put bias=attention_bias on o_proj too; no engine adds an o_proj bias.
            raise BubblescopeError(f"{name}: attention_bias=true (q/k/v and o_proj biases) is not supported for "
                                   f"model_type {model_type} (only qwen2's q/k/v biases are)")
        required = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
        missing = [k for k in required if k not in d]
        if missing:
            raise BubblescopeError(f"{name}: config is missing {', '.join(missing)}")
        _check_dtype_fields(name, d)
        family = SUPPORTED_MODEL_TYPES[model_type]
        if family in ("qwen2", "qwen3"):
            _check_no_sliding_layers(name, d, model_type)
        _check_layer_types(name, d)
        _check_pad_token_id(name, d)
        eos = d.get("eos_token_id")

        def integer(key: str, value: Any) -> int:
            # transformers 5's @strict configs type these fields int: 64.0 is refused ("Field 'hidden_size'
            # expected int, got float"), as are 64.5, "64", true and null.
            if isinstance(value, bool) or not isinstance(value, int):
                raise BubblescopeError(f"{name}: config field {key} must be an integer, got {value!r}")
            return value

        def number(key: str, value: Any) -> float:
            if not _finite(value):
                raise BubblescopeError(f"{name}: config field {key} must be a finite number, got {value!r}")
            return float(value)

        max_positions = integer("max_position_embeddings", d.get("max_position_embeddings", 2048))
        window = None
        if model_type == "mistral":
            # MistralConfig: ``sliding_window: int | None = 4096``, so an absent key slides at 4096; null is no window.
            window = d.get("sliding_window", 4096)
            _check_window_never_binds(name, window, max_positions, absent="sliding_window" not in d)
        theta_key, theta, rope_scaling = _hf_rope(name, d, max_positions)
        cfg = cls(
            hidden_size=integer("hidden_size", d["hidden_size"]),
            intermediate_size=integer("intermediate_size", d["intermediate_size"]),
            num_hidden_layers=integer("num_hidden_layers", d["num_hidden_layers"]),
            num_attention_heads=integer("num_attention_heads", d["num_attention_heads"]),
            # transformers falls back only when the field is absent or null: an explicit 0 is an error.
            num_key_value_heads=integer("num_key_value_heads", d["num_attention_heads"]
                                        if d.get("num_key_value_heads") is None else d["num_key_value_heads"]),
            vocab_size=integer("vocab_size", d["vocab_size"]),
            head_dim=_explicit_head_dim(name, d.get("head_dim")),
            rope_theta=number(theta_key, theta),
            rope_scaling=rope_scaling,
            # 1e-6 when absent for all four (LlamaConfig / MistralConfig / Qwen2Config / Qwen3Config: rms_norm_eps
            # float = 1e-6).
            rms_norm_eps=number("rms_norm_eps", d.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings") or False),
            # As transformers builds them: Qwen2Attention always has q/k/v biases (it has no attention_bias field),
            # MistralAttention never has any; Llama and Qwen3 with attention_bias=true are refused above.
            attention_bias=family == "qwen2",
            qk_norm=family == "qwen3",
            max_position_embeddings=max_positions,
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
            model_type=model_type,
            name=name,
            hidden_act=d.get("hidden_act", "silu"),
            sliding_window=window,
        )
        _check_token_ids_in_vocab(name, cfg)
        return cfg

    @classmethod
    def from_hf_config(cls, path: str | Path) -> "ModelConfig":
        """Read a ``config.json`` (or a directory holding one).

        A ``generation_config.json`` beside a ``config.json`` gives the ``eos_token_id`` generation stops at, over
        config.json's, as transformers' ``generate`` takes it from the model's ``generation_config`` (loaded from
        that file by ``from_pretrained``); where the file has no ``eos_token_id`` (or null), config.json's holds.

        Raises:
            BubblescopeError: the path is missing, holds no config.json, is not JSON, or is unsupported; a
                generation_config.json that is not a JSON object, or whose eos_token_id is not a token id or a
                list of them inside the vocabulary.
        """
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
            if not p.is_file():
                raise BubblescopeError(f"{path}: directory has no config.json")
        if not p.is_file():
            raise BubblescopeError(f"{path}: no such file")
        try:
            d = json.loads(p.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise BubblescopeError(f"{p}: not valid JSON ({e.__class__.__name__}: {e})") from None
        if not isinstance(d, dict):
            raise BubblescopeError(f"{p}: expected a JSON object")
        from .config_name import config_name
        name = config_name(p, d)
        try:
            cfg = cls.from_hf_dict(d, name=name)  # config.json's own eos_token_id checked too
        except BubblescopeError as e:
            # The messages name the model (the folder); the user needs the file to fix.
            msg = str(e)
            for prefix in (f"model config {name}: ", f"{name}: "):
                if msg.startswith(prefix):
                    msg = msg[len(prefix):]
                    break
            raise BubblescopeError(f"{p}: {msg}") from None
        if p.name == "config.json" and (eos := _generation_eos(p.parent / "generation_config.json", d)) is not None:
            cfg = cfg.replace(eos_token_id=tuple(eos) if isinstance(eos, list) else eos)
        return cfg


def _generation_eos(path: Path, config: dict) -> int | list[int] | None:
    """The ``eos_token_id`` of the ``generation_config.json`` at ``path`` (an int or a list of ints, as written),
    or None when there is no such file or it sets none.

    Raises:
        BubblescopeError: the file is not a JSON object, or its eos_token_id is not a token id (an integer >= 0)
            or a list of them, or lies outside config.json's vocabulary (``vocab_size``); the message names the file.
    """
    if not path.is_file():
        return None
    try:
        g = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise BubblescopeError(f"{path}: not valid JSON ({e.__class__.__name__}: {e})") from None
    except OSError as e:
        raise BubblescopeError(f"{path}: cannot read ({e.strerror or type(e).__name__})") from None
    if not isinstance(g, dict):
        raise BubblescopeError(f"{path}: expected a JSON object")
    eos = g.get("eos_token_id")
    if eos is None:
        return None
    ids = eos if isinstance(eos, list) else [eos]
    if not all(_token_id(e) for e in ids):
        raise BubblescopeError(f"{path}: eos_token_id must be a token id or a list of them, got {json.dumps(eos)}")
    vocab = config.get("vocab_size")
    bad = [e for e in ids if _token_id(vocab) and e >= vocab]
    if bad:
        raise BubblescopeError(f"{path}: eos_token_id {bad[0]} is outside the vocabulary (vocab_size {vocab}: token "
                               f"ids 0 to {vocab - 1})")
    return eos


def _check_dtype_fields(name: str, d: dict) -> None:
    """``torch_dtype`` / ``dtype`` (the name transformers >= 4.56 writes), when present, must be null or the
    name of a torch dtype: transformers' ``PretrainedConfig`` turns the string into ``getattr(torch, value)``
    and fails on anything else ("float99", "auto"). bubblescope computes in ``--dtype`` whatever the
    checkpoint says, but a config transformers cannot load is not silently accepted either.

    Raises:
        BubblescopeError: the field is not a string or null, or the string names no torch dtype.
    """
    import torch

    for key in ("torch_dtype", "dtype"):
        value = d.get(key)
        if value is None:
            continue
        if not (isinstance(value, str) and isinstance(getattr(torch, value, None), torch.dtype)):
            raise BubblescopeError(
                f"{name}: config field {key} must be a torch dtype name (float32, float16, bfloat16, float64, "
                f"... as transformers reads it) or null, got {json.dumps(value)}")


def _check_window_never_binds(name: str, window: Any, max_positions: int, absent: bool = False) -> None:
    """Accept a Mistral ``sliding_window`` that cannot change attention; refuse one that can.

    In transformers a null ``sliding_window`` means no window ("If `None`, no sliding window is applied":
    ``utils/auto_docstring.py``; ``MistralModel.forward`` then builds a plain causal mask), and a window ``W``
    lets a query at position ``q`` see the keys at positions ``k > q - W`` (``masking_utils.sliding_window_overlay``,
    transformers 5.x; SDPA keeps the plain causal mask while the keys are fewer than ``W``:
    ``_ignore_causal_mask_sdpa``). So the window only hides a key once the sequence is longer than ``W``
    (as a maintainer put it: the window is disabled "if it's None or larger than content length",
    https://huggingface.co/mistralai/Mistral-7B-Instruct-v0.2/discussions/16). Every engine here keeps at most
    ``max_position_embeddings`` positions (``q - k <= max_positions - 1``), so ``W >= max_positions`` never
    binds: full attention, which the engines implement, is exactly the windowed attention. A smaller window
    would slide within the context the engines can reach, and is refused.

    Raises:
        BubblescopeError: ``window`` is neither null nor an integer, or is below ``max_positions``.
    """
    if window is None:
        return
    if isinstance(window, bool) or not isinstance(window, int):  # 4096.0 too: MistralConfig types it int | None
        raise BubblescopeError(f"{name}: config field sliding_window must be an integer or null, got "
                               f"{json.dumps(window)}")
    if window < max_positions:
        given = " (MistralConfig's default: config.json has no sliding_window)" if absent else ""
        raise BubblescopeError(f"{name}: Mistral with sliding_window={window}{given} is not supported (below "
                               f"max_position_embeddings={max_positions}, so attention would slide; the engines "
                               "implement full attention)")


def _check_no_sliding_layers(name: str, d: dict, model_type: str) -> None:
    """Refuse a Qwen2 / Qwen3 config in which some layer uses sliding-window attention, by transformers' rule
    (``Qwen2Config`` / ``Qwen3Config``): only with ``use_sliding_window`` true and ``sliding_window`` set, on the
    layers ``layer_types`` marks ``sliding_attention``, or else on layers ``max_window_layers`` (default 28) and
    above. ``sliding_window`` alone (``use_sliding_window`` false or absent, as Qwen2.5 ships) is full attention.

    Raises:
        BubblescopeError: ``use_sliding_window`` is not a bool or null, ``max_window_layers`` is not an integer
            when it decides, or some layer slides (the message gives the window and which layers).
    """
    use = d.get("use_sliding_window")
    if use is not None and not isinstance(use, bool):  # bool("false") is True
        raise BubblescopeError(f"{name}: config field use_sliding_window must be true, false or null, got "
                               f"{json.dumps(use)}")
    window, n = d.get("sliding_window"), d.get("num_hidden_layers")
    # Qwen2Config / Qwen3Config type both int (sliding_window: int | None, max_window_layers: int), checked whether
    # or not they decide anything: 4096.0 is refused by transformers 5's @strict configs.
    for key, value in (("sliding_window", window), ("max_window_layers", d.get("max_window_layers"))):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise BubblescopeError(f"{name}: config field {key} must be an integer or null, got {json.dumps(value)}")
    if not use or window is None or not _positive_int(n):  # a bad num_hidden_layers is named by from_hf_dict
        return
    kinds = d.get("layer_types")
    if isinstance(kinds, list):
        sliding = [i for i, kind in enumerate(kinds[:n]) if kind == "sliding_attention"]
    else:
        first = d.get("max_window_layers", 28)
        if isinstance(first, bool) or not isinstance(first, int):
            raise BubblescopeError(f"{name}: config field max_window_layers must be an integer, got {first!r}")
        sliding = list(range(max(first, 0), n))
    if sliding:
        raise BubblescopeError(f"{name}: use_sliding_window=true (sliding_window={window} on {len(sliding)} of "
                               f"{n} layers, from layer {sliding[0]}) is not supported for model_type {model_type}")


def _hf_rope(name: str, d: dict, max_positions: int) -> tuple[str, Any, dict | None]:
    """RoPE settings as transformers 5 resolves them: ``(theta's field, theta, rope_scaling)``.

    ``PreTrainedConfig.convert_rope_params_to_dict`` (transformers ``modeling_rope_utils.py``) takes
    ``rope_scaling or rope_parameters`` (a non-empty ``rope_scaling`` replaces ``rope_parameters`` whole), then
    ``setdefault("rope_theta", <top-level rope_theta, else 10000>)``: a ``rope_theta`` inside that dict wins over
    the top-level one, and one inside the dict not taken is ignored. ``standardize_rope_params`` then sets
    ``rope_type`` from the legacy ``type`` key and, for llama3, ``original_max_position_embeddings`` to
    ``max_position_embeddings`` when absent. A default rope type (or none) gives ``rope_scaling`` None.

    Raises:
        BubblescopeError: ``rope_scaling`` or ``rope_parameters`` is neither an object nor null.
    """
    rs, rp = d.get("rope_scaling"), d.get("rope_parameters")
    if rs is not None and not isinstance(rs, dict):
        raise BubblescopeError(f"{name}: rope_scaling must be an object or null, got {rs!r}")
    if rp is not None and not isinstance(rp, dict):
        raise BubblescopeError(f"{name}: rope_parameters must be an object or null, got {rp!r}")
    source, chosen = ("rope_scaling", dict(rs)) if rs else ("rope_parameters", dict(rp or {}))
    if "rope_theta" in chosen:
        theta_key, theta = f"{source}.rope_theta", chosen.pop("rope_theta")
    else:
        theta_key, theta = "rope_theta", d.get("rope_theta", 10000.0)
    kind = chosen.get("rope_type", chosen.get("type", "default"))
    if kind == "default":
        return theta_key, theta, None
    if kind == "llama3":
        chosen.setdefault("original_max_position_embeddings", max_positions)
    return theta_key, theta, chosen


def _check_layer_types(name: str, d: dict) -> None:
    """``layer_types``, when given, as transformers 5 checks it (``PreTrainedConfig.validate_layer_type``, run by
    every config): one entry per layer ("`num_hidden_layers` (5) must be equal to the number of `layer_types` (2)").
    Entries are limited to full_attention / sliding_attention, the two kinds these model types build
    (whether a sliding layer is refused is :func:`_check_no_sliding_layers`' rule).

    Raises:
        BubblescopeError: ``layer_types`` is not a list, has another length than ``num_hidden_layers``, or holds
            another entry.
    """
    kinds, n = d.get("layer_types"), d.get("num_hidden_layers")
    if kinds is None:
        return
    if not isinstance(kinds, list):
        raise BubblescopeError(f"{name}: config field layer_types must be a list or null, got {json.dumps(kinds)}")
    bad = next((k for k in kinds if k not in ("full_attention", "sliding_attention")), None)
    if bad is not None:
        raise BubblescopeError(f"{name}: config field layer_types holds {json.dumps(bad)} (supported: "
                               "full_attention, sliding_attention)")
    if _positive_int(n) and len(kinds) != n:
        raise BubblescopeError(f"{name}: config field layer_types has {len(kinds)} entries, but num_hidden_layers "
                               f"is {n} (transformers requires one per layer)")


def _check_token_ids_in_vocab(name: str, cfg: ModelConfig) -> None:
    """A config file's ``bos_token_id`` and ``eos_token_id`` (each of a list) inside ``[0, vocab_size)``.

    The engines use both: bos_token_id starts a prompt, eos_token_id stops generation. transformers only warns
    about an id outside the vocabulary (``PreTrainedConfig.validate_token_ids``: "must be `None` or an integer
    within the vocabulary (between 0 and {vocab_size - 1})"); embedding such a bos fails with an index error and
    such an eos can never be generated, so they are refused. Checked on the file, not in ``validate``: a
    tensor-parallel shard's config holds part of the vocabulary by design (``profiler/traffic.py``).

    Raises:
        BubblescopeError: the first id outside the vocabulary, with its field.
    """
    for key, ids in (("bos_token_id", () if cfg.bos_token_id is None else (cfg.bos_token_id,)),
                     ("eos_token_id", cfg.eos_token_id)):
        bad = [i for i in ids if i >= cfg.vocab_size]
        if bad:
            raise BubblescopeError(f"{name}: {key} {bad[0]} is outside the vocabulary (vocab_size {cfg.vocab_size}: "
                                   f"token ids 0 to {cfg.vocab_size - 1})")


def _check_pad_token_id(name: str, d: dict) -> None:
    """``pad_token_id`` as transformers builds it: no engine here uses it, but ``LlamaModel`` and the others pass
    it as ``nn.Embedding(vocab_size, hidden_size, padding_idx)``, which asserts "Padding_idx must be within
    num_embeddings" (``-vocab_size <= padding_idx < vocab_size``; the -1 some Hub configs store is fine), and the
    @strict configs type it ``int | None``.

    Raises:
        BubblescopeError: ``pad_token_id`` is not an integer or null, or lies outside that range.
    """
    pad, vocab = d.get("pad_token_id"), d.get("vocab_size")
    if pad is None:
        return
    if isinstance(pad, bool) or not isinstance(pad, int):
        raise BubblescopeError(f"{name}: config field pad_token_id must be an integer or null, got {json.dumps(pad)}")
    if _positive_int(vocab) and not -vocab <= pad < vocab:
        raise BubblescopeError(f"{name}: pad_token_id {pad} is outside the vocabulary (vocab_size {vocab}: "
                               f"{-vocab} to {vocab - 1}, as transformers' nn.Embedding(padding_idx=pad_token_id) "
                               "requires)")


def _explicit_head_dim(name: str, value: Any) -> int:
    """``head_dim`` as given, or 0 (derive it from hidden_size) when absent or null, as transformers does.

    Raises:
        BubblescopeError: an explicit value that is not a positive integer (0 would otherwise be derived).
    """
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise BubblescopeError(f"{name}: config field head_dim must be a positive integer or null, got {value!r}")
    return value


def _llama3_scaling(factor: float) -> dict:
    # 8192 trained positions, stretched `factor` times: a preset's max_position_embeddings must be above 8192
    # (transformers warns otherwise).
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}


# Flat dict of named presets (values from each model's public config.json).
PRESETS: dict[str, ModelConfig] = {
    "llama-3.2-1b": ModelConfig(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, vocab_size=128256, rope_theta=500000.0,
        rope_scaling=_llama3_scaling(32.0), rms_norm_eps=1e-5, tie_word_embeddings=True,
        max_position_embeddings=131072, bos_token_id=128000, eos_token_id=(128001,), name="llama-3.2-1b"),
    "llama-3.2-3b": ModelConfig(
        hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
        num_key_value_heads=8, head_dim=128, vocab_size=128256, rope_theta=500000.0,
        rope_scaling=_llama3_scaling(32.0), rms_norm_eps=1e-5, tie_word_embeddings=True,
        max_position_embeddings=131072, bos_token_id=128000, eos_token_id=(128001,), name="llama-3.2-3b"),
    "llama-3.1-8b": ModelConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=128256, rope_theta=500000.0,
        rope_scaling=_llama3_scaling(8.0), rms_norm_eps=1e-5, tie_word_embeddings=False,
        max_position_embeddings=131072, bos_token_id=128000, eos_token_id=(128001,), name="llama-3.1-8b"),
    "qwen2.5-0.5b": ModelConfig(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, head_dim=64, vocab_size=151936, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, attention_bias=True, max_position_embeddings=32768, bos_token_id=151643,
        eos_token_id=(151643,), model_type="qwen2", name="qwen2.5-0.5b"),
    "qwen3-0.6b": ModelConfig(
        hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, qk_norm=True, max_position_embeddings=40960, bos_token_id=151643,
        eos_token_id=(151645,), model_type="qwen3", name="qwen3-0.6b"),
    "qwen3-1.7b": ModelConfig(
        hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, qk_norm=True, max_position_embeddings=40960, bos_token_id=151643,
        eos_token_id=(151645,), model_type="qwen3", name="qwen3-1.7b"),
    # llama2.c header: dim 64, hidden_dim 172, 5 layers, 8 heads, 4 kv heads, vocab 512 (shared), seq_len 512.
    "stories260k": ModelConfig(
        hidden_size=64, intermediate_size=172, num_hidden_layers=5, num_attention_heads=8,
        num_key_value_heads=4, vocab_size=512, rope_theta=10000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True, max_position_embeddings=512, bos_token_id=1, eos_token_id=(2,),
        name="stories260k"),
    # A small made-up Llama (GQA, llama3 RoPE scaling) for CPU smoke runs with dummy weights.
    "tiny-llama": ModelConfig(
        hidden_size=128, intermediate_size=344, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=2, vocab_size=1024, rope_theta=500000.0, rope_scaling=_llama3_scaling(8.0),
        rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=65536, bos_token_id=1,
        eos_token_id=(2,), name="tiny-llama"),
}


def get_preset(name: str) -> ModelConfig:
    """A preset by name (case-insensitive).

    Raises:
        BubblescopeError: unknown name; the message lists the known presets.
    """
    key = name.lower()
    if key not in PRESETS:
        raise BubblescopeError(f"unknown model preset {name!r}; known presets: {', '.join(PRESETS)}")
    return PRESETS[key]


def kv_bytes_per_token(cfg: ModelConfig, dtype_bytes: int) -> int:
    """KV-cache bytes one position occupies across all layers: 2 (K and V) × layers × kv_heads × head_dim × bytes."""
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * dtype_bytes


def _default_inv_freq(theta: float, d: int) -> "torch.Tensor":
    """``1 / theta ** (arange(0, d, 2) / d)`` in float32, as transformers' ``_compute_default_rope_parameters``."""
    import torch

    return 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))


def rope_inv_freq(cfg: ModelConfig) -> "torch.Tensor":
    """RoPE inverse frequencies: float32 tensor of shape (head_dim // 2,), llama3-scaled when configured.

    Formula: ``inv_freq[i] = theta ** (-2i / head_dim)`` computed in float32 exactly as transformers'
    ``_compute_default_rope_parameters`` does; llama3 scaling follows ``_compute_llama3_parameters``
    (transformers modeling_rope_utils.py): wavelengths longer than ``original_max / low_freq_factor``
    are divided by ``factor``, those shorter than ``original_max / high_freq_factor`` are kept, and the
    band between is interpolated smoothly.
    """
    import torch

    inv = _default_inv_freq(cfg.rope_theta, cfg.head_dim)
    rs = cfg.rope_scaling or {}
    if rs.get("rope_type", rs.get("type")) != "llama3":
        return inv
    factor = float(rs["factor"])
    low, high = float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
    old_ctx = float(rs["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)
