"""Device functions shared by the Gluon kernel's partitions (``kernel.py``) and its attention tasks
(``attention.py``): the global clock and a stamp after a tensor is computed, bounded acquire spins, rounding to the
activation dtype, the number of non-empty attention splits."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def now(dummy):
    """``%globaltimer`` (ns, one clock for all SMs); ``dummy`` only gives the asm an operand."""
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [dummy], dtype=gl.int64,
                                     is_pure=False, pack=1)


@gluon.jit
def stamp_after(x, TIMELINE: gl.constexpr):
    """With TIMELINE, ``%globaltimer`` once the 2-D float tensor ``x`` is computed (its reduction makes the stamp
    wait for it); else 0 (int64 like the stamps)."""
    t = gl.to_tensor(0).to(gl.int64)
    if TIMELINE:
        t = now(gl.max(gl.max(x, axis=1), axis=0).to(gl.int32))
    return t


@gluon.jit
def spin(cnt_ptr, target, spin_cap):
    """Acquire-spin until ``*cnt_ptr >= target`` or ``spin_cap`` polls; returns the last value seen. (Polling with
    ``ld.acquire.gpu`` loads instead of atomics measured the same on the H200:
    benchmarks/results/h200-2026-12-01-s4/gluon_check_r11.json.)"""
    seen = gl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
    n = 0
    while (seen < target) & (n < spin_cap):
        seen = gl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
        n += 1
    return seen


@gluon.jit
def rnd(v, ACT: gl.constexpr):
    """Round float32 to the activation dtype and back (what materialising it in ACT does)."""
    return v.to(ACT).to(gl.float32)


@gluon.jit
def splits_used(pos, NSPLIT: gl.constexpr, MIN_CHUNK: gl.constexpr):
    """Non-empty position splits of a kv head at position ``pos`` (int32): ``n = pos + 1`` positions in chunks of
    ``max(ceil(n / NSPLIT), MIN_CHUNK)``, the split rule of the PyTorch oracle (``interpreter.py``)."""
    n = pos + 1
    chunk = gl.maximum((n + NSPLIT - 1) // NSPLIT, MIN_CHUNK)
    return (n + chunk - 1) // chunk
