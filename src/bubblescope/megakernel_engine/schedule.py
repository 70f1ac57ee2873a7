"""Host scheduler: the task graph of one decode step, lowered to the megakernel's instruction table.

One decode step is a list of *tasks* in a global topological order (``gidx``). Per layer, in order:

==============  ==========================================================  ==========================
opcode          one task computes                                           tasks per layer
==============  ==========================================================  ==========================
``QKV``         RMSNorm(x) + a tile of r/2 row pairs of the fused QKV        ceil((Q + 2·KV) / r)
                matvec (+ bias, q/k norm, RoPE), written to the q buffer /   (r = ``rows_qkv``)
                the KV cache (``qk_norm_in_attn``: raw q and k, and the
                ATTN task norms and rotates them)
``ATTN``        flash-decoding partials (m, l, acc) of the query heads of    kv-head groups × splits
                some KV heads over one split of the positions; with the
                fused reduction (default) the last split task to finish
                for its heads also does ATTN_REDUCE
``ATTN_REDUCE`` log-sum-exp combination of the splits → attention output     kv-head groups (only with
                                                                             ``attn_reduce="stage"``)
``OPROJ``       a tile of O-proj rows + residual add into x                  ceil(H/r)
``GATEUP``      RMSNorm(x) + r/2 gate rows and the matching up rows,         ceil(2·I/r)
                SiLU(gate)·up
``DOWN``        a tile of down-proj rows + residual add into x               ceil(H/r)
==============  ==========================================================  ==========================

then ``LMHEAD`` tasks (final RMSNorm + LM-head rows → float32 logits; each task folds its best (value, row)
into one 64-bit ``atomic_max`` key, so the greedy token is known on the device when the step ends).

A GATEUP or LMHEAD task may cover several register tiles (``gateup_blocks`` / ``lm_blocks``): it loops over
them, so the instruction fetch, the dependency check, the prefetch issue and the RMSNorm of x are paid once
per task instead of once per tile.
There is no embedding task: layer 0's QKV and OPROJ tasks read the token's embedding row where later
layers read x, which saves a stage barrier (a whole-grid wait) per step for one H-element row read.

Dependencies are global int32 counters that only increase. A task names the counter it waits on, how
many increments of the current step it needs, and the counter it increments when done; the kernel waits
for ``epoch × increments_per_step[counter] + need``, so no reset launch is needed between steps. Here
there is one counter per (layer, stage) and every task needs the whole previous stage (its inputs are
whole vectors: a norm over all of x, attention over all heads' q/k/v); a finer scheme (e.g. one counter
per KV head between QKV and ATTN) is only a change of :func:`build_tasks`.

Fused attention reduction: ATTN tasks of one kv-head group take a *ticket* (an atomic increment of the
group's ticket counter, acq_rel) after writing their partials; the task that draws the step's last ticket
combines the splits, rewinds the ticket counter to 0 for the next step and signals the (layer, ATTN_REDUCE)
counter once. That removes a whole-grid stage per layer. The split count is fixed in the table, but the
positions per split are ``max(ceil(n / splits), attn_min_chunk)`` at run time, so short contexts use only
the first ``ceil(n / chunk)`` splits; the other ATTN tasks are skipped outright (no wait, no ticket), and
long contexts use them all.

Lowering: task ``gidx`` goes to program ``gidx % num_programs`` (round robin continuing across stages,
so the programs that got an extra tile in one stage come last in the next). Every program's queue is a
subsequence of the global topological order, hence when all programs are resident the earliest unfinished
task always has its inputs done and its program at it: no deadlock. With one program the queue is the
whole topological order and never waits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

import torch

from ..errors import BubblescopeError
from ..models.config import ModelConfig

# ---- opcodes (0 is an empty table slot) -------------------------------------------------------------
OP_NOP, OP_QKV, OP_ATTN, OP_ATTN_REDUCE, OP_OPROJ, OP_GATEUP, OP_DOWN, OP_LMHEAD = range(8)
OPCODE_NAMES = {OP_NOP: "NOP", OP_QKV: "QKV", OP_ATTN: "ATTN", OP_ATTN_REDUCE: "ATTN_REDUCE", OP_OPROJ: "OPROJ",
                OP_GATEUP: "GATEUP", OP_DOWN: "DOWN", OP_LMHEAD: "LMHEAD"}
OPCODES = {v: k for k, v in OPCODE_NAMES.items()}
LAYER_STAGES = (OP_QKV, OP_ATTN, OP_ATTN_REDUCE, OP_OPROJ, OP_GATEUP, OP_DOWN)

# ---- instruction fields (int32 each) ------------------------------------------------------------------
# A0..A2 by opcode: QKV (-, first row pair, pairs);
# ATTN (first kv head, kv heads, split); ATTN_REDUCE (first kv head, kv heads, -); OPROJ / GATEUP / DOWN /
# LMHEAD (-, first row (GATEUP: first gate/up pair), rows).
# F_SIGINC: how much the task adds to its signal counter (0: it does not signal, see lower()).
# F_TICKET: the ticket counter of a fused-reduction ATTN task (-1 otherwise).
# F_PFNEXT: 1 when the task also L2-prefetches the next task of its queue before waiting.
(F_OP, F_LAYER, F_TILE, F_A0, F_A1, F_A2, F_WAIT, F_NEED, F_INC, F_SIGNAL, F_GIDX, F_SIGINC, F_TICKET,
 F_PFNEXT) = range(14)
NFIELDS = 14
KV_SPLITS_CAP = 64  # automatic kv_splits: clamp(grid // kv-head groups, 1, this)
DEFAULT_MIN_CHUNK = 32  # fewest positions per attention split where attn_min_chunk is None, both kernels (Gluon on
# the H200: 32 0.904 ms against 16 0.926 on Llama-3.2-1B, benchmarks/results/h200-2026-12-01/sweep_f_128.json)


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    return 1 << max(0, int(n) - 1).bit_length()


MAX_BLOCK = 1 << 20  # triton's TRITON_MAX_TENSOR_NUMEL: the most elements of one block


@dataclass(frozen=True)
class MegakernelParams:
    """Tuning parameters of the megakernel. ``None`` means "choose automatically".

    Attributes:
        programs_per_sm: requested resident programs per SM (the grid is SMs × this, lowered to what the
            compiled kernel's registers/shared memory allow: residency is a correctness condition).
        num_programs: force the grid size (tests; on CPU the engine always uses 1).
        rows_qkv: rows per QKV task (even: a task takes rows/2 row pairs (i, i + head_dim/2) of the stacked
            q|k|v heads, see packing.py; with q/k-norm a multiple of head_dim). rows_o, rows_down: rows of x per OPROJ /
            DOWN task. rows_gateup: rows of the packed gate|up matrix per GATEUP task (even: rows/2 gate
            rows and the matching up rows). rows_lm: vocabulary rows per LMHEAD task. Auto: :func:`pick_rows`.
        max_rows: cap for the automatic row choice.
        block_k: columns per inner-loop chunk of every matvec (power of two).
        num_warps: warps per program.
        max_registers: per-thread register cap passed to the compiler (PTX ``.maxnreg``); auto: what lets
            ``programs_per_sm`` programs be resident, ``regs_per_sm // (programs_per_sm · num_warps · 32)``
            rounded down to a multiple of 8 (128 on sm_90 for 4 programs of 4 warps). Without it, a compiler
            that chooses a few more registers silently costs a resident program per SM.
        num_stages: Triton software-pipelining stages of the inner loops (1: none; more stages buffer loads
            in shared memory, which lowers residency — and did not help in the H200 probe).
        gateup_blocks, lm_blocks: register tiles (of ``rows_gateup`` / ``rows_lm`` rows) per GATEUP / LMHEAD
            task; the task loops over them.
        kv_splits: position splits per KV head in ATTN (auto: ``clamp(grid // kv_heads, 1, KV_SPLITS_CAP)``).
        attn_min_chunk: fewest positions per split at run time (``max(ceil(n / splits), this)``), so short
            contexts leave most splits empty; None: :data:`DEFAULT_MIN_CHUNK` (32).
        attn_reduce: ``fused`` (the last ATTN task of a kv-head group combines the splits) or ``stage`` (a
            separate ATTN_REDUCE stage).
        attn_kv_heads: KV heads per ATTN / ATTN_REDUCE task (their G query heads each).
        block_s: positions per attention inner-loop chunk (power of two); None: the kernel's own choice (Triton
            kernel: ``triton_kernel.host.DEFAULT_BLOCK_S``, 32; Gluon kernel: ``gluon.host.gluon_params``' rule).
        prefetch: ``auto`` (bulk on sm_90+ when rows are 16-byte multiples, else line), ``bulk``
            (``cp.async.bulk.prefetch.L2``), ``line`` (``prefetch.global.L2`` per 128-byte line) or ``off``.
        prefetch_ahead: 0 — each task prefetches its own weights just before waiting on its dependency;
            1 — each task prefetches the NEXT task's weights when it starts, so they stream into L2 during
            this task's wait and compute (program 0..P-1 prefetch their first task at kernel start).
        prefetch_next: comma-separated opcode names (e.g. ``"OPROJ,ATTN"``) whose tasks, with
            ``prefetch_ahead=0``, also prefetch the next task of their queue before waiting: the attention
            chain leaves HBM idle, and the GATEUP weights can stream into L2 meanwhile.
        weight_eviction: L2 eviction hint of the weight loads: ``auto`` (the default: ``evict_first`` on the Gluon
            kernel under Triton 3.6, whose PTX form the rewrite below knows; none on the Triton kernel), ``""``
            (none), ``"evict_first"`` (each weight line is read once per step, so it may leave L2 first) or
            ``"evict_last"`` (the Triton kernel's only; the Gluon kernel refuses it by name). The Triton kernel:
            even either way (``benchmarks/results/h200-2026-11-29-b/megakernel_check_d.json``). On the Gluon kernel
            ``evict_first`` gives the weight stream's TMA loads that L2 policy, so the stream should stop evicting what
            is read again (the KV cache, the activations, the RMSNorm weights; not measured directly). Gluon 3.6's TMA
            load takes no policy, so the kernel's PTX is rewritten (``gluon/ptx.py``). Measured on the H200
            (``benchmarks/results/h200-2026-12-02-s15/gluon_check_r44_*.json``, interleaved rounds, stepwise ms, none /
            ``evict_first``): Llama-3.2-1B 0.907, 0.906 / 0.898, 0.878; at context 4096 0.998, 1.030 / 0.979, 1.007;
            Llama-3.1-8B 3.873, 3.917 / 3.828, 3.887; Qwen2.5-0.5B 0.651, 0.653 / 0.648, 0.650; Qwen3-0.6B 0.755, 0.787
            / 0.758, 0.773. The 1B's frames (one capture each): a layer 37.6 → 36.8 µs, gate-up and down 24.5 → 24.0,
            the QKV → O-proj stretch 12.9 → 13.0. (``benchmarks/l2_probe.py``, ``h200-2026-12-02-s14/l2_probe_v3.json``,
            one CTA per SM: 17 MB of lines read by loads survived 34 MB of later traffic read ``evict_first``; half to
            most of them did not survive it read without the hint.)
        spin_sleep_ns: ``nanosleep`` between spins on a counter (0: busy spin).
        split_k: Gluon kernel only: column halves per ring slot of an O-proj / down tile. 2: a slot holds two
            ``[BR/2, BK]`` boxes (columns 2c and 2c+1) of BR/2 rows, so those stages have twice as many tasks
            (Llama-3.2-1B: 128 down-proj tasks for 132 SMs instead of 64); 1: one ``[BR, BK]`` box.
        l2_ahead: Gluon kernel only: when the producer issues ring tile t, it also asks L2 for tile
            t + l2_ahead (``cp.async.bulk.prefetch.L2``), so during a long dependency wait more than the ring's
            worth of weights is on its way (0: off).
        wait_prefetch: Gluon kernel only: tiles a consumer asks L2 for (``cp.async.bulk.prefetch.L2``) past the
            ring's horizon when it starts a dependency wait of a task whose opcode is in ``wait_prefetch_ops``, so
            HBM keeps streaming after the ring is full during a long wait (0: off).
        wait_prefetch_ops: comma-separated opcode names whose dependency waits issue ``wait_prefetch``
            (default ``OPROJ``: the wait on the attention chain, the longest of a layer).
        wait_prefetch_mode: ``bulk`` (``cp.async.bulk.prefetch.L2`` per tile row, through the SM's TMA unit:
            measured slower, the prefetches queue beside the ring's loads) or ``line``
            (``prefetch.global.L2`` per 128-byte line from the consumer threads). Both lose, and ``l2_ahead``
            too (``h200-2026-12-01/sweep_h_128.json``, ``h200-2026-12-01-s4/gluon_check_r9.json``,
            ``h200-2026-12-02-s12/gluon_check_r34_*.json``). Why, measured on the H200 (``benchmarks/l2_probe.py``,
            ``h200-2026-12-02-s14/l2_probe*.json``, one CTA per SM): L2 keeps prefetched lines only up to ~64 KB per SM;
            at 128 KB per SM none of the per-line prefetches hit and about half of the bulk ones did, while lines read
            by loads stayed.
        inflight: Gluon kernel only: ring slots the producer keeps requested and not yet landed (None, the
            default: ``max(2, gluon.host.INFLIGHT_BYTES // slot bytes)``, 64 KB per SM: 4 slots of one 16 KB bf16
            box, 2 of two; 0: no cap, the whole ring; a value at or above the ring's slots is no cap either, e.g.
            stories260K's 32 small slots). The ring's other slots still fill
            while the consumers wait, so the buffer for a dependency wait stays the ring; the cap was to shorten the
            HBM queue (Little's law: ~25 MB in flight over all SMs at ~4 TB/s is ~6 µs for any load) that each
            layer's chain tiles wait behind: the QKV matvec ends 3.9 µs after its last tile's request
            (``chain_breakdown.py --model``). Measured on the H200 (``h200-2026-12-02-s13/gluon_check_r41_*.json``,
            interleaved rounds, stepwise ms): Llama-3.2-1B 0.790 / 0.791 at 4 against 0.800 / 0.803 (3: 0.799 /
            0.799, 6: 0.801 / 0.801), Llama-3.1-8B 3.863 / 3.871 against 3.882 / 3.894, Qwen2.5-0.5B even; the 1B's
            QKV matvec then ends 3.2 µs after its last request, so that latency is mostly the SM's own share of the
            stream. Again with the weight stream read evict_first (``h200-2026-12-02-s15/gluon_check_r45_*.json``):
            Llama-3.2-1B 0.766 / 0.764 at 4 against 0.778 / 0.782 (6: 0.768 / 0.770), Llama-3.1-8B 3.738 / 3.746 against
            3.765 / 3.762, Qwen2.5-0.5B (6 slots of 32 KB) even at 4 (0.646 / 0.655 against 0.647 / 0.648; at 2 slots:
            0.654 / 0.655 against 0.657 / 0.660, within its noise). So the default caps the bytes in flight, 64 KB per
            SM: 1-2 % on the 1B at context 128, ~0.5 % on the 8B. Checked on more models
            (``h200-2026-12-02-s16/gluon_check_r46_*.json``, stepwise ms, cap / none): Qwen3-0.6B 0.722, 0.721 / 0.727,
            0.722; Llama-3.2-3B 1.845, 1.831 / 1.848, 1.867: even to slightly faster (Qwen3-1.7B and the 1B at 4096 not
            measured with it). (The L2 prefetches past the ring all lost: ``l2_ahead``, ``wait_prefetch``, and a
            producer burst at the first gate-up tile, ``h200-2026-12-02-s13/gluon_check_r40_*.json``.)
        norm_load: Gluon kernel only: when the consumer loads the RMSNorm weights of a vector it stages (QKV,
            gate-up, LM head): ``after`` the sum of squares (its cross-warp reduction's barriers
            keep the load from being issued earlier, so the weights are a second round trip after the dependency
            wait), ``beside`` the vector's load, or ``beside`` and asked of L2 (``prefetch.global.L2``, one line per
            thread) before the dependency wait (``prefetch``); the same arithmetic each way. Measured on the H200
            (``h200-2026-12-02-s13/chain_nl*_4b1a19a.json``, one step's frames, medians over layers): the 1B's gate-up
            staging 2.13 → 1.60 µs and QKV staging 0.98 → 0.83 with ``prefetch``; Qwen2.5-0.5B's 1.06 → 0.51 and 0.75 →
            0.51, Qwen3-0.6B's 0.77 → 0.61 and 0.90 → 0.64 with ``beside``; the step even within the sweep's noise
            (``gluon_check_r42_*``: 1B 0.830 / 0.828 with ``prefetch`` against 0.831 / 0.835, Llama-3.1-8B even). The
            default (``h200-2026-12-02-s14/gluon_check_r42_*.json``, stepwise ms, ``after`` / ``beside`` /
            ``prefetch``): Llama-3.2-1B 0.910, 0.905 / 0.891, 0.893 / 0.883, 0.883; Qwen2.5-0.5B 0.722, 0.733 / 0.712,
            0.721 / 0.717, 0.712; Qwen3-0.6B 0.755, 0.758 / 0.752, 0.752 / 0.743, 0.744.
        lm_pick: Gluon kernel only: where the on-device greedy pick's ``atomic_max`` runs: ``task`` (one per
            LM-head task: 4,008 per step on Llama-3.2-1B, 9,496 on Qwen2.5-0.5B, all on one address) or ``cta``
            (each CTA keeps its best key over its LM-head tasks and issues one: 132; the default). The same pick
            either way; measured on the H200 (``h200-2026-12-01-s6/gluon_check_r15.json``, interleaved rounds,
            Llama-3.2-1B): 0.945 / 0.934 ms against 0.956 / 0.964 per task, LM-head span 123.6 against 129.2 µs.
        attn_layout: Gluon kernel only: ``blocks`` (a block's positions across all warps, reduced through shared
            memory), ``warps`` (each warp owns a slice of every block and keeps its own online softmax; one
            cross-warp combine per task; no q/k-norm), ``mma`` (q·Kᵀ and P·V on the tensor cores, ``mma.sync``;
            16-bit weights, ≤ 16 query heads per kv head) or ``auto`` (``mma`` where it fits; else ``warps`` where
            the model has no q/k-norm and at most 4 query heads per kv head, else ``blocks``; measured in
            ``gluon.host.resolve_attn_layout``).
        sig_gate: Gluon kernel only: after the tiles of a task that signals (a stage's last task on the CTA), the
            producer issues at most ``sig_gate`` more tiles until the consumer has signalled, so the signal's
            release does not queue behind this SM's weight loads in flight (-1: off). Measured on the H200
            (``h200-2026-12-01-s6/gluon_check_r17*.json``, interleaved rounds): Llama-3.2-1B 0.952 / 0.957 ms at 2 and
            0.945 at 4 against 0.979 / 0.982 off, 0.997 / 0.995 at 0; Qwen3-0.6B 0.862 / 0.858 at 2 against 0.873 /
            0.875 off. The signalling tasks' epilogues: QKV 1.54 → 0.83 µs, O-proj 1.50 → 0.61, down 2.24 → 0.48. 3 is
            the default (``h200-2026-12-01-s7/gluon_check_r21_*.json``): Llama-3.2-1B 0.935 against 0.950 / 0.960 at 2,
            Qwen3-0.6B 0.812 against 0.821 / 0.823, Qwen2.5-0.5B 0.849 against 0.852 / 0.850, Llama-3.1-8B 4.066 against
            4.082 / 4.113 (``gluon_check_r18*``, ``gluon_check_r19*`` and ``gluon_check_r20*`` gave the 1B the same
            order).
        attn_gate: Gluon kernel only: after a (non-empty) attention task in the CTA's queue, the producer issues at
            most ``attn_gate`` more tiles until the consumer has finished that attention task, so the attention's
            loads and stores do not queue behind this SM's weight loads in flight (-1: off; None: 0 on every model;
            see ``gluon.host.resolve_attn_gate``).
        mv_widen: Gluon kernel only: how the matvec widens a weight to float32: ``convert`` (Triton's
            conversion; FP8 weights' only CUDA-core form) or ``bits`` (bf16 weights) (a bf16 pair read as one int32, split by a shift and a mask: one instruction
            per weight); ``auto`` (the default): ``mma`` for thin models and FP8 weights, else ``bits``
            (``gluon.host.auto_matvec``, which gives the measurements). Measured on the H200 (``h200-2026-12-01-s7/gluon_check_r19.json``,
            interleaved rounds, Llama-3.2-1B): 0.883 / 0.884 ms against 0.894 / 0.894 with ``convert``. ``mma`` (16-bit
            weights): the tensor cores, ``mma.sync`` m16n8k16 with the weight tile as the A operand (``ldmatrix`` from a
            128-byte-swizzled ring: each box arrives as ``BK / 64`` TMA boxes of 64 columns, which the warps share out)
            and the staged vector broadcast over the 8 columns of B, float32 accumulators summed across the warps once
            per task; far fewer instructions per weight than a widening and an FMA each (``gluon.matvec.mv_mma``; it
            always reads a slot ahead, whatever ``mv_ahead``). FP8 weights take it under ``auto`` on every model
            (measured in ``gluon.host.auto_matvec``): each 128-column box widened to f16 in registers (exact), the
            staged vector rounded to f16. Needs 16-bit or FP8 weights, full-width
            boxes (256 columns), at least 16 rows per matvec and a 128-byte box per consumer warp in each slot
            (refused by name otherwise: ``gluon.host.mv_mma_unsupported``). Measured on the H200 (``h200-2026-12-02-s12/gluon_check_r36*`` to
            ``gluon_check_r38*``, interleaved rounds, stepwise ms): correct (the 1B's 256 argmaxes equal the bf16
            reference's), but even on Llama-3.2-1B (0.810 / 0.815 against 0.808 / 0.812), Qwen3-0.6B and Llama-3.1-8B: a
            task's matvec waits for its tiles, not for its FMAs; Qwen2.5-0.5B at 32 rows 0.747 / 0.758 against 0.761 /
            0.766 (the default's 16 rows), with ``slot_boxes=2`` 0.713 / 0.724: the automatic choice for thin models.
        attn_operands: Gluon kernel, ``attn_layout=mma`` only: ``early`` (the first K/V block becomes the
            tensor cores' B operands before the attention task's dependency wait, the row written in this step
            patched in after it by a load in the operand layout, and q loaded straight into the A operand layout:
            no shared-memory conversion between the wait and the first ``mma``) or ``late`` (q and the first block
            converted after the wait; the default). Measured on the H200
            (``h200-2026-12-01-s9/gluon_check_r25_*.json``, interleaved rounds, stepwise ms): Llama-3.2-1B 0.896 / 0.894
            / 0.896 against 0.881 / 0.880 / 0.888 at context 128, 1.032 / 1.017 / 1.030 against 1.039 / 1.051 / 1.045 at
            4096; Qwen2.5-0.5B, Qwen3-0.6B and Llama-3.1-8B even or worse at 128.
        mv_ahead: Gluon kernel only: weight boxes the consumer's matvec reads into registers ahead of their products:
            0 (read a slot, release it, multiply: the release's proxy fence waits for the reads, so each slot pays
            its shared-memory latency before its products) or 1 (box b + 1 read before box b's products, after
            box b's slot is released when b is its last box: the reads are in flight during the FMAs; one more box
            of registers; the default). Measured on the H200 (``h200-2026-12-02-s10/gluon_check_r30_*.json`` and
            ``gluon_check_r31_*``, interleaved rounds, stepwise ms): Qwen3-0.6B 0.779 / 0.784 / 0.782 against 0.797 /
            0.797 / 0.800 (``gluon_check_r31_*``: 0.895 / 0.897 against 0.909 / 0.914), Qwen2.5-0.5B 0.756 / 0.766 /
            0.761 against 0.779 / 0.798 / 0.779, Llama-3.1-8B 3.919 / 3.926 / 3.921 against 3.929 / 3.946 / 3.949,
            Llama-3.2-1B even (0.857 / 0.857 / 0.856 against 0.856 / 0.858 / 0.857); the 1B's QKV matvec 1.89 → 1.79 µs.
        slot_boxes: Gluon kernel only: TMA boxes per weight-ring slot, 1 or 2. With 2 a slot holds two consecutive
            column chunks of a task (32 KB of bf16) and the ring has half as many slots (the same bytes in flight),
            so the consumer's release of a slot (a proxy fence and two barriers of its warps, Triton 3.6) is paid
            once per two boxes. Measured on the H200 (``h200-2026-12-02-s10/gluon_check_r31_*.json``): the 1B's QKV
            matvec 1.89 → 1.70 µs with ``mv_ahead``, but its staging 0.99 → 1.41 and the hop to attention 0.5 →
            1.4; the step even or slower (1B 0.827 / 0.839 against 0.828 / 0.830; Qwen3-0.6B 0.918 / 0.917 against
            0.909 / 0.914; with ``mv_ahead`` 0.848 / 0.847 and 0.932 / 0.929), so 1 stays the default on the
            CUDA cores. None (the default): 2 under ``mv_widen=mma``, else 1 (``gluon.host.auto_matvec``).
        attn_new_row: Gluon kernel, ``attn_layout`` ``mma`` (``late`` operands) and ``warps``: what of a split's first
            K/V block waits for the QKV stage when the block holds the new position: ``block`` (the whole block is
            loaded after the wait), ``row`` (its older rows are loaded before the wait, row ``pos`` after it and
            patched in: one row's L2 round trip beside q's, in place of the older rows from HBM) or ``auto`` (the
            default: ``row``, except ``block`` for models with q/k-norm; ``gluon.host.resolve_attn_split``, which
            gives the measurements).
        attn_combine: Gluon kernel: the layout of the last ticket holder's split combine, ``warps`` (the attention
            layout's own, its warps along the split axis: the max and the two sums over splits go through shared
            memory with barriers), ``lanes`` (the splits in one warp's lanes, the query heads across the warps:
            shuffles only) or ``auto`` (the default: ``lanes``, except ``warps`` for models with q/k-norm; see
            ``gluon.host.resolve_attn_split``).
        timeline: record per-task timestamps (compile-time switch, zero cost when off).
        spin_cap: spins before a task is declared stuck (auto: 2**22 on GPU, 1000 under the interpreter).
        fast_launch: after the first launch, call the compiled kernel directly (skips Triton's per-launch
            argument binding, ~tens of µs of host time per launch).
        cooperative: launch with ``CU_LAUNCH_ATTRIBUTE_COOPERATIVE`` (Triton's ``launch_cooperative_grid``):
            the driver then refuses a grid whose programs cannot all be resident, instead of letting it
            deadlock — a second check behind the engine's own residency computation.
    """

    programs_per_sm: int = 4
    num_programs: int | None = None
    rows_qkv: int | None = None
    rows_o: int | None = None
    rows_gateup: int | None = None
    rows_down: int | None = None
    rows_lm: int | None = None
    max_rows: int = 8
    gateup_blocks: int = 1
    lm_blocks: int = 1
    block_k: int = 1024
    num_warps: int = 4
    max_registers: int | None = None
    num_stages: int = 1
    kv_splits: int | None = None
    attn_kv_heads: int = 1
    attn_min_chunk: int | None = None
    attn_reduce: str = "fused"
    block_s: int | None = None
    prefetch: str = "auto"
    prefetch_ahead: int = 0
    prefetch_next: str = ""
    weight_eviction: str = "auto"
    spin_sleep_ns: int = 0
    split_k: int = 2
    l2_ahead: int = 0
    wait_prefetch: int = 0
    wait_prefetch_ops: str = "OPROJ"
    wait_prefetch_mode: str = "bulk"
    inflight: int | None = None
    norm_load: str = "prefetch"
    qk_norm_in_attn: bool = False
    lm_pick: str = "cta"
    attn_layout: str = "auto"
    sig_gate: int = 3
    attn_gate: int | None = None
    mv_widen: str = "auto"
    attn_operands: str = "late"
    mv_ahead: int = 1
    slot_boxes: int | None = None
    attn_new_row: str = "auto"
    attn_combine: str = "auto"
    timeline: bool = False
    spin_cap: int | None = None
    fast_launch: bool = True
    cooperative: bool = True

    def replace(self, **changes) -> "MegakernelParams":
        return replace(self, **changes)

    def validate(self) -> None:
        """Raises BubblescopeError naming the first bad field."""
        def pow2(name):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1 or v & (v - 1):
                raise BubblescopeError(f"megakernel params: {name} must be a power of two, got {v!r}")
        for name in ("block_k", "num_warps") + (() if self.block_s is None else ("block_s",)):  # None: auto
            pow2(name)
        for name in ("block_k", "block_s"):  # a block of the kernel's tensors: Triton compiles up to 2**20 elements
            v = getattr(self, name)
            if v is not None and v > MAX_BLOCK:
                raise BubblescopeError(f"megakernel params: {name} must be at most 2**20 = {MAX_BLOCK} (Triton's "
                                       f"largest block), got {v!r}")
        for f in fields(self):  # every integer reaches the kernel or its schedule as a 32-bit integer
            v = getattr(self, f.name)
            if isinstance(v, int) and not isinstance(v, bool) and not -(1 << 31) <= v < 1 << 31:
                raise BubblescopeError(f"megakernel params: {f.name} must fit in 32 bits (below 2**31), got {v!r}")
        for name in ("programs_per_sm", "num_programs", "num_stages", "rows_qkv", "rows_o", "rows_gateup",
                     "rows_down", "rows_lm", "max_rows", "kv_splits", "attn_kv_heads", "spin_cap", "gateup_blocks",
                     "lm_blocks", "attn_min_chunk", "max_registers"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise BubblescopeError(f"megakernel params: {name} must be a positive integer, got {v!r}")
        if self.prefetch_ahead not in (0, 1):
            raise BubblescopeError(f"megakernel params: prefetch_ahead must be 0 or 1, got {self.prefetch_ahead!r}")
        for name in ("rows_qkv", "rows_gateup"):
            v = getattr(self, name)
            if v is not None and v % 2:
                raise BubblescopeError(f"megakernel params: {name} must be even (row pairs), got {v}")
        if self.prefetch not in ("auto", "bulk", "line", "off"):
            raise BubblescopeError(f"megakernel params: prefetch must be auto, bulk, line or off, "
                                   f"got {self.prefetch!r}")
        if self.weight_eviction not in ("auto", "", "evict_first", "evict_last"):
            raise BubblescopeError(f"megakernel params: weight_eviction must be auto, '', evict_first or evict_last, "
                                   f"got {self.weight_eviction!r}")
        if self.attn_reduce not in ("fused", "stage"):
            raise BubblescopeError(f"megakernel params: attn_reduce must be fused or stage, got {self.attn_reduce!r}")
        bad = [n for n in self.prefetch_next_ops_names() if n not in OPCODES or n == "NOP"]
        if bad:
            raise BubblescopeError(f"megakernel params: prefetch_next names unknown opcode(s) {', '.join(bad)}; "
                                   f"use {', '.join(n for n in OPCODES if n != 'NOP')}")
        if not isinstance(self.l2_ahead, int) or self.l2_ahead < 0:
            raise BubblescopeError(f"megakernel params: l2_ahead must be an integer >= 0, got {self.l2_ahead!r}")
        if self.norm_load not in ("after", "beside", "prefetch"):
            raise BubblescopeError(f"megakernel params: norm_load must be after, beside or prefetch, "
                                   f"got {self.norm_load!r}")
        if self.inflight is not None and (not isinstance(self.inflight, int) or isinstance(self.inflight, bool)
                                          or self.inflight < 0):
            raise BubblescopeError(f"megakernel params: inflight must be None or an integer >= 0, "
                                   f"got {self.inflight!r}")
        if not isinstance(self.wait_prefetch, int) or isinstance(self.wait_prefetch, bool) or self.wait_prefetch < 0:
            raise BubblescopeError(f"megakernel params: wait_prefetch must be an integer >= 0, got {self.wait_prefetch!r}")
        bad = [n for n in self.wait_prefetch_ops_names() if n not in OPCODES or n in ("NOP", "ATTN", "ATTN_REDUCE")]
        if bad:
            raise BubblescopeError(f"megakernel params: wait_prefetch_ops names {', '.join(bad)}; use some of "
                                   f"QKV, OPROJ, GATEUP, DOWN, LMHEAD")
        if self.wait_prefetch_mode not in ("bulk", "line"):
            raise BubblescopeError(f"megakernel params: wait_prefetch_mode must be bulk or line, "
                                   f"got {self.wait_prefetch_mode!r}")
        if self.attn_layout not in ("auto", "blocks", "warps", "mma"):
            raise BubblescopeError(f"megakernel params: attn_layout must be auto, blocks, warps or mma, "
                                   f"got {self.attn_layout!r}")
        if self.lm_pick not in ("task", "cta"):
            raise BubblescopeError(f"megakernel params: lm_pick must be task or cta, got {self.lm_pick!r}")
        gates = {"sig_gate": self.sig_gate} | ({} if self.attn_gate is None else {"attn_gate": self.attn_gate})
        for name, v in gates.items():  # attn_gate None: auto
            if not isinstance(v, int) or isinstance(v, bool) or v < -1:
                raise BubblescopeError(f"megakernel params: {name} must be an integer >= -1, got {v!r}")
        if self.mv_widen not in ("auto", "convert", "bits", "mma"):
            raise BubblescopeError(f"megakernel params: mv_widen must be auto, convert, bits or mma, "
                                   f"got {self.mv_widen!r}")
        if self.attn_operands not in ("early", "late"):
            raise BubblescopeError(f"megakernel params: attn_operands must be early or late, "
                                   f"got {self.attn_operands!r}")
        if self.mv_ahead not in (0, 1) or isinstance(self.mv_ahead, bool):
            raise BubblescopeError(f"megakernel params: mv_ahead must be 0 or 1, got {self.mv_ahead!r}")
        if self.slot_boxes is not None and (self.slot_boxes not in (1, 2) or isinstance(self.slot_boxes, bool)):
            raise BubblescopeError(f"megakernel params: slot_boxes must be 1 or 2 (or None: auto), "
                                   f"got {self.slot_boxes!r}")
        if self.attn_new_row not in ("auto", "block", "row"):
            raise BubblescopeError(f"megakernel params: attn_new_row must be auto, block or row, "
                                   f"got {self.attn_new_row!r}")
        if self.attn_combine not in ("auto", "warps", "lanes"):
            raise BubblescopeError(f"megakernel params: attn_combine must be auto, warps or lanes, "
                                   f"got {self.attn_combine!r}")
        if self.split_k not in (1, 2):
            raise BubblescopeError(f"megakernel params: split_k must be 1 or 2, got {self.split_k!r}")
        if self.spin_sleep_ns < 0:
            raise BubblescopeError("megakernel params: spin_sleep_ns must be >= 0")


    def prefetch_next_ops_names(self) -> list[str]:
        return [n.strip().upper() for n in str(self.prefetch_next).split(",") if n.strip()]

    def wait_prefetch_ops_names(self) -> list[str]:
        return [n.strip().upper() for n in str(self.wait_prefetch_ops).split(",") if n.strip()]

    def wait_prefetch_mask(self) -> int:
        """Bit ``op`` set for each opcode of ``wait_prefetch_ops`` (the Gluon kernel's WAIT_PF_OPS)."""
        return sum(1 << OPCODES[n] for n in set(self.wait_prefetch_ops_names()))


def pick_rows(n_rows: int, grid: int, max_rows: int, multiple: int = 1, task_overhead_rows: float = 1.0) -> int:
    """Rows per task for a stage of ``n_rows`` rows spread over ``grid`` programs.

    Minimises the busiest program's cost, ``ceil(ceil(n_rows / r) / grid) · (r + task_overhead_rows)``
    (a task also costs its instruction, its wait and its share of the norm re-read: about one row), over
    ``r`` in ``multiple, 2·multiple, …`` up to ``max(max_rows, multiple)``; ties go to the larger r.
    Example: 3072 QKV rows on 528 programs, cap 8: r = 6 gives 512 tiles, one per program (cost 7),
    where r = 4 gives 768 tiles, two on some programs (cost 10).
    """
    best, best_cost = multiple, None
    for r in range(multiple, max(max_rows, multiple) + 1, multiple):
        tiles = -(-n_rows // r)
        cost = -(-tiles // grid) * (r + task_overhead_rows)
        if best_cost is None or cost <= best_cost:
            best, best_cost = r, cost
        if tiles == 1:
            break
    return best


@dataclass(frozen=True)
class Tiling:
    """Resolved tile sizes and the packing they imply (all counts in rows of the named matrix).

    ``hb``: row pairs per packed QKV block (gcd of pairs per task and head_dim/2: each task's 2·pairs
    weight rows are one contiguous block). ``gb``: gate/up pairs per packed block (= ``rows_gateup / 2``);
    ``i_pad``: intermediate size rounded up to a multiple of ``gb`` (zero rows pad the last block).
    ``block_*``: the power-of-two register tile sizes (compile-time constants); a GATEUP / LMHEAD task covers
    ``gateup_blocks`` / ``lm_blocks`` of them. ``pf_next_ops``: opcodes whose tasks also prefetch the next
    task of their queue. ``qk_norm_attn``: q/k-norm and RoPE of q and k are done in the ATTN task (see
    ``MegakernelParams.qk_norm_in_attn``; only for a model with q/k-norm).
    """

    rows_qkv: int
    rows_o: int
    rows_gateup: int
    rows_down: int
    rows_lm: int
    kv_splits: int
    attn_kv_heads: int
    gateup_blocks: int
    lm_blocks: int
    attn_fused: bool
    attn_min_chunk: int
    pf_next_ops: tuple
    hb: int
    gb: int
    i_pad: int
    block_p: int
    block_o: int
    block_gu: int
    block_dn: int
    block_lm: int
    block_qh: int
    block_split: int
    qk_norm_attn: bool = False


def resolve_tiling(cfg: ModelConfig, params: MegakernelParams, grid: int) -> Tiling:
    """Fill in automatic tile sizes for ``grid`` programs (see :func:`pick_rows`)."""
    d, g, nkv = cfg.head_dim, cfg.gqa_group, cfg.num_key_value_heads
    qk_attn = bool(cfg.qk_norm and params.qk_norm_in_attn)
    mult = d if cfg.qk_norm and not qk_attn else 2  # q/k-norm in the QKV task needs whole heads in one task
    if params.rows_qkv is not None and params.rows_qkv % mult:
        raise BubblescopeError(f"megakernel params: rows_qkv must be a multiple of {mult} for {cfg.name}")
    r_qkv = params.rows_qkv or pick_rows(cfg.q_size + 2 * cfg.kv_size, grid, params.max_rows, mult)
    r_o = params.rows_o or pick_rows(cfg.hidden_size, grid, params.max_rows)
    r_gu = params.rows_gateup or pick_rows(2 * cfg.intermediate_size, grid, params.max_rows, 2)
    r_dn = params.rows_down or pick_rows(cfg.hidden_size, grid, params.max_rows)
    r_lm = params.rows_lm or pick_rows(cfg.vocab_size, grid, params.max_rows)
    heads = min(params.attn_kv_heads, nkv)
    splits = params.kv_splits or max(1, min(KV_SPLITS_CAP, grid // max(1, -(-nkv // heads))))
    return Tiling(
        rows_qkv=r_qkv, rows_o=r_o, rows_gateup=r_gu, rows_down=r_dn, rows_lm=r_lm, kv_splits=splits,
        attn_kv_heads=heads, gateup_blocks=params.gateup_blocks, lm_blocks=params.lm_blocks,
        attn_fused=params.attn_reduce == "fused", attn_min_chunk=params.attn_min_chunk or DEFAULT_MIN_CHUNK,
        pf_next_ops=tuple(sorted({OPCODES[n] for n in params.prefetch_next_ops_names()})),
        hb=math.gcd(r_qkv // 2, d // 2), gb=r_gu // 2,
        i_pad=-(-cfg.intermediate_size // (r_gu // 2)) * (r_gu // 2),
        block_p=next_pow2(r_qkv // 2), block_o=next_pow2(r_o), block_gu=next_pow2(r_gu // 2),
        block_dn=next_pow2(r_dn), block_lm=next_pow2(r_lm), block_qh=next_pow2(heads * g),
        block_split=min(16, next_pow2(splits)), qk_norm_attn=qk_attn)


def task_weight_rows(cfg: ModelConfig, tiling: Tiling) -> dict[str, tuple[int, int]]:
    """Rows of weights one full task of each weight opcode streams, and the width of their matrix, keyed by the
    opcode names of :data:`OPCODE_NAMES`: QKV ``(rows_qkv, hidden)``, OPROJ ``(rows_o, q_size)``, GATEUP
    ``(rows_gateup × gateup_blocks, hidden)``, DOWN ``(rows_down, intermediate)``, LMHEAD
    ``(rows_lm × lm_blocks, hidden)`` (the Gluon kernel's tiling has one block per task)."""
    h = cfg.hidden_size
    return {"QKV": (tiling.rows_qkv, h), "OPROJ": (tiling.rows_o, cfg.q_size),
            "GATEUP": (tiling.rows_gateup * tiling.gateup_blocks, h),
            "DOWN": (tiling.rows_down, cfg.intermediate_size),
            "LMHEAD": (tiling.rows_lm * tiling.lm_blocks, h)}


def task_weight_bytes(cfg: ModelConfig, tiling: Tiling, elem_bytes: int) -> dict[str, int]:
    """Bytes of weights one task of each weight opcode streams, keyed by the opcode names of
    :data:`OPCODE_NAMES` (the ``name`` column of ``timeline.decode_timeline``).

    A task's rows times the width of the matrix they belong to, times ``elem_bytes``: QKV ``rows_qkv × hidden``,
    OPROJ ``rows_o × q_size``, GATEUP ``rows_gateup × gateup_blocks × hidden``, DOWN ``rows_down × intermediate``,
    LMHEAD ``rows_lm × lm_blocks × hidden`` (the Gluon kernel's tiling has one block per task). A stage's last task
    may hold fewer rows (a partial tile); this is the full tile's size, the rule ``timeline.stream_feed`` spreads
    over a task's ring slots (first written as ``benchmarks/chain_breakdown.py``'s ``task_bytes``).

    Args:
        cfg: the model's shapes.
        tiling: the resolved tiling of the schedule that ran (``Schedule.tiling``).
        elem_bytes: bytes per packed weight element (2 for bf16 / fp16, 4 for fp32).

    Returns:
        ``{"QKV", "OPROJ", "GATEUP", "DOWN", "LMHEAD"}`` → bytes per task (int).

    Raises:
        BubblescopeError: ``elem_bytes`` not a positive integer.
    """
    if isinstance(elem_bytes, bool) or not isinstance(elem_bytes, int) or elem_bytes <= 0:
        raise BubblescopeError(f"task_weight_bytes: elem_bytes must be a positive integer, got {elem_bytes!r}")
    return {name: rows * width * elem_bytes for name, (rows, width) in task_weight_rows(cfg, tiling).items()}


@dataclass(frozen=True)
class Task:
    """One instruction (see the F_* fields). ``wait`` / ``signal``: counter ids or -1."""

    op: int
    layer: int
    tile: int
    a0: int
    a1: int
    a2: int
    wait: int
    need: int
    signal: int
    gidx: int = -1
    ticket: int = -1
    pf_next: bool = False


def counter_id(layer: int, op: int) -> int:
    """The (layer, stage) counter of a per-layer opcode."""
    return layer * len(LAYER_STAGES) + LAYER_STAGES.index(op)


def kv_groups(cfg: ModelConfig, heads: int) -> list[tuple[int, int]]:
    """(first kv head, kv heads) of each ATTN kv-head group."""
    return [(h0, min(heads, cfg.num_key_value_heads - h0)) for h0 in range(0, cfg.num_key_value_heads, heads)]


def num_counters(cfg: ModelConfig, tiling: Tiling) -> int:
    """(layer, stage) counters, then one ticket counter per (layer, kv-head group)."""
    return cfg.num_hidden_layers * (len(LAYER_STAGES) + len(kv_groups(cfg, tiling.attn_kv_heads)))


def ticket_id(cfg: ModelConfig, tiling: Tiling, layer: int, group: int) -> int:
    n_groups = len(kv_groups(cfg, tiling.attn_kv_heads))
    return cfg.num_hidden_layers * len(LAYER_STAGES) + layer * n_groups + group


def _tiles(n: int, r: int):
    for t, start in enumerate(range(0, n, r)):
        yield t, start, min(r, n - start)


def build_tasks(cfg: ModelConfig, tiling: Tiling) -> list[Task]:
    """The tasks of one decode step in global topological order (gidx = list index)."""
    tasks: list[Task] = []
    stage_tasks: dict[int, int] = {}  # counter -> increments per step

    def stage(layer, op, items, wait, signal=None, tickets=None):
        c = (counter_id(layer, op) if op != OP_LMHEAD else -1) if signal is None else signal
        need = stage_tasks.get(wait, 0) if wait >= 0 else 0
        for tile, (a0, a1, a2) in enumerate(items):
            tasks.append(Task(op, layer, tile, a0, a1, a2, wait, need, c, len(tasks),
                              ticket=-1 if tickets is None else tickets[tile], pf_next=op in tiling.pf_next_ops))
        if c >= 0:  # fused ATTN: one signal per kv-head group (from its last ticket holder)
            stage_tasks[c] = len(items) if tickets is None else len(set(tickets))

    r = tiling.rows_qkv
    groups = kv_groups(cfg, tiling.attn_kv_heads)
    splits = tiling.kv_splits
    prev = -1
    for layer in range(cfg.num_hidden_layers):
        stage(layer, OP_QKV, [(0, s, n) for _, s, n in _tiles((cfg.q_size + 2 * cfg.kv_size) // 2, r // 2)], prev)
        attn = [(h0, n, s) for h0, n in groups for s in range(splits)]
        if tiling.attn_fused:
            stage(layer, OP_ATTN, attn, counter_id(layer, OP_QKV), signal=counter_id(layer, OP_ATTN_REDUCE),
                  tickets=[ticket_id(cfg, tiling, layer, g) for g in range(len(groups)) for _ in range(splits)])
        else:
            stage(layer, OP_ATTN, attn, counter_id(layer, OP_QKV))
            stage(layer, OP_ATTN_REDUCE, [(h0, n, 0) for h0, n in groups], counter_id(layer, OP_ATTN))
        stage(layer, OP_OPROJ, [(0, s, n) for _, s, n in _tiles(cfg.hidden_size, tiling.rows_o)],
              counter_id(layer, OP_ATTN_REDUCE))
        stage(layer, OP_GATEUP, [(0, s, n) for _, s, n in _tiles(cfg.intermediate_size,
                                                                 tiling.gb * tiling.gateup_blocks)],
              counter_id(layer, OP_OPROJ))
        stage(layer, OP_DOWN, [(0, s, n) for _, s, n in _tiles(cfg.hidden_size, tiling.rows_down)],
              counter_id(layer, OP_GATEUP))
        prev = counter_id(layer, OP_DOWN)
    stage(cfg.num_hidden_layers - 1, OP_LMHEAD,
          [(0, s, n) for _, s, n in _tiles(cfg.vocab_size, tiling.rows_lm * tiling.lm_blocks)], prev)
    return tasks


def signal_amounts(queue: list[Task]) -> list[int]:
    """Per task of one program's queue, what it adds to its signal counter.

    Consecutive tasks of a program signalling the same counter (one stage: contiguous in the global order,
    hence in every queue) signal once, from the last of them, adding their number: one release atomic per
    program and stage instead of one per task. A waiter needing the whole stage sees the same total; a
    schedule with finer dependencies would give every task amount 1.
    """
    out = [0] * len(queue)
    run = 0
    for i, t in enumerate(queue):
        run += 1
        if t.signal < 0 or t.ticket >= 0:  # ticket holders signal at run time (fused attention reduction)
            run = 0
        elif i + 1 == len(queue) or queue[i + 1].signal != t.signal:
            out[i], run = run, 0
    return out


def lower(tasks: list[Task], num_programs: int, num_counters: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Instruction table int32 (num_programs, max_tasks, NFIELDS) and task counts int32 (num_programs,).

    Task k of the list goes to program k % num_programs, keeping list order inside each program. The
    F_INC field repeats increments_per_step of the waited counter (the kernel's target is
    epoch × F_INC + F_NEED), so the kernel needs no separate per-counter table; F_SIGINC is
    :func:`signal_amounts`.
    """
    inc = increments_per_step(tasks, num_counters)
    queues: list[list[Task]] = [[] for _ in range(num_programs)]
    for k, t in enumerate(tasks):
        queues[k % num_programs].append(t)
    max_tasks = max(1, max(len(q) for q in queues))
    rows = [[[t.op, t.layer, t.tile, t.a0, t.a1, t.a2, t.wait, t.need, inc[t.wait] if t.wait >= 0 else 0,
              t.signal, t.gidx, amount, t.ticket, int(t.pf_next)] for t, amount in zip(q, signal_amounts(q))]
            + [[0] * NFIELDS] * (max_tasks - len(q)) for q in queues]
    table = torch.tensor(rows, dtype=torch.int32).view(num_programs, max_tasks, NFIELDS)
    counts = torch.tensor([len(q) for q in queues], dtype=torch.int32)
    return table, counts


def increments_per_step(tasks: list[Task], num_counters: int) -> list[int]:
    """How many times each stage counter is incremented in one step: once per signalling task, except that
    the ATTN tasks of a fused reduction signal once per kv-head group (counted at split 0). Ticket counters
    are rewound every step and are not waited on: 0 here."""
    inc = [0] * num_counters
    for t in tasks:
        if t.ticket >= 0:
            if t.signal >= 0 and t.a2 == 0:
                inc[t.signal] += 1
        elif t.signal >= 0:
            inc[t.signal] += 1
    return inc


@dataclass
class Schedule:
    """A lowered decode step. ``table``/``counts`` are CPU tensors (the engine copies them to the device)."""

    config: ModelConfig
    tiling: Tiling
    num_programs: int
    tasks: list[Task]
    table: torch.Tensor
    counts: torch.Tensor
    num_counters: int
    increments: list[int] = field(default_factory=list)

    def counter_name(self, c: int) -> str:
        """``layer 3 QKV`` for counter ids, ``none`` for -1."""
        if c < 0:
            return "none"
        n_stage = self.config.num_hidden_layers * len(LAYER_STAGES)
        if c >= n_stage:
            layer, g = divmod(c - n_stage, len(kv_groups(self.config, self.tiling.attn_kv_heads)))
            return f"layer {layer} ATTN tickets of kv-head group {g}"
        layer, s = divmod(c, len(LAYER_STAGES))
        return f"layer {layer} {OPCODE_NAMES[LAYER_STAGES[s]]}"

    def tasks_per_opcode(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tasks:
            out[OPCODE_NAMES[t.op]] = out.get(OPCODE_NAMES[t.op], 0) + 1
        return out

    def stage_schedules(self) -> list["Schedule"]:
        """One schedule per (layer, stage) and the LM head, without counters (the ``stages`` variant):
        each is launched on its own, so kernel boundaries order the stages."""
        groups: list[list[Task]] = []
        for t in self.tasks:
            if not groups or (groups[-1][0].op, groups[-1][0].layer) != (t.op, t.layer):
                groups.append([])
            groups[-1].append(replace(t, wait=-1, need=0, signal=-1))
        out = []
        for g in groups:
            p = min(self.num_programs, len(g))
            table, counts = lower(g, p, self.num_counters)
            out.append(Schedule(self.config, self.tiling, p, g, table, counts, self.num_counters,
                                [0] * self.num_counters))
        return out

    def with_programs(self, num_programs: int) -> "Schedule":
        """The same tasks lowered for another grid size (tile sizes unchanged)."""
        table, counts = lower(self.tasks, num_programs, self.num_counters)
        return Schedule(self.config, self.tiling, num_programs, self.tasks, table, counts, self.num_counters,
                        self.increments)


def build_schedule(cfg: ModelConfig, params: MegakernelParams, num_programs: int,
                   tiling: Tiling | None = None) -> Schedule:
    """Task graph + lowering of one decode step for ``num_programs`` programs.

    Raises:
        BubblescopeError: invalid params (see :meth:`MegakernelParams.validate`).
    """
    params.validate()
    tiling = tiling or resolve_tiling(cfg, params, num_programs)
    tasks = build_tasks(cfg, tiling)
    n_counters = num_counters(cfg, tiling)
    table, counts = lower(tasks, num_programs, n_counters)
    return Schedule(cfg, tiling, num_programs, tasks, table, counts, n_counters,
                    increments_per_step(tasks, n_counters))
