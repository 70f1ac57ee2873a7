"""What a ``diagnose`` run will do, decided once: :func:`plan_run` applies every default and every check that needs
no model, and returns a frozen :class:`RunPlan` that the later stages read and never change. Once the model is
loaded, a frozen :class:`Bench` holds what depends on it (the prompt ids, the KV-cache length).

The defaults depend on the device: a GPU run measures llama-3.2-1b (dummy bfloat16 weights) with a 128-token
prompt, 128 new tokens and a 128/1024/4096 context sweep; a CPU run measures stories260K (float32) when its file
is found, else the ``tiny-llama`` dummy preset, with a 16-token prompt, 32 new tokens and no sweep (there the
megakernel runs under Triton's interpreter, one program at a time: small sizes keep a default run to minutes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from ..engines import (check_prefill, default_engines, get_engine_spec, prepare_triton, takes_prefill,
                       unavailable_before_load)
from ..errors import BubblescopeError
from ..models import find_model_file, resolve_device, run_dtype
from ..outdir import check_out_dir

if TYPE_CHECKING:
    import torch

    from ..models.loader import LoadedModel
    from ..tuned import Tuning

GPU_DEFAULT_MODEL, CPU_DEFAULT_MODEL, CPU_FALLBACK_MODEL = "llama-3.2-1b", "stories260k", "tiny-llama"
# Workload defaults by device type (tokens): prompt, new tokens per timed run, contexts of the sweep.
DEFAULT_PROMPT_LEN = {"cuda": 128, "cpu": 16}
DEFAULT_GEN_LEN = {"cuda": 128, "cpu": 32}
DEFAULT_SWEEP = {"cuda": (128, 1024, 4096), "cpu": ()}
SWEEP_STEPS = 16           # decode steps timed at each context of the sweep

# Ablations whose only purpose is timing: under Triton's CPU interpreter their timings mean nothing.
CPU_DEFAULT_SKIPS = {
    "reference-fused": "its kernels under the CPU Triton interpreter run program by program (about a second per "
                       "step): its timing measures the interpreter (run on a GPU, or name it in --engines to check "
                       "its numerics)",
    "megakernel-stages": "timing ablation: under the CPU Triton interpreter it measures the interpreter, not "
                         "fusion (run on a GPU, or name it in --engines)",
    "megakernel-noprefetch": "timing ablation: the L2 prefetch it removes does not exist in the CPU Triton "
                             "interpreter (run on a GPU, or name it in --engines)",
}


@dataclass(frozen=True)
class Workload:
    """What each engine is asked to do, in tokens, runs and steps; recorded as results.json's ``workload``.

    ``prompt_len`` prompt tokens (prefill); ``gen_len`` tokens per generation (the first from prefill, then
    ``gen_len - 1`` timed decode steps); ``runs`` timed generations after ``warmup`` untimed ones;
    ``context_sweep`` KV-cache lengths timed :data:`SWEEP_STEPS` steps each (sorted, distinct);
    ``profile_steps`` decode steps in each engine's trace; ``seed`` of the prompt and the dummy weights;
    ``prefill`` the megakernel engines' prefill mode (None: their default, batched).
    """

    prompt_len: int
    gen_len: int
    runs: int
    warmup: int
    context_sweep: tuple[int, ...]
    profile_steps: int
    seed: int
    prefill: str | None = None

    def record(self) -> dict:
        """The ``workload`` section of results.json (docs/results-schema.md)."""
        return {"prompt_len": self.prompt_len, "gen_len": self.gen_len, "runs": self.runs, "warmup": self.warmup,
                "context_sweep": list(self.context_sweep), "seed": self.seed, "prefill": self.prefill or "batched"}


@dataclass(frozen=True)
class RunPlan:
    """A ``diagnose`` run with every default applied and every option checked, before any model loads.

    ``model``: the model to measure (the device's default when none was given); ``requested_model``: MODEL as
    given (None: the default was chosen, which the results' notes say). ``engines``: the engines to try in order,
    each once (``auto`` still stands for the engine it picks once the model is loaded); ``skips``: engine ->
    reason for those known not to run here (listed as skipped, never built). ``tuning`` is the file ``tuning_path``
    read (None without one). ``out``: the output folder, written only when ``write``. ``counters``: read each ok
    engine's hardware counters after the run; ``command``: the command line the results record (None: a library
    call). ``weights``: the weight format asked for (``bf16``, ``fp8``, ``fp8-all``; None: the checkpoint's own).
    """

    model: str
    requested_model: str | None
    checkpoint: str | None
    device: torch.device
    dtype: torch.dtype
    engines: tuple[str, ...]
    skips: Mapping[str, str]
    workload: Workload
    out: Path
    write: bool = True
    tuning_path: str | Path | None = None
    tuning: Tuning | None = None
    counters: bool = False
    command: str | None = None
    weights: str | None = None

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def dtype_name(self) -> str:
        """``float32``, ``bfloat16`` or ``float16``, as results.json records it."""
        return str(self.dtype).replace("torch.", "")


@dataclass(frozen=True)
class Bench:
    """What every engine of a run is measured on, fixed once the model is loaded (the plan is fixed before).

    ``loaded``: the :class:`~bubblescope.models.LoadedModel` (weights on the run's device, in its dtype);
    ``prompt``: the seeded prompt, ``workload.prompt_len`` token ids; ``max_seq``: the KV-cache length every
    engine is built with (positions, :func:`check_positions`); ``traces``: the folder whose ``traces/``
    receives each engine's trace (the run's staging folder), or None when the run writes nothing (each trace
    then goes to a temporary folder).
    """

    loaded: LoadedModel
    prompt: tuple[int, ...]
    max_seq: int
    traces: Path | None


def check_workload(**values: int | None) -> None:
    """Check the workload sizes by their option names (``prompt_len``, ``gen_len``, ``runs``, ``warmup``,
    ``profile_steps``, in tokens, runs or steps); None (the default, still to be chosen) passes. ``gen_len``
    needs 2: the first token comes from prefill, the timed decode steps from the rest.

    Raises:
        BubblescopeError: ``--<option>: must be at least <n>, got <v>``.
    """
    lows = {"prompt_len": 1, "gen_len": 2, "runs": 1, "warmup": 0, "profile_steps": 1}
    for key, v in values.items():
        if v is not None and v < lows[key]:
            raise BubblescopeError(f"--{key.replace('_', '-')}: must be at least {lows[key]}, got {v}")


def workload_lengths(prompt_len: int | None, gen_len: int | None, device: torch.device) -> tuple[int, int]:
    """``(prompt_len, gen_len)`` in tokens, each the device's default (:data:`DEFAULT_PROMPT_LEN`,
    :data:`DEFAULT_GEN_LEN`) when None. Used by ``diagnose`` and its tensor-parallel run alike."""
    return (prompt_len if prompt_len is not None else DEFAULT_PROMPT_LEN[device.type],
            gen_len if gen_len is not None else DEFAULT_GEN_LEN[device.type])


def check_positions(cfg, prompt_len: int, gen_len: int, profile_steps: int, sweep=(), extra_steps: int = 0) -> int:
    """The KV-cache length (positions) a workload needs: the timed run (prompt + generated + profiled steps +
    ``extra_steps`` + 8 spare) or the largest sweep context plus its timed steps, whichever is longer.

    Raises:
        BubblescopeError: ``cfg`` (a ModelConfig) has fewer ``max_position_embeddings``; the message names the
            options to lower.
    """
    run = prompt_len + gen_len + profile_steps + extra_steps + 8
    need = max([run] + [c + SWEEP_STEPS + 1 for c in sweep])
    if need > cfg.max_position_embeddings:
        what = (f"--prompt-len {prompt_len} + --gen-len {gen_len} + --profile-steps {profile_steps}" if run >= need
                else f"--context-sweep {max(sweep)}")
        raise BubblescopeError(f"{what}: the workload needs {need} positions (with spare steps) but {cfg.name} "
                               f"supports max_position_embeddings={cfg.max_position_embeddings}")
    return need


def default_model(device: torch.device, checkpoint: str | None) -> str:
    """The model when MODEL is left out: ``checkpoint`` when given (it is what the user named); else on a GPU
    llama-3.2-1b (dummy weights), on CPU stories260k when its file is found, else tiny-llama."""
    if checkpoint:
        return checkpoint
    if device.type == "cuda":
        return GPU_DEFAULT_MODEL
    return CPU_DEFAULT_MODEL if find_model_file(CPU_DEFAULT_MODEL) else CPU_FALLBACK_MODEL


def nothing_ran(entries: list[dict]) -> str:
    """The one-line error when every engine of ``entries`` (results.json engine entries) was skipped: each
    engine with its reason."""
    why = "; ".join(f"{e['name']}: {e.get('reason') or 'skipped'}" for e in entries)
    return f"--engines: no engine ran on this machine ({why})"


def plan_run(model: str | None = None, checkpoint: str | None = None, engines: list[str] | None = None,
             prompt_len: int | None = None, gen_len: int | None = None, runs: int = 3, warmup: int = 1,
             context_sweep: list[int] | None = None, dtype: str | None = None, device: str | None = None,
             out: str | Path = "bubblescope-out", profile_steps: int = 8, seed: int = 0,
             command: str | None = None, write: bool = True, tuning: str | Path | None = None,
             counters: bool = False, prefill: str | None = None, weights: str | None = None) -> RunPlan:
    """The :class:`RunPlan` of :func:`bubblescope.diagnose`'s options (the same names and defaults), checked in
    the order a user meets them: the tuned file, the device, the engine names, the prefill mode, the weight format,
    the workload sizes, the output folder, the engines the device rules out, then the dtype. Chooses Triton's interpreter on
    a CPU device (:func:`~bubblescope.engines.prepare_triton`) before anything imports Triton.

    Raises:
        BubblescopeError: a bad tuned file, device, engine name or prefill mode (``stepwise`` when no engine asked
            for has a prefill choice); an unknown weight format; a size below its minimum (:func:`check_workload`) or a context below 1; an
            ``out`` that cannot be a directory or written into (when ``write``); every engine ruled out by the
            device alone (:func:`nothing_ran`); an unknown dtype.
    """
    from ..models.quant import parse_weight_format
    from ..tuned import load_tuning

    tuned = load_tuning(tuning) if tuning is not None else None
    dev = resolve_device(device)
    prepare_triton(dev)
    # Default: every registered engine but the kernels `megakernel` already stands for (engines.BY_NAME_ONLY);
    # those that cannot run here are listed as skipped with the reason.
    names = list(dict.fromkeys(engines)) if engines else default_engines()  # a name given twice runs once
    skips = CPU_DEFAULT_SKIPS if dev.type == "cpu" and not engines else {}
    for n in names:
        if n != "auto":
            get_engine_spec(n, "--engines")
    check_prefill(prefill)
    if prefill == "stepwise" and not any(takes_prefill(n) for n in names):  # it would change nothing measured
        raise BubblescopeError(f"--prefill stepwise: none of the engines ({', '.join(names)}) has a prefill choice; "
                               "token-by-token prefill is the megakernel engines' ablation")
    parse_weight_format(weights)
    prompt_len, gen_len = workload_lengths(prompt_len, gen_len, dev)
    sweep = sorted(set(context_sweep)) if context_sweep is not None else list(DEFAULT_SWEEP[dev.type])
    check_workload(prompt_len=prompt_len, gen_len=gen_len, runs=runs, warmup=warmup, profile_steps=profile_steps)
    if any(c < 1 for c in sweep):
        raise BubblescopeError(f"--context-sweep: contexts must be positive, got {sweep}")
    if write:  # before the model is loaded or anything is measured
        check_out_dir(out)
    # Known before the model loads: every engine asked for needs what this machine lacks (a GPU, a package), e.g.
    # `--engines reference-cudagraph,megakernel-gluon` on CPU. When any engine may run, the run skips the rest
    # with the same reasons.
    ruled_out = [{"name": n, "reason": skips.get(n) or unavailable_before_load(n, dev, "--engines")} for n in names]
    if all(e["reason"] for e in ruled_out):
        raise BubblescopeError(nothing_ran(ruled_out))
    return RunPlan(model=model or default_model(dev, checkpoint), requested_model=model, checkpoint=checkpoint,
                   device=dev, dtype=run_dtype(dtype, dev), engines=tuple(names),
                   skips=MappingProxyType({e["name"]: e["reason"] for e in ruled_out if e["reason"]}),
                   workload=Workload(prompt_len=prompt_len, gen_len=gen_len, runs=runs, warmup=warmup,
                                     context_sweep=tuple(sweep), profile_steps=profile_steps, seed=seed,
                                     prefill=prefill),
                   out=Path(out), write=write, tuning_path=tuning, tuning=tuned, counters=counters, command=command,
                   weights=weights)
