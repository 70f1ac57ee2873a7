"""The Gluon megakernel (Hopper, sm_90): one persistent CTA per SM, a 1-warp TMA producer and NW consumer warps.

Why Gluon: plain Triton owns shared memory, so its weight tiles live in registers, few bytes are in flight per
SM and every task's loads start after its dependency wait (``docs/design.md``: 50 % of the H200's peak on the
Llama-3.2-1B matvec chain). Here the weight stream is explicit:

* **producer** (worker partition, 1 warp): walks the CTA's queue of the instruction table (the same table as
  the Triton kernel, ``schedule.py``) and, for every weight tile, waits for a free ring slot (``empty``
  mbarrier), then issues one TMA box ``[BR, BK]`` of the task's packed rows into it (``full`` mbarrier with
  the byte count). It never waits on activations (``PREFETCH=1``), so during a consumer's dependency wait the
  ring fills with the next tasks' weights — across task, stage and layer boundaries. ``PREFETCH=0`` (the
  ``noprefetch`` ablation) makes it spin on the task's dependency counter before loading the task.
* **consumer** (default partition, NW warps): per task, waits for its dependency counter (bounded spin,
  acquire), stages the task's input vector once per (layer, opcode) into shared memory ``xs`` as the
  reference rounds it (RMSNorm·weight for QKV / GATEUP / LMHEAD, the attention output for OPROJ, SiLU·up for
  DOWN), then for each chunk of BK columns: waits ``full``, reads the tile, frees the slot, accumulates
  ``Σ_k W[r, k]·xs[k]`` in float32 (``matvec.py``); then the opcode's epilogue (bias + RoPE + KV append, residual add,
  SiLU·up, logits + greedy key) and a release increment of its signal counter.

Weight layout: every packed weight matrix is a 2-D row-major tensor (``packing.py``: QKV rows in RoPE-pair
blocks of ``BR/2`` first-half rows then the ``BR/2`` matching second-half rows; gate/up in blocks of ``BR/2``
gate rows then the same up rows), and one host ``TensorDescriptor`` per matrix with box ``[BR, BK]`` and
unswizzled NVMMA layout. A task is one tile of ``BR`` rows over all K columns: ``cdiv(K, BK)`` boxes; TMA
fills columns past K (and rows past the matrix) with zeros, so no shape needs to divide BK. ``MV_MMA``
(``mv_widen=mma``): the descriptors' boxes are ``[BR, 64]`` with the 128-byte swizzle, ``BK / 64`` of them per
box, and the ring is ``(NS, SB·BK/64, BR, 64)``, read by ``ldmatrix`` for the tensor cores (``matvec.mv_mma``).

Attention (``ATTN``, no weights, so the producer skips it and keeps streaming the next tasks' weights): one task
per (kv head, position split), flash-decoding, in ``attention.py``; the consumer calls the layout ``ATTN_MMA`` /
``ATTN_WARPS`` select.

Synchronisation is the Triton kernel's (counters that only increase, targets ``epoch · F_INC + F_NEED``,
``thread_barrier`` then ``atomic_add(release)``; acquire spins; ``.cg`` loads of other CTAs' data). Every
global spin is capped; a CTA whose wait expired records it in ``err`` and stops waiting, but still consumes
every ring slot, so the producer's ``mbarrier.wait`` (which has no timeout) always completes and the kernel
always ends: a stuck schedule is an exception on the host, never a hang.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from .. import schedule as S
from .attention import attention, attention_mma, attention_warps
from .common import now, rnd, spin, splits_used
from .matvec import mv_half_boxes, mv_halves, mv_mma, mv_pair, mv_single, stage_vector
from .ptx import MARKER

MARK_ASM = gl.constexpr("// " + MARKER + "\n\tmov.u32 $0, 0;")  # a PTX comment (gluon/ptx.py)
F_OP = gl.constexpr(S.F_OP)
F_LAYER = gl.constexpr(S.F_LAYER)
F_TILE = gl.constexpr(S.F_TILE)
F_A0 = gl.constexpr(S.F_A0)
F_A1 = gl.constexpr(S.F_A1)
F_A2 = gl.constexpr(S.F_A2)
F_WAIT = gl.constexpr(S.F_WAIT)
F_NEED = gl.constexpr(S.F_NEED)
F_INC = gl.constexpr(S.F_INC)
F_SIGNAL = gl.constexpr(S.F_SIGNAL)
F_GIDX = gl.constexpr(S.F_GIDX)
F_SIGINC = gl.constexpr(S.F_SIGINC)
F_TICKET = gl.constexpr(S.F_TICKET)
OP_QKV = gl.constexpr(S.OP_QKV)
OP_ATTN = gl.constexpr(S.OP_ATTN)
OP_OPROJ = gl.constexpr(S.OP_OPROJ)
OP_GATEUP = gl.constexpr(S.OP_GATEUP)
OP_DOWN = gl.constexpr(S.OP_DOWN)
OP_LMHEAD = gl.constexpr(S.OP_LMHEAD)
AMAX_EMPTY = gl.constexpr(-(2 ** 63))
STAMPS = gl.constexpr(7)  # per task: start, ready, end (consumer); first and last TMA issue (producer) — for an
# attention task (no weights), when its math was done and its ticket drawn (consumer); a weight task's input staged
# and its last ring slot consumed (consumer) — for an attention task, q in registers and its block loop done


@gluon.jit
def _record_stuck(err_ptr, op, layer, tile, pid, cnt, seen, need, gidx):
    if gl.atomic_cas(err_ptr, 0, 1, sem="relaxed", scope="gpu") == 0:
        gl.store(err_ptr + 1, op)
        gl.store(err_ptr + 2, layer)
        gl.store(err_ptr + 3, tile)
        gl.store(err_ptr + 4, pid)
        gl.store(err_ptr + 5, cnt)
        gl.store(err_ptr + 6, seen)
        gl.store(err_ptr + 7, need)
        gl.store(err_ptr + 8, gidx)
    gl.atomic_add(err_ptr + 9, 1, sem="relaxed", scope="gpu")


# ---- epilogues ----------------------------------------------------------------------------------------------
# QKV: pairs j = a1 .. a1+a2-1 of the stacked q|k|v heads (pair j = rows (i, i + D/2) of head j // (D/2));
# out_lo = lo·cos − hi·sin, out_hi = hi·cos + lo·sin (rotate_half RoPE; v unrotated), with the reference's
# roundings; q → q buffer, k/v → cache[layer, kv head, pos].
# QK_NORM (Qwen3): the per-head RMSNorm needs a whole head, and a tile of BR rows holds BR/2 of its D/2 pairs, so
# the task stores raw q (+ bias) → q buffer and raw k (+ bias) → knew (NKV, D), both rounded to ACT as the
# reference's linear output is; the ATTN task norms and rotates them (attention.py, _norm_rope). v → cache as above.
@gluon.jit
def _qkv_epilogue(acc_lo, acc_hi, layer, a1, a2, pos, c, s, q_ptr, kc_ptr, vc_ptr,
                  Q: gl.constexpr, KV: gl.constexpr, D: gl.constexpr, NKV: gl.constexpr, S_MAX: gl.constexpr,
                  HB: gl.constexpr, YL: gl.constexpr, knew_ptr, QK_NORM: gl.constexpr):
    """``acc_lo``/``acc_hi`` include the bias; ``c``/``s`` are cos/sin at pos for each pair, rounded to ACT
    (loaded before the task's dependency wait)."""
    ACT: gl.constexpr = q_ptr.dtype.element_ty
    HALF: gl.constexpr = D // 2
    NQH: gl.constexpr = Q // D
    layer64 = layer.to(gl.int64)
    j = a1 + gl.arange(0, HB, layout=YL)
    mj = j < a1 + a2
    lo = rnd(acc_lo, ACT)
    hi = rnd(acc_hi, ACT)
    i = j % HALF
    head = j // HALF
    is_q = head < NQH
    is_v = head >= NQH + NKV
    if QK_NORM:
        out_lo = lo.to(ACT)
        out_hi = hi.to(ACT)
    else:
        out_lo = gl.where(is_v, lo, rnd(rnd(lo * c, ACT) - rnd(hi * s, ACT), ACT)).to(ACT)
        out_hi = gl.where(is_v, hi, rnd(rnd(hi * c, ACT) + rnd(lo * s, ACT), ACT)).to(ACT)
    q_dst = q_ptr + head * D + i
    gl.store(q_dst, out_lo, mask=mj & is_q)
    gl.store(q_dst + HALF, out_hi, mask=mj & is_q)
    kvh = gl.where(is_v, head - NQH - NKV, head - NQH)
    cache_off = ((layer64 * NKV + kvh) * S_MAX + pos) * D + i
    m_k = mj & (~is_q) & (~is_v)
    if QK_NORM:
        k_dst = knew_ptr + kvh * D + i
        gl.store(k_dst, out_lo, mask=m_k)
        gl.store(k_dst + HALF, out_hi, mask=m_k)
    else:
        gl.store(kc_ptr + cache_off, out_lo, mask=m_k)
        gl.store(kc_ptr + cache_off + HALF, out_hi, mask=m_k)
    gl.store(vc_ptr + cache_off, out_lo, mask=mj & is_v)
    gl.store(vc_ptr + cache_off + HALF, out_hi, mask=mj & is_v)


# LMHEAD: logits[r] = rnd(acc) (float32 buffer); the task's first maximum (v, r) becomes the int64 key
# (ord(v) << 32) | (V − 1 − r) (ord: float32 order as signed integers) and one atomic_max keeps the largest:
# the largest logit, ties to the smallest row, as torch.argmax. LM_CTA: no atomic here; the key is returned and
# the CTA issues one atomic_max for all its LM-head tasks after its queue (max is associative: the same pick).
@gluon.jit
def _lmhead_epilogue(acc, a1, a2, logits_ptr, amax_ptr, V: gl.constexpr, BR: gl.constexpr, YL: gl.constexpr,
                     ACT: gl.constexpr, LM_CTA: gl.constexpr):
    r = a1 + gl.arange(0, BR, layout=YL)
    mr = (r < a1 + a2) & (r < V)
    val = rnd(acc, ACT)
    gl.store(logits_ptr + r, val, mask=mr)
    vm = gl.where(mr, val, float("-inf"))
    bv = gl.max(vm, axis=0)
    br = gl.min(gl.where(mr & (vm == bv), r, V), axis=0)
    bits = bv.to(gl.int32, bitcast=True)
    ordered = gl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    key = (ordered.to(gl.int64) << 32) | (V - 1 - br).to(gl.int64)
    if not LM_CTA:
        gl.atomic_max(amax_ptr, key, sem="relaxed", scope="gpu")
    return key


# ---- the partitions -----------------------------------------------------------------------------------------
@gluon.jit
def _l2_lines(addr, ok):
    """``prefetch.global.L2`` of the 128-byte line at each int64 address ``addr`` where ``ok`` (int32) is nonzero."""
    gl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
        "=r,l,r", [addr, ok], dtype=gl.int32, is_pure=False, pack=1)


# NORM_W == 2: a normalised vector's weights (one row of H, 4 KB for the 1B in bf16: a few 128-byte lines) asked of L2
# by the consumer threads, one line each, before the dependency wait; staged after it they are L2 hits, not HBM reads
# queued behind the rings' loads (the stream evicts them between steps).
@gluon.jit
def _prefetch_row_l2(row_ptr, H: gl.constexpr, NW: gl.constexpr):
    ESIZE: gl.constexpr = row_ptr.dtype.element_ty.primitive_bitwidth // 8
    NL: gl.constexpr = (H * ESIZE + 127) // 128
    PL: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
    for base in gl.static_range(0, NL, 32 * NW):
        j = base + gl.arange(0, 32 * NW, layout=PL)
        ok = (j < NL).to(gl.int32)
        addr = (row_ptr + gl.minimum(j, NL - 1) * (128 // ESIZE)).to(gl.int64, bitcast=True)
        _l2_lines(addr, ok)


@gluon.jit
def _residual_matvec(src_ptr, xs, key, staged, eps, bufs, bufs_od, full, empty, it, i, K: gl.constexpr,
                     KCH: gl.constexpr, NCH: gl.constexpr, SN: gl.constexpr, NS: gl.constexpr, BR: gl.constexpr,
                     BRO: gl.constexpr, BK: gl.constexpr, VEC: gl.constexpr, TK: gl.constexpr, NW: gl.constexpr,
                     SPLIT: gl.constexpr, MV_MMA: gl.constexpr, MV_BITS: gl.constexpr, MV_AHEAD: gl.constexpr,
                     SB: gl.constexpr, TIMELINE: gl.constexpr):
    """The matvec of an O-proj or down task (their rows differ only in the input: the attention output, Q wide, or
    SwiGLU's, I wide): ``src`` (K,) staged into ``xs`` unless it holds it already (``staged`` == ``key``), then the
    task's BRO rows from the ring — by wgmma (``MV_MMA``), as two half-height boxes (``SPLIT`` 2) or one.
    Returns (acc (BRO,) float32, it, staged, the time after staging, the time after the matvec); the times are 0
    without ``TIMELINE``."""
    if key != staged:
        stage_vector(src_ptr, src_ptr, xs, eps, False, K, KCH, BK, VEC, TK, NW)
        staged = key
    t_staged = 0
    t_mv = 0
    if TIMELINE:
        t_staged = now(i)
    if MV_MMA:
        acc, _, it = mv_mma(bufs_od, full, empty, xs, it, SN, NS, BRO, BK, VEC, TK, NW, False)
    elif SPLIT == 2:
        acc, it = mv_halves(bufs, full, empty, xs, it, NCH, NS, BRO, BK, VEC, TK, NW, MV_BITS, MV_AHEAD, SB)
    else:
        acc, it = mv_single(bufs, full, empty, xs, it, NCH, NS, BR, BK, VEC, TK, NW, MV_BITS, MV_AHEAD, SB)
    if TIMELINE:
        t_mv = now(i)
    return acc, it, staged, t_staged, t_mv


@gluon.jit
def _consumer(ring, sched, model, acts, weights, gates, step, scales,
              H: gl.constexpr, Q: gl.constexpr, KV: gl.constexpr, I: gl.constexpr, V: gl.constexpr,
              D: gl.constexpr, G: gl.constexpr, GP: gl.constexpr, NKV: gl.constexpr, S_MAX: gl.constexpr,
              NSPLIT: gl.constexpr, MIN_CHUNK: gl.constexpr, NF: gl.constexpr, BR: gl.constexpr,
              BK: gl.constexpr, NS: gl.constexpr, NCH_H: gl.constexpr, NCH_Q: gl.constexpr, NCH_I: gl.constexpr,
              KCH_H: gl.constexpr, KCH_Q: gl.constexpr, KCH_I: gl.constexpr, VEC: gl.constexpr,
              TK: gl.constexpr, BLOCK_S: gl.constexpr, BLOCK_SPLIT: gl.constexpr, VD: gl.constexpr,
              TD: gl.constexpr, HAS_BIAS: gl.constexpr, TIMELINE: gl.constexpr, NW: gl.constexpr,
              SPLIT: gl.constexpr, IP: gl.constexpr, WAIT_PF: gl.constexpr, WAIT_PF_OPS: gl.constexpr,
              PF_LANES_C: gl.constexpr, WAIT_PF_LINE: gl.constexpr, QK_NORM: gl.constexpr, LM_CTA: gl.constexpr,
              ATTN_WARPS: gl.constexpr, SIG_GATE: gl.constexpr, ATTN_GATE: gl.constexpr, MV_BITS: gl.constexpr,
              ATTN_MMA: gl.constexpr, MMA_EARLY: gl.constexpr, MV_AHEAD: gl.constexpr, SB: gl.constexpr,
              NEW_ROW: gl.constexpr, COMBINE_LANES: gl.constexpr, MV_MMA: gl.constexpr, NORM_W: gl.constexpr,
              W_FP8: gl.constexpr, HEAD_FP8: gl.constexpr):
    """The consumer warps: each task of this CTA's row of the table in order — its dependency wait, its matvec
    from the ring's weight tiles (or attention), its epilogue and its signal. The runtime arguments come as the
    aggregates ``megakernel`` builds (see its docstring); the constexprs as before."""
    bufs, full, empty, xs = ring
    table_ptr, counts_ptr, max_tasks, state_ptr, counters_ptr, done_ptr, err_ptr, timeline_ptr, spin_cap = sched
    emb_ptr, fnorm_ptr, bqkv_ptr, anorm_ptr, mnorm_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, qknorm_ptr = model
    x_ptr, q_ptr, pm_ptr, pl_ptr, pacc_ptr, attn_ptr, act_ptr, logits_ptr, amax_ptr, knew_ptr = acts
    wqkv_ptr, wo_ptr, wgu_ptr, wdown_ptr, head_ptr = weights
    sigbar, ackbar = gates
    advance, tok_in, eps, sm_scale = step
    sqkv_ptr, so_ptr, sgu_ptr, sdown_ptr, slm_ptr = scales
    ACT: gl.constexpr = x_ptr.dtype.element_ty
    BRO: gl.constexpr = BR // SPLIT   # rows of an O-proj / down task
    HALF: gl.constexpr = D // 2
    HB: gl.constexpr = BR // 2
    LW: gl.constexpr = gl.BlockedLayout([1, VEC], [32 // TK, TK], [NW, 1], [1, 0])
    YL: gl.constexpr = gl.SliceLayout(1, LW)
    # MV_MMA: slot s of the ring as (128-byte boxes, rows, columns); O-proj / down slots hold SPLIT times the boxes
    SNH: gl.constexpr = (NCH_H + SB - 1) // SB
    SNO: gl.constexpr = (NCH_Q + SB * SPLIT - 1) // (SB * SPLIT)
    SND: gl.constexpr = (NCH_I + SB * SPLIT - 1) // (SB * SPLIT)
    bufs_od = bufs
    if MV_MMA:
        bufs_od = bufs._reinterpret(bufs.dtype, [NS, bufs.shape[1] * SPLIT, BRO, bufs.shape[3]], bufs.layout)
    pid = gl.program_id(0)
    pos = gl.load(state_ptr + 0)
    epoch = gl.load(state_ptr + 1)
    tok = tok_in
    if tok_in < 0:
        tok = gl.load(state_ptr + 2)
    tok = gl.minimum(gl.maximum(tok, 0), V - 1)  # a bad device-side id must not read out of bounds
    emb_row = emb_ptr + tok.to(gl.int64) * H
    n = gl.load(counts_ptr + pid)
    row = table_ptr + pid * max_tasks * NF
    it = 0            # ring slots consumed so far (the producer fills them in the same order)
    bad = 0           # a wait of this CTA expired: record it once, then stop waiting (but keep consuming)
    staged = -1       # layer·8 + opcode of the vector in xs
    known_cnt = -1    # counters only increase: a wait already satisfied needs no new atomic
    known_seen = 0
    sgc = 0           # gated tasks finished (SIG_GATE / ATTN_GATE: the producer waits on them in order)
    if LM_CTA:
        lm_best = pos.to(gl.int64) * 0 + AMAX_EMPTY  # the best greedy key of this CTA's LM-head tasks
    for i in range(n):
        op = gl.load(row + F_OP)
        layer = gl.load(row + F_LAYER)
        a1 = gl.load(row + F_A1)
        a2 = gl.load(row + F_A2)
        wait_cnt = gl.load(row + F_WAIT)
        if TIMELINE:
            t_start = now(i)
        # What a QKV task's epilogue reads that no task writes (RoPE cos/sin at pos, the q/k/v bias) is loaded
        # before its dependency wait: one memory round trip less on the layer's chain (masked off for other ops)
        pj = a1 + gl.arange(0, HB, layout=YL)
        pmask = (op == OP_QKV) & (pj < a1 + a2)
        rope_m = pmask & (not QK_NORM)
        rope_c = gl.load(cos_ptr + pos * HALF + pj % HALF, mask=rope_m, other=0.0).to(ACT).to(gl.float32)
        rope_s = gl.load(sin_ptr + pos * HALF + pj % HALF, mask=rope_m, other=0.0).to(ACT).to(gl.float32)
        bias_m = pmask & HAS_BIAS  # packed like the rows: pair j's rows are 2·a1 + (j − a1) and that + HB
        brow = layer.to(gl.int64) * (Q + 2 * KV) + 2 * a1 + (pj - a1)
        bias_lo = gl.load(bqkv_ptr + brow, mask=bias_m, other=0.0).to(gl.float32)
        bias_hi = gl.load(bqkv_ptr + brow + HB, mask=bias_m, other=0.0).to(gl.float32)
        if W_FP8:  # a QKV or gate-up tile's row scales, never written either: before the wait, as the bias
            srow = 2 * a1 + (pj - a1)  # the packed rows of the tile's first half (its second: + HB)
            gu_m = (op == OP_GATEUP) & (pj < a1 + a2)
            sq_base = sqkv_ptr + layer.to(gl.int64) * (Q + 2 * KV) + srow
            sg_base = sgu_ptr + layer.to(gl.int64) * (2 * IP) + srow
            s_lo = (gl.load(sq_base, mask=pmask, other=0.0) + gl.load(sg_base, mask=gu_m, other=0.0))
            s_hi = (gl.load(sq_base + HB, mask=pmask, other=0.0) + gl.load(sg_base + HB, mask=gu_m, other=0.0))
        skip = 0
        if op == OP_ATTN:  # splits beyond this position's non-empty ones read and write nothing
            if a2 >= splits_used(pos, NSPLIT, MIN_CHUNK):
                skip = 1
                wait_cnt = -1
        if (wait_cnt >= 0) & (bad == 0) & (op != OP_ATTN):  # attention waits inside, after its first loads
            need = gl.load(row + F_NEED)
            target = epoch * gl.load(row + F_INC) + need
            if (wait_cnt != known_cnt) | (known_seen < target):
                if WAIT_PF > 0:
                    if ((WAIT_PF_OPS >> op) & 1) != 0:
                        _prefetch_past_ring(row, i, n, wqkv_ptr, wo_ptr, wgu_ptr, wdown_ptr, head_ptr, NF, H, Q, KV,
                                            I, IP, BR, BK * SB, NS, (NCH_H + SB - 1) // SB, (NCH_Q + SB - 1) // SB,
                                            (NCH_I + SB - 1) // SB, SPLIT, WAIT_PF, PF_LANES_C, NW, WAIT_PF_LINE)
                if NORM_W == 2:  # the norm weights of the vector staged after this wait, into L2 meanwhile
                    if (op == OP_QKV) | (op == OP_GATEUP) | (op == OP_LMHEAD):
                        nrow = fnorm_ptr
                        if op == OP_QKV:
                            nrow = anorm_ptr + layer.to(gl.int64) * H
                        elif op == OP_GATEUP:
                            nrow = mnorm_ptr + layer.to(gl.int64) * H
                        _prefetch_row_l2(nrow, H, NW)
                seen = spin(counters_ptr + wait_cnt, target, spin_cap)
                gl.thread_barrier()
                known_cnt = wait_cnt
                known_seen = seen
                if seen < target:
                    _record_stuck(err_ptr, op, layer, gl.load(row + F_TILE), pid, wait_cnt, seen - (target - need),
                                  need, gl.load(row + F_GIDX))
                    bad = 1
        if TIMELINE:
            t_ready = now(i)
            t_staged = t_ready
            t_mv = t_ready
        key = layer * 8 + op
        if op == OP_ATTN:
            if skip == 0:
                need = gl.load(row + F_NEED)
                target = epoch * gl.load(row + F_INC) + need
                if ATTN_MMA:
                    seen, t_attn, t_math, t_ticket, t_staged, t_mv = attention_mma(
                        layer, gl.load(row + F_A0), a2, pos, sm_scale, gl.load(row + F_TICKET), gl.load(row + F_SIGNAL),
                        counters_ptr + gl.maximum(wait_cnt, 0), target, (wait_cnt >= 0) & (bad == 0), spin_cap,
                        counters_ptr, q_ptr, kc_ptr, vc_ptr, pm_ptr, pl_ptr, pacc_ptr, attn_ptr, D, G, GP, NKV, S_MAX,
                        NSPLIT, MIN_CHUNK, BLOCK_S, BLOCK_SPLIT, VD, TD, NW, TIMELINE, knew_ptr, qknorm_ptr, cos_ptr,
                        sin_ptr, eps, QK_NORM, MMA_EARLY, NEW_ROW, COMBINE_LANES)
                elif ATTN_WARPS:
                    seen, t_attn, t_math, t_ticket, t_staged, t_mv = attention_warps(
                        layer, gl.load(row + F_A0), a2, pos, sm_scale, gl.load(row + F_TICKET), gl.load(row + F_SIGNAL),
                        counters_ptr + gl.maximum(wait_cnt, 0), target, (wait_cnt >= 0) & (bad == 0), spin_cap,
                        counters_ptr, q_ptr, kc_ptr, vc_ptr, pm_ptr, pl_ptr, pacc_ptr, attn_ptr, D, G, GP, NKV, S_MAX,
                        NSPLIT, MIN_CHUNK, BLOCK_S, BLOCK_SPLIT, VD, TD, NW, TIMELINE, NEW_ROW, COMBINE_LANES)
                else:
                    seen, t_attn, t_math, t_ticket, t_staged, t_mv = attention(
                        layer, gl.load(row + F_A0), a2, pos, sm_scale, gl.load(row + F_TICKET), gl.load(row + F_SIGNAL),
                        counters_ptr + gl.maximum(wait_cnt, 0), target, (wait_cnt >= 0) & (bad == 0), spin_cap,
                        counters_ptr, q_ptr, kc_ptr, vc_ptr, pm_ptr, pl_ptr, pacc_ptr, attn_ptr, D, G, GP, NKV, S_MAX,
                        NSPLIT, MIN_CHUNK, BLOCK_S, BLOCK_SPLIT, VD, TD, NW, TIMELINE, knew_ptr, qknorm_ptr, cos_ptr,
                        sin_ptr, eps, QK_NORM, COMBINE_LANES)
                if TIMELINE:  # an attention task has no weight loads: its producer stamps hold two phases
                    t_ready = t_attn
                    aslot = timeline_ptr + (pid * max_tasks + i).to(gl.int64) * STAMPS
                    gl.store(aslot + 3, t_math)
                    gl.store(aslot + 4, t_ticket)
                if seen < target:
                    _record_stuck(err_ptr, op, layer, gl.load(row + F_TILE), pid, wait_cnt, seen - (target - need),
                                  need, gl.load(row + F_GIDX))
                    bad = 1
        elif op == OP_QKV:
            if key != staged:
                if layer == 0:  # layer 0 normalises the token's embedding row (no embedding task)
                    stage_vector(emb_row, anorm_ptr, xs, eps, True, H, KCH_H, BK, VEC, TK, NW, NORM_W >= 1)
                else:
                    stage_vector(x_ptr, anorm_ptr + layer.to(gl.int64) * H, xs, eps, True, H, KCH_H, BK, VEC,
                                  TK, NW, NORM_W >= 1)
                staged = key
            if TIMELINE:
                t_staged = now(i)
            if MV_MMA:
                acc_lo, acc_hi, it = mv_mma(bufs, full, empty, xs, it, SNH, NS, HB, BK, VEC, TK, NW, True)
            else:
                acc_lo, acc_hi, it = mv_pair(bufs, full, empty, xs, it, NCH_H, NS, HB, BK, VEC, TK, NW,
                                             MV_BITS, MV_AHEAD, SB)
            if TIMELINE:
                t_mv = now(i)
            if W_FP8:
                acc_lo = acc_lo * s_lo
                acc_hi = acc_hi * s_hi
            _qkv_epilogue(acc_lo + bias_lo, acc_hi + bias_hi, layer, a1, a2, pos, rope_c, rope_s, q_ptr, kc_ptr,
                          vc_ptr, Q, KV, D, NKV, S_MAX, HB, YL, knew_ptr, QK_NORM)
        elif op == OP_GATEUP:
            if key != staged:
                stage_vector(x_ptr, mnorm_ptr + layer.to(gl.int64) * H, xs, eps, True, H, KCH_H, BK, VEC, TK, NW, NORM_W >= 1)
                staged = key
            if TIMELINE:
                t_staged = now(i)
            if MV_MMA:
                acc_g, acc_u, it = mv_mma(bufs, full, empty, xs, it, SNH, NS, HB, BK, VEC, TK, NW, True)
            else:
                acc_g, acc_u, it = mv_pair(bufs, full, empty, xs, it, NCH_H, NS, HB, BK, VEC, TK, NW, MV_BITS,
                                           MV_AHEAD, SB)
            if TIMELINE:
                t_mv = now(i)
            j = a1 + gl.arange(0, HB, layout=YL)
            mj = (j < a1 + a2) & (j < I)
            if W_FP8:
                acc_g = acc_g * s_lo
                acc_u = acc_u * s_hi
            g = rnd(acc_g, ACT)
            u = rnd(acc_u, ACT)
            silu = rnd(g / (1.0 + gl.exp(-g)), ACT)
            gl.store(act_ptr + j, (silu * u).to(ACT), mask=mj)
        elif op == OP_OPROJ:
            # the residual rows are issued before the staging load so the two L2 round trips overlap (both
            # inputs are final once the wait above is met); it is one round trip less on the layer's chain
            r = a1 + gl.arange(0, BRO, layout=YL)
            mr = r < a1 + a2
            if layer == 0:  # layer 0's residual is the embedding row (x is not written yet)
                res = gl.load(emb_row + r, mask=mr, other=0.0).to(gl.float32)
            else:
                res = gl.load(x_ptr + r, mask=mr, other=0.0, cache_modifier=".cg").to(gl.float32)
            if W_FP8:  # the rows' scales, in the residual's round trip
                sc = gl.load(so_ptr + layer.to(gl.int64) * H + r, mask=mr, other=0.0)
            acc, it, staged, ts, tm = _residual_matvec(attn_ptr, xs, key, staged, eps, bufs, bufs_od, full, empty, it,
                                                       i, Q, KCH_Q, NCH_Q, SNO, NS, BR, BRO, BK, VEC, TK, NW, SPLIT,
                                                       MV_MMA, MV_BITS, MV_AHEAD, SB, TIMELINE)
            if TIMELINE:
                t_staged = ts
                t_mv = tm
            if W_FP8:
                acc = acc * sc
            gl.store(x_ptr + r, (res + rnd(acc, ACT)).to(ACT), mask=mr)
        elif op == OP_DOWN:
            r = a1 + gl.arange(0, BRO, layout=YL)  # residual first, as in OPROJ
            mr = r < a1 + a2
            res = gl.load(x_ptr + r, mask=mr, other=0.0, cache_modifier=".cg").to(gl.float32)
            if W_FP8:
                sc = gl.load(sdown_ptr + layer.to(gl.int64) * H + r, mask=mr, other=0.0)
            acc, it, staged, ts, tm = _residual_matvec(act_ptr, xs, key, staged, eps, bufs, bufs_od, full, empty, it,
                                                       i, I, KCH_I, NCH_I, SND, NS, BR, BRO, BK, VEC, TK, NW, SPLIT,
                                                       MV_MMA, MV_BITS, MV_AHEAD, SB, TIMELINE)
            if TIMELINE:
                t_staged = ts
                t_mv = tm
            if W_FP8:
                acc = acc * sc
            gl.store(x_ptr + r, (res + rnd(acc, ACT)).to(ACT), mask=mr)
        elif op == OP_LMHEAD:
            if HEAD_FP8:
                rl = a1 + gl.arange(0, BR, layout=YL)
                sc = gl.load(slm_ptr + rl, mask=(rl < a1 + a2) & (rl < V), other=0.0)
            if key != staged:
                stage_vector(x_ptr, fnorm_ptr, xs, eps, True, H, KCH_H, BK, VEC, TK, NW, NORM_W >= 1)
                staged = key
            if TIMELINE:
                t_staged = now(i)
            if MV_MMA:
                if W_FP8 != HEAD_FP8:  # a 16-bit head among FP8 boxes: 128 bytes are half the columns, twice the slots
                    hd = bufs._reinterpret(ACT, [NS, bufs.shape[1], BR, bufs.shape[3] // 2],
                                           gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=3))
                    acc, _, it = mv_mma(hd, full, empty, xs, it, (2 * NCH_H + SB - 1) // SB, NS, BR, BK, VEC, TK, NW,
                                        False)
                else:
                    acc, _, it = mv_mma(bufs, full, empty, xs, it, SNH, NS, BR, BK, VEC, TK, NW, False)
            elif W_FP8 != HEAD_FP8:  # a 16-bit head in a ring of FP8 boxes: half as many columns per box
                acc, it = mv_half_boxes(bufs, full, empty, xs, it, NCH_H, NS, BR, BK, VEC, TK, NW, MV_AHEAD, SB)
            else:
                acc, it = mv_single(bufs, full, empty, xs, it, NCH_H, NS, BR, BK, VEC, TK, NW, MV_BITS, MV_AHEAD, SB)
            if TIMELINE:
                t_mv = now(i)
            if HEAD_FP8:
                acc = acc * sc
            lm_key = _lmhead_epilogue(acc, a1, a2, logits_ptr, amax_ptr, V, BR, YL, ACT, LM_CTA)
            if LM_CTA:
                lm_best = gl.maximum(lm_best, lm_key)
        amount = gl.load(row + F_SIGINC)
        if amount > 0:  # the CTA's last task of its run of one stage signals for the whole run
            gl.thread_barrier()
            gl.atomic_add(counters_ptr + gl.load(row + F_SIGNAL), amount, sem="release", scope="gpu")
            if SIG_GATE >= 0:
                if op != OP_ATTN:  # the producer may issue the next tiles (see _producer)
                    sgc = _gate_arrive(sigbar, ackbar, sgc)
        if ATTN_GATE >= 0:
            if (op == OP_ATTN) & (skip == 0):
                sgc = _gate_arrive(sigbar, ackbar, sgc)
        if TIMELINE:
            t_end = now(i)
            slot = timeline_ptr + (pid * max_tasks + i).to(gl.int64) * STAMPS
            gl.store(slot + 0, t_start)
            gl.store(slot + 1, t_ready)
            gl.store(slot + 2, t_end)
            gl.store(slot + 5, t_staged)  # attention: q in registers, the block loop done (0 when skipped)
            gl.store(slot + 6, t_mv)
        row += NF
    if bad != 0:
        gl.store(err_ptr + 10, 1)
    if LM_CTA:
        if lm_best != AMAX_EMPTY:  # before the done count's release: the last CTA reads amax after it
            gl.atomic_max(amax_ptr, lm_best, sem="relaxed", scope="gpu")
    gl.thread_barrier()
    finished = gl.atomic_add(done_ptr, 1, sem="acq_rel", scope="gpu")
    if finished == gl.num_programs(0) - 1:  # the last CTA: everyone has read the state
        gl.atomic_xchg(done_ptr, 0, sem="relaxed", scope="gpu")
        if advance != 0:
            gl.store(state_ptr + 0, pos + 1)
            gl.store(state_ptr + 1, epoch + 1)
            key64 = gl.atomic_xchg(amax_ptr, AMAX_EMPTY, sem="acq_rel", scope="gpu")
            best = (V - 1 - (key64 - ((key64 >> 32) << 32))).to(gl.int32)
            gl.store(state_ptr + 2, best)
            gl.store(state_ptr + 3, best)
            gl.store(err_ptr + 15, best)


@gluon.jit
def _load_od(desc, row0, c, bar, slot_buf, BR: gl.constexpr, BK: gl.constexpr, SPLIT: gl.constexpr):
    """One O-proj / down slot: with SPLIT = 2 two [BR/2, BK] boxes, columns of chunks 2c and 2c + 1 (a box past
    K is zero-filled by TMA); else one [BR, BK] box."""
    if SPLIT == 2:
        tma.async_copy_global_to_shared(desc, [row0, (2 * c) * BK], bar, slot_buf.slice(0, BR // 2, dim=0))
        tma.async_copy_global_to_shared(desc, [row0, (2 * c + 1) * BK], bar, slot_buf.slice(BR // 2, BR // 2, dim=0))
    else:
        tma.async_copy_global_to_shared(desc, [row0, c * BK], bar, slot_buf)


@gluon.jit
def _load_mma(op, wqkv_desc, wo_desc, wgu_desc, wdown_desc, head_desc, row0, c, bar, bufs_mk, bufs_od, bufs_hd,
              slot, NBX: gl.constexpr, SPLIT: gl.constexpr):
    """Slot ``c`` of a task for the tensor-core matvec: its NBX 128-byte boxes [BR, MB] (MB = 64 bf16 / 128 FP8
    columns), global columns ``[(c·NBX + q)·MB, +MB)`` into ring box ``slot·NBX + q`` (O-proj / down: NBX·SPLIT
    boxes [BR / SPLIT, MB], ``c·NBX·SPLIT + q`` into ``slot·NBX·SPLIT + q``: the slot's SB pairs of column chunks
    with SPLIT = 2; the LM head: boxes of its own type, 128 bytes wide, into ``bufs_hd``); columns past K are
    zero-filled by TMA."""
    MB: gl.constexpr = bufs_mk.shape[2]
    HB: gl.constexpr = bufs_hd.shape[2]
    if (op == OP_OPROJ) | (op == OP_DOWN):
        for q in gl.static_range(NBX * SPLIT):
            od = bufs_od.index(slot * (NBX * SPLIT) + q)
            if op == OP_OPROJ:
                tma.async_copy_global_to_shared(wo_desc, [row0, (c * NBX * SPLIT + q) * MB], bar, od)
            else:
                tma.async_copy_global_to_shared(wdown_desc, [row0, (c * NBX * SPLIT + q) * MB], bar, od)
    elif op == OP_LMHEAD:
        for q in gl.static_range(NBX):
            tma.async_copy_global_to_shared(head_desc, [row0, (c * NBX + q) * HB], bar, bufs_hd.index(slot * NBX + q))
    else:
        for q in gl.static_range(NBX):
            mk = bufs_mk.index(slot * NBX + q)
            if op == OP_QKV:
                tma.async_copy_global_to_shared(wqkv_desc, [row0, (c * NBX + q) * MB], bar, mk)
            else:
                tma.async_copy_global_to_shared(wgu_desc, [row0, (c * NBX + q) * MB], bar, mk)


@gluon.jit
def _task_tiles(op, NCH_H: gl.constexpr, NCH_Q: gl.constexpr, NCH_I: gl.constexpr, SPLIT: gl.constexpr):
    """Ring slots of a task: 0 for attention (no weights), else its column chunks (paired under SPLIT = 2); the
    producer passes chunk counts already divided by the boxes per slot (SB)."""
    nch = NCH_H
    if op == OP_ATTN:
        nch = 0
    elif op == OP_OPROJ:
        nch = (NCH_Q + SPLIT - 1) // SPLIT
    elif op == OP_DOWN:
        nch = (NCH_I + SPLIT - 1) // SPLIT
    return nch


@gluon.jit
def _cursor_next(prow, pi, pc, n, NF: gl.constexpr, NCH_H: gl.constexpr, NCH_Q: gl.constexpr,
                 NCH_I: gl.constexpr, SPLIT: gl.constexpr):
    """Advance an (task row, task index, tile) cursor over the CTA's weight tiles by one tile."""
    pc += 1
    while (pi < n) & (pc >= _task_tiles(gl.load(prow + F_OP, mask=pi < n, other=0), NCH_H, NCH_Q, NCH_I, SPLIT)):
        pi += 1
        prow += NF
        pc = 0
    return prow, pi, pc


@gluon.jit
def _l2_prefetch_tile(prow, pc, wqkv_ptr, wo_ptr, wgu_ptr, wdown_ptr, head_ptr, H: gl.constexpr, Q: gl.constexpr,
                      KV: gl.constexpr, I: gl.constexpr, IP: gl.constexpr, BR: gl.constexpr, BK: gl.constexpr,
                      SPLIT: gl.constexpr, LANES: gl.constexpr, WARPS: gl.constexpr, LINE: gl.constexpr = False):
    """L2 prefetch of one ring slot (``BK``: its columns per row, SB boxes' worth). ``LINE`` False:
    ``cp.async.bulk.prefetch.L2`` per row (PTX ISA 8.0, sm_90: 16-byte aligned address and size), ``LANES`` (a
    power of two >= BR) row slots over the calling partition's ``WARPS`` warps, columns past K clipped, slots past
    the tile's rows predicated off; it goes through the SM's TMA unit. ``LINE`` True: ``prefetch.global.L2`` per
    128-byte line from the load/store units (one line per slot of ``BR·BK·bytes/128``), which leaves the TMA queue
    to the ring's loads."""
    PL: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    ESIZE: gl.constexpr = wqkv_ptr.dtype.element_ty.primitive_bitwidth // 8
    op = gl.load(prow + F_OP)
    layer = gl.load(prow + F_LAYER).to(gl.int64)
    a1 = gl.load(prow + F_A1)
    j = gl.arange(0, LANES, layout=PL)
    rows = BR
    cols = BK
    c0 = pc * BK
    K = H
    base = head_ptr + a1.to(gl.int64) * H
    if op == OP_QKV:
        base = wqkv_ptr + (layer * (Q + 2 * KV) + 2 * a1) * H
    elif op == OP_GATEUP:
        base = wgu_ptr + (layer * (2 * IP) + 2 * a1) * H
    elif op == OP_OPROJ:
        K = Q
        rows = BR // SPLIT
        cols = BK * SPLIT
        c0 = pc * BK * SPLIT
        base = wo_ptr + (layer * H + a1) * Q
    elif op == OP_DOWN:
        K = I
        rows = BR // SPLIT
        cols = BK * SPLIT
        c0 = pc * BK * SPLIT
        base = wdown_ptr + (layer * H + a1) * I
    if LINE:
        NL: gl.constexpr = BR * BK * ESIZE // 128
        LE: gl.constexpr = 128 // ESIZE  # elements per line
        jl = gl.arange(0, NL, layout=PL)
        lpr = cols // LE  # lines per tile row
        r = jl // lpr
        col = c0 + (jl % lpr) * LE
        ok = ((r < rows) & (col < K)).to(gl.int32)
        _l2_lines((base + r.to(gl.int64) * K + col).to(gl.int64, bitcast=True), ok)
    else:
        size = gl.where(j < rows, gl.minimum(cols, K - c0), 0) * ESIZE
        addr = (base + j.to(gl.int64) * K + c0).to(gl.int64, bitcast=True)
        gl.inline_asm_elementwise(
            "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r", [addr, size], dtype=gl.int32, is_pure=False, pack=1)


# While a consumer waits on its inputs, the producer can only run a ring ahead (NS tiles); once the ring is full
# HBM idles for the rest of the wait (the attention chain: ~7.5 µs per layer against ~5 µs of ring, NOTES.md).
# So the waiting consumer asks L2 for the WAIT_PF tiles just past the ring's horizon (tile ``it + NS`` on, where
# ``it`` is the first tile of task i): when the producer reaches them they are L2 hits.
@gluon.jit
def _prefetch_past_ring(row, i, n, wqkv_ptr, wo_ptr, wgu_ptr, wdown_ptr, head_ptr, NF: gl.constexpr,
                        H: gl.constexpr, Q: gl.constexpr, KV: gl.constexpr, I: gl.constexpr, IP: gl.constexpr,
                        BR: gl.constexpr, BK: gl.constexpr, NS: gl.constexpr, NCH_H: gl.constexpr,
                        NCH_Q: gl.constexpr, NCH_I: gl.constexpr, SPLIT: gl.constexpr, WAIT_PF: gl.constexpr,
                        LANES: gl.constexpr, WARPS: gl.constexpr, LINE: gl.constexpr):
    prow = row
    pi = i
    pc = -1
    for _ in range(NS + 1):
        prow, pi, pc = _cursor_next(prow, pi, pc, n, NF, NCH_H, NCH_Q, NCH_I, SPLIT)
    for _ in range(WAIT_PF):
        if pi < n:
            _l2_prefetch_tile(prow, pc, wqkv_ptr, wo_ptr, wgu_ptr, wdown_ptr, head_ptr, H, Q, KV, I, IP, BR, BK,
                              SPLIT, LANES, WARPS, LINE)
            prow, pi, pc = _cursor_next(prow, pi, pc, n, NF, NCH_H, NCH_Q, NCH_I, SPLIT)


# ---- the gate between consumer and producer (SIG_GATE, ATTN_GATE) -------------------------------------------
# The consumer arrives once per gated task it finishes, in queue order, on sigbar[k % 2]; the producer waits for
# each in the same order and then arrives on ackbar[k % 2]. Before its arrival k the consumer waits for the ack of
# k − 2, so it can never lap a phase the producer has not waited for yet (an attention task has no tiles, so the
# ring alone does not keep the two sides within two gated tasks). That wait always ends: the producer waits for
# k − 2 at the latest at gated task k − 1, and every tile before task k has been consumed by then.
@gluon.jit
def _gate_arrive(sigbar, ackbar, k):
    if k >= 2:
        mbarrier.wait(ackbar.index(k & 1), ((k - 2) >> 1) & 1)
    mbarrier.arrive(sigbar.index(k & 1))
    return k + 1


@gluon.jit
def _gate_wait(sigbar, ackbar, k):
    mbarrier.wait(sigbar.index(k & 1), (k >> 1) & 1)
    mbarrier.arrive(ackbar.index(k & 1))
    return k + 1


@gluon.jit
def _producer(descs, ring, sched, weights, gates,
              H: gl.constexpr, Q: gl.constexpr, KV: gl.constexpr, IP: gl.constexpr, NF: gl.constexpr,
              BR: gl.constexpr, BK: gl.constexpr, NS: gl.constexpr, NCH_H: gl.constexpr, NCH_Q: gl.constexpr,
              NCH_I: gl.constexpr, PREFETCH: gl.constexpr, TIMELINE: gl.constexpr, SPLIT: gl.constexpr,
              I: gl.constexpr, L2_AHEAD: gl.constexpr, PF_LANES_P: gl.constexpr, SIG_GATE: gl.constexpr,
              ATTN_GATE: gl.constexpr, NSPLIT: gl.constexpr, MIN_CHUNK: gl.constexpr, SB: gl.constexpr,
              MV_MMA: gl.constexpr, INFLIGHT: gl.constexpr, TMA_EVICT: gl.constexpr, W_FP8: gl.constexpr,
              HEAD_FP8: gl.constexpr):
    wqkv_desc, wo_desc, wgu_desc, wdown_desc, head_desc = descs
    bufs, full, empty, _ = ring
    table_ptr, counts_ptr, max_tasks, state_ptr, counters_ptr, _, _, timeline_ptr, spin_cap = sched
    wqkv_ptr, wo_ptr, wgu_ptr, wdown_ptr, head_ptr = weights
    sigbar, ackbar = gates
    TILE_BYTES: gl.constexpr = SB * BR * BK * wqkv_desc.dtype.primitive_bitwidth // 8  # one ring slot: SB boxes
    # MV_MMA: a slot is NBX boxes [BR, MB] (O-proj / down: NBX·SPLIT boxes [BR / SPLIT, MB]), the ring's rows of
    # 128 bytes (MB = 64 bf16 / 128 FP8 columns) in the descriptors' 128-byte swizzle (see matvec.mv_mma); a 16-bit
    # head among FP8 boxes: the same bytes as [BR, MB / 2] 16-bit boxes
    MB: gl.constexpr = 1024 // wqkv_desc.dtype.primitive_bitwidth
    NBX: gl.constexpr = SB * BK // MB
    bufs_mk = bufs
    bufs_od = bufs
    bufs_hd = bufs
    if MV_MMA:
        bufs_mk = bufs._reinterpret(bufs.dtype, [NS * NBX, BR, MB], wqkv_desc.layout)
        bufs_od = bufs._reinterpret(bufs.dtype, [NS * NBX * SPLIT, BR // SPLIT, MB], wqkv_desc.layout)
        bufs_hd = bufs._reinterpret(head_desc.dtype, [NS * NBX, BR, 1024 // head_desc.dtype.primitive_bitwidth],
                                    head_desc.layout)
    # slots per task of each K (a slot holds SB boxes of consecutive column chunks, or pairs of them with SPLIT)
    SNH: gl.constexpr = (NCH_H + SB - 1) // SB
    SNQ: gl.constexpr = (NCH_Q + SB - 1) // SB
    SNI: gl.constexpr = (NCH_I + SB - 1) // SB
    NROWS: gl.constexpr = Q + 2 * KV
    GATED: gl.constexpr = (SIG_GATE >= 0) | (ATTN_GATE >= 0)
    pid = gl.program_id(0)
    if TMA_EVICT:  # the PTX's mark for gluon.ptx.tma_l2_evict_first (its TMA loads get an L2 evict_first policy)
        gl.inline_asm_elementwise(MARK_ASM, "=r,r", [pid], dtype=gl.int32, is_pure=False, pack=1)
    pos = gl.load(state_ptr + 0)
    epoch = gl.load(state_ptr + 1)
    n = gl.load(counts_ptr + pid)
    row = table_ptr + pid * max_tasks * NF
    it = 0
    bad = 0
    # L2 look-ahead cursor (task row, task index, tile): L2_AHEAD tiles ahead of the ring's next tile
    prow = row
    pi = 0
    pc = -1
    # SIG_GATE >= 0: after the tiles of a weight task that signals (a stage's last task on this CTA), at most
    # SIG_GATE more tiles are issued before the consumer has signalled: the signal's release waits for the
    # CTA's stores, and those queue behind this SM's weight loads in flight (phase stamps: a signalling gate-up
    # task's epilogue 3.7 µs, 0.22 µs without the signal; benchmarks/results/h200-2026-12-01-s6/phases_*.json)
    # ATTN_GATE >= 0: the same after an attention task that runs, until the consumer has finished it (its loads,
    # tickets and stores are the layer's chain, and would queue behind the tiles issued meanwhile)
    pend = 0   # a gated task is passed (a signalling weight task's tiles all issued), its end not yet waited for
    sgw = 0    # gated tasks waited for (the mbarriers' phases)
    since = 0  # tiles issued since
    lim = pos * 0 + SIG_GATE  # the allowance of the pending task (a runtime value: loop-carried)
    if L2_AHEAD > 0:
        prow, pi, pc = _cursor_next(prow, pi, pc, n, NF, SNH, SNQ, SNI, SPLIT)
        for _ in range(L2_AHEAD):
            prow, pi, pc = _cursor_next(prow, pi, pc, n, NF, SNH, SNQ, SNI, SPLIT)
    for i in range(n):
        op = gl.load(row + F_OP)
        if op != OP_ATTN:
            layer = gl.load(row + F_LAYER)
            a1 = gl.load(row + F_A1)
            if PREFETCH == 0:  # pipelining off: load a task's weights only once its inputs are ready
                wait_cnt = gl.load(row + F_WAIT)
                if (wait_cnt >= 0) & (bad == 0):
                    target = epoch * gl.load(row + F_INC) + gl.load(row + F_NEED)
                    if spin(counters_ptr + wait_cnt, target, spin_cap) < target:
                        bad = 1  # the consumer records it; just stop waiting
            nch = SNH
            row0 = a1
            if op == OP_QKV:
                row0 = layer * NROWS + 2 * a1
            elif op == OP_OPROJ:
                nch = (SNQ + SPLIT - 1) // SPLIT
                row0 = layer * H + a1
            elif op == OP_GATEUP:
                row0 = layer * (2 * IP) + 2 * a1
            elif op == OP_DOWN:
                nch = (SNI + SPLIT - 1) // SPLIT
                row0 = layer * H + a1
            elif W_FP8 != HEAD_FP8:  # a 16-bit head among FP8 boxes: boxes of BK / 2 columns, twice as many
                nch = (2 * NCH_H + SB - 1) // SB
            for c in range(nch):
                if GATED:
                    if (pend != 0) & (since >= lim):
                        sgw = _gate_wait(sigbar, ackbar, sgw)
                        pend = 0
                slot = it % NS
                mbarrier.wait(empty.index(slot), ((it // NS) & 1) ^ 1)
                if INFLIGHT > 0:
                    # at most INFLIGHT slots requested and not landed: tile it - INFLIGHT must have landed (its
                    # phase of `full`; TMA loads always complete, so this wait cannot hang)
                    if it >= INFLIGHT:
                        mbarrier.wait(full.index((it - INFLIGHT) % NS), ((it - INFLIGHT) // NS) & 1)
                if TIMELINE:
                    if c == 0:
                        gl.store(timeline_ptr + (pid * max_tasks + i).to(gl.int64) * STAMPS + 3, now(c))
                mbarrier.expect(full.index(slot), TILE_BYTES)
                if MV_MMA:
                    _load_mma(op, wqkv_desc, wo_desc, wgu_desc, wdown_desc, head_desc, row0, c, full.index(slot),
                              bufs_mk, bufs_od, bufs_hd, slot, NBX, SPLIT)
                for j in gl.static_range(SB * (1 - MV_MMA)):  # box j: chunk SB·c + j (a pair of chunks with SPLIT)
                    b = SB * c + j
                    box = bufs.index(slot * SB + j)
                    if op == OP_QKV:
                        tma.async_copy_global_to_shared(wqkv_desc, [row0, b * BK], full.index(slot), box)
                    elif op == OP_OPROJ:
                        _load_od(wo_desc, row0, b, full.index(slot), box, BR, BK, SPLIT)
                    elif op == OP_GATEUP:
                        tma.async_copy_global_to_shared(wgu_desc, [row0, b * BK], full.index(slot), box)
                    elif op == OP_DOWN:
                        _load_od(wdown_desc, row0, b, full.index(slot), box, BR, BK, SPLIT)
                    elif W_FP8 != HEAD_FP8:  # the same bytes as an FP8 box
                        hbox = box._reinterpret(head_desc.dtype, [BR, BK // 2], head_desc.layout)
                        tma.async_copy_global_to_shared(head_desc, [row0, b * (BK // 2)], full.index(slot), hbox)
                    else:
                        tma.async_copy_global_to_shared(head_desc, [row0, b * BK], full.index(slot), box)
                if L2_AHEAD > 0:
                    if pi < n:
                        _l2_prefetch_tile(prow, pc, wqkv_ptr, wo_ptr, wgu_ptr, wdown_ptr, head_ptr, H, Q, KV, I, IP,
                                          BR, BK * SB, SPLIT, PF_LANES_P, 1)
                        prow, pi, pc = _cursor_next(prow, pi, pc, n, NF, SNH, SNQ, SNI, SPLIT)
                it += 1
                since += 1
            if TIMELINE:
                gl.store(timeline_ptr + (pid * max_tasks + i).to(gl.int64) * STAMPS + 4, now(i))
            if SIG_GATE >= 0:
                if gl.load(row + F_SIGINC) > 0:
                    # two gated tasks within the allowance: the first is waited for now (phases: see _gate_arrive)
                    if pend != 0:
                        sgw = _gate_wait(sigbar, ackbar, sgw)
                    pend = 1
                    since = 0
                    lim = pos * 0 + SIG_GATE
        elif ATTN_GATE >= 0:
            if gl.load(row + F_A2) < splits_used(pos, NSPLIT, MIN_CHUNK):  # as the consumer skips empty splits
                if pend != 0:
                    sgw = _gate_wait(sigbar, ackbar, sgw)
                pend = 1
                since = 0
                lim = pos * 0 + ATTN_GATE
        row += NF


@gluon.jit(do_not_specialize=["max_tasks", "spin_cap", "advance", "tok_in"])
def megakernel(
        wqkv_desc, wo_desc, wgu_desc, wdown_desc, head_desc, sched, max_tasks, spin_cap, advance, tok_in,
        model, acts, weights, eps, sm_scale,
        H: gl.constexpr, Q: gl.constexpr, KV: gl.constexpr, I: gl.constexpr, IP: gl.constexpr, V: gl.constexpr,
        D: gl.constexpr, G: gl.constexpr, GP: gl.constexpr, NKV: gl.constexpr, S_MAX: gl.constexpr,
        NSPLIT: gl.constexpr, MIN_CHUNK: gl.constexpr, NF: gl.constexpr, BR: gl.constexpr, BK: gl.constexpr,
        NS: gl.constexpr, NCH_H: gl.constexpr, NCH_Q: gl.constexpr, NCH_I: gl.constexpr, KCH_H: gl.constexpr,
        KCH_Q: gl.constexpr, KCH_I: gl.constexpr, KCH: gl.constexpr, VEC: gl.constexpr, TK: gl.constexpr,
        BLOCK_S: gl.constexpr, BLOCK_SPLIT: gl.constexpr, VD: gl.constexpr, TD: gl.constexpr,
        HAS_BIAS: gl.constexpr, PREFETCH: gl.constexpr, TIMELINE: gl.constexpr, NW: gl.constexpr,
        PRODUCER_REGS: gl.constexpr, SPLIT: gl.constexpr, L2_AHEAD: gl.constexpr, WAIT_PF: gl.constexpr,
        WAIT_PF_OPS: gl.constexpr, PF_LANES_P: gl.constexpr, PF_LANES_C: gl.constexpr,
        WAIT_PF_LINE: gl.constexpr, QK_NORM: gl.constexpr, LM_CTA: gl.constexpr, ATTN_WARPS: gl.constexpr,
        SIG_GATE: gl.constexpr, ATTN_GATE: gl.constexpr, MV_BITS: gl.constexpr, ATTN_MMA: gl.constexpr,
        MMA_EARLY: gl.constexpr, MV_AHEAD: gl.constexpr, SB: gl.constexpr, NEW_ROW: gl.constexpr,
        COMBINE_LANES: gl.constexpr, MV_MMA: gl.constexpr, INFLIGHT: gl.constexpr, NORM_W: gl.constexpr,
        TMA_EVICT: gl.constexpr, scales=(None, None, None, None, None),
        W_FP8: gl.constexpr = False, HEAD_FP8: gl.constexpr = False):
    """One decode step (or one stage of it, ``advance`` = 0) over the instruction table; see the module docstring.

    Runtime arguments, grouped by kind as tuples (``gluon.host.ARG_TUPLES`` names their elements; Triton
    flattens them at launch):

    * ``wqkv_desc`` … ``head_desc``: the TMA descriptors of the packed weights, one argument each (Triton 3.6's
      CUDA launcher expands only top-level tensor descriptors into the kernel's TMA parameters);
    * ``sched`` (table_ptr, counts_ptr, state_ptr, counters_ptr, done_ptr, err_ptr, timeline_ptr): the
      instruction table, per-CTA task counts, the step state, the dependency counters, done and error words,
      the timeline;
    * ``max_tasks``, ``spin_cap``, ``advance``, ``tok_in``: the integers that change between launches or
      configurations, one argument each, so that one binary serves them all: Triton's ``do_not_specialize``
      reaches top-level arguments only (inside a tuple a 1 would be compiled in as a constant and a multiple of
      16 as aligned);
    * ``model`` (emb_ptr, fnorm_ptr, bqkv_ptr, anorm_ptr, mnorm_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr,
      qknorm_ptr): embedding, norms, q/k/v bias, RoPE tables, KV caches, q/k-norm weights;
    * ``acts`` (x_ptr, q_ptr, pm_ptr, pl_ptr, pacc_ptr, attn_ptr, act_ptr, logits_ptr, amax_ptr, knew_ptr): the
      activations the tasks hand on: x, q, attention partials and output, SwiGLU output, logits, greedy keys,
      the new k;
    * ``weights`` (wqkv_ptr, wo_ptr, wgu_ptr, wdown_ptr, head_ptr): the raw weight pointers the L2 prefetch reads;
    * ``eps``, ``sm_scale``: the RMSNorm epsilon and the attention scale;
    * ``scales`` (sqkv_ptr, so_ptr, sgu_ptr, sdown_ptr, slm_ptr): the FP8 row scales (``W_FP8``; ``slm_ptr``
      with ``HEAD_FP8``); None, the default, where unread.

    The constexprs are named keyword arguments: a constexpr read out of a tuple by unpacking is no longer
    constant.

    ``QK_NORM`` (Qwen3): q/k-norm and RoPE of q and the new k in the attention task (``qknorm_ptr`` (L, 2, D)
    the q_norm and k_norm weights, ``knew_ptr`` (NKV, D) the raw new k; see ``attention.attention``).

    Shared memory: the ring ``bufs`` (NS·SB, BR, BK) of weight tiles (NS slots of SB boxes; with ``MV_MMA``
    (NS, SB·BK/64, BR, 64), 128-byte swizzled) with its
    ``full``/``empty`` mbarriers (one pair per slot), and
    ``xs`` (KCH, BK) for the staged input vector. Grid: one CTA per SM (all resident: the schedule's waits
    need it; the launch is cooperative).

    The two warp partitions take the runtime arguments as tuples too: ``ring`` (bufs, full, empty, xs), ``sched``
    with max_tasks after the task counts and spin_cap last, ``model``, ``acts``, ``weights``, ``scales``,
    ``descs`` (the five descriptors), ``gates`` (the signal and acknowledge barriers) and, for the consumer,
    (advance, tok_in, eps, sm_scale).
    """
    if MV_MMA:  # (slot, 128-byte box, row, column): the descriptors' 128-byte swizzle, boxes [BR, MB]
        MB: gl.constexpr = 1024 // wqkv_desc.dtype.primitive_bitwidth   # columns per box: 64 bf16, 128 FP8
        bufs = gl.allocate_shared_memory(wqkv_desc.dtype, [NS, SB * BK // MB, BR, MB],
                                         gl.NVMMASharedLayout(swizzle_byte_width=128,
                                                              element_bitwidth=wqkv_desc.dtype.primitive_bitwidth,
                                                              rank=3))
    else:
        bufs = gl.allocate_shared_memory(wqkv_desc.dtype, [NS * SB, BR, BK], wqkv_desc.layout)
    full = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    xs = gl.allocate_shared_memory(acts[0].dtype.element_ty, [KCH, 1, BK], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    # two, used alternately: a phase of one cannot be lapped before the producer waited on it (see _producer)
    sigbar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ackbar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(NS):
        mbarrier.init(full.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    mbarrier.init(sigbar.index(0), count=1)
    mbarrier.init(sigbar.index(1), count=1)
    mbarrier.init(ackbar.index(0), count=1)
    mbarrier.init(ackbar.index(1), count=1)
    # the partitions' tuples (the constexprs stay named)
    ring = (bufs, full, empty, xs)
    table_ptr, counts_ptr, state_ptr, counters_ptr, done_ptr, err_ptr, timeline_ptr = sched
    sched = (table_ptr, counts_ptr, max_tasks, state_ptr, counters_ptr, done_ptr, err_ptr, timeline_ptr, spin_cap)
    descs = (wqkv_desc, wo_desc, wgu_desc, wdown_desc, head_desc)
    gates = (sigbar, ackbar)
    gl.warp_specialize([
        (_consumer, (ring, sched, model, acts, weights, gates, (advance, tok_in, eps, sm_scale), scales,
                     H, Q, KV, I, V, D, G, GP, NKV, S_MAX, NSPLIT,
                     MIN_CHUNK, NF, BR, BK, NS, NCH_H, NCH_Q, NCH_I, KCH_H, KCH_Q, KCH_I, VEC, TK, BLOCK_S,
                     BLOCK_SPLIT, VD, TD, HAS_BIAS, TIMELINE, NW, SPLIT, IP, WAIT_PF, WAIT_PF_OPS, PF_LANES_C,
                     WAIT_PF_LINE, QK_NORM, LM_CTA, ATTN_WARPS, SIG_GATE, ATTN_GATE, MV_BITS, ATTN_MMA,
                     MMA_EARLY, MV_AHEAD, SB, NEW_ROW, COMBINE_LANES, MV_MMA, NORM_W, W_FP8, HEAD_FP8)),
        (_producer, (descs, ring, sched, weights, gates, H, Q, KV, IP, NF, BR, BK, NS,
                     NCH_H, NCH_Q, NCH_I, PREFETCH, TIMELINE, SPLIT, I, L2_AHEAD, PF_LANES_P, SIG_GATE, ATTN_GATE,
                     NSPLIT, MIN_CHUNK, SB, MV_MMA, INFLIGHT, TMA_EVICT, W_FP8, HEAD_FP8)),
    ], [1], [PRODUCER_REGS])
