"""Fused op-by-op decoder (Triton kernels, CUDA graph, optional Programmatic Dependent Launch)."""

from .engine import FusedEngine, FusedParams, pdl_unavailable

__all__ = ["FusedEngine", "FusedParams", "pdl_unavailable"]
