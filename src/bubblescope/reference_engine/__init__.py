"""Op-by-op PyTorch reference decoder (eager, CUDA graph, torch.compile)."""

from .engine import MODES, ReferenceEngine

__all__ = ["MODES", "ReferenceEngine"]
