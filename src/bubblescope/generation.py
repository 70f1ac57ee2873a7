"""The Decoder protocol every engine implements, sampling, and the token loop.

Sampling (greedy, temperature, top-k, top-p, seeded) lives here once; engines only map tokens to logits.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from .models.config import ModelConfig


@runtime_checkable
class Decoder(Protocol):
    """A batch-size-1 decoder with its own KV cache.

    ``prefill(token_ids)``: ``token_ids`` LongTensor (T,) -> logits (V,) of the last prompt position; the
    cache then holds T positions. ``decode(token)``: an int or LongTensor (1,) -> logits (V,) for the next
    position; advances ``position`` by one. Returned logits may be a static buffer that the next call
    overwrites (CUDA-graph engines): copy them if you keep them. ``reset()`` empties the cache.

    Optional: ``decode_greedy(token) -> int``, one decode step returning the argmax of its logits as a host
    int, for engines that can pick it without an extra kernel (the megakernel); :func:`greedy_step` uses it.
    Optional, with it: ``launch_greedy(token | None)`` (queue a greedy step; ``None``: the token the previous
    step picked on the device), ``next_greedy_token() -> int`` (wait for the oldest queued step) and
    ``discard_queued()`` (undo the queued steps not read): :func:`generate` then keeps one step in flight
    while the host handles a token, so the device does not idle between steps.
    Optional: ``prepare(first_position, last_position)``, called between generations (before ``reset``) with the
    positions the decode steps will take: the engine captures or compiles what those steps need (the reference
    engine's per-context-bucket graphs) so that no step is timed with it (:func:`prepare_for`).
    """

    name: str
    config: ModelConfig
    device: torch.device
    position: int

    def prefill(self, token_ids: torch.Tensor) -> torch.Tensor: ...

    def decode(self, token: int | torch.Tensor) -> torch.Tensor: ...

    def reset(self) -> None: ...


def prepare_for(decoder: Decoder, prompt_len: int, decode_steps: int) -> None:
    """``decoder.prepare(first, last)`` for ``decode_steps`` decode steps after a ``prompt_len``-token prompt
    (positions ``prompt_len`` … ``prompt_len + decode_steps - 1``) where the engine has it (see :class:`Decoder`);
    nothing otherwise."""
    prepare = getattr(decoder, "prepare", None)
    if callable(prepare):
        prepare(prompt_len, prompt_len + decode_steps - 1)


SPECIAL_IDS = 3  # ids 0-2: unk, BOS and EOS in llama2.c and SentencePiece vocabularies


def random_ids(vocab_size: int, n: int, generator: torch.Generator) -> list[int]:
    """``n`` token ids drawn uniformly from ``generator``, each one the model accepts (in ``[0, vocab_size)``).

    Ids 0-2 (the special ids, :data:`SPECIAL_IDS`) are left out when the vocabulary has room for others
    (``vocab_size > 3``); a vocabulary of 1 to 3 ids is drawn from whole. The prompts of ``diagnose model``,
    ``tune`` and ``--tp`` all come from here.
    """
    low = SPECIAL_IDS if vocab_size > SPECIAL_IDS else 0
    return torch.randint(low, vocab_size, (n,), generator=generator).tolist()


def greedy_step(decoder: Decoder, token: int) -> int:
    """One greedy decode step: the engine's own ``decode_greedy`` when it has one (the megakernel picks
    the argmax on the device and returns it with its status copy), else ``argmax(decode(token))``."""
    fused = getattr(decoder, "decode_greedy", None)
    return fused(token) if callable(fused) else int(torch.argmax(decoder.decode(token)))


MIN_TEMPERATURE = 2.0 ** -149  # the smallest positive float32 (a subnormal), 1.4e-45: below, T rounds to 0 there


@dataclass(frozen=True)
class SamplingParams:
    """``temperature`` 0 means greedy. ``top_k`` 0 and ``top_p`` 1.0 disable those filters."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        """Raises BubblescopeError: temperature below 0, infinite or NaN (inf would turn every logit into 0, a
        uniform draw that no caller means), or above 0 but 0 in float32 (below about :data:`MIN_TEMPERATURE`:
        NaN probabilities), top_k below 0, or top_p outside (0, 1] (top-p 0 would keep no
        token at all)."""
        import math

        from .errors import BubblescopeError
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise BubblescopeError(f"--temperature: must be a finite number >= 0 (0 means greedy), "
                                   f"got {self.temperature}")
        if self.temperature > 0 and torch.tensor(self.temperature, dtype=torch.float32).item() == 0:
            raise BubblescopeError(f"--temperature: {self.temperature:g} is 0 in float32, where the logits are divided "
                                   f"by it (NaN probabilities); use 0 for greedy or at least {MIN_TEMPERATURE:.2g}, "
                                   "the smallest positive float32")
        if self.top_k < 0:
            raise BubblescopeError(f"--top-k: must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise BubblescopeError(f"--top-p: must be in (0, 1] (1 disables it), got {self.top_p}")

    def unused(self) -> list[str]:
        """One line per filter that is set but has no effect: greedy decoding (temperature 0) takes the
        argmax, so top-k and top-p change nothing."""
        if self.temperature > 0:
            return []
        return [f"{name} {value:g} has no effect with --temperature 0 (greedy decoding takes the most likely "
                f"token); give --temperature > 0 to sample"
                for name, value, off in (("--top-k", self.top_k, 0), ("--top-p", self.top_p, 1.0)) if value != off]


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> int:
    """Pick the next token from ``logits`` (V,) of any float dtype; returns a host int.

    Greedy is ``argmax`` (first maximum on ties, as torch defines). Otherwise the logits are divided by the
    temperature, filtered by top-k and then top-p (nucleus: the smallest set of tokens whose probability
    mass reaches ``top_p``, Holtzman et al. 2019), and sampled with ``generator`` on the logits' device.
    """
    if params.temperature <= 0:
        return int(torch.argmax(logits))
    x = logits.float() / params.temperature
    if not torch.isfinite(x.max()):
        # A tiny temperature (1e-45) overflows to inf and softmax gives NaN; softmax is shift-invariant, so
        # shifting by the max first gives the T -> 0 limit: the maximum (ties shared), the rest -inf.
        x = (logits.float() - logits.float().max()) / params.temperature
    if params.top_k > 0 and params.top_k < x.numel():
        kth = torch.topk(x, params.top_k).values[-1]
        x = torch.where(x < kth, torch.full_like(x, float("-inf")), x)
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=True)
        cum = torch.softmax(sorted_x, dim=-1).cumsum(-1)
        # Drop a token when the mass before it already reaches top_p (the top token always stays).
        drop = (cum - torch.softmax(sorted_x, dim=-1)) >= params.top_p
        sorted_x = sorted_x.masked_fill(drop, float("-inf"))
        x = torch.empty_like(x).scatter_(0, order, sorted_x)
    probs = torch.softmax(x, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


@dataclass
class GenerationResult:
    """Tokens and host wall times of one generation.

    ``ttft_ms``: prefill plus sampling the first token, token on the host (ms). ``token_ms``: per later
    token, host wall time from the previous token being on the host to this one being on the host (ms).
    ``fallbacks``: the engine switches of a :class:`bubblescope.fallback.FallbackDecoder` during this
    generation (``{"from", "to", "position", "error"}``); empty when the decoder never fell back.
    """

    prompt_ids: list[int]
    tokens: list[int] = field(default_factory=list)
    ttft_ms: float = 0.0
    token_ms: list[float] = field(default_factory=list)
    stopped_at_eos: bool = False
    fallbacks: list[dict] = field(default_factory=list)

    @property
    def total_ms(self) -> float:
        return self.ttft_ms + sum(self.token_ms)

    @property
    def decode_share(self) -> float | None:
        """Fraction of the generation's wall time spent in decode steps (None if there were none)."""
        return sum(self.token_ms) / self.total_ms if self.token_ms and self.total_ms > 0 else None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def generate(decoder: Decoder, prompt_ids: list[int] | torch.Tensor, max_new_tokens: int,
             params: SamplingParams = SamplingParams(), eos_ids: tuple[int, ...] | None = None,
             on_token: Callable[[int], None] | None = None, launch_ahead: bool | None = None) -> GenerationResult:
    """Prefill ``prompt_ids`` then decode up to ``max_new_tokens`` tokens (stopping after an EOS id).

    ``eos_ids`` defaults to the decoder config's ``eos_token_id``; pass ``()`` to never stop early.
    The first token comes from the prefill logits, so ``max_new_tokens`` tokens need
    ``max_new_tokens - 1`` decode steps. Greedy decoding on an engine that can launch ahead (the megakernel:
    see :class:`Decoder`) keeps one step in flight: step k+1 is launched before step k's token is read, and
    undone if that token is an EOS, so the tokens, the KV cache and ``position`` end as a stepwise run's.
    ``token_ms`` is the host time from one token in hand to the next either way. ``launch_ahead``: None (auto)
    launches ahead only on a CUDA device, where a launch returns at once; on a CPU a launch runs the whole step,
    so a step launched ahead would be timed with the token before it. True / False force it (tests, benchmarks).

    Raises:
        BubblescopeError: the prompt plus new tokens do not fit the decoder's KV cache (from the engine).
    """
    ids = prompt_ids.tolist() if isinstance(prompt_ids, torch.Tensor) else list(prompt_ids)
    eos = set(decoder.config.eos_token_id if eos_ids is None else eos_ids)
    gen = None
    if params.temperature > 0:
        gen = torch.Generator(device=decoder.device).manual_seed(params.seed)
    res = GenerationResult(prompt_ids=ids)
    seen = len(getattr(decoder, "fallbacks", ()))
    prepare_for(decoder, len(ids), max_new_tokens - 1)   # before any timer: captures, compilations
    decoder.reset()
    prompt = torch.tensor(ids, dtype=torch.long, device=decoder.device)
    _sync(decoder.device)
    t0 = time.perf_counter()
    tok = sample(decoder.prefill(prompt), params, gen)
    t1 = time.perf_counter()
    res.ttft_ms = (t1 - t0) * 1e3
    res.tokens.append(tok)
    if on_token:
        on_token(tok)
        t1 = time.perf_counter()
    greedy = params.temperature <= 0
    if launch_ahead is None:
        launch_ahead = torch.device(decoder.device).type == "cuda"
    ahead = launch_ahead and greedy and callable(getattr(decoder, "launch_greedy", None))
    queued = 0  # steps launched ahead whose token is not read yet
    while len(res.tokens) < max_new_tokens and tok not in eos:
        t0 = t1
        if ahead:
            if queued == 0:
                decoder.launch_greedy(tok)
                queued = 1
            # the step after this one is needed unless this token is EOS: launch it before reading this token,
            # so the device runs it while the host reads, checks and hands out this one
            if len(res.tokens) + queued < max_new_tokens and decoder.position < getattr(decoder, "max_seq_len", 0):
                decoder.launch_greedy(None)
                queued += 1
            tok = decoder.next_greedy_token()
            queued -= 1
        else:
            tok = greedy_step(decoder, tok) if greedy else sample(decoder.decode(tok), params, gen)
        t1 = time.perf_counter()
        res.token_ms.append((t1 - t0) * 1e3)
        res.tokens.append(tok)
        if on_token:
            on_token(tok)
            t1 = time.perf_counter()  # the caller's printing is not decode time
    if queued:  # stopped at EOS with the next step already launched: undo it
        decoder.discard_queued()
    res.stopped_at_eos = tok in eos
    res.fallbacks = list(getattr(decoder, "fallbacks", ()))[seen:]
    return res


class TextStream:
    """Writes generated text as it is produced: the prompt at once, then each token's new characters.

    With a tokenizer, the whole sequence is decoded again at each token and only the new suffix written,
    so multi-token characters (byte-fallback pieces) and leading-space rules come out as ``decode`` of the
    whole would give; text that ends in an incomplete character (U+FFFD) waits for the next token. Without
    a tokenizer, token ids are written separated by spaces. The final text equals ``decode(prompt + tokens)``.
    """

    def __init__(self, tokenizer, prompt_ids: list[int], out):
        self.tok, self.ids, self.out, self.shown = tokenizer, list(prompt_ids), out, ""
        self._write()

    def _write(self) -> None:
        if self.tok is None:
            text = " ".join(str(t) for t in self.ids)
        else:
            text = self.tok.decode(self.ids)
            if text.endswith("\ufffd"):
                return
        if text.startswith(self.shown):
            self.out.write(text[len(self.shown):])
            self.out.flush()
            self.shown = text

    def push(self, token: int) -> None:
        """Add one generated token id and write what it adds to the text."""
        self.ids.append(int(token))
        self._write()

    def close(self) -> None:
        """Write what is still held back (or all of it, if decoding rewrote earlier text) and a newline."""
        text = " ".join(str(t) for t in self.ids) if self.tok is None else self.tok.decode(self.ids)
        self.out.write((text[len(self.shown):] if text.startswith(self.shown) else "\n" + text) + "\n")
        self.out.flush()


def teacher_forced_logits(decoder: Decoder, prompt_ids: list[int], forced: list[int]) -> torch.Tensor:
    """Logits (len(forced) + 1, V) float32 on the CPU: after the prompt, then after each forced token.

    Used to compare engines step by step on the same inputs (no divergence from differing samples).
    """
    prepare_for(decoder, len(prompt_ids), len(forced))
    decoder.reset()
    # clone(): .float().cpu() of a CPU float32 tensor is the same tensor, and engines may return static buffers.
    rows = [decoder.prefill(torch.tensor(prompt_ids, dtype=torch.long, device=decoder.device)).float().cpu().clone()]
    for t in forced:
        rows.append(decoder.decode(int(t)).float().cpu().clone())
    return torch.stack(rows)
