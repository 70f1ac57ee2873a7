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


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` as a module (the benchmarks are scripts, not a package), registered in
    ``sys.modules`` because dataclasses look their module up there."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def compile_in_subprocess(script: str, timeout: float = 900):
    """The JSON that ``script`` prints on its last line, run in a fresh interpreter without ``TRITON_INTERPRET``
    (Triton's mode is fixed per process, and this one runs the interpreter); skips where Triton's bundled ptxas
    is missing, since the offline compile checks assemble for sm_90 with it."""
    import importlib.util
    import json
    import subprocess
    import sys

    spec = importlib.util.find_spec("triton")  # located, not imported: this process's Triton mode stays untouched
    if spec is None or not (Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "ptxas").is_file():
        pytest.skip("triton with its bundled ptxas is not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])
