"""The engine registry: every decoder a user can choose, by name, and how to build it.

Engines are built lazily (the megakernel imports Triton, ``hf`` imports transformers) and an engine that
cannot run here raises :class:`EngineUnavailable`, which ``diagnose`` reports as ``skipped`` with the reason.
What rules an engine out on a device whatever the model (a package not installed, a GPU it needs) is known
before any model is loaded: :func:`unavailable_before_load`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from .errors import BubblescopeError, EngineUnavailable

if TYPE_CHECKING:  # listing engines must not import torch (seconds); building one does
    import torch

    from .models.weights import ModelWeights


TRITON_MISSING = "the megakernel needs Triton, which is not installed"
TRANSFORMERS_MISSING = "engine hf needs transformers, which is not installed"
PREFILL_MODES = ("batched", "stepwise")  # megakernel_engine.prefill.PREFILL_MODES, without importing torch


@dataclass(frozen=True)
class EngineSpec:
    name: str
    description: str
    build: Callable[..., object]   # (weights, max_seq_len, params=None[, prefill=None]) -> Decoder
    # (device) -> why the engine cannot run on that device whatever the model, or None; the same words as
    # ``build`` raises then
    unavailable: Callable[..., str | None] = lambda device: None
    # ``build`` takes ``prefill=`` (batched | stepwise): the megakernel engines, whose token-by-token prefill is
    # an ablation; every other engine prefills the prompt in one batched forward
    prefill: bool = False


def _missing(module: str, reason: str):
    def unavailable(device) -> str | None:
        import importlib.util
        return reason if importlib.util.find_spec(module) is None else None
    return unavailable


_needs_triton = _missing("triton", TRITON_MISSING)
FUSED_TRITON_MISSING = "the fused engines need Triton, which is not installed"
_fused_needs_triton = _missing("triton", FUSED_TRITON_MISSING)


def _cudagraph_unavailable(device) -> str | None:
    from .reference_engine.engine import CUDAGRAPH_NEEDS_CUDA
    return CUDAGRAPH_NEEDS_CUDA if device.type != "cuda" else None


def _gluon_unavailable(device) -> str | None:
    """Triton missing, or a device that is not a Hopper GPU (``gluon.host.gluon_device_unsupported``)."""
    if why := _needs_triton(device):
        return why
    import torch

    from .megakernel_engine.gluon.host import gluon_device_unsupported
    return gluon_device_unsupported(torch.cuda.get_device_capability(device) if device.type == "cuda" else None)


def _pdl_unavailable(device) -> str | None:
    """Triton missing, or a device without Programmatic Dependent Launch (``fused_engine.pdl_unavailable``)."""
    if why := _fused_needs_triton(device):
        return why
    from .fused_engine.engine import pdl_unavailable
    return pdl_unavailable(device)


def _fused(pdl: bool):
    def build(weights: ModelWeights, max_seq_len: int, params=None):
        _no_params("reference-fused-pdl" if pdl else "reference-fused", params)
        from .fused_engine import FusedEngine
        return FusedEngine(weights, max_seq_len=max_seq_len, pdl=pdl)
    return build


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
    def build(weights: ModelWeights, max_seq_len: int, params=None, prefill: str | None = None):
        # Triton's presence was checked by the spec (find_spec, not an import: on CPU the engine must set
        # TRITON_INTERPRET before Triton's first import).
        from .megakernel_engine import MegakernelEngine
        return MegakernelEngine(weights, params=params, max_seq_len=max_seq_len, variant=variant, impl=impl,
                                name=name, prefill=prefill or "batched")
    return build


def _hf(weights: ModelWeights, max_seq_len: int, params=None):
    _no_params("hf", params)
    from .hf_engine import HFEngine  # transformers' presence was checked by the spec
    return HFEngine(weights, max_seq_len)


ENGINES: dict[str, EngineSpec] = {s.name: s for s in [
    EngineSpec("reference", "op-by-op PyTorch, eager: one launch per op", _reference("eager")),
    EngineSpec("reference-cudagraph", "op-by-op PyTorch, decode step replayed as one CUDA graph per context bucket",
               _reference("cudagraph"), _cudagraph_unavailable),
    EngineSpec("reference-compile", "torch.compile (inductor fusion), the compiled step replayed as one CUDA graph "
               "per context bucket (on a CPU: the compiled step, no graph)",
               _reference("compile")),
    EngineSpec("reference-fused", "fused Triton kernels, 5 per layer (RMSNorm, RoPE, the KV write, SwiGLU and the "
               "residual adds inside the matvecs; split-K attention), the step replayed as one CUDA graph",
               _fused(False), _fused_needs_triton),
    EngineSpec("reference-fused-pdl", "reference-fused launched with Programmatic Dependent Launch: each kernel "
               "loads its weights while the previous one drains (sm_90+)", _fused(True), _pdl_unavailable),
    EngineSpec("hf", "Hugging Face transformers' own model, eager, DynamicCache", _hf,
               _missing("transformers", TRANSFORMERS_MISSING)),
    EngineSpec("megakernel", "persistent megakernel, one launch per token: the Gluon kernel on Hopper (a TMA "
               "producer warp streams weights ahead of the compute warps), the Triton kernel elsewhere",
               _megakernel("fused", "auto", "megakernel"), _needs_triton,
               prefill=True),
    EngineSpec("megakernel-gluon", "the Gluon megakernel (sm_90): warp-specialized TMA weight ring",
               _megakernel("fused", "gluon", "megakernel-gluon"), _gluon_unavailable,
               prefill=True),
    EngineSpec("megakernel-triton", "the plain-Triton megakernel: register tiles, L2 prefetch before each wait",
               _megakernel("fused", "triton", "megakernel-triton"), _needs_triton,
               prefill=True),
    EngineSpec("megakernel-stages", "the megakernel's task code, one launch per stage (fusion ablation)",
               _megakernel("stages", "auto", "megakernel-stages"), _needs_triton,
               prefill=True),
    EngineSpec("megakernel-noprefetch", "the megakernel whose weight loads wait for each task's inputs "
               "(pipelining ablation)", _megakernel("noprefetch", "auto", "megakernel-noprefetch"),
               _needs_triton, prefill=True),
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


# Engines run only when named: each is one of the kernels ``megakernel`` already picks between (the Gluon kernel
# on Hopper, the Triton kernel elsewhere), so a default run would time the same kernel twice.
BY_NAME_ONLY = frozenset({"megakernel-gluon", "megakernel-triton"})


def default_engines() -> list[str]:
    """The engines ``diagnose model`` runs when none are named, in registry order: every registered engine but
    :data:`BY_NAME_ONLY` (those that cannot run on the machine are then reported as skipped, with the reason)."""
    return [name for name in ENGINES if name not in BY_NAME_ONLY]


def get_engine_spec(name: str, option: str = "--engine") -> EngineSpec:
    """The registry entry for ``name`` (not ``auto``, which :func:`build_engine` resolves).

    Raises:
        BubblescopeError: unknown name; the message names ``option`` (the CLI option that gave the name) and
            lists the known engines.
    """
    if name not in ENGINES:
        raise BubblescopeError(f"{option}: unknown engine {name!r}; known engines: {', '.join(ENGINES)}, or auto")
    return ENGINES[name]


def unavailable_before_load(name: str, device: torch.device, option: str = "--engine") -> str | None:
    """Why engine ``name`` cannot run on ``device`` whatever the model, known before any model is loaded: a
    package it needs is not installed (Triton, transformers), or it needs a CUDA device (``reference-cudagraph``)
    or a Hopper GPU (``megakernel-gluon``). The reason is in the words building the engine would raise
    (:class:`EngineUnavailable`). None when it may run here: building it over a model can still rule it out
    (a dtype, a head_dim, a kernel that does not fit the SM). ``auto`` always runs (the reference at worst).

    Raises:
        BubblescopeError: unknown name (the message names ``option``, as :func:`get_engine_spec`).
    """
    if name == "auto":
        return None
    return get_engine_spec(name, option).unavailable(device)


def takes_prefill(name: str) -> bool:
    """Whether engine ``name`` has a prefill choice (``--prefill batched|stepwise``): the megakernel engines and
    ``auto`` (which may stand for the megakernel). Unknown names: False."""
    return name == "auto" or (name in ENGINES and ENGINES[name].prefill)


def check_prefill(prefill: str | None, name: str | None = None) -> None:
    """Refuse a ``--prefill`` value that is not a mode, or ``stepwise`` for engine ``name`` when it has no prefill
    choice (it prefills the prompt in one batched forward: the token-by-token ablation does not exist there, and
    ignoring it would mislabel the measurement). None and ``batched`` pass for every engine.

    Raises:
        BubblescopeError: ``--prefill: ...``, naming the mode or the engine.
    """
    if prefill is None:
        return
    if prefill not in PREFILL_MODES:
        raise BubblescopeError(f"--prefill: unknown mode {prefill!r}; use one of {', '.join(PREFILL_MODES)}")
    if prefill == "stepwise" and name is not None and not takes_prefill(name):
        raise BubblescopeError(f"--prefill stepwise: engine {name} prefills the prompt in one batched forward; "
                               "token-by-token prefill is the megakernel engines' ablation")


def build_engine(name: str, weights: ModelWeights, max_seq_len: int, params=None, prefill: str | None = None):
    """Build the named engine over ``weights`` with a KV cache of ``max_seq_len`` positions.

    ``params``: ``MegakernelParams`` for a megakernel engine (None: its defaults). ``prefill``: ``batched`` or
    ``stepwise`` for an engine that takes it (:func:`takes_prefill`; None: its default, batched); ``batched`` is
    accepted and ignored by the others, which always prefill in one forward. ``auto``
    (:func:`bubblescope.fallback.build_auto`): the megakernel with a fallback to the reference where it runs
    on a GPU, else the reference; the choice is the decoder's ``auto_choice`` attribute.

    Raises:
        BubblescopeError: unknown engine name, ``params`` for an engine without any, an unknown prefill mode or
            ``stepwise`` for an engine without the choice (:func:`check_prefill`).
        EngineUnavailable: the engine cannot run on this machine or this model.
    """
    if name != "auto":
        get_engine_spec(name)  # an unknown name is said as such, before its options are judged
    check_prefill(prefill, name)
    if name == "auto":
        from .fallback import build_auto
        dec, choice = build_auto(build_engine, weights, max_seq_len, params=params, prefill=prefill)
        dec.auto_choice = choice
        return dec
    spec = get_engine_spec(name)
    if why := spec.unavailable(weights.device):  # the rule unavailable_before_load gives, applied here too
        raise EngineUnavailable(why)
    if spec.prefill:
        return spec.build(weights, max_seq_len, params=params, prefill=prefill)
    return spec.build(weights, max_seq_len, params=params)
