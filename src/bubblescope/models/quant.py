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
# the checkpoint config's check lives without torch (diagnose trace reads configs only); re-exported for the loader
from .quant_config import QUANTIZATION_CONFIG, SUPPORTED, check_quantization_config  # noqa: F401

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


# ---- compressed-tensors checkpoints: the config is checked by .quant_config (no torch), the tensors here --------
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
