"""The Gluon megakernel's consumer-side matvec (``kernel.py``'s consumer partition calls these): the task's input
vector staged once into shared memory ``xs``, then ``Σ_k W[r, k]·xs[k]`` in float32 over the weight tiles of the
ring as the producer fills them, one ring slot at a time (wait ``full``, read, release ``empty``)."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from .common import rnd


# ---- staging the input vector ----------------------------------------------------------------------------
# xs (KCH, 1, BK) in ACT holds the current task's K-vector, chunk c = columns [c·BK, (c+1)·BK), zeros past K.
# One load of the whole vector (a single L2 round trip after the dependency wait), then one store.
@gluon.jit
def stage_vector(src_ptr, nw_ptr, xs, eps, NORM: gl.constexpr, K: gl.constexpr, KCH: gl.constexpr,
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
            x = rnd(rnd(x * inv, ACT) * w, ACT)
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
def mv_single(bufs, full, empty, xs, it, NCH: gl.constexpr, NS: gl.constexpr, BR: gl.constexpr,
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
def mv_pair(bufs, full, empty, xs, it, NCH: gl.constexpr, NS: gl.constexpr, HB: gl.constexpr,
             BK: gl.constexpr, VEC: gl.constexpr, TK: gl.constexpr, NW: gl.constexpr, BITS: gl.constexpr = False):
    """Like :func:`mv_single` for a tile of two row blocks (rows [0, HB) and [HB, 2HB)): returns both."""
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
def mv_halves(bufs, full, empty, xs, it, NCH: gl.constexpr, NS: gl.constexpr, HB: gl.constexpr,
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
