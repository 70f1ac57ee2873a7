"""Pure-torch building blocks of the Llama-family forward pass, shared by engines that must not import each other.

The reference engine (``reference_engine.model``) and the megakernel's batched prefill
(``megakernel_engine.prefill``) compute the same layer; the numerics live here once so both round at the same
points. Conventions follow transformers' ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM``:
RMSNorm statistics in float32 then cast back before the weight, RoPE in the activation dtype with the
rotate_half pairing (dimension ``i`` with ``i + head_dim/2``), GQA by repeating each KV head ``gqa_group`` times.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension (Zhang & Sennrich 2019) as transformers' ``LlamaRMSNorm``.

    Args:
        x: (..., N) activations, any float dtype.
        weight: (N,) scale, the activation dtype.
        eps: added to the mean square (``rms_norm_eps``).

    Returns:
        (..., N) in ``x``'s dtype: ``weight * (x / sqrt(mean(x²) + eps))``, statistics in float32, the
        normalised value cast back to ``x.dtype`` before the weight multiplies it.
    """
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(..., D) -> (..., D): ``cat(-x[..., D/2:], x[..., :D/2])`` (the pairing of transformers' Llama RoPE)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021, rotate_half form): ``x·cos + rotate_half(x)·sin``.

    Args:
        x: (..., T, D) queries or keys in the activation dtype.
        cos, sin: (T, D) tables (``cat(c, c)`` of the (T, D/2) half tables) already cast to ``x.dtype``, or any
            shape that broadcasts against ``x``. Each product is rounded to ``x.dtype`` before the sum, as
            transformers computes it.
    """
    return x * cos + rotate_half(x) * sin


def repeat_kv(x: torch.Tensor, group: int) -> torch.Tensor:
    """(..., n_kv, S, D) -> (..., n_kv·group, S, D): each KV head repeated for the ``group`` query heads that share
    it (GQA, Ainslie et al. 2023), query head ``h`` reading KV head ``h // group``."""
    return x if group == 1 else x.repeat_interleave(group, dim=-3)


def prefix_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int) -> torch.Tensor:
    """Causal attention of a chunk of T new positions over everything cached before it and itself.

    Args:
        q: (nh, T, D) queries of positions ``S - T .. S - 1``.
        k, v: (n_kv, S, D) keys and values of positions ``0 .. S - 1`` (the cache up to and including the chunk).
        group: query heads per KV head (``nh // n_kv``).

    Returns:
        (nh, T, D) in ``q``'s dtype: query ``i`` attends to keys ``0 .. S - T + i`` with scale ``1/sqrt(D)``.

    The mask: ``is_causal`` when ``T == S`` (the fused flash kernel on a GPU); else a (T, S) boolean mask aligned to
    the bottom-right corner (the memory-efficient kernel takes it on a GPU). Not ``torch.nn.attention.bias.
    causal_lower_right``, which would spare the mask but imports torch._dynamo (seconds) at first use.
    """
    t, s = q.shape[-2], k.shape[-2]
    k, v = repeat_kv(k, group), repeat_kv(v, group)                                 # (nh, S, D)
    if t == s:
        return F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]
    mask = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(s - t)          # (T, S): key j <= S - T + i
    return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask)[0]
