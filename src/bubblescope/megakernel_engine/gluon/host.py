"""Host side of the Gluon megakernel: when it can run, its tiling, compile-time constants, descriptors, launching.

The Gluon kernel reads the same instruction table and packed weights as the Triton kernel (``schedule.py``,
``packing.py``); what differs is the tiling (every weight task is one TMA tile of ``BR`` rows over all columns,
one attention task per (kv head, split), the fused split reduction) and the launch (one CTA per SM, tensor
descriptors). Importing this module does not import Triton; :func:`load_gluon_kernel` does.
"""

from __future__ import annotations

import contextlib
import math

import torch

from ...errors import BubblescopeError, EngineUnavailable
from ...models.config import ModelConfig
from ..packing import SCALE_FIELDS
from ..residency import cubin_text_bytes, ptxas_usage
from ..schedule import NFIELDS, MegakernelParams, Tiling, next_pow2, resolve_tiling

PRODUCER_REGS = 40          # registers of the 1-warp TMA producer (it only walks the table and issues copies)
TILE_BYTES_ROW = 512        # bytes of one box row: 256 bf16 / 128 fp32 columns (the H200 probe's stage width)
# Defaults from the H200 sweep of 2026-12-01 (benchmarks/results/h200-2026-12-01, llama-3.2-1b, context 128):
# BR 16 / NS 20 1.076 ms, BR 16 / NS 24 0.975, BR 32 / NS 12 0.949; attention chunk 16 0.953 against 32 1.076.
DEFAULT_ROWS = 32           # BR: rows per tile / task (a 16 KB TMA box of bf16)
DEFAULT_RING = 12           # NS: ring slots; 12 × 16 KB = 192 KB of weights in flight per SM
# positions per attention block: 0.909 ms against 0.926 at 32 (context 128), 1.19 / 1.31 at 4096
# (benchmarks/results/h200-2026-12-01/sweep_f_*.json)
DEFAULT_BLOCK_S = 64
# bytes a producer keeps requested and not landed (MegakernelParams.inflight = None): H200 sweeps
# benchmarks/results/h200-2026-12-02-s13/gluon_check_r41_*.json and h200-2026-12-02-s15/gluon_check_r45_*.json:
# 4 slots of 16 KB 1-2 % faster on Llama-3.2-1B, ~0.5 % on Llama-3.1-8B; 2 slots of 32 KB
# (Qwen2.5-0.5B) even within the noise; at least 2 slots whatever their size
INFLIGHT_BYTES = 64 * 1024
DEFAULT_SPLITS = 16         # attention position splits per kv head (8 kv heads × 16 ≈ the grid)
SMEM_PER_BLOCK_SM90 = 232448  # max dynamic shared memory per block on sm_90 (CUDA Programming Guide, CC 9.0)
TMA_BOX_MAX = 256           # most elements along one dimension of a TMA box (CUDA Driver API, cuTensorMapEncodeTiled)


# The kernel's tuple arguments (``gluon.kernel.megakernel``): each the names of the arguments it groups, in order.
# The engine binds arguments by these names; :func:`pack_args` groups them.
ARG_TUPLES = {
    "sched": ("table_ptr", "counts_ptr", "state_ptr", "counters_ptr", "done_ptr", "err_ptr", "timeline_ptr"),
    "model": ("emb_ptr", "fnorm_ptr", "bqkv_ptr", "anorm_ptr", "mnorm_ptr", "cos_ptr", "sin_ptr", "kc_ptr", "vc_ptr",
              "qknorm_ptr"),
    "acts": ("x_ptr", "q_ptr", "pm_ptr", "pl_ptr", "pacc_ptr", "attn_ptr", "act_ptr", "logits_ptr", "amax_ptr",
             "knew_ptr"),
    "weights": ("wqkv_ptr", "wo_ptr", "wgu_ptr", "wdown_ptr", "head_ptr"),
    "scales": tuple(f"{n}_ptr" for n in SCALE_FIELDS),
}


def pack_args(args: dict) -> dict:
    """``args`` (the kernel's arguments by element name, :data:`ARG_TUPLES`) with each tuple's elements replaced by
    the tuple; FP8 row scales absent from ``args`` are None (unread without FP8 weights)."""
    grouped = {n for names in ARG_TUPLES.values() for n in names}
    out = {k: v for k, v in args.items() if k not in grouped}
    for key, names in ARG_TUPLES.items():
        out[key] = tuple(args.get(n) if key == "scales" else args[n] for n in names)
    return out


def weight_bytes(dtype: torch.dtype, weight_format: str = "bf16") -> int:
    """Bytes of one layer weight streamed through the ring: 1 in FP8 (``fp8`` / ``fp8-all``), else the
    activation ``dtype``'s size."""
    return 1 if weight_format != "bf16" else torch.empty((), dtype=dtype).element_size()


def pow2_floor(n: int) -> int:
    """Largest power of two <= n (1 for n <= 1)."""
    return 1 << (max(1, int(n)).bit_length() - 1)


def gluon_device_unsupported(capability: tuple[int, int] | None) -> str | None:
    """Why the Gluon kernel cannot run on a device of CUDA compute ``capability`` (None: no CUDA device, e.g. the
    CPU interpreter), whatever the model, or None when the device is a Hopper GPU (sm_90)."""
    if capability is None:
        return "the Gluon megakernel needs a CUDA GPU (the CPU interpreter cannot run Gluon)"
    if capability[0] != 9:
        return f"the Gluon megakernel targets Hopper (sm_90); this GPU is sm_{capability[0]}{capability[1]}"
    return None


def gluon_unsupported(cfg: ModelConfig, dtype: torch.dtype, capability: tuple[int, int] | None,
                      weight_format: str = "bf16") -> str | None:
    """Why the Gluon kernel cannot run this model here (one line), or None when it can.

    Needs: a Hopper GPU (sm_90: TMA and warp specialization as Triton 3.6 lowers them), Triton's Gluon
    dialect, bf16/fp16/fp32 weights (FP8 layer weights, ``weight_format`` ``fp8`` / ``fp8-all``, with 16-bit
    activations), 16-byte aligned weight rows (a TMA rule: the row stride of each weight matrix is a multiple of
    16 bytes). q/k-norm (Qwen3) runs in the attention task (``qk_norm_in_attn``).
    """
    if why := gluon_device_unsupported(capability):
        return why
    try:
        import triton.experimental.gluon.language.nvidia.hopper  # noqa: F401
    except ImportError as e:
        return f"this Triton has no Gluon Hopper dialect ({e})"
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"the Gluon megakernel supports bf16/fp16/fp32 weights, not {dtype}"
    if weight_format != "bf16" and dtype == torch.float32:
        return "the Gluon megakernel streams FP8 weights beside 16-bit activations (bf16/fp16), not float32"
    esize = weight_bytes(dtype, weight_format)
    for name, k in (("hidden_size", cfg.hidden_size), ("q_size", cfg.q_size),
                    ("intermediate_size", cfg.intermediate_size)):
        if (k * esize) % 16:
            return f"TMA needs 16-byte aligned weight rows; {name}={k} × {esize} bytes is not"
    return None


def box_cols(cfg: ModelConfig, esize: int) -> int:
    """``BK``: columns per TMA box row, :data:`TILE_BYTES_ROW` bytes of ``esize``-byte weights, capped at the
    narrowest matrix (a power of two) and at :data:`TMA_BOX_MAX` elements (FP8: 256 columns, 256 bytes)."""
    return min(TILE_BYTES_ROW // esize, TMA_BOX_MAX,
               pow2_floor(min(cfg.hidden_size, cfg.q_size, cfg.intermediate_size)))


def auto_matvec(cfg: ModelConfig, params: MegakernelParams, sms: int, esize: int,
                layout: str = "mma") -> tuple[str, int]:
    """``mv_widen`` and ``slot_boxes`` where ``params`` leaves them to the model (``auto`` / None): thin models
    (:func:`auto_rows` gives them 16-row tiles) under the tensor-core attention (``layout``, resolved) get the
    tensor-core matvec at 32 rows with two boxes per slot (``mma``, 2) where :func:`mv_mma_unsupported` allows it
    with the rows and boxes per slot it would run with (``max_rows`` and ``slot_boxes`` where the user set them);
    the rest the CUDA-core matvec (``bits``) and, under ``mma`` asked by name, two boxes per slot, else one. (The
    pair was measured with the tensor-core attention; Qwen2.5-0.5B's ``warps`` layout beside the tensor-core matvec
    spills 64 bytes, offline sm_90 compile.)

    Measured on the H200 (``gluon_check.py``, interleaved rounds, stepwise ms at context 128): Qwen2.5-0.5B, the thin
    preset, 0.713 / 0.724 against the 16-row default's 0.761 / 0.766 (``h200-2026-12-02-s12/gluon_check_r38q_*.json``)
    and 0.657 / 0.656 against 0.700 / 0.704 (``h200-2026-12-02-s13/gluon_check_r39q_*.json``; 32 rows with two boxes on
    the CUDA cores 0.706 / 0.703, so the gain is the tensor cores'); its argmaxes 255 / 256 equal to the bf16
    reference's (the one other is the step where the reference itself disagrees with fp32), logit error against fp32
    0.0211 (the reference's 0.0213). On the 32-row presets the pair is even or slower
    (``h200-2026-12-02-s13/gluon_check_r39_*.json``: Llama-3.2-1B 0.820 / 0.816 against 0.809 / 0.812, Qwen3-0.6B 0.760
    / 0.762 against 0.748 / 0.749), so they keep ``bits`` and one box; ``mma`` by name with one or two boxes is even on
    the 1B (``gluon_check_r38_*``: 0.810 / 0.815 against 0.814 / 0.815).

    FP8 weights (``esize`` 1) take the tensor cores on every model where they can run: the CUDA-core form spends per
    two weights an unpack, two half adds and two FMAs (the offline SASS, benchmarks/NOTES.md, FP8), the tensor-core
    form one 128-byte box widened to f16 per ``mma.sync``. Measured on an H100 (``h100-2026-12-07-fp8-mma``, commit
    0cba590, 128-token prompt, p50 ms/token): Llama-3.2-1B FP8 0.792 against 0.834, Llama-3.1-8B FP8 3.378 against
    3.746; greedy tokens and teacher-forced logits within the FP8 tolerance of the fused engine on the 1B (fp8,
    fp8-all), Qwen3-0.6B and Qwen2.5-0.5B (GPU tests)."""
    widen = params.mv_widen
    if widen == "auto":
        thin = auto_rows(cfg, sms) < DEFAULT_ROWS and layout == "mma"
        # checked with the rows and boxes it would run with: the user's max_rows / slot_boxes where set
        rows = tile_rows(cfg, params, mma_rows(cfg, params, sms))
        # FP8 weights take the tensor cores whatever the model's width: widening e4m3 on the CUDA cores costs about
        # twice the instructions per byte of bf16's (docstring)
        widen = "mma" if (thin or esize == 1) and mv_mma_unsupported(
            cfg, esize, rows, params.split_k, box_cols(cfg, esize), params.slot_boxes or 2,
            params.num_warps) is None else "bits"
    sb = params.slot_boxes if params.slot_boxes is not None else 2 if widen == "mma" else 1
    return widen, sb


def mma_rows(cfg: ModelConfig, params: MegakernelParams, sms: int) -> int:
    """The automatic rows per tile under ``mv_widen=mma``: :func:`auto_rows`, at least 16 per mma tile in a QKV /
    gate-up half and in an O-proj / down task (``16 · max(2, split_k)``)."""
    return max(auto_rows(cfg, sms), 16 * max(2, params.split_k))


def tile_rows(cfg: ModelConfig, params: MegakernelParams, auto: int) -> int:
    """``BR``: ``params.max_rows`` where set, else ``auto``; capped at head_dim (a QKV tile holds whole RoPE pair
    blocks) and rounded down to a power of two."""
    br = min(params.max_rows if params.max_rows != MegakernelParams.max_rows else auto, cfg.head_dim)
    return max(2, pow2_floor(br))


def auto_rows(cfg: ModelConfig, sms: int) -> int:
    """Rows per QKV / gate-up / LM-head tile chosen from the model's shape: :data:`DEFAULT_ROWS` (32), or 16
    when the QKV stage at 32 rows would have tasks for fewer than half of the ``sms`` SMs (thin models: the
    halved tiles also double the O-proj and down tasks, which then run on twice the SMs).

    Measured on the H200 (benchmarks/results/h200-2026-12-01-s5, ``gluon_check.py --sweep rows``, interleaved
    rounds): Qwen2.5-0.5B (36 QKV tasks at 32 rows) 0.904 ms at 16 rows against 1.004 at 32; Qwen3-0.6B (128)
    0.880 against 0.860; Llama-3.2-1B (96) 0.996 against 0.906 (``tune --knob max_rows``,
    benchmarks/results/h200-2026-12-01-s4/tune_rows.log)."""
    qkv_tasks = -(-(cfg.q_size + 2 * cfg.kv_size) // DEFAULT_ROWS)
    return 16 if 2 * qkv_tasks < sms else DEFAULT_ROWS


def mma_unsupported(cfg: ModelConfig, esize: int, block_s: int, num_warps: int) -> str | None:
    """Why ``attn_layout=mma`` cannot run ``cfg`` with ``esize``-byte weights, ``block_s`` positions per block and
    ``num_warps`` consumer warps, or None where it can. ``mma.sync`` m16n8k16 takes 16-bit operands, k in steps of
    16 and n ≥ 8 per warp; the query heads of a kv head fill one 16-row A tile (attention.py, ``attention_mma``)."""
    d = cfg.head_dim
    if esize != 2 or d % 16 or block_s % 16 or block_s < 8 * num_warps or cfg.gqa_group > 16:
        return (f"attn_layout=mma needs 16-bit weights, head_dim and block_s multiples of 16, block_s ≥ 8 × "
                f"num_warps and at most 16 query heads per kv head; got {esize * 8}-bit weights, head_dim {d}, block_s "
                f"{block_s}, num_warps {num_warps}, {cfg.gqa_group} query heads per kv head")
    return None


def mv_mma_unsupported(cfg: ModelConfig, esize: int, br: int, split: int, bk: int, slot_boxes: int,
                       num_warps: int) -> str | None:
    """Why ``mv_widen=mma`` (the matvec on the tensor cores, ``matvec.mv_mma``) cannot run ``cfg`` with
    ``esize``-byte weights, ``br`` rows per QKV / gate-up / LM-head tile, ``split`` (split_k), ``bk`` columns per box,
    ``slot_boxes`` and ``num_warps`` consumer warps, or None where it can. ``mma.sync`` m16n8k16 takes 16-bit
    operands (FP8 weights are widened to f16 in registers, exactly) and 16 rows per A tile (a QKV / gate-up half
    holds ``br / 2`` rows, an O-proj / down task ``br / split``); each box arrives as boxes of 128 bytes
    (:func:`mma_box_cols`: the widest a 128-byte TMA swizzle allows; columns past K are TMA's zeros, as in the
    unswizzled ring), and the warps split a slot's boxes, so a slot must hold at least one per warp."""
    rows = min(br // 2, br // split)
    if esize not in (1, 2):
        return f"mv_widen=mma needs 16-bit or FP8 weights; got {esize * 8}-bit"
    full = min(TILE_BYTES_ROW // esize, TMA_BOX_MAX)
    if bk != full:
        return f"mv_widen=mma needs {full}-column boxes; this model's are {bk} (a matrix is narrower)"
    if rows < 16:
        return (f"mv_widen=mma needs at least 16 rows per matvec (one mma tile); got {rows} (BR {br}, "
                f"split_k {split}): set max_rows ≥ {16 * max(2, split)}")
    mb = mma_box_cols(esize)
    if slot_boxes * bk // mb < num_warps:
        return (f"mv_widen=mma splits a slot's {mb}-column boxes across the {num_warps} consumer warps and a slot "
                f"holds {slot_boxes * bk // mb}")
    return None


def mma_box_cols(esize: int) -> int:
    """Columns of one tensor-core matvec box: 128 bytes of ``esize``-byte weights (64 bf16, 128 FP8), the widest
    row a 128-byte TMA swizzle allows."""
    return 128 // esize


def resolve_attn_layout(cfg: ModelConfig, layout: str, esize: int, block_s: int, num_warps: int) -> str:
    """The attention layout for ``cfg``: ``layout`` unless it is ``auto``, which picks ``mma`` (the tensor cores)
    wherever :func:`mma_unsupported` allows it for ``esize``-byte weights (2: bf16 / fp16, 4: fp32), ``block_s``
    positions per block and ``num_warps`` consumer warps, else ``warps`` (warp-local online softmax) for models
    without q/k-norm and at most 4 query heads per kv head, else ``blocks``. An explicit ``mma`` is returned as
    asked; :func:`gluon_constexprs` refuses it where it cannot run.

    Measured on the H200 (``gluon_check.py``, interleaved rounds, stepwise ms,
    benchmarks/results/h200-2026-12-01-s8/gluon_check_r23_*.json): ``mma`` against the then default, Llama-3.2-1B 0.867
    / 0.864 against 0.890 / 0.894 (``warps``), at 4096 tokens of context 1.024 / 1.005 against 1.066 / 1.046;
    Qwen2.5-0.5B 0.768 / 0.777 against 0.856 / 0.859 (``blocks``); Qwen3-0.6B 0.807 / 0.796 against 0.847 / 0.845
    (``blocks``); Llama-3.1-8B 4.051 / 4.052 against 4.128 / 4.157 (``warps``). ``warps`` against ``blocks`` on
    Llama-3.2-1B at 4096 1.094 / 1.068 against 1.182 / 1.160 (``h200-2026-12-01-s6/gluon_check_r16*.json``);
    Qwen2.5-0.5B (7 query heads per kv head) spilled 8 bytes with ``warps``, hence its group limit. ``warps`` has no
    q/k-norm path (Qwen3).

    Raises:
        BubblescopeError: ``warps`` asked for a model with q/k-norm.
    """
    if layout == "warps" and cfg.qk_norm:
        raise BubblescopeError("megakernel params: attn_layout=warps does not support q/k-norm (Qwen3) yet")
    if layout != "auto":
        return layout
    if mma_unsupported(cfg, esize, block_s, num_warps) is None:
        return "mma"
    return "warps" if not cfg.qk_norm and cfg.gqa_group <= 4 else "blocks"


def resolve_block_s(cfg: ModelConfig, layout: str, params: MegakernelParams, block_s: int) -> int:
    """Positions per attention block for ``cfg`` in attention ``layout``: ``params.block_s`` where set; else
    ``block_s`` (``gluon_params``' register rule for the CUDA-core layouts, whose products hold the padded query
    heads of a kv head), except on the tensor cores (``mma``), where the query heads are padded to 16 rows
    whatever their count: there ``min(DEFAULT_BLOCK_S, 4096 // head_dim)`` positions (two K/V tiles of ≤ 4096
    values in flight), which moves only models with more than 4 query heads per kv head (Qwen2.5-0.5B: 32 → 64).
    (The fewest positions per split, ``attn_min_chunk``, is ``schedule.DEFAULT_MIN_CHUNK`` on both kernels.)

    Measured on the H200 (``gluon_check.py --timed 256``, interleaved, stepwise ms,
    benchmarks/results/h200-2026-12-01-s9/gluon_check_r28_*.json), Qwen2.5-0.5B (7 query heads per kv head, head_dim
    64), 64-position blocks against 32: 0.779 / 0.793 against 0.778 / 0.769 at context 128, 0.900 / 0.898 against 0.954
    / 0.962 at 4096. Not taken: one split up to 256 positions with 128-position blocks (``gluon_check_r27_*`` over 160
    timed positions 0.727–0.735 against 0.772–0.787, but ``gluon_check_r28_*`` over 256: 0.831 / 0.825, where contexts
    past 256 split again).
    """
    if params.block_s is None and layout == "mma":
        return max(16, min(DEFAULT_BLOCK_S, 4096 // cfg.head_dim))
    return block_s


def resolve_attn_gate(cfg: ModelConfig, gate: int | None) -> int:
    """The attention gate for ``cfg`` (see ``MegakernelParams.attn_gate``): ``gate`` unless it is None (auto),
    which holds the producer at an attention task (0 tiles past it) on every model.

    Measured on the H200 (``gluon_check.py``, interleaved rounds, stepwise ms, the p50 of each config's 160 timed steps
    and round; files under benchmarks/results/):

    * ``h200-2026-12-02-s18/gluon_check_r50_*.json``, off without q/k-norm / gate 0 / gate 2,
      two configs each: Llama-3.2-1B 0.774, 0.781 / 0.766, 0.765 / 0.781, 0.785; the 1B at context 4096 0.879,
      0.879 / 0.874, 0.875 / 0.872, 0.872; Llama-3.1-8B 3.776, 3.774 / 3.738, 3.751 / 3.745, 3.735; Llama-3.2-3B
      1.832, 1.835 / 1.862, 1.830 / 1.846, 1.842 (its rounds bimodal, 1.82–1.84 or 1.89–1.98, in every config); Qwen2.5-0.5B
      0.638, 0.638 / 0.636, 0.636 / 0.639, 0.637. Gate 0 gains 1–2 % on the 1B at 128, ~0.5 % at 4096, ~0.8 % on the 8B, and is even on the others.
    * ``h200-2026-12-01-s7/gluon_check_r20*.json`` and ``gluon_check_r21_*.json``, with ``sig_gate`` 3, the gate at
      0 against without it: Qwen3-0.6B 0.805 / 0.803 against 0.812 (the gate alone 0.889 / 0.885 against 0.914 /
      0.908); even on the 1B and the 8B and worse on Qwen2.5-0.5B (0.868 against 0.849), on a kernel without
      the weight stream's evict_first policy and the in-flight cap, which the measurement above has.
    """
    if gate is not None:
        return gate
    return 0


def resolve_attn_split(cfg: ModelConfig, new_row: str, combine: str) -> tuple[str, str]:
    """``attn_new_row`` and ``attn_combine`` for ``cfg`` (see ``MegakernelParams``): each as asked unless it is
    ``auto``, which picks ``row`` and ``lanes`` for models without q/k-norm and ``block`` and ``warps`` for those
    with it (Qwen3, whose attention task also norms and rotates q and k behind the attention gate).

    Measured on the H200 (``gluon_check.py``, interleaved rounds, stepwise ms,
    benchmarks/results/h200-2026-12-02-s11/gluon_check_r32_*.json), ``row`` + ``lanes`` against ``block`` + ``warps``:
    Llama-3.2-1B 0.809 / 0.810 against 0.833 / 0.834 (``lanes`` alone 0.814 / 0.815, ``row`` alone 0.830 / 0.833);
    Qwen2.5-0.5B 0.698 / 0.702 against 0.772 / 0.772; Llama-3.1-8B 4.024 against 4.105 / 4.060 (one round of each: the
    second ran out of GPU memory); Qwen3-0.6B 0.765 / 0.762 against 0.751 / 0.751 (worse; ``row`` alone 0.755 / 0.754,
    ``lanes`` alone 0.755 / 0.755).
    """
    auto = not cfg.qk_norm
    return (new_row if new_row != "auto" else "row" if auto else "block",
            combine if combine != "auto" else "lanes" if auto else "warps")


def gluon_params(cfg: ModelConfig, params: MegakernelParams, sms: int = 132,
                 dtype: torch.dtype = torch.bfloat16, weight_format: str = "bf16") -> MegakernelParams:
    """``params`` with the Gluon kernel's fixed choices: one tile of ``BR`` rows per weight task, one kv head
    per attention task, the fused split reduction, one CTA per SM, q/k-norm and RoPE of q/k in the attention
    task (Qwen3: a QKV tile of BR rows then needs no whole head). The matvec and the boxes per ring slot where left
    to the model (:func:`auto_matvec`). ``BR`` is ``params.max_rows`` when set, else :func:`auto_rows` for ``sms``
    SMs (at least 32 under ``mv_widen=mma``: 16 rows per mma tile), capped at head_dim (a QKV tile holds whole RoPE
    pair blocks: BR/2 must divide head_dim/2); the ``auto`` attention layout for ``dtype`` activations (:func:`resolve_attn_layout`); the
    attention's positions per block where ``block_s`` is None (:func:`resolve_block_s`); the first block's new row
    and the split combine's layout (:func:`resolve_attn_split`); ``weight_eviction=auto`` (:func:`resolve_eviction`).

    Raises:
        BubblescopeError: ``attn_layout=warps`` asked for a model with q/k-norm (:func:`resolve_attn_layout`).
    """
    esize = torch.empty((), dtype=dtype).element_size()
    # the attention's (GP, BLOCK_S, D) products: at most 16384 values (128 per consumer thread), or registers spill
    # (offline sm_90 compile: Qwen2.5-0.5B's 8 padded query heads per kv head spilled 108 bytes at BLOCK_S 64,
    # head_dim 128 (Llama-3.2-3B, 3.1-8B) 52 and 110 bytes); and each (BLOCK_S, D) K/V tile, two of them in
    # flight, at most 4096 values (32 per consumer thread): Qwen3-0.6B (2 query heads per kv head, head_dim 128,
    # q/k-norm in the attention task) spilled 32 bytes at BLOCK_S 64, none at 32
    block_s = max(16, min(DEFAULT_BLOCK_S, 16384 // (next_pow2(cfg.gqa_group) * cfg.head_dim), 4096 // cfg.head_dim))
    block_s = block_s if params.block_s is None else params.block_s
    layout = resolve_attn_layout(cfg, params.attn_layout, esize, block_s, params.num_warps)
    block_s = resolve_block_s(cfg, layout, params, block_s)
    widen, sb = auto_matvec(cfg, params, sms, weight_bytes(dtype, weight_format), layout)
    br = tile_rows(cfg, params, mma_rows(cfg, params, sms) if widen == "mma" else auto_rows(cfg, sms))
    rows_od = br // params.split_k  # O-proj / down tiles: BR/2 rows over 2·BK columns per slot (split_k = 2)
    new_row, combine = resolve_attn_split(cfg, params.attn_new_row, params.attn_combine)
    return params.replace(attn_layout=layout, attn_gate=resolve_attn_gate(cfg, params.attn_gate), block_s=block_s,
                          mv_widen=widen, slot_boxes=sb,
                          attn_new_row=new_row, attn_combine=combine, rows_qkv=br, rows_o=rows_od, rows_gateup=br,
                          rows_down=rows_od, rows_lm=br, gateup_blocks=1,
                          lm_blocks=1, attn_kv_heads=1, attn_reduce="fused", programs_per_sm=1,
                          kv_splits=params.kv_splits or DEFAULT_SPLITS, qk_norm_in_attn=True,
                          weight_eviction=resolve_eviction(params.weight_eviction))


def resolve_eviction(choice: str, triton_version: str | None = None) -> str:
    """The weight stream's L2 policy for ``weight_eviction=choice``: ``auto`` is ``evict_first`` under Triton 3.6
    (the PTX form ``gluon/ptx.py`` rewrites; measured on the H200, ``h200-2026-12-02-s15/gluon_check_r44_*.json``:
    1-3 % faster on Llama-3.2-1B and Llama-3.1-8B, even on the Qwen presets; see ``MegakernelParams.weight_eviction``)
    and ``""`` under another Triton, whose TMA loads the rewrite may not know; other choices are returned as given.
    ``triton_version`` defaults to the installed one."""
    if choice != "auto":
        return choice
    if triton_version is None:
        import triton
        triton_version = triton.__version__
    return "evict_first" if triton_version.split(".")[:2] == ["3", "6"] else ""


def gluon_tiling(cfg: ModelConfig, params: MegakernelParams, grid: int,
                 dtype: torch.dtype = torch.bfloat16, weight_format: str = "bf16") -> Tiling:
    """The tiling of :func:`gluon_params` for ``grid`` CTAs (one per SM; see ``schedule.resolve_tiling``),
    ``dtype`` activations and ``weight_format`` layer weights."""
    t = resolve_tiling(cfg, gluon_params(cfg, params, grid, dtype, weight_format), grid)
    assert t.hb == t.rows_qkv // 2, "QKV tiles must be whole RoPE pair blocks"
    return t


def gluon_constexprs(cfg: ModelConfig, t: Tiling, params: MegakernelParams, max_seq_len: int, dtype: torch.dtype,
                     has_bias: bool, ring: int | None = None, weight_format: str = "bf16") -> dict:
    """Compile-time arguments of ``gluon.kernel.megakernel`` (shapes, tile and layout parameters, switches);
    ``params`` as :func:`gluon_params` resolves them (``auto`` layout, attention gate, block_s).

    ``BK`` = 512 bytes of columns per box row (256 bf16 / 128 fp32, the H200 probe's stage width), capped at
    the narrowest matrix; ``NCH_*`` = column chunks of K = H, Q, I; ``KCH_*`` their staged-vector capacity
    (a power of two); ``NS`` = ring slots that fit beside ``xs`` (:func:`fit_ring`); ``VEC``/``TK`` = 16-byte
    vectors per thread and threads along K of the tile layout; ``VD``/``TD`` the same along head_dim.

    FP8 layer weights (``weight_format`` ``fp8``: ``W_FP8``; ``fp8-all``: also ``HEAD_FP8``): boxes of 1-byte
    weights (``BK`` = 256 columns, the TMA box limit), twice the ring slots of the 16-bit kernel (the same bytes in
    the ring), and a 16-bit head (``fp8``) in boxes of ``BK / 2`` columns: every slot holds the same bytes.

    Raises:
        BubblescopeError: ``attn_layout=mma`` with activations that are not 16-bit, a head_dim / block_s the
            ``mma.sync`` m16n8k16 tiles do not fit, or more than 16 query heads per kv head; ``mv_widen=mma``
            where :func:`mv_mma_unsupported` names a reason (FP8 weights among them); ``weight_eviction=evict_last``
            (the Triton kernel's); ``l2_ahead`` or ``wait_prefetch`` with FP8 weights.
    """
    esize = torch.empty((), dtype=dtype).element_size()  # activations (the staged vector, the KV cache)
    wsize = weight_bytes(dtype, weight_format)
    fp8 = weight_format != "bf16"
    br = t.rows_qkv
    bk = box_cols(cfg, wsize)
    vec = min(16 // esize, bk)
    nch = {k: -(-n // bk) for k, n in (("H", cfg.hidden_size), ("Q", cfg.q_size), ("I", cfg.intermediate_size))}
    # a ring slot holds slot_boxes boxes, each a chunk (a pair of chunks 2c, 2c + 1 with split_k = 2): the boxes
    # of a task's last slot past K meet staged zero chunks
    sb = params.slot_boxes
    kch = {k: next_pow2(-(-v // (m := sb * (params.split_k if k != "H" else 1))) * m) for k, v in nch.items()}
    d = cfg.head_dim
    vd = min(d, 16 // esize)
    why = mma_unsupported(cfg, esize, params.block_s, params.num_warps) if params.attn_layout == "mma" else None
    if why:
        raise BubblescopeError(f"megakernel params: {why}")
    if params.weight_eviction == "evict_last":  # the Triton kernel's; the Gluon weight stream reads each line once
        raise BubblescopeError("megakernel params: weight_eviction=evict_last is the Triton kernel's; the Gluon "
                               "kernel takes auto, '' or evict_first")
    why = (mv_mma_unsupported(cfg, wsize, br, params.split_k, bk, params.slot_boxes, params.num_warps)
           if params.mv_widen == "mma" else None)
    if why:
        raise BubblescopeError(f"megakernel params: {why}")
    if fp8 and (params.l2_ahead or params.wait_prefetch):  # their tile addresses assume one weight size
        raise BubblescopeError("megakernel params: l2_ahead and wait_prefetch run with 16-bit weights only; "
                               "use 0 with FP8 weights")
    slot_bytes = sb * br * bk * wsize
    # the ring's bytes as with 16-bit weights: FP8 slots are half as big, so twice as many
    wanted = int(ring) if ring else params_ring(params) * esize // wsize  # ring: slots asked for by number
    ns = fit_ring(max(1, wanted // sb), slot_bytes, max(kch.values()) * bk * esize)
    inflight = max(2, INFLIGHT_BYTES // slot_bytes) if params.inflight is None else params.inflight
    return dict(
        H=cfg.hidden_size, Q=cfg.q_size, KV=cfg.kv_size, I=cfg.intermediate_size, IP=t.i_pad, V=cfg.vocab_size,
        D=d, G=cfg.gqa_group, GP=next_pow2(cfg.gqa_group), NKV=cfg.num_key_value_heads, S_MAX=max_seq_len,
        NSPLIT=t.kv_splits, MIN_CHUNK=t.attn_min_chunk, NF=NFIELDS, BR=br, BK=bk,
        NS=ns,
        SB=sb, NCH_H=nch["H"], NCH_Q=nch["Q"], NCH_I=nch["I"], KCH_H=kch["H"],
        KCH_Q=kch["Q"], KCH_I=kch["I"], KCH=max(kch.values()), VEC=vec, TK=min(32, bk // vec),
        BLOCK_S=params.block_s, BLOCK_SPLIT=min(16, next_pow2(t.kv_splits)), VD=vd, TD=min(32, d // vd),
        HAS_BIAS=has_bias, QK_NORM=bool(t.qk_norm_attn), PREFETCH=0 if params.prefetch == "off" else 1, TIMELINE=bool(params.timeline),
        SPLIT=params.split_k, L2_AHEAD=params.l2_ahead, WAIT_PF=params.wait_prefetch,
        INFLIGHT=inflight if inflight < ns else 0,  # a whole ring's worth is no cap
        NORM_W={"after": 0, "beside": 1, "prefetch": 2}[params.norm_load],
        TMA_EVICT=resolve_eviction(params.weight_eviction) == "evict_first",
        WAIT_PF_OPS=params.wait_prefetch_mask(), PF_LANES_P=max(br, 32), PF_LANES_C=max(br, 32 * params.num_warps),
        WAIT_PF_LINE=params.wait_prefetch_mode == "line",
        NW=params.num_warps, PRODUCER_REGS=PRODUCER_REGS, LM_CTA=params.lm_pick == "cta",
        ATTN_WARPS=params.attn_layout == "warps", ATTN_MMA=params.attn_layout == "mma", SIG_GATE=params.sig_gate,
        ATTN_GATE=params.attn_gate,
        MV_BITS=params.mv_widen == "bits" and dtype == torch.bfloat16 and not fp8,
        W_FP8=fp8, HEAD_FP8=weight_format == "fp8-all",
        MV_MMA=params.mv_widen == "mma",
        MMA_EARLY=params.attn_layout == "mma" and params.attn_operands == "early", MV_AHEAD=params.mv_ahead == 1,
        NEW_ROW=params.attn_new_row == "row" and (params.attn_layout == "warps" or (
            params.attn_layout == "mma" and params.attn_operands == "late")),
        COMBINE_LANES=params.attn_combine == "lanes")


def gluon_choice(t: Tiling, cx: dict) -> dict:
    """The Gluon tiling chosen for a model, for ``compile_info()["gluon"]`` and results.json: ``BR`` (rows per
    QKV / gate-up / LM-head tile), ``BK`` (columns per box), ``ring`` (weight-ring slots), ``slot_boxes`` (boxes per
    slot), ``split_k`` (column
    boxes per O-proj / down slot), ``rows_od`` (rows per O-proj / down task), ``block_s`` (positions per
    attention block), ``min_chunk`` (fewest positions per split), ``splits`` (position splits per kv head),
    ``qk_norm_in_attn`` (q/k-norm and RoPE in the attention task), ``attn_layout`` (``blocks``, ``warps`` or
    ``mma``), ``lm_pick`` (``task`` or ``cta``: where the greedy pick's atomic runs), ``sig_gate`` (tiles the
    producer issues past a stage's signalling task before its signal is out; -1 off), ``attn_gate`` (the same past an
    attention task until it is done), ``mv_widen`` (``bits`` or ``convert``: how bf16 weights are widened;
    ``mma``: the tensor cores), ``attn_operands`` (``early`` or ``late``: where the tensor-core attention's operands
    are converted; ``late`` for the other layouts), ``mv_ahead`` (0 or 1: boxes the matvec reads into registers
    ahead of its products; 1 with ``mma``, which always reads a slot ahead),
    ``attn_new_row`` (``row`` or ``block``: what of a split's first block waits for the QKV stage; ``block`` for the
    ``blocks`` layout and where the ``early`` operands do it their own way), ``attn_combine`` (``warps`` or
    ``lanes``: the split combine's layout), ``inflight`` (ring slots a producer keeps requested and not landed; 0:
    the whole ring), ``norm_load`` (where a staged RMSNorm's weights are loaded), ``weight_eviction`` (the weight
    stream's L2 policy: ``""`` or ``evict_first``);
    ``t`` from :func:`gluon_tiling`, ``cx`` from :func:`gluon_constexprs`."""
    return {"BR": cx["BR"], "BK": cx["BK"], "ring": cx["NS"], "slot_boxes": cx["SB"], "split_k": cx["SPLIT"],
            "rows_od": t.rows_o,
            "block_s": cx["BLOCK_S"], "min_chunk": cx["MIN_CHUNK"], "splits": cx["NSPLIT"],
            "qk_norm_in_attn": bool(cx["QK_NORM"]),
            "attn_layout": "mma" if cx["ATTN_MMA"] else "warps" if cx["ATTN_WARPS"] else "blocks",
            "lm_pick": "cta" if cx["LM_CTA"] else "task", "sig_gate": cx["SIG_GATE"],
            "attn_gate": cx["ATTN_GATE"],
            "mv_widen": "mma" if cx["MV_MMA"] else "bits" if cx["MV_BITS"] else "convert",
            "attn_operands": "early" if cx["MMA_EARLY"] else "late",
            "mv_ahead": 1 if cx["MV_MMA"] else int(cx["MV_AHEAD"]),  # mv_mma always reads a slot ahead
            "attn_new_row": "row" if cx["NEW_ROW"] else "block",
            "attn_combine": "lanes" if cx["COMBINE_LANES"] else "warps", "inflight": cx["INFLIGHT"],
            "norm_load": ("after", "beside", "prefetch")[cx["NORM_W"]],
            "weight_eviction": "evict_first" if cx["TMA_EVICT"] else ""}


SMEM_SCRATCH = 8192  # shared memory the compiler adds for reductions and layout conversions (≈4.3 KB measured)


def ring_slot_bytes(cx: dict, esize: int) -> int:
    """Bytes of one weight-ring slot of the kernel built with constexprs ``cx`` (:func:`gluon_constexprs`) and
    ``esize``-byte weights: ``SB`` TMA boxes of ``BR`` rows × ``BK`` columns (the kernel's ``TILE_BYTES``)."""
    return cx["SB"] * cx["BR"] * cx["BK"] * esize


def fit_ring(wanted: int, slot_bytes: int, xs_bytes: int) -> int:
    """Ring slots that fit beside ``xs`` in one CTA's shared memory (at least 2: one loading, one in use)."""
    return max(2, min(wanted, (SMEM_PER_BLOCK_SM90 - xs_bytes - SMEM_SCRATCH) // slot_bytes))


def params_ring(params: MegakernelParams) -> int:
    """Ring slots: ``params.num_stages`` when set above 1 (the Triton kernel's pipelining knob, reused as the
    Gluon ring depth), else :data:`DEFAULT_RING`."""
    return params.num_stages if params.num_stages > 1 else DEFAULT_RING


def load_gluon_kernel():
    """Import the Gluon kernel module (compiled Triton only).

    Raises:
        EngineUnavailable: Triton is in interpreter mode in this process, or has no Gluon.
    """
    import triton
    if triton.knobs.runtime.interpret:
        raise EngineUnavailable("the Gluon megakernel cannot run under TRITON_INTERPRET=1")
    try:
        from . import kernel
    except ImportError as e:
        raise EngineUnavailable(f"this Triton has no Gluon ({e})") from None
    return kernel


def desc_layout(bits: int, mma: bool):
    """The weight ring's shared layout: unswizzled rows of ``BK`` columns, or with ``mma`` (``mv_widen=mma``) the
    128-byte swizzle ``ldmatrix`` reads without bank conflicts, on boxes of 128 bytes (:func:`mma_box_cols`)."""
    from triton.experimental.gluon import language as gl
    return gl.NVMMASharedLayout(swizzle_byte_width=128 if mma else 0, element_bitwidth=bits, rank=2)


def weight_descriptors(packed, br: int, bk: int, split: int = 1, mma: bool = False) -> dict:
    """One TMA descriptor per packed weight matrix, each viewed as 2-D (rows, K), box ``[br, bk]`` (O-proj and
    down: ``[br / split, bk]``), unswizzled; with ``mma`` boxes of 128 bytes (64 bf16 / 128 FP8 columns,
    :func:`mma_box_cols`), 128-byte swizzled (the producer issues ``bk`` / that many per box: :func:`desc_layout`).
    A 16-bit LM head beside FP8 layer weights gets boxes
    ``[br, bk / 2]``: the bytes of an FP8 box.

    Shapes (L layers): wqkv (L·(Q+2KV), H), wo (L·H, Q), wgu (L·2·I_pad, H), wdown (L·H, I), lm_head (V, H).
    """
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    cols = mma_box_cols(packed.wqkv.element_size()) if mma else bk

    def desc(t, rows=br, cols=cols):
        t2 = t.reshape(-1, t.shape[-1])
        return TensorDescriptor(t2, list(t2.shape), list(t2.stride()), [rows, cols],
                                desc_layout(t2.element_size() * 8, mma))
    head_cols = cols * packed.wqkv.element_size() // packed.lm_head.element_size()  # cols, or half beside FP8
    return {"wqkv_desc": desc(packed.wqkv), "wo_desc": desc(packed.wo, br // split), "wgu_desc": desc(packed.wgu),
            "wdown_desc": desc(packed.wdown, br // split), "head_desc": desc(packed.lm_head, br, head_cols)}


def make_launcher(kernel, args: dict, constexprs: dict, num_warps: int, fast: bool, cooperative: bool):
    """The shared :class:`..launcher.Launcher` for the Gluon kernel; ``args`` by element name (:func:`pack_args`
    groups them into the kernel's tuples)."""
    from ..launcher import Launcher
    from .ptx import tma_l2_evict_first, tma_l2_evict_first_missing
    evict = bool(constexprs["TMA_EVICT"])
    return Launcher(kernel, args, constexprs, dict(num_warps=num_warps, launch_cooperative_grid=cooperative), fast,
                    info={"max_registers": None, "num_stages": constexprs["NS"]}, pack=pack_args,
                    ptx_rewrite=tma_l2_evict_first if evict else None,
                    ptx_check=tma_l2_evict_first_missing if evict else None)


def compile_offline(cfg: ModelConfig, dtype: torch.dtype = torch.bfloat16, params: MegakernelParams | None = None,
                    max_seq_len: int = 2048, grid: int = 132, weight_format: str = "bf16") -> dict:
    """Compile the Gluon kernel for sm_90 on any machine (no GPU), with ``dtype`` activations and
    ``weight_format`` weights (``bf16``: the activation dtype; ``fp8`` / ``fp8-all``): registers, spills, shared memory, PTX size,
    ``text_bytes`` (its machine code, :func:`residency.cubin_text_bytes`), and its TMA loads (``tma_loads``) and
    those with an L2 cache policy (``tma_loads_l2_hinted``: all of them with ``weight_eviction="evict_first"``,
    through ``gluon/ptx.py``; the cubin is assembled from that PTX), and its e4m3 → f16 conversions
    (``fp8_converts``, PTX ``cvt.rn.f16x2.e4m3x2``: 0 without FP8 weights) and tensor-core instructions
    (``mma_sync``: the attention's, and every matvec's under ``mv_widen=mma``).

    Raises:
        EngineUnavailable: Triton is in interpreter mode in this process.
        triton.CompilationError / RuntimeError: it does not compile (the point of the check).
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    params = gluon_params(cfg, params or MegakernelParams(), grid, dtype, weight_format)
    kernel = load_gluon_kernel()
    t = gluon_tiling(cfg, params, grid, dtype, weight_format)
    cx = gluon_constexprs(cfg, t, params, max_seq_len, dtype, has_bias=cfg.attention_bias,
                          weight_format=weight_format)
    act = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    wty = "fp8e4nv" if cx["W_FP8"] else act  # the layer weights' type (the head's: fp8-all only)
    abits = torch.empty((), dtype=dtype).element_size() * 8
    layer_names = {"wqkv", "wo", "wgu", "wdown"}
    f32 = {"cos_ptr", "sin_ptr", "pm_ptr", "pl_ptr", "pacc_ptr", "logits_ptr"}
    i32 = {"table_ptr", "counts_ptr", "state_ptr", "counters_ptr", "done_ptr", "err_ptr"}
    i64 = {"timeline_ptr", "amax_ptr"}

    def arg_type(name):
        """(signature type, 16-byte aligned) of the runtime argument ``name``; ("constexpr", False) for an FP8
        row scale the kernel does not read (passed as None)."""
        if name.endswith("_desc"):
            rows = cx["BR"] // cx["SPLIT"] if name in ("wo_desc", "wdown_desc") else cx["BR"]
            cols = mma_box_cols(1 if cx["W_FP8"] else abits // 8) if cx["MV_MMA"] else cx["BK"]
            ty = wty if name[:-5] in layer_names or cx["HEAD_FP8"] else act
            if ty != wty:  # a 16-bit head among FP8 boxes: the same bytes per box
                cols //= 2
            bits = 8 if ty == "fp8e4nv" else abits
            return f"tensordesc<{ty}[{rows}, {cols}],{desc_layout(bits, bool(cx['MV_MMA']))!r}>", False
        if name[:-4] in SCALE_FIELDS:  # FP8 row scales
            on = cx["HEAD_FP8"] if name == "slm_ptr" else cx["W_FP8"]
            return ("*fp32", True) if on else ("constexpr", False)
        if name.endswith("_ptr"):
            w = name[:-4] in layer_names or (name == "head_ptr" and cx["HEAD_FP8"])
            return ("*fp32" if name in f32 else "*i32" if name in i32 else "*i64" if name in i64
                    else f"*{wty}" if w else f"*{act}"), True
        return ("fp32" if name in ("eps", "sm_scale") else "i32"), False

    sig, attrs, consts = {}, {}, dict(cx)
    for idx, name in enumerate(kernel.megakernel.arg_names):
        if name in cx:
            sig[name] = "constexpr"
            continue
        elems = ARG_TUPLES.get(name)
        paths = [((idx, j), n) for j, n in enumerate(elems)] if elems else [((idx,), name)]
        types = []
        for path, n in paths:
            ty, aligned = arg_type(n)
            types.append(ty)
            if aligned:
                attrs[path] = [["tt.divisibility", 16]]
            if ty == "constexpr":
                consts[path] = None
        sig[name] = tuple(types) if elems else types[0]
    src = GluonASTSource(kernel.megakernel, sig, consts, attrs)
    from ..launcher import rewriting
    from .ptx import tma_l2_evict_first
    with rewriting(tma_l2_evict_first) if cx["TMA_EVICT"] else contextlib.nullcontext():
        ck = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": params.num_warps, "launch_cooperative_grid": True})
    usage = ptxas_usage(ck.asm["ptx"], 90)
    return {**usage, "shared_bytes": int(ck.metadata.shared), "num_warps": int(ck.metadata.num_warps),
            "ring_bytes": cx["NS"] * ring_slot_bytes(cx, weight_bytes(dtype, weight_format)),
            "constexprs": {k: v for k, v in cx.items() if v is not None}, "ptx_lines": ck.asm["ptx"].count("\n"),
            "tma_loads": ck.asm["ptx"].count("cp.async.bulk.tensor."),
            "tma_loads_l2_hinted": ck.asm["ptx"].count(".L2::cache_hint ["),
            "fp8_converts": ck.asm["ptx"].count("cvt.rn.f16x2.e4m3x2"), "mma_sync": ck.asm["ptx"].count("mma.sync"),
            "text_bytes": cubin_text_bytes(ck.asm["cubin"])["megakernel"],
            "tiling": vars(t), "gluon": gluon_choice(t, cx), "smem_limit": SMEM_PER_BLOCK_SM90,
            "grid_hint": math.ceil(grid)}
