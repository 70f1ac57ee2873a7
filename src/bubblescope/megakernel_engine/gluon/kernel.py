"""The Gluon megakernel (Hopper, sm_90): one persistent CTA per SM, a 1-warp TMA producer and NW consumer warps.

Why Gluon: plain Triton owns shared memory, so its weight tiles live in registers, few bytes are in flight per
SM and every task's loads start after its dependency wait (``../DESIGN.md``: 50 % of the H200's peak on the
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
  ``Σ_k W[r, k]·xs[k]`` in float32; then the opcode's epilogue (bias + RoPE + KV append, residual add,
  SiLU·up, logits + greedy key) and a release increment of its signal counter.

Weight layout: every packed weight matrix is a 2-D row-major tensor (``packing.py``: QKV rows in RoPE-pair
blocks of ``BR/2`` first-half rows then the ``BR/2`` matching second-half rows; gate/up in blocks of ``BR/2``
gate rows then the same up rows), and one host ``TensorDescriptor`` per matrix with box ``[BR, BK]`` and
unswizzled NVMMA layout. A task is one tile of ``BR`` rows over all K columns: ``cdiv(K, BK)`` boxes; TMA
fills columns past K (and rows past the matrix) with zeros, so no shape needs to divide BK.

Attention (``ATTN``, no weights, so the producer skips it and keeps streaming the next tasks' weights): one
task per (kv head, position split) covers the kv head's G query heads, flash-decoding over its positions
(online softmax, Milakov & Gimelshein 2018), K/V tiles ``[BLOCK_S, D]`` loaded with ``.cg`` (the new
token's K/V was written this step by other CTAs). With one non-empty split the task writes the attention
output itself; otherwise it writes (m, l, acc) partials and takes a ticket, and the last ticket holder of the
kv head combines the splits (log-sum-exp) and signals — as the Triton kernel's fused reduction.

Synchronisation is the Triton kernel's (counters that only increase, targets ``epoch · F_INC + F_NEED``,
``thread_barrier`` then ``atomic_add(release)``; acquire spins; ``.cg`` loads of other CTAs' data). Every
global spin is capped; a CTA whose wait expired records it in ``err`` and stops waiting, but still consumes
every ring slot, so the producer's ``mbarrier.wait`` (which has no timeout) always completes and the kernel
always ends: a stuck schedule is an exception on the host, never a hang.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, mma_v2, tma

from .. import schedule as S

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
def _now(dummy):
    """``%globaltimer`` (ns, one clock for all SMs); ``dummy`` only gives the asm an operand."""
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [dummy], dtype=gl.int64,
                                     is_pure=False, pack=1)


@gluon.jit
def _stamp_after(x, TIMELINE: gl.constexpr):
    """With TIMELINE, ``%globaltimer`` once the 2-D float tensor ``x`` is computed (its reduction makes the stamp
    wait for it); else 0 (int64 like the stamps)."""
    t = gl.to_tensor(0).to(gl.int64)
    if TIMELINE:
        t = _now(gl.max(gl.max(x, axis=1), axis=0).to(gl.int32))
    return t


@gluon.jit
def _spin(cnt_ptr, target, spin_cap):
    """Acquire-spin until ``*cnt_ptr >= target`` or ``spin_cap`` polls; returns the last value seen. (Polling with
    ``ld.acquire.gpu`` loads instead of atomics measured the same on the H200, round 11 in NOTES.md.)"""
    seen = gl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
    n = 0
    while (seen < target) & (n < spin_cap):
        seen = gl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
        n += 1
    return seen


@gluon.jit
def _rnd(v, ACT: gl.constexpr):
    """Round float32 to the activation dtype and back (what materialising it in ACT does)."""
    return v.to(ACT).to(gl.float32)


@gluon.jit
def _splits_used(pos, NSPLIT: gl.constexpr, MIN_CHUNK: gl.constexpr):
    n = pos + 1
    chunk = gl.maximum((n + NSPLIT - 1) // NSPLIT, MIN_CHUNK)
    return (n + chunk - 1) // chunk


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


# ---- staging the input vector ----------------------------------------------------------------------------
# xs (KCH, 1, BK) in ACT holds the current task's K-vector, chunk c = columns [c·BK, (c+1)·BK), zeros past K.
# One load of the whole vector (a single L2 round trip after the dependency wait), then one store.
@gluon.jit
def _stage_vector(src_ptr, nw_ptr, xs, eps, NORM: gl.constexpr, K: gl.constexpr, KCH: gl.constexpr,
                  BK: gl.constexpr, VEC: gl.constexpr, TK: gl.constexpr, NW: gl.constexpr):
    XV: gl.constexpr = gl.BlockedLayout([1, VEC], [32 // TK, TK], [NW, 1], [1, 0])
    ACT: gl.constexpr = xs.dtype
    KCH_ALL: gl.constexpr = xs.shape[0]
    xs2 = xs._reinterpret(ACT, [KCH_ALL, BK], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    # A vector without a norm is copied in parts of at most 32 chunks (8192 bf16): a whole 14336-wide one
    # (Llama-3.1-8B's down-proj input) would hold 128 floats per thread and spill.
    PART: gl.constexpr = KCH if NORM else min(KCH, 32)
    ch = gl.arange(0, PART, layout=gl.SliceLayout(1, XV))
    kk = gl.arange(0, BK, layout=gl.SliceLayout(0, XV))
    gl.thread_barrier()  # every thread is done reading the previous vector
    for part in gl.static_range(KCH // PART):
        idx = gl.expand_dims(part * PART + ch, 1) * BK + gl.expand_dims(kk, 0)
        m = idx < K
        x = gl.load(src_ptr + idx, mask=m, other=0.0, cache_modifier=".cg").to(gl.float32)
        if NORM:  # RMSNorm (Zhang & Sennrich 2019) rounded as transformers does: ((x·inv).to(ACT)·w).to(ACT)
            inv = gl.rsqrt(gl.sum(gl.sum(x * x, axis=1), axis=0) / K + eps)
            w = gl.load(nw_ptr + idx, mask=m, other=0.0).to(gl.float32)
            x = _rnd(_rnd(x * inv, ACT) * w, ACT)
        xs2.slice(part * PART, PART, dim=0).store(x.to(ACT))
    gl.thread_barrier()


# ---- the weight tiles -------------------------------------------------------------------------------------
# bf16 weights, ``BITS``: the widening to float32 in one instruction per weight. A bf16 pair read as one int32
# holds the even column in its low half and the odd one in its high half, and ``v << 16`` and ``v & 0xFFFF0000``,
# read as float32, are exactly those two values (bf16 is float32's upper half). Triton 3.6 widens each bf16 with
# a PRMT and an IMAD (the 1B kernel's SASS, NOTES.md session 6: ~148 widening and address instructions beside the
# 64 FFMAs of a 16 KB slot).
@gluon.jit
def _lo(v):
    return (v << 16).to(gl.float32, bitcast=True)


@gluon.jit
def _hi(v):
    return (v & -65536).to(gl.float32, bitcast=True)


@gluon.jit
def _wx(acc, w, xv, BK: gl.constexpr, LA: gl.constexpr, BITS: gl.constexpr):
    """``acc`` plus the products of tile registers ``w`` and the staged chunk view ``xv`` (1, BK): (R, BK) float32,
    or with ``BITS`` (``w`` as (R, BK/2) int32 pairs) (R, BK/2), each pair's two products added one after the
    other (two FMAs; their sum first would cost an FMUL, an FFMA and an FADD)."""
    SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    if BITS:
        x = xv._reinterpret(gl.int32, [1, BK // 2], SL).load(LA)
        acc = acc + _lo(w) * _lo(x)
        return acc + _hi(w) * _hi(x)
    else:
        return acc + w.to(gl.float32) * xv.load(LA).to(gl.float32)  # (1, BK) broadcast over the rows


@gluon.jit
def _rows(acc, VEC: gl.constexpr, TK: gl.constexpr, NW: gl.constexpr):
    """Σ over columns of a products tile, in the row layout the epilogues use (SliceLayout(1, LW) of the bf16
    tile layout): the same rows per thread, so the conversion moves nothing."""
    LW: gl.constexpr = gl.BlockedLayout([1, VEC], [32 // TK, TK], [NW, 1], [1, 0])
    return gl.convert_layout(gl.sum(acc, axis=1), gl.SliceLayout(1, LW))


@gluon.jit
def _mv_single(bufs, full, empty, xs, it, NCH: gl.constexpr, NS: gl.constexpr, BR: gl.constexpr,
               BK: gl.constexpr, VEC: gl.constexpr, TK: gl.constexpr, NW: gl.constexpr, BITS: gl.constexpr = False):
    """acc[r] = Σ_k W[r, k]·xs[k] over NCH ring slots; float32 (BR,) in SliceLayout(1, LW) (see :func:`_rows`)."""
    KW: gl.constexpr = BK // 2 if BITS else BK
    LA: gl.constexpr = gl.BlockedLayout([1, VEC // 2 if BITS else VEC], [32 // TK, TK], [NW, 1], [1, 0])
    SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    WT: gl.constexpr = gl.int32 if BITS else bufs.dtype
    # Elementwise products accumulate in a (BR, KW) register tile and are reduced across lanes once per task:
    # a cross-lane reduction per 8 KB slot cost as much as the loads (H200 round 1: 3.4 TB/s while streaming).
    acc2 = gl.zeros([BR, KW], gl.float32, LA)
    for c in range(NCH):
        slot = it % NS
        mbarrier.wait(full.index(slot), (it // NS) & 1)
        w = bufs.index(slot)._reinterpret(WT, [BR, KW], SL).load(LA)
        fence_async_shared()  # our generic-proxy reads before the next TMA (async proxy) write of the slot
        mbarrier.arrive(empty.index(slot))
        acc2 = _wx(acc2, w, xs.index(c), BK, LA, BITS)
        it += 1
    return _rows(acc2, VEC, TK, NW), it


@gluon.jit
def _mv_pair(bufs, full, empty, xs, it, NCH: gl.constexpr, NS: gl.constexpr, HB: gl.constexpr,
             BK: gl.constexpr, VEC: gl.constexpr, TK: gl.constexpr, NW: gl.constexpr, BITS: gl.constexpr = False):
    """Like :func:`_mv_single` for a tile of two row blocks (rows [0, HB) and [HB, 2HB)): returns both."""
    KW: gl.constexpr = BK // 2 if BITS else BK
    LA: gl.constexpr = gl.BlockedLayout([1, VEC // 2 if BITS else VEC], [32 // TK, TK], [NW, 1], [1, 0])
    SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    WT: gl.constexpr = gl.int32 if BITS else bufs.dtype
    acc_a = gl.zeros([HB, KW], gl.float32, LA)
    acc_b = gl.zeros([HB, KW], gl.float32, LA)
    for c in range(NCH):
        slot = it % NS
        mbarrier.wait(full.index(slot), (it // NS) & 1)
        t = bufs.index(slot)._reinterpret(WT, [2 * HB, KW], SL)
        wa = t.slice(0, HB, dim=0).load(LA)
        wb = t.slice(HB, HB, dim=0).load(LA)
        fence_async_shared()
        mbarrier.arrive(empty.index(slot))
        acc_a = _wx(acc_a, wa, xs.index(c), BK, LA, BITS)
        acc_b = _wx(acc_b, wb, xs.index(c), BK, LA, BITS)
        it += 1
    return _rows(acc_a, VEC, TK, NW), _rows(acc_b, VEC, TK, NW), it


@gluon.jit
def _mv_halves(bufs, full, empty, xs, it, NCH: gl.constexpr, NS: gl.constexpr, HB: gl.constexpr,
               BK: gl.constexpr, VEC: gl.constexpr, TK: gl.constexpr, NW: gl.constexpr, BITS: gl.constexpr = False):
    """acc[r] = Σ_k W[r, k]·xs[k] for HB rows whose slots hold two boxes: rows [0, HB) = columns of chunk 2c,
    rows [HB, 2HB) = the same rows, columns of chunk 2c + 1 (split_k = 2; cdiv(NCH, 2) slots)."""
    KW: gl.constexpr = BK // 2 if BITS else BK
    LA: gl.constexpr = gl.BlockedLayout([1, VEC // 2 if BITS else VEC], [32 // TK, TK], [NW, 1], [1, 0])
    SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    WT: gl.constexpr = gl.int32 if BITS else bufs.dtype
    acc_a = gl.zeros([HB, KW], gl.float32, LA)
    acc_b = gl.zeros([HB, KW], gl.float32, LA)
    for c in range((NCH + 1) // 2):
        slot = it % NS
        mbarrier.wait(full.index(slot), (it // NS) & 1)
        t = bufs.index(slot)._reinterpret(WT, [2 * HB, KW], SL)
        wa = t.slice(0, HB, dim=0).load(LA)
        wb = t.slice(HB, HB, dim=0).load(LA)
        fence_async_shared()
        mbarrier.arrive(empty.index(slot))
        acc_a = _wx(acc_a, wa, xs.index(2 * c), BK, LA, BITS)
        acc_b = _wx(acc_b, wb, xs.index(2 * c + 1), BK, LA, BITS)
        it += 1
    return _rows(acc_a + acc_b, VEC, TK, NW), it


# ---- epilogues ----------------------------------------------------------------------------------------------
# QKV: pairs j = a1 .. a1+a2-1 of the stacked q|k|v heads (pair j = rows (i, i + D/2) of head j // (D/2));
# out_lo = lo·cos − hi·sin, out_hi = hi·cos + lo·sin (rotate_half RoPE; v unrotated), with the reference's
# roundings; q → q buffer, k/v → cache[layer, kv head, pos].
# QK_NORM (Qwen3): the per-head RMSNorm needs a whole head, and a tile of BR rows holds BR/2 of its D/2 pairs, so
# the task stores raw q (+ bias) → q buffer and raw k (+ bias) → knew (NKV, D), both rounded to ACT as the
# reference's linear output is; the ATTN task norms and rotates them (_qk_norm_rope). v → cache as above.
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
    lo = _rnd(acc_lo, ACT)
    hi = _rnd(acc_hi, ACT)
    i = j % HALF
    head = j // HALF
    is_q = head < NQH
    is_v = head >= NQH + NKV
    if QK_NORM:
        out_lo = lo.to(ACT)
        out_hi = hi.to(ACT)
    else:
        out_lo = gl.where(is_v, lo, _rnd(_rnd(lo * c, ACT) - _rnd(hi * s, ACT), ACT)).to(ACT)
        out_hi = gl.where(is_v, hi, _rnd(_rnd(hi * c, ACT) + _rnd(lo * s, ACT), ACT)).to(ACT)
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
    val = _rnd(acc, ACT)
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
def _attention(layer, kvh, split, pos, sm_scale, ticket_cnt, sig, wait_ptr, target, do_wait, spin_cap, counters_ptr,
               q_ptr, kc_ptr, vc_ptr, pm_ptr, pl_ptr, pacc_ptr, attn_ptr, D: gl.constexpr, G: gl.constexpr,
               GP: gl.constexpr, NKV: gl.constexpr, S_MAX: gl.constexpr, NSPLIT: gl.constexpr,
               MIN_CHUNK: gl.constexpr, BLOCK_S: gl.constexpr, BLOCK_SPLIT: gl.constexpr, VD: gl.constexpr,
               TD: gl.constexpr, NW: gl.constexpr, TIMELINE: gl.constexpr,
               knew_ptr, qknorm_ptr, cos_ptr, sin_ptr, eps, QK_NORM: gl.constexpr):
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
        seen = _spin(wait_ptr, target, spin_cap)
        gl.thread_barrier()
    t_ready = 0
    if TIMELINE:
        t_ready = _now(pos)
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
    t_q = _stamp_after(q, TIMELINE)  # q normed and rotated with q/k-norm
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
        m_new = gl.maximum(m, gl.max(sc, axis=1))
        alpha = gl.exp(m - m_new)
        p = gl.exp(sc - gl.expand_dims(m_new, 1))
        l = l * alpha + gl.sum(p, axis=1)
        pv = gl.sum(gl.expand_dims(p, 2) * gl.expand_dims(v.to(gl.float32), 0), axis=1)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, QL)), 1) + pv
        m = m_new
        k = k_n
        v = v_n
        s0 += BLOCK_S
    t_math = pos.to(gl.int64) * 0  # int64 like the stamps
    if TIMELINE:  # the reduction makes the stamp wait for the math (and so for the loads it used)
        t_math = _now(gl.max(l, axis=0).to(gl.int32))
    t_loop = t_math  # one layout: the block loop's end is the math's
    t_ticket = _attn_publish(kvh, split, pos, m, l, acc, ticket_cnt, sig, counters_ptr, pm_ptr, pl_ptr, pacc_ptr,
                             attn_ptr, D, G, GP, NSPLIT, MIN_CHUNK, BLOCK_SPLIT, L3, TIMELINE, GP, QL,
                             gl.SliceLayout(1, SL))
    return seen, t_ready, t_math, t_ticket, t_q, t_loop


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
                          BLOCK_S: gl.constexpr, TIMELINE: gl.constexpr):
    """A split's first K/V block (``offs``/``mk`` in the caller's layout) and the task's dependency wait: the block
    is loaded before the wait when it holds no position written in this step (its latency hides behind the wait),
    after it otherwise. Returns (k, v, the last counter value seen or ``target``, the ns stamp of the wait met or
    0 without TIMELINE)."""
    old = s_lo + BLOCK_S <= pos
    k = gl.load(kc_ptr + offs, mask=mk & old, other=0.0, cache_modifier=".cg")
    v = gl.load(vc_ptr + offs, mask=mk & old, other=0.0, cache_modifier=".cg")
    seen = target
    if do_wait:
        seen = _spin(wait_ptr, target, spin_cap)
        gl.thread_barrier()
    t_ready = 0
    if TIMELINE:
        t_ready = _now(pos)
    if s_lo + BLOCK_S > pos:
        k = gl.load(kc_ptr + offs, mask=mk, other=0.0, cache_modifier=".cg")
        v = gl.load(vc_ptr + offs, mask=mk, other=0.0, cache_modifier=".cg")
    return k, v, seen, t_ready


# ATTN_WARPS (no q/k-norm; the default where gluon.host.resolve_attn_layout picks it): the same task with each warp
# owning BLOCK_S / NW positions of a block, layout (GP, NW, SW, D). The online softmax runs per warp (max, Σp and
# Σp·v reduce over lanes only), and the warps' (m, l, acc) are combined once after the last block, where the block
# layout reduces over positions across all warps (through shared memory) three times per block. On the H200
# (session 6) it left one block's math as it was (2.8 → 2.9 µs on Llama-3.2-1B) but took 4096 context from
# 1.18 to 1.09 ms (gluon_check, stepwise).
@gluon.jit
def _attention_warps(layer, kvh, split, pos, sm_scale, ticket_cnt, sig, wait_ptr, target, do_wait, spin_cap,
                     counters_ptr, q_ptr, kc_ptr, vc_ptr, pm_ptr, pl_ptr, pacc_ptr, attn_ptr, D: gl.constexpr,
                     G: gl.constexpr, GP: gl.constexpr, NKV: gl.constexpr, S_MAX: gl.constexpr,
                     NSPLIT: gl.constexpr, MIN_CHUNK: gl.constexpr, BLOCK_S: gl.constexpr,
                     BLOCK_SPLIT: gl.constexpr, VD: gl.constexpr, TD: gl.constexpr, NW: gl.constexpr,
                     TIMELINE: gl.constexpr):
    """:func:`_attention` for models without q/k-norm, warp-local online softmax; same returns."""
    SW: gl.constexpr = BLOCK_S // NW
    L4: gl.constexpr = gl.BlockedLayout([1, 1, 1, VD], [1, 1, 32 // TD, TD], [1, NW, 1, 1], [3, 2, 1, 0])
    K3: gl.constexpr = gl.SliceLayout(0, L4)   # (NW, SW, D): k, v
    S3: gl.constexpr = gl.SliceLayout(3, L4)   # (GP, NW, SW): scores
    A3: gl.constexpr = gl.SliceLayout(2, L4)   # (GP, NW, D): each warp's acc
    MW: gl.constexpr = gl.SliceLayout(2, S3)   # (GP, NW): each warp's max and sum
    QW: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(1, L4))  # (GP, D): q
    L3: gl.constexpr = gl.BlockedLayout([1, 1, VD], [1, 32 // TD, TD], [1, NW, 1], [2, 1, 0])  # _attention's
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
                                                spin_cap, BLOCK_S, TIMELINE)
    gqw = gl.arange(0, GP, layout=gl.SliceLayout(1, QW))
    dqw = gl.arange(0, D, layout=gl.SliceLayout(0, QW))
    q = gl.load(q_ptr + gl.expand_dims(kvh * G + gqw, 1) * D + gl.expand_dims(dqw, 0),
                mask=gl.expand_dims(gqw < G, 1), other=0.0, cache_modifier=".cg").to(gl.float32)
    t_q = _stamp_after(q, TIMELINE)
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
        m_new = gl.maximum(m, gl.max(sc, axis=2))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # a warp with no position yet: exp(−inf) = 0, no NaN
        alpha = gl.exp(m - m_use)
        p = gl.exp(sc - gl.expand_dims(m_use, 2))
        l = l * alpha + gl.sum(p, axis=2)
        pv = gl.sum(gl.expand_dims(p, 3) * gl.expand_dims(v.to(gl.float32), 0), axis=2)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(2, A3)), 2) + pv
        m = m_new
        k = k_n
        v = v_n
        s0 += BLOCK_S
    t_loop = _stamp_after(l, TIMELINE)
    # the warps' partials: M = max_w m_w, L = Σ_w l_w·e^(m_w − M), ACC = Σ_w acc_w·e^(m_w − M)
    mx = gl.max(m, axis=1)
    wgt = gl.exp(m - gl.expand_dims(mx, 1))
    m_f = gl.convert_layout(mx, gl.SliceLayout(1, SL))
    l_f = gl.convert_layout(gl.sum(l * wgt, axis=1), gl.SliceLayout(1, SL))
    acc_f = gl.convert_layout(gl.sum(acc * gl.expand_dims(gl.convert_layout(wgt, gl.SliceLayout(2, A3)), 2), axis=1),
                              QL)
    t_math = pos.to(gl.int64) * 0
    if TIMELINE:
        t_math = _now(gl.max(l_f, axis=0).to(gl.int32))
    t_ticket = _attn_publish(kvh, split, pos, m_f, l_f, acc_f, ticket_cnt, sig, counters_ptr, pm_ptr, pl_ptr,
                             pacc_ptr, attn_ptr, D, G, GP, NSPLIT, MIN_CHUNK, BLOCK_SPLIT, L3, TIMELINE, GP, QL,
                             gl.SliceLayout(1, SL))
    return seen, t_ready, t_math, t_ticket, t_q, t_loop


# ATTN_MMA (bf16 / fp16; prepared in session 7, not yet run on a GPU): the same task on the tensor
# cores. The kv head's G query heads padded to MR = 16 rows are the A operand of ``mma.sync`` m16n8k16
# (``mma_v2``); a block's scores S = q·Kᵀ (MR, BLOCK_S) and its P·V (MR, D) are two chains of a few MMAs per warp,
# warps splitting the n columns (positions, then D). The online softmax runs on S in the MMA layout: its row max
# and sum reduce across the warps (shared memory), and P is rounded to ACT for the second MMA (as flash-attention
# kernels do; the other layouts keep P in float32). Session 7's stamps put the warp layout's loop over one block
# at ~1.7 µs (~960 instructions per thread, 128 shuffles) and its cross-warp combine at 1.2 µs (Llama-3.2-1B).
@gluon.jit
def _attention_mma(layer, kvh, split, pos, sm_scale, ticket_cnt, sig, wait_ptr, target, do_wait, spin_cap,
                   counters_ptr, q_ptr, kc_ptr, vc_ptr, pm_ptr, pl_ptr, pacc_ptr, attn_ptr, D: gl.constexpr,
                   G: gl.constexpr, GP: gl.constexpr, NKV: gl.constexpr, S_MAX: gl.constexpr,
                   NSPLIT: gl.constexpr, MIN_CHUNK: gl.constexpr, BLOCK_S: gl.constexpr,
                   BLOCK_SPLIT: gl.constexpr, VD: gl.constexpr, TD: gl.constexpr, NW: gl.constexpr,
                   TIMELINE: gl.constexpr, knew_ptr, qknorm_ptr, cos_ptr, sin_ptr, eps, QK_NORM: gl.constexpr):
    """:func:`_attention` on the tensor cores (16-bit activations, at most 16 query heads per kv head); same
    returns. ``QK_NORM`` as in :func:`_attention`: q normed and rotated before it becomes the A operand, the new k
    normed and rotated from ``knew_ptr``, written to the cache by the split holding ``pos`` and put into its K
    block in place of the cache's row before the block becomes the B operand."""
    ACT: gl.constexpr = attn_ptr.dtype.element_ty
    MR: gl.constexpr = 16
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, NW], instr_shape=[16, 8])
    AOP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    BOP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    KB: gl.constexpr = gl.BlockedLayout([1, VD], [32 // TD, TD], [NW, 1], [1, 0])  # (rows, D) loads, D contiguous
    L3: gl.constexpr = gl.BlockedLayout([1, 1, VD], [1, 32 // TD, TD], [1, NW, 1], [2, 1, 0])  # the combine's
    RL: gl.constexpr = gl.SliceLayout(1, MMA)  # (MR,): m, l
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
    k, v, seen, t_ready = _first_block_and_wait(kc_ptr, vc_ptr, offs, mk, s_lo, pos, wait_ptr, target, do_wait,
                                                spin_cap, BLOCK_S, TIMELINE)
    gq = gl.arange(0, MR, layout=gl.SliceLayout(1, KB))
    qrow = gl.expand_dims(kvh * G + gq, 1) * D
    mq = gl.expand_dims(gq < G, 1)
    q = gl.load(q_ptr + qrow + gl.expand_dims(dk, 0), mask=mq, other=0.0, cache_modifier=".cg")
    if QK_NORM:  # (the cache's row pos is not written yet in this step: the new k replaces it in the K block)
        qf = q.to(gl.float32)
        qp = gl.load(q_ptr + qrow + gl.expand_dims(dkp, 0), mask=mq, other=0.0, cache_modifier=".cg").to(gl.float32)
        kr = gl.load(knew_ptr + kvh * D + dk, cache_modifier=".cg").to(gl.float32)
        krp = gl.load(knew_ptr + kvh * D + dkp, cache_modifier=".cg").to(gl.float32)
        inv_q = gl.rsqrt(gl.sum(qf * qf, axis=1) / D + eps)
        q = _norm_rope(qf, qp, gl.expand_dims(inv_q, 1), wq, wqp, gl.expand_dims(c, 0), gl.expand_dims(s_, 0),
                       gl.expand_dims(dk < HALF, 0), ACT).to(ACT)
        inv_k = gl.rsqrt(gl.sum(kr * kr, axis=0) / D + eps)
        knew = _norm_rope(kr, krp, inv_k, wk, wkp, c, s_, dk < HALF, ACT).to(ACT)
        if s_hi == n:  # this split holds pos: the normed, rotated k goes to the cache for the later steps. Its own
            # K loads may read row pos before or after this store: the where() in the loop replaces it either way
            gl.store(kc_ptr + base + pos.to(gl.int64) * D + dk, knew)
        knew2 = gl.expand_dims(knew, 0)
    qa = gl.convert_layout(q, AOP)  # (MR, D) in ACT, the rows past G zero
    t_q = _stamp_after(q.to(gl.float32), TIMELINE)
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
        sc = mma_v2(qa, gl.convert_layout(gl.permute(k, [1, 0]), BOP), gl.zeros([MR, BLOCK_S], gl.float32, MMA))
        sc = gl.where(gl.expand_dims(s0 + ss < s_hi, 0), sc * sm_scale, float("-inf"))
        m_new = gl.maximum(m, gl.max(sc, axis=1))
        alpha = gl.exp(m - m_new)
        p = gl.exp(sc - gl.expand_dims(m_new, 1))
        l = l * alpha + gl.sum(p, axis=1)
        acc = mma_v2(gl.convert_layout(p.to(ACT), AOP), gl.convert_layout(v, BOP), acc * gl.expand_dims(alpha, 1))
        m = m_new
        k = k_n
        v = v_n
        s0 += BLOCK_S
    t_math = pos.to(gl.int64) * 0
    if TIMELINE:
        t_math = _now(gl.max(l, axis=0).to(gl.int32))
    t_ticket = _attn_publish(kvh, split, pos, m, l, acc, ticket_cnt, sig, counters_ptr, pm_ptr, pl_ptr,
                             pacc_ptr, attn_ptr, D, G, GP, NSPLIT, MIN_CHUNK, BLOCK_SPLIT, L3, TIMELINE, MR, MMA, RL)
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
    used = _splits_used(pos, NSPLIT, MIN_CHUNK)
    if used == 1:
        out = acc / gl.expand_dims(gl.convert_layout(l, gl.SliceLayout(1, QL)), 1)
        gl.store(attn_ptr + gl.expand_dims(hq, 1) * D + gl.expand_dims(dq, 0), out.to(ACT),
                 mask=gl.expand_dims(mq, 1))
        gl.thread_barrier()
        gl.atomic_add(counters_ptr + sig, 1, sem="release", scope="gpu")
        if TIMELINE:
            t_ticket = _now(pos)
    else:
        _store_partials(kvh, split, m, l, acc, hq, mq, pm_ptr, pl_ptr, pacc_ptr, D, G, R, NSPLIT, LA, LM)
        gl.thread_barrier()
        ticket = gl.atomic_add(counters_ptr + ticket_cnt, 1, sem="acq_rel", scope="gpu")
        if TIMELINE:
            t_ticket = _now(ticket)
        if ticket == used - 1:
            gl.atomic_xchg(counters_ptr + ticket_cnt, 0, sem="relaxed", scope="gpu")
            gl.thread_barrier()
            _attn_combine(kvh, used, pm_ptr, pl_ptr, pacc_ptr, attn_ptr, D, G, GP, NSPLIT, BLOCK_SPLIT, L3)
            gl.thread_barrier()
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
    n = _rnd(_rnd(x * inv, ACT) * w, ACT)
    npart = _rnd(_rnd(xp * inv, ACT) * wp, ACT)
    a = _rnd(n * c, ACT)
    b = _rnd(npart * s, ACT)
    return _rnd(gl.where(lo_half, a - b, a + b), ACT)


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


# ---- the partitions -----------------------------------------------------------------------------------------
@gluon.jit
def _consumer(bufs, full, empty, xs, table_ptr, counts_ptr, max_tasks, state_ptr, counters_ptr, done_ptr, err_ptr,
              timeline_ptr, emb_ptr, fnorm_ptr, bqkv_ptr, anorm_ptr, mnorm_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr,
              x_ptr, q_ptr, pm_ptr, pl_ptr, pacc_ptr, attn_ptr, act_ptr, logits_ptr, amax_ptr,
              spin_cap, advance, tok_in, eps, sm_scale,
              H: gl.constexpr, Q: gl.constexpr, KV: gl.constexpr, I: gl.constexpr, V: gl.constexpr,
              D: gl.constexpr, G: gl.constexpr, GP: gl.constexpr, NKV: gl.constexpr, S_MAX: gl.constexpr,
              NSPLIT: gl.constexpr, MIN_CHUNK: gl.constexpr, NF: gl.constexpr, BR: gl.constexpr,
              BK: gl.constexpr, NS: gl.constexpr, NCH_H: gl.constexpr, NCH_Q: gl.constexpr, NCH_I: gl.constexpr,
              KCH_H: gl.constexpr, KCH_Q: gl.constexpr, KCH_I: gl.constexpr, VEC: gl.constexpr,
              TK: gl.constexpr, BLOCK_S: gl.constexpr, BLOCK_SPLIT: gl.constexpr, VD: gl.constexpr,
              TD: gl.constexpr, HAS_BIAS: gl.constexpr, TIMELINE: gl.constexpr, NW: gl.constexpr,
              SPLIT: gl.constexpr, IP: gl.constexpr, WAIT_PF: gl.constexpr, WAIT_PF_OPS: gl.constexpr,
              PF_LANES_C: gl.constexpr, WAIT_PF_LINE: gl.constexpr, wqkv_ptr, wo_ptr, wgu_ptr,
              wdown_ptr, head_ptr,
              qknorm_ptr, knew_ptr, QK_NORM: gl.constexpr, LM_CTA: gl.constexpr, ATTN_WARPS: gl.constexpr,
              sigbar, ackbar, SIG_GATE: gl.constexpr, ATTN_GATE: gl.constexpr, MV_BITS: gl.constexpr,
              ATTN_MMA: gl.constexpr):
    ACT: gl.constexpr = x_ptr.dtype.element_ty
    BRO: gl.constexpr = BR // SPLIT   # rows of an O-proj / down task
    HALF: gl.constexpr = D // 2
    HB: gl.constexpr = BR // 2
    LW: gl.constexpr = gl.BlockedLayout([1, VEC], [32 // TK, TK], [NW, 1], [1, 0])
    YL: gl.constexpr = gl.SliceLayout(1, LW)
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
            t_start = _now(i)
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
        skip = 0
        if op == OP_ATTN:  # splits beyond this position's non-empty ones read and write nothing
            if a2 >= _splits_used(pos, NSPLIT, MIN_CHUNK):
                skip = 1
                wait_cnt = -1
        if (wait_cnt >= 0) & (bad == 0) & (op != OP_ATTN):  # attention waits inside, after its first loads
            need = gl.load(row + F_NEED)
            target = epoch * gl.load(row + F_INC) + need
            if (wait_cnt != known_cnt) | (known_seen < target):
                if WAIT_PF > 0:
                    if ((WAIT_PF_OPS >> op) & 1) != 0:
                        _prefetch_past_ring(row, i, n, wqkv_ptr, wo_ptr, wgu_ptr, wdown_ptr, head_ptr, NF, H, Q, KV,
                                            I, IP, BR, BK, NS, NCH_H, NCH_Q, NCH_I, SPLIT, WAIT_PF, PF_LANES_C, NW,
                                            WAIT_PF_LINE)
                seen = _spin(counters_ptr + wait_cnt, target, spin_cap)
                gl.thread_barrier()
                known_cnt = wait_cnt
                known_seen = seen
                if seen < target:
                    _record_stuck(err_ptr, op, layer, gl.load(row + F_TILE), pid, wait_cnt, seen - (target - need),
                                  need, gl.load(row + F_GIDX))
                    bad = 1
        if TIMELINE:
            t_ready = _now(i)
            t_staged = t_ready
            t_mv = t_ready
        key = layer * 8 + op
        if op == OP_ATTN:
            if skip == 0:
                need = gl.load(row + F_NEED)
                target = epoch * gl.load(row + F_INC) + need
                if ATTN_MMA:
                    seen, t_attn, t_math, t_ticket, t_staged, t_mv = _attention_mma(
                        layer, gl.load(row + F_A0), a2, pos, sm_scale, gl.load(row + F_TICKET), gl.load(row + F_SIGNAL),
                        counters_ptr + gl.maximum(wait_cnt, 0), target, (wait_cnt >= 0) & (bad == 0), spin_cap,
                        counters_ptr, q_ptr, kc_ptr, vc_ptr, pm_ptr, pl_ptr, pacc_ptr, attn_ptr, D, G, GP, NKV, S_MAX,
                        NSPLIT, MIN_CHUNK, BLOCK_S, BLOCK_SPLIT, VD, TD, NW, TIMELINE, knew_ptr, qknorm_ptr, cos_ptr,
                        sin_ptr, eps, QK_NORM)
                elif ATTN_WARPS:
                    seen, t_attn, t_math, t_ticket, t_staged, t_mv = _attention_warps(
                        layer, gl.load(row + F_A0), a2, pos, sm_scale, gl.load(row + F_TICKET), gl.load(row + F_SIGNAL),
                        counters_ptr + gl.maximum(wait_cnt, 0), target, (wait_cnt >= 0) & (bad == 0), spin_cap,
                        counters_ptr, q_ptr, kc_ptr, vc_ptr, pm_ptr, pl_ptr, pacc_ptr, attn_ptr, D, G, GP, NKV, S_MAX,
                        NSPLIT, MIN_CHUNK, BLOCK_S, BLOCK_SPLIT, VD, TD, NW, TIMELINE)
                else:
                    seen, t_attn, t_math, t_ticket, t_staged, t_mv = _attention(
                        layer, gl.load(row + F_A0), a2, pos, sm_scale, gl.load(row + F_TICKET), gl.load(row + F_SIGNAL),
                        counters_ptr + gl.maximum(wait_cnt, 0), target, (wait_cnt >= 0) & (bad == 0), spin_cap,
                        counters_ptr, q_ptr, kc_ptr, vc_ptr, pm_ptr, pl_ptr, pacc_ptr, attn_ptr, D, G, GP, NKV, S_MAX,
                        NSPLIT, MIN_CHUNK, BLOCK_S, BLOCK_SPLIT, VD, TD, NW, TIMELINE, knew_ptr, qknorm_ptr, cos_ptr,
                        sin_ptr, eps, QK_NORM)
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
                    _stage_vector(emb_row, anorm_ptr, xs, eps, True, H, KCH_H, BK, VEC, TK, NW)
                else:
                    _stage_vector(x_ptr, anorm_ptr + layer.to(gl.int64) * H, xs, eps, True, H, KCH_H, BK, VEC,
                                  TK, NW)
                staged = key
            if TIMELINE:
                t_staged = _now(i)
            acc_lo, acc_hi, it = _mv_pair(bufs, full, empty, xs, it, NCH_H, NS, HB, BK, VEC, TK, NW, MV_BITS)
            if TIMELINE:
                t_mv = _now(i)
            _qkv_epilogue(acc_lo + bias_lo, acc_hi + bias_hi, layer, a1, a2, pos, rope_c, rope_s, q_ptr, kc_ptr,
                          vc_ptr, Q, KV, D, NKV, S_MAX, HB, YL, knew_ptr, QK_NORM)
        elif op == OP_GATEUP:
            if key != staged:
                _stage_vector(x_ptr, mnorm_ptr + layer.to(gl.int64) * H, xs, eps, True, H, KCH_H, BK, VEC, TK, NW)
                staged = key
            if TIMELINE:
                t_staged = _now(i)
            acc_g, acc_u, it = _mv_pair(bufs, full, empty, xs, it, NCH_H, NS, HB, BK, VEC, TK, NW, MV_BITS)
            if TIMELINE:
                t_mv = _now(i)
            j = a1 + gl.arange(0, HB, layout=YL)
            mj = (j < a1 + a2) & (j < I)
            g = _rnd(acc_g, ACT)
            u = _rnd(acc_u, ACT)
            silu = _rnd(g / (1.0 + gl.exp(-g)), ACT)
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
            if key != staged:
                _stage_vector(attn_ptr, attn_ptr, xs, eps, False, Q, KCH_Q, BK, VEC, TK, NW)
                staged = key
            if TIMELINE:
                t_staged = _now(i)
            if SPLIT == 2:
                acc, it = _mv_halves(bufs, full, empty, xs, it, NCH_Q, NS, BRO, BK, VEC, TK, NW, MV_BITS)
            else:
                acc, it = _mv_single(bufs, full, empty, xs, it, NCH_Q, NS, BR, BK, VEC, TK, NW, MV_BITS)
            if TIMELINE:
                t_mv = _now(i)
            gl.store(x_ptr + r, (res + _rnd(acc, ACT)).to(ACT), mask=mr)
        elif op == OP_DOWN:
            r = a1 + gl.arange(0, BRO, layout=YL)  # residual first, as in OPROJ
            mr = r < a1 + a2
            res = gl.load(x_ptr + r, mask=mr, other=0.0, cache_modifier=".cg").to(gl.float32)
            if key != staged:
                _stage_vector(act_ptr, act_ptr, xs, eps, False, I, KCH_I, BK, VEC, TK, NW)
                staged = key
            if TIMELINE:
                t_staged = _now(i)
            if SPLIT == 2:
                acc, it = _mv_halves(bufs, full, empty, xs, it, NCH_I, NS, BRO, BK, VEC, TK, NW, MV_BITS)
            else:
                acc, it = _mv_single(bufs, full, empty, xs, it, NCH_I, NS, BR, BK, VEC, TK, NW, MV_BITS)
            if TIMELINE:
                t_mv = _now(i)
            gl.store(x_ptr + r, (res + _rnd(acc, ACT)).to(ACT), mask=mr)
        elif op == OP_LMHEAD:
            if key != staged:
                _stage_vector(x_ptr, fnorm_ptr, xs, eps, True, H, KCH_H, BK, VEC, TK, NW)
                staged = key
            if TIMELINE:
                t_staged = _now(i)
            acc, it = _mv_single(bufs, full, empty, xs, it, NCH_H, NS, BR, BK, VEC, TK, NW, MV_BITS)
            if TIMELINE:
                t_mv = _now(i)
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
            t_end = _now(i)
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
def _load_od(desc, r0, c, bar, slot_buf, BR: gl.constexpr, BK: gl.constexpr, SPLIT: gl.constexpr):
    """One O-proj / down slot: with SPLIT = 2 two [BR/2, BK] boxes, columns of chunks 2c and 2c + 1 (a box past
    K is zero-filled by TMA); else one [BR, BK] box."""
    if SPLIT == 2:
        tma.async_copy_global_to_shared(desc, [r0, (2 * c) * BK], bar, slot_buf.slice(0, BR // 2, dim=0))
        tma.async_copy_global_to_shared(desc, [r0, (2 * c + 1) * BK], bar, slot_buf.slice(BR // 2, BR // 2, dim=0))
    else:
        tma.async_copy_global_to_shared(desc, [r0, c * BK], bar, slot_buf)


@gluon.jit
def _task_tiles(op, NCH_H: gl.constexpr, NCH_Q: gl.constexpr, NCH_I: gl.constexpr, SPLIT: gl.constexpr):
    """Ring tiles of a task: 0 for attention (no weights), else its column chunks (paired under SPLIT = 2)."""
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
    """L2 prefetch of one ring tile. ``LINE`` False: ``cp.async.bulk.prefetch.L2`` per row (PTX ISA 8.0, sm_90:
    16-byte aligned address and size), ``LANES`` (a power of two >= BR) row slots over the calling partition's
    ``WARPS`` warps, columns past K clipped, slots past the tile's rows predicated off; it goes through the SM's
    TMA unit. ``LINE`` True: ``prefetch.global.L2`` per 128-byte line from the load/store units (one line per
    slot of ``BR·BK·bytes/128``), which leaves the TMA queue to the ring's loads."""
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
        laddr = (base + r.to(gl.int64) * K + col).to(gl.int64, bitcast=True)
        gl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
            "=r,l,r", [laddr, ok], dtype=gl.int32, is_pure=False, pack=1)
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
def _producer(wqkv_desc, wo_desc, wgu_desc, wdown_desc, head_desc, bufs, full, empty, table_ptr, counts_ptr,
              max_tasks, state_ptr, counters_ptr, timeline_ptr, spin_cap,
              H: gl.constexpr, Q: gl.constexpr, KV: gl.constexpr, IP: gl.constexpr, NF: gl.constexpr,
              BR: gl.constexpr, BK: gl.constexpr, NS: gl.constexpr, NCH_H: gl.constexpr, NCH_Q: gl.constexpr,
              NCH_I: gl.constexpr, PREFETCH: gl.constexpr, TIMELINE: gl.constexpr, SPLIT: gl.constexpr,
              wqkv_ptr, wo_ptr, wgu_ptr, wdown_ptr, head_ptr, I: gl.constexpr, L2_AHEAD: gl.constexpr,
              PF_LANES_P: gl.constexpr, sigbar, ackbar, SIG_GATE: gl.constexpr, ATTN_GATE: gl.constexpr,
              NSPLIT: gl.constexpr, MIN_CHUNK: gl.constexpr):
    TILE_BYTES: gl.constexpr = BR * BK * wqkv_desc.dtype.primitive_bitwidth // 8
    NROWS: gl.constexpr = Q + 2 * KV
    GATED: gl.constexpr = (SIG_GATE >= 0) | (ATTN_GATE >= 0)
    pid = gl.program_id(0)
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
    # CTA's stores, and those queue behind this SM's weight loads in flight (session 6 phase stamps: a signalling
    # gate-up task's epilogue 3.7 µs, 0.22 µs without the signal)
    # ATTN_GATE >= 0: the same after an attention task that runs, until the consumer has finished it (its loads,
    # tickets and stores are the layer's chain, and would queue behind the tiles issued meanwhile)
    pend = 0   # a gated task is passed (a signalling weight task's tiles all issued), its end not yet waited for
    sgw = 0    # gated tasks waited for (the mbarriers' phases)
    since = 0  # tiles issued since
    lim = pos * 0 + SIG_GATE  # the allowance of the pending task (a runtime value: loop-carried)
    if L2_AHEAD > 0:
        prow, pi, pc = _cursor_next(prow, pi, pc, n, NF, NCH_H, NCH_Q, NCH_I, SPLIT)
        for _ in range(L2_AHEAD):
            prow, pi, pc = _cursor_next(prow, pi, pc, n, NF, NCH_H, NCH_Q, NCH_I, SPLIT)
    for i in range(n):
        op = gl.load(row + F_OP)
        if op != OP_ATTN:
            layer = gl.load(row + F_LAYER)
            a1 = gl.load(row + F_A1)
            if PREFETCH == 0:  # pipelining off: load a task's weights only once its inputs are ready
                wait_cnt = gl.load(row + F_WAIT)
                if (wait_cnt >= 0) & (bad == 0):
                    target = epoch * gl.load(row + F_INC) + gl.load(row + F_NEED)
                    if _spin(counters_ptr + wait_cnt, target, spin_cap) < target:
                        bad = 1  # the consumer records it; just stop waiting
            nch = NCH_H
            r0 = a1
            if op == OP_QKV:
                r0 = layer * NROWS + 2 * a1
            elif op == OP_OPROJ:
                nch = (NCH_Q + SPLIT - 1) // SPLIT
                r0 = layer * H + a1
            elif op == OP_GATEUP:
                r0 = layer * (2 * IP) + 2 * a1
            elif op == OP_DOWN:
                nch = (NCH_I + SPLIT - 1) // SPLIT
                r0 = layer * H + a1
            for c in range(nch):
                if GATED:
                    if (pend != 0) & (since >= lim):
                        sgw = _gate_wait(sigbar, ackbar, sgw)
                        pend = 0
                slot = it % NS
                mbarrier.wait(empty.index(slot), ((it // NS) & 1) ^ 1)
                if TIMELINE:
                    if c == 0:
                        gl.store(timeline_ptr + (pid * max_tasks + i).to(gl.int64) * STAMPS + 3, _now(c))
                mbarrier.expect(full.index(slot), TILE_BYTES)
                if op == OP_QKV:
                    tma.async_copy_global_to_shared(wqkv_desc, [r0, c * BK], full.index(slot), bufs.index(slot))
                elif op == OP_OPROJ:
                    _load_od(wo_desc, r0, c, full.index(slot), bufs.index(slot), BR, BK, SPLIT)
                elif op == OP_GATEUP:
                    tma.async_copy_global_to_shared(wgu_desc, [r0, c * BK], full.index(slot), bufs.index(slot))
                elif op == OP_DOWN:
                    _load_od(wdown_desc, r0, c, full.index(slot), bufs.index(slot), BR, BK, SPLIT)
                else:
                    tma.async_copy_global_to_shared(head_desc, [r0, c * BK], full.index(slot), bufs.index(slot))
                if L2_AHEAD > 0:
                    if pi < n:
                        _l2_prefetch_tile(prow, pc, wqkv_ptr, wo_ptr, wgu_ptr, wdown_ptr, head_ptr, H, Q, KV, I, IP,
                                          BR, BK, SPLIT, PF_LANES_P, 1)
                        prow, pi, pc = _cursor_next(prow, pi, pc, n, NF, NCH_H, NCH_Q, NCH_I, SPLIT)
                it += 1
                since += 1
            if TIMELINE:
                gl.store(timeline_ptr + (pid * max_tasks + i).to(gl.int64) * STAMPS + 4, _now(i))
            if SIG_GATE >= 0:
                if gl.load(row + F_SIGINC) > 0:
                    # two gated tasks within the allowance: the first is waited for now (phases: see _gate_arrive)
                    if pend != 0:
                        sgw = _gate_wait(sigbar, ackbar, sgw)
                    pend = 1
                    since = 0
                    lim = pos * 0 + SIG_GATE
        elif ATTN_GATE >= 0:
            if gl.load(row + F_A2) < _splits_used(pos, NSPLIT, MIN_CHUNK):  # as the consumer skips empty splits
                if pend != 0:
                    sgw = _gate_wait(sigbar, ackbar, sgw)
                pend = 1
                since = 0
                lim = pos * 0 + ATTN_GATE
        row += NF


@gluon.jit(do_not_specialize=["max_tasks", "spin_cap", "advance", "tok_in"])
def megakernel(
        wqkv_desc, wo_desc, wgu_desc, wdown_desc, head_desc,
        table_ptr, counts_ptr, max_tasks, state_ptr, counters_ptr, done_ptr, err_ptr, timeline_ptr,
        emb_ptr, fnorm_ptr, bqkv_ptr, anorm_ptr, mnorm_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr,
        x_ptr, q_ptr, pm_ptr, pl_ptr, pacc_ptr, attn_ptr, act_ptr, logits_ptr, amax_ptr,
        spin_cap, advance, tok_in, eps, sm_scale,
        H: gl.constexpr, Q: gl.constexpr, KV: gl.constexpr, I: gl.constexpr, IP: gl.constexpr, V: gl.constexpr,
        D: gl.constexpr, G: gl.constexpr, GP: gl.constexpr, NKV: gl.constexpr, S_MAX: gl.constexpr,
        NSPLIT: gl.constexpr, MIN_CHUNK: gl.constexpr, NF: gl.constexpr, BR: gl.constexpr, BK: gl.constexpr,
        NS: gl.constexpr, NCH_H: gl.constexpr, NCH_Q: gl.constexpr, NCH_I: gl.constexpr, KCH_H: gl.constexpr,
        KCH_Q: gl.constexpr, KCH_I: gl.constexpr, KCH: gl.constexpr, VEC: gl.constexpr, TK: gl.constexpr,
        BLOCK_S: gl.constexpr, BLOCK_SPLIT: gl.constexpr, VD: gl.constexpr, TD: gl.constexpr,
        HAS_BIAS: gl.constexpr, PREFETCH: gl.constexpr, TIMELINE: gl.constexpr, NW: gl.constexpr,
        PRODUCER_REGS: gl.constexpr, SPLIT: gl.constexpr, L2_AHEAD: gl.constexpr, WAIT_PF: gl.constexpr,
        WAIT_PF_OPS: gl.constexpr, PF_LANES_P: gl.constexpr, PF_LANES_C: gl.constexpr,
        WAIT_PF_LINE: gl.constexpr, wqkv_ptr, wo_ptr, wgu_ptr, wdown_ptr, head_ptr,
        qknorm_ptr, knew_ptr, QK_NORM: gl.constexpr, LM_CTA: gl.constexpr, ATTN_WARPS: gl.constexpr,
        SIG_GATE: gl.constexpr, ATTN_GATE: gl.constexpr, MV_BITS: gl.constexpr, ATTN_MMA: gl.constexpr):
    """One decode step (or one stage of it, ``advance`` = 0) over the instruction table; see the module docstring.

    ``QK_NORM`` (Qwen3): q/k-norm and RoPE of q and the new k in the attention task (``qknorm_ptr`` (L, 2, D)
    the q_norm and k_norm weights, ``knew_ptr`` (NKV, D) the raw new k; see ``_attention``).

    Shared memory: the ring ``bufs`` (NS, BR, BK) of weight tiles with its ``full``/``empty`` mbarriers, and
    ``xs`` (KCH, BK) for the staged input vector. Grid: one CTA per SM (all resident: the schedule's waits
    need it; the launch is cooperative).
    """
    bufs = gl.allocate_shared_memory(wqkv_desc.dtype, [NS, BR, BK], wqkv_desc.layout)
    full = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    xs = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [KCH, 1, BK], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
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
    gl.warp_specialize([
        (_consumer, (bufs, full, empty, xs, table_ptr, counts_ptr, max_tasks, state_ptr, counters_ptr, done_ptr,
                     err_ptr, timeline_ptr, emb_ptr, fnorm_ptr, bqkv_ptr, anorm_ptr, mnorm_ptr, cos_ptr, sin_ptr,
                     kc_ptr, vc_ptr, x_ptr, q_ptr, pm_ptr, pl_ptr, pacc_ptr, attn_ptr, act_ptr, logits_ptr, amax_ptr,
                     spin_cap, advance, tok_in, eps, sm_scale, H, Q, KV, I, V, D, G, GP, NKV, S_MAX, NSPLIT,
                     MIN_CHUNK, NF, BR, BK, NS, NCH_H, NCH_Q, NCH_I, KCH_H, KCH_Q, KCH_I, VEC, TK, BLOCK_S,
                     BLOCK_SPLIT, VD, TD, HAS_BIAS, TIMELINE, NW, SPLIT, IP, WAIT_PF, WAIT_PF_OPS, PF_LANES_C,
                     WAIT_PF_LINE, wqkv_ptr, wo_ptr, wgu_ptr, wdown_ptr, head_ptr, qknorm_ptr, knew_ptr, QK_NORM,
                     LM_CTA, ATTN_WARPS, sigbar, ackbar, SIG_GATE, ATTN_GATE, MV_BITS, ATTN_MMA)),
        (_producer, (wqkv_desc, wo_desc, wgu_desc, wdown_desc, head_desc, bufs, full, empty, table_ptr, counts_ptr,
                     max_tasks, state_ptr, counters_ptr, timeline_ptr, spin_cap, H, Q, KV, IP, NF, BR, BK, NS,
                     NCH_H, NCH_Q, NCH_I, PREFETCH, TIMELINE, SPLIT, wqkv_ptr, wo_ptr, wgu_ptr, wdown_ptr,
                     head_ptr, I, L2_AHEAD, PF_LANES_P, sigbar, ackbar, SIG_GATE, ATTN_GATE, NSPLIT, MIN_CHUNK)),
    ], [1], [PRODUCER_REGS])
