"""The Gluon megakernel's attention task (``OP_ATTN``; no weights, so the producer skips it and keeps streaming the
next tasks' weights), in three layouts that ``gluon.host.resolve_attn_layout`` picks from: :func:`attention_mma`
(the tensor cores; the default for 16-bit weights), :func:`attention_warps` (warp-local online softmax) and
:func:`attention` (a block's positions across all warps; the fallback, and the layout with the q/k-norm path
for fp32). Each returns the same stamps to the consumer (``kernel.py``), which runs it for an ``OP_ATTN`` task.

One task covers a kv head's G query heads over one position split, flash-decoding (online softmax, Milakov &
Gimelshein 2018), K/V tiles ``[BLOCK_S, D]`` loaded with ``.cg`` (the new token's K/V was written this step by
other CTAs). With one non-empty split the task writes the attention output itself; otherwise it writes (m, l,
acc) partials and takes a ticket, and the last ticket holder of the kv head combines the splits (log-sum-exp) and
signals — as the Triton kernel's fused reduction.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mma_v2

from .common import now, rnd, spin, splits_used, stamp_after


@gluon.constexpr_function
def _combine_layout(l3, block_split, num_warps, lanes):
    """The layout (query heads, splits, D) of the last ticket holder's split combine: the attention layout's own
    ``l3`` (its warps along the split axis: the max and the sums over splits cross warps through shared memory),
    or with ``lanes`` (``attn_combine=lanes``) the splits in one warp's lanes and the query heads across the warps,
    so those reductions are shuffles; 4 float32 (16 bytes) per thread along D."""
    if not lanes:
        return l3
    return gl.BlockedLayout([1, 1, 4], [1, block_split, 32 // block_split], [num_warps, 1, 1], [2, 1, 0])


# ---- attention ---------------------------------------------------------------------------------------------
# One task: kv head `kvh`, positions [split·chunk, min(n, (split+1)·chunk)), chunk = max(ceil(n/NSPLIT), MIN_CHUNK),
# n = pos + 1; its G query heads at once in a (GP, BLOCK_S, D) layout (the K/V tile is read once for all of them).
# Only position `pos` of the cache is written in this step (by the QKV tasks): a first block of older positions is
# loaded BEFORE waiting for the QKV stage, so its latency hides behind the wait, and every later block is loaded
# one iteration ahead of its use (the loads of block b+1 are in flight while block b is computed).
# QK_NORM (Qwen3): the q buffer holds raw q and `knew` the raw new k (_qkv_epilogue). Every split norms and rotates
# its G query heads (G·D values, cheaper than a hop); the split holding `pos` (the last non-empty one) also norms
# and rotates the new k and writes it to cache[pos] for later steps. No task reads cache[pos] in this step: K
# blocks are loaded over positions < pos only (so the first one always before the wait), and the new k enters
# the scores from registers.
@gluon.jit
def attention(layer, kvh, split, pos, sm_scale, ticket_cnt, sig, wait_ptr, target, do_wait, spin_cap, counters_ptr,
               q_ptr, kc_ptr, vc_ptr, pm_ptr, pl_ptr, pacc_ptr, attn_ptr, D: gl.constexpr, G: gl.constexpr,
               GP: gl.constexpr, NKV: gl.constexpr, S_MAX: gl.constexpr, NSPLIT: gl.constexpr,
               MIN_CHUNK: gl.constexpr, BLOCK_S: gl.constexpr, BLOCK_SPLIT: gl.constexpr, VD: gl.constexpr,
               TD: gl.constexpr, NW: gl.constexpr, TIMELINE: gl.constexpr,
               knew_ptr, qknorm_ptr, cos_ptr, sin_ptr, eps, QK_NORM: gl.constexpr, LANES: gl.constexpr = False):
    """Returns (last counter value seen by the dependency wait, or ``target`` without one; with ``TIMELINE`` the
    ns stamps of: the wait met, the math done (after the last block, so after q and the new K/V arrived), the
    ticket drawn (partials stored and fenced; for a single split: its output published), q in registers (normed
    and rotated with ``QK_NORM``), the block loop done (the math's stamp here; the warp layout's differs))."""
    ACT: gl.constexpr = attn_ptr.dtype.element_ty
    L3: gl.constexpr = gl.BlockedLayout([1, 1, VD], [1, 32 // TD, TD], [1, NW, 1], [2, 1, 0])
    QL: gl.constexpr = gl.SliceLayout(1, L3)   # (GP, D): q, acc
    KL: gl.constexpr = gl.SliceLayout(0, L3)   # (BLOCK_S, D): k, v
    SL: gl.constexpr = gl.SliceLayout(2, L3)   # (GP, BLOCK_S): scores
    n, s_lo, s_hi, base = _split_range(layer, kvh, split, pos, D, NKV, S_MAX, NSPLIT, MIN_CHUNK)
    sk = gl.arange(0, BLOCK_S, layout=gl.SliceLayout(1, KL))
    dk = gl.arange(0, D, layout=gl.SliceLayout(0, KL))
    offs = base + gl.expand_dims(s_lo + sk, 1).to(gl.int64) * D + gl.expand_dims(dk, 0)
    mk = gl.expand_dims(s_lo + sk < s_hi, 1)
    old = s_lo + BLOCK_S <= pos  # the first block holds no position written in this step
    k_hi = s_hi
    if QK_NORM:  # K of positions < pos only: none is written in this step
        k_hi = gl.minimum(s_hi, pos)
        k = gl.load(kc_ptr + offs, mask=gl.expand_dims(s_lo + sk < k_hi, 1), other=0.0, cache_modifier=".cg")
    else:
        k = gl.load(kc_ptr + offs, mask=mk & old, other=0.0, cache_modifier=".cg")
    v = gl.load(vc_ptr + offs, mask=mk & old, other=0.0, cache_modifier=".cg")
    gq = gl.arange(0, GP, layout=gl.SliceLayout(1, QL))
    dq = gl.arange(0, D, layout=gl.SliceLayout(0, QL))
    if QK_NORM:  # what does not depend on the QKV stage (norm weights, cos/sin at pos) is loaded before the wait
        HALF: gl.constexpr = D // 2
        nw = qknorm_ptr + layer.to(gl.int64) * (2 * D)  # (q_norm, k_norm) of this layer
        dqp = (dq + HALF) % D  # rotate_half partner
        dkp = (dk + HALF) % D
        wq = gl.expand_dims(gl.load(nw + dq).to(gl.float32), 0)
        wqp = gl.expand_dims(gl.load(nw + dqp).to(gl.float32), 0)
        cq = gl.expand_dims(gl.load(cos_ptr + pos * HALF + dq % HALF).to(ACT).to(gl.float32), 0)
        sq = gl.expand_dims(gl.load(sin_ptr + pos * HALF + dq % HALF).to(ACT).to(gl.float32), 0)
        wk = gl.load(nw + D + dk).to(gl.float32)
        wkp = gl.load(nw + D + dkp).to(gl.float32)
        ck = gl.load(cos_ptr + pos * HALF + dk % HALF).to(ACT).to(gl.float32)
        sk_ = gl.load(sin_ptr + pos * HALF + dk % HALF).to(ACT).to(gl.float32)
    seen = target
    if do_wait:
        seen = spin(wait_ptr, target, spin_cap)
        gl.thread_barrier()
    t_ready = 0
    if TIMELINE:
        t_ready = now(pos)
    if s_lo + BLOCK_S > pos:  # the first block holds the new position: load it after the wait
        if not QK_NORM:
            k = gl.load(kc_ptr + offs, mask=mk, other=0.0, cache_modifier=".cg")
        v = gl.load(vc_ptr + offs, mask=mk, other=0.0, cache_modifier=".cg")
    mq = gq < G
    hq = kvh * G + gq
    q = gl.load(q_ptr + gl.expand_dims(hq, 1) * D + gl.expand_dims(dq, 0), mask=gl.expand_dims(mq, 1), other=0.0,
                cache_modifier=".cg").to(gl.float32)
    if QK_NORM:
        qp = gl.load(q_ptr + gl.expand_dims(hq, 1) * D + gl.expand_dims(dqp, 0), mask=gl.expand_dims(mq, 1),
                     other=0.0, cache_modifier=".cg").to(gl.float32)
        kr = gl.load(knew_ptr + kvh * D + dk, cache_modifier=".cg").to(gl.float32)
        krp = gl.load(knew_ptr + kvh * D + dkp, cache_modifier=".cg").to(gl.float32)
        inv_q = gl.rsqrt(gl.sum(q * q, axis=1) / D + eps)
        q = _norm_rope(q, qp, gl.expand_dims(inv_q, 1), wq, wqp, cq, sq, gl.expand_dims(dq < HALF, 0), ACT)
        inv_k = gl.rsqrt(gl.sum(kr * kr, axis=0) / D + eps)
        knew = _norm_rope(kr, krp, inv_k, wk, wkp, ck, sk_, dk < HALF, ACT)
        if s_hi == n:  # this split holds pos: the normed, rotated k goes to the cache for the later steps
            gl.store(kc_ptr + base + pos.to(gl.int64) * D + dk, knew.to(ACT))
        knew2 = gl.expand_dims(knew, 0)
    t_q = stamp_after(q, TIMELINE)  # q normed and rotated with q/k-norm
    q3 = gl.expand_dims(q, 1)
    ss = gl.arange(0, BLOCK_S, layout=gl.SliceLayout(0, SL))
    m = gl.full([GP], float("-inf"), gl.float32, gl.SliceLayout(1, SL))
    l = gl.zeros([GP], gl.float32, gl.SliceLayout(1, SL))
    acc = gl.zeros([GP, D], gl.float32, QL)
    s0 = s_lo
    while s0 < s_hi:
        nxt = s0 + BLOCK_S + sk  # the next block, in flight during this one's math (all masked after the last)
        offs_n = base + gl.expand_dims(nxt, 1).to(gl.int64) * D + gl.expand_dims(dk, 0)
        mk_n = gl.expand_dims(nxt < s_hi, 1)
        if QK_NORM:
            k_n = gl.load(kc_ptr + offs_n, mask=gl.expand_dims(nxt < k_hi, 1), other=0.0, cache_modifier=".cg")
        else:
            k_n = gl.load(kc_ptr + offs_n, mask=mk_n, other=0.0, cache_modifier=".cg")
        v_n = gl.load(vc_ptr + offs_n, mask=mk_n, other=0.0, cache_modifier=".cg")
        kf = k.to(gl.float32)
        if QK_NORM:  # the new position's k from registers
            kf = gl.where(gl.expand_dims(s0 + sk == pos, 1), knew2, kf)
        sc = gl.sum(q3 * gl.expand_dims(kf, 0), axis=2) * sm_scale
        sc = gl.where(gl.expand_dims(s0 + ss < s_hi, 0), sc, float("-inf"))
        m_new, alpha, p, l = _online_softmax(m, l, sc, 1, False)
        pv = gl.sum(gl.expand_dims(p, 2) * gl.expand_dims(v.to(gl.float32), 0), axis=1)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, QL)), 1) + pv
        m = m_new
        k = k_n
        v = v_n
        s0 += BLOCK_S
    t_math = pos.to(gl.int64) * 0  # int64 like the stamps
    if TIMELINE:  # the reduction makes the stamp wait for the math (and so for the loads it used)
        t_math = now(gl.max(l, axis=0).to(gl.int32))
    t_loop = t_math  # one layout: the block loop's end is the math's
    t_ticket = _attn_publish(kvh, split, pos, m, l, acc, ticket_cnt, sig, counters_ptr, pm_ptr, pl_ptr, pacc_ptr,
                             attn_ptr, D, G, GP, NSPLIT, MIN_CHUNK, BLOCK_SPLIT,
                             _combine_layout(L3, BLOCK_SPLIT, NW, LANES), TIMELINE, GP, QL, gl.SliceLayout(1, SL))
    return seen, t_ready, t_math, t_ticket, t_q, t_loop


@gluon.jit
def _online_softmax(m, l, sc, AXIS: gl.constexpr, GUARD: gl.constexpr):
    """One block of the online softmax (Milakov & Gimelshein 2018; flash-attention's update), shared by the three
    attention layouts: scores ``sc`` reduced over their ``AXIS`` (the block's positions), running max ``m`` and sum
    ``l`` (float32, ``sc``'s shape without ``AXIS``). Returns (m_new, alpha = e^(m − m_new), p = e^(sc − m_new),
    l·alpha + Σp); the caller rescales its P·V accumulator by alpha. ``GUARD``: a row whose max is still −inf (no
    position seen yet) subtracts 0 instead, so exp(−inf − −inf) never makes a NaN."""
    m_new = gl.maximum(m, gl.max(sc, axis=AXIS))
    m_use = m_new
    if GUARD:
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp(m - m_use)
    p = gl.exp(sc - gl.expand_dims(m_use, AXIS))
    l = l * alpha + gl.sum(p, axis=AXIS)
    return m_new, alpha, p, l


@gluon.jit
def _split_range(layer, kvh, split, pos, D: gl.constexpr, NKV: gl.constexpr, S_MAX: gl.constexpr,
                 NSPLIT: gl.constexpr, MIN_CHUNK: gl.constexpr):
    """An attention split's positions at run time: (n = pos + 1 positions in all, first, end (exclusive), the
    element offset of (layer, kvh)'s cache rows); chunks of max(ceil(n / NSPLIT), MIN_CHUNK) positions."""
    n = pos + 1
    chunk = gl.maximum((n + NSPLIT - 1) // NSPLIT, MIN_CHUNK)
    s_lo = split * chunk
    s_hi = gl.minimum(s_lo + chunk, n)
    return n, s_lo, s_hi, (layer.to(gl.int64) * NKV + kvh) * S_MAX * D


@gluon.jit
def _first_block_and_wait(kc_ptr, vc_ptr, offs, mk, s_lo, pos, wait_ptr, target, do_wait, spin_cap,
                          BLOCK_S: gl.constexpr, TIMELINE: gl.constexpr, NEW_ROW: gl.constexpr, base,
                          D: gl.constexpr):
    """A split's first K/V block (``offs``/``mk`` in the caller's layout) and the task's dependency wait: the block
    is loaded before the wait when it holds no position written in this step (its latency hides behind the wait),
    after it otherwise; with ``NEW_ROW`` (``attn_new_row=row``; ``base`` the (layer, kv head) cache offset, ``D``
    head_dim) its rows before ``pos`` are loaded before the wait in every case and only row ``pos`` after it (one
    D-element row that overlaps q's L2 round trip, in place of the block's older rows from HBM: the splits holding
    the new position took 1.4 µs from the wait to q in registers against 0.35 for the others,
    ``benchmarks/results/h200-2026-12-02-s10/chain_default_134e7a0.json``).
    Returns (k, v, the last counter value seen or ``target``, the ns stamp of the wait met or 0 without TIMELINE)."""
    if NEW_ROW:
        row0 = base + pos.to(gl.int64) * D  # the element offset of row pos
        older = mk & (offs < row0)
        k = gl.load(kc_ptr + offs, mask=older, other=0.0, cache_modifier=".cg")
        v = gl.load(vc_ptr + offs, mask=older, other=0.0, cache_modifier=".cg")
        seen, t_ready = _wait(pos, wait_ptr, target, do_wait, spin_cap, TIMELINE)
        if s_lo + BLOCK_S > pos:
            new = mk & (offs >= row0) & (offs < row0 + D)
            k = gl.load(kc_ptr + offs, mask=new, other=k, cache_modifier=".cg")
            v = gl.load(vc_ptr + offs, mask=new, other=v, cache_modifier=".cg")
    else:
        old = s_lo + BLOCK_S <= pos
        k = gl.load(kc_ptr + offs, mask=mk & old, other=0.0, cache_modifier=".cg")
        v = gl.load(vc_ptr + offs, mask=mk & old, other=0.0, cache_modifier=".cg")
        seen, t_ready = _wait(pos, wait_ptr, target, do_wait, spin_cap, TIMELINE)
        if s_lo + BLOCK_S > pos:
            k = gl.load(kc_ptr + offs, mask=mk, other=0.0, cache_modifier=".cg")
            v = gl.load(vc_ptr + offs, mask=mk, other=0.0, cache_modifier=".cg")
    return k, v, seen, t_ready


@gluon.jit
def _wait(pos, wait_ptr, target, do_wait, spin_cap, TIMELINE: gl.constexpr):
    """An attention task's dependency wait (bounded acquire spin, then a barrier of the consumer warps): (the last
    counter value seen or ``target``, the ns stamp of the wait met or 0 without TIMELINE)."""
    seen = target
    if do_wait:
        seen = spin(wait_ptr, target, spin_cap)
        gl.thread_barrier()
    t_ready = 0
    if TIMELINE:
        t_ready = now(pos)
    return seen, t_ready


# ATTN_WARPS (no q/k-norm; where gluon.host.resolve_attn_layout picks it: fp32 weights): the same task with each warp
# owning BLOCK_S / NW positions of a block, layout (GP, NW, SW, D). The online softmax runs per warp (max, Σp and
# Σp·v reduce over lanes only), and the warps' (m, l, acc) are combined once after the last block, where the block
# layout reduces over positions across all warps (through shared memory) three times per block. On the H200 it
# left one block's math as it was (2.8 → 2.9 µs on Llama-3.2-1B) but took 4096 context from 1.18 to 1.09 ms
# (gluon_check, stepwise; benchmarks/results/h200-2026-12-01-s6/gluon_check_r16*.json).
@gluon.jit
def attention_warps(layer, kvh, split, pos, sm_scale, ticket_cnt, sig, wait_ptr, target, do_wait, spin_cap,
                     counters_ptr, q_ptr, kc_ptr, vc_ptr, pm_ptr, pl_ptr, pacc_ptr, attn_ptr, D: gl.constexpr,
                     G: gl.constexpr, GP: gl.constexpr, NKV: gl.constexpr, S_MAX: gl.constexpr,
                     NSPLIT: gl.constexpr, MIN_CHUNK: gl.constexpr, BLOCK_S: gl.constexpr,
                     BLOCK_SPLIT: gl.constexpr, VD: gl.constexpr, TD: gl.constexpr, NW: gl.constexpr,
                     TIMELINE: gl.constexpr, NEW_ROW: gl.constexpr = False, LANES: gl.constexpr = False):
    """:func:`attention` for models without q/k-norm, warp-local online softmax; same returns (``NEW_ROW``: see
    :func:`_first_block_and_wait`)."""
    SW: gl.constexpr = BLOCK_S // NW
    L4: gl.constexpr = gl.BlockedLayout([1, 1, 1, VD], [1, 1, 32 // TD, TD], [1, NW, 1, 1], [3, 2, 1, 0])
    K3: gl.constexpr = gl.SliceLayout(0, L4)   # (NW, SW, D): k, v
    S3: gl.constexpr = gl.SliceLayout(3, L4)   # (GP, NW, SW): scores
    A3: gl.constexpr = gl.SliceLayout(2, L4)   # (GP, NW, D): each warp's acc
    MW: gl.constexpr = gl.SliceLayout(2, S3)   # (GP, NW): each warp's max and sum
    QW: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(1, L4))  # (GP, D): q
    L3: gl.constexpr = gl.BlockedLayout([1, 1, VD], [1, 32 // TD, TD], [1, NW, 1], [2, 1, 0])  # attention's
    QL: gl.constexpr = gl.SliceLayout(1, L3)
    SL: gl.constexpr = gl.SliceLayout(2, L3)
    n, s_lo, s_hi, base = _split_range(layer, kvh, split, pos, D, NKV, S_MAX, NSPLIT, MIN_CHUNK)
    wk = gl.arange(0, NW, layout=gl.SliceLayout(1, gl.SliceLayout(2, K3)))
    jk = gl.arange(0, SW, layout=gl.SliceLayout(0, gl.SliceLayout(2, K3)))
    dk = gl.arange(0, D, layout=gl.SliceLayout(0, gl.SliceLayout(1, K3)))
    rk = gl.expand_dims(wk * SW, 1) + gl.expand_dims(jk, 0)  # (NW, SW): position within a block
    d3 = gl.expand_dims(gl.expand_dims(dk, 0), 1)
    ws = gl.arange(0, NW, layout=gl.SliceLayout(1, gl.SliceLayout(0, S3)))
    js = gl.arange(0, SW, layout=gl.SliceLayout(0, gl.SliceLayout(0, S3)))
    rs = gl.expand_dims(ws * SW, 1) + gl.expand_dims(js, 0)  # the same in the scores' layout
    p0 = s_lo + rk
    offs = base + gl.expand_dims(p0, 2).to(gl.int64) * D + d3
    mk = gl.expand_dims(p0 < s_hi, 2)
    k, v, seen, t_ready = _first_block_and_wait(kc_ptr, vc_ptr, offs, mk, s_lo, pos, wait_ptr, target, do_wait,
                                                spin_cap, BLOCK_S, TIMELINE, NEW_ROW, base, D)
    gqw = gl.arange(0, GP, layout=gl.SliceLayout(1, QW))
    dqw = gl.arange(0, D, layout=gl.SliceLayout(0, QW))
    q = gl.load(q_ptr + gl.expand_dims(kvh * G + gqw, 1) * D + gl.expand_dims(dqw, 0),
                mask=gl.expand_dims(gqw < G, 1), other=0.0, cache_modifier=".cg").to(gl.float32)
    t_q = stamp_after(q, TIMELINE)
    q4 = gl.expand_dims(gl.expand_dims(q, 1), 1)  # (GP, 1, 1, D)
    m = gl.full([GP, NW], float("-inf"), gl.float32, MW)
    l = gl.zeros([GP, NW], gl.float32, MW)
    acc = gl.zeros([GP, NW, D], gl.float32, A3)
    s0 = s_lo
    while s0 < s_hi:
        pn = s0 + BLOCK_S + rk  # the next block, in flight during this one's math
        offs_n = base + gl.expand_dims(pn, 2).to(gl.int64) * D + d3
        mk_n = gl.expand_dims(pn < s_hi, 2)
        k_n = gl.load(kc_ptr + offs_n, mask=mk_n, other=0.0, cache_modifier=".cg")
        v_n = gl.load(vc_ptr + offs_n, mask=mk_n, other=0.0, cache_modifier=".cg")
        sc = gl.sum(q4 * gl.expand_dims(k.to(gl.float32), 0), axis=3) * sm_scale
        sc = gl.where(gl.expand_dims(s0 + rs < s_hi, 0), sc, float("-inf"))
        m_new, alpha, p, l = _online_softmax(m, l, sc, 2, True)  # a warp may have no position yet
        pv = gl.sum(gl.expand_dims(p, 3) * gl.expand_dims(v.to(gl.float32), 0), axis=2)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(2, A3)), 2) + pv
        m = m_new
        k = k_n
        v = v_n
        s0 += BLOCK_S
    t_loop = stamp_after(l, TIMELINE)
    # the warps' partials: M = max_w m_w, L = Σ_w l_w·e^(m_w − M), ACC = Σ_w acc_w·e^(m_w − M)
    mx = gl.max(m, axis=1)
    wgt = gl.exp(m - gl.expand_dims(mx, 1))
    m_f = gl.convert_layout(mx, gl.SliceLayout(1, SL))
    l_f = gl.convert_layout(gl.sum(l * wgt, axis=1), gl.SliceLayout(1, SL))
    acc_f = gl.convert_layout(gl.sum(acc * gl.expand_dims(gl.convert_layout(wgt, gl.SliceLayout(2, A3)), 2), axis=1),
                              QL)
    t_math = pos.to(gl.int64) * 0
    if TIMELINE:
        t_math = now(gl.max(l_f, axis=0).to(gl.int32))
    t_ticket = _attn_publish(kvh, split, pos, m_f, l_f, acc_f, ticket_cnt, sig, counters_ptr, pm_ptr, pl_ptr,
                             pacc_ptr, attn_ptr, D, G, GP, NSPLIT, MIN_CHUNK, BLOCK_SPLIT,
                             _combine_layout(L3, BLOCK_SPLIT, NW, LANES), TIMELINE, GP, QL, gl.SliceLayout(1, SL))
    return seen, t_ready, t_math, t_ticket, t_q, t_loop


# ATTN_MMA (bf16 / fp16): the same task on the tensor
# cores. The kv head's G query heads padded to MR = 16 rows are the A operand of ``mma.sync`` m16n8k16
# (``mma_v2``); a block's scores S = q·Kᵀ (MR, BLOCK_S) and its P·V (MR, D) are two chains of a few MMAs per warp,
# warps splitting the n columns (positions, then D). The online softmax runs on S in the MMA layout: its row max
# and sum reduce across the warps (shared memory), and P is rounded to ACT for the second MMA (as flash-attention
# kernels do; the other layouts keep P in float32). Phase stamps put the warp layout's loop over one block
# at ~1.7 µs (~960 instructions per thread, 128 shuffles) and its cross-warp combine at 1.2 µs (Llama-3.2-1B,
# benchmarks/results/h200-2026-12-01-s7/attn_timeline_llama-3.2-1b.json).
# EARLY (attn_operands=early): the first block's K and V become the B operands BEFORE the dependency wait, and q is
# loaded straight into the A operand layout, so the chain after the wait has no shared-memory conversion before
# the first mma. The one row written in this step (position pos, in the newest split's block) is left out of the
# early load and patched in after the wait by a masked load in the operand layout itself (`other` = the early
# tile): a D-element row, one L2 round trip that overlaps q's. With q/k-norm the K block stays in the load layout
# (the normed new k replaces row pos from registers before the conversion); V is patched the same way.
@gluon.jit
def _to_operands(k, v, KOP: gl.constexpr, BOP: gl.constexpr):
    """K (BLOCK_S, D) → Kᵀ (D, BLOCK_S) as q·Kᵀ's B operand where KOP (else unchanged); V (BLOCK_S, D) as P·V's
    B operand (layout ``BOP``)."""
    if KOP:
        k = gl.convert_layout(gl.permute(k, [1, 0]), BOP)
    return k, gl.convert_layout(v, BOP)


@gluon.jit
def _first_operands(kc_ptr, vc_ptr, offs, mk, base, s_lo, s_hi, pos, wait_ptr, target, do_wait, spin_cap,
                    BLOCK_S: gl.constexpr, TIMELINE: gl.constexpr, D: gl.constexpr, KOP: gl.constexpr,
                    BOP: gl.constexpr):
    """:func:`_first_block_and_wait` for the tensor-core layout: the first block's positions before ``pos``
    loaded and converted (:func:`_to_operands`) before the wait, row ``pos`` (when the block holds it) loaded
    after it straight into the operand layouts. Same returns, k and v as the B operands (k only where KOP)."""
    older = mk & (offs < base + pos.to(gl.int64) * D)  # the block's rows before pos
    k = gl.load(kc_ptr + offs, mask=older, other=0.0, cache_modifier=".cg")
    v = gl.load(vc_ptr + offs, mask=older, other=0.0, cache_modifier=".cg")
    k, v = _to_operands(k, v, KOP, BOP)
    seen, t_ready = _wait(pos, wait_ptr, target, do_wait, spin_cap, TIMELINE)
    if (pos < s_hi) & (pos < s_lo + BLOCK_S):
        s_k = gl.arange(0, BLOCK_S, layout=gl.SliceLayout(1, BOP))  # V: (positions, D)
        d_k = gl.arange(0, D, layout=gl.SliceLayout(0, BOP))
        row = gl.expand_dims(s_lo + s_k == pos, 1) & gl.expand_dims(d_k < D, 0)
        ov = base + gl.expand_dims(s_lo + s_k, 1).to(gl.int64) * D + gl.expand_dims(d_k, 0)
        v = gl.load(vc_ptr + ov, mask=row, other=v, cache_modifier=".cg")
        if KOP:  # Kᵀ: (D, positions)
            d_t = gl.arange(0, D, layout=gl.SliceLayout(1, BOP))
            s_t = gl.arange(0, BLOCK_S, layout=gl.SliceLayout(0, BOP))
            rowt = gl.expand_dims(d_t < D, 1) & gl.expand_dims(s_lo + s_t == pos, 0)
            ok = base + gl.expand_dims(s_lo + s_t, 0).to(gl.int64) * D + gl.expand_dims(d_t, 1)
            k = gl.load(kc_ptr + ok, mask=rowt, other=k, cache_modifier=".cg")
    return k, v, seen, t_ready


@gluon.jit
def attention_mma(layer, kvh, split, pos, sm_scale, ticket_cnt, sig, wait_ptr, target, do_wait, spin_cap,
                   counters_ptr, q_ptr, kc_ptr, vc_ptr, pm_ptr, pl_ptr, pacc_ptr, attn_ptr, D: gl.constexpr,
                   G: gl.constexpr, GP: gl.constexpr, NKV: gl.constexpr, S_MAX: gl.constexpr,
                   NSPLIT: gl.constexpr, MIN_CHUNK: gl.constexpr, BLOCK_S: gl.constexpr,
                   BLOCK_SPLIT: gl.constexpr, VD: gl.constexpr, TD: gl.constexpr, NW: gl.constexpr,
                   TIMELINE: gl.constexpr, knew_ptr, qknorm_ptr, cos_ptr, sin_ptr, eps, QK_NORM: gl.constexpr,
                  EARLY: gl.constexpr, NEW_ROW: gl.constexpr = False, LANES: gl.constexpr = False):
    """:func:`attention` on the tensor cores (16-bit activations, at most 16 query heads per kv head); same
    returns. ``QK_NORM`` as in :func:`attention`: q normed and rotated before it becomes the A operand, the new k
    normed and rotated from ``knew_ptr``, written to the cache by the split holding ``pos`` and put into its K
    block in place of the cache's row before the block becomes the B operand. ``EARLY``: the operands off the
    chain (see :func:`_first_operands`); else q and the first block converted after the wait (``NEW_ROW``: the
    block's older rows loaded before the wait, see :func:`_first_block_and_wait`)."""
    ACT: gl.constexpr = attn_ptr.dtype.element_ty
    MR: gl.constexpr = 16
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, NW], instr_shape=[16, 8])
    AOP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    BOP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    KB: gl.constexpr = gl.BlockedLayout([1, VD], [32 // TD, TD], [NW, 1], [1, 0])  # (rows, D) loads, D contiguous
    L3: gl.constexpr = gl.BlockedLayout([1, 1, VD], [1, 32 // TD, TD], [1, NW, 1], [2, 1, 0])  # the combine's
    RL: gl.constexpr = gl.SliceLayout(1, MMA)  # (MR,): m, l
    K_EARLY: gl.constexpr = EARLY and not QK_NORM  # q and K straight to their operands (q/k-norm: K late, V early)
    n, s_lo, s_hi, base = _split_range(layer, kvh, split, pos, D, NKV, S_MAX, NSPLIT, MIN_CHUNK)
    sk = gl.arange(0, BLOCK_S, layout=gl.SliceLayout(1, KB))
    dk = gl.arange(0, D, layout=gl.SliceLayout(0, KB))
    offs = base + gl.expand_dims(s_lo + sk, 1).to(gl.int64) * D + gl.expand_dims(dk, 0)
    mk = gl.expand_dims(s_lo + sk < s_hi, 1)
    if QK_NORM:  # what does not depend on the QKV stage (norm weights, cos/sin at pos) is loaded before the wait
        HALF: gl.constexpr = D // 2
        nw = qknorm_ptr + layer.to(gl.int64) * (2 * D)  # (q_norm, k_norm) of this layer
        dkp = (dk + HALF) % D  # rotate_half partner
        wq = gl.expand_dims(gl.load(nw + dk).to(gl.float32), 0)
        wqp = gl.expand_dims(gl.load(nw + dkp).to(gl.float32), 0)
        wk = gl.load(nw + D + dk).to(gl.float32)
        wkp = gl.load(nw + D + dkp).to(gl.float32)
        c = gl.load(cos_ptr + pos * HALF + dk % HALF).to(ACT).to(gl.float32)
        s_ = gl.load(sin_ptr + pos * HALF + dk % HALF).to(ACT).to(gl.float32)
    if EARLY:
        k, v, seen, t_ready = _first_operands(kc_ptr, vc_ptr, offs, mk, base, s_lo, s_hi, pos, wait_ptr, target,
                                              do_wait, spin_cap, BLOCK_S, TIMELINE, D, K_EARLY, BOP)
    else:
        k, v, seen, t_ready = _first_block_and_wait(kc_ptr, vc_ptr, offs, mk, s_lo, pos, wait_ptr, target, do_wait,
                                                    spin_cap, BLOCK_S, TIMELINE, NEW_ROW, base, D)
    if K_EARLY:  # straight into the A operand: no conversion through shared memory on the chain
        gqa = gl.arange(0, MR, layout=gl.SliceLayout(1, AOP))
        dqa = gl.arange(0, D, layout=gl.SliceLayout(0, AOP))
        qa = gl.load(q_ptr + gl.expand_dims(kvh * G + gqa, 1) * D + gl.expand_dims(dqa, 0),
                     mask=gl.expand_dims(gqa < G, 1), other=0.0, cache_modifier=".cg")
        t_q = stamp_after(qa.to(gl.float32), TIMELINE)
    else:
        gq = gl.arange(0, MR, layout=gl.SliceLayout(1, KB))
        qrow = gl.expand_dims(kvh * G + gq, 1) * D
        mq = gl.expand_dims(gq < G, 1)
        q = gl.load(q_ptr + qrow + gl.expand_dims(dk, 0), mask=mq, other=0.0, cache_modifier=".cg")
        if QK_NORM:  # (the cache's row pos is not written yet in this step: the new k replaces it in the K
            # block)
            qf = q.to(gl.float32)
            qp = gl.load(q_ptr + qrow + gl.expand_dims(dkp, 0), mask=mq, other=0.0,
                         cache_modifier=".cg").to(gl.float32)
            kr = gl.load(knew_ptr + kvh * D + dk, cache_modifier=".cg").to(gl.float32)
            krp = gl.load(knew_ptr + kvh * D + dkp, cache_modifier=".cg").to(gl.float32)
            inv_q = gl.rsqrt(gl.sum(qf * qf, axis=1) / D + eps)
            q = _norm_rope(qf, qp, gl.expand_dims(inv_q, 1), wq, wqp, gl.expand_dims(c, 0), gl.expand_dims(s_, 0),
                           gl.expand_dims(dk < HALF, 0), ACT).to(ACT)
            inv_k = gl.rsqrt(gl.sum(kr * kr, axis=0) / D + eps)
            knew = _norm_rope(kr, krp, inv_k, wk, wkp, c, s_, dk < HALF, ACT).to(ACT)
            if s_hi == n:  # this split holds pos: the normed, rotated k goes to the cache for the later steps. Its
                # own K loads may read row pos before or after this store: the where() in the loop replaces it
                gl.store(kc_ptr + base + pos.to(gl.int64) * D + dk, knew)
            knew2 = gl.expand_dims(knew, 0)
        qa = gl.convert_layout(q, AOP)  # (MR, D) in ACT, the rows past G zero
        t_q = stamp_after(q.to(gl.float32), TIMELINE)
    ss = gl.arange(0, BLOCK_S, layout=gl.SliceLayout(0, MMA))
    m = gl.full([MR], float("-inf"), gl.float32, RL)
    l = gl.zeros([MR], gl.float32, RL)
    acc = gl.zeros([MR, D], gl.float32, MMA)
    s0 = s_lo
    while s0 < s_hi:
        nxt = s0 + BLOCK_S + sk  # the next block, in flight during this one's math
        offs_n = base + gl.expand_dims(nxt, 1).to(gl.int64) * D + gl.expand_dims(dk, 0)
        mk_n = gl.expand_dims(nxt < s_hi, 1)
        k_n = gl.load(kc_ptr + offs_n, mask=mk_n, other=0.0, cache_modifier=".cg")
        v_n = gl.load(vc_ptr + offs_n, mask=mk_n, other=0.0, cache_modifier=".cg")
        if QK_NORM:  # the new position's k from registers
            k = gl.where(gl.expand_dims(s0 + sk == pos, 1), knew2, k)
        if K_EARLY:
            kb = k  # already the B operand
        else:
            kb = gl.convert_layout(gl.permute(k, [1, 0]), BOP)
        sc = mma_v2(qa, kb, gl.zeros([MR, BLOCK_S], gl.float32, MMA))
        sc = gl.where(gl.expand_dims(s0 + ss < s_hi, 0), sc * sm_scale, float("-inf"))
        m_new, alpha, p, l = _online_softmax(m, l, sc, 1, False)
        if EARLY:
            vb = v
        else:
            vb = gl.convert_layout(v, BOP)
        acc = mma_v2(gl.convert_layout(p.to(ACT), AOP), vb, acc * gl.expand_dims(alpha, 1))
        m = m_new
        s0 += BLOCK_S
        if EARLY:  # the next block's conversions only where there is one (not on the last block's chain)
            if s0 < s_hi:
                k, v = _to_operands(k_n, v_n, K_EARLY, BOP)
        else:
            k = k_n
            v = v_n
    t_math = pos.to(gl.int64) * 0
    if TIMELINE:
        t_math = now(gl.max(l, axis=0).to(gl.int32))
    t_ticket = _attn_publish(kvh, split, pos, m, l, acc, ticket_cnt, sig, counters_ptr, pm_ptr, pl_ptr,
                             pacc_ptr, attn_ptr, D, G, GP, NSPLIT, MIN_CHUNK, BLOCK_SPLIT,
                             _combine_layout(L3, BLOCK_SPLIT, NW, LANES), TIMELINE, MR, MMA, RL)
    return seen, t_ready, t_math, t_ticket, t_q, t_math


@gluon.jit
def _attn_publish(kvh, split, pos, m, l, acc, ticket_cnt, sig, counters_ptr, pm_ptr, pl_ptr, pacc_ptr, attn_ptr,
                  D: gl.constexpr, G: gl.constexpr, GP: gl.constexpr, NSPLIT: gl.constexpr, MIN_CHUNK: gl.constexpr,
                  BLOCK_SPLIT: gl.constexpr, L3: gl.constexpr, TIMELINE: gl.constexpr, R: gl.constexpr,
                  LA: gl.constexpr, LM: gl.constexpr):
    """A split's end (every attention layout): the whole context in this task →
    normalise and publish; else store the partials, draw the kv head's ticket, and the last holder combines (in
    layout ``L3``, GP rows) and signals. ``m``, ``l`` (R,) in layout ``LM`` and ``acc`` (R, D) in ``LA``: R ≥ G rows,
    query head ``kvh·G + r`` in row r (the rows past G are ignored). Returns the ticket's ns stamp (0 without
    TIMELINE)."""
    ACT: gl.constexpr = attn_ptr.dtype.element_ty
    QL: gl.constexpr = LA
    gq = gl.arange(0, R, layout=gl.SliceLayout(1, QL))
    dq = gl.arange(0, D, layout=gl.SliceLayout(0, QL))
    mq = gq < G
    hq = kvh * G + gq
    t_ticket = pos.to(gl.int64) * 0
    used = splits_used(pos, NSPLIT, MIN_CHUNK)
    if used == 1:
        out = acc / gl.expand_dims(gl.convert_layout(l, gl.SliceLayout(1, QL)), 1)
        gl.store(attn_ptr + gl.expand_dims(hq, 1) * D + gl.expand_dims(dq, 0), out.to(ACT),
                 mask=gl.expand_dims(mq, 1))
        gl.thread_barrier()
        if sig >= 0:  # (-1 in megakernel-stages, whose launches order the stages: no counter)
            gl.atomic_add(counters_ptr + sig, 1, sem="release", scope="gpu")
        if TIMELINE:
            t_ticket = now(pos)
    else:
        _store_partials(kvh, split, m, l, acc, hq, mq, pm_ptr, pl_ptr, pacc_ptr, D, G, R, NSPLIT, LA, LM)
        gl.thread_barrier()
        ticket = gl.atomic_add(counters_ptr + ticket_cnt, 1, sem="acq_rel", scope="gpu")
        if TIMELINE:
            t_ticket = now(ticket)
        if ticket == used - 1:
            gl.atomic_xchg(counters_ptr + ticket_cnt, 0, sem="relaxed", scope="gpu")
            gl.thread_barrier()
            _attn_combine(kvh, used, pm_ptr, pl_ptr, pacc_ptr, attn_ptr, D, G, GP, NSPLIT, BLOCK_SPLIT, L3)
            gl.thread_barrier()
            if sig >= 0:
                gl.atomic_add(counters_ptr + sig, 1, sem="release", scope="gpu")
    return t_ticket


@gluon.jit
def _store_partials(kvh, split, m, l, acc, hq, mq, pm_ptr, pl_ptr, pacc_ptr, D: gl.constexpr, G: gl.constexpr,
                    R: gl.constexpr, NSPLIT: gl.constexpr, LA: gl.constexpr, LM: gl.constexpr):
    """A split's float32 partials: running max ``m`` and sum ``l`` (R,) in ``LM`` → pm/pl[hq·NSPLIT + split], the
    unnormalised ``acc`` (R, D) in ``LA`` → pacc[(hq·NSPLIT + split)·D + d]; rows past G are not stored."""
    QL: gl.constexpr = LA
    gs = gl.arange(0, R, layout=LM)
    out_s = (kvh * G + gs) * NSPLIT + split
    gl.store(pm_ptr + out_s, m, mask=gs < G)
    gl.store(pl_ptr + out_s, l, mask=gs < G)
    dq = gl.arange(0, D, layout=gl.SliceLayout(0, QL))
    out_q = (hq * NSPLIT + split) * D
    gl.store(pacc_ptr + gl.expand_dims(out_q, 1) + gl.expand_dims(dq, 0), acc, mask=gl.expand_dims(mq, 1))


@gluon.jit
def _norm_rope(x, xp, inv, w, wp, c, s, lo_half, ACT: gl.constexpr):
    """Per-head RMSNorm·weight then rotate_half RoPE of raw ACT-valued x (float32; ``xp`` its partners at
    (d + D/2) mod D, ``inv`` the head's rsqrt(mean(x²) + eps), ``w``/``wp`` the norm weight at d and at the
    partner, ``c``/``s`` cos/sin at d mod D/2 in ACT), rounded where the reference rounds: n = (x·inv → ACT)·w
    → ACT (transformers' RMSNorm), out = n·cos ∓ partner·sin with each product and the sum in ACT."""
    n = rnd(rnd(x * inv, ACT) * w, ACT)
    npart = rnd(rnd(xp * inv, ACT) * wp, ACT)
    a = rnd(n * c, ACT)
    b = rnd(npart * s, ACT)
    return rnd(gl.where(lo_half, a - b, a + b), ACT)


# Per query head over the `used` splits: M = max_s m_s, w_s = exp(m_s − M), out = Σ w_s·acc_s / Σ w_s·l_s.
# One pass over blocks of BLOCK_SPLIT splits with a running maximum (the old sums rescaled by exp(M_old − M_new)),
# so m, l and acc of a block are loaded together: one L2 round trip per block (usually the only block) instead of
# a max pass and a sum pass, on the layer's critical chain.
@gluon.jit
def _attn_combine(kvh, used, pm_ptr, pl_ptr, pacc_ptr, attn_ptr, D: gl.constexpr, G: gl.constexpr,
                  GP: gl.constexpr, NSPLIT: gl.constexpr, BLOCK_SPLIT: gl.constexpr, L3: gl.constexpr):
    ACT: gl.constexpr = attn_ptr.dtype.element_ty
    SL: gl.constexpr = gl.SliceLayout(2, L3)
    QL: gl.constexpr = gl.SliceLayout(1, L3)
    gs = gl.arange(0, GP, layout=gl.SliceLayout(1, SL))
    sp0 = gl.arange(0, BLOCK_SPLIT, layout=gl.SliceLayout(0, SL))
    d3 = gl.expand_dims(gl.expand_dims(gl.arange(0, D, layout=gl.SliceLayout(0, QL)), 0), 1)
    mg = gs < G
    row = gl.expand_dims((kvh * G + gs) * NSPLIT, 1)
    big = gl.full([GP], -1.0e30, gl.float32, gl.SliceLayout(1, SL))  # finite: exp(big − new) stays defined
    den = gl.zeros([GP], gl.float32, gl.SliceLayout(1, SL))
    acc = gl.zeros([GP, D], gl.float32, QL)
    s0 = 0
    while s0 < used:
        sp = gl.expand_dims(s0 + sp0, 0)
        mm = gl.expand_dims(mg, 1) & (sp < used)
        mv = gl.load(pm_ptr + row + sp, mask=mm, other=float("-inf"), cache_modifier=".cg")
        lv = gl.load(pl_ptr + row + sp, mask=mm, other=0.0, cache_modifier=".cg")
        av = gl.load(pacc_ptr + gl.expand_dims(row + sp, 2) * D + d3, mask=gl.expand_dims(mm, 2), other=0.0,
                     cache_modifier=".cg")
        new = gl.maximum(big, gl.max(mv, axis=1))
        scale = gl.exp(big - new)
        w = gl.exp(mv - gl.expand_dims(new, 1))
        den = den * scale + gl.sum(w * lv, axis=1)
        acc = acc * gl.expand_dims(gl.convert_layout(scale, gl.SliceLayout(1, QL)), 1) \
            + gl.sum(gl.expand_dims(w, 2) * av, axis=1)
        big = new
        s0 += BLOCK_SPLIT
    out = acc / gl.expand_dims(gl.convert_layout(den, gl.SliceLayout(1, QL)), 1)
    gq = gl.arange(0, GP, layout=gl.SliceLayout(1, QL))
    dq = gl.arange(0, D, layout=gl.SliceLayout(0, QL))
    gl.store(attn_ptr + gl.expand_dims(kvh * G + gq, 1) * D + gl.expand_dims(dq, 0), out.to(ACT),
             mask=gl.expand_dims(gq < G, 1))

