"""Analytic HBM traffic of one batch-size-1 decode step, and the bandwidth numbers built on it.

At batch size 1 a decode step is a chain of matrix-vector products: every weight is read once and does
one multiply-add, so bytes moved, not FLOPs, set the floor. The rule (docs/design.md, ``bytes_per_step``;
gpt-fast's ``_get_model_size`` counts the same way, leaving the embedding table out):

- the embedding: one row, ``hidden_size`` elements (only the current token's row is gathered);
- every layer: q/k/v/o projections, gate/up/down projections, both RMSNorm weights, q/k/v biases
  (Qwen2) and the per-head q/k RMSNorm weights (Qwen3, ``head_dim`` each);
- the final RMSNorm and the whole LM head, ``vocab_size × hidden_size``, also when it is tied to the
  embedding (the tied table is read once for the logits; the row above is a second, tiny read);
- the KV cache: read for ``context`` positions, ``2 × layers × kv_heads × head_dim × context``
  elements, and written for the one new position, ``2 × layers × kv_heads × head_dim``.

Activations (a few KB per step) are left out. Units: bytes; GB/s means 10^9 bytes per second.

FP8 weights (``weights="fp8"``: :mod:`bubblescope.models.quant`): each projection is 1 byte per element plus a
float32 scale per output row (4 bytes × out_features); ``fp8-all`` counts the LM head so too. The embedding row,
the norms and the biases stay in ``dtype_bytes``.
"""

from __future__ import annotations

from ..errors import BubblescopeError

WEIGHT_FORMATS = ("bf16", "fp8", "fp8-all")   # models.quant.WEIGHT_FORMATS, without importing torch
FP8_BYTES, SCALE_BYTES = 1, 4                 # an e4m3 weight; a float32 scale per output row


def _check_int(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise BubblescopeError(f"step traffic: {name} must be an integer >= {low}, got {value!r}")


def _out_rows(cfg) -> dict[str, int]:
    """Output rows of each projection (one FP8 scale each)."""
    h, q, kv, i = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    return {"q_proj": q, "k_proj": kv, "v_proj": kv, "o_proj": h, "gate_proj": i, "up_proj": i, "down_proj": h}


def _layer_elements(cfg) -> dict[str, int]:
    """Weight elements of one decoder layer, by tensor."""
    h, q, kv, i, d = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size, cfg.head_dim
    n = {
        "input_layernorm": h,
        "q_proj": q * h, "k_proj": kv * h, "v_proj": kv * h, "o_proj": h * q,
        "post_attention_layernorm": h,
        "gate_proj": i * h, "up_proj": i * h, "down_proj": h * i,
    }
    if cfg.attention_bias:
        n.update(q_bias=q, k_bias=kv, v_bias=kv)
    if cfg.qk_norm:
        n.update(q_norm=d, k_norm=d)
    return n


def _rows(cfg, dtype_bytes: int, context: int, kv_dtype_bytes: int | None,
          weights: str = "bf16") -> list[tuple[str, str, int, int]]:
    """(component, kind, elements, bytes) for everything one decode step moves."""
    if weights not in WEIGHT_FORMATS:
        raise BubblescopeError(f"step traffic: weights must be one of {', '.join(WEIGHT_FORMATS)}, got {weights!r}")
    _check_int("dtype_bytes", dtype_bytes, 1)
    _check_int("context", context, 0)
    kvb = dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
    _check_int("kv_dtype_bytes", kvb, 1)
    if context > cfg.max_position_embeddings:
        raise BubblescopeError(f"step traffic: context {context} exceeds {cfg.name}'s max_position_embeddings "
                               f"{cfg.max_position_embeddings}")
    layers, h = cfg.num_hidden_layers, cfg.hidden_size
    kv_per_position = 2 * layers * cfg.kv_size  # K and V, every layer
    rows = [("embedding (one row)", "weight", h, h * dtype_bytes)]
    out_rows = _out_rows(cfg) if weights != "bf16" else {}
    for name, n in _layer_elements(cfg).items():
        if name in out_rows:  # FP8 data, then the row scales
            rows.append((f"layers.{name}", "weight", layers * n, layers * n * FP8_BYTES))
            rows.append((f"layers.{name}.scale", "weight", layers * out_rows[name],
                         layers * out_rows[name] * SCALE_BYTES))
        else:
            rows.append((f"layers.{name}", "weight", layers * n, layers * n * dtype_bytes))
    rows.append(("norm", "weight", h, h * dtype_bytes))
    v = cfg.vocab_size * h
    if weights == "fp8-all":
        rows.append(("lm_head", "weight", v, v * FP8_BYTES))
        rows.append(("lm_head.scale", "weight", cfg.vocab_size, cfg.vocab_size * SCALE_BYTES))
    else:
        rows.append(("lm_head", "weight", v, v * dtype_bytes))
    rows.append(("kv_cache read", "kv_read", kv_per_position * context, kv_per_position * context * kvb))
    rows.append(("kv_cache write", "kv_write", kv_per_position, kv_per_position * kvb))
    return rows


def step_traffic(cfg, dtype_bytes: int, context: int, kv_dtype_bytes: int | None = None, weights: str = "bf16") -> dict:
    """Bytes one decode step must move between HBM and the SMs (``bytes_per_step``, docs/design.md).

    ``weight_bytes`` = (hidden_size [embedding row] + layers × per-layer weights + hidden_size [final
    norm] + vocab_size × hidden_size [LM head]) × dtype_bytes; ``kv_read_bytes`` = 2 × layers ×
    kv_heads × head_dim × context × kv_dtype_bytes; ``kv_write_bytes`` = the same for one position;
    ``total_bytes`` their sum. ``embedding_bytes`` and ``lm_head_bytes`` are the parts of
    ``weight_bytes`` from those two tensors. Llama-3.2-1B in bf16 at context 128: 2.476 GB, 4.2 MB of it KV.

    Args:
        cfg: a :class:`~bubblescope.models.config.ModelConfig`.
        dtype_bytes: bytes per weight element (2 for bf16/fp16, 4 for fp32) of the unquantized weights.
        context: KV-cache positions the step's attention reads (including the new token's if the engine
            attends to it from the cache).
        kv_dtype_bytes: bytes per KV-cache element; default ``dtype_bytes``.
        weights: ``bf16`` (no quantization), ``fp8`` (projections 1 byte + 4 per output row) or ``fp8-all``
            (the LM head too; ``lm_head_bytes`` then includes its scales): the module docstring.

    Raises:
        BubblescopeError: a byte size < 1, a negative context, a context beyond ``cfg.max_position_embeddings``,
            or an unknown ``weights``.
    """
    rows = _rows(cfg, dtype_bytes, context, kv_dtype_bytes, weights)
    by_kind = {"weight": 0, "kv_read": 0, "kv_write": 0}
    for _, kind, _, nbytes in rows:
        by_kind[kind] += nbytes
    named = {component: nbytes for component, _, _, nbytes in rows}
    return {
        "weight_bytes": by_kind["weight"],
        "kv_read_bytes": by_kind["kv_read"],
        "kv_write_bytes": by_kind["kv_write"],
        "total_bytes": sum(by_kind.values()),
        "embedding_bytes": named["embedding (one row)"],
        "lm_head_bytes": named["lm_head"] + named.get("lm_head.scale", 0),
    }


def traffic_table(cfg, dtype_bytes: int, context: int, kv_dtype_bytes: int | None = None, weights: str = "bf16"):
    """The same count as :func:`step_traffic`, one row per tensor group, as a DataFrame.

    Columns: ``component`` (e.g. ``layers.q_proj``, summed over layers; with FP8 weights also
    ``layers.q_proj.scale``, its row scales), ``kind`` (``weight``, ``kv_read``, ``kv_write``), ``elements``,
    ``bytes``, ``share_pct`` (of the step's total bytes).

    Raises:
        BubblescopeError: as :func:`step_traffic`.
    """
    import pandas as pd

    df = pd.DataFrame(_rows(cfg, dtype_bytes, context, kv_dtype_bytes, weights),
                      columns=["component", "kind", "elements", "bytes"])
    df["share_pct"] = 100.0 * df["bytes"] / df["bytes"].sum()
    return df


def _check_rate(name: str, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
        raise BubblescopeError(f"bandwidth: {name} must be a positive number, got {value!r}")


def bandwidth(bytes_per_step: int, step_ms: float | None, peak_GBps: float | None = None,
              copy_GBps: float | None = None) -> dict:
    """``effective_bandwidth`` and its utilization against the two ceilings (docs/design.md).

    ``effective_GBps`` = bytes_per_step / (step_ms × 10^-3 s) / 10^9; ``util_peak`` = effective / NVML
    peak and ``util_copy`` = effective / measured copy bandwidth, both fractions (0.78 means 78 %).
    A value is None where an input it needs is None.

    Raises:
        BubblescopeError: ``bytes_per_step`` negative, or a time or bandwidth that is not positive.
    """
    if isinstance(bytes_per_step, bool) or not isinstance(bytes_per_step, (int, float)) or bytes_per_step < 0:
        raise BubblescopeError(f"bandwidth: bytes_per_step must be a number >= 0, got {bytes_per_step!r}")
    for name, value in (("step_ms", step_ms), ("peak_GBps", peak_GBps), ("copy_GBps", copy_GBps)):
        _check_rate(name, value)
    eff = None if step_ms is None else bytes_per_step / step_ms / 1e6
    return {
        "effective_GBps": eff,
        "util_peak": None if eff is None or peak_GBps is None else eff / peak_GBps,
        "util_copy": None if eff is None or copy_GBps is None else eff / copy_GBps,
    }


def floor_ms(bytes_per_step: int, GBps: float | None) -> float | None:
    """Lowest possible step time in ms if the step moved its bytes at ``GBps``: bytes / GBps / 10^6.

    Llama-3.2-1B bf16 (2.47 GB) at the H200's NVML peak 4814 GB/s: 0.51 ms; at its copy 4260 GB/s: 0.58 ms.
    Returns None when ``GBps`` is None.

    Raises:
        BubblescopeError: ``bytes_per_step`` negative or ``GBps`` not positive.
    """
    if isinstance(bytes_per_step, bool) or not isinstance(bytes_per_step, (int, float)) or bytes_per_step < 0:
        raise BubblescopeError(f"floor: bytes_per_step must be a number >= 0, got {bytes_per_step!r}")
    _check_rate("GBps", GBps)
    return None if GBps is None else bytes_per_step / GBps / 1e6


def rank_step_traffic(cfg, dtype_bytes: int, context: int, world_size: int, kv_dtype_bytes: int | None = None) -> dict:
    """:func:`step_traffic` of one of ``world_size`` tensor-parallel ranks (Megatron-LM layout, as
    ``reference_engine.tp`` splits the model), plus the step's collectives.

    HBM bytes per rank: the layers' projections and biases / N (``ModelConfig.tp_shard``), the RMSNorm
    weights whole, one embedding row, ceil(vocab_size / N) rows of the LM head, and the KV cache of the
    rank's num_key_value_heads / N heads. Collectives per step (batch 1, one token): 2 × layers
    all-reduces of hidden_size elements (after O-proj and down-proj) and one all-gather of the
    ceil(V/N) × N logits; ``allreduce_bytes`` and ``allgather_bytes`` are payload sizes (dtype_bytes each).
    ``bus_bytes`` = allreduce_bytes × 2(N−1)/N + allgather_bytes × (N−1)/N, the bytes each rank's link
    carries in a ring (the "bus bandwidth" factors of nccl-tests' doc/PERFORMANCE.md); 0 when N = 1.

    Raises:
        BubblescopeError: as :func:`step_traffic`, or a config that does not split over ``world_size``.
    """
    local = cfg.tp_shard(world_size)
    rows = -(-cfg.vocab_size // world_size)
    out = step_traffic(local.replace(vocab_size=rows), dtype_bytes, context, kv_dtype_bytes)
    n = world_size
    allreduce = 2 * cfg.num_hidden_layers * cfg.hidden_size * dtype_bytes
    allgather = rows * n * dtype_bytes
    out.update(world_size=n, allreduce_count=2 * cfg.num_hidden_layers, allreduce_bytes=allreduce,
               allgather_bytes=allgather, bus_bytes=(allreduce * 2 * (n - 1) + allgather * (n - 1)) / n)
    return out


def bound_by(rank_bytes: int, peak_GBps: float | None, nccl_us: float | None) -> dict:
    """Whether HBM or communication bounds a tensor-parallel step on one rank.

    ``hbm_floor_us`` = rank_bytes / peak_GBps / 10^3 (the step if the rank streamed its bytes at the peak);
    ``bound`` is ``communication`` when the step's NCCL kernel time (µs, e.g. the slowest rank's, which
    waits least) exceeds that floor, else ``hbm``; None where an input is None.

    Raises:
        BubblescopeError: ``rank_bytes`` negative or ``peak_GBps`` not positive.
    """
    floor = floor_ms(rank_bytes, peak_GBps)
    floor_us = None if floor is None else floor * 1e3
    bound = None
    if floor_us is not None and nccl_us is not None:
        bound = "communication" if nccl_us > floor_us else "hbm"
    return {"hbm_floor_us": floor_us, "nccl_us": nccl_us, "bound": bound}
