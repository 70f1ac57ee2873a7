"""The Gluon megakernel's consumer-side matvec (``kernel.py``'s consumer partition calls these): the task's input
vector staged once into shared memory ``xs``, then ``Σ_k W[r, k]·xs[k]`` in float32 over the weight tiles of the
ring as the producer fills them, one ring slot at a time (wait ``full``, read, release ``empty``): on the CUDA
cores (``mv_single`` / ``mv_pair`` / ``mv_halves``) or on the tensor cores (``mv_mma``, ``mv_widen=mma``)."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, mma_v2

from .common import rnd


# ---- staging the input vector ----------------------------------------------------------------------------
# xs (KCH, 1, BK) in ACT holds the current task's K-vector, chunk c = columns [c·BK, (c+1)·BK), zeros past K.
# One load of the whole vector (a single L2 round trip after the dependency wait), then one store. With a norm,
# W_BESIDE issues the norm weights' load beside the vector's, before the sum of squares: that reduction's barriers
# keep a load written after it from being issued earlier, so otherwise the weights cost a second round trip.
@gluon.jit
def stage_vector(src_ptr, nw_ptr, xs, eps, NORM: gl.constexpr, K: gl.constexpr, KCH: gl.constexpr,
                  BK: gl.constexpr, VEC: gl.constexpr, TK: gl.constexpr, NW: gl.constexpr,
                  W_BESIDE: gl.constexpr = False):
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
            if W_BESIDE:
                w = gl.load(nw_ptr + idx, mask=m, other=0.0).to(gl.float32)
            inv = gl.rsqrt(gl.sum(gl.sum(x * x, axis=1), axis=0) / K + eps)
            if not W_BESIDE:
                w = gl.load(nw_ptr + idx, mask=m, other=0.0).to(gl.float32)
            x = rnd(rnd(x * inv, ACT) * w, ACT)
        xs2.slice(part * PART, PART, dim=0).store(x.to(ACT))
    gl.thread_barrier()


# ---- the weight tiles -------------------------------------------------------------------------------------
# bf16 weights, ``BITS``: the widening to float32 in one instruction per weight. A bf16 pair read as one int32
# holds the even column in its low half and the odd one in its high half, and ``v << 16`` and ``v & 0xFFFF0000``,
# read as float32, are exactly those two values (bf16 is float32's upper half). Triton 3.6 widens each bf16 with
# a PRMT and an IMAD (the 1B kernel's SASS: ~148 widening and address instructions beside the 64 FFMAs of a 16 KB
# slot; benchmarks/NOTES.md, "The consumer's matvec").
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
def _to_rows(v, VEC: gl.constexpr, TK: gl.constexpr, NW: gl.constexpr):
    """A per-row vector in the row layout the epilogues use (SliceLayout(1, LW) of the bf16 tile layout)."""
    LW: gl.constexpr = gl.BlockedLayout([1, VEC], [32 // TK, TK], [NW, 1], [1, 0])
    return gl.convert_layout(v, gl.SliceLayout(1, LW))


@gluon.jit
def _rows(acc, VEC: gl.constexpr, TK: gl.constexpr, NW: gl.constexpr):
    """Σ over columns of a products tile, in the epilogues' row layout (:func:`_to_rows`): the same rows per
    thread, so the conversion moves nothing."""
    return _to_rows(gl.sum(acc, axis=1), VEC, TK, NW)


# ---- the ring loop ------------------------------------------------------------------------------------------
# A ring slot holds SB boxes (consecutive column chunks of the task's rows); box b of the task meets staged chunk b
# (chunks 2b and 2b + 1 with split_k = 2). Per slot: wait until it is full; per box, read it into registers and
# multiply-accumulate, the slot released after its last box is read (the proxy fence, then the arrive that Triton 3.6
# lowers to one thread between two barriers of the consumer warps). The fence waits for the slot's shared-memory
# reads, so each slot pays its read latency before its last box's products (the 1B's QKV tile: 8 slots in 1.86 µs
# with the tiles already in the ring, benchmarks/results/h200-2026-12-02-s10/chain_default_134e7a0.json); SB = 2
# pays the release once per two boxes.
# AHEAD = 1 reads box b + 1 into registers before box b's products (after releasing box b's slot when b is its last
# box), so the reads are in flight during the FMAs and complete by the next release (two boxes of registers).
@gluon.jit
def _box(bufs, it, j: gl.constexpr, NS: gl.constexpr, SB: gl.constexpr, R: gl.constexpr, KW: gl.constexpr,
         LA: gl.constexpr, WT: gl.constexpr, TWO: gl.constexpr):
    """Box ``j`` of ring slot ``it % NS`` in registers: rows [0, R) and [R, 2R) with TWO, else rows [0, R) and 0."""
    SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    box = bufs.index((it % NS) * SB + j)
    if TWO:
        t = box._reinterpret(WT, [2 * R, KW], SL)
        return t.slice(0, R, dim=0).load(LA), t.slice(R, R, dim=0).load(LA)
    else:
        return box._reinterpret(WT, [R, KW], SL).load(LA), 0


@gluon.jit
def _wait_full(full, it, NS: gl.constexpr):
    mbarrier.wait(full.index(it % NS), (it // NS) & 1)


@gluon.jit
def _release(empty, it, NS: gl.constexpr):
    fence_async_shared()  # our generic-proxy reads before the next TMA (async proxy) write of the slot
    mbarrier.arrive(empty.index(it % NS))


@gluon.jit
def _products(acc_a, acc_b, wa, wb, xs, c, BK: gl.constexpr, LA: gl.constexpr, BITS: gl.constexpr,
              TWO: gl.constexpr, XPAIR: gl.constexpr):
    if XPAIR:  # the halves are columns of chunks 2c and 2c + 1 (split_k = 2)
        acc_a = _wx(acc_a, wa, xs.index(2 * c), BK, LA, BITS)
        acc_b = _wx(acc_b, wb, xs.index(2 * c + 1), BK, LA, BITS)
    else:
        acc_a = _wx(acc_a, wa, xs.index(c), BK, LA, BITS)
        if TWO:
            acc_b = _wx(acc_b, wb, xs.index(c), BK, LA, BITS)
    return acc_a, acc_b


# The boxes of a slot are unrolled (static j): a runtime first / last-box test would put a barrier of the consumer
# warps around each test (in the compiled PTX), more than the release that SB = 2 saves.
@gluon.jit
def _ring_mv(bufs, full, empty, xs, it, NBOX: gl.constexpr, NS: gl.constexpr, R: gl.constexpr, BK: gl.constexpr,
             VEC: gl.constexpr, TK: gl.constexpr, NW: gl.constexpr, BITS: gl.constexpr, TWO: gl.constexpr,
             XPAIR: gl.constexpr, AHEAD: gl.constexpr, SB: gl.constexpr):
    """The (R, KW) float32 product accumulators of a task's NBOX boxes (cdiv(NBOX, SB) ring slots; boxes past the
    last are TMA's zeros) against the staged chunks (two, one per row half, with TWO; the second is 0 without), and
    the ring position after them. Products accumulate in a register tile and are reduced across lanes once per task:
    a cross-lane reduction per slot cost as much as the loads (H200: 3.4 TB/s while streaming,
    benchmarks/results/h200-2026-12-01/gluon_check_a.json)."""
    KW: gl.constexpr = BK // 2 if BITS else BK
    LA: gl.constexpr = gl.BlockedLayout([1, VEC // 2 if BITS else VEC], [32 // TK, TK], [NW, 1], [1, 0])
    WT: gl.constexpr = gl.int32 if BITS else bufs.dtype
    NSLOT: gl.constexpr = (NBOX + SB - 1) // SB
    acc_a = gl.zeros([R, KW], gl.float32, LA)
    acc_b = 0
    if TWO:
        acc_b = gl.zeros([R, KW], gl.float32, LA)
    if AHEAD:
        _wait_full(full, it, NS)
        wa, wb = _box(bufs, it, 0, NS, SB, R, KW, LA, WT, TWO)
        for c in range(NSLOT - 1):
            for j in gl.static_range(SB):
                if j == SB - 1:  # every box of this slot is in registers: release it, read the next one's first
                    _release(empty, it, NS)
                    it += 1
                    _wait_full(full, it, NS)
                    na, nb = _box(bufs, it, 0, NS, SB, R, KW, LA, WT, TWO)
                else:
                    na, nb = _box(bufs, it, j + 1, NS, SB, R, KW, LA, WT, TWO)
                acc_a, acc_b = _products(acc_a, acc_b, wa, wb, xs, c * SB + j, BK, LA, BITS, TWO, XPAIR)
                wa = na
                wb = nb
        for j in gl.static_range(SB):  # the last slot
            if j == SB - 1:
                _release(empty, it, NS)
                it += 1
                acc_a, acc_b = _products(acc_a, acc_b, wa, wb, xs, (NSLOT - 1) * SB + j, BK, LA, BITS, TWO, XPAIR)
            else:
                na, nb = _box(bufs, it, j + 1, NS, SB, R, KW, LA, WT, TWO)
                acc_a, acc_b = _products(acc_a, acc_b, wa, wb, xs, (NSLOT - 1) * SB + j, BK, LA, BITS, TWO, XPAIR)
                wa = na
                wb = nb
    else:
        for c in range(NSLOT):
            _wait_full(full, it, NS)
            for j in gl.static_range(SB):
                wa, wb = _box(bufs, it, j, NS, SB, R, KW, LA, WT, TWO)
                if j == SB - 1:
                    _release(empty, it, NS)
                    it += 1
                acc_a, acc_b = _products(acc_a, acc_b, wa, wb, xs, c * SB + j, BK, LA, BITS, TWO, XPAIR)
    return acc_a, acc_b, it


@gluon.jit
def mv_single(bufs, full, empty, xs, it, NCH: gl.constexpr, NS: gl.constexpr, BR: gl.constexpr,
               BK: gl.constexpr, VEC: gl.constexpr, TK: gl.constexpr, NW: gl.constexpr, BITS: gl.constexpr = False,
               AHEAD: gl.constexpr = False, SB: gl.constexpr = 1):
    """acc[r] = Σ_k W[r, k]·xs[k] over NCH column chunks (boxes) of the ring; float32 (BR,) in SliceLayout(1, LW) (see
    :func:`_rows`)."""
    acc, _, it = _ring_mv(bufs, full, empty, xs, it, NCH, NS, BR, BK, VEC, TK, NW, BITS, False, False, AHEAD, SB)
    return _rows(acc, VEC, TK, NW), it


@gluon.jit
def mv_pair(bufs, full, empty, xs, it, NCH: gl.constexpr, NS: gl.constexpr, HB: gl.constexpr,
             BK: gl.constexpr, VEC: gl.constexpr, TK: gl.constexpr, NW: gl.constexpr, BITS: gl.constexpr = False,
             AHEAD: gl.constexpr = False, SB: gl.constexpr = 1):
    """Like :func:`mv_single` for a tile of two row blocks (rows [0, HB) and [HB, 2HB)): returns both."""
    acc_a, acc_b, it = _ring_mv(bufs, full, empty, xs, it, NCH, NS, HB, BK, VEC, TK, NW, BITS, True, False, AHEAD,
                                SB)
    return _rows(acc_a, VEC, TK, NW), _rows(acc_b, VEC, TK, NW), it


@gluon.jit
def mv_halves(bufs, full, empty, xs, it, NCH: gl.constexpr, NS: gl.constexpr, HB: gl.constexpr,
               BK: gl.constexpr, VEC: gl.constexpr, TK: gl.constexpr, NW: gl.constexpr, BITS: gl.constexpr = False,
               AHEAD: gl.constexpr = False, SB: gl.constexpr = 1):
    """acc[r] = Σ_k W[r, k]·xs[k] for HB rows whose boxes hold two column chunks: rows [0, HB) = columns of chunk 2c,
    rows [HB, 2HB) = the same rows, columns of chunk 2c + 1 (split_k = 2; cdiv(NCH, 2) boxes)."""
    acc_a, acc_b, it = _ring_mv(bufs, full, empty, xs, it, (NCH + 1) // 2, NS, HB, BK, VEC, TK, NW, BITS, True, True,
                                AHEAD, SB)
    return _rows(acc_a + acc_b, VEC, TK, NW), it


# ---- the matvec on the tensor cores (mv_widen=mma) ----------------------------------------------------------------
# y[r] = Σ_k W[r, k]·x[k] as NB batched mma.sync m16n8k16 products, one batch per 128-byte box of the slot
# (MB = 64 bf16 / 128 FP8 columns):
#   A = the box's (R, MB) weights (ldmatrix: the producer's TMA boxes are [R, MB] with the 128-byte swizzle, so the
#       8 rows an ldmatrix reads sit in 8 different bank groups),
#   B = the staged chunk's MB values broadcast over the 8 columns (every column of the product is the same sum),
#   acc (NB, R, 8) float32, the batches spread over the warps (MMA layout warps_per_cta [NW, 1, 1]).
# Per 16 KB QKV slot a warp issues 10 ldmatrix and 8 mma.sync (offline PTX of a one-task probe) instead of 8 loads,
# 64 widenings and 64 FMAs per thread; the 1B kernel's PTX holds 124 fma.rn.f32 against the CUDA-core form's 764.
# FP8 weights: A is read as FP8 (k_width 4: four consecutive k per register, the layout 8-bit operands load in)
# and widened to f16 in registers (e4m3 → f16 is exact: f16 holds every e4m3 value), B is the bf16 chunk rounded to
# f16 in the same k order; the products and sums are float32 in the tensor cores. The widening is one cvt per two
# weights, where the CUDA-core form spends a cvt, two f16 → f32 widenings and two FMAs. A staged value beyond f16's
# range (|x| > 65,504) becomes ±inf: the staged vectors are RMS-normed inputs, attention outputs and SwiGLU
# outputs, far inside it for the models bubblescope runs.
# Once per task: the max over the 8 equal columns (exact) and the sum over the batches (across the warps).
@gluon.jit
def _mma_slot(bufs, it, NS: gl.constexpr, R: gl.constexpr, AOP: gl.constexpr, TWO: gl.constexpr):
    slot = bufs.index(it % NS)  # (NB, R or 2R, MB)
    if TWO:
        return slot.slice(0, R, dim=1).load(AOP), slot.slice(R, R, dim=1).load(AOP)
    else:
        return slot.load(AOP), 0


@gluon.jit
def _mma(w, xb, acc, WIDEN: gl.constexpr):
    """acc + w·xb on the tensor cores, FP8 ``w`` widened to f16 here: the slot read ahead stays 8-bit in registers."""
    if WIDEN:
        out = mma_v2(w.to(gl.float16), xb, acc)
    else:
        out = mma_v2(w, xb, acc)
    return out


@gluon.jit
def _mma_x(xs, c, NB: gl.constexpr, MB: gl.constexpr, BK: gl.constexpr, BOP: gl.constexpr, BT: gl.constexpr):
    """Chunks ``[c·NB·MB, (c+1)·NB·MB)`` of the staged vector as the B operand (NB, MB, 8) of type ``BT``, broadcast
    over n."""
    ACT: gl.constexpr = xs.dtype
    NX: gl.constexpr = xs.shape[0] * BK // (MB * NB)
    xv = xs._reinterpret(ACT, [NX, NB, MB], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    x = xv.index(c).load(gl.SliceLayout(2, BOP)).to(BT)
    return gl.expand_dims(x, 2) + gl.zeros([NB, MB, 8], BT, BOP)


@gluon.jit
def _mma_rows(acc, VEC: gl.constexpr, TK: gl.constexpr, NW: gl.constexpr):
    return _to_rows(gl.sum(gl.max(acc, axis=2), axis=0), VEC, TK, NW)


@gluon.jit
def mv_mma(bufs, full, empty, xs, it, NSLOT: gl.constexpr, NS: gl.constexpr, R: gl.constexpr, BK: gl.constexpr,
           VEC: gl.constexpr, TK: gl.constexpr, NW: gl.constexpr, TWO: gl.constexpr):
    """``acc[r] = Σ_k W[r, k]·xs[k]`` over NSLOT ring slots of ``bufs`` (NS, NB, R or 2R with TWO, MB), 16-bit or
    FP8: float32 (R,) in SliceLayout(1, LW) (see :func:`_rows`); with TWO also rows [R, 2R) (else 0); and the ring
    position after them. Slot c meets the staged columns [c·NB·MB, (c+1)·NB·MB). Slot c + 1 is read into
    registers before slot c's products, as ``mv_ahead=1`` does."""
    NB: gl.constexpr = bufs.shape[1]
    MB: gl.constexpr = bufs.shape[3]
    WIDEN: gl.constexpr = bufs.dtype.primitive_bitwidth == 8
    KW: gl.constexpr = 4 if WIDEN else 2
    BT: gl.constexpr = gl.float16 if WIDEN else xs.dtype
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[NW, 1, 1], instr_shape=[1, 16, 8])
    AOP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=KW)
    BOP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=KW)
    acc_a = gl.zeros([NB, R, 8], gl.float32, MMA)
    acc_b = 0
    if TWO:
        acc_b = gl.zeros([NB, R, 8], gl.float32, MMA)
    _wait_full(full, it, NS)
    wa, wb = _mma_slot(bufs, it, NS, R, AOP, TWO)
    for c in range(NSLOT - 1):
        xb = _mma_x(xs, c, NB, MB, BK, BOP, BT)
        _release(empty, it, NS)
        it += 1
        _wait_full(full, it, NS)
        na, nb = _mma_slot(bufs, it, NS, R, AOP, TWO)
        acc_a = _mma(wa, xb, acc_a, WIDEN)
        if TWO:
            acc_b = _mma(wb, xb, acc_b, WIDEN)
        wa = na
        wb = nb
    xb = _mma_x(xs, NSLOT - 1, NB, MB, BK, BOP, BT)
    _release(empty, it, NS)
    it += 1
    acc_a = _mma(wa, xb, acc_a, WIDEN)
    out_b = 0
    if TWO:
        acc_b = _mma(wb, xb, acc_b, WIDEN)
        out_b = _mma_rows(acc_b, VEC, TK, NW)
    return _mma_rows(acc_a, VEC, TK, NW), out_b, it


# ---- a 16-bit matrix in a ring of FP8 boxes ------------------------------------------------------------------------
# With FP8 layer weights and a 16-bit LM head (``--weights fp8``) the ring's boxes are [BR, BK] bytes-wide FP8 tiles;
# the head's TMA boxes are [BR, BK/2] 16-bit values, the same bytes, so every slot carries the same byte count. Box b
# of a head task meets the staged columns [b·BK/2, (b+1)·BK/2): the staged vector viewed as 2·KCH half chunks.
@gluon.jit
def mv_half_boxes(bufs, full, empty, xs, it, NCH: gl.constexpr, NS: gl.constexpr, BR: gl.constexpr,
                  BK: gl.constexpr, VEC: gl.constexpr, TK: gl.constexpr, NW: gl.constexpr,
                  AHEAD: gl.constexpr = False, SB: gl.constexpr = 1):
    """acc[r] = Σ_k W[r, k]·xs[k] for BR rows of a 16-bit matrix (the dtype of ``xs``) whose 2·NCH boxes of BK/2
    columns fill FP8 ring slots ``bufs`` (NS·SB, BR, BK); float32 (BR,) in the epilogues' row layout (``VEC``,
    ``TK`` of the full-width tiles, :func:`_to_rows`)."""
    ACT: gl.constexpr = xs.dtype
    HK: gl.constexpr = BK // 2
    TKH: gl.constexpr = 32 if HK // VEC > 32 else HK // VEC
    bh = bufs._reinterpret(ACT, [bufs.shape[0], BR, HK], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    xh = xs._reinterpret(ACT, [2 * xs.shape[0], 1, HK], xs.layout)
    acc, _, it = _ring_mv(bh, full, empty, xh, it, 2 * NCH, NS, BR, HK, VEC, TKH, NW, False, False, False, AHEAD, SB)
    return _to_rows(gl.sum(acc, axis=1), VEC, TK, NW), it
