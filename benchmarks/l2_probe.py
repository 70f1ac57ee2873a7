"""Probe: can an SM park weight bytes in L2 ahead of its ring, and keep them there? (H200)

Every L2 prefetch past the megakernel's ring lost (benchmarks/NOTES.md, "L2"). Two explanations fit the frames:
the prefetch instructions stall the warp that issues them (so the producer's ring loads go out late), or the lines
are evicted by the weight stream before the ring asks for them (so the bytes are read twice). This probe separates
them on a bare kernel, one CTA per SM, every CTA on its own region:

    t0 ─ prefetch P bytes of region A (per line, per bulk, or not), or read them (``touch``, ``touch_last``: with an
       L2 evict_last policy) ─ t1 ─ stream S bytes of region B ─ t2 ─ spin until t1 + wait ─ t2w ─ read A ─ t3

``issue_us`` = t1 − t0 (how long the issuing warps are held; for the reads, until their bytes arrived), ``use_us`` =
t3 − t2w (A from L2 or from HBM: compare with the ``cold`` and ``hot`` rows, where A is read after a flush, or after
a launch just before read it). L2 is flushed
(a 256 MB read-modify-write) before every launch but the ``hot`` rows'.

Run on the GPU: ``python benchmarks/l2_probe.py --out l2_probe.json``; medians over CTAs, then over launches.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
import triton
import triton.language as tl

MODES = {"none": 0, "line": 1, "bulk": 2, "line_last": 3, "touch": 4, "touch_last": 5}


@triton.jit
def _now():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


# CG 1: A's reads `ld.global.cg` (L2 only): a region read twice by one SM would otherwise hit its L1 (256 KB) the
# second time, and the TMA ring's loads, whose L2 behaviour this stands for, never touch L1. (B is read once; `.cg`
# cannot take the L1 evict_first that HINT's loads carry.)
@triton.jit
def _read(base_ptr, n_blocks, BLOCK: tl.constexpr, HINT: tl.constexpr, CG: tl.constexpr):
    """Sum of ``n_blocks`` blocks of BLOCK int32 from ``base_ptr``: CG 1 ``.cg``; else HINT 1 evict_first, HINT 2
    evict_last (L1 and L2 policies: ptxas refuses either with ``.cg``); else plain."""
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for i in range(n_blocks):
        offs = i * BLOCK + tl.arange(0, BLOCK)
        if CG == 1:
            acc += tl.load(base_ptr + offs, cache_modifier=".cg")
        elif HINT == 1:
            acc += tl.load(base_ptr + offs, eviction_policy="evict_first")
        elif HINT == 2:
            acc += tl.load(base_ptr + offs, eviction_policy="evict_last")
        else:
            acc += tl.load(base_ptr + offs)
    return tl.sum(acc, axis=0)


# A (int32) holds P_LINES 128-byte lines per program, B S_BLOCKS blocks of BLOCK int32; per program 5 stamps (ns).
# MODE 1: one `prefetch.global.L2` per line, NT lines per instruction; MODE 3: the same with `::evict_last`;
# MODE 2: `cp.async.bulk.prefetch.L2` of P_LINES·128 / NT bytes per thread; MODE 4: A read (demand loads, summed)
# instead of prefetched, so t1 is after its bytes arrived; MODE 5: the same read with an L2 evict_last policy.
# HINT 1: B read with L2 evict_first.
@triton.jit
def l2_probe_kernel(a_ptr, b_ptr, sink_ptr, t_ptr, wait_ns, P_LINES: tl.constexpr, S_BLOCKS: tl.constexpr,
                    MODE: tl.constexpr, HINT: tl.constexpr, BLOCK: tl.constexpr, NT: tl.constexpr, CG: tl.constexpr):
    pid = tl.program_id(0)
    a_base = a_ptr + pid.to(tl.int64) * (P_LINES * 32)
    b_base = b_ptr + pid.to(tl.int64) * (S_BLOCKS * BLOCK)
    t0 = _now()
    if MODE == 1 or MODE == 3:
        for base in range(0, P_LINES, NT):
            j = base + tl.arange(0, NT)
            ok = (j < P_LINES).to(tl.int32)
            addr = (a_base + tl.minimum(j, P_LINES - 1) * 32).to(tl.int64, bitcast=True)
            if MODE == 1:
                tl.inline_asm_elementwise(
                    "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
                    "=r,l,r", [addr, ok], dtype=tl.int32, is_pure=False, pack=1)
            else:
                tl.inline_asm_elementwise(
                    "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0; }",
                    "=r,l,r", [addr, ok], dtype=tl.int32, is_pure=False, pack=1)
    elif MODE == 2:
        CH: tl.constexpr = P_LINES * 128 // NT  # bytes per thread, a multiple of 16
        j = tl.arange(0, NT)
        addr = (a_base + j * (CH // 4)).to(tl.int64, bitcast=True)
        tl.inline_asm_elementwise(
            f"cp.async.bulk.prefetch.L2.global [$1], {CH}; mov.u32 $0, 0;",
            "=r,l", [addr], dtype=tl.int32, is_pure=False, pack=1)
    s = tl.sum(tl.zeros([BLOCK], dtype=tl.int32), axis=0)
    if MODE == 4:
        s = -_read(a_base, P_LINES * 32 // BLOCK, BLOCK, 0, CG)
    elif MODE == 5:
        s = -_read(a_base, P_LINES * 32 // BLOCK, BLOCK, 2, 0)
    t1 = _now()
    s += _read(b_base, S_BLOCKS, BLOCK, HINT, 0)
    t2 = _now()
    t2w = t2
    while t2w < t1 + wait_ns:
        t2w = _now()
    s += _read(a_base, P_LINES * 32 // BLOCK, BLOCK, 0, CG)
    t3 = _now()
    tl.store(sink_ptr + pid, s)
    tl.store(t_ptr + pid * 5 + 0, t0)
    tl.store(t_ptr + pid * 5 + 1, t1)
    tl.store(t_ptr + pid * 5 + 2, t2)
    tl.store(t_ptr + pid * 5 + 3, t2w)
    tl.store(t_ptr + pid * 5 + 4, t3)


def run_case(n_sm: int, p_kb: int, s_kb: int, mode: str, hint: int, wait_us: float, hot: bool, reps: int,
             block: int = 8192, nt: int = 128, cg: int = 0) -> dict:
    """One configuration on ``n_sm`` CTAs (one per SM): ``p_kb`` KB of region A and ``s_kb`` KB of region B per CTA,
    ``mode`` (a key of MODES), ``hint`` (1: B read evict_first), ``wait_us`` (µs from the end of the prefetch to
    A's read), ``hot`` (A read by a launch just before, no flush between), ``cg`` (1: A read ``.cg``). ``reps``
    launches after one warm-up; returns medians (µs) over CTAs then launches, and the per-launch samples.
    Raises ValueError on sizes that are not whole blocks (``p_kb``, ``s_kb`` multiples of ``block``·4 bytes),
    AssertionError if CTA 0's sum of A and B is wrong."""
    if (p_kb * 1024) % (block * 4) or (s_kb * 1024) % (block * 4):
        raise ValueError(f"p_kb {p_kb} and s_kb {s_kb} must be multiples of {block * 4 // 1024} KB")
    dev = "cuda"
    p_lines = p_kb * 1024 // 128
    a = torch.ones(n_sm * p_lines * 32, dtype=torch.int32, device=dev)
    b = torch.ones(max(1, n_sm * s_kb * 256), dtype=torch.int32, device=dev)
    flush = torch.empty(64 << 20, dtype=torch.int32, device=dev)  # 256 MB, five times L2
    sink = torch.empty(n_sm, dtype=torch.int32, device=dev)
    t = torch.empty(n_sm * 5, dtype=torch.int64, device=dev)
    kw = dict(P_LINES=p_lines, S_BLOCKS=s_kb * 1024 // (block * 4), MODE=MODES[mode], HINT=hint, BLOCK=block, NT=nt,
              CG=cg, num_warps=4)
    rows = []
    for r in range(reps + 1):
        flush.add_(1)
        if hot:
            l2_probe_kernel[(n_sm,)](a, b, sink, t, 0, **{**kw, "MODE": 0, "S_BLOCKS": 0})
        l2_probe_kernel[(n_sm,)](a, b, sink, t, int(wait_us * 1000), **kw)
        torch.cuda.synchronize()
        ts = t.view(n_sm, 5).double().cpu()
        if r == 0:
            continue  # the compile / first-touch launch
        expect = (s_kb * 256 + p_lines * 32) - (p_lines * 32 if mode in ("touch", "touch_last") else 0)
        assert int(sink[0]) == expect, f"sink {int(sink[0])} != {expect}"
        rows.append({
            "issue_us": float((ts[:, 1] - ts[:, 0]).median()) / 1e3,
            "stream_us": float((ts[:, 2] - ts[:, 1]).median()) / 1e3,
            "use_us": float((ts[:, 4] - ts[:, 3]).median()) / 1e3,
            "use_max_us": float((ts[:, 4] - ts[:, 3]).max()) / 1e3,
            "span_us": float((ts[:, 4].max() - ts[:, 0].min())) / 1e3,
        })
    out = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    return {"p_kb": p_kb, "s_kb": s_kb, "mode": mode, "hint": hint, "wait_us": wait_us, "hot": hot, "cg": cg, **out,
            "samples": rows}


def cases(which: str = "v1"):
    """The grid. v1: references (cold, hot), then each prefetch mode against the streamed
    bytes between and the wait. v2: demand loads (``touch``) instead of prefetches, and smaller prefetches, against
    the streamed bytes between, with and without evict_first on the stream (its ``touch`` rows re-read A from the
    SM's L1: the reads were not yet ``.cg``). v3: A's reads ``.cg``: references, demand loads and prefetches against
    the stream. v4: whether lines read with an L2 evict_last policy survive a
    stream read without a hint (the ring's TMA loads carry none in Triton 3.6), beside plain reads."""
    if which == "v4":  # evict_last lines may outlive the flush: their rows come last, then cold rows to show it
        for mode in ("none", "touch", "touch_last"):
            for p_kb in (64, 128):
                for s_kb in ((0,) if mode == "none" else (0, 128, 256)):
                    yield dict(p_kb=p_kb, s_kb=s_kb, mode=mode, hint=0, wait_us=10, hot=False, cg=1)
        for p_kb in (64, 128):
            yield dict(p_kb=p_kb, s_kb=0, mode="none", hint=0, wait_us=10, hot=False, cg=1)
        return
    if which == "v3":
        for p_kb in (64, 128, 256):
            yield dict(p_kb=p_kb, s_kb=0, mode="none", hint=0, wait_us=10, hot=False, cg=1)
            yield dict(p_kb=p_kb, s_kb=0, mode="none", hint=0, wait_us=0, hot=True, cg=1)
            for s_kb in (0, 128, 256):
                for hint in ((0, 1) if s_kb else (0,)):
                    yield dict(p_kb=p_kb, s_kb=s_kb, mode="touch", hint=hint, wait_us=10, hot=False, cg=1)
        for p_kb in (64, 128):
            for mode in ("line", "bulk"):
                for s_kb in (0, 128):
                    yield dict(p_kb=p_kb, s_kb=s_kb, mode=mode, hint=1 if s_kb else 0, wait_us=10, hot=False, cg=1)
            yield dict(p_kb=p_kb, s_kb=128, mode="none", hint=1, wait_us=10, hot=False, cg=1)
        return
    if which == "v2":
        for p_kb in (64, 128):
            yield dict(p_kb=p_kb, s_kb=0, mode="none", hint=0, wait_us=10, hot=False)
            for s_kb in (0, 64, 128, 256):
                for hint in ((0, 1) if s_kb else (0,)):
                    yield dict(p_kb=p_kb, s_kb=s_kb, mode="touch", hint=hint, wait_us=10, hot=False)
        for p_kb in (32, 64):
            for mode in ("line", "bulk"):
                for s_kb in (0, 64, 128):
                    for hint in ((0, 1) if s_kb else (0,)):
                        yield dict(p_kb=p_kb, s_kb=s_kb, mode=mode, hint=hint, wait_us=10, hot=False)
            yield dict(p_kb=p_kb, s_kb=64, mode="none", hint=0, wait_us=10, hot=False)
        return
    yield dict(p_kb=128, s_kb=0, mode="none", hint=0, wait_us=0, hot=False)
    yield dict(p_kb=128, s_kb=0, mode="none", hint=0, wait_us=0, hot=True)
    yield dict(p_kb=128, s_kb=0, mode="none", hint=0, wait_us=10, hot=False)
    for mode in ("line", "bulk", "line_last"):
        for wait in (0, 2, 5, 10):
            yield dict(p_kb=128, s_kb=0, mode=mode, hint=0, wait_us=wait, hot=False)
    for mode in ("line", "bulk"):
        for s_kb in (128, 256, 512):
            for hint in (0, 1):
                yield dict(p_kb=128, s_kb=s_kb, mode=mode, hint=hint, wait_us=10, hot=False)
    for s_kb in (128, 256):
        yield dict(p_kb=128, s_kb=s_kb, mode="none", hint=0, wait_us=10, hot=False)
        yield dict(p_kb=128, s_kb=s_kb, mode="line_last", hint=0, wait_us=10, hot=False)
    for p_kb in (64, 256):
        for mode in ("none", "line", "bulk"):
            yield dict(p_kb=p_kb, s_kb=0, mode=mode, hint=0, wait_us=10, hot=False)
        yield dict(p_kb=p_kb, s_kb=0, mode="none", hint=0, wait_us=0, hot=True)


def main(argv=None) -> int:
    """Run one case set (``--cases``), print a line per case, write the JSON (``--out``). Exit 2 without a CUDA
    GPU."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--cases", choices=("v1", "v2", "v3", "v4"), default="v1")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("l2_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    n_sm = torch.cuda.get_device_properties(0).multi_processor_count
    res = []
    for c in cases(args.cases):
        row = run_case(n_sm, reps=args.reps, **c)
        res.append(row)
        print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items() if k != "samples"}),
              flush=True)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "n_sm": n_sm, "cases": res}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
