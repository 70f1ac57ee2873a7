"""Device code of the megakernel's opcodes (Triton). Imported only through :mod:`.launch`.

Numerics follow the reference engine (transformers' Llama/Qwen): float32 accumulation everywhere, and a
rounding to the activation dtype ``ACT`` (the weights' dtype) wherever the reference materialises a tensor
in that dtype: the normalised input ``(x·rsqrt(mean x² + eps)).to(ACT)``, its product with the norm weight,
every projection output, each RoPE product and sum, SiLU, SiLU·up, each residual sum, and the logits.
``_rnd(v, ACT)`` = ``v.to(ACT).to(float32)``; in float32 it is the identity.

FP8 weights (``FP8``: the layer matrices; ``FP8_HEAD``: the LM head; ``packing.py``): a weight tile is loaded as
float8_e4m3fn, converted to float32 in registers and multiplied in exactly as a 16-bit tile, and each row's float32
sum is multiplied by its float32 scale once, after the last tile (Σ_k q_k·s·h_k = s·Σ_k q_k·h_k), before the bias
and the rounding to ``ACT``. This is the fused engine's FP8 rule (``fused_engine/kernels.py``, ``W_FP8``), so the
two agree to float32 summation order; the reference engine instead rounds the dequantized weight ``q·s`` to ``ACT``
before its matmul (``reference_engine.model.linear``): the same up to one float32 rounding in float32, and up to the
weight's rounding to ACT in 16-bit dtypes. A scale pointer is read only under its switch (a dummy otherwise).

Weight loads take ``eviction_policy=EVICT`` (``""`` or ``"evict_first"``: weights are read once per step, so
their L2 lines may go first and leave room for the prefetched tiles of the next tasks).

Interpreter mode (``TRITON_INTERPRET=1``): :mod:`bubblescope.triton_interp` holds the mode, fixed per process, and
the device functions and reductions that stay fast under the interpreter.
"""

from __future__ import annotations

import time

import triton
import triton.language as tl

from .. import schedule as S

from ...triton_interp import INTERPRET, device_function
from ...triton_interp import reduce_max as _max
from ...triton_interp import reduce_min as _min
from ...triton_interp import reduce_sum as _sum

if INTERPRET:
    def clock_ns():
        """Host monotonic clock in ns (no clock instruction exists under the interpreter)."""
        return tl.full([], time.perf_counter_ns(), tl.int64)
else:
    @triton.jit
    def clock_ns():
        """The GPU's global nanosecond timer (PTX ``%globaltimer``), comparable across SMs."""
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                         pack=1)

# Opcodes as compile-time constants (jit code may only read constexpr globals).
OP_QKV = tl.constexpr(S.OP_QKV)
OP_ATTN = tl.constexpr(S.OP_ATTN)
OP_ATTN_REDUCE = tl.constexpr(S.OP_ATTN_REDUCE)
OP_OPROJ = tl.constexpr(S.OP_OPROJ)
OP_GATEUP = tl.constexpr(S.OP_GATEUP)
OP_DOWN = tl.constexpr(S.OP_DOWN)
OP_LMHEAD = tl.constexpr(S.OP_LMHEAD)


@device_function
def _rnd(v, ACT: tl.constexpr):
    """Round float32 ``v`` to the activation dtype and back (what storing it in ACT would do)."""
    if ACT == tl.float32:  # identity; skipping it saves two ops per call under the interpreter
        return v
    else:
        return v.to(ACT).to(tl.float32)


@device_function
def _rms_scale(src_ptr, eps, H: tl.constexpr, BLOCK_K: tl.constexpr):
    """``1 / sqrt(mean(src[0:H]²) + eps)`` in float32 (RMSNorm, Zhang & Sennrich 2019).

    ``src`` may have been written by other programs of this launch: loaded with ``.cg`` (L2, not the
    non-coherent L1).
    """
    offs = tl.arange(0, BLOCK_K)
    ss = tl.full([BLOCK_K], 0.0, tl.float32)
    for k0 in range(0, H, BLOCK_K):
        x = tl.load(src_ptr + k0 + offs, mask=k0 + offs < H, other=0.0, cache_modifier=".cg").to(tl.float32)
        ss += x * x
    return tl.rsqrt(_sum(ss, 0) / H + eps)


@device_function
def _normed_chunk(src_ptr, nw_ptr, k, mk, inv, ACT: tl.constexpr):
    """Columns ``k`` of ``RMSNorm(src) · weight`` as the reference rounds it: ((x·inv).to(ACT) · w).to(ACT)."""
    x = tl.load(src_ptr + k, mask=mk, other=0.0, cache_modifier=".cg").to(tl.float32)
    w = tl.load(nw_ptr + k, mask=mk, other=0.0).to(tl.float32)
    return _rnd(_rnd(x * inv, ACT) * w, ACT)


@device_function
def _normed_pair_matvec(src_ptr, nw_ptr, w_ptr, s_ptr, row_a, row_b, mj, inv, ACT: tl.constexpr, H: tl.constexpr,
                        BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, EVICT: tl.constexpr, FP8: tl.constexpr):
    """``(W[row_a] · h, W[row_b] · h)`` with ``h = (src · inv) · norm_weight``, float32 (BLOCK_R,) each
    (``inv`` from :func:`_rms_scale`, computed once per task). With ``FP8`` ``W`` is float8_e4m3fn and each
    row's sum is multiplied by its float32 scale ``s_ptr[row]`` at the end.

    The packed layouts (packing.py) put each task's two row sets in one contiguous block of ``w_ptr``
    (QKV: the rotate_half partner rows; GATEUP: gate and up rows); masked rows give 0.
    """
    offs_k = tl.arange(0, BLOCK_K)
    acc_a = tl.full([BLOCK_R], 0.0, tl.float32)
    acc_b = tl.full([BLOCK_R], 0.0, tl.float32)
    for k0 in range(0, H, BLOCK_K):
        k = k0 + offs_k
        mk = k < H
        xn = _normed_chunk(src_ptr, nw_ptr, k, mk, inv, ACT)
        m2 = mj[:, None] & mk[None, :]
        w_a = tl.load(w_ptr + row_a[:, None] * H + k[None, :], mask=m2, other=0.0, eviction_policy=EVICT)
        w_b = tl.load(w_ptr + row_b[:, None] * H + k[None, :], mask=m2, other=0.0, eviction_policy=EVICT)
        w_a = w_a.to(tl.float32)
        w_b = w_b.to(tl.float32)
        acc_a += _sum(w_a * xn[None, :], 1)
        acc_b += _sum(w_b * xn[None, :], 1)
    if FP8:
        acc_a = acc_a * tl.load(s_ptr + row_a, mask=mj, other=0.0)
        acc_b = acc_b * tl.load(s_ptr + row_b, mask=mj, other=0.0)
    return acc_a, acc_b


# ---- QKV ------------------------------------------------------------------------------------------------
# One task: BLOCK_P row pairs [start, start + count) of the stacked q|k|v matrix (pair j = rows (i, i+HALF)
# of stacked head j // HALF, i = j % HALF; q heads, then k heads, then v heads; packing.py layout):
#   h = RMSNorm(x_or_embedding_row) · input_layernorm                      (H,)
#   lo_j = W[packed_lo(j)] · h (+ b),  hi_j = W[packed_hi(j)] · h (+ b)     (FP8: (q · h)·s, then + b)
#   Qwen3, q/k heads: lo, hi /= rms over the head's D values, then · q_norm / k_norm
#   q/k: out_lo = lo·cos − hi·sin,  out_hi = hi·cos + lo·sin  at (pos, i)   (rotate_half RoPE); v: unrotated
#   q → q_buf[head·D + (i, HALF + i)];  k, v → cache[layer, kv_head, pos, (i, HALF + i)]
# Layer 0 reads the token's embedding row instead of x (no separate embedding task, no extra barrier).
@device_function
def op_qkv(layer, start, count, pos, tok, eps, emb_ptr, x_ptr, wqkv_ptr, sqkv_ptr, bqkv_ptr, qknorm_ptr, anorm_ptr,
           cos_ptr, sin_ptr, q_ptr, kc_ptr, vc_ptr,
           H: tl.constexpr, Q: tl.constexpr, KV: tl.constexpr, D: tl.constexpr, NKV: tl.constexpr,
           S_MAX: tl.constexpr, HB: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_QK_NORM: tl.constexpr,
           BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr, EVICT: tl.constexpr, FP8: tl.constexpr):
    ACT: tl.constexpr = q_ptr.dtype.element_ty
    HALF: tl.constexpr = D // 2
    NROWS: tl.constexpr = Q + 2 * KV
    NQH: tl.constexpr = Q // D
    layer64 = layer.to(tl.int64)
    if layer == 0:
        src = emb_ptr + tok.to(tl.int64) * H
    else:
        src = x_ptr
    j = start + tl.arange(0, BLOCK_P)
    mj = j < start + count
    lo_row = (j // HB) * (2 * HB) + j % HB
    hi_row = lo_row + HB
    inv = _rms_scale(src, eps, H, BLOCK_K)
    acc_lo, acc_hi = _normed_pair_matvec(src, anorm_ptr + layer64 * H, wqkv_ptr + layer64 * (NROWS * H),
                                         sqkv_ptr + layer64 * NROWS, lo_row, hi_row, mj, inv, ACT, H, BLOCK_P,
                                         BLOCK_K, EVICT, FP8)
    if HAS_BIAS:
        acc_lo += tl.load(bqkv_ptr + layer64 * NROWS + lo_row, mask=mj, other=0.0).to(tl.float32)
        acc_hi += tl.load(bqkv_ptr + layer64 * NROWS + hi_row, mask=mj, other=0.0).to(tl.float32)
    lo = _rnd(acc_lo, ACT)
    hi = _rnd(acc_hi, ACT)
    i = j % HALF
    head = j // HALF                   # stacked head: q heads, then k heads, then v heads
    is_q = head < NQH
    is_v = head >= NQH + NKV
    if HAS_QK_NORM:
        # Tasks hold whole heads (rows_qkv is a multiple of D): view pairs as (heads, HALF).
        NH: tl.constexpr = BLOCK_P // HALF
        lo2 = tl.reshape(lo, (NH, HALF))
        hi2 = tl.reshape(hi, (NH, HALF))
        r = tl.rsqrt((_sum(lo2 * lo2, 1) + _sum(hi2 * hi2, 1)) / D + eps)
        wn_ptr = qknorm_ptr + (layer64 * 2 + tl.where(is_q, 0, 1)) * D   # q_norm or k_norm
        n_lo = _rnd(tl.reshape(_rnd(lo2 * r[:, None], ACT), (BLOCK_P,)) * tl.load(wn_ptr + i).to(tl.float32), ACT)
        n_hi = _rnd(tl.reshape(_rnd(hi2 * r[:, None], ACT), (BLOCK_P,)) * tl.load(wn_ptr + HALF + i).to(tl.float32),
                    ACT)
        lo = tl.where(is_v, lo, n_lo)
        hi = tl.where(is_v, hi, n_hi)
    c = tl.load(cos_ptr + pos * HALF + i, mask=mj, other=0.0).to(ACT).to(tl.float32)
    s = tl.load(sin_ptr + pos * HALF + i, mask=mj, other=0.0).to(ACT).to(tl.float32)
    out_lo = tl.where(is_v, lo, _rnd(_rnd(lo * c, ACT) - _rnd(hi * s, ACT), ACT)).to(ACT)
    out_hi = tl.where(is_v, hi, _rnd(_rnd(hi * c, ACT) + _rnd(lo * s, ACT), ACT)).to(ACT)
    q_dst = q_ptr + head * D + i
    tl.store(q_dst, out_lo, mask=mj & is_q)
    tl.store(q_dst + HALF, out_hi, mask=mj & is_q)
    kvh = tl.where(is_v, head - NQH - NKV, head - NQH)
    cache_off = ((layer64 * NKV + kvh) * S_MAX + pos) * D + i
    m_k = mj & (~is_q) & (~is_v)
    tl.store(kc_ptr + cache_off, out_lo, mask=m_k)
    tl.store(kc_ptr + cache_off + HALF, out_hi, mask=m_k)
    tl.store(vc_ptr + cache_off, out_lo, mask=mj & is_v)
    tl.store(vc_ptr + cache_off + HALF, out_hi, mask=mj & is_v)


# ---- ATTN -------------------------------------------------------------------------------------------------
@device_function
def splits_used(pos, NSPLIT: tl.constexpr, MIN_CHUNK: tl.constexpr):
    """Non-empty splits at position ``pos``: ceil(n / chunk), chunk = max(ceil(n / NSPLIT), MIN_CHUNK)."""
    n = pos + 1
    chunk = tl.maximum((n + NSPLIT - 1) // NSPLIT, MIN_CHUNK)
    return (n + chunk - 1) // chunk



# One task: KV heads [kv0, kv0 + nkv) (their nkv·G query heads) over split `split` of the positions
# 0..pos: n = pos + 1, chunk = max(ceil(n / NSPLIT), MIN_CHUNK) (so short contexts use the first
# ceil(n / chunk) splits only; the kernel skips the empty ones), positions [split·chunk, min(n, (split+1)·chunk)).
# Online softmax (Milakov & Gimelshein 2018; flash-decoding): per query head
#   m = max_s q·k_s·scale,  l = Σ_s exp(q·k_s·scale − m),  acc = Σ_s exp(…) v_s
# written to pm/pl (NQ, NSPLIT) and pacc (NQ, NSPLIT, D) float32. An empty split writes m = −inf, l = 0.
@device_function
def op_attn(layer, kv0, nkv, split, pos, sm_scale, q_ptr, kc_ptr, vc_ptr, pm_ptr, pl_ptr, pacc_ptr,
            D: tl.constexpr, G: tl.constexpr, NKV: tl.constexpr, S_MAX: tl.constexpr, NSPLIT: tl.constexpr,
            MIN_CHUNK: tl.constexpr, BLOCK_QH: tl.constexpr, BLOCK_S: tl.constexpr):
    qh = tl.arange(0, BLOCK_QH)
    mq = qh < nkv * G
    hq = kv0 * G + qh
    d = tl.arange(0, D)
    q = tl.load(q_ptr + hq[:, None] * D + d[None, :], mask=mq[:, None], other=0.0, cache_modifier=".cg")
    q = q.to(tl.float32)
    n = pos + 1
    chunk = tl.maximum((n + NSPLIT - 1) // NSPLIT, MIN_CHUNK)
    s_lo = split * chunk
    s_hi = tl.minimum(s_lo + chunk, n)
    row0 = (layer.to(tl.int64) * NKV + kv0 + qh // G) * S_MAX  # cache row of position 0, per query head
    m = tl.full([BLOCK_QH], float("-inf"), tl.float32)
    l = tl.full([BLOCK_QH], 0.0, tl.float32)
    acc = tl.full([BLOCK_QH, D], 0.0, tl.float32)
    s0 = s_lo
    while s0 < s_hi:
        sp = s0 + tl.arange(0, BLOCK_S)
        ms = sp < s_hi
        offs = (row0[:, None, None] + sp[None, :, None]) * D + d[None, None, :]
        m3 = mq[:, None, None] & ms[None, :, None]
        k = tl.load(kc_ptr + offs, mask=m3, other=0.0, cache_modifier=".cg")
        sc = _sum(q[:, None, :] * k.to(tl.float32), 2) * sm_scale
        sc = tl.where(ms[None, :], sc, float("-inf"))
        m_new = tl.maximum(m, _max(sc, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(sc - m_new[:, None])
        l = l * alpha + _sum(p, 1)
        # V is loaded after the scores: loading K and V together kept both tiles live (+16 registers on the
        # H200's ptxas, 144 in all: 3 programs per SM instead of 4, about 1.34 against 1.14 ms per step in
        # benchmarks/results/h200-2026-11-29-b rounds 5 and 6)
        v = tl.load(vc_ptr + offs, mask=m3, other=0.0, cache_modifier=".cg").to(tl.float32)
        acc = acc * alpha[:, None] + _sum(p[:, :, None] * v, 1)
        m = m_new
        s0 += BLOCK_S
    out = hq * NSPLIT + split
    tl.store(pm_ptr + out, m, mask=mq)
    tl.store(pl_ptr + out, l, mask=mq)
    tl.store(pacc_ptr + out[:, None] * D + d[None, :], acc, mask=mq[:, None])


# ---- ATTN_REDUCE ------------------------------------------------------------------------------------------
# Per query head, over the n_used = ceil(n / chunk) non-empty splits (see ATTN):
#   M = max_s m_s,  w_s = exp(m_s − M),  out = Σ_s w_s·acc_s / Σ_s w_s·l_s  → attn[head·D + d].
# Two passes over blocks of BLOCK_SPLIT splits: M, then the weighted sums, accumulated elementwise and reduced
# once at the end. (Reducing inside the loop made Triton broadcast replicated values through shared memory,
# which compute-sanitizer racecheck flags; a one-pass branch for few splits took the timeline build from 128 to
# 168 registers in the offline sm_90a compile, i.e. a program per SM.)
@device_function
def op_attn_reduce(kv0, nkv, pos, pm_ptr, pl_ptr, pacc_ptr, attn_ptr, D: tl.constexpr, G: tl.constexpr,
                   NSPLIT: tl.constexpr, MIN_CHUNK: tl.constexpr, BLOCK_QH: tl.constexpr,
                   BLOCK_SPLIT: tl.constexpr):
    ACT: tl.constexpr = attn_ptr.dtype.element_ty
    qh = tl.arange(0, BLOCK_QH)
    mq = qh < nkv * G
    hq = kv0 * G + qh
    d = tl.arange(0, D)
    sp0 = tl.arange(0, BLOCK_SPLIT)
    n_used = splits_used(pos, NSPLIT, MIN_CHUNK)
    big2 = tl.full([BLOCK_SPLIT, BLOCK_QH], float("-inf"), tl.float32)
    s0 = 0
    while s0 < n_used:  # (a while loop: the interpreter cannot range() over a run-time bound)
        sp = s0 + sp0
        m2 = (sp[:, None] < n_used) & mq[None, :]
        m = tl.load(pm_ptr + hq[None, :] * NSPLIT + sp[:, None], mask=m2, other=float("-inf"),
                    cache_modifier=".cg")
        big2 = tl.maximum(big2, m)
        s0 += BLOCK_SPLIT
    big = tl.where(mq, _max(big2, 0), 0.0)
    den2 = tl.full([BLOCK_SPLIT, BLOCK_QH], 0.0, tl.float32)
    acc3 = tl.full([BLOCK_SPLIT, BLOCK_QH, D], 0.0, tl.float32)
    s0 = 0
    while s0 < n_used:
        sp = s0 + sp0
        idx = hq[None, :] * NSPLIT + sp[:, None]
        m2 = (sp[:, None] < n_used) & mq[None, :]
        m = tl.load(pm_ptr + idx, mask=m2, other=float("-inf"), cache_modifier=".cg")
        l = tl.load(pl_ptr + idx, mask=m2, other=0.0, cache_modifier=".cg")
        a = tl.load(pacc_ptr + idx[:, :, None] * D + d[None, None, :], mask=m2[:, :, None], other=0.0,
                    cache_modifier=".cg")
        w = tl.exp(m - big[None, :])
        den2 += w * l
        acc3 += w[:, :, None] * a
        s0 += BLOCK_SPLIT
    out = _sum(acc3, 0) / _sum(den2, 0)[:, None]
    tl.store(attn_ptr + hq[:, None] * D + d[None, :], out.to(ACT), mask=mq[:, None])


# ---- OPROJ / DOWN -------------------------------------------------------------------------------------------
# x[r] = resid[r] + (W[r, :] · a)  for rows r of the task; a = attention output (K = Q) or act (K = I).
# FP8: W[r, :] · a = s[r] · (q[r, :] · a). Each task owns its rows of x, so the read-modify-write needs no atomics.
@device_function
def op_matvec_residual(start, count, w_ptr, s_ptr, a_ptr, resid_ptr, x_ptr, K: tl.constexpr, BLOCK_R: tl.constexpr,
                       BLOCK_K: tl.constexpr, EVICT: tl.constexpr, FP8: tl.constexpr):
    ACT: tl.constexpr = x_ptr.dtype.element_ty
    r = start + tl.arange(0, BLOCK_R)
    mr = r < start + count
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.full([BLOCK_R], 0.0, tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        mk = k < K
        a = tl.load(a_ptr + k, mask=mk, other=0.0, cache_modifier=".cg").to(tl.float32)
        w = tl.load(w_ptr + r[:, None].to(tl.int64) * K + k[None, :], mask=mr[:, None] & mk[None, :], other=0.0,
                    eviction_policy=EVICT)
        acc += _sum(w.to(tl.float32) * a[None, :], 1)
    if FP8:
        acc = acc * tl.load(s_ptr + r, mask=mr, other=0.0)
    res = tl.load(resid_ptr + r, mask=mr, other=0.0, cache_modifier=".cg").to(tl.float32)
    tl.store(x_ptr + r, (res + _rnd(acc, ACT)).to(ACT), mask=mr)


# ---- GATEUP -----------------------------------------------------------------------------------------------
# h = RMSNorm(x) · post_attention_layernorm;  for pairs j: g = Wg[j]·h, u = Wu[j]·h;  act[j] = SiLU(g)·u,
# SiLU(g) = g / (1 + exp(−g)). Gate row j is packed row (j // GB)·2GB + j % GB, up row that + GB (FP8: each sum
# times its row's scale). A task of several packed blocks loops over them (its rows stay one contiguous block);
# the norm scale is computed once.
@device_function
def op_gateup(layer, start, count, eps, x_ptr, mnorm_ptr, wgu_ptr, sgu_ptr, act_ptr, H: tl.constexpr,
              I: tl.constexpr, IP: tl.constexpr, GB: tl.constexpr, BLOCK_GU: tl.constexpr, BLOCK_K: tl.constexpr,
              EVICT: tl.constexpr, FP8: tl.constexpr):
    ACT: tl.constexpr = act_ptr.dtype.element_ty
    layer64 = layer.to(tl.int64)
    inv = _rms_scale(x_ptr, eps, H, BLOCK_K)
    b0 = 0
    while b0 < count:  # (a while loop: the interpreter cannot range() over a run-time bound)
        j = start + b0 + tl.arange(0, BLOCK_GU)
        mj = (j < start + b0 + GB) & (j < start + count) & (j < I)
        g_row = (j // GB) * (2 * GB) + j % GB
        u_row = g_row + GB
        acc_g, acc_u = _normed_pair_matvec(x_ptr, mnorm_ptr + layer64 * H, wgu_ptr + layer64 * (2 * IP * H),
                                           sgu_ptr + layer64 * (2 * IP), g_row, u_row, mj, inv, ACT, H, BLOCK_GU,
                                           BLOCK_K, EVICT, FP8)
        g = _rnd(acc_g, ACT)
        u = _rnd(acc_u, ACT)
        silu = _rnd(g / (1.0 + tl.exp(-g)), ACT)
        tl.store(act_ptr + j, (silu * u).to(ACT), mask=mj)
        b0 += GB


# ---- LMHEAD -----------------------------------------------------------------------------------------------
# logits[r] = lm_head[r] · (RMSNorm(x) · norm) (FP8_HEAD: s[r] · (q[r] · ...)), rounded to ACT as the reference's
# logits are, stored as float32, in register tiles of BLOCK_LM rows. Greedy pick on the device: the task's first maximum
# (value v, row r) becomes the int64 key  (ord(v) << 32) | (V − 1 − r),  ord(v) = bits(v) for v ≥ 0 else
# bits(v) ^ 0x7FFFFFFF (float32 order as signed integers), and one atomic_max per task keeps the largest
# key: the largest value, ties to the smallest row, as torch.argmax picks.
@device_function
def op_lmhead(start, count, eps, x_ptr, fnorm_ptr, head_ptr, slm_ptr, logits_ptr, amax_ptr,
              H: tl.constexpr, V: tl.constexpr, BLOCK_LM: tl.constexpr, BLOCK_K: tl.constexpr, EVICT: tl.constexpr,
              FP8_HEAD: tl.constexpr):
    ACT: tl.constexpr = x_ptr.dtype.element_ty
    inv = _rms_scale(x_ptr, eps, H, BLOCK_K)
    offs_k = tl.arange(0, BLOCK_K)
    best_v = tl.full([], float("-inf"), tl.float32)
    best_r = tl.full([], V - 1, tl.int32)
    row0 = 0
    while row0 < count:
        r = start + row0 + tl.arange(0, BLOCK_LM)
        mr = (r < start + count) & (r < V)
        acc = tl.full([BLOCK_LM], 0.0, tl.float32)
        for k0 in range(0, H, BLOCK_K):
            k = k0 + offs_k
            mk = k < H
            xn = _normed_chunk(x_ptr, fnorm_ptr, k, mk, inv, ACT)
            w = tl.load(head_ptr + r[:, None].to(tl.int64) * H + k[None, :], mask=mr[:, None] & mk[None, :],
                        other=0.0, eviction_policy=EVICT)
            acc += _sum(w.to(tl.float32) * xn[None, :], 1)
        if FP8_HEAD:
            acc = acc * tl.load(slm_ptr + r, mask=mr, other=0.0)
        val = _rnd(acc, ACT)
        tl.store(logits_ptr + r, val, mask=mr)
        vm = tl.where(mr, val, float("-inf"))
        bv = _max(vm, 0)
        br = _min(tl.where(mr & (vm == bv), r, V), 0)
        better = bv > best_v                                          # earlier blocks win ties
        best_r = tl.where(better, br, best_r)
        best_v = tl.where(better, bv, best_v)
        row0 += BLOCK_LM
    bits = best_v.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    tl.atomic_max(amax_ptr, (ordered.to(tl.int64) << 32) | (V - 1 - best_r).to(tl.int64), sem="relaxed",
                  scope="gpu")
