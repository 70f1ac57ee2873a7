"""Triton persistent megakernel: one launch per decode step (see DESIGN.md, "Megakernel").

Modules: ``schedule`` (task graph → instruction table), ``packing`` (kernel weight layout), ``ops`` and
``kernel`` (device code), ``launch`` (Triton mode, residency, launching), ``engine`` (the Decoder),
``timeline`` (intra-kernel timestamps), ``interpreter`` (plain-PyTorch oracle of the same table).
Importing this package does not import triton.
"""

from .engine import CPU_PARAMS, VARIANTS, MegakernelEngine
from .schedule import MegakernelParams, Schedule, build_schedule, pick_rows

__all__ = ["CPU_PARAMS", "VARIANTS", "MegakernelEngine", "MegakernelParams", "Schedule", "build_schedule", "pick_rows"]
