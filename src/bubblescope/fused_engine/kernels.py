"""Device code of the fused op-by-op decoder: five Triton kernels per layer, one CUDA graph per token.

One decode step (T = 1) of a Llama-family layer as five launches (six with a separate attention reduction, one
more for Qwen3's q/k-norm), each a bandwidth-bound matvec or a small attention pass, with every elementwise op
fused into the launch that produces its input:

    qkv_rope      h = RMSNorm(x) · input_layernorm;  q, k, v = W_{q,k,v} · h (+ b);  RoPE on q and k;
                  k, v written into the KV cache at ``pos``                              (layer 0: x = embed[tok])
    [qk_norm]     Qwen3 only: per-head RMSNorm of q and k, then RoPE, k into the cache
    attn_split    flash-decoding: each (kv head, split) program attends its query heads over one slice of
                  the cache, keeping the running max m, sum l and unnormalised P·V (Dao et al., Flash-Decoding)
    attn_reduce   the splits combined: o = Σ e^{m_s − M} acc_s / Σ e^{m_s − M} l_s — by the kv head's last split
                  program (an atomic ticket; the default) or by a launch of its own, one program per query head
    oproj / down  x += W · a   (the residual add fused into the matvec's epilogue)
    gateup        h = RMSNorm(x) · post_attention_layernorm;  a = SiLU(W_gate · h) ⊙ (W_up · h)
    lmhead        logits = W_head · RMSNorm(x) · norm; each program folds its (max, first argmax) into an int64 key
    argmax        the greedy token from the keys; ``tok`` ← it, ``pos`` += 1

Memory layout: weights as Hugging Face stores them, row-major ``(out_features, in_features)``; the KV cache of
a layer is ``(n_kv_heads, max_seq_len, head_dim)`` row-major (the reference engine's own buffers); ``pos`` and
``tok`` are int32 device scalars so one captured graph serves every position.

Numerics follow the reference engine (transformers): float32 accumulation, and a rounding to the activation
dtype ``ACT`` wherever the reference materialises a tensor in it (the normalised input, its product with the
norm weight, each projection output, each RoPE product and sum, SiLU, SiLU·up, each residual sum, the logits);
``_rnd(v) = v.to(ACT).to(float32)`` is the identity in float32.

FP8 weights (``W_FP8``: :class:`~bubblescope.models.quant.QuantizedLinear`): the weight pointers are float8_e4m3fn and
each matrix has a float32 scale per row (``ws_ptr`` and the like); a tile is converted to float32 in registers and
multiplied in as before, and the row's sum is multiplied by its scale once, after the last tile
(Σ_k q_k·s·h_k = s·Σ_k q_k·h_k): half the weight bytes, the same float32 accumulation. The scales are loaded with
the first tile, before the wait.

Programmatic Dependent Launch (``USE_PDL``, sm_90+): a kernel loads its first weight tile — which no earlier
kernel writes — *before* ``gdc_wait`` (griddepcontrol.wait: the previous grid has finished and its writes are
visible), then lets the next kernel launch (``gdc_launch_dependents``) at once, so the next kernel's programs
start streaming their own weights while this one drains. Every store comes after the wait; by induction, a
kernel that has started has a predecessor that passed its wait, so everything two launches back is complete.

``PDL_EARLY`` moves ``gdc_launch_dependents`` to the kernel's first instruction: the next kernel may launch while
this one still waits, and the one after it as soon as all of the next kernel's programs have started, so during
a short, latency-bound kernel (attention) the following matvecs' programs are already resident, their first tiles
loaded. Still correct: before its wait a kernel reads only weights, tables, and what earlier *steps* wrote (``pos``,
older KV rows; the step's first kernel has no programmatic edge, so the previous step is complete); after its wait
its predecessor has completed, which it could only do after passing its own wait, so every earlier kernel has
completed and its writes are visible — reads after the wait see them, and stores after the wait overwrite nothing
an earlier kernel still reads. No deadlock: a kernel launches only once every program of its predecessor has
started, so the programs it may crowd out have all been placed.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..triton_interp import device_function, l2_prefetch
from ..triton_interp import reduce_max as _max
from ..triton_interp import reduce_min as _min
from ..triton_interp import reduce_sum as _sum


# ---- L2 prefetch of a program's share of the next kernels' weights (triton_interp.l2_prefetch) ------------------
@device_function
def _prefetch_share(base_ptr, nbytes, part, nparts, LANES: tl.constexpr):
    """Program ``part`` of ``nparts`` starts pulling its share of the ``nbytes`` at ``base_ptr`` into L2: equal
    16-byte-aligned pieces (``cp.async.bulk.prefetch.L2`` wants 16-byte addresses and sizes). GPU only."""
    share = tl.cdiv(tl.cdiv(nbytes, nparts), 16) * 16
    lo = tl.minimum(part.to(tl.int64) * share, nbytes)
    l2_prefetch(base_ptr.to(tl.pointer_type(tl.int8)) + lo, tl.minimum(share, nbytes - lo).to(tl.int32), 2, LANES)


# ---- RMSNorm of the input vector, shared by qkv_rope, gateup and lmhead ------------------------------------------
@device_function
def _rms_inv(src, ss_ptr, eps, cols, H: tl.constexpr, BLOCK_K: tl.constexpr, STATS_IN: tl.constexpr):
    """1 / sqrt(mean(src[0:H]²) + eps), float32 (RMSNorm, Zhang & Sennrich 2019): from Σx² accumulated by the
    programs that wrote x (``STATS_IN``: one load) or by a pass over ``src`` in ``BLOCK_K`` chunks."""
    if STATS_IN:
        inv = tl.rsqrt(tl.load(ss_ptr) / H + eps)
    else:
        ss = tl.zeros([BLOCK_K], tl.float32)
        for k0 in range(0, H, BLOCK_K):
            xv = tl.load(src + k0 + cols, mask=k0 + cols < H, other=0.0).to(tl.float32)
            ss += xv * xv
        inv = tl.rsqrt(_sum(ss, 0) / H + eps)
    return inv


@device_function
def _normed(src, norm_ptr, k0, cols, inv, H: tl.constexpr, ACT: tl.constexpr):
    """Columns ``k0 + cols`` of RMSNorm(src) · weight as the reference rounds it: ((x·inv).to(ACT) · w).to(ACT),
    returned in float32 (masked columns 0)."""
    mk = k0 + cols < H
    xv = tl.load(src + k0 + cols, mask=mk, other=0.0).to(tl.float32)
    nw = tl.load(norm_ptr + k0 + cols, mask=mk, other=0.0).to(tl.float32)
    return ((xv * inv).to(ACT).to(tl.float32) * nw).to(ACT).to(tl.float32)


# ---- qkv_rope ------------------------------------------------------------------------------------------------
# W = [W_q; W_k; W_v] stacked, (NH·D + 2·NKV·D, H) row-major; b likewise. Row pair j = rows (lo, lo + D/2) of stacked
# head j // (D/2), lo = head·D + j % (D/2): a rotate_half pair, so RoPE needs nothing from another program:
#   out_lo = lo·cos − hi·sin,  out_hi = hi·cos + lo·sin   at (pos, j % (D/2))
# Grid: cdiv(NPAIRS, BLOCK_R), NPAIRS = (NH + 2·NKV)·D/2. q → q_buf[head·D + i]; k, v → cache[kv_head, pos, i].
# With QK_NORM (Qwen3) q and k stay unrotated (q in q_buf, k in kraw) for qk_norm_kernel, which needs whole heads.
@triton.jit
def qkv_rope_kernel(x_ptr, emb_ptr, tok_ptr, pos_ptr, norm_ptr, w_ptr, b_ptr, cos_ptr, sin_ptr, q_ptr, kraw_ptr,
                    kc_ptr, vc_ptr, ss_ptr, eps,
                    H: tl.constexpr, NH: tl.constexpr, NKV: tl.constexpr, D: tl.constexpr, S: tl.constexpr,
                    EMBED: tl.constexpr, HAS_BIAS: tl.constexpr, QK_NORM: tl.constexpr, STATS_IN: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, ACT: tl.constexpr, USE_PDL: tl.constexpr,
                    ws_ptr=None, W_FP8: tl.constexpr = False, PDL_EARLY: tl.constexpr = False):
    if PDL_EARLY:  # before the wait this kernel reads nothing its step writes: the next may launch now
        tl.extra.cuda.gdc_launch_dependents()
    HALF: tl.constexpr = D // 2
    NPAIRS: tl.constexpr = (NH + 2 * NKV) * HALF
    pid = tl.program_id(0)
    j = pid * BLOCK_R + tl.arange(0, BLOCK_R)                  # (BLOCK_R,) row pairs
    mj = j < NPAIRS
    head = j // HALF                                           # stacked head: q heads, then k, then v
    i = j % HALF
    row_lo = head * D + i
    row_hi = row_lo + HALF
    cols = tl.arange(0, BLOCK_K)
    m0 = mj[:, None] & (cols[None, :] < H)
    w_lo = tl.load(w_ptr + row_lo[:, None].to(tl.int64) * H + cols[None, :], mask=m0, other=0.0)  # weights: before
    w_hi = tl.load(w_ptr + row_hi[:, None].to(tl.int64) * H + cols[None, :], mask=m0, other=0.0)  # the wait
    if W_FP8:  # the rows' scales, also never written
        s_lo = tl.load(ws_ptr + row_lo, mask=mj, other=0.0)
        s_hi = tl.load(ws_ptr + row_hi, mask=mj, other=0.0)
    pos = tl.load(pos_ptr)          # written by the previous step's last kernel: complete, also before the wait
    if not QK_NORM:
        c = tl.load(cos_ptr + pos * D + i, mask=mj, other=0.0).to(ACT).to(tl.float32)
        s = tl.load(sin_ptr + pos * D + i, mask=mj, other=0.0).to(ACT).to(tl.float32)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        if not PDL_EARLY:
            tl.extra.cuda.gdc_launch_dependents()
    if EMBED:
        src = emb_ptr + tl.load(tok_ptr).to(tl.int64) * H
    else:
        src = x_ptr
    inv = _rms_inv(src, ss_ptr, eps, cols, H, BLOCK_K, STATS_IN)
    if EMBED:  # the embedding row becomes the residual stream x (program 0 writes it once)
        if pid == 0:
            for k0 in range(0, H, BLOCK_K):
                tl.store(x_ptr + k0 + cols, tl.load(src + k0 + cols, mask=k0 + cols < H), mask=k0 + cols < H)
    lo = tl.zeros([BLOCK_R], tl.float32)
    hi = tl.zeros([BLOCK_R], tl.float32)
    for k0 in range(0, H, BLOCK_K):
        mk = k0 + cols < H
        if k0 > 0:
            m2 = mj[:, None] & mk[None, :]
            w_lo = tl.load(w_ptr + row_lo[:, None].to(tl.int64) * H + (k0 + cols)[None, :], mask=m2, other=0.0)
            w_hi = tl.load(w_ptr + row_hi[:, None].to(tl.int64) * H + (k0 + cols)[None, :], mask=m2, other=0.0)
        hv = _normed(src, norm_ptr, k0, cols, inv, H, ACT)
        lo += _sum(w_lo.to(tl.float32) * hv[None, :], 1)
        hi += _sum(w_hi.to(tl.float32) * hv[None, :], 1)
    if W_FP8:
        lo = lo * s_lo
        hi = hi * s_hi
    if HAS_BIAS:
        lo += tl.load(b_ptr + row_lo, mask=mj, other=0.0).to(tl.float32)
        hi += tl.load(b_ptr + row_hi, mask=mj, other=0.0).to(tl.float32)
    lo = lo.to(ACT).to(tl.float32)
    hi = hi.to(ACT).to(tl.float32)
    is_q = head < NH
    is_v = head >= NH + NKV
    is_k = (~is_q) & (~is_v)
    if QK_NORM:  # q and k raw, for qk_norm_kernel; v straight into the cache
        out_lo = lo.to(ACT)
        out_hi = hi.to(ACT)
        raw = (head - NH) * D + i
        tl.store(kraw_ptr + raw, out_lo, mask=mj & is_k)
        tl.store(kraw_ptr + raw + HALF, out_hi, mask=mj & is_k)
    else:
        rot_lo = ((lo * c).to(ACT).to(tl.float32) - (hi * s).to(ACT).to(tl.float32)).to(ACT)
        rot_hi = ((hi * c).to(ACT).to(tl.float32) + (lo * s).to(ACT).to(tl.float32)).to(ACT)
        out_lo = tl.where(is_v, lo.to(ACT), rot_lo)
        out_hi = tl.where(is_v, hi.to(ACT), rot_hi)
        kvh = head - NH
        k_row = (kvh.to(tl.int64) * S + pos) * D + i
        tl.store(kc_ptr + k_row, out_lo, mask=mj & is_k)
        tl.store(kc_ptr + k_row + HALF, out_hi, mask=mj & is_k)
    tl.store(q_ptr + row_lo, out_lo, mask=mj & is_q)
    tl.store(q_ptr + row_hi, out_hi, mask=mj & is_q)
    v_row = ((head - NH - NKV).to(tl.int64) * S + pos) * D + i
    tl.store(vc_ptr + v_row, out_lo, mask=mj & is_v)
    tl.store(vc_ptr + v_row + HALF, out_hi, mask=mj & is_v)


# ---- qk_norm (Qwen3) -----------------------------------------------------------------------------------------
# Grid: NH + NKV heads. q ← RoPE(RMSNorm_D(q_head) · q_norm) in place; k ← RoPE(RMSNorm_D(k_head) · k_norm) into
# cache[kv_head, pos]. Halves of HALF_P (the next power of two of D/2) lanes, masked.
@triton.jit
def qk_norm_kernel(q_ptr, kraw_ptr, kc_ptr, pos_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, eps,
                   NH: tl.constexpr, D: tl.constexpr, S: tl.constexpr, HALF_P: tl.constexpr,
                   ACT: tl.constexpr, USE_PDL: tl.constexpr, PDL_EARLY: tl.constexpr = False):
    if PDL_EARLY:  # before the wait this kernel reads nothing its step writes: the next may launch now
        tl.extra.cuda.gdc_launch_dependents()
    HALF: tl.constexpr = D // 2
    head = tl.program_id(0)
    i = tl.arange(0, HALF_P)
    mi = i < HALF
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        if not PDL_EARLY:
            tl.extra.cuda.gdc_launch_dependents()
    pos = tl.load(pos_ptr)
    if head < NH:
        src = q_ptr + head * D
        wn = qn_ptr
    else:
        src = kraw_ptr + (head - NH) * D
        wn = kn_ptr
    lo = tl.load(src + i, mask=mi, other=0.0).to(tl.float32)
    hi = tl.load(src + HALF + i, mask=mi, other=0.0).to(tl.float32)
    inv = tl.rsqrt((_sum(lo * lo, 0) + _sum(hi * hi, 0)) / D + eps)
    lo = ((lo * inv).to(ACT).to(tl.float32) * tl.load(wn + i, mask=mi, other=0.0).to(tl.float32))
    hi = ((hi * inv).to(ACT).to(tl.float32) * tl.load(wn + HALF + i, mask=mi, other=0.0).to(tl.float32))
    lo = lo.to(ACT).to(tl.float32)
    hi = hi.to(ACT).to(tl.float32)
    c = tl.load(cos_ptr + pos * D + i, mask=mi, other=0.0).to(ACT).to(tl.float32)
    s = tl.load(sin_ptr + pos * D + i, mask=mi, other=0.0).to(ACT).to(tl.float32)
    out_lo = ((lo * c).to(ACT).to(tl.float32) - (hi * s).to(ACT).to(tl.float32)).to(ACT)
    out_hi = ((hi * c).to(ACT).to(tl.float32) + (lo * s).to(ACT).to(tl.float32)).to(ACT)
    if head < NH:
        dst = q_ptr + head * D
    else:
        dst = kc_ptr + ((head - NH).to(tl.int64) * S + pos) * D
    tl.store(dst + i, out_lo, mask=mi)
    tl.store(dst + HALF + i, out_hi, mask=mi)


# ---- attn_split / attn_reduce (flash-decoding) ---------------------------------------------------------------
# attn_split grid: (NKV, NSPLIT). The n = pos + 1 cached positions are cut into NSPLIT slices of a whole number of
# BLOCK_S blocks; program (g, s) runs the online softmax (Milakov & Gimelshein 2018) of the G = NH / NKV query
# heads of kv head g over slice s:  m = max score, l = Σ e^{score − m}, acc = Σ e^{score − m} v  (unnormalised),
# scores = q·k / sqrt(D) as scaled_dot_product_attention's default scale. An empty slice stores m = −inf, l = 0.
# part_m, part_l: (NH, NSPLIT) float32; part_acc: (NH, NSPLIT, D) float32. With FUSED_REDUCE, the NACT = cdiv(n, per)
# slices that hold a position each take a ticket (an acq_rel atomic on cnt[kv head]) after their stores, and the one
# holding the last ticket combines those NACT slices as attn_reduce does and rewinds the counter: one launch per
# layer fewer; the programs of empty slices (a short context over many splits) exit at once, and the combine reads
# only the NACT slices written. With NACT = 1 (a context within one slice) that slice's program stores o itself:
# no partials, no ticket. A slice of several BLOCK_S blocks loads each next block before the current one's math. With PREFETCH, the
# programs first split pf_a[0:pf_a_bytes), pf_b[0:pf_bc_bytes) and pf_c[0:pf_bc_bytes) (the O-projection, the head
# of the gate and of the up matrix) among themselves and start pulling them into L2.
@triton.jit
def attn_split_kernel(q_ptr, kc_ptr, vc_ptr, pos_ptr, part_m_ptr, part_l_ptr, part_acc_ptr, o_ptr, cnt_ptr, scale,
                      G: tl.constexpr, D: tl.constexpr, S: tl.constexpr, NSPLIT: tl.constexpr,
                      G_P: tl.constexpr, D_P: tl.constexpr, BLOCK_S: tl.constexpr, NSPLIT_P: tl.constexpr,
                      FUSED_REDUCE: tl.constexpr, ACT: tl.constexpr, USE_PDL: tl.constexpr,
                      PDL_EARLY: tl.constexpr = False, PREFETCH: tl.constexpr = False, LANES: tl.constexpr = 128,
                      pf_a_ptr=None, pf_a_bytes=0, pf_b_ptr=None, pf_c_ptr=None, pf_bc_bytes=0):
    if PDL_EARLY:  # before the wait this kernel reads nothing its step writes: the next may launch now
        tl.extra.cuda.gdc_launch_dependents()
    kvh = tl.program_id(0)
    sp = tl.program_id(1)
    if PREFETCH:  # the stream would idle through this latency-bound kernel: pull the next matrices into L2
        part, nparts = kvh * NSPLIT + sp, tl.num_programs(0) * NSPLIT
        _prefetch_share(pf_a_ptr, pf_a_bytes, part, nparts, LANES)
        _prefetch_share(pf_b_ptr, pf_bc_bytes, part, nparts, LANES)
        _prefetch_share(pf_c_ptr, pf_bc_bytes, part, nparts, LANES)
    n = tl.load(pos_ptr) + 1   # before the wait: the previous step's last kernel wrote pos
    per = tl.cdiv(tl.cdiv(n, NSPLIT), BLOCK_S) * BLOCK_S
    start = sp * per
    end = tl.minimum(start + per, n)
    if FUSED_REDUCE:
        if start < n:      # an empty slice's program has nothing to add: it exits
            _attn_slice(q_ptr, kc_ptr, vc_ptr, part_m_ptr, part_l_ptr, part_acc_ptr, o_ptr, cnt_ptr, scale, kvh, sp,
                        n, per, start, end, G, D, S, NSPLIT, G_P, D_P, BLOCK_S, NSPLIT_P, FUSED_REDUCE, ACT,
                        USE_PDL, PDL_EARLY)
    else:                  # attn_reduce reads every slice: an empty one stores m = −inf, l = 0
        _attn_slice(q_ptr, kc_ptr, vc_ptr, part_m_ptr, part_l_ptr, part_acc_ptr, o_ptr, cnt_ptr, scale, kvh, sp, n,
                    per, start, end, G, D, S, NSPLIT, G_P, D_P, BLOCK_S, NSPLIT_P, FUSED_REDUCE, ACT, USE_PDL,
                    PDL_EARLY)


@device_function
def _attn_slice(q_ptr, kc_ptr, vc_ptr, part_m_ptr, part_l_ptr, part_acc_ptr, o_ptr, cnt_ptr, scale, kvh, sp, n, per,
                start, end, G: tl.constexpr, D: tl.constexpr, S: tl.constexpr, NSPLIT: tl.constexpr,
                G_P: tl.constexpr, D_P: tl.constexpr, BLOCK_S: tl.constexpr, NSPLIT_P: tl.constexpr,
                FUSED_REDUCE: tl.constexpr, ACT: tl.constexpr, USE_PDL: tl.constexpr, PDL_EARLY: tl.constexpr):
    """Program (kvh, sp) of attn_split_kernel over its slice [start, end) of the n positions."""
    g = tl.arange(0, G_P)
    d = tl.arange(0, D_P)
    mg = g < G
    md = d < D
    heads = kvh * G + g                                                   # (G_P,) query heads of this kv head
    # Before the wait: the slice's first K/V block without the new row — cached rows older than pos were written by
    # earlier steps; only row pos and q come from the kernels just before this one.
    base = kvh.to(tl.int64) * S * D
    sv0 = start + tl.arange(0, BLOCK_S)
    off0 = base + sv0[:, None] * D + d[None, :]
    m_old = ((sv0 < end) & (sv0 < n - 1))[:, None] & md[None, :]
    k_old = tl.load(kc_ptr + off0, mask=m_old, other=0.0)
    v_old = tl.load(vc_ptr + off0, mask=m_old, other=0.0)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        if not PDL_EARLY:
            tl.extra.cuda.gdc_launch_dependents()
    q = tl.load(q_ptr + heads[:, None] * D + d[None, :], mask=mg[:, None] & md[None, :], other=0.0)
    q = q.to(tl.float32) * scale                                         # (G_P, D_P)
    # the prefetched block plus the new row where it falls in it (disjoint masks: the sum is exact)
    m_new_row = ((sv0 < end) & (sv0 == n - 1))[:, None] & md[None, :]
    kb = k_old + tl.load(kc_ptr + off0, mask=m_new_row, other=0.0)      # (BLOCK_S, D_P) ACT
    vb = v_old + tl.load(vc_ptr + off0, mask=m_new_row, other=0.0)
    m = tl.full([G_P], float("-inf"), tl.float32)
    l = tl.zeros([G_P], tl.float32)
    acc = tl.zeros([G_P, D_P], tl.float32)
    s0 = start
    while s0 < end:  # (a while loop: the interpreter cannot range() over a run-time bound)
        sv = s0 + tl.arange(0, BLOCK_S)
        ms = sv < end
        # the next block's loads go out before this block's math: a slice of several blocks (few splits, a long
        # context) waits one round trip per block less
        sn = sv + BLOCK_S
        mn = (sn < end)[:, None] & md[None, :]
        kn = tl.load(kc_ptr + base + sn[:, None] * D + d[None, :], mask=mn, other=0.0)
        vn = tl.load(vc_ptr + base + sn[:, None] * D + d[None, :], mask=mn, other=0.0)
        k = kb.to(tl.float32)
        v = vb.to(tl.float32)
        sc = _sum(q[:, None, :] * k[None, :, :], 2)                                # (G_P, BLOCK_S)
        sc = tl.where(ms[None, :], sc, float("-inf"))
        m_new = tl.maximum(m, _max(sc, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(sc - m_new[:, None])
        l = l * alpha + _sum(p, 1)
        acc = acc * alpha[:, None] + _sum(p[:, :, None] * v[None, :, :], 1)
        m = m_new
        kb, vb = kn, vn
        s0 += BLOCK_S
    nact = tl.cdiv(n, per)                                                # slices with a position
    if FUSED_REDUCE and nact == 1:
        # the only slice with positions (a short context): its softmax is the whole one — o = acc / l, which is
        # what the combine below computes for one slice (weight e^0 = 1), without the partials' round trip and
        # the ticket
        o = acc / tl.where(mg, l, 1.0)[:, None]
        tl.store(o_ptr + heads[:, None] * D + d[None, :], o.to(ACT), mask=mg[:, None] & md[None, :])
    else:
        tl.store(part_m_ptr + heads * NSPLIT + sp, m, mask=mg)
        tl.store(part_l_ptr + heads * NSPLIT + sp, l, mask=mg)
        tl.store(part_acc_ptr + (heads[:, None] * NSPLIT + sp) * D + d[None, :], acc,
                 mask=mg[:, None] & md[None, :])
    if FUSED_REDUCE and nact > 1:  # the kv head's last program to finish combines the splits (no attn_reduce launch)
        tl.debug_barrier()   # every thread's partials are issued before the release
        ticket = tl.atomic_add(cnt_ptr + kvh, 1, sem="acq_rel", scope="gpu")
        if ticket == nact - 1:
            tl.atomic_xchg(cnt_ptr + kvh, 0, sem="relaxed", scope="gpu")   # ready for the next layer
            tl.debug_barrier()
            s_all = tl.arange(0, NSPLIT_P)
            m2 = mg[:, None] & (s_all < nact)[None, :]
            idx = heads[:, None] * NSPLIT + s_all[None, :]                                # (G_P, NSPLIT_P)
            ms_ = tl.load(part_m_ptr + idx, mask=m2, other=float("-inf"), cache_modifier=".cg")
            top = tl.where(mg, _max(ms_, 1), 0.0)
            wts = tl.exp(ms_ - top[:, None])
            den = _sum(wts * tl.load(part_l_ptr + idx, mask=m2, other=0.0, cache_modifier=".cg"), 1)
            acc3 = tl.load(part_acc_ptr + idx[:, :, None] * D + d[None, None, :], mask=m2[:, :, None] & md[None, None, :],
                           other=0.0, cache_modifier=".cg")                               # (G_P, NSPLIT_P, D_P)
            o = _sum(wts[:, :, None] * acc3, 1) / tl.where(mg, den, 1.0)[:, None]
            tl.store(o_ptr + heads[:, None] * D + d[None, :], o.to(ACT), mask=mg[:, None] & md[None, :])


# attn_reduce grid: NH. o[head] = Σ_s w_s acc_s / Σ_s w_s l_s with w_s = e^{m_s − max_s m_s}; slice 0 is never
# empty (n ≥ 1), so the max is finite and empty slices weigh 0.
@triton.jit
def attn_reduce_kernel(part_m_ptr, part_l_ptr, part_acc_ptr, o_ptr,
                       D: tl.constexpr, NSPLIT: tl.constexpr, NSPLIT_P: tl.constexpr, D_P: tl.constexpr,
                       ACT: tl.constexpr, USE_PDL: tl.constexpr, PDL_EARLY: tl.constexpr = False):
    if PDL_EARLY:  # before the wait this kernel reads nothing its step writes: the next may launch now
        tl.extra.cuda.gdc_launch_dependents()
    h = tl.program_id(0)
    s = tl.arange(0, NSPLIT_P)
    d = tl.arange(0, D_P)
    ms = s < NSPLIT
    md = d < D
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        if not PDL_EARLY:
            tl.extra.cuda.gdc_launch_dependents()
    m = tl.load(part_m_ptr + h * NSPLIT + s, mask=ms, other=float("-inf"))
    w = tl.exp(m - _max(m, 0))
    l = tl.load(part_l_ptr + h * NSPLIT + s, mask=ms, other=0.0)
    acc = tl.load(part_acc_ptr + (h * NSPLIT + s[:, None]) * D + d[None, :], mask=ms[:, None] & md[None, :],
                  other=0.0)
    o = _sum(w[:, None] * acc, 0) / _sum(w * l, 0)
    tl.store(o_ptr + h * D + d, o.to(ACT), mask=md)


# ---- oproj / down: x += W · a ----------------------------------------------------------------------------------
# W (N, K) row-major, a (K,), x (N,) the residual stream, updated in place: a program reads and writes only its own
# rows of x, and a is the previous kernel's output. Row blocks of BLOCK_N rows, NBLK = cdiv(N, BLOCK_N) of them, each
# read in KT = cdiv(K, BLOCK_K) column tiles. Grid: GRID programs (GRID = NBLK: one block each; fewer: program p
# takes blocks p, p + GRID, ... — a persistent grid whose programs stream their blocks back to back). A program's
# work is one run of ITEMS = cdiv(NBLK, GRID)·KT (block, tile) items, item t = block p + (t // KT)·GRID, tile t % KT;
# items past its last block are fully masked (no memory traffic). With STATS_OUT each program adds its rows' Σx² (of
# x as stored, rounded to ACT) into ss, so the next RMSNorm needs one load, not a pass over x (STATS_IN of the
# consumer); float32 atomics make the sum's order, and so its last bit, vary between runs.
@device_function
def _item_rows(t, pid, rr, KT: tl.constexpr, GRID: tl.constexpr, BLOCK_N: tl.constexpr):
    """The rows (BLOCK_N,) of program ``pid``'s item ``t``: block pid + (t // KT)·GRID."""
    return (pid + (t // KT) * GRID) * BLOCK_N + rr


@device_function
def _item_tile(w_ptr, t, pid, rr, cols, N: tl.constexpr, K: tl.constexpr, KT: tl.constexpr, GRID: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Item ``t``'s weight tile (BLOCK_N, BLOCK_K) of program ``pid``, zero past N rows, K columns or the
    program's last block (a masked load: no memory traffic)."""
    rows = _item_rows(t, pid, rr, KT, GRID, BLOCK_N)
    k0 = (t % KT) * BLOCK_K
    return tl.load(w_ptr + rows[:, None].to(tl.int64) * K + k0 + cols[None, :],
                   mask=(rows < N)[:, None] & (k0 + cols < K)[None, :], other=0.0)


@device_function
def _item_scale(ws_ptr, t, pid, rr, N: tl.constexpr, KT: tl.constexpr, GRID: tl.constexpr, BLOCK_N: tl.constexpr):
    """The FP8 row scales (BLOCK_N,) float32 of item ``t``'s rows, loaded with its tile."""
    rows = _item_rows(t, pid, rr, KT, GRID, BLOCK_N)
    return tl.load(ws_ptr + rows, mask=rows < N, other=0.0)


@device_function
def _residual_out(x_ptr, ss_ptr, acc, rows, N: tl.constexpr, STATS_OUT: tl.constexpr, ACT: tl.constexpr):
    """x[rows] += round(acc) (float32 (BLOCK_N,) row sums), rounded as the reference; with STATS_OUT the block's Σx²
    of the new x into ss (zeroed by the previous step's argmax)."""
    mrow = rows < N
    x = tl.load(x_ptr + rows, mask=mrow, other=0.0).to(tl.float32)
    xn = (x + acc.to(ACT).to(tl.float32)).to(ACT)
    tl.store(x_ptr + rows, xn, mask=mrow)
    if STATS_OUT:
        xf = tl.where(mrow, xn.to(tl.float32), 0.0)
        tl.atomic_add(ss_ptr, _sum(xf * xf, 0), sem="relaxed", scope="gpu")


@triton.jit
def matvec_residual_kernel(w_ptr, a_ptr, x_ptr, ss_ptr, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr, STATS_OUT: tl.constexpr, ACT: tl.constexpr, USE_PDL: tl.constexpr,
                           ws_ptr=None, W_FP8: tl.constexpr = False, PDL_EARLY: tl.constexpr = False,
                           GRID: tl.constexpr = 0):
    if PDL_EARLY:  # before the wait this kernel reads nothing its step writes: the next may launch now
        tl.extra.cuda.gdc_launch_dependents()
    NBLK: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    KT: tl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
    PROGS: tl.constexpr = NBLK if GRID == 0 else GRID
    ITEMS: tl.constexpr = (NBLK + PROGS - 1) // PROGS * KT
    ONE: tl.constexpr = ITEMS == KT          # one block per program: its epilogue after the loop
    pid = tl.program_id(0)
    rr = tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_K)
    # Three tiles in flight: two issued before the wait, each item issues the one two ahead, so a long row (the
    # down projection's K = intermediate) or a run of blocks streams without a round trip per tile.
    w0 = _item_tile(w_ptr, 0, pid, rr, cols, N, K, KT, PROGS, BLOCK_N, BLOCK_K)
    w1 = _item_tile(w_ptr, 1, pid, rr, cols, N, K, KT, PROGS, BLOCK_N, BLOCK_K)
    if W_FP8:   # the scales of the first two items' rows (with ONE, the program's only block)
        s0 = _item_scale(ws_ptr, 0, pid, rr, N, KT, PROGS, BLOCK_N)
        s1 = _item_scale(ws_ptr, 1, pid, rr, N, KT, PROGS, BLOCK_N)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        if not PDL_EARLY:
            tl.extra.cuda.gdc_launch_dependents()
    acc = tl.zeros([BLOCK_N], tl.float32)
    for t in range(0, ITEMS):
        k0 = (t % KT) * BLOCK_K
        a = tl.load(a_ptr + k0 + cols, mask=k0 + cols < K, other=0.0).to(tl.float32)
        w2 = _item_tile(w_ptr, t + 2, pid, rr, cols, N, K, KT, PROGS, BLOCK_N, BLOCK_K)
        acc += _sum(w0.to(tl.float32) * a[None, :], 1)
        w0, w1 = w1, w2
        if not ONE:
            if W_FP8:
                s2 = _item_scale(ws_ptr, t + 2, pid, rr, N, KT, PROGS, BLOCK_N)
            if t % KT == KT - 1:   # the block's last tile
                if W_FP8:
                    acc = acc * s0
                _residual_out(x_ptr, ss_ptr, acc, _item_rows(t, pid, rr, KT, PROGS, BLOCK_N), N, STATS_OUT, ACT)
                acc = tl.zeros([BLOCK_N], tl.float32)
            if W_FP8:
                s0, s1 = s1, s2
    if ONE:
        if W_FP8:
            acc = acc * s0
        _residual_out(x_ptr, ss_ptr, acc, pid * BLOCK_N + rr, N, STATS_OUT, ACT)


# ---- gateup: a = SiLU(W_gate · h) ⊙ (W_up · h), h = RMSNorm(x) · post_attention_layernorm --------------------------
# W_gate, W_up (I, H) row-major; row blocks of BLOCK_N rows of both, NBLK = cdiv(I, BLOCK_N), each in KT =
# cdiv(H, BLOCK_K) column tiles; GRID programs over them as matvec_residual_kernel's (GRID = NBLK: one block each).
# The norm's 1/rms is computed once per program; with one column tile (KT = 1) the normed h too, before the items.
# Each item issues the next item's two tiles before it multiplies its own.
@device_function
def _swiglu_out(out_ptr, gate, up, rows, I: tl.constexpr, ACT: tl.constexpr):
    """a[rows] = SiLU(gate) · up from float32 (BLOCK_N,) row sums, rounded as the reference."""
    g = gate.to(ACT).to(tl.float32)
    u = up.to(ACT).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(ACT).to(tl.float32)
    tl.store(out_ptr + rows, (act * u).to(ACT), mask=rows < I)


@triton.jit
def gateup_kernel(x_ptr, norm_ptr, wg_ptr, wu_ptr, out_ptr, ss_ptr, eps, I: tl.constexpr, H: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STATS_IN: tl.constexpr, ACT: tl.constexpr,
                  USE_PDL: tl.constexpr, wgs_ptr=None, wus_ptr=None, W_FP8: tl.constexpr = False,
                  PDL_EARLY: tl.constexpr = False, GRID: tl.constexpr = 0):
    if PDL_EARLY:  # before the wait this kernel reads nothing its step writes: the next may launch now
        tl.extra.cuda.gdc_launch_dependents()
    NBLK: tl.constexpr = (I + BLOCK_N - 1) // BLOCK_N
    KT: tl.constexpr = (H + BLOCK_K - 1) // BLOCK_K
    PROGS: tl.constexpr = NBLK if GRID == 0 else GRID
    ITEMS: tl.constexpr = (NBLK + PROGS - 1) // PROGS * KT
    ONE: tl.constexpr = ITEMS == 1           # one tile of one block: nothing to fetch ahead
    pid = tl.program_id(0)
    rr = tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_K)
    wg0 = _item_tile(wg_ptr, 0, pid, rr, cols, I, H, KT, PROGS, BLOCK_N, BLOCK_K)
    wu0 = _item_tile(wu_ptr, 0, pid, rr, cols, I, H, KT, PROGS, BLOCK_N, BLOCK_K)
    if W_FP8:
        sg0 = _item_scale(wgs_ptr, 0, pid, rr, I, KT, PROGS, BLOCK_N)
        su0 = _item_scale(wus_ptr, 0, pid, rr, I, KT, PROGS, BLOCK_N)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        if not PDL_EARLY:
            tl.extra.cuda.gdc_launch_dependents()
    inv = _rms_inv(x_ptr, ss_ptr, eps, cols, H, BLOCK_K, STATS_IN)
    if KT == 1:
        h1 = _normed(x_ptr, norm_ptr, 0, cols, inv, H, ACT)
    gate = tl.zeros([BLOCK_N], tl.float32)
    up = tl.zeros([BLOCK_N], tl.float32)
    if ONE:
        gate += _sum(wg0.to(tl.float32) * h1[None, :], 1)
        up += _sum(wu0.to(tl.float32) * h1[None, :], 1)
        if W_FP8:
            gate = gate * sg0
            up = up * su0
        _swiglu_out(out_ptr, gate, up, pid * BLOCK_N + rr, I, ACT)
    else:
        for t in range(0, ITEMS):
            wg1 = _item_tile(wg_ptr, t + 1, pid, rr, cols, I, H, KT, PROGS, BLOCK_N, BLOCK_K)
            wu1 = _item_tile(wu_ptr, t + 1, pid, rr, cols, I, H, KT, PROGS, BLOCK_N, BLOCK_K)
            if W_FP8:
                sg1 = _item_scale(wgs_ptr, t + 1, pid, rr, I, KT, PROGS, BLOCK_N)
                su1 = _item_scale(wus_ptr, t + 1, pid, rr, I, KT, PROGS, BLOCK_N)
            if KT == 1:
                hv = h1
            else:
                hv = _normed(x_ptr, norm_ptr, (t % KT) * BLOCK_K, cols, inv, H, ACT)
            gate += _sum(wg0.to(tl.float32) * hv[None, :], 1)
            up += _sum(wu0.to(tl.float32) * hv[None, :], 1)
            if t % KT == KT - 1:   # the block's last tile
                if W_FP8:
                    gate = gate * sg0
                    up = up * su0
                _swiglu_out(out_ptr, gate, up, _item_rows(t, pid, rr, KT, PROGS, BLOCK_N), I, ACT)
                gate = tl.zeros([BLOCK_N], tl.float32)
                up = tl.zeros([BLOCK_N], tl.float32)
            wg0, wu0 = wg1, wu1
            if W_FP8:
                sg0, su0 = sg1, su1


# ---- lmhead + argmax ---------------------------------------------------------------------------------------------
# lmhead: logits[r] = W_head[r] · (RMSNorm(x) · norm), rounded to ACT as the reference's bf16 logits, stored in
# float32. Row blocks of BLOCK_N rows in KT = cdiv(H, BLOCK_K) column tiles, GRID programs over them as
# matvec_residual_kernel's (GRID = 0: one program per block). Each program folds the (max, first argmax) of all its
# rows into one int64 key with one atomic_max into slot pid % NSLOT (a few hundred atomics per slot at most, none
# waiting on another slot).
@device_function
def _argmax_key(y, rows, V: tl.constexpr):
    """(max, first argmax) of the float32 logits ``y`` (BLOCK_N,) at ``rows`` (rows ≥ V ignored) as one int64 whose
    signed order is the float order, ties to the lower row: the float's bits with the magnitude bits flipped for
    negatives (monotone as int32), then V − 1 − row below them."""
    y = tl.where(rows < V, y, float("-inf"))
    best = _max(y, 0)
    idx = _min(tl.where(y == best, rows, V), 0)
    bits = best.to(tl.int32, bitcast=True)
    ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return (ordered.to(tl.int64) << 32) | (V - 1 - idx).to(tl.int64)


@triton.jit
def lmhead_kernel(x_ptr, norm_ptr, w_ptr, logits_ptr, keys_ptr, ss_ptr, eps, V: tl.constexpr,
                  H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NSLOT: tl.constexpr,
                  STATS_IN: tl.constexpr, ACT: tl.constexpr, USE_PDL: tl.constexpr, ws_ptr=None,
                  W_FP8: tl.constexpr = False, PDL_EARLY: tl.constexpr = False, GRID: tl.constexpr = 0):
    if PDL_EARLY:  # before the wait this kernel reads nothing its step writes: the next may launch now
        tl.extra.cuda.gdc_launch_dependents()
    NBLK: tl.constexpr = (V + BLOCK_N - 1) // BLOCK_N
    KT: tl.constexpr = (H + BLOCK_K - 1) // BLOCK_K
    PROGS: tl.constexpr = NBLK if GRID == 0 else GRID
    ITEMS: tl.constexpr = (NBLK + PROGS - 1) // PROGS * KT
    ONE: tl.constexpr = ITEMS == KT          # one block per program: as many programs as blocks
    pid = tl.program_id(0)
    rr = tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_K)
    w0 = _item_tile(w_ptr, 0, pid, rr, cols, V, H, KT, PROGS, BLOCK_N, BLOCK_K)
    if W_FP8:
        s0 = _item_scale(ws_ptr, 0, pid, rr, V, KT, PROGS, BLOCK_N)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        if not PDL_EARLY:
            tl.extra.cuda.gdc_launch_dependents()
    inv = _rms_inv(x_ptr, ss_ptr, eps, cols, H, BLOCK_K, STATS_IN)
    acc = tl.zeros([BLOCK_N], tl.float32)
    if ONE:
        for k0 in range(0, H, BLOCK_K):
            if k0 > 0:
                w0 = _item_tile(w_ptr, k0 // BLOCK_K, pid, rr, cols, V, H, KT, PROGS, BLOCK_N, BLOCK_K)
            acc += _sum(w0.to(tl.float32) * _normed(x_ptr, norm_ptr, k0, cols, inv, H, ACT)[None, :], 1)
        if W_FP8:
            acc = acc * s0
        rows = pid * BLOCK_N + rr
        y = acc.to(ACT).to(tl.float32)
        tl.store(logits_ptr + rows, y, mask=rows < V)
        key = _argmax_key(y, rows, V)
    else:
        key = tl.full([], -9223372036854775807 - 1, tl.int64)
        if KT == 1:
            h1 = _normed(x_ptr, norm_ptr, 0, cols, inv, H, ACT)
        for t in range(0, ITEMS):   # the next item's tile issued before this one is multiplied
            w1 = _item_tile(w_ptr, t + 1, pid, rr, cols, V, H, KT, PROGS, BLOCK_N, BLOCK_K)
            if W_FP8:
                s1 = _item_scale(ws_ptr, t + 1, pid, rr, V, KT, PROGS, BLOCK_N)
            if KT == 1:
                hv = h1
            else:
                hv = _normed(x_ptr, norm_ptr, (t % KT) * BLOCK_K, cols, inv, H, ACT)
            acc += _sum(w0.to(tl.float32) * hv[None, :], 1)
            if t % KT == KT - 1:   # the block's last tile
                if W_FP8:
                    acc = acc * s0
                rows = _item_rows(t, pid, rr, KT, PROGS, BLOCK_N)
                y = acc.to(ACT).to(tl.float32)
                tl.store(logits_ptr + rows, y, mask=rows < V)
                key = tl.maximum(key, _argmax_key(y, rows, V))
                acc = tl.zeros([BLOCK_N], tl.float32)
            w0 = w1
            if W_FP8:
                s0 = s1
    tl.atomic_max(keys_ptr + pid % NSLOT, key, sem="relaxed", scope="gpu")


# argmax grid: 1. The greedy token from the NSLOT keys (torch.argmax's rule: the first maximum), written to tok (the
# next step's input) and tok_out (the host's copy); then the keys back to their minimum, pos += 1 and the Σx² slots
# (ss, NSS of them) zeroed end the step. With RING, the token is also stored in ring[pos % RING], a host buffer
# the kernel writes through the mapping of pinned memory, for the host to read once the step's event has passed.
@triton.jit
def argmax_kernel(keys_ptr, tok_ptr, tok_out_ptr, pos_ptr, ss_ptr, V: tl.constexpr, NSLOT: tl.constexpr,
                  NSLOT_P: tl.constexpr, NSS: tl.constexpr, NSS_P: tl.constexpr, USE_PDL: tl.constexpr,
                  PDL_EARLY: tl.constexpr = False, ring_ptr=None, RING: tl.constexpr = 0):
    if PDL_EARLY:  # before the wait this kernel reads nothing its step writes: the next may launch now
        tl.extra.cuda.gdc_launch_dependents()
    offs = tl.arange(0, NSLOT_P)
    ms = offs < NSLOT
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        if not PDL_EARLY:
            tl.extra.cuda.gdc_launch_dependents()
    lowest = tl.full([NSLOT_P], -9223372036854775807 - 1, tl.int64)
    keys = tl.load(keys_ptr + offs, mask=ms, other=-9223372036854775807 - 1)
    top = _max(keys, 0)
    tok = (V - 1 - (top & 0xFFFFFFFF)).to(tl.int32)
    tl.store(tok_ptr, tok)
    tl.store(tok_out_ptr, tok)
    tl.store(keys_ptr + offs, lowest, mask=ms)
    p = tl.load(pos_ptr)
    if RING > 0:   # the host's ring (pinned, mapped): the token reaches the host with no copy between steps
        tl.store(ring_ptr + p % RING, tok)
    tl.store(pos_ptr, p + 1)
    zs = tl.arange(0, NSS_P)
    tl.store(ss_ptr + zs, tl.zeros([NSS_P], tl.float32), mask=zs < NSS)   # the next step's Σx² start at 0
