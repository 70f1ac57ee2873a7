"""Is racecheck's report on the Gluon megakernel Triton's own? A kernel with nothing but ``gl.warp_specialize``.

Since the third session, ``compute-sanitizer --tool racecheck`` on the megakernel reports shared-memory hazards,
all at two source lines: the kernel's signature and its ``gl.warp_specialize`` call, none in task code (NOTES.md).
This probe runs two kernels that have no shared memory of their own and no task code:

* ``bare``: a default partition (4 warps) and one 1-warp worker partition, each storing its thread ids to its own
  global array;
* ``mbar``: the same, plus the megakernel's hand-off pattern in miniature: the worker arrives on an mbarrier that
  the default partition waits on (one phase), each partition storing only its own array.

If racecheck reports hazards at these kernels' signature / ``warp_specialize`` lines too, the megakernel's report is
of the same kind, at the partition set-up that Triton 3.6 generates; that alone does not prove the megakernel has no
race of its own. (Measured on the H200 in session 18: ``bare`` none; ``mbar`` one error per launch, a read at the
signature line against a write at the ``warp_specialize`` line.) Run on a GPU:

    compute-sanitizer --tool racecheck python3 benchmarks/racecheck_ws_probe.py

It prints each kernel's stored values checked against the expected ones (so the kernels ran), then racecheck prints
its summary.
"""

from __future__ import annotations

import sys

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier


@gluon.jit
def _default_part(out_ptr, bar, N: gl.constexpr, WAIT: gl.constexpr):
    if WAIT:
        mbarrier.wait(bar.index(0), 0)
    offs = gl.arange(0, N, layout=gl.BlockedLayout([1], [32], [4], [0]))
    gl.store(out_ptr + offs, offs + 1)


@gluon.jit
def _worker_part(out_ptr, bar, N: gl.constexpr, WAIT: gl.constexpr):
    offs = gl.arange(0, N, layout=gl.BlockedLayout([1], [32], [1], [0]))
    gl.store(out_ptr + offs, offs + 2)
    if WAIT:
        mbarrier.arrive(bar.index(0), count=1)


@gluon.jit
def ws_kernel(a_ptr, b_ptr, N: gl.constexpr, WAIT: gl.constexpr):
    """Partition ``a_ptr[i] = i + 1`` (4 warps) and ``b_ptr[i] = i + 2`` (1 warp), (N,) int32 each; with ``WAIT``
    the default partition stores after the worker's mbarrier arrive."""
    bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(bar.index(0), count=1)
    gl.warp_specialize([
        (_default_part, (a_ptr, bar, N, WAIT)),
        (_worker_part, (b_ptr, bar, N, WAIT)),
    ], [1], [48])


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("racecheck_ws_probe.py: needs a CUDA GPU (sm_90)", file=sys.stderr)
        return 2
    n = 128
    ok = True
    for name, wait in (("bare", False), ("mbar", True)):
        a = torch.zeros(n, dtype=torch.int32, device="cuda")
        b = torch.zeros(n, dtype=torch.int32, device="cuda")
        for _ in range(3):  # a few launches, as the megakernel's runs have
            ws_kernel[(132,)](a, b, N=n, WAIT=wait, num_warps=4)
        torch.cuda.synchronize()
        want = torch.arange(n, dtype=torch.int32, device="cuda")
        good = bool(torch.equal(a, want + 1) and torch.equal(b, want + 2))
        ok &= good
        print(f"{name}: stores {'as expected' if good else 'WRONG'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
