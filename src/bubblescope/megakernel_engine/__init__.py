"""Persistent megakernels: one launch per decode step (see docs/design.md, "Megakernel").

Two kernel implementations, one room each, over one shared host side:

* shared: ``schedule`` (task graph → instruction table), ``packing`` (kernel weight layout), ``residency``
  (grid sizing), ``engine`` (the Decoder, implementation choice), ``prefill`` (the prompt in batched torch ops,
  written into the kernel's KV cache), ``timeline`` (intra-kernel timestamps), ``interpreter`` (plain-PyTorch
  oracle of the same table);
* ``triton_kernel``: the plain-Triton kernel (any CUDA GPU, and the CPU interpreter);
* ``gluon``: the Hopper kernel in Gluon (warp-specialized TMA weight ring), chosen on sm_90.

Importing this package does not import triton.
"""

from .engine import CPU_PARAMS, IMPLS, VARIANTS, MegakernelEngine
from .schedule import MegakernelParams, Schedule, build_schedule, pick_rows

__all__ = ["CPU_PARAMS", "IMPLS", "VARIANTS", "MegakernelEngine", "MegakernelParams", "Schedule", "build_schedule",
           "pick_rows"]
