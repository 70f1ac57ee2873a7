"""Host side of the Triton kernel: Triton mode, compile-time constants, register cap, launching.

Triton mode. Under ``TRITON_INTERPRET=1`` Triton runs kernels on CPU tensors, but the choice is made
when ``triton`` is first imported (its library functions are decorated then) and cannot be undone in a
process. :func:`load_kernel` therefore sets ``TRITON_INTERPRET=1`` itself when a CPU engine is built
before anything imported triton (a documented, process-wide side effect: later Triton kernels of this
process are interpreted too), and raises ``EngineUnavailable`` with the fix when triton was already
imported in the other mode. Nothing here runs at import time. The grid is sized from the compiled kernel by
``..residency``.
"""

from __future__ import annotations

import os
import sys

import torch

from ...errors import EngineUnavailable
from ...models.config import ModelConfig
from ..residency import DeviceLimits
from ..schedule import NFIELDS, MegakernelParams, Tiling, next_pow2

DEFAULT_BLOCK_S = 32  # positions per attention block where MegakernelParams.block_s is None


def load_kernel(interpret: bool):
    """Import the kernel module in the requested Triton mode; returns ``kernel`` (the module).

    Raises:
        EngineUnavailable: triton is missing, or was already imported in the other mode.
    """
    if "triton" not in sys.modules and interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton
        import triton.language as tl
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError as e:  # pragma: no cover - triton is a dependency
        raise EngineUnavailable(f"megakernel needs triton ({e})") from None
    active = isinstance(tl.sum, InterpretedFunction)  # how triton itself was imported
    if active != interpret:
        if interpret:
            raise EngineUnavailable(
                "megakernel on CPU needs TRITON_INTERPRET=1 before triton is first imported, but this process "
                "already imported triton in compiled mode (set TRITON_INTERPRET=1 in the environment)")
        raise EngineUnavailable("megakernel on GPU needs compiled Triton, but TRITON_INTERPRET=1 was set when triton "
                                "was imported (unset it)")
    if bool(triton.knobs.runtime.interpret) != active:
        raise EngineUnavailable("TRITON_INTERPRET changed after triton was imported; set it once, before any import")
    from . import kernel
    return kernel


def prefetch_mode(prefetch: str, cfg: ModelConfig, dtype: torch.dtype, limits: "DeviceLimits | None") -> int:
    """PREFETCH constant: 0 off, 1 ``prefetch.global.L2`` per line, 2 ``cp.async.bulk.prefetch.L2``.

    ``auto`` picks bulk when the device is sm_90+ and every weight row is a multiple of 16 bytes (the
    bulk prefetch's alignment rule), else line; no device (the interpreter) means off. ``dtype`` is the layer
    matrices' dtype (float8_e4m3fn for FP8 weights, 1 byte an element: the strictest rule, which a 16-bit LM head
    beside them then meets too).

    Raises:
        EngineUnavailable: ``bulk`` requested where it cannot run.
    """
    if prefetch == "off" or limits is None:
        return 0
    aligned = all((n * dtype.itemsize) % 16 == 0 for n in (cfg.hidden_size, cfg.q_size, cfg.intermediate_size))
    bulk_ok = aligned and limits.capability >= (9, 0)
    if prefetch == "bulk" and not bulk_ok:
        raise EngineUnavailable("megakernel prefetch=bulk needs sm_90+ and 16-byte aligned weight rows")
    return 2 if prefetch == "bulk" or (prefetch == "auto" and bulk_ok) else 1


def register_cap(params: MegakernelParams, regs_per_sm: int = 65536) -> int:
    """Per-thread register cap (``maxnreg``) for ``params``: ``params.max_registers``, or the most registers
    that keep ``programs_per_sm`` programs of ``num_warps`` warps resident (multiple of 8, at most 255)."""
    if params.max_registers:
        return min(255, params.max_registers)
    return max(24, min(255, regs_per_sm // (params.programs_per_sm * params.num_warps * 32) // 8 * 8))


def kernel_constexprs(cfg: ModelConfig, t: Tiling, params: MegakernelParams, max_seq_len: int, has_bias: bool,
                      has_qk_norm: bool, prefetch: int, fp8: bool = False, fp8_head: bool = False) -> dict:
    """The compile-time arguments of ``kernel.megakernel`` (model shape, tiles, switches). ``fp8``: the layer
    matrices are float8_e4m3fn with float32 row scales; ``fp8_head``: the LM head too (``packing.py``)."""
    return dict(
        H=cfg.hidden_size, Q=cfg.q_size, KV=cfg.kv_size, I=cfg.intermediate_size, IP=t.i_pad, V=cfg.vocab_size,
        D=cfg.head_dim, G=cfg.gqa_group, NKV=cfg.num_key_value_heads, S_MAX=max_seq_len, NSPLIT=t.kv_splits,
        MIN_CHUNK=t.attn_min_chunk,
        NF=NFIELDS, HB=t.hb, GB=t.gb,
        # columns per chunk for K = H, Q, I: never wider than the matrix (masked lanes cost time on CPU)
        BLOCK_KH=min(params.block_k, next_pow2(cfg.hidden_size)), BLOCK_KQ=min(params.block_k, next_pow2(cfg.q_size)),
        BLOCK_KI=min(params.block_k, next_pow2(cfg.intermediate_size)),
        BLOCK_P=t.block_p, BLOCK_O=t.block_o, BLOCK_GU=t.block_gu, BLOCK_DN=t.block_dn, BLOCK_LM=t.block_lm,
        BLOCK_QH=t.block_qh, BLOCK_S=params.block_s or DEFAULT_BLOCK_S, BLOCK_SPLIT=t.block_split, HAS_BIAS=has_bias,
        HAS_QK_NORM=has_qk_norm, PREFETCH=prefetch, PF_LANES=32 * params.num_warps,
        PF_AHEAD=params.prefetch_ahead, SLEEP_NS=params.spin_sleep_ns,
        TIMELINE=bool(params.timeline), FP8=bool(fp8), FP8_HEAD=bool(fp8_head),
        W_EVICT="" if params.weight_eviction == "auto" else params.weight_eviction)  # auto: none (even, NOTES)
