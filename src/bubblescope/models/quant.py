"""FP8 (e4m3) weights with one float32 scale per output row, and the compressed-tensors checkpoints that hold them.

At batch size 1 a decode step's time is its bytes over the memory bandwidth, so weights stored in 1 byte instead
of 2 halve the step's floor. The format is the one vLLM and compressed-tensors call "FP8, per-channel, static,
symmetric": ``qweight`` in ``torch.float8_e4m3fn`` (out_features, in_features) and ``scale`` float32
(out_features,), so that ``W ≈ qweight · scale[:, None]``. Quantizing a row ``w``: ``scale = amax(|w|) / 448``
(448 is e4m3fn's largest finite value, ``torch.finfo(torch.float8_e4m3fn).max``; the OCP 8-bit floating point
specification, 2023, section 5.1), ``qweight = round_to_nearest_even(clamp(w / scale, −448, 448))``. A row of zeros
has scale 0 and a zero qweight (no 0/0).

Which weights: the seven projections of every layer (q/k/v/o, gate/up/down); ``fp8-all`` the LM head too.
Embeddings, norms and biases stay in the activation dtype (an embedding row is gathered, not streamed, and
norms are a few KB).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import BubblescopeError

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0            # torch.finfo(torch.float8_e4m3fn).max
SCALE_BYTES = 4            # one float32 scale per output row
# ``--weights``: ``bf16``: no quantization, every weight in the activation dtype (``--dtype``); ``fp8``: the
# projections in FP8; ``fp8-all``: the LM head too.
WEIGHT_FORMATS = ("bf16", "fp8", "fp8-all")
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class QuantizedLinear:
    """One projection in FP8: ``qweight`` float8_e4m3fn (out, in), ``scale`` float32 (out,);
    ``W ≈ qweight.float() · scale[:, None]``."""

    qweight: torch.Tensor  # (out, in) float8_e4m3fn
    scale: torch.Tensor    # (out,) float32

    @property
    def shape(self) -> torch.Size:
        return self.qweight.shape

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.qweight.dtype

    def nbytes(self) -> int:
        """Bytes stored: 1 per weight plus 4 per row's scale."""
        return self.qweight.numel() * self.qweight.element_size() + self.scale.numel() * self.scale.element_size()

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """``qweight · scale[:, None]`` in ``dtype``, (out, in): the product formed in float32 (exact but for one
        float32 rounding: a 4-bit e4m3 significand times a 24-bit one), then rounded to ``dtype`` once."""
        return (self.qweight.to(torch.float32) * self.scale[:, None]).to(dtype)

    def to(self, device=None) -> "QuantizedLinear":
        """A copy on ``device`` (the FP8 and float32 dtypes kept)."""
        return QuantizedLinear(self.qweight.to(device=device), self.scale.to(device=device))


def is_quantized(t) -> bool:
    return isinstance(t, QuantizedLinear)


def quantize_fp8(w: torch.Tensor) -> QuantizedLinear:
    """Quantize ``w`` (out, in), any float dtype, to FP8 e4m3 with a float32 scale per row (module docstring).

    The row's largest magnitude maps to exactly ±448; a zero row gets scale 0 and zeros (never NaN). Non-finite
    weights give non-finite scales (the loader warns about such weights before: ``loader.nonfinite_weights``).

    Raises:
        BubblescopeError: ``w`` is not a 2-D floating-point tensor.
    """
    if w.dim() != 2 or not w.is_floating_point():
        raise BubblescopeError(f"fp8 quantization: expected a 2-D floating-point weight, got {tuple(w.shape)} "
                               f"{str(w.dtype).replace('torch.', '')}")
    w32 = w.to(torch.float32)
    scale = w32.abs().amax(dim=1) / FP8_MAX                               # (out,)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))          # a zero row divides by 1, not 0
    q = (w32 / safe[:, None]).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)     # (out, in), round to nearest even
    return QuantizedLinear(q, scale)


def parse_weight_format(name: str | None) -> str | None:
    """``--weights`` value checked: one of :data:`WEIGHT_FORMATS`, or None (the checkpoint's own form).

    Raises:
        BubblescopeError: another value (the message lists the accepted ones).
    """
    if name is None:
        return None
    if name not in WEIGHT_FORMATS:
        raise BubblescopeError(f"--weights: unknown weight format {name!r}; use {', '.join(WEIGHT_FORMATS)}")
    return name


# ---- compressed-tensors checkpoints ---------------------------------------------------------------------------
# What is read: ``config.json``'s ``quantization_config`` with ``quant_method: compressed-tensors``, format
# ``float-quantized`` (FP8 weights and dynamic FP8 activations, "FP8-dynamic") or ``naive-quantized`` (FP8 weights
# only), status ``compressed``, and in every config group a weight scheme of ``type: float``, ``num_bits: 8``,
# ``strategy: channel``, symmetric, static (``dynamic: false``). The tensors are ``<name>.weight`` in
# float8_e4m3fn and ``<name>.weight_scale`` of shape (out, 1) (compressed-tensors' ``NaiveQuantizationCompressor``:
# dequantize = weight · weight_scale; symmetric schemes store no zero point). Anything else is refused by name.
_ACCEPTED_FORMATS = ("float-quantized", "naive-quantized")
# What ``weights.save_hf_checkpoint`` writes for FP8 weights (activations unquantized: naive-quantized).
QUANTIZATION_CONFIG = {
    "quant_method": "compressed-tensors", "format": "naive-quantized", "quantization_status": "compressed",
    "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "output_activations": None,
                                  "weights": {"type": "float", "num_bits": 8, "strategy": "channel",
                                              "symmetric": True, "dynamic": False, "group_size": None}}},
    "kv_cache_scheme": None, "sparsity_config": None,
}
SUPPORTED = ("bubblescope reads FP8 e4m3 compressed-tensors checkpoints with static per-channel weight scales "
             "only")


def _refuse(where: str, what: str) -> BubblescopeError:
    return BubblescopeError(f"{where}: quantization_config {what} is not supported; {SUPPORTED}")


def check_quantization_config(qc, where: str) -> list[str]:
    """Accept exactly the compressed-tensors FP8 per-channel layout (see above); returns notes for the user
    (one line each: dynamic activation quantization that is not applied here).

    Args:
        qc: ``config.json``'s ``quantization_config`` value.
        where: the config file, for the messages.

    Raises:
        BubblescopeError: any other quantization method, format, status, scheme, KV-cache or sparsity scheme,
            or static input activation scales (the message names the field and its value).
    """
    if not isinstance(qc, dict):
        raise _refuse(where, f"of type {type(qc).__name__}")
    method = qc.get("quant_method")
    if method != "compressed-tensors":
        raise _refuse(where, f"quant_method {method!r}")
    fmt = qc.get("format")
    if fmt not in _ACCEPTED_FORMATS:
        raise _refuse(where, f"format {fmt!r} (accepted: {', '.join(_ACCEPTED_FORMATS)})")
    if qc.get("quantization_status", "compressed") != "compressed":
        raise _refuse(where, f"quantization_status {qc.get('quantization_status')!r} (only compressed)")
    for key in ("kv_cache_scheme", "transform_config"):
        if qc.get(key) is not None:
            raise _refuse(where, f"{key} (a quantized KV cache or a weight transform)")
    sparsity = qc.get("sparsity_config")
    if sparsity is not None and not (isinstance(sparsity, dict) and sparsity.get("format", "dense") == "dense"):
        raise _refuse(where, "sparsity_config (sparse weights)")
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise _refuse(where, "without config_groups")
    notes = []
    for gname, g in groups.items():
        if not isinstance(g, dict):
            raise _refuse(where, f"config group {gname} of type {type(g).__name__}")
        if g.get("format") not in (None, *_ACCEPTED_FORMATS):
            raise _refuse(where, f"config group {gname} format {g.get('format')!r}")
        w = g.get("weights")
        want = {"type": "float", "num_bits": 8, "strategy": "channel"}
        if not isinstance(w, dict):
            raise _refuse(where, f"config group {gname} without a weight scheme")
        for key, value in want.items():
            if w.get(key) != value:
                raise _refuse(where, f"config group {gname} weights {key} {w.get(key)!r} (need {value!r})")
        for key, value in (("symmetric", True), ("dynamic", False)):
            if w.get(key, value) is not value:
                raise _refuse(where, f"config group {gname} weights {key} {w.get(key)!r} (need {value})")
        for key in ("group_size", "block_structure", "actorder"):
            if w.get(key) is not None:
                raise _refuse(where, f"config group {gname} weights {key} {w.get(key)!r}")
        if g.get("output_activations") is not None:
            raise _refuse(where, f"config group {gname} output_activations")
        act = g.get("input_activations")
        if act is not None:
            if not isinstance(act, dict) or act.get("dynamic") is not True:
                raise _refuse(where, f"config group {gname} input_activations with static scales")
            notes.append(f"weights: {where} quantizes activations dynamically ({act.get('type')} "
                         f"{act.get('num_bits')}-bit per {act.get('strategy')}); bubblescope runs the FP8 weights "
                         "with activations in --dtype (weight-only)")
    return list(dict.fromkeys(notes))


def checkpoint_linear(weight: torch.Tensor, scale: torch.Tensor, name: str, shape: tuple[int, int],
                      where: str) -> QuantizedLinear:
    """A compressed-tensors projection: ``weight`` float8_e4m3fn of ``shape`` and ``<name>_scale`` (out, 1) or
    (out,), any float dtype, as a :class:`QuantizedLinear` (scale in float32).

    Raises:
        BubblescopeError: a weight of another shape or dtype, or a scale of another shape, not floating point, or
            negative or non-finite (the tensor is named).
    """
    if tuple(weight.shape) != shape:
        raise BubblescopeError(f"{where}: tensor {name} has shape {tuple(weight.shape)}, expected {shape}")
    if weight.dtype != FP8_DTYPE:
        raise BubblescopeError(f"{where}: tensor {name} has a {name}_scale but dtype "
                               f"{str(weight.dtype).replace('torch.', '')}, expected float8_e4m3fn")
    if tuple(scale.shape) not in ((shape[0], 1), (shape[0],)) or not scale.is_floating_point():
        raise BubblescopeError(f"{where}: tensor {name}_scale has shape {tuple(scale.shape)} "
                               f"{str(scale.dtype).replace('torch.', '')}, expected a float ({shape[0]}, 1): one "
                               "scale per output row")
    s = scale.reshape(-1).to(torch.float32)
    if not bool(torch.isfinite(s).all()) or bool((s < 0).any()):
        raise BubblescopeError(f"{where}: tensor {name}_scale holds negative or non-finite scales")
    return QuantizedLinear(weight, s)
