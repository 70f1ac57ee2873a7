"""The persistent megakernel (Triton): one launch per decode step, each program walks its task queue.

Imported only through :mod:`.launch`, after the Triton mode (compiled or interpreted) is settled; see
:mod:`.ops` for why the mode is process-wide.

Memory layout of the launch's inputs (all int32 unless said):

* ``table`` (P, T, NFIELDS): program p's tasks in slots 0..counts[p]-1 (fields: ``schedule.F_*``).
* ``state`` (4,): position, epoch, input token, greedy token — read once at kernel start, advanced by the
  last program to finish. The input token comes from the ``tok_in`` argument when it is >= 0 (no host-to-
  device write per step), else from ``state[2]`` (a device-side token, e.g. the previous greedy pick).
* ``amax`` int64 (1,): the LM-head tasks' ``atomic_max`` of (ordered logit, row) keys (ops.op_lmhead); the
  last program decodes it into the greedy token, writes it to ``state[2]``, ``state[3]`` and ``err[15]``
  (so the host reads the token with the error record, in one copy) and resets it.
* ``counters`` (C,): stage counters, only ever incremented. A task waiting on counter c for ``need``
  increments of this step waits until ``counters[c] >= epoch · F_INC + need`` (F_INC = increments of c
  per step); a task adds F_SIGINC to its signal counter when done (a program's run of tasks of one stage
  signals once, from its last task). After the stage counters come the ATTN ticket counters, one per (layer,
  kv-head group): not waited on, and rewound to 0 each step by the task that takes the last ticket.
  ``done`` (1,): programs finished in this launch (reset by the last one).
* ``err`` (16,): stuck-task record: flag, opcode, layer, tile, program, counter, seen, need, gidx,
  number of stuck tasks; ``err[15]``: the step's greedy token.
* ``timeline`` int64 (P, T, 3): per task start / dependencies-satisfied / done timestamps in ns.
* weights (``packing.py``): ``wqkv``, ``wo``, ``wgu``, ``wdown`` in the activation dtype, or float8_e4m3fn with
  ``FP8`` set and their float32 row scales in ``sqkv_ptr``, ``so_ptr``, ``sgu_ptr``, ``sdown_ptr``; ``head_ptr``
  likewise with ``FP8_HEAD`` and ``slm_ptr``. A scale pointer whose switch is off is a dummy, never read.

Synchronisation (Triton idioms measured on the H200, see docs/design.md): the producer runs
``tl.debug_barrier()`` (all its threads' stores issued) then ``atomic_add(cnt, 1, sem="release",
scope="gpu")``; the consumer spins on ``atomic_add(cnt, 0, sem="acquire", scope="gpu")`` then
``tl.debug_barrier()``, and loads data written by other programs with ``cache_modifier=".cg"`` (L1 is not
coherent). Every spin is bounded by ``spin_cap``: a task that waits longer is recorded in ``err`` and its
program stops (the engine raises ``KernelStuck``) — the kernel never hangs.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...triton_interp import l2_prefetch
from .. import schedule as S
from .ops import (OP_ATTN, OP_ATTN_REDUCE, OP_DOWN, OP_GATEUP, OP_LMHEAD, OP_OPROJ, OP_QKV, clock_ns, device_function,
                  op_attn, op_attn_reduce, op_gateup, op_lmhead, op_matvec_residual, op_qkv, splits_used)

F_OP = tl.constexpr(S.F_OP)
F_LAYER = tl.constexpr(S.F_LAYER)
F_TILE = tl.constexpr(S.F_TILE)
F_A0 = tl.constexpr(S.F_A0)
F_A1 = tl.constexpr(S.F_A1)
F_A2 = tl.constexpr(S.F_A2)
F_WAIT = tl.constexpr(S.F_WAIT)
F_NEED = tl.constexpr(S.F_NEED)
F_INC = tl.constexpr(S.F_INC)
F_SIGNAL = tl.constexpr(S.F_SIGNAL)
F_GIDX = tl.constexpr(S.F_GIDX)
F_SIGINC = tl.constexpr(S.F_SIGINC)
F_TICKET = tl.constexpr(S.F_TICKET)
F_PFNEXT = tl.constexpr(S.F_PFNEXT)
AMAX_EMPTY = tl.constexpr(-(2 ** 63))  # below every key op_lmhead builds


@device_function
def _wait(cnt_ptr, target, spin_cap, SLEEP_NS: tl.constexpr):
    """Spin (acquire) until ``*cnt_ptr >= target`` or ``spin_cap`` spins; returns the last value seen."""
    seen = tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
    spins = 0
    while (seen < target) & (spins < spin_cap):
        if SLEEP_NS > 0:  # back off so spinning programs leave the L2 atomic unit to the producers
            tl.inline_asm_elementwise("nanosleep.u32 $1; mov.u32 $0, 0;", "=r,r", [tl.full([], SLEEP_NS, tl.int32)],
                                      dtype=tl.int32, is_pure=False, pack=1)
        seen = tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
        spins += 1
    tl.debug_barrier()
    return seen


@device_function
def _record_stuck(err_ptr, op, layer, tile, pid, cnt, seen, need, gidx):
    """Keep the first stuck task's identity in ``err`` (atomic flag), count all of them."""
    if tl.atomic_cas(err_ptr, 0, 1) == 0:
        tl.store(err_ptr + 1, op)
        tl.store(err_ptr + 2, layer)
        tl.store(err_ptr + 3, tile)
        tl.store(err_ptr + 4, pid)
        tl.store(err_ptr + 5, cnt)
        tl.store(err_ptr + 6, seen)
        tl.store(err_ptr + 7, need)
        tl.store(err_ptr + 8, gidx)
    tl.atomic_add(err_ptr + 9, 1)


@device_function
def _prefetch_task(op, layer, a1, a2, wqkv_ptr, wo_ptr, wgu_ptr, wdown_ptr, head_ptr,
                   H: tl.constexpr, Q: tl.constexpr, KV: tl.constexpr, I: tl.constexpr, IP: tl.constexpr,
                   MODE: tl.constexpr, LANES: tl.constexpr):
    """L2-prefetch the task's weight tile: thanks to the packing it is one contiguous block (packing.py). Bytes per
    element from the matrices' own dtypes (the LM head may stay 16-bit beside FP8 layers); the FP8 row scales (4
    bytes a row against H or more) are not prefetched."""
    ESIZE: tl.constexpr = wqkv_ptr.dtype.element_ty.primitive_bitwidth // 8
    HSIZE: tl.constexpr = head_ptr.dtype.element_ty.primitive_bitwidth // 8
    BYTE_PTR: tl.constexpr = tl.pointer_type(tl.int8)  # one type for every branch (the matrices' dtypes may differ)
    layer64 = layer.to(tl.int64)
    base = head_ptr.to(BYTE_PTR)
    nbytes = 0
    if op == OP_QKV:  # pairs [a1, a1 + a2) are packed rows [2·a1, 2·(a1 + a2))
        base = (wqkv_ptr + (layer64 * (Q + 2 * KV) + 2 * a1) * H).to(BYTE_PTR)
        nbytes = 2 * a2 * (H * ESIZE)
    elif op == OP_OPROJ:
        base = (wo_ptr + (layer64 * H + a1) * Q).to(BYTE_PTR)
        nbytes = a2 * (Q * ESIZE)
    elif op == OP_GATEUP:  # gate and up rows of pairs [a1, a1 + a2) (exact unless the last block is partial)
        base = (wgu_ptr + (layer64 * 2 * IP + 2 * a1) * H).to(BYTE_PTR)
        nbytes = 2 * a2 * (H * ESIZE)
    elif op == OP_DOWN:
        base = (wdown_ptr + (layer64 * H + a1) * I).to(BYTE_PTR)
        nbytes = a2 * (I * ESIZE)
    elif op == OP_LMHEAD:
        base = (head_ptr + a1.to(tl.int64) * H).to(BYTE_PTR)
        nbytes = a2 * (H * HSIZE)
    l2_prefetch(base, nbytes, MODE, LANES)


@triton.jit(do_not_specialize=["max_tasks", "spin_cap", "advance", "tok_in"])
def megakernel(
        table_ptr, counts_ptr, max_tasks, state_ptr, counters_ptr, done_ptr, err_ptr, timeline_ptr,
        emb_ptr, head_ptr, fnorm_ptr, wqkv_ptr, bqkv_ptr, qknorm_ptr, anorm_ptr, wo_ptr, mnorm_ptr, wgu_ptr,
        wdown_ptr, sqkv_ptr, so_ptr, sgu_ptr, sdown_ptr, slm_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr,
        x_ptr, q_ptr, pm_ptr, pl_ptr, pacc_ptr, attn_ptr, act_ptr, logits_ptr, amax_ptr,
        spin_cap, advance, tok_in, eps, sm_scale,
        H: tl.constexpr, Q: tl.constexpr, KV: tl.constexpr, I: tl.constexpr, IP: tl.constexpr, V: tl.constexpr,
        D: tl.constexpr, G: tl.constexpr, NKV: tl.constexpr, S_MAX: tl.constexpr, NSPLIT: tl.constexpr,
        MIN_CHUNK: tl.constexpr,
        NF: tl.constexpr, HB: tl.constexpr, GB: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_KQ: tl.constexpr,
        BLOCK_KI: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_O: tl.constexpr, BLOCK_GU: tl.constexpr,
        BLOCK_DN: tl.constexpr,
        BLOCK_LM: tl.constexpr, BLOCK_QH: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_SPLIT: tl.constexpr,
        HAS_BIAS: tl.constexpr, HAS_QK_NORM: tl.constexpr, PREFETCH: tl.constexpr, PF_LANES: tl.constexpr,
        PF_AHEAD: tl.constexpr, SLEEP_NS: tl.constexpr, TIMELINE: tl.constexpr, W_EVICT: tl.constexpr,
        FP8: tl.constexpr, FP8_HEAD: tl.constexpr):
    """Run program ``pid``'s queue of the instruction table for one decode step (see module docstring).

    Per task: read the instruction; [PREFETCH] start its weight tile (PF_AHEAD = 1: the NEXT task's tile,
    so it streams in while this task waits and computes; F_PFNEXT: the next task's tile too) towards L2;
    wait for its dependency counter (bounded); run the opcode; release-increment its signal counter (a
    fused-reduction ATTN task takes a ticket instead, and the last ticket holder of its kv-head group runs
    ATTN_REDUCE and signals). Then the last program to finish, when ``advance`` is set (the ``stages``
    variant clears it for all but its last launch of a step), advances position and epoch and publishes the
    greedy token.
    """
    pid = tl.program_id(0)
    pos = tl.load(state_ptr + 0)
    epoch = tl.load(state_ptr + 1)
    tok = tok_in
    if tok_in < 0:
        tok = tl.load(state_ptr + 2)
    tok = tl.minimum(tl.maximum(tok, 0), V - 1)  # a bad device-side id must not read out of bounds
    n = tl.load(counts_ptr + pid)
    row = table_ptr + pid * max_tasks * NF
    known_cnt = -1  # counters only increase: once seen >= a target, later waits for <= it need no atomic
    known_seen = 0
    i = 0
    while i < n:
        # Fields are loaded where they are used: every op is costly under the interpreter.
        op = tl.load(row + F_OP)
        layer = tl.load(row + F_LAYER)
        a1 = tl.load(row + F_A1)
        a2 = tl.load(row + F_A2)
        wait_cnt = tl.load(row + F_WAIT)
        if TIMELINE:
            t_start = clock_ns()
        if PREFETCH > 0:
            if PF_AHEAD > 0:
                if i + 1 < n:
                    nxt = row + NF
                    _prefetch_task(tl.load(nxt + F_OP), tl.load(nxt + F_LAYER), tl.load(nxt + F_A1), tl.load(nxt + F_A2),
                                   wqkv_ptr, wo_ptr, wgu_ptr, wdown_ptr, head_ptr, H, Q, KV, I, IP, PREFETCH, PF_LANES)
            else:
                _prefetch_task(op, layer, a1, a2, wqkv_ptr, wo_ptr, wgu_ptr, wdown_ptr, head_ptr, H, Q, KV, I, IP,
                               PREFETCH, PF_LANES)
                if tl.load(row + F_PFNEXT) != 0:
                    if i + 1 < n:
                        nxt = row + NF
                        _prefetch_task(tl.load(nxt + F_OP), tl.load(nxt + F_LAYER), tl.load(nxt + F_A1),
                                       tl.load(nxt + F_A2), wqkv_ptr, wo_ptr, wgu_ptr, wdown_ptr, head_ptr, H, Q, KV,
                                       I, IP, PREFETCH, PF_LANES)
        ok = 1
        if op == OP_ATTN:  # a split beyond this position's non-empty ones has nothing to read or write
            if tl.load(row + F_A2) >= splits_used(pos, NSPLIT, MIN_CHUNK):
                ok = 2
                wait_cnt = -1
        if wait_cnt >= 0:
            need = tl.load(row + F_NEED)
            target = epoch * tl.load(row + F_INC) + need
            if (wait_cnt != known_cnt) | (known_seen < target):
                seen = _wait(counters_ptr + wait_cnt, target, spin_cap, SLEEP_NS)
                known_cnt = wait_cnt
                known_seen = seen
                if seen < target:
                    _record_stuck(err_ptr, op, layer, tl.load(row + F_TILE), pid, wait_cnt, seen - (target - need),
                                  need, tl.load(row + F_GIDX))
                    ok = 0
                    n = i  # this program stops after this slot
        if TIMELINE:
            t_ready = clock_ns()
        if ok == 1:
            if op == OP_QKV:
                op_qkv(layer, a1, a2, pos, tok, eps, emb_ptr, x_ptr, wqkv_ptr, sqkv_ptr, bqkv_ptr, qknorm_ptr,
                       anorm_ptr, cos_ptr, sin_ptr, q_ptr, kc_ptr, vc_ptr, H, Q, KV, D, NKV, S_MAX, HB, HAS_BIAS,
                       HAS_QK_NORM, BLOCK_P, BLOCK_KH, W_EVICT, FP8)
            elif op == OP_ATTN:
                kv0 = tl.load(row + F_A0)
                op_attn(layer, kv0, a1, a2, pos, sm_scale, q_ptr, kc_ptr, vc_ptr, pm_ptr, pl_ptr,
                        pacc_ptr, D, G, NKV, S_MAX, NSPLIT, MIN_CHUNK, BLOCK_QH, BLOCK_S)
                ticket_cnt = tl.load(row + F_TICKET)
                if ticket_cnt >= 0:  # fused reduction: the group's last ticket holder combines the splits
                    tl.debug_barrier()  # every thread's partials are issued before the release
                    ticket = tl.atomic_add(counters_ptr + ticket_cnt, 1, sem="acq_rel", scope="gpu")
                    if ticket == splits_used(pos, NSPLIT, MIN_CHUNK) - 1:
                        # every non-empty split of this step has its ticket: rewind for the next step (the
                        # next launch, or the next stages launch, is ordered after this one)
                        tl.atomic_xchg(counters_ptr + ticket_cnt, 0, sem="relaxed", scope="gpu")
                        tl.debug_barrier()
                        op_attn_reduce(kv0, a1, pos, pm_ptr, pl_ptr, pacc_ptr, attn_ptr, D, G, NSPLIT, MIN_CHUNK,
                                       BLOCK_QH, BLOCK_SPLIT)
                        sig = tl.load(row + F_SIGNAL)
                        if sig >= 0:
                            tl.debug_barrier()
                            tl.atomic_add(counters_ptr + sig, 1, sem="release", scope="gpu")
            elif op == OP_ATTN_REDUCE:
                op_attn_reduce(tl.load(row + F_A0), a1, pos, pm_ptr, pl_ptr, pacc_ptr, attn_ptr, D, G, NSPLIT,
                               MIN_CHUNK, BLOCK_QH, BLOCK_SPLIT)
            elif op == OP_OPROJ:
                if layer == 0:  # layer 0's residual is the token's embedding row (x is not written yet)
                    resid = emb_ptr + tok.to(tl.int64) * H
                else:
                    resid = x_ptr
                op_matvec_residual(a1, a2, wo_ptr + layer.to(tl.int64) * (H * Q), so_ptr + layer.to(tl.int64) * H,
                                   attn_ptr, resid, x_ptr, Q, BLOCK_O, BLOCK_KQ, W_EVICT, FP8)
            elif op == OP_GATEUP:
                op_gateup(layer, a1, a2, eps, x_ptr, mnorm_ptr, wgu_ptr, sgu_ptr, act_ptr, H, I, IP, GB, BLOCK_GU,
                          BLOCK_KH, W_EVICT, FP8)
            elif op == OP_DOWN:
                op_matvec_residual(a1, a2, wdown_ptr + layer.to(tl.int64) * (H * I),
                                   sdown_ptr + layer.to(tl.int64) * H, act_ptr, x_ptr, x_ptr, I, BLOCK_DN, BLOCK_KI,
                                   W_EVICT, FP8)
            elif op == OP_LMHEAD:
                op_lmhead(a1, a2, eps, x_ptr, fnorm_ptr, head_ptr, slm_ptr, logits_ptr, amax_ptr, H, V, BLOCK_LM,
                          BLOCK_KH, W_EVICT, FP8_HEAD)
        if ok > 0:  # (a skipped ATTN task still makes its static signal, for the stage-reduce variant)
            amount = tl.load(row + F_SIGINC)
            if amount > 0:  # the program's last task of its stage run signals for the whole run
                tl.debug_barrier()  # every thread's stores of the run's tasks are issued before the release
                tl.atomic_add(counters_ptr + tl.load(row + F_SIGNAL), amount, sem="release", scope="gpu")
        if TIMELINE:
            t_end = clock_ns()
            slot = timeline_ptr + (pid * max_tasks + i).to(tl.int64) * 3
            tl.store(slot + 0, t_start)
            tl.store(slot + 1, t_ready)
            tl.store(slot + 2, t_end)
        row += NF
        i += 1
    tl.debug_barrier()
    finished = tl.atomic_add(done_ptr, 1, sem="acq_rel", scope="gpu")
    if finished == tl.num_programs(0) - 1:  # last program of this launch: everyone has read the state
        tl.atomic_xchg(done_ptr, 0)
        if advance != 0:
            tl.store(state_ptr + 0, pos + 1)
            tl.store(state_ptr + 1, epoch + 1)
            key = tl.atomic_xchg(amax_ptr, AMAX_EMPTY, sem="acq_rel", scope="gpu")
            best = (V - 1 - (key - ((key >> 32) << 32))).to(tl.int32)  # low 32 bits: V - 1 - row
            tl.store(state_ptr + 2, best)
            tl.store(state_ptr + 3, best)
            tl.store(err_ptr + 15, best)
