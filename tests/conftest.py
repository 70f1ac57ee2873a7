"""Shared fixtures: where ../shared is, tiny configs, and the GPU skip marker."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# On a CPU-only machine the megakernel runs under Triton's interpreter, which must be chosen before Triton
# is first imported (any test module may import it).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from bubblescope.models.loader import find_model_file  # noqa: E402  (after the Triton mode is settled)

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
# stories260K where the CLI finds it too ($BUBBLESCOPE_MODELS, then ../shared/models).
STORIES = find_model_file("stories260k") or SHARED / "models" / "stories260K" / "stories260K.bin"
STORIES_TOK = STORIES.parent / "tok512.bin"
TRACES = SHARED / "traces"

needs_stories = pytest.mark.skipif(not STORIES.is_file(),
                                   reason=f"{STORIES} not found (../shared is absent and $BUBBLESCOPE_MODELS unset)")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (CUDA not available)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU (CUDA not available)"))
