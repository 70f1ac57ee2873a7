"""Weights re-laid-out for the megakernel: per-layer tensors stacked, rows permuted so every task's tile
is one contiguous block of memory.

Layouts (L layers, H hidden, Q = heads·D, KV = kv_heads·D, I intermediate, D head_dim, HALF = D/2):

* ``wqkv`` (L, Q + 2·KV, H): the q, k and v matrices stacked (rows ``[0, Q)``, ``[Q, Q+KV)``,
  ``[Q+KV, Q+2KV)`` before packing), with rows in *pair order*: RoPE (rotate_half convention) mixes row
  ``i`` with row ``i + HALF`` of the same head, so pair ``j`` of the stack (head ``j // HALF`` counting q
  heads, then k heads, then v heads; ``i = j % HALF``) is stored as

      packed_lo(j) = (j // hb)·2·hb + j % hb       (row head·D + i of the stacked HF matrices)
      packed_hi(j) = packed_lo(j) + hb              (row head·D + HALF + i)

  i.e. blocks of ``hb`` "first half" rows followed by the matching ``hb`` "second half" rows. A task of
  ``n`` pairs starting at a multiple of ``hb`` (``hb`` divides ``n``) reads the contiguous rows
  ``[2·start, 2·(start+n))``. v is paired the same way (and not rotated), so one tile size covers the
  whole matrix. With ``hb = HALF`` the permutation is the identity.
* ``bqkv`` (L, Q + 2·KV): biases permuted like the rows (Qwen2), else None.
* ``qknorm`` (L, 2, D): q_norm and k_norm weights (Qwen3), else None.
* ``wgu`` (L, 2·I_pad, H): gate and up interleaved in blocks of ``gb`` rows — gate rows
  ``[b·gb, (b+1)·gb)`` then the same up rows — padded with zero rows to ``I_pad`` pairs.
* ``wo`` (L, H, Q), ``wdown`` (L, H, I), ``anorm``/``mnorm`` (L, H): stacked as they are.
* ``cos``/``sin`` (max_seq_len, HALF) float32: ``cos(pos · inv_freq[i])`` computed on the CPU in float32
  exactly as the reference engine and transformers do (``torch.outer(pos, inv_freq)``), so the tables are
  bit-identical; the kernel casts them to the activation dtype at use, as transformers does.

FP8 weights (``weight_format`` ``fp8`` / ``fp8-all``: :class:`~bubblescope.models.quant.QuantizedLinear`): the
matrices above hold the float8_e4m3fn ``qweight`` rows, permuted and stacked exactly as the unquantized rows, and
each gets its float32 row scales beside it, permuted the same way so packed row ``r``'s scale is at ``r``:
``sqkv`` (L, Q + 2·KV), ``sgu`` (L, 2·I_pad) (0 for the pad rows, whose weights are 0 too), ``so`` (L, H),
``sdown`` (L, H), and ``slm`` (V,) when the LM head is FP8 (``fp8-all``). Packed row ``r`` stands for
``qweight[r].float() · scale[r]``. Unquantized weights leave the scale fields None and pack as before,
bit for bit. FP8 tensors are moved through their uint8 bytes (stacking, gathering, zero padding), which every
device supports for that dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.config import rope_inv_freq
from ..models.quant import FP8_DTYPE, QuantizedLinear
from ..models.weights import ModelWeights
from .schedule import Tiling


SCALE_FIELDS = ("sqkv", "so", "sgu", "sdown", "slm")  # PackedWeights' FP8 row scales; kernel arguments ``<name>_ptr``


@dataclass
class PackedWeights:
    """Kernel-layout weights (see the module docstring); every tensor contiguous, on the weights' device.

    The weight matrices are in the activation dtype, or float8_e4m3fn with their float32 row scales in the
    ``s*`` fields (None for unquantized weights); ``lm_head`` may stay in the activation dtype while the layers
    are FP8 (``fp8``)."""

    embed: torch.Tensor            # (V, H)
    lm_head: torch.Tensor          # (V, H) — the same storage as embed when tied
    final_norm: torch.Tensor       # (H,)
    wqkv: torch.Tensor             # (L, Q + 2KV, H)
    bqkv: torch.Tensor | None      # (L, Q + 2KV)
    qknorm: torch.Tensor | None    # (L, 2, D)
    anorm: torch.Tensor            # (L, H)
    wo: torch.Tensor               # (L, H, Q)
    mnorm: torch.Tensor            # (L, H)
    wgu: torch.Tensor              # (L, 2·I_pad, H)
    wdown: torch.Tensor            # (L, H, I)
    cos: torch.Tensor              # (S, HALF) float32
    sin: torch.Tensor              # (S, HALF) float32
    sqkv: torch.Tensor | None = None   # (L, Q + 2KV) float32, FP8 layers: wqkv's row scales
    sgu: torch.Tensor | None = None    # (L, 2·I_pad) float32, FP8 layers: wgu's row scales (pad rows 0)
    so: torch.Tensor | None = None     # (L, H) float32, FP8 layers: wo's row scales
    sdown: torch.Tensor | None = None  # (L, H) float32, FP8 layers: wdown's row scales
    slm: torch.Tensor | None = None    # (V,) float32, FP8 LM head (fp8-all): lm_head's row scales

    @property
    def fp8(self) -> bool:
        """The layer matrices are float8_e4m3fn with row scales."""
        return self.sqkv is not None

    @property
    def fp8_head(self) -> bool:
        """The LM head is float8_e4m3fn with row scales (``fp8-all``)."""
        return self.slm is not None

    def nbytes(self) -> int:
        """Bytes of the distinct tensors held (a tied head counted once; FP8 matrices 1 byte per weight plus
        their float32 row scales; the cos/sin tables included)."""
        seen, n = set(), 0
        for t in vars(self).values():
            if isinstance(t, torch.Tensor) and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                n += t.numel() * t.element_size()
        return n


def rope_pair_rows(n_pairs: int, head_dim: int, hb: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For pairs ``j = 0..n_pairs-1``: (packed row of the first-half row, packed row of the second-half row)."""
    j = torch.arange(n_pairs)
    lo = (j // hb) * 2 * hb + j % hb
    return lo, lo + hb


def qk_permutation(n_rows: int, head_dim: int, hb: int) -> torch.Tensor:
    """``perm`` with ``packed = W[perm]`` for a stack of heads of ``n_rows`` rows (see module docstring)."""
    half = head_dim // 2
    j = torch.arange(n_rows // 2)
    lo, hi = rope_pair_rows(n_rows // 2, head_dim, hb)
    perm = torch.empty(n_rows, dtype=torch.long)
    perm[lo] = (j // half) * head_dim + j % half
    perm[hi] = (j // half) * head_dim + half + j % half
    return perm


def gateup_rows(i_size: int, gb: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed rows of gate row j and up row j, ``j = 0..i_size-1``."""
    j = torch.arange(i_size)
    g = (j // gb) * 2 * gb + j % gb
    return g, g + gb


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """An FP8 tensor's uint8 view (for cat, stack, gather and scatter), anything else as it is."""
    return t.view(torch.uint8) if t.dtype == FP8_DTYPE else t


def _unbytes(t: torch.Tensor, fp8: bool) -> torch.Tensor:
    """The inverse of :func:`_bytes`: a uint8 tensor viewed back as float8_e4m3fn when ``fp8``."""
    return t.view(FP8_DTYPE) if fp8 else t


def pack_weights(weights: ModelWeights, tiling: Tiling, max_seq_len: int) -> PackedWeights:
    """Copy ``weights`` into the kernel layout (one extra copy of the layer weights on their device).

    The seven projections must be all unquantized or all FP8 (``weight_format`` ``bf16``, ``fp8`` or ``fp8-all``;
    the engine refuses ``mixed`` before packing); FP8 matrices keep their bytes and get their scales packed
    beside them (module docstring).
    """
    cfg = weights.config
    dev, dt = weights.device, weights.dtype
    L, H, I = cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size
    d = cfg.head_dim
    perm = qk_permutation(cfg.q_size + 2 * cfg.kv_size, d, tiling.hb).to(dev)
    layers = weights.layers
    fp8 = isinstance(layers[0].q_proj, QuantizedLinear)
    mat = (lambda t: _bytes(t.qweight)) if fp8 else (lambda t: t)  # noqa: E731
    wqkv = _unbytes(torch.stack([torch.cat([mat(l.q_proj), mat(l.k_proj), mat(l.v_proj)])[perm]
                                 for l in layers]).contiguous(), fp8)
    bqkv = None
    if layers[0].q_bias is not None:
        bqkv = torch.stack([torch.cat([l.q_bias, l.k_bias, l.v_bias])[perm] for l in layers]).contiguous()
    qknorm = None
    if layers[0].q_norm is not None:
        qknorm = torch.stack([torch.stack([l.q_norm, l.k_norm]) for l in layers]).contiguous()
    g_rows, u_rows = gateup_rows(I, tiling.gb)
    g_rows, u_rows = g_rows.to(dev), u_rows.to(dev)
    wgu = torch.zeros((L, 2 * tiling.i_pad, H), dtype=torch.uint8 if fp8 else dt, device=dev)  # uint8 0 = FP8 +0
    for n, l in enumerate(layers):
        wgu[n, g_rows] = mat(l.gate_proj)
        wgu[n, u_rows] = mat(l.up_proj)
    wgu = _unbytes(wgu, fp8)
    scales = {}
    if fp8:
        sgu = torch.zeros((L, 2 * tiling.i_pad), dtype=torch.float32, device=dev)
        for n, l in enumerate(layers):
            sgu[n, g_rows] = l.gate_proj.scale
            sgu[n, u_rows] = l.up_proj.scale
        scales = dict(
            sqkv=torch.stack([torch.cat([l.q_proj.scale, l.k_proj.scale, l.v_proj.scale])[perm]
                              for l in layers]).contiguous(),
            sgu=sgu, so=torch.stack([l.o_proj.scale for l in layers]).contiguous(),
            sdown=torch.stack([l.down_proj.scale for l in layers]).contiguous())
    head = weights.lm_head
    if isinstance(head, QuantizedLinear):
        lm_head, scales["slm"] = head.qweight.contiguous(), head.scale.contiguous()
    else:
        lm_head = head.contiguous()
    pos = torch.arange(max_seq_len, dtype=torch.float32)
    freqs = torch.outer(pos, rope_inv_freq(cfg))  # (S, HALF), float32 on the CPU as the reference computes it
    return PackedWeights(
        embed=weights.embed_tokens.contiguous(), lm_head=lm_head,
        final_norm=weights.norm.contiguous(), wqkv=wqkv, bqkv=bqkv, qknorm=qknorm,
        anorm=torch.stack([l.input_layernorm for l in layers]).contiguous(),
        wo=_unbytes(torch.stack([mat(l.o_proj) for l in layers]).contiguous(), fp8),
        mnorm=torch.stack([l.post_attention_layernorm for l in layers]).contiguous(), wgu=wgu,
        wdown=_unbytes(torch.stack([mat(l.down_proj) for l in layers]).contiguous(), fp8),
        cos=freqs.cos().to(dev).contiguous(), sin=freqs.sin().to(dev).contiguous(), **scales)
