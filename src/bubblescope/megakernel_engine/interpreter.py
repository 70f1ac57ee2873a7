"""Plain-PyTorch interpreter of the megakernel's instruction table and packed weights (the debugging oracle).

It executes the *same* tasks (same tiles, same packed rows, same buffers and roundings as ``triton_kernel/ops.py``)
with torch ops, one task at a time, checking each task's dependency counter like the kernel does. Uses:

* bisect a kernel mismatch: ``step(token, stop_after=(layer, "OPROJ"))`` stops once every task of that
  (layer, opcode) ran and returns the buffers, to compare with the reference engine's intermediates;
* check a schedule: :meth:`ScheduleInterpreter.run_programs` interleaves the per-program queues the way
  resident programs could run them and raises ``KernelStuck`` if all of them would wait (a deadlock);
* a Decoder in its own right (``prefill``/``decode``), name ``megakernel-oracle``.

FP8 packed weights: each row's float32 sum over the float8_e4m3fn values is multiplied by the row's scale, as the
kernel does (``triton_kernel/ops.py``).
"""

from __future__ import annotations

import math

import torch

from ..errors import BubblescopeError, KernelStuck
from ..models.weights import ModelWeights
from .packing import pack_weights
from .schedule import (F_GIDX, F_SIGINC, OP_ATTN, OP_ATTN_REDUCE, OP_DOWN, OP_GATEUP, OP_LMHEAD, OP_OPROJ, OP_QKV,
                       OPCODE_NAMES, OPCODES, MegakernelParams, Schedule, Task, build_schedule)


class ScheduleInterpreter:
    """Executes a :class:`Schedule` over :class:`PackedWeights` with torch ops (any device).

    Args:
        weights: model weights (packed here with the schedule's tiling).
        params: schedule parameters; ``num_programs`` (default 1) sets the lowering that
            :meth:`run_programs` interleaves.
        max_seq_len: KV-cache positions (default ``min(max_position_embeddings, 2048)``).
    """

    name = "megakernel-oracle"

    def __init__(self, weights: ModelWeights, params: MegakernelParams | None = None, max_seq_len: int | None = None):
        self.config = cfg = weights.config
        self.device, self.act = weights.device, weights.dtype
        self.max_seq_len = int(max_seq_len or min(cfg.max_position_embeddings, 2048))
        params = params or MegakernelParams(max_rows=256, kv_splits=1, attn_kv_heads=64)
        self.schedule: Schedule = build_schedule(cfg, params, params.num_programs or 1)
        self.packed = pack_weights(weights, self.schedule.tiling, self.max_seq_len)
        t = self.schedule.tiling
        z = lambda *s, dtype=self.act: torch.zeros(s, dtype=dtype, device=self.device)  # noqa: E731
        nq = cfg.num_attention_heads * t.kv_splits
        self.buffers = {
            "x": z(cfg.hidden_size), "q": z(cfg.q_size), "attn": z(cfg.q_size), "act": z(t.i_pad),
            "k_cache": z(cfg.num_hidden_layers, cfg.num_key_value_heads, self.max_seq_len, cfg.head_dim),
            "v_cache": z(cfg.num_hidden_layers, cfg.num_key_value_heads, self.max_seq_len, cfg.head_dim),
            "pm": z(nq, dtype=torch.float32), "pl": z(nq, dtype=torch.float32),
            "pacc": z(nq, cfg.head_dim, dtype=torch.float32), "logits": z(cfg.vocab_size, dtype=torch.float32),
            "k_new": z(cfg.num_key_value_heads, cfg.head_dim)}  # raw new k (Tiling.qk_norm_attn)
        self._tickets: dict[int, int] = {}
        self.position = 0

    # ---- building blocks (same roundings as triton_kernel/ops.py) ----------------------------------------------------
    def _rnd(self, v: torch.Tensor) -> torch.Tensor:
        return v.to(self.act).float()

    def _normed(self, src: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x = src.float()
        inv = torch.rsqrt(x.pow(2).mean() + self.config.rms_norm_eps)
        return self._rnd(self._rnd(x * inv) * w.float())

    def _rope(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        """rotate_half RoPE of ACT-valued (..., D) rows at ``pos``, rounded as ops.op_qkv rounds it."""
        half = x.shape[-1] // 2
        lo, hi = x[..., :half], x[..., half:]
        c = self.packed.cos[pos].to(self.act).float()
        s = self.packed.sin[pos].to(self.act).float()
        return torch.cat((self._rnd(self._rnd(lo * c) - self._rnd(hi * s)),
                          self._rnd(self._rnd(hi * c) + self._rnd(lo * s))), dim=-1)

    def _normed_rope(self, x: torch.Tensor, w: torch.Tensor, pos: int) -> torch.Tensor:
        """Per-head RMSNorm (q_norm / k_norm weight ``w`` (D,)) then RoPE of raw ACT rows (..., D): what the
        Gluon ATTN task does with ``Tiling.qk_norm_attn`` (each row's statistics over its own D values)."""
        xf = x.float()
        inv = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps)
        return self._rope(self._rnd(self._rnd(xf * inv) * w.float()), pos)

    # ---- one task ----------------------------------------------------------------------------------------
    def run_task(self, t: Task, token: int, pos: int) -> None:
        """Execute one task on the buffers (see the opcode comments in triton_kernel/ops.py for the math)."""
        cfg, p, b, tl_ = self.config, self.packed, self.buffers, self.schedule.tiling
        D = cfg.head_dim
        half, layer = D // 2, t.layer
        src = p.embed[token] if layer == 0 else b["x"]
        if t.op == OP_QKV:
            h = self._normed(src, p.anorm[layer])
            w = p.wqkv[layer].float()
            j = torch.arange(t.a1, t.a1 + t.a2, device=self.device)
            lo_row = (j // tl_.hb) * 2 * tl_.hb + j % tl_.hb
            hi_row = lo_row + tl_.hb
            lo, hi = w[lo_row] @ h, w[hi_row] @ h
            if p.sqkv is not None:
                lo, hi = lo * p.sqkv[layer, lo_row], hi * p.sqkv[layer, hi_row]
            if p.bqkv is not None:
                lo, hi = lo + p.bqkv[layer, lo_row].float(), hi + p.bqkv[layer, hi_row].float()
            lo, hi = self._rnd(lo), self._rnd(hi)
            i, head = j % half, j // half
            nqh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
            is_q, is_v = head < nqh, head >= nqh + nkv
            if tl_.qk_norm_attn:  # raw q (+ bias) → q buffer, raw k → k_new, v → cache; ATTN norms and rotates
                for sel, dst, h0 in ((is_q, "q", 0), (~is_q & ~is_v, "k_new", nqh)):
                    hh, ii = head[sel] - h0, i[sel]
                    b[dst].view(-1)[hh * D + ii] = lo[sel].to(self.act)
                    b[dst].view(-1)[hh * D + half + ii] = hi[sel].to(self.act)
                sel, hh, ii = is_v, head[is_v] - nqh - nkv, i[is_v]
                b["v_cache"][layer, hh, pos, ii], b["v_cache"][layer, hh, pos, half + ii] = \
                    lo[sel].to(self.act), hi[sel].to(self.act)
                return
            if p.qknorm is not None:
                lo2, hi2 = lo.view(-1, half), hi.view(-1, half)
                r = torch.rsqrt((lo2.pow(2).sum(1) + hi2.pow(2).sum(1)) / D + cfg.rms_norm_eps)
                wn = p.qknorm[layer, (~is_q).long()].float()                       # (pairs, D)
                n_lo = self._rnd(self._rnd(lo2 * r[:, None]).view(-1) * wn.gather(1, i[:, None])[:, 0])
                n_hi = self._rnd(self._rnd(hi2 * r[:, None]).view(-1) * wn.gather(1, (half + i)[:, None])[:, 0])
                lo, hi = torch.where(is_v, lo, n_lo), torch.where(is_v, hi, n_hi)
            c = p.cos[pos, i].to(self.act).float()
            s = p.sin[pos, i].to(self.act).float()
            out_lo = torch.where(is_v, lo, self._rnd(self._rnd(lo * c) - self._rnd(hi * s))).to(self.act)
            out_hi = torch.where(is_v, hi, self._rnd(self._rnd(hi * c) + self._rnd(lo * s))).to(self.act)
            for sel, dst, h0 in ((is_q, None, 0), (~is_q & ~is_v, "k_cache", nqh), (is_v, "v_cache", nqh + nkv)):
                if not bool(sel.any()):
                    continue
                hh, ii = head[sel] - h0, i[sel]
                if dst is None:
                    b["q"][hh * D + ii], b["q"][hh * D + half + ii] = out_lo[sel], out_hi[sel]
                else:
                    b[dst][layer, hh, pos, ii], b[dst][layer, hh, pos, half + ii] = out_lo[sel], out_hi[sel]
        elif t.op == OP_ATTN:
            g, ns = cfg.gqa_group, tl_.kv_splits
            n = pos + 1
            chunk = max(-(-n // ns), tl_.attn_min_chunk)
            lo_s, hi_s = t.a2 * chunk, min(n, (t.a2 + 1) * chunk)
            if tl_.qk_norm_attn and lo_s < hi_s:
                # The split holding `pos` norms and rotates the new k and writes it to the cache itself; the
                # others read positions < pos only (written in earlier steps).
                if hi_s == n:
                    for kvh in range(t.a0, t.a0 + t.a1):
                        b["k_cache"][layer, kvh, pos] = self._normed_rope(b["k_new"][kvh], p.qknorm[layer, 1],
                                                                          pos).to(self.act)
            for hq in range(t.a0 * g, (t.a0 + t.a1) * g):
                out = hq * ns + t.a2
                if lo_s >= hi_s:
                    b["pm"][out], b["pl"][out], b["pacc"][out] = float("-inf"), 0.0, 0.0
                    continue
                q = b["q"][hq * D:(hq + 1) * D].float()
                if tl_.qk_norm_attn:  # every split norms and rotates its own copy (the q buffer stays raw)
                    q = self._normed_rope(q, p.qknorm[layer, 0], pos)
                k = b["k_cache"][layer, hq // g, lo_s:hi_s].float()
                v = b["v_cache"][layer, hq // g, lo_s:hi_s].float()
                sc = (k @ q) / math.sqrt(D)
                m = sc.max()
                e = torch.exp(sc - m)
                b["pm"][out], b["pl"][out], b["pacc"][out] = m, e.sum(), e @ v
        elif t.op == OP_ATTN_REDUCE:
            self._attn_reduce(t, pos)
        elif t.op in (OP_OPROJ, OP_DOWN):
            r = slice(t.a1, t.a1 + t.a2)
            if t.op == OP_OPROJ:
                w, s, a, resid = p.wo[layer], p.so, b["attn"], (src if layer == 0 else b["x"])
            else:
                w, s, a, resid = p.wdown[layer], p.sdown, b["act"][:cfg.intermediate_size], b["x"]
            y = w[r].float() @ a.float()
            y = self._rnd(y if s is None else y * s[layer, r])
            b["x"][r] = (resid[r].float() + y).to(self.act)
        elif t.op == OP_GATEUP:  # a task of several packed blocks = the same rows in one go
            h = self._normed(b["x"], p.mnorm[layer])
            j = torch.arange(t.a1, min(t.a1 + t.a2, cfg.intermediate_size), device=self.device)
            g_row = (j // tl_.gb) * 2 * tl_.gb + j % tl_.gb
            w = p.wgu[layer].float()
            g, u = w[g_row] @ h, w[g_row + tl_.gb] @ h
            if p.sgu is not None:
                g, u = g * p.sgu[layer, g_row], u * p.sgu[layer, g_row + tl_.gb]
            g, u = self._rnd(g), self._rnd(u)
            b["act"][j] = (self._rnd(g / (1 + torch.exp(-g))) * u).to(self.act)
        elif t.op == OP_LMHEAD:
            h = self._normed(b["x"], p.final_norm)
            r = torch.arange(t.a1, t.a1 + t.a2, device=self.device)
            val = p.lm_head[r].float() @ h
            val = self._rnd(val if p.slm is None else val * p.slm[r])
            b["logits"][r] = val
        else:
            raise BubblescopeError(f"oracle: unknown opcode {t.op}")

    def _splits_used(self, pos: int) -> int:
        """Non-empty ATTN splits at ``pos`` (ops.splits_used)."""
        n, ns = pos + 1, self.schedule.tiling.kv_splits
        return -(-n // max(-(-n // ns), self.schedule.tiling.attn_min_chunk))

    def _attn_reduce(self, t: Task, pos: int) -> None:
        """ATTN_REDUCE of kv heads [t.a0, t.a0 + t.a1) over the non-empty splits (see ops.op_attn_reduce)."""
        cfg, b, ns, D = self.config, self.buffers, self.schedule.tiling.kv_splits, self.config.head_dim
        used = self._splits_used(pos)
        for hq in range(t.a0 * cfg.gqa_group, (t.a0 + t.a1) * cfg.gqa_group):
            m, l, acc = (b[k][hq * ns:hq * ns + used] for k in ("pm", "pl", "pacc"))
            w = torch.exp(m - m.max())
            b["attn"][hq * D:(hq + 1) * D] = ((w[:, None] * acc).sum(0) / (w * l).sum()).to(self.act)

    # ---- whole steps ----------------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self, token: int, stop_after: tuple[int, str] | None = None) -> dict[str, torch.Tensor]:
        """One decode step at ``self.position`` in topological order, checking every dependency.

        ``stop_after=(layer, opcode name)`` stops once all tasks of that (layer, opcode) ran and returns clones
        of the buffers without advancing the position. Returns the buffers (not cloned) after a full step.

        Raises:
            KernelStuck: a task's dependency is not met when its turn comes (a schedule bug).
        """
        counts = [0] * self.schedule.num_counters
        self._tickets.clear()
        stop = None
        if stop_after is not None:
            op = OPCODES[stop_after[1]]
            stop = max(t.gidx for t in self.schedule.tasks if (t.layer, t.op) == (stop_after[0], op))
        for t in self.schedule.tasks:
            self._run_checked(t, counts, token, -1)
            if t.gidx == stop:
                return {k: v.clone() for k, v in self.buffers.items()}
        self.position += 1
        return self.buffers

    def _run_checked(self, t: Task, counts: list[int], token: int, program: int, amount: int = 1) -> None:
        if t.wait >= 0 and counts[t.wait] < t.need:
            raise KernelStuck(f"oracle: {OPCODE_NAMES[t.op]} layer {t.layer} tile {t.tile} (task #{t.gidx}, program "
                              f"{program}) needs {t.need} increments of counter {t.wait} "
                              f"({self.schedule.counter_name(t.wait)}), has {counts[t.wait]}")
        self.run_task(t, token, self.position)
        if t.ticket >= 0:  # fused reduction: the group's last non-empty split reduces and signals
            if t.a2 >= self._splits_used(self.position):
                return  # an empty split: skipped by the kernel (no ticket)
            got = self._tickets.get(t.ticket, 0) + 1
            self._tickets[t.ticket] = got
            if got == self._splits_used(self.position):
                self._attn_reduce(t, self.position)
                if t.signal >= 0:
                    counts[t.signal] += 1
        elif t.signal >= 0:
            counts[t.signal] += amount

    @torch.inference_mode()
    def run_programs(self, token: int) -> None:
        """One step over the per-program queues of the lowered table, as resident programs could interleave:
        repeatedly, every program whose next task's dependency is met runs it (program order within a round);
        signals follow the table (F_SIGINC: a program's run of one stage signals once, at its end).

        Raises:
            KernelStuck: no program can make progress while tasks remain (the schedule would deadlock).
        """
        sch = self.schedule
        rows = [sch.table[p, :int(sch.counts[p])].tolist() for p in range(sch.num_programs)]
        queues = [[(self.schedule.tasks[r[F_GIDX]], r[F_SIGINC]) for r in q] for q in rows]
        heads = [0] * len(queues)
        counts = [0] * sch.num_counters
        self._tickets.clear()
        while any(h < len(q) for h, q in zip(heads, queues)):
            progressed = False
            for p, q in enumerate(queues):
                while heads[p] < len(q):
                    t, amount = q[heads[p]]
                    if t.wait >= 0 and counts[t.wait] < t.need:
                        break
                    self._run_checked(t, counts, token, p, amount)
                    heads[p] += 1
                    progressed = True
            if not progressed:
                p = next(p for p, q in enumerate(queues) if heads[p] < len(q))
                t, amount = queues[p][heads[p]]
                self._run_checked(t, counts, token, p, amount)  # raises KernelStuck
        self.position += 1

    def reset(self) -> None:
        for v in self.buffers.values():
            v.zero_()
        self._tickets.clear()
        self.position = 0

    def prefill(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Decoder protocol: the prompt one step per token from position 0; float32 logits (V,) (a copy)."""
        if token_ids.numel() == 0 or token_ids.numel() > self.max_seq_len:
            raise BubblescopeError(f"prompt: {token_ids.numel()} tokens, need 1..{self.max_seq_len}")
        self.reset()
        for tok in token_ids.reshape(-1).tolist():
            self.step(int(tok))
        return self.buffers["logits"].clone()

    def decode(self, token: int | torch.Tensor) -> torch.Tensor:
        """Decoder protocol: one step; float32 logits (V,) (a copy)."""
        if self.position >= self.max_seq_len:
            raise BubblescopeError(f"decode: the KV cache of {self.max_seq_len} positions is full")
        self.step(int(token))
        return self.buffers["logits"].clone()
