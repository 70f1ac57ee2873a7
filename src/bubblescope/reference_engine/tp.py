"""Tensor-parallel reference decoder over ``torch.distributed`` (NCCL on GPUs, gloo on CPU).

The Megatron-LM layout (Shoeybi et al. 2019, "Megatron-LM", section 3), one process per rank:

- q/k/v and gate/up are column-parallel: rank r holds its contiguous block of query heads, the KV heads
  those heads read (whole heads, so ``num_key_value_heads`` must divide by N), and 1/N of the MLP rows;
- O-proj and down-proj are row-parallel: each rank multiplies its slice of the inputs and the partial
  outputs are summed by one all-reduce per attention block and one per MLP block (2 × layers per step);
- the LM head is vocab-parallel: rank r computes logits for its ceil(V/N) vocabulary rows (zero-padded
  when N does not divide V), gathered into the full (V,) logits by one all-gather;
- the embedding table and the RMSNorm weights are replicated (a step reads one embedding row).

The decode step keeps the single-device engine's properties: fixed shapes, the position as a device
tensor, collectives enqueued on the current stream without a host sync, so ``mode="cudagraph"`` captures
the whole step, collectives included (NCCL supports stream capture). ``compile`` is not offered: inductor
would need the functional collectives (``torch.distributed._functional_collectives``) to trace them.
"""

from __future__ import annotations

import functools
import os

import torch

from ..errors import BubblescopeError, EngineUnavailable
from ..models.config import ModelConfig
from ..models.weights import LayerWeights, ModelWeights
from .engine import ReferenceEngine
from .model import Layer, Transformer

# Column-parallel tensors split their output rows (dim 0); row-parallel ones their input columns (dim 1).
_COLUMN = {"q_proj": "q", "k_proj": "kv", "v_proj": "kv", "gate_proj": "i", "up_proj": "i",
           "q_bias": "q", "k_bias": "kv", "v_bias": "kv"}
_ROW = {"o_proj": "q", "down_proj": "i"}


def check_tp(cfg: ModelConfig, world_size: int) -> None:
    """Check that ``cfg`` splits over ``world_size`` ranks (whole query heads, whole KV heads, equal MLP rows).

    Raises:
        BubblescopeError: as :meth:`ModelConfig.tp_shard`.
    """
    cfg.tp_shard(world_size)


def vocab_shard(vocab_size: int, world_size: int) -> int:
    """Rows of the LM head per rank: ceil(vocab_size / world_size) (the last shard zero-padded)."""
    return -(-vocab_size // world_size)


def _own(t: torch.Tensor) -> torch.Tensor:
    # A real copy, so the full tensor can be freed once every rank has taken its slice.
    return t.to(copy=True, memory_format=torch.contiguous_format)


def shard_weights(weights: ModelWeights, rank: int, world_size: int) -> ModelWeights:
    """Rank ``rank``'s slice of ``weights`` (same device and dtype), with ``ModelConfig.tp_shard``'s config.

    Shapes per layer (H hidden, D head_dim, N world size): q_proj (Q/N, H), k_proj/v_proj (KV/N, H),
    o_proj (H, Q/N), gate/up (I/N, H), down (H, I/N), biases (Q/N,) / (KV/N,); norms whole. The embedding
    stays (V, H); lm_head becomes (ceil(V/N), H), rows [r·ceil(V/N), (r+1)·ceil(V/N)) zero-padded past V.

    Raises:
        BubblescopeError: as :func:`check_tp`, or ``rank`` outside [0, world_size).
    """
    cfg = weights.config
    local = cfg.tp_shard(world_size)
    if not 0 <= rank < world_size:
        raise BubblescopeError(f"tensor parallelism: rank {rank} outside [0, {world_size})")
    width = {"q": local.q_size, "kv": local.kv_size, "i": local.intermediate_size}

    def piece(name: str, t: torch.Tensor) -> torch.Tensor:
        if name in _COLUMN:
            w = width[_COLUMN[name]]
            return _own(t[rank * w:(rank + 1) * w])
        if name in _ROW:
            w = width[_ROW[name]]
            return _own(t[:, rank * w:(rank + 1) * w])
        return t  # RMSNorm weights (and Qwen3's per-head q/k norms) are replicated

    layers = [LayerWeights(**{n: piece(n, t) for n, t in lw.tensors().items()}) for lw in weights.layers]
    rows = vocab_shard(cfg.vocab_size, world_size)
    head = weights.lm_head[rank * rows:(rank + 1) * rows]
    if head.shape[0] < rows:
        pad = head.new_zeros(rows - head.shape[0], head.shape[1])
        head = torch.cat([head, pad])
    return ModelWeights(local, weights.embed_tokens, layers, weights.norm, _own(head))


class TPLayer(Layer):
    """A decoder layer over one rank's heads and MLP slice; its row-parallel outputs are all-reduced."""

    group = None  # the process group (None: the default one), set by TPTransformer

    def reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """Sum the ranks' partial O-proj / down-proj outputs (T, H) in place with one all-reduce; no host sync."""
        import torch.distributed as dist

        dist.all_reduce(partial, group=self.group)
        return partial


class TPTransformer(Transformer):
    """:class:`Transformer` of one rank; ``forward`` returns the full-vocabulary logits, all-gathered."""

    layer_class = TPLayer

    def __init__(self, weights: ModelWeights, max_seq_len: int, vocab_size: int, group=None):
        super().__init__(weights, max_seq_len)
        self.group, self.vocab_size = group, vocab_size
        for layer in self.layers:
            layer.group = group

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor, last_only: bool = True,
                kv_len: int | None = None) -> torch.Tensor:
        """tokens, input_pos: LongTensor (T,) -> logits (V,) of the last position, or (T, V) if not last_only;
        ``kv_len`` as :meth:`Transformer.forward`'s."""
        import torch.distributed as dist

        local = super().forward(tokens, input_pos, last_only, kv_len).contiguous()   # (..., V/N)
        n = dist.get_world_size(self.group)
        out = local.new_empty(n * local.numel())  # flat: gloo only takes the concatenated output layout
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in 2.13
        gather(out, local.view(-1), group=self.group)
        out = out.view((n,) + tuple(local.shape))                              # (N, ..., V/N)
        full = out.reshape(-1) if local.dim() == 1 else out.permute(1, 0, 2).reshape(local.shape[0], -1)
        return full[..., :self.vocab_size]


class TPReferenceEngine(ReferenceEngine):
    """The reference Decoder, tensor-parallel over the ranks of ``group`` (call it on every rank).

    Args:
        weights: the full model's weights on this rank's device (each rank keeps its slice; see
            :func:`shard_weights`). Logits come back as (V,) on every rank.
        mode: ``eager`` or ``cudagraph`` (the whole step, collectives included, in one graph).
        max_seq_len: KV-cache positions (of this rank's KV heads).
        group: a ``torch.distributed`` process group; None means the default (world) group.

    Raises:
        BubblescopeError: torch.distributed not initialized, or a config that does not split (:func:`check_tp`).
        EngineUnavailable: ``compile`` mode, ``cudagraph`` without a CUDA device, or FP8 weights.
    """

    def __init__(self, weights: ModelWeights, mode: str = "eager", max_seq_len: int | None = None, group=None):
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise BubblescopeError("tensor parallelism: torch.distributed is not initialized (start under torchrun "
                                   "or call bubblescope.reference_engine.tp.init_distributed first)")
        if mode == "compile":
            raise EngineUnavailable("reference-tp: compile mode is not supported (inductor would need functional "
                                    "collectives); use eager or cudagraph")
        if weights.weight_format != "bf16":
            raise EngineUnavailable("reference-tp: FP8 weights are not split over ranks; run it with --weights bf16")
        self.world_size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        shard = shard_weights(weights, self.rank, self.world_size)
        self.model_class = functools.partial(TPTransformer, vocab_size=weights.config.vocab_size, group=group)
        super().__init__(shard, mode=mode, max_seq_len=max_seq_len)
        self.config = weights.config
        self.name = f"reference-tp{self.world_size}" + ("" if mode == "eager" else f"-{mode}")


def init_distributed(backend: str | None = None) -> tuple[int, int, torch.device]:
    """Join the process group that ``torchrun`` describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT).

    The backend defaults to NCCL when CUDA is available (this rank then uses GPU LOCAL_RANK), else gloo.
    Idempotent: an already initialized group is kept. Returns (rank, world_size, device).

    Raises:
        BubblescopeError: the torchrun environment variables are missing.
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
        if missing:
            raise BubblescopeError(f"tensor parallelism: {', '.join(missing)} not set (start under torchrun)")
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend)
    on_gpu = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    return dist.get_rank(), dist.get_world_size(), device


__all__ = ["TPReferenceEngine", "check_tp", "init_distributed", "shard_weights", "vocab_shard"]
