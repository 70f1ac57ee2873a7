"""``--engine auto`` and the fused path's automatic fallback.

:func:`choose_auto` says which engine suits this model and device, and why: the megakernel on a CUDA device
when Triton is installed and the model's shapes are supported, else the op-by-op reference.
:class:`FallbackDecoder` runs a primary engine (the megakernel) and, when it fails mid-generation (a
:class:`~bubblescope.errors.KernelStuck`, a launch or CUDA error), continues on a backup engine (the
reference) from the same position with the same KV history: the backup is prefilled with every token the
primary had been given, so no token is lost and greedy decoding yields what an uninterrupted backup run
would. The switch is recorded in :attr:`FallbackDecoder.fallbacks` (and by ``generate`` in its result).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .errors import BubblescopeError, EngineUnavailable, KernelStuck

AUTO = "auto"
PRIMARY, BACKUP = "megakernel", "reference"
# What a failing fused path raises: a stuck task, or a launch / CUDA / compile error (torch's CUDA errors are
# RuntimeErrors; Triton's launch and out-of-resources errors too). User-input errors (BubblescopeError) pass.
FAILURES = (KernelStuck, RuntimeError)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def choose_auto(weights) -> tuple[str, str]:
    """The engine ``auto`` stands for on these weights' device, and the reason, one line.

    The megakernel needs a CUDA device (on a CPU it runs under Triton's interpreter, one program at a time:
    correct but slow by design), Triton, and a model it supports
    (``megakernel_engine.engine.check_supported``: dtype, power-of-two ``head_dim``). Whether the compiled
    kernel fits the SM is only known once it is built: :func:`build_auto` falls back then too.
    """
    import importlib.util

    if weights.device.type != "cuda":
        return BACKUP, (f"no CUDA device ({weights.device.type}): the megakernel would run under Triton's CPU "
                        "interpreter, slow by design; ask for megakernel instead of auto to run it anyway")
    if importlib.util.find_spec("triton") is None:
        return BACKUP, "Triton is not installed, and the megakernel is a Triton kernel"
    from .megakernel_engine.engine import check_supported
    try:
        check_supported(weights)
    except EngineUnavailable as e:
        return BACKUP, str(e)
    return PRIMARY, f"CUDA device and a model the megakernel supports ({weights.config.name})"


def build_auto(build: Callable, weights, max_seq_len: int, params=None, prefill: str | None = None):
    """Build the engine ``auto`` picks, wrapped so that a failing megakernel falls back to the reference.

    Args:
        build: the engine builder, called as ``build(name, weights, max_seq_len, params=..., prefill=...)``
            (:func:`bubblescope.engines.build_engine`, which passes itself when asked for ``auto``).
        weights: :class:`~bubblescope.models.weights.ModelWeights`.
        max_seq_len: KV-cache positions of either engine.
        params: ``MegakernelParams`` for the megakernel (None: its defaults).
        prefill: the megakernel's prefill mode, ``batched`` or ``stepwise`` (None: batched); the reference, which
            prefills in one forward, does not take it.

    Returns:
        ``(decoder, choice)``: ``choice`` is ``{"engine": name, "reason": one line}``; ``decoder`` is a
        :class:`FallbackDecoder` over the megakernel, or the plain reference engine.

    Raises:
        EngineUnavailable: neither engine can run (the reference's own reason).
        BubblescopeError: ``prefill`` ``stepwise`` where the choice is the reference (no such ablation there).
    """
    name, reason = choose_auto(weights)
    if name == PRIMARY:
        try:
            primary = build(PRIMARY, weights, max_seq_len, params=params, prefill=prefill)
        except EngineUnavailable as e:  # e.g. a kernel that cannot keep one program per SM resident
            name, reason = BACKUP, f"the megakernel could not be built here ({_one_line(e)})"
        except BubblescopeError:  # bad input (invalid --tuning params): the user's to fix, not a fallback
            raise
        except Exception as e:  # noqa: BLE001  (a Triton compile or out-of-resources error)
            name, reason = BACKUP, f"the megakernel could not be built here ({_one_line(e)})"
        else:
            return (FallbackDecoder(primary, lambda: build(BACKUP, weights, max_seq_len)),
                    {"engine": PRIMARY, "reason": reason})
    if prefill == "stepwise":  # the ablation does not exist on the backup: refused, not run as batched
        raise stepwise_refused(BACKUP, reason)
    if params is not None:
        reason += "; the tuned megakernel parameters are not used"
    return build(BACKUP, weights, max_seq_len), {"engine": BACKUP, "reason": reason}


def stepwise_refused(chosen: str, reason: str) -> BubblescopeError:
    """The error for ``--prefill stepwise`` where ``auto`` chose ``chosen`` (for ``reason``), an engine that
    prefills in one batched forward: run as batched, the ablation would be mislabelled."""
    return BubblescopeError(f"--prefill stepwise: auto chose {chosen} ({reason}), which prefills the prompt in one "
                            "batched forward; token-by-token prefill is the megakernel engines' ablation")


class FallbackDecoder:
    """Decoder protocol over ``primary``; on its first failure, the rest of the generation runs on a backup.

    Every token given to ``prefill`` / ``decode`` is kept (host ints). When the primary raises one of
    :data:`FAILURES`, the backup (built once, by ``make_backup()``) is prefilled with all of them, so its KV
    cache holds the same history, and the step's logits come from it; later steps run on the backup. The
    switch is sticky (a kernel that got stuck once is not trusted again in this decoder's life) and each one
    is appended to :attr:`fallbacks` as ``{"from", "to", "position", "error"}`` (``position``: the KV
    position of the step that failed).

    ``strict`` (default True): after each ``decode`` on a CUDA primary, ``synchronize_and_check()`` so a
    stuck task is caught at its own step (the megakernel otherwise reports it one step late, after its
    logits were sampled). ``decode_greedy`` checks its own step without that (it syncs on the token anyway).

    A CUDA error that poisons the context (an illegal address) also makes the backup fail; that error
    propagates.
    """

    def __init__(self, primary, make_backup: Callable[[], object], strict: bool = True):
        self.primary, self.active = primary, primary
        self._make_backup = make_backup
        self.config, self.device = primary.config, primary.device
        self.strict = strict
        self.fallbacks: list[dict] = []
        self._history: list[int | torch.Tensor] = []

    @property
    def name(self) -> str:
        return self.active.name

    @property
    def position(self) -> int:
        return self.active.position

    def __getattr__(self, attr: str):
        # compile_info, timeline, last_logits...: the engine that runs now, so hasattr() tells what it offers.
        # Steps launched ahead (launch_greedy...) would bypass the history this class replays on a failure.
        if attr in ("primary", "active", "launch_greedy", "next_greedy_token", "discard_queued"):
            raise AttributeError(attr)
        return getattr(self.active, attr)

    def reset(self) -> None:
        self._history = []
        self.active.reset()

    def prefill(self, token_ids: torch.Tensor) -> torch.Tensor:
        """As the active engine's ``prefill``: ``token_ids`` (T,) int64 -> logits (V,)."""
        self._history = [int(t) for t in token_ids.reshape(-1).tolist()]
        if self.active is not self.primary:
            return self.active.prefill(token_ids)
        try:
            return self.primary.prefill(token_ids)
        except FAILURES as e:
            return self._switch(e, position=0)

    def decode(self, token: int | torch.Tensor) -> torch.Tensor:
        """As the active engine's ``decode``: one step for ``token`` -> logits (V,)."""
        self._history.append(token)
        if self.active is not self.primary:
            return self.active.decode(token)
        try:
            out = self.primary.decode(token)
            if self.strict and self.device.type == "cuda" and hasattr(self.primary, "synchronize_and_check"):
                self.primary.synchronize_and_check()
            return out
        except FAILURES as e:
            return self._switch(e, position=len(self._history) - 1)

    def decode_greedy(self, token: int | torch.Tensor) -> int:
        """One greedy step -> the argmax token as a host int (the primary's fused pick while it runs)."""
        if self.active is not self.primary or not hasattr(self.primary, "decode_greedy"):
            return int(torch.argmax(self.decode(token)))
        self._history.append(token)
        try:
            return self.primary.decode_greedy(token)
        except FAILURES as e:
            return int(torch.argmax(self._switch(e, position=len(self._history) - 1)))

    def _switch(self, error: BaseException, position: int) -> torch.Tensor:
        backup = self._make_backup()
        ids = [int(t) for t in self._history]  # device-tensor tokens: read now, once
        if not ids:
            raise BubblescopeError("fallback: no tokens to replay") from error
        self.fallbacks.append({"from": self.primary.name, "to": backup.name, "position": position,
                               "error": _one_line(error)})
        self.active = backup
        return backup.prefill(torch.tensor(ids, dtype=torch.long, device=backup.device))


def describe(decoder) -> list[str]:
    """Lines for the terminal: which engine ``auto`` chose and why, and every fallback so far."""
    lines = []
    choice = getattr(decoder, "auto_choice", None)
    if choice:
        lines.append(f"engine auto: {choice['engine']} ({choice['reason']})")
    for f in getattr(decoder, "fallbacks", None) or []:
        lines.append(f"fallback: {f['from']} failed at position {f['position']} ({f['error']}); the generation "
                     f"continued on {f['to']} from the same history")
    return lines
