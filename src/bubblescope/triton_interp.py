"""What the Triton kernels (the megakernel's, the fused engine's) need to run both compiled and under the CPU
interpreter (``TRITON_INTERPRET=1``).

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
