"""Batched prefill for the megakernel: the whole prompt through batched matrix multiplies and scaled-dot-product
attention in torch, its keys and values written straight into the megakernel's KV cache; decoding then continues
in the kernel.

Why: one decode launch per prompt token streams every weight once per token, so a 128-token prompt costs 128 decode
steps (117 ms against 16 ms for ``reference-compile`` on Llama-3.2-1B bf16, H100). A prompt is compute-bound work
that batched GEMMs do well; published megakernels (Hazy's, Mirage MPK) also prefill with batched GEMMs and decode in
the megakernel.

What it reads and writes: the kernel's own packed weights (:mod:`.packing`; no second unpacked copy is kept):
``wqkv``'s rows are in RoPE pair order and ``wgu`` interleaves gate and up blocks with zero padding, so the GEMM
outputs are gathered back into natural order by fixed column indices (a copy of (T, Q + 2·KV) and (T, 2·I)
activations, small next to the GEMMs). The KV cache is the kernel's, (L, n_kv, S, D) in the activation dtype, keys
after q/k-norm (Qwen3) and RoPE, exactly what the kernel's QKV (or, with ``qk_norm_attn``, ATTN) task stores. The
math is ``bubblescope.torch_ops``' (the reference engine's): RMSNorm statistics in float32, RoPE rotate_half in the
activation dtype from the kernel's own cos/sin tables, GQA, Qwen2 biases, llama3 RoPE scaling (in the tables).
FP8 packed matrices (``packing.py``) are dequantized for each GEMM, ``qweight · scale[:, None]`` formed in float32
and rounded to the activation dtype (:meth:`~bubblescope.models.quant.QuantizedLinear.dequantize`), as the
reference engine's prefill does; one layer's matrix at a time, so no unquantized copy of the model is kept.

Long prompts run in chunks of at most ``chunk`` positions: each chunk goes through every layer, attending to the
keys the earlier chunks left in the cache and its own (prefix-causal), so memory is bounded by the chunk, not the
prompt.

CUDA graphs (``graphs``, the default on a GPU): a short prompt's pass is ~37 small launches a layer (~600 for
Llama-3.2-1B) and bound by the host, not the GPU — on an H100, 128 prompt tokens took 16–27 ms of host time against
5.9 ms of GPU time, the spread being how fast the host issued launches at that moment. A prompt of at most ``chunk``
positions therefore runs as one captured graph per *bucket*: its ids padded up to the next multiple of ``bucket``
positions (pad id 0), the logits taken at position T-1 by a device-side index, so one graph serves every length of
its bucket. Padding cannot change a real position's value, only its rounding (a GEMM library may pick another kernel
for another row count): attention is causal (a prompt position never attends to a later one) and every other op
acts per position; the pad positions' keys and values are zeroed after the replay, so nothing is left past the
prompt. The first prompt of a bucket pays an eager warm-up pass and the capture, once (on an H200 the 1B's first
128-token prompt took 241 ms, the next ones 3.1); every
graph shares one memory pool, and writes its logits into one buffer (the graphs never run concurrently and each
replay's output is read before the next). The pool keeps the largest captured pass's activations (by their sizes,
a 4,096-position pass of an 8B model holds some 0.6 GB in bf16, more with FP8 matrices dequantized for their GEMMs)
while the engine
lives. A bucket whose capture runs out of memory runs eagerly from then on; any other capture failure turns the
graphs off, its first cause kept in ``graph_error``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..models.config import ModelConfig
from ..models.quant import QuantizedLinear
from ..torch_ops import apply_rope, prefix_causal_attention, rms_norm
from .packing import PackedWeights, qk_permutation
from .schedule import Tiling

# positions per chunk: (T, 2·I) activations of an 8B model are 235 MB in bf16 at 4096. Chunks past the first attend
# under a mask (SDPA's memory-efficient kernel, not flash): at 2048 a 4,096-token prompt took 1.12× the reference
# engine's one-pass prefill on an H100.
PREFILL_CHUNK = 4096
PREFILL_BUCKET = 64   # a captured prefill graph serves prompts padded up to the next multiple of this many positions
PREFILL_MODES = ("batched", "stepwise")


def _matrix(w: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """A packed matrix (rows, K) for a GEMM in ``dtype``: ``w`` itself, or with its float32 row scales (rows,) the
    FP8 ``w`` dequantized."""
    return w if scale is None else QuantizedLinear(w, scale).dequantize(dtype)


class BatchedPrefill:
    """The prompt's forward pass over the megakernel's packed weights, writing its KV cache.

    Args:
        cfg: the model's config.
        packed: the engine's packed weights (kept by reference, not copied).
        tiling: the tiling they were packed with (the QKV pair blocks ``hb`` and gate/up blocks ``gb``).
        chunk: most positions run through the layers at once (bounded memory).
        graphs: run a prompt of at most ``chunk`` positions padded to its bucket, as a captured CUDA graph on a GPU
            (on a CPU the same padded pass runs eagerly: what the graph computes, testable without one).
        bucket: the padding granularity of ``graphs``, positions.

    Raises:
        ValueError: ``chunk`` or ``bucket`` below 1.
    """

    def __init__(self, cfg: ModelConfig, packed: PackedWeights, tiling: Tiling, chunk: int = PREFILL_CHUNK,
                 graphs: bool = False, bucket: int = PREFILL_BUCKET):
        if chunk < 1 or bucket < 1:
            raise ValueError(f"prefill chunk and bucket must be at least 1 position, got {chunk} and {bucket}")
        self.cfg, self.packed, self.chunk = cfg, packed, int(chunk)
        self.graphs, self.bucket = bool(graphs), int(bucket)
        dev = packed.wqkv.device
        # the padded pass's static inputs and output, shared by every bucket's graph
        self._ids = torch.zeros(self.chunk, dtype=torch.long, device=dev) if graphs else None   # (chunk,)
        self._last = torch.zeros(1, dtype=torch.long, device=dev) if graphs else None          # (1,): T-1
        self._out = torch.zeros(cfg.vocab_size, dtype=torch.float32, device=dev) if graphs else None  # (V,)
        self._captured: dict[tuple, torch.cuda.CUDAGraph] = {}   # (n, k and v cache addresses, dtype) → graph
        self._too_big: set[tuple] = set()                         # buckets whose capture ran out of memory
        self._pool = None
        self.graph_error: str | None = None  # why graphs were turned off after a failed capture
        # packed = W[perm]: row r of the natural [q; k; v] stack is packed row argsort(perm)[r], and so is its
        # column in the GEMM's output
        perm = qk_permutation(cfg.q_size + 2 * cfg.kv_size, cfg.head_dim, tiling.hb)
        self._qkv_cols = torch.argsort(perm).to(dev)                             # (Q + 2KV,)
        self._gb = tiling.gb  # gate/up rows come in blocks of gb gate rows then the same gb up rows
        # Each layer's views of the stacked tensors, taken once: indexing them per call would add a dozen host-side
        # tensor ops per layer to a pass that is bound by the host at short prompts.
        def at(t, layer):
            return None if t is None else t[layer]
        p = packed
        self._layers = [
            (p.anorm[n], at(p.bqkv, n), p.wqkv[n], at(p.sqkv, n), at(p.qknorm, n), p.wo[n], at(p.so, n), p.mnorm[n],
             p.wgu[n], at(p.sgu, n), p.wdown[n], at(p.sdown, n)) for n in range(cfg.num_hidden_layers)]

    @torch.inference_mode()
    def run(self, ids: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """Prefill positions ``0 .. T-1`` with ``ids``.

        Args:
            ids: LongTensor (T,) on the weights' device, every id in ``[0, vocab_size)`` (checked by the caller).
            k_cache, v_cache: (L, n_kv, S, D) activation dtype, ``S >= T``; positions ``[0, T)`` are overwritten.

        Returns:
            float32 (V,): logits of position T-1 (final RMSNorm + LM head of its hidden state, rounded to the
            activation dtype as the kernel's LM-head tasks round them); with ``graphs`` a buffer the next call
            overwrites.
        """
        if self.graphs and ids.numel() <= min(self.chunk, k_cache.shape[2]):
            out = self._run_padded(ids, k_cache, v_cache)
            if out is not None:
                return out
        x = None
        for s in range(0, ids.numel(), self.chunk):
            x = self._chunk(ids[s:s + self.chunk], s, k_cache, v_cache)
        p = self.packed
        h = rms_norm(x[-1:], p.final_norm, self.cfg.rms_norm_eps)                # (1, H)
        return F.linear(h, _matrix(p.lm_head, p.slm, h.dtype))[0].float()         # (V,)

    def graphs_captured(self) -> int:
        """How many prefill graphs (buckets) have been captured."""
        return len(self._captured)

    def _run_padded(self, ids: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor | None:
        """The prompt padded to its bucket: replayed from its captured graph on a GPU (captured at first use),
        run eagerly on a CPU; then the pad positions' K/V zeroed. None where no graph could be had: the bucket
        did not fit in memory (it runs eagerly from now on), or a capture failed (graphs turned off, the reason in
        ``graph_error``); the caller then runs the eager pass."""
        t, cap = ids.numel(), k_cache.shape[2]
        n = min(-(-t // self.bucket) * self.bucket, self.chunk, cap)               # padded length, t <= n
        key = (n, k_cache.data_ptr(), v_cache.data_ptr(), k_cache.dtype)
        if key in self._too_big:
            return None
        self._ids[:t].copy_(ids)
        self._ids[t:n].zero_()
        self._last.fill_(t - 1)
        if k_cache.device.type != "cuda":
            self._padded_pass(n, k_cache, v_cache)
        else:
            with torch.cuda.device(k_cache.device):  # capture and replay on the cache's GPU, current or not
                graph = self._captured.get(key)
                if graph is None:
                    try:
                        graph = self._captured[key] = self._capture(n, k_cache, v_cache)
                    except RuntimeError as exc:
                        self._refused(key, exc, k_cache, v_cache)
                        return None
                graph.replay()
        k_cache[:, :, t:n].zero_()
        v_cache[:, :, t:n].zero_()
        return self._out

    def _refused(self, key: tuple, exc: RuntimeError, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        """A capture failed: out of memory → this bucket runs eagerly from now on; anything else (an op the torch
        build cannot capture) → graphs off, the first cause kept (the capture's own end reports a generic error
        over it). The failed attempt's warm-up may have written pad positions, which the eager pass does not
        overwrite: the whole cache is zeroed, as ``reset`` left it, and the eager pass writes the prompt's."""
        if isinstance(exc, torch.cuda.OutOfMemoryError):
            self._too_big.add(key)
        else:
            cause = exc.__context__ if isinstance(exc.__context__, Exception) else exc
            self.graphs, self.graph_error = False, f"{type(cause).__name__}: {cause}"[:300]
            self._captured.clear()
        torch.cuda.synchronize(k_cache.device)
        k_cache.zero_()
        v_cache.zero_()

    def _padded_pass(self, n: int, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        """Positions ``0 .. n-1`` of the static ids through every layer; logits of position ``_last`` into
        ``_out``. Fixed shapes and no host sync: what a graph captures."""
        x = self._chunk(self._ids[:n], 0, k_cache, v_cache)                     # (n, H)
        h = rms_norm(x.index_select(0, self._last), self.packed.final_norm, self.cfg.rms_norm_eps)  # (1, H)
        self._out.copy_(F.linear(h, _matrix(self.packed.lm_head, self.packed.slm, h.dtype))[0])

    def _capture(self, n: int, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.cuda.CUDAGraph:
        """Capture the padded pass of length ``n``: one eager pass on a side stream first (lazy library set-up
        must not happen during capture), then the capture into the shared pool."""
        dev = k_cache.device
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        try:
            with torch.cuda.stream(side):
                self._padded_pass(n, k_cache, v_cache)
        finally:
            torch.cuda.current_stream(dev).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, stream=torch.cuda.Stream(dev)):
            self._padded_pass(n, k_cache, v_cache)
        return graph

    def _chunk(self, ids: torch.Tensor, start: int, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """Positions ``start .. start + T - 1`` through every layer; returns their last hidden states (T, H)."""
        c, p = self.cfg, self.packed
        t, end, d, eps = ids.numel(), start + ids.numel(), c.head_dim, c.rms_norm_eps
        nh, nkv = c.num_attention_heads, c.num_key_value_heads
        x = F.embedding(ids, p.embed)                                            # (T, H)
        half_cos, half_sin = p.cos[start:end], p.sin[start:end]                  # (T, D/2) float32
        cos = torch.cat((half_cos, half_cos), -1).to(x.dtype)                    # (T, D), cast at use as the kernel
        sin = torch.cat((half_sin, half_sin), -1).to(x.dtype)
        for (anorm, bias, wqkv, sqkv, qknorm, wo, so, mnorm, wgu, sgu, wdown, sdown), kc, vc in zip(
                self._layers, k_cache.unbind(0), v_cache.unbind(0)):
            h = rms_norm(x, anorm, eps)
            qkv = F.linear(h, _matrix(wqkv, sqkv, x.dtype), bias)[:, self._qkv_cols]  # (T, Q + 2KV), natural order
            q = qkv[:, :c.q_size].view(t, nh, d)
            k = qkv[:, c.q_size:c.q_size + c.kv_size].view(t, nkv, d)
            v = qkv[:, c.q_size + c.kv_size:].view(t, nkv, d)
            if qknorm is not None:  # Qwen3: per-head RMSNorm of q and k before RoPE
                q = rms_norm(q, qknorm[0], eps)
                k = rms_norm(k, qknorm[1], eps)
            q = apply_rope(q.transpose(0, 1), cos, sin)                           # (nh, T, D)
            kc[:, start:end] = apply_rope(k.transpose(0, 1), cos, sin)            # (nkv, T, D)
            vc[:, start:end] = v.transpose(0, 1)
            y = prefix_causal_attention(q, kc[:, :end], vc[:, :end], c.gqa_group)
            x = x + F.linear(y.transpose(0, 1).reshape(t, c.q_size), _matrix(wo, so, x.dtype))  # (T, H)
            h = rms_norm(x, mnorm, eps)
            gu = F.linear(h, _matrix(wgu, sgu, x.dtype)).view(t, -1, 2, self._gb)  # (T, blocks, gate|up, gb)
            act = (F.silu(gu[:, :, 0]) * gu[:, :, 1]).reshape(t, -1)[:, :c.intermediate_size]  # (T, I)
            x = x + F.linear(act, _matrix(wdown, sdown, x.dtype))
        return x
