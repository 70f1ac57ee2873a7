"""The engine registry: every decoder a user can choose, by name, and how to build it.

Engines are built lazily (the megakernel imports Triton, ``hf`` imports transformers) and an engine that
cannot run here raises :class:`EngineUnavailable`, which ``diagnose`` reports as ``skipped`` with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from .errors import BubblescopeError, EngineUnavailable

if TYPE_CHECKING:  # listing engines must not import torch (seconds); building one does
    import torch

    from .models.weights import ModelWeights


@dataclass(frozen=True)
class EngineSpec:
    name: str
    description: str
    build: Callable[..., object]   # (weights, max_seq_len, params=None) -> Decoder


def _reference(mode: str):
    def build(weights: ModelWeights, max_seq_len: int, params=None):
        _no_params("reference", params)
        from .reference_engine import ReferenceEngine
        return ReferenceEngine(weights, mode=mode, max_seq_len=max_seq_len)
    return build


def _no_params(name: str, params) -> None:
    if params is not None:
        raise BubblescopeError(f"--tuning: engine {name} has no tuning parameters (only the megakernel engines)")


def _megakernel(variant: str, impl: str, name: str):
    def build(weights: ModelWeights, max_seq_len: int, params=None):
        # Not `import triton` here: on CPU the engine must set TRITON_INTERPRET before Triton's first import.
        import importlib.util
        if importlib.util.find_spec("triton") is None:
            raise EngineUnavailable("the megakernel needs Triton, which is not installed")
        from .megakernel_engine import MegakernelEngine
        return MegakernelEngine(weights, params=params, max_seq_len=max_seq_len, variant=variant, impl=impl,
                                name=name)
    return build


def _hf(weights: ModelWeights, max_seq_len: int, params=None):
    _no_params("hf", params)
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise EngineUnavailable("engine hf needs transformers, which is not installed") from None
    from .hf_engine import HFEngine
    return HFEngine(weights, max_seq_len)


ENGINES: dict[str, EngineSpec] = {s.name: s for s in [
    EngineSpec("reference", "op-by-op PyTorch, eager: one launch per op", _reference("eager")),
    EngineSpec("reference-cudagraph", "op-by-op PyTorch, decode step replayed as one CUDA graph",
               _reference("cudagraph")),
    EngineSpec("reference-compile", "torch.compile(mode='reduce-overhead'): inductor fusion + CUDA graphs",
               _reference("compile")),
    EngineSpec("hf", "Hugging Face transformers' own model, eager, DynamicCache", _hf),
    EngineSpec("megakernel", "persistent megakernel, one launch per token: the Gluon kernel on Hopper (a TMA "
               "producer warp streams weights ahead of the compute warps), the Triton kernel elsewhere",
               _megakernel("fused", "auto", "megakernel")),
    EngineSpec("megakernel-gluon", "the Gluon megakernel (sm_90): warp-specialized TMA weight ring",
               _megakernel("fused", "gluon", "megakernel-gluon")),
    EngineSpec("megakernel-triton", "the plain-Triton megakernel: register tiles, L2 prefetch before each wait",
               _megakernel("fused", "triton", "megakernel-triton")),
    EngineSpec("megakernel-stages", "the megakernel's task code, one launch per stage (fusion ablation)",
               _megakernel("stages", "auto", "megakernel-stages")),
    EngineSpec("megakernel-noprefetch", "the megakernel whose weight loads wait for each task's inputs "
               "(pipelining ablation)", _megakernel("noprefetch", "auto", "megakernel-noprefetch")),
]}


def prepare_triton(device: torch.device) -> None:
    """On a CPU device, choose Triton's interpreter before anything (torch.profiler, inductor) imports Triton.

    Triton reads ``TRITON_INTERPRET`` once, at its first import, so the megakernel can only run on CPU if
    this happens first; compiled mode is left alone on a GPU and when the user set the variable.
    """
    import os
    import sys
    if device.type == "cpu" and "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")


def get_engine_spec(name: str, option: str = "--engine") -> EngineSpec:
    """The registry entry for ``name`` (not ``auto``, which :func:`build_engine` resolves).

    Raises:
        BubblescopeError: unknown name; the message names ``option`` (the CLI option that gave the name) and
            lists the known engines.
    """
    if name not in ENGINES:
        raise BubblescopeError(f"{option}: unknown engine {name!r}; known engines: {', '.join(ENGINES)}, or auto")
    return ENGINES[name]


def build_engine(name: str, weights: ModelWeights, max_seq_len: int, params=None):
    """Build the named engine over ``weights`` with a KV cache of ``max_seq_len`` positions.

    ``params``: ``MegakernelParams`` for a megakernel engine (None: its defaults). ``auto``
    (:func:`bubblescope.fallback.build_auto`): the megakernel with a fallback to the reference where it runs
    on a GPU, else the reference; the choice is the decoder's ``auto_choice`` attribute.

    Raises:
        BubblescopeError: unknown engine name, or ``params`` for an engine without any.
        EngineUnavailable: the engine cannot run on this machine or this model.
    """
    if name == "auto":
        from .fallback import build_auto
        dec, choice = build_auto(weights, max_seq_len, params=params)
        dec.auto_choice = choice
        return dec
    return get_engine_spec(name).build(weights, max_seq_len, params=params)
