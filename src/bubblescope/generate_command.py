"""``bubblescope generate``: one engine decodes a prompt, the text streams out as it is produced, and one line
says what ran and how fast.

:func:`generate_text` checks the prompt and the engine before the model loads, builds the engine (with a tuned
file's parameters when given), warms a compiling engine up, streams the generation (:class:`TextStream`) and
reports the timing; the token loop itself is :func:`bubblescope.generation.generate`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from .errors import BubblescopeError
from .generation import GenerationResult, SamplingParams, TextStream
from .wording import count

if TYPE_CHECKING:
    from .tuned import Tuning

MODES = ("eager", "cudagraph", "compile")  # the reference engine's modes (--mode)


def engine_name(engine: str, mode: str) -> str:
    """The registered engine ``--engine`` and ``--mode`` name: ``reference-<mode>`` for the reference engine in a
    mode other than eager, else ``engine``.

    Raises:
        BubblescopeError: ``mode`` given for another engine than the reference (it would be ignored), or an
            unknown mode.
    """
    if engine != "reference" and mode != "eager":  # --mode is the reference engine's; another would ignore it
        raise BubblescopeError(f"--mode {mode}: sets the reference engine's mode, not --engine {engine}'s; leave "
                               "--mode out, or use --engine reference")
    name = engine if engine != "reference" or mode == "eager" else f"reference-{mode}"
    if engine == "reference" and mode not in MODES:
        raise BubblescopeError(f"--mode: unknown mode {mode!r}; use eager, cudagraph or compile")
    return name


def prompt_token_ids(loaded, model: str, prompt: str, prompt_ids: list[int] | None) -> list[int]:
    """The prompt as token ids of ``loaded`` (a :class:`~bubblescope.models.LoadedModel`): ``prompt_ids`` as given,
    else ``prompt`` through the model's tokenizer (with BOS), else the BOS token alone.

    Raises:
        BubblescopeError: ``prompt`` text without a tokenizer (naming the missing weights file when dummy weights
            stood in for a known checkpoint), an empty prompt with no BOS token, ids outside ``[0, vocab_size)``.
    """
    from .models.loader import KNOWN_FILES, model_search_dirs

    cfg, tok = loaded.config, loaded.tokenizer
    if prompt_ids is not None:
        ids = prompt_ids
    elif prompt and tok is None:
        if loaded.source == "dummy" and model is not None and model.lower() in KNOWN_FILES:
            raise BubblescopeError(
                f"--prompt: {model}'s weights file was not found (searched "
                f"{', '.join(str(d) for d in model_search_dirs())}), so dummy weights without a tokenizer were "
                f"loaded; pass --checkpoint PATH, set BUBBLESCOPE_MODELS, or use --prompt-ids")
        raise BubblescopeError("--prompt: this model has no tokenizer; pass --tokenizer or use --prompt-ids")
    elif tok is not None:
        ids = tok.encode(prompt, bos=True)
    else:
        ids = [cfg.bos_token_id if cfg.bos_token_id is not None else 0]
    if not ids:
        raise BubblescopeError("--prompt: empty prompt and the model has no BOS token")
    if any(i < 0 or i >= cfg.vocab_size for i in ids):
        if prompt_ids is None:  # the tokenizer's vocabulary is larger than the model's
            raise BubblescopeError(f"--prompt: the tokenizer gave ids beyond the model's vocab_size {cfg.vocab_size} "
                                   "(a tokenizer of another model?)")
        raise BubblescopeError(f"--prompt-ids: token ids must be in [0, {cfg.vocab_size})")
    return ids


def generate_text(model: str, sampling: SamplingParams, *, checkpoint: str | None = None,
                  tokenizer: str | None = None, prompt: str = "", prompt_ids: list[int] | None = None,
                  max_new_tokens: int = 128, engine: str = "reference", mode: str = "eager",
                  device: str | None = None, dtype: str | None = None, tuning: Tuning | None = None,
                  prefill: str | None = None, weights: str | None = None, warmup: int = 0, out: TextIO,
                  say: Callable[[str], None]) -> GenerationResult:
    """Generate ``max_new_tokens`` tokens after the prompt with engine ``engine`` (``mode``: the reference
    engine's eager, cudagraph or compile) and ``sampling``; the text, prompt included as llama2.c prints it, goes
    to ``out`` as it is produced (token ids separated by spaces without a tokenizer), and every other line to
    ``say``: warnings (``warning: ...``), the tuned pick, the engine's fallback notes, and the last line, which
    names the engine, the device and the weights with TTFT (ms) and the decode speed (ms/token, tok/s). A
    compiling engine (any but the eager reference and ``hf``) first runs the prompt and 2 decode steps untimed, so
    graph capture (the megakernel's prefill graph for the prompt's length too) and compilation stay out of the
    timing; ``warmup`` more whole generations (greedy, untimed) precede the timed one. ``dtype`` None: bfloat16
    on a GPU, float32 on a CPU. ``weights``:
    ``bf16``, ``fp8`` or ``fp8-all`` (``--weights``, :func:`~bubblescope.models.load_model`'s ``weight_format``;
    None: the checkpoint's own form).

    Raises:
        BubblescopeError: ``prompt`` and ``prompt_ids`` both given, a prompt that is not valid UTF-8, a bad
            ``mode`` (:func:`engine_name`), an engine the device rules out or a bad ``prefill`` (both before the
            model loads), a bad model, device, dtype or weight format, a prompt the model cannot take
            (:func:`prompt_token_ids`), a prompt plus new tokens beyond the model's positions.
    """
    import torch

    from .engines import build_engine, check_prefill, prepare_triton, unavailable_before_load
    from .fallback import describe
    from .generation import generate, prepare_for
    from .models import load_model, resolve_device, run_dtype
    from .models.quant import parse_weight_format
    from .tuned import describe_pick, engine_params

    for warning in sampling.unused():
        say(f"warning: {warning}")
    if prompt and prompt_ids is not None:
        raise BubblescopeError("--prompt and --prompt-ids: give one of them, not both")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes in argv arrive as lone surrogates
        raise BubblescopeError("--prompt: not valid UTF-8 text (check the terminal's encoding)") from None
    dev = resolve_device(device)
    prepare_triton(dev)
    tdtype = run_dtype(dtype, dev)
    parse_weight_format(weights)  # before the model loads
    name = engine_name(engine, mode)
    if why := unavailable_before_load(name, dev):  # said before the model loads, naming the option that chose it
        raise BubblescopeError(f"--mode {mode}: {why}" if name != engine else f"--engine {engine}: {why}")
    check_prefill(prefill, name)
    loaded = load_model(model, checkpoint=checkpoint, tokenizer=tokenizer, device=dev, dtype=tdtype,
                        seed=sampling.seed, weight_format=weights)
    cfg = loaded.config
    for warning in loaded.warnings + ([tuning.check_model(cfg)] if tuning is not None else []):
        if warning:
            say(f"warning: {warning}")
    ids = prompt_token_ids(loaded, model, prompt, prompt_ids)
    max_seq = len(ids) + max_new_tokens
    if max_seq > cfg.max_position_embeddings:
        option = "--prompt-ids" if prompt_ids is not None else "--prompt"  # the option the prompt came from
        raise BubblescopeError(f"{option}: {count(len(ids), 'prompt token')} + "
                               f"{count(max_new_tokens, 'new token')} exceed the "
                               f"model's {cfg.max_position_embeddings} positions")
    mk_params, picked = engine_params(tuning, name, max_seq, dev.type)
    if picked:
        say(describe_pick(picked, name))
    dec = build_engine(name, loaded.weights, max_seq, params=mk_params, prefill=prefill)
    for line in describe(dec):
        say(line)
    if name != "reference" and name != "hf":
        # Graph capture, torch.compile and Triton compilation happen on the first steps: keep them out of
        # the ms/token and the TTFT the user reads. The whole prompt, so that the megakernel's prefill graph for
        # its length is captured here too; at most 3 new tokens, within the cache by max_seq's construction. The
        # whole generation's context buckets (the reference engine's graphs) are prepared first, so none is
        # captured inside the generation the user reads (or inside a profiled program's later steps).
        prepare_for(dec, len(ids), max_new_tokens - 1)
        generate(dec, ids, min(3, max_new_tokens), eos_ids=())
    for _ in range(warmup):  # whole generations, greedy (the sampler's generator untouched), EOS ignored
        generate(dec, ids, max_new_tokens, eos_ids=())
    stream = TextStream(loaded.tokenizer, ids, out)
    res = generate(dec, ids, max_new_tokens, sampling, on_token=stream.push)
    stream.close()
    for line in describe(dec)[1 if getattr(dec, "auto_choice", None) else 0:]:
        say(line)
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    say(summary_line(res, dec.name, where, loaded, max_new_tokens,
                     interpreted=dev.type == "cpu" and "megakernel" in name,
                     weight_format=loaded.weights.weight_format))
    return res


def summary_line(res: GenerationResult, engine: str, where: str, loaded, max_new_tokens: int,
                 interpreted: bool = False, weight_format: str = "bf16") -> str:
    """The last line of ``generate``: ``engine`` on ``where`` (a GPU's name or CPU; ``interpreted``: a
    megakernel under the Triton CPU interpreter, said so), the weights (and their format, ``weight_format``, when
    FP8), TTFT (ms), the mean decode time per token (ms) and its tokens/s (1000 × steps / total ms), and the tokens
    generated; without a decode step, why."""
    cfg = loaded.config
    n = len(res.token_ms)
    weights = f"dummy weights of {cfg.name}" if loaded.source == "dummy" else f"{loaded.source} weights {loaded.path}"
    if weight_format != "bf16":
        weights += f" in {weight_format}"
    if n:
        speed = f"decode {sum(res.token_ms) / n:.3f} ms/token, {1000 * n / sum(res.token_ms):.1f} tok/s"
    elif max_new_tokens == 1:  # the one token comes from the prompt's forward pass (TTFT)
        speed = "no decode step (--max-new-tokens 1: the one token is the prefill's, timed in TTFT)"
    else:
        speed = "no decode step (the first token was EOS)"
    note = " (Triton CPU interpreter: slow by design)" if interpreted else ""
    return (f"{engine} on {where}{note}, {weights}: TTFT {res.ttft_ms:.2f} ms, {speed}, "
            f"{count(len(res.tokens), 'token')}")
