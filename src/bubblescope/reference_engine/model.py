"""Op-by-op PyTorch Llama-family transformer with a fixed-shape KV cache (gpt-fast style).

One ``forward(tokens, input_pos, kv_len=L)`` serves prefill (T tokens) and decode (T = 1): keys and values are
written into the static cache at ``input_pos`` and attention runs over the cache's first ``L`` positions under a
mask, so the decode step has fixed shapes for a given ``L`` and no host sync (CUDA-graph capturable). ``L`` is
the caller's choice: the engine passes the positions in use (eager) or a bucket of them (one graph per bucket),
since attending over the whole cache would make a step's cost grow with the cache's capacity, not its context
(GQA's repeat copies every position of it, per layer and step). Numerics follow transformers'
``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM``: RMSNorm in float32 then cast back,
RoPE applied in the activation dtype with rotate_half, GQA by repeating KV heads (``bubblescope.torch_ops``, shared
with the megakernel's batched prefill).

FP8 projections (:class:`~bubblescope.models.quant.QuantizedLinear`) are dequantized to the activation dtype in
each matvec (:func:`linear`), not once at build: the step then streams the FP8 bytes, as the quantization ablation
means, and holds no second copy of the weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..models.config import ModelConfig, rope_inv_freq
from ..models.quant import QuantizedLinear
from ..models.weights import ModelWeights
from ..torch_ops import apply_rope, repeat_kv, rms_norm


class KVCache(nn.Module):
    """Static per-layer cache: k, v of shape (1, n_kv_heads, max_seq_len, head_dim)."""

    def __init__(self, max_seq_len: int, n_kv: int, head_dim: int, dtype: torch.dtype, device: torch.device):
        super().__init__()
        shape = (1, n_kv, max_seq_len, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Write k, v (1, n_kv, T, D) at positions ``input_pos`` (T,); return the full caches."""
        self.k_cache.index_copy_(2, input_pos, k)
        self.v_cache.index_copy_(2, input_pos, v)
        return self.k_cache, self.v_cache


def linear(x: torch.Tensor, w: torch.Tensor | QuantizedLinear, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, bias)``: x (..., in) -> (..., out) in x's dtype; an FP8 ``w`` is dequantized to x's dtype
    for this call (``qweight · scale[:, None]``, :meth:`QuantizedLinear.dequantize`)."""
    if isinstance(w, QuantizedLinear):
        w = w.dequantize(x.dtype)
    return F.linear(x, w, bias)


def _keep(module: nn.Module, name: str, t) -> None:
    """A weight as a non-persistent buffer; an FP8 one as a plain attribute (not a tensor: its qweight and scale)."""
    if isinstance(t, QuantizedLinear):
        setattr(module, name, t)
    else:
        module.register_buffer(name, t, persistent=False)


class Layer(nn.Module):
    def __init__(self, cfg: ModelConfig, w, max_seq_len: int):
        super().__init__()
        self.cfg = cfg
        for name, t in w.tensors().items():
            _keep(self, name, t)
        self.has_bias = w.q_bias is not None
        self.has_qk_norm = w.q_norm is not None
        act = w.input_layernorm  # the activation dtype (a projection may be FP8)
        self.kv_cache = KVCache(max_seq_len, cfg.num_key_value_heads, cfg.head_dim, act.dtype, act.device)

    def forward(self, x, cos, sin, mask, input_pos, kv_len: int | None = None):
        c = self.cfg
        T = x.shape[0]
        h = rms_norm(x, self.input_layernorm, c.rms_norm_eps)                     # (T, H)
        q = linear(h, self.q_proj, self.q_bias if self.has_bias else None)        # (T, nh*D)
        k = linear(h, self.k_proj, self.k_bias if self.has_bias else None)        # (T, nkv*D)
        v = linear(h, self.v_proj, self.v_bias if self.has_bias else None)
        q = q.view(T, c.num_attention_heads, c.head_dim)
        k = k.view(T, c.num_key_value_heads, c.head_dim)
        v = v.view(T, c.num_key_value_heads, c.head_dim)
        if self.has_qk_norm:  # Qwen3: per-head RMSNorm on q and k before RoPE
            q = rms_norm(q, self.q_norm, c.rms_norm_eps)
            k = rms_norm(k, self.k_norm, c.rms_norm_eps)
        q = q.transpose(0, 1).unsqueeze(0)                                         # (1, nh, T, D)
        k = k.transpose(0, 1).unsqueeze(0)                                         # (1, nkv, T, D)
        v = v.transpose(0, 1).unsqueeze(0)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        k_all, v_all = self.kv_cache.update(input_pos, k, v)                       # (1, nkv, S, D)
        if kv_len is not None:                                                     # (1, nkv, L, D)
            k_all, v_all = k_all[:, :, :kv_len], v_all[:, :, :kv_len]
        k_all = repeat_kv(k_all, c.gqa_group)                                      # (1, nh, L, D)
        v_all = repeat_kv(v_all, c.gqa_group)
        y = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask)       # (1, nh, T, D) over L
        y = y.squeeze(0).transpose(0, 1).reshape(T, c.q_size)
        x = x + self.reduce(linear(y, self.o_proj))
        h = rms_norm(x, self.post_attention_layernorm, c.rms_norm_eps)
        return x + self.reduce(linear(F.silu(linear(h, self.gate_proj)) * linear(h, self.up_proj), self.down_proj))

    def reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """Sum of the row-parallel O-proj / down-proj outputs over ranks: nothing to sum on one device
        (``reference_engine.tp`` all-reduces here)."""
        return partial


class Transformer(nn.Module):
    """The model over a static KV cache of ``max_seq_len`` positions."""

    layer_class = Layer  # reference_engine.tp swaps in its all-reducing layer

    def __init__(self, weights: ModelWeights, max_seq_len: int):
        super().__init__()
        cfg = self.cfg = weights.config
        self.max_seq_len = max_seq_len
        dev = weights.device
        self.register_buffer("embed_tokens", weights.embed_tokens, persistent=False)
        self.register_buffer("norm", weights.norm, persistent=False)
        _keep(self, "lm_head", weights.lm_head)
        self.layers = nn.ModuleList(self.layer_class(cfg, lw, max_seq_len) for lw in weights.layers)
        # cos/sin tables (S, D) in float32 like transformers' rotary embedding; cast to the activation dtype
        # at use, as transformers does.
        pos = torch.arange(max_seq_len, dtype=torch.float32)
        freqs = torch.outer(pos, rope_inv_freq(cfg))
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos().to(dev), persistent=False)
        self.register_buffer("sin", emb.sin().to(dev), persistent=False)
        causal = torch.tril(torch.ones(max_seq_len, max_seq_len, dtype=torch.bool, device=dev))
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor, last_only: bool = True,
                kv_len: int | None = None) -> torch.Tensor:
        """tokens, input_pos: LongTensor (T,) -> logits (V,) of the last position, or (T, V) if not last_only.
        ``kv_len``: attend over the cache's first ``kv_len`` positions (None: the whole cache). Not checked
        against ``input_pos`` (a device tensor): one below the last input position + 1 drops keys silently."""
        x = F.embedding(tokens, self.embed_tokens)                                 # (T, H)
        cos = self.cos[input_pos].to(x.dtype)[None, None]                          # (1, 1, T, D)
        sin = self.sin[input_pos].to(x.dtype)[None, None]
        mask = self.causal[input_pos][None, None, :, :kv_len]                      # (1, 1, T, L)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, input_pos, kv_len)
        if last_only:
            x = x[-1]
        return linear(rms_norm(x, self.norm, self.cfg.rms_norm_eps), self.lm_head)

    def reset_cache(self) -> None:
        for layer in self.layers:
            layer.kv_cache.k_cache.zero_()
            layer.kv_cache.v_cache.zero_()
