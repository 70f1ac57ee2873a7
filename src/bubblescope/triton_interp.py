"""What the Triton kernels (the megakernel's, the fused engine's) need to run both compiled and under the CPU
interpreter (``TRITON_INTERPRET=1``), and the L2 prefetch both issue on a GPU (:func:`l2_prefetch`).

Triton reads the interpreter switch once, at its first import, so the mode is fixed per process (``INTERPRET``).
Under the interpreter every call of a ``triton.jit`` function — Triton's own ``tl.sum``, ``tl.max`` included —
re-patches ``triton.language`` (milliseconds per call), so there device functions are plain Python functions
(:func:`device_function`) and reductions call ``tl.reduce`` with Triton's combine functions, which the interpreter
maps straight to numpy. Compiled, device functions are ``triton.jit`` (inlined) and the reductions are the library's.
"""

from __future__ import annotations

import triton
import triton.language as tl

INTERPRET = bool(triton.knobs.runtime.interpret)


def device_function(fn):
    """A device function: ``triton.jit`` when compiling, the plain function under the interpreter."""
    return fn if INTERPRET else triton.jit(fn)


if INTERPRET:
    def reduce_sum(x, axis):
        return tl.reduce(x, axis, tl.standard._sum_combine)

    def reduce_max(x, axis):
        return tl.reduce(x, axis, tl.standard._elementwise_max)

    def reduce_min(x, axis):
        return tl.reduce(x, axis, tl.standard._elementwise_min)
else:
    reduce_sum, reduce_max, reduce_min = tl.sum, tl.max, tl.min


@device_function
def l2_prefetch(base_ptr, nbytes, MODE: tl.constexpr, LANES: tl.constexpr):
    """Start pulling ``nbytes`` from ``base_ptr`` into L2 without waiting (GPU only).

    MODE 1: ``prefetch.global.L2 [a]`` per 128-byte line; MODE 2: ``cp.async.bulk.prefetch.L2.global
    [a], size`` (sm_90+, PTX ISA 8.0; a 16-byte aligned, size a multiple of 16) of 4 KB per lane. Lanes =
    the program's threads (one address each, no duplicates); idle lanes are predicated off.
    """
    CHUNK: tl.constexpr = 128 if MODE == 1 else 4096
    lane = tl.arange(0, LANES)
    bptr = base_ptr.to(tl.pointer_type(tl.int8))
    for p0 in range(0, nbytes, LANES * CHUNK):
        off = p0 + lane * CHUNK
        size = tl.minimum(nbytes - off, CHUNK)
        addr = (bptr + off).to(tl.int64, bitcast=True)
        if MODE == 1:
            tl.inline_asm_elementwise(
                "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
                "=r,l,r", [addr, size], dtype=tl.int32, is_pure=False, pack=1)
        else:
            tl.inline_asm_elementwise(
                "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
                "=r,l,r", [addr, size], dtype=tl.int32, is_pure=False, pack=1)
